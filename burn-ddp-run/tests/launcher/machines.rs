//! Jobs over several machines: network namespaces with their own host name
//! and `/dev/shm` (testkit's `Machines`), a launcher on each, TCP between them.

use crate::{bounded, text, LAUNCHER};
use burn_ddp_testkit::{check, Machines, SCENARIO_VAR};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "two-machine-test-token";

/// The launcher on machine `node` of `machines`, `nproc` ranks there, running
/// this test binary on `scenario`.
fn launcher_on(
    machines: &Machines,
    node: usize,
    nproc: usize,
    scenario: &str,
    timeout_secs: &str,
) -> Command {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = machines.command(node, LAUNCHER);
    cmd.args(["--nnodes", &machines.len().to_string()])
        .args(["--node-rank", &node.to_string()])
        .args(["--nproc-per-node", &nproc.to_string()])
        .args(["--master-addr", &machines.addr(0).to_string()])
        .args(["--master-port", "29500", "--prefix-output"])
        .arg(exe)
        .env(SCENARIO_VAR, scenario)
        .env("BURN_DDP_JOB_TOKEN", TOKEN)
        .env("BURN_DDP_TIMEOUT_SECS", timeout_secs)
        .env_remove("OMP_NUM_THREADS")
        .env_remove("RAYON_NUM_THREADS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Reads `stream` until `needle` has appeared `count` times (bounded by the
/// caller's process ending the stream, or `limit`).
fn read_until(
    stream: &mut impl std::io::Read,
    needle: &str,
    count: usize,
    limit: Duration,
) -> Result<String, String> {
    let mut seen = String::new();
    let mut buf = [0u8; 1024];
    let deadline = Instant::now() + limit;
    while seen.matches(needle).count() < count {
        let n = stream.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 || Instant::now() > deadline {
            return Err(format!("the job did not start: {seen}"));
        }
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    Ok(seen)
}

/// Runs every command at once, each bounded by `limit`.
fn run_all(commands: Vec<Command>, limit: Duration) -> Result<Vec<(Output, Duration)>, String> {
    let runs: Vec<_> = commands
        .into_iter()
        .map(|cmd| std::thread::spawn(move || bounded(cmd, limit)))
        .collect();
    runs.into_iter()
        .map(|run| run.join().map_err(|_| "a runner panicked".to_string())?)
        .collect()
}

/// 2 machines x 2 ranks: every collective's values on every rank, over TCP
/// between the machines.
pub fn two_machines_run_the_collectives() -> Result<(), String> {
    let Some(machines) = Machines::create(2)? else {
        return Ok(());
    };
    let commands = (0..2)
        .map(|node| launcher_on(&machines, node, 2, "collectives", "30"))
        .collect();
    let outputs = run_all(commands, Duration::from_secs(60))?;
    for (node, (out, _)) in outputs.iter().enumerate() {
        let stdout = text(&out.stdout);
        check(out.status.success(), || {
            format!("machine {node}: {out:?}\n{}", text(&out.stderr))
        })?;
        for rank in [2 * node, 2 * node + 1] {
            // Chunk `rank` of the sum over q of (i + 100 q): 4 i + 600.
            let chunk: Vec<f64> = (2 * rank..2 * rank + 2)
                .map(|i| (4 * i + 600) as f64)
                .collect();
            for line in [
                format!("[rank {rank}] sum=6.0 gathered=[0, 1, 2, 3]"),
                format!("[rank {rank}] broadcast=2026 reduce_scatter={chunk:?}"),
            ] {
                check(stdout.lines().any(|l| l == line), || {
                    format!("machine {node}: missing {line:?} in:\n{stdout}")
                })?;
            }
        }
    }
    Ok(())
}

/// The second machine's launcher starts 10 s after the first: the job still
/// forms (the timeout is 60 s) and computes the right sums.
pub fn a_machine_started_late_still_forms_the_job() -> Result<(), String> {
    let Some(machines) = Machines::create(2)? else {
        return Ok(());
    };
    let first = launcher_on(&machines, 0, 2, "collectives", "60");
    let early = std::thread::spawn(move || bounded(first, Duration::from_secs(90)));
    std::thread::sleep(Duration::from_secs(10));
    let (late, _) = bounded(
        launcher_on(&machines, 1, 2, "collectives", "60"),
        Duration::from_secs(60),
    )?;
    let (early, _) = early.join().map_err(|_| "runner panicked")??;
    for (node, out) in [(0, early), (1, late)] {
        check(out.status.success(), || {
            format!("machine {node}: {out:?}\n{}", text(&out.stderr))
        })?;
        check(text(&out.stdout).matches("sum=6.0").count() == 2, || {
            format!("machine {node}:\n{}", text(&out.stdout))
        })?;
    }
    Ok(())
}

/// Only the first machine starts: its ranks name the missing ranks 2 and 3
/// and their machine within the (3 s) timeout, and its launcher fails. (The
/// launcher stops the other rank as soon as one fails, so not every rank gets
/// to print; every one that does names them.)
pub fn a_machine_that_never_starts_is_named() -> Result<(), String> {
    let Some(machines) = Machines::create(2)? else {
        return Ok(());
    };
    let started = Instant::now();
    let (out, _) = bounded(
        launcher_on(&machines, 0, 2, "collectives", "3"),
        Duration::from_secs(30),
    )?;
    let stderr = text(&out.stderr);
    check(!out.status.success(), || format!("{out:?}"))?;
    check(started.elapsed() < Duration::from_secs(15), || {
        format!("took {:?}", started.elapsed())
    })?;
    let reports: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("[rank ") && l.contains("timed out"))
        .collect();
    check(!reports.is_empty(), || {
        format!("no rank reported:\n{stderr}")
    })?;
    for report in reports {
        check(
            report.contains("rank(s) [2, 3] (all of node rank [1]"),
            || format!("should name ranks 2 and 3 and node rank 1: {report}"),
        )?;
    }
    Ok(())
}

/// Both machines train; then every process of the second is SIGKILLed. The
/// first machine's launcher exits non-zero within 40 s and names a rank of
/// the lost machine as the root cause, not its own ranks that failed because
/// of it.
pub fn a_killed_machine_ends_the_job_and_is_named() -> Result<(), String> {
    let Some(machines) = Machines::create(2)? else {
        return Ok(());
    };
    let mut children = Vec::new();
    for node in 0..2 {
        let child = launcher_on(&machines, node, 2, "steady_all_reduce", "60")
            .spawn()
            .map_err(|e| e.to_string())?;
        children.push(child);
    }
    let mut survivor = children.remove(0);
    let mut stdout = survivor.stdout.take().unwrap();
    let mut stderr = survivor.stderr.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut s);
        s
    });
    // Wait until both of the survivor's ranks train.
    if let Err(err) = read_until(&mut stdout, "ready", 2, Duration::from_secs(60)) {
        let _ = survivor.kill();
        let _ = survivor.wait();
        return Err(err);
    }
    std::thread::sleep(Duration::from_millis(500));
    let killed = Instant::now();
    let count = machines.kill_all(1);
    let status = loop {
        match survivor.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if killed.elapsed() <= Duration::from_secs(40) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            other => {
                let _ = survivor.kill();
                let _ = survivor.wait();
                break Err(format!(
                    "the surviving launcher did not exit within 40 s ({other:?})"
                ));
            }
        }
    }?;
    check(count >= 3, || {
        format!("killed {count} processes on machine 1")
    })?;
    let stderr = err_reader.join().unwrap();
    for mut child in children {
        let _ = child.wait();
    }
    check(!status.success(), || format!("{status:?}\n{stderr}"))?;
    check(
        stderr.contains("root cause: rank 2, on another machine")
            || stderr.contains("root cause: rank 3, on another machine"),
        || format!("the lost machine's ranks should be the root cause:\n{stderr}"),
    )
}
