//! PyTorch's `DistributedSampler` for Burn datasets.
//!
//! Each rank trains on its own slice of the data, reshuffled every epoch, in
//! exactly the order PyTorch would produce for the same seed and epoch (its CPU
//! generator and `randperm` are reproduced here), so a job moved from PyTorch
//! sees the same batches.
//!
//! The crate takes rank and world size as plain numbers; `burn-ddp` offers a
//! constructor from its process group.

#![deny(missing_docs)]

mod dataset;
mod mt19937;
mod sampler;

pub use dataset::{DistributedDataset, EpochHandle};
pub use mt19937::{randperm, Mt19937};
pub use sampler::{DistributedSampler, SamplerError};
