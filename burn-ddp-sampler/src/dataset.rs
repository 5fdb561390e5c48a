//! A Burn dataset that is one rank's shard of another, in the sampler's order.

use crate::DistributedSampler;
use burn::data::dataset::Dataset;
use std::marker::PhantomData;
use std::sync::{Arc, RwLock};

struct Shard {
    sampler: DistributedSampler,
    indices: Vec<usize>,
}

/// A cloneable handle on the shard's sampler: the training loop keeps one and
/// calls [`EpochHandle::set_epoch`] at the start of every epoch, while the data
/// loader holds the dataset.
#[derive(Clone)]
pub struct EpochHandle {
    shard: Arc<RwLock<Shard>>,
}

impl EpochHandle {
    /// Moves the shard to `epoch`: the next pass over the dataset visits that
    /// epoch's indices (PyTorch's `sampler.set_epoch(epoch)`).
    pub fn set_epoch(&self, epoch: usize) {
        let mut shard = self.shard.write().unwrap();
        shard.sampler.set_epoch(epoch);
        shard.indices = shard.sampler.indices();
    }

    /// The epoch the shard currently follows.
    pub fn epoch(&self) -> usize {
        self.shard.read().unwrap().sampler.epoch()
    }

    /// The dataset indices of the current epoch, in order.
    pub fn indices(&self) -> Vec<usize> {
        self.shard.read().unwrap().indices.clone()
    }
}

/// This rank's shard of `D`, as a Burn [`Dataset`]: item `i` is item
/// `sampler.indices()[i]` of the wrapped dataset for the current epoch.
///
/// Build the data loader over it without `.shuffle(..)`: the order is the
/// sampler's, identical to PyTorch's DistributedSampler.
///
/// ```
/// use burn::data::dataset::{Dataset, InMemDataset};
/// use burn_ddp_sampler::{DistributedDataset, DistributedSampler};
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
    shard: Arc<RwLock<Shard>>,
    _item: PhantomData<fn() -> I>,
}

impl<D: Dataset<I>, I> DistributedDataset<D, I> {
    /// Wraps `inner`, sharded by `sampler` (whose length must be `inner.len()`).
    ///
    /// # Panics
    /// If the sampler was made for a dataset of another length: that is a bug in
    /// the calling code, and indexing past the end would otherwise surface later.
    pub fn new(inner: D, sampler: DistributedSampler) -> Self {
        assert_eq!(
            sampler.dataset_len(),
            inner.len(),
            "the DistributedSampler was made for {} items but the dataset has {}; \
             create it with dataset.len()",
            sampler.dataset_len(),
            inner.len()
        );
        let indices = sampler.indices();
        Self {
            inner,
            shard: Arc::new(RwLock::new(Shard { sampler, indices })),
            _item: PhantomData,
        }
    }

    /// A handle for advancing the epoch from the training loop.
    pub fn epoch_handle(&self) -> EpochHandle {
        EpochHandle {
            shard: Arc::clone(&self.shard),
        }
    }
}

impl<D: Dataset<I>, I> Dataset<I> for DistributedDataset<D, I> {
    fn get(&self, index: usize) -> Option<I> {
        let source = *self.shard.read().unwrap().indices.get(index)?;
        self.inner.get(source)
    }

    fn len(&self) -> usize {
        self.shard.read().unwrap().indices.len()
    }
}
