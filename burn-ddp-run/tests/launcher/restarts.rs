//! `--max-restarts`: every worker started again after a failure, each round a
//! fresh group (its own store keys), until the job succeeds, the restarts run
//! out, or a failure shows that restarting would only repeat it.

use super::{run_scenario, text};
use burn_ddp_comm::ProcessGroup;
use burn_ddp_testkit::check;
use std::time::Duration;

/// The round this worker runs in, as the launcher says.
fn round() -> u32 {
    std::env::var("TORCHELASTIC_RESTART_COUNT")
        .ok()
        .and_then(|r| r.parse().ok())
        .expect("TORCHELASTIC_RESTART_COUNT is set")
}

fn join() -> ProcessGroup {
    ProcessGroup::from_env().unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    })
}

/// Worker side of the scenarios below; `None` for another module's scenario.
pub fn worker(name: &str) -> Option<i32> {
    let rank: usize = std::env::var("RANK").ok()?.parse().ok()?;
    match name {
        // Rank 1 crashes after the group formed, in rounds below `until`.
        "crash_until_round_2" | "crash_every_round" => {
            let until = if name == "crash_every_round" {
                u32::MAX
            } else {
                2
            };
            let group = join();
            group.barrier().unwrap();
            println!(
                "rank {rank} round {} of max {} in a group of {}",
                round(),
                std::env::var("TORCHELASTIC_MAX_RESTARTS").unwrap_or_default(),
                group.world_size()
            );
            if round() < until {
                if rank == 1 {
                    std::thread::sleep(Duration::from_millis(200));
                    return Some(3);
                }
                // The others wait, outside any collective (so the crash is
                // the only failure), until the launcher stops them.
                std::thread::sleep(Duration::from_secs(60));
                return Some(0);
            }
            group.barrier().unwrap_or_else(|e| {
                eprintln!("{e}");
                std::process::exit(1)
            });
            group.destroy().unwrap();
            Some(0)
        }
        // Rank 1 fails before it joins: a missing file, every round alike.
        "fail_before_joining" => {
            if rank == 1 {
                eprintln!("cannot open data/train.bin: No such file or directory");
                return Some(4);
            }
            let _ = join().barrier();
            Some(1)
        }
        // Both local ranks claim rank 0.
        "claim_rank_0" => {
            std::env::set_var("RANK", "0");
            let _ = join();
            Some(0)
        }
        _ => None,
    }
}

fn flags(restarts: &str) -> Vec<&str> {
    vec![
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        restarts,
        "--prefix-output",
    ]
}

/// Rank 1 crashes in rounds 0 and 1: round 2 succeeds, every worker saw its
/// round, the output and the summaries say which round.
pub fn a_crash_is_survived_by_starting_every_worker_again() -> Result<(), String> {
    let (out, elapsed) = run_scenario("crash_until_round_2", &flags("3"), Duration::from_secs(60))?;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    check(out.status.code() == Some(0), || format!("{out:?}"))?;
    for round in 0..3 {
        for rank in 0..2 {
            let line = format!(
                "[rank {rank} round {round}] rank {rank} round {round} of max 3 in a group of 2"
            );
            check(stdout.contains(&line), || {
                format!("no {line:?} in:\n{stdout}")
            })?;
        }
    }
    check(!stdout.contains("round 3"), || stdout.clone())?;
    for round in 0..2 {
        check(
            stderr.contains(&format!("round {round} of the job failed")),
            || stderr.clone(),
        )?;
    }
    check(
        stderr.contains("restart 2 of 3")
            && stderr.contains("succeeded in round 2, after 2 restart(s)")
            && stderr.matches("root cause: rank 1").count() == 2,
        || stderr.clone(),
    )?;
    check(elapsed < Duration::from_secs(30), || {
        format!("took {elapsed:?}")
    })
}

/// A crash in every round: after N restarts the job ends with the last
/// round's code and root cause.
pub fn the_job_ends_when_the_restarts_run_out() -> Result<(), String> {
    let (out, _) = run_scenario("crash_every_round", &flags("2"), Duration::from_secs(60))?;
    let stderr = text(&out.stderr);
    check(out.status.code() == Some(3), || format!("{out:?}"))?;
    check(
        stderr.contains("round 2 of the job failed")
            && !stderr.contains("round 3")
            && stderr.contains("no restarts left (2 used)")
            && stderr.matches("root cause: rank 1").count() == 3,
        || stderr.clone(),
    )
}

/// A rank that fails the same way before the group forms, twice: the launcher
/// stops restarting and says it is not bad luck.
pub fn a_failure_before_forming_twice_is_not_retried() -> Result<(), String> {
    let (out, _) = run_scenario("fail_before_joining", &flags("5"), Duration::from_secs(60))?;
    let stderr = text(&out.stderr);
    check(out.status.code() == Some(4), || format!("{out:?}"))?;
    check(
        stderr.contains("round 0 failed (exit code 4) before its ranks formed their group")
            && stderr.contains("not restarting: round 1 failed as round 0 did (exit code 4)")
            && !stderr.contains("round 2 of the job"),
        || stderr.clone(),
    )
}

/// A rank claimed twice is a configuration error: no restart at all.
pub fn a_duplicate_rank_is_not_retried() -> Result<(), String> {
    let (out, elapsed) = run_scenario("claim_rank_0", &flags("5"), Duration::from_secs(60))?;
    let stderr = text(&out.stderr);
    check(out.status.code() == Some(1), || format!("{out:?}"))?;
    check(
        stderr.contains("not restarting: rank 0 was claimed by two processes")
            && !stderr.contains("round 1"),
        || stderr.clone(),
    )?;
    check(elapsed < Duration::from_secs(20), || {
        format!("took {elapsed:?}")
    })
}
