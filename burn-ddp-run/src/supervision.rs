//! The launcher's supervision of a job as a state machine: events in,
//! actions out, and nothing else.
//!
//! [`Supervision::step`] takes what the driver saw, with the time it saw it
//! (the round's workers started; one look at the running round: a stop
//! signal and the workers found exited; another machine's report; the
//! store's facts on a failed round; the verdict on it) and returns what to do
//! (signal or kill a worker, say something, ask or tell the other machines,
//! print the summary, decide, start the next round). The driver does it and
//! feeds the answers back as events. The machine never reads the clock,
//! sleeps, or touches a process or the store, so each transition is tested
//! with made-up times.
//!
//! The job's [`Phase`] (starting a round, running, a failure held, stopping,
//! assessing, deciding, finished) is kept apart from the per-worker facts
//! ([`WorkerState`]: each worker's exit recorded on its own), and the round
//! is an explicit field. Elastic membership extends this without a rewrite:
//! replacing worker `i` is one more action answered by one more event that
//! resets `workers[i]` while the others keep running; a range of machines
//! makes the round's worker list change size between rounds; a machine
//! leaving or joining is one more event for the running phase.

mod events;

pub(crate) use events::{Action, Event, Notice, RoundFacts};

use crate::cli::OnFailure;
use crate::error::LaunchError;
use crate::peers::RoundReport;
use crate::rounds::{Failure, Verdict};
use crate::worker::{describe, exit_code, Exit, WorkerState};
use burn_ddp_rendezvous::env::FORCE_STOP_AFTER;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

/// How often a launcher of several machines looks for another's failure.
pub(crate) const PEER_POLL: Duration = Duration::from_millis(200);

/// How long a launcher whose worker failed waits for another machine's
/// report of the same round before reporting its own.
pub(crate) const PEER_GRACE: Duration = Duration::from_millis(500);

/// How often it looks for that report during the wait.
pub(crate) const GRACE_POLL: Duration = Duration::from_millis(20);

/// After a failure, when the other workers get a second SIGTERM (more than
/// burn-ddp's one second between two stop signals, so it forces the end).
pub(crate) const TERM_AGAIN_AFTER: Duration = Duration::from_secs(2);

/// How this machine's launcher takes part in what follows a failed round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// One machine, or a job that does not restart: its own policy decides.
    Alone,
    /// Node 0 of several machines that restart: decides, and tells the others.
    Leader,
    /// Another machine of several that restart: follows node 0's verdicts.
    Follower,
}

impl Role {
    /// Whether other machines' launchers are told of and tell of failures.
    fn has_peers(self) -> bool {
        self != Role::Alone
    }
}

/// What the machine needs to know of the launch.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// This machine's index.
    pub node_rank: usize,
    /// Workers on this machine.
    pub nproc_per_node: usize,
    /// `--max-restarts`.
    pub max_restarts: u32,
    /// `--on-failure`: whether the others go on without a failed worker.
    pub on_failure: OnFailure,
    /// `--nnodes`: machines in the job.
    pub machines: usize,
    /// `--shutdown-timeout`: from SIGTERM (or the user's signal) to SIGKILL.
    pub shutdown_timeout: Duration,
    /// How this machine decides what follows a failed round.
    pub role: Role,
}

/// Where the job stands.
#[derive(Debug)]
pub(crate) enum Phase {
    /// The round's workers are being started.
    Starting,
    /// The round runs and nothing has failed.
    Running {
        /// When to look for another machine's report next.
        next_peer_poll: Instant,
    },
    /// A worker here failed first, and this machine has other machines: the
    /// failure may only echo one there (these workers lost their peers), so
    /// it waits a moment for another machine's report of the round.
    Holding(Hold),
    /// The round's workers are being stopped.
    Stopping(Stop),
    /// Every worker of a failed round has ended; the store's facts on it
    /// are awaited.
    Assessing {
        /// The launcher's code for the round.
        code: i32,
        /// Whether the user stopped it here.
        interrupted: bool,
    },
    /// What follows the failed round is awaited.
    Deciding {
        /// How it failed.
        failure: Failure,
    },
    /// The job is over: the launcher's exit code, or why it could not go on.
    Finished(Result<i32, LaunchError>),
}

/// A failure held for [`PEER_GRACE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hold {
    /// The worker that failed.
    pub first: usize,
    /// When the wait ends.
    pub until: Instant,
    /// When to look for a report next.
    pub next_poll: Instant,
    /// A stop signal received meanwhile, handled when the wait ends: the
    /// workers get the failure's SIGTERM first, as they always have.
    pub deferred: Option<i32>,
}

