//! What a trainer stopped by Ctrl-C or SIGTERM reports, and how it exits.
//! Every rank asks `stop_requested` before each step, so all of them stop
//! before the same one.

/// Where training stopped.
#[derive(Debug, Clone, Copy)]
pub struct Stopped {
    /// The signal some rank received.
    pub signal: i32,
    /// 0-based epoch in progress.
    pub epoch: usize,
    /// Steps of that epoch already taken.
    pub step: usize,
}

impl Stopped {
    /// `SIGINT` or `SIGTERM`.
    pub fn signal_name(&self) -> String {
        signal_name(self.signal)
    }

    /// "Stopped by SIGINT: every rank stopped before step 3 of epoch 2".
    pub fn describe(&self) -> String {
        format!(
            "Stopped by {}: every rank stopped before step {} of epoch {}",
            self.signal_name(),
            self.step + 1,
            self.epoch + 1
        )
    }

    /// Each rank's line: "Rank 1 stopped by SIGINT before step 3 of epoch 2".
    pub fn rank_line(&self, rank: usize) -> String {
        format!(
            "Rank {rank} stopped by {} before step {} of epoch {}",
            self.signal_name(),
            self.step + 1,
            self.epoch + 1
        )
    }

    /// 128 + the signal, as a shell reports a program the signal ended.
    pub fn exit_code(&self) -> i32 {
        128 + self.signal
    }
}

/// `SIGINT` or `SIGTERM` (the only signals the libraries catch).
pub fn signal_name(signal: i32) -> String {
    match signal {
        2 => "SIGINT".into(),
        15 => "SIGTERM".into(),
        other => format!("signal {other}"),
    }
}
