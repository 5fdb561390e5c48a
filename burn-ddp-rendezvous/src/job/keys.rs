//! The layout of a job's keys in the rendezvous store, in one place: the
//! process group writes them, the launcher reads the ones it needs (whom each
//! failed rank blamed), and neither spells a key itself.
//!
//! ```text
//! burn-ddp/<job id>/<attempt>/<generation>/claims/<rank>        claimants of a rank (atomic add)
//!                                          claimant/<rank>/<n>  who the n-th claimant was
//!                                          duplicate            why the group cannot stand
//!                                          join/<rank>          WORLD_SIZE as that rank saw it
//!                                          host/<rank>          that rank's machine
//!                                          blame/<rank>         the peer its first failure pointed at
//!                                          <transport>/...      a transport's own keys
//!                               launcher/failed              a round's first failure (several machines)
//!                               launcher/verdict             node 0's launcher: restart or stop
//!                               launcher/seen/<node>         that machine's launcher read the verdict
//!                               launcher/present/<node>      that machine's launcher is there (--nnodes MIN:MAX)
//!                               launcher/machines            node 0's list of the machines the job starts with
//!                               generations                  groups formed on the way (atomic add: each one's id)
//!                               joiners/count                replacements that asked to join (atomic add)
//!                               joiners/<n>/claim            admitted or withdrawn, whichever adds first
//!                               joiners/<n>/machine          the n-th one's machine
//!                               joiners/<n>/admitted         where it goes: generation, rank, world, local place
//!                               joiners/admitted             how many were admitted or passed over
//!                               joiners/closed               the job finished: nobody waits any more
//! ```
//!
//! The attempt counts the launcher's restarts of the job
//! (`TORCHELASTIC_RESTART_COUNT`), so workers started again never read the
//! keys of the round before; the generation counts the groups a process
//! started in this attempt, so a group made after `destroy()` never reads the
//! keys of the one before.

/// Keys of one attempt of a job, whatever its groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobKeys {
    prefix: String,
}

impl JobKeys {
    /// The keys of attempt `attempt` (0 first, then one per restart) of job
    /// `job_id` (a [valid](super::valid_job_id) id).
    pub fn new(job_id: &str, attempt: usize) -> Self {
        Self {
            prefix: format!("burn-ddp/{job_id}/{attempt}/"),
        }
    }

    /// Prefix of every key of the attempt.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The keys of the job's `generation`-th group.
    pub fn group(&self, generation: u64) -> GroupKeys {
        GroupKeys {
            prefix: format!("{}{generation}/", self.prefix),
        }
    }

    /// The first failure of this attempt a launcher saw on its machine, for
    /// the other machines' launchers (`--max-restarts` on several machines).
    pub fn launcher_failed(&self) -> String {
        format!("{}launcher/failed", self.prefix)
    }

    /// Node 0's launcher's verdict on this attempt after it failed
    /// (`restart`, `stop <code>`).
    pub fn launcher_verdict(&self) -> String {
        format!("{}launcher/verdict", self.prefix)
    }

    /// Set by machine `node`'s launcher once it has read the verdict.
    pub fn launcher_seen(&self, node: usize) -> String {
        format!("{}launcher/seen/{node}", self.prefix)
    }

    /// How many replacement workers asked to join the running job (an
    /// atomic counter: each one's number).
    pub fn joiners(&self) -> String {
        format!("{}joiners/count", self.prefix)
    }

    /// A counter of the generations formed after the first (by going on
    /// without ranks or admitting replacements): each one's number, unique
    /// in the job, so two decisions never share keys.
    pub fn generations(&self) -> String {
        format!("{}generations", self.prefix)
    }

    /// Settles the `nth` replacement: the decider admitting it and the
    /// replacement withdrawing both add 1, and the first to get 1 wins.
    pub fn joiner_claim(&self, nth: i64) -> String {
        format!("{}joiners/{nth}/claim", self.prefix)
    }

    /// The machine of the `nth` (from 1) replacement.
    pub fn joiner_machine(&self, nth: i64) -> String {
        format!("{}joiners/{nth}/machine", self.prefix)
    }

    /// Where the `nth` replacement was admitted (its generation and place).
    pub fn joiner_admitted(&self, nth: i64) -> String {
        format!("{}joiners/{nth}/admitted", self.prefix)
    }

    /// How many replacements were admitted (or passed over) so far.
    pub fn joiners_admitted(&self) -> String {
        format!("{}joiners/admitted", self.prefix)
    }

    /// Set once the job's training finished: a replacement still waiting
    /// has nothing left to join.
    pub fn joiners_closed(&self) -> String {
        format!("{}joiners/closed", self.prefix)
    }

    /// Set by machine `node`'s launcher when it is there to start the job
    /// (`--nnodes MIN:MAX`).
    pub fn launcher_present(&self, node: usize) -> String {
        format!("{}launcher/present/{node}", self.prefix)
    }

    /// Node 0's list of the machines the job starts with (`0,1,3`).
    pub fn launcher_machines(&self) -> String {
        format!("{}launcher/machines", self.prefix)
    }

