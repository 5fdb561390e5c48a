//! Every transition of the supervision machine, with made-up times.

use super::*;
use libc::{SIGCONT, SIGINT, SIGKILL, SIGTERM};
use std::os::unix::process::ExitStatusExt;

const TIMEOUT: Duration = Duration::from_secs(30);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn code(code: i32) -> ExitStatus {
    ExitStatus::from_raw(code << 8)
}

fn killed(signal: i32) -> ExitStatus {
    ExitStatus::from_raw(signal)
}

fn plan(role: Role, max_restarts: u32) -> Plan {
    Plan {
        node_rank: 1,
        nproc_per_node: 3,
        max_restarts,
        on_failure: OnFailure::Stop,
        machines: 2,
        shutdown_timeout: TIMEOUT,
        role,
    }
}

/// Machine 1 of a job, its round 0 running 3 workers (ranks 3, 4, 5) since
/// `t0`.
fn running(role: Role, max_restarts: u32) -> (Supervision, Instant) {
    let (mut machine, start) = Supervision::new(plan(role, max_restarts));
    assert_eq!(start, [Action::StartRound { round: 0 }]);
    let t0 = Instant::now();
    let pids = vec![100, 101, 102];
    assert!(machine
        .step(t0, Event::Started { began: t0, pids })
        .is_empty());
    (machine, t0)
}

fn look(machine: &mut Supervision, at: Instant, exits: &[(usize, ExitStatus)]) -> Vec<Action> {
    let exits = exits.to_vec();
    machine.step(
        at,
        Event::Look {
            signal: None,
            exits,
            stopped: Vec::new(),
        },
    )
}

fn signal(machine: &mut Supervision, at: Instant, signal: i32) -> Vec<Action> {
    let event = Event::Look {
        signal: Some(signal),
        exits: Vec::new(),
        stopped: Vec::new(),
    };
    machine.step(at, event)
}

/// The failure's stop: SIGTERM and SIGCONT to each of `workers`.
fn term_cont(workers: &[usize]) -> Vec<Action> {
    let each = |&worker: &usize| [SIGTERM, SIGCONT].map(|signal| Action::Signal { worker, signal });
    workers.iter().flat_map(each).collect()
}

fn send(workers: &[usize], signal: i32) -> Vec<Action> {
    let each = |&worker: &usize| Action::Signal { worker, signal };
    workers.iter().map(each).collect()
}

fn kill(workers: &[usize]) -> Vec<Action> {
    workers
        .iter()
        .map(|&worker| Action::Kill { worker })
        .collect()
}

/// Round 0's question to the other machines.
fn poll() -> Action {
    Action::PollPeers { round: 0 }
}

fn say(notice: Notice) -> Action {
    Action::Say(notice)
}

fn stop(machine: &Supervision) -> Stop {
    match &machine.phase {
        Phase::Stopping(stop) => *stop,
        other => panic!("not stopping: {other:?}"),
    }
}

fn hold(machine: &Supervision) -> Hold {
    match &machine.phase {
        Phase::Holding(hold) => *hold,
        other => panic!("not holding: {other:?}"),
    }
}

/// Drives a machine whose worker 1 failed (exit 3, at `t1`) to its verdict.
fn failed_round(role: Role, max_restarts: u32) -> (Supervision, Instant) {
    let (mut machine, t0) = running(role, max_restarts);
    let t1 = t0 + ms(100);
    look(&mut machine, t1, &[(1, code(3))]);
    if role.has_peers() {
        machine.step(t1 + PEER_GRACE, Event::PeerReport(None));
    }
    let end = look(&mut machine, t1 + ms(600), &[(0, code(1)), (2, code(1))]);
    assert_eq!(
        end.last(),
        Some(&Action::Assess {
            round: 0,
            ask_peers: role.has_peers()
        })
    );
    let facts = RoundFacts {
        formed: true,
        ..RoundFacts::default()
    };
    let failure = Failure {
        code: 3,
        formed: true,
        duplicate: None,
        interrupted: false,
    };
    let expected = match role {
        Role::Follower => Action::AwaitVerdict { round: 0 },
        Role::Alone | Role::Leader => Action::Decide {
            round: 0,
            failure: failure.clone(),
        },
    };
    assert_eq!(
        machine.step(t1 + ms(601), Event::Assessed(facts)),
        [expected]
    );
    assert!(matches!(&machine.phase, Phase::Deciding { failure: f } if *f == failure));
    (machine, t1)
}

fn peer_report() -> RoundReport {
    RoundReport {
        machine: Some(0),
        interrupted: false,
        what: "rank 0 killed by SIGKILL".into(),
    }
}

