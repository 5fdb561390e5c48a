//! The machine's vocabulary: the events it takes in, the actions it asks
//! the driver for, and what it says on the way.

use crate::error::LaunchError;
use crate::peers::RoundReport;
use crate::rounds::{Failure, Verdict};
use crate::signals;
use burn_ddp_rendezvous::env::FORCE_STOP_AFTER;
use std::fmt;
use std::process::ExitStatus;
use std::time::Instant;

/// What the driver saw.
#[derive(Debug)]
pub(crate) enum Event {
    /// Every worker of the round was started, these pids in local-rank order;
    /// `began`: just before the first.
    Started {
        /// When the round began.
        began: Instant,
        /// The workers' process ids.
        pids: Vec<u32>,
    },
    /// A worker could not be started (the driver stopped those before it).
    StartFailed(LaunchError),
    /// One look at the running round: the stop signal received since the
    /// last look, if any, then the workers found exited (indices).
    Look {
        /// SIGINT or SIGTERM to the launcher.
        signal: Option<i32>,
        /// Workers that ended since the last look.
        exits: Vec<(usize, ExitStatus)>,
        /// Workers found stopped (SIGSTOP), not running.
        stopped: Vec<usize>,
    },
    /// Another machine's report of the round, or none (answers
    /// [`Action::PollPeers`]).
    PeerReport(Option<RoundReport>),
    /// The store's facts on the failed round (answers [`Action::Assess`]).
    Assessed(RoundFacts),
    /// What follows the failed round (answers [`Action::Decide`] and
    /// [`Action::AwaitVerdict`]).
    Verdict(Verdict),
    /// No verdict could be had (answers [`Action::AwaitVerdict`]).
    NoVerdict(LaunchError),
    /// A replacement for worker `worker` was started (answers
    /// [`Action::Replace`]).
    Replaced {
        /// The worker's index.
        worker: usize,
        /// When it was started.
        began: Instant,
        /// Its process id.
        pid: u32,
    },
    /// The replacement could not be started (answers [`Action::Replace`]).
    ReplaceFailed {
        /// The worker's index.
        worker: usize,
        /// Why.
        error: String,
    },
}

/// What the store says about a failed round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RoundFacts {
    /// Whether every rank joined the round's group.
    pub formed: bool,
    /// Why the group could not stand, when a rank was claimed twice.
    pub duplicate: Option<String>,
    /// Whether the user stopped the round on another machine.
    pub interrupted_elsewhere: bool,
}

/// What the driver is to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Start every worker of round `round`; answered by [`Event::Started`]
    /// or [`Event::StartFailed`].
    StartRound {
        /// The round (0 first).
        round: u32,
    },
    /// Send `signal` to worker `worker`.
    Signal {
        /// Its index.
        worker: usize,
        /// Which signal.
        signal: i32,
    },
    /// SIGKILL worker `worker`.
    Kill {
        /// Its index.
        worker: usize,
    },
    /// Log this.
    Say(Notice),
    /// Look for another machine's report of round `round`; answered by
    /// [`Event::PeerReport`].
    PollPeers {
        /// The round.
        round: u32,
    },
    /// Tell the other machines that round `round` failed here (`what`), or
    /// was interrupted here.
    Report {
        /// The round.
        round: u32,
        /// What happened, in words.
        what: String,
        /// Interrupted by the user rather than failed.
        interrupted: bool,
    },
    /// Every worker has ended: collect the rest of their output and remove
    /// the shared-memory segments of killed ones.
    CleanUp,
    /// Print round `round`'s failure table and root cause.
    PrintSummary {
        /// The round.
        round: u32,
        /// The worker that failed first.
        first: usize,
        /// Whether the table names the round (the job restarts).
        numbered: bool,
    },
    /// Read the store's facts on failed round `round` (and, when
    /// `ask_peers`, whether another machine was interrupted); answered by
    /// [`Event::Assessed`].
    Assess {
        /// The round.
        round: u32,
        /// Whether to ask the other machines too.
        ask_peers: bool,
    },
    /// Ask the restart policy what follows `failure`; answered by
    /// [`Event::Verdict`].
    Decide {
        /// The round.
        round: u32,
        /// How it failed.
        failure: Failure,
    },
    /// Node 0: tell the other machines what follows round `round`.
    Publish {
        /// The round.
        round: u32,
        /// What follows.
        verdict: Verdict,
    },
    /// Wait for node 0's verdict on round `round`; answered by
    /// [`Event::Verdict`] or [`Event::NoVerdict`].
    AwaitVerdict {
        /// The round.
        round: u32,
    },
    /// Start a replacement for worker `worker` of round `round`, which
    /// joins the workers still running; answered by [`Event::Replaced`] or
    /// [`Event::ReplaceFailed`].
    Replace {
        /// The round.
        round: u32,
        /// The worker's index.
        worker: usize,
    },
}

