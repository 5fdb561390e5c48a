//! The launcher with real worker processes: collectives, failures, signals, flags.

mod cpus;
mod faults;
mod going_on;
mod machines;
mod restarts;

use burn_ddp_comm::{ProcessGroup, ReduceOp};
use burn_ddp_testkit::{check, run_cases, Case, SCENARIO_VAR};
use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const LAUNCHER: &str = env!("CARGO_BIN_EXE_burn-ddp-run");
const CARGO_DDP: &str = env!("CARGO_BIN_EXE_cargo-ddp");

fn main() {
    if let Ok(name) = std::env::var(SCENARIO_VAR) {
        worker(&name);
    }
    run_cases(CASES);
}

/// Every case of this suite, in the order they run.
const CASES: &[Case] = &[
    (
        "collectives_through_the_launcher_2_to_4_ranks",
        collectives_through_launcher,
    ),
    (
        "workers_get_torchruns_variables",
        workers_get_torchruns_variables,
    ),
    (
        "variables_the_user_set_reach_workers_unchanged",
        variables_the_user_set_reach_workers_unchanged,
    ),
    (
        "workers_run_on_cpus_of_their_own",
        cpus::workers_run_on_cpus_of_their_own,
    ),
    (
        "no_malloc_tuning_sets_no_allocator_variable",
        no_malloc_tuning_sets_no_allocator_variable,
    ),
    (
        "a_failing_rank_stops_the_others_and_sets_the_exit_code",
        failing_rank,
    ),
    (
        "a_rank_ignoring_sigterm_is_killed_after_the_shutdown_timeout",
        rank_ignoring_sigterm,
    ),
    (
        "a_rank_catching_sigterm_is_ended_by_a_second_one",
        rank_catching_sigterm,
    ),
    (
        "a_rank_killed_by_a_signal_gives_128_plus_signal",
        rank_killed_by_signal,
    ),
    (
        "sigterm_to_the_launcher_reaches_every_worker",
        sigterm_is_forwarded,
    ),
    (
        "a_double_tap_is_one_ctrl_c_and_a_later_one_kills_the_workers",
        second_interrupt_kills,
    ),
    ("log_dir_keeps_one_file_per_rank", log_dir),
    (
        "workers_die_with_a_killed_launcher",
        workers_die_with_launcher,
    ),
    ("bad_flags_give_a_usage_error", bad_flags),
    ("a_port_in_use_is_a_clear_error", port_in_use),
    (
        "output_held_open_by_a_workers_child_does_not_hold_the_launcher",
        output_held_open,
    ),
    (
        "two_machines_run_the_collectives",
        machines::two_machines_run_the_collectives,
    ),
    (
        "a_machine_started_late_still_forms_the_job",
        machines::a_machine_started_late_still_forms_the_job,
    ),
    (
        "a_machine_that_never_starts_is_named",
        machines::a_machine_that_never_starts_is_named,
    ),
    (
        "a_killed_machine_ends_the_job_and_is_named",
        machines::a_killed_machine_ends_the_job_and_is_named,
    ),
    (
        "a_cut_link_ends_every_rank_within_the_timeout",
        machines::a_cut_link_ends_every_rank_within_the_timeout,
    ),
    (
        "the_store_refuses_strangers_and_survives_floods",
        faults::store_refuses_strangers_and_survives_floods,
    ),
    (
        "killed_set_ups_leave_no_shared_memory",
        faults::killed_set_ups_leave_no_shared_memory,
    ),
    (
        "a_rank_killed_mid_all_reduce_is_named",
        faults::a_rank_killed_mid_all_reduce_is_named,
    ),
    (
        "a_stopped_rank_is_the_root_cause",
        faults::a_stopped_rank_is_the_root_cause,
    ),
    (
        "an_extra_collective_fails_every_rank",
        faults::an_extra_collective_fails_every_rank,
    ),
    (
        "a_crash_is_survived_by_starting_every_worker_again",
        restarts::a_crash_is_survived_by_starting_every_worker_again,
    ),
    (
        "the_job_ends_when_the_restarts_run_out",
        restarts::the_job_ends_when_the_restarts_run_out,
    ),
    (
        "a_failure_before_forming_twice_is_not_retried",
        restarts::a_failure_before_forming_twice_is_not_retried,
    ),
    (
        "a_duplicate_rank_is_not_retried",
        restarts::a_duplicate_rank_is_not_retried,
    ),
    (
        "on_failure_continue_the_others_go_on_without_a_killed_worker",
        going_on::the_others_go_on_without_a_killed_worker,
    ),
    (
        "on_failure_continue_a_worker_stopped_forever_is_killed_once_the_others_finished",
        going_on::a_worker_stopped_forever_is_killed_once_the_others_finished,
    ),
    (
        "on_failure_continue_a_replacement_nobody_admits_leaves_when_the_job_ends",
        going_on::a_replacement_nobody_admits_leaves_when_the_job_ends,
    ),
    (
        "nnodes_1_2_starts_with_one_machine_and_takes_the_second",
        machines::a_range_of_machines_starts_with_one_and_takes_the_second,
    ),
    (
        "on_failure_continue_a_machine_cut_off_leaves_and_rejoins",
        machines::a_machine_cut_off_leaves_and_rejoins_under_on_failure_continue,
    ),
    (
        "cargo_ddp_builds_in_release_and_launches",
        cargo_ddp_builds_and_launches,
    ),
];

