//! Data sharding and metric helpers tied to the process group.

use burn::data::dataset::Dataset;
pub use burn_ddp_sampler::{
    batch_size_per_rank, distributed_sampler, evaluation_sampler, split_global_batch,
    BatchSplitError, DistributedSampler, EpochHandle, SamplerError, ShardIndices,
};
/// Loops over inputs of different lengths on different ranks (PyTorch's `Join`).
pub use burn_ddp_training::join::{Join, JoinStep};
pub use burn_ddp_training::sum::{sum_over_ranks, RankSum};
use std::marker::PhantomData;

/// This rank's shard of `D`, as a Burn [`Dataset`]: item `i` is item
/// `sampler.indices()[i]` of the wrapped dataset for the current epoch (the
/// index math is burn-ddp-sampler's; this is only the `Dataset` around it).
///
/// Build the data loader over it without `.shuffle(..)`: the order is the
/// sampler's, identical to PyTorch's DistributedSampler.
///
/// ```
/// use burn::data::dataset::{Dataset, InMemDataset};
/// use burn_ddp::data::{DistributedDataset, DistributedSampler};
///
/// let data = InMemDataset::new((0..10).collect::<Vec<i32>>());
/// let sampler = DistributedSampler::new(data.len(), 2, 1).unwrap();
/// let shard = DistributedDataset::new(data, sampler);
/// let epochs = shard.epoch_handle();
/// for epoch in 0..2 {
///     epochs.set_epoch(epoch); // before iterating, every epoch
///     let items: Vec<i32> = shard.iter().collect();
///     assert_eq!(items.len(), 5);
/// }
/// ```
pub struct DistributedDataset<D, I> {
    inner: D,
    shard: ShardIndices,
    _item: PhantomData<fn() -> I>,
}

impl<D: Dataset<I>, I> DistributedDataset<D, I> {
    /// Wraps `inner`, sharded by `sampler` (whose length must be `inner.len()`).
    ///
    /// # Panics
    /// If the sampler was made for a dataset of another length: that is a bug in
    /// the calling code, and indexing past the end would otherwise surface later.
    pub fn new(inner: D, sampler: DistributedSampler) -> Self {
        let shard = ShardIndices::new(sampler);
        shard.check_dataset_len(inner.len());
        Self {
            inner,
            shard,
            _item: PhantomData,
        }
    }

    /// A handle for advancing the epoch from the training loop.
    pub fn epoch_handle(&self) -> EpochHandle {
        self.shard.epoch_handle()
    }
}

impl<D: Dataset<I>, I> Dataset<I> for DistributedDataset<D, I> {
    fn get(&self, index: usize) -> Option<I> {
        self.inner.get(self.shard.source(index)?)
    }

    fn len(&self) -> usize {
        self.shard.len()
    }
}
