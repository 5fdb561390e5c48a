//! One worker as the launcher knows it: its place in the job, its process id
//! and how it ended, in words and as the launcher's exit code. Facts only;
//! the processes themselves are in `processes`.

use crate::signals;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

/// One worker of the round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WorkerState {
    /// Its global rank.
    pub rank: usize,
    /// Its rank on this machine.
    pub local_rank: usize,
    /// Its process id.
    pub pid: u32,
    /// When it was started (the summary's times count from here).
    pub started: Instant,
    /// How it ended, once it has.
    pub exit: Option<Exit>,
}

/// How and when a worker ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exit {
    /// What `wait` said.
    pub status: ExitStatus,
    /// How long after its start it was seen to end.
    pub after: Duration,
}

impl WorkerState {
    /// Whether it has not been seen to end yet.
    pub fn running(&self) -> bool {
        self.exit.is_none()
    }
}

/// How a worker ended, for the failure summary.
pub(crate) fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by {}", signals::name(signal)),
        _ => "ended".into(),
    }
}

/// The launcher's exit code for a worker's status: its code, or 128 + signal.
pub(crate) fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_in_words_and_codes() {
        let exited = ExitStatus::from_raw(3 << 8);
        assert_eq!(
            (describe(exited), exit_code(exited)),
            ("exit code 3".into(), 3)
        );
        let killed = ExitStatus::from_raw(libc::SIGKILL);
        assert_eq!(
            (describe(killed), exit_code(killed)),
            ("killed by SIGKILL".into(), 137)
        );
    }
}
