//! Collectives across real processes on 127.0.0.1, world sizes 1 to 4.
//!
//! Each rank checks its own results against closed-form expectations and prints
//! the collectives_lab values; the driver checks exit codes, timings and output.

mod scenarios;

use burn_ddp_testkit::{
    all_ok, check, run_cases, survivors_failed_within, Case, Hosting, World, SCENARIO_VAR,
};
use std::time::Duration;

fn main() {
    if let Ok(name) = std::env::var(SCENARIO_VAR) {
        scenarios::run(&name);
    }
    let cases: &[Case] = &[
        (
            "collectives_lab_values_world_1_to_4",
            collectives_lab_values,
        ),
        ("sizes_ops_and_dtypes_world_2_to_4", sizes_ops_and_dtypes),
        ("rank_zero_hosts_the_store", rank_zero_hosts_the_store),
        (
            "runs_under_torchruns_agent_store",
            runs_under_torchruns_agent_store,
        ),
        (
            "workers_restarted_by_torchrun_join_afresh_each_round",
            restarted_under_torchrun,
        ),
        ("runs_under_mpirun", runs_under_mpirun),
        (
            "a_missing_agent_store_names_torchrun",
            a_missing_agent_store_names_torchrun,
        ),
        ("many_operations_back_to_back", many_operations_back_to_back),
        (
            "gradients_handed_over_in_any_order_average_as_synchronize_does",
            rounds_match_synchronize,
        ),
        (
            "a_peer_that_dies_mid_round_fails_every_rank_fast",
            peer_dies_mid_round,
        ),
        (
            "world_of_one_needs_no_network",
            world_of_one_needs_no_network,
        ),
        (
            "a_peer_that_never_joins_is_named_within_the_timeout",
            peer_never_joins,
        ),
        ("a_peer_that_dies_fails_the_collective_fast", peer_dies),
        (
            "debug_checks_catch_mismatched_calls",
            debug_checks_catch_mismatched_calls,
        ),
        ("invalid_arguments_are_errors_not_hangs", invalid_arguments),
        ("an_unknown_transport_is_a_clear_error", unknown_transport),
        (
            "a_rank_started_twice_fails_every_rank_naming_both",
            duplicate_rank,
        ),
        (
            "a_rank_claimed_twice_in_a_forming_world_fails_every_rank_at_once",
            duplicate_rank_while_forming,
        ),
        ("destroy_then_init_forms_a_fresh_group", destroy_then_init),
        (
            "a_rank_killed_mid_all_reduce_is_named_by_every_survivor",
            killed_mid_all_reduce,
        ),
        ("a_stopped_rank_is_named_by_every_other_rank", stopped_rank),
        (
            "survivors_of_a_killed_rank_go_on_as_the_next_generation",
            survivors_go_on,
        ),
        (
            "a_stalled_rank_that_comes_back_is_fenced_and_the_others_go_on",
            stalled_rank_fenced,
        ),
        (
            "a_decider_that_dies_too_is_named_by_the_last_survivor",
            decider_dies_too,
        ),
        (
            "two_machines_hierarchical_equals_the_ring",
            hierarchical_equals_ring,
        ),
        (
            "two_machines_every_op_and_size_both_algorithms",
            two_machines_sizes,
        ),
        (
            "two_machines_compressed_all_reduce_both_algorithms",
            two_machines_compressed,
        ),
        (
            "a_machine_that_never_starts_is_named_by_every_rank",
            machine_never_starts,
        ),
    ];
    run_cases(cases);
}

/// Checks each rank's four `collectives_lab.py` results in a world of `world`.
fn check_lab_values(
    outcomes: &[burn_ddp_testkit::RankOutcome],
    world: usize,
) -> Result<(), String> {
    for o in outcomes {
        let r = o.rank;
        let expect_reduce = format!("{}", (0..world).sum::<usize>() as f32);
        let expect_gather = format!("{:?}", (0..world as i64).collect::<Vec<_>>());
        let chunk: Vec<f32> = (0..2)
            .map(|j| {
                (0..world)
                    .map(|q| (2 * r + j) as f32 + 100.0 * q as f32)
                    .sum()
            })
            .collect();
        let expect = [
            ("all_reduce", expect_reduce),
            ("all_gather", expect_gather),
            ("broadcast", "2026".to_string()),
            ("reduce_scatter", format!("{chunk:?}")),
        ];
        for (tag, want) in expect {
            let got = o.value(tag);
            check(got == Some(want.as_str()), || {
                format!("world {world} rank {r} {tag}: got {got:?}, want {want}")
            })?;
        }
    }
    Ok(())
}

