//! The process group: this rank's identity, its store and its transport.

use crate::element::{BufferMut, DType, Element, ReduceOp};
use crate::env::{LaunchEnv, Launcher, StoreHost, DEFAULT_MASTER_PORT, DEFAULT_TIMEOUT};
use crate::error::{CommError, Result};
use crate::job::JobToken;
use crate::store::{C10dStoreClient, MemoryStore, Store, StoreServer, TcpStoreClient};
use crate::transport::{
    Hierarchical, Rendezvous, SharedMemory, SingleProcess, TcpRing, Topology, Transport,
    WireCompression,
};
use crate::watch::KeyWatch;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::Duration;

/// Store keys `<prefix>blame/<rank>` hold the peer a rank's first failure
/// pointed at (see [`CommError::blamed_peer`]).
pub const BLAME_KEY: &str = "blame";

/// How long a failing rank waits for a peer's report of whom it gave up on.
const ORIGIN_WAIT: Duration = Duration::from_millis(500);

/// Groups started so far in this process, per job and rank: the generation in
/// store keys, so a group started after `destroy()` never reads the keys of the
/// one before (every rank starts and destroys its groups in the same order).
/// Per rank, so ranks run as threads of one process (tests) count alike.
static GROUPS_STARTED: Mutex<BTreeMap<(String, usize), u64>> = Mutex::new(BTreeMap::new());

fn next_generation(env: &LaunchEnv) -> u64 {
    let mut started = GROUPS_STARTED.lock().unwrap_or_else(|e| e.into_inner());
    let count = started.entry((env.job_id.clone(), env.rank)).or_insert(0);
    *count += 1;
    *count - 1
}

/// Prefix of every key one group writes: other users of a shared store
/// (torchrun's agent, a launcher), other jobs and this job's earlier groups
/// are not disturbed.
fn key_prefix(env: &LaunchEnv, generation: u64) -> String {
    format!("burn-ddp/{}/{generation}/", env.job_id)
}

/// Set to `detail` to check, before every collective, that all ranks call the
/// same operation on buffers of the same type and length (one extra round trip).
pub const DEBUG_VAR: &str = "BURN_DDP_DEBUG";

/// `tcp` or `shm` forces a host transport; unset, ranks that all share one
/// machine use shared memory and others the TCP ring.
pub const TRANSPORT_VAR: &str = "BURN_DDP_TRANSPORT";

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
    fn from_env(rank: usize) -> Result<Self> {
        match std::env::var(TRANSPORT_VAR).ok().as_deref() {
            None | Some("") | Some("auto") => Ok(Self::Auto),
            Some("tcp") => Ok(Self::Tcp),
            Some("shm") => Ok(Self::SharedMemory),
            Some(other) => Err(CommError::config(format!(
                "rank {rank}: {TRANSPORT_VAR}={other:?}; expected tcp, shm or auto"
            ))),
        }
    }
}

/// `ring` or `hierarchical` forces the all-reduce algorithm across machines;
/// unset, several machines with several ranks each (the same number on each)
/// use the hierarchical one.
pub const ALGORITHM_VAR: &str = "BURN_DDP_ALGORITHM";

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
    fn from_env(rank: usize) -> Result<Self> {
        match std::env::var(ALGORITHM_VAR).ok().as_deref() {
            None | Some("") | Some("auto") => Ok(Self::Auto),
            Some("ring") => Ok(Self::Ring),
            Some("hierarchical") => Ok(Self::Hierarchical),
            Some(other) => Err(CommError::config(format!(
                "rank {rank}: {ALGORITHM_VAR}={other:?}; expected ring, hierarchical or auto"
            ))),
        }
    }
}

