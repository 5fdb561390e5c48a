//! The process-wide default group, as `torch.distributed` keeps one.
//!
//! Parts of a training program that cannot be handed a group (a backend's
//! `backward`) find it here.

use crate::{CommError, ProcessGroup, Result};
use std::sync::{Arc, Mutex};

static DEFAULT_GROUP: Mutex<Option<Arc<ProcessGroup>>> = Mutex::new(None);

/// Joins the group described by the launcher's environment (torchrun,
/// burn-ddp-run, Open MPI, Slurm; a world of one without a launcher) and makes it
/// the default group.
pub fn init_process_group() -> Result<Arc<ProcessGroup>> {
    let mut slot = DEFAULT_GROUP.lock().unwrap();
    if let Some(group) = slot.as_ref() {
        return Err(CommError::config(format!(
            "rank {}: init_process_group was already called; reuse the group it \
             returned (or burn_ddp::default_group())",
            group.rank()
        )));
    }
    let group = Arc::new(ProcessGroup::from_env()?);
    *slot = Some(Arc::clone(&group));
    Ok(group)
}

/// The group made by [`init_process_group`], if any.
pub fn default_group() -> Option<Arc<ProcessGroup>> {
    DEFAULT_GROUP.lock().unwrap().clone()
}

/// Waits for every rank (bounded by the timeout), then forgets the default group;
/// its connections close once the last handle to it is dropped.
pub fn destroy_process_group() -> Result<()> {
    let group = DEFAULT_GROUP
        .lock()
        .unwrap()
        .take()
        .ok_or(CommError::Destroyed)?;
    group.barrier()
}
