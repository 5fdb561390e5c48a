//! A sum over the ranks that autodiff goes through, for Burn 0.22: its
//! backward pass sums the gradient over the ranks the same way
//! (`torch.distributed.nn.functional.all_reduce`). A value every rank
//! computes from every rank's inputs (SyncBatchNorm's batch statistics) then
//! gets, on each rank, the gradient one process holding all the inputs would
//! give it.
//!
//! Burn 0.22 reaches a custom autodiff op through a backend extension (its
//! `extension` feature): the `Dispatch` routing is generated for the
//! backends this crate is built with (features `flex`, `ndarray`, `cuda`),
//! and the backward pass is written here, on `Autodiff<B, C>`. The forward
//! sum runs before it, where its error can be returned.

// NdArray is deprecated in Burn 0.22 (Flex replaces it), still a backend
// programs train on; the routing generated for it names it.
#![cfg_attr(feature = "ndarray", allow(deprecated))]

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{unary, Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::TensorMetadata;
use burn::backend::{
    backend_extension, Autodiff, Backend, DispatchKindConversion, DispatchTensor,
    DispatchTensorKind,
};
use burn::tensor::{Shape, Tensor};
use burn_ddp_comm::{CommError, ProcessGroup, ReduceOp, Result};

/// The sum over the ranks of a plain (untracked) tensor of backend `B`, for
/// the backward pass, through the shared collectives (NCCL for CUDA tensors
/// when the group uses it, host memory otherwise).
fn sum_over_ranks<B: Backend>(tensor: FloatTensor<B>, group: &ProcessGroup) -> FloatTensor<B>
where
    DispatchTensor: DispatchKindConversion<B>,
{
    let shape = tensor.shape();
    let flat = B::float_reshape(tensor, Shape::new([shape.num_elements()]));
    let flat = Tensor::<1>::from_primitive::<B>(flat);
    // backward() has no room for an error: it panics with the reason (naming
    // the rank), as the gradient synchronisation does.
    let summed =
        crate::shared::collective::all_reduce(group, flat, ReduceOp::Sum).unwrap_or_else(|err| {
            burn_ddp_training::failure::panic_with_message(format!(
                "the backward pass of a sum over the ranks failed: {err}"
            ))
        });
    let summed = summed
        .try_into_primitive::<B>()
        .expect("a collective returns a tensor of its input's backend");
    B::float_reshape(summed, shape)
}

/// The differentiable sum over the ranks, as a backend extension: the
/// forward sum is computed before (where its error can be returned) and
/// attached here as the output of `tensor`, whose gradient is summed over
/// the ranks.
#[cfg_attr(
    not(burn_023),
    backend_extension(
        Autodiff,
        Flex: cfg(feature = "flex"),
        NdArray: cfg(feature = "ndarray"),
        Cube: cfg(feature = "cuda")
    )
)]
// Burn 0.23 has no NdArray backend.
#[cfg_attr(
    burn_023,
    backend_extension(Autodiff, Flex: cfg(feature = "flex"), Cube: cfg(feature = "cuda"))
)]
pub(crate) trait SumOverRanks: Backend {
    /// `summed` (the sum of `tensor` over the ranks of `group`), tracked on
    /// autodiff backends as a function of `tensor`; as it is otherwise.
    // `_group`: the routing generated for a build with no backend feature ignores it.
    fn attach_sum_over_ranks(
        tensor: FloatTensor<Self>,
        summed: FloatTensor<Self>,
        _group: &ProcessGroup,
    ) -> FloatTensor<Self>;
}

/// Nothing to track on a backend without autodiff.
macro_rules! untracked {
    ($($feature:literal => $backend:ty),*) => {$(
        #[cfg(feature = $feature)]
        impl SumOverRanks for $backend {
            fn attach_sum_over_ranks(
                _: FloatTensor<Self>,
                summed: FloatTensor<Self>,
                _: &ProcessGroup,
            ) -> FloatTensor<Self> {
                summed
            }
        }
    )*};
}

untracked!(
    "flex" => burn::backend::Flex,
    "ndarray" => burn::backend::NdArray,
    "cuda" => burn::backend::Cube
);