#[test]
fn start_runs_round_0_and_a_start_failure_ends_the_job() {
    let (machine, t0) = running(Role::Alone, 0);
    assert!(
        matches!(&machine.phase, Phase::Running { next_peer_poll } if *next_peer_poll == t0 + PEER_POLL)
    );
    let places: Vec<_> = machine
        .workers()
        .iter()
        .map(|w| (w.rank, w.local_rank, w.pid, w.started, w.exit))
        .collect();
    assert_eq!(
        places,
        [
            (3, 0, 100, t0, None),
            (4, 1, 101, t0, None),
            (5, 2, 102, t0, None)
        ]
    );
    // A worker that cannot be started ends the job with why.
    let (mut machine, _) = Supervision::new(plan(Role::Alone, 3));
    assert!(!machine.watching());
    assert!(look(&mut machine, Instant::now(), &[]).is_empty());
    let err = LaunchError::Spawn {
        program: "./train".into(),
        rank: 4,
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    };
    assert!(machine
        .step(Instant::now(), Event::StartFailed(err))
        .is_empty());
    let outcome = machine.into_outcome().unwrap();
    assert!(matches!(outcome, Err(LaunchError::Spawn { rank: 4, .. })));
}

#[test]
fn a_round_whose_workers_all_exit_0_succeeds() {
    let (mut machine, t0) = running(Role::Alone, 0);
    assert!(look(&mut machine, t0 + ms(1500), &[(1, code(0))]).is_empty());
    assert_eq!(machine.workers()[1].exit.unwrap().after, ms(1500));
    let end = look(&mut machine, t0 + ms(1600), &[(0, code(0)), (2, code(0))]);
    assert_eq!(end, [Action::CleanUp]);
    assert!(matches!(machine.into_outcome(), Some(Ok(0))));
}

/// Round 0 running under `--on-failure continue` (machine 1: ranks 3-5).
fn going_on(max_restarts: u32) -> (Supervision, Instant) {
    let (mut machine, start) = Supervision::new(Plan {
        on_failure: OnFailure::Continue,
        machines: 1,
        ..plan(Role::Alone, max_restarts)
    });
    assert_eq!(start, [Action::StartRound { round: 0 }]);
    let t0 = Instant::now();
    let pids = vec![100, 101, 102];
    machine.step(t0, Event::Started { began: t0, pids });
    (machine, t0)
}

#[test]
fn going_on_a_failed_worker_is_said_and_the_others_finish_the_job() {
    let (mut machine, t0) = going_on(0);
    let lost = look(&mut machine, t0 + ms(100), &[(1, killed(SIGKILL))]);
    let rank_4 = Notice::WorkerLost {
        round: 0,
        rank: 4,
        how: describe(killed(SIGKILL)),
    };
    // Nobody is stopped.
    assert_eq!(lost, [say(rank_4)]);
    assert!(machine.watching());
    assert!(look(&mut machine, t0 + ms(900), &[(0, code(0))]).is_empty());
    let end = look(&mut machine, t0 + ms(1000), &[(2, code(0))]);
    let without = Notice::FinishedWithout {
        ranks: vec![4],
        replaced: 0,
    };
    assert_eq!(end, [Action::CleanUp, say(without)]);
    assert!(matches!(machine.into_outcome(), Some(Ok(0))));
}

/// What a failed worker's look says and asks for when it is replaced.
fn lost_and_replaced(rank: usize, worker: usize, used: u32, max_restarts: u32) -> Vec<Action> {
    vec![
        say(Notice::WorkerLost {
            round: 0,
            rank,
            how: describe(killed(SIGKILL)),
        }),
        say(Notice::Replacing {
            rank,
            used,
            max_restarts,
        }),
        Action::Replace { round: 0, worker },
    ]
}

