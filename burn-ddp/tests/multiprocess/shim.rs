//! Burn 0.21's spelling of what shared-tests/multiprocess uses: the
//! models (generic over their backend, so the model the ranks train on
//! `Ddp<Autodiff<NdArray>>` and its single-process reference on
//! `Autodiff<NdArray>` are two types), the devices, the tensors, and a
//! backward pass whose gradients `Ddp<B>` averages inside `backward()`
//! (local ones under `no_sync`).

pub use crate::common::{flat_params, floats, load_params, Params, Step};
pub use burn_ddp as ddp;

use crate::common::params;
use crate::shared::contract::DdpModel;
use burn::backend::ndarray::NdArrayDevice;
use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::{Module, ModuleMapper, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Int, TensorData};
use burn_ddp::sync::SyncStats;
use burn_ddp::{Ddp, ProcessGroup};

/// The traits of this shim the shared sources call methods of.
pub mod prelude {
    pub use super::{Params, Step};
}

/// The backend the ranks train on, and the reference's.
pub type Wrapped = Ddp<Autodiff<NdArray>>;
pub type Plain = Autodiff<NdArray>;

pub type Device = NdArrayDevice;

/// The device of the trained models, their references and the tensor collectives.
pub fn device() -> Device {
    Default::default()
}

pub fn seed(device: &Device, seed: u64) {
    Wrapped::seed(device, seed)
}

/// A tensor of the collectives (NdArray, no autodiff).
pub type Tensor<const D: usize, K = burn::tensor::Float> = burn::tensor::Tensor<NdArray, D, K>;

pub fn host_device() -> Device {
    Default::default()
}

pub type Toy = models::Toy<Wrapped>;
pub type ReferenceToy = models::Toy<Plain>;
pub type SmallConv = models::SmallConv<Wrapped>;
pub type ReferenceSmallConv = models::SmallConv<Plain>;
pub type TwoHeads = models::TwoHeads<Wrapped>;
pub type ReferenceTwoHeads = models::TwoHeads<Plain>;
pub type Loss = burn::tensor::Tensor<Wrapped, 1>;
pub type ReferenceLoss = burn::tensor::Tensor<Plain, 1>;

/// Half precision is on Flex (its host tensors, and the model `Ddp<B>`
/// trains).
pub type HalfTensor<const D: usize> = burn::tensor::Tensor<Flex, D>;
pub type HalfTrainedTensor<const D: usize> = burn::tensor::Tensor<Ddp<Autodiff<Flex>>, D>;
pub type HalfLinear = Linear<Ddp<Autodiff<Flex>>>;

pub fn half_device() -> burn::tensor::Device<Flex> {
    Default::default()
}

pub fn half_training_device() -> burn::tensor::Device<Flex> {
    Default::default()
}

macro_rules! ddp_models {
    ($($model:ident),*) => {$(
        params!($model);

        impl<B: AutodiffBackend> DdpModel for $model<B> {
            type Loss = burn::tensor::Tensor<B, 1>;
            fn wrap(self, group: &ProcessGroup) -> Result<Self, String> {
                burn_ddp::wrap(self, group).map_err(|err| err.to_string())
            }
            fn local_grads(&self, loss: Self::Loss) -> GradientsParams {
                let _local = burn_ddp::no_sync();
                GradientsParams::from_grads(loss.backward(), self)
            }
            fn synced_grads(&self, loss: Self::Loss) -> Result<GradientsParams, String> {
                Ok(GradientsParams::from_grads(loss.backward(), self))
            }
            fn try_synced_grads(&self, loss: Self::Loss) -> Result<GradientsParams, String> {
                burn_ddp::sync::try_backward(loss)
                    .map(|grads| GradientsParams::from_grads(grads, self))
                    .map_err(|err| err.to_string())
            }
            fn sync_stats(&self) -> Option<SyncStats> {
                burn_ddp::sync::sync_stats_of(self)
            }
        }
    )*};
}

