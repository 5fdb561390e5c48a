//! The group's device backend: whether buffers in GPU memory are moved by NCCL
//! (decided once, by every rank together, at the first device collective) and
//! the collectives on them. Host buffers never come here.
//!
//! Without the `nccl` feature the decision is always "through host memory",
//! and `BURN_DDP_BACKEND=nccl` is refused at that point.

use super::ProcessGroup;
use crate::backend::CollectiveBackend;
use crate::error::{CommError, Result};
#[cfg(feature = "nccl")]
use std::sync::Arc;
use std::sync::Mutex;

#[cfg(feature = "nccl")]
use crate::nccl::{DeviceBuffer, NcclCommunicator};

/// What the group decided for GPU `ordinal`.
struct Decision {
    ordinal: usize,
    #[cfg(feature = "nccl")]
    nccl: Option<Arc<NcclCommunicator>>,
}

impl Decision {
    fn on_device(&self) -> bool {
        #[cfg(feature = "nccl")]
        return self.nccl.is_some();
        #[cfg(not(feature = "nccl"))]
        false
    }
}

/// The configured backend and, once made, the decision.
pub(super) struct DeviceBackend {
    pub choice: CollectiveBackend,
    decided: Mutex<Option<Decision>>,
}

impl DeviceBackend {
    pub fn new(choice: CollectiveBackend) -> Self {
        Self {
            choice,
            decided: Mutex::new(None),
        }
    }
}

impl ProcessGroup {
    /// Which backend moves device buffers, as configured (`BURN_DDP_BACKEND`,
    /// read once when the group started, or the builder's choice).
    pub fn device_backend(&self) -> CollectiveBackend {
        self.inner.device.choice
    }

    /// Whether gradient synchronisation over this group moves anything: it
    /// does with peers, and in a world of one only when the device backend
    /// is forced to NCCL (`BURN_DDP_BACKEND=nccl`, so one process exercises
    /// the GPU path). The one place this rule is decided: the reducer and
    /// every front-end ask here.
    pub fn synchronizes(&self) -> bool {
        self.world_size() > 1 || self.device_backend() == CollectiveBackend::Nccl
    }

    /// The error for a buffer `BURN_DDP_BACKEND=nccl` cannot apply to (`why`:
    /// what the buffer is, in the front-end's terms).
    pub fn nccl_refused(&self, why: &str) -> CommError {
        CommError::config(
            Some(self.rank()),
            crate::BACKEND_VAR,
            format!(
                "rank {}: BURN_DDP_BACKEND=nccl, but {why}; unset it to reduce through host memory",
                self.rank()
            ),
        )
    }

    /// Whether collectives on buffers in the memory of GPU `ordinal` run on the
    /// device (NCCL): `false` sends them through host memory (`BURN_DDP_BACKEND`
    /// is `tcp`, or `auto` found NCCL unusable on some rank, which is said once
    /// on stderr). `nccl` makes "cannot" an error naming the reason.
    ///
    /// Collective on first use: every rank must call it at the same point.
    /// Later calls return the same answer; one process drives one GPU.
    pub fn uses_device_collectives(&self, ordinal: usize) -> Result<bool> {
        let mut decided = self.inner.device.decided.lock().unwrap();
        if let Some(decision) = decided.as_ref() {
            if decision.ordinal != ordinal {
                return Err(CommError::config(
                    Some(self.rank()),
                    "device",
                    format!(
                        "rank {}: collectives already run on cuda:{}, now a buffer is on \
                     cuda:{ordinal}; burn-ddp drives one GPU per process (put the model and \
                     data on one device, usually cuda:LOCAL_RANK)",
                        self.rank(),
                        decision.ordinal
                    ),
                ));
            }
            return Ok(decision.on_device());
        }
        let decision = self.decide(ordinal)?;
        let on_device = decision.on_device();
        *decided = Some(decision);
        Ok(on_device)
    }

    #[cfg(not(feature = "nccl"))]
    fn decide(&self, ordinal: usize) -> Result<Decision> {
        match self.device_backend() {
            CollectiveBackend::Nccl => Err(CommError::config(
                Some(self.rank()),
                crate::BACKEND_VAR,
                format!(
                    "rank {}: BURN_DDP_BACKEND=nccl, but burn-ddp-comm was built without its \
                 `nccl` feature; unset it to reduce through host memory",
                    self.rank()
                ),
            )),
            _ => Ok(Decision { ordinal }),
        }
    }

    #[cfg(feature = "nccl")]
    fn decide(&self, ordinal: usize) -> Result<Decision> {
        let nccl = match self.device_backend() {
            CollectiveBackend::Host => None,
            CollectiveBackend::Auto => self.start_nccl(ordinal, false)?,
            CollectiveBackend::Nccl => self.start_nccl(ordinal, true)?,
        };
        Ok(Decision { ordinal, nccl })
    }

