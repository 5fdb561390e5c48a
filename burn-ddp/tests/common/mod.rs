//! Burn 0.21's spelling of what both test binaries' shims share (each
//! re-exports it for the shared sources of shared-tests/): a model's
//! parameters as one flat list, and an optimizer step named without its
//! backend. Burn 0.21's modules take their backend as a type parameter, so
//! [`Params`] is implemented per model type, for every backend, by
//! [`params!`].

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{GradientsParams, Optimizer, SimpleOptimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Tensor, TensorData};

/// A model's float parameters, flattened in declaration order, and the
/// model with them replaced.
pub trait Params: Sized {
    fn flat_params(&self) -> Vec<f32>;
    fn load_params(self, values: &[f32]) -> Self;
}

/// Implements [`Params`] for model types generic over their backend (the
/// learner binary's classifier, generic over its norm too, does it by hand).
#[allow(unused_macros)]
macro_rules! params {
    ($($model:ident),* $(,)?) => {$(
        impl<B: burn::tensor::backend::Backend> $crate::common::Params for $model<B> {
            fn flat_params(&self) -> Vec<f32> {
                $crate::common::flat_params(self)
            }
            fn load_params(self, values: &[f32]) -> Self {
                $crate::common::load_params(self, values)
            }
        }
    )*};
}
#[allow(unused_imports)]
pub(crate) use params;

/// An optimizer's step on a model `M` (Burn 0.21's `Optimizer<M, B>`).
pub trait Step<M> {
    fn step(&mut self, lr: f64, model: M, grads: GradientsParams) -> M;
}

impl<O, M, B> Step<M> for OptimizerAdaptor<O, M, B>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: SimpleOptimizer<B::InnerBackend>,
{
    fn step(&mut self, lr: f64, model: M, grads: GradientsParams) -> M {
        Optimizer::step(self, lr, model, grads)
    }
}

struct Collect(Vec<f32>);

impl<B: Backend> ModuleVisitor<B> for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.0.extend(floats(param.val().into_data()));
    }
}

/// Every float parameter, flattened in declaration order.
pub fn flat_params<B: Backend, M: Module<B>>(model: &M) -> Vec<f32> {
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    collect.0
}

struct Load {
    values: Vec<f32>,
    at: usize,
}

impl<B: Backend> ModuleMapper<B> for Load {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let shape = tensor.shape();
        let n = shape.num_elements();
        let data = TensorData::new(self.values[self.at..self.at + n].to_vec(), shape);
        self.at += n;
        // Trained parameters stay trained; buffers (running statistics) stay buffers.
        let value =
            Tensor::from_data(data, &tensor.device()).set_require_grad(tensor.is_require_grad());
        Param::from_mapped_value(id, value, mapper)
    }
}

/// `model` with its float parameters replaced by `values` (as [`flat_params`] gives them).
pub fn load_params<B: Backend, M: Module<B>>(model: M, values: &[f32]) -> M {
    let mut load = Load {
        values: values.to_vec(),
        at: 0,
    };
    let model = model.map(&mut load);
    assert_eq!(load.at, values.len(), "parameter count mismatch");
    model
}

/// A tensor's values as `f32`.
pub fn floats(data: TensorData) -> Vec<f32> {
    data.to_vec::<f32>().unwrap()
}

/// A normalisation layer: Burn's BatchNorm, or burn-ddp's SyncBatchNorm
/// (which the models under test use where their single-process references
/// use Burn's).
pub trait Norm<B: Backend>: Module<B> + burn::module::ModuleDisplay {
    fn create(channels: usize, device: &B::Device) -> Self;
    fn apply<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D>;
}

impl<B: Backend> Norm<B> for burn::nn::BatchNorm<B> {
    fn create(channels: usize, device: &B::Device) -> Self {
        burn::nn::BatchNormConfig::new(channels).init(device)
    }
    fn apply<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.forward(x)
    }
}

impl<B: Backend> Norm<B> for burn_ddp::SyncBatchNorm<B> {
    fn create(channels: usize, device: &B::Device) -> Self {
        burn_ddp::sync_batch_norm::sync_batch_norm(
            &burn::nn::BatchNormConfig::new(channels),
            device,
        )
    }
    fn apply<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.forward(x)
    }
}
