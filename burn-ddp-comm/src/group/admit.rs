//! Growing a running group back: a replacement worker (started by the
//! launcher in place of one that failed while the others went on,
//! [`JOINING_VAR`](crate::JOINING_VAR)) asks through the store to join; a
//! watch on each member sees it, off the critical path; the agreement that
//! starts every gradient synchronisation carries what each member saw, so
//! all learn it at the same step; at that step's end they form the next
//! generation with the replacements appended ([`ProcessGroup::admit`]),
//! and the program hands them its state over the new group.
//!
//! The decision is the store's, so there is only one: the first member to
//! arrive (an atomic counter) admits every replacement that named its
//! machine and tells each one its place; the others read the decision.

use super::join;
use super::watch::CountWatch;
use super::{GroupInner, ProcessGroup};
use crate::env::{machine_id, LaunchEnv, StoreHost};
use crate::error::{CommError, Result};
use crate::group::settings::Settings;
use crate::job::keys::JobKeys;
use crate::store::Store;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Set once this process joined a running job as a replacement: a later
/// group it starts from the environment is an ordinary one.
static JOINED_ONCE: AtomicBool = AtomicBool::new(false);

/// Whether [`ProcessGroup::from_env`] is to join a running job: a
/// replacement's first group.
pub(super) fn joins_running_job() -> bool {
    std::env::var(crate::JOINING_VAR).is_ok_and(|v| v == "1")
        && !JOINED_ONCE.swap(true, Ordering::Relaxed)
}

/// How long the deciding member waits for a replacement that took its
/// number to name its machine (it does so right after).
const MACHINE_WAIT: Duration = Duration::from_secs(2);

/// How often a replacement waiting for its admission looks whether the job
/// finished meanwhile.
const ADMISSION_POLL: Duration = Duration::from_millis(500);

/// Where a group's generations come from: the job's first keys (where
/// replacements ask to join) and its id (each generation's is derived from
/// it).
#[derive(Debug, Clone)]
pub(super) struct Lineage {
    pub job: JobKeys,
    pub job_id: String,
}

impl Lineage {
    /// The lineage of a group started from the launcher's environment.
    pub fn of(env: &LaunchEnv) -> Self {
        Self {
            job: JobKeys::new(&env.job_id, env.restart_count),
            job_id: env.job_id.clone(),
        }
    }

    /// The job id of the `formed`-th group formed on the way (a number
    /// from the job's [`JobKeys::generations`] counter, unique in the job):
    /// its store keys' own.
    pub fn job_id_of(&self, formed: i64) -> String {
        let mark = format!(".g{formed}");
        let kept: String = self.job_id.chars().take(64 - mark.len()).collect();
        format!("{kept}{mark}")
    }

    /// A number for the next group formed on the way, unique in the job.
    pub fn next_formed(&self, store: &dyn Store) -> Result<i64> {
        Ok(store.add(&self.job.generations(), 1)?)
    }
}

/// What a group knows of replacements asking to join.
#[derive(Default)]
pub(super) struct Admissions {
    /// Whether one asked, as this rank last read it (where the launcher
    /// lets the job go on after a failure; no watch otherwise).
    pub watch: Option<CountWatch>,
    /// Set once a synchronisation's agreement said a member saw one ask.
    due: AtomicBool,
    /// Admissions this generation decided so far: each decision has keys
    /// of its own (one that admitted nobody leaves the generation as it was).
    decided: AtomicU64,
    /// Whether this process joined the running job as a replacement.
    pub joined: AtomicBool,
}

/// Starts the watch for replacements, where the launcher may start them
/// (`burn-ddp-run --on-failure continue`, which hosts the store).
pub(super) fn watch_for_joiners(host: &str, env: &LaunchEnv, job: &JobKeys) -> Option<CountWatch> {
    let goes_on = std::env::var(crate::ON_FAILURE_VAR).is_ok_and(|v| v == "continue");
    if !goes_on || env.store_host != StoreHost::Launcher {
        return None;
    }
    match join::connect_store(host, env) {
        Ok((store, _)) => Some(CountWatch::start(
            store,
            job.joiners(),
            job.joiners_admitted(),
        )),
        Err(err) => {
            log::warn!("rank {}: cannot watch for replacements: {err}", env.rank);
            None
        }
    }
}

