//! Collectives on Burn tensors, mirroring `torch.distributed`'s.
//!
//! CUDA tensors go over NCCL on the GPU when the group uses it
//! ([`crate::device`]); every other tensor takes a host round trip (`into_data`,
//! the host transports, `from_data`). Float and int tensors of f32, f64, f16,
//! bf16, i32 and i64 elements are supported (f16 and bf16 combine in f32 and
//! round once per step, as NCCL's native half reductions do).

use crate::device::{tensor_collective, TensorOp};
use crate::{dtype, CommError, ProcessGroup, ReduceOp, Result};
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

/// `data`'s elements as bytes and their wire type, or the error naming the
/// rank, the type and the fix.
fn host_bytes<'a>(
    rank: usize,
    data: &'a mut TensorData,
    what: &str,
) -> Result<(burn_ddp_comm::DType, &'a mut [u8])> {
    let burn_dtype = data.dtype;
    let wire = dtype::wire_or_error(rank, burn_dtype, what)?;
    let bytes = dtype::bytes_mut(data).ok_or_else(|| CommError::InvalidArgument {
        rank,
        message: format!("{what}: the tensor's data is not laid out as {burn_dtype:?} elements"),
    })?;
    Ok((wire, bytes))
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
    let (wire, bytes) = host_bytes(group.rank(), &mut data, "all_reduce")?;
    group.all_reduce_bytes(wire, bytes, op)?;
    Ok(same_dtype(data, &device))
}

/// Copies rank `root`'s `tensor` to every rank (`dist.broadcast`).
pub fn broadcast<B: Backend, const D: usize, K: BasicOps<B> + 'static>(
    group: &ProcessGroup,
    tensor: Tensor<B, D, K>,
    root: usize,
) -> Result<Tensor<B, D, K>> {
    group.check_root(root)?;
    let tensor = match tensor_collective(group, tensor, TensorOp::Broadcast(root))? {
        Ok(done) => return Ok(done),
        Err(on_host) => on_host,
    };
    let device = tensor.device();
    let mut data = tensor.into_data();
    let (wire, bytes) = host_bytes(group.rank(), &mut data, "broadcast")?;
    group.broadcast_bytes(wire, bytes, root)?;
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
    let burn_dtype = data.dtype;
    let (wire, bytes) = host_bytes(group.rank(), &mut data, "all_gather")?;
    let gathered = group.all_gather_bytes(wire, bytes)?;
    let per_rank = gathered.len() / group.world_size();
    Ok((0..group.world_size())
        .map(|r| {
            let part = gathered[r * per_rank..(r + 1) * per_rank].to_vec();
            same_dtype(
                TensorData::from_bytes_vec(part, shape.clone(), burn_dtype),
                &device,
            )
        })
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
    group.check_scatter_dims(&dims)?;
    let tensor = match tensor_collective(group, tensor, TensorOp::ReduceScatter(op))? {
        Ok(part) => return Ok(part),
        Err(on_host) => on_host,
    };
    dims[0] /= group.world_size();
    let mut data = tensor.into_data();
    let burn_dtype = data.dtype;
    let (wire, bytes) = host_bytes(group.rank(), &mut data, "reduce_scatter")?;
    let part = group.reduce_scatter_bytes(wire, bytes, op)?;
    Ok(same_dtype(
        TensorData::from_bytes_vec(part, dims, burn_dtype),
        &device,
    ))
}
