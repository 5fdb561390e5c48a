//! Batch normalisation over the whole global batch (PyTorch's
//! `SyncBatchNorm`): in training, each layer's per-channel sum, sum of
//! squares and count are summed over the ranks in one collective, so every
//! rank normalises by the statistics of all ranks' samples and updates the
//! same running statistics; the sum is one autodiff goes through (its
//! backward sums the gradient over the ranks), so the input gradient is the
//! one-big-batch gradient. In eval, in a world of one, or without a process
//! group, it is Burn's `BatchNorm`, bit for bit, with no collective.
//!
//! The fields, their names and the `Config` are `BatchNorm`'s, so records
//! load from one into the other.

use crate::shared::sync_batch_norm::{normalise_over_ranks, statistics_group};
use crate::{CommError, ProcessGroup, Result};
use burn::module::{Module, Param, RunningState};
use burn::nn::{BatchNorm, BatchNormConfig};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

/// [`SyncBatchNorm`]'s settings: `BatchNorm`'s.
pub type SyncBatchNormConfig = BatchNormConfig;

/// `BatchNorm` whose training statistics are those of the global batch.
#[derive(Module, Debug)]
pub struct SyncBatchNorm<B: Backend> {
    /// The learned scale, per channel.
    pub gamma: Param<Tensor<B, 1>>,
    /// The learned shift, per channel.
    pub beta: Param<Tensor<B, 1>>,
    /// The global batches' mean, averaged over steps, for eval.
    pub running_mean: RunningState<Tensor<B, 1>>,
    /// The global batches' (biased) variance, averaged over steps, for eval.
    pub running_var: RunningState<Tensor<B, 1>>,
    /// Weight of a new batch in the running statistics.
    pub momentum: f64,
    /// Added to the variance before its square root.
    pub epsilon: f64,
}

impl<B: Backend> From<BatchNorm<B>> for SyncBatchNorm<B> {
    fn from(norm: BatchNorm<B>) -> Self {
        Self {
            gamma: norm.gamma,
            beta: norm.beta,
            running_mean: norm.running_mean,
            running_var: norm.running_var,
            momentum: norm.momentum,
            epsilon: norm.epsilon,
        }
    }
}

impl<B: Backend> From<SyncBatchNorm<B>> for BatchNorm<B> {
    fn from(norm: SyncBatchNorm<B>) -> Self {
        Self {
            gamma: norm.gamma,
            beta: norm.beta,
            running_mean: norm.running_mean,
            running_var: norm.running_var,
            momentum: norm.momentum,
            epsilon: norm.epsilon,
        }
    }
}

/// `config.init` as a [`SyncBatchNorm`].
pub fn sync_batch_norm<B: Backend>(
    config: &SyncBatchNormConfig,
    device: &B::Device,
) -> SyncBatchNorm<B> {
    config.init::<B>(device).into()
}

impl<B: Backend> SyncBatchNorm<B> {
    /// Normalises `input` (`[batch, channels, ...]`); see the module documentation.
    ///
    /// # Panics
    ///
    /// In training with a process group of several ranks: if the backend is
    /// not burn-ddp's (`Ddp<..>`), if the ranks' statistics cannot be summed
    /// (naming the rank and the layer), or if the launcher started several
    /// ranks and `init_process_group` was not called.
    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        if B::ad_enabled(&input.device()) {
            if let Some(group) = statistics_group() {
                return normalise_over_ranks!(self, input, &group, tracked_sum::<B>, D);
            }
        }
        // Running statistics are shared (RunningState clones share storage).
        BatchNorm::from(self.clone()).forward(input)
    }
}

/// The tracked sum over the ranks of `B`, registered for it by `Ddp<..>` or
/// [`enable_sync_batch_norm`](crate::enable_sync_batch_norm).
fn tracked_sum<B: Backend>(group: &ProcessGroup, tensor: Tensor<B, 1>) -> Result<Tensor<B, 1>> {
    crate::autograd::tracked_sum_of(group, tensor).unwrap_or_else(|| {
        Err(CommError::config(
            Some(group.rank()),
            "the backend",
            format!(
                "SyncBatchNorm in training needs a sum over the ranks that autodiff goes \
                 through, which {} has not registered: train on burn-ddp's `Ddp<..>` backend, \
                 or call `burn_ddp::enable_sync_batch_norm::<YourAutodiffBackend>()` once \
                 before training (the Learner, or a loop with `sync_gradients`)",
                std::any::type_name::<B>()
            ),
        ))
    })
}
