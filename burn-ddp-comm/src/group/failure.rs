//! What a failed collective is reported as: the reason the group cannot stand
//! (a rank claimed twice), or the rank where the failure began, found by
//! following what the ranks reported to the store.

use super::watch::KeyWatch;
use crate::error::CommError;
use crate::job::keys::{follow_blames, GroupKeys};
use crate::store::Store;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long a failing rank waits for a peer's report of whom it gave up on.
const ORIGIN_WAIT: Duration = Duration::from_millis(500);

/// How long a failing rank gives the store to answer each request of its
/// error path, beyond the request's own wait. A store behind a dead link
/// (its machine cut off) then costs the rank this once, not the group's
/// timeout and more per request: the first request given up gives the
/// connection up, and the rest fail at once.
pub(super) const ERROR_PATH_GRACE: Duration = Duration::from_secs(2);

/// How long rank 0, which may host the store, stays after learning that the
/// group cannot stand, so the others can still read why from its store.
const DUPLICATE_LINGER: Duration = Duration::from_millis(500);

/// One rank's view of its group's failures.
pub(super) struct Failures {
    pub rank: usize,
    /// The group's keys (`None` for a world of one, which has no peers).
    pub keys: Option<GroupKeys>,
    /// Watches for a rank claimed twice after the group formed.
    pub duplicate_watch: Option<KeyWatch>,
    /// Whether this rank has recorded whom its first failure points at.
    blamed: AtomicBool,
    /// Whether rank 0 has already lingered for the others (once is enough).
    lingered: AtomicBool,
}

impl Failures {
    pub fn new(rank: usize) -> Self {
        Self {
            rank,
            keys: None,
            duplicate_watch: None,
            blamed: AtomicBool::new(false),
            lingered: AtomicBool::new(false),
        }
    }

    /// On rank 0, once: a pause before failing for a duplicate, so that a
    /// store it hosts outlives the moment the others look there.
    fn linger_for_the_others(&self) {
        if self.rank == 0 && !self.lingered.swap(true, Ordering::SeqCst) {
            std::thread::sleep(DUPLICATE_LINGER);
        }
    }

    /// Why the group cannot go on, once the watch has heard.
    pub fn fatal(&self) -> Option<CommError> {
        let reason = self.duplicate_watch.as_ref().and_then(KeyWatch::reason)?;
        self.linger_for_the_others();
        Some(CommError::Mismatch {
            rank: self.rank,
            message: format!("the group cannot go on: {reason}"),
        })
    }

    /// A transport failure, unless the group was found unable to stand: then
    /// that is the cause (a peer that saw it first has left). Every request
    /// to the store here is bounded by [`ERROR_PATH_GRACE`], so a store that
    /// cannot be reached delays the error by that much at most.
    pub fn explain(&self, store: &dyn Store, err: CommError) -> CommError {
        let store = store.impatient(ERROR_PATH_GRACE);
        let store = &*store;
        let watched = self
            .duplicate_watch
            .as_ref()
            .and_then(KeyWatch::reason)
            .map(str::to_owned);
        // The watch may not have heard yet: ask the store once (this is the
        // error path: a store that is gone answers at once, one behind a dead
        // link within the grace).
        let reason = watched.or_else(|| {
            let key = self.keys.as_ref()?.duplicate();
            if !store.check(&[&key]).ok()? {
                return None;
            }
            let value = store.get(&key, Duration::from_secs(1)).ok()?;
            Some(String::from_utf8_lossy(&value).into_owned())
        });
        match reason {
            Some(reason) => {
                self.linger_for_the_others();
                CommError::Mismatch {
                    rank: self.rank,
                    message: format!("the group cannot go on: {reason} (then: {err})"),
                }
            }
            None => self.trace_origin(store, err),
        }
    }