/// How to start a [`ProcessGroup`] without reading the environment.
#[derive(Debug, Clone)]
pub struct ProcessGroupBuilder {
    env: LaunchEnv,
    debug_checks: bool,
    transport: TransportChoice,
    algorithm: Algorithm,
    compression: WireCompression,
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
            debug_checks: false,
            transport: TransportChoice::Auto,
            algorithm: Algorithm::Auto,
            compression: WireCompression::None,
        }
    }

    /// Forces a host transport (default: shared memory on one machine, else TCP).
    pub fn transport(mut self, choice: TransportChoice) -> Self {
        self.transport = choice;
        self
    }

    /// Sends f32 all-reduces across machines in 16 bits (default: as they are;
    /// under [`ProcessGroup::from_env`], what `BURN_DDP_COMPRESSION` says).
    pub fn compression(mut self, compression: WireCompression) -> Self {
        self.compression = compression;
        self
    }

    /// The all-reduce algorithm across machines (default: hierarchical where
    /// the topology suits it).
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
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
        self.debug_checks = enabled;
        self
    }

    /// Joins the group: starts or reaches the store, waits for every rank and
    /// connects the transport. Fails within the timeout if a rank never comes.
    pub fn build(self) -> Result<ProcessGroup> {
        let group =
            ProcessGroup::start(self.env, self.debug_checks, self.transport, self.algorithm)?;
        group.set_wire_compression(self.compression);
        Ok(group)
    }
}

/// One rank's membership in a group of processes that run collectives together.
///
/// Collectives take `&self` and are serialised internally, so a group can be
/// shared (`Arc<ProcessGroup>`) by the training loop and the gradient reducer.
pub struct ProcessGroup {
    rank: usize,
    world_size: usize,
    local_rank: usize,
    local_world_size: usize,
    launcher: Launcher,
    timeout: Duration,
    debug_checks: bool,
    store: Box<dyn Store>,
    transport: Mutex<Box<dyn Transport>>,
    /// Watches for a rank claimed twice after the group formed.
    duplicate_watch: Option<KeyWatch>,
    /// Prefix of this group's store keys (`None` for a world of one).
    key_prefix: Option<String>,
    /// Whether the ranks run on several machines.
    spans_machines: bool,
    /// Whether this rank has recorded whom its first failure points at.
    blamed: std::sync::atomic::AtomicBool,
    #[cfg(feature = "nccl")]
    nccl: crate::nccl::NcclSlot,
    // Dropped last: peers may still be reading from it while we tear down.
    _store_server: Option<StoreServer>,
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("local_rank", &self.local_rank)
            .field("transport", &self.transport_name())
            .finish()
    }
}

impl ProcessGroup {
    /// Joins the group described by the launcher's environment (torchrun,
    /// burn-ddp-run, Open MPI or Slurm); a world of one without any of them.
    pub fn from_env() -> Result<Self> {
        let env = LaunchEnv::from_env()?;
        let debug = std::env::var(DEBUG_VAR).is_ok_and(|v| v.eq_ignore_ascii_case("detail"));
        let transport = TransportChoice::from_env(env.rank)?;
        let algorithm = Algorithm::from_env(env.rank)?;
        let compression = WireCompression::from_env(env.rank)?;
        let group = Self::start(env, debug, transport, algorithm)?;
        group.set_wire_compression(compression);
        Ok(group)
    }

    /// Starts configuring a group by hand.
    pub fn builder(rank: usize, world_size: usize) -> ProcessGroupBuilder {
        ProcessGroupBuilder::new(rank, world_size)
    }

