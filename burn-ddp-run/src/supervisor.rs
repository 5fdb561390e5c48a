//! Starting the workers and watching them until all exit or one fails.

use crate::cli::LaunchConfig;
use crate::output::LineSink;
use crate::rounds::{Failure, Peers, Policy, Verdict};
use crate::signals;
use burn_ddp_rendezvous::env::{FORCE_STOP_AFTER, LAUNCHER_STORE_VAR};
use burn_ddp_rendezvous::job::keys::{follow_blames, JobKeys};
use burn_ddp_rendezvous::job::{
    generate_job_id, segments, valid_job_id, JobToken, JOB_ID_VAR, JOB_TOKEN_VAR,
};
use burn_ddp_rendezvous::store::StoreServer;
use burn_ddp_rendezvous::RendezvousError;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const POLL: Duration = Duration::from_millis(10);

/// Thread-pool sizes set to 1 per worker when several share a machine.
const THREAD_VARS: [&str; 2] = ["OMP_NUM_THREADS", "RAYON_NUM_THREADS"];

struct Worker {
    rank: usize,
    local_rank: usize,
    pid: u32,
    child: Child,
    exit: Option<(ExitStatus, Duration)>,
    pumps: Vec<JoinHandle<()>>,
}

/// How a worker ended, for the failure summary.
fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by {}", signals::name(signal)),
        _ => "ended".into(),
    }
}

/// The launcher's exit code for a worker's status: its code, or 128 + signal.
fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// What admits a process to this job, handed to every worker.
struct JobIdentity {
    token: Option<JobToken>,
    id: String,
}

impl JobIdentity {
    /// The user's (the same on every machine of a multi-node job), else a fresh
    /// one for a single-node job. Several launchers cannot agree on a fresh
    /// one, so a multi-node job without a token runs open, and says so.
    fn for_job(config: &LaunchConfig) -> Result<Self, String> {
        let single_node = config.nnodes == 1;
        let token = match std::env::var(JOB_TOKEN_VAR) {
            // The setting's own message, without the library's heading.
            Ok(text) => Some(JobToken::new(text).map_err(|err| match err {
                RendezvousError::Config { message, .. } => message,
                other => other.to_string(),
            })?),
            Err(_) if single_node => Some(
                JobToken::generate().map_err(|err| format!("cannot make a job token: {err}"))?,
            ),
            Err(_) => {
                if config.node_rank == 0 {
                    log::warn!(
                        "no {JOB_TOKEN_VAR} set: the rendezvous store of this {}-machine job \
                         serves anything that reaches {}:{}; export the same \
                         {JOB_TOKEN_VAR} (e.g. `openssl rand -hex 16`) on every machine to \
                         admit only this job's ranks",
                        config.nnodes,
                        config.master_addr,
                        config.master_port
                    );
                }
                None
            }
        };
        let id = match std::env::var(JOB_ID_VAR) {
            Ok(id) if valid_job_id(&id) => id,
            Ok(id) => {
                return Err(format!(
                    "{JOB_ID_VAR}={id:?} must be 1 to 64 characters of letters, digits, \
                     '.', '_' and '-'"
                ))
            }
            Err(_) if single_node => {
                generate_job_id().map_err(|err| format!("cannot make a job id: {err}"))?
            }
            Err(_) => "default".into(),
        };
        Ok(Self { token, id })
    }
}