#[test]
fn going_on_a_failed_worker_is_replaced_while_restarts_are_left() {
    let (mut machine, t0) = going_on(2);
    let lost = look(&mut machine, t0 + ms(100), &[(1, killed(SIGKILL))]);
    assert_eq!(lost, lost_and_replaced(4, 1, 1, 2));
    let began = t0 + ms(150);
    let replaced = Event::Replaced {
        worker: 1,
        began,
        pid: 200,
    };
    assert!(machine.step(began, replaced).is_empty());
    let worker = &machine.workers()[1];
    assert_eq!(
        (worker.pid, worker.started, worker.running()),
        (200, began, true)
    );
    // The replacement fails too: the last restart replaces it again.
    let again = look(&mut machine, t0 + ms(400), &[(1, killed(SIGKILL))]);
    assert_eq!(again, lost_and_replaced(4, 1, 2, 2));
    let replaced = Event::Replaced {
        worker: 1,
        began: t0 + ms(450),
        pid: 201,
    };
    machine.step(t0 + ms(450), replaced);
    // None is left for a third.
    let third = look(&mut machine, t0 + ms(600), &[(1, killed(SIGKILL))]);
    assert_eq!(third[..], lost_and_replaced(4, 1, 3, 2)[..1]);
    look(&mut machine, t0 + ms(900), &[(0, code(0))]);
    let end = look(&mut machine, t0 + ms(1000), &[(2, code(0))]);
    let finished = Notice::FinishedWithout {
        ranks: vec![4],
        replaced: 2,
    };
    assert_eq!(end, [Action::CleanUp, say(finished)]);
    assert!(matches!(machine.into_outcome(), Some(Ok(0))));
}

#[test]
fn going_on_a_replacement_that_finishes_counts_as_going_on() {
    let (mut machine, t0) = going_on(1);
    look(&mut machine, t0 + ms(100), &[(0, killed(SIGKILL))]);
    let began = t0 + ms(150);
    machine.step(
        began,
        Event::Replaced {
            worker: 0,
            began,
            pid: 300,
        },
    );
    // The others end (a failure after the replacement joined), and the
    // replacement finishes: the job went on.
    look(&mut machine, t0 + ms(500), &[(1, code(1)), (2, code(1))]);
    let end = look(&mut machine, t0 + ms(900), &[(0, code(0))]);
    let finished = Notice::FinishedWithout {
        ranks: vec![3, 4, 5],
        replaced: 1,
    };
    assert_eq!(end, [Action::CleanUp, say(finished)]);
}

#[test]
fn going_on_replacements_spend_the_restarts_a_new_round_would_need() {
    let (mut machine, t0) = going_on(1);
    look(&mut machine, t0 + ms(100), &[(2, killed(SIGKILL))]);
    machine.step(
        t0 + ms(150),
        Event::Replaced {
            worker: 2,
            began: t0 + ms(150),
            pid: 400,
        },
    );
    look(&mut machine, t0 + ms(200), &[(0, code(1)), (1, code(1))]);
    let end = look(&mut machine, t0 + ms(300), &[(2, code(1))]);
    assert_eq!(
        end.last(),
        Some(&Action::Assess {
            round: 0,
            ask_peers: false
        })
    );
    let facts = RoundFacts {
        formed: true,
        ..RoundFacts::default()
    };
    let decide = machine.step(t0 + ms(310), Event::Assessed(facts));
    assert!(
        matches!(decide[..], [Action::Decide { round: 0, .. }]),
        "{decide:?}"
    );
    let verdict = machine.step(t0 + ms(320), Event::Verdict(Verdict::Restart));
    let none_left = Notice::NoRestartsLeft {
        used: 1,
        replaced: 1,
    };
    assert_eq!(verdict, [say(none_left)]);
    assert!(matches!(machine.into_outcome(), Some(Ok(137))));
}

#[test]
fn going_on_on_several_machines_a_machine_whose_workers_all_failed_leaves() {
    let (mut machine, start) = Supervision::new(Plan {
        on_failure: OnFailure::Continue,
        ..plan(Role::Alone, 3)
    });
    assert_eq!(start, [Action::StartRound { round: 0 }]);
    let t0 = Instant::now();
    let pids = vec![100, 101, 102];
    machine.step(t0, Event::Started { began: t0, pids });
    // The link is cut: every worker here fails; no replacement, no round.
    let all = [(0, code(1)), (1, code(1)), (2, code(1))];
    let end = look(&mut machine, t0 + ms(100), &all);
    let summary = Action::PrintSummary {
        round: 0,
        first: 0,
        numbered: true,
    };
    assert_eq!(end, [Action::CleanUp, summary, say(Notice::MachineLeft)]);
    assert!(matches!(machine.into_outcome(), Some(Ok(1))));
}

#[test]
fn going_on_on_several_machines_node_0_whose_workers_all_failed_ends_the_job() {
    let (mut machine, _) = Supervision::new(Plan {
        on_failure: OnFailure::Continue,
        node_rank: 0,
        ..plan(Role::Alone, 3)
    });
    let t0 = Instant::now();
    let pids = vec![100, 101, 102];
    machine.step(t0, Event::Started { began: t0, pids });
    let all = [(0, code(1)), (1, code(1)), (2, code(1))];
    let end = look(&mut machine, t0 + ms(100), &all);
    // It hosts the store: no offer to rejoin, the job ends.
    assert_eq!(end.last(), Some(&say(Notice::StoreHostLeft)));
    assert!(matches!(machine.into_outcome(), Some(Ok(1))));
}

