//! NCCL for CUDA device buffers, behind the `nccl` feature.
//!
//! What NCCL needs, below the process group: the library check, the
//! rendezvous of a communicator through the store, the communicator and its
//! bounded waits. The group decides (once, collectively) whether to use it
//! and dispatches device buffers here. The device-independent parts (the
//! library message, the rendezvous, the bounded wait) are compiled and
//! unit-tested without the feature.

mod library;
mod rendezvous;
mod toolchain;
mod wait;

pub use toolchain::check_cuda_headers;
#[cfg(feature = "nccl")]
pub use toolchain::check_nvrtc;

#[cfg(feature = "nccl")]
mod communicator;

/// Element types of a [`DeviceBuffer`].
#[cfg(feature = "nccl")]
pub use crate::element::DType;
#[cfg(feature = "nccl")]
pub use crate::element::DeviceBuffer;
#[cfg(feature = "nccl")]
pub use communicator::NcclCommunicator;
/// The CUDA bindings in use, for callers that manage device memory themselves.
#[cfg(feature = "nccl")]
pub use cudarc;

#[cfg(feature = "nccl")]
pub(crate) use library::check_nccl_loadable;
#[cfg(feature = "nccl")]
pub(crate) use rendezvous::{check_one_gpu_per_rank, next_communicator};

/// The UUID of the GPU this process calls `cuda:ordinal`: the same GPU has
/// the same UUID in every process, whatever `CUDA_VISIBLE_DEVICES` renumbers.
#[cfg(feature = "nccl")]
pub(crate) fn gpu_uuid(ordinal: usize) -> crate::Result<String> {
    use cudarc::driver::result;
    let failed = |e: result::DriverError| {
        crate::CommError::config(
            None,
            "device",
            format!("cannot identify cuda:{ordinal}: {e}"),
        )
    };
    result::init().map_err(failed)?;
    let device = result::device::get(ordinal as i32).map_err(failed)?;
    let uuid = result::device::get_uuid(device).map_err(failed)?;
    Ok(uuid
        .bytes
        .iter()
        .map(|b| format!("{:02x}", *b as u8))
        .collect())
}

/// GPUs this process can see (`CUDA_VISIBLE_DEVICES` applied), with a clear
/// error where there is no CUDA driver.
#[cfg(feature = "nccl")]
pub fn cuda_device_count() -> crate::Result<usize> {
    // SAFETY: only tries to open the driver library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(crate::CommError::config(
            None,
            "device",
            "cannot load the CUDA driver (libcuda.so); run on a machine with an NVIDIA \
             GPU and its driver, or use a CPU backend",
        ));
    }
    cudarc::driver::CudaContext::device_count()
        .map(|n| n.max(0) as usize)
        .map_err(|e| {
            crate::CommError::config(None, "device", format!("cannot count CUDA devices: {e}"))
        })
}
