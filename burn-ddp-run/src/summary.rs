//! The failure summary: the table of a failed round's workers and the root
//! cause, found by following the blames the workers left in the store.

use crate::worker::{describe, WorkerState};
use burn_ddp_rendezvous::job::keys::{follow_blames, JobKeys};
use burn_ddp_rendezvous::store::StoreServer;
use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

/// What the workers told the store about their failures: whom each blamed.
pub(crate) struct Blames<'a> {
    /// The store, when this machine hosts it.
    pub store: Option<&'a StoreServer>,
    /// The round's keys.
    pub keys: JobKeys,
}

impl Blames<'_> {
    /// Rank -> the peer its first failure pointed at, from the latest group.
    pub fn read(&self) -> HashMap<usize, usize> {
        let Some(store) = self.store else {
            return HashMap::new(); // another machine's launcher hosts the store
        };
        let mut latest: HashMap<usize, (u64, usize)> = HashMap::new();
        for (key, value) in store.entries(self.keys.prefix()) {
            let Some((generation, rank)) = self.keys.parse_blame(&key) else {
                continue;
            };
            let Ok(peer) = String::from_utf8_lossy(&value).parse::<usize>() else {
                continue;
            };
            let entry = latest.entry(rank).or_insert((generation, peer));
            if generation >= entry.0 {
                *entry = (generation, peer);
            }
        }
        latest.into_iter().map(|(r, (_, p))| (r, p)).collect()
    }
}

/// Where the blames lead from the first rank to fail (see [`follow_blames`]).
pub(crate) fn root_cause(first: usize, blames: &HashMap<usize, usize>) -> usize {
    *follow_blames(first, &[], |rank| blames.get(&rank).copied())
        .last()
        .unwrap()
}

/// The failure table (of round `round`, when the job restarts). `first`
/// indexes the first worker to fail; `root` is the global rank the failure
/// began at (the same, unless the first to fail was waiting for another
/// rank, as with a stalled one). Every worker has ended.
pub(crate) fn print_summary(
    workers: &[WorkerState],
    first: usize,
    root: usize,
    round: Option<u32>,
) {
    let first_rank = workers[first].rank;
    match round {
        Some(round) => eprintln!("burn-ddp-run: round {round} of the job failed"),
        None => eprintln!("burn-ddp-run: the job failed"),
    }
    eprintln!("  rank  local_rank  pid       ended after  result");
    for w in workers {
        let cause = match (w.rank == root, w.rank == first_rank) {
            (true, true) => "  <- first failure (root cause)",
            (true, false) => "  <- root cause (the rank the others waited for)",
            (false, true) => "  <- failed first, because of the root cause",
            (false, false) => "",
        };
        let (after, how) = w.exit.map_or((0.0, "ended".into()), |e| {
            (e.after.as_secs_f64(), describe(e.status))
        });
        eprintln!(
            "  {:<4}  {:<10}  {:<8}  {:>9.2}s  {how}{cause}",
            w.rank, w.local_rank, w.pid, after
        );
    }
    eprintln!("{}", root_cause_line(workers, first_rank, root, &clock()));
}

/// The summary's last line: the root cause, and where to look.
fn root_cause_line(workers: &[WorkerState], first_rank: usize, root: usize, clock: &str) -> String {
    let how = |w: &WorkerState| w.exit.map_or("ended".into(), |e| describe(e.status));
    match workers.iter().find(|w| w.rank == root) {
        Some(w) if root == first_rank => format!(
            "burn-ddp-run: root cause: rank {} (local rank {}, pid {}) {} at {clock}; \
             see its output above",
            w.rank,
            w.local_rank,
            w.pid,
            how(w)
        ),
        Some(w) => format!(
            "burn-ddp-run: root cause: rank {} (local rank {}, pid {}): rank {first_rank} \
             failed first at {clock} waiting for it, directly or through other ranks; it was \
             stalled or stopped, and in the end {}",
            w.rank,
            w.local_rank,
            w.pid,
            how(w)
        ),
        None => format!(
            "burn-ddp-run: root cause: rank {root}, on another machine: rank {first_rank} \
             failed first at {clock} waiting for it; see that machine's launcher"
        ),
    }
}

/// The time of day, UTC.
fn clock() -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "{:02}:{:02}:{:02} UTC",
        now / 3600 % 24,
        now / 60 % 60,
        now % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::Exit;
    use std::os::unix::process::ExitStatusExt;
    use std::process::ExitStatus;
    use std::time::{Duration, Instant};

    #[test]
    fn the_root_cause_is_where_the_blames_lead() {
        // Nobody blamed anyone: the first to fail is the cause.
        assert_eq!(root_cause(2, &HashMap::new()), 2);
        // A ring of 4 with rank 1 stalled: 2 gave up on 1, 3 on 2, 0 on 3.
        let ring: HashMap<usize, usize> = [(2, 1), (3, 2), (0, 3)].into();
        assert_eq!(root_cause(0, &ring), 1);
        assert_eq!(root_cause(3, &ring), 1);
        // Blames in a cycle end where the cycle closes, not in a loop.
        let cycle: HashMap<usize, usize> = [(0, 1), (1, 0)].into();
        assert_eq!(root_cause(0, &cycle), 1);
    }

    #[test]
    fn the_last_line_names_the_root_cause() {
        let started = Instant::now();
        let worker = |rank: usize, status: i32| WorkerState {
            rank,
            local_rank: rank,
            pid: 40 + rank as u32,
            started,
            exit: Some(Exit {
                status: ExitStatus::from_raw(status),
                after: Duration::from_secs(1),
            }),
        };
        let workers = [worker(0, 1 << 8), worker(1, libc::SIGKILL)];
        let line = root_cause_line(&workers, 0, 1, "12:00:00 UTC");
        assert!(
            line.starts_with("burn-ddp-run: root cause: rank 1 (local rank 1, pid 41): rank 0")
                && line.ends_with("in the end killed by SIGKILL"),
            "{line}"
        );
        let line = root_cause_line(&workers, 1, 1, "12:00:00 UTC");
        assert!(line.contains("rank 1 (local rank 1, pid 41) killed by SIGKILL at 12:00:00 UTC; see its output above"), "{line}");
        let line = root_cause_line(&workers, 0, 7, "12:00:00 UTC");
        assert!(
            line.contains("rank 7, on another machine: rank 0 failed first"),
            "{line}"
        );
    }
}
