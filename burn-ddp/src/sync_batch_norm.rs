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
//! load from one into the other. docs/training.md has the whole story.

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
    /// In training with a process group of several ranks: if the backend's
    /// sum over the ranks is not registered (`Ddp<..>` registers its own; a
    /// plain `Autodiff<..>` needs [`enable_sync_batch_norm`](crate::autodiff::enable_sync_batch_norm)),
    /// if the ranks' layers differ or their statistics cannot be summed
    /// (naming the rank and the layer), or if the launcher started several
    /// ranks and `init_process_group` was not called.
    pub fn forward<const D: usize>(&self, input: Tensor<B, D>) -> Tensor<B, D> {
        if B::ad_enabled(&input.device()) {
            if let Some(group) = statistics_group(self.gamma.val().dims()[0]) {
                return normalise_over_ranks!(self, input, &group, tracked_sum::<B>, D);
            }
        }
        // Running statistics are shared (RunningState clones share storage).
        BatchNorm::from(self.clone()).forward(input)
    }
}

/// The tracked sum over the ranks of `B`, registered for it by `Ddp<..>` or
/// [`enable_sync_batch_norm`](crate::autodiff::enable_sync_batch_norm).
fn tracked_sum<B: Backend>(group: &ProcessGroup, tensor: Tensor<B, 1>) -> Result<Tensor<B, 1>> {
    crate::autograd::tracked_sum_of(group, tensor).unwrap_or_else(|| {
        Err(CommError::config(
            Some(group.rank()),
            "the backend",
            format!(
                "SyncBatchNorm in training needs a sum over the ranks that autodiff goes \
                 through, which {} has not registered: train on burn-ddp's `Ddp<..>` backend, \
                 or call `burn_ddp::autodiff::enable_sync_batch_norm::<YourAutodiffBackend>()` once \
                 before training (the Learner, or a loop with `sync_gradients`)",
                std::any::type_name::<B>()
            ),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::{Autodiff, NdArray};
    use burn::module::AutodiffModule;
    use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Recorder};

    type B = Autodiff<NdArray>;

    fn values<M: Module<B>>(module: &M) -> Vec<f32> {
        struct Collect(Vec<f32>);
        impl burn::module::ModuleVisitor<B> for Collect {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
                self.0
                    .extend(param.val().into_data().to_vec::<f32>().unwrap());
            }
        }
        let mut collect = Collect(Vec::new());
        module.visit(&mut collect);
        collect.0
    }

    fn input(device: &burn::tensor::Device<B>) -> Tensor<B, 3> {
        let values: Vec<f32> = (0..24).map(|i| ((i * 7 % 11) as f32) / 3.0).collect();
        Tensor::<B, 1>::from_floats(values.as_slice(), device).reshape([2, 3, 4])
    }

    /// Without a process group (a world of one) it is Burn's BatchNorm bit
    /// for bit: the output, the input's gradient, the running statistics,
    /// and in eval.
    #[test]
    fn without_a_group_it_is_batch_norm_bit_for_bit() {
        let device = Default::default();
        let config = SyncBatchNormConfig::new(3);
        let plain = config.init::<B>(&device);
        let synced = sync_batch_norm::<B>(&config, &device);
        let run = |forward: &dyn Fn(Tensor<B, 3>) -> Tensor<B, 3>| {
            let x = input(&device).require_grad();
            let y = forward(x.clone());
            let grads = (y.clone() * y.clone()).sum().backward();
            let grad = x.grad(&grads).unwrap();
            (y.into_data(), grad.into_data())
        };
        assert_eq!(
            run(&|x| plain.forward(x)),
            run(&|x| synced.forward(x)),
            "training"
        );
        assert_eq!(values(&plain), values(&synced), "running statistics");
        let x = input(&device).inner();
        assert_eq!(
            plain.valid().forward(x.clone()).into_data(),
            synced.valid().forward(x).into_data(),
            "eval"
        );
    }

    /// A BatchNorm's saved record loads into a SyncBatchNorm and back: the
    /// fields are the same, by name.
    #[test]
    fn records_load_from_batch_norm_and_back() {
        let device = Default::default();
        let recorder = NamedMpkBytesRecorder::<FullPrecisionSettings>::new();
        let trained = SyncBatchNormConfig::new(3).init::<B>(&device);
        let _ = trained.forward(input(&device));
        let bytes = recorder.record(trained.clone().into_record(), ()).unwrap();
        let record = recorder.load(bytes, &device).unwrap();
        let synced =
            sync_batch_norm::<B>(&SyncBatchNormConfig::new(3), &device).load_record(record);
        assert_eq!(values(&trained), values(&synced));

        let bytes = recorder.record(synced.clone().into_record(), ()).unwrap();
        let record = recorder.load(bytes, &device).unwrap();
        let back = SyncBatchNormConfig::new(3)
            .init::<B>(&device)
            .load_record(record);
        assert_eq!(values(&synced), values(&back));
        assert_ne!(
            values(&back),
            values(&SyncBatchNormConfig::new(3).init::<B>(&device)),
            "the running statistics moved"
        );
    }
}
