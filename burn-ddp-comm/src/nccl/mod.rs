//! NCCL for CUDA device buffers, behind the `nccl` feature.
//!
//! The process group decides once, collectively, whether its ranks can use NCCL
//! (every rank loads the library and drives a GPU of its own), then keeps one
//! communicator for the process. The device-independent parts (the library
//! message, the rendezvous, the bounded wait) are compiled and unit-tested
//! without the feature.

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
pub use communicator::{DeviceBuffer, NcclCommunicator};
/// The CUDA bindings in use, for callers that manage device memory themselves.
#[cfg(feature = "nccl")]
pub use cudarc;

#[cfg(feature = "nccl")]
mod decide {
    use super::communicator::NcclCommunicator;
    use super::library::check_nccl_loadable;
    use super::rendezvous::{check_one_gpu_per_rank, next_communicator};
    use crate::backend::CollectiveBackend;
    use crate::element::ReduceOp;
    use crate::error::{CommError, Result};
    use crate::group::{machine_id, ProcessGroup};
    use std::sync::Arc;

    /// What a group decided about NCCL: for which GPU, and the communicator
    /// (`None`: reduce through host memory).
    pub(crate) type NcclSlot = std::sync::Mutex<Option<(usize, Option<Arc<NcclCommunicator>>)>>;

    impl ProcessGroup {
        /// The NCCL communicator for tensors on GPU `ordinal`, or `None` when
        /// they go through host memory (`backend` is `Host`, or `Auto` found
        /// NCCL unusable on some rank, which is said once on stderr).
        ///
        /// Collective on first use: every rank must call it at the same point.
        /// Later calls return the same answer; one process drives one GPU.
        pub fn nccl_communicator(
            &self,
            ordinal: usize,
            backend: CollectiveBackend,
        ) -> Result<Option<Arc<NcclCommunicator>>> {
            let mut slot = self.nccl_slot().lock().unwrap();
            if let Some((used, decided)) = slot.as_ref() {
                if *used != ordinal {
                    return Err(CommError::config(format!(
                        "rank {}: collectives already run on cuda:{used}, now a tensor is on \
                         cuda:{ordinal}; burn-ddp drives one GPU per process (put the model \
                         and data on one device, usually cuda:LOCAL_RANK)",
                        self.rank()
                    )));
                }
                return Ok(decided.clone());
            }
            let decided = match backend {
                CollectiveBackend::Host => None,
                CollectiveBackend::Auto => self.start_nccl(ordinal, false)?,
                CollectiveBackend::Nccl => self.start_nccl(ordinal, true)?,
            };
            *slot = Some((ordinal, decided.clone()));
            Ok(decided)
        }

        fn start_nccl(
            &self,
            ordinal: usize,
            required: bool,
        ) -> Result<Option<Arc<NcclCommunicator>>> {
            let rank = self.rank();
            let local = check_nccl_loadable(rank);
            let mut everyone = [i32::from(local.is_ok())];
            self.all_reduce(&mut everyone, ReduceOp::Min)?;
            if everyone[0] == 0 {
                let reason = local.err().unwrap_or_else(|| {
                    format!("rank {rank}: another rank cannot load NCCL (its log says why)")
                });
                if required {
                    return Err(CommError::config(format!(
                        "{reason} [BURN_DDP_BACKEND=nccl]"
                    )));
                }
                if rank == 0 || reason.starts_with(&format!("rank {rank}: cannot")) {
                    log::warn!("{reason}; CUDA tensors are reduced through host memory");
                }
                return Ok(None);
            }
            let store = self.store();
            let keys = next_communicator(store, self.key_prefix(), self.world_size())?;
            let placed = check_one_gpu_per_rank(
                store,
                &keys,
                rank,
                self.world_size(),
                &super::gpu_uuid(ordinal).unwrap_or_else(|_| format!("{}/{ordinal}", machine_id())),
                ordinal,
                self.timeout(),
            );
            match placed {
                Err(CommError::Config { message }) if !required => {
                    if rank == 0 {
                        log::warn!("{message}; CUDA tensors are reduced through host memory");
                    }
                    return Ok(None);
                }
                other => other?,
            }
            let comm = NcclCommunicator::connect(
                store,
                &keys,
                rank,
                self.world_size(),
                ordinal,
                self.timeout(),
            )?;
            Ok(Some(Arc::new(comm)))
        }
    }
}

#[cfg(feature = "nccl")]
pub(crate) use decide::NcclSlot;

/// The UUID of the GPU this process calls `cuda:ordinal`: the same GPU has
/// the same UUID in every process, whatever `CUDA_VISIBLE_DEVICES` renumbers.
#[cfg(feature = "nccl")]
fn gpu_uuid(ordinal: usize) -> crate::Result<String> {
    use cudarc::driver::result;
    let failed = |e: result::DriverError| {
        crate::CommError::config(format!("cannot identify cuda:{ordinal}: {e}"))
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
            "cannot load the CUDA driver (libcuda.so); run on a machine with an NVIDIA \
             GPU and its driver, or use a CPU backend",
        ));
    }
    cudarc::driver::CudaContext::device_count()
        .map(|n| n.max(0) as usize)
        .map_err(|e| crate::CommError::config(format!("cannot count CUDA devices: {e}")))
}
