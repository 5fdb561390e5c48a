//! Gradients compressed on the wire between machines: f32 sums travel as 16-bit
//! floats (half the bytes) and are accumulated in f32 where they arrive, as
//! PyTorch's `bf16_compress_hook`, except that the additions stay in f32.

use crate::error::{CommError, Result};

/// Set to `bf16` or `f16` to send f32 all-reduces across machines in 16 bits.
pub const COMPRESSION_VAR: &str = "BURN_DDP_COMPRESSION";

/// How f32 values cross the machines' links in an all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WireCompression {
    /// As they are.
    #[default]
    None,
    /// bfloat16: f32's range, 8 bits of precision.
    Bf16,
    /// IEEE half: 11 bits of precision, range up to 65504 (overflows to inf).
    F16,
}

impl WireCompression {
    /// From [`COMPRESSION_VAR`] (unset: none).
    pub fn from_env(rank: usize) -> Result<Self> {
        Self::parse(rank, std::env::var(COMPRESSION_VAR).ok().as_deref())
    }

    /// Parses a [`COMPRESSION_VAR`] value (`None` when unset).
    pub fn parse(rank: usize, value: Option<&str>) -> Result<Self> {
        match value {
            None | Some("") | Some("none") => Ok(Self::None),
            Some("bf16") => Ok(Self::Bf16),
            Some("f16") => Ok(Self::F16),
            Some(other) => Err(CommError::config(
                Some(rank),
                COMPRESSION_VAR,
                format!("rank {rank}: {COMPRESSION_VAR}={other:?}; expected bf16, f16 or none"),
            )),
        }
    }

    /// `value` in 16 bits (round to nearest even).
    pub fn encode(self, value: f32) -> u16 {
        match self {
            Self::Bf16 => bf16_bits(value),
            Self::F16 => half::f16::from_f32(value).to_bits(),
            Self::None => panic!("no 16-bit encoding without compression"),
        }
    }

    /// The f32 a 16-bit value stands for.
    pub fn decode(self, bits: u16) -> f32 {
        match self {
            Self::Bf16 => f32::from_bits((bits as u32) << 16),
            Self::F16 => half::f16::from_bits(bits).to_f32(),
            Self::None => panic!("no 16-bit decoding without compression"),
        }
    }
}

/// bfloat16 bits of `value`: the top half of its f32 bits, rounded to nearest
/// even (NaN stays NaN).
fn bf16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    if value.is_nan() {
        return ((bits >> 16) as u16) | 0x40; // keep it a (quiet) NaN
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_keep_what_16_bits_can_hold() {
        for codec in [WireCompression::Bf16, WireCompression::F16] {
            for value in [0.0f32, 1.0, -2.5, 0.15625, 1024.0] {
                assert_eq!(
                    codec.decode(codec.encode(value)),
                    value,
                    "{codec:?} {value}"
                );
            }
            assert!(codec.decode(codec.encode(f32::NAN)).is_nan());
            let x = 0.1f32;
            let relative = ((codec.decode(codec.encode(x)) - x) / x).abs();
            let bound = if codec == WireCompression::Bf16 {
                1.0 / 256.0
            } else {
                1.0 / 2048.0
            };
            assert!(relative <= bound, "{codec:?}: {relative}");
        }
        // bf16 keeps f32's range; f16 does not.
        let big = 1e30f32;
        let bf16 = WireCompression::Bf16.decode(WireCompression::Bf16.encode(big));
        assert!(((bf16 - big) / big).abs() < 1.0 / 256.0);
        assert!(WireCompression::F16
            .decode(WireCompression::F16.encode(big))
            .is_infinite());
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        // 1 + 2^-8 is halfway between two bf16 values: rounds to the even one (1.0).
        assert_eq!(bf16_bits(1.0 + 1.0 / 256.0), bf16_bits(1.0));
        // Just above halfway rounds up.
        assert_eq!(
            bf16_bits(1.0 + 1.0 / 256.0 + 1.0 / 65536.0),
            bf16_bits(1.0) + 1
        );
    }
}