/// Ranks started as torchrun starts them when its agent hosts a c10d TCPStore
/// (a stand-in speaking the same protocol): they rendezvous through it.
fn runs_under_torchruns_agent_store() -> Result<(), String> {
    for world in 2..=4usize {
        let mut w = World::new(world);
        w.hosting = Hosting::TorchrunAgent;
        let outcomes = w.run("lab");
        all_ok(&outcomes)?;
        check_lab_values(&outcomes, world)?;
    }
    Ok(())
}

/// torchrun with `--max-restarts`: its agent's store outlives the workers,
/// and each round's workers (TORCHELASTIC_RESTART_COUNT 0, then 1) form a
/// fresh group under that round's keys instead of meeting round 0's claims.
fn restarted_under_torchrun() -> Result<(), String> {
    let agent = std::sync::Arc::new(burn_ddp_testkit::C10dTestServer::start());
    for round in ["0", "1"] {
        let mut w = World::new(3).env("TORCHELASTIC_RESTART_COUNT", round);
        w.hosting = Hosting::TorchrunAgent;
        w.agent = Some(std::sync::Arc::clone(&agent));
        let outcomes = w.run("lab");
        all_ok(&outcomes).map_err(|e| format!("round {round}: {e}"))?;
        check_lab_values(&outcomes, 3)?;
    }
    let keys = agent.keys();
    for round in ["0", "1"] {
        let prefix = format!("/worker/attempt_{round}/");
        check(keys.iter().any(|k| k.starts_with(&prefix)), || {
            format!("no key under {prefix}: {keys:?}")
        })?;
    }
    Ok(())
}

/// Open MPI's variables, as `mpirun -np N` sets them, with MASTER_ADDR/PORT
/// exported by hand (rank 0 hosts the store).
fn runs_under_mpirun() -> Result<(), String> {
    for world in [2usize, 3] {
        let Some(outcomes) = burn_ddp_testkit::mpirun_world(world, "lab", Duration::from_secs(60))?
        else {
            return Ok(()); // not installed here; .ci/run installs it and requires it
        };
        all_ok(&outcomes)?;
        check_lab_values(&outcomes, world)?;
    }
    Ok(())
}

/// torchrun said its agent hosts the store, but nothing listens there.
fn a_missing_agent_store_names_torchrun() -> Result<(), String> {
    let mut world = World::new(2)
        .env("TORCHELASTIC_USE_AGENT_STORE", "True")
        .env("TORCHELASTIC_RUN_ID", "job42");
    world.hosting = Hosting::RankZero; // rank 0 must not host: the agent should
    world.timeout_secs = 1.5;
    world.deadline = Duration::from_secs(30);
    for o in world.run("lab") {
        check(o.code == Some(1), || {
            format!("rank {} should fail: {o:?}", o.rank)
        })?;
        check(o.elapsed < Duration::from_secs(15), || {
            format!("rank {} took {:?}", o.rank, o.elapsed)
        })?;
        check(
            o.stderr.contains(&format!("rank {}", o.rank))
                && o.stderr.contains("torchrun (run id job42)")
                && o.stderr.contains("MASTER_ADDR"),
            || format!("rank {} should explain: {}", o.rank, o.stderr),
        )?;
    }
    Ok(())
}

/// Both host transports, as `BURN_DDP_TRANSPORT` names them.
const TRANSPORTS: [&str; 2] = ["tcp", "shm"];

