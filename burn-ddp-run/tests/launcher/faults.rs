//! Faults injected for real into jobs under the launcher: strangers at the
//! store, floods of connections, killed and stopped ranks, killed set-ups.

use crate::{launcher, text};
use burn_ddp_comm::{CommError, ProcessGroup, ReduceOp};
use burn_ddp_testkit::{check, free_port, SCENARIO_VAR};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Worker side of the scenarios below; `None` if `name` is not one of them.
pub fn worker(name: &str) -> Option<i32> {
    let scenario: fn(&str, usize) -> Result<i32, CommError> = match name {
        "gated_collectives" => gated_collectives,
        "join_now" => |_, _| ProcessGroup::from_env().map(|_| 0),
        "mixed_transports" => mixed_transports,
        "big_all_reduce" | "steady_all_reduce" => all_reduce_until_failure,
        "extra_collective" => extra_collective,
        _ => return None,
    };
    let rank: usize = std::env::var("RANK").ok()?.parse().ok()?;
    println!("pid {}", std::process::id());
    Some(scenario(name, rank).unwrap_or_else(|err| {
        eprintln!("ERROR: {err}");
        1
    }))
}

/// Forms the group when the driver opens the gate (while it floods the
/// store), reduces, then waits for the second gate so the driver can count
/// the launcher's descriptors.
fn gated_collectives(_name: &str, rank: usize) -> Result<i32, CommError> {
    let gate = std::path::PathBuf::from(std::env::var("FAULT_GATE").unwrap_or_default());
    if !wait_for_file(&gate.join("form")) {
        return Ok(2);
    }
    let group = ProcessGroup::from_env()?;
    let mut x = [rank as f32];
    group.all_reduce(&mut x, ReduceOp::Sum)?;
    println!("sum={}", x[0]);
    if !wait_for_file(&gate.join("finish")) {
        return Ok(2);
    }
    group.destroy().map(|()| 0)
}

/// Rank 0 waits for the others to map its shared memory; they never will
/// (they use TCP), so the segment stays in /dev/shm until killed.
fn mixed_transports(_name: &str, rank: usize) -> Result<i32, CommError> {
    let transport = if rank == 0 { "shm" } else { "tcp" };
    // Single-threaded still: no other thread reads the environment.
    std::env::set_var("BURN_DDP_TRANSPORT", transport);
    ProcessGroup::from_env().map(|_| 0)
}

