//! Forming a group through the store: reach it (or host it), claim this rank,
//! announce it, wait for every other rank, and learn where each runs.

use super::watch::KeyWatch;
use crate::env::{machine_id, LaunchEnv, StoreHost};
use crate::error::{CommError, Result, StoreErrorKind};
use crate::job::keys::{GroupKeys, JobKeys};
use crate::store::{C10dStoreClient, Store, StoreServer, TcpStoreClient};
use burn_ddp_rendezvous::RendezvousError;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Groups started so far in this process, per job, attempt and rank: the generation in
/// store keys, so a group started after `destroy()` never reads the keys of the
/// one before (every rank starts and destroys its groups in the same order).
/// Per rank, so ranks run as threads of one process (tests) count alike.
static GROUPS_STARTED: Mutex<BTreeMap<(String, usize, usize), u64>> = Mutex::new(BTreeMap::new());

/// The keys of the next group this rank starts in this attempt of its job.
pub(super) fn next_group_keys(env: &LaunchEnv) -> GroupKeys {
    let mut started = GROUPS_STARTED.lock().unwrap_or_else(|e| e.into_inner());
    let count = started
        .entry((env.job_id.clone(), env.restart_count, env.rank))
        .or_insert(0);
    *count += 1;
    JobKeys::new(&env.job_id, env.restart_count).group(*count - 1)
}

/// Starts the store on rank 0 at the master address.
pub(super) fn host_store(host: &str, env: &LaunchEnv) -> Result<StoreServer> {
    StoreServer::bind_master(host, env.master_port, env.job_token.clone()).map_err(
        |err| match err {
            RendezvousError::Store {
                kind,
                message,
                source,
                ..
            } => CommError::Store {
                rank: Some(0),
                kind,
                message,
                source,
            },
            other => other.into(),
        },
    )
}

/// Reaches the store at the master address: our own protocol, or c10d's when
/// torchrun's agent hosts it. Also returns the local interface that reaches it,
/// which is the one peers can reach us on.
pub(super) fn connect_store(host: &str, env: &LaunchEnv) -> Result<(Box<dyn Store>, IpAddr)> {
    let rank = Some(env.rank);
    if env.store_host == StoreHost::TorchrunAgent {
        let client = C10dStoreClient::connect(host, env.master_port, rank, env.timeout)
            .map_err(|err| torchrun_context(err.into(), env))?
            // PyTorch's own workers keep their keys under the same prefix.
            .namespaced(format!("/worker/attempt_{}", env.restart_count));
        let ip = client.local_ip()?;
        return Ok((Box::new(client), ip));
    }
    let client = TcpStoreClient::connect_with_token(
        host,
        env.master_port,
        rank,
        env.timeout,
        env.job_token.as_ref(),
    )?;
    let ip = client.local_ip()?;
    Ok((Box::new(client), ip))
}

/// Says which torchrun job could not be reached, and what usually causes it.
fn torchrun_context(err: CommError, env: &LaunchEnv) -> CommError {
    match err {
        CommError::Store {
            rank,
            kind,
            message,
            source,
        } => CommError::Store {
            rank,
            kind,
            message: format!(
                "{message}; started by torchrun (run id {}) with \
                 TORCHELASTIC_USE_AGENT_STORE=True, so its agent's c10d TCPStore should \
                 be listening there",
                env.run_id.as_deref().unwrap_or("unknown")
            ),
            source,
        },
        other => other,
    }
}

/// Reaches the store and joins the group. Where rank 0 hosts the store, a rank
/// starting a new group right after `destroy()` can reach rank 0's previous
/// store in its last moments, and lose it during the join: it then reconnects
/// (to the new one) until the timeout.
pub(super) fn connect_and_join(
    host: &str,
    env: &LaunchEnv,
    keys: &GroupKeys,
) -> Result<(Box<dyn Store>, IpAddr)> {
    let deadline = Instant::now() + env.timeout;
    let mut attempt = env.clone();
    loop {
        let env = &attempt;
        let joined = connect_store(host, env).and_then(|(store, local_ip)| {
            log::debug!(
                "rank {}: connected to the {:?} store at {host}:{} from {local_ip}",
                env.rank,
                env.store_host,
                env.master_port
            );
            join(&*store, env, keys).map(|()| (store, local_ip))
        });
        match joined {
            Ok(joined) => return Ok(joined),
            // Only a store that was reached and then went away: one that cannot
            // be reached at all has already been waited for.
            Err(err)
                if env.store_host == StoreHost::RankZero
                    && env.rank != 0
                    && err.store_kind() == Some(StoreErrorKind::ConnectionLost)
                    && Instant::now() < deadline =>
            {
                log::debug!(
                    "rank {}: the store went away while joining ({err}); reconnecting",
                    env.rank
                );
                std::thread::sleep(Duration::from_millis(100));
                // The next attempt gets what is left of the timeout, not all of it.
                attempt.timeout = deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_secs(1));
            }
            Err(err) => return Err(err),
        }
    }
}

