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
    let nnodes = machines.len().to_string();
    launcher_with(
        machines,
        node,
        (&nnodes, nproc, &[]),
        scenario,
        timeout_secs,
    )
}

/// [`launcher_on`] with `--nnodes` as given and the launcher's `flags` too.
fn launcher_with(
    machines: &Machines,
    node: usize,
    (nnodes, nproc, flags): (&str, usize, &[&str]),
    scenario: &str,
    timeout_secs: &str,
) -> Command {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = machines.command(node, LAUNCHER);
    cmd.args(flags)
        .args(["--nnodes", nnodes])
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

/// Every line of a stream, with the moment it arrived, gathered on a thread.
struct TimedLines {
    lines: std::sync::Arc<std::sync::Mutex<Vec<(Instant, String)>>>,
    reader: std::thread::JoinHandle<()>,
}

impl TimedLines {
    fn follow(stream: impl std::io::Read + Send + 'static) -> Self {
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = std::sync::Arc::clone(&lines);
        let reader = std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                sink.lock().unwrap().push((Instant::now(), line));
            }
        });
        Self { lines, reader }
    }

    fn count(&self, needle: &str) -> usize {
        let lines = self.lines.lock().unwrap();
        lines.iter().filter(|(_, l)| l.contains(needle)).count()
    }

    /// Every line, once the stream has ended (bounded: the caller's process
    /// has exited; a grandchild holding the pipe gets 5 s).
    fn finish(self) -> Vec<(Instant, String)> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.reader.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let lines = self.lines.lock().unwrap().clone();
        lines
    }
}

