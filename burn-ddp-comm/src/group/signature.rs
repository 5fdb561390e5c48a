//! The debug check (`BURN_DDP_DEBUG=detail`): before a collective, every rank
//! shows the others which call it is about to make, so calls out of step are
//! an error naming both instead of garbled sums or a hang.

use crate::element::{BufferMut, DType};
use crate::error::{CommError, Result};
use crate::transport::Transport;

/// The collectives a signature can name, in the order of their codes.
const OPS: [&str; 4] = ["all_reduce", "all_gather", "reduce_scatter", "broadcast"];

/// What a collective call looks like, packed for a cross-rank comparison:
/// operation, element type, length, and the reduction or root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Signature {
    words: [i64; 4],
}

impl Signature {
    /// `op` is one of [`OPS`]; `extra` the reduction (as a number) or the root.
    pub(super) fn new(op: &str, dtype: DType, len: usize, extra: i64) -> Self {
        let op = OPS
            .iter()
            .position(|name| *name == op)
            .expect("a known collective") as i64;
        Self {
            words: [op, dtype.code(), len as i64, extra],
        }
    }

    /// Bytes of the buffer the call names.
    pub(super) fn bytes(&self) -> usize {
        let [_, dtype, len, _] = self.words;
        DType::from_code(dtype).map_or(0, DType::size) * len as usize
    }

    fn from_words(words: &[i64]) -> Self {
        Self {
            words: words.try_into().unwrap_or([-1; 4]),
        }
    }

    /// Gathers every rank's signature over `transport` and fails, naming the
    /// first rank whose call differs from `self`.
    pub(super) fn check(
        self,
        transport: &mut dyn Transport,
        rank: usize,
        world_size: usize,
    ) -> Result<()> {
        let mut all = vec![0i64; 4 * world_size];
        all[4 * rank..4 * rank + 4].copy_from_slice(&self.words);
        transport.all_gather(BufferMut::I64(&mut all))?;
        self.compare(rank, &all)
    }

    /// The comparison itself, against every rank's words in rank order.
    fn compare(self, rank: usize, all: &[i64]) -> Result<()> {
        for (peer, theirs) in all.chunks(4).enumerate() {
            if theirs != self.words {
                return Err(CommError::Mismatch {
                    rank,
                    message: format!(
                        "this rank calls {self} but rank {peer} calls {}",
                        Signature::from_words(theirs)
                    ),
                });
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [op, dtype, len, extra] = self.words;
        let op = OPS.get(op as usize).copied().unwrap_or("?");
        let dtype = DType::from_code(dtype)
            .map(|d| format!("{d:?}"))
            .unwrap_or_default();
        let extra = match op {
            "broadcast" => format!(", root {extra}"),
            "all_gather" => String::new(),
            _ => format!(", op {extra}"),
        };
        write!(f, "{op}({len} x {dtype}{extra})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_read_as_the_call() {
        assert_eq!(
            Signature::new("all_reduce", DType::F32, 10, 1).to_string(),
            "all_reduce(10 x F32, op 1)"
        );
        assert_eq!(
            Signature::new("broadcast", DType::BF16, 3, 2).to_string(),
            "broadcast(3 x BF16, root 2)"
        );
        assert_eq!(
            Signature::new("all_gather", DType::I64, 4, 0).to_string(),
            "all_gather(4 x I64)"
        );
    }

    #[test]
    fn the_first_differing_rank_is_named() {
        let mine = Signature::new("all_reduce", DType::F32, 10, 0);
        let other = Signature::new("broadcast", DType::F32, 10, 0);
        let mut all = Vec::new();
        for sig in [mine, mine, other] {
            all.extend_from_slice(&sig.words);
        }
        let err = mine.compare(0, &all).unwrap_err().to_string();
        assert!(
            err.contains(
                "rank 0: ranks disagree: this rank calls all_reduce(10 x F32, op 0) \
                          but rank 2 calls broadcast(10 x F32, root 0)"
            ),
            "{err}"
        );
        assert!(mine.compare(1, &all[..8]).is_ok());
    }
}
