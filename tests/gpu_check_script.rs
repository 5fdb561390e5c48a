//! scripts/gpu-check.sh cannot run its checks here (no GPU), but its logic
//! can: these tests run it on stand-in binaries and a stand-in `nvidia-smi`
//! that print what the real ones print, and read the verdict table, so the
//! script stays ready for the first GPU machine.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A directory with stand-ins for `nvidia-smi` (`gpus` GPUs) and the
/// binaries the script runs, where `gpu_check` behaves as `script` says and
/// Burn 0.22's gpu_check22 as [`GPU_CHECK22`].
fn stand_ins(name: &str, gpus: usize, gpu_check: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpu-check-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("bin/examples")).unwrap();
    std::fs::create_dir_all(dir.join("path")).unwrap();
    let write = |path: &Path, text: &str| {
        std::fs::write(path, text).unwrap();
        Command::new("chmod").arg("+x").arg(path).status().unwrap();
    };
    let listing: String = (0..gpus)
        .map(|i| format!("echo 'GPU {i}: NVIDIA H200 (UUID: GPU-{i})'\n"))
        .collect();
    write(
        &dir.join("path/nvidia-smi"),
        &format!("#!/bin/bash\n{listing}"),
    );
    // The launcher stand-in runs the program once per rank with RANK set.
    write(
        &dir.join("bin/burn-ddp-run"),
        "#!/bin/bash\nwhile [ \"${1#--}\" != \"$1\" ]; do\n  case $1 in --nproc-per-node) n=$2; shift;; esac\n  shift\ndone\nfor r in $(seq 0 $((${n:-1} - 1))); do RANK=$r \"$@\" || exit $?; done\n",
    );
    write(&dir.join("bin/examples/gpu_check"), gpu_check);
    write(&dir.join("bin/examples/gpu_check22"), GPU_CHECK22);
    dir
}

/// gpu_check22 as the real one reports when everything passes: `nccl` (only
/// with NCCL chosen), and `toy`, toy22's trainer (its buckets over NCCL
/// unless BURN_DDP_BACKEND=tcp, with the same loss on every path).
const GPU_CHECK22: &str = r#"#!/bin/bash
case "$1" in
nccl)
  [ "$BURN_DDP_BACKEND" = nccl ] || { echo "RESULT setup FAIL run with BURN_DDP_BACKEND=nccl"; exit 1; }
  echo "RESULT tensor_all_reduce_sum PASS 4096 f32"
  echo "RESULT sync_batch_norm_cuda PASS output true, input gradient true, running mean true"
  ;;
toy)
  [ "$RANK" = 0 ] || exit 0
  echo "Epoch 2/2, Avg Loss: 1.305500000"
  if [ "$BURN_DDP_BACKEND" = tcp ]; then echo "Gradient sync: 8 buckets, 0 of them on the GPU over NCCL"
  else echo "Gradient sync: 4 buckets, 4 of them on the GPU over NCCL"; fi
  echo "Training complete."
  ;;
*) echo "error: unrecognized subcommand '$1'"; exit 2;;
esac
"#;

/// A `gpu_check` that passes everything; the toy reports its buckets the way
/// the real trainer does (all over NCCL unless BURN_DDP_BACKEND=tcp).
const HEALTHY: &str = r#"#!/bin/bash
case "$1" in
nccl) echo "RESULT nccl_all_reduce_sum PASS rank 0: ok"; echo "RESULT tensor_all_gather PASS rank 0: ok"
  echo "ENV LD_LIBRARY_PATH=$LD_LIBRARY_PATH CUDA_PATH=${CUDA_PATH:-} CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}";;
overhead) echo "OVERHEAD 1.010 Autodiff<Cuda> 3.00 ms, Ddp<Autodiff<Cuda>> 3.03 ms";;
bench)
  [ "$RANK" = 0 ] || exit 0
  echo "TABLE | size | NCCL ms | bucket path ms | path / NCCL | NCCL busbw GB/s | path busbw GB/s |"
  echo "TABLE | 1 MiB | 0.05 | 0.20 | 4.00 | 30.0 | 7.5 |"
  echo "TABLE | 25 MiB | 0.50 | 0.52 | 1.04 | 80.0 | 76.9 |"
  echo "TABLE | 256 MiB | 4.00 | 4.10 | 1.03 | 100.0 | 97.6 |"
  echo "TABLE | 1024 MiB | 16.00 | 16.30 | 1.02 | 100.0 | 98.2 |";;