    fn start(
        env: LaunchEnv,
        debug_checks: bool,
        choice: TransportChoice,
        algorithm: Algorithm,
    ) -> Result<Self> {
        if !crate::job::valid_job_id(&env.job_id) {
            return Err(CommError::config(format!(
                "rank {}: job id {:?} must be 1 to 64 characters of letters, digits, '.', '_' \
                 and '-'",
                env.rank, env.job_id
            )));
        }
        if env.world_size == 0 || env.rank >= env.world_size {
            return Err(CommError::config(format!(
                "rank {} is outside a world of {} ranks; ranks run from 0 to world_size - 1",
                env.rank, env.world_size
            )));
        }
        if env.world_size == 1 {
            return Ok(Self::assemble(
                &env,
                debug_checks,
                Box::new(MemoryStore::new()),
                Box::new(SingleProcess),
                None,
            ));
        }
        let host = env.master_addr.clone().ok_or_else(|| {
            CommError::config(format!(
                "rank {} of {}: no master address; call .master(addr, port) or set MASTER_ADDR",
                env.rank, env.world_size
            ))
        })?;
        let server = match env.store_host {
            StoreHost::RankZero if env.rank == 0 => Some(host_store(&host, &env)?),
            _ => None,
        };
        let prefix = key_prefix(&env, next_generation(&env));
        let (store, local_ip) = connect_and_join(&host, &env, &prefix)?;
        let client = &*store;
        log::debug!("rank {}: all {} ranks joined", env.rank, env.world_size);
        let machine_ids = machine_ids(client, &env, &prefix)?;
        let one_machine =
            machine_ids.iter().all(|id| *id == machine_ids[0]) && machine_ids[0] != "/";
        let rdzv = Rendezvous {
            rank: env.rank,
            world_size: env.world_size,
            store: client,
            key_prefix: &prefix,
            timeout: env.timeout,
            token: env.job_token.as_ref(),
            members: None,
        };
        let transport: Box<dyn Transport> = match (choice, one_machine) {
            (TransportChoice::SharedMemory, false) => {
                return Err(CommError::config(format!(
                    "rank {}: {TRANSPORT_VAR}=shm, but the ranks run on several machines; \
                     use tcp (or leave it unset)",
                    env.rank
                )))
            }
            (TransportChoice::SharedMemory, true) | (TransportChoice::Auto, true) => {
                Box::new(SharedMemory::connect(rdzv)?)
            }
            (TransportChoice::Tcp, _) if algorithm == Algorithm::Hierarchical => {
                return Err(CommError::config(format!(
                    "rank {}: {ALGORITHM_VAR}=hierarchical uses shared memory within each \
                     machine, but {TRANSPORT_VAR}=tcp; unset one of them",
                    env.rank
                )))
            }
            (TransportChoice::Tcp, _) => Box::new(TcpRing::connect(rdzv, local_ip)?),
            (TransportChoice::Auto, false) => {
                let topology = Topology::from_machine_ids(&machine_ids);
                match (algorithm, topology.suits_hierarchy()) {
                    (Algorithm::Hierarchical, false) => {
                        return Err(CommError::config(format!(
                            "rank {}: {ALGORITHM_VAR}=hierarchical needs several machines \
                             with the same number (two or more) of ranks each; these ranks \
                             run on {}; unset it to use the ring",
                            env.rank,
                            topology.describe()
                        )))
                    }
                    (Algorithm::Ring, _) | (Algorithm::Auto, false) => {
                        Box::new(TcpRing::connect(rdzv, local_ip)?)
                    }
                    (_, true) => {
                        log::debug!(
                            "rank {}: hierarchical all-reduce over {}",
                            env.rank,
                            topology.describe()
                        );
                        Box::new(Hierarchical::connect(rdzv, &topology, local_ip)?)
                    }
                }
            }
        };
        // Whether a second claimant of a rank came while we connected.
        let saw_duplicate = client.check(&[&format!("{prefix}duplicate")])?;
        let mut group = Self::assemble(&env, debug_checks, store, transport, server);
        // Nobody leaves set-up (and possibly takes the store down) before all
        // are connected, and all decide together whether the group stands.
        if group.vote(saw_duplicate)? {
            let err = duplicate_error(group.store(), &env, &prefix);
            // Rank 0 may host the store: all read the reason before anyone leaves.
            let _ = group.barrier();
            return Err(err);
        }
        group.duplicate_watch = watch_for_duplicates(&host, &env, &prefix);
        group.key_prefix = Some(prefix);
        group.spans_machines = !one_machine;
        log::debug!(
            "rank {}: process group of {} ready over {} (launcher {:?}, timeout {:?})",
            env.rank,
            env.world_size,
            group.transport_name(),
            env.launcher,
            env.timeout
        );
        Ok(group)
    }

    fn assemble(
        env: &LaunchEnv,
        debug_checks: bool,
        store: Box<dyn Store>,
        transport: Box<dyn Transport>,
        server: Option<StoreServer>,
    ) -> Self {
        Self {
            rank: env.rank,
            world_size: env.world_size,
            local_rank: env.local_rank,
            local_world_size: env.local_world_size,
            launcher: env.launcher,
            timeout: env.timeout,
            debug_checks,
            store,
            transport: Mutex::new(transport),
            duplicate_watch: None,
            key_prefix: None,
            spans_machines: false,
            blamed: Default::default(),
            #[cfg(feature = "nccl")]
            nccl: Default::default(),
            _store_server: server,
        }
    }

    #[cfg(feature = "nccl")]
    pub(crate) fn nccl_slot(&self) -> &crate::nccl::NcclSlot {
        &self.nccl
    }

    /// Prefix of this group's store keys (a world of one has its own store).
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn key_prefix(&self) -> &str {
        self.key_prefix.as_deref().unwrap_or("burn-ddp/")
    }

