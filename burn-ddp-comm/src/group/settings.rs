//! How a group is configured: the choices read from the environment (once, at
//! start-up) or set on the builder.

use crate::backend::CollectiveBackend;
use crate::env::{LaunchEnv, Launcher, StoreHost, DEFAULT_MASTER_PORT, DEFAULT_TIMEOUT};
use crate::error::{CommError, Result};
use crate::job::JobToken;
use crate::transport::WireCompression;
use std::time::Duration;

/// Set to `detail` to check, before every collective, that all ranks call the
/// same operation on buffers of the same type and length (one extra round trip).
pub const DEBUG_VAR: &str = "BURN_DDP_DEBUG";

/// `tcp` or `shm` forces a host transport; unset, ranks that all share one
/// machine use shared memory and others the TCP ring.
pub const TRANSPORT_VAR: &str = "BURN_DDP_TRANSPORT";

/// `ring` or `hierarchical` forces the all-reduce algorithm across machines;
/// unset, several machines with several ranks each (the same number on each)
/// use the hierarchical one.
pub const ALGORITHM_VAR: &str = "BURN_DDP_ALGORITHM";

/// Which host transport to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportChoice {
    /// Shared memory when every rank is on this machine, TCP otherwise.
    Auto,
    /// The TCP ring, always.
    Tcp,
    /// Shared memory (an error if the ranks are on several machines).
    SharedMemory,
}

impl TransportChoice {
    fn parse(rank: usize, value: Option<&str>) -> Result<Self> {
        match value {
            None | Some("") | Some("auto") => Ok(Self::Auto),
            Some("tcp") => Ok(Self::Tcp),
            Some("shm") => Ok(Self::SharedMemory),
            Some(other) => Err(CommError::config(
                Some(rank),
                TRANSPORT_VAR,
                format!("rank {rank}: {TRANSPORT_VAR}={other:?}; expected tcp, shm or auto"),
            )),
        }
    }
}

/// How all-reduce runs when the ranks span several machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// Hierarchical where the topology suits it, else the flat ring.
    Auto,
    /// One ring over all ranks.
    Ring,
    /// Shared memory within machines, TCP across (an error where the topology
    /// does not suit it).
    Hierarchical,
}

impl Algorithm {
    fn parse(rank: usize, value: Option<&str>) -> Result<Self> {
        match value {
            None | Some("") | Some("auto") => Ok(Self::Auto),
            Some("ring") => Ok(Self::Ring),
            Some("hierarchical") => Ok(Self::Hierarchical),
            Some(other) => Err(CommError::config(
                Some(rank),
                ALGORITHM_VAR,
                format!(
                    "rank {rank}: {ALGORITHM_VAR}={other:?}; expected ring, hierarchical or auto"
                ),
            )),
        }
    }
}

/// Every choice a group makes at start-up besides who the ranks are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Settings {
    /// Check every collective's signature across ranks first.
    pub debug_checks: bool,
    pub transport: TransportChoice,
    pub algorithm: Algorithm,
    /// How f32 all-reduces cross machines.
    pub compression: WireCompression,
    /// Which backend moves device buffers.
    pub device_backend: CollectiveBackend,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            debug_checks: false,
            transport: TransportChoice::Auto,
            algorithm: Algorithm::Auto,
            compression: WireCompression::None,
            device_backend: CollectiveBackend::Auto,
        }
    }
}

impl Settings {
    /// The settings the environment asks for (read once: later changes to the
    /// variables do not reach a running group).
    pub fn from_lookup(rank: usize, lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        Ok(Self {
            debug_checks: lookup(DEBUG_VAR).is_some_and(|v| v.eq_ignore_ascii_case("detail")),
            transport: TransportChoice::parse(rank, lookup(TRANSPORT_VAR).as_deref())?,
            algorithm: Algorithm::parse(rank, lookup(ALGORITHM_VAR).as_deref())?,
            compression: WireCompression::parse(rank, lookup(crate::COMPRESSION_VAR).as_deref())?,
            device_backend: CollectiveBackend::parse(rank, lookup(crate::BACKEND_VAR).as_deref())?,
        })
    }
}

/// How to start a [`ProcessGroup`](super::ProcessGroup) without reading the
/// environment.
#[derive(Debug, Clone)]
pub struct ProcessGroupBuilder {
    pub(super) env: LaunchEnv,
    pub(super) settings: Settings,
}

impl ProcessGroupBuilder {
    /// A group of `world_size` ranks in which this process is `rank`.
    pub fn new(rank: usize, world_size: usize) -> Self {
        let mut env = LaunchEnv::single_process(DEFAULT_TIMEOUT);
        env.rank = rank;
        env.world_size = world_size;
        env.local_rank = rank;
        env.local_world_size = world_size;
        env.launcher = Launcher::Env;
        Self {
            env,
            settings: Settings::default(),
        }
    }