toy-reference) echo "Epoch 2/2, Avg Loss: 1.211700000"; echo "Training complete.";;
toy|toy-fused)
  [ "$RANK" = 0 ] || exit 0
  echo "Epoch 2/2, Avg Loss: 1.211700000"
  if [ "$BURN_DDP_BACKEND" = tcp ]; then echo "Gradient sync: 64 buckets, 0 of them on the GPU over NCCL"
  else echo "Gradient sync: 32 buckets, 32 of them on the GPU over NCCL"; fi
  echo "Training complete.";;
esac
"#;

/// Runs the script on the stand-ins; returns (exit code, verdict rows).
fn run_script(dir: &Path) -> (i32, Vec<(String, String)>, String) {
    run_script_with(dir, &[], &[])
}

fn run_script_with(
    dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (i32, Vec<(String, String)>, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gpu-check.sh");
    let path = format!(
        "{}:{}",
        dir.join("path").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("bash");
    cmd.arg(&script)
        .args(args)
        .arg(dir.join("bin"))
        .env("PATH", path)
        .env_remove("BURN_DDP_BACKEND")
        .env_remove("OUT")
        .env_remove("CUDA_VISIBLE_DEVICES");
    for (key, value) in env {
        cmd.env(key, value);
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let rows = text
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| check") && !l.starts_with("| ---"))
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells.len() == 5).then(|| (cells[1].to_string(), cells[2].to_string()))
        })
        .collect();
    (out.status.code().unwrap_or(-1), rows, text)
}

fn verdict<'a>(rows: &'a [(String, String)], check: &str) -> &'a str {
    rows.iter()
        .find(|(name, _)| name.starts_with(check))
        .map(|(_, v)| v.as_str())
        .unwrap_or("missing")
}