/// Both machines train (steady all-reduces, 2 x 2 ranks, hierarchical:
/// shared memory within a machine, TCP across, a 10 s timeout); then machine
/// 1's link is cut on both sides: no process dies, no connection is reset,
/// packets vanish, and machine 1 can no longer reach the store on machine 0.
/// Every rank on both machines ends within the timeout + 5 s of the cut:
/// both launchers exit non-zero by then. Each rank that reports says so in
/// one line naming itself and the cause (no panic, no backtrace); a rank that
/// says nothing was stopped by its launcher after its machine's other rank
/// failed (the launcher's summary says so), and each machine has a rank that
/// reports.
pub fn a_cut_link_ends_every_rank_within_the_timeout() -> Result<(), String> {
    const TIMEOUT_SECS: u64 = 10;
    let Some(machines) = Machines::create(2)? else {
        return Ok(());
    };
    let mut jobs = (0..2)
        .map(|node| CutJob::start(&machines, node, TIMEOUT_SECS))
        .collect::<Result<Vec<_>, _>>()?;
    // Every rank trains (steps of a few milliseconds), a while.
    wait_until_training(&mut jobs)?;
    std::thread::sleep(Duration::from_millis(500));
    if let Err(err) = machines.cut(1) {
        CutJob::stop_all(&mut jobs);
        return Err(err);
    }
    let cut = Instant::now();
    // Bounded well past the promise, so a regression is measured, not hung on.
    let limit = Duration::from_secs(TIMEOUT_SECS + 5);
    let give_up = cut + limit + Duration::from_secs(120);
    while jobs.iter().any(|j| j.ended.is_none()) && Instant::now() < give_up {
        for job in jobs.iter_mut().filter(|j| j.ended.is_none()) {
            if let Ok(Some(status)) = job.child.try_wait() {
                job.ended = Some((status, cut.elapsed()));
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    CutJob::stop_all(&mut jobs);
    let mut report = String::new();
    let mut failures = Vec::new();
    for (node, job) in jobs.into_iter().enumerate() {
        let stderr = job.stderr.finish();
        let _ = job.stdout.finish();
        report.push_str(&job_report(node, job.ended, &stderr, cut));
        failures.extend(judge_machine(node, job.ended, &stderr, cut, limit));
    }
    // The measurements, for the test's log.
    println!("{report}");
    check(failures.is_empty(), || {
        format!("{}\n{report}", failures.join("\n"))
    })
}

/// One machine's launcher in the cut-link test, its output timed line by line.
struct CutJob {
    child: std::process::Child,
    stdout: TimedLines,
    stderr: TimedLines,
    ended: Option<(std::process::ExitStatus, Duration)>,
}

impl CutJob {
    /// Machine `node`'s launcher of 2 ranks all-reducing steadily.
    fn start(machines: &Machines, node: usize, timeout_secs: u64) -> Result<Self, String> {
        let mut child = launcher_on(
            machines,
            node,
            2,
            "steady_all_reduce",
            &timeout_secs.to_string(),
        )
        // A panic would print its backtrace: the test must see it.
        .env("RUST_BACKTRACE", "1")
        .spawn()
        .map_err(|e| e.to_string())?;
        let stdout = TimedLines::follow(child.stdout.take().unwrap());
        let stderr = TimedLines::follow(child.stderr.take().unwrap());
        Ok(Self {
            child,
            stdout,
            stderr,
            ended: None,
        })
    }

    fn stop_all(jobs: &mut [CutJob]) {
        for job in jobs.iter_mut() {
            let _ = job.child.kill();
            let _ = job.child.wait();
        }
    }
}

/// Waits (a minute at most) until all 4 ranks say they are ready; stops the
/// jobs on failure.
fn wait_until_training(jobs: &mut Vec<CutJob>) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while jobs.iter().map(|j| j.stdout.count("ready")).sum::<usize>() < 4 {
        let gone = jobs
            .iter_mut()
            .any(|j| matches!(j.child.try_wait(), Ok(Some(_))));
        if gone || Instant::now() > deadline {
            CutJob::stop_all(jobs);
            let said: Vec<_> = jobs.drain(..).map(|j| j.stderr.finish()).collect();
            return Err(format!("the job did not start: {said:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// How machine `node`'s launcher ended and what it printed, timed from the cut.
fn job_report(
    node: usize,
    ended: Option<(std::process::ExitStatus, Duration)>,
    stderr: &[(Instant, String)],
    cut: Instant,
) -> String {
    let mut report = format!(
        "machine {node}'s launcher: {}\n",
        match ended {
            Some((status, after)) => format!("{status} {:.1}s after the cut", after.as_secs_f64()),
            None => "still running 135 s after the cut (killed)".into(),
        }
    );
    for (at, line) in stderr {
        let after = at.saturating_duration_since(cut).as_secs_f64();
        report.push_str(&format!("  {after:6.1}s  {line}\n"));
    }
    report
}

/// What is wrong with how machine `node`'s launcher and ranks ended.
fn judge_machine(
    node: usize,
    ended: Option<(std::process::ExitStatus, Duration)>,
    stderr: &[(Instant, String)],
    cut: Instant,
    limit: Duration,
) -> Vec<String> {
    let mut failures = Vec::new();
    match ended {
        Some((status, after)) if !status.success() && after <= limit => {}
        other => failures.push(format!(
            "machine {node}'s launcher should exit non-zero within {limit:?} of the cut: \
             {other:?}"
        )),
    }
    if let Some((_, line)) = stderr
        .iter()
        .find(|(_, l)| l.contains("panicked") || l.contains("stack backtrace"))
    {
        failures.push(format!("machine {node}: a panic, not a message: {line}"));
    }
    let mut reported = false;
    for rank in [2 * node, 2 * node + 1] {
        match judge_rank(rank, stderr, cut, limit) {
            Ok(said) => reported |= said,
            Err(failure) => failures.push(failure),
        }
    }
    if !reported {
        failures.push(format!("no rank on machine {node} said why it failed"));
    }
    failures
}

/// Whether `rank` reported its failure (in one line naming itself and the
/// cause, within `limit` of the cut), or was silently stopped by its
/// launcher; an error for anything else.
fn judge_rank(
    rank: usize,
    stderr: &[(Instant, String)],
    cut: Instant,
    limit: Duration,
) -> Result<bool, String> {
    let prefix = format!("[rank {rank}] ");
    let said: Vec<&(Instant, String)> = stderr
        .iter()
        .filter(|(_, l)| l.starts_with(&prefix))
        .collect();
    match said.as_slice() {
        [(at, line)] => {
            let names = line.contains(&format!("ERROR: rank {rank}: "))
                && (line.contains("timed out after") || line.contains("failed"));
            if !names {
                return Err(format!(
                    "rank {rank}'s error should name it and the cause: {line}"
                ));
            }
            if at.saturating_duration_since(cut) > limit {
                return Err(format!("rank {rank} reported after {limit:?}: {line}"));
            }
            Ok(true)
        }
        [] => {
            // Silent: stopped by its launcher once its neighbour failed.
            let stopped = stderr.iter().any(|(_, l)| {
                l.trim_start().starts_with(&format!("{rank} ")) && l.contains("killed by SIGTERM")
            });
            if stopped {
                Ok(false)
            } else {
                Err(format!(
                    "rank {rank} said nothing and was not stopped by its launcher"
                ))
            }
        }
        more => Err(format!(
            "rank {rank} should report in one line, not {}",
            more.len()
        )),
    }
}

/// `--nnodes 1:2 --on-failure continue`, both machines there from the start
/// (2 x 2 ranks, a 10 s timeout): machine 1's link is cut while they train.
/// Machine 0's ranks go on as the two
/// ranks of generation 1; machine 1's ranks cannot reach the store and
/// end, and its launcher leaves (exit non-zero, saying how to rejoin). The
/// link is restored and machine 1's launcher started again with the same
/// command: it finds the job running, its workers join it as ranks 2 and 3
/// of generation 2 at a step's end, and the job finishes on 4 ranks, both
/// launchers exiting 0.
pub fn a_machine_cut_off_leaves_and_rejoins_under_on_failure_continue() -> Result<(), String> {
    const TIMEOUT: &str = "10";
    let Some(machines) = Machines::create(2)? else {
        return Ok(());
    };
    let flags: &[&str] = &["--on-failure", "continue"];
    let start = |node| {
        launcher_with(
            &machines,
            node,
            ("1:2", 2, flags),
            "heal_all_reduce",
            TIMEOUT,
        )
        .spawn()
        .map_err(|e| e.to_string())
    };
    let mut first = start(0)?;
    let mut second = start(1)?;
    let mut out0 = first.stdout.take().unwrap();
    let mut out1 = second.stdout.take().unwrap();
    let stop = |children: &mut [&mut std::process::Child]| {
        for child in children.iter_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    };
    if let Err(err) = read_until(&mut out1, "ready", 2, Duration::from_secs(60))
        .and_then(|_| read_until(&mut out0, "ready", 2, Duration::from_secs(60)))
    {
        stop(&mut [&mut first, &mut second]);
        return Err(err);
    }
    std::thread::sleep(Duration::from_millis(300));
    machines.cut(1)?;
    let cut = Instant::now();
    // Machine 1 leaves within the timeout and the store's bound after it.
    let left = wait_bounded(&mut second, Duration::from_secs(40));
    let went_on = read_until(
        &mut out0,
        "went on: generation 1",
        2,
        Duration::from_secs(40),
    );
    let left_after = cut.elapsed();
    machines.restore(1)?;
    let (Some(left), Ok(_)) = (left, &went_on) else {
        stop(&mut [&mut first, &mut second]);
        return Err(format!(
            "machine 1 did not leave, or machine 0 did not go on: {went_on:?}"
        ));
    };
    let mut said = String::new();
    let _ = std::io::Read::read_to_string(&mut second.stderr.take().unwrap(), &mut said);
    check(
        !left.success() && said.contains("start this launcher again"),
        || format!("machine 1's launcher: {left:?}\n{said}"),
    )?;
    // Machine 1 comes back: the same command.
    let again = launcher_with(&machines, 1, ("1:2", 2, flags), "heal_all_reduce", TIMEOUT);
    let outputs = run_all(vec![again], Duration::from_secs(90));
    let ended = wait_bounded(&mut first, Duration::from_secs(90));
    let mut out0_rest = String::new();
    let _ = std::io::Read::read_to_string(&mut out0, &mut out0_rest);
    let mut err0 = String::new();
    let _ = std::io::Read::read_to_string(&mut first.stderr.take().unwrap(), &mut err0);
    stop(&mut [&mut first]);
    let (back, _) = outputs?.pop().ok_or("no run")?;
    let (back_out, back_err) = (text(&back.stdout), text(&back.stderr));
    let context = format!(
        "machine 1 left {:.1}s after the cut\nmachine 0:\n{out0_rest}\n{err0}\nmachine 1 again:\n{back_out}\n{back_err}",
        left_after.as_secs_f64()
    );
    println!("{context}");
    check(
        ended.is_some_and(|s| s.success()) && back.status.success(),
        || format!("a launcher failed: {ended:?} {:?}\n{context}", back.status),
    )?;
    for rank in [0, 1] {
        let line = format!("launched as rank {rank}: finished as rank {rank} of 4, generation 2");
        check(out0_rest.contains(&line), || {
            format!("no {line:?}\n{context}")
        })?;
    }
    for rank in [2, 3] {
        let line = format!("finished as rank {rank} of 4, generation 2");
        check(back_out.contains(&line), || {
            format!("no {line:?}\n{context}")
        })?;
    }
    check(back_err.contains("is running without this machine"), || {
        context.clone()
    })
}

/// Waits for `child` to exit, at most `limit`.
fn wait_bounded(
    child: &mut std::process::Child,
    limit: Duration,
) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// `--nnodes 1:2 --last-call 2`: machine 0's launcher starts alone; after
/// the last call its 2 ranks train as the whole job. Machine 1's launcher,
/// started later with the same command, finds the job running and its ranks
/// join as ranks 2 and 3 of generation 1; the job finishes on 4 ranks and
/// both launchers exit 0.
pub fn a_range_of_machines_starts_with_one_and_takes_the_second() -> Result<(), String> {
    let Some(machines) = Machines::create(2)? else {
        return Ok(());
    };
    let flags: &[&str] = &["--on-failure", "continue", "--last-call", "2"];
    let launch = |node| {
        let mut cmd = launcher_with(&machines, node, ("1:2", 2, flags), "heal_all_reduce", "20");
        cmd.env("HEAL_TARGET_WORLD", "4");
        cmd
    };
    let mut first = launch(0).spawn().map_err(|e| e.to_string())?;
    let mut out0 = first.stdout.take().unwrap();
    if let Err(err) = read_until(&mut out0, "ready", 2, Duration::from_secs(60)) {
        let _ = first.kill();
        let _ = first.wait();
        return Err(err);
    }
    let outputs = run_all(vec![launch(1)], Duration::from_secs(90));
    let ended = wait_bounded(&mut first, Duration::from_secs(90));
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut out0, &mut rest);
    let mut err0 = String::new();
    let _ = std::io::Read::read_to_string(&mut first.stderr.take().unwrap(), &mut err0);
    let _ = first.kill();
    let _ = first.wait();
    let (second, _) = outputs?.pop().ok_or("no run")?;
    let (out1, err1) = (text(&second.stdout), text(&second.stderr));
    let context = format!("machine 0:\n{rest}\n{err0}\nmachine 1:\n{out1}\n{err1}");
    check(
        ended.is_some_and(|s| s.success()) && second.status.success(),
        || {
            format!(
                "a launcher failed: {ended:?} {:?}\n{context}",
                second.status
            )
        },
    )?;
    check(
        err0.contains("starting the job on 1 of up to 2 machines"),
        || context.clone(),
    )?;
    for rank in [0, 1] {
        let line = format!("launched as rank {rank}: finished as rank {rank} of 4, generation 1");
        check(rest.contains(&line), || format!("no {line:?}\n{context}"))?;
    }
    for rank in [2, 3] {
        let line = format!("finished as rank {rank} of 4, generation 1");
        check(out1.contains(&line), || format!("no {line:?}\n{context}"))?;
    }
    check(err1.contains("is running without this machine"), || {
        context.clone()
    })
}
