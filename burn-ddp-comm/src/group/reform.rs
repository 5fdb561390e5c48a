//! Going on without the ranks that are gone: after a collective failed
//! (a rank killed, stalled past the timeout or cut off), the ranks that are
//! still there agree through the store on who they are and form the next
//! generation of the group among themselves, in the same processes.
//!
//! The agreement is the store's, so there is only ever one: every survivor
//! records its arrival; the first to arrive (an atomic counter says which)
//! decides the members once every rank of the failed generation has either
//! arrived or is where its failure began (blamed by a peer, blaming nobody,
//! absent), or the wait is over; the others read its decision. A rank that
//! arrives after the decision is not a member: it is fenced, with an error
//! naming the generations, and nothing it sends reaches the new group (its
//! keys are the new generation's, which it never learns).

use super::join;
use super::{GroupInner, ProcessGroup};
use crate::env::StoreHost;
use crate::error::{CommError, Result};
use crate::store::Store;
use std::time::{Duration, Instant};

/// How long the deciding rank waits after every rank is accounted for, for
/// a survivor whose failure surfaced a moment later.
const SETTLE: Duration = Duration::from_millis(200);

/// How often the deciding rank looks at the arrivals.
const POLL: Duration = Duration::from_millis(20);

/// For the fault tests: set, the rank that decides who goes on kills
/// itself (SIGKILL) once it has said it decides.
#[doc(hidden)]
pub const CRASH_WHILE_DECIDING_VAR: &str = "BURN_DDP_TEST_CRASH_WHILE_DECIDING";

