//! Burn 0.21's spelling of what the shared sources (`shared/`, written once
//! for both front-ends) need: a `TensorData`'s type, the module walks (Burn
//! 0.21's `ModuleVisitor` and `ModuleMapper` take the backend as a type
//! parameter), the flattened gradient and collective tensor types.
//! burn-ddp-22's shim says the same for Burn 0.22.

use crate::shared::contract::{
    CollectiveTensor, EachGrad, ElementType, FlatGrad, GradParam, Kind, Retrain, Rewrite,
    TensorFacts, TensorOp, Visit,
};
use crate::shared::walk::Held;
use crate::{CommError, ProcessGroup, Result};
use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{BasicOps, Bool, DType, Int, Tensor, TensorData, TensorPrimitive};
use burn_backend::tensor::FloatTensor;
use burn_ddp_comm::Placement;

impl ElementType for TensorData {
    fn element_type(&self) -> DType {
        self.dtype
    }
}

/// `model`'s read-only walk.
pub(crate) fn walker<B: Backend, M: Module<B>>(model: &M) -> impl Fn(&mut dyn Visit) + '_ {
    move |visit| model.visit(&mut Walk(visit))
}

/// `model` rewritten by `rewrite`.
pub(crate) fn rewrite<B: Backend, M: Module<B>>(model: M, rewrite: &mut dyn Rewrite) -> M {
    model.map(&mut Map(rewrite))
}

/// A flattened gradient of autodiff backend `B`: a tensor of its inner backend.
pub(crate) type Grad<B> = Tensor<<B as AutodiffBackend>::InnerBackend, 1>;

/// The walk of `model`'s trainable parameters, with their gradients.
pub(crate) fn grad_walker<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
) -> impl Fn(EachGrad<'_, Grad<B>>) + '_ {
    move |each| model.visit(&mut GradWalk::<B>(each))
}

impl<B: Backend, const D: usize, K: BasicOps<B>> TensorFacts for Tensor<B, D, K> {
    fn dims(&self) -> Vec<usize> {
        Tensor::dims(self).to_vec()
    }
    fn dtype(&self) -> DType {
        Tensor::dtype(self)
    }
    fn into_data(self) -> TensorData {
        Tensor::into_data(self)
    }
}

impl<B: Backend, const D: usize> Retrain for Tensor<B, D> {
    fn retrain(self) -> Self {
        self.require_grad()
    }
}

impl<B: Backend, const D: usize> Retrain for Tensor<B, D, Int> {
    fn retrain(self) -> Self {
        self
    }
}

/// A float parameter as the shared walks see it.
fn float<B: Backend, const D: usize>(id: ParamId, tensor: Tensor<B, D>) -> Held<Tensor<B, D>> {
    let (trained, autodiff) = (tensor.is_require_grad(), B::ad_enabled(&tensor.device()));
    Held::float(id.val(), tensor, trained, autodiff)
}

struct Walk<'a>(&'a mut dyn Visit);

impl<B: Backend> ModuleVisitor<B> for Walk<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.0.enter_module(name);
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.0.exit_module();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.0.param(&float(param.id, param.val()));
    }
    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
        self.0
            .param(&Held::other(Kind::Int, param.id.val(), param.val()));
    }
    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
        self.0
            .param(&Held::other(Kind::Bool, param.id.val(), param.val()));
    }
}

struct Map<'a>(&'a mut dyn Rewrite);

impl<B: Backend> ModuleMapper<B> for Map<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let mut held = float(id, tensor);
        self.0.param(&mut held);
        Param::from_mapped_value(id, held.tensor.expect("a tensor"), mapper)
    }

    fn map_int<const D: usize>(
        &mut self,
        param: Param<Tensor<B, D, Int>>,
    ) -> Param<Tensor<B, D, Int>> {
        let (id, tensor, mapper) = param.consume();
        let mut held = Held::other(Kind::Int, id.val(), tensor);
        self.0.param(&mut held);
        Param::from_mapped_value(id, held.tensor.expect("a tensor"), mapper)
    }
}

/// A trainable parameter, for a gradient synchronisation.
struct Trainable<B: AutodiffBackend, const D: usize> {
    id: ParamId,
    value: Tensor<B, D>,
}

