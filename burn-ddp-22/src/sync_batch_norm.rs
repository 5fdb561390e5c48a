//! Batch normalisation over the whole global batch (PyTorch's
//! `SyncBatchNorm`): in training, each layer's per-channel sums, sums of
//! squares and counts are summed over the ranks in one collective, so every
//! rank normalises by the statistics of all ranks' samples and updates the
//! same running statistics; the sum is one autodiff goes through (its
//! backward sums the gradient over the ranks), so the input gradient is the
//! one-big-batch gradient. In eval (`valid()`, or `training` off), in a
//! world of one, or without a process group it is Burn's `BatchNorm`, bit
//! for bit, with no collective.
//!
//! The fields, their names and the `Config` are `BatchNorm`'s, so records
//! load from one into the other. Training needs this crate's feature for the
//! backend (`flex`, `ndarray` or `cuda`).

use crate::shared::sync_batch_norm::{normalise_over_ranks, statistics_group};
use crate::{ProcessGroup, Result};
use burn::module::{Flag, Module, Param, RunningState};
use burn::nn::{BatchNorm, BatchNormConfig};
use burn::tensor::{Device, Tensor};

/// [`SyncBatchNorm`]'s settings: `BatchNorm`'s.
pub type SyncBatchNormConfig = BatchNormConfig;

/// `BatchNorm` whose training statistics are those of the global batch.
#[derive(Module, Debug)]
pub struct SyncBatchNorm {
    /// The learned scale, per channel.
    pub gamma: Param<Tensor<1>>,
    /// The learned shift, per channel.
    pub beta: Param<Tensor<1>>,
    /// Whether training behaviour is on for this layer (`BatchNorm`'s flag).
    pub training: Param<Flag>,
    /// The global batches' mean, averaged over steps, for eval.
    pub running_mean: RunningState<Tensor<1>>,
    /// The global batches' (biased) variance, averaged over steps, for eval.
    pub running_var: RunningState<Tensor<1>>,
    /// Weight of a new batch in the running statistics.
    pub momentum: f64,
    /// Added to the variance before its square root.
    pub epsilon: f64,
}

impl From<BatchNorm> for SyncBatchNorm {
    fn from(norm: BatchNorm) -> Self {
        Self {
            gamma: norm.gamma,
            beta: norm.beta,
            training: norm.training,
            running_mean: norm.running_mean,
            running_var: norm.running_var,
            momentum: norm.momentum,
            epsilon: norm.epsilon,
        }
    }
}

impl From<SyncBatchNorm> for BatchNorm {
    fn from(norm: SyncBatchNorm) -> Self {
        Self {
            gamma: norm.gamma,
            beta: norm.beta,
            training: norm.training,
            running_mean: norm.running_mean,
            running_var: norm.running_var,
            momentum: norm.momentum,
            epsilon: norm.epsilon,
        }
    }
}

/// `config.init` as a [`SyncBatchNorm`].
pub fn sync_batch_norm(config: &SyncBatchNormConfig, device: &Device) -> SyncBatchNorm {
    config.init(device).into()
}

impl SyncBatchNorm {
    /// Normalises `input` (`[batch, channels, ...]`); see the module documentation.
    ///
    /// # Panics
    ///
    /// In training with a process group of several ranks: if this crate was
    /// built without the feature for the input's backend, if the ranks'
    /// statistics cannot be summed (naming the rank and the layer), or if the
    /// launcher started several ranks and `init_process_group` was not called.
    pub fn forward<const D: usize>(&self, input: Tensor<D>) -> Tensor<D> {
        if input.device().is_autodiff() && self.training.is_enabled() {
            if let Some(group) = statistics_group(self.gamma.val().dims()[0]) {
                return normalise_over_ranks!(self, input, &group, tracked_sum, D);
            }
        }
        // Running statistics are shared (RunningState clones share storage).
        BatchNorm::from(self.clone()).forward(input)
    }
}

fn tracked_sum(group: &ProcessGroup, tensor: Tensor<1>) -> Result<Tensor<1>> {
    crate::autograd::all_reduce_sum_tracked(group, tensor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::module::ModuleVisitor;
    use burn::store::ModuleRecord;
    use burn::tensor::Bytes;

    fn values<M: Module>(module: &M) -> Vec<f32> {
        struct Collect(Vec<f32>);
        impl ModuleVisitor for Collect {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                self.0
                    .extend(param.val().into_data().try_to_vec::<f32>().unwrap());
            }
        }
        let mut collect = Collect(Vec::new());
        module.visit(&mut collect);
        collect.0
    }

    fn input(device: &Device) -> Tensor<3> {
        let values: Vec<f32> = (0..24).map(|i| ((i * 7 % 11) as f32) / 3.0).collect();
        Tensor::<1>::from_floats(values.as_slice(), device).reshape([2, 3, 4])
    }

    /// Without a process group (a world of one) it is Burn's BatchNorm bit
    /// for bit: the output, the input's gradient, the running statistics,
    /// and in eval.
    #[test]
    fn without_a_group_it_is_batch_norm_bit_for_bit() {
        let device = Device::flex().autodiff();
        let config = SyncBatchNormConfig::new(3);
        let plain = config.init(&device);
        let synced = sync_batch_norm(&config, &device);
        let run = |forward: &dyn Fn(Tensor<3>) -> Tensor<3>| {
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
        let device = Device::flex().autodiff();
        let save = |module: ModuleRecord| {
            let bytes = module.into_bytes().unwrap();
            ModuleRecord::from_bytes(Bytes::from_bytes_vec(bytes.to_vec())).unwrap()
        };
        let trained = SyncBatchNormConfig::new(3).init(&device);
        let _ = trained.forward(input(&device));
        // `valid()` settles the running statistics' last update (Burn keeps
        // it pending until then).
        let trained = trained.valid();
        let record = save(trained.clone().into_record());
        let synced = sync_batch_norm(&SyncBatchNormConfig::new(3), &device)
            .try_load_record(record)
            .unwrap();
        assert_eq!(values(&trained), values(&synced.valid()));

        let record = save(synced.clone().into_record());
        let back = SyncBatchNormConfig::new(3)
            .init(&device)
            .try_load_record(record)
            .unwrap();
        assert_eq!(values(&synced.valid()), values(&back.valid()));
        assert_ne!(
            values(&back.valid()),
            values(&SyncBatchNormConfig::new(3).init(&device)),
            "the running statistics moved"
        );
    }
}