/// A last survivor (a generation of one, after the others were lost) under
/// a launcher that may start replacements: it keeps a connection to the
/// launcher's store and the watch, so it can admit them.
pub(super) fn keep_store_for_joiners(group: &mut GroupInner, env: &LaunchEnv, lineage: &Lineage) {
    let Some(host) = env.master_addr.as_deref() else {
        return;
    };
    let Some(watch) = watch_for_joiners(host, env, &lineage.job) else {
        log::debug!("rank {}: alone, and no replacement can come", env.rank);
        return;
    };
    log::debug!("rank {}: alone, watching for replacements", env.rank);
    match join::connect_store(host, env) {
        Ok((store, _)) => {
            group.store = store;
            group.failures.keys = Some(join::next_group_keys(env));
            group.env = Some(env.clone());
            group.admissions.watch = Some(watch);
        }
        Err(err) => log::warn!(
            "rank {}: cannot reach the store to admit replacements: {err}",
            env.rank
        ),
    }
}

impl ProcessGroup {
    /// Whether replacement workers wait to join: the same on every rank
    /// after each gradient synchronisation (its agreement carries what each
    /// rank's watch saw). At the end of that step, call
    /// [`admit`](Self::admit) on every rank, then hand the replacements the
    /// training state over the group it returns.
    pub fn joiners_waiting(&self) -> bool {
        // A rank alone needs no agreement (and averages nothing to carry it).
        let alone = self.inner.world_size == 1 && self.joiner_seen();
        alone || self.inner.admissions.due.load(Ordering::Relaxed)
    }

    /// A commit point for a loop that averages nothing through a reducer
    /// (whose synchronisations carry it otherwise): one small all-reduce
    /// after which [`joiners_waiting`](Self::joiners_waiting) says, the same
    /// on every rank, whether replacements wait to join. Collective.
    pub fn poll_joiners(&self) -> Result<bool> {
        let mut seen = [self.joiner_seen() as i32];
        self.all_reduce(&mut seen, crate::ReduceOp::Max)?;
        self.agree_joiners(seen[0] > 0);
        Ok(self.joiners_waiting())
    }

    /// Whether this process joined the running job as a replacement: it
    /// takes the training state from a peer instead of starting afresh.
    pub fn joined_running(&self) -> bool {
        self.inner.admissions.joined.load(Ordering::Relaxed)
    }

    /// Whether this rank's watch saw a replacement ask to join.
    pub(crate) fn joiner_seen(&self) -> bool {
        let watch = self.inner.admissions.watch.as_ref();
        watch.is_some_and(CountWatch::ahead)
    }

    /// What a synchronisation's agreement said: whether any rank saw one.
    pub(crate) fn agree_joiners(&self, any: bool) {
        if any {
            self.inner.admissions.due.store(true, Ordering::Relaxed);
        }
    }

