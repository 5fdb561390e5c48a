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

use crate::shared::session::default_group;
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
    /// In training with a process group of several ranks, if the backend is
    /// not burn-ddp's (`Ddp<..>`), or a collective fails (naming the rank).
    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        let group = default_group().filter(|group| group.world_size() > 1);
        match group {
            Some(group) if B::ad_enabled(&input.device()) => {
                self.forward_synchronised(input, &group)
            }
            // Running statistics are shared (RunningState clones share storage).
            _ => BatchNorm::from(self.clone()).forward(input),
        }
    }

    fn forward_synchronised<const D: usize>(
        &self,
        input: Tensor<B, D>,
        group: &crate::ProcessGroup,
    ) -> Tensor<B, D> {
        assert!(
            D >= 2,
            "SyncBatchNorm needs [batch, channels, ...], got {D} dimensions"
        );
        let device = input.device();
        let dims = input.dims();
        let channels = dims[1];
        let per_channel = dims.iter().product::<usize>() / channels.max(1);
        let mut unsqueezed = [1; D];
        unsqueezed[1] = channels;
        // Sums around the running mean, a value close to the batch mean: the
        // one-pass variance then loses little to cancellation.
        let shift = self.running_mean.value().to_device(&device).detach();
        let centred = input
            .clone()
            .swap_dims(0, 1)
            .reshape([channels, per_channel])
            - shift.clone().reshape([channels, 1]);
        let sum = centred.clone().sum_dim(1).reshape([channels]);
        let squares = centred.square().sum_dim(1).reshape([channels]);
        let count = Tensor::<B, 1>::from_floats([per_channel as f32], &device);
        let local = Tensor::cat(vec![sum, squares, count], 0);
        let global = crate::autograd::tracked_sum_of(group, local)
            .unwrap_or_else(|| {
                panic!(
                    "rank {}: SyncBatchNorm trains on burn-ddp's backend (`Ddp<Autodiff<..>>`); \
                     this backend has no sum over the ranks that autodiff goes through",
                    group.rank()
                )
            })
            .unwrap_or_else(|err| panic!("SyncBatchNorm's statistics: {err}"));
        let total = global.clone().narrow(0, 2 * channels, 1);
        let mean_offset = global.clone().narrow(0, 0, channels) / total.clone();
        let mean = shift + mean_offset.clone();
        let var =
            (global.narrow(0, channels, channels) / total - mean_offset.square()).clamp_min(0.0);

        let momentum = self.momentum;
        let running_mean = self.running_mean.value_sync().to_device(&device);
        let running_var = self.running_var.value_sync().to_device(&device);
        self.running_mean.update(
            (running_mean.mul_scalar(1.0 - momentum) + mean.clone().detach().mul_scalar(momentum))
                .detach(),
        );
        self.running_var.update(
            (running_var.mul_scalar(1.0 - momentum) + var.clone().detach().mul_scalar(momentum))
                .detach(),
        );

        let std = var.add_scalar(self.epsilon).sqrt().reshape(unsqueezed);
        let normalised = (input - mean.reshape(unsqueezed)) / std;
        normalised * self.gamma.val().reshape(unsqueezed) + self.beta.val().reshape(unsqueezed)
    }
}