#[test]
fn two_gpus_run_every_row_and_judge_the_goals() {
    let dir = stand_ins("two", 2, HEALTHY);
    let (_, rows, text) = run_script(&dir);
    for check in [
        "gpus visible",
        "nccl world=1 collectives",
        "toy cuda world=1 over nccl",
        "toy fused cuda world=1 over nccl",
        "toy over nccl = Autodiff<Cuda>",
        "toy cuda world=2 one gpu over tcp",
        "toy world=2 = world 1, twice the batch",
        "nccl world=2 collectives",
        "toy cuda world=2 over nccl",
        "ddp overhead world=1",
        "bucket all-reduce timings",
        "bucket busbw >= 90% of NCCL from 25 MiB",
        "burn 0.22: nccl world=1 collectives",
        "burn 0.22: toy22 cuda world=1 over nccl",
        "burn 0.22: toy22 over nccl = host path",
        "burn 0.22: toy22 world=2 = world 1, twice the batch",
        "burn 0.22: toy22 cuda world=2 over nccl",
    ] {
        assert_eq!(verdict(&rows, check), "PASS", "{check}:\n{text}");
    }
    assert!(text.contains("| 256 MiB | 4.00 | 4.10 | 1.03 |"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn failures_and_misses_are_told_apart() {
    // nccl checks fail on one row; the overhead misses its goal; the toy's
    // buckets do not all go over NCCL.
    let broken = HEALTHY
        .replace(
            "echo \"RESULT tensor_all_gather PASS rank 0: ok\"",
            "echo \"RESULT tensor_all_gather FAIL rank 0: got [0, 0]\"; exit 1",
        )
        .replace("OVERHEAD 1.010", "OVERHEAD 1.200")
        .replace("32 buckets, 32 of them", "32 buckets, 12 of them")
        .replace(
            "toy-reference) echo \"Epoch 2/2, Avg Loss: 1.211700000\"",
            "toy-reference) echo \"Epoch 2/2, Avg Loss: 1.211800000\"",
        );
    let dir = stand_ins("broken", 1, &broken);
    let (code, rows, text) = run_script(&dir);
    assert_ne!(code, 0, "{text}");
    assert_eq!(verdict(&rows, "nccl world=1 collectives"), "FAIL", "{text}");
    assert!(
        text.contains("tensor_all_gather FAIL rank 0: got [0, 0]"),
        "{text}"
    );
    assert_eq!(
        verdict(&rows, "toy cuda world=1 over nccl"),
        "FAIL",
        "{text}"
    );
    assert!(
        text.contains("only 12 of 32 buckets went over NCCL"),
        "{text}"
    );
    assert_eq!(verdict(&rows, "ddp overhead world=1"), "MISS", "{text}");
    // 1.2117 against 1.2118: a relative gap of 8e-5, over the 1e-6 allowed.
    assert_eq!(
        verdict(&rows, "toy over nccl = Autodiff<Cuda>"),
        "FAIL",
        "{text}"
    );
    assert!(text.contains("toyfused=8.25e-05"), "{text}");
    assert_eq!(verdict(&rows, "multi-rank nccl"), "SKIP", "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without Burn 0.22's binary the Burn 0.22 row is a SKIP that says how to
/// build it; a gpu_check22 with a failing check fails its row, naming it;
/// a toy22 whose NCCL run trains otherwise than its host path, or keeps
/// buckets off the GPU, fails.
#[test]
fn burn_022_rows_skip_without_gpu_check22_and_fail_on_a_wrong_one() {
    let dir = stand_ins("no-gpu-check22", 1, HEALTHY);
    std::fs::remove_file(dir.join("bin/examples/gpu_check22")).unwrap();
    let (_, rows, text) = run_script(&dir);
    assert_eq!(
        verdict(&rows, "burn 0.22: nccl world=1 collectives"),
        "SKIP",
        "{text}"
    );
    assert_eq!(
        verdict(&rows, "burn 0.22: toy22 cuda world=1 over nccl"),
        "missing",
        "{text}"
    );
    assert!(
        text.contains("scripts/build-gpu-bins.sh builds it"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);

    let dir = stand_ins("bad-gpu-check22", 1, HEALTHY);
    let failing = GPU_CHECK22.replace(
        "RESULT sync_batch_norm_cuda PASS output true, input gradient true, running mean true\"\n",
        "RESULT sync_batch_norm_cuda FAIL output false, input gradient true, running mean true\"\n  exit 1\n",
    );
    assert_ne!(failing, GPU_CHECK22);
    std::fs::write(dir.join("bin/examples/gpu_check22"), failing).unwrap();
    let (code, rows, text) = run_script(&dir);
    assert_ne!(code, 0, "{text}");
    assert_eq!(
        verdict(&rows, "burn 0.22: nccl world=1 collectives"),
        "FAIL",
        "{text}"
    );
    assert!(
        text.contains("sync_batch_norm_cuda FAIL output false"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);

    let dir = stand_ins("bad-toy22", 1, HEALTHY);
    let wrong = GPU_CHECK22
        .replace(
            "echo \"Epoch 2/2, Avg Loss: 1.305500000\"",
            "[ \"$BURN_DDP_BACKEND\" = nccl ] && echo \"Epoch 2/2, Avg Loss: 1.305600000\" || echo \"Epoch 2/2, Avg Loss: 1.305500000\"",
        )
        .replace("4 buckets, 4 of them", "4 buckets, 1 of them");
    std::fs::write(dir.join("bin/examples/gpu_check22"), wrong).unwrap();
    let (code, rows, text) = run_script(&dir);
    assert_ne!(code, 0, "{text}");
    assert_eq!(
        verdict(&rows, "burn 0.22: toy22 cuda world=1 over nccl"),
        "FAIL",
        "{text}"
    );
    assert!(
        text.contains("only 1 of 4 buckets went over NCCL"),
        "{text}"
    );
    assert_eq!(
        verdict(&rows, "burn 0.22: toy22 over nccl = host path"),
        "FAIL",
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Binaries carried packed (`bins.tar.xz`, as scripts/build-gpu-bins.sh packs
/// them when they would not fit) are unpacked and checked as the loose ones.
#[test]
fn packed_binaries_are_unpacked_first() {
    let dir = stand_ins("packed", 1, HEALTHY);
    let bin = dir.join("bin");
    let packed = Command::new("tar")
        .arg("-cJf")
        .arg(dir.join("bins.tar.xz"))
        .arg("-C")
        .arg(&bin)
        .args(["burn-ddp-run", "examples"])
        .status()
        .unwrap();
    assert!(packed.success());
    std::fs::remove_dir_all(&bin).unwrap();
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::rename(dir.join("bins.tar.xz"), bin.join("bins.tar.xz")).unwrap();
    let (_, rows, text) = run_script(&dir);
    for check in [
        "nccl world=1 collectives",
        "burn 0.22: nccl world=1 collectives",
        "burn 0.22: toy22 cuda world=1 over nccl",
    ] {
        assert_eq!(verdict(&rows, check), "PASS", "{check}:\n{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn no_gpu_stops_after_the_machine_rows() {
    let dir = stand_ins("none", 0, HEALTHY);
    let (code, rows, text) = run_script(&dir);
    assert_ne!(code, 0, "{text}");
    assert_eq!(verdict(&rows, "gpus visible"), "FAIL", "{text}");
    assert_eq!(
        verdict(&rows, "nccl world=1 collectives"),
        "missing",
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A Python environment laid out as pip's CUDA 13 wheels are on the GPU
/// machines: NCCL as libnccl.so.2 only, NVRTC and the headers under nvidia/cu13.
fn fake_wheels(dir: &Path) -> PathBuf {
    let site = dir.join("site-packages");
    for (folder, file) in [
        ("nvidia/nccl/lib", "libnccl.so.2"),
        ("nvidia/cu13/lib", "libnvrtc.so.13"),
        ("nvidia/cu13/include", "cuda_runtime.h"),
    ] {
        std::fs::create_dir_all(site.join(folder)).unwrap();
        std::fs::write(site.join(folder).join(file), "").unwrap();
    }
    site
}

#[test]
fn pip_wheels_are_found_and_put_on_the_loader_path() {
    let dir = stand_ins("wheels", 1, HEALTHY);
    let site = fake_wheels(&dir);
    let out = dir.join("out");
    let (_, rows, text) = run_script_with(
        &dir,
        &["--out", out.to_str().unwrap()],
        &[
            ("GPU_CHECK_SITE_PACKAGES", site.to_str().unwrap()),
            ("CUDA_PATH", "/nonexistent"),
            ("CUDA_VISIBLE_DEVICES", "3"),
        ],
    );
    for check in ["libnccl", "libnvrtc", "cuda headers"] {
        assert_eq!(verdict(&rows, check), "PASS", "{check}:\n{text}");
    }
    // A stand-in library cannot tell its version: said, not guessed.
    assert_eq!(verdict(&rows, "nccl version"), "SKIP", "{text}");
    // What the binaries themselves saw.
    let log = std::fs::read_to_string(out.join("nccl1.log")).unwrap();
    let env = log.lines().find(|l| l.starts_with("ENV ")).expect(&log);
    for needle in [
        site.join("nvidia/nccl/lib").display().to_string(),
        site.join("nvidia/cu13/lib").display().to_string(),
        format!("CUDA_PATH={} ", site.join("nvidia/cu13").display()),
        "CUDA_VISIBLE_DEVICES=3".to_string(),
    ] {
        assert!(env.contains(&needle), "{needle} missing from {env}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn out_folder_gets_the_log_and_the_verdict_table() {
    let dir = stand_ins("out", 1, HEALTHY);
    let out = dir.join("out");
    let (_, rows, text) = run_script_with(&dir, &["--out", out.to_str().unwrap()], &[]);
    assert_eq!(verdict(&rows, "nccl world=1 collectives"), "PASS", "{text}");
    let table = std::fs::read_to_string(out.join("verdict.md")).unwrap();
    assert!(
        table.contains("| nccl world=1 collectives | PASS |"),
        "{table}"
    );
    let log = std::fs::read_to_string(out.join("gpu-check.log")).unwrap();
    assert!(log.contains("| check | verdict | detail |"), "{log}");
    assert!(out.join("nccl1.log").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A step that hangs is stopped at what is left of the budget, and the steps
/// that no longer fit are SKIPped: the whole check ends within the budget.
#[test]
fn a_hanging_step_cannot_overrun_the_budget() {
    let hanging = HEALTHY.replace(
        "nccl) echo \"RESULT nccl_all_reduce_sum PASS rank 0: ok\";",
        "nccl) sleep 600;",
    );
    let dir = stand_ins("budget", 1, &hanging);
    let started = std::time::Instant::now();
    let (code, rows, text) = run_script_with(&dir, &[], &[("GPU_CHECK_BUDGET", "25")]);
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(35),
        "took {took:?}:\n{text}"
    );
    assert_ne!(code, 0, "{text}");
    assert_eq!(verdict(&rows, "nccl world=1 collectives"), "FAIL", "{text}");
    for check in [
        "toy cuda world=1 over nccl",
        "ddp overhead world=1",
        "bucket all-reduce timings",
    ] {
        assert_eq!(verdict(&rows, check), "SKIP", "{check}:\n{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