    /// The next generation of this group with the replacement workers that
    /// asked to join appended (ranks `world_size()..`); the members keep
    /// their ranks. Call it on every rank at the same step boundary (when
    /// [`joiners_waiting`](Self::joiners_waiting) says so); `wait` bounds
    /// how long the members wait for the decision. With nobody left to
    /// admit (a replacement that died before naming its machine), this
    /// same group.
    pub fn admit(&self, wait: Duration) -> Result<ProcessGroup> {
        let inner = &self.inner;
        inner.admissions.due.store(false, Ordering::Relaxed);
        let (Some(env), Some(keys)) = (inner.env.as_ref(), inner.failures.keys.as_ref()) else {
            return Ok(self.clone()); // no store to be asked through
        };
        let store = &*inner.store;
        let decision = inner.admissions.decided.fetch_add(1, Ordering::Relaxed);
        let prefix = format!("{}admit/{decision}/", keys.prefix());
        let decision_key = format!("{prefix}decision");
        let next_generation = inner.generation + 1;
        let members = join::machine_ids(store, env, keys)?;
        if store.add(&format!("{prefix}order"), 1)? == 1 {
            let job = &inner.lineage.job;
            let joiners = take_joiners(store, job)?;
            let formed = inner.lineage.next_formed(store)?;
            let mut machines = members.clone();
            machines.extend(joiners.iter().map(|(_, machine)| machine.clone()));
            let job_id = inner.lineage.job_id_of(formed);
            for (i, (nth, _)) in joiners.iter().enumerate() {
                let rank = members.len() + i;
                let (local_rank, local_world) = place(&machines, rank);
                let admission = format!(
                    "{next_generation} {rank} {} {local_rank} {local_world} {job_id}",
                    machines.len()
                );
                store.set(&job.joiner_admitted(*nth), admission.as_bytes())?;
            }
            let mut decision = vec![formed.to_string()];
            decision.extend(joiners.into_iter().map(|(_, machine)| machine));
            store.set(&decision_key, decision.join("\n").as_bytes())?;
        }
        let decided = store.get(&decision_key, wait + inner.timeout)?;
        let decided = String::from_utf8_lossy(&decided);
        let mut lines = decided.lines();
        let formed: i64 = lines.next().and_then(|n| n.parse().ok()).unwrap_or(0);
        let mut machines = members;
        machines.extend(lines.filter(|l| !l.is_empty()).map(str::to_owned));
        if machines.len() == inner.world_size {
            return Ok(self.clone());
        }
        let mut next = env.clone();
        next.world_size = machines.len();
        (next.local_rank, next.local_world_size) = place(&machines, inner.rank);
        next.job_id = inner.lineage.job_id_of(formed);
        if env.store_host == StoreHost::RankZero {
            next.store_host = StoreHost::Launcher;
        }
        log::info!(
            "rank {}: admitting {} replacement(s) as ranks {}..{} (generation {next_generation})",
            inner.rank,
            machines.len() - inner.world_size,
            inner.world_size,
            machines.len() - 1
        );
        let lineage = Some(inner.lineage.clone());
        // The store rank 0 hosts stays with this generation unless the next
        // one stands: a replacement that died before joining leaves the
        // members where they were, after the timeout.
        let started =
            ProcessGroup::start_generation(next, inner.settings, next_generation, None, lineage);
        // Every member takes the next generation, or none does: a member
        // alone on it would be out of step with the others (the vote is on
        // this generation, which the members still share).
        let someone_failed = inner.vote(started.is_err())?;
        match started {
            Ok(group) if !someone_failed => {
                let server = inner.store_server.lock().unwrap().take();
                *group.inner.store_server.lock().unwrap() = server;
                inner.retire();
                Ok(group)
            }
            outcome => {
                let why = outcome
                    .err()
                    .map_or("on another member".into(), |e| e.to_string());
                log::warn!(
                    "rank {}: the replacement(s) did not join ({why}); going on as generation {} \
                     without them",
                    inner.rank,
                    inner.generation
                );
                Ok(self.clone())
            }
        }
    }

    /// A replacement worker: asks the running job to admit it and waits
    /// (bounded by the timeout) for its place, then joins that generation.
    /// `env`'s rank is the one it replaces; its place comes from the job.
    pub(super) fn join_running(env: LaunchEnv, settings: Settings) -> Result<Self> {
        let host = env.master_addr.clone().ok_or_else(|| {
            CommError::config(
                Some(env.rank),
                "MASTER_ADDR",
                "a replacement worker needs the running job's store: set MASTER_ADDR",
            )
        })?;
        let lineage = Lineage::of(&env);
        let job = &lineage.job;
        let (store, _) = join::connect_store(&host, &env)?;
        let nth = store.add(&job.joiners(), 1)?;
        store.set(&job.joiner_machine(nth), machine_id().as_bytes())?;
        log::info!(
            "rank {}: replacement, waiting to be admitted at the running job's next step",
            env.rank
        );
        let admission = wait_for_admission(&*store, &env, job, nth)?;
        drop(store);
        let mut parts = admission.split(' ');
        let mut number = || parts.next().and_then(|p| p.parse::<u64>().ok());
        let (Some(generation), Some(rank), Some(world), Some(local_rank), Some(local_world)) =
            (number(), number(), number(), number(), number())
        else {
            return Err(CommError::InvalidArgument {
                rank: env.rank,
                message: format!("a replacement's admission could not be read: {admission:?}"),
            });
        };
        let Some(job_id) = parts.next() else {
            return Err(CommError::InvalidArgument {
                rank: env.rank,
                message: format!("a replacement's admission names no job: {admission:?}"),
            });
        };
        let mut next = env;
        let replaced = next.rank;
        next.rank = rank as usize;
        next.world_size = world as usize;
        next.local_rank = local_rank as usize;
        next.local_world_size = local_world as usize;
        next.job_id = job_id.to_string();
        log::warn!(
            "replacement for rank {replaced}: joining as rank {rank} of {world} (generation \
             {generation})"
        );
        let group = Self::start_generation(next, settings, generation, None, Some(lineage))?;
        group.inner.admissions.joined.store(true, Ordering::Relaxed);
        Ok(group)
    }