    /// This process's global rank, `0..world_size`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of processes in the group.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// This process's rank on its machine (selects its GPU).
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// Number of processes on this machine.
    pub fn local_world_size(&self) -> usize {
        self.local_world_size
    }

    /// Whether this is rank 0, the one that logs and writes checkpoints.
    pub fn is_main(&self) -> bool {
        self.rank == 0
    }

    /// Who started this process.
    pub fn launcher(&self) -> Launcher {
        self.launcher
    }

    /// The bound on every wait.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The transport's name (`"tcp"`, `"local"`).
    pub fn transport_name(&self) -> &'static str {
        self.transport.lock().unwrap().name()
    }

    /// The rendezvous store (for exchanging small values at start-up).
    pub fn store(&self) -> &dyn Store {
        self.store.as_ref()
    }

    /// Sends this group's f32 all-reduces (sums and means) across machines as
    /// 16-bit floats, accumulated in f32 (PyTorch's `bf16_compress_hook`, with
    /// f32 additions); returns whether it applies (ranks on several machines
    /// and a transport between them). Every rank must set the same.
    pub fn set_wire_compression(&self, compression: WireCompression) -> bool {
        let applies = self.spans_machines
            && self
                .transport
                .lock()
                .unwrap()
                .compress_across_machines(compression);
        if applies && compression != WireCompression::None {
            log::debug!(
                "rank {}: f32 all-reduces cross machines as {compression:?}",
                self.rank
            );
        }
        applies
    }

    /// The transport, unless the group was found unable to stand.
    fn transport(&self) -> Result<std::sync::MutexGuard<'_, Box<dyn Transport>>> {
        if let Some(reason) = self.duplicate_watch.as_ref().and_then(KeyWatch::reason) {
            return Err(CommError::Mismatch {
                rank: self.rank,
                message: format!("the group cannot go on: {reason}"),
            });
        }
        Ok(self.transport.lock().unwrap())
    }

    /// A transport failure, unless the group was found unable to stand: then
    /// that is the cause (a peer that saw it first has left).
    fn explain(&self, err: CommError) -> CommError {
        let watched = self
            .duplicate_watch
            .as_ref()
            .and_then(KeyWatch::reason)
            .map(str::to_owned);
        // The watch may not have heard yet: ask the store once (this is the
        // error path; a store that is gone answers at once).
        let duplicate_key = self.key_prefix.as_ref().map(|p| format!("{p}duplicate"));
        let reason = watched.or_else(|| {
            let key = duplicate_key.as_deref()?;
            if !self.store.check(&[key]).ok()? {
                return None;
            }
            let value = self.store.get(key, Duration::from_secs(1)).ok()?;
            Some(String::from_utf8_lossy(&value).into_owned())
        });
        match reason {
            Some(reason) => CommError::Mismatch {
                rank: self.rank,
                message: format!("the group cannot go on: {reason} (then: {err})"),
            },
            None => self.trace_origin(err),
        }
    }

    /// For this rank's first failure that points at a peer: follows what the
    /// ranks reported to the store to the rank where the failure began (in a
    /// ring, only the neighbours of a dead rank see it die; the others see a
    /// neighbour give up), names it in the error, and reports it in turn, so
    /// the launcher can name it too (a stalled rank never reports itself).
    fn trace_origin(&self, err: CommError) -> CommError {
        let (Some(prefix), Some(peer)) = (&self.key_prefix, err.blamed_peer()) else {
            return err;
        };
        if self.blamed.swap(true, Ordering::SeqCst) {
            return err;
        }
        let blame_key = |rank: usize| format!("{prefix}{BLAME_KEY}/{rank}");
        // Report the direct peer at once: ranks tracing through us must not
        // wait while we trace further.
        let _ = self
            .store
            .set(&blame_key(self.rank), peer.to_string().as_bytes());
        let mut chain = vec![peer];
        while chain.len() < self.world_size {
            let last = *chain.last().unwrap();
            // A peer that gave up reports within moments of closing on us.
            let Ok(value) = self.store.get(&blame_key(last), ORIGIN_WAIT) else {
                break;
            };
            match String::from_utf8_lossy(&value).parse::<usize>() {
                Ok(next) if next != self.rank && !chain.contains(&next) => chain.push(next),
                _ => break,
            }
        }
        let origin = *chain.last().unwrap();
        let _ = self
            .store
            .set(&blame_key(self.rank), origin.to_string().as_bytes());
        if origin == peer {
            return err;
        }
        let cause = format!(
            "; rank {peer} had given up on rank {origin}, where the failure began \
             (reported by rank(s) {:?})",
            &chain[..chain.len() - 1]
        );
        match err {
            CommError::Peer {
                rank,
                peer,
                op,
                detail,
            } => CommError::Peer {
                rank,
                peer,
                op,
                detail: detail + &cause,
            },
            CommError::Timeout {
                rank,
                what,
                peer,
                after,
            } => CommError::Timeout {
                rank,
                what: what + &cause,
                peer,
                after,
            },
            other => other,
        }
    }

    /// Reduces `data` over all ranks, in place, on every rank.
    pub fn all_reduce<T: Element>(&self, data: &mut [T], op: ReduceOp) -> Result<()> {
        let mut transport = self.transport()?;
        self.check_signature(
            &mut **transport,
            Signature::new("all_reduce", T::DTYPE, data.len(), op as i64),
        )?;
        transport
            .all_reduce(T::buffer(data), op)
            .map_err(|err| self.explain(err))
    }

    /// Concatenates every rank's `input`, in rank order, on every rank.
    pub fn all_gather<T: Element>(&self, input: &[T]) -> Result<Vec<T>> {
        let mut transport = self.transport()?;
        self.check_signature(
            &mut **transport,
            Signature::new("all_gather", T::DTYPE, input.len(), 0),
        )?;
        let k = input.len();
        let mut output = vec![T::zeroed(); k * self.world_size];
        output[self.rank * k..(self.rank + 1) * k].copy_from_slice(input);
        transport
            .all_gather(T::buffer(&mut output))
            .map_err(|err| self.explain(err))?;
        Ok(output)
    }

    /// Reduces `input` (`world_size` equal chunks) over all ranks and returns
    /// this rank's chunk of the result, as `reduce_scatter_tensor` does.
    pub fn reduce_scatter<T: Element>(&self, input: &[T], op: ReduceOp) -> Result<Vec<T>> {
        if !input.len().is_multiple_of(self.world_size) {
            return Err(CommError::InvalidArgument {
                rank: self.rank,
                message: format!(
                    "reduce_scatter needs an input length divisible by the world size; got \
                     {} elements for {} ranks (pad the input to a multiple of {})",
                    input.len(),
                    self.world_size,
                    self.world_size
                ),
            });
        }
        let mut transport = self.transport()?;
        self.check_signature(
            &mut **transport,
            Signature::new("reduce_scatter", T::DTYPE, input.len(), op as i64),
        )?;
        let mut work = input.to_vec();
        transport
            .reduce_scatter(T::buffer(&mut work), op)
            .map_err(|err| self.explain(err))?;
        let k = input.len() / self.world_size;
        work.truncate((self.rank + 1) * k);
        Ok(work.split_off(self.rank * k))
    }

    /// Copies `data` of rank `root` into `data` on every rank.
    pub fn broadcast<T: Element>(&self, data: &mut [T], root: usize) -> Result<()> {
        if root >= self.world_size {
            return Err(CommError::InvalidArgument {
                rank: self.rank,
                message: format!(
                    "broadcast from root {root}, but ranks run from 0 to {}",
                    self.world_size - 1
                ),
            });
        }
        let mut transport = self.transport()?;
        self.check_signature(
            &mut **transport,
            Signature::new("broadcast", T::DTYPE, data.len(), root as i64),
        )?;
        transport
            .broadcast(T::buffer(data), root)
            .map_err(|err| self.explain(err))
    }

    /// Waits until every rank has reached this call (bounded by the timeout).
    pub fn barrier(&self) -> Result<()> {
        self.vote(false).map(|_| ())
    }

    /// A barrier that also tells whether any rank said yes.
    fn vote(&self, yes: bool) -> Result<bool> {
        let mut count = [1i32, yes as i32];
        self.transport()?
            .all_reduce(BufferMut::I32(&mut count), ReduceOp::Sum)
            .map_err(|err| self.explain(err))?;
        if count[0] as usize != self.world_size {
            return Err(CommError::Mismatch {
                rank: self.rank,
                message: format!(
                    "barrier counted {} ranks instead of {}; collective calls are out of step \
                     (run with {DEBUG_VAR}=detail to find the first differing call)",
                    count[0], self.world_size
                ),
            });
        }
        Ok(count[1] > 0)
    }

    /// Leaves the group after a final barrier, so no rank tears down the store
    /// while another still needs it. Dropping the group skips the barrier.
    pub fn destroy(self) -> Result<()> {
        self.barrier()
    }

    /// With debug checks on, makes sure every rank is about to run the same call.
    fn check_signature(&self, transport: &mut dyn Transport, mine: Signature) -> Result<()> {
        if !self.debug_checks || self.world_size == 1 {
            return Ok(());
        }
        let mut all = vec![0i64; 4 * self.world_size];
        all[4 * self.rank..4 * self.rank + 4].copy_from_slice(&mine.words);
        transport.all_gather(BufferMut::I64(&mut all))?;
        for (peer, theirs) in all.chunks(4).enumerate() {
            if theirs != mine.words {
                return Err(CommError::Mismatch {
                    rank: self.rank,
                    message: format!(
                        "this rank calls {} but rank {peer} calls {}",
                        mine,
                        Signature::from_words(theirs)
                    ),
                });
            }
        }
        Ok(())
    }
}

