//! The rendezvous store: a small key/value service every rank can reach.
//!
//! Ranks use it once, at start-up, to find each other (transport addresses,
//! later the NCCL unique id) and for barriers outside the data path. It is hosted
//! by the launcher when there is one, else by rank 0. Under torchrun, whose
//! agent hosts a c10d `TCPStore`, the ranks use [`C10dStoreClient`] instead.

pub mod c10d;
mod client;
mod connect;
mod memory;
mod protocol;
pub(crate) mod server;

pub use c10d::C10dStoreClient;
pub use client::TcpStoreClient;
pub use memory::MemoryStore;
pub use server::StoreServer;

use crate::error::Result;
use std::time::Duration;

/// What the process group needs from a rendezvous store.
///
/// Every blocking call takes a timeout; none waits forever.
pub trait Store: Send + Sync {
    /// Sets `key` to `value`, waking anyone waiting for it.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Returns the value of `key`, waiting up to `timeout` for it to be set.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;
    /// Adds `delta` to the integer at `key` (absent counts as 0) and returns the sum.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;
    /// Waits up to `timeout` until every key is set.
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()>;
    /// Whether every key is set, without waiting.
    fn check(&self, keys: &[&str]) -> Result<bool>;

    /// This store for a rank's error path: every request made through the
    /// view gives up when no reply has come `grace` after its own wait (a
    /// `get`'s or `wait`'s timeout; none for `set`, `add` and `check`),
    /// instead of the store's usual bound (the group's timeout and more).
    /// Telling the store about a failure then costs a rank at most `grace`
    /// on a store behind a dead link, once: a request given up leaves its
    /// connection out of step (its reply may still come), so the client
    /// stops using that connection and later requests fail at once.
    ///
    /// A store with nothing to wait for (in memory) is its own view.
    fn impatient(&self, grace: Duration) -> Box<dyn Store + '_> {
        let _ = grace;
        Box::new(AsItIs(self))
    }
}

/// A store's requests, unchanged (the default [`Store::impatient`] view).
struct AsItIs<'a, S: ?Sized>(&'a S);

impl<S: Store + ?Sized> Store for AsItIs<'_, S> {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.0.set(key, value)
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.0.get(key, timeout)
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.0.add(key, delta)
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.0.wait(keys, timeout)
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        self.0.check(keys)
    }

    fn impatient(&self, _grace: Duration) -> Box<dyn Store + '_> {
        Box::new(AsItIs(self.0))
    }
}

/// Blocks until `world_size` participants have called it with the same `name`.
///
/// Each name must be used once per participant (callers add a generation
/// number); the last one to arrive releases the others.
pub fn store_barrier(
    store: &dyn Store,
    name: &str,
    world_size: usize,
    timeout: Duration,
) -> Result<()> {
    let arrived = store.add(&format!("{name}/count"), 1)?;
    let done = format!("{name}/done");
    if arrived as usize >= world_size {
        store.set(&done, b"1")
    } else {
        store.wait(&[&done], timeout)
    }
}
