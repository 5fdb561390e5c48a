//! Burn 0.22's spelling of what the shared sources (`shared/`, written once
//! for both front-ends) need: a `TensorData`'s type, the module walks (Burn
//! 0.22's `ModuleVisitor` and `ModuleMapper` have no backend parameter), the
//! flattened gradient and collective tensor types. burn-ddp's shim says the
//! same for Burn 0.21.

use crate::collective::CollectiveKind;
use crate::shared::collective::{CollectiveTensor, TensorOp};
use crate::shared::gradients::FlatGrad;
use crate::shared::sync::GradParam;
use crate::shared::walk::{Kind, ParamSlot, ParamView, Rewrite, Visit};
use crate::{CommError, ProcessGroup, Result};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::kind::Basic;
use burn::tensor::{Bool, DType, Device, Int, Tensor, TensorData};
use burn_ddp_comm::Placement;

/// The element type of `data`.
pub(crate) fn dtype_of(data: &TensorData) -> DType {
    data.dtype()
}

/// `model`'s read-only walk.
pub(crate) fn walker<M: Module>(model: &M) -> impl Fn(&mut dyn Visit) + '_ {
    move |visit| model.visit(&mut Walk(visit))
}

/// `model` rewritten by `rewrite`.
pub(crate) fn rewrite<M: Module>(model: M, rewrite: &mut dyn Rewrite) -> M {
    model.map(&mut Map(rewrite))
}

/// The walk of `model`'s trainable parameters, with their gradients.
pub(crate) fn grad_walker<M: Module>(
    model: &M,
) -> impl Fn(&mut dyn FnMut(&dyn GradParam<Tensor<1>>)) + '_ {
    move |each| model.visit(&mut GradWalk(each))
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

impl<const D: usize, K: Basic> View<Tensor<D, K>> {
    fn new(kind: Kind, id: ParamId, tensor: Tensor<D, K>, trained: Option<&Tensor<D>>) -> Self {
        Self {
            kind,
            id: id.val(),
            dims: tensor.dims().to_vec(),
            dtype: tensor.dtype(),
            require_grad: trained.is_some_and(Tensor::is_require_grad),
            autodiff: trained.is_some_and(Tensor::is_autodiff),
            tensor: Some(tensor),
        }
    }
}

impl<const D: usize, K: Basic> ParamView for View<Tensor<D, K>> {
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

impl<const D: usize> ParamSlot for View<Tensor<D>> {
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

impl<const D: usize> ParamSlot for View<Tensor<D, Int>> {
    fn broadcast(&mut self, group: &ProcessGroup, root: usize) -> Result<()> {
        let tensor = self.tensor.take().expect("a parameter's tensor");
        let result = crate::broadcast(group, tensor.clone(), root);
        self.tensor = Some(result.as_ref().map_or(tensor, Clone::clone));
        result.map(drop)
    }
}

struct Walk<'a>(&'a mut dyn Visit);

impl ModuleVisitor for Walk<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.0.enter_module(name);
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.0.exit_module();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let value = param.val();
        self.0.param(&View::new(
            Kind::Float,
            param.id,
            value.clone(),
            Some(&value),
        ));
    }
    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<D, Int>>) {
        self.0
            .param(&View::new(Kind::Int, param.id, param.val(), None));
    }
    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<D, Bool>>) {
        self.0
            .param(&View::new(Kind::Bool, param.id, param.val(), None));
    }
}

struct Map<'a>(&'a mut dyn Rewrite);

impl ModuleMapper for Map<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        let trained = tensor.clone();
        let mut slot = View::new(Kind::Float, id, tensor, Some(&trained));
        self.0.param(&mut slot);
        Param::from_mapped_value(id, slot.tensor.expect("a tensor"), mapper)
    }

    fn map_int<const D: usize>(&mut self, param: Param<Tensor<D, Int>>) -> Param<Tensor<D, Int>> {
        let (id, tensor, mapper) = param.consume();
        let mut slot = View::new(Kind::Int, id, tensor, None);
        self.0.param(&mut slot);
        Param::from_mapped_value(id, slot.tensor.expect("a tensor"), mapper)
    }
}

/// A trainable parameter, for a gradient synchronisation.
struct Trainable<const D: usize> {
    id: ParamId,
    value: Tensor<D>,
}

impl<const D: usize> GradParam<Tensor<1>> for Trainable<D> {
    fn id(&self) -> u64 {
        self.id.val()
    }
    fn dims(&self) -> Vec<usize> {
        self.value.dims().to_vec()
    }
    fn dtype(&self) -> DType {
        self.value.dtype()
    }
    fn grad_device(&self) -> Device {
        self.value.device().inner()
    }
    fn take_grad(&self, grads: &mut GradientsParams) -> Option<Tensor<1>> {
        let numel = self.value.dims().iter().product::<usize>();
        grads.remove::<D>(self.id).map(|g| g.reshape([numel]))
    }
    fn put_grad(&self, grads: &mut GradientsParams, grad: Tensor<1>) {
        let dims: [usize; D] = self.value.dims();
        grads.register::<D>(self.id, grad.reshape(dims));
    }
}

struct GradWalk<'a>(&'a mut dyn FnMut(&dyn GradParam<Tensor<1>>));

impl ModuleVisitor for GradWalk<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let value = param.val();
        if value.is_require_grad() {
            (self.0)(&Trainable {
                id: param.id,
                value,
            });
        }
    }
}

impl FlatGrad for Tensor<1> {
    type Device = Device;

    fn placement(device: &Device) -> Placement {
        crate::device::placement(device)
    }
    fn nccl_refused(group: &ProcessGroup, device: &Device) -> CommError {
        crate::device::nccl_refused(group, "the gradients are", device)
    }
    fn into_data(self) -> TensorData {
        Tensor::into_data(self)
    }
    fn from_data(data: TensorData, device: &Device, dtype: DType) -> Self {
        Tensor::from_data(data, (device, dtype))
    }
    #[cfg(feature = "cuda")]
    fn dtype(&self) -> DType {
        Tensor::dtype(self)
    }
    #[cfg(feature = "cuda")]
    fn zeros(numel: usize, device: &Device, dtype: DType) -> Self {
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
        wire: burn_ddp_comm::DType,
    ) -> Result<burn_ddp_comm::DeviceBucket> {
        crate::device::cuda::pack(rank, bucket, wire)
    }
    #[cfg(feature = "cuda")]
    fn unpack(bucket: burn_ddp_comm::DeviceBucket) -> Self {
        crate::device::cuda::unpack(bucket)
    }
}

impl<const D: usize, K: CollectiveKind> CollectiveTensor for Tensor<D, K> {
    type Device = Device;

    fn device(&self) -> Device {
        Tensor::device(self)
    }
    fn dims(&self) -> Vec<usize> {
        Tensor::dims(self).to_vec()
    }
    fn into_data(self) -> TensorData {
        Tensor::into_data(self)
    }
    fn from_data(data: TensorData, device: &Device) -> Self {
        // `from_data` alone would take the device's default type.
        let dtype = data.dtype();
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

/// The tests' CPU device.
#[cfg(test)]
pub(crate) fn test_device() -> Device {
    Device::flex()
}

/// The tests' flattened gradient type.
#[cfg(test)]
pub(crate) type TestGrad = Tensor<1>;

/// A tensor of `values` on the tests' device.
#[cfg(test)]
pub(crate) fn test_tensor(values: Vec<f32>) -> Tensor<1> {
    let len = values.len();
    Tensor::from_data(TensorData::new(values, [len]), &test_device())
}