#[test]
fn going_on_a_worker_stopped_forever_is_killed_once_the_others_finished() {
    let (mut machine, t0) = going_on(0);
    let stopped = |machine: &mut Supervision, at, exits: &[(usize, ExitStatus)]| {
        let look = Event::Look {
            signal: None,
            exits: exits.to_vec(),
            stopped: vec![1],
        };
        machine.step(at, look)
    };
    // Rank 4 is stopped; the others time out on it and go on without it
    // (a failure of theirs here would be a restart: they reform instead).
    assert!(stopped(&mut machine, t0 + ms(100), &[]).is_empty());
    // Nobody finished yet: a stopped worker is left alone, however long (it
    // may be continued).
    assert!(stopped(&mut machine, t0 + ms(100) + 2 * TIMEOUT, &[]).is_empty());
    // The others finish: it has been stopped past the shutdown timeout, so
    // it is killed at once.
    let t1 = t0 + ms(200) + 2 * TIMEOUT;
    let killed = stopped(&mut machine, t1, &[(0, code(0)), (2, code(0))]);
    let notice = Notice::StoppedLeftBehind {
        rank: 4,
        stopped_for: ms(100) + 2 * TIMEOUT,
    };
    assert_eq!(killed, [say(notice), Action::Kill { worker: 1 }]);
    // Its end is not the job's failure.
    let end = look(&mut machine, t1 + ms(20), &[(1, killed_status())]);
    assert_eq!(end, [Action::CleanUp]);
    assert!(matches!(machine.into_outcome(), Some(Ok(0))));
}

fn killed_status() -> ExitStatus {
    killed(SIGKILL)
}

#[test]
fn a_replacement_that_cannot_start_is_said_and_the_others_go_on() {
    let (mut machine, t0) = going_on(1);
    look(&mut machine, t0 + ms(100), &[(1, killed(SIGKILL))]);
    let failed = Event::ReplaceFailed {
        worker: 1,
        error: "no such program".into(),
    };
    let said = machine.step(t0 + ms(110), failed);
    let notice = Notice::ReplaceFailed {
        rank: 4,
        error: "no such program".into(),
    };
    assert_eq!(said, [say(notice)]);
    assert!(machine.watching());
}

#[test]
fn going_on_a_worker_that_finished_before_the_failures_did_not_go_on() {
    let (mut machine, t0) = going_on(0);
    assert!(look(&mut machine, t0 + ms(100), &[(2, code(0))]).is_empty());
    look(&mut machine, t0 + ms(200), &[(1, killed(SIGKILL))]);
    let end = look(&mut machine, t0 + ms(300), &[(0, code(1))]);
    assert_eq!(
        end.last(),
        Some(&Action::Assess {
            round: 0,
            ask_peers: false
        })
    );
}

#[test]
fn going_on_when_every_worker_fails_the_round_failed_from_the_first() {
    let (mut machine, t0) = going_on(1);
    look(&mut machine, t0 + ms(100), &[(2, killed(SIGKILL))]);
    let later = look(&mut machine, t0 + ms(200), &[(0, code(1))]);
    assert_eq!(later.len(), 1, "{later:?}");
    let end = look(&mut machine, t0 + ms(300), &[(1, code(1))]);
    let summary = Action::PrintSummary {
        round: 0,
        first: 2,
        numbered: true,
    };
    let assess = Action::Assess {
        round: 0,
        ask_peers: false,
    };
    assert_eq!(end, [Action::CleanUp, summary, assess]);
    assert!(matches!(
        &machine.phase,
        Phase::Assessing {
            code: 137,
            interrupted: false
        }
    ));
}

#[test]
fn a_failing_worker_stops_the_others_at_once() {
    let (mut machine, t0) = running(Role::Alone, 0);
    let t1 = t0 + ms(100);
    // Two failures in one look: the first in local-rank order is the first.
    let actions = look(&mut machine, t1, &[(1, code(3)), (2, killed(SIGKILL))]);
    assert_eq!(actions, term_cont(&[0]));
    let expected = Stop {
        cause: Cause::Failed { first: 1 },
        interrupt: None,
        kill_at: t1 + TIMEOUT,
        term_again_at: Some(t1 + TERM_AGAIN_AFTER),
    };
    assert_eq!(stop(&machine), expected);
    // A worker stopped for it is not a failure of its own.
    let end = look(&mut machine, t1 + ms(50), &[(0, killed(SIGTERM))]);
    let summary = Action::PrintSummary {
        round: 0,
        first: 1,
        numbered: false,
    };
    let assess = Action::Assess {
        round: 0,
        ask_peers: false,
    };
    assert_eq!(end, [Action::CleanUp, summary, assess]);
    assert!(matches!(
        &machine.phase,
        Phase::Assessing {
            code: 3,
            interrupted: false
        }
    ));
}

