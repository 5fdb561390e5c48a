//! Checking that every rank holds the same parameters (the walk and the
//! digests are the shared `replicas`).

use crate::shim;
use burn::module::Module;
use burn::tensor::backend::Backend;
use burn_ddp_comm::{ProcessGroup, Result};

/// Checks that every rank of `group` holds exactly rank 0's parameters, every
/// parameter tensor of `model` (trained or not) compared by a digest of its
/// shape and bytes. Returns how many tensors were compared; a difference is an
/// error on every rank naming the first parameter that differs (its path in
/// the module) and the ranks it differs on. Collective: every rank calls it at
/// the same point, for example after training.
///
/// Saved records cannot be compared with `cmp`: they embed each process's
/// parameter ids.
pub fn check_replicas<B: Backend, M: Module<B>>(model: &M, group: &ProcessGroup) -> Result<usize> {
    crate::shared::replicas::check(group, shim::walker(model))
}

/// A fingerprint of every parameter tensor of `model` (paths, shapes and
/// bytes; [`burn_ddp_training::replicas::fingerprint`]): print it at the end
/// of two runs to check that they ended with exactly the same parameters (a
/// run restarted from snapshots and an uninterrupted one, say). Local: no
/// collective.
pub fn parameters_fingerprint<B: Backend, M: Module<B>>(model: &M) -> u64 {
    crate::shared::replicas::fingerprint(shim::walker(model))
}

/// Every float parameter of `model`, in declaration order, as f32: to
/// compare two runs to a tolerance where their fingerprints cannot agree
/// (another world size sums in another order). Local: no collective.
pub fn parameter_values<B: Backend, M: Module<B>>(model: &M) -> Vec<f32> {
    crate::shared::replicas::values(shim::walker(model))
}