/// What a collective call looks like, packed for a cross-rank comparison.
struct Signature {
    words: [i64; 4],
}

const OP_NAMES: [&str; 4] = ["all_reduce", "all_gather", "reduce_scatter", "broadcast"];
const DTYPES: [DType; 6] = [
    DType::F32,
    DType::F64,
    DType::I32,
    DType::I64,
    DType::F16,
    DType::BF16,
];

impl Signature {
    fn new(op: &str, dtype: DType, len: usize, extra: i64) -> Self {
        let op = OP_NAMES.iter().position(|name| *name == op).unwrap() as i64;
        let dtype = DTYPES.iter().position(|d| *d == dtype).unwrap() as i64;
        Self {
            words: [op, dtype, len as i64, extra],
        }
    }

    fn from_words(words: &[i64]) -> Self {
        Self {
            words: words.try_into().unwrap_or([-1; 4]),
        }
    }
}

impl std::fmt::Display for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [op, dtype, len, extra] = self.words;
        let op = OP_NAMES.get(op as usize).copied().unwrap_or("?");
        let dtype = DTYPES
            .get(dtype as usize)
            .map(|d| format!("{d:?}"))
            .unwrap_or_default();
        let extra = match op {
            "broadcast" => format!(", root {extra}"),
            "all_gather" => String::new(),
            _ => format!(", op {extra}"),
        };
        write!(f, "{op}({len} x {dtype}{extra})")
    }
}