/// Worker side: runs under the launcher, reading its environment.
fn worker(name: &str) -> ! {
    if let Some(code) = faults::worker(name)
        .or_else(|| cpus::worker(name))
        .or_else(|| restarts::worker(name))
        .or_else(|| going_on::worker(name))
    {
        std::process::exit(code);
    }
    let rank: usize = std::env::var("RANK").unwrap().parse().unwrap();
    match name {
        "collectives" => collectives(rank),
        "env" => print_launcher_env(),
        "fail" => {
            if rank == 1 {
                std::thread::sleep(Duration::from_millis(300));
                std::process::exit(3);
            }
            std::thread::sleep(Duration::from_secs(60));
        }
        "ignore_term" => stop_only_by_kill(rank),
        "catch_term" => stop_only_by_a_second_term(rank),
        "pid_then_sleep" => {
            println!("pid {}", std::process::id());
            std::thread::sleep(Duration::from_secs(60));
        }
        "self_kill" => {
            if rank == 1 {
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            }
            std::thread::sleep(Duration::from_secs(60));
        }
        _ => {}
    }
    std::process::exit(0)
}

/// The four collectives, as collectives_lab.py runs them.
fn collectives(rank: usize) {
    let g = ProcessGroup::from_env().unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    });
    let mut x = [rank as f32];
    g.all_reduce(&mut x, ReduceOp::Sum).unwrap();
    let gathered = g.all_gather(&[rank as i64]).unwrap();
    println!("sum={:?} gathered={gathered:?}", x[0]);
    // Rank 0's value everywhere, and this rank's chunk of the sum of every
    // rank's 0..2n + 100 r.
    let mut root = [if rank == 0 { 2026i64 } else { -1 }];
    g.broadcast(&mut root, 0).unwrap();
    let n = g.world_size();
    let input: Vec<f64> = (0..2 * n).map(|i| (i + 100 * rank) as f64).collect();
    let mine = g.reduce_scatter(&input, ReduceOp::Sum).unwrap();
    println!("broadcast={} reduce_scatter={mine:?}", root[0]);
    g.destroy().unwrap();
}

/// torchrun's variables as the launcher set them.
fn print_launcher_env() {
    for var in [
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "OMP_NUM_THREADS",
        "RAYON_NUM_THREADS",
        "MALLOC_MMAP_THRESHOLD_",
        "MALLOC_TRIM_THRESHOLD_",
    ] {
        println!("{var}={}", std::env::var(var).unwrap_or_default());
    }
}

/// Rank 0 ignores SIGTERM, so only the launcher's SIGKILL ends it; the
/// others fail.
fn stop_only_by_kill(rank: usize) {
    if rank == 0 {
        unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
        println!("ignoring SIGTERM");
        std::thread::sleep(Duration::from_secs(60));
    }
    std::thread::sleep(Duration::from_millis(500));
    std::process::exit(5);
}

