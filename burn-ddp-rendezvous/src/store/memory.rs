//! An in-process store, for a world of one process (and for tests).

use super::Store;
use crate::error::{RendezvousError, Result, StoreErrorKind};
use std::collections::HashMap;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// A [`Store`] that lives in this process; threads may share it.
#[derive(Default)]
pub struct MemoryStore {
    values: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn wait_keys(&self, keys: &[&str], timeout: Duration) -> Result<HashMap<String, Vec<u8>>> {
        let deadline = Instant::now() + timeout;
        let mut values = self.values.lock().unwrap();
        loop {
            if keys.iter().all(|key| values.contains_key(*key)) {
                return Ok(values.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(RendezvousError::Timeout {
                    rank: None,
                    what: format!("store keys {keys:?}"),
                    after: timeout,
                });
            }
            values = self.changed.wait_timeout(values, deadline - now).unwrap().0;
        }
    }
}

impl Store for MemoryStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.values
            .lock()
            .unwrap()
            .insert(key.to_owned(), value.to_vec());
        self.changed.notify_all();
        Ok(())
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        Ok(self.wait_keys(&[key], timeout)?.remove(key).unwrap())
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut values = self.values.lock().unwrap();
        let current = match values.get(key) {
            Some(bytes) => std::str::from_utf8(bytes)
                .ok()
                .and_then(|text| text.parse::<i64>().ok())
                .ok_or_else(|| {
                    RendezvousError::store(
                        None,
                        StoreErrorKind::BadValue,
                        format!("add on key {key:?}, which does not hold an integer"),
                    )
                })?,
            None => 0,
        };
        let sum = current.checked_add(delta).ok_or_else(|| {
            RendezvousError::store(
                None,
                StoreErrorKind::BadValue,
                format!("add of {delta} to key {key:?} ({current}) overflows a 64-bit counter"),
            )
        })?;
        values.insert(key.to_owned(), sum.to_string().into_bytes());
        self.changed.notify_all();
        Ok(sum)
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.wait_keys(keys, timeout).map(|_| ())
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        let values = self.values.lock().unwrap();
        Ok(keys.iter().all(|key| values.contains_key(*key)))
    }
}