/// Starts the store on rank 0 at the master address.
/// Reaches the store at the master address: our own protocol, or c10d's when
/// torchrun's agent hosts it. Also returns the local interface that reaches it,
/// which is the one peers can reach us on.
fn connect_store(host: &str, env: &LaunchEnv) -> Result<(Box<dyn Store>, IpAddr)> {
    let rank = Some(env.rank);
    if env.store_host == StoreHost::TorchrunAgent {
        let client = C10dStoreClient::connect(host, env.master_port, rank, env.timeout)
            .map_err(|err| torchrun_context(err, env))?
            // PyTorch's own workers keep their keys under the same prefix.
            .namespaced(format!("/worker/attempt_{}", env.restart_count));
        let ip = client.local_ip()?;
        return Ok((Box::new(client), ip));
    }
    let client = TcpStoreClient::connect_with_token(
        host,
        env.master_port,
        rank,
        env.timeout,
        env.job_token.as_ref(),
    )?;
    let ip = client.local_ip()?;
    Ok((Box::new(client), ip))
}

/// Reaches the store and joins the group. Where rank 0 hosts the store, a rank
/// starting a new group right after `destroy()` can reach rank 0's previous
/// store in its last moments, and lose it during the join: it then reconnects
/// (to the new one) until the timeout.
fn connect_and_join(host: &str, env: &LaunchEnv, prefix: &str) -> Result<(Box<dyn Store>, IpAddr)> {
    let deadline = std::time::Instant::now() + env.timeout;
    let mut attempt = env.clone();
    loop {
        let env = &attempt;
        let joined = connect_store(host, env).and_then(|(store, local_ip)| {
            log::debug!(
                "rank {}: connected to the {:?} store at {host}:{} from {local_ip}",
                env.rank,
                env.store_host,
                env.master_port
            );
            join(&*store, env, prefix).map(|()| (store, local_ip))
        });
        match joined {
            Ok(joined) => return Ok(joined),
            // Only a store that was reached and then went away: one that cannot
            // be reached at all has already been waited for.
            Err(CommError::Store { message, .. })
                if env.store_host == StoreHost::RankZero
                    && env.rank != 0
                    && (message.contains("closed the connection")
                        || message.contains("lost the connection"))
                    && std::time::Instant::now() < deadline =>
            {
                log::debug!(
                    "rank {}: the store went away while joining ({message}); reconnecting",
                    env.rank
                );
                std::thread::sleep(Duration::from_millis(100));
                // The next attempt gets what is left of the timeout, not all of it.
                attempt.timeout = deadline
                    .saturating_duration_since(std::time::Instant::now())
                    .max(Duration::from_secs(1));
            }
            Err(err) => return Err(err),
        }
    }
}