impl<B: AutodiffBackend, const D: usize> GradParam<Grad<B>> for Trainable<B, D> {
    fn id(&self) -> u64 {
        self.id.val()
    }
    fn dims(&self) -> Vec<usize> {
        self.value.dims().to_vec()
    }
    fn dtype(&self) -> DType {
        self.value.dtype()
    }
    fn grad_device(&self) -> burn::tensor::Device<B::InnerBackend> {
        self.value.device()
    }
    fn take_grad(&self, grads: &mut GradientsParams) -> Option<Grad<B>> {
        let numel = self.value.dims().iter().product::<usize>();
        grads
            .remove::<B::InnerBackend, D>(self.id)
            .map(|grad| grad.reshape([numel]))
    }
    fn put_grad(&self, grads: &mut GradientsParams, grad: Grad<B>) {
        let dims: [usize; D] = self.value.dims();
        grads.register::<B::InnerBackend, D>(self.id, grad.reshape(dims));
    }
    fn value(&self) -> Grad<B> {
        let numel = self.value.dims().iter().product::<usize>();
        self.value.clone().inner().reshape([numel])
    }
}

/// `model` with each trainable parameter whose entry in `values` (in
/// [`grad_walker`]'s order) is `Some` replaced by that value, still trained.
///
/// Every trainable parameter is marked anew, in declaration order (the
/// others keep their data): `Ddp<B>` keeps a model's parameters in the order
/// they were marked, and the inner optimizer marked only this rank's own,
/// so without it each rank would list them in another order.
pub(crate) fn install_values<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: M,
    values: Vec<Option<Grad<B>>>,
) -> M {
    if values.is_empty() {
        return model;
    }
    model.map(&mut Install::<B>(values.into_iter()))
}

struct Install<B: AutodiffBackend>(std::vec::IntoIter<Option<Grad<B>>>);

impl<B: AutodiffBackend> ModuleMapper<B> for Install<B> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        if !tensor.is_require_grad() {
            return Param::from_mapped_value(id, tensor, mapper);
        }
        let dims: [usize; D] = tensor.dims();
        let inner = match self.0.next().flatten() {
            Some(value) => value.reshape(dims),
            None => tensor.inner(),
        };
        Param::from_mapped_value(id, Tensor::from_inner(inner).require_grad(), mapper)
    }
}

/// Gradients computed on several devices (Burn's `step_multi`) as one set,
/// each on its parameter's device.
pub(crate) fn merge_multi<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
    multi: burn::optim::MultiGradientsParams,
) -> GradientsParams {
    let mut merge = Merge::<B> {
        multi,
        grads: GradientsParams::new(),
        _backend: std::marker::PhantomData,
    };
    model.visit(&mut merge);
    merge.grads
}

struct Merge<B> {
    multi: burn::optim::MultiGradientsParams,
    grads: GradientsParams,
    _backend: std::marker::PhantomData<B>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for Merge<B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let device = param.val().device();
        if let Some((grad, _)) = self.multi.remove::<B::InnerBackend, D>(param.id) {
            self.grads
                .register::<B::InnerBackend, D>(param.id, grad.to_device(&device));
        }
    }
}

struct GradWalk<'a, B: AutodiffBackend>(EachGrad<'a, Grad<B>>);

impl<B: AutodiffBackend> ModuleVisitor<B> for GradWalk<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        if value.is_require_grad() {
            (self.0)(&Trainable {
                id: param.id,
                value,
            });
        }
    }
}

impl<I: Backend> FlatGrad for Tensor<I, 1> {
    type Device = I::Device;

