//! The front-end's session: its burn-ddp-training `Session` (the default
//! group, the wrapped models, the synchronisation totals), process-wide as
//! `torch.distributed` keeps its default group. The groups and reducers are
//! owned by it. (Burn 0.21's `Ddp<B>` keeps process-wide state of its own
//! beside it, for what its backward pass cannot be handed: docs/design.md,
//! "Per-model state".)

use burn_ddp_comm::{ProcessGroup, Result, SyncStats};
use burn_ddp_training::Session;

/// This process's session.
pub(crate) static SESSION: Session = Session::new();

/// Joins the group described by the launcher's environment (torchrun,
/// burn-ddp-run, Open MPI, Slurm; a world of one without a launcher) and makes
/// it the default group, the one models are synchronised over unless wrapped
/// over another. The returned handle can be cloned and shared. A second call
/// is an error naming the fix.
pub fn init_process_group() -> Result<ProcessGroup> {
    SESSION.init()
}

/// The group made by [`init_process_group`], if any.
pub fn default_group() -> Option<ProcessGroup> {
    SESSION.default_group()
}

/// After a collective failed because ranks are gone (killed, stalled past
/// the timeout, cut off): the surviving ranks form the next generation of
/// the default group among themselves, in the same processes, and it
/// becomes the default group; call it on every rank still there. Ranks keep
/// their order (this rank's new rank is its place among the survivors);
/// `wait` bounds how long they wait for each other. Then wrap each model
/// again over the returned group and redo the step that failed. A rank
/// that comes back after the others went on is fenced (an error naming the
/// generations). Needs the store outside the ranks to go on without rank 0
/// (`burn-ddp-run` hosts it).
pub fn reform_process_group(wait: std::time::Duration) -> Result<ProcessGroup> {
    SESSION.reform(wait)
}

/// Replacement workers wait to join (`ProcessGroup::joiners_waiting`, the
/// same on every rank after a step's gradient average): the default group's
/// next generation with them appended as its last ranks, which becomes the
/// default group; call it on every rank at the end of that step. Then hand
/// the new ranks the state from rank 0, and wrap each model again over the
/// returned group
/// (`replicas::share_training_state`, `recovery::share`). A replacement
/// started by `burn-ddp-run --on-failure continue` is admitted by
/// [`init_process_group`] itself (`group.joined_running()` says so).
pub fn admit_joiners(wait: std::time::Duration) -> Result<ProcessGroup> {
    SESSION.admit(wait)
}

/// Waits for every rank (bounded by the timeout), then forgets the default
/// group and the models wrapped over it; its connections close once the last
/// handle to it is dropped.
pub fn destroy_process_group() -> Result<()> {
    SESSION.destroy()
}

/// Time spent synchronising gradients so far, by every model of this process.
pub fn sync_stats() -> SyncStats {
    SESSION.sync_stats()
}

/// Starts [`sync_stats`] from zero.
pub fn reset_sync_stats() {
    SESSION.reset_sync_stats()
}