    /// For this rank's first failure that points at a peer: follows what the
    /// ranks reported to the store to the rank where the failure began (in a
    /// ring, only the neighbours of a dead rank see it die; the others see a
    /// neighbour give up), names it in the error, and reports it in turn, so
    /// the launcher can name it too (a stalled rank never reports itself).
    fn trace_origin(&self, store: &dyn Store, err: CommError) -> CommError {
        let (Some(keys), Some(peer)) = (&self.keys, err.blamed_peer()) else {
            return err;
        };
        if self.blamed.swap(true, Ordering::SeqCst) {
            return err;
        }
        // Report the direct peer at once: ranks tracing through us must not
        // wait while we trace further.
        let _ = store.set(&keys.blame(self.rank), peer.to_string().as_bytes());
        let chain = follow_blames(peer, &[self.rank], |rank| {
            // A peer that gave up reports within moments of closing on us.
            let value = store.get(&keys.blame(rank), ORIGIN_WAIT).ok()?;
            String::from_utf8_lossy(&value).parse().ok()
        });
        let origin = *chain.last().unwrap();
        let _ = store.set(&keys.blame(self.rank), origin.to_string().as_bytes());
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
                source,
            } => CommError::Peer {
                rank,
                peer,
                op,
                detail: detail + &cause,
                source,
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn failures(rank: usize) -> Failures {
        let mut failures = Failures::new(rank);
        failures.keys = Some(GroupKeys::under("t/"));
        failures
    }

    #[test]
    fn the_origin_is_traced_named_and_reported_once() {
        let store = MemoryStore::new();
        let keys = GroupKeys::under("t/");
        // A ring of 4 with rank 1 stalled: 2 gave up on 1, 3 on 2.
        store.set(&keys.blame(2), b"1").unwrap();
        store.set(&keys.blame(3), b"2").unwrap();
        let zero = failures(0);
        let err = zero.explain(&store, CommError::peer(0, 3, "all_reduce", "closed"));
        let text = err.to_string();
        assert!(
            text.contains(
                "rank 3 had given up on rank 1, where the failure began \
                           (reported by rank(s) [3, 2])"
            ),
            "{text}"
        );
        assert_eq!(store.get(&keys.blame(0), ORIGIN_WAIT).unwrap(), b"1");
        // Later failures are returned as they are.
        let again = zero.explain(&store, CommError::peer(0, 3, "barrier", "closed"));
        assert_eq!(
            again.to_string(),
            "rank 0: barrier with rank 3 failed: closed"
        );
    }

    #[test]
    fn a_peer_that_blamed_nobody_is_the_origin() {
        let store = MemoryStore::new();
        let err = failures(1).explain(&store, CommError::peer(1, 2, "broadcast", "closed"));
        assert_eq!(
            err.to_string(),
            "rank 1: broadcast with rank 2 failed: closed"
        );
        let keys = GroupKeys::under("t/");
        assert_eq!(store.get(&keys.blame(1), ORIGIN_WAIT).unwrap(), b"2");
    }

    /// A store behind a cut link: its usual requests would each wait out
    /// their bound (the test fails if one is made); its impatient view's
    /// first request gives up after the grace and the rest fail at once,
    /// as the TCP clients' do (tested in burn-ddp-rendezvous).
    struct CutOff {
        given_up: AtomicBool,
    }

    impl CutOff {
        fn request<T>(&self, grace: Duration) -> burn_ddp_rendezvous::Result<T> {
            if !self.given_up.swap(true, Ordering::SeqCst) {
                std::thread::sleep(grace);
            }
            Err(burn_ddp_rendezvous::RendezvousError::store(
                Some(1),
                crate::StoreErrorKind::ConnectionLost,
                "no answer",
            ))
        }
    }

    impl Store for CutOff {
        fn set(&self, _: &str, _: &[u8]) -> burn_ddp_rendezvous::Result<()> {
            panic!("the error path used the store's usual bound")
        }
        fn get(&self, _: &str, _: Duration) -> burn_ddp_rendezvous::Result<Vec<u8>> {
            panic!("the error path used the store's usual bound")
        }
        fn add(&self, _: &str, _: i64) -> burn_ddp_rendezvous::Result<i64> {
            panic!("the error path used the store's usual bound")
        }
        fn wait(&self, _: &[&str], _: Duration) -> burn_ddp_rendezvous::Result<()> {
            panic!("the error path used the store's usual bound")
        }
        fn check(&self, _: &[&str]) -> burn_ddp_rendezvous::Result<bool> {
            panic!("the error path used the store's usual bound")
        }
        fn impatient(&self, grace: Duration) -> Box<dyn Store + '_> {
            Box::new(CutOffView { store: self, grace })
        }
    }

    struct CutOffView<'a> {
        store: &'a CutOff,
        grace: Duration,
    }

    impl Store for CutOffView<'_> {
        fn set(&self, _: &str, _: &[u8]) -> burn_ddp_rendezvous::Result<()> {
            self.store.request(self.grace)
        }
        fn get(&self, _: &str, wait: Duration) -> burn_ddp_rendezvous::Result<Vec<u8>> {
            self.store.request(wait + self.grace)
        }
        fn add(&self, _: &str, _: i64) -> burn_ddp_rendezvous::Result<i64> {
            self.store.request(self.grace)
        }
        fn wait(&self, _: &[&str], wait: Duration) -> burn_ddp_rendezvous::Result<()> {
            self.store.request(wait + self.grace)
        }
        fn check(&self, _: &[&str]) -> burn_ddp_rendezvous::Result<bool> {
            self.store.request(self.grace)
        }
    }

    #[test]
    fn a_store_behind_a_cut_link_delays_the_error_by_the_grace_at_most() {
        let store = CutOff {
            given_up: AtomicBool::new(false),
        };
        let started = std::time::Instant::now();
        let err = failures(1).explain(&store, CommError::peer(1, 0, "all_reduce", "timed out"));
        let took = started.elapsed();
        assert!(
            took >= ERROR_PATH_GRACE && took < ERROR_PATH_GRACE + Duration::from_secs(1),
            "{took:?}"
        );
        // The transport's error, as it was: nobody else's report could be read.
        assert_eq!(
            err.to_string(),
            "rank 1: all_reduce with rank 0 failed: timed out"
        );
    }

    #[test]
    fn a_duplicate_rank_is_the_cause_whatever_the_transport_says() {
        let store = MemoryStore::new();
        let keys = GroupKeys::under("t/");
        store
            .set(&keys.duplicate(), b"rank 1 was claimed twice")
            .unwrap();
        let err = failures(0)
            .explain(&store, CommError::peer(0, 1, "all_reduce", "closed"))
            .to_string();
        assert!(
            err.contains(
                "the group cannot go on: rank 1 was claimed twice (then: rank 0: \
                          all_reduce with rank 1 failed: closed)"
            ),
            "{err}"
        );
    }
}