/// Stopping the round's workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stop {
    /// Why.
    pub cause: Cause,
    /// The user's first stop signal, if any (whatever the cause, it makes
    /// the round interrupted).
    pub interrupt: Option<Interrupt>,
    /// When the workers still running are killed.
    pub kill_at: Instant,
    /// When they get a second SIGTERM (after a failure only).
    pub term_again_at: Option<Instant>,
}

/// Why a round's workers are being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// Worker `first` here failed first.
    Failed {
        /// Its index.
        first: usize,
    },
    /// Another machine's round failed.
    Peer,
    /// The user's stop signal (see [`Stop::interrupt`]).
    Interrupted,
}

/// The user's stop signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Interrupt {
    /// Which.
    pub signal: i32,
    /// When it came.
    pub at: Instant,
}

/// The supervision of one job on this machine.
#[derive(Debug)]
pub(crate) struct Supervision {
    plan: Plan,
    /// The round (0 first; `TORCHELASTIC_RESTART_COUNT`).
    round: u32,
    /// The round's workers, in local-rank order.
    workers: Vec<WorkerState>,
    /// Under `--on-failure continue`: the workers that failed while the
    /// others went on, in the order they failed.
    lost: Vec<Lost>,
    /// Replacements started so far, every round (each counts against
    /// `--max-restarts`, as a restart of the round does).
    replaced: u32,
    /// Since when each worker has been seen stopped (SIGSTOP), if it is.
    stopped_since: Vec<Option<Instant>>,
    /// Workers killed for staying stopped after the others finished: not
    /// failures of the job.
    left_behind: Vec<usize>,
    phase: Phase,
}

/// A worker that failed while the others went on.
#[derive(Debug, Clone, Copy)]
struct Lost {
    /// Its index.
    worker: usize,
    /// Its rank.
    rank: usize,
    /// When it was seen to end.
    at: Instant,
    /// How it ended (a replacement takes its place in `workers`).
    status: Option<ExitStatus>,
}

impl Supervision {
    /// A job about to start round 0, and the action that starts it.
    pub fn new(plan: Plan) -> (Self, Vec<Action>) {
        let machine = Self {
            plan,
            round: 0,
            workers: Vec::new(),
            lost: Vec::new(),
            replaced: 0,
            stopped_since: Vec::new(),
            left_behind: Vec::new(),
            phase: Phase::Starting,
        };
        (machine, vec![Action::StartRound { round: 0 }])
    }

    /// The round under way.
    pub fn round(&self) -> u32 {
        self.round
    }

    /// The round's workers.
    pub fn workers(&self) -> &[WorkerState] {
        &self.workers
    }

    /// Whether a round's workers are being watched ([`Event::Look`]).
    pub fn watching(&self) -> bool {
        matches!(
            self.phase,
            Phase::Running { .. } | Phase::Holding(_) | Phase::Stopping(_)
        )
    }

    /// The job's outcome, once it is finished.
    pub fn into_outcome(self) -> Option<Result<i32, LaunchError>> {
        match self.phase {
            Phase::Finished(outcome) => Some(outcome),
            _ => None,
        }
    }

    /// Takes in what the driver saw at `now`; returns what it is to do, in
    /// order. An event the phase does not expect changes nothing.
    pub fn step(&mut self, now: Instant, event: Event) -> Vec<Action> {
        let mut out = Vec::new();
        match event {
            Event::Started { began, pids } => self.started(now, began, pids),
            Event::StartFailed(err) if matches!(self.phase, Phase::Starting) => {
                self.phase = Phase::Finished(Err(err));
            }
            Event::Look {
                signal,
                exits,
                stopped,
            } => {
                self.note_stopped(now, &stopped);
                self.look(now, signal, exits, &mut out);
            }
            Event::PeerReport(report) => self.peer_report(now, report, &mut out),
            Event::Assessed(facts) => self.assessed(facts, &mut out),
            Event::Verdict(verdict) => self.verdict(verdict, &mut out),
            Event::NoVerdict(err) if matches!(self.phase, Phase::Deciding { .. }) => {
                self.phase = Phase::Finished(Err(err));
            }
            Event::Replaced { worker, began, pid } => self.replaced(worker, began, pid),
            Event::ReplaceFailed { worker, error } => {
                if let Some(w) = self.workers.get(worker) {
                    out.push(Action::Say(Notice::ReplaceFailed {
                        rank: w.rank,
                        error,
                    }));
                }
            }
            Event::StartFailed(_) | Event::NoVerdict(_) => {}
        }
        out
    }

