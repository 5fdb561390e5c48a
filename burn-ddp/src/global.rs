//! The process-wide default group, as `torch.distributed` keeps one
//! (`burn_ddp_comm::default_group`, shared by every front-end).
//!
//! A model that was never wrapped is synchronised over it (so does
//! `Ddp<B>::backward` for parameters of no wrapped model, when no model was
//! wrapped); wrapped models hold their own state (`burn_ddp_comm::reducer::models`).

use crate::{ProcessGroup, Result};
use burn_ddp_comm::default_group;

/// Joins the group described by the launcher's environment (torchrun,
/// burn-ddp-run, Open MPI, Slurm; a world of one without a launcher) and makes it
/// the default group, the one models are synchronised over unless wrapped over
/// another. The returned handle can be cloned and shared.
pub fn init_process_group() -> Result<ProcessGroup> {
    default_group::init()
}

/// The group made by [`init_process_group`], if any.
pub fn default_group() -> Option<ProcessGroup> {
    default_group::current().map(|state| state.group.clone())
}

/// Waits for every rank (bounded by the timeout), then forgets the default group
/// and the models wrapped over it; its connections close once the last handle
/// to it is dropped.
pub fn destroy_process_group() -> Result<()> {
    default_group::destroy()
}