use models::{SmallConv as SmallConvOf, Toy as ToyOf, TwoHeads as TwoHeadsOf};
ddp_models!(ToyOf, SmallConvOf, TwoHeadsOf, Linear);

/// The models, generic over their backend.
pub mod models {
    use super::*;

    /// The tutorial's ToyModel: one Linear(10, 1).
    #[derive(Module, Debug)]
    pub struct Toy<B: Backend> {
        pub linear: Linear<B>,
    }

    impl<B: Backend> Toy<B> {
        pub fn new(device: &B::Device, outputs: usize) -> Self {
            Self {
                linear: LinearConfig::new(10, outputs).init(device),
            }
        }

        pub fn forward(&self, x: burn::tensor::Tensor<B, 2>) -> burn::tensor::Tensor<B, 2> {
            self.linear.forward(x)
        }
    }

    /// A small conv + linear classifier on 1x8x8 images, 3 classes.
    #[derive(Module, Debug)]
    pub struct SmallConv<B: Backend> {
        conv: Conv2d<B>,
        pool: MaxPool2d,
        linear: Linear<B>,
        relu: Relu,
    }

    impl<B: Backend> SmallConv<B> {
        pub fn new(device: &B::Device) -> Self {
            Self {
                conv: Conv2dConfig::new([1, 4], [3, 3]).init(device),
                pool: MaxPool2dConfig::new([2, 2]).init(),
                linear: LinearConfig::new(4 * 3 * 3, 3).init(device),
                relu: Relu::new(),
            }
        }

        pub fn forward(&self, x: burn::tensor::Tensor<B, 4>) -> burn::tensor::Tensor<B, 2> {
            let x = self.relu.forward(self.conv.forward(x));
            self.linear.forward(self.pool.forward(x).flatten(1, 3))
        }
    }

    /// A shared trunk with two heads; a rank may use only one of them.
    #[derive(Module, Debug)]
    pub struct TwoHeads<B: Backend> {
        trunk: Linear<B>,
        head_a: Linear<B>,
        head_b: Linear<B>,
    }

    impl<B: Backend> TwoHeads<B> {
        pub fn new(device: &B::Device) -> Self {
            Self {
                trunk: LinearConfig::new(10, 4).init(device),
                head_a: LinearConfig::new(4, 1).init(device),
                head_b: LinearConfig::new(4, 1).init(device),
            }
        }

        pub fn forward(
            &self,
            x: burn::tensor::Tensor<B, 2>,
            use_b: bool,
        ) -> burn::tensor::Tensor<B, 2> {
            let h = self.trunk.forward(x);
            if use_b {
                self.head_b.forward(h)
            } else {
                self.head_a.forward(h)
            }
        }
    }
}

/// Features [n, 10] and regression targets [n, 1] of the given items.
pub fn toy_batch<B: Backend>(
    items: &[usize],
    device: &B::Device,
) -> (burn::tensor::Tensor<B, 2>, burn::tensor::Tensor<B, 2>) {
    let (x, y) = burn_ddp_testkit::numbers::toy_rows(items);
    (
        burn::tensor::Tensor::from_data(TensorData::new(x, [items.len(), 10]), device),
        burn::tensor::Tensor::from_data(TensorData::new(y, [items.len(), 1]), device),
    )
}

/// Images [n, 1, 8, 8] and class labels [n] of the given items.
pub fn image_batch<B: Backend>(
    items: &[usize],
    device: &B::Device,
) -> (burn::tensor::Tensor<B, 4>, burn::tensor::Tensor<B, 1, Int>) {
    let (x, y) = burn_ddp_testkit::numbers::image_rows(items);
    (
        burn::tensor::Tensor::from_data(TensorData::new(x, [items.len(), 1, 8, 8]), device),
        burn::tensor::Tensor::from_data(TensorData::new(y, [items.len()]), device),
    )
}

/// Every float parameter cast to `dtype` (a model trained in half precision).
struct Cast(DType);