    /// A replacement for worker `worker` runs: watched as the worker was.
    fn replaced(&mut self, worker: usize, began: Instant, pid: u32) {
        if let Some(w) = self.workers.get_mut(worker).filter(|w| !w.running()) {
            w.pid = pid;
            w.started = began;
            w.exit = None;
        }
    }

    /// Keeps since when each worker has been seen stopped.
    fn note_stopped(&mut self, now: Instant, stopped: &[usize]) {
        for (i, since) in self.stopped_since.iter_mut().enumerate() {
            if !stopped.contains(&i) {
                *since = None;
            } else if since.is_none() {
                *since = Some(now);
            }
        }
    }

    /// Under `--on-failure continue`, once a worker finished after the last
    /// failure (the others went on and are done), a worker that stayed
    /// stopped (SIGSTOP) for the shutdown timeout is killed: nobody will
    /// continue it, and the launcher would wait for it forever.
    fn kill_the_left_behind(&mut self, now: Instant, out: &mut Vec<Action>) {
        // The others go on without a stopped rank by themselves (it fails
        // nothing the launcher sees): one finished means they did, since a
        // group's ranks finish together.
        let last_failure = self.lost.iter().map(|l| l.at).max();
        let finished = self.workers.iter().any(|w| {
            w.exit
                .is_some_and(|e| e.status.success() && Some(w.started + e.after) >= last_failure)
        });
        if !finished {
            return;
        }
        let timeout = self.plan.shutdown_timeout;
        for (i, worker) in self.workers.iter().enumerate() {
            let Some(since) = self.stopped_since.get(i).copied().flatten() else {
                continue;
            };
            let stopped_for = now.saturating_duration_since(since);
            if worker.running() && stopped_for >= timeout && !self.left_behind.contains(&i) {
                self.left_behind.push(i);
                out.push(Action::Say(Notice::StoppedLeftBehind {
                    rank: worker.rank,
                    stopped_for,
                }));
                out.push(Action::Kill { worker: i });
            }
        }
    }

    /// Whether a restart is left for a replacement.
    fn may_replace(&self) -> bool {
        self.round + self.replaced < self.plan.max_restarts
    }

    fn started(&mut self, now: Instant, began: Instant, pids: Vec<u32>) {
        if !matches!(self.phase, Phase::Starting) {
            return;
        }
        let first_rank = self.plan.node_rank * self.plan.nproc_per_node;
        self.workers = pids
            .into_iter()
            .enumerate()
            .map(|(local_rank, pid)| WorkerState {
                rank: first_rank + local_rank,
                local_rank,
                pid,
                started: began,
                exit: None,
            })
            .collect();
        // Replacements count against --max-restarts across rounds.
        self.lost.clear();
        self.stopped_since = vec![None; self.workers.len()];
        self.left_behind.clear();
        self.phase = Phase::Running {
            next_peer_poll: now + PEER_POLL,
        };
    }

    /// One look at the running round: the signal, then the exits, then the
    /// other machines, then the timers, as the launcher has always looked.
    fn look(
        &mut self,
        now: Instant,
        signal: Option<i32>,
        exits: Vec<(usize, ExitStatus)>,
        out: &mut Vec<Action>,
    ) {
        if !self.watching() {
            return;
        }
        if let Some(signal) = signal {
            self.signal(now, signal, out);
        }
        let failed = self.record(now, exits);
        let round = self.round;
        let peers = self.plan.role.has_peers();
        let go_on = self.plan.on_failure == OnFailure::Continue;
        let failed: Vec<usize> = failed
            .into_iter()
            .filter(|i| !self.left_behind.contains(i))
            .collect();
        if go_on && matches!(self.phase, Phase::Running { .. }) {
            self.kill_the_left_behind(now, out);
        }
        match (&mut self.phase, failed.first().copied()) {
            (Phase::Running { .. }, Some(_)) if go_on => self.go_on_without(now, &failed, out),
            (Phase::Running { .. }, Some(first)) if peers => {
                // It may only echo a failure on another machine; that
                // machine's report, if it comes within the grace, is the
                // round's root cause. The first question goes out now.
                self.phase = Phase::Holding(Hold {
                    first,
                    until: now + PEER_GRACE,
                    next_poll: now,
                    deferred: None,
                });
                out.push(Action::PollPeers { round });
                return;
            }
            (Phase::Running { .. }, Some(first)) => self.stop(now, Cause::Failed { first }, out),
            (Phase::Running { next_peer_poll }, None) if peers && now >= *next_peer_poll => {
                *next_peer_poll = now + PEER_POLL;
                // The rest of this look follows the answer.
                out.push(Action::PollPeers { round });
                return;
            }
            (Phase::Holding(hold), _) => {
                if now >= hold.next_poll || now >= hold.until {
                    out.push(Action::PollPeers { round });
                }
                return;
            }
            _ => {}
        }
        self.timers(now, out);
    }

