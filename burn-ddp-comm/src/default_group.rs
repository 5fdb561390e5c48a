//! The process-wide default group and the reducer of models that were never
//! wrapped, as `torch.distributed` keeps a default group. Every front-end's
//! `init_process_group`/`destroy_process_group` is this.

use crate::env::LaunchEnv;
use crate::error::{CommError, Result};
use crate::group::ProcessGroup;
use crate::reducer::{models, BucketConfig, Reducer};
use std::sync::{Arc, Mutex, OnceLock};

/// The default group and the reducer of the models that were not wrapped.
pub struct DefaultGroup {
    /// The group made by [`init`].
    pub group: ProcessGroup,
    /// The reducer shared by every model never wrapped.
    pub reducer: Mutex<Reducer>,
}

static DEFAULT: Mutex<Option<Arc<DefaultGroup>>> = Mutex::new(None);

/// Joins the group described by the launcher's environment (torchrun,
/// burn-ddp-run, Open MPI, Slurm; a world of one without a launcher) and makes
/// it the default group. A second call is an error naming the fix.
pub fn init() -> Result<ProcessGroup> {
    let mut slot = DEFAULT.lock().unwrap();
    if let Some(state) = slot.as_ref() {
        return Err(CommError::config(format!(
            "rank {}: init_process_group was already called; reuse the group it \
             returned (or default_group())",
            state.group.rank()
        )));
    }
    let group = ProcessGroup::from_env()?;
    *slot = Some(Arc::new(DefaultGroup {
        reducer: Mutex::new(Reducer::new(&group, BucketConfig::default())),
        group: group.clone(),
    }));
    Ok(group)
}

/// The default group's state, if [`init`] was called.
pub fn current() -> Option<Arc<DefaultGroup>> {
    DEFAULT.lock().unwrap().clone()
}

/// [`current`], or an error if the launcher started several ranks but nobody
/// joined the group (gradients would silently stay local).
pub fn required_if_distributed() -> Result<Option<Arc<DefaultGroup>>> {
    if let Some(state) = current() {
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
             group was initialised, so they would not be; call init_process_group() \
             at the start of the program"
        ))),
        _ => Ok(None),
    }
}

/// Waits for every rank (bounded by the timeout), then forgets the default
/// group and the models wrapped over it; its connections close once the last
/// handle to it is dropped.
pub fn destroy() -> Result<()> {
    let state = DEFAULT.lock().unwrap().take().ok_or(CommError::Destroyed)?;
    models::forget_group(&state.group);
    state.group.barrier()
}
