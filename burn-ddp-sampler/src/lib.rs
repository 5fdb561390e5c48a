//! PyTorch's `DistributedSampler`: which dataset indices each rank visits.
//!
//! Each rank trains on its own slice of the data, reshuffled every epoch, in
//! exactly the order PyTorch would produce for the same seed and epoch (its CPU
//! generator and `randperm` are reproduced here), so a job moved from PyTorch
//! sees the same batches.
//!
//! The crate takes rank and world size as plain numbers and depends on no
//! framework: the index math (PyTorch's permutation, padding, rank slicing,
//! the MT19937) lives here once, and each burn-ddp front-end wraps it in its
//! Burn version's `Dataset` (`burn_ddp::data::DistributedDataset`).

#![deny(missing_docs)]

mod batch;
#[cfg(feature = "group")]
mod group;
mod mt19937;
mod sampler;
mod shard;

pub use batch::{split_global_batch, BatchSplitError};
#[cfg(feature = "group")]
pub use group::{batch_size_per_rank, distributed_sampler, evaluation_sampler};
pub use mt19937::{randperm, Mt19937};
pub use sampler::{DistributedSampler, SamplerError};
pub use shard::{EpochHandle, ShardIndices};