/// Runs the job; returns the launcher's exit code.
pub fn run(config: &LaunchConfig) -> Result<i32, String> {
    let job = JobIdentity::for_job(config)?;
    // Node 0's launcher hosts the store, like torchrun's agent, so a worker that
    // dies early does not take it down with it; it serves every round.
    let store = if config.node_rank == 0 {
        Some(host_store(config, job.token.clone())?)
    } else {
        None
    };
    let master_port = store
        .as_ref()
        .map_or(config.master_port, |s| s.addr().port());
    // Several workers each running a full thread pool oversubscribe the CPU, as
    // torchrun warns; OpenMP (BLAS) and rayon (Burn's NdArray) pools both.
    let thread_defaults: Vec<&str> = if config.nproc_per_node > 1 {
        THREAD_VARS
            .into_iter()
            .filter(|var| std::env::var_os(var).is_none())
            .collect()
    } else {
        Vec::new()
    };
    if !thread_defaults.is_empty() {
        log::info!(
            "setting {} for each of the {} processes to avoid oversubscribing \
             the CPU; set them yourself to tune",
            thread_defaults
                .iter()
                .map(|var| format!("{var}=1"))
                .collect::<Vec<_>>()
                .join(" and "),
            config.nproc_per_node
        );
    }
    // Several machines that restart agree on each round through the store
    // (reached before the signal handlers go in: a Ctrl-C while node 0 is
    // awaited simply ends the launcher).
    let peers = if config.nnodes > 1 && config.max_restarts > 0 {
        Some(Peers::connect(
            &config.master_addr,
            master_port,
            job.token.as_ref(),
            config.node_rank,
            config.nnodes,
            &job.id,
            config.shutdown_timeout,
        )?)
    } else {
        None
    };
    signals::install();
    let launch = Launch {
        config,
        job: &job,
        store: store.as_ref(),
        peers: peers.as_ref(),
        master_port,
        thread_defaults: &thread_defaults,
    };
    let mut policy = Policy::new(config.max_restarts);
    for round in 0..=config.max_restarts {
        if round > 0 {
            log::info!(
                "starting every worker again: round {round}, restart {round} of {}",
                config.max_restarts
            );
        }
        let failure = match launch.round(round)? {
            RoundEnd::Succeeded => {
                if round > 0 {
                    log::info!("the job succeeded in round {round}, after {round} restart(s)");
                }
                return Ok(0);
            }
            RoundEnd::Failed(failure) => failure,
        };
        let verdict = match (&peers, config.node_rank) {
            (None, _) => policy.after(round, &failure),
            (Some(peers), 0) => {
                let verdict = policy.after(round, &failure);
                peers.publish(round, &verdict);
                verdict
            }
            (Some(peers), _) => {
                if failure.interrupted {
                    // The user stopped this machine: it does not wait for node 0.
                    return Ok(failure.code);
                }
                peers.verdict(round)?
            }
        };
        match verdict {
            Verdict::Restart if round == config.max_restarts => {
                return Err(format!(
                    "node 0 starts round {} but this machine's --max-restarts is {}; give \
                     every machine's launcher the same --max-restarts",
                    round + 1,
                    config.max_restarts
                ))
            }
            Verdict::Restart => {}
            Verdict::Stop(code) => {
                return Ok(if failure.code != 0 {
                    failure.code
                } else {
                    code
                })
            }
        }
    }
    unreachable!("the last round returns or restarts")
}

/// How one round of workers ended.
enum RoundEnd {
    /// Every worker exited with 0.
    Succeeded,
    /// A worker failed, the user stopped the job, or another machine's
    /// round failed.
    Failed(Failure),
}

/// What every round of the job shares.
struct Launch<'a> {
    config: &'a LaunchConfig,
    job: &'a JobIdentity,
    store: Option<&'a StoreServer>,
    /// The other machines' launchers, when several machines restart.
    peers: Option<&'a Peers>,
    master_port: u16,
    thread_defaults: &'a [&'a str],
}

