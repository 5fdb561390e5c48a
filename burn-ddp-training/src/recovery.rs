//! Going on after a rank is gone, the part a training loop needs beyond the
//! group's next generation (`ProcessGroup::reform`): whether the launcher
//! lets the others go on, and a check that the survivors stand at the same
//! step before they do.

use burn_ddp_comm::{CommError, ProcessGroup, Result};

pub use burn_ddp_comm::ON_FAILURE_VAR;

/// Whether the launcher lets the workers go on without one that failed
/// (`burn-ddp-run --on-failure continue`); otherwise it stops them all.
pub fn goes_on_after_failure() -> bool {
    std::env::var(ON_FAILURE_VAR).is_ok_and(|v| v == "continue")
}

/// Every rank of `group` (the survivors' new generation) has applied
/// `steps` optimizer steps, or an error on every rank naming who stands
/// where. A collective can fail on some ranks after others completed it
/// (a rank died while the last pieces were on their way), and those ranks
/// took the step: going on from different states would make the replicas
/// differ. Collective.
pub fn agree_on_progress(group: &ProcessGroup, steps: u64) -> Result<()> {
    let all = group.all_gather(&[steps as i64])?;
    if all.iter().all(|&s| s == all[0]) {
        return Ok(());
    }
    let where_: Vec<String> = (all.iter().enumerate())
        .map(|(rank, s)| format!("rank {rank}: {s}"))
        .collect();
    Err(CommError::InvalidArgument {
        rank: group.rank(),
        message: format!(
            "the ranks still there stand at different steps after the failure ({}): the \
             failed collective completed on some of them; going on would make the replicas \
             differ, and healing a rank from a peer is not there yet: start again from the \
             last snapshot (burn-ddp-run --max-restarts N)",
            where_.join(", ")
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_groups::ranks;
    use std::thread;

    #[test]
    fn ranks_at_different_steps_are_refused_by_name() {
        let handles: Vec<_> = ranks(2)
            .into_iter()
            .map(|group| {
                thread::spawn(move || {
                    let same = agree_on_progress(&group, 7).is_ok();
                    let differ = agree_on_progress(&group, 7 + group.rank() as u64);
                    (same, differ.map_err(|e| e.to_string()))
                })
            })
            .collect();
        for handle in handles {
            let (same, differ) = handle.join().unwrap();
            assert!(same);
            let err = differ.unwrap_err();
            assert!(
                err.contains("rank 0: 7, rank 1: 8") && err.contains("--max-restarts"),
                "{err}"
            );
        }
    }
}