#[test]
fn a_stopping_round_gets_a_second_sigterm_then_sigkill() {
    let (mut machine, t0) = running(Role::Alone, 0);
    let t1 = t0 + ms(100);
    look(&mut machine, t1, &[(1, code(1))]);
    assert!(look(&mut machine, t1 + TERM_AGAIN_AFTER - ms(1), &[]).is_empty());
    // The second SIGTERM: no SIGCONT, and once only.
    assert_eq!(
        look(&mut machine, t1 + TERM_AGAIN_AFTER, &[]),
        send(&[0, 2], SIGTERM)
    );
    assert_eq!(stop(&machine).term_again_at, None);
    assert!(look(&mut machine, t1 + ms(2500), &[(2, killed(SIGTERM))]).is_empty());
    // SIGKILL at the shutdown timeout, at every look until they are gone.
    assert!(look(&mut machine, t1 + TIMEOUT - ms(1), &[]).is_empty());
    assert_eq!(look(&mut machine, t1 + TIMEOUT, &[]), kill(&[0]));
    assert_eq!(look(&mut machine, t1 + TIMEOUT + ms(10), &[]), kill(&[0]));
    let end = look(&mut machine, t1 + TIMEOUT + ms(20), &[(0, killed(SIGKILL))]);
    assert_eq!(end.first(), Some(&Action::CleanUp));
    // A shutdown timeout of 0 kills in the same look.
    let (mut machine, t0) = running(Role::Alone, 0);
    machine.plan.shutdown_timeout = Duration::ZERO;
    let mut expected = term_cont(&[0, 2]);
    expected.extend(kill(&[0, 2]));
    assert_eq!(look(&mut machine, t0, &[(1, code(1))]), expected);
}

#[test]
fn a_first_signal_is_passed_on_a_quick_second_ignored_a_later_one_kills() {
    let (mut machine, t0) = running(Role::Alone, 0);
    look(&mut machine, t0 + ms(10), &[(2, code(0))]);
    let t1 = t0 + ms(100);
    let mut expected = vec![say(Notice::Forwarding { signal: SIGINT })];
    expected.extend(send(&[0, 1], SIGINT));
    assert_eq!(signal(&mut machine, t1, SIGINT), expected);
    let first = Interrupt {
        signal: SIGINT,
        at: t1,
    };
    let expected = Stop {
        cause: Cause::Interrupted,
        interrupt: Some(first),
        kill_at: t1 + TIMEOUT,
        term_again_at: None,
    };
    assert_eq!(stop(&machine), expected);
    // Within FORCE_STOP_AFTER: the same request, said so.
    let tap = signal(&mut machine, t1 + FORCE_STOP_AFTER - ms(1), SIGINT);
    assert_eq!(tap, [say(Notice::DoubleTap { signal: SIGINT })]);
    assert_eq!(
        Notice::DoubleTap { signal: SIGINT }.to_string(),
        "received SIGINT again within 1s of the first: one request; press Ctrl-C again \
         later to kill the workers at once"
    );
    assert_eq!(stop(&machine), expected);
    // Later: the workers are killed at once.
    let later = t1 + FORCE_STOP_AFTER;
    let mut expected = vec![say(Notice::KillingNow { signal: SIGINT })];
    expected.extend(kill(&[0, 1]));
    assert_eq!(signal(&mut machine, later, SIGINT), expected);
    assert_eq!(stop(&machine).kill_at, later);
    assert_eq!(
        Notice::KillingNow { signal: SIGINT }.level(),
        log::Level::Warn
    );
    // The round was interrupted: no summary, 128 + the signal.
    let end = look(
        &mut machine,
        later,
        &[(0, killed(SIGKILL)), (1, killed(SIGKILL))],
    );
    let assess = Action::Assess {
        round: 0,
        ask_peers: false,
    };
    assert_eq!(end, [Action::CleanUp, assess]);
    assert!(matches!(
        &machine.phase,
        Phase::Assessing {
            code: 130,
            interrupted: true
        }
    ));
}

