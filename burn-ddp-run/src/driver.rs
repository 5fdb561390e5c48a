//! The launcher's I/O around the supervision machine: it sets the job up
//! (identity, store, the other machines, signal handlers), then does what
//! the machine asks (start workers, signal and kill them, ask and tell the
//! other machines, read the store, print the summary, ask the restart
//! policy) and tells it what it saw: every [`POLL`], one look at the running
//! round (a stop signal, the workers that exited), and each answer.

use crate::cli::{LaunchConfig, OnFailure};
use crate::cpu_binding;
use crate::error::LaunchError;
use crate::job::{self, host_store, JobIdentity};
use crate::membership;
use crate::peers::Peers;
use crate::processes::{self, Launch, Worker, POLL};
use crate::rounds::Policy;
use crate::signals;
use crate::summary::{print_summary, root_cause, Blames};
use crate::supervision::{Action, Event, Plan, Role, RoundFacts, Supervision};
use crate::worker_env;
use burn_ddp_rendezvous::job::keys::JobKeys;
use burn_ddp_rendezvous::store::StoreServer;
use std::collections::VecDeque;
use std::time::Instant;

/// Runs the job; returns the launcher's exit code.
pub fn run(config: &LaunchConfig) -> Result<i32, LaunchError> {
    let job = JobIdentity::for_job(config)?;
    // Node 0's launcher hosts the store, like torchrun's agent, so a worker that
    // dies early does not take it down with it; it serves every round.
    let store = if config.node_rank == 0 {
        Some(host_store(config, job.token.clone())?)
    } else {
        None
    };
    let master_port = store
        .as_ref()
        .map_or(config.master_port, |s| s.addr().port());
    let cpu_shares = cpu_binding::plan(config.cpu_bind, config.nproc_per_node);
    let cpus_each = cpu_shares.as_ref().map(|shares| shares.of(0).len());
    let defaults = worker_env::defaults(config, cpus_each);
    // Several machines that restart agree on each round through the store
    // (reached before the signal handlers go in: a Ctrl-C while node 0 is
    // awaited simply ends the launcher).
    // Under `--on-failure continue` each machine's launcher supervises its
    // own workers: a failure elsewhere is the workers' to go on from.
    let restarts_together = config.on_failure == OnFailure::Stop && config.max_restarts > 0;
    let peers = if config.nnodes > 1 && restarts_together {
        Some(Peers::connect(
            &config.master_addr,
            master_port,
            job.token.as_ref(),
            config.node_rank,
            config.nnodes,
            &job.id,
            config.shutdown_timeout,
        )?)
    } else {
        None
    };
    let membership = membership::find(config, &job, master_port)?;
    if membership.rejoining {
        log::info!(
            "job {} is running without this machine: its workers join it at its next step and \
             take the state from a rank there (--on-failure continue)",
            job.id
        );
    }
    signals::install();
    let driver = Driver {
        launch: Launch {
            config,
            job: &job,
            master_port,
            defaults: &defaults,
            cpu_shares: cpu_shares.as_ref(),
            membership,
        },
        store: store.as_ref(),
        peers: peers.as_ref(),
        policy: Policy::new(config.max_restarts),
        workers: Vec::new(),
        replaced: Vec::new(),
    };
    driver.supervise()
}

/// Everything the machine's actions are done with.
struct Driver<'a> {
    launch: Launch<'a>,
    /// The store, on node 0.
    store: Option<&'a StoreServer>,
    /// The other machines' launchers, when several machines restart.
    peers: Option<&'a Peers>,
    policy: Policy,
    /// The round's worker processes, in the machine's order.
    workers: Vec<Worker>,
    /// Workers of the round that replacements took the place of: cleaned
    /// up with the round (their output, their shared memory).
    replaced: Vec<Worker>,
}

