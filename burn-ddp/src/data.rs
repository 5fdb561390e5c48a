//! Data sharding and metric helpers tied to the process group.

use crate::{CommError, ProcessGroup, ReduceOp, Result};
pub use burn_ddp_sampler::{DistributedDataset, DistributedSampler, EpochHandle, SamplerError};

fn sampler_error(group: &ProcessGroup, err: SamplerError) -> CommError {
    CommError::InvalidArgument {
        rank: group.rank(),
        message: err.to_string(),
    }
}

/// PyTorch's `DistributedSampler(dataset, num_replicas=world_size, rank=rank)`
/// for this group: shuffled with seed 0, padded. Adjust with its builder methods.
pub fn distributed_sampler(group: &ProcessGroup, dataset_len: usize) -> Result<DistributedSampler> {
    DistributedSampler::new(dataset_len, group.world_size(), group.rank())
        .map_err(|err| sampler_error(group, err))
}

/// An evaluation sampler for this group: every item exactly once over all ranks,
/// so counts summed with [`sum_over_ranks`] are exact.
pub fn evaluation_sampler(group: &ProcessGroup, dataset_len: usize) -> Result<DistributedSampler> {
    DistributedSampler::evaluation(dataset_len, group.world_size(), group.rank())
        .map_err(|err| sampler_error(group, err))
}

/// Sums integer counts (correct predictions, items seen) over all ranks.
pub fn sum_over_ranks<const N: usize>(group: &ProcessGroup, counts: [i64; N]) -> Result<[i64; N]> {
    let mut counts = counts;
    group.all_reduce(&mut counts, ReduceOp::Sum)?;
    Ok(counts)
}
