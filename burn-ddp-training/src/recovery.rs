//! Going on after a rank is gone, the part a training loop needs beyond the
//! group's next generation (`ProcessGroup::reform`, `ProcessGroup::admit`):
//! whether the launcher lets the others go on, a check that the survivors
//! stand at the same step before they do, and handing a replacement the
//! state it needs from a healthy peer (rank 0) over the group.

use burn_ddp_comm::{CommError, ProcessGroup, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;

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

/// Rank 0's `bytes` on every rank of `group` (the others' are ignored):
/// how a replacement gets what a healthy peer holds. Collective.
pub fn broadcast_bytes(group: &ProcessGroup, bytes: Vec<u8>) -> Result<Vec<u8>> {
    let mut len = [bytes.len() as i64];
    group.broadcast(&mut len, 0)?;
    let len = len[0] as usize;
    // Eight bytes a word: the group's collectives move numbers.
    let mut words: Vec<i64> = vec![0; len.div_ceil(8)];
    if group.rank() == 0 {
        for (word, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
            let mut eight = [0u8; 8];
            eight[..chunk.len()].copy_from_slice(chunk);
            *word = i64::from_le_bytes(eight);
        }
    }
    group.broadcast(&mut words, 0)?;
    let mut out: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    out.truncate(len);
    Ok(out)
}

/// Rank 0's `value` on every rank of `group` (a loop's position: epoch,
/// step, the sampler's place): what a replacement starts from. Collective.
pub fn share<T: Serialize + DeserializeOwned>(group: &ProcessGroup, value: &T) -> Result<T> {
    let rank = group.rank();
    let bytes = if rank == 0 {
        serde_json::to_vec(value).map_err(|e| CommError::InvalidArgument {
            rank,
            message: format!("the state to share cannot be written: {e}"),
        })?
    } else {
        Vec::new()
    };
    let bytes = broadcast_bytes(group, bytes)?;
    serde_json::from_slice(&bytes).map_err(|e| CommError::InvalidArgument {
        rank,
        message: format!("rank 0's shared state cannot be read here: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_groups::ranks;
    use std::thread;

    #[test]
    fn rank_zeros_bytes_and_values_reach_every_rank() {
        let handles: Vec<_> = ranks(3)
            .into_iter()
            .map(|group| {
                thread::spawn(move || {
                    let rank = group.rank();
                    // 13 bytes: not a whole number of words.
                    let mine: Vec<u8> = (0..13).map(|i| (i * 7 + rank * 50) as u8).collect();
                    let bytes = broadcast_bytes(&group, mine).unwrap();
                    let value = share(&group, &(rank, format!("rank {rank}"))).unwrap();
                    (bytes, value)
                })
            })
            .collect();
        let want: Vec<u8> = (0..13).map(|i| (i * 7) as u8).collect();
        for handle in handles {
            let (bytes, value) = handle.join().unwrap();
            assert_eq!(bytes, want);
            assert_eq!(value, (0, "rank 0".to_string()));
        }
    }

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