impl Launch<'_> {
    /// Starts this machine's workers for round `round` and supervises them
    /// until all exit or one fails.
    fn round(&self, round: u32) -> Result<RoundEnd, String> {
        let config = self.config;
        let world_size = config.nnodes * config.nproc_per_node;
        let started = Instant::now();
        let mut workers = Vec::with_capacity(config.nproc_per_node);
        for local_rank in 0..config.nproc_per_node {
            let rank = config.node_rank * config.nproc_per_node + local_rank;
            let place = Place {
                rank,
                local_rank,
                world_size,
                round,
            };
            match spawn(self, &place) {
                Ok(worker) => workers.push(worker),
                Err(err) => {
                    stop(&mut workers, config.shutdown_timeout);
                    return Err(err);
                }
            }
        }
        let keys = JobKeys::new(&self.job.id, round as usize);
        let blames = Blames {
            store: self.store,
            keys: keys.clone(),
        };
        let label = (config.max_restarts > 0).then_some(round);
        let peers = self.peers.map(|peers| (peers, round));
        let (code, interrupted) = match supervise(workers, config, started, &blames, label, peers) {
            Supervised::Succeeded => return Ok(RoundEnd::Succeeded),
            Supervised::Interrupted(code) => (code, true),
            Supervised::Failed(code) => (code, false),
            Supervised::StoppedForPeer(code) => (code, false),
        };
        Ok(RoundEnd::Failed(Failure {
            code,
            formed: self.formed(&keys, world_size),
            duplicate: self.duplicate(&keys),
            interrupted: interrupted || self.peers.is_some_and(|p| p.interrupted(round)),
        }))
    }

    /// Whether every rank joined the attempt's first group.
    fn formed(&self, keys: &JobKeys, world_size: usize) -> bool {
        let Some(store) = self.store else {
            return true; // unknown here: count it as a crash
        };
        let group = keys.group(0);
        let joined = store.entries(group.prefix());
        (0..world_size).all(|rank| joined.iter().any(|(key, _)| *key == group.join(rank)))
    }

    /// The message of a duplicate rank claim in the attempt, if any.
    fn duplicate(&self, keys: &JobKeys) -> Option<String> {
        let store = self.store?;
        store
            .entries(keys.prefix())
            .into_iter()
            .find(|(key, _)| key.ends_with("/duplicate"))
            .map(|(_, why)| String::from_utf8_lossy(&why).into_owned())
    }
}

/// Where a worker stands in the job.
struct Place {
    rank: usize,
    local_rank: usize,
    world_size: usize,
    round: u32,
}

fn host_store(config: &LaunchConfig, token: Option<JobToken>) -> Result<StoreServer, String> {
    let server = if config.standalone {
        StoreServer::bind_with_token(SocketAddr::from(([127, 0, 0, 1], 0)), token)
    } else {
        StoreServer::bind_master(&config.master_addr, config.master_port, token)
    };
    let server = server.map_err(|err| {
        format!("{err} (use --master-port to pick another port, or --standalone for a free one)")
    })?;
    log::debug!("rendezvous store listening on {}", server.addr());
    Ok(server)
}

fn spawn(launch: &Launch<'_>, place: &Place) -> Result<Worker, String> {
    let (config, job) = (launch.config, launch.job);
    let Place {
        rank,
        local_rank,
        world_size,
        round,
    } = *place;
    let mut command = Command::new(&config.program[0]);
    command
        .args(&config.program[1..])
        .env("RANK", rank.to_string())
        .env("LOCAL_RANK", local_rank.to_string())
        .env("WORLD_SIZE", world_size.to_string())
        .env("LOCAL_WORLD_SIZE", config.nproc_per_node.to_string())
        .env("GROUP_RANK", config.node_rank.to_string())
        .env("GROUP_WORLD_SIZE", config.nnodes.to_string())
        .env("ROLE_RANK", rank.to_string())
        .env("ROLE_WORLD_SIZE", world_size.to_string())
        .env("MASTER_ADDR", &config.master_addr)
        .env("MASTER_PORT", launch.master_port.to_string())
        // As torchrun: the round (0 first), and how many restarts there may be.
        .env("TORCHELASTIC_RESTART_COUNT", round.to_string())
        .env("TORCHELASTIC_MAX_RESTARTS", config.max_restarts.to_string())
        .env(LAUNCHER_STORE_VAR, "1")
        .env(JOB_ID_VAR, &job.id)
        // We are not torchrun: a worker must not look for torchrun's agent store.
        .env_remove("TORCHELASTIC_RUN_ID")
        .env_remove("TORCHELASTIC_USE_AGENT_STORE");
    if let Some(token) = &job.token {
        command.env(JOB_TOKEN_VAR, token.as_str());
    }
    for var in launch.thread_defaults {
        command.env(var, "1");
    }
    stop_with_parent(&mut command);
    let capture = config.prefix_output || config.log_dir.is_some();
    if capture {
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
    }
    let mut child = command.spawn().map_err(|err| {
        format!(
            "cannot start {:?} for rank {rank}: {err}",
            config.program[0]
        )
    })?;
    log::debug!(
        "started rank {rank} (local rank {local_rank}) as pid {}: {:?}",
        child.id(),
        config.program
    );
    let mut pumps = Vec::new();
    if capture {
        let round = (config.max_restarts > 0).then_some(round);
        let sink = LineSink::new(rank, round, config.prefix_output, config.log_dir.as_deref())
            .map_err(|err| format!("cannot open the log for rank {rank}: {err}"))?;
        pumps.push(sink.clone().pump(child.stdout.take().unwrap(), false));
        pumps.push(sink.pump(child.stderr.take().unwrap(), true));
    }
    Ok(Worker {
        rank,
        local_rank,
        pid: child.id(),
        child,
        exit: None,
        pumps,
    })
}

