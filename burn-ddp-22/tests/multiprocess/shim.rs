//! Burn 0.22's spelling of what shared-tests/multiprocess uses: the
//! models (no backend parameter: the model the ranks train and its
//! single-process reference are one type), the devices (Flex, with autodiff
//! for training), the tensors, and a backward pass whose gradients
//! `sync_gradients` averages.

pub use crate::common::{floats, Params, Step};
pub use burn_ddp_22 as ddp;

use crate::shared::contract::DdpModel;

use burn::module::{Module, ModuleMapper, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::GradientsParams;
use burn::tensor::{DType, Int, TensorData};
use burn_ddp_22::sync::SyncStats;
use burn_ddp_22::ProcessGroup;

pub use burn::tensor::{Device, Tensor};

/// The traits of this shim the shared sources call methods of.
pub mod prelude {
    pub use super::{Params, Step};
}

/// The device of the trained models and their references.
pub fn device() -> Device {
    Device::flex().autodiff()
}

pub fn seed(device: &Device, seed: u64) {
    device.seed(seed)
}

/// The device of the tensor collectives (no autodiff).
pub fn host_device() -> Device {
    Device::flex()
}

/// One type for the model the ranks train and for its reference.
pub type ReferenceToy = Toy;
pub type ReferenceSmallConv = SmallConv;
pub type ReferenceTwoHeads = TwoHeads;
pub type Loss = Tensor<1>;
pub type ReferenceLoss = Tensor<1>;

/// Half precision is on Flex too.
pub type HalfTensor<const D: usize> = Tensor<D>;
pub type HalfTrainedTensor<const D: usize> = Tensor<D>;
pub type HalfLinear = Linear;

pub fn half_device() -> Device {
    Device::flex()
}

pub fn half_training_device() -> Device {
    Device::flex().autodiff()
}

impl<M: Module> DdpModel for M {
    type Loss = Tensor<1>;
    fn wrap(self, group: &ProcessGroup) -> Result<Self, String> {
        burn_ddp_22::wrap(self, group).map_err(|err| err.to_string())
    }
    fn local_grads(&self, loss: Tensor<1>) -> GradientsParams {
        GradientsParams::from_grads(loss.backward(), self)
    }
    fn synced_grads(&self, loss: Tensor<1>) -> Result<GradientsParams, String> {
        burn_ddp_22::sync_gradients(self, self.local_grads(loss)).map_err(|err| err.to_string())
    }
    fn sync_stats(&self) -> Option<SyncStats> {
        burn_ddp_22::sync::sync_stats_of(self)
    }
}

/// The tutorial's ToyModel: one Linear(10, 1).
#[derive(Module, Debug)]
pub struct Toy {
    pub linear: Linear,
}

impl Toy {
    pub fn new(device: &Device, outputs: usize) -> Self {
        Self {
            linear: LinearConfig::new(10, outputs).init(device),
        }
    }

    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.linear.forward(x)
    }
}

/// A small conv + linear classifier on 1x8x8 images, 3 classes.
#[derive(Module, Debug)]
pub struct SmallConv {
    conv: Conv2d,
    pool: MaxPool2d,
    linear: Linear,
    relu: Relu,
}

impl SmallConv {
    pub fn new(device: &Device) -> Self {
        Self {
            conv: Conv2dConfig::new([1, 4], [3, 3]).init(device),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            linear: LinearConfig::new(4 * 3 * 3, 3).init(device),
            relu: Relu::new(),
        }
    }

    pub fn forward(&self, x: Tensor<4>) -> Tensor<2> {
        let x = self.relu.forward(self.conv.forward(x));
        self.linear.forward(self.pool.forward(x).flatten(1, 3))
    }
}

/// A shared trunk with two heads; a rank may use only one of them.
#[derive(Module, Debug)]
pub struct TwoHeads {
    trunk: Linear,
    head_a: Linear,
    head_b: Linear,
}

impl TwoHeads {
    pub fn new(device: &Device) -> Self {
        Self {
            trunk: LinearConfig::new(10, 4).init(device),
            head_a: LinearConfig::new(4, 1).init(device),
            head_b: LinearConfig::new(4, 1).init(device),
        }
    }

    pub fn forward(&self, x: Tensor<2>, use_b: bool) -> Tensor<2> {
        let h = self.trunk.forward(x);
        if use_b {
            self.head_b.forward(h)
        } else {
            self.head_a.forward(h)
        }
    }
}