    /// Under `--on-failure continue`, workers `failed` ended in failure:
    /// the others go on without them (said while there are others; the end
    /// says the rest), and each is replaced while restarts are left.
    fn go_on_without(&mut self, now: Instant, failed: &[usize], out: &mut Vec<Action>) {
        let round = self.round;
        let others = self.workers.iter().any(WorkerState::running);
        for &i in failed {
            let worker = &self.workers[i];
            let rank = worker.rank;
            self.lost.push(Lost {
                worker: i,
                rank,
                at: now,
                status: worker.exit.map(|e| e.status),
            });
            if !others {
                continue;
            }
            let how = worker
                .exit
                .map_or_else(|| "ended".into(), |e| describe(e.status));
            out.push(Action::Say(Notice::WorkerLost { round, rank, how }));
            if self.may_replace() {
                self.replaced += 1;
                out.push(Action::Say(Notice::Replacing {
                    rank,
                    used: self.round + self.replaced,
                    max_restarts: self.plan.max_restarts,
                }));
                out.push(Action::Replace { round, worker: i });
            }
        }
    }

    /// Records the exits seen; returns the workers that failed in it, when
    /// the round was running without a failure (non-zero exits in
    /// local-rank order). Workers that end while being stopped (for the
    /// user or another machine) are not this machine's failure.
    fn record(&mut self, now: Instant, exits: Vec<(usize, ExitStatus)>) -> Vec<usize> {
        let mut failed = Vec::new();
        for (i, status) in exits {
            let Some(worker) = self.workers.get_mut(i).filter(|w| w.running()) else {
                continue;
            };
            worker.exit = Some(Exit {
                status,
                after: now.saturating_duration_since(worker.started),
            });
            if !status.success() && matches!(self.phase, Phase::Running { .. }) {
                failed.push(i);
            }
        }
        failed
    }

    /// The user's stop signal: the first goes to the workers, a second
    /// within [`FORCE_STOP_AFTER`] is the same request (a double tap: the
    /// workers count it as one too, and killing now would cut short the
    /// save the first asked for), a later one kills them at once.
    fn signal(&mut self, now: Instant, signal: i32, out: &mut Vec<Action>) {
        let timeout = self.plan.shutdown_timeout;
        match &mut self.phase {
            Phase::Running { .. } => {
                forward(&self.workers, signal, out);
                self.phase = Phase::Stopping(Stop {
                    cause: Cause::Interrupted,
                    interrupt: Some(Interrupt { signal, at: now }),
                    kill_at: now + timeout,
                    term_again_at: None,
                });
                if self.plan.role.has_peers() {
                    out.push(Action::Report {
                        round: self.round,
                        what: "the launcher got a stop signal".into(),
                        interrupted: true,
                    });
                }
            }
            Phase::Holding(hold) => hold.deferred = Some(signal),
            Phase::Stopping(stop) => match stop.interrupt {
                Some(first) if now.saturating_duration_since(first.at) < FORCE_STOP_AFTER => {
                    out.push(Action::Say(Notice::DoubleTap { signal }));
                }
                // Stopping for a failure: the workers get the signal too,
                // within the kill time already set.
                None => {
                    forward(&self.workers, signal, out);
                    stop.interrupt = Some(Interrupt { signal, at: now });
                }
                Some(_) => {
                    // The user insists: do not wait for a graceful stop.
                    out.push(Action::Say(Notice::KillingNow { signal }));
                    stop.kill_at = now;
                }
            },
            _ => {}
        }
    }

