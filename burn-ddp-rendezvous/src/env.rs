//! Reading the launcher's environment: who am I, how many are we, where is the store.
//!
//! Precedence, highest first (the first family with its rank variable set wins):
//! 1. `RANK`/`WORLD_SIZE` (torchrun, burn-ddp-run, or set by hand);
//! 2. Open MPI's `OMPI_COMM_WORLD_*` (`mpirun`);
//! 3. Slurm's `SLURM_PROCID`/`SLURM_NTASKS` (`srun`).
//!
//! torchrun inside a Slurm allocation therefore behaves as torchrun. With none of
//! them set the program is a world of one process and needs no network. Under
//! Slurm, a missing `MASTER_ADDR` is the step's first node, a missing
//! `MASTER_PORT` one derived from the job id, and the local world size the
//! step's tasks on this node.

mod slurm;

use crate::error::{RendezvousError, Result};
use crate::job::{valid_job_id, JobToken, JOB_ID_VAR, JOB_TOKEN_VAR};
use std::time::Duration;

/// Default rendezvous port, as torchrun's.
pub const DEFAULT_MASTER_PORT: u16 = 29500;
/// Default bound on every wait (rendezvous and collectives).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Set by burn-ddp-run in each worker: the launcher hosts the store.
pub const LAUNCHER_STORE_VAR: &str = "BURN_DDP_LAUNCHER_STORE";
/// Overrides the timeout, in seconds.
pub const TIMEOUT_VAR: &str = "BURN_DDP_TIMEOUT_SECS";

/// Set to `continue` by `burn-ddp-run --on-failure continue` for its
/// workers: when one fails the others go on, so a loop that can should.
pub const ON_FAILURE_VAR: &str = "BURN_DDP_ON_FAILURE";

/// Set to `1` by `burn-ddp-run` for a worker it starts in place of one that
/// failed while the others went on: the worker joins the running group at
/// its next step boundary (its `RANK` is the one it replaces, not its
/// place in the group) and takes the training state from a peer.
pub const JOINING_VAR: &str = "BURN_DDP_JOINING";

/// How long after a first stop signal (Ctrl-C, SIGTERM) another one means
/// "stop now", for the launcher and its workers alike: the terminal's Ctrl-C
/// reaches both, and a double tap is one request, not two.
pub const FORCE_STOP_AFTER: Duration = Duration::from_secs(1);

/// The job id when neither burn-ddp-run nor another launcher names one.
pub const DEFAULT_JOB_ID: &str = "default";

/// The longest timeout [`TIMEOUT_VAR`] may set: a year.
const MAX_TIMEOUT_SECS: f64 = 365.0 * 24.0 * 3600.0;

/// Which launcher started this process, as far as the environment tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// No launcher: a single process.
    None,
    /// burn-ddp-run.
    BurnDdpRun,
    /// PyTorch's torchrun (torch.distributed.run).
    Torchrun,
    /// `RANK`/`WORLD_SIZE` set by hand or by another tool.
    Env,
    /// Open MPI's mpirun.
    OpenMpi,
    /// Slurm's srun.
    Slurm,
}

/// Who hosts the rendezvous store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreHost {
    /// Rank 0 starts it at MASTER_ADDR:MASTER_PORT.
    RankZero,
    /// The launcher already serves burn-ddp's store there.
    Launcher,
    /// torchrun's agent serves a c10d TCPStore there.
    TorchrunAgent,
}

/// Everything the process group needs from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// Global rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Rank on this machine (selects the GPU).
    pub local_rank: usize,
    /// Ranks on this machine.
    pub local_world_size: usize,
    /// Host of the rendezvous store (`None` only for a world of one).
    pub master_addr: Option<String>,
    /// Port of the rendezvous store.
    pub master_port: u16,
    /// Who started us.
    pub launcher: Launcher,
    /// Who hosts the store.
    pub store_host: StoreHost,
    /// Bound on every wait.
    pub timeout: Duration,
    /// Index of this machine among the job's machines (`GROUP_RANK`,
    /// `SLURM_NODEID`), when the launcher says.
    pub node_rank: Option<usize>,
    /// torchrun's job id (`TORCHELASTIC_RUN_ID`), named in errors.
    pub run_id: Option<String>,
    /// How many times torchrun restarted the workers
    /// (`TORCHELASTIC_RESTART_COUNT`); each attempt uses its own store keys.
    pub restart_count: usize,
    /// The secret this rank presents to the store and its peers
    /// ([`JOB_TOKEN_VAR`]); `None` when the job runs without one.
    pub job_token: Option<JobToken>,
    /// The job's id in store keys ([`JOB_ID_VAR`], else the launcher's run id).
    pub job_id: String,
}

