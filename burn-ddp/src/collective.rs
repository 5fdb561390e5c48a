//! Collectives on Burn tensors, mirroring `torch.distributed`'s (the shared
//! `collective`: CUDA tensors over NCCL when the group uses it, found at run
//! time by the tensor's type; the others through host memory). Float and int
//! tensors of f32, f64, f16, bf16, i32 and i64 elements are supported.

pub use crate::autograd::all_reduce_sum_tracked;
use burn::tensor::{backend::Backend, BasicOps, Tensor};
pub use burn_ddp_comm::ReduceOp;
use burn_ddp_comm::{ProcessGroup, Result};

/// Reduces `tensor` over all ranks; every rank gets the result (`dist.all_reduce`).
///
/// ```no_run
/// use burn::backend::NdArray;
/// use burn::tensor::Tensor;
/// use burn_ddp::collective::ReduceOp;
///
/// # fn main() -> burn_ddp::Result<()> {
/// let group = burn_ddp::init_process_group()?;
/// let loss = Tensor::<NdArray, 1>::from_floats([0.5], &Default::default());
/// let mean = burn_ddp::collective::all_reduce(&group, loss, ReduceOp::Mean)?; // the same on every rank
/// if group.rank() == 0 {
///     println!("loss {}", mean.into_scalar());
/// }
/// # Ok(())
/// # }
/// ```
pub fn all_reduce<B: Backend, const D: usize, K: BasicOps<B> + 'static>(
    group: &ProcessGroup,
    tensor: Tensor<B, D, K>,
    op: ReduceOp,
) -> Result<Tensor<B, D, K>> {
    crate::shared::collective::all_reduce(group, tensor, op)
}

/// Copies rank `root`'s `tensor` to every rank (`dist.broadcast`).
pub fn broadcast<B: Backend, const D: usize, K: BasicOps<B> + 'static>(
    group: &ProcessGroup,
    tensor: Tensor<B, D, K>,
    root: usize,
) -> Result<Tensor<B, D, K>> {
    crate::shared::collective::broadcast(group, tensor, root)
}

/// Every rank's `tensor`, in rank order (`dist.all_gather`). All ranks must pass
/// tensors of the same shape.
pub fn all_gather<B: Backend, const D: usize, K: BasicOps<B> + 'static>(
    group: &ProcessGroup,
    tensor: Tensor<B, D, K>,
) -> Result<Vec<Tensor<B, D, K>>> {
    crate::shared::collective::all_gather(group, tensor)
}

/// Reduces `tensor` over all ranks and returns this rank's slice of the result
/// along dimension 0 (`dist.reduce_scatter_tensor`). Dimension 0 must be a
/// multiple of the world size.
pub fn reduce_scatter<B: Backend, const D: usize, K: BasicOps<B> + 'static>(
    group: &ProcessGroup,
    tensor: Tensor<B, D, K>,
    op: ReduceOp,
) -> Result<Tensor<B, D, K>> {
    crate::shared::collective::reduce_scatter(group, tensor, op)
}