/// Says which torchrun job could not be reached, and what usually causes it.
fn torchrun_context(err: CommError, env: &LaunchEnv) -> CommError {
    match err {
        CommError::Store { rank, message } => CommError::Store {
            rank,
            message: format!(
                "{message}; started by torchrun (run id {}) with \
                 TORCHELASTIC_USE_AGENT_STORE=True, so its agent's c10d TCPStore should \
                 be listening there",
                env.run_id.as_deref().unwrap_or("unknown")
            ),
        },
        other => other,
    }
}

fn host_store(host: &str, env: &LaunchEnv) -> Result<StoreServer> {
    StoreServer::bind_master(host, env.master_port, env.job_token.clone()).map_err(
        |err| match err {
            CommError::Store { message, .. } => CommError::Store {
                rank: Some(0),
                message,
            },
            other => other,
        },
    )
}

/// This machine, as ranks compare it: host name and boot id (`"/"` when
/// neither can be read).
pub(crate) fn machine_id() -> String {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    format!(
        "{}/{}",
        read("/proc/sys/kernel/hostname").trim(),
        read("/proc/sys/kernel/random/boot_id").trim()
    )
}

/// Every rank's machine ([`machine_id`]), by rank, exchanged through the store.
fn machine_ids(store: &dyn Store, env: &LaunchEnv, prefix: &str) -> Result<Vec<String>> {
    store.set(
        &format!("{prefix}host/{}", env.rank),
        machine_id().as_bytes(),
    )?;
    (0..env.world_size)
        .map(|rank| {
            store
                .get(&format!("{prefix}host/{rank}"), env.timeout)
                .map(|id| String::from_utf8_lossy(&id).into_owned())
        })
        .collect()
}

/// How this process describes itself when two claim one rank.
fn claimant() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("pid {} on {}", std::process::id(), host.trim())
}

/// Claims this rank; a second claimant fails at once and tells every rank
/// through the store, so a RANK given to two processes never trains.
fn claim_rank(store: &dyn Store, env: &LaunchEnv, prefix: &str) -> Result<()> {
    let me = claimant();
    let claims = store.add(&format!("{prefix}claims/{}", env.rank), 1)?;
    store.set(
        &format!("{prefix}claimant/{}/{claims}", env.rank),
        me.as_bytes(),
    )?;
    if claims == 1 {
        return Ok(());
    }
    // The first claimant wrote its name right after its add.
    let first = store
        .get(&format!("{prefix}claimant/{}/1", env.rank), env.timeout)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_else(|_| "another process".into());
    if first == me {
        return Ok(()); // our own claim, from before a reconnection
    }
    let message = format!(
        "rank {} was claimed by two processes: {first} (first) and {me}; give every process \
         its own RANK, 0 to {} (check the launcher's --node-rank on each machine)",
        env.rank,
        env.world_size - 1
    );
    store.set(&format!("{prefix}duplicate"), message.as_bytes())?;
    Err(CommError::Mismatch {
        rank: env.rank,
        message,
    })
}