    /// Forces a host transport (default: shared memory on one machine, else TCP).
    pub fn transport(mut self, choice: TransportChoice) -> Self {
        self.settings.transport = choice;
        self
    }

    /// Sends f32 all-reduces across machines in 16 bits (default: as they are;
    /// under [`ProcessGroup::from_env`](super::ProcessGroup::from_env), what
    /// `BURN_DDP_COMPRESSION` says).
    pub fn compression(mut self, compression: WireCompression) -> Self {
        self.settings.compression = compression;
        self
    }

    /// The all-reduce algorithm across machines (default: hierarchical where
    /// the topology suits it).
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.settings.algorithm = algorithm;
        self
    }

    /// Which backend moves device (CUDA) buffers (default: NCCL where every
    /// rank can use it; under `from_env`, what `BURN_DDP_BACKEND` says).
    pub fn device_backend(mut self, backend: CollectiveBackend) -> Self {
        self.settings.device_backend = backend;
        self
    }

    /// Host and port of the rendezvous store (rank 0 hosts it unless told otherwise).
    pub fn master(mut self, addr: impl Into<String>, port: u16) -> Self {
        self.env.master_addr = Some(addr.into());
        self.env.master_port = port;
        self
    }

    /// This rank's index on its machine, and the number of ranks there.
    pub fn local(mut self, local_rank: usize, local_world_size: usize) -> Self {
        self.env.local_rank = local_rank;
        self.env.local_world_size = local_world_size;
        self
    }

    /// Bound on every wait: rendezvous, connections and each collective.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.env.timeout = timeout;
        self
    }

    /// The store is already served at the master address (by a launcher).
    pub fn external_store(mut self, external: bool) -> Self {
        self.env.store_host = if external {
            StoreHost::Launcher
        } else {
            StoreHost::RankZero
        };
        self
    }

    /// The job this group belongs to: its id keeps its store keys apart from
    /// other jobs' (and, per rank, counts its groups); its token, when set, is
    /// required of every peer and presented to the store.
    pub fn job(mut self, id: impl Into<String>, token: Option<JobToken>) -> Self {
        self.env.job_id = id.into();
        self.env.job_token = token;
        self
    }

    /// Checks every collective's signature across ranks first (see [`DEBUG_VAR`]).
    pub fn debug_checks(mut self, enabled: bool) -> Self {
        self.settings.debug_checks = enabled;
        self
    }

    /// Joins the group: starts or reaches the store, waits for every rank and
    /// connects the transport. Fails within the timeout if a rank never comes.
    pub fn build(self) -> Result<super::ProcessGroup> {
        super::ProcessGroup::start_generation(self.env, self.settings, 0, None, None)
    }
}

impl Default for ProcessGroupBuilder {
    fn default() -> Self {
        Self::new(0, 1).master("127.0.0.1", DEFAULT_MASTER_PORT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(vars: &[(&str, &str)]) -> Result<Settings> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_lookup(4, |name| vars.get(name).cloned())
    }

    #[test]
    fn unset_variables_give_the_defaults() {
        assert_eq!(read(&[]).unwrap(), Settings::default());
    }

    #[test]
    fn each_variable_sets_its_choice() {
        let settings = read(&[
            (DEBUG_VAR, "DETAIL"),
            (TRANSPORT_VAR, "tcp"),
            (ALGORITHM_VAR, "ring"),
            (crate::COMPRESSION_VAR, "bf16"),
            (crate::BACKEND_VAR, "tcp"),
        ])
        .unwrap();
        assert_eq!(
            settings,
            Settings {
                debug_checks: true,
                transport: TransportChoice::Tcp,
                algorithm: Algorithm::Ring,
                compression: WireCompression::Bf16,
                device_backend: CollectiveBackend::Host,
            }
        );
        assert!(!read(&[(DEBUG_VAR, "1")]).unwrap().debug_checks);
        assert_eq!(
            read(&[(TRANSPORT_VAR, "shm"), (ALGORITHM_VAR, "hierarchical")]).unwrap(),
            Settings {
                transport: TransportChoice::SharedMemory,
                algorithm: Algorithm::Hierarchical,
                ..Settings::default()
            }
        );
    }

    #[test]
    fn a_typo_names_the_rank_the_variable_and_the_choices() {
        for (var, value, choices) in [
            (TRANSPORT_VAR, "udp", "expected tcp, shm or auto"),
            (ALGORITHM_VAR, "tree", "expected ring, hierarchical or auto"),
            (crate::COMPRESSION_VAR, "fp8", "expected bf16, f16 or none"),
            (crate::BACKEND_VAR, "mpi", "expected nccl, tcp or auto"),
        ] {
            let err = read(&[(var, value)]).unwrap_err().to_string();
            assert!(
                err.contains("rank 4") && err.contains(var) && err.contains(choices),
                "{err}"
            );
        }
    }
}
