//! What a front-end's `wrap` sets up for one model: its reducer (over its
//! group; and so its buckets and statistics), and which parameters are its,
//! by the framework's parameter ids (Burn's `ParamId`, stable across
//! optimizer steps). Two models wrapped separately are synchronised
//! separately; a model never wrapped is synchronised over the default group,
//! as `torch.distributed`'s default group serves everyone.
//!
//! Also the per-thread `no_sync` state, for every model or one. Both are
//! framework-free, so every front-end shares them.

use super::{BucketConfig, Reducer};
use crate::group::ProcessGroup;
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
