//! What a front-end keeps between the calls of its process-wide API
//! (`init_process_group`, `wrap`, `sync_gradients`, `destroy_process_group`),
//! as `torch.distributed` keeps its default group above c10d: the default
//! group with the reducer of the models that were never wrapped, and each
//! wrapped model's state (its reducer over its group, found by the
//! framework's parameter ids, which survive optimizer steps).
//!
//! A [`Session`] is an owned value: a front-end creates one (a `static`, as
//! the default group is process-wide by PyTorch's contract), tests create as
//! many as they like. The layer below keeps one process-wide fact of its
//! own: how many groups each rank started (so a new group's store keys never
//! meet an old one's).

use crate::Result;
use burn_ddp_comm::{
    check_layouts_agree, check_same_layout, BucketConfig, CommError, LaunchEnv, ParamLayout,
    ProcessGroup, Reducer, SyncStats, WireCompression,
};
use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// The default group and every wrapped model of one front-end.
pub struct Session {
    state: Mutex<State>,
    /// Every synchronisation made through this session, summed.
    totals: Mutex<SyncStats>,
    /// The launcher's rank and world size, read once: the error for a
    /// distributed run that never made its group needs them.
    launched: OnceLock<Option<(usize, usize)>>,
}

#[derive(Default)]
struct State {
    default: Option<Arc<DefaultGroup>>,
    models: Vec<Arc<ModelScope>>,
    /// The id the next wrapped model gets (every rank wraps in the same
    /// order, so ids agree across ranks; 0 is [`DEFAULT_SCOPE`]).
    next_id: u64,
    /// First parameters of the unwrapped models already said to go over
    /// the default group.
    defaulted: BTreeSet<u64>,
    /// Default groups replaced by their next generation ([`Session::reform`]),
    /// kept until `destroy` so what still holds a weak handle to one (a
    /// sharded optimizer) hears why it cannot go on, not that it is gone.
    replaced: Vec<ProcessGroup>,
}

/// The default group and the reducer of the models that were never wrapped.
pub struct DefaultGroup {
    /// The group made by [`Session::init`].
    pub group: ProcessGroup,
    /// The reducer shared by every model never wrapped.
    pub reducer: Mutex<Reducer>,
}

/// The synchronisation state of one wrapped model.
pub struct ModelScope {
    /// 1, 2, ... in wrap order ([`DEFAULT_SCOPE`] is the default group's).
    pub id: u64,
    /// The model's reducer (its group, buckets, compression and statistics).
    pub reducer: Mutex<Reducer>,
    params: Mutex<HashSet<u64>>,
    overlap_backward: AtomicBool,
    overlap_on_gpu: AtomicBool,
}

impl ModelScope {
    /// Whether its buckets may leave during backward ([`WrapSettings`]).
    pub fn overlaps_backward(&self) -> bool {
        self.overlap_backward.load(Ordering::Relaxed)
    }

    /// Whether it does so on the GPU path (NCCL) too ([`WrapSettings`]).
    pub fn overlaps_on_gpu(&self) -> bool {
        self.overlap_on_gpu.load(Ordering::Relaxed)
    }

    /// Whether `param` is one of this model's parameters.
    pub fn holds(&self, param: u64) -> bool {
        self.params.lock().unwrap().contains(&param)
    }
}

/// The scope id of parameters of no wrapped model.
pub const DEFAULT_SCOPE: u64 = 0;

/// What a front-end's `wrap` found in a model, in visiting order.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ModuleLayout {
    /// The trainable parameters' layouts.
    pub trainable: Vec<ParamLayout>,
    /// Their ids.
    pub trainable_ids: HashSet<u64>,
    /// Every other tensor (batch-norm statistics, frozen weights).
    pub buffers: Vec<ParamLayout>,
}

/// How a model is wrapped (a front-end's `DdpConfig`, resolved).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WrapSettings {
    /// Its buckets.
    pub buckets: BucketConfig,
    /// How its gradients cross machines.
    pub compression: WireCompression,
    /// Whether the buffers are broadcast too, so they must agree.
    pub broadcast_buffers: bool,
    /// Whether buckets may leave during backward, as its gradients become
    /// final (where the front-end can tell; Burn 0.21's `Ddp<B>`).
    pub overlap_backward: bool,
    /// Whether they may on the GPU path (NCCL) too: only when asked for
    /// outright, until a GPU has run it.
    pub overlap_on_gpu: bool,
}

/// Where a model's gradients are synchronised: its own scope, or the
/// default group's reducer.
pub enum SyncTarget {
    /// A wrapped model's scope.
    Model(Arc<ModelScope>),
    /// The default group (models never wrapped).
    Default(Arc<DefaultGroup>),
}