    fn placement(device: &I::Device) -> Placement {
        crate::device::placement::<I>(device)
    }
    fn nccl_refused(group: &ProcessGroup, _device: &I::Device) -> CommError {
        crate::device::nccl_refused::<FloatTensor<I>>(group)
    }
    fn into_data(self) -> TensorData {
        Tensor::into_data(self)
    }
    fn from_data(data: TensorData, device: &I::Device, dtype: DType) -> Self {
        Tensor::from_data(data, (device, dtype))
    }
    fn sum_of_squares(grads: &[&Self]) -> f64 {
        // Halves squared in f32: a square past 65504 is infinite in f16.
        let total = grads
            .iter()
            .map(|&grad| {
                let x = match Tensor::dtype(grad) {
                    DType::F64 => grad.clone(),
                    _ => grad.clone().cast(burn::tensor::FloatDType::F32),
                };
                (x.clone() * x).sum().cast(burn::tensor::FloatDType::F32)
            })
            .reduce(|a, b| a + b);
        // Read as the total's own dtype, not the backend's element type.
        total.map_or(0.0, |total| {
            let data = total.into_data();
            let value = data.iter::<f64>().next().unwrap_or(0.0);
            value
        })
    }
    fn scaled(self, factor: f64) -> Self {
        self.mul_scalar(factor)
    }
    #[cfg(feature = "cuda")]
    fn dtype(&self) -> DType {
        Tensor::dtype(self)
    }
    #[cfg(feature = "cuda")]
    fn zeros(numel: usize, device: &I::Device, dtype: DType) -> Self {
        Tensor::zeros([numel], (device, dtype))
    }
    #[cfg(feature = "cuda")]
    fn cat(parts: Vec<Self>) -> Self {
        Tensor::cat(parts, 0)
    }
    #[cfg(feature = "cuda")]
    fn narrow(&self, offset: usize, len: usize) -> Self {
        self.clone().narrow(0, offset, len)
    }
    #[cfg(feature = "cuda")]
    fn pack(
        rank: usize,
        bucket: Self,
        _wire: burn_ddp_comm::DType,
    ) -> Result<burn_ddp_comm::DeviceBucket> {
        crate::device::cuda::pack::<I>(rank, bucket.into_primitive().tensor())
    }
    #[cfg(feature = "cuda")]
    fn unpack(bucket: burn_ddp_comm::DeviceBucket) -> Self {
        Tensor::from_primitive(TensorPrimitive::Float(crate::device::cuda::unpack::<I>(
            bucket,
        )))
    }
}

/// A flattened gradient of the decorator's backward pass (a primitive of
/// the inner backend, as `Gradients` holds it).
pub(crate) fn flat_grad<I: Backend>(grad: FloatTensor<I>, numel: usize) -> Tensor<I, 1> {
    Tensor::<I, 1>::from_primitive(TensorPrimitive::Float(grad)).reshape([numel])
}

/// An averaged flat gradient in its parameter's `shape`, as `Gradients` holds it.
pub(crate) fn shaped_grad<I: Backend>(grad: Tensor<I, 1>, shape: &[usize]) -> FloatTensor<I> {
    I::float_reshape(grad.into_primitive().tensor(), shape.to_vec().into())
}

impl<B: Backend, const D: usize, K: BasicOps<B> + 'static> CollectiveTensor for Tensor<B, D, K> {
    type Device = B::Device;

    fn device(&self) -> B::Device {
        Tensor::device(self)
    }
    fn dims(&self) -> Vec<usize> {
        Tensor::dims(self).to_vec()
    }
    fn into_data(self) -> TensorData {
        Tensor::into_data(self)
    }
    fn from_data(data: TensorData, device: &B::Device) -> Self {
        // `from_data` alone would take the device's default type.
        let dtype = data.dtype;
        Tensor::from_data(data, (device, dtype))
    }
    fn narrow_rows(&self, start: usize, len: usize) -> Self {
        self.clone().narrow(0, start, len)
    }
    fn on_device(
        self,
        group: &ProcessGroup,
        op: TensorOp,
    ) -> Result<std::result::Result<Self, Self>> {
        crate::device::tensor_collective(group, self, op)
    }
}

/// The tests' CPU backend.
#[cfg(test)]
type TestBackend = burn::backend::NdArray;

/// The tests' CPU device.
#[cfg(test)]
pub(crate) fn test_device() -> burn::tensor::Device<TestBackend> {
    Default::default()
}

/// The tests' flattened gradient type.
#[cfg(test)]
pub(crate) type TestGrad = Tensor<TestBackend, 1>;

/// A tensor of `values` on the tests' device.
#[cfg(test)]
pub(crate) fn test_tensor(values: Vec<f32>) -> Tensor<TestBackend, 1> {
    let len = values.len();
    Tensor::from_data(TensorData::new(values, [len]), &test_device())
}

/// A logged metric entry in burn-ddp-training's terms (Burn 0.21 logs
/// per-iteration values only).
#[cfg(feature = "train")]
impl crate::shared::contract::FigureEntry for burn::train::metric::NumericEntry {
    fn figure(&self) -> Option<burn_ddp_training::learner::figures::Entry> {
        use burn::train::metric::NumericEntry;
        use burn_ddp_training::learner::figures::Entry;
        Some(match *self {
            NumericEntry::Value(value) => Entry::Iteration {
                sum: value,
                count: 1,
            },
            NumericEntry::Aggregated {
                aggregated_value,
                count,
            } => Entry::Iteration {
                sum: aggregated_value * count as f64,
                count: count as u64,
            },
        })
    }
}