#[test]
fn a_signal_while_stopping_for_a_failure_makes_the_round_interrupted() {
    let (mut machine, t0) = running(Role::Alone, 0);
    let t1 = t0 + ms(100);
    look(&mut machine, t1, &[(0, code(1))]);
    let mut expected = vec![say(Notice::Forwarding { signal: SIGTERM })];
    expected.extend(send(&[1, 2], SIGTERM));
    assert_eq!(signal(&mut machine, t1 + ms(200), SIGTERM), expected);
    let stopping = stop(&machine);
    assert_eq!(stopping.cause, Cause::Failed { first: 0 });
    // The failure's times stand.
    assert_eq!(stopping.kill_at, t1 + TIMEOUT);
    assert_eq!(stopping.term_again_at, Some(t1 + TERM_AGAIN_AFTER));
    let end = look(&mut machine, t1 + ms(300), &[(1, code(143)), (2, code(0))]);
    let assess = Action::Assess {
        round: 0,
        ask_peers: false,
    };
    assert_eq!(end, [Action::CleanUp, assess]);
    assert!(matches!(
        &machine.phase,
        Phase::Assessing {
            code: 143,
            interrupted: true
        }
    ));
}

#[test]
fn with_peers_a_stop_signal_is_reported_and_polling_ends() {
    let (mut machine, t0) = running(Role::Leader, 1);
    let mut expected = vec![say(Notice::Forwarding { signal: SIGINT })];
    expected.extend(send(&[0, 1, 2], SIGINT));
    expected.push(Action::Report {
        round: 0,
        what: "the launcher got a stop signal".into(),
        interrupted: true,
    });
    assert_eq!(signal(&mut machine, t0 + ms(50), SIGINT), expected);
    assert!(look(&mut machine, t0 + PEER_POLL * 3, &[]).is_empty());
}

#[test]
fn a_failure_with_peers_is_held_for_the_grace_then_reported() {
    let (mut machine, t0) = running(Role::Follower, 1);
    let t1 = t0 + ms(100);
    // Held: no worker is signalled yet; the other machines are asked at once.
    assert_eq!(look(&mut machine, t1, &[(1, code(1))]), [poll()]);
    let until = t1 + PEER_GRACE;
    let expected = Hold {
        first: 1,
        until,
        next_poll: t1,
        deferred: None,
    };
    assert_eq!(hold(&machine), expected);
    assert!(machine.step(t1 + ms(2), Event::PeerReport(None)).is_empty());
    assert_eq!(hold(&machine).next_poll, t1 + ms(2) + GRACE_POLL);
    assert!(look(&mut machine, t1 + ms(12), &[]).is_empty());
    // An exit meanwhile is recorded, and is not the first failure.
    let at = t1 + ms(22);
    assert_eq!(look(&mut machine, at, &[(0, code(1))]), [poll()]);
    assert_eq!(machine.workers()[0].exit.unwrap().after, at - t0);
    machine.step(at, Event::PeerReport(None));
    assert_eq!(look(&mut machine, until, &[]), [poll()]);
    // No report came: this failure is the round's, said to the others.
    let mut expected = vec![Action::Report {
        round: 0,
        what: "rank 4 exit code 1".into(),
        interrupted: false,
    }];
    expected.extend(term_cont(&[2]));
    assert_eq!(machine.step(until, Event::PeerReport(None)), expected);
    assert_eq!(stop(&machine).cause, Cause::Failed { first: 1 });
    assert_eq!(stop(&machine).term_again_at, Some(until + TERM_AGAIN_AFTER));
    let end = look(&mut machine, until + ms(10), &[(2, killed(SIGTERM))]);
    let summary = Action::PrintSummary {
        round: 0,
        first: 1,
        numbered: true,
    };
    let assess = Action::Assess {
        round: 0,
        ask_peers: true,
    };
    assert_eq!(end, [Action::CleanUp, summary, assess]);
}

