//! Collectives on tensors that live on a GPU: found at run time by the tensor's
//! type, carried out over NCCL in place, so gradients never leave the device.
//!
//! Everything else (CPU backends, WebGPU, a build without the `cuda` feature,
//! `BURN_DDP_BACKEND=tcp`) takes the host path: `into_data`, the host
//! transports, `from_data`.

#[cfg(feature = "cuda")]
pub(crate) mod cuda;
mod layout;
#[cfg(feature = "cubecl")]
mod packed;

#[cfg(feature = "cuda")]
pub use cuda::{cuda_device_for_rank, nccl_view, FusedCuda, PlainCuda};

use crate::{CommError, ProcessGroup, Reducer, Result};
use burn::tensor::backend::Backend;
use burn::tensor::{BasicOps, Tensor};
use burn_backend::tensor::FloatTensor;
use burn_ddp_comm::{CollectiveBackend, ReduceOp};

/// The configured backend (`BURN_DDP_BACKEND`). Read at every use (it costs
/// microseconds); what it decides is kept by the group after the first CUDA
/// collective.
pub(crate) fn configured_backend(group: &ProcessGroup) -> Result<CollectiveBackend> {
    CollectiveBackend::from_env(group.rank())
}

/// Why `BURN_DDP_BACKEND=nccl` cannot apply to a tensor of primitive type `P`.
fn nccl_refused<P>(group: &ProcessGroup) -> CommError {
    let why = if cfg!(feature = "cuda") {
        format!(
            "this tensor is not a CUDA tensor of Burn's Cuda backend, plain or fused, with \
             f32/i32 defaults (its primitive is {})",
            std::any::type_name::<P>()
        )
    } else {
        "burn-ddp was built without its `cuda` feature".to_string()
    };
    CommError::config(format!(
        "rank {}: BURN_DDP_BACKEND=nccl, but {why}; unset it to reduce through host memory",
        group.rank()
    ))
}

/// A gradient bucket after [`average_bucket`]: averaged on the device, or
/// handed back for the host path.
// Without the `cuda` feature only the host variant is built.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) enum Bucket<P> {
    Averaged(P),
    OnHost(P),
}

/// Averages a flat gradient bucket over NCCL when it lives on a GPU and the
/// group uses NCCL; otherwise returns it untouched for the host path.
pub(crate) fn average_bucket<I: Backend>(
    reducer: &Reducer,
    bucket: FloatTensor<I>,
) -> Result<Bucket<FloatTensor<I>>> {
    let group = reducer.group();
    let backend = configured_backend(group)?;
    #[cfg(feature = "cuda")]
    let bucket = match cuda::average_bucket::<I>(reducer, bucket, backend)? {
        Ok(averaged) => return Ok(Bucket::Averaged(averaged)),
        Err(not_cuda) => not_cuda,
    };
    if backend == CollectiveBackend::Nccl {
        return Err(nccl_refused::<FloatTensor<I>>(group));
    }
    Ok(Bucket::OnHost(bucket))
}

/// Which tensor collective to run on the device.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[derive(Debug, Clone, Copy)]
pub(crate) enum TensorOp {
    AllReduce(ReduceOp),
    Broadcast(usize),
    AllGather,
    ReduceScatter(ReduceOp),
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
    let backend = configured_backend(group)?;
    #[cfg(feature = "cuda")]
    let tensor = match cuda::tensor_collective(group, tensor, op, backend)? {
        Ok(done) => return Ok(Ok(done)),
        Err(not_cuda) => not_cuda,
    };
    let _ = op;
    if backend == CollectiveBackend::Nccl {
        return Err(nccl_refused::<K::Primitive>(group));
    }
    Ok(Err(tensor))
}
