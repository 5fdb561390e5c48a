//! `--on-failure continue`: a worker's failure does not stop the others; a
//! program that forms the next generation of its group goes on without the
//! worker, and the job succeeds when the others finish.

use super::{bounded, launcher, run_scenario, text, SCENARIO_VAR};
use burn_ddp_comm::{ProcessGroup, ReduceOp};
use burn_ddp_testkit::check;
use std::time::Duration;

/// Worker side of the scenarios below; `None` for another module's scenario.
pub fn worker(name: &str) -> Option<i32> {
    if name == "heal_all_reduce" {
        return Some(heal_all_reduce());
    }
    if name != "go_on_without_rank_1" {
        return None;
    }
    let rank: usize = std::env::var("RANK").ok()?.parse().ok()?;
    let fail = |e: burn_ddp_comm::CommError| -> i32 {
        eprintln!("{e}");
        1
    };
    let mut group = match ProcessGroup::from_env() {
        Ok(group) => group,
        // A replacement the others never admit (this loop admits nobody):
        // their end closes the admissions, and it leaves.
        Err(e @ burn_ddp_comm::CommError::NothingToJoin { .. }) => {
            println!("replacement: {e}");
            return Some(0);
        }
        Err(e) => return Some(fail(e)),
    };
    let mut step = 0;
    while step < 12 {
        if step == 5 && rank == 1 {
            // SIGKILL, or SIGSTOP with GO_ON_STOP set (never continued).
            let signal = match std::env::var_os("GO_ON_STOP") {
                Some(_) => libc::SIGSTOP,
                None => libc::SIGKILL,
            };
            // SAFETY: signalling this process.
            unsafe { libc::kill(libc::getpid(), signal) };
        }
        let world = group.world_size();
        let mut data = vec![(group.rank() + 1) as f32; 1024];
        match group.all_reduce(&mut data, ReduceOp::Sum) {
            Ok(()) if data[0] == (world * (world + 1) / 2) as f32 => step += 1,
            Ok(()) => {
                eprintln!("step {step}: {} in a world of {world}", data[0]);
                return Some(2);
            }
            Err(_) => match group.reform(Duration::from_secs(10)) {
                Ok(next) => group = next,
                Err(e) => return Some(fail(e)),
            },
        }
    }
    println!(
        "rank {rank} (pid {}) finished 12 steps as rank {} of {}",
        std::process::id(),
        group.rank(),
        group.world_size()
    );
    match group.destroy() {
        Ok(()) => Some(0),
        Err(e) => Some(fail(e)),
    }
}

/// The same with `--max-restarts 1`: the launcher starts a replacement for
/// rank 1, which this loop never admits; when ranks 0 and 2 finish (and
/// destroy their group, which closes the admissions) it leaves with exit 0
/// saying there is nothing left to do, and the job succeeds.
pub fn a_replacement_nobody_admits_leaves_when_the_job_ends() -> Result<(), String> {
    let flags = [
        "--standalone",
        "--nproc-per-node",
        "3",
        "--on-failure",
        "continue",
        "--max-restarts",
        "1",
    ];
    let (out, took) = run_scenario("go_on_without_rank_1", &flags, Duration::from_secs(60))?;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    check(out.status.code() == Some(0), || format!("{out:?}"))?;
    check(
        stdout.contains("finished 12 steps as rank 1 of 2")
            && stdout.contains("finished before this replacement could join it")
            && stderr.contains("starting a replacement for rank 1 (restart 1 of 1)")
            && stderr.contains("1 replacement(s) started"),
        || format!("{stdout}\n{stderr}"),
    )?;
    // The replacement leaves within a poll of the others' end, not a timeout.
    check(took < Duration::from_secs(20), || format!("took {took:?}"))
}

/// 3 workers, rank 1 SIGKILLs itself at step 5: with `--on-failure
/// continue` ranks 0 and 2 go on as ranks 0 and 1 of 2 in the processes they
/// started in, the launcher says rank 1 was lost and exits 0.
pub fn the_others_go_on_without_a_killed_worker() -> Result<(), String> {
    let flags = [
        "--standalone",
        "--nproc-per-node",
        "3",
        "--on-failure",
        "continue",
    ];
    let (out, _) = run_scenario("go_on_without_rank_1", &flags, Duration::from_secs(60))?;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    check(out.status.code() == Some(0), || format!("{out:?}"))?;
    for (rank, now) in [(0, 0), (2, 1)] {
        let line = format!("finished 12 steps as rank {now} of 2");
        check(
            stdout.contains(&format!("rank {rank} (pid")) && stdout.contains(&line),
            || format!("no {line:?} for rank {rank} in:\n{stdout}"),
        )?;
    }
    check(
        stderr.contains("rank 1 ended (killed by SIGKILL)")
            && stderr.contains("the other workers go on without it")
            && stderr.contains("the job finished without rank(s) 1"),
        || stderr.clone(),
    )
}

