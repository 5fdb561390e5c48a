//! Test support for burn-ddp: a tiny runner that starts real rank processes.
//!
//! The test binary re-executes itself: with `SCENARIO_VAR` set it is one rank
//! running a scenario; without, it is the driver that starts ranks, bounds every
//! wait and checks what they printed and how they exited.

mod c10d_server;
pub mod learner;
mod machines;
pub mod mnist_learner;
mod mpirun;
pub mod multiprocess;
pub mod numbers;
pub mod programs;
mod slurm;
pub mod trainers;

pub use c10d_server::C10dTestServer;
pub use machines::{Machines, REQUIRE_NETNS_VAR};
pub use mpirun::{mpirun_program, mpirun_world, REQUIRE_MPIRUN_VAR};
pub use slurm::{SlurmCluster, REQUIRE_SLURM_VAR};

use burn_ddp_rendezvous::job::{JobToken, JOB_TOKEN_VAR};
use burn_ddp_rendezvous::store::StoreServer;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const SCENARIO_VAR: &str = "BURN_DDP_TEST_SCENARIO";

/// How a rank ended.
#[derive(Debug, Clone)]
pub struct RankOutcome {
    pub rank: usize,
    /// `None` when it was killed (by us at the deadline, or by a signal).
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    pub killed_at_deadline: bool,
}

impl RankOutcome {
    pub fn ok(&self) -> Result<(), String> {
        if self.code == Some(0) {
            Ok(())
        } else {
            Err(format!(
                "rank {} exited with {:?} (killed at deadline: {})\nstdout:\n{}\nstderr:\n{}",
                self.rank, self.code, self.killed_at_deadline, self.stdout, self.stderr
            ))
        }
    }

    /// Lines `"<tag> <value>"` printed by the rank, for a given tag.
    pub fn value(&self, tag: &str) -> Option<&str> {
        self.stdout
            .lines()
            .find_map(|line| line.strip_prefix(tag)?.strip_prefix(' '))
    }
}

/// Who hosts the rendezvous store.
#[derive(Clone, Copy)]
pub enum Hosting {
    /// Rank 0, at a free port.
    RankZero,
    /// The driver (as burn-ddp-run does).
    Driver,
    /// The driver, speaking c10d's protocol, with the variables torchrun sets
    /// when its agent hosts the store.
    TorchrunAgent,
}

pub struct World {
    pub world_size: usize,
    /// Ranks actually started (a subset simulates missing peers).
    pub started: Vec<usize>,
    pub hosting: Hosting,
    pub timeout_secs: f64,
    pub env: Vec<(String, String)>,
    /// Per-rank extra variables.
    pub rank_env: Vec<(usize, String, String)>,
    pub deadline: Duration,
    /// Pause before starting the process at this index of `started` (and so
    /// every later one).
    pub start_delay: Option<(usize, Duration)>,
    /// Sends a signal to the process at this index of `started` once it has
    /// printed a line starting with the given text (a fault injected for real).
    pub signal_when: Option<(usize, &'static str, i32)>,
    /// Sends SIGCONT this long after the signal of `signal_when` (a rank
    /// stopped, then continued).
    pub continue_after: Option<Duration>,
    /// Runs the ranks on these machines, this many on each (rank r on machine
    /// r / n); rank 0 then hosts the store at machine 0's address.
    pub machines: Option<(std::sync::Arc<Machines>, usize)>,
    /// Runs this program with these arguments, in `dir`, instead of the test
    /// binary on a scenario (a trainer under a simulated launcher).
    pub program: Option<(std::path::PathBuf, Vec<String>)>,
    /// The ranks' working folder (the driver's own by default).
    pub dir: Option<std::path::PathBuf>,
    /// With [`Hosting::TorchrunAgent`]: this agent store, kept across runs
    /// (torchrun restarting its workers), instead of a fresh one per run.
    pub agent: Option<std::sync::Arc<C10dTestServer>>,
}

impl World {
    pub fn new(world_size: usize) -> Self {
        Self {
            world_size,
            started: (0..world_size).collect(),
            hosting: Hosting::Driver,
            timeout_secs: 20.0,
            env: Vec::new(),
            rank_env: Vec::new(),
            deadline: Duration::from_secs(120),
            start_delay: None,
            signal_when: None,
            continue_after: None,
            machines: None,
            program: None,
            dir: None,
            agent: None,
        }
    }