/// What the workers told the store about their failures: whom each blamed.
struct Blames<'a> {
    store: Option<&'a StoreServer>,
    keys: JobKeys,
}

impl Blames<'_> {
    /// Rank -> the peer its first failure pointed at, from the latest group.
    fn read(&self) -> HashMap<usize, usize> {
        let Some(store) = self.store else {
            return HashMap::new(); // another machine's launcher hosts the store
        };
        let mut latest: HashMap<usize, (u64, usize)> = HashMap::new();
        for (key, value) in store.entries(self.keys.prefix()) {
            let Some((generation, rank)) = self.keys.parse_blame(&key) else {
                continue;
            };
            let Ok(peer) = String::from_utf8_lossy(&value).parse::<usize>() else {
                continue;
            };
            let entry = latest.entry(rank).or_insert((generation, peer));
            if generation >= entry.0 {
                *entry = (generation, peer);
            }
        }
        latest.into_iter().map(|(r, (_, p))| (r, p)).collect()
    }
}

/// Where the blames lead from the first rank to fail (see [`follow_blames`]).
fn root_cause(first: usize, blames: &HashMap<usize, usize>) -> usize {
    *follow_blames(first, &[], |rank| blames.get(&rank).copied())
        .last()
        .unwrap()
}

/// After a failure, when the other workers get a second SIGTERM (more than
/// burn-ddp's one second between two stop signals, so it forces the end).
const TERM_AGAIN_AFTER: Duration = Duration::from_secs(2);

/// How supervising one round's workers ended.
enum Supervised {
    Succeeded,
    /// Stopped by the user: 128 + the signal.
    Interrupted(i32),
    /// The launcher's code for the first failure (its summary printed).
    Failed(i32),
    /// Another machine's round failed, so this one's workers were stopped;
    /// the code they ended with (128 + SIGTERM, typically).
    StoppedForPeer(i32),
}

/// How often a launcher of several machines looks for another's failure.
const PEER_POLL: Duration = Duration::from_millis(200);

/// How long a launcher whose worker failed waits for another machine's
/// report of the same round before reporting its own.
const PEER_GRACE: Duration = Duration::from_millis(500);