    /// `Some((generation, rank))` when `key` is a blame key of this job.
    pub fn parse_blame(&self, key: &str) -> Option<(u64, usize)> {
        let mut parts = key.strip_prefix(&self.prefix)?.split('/');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(generation), Some(BLAME), Some(rank), None) => {
                Some((generation.parse().ok()?, rank.parse().ok()?))
            }
            _ => None,
        }
    }
}

const BLAME: &str = "blame";

/// Keys of one group of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupKeys {
    prefix: String,
}

impl GroupKeys {
    /// Keys under `prefix` (a group that is not part of a launched job: tests,
    /// a world of one).
    pub fn under(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    /// Prefix of every key of the group; transports put theirs under it.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// How many processes claimed `rank` (an atomic counter).
    pub fn claims(&self, rank: usize) -> String {
        format!("{}claims/{rank}", self.prefix)
    }

    /// Who the `nth` (from 1) claimant of `rank` was.
    pub fn claimant(&self, rank: usize, nth: i64) -> String {
        format!("{}claimant/{rank}/{nth}", self.prefix)
    }

    /// Why the group cannot stand (a rank claimed twice), once known.
    pub fn duplicate(&self) -> String {
        format!("{}duplicate", self.prefix)
    }

    /// `rank`'s announcement, holding the world size it was started with.
    pub fn join(&self, rank: usize) -> String {
        format!("{}join/{rank}", self.prefix)
    }

    /// The machine `rank` runs on.
    pub fn host(&self, rank: usize) -> String {
        format!("{}host/{rank}", self.prefix)
    }

    /// The peer `rank`'s first failure pointed at.
    pub fn blame(&self, rank: usize) -> String {
        format!("{}{BLAME}/{rank}", self.prefix)
    }
}

/// Follows "this rank gave up on that one" links from `start` to the rank
/// where the failure began: one that blamed nobody (it crashed, or stalled and
/// never reported), or the last before a rank already `seen` (a cycle, or the
/// rank doing the tracing). Returns the chain, `start` first.
pub fn follow_blames(
    start: usize,
    seen: &[usize],
    mut blamed_by: impl FnMut(usize) -> Option<usize>,
) -> Vec<usize> {
    let mut chain = vec![start];
    while let Some(next) = blamed_by(*chain.last().unwrap()) {
        if seen.contains(&next) || chain.contains(&next) {
            break;
        }
        chain.push(next);
    }
    chain
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn group_keys_live_under_the_job_and_generation() {
        let job = JobKeys::new("j1", 2);
        let keys = job.group(3);
        assert_eq!(keys.prefix(), "burn-ddp/j1/2/3/");
        assert_eq!(keys.claims(2), "burn-ddp/j1/2/3/claims/2");
        assert_eq!(keys.claimant(2, 1), "burn-ddp/j1/2/3/claimant/2/1");
        assert_eq!(keys.duplicate(), "burn-ddp/j1/2/3/duplicate");
        assert_eq!(keys.join(0), "burn-ddp/j1/2/3/join/0");
        assert_eq!(keys.host(1), "burn-ddp/j1/2/3/host/1");
        assert_eq!(job.parse_blame(&keys.blame(5)), Some((3, 5)));
    }

    #[test]
    fn only_this_attempts_blame_keys_parse() {
        let job = JobKeys::new("j1", 0);
        assert_eq!(
            job.parse_blame(&JobKeys::new("j2", 0).group(0).blame(1)),
            None
        );
        // The round before or after a restart is another attempt.
        assert_eq!(
            job.parse_blame(&JobKeys::new("j1", 1).group(0).blame(1)),
            None
        );
        assert_eq!(
            JobKeys::new("j1", 1).parse_blame(&job.group(0).blame(1)),
            None
        );
        assert_eq!(job.parse_blame(&job.group(0).join(1)), None);
        assert_eq!(job.parse_blame("burn-ddp/j1/0/0/blame/1/extra"), None);
        assert_eq!(job.parse_blame("burn-ddp/j1/0/x/blame/1"), None);
    }

    #[test]
    fn blames_lead_to_the_root_and_stop_at_cycles_and_the_tracer() {
        let follow = |start, seen: &[usize], links: &[(usize, usize)]| {
            let links: HashMap<usize, usize> = links.iter().copied().collect();
            follow_blames(start, seen, |r| links.get(&r).copied())
        };
        assert_eq!(follow(2, &[], &[]), [2]);
        // A ring of 4 with rank 1 stalled: 2 gave up on 1, 3 on 2, 0 on 3.
        let ring = [(2, 1), (3, 2), (0, 3)];
        assert_eq!(follow(0, &[], &ring), [0, 3, 2, 1]);
        // Rank 0 tracing from its peer 3 never walks back to itself.
        assert_eq!(follow(3, &[0], &[(3, 2), (2, 0)]), [3, 2]);
        assert_eq!(follow(0, &[], &[(0, 1), (1, 0)]), [0, 1]);
    }
}