impl<B: Backend> ModuleMapper<B> for Cast {
    fn map_float<const D: usize>(
        &mut self,
        param: Param<burn::tensor::Tensor<B, D>>,
    ) -> Param<burn::tensor::Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        Param::from_mapped_value(id, tensor.cast(self.0).detach().require_grad(), mapper)
    }
}

pub fn cast_params<B: Backend, M: Module<B>>(model: M, dtype: DType) -> M {
    model.map(&mut Cast(dtype))
}

/// The gradient of `param` in `grads` (on the inner backend).
pub fn grad_of<B: AutodiffBackend, const D: usize>(
    grads: &GradientsParams,
    param: &Param<burn::tensor::Tensor<B, D>>,
) -> Option<burn::tensor::Tensor<B::InnerBackend, D>> {
    grads.get::<B::InnerBackend, D>(param.id)
}

/// SyncBatchNorm's scenarios train on Flex: Burn 0.21's NdArray cannot
/// multiply matrices with no rows (`burn-ndarray` 0.21.0's matmul divides by
/// zero), which a rank without samples does in its Linear layer's backward.
pub type BnWrapped = Ddp<Autodiff<Flex>>;
pub type BnPlain = Autodiff<Flex>;

pub fn bn_device() -> burn::tensor::Device<Flex> {
    Default::default()
}

/// The tensors of the model the ranks train in SyncBatchNorm's scenarios.
pub type Trained<const D: usize> = burn::tensor::Tensor<BnWrapped, D>;

/// The small CNN with a normalisation after its convolution: SyncBatchNorm
/// on the ranks, Burn's BatchNorm under DDP, and the single-process
/// reference with Burn's BatchNorm.
pub type SyncBnConv = bn::BnConv<BnWrapped, burn_ddp::SyncBatchNorm<BnWrapped>>;
pub type LocalBnConv = bn::BnConv<BnWrapped, burn::nn::BatchNorm<BnWrapped>>;
pub type ReferenceBnConv = bn::BnConv<BnPlain, burn::nn::BatchNorm<BnPlain>>;

/// A lone SyncBatchNorm of the ranks' backend.
pub type SyncNorm = burn_ddp::SyncBatchNorm<BnWrapped>;

pub fn sync_norm(channels: usize, device: &burn::tensor::Device<Flex>) -> SyncNorm {
    burn_ddp::sync_batch_norm::sync_batch_norm(&burn::nn::BatchNormConfig::new(channels), device)
}

/// BatchNorm models, generic over their backend and their normalisation.
pub mod bn {
    use super::*;
    use crate::common::Norm;
    use burn::module::AutodiffModule;
    use burn::tensor::activation::tanh;

    /// Conv(1 -> 4, 3x3), the normalisation, tanh, Linear(4·6·6 -> 3) on
    /// 1x8x8 images.
    // tanh, not ReLU, after the normalisation: the comparisons are between
    // sums taken in different orders, and ReLU's kink turns a rounding-sized
    // difference of a value near zero into a whole gradient switched on or
    // off (seen in CI: 3.5e-5 after three steps); a smooth activation keeps
    // the difference at rounding size.
    #[derive(Module, Debug)]
    pub struct BnConv<B: Backend, N> {
        conv: Conv2d<B>,
        pub norm: N,
        linear: Linear<B>,
    }

    impl<B: Backend, N: Norm<B>> BnConv<B, N> {
        pub fn new(device: &B::Device) -> Self {
            Self {
                conv: Conv2dConfig::new([1, 4], [3, 3]).init(device),
                norm: N::create(4, device),
                linear: LinearConfig::new(4 * 6 * 6, 3).init(device),
            }
        }

        pub fn forward(&self, x: burn::tensor::Tensor<B, 4>) -> burn::tensor::Tensor<B, 2> {
            let h = tanh(self.norm.apply(self.conv.forward(x)));
            self.linear.forward(h.flatten(1, 3))
        }
    }