impl LaunchEnv {
    /// Reads the process environment.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads variables through `lookup` (tests pass a map).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let vars = Vars { lookup: &lookup };
        let Some((launcher, names)) = vars.launcher() else {
            vars.check_world_of_one()?;
            return Ok(Self::single_process(vars.timeout()?));
        };
        let (rank, world_size) = vars.rank_and_world(names)?;
        let slurm = launcher == Launcher::Slurm;
        // A task of an srun step; a batch script itself has SLURM_PROCID=0 and
        // SLURM_NTASKS but no step.
        let srun_step = slurm && vars.present("SLURM_STEP_ID");
        let (local_rank, local_world_size) =
            vars.place_on_machine(names, rank, world_size, slurm)?;
        let master_addr = vars.master_addr(srun_step);
        let master_port = vars.master_port(rank, srun_step)?;
        if world_size > 1 && master_addr.is_none() {
            return Err(no_master_addr(rank, world_size, slurm && !srun_step));
        }
        let node_rank = match names.node_rank {
            Some(name) => vars.number(name)?,
            None => None,
        };
        let restart_count = vars.number("TORCHELASTIC_RESTART_COUNT")?.unwrap_or(0);
        Ok(Self {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
            launcher,
            store_host: vars.store_host(),
            timeout: vars.timeout()?,
            node_rank,
            run_id: vars.get("TORCHELASTIC_RUN_ID"),
            restart_count,
            job_token: vars.job_token(rank)?,
            job_id: vars.job_id(rank)?,
        })
    }

    /// A world of one process.
    pub fn single_process(timeout: Duration) -> Self {
        Self {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            master_addr: None,
            master_port: DEFAULT_MASTER_PORT,
            launcher: Launcher::None,
            store_host: StoreHost::RankZero,
            timeout,
            node_rank: None,
            run_id: None,
            restart_count: 0,
            job_token: None,
            job_id: DEFAULT_JOB_ID.into(),
        }
    }
}

/// The variable names of one launcher family.
#[derive(Clone, Copy)]
struct Names {
    rank: &'static str,
    world_size: &'static str,
    local_rank: &'static str,
    local_world_size: &'static str,
    /// Open MPI exports no node index.
    node_rank: Option<&'static str>,
}

const TORCHRUN_NAMES: Names = Names {
    rank: "RANK",
    world_size: "WORLD_SIZE",
    local_rank: "LOCAL_RANK",
    local_world_size: "LOCAL_WORLD_SIZE",
    node_rank: Some("GROUP_RANK"),
};

const OPEN_MPI_NAMES: Names = Names {
    rank: "OMPI_COMM_WORLD_RANK",
    world_size: "OMPI_COMM_WORLD_SIZE",
    local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
    local_world_size: "OMPI_COMM_WORLD_LOCAL_SIZE",
    node_rank: None,
};

// Slurm has no per-node task count variable in every version; SLURM_NTASKS_PER_NODE
// is only set when requested, so a missing one falls back to the world size.
const SLURM_NAMES: Names = Names {
    rank: "SLURM_PROCID",
    world_size: "SLURM_NTASKS",
    local_rank: "SLURM_LOCALID",
    local_world_size: "SLURM_NTASKS_PER_NODE",
    node_rank: Some("SLURM_NODEID"),
};

