//! `Ddp<B>`: an autodiff backend whose `backward()` returns gradients already
//! averaged over every rank of the process group.
//!
//! It wraps an autodiff backend (`Ddp<Autodiff<NdArray>>`, `Ddp<Autodiff<Cuda>>`)
//! and uses its tensor types unchanged, so every operation is a plain call into
//! `B` (the per-family files in `ops/`). Two things differ: leaf tensors marked
//! `require_grad` are recorded as parameters of their model
//! ([`crate::tracking`]; `inner` tells which parameter an optimizer update
//! replaces), and `backward` all-reduces each wrapped model's gradients
//! ([`crate::sync`]).

mod ops;

use crate::autograd::AutodiffCollectives;
use crate::tracking::TrackedAutodiff;
use burn_backend::backend::{AutodiffBackend, Backend, BackendTypes, ExecutionError};
use burn_backend::tensor::{BoolTensor, FloatTensor, IntTensor, QuantizedTensor};
use burn_backend::{DType, DTypeUsageSet, TensorData};
use core::marker::PhantomData;

/// Distributed Data Parallel on top of the autodiff backend `B`: any
/// autodiff backend, CPU or GPU (`Ddp<Autodiff<NdArray>>`,
/// `Ddp<Autodiff<Flex>>`, `Ddp<Autodiff<Cuda>>`, `Ddp<Autodiff<Wgpu>>`).
///
/// Without a process group (or in a world of one) it is the backend it wraps:
///
/// ```
/// use burn::backend::{Autodiff, NdArray};
/// use burn::tensor::Tensor;
///
/// type B = burn_ddp::Ddp<Autodiff<NdArray>>;
/// let device = Default::default();
/// let x = Tensor::<B, 1>::from_floats([1.0, 2.0], &device).require_grad();
/// let grads = (x.clone() * 3.0).sum().backward(); // averaged over ranks when there are several
/// assert_eq!(x.grad(&grads).unwrap().into_data().to_vec::<f32>().unwrap(), [3.0, 3.0]);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Ddp<B> {
    _backend: PhantomData<B>,
}

impl<B: TrackedAutodiff> BackendTypes for Ddp<B> {
    type Device = B::Device;
    type FloatTensorPrimitive = B::FloatTensorPrimitive;
    type FloatElem = B::FloatElem;
    type IntTensorPrimitive = B::IntTensorPrimitive;
    type IntElem = B::IntElem;
    type BoolTensorPrimitive = B::BoolTensorPrimitive;
    type BoolElem = B::BoolElem;
    type QuantizedTensorPrimitive = B::QuantizedTensorPrimitive;
}

impl<B: TrackedAutodiff> Backend for Ddp<B> {
    fn ad_enabled(device: &Self::Device) -> bool {
        B::ad_enabled(device)
    }

    fn memory_persistent_allocations<
        Output: Send,
        Input: Send,
        Func: Fn(Input) -> Output + Send,
    >(
        device: &Self::Device,
        input: Input,
        func: Func,
    ) -> Output {
        B::memory_persistent_allocations(device, input, func)
    }

    fn memory_cleanup(device: &Self::Device) {
        B::memory_cleanup(device)
    }

    fn name(device: &Self::Device) -> String {
        format!("ddp<{}>", B::name(device))
    }

    fn seed(device: &Self::Device, seed: u64) {
        B::seed(device, seed)
    }

    fn sync(device: &Self::Device) -> Result<(), ExecutionError> {
        B::sync(device)
    }

    fn staging<'a, Iter>(data: Iter, device: &Self::Device)
    where
        Iter: Iterator<Item = &'a mut TensorData>,
    {
        B::staging(data, device)
    }

    fn supports_dtype(device: &Self::Device, dtype: DType) -> bool {
        B::supports_dtype(device, dtype)
    }

    fn dtype_usage(device: &Self::Device, dtype: DType) -> DTypeUsageSet {
        B::dtype_usage(device, dtype)
    }

    fn device_count(type_id: u16) -> usize {
        B::device_count(type_id)
    }
}

/// `B`'s sum over the ranks that autodiff goes through (SyncBatchNorm's).
impl<B: TrackedAutodiff> AutodiffCollectives for Ddp<B> {
    fn all_reduce_sum_tracked(
        tensor: FloatTensor<Self>,
        group: &crate::ProcessGroup,
    ) -> crate::Result<FloatTensor<Self>> {
        B::all_reduce_sum_tracked(tensor, group)
    }
}

impl<B: TrackedAutodiff> AutodiffBackend for Ddp<B> {
    type InnerBackend = B::InnerBackend;
    type Gradients = B::Gradients;

    /// `B`'s backward, with the gradients of every wrapped model averaged over
    /// all ranks of its group, model by model (all parameters over the default
    /// group when no model was wrapped), except on a thread inside
    /// [`crate::no_sync`] or, for one model, [`crate::sync::no_sync_for`].
    /// A model whose `overlap_backward` applies (by default, over a group
    /// spanning machines) sends each bucket while backward still runs, as
    /// soon as its gradients are final.
    ///
    /// # Panics
    /// If the all-reduce fails (a rank died, timed out, or the models differ):
    /// `backward` cannot return an error, and training on unsynchronised
    /// gradients would silently diverge. The message names the rank and cause,
    /// printed as one line without Rust's panic report or a backtrace.
    fn backward(tensor: FloatTensor<Self>) -> Self::Gradients {
        let (grads, outcome) = crate::sync::backward::<B>(tensor);
        if let Err(err) = outcome {
            crate::sync::fail_backward(err);
        }
        grads
    }

    fn grad(
        tensor: &FloatTensor<Self>,
        grads: &Self::Gradients,
    ) -> Option<FloatTensor<Self::InnerBackend>> {
        B::grad(tensor, grads)
    }

    fn grad_remove(
        tensor: &FloatTensor<Self>,
        grads: &mut Self::Gradients,
    ) -> Option<FloatTensor<Self::InnerBackend>> {
        B::grad_remove(tensor, grads)
    }

    fn grad_replace(
        tensor: &FloatTensor<Self>,
        grads: &mut Self::Gradients,
        grad: FloatTensor<Self::InnerBackend>,
    ) {
        B::grad_replace(tensor, grads, grad)
    }

    fn inner(tensor: FloatTensor<Self>) -> FloatTensor<Self::InnerBackend> {
        // An optimizer replacing this parameter marks the new one next.
        crate::tracking::taking_inner::<B>(&tensor);
        B::inner(tensor)
    }

    fn int_inner(tensor: IntTensor<Self>) -> IntTensor<Self::InnerBackend> {
        B::int_inner(tensor)
    }

    fn bool_inner(tensor: BoolTensor<Self>) -> BoolTensor<Self::InnerBackend> {
        B::bool_inner(tensor)
    }

    fn q_inner(tensor: QuantizedTensor<Self>) -> QuantizedTensor<Self::InnerBackend> {
        B::q_inner(tensor)
    }

    fn from_inner(tensor: FloatTensor<Self::InnerBackend>) -> FloatTensor<Self> {
        B::from_inner(tensor)
    }

    fn int_from_inner(tensor: IntTensor<Self::InnerBackend>) -> IntTensor<Self> {
        B::int_from_inner(tensor)
    }

    fn bool_from_inner(tensor: BoolTensor<Self::InnerBackend>) -> BoolTensor<Self> {
        B::bool_from_inner(tensor)
    }

    fn q_from_inner(tensor: QuantizedTensor<Self::InnerBackend>) -> QuantizedTensor<Self> {
        B::q_from_inner(tensor)
    }
}
