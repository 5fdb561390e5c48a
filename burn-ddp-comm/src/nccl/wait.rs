// Used by the `nccl` feature; compiled without it too, so CI tests it.
#![cfg_attr(not(feature = "nccl"), allow(dead_code))]

//! Waiting for GPU work without ever waiting forever.
//!
//! NCCL kernels spin until their peers arrive, so a dead peer would block
//! `cudaStreamSynchronize` for good. Instead we poll the stream and NCCL's
//! asynchronous error, and give up (aborting the communicator) at a deadline.

use std::time::{Duration, Instant};

/// Why GPU work failed: the driver's or NCCL's own error.
pub(crate) type Cause = Box<dyn std::error::Error + Send + Sync>;

/// What one look at the work found.
#[derive(Debug)]
pub(crate) enum Progress {
    /// Finished.
    Done,
    /// Still running.
    Pending,
    /// Failed, with the reason.
    Failed(Cause),
}

/// How waiting ended, when not with `Done`.
#[derive(Debug)]
pub(crate) enum WaitError {
    /// `poll` reported a failure.
    Failed(Cause),
    /// Still pending after `timeout`.
    TimedOut(Duration),
}

/// Calls `poll` until it is done or failed, or `timeout` has passed. Polls
/// eagerly at first (collectives on small buckets finish in microseconds),
/// then backs off to a sleep of at most a millisecond.
pub(crate) fn wait_bounded(
    timeout: Duration,
    mut poll: impl FnMut() -> Progress,
) -> Result<(), WaitError> {
    let started = Instant::now();
    let mut pause = Duration::ZERO;
    loop {
        match poll() {
            Progress::Done => return Ok(()),
            Progress::Failed(reason) => return Err(WaitError::Failed(reason)),
            Progress::Pending => {}
        }
        let waited = started.elapsed();
        if waited >= timeout {
            return Err(WaitError::TimedOut(waited));
        }
        if waited < Duration::from_micros(200) {
            std::thread::yield_now();
        } else {
            pause = (pause * 2).clamp(Duration::from_micros(10), Duration::from_millis(1));
            std::thread::sleep(pause);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn done_failed_and_timed_out() {
        let mut polls = 0;
        let done = wait_bounded(Duration::from_secs(5), || {
            polls += 1;
            if polls == 50 {
                Progress::Done
            } else {
                Progress::Pending
            }
        });
        assert!(done.is_ok() && polls == 50);
        let failed = wait_bounded(Duration::from_secs(5), || Progress::Failed("remote".into()));
        assert!(matches!(failed, Err(WaitError::Failed(why)) if why.to_string() == "remote"));
        let started = Instant::now();
        let timed_out = wait_bounded(Duration::from_millis(50), || Progress::Pending);
        assert!(matches!(timed_out, Err(WaitError::TimedOut(d)) if d >= Duration::from_millis(50)));
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