/// Rank 0 catches SIGTERM as a trainer does, but is busy where it never asks
/// whether to stop; the others fail.
fn stop_only_by_a_second_term(rank: usize) {
    if rank == 0 {
        burn_ddp_training::stop::catch_stop_signals();
        println!("catching SIGTERM");
        std::thread::sleep(Duration::from_secs(60));
    }
    std::thread::sleep(Duration::from_millis(500));
    std::process::exit(5);
}

fn launcher(args: &[&str]) -> Command {
    let mut cmd = Command::new(LAUNCHER);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("OMP_NUM_THREADS")
        .env_remove("RAYON_NUM_THREADS")
        .env_remove("GLIBC_TUNABLES")
        // The launcher's notices are info lines, which some cases read.
        .env_remove("RUST_LOG");
    // Any of glibc's malloc variables makes the launcher leave malloc alone.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("MALLOC_") {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// Runs the launcher on this test binary as the worker program, bounded by `limit`.
fn run_scenario(
    scenario: &str,
    flags: &[&str],
    limit: Duration,
) -> Result<(Output, Duration), String> {
    let exe = std::env::current_exe().unwrap();
    let mut args: Vec<&str> = flags.to_vec();
    args.push(exe.to_str().unwrap());
    let mut cmd = launcher(&args);
    cmd.env(SCENARIO_VAR, scenario);
    bounded(cmd, limit)
}

fn bounded(mut cmd: Command, limit: Duration) -> Result<(Output, Duration), String> {
    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|e| e.to_string())?;
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = out.read_to_end(&mut buf);
        buf
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = err.read_to_end(&mut buf);
        buf
    });
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("the launcher did not exit within {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let elapsed = started.elapsed();
    Ok((
        Output {
            status,
            stdout: out_reader.join().unwrap(),
            stderr: err_reader.join().unwrap(),
        },
        elapsed,
    ))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn collectives_through_launcher() -> Result<(), String> {
    for n in 2..=4usize {
        let nproc = n.to_string();
        let (out, _) = run_scenario(
            "collectives",
            &[
                "--standalone",
                "--nproc-per-node",
                &nproc,
                "--prefix-output",
            ],
            Duration::from_secs(60),
        )?;
        let stdout = text(&out.stdout);
        check(out.status.code() == Some(0), || format!("{out:?}"))?;
        let sum = (0..n).sum::<usize>() as f32;
        let gathered: Vec<i64> = (0..n as i64).collect();
        for rank in 0..n {
            let line = format!("[rank {rank}] sum={sum:?} gathered={gathered:?}");
            check(stdout.lines().any(|l| l == line), || {
                format!("missing {line:?} in:\n{stdout}")
            })?;
        }
    }
    Ok(())
}

/// The variables a worker gets. Unbound, so its thread pools are of one
/// thread on any machine (bound, they are as large as its share of the
/// CPUs: `cpus::workers_run_on_cpus_of_their_own`).
fn workers_get_torchruns_variables() -> Result<(), String> {
    let (out, _) = run_scenario(
        "env",
        &[
            "--nproc_per_node=2",
            "--master-port",
            &free_port().to_string(),
            "--prefix-output",
            "--cpu-bind",
            "none",
        ],
        Duration::from_secs(30),
    )?;
    check(out.status.success(), || format!("{out:?}"))?;
    every_rank_printed(&text(&out.stdout), 2, |rank| {
        [
            ("RANK", rank.to_string()),
            ("LOCAL_RANK", rank.to_string()),
            ("WORLD_SIZE", "2".into()),
            ("LOCAL_WORLD_SIZE", "2".into()),
            ("GROUP_RANK", "0".into()),
            ("GROUP_WORLD_SIZE", "1".into()),
            ("ROLE_RANK", rank.to_string()),
            ("ROLE_WORLD_SIZE", "2".into()),
            ("MASTER_ADDR", "127.0.0.1".into()),
            ("OMP_NUM_THREADS", "1".into()),
            ("RAYON_NUM_THREADS", "1".into()),
            ("MALLOC_MMAP_THRESHOLD_", glibc_only("33554432")),
            ("MALLOC_TRIM_THRESHOLD_", glibc_only("1073741824")),
        ]
        .map(|(var, value)| format!("{var}={value}"))
        .to_vec()
    })?;
    let stderr = text(&out.stderr);
    check(stderr.matches("OMP_NUM_THREADS=1").count() == 1, || {
        stderr.clone()
    })?;
    let said = usize::from(GLIBC);
    check(
        stderr.matches("MALLOC_TRIM_THRESHOLD_=1073741824").count() == said,
        || stderr.clone(),
    )
}

/// Whether the launcher was built where glibc reads its allocator settings.
const GLIBC: bool = cfg!(all(target_os = "linux", target_env = "gnu"));

/// Each of `ranks` printed every one of `lines(rank)` as a whole line (the
/// `env` scenario, `--prefix-output`): `VAR=` says the variable is unset.
fn every_rank_printed(
    stdout: &str,
    ranks: usize,
    lines: impl Fn(usize) -> Vec<String>,
) -> Result<(), String> {
    for rank in 0..ranks {
        for line in lines(rank) {
            let line = format!("[rank {rank}] {line}\n");
            check(stdout.contains(&line), || {
                format!("missing {line:?} in:\n{stdout}")
            })?;
        }
    }
    Ok(())
}

/// `value` where the launcher sets it (glibc), else nothing.
fn glibc_only(value: &str) -> String {
    if GLIBC {
        value.into()
    } else {
        String::new()
    }
}

/// `--no-malloc-tuning`: glibc left to its own adjustment, thread pools as
/// always.
fn no_malloc_tuning_sets_no_allocator_variable() -> Result<(), String> {
    let (out, _) = run_scenario(
        "env",
        &[
            "--nproc-per-node",
            "2",
            "--master-port",
            &free_port().to_string(),
            "--prefix-output",
            "--no-malloc-tuning",
            "--cpu-bind=none",
        ],
        Duration::from_secs(30),
    )?;
    check(out.status.success(), || format!("{out:?}"))?;
    every_rank_printed(&text(&out.stdout), 2, |_| {
        [
            "OMP_NUM_THREADS=1",
            "MALLOC_MMAP_THRESHOLD_=",
            "MALLOC_TRIM_THRESHOLD_=",
        ]
        .map(String::from)
        .to_vec()
    })?;
    let stderr = text(&out.stderr);
    check(!stderr.contains("MALLOC_"), || stderr.clone())
}

/// Thread pools and the allocator as the user chose: the launcher's
/// defaults stand aside, each family on its own.
fn variables_the_user_set_reach_workers_unchanged() -> Result<(), String> {
    let exe = std::env::current_exe().unwrap();
    let port = free_port().to_string();
    let args = [
        "--nproc-per-node",
        "2",
        "--master-port",
        &port,
        "--prefix-output",
        "--cpu-bind",
        "none",
        exe.to_str().unwrap(),
    ];
    let mut cmd = launcher(&args);
    cmd.env(SCENARIO_VAR, "env")
        .env("RAYON_NUM_THREADS", "3")
        .env("MALLOC_TRIM_THRESHOLD_", "65536");
    let (out, _) = bounded(cmd, Duration::from_secs(30))?;
    check(out.status.success(), || format!("{out:?}"))?;
    every_rank_printed(&text(&out.stdout), 2, |_| {
        [
            "OMP_NUM_THREADS=1",
            "RAYON_NUM_THREADS=3",
            "MALLOC_TRIM_THRESHOLD_=65536",
            // Unset: the launcher set neither allocator variable.
            "MALLOC_MMAP_THRESHOLD_=",
        ]
        .map(String::from)
        .to_vec()
    })?;
    let stderr = text(&out.stderr);
    check(
        stderr.contains("setting OMP_NUM_THREADS=1 for each") && !stderr.contains("MALLOC_"),
        || stderr.clone(),
    )
}

fn failing_rank() -> Result<(), String> {
    let (out, elapsed) = run_scenario(
        "fail",
        &[
            "--nproc-per-node",
            "3",
            "--master-port",
            &free_port().to_string(),
        ],
        Duration::from_secs(30),
    )?;
    let stderr = text(&out.stderr);
    check(out.status.code() == Some(3), || format!("{out:?}"))?;
    check(elapsed < Duration::from_secs(10), || {
        format!("took {elapsed:?}")
    })?;
    check(stderr.contains("root cause: rank 1"), || stderr.clone())?;
    check(stderr.matches("killed by SIGTERM").count() == 2, || {
        stderr.clone()
    })
}

fn rank_ignoring_sigterm() -> Result<(), String> {
    let (out, elapsed) = run_scenario(
        "ignore_term",
        &[
            "--standalone",
            "--nproc-per-node",
            "2",
            "--shutdown-timeout",
            "1",
        ],
        Duration::from_secs(30),
    )?;
    let stderr = text(&out.stderr);
    check(out.status.code() == Some(5), || format!("{out:?}"))?;
    // rank 1 fails at ~0.5 s; rank 0 ignores SIGTERM and is killed 1 s later.
    check(
        elapsed >= Duration::from_millis(1400) && elapsed < Duration::from_secs(10),
        || format!("took {elapsed:?}"),
    )?;
    check(
        stderr.contains("killed by SIGKILL") && stderr.contains("root cause: rank 1"),
        || stderr.clone(),
    )
}

/// Rank 1 fails; rank 0 catches SIGTERM (to stop after its step) but never
/// gets to ask: the launcher's second SIGTERM, 2 s later, ends it with 143
/// long before the 30 s shutdown timeout.
fn rank_catching_sigterm() -> Result<(), String> {
    let (out, elapsed) = run_scenario(
        "catch_term",
        &["--standalone", "--nproc-per-node", "2"],
        Duration::from_secs(60),
    )?;
    let stderr = text(&out.stderr);
    check(out.status.code() == Some(5), || format!("{out:?}"))?;
    check(
        elapsed >= Duration::from_millis(2000) && elapsed < Duration::from_secs(10),
        || format!("took {elapsed:?}"),
    )?;
    check(
        stderr.contains("exit code 143") && stderr.contains("root cause: rank 1"),
        || stderr.clone(),
    )
}

fn rank_killed_by_signal() -> Result<(), String> {
    let (out, _) = run_scenario(
        "self_kill",
        &["--standalone", "--nproc-per-node", "2"],
        Duration::from_secs(30),
    )?;
    let stderr = text(&out.stderr);
    check(out.status.code() == Some(128 + libc::SIGKILL), || {
        format!("{out:?}")
    })?;
    check(
        stderr.contains("rank 1") && stderr.contains("killed by SIGKILL"),
        || stderr,
    )
}

fn sigterm_is_forwarded() -> Result<(), String> {
    // The sleep must not hold the output pipe open after its shell exits.
    let script = "trap 'echo rank $RANK got TERM; kill $!; exit 0' TERM; echo rank $RANK ready; \
                  sleep 30 >/dev/null 2>&1 & wait";
    let mut cmd = launcher(&["--standalone", "--nproc-per-node", "2", "sh", "-c", script]);
    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|e| e.to_string())?;
    let mut stdout = child.stdout.take().unwrap();
    // Wait until both workers have installed their trap.
    let mut seen = String::new();
    let mut buf = [0u8; 256];
    while seen.matches("ready").count() < 2 {
        let n = stdout.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 || started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            return Err(format!("workers did not start: {seen}"));
        }
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let mut rest = String::new();
    let _ = stdout.read_to_string(&mut rest);
    let status = child.wait().map_err(|e| e.to_string())?;
    check(status.code() == Some(128 + libc::SIGTERM), || {
        format!("{status:?}")
    })?;
    check(started.elapsed() < Duration::from_secs(20), || {
        "too slow".into()
    })?;
    for rank in 0..2 {
        check(rest.contains(&format!("rank {rank} got TERM")), || {
            rest.clone()
        })?;
    }
    Ok(())
}