    /// Agrees with every rank that NCCL can run (each loads it and drives a GPU
    /// of its own), then creates the communicator; `None` where it cannot and
    /// is not `required`.
    #[cfg(feature = "nccl")]
    fn start_nccl(&self, ordinal: usize, required: bool) -> Result<Option<Arc<NcclCommunicator>>> {
        use crate::nccl::{
            check_nccl_loadable, check_one_gpu_per_rank, gpu_uuid, next_communicator,
        };
        let rank = self.rank();
        let local = check_nccl_loadable(rank);
        let mut everyone = [i32::from(local.is_ok())];
        self.all_reduce(&mut everyone, crate::ReduceOp::Min)?;
        if everyone[0] == 0 {
            let (reason, mine) = match local {
                Err(reason) => (reason, true),
                Ok(()) => (
                    format!("rank {rank}: another rank cannot load NCCL (its log says why)"),
                    false,
                ),
            };
            if required {
                return Err(CommError::config(
                    Some(self.rank()),
                    crate::BACKEND_VAR,
                    format!("{reason} [BURN_DDP_BACKEND=nccl]"),
                ));
            }
            if rank == 0 || mine {
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
            &gpu_uuid(ordinal)
                .unwrap_or_else(|_| format!("{}/{ordinal}", crate::env::machine_id())),
            ordinal,
            self.timeout(),
        );
        match placed {
            Err(CommError::Config { message, .. }) if !required => {
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

    /// The NCCL communicator for GPU `ordinal` (deciding as
    /// [`uses_device_collectives`](Self::uses_device_collectives) does), for
    /// callers that manage device memory themselves (the GPU check).
    #[cfg(feature = "nccl")]
    pub fn nccl_communicator(&self, ordinal: usize) -> Result<Option<Arc<NcclCommunicator>>> {
        self.uses_device_collectives(ordinal)?;
        let decided = self.inner.device.decided.lock().unwrap();
        Ok(decided.as_ref().and_then(|d| d.nccl.clone()))
    }

    /// The communicator device collectives run on, or why there is none.
    #[cfg(feature = "nccl")]
    fn device_comm(&self) -> Result<Arc<NcclCommunicator>> {
        if let Some(err) = self.inner.failures.fatal() {
            return Err(err);
        }
        let decided = self.inner.device.decided.lock().unwrap();
        decided
            .as_ref()
            .and_then(|d| d.nccl.clone())
            .ok_or_else(|| {
                CommError::config(
                    Some(self.rank()),
                    "device",
                    format!(
                    "rank {}: a device collective, but this group moves device buffers through \
                 host memory (ask uses_device_collectives first)",
                    self.rank()
                ),
                )
            })
    }

    /// Reduces a device buffer in place over all ranks.
    ///
    /// # Safety
    /// As [`NcclCommunicator::all_reduce`]; call after
    /// [`uses_device_collectives`](Self::uses_device_collectives) said `true`.
    #[cfg(feature = "nccl")]
    pub unsafe fn all_reduce_device(&self, data: DeviceBuffer, op: crate::ReduceOp) -> Result<()> {
        unsafe { self.device_comm()?.all_reduce(data, op) }
    }

    /// Copies rank `root`'s device buffer into `data` on every rank.
    ///
    /// # Safety
    /// As [`NcclCommunicator::broadcast`].
    #[cfg(feature = "nccl")]
    pub unsafe fn broadcast_device(&self, data: DeviceBuffer, root: usize) -> Result<()> {
        unsafe { self.device_comm()?.broadcast(data, root) }
    }

    /// Every rank's `send`, in rank order, into `recv` (`world_size` times as long).
    ///
    /// # Safety
    /// As [`NcclCommunicator::all_gather`].
    #[cfg(feature = "nccl")]
    pub unsafe fn all_gather_device(&self, send: DeviceBuffer, recv: DeviceBuffer) -> Result<()> {
        unsafe { self.device_comm()?.all_gather(send, recv) }
    }

    /// Reduces `send` over all ranks and writes this rank's part into `recv`.
    ///
    /// # Safety
    /// As [`NcclCommunicator::reduce_scatter`].
    #[cfg(feature = "nccl")]
    pub unsafe fn reduce_scatter_device(
        &self,
        send: DeviceBuffer,
        recv: DeviceBuffer,
        op: crate::ReduceOp,
    ) -> Result<()> {
        unsafe { self.device_comm()?.reduce_scatter(send, recv, op) }
    }

    /// The bytes of a device buffer, copied back (for the GPU check).
    ///
    /// # Safety
    /// As [`NcclCommunicator::read_back`].
    #[cfg(feature = "nccl")]
    pub unsafe fn read_back_device(&self, buffer: DeviceBuffer) -> Result<Vec<u8>> {
        unsafe { self.device_comm()?.read_back(buffer) }
    }
}

#[cfg(all(test, not(feature = "nccl")))]
mod tests {
    use crate::{CollectiveBackend, ProcessGroup};

    #[test]
    fn without_nccl_device_buffers_go_through_host_memory_unless_nccl_is_required() {
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        assert_eq!(group.device_backend(), CollectiveBackend::Auto);
        assert!(!group.uses_device_collectives(0).unwrap());
        let err = group.uses_device_collectives(1).unwrap_err().to_string();
        assert!(
            err.contains("already run on cuda:0, now a buffer is on cuda:1"),
            "{err}"
        );

        let forced = ProcessGroup::builder(0, 1)
            .device_backend(CollectiveBackend::Nccl)
            .build()
            .unwrap();
        let err = forced.uses_device_collectives(0).unwrap_err().to_string();
        assert!(
            err.contains("rank 0: BURN_DDP_BACKEND=nccl") && err.contains("`nccl` feature"),
            "{err}"
        );
        let host = ProcessGroup::builder(0, 1)
            .device_backend(CollectiveBackend::Host)
            .build()
            .unwrap();
        assert!(!host.uses_device_collectives(0).unwrap());
    }
}
