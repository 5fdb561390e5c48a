//! Burn 0.22's spelling of what both test binaries' shims share (each
//! re-exports it for the shared sources of shared-tests/): a model's
//! parameters as one flat list, and an optimizer step. Burn 0.22's modules
//! name no backend, so [`Params`] holds for every module.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::tensor::{Tensor, TensorData};

/// A model's float parameters, flattened in declaration order, and the
/// model with them replaced.
pub trait Params: Sized {
    fn flat_params(&self) -> Vec<f32>;
    fn load_params(self, values: &[f32]) -> Self;
}

impl<M: Module> Params for M {
    fn flat_params(&self) -> Vec<f32> {
        let mut collect = Collect(Vec::new());
        self.visit(&mut collect);
        collect.0
    }

    fn load_params(self, values: &[f32]) -> Self {
        let mut load = Load {
            values: values.to_vec(),
            at: 0,
        };
        let model = self.map(&mut load);
        assert_eq!(load.at, values.len(), "parameter count mismatch");
        model
    }
}

/// An optimizer's step on a model `M` (Burn 0.22's `ModuleOptimizer`).
pub trait Step<M> {
    fn step(&mut self, lr: f64, model: M, grads: GradientsParams) -> M;
}

impl<M: Module> Step<M> for ModuleOptimizer {
    fn step(&mut self, lr: f64, model: M, grads: GradientsParams) -> M {
        ModuleOptimizer::step(self, lr, model, grads)
    }
}

struct Collect(Vec<f32>);

impl ModuleVisitor for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.0.extend(floats(param.val().into_data()));
    }
}

struct Load {
    values: Vec<f32>,
    at: usize,
}

impl ModuleMapper for Load {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
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

/// A tensor's values as `f32`.
pub fn floats(data: TensorData) -> Vec<f32> {
    data.try_to_vec::<f32>().unwrap()
}

/// A normalisation layer: Burn's BatchNorm, or burn-ddp-22's SyncBatchNorm
/// (which the models under test use where their single-process references
/// use Burn's).
pub trait Norm: Module + burn::module::ModuleDisplay {
    fn create(channels: usize, device: &burn::tensor::Device) -> Self;
    fn apply<const D: usize>(&self, x: Tensor<D>) -> Tensor<D>;
}

impl Norm for burn::nn::BatchNorm {
    fn create(channels: usize, device: &burn::tensor::Device) -> Self {
        burn::nn::BatchNormConfig::new(channels).init(device)
    }
    fn apply<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        self.forward(x)
    }
}

impl Norm for burn_ddp_22::SyncBatchNorm {
    fn create(channels: usize, device: &burn::tensor::Device) -> Self {
        burn_ddp_22::sync_batch_norm::sync_batch_norm(
            &burn::nn::BatchNormConfig::new(channels),
            device,
        )
    }
    fn apply<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        self.forward(x)
    }
}
