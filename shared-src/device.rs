//! The device path of the tensor collectives (feature `cuda`): which NCCL
//! call each collective is, on buffers the front-end hands out packed and
//! pinned. How a Burn tensor becomes a CUDA buffer and back is each
//! front-end's own `device::cuda` (Burn 0.21 and 0.22 reach it differently).

use super::contract::{CudaBuffer, TensorOp};
use burn_ddp_comm::{ProcessGroup, Result};

/// Runs `op` over NCCL on `tensor`; returns the result's tensor (the input,
/// written in place, for all-reduce and broadcast).
pub(crate) fn collective<T: CudaBuffer>(
    group: &ProcessGroup,
    tensor: T,
    op: TensorOp,
) -> Result<T> {
    let rank = group.rank();
    let world = group.world_size();
    // SAFETY (every call below): `pin` waited for all writes to the buffers and
    // holds their allocations until the call, which waits for NCCL, returns;
    // buffers written in place are exclusively owned and packed.
    Ok(match op {
        TensorOp::AllReduce(op) => {
            let data = tensor.writable();
            let pinned = data.pin(rank)?;
            unsafe { group.all_reduce_device(pinned.buffer, op)? };
            data
        }
        TensorOp::Broadcast(root) => {
            let data = tensor.writable();
            let pinned = data.pin(rank)?;
            unsafe { group.broadcast_device(pinned.buffer, root)? };
            data
        }
        TensorOp::AllGather => {
            let input = tensor.readable();
            let output = input.empty_like(|rows| rows * world);
            let (send, recv) = (input.pin(rank)?, output.pin(rank)?);
            unsafe { group.all_gather_device(send.buffer, recv.buffer)? };
            output
        }
        TensorOp::ReduceScatter(op) => {
            let input = tensor.readable();
            let output = input.empty_like(|rows| rows / world);
            let (send, recv) = (input.pin(rank)?, output.pin(rank)?);
            unsafe { group.reduce_scatter_device(send.buffer, recv.buffer, op)? };
            output
        }
    })
}

/// The bytes at the device address an in-place collective would hand NCCL
/// for `tensor`, copied back (for the GPU check).
pub(crate) fn view<T: CudaBuffer>(group: &ProcessGroup, tensor: T) -> Result<Vec<u8>> {
    let data = tensor.writable();
    let pinned = data.pin(group.rank())?;
    // SAFETY: `pin` waited for every write and holds the allocation while we read.
    let bytes = unsafe { group.read_back_device(pinned.buffer)? };
    drop(pinned);
    Ok(bytes)
}
