//! Data sharding and metric helpers tied to the process group.

use crate::{CommError, ProcessGroup, ReduceOp, Result};
use burn::data::dataset::Dataset;
pub use burn_ddp_sampler::{DistributedSampler, EpochHandle, SamplerError, ShardIndices};
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
        assert_eq!(
            sampler.dataset_len(),
            inner.len(),
            "the DistributedSampler was made for {} items but the dataset has {}; \
             create it with dataset.len()",
            sampler.dataset_len(),
            inner.len()
        );
        Self {
            inner,
            shard: ShardIndices::new(sampler),
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

/// A number [`sum_over_ranks`] adds up: integer counts travel as `i64` (exact),
/// floats as `f64`.
pub trait RankSum: Copy {
    /// The type it is summed in.
    type Wire: burn_ddp_comm::Element;
    /// Into the summed type.
    fn to_wire(self) -> Self::Wire;
    /// Back from it.
    fn from_wire(wire: Self::Wire) -> Self;
}

macro_rules! rank_sum {
    ($wire:ty: $($ty:ty),*) => {$(
        impl RankSum for $ty {
            type Wire = $wire;
            fn to_wire(self) -> $wire {
                self as $wire
            }
            fn from_wire(wire: $wire) -> Self {
                wire as $ty
            }
        }
    )*};
}

rank_sum!(i64: usize, u32, u64, i32, i64);
rank_sum!(f64: f32, f64);

/// Sums per-rank figures (correct predictions, items seen, a summed loss) over
/// all ranks; every rank gets the totals. Integers (`usize`, `u64`, `i64`,
/// ...) are summed exactly, floats in `f64`; all values of one call have one
/// type.
///
/// ```no_run
/// # fn main() -> burn_ddp::Result<()> {
/// let group = burn_ddp::init_process_group()?;
/// let (correct, seen): (usize, usize) = (97, 100); // this rank's evaluation shard
/// let [correct, seen] = burn_ddp::sum_over_ranks(&group, [correct, seen])?;
/// if group.is_main() {
///     println!("accuracy {:.2}%", 100.0 * correct as f64 / seen as f64);
/// }
/// # Ok(())
/// # }
/// ```
pub fn sum_over_ranks<T: RankSum, const N: usize>(
    group: &ProcessGroup,
    values: [T; N],
) -> Result<[T; N]> {
    let mut wire = values.map(RankSum::to_wire);
    group.all_reduce(&mut wire, ReduceOp::Sum)?;
    Ok(wire.map(RankSum::from_wire))
}