    /// Another machine's report (or none), asked for by the last look.
    fn peer_report(&mut self, now: Instant, report: Option<RoundReport>, out: &mut Vec<Action>) {
        match (&mut self.phase, report) {
            (Phase::Running { .. }, None) => {}
            (Phase::Running { .. }, Some(report)) => self.stop_for_peer(now, report, out),
            (Phase::Holding(hold), None) if now < hold.until => {
                hold.next_poll = now + GRACE_POLL;
                return;
            }
            (Phase::Holding(hold), report) => {
                let hold = *hold;
                match report {
                    // That machine's failure is the round's root cause.
                    Some(report) => self.stop_for_peer(now, report, out),
                    None => {
                        out.push(self.failure_report(hold.first));
                        self.stop(now, Cause::Failed { first: hold.first }, out);
                    }
                }
                if let Some(signal) = hold.deferred {
                    self.signal(now, signal, out);
                }
            }
            _ => return,
        }
        self.timers(now, out);
    }

    /// Tells the other machines that worker `first` failed here first.
    fn failure_report(&self, first: usize) -> Action {
        let worker = &self.workers[first];
        let how = worker
            .exit
            .map_or_else(|| "ended".into(), |e| describe(e.status));
        Action::Report {
            round: self.round,
            what: format!("rank {} {how}", worker.rank),
            interrupted: false,
        }
    }

    fn stop_for_peer(&mut self, now: Instant, report: RoundReport, out: &mut Vec<Action>) {
        out.push(Action::Say(Notice::PeerFailed {
            round: self.round,
            report,
        }));
        self.stop(now, Cause::Peer, out);
    }

    /// Stops the running workers at once after a failure: they would
    /// otherwise wait out their timeouts. SIGCONT lets a stopped worker see
    /// the SIGTERM.
    fn stop(&mut self, now: Instant, cause: Cause, out: &mut Vec<Action>) {
        for (worker, _) in self.running() {
            out.push(Action::Signal {
                worker,
                signal: libc::SIGTERM,
            });
            out.push(Action::Signal {
                worker,
                signal: libc::SIGCONT,
            });
        }
        self.phase = Phase::Stopping(Stop {
            cause,
            interrupt: None,
            kill_at: now + self.plan.shutdown_timeout,
            term_again_at: Some(now + TERM_AGAIN_AFTER),
        });
    }

    /// The second SIGTERM, the end of the round, SIGKILL: the end of a look.
    fn timers(&mut self, now: Instant, out: &mut Vec<Action>) {
        if let Phase::Stopping(stop) = &mut self.phase {
            if stop.term_again_at.is_some_and(|at| now >= at) {
                // A program that catches SIGTERM (to stop after its step)
                // takes a second one, a while later, as "now": a rank busy
                // outside any collective does not hold the job until the
                // shutdown timeout.
                stop.term_again_at = None;
                forward_quietly(&self.workers, libc::SIGTERM, out);
            }
        }
        if self.workers.iter().all(|w| !w.running()) {
            self.end_round(out);
            return;
        }
        if let Phase::Stopping(stop) = &self.phase {
            if now >= stop.kill_at {
                out.extend(self.running().map(|(worker, _)| Action::Kill { worker }));
            }
        }
    }

    /// Every worker has ended: the round succeeded, or its failure is
    /// assessed.
    fn end_round(&mut self, out: &mut Vec<Action>) {
        out.push(Action::CleanUp);
        let (code, interrupted) = match &self.phase {
            Phase::Stopping(Stop {
                interrupt: Some(interrupt),
                ..
            }) => (128 + interrupt.signal, true),
            Phase::Stopping(Stop {
                cause: Cause::Failed { first },
                ..
            }) => {
                out.push(Action::PrintSummary {
                    round: self.round,
                    first: *first,
                    numbered: self.plan.max_restarts > 0,
                });
                let status = self.workers[*first].exit.map(|e| e.status);
                (status.map_or(1, exit_code), false)
            }
            // Stopped for another machine: the first non-zero code here;
            // workers that happened to finish still belong to a failed round.
            Phase::Stopping(_) => (self.first_failed_code().unwrap_or(1), false),
            // Under `--on-failure continue`, workers failed: the job
            // succeeded if the others finished, else the round failed.
            Phase::Running { .. } if !self.lost.is_empty() => {
                // A worker that finished after the last failure went on
                // without the lost ones; one that finished before did not
                // (the round's workers all started together).
                let last_failure = self.lost.iter().map(|l| l.at).max();
                let finished = self.workers.iter().any(|w| {
                    w.exit.is_some_and(|e| {
                        e.status.success() && Some(w.started + e.after) >= last_failure
                    })
                });
                let mut ranks: Vec<usize> = self.lost.iter().map(|l| l.rank).collect();
                ranks.dedup();
                if finished {
                    let replaced = self.replaced;
                    out.push(Action::Say(Notice::FinishedWithout { ranks, replaced }));
                    self.phase = Phase::Finished(Ok(0));
                    return;
                }
                let first = self.lost[0];
                out.push(Action::PrintSummary {
                    round: self.round,
                    first: first.worker,
                    numbered: self.plan.max_restarts > 0,
                });
                let code = first.status.map_or(1, exit_code);
                if self.plan.machines > 1 {
                    // The job may go on elsewhere (unless this launcher hosts
                    // its store); a round here alone would wait for a world
                    // that is not coming.
                    let notice = match self.plan.node_rank {
                        0 => Notice::StoreHostLeft,
                        _ => Notice::MachineLeft,
                    };
                    out.push(Action::Say(notice));
                    self.phase = Phase::Finished(Ok(code));
                    return;
                }
                (code, false)
            }
            _ => {
                if self.round > 0 {
                    out.push(Action::Say(Notice::Succeeded { round: self.round }));
                }
                self.phase = Phase::Finished(Ok(0));
                return;
            }
        };
        self.phase = Phase::Assessing { code, interrupted };
        out.push(Action::Assess {
            round: self.round,
            ask_peers: !interrupted && self.plan.role.has_peers(),
        });
    }