#[test]
fn another_machines_report_within_the_grace_is_the_root_cause() {
    let (mut machine, t0) = running(Role::Follower, 1);
    let t1 = t0 + ms(100);
    look(&mut machine, t1, &[(1, code(1))]);
    let report = peer_report();
    let notice = Notice::PeerFailed {
        round: 0,
        report: report.clone(),
    };
    assert_eq!(
        notice.to_string(),
        "round 0 failed on another machine (machine 0: rank 0 killed by SIGKILL); \
         stopping this machine's workers"
    );
    let mut expected = vec![say(notice)];
    expected.extend(term_cont(&[0, 2]));
    let answer = machine.step(t1 + ms(40), Event::PeerReport(Some(report)));
    assert_eq!(answer, expected);
    assert_eq!(stop(&machine).cause, Cause::Peer);
    // No summary here, nothing reported: the code is the first non-zero one.
    let end = look(
        &mut machine,
        t1 + ms(60),
        &[(0, killed(SIGTERM)), (2, code(0))],
    );
    let assess = Action::Assess {
        round: 0,
        ask_peers: true,
    };
    assert_eq!(end, [Action::CleanUp, assess]);
    assert!(matches!(
        &machine.phase,
        Phase::Assessing {
            code: 143,
            interrupted: false
        }
    ));
}

#[test]
fn a_signal_in_the_grace_is_handled_when_it_ends() {
    let (mut machine, t0) = running(Role::Follower, 1);
    let t1 = t0 + ms(100);
    look(&mut machine, t1, &[(1, code(1))]);
    machine.step(t1 + ms(1), Event::PeerReport(None));
    assert_eq!(signal(&mut machine, t1 + ms(5), SIGINT), []);
    assert_eq!(hold(&machine).deferred, Some(SIGINT));
    // The failure's stop first, then the signal, as the launcher always did.
    let end = t1 + PEER_GRACE;
    let mut expected = vec![Action::Report {
        round: 0,
        what: "rank 4 exit code 1".into(),
        interrupted: false,
    }];
    expected.extend(term_cont(&[0, 2]));
    expected.push(say(Notice::Forwarding { signal: SIGINT }));
    expected.extend(send(&[0, 2], SIGINT));
    assert_eq!(machine.step(end, Event::PeerReport(None)), expected);
    let stopping = stop(&machine);
    assert_eq!(stopping.interrupt.map(|i| i.at), Some(end));
    look(
        &mut machine,
        end + ms(10),
        &[(0, code(130)), (2, code(130))],
    );
    assert!(matches!(
        &machine.phase,
        Phase::Assessing {
            code: 130,
            interrupted: true
        }
    ));
    // A machine that is not node 0, interrupted here, does not wait for
    // node 0's verdict.
    assert!(machine
        .step(end, Event::Assessed(RoundFacts::default()))
        .is_empty());
    assert!(matches!(machine.into_outcome(), Some(Ok(130))));
}

#[test]
fn another_machines_failure_stops_this_machines_workers() {
    for (exits, expected_code) in [([killed(SIGTERM); 3], 143), ([code(0); 3], 1)] {
        let (mut machine, t0) = running(Role::Follower, 1);
        assert!(look(&mut machine, t0 + PEER_POLL - ms(1), &[]).is_empty());
        assert_eq!(look(&mut machine, t0 + PEER_POLL, &[]), [poll()]);
        let answered = t0 + PEER_POLL + ms(1);
        assert!(machine.step(answered, Event::PeerReport(None)).is_empty());
        assert!(look(&mut machine, t0 + PEER_POLL * 2 - ms(1), &[]).is_empty());
        assert_eq!(look(&mut machine, t0 + PEER_POLL * 2, &[]), [poll()]);
        let report = peer_report();
        let mut expected = vec![say(Notice::PeerFailed {
            round: 0,
            report: report.clone(),
        })];
        expected.extend(term_cont(&[0, 1, 2]));
        let at = t0 + PEER_POLL * 2;
        assert_eq!(machine.step(at, Event::PeerReport(Some(report))), expected);
        // Workers that happened to finish still belong to a failed round.
        let exits: Vec<_> = exits.into_iter().enumerate().collect();
        look(&mut machine, at + ms(10), &exits);
        assert!(matches!(
            &machine.phase,
            Phase::Assessing { code, interrupted: false } if *code == expected_code
        ));
    }
    // A machine on its own never asks.
    let (mut machine, t0) = running(Role::Alone, 1);
    assert!(look(&mut machine, t0 + PEER_POLL * 10, &[]).is_empty());
}