    impl<B: AutodiffBackend, N: Norm<B> + AutodiffModule<B>> BnConv<B, N>
    where
        N::InnerModule: Norm<B::InnerBackend>,
    {
        /// Its parameters and running statistics, the last update included
        /// (`valid()` settles them).
        pub fn settled_params(&self) -> Vec<f32> {
            self.valid().flat_params()
        }

        /// The eval model's outputs (running statistics, no autodiff) on `x`.
        pub fn evaluate(&self, x: burn::tensor::Tensor<B, 4>) -> Vec<f32> {
            floats(self.valid().forward(x.inner()).into_data())
        }
    }

    impl<B: AutodiffBackend, N: Norm<B> + AutodiffModule<B>> DdpModel for BnConv<B, N>
    where
        N::InnerModule: Norm<B::InnerBackend>,
    {
        type Loss = burn::tensor::Tensor<B, 1>;
        fn wrap(self, group: &ProcessGroup) -> Result<Self, String> {
            burn_ddp::wrap(self, group).map_err(|err| err.to_string())
        }
        fn local_grads(&self, loss: Self::Loss) -> GradientsParams {
            let _local = burn_ddp::no_sync();
            GradientsParams::from_grads(loss.backward(), self)
        }
        fn synced_grads(&self, loss: Self::Loss) -> Result<GradientsParams, String> {
            Ok(GradientsParams::from_grads(loss.backward(), self))
        }
        fn sync_stats(&self) -> Option<SyncStats> {
            burn_ddp::sync::sync_stats_of(self)
        }
    }

    impl<B: Backend, N: Norm<B>> Params for BnConv<B, N> {
        fn flat_params(&self) -> Vec<f32> {
            flat_params(self)
        }
        fn load_params(self, values: &[f32]) -> Self {
            load_params(self, values)
        }
    }
}

/// `inner` sharded over `group` (ZeRO stage 1).
pub fn shard<O>(
    inner: O,
    group: &ProcessGroup,
) -> Result<burn_ddp::ShardedOptimizer<O, Wrapped>, String> {
    burn_ddp::ShardedOptimizer::new(inner, group).map_err(|err| err.to_string())
}

/// `inner` sharded over `group` as `config` says.
pub fn shard_with<O>(
    inner: O,
    group: &ProcessGroup,
    config: &burn_ddp::ShardConfig,
) -> Result<burn_ddp::ShardedOptimizer<O, Wrapped>, String> {
    burn_ddp::ShardedOptimizer::with_config(inner, group, config).map_err(|err| err.to_string())
}

/// A record keyed by parameter (Burn 0.21's optimizers): its entries and
/// its bytes in Burn's binary format, full precision.
fn record_size<R: burn::record::Record<Wrapped>>(
    record: hashbrown::HashMap<burn::module::ParamId, R>,
) -> (usize, usize) {
    use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
    let entries = record.len();
    let bytes = BinBytesRecorder::<FullPrecisionSettings>::default()
        .record(record, ())
        .expect("an optimizer record in bytes");
    (entries, bytes.len())
}

impl<O, M, R> crate::shared::contract::ShardedStep<M> for burn_ddp::ShardedOptimizer<O, Wrapped>
where
    O: burn::optim::Optimizer<M, Wrapped, Record = hashbrown::HashMap<burn::module::ParamId, R>>,
    M: burn::module::AutodiffModule<Wrapped>,
    R: burn::record::Record<Wrapped> + 'static,
{
    fn step(&mut self, lr: f64, model: M, grads: GradientsParams) -> Result<M, String> {
        self.try_step(lr, model, grads)
            .map_err(|err| err.to_string())
    }
    fn owners(&self) -> Vec<usize> {
        self.plan().owners.clone()
    }
    fn record_size(&self) -> (usize, usize) {
        record_size(burn::optim::Optimizer::<M, Wrapped>::to_record(self))
    }
    fn save_parts(&mut self, model: &M, dir: &std::path::Path, info: &str) -> Result<(), String> {
        burn_ddp::ShardedOptimizer::save_parts(self, model, dir, info)
            .map(drop)
            .map_err(|err| err.to_string())
    }
    fn load_parts(&mut self, model: M, dir: &std::path::Path) -> Result<(M, String), String> {
        burn_ddp::ShardedOptimizer::load_parts(self, model, dir).map_err(|err| err.to_string())
    }
    fn save_parts_in_background(
        &mut self,
        model: &M,
        dir: &std::path::Path,
        info: &str,
    ) -> Result<burn_ddp::shard::BackgroundSave, String> {
        burn_ddp::ShardedOptimizer::save_parts_in_background(self, model, dir, info)
            .map_err(|err| err.to_string())
    }
    fn save(&mut self, model: &M, dir: &std::path::Path) -> Result<(), String> {
        let whole = self.consolidate(model).map_err(|err| err.to_string())?;
        if let Some(whole) = whole {
            burn_ddp::checkpoint::save_atomic::<Wrapped, _>(
                model.clone().into_record(),
                dir.join("model"),
            )
            .map_err(|err| err.to_string())?;
            burn_ddp::checkpoint::save_atomic::<Wrapped, _>(whole, dir.join("optimizer"))
                .map_err(|err| err.to_string())?;
        }
        Ok(())
    }
}