impl Driver<'_> {
    /// Feeds the machine until the job is over.
    fn supervise(mut self) -> Result<i32, LaunchError> {
        let (mut machine, first) = Supervision::new(self.plan());
        self.perform(&mut machine, first);
        // Every question is answered at once, so the machine is either
        // watching a round or finished.
        while machine.watching() {
            let round = machine.round();
            let look = self.look(&machine);
            let actions = machine.step(Instant::now(), look);
            self.perform(&mut machine, actions);
            // A round that just started is looked at at once.
            if machine.watching() && machine.round() == round {
                std::thread::sleep(POLL);
            }
        }
        machine
            .into_outcome()
            .expect("a machine no longer watching is finished")
    }

    fn plan(&self) -> Plan {
        let config = self.launch.config;
        let role = match (self.peers, config.node_rank) {
            (None, _) => Role::Alone,
            (Some(_), 0) => Role::Leader,
            (Some(_), _) => Role::Follower,
        };
        Plan {
            node_rank: self.launch.membership.index,
            nproc_per_node: config.nproc_per_node,
            max_restarts: config.max_restarts,
            on_failure: config.on_failure,
            machines: config.nnodes,
            shutdown_timeout: config.shutdown_timeout,
            role,
        }
    }

    /// A stop signal, then the workers that have exited since the last look,
    /// and those found stopped (SIGSTOP).
    fn look(&mut self, machine: &Supervision) -> Event {
        let signal = signals::take();
        let mut exits = Vec::new();
        let mut stopped = Vec::new();
        for (i, (worker, state)) in self.workers.iter_mut().zip(machine.workers()).enumerate() {
            if !state.running() {
                continue;
            }
            match worker.child.try_wait() {
                Ok(Some(status)) => exits.push((i, status)),
                _ if processes::is_stopped(worker.pid) => stopped.push(i),
                _ => {}
            }
        }
        Event::Look {
            signal,
            exits,
            stopped,
        }
    }

    /// Does `actions` in order; an answer goes back to the machine at once,
    /// and what it asks for then is done after them.
    fn perform(&mut self, machine: &mut Supervision, actions: Vec<Action>) {
        let mut queue = VecDeque::from(actions);
        while let Some(action) = queue.pop_front() {
            if let Some(answer) = self.execute(machine, action) {
                queue.extend(machine.step(Instant::now(), answer));
            }
        }
    }

    /// Does one action; returns the event that answers it, if it is a question.
    fn execute(&mut self, machine: &Supervision, action: Action) -> Option<Event> {
        let answer = match action {
            Action::StartRound { round } => self.start_round(round),
            Action::PollPeers { round } => {
                Event::PeerReport(self.peers.and_then(|peers| peers.failure(round)))
            }
            Action::Assess { round, ask_peers } => self.assess(round, ask_peers),
            Action::Decide { round, failure } => Event::Verdict(self.policy.after(round, &failure)),
            Action::AwaitVerdict { round } => self.await_verdict(round),
            Action::Signal { worker, signal } => {
                signals::send(self.workers[worker].pid, signal);
                return None;
            }
            Action::Kill { worker } => {
                let _ = self.workers[worker].child.kill();
                return None;
            }
            Action::Say(notice) => {
                log::log!(notice.level(), "{notice}");
                return None;
            }
            Action::Report {
                round,
                what,
                interrupted,
            } => {
                if let Some(peers) = self.peers {
                    peers.report(round, &what, interrupted);
                }
                return None;
            }
            Action::CleanUp => {
                processes::clean_up(&mut self.workers);
                processes::clean_up(&mut std::mem::take(&mut self.replaced));
                return None;
            }
            Action::Replace { round, worker } => {
                let local_rank = machine.workers()[worker].local_rank;
                match processes::start_replacement(&self.launch, round, local_rank) {
                    Ok((began, started)) => {
                        let pid = started.pid;
                        let old = std::mem::replace(&mut self.workers[worker], started);
                        self.replaced.push(old);
                        Event::Replaced { worker, began, pid }
                    }
                    Err(err) => Event::ReplaceFailed {
                        worker,
                        error: err.to_string(),
                    },
                }
            }
            Action::PrintSummary {
                round,
                first,
                numbered,
            } => {
                self.print_summary(machine, round, first, numbered);
                return None;
            }
            Action::Publish { round, verdict } => {
                if let Some(peers) = self.peers {
                    peers.publish(round, &verdict);
                }
                return None;
            }
        };
        Some(answer)
    }

    fn start_round(&mut self, round: u32) -> Event {
        match processes::start_round(&self.launch, round) {
            Ok((began, workers)) => {
                let pids = workers.iter().map(|w| w.pid).collect();
                self.workers = workers;
                Event::Started { began, pids }
            }
            Err(err) => Event::StartFailed(err),
        }
    }

    fn keys(&self, round: u32) -> JobKeys {
        JobKeys::new(&self.launch.job.id, round as usize)
    }

    fn print_summary(&self, machine: &Supervision, round: u32, first: usize, numbered: bool) {
        let blames = Blames {
            store: self.store,
            keys: self.keys(round),
        };
        let workers = machine.workers();
        let root = root_cause(workers[first].rank, &blames.read());
        print_summary(workers, first, root, numbered.then_some(round));
    }

    /// What the store says of failed round `round`.
    fn assess(&self, round: u32, ask_peers: bool) -> Event {
        let config = self.launch.config;
        let keys = self.keys(round);
        Event::Assessed(RoundFacts {
            formed: job::formed(
                self.store,
                &keys,
                self.launch.membership.machines * config.nproc_per_node,
            ),
            duplicate: job::duplicate(self.store, &keys),
            interrupted_elsewhere: ask_peers
                && self.peers.is_some_and(|peers| peers.interrupted(round)),
        })
    }

    fn await_verdict(&self, round: u32) -> Event {
        let peers = self
            .peers
            .expect("only a machine with peers follows node 0");
        match peers.verdict(round) {
            Ok(verdict) => Event::Verdict(verdict),
            Err(err) => Event::NoVerdict(err),
        }
    }
}
