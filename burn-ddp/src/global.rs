//! The process-wide default group and the reducer of the default scope, as
//! `torch.distributed` keeps a default group.
//!
//! A model that was never wrapped is synchronised over it (so does
//! `Ddp<B>::backward` for parameters of no wrapped model, when no model was
//! wrapped); wrapped models hold their own state (`burn_ddp_comm::reducer::models`).

use crate::{BucketConfig, CommError, LaunchEnv, ProcessGroup, Reducer, Result};
use std::sync::{Arc, Mutex, OnceLock};

/// The default group and the reducer of models that were not wrapped.
pub(crate) struct DdpState {
    pub group: ProcessGroup,
    pub reducer: Mutex<Reducer>,
}

static DEFAULT: Mutex<Option<Arc<DdpState>>> = Mutex::new(None);

/// Joins the group described by the launcher's environment (torchrun,
/// burn-ddp-run, Open MPI, Slurm; a world of one without a launcher) and makes it
/// the default group, the one models are synchronised over unless wrapped over
/// another. The returned handle can be cloned and shared.
pub fn init_process_group() -> Result<ProcessGroup> {
    let mut slot = DEFAULT.lock().unwrap();
    if let Some(state) = slot.as_ref() {
        return Err(CommError::config(format!(
            "rank {}: init_process_group was already called; reuse the group it \
             returned (or burn_ddp::default_group())",
            state.group.rank()
        )));
    }
    let group = ProcessGroup::from_env()?;
    *slot = Some(Arc::new(DdpState {
        reducer: Mutex::new(Reducer::new(&group, BucketConfig::new())),
        group: group.clone(),
    }));
    Ok(group)
}

/// The group made by [`init_process_group`], if any.
pub fn default_group() -> Option<ProcessGroup> {
    state().map(|state| state.group.clone())
}

pub(crate) fn state() -> Option<Arc<DdpState>> {
    DEFAULT.lock().unwrap().clone()
}

/// The default state, or an error if the launcher started several ranks but
/// nobody joined the group (gradients would silently stay local).
pub(crate) fn require_state_if_distributed() -> Result<Option<Arc<DdpState>>> {
    if let Some(state) = state() {
        return Ok(Some(state));
    }
    static LAUNCHED_WORLD: OnceLock<Option<(usize, usize)>> = OnceLock::new();
    let launched = LAUNCHED_WORLD.get_or_init(|| {
        LaunchEnv::from_env()
            .ok()
            .map(|env| (env.rank, env.world_size))
    });
    match launched {
        Some((rank, world)) if *world > 1 => Err(CommError::config(format!(
            "rank {rank} of {world}: gradients were to be averaged before the process \
             group was initialised, so they would not be; call \
             burn_ddp::init_process_group() at the start of the program"
        ))),
        _ => Ok(None),
    }
}

/// Waits for every rank (bounded by the timeout), then forgets the default group
/// and the models wrapped over it; its connections close once the last handle
/// to it is dropped.
pub fn destroy_process_group() -> Result<()> {
    let state = DEFAULT.lock().unwrap().take().ok_or(CommError::Destroyed)?;
    burn_ddp_comm::reducer::models::forget_group(&state.group);
    state.group.barrier()
}
