//! Burn 0.22's spelling of what the shared sources (`shared/`, written once
//! for both front-ends) need: a `TensorData`'s type, the module walks (Burn
//! 0.22's `ModuleVisitor` and `ModuleMapper` have no backend parameter), the
//! flattened gradient and collective tensor types. burn-ddp's shim says the
//! same for Burn 0.21.

use crate::collective::CollectiveKind;
use crate::shared::contract::{
    CollectiveTensor, EachGrad, ElementType, FlatGrad, GradParam, Kind, Retrain, Rewrite,
    TensorFacts, TensorOp, Visit,
};
use crate::shared::walk::Held;
use crate::{CommError, ProcessGroup, Result};
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::kind::Basic;
use burn::tensor::{Bool, DType, Device, Int, Tensor, TensorData};
use burn_ddp_comm::Placement;

impl ElementType for TensorData {
    fn element_type(&self) -> DType {
        TensorData::dtype(self)
    }
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
pub(crate) fn grad_walker<M: Module>(model: &M) -> impl Fn(EachGrad<'_, Tensor<1>>) + '_ {
    move |each| model.visit(&mut GradWalk(each))
}

impl<const D: usize, K: Basic> TensorFacts for Tensor<D, K> {
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

impl<const D: usize> Retrain for Tensor<D> {
    fn retrain(self) -> Self {
        self.require_grad()
    }
}

impl<const D: usize> Retrain for Tensor<D, Int> {
    fn retrain(self) -> Self {
        self
    }
}

/// A float parameter as the shared walks see it.
fn float<const D: usize>(id: ParamId, tensor: Tensor<D>) -> Held<Tensor<D>> {
    let (trained, autodiff) = (tensor.is_require_grad(), tensor.is_autodiff());
    Held::float(id.val(), tensor, trained, autodiff)
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
        self.0.param(&float(param.id, param.val()));
    }
    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<D, Int>>) {
        self.0
            .param(&Held::other(Kind::Int, param.id.val(), param.val()));
    }
    fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<D, Bool>>) {
        self.0
            .param(&Held::other(Kind::Bool, param.id.val(), param.val()));
    }
}

struct Map<'a>(&'a mut dyn Rewrite);

impl ModuleMapper for Map<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        let mut held = float(id, tensor);
        self.0.param(&mut held);
        Param::from_mapped_value(id, held.tensor.expect("a tensor"), mapper)
    }

    fn map_int<const D: usize>(&mut self, param: Param<Tensor<D, Int>>) -> Param<Tensor<D, Int>> {
        let (id, tensor, mapper) = param.consume();
        let mut held = Held::other(Kind::Int, id.val(), tensor);
        self.0.param(&mut held);
        Param::from_mapped_value(id, held.tensor.expect("a tensor"), mapper)
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
    fn value(&self) -> Tensor<1> {
        let numel = self.value.dims().iter().product::<usize>();
        self.value.clone().inner().reshape([numel])
    }
}

/// `model` with each trainable parameter whose entry in `values` (in
/// [`grad_walker`]'s order) is `Some` replaced by that value, still trained.
pub(crate) fn install_values<M: Module>(model: M, values: Vec<Option<Tensor<1>>>) -> M {
    if values.iter().all(Option::is_none) {
        return model;
    }
    model.map(&mut Install(values.into_iter()))
}

struct Install(std::vec::IntoIter<Option<Tensor<1>>>);

impl ModuleMapper for Install {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        if !tensor.is_require_grad() {
            return Param::from_mapped_value(id, tensor, mapper);
        }
        let tensor = match self.0.next().flatten() {
            Some(value) => {
                let dims: [usize; D] = tensor.dims();
                Tensor::from_inner(value.reshape(dims)).require_grad()
            }
            None => tensor,
        };
        Param::from_mapped_value(id, tensor, mapper)
    }
}

struct GradWalk<'a>(EachGrad<'a, Tensor<1>>);

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

/// A logged metric entry in burn-ddp-training's terms (Burn 0.22 logs
/// per-iteration values and, at the end of a split, a metric's final one).
#[cfg(feature = "train")]
impl crate::shared::contract::FigureEntry for Option<burn::train::metric::NumericEntry> {
    fn figure(&self) -> Option<burn_ddp_training::learner::figures::Entry> {
        use burn::train::metric::NumericEntry;
        use burn_ddp_training::learner::figures::Entry;
        Some(match self.as_ref()? {
            NumericEntry::Value(value) => Entry::Iteration {
                sum: *value,
                count: 1,
            },
            NumericEntry::Aggregated {
                aggregated_value,
                count,
            } => Entry::Iteration {
                sum: aggregated_value * *count as f64,
                count: *count as u64,
            },
            NumericEntry::Final(value) => Entry::Final(*value),
        })
    }
}
