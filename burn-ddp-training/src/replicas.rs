//! Whether every rank holds the same parameters: one digest per parameter
//! tensor, compared across the ranks.
//!
//! Saved records cannot be compared with `cmp` (they embed each process's
//! parameter ids), and comparing whole models over the network would move
//! every parameter; a 64-bit digest per tensor is two small all-gathers. The
//! front-ends walk their Burn module and hand the tensors' bytes here.

use burn_ddp_comm::ProcessGroup;
use burn_ddp_comm::{CommError, Result};

/// One parameter tensor as the replica check sees it: its path in the module
/// (`encoder.0.weight`), whether it is trained, and a digest of its shape and
/// bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamDigest {
    /// The field path in the module.
    pub path: String,
    /// Whether the parameter gets gradients (otherwise a buffer, such as a
    /// batch norm's running statistics); `None` where the model cannot tell
    /// (a model without autodiff, such as the Learner's result).
    pub trainable: Option<bool>,
    digest: u64,
}

impl ParamDigest {
    /// The digest of a tensor of `shape` whose data is `bytes`.
    pub fn new(
        path: impl Into<String>,
        trainable: Option<bool>,
        shape: &[usize],
        bytes: &[u8],
    ) -> Self {
        let mut hash = Fnv1a::default();
        for dim in shape {
            hash.write(&(*dim as u64).to_le_bytes());
        }
        hash.write(bytes);
        Self {
            path: path.into(),
            trainable,
            digest: hash.0,
        }
    }
}

/// One number for all of `params` (their paths, shapes and bytes, in order):
/// equal for two models exactly when, short of a hash collision, they hold
/// the same parameters, so two runs can be compared (saved records cannot:
/// they embed each process's parameter ids).
pub fn fingerprint(params: &[ParamDigest]) -> u64 {
    let mut hash = Fnv1a::default();
    for param in params {
        hash.write(param.path.as_bytes());
        hash.write(&[0]);
        hash.write(&param.digest.to_le_bytes());
    }
    hash.0
}

/// FNV-1a, 64 bits: not cryptographic, only a fingerprint of honest data.
struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a {
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Checks that every rank of `group` holds the parameters rank 0 holds; a
/// collective, so every rank calls it with its own `params` in module order.
/// Returns how many tensors were compared. A difference is an error on every
/// rank naming the first parameter that differs and the ranks it differs on.
pub fn check_replicas(group: &ProcessGroup, params: &[ParamDigest]) -> Result<usize> {
    let rank = group.rank();
    let mut names = Fnv1a::default();
    for param in params {
        names.write(param.path.as_bytes());
        names.write(&[0]);
    }
    let shapes = group.all_gather(&[params.len() as i64, names.0 as i64])?;
    let shapes: Vec<&[i64]> = shapes.chunks(2).collect();
    if let Some(other) = (1..shapes.len()).find(|&r| shapes[r] != shapes[0]) {
        return Err(CommError::Mismatch {
            rank,
            message: format!(
                "rank {other} holds a different model than rank 0 ({} parameter tensors against \
                 {}, or named differently): every rank must build the same model",
                shapes[other][0], shapes[0][0]
            ),
        });
    }
    let mine: Vec<i64> = params.iter().map(|p| p.digest as i64).collect();
    let all = group.all_gather(&mine)?;
    let per_rank: Vec<&[i64]> = all.chunks(params.len().max(1)).collect();
    for (index, param) in params.iter().enumerate() {
        let differing: Vec<String> = (1..per_rank.len())
            .filter(|&r| per_rank[r][index] != per_rank[0][index])
            .map(|r| r.to_string())
            .collect();
        if differing.is_empty() {
            continue;
        }
        const TRAINED: &str = "a trained parameter differs when its ranks started from \
             different values or took different steps (a model not wrapped, gradients not \
             averaged before the optimizer step, or a step skipped on some ranks)";
        const BUFFER: &str = "a buffer differs when each rank updates it from its own batches \
             (batch norm's running statistics): compare after broadcasting or averaging it";
        let why = match param.trainable {
            Some(true) => format!("it is trained: {TRAINED}"),
            Some(false) => format!("it is a buffer, not trained: {BUFFER}"),
            None => format!(
                "this model has no autodiff, so whether it is trained is unknown ({TRAINED}; \
                 {BUFFER})"
            ),
        };
        return Err(CommError::Mismatch {
            rank,
            message: format!(
                "the replicas differ: parameter `{}` ({} of {}) on rank(s) {} is not rank 0's; \
                 {why}",
                param.path,
                index + 1,
                params.len(),
                differing.join(", ")
            ),
        });
    }
    Ok(params.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_see_shape_and_every_byte() {
        let a = ParamDigest::new("w", Some(true), &[2, 2], &[1, 2, 3, 4]);
        assert_eq!(a, ParamDigest::new("w", Some(true), &[2, 2], &[1, 2, 3, 4]));
        assert_ne!(
            a.digest,
            ParamDigest::new("w", Some(true), &[4], &[1, 2, 3, 4]).digest
        );
        assert_ne!(
            a.digest,
            ParamDigest::new("w", Some(true), &[2, 2], &[1, 2, 3, 5]).digest
        );
    }

    #[test]
    fn a_world_of_one_agrees_with_itself() {
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        let params = [
            ParamDigest::new("a", Some(true), &[1], &[0; 4]),
            ParamDigest::new("b", None, &[1], &[1; 4]),
        ];
        assert_eq!(check_replicas(&group, &params).unwrap(), 2);
        assert_eq!(check_replicas(&group, &[]).unwrap(), 0);
    }
}
