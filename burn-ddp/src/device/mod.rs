//! Collectives on tensors that live on a GPU: found at run time by the tensor's
//! type, carried out over NCCL in place, so gradients never leave the device.
//!
//! Everything else (CPU backends, WebGPU, a build without the `cuda` feature,
//! `BURN_DDP_BACKEND=tcp`) takes the host path: `into_data`, the host
//! transports, `from_data`. Which backend applies is the group's setting,
//! read once when it started.

#[cfg(feature = "cuda")]
pub(crate) mod cuda;
#[cfg(feature = "cubecl")]
mod packed;

#[cfg(feature = "cuda")]
pub use cuda::{cuda_device_for_rank, nccl_view, FusedCuda, PlainCuda};

pub(crate) use crate::shared::contract::TensorOp;
use crate::{CommError, ProcessGroup, Result};
use burn::tensor::backend::Backend;
use burn::tensor::{BasicOps, Tensor};
use burn_backend::tensor::FloatTensor;
use burn_ddp_comm::{CollectiveBackend, PendingDeviceBucket, Placement};

/// Where tensors of backend `I` on `device` live, for the reducer: on a GPU
/// when they are CUDA tensors burn-ddp can hand to NCCL, else in host memory
/// (read back with `into_data`).
pub(crate) fn placement<I: Backend>(device: &I::Device) -> Placement {
    #[cfg(feature = "cuda")]
    if let Some(ordinal) = cuda::ordinal_of::<I>(device) {
        return Placement::Device { ordinal };
    }
    let _ = device;
    Placement::Host
}

/// `bucket` (a flat tensor packed during backward, its kernels perhaps still
/// queued) as a bucket NCCL may average on the communication thread once
/// they are done.
pub(crate) fn pack_pending<I: Backend>(
    rank: usize,
    bucket: FloatTensor<I>,
) -> Result<PendingDeviceBucket> {
    #[cfg(feature = "cuda")]
    return cuda::pack_pending::<I>(rank, bucket);
    #[cfg(not(feature = "cuda"))]
    {
        let _ = bucket;
        Err(CommError::device(
            rank,
            "a gradient bucket on a GPU in a build without the `cuda` feature (a burn-ddp \
             bug; please report it)",
            None,
        ))
    }
}

/// Why `BURN_DDP_BACKEND=nccl` cannot apply to a tensor of primitive type `P`.
pub(crate) fn nccl_refused<P>(group: &ProcessGroup) -> CommError {
    let why = if cfg!(feature = "cuda") {
        format!(
            "this tensor is not a CUDA tensor of Burn's Cuda backend, plain or fused, with \
             f32/i32 defaults (its primitive is {})",
            std::any::type_name::<P>()
        )
    } else {
        "burn-ddp was built without its `cuda` feature".to_string()
    };
    group.nccl_refused(&why)
}

/// Runs `op` on a GPU tensor over NCCL; `Err(tensor)` hands a tensor the
/// device path does not take back to the host path. All-gather returns the
/// ranks' tensors concatenated along dimension 0; reduce-scatter this rank's
/// part of dimension 0.
pub(crate) fn tensor_collective<B: Backend, const D: usize, K: BasicOps<B> + 'static>(
    group: &ProcessGroup,
    tensor: Tensor<B, D, K>,
    op: TensorOp,
) -> Result<std::result::Result<Tensor<B, D, K>, Tensor<B, D, K>>> {
    #[cfg(feature = "cuda")]
    let tensor = match cuda::tensor_collective(group, tensor, op)? {
        Ok(done) => return Ok(Ok(done)),
        Err(not_cuda) => not_cuda,
    };
    let _ = op;
    if group.device_backend() == CollectiveBackend::Nccl {
        return Err(nccl_refused::<K::Primitive>(group));
    }
    Ok(Err(tensor))
}
