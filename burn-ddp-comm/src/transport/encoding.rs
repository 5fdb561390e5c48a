//! How a ring step's elements travel: as they are, or f32 values as 16-bit
//! floats. The ring's step, its index arithmetic and its writer thread are
//! written once, generic over this.

use super::WireCompression;
use crate::element::{reduce_into, AlignedBuf, Element, ReduceOp};
use std::io;

/// Bytes received and reduced (or encoded and sent) at a time: big enough to
/// amortise system calls, small enough to stay in cache.
pub(crate) const PIECE_BYTES: usize = 256 << 10;

/// How a received chunk lands in the local buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Landing {
    /// It replaces what is there (all-gather).
    Overwrite,
    /// It is combined into what is there (reduce-scatter).
    Reduce(ReduceOp),
}

/// A reused piece buffer, so a collective allocates nothing once warm.
///
/// Its pieces start 2 KiB past a page boundary: a piece is reduced into a
/// buffer that is often page-aligned (any large allocation, a bucket), and
/// two streams at the same offset within their pages make the CPU take each
/// store for a possible overlap with the next loads (4K aliasing), which
/// slowed large TCP all-reduces by a third when both were page-aligned.
#[derive(Default)]
pub(crate) struct Scratch {
    buf: AlignedBuf,
}

/// Where in its page a piece starts.
const PIECE_PAGE_OFFSET: usize = 2048;
const PAGE: usize = 4096;

impl Scratch {
    /// `len` elements of `T` (any contents), [`PIECE_PAGE_OFFSET`] into a page.
    pub(crate) fn typed<T: bytemuck::Pod>(&mut self, len: usize) -> &mut [T] {
        let bytes = len * std::mem::size_of::<T>();
        let raw = self.buf.bytes(bytes + PAGE);
        let skew = (PIECE_PAGE_OFFSET + PAGE - raw.as_ptr() as usize % PAGE) % PAGE;
        bytemuck::cast_slice_mut(&mut raw[skew..skew + bytes])
    }
}

/// The encoding of one ring step's elements of type `T` on the wire.
pub(crate) trait WireEncoding<T: Element>: Sync {
    /// Bytes on the wire for `len` elements.
    fn wire_bytes(&self, len: usize) -> usize;

    /// Writes `values` through `write`, in pieces where they are converted.
    fn send(
        &self,
        values: &[T],
        scratch: &mut Scratch,
        write: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> io::Result<()>;

    /// Reads `target.len()` elements through `read` and lands them in
    /// `target`, converting (and reducing) a piece at a time.
    fn receive(
        &self,
        target: &mut [T],
        landing: Landing,
        scratch: &mut Scratch,
        read: &mut dyn FnMut(&mut [u8]) -> io::Result<()>,
    ) -> io::Result<()>;
}

/// Elements as they are in memory.
pub(crate) struct Plain;

impl<T: Element> WireEncoding<T> for Plain {
    fn wire_bytes(&self, len: usize) -> usize {
        len * std::mem::size_of::<T>()
    }

    fn send(
        &self,
        values: &[T],
        _scratch: &mut Scratch,
        write: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        write(bytemuck::cast_slice(values))
    }

    fn receive(
        &self,
        target: &mut [T],
        landing: Landing,
        scratch: &mut Scratch,
        read: &mut dyn FnMut(&mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        let op = match landing {
            Landing::Overwrite => return read(bytemuck::cast_slice_mut(target)),
            Landing::Reduce(op) => op,
        };
        let piece = (PIECE_BYTES / std::mem::size_of::<T>())
            .min(target.len())
            .max(1);
        let incoming = scratch.typed::<T>(piece);
        for acc in target.chunks_mut(piece) {
            let incoming = &mut incoming[..acc.len()];
            read(bytemuck::cast_slice_mut(incoming))?;
            reduce_into(op, acc, incoming);
        }
        Ok(())
    }
}

/// f32 values as bf16 or f16, added in f32 where they arrive.
pub(crate) struct Sixteen(pub WireCompression);

impl WireEncoding<f32> for Sixteen {
    fn wire_bytes(&self, len: usize) -> usize {
        len * 2
    }