/// The plain optimizer from a checkpoint in parts.
impl<O, M> crate::shared::contract::LoadParts<M>
    for burn::optim::adaptor::OptimizerAdaptor<O, M, Wrapped>
where
    O: burn::optim::SimpleOptimizer<<Wrapped as AutodiffBackend>::InnerBackend>,
    M: burn::module::AutodiffModule<Wrapped>,
{
    fn load_parts(self, model: M, dir: &std::path::Path) -> Result<(M, Self, String), String> {
        burn_ddp::checkpoint::load_parts::<Wrapped, M, Self>(model, self, dir)
            .map_err(|err| err.to_string())
    }
}

/// The model's record saved in `dir` by `ShardedStep::save`.
pub fn load_model<M: Module<Wrapped>>(model: M, dir: &std::path::Path) -> Result<M, String> {
    burn_ddp::checkpoint::load_into(model, dir.join("model"), &device())
        .map_err(|err| err.to_string())
}

/// The whole optimizer state saved in `dir`, loaded into `optimizer`.
fn load_whole<O, M>(optimizer: O, dir: &std::path::Path) -> Result<O, String>
where
    O: burn::optim::Optimizer<M, Wrapped>,
    M: burn::module::AutodiffModule<Wrapped>,
{
    let record = burn_ddp::checkpoint::load::<Wrapped, O::Record>(dir.join("optimizer"), &device())
        .map_err(|err| err.to_string())?;
    Ok(optimizer.load_record(record))
}

impl<O, M, R> crate::shared::contract::LoadWhole<M> for burn_ddp::ShardedOptimizer<O, Wrapped>
where
    O: burn::optim::Optimizer<M, Wrapped, Record = hashbrown::HashMap<burn::module::ParamId, R>>,
    M: burn::module::AutodiffModule<Wrapped>,
    R: burn::record::Record<Wrapped>,
{
    fn load_whole(self, dir: &std::path::Path) -> Result<Self, String> {
        load_whole::<_, M>(self, dir)
    }
}

impl<O, M> crate::shared::contract::LoadWhole<M>
    for burn::optim::adaptor::OptimizerAdaptor<O, M, Wrapped>
where
    O: burn::optim::SimpleOptimizer<<Wrapped as AutodiffBackend>::InnerBackend>,
    M: burn::module::AutodiffModule<Wrapped>,
{
    fn load_whole(self, dir: &std::path::Path) -> Result<Self, String> {
        load_whole::<_, M>(self, dir)
    }
}

impl<O, M> crate::shared::contract::RecordSize
    for burn::optim::adaptor::OptimizerAdaptor<O, M, Wrapped>
where
    O: burn::optim::SimpleOptimizer<<Wrapped as AutodiffBackend>::InnerBackend>,
    M: burn::module::AutodiffModule<Wrapped>,
{
    fn record_size(&self) -> (usize, usize) {
        record_size(burn::optim::Optimizer::<M, Wrapped>::to_record(self))
    }
}