/// What the launcher says as it supervises (the words are the tests').
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Notice {
    /// Round `round` starts after a failure.
    Restarting {
        /// The new round.
        round: u32,
        /// `--max-restarts`.
        max_restarts: u32,
    },
    /// Round `round` (after restarts) succeeded.
    Succeeded {
        /// The round.
        round: u32,
    },
    /// The user's first stop signal goes to the workers.
    Forwarding {
        /// Which.
        signal: i32,
    },
    /// A second stop signal within [`FORCE_STOP_AFTER`]: the same request.
    DoubleTap {
        /// Which.
        signal: i32,
    },
    /// A later second stop signal: the workers are killed.
    KillingNow {
        /// Which.
        signal: i32,
    },
    /// Under `--on-failure continue`: a worker failed, the others go on.
    WorkerLost {
        /// The round.
        round: u32,
        /// Its rank.
        rank: usize,
        /// How it ended.
        how: String,
    },
    /// Under `--on-failure continue`: the job finished without these ranks.
    FinishedWithout {
        /// The ranks that failed on the way.
        ranks: Vec<usize>,
        /// How many replacements were started for them.
        replaced: u32,
    },
    /// Under `--on-failure continue` with restarts left: a replacement for
    /// `rank` is started, to join the others at their next step.
    Replacing {
        /// The rank it replaces.
        rank: usize,
        /// Restarts used, this one included.
        used: u32,
        /// `--max-restarts`.
        max_restarts: u32,
    },
    /// Under `--on-failure continue` on several machines: every worker here
    /// failed; the job may go on on the others.
    MachineLeft,
    /// Under `--on-failure continue`: the others finished, and this worker
    /// stayed stopped (SIGSTOP) for the shutdown timeout: it is killed.
    StoppedLeftBehind {
        /// Its rank.
        rank: usize,
        /// How long it has been stopped.
        stopped_for: std::time::Duration,
    },
    /// Under `--on-failure continue` on several machines: every worker on
    /// node 0 failed, and its launcher hosts the store: the job ends.
    StoreHostLeft,
    /// A failed round is not restarted: replacements used the restarts.
    NoRestartsLeft {
        /// Restarts used.
        used: u32,
        /// How many of them were replacements.
        replaced: u32,
    },
    /// A replacement could not be started; the others go on without it.
    ReplaceFailed {
        /// The rank it was to replace.
        rank: usize,
        /// Why.
        error: String,
    },
    /// Another machine reported the round's failure.
    PeerFailed {
        /// The round.
        round: u32,
        /// Its report.
        report: RoundReport,
    },
}

impl Notice {
    /// The level it is logged at.
    pub fn level(&self) -> log::Level {
        match self {
            Self::KillingNow { .. }
            | Self::WorkerLost { .. }
            | Self::ReplaceFailed { .. }
            | Self::StoppedLeftBehind { .. } => log::Level::Warn,
            Self::NoRestartsLeft { .. } | Self::MachineLeft | Self::StoreHostLeft => {
                log::Level::Error
            }
            _ => log::Level::Info,
        }
    }
}

impl fmt::Display for Notice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Restarting {
                round,
                max_restarts,
            } => write!(
                f,
                "starting every worker again: round {round}, restart {round} of {max_restarts}"
            ),
            Self::Succeeded { round } => write!(
                f,
                "the job succeeded in round {round}, after {round} restart(s)"
            ),
            Self::Forwarding { signal } => write!(
                f,
                "received {}, passing it to the workers (a program that catches it stops \
                 after its current step; another one kills the workers at once)",
                signals::name(*signal)
            ),
            Self::DoubleTap { signal } => write!(
                f,
                "received {} again within {}s of the first: one request; press Ctrl-C \
                 again later to kill the workers at once",
                signals::name(*signal),
                FORCE_STOP_AFTER.as_secs_f64()
            ),
            Self::KillingNow { signal } => write!(
                f,
                "received {} again: killing the workers (a save under way is cut short: \
                 a file written in place is left incomplete; one written to a temporary \
                 file and renamed, as burn-ddp saves, is left as it was)",
                signals::name(*signal)
            ),
            Self::WorkerLost { round, rank, how } => write!(
                f,
                "rank {rank} ended ({how}) in round {round}; the other workers go on without it \
                 (--on-failure continue)"
            ),
            Self::FinishedWithout { ranks, replaced: 0 } => write!(
                f,
                "the job finished without rank(s) {}, which failed on the way (--on-failure \
                 continue)",
                list(ranks)
            ),
            Self::FinishedWithout { ranks, replaced } => write!(
                f,
                "the job finished; rank(s) {} failed on the way and {replaced} replacement(s) \
                 started (--on-failure continue)",
                list(ranks)
            ),
            Self::Replacing {
                rank,
                used,
                max_restarts,
            } => write!(
                f,
                "starting a replacement for rank {rank} (restart {used} of {max_restarts}); it \
                 joins the others at their next step and takes the state from one of them"
            ),
            Self::StoppedLeftBehind { rank, stopped_for } => write!(
                f,
                "rank {rank} has been stopped (SIGSTOP) for {:.0}s and the others finished \
                 without it: killing it (--on-failure continue)",
                stopped_for.as_secs_f64()
            ),
            Self::StoreHostLeft => write!(
                f,
                "every worker on node 0 failed; this launcher hosts the job's store, so the \
                 job ends here (the other machines' ranks end within their timeout)"
            ),
            Self::MachineLeft => write!(
                f,
                "every worker on this machine failed; the job may go on on the other machines \
                 (--on-failure continue): start this launcher again, with the same command, and \
                 its workers join the job at its next step"
            ),
            Self::NoRestartsLeft { used, replaced } => write!(
                f,
                "no restarts left ({used} used, {replaced} of them replacements): the job failed \
                 with the root cause above"
            ),
            Self::ReplaceFailed { rank, error } => write!(
                f,
                "the replacement for rank {rank} could not be started ({error}); the others go \
                 on without it"
            ),
            Self::PeerFailed { round, report } => write!(
                f,
                "round {round} failed on another machine ({report}); stopping this \
                 machine's workers"
            ),
        }
    }
}

/// `1, 3`.
fn list(ranks: &[usize]) -> String {
    let ranks: Vec<String> = ranks.iter().map(usize::to_string).collect();
    ranks.join(", ")
}