/// A second connection to our own store that watches for a late duplicate
/// rank. torchrun's agent assigns ranks itself, so its store is not watched.
fn watch_for_duplicates(host: &str, env: &LaunchEnv, prefix: &str) -> Option<KeyWatch> {
    if env.store_host == StoreHost::TorchrunAgent {
        return None;
    }
    let client = TcpStoreClient::connect_with_token(
        host,
        env.master_port,
        Some(env.rank),
        env.timeout,
        env.job_token.as_ref(),
    );
    match client {
        Ok(client) => Some(KeyWatch::start(
            Box::new(client),
            format!("{prefix}duplicate"),
        )),
        Err(err) => {
            log::warn!("rank {}: cannot watch for duplicate ranks: {err}", env.rank);
            None
        }
    }
}

/// The error every rank reports when a rank was claimed twice.
fn duplicate_error(store: &dyn Store, env: &LaunchEnv, prefix: &str) -> CommError {
    let message = store
        .get(&format!("{prefix}duplicate"), env.timeout)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_else(|err| format!("a rank was claimed twice ({err})"));
    CommError::Mismatch {
        rank: env.rank,
        message: format!("cannot form the group: {message}"),
    }
}

/// The machines (launcher node ranks) whose ranks are all among `missing`,
/// as " (all of node rank [1])", when the launcher says how ranks map to
/// machines (a node rank, and the same number of ranks on every machine).
fn missing_machines(env: &LaunchEnv, missing: &[usize]) -> String {
    let per_node = env.local_world_size;
    if env.node_rank.is_none() || per_node == 0 || !env.world_size.is_multiple_of(per_node) {
        return String::new();
    }
    let mut nodes: Vec<usize> = missing.iter().map(|r| r / per_node).collect();
    nodes.dedup();
    nodes.retain(|node| (node * per_node..(node + 1) * per_node).all(|r| missing.contains(&r)));
    if nodes.is_empty() {
        String::new()
    } else {
        format!(" (all of node rank {nodes:?}: did its machine start?)")
    }
}

/// Announces this rank and waits for all the others, naming any that never come.
fn join(store: &dyn Store, env: &LaunchEnv, prefix: &str) -> Result<()> {
    claim_rank(store, env, prefix)?;
    let key = |rank: usize| format!("{prefix}join/{rank}");
    store.set(&key(env.rank), env.world_size.to_string().as_bytes())?;
    let keys: Vec<String> = (0..env.world_size).map(key).collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    // Wait key by key: the first that times out names a missing rank even if the
    // store's host gives up at the same moment and takes the store with it.
    let deadline = std::time::Instant::now() + env.timeout;
    for (first_missing, key) in key_refs.iter().enumerate() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let cause = match store.wait(&[key], left) {
            Ok(()) => continue,
            Err(err) if err.is_timeout() => String::new(),
            // The store's host gave up first and exited: the key was still unset.
            Err(err @ CommError::Store { .. }) => format!("; then {err}"),
            Err(err) => return Err(err),
        };
        // A later rank counts as missing unless the store says it joined: when
        // the store's host timed out at the same moment and exited, nobody can
        // tell, and the ranks that had not joined by then are the likely cause.
        let mut missing = vec![first_missing];
        for (rank, later) in key_refs.iter().enumerate().skip(first_missing + 1) {
            if !matches!(store.check(&[later]), Ok(true)) {
                missing.push(rank);
            }
        }
        return Err(CommError::Timeout {
            rank: env.rank,
            peer: Some(first_missing),
            what: format!(
                "rank(s) {missing:?}{} to join a group of {} at {}:{} (check that they \
                 started, and that every rank has the same WORLD_SIZE, MASTER_ADDR and \
                 MASTER_PORT){cause}",
                missing_machines(env, &missing),
                env.world_size,
                env.master_addr.as_deref().unwrap_or("?"),
                env.master_port
            ),
            after: env.timeout,
        });
    }
    for (rank, key) in key_refs.iter().enumerate() {
        let theirs = store.get(key, env.timeout)?;
        if theirs != env.world_size.to_string().as_bytes() {
            return Err(CommError::Mismatch {
                rank: env.rank,
                message: format!(
                    "rank {rank} joined with WORLD_SIZE={}, this rank has {}; start every \
                     rank with the same WORLD_SIZE",
                    String::from_utf8_lossy(&theirs),
                    env.world_size
                ),
            });
        }
    }
    Ok(())
}

impl Default for ProcessGroupBuilder {
    fn default() -> Self {
        Self::new(0, 1).master("127.0.0.1", DEFAULT_MASTER_PORT)
    }
}
