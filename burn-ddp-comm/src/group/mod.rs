//! The process group: this rank's identity, its store, and the backends its
//! collectives are dispatched to by where the buffer lives (host memory: the
//! transport chosen at start-up; GPU memory: NCCL).
//!
//! Its parts, one job each: [`settings`] (what is configured), `join`
//! (forming the group through the store), `host` (choosing the host
//! transport), `device` (the NCCL decision and device collectives),
//! `signature` (the debug check), `failure` (what an error is reported as).

mod admit;
mod bytes;
mod device;
mod failure;
mod host;
mod join;
mod reform;
pub mod settings;
mod signature;
mod watch;

use crate::element::{BufferMut, Element, ReduceOp};
use crate::env::{LaunchEnv, Launcher, StoreHost};
use crate::error::{CommError, Result};
use crate::job::keys::GroupKeys;
use crate::store::{MemoryStore, Store, StoreServer};
use crate::transport::{Rendezvous, SingleProcess, Transport, WireCompression};
use device::DeviceBackend;
use failure::Failures;
use settings::{Settings, DEBUG_VAR};
use signature::Signature;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

pub use settings::ProcessGroupBuilder;

/// One rank's membership in a group of processes that run collectives together.
///
/// A handle: clones share the one membership (its store, connections and
/// communicators), which ends when the last clone is dropped. Collectives take
/// `&self` and are serialised internally, so the training loop and the
/// gradient reducer can share a group.
#[derive(Clone)]
pub struct ProcessGroup {
    inner: Arc<GroupInner>,
}

/// A handle that does not keep the group alive: what a model wrapped over a
/// group holds, so destroying the group really ends it.
#[derive(Clone)]
pub struct WeakProcessGroup {
    inner: Weak<GroupInner>,
}

impl WeakProcessGroup {
    /// The group, while any [`ProcessGroup`] handle to it lives.
    pub fn upgrade(&self) -> Option<ProcessGroup> {
        self.inner.upgrade().map(|inner| ProcessGroup { inner })
    }
}

struct GroupInner {
    rank: usize,
    world_size: usize,
    local_rank: usize,
    local_world_size: usize,
    launcher: Launcher,
    timeout: Duration,
    settings: Settings,
    store: Box<dyn Store>,
    transport: Mutex<Box<dyn Transport>>,
    /// Whether the ranks run on several machines.
    spans_machines: bool,
    /// Bytes of the buffers this rank handed to host collectives.
    collective_bytes: AtomicU64,
    /// The keys [`ProcessGroup::gather_once`] has gathered, in first-use order.
    gathered_once: Mutex<Vec<u64>>,
    failures: Failures,
    device: DeviceBackend,
    /// What the group was formed from (`None` for a world of one): the next
    /// generation ([`ProcessGroup::reform`]) starts from it.
    env: Option<LaunchEnv>,
    /// How many times the group has gone on without ranks that were gone.
    generation: u64,
    /// Set once the survivors formed the next generation from this one
    /// ([`ProcessGroup::reform`]): every later collective here is refused.
    superseded: std::sync::atomic::AtomicBool,
    /// The job's first keys and id, which every generation derives from.
    lineage: admit::Lineage,
    /// Replacements asking to join.
    admissions: admit::Admissions,
    // Dropped last: peers may still be reading from it while we tear down.
    // A next generation takes it over.
    store_server: Mutex<Option<StoreServer>>,
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("rank", &self.rank())
            .field("world_size", &self.world_size())
            .field("local_rank", &self.local_rank())
            .field("transport", &self.transport_name())
            .finish()
    }
}

impl ProcessGroup {
    /// Joins the group described by the launcher's environment (torchrun,
    /// burn-ddp-run, Open MPI or Slurm); a world of one without any of them.
    /// The burn-ddp variables (`BURN_DDP_TRANSPORT`, `BURN_DDP_BACKEND`, ...)
    /// are read here, once.
    pub fn from_env() -> Result<Self> {
        let env = LaunchEnv::from_env()?;
        let settings = Settings::from_lookup(env.rank, |name| std::env::var(name).ok())?;
        if env.world_size > 1 && admit::joins_running_job() {
            return Self::join_running(env, settings);
        }
        Self::start_generation(env, settings, 0, None, None)
    }

