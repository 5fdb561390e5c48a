//! Data sharding for Burn 0.22's `Dataset`: the index math is
//! burn-ddp-sampler's (PyTorch's `DistributedSampler`), this is only the
//! `Dataset` around it.

use burn::data::dataset::{Dataset, DatasetError};
pub use burn_ddp_sampler::{
    batch_size_per_rank, distributed_sampler, evaluation_sampler, split_global_batch,
    BatchSplitError, DistributedSampler, EpochHandle, SamplerError, ShardIndices,
};
/// Loops over inputs of different lengths on different ranks (PyTorch's `Join`).
pub use burn_ddp_training::join::{Join, JoinStep};
pub use burn_ddp_training::sum::{sum_over_ranks, RankSum};
use std::error::Error;
use std::marker::PhantomData;

/// This rank's shard of `D`, as a Burn [`Dataset`]: item `i` is item
/// `sampler.indices()[i]` of the wrapped dataset for the current epoch.
///
/// Build the data loader over it without `.shuffle(..)`: the order is the
/// sampler's, identical to PyTorch's DistributedSampler (seed 0 unless set
/// with [`DistributedSampler::seed`]).
///
/// ```
/// use burn::data::dataset::{Dataset, InMemDataset};
/// use burn_ddp_22::data::{DistributedDataset, DistributedSampler};
///
/// let data = InMemDataset::new((0..10).collect::<Vec<i32>>());
/// let sampler = DistributedSampler::new(data.len(), 2, 1).unwrap();
/// let shard = DistributedDataset::new(data, sampler);
/// let epochs = shard.epoch_handle();
/// for epoch in 0..2 {
///     epochs.set_epoch(epoch); // before iterating, every epoch
///     let items: Vec<i32> = shard.iter().map(Result::unwrap).collect();
///     assert_eq!(items.len(), 5);
/// }
/// ```
pub struct DistributedDataset<D, I, E = DatasetError> {
    inner: D,
    shard: ShardIndices,
    _item: PhantomData<fn() -> (I, E)>,
}

impl<D: Dataset<I, E>, I, E: Error + Send + Sync + 'static> DistributedDataset<D, I, E> {
    /// Wraps `inner`, sharded by `sampler` (whose length must be `inner.len()`).
    ///
    /// # Panics
    /// If the sampler was made for a dataset of another length (a bug in the
    /// calling code that would otherwise surface later, past the end).
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

impl<D: Dataset<I, E>, I, E: Error + Send + Sync + 'static> Dataset<I, E>
    for DistributedDataset<D, I, E>
{
    fn get(&self, index: usize) -> std::result::Result<I, E> {
        let len = self.shard.len();
        let source = self.shard.source(index);
        let source =
            source.unwrap_or_else(|| panic!("index {index} past this rank's shard of {len}"));
        self.inner.get(source)
    }

    fn len(&self) -> usize {
        self.shard.len()
    }
}