/// The four results of `collectives_lab.py`, per rank, over each transport.
fn collectives_lab_values() -> Result<(), String> {
    for (world, transport) in (1..=4usize).flat_map(|w| TRANSPORTS.map(|t| (w, t))) {
        let outcomes = World::new(world)
            .env("BURN_DDP_TRANSPORT", transport)
            .run("lab");
        all_ok(&outcomes)?;
        let expected = if world == 1 { "local" } else { transport };
        for o in &outcomes {
            check(o.value("transport") == Some(expected), || {
                format!(
                    "rank {} used {:?}, not {expected}",
                    o.rank,
                    o.value("transport")
                )
            })?;
        }
        check_lab_values(&outcomes, world)?;
    }
    Ok(())
}

fn sizes_ops_and_dtypes() -> Result<(), String> {
    for (world, transport) in (2..=4usize).flat_map(|w| TRANSPORTS.map(|t| (w, t))) {
        all_ok(
            &World::new(world)
                .env("BURN_DDP_TRANSPORT", transport)
                .run("sizes"),
        )?;
    }
    Ok(())
}

fn rank_zero_hosts_the_store() -> Result<(), String> {
    let mut world = World::new(3);
    world.hosting = Hosting::RankZero;
    all_ok(&world.run("lab"))
}

fn many_operations_back_to_back() -> Result<(), String> {
    for transport in TRANSPORTS {
        all_ok(
            &World::new(3)
                .env("BURN_DDP_TRANSPORT", transport)
                .run("back_to_back"),
        )?;
    }
    Ok(())
}

fn rounds_match_synchronize() -> Result<(), String> {
    for (world, transport) in [(2, "shm"), (3, "tcp"), (3, "shm"), (4, "shm")] {
        let outcomes = World::new(world)
            .env("BURN_DDP_TRANSPORT", transport)
            .run("rounds");
        all_ok(&outcomes)?;
        for o in &outcomes {
            check(o.stdout.contains("rounds ok over"), || o.stdout.clone())?;
        }
    }
    Ok(())
}

fn peer_dies_mid_round() -> Result<(), String> {
    // Rank 1 exits after some of its buckets have left.
    let mut world = World::new(3).rank_env(1, "DIE_IN_ROUND", "1");
    world.timeout_secs = 60.0;
    world.deadline = Duration::from_secs(90);
    let outcomes = world.run("die_in_round");
    survivors_failed_within(&outcomes, 1, Duration::from_secs(20), true, &["rank 1"])
}

fn world_of_one_needs_no_network() -> Result<(), String> {
    // No RANK, WORLD_SIZE or MASTER_ADDR at all: a plain `cargo run`.
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .env(SCENARIO_VAR, "lab")
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("MASTER_ADDR")
        .env_remove("MASTER_PORT")
        .output()
        .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    check(out.status.success(), || format!("{out:?}"))?;
    check(
        stdout.contains("all_reduce 0\n") && stdout.contains("reduce_scatter [0.0, 1.0]"),
        || stdout.to_string(),
    )
}

fn peer_never_joins() -> Result<(), String> {
    for hosting in [Hosting::Driver, Hosting::RankZero, Hosting::TorchrunAgent] {
        let mut world = World::new(3);
        world.started = vec![0, 1];
        world.hosting = hosting;
        world.timeout_secs = 2.0;
        world.deadline = Duration::from_secs(30);
        let outcomes = world.run("lab");
        for o in &outcomes {
            check(o.code == Some(1), || {
                format!("rank {} should fail: {o:?}", o.rank)
            })?;
            check(o.elapsed < Duration::from_secs(15), || {
                format!("rank {} took {:?}", o.rank, o.elapsed)
            })?;
            check(
                o.stderr.contains("rank(s) [2]") && o.stderr.contains("timed out"),
                || format!("rank {} should name rank 2: {}", o.rank, o.stderr),
            )?;
        }
    }
    Ok(())
}

fn peer_dies() -> Result<(), String> {
    // Rank 2 exits right after joining; the others must fail long before their
    // 60 s timeout, naming a peer, instead of hanging.
    let mut world = World::new(3).rank_env(2, "DIE_AFTER_INIT", "1");
    world.timeout_secs = 60.0;
    world.deadline = Duration::from_secs(90);
    let outcomes = world.run("die");
    survivors_failed_within(&outcomes, 2, Duration::from_secs(20), true, &["with rank"])
}