#[derive(Debug)]
struct AllReduceSum;

impl<B: Backend> Backward<B, 1> for AllReduceSum
where
    DispatchTensor: DispatchKindConversion<B>,
{
    type State = ProcessGroup;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let group = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| {
            sum_over_ranks::<B>(grad, &group)
        });
    }
}

impl<B: Backend, C: CheckpointStrategy> SumOverRanks for Autodiff<B, C>
where
    DispatchTensor: DispatchKindConversion<B>,
{
    fn attach_sum_over_ranks(
        tensor: FloatTensor<Self>,
        summed: FloatTensor<Self>,
        group: &ProcessGroup,
    ) -> FloatTensor<Self> {
        let (_, node) = tensor.into_parts();
        let (output, _) = summed.into_parts();
        // Compute bound: never re-run in a recomputation (it is a collective).
        match AllReduceSum.prepare::<C>([node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(group.clone(), output),
            OpsKind::UnTracked(prep) => prep.finish(output),
        }
    }
}

/// Whether `tensor` lives on a backend this build routes the extension to
/// (the variants exist only for the features this crate is built with).
fn routed(tensor: &DispatchTensor) -> bool {
    let concrete = match &tensor.kind {
        DispatchTensorKind::Autodiff(inner) => &**inner,
        other => other,
    };
    #[allow(unreachable_patterns)]
    match concrete {
        #[cfg(feature = "flex")]
        DispatchTensorKind::Flex(_) => true,
        #[cfg(feature = "ndarray")]
        DispatchTensorKind::NdArray(_) => true,
        #[cfg(feature = "cuda")]
        DispatchTensorKind::Cube(_) => true,
        _ => false,
    }
}

/// `tensor` summed over the ranks of `group`, differentiably: the backward
/// pass sums its gradient over the ranks. Every rank must call it, and go
/// backward through it, in the same order.
pub fn all_reduce_sum_tracked<const D: usize>(
    group: &ProcessGroup,
    tensor: Tensor<D>,
) -> Result<Tensor<D>> {
    let device = tensor.device();
    let tensor = tensor.into_dispatch();
    // Before the collective: every rank finds the same.
    if !routed(&tensor) {
        return Err(CommError::config(
            Some(group.rank()),
            "burn-ddp-22's backend features",
            format!(
                "a sum over the ranks that autodiff goes through (SyncBatchNorm's) runs on the \
                 backends burn-ddp-22 is built for; {device:?} is not one of them: turn on \
                 burn-ddp-22's feature for it (`flex`, `ndarray` or `cuda`)"
            ),
        ));
    }
    let tensor = Tensor::<D>::from_dispatch(tensor);
    let summed =
        crate::shared::collective::all_reduce(group, tensor.clone().detach(), ReduceOp::Sum)?;
    let (tensor, summed) = (tensor.into_dispatch(), summed.into_dispatch());
    let attached =
        <burn::backend::Dispatch as SumOverRanks>::attach_sum_over_ranks(tensor, summed, group);
    Ok(Tensor::from_dispatch(attached))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;

    /// The extension routes Flex tensors, tracked and plain: in a world of
    /// one the sum is the tensor itself and the gradient passes through.
    #[test]
    fn flex_tensors_are_routed_tracked_and_plain() {
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        let device = Device::flex().autodiff();
        let x = Tensor::<1>::from_floats([1.0, 2.0], &device).require_grad();
        let w = Tensor::<1>::from_floats([3.0, 5.0], &device);
        let sum = all_reduce_sum_tracked(&group, x.clone()).unwrap();
        assert_eq!(sum.to_data().try_to_vec::<f32>().unwrap(), [1.0, 2.0]);
        let grads = (sum * w).sum().backward();
        let grad = x.grad(&grads).expect("the sum is tracked");
        assert_eq!(grad.into_data().try_to_vec::<f32>().unwrap(), [3.0, 5.0]);

        let plain = Tensor::<1>::from_floats([4.0], &Device::flex());
        let sum = all_reduce_sum_tracked(&group, plain).unwrap();
        assert_eq!(sum.into_data().try_to_vec::<f32>().unwrap(), [4.0]);
    }
}
