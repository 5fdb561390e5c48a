//! The GPU binaries on a machine without a GPU: built with `--features cuda`,
//! each stops at once with exit code 1 and the message docs/gpu.md states
//! (the CUDA driver cannot be loaded), naming the rank, instead of panicking
//! inside cudarc or hanging.
//!
//! CI builds Burn 0.21's (`cargo build -p burn-ddp-examples --features cuda
//! --examples`), copies them into a folder and names it in
//! `BURN_DDP_CUDA_BINS`; `cargo test --workspace` builds them without CUDA,
//! so without that variable the test is skipped, and with
//! `BURN_DDP_REQUIRE_CUDA_BINS=1` (as `.ci/run` sets) it fails instead.

use burn_ddp_testkit::programs::{run, scratch};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const BINS_VAR: &str = "BURN_DDP_CUDA_BINS";
const REQUIRE_VAR: &str = "BURN_DDP_REQUIRE_CUDA_BINS";
const NO_DRIVER: &str = "cannot load the CUDA driver (libcuda.so)";

/// The folder of CUDA-built binaries, or None (the test is skipped) when
/// none was named or this machine has a GPU.
fn cuda_bins() -> Option<PathBuf> {
    if Path::new("/dev/nvidiactl").exists() {
        eprintln!("    skipped: this machine has an NVIDIA GPU (scripts/gpu-check.sh checks it)");
        return None;
    }
    match std::env::var_os(BINS_VAR) {
        Some(dir) => Some(PathBuf::from(dir)),
        None if std::env::var(REQUIRE_VAR).is_ok_and(|v| v == "1") => {
            panic!("{REQUIRE_VAR}=1 but {BINS_VAR} is not set (.ci/run builds and names them)")
        }
        None => {
            eprintln!("    skipped: {BINS_VAR} names no --features cuda build (.ci/run does)");
            None
        }
    }
}

/// Runs `program args` (from `bins`) and checks it stops within seconds with
/// exit code 1 and, for each of `ranks`, a line naming that rank and the
/// missing driver.
fn stops_at_once(bins: &Path, program: &str, args: &[&str], ranks: &[usize]) {
    let path = bins.join(program);
    assert!(path.exists(), "{} is missing", path.display());
    let dir = scratch(&format!("no-gpu-{}", program.replace('/', "-")));
    let mut cmd = Command::new(&path);
    // A rank that got past the device would wait for its peers: bounded.
    cmd.args(args).env("BURN_DDP_TIMEOUT_SECS", "20");
    let started = Instant::now();
    let output = run(cmd, &dir, Duration::from_secs(90));
    let took = started.elapsed();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let what = format!("{program} {}", args.join(" "));
    assert_eq!(output.status.code(), Some(1), "{what}: {text}");
    // Each rank names the missing driver, or (under the launcher) was
    // stopped by it after a peer failed first: the launcher's summary row
    // `  1     1     <pid>   0.01s  killed by SIGTERM`. At least one names it.
    let named_by = |rank: usize| {
        let named = format!("rank {rank}: ");
        text.lines()
            .any(|line| line.contains(&named) && line.contains(NO_DRIVER))
    };
    let stopped = |rank: usize| {
        text.lines().any(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            words.first() == Some(&rank.to_string().as_str()) && line.contains("killed by SIGTERM")
        })
    };
    assert!(
        ranks.iter().any(|&rank| named_by(rank)),
        "{what}: no rank named `{NO_DRIVER}`:\n{text}"
    );
    for &rank in ranks {
        assert!(
            named_by(rank) || stopped(rank),
            "{what}: rank {rank} neither named `{NO_DRIVER}` nor was stopped by the launcher:\n{text}"
        );
    }
    assert!(!text.contains("panicked"), "{what} panicked: {text}");
    assert!(took < Duration::from_secs(30), "{what} took {took:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gpu_binaries_stop_at_once_without_a_gpu() {
    let Some(bins) = cuda_bins() else { return };
    for check in [
        &["nccl"][..],
        &["toy", "--epochs", "1"],
        &["toy-fused"],
        &["overhead"],
    ] {
        stops_at_once(&bins, "examples/gpu_check", check, &[0]);
    }
    for trainer in ["examples/toy", "examples/mnist"] {
        for backend in ["cuda", "cuda-fused"] {
            stops_at_once(&bins, trainer, &["--backend", backend], &[0]);
        }
    }
}

/// Under the launcher, both ranks stop with the message (naming their rank)
/// and the launcher ends with their exit code.
#[test]
fn a_launched_job_without_a_gpu_stops_on_every_rank() {
    let Some(bins) = cuda_bins() else { return };
    let toy = bins.join("examples/toy");
    let args = [
        "--standalone",
        "--nproc-per-node",
        "2",
        toy.to_str().unwrap(),
        "--backend",
        "cuda",
    ];
    stops_at_once(&bins, "burn-ddp-run", &args, &[0, 1]);
}