impl SyncTarget {
    /// The reducer to synchronise with.
    pub fn reducer(&self) -> &Mutex<Reducer> {
        match self {
            SyncTarget::Model(scope) => &scope.reducer,
            SyncTarget::Default(state) => &state.reducer,
        }
    }

    /// The group it reduces over (an error once destroyed).
    pub fn group(&self) -> Result<ProcessGroup> {
        match self {
            SyncTarget::Model(scope) => scope.reducer.lock().unwrap().group(),
            SyncTarget::Default(state) => Ok(state.group.clone()),
        }
    }

    /// The scope's id ([`DEFAULT_SCOPE`] for the default group).
    pub fn scope(&self) -> u64 {
        match self {
            SyncTarget::Model(scope) => scope.id,
            SyncTarget::Default(_) => DEFAULT_SCOPE,
        }
    }
}

const BUFFERS_DIFFER: &str = "Buffers are tensors without gradients (batch-norm \
    statistics, frozen weights); build the same ones on every rank, or keep each rank's \
    own with DdpConfig::new().with_broadcast_buffers(false)";

/// Fails on every rank unless all hold the same trainable parameters (and,
/// with `buffers`, the same other tensors): broadcasting tensors of
/// different sizes would garble or hang. Collective.
pub fn check_module(group: &ProcessGroup, layout: &ModuleLayout, buffers: bool) -> Result<()> {
    check_same_layout(group, &layout.trainable)?;
    if buffers {
        check_layouts_agree(group, &layout.buffers, "buffers", BUFFERS_DIFFER)?;
    }
    Ok(())
}

impl Default for Session {
    fn default() -> Self {
        Self::new()
    }
}