/// Workers that catch SIGINT and carry on: the first Ctrl-C reaches them
/// (each says so), one 50 ms after it is the same request (a double tap: the
/// job goes on), and one 1.5 s later kills them at once instead of after the
/// 30 s shutdown timeout; the launcher exits 130.
fn second_interrupt_kills() -> Result<(), String> {
    let script = "trap 'echo rank $RANK got INT' INT; echo rank $RANK ready; \
                  while :; do sleep 0.2; done";
    let mut cmd = launcher(&[
        "--standalone",
        "--nproc-per-node",
        "2",
        "--shutdown-timeout",
        "30",
        "sh",
        "-c",
        script,
    ]);
    let started = Instant::now();
    let mut child = cmd.spawn().map_err(|e| e.to_string())?;
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 256];
    let mut read_until = |needle: &str, count: usize, seen: &mut String| -> Result<(), String> {
        while seen.matches(needle).count() < count {
            let n = stdout.read(&mut buf).map_err(|e| e.to_string())?;
            if n == 0 || started.elapsed() > Duration::from_secs(20) {
                return Err(format!("no {count} x {needle:?} in {seen}"));
            }
            seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        Ok(())
    };
    // The second tap once the launcher has passed the first on (a worker
    // got it), well within 1 s: sent while the first is still pending, the
    // kernel would merge the two into one delivery.
    let waited = read_until("ready", 2, &mut seen).and_then(|()| {
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
        read_until("got INT", 2, &mut seen)?;
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
        Ok(())
    });
    if let Err(err) = waited {
        let _ = child.kill();
        return Err(err);
    }
    std::thread::sleep(Duration::from_millis(1500));
    if let Ok(Some(status)) = child.try_wait() {
        return Err(format!("a double tap ended the job: {status:?}"));
    }
    let second = Instant::now();
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let status = child.wait().map_err(|e| e.to_string())?;
    let mut stderr = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
    check(status.code() == Some(128 + libc::SIGINT), || {
        format!("{status:?}: {stderr}")
    })?;
    check(second.elapsed() < Duration::from_secs(5), || {
        format!(
            "the second Ctrl-C took {:?} to end the job",
            second.elapsed()
        )
    })?;
    check(
        stderr.contains("received SIGINT again within 1s of the first: one request")
            && stderr.contains("received SIGINT again: killing the workers"),
        || stderr.clone(),
    )
}