    /// Says the job's training is over: a replacement still waiting to join
    /// leaves ([`CommError::NothingToJoin`]). Rank 0 does it when the group
    /// is destroyed (`destroy`, `destroy_process_group`).
    pub fn close_admissions(&self) {
        if self.inner.admissions.watch.is_some() && self.inner.rank == 0 {
            let _ = (self.inner.store).set(&self.inner.lineage.job.joiners_closed(), b"1");
        }
    }
}

/// Every replacement that asked since the last admission and named its
/// machine (its number and machine); the ones that asked are answered
/// either way, so none is waited for twice.
fn take_joiners(store: &dyn Store, job: &JobKeys) -> Result<Vec<(i64, String)>> {
    let asked = store.add(&job.joiners(), 0)?;
    let answered = store.add(&job.joiners_admitted(), 0)?;
    let mut joiners = Vec::new();
    for nth in answered + 1..=asked {
        // One that gave up waiting withdrew first: it is not coming.
        if store.add(&job.joiner_claim(nth), 1)? != 1 {
            continue;
        }
        match store.get(&job.joiner_machine(nth), MACHINE_WAIT) {
            Ok(machine) => joiners.push((nth, String::from_utf8_lossy(&machine).into_owned())),
            Err(err) if err.is_timeout() => {
                log::warn!("replacement {nth} never named its machine; passed over");
            }
            Err(err) => return Err(err.into()),
        }
    }
    store.add(&job.joiners_admitted(), asked - answered)?;
    Ok(joiners)
}

/// `rank`'s place on its machine: its rank among the ranks there, and how
/// many there are.
fn place(machines: &[String], rank: usize) -> (usize, usize) {
    let here = &machines[rank];
    let local_rank = machines[..rank].iter().filter(|m| *m == here).count();
    (local_rank, machines.iter().filter(|m| *m == here).count())
}

/// A replacement's wait for its place, ending early with
/// [`CommError::NothingToJoin`] once the job's training is over.
fn wait_for_admission(
    store: &dyn Store,
    env: &LaunchEnv,
    job: &JobKeys,
    nth: i64,
) -> Result<String> {
    let deadline = Instant::now() + env.timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match store.get(&job.joiner_admitted(nth), left.min(ADMISSION_POLL)) {
            Ok(admission) => return Ok(String::from_utf8_lossy(&admission).into_owned()),
            Err(err) if err.is_timeout() => {
                let closed = store.check(&[&job.joiners_closed()])?;
                let over = left <= ADMISSION_POLL;
                // Withdraw, unless a decider admitted it meanwhile: then its
                // place is on the way.
                if (closed || over) && store.add(&job.joiner_claim(nth), 1)? != 1 {
                    let admission = store.get(&job.joiner_admitted(nth), env.timeout)?;
                    return Ok(String::from_utf8_lossy(&admission).into_owned());
                }
                if closed {
                    return Err(CommError::NothingToJoin { rank: env.rank });
                }
                if over {
                    return Err(CommError::Timeout {
                        rank: Some(env.rank),
                        what: "the running job to admit this replacement at a step boundary \
                               (are its workers still training under --on-failure continue?)"
                            .into(),
                        peer: None,
                        after: env.timeout,
                    });
                }
            }
            Err(err) => return Err(err.into()),
        }
    }
}
