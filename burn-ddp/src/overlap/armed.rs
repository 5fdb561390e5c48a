//! Whether this process overlaps at all, and whether the coming backward
//! runs a collective of its own: facts the forward pass's ops and
//! SyncBatchNorm's tracked sum set, kept apart so those need nothing else
//! of the overlap.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once a model is wrapped with `overlap_backward` over a group that
/// synchronises: until then every op skips the overlap's bookkeeping.
static ARMED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// A collective that runs inside backward was recorded on this thread.
    static COLLECTIVE_INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// From now on, `Ddp<B>`'s ops report their inputs.
pub(crate) fn arm() {
    ARMED.store(true, Ordering::Relaxed);
}

pub(crate) fn is_armed() -> bool {
    ARMED.load(Ordering::Relaxed)
}

/// A collective that runs inside backward (SyncBatchNorm's sum) was
/// recorded on this thread: no bucket may leave early in the coming backward.
pub(crate) fn note_collective() {
    if is_armed() {
        COLLECTIVE_INSIDE.with(|c| c.set(true));
    }
}

/// Whether one was recorded since the last call.
pub(crate) fn take_collective() -> bool {
    COLLECTIVE_INSIDE.with(|c| c.replace(false))
}
