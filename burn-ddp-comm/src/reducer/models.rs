//! What a front-end's `wrap` sets up for one model: its reducer (over its
//! group; and so its buckets and statistics), and which parameters are its,
//! by the framework's parameter ids (Burn's `ParamId`, stable across
//! optimizer steps). Two models wrapped separately are synchronised
//! separately; a model never wrapped is synchronised over the default group,
//! as `torch.distributed`'s default group serves everyone.
//!
//! Also the per-thread `no_sync` state, for every model or one. Both are
//! framework-free, so every front-end shares them.

use super::{check_layouts_agree, check_same_layout, BucketConfig, ParamLayout, Reducer};
use crate::default_group::{self, DefaultGroup};
use crate::error::Result;
use crate::group::ProcessGroup;
use crate::transport::WireCompression;
use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The synchronisation state of one wrapped model.
pub struct ModelScope {
    /// 1, 2, ... in wrap order; every rank wraps its models in the same order,
    /// so ids agree across ranks (0 is the default scope).
    pub id: u64,
    /// The model's reducer (its group, buckets and statistics).
    pub reducer: Mutex<Reducer>,
    params: Mutex<HashSet<u64>>,
}

impl ModelScope {
    /// Whether `param` is one of this model's parameters.
    pub fn holds(&self, param: u64) -> bool {
        self.params.lock().unwrap().contains(&param)
    }
}

/// The default scope's id: parameters of no wrapped model.
pub const DEFAULT_SCOPE: u64 = 0;

static SCOPES: Mutex<Vec<Arc<ModelScope>>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The scope for a model with trainable `params`, over `group`: the one these
/// parameters already belong to (wrapping a model again), or a new one.
pub fn register(
    group: &ProcessGroup,
    config: BucketConfig,
    params: HashSet<u64>,
) -> Arc<ModelScope> {
    let mut scopes = SCOPES.lock().unwrap();
    let existing = scopes
        .iter()
        .find(|scope| params.iter().any(|p| scope.holds(*p)))
        .cloned();
    match existing {
        Some(scope) => {
            *scope.reducer.lock().unwrap() = Reducer::new(group, config);
            *scope.params.lock().unwrap() = params;
            scope
        }
        None => {
            let scope = Arc::new(ModelScope {
                id: NEXT_ID.fetch_add(1, Ordering::SeqCst),
                reducer: Mutex::new(Reducer::new(group, config)),
                params: Mutex::new(params),
            });
            scopes.push(Arc::clone(&scope));
            scope
        }
    }
}

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
    /// The group's wire compression (only ever turned on).
    pub compression: WireCompression,
    /// Whether the buffers are broadcast too, so they must agree.
    pub broadcast_buffers: bool,
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