fn debug_checks_catch_mismatched_calls() -> Result<(), String> {
    for transport in TRANSPORTS {
        let world = World::new(2)
            .env("BURN_DDP_DEBUG", "detail")
            .env("BURN_DDP_TRANSPORT", transport);
        debug_mismatch_outcomes(world)?;
    }
    Ok(())
}

fn debug_mismatch_outcomes(world: World) -> Result<(), String> {
    let outcomes = world.run("mismatch");
    for o in &outcomes {
        check(o.code == Some(1), || format!("{o:?}"))?;
        let other = 1 - o.rank;
        check(
            o.stderr.contains("ranks disagree")
                && o.stderr.contains(&format!("rank {other} calls all_reduce")),
            || o.stderr.clone(),
        )?;
    }
    Ok(())
}

fn invalid_arguments() -> Result<(), String> {
    all_ok(&World::new(2).run("invalid"))
}

fn unknown_transport() -> Result<(), String> {
    let outcomes = World::new(2)
        .env("BURN_DDP_TRANSPORT", "carrier-pigeon")
        .run("lab");
    for o in &outcomes {
        check(o.code == Some(1), || format!("{o:?}"))?;
        check(
            o.stderr.contains("BURN_DDP_TRANSPORT=\"carrier-pigeon\"")
                && o.stderr.contains("tcp, shm"),
            || o.stderr.clone(),
        )?;
    }
    Ok(())
}

/// RANK=1 given to two processes: every process fails within seconds naming
/// rank 1 and both claimants, whoever hosts the store, over both transports,
/// whether the second claimant comes during set-up or after the group formed.
fn duplicate_rank() -> Result<(), String> {
    let cases = [Hosting::Driver, Hosting::RankZero]
        .into_iter()
        .flat_map(|h| TRANSPORTS.map(|t| (h, t)))
        .flat_map(|(h, t)| [(h, t, Duration::ZERO), (h, t, Duration::from_millis(1000))]);
    for (hosting, transport, late) in cases {
        let mut world = World::new(2).env("BURN_DDP_TRANSPORT", transport);
        world.started = vec![0, 1, 1];
        // The second claimant starts with the others, or once they train.
        world.start_delay = Some((2, late));
        world.hosting = hosting;
        world.timeout_secs = 20.0;
        world.deadline = Duration::from_secs(40);
        let outcomes = world.run("steady");
        let pids: Vec<String> = outcomes
            .iter()
            .filter(|o| o.rank == 1)
            .filter_map(|o| o.value("pid").map(str::to_owned))
            .collect();
        for o in &outcomes {
            check(o.code == Some(1), || {
                format!("{transport}: rank {} should fail: {o:?}", o.rank)
            })?;
            // Less than the 3 s the scenario's traffic lasts.
            check(o.elapsed < late + Duration::from_secs(3), || {
                format!("{transport}: rank {} took {:?}", o.rank, o.elapsed)
            })?;
            check(
                o.stderr.contains("rank 1 was claimed by two processes")
                    && pids
                        .iter()
                        .all(|pid| o.stderr.contains(&format!("pid {pid} "))),
                || {
                    format!(
                        "{transport}: rank {} should name both {pids:?}: {}",
                        o.rank, o.stderr
                    )
                },
            )?;
        }
        check(pids.len() == 2, || format!("pids printed: {pids:?}"))?;
    }
    Ok(())
}

/// Ranks 0, 1 and 1 of a world of 3 (rank 2 never starts, rank 0 hosts the
/// store or the driver does): every process fails within seconds naming the
/// duplicate, instead of the first two waiting out the 20 s timeout and then
/// blaming rank 2.
fn duplicate_rank_while_forming() -> Result<(), String> {
    for (host, hosting) in [("rank 0", Hosting::RankZero), ("driver", Hosting::Driver)] {
        let mut world = World::new(3);
        world.started = vec![0, 1, 1];
        world.hosting = hosting;
        world.timeout_secs = 20.0;
        world.deadline = Duration::from_secs(40);
        let outcomes = world.run("steady");
        check(outcomes.len() == 3, || format!("{outcomes:?}"))?;
        for o in &outcomes {
            check(o.code == Some(1), || {
                format!("{host} hosts: rank {} should fail: {o:?}", o.rank)
            })?;
            check(o.elapsed < Duration::from_secs(5), || {
                format!("{host} hosts: rank {} took {:?}", o.rank, o.elapsed)
            })?;
            check(
                o.stderr.contains("rank 1 was claimed by two processes")
                    && !o.stderr.contains("rank(s) [2]"),
                || format!("{host} hosts: rank {}: {}", o.rank, o.stderr),
            )?;
        }
    }
    Ok(())
}

