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
    /// that is the cause (a peer that saw it first has left).
    pub fn explain(&self, store: &dyn Store, err: CommError) -> CommError {
        let watched = self
            .duplicate_watch
            .as_ref()
            .and_then(KeyWatch::reason)
            .map(str::to_owned);
        // The watch may not have heard yet: ask the store once (this is the
        // error path; a store that is gone answers at once).
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
