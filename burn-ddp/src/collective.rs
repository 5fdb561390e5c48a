//! Collectives on Burn tensors, mirroring `torch.distributed`'s.
//!
//! CUDA tensors go over NCCL on the GPU when the group uses it
//! ([`crate::device`]); every other tensor takes a host round trip (`into_data`,
//! the host transports, `from_data`). Float and int tensors of f32, f64, f16,
//! bf16, i32 and i64 elements are supported (f16 and bf16 combine in f32 and
//! round once per step, as NCCL's native half reductions do).

use crate::device::{tensor_collective, TensorOp};
use crate::dtype::with_elements;
use crate::{CommError, ProcessGroup, ReduceOp, Result};
use burn::tensor::{backend::Backend, BasicOps, Tensor, TensorData};

/// A tensor of `data`'s own element type: `Tensor::from_data` alone would take
/// the device's default (an f16 or f64 tensor would come back as f32).
fn same_dtype<B: Backend, const D: usize, K: BasicOps<B>>(
    data: TensorData,
    device: &B::Device,
) -> Tensor<B, D, K> {
    let dtype = data.dtype;
    Tensor::from_data(data, (device, dtype))
}

/// Reduces `tensor` over all ranks; every rank gets the result (`dist.all_reduce`).
///
/// ```no_run
/// use burn::backend::NdArray;
/// use burn::tensor::Tensor;
/// use burn_ddp::ReduceOp;
///
/// # fn main() -> burn_ddp::Result<()> {
/// let group = burn_ddp::init_process_group()?;
/// let loss = Tensor::<NdArray, 1>::from_floats([0.5], &Default::default());
/// let mean = burn_ddp::all_reduce(&group, loss, ReduceOp::Mean)?; // the same on every rank
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
    let tensor = match tensor_collective(group, tensor, TensorOp::AllReduce(op))? {
        Ok(done) => return Ok(done),
        Err(on_host) => on_host,
    };
    let device = tensor.device();
    let mut data = tensor.into_data();
    with_elements!(group.rank(), data, slice => group.all_reduce(slice, op))?;
    Ok(same_dtype(data, &device))
}

/// Copies rank `root`'s `tensor` to every rank (`dist.broadcast`).
pub fn broadcast<B: Backend, const D: usize, K: BasicOps<B> + 'static>(
    group: &ProcessGroup,
    tensor: Tensor<B, D, K>,
    root: usize,
) -> Result<Tensor<B, D, K>> {
    if root >= group.world_size() {
        return Err(CommError::InvalidArgument {
            rank: group.rank(),
            message: format!(
                "broadcast from rank {root} in a world of {}",
                group.world_size()
            ),
        });
    }
    let tensor = match tensor_collective(group, tensor, TensorOp::Broadcast(root))? {
        Ok(done) => return Ok(done),
        Err(on_host) => on_host,
    };
    let device = tensor.device();
    let mut data = tensor.into_data();
    with_elements!(group.rank(), data, slice => group.broadcast(slice, root))?;
    Ok(same_dtype(data, &device))
}

/// Every rank's `tensor`, in rank order (`dist.all_gather`). All ranks must pass
/// tensors of the same shape.
pub fn all_gather<B: Backend, const D: usize, K: BasicOps<B> + 'static>(
    group: &ProcessGroup,
    tensor: Tensor<B, D, K>,
) -> Result<Vec<Tensor<B, D, K>>> {
    let rows = tensor.dims().first().copied().unwrap_or(1);
    let tensor = match tensor_collective(group, tensor, TensorOp::AllGather)? {
        // The ranks' tensors side by side along dimension 0.
        Ok(gathered) => {
            return Ok((0..group.world_size())
                .map(|r| gathered.clone().narrow(0, r * rows, rows))
                .collect())
        }
        Err(on_host) => on_host,
    };
    let device = tensor.device();
    let shape = tensor.shape();
    let mut data = tensor.into_data();
    let gathered: Vec<TensorData> = with_elements!(group.rank(), data, slice => {
        group.all_gather(slice).map(|all| {
            let per_rank = slice.len();
            (0..group.world_size())
                .map(|r| {
                    let part = all[r * per_rank..(r + 1) * per_rank].to_vec();
                    TensorData::new(part, shape.clone())
                })
                .collect()
        })
    })?;
    Ok(gathered
        .into_iter()
        .map(|data| same_dtype(data, &device))
        .collect())
}

/// Reduces `tensor` over all ranks and returns this rank's slice of the result
/// along dimension 0 (`dist.reduce_scatter_tensor`). Dimension 0 must be a
/// multiple of the world size.
pub fn reduce_scatter<B: Backend, const D: usize, K: BasicOps<B> + 'static>(
    group: &ProcessGroup,
    tensor: Tensor<B, D, K>,
    op: ReduceOp,
) -> Result<Tensor<B, D, K>> {
    let device = tensor.device();
    let mut dims = tensor.dims();
    let world = group.world_size();
    if D == 0 || !dims[0].is_multiple_of(world) {
        return Err(CommError::InvalidArgument {
            rank: group.rank(),
            message: format!(
                "reduce_scatter splits dimension 0 across {world} ranks, so it must be a \
                 multiple of {world}; got shape {dims:?}"
            ),
        });
    }
    let tensor = match tensor_collective(group, tensor, TensorOp::ReduceScatter(op))? {
        Ok(part) => return Ok(part),
        Err(on_host) => on_host,
    };
    dims[0] /= world;
    let mut data = tensor.into_data();
    let part: TensorData = with_elements!(group.rank(), data, slice => {
        group
            .reduce_scatter(slice, op)
            .map(|part| TensorData::new(part, dims))
    })?;
    Ok(same_dtype(part, &device))
}