fn crash_while_deciding() {
    if std::env::var_os(CRASH_WHILE_DECIDING_VAR).is_some() {
        // SAFETY: signalling this process.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

impl ProcessGroup {
    /// The next generation of this group, among the ranks still there
    /// (PyTorch's elastic agents and TorchFT's quorums do the same between
    /// processes): call it on every surviving rank after a collective
    /// failed. Ranks keep their order (this rank's new rank is its place
    /// among the survivors); the group's settings, timeout and store stay.
    /// `wait` bounds how long the survivors wait for each other.
    ///
    /// Errors: a world of one; a store that died with its rank (rank 0
    /// hosts it unless a launcher does: run under `burn-ddp-run`, which
    /// hosts it, to go on without rank 0); this rank arriving after the
    /// others went on without it (fenced: it was too slow, or cut off).
    pub fn reform(&self, wait: Duration) -> Result<ProcessGroup> {
        let inner = &self.inner;
        let rank = inner.rank;
        let (Some(env), Some(keys)) = (inner.env.as_ref(), inner.failures.keys.as_ref()) else {
            return Err(CommError::InvalidArgument {
                rank,
                message: "a world of one has no peers to go on without".into(),
            });
        };
        let store = &*inner.store;
        let generation = inner.generation;
        let prefix = format!("{}reform/", keys.prefix());
        let on_store = |err: CommError| store_gone(err, rank, env.store_host, generation);
        let on_request = |err| on_store(CommError::from(err));
        store
            .set(&format!("{prefix}arrived/{rank}"), b"1")
            .map_err(on_request)?;
        let order = store
            .add(&format!("{prefix}order"), 1)
            .map_err(on_request)?;
        let members_key = format!("{prefix}members");
        let decider_key = format!("{prefix}decider");
        if order == 1 {
            // Named, so the others can say who did not decide if it dies too.
            store
                .set(&decider_key, rank.to_string().as_bytes())
                .map_err(on_request)?;
            crash_while_deciding();
            let members = decide(store, inner, &prefix, wait).map_err(on_store)?;
            let formed = inner.lineage.next_formed(store).map_err(on_store)?;
            let text: Vec<String> = members.iter().map(usize::to_string).collect();
            store
                .set(
                    &members_key,
                    format!("{formed}:{}", text.join(",")).as_bytes(),
                )
                .map_err(on_request)?;
        }
        let decided = match store.get(&members_key, wait + inner.timeout) {
            Ok(decided) => decided,
            Err(err) if err.is_timeout() => {
                let decider = store
                    .get(&decider_key, Duration::ZERO)
                    .map(|r| String::from_utf8_lossy(&r).into_owned())
                    .unwrap_or_else(|_| "?".into());
                return Err(CommError::Timeout {
                    rank: Some(rank),
                    what: format!(
                        "the decision on who goes on after generation {generation} failed \
                         (rank {decider} was deciding and may be gone too; start again from \
                         the newest snapshot: burn-ddp-run --max-restarts N)"
                    ),
                    peer: decider.parse().ok(),
                    after: wait + inner.timeout,
                });
            }
            Err(err) => return Err(on_request(err)),
        };
        let decided = String::from_utf8_lossy(&decided);
        let (formed, members) = decided.split_once(':').unwrap_or(("0", &decided));
        let formed: i64 = formed.parse().unwrap_or(0);
        let members: Vec<usize> = members.split(',').filter_map(|r| r.parse().ok()).collect();
        let Some(new_rank) = members.iter().position(|&r| r == rank) else {
            return Err(CommError::InvalidArgument {
                rank,
                message: format!(
                    "fenced: generation {} of the group failed and ranks {} went on without this \
                     rank as generation {}; it arrived too late (stalled past the timeout, or cut \
                     off) and cannot rejoin that generation: nothing it computed reaches it",
                    generation,
                    list(&members),
                    generation + 1
                ),
            });
        };
        let machines = join::machine_ids(store, env, keys)?;
        let here = &machines[rank];
        let mut next = env.clone();
        next.rank = new_rank;
        next.world_size = members.len();
        next.local_rank = members[..new_rank]
            .iter()
            .filter(|&&r| machines[r] == *here)
            .count();
        next.local_world_size = members.iter().filter(|&&r| machines[r] == *here).count();
        next.job_id = inner.lineage.job_id_of(formed);
        // Rank 0's store outlives its first group: the next one keeps it.
        let inherited = inner.store_server.lock().unwrap().take();
        if env.store_host == StoreHost::RankZero {
            next.store_host = StoreHost::Launcher;
        }
        log::warn!(
            "rank {rank}: generation {generation} failed; going on as rank {new_rank} of {} \
             (ranks {} of generation {generation})",
            members.len(),
            list(&members)
        );
        let lineage = Some(inner.lineage.clone());
        let group = ProcessGroup::start_generation(
            next,
            inner.settings,
            generation + 1,
            inherited,
            lineage,
        )?;
        inner.retire();
        Ok(group)
    }

    /// How many times this group has gone on without ranks that were gone.
    pub fn generation(&self) -> u64 {
        self.inner.generation
    }
}

/// The deciding rank: waits until every rank of the failed generation is
/// accounted for (arrived, or where the failure began), or `wait` is over,
/// then names the members (the arrived ranks, in order).
fn decide(
    store: &dyn Store,
    inner: &GroupInner,
    prefix: &str,
    wait: Duration,
) -> Result<Vec<usize>> {
    let keys = inner
        .failures
        .keys
        .as_ref()
        .expect("a group of several ranks");
    let world = inner.world_size;
    let deadline = Instant::now() + wait;
    let mut settled_at: Option<Instant> = None;
    loop {
        let mut arrived = Vec::new();
        for rank in 0..world {
            if store.check(&[&format!("{prefix}arrived/{rank}")])? {
                arrived.push(rank);
            }
        }
        let accounted = (0..world)
            .all(|rank| arrived.contains(&rank) || began_the_failure(store, keys, rank, world));
        let now = Instant::now();
        if arrived.len() == world || now >= deadline {
            return Ok(arrived);
        }
        if accounted {
            let since = *settled_at.get_or_insert(now);
            if now >= since + SETTLE {
                return Ok(arrived);
            }
        } else {
            settled_at = None;
        }
        std::thread::sleep(POLL);
    }
}

/// Whether `rank` is where a failure began: a peer gave up on it, and it
/// gave up on nobody (it died, or stalled without noticing anything).
fn began_the_failure(
    store: &dyn Store,
    keys: &crate::job::keys::GroupKeys,
    rank: usize,
    world: usize,
) -> bool {
    let blamed = (0..world).filter(|&peer| peer != rank).any(|peer| {
        store
            .get(&keys.blame(peer), Duration::ZERO)
            .ok()
            .and_then(|who| String::from_utf8_lossy(&who).parse::<usize>().ok())
            == Some(rank)
    });
    blamed && !store.check(&[&keys.blame(rank)]).unwrap_or(false)
}

impl GroupInner {
    /// A next generation replaced this one: its connections are of no more
    /// use, so they go now (a handle may keep the group itself alive, to be
    /// told why it cannot go on). The flag is set under the transport's
    /// lock, where collectives read it.
    pub(super) fn retire(&self) {
        use std::sync::atomic::Ordering;
        match self.transport.try_lock() {
            Ok(mut transport) => {
                self.superseded.store(true, Ordering::Relaxed);
                *transport = Box::new(crate::transport::SingleProcess);
            }
            Err(_) => self.superseded.store(true, Ordering::Relaxed),
        }
        if let Some(watch) = &self.admissions.watch {
            watch.stop();
        }
    }
}

fn list(ranks: &[usize]) -> String {
    ranks
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why a collective of a group its survivors replaced is refused.
pub(super) fn superseded(rank: usize, generation: u64) -> CommError {
    CommError::InvalidArgument {
        rank,
        message: format!(
            "generation {generation} of the group was replaced by generation {} after a \
             failure: build what used it again over the new group (wrap the model again); a \
             sharded optimizer cannot be: the state a rank that is gone owned is lost, so \
             start again from the newest snapshot (burn-ddp-run --max-restarts N)",
            generation + 1
        ),
    }
}

/// A store request of the reform failed: where the store was hosted says
/// why it may be gone.
fn store_gone(err: CommError, rank: usize, host: StoreHost, generation: u64) -> CommError {
    match host {
        StoreHost::RankZero => CommError::InvalidArgument {
            rank,
            message: format!(
                "cannot go on after generation {generation} failed: the store ({err}) was \
                 hosted by rank 0, which may be the rank that is gone; launch with burn-ddp-run, \
                 which hosts the store outside the ranks, to go on without any rank"
            ),
        },
        _ => err,
    }
}
