//! The worker processes: starting a round's workers with torchrun's
//! environment, stopping them when one cannot start, copying their output,
//! and cleaning up after them.

use crate::cli::{LaunchConfig, OnFailure};
use crate::cpu_binding::{self, CpuShares};
use crate::error::LaunchError;
use crate::job::JobIdentity;
use crate::membership::Membership;
use crate::output::LineSink;
use crate::signals;
use crate::worker_env::Setting;
use burn_ddp_rendezvous::env::{JOINING_VAR, LAUNCHER_STORE_VAR, ON_FAILURE_VAR};
use burn_ddp_rendezvous::job::{segments, JOB_ID_VAR, JOB_TOKEN_VAR};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the launcher looks at its workers.
pub(crate) const POLL: Duration = Duration::from_millis(10);

/// How long the output of exited workers may still take to arrive: a worker's
/// background child can hold its pipe open for ever.
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);

/// One worker process of the round.
pub(crate) struct Worker {
    rank: usize,
    /// Its process id.
    pub pid: u32,
    /// The process, for `try_wait` and `kill`.
    pub child: Child,
    /// The threads copying its output.
    pumps: Vec<JoinHandle<()>>,
}

/// What every worker of the job is started with.
pub(crate) struct Launch<'a> {
    /// The user's launch.
    pub config: &'a LaunchConfig,
    /// The job's token and id.
    pub job: &'a JobIdentity,
    /// The store's port (node 0 may have picked a free one).
    pub master_port: u16,
    /// The variables set in every worker where the user's environment has
    /// none ([`crate::worker_env::defaults`]).
    pub defaults: &'a [Setting],
    /// Each local rank's CPUs, when the workers are bound.
    pub cpu_shares: Option<&'a CpuShares>,
    /// This machine's place among those the job started with; rejoining,
    /// the first round's workers join the running job ([`JOINING_VAR`]).
    pub membership: Membership,
}

/// Where a worker stands in the job.
struct Place {
    rank: usize,
    local_rank: usize,
    world_size: usize,
    round: u32,
    /// A replacement: it joins the running workers ([`JOINING_VAR`]).
    joining: bool,
}

/// Starts this machine's workers for round `round`; returns when the round
/// began (just before the first) and the workers, in local-rank order. If one
/// cannot be started, those before it are stopped.
pub(crate) fn start_round(
    launch: &Launch<'_>,
    round: u32,
) -> Result<(Instant, Vec<Worker>), LaunchError> {
    let (config, member) = (launch.config, launch.membership);
    let world_size = member.machines * config.nproc_per_node;
    let began = Instant::now();
    let mut workers = Vec::with_capacity(config.nproc_per_node);
    for local_rank in 0..config.nproc_per_node {
        let place = Place {
            rank: member.index * config.nproc_per_node + local_rank,
            local_rank,
            world_size,
            round,
            joining: member.rejoining && round == 0,
        };
        match spawn(launch, &place) {
            Ok(worker) => workers.push(worker),
            Err(err) => {
                stop(&mut workers, config.shutdown_timeout);
                return Err(err);
            }
        }
    }
    Ok((began, workers))
}

/// A replacement for the worker of `local_rank` in round `round`, which
/// joins the workers still running at their next step.
pub(crate) fn start_replacement(
    launch: &Launch<'_>,
    round: u32,
    local_rank: usize,
) -> Result<(Instant, Worker), LaunchError> {
    let (config, member) = (launch.config, launch.membership);
    let place = Place {
        rank: member.index * config.nproc_per_node + local_rank,
        local_rank,
        world_size: member.machines * config.nproc_per_node,
        round,
        joining: true,
    };
    let began = Instant::now();
    spawn(launch, &place).map(|worker| (began, worker))
}