/// Watches `workers` until all exit or one fails (then stops the others);
/// `round` labels the summary when the job restarts. With `peers` (several
/// machines restarting, and the round), a failure here is reported to the
/// other machines, and one reported there stops the workers here.
fn supervise(
    mut workers: Vec<Worker>,
    config: &LaunchConfig,
    started: Instant,
    blames: &Blames<'_>,
    round: Option<u32>,
    peers: Option<(&Peers, u32)>,
) -> Supervised {
    let mut first_failure: Option<usize> = None;
    let mut interrupted: Option<i32> = None;
    let mut first_signal_at: Option<Instant> = None;
    let mut kill_at: Option<Instant> = None;
    let mut term_again_at: Option<Instant> = None;
    let mut peer_failure: Option<String> = None;
    let mut reported = false;
    let mut next_peer_poll = Instant::now() + PEER_POLL;
    loop {
        if let Some(signal) = signals::take() {
            if first_signal_at.is_some_and(|at| at.elapsed() < FORCE_STOP_AFTER) {
                // A double tap (the workers count it as one too): killing now
                // would cut short the save the first one asked for.
                log::info!(
                    "received {} again within {}s of the first: one request; press Ctrl-C \
                     again later to kill the workers at once",
                    signals::name(signal),
                    FORCE_STOP_AFTER.as_secs_f64()
                );
            } else if interrupted.is_none() {
                first_signal_at = Some(Instant::now());
                log::info!(
                    "received {}, passing it to the workers (a program that catches it stops \
                     after its current step; another one kills the workers at once)",
                    signals::name(signal)
                );
                interrupted = Some(signal);
                for w in workers.iter().filter(|w| w.exit.is_none()) {
                    signals::send(w.pid, signal);
                }
                kill_at.get_or_insert(Instant::now() + config.shutdown_timeout);
            } else {
                // The user insists: do not wait for a graceful stop.
                log::warn!(
                    "received {} again: killing the workers (a save under way is cut short: \
                     a file written in place is left incomplete; one written to a temporary \
                     file and renamed, as burn-ddp saves, is left as it was)",
                    signals::name(signal)
                );
                kill_at = Some(Instant::now());
            }
        }
        for (i, w) in workers.iter_mut().enumerate() {
            if w.exit.is_some() {
                continue;
            }
            if let Ok(Some(status)) = w.child.try_wait() {
                w.exit = Some((status, started.elapsed()));
                // Workers stopped for another machine's failure are not this
                // machine's failure (nor its root cause).
                if !status.success()
                    && first_failure.is_none()
                    && interrupted.is_none()
                    && peer_failure.is_none()
                {
                    first_failure = Some(i);
                }
            }
        }
        if let Some((peers, round)) = peers {
            if !reported && first_failure.is_some() && interrupted.is_none() {
                // A failure here may only echo one on another machine (these
                // workers lost their peers there): that machine's report,
                // if it comes within a moment, is the round's root cause.
                if let Some(what) = peers.failure_within(round, PEER_GRACE) {
                    log::info!(
                        "round {round} failed on another machine ({what}); stopping this \
                         machine's workers"
                    );
                    peer_failure = Some(what.to_string());
                    first_failure = None;
                    reported = true;
                }
            }
            if !reported && (first_failure.is_some() || interrupted.is_some()) {
                reported = true;
                let what = match first_failure {
                    Some(i) => format!(
                        "rank {} {}",
                        workers[i].rank,
                        describe(workers[i].exit.unwrap().0)
                    ),
                    None => "the launcher got a stop signal".to_string(),
                };
                peers.report(round, &what, first_failure.is_none());
            }
            if first_failure.is_none()
                && interrupted.is_none()
                && peer_failure.is_none()
                && Instant::now() >= next_peer_poll
            {
                next_peer_poll = Instant::now() + PEER_POLL;
                if let Some(what) = peers.failure(round) {
                    log::info!(
                        "round {round} failed on another machine ({what}); stopping this \
                         machine's workers"
                    );
                    peer_failure = Some(what.to_string());
                    reported = true;
                }
            }
        }
        if (first_failure.is_some() || peer_failure.is_some()) && kill_at.is_none() {
            // Stop the others at once; they would otherwise wait out their
            // timeouts. A stopped worker is continued so it sees the SIGTERM.
            for w in workers.iter().filter(|w| w.exit.is_none()) {
                signals::send(w.pid, libc::SIGTERM);
                signals::send(w.pid, libc::SIGCONT);
            }
            kill_at = Some(Instant::now() + config.shutdown_timeout);
            term_again_at = Some(Instant::now() + TERM_AGAIN_AFTER);
        }
        if term_again_at.is_some_and(|at| Instant::now() >= at) {
            // A program that catches SIGTERM (to stop after its step) takes a
            // second one, a while later, as "now": a rank busy outside any
            // collective does not hold the job until the shutdown timeout.
            term_again_at = None;
            for w in workers.iter().filter(|w| w.exit.is_none()) {
                signals::send(w.pid, libc::SIGTERM);
            }
        }
        if workers.iter().all(|w| w.exit.is_some()) {
            break;
        }
        if kill_at.is_some_and(|at| Instant::now() >= at) {
            for w in workers.iter_mut().filter(|w| w.exit.is_none()) {
                let _ = w.child.kill();
            }
        }
        std::thread::sleep(POLL);
    }
    drain_output(&mut workers);
    // A worker killed while setting up shared memory leaves its segment file.
    let pids: Vec<u32> = workers.iter().map(|w| w.pid).collect();
    let removed = segments::remove_left_by(&pids);
    if removed > 0 {
        log::debug!("removed {removed} shared-memory segment(s) that killed workers left");
    }
    if let Some(signal) = interrupted {
        return Supervised::Interrupted(128 + signal);
    }
    if peer_failure.is_some() && first_failure.is_none() {
        let code = workers
            .iter()
            .filter_map(|w| w.exit.map(|(status, _)| exit_code(status)))
            .find(|code| *code != 0)
            // Workers that happened to finish still belong to a failed round.
            .unwrap_or(1);
        return Supervised::StoppedForPeer(code);
    }
    match first_failure {
        None => Supervised::Succeeded,
        Some(first) => {
            let root = root_cause(workers[first].rank, &blames.read());
            print_summary(&workers, first, root, round);
            Supervised::Failed(exit_code(workers[first].exit.unwrap().0))
        }
    }
}