/// Everything of `wrap` but the broadcast, which the front-end does next
/// (inside the returned scope, so its tensors are marked as the model's):
/// the layouts checked across ranks, the compression set, the model's scope
/// registered (`None`: nothing trainable). Collective.
pub fn wrap(
    group: &ProcessGroup,
    settings: WrapSettings,
    layout: ModuleLayout,
) -> Result<Option<Arc<ModelScope>>> {
    if settings.compression != WireCompression::None {
        group.set_wire_compression(settings.compression);
    }
    check_module(group, &layout, settings.broadcast_buffers)?;
    Ok((!layout.trainable_ids.is_empty())
        .then(|| register(group, settings.buckets, layout.trainable_ids)))
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

/// The target of the model whose first trainable parameter is
/// `first_trainable`: its scope if it was wrapped, else the default group
/// (`None` without one, in a world of one; an error when launched with
/// several ranks and no group).
pub fn target_for(first_trainable: Option<u64>) -> Result<Option<SyncTarget>> {
    if let Some(scope) = first_trainable.and_then(of_param) {
        return Ok(Some(SyncTarget::Model(scope)));
    }
    Ok(default_group::required_if_distributed()?.map(SyncTarget::Default))
}

/// What synchronising the model whose first trainable parameter is
/// `first_trainable` cost so far: its own reducer's figures if it was wrapped,
/// else the default group's (shared by every model never wrapped).
pub fn stats_of(first_trainable: Option<u64>) -> Option<super::SyncStats> {
    let target = match first_trainable.and_then(of_param) {
        Some(scope) => SyncTarget::Model(scope),
        None => SyncTarget::Default(default_group::current()?),
    };
    let stats = target.reducer().lock().unwrap().stats();
    Some(stats)
}

/// The scope of the model that holds parameter `param`.
pub fn of_param(param: u64) -> Option<Arc<ModelScope>> {
    SCOPES
        .lock()
        .unwrap()
        .iter()
        .find(|scope| scope.holds(param))
        .cloned()
}

/// The scope with `id`.
pub fn by_id(id: u64) -> Option<Arc<ModelScope>> {
    SCOPES
        .lock()
        .unwrap()
        .iter()
        .find(|scope| scope.id == id)
        .cloned()
}

/// Whether any model was wrapped (and not forgotten since).
pub fn any_wrapped() -> bool {
    !SCOPES.lock().unwrap().is_empty()
}

/// Forgets the models wrapped over groups that no longer exist or over
/// `group` (which is being destroyed).
pub fn forget_group(group: &ProcessGroup) {
    SCOPES.lock().unwrap().retain(|scope| {
        let reducer = scope.reducer.lock().unwrap();
        reducer.group().is_ok_and(|g| !g.is_same(group))
    });
}

thread_local! {
    /// `no_sync()` guards alive on this thread (all models).
    static ALL_LOCAL: RefCell<usize> = const { RefCell::new(0) };
    /// `no_sync_for(model)` guards alive on this thread, by scope.
    static MODELS_LOCAL: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Keeps gradients local on this thread while alive: for every model, or for
/// the model of one scope (a front-end's `no_sync` guard holds one).
pub struct Silence {
    scope: Option<u64>,
}

impl Silence {
    /// Silences every model on this thread.
    pub fn all() -> Self {
        ALL_LOCAL.with(|depth| *depth.borrow_mut() += 1);
        Self { scope: None }
    }

    /// Silences the model of `scope` on this thread.
    pub fn one(scope: u64) -> Self {
        MODELS_LOCAL.with(|silenced| silenced.borrow_mut().push(scope));
        Self { scope: Some(scope) }
    }
}

impl Drop for Silence {
    fn drop(&mut self) {
        match self.scope {
            None => ALL_LOCAL.with(|depth| *depth.borrow_mut() -= 1),
            Some(scope) => MODELS_LOCAL.with(|silenced| {
                let mut silenced = silenced.borrow_mut();
                if let Some(at) = silenced.iter().rposition(|s| *s == scope) {
                    silenced.remove(at);
                }
            }),
        }
    }
}

/// Whether backward passes on this thread synchronise at all.
pub fn all_enabled() -> bool {
    ALL_LOCAL.with(|depth| *depth.borrow() == 0)
}

/// Whether backward passes on this thread synchronise the model of `scope`.
pub fn enabled(scope: u64) -> bool {
    all_enabled() && MODELS_LOCAL.with(|silenced| !silenced.borrow().contains(&scope))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_is_per_thread_and_per_model() {
        assert!(enabled(5) && enabled(6));
        let five = Silence::one(5);
        assert!(!enabled(5) && enabled(6) && all_enabled());
        let other_thread = std::thread::spawn(|| (enabled(5), all_enabled()));
        {
            let _all = Silence::all();
            assert!(!enabled(6) && !all_enabled());
        }
        assert_eq!(other_thread.join().unwrap(), (true, true));
        drop(five);
        assert!(enabled(5) && all_enabled());
    }

    #[test]
    fn wrap_registers_trainable_models_and_targets_follow_their_parameters() {
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        let settings = WrapSettings {
            buckets: BucketConfig::from_mib(0, 2.0, 0.5).unwrap(),
            compression: WireCompression::None,
            broadcast_buffers: true,
        };
        let layout = |ids: &[u64]| ModuleLayout {
            trainable: ids
                .iter()
                .map(|_| ParamLayout {
                    shape: vec![2],
                    dtype: crate::DType::F32,
                })
                .collect(),
            trainable_ids: ids.iter().copied().collect(),
            buffers: Vec::new(),
        };
        assert!(wrap(&group, settings, layout(&[])).unwrap().is_none());
        let scope = wrap(&group, settings, layout(&[901, 902]))
            .unwrap()
            .unwrap();
        assert_eq!(scope.reducer.lock().unwrap().config().cap_bytes, 2 << 20);
        let target = target_for(Some(902)).unwrap().unwrap();
        assert_eq!(target.scope(), scope.id);
        assert!(target.group().unwrap().is_same(&group));
        assert_eq!(stats_of(Some(901)).map(|s| s.syncs), Some(0));
        // A parameter of no wrapped model, no default group, no launcher: nothing to do.
        assert!(target_for(Some(903)).unwrap().is_none());
        let bad = BucketConfig::from_mib(4, 0.0, 1.0).unwrap_err().to_string();
        assert!(
            bad.contains("rank 4") && bad.contains("bucket_cap_mb"),
            "{bad}"
        );
        forget_group(&group);
        assert!(target_for(Some(902)).unwrap().is_none());
    }

    #[test]
    fn wrapping_again_keeps_the_scope_and_new_models_get_their_own() {
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        let (a, b, c) = (11, 12, 13);
        let first = register(&group, BucketConfig::default(), [a, b].into());
        let again = register(&group, BucketConfig::default(), [a, b].into());
        assert_eq!(first.id, again.id);
        let other = register(&group, BucketConfig::default(), [c].into());
        assert_ne!(other.id, first.id);
        assert_eq!(of_param(b).map(|s| s.id), Some(first.id));
        assert_eq!(by_id(other.id).map(|s| s.id), Some(other.id));
        assert!(any_wrapped());
        forget_group(&group);
        assert!(of_param(a).is_none() && of_param(c).is_none());
    }
}