/// The worker's command: the program with torchrun's variables.
fn command(launch: &Launch<'_>, place: &Place) -> Command {
    let (config, job) = (launch.config, launch.job);
    let mut command = Command::new(&config.program[0]);
    command
        .args(&config.program[1..])
        .env("RANK", place.rank.to_string())
        .env("LOCAL_RANK", place.local_rank.to_string())
        .env("WORLD_SIZE", place.world_size.to_string())
        .env("LOCAL_WORLD_SIZE", config.nproc_per_node.to_string())
        .env("GROUP_RANK", launch.membership.index.to_string())
        .env("GROUP_WORLD_SIZE", launch.membership.machines.to_string())
        .env("ROLE_RANK", place.rank.to_string())
        .env("ROLE_WORLD_SIZE", place.world_size.to_string())
        .env("MASTER_ADDR", &config.master_addr)
        .env("MASTER_PORT", launch.master_port.to_string())
        // As torchrun: the round (0 first), and how many restarts there may be.
        .env("TORCHELASTIC_RESTART_COUNT", place.round.to_string())
        .env("TORCHELASTIC_MAX_RESTARTS", config.max_restarts.to_string())
        .env(LAUNCHER_STORE_VAR, "1")
        .env(JOB_ID_VAR, &job.id)
        // We are not torchrun: a worker must not look for torchrun's agent store.
        .env_remove("TORCHELASTIC_RUN_ID")
        .env_remove("TORCHELASTIC_USE_AGENT_STORE");
    if let Some(token) = &job.token {
        command.env(JOB_TOKEN_VAR, token.as_str());
    }
    match config.on_failure {
        // The workers' loops learn that they may go on without one.
        OnFailure::Continue => command.env(ON_FAILURE_VAR, "continue"),
        OnFailure::Stop => command.env_remove(ON_FAILURE_VAR),
    };
    if place.joining {
        command.env(JOINING_VAR, "1");
    } else {
        command.env_remove(JOINING_VAR);
    }
    for (var, value) in launch.defaults {
        command.env(var, value);
    }
    if let Some(shares) = launch.cpu_shares {
        cpu_binding::bind(&mut command, shares.of(place.local_rank));
    }
    stop_with_parent(&mut command);
    command
}

fn spawn(launch: &Launch<'_>, place: &Place) -> Result<Worker, LaunchError> {
    let config = launch.config;
    let rank = place.rank;
    let mut command = command(launch, place);
    let capture = config.prefix_output || config.log_dir.is_some();
    if capture {
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    let mut child = command.spawn().map_err(|source| LaunchError::Spawn {
        program: config.program[0].clone(),
        rank,
        source,
    })?;
    if let Some(shares) = launch.cpu_shares {
        cpu_binding::check_bound(rank, child.id(), shares.of(place.local_rank));
    }
    log::debug!(
        "started rank {rank} (local rank {}) as pid {}: {:?}",
        place.local_rank,
        child.id(),
        config.program
    );
    let mut pumps = Vec::new();
    if capture {
        let round = (config.max_restarts > 0).then_some(place.round);
        let sink = LineSink::new(rank, round, config.prefix_output, config.log_dir.as_deref())
            .map_err(|source| LaunchError::LogFile { rank, source })?;
        pumps.push(sink.clone().pump(child.stdout.take().unwrap(), false));
        pumps.push(sink.pump(child.stderr.take().unwrap(), true));
    }
    Ok(Worker {
        rank,
        pid: child.id(),
        child,
        pumps,
    })
}

/// Terminates workers that were already started (when a later one failed to start).
fn stop(workers: &mut [Worker], grace: Duration) {
    for w in workers.iter() {
        signals::send(w.pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    for w in workers.iter_mut() {
        while Instant::now() < deadline {
            if let Ok(Some(_)) = w.child.try_wait() {
                break;
            }
            std::thread::sleep(POLL);
        }
        let _ = w.child.kill();
        let _ = w.child.wait();
    }
}

/// Makes the kernel SIGTERM a worker if the launcher itself dies (even by
/// SIGKILL), so no orphaned worker keeps a GPU or a port.
#[cfg(target_os = "linux")]
fn stop_with_parent(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe, as required between fork and exec.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn stop_with_parent(_command: &mut Command) {}

/// Whether process `pid` is stopped by a signal (SIGSTOP; not one a
/// debugger holds): its state in `/proc/<pid>/stat`, after the command
/// name's closing parenthesis.
pub(crate) fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')')?.1.trim_start().chars().next())
        .is_some_and(|state| state == 'T')
}

/// After every worker of the round has ended: the rest of their output, and
/// the shared-memory segments of workers killed while setting it up.
pub(crate) fn clean_up(workers: &mut [Worker]) {
    drain_output(workers);
    let pids: Vec<u32> = workers.iter().map(|w| w.pid).collect();
    let removed = segments::remove_left_by(&pids);
    if removed > 0 {
        log::debug!("removed {removed} shared-memory segment(s) that killed workers left");
    }
}

/// Waits (boundedly) for every worker's remaining output to be copied.
fn drain_output(workers: &mut [Worker]) {
    let deadline = Instant::now() + OUTPUT_DRAIN;
    while Instant::now() < deadline
        && workers
            .iter()
            .any(|w| w.pumps.iter().any(|pump| !pump.is_finished()))
    {
        std::thread::sleep(POLL);
    }
    for w in workers {
        let (done, held): (Vec<_>, Vec<_>) = w.pumps.drain(..).partition(|p| p.is_finished());
        for pump in done {
            let _ = pump.join();
        }
        if !held.is_empty() {
            log::warn!(
                "rank {}'s output is still held open {}s after it exited, by a process \
                 it started; not waiting for the rest",
                w.rank,
                OUTPUT_DRAIN.as_secs()
            );
        }
    }
}