/// Every rank's machine ([`machine_id`]), by rank, exchanged through the store.
pub(super) fn machine_ids(
    store: &dyn Store,
    env: &LaunchEnv,
    keys: &GroupKeys,
) -> Result<Vec<String>> {
    store.set(&keys.host(env.rank), machine_id().as_bytes())?;
    (0..env.world_size)
        .map(|rank| {
            store
                .get(&keys.host(rank), env.timeout)
                .map(|id| String::from_utf8_lossy(&id).into_owned())
                .map_err(CommError::from)
        })
        .collect()
}

/// How this process describes itself when two claim one rank.
fn claimant() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    format!("pid {} on {}", std::process::id(), host.trim())
}

/// Claims this rank; a second claimant fails at once and tells every rank
/// through the store, so a RANK given to two processes never trains.
fn claim_rank(store: &dyn Store, env: &LaunchEnv, keys: &GroupKeys, me: &str) -> Result<()> {
    let claims = store.add(&keys.claims(env.rank), 1)?;
    store.set(&keys.claimant(env.rank, claims), me.as_bytes())?;
    if claims == 1 {
        return Ok(());
    }
    // The first claimant wrote its name right after its add.
    let first = store
        .get(&keys.claimant(env.rank, 1), env.timeout)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_else(|_| "another process".into());
    if first == me {
        return Ok(()); // our own claim, from before a reconnection
    }
    let message = format!(
        "rank {} was claimed by two processes: {first} (first) and {me}; give every process \
         its own RANK, 0 to {} (check the launcher's --node-rank on each machine)",
        env.rank,
        env.world_size - 1
    );
    store.set(&keys.duplicate(), message.as_bytes())?;
    Err(CommError::Mismatch {
        rank: env.rank,
        message,
    })
}

/// A second connection to our own store that watches for a late duplicate
/// rank. torchrun's agent assigns ranks itself, so its store is not watched.
pub(super) fn watch_for_duplicates(
    host: &str,
    env: &LaunchEnv,
    keys: &GroupKeys,
) -> Option<KeyWatch> {
    if env.store_host == StoreHost::TorchrunAgent {
        return None;
    }
    let client = TcpStoreClient::connect_with_token(
        host,
        env.master_port,
        Some(env.rank),
        env.timeout,
        env.job_token.as_ref(),
    );
    match client {
        Ok(client) => Some(KeyWatch::start(Box::new(client), keys.duplicate())),
        Err(err) => {
            log::warn!("rank {}: cannot watch for duplicate ranks: {err}", env.rank);
            None
        }
    }
}

/// The error every rank reports when a rank was claimed twice.
pub(super) fn duplicate_error(store: &dyn Store, env: &LaunchEnv, keys: &GroupKeys) -> CommError {
    let message = store
        .get(&keys.duplicate(), env.timeout)
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_else(|err| format!("a rank was claimed twice ({err})"));
    CommError::Mismatch {
        rank: env.rank,
        message: format!("cannot form the group: {message}"),
    }
}

/// The machines (launcher node ranks) whose ranks are all among `missing`,
/// as " (all of node rank [1])", when the launcher says how ranks map to
/// machines (a node rank, and the same number of ranks on every machine).
fn missing_machines(env: &LaunchEnv, missing: &[usize]) -> String {
    let per_node = env.local_world_size;
    if env.node_rank.is_none() || per_node == 0 || !env.world_size.is_multiple_of(per_node) {
        return String::new();
    }
    let mut nodes: Vec<usize> = missing.iter().map(|r| r / per_node).collect();
    nodes.dedup();
    nodes.retain(|node| (node * per_node..(node + 1) * per_node).all(|r| missing.contains(&r)));
    if nodes.is_empty() {
        String::new()
    } else {
        format!(" (all of node rank {nodes:?}: did its machine start?)")
    }
}

/// How often a rank waiting for the others looks for a duplicate claim.
const DUPLICATE_POLL: Duration = Duration::from_millis(250);

/// Waits until `key` (a rank's join) is set, or `deadline`; a rank claimed
/// twice meanwhile ends the wait at once with the duplicate's error, so the
/// ranks of a world that can no longer form do not wait out the timeout and
/// then blame a rank that is merely absent.
fn wait_for_join(
    store: &dyn Store,
    env: &LaunchEnv,
    keys: &GroupKeys,
    key: &str,
    deadline: Instant,
) -> Result<()> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match store.wait(&[key], left.min(DUPLICATE_POLL)) {
            Err(err) if err.is_timeout() && !left.is_zero() => {
                if matches!(store.check(&[&keys.duplicate()]), Ok(true)) {
                    if env.rank == 0 && env.store_host == StoreHost::RankZero {
                        // The store goes with this process: leave the other
                        // waiting ranks a poll or two to read why.
                        std::thread::sleep(2 * DUPLICATE_POLL);
                    }
                    return Err(duplicate_error(store, env, keys));
                }
                if left <= DUPLICATE_POLL {
                    return Err(err.into());
                }
            }
            done => return done.map_err(CommError::from),
        }
    }
}