/// Features [n, 10] and regression targets [n, 1] of the given items.
pub fn toy_batch(items: &[usize], device: &Device) -> (Tensor<2>, Tensor<2>) {
    let (x, y) = burn_ddp_testkit::numbers::toy_rows(items);
    (
        Tensor::from_data(TensorData::new(x, [items.len(), 10]), device),
        Tensor::from_data(TensorData::new(y, [items.len(), 1]), device),
    )
}

/// Images [n, 1, 8, 8] and class labels [n] of the given items.
pub fn image_batch(items: &[usize], device: &Device) -> (Tensor<4>, Tensor<1, Int>) {
    let (x, y) = burn_ddp_testkit::numbers::image_rows(items);
    (
        Tensor::from_data(TensorData::new(x, [items.len(), 1, 8, 8]), device),
        Tensor::from_data(TensorData::new(y, [items.len()]), device),
    )
}

/// Every float parameter cast to `dtype` (a model trained in half precision).
struct Cast(DType);

impl ModuleMapper for Cast {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        Param::from_mapped_value(id, tensor.cast(self.0).detach().require_grad(), mapper)
    }
}

pub fn cast_params<M: Module>(model: M, dtype: DType) -> M {
    model.map(&mut Cast(dtype))
}

/// The gradient of `param` in `grads`.
pub fn grad_of<const D: usize>(
    grads: &GradientsParams,
    param: &Param<Tensor<D>>,
) -> Option<Tensor<D>> {
    grads.get::<D>(param.id)
}

/// SyncBatchNorm's scenarios train on the same device as the others.
pub fn bn_device() -> Device {
    device()
}

/// The tensors of the model the ranks train.
pub type Trained<const D: usize> = Tensor<D>;

/// The small CNN with a normalisation after its convolution: SyncBatchNorm
/// on the ranks, Burn's BatchNorm under DDP, and the single-process
/// reference with Burn's BatchNorm.
pub type SyncBnConv = bn::BnConv<burn_ddp_22::SyncBatchNorm>;
pub type LocalBnConv = bn::BnConv<burn::nn::BatchNorm>;
pub type ReferenceBnConv = bn::BnConv<burn::nn::BatchNorm>;

/// A lone SyncBatchNorm.
pub type SyncNorm = burn_ddp_22::SyncBatchNorm;

pub fn sync_norm(channels: usize, device: &Device) -> SyncNorm {
    burn_ddp_22::sync_batch_norm::sync_batch_norm(&burn::nn::BatchNormConfig::new(channels), device)
}

/// BatchNorm models, generic over their normalisation.
pub mod bn {
    use super::*;
    use crate::common::Norm;
    use burn::tensor::activation::tanh;

    /// Conv(1 -> 4, 3x3), the normalisation, tanh, Linear(4·6·6 -> 3) on
    /// 1x8x8 images.
    // tanh, not ReLU, after the normalisation: the comparisons are between
    // sums taken in different orders, and ReLU's kink turns a rounding-sized
    // difference of a value near zero into a whole gradient switched on or
    // off (seen in CI: 3.5e-5 after three steps); a smooth activation keeps
    // the difference at rounding size.
    #[derive(Module, Debug)]
    pub struct BnConv<N: Norm> {
        conv: Conv2d,
        pub norm: N,
        linear: Linear,
    }

    impl<N: Norm> BnConv<N> {
        pub fn new(device: &Device) -> Self {
            Self {
                conv: Conv2dConfig::new([1, 4], [3, 3]).init(device),
                norm: N::create(4, device),
                linear: LinearConfig::new(4 * 6 * 6, 3).init(device),
            }
        }

        pub fn forward(&self, x: Tensor<4>) -> Tensor<2> {
            let h = tanh(self.norm.apply(self.conv.forward(x)));
            self.linear.forward(h.flatten(1, 3))
        }

        /// Its parameters and running statistics, the last update included
        /// (`valid()` settles them).
        pub fn settled_params(&self) -> Vec<f32> {
            self.valid().flat_params()
        }

        /// The eval model's outputs (running statistics, no autodiff) on `x`.
        pub fn evaluate(&self, x: Tensor<4>) -> Vec<f32> {
            floats(self.valid().forward(x.inner()).into_data())
        }
    }
}