/// A group destroyed and started again in the same processes (under a store
/// that outlives both) uses fresh keys, and works.
fn destroy_then_init() -> Result<(), String> {
    for transport in TRANSPORTS {
        all_ok(
            &World::new(3)
                .env("BURN_DDP_TRANSPORT", transport)
                .run("twice"),
        )?;
    }
    Ok(())
}

/// The last rank SIGKILLed as a 64 MiB all-reduce starts: every survivor
/// exits non-zero within 5 s, naming it (directly, or through the neighbour
/// that saw it die). 2 and 4 ranks, both transports.
fn killed_mid_all_reduce() -> Result<(), String> {
    for (world_size, transport) in [(2, "tcp"), (2, "shm"), (4, "tcp"), (4, "shm")] {
        let victim = world_size - 1;
        let mut world = World::new(world_size).env("BURN_DDP_TRANSPORT", transport);
        world.timeout_secs = 60.0;
        world.deadline = Duration::from_secs(60);
        world.signal_when = Some((victim, "ready", libc::SIGKILL));
        let outcomes = world.run("big_loop");
        let killed_at = outcomes[victim].elapsed;
        for o in outcomes.iter().filter(|o| o.rank != victim) {
            let case = format!("{world_size} ranks over {transport}, rank {}", o.rank);
            check(o.code == Some(1), || format!("{case}: {o:?}"))?;
            check(o.elapsed < killed_at + Duration::from_secs(5), || {
                format!("{case}: {:?} after the kill", o.elapsed - killed_at)
            })?;
            check(o.stderr.contains(&format!("rank {victim}")), || {
                format!("{case} should name rank {victim}: {}", o.stderr)
            })?;
        }
    }
    Ok(())
}

/// A rank SIGKILLed at step 5 of 12 (3 ranks over TCP and shared memory,
/// rank 1; 4 ranks, rank 0): every survivor goes on in the same process as
/// the next generation (ranks renumbered in order), redoes the step, ends
/// all 12 with exact sums and exits 0, within 2 s of the failed step.
fn survivors_go_on() -> Result<(), String> {
    for (world_size, transport, victim) in [(3, "tcp", 1), (3, "shm", 1), (4, "shm", 0)] {
        let mut world = World::new(world_size)
            .env("BURN_DDP_TRANSPORT", transport)
            .env("SURVIVE_VICTIM", &victim.to_string());
        world.deadline = Duration::from_secs(60);
        world.signal_when = Some((victim, "ready", libc::SIGKILL));
        let outcomes = world.run("survive");
        let case = |rank| format!("{world_size} ranks over {transport}, rank {rank}");
        check(outcomes[victim].code.is_none(), || {
            format!("{}: not killed: {:?}", case(victim), outcomes[victim])
        })?;
        for o in outcomes.iter().filter(|o| o.rank != victim) {
            check(o.code == Some(0), || format!("{}: {o:?}", case(o.rank)))?;
            let survivors = world_size - 1;
            let new_rank = o.rank - usize::from(o.rank > victim);
            let expected = format!("generation 1 rank {new_rank} of {survivors}");
            check(o.stdout.contains(&expected), || {
                format!("{}: no {expected:?} in {}", case(o.rank), o.stdout)
            })?;
            check(
                o.value("steps") == Some(&format!("12 world {survivors}")),
                || format!("{}: {}", case(o.rank), o.stdout),
            )?;
            let recovered: u64 = o
                .value("recovered_in_ms")
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{}: {}", case(o.rank), o.stdout))?;
            check(recovered < 2000, || {
                format!(
                    "{}: the failed step was redone {recovered} ms after it began",
                    case(o.rank)
                )
            })?;
            check(o.stderr.contains(&format!("rank {victim}")), || {
                format!(
                    "{}: the failure does not name rank {victim}: {}",
                    case(o.rank),
                    o.stderr
                )
            })?;
        }
    }
    Ok(())
}