    fn first_failed_code(&self) -> Option<i32> {
        self.workers
            .iter()
            .filter_map(|w| w.exit.map(|e| exit_code(e.status)))
            .find(|code| *code != 0)
    }

    fn assessed(&mut self, facts: RoundFacts, out: &mut Vec<Action>) {
        let Phase::Assessing { code, interrupted } = self.phase else {
            return;
        };
        let failure = Failure {
            code,
            formed: facts.formed,
            duplicate: facts.duplicate,
            interrupted: interrupted || facts.interrupted_elsewhere,
        };
        let round = self.round;
        match self.plan.role {
            // The user stopped this machine: it does not wait for node 0.
            Role::Follower if failure.interrupted => {
                self.phase = Phase::Finished(Ok(failure.code));
                return;
            }
            Role::Follower => out.push(Action::AwaitVerdict { round }),
            Role::Alone | Role::Leader => out.push(Action::Decide {
                round,
                failure: failure.clone(),
            }),
        }
        self.phase = Phase::Deciding { failure };
    }

    fn verdict(&mut self, verdict: Verdict, out: &mut Vec<Action>) {
        let Phase::Deciding { failure } = &self.phase else {
            return;
        };
        let code = failure.code;
        let (round, max_restarts) = (self.round, self.plan.max_restarts);
        if self.plan.role == Role::Leader {
            out.push(Action::Publish {
                round,
                verdict: verdict.clone(),
            });
        }
        self.phase = match verdict {
            // Replacements spent the restarts a new round would need.
            Verdict::Restart if self.replaced > 0 && !self.may_replace() => {
                out.push(Action::Say(Notice::NoRestartsLeft {
                    used: round + self.replaced,
                    replaced: self.replaced,
                }));
                Phase::Finished(Ok(code))
            }
            Verdict::Restart if round == max_restarts => {
                Phase::Finished(Err(LaunchError::RestartsDiffer {
                    round: round + 1,
                    max_restarts,
                }))
            }
            Verdict::Restart => {
                self.round = round + 1;
                out.push(Action::Say(Notice::Restarting {
                    round: self.round,
                    max_restarts,
                }));
                out.push(Action::StartRound { round: self.round });
                Phase::Starting
            }
            Verdict::Stop(stop) => Phase::Finished(Ok(if code != 0 { code } else { stop })),
        };
    }

    /// The workers not yet seen to end, with their indices.
    fn running(&self) -> impl Iterator<Item = (usize, &WorkerState)> {
        self.workers.iter().enumerate().filter(|(_, w)| w.running())
    }
}

/// Passes the user's `signal` to every running worker, and says so.
fn forward(workers: &[WorkerState], signal: i32, out: &mut Vec<Action>) {
    out.push(Action::Say(Notice::Forwarding { signal }));
    forward_quietly(workers, signal, out);
}

/// Sends `signal` to every running worker.
fn forward_quietly(workers: &[WorkerState], signal: i32, out: &mut Vec<Action>) {
    for (worker, _) in workers.iter().enumerate().filter(|(_, w)| w.running()) {
        out.push(Action::Signal { worker, signal });
    }
}

#[cfg(test)]
mod tests;