    /// Runs `program` with `args` as every rank (see [`World::program`]).
    pub fn program(mut self, program: impl Into<std::path::PathBuf>, args: &[&str]) -> Self {
        let args = args.iter().map(|a| a.to_string()).collect();
        self.program = Some((program.into(), args));
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn rank_env(mut self, rank: usize, key: &str, value: &str) -> Self {
        self.rank_env.push((rank, key.into(), value.into()));
        self
    }

    /// Starts every rank on `scenario` and waits for all of them (bounded).
    pub fn run(&self, scenario: &str) -> Vec<RankOutcome> {
        // The driver's store admits only ranks with its token, as the launcher's does.
        let token = JobToken::generate().unwrap();
        let ours = match (self.hosting, &self.machines) {
            (_, Some(_)) => None, // the driver is not on the machines' network
            (Hosting::Driver, None) => Some(
                StoreServer::bind_with_token("127.0.0.1:0".parse().unwrap(), Some(token.clone()))
                    .unwrap(),
            ),
            (_, None) => None,
        };
        let agent = match (self.hosting, &self.agent) {
            (Hosting::TorchrunAgent, Some(agent)) => Some(std::sync::Arc::clone(agent)),
            (Hosting::TorchrunAgent, None) => Some(std::sync::Arc::new(C10dTestServer::start())),
            _ => None,
        };
        let port = match (&ours, &agent) {
            (Some(server), _) => server.addr().port(),
            (_, Some(agent)) => agent.port(),
            _ => free_port(),
        };
        let exe = match &self.program {
            Some((program, _)) => program.clone(),
            None => std::env::current_exe().unwrap(),
        };
        let start = Instant::now();
        let mut children: Vec<(usize, Child)> = self
            .started
            .iter()
            .enumerate()
            .map(|(index, &rank)| {
                if let Some((_, pause)) = self.start_delay.filter(|(at, _)| *at == index) {
                    std::thread::sleep(pause);
                }
                let (mut cmd, local_rank, local_world, master) = match &self.machines {
                    Some((machines, per)) => (
                        machines.command(rank / per, exe.to_str().unwrap()),
                        rank % per,
                        *per,
                        machines.addr(0).to_string(),
                    ),
                    None => (
                        Command::new(&exe),
                        rank,
                        self.world_size,
                        "127.0.0.1".to_string(),
                    ),
                };
                if let Some((_, args)) = &self.program {
                    cmd.args(args);
                }
                if let Some(dir) = &self.dir {
                    cmd.current_dir(dir);
                }
                cmd.env(SCENARIO_VAR, scenario)
                    .env("RANK", rank.to_string())
                    .env("WORLD_SIZE", self.world_size.to_string())
                    .env("LOCAL_RANK", local_rank.to_string())
                    .env("LOCAL_WORLD_SIZE", local_world.to_string())
                    .env("MASTER_ADDR", master)
                    .env("MASTER_PORT", port.to_string())
                    .env("BURN_DDP_TIMEOUT_SECS", self.timeout_secs.to_string())
                    .env_remove("BURN_DDP_LAUNCHER_STORE")
                    .env_remove(JOB_TOKEN_VAR)
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                if ours.is_some() {
                    cmd.env("BURN_DDP_LAUNCHER_STORE", "1")
                        .env(JOB_TOKEN_VAR, token.as_str());
                }
                if agent.is_some() {
                    cmd.env("TORCHELASTIC_USE_AGENT_STORE", "True")
                        .env("TORCHELASTIC_RUN_ID", "testkit")
                        .env("TORCHELASTIC_RESTART_COUNT", "0")
                        .env("GROUP_RANK", "0");
                }
                for (key, value) in &self.env {
                    cmd.env(key, value);
                }
                for (r, key, value) in &self.rank_env {
                    if *r == rank {
                        cmd.env(key, value);
                    }
                }
                (rank, cmd.spawn().expect("spawning a rank"))
            })
            .collect();
        let readers: Vec<_> = children
            .iter_mut()
            .enumerate()
            .map(|(index, (_, child))| {
                let out = child.stdout.take().unwrap();
                let mut err = child.stderr.take().unwrap();
                let pid = child.id() as libc::pid_t;
                let trigger = self
                    .signal_when
                    .filter(|(at, _, _)| *at == index)
                    .map(|(_, line, signal)| (line, signal));
                let continue_after = self.continue_after;
                (
                    std::thread::spawn(move || {
                        let mut s = String::new();
                        for line in std::io::BufRead::lines(std::io::BufReader::new(out)) {
                            let Ok(line) = line else { break };
                            if let Some((start, signal)) = trigger {
                                if line.starts_with(start) {
                                    // SAFETY: kill has no memory-safety preconditions.
                                    unsafe { libc::kill(pid, signal) };
                                    if let Some(after) = continue_after {
                                        std::thread::spawn(move || {
                                            std::thread::sleep(after);
                                            // SAFETY: as above.
                                            unsafe { libc::kill(pid, libc::SIGCONT) };
                                        });
                                    }
                                }
                            }
                            s.push_str(&line);
                            s.push('\n');
                        }
                        s
                    }),
                    std::thread::spawn(move || {
                        let mut s = String::new();
                        let _ = err.read_to_string(&mut s);
                        s
                    }),
                )
            })
            .collect();
        let mut ended: Vec<Option<(Option<i32>, Duration, bool)>> = vec![None; children.len()];
        while ended.iter().any(Option::is_none) {
            for (i, (_, child)) in children.iter_mut().enumerate() {
                if ended[i].is_none() {
                    if let Some(status) = child.try_wait().unwrap() {
                        ended[i] = Some((status.code(), start.elapsed(), false));
                    } else if start.elapsed() > self.deadline {
                        let _ = child.kill();
                        let _ = child.wait();
                        ended[i] = Some((None, start.elapsed(), true));
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        children
            .into_iter()
            .zip(readers)
            .zip(ended)
            .map(|(((rank, _), (out, err)), end)| {
                let (code, elapsed, killed) = end.unwrap();
                RankOutcome {
                    rank,
                    code,
                    stdout: out.join().unwrap(),
                    stderr: err.join().unwrap(),
                    elapsed,
                    killed_at_deadline: killed,
                }
            })
            .collect()
    }
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    probe.local_addr().unwrap().port()
}

/// All ranks succeeded.
/// Every rank exited 0; otherwise every failed rank's output, since the first
/// one to fail is often only waiting for the one that caused it.
pub fn all_ok(outcomes: &[RankOutcome]) -> Result<(), String> {
    let failures: Vec<String> = outcomes.iter().filter_map(|o| o.ok().err()).collect();
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

pub fn check(condition: bool, message: impl FnOnce() -> String) -> Result<(), String> {
    if condition {
        Ok(())
    } else {
        Err(message())
    }
}

pub type Case = (&'static str, fn() -> Result<(), String>);

/// A multi-process test binary's `main`: as a rank (the scenario variable
/// set), runs `program(scenario)` and exits, 1 with the error on stderr if it
/// failed; otherwise, the driver, runs `cases` and then `extra`, whose ranks
/// are this binary again.
pub fn run_program_or_cases(
    program: fn(&str) -> Result<(), String>,
    cases: &[Case],
    extra: &[Case],
) -> ! {
    if let Ok(name) = std::env::var(SCENARIO_VAR) {
        if let Err(message) = program(&name) {
            eprintln!("ERROR: {message}");
            std::process::exit(1);
        }
        std::process::exit(0);
    }
    let cases: Vec<Case> = cases.iter().chain(extra).copied().collect();
    run_cases(&cases)
}

/// Every rank but `dead` failed within `within` (not at its timeout, not
/// hung), as [`every_rank_failed`] says (`code_1`, `needles`).
pub fn survivors_failed_within(
    outcomes: &[RankOutcome],
    dead: usize,
    within: Duration,
    code_1: bool,
    needles: &[&str],
) -> Result<(), String> {
    let survivors: Vec<RankOutcome> = outcomes
        .iter()
        .filter(|o| o.rank != dead)
        .cloned()
        .collect();
    check(!survivors.is_empty(), || "no rank survived to check".into())?;
    for o in &survivors {
        check(o.elapsed < within, || {
            format!("rank {} took {:?}: {}", o.rank, o.elapsed, o.stderr)
        })?;
    }
    every_rank_failed(&survivors, code_1, needles)
}

/// Every rank failed, with exit code 1 (`code_1`: an error returned) or
/// another non-zero one (a panic), and its stderr holds every one of `needles`
/// (`{rank}` in a needle stands for the rank's number).
pub fn every_rank_failed(
    outcomes: &[RankOutcome],
    code_1: bool,
    needles: &[&str],
) -> Result<(), String> {
    for o in outcomes {
        let failed = if code_1 {
            o.code == Some(1)
        } else {
            o.code.is_some_and(|c| c != 0)
        };
        check(failed, || format!("{o:?}"))?;
        for needle in needles {
            let needle = needle.replace("{rank}", &o.rank.to_string());
            check(o.stderr.contains(&needle), || {
                format!("rank {}'s error lacks {needle:?}:\n{}", o.rank, o.stderr)
            })?;
        }
    }
    Ok(())
}

/// Runs the cases whose names contain the first free argument (as libtest
/// filters), printing libtest-style lines; exits non-zero on any failure.
pub fn run_cases(cases: &[Case]) -> ! {
    let filter = std::env::args()
        .skip(1)
        .find(|arg| !arg.starts_with('-'))
        .unwrap_or_default();
    let selected: Vec<_> = cases
        .iter()
        .filter(|(name, _)| name.contains(&filter))
        .collect();
    println!("\nrunning {} tests", selected.len());
    let started = Instant::now();
    let mut failures = Vec::new();
    for (name, case) in &selected {
        let t = Instant::now();
        let result = std::panic::catch_unwind(case).unwrap_or_else(|_| Err("panicked".into()));
        match result {
            Ok(()) => println!("test {name} ... ok ({:.1}s)", t.elapsed().as_secs_f64()),
            Err(message) => {
                println!("test {name} ... FAILED");
                failures.push((name, message));
            }
        }
    }
    for (name, message) in &failures {
        println!("\n---- {name} ----\n{message}");
    }
    let passed = selected.len() - failures.len();
    println!(
        "\ntest result: {}. {passed} passed; {} failed; 0 ignored; 0 measured; {} filtered out; finished in {:.2}s\n",
        if failures.is_empty() { "ok" } else { "FAILED" },
        failures.len(),
        cases.len() - selected.len(),
        started.elapsed().as_secs_f64()
    );
    std::process::exit(if failures.is_empty() { 0 } else { 1 })
}