#[test]
fn a_failed_round_and_a_restart_verdict_start_the_next_round() {
    let (mut machine, t1) = failed_round(Role::Alone, 2);
    let restarting = Notice::Restarting {
        round: 1,
        max_restarts: 2,
    };
    assert_eq!(
        restarting.to_string(),
        "starting every worker again: round 1, restart 1 of 2"
    );
    let actions = machine.step(t1 + ms(700), Event::Verdict(Verdict::Restart));
    assert_eq!(actions, [say(restarting), Action::StartRound { round: 1 }]);
    assert_eq!(machine.round(), 1);
    assert!(matches!(&machine.phase, Phase::Starting));
    let t2 = t1 + ms(800);
    let pids = vec![200, 201, 202];
    machine.step(t2, Event::Started { began: t2, pids });
    assert_eq!(machine.workers()[2].pid, 202);
    let exits = [(0, code(0)), (1, code(0)), (2, code(0))];
    let end = look(&mut machine, t2 + ms(5), &exits);
    let succeeded = Notice::Succeeded { round: 1 };
    assert_eq!(
        succeeded.to_string(),
        "the job succeeded in round 1, after 1 restart(s)"
    );
    assert_eq!(end, [Action::CleanUp, say(succeeded)]);
    assert!(matches!(machine.into_outcome(), Some(Ok(0))));
}

#[test]
fn the_deciding_action_follows_the_role() {
    // Node 0 tells the others before it acts on the policy's verdict.
    let (mut machine, t1) = failed_round(Role::Leader, 2);
    let actions = machine.step(t1, Event::Verdict(Verdict::Restart));
    let publish = Action::Publish {
        round: 0,
        verdict: Verdict::Restart,
    };
    assert_eq!(actions.first(), Some(&publish));
    assert_eq!(actions.last(), Some(&Action::StartRound { round: 1 }));
    // Another node waits for node 0; no verdict ends its part of the job.
    let (mut machine, t1) = failed_round(Role::Follower, 1);
    let err = LaunchError::NoVerdict {
        round: 0,
        waited: TIMEOUT,
    };
    assert!(machine.step(t1, Event::NoVerdict(err)).is_empty());
    let outcome = machine.into_outcome().unwrap();
    assert!(matches!(
        outcome,
        Err(LaunchError::NoVerdict { round: 0, .. })
    ));
}

#[test]
fn a_restart_verdict_past_this_machines_max_restarts_is_an_error() {
    let (mut machine, t1) = failed_round(Role::Follower, 0);
    assert!(machine
        .step(t1, Event::Verdict(Verdict::Restart))
        .is_empty());
    let outcome = machine.into_outcome().unwrap();
    assert!(matches!(
        outcome,
        Err(LaunchError::RestartsDiffer {
            round: 1,
            max_restarts: 0
        })
    ));
}

#[test]
fn a_stop_verdict_ends_with_the_failures_code_else_the_verdicts() {
    let (mut machine, t1) = failed_round(Role::Follower, 1);
    assert!(machine
        .step(t1, Event::Verdict(Verdict::Stop(1)))
        .is_empty());
    assert!(matches!(machine.into_outcome(), Some(Ok(3))));
    let (mut machine, t1) = failed_round(Role::Alone, 1);
    machine.phase = Phase::Deciding {
        failure: Failure {
            code: 0,
            formed: true,
            duplicate: None,
            interrupted: false,
        },
    };
    machine.step(t1, Event::Verdict(Verdict::Stop(7)));
    assert!(matches!(machine.into_outcome(), Some(Ok(7))));
}

#[test]
fn a_failure_interrupted_elsewhere_ends_a_follower_too() {
    let (mut machine, t0) = running(Role::Follower, 1);
    let t1 = t0 + ms(100);
    look(&mut machine, t1, &[(1, code(3))]);
    machine.step(t1 + PEER_GRACE, Event::PeerReport(None));
    look(&mut machine, t1 + ms(600), &[(0, code(1)), (2, code(1))]);
    let facts = RoundFacts {
        interrupted_elsewhere: true,
        ..RoundFacts::default()
    };
    assert!(machine
        .step(t1 + ms(601), Event::Assessed(facts))
        .is_empty());
    assert!(matches!(machine.into_outcome(), Some(Ok(3))));
}

#[test]
fn events_the_phase_does_not_expect_change_nothing() {
    let (mut machine, t0) = running(Role::Alone, 1);
    assert!(machine
        .step(t0, Event::Verdict(Verdict::Restart))
        .is_empty());
    assert!(machine
        .step(t0, Event::Assessed(RoundFacts::default()))
        .is_empty());
    assert!(machine.step(t0, Event::PeerReport(None)).is_empty());
    assert!(matches!(&machine.phase, Phase::Running { .. }));
    // An exit seen twice keeps its first time; an unknown worker is ignored.
    look(&mut machine, t0 + ms(10), &[(0, code(0))]);
    look(&mut machine, t0 + ms(20), &[(0, code(0)), (7, code(1))]);
    assert_eq!(machine.workers()[0].exit.unwrap().after, ms(10));
    assert!(matches!(&machine.phase, Phase::Running { .. }));
}
