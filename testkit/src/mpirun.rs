//! Starting ranks with Open MPI's `mpirun`, as users on MPI clusters do.

use crate::{free_port, RankOutcome, SCENARIO_VAR};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Set to 1 (as `.ci/run` does) to make a missing `mpirun` a failure, not a skip.
pub const REQUIRE_MPIRUN_VAR: &str = "BURN_DDP_REQUIRE_MPIRUN";

/// Runs `scenario` on `world_size` ranks under `mpirun` (which sets only the
/// `OMPI_COMM_WORLD_*` variables; we add MASTER_ADDR/MASTER_PORT as a job
/// script would). `Ok(None)` when mpirun is not installed and not required.
pub fn mpirun_world(
    world_size: usize,
    scenario: &str,
    deadline: Duration,
) -> Result<Option<Vec<RankOutcome>>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    mpirun_program(world_size, scenario, &exe, &[], deadline)
}

/// [`mpirun_world`] of `program` with `args` (a trainer), each rank in the
/// driver's folder.
pub fn mpirun_program(
    world_size: usize,
    scenario: &str,
    exe: &std::path::Path,
    args: &[&str],
    deadline: Duration,
) -> Result<Option<Vec<RankOutcome>>, String> {
    let installed = Command::new("mpirun")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !installed {
        if std::env::var(REQUIRE_MPIRUN_VAR).is_ok_and(|v| v == "1") {
            return Err(format!(
                "mpirun not found but {REQUIRE_MPIRUN_VAR}=1 (install openmpi-bin)"
            ));
        }
        eprintln!("    skipped: mpirun is not installed (.ci/run installs openmpi-bin)");
        return Ok(None);
    }
    let port = free_port().to_string();
    let started = Instant::now();
    let child = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "--tag-output"])
        .args(["-np", &world_size.to_string()])
        .args(["-x", &format!("{SCENARIO_VAR}={scenario}")])
        .args(["-x", "MASTER_ADDR=127.0.0.1"])
        .args(["-x", &format!("MASTER_PORT={port}")])
        .args(["-x", "BURN_DDP_TIMEOUT_SECS=20"])
        .arg(exe)
        .args(args)
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("BURN_DDP_LAUNCHER_STORE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start mpirun: {e}"))?;
    let killer = child.id();
    let watchdog = std::thread::spawn(move || {
        while started.elapsed() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            if unsafe { libc::kill(killer as i32, 0) } != 0 {
                return;
            }
        }
        unsafe { libc::kill(killer as i32, libc::SIGKILL) };
    });
    let output = child.wait_with_output().map_err(|e| e.to_string())?;
    let elapsed = started.elapsed();
    let _ = watchdog.join();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    Ok(Some(
        (0..world_size)
            .map(|rank| RankOutcome {
                rank,
                code: output.status.code(),
                stdout: lines_of(&stdout, rank, "stdout"),
                stderr: lines_of(&stderr, rank, "stderr") + &stderr,
                elapsed,
                killed_at_deadline: elapsed >= deadline,
            })
            .collect(),
    ))
}

/// The lines `--tag-output` marked `[job,rank]<stream>:`, without the tag.
fn lines_of(text: &str, rank: usize, stream: &str) -> String {
    let marker = format!(",{rank}]<{stream}>:");
    text.lines()
        .filter_map(|line| {
            let at = line.find(&marker)?;
            line.starts_with('[')
                .then(|| line[at + marker.len()..].to_string() + "\n")
        })
        .collect()
}