/// Rank 1 of 3 SIGKILLed at step 5, and the survivor that decides who goes
/// on dies too as it decides: the last one gives up within the reform's wait
/// plus the timeout, naming the rank that was deciding and the fix.
fn decider_dies_too() -> Result<(), String> {
    let mut world = World::new(3)
        .env("SURVIVE_VICTIM", "1")
        .env("SURVIVE_WAIT_SECS", "2")
        .env("BURN_DDP_TEST_CRASH_WHILE_DECIDING", "1");
    world.timeout_secs = 3.0;
    world.deadline = Duration::from_secs(40);
    world.signal_when = Some((1, "ready", libc::SIGKILL));
    let outcomes = world.run("survive");
    let ended: Vec<_> = outcomes.iter().filter(|o| o.code.is_some()).collect();
    check(ended.len() == 1, || {
        format!("one survivor should be left: {outcomes:?}")
    })?;
    let last = ended[0];
    let decider = if last.rank == 0 { 2 } else { 0 };
    check(last.code == Some(1), || format!("{last:?}"))?;
    let named = format!("rank {decider} was deciding and may be gone too");
    for needle in [named.as_str(), "--max-restarts"] {
        check(last.stderr.contains(needle), || {
            format!(
                "rank {}'s error lacks {needle:?}: {}",
                last.rank, last.stderr
            )
        })?;
    }
    check(last.elapsed < Duration::from_secs(15), || {
        format!("took {:?}", last.elapsed)
    })
}

/// Rank 1 of 3 SIGSTOPped at step 5 past the 3 s timeout, continued 6 s
/// later: ranks 0 and 2 go on as generation 1 and finish; rank 1, back,
/// finds its generation gone and is fenced by name, exiting with an error.
fn stalled_rank_fenced() -> Result<(), String> {
    let mut world = World::new(3).env("SURVIVE_VICTIM", "1");
    world.timeout_secs = 3.0;
    world.deadline = Duration::from_secs(40);
    world.signal_when = Some((1, "ready", libc::SIGSTOP));
    world.continue_after = Some(Duration::from_secs(6));
    let outcomes = world.run("survive");
    for o in outcomes.iter().filter(|o| o.rank != 1) {
        check(o.code == Some(0), || format!("rank {}: {o:?}", o.rank))?;
        check(o.value("steps") == Some("12 world 2"), || o.stdout.clone())?;
    }
    let back = &outcomes[1];
    check(back.code == Some(1), || format!("rank 1: {back:?}"))?;
    for needle in [
        "rank 1",
        "fenced",
        "generation 0",
        "generation 1",
        "ranks 0, 2",
    ] {
        check(back.stderr.contains(needle), || {
            format!("rank 1's error lacks {needle:?}: {}", back.stderr)
        })?;
    }
    Ok(())
}

/// One rank SIGSTOPped with a 3 s timeout: the others exit within 8 s naming
/// it. 2 and 4 ranks, both transports.
fn stopped_rank() -> Result<(), String> {
    for (world_size, transport) in [(2, "tcp"), (2, "shm"), (4, "tcp"), (4, "shm")] {
        let stopped = 1;
        let mut world = World::new(world_size).env("BURN_DDP_TRANSPORT", transport);
        world.timeout_secs = 3.0;
        world.deadline = Duration::from_secs(9);
        world.signal_when = Some((stopped, "ready", libc::SIGSTOP));
        let outcomes = world.run("big_loop");
        for o in outcomes.iter().filter(|o| o.rank != stopped) {
            let case = format!("{world_size} ranks over {transport}, rank {}", o.rank);
            check(o.code == Some(1), || format!("{case}: {o:?}"))?;
            check(o.elapsed < Duration::from_secs(8), || {
                format!("{case}: took {:?}", o.elapsed)
            })?;
            check(o.stderr.contains(&format!("rank {stopped}")), || {
                format!("{case} should name rank {stopped}: {}", o.stderr)
            })?;
        }
        // The stopped rank never finished: the driver killed it at its deadline.
        check(outcomes[stopped].killed_at_deadline, || {
            format!("{:?}", outcomes[stopped])
        })?;
    }
    Ok(())
}

