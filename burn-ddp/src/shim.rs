//! Burn 0.21's spelling of what the shared sources (`shared/`, written once
//! for both front-ends) need: a `TensorData`'s type, the module walks (Burn
//! 0.21's `ModuleVisitor` and `ModuleMapper` take the backend as a type
//! parameter), the flattened gradient and collective tensor types.
//! burn-ddp-22's shim says the same for Burn 0.22.

use crate::shared::collective::{CollectiveTensor, TensorOp};
use crate::shared::gradients::FlatGrad;
use crate::shared::sync::GradParam;
use crate::shared::walk::{Kind, ParamSlot, ParamView, Rewrite, Visit};
use crate::{CommError, ProcessGroup, Result};
use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{BasicOps, Bool, DType, Int, Tensor, TensorData, TensorPrimitive};
use burn_backend::tensor::FloatTensor;
use burn_ddp_comm::Placement;

/// The element type of `data`.
pub(crate) fn dtype_of(data: &TensorData) -> DType {
    data.dtype
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
) -> impl Fn(&mut dyn FnMut(&dyn GradParam<Grad<B>>)) + '_ {
    move |each| model.visit(&mut GradWalk::<B>(each))
}

/// A parameter's facts, read once, and its tensor.
struct View<T> {
    kind: Kind,
    id: u64,
    dims: Vec<usize>,
    dtype: DType,
    require_grad: bool,
    autodiff: bool,
    tensor: Option<T>,
}

impl<B: Backend, const D: usize, K: BasicOps<B>> View<Tensor<B, D, K>> {
    fn new(
        kind: Kind,
        id: ParamId,
        tensor: Tensor<B, D, K>,
        trained: Option<&Tensor<B, D>>,
    ) -> Self {
        Self {
            kind,
            id: id.val(),
            dims: tensor.dims().to_vec(),
            dtype: tensor.dtype(),
            require_grad: trained.is_some_and(Tensor::is_require_grad),
            autodiff: trained.is_some_and(|t| B::ad_enabled(&t.device())),
            tensor: Some(tensor),
        }
    }
}

impl<B: Backend, const D: usize, K: BasicOps<B>> ParamView for View<Tensor<B, D, K>> {
    fn kind(&self) -> Kind {
        self.kind
    }
    fn id(&self) -> u64 {
        self.id
    }
    fn dims(&self) -> Vec<usize> {
        self.dims.clone()
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn require_grad(&self) -> bool {
        self.require_grad
    }
    fn autodiff(&self) -> bool {
        self.autodiff
    }
    fn data(&self) -> TensorData {
        self.tensor
            .clone()
            .expect("a parameter's tensor")
            .into_data()
    }
}

impl<B: Backend, const D: usize> ParamSlot for View<Tensor<B, D>> {
    fn broadcast(&mut self, group: &ProcessGroup, root: usize) -> Result<()> {
        let tensor = self.tensor.take().expect("a parameter's tensor");
        let result = crate::broadcast(group, tensor.clone(), root);
        self.tensor = Some(match &result {
            Ok(value) if self.require_grad => value.clone().require_grad(),
            Ok(value) => value.clone(),
            Err(_) => tensor, // the module is dropped with the error
        });
        result.map(drop)
    }
}

impl<B: Backend, const D: usize> ParamSlot for View<Tensor<B, D, Int>> {
    fn broadcast(&mut self, group: &ProcessGroup, root: usize) -> Result<()> {
        let tensor = self.tensor.take().expect("a parameter's tensor");
        let result = crate::broadcast(group, tensor.clone(), root);
        self.tensor = Some(result.as_ref().map_or(tensor, Clone::clone));
        result.map(drop)
    }
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
        let value = param.val();
        self.0.param(&View::new(
            Kind::Float,
            param.id,
            value.clone(),
            Some(&value),
        ));
    }
    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
        self.0
            .param(&View::new(Kind::Int, param.id, param.val(), None));
    }
    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
        self.0
            .param(&View::new(Kind::Bool, param.id, param.val(), None));
    }
}

struct Map<'a>(&'a mut dyn Rewrite);

impl<B: Backend> ModuleMapper<B> for Map<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let trained = tensor.clone();
        let mut slot = View::new(Kind::Float, id, tensor, Some(&trained));
        self.0.param(&mut slot);
        Param::from_mapped_value(id, slot.tensor.expect("a tensor"), mapper)
    }

    fn map_int<const D: usize>(
        &mut self,
        param: Param<Tensor<B, D, Int>>,
    ) -> Param<Tensor<B, D, Int>> {
        let (id, tensor, mapper) = param.consume();
        let mut slot = View::new(Kind::Int, id, tensor, None);
        self.0.param(&mut slot);
        Param::from_mapped_value(id, slot.tensor.expect("a tensor"), mapper)
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
}

struct GradWalk<'a, B: AutodiffBackend>(&'a mut dyn FnMut(&dyn GradParam<Grad<B>>));

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
