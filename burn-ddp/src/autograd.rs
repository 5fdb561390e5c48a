//! Collectives that autodiff goes through: a sum over the ranks whose
//! backward pass sums the gradient over the ranks the same way
//! (`torch.distributed.nn.functional.all_reduce`). A value every rank
//! computes from every rank's inputs (SyncBatchNorm's batch statistics) then
//! gets, on each rank, the gradient one process holding all the inputs
//! would give it: each rank's output feeds every rank's loss, so the
//! gradient of its input is the sum of every rank's output gradient.

use burn::tensor::{Tensor, TensorPrimitive};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{unary, Backward, Ops, OpsKind};
use burn_autodiff::Autodiff;
use burn_backend::backend::{AutodiffBackend, Backend};
use burn_backend::tensor::FloatTensor;
use burn_backend::{Shape, TensorMetadata};
use burn_ddp_comm::{ProcessGroup, ReduceOp, Result};
use std::any::{Any, TypeId};
use std::sync::RwLock;

/// An autodiff backend with a differentiable sum over the ranks.
pub trait AutodiffCollectives: AutodiffBackend {
    /// `tensor` summed over the ranks of `group`, on every rank; its gradient
    /// is the output's gradient summed over the ranks. Every rank must call
    /// it, and run the backward pass through it, in the same order.
    fn all_reduce_sum_tracked(
        tensor: FloatTensor<Self>,
        group: &ProcessGroup,
    ) -> Result<FloatTensor<Self>>;
}

/// The sum over the ranks of an inner (non-autodiff) tensor of any rank,
/// through the shared collectives (NCCL for CUDA tensors when the group uses
/// it, host memory otherwise).
fn sum_over_ranks<B: Backend>(
    tensor: FloatTensor<B>,
    group: &ProcessGroup,
) -> Result<FloatTensor<B>> {
    let shape = tensor.shape();
    let flat = B::float_reshape(tensor, Shape::new([shape.num_elements()]));
    let flat = Tensor::<B, 1>::from_primitive(TensorPrimitive::Float(flat));
    let summed = crate::shared::collective::all_reduce(group, flat, ReduceOp::Sum)?;
    Ok(B::float_reshape(summed.into_primitive().tensor(), shape))
}

#[derive(Debug)]
struct AllReduceSum;

impl<B: Backend> Backward<B, 1> for AllReduceSum {
    type State = ProcessGroup;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let group = ops.state;
        unary::<B, _>(ops.parents, ops.node, grads, |grad| {
            // backward() cannot return an error: it panics with the reason,
            // as the gradient synchronisation does.
            sum_over_ranks::<B>(grad, &group).unwrap_or_else(|err| {
                burn_ddp_training::failure::panic_with_message(format!(
                    "the backward pass of a sum over the ranks failed: {err}"
                ))
            })
        });
    }
}

impl<B: Backend, C: CheckpointStrategy> AutodiffCollectives for Autodiff<B, C> {
    fn all_reduce_sum_tracked(
        tensor: FloatTensor<Self>,
        group: &ProcessGroup,
    ) -> Result<FloatTensor<Self>> {
        let output = sum_over_ranks::<B>(tensor.primitive.clone(), group)?;
        // Compute bound: never re-run in a recomputation (it is a collective).
        Ok(
            match AllReduceSum
                .prepare::<C>([tensor.node.clone()])
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => {
                    // Its backward runs a collective: no bucket may leave early.
                    crate::overlap::armed::note_collective();
                    prep.finish(group.clone(), output)
                }
                OpsKind::UnTracked(prep) => prep.finish(output),
            },
        )
    }
}

/// `tensor` summed over the ranks of `group`, differentiably: the backward
/// pass sums its gradient over the ranks (see the module documentation).
/// Every rank must call it, and go backward through it, in the same order.
pub fn all_reduce_sum_tracked<B: AutodiffCollectives, const D: usize>(
    group: &ProcessGroup,
    tensor: Tensor<B, D>,
) -> Result<Tensor<B, D>> {
    let primitive = tensor.into_primitive().tensor();
    let summed = B::all_reduce_sum_tracked(primitive, group)?;
    Ok(Tensor::from_primitive(TensorPrimitive::Float(summed)))
}

/// A backend's tracked sum behind type erasure, for code generic over any
/// `Backend` (a `SyncBatchNorm<B>` cannot name `AutodiffCollectives`).
type ErasedSum = fn(Box<dyn Any>, &ProcessGroup) -> Result<Box<dyn Any>>;

/// The tracked sum of each autodiff backend seen so far, by type: facts
/// about types, registered by `Ddp<B>` as its parameters are marked.
static TRACKED_SUMS: RwLock<Vec<(TypeId, ErasedSum)>> = RwLock::new(Vec::new());

fn erased_sum<B: AutodiffCollectives>(
    tensor: Box<dyn Any>,
    group: &ProcessGroup,
) -> Result<Box<dyn Any>> {
    let tensor = *tensor
        .downcast::<FloatTensor<B>>()
        .expect("registered under its own type");
    B::all_reduce_sum_tracked(tensor, group).map(|sum| Box::new(sum) as Box<dyn Any>)
}

/// Makes `B`'s tracked sum reachable from layers generic over any backend
/// (SyncBatchNorm). `Ddp<..>` does it itself; a program training on a plain
/// `Autodiff<..>` backend (the Learner, a loop with `sync_gradients`) calls
/// it once, with its concrete backend, before the first training forward
/// pass. (Burn 0.21's programs are generic over `B: AutodiffBackend`, which
/// cannot name this op: only the program knows the concrete type.)
pub fn enable_sync_batch_norm<B: AutodiffCollectives>() {
    register::<B>()
}

fn register<B: AutodiffCollectives>() {
    let id = TypeId::of::<B>();
    let known = |sums: &Vec<(TypeId, ErasedSum)>| sums.iter().any(|(t, _)| *t == id);
    if known(&TRACKED_SUMS.read().unwrap_or_else(|e| e.into_inner())) {
        return;
    }
    let mut sums = TRACKED_SUMS.write().unwrap_or_else(|e| e.into_inner());
    if !known(&sums) {
        sums.push((id, erased_sum::<B>));
    }
}

/// `tensor` summed over the ranks through `B`'s tracked sum, for a backend
/// known only as `Backend`; `None` when `B` registered none (not `Ddp<..>`).
pub(crate) fn tracked_sum_of<B: burn::tensor::backend::Backend>(
    group: &ProcessGroup,
    tensor: Tensor<B, 1>,
) -> Option<Result<Tensor<B, 1>>> {
    let id = TypeId::of::<B>();
    let sum = TRACKED_SUMS
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find_map(|(t, sum)| (*t == id).then_some(*sum))?;
    let primitive: Box<dyn Any> = Box::new(tensor.into_primitive().tensor());
    Some(sum(primitive, group).map(|summed| {
        let summed = *summed
            .downcast::<FloatTensor<B>>()
            .expect("the registered sum returns its own type");
        Tensor::from_primitive(TensorPrimitive::Float(summed))
    }))
}