/// Steps of all-reduces (10 ms apart) that go on without ranks that are
/// gone (`reform`) and admit replacements at a step's end (`poll_joiners`,
/// `admit`); `ready` at the first step. It ends once 20 steps have run on
/// the whole world again after it shrank (every rank counts from the same
/// admission), printing where it ended; exit 3 if the world never healed
/// within 3000 steps. The whole world is `HEAL_TARGET_WORLD` ranks, else
/// the one it started with.
fn heal_all_reduce() -> i32 {
    let fail = |e: burn_ddp_comm::CommError| -> i32 {
        eprintln!("{e}");
        1
    };
    let world_var = |name| {
        std::env::var(name)
            .ok()
            .and_then(|w| w.parse::<usize>().ok())
    };
    let whole = world_var("HEAL_TARGET_WORLD")
        .or(world_var("WORLD_SIZE"))
        .unwrap_or(1);
    let mut group = match ProcessGroup::from_env() {
        Ok(group) => group,
        Err(e) => return fail(e),
    };
    let launched = group.rank();
    // A replacement joins a healed world: it counts from its admission.
    let mut healed_steps: Option<usize> = group.joined_running().then_some(0);
    println!("ready");
    for step in 0..3000 {
        std::thread::sleep(Duration::from_millis(10));
        let world = group.world_size();
        let mut data = vec![(group.rank() + 1) as f32; 1024];
        let summed = group
            .all_reduce(&mut data, ReduceOp::Sum)
            .and_then(|()| group.poll_joiners());
        match summed {
            Ok(_) if data[0] != (world * (world + 1) / 2) as f32 => {
                eprintln!("step {step}: {} in a world of {world}", data[0]);
                return 2;
            }
            Ok(joiners) => {
                if let Some(done) = healed_steps.as_mut() {
                    *done += 1;
                    if *done >= 20 {
                        println!(
                            "launched as rank {launched}: finished as rank {} of {}, generation {}",
                            group.rank(),
                            group.world_size(),
                            group.generation()
                        );
                        return 0;
                    }
                }
                if joiners {
                    group = match group.admit(Duration::from_secs(10)) {
                        Ok(next) => next,
                        Err(e) => return fail(e),
                    };
                    println!(
                        "admitted: generation {} rank {} of {}",
                        group.generation(),
                        group.rank(),
                        group.world_size()
                    );
                    if group.world_size() >= whole {
                        healed_steps = Some(0);
                    }
                }
            }
            Err(err) => {
                eprintln!("step {step}: {err}");
                group = match group.reform(Duration::from_secs(10)) {
                    Ok(next) => next,
                    Err(e) => return fail(e),
                };
                println!(
                    "went on: generation {} rank {} of {}",
                    group.generation(),
                    group.rank(),
                    group.world_size()
                );
            }
        }
    }
    eprintln!("the world never healed");
    3
}

/// 3 workers, rank 1 SIGSTOPs itself at step 5 and is never continued: ranks
/// 0 and 2 time out on it (3 s), go on as ranks 0 and 1 of 2 and finish;
/// the launcher, which would otherwise wait for rank 1 forever, kills it once
/// it has been stopped for the shutdown timeout (2 s) after they finished,
/// and exits 0.
pub fn a_worker_stopped_forever_is_killed_once_the_others_finished() -> Result<(), String> {
    let exe = std::env::current_exe().unwrap();
    let flags = [
        "--standalone",
        "--nproc-per-node",
        "3",
        "--on-failure",
        "continue",
        "--shutdown-timeout",
        "2",
        exe.to_str().unwrap(),
    ];
    let mut cmd = launcher(&flags);
    cmd.env(SCENARIO_VAR, "go_on_without_rank_1")
        .env("GO_ON_STOP", "1")
        .env("BURN_DDP_TIMEOUT_SECS", "3");
    let (out, took) = bounded(cmd, Duration::from_secs(60))?;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    check(out.status.code() == Some(0), || format!("{out:?}"))?;
    check(
        stdout.contains("finished 12 steps as rank 1 of 2")
            && stderr.contains("rank 1 has been stopped (SIGSTOP)")
            && stderr.contains("killing it"),
        || format!("{stdout}\n{stderr}"),
    )?;
    check(took < Duration::from_secs(20), || format!("took {took:?}"))
}
