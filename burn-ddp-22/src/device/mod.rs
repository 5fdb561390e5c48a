//! Collectives on tensors that live on a GPU: found at run time by the tensor's
//! device, carried out over NCCL in place, so gradients never leave the device.
//!
//! Everything else (CPU backends, WebGPU, a build without the `cuda` feature,
//! `BURN_DDP_BACKEND=tcp`) takes the host path: `into_data`, the host
//! transports, `from_data`. Which backend applies is the group's setting,
//! read once when it started.

#[cfg(feature = "cuda")]
pub(crate) mod cuda;
#[cfg(feature = "cuda")]
mod packed;

#[cfg(feature = "cuda")]
pub use cuda::{cuda_device_for_rank, nccl_view};

use crate::collective::CollectiveKind;
pub(crate) use crate::shared::contract::TensorOp;
use crate::{CommError, ProcessGroup, Result};
use burn::tensor::{Device, Tensor};
use burn_ddp_comm::{CollectiveBackend, Placement};

/// Where tensors on `device` live, for the reducer: on a GPU when they are
/// CUDA tensors burn-ddp-22 can hand to NCCL, else in host memory (read back
/// with `into_data`).
pub(crate) fn placement(device: &Device) -> Placement {
    #[cfg(feature = "cuda")]
    if let Some(ordinal) = cuda::ordinal_of(device) {
        return Placement::Device { ordinal };
    }
    let _ = device;
    Placement::Host
}

/// Why `BURN_DDP_BACKEND=nccl` cannot apply to `subject` ("this tensor is",
/// "the gradients are") on `device`.
pub(crate) fn nccl_refused(group: &ProcessGroup, subject: &str, device: &Device) -> CommError {
    group.nccl_refused(&refusal(subject, device))
}

/// The reason [`nccl_refused`] gives.
fn refusal(subject: &str, device: &Device) -> String {
    if !cfg!(feature = "cuda") {
        return format!(
            "burn-ddp-22 was built without its `cuda` feature ({subject} on {device:?})"
        );
    }
    match placement(device) {
        Placement::Host => format!("{subject} on {device:?}, not on a CUDA device"),
        // On a GPU but not taken: a quantized tensor.
        Placement::Device { .. } => format!(
            "{subject} neither plain float nor integer, the kinds burn-ddp-22 hands to NCCL"
        ),
    }
}

/// Runs `op` on a GPU tensor over NCCL; `Err(tensor)` hands a tensor the
/// device path does not take back to the host path. All-gather returns the
/// ranks' tensors concatenated along dimension 0; reduce-scatter this rank's
/// part of dimension 0.
pub(crate) fn tensor_collective<const D: usize, K: CollectiveKind>(
    group: &ProcessGroup,
    tensor: Tensor<D, K>,
    op: TensorOp,
) -> Result<std::result::Result<Tensor<D, K>, Tensor<D, K>>> {
    #[cfg(feature = "cuda")]
    let tensor = match cuda::tensor_collective(group, tensor, op)? {
        Ok(done) => return Ok(Ok(done)),
        Err(not_cuda) => not_cuda,
    };
    let _ = op;
    if group.device_backend() == CollectiveBackend::Nccl {
        return Err(nccl_refused(group, "this tensor is", &tensor.device()));
    }
    Ok(Err(tensor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_tensors_live_in_host_memory_with_or_without_autodiff() {
        assert_eq!(placement(&Device::flex()), Placement::Host);
        assert_eq!(placement(&Device::flex().autodiff()), Placement::Host);
    }

    #[test]
    fn the_refusal_names_the_rank_the_setting_and_why() {
        let group = ProcessGroup::builder(0, 1)
            .device_backend(CollectiveBackend::Nccl)
            .build()
            .unwrap();
        let err = nccl_refused(&group, "this tensor is", &Device::flex()).to_string();
        assert!(err.contains("rank 0: BURN_DDP_BACKEND=nccl, but "), "{err}");
        if cfg!(feature = "cuda") {
            assert!(
                err.contains("this tensor is on Device<Flex")
                    && err.contains(", not on a CUDA device"),
                "{err}"
            );
        } else {
            assert!(
                err.contains(
                    "burn-ddp-22 was built without its `cuda` feature (this tensor is on \
                     Device<Flex"
                ),
                "{err}"
            );
        }
    }

    /// CUDA devices are told apart by value (no GPU is touched).
    #[cfg(feature = "cuda")]
    #[test]
    fn cuda_gradients_live_on_their_gpu_and_other_types_are_named() {
        assert_eq!(
            placement(&Device::cuda(3)),
            Placement::Device { ordinal: 3 }
        );
        assert_eq!(
            placement(&Device::cuda(1).autodiff()),
            Placement::Device { ordinal: 1 }
        );
        let why = refusal("this tensor is", &Device::cuda(0));
        assert!(why.contains("neither plain float nor integer"), "{why}");
    }
}