impl Session {
    /// A session with no group and no model.
    pub const fn new() -> Self {
        Self {
            state: Mutex::new(State {
                default: None,
                models: Vec::new(),
                next_id: DEFAULT_SCOPE + 1,
                defaulted: BTreeSet::new(),
                replaced: Vec::new(),
            }),
            totals: Mutex::new(SyncStats {
                syncs: 0,
                buckets: 0,
                bytes: 0,
                device_buckets: 0,
                early_buckets: 0,
                wait: std::time::Duration::ZERO,
                pack: std::time::Duration::ZERO,
                reduce: std::time::Duration::ZERO,
                unpack: std::time::Duration::ZERO,
            }),
            launched: OnceLock::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere while holding it leaves consistent data.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Joins the group described by the launcher's environment (torchrun,
    /// burn-ddp-run, Open MPI, Slurm; a world of one without a launcher) and
    /// makes it the default group. A second call is an error naming the fix.
    pub fn init(&self) -> Result<ProcessGroup> {
        self.init_with(ProcessGroup::from_env)
    }

    /// [`init`](Self::init) with a group made by `make` (tests build one with
    /// [`ProcessGroup::builder`]).
    pub fn init_with(&self, make: impl FnOnce() -> Result<ProcessGroup>) -> Result<ProcessGroup> {
        let mut state = self.state();
        if let Some(current) = &state.default {
            let rank = current.group.rank();
            return Err(CommError::config(
                Some(rank),
                "init_process_group",
                format!(
                    "rank {rank}: init_process_group was already called; reuse the group it \
                     returned (or default_group())"
                ),
            ));
        }
        let group = make()?;
        state.default = Some(Arc::new(DefaultGroup {
            reducer: Mutex::new(Reducer::new(&group, BucketConfig::default())),
            group: group.clone(),
        }));
        Ok(group)
    }

    /// The default group's state, if [`init`](Self::init) was called.
    pub fn current(&self) -> Option<Arc<DefaultGroup>> {
        self.state().default.clone()
    }

    /// The default group, if [`init`](Self::init) was called.
    pub fn default_group(&self) -> Option<ProcessGroup> {
        self.current().map(|state| state.group.clone())
    }

    /// This process's rank in the session's groups (the default group's,
    /// else a wrapped model's), if it has any.
    pub fn rank(&self) -> Option<usize> {
        let state = self.state();
        if let Some(default) = &state.default {
            return Some(default.group.rank());
        }
        state
            .models
            .iter()
            .find_map(|scope| scope.reducer.lock().unwrap().group().ok())
            .map(|group| group.rank())
    }

    /// [`current`](Self::current), or an error if the launcher started
    /// several ranks but nobody joined the group (gradients would silently
    /// stay local).
    pub fn required_if_distributed(&self) -> Result<Option<Arc<DefaultGroup>>> {
        if let Some(state) = self.current() {
            return Ok(Some(state));
        }
        let launched = self.launched.get_or_init(|| {
            LaunchEnv::from_env()
                .ok()
                .map(|env| (env.rank, env.world_size))
        });
        match launched {
            Some((rank, world)) if *world > 1 => Err(CommError::config(
                Some(*rank),
                "init_process_group",
                format!(
                    "rank {rank} of {world}: gradients were to be averaged before the process \
                     group was initialised, so they would not be; call init_process_group() \
                     at the start of the program"
                ),
            )),
            _ => Ok(None),
        }
    }

    /// After a collective of the default group failed: the next generation
    /// of it among the ranks still there ([`ProcessGroup::reform`]),
    /// which becomes the default group. Models wrapped over the failed one
    /// are wrapped again over the new one by the caller (their reducers
    /// talk to the failed group until then). Collective among the
    /// survivors.
    pub fn reform(&self, wait: std::time::Duration) -> Result<ProcessGroup> {
        let current = self.current().ok_or(CommError::Destroyed)?;
        let next = current.group.reform(wait)?;
        let mut state = self.state();
        state.replaced.push(current.group.clone());
        state.default = Some(Arc::new(DefaultGroup {
            reducer: Mutex::new(Reducer::new(&next, BucketConfig::default())),
            group: next.clone(),
        }));
        Ok(next)
    }

    /// Replacement workers wait to join (`ProcessGroup::joiners_waiting`):
    /// the default group's next generation with them appended
    /// ([`ProcessGroup::admit`]), which becomes the default group; models
    /// are wrapped again over it by the caller. Collective among the
    /// members, at the same step boundary.
    pub fn admit(&self, wait: std::time::Duration) -> Result<ProcessGroup> {
        let current = self.current().ok_or(CommError::Destroyed)?;
        let next = current.group.admit(wait)?;
        if next.is_same(&current.group) {
            return Ok(next);
        }
        let mut state = self.state();
        state.replaced.push(current.group.clone());
        state.default = Some(Arc::new(DefaultGroup {
            reducer: Mutex::new(Reducer::new(&next, BucketConfig::default())),
            group: next.clone(),
        }));
        Ok(next)
    }

    /// Waits for every rank (bounded by the timeout), then forgets the
    /// default group and the models wrapped over it; its connections close
    /// once the last handle to it is dropped.
    pub fn destroy(&self) -> Result<()> {
        self.state().replaced.clear();
        let state = self.state().default.take().ok_or(CommError::Destroyed)?;
        self.forget_group(&state.group);
        // The training is over: a replacement still waiting leaves.
        state.group.close_admissions();
        state.group.barrier()
    }

    /// Everything of a front-end's `wrap` but the broadcast, which the
    /// front-end does next (inside the returned scope, so a decorator can
    /// mark its tensors as the model's): the layouts checked across ranks,
    /// the model's scope registered with its buckets and compression
    /// (`None`: nothing trainable). Collective.
    pub fn wrap(
        &self,
        group: &ProcessGroup,
        settings: WrapSettings,
        layout: ModuleLayout,
    ) -> Result<Option<Arc<ModelScope>>> {
        check_module(group, &layout, settings.broadcast_buffers)?;
        if layout.trainable_ids.is_empty() {
            return Ok(None);
        }
        let mut reducer = Reducer::new(group, settings.buckets);
        // Unset, the group's own setting (BURN_DDP_COMPRESSION) applies.
        if settings.compression != WireCompression::None {
            reducer = reducer.with_compression(settings.compression);
        }
        let scope = self.register(reducer, layout.trainable_ids);
        scope
            .overlap_backward
            .store(settings.overlap_backward, Ordering::Relaxed);
        scope
            .overlap_on_gpu
            .store(settings.overlap_on_gpu, Ordering::Relaxed);
        Ok(Some(scope))
    }

    /// The scope for a model with trainable `params`: the one these
    /// parameters already belong to (wrapping a model again), with
    /// `reducer`, or a new one.
    fn register(&self, reducer: Reducer, params: HashSet<u64>) -> Arc<ModelScope> {
        let mut state = self.state();
        let existing = state
            .models
            .iter()
            .find(|scope| params.iter().any(|p| scope.holds(*p)))
            .cloned();
        match existing {
            Some(scope) => {
                *scope.reducer.lock().unwrap() = reducer;
                *scope.params.lock().unwrap() = params;
                scope
            }
            None => {
                let scope = Arc::new(ModelScope {
                    id: state.next_id,
                    reducer: Mutex::new(reducer),
                    params: Mutex::new(params),
                    overlap_backward: AtomicBool::new(false),
                    overlap_on_gpu: AtomicBool::new(false),
                });
                state.next_id += 1;
                state.models.push(Arc::clone(&scope));
                scope
            }
        }
    }

    /// The target of the model whose first trainable parameter is
    /// `first_trainable`: its scope if it was wrapped, else the default group
    /// (`None` without one, in a world of one; an error when launched with
    /// several ranks and no group).
    pub fn target_for(&self, first_trainable: Option<u64>) -> Result<Option<SyncTarget>> {
        if let Some(scope) = first_trainable.and_then(|id| self.of_param(id)) {
            return Ok(Some(SyncTarget::Model(scope)));
        }
        let target = self.required_if_distributed()?.map(SyncTarget::Default);
        if let (Some(target), Some(first)) = (&target, first_trainable) {
            if let Some(notice) = self.default_notice(first, target) {
                log::info!("{notice}");
            }
        }
        Ok(target)
    }

    /// What to say, once per model (by its first parameter), when a model
    /// none of whose parameters was wrapped goes over the default group
    /// while other models were wrapped: most often it is a wrapped model
    /// whose parameters were replaced since (a record loaded), which keeps
    /// working but with the default group's buckets and statistics.
    fn default_notice(&self, first: u64, target: &SyncTarget) -> Option<String> {
        let mut state = self.state();
        if state.models.is_empty() || !state.defaulted.insert(first) {
            return None;
        }
        let rank = target
            .group()
            .map_or_else(|_| "?".to_string(), |g| g.rank().to_string());
        Some(format!(
            "rank {rank}: a model that was not wrapped is synchronised over the default group \
             ({} model(s) wrapped in this process); if it is a wrapped model whose record was \
             loaded since, wrap it again so it keeps its own group, buckets and statistics",
            state.models.len()
        ))
    }

    /// What synchronising the model whose first trainable parameter is
    /// `first_trainable` cost so far: its own reducer's figures if it was
    /// wrapped, else the default group's (shared by every model never wrapped).
    pub fn stats_of(&self, first_trainable: Option<u64>) -> Option<SyncStats> {
        let target = match first_trainable.and_then(|id| self.of_param(id)) {
            Some(scope) => SyncTarget::Model(scope),
            None => SyncTarget::Default(self.current()?),
        };
        let stats = target.reducer().lock().unwrap().stats();
        Some(stats)
    }

    /// The scope of the model that holds parameter `param`.
    pub fn of_param(&self, param: u64) -> Option<Arc<ModelScope>> {
        self.state()
            .models
            .iter()
            .find(|scope| scope.holds(param))
            .cloned()
    }

    /// The scope with `id`.
    pub fn by_id(&self, id: u64) -> Option<Arc<ModelScope>> {
        self.state()
            .models
            .iter()
            .find(|scope| scope.id == id)
            .cloned()
    }

    /// Whether any model was wrapped (and not forgotten since).
    pub fn any_wrapped(&self) -> bool {
        !self.state().models.is_empty()
    }

    /// Forgets the models wrapped over groups that no longer exist or over
    /// `group` (which is being destroyed).
    pub fn forget_group(&self, group: &ProcessGroup) {
        self.state().models.retain(|scope| {
            let reducer = scope.reducer.lock().unwrap();
            reducer.group().is_ok_and(|g| !g.is_same(group))
        });
    }

    /// Averages `set` with `reducer` and counts what it cost in this
    /// session's totals; `false` when nothing moved.
    pub fn synchronize(
        &self,
        reducer: &Mutex<Reducer>,
        set: &mut dyn burn_ddp_comm::GradientSet,
    ) -> Result<bool> {
        let stats = reducer.lock().unwrap().synchronize(set)?;
        if let Some(stats) = &stats {
            self.totals.lock().unwrap().add(stats);
        }
        Ok(stats.is_some())
    }

    /// Ends a synchronisation begun on `reducer` ([`Reducer::begin`]),
    /// counted as [`synchronize`](Self::synchronize) counts one.
    pub fn finish(
        &self,
        reducer: &Mutex<Reducer>,
        round: burn_ddp_comm::SyncRound,
        set: &mut dyn burn_ddp_comm::GradientSet,
    ) -> Result<bool> {
        let stats = reducer.lock().unwrap().finish(round, set)?;
        if let Some(stats) = &stats {
            self.totals.lock().unwrap().add(stats);
        }
        Ok(stats.is_some())
    }

    /// Every synchronisation made through this session so far, summed (each
    /// model's own figures are its reducer's).
    pub fn sync_stats(&self) -> SyncStats {
        *self.totals.lock().unwrap()
    }

    /// Starts [`sync_stats`](Self::sync_stats) from zero.
    pub fn reset_sync_stats(&self) {
        *self.totals.lock().unwrap() = SyncStats::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> WrapSettings {
        WrapSettings {
            buckets: BucketConfig::from_mib(0, 2.0, 0.5).unwrap(),
            compression: WireCompression::None,
            broadcast_buffers: true,
            overlap_backward: true,
            overlap_on_gpu: false,
        }
    }

    fn layout(ids: &[u64]) -> ModuleLayout {
        ModuleLayout {
            trainable: ids
                .iter()
                .map(|_| ParamLayout {
                    shape: vec![2],
                    dtype: burn_ddp_comm::DType::F32,
                })
                .collect(),
            trainable_ids: ids.iter().copied().collect(),
            buffers: Vec::new(),
        }
    }

    #[test]
    fn wrap_registers_trainable_models_and_targets_follow_their_parameters() {
        let session = Session::new();
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        assert!(session
            .wrap(&group, settings(), layout(&[]))
            .unwrap()
            .is_none());
        let scope = session
            .wrap(&group, settings(), layout(&[901, 902]))
            .unwrap()
            .unwrap();
        assert_eq!(scope.reducer.lock().unwrap().config().cap_bytes, 2 << 20);
        let target = session.target_for(Some(902)).unwrap().unwrap();
        assert_eq!(target.scope(), scope.id);
        assert!(target.group().unwrap().is_same(&group));
        assert_eq!(session.stats_of(Some(901)).map(|s| s.syncs), Some(0));
        // A parameter of no wrapped model, no default group, no launcher: nothing to do.
        assert!(session.target_for(Some(903)).unwrap().is_none());
        session.forget_group(&group);
        assert!(session.target_for(Some(902)).unwrap().is_none());
    }

    #[test]
    fn a_model_that_falls_back_to_the_default_group_is_said_once() {
        let session = Session::new();
        let group = session.init().unwrap();
        let default = || session.target_for(Some(77)).unwrap().unwrap();
        // Nothing wrapped: every model goes over the default group, unremarked.
        assert!(session.default_notice(77, &default()).is_none());
        session.wrap(&group, settings(), layout(&[71])).unwrap();
        assert_eq!(default().scope(), DEFAULT_SCOPE);
        let notice = session.default_notice(78, &default()).unwrap();
        assert!(
            notice.starts_with("rank 0: a model that was not wrapped")
                && notice.contains("1 model(s) wrapped")
                && notice.contains("wrap it again"),
            "{notice}"
        );
        assert!(
            session.default_notice(78, &default()).is_none(),
            "said once"
        );
        session.destroy().unwrap();
    }

    #[test]
    fn wrapping_again_keeps_the_scope_and_new_models_get_their_own() {
        let session = Session::new();
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        let (a, b, c) = (11, 12, 13);
        let first = session
            .wrap(&group, settings(), layout(&[a, b]))
            .unwrap()
            .unwrap();
        let again = session
            .wrap(&group, settings(), layout(&[a, b]))
            .unwrap()
            .unwrap();
        assert_eq!(first.id, again.id);
        let other = session
            .wrap(&group, settings(), layout(&[c]))
            .unwrap()
            .unwrap();
        assert_ne!(other.id, first.id);
        assert_eq!(session.of_param(b).map(|s| s.id), Some(first.id));
        assert_eq!(session.by_id(other.id).map(|s| s.id), Some(other.id));
        assert!(session.any_wrapped());
        session.forget_group(&group);
        assert!(session.of_param(a).is_none() && session.of_param(c).is_none());
    }

    #[test]
    fn sessions_are_independent_and_the_default_group_is_made_once() {
        let (one, two) = (Session::new(), Session::new());
        let group = one
            .init_with(|| ProcessGroup::builder(0, 1).build())
            .unwrap();
        assert!(one.default_group().unwrap().is_same(&group));
        assert!(two.default_group().is_none());
        let again = one
            .init_with(|| ProcessGroup::builder(0, 1).build())
            .unwrap_err();
        assert!(
            matches!(&again, CommError::Config { rank: Some(0), setting, .. } if setting == "init_process_group"),
            "{again}"
        );
        one.wrap(&group, settings(), layout(&[5])).unwrap().unwrap();
        assert!(one.any_wrapped() && !two.any_wrapped());
        one.destroy().unwrap();
        assert!(one.default_group().is_none() && !one.any_wrapped());
        assert!(matches!(one.destroy(), Err(CommError::Destroyed)));
    }
}