/// `inner` sharded over `group` (ZeRO stage 1).
pub fn shard(
    inner: burn::optim::ModuleOptimizer,
    group: &ProcessGroup,
) -> Result<burn_ddp_22::ShardedOptimizer, String> {
    burn_ddp_22::ShardedOptimizer::new(inner, group).map_err(|err| err.to_string())
}

/// `inner` sharded over `group` as `config` says.
pub fn shard_with(
    inner: burn::optim::ModuleOptimizer,
    group: &ProcessGroup,
    config: &burn_ddp_22::ShardConfig,
) -> Result<burn_ddp_22::ShardedOptimizer, String> {
    burn_ddp_22::ShardedOptimizer::with_config(inner, group, config).map_err(|err| err.to_string())
}

/// A record's tensors and its bytes as a burnpack.
fn record_size(record: burn::optim::record::OptimizerRecord) -> (usize, usize) {
    let entries = record.len();
    let bytes = record.into_bytes().expect("an optimizer record in bytes");
    (entries, bytes.len())
}

impl<M: Module> crate::shared::contract::ShardedStep<M> for burn_ddp_22::ShardedOptimizer {
    fn step(&mut self, lr: f64, model: M, grads: GradientsParams) -> Result<M, String> {
        burn_ddp_22::ShardedOptimizer::step(self, lr, model, grads).map_err(|err| err.to_string())
    }
    fn owners(&self) -> Vec<usize> {
        self.plan().owners.clone()
    }
    fn record_size(&self) -> (usize, usize) {
        record_size(self.to_record())
    }
    fn save_parts(&mut self, model: &M, dir: &std::path::Path, info: &str) -> Result<(), String> {
        burn_ddp_22::ShardedOptimizer::save_parts(self, model, dir, info)
            .map(drop)
            .map_err(|err| err.to_string())
    }
    fn load_parts(&mut self, model: M, dir: &std::path::Path) -> Result<(M, String), String> {
        burn_ddp_22::ShardedOptimizer::load_parts(self, model, dir).map_err(|err| err.to_string())
    }
    fn save_parts_in_background(
        &mut self,
        model: &M,
        dir: &std::path::Path,
        info: &str,
    ) -> Result<burn_ddp_22::shard::BackgroundSave, String> {
        burn_ddp_22::ShardedOptimizer::save_parts_in_background(self, model, dir, info)
            .map_err(|err| err.to_string())
    }
    fn save(&mut self, model: &M, dir: &std::path::Path) -> Result<(), String> {
        let whole = self.consolidate(model).map_err(|err| err.to_string())?;
        if let Some(whole) = whole {
            burn_ddp_22::checkpoint::save_atomic(dir.join("checkpoint"), model, Some(&whole), 0)
                .map_err(|err| err.to_string())?;
        }
        Ok(())
    }
}

fn checkpoint(dir: &std::path::Path) -> Result<burn_ddp_22::checkpoint::Checkpoint, String> {
    burn_ddp_22::checkpoint::load(dir.join("checkpoint")).map_err(|err| err.to_string())
}

/// The model's record saved in `dir` by `ShardedStep::save`.
pub fn load_model<M: Module>(model: M, dir: &std::path::Path) -> Result<M, String> {
    checkpoint(dir)?
        .load_model(model)
        .map_err(|err| err.to_string())
}

impl<M: Module> crate::shared::contract::LoadWhole<M> for burn_ddp_22::ShardedOptimizer {
    fn load_whole(self, dir: &std::path::Path) -> Result<Self, String> {
        let whole = checkpoint(dir)?
            .load_optimizer(self.inner().clone())
            .map_err(|err| err.to_string())?;
        Ok(self.load_record(whole.to_record()))
    }
}

impl<M: Module> crate::shared::contract::LoadWhole<M> for burn::optim::ModuleOptimizer {
    fn load_whole(self, dir: &std::path::Path) -> Result<Self, String> {
        checkpoint(dir)?
            .load_optimizer(self)
            .map_err(|err| err.to_string())
    }
}

/// The plain optimizer from a checkpoint in parts.
impl<M: Module> crate::shared::contract::LoadParts<M> for burn::optim::ModuleOptimizer {
    fn load_parts(self, model: M, dir: &std::path::Path) -> Result<(M, Self, String), String> {
        burn_ddp_22::checkpoint::load_parts(model, self, dir).map_err(|err| err.to_string())
    }
}

impl crate::shared::contract::RecordSize for burn::optim::ModuleOptimizer {
    fn record_size(&self) -> (usize, usize) {
        record_size(self.to_record())
    }
}
