//! Which backward passes keep their gradients local: the `no_sync` guards
//! alive on this thread, for every model or for one (`Ddp<B>::backward` has
//! no module to ask, so the guards are per thread, as its callers are).

use std::cell::RefCell;

thread_local! {
    /// `no_sync()` guards alive on this thread (all models).
    static ALL_LOCAL: RefCell<usize> = const { RefCell::new(0) };
    /// `no_sync_for(model)` guards alive on this thread, by scope.
    static MODELS_LOCAL: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Keeps gradients local on this thread while alive: for every model, or for
/// the model of one scope (a `NoSyncGuard` holds one).
pub(crate) struct Silence {
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
pub(crate) fn all_enabled() -> bool {
    ALL_LOCAL.with(|depth| *depth.borrow() == 0)
}

/// Whether backward passes on this thread synchronise the model of `scope`.
pub(crate) fn enabled(scope: u64) -> bool {
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
}