/// Whether `err` is rank 0's store closing while more than a quarter of our
/// wait is left. Every rank waits as long, so a rank 0 that gave up on a
/// missing rank closes its store near our own deadline, not this early.
fn store_went_away_early(err: &CommError, env: &LaunchEnv, deadline: Instant) -> bool {
    env.store_host == StoreHost::RankZero
        && env.rank != 0
        && err.store_kind() == Some(StoreErrorKind::ConnectionLost)
        && deadline.saturating_duration_since(Instant::now()) > env.timeout / 4
}

/// Announces this rank and waits for all the others, naming any that never come.
fn join(store: &dyn Store, env: &LaunchEnv, keys: &GroupKeys) -> Result<()> {
    claim_rank(store, env, keys, &claimant())?;
    store.set(&keys.join(env.rank), env.world_size.to_string().as_bytes())?;
    let joins: Vec<String> = (0..env.world_size).map(|rank| keys.join(rank)).collect();
    // Wait key by key: the first that times out names a missing rank even if the
    // store's host gives up at the same moment and takes the store with it.
    let deadline = Instant::now() + env.timeout;
    for (first_missing, key) in joins.iter().enumerate() {
        let cause = match wait_for_join(store, env, keys, key, deadline) {
            Ok(()) => continue,
            Err(err) if err.is_timeout() => String::new(),
            // Lost long before our deadline: not a host that gave up waiting
            // too, but rank 0's store of the group before this one, reached in
            // its last moments; the caller reconnects to the new one.
            Err(err) if store_went_away_early(&err, env, deadline) => return Err(err),
            // The store's host gave up first and exited: the key was still unset.
            Err(err @ CommError::Store { .. }) => format!("; then {err}"),
            Err(err) => return Err(err),
        };
        // A later rank counts as missing unless the store says it joined: when
        // the store's host timed out at the same moment and exited, nobody can
        // tell, and the ranks that had not joined by then are the likely cause.
        let mut missing = vec![first_missing];
        for (rank, later) in joins.iter().enumerate().skip(first_missing + 1) {
            if !matches!(store.check(&[later]), Ok(true)) {
                missing.push(rank);
            }
        }
        return Err(CommError::Timeout {
            rank: Some(env.rank),
            peer: Some(first_missing),
            what: format!(
                "rank(s) {missing:?}{} to join a group of {} at {}:{} (check that they \
                 started, and that every rank has the same WORLD_SIZE, MASTER_ADDR and \
                 MASTER_PORT){cause}",
                missing_machines(env, &missing),
                env.world_size,
                env.master_addr.as_deref().unwrap_or("?"),
                env.master_port
            ),
            after: env.timeout,
        });
    }
    for (rank, key) in joins.iter().enumerate() {
        let theirs = store.get(key, env.timeout)?;
        if theirs != env.world_size.to_string().as_bytes() {
            return Err(CommError::Mismatch {
                rank: env.rank,
                message: format!(
                    "rank {rank} joined with WORLD_SIZE={}, this rank has {}; start every \
                     rank with the same WORLD_SIZE",
                    String::from_utf8_lossy(&theirs),
                    env.world_size
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;
    use std::sync::Arc;

    fn env(rank: usize, world_size: usize, timeout_ms: u64) -> LaunchEnv {
        let mut env = LaunchEnv::single_process(Duration::from_millis(timeout_ms));
        env.rank = rank;
        env.world_size = world_size;
        env.local_world_size = world_size;
        env.master_addr = Some("127.0.0.1".into());
        env
    }

    #[test]
    fn every_rank_joins_and_learns_every_machine() {
        let store = Arc::new(MemoryStore::new());
        let keys = GroupKeys::under("t/");
        let ranks: Vec<_> = (0..3)
            .map(|rank| {
                let (store, keys) = (Arc::clone(&store), keys.clone());
                std::thread::spawn(move || {
                    let env = env(rank, 3, 5000);
                    join(&*store, &env, &keys).unwrap();
                    machine_ids(&*store, &env, &keys).unwrap()
                })
            })
            .collect();
        for rank in ranks {
            let ids = rank.join().unwrap();
            assert_eq!(ids, vec![machine_id(); 3]);
        }
    }

    #[test]
    fn a_missing_rank_is_named_with_its_machine() {
        let store = MemoryStore::new();
        let keys = GroupKeys::under("t/");
        let mut env = env(0, 4, 200);
        env.local_world_size = 2;
        env.node_rank = Some(0);
        store.set(&keys.join(1), b"4").unwrap();
        let err = join(&store, &env, &keys).unwrap_err();
        assert_eq!(err.blamed_peer(), Some(2));
        let text = err.to_string();
        assert!(
            text.contains("rank(s) [2, 3]") && text.contains("all of node rank [1]"),
            "{text}"
        );
    }

    #[test]
    fn another_world_size_is_a_mismatch_naming_both() {
        let store = MemoryStore::new();
        let keys = GroupKeys::under("t/");
        store.set(&keys.join(1), b"3").unwrap();
        let err = join(&store, &env(0, 2, 1000), &keys)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("rank 1 joined with WORLD_SIZE=3, this rank has 2"),
            "{err}"
        );
    }

    #[test]
    fn a_second_claimant_fails_and_leaves_the_reason_for_everyone() {
        let store = MemoryStore::new();
        let keys = GroupKeys::under("t/");
        let env = env(1, 2, 1000);
        claim_rank(&store, &env, &keys, "pid 1 on a").unwrap();
        // The same process claiming again (after reconnecting) is no duplicate.
        let again = MemoryStore::new();
        claim_rank(&again, &env, &keys, "pid 1 on a").unwrap();
        again.add(&keys.claims(1), 0).unwrap();
        let err = claim_rank(&store, &env, &keys, "pid 2 on b")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("pid 1 on a (first) and pid 2 on b") && err.contains("0 to 1"),
            "{err}"
        );
        let everyone = duplicate_error(&store, &env, &keys).to_string();
        assert!(
            everyone.contains("cannot form the group: rank 1 was claimed"),
            "{everyone}"
        );
    }

    #[test]
    fn a_duplicate_claim_ends_the_wait_for_a_missing_rank_at_once() {
        let store = MemoryStore::new();
        let keys = GroupKeys::under("t/");
        // Rank 1 was claimed twice; rank 2 never comes.
        store.set(&keys.join(1), b"3").unwrap();
        store
            .set(&keys.duplicate(), b"rank 1 was claimed by two processes")
            .unwrap();
        let started = Instant::now();
        let err = join(&store, &env(0, 3, 30_000), &keys).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("cannot form the group: rank 1 was claimed by two processes"),
            "{text}"
        );
        assert_eq!(err.blamed_peer(), None, "{text}");
    }

    #[test]
    fn generations_count_per_job_and_rank() {
        let mut env = env(0, 2, 1000);
        env.job_id = format!("gen-test-{}", std::process::id());
        let first = next_group_keys(&env);
        let second = next_group_keys(&env);
        env.rank = 1;
        let other_rank = next_group_keys(&env);
        assert_eq!(first.prefix(), format!("burn-ddp/{}/0/0/", env.job_id));
        assert_eq!(second.prefix(), format!("burn-ddp/{}/0/1/", env.job_id));
        assert_eq!(other_rank, first);
        // Workers started again by the launcher use the next attempt's keys.
        env.restart_count = 1;
        assert_eq!(
            next_group_keys(&env).prefix(),
            format!("burn-ddp/{}/1/0/", env.job_id)
        );
    }

    /// The race behind a flaky two-machine test: rank 1 starts its next group
    /// while rank 0's store of the group before still answers, joins it, and
    /// loses it a moment later; it must join rank 0's new store, not wait out
    /// the timeout on a store that is gone.
    #[test]
    fn a_rank_that_joined_the_previous_store_joins_the_next_one() {
        let old = StoreServer::bind_master("127.0.0.1", 0, None).unwrap();
        let port = old.addr().port();
        let keys = GroupKeys::under("t/");
        let mut rank1 = env(1, 2, 8000);
        rank1.master_port = port;
        let joining = {
            let keys = keys.clone();
            std::thread::spawn(move || {
                let started = Instant::now();
                connect_and_join("127.0.0.1", &rank1, &keys).map(|_| started.elapsed())
            })
        };
        // Rank 1 has announced itself in the old store; then it goes away.
        let probe =
            TcpStoreClient::connect("127.0.0.1", port, None, Duration::from_secs(5)).unwrap();
        probe
            .wait(&[&keys.join(1)], Duration::from_secs(5))
            .unwrap();
        drop(probe);
        drop(old);
        let new = StoreServer::bind_master("127.0.0.1", port, None).unwrap();
        let mut rank0 = env(0, 2, 8000);
        rank0.master_port = port;
        let (store, _) = connect_and_join("127.0.0.1", &rank0, &keys).unwrap();
        let took = joining.join().unwrap().unwrap();
        assert!(
            took < Duration::from_secs(4),
            "rank 1 joined after {took:?}"
        );
        assert!(store.check(&[&keys.join(1)]).unwrap());
        drop(new);
    }
}