fn log_dir() -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("burn-ddp-run-logs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (out, _) = run_scenario(
        "env",
        &[
            "--standalone",
            "--nproc-per-node",
            "2",
            "--log-dir",
            dir.to_str().unwrap(),
        ],
        Duration::from_secs(30),
    )?;
    check(out.status.success(), || format!("{out:?}"))?;
    for rank in 0..2 {
        let log = std::fs::read_to_string(dir.join(format!("rank_{rank}.log")))
            .map_err(|e| e.to_string())?;
        check(
            log.contains(&format!("RANK={rank}\n")) && !log.contains("[rank"),
            || log.clone(),
        )?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn bad_flags() -> Result<(), String> {
    for (args, expect) in [
        (
            vec!["--nproc-per-node", "zero", "true"],
            "is not a positive integer",
        ),
        (
            vec!["--frobnicate", "true"],
            "unexpected argument '--frobnicate'",
        ),
        (vec!["--standalone"], "<PROGRAM>"),
    ] {
        let (out, _) = bounded(launcher(&args), Duration::from_secs(10))?;
        let stderr = text(&out.stderr);
        check(out.status.code() == Some(2), || {
            format!("{args:?}: {out:?}")
        })?;
        check(stderr.contains(expect) && stderr.contains("--help"), || {
            stderr.clone()
        })?;
    }
    let (out, _) = bounded(launcher(&["--help"]), Duration::from_secs(10))?;
    check(
        out.status.success() && text(&out.stdout).contains("--nproc-per-node"),
        || format!("{out:?}"),
    )?;
    let (out, _) = bounded(launcher(&["--version"]), Duration::from_secs(10))?;
    check(
        out.status.success()
            && text(&out.stdout).trim() == format!("burn-ddp-run {}", env!("CARGO_PKG_VERSION")),
        || format!("{out:?}"),
    )
}

fn port_in_use() -> Result<(), String> {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port().to_string();
    let (out, _) = bounded(
        launcher(&["--master-port", &port, "--nproc-per-node", "2", "true"]),
        Duration::from_secs(10),
    )?;
    let stderr = text(&out.stderr);
    check(out.status.code() == Some(1), || format!("{out:?}"))?;
    check(
        stderr.contains(&port)
            && stderr.contains("--master-port")
            && stderr.to_lowercase().contains("in use"),
        || stderr,
    )
}

fn free_port() -> u16 {
    burn_ddp_testkit::free_port()
}

fn process_alive(pid: i32) -> bool {
    // A zombie (exited, not yet reaped by its new parent) counts as gone.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

fn workers_die_with_launcher() -> Result<(), String> {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = launcher(&[
        "--standalone",
        "--nproc-per-node",
        "2",
        exe.to_str().unwrap(),
    ]);
    cmd.env(SCENARIO_VAR, "pid_then_sleep");
    let mut child = cmd.spawn().map_err(|e| e.to_string())?;
    let mut stdout = child.stdout.take().unwrap();
    let started = Instant::now();
    let mut seen = String::new();
    let mut buf = [0u8; 256];
    while seen.matches("pid ").count() < 2 {
        let n = stdout.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 || started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            return Err(format!("workers did not start: {seen}"));
        }
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let pids: Vec<i32> = seen
        .lines()
        .filter_map(|l| l.strip_prefix("pid ")?.trim().parse().ok())
        .collect();
    child.kill().map_err(|e| e.to_string())?;
    let _ = child.wait();
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|p| process_alive(*p)) {
        if Instant::now() > deadline {
            for p in &pids {
                unsafe { libc::kill(*p, libc::SIGKILL) };
            }
            return Err(format!("workers {pids:?} outlived the launcher"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// `cargo ddp` on a scratch package with one tiny binary: it builds it in
/// release (a target dir of its own) and runs two ranks with the program's
/// arguments; a failing build is reported, not launched.
fn cargo_ddp_builds_and_launches() -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("cargo-ddp-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("src")).map_err(|e| e.to_string())?;
    let write = |name: &str, text: &str| std::fs::write(dir.join(name), text);
    write(
        "Cargo.toml",
        "[package]\nname = \"hello\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n",
    )
    .and_then(|()| {
        write(
            "src/main.rs",
            "fn main() {\n    let rank = std::env::var(\"RANK\").unwrap();\n    \
             let arg = std::env::args().nth(1).unwrap_or_default();\n    \
             println!(\"hello {rank} {arg} {}\", cfg!(debug_assertions));\n}\n",
        )
    })
    .map_err(|e| e.to_string())?;
    let manifest = dir.join("Cargo.toml");
    let cargo_ddp = |extra: &[&str]| {
        let mut cmd = Command::new(CARGO_DDP);
        cmd.args(["ddp", "--nproc-per-node", "2", "--manifest-path"])
            .arg(&manifest)
            .args(extra)
            .env("CARGO_TARGET_DIR", dir.join("target"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    };
    let (out, _) = bounded(
        cargo_ddp(&["--bin", "hello", "--", "world"]),
        Duration::from_secs(120),
    )?;
    let stdout = text(&out.stdout);
    check(out.status.success(), || format!("{out:?}"))?;
    for rank in 0..2 {
        // `false`: built without debug assertions, i.e. in release.
        check(
            stdout.contains(&format!("hello {rank} world false")),
            || format!("rank {rank} missing: {stdout}"),
        )?;
    }
    let (out, _) = bounded(cargo_ddp(&["--bin", "nope"]), Duration::from_secs(120))?;
    let stderr = text(&out.stderr);
    check(
        out.status.code() == Some(2) && stderr.contains("cargo ddp:"),
        || format!("{out:?}"),
    )?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A worker that leaves a background child holding its output pipe: the
/// launcher copies what came, waits 2 s for the rest, says so, and exits.
fn output_held_open() -> Result<(), String> {
    let cmd = launcher(&[
        "--standalone",
        "--nproc-per-node",
        "1",
        "--prefix-output",
        "sh",
        "-c",
        "sleep 20 & echo worker done",
    ]);
    let (out, elapsed) = bounded(cmd, Duration::from_secs(15))?;
    let stderr = text(&out.stderr);
    check(out.status.success(), || format!("{out:?}"))?;
    check(elapsed < Duration::from_secs(8), || {
        format!("took {elapsed:?}")
    })?;
    check(text(&out.stdout).contains("[rank 0] worker done"), || {
        text(&out.stdout)
    })?;
    check(stderr.contains("still held open"), || stderr)
}