    fn send(
        &self,
        values: &[f32],
        scratch: &mut Scratch,
        write: &mut dyn FnMut(&[u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        let piece = (PIECE_BYTES / 2).min(values.len()).max(1);
        let bits = scratch.typed::<u16>(piece);
        for values in values.chunks(piece) {
            let bits = &mut bits[..values.len()];
            for (slot, &value) in bits.iter_mut().zip(values) {
                *slot = self.0.encode(value);
            }
            write(bytemuck::cast_slice(bits))?;
        }
        Ok(())
    }

    fn receive(
        &self,
        target: &mut [f32],
        landing: Landing,
        scratch: &mut Scratch,
        read: &mut dyn FnMut(&mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        let add = match landing {
            Landing::Overwrite => false,
            Landing::Reduce(ReduceOp::Sum | ReduceOp::Mean) => true,
            Landing::Reduce(op) => unreachable!("{op:?} never travels compressed"),
        };
        let piece = (PIECE_BYTES / 2).min(target.len()).max(1);
        let bits = scratch.typed::<u16>(piece);
        for slots in target.chunks_mut(piece) {
            let bits = &mut bits[..slots.len()];
            read(bytemuck::cast_slice_mut(bits))?;
            for (slot, &bits) in slots.iter_mut().zip(bits.iter()) {
                let value = self.0.decode(bits);
                *slot = if add { *slot + value } else { value };
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends through one encoding into a byte pipe and receives it back.
    fn round_trip<T: Element, E: WireEncoding<T>>(
        encoding: &E,
        sent: &[T],
        target: &mut [T],
        landing: Landing,
    ) -> usize {
        let mut wire = Vec::new();
        encoding
            .send(sent, &mut Scratch::default(), &mut |bytes| {
                wire.extend_from_slice(bytes);
                Ok(())
            })
            .unwrap();
        assert_eq!(wire.len(), encoding.wire_bytes(sent.len()));
        let mut at = 0;
        encoding
            .receive(target, landing, &mut Scratch::default(), &mut |buf| {
                buf.copy_from_slice(&wire[at..at + buf.len()]);
                at += buf.len();
                Ok(())
            })
            .unwrap();
        assert_eq!(at, wire.len(), "everything sent was read");
        wire.len()
    }

    #[test]
    fn plain_lands_exactly_over_several_pieces() {
        let n = PIECE_BYTES / 4 * 2 + 3; // two whole pieces and a short one
        let sent: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let mut target = vec![1.0f32; n];
        round_trip(&Plain, &sent, &mut target, Landing::Reduce(ReduceOp::Sum));
        assert!(target
            .iter()
            .enumerate()
            .all(|(i, v)| *v == i as f32 * 0.5 + 1.0));
        let mut target = vec![7i64; 5];
        round_trip(&Plain, &[1i64, 2, 3, 4, 5], &mut target, Landing::Overwrite);
        assert_eq!(target, [1, 2, 3, 4, 5]);
        let mut target = vec![4i32, 0];
        round_trip(
            &Plain,
            &[1i32, 9],
            &mut target,
            Landing::Reduce(ReduceOp::Max),
        );
        assert_eq!(target, [4, 9]);
    }

    #[test]
    fn sixteen_bits_halve_the_bytes_and_add_in_f32() {
        let codec = WireCompression::Bf16;
        let n = PIECE_BYTES / 2 + 5;
        let sent: Vec<f32> = (0..n).map(|i| (i % 97) as f32 * 0.25).collect();
        let mut target = vec![0.5f32; n];
        let bytes = round_trip(
            &Sixteen(codec),
            &sent,
            &mut target,
            Landing::Reduce(ReduceOp::Mean),
        );
        assert_eq!(bytes, 2 * n);
        for (got, value) in target.iter().zip(&sent) {
            assert_eq!(*got, 0.5 + codec.decode(codec.encode(*value)));
        }
        let mut target = vec![9.0f32; 3];
        round_trip(
            &Sixteen(codec),
            &[1.0, 0.1, -2.0],
            &mut target,
            Landing::Overwrite,
        );
        assert_eq!(target, [1.0, codec.decode(codec.encode(0.1)), -2.0]);
    }

    #[test]
    fn scratch_is_reused_and_placed_off_the_page_boundary() {
        let mut scratch = Scratch::default();
        let first = scratch.typed::<f64>(100_000).as_ptr() as usize;
        assert_eq!(first % PAGE, PIECE_PAGE_OFFSET);
        let again = scratch.typed::<u16>(300).as_ptr() as usize;
        assert_eq!(first, again, "a smaller request reuses the buffer");
    }
}