/// All-reduces until something fails: a big buffer, or small ones paced
/// like training steps.
fn all_reduce_until_failure(name: &str, _rank: usize) -> Result<i32, CommError> {
    let group = ProcessGroup::from_env()?;
    let steady = name == "steady_all_reduce";
    let mut data = vec![1.0f32; if steady { 256 } else { 16 << 20 }];
    println!("ready");
    loop {
        group.all_reduce(&mut data, ReduceOp::Sum)?;
        data.fill(1.0);
        if steady {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The last collective of rank 0 is one the others never make.
fn extra_collective(_name: &str, rank: usize) -> Result<i32, CommError> {
    let group = ProcessGroup::from_env()?;
    if rank == 0 {
        let mut x = vec![1.0f32; 1000];
        group.all_reduce(&mut x, ReduceOp::Sum)?;
    }
    group.destroy().map(|()| 0)
}

/// Waits (up to a minute) for the driver to create `path`.
fn wait_for_file(path: &std::path::Path) -> bool {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

/// A launcher running this test binary, its output collected as it comes.
struct LiveJob {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    started: Instant,
}

impl LiveJob {
    fn start(scenario: &str, flags: &[&str], env: &[(&str, &str)]) -> Self {
        let exe = std::env::current_exe().unwrap();
        let mut args: Vec<&str> = flags.to_vec();
        args.push("--prefix-output");
        args.push(exe.to_str().unwrap());
        let mut cmd = launcher(&args);
        cmd.env(SCENARIO_VAR, scenario);
        for (key, value) in env {
            cmd.env(key, value);
        }
        let mut child = cmd.spawn().expect("starting the launcher");
        let collect = |mut pipe: Box<dyn Read + Send>| {
            let text = Arc::new(Mutex::new(String::new()));
            let sink = Arc::clone(&text);
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n @ 1..) = pipe.read(&mut buf) {
                    sink.lock()
                        .unwrap()
                        .push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            });
            text
        };
        let stdout = collect(Box::new(child.stdout.take().unwrap()));
        let stderr = collect(Box::new(child.stderr.take().unwrap()));
        Self {
            child,
            stdout,
            stderr,
            started: Instant::now(),
        }
    }

    fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until stdout holds `count` lines containing `needle`.
    fn wait_for(&mut self, needle: &str, count: usize, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        while self.stdout().matches(needle).count() < count {
            if Instant::now() > deadline || matches!(self.child.try_wait(), Ok(Some(_))) {
                let _ = self.child.kill();
                return Err(format!(
                    "no {count} x {needle:?} within {limit:?}:\n{}\n{}",
                    self.stdout(),
                    self.stderr()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// The pid rank `rank` printed.
    fn pid_of(&self, rank: usize) -> Option<i32> {
        let prefix = format!("[rank {rank}] pid ");
        self.stdout()
            .lines()
            .find_map(|line| line.strip_prefix(&prefix)?.trim().parse().ok())
    }

    fn wait(mut self, limit: Duration) -> Result<(ExitStatus, Duration, String, String), String> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                let elapsed = self.started.elapsed();
                std::thread::sleep(Duration::from_millis(50)); // let the readers finish
                return Ok((status, elapsed, self.stdout(), self.stderr()));
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                return Err(format!(
                    "the launcher did not exit within {limit:?}:\n{}\n{}",
                    self.stdout(),
                    self.stderr()
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| dir.count())
        .unwrap_or(0)
}

fn connect_when_listening(port: u16, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            return Err(format!("nothing listens on {port} after {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// While a 4-rank job starts: 500 idle connections and one stalled mid-frame
/// stay open at its store, a process of another job (no token) tries to join,
/// and 10,000 connections open and close. The intruder is refused at once,
/// the job forms and sums correctly, and the launcher's descriptors come back
/// to within 16 of where they started.
pub fn store_refuses_strangers_and_survives_floods() -> Result<(), String> {
    let port = free_port();
    let port_text = port.to_string();
    let gate = std::env::temp_dir().join(format!("burn-ddp-gate-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&gate);
    std::fs::create_dir_all(&gate).map_err(|e| e.to_string())?;
    let mut job = LiveJob::start(
        "gated_collectives",
        &["--nproc-per-node", "4", "--master-port", &port_text],
        &[("FAULT_GATE", gate.to_str().unwrap())],
    );
    connect_when_listening(port, Duration::from_secs(10))?;
    let launcher_pid = job.child.id();
    let fds_before = open_fds(launcher_pid);
    let idle: Vec<TcpStream> = (0..500)
        .map(|_| TcpStream::connect(("127.0.0.1", port)))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let mut stalled = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    stalled.write_all(&[64, 0]).map_err(|e| e.to_string())?;

    // Another job's rank, pointed at this store (it has no token).
    let intruder_started = Instant::now();
    let intruder = Command::new(std::env::current_exe().unwrap())
        .env(SCENARIO_VAR, "join_now")
        .env("RANK", "1")
        .env("WORLD_SIZE", "4")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", &port_text)
        .env("BURN_DDP_LAUNCHER_STORE", "1")
        .env_remove("BURN_DDP_JOB_TOKEN")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    let intruder_err = text(&intruder.stderr);
    check(!intruder.status.success(), || {
        format!("the intruder joined: {intruder:?}")
    })?;
    check(
        intruder_started.elapsed() < Duration::from_secs(5)
            && intruder_err.contains("rank 1")
            && intruder_err.contains("BURN_DDP_JOB_TOKEN"),
        || format!("intruder: {:?}: {intruder_err}", intruder_started.elapsed()),
    )?;

    for cycle in 0..10_000 {
        let conn = TcpStream::connect(("127.0.0.1", port)).map_err(|e| {
            format!(
                "cycle {cycle}: {e}\n{}\n{}\n{:?}",
                job.stdout(),
                job.stderr(),
                job.child.try_wait()
            )
        })?;
        drop(conn);
    }
    // The job forms with the idle and stalled connections still open.
    std::fs::write(gate.join("form"), b"").map_err(|e| e.to_string())?;
    job.wait_for("sum=6", 4, Duration::from_secs(30))?;
    drop(idle);
    drop(stalled);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut fds_after = open_fds(launcher_pid);
    while fds_after > fds_before + 16 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        fds_after = open_fds(launcher_pid);
    }
    std::fs::write(gate.join("finish"), b"").map_err(|e| e.to_string())?;
    check(fds_after <= fds_before + 16, || {
        format!("launcher descriptors {fds_before} -> {fds_after}")
    })?;
    let (status, _, stdout, stderr) = job.wait(Duration::from_secs(30))?;
    let _ = std::fs::remove_dir_all(&gate);
    check(status.success(), || {
        format!("{status:?}\n{stdout}\n{stderr}")
    })?;
    check(stdout.matches("sum=6").count() == 4, || stdout.clone())?;
    // The refusal is logged once, however many strangers came.
    check(stderr.matches("refused").count() <= 1, || stderr)
}

fn segments_of(pids: &[i32]) -> Vec<String> {
    let dir = burn_ddp_rendezvous::job::segments::dir();
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| {
                    pids.iter()
                        .any(|pid| name.starts_with(&format!("burn-ddp-{pid}-")))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// 20 jobs killed while rank 0's shared memory waits to be mapped: rank 0 is
/// SIGKILLed, so it cannot remove its segment; the launcher does.
pub fn killed_set_ups_leave_no_shared_memory() -> Result<(), String> {
    for run in 0..20 {
        let mut job = LiveJob::start(
            "mixed_transports",
            &["--standalone", "--nproc-per-node", "2"],
            &[("BURN_DDP_TIMEOUT_SECS", "30")],
        );
        job.wait_for("pid ", 2, Duration::from_secs(20))?;
        let pids: Vec<i32> = (0..2).filter_map(|r| job.pid_of(r)).collect();
        let rank0 = job.pid_of(0).ok_or("no pid for rank 0")?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while segments_of(&[rank0]).is_empty() {
            if Instant::now() > deadline {
                let _ = job.child.kill();
                return Err(format!("run {run}: rank 0 made no segment"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        unsafe { libc::kill(rank0, libc::SIGKILL) };
        let (status, _, _, stderr) = job.wait(Duration::from_secs(30))?;
        check(status.code() == Some(128 + libc::SIGKILL), || {
            format!("run {run}: {status:?}\n{stderr}")
        })?;
        let left = segments_of(&pids);
        check(left.is_empty(), || format!("run {run}: left {left:?}"))?;
    }
    Ok(())
}

/// One rank SIGKILLed in the middle of all-reducing a 64 MiB buffer: the job
/// ends within 5 s, and the launcher exits with its signal and names it as the
/// root cause. 2 and 4 ranks, both transports. (The launcher stops the
/// survivors at once; that they notice by themselves, naming the rank, is
/// tested without a launcher in burn-ddp-comm's multiprocess tests.)
pub fn a_rank_killed_mid_all_reduce_is_named() -> Result<(), String> {
    for (nproc, transport) in [(2, "tcp"), (2, "shm"), (4, "tcp"), (4, "shm")] {
        let victim = nproc - 1;
        let nproc_text = nproc.to_string();
        let mut job = LiveJob::start(
            "big_all_reduce",
            &["--standalone", "--nproc-per-node", &nproc_text],
            &[
                ("BURN_DDP_TRANSPORT", transport),
                ("BURN_DDP_TIMEOUT_SECS", "60"),
            ],
        );
        job.wait_for("ready", nproc, Duration::from_secs(30))?;
        std::thread::sleep(Duration::from_millis(300)); // well inside a reduction
        let pid = job.pid_of(victim).ok_or("no pid")?;
        let killed = Instant::now();
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let (status, _, _, stderr) = job.wait(Duration::from_secs(30))?;
        let took = killed.elapsed();
        let case = format!("{nproc} ranks over {transport}");
        check(status.code() == Some(128 + libc::SIGKILL), || {
            format!("{case}: {status:?}\n{stderr}")
        })?;
        check(took < Duration::from_secs(5), || {
            format!("{case}: took {took:?}\n{stderr}")
        })?;
        check(
            stderr.contains(&format!("root cause: rank {victim} ")),
            || format!("{case}:\n{stderr}"),
        )?;
        check(stderr.contains("killed by SIGTERM"), || {
            format!("{case}: the survivors were not stopped:\n{stderr}")
        })?;
    }
    Ok(())
}

/// One rank SIGSTOPped with a 3 s timeout: the others exit within 8 s naming
/// it, and the launcher names the stopped rank as the root cause although
/// another rank failed first. 2 and 4 ranks, both transports.
pub fn a_stopped_rank_is_the_root_cause() -> Result<(), String> {
    for (nproc, transport) in [(2, "tcp"), (2, "shm"), (4, "tcp"), (4, "shm")] {
        let stopped = 1;
        let nproc_text = nproc.to_string();
        let mut job = LiveJob::start(
            "steady_all_reduce",
            &[
                "--standalone",
                "--nproc-per-node",
                &nproc_text,
                "--shutdown-timeout",
                "2",
            ],
            &[
                ("BURN_DDP_TRANSPORT", transport),
                ("BURN_DDP_TIMEOUT_SECS", "3"),
            ],
        );
        job.wait_for("ready", nproc, Duration::from_secs(30))?;
        let pid = job.pid_of(stopped).ok_or("no pid")?;
        let at = Instant::now();
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        let (status, _, _, stderr) = job.wait(Duration::from_secs(30))?;
        let took = at.elapsed();
        let case = format!("{nproc} ranks over {transport}");
        check(!status.success(), || format!("{case}: {status:?}"))?;
        check(took < Duration::from_secs(8), || {
            format!("{case}: took {took:?}\n{stderr}")
        })?;
        check(
            stderr.contains(&format!("root cause: rank {stopped} ")),
            || format!("{case}:\n{stderr}"),
        )?;
        check(stderr.contains("the rank the others waited for"), || {
            format!("{case}:\n{stderr}")
        })?;
    }
    Ok(())
}

/// Rank 0 makes one collective the others never make: every rank fails
/// within 5 s (none waits out the 60 s timeout).
pub fn an_extra_collective_fails_every_rank() -> Result<(), String> {
    for transport in ["tcp", "shm"] {
        let job = LiveJob::start(
            "extra_collective",
            &["--standalone", "--nproc-per-node", "3"],
            &[
                ("BURN_DDP_TRANSPORT", transport),
                ("BURN_DDP_TIMEOUT_SECS", "60"),
            ],
        );
        let (status, took, _, stderr) = job.wait(Duration::from_secs(30))?;
        check(!status.success(), || format!("{transport}: {status:?}"))?;
        check(took < Duration::from_secs(5), || {
            format!("{transport}: took {took:?}\n{stderr}")
        })?;
        // Every rank ended in failure: the ones that noticed with an error,
        // the rest stopped by the launcher at once.
        check(
            stderr.contains("out of step") && !stderr.contains("exit code 0"),
            || format!("{transport}:\n{stderr}"),
        )?;
    }
    Ok(())
}