/// How long the output of exited workers may still take to arrive: a worker's
/// background child can hold its pipe open for ever.
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);

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

/// The failure table (of round `round`, when the job restarts). `first` indexes the first worker to fail; `root` is the
/// global rank the failure began at (the same, unless the first to fail was
/// waiting for another rank, as with a stalled one).
fn print_summary(workers: &[Worker], first: usize, root: usize, round: Option<u32>) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let first_rank = workers[first].rank;
    match round {
        Some(round) => eprintln!("burn-ddp-run: round {round} of the job failed"),
        None => eprintln!("burn-ddp-run: the job failed"),
    }
    eprintln!("  rank  local_rank  pid       ended after  result");
    for w in workers {
        let (status, at) = w.exit.unwrap();
        let cause = match (w.rank == root, w.rank == first_rank) {
            (true, true) => "  <- first failure (root cause)",
            (true, false) => "  <- root cause (the rank the others waited for)",
            (false, true) => "  <- failed first, because of the root cause",
            (false, false) => "",
        };
        eprintln!(
            "  {:<4}  {:<10}  {:<8}  {:>9.2}s  {}{cause}",
            w.rank,
            w.local_rank,
            w.pid,
            at.as_secs_f64(),
            describe(status)
        );
    }
    let clock = format!(
        "{:02}:{:02}:{:02} UTC",
        now / 3600 % 24,
        now / 60 % 60,
        now % 60
    );
    match workers.iter().find(|w| w.rank == root) {
        Some(w) if root == first_rank => eprintln!(
            "burn-ddp-run: root cause: rank {} (local rank {}, pid {}) {} at {clock}; \
             see its output above",
            w.rank,
            w.local_rank,
            w.pid,
            describe(w.exit.unwrap().0)
        ),
        Some(w) => eprintln!(
            "burn-ddp-run: root cause: rank {} (local rank {}, pid {}): rank {first_rank} \
             failed first at {clock} waiting for it, directly or through other ranks; it was \
             stalled or stopped, and in the end {}",
            w.rank,
            w.local_rank,
            w.pid,
            describe(w.exit.unwrap().0)
        ),
        None => eprintln!(
            "burn-ddp-run: root cause: rank {root}, on another machine: rank {first_rank} \
             failed first at {clock} waiting for it; see that machine's launcher"
        ),
    }
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

#[cfg(test)]
mod tests {
    use super::root_cause;
    use std::collections::HashMap;

    #[test]
    fn the_root_cause_is_where_the_blames_lead() {
        // Nobody blamed anyone: the first to fail is the cause.
        assert_eq!(root_cause(2, &HashMap::new()), 2);
        // A ring of 4 with rank 1 stalled: 2 gave up on 1, 3 on 2, 0 on 3.
        let ring: HashMap<usize, usize> = [(2, 1), (3, 2), (0, 3)].into();
        assert_eq!(root_cause(0, &ring), 1);
        assert_eq!(root_cause(3, &ring), 1);
        // Blames in a cycle end where the cycle closes, not in a loop.
        let cycle: HashMap<usize, usize> = [(0, 1), (1, 0)].into();
        assert_eq!(root_cause(0, &cycle), 1);
    }
}