/// The error for several ranks without a rendezvous address: Slurm's batch
/// script run by itself (`batch_script`), or a launcher that did not set it.
fn no_master_addr(rank: usize, world_size: usize, batch_script: bool) -> RendezvousError {
    if batch_script {
        return RendezvousError::config(
            Some(rank),
            "SLURM_STEP_ID",
            format!(
                "rank {rank} of {world_size}: this is Slurm's batch script itself \
                 (SLURM_PROCID is set, SLURM_STEP_ID is not), not one of {world_size} tasks; \
                 start the program with srun, which starts a task per rank"
            ),
        );
    }
    RendezvousError::config(
        Some(rank),
        "MASTER_ADDR",
        format!(
            "rank {rank} of {world_size}: MASTER_ADDR is not set, so the ranks cannot \
             find each other; export MASTER_ADDR (the host of rank 0) and MASTER_PORT, \
             or start the job with burn-ddp-run"
        ),
    )
}

struct Vars<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
}

impl Vars<'_> {
    /// Who started this process and the names its variables go by; `None`
    /// when no launcher did (a world of one).
    fn launcher(&self) -> Option<(Launcher, Names)> {
        if self.present("RANK") {
            let launcher = if self.present(LAUNCHER_STORE_VAR) {
                Launcher::BurnDdpRun
            } else if self.present("TORCHELASTIC_RUN_ID") {
                Launcher::Torchrun
            } else {
                Launcher::Env
            };
            Some((launcher, TORCHRUN_NAMES))
        } else if self.present("OMPI_COMM_WORLD_RANK") {
            Some((Launcher::OpenMpi, OPEN_MPI_NAMES))
        } else if self.present("SLURM_PROCID") {
            Some((Launcher::Slurm, SLURM_NAMES))
        } else {
            None
        }
    }

    /// Without a launcher's RANK, a WORLD_SIZE other than 1 is a mistake.
    fn check_world_of_one(&self) -> Result<()> {
        match self.get("WORLD_SIZE") {
            Some(world) if world.trim() != "1" => Err(RendezvousError::config(
                None,
                "RANK",
                format!(
                    "WORLD_SIZE={world} is set but RANK is not; set RANK (0..{world}) for \
                     every process, or start them with burn-ddp-run"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The rank and the world size, checked against each other.
    fn rank_and_world(&self, names: Names) -> Result<(usize, usize)> {
        let rank = self
            .number(names.rank)?
            .expect("the launcher's rank is set");
        let world_size = self.number(names.world_size)?.ok_or_else(|| {
            RendezvousError::config(
                Some(rank),
                names.world_size,
                format!(
                    "{}={rank} is set but {} is not; set both (the launcher normally does)",
                    names.rank, names.world_size
                ),
            )
        })?;
        if world_size == 0 {
            return Err(RendezvousError::config(
                None,
                names.world_size,
                format!("{}=0: the world needs at least one rank", names.world_size),
            ));
        }
        if rank >= world_size {
            return Err(RendezvousError::config(
                Some(rank),
                names.rank,
                format!(
                    "{}={rank} but {}={world_size}: ranks run from 0 to {}; \
                     check the launcher's process count",
                    names.rank,
                    names.world_size,
                    world_size - 1
                ),
            ));
        }
        Ok((rank, world_size))
    }

    /// The local rank and how many ranks share this machine.
    fn place_on_machine(
        &self,
        names: Names,
        rank: usize,
        world_size: usize,
        slurm: bool,
    ) -> Result<(usize, usize)> {
        let local_world_size = match self.number(names.local_world_size)? {
            Some(n) => n,
            // SLURM_NTASKS_PER_NODE is only set when asked for; the step's
            // tasks-per-node list always is ("2(x2)").
            None if slurm => ["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"]
                .iter()
                .find_map(|name| {
                    let node = self.number("SLURM_NODEID").ok().flatten().unwrap_or(0);
                    slurm::tasks_on_node(&self.get(name)?, node)
                })
                .unwrap_or(world_size),
            None => world_size,
        };
        let local_rank = self
            .number(names.local_rank)?
            .unwrap_or(rank % local_world_size);
        if local_rank >= local_world_size {
            return Err(RendezvousError::config(
                Some(rank),
                names.local_rank,
                format!(
                    "{}={local_rank} but {}={local_world_size}; local ranks run from 0 to {}",
                    names.local_rank,
                    names.local_world_size,
                    local_world_size - 1
                ),
            ));
        }
        Ok((local_rank, local_world_size))
    }

    /// MASTER_ADDR, else (under srun) the step's first node, where rank 0 runs.
    fn master_addr(&self, srun_step: bool) -> Option<String> {
        self.get("MASTER_ADDR")
            .filter(|addr| !addr.is_empty())
            .or_else(|| {
                let list = [
                    "SLURM_STEP_NODELIST",
                    "SLURM_JOB_NODELIST",
                    "SLURM_NODELIST",
                ]
                .iter()
                .find_map(|name| self.get(name))?;
                slurm::first_host(&list).filter(|_| srun_step)
            })
    }

    /// MASTER_PORT, else (under srun) a port derived from the step, else the
    /// default.
    fn master_port(&self, rank: usize, srun_step: bool) -> Result<u16> {
        let Some(port) = self.get("MASTER_PORT") else {
            let slurm_port = || {
                let job = self.get("SLURM_JOB_ID")?;
                let port = slurm::port_for_step(&job, &self.get("SLURM_STEP_ID")?)?;
                srun_step.then_some(port)
            };
            return Ok(slurm_port().unwrap_or(DEFAULT_MASTER_PORT));
        };
        port.trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| {
                RendezvousError::config(
                    Some(rank),
                    "MASTER_PORT",
                    format!("MASTER_PORT={port:?} is not a port number (1-65535); rank {rank}"),
                )
            })
    }

    /// Who serves the store: the launcher, torchrun's agent, or rank 0.
    fn store_host(&self) -> StoreHost {
        if self.present(LAUNCHER_STORE_VAR) {
            StoreHost::Launcher
        } else if self
            .get("TORCHELASTIC_USE_AGENT_STORE")
            .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
        {
            StoreHost::TorchrunAgent
        } else {
            StoreHost::RankZero
        }
    }

    fn get(&self, name: &str) -> Option<String> {
        (self.lookup)(name)
    }

    fn present(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    fn number(&self, name: &str) -> Result<Option<usize>> {
        match self.get(name) {
            None => Ok(None),
            Some(text) => text.trim().parse::<usize>().map(Some).map_err(|_| {
                RendezvousError::config(
                    None,
                    name,
                    format!(
                        "{name}={text:?} is not a non-negative integer; fix the launcher \
                     settings or unset it"
                    ),
                )
            }),
        }
    }

    fn job_token(&self, rank: usize) -> Result<Option<JobToken>> {
        match self.get(JOB_TOKEN_VAR) {
            None => Ok(None),
            // The token's own error, said by the rank that read it.
            Some(text) => JobToken::new(text).map(Some).map_err(|err| match err {
                RendezvousError::Config { message, .. } => RendezvousError::config(
                    Some(rank),
                    JOB_TOKEN_VAR,
                    format!("rank {rank}: {message}"),
                ),
                other => other,
            }),
        }
    }

    /// Ours if set (checked), else the launcher's own run id made key-safe.
    fn job_id(&self, rank: usize) -> Result<String> {
        if let Some(id) = self.get(JOB_ID_VAR) {
            if !valid_job_id(&id) {
                return Err(RendezvousError::config(
                    Some(rank),
                    JOB_ID_VAR,
                    format!(
                        "rank {rank}: {JOB_ID_VAR}={id:?} must be 1 to 64 characters of \
                     letters, digits, '.', '_' and '-'"
                    ),
                ));
            }
            return Ok(id);
        }
        let launcher_id = self
            .get("TORCHELASTIC_RUN_ID")
            .or_else(|| {
                let job = self.get("SLURM_JOB_ID")?;
                Some(match self.get("SLURM_STEP_ID") {
                    Some(step) => format!("{job}.{step}"),
                    None => job,
                })
            })
            .or_else(|| self.get("OMPI_MCA_ess_base_jobid"));
        Ok(match launcher_id {
            Some(id) => {
                let safe: String = id
                    .chars()
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || "._-".contains(c) {
                            c
                        } else {
                            '_'
                        }
                    })
                    .take(64)
                    .collect();
                if safe.is_empty() {
                    DEFAULT_JOB_ID.into()
                } else {
                    safe
                }
            }
            None => DEFAULT_JOB_ID.into(),
        })
    }

    fn timeout(&self) -> Result<Duration> {
        match self.get(TIMEOUT_VAR) {
            None => Ok(DEFAULT_TIMEOUT),
            Some(text) => text
                .trim()
                .parse::<f64>()
                .ok()
                // Bounded so every deadline (now + timeout) stays representable.
                .filter(|secs| secs.is_finite() && *secs > 0.0 && *secs <= MAX_TIMEOUT_SECS)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| {
                    RendezvousError::config(
                        None,
                        TIMEOUT_VAR,
                        format!(
                            "{TIMEOUT_VAR}={text:?} is not a positive number of seconds (at most \
                         {MAX_TIMEOUT_SECS}, a year); the default is {}",
                            DEFAULT_TIMEOUT.as_secs()
                        ),
                    )
                }),
        }
    }
}

/// This machine, as ranks compare it: host name and boot id (`"/"` when
/// neither can be read).
pub fn machine_id() -> String {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    format!(
        "{}/{}",
        read("/proc/sys/kernel/hostname").trim(),
        read("/proc/sys/kernel/random/boot_id").trim()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<LaunchEnv> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LaunchEnv::from_lookup(|name| map.get(name).cloned())
    }

    fn err(pairs: &[(&str, &str)]) -> String {
        env(pairs).unwrap_err().to_string()
    }

    #[test]
    fn no_launcher_is_a_world_of_one() {
        let e = env(&[]).unwrap();
        assert_eq!((e.rank, e.world_size, e.launcher), (0, 1, Launcher::None));
        assert_eq!(e.timeout, DEFAULT_TIMEOUT);
    }

    #[test]
    fn torchrun_variables() {
        let e = env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.1.2.3"),
            ("MASTER_PORT", "1234"),
            ("TORCHELASTIC_RUN_ID", "none"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
            ("TORCHELASTIC_RESTART_COUNT", "2"),
            ("GROUP_RANK", "1"),
        ])
        .unwrap();
        assert_eq!(e.node_rank, Some(1));
        assert_eq!(e.run_id.as_deref(), Some("none"));
        assert_eq!(e.restart_count, 2);
        assert_eq!(
            (e.rank, e.world_size, e.local_rank, e.local_world_size),
            (3, 8, 1, 2)
        );
        assert_eq!(e.master_addr.as_deref(), Some("10.1.2.3"));
        assert_eq!(e.master_port, 1234);
        assert_eq!(e.launcher, Launcher::Torchrun);
        assert_eq!(e.store_host, StoreHost::TorchrunAgent);
    }

    #[test]
    fn open_mpi_and_slurm_variables() {
        let e = env(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
        ])
        .unwrap();
        assert_eq!(
            (e.rank, e.world_size, e.local_rank, e.launcher),
            (1, 2, 1, Launcher::OpenMpi)
        );
        assert_eq!(e.master_port, DEFAULT_MASTER_PORT);
        assert_eq!(e.node_rank, None);
        let e = env(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "2"),
            ("MASTER_ADDR", "node1"),
            ("MASTER_PORT", "29400"),
        ])
        .unwrap();
        assert_eq!(
            (e.rank, e.world_size, e.local_rank, e.launcher),
            (5, 8, 1, Launcher::Slurm)
        );
        assert_eq!(e.node_rank, Some(2));
        assert_eq!(e.store_host, StoreHost::RankZero);
    }

    #[test]
    fn srun_needs_no_master_addr() {
        // What srun -N 2 -n 3 sets for task 2 (node 1 of "vm[1-2]", 2 + 1 tasks).
        let e = env(&[
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "3"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NODEID", "1"),
            ("SLURM_STEP_TASKS_PER_NODE", "2,1"),
            ("SLURM_STEP_NODELIST", "vm[1-2]"),
            ("SLURM_JOB_ID", "41"),
            ("SLURM_STEP_ID", "1"),
        ])
        .unwrap();
        assert_eq!(e.master_addr.as_deref(), Some("vm1"));
        assert_eq!(e.master_port, 20_000 + 41 * 8 + 1);
        assert_eq!((e.local_rank, e.local_world_size), (0, 1));
        // Set ones win; outside Slurm a node list means nothing.
        let e = env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_STEP_NODELIST", "vm[1-2]"),
            ("SLURM_JOB_ID", "41"),
            ("MASTER_ADDR", "10.0.0.9"),
            ("MASTER_PORT", "29400"),
        ])
        .unwrap();
        assert_eq!(
            (e.master_addr.as_deref(), e.master_port),
            (Some("10.0.0.9"), 29400)
        );
        let text = err(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("SLURM_JOB_NODELIST", "vm"),
        ]);
        assert!(text.contains("MASTER_ADDR is not set"), "{text}");
        // The batch script itself (no step) is told to use srun, not to wait.
        let text = err(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "vm"),
            ("SLURM_JOB_ID", "41"),
        ]);
        assert!(
            text.contains("batch script") && text.contains("srun"),
            "{text}"
        );
    }

    #[test]
    fn rank_variables_take_precedence_over_slurm() {
        let e = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("SLURM_PROCID", "7"),
            ("SLURM_NTASKS", "16"),
        ])
        .unwrap();
        assert_eq!((e.rank, e.world_size, e.launcher), (0, 2, Launcher::Env));
    }

    #[test]
    fn contradictions_are_explained() {
        let text = err(&[("RANK", "2"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")]);
        assert!(text.contains("RANK=2") && text.contains("0 to 1"), "{text}");
        let text = err(&[("RANK", "1"), ("WORLD_SIZE", "2")]);
        assert!(
            text.contains("MASTER_ADDR is not set") && text.contains("rank 1"),
            "{text}"
        );
        let text = err(&[("RANK", "0")]);
        assert!(text.contains("WORLD_SIZE"), "{text}");
        let text = err(&[("WORLD_SIZE", "4")]);
        assert!(text.contains("RANK"), "{text}");
        let text = err(&[("RANK", "x"), ("WORLD_SIZE", "2")]);
        assert!(text.contains("RANK=\"x\""), "{text}");
        let text = err(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "99999"),
        ]);
        assert!(text.contains("MASTER_PORT"), "{text}");
        let text = err(&[("RANK", "0"), ("WORLD_SIZE", "0")]);
        assert!(text.contains("at least one"), "{text}");
        for bad in ["-1", "1e20", "inf", "NaN", "soon"] {
            // 1e20 s used to panic inside Duration::from_secs_f64.
            let text = err(&[(TIMEOUT_VAR, bad)]);
            assert!(
                text.contains(TIMEOUT_VAR) && text.contains("at most"),
                "{bad}: {text}"
            );
        }
    }

    #[test]
    fn job_token_and_id() {
        let base = [("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut pairs = base.to_vec();
            pairs.extend_from_slice(extra);
            pairs
        };
        let e = env(&base).unwrap();
        assert_eq!((e.job_token, e.job_id.as_str()), (None, DEFAULT_JOB_ID));
        let e = env(&with(&[(JOB_TOKEN_VAR, "s3cret"), (JOB_ID_VAR, "run-7")])).unwrap();
        assert!(e.job_token.unwrap().matches(b"s3cret"));
        assert_eq!(e.job_id, "run-7");
        let e = env(&with(&[("TORCHELASTIC_RUN_ID", "my run/1")])).unwrap();
        assert_eq!(e.job_id, "my_run_1");
        let e = env(&with(&[("SLURM_JOB_ID", "991"), ("SLURM_STEP_ID", "0")])).unwrap();
        assert_eq!(e.job_id, "991.0");
        let text = err(&with(&[(JOB_TOKEN_VAR, "two words")]));
        assert!(
            text.contains("rank 1") && text.contains(JOB_TOKEN_VAR),
            "{text}"
        );
        let text = err(&with(&[(JOB_ID_VAR, "a/b")]));
        assert!(
            text.contains("rank 1") && text.contains(JOB_ID_VAR),
            "{text}"
        );
    }

    #[test]
    fn launcher_store_and_timeout_override() {
        let e = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            (LAUNCHER_STORE_VAR, "1"),
            (TIMEOUT_VAR, "2.5"),
        ])
        .unwrap();
        assert_eq!(e.launcher, Launcher::BurnDdpRun);
        assert_eq!(e.store_host, StoreHost::Launcher);
        assert_eq!(e.timeout, Duration::from_millis(2500));
    }
}