/// 2 machines x 2 ranks (network namespaces): the hierarchical all-reduce
/// gives the ring's results (integers exactly, floats to 1e-5, the same bits
/// on every rank), and is what the group picks by itself.
fn hierarchical_equals_ring() -> Result<(), String> {
    let Some(machines) = burn_ddp_testkit::Machines::create(2)? else {
        return Ok(());
    };
    let mut world = World::new(4);
    world.machines = Some((std::sync::Arc::new(machines), 2));
    world.deadline = Duration::from_secs(120);
    let outcomes = world.run("compare_algorithms");
    all_ok(&outcomes)?;
    for o in &outcomes {
        check(
            o.value("ring transport") == Some("tcp")
                && o.value("hierarchical transport") == Some("hierarchical"),
            || format!("rank {}: {}", o.rank, o.stdout),
        )?;
    }
    // Left to itself, a 2 x 2 group goes hierarchical.
    let Some(machines) = burn_ddp_testkit::Machines::create(2)? else {
        return Ok(());
    };
    let mut world = World::new(4);
    world.machines = Some((std::sync::Arc::new(machines), 2));
    for o in world.run("lab") {
        o.ok()?;
        check(o.value("transport") == Some("hierarchical"), || {
            o.stdout.clone()
        })?;
    }
    Ok(())
}

/// Every op, dtype and the lengths 0, 1, 7 and ~1M+3 on 2 machines x 2 ranks,
/// with each algorithm.
fn two_machines_sizes() -> Result<(), String> {
    for algorithm in ["ring", "hierarchical"] {
        let Some(machines) = burn_ddp_testkit::Machines::create(2)? else {
            return Ok(());
        };
        let mut world = World::new(4).env("BURN_DDP_ALGORITHM", algorithm);
        world.machines = Some((std::sync::Arc::new(machines), 2));
        world.deadline = Duration::from_secs(120);
        all_ok(&world.run("sizes"))?;
    }
    Ok(())
}

/// `BURN_DDP_COMPRESSION=bf16` and `f16` on 2 machines x 2 ranks, with each
/// algorithm: sums within 16-bit rounding, the same bits on every rank.
fn two_machines_compressed() -> Result<(), String> {
    for (algorithm, codec) in [
        ("ring", "bf16"),
        ("hierarchical", "bf16"),
        ("hierarchical", "f16"),
    ] {
        let Some(machines) = burn_ddp_testkit::Machines::create(2)? else {
            return Ok(());
        };
        let mut world = World::new(4)
            .env("BURN_DDP_ALGORITHM", algorithm)
            .env("BURN_DDP_COMPRESSION", codec);
        world.machines = Some((std::sync::Arc::new(machines), 2));
        world.deadline = Duration::from_secs(120);
        let outcomes = world.run("compressed");
        all_ok(&outcomes).map_err(|e| format!("{algorithm} {codec}: {e}"))?;
    }
    Ok(())
}

/// Only the first of two machines starts its ranks (no launcher to stop them
/// early): every one of them names the missing ranks and their machine within
/// the (3 s) timeout.
fn machine_never_starts() -> Result<(), String> {
    let Some(machines) = burn_ddp_testkit::Machines::create(2)? else {
        return Ok(());
    };
    let mut world = World::new(4).env("GROUP_RANK", "0");
    world.machines = Some((std::sync::Arc::new(machines), 2));
    world.started = vec![0, 1];
    world.timeout_secs = 3.0;
    world.deadline = Duration::from_secs(30);
    for o in world.run("lab") {
        check(o.code == Some(1), || {
            format!("rank {} should fail: {o:?}", o.rank)
        })?;
        check(o.elapsed < Duration::from_secs(15), || {
            format!("rank {} took {:?}", o.rank, o.elapsed)
        })?;
        check(
            o.stderr.contains("rank(s) [2, 3] (all of node rank [1]"),
            || {
                format!(
                    "rank {} should name ranks 2, 3 and node rank 1: {}",
                    o.rank, o.stderr
                )
            },
        )?;
    }
    Ok(())
}
