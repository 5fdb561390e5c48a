//! Averaging a model's gradients across ranks (the shared `sync`, over Burn
//! 0.22's module walk).
//!
//! Burn 0.22 has no hook inside `backward()` (its `Tensor` has no backend
//! parameter, so no backend decorator), so the call is explicit:
//! `sync_gradients(&model, grads)` between `GradientsParams::from_grads` and
//! `optimizer.step`, where PyTorch's DDP averages inside `backward()`.

use crate::shared::session::SESSION;
pub use crate::shared::session::{reset_sync_stats, sync_stats};
use crate::shared::walk::first_trainable;
use crate::shim;
use burn::module::Module;
use burn::optim::GradientsParams;
pub use burn_ddp_comm::SyncStats;
use burn_ddp_comm::{ProcessGroup, Reducer, Result};
use std::sync::Mutex;

/// What synchronising `model`'s gradients cost so far: its own reducer's
/// figures if it was wrapped, else those of the default group's reducer
/// (shared by every model never wrapped); `None` without either.
pub fn sync_stats_of<M: Module>(model: &M) -> Option<SyncStats> {
    SESSION.stats_of(first_trainable(shim::walker(model)))
}

/// Averages the gradients of `model` over all ranks (PyTorch's DDP does this
/// inside `backward()`; on Burn 0.22 it is this call, before
/// `optimizer.step`): over the group and with the buckets the model was
/// wrapped with ([`crate::wrap`]), or over the default group if it never was.
///
/// Every trainable parameter takes part, in declaration order; one missing
/// from `grads` (not reached by this rank's forward pass) counts as zero.
/// Collective: every rank calls it at the same point.
///
/// Gradient accumulation is summing `GradientsParams` over micro-batches
/// (Burn's `GradientsAccumulator`) and calling this once, on the sum: one
/// all-reduce for all of them.
pub fn sync_gradients<M: Module>(model: &M, grads: GradientsParams) -> Result<GradientsParams> {
    let first = first_trainable(shim::walker(model));
    crate::shared::sync::sync_gradients(first, shim::grad_walker(model), grads)
}

/// [`sync_gradients`] with a given reducer (a Learner strategy's own).
#[cfg_attr(not(feature = "train"), allow(dead_code))]
pub(crate) fn sync_module<M: Module>(
    reducer: &Mutex<Reducer>,
    group: &ProcessGroup,
    model: &M,
    grads: GradientsParams,
) -> Result<GradientsParams> {
    crate::shared::sync::sync_module(reducer, group, shim::grad_walker(model), grads)
}