    /// Starts configuring a group by hand.
    pub fn builder(rank: usize, world_size: usize) -> ProcessGroupBuilder {
        ProcessGroupBuilder::new(rank, world_size)
    }

    /// Generation `generation` of a group (0: the first), with the store
    /// rank 0 hosted for an earlier one (`inherited`), of the job that
    /// `lineage` names (`None`: the one `env` names).
    fn start_generation(
        env: LaunchEnv,
        settings: Settings,
        generation: u64,
        inherited: Option<StoreServer>,
        lineage: Option<admit::Lineage>,
    ) -> Result<Self> {
        let lineage = lineage.unwrap_or_else(|| admit::Lineage::of(&env));
        check_place(&env)?;
        if env.world_size == 1 {
            // A last survivor keeps serving the store it hosted, so a rank
            // that comes back late still reads why it is left out.
            let mut group = GroupInner::assemble(
                &env,
                settings,
                Box::new(MemoryStore::new()),
                Box::new(SingleProcess),
                inherited,
                Failures::new(env.rank),
                false,
            );
            group.generation = generation;
            if generation > 0 {
                admit::keep_store_for_joiners(&mut group, &env, &lineage);
            }
            group.lineage = lineage;
            return Ok(Self::from_inner(group));
        }
        let group = Self::from_inner(Self::join(&env, settings, generation, inherited, lineage)?);
        if group.wire_compression() != WireCompression::None {
            log::debug!(
                "rank {}: f32 all-reduces cross machines as {:?}",
                env.rank,
                settings.compression
            );
        }
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

    /// Several ranks: the store (hosted here by rank 0 when it is the one
    /// to), every rank's arrival, the transport's connections, then one vote
    /// on whether the group stands (a rank claimed twice fails it).
    fn join(
        env: &LaunchEnv,
        settings: Settings,
        generation: u64,
        inherited: Option<StoreServer>,
        lineage: admit::Lineage,
    ) -> Result<GroupInner> {
        let host = env.master_addr.clone().ok_or_else(|| {
            CommError::config(
                Some(env.rank),
                "MASTER_ADDR",
                format!(
                    "rank {} of {}: no master address; call .master(addr, port) or set MASTER_ADDR",
                    env.rank, env.world_size
                ),
            )
        })?;
        let server = match (inherited, env.store_host) {
            (Some(server), _) => Some(server),
            (None, StoreHost::RankZero) if env.rank == 0 => Some(join::host_store(&host, env)?),
            _ => None,
        };
        let keys = join::next_group_keys(env);
        let (store, local_ip) = join::connect_and_join(&host, env, &keys)?;
        log::debug!("rank {}: all {} ranks joined", env.rank, env.world_size);
        let machine_ids = join::machine_ids(&*store, env, &keys)?;
        let plan = host::plan(
            env.rank,
            settings.transport,
            settings.algorithm,
            &machine_ids,
        )?;
        let rdzv = Rendezvous {
            rank: env.rank,
            world_size: env.world_size,
            store: &*store,
            key_prefix: keys.prefix(),
            timeout: env.timeout,
            token: env.job_token.as_ref(),
            members: None,
        };
        let transport = host::connect(plan, rdzv, local_ip)?;
        // Whether a second claimant of a rank came while we connected.
        let saw_duplicate = store.check(&[&keys.duplicate()])?;
        let mut failures = Failures::new(env.rank);
        failures.keys = Some(keys.clone());
        let spans_machines = !host::one_machine(&machine_ids);
        let mut group = GroupInner::assemble(
            env,
            settings,
            store,
            transport,
            server,
            failures,
            spans_machines,
        );
        group.generation = generation;
        // Nobody leaves set-up (and possibly takes the store down) before all
        // are connected, and all decide together whether the group stands.
        if group.vote(saw_duplicate)? {
            let err = join::duplicate_error(&*group.store, env, &keys);
            // Rank 0 may host the store: all read the reason before anyone leaves.
            let _ = group.vote(false);
            return Err(err);
        }
        group.failures.duplicate_watch = join::watch_for_duplicates(&host, env, &keys);
        group.admissions.watch = admit::watch_for_joiners(&host, env, &lineage.job);
        group.lineage = lineage;
        Ok(group)
    }

    fn from_inner(inner: GroupInner) -> Self {
        Self {
            inner: Arc::new(inner),
        }
    }

    /// A handle that does not keep the group alive.
    pub fn downgrade(&self) -> WeakProcessGroup {
        WeakProcessGroup {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// Whether `other` is a handle to this same group.
    pub fn is_same(&self, other: &ProcessGroup) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Prefix of this group's store keys (a world of one has its own store).
    #[cfg_attr(not(feature = "nccl"), allow(dead_code))]
    pub(crate) fn key_prefix(&self) -> &str {
        self.inner
            .failures
            .keys
            .as_ref()
            .map_or("burn-ddp/", GroupKeys::prefix)
    }

    /// This process's global rank, `0..world_size`.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Number of processes in the group.
    pub fn world_size(&self) -> usize {
        self.inner.world_size
    }

    /// This process's rank on its machine (selects its GPU).
    pub fn local_rank(&self) -> usize {
        self.inner.local_rank
    }

    /// Whether the ranks are on more than one machine (some collectives
    /// cross a network link).
    pub fn spans_machines(&self) -> bool {
        self.inner.spans_machines
    }

    /// Number of processes on this machine.
    pub fn local_world_size(&self) -> usize {
        self.inner.local_world_size
    }

    /// Whether this is rank 0, the one that logs and writes checkpoints.
    pub fn is_main(&self) -> bool {
        self.inner.rank == 0
    }

    /// Who started this process.
    pub fn launcher(&self) -> Launcher {
        self.inner.launcher
    }

    /// The bound on every wait.
    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The host transport's name (`"tcp"`, `"shm"`, `"local"`).
    pub fn transport_name(&self) -> &'static str {
        self.inner.transport.lock().unwrap().name()
    }

    /// Bytes of the buffers this rank has handed to collectives on host
    /// memory so far (each all-reduce's buffer, each all-gather's input...):
    /// what it asked the transports to move, for accounting.
    pub fn collective_bytes(&self) -> u64 {
        self.inner.collective_bytes.load(Ordering::Relaxed)
    }

    /// The first time this rank calls it with `key` (its own name for
    /// something, not shared with the other ranks) on this group: every
    /// rank's `value`, in rank order, from one small all-gather, and the
    /// key's place in the order this rank first used keys (0, 1, ...); later
    /// calls with the same key return `None` at once. A check that a layer
    /// agrees across ranks (its width, say) then costs one collective per
    /// layer and process, not one per call. Every rank must make its first
    /// calls in the same order.
    pub fn gather_once(&self, key: u64, value: i64) -> Result<Option<(usize, Vec<i64>)>> {
        let place = {
            let mut seen = self.inner.gathered_once.lock().unwrap();
            if seen.contains(&key) {
                return Ok(None);
            }
            seen.push(key);
            seen.len() - 1
        };
        Ok(Some((place, self.all_gather(&[value])?)))
    }

    /// The rendezvous store (for exchanging small values at start-up).
    pub fn store(&self) -> &dyn Store {
        self.inner.store.as_ref()
    }

    /// How this group's f32 all-reduces (sums and means) cross machines, as
    /// set when it was built ([`crate::COMPRESSION_VAR`] or the builder):
    /// as they are, or as 16-bit floats accumulated in f32 (PyTorch's
    /// `bf16_compress_hook`, with f32 additions). `None` whenever the ranks
    /// share one machine.
    pub fn wire_compression(&self) -> WireCompression {
        self.inner
            .compression_across(self.inner.settings.compression)
    }

    /// Reduces `data` over all ranks, in place, on every rank.
    pub fn all_reduce<T: Element>(&self, data: &mut [T], op: ReduceOp) -> Result<()> {
        self.all_reduce_buffer(T::buffer(data), op)
    }

    /// [`all_reduce`](Self::all_reduce) of a buffer whose element type is
    /// known only at run time (a gradient bucket).
    pub fn all_reduce_buffer(&self, data: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.all_reduce_compressed(data, op, self.wire_compression())
    }

    /// [`all_reduce_buffer`](Self::all_reduce_buffer), with f32 sums and
    /// means crossing machines as `compression` says instead of the group's
    /// own setting (a model wrapped with its own gradient compression).
    /// Every rank must ask for the same.
    pub fn all_reduce_compressed(
        &self,
        data: BufferMut<'_>,
        op: ReduceOp,
        compression: WireCompression,
    ) -> Result<()> {
        let compression = self.inner.compression_across(compression);
        self.inner.host_collective(
            Signature::new("all_reduce", data.dtype(), data.len(), op as i64),
            |transport| transport.all_reduce_compressed(data, op, compression),
        )
    }

    /// [`reduce_scatter`](Self::reduce_scatter) in place: `data` holds
    /// `world_size` equal chunks; afterwards chunk `rank` holds this rank's
    /// part of the result (the other chunks: unspecified). No copy of
    /// `data` is made (a sharded optimizer's reused round buffer).
    pub fn reduce_scatter_in_place(&self, data: BufferMut<'_>, op: ReduceOp) -> Result<()> {
        self.check_chunks("reduce_scatter", data.len())?;
        self.inner.host_collective(
            Signature::new("reduce_scatter", data.dtype(), data.len(), op as i64),
            |transport| transport.reduce_scatter(data, op),
        )
    }

    /// [`all_gather`](Self::all_gather) in place: `data` holds `world_size`
    /// equal chunks, chunk `rank` filled by this rank; afterwards every chunk
    /// holds its rank's.
    pub fn all_gather_in_place(&self, data: BufferMut<'_>) -> Result<()> {
        self.check_chunks("all_gather", data.len())?;
        let k = data.len() / self.world_size();
        self.inner.host_collective(
            Signature::new("all_gather", data.dtype(), k, 0),
            |transport| transport.all_gather(data),
        )
    }

    /// An in-place collective's buffer must split into `world_size` equal chunks.
    fn check_chunks(&self, what: &str, len: usize) -> Result<()> {
        let world = self.world_size();
        if len.is_multiple_of(world) {
            return Ok(());
        }
        Err(CommError::InvalidArgument {
            rank: self.rank(),
            message: format!(
                "{what} in place needs a buffer of {world} equal chunks; got {len} elements \
                 (pad it to a multiple of {world})"
            ),
        })
    }

    /// Concatenates every rank's `input`, in rank order, on every rank.
    pub fn all_gather<T: Element>(&self, input: &[T]) -> Result<Vec<T>> {
        let k = input.len();
        let mut output = vec![T::zeroed(); k * self.world_size()];
        output[self.rank() * k..(self.rank() + 1) * k].copy_from_slice(input);
        self.inner
            .host_collective(Signature::new("all_gather", T::DTYPE, k, 0), |transport| {
                transport.all_gather(T::buffer(&mut output))
            })?;
        Ok(output)
    }

    /// Reduces `input` (`world_size` equal chunks) over all ranks and returns
    /// this rank's chunk of the result, as `reduce_scatter_tensor` does.
    pub fn reduce_scatter<T: Element>(&self, input: &[T], op: ReduceOp) -> Result<Vec<T>> {
        let world = self.world_size();
        if !input.len().is_multiple_of(world) {
            return Err(CommError::InvalidArgument {
                rank: self.rank(),
                message: format!(
                    "reduce_scatter needs an input length divisible by the world size; got \
                     {} elements for {world} ranks (pad the input to a multiple of {world})",
                    input.len(),
                ),
            });
        }
        let mut work = input.to_vec();
        self.inner.host_collective(
            Signature::new("reduce_scatter", T::DTYPE, input.len(), op as i64),
            |transport| transport.reduce_scatter(T::buffer(&mut work), op),
        )?;
        let k = input.len() / world;
        work.truncate((self.rank() + 1) * k);
        Ok(work.split_off(self.rank() * k))
    }

    /// Copies `data` of rank `root` into `data` on every rank.
    pub fn broadcast<T: Element>(&self, data: &mut [T], root: usize) -> Result<()> {
        if root >= self.world_size() {
            return Err(CommError::InvalidArgument {
                rank: self.rank(),
                message: format!(
                    "broadcast from root {root}, but ranks run from 0 to {}",
                    self.world_size() - 1
                ),
            });
        }
        self.inner.host_collective(
            Signature::new("broadcast", T::DTYPE, data.len(), root as i64),
            |transport| transport.broadcast(T::buffer(data), root),
        )
    }

    /// Waits until every rank has reached this call (bounded by the timeout).
    pub fn barrier(&self) -> Result<()> {
        self.inner.vote(false).map(|_| ())
    }

    /// Leaves the group after a final barrier, so no rank tears down the store
    /// while another still needs it. Dropping the group skips the barrier.
    pub fn destroy(self) -> Result<()> {
        self.close_admissions();
        self.barrier()
    }
}

impl GroupInner {
    fn assemble(
        env: &LaunchEnv,
        settings: Settings,
        store: Box<dyn Store>,
        transport: Box<dyn Transport>,
        server: Option<StoreServer>,
        failures: Failures,
        spans_machines: bool,
    ) -> Self {
        Self {
            rank: env.rank,
            world_size: env.world_size,
            local_rank: env.local_rank,
            local_world_size: env.local_world_size,
            launcher: env.launcher,
            timeout: env.timeout,
            settings,
            store,
            transport: Mutex::new(transport),
            spans_machines,
            collective_bytes: AtomicU64::new(0),
            gathered_once: Mutex::new(Vec::new()),
            failures,
            device: DeviceBackend::new(settings.device_backend),
            env: (env.world_size > 1).then(|| env.clone()),
            generation: 0,
            superseded: std::sync::atomic::AtomicBool::new(false),
            lineage: admit::Lineage::of(env),
            admissions: admit::Admissions::default(),
            store_server: Mutex::new(server),
        }
    }

    /// The host transport, unless the group was found unable to stand or
    /// its next generation replaced it.
    fn transport(&self) -> Result<MutexGuard<'_, Box<dyn Transport>>> {
        if let Some(err) = self.failures.fatal() {
            return Err(err);
        }
        let transport = self.transport.lock().unwrap();
        // Under the lock: a reform swaps the transport under it too.
        if self.superseded.load(Ordering::Relaxed) {
            return Err(reform::superseded(self.rank, self.generation));
        }
        Ok(transport)
    }

    /// Runs a collective on the host transport, after the debug check when it
    /// is on; a failure is reported with its origin.
    fn host_collective(
        &self,
        signature: Signature,
        run: impl FnOnce(&mut dyn Transport) -> Result<()>,
    ) -> Result<()> {
        let mut transport = self.transport()?;
        self.collective_bytes
            .fetch_add(signature.bytes() as u64, Ordering::Relaxed);
        if self.settings.debug_checks && self.world_size > 1 {
            signature.check(&mut **transport, self.rank, self.world_size)?;
        }
        run(&mut **transport).map_err(|err| self.failures.explain(&*self.store, err))
    }

    /// `compression` where the ranks span machines, none within one.
    fn compression_across(&self, compression: WireCompression) -> WireCompression {
        if self.spans_machines {
            compression
        } else {
            WireCompression::None
        }
    }

    /// A barrier that also tells whether any rank said yes.
    fn vote(&self, yes: bool) -> Result<bool> {
        let mut count = [1i32, yes as i32];
        self.collective_bytes.fetch_add(8, Ordering::Relaxed);
        self.transport()?
            .all_reduce(BufferMut::I32(&mut count), ReduceOp::Sum)
            .map_err(|err| self.failures.explain(&*self.store, err))?;
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
}

/// The job id and the rank's place in the world, checked before anything
/// is started.
fn check_place(env: &LaunchEnv) -> Result<()> {
    if !crate::job::valid_job_id(&env.job_id) {
        return Err(CommError::config(
            Some(env.rank),
            burn_ddp_rendezvous::job::JOB_ID_VAR,
            format!(
                "rank {}: job id {:?} must be 1 to 64 characters of letters, digits, '.', '_' \
                 and '-'",
                env.rank, env.job_id
            ),
        ));
    }
    if env.world_size == 0 || env.rank >= env.world_size {
        return Err(CommError::config(
            Some(env.rank),
            "RANK",
            format!(
                "rank {} is outside a world of {} ranks; ranks run from 0 to world_size - 1",
                env.rank, env.world_size
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_once_gathers_a_key_the_first_time_only() {
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        assert_eq!(group.gather_once(7, 4).unwrap(), Some((0, vec![4])));
        assert_eq!(group.gather_once(7, 5).unwrap(), None);
        assert_eq!(group.gather_once(9, 8).unwrap(), Some((1, vec![8])));
        assert_eq!(group.collective_bytes(), 16);
    }

    #[test]
    fn a_world_of_one_runs_every_collective_locally() {
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        let mut data = [1.5f32, -2.0];
        group.all_reduce(&mut data, ReduceOp::Mean).unwrap();
        assert_eq!(data, [1.5, -2.0]);
        assert_eq!(group.all_gather(&[7i64]).unwrap(), [7]);
        assert_eq!(
            group.reduce_scatter(&[3i32, 4], ReduceOp::Sum).unwrap(),
            [3, 4]
        );
        group.broadcast(&mut data, 0).unwrap();
        let err = group.broadcast(&mut data, 1).unwrap_err().to_string();
        assert!(err.contains("root 1, but ranks run from 0 to 0"), "{err}");
        group.barrier().unwrap();
        assert!(group.is_main() && group.transport_name() == "local");
        // 2 f32, 1 i64, 2 i32, 2 f32, and the barrier's 2 i32.
        assert_eq!(group.collective_bytes(), 8 + 8 + 8 + 8 + 8);
    }

    #[test]
    fn handles_share_one_membership_and_a_weak_one_does_not_keep_it() {
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        let clone = group.clone();
        assert!(clone.is_same(&group));
        let other = ProcessGroup::builder(0, 1).build().unwrap();
        assert!(!other.is_same(&group));
        let weak = group.downgrade();
        assert!(weak.upgrade().is_some_and(|g| g.is_same(&group)));
        drop(group);
        assert!(weak.upgrade().is_some(), "the clone still holds it");
        clone.destroy().unwrap();
        assert!(weak.upgrade().is_none());
    }

    #[test]
    fn out_of_range_ranks_and_bad_job_ids_are_refused() {
        let err = ProcessGroup::builder(2, 2).build().unwrap_err().to_string();
        assert!(
            err.contains("rank 2 is outside a world of 2 ranks"),
            "{err}"
        );
        let err = ProcessGroup::builder(0, 1)
            .job("a/b", None)
            .build()
            .unwrap_err()
            .to_string();
        assert!(err.contains("job id \"a/b\""), "{err}");
        let err = ProcessGroup::builder(0, 2).build().unwrap_err().to_string();
        assert!(err.contains("rank 0 of 2: no master address"), "{err}");
    }
}
