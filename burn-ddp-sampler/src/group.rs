//! Samplers for a process group's rank and world size, with errors in the
//! group's terms.

use crate::{split_global_batch, DistributedSampler};
use burn_ddp_comm::{CommError, ProcessGroup, Result};

fn for_rank(group: &ProcessGroup, err: impl std::fmt::Display) -> CommError {
    CommError::InvalidArgument {
        rank: group.rank(),
        message: err.to_string(),
    }
}

impl DistributedSampler {
    /// PyTorch's `DistributedSampler(dataset, num_replicas=world_size,
    /// rank=rank)` for `group`: shuffled with seed 0, padded. Adjust with its
    /// builder methods.
    pub fn for_group(group: &ProcessGroup, dataset_len: usize) -> Result<Self> {
        Self::new(dataset_len, group.world_size(), group.rank()).map_err(|e| for_rank(group, e))
    }

    /// An evaluation sampler for `group`: every item exactly once over all
    /// ranks, so counts summed over the ranks are exact.
    pub fn evaluation_for_group(group: &ProcessGroup, dataset_len: usize) -> Result<Self> {
        Self::evaluation(dataset_len, group.world_size(), group.rank())
            .map_err(|e| for_rank(group, e))
    }
}

/// PyTorch's `DistributedSampler(dataset, num_replicas=world_size, rank=rank)`
/// for `group`: shuffled with seed 0, padded. Adjust with its builder methods.
pub fn distributed_sampler(group: &ProcessGroup, dataset_len: usize) -> Result<DistributedSampler> {
    DistributedSampler::for_group(group, dataset_len)
}

/// An evaluation sampler for `group`: every item exactly once over all ranks,
/// so counts summed over the ranks (`sum_over_ranks`) are exact.
pub fn evaluation_sampler(group: &ProcessGroup, dataset_len: usize) -> Result<DistributedSampler> {
    DistributedSampler::evaluation_for_group(group, dataset_len)
}

/// This rank's loader batch size for a global batch of `global_batch` items per
/// optimizer step over `group` (`128` on 2 ranks: `64`). A global batch that is
/// not a multiple of the world size is an error naming the nearest ones, never
/// a silently smaller batch.
pub fn batch_size_per_rank(group: &ProcessGroup, global_batch: usize) -> Result<usize> {
    split_global_batch(global_batch, group.world_size()).map_err(|e| for_rank(group, e))
}
