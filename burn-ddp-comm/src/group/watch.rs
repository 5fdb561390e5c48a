//! Watches on the store, each on a thread and a connection of its own: one
//! key that, once set, means the group cannot stand (a rank claimed twice),
//! so every collective fails with that reason even after the group has
//! formed; and two counters that say a replacement waits to join.

use crate::store::Store;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// How long one wait on the store lasts; also how soon a dropped watch ends.
const POLL: Duration = Duration::from_secs(1);

/// Waits for `key` on a thread of its own, over a connection of its own (the
/// group's is busy with its own requests).
pub(crate) struct KeyWatch {
    reason: Arc<OnceLock<String>>,
    stop: Arc<AtomicBool>,
}

impl KeyWatch {
    /// Starts watching; the thread ends when the key appears, the store goes
    /// away or the watch is dropped (within [`POLL`]).
    pub(crate) fn start(store: Box<dyn Store>, key: String) -> Self {
        let reason = Arc::new(OnceLock::new());
        let stop = Arc::new(AtomicBool::new(false));
        let (found, stopped) = (Arc::clone(&reason), Arc::clone(&stop));
        let spawned = std::thread::Builder::new()
            .name("burn-ddp-watch".into())
            .stack_size(128 << 10)
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    // One round trip: the store's host may leave right after.
                    match store.get(&key, POLL) {
                        Ok(value) => {
                            let _ = found.set(String::from_utf8_lossy(&value).into_owned());
                            return;
                        }
                        Err(err) if err.is_timeout() => continue,
                        Err(_) => return, // the store is gone: so is the job
                    }
                }
            });
        if let Err(err) = spawned {
            log::warn!("cannot start the store watch ({err}); late duplicate ranks go unnoticed");
        }
        Self { reason, stop }
    }

    /// The key's value, once it has been set.
    pub(crate) fn reason(&self) -> Option<&str> {
        self.reason.get().map(String::as_str)
    }
}

impl Drop for KeyWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// How often a [`CountWatch`] reads its counters.
const COUNT_POLL: Duration = Duration::from_millis(250);

/// Watches two counters of the store on a thread of its own (over a
/// connection of its own): whether `asked` has run ahead of `answered` (a
/// replacement asked to join and nobody admitted it yet). Off the critical
/// path: a step never waits for it.
pub(crate) struct CountWatch {
    ahead: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl CountWatch {
    /// Starts watching; the thread ends when the store goes away or the
    /// watch is dropped (within [`COUNT_POLL`]).
    pub(crate) fn start(store: Box<dyn Store>, asked: String, answered: String) -> Self {
        let ahead = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen, stopped) = (Arc::clone(&ahead), Arc::clone(&stop));
        let spawned = std::thread::Builder::new()
            .name("burn-ddp-joiners".into())
            .stack_size(128 << 10)
            .spawn(move || {
                while !stopped.load(Ordering::Relaxed) {
                    let counts = store
                        .add(&asked, 0)
                        .and_then(|a| Ok((a, store.add(&answered, 0)?)));
                    match counts {
                        Ok((asked, answered)) => seen.store(asked > answered, Ordering::Relaxed),
                        Err(_) => return, // the store is gone: so is the job
                    }
                    std::thread::sleep(COUNT_POLL);
                }
            });
        if let Err(err) = spawned {
            log::warn!("cannot start the watch for replacements ({err}); none will be admitted");
        }
        Self { ahead, stop }
    }

    /// Ends the thread (within [`COUNT_POLL`]).
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Whether `asked` was ahead of `answered` when last read.
    pub(crate) fn ahead(&self) -> bool {
        self.ahead.load(Ordering::Relaxed)
    }
}

impl Drop for CountWatch {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;
    use std::time::Instant;

    #[test]
    fn reports_the_value_once_the_key_is_set() {
        let store = Arc::new(MemoryStore::new());
        struct Shared(Arc<MemoryStore>);
        impl Store for Shared {
            fn set(&self, k: &str, v: &[u8]) -> burn_ddp_rendezvous::Result<()> {
                self.0.set(k, v)
            }
            fn get(&self, k: &str, t: Duration) -> burn_ddp_rendezvous::Result<Vec<u8>> {
                self.0.get(k, t)
            }
            fn add(&self, k: &str, d: i64) -> burn_ddp_rendezvous::Result<i64> {
                self.0.add(k, d)
            }
            fn wait(&self, k: &[&str], t: Duration) -> burn_ddp_rendezvous::Result<()> {
                self.0.wait(k, t)
            }
            fn check(&self, k: &[&str]) -> burn_ddp_rendezvous::Result<bool> {
                self.0.check(k)
            }
        }
        let watch = KeyWatch::start(Box::new(Shared(Arc::clone(&store))), "bad".into());
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(watch.reason(), None);
        store.set("bad", b"rank 1 twice").unwrap();
        let deadline = Instant::now() + Duration::from_secs(3);
        while watch.reason().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(watch.reason(), Some("rank 1 twice"));
    }
}
