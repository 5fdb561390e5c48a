//! One rank's shard, epoch by epoch: the sampler and its current indices,
//! shared between the training loop (which advances the epoch) and whatever
//! reads the data (a framework's dataset wrapper, on loader threads).

use crate::DistributedSampler;
use std::sync::{Arc, RwLock};

struct State {
    sampler: DistributedSampler,
    indices: Vec<usize>,
    /// Where in the epoch's order over every rank the shard's world began
    /// (0, unless the world changed in the middle of the epoch).
    start: usize,
}

/// The dataset indices this rank visits in the current epoch. Cloning it
/// shares it: a framework's dataset wrapper holds one, the training loop an
/// [`EpochHandle`].
///
/// ```
/// use burn_ddp_sampler::{DistributedSampler, ShardIndices};
///
/// let shard = ShardIndices::new(DistributedSampler::new(10, 2, 1).unwrap());
/// let epochs = shard.epoch_handle();
/// for epoch in 0..2 {
///     epochs.set_epoch(epoch); // before iterating, every epoch
///     let items: Vec<usize> = (0..shard.len()).map(|i| shard.source(i).unwrap()).collect();
///     assert_eq!(items.len(), 5);
/// }
/// ```
#[derive(Clone)]
pub struct ShardIndices {
    state: Arc<RwLock<State>>,
}

impl ShardIndices {
    /// The shard `sampler` gives, at its current epoch.
    pub fn new(sampler: DistributedSampler) -> Self {
        let indices = sampler.indices();
        Self {
            state: Arc::new(RwLock::new(State {
                sampler,
                indices,
                start: 0,
            })),
        }
    }

    /// The length of the dataset it shards.
    pub fn dataset_len(&self) -> usize {
        self.state.read().unwrap().sampler.dataset_len()
    }

    /// Panics unless the sampler was made for a dataset of `len` items: a
    /// framework's wrapper calls it with its dataset's length (a mismatch is a
    /// bug in the calling code that would otherwise surface later, past the end).
    pub fn check_dataset_len(&self, len: usize) {
        let expected = self.dataset_len();
        assert_eq!(
            expected, len,
            "the DistributedSampler was made for {expected} items but the dataset has \
             {len}; create it with dataset.len()"
        );
    }

    /// The dataset index of the shard's `index`-th item this epoch.
    pub fn source(&self, index: usize) -> Option<usize> {
        self.state.read().unwrap().indices.get(index).copied()
    }

    /// Items in the shard.
    pub fn len(&self) -> usize {
        self.state.read().unwrap().indices.len()
    }

    /// Whether the shard is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A handle for advancing the epoch from the training loop.
    pub fn epoch_handle(&self) -> EpochHandle {
        EpochHandle {
            shard: self.clone(),
        }
    }
}

/// A cloneable handle on the shard's sampler: the training loop keeps one and
/// calls [`EpochHandle::set_epoch`] at the start of every epoch, while the data
/// loader holds the dataset.
#[derive(Clone)]
pub struct EpochHandle {
    shard: ShardIndices,
}

impl EpochHandle {
    /// Moves the shard to `epoch`: the next pass over the dataset visits that
    /// epoch's indices (PyTorch's `sampler.set_epoch(epoch)`).
    pub fn set_epoch(&self, epoch: usize) {
        let mut state = self.shard.state.write().unwrap();
        state.sampler.set_epoch(epoch);
        state.indices = state.sampler.indices();
        state.start = 0;
    }

    /// The world changed in the middle of the epoch (ranks gone): this
    /// rank is now `rank` of `num_replicas`, and each rank of the old world
    /// had taken its first `taken` items since the epoch began (or since
    /// the last regroup). The shard becomes this rank's part
    /// of the epoch's rest ([`DistributedSampler::indices_after`]); later
    /// epochs are dealt over the new world. Build a new iterator over the
    /// data to go on.
    pub fn regroup(
        &self,
        num_replicas: usize,
        rank: usize,
        taken: usize,
    ) -> Result<(), crate::SamplerError> {
        let mut state = self.shard.state.write().unwrap();
        let start = state.start + taken * state.sampler.num_replicas();
        let next = state.sampler.regrouped(num_replicas, rank)?;
        state.indices = next.indices_after(start);
        state.sampler = next;
        state.start = start;
        Ok(())
    }

    /// From the next [`set_epoch`](Self::set_epoch) on, this rank is `rank`
    /// of `num_replicas` (the world changed); the epoch under way keeps its
    /// indices, which a loader may be iterating.
    pub fn regroup_from_next_epoch(
        &self,
        num_replicas: usize,
        rank: usize,
    ) -> Result<(), crate::SamplerError> {
        let mut state = self.shard.state.write().unwrap();
        state.sampler = state.sampler.regrouped(num_replicas, rank)?;
        Ok(())
    }

    /// Where the shard stands: its epoch, and where in that epoch's order
    /// over every rank its world began (0 unless the world changed in the
    /// middle of the epoch). A replacement that joins takes a peer's
    /// ([`place`](Self::place)).
    pub fn position(&self) -> (usize, usize) {
        let state = self.shard.state.read().unwrap();
        (state.sampler.epoch(), state.start)
    }

    /// This rank becomes `rank` of `num_replicas` at `position` (an epoch
    /// and a start, a peer's [`position`](Self::position)): its part of the
    /// rest of that epoch, as every rank of the world takes it. Build a new
    /// iterator over the data to go on.
    pub fn place(
        &self,
        (epoch, start): (usize, usize),
        num_replicas: usize,
        rank: usize,
    ) -> Result<(), crate::SamplerError> {
        let mut state = self.shard.state.write().unwrap();
        let mut next = state.sampler.regrouped(num_replicas, rank)?;
        next.set_epoch(epoch);
        state.indices = next.indices_after(start);
        state.sampler = next;
        state.start = start;
        Ok(())
    }

    /// The items of every rank's batch number `step` (counted from the
    /// epoch's start, or from the last [`regroup`](Self::regroup)) of
    /// `batch` items, rank after rank: the step's global batch, which one
    /// process can train on to replay the run. Computed here, for any rank.
    pub fn global_batch(&self, step: usize, batch: usize) -> Vec<usize> {
        let state = self.shard.state.read().unwrap();
        let world = state.sampler.num_replicas();
        (0..world)
            .flat_map(|rank| {
                let ranks = state
                    .sampler
                    .regrouped(world, rank)
                    .expect("a rank of its world");
                let items = ranks.indices_after(state.start);
                let from = (step * batch).min(items.len());
                let to = ((step + 1) * batch).min(items.len());
                items[from..to].to_vec()
            })
            .collect()
    }

    /// The epoch the shard currently follows.
    pub fn epoch(&self) -> usize {
        self.shard.state.read().unwrap().sampler.epoch()
    }

    /// The dataset indices of the current epoch, in order.
    pub fn indices(&self) -> Vec<usize> {
        self.shard.state.read().unwrap().indices.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_regrouped_from_the_next_epoch_keeps_the_one_under_way() {
        let shard = ShardIndices::new(DistributedSampler::new(12, 3, 2).unwrap().seed(1));
        let handle = shard.epoch_handle();
        handle.set_epoch(4);
        let under_way = handle.indices();
        handle.regroup_from_next_epoch(2, 1).unwrap();
        assert_eq!(handle.indices(), under_way);
        handle.set_epoch(5);
        let mut two = DistributedSampler::new(12, 2, 1).unwrap().seed(1);
        two.set_epoch(5);
        assert_eq!(handle.indices(), two.indices());
    }

    #[test]
    fn a_shard_placed_at_a_peers_position_takes_its_part_of_the_rest() {
        // 3 ranks took 2 items each of epoch 1, then 2 ranks go on and a
        // third (a replacement, elsewhere) joins at their position.
        let shards: Vec<ShardIndices> = (0..2)
            .map(|r| ShardIndices::new(DistributedSampler::new(20, 3, r).unwrap().seed(3)))
            .collect();
        for (rank, shard) in shards.iter().enumerate() {
            let handle = shard.epoch_handle();
            handle.set_epoch(1);
            handle.regroup(3, rank, 2).unwrap();
        }
        let joiner = ShardIndices::new(DistributedSampler::new(20, 1, 0).unwrap().seed(3));
        joiner
            .epoch_handle()
            .place(shards[0].epoch_handle().position(), 3, 2)
            .unwrap();
        assert_eq!(shards[0].epoch_handle().position(), (1, 6));
        let peer = shards[0].epoch_handle();
        for (rank, shard) in shards.iter().chain([&joiner]).enumerate() {
            let ours = DistributedSampler::new(20, 3, rank).unwrap().seed(3);
            let mut ours = ours;
            ours.set_epoch(1);
            assert_eq!(shard.epoch_handle().indices(), ours.indices_after(6));
            assert_eq!(shard.epoch_handle().epoch(), peer.epoch());
        }
    }

    #[test]
    fn a_shard_regrouped_twice_in_an_epoch_sees_the_rest_of_it_once() {
        // 12 items, 3 ranks take 1 each, then 2 ranks take 2 each, then 1.
        let shards: Vec<ShardIndices> = (0..3)
            .map(|r| ShardIndices::new(DistributedSampler::new(12, 3, r).unwrap().seed(5)))
            .collect();
        let mut seen: Vec<usize> = shards.iter().map(|s| s.source(0).unwrap()).collect();
        for (rank, shard) in shards[..2].iter().enumerate() {
            shard.epoch_handle().regroup(2, rank, 1).unwrap();
            seen.extend((0..2).map(|i| shard.source(i).unwrap()));
        }
        shards[0].epoch_handle().regroup(1, 0, 2).unwrap();
        seen.extend((0..shards[0].len()).map(|i| shards[0].source(i).unwrap()));
        seen.sort_unstable();
        assert_eq!(seen, (0..12).collect::<Vec<_>>());
        // The next epoch is dealt over the new world from its start.
        shards[0].epoch_handle().set_epoch(1);
        assert_eq!(shards[0].len(), 12);
        // A step's global batch: every rank's batch of it, rank after rank.
        let both: Vec<ShardIndices> = (0..2)
            .map(|r| ShardIndices::new(DistributedSampler::new(12, 2, r).unwrap().seed(5)))
            .collect();
        let expected: Vec<usize> = both
            .iter()
            .flat_map(|s| (2..4).map(|i| s.source(i).unwrap()).collect::<Vec<_>>())
            .collect();
        assert_eq!(both[1].epoch_handle().global_batch(1, 2), expected);
    }

    #[test]
    fn every_clone_follows_the_epoch_the_handle_sets() {
        let sampler = DistributedSampler::new(11, 3, 2).unwrap().seed(7);
        let shard = ShardIndices::new(sampler.clone());
        let reader = shard.clone();
        let epochs = shard.epoch_handle();
        for epoch in [0, 1, 5] {
            epochs.set_epoch(epoch);
            let mut want = sampler.clone();
            want.set_epoch(epoch);
            let got: Vec<usize> = (0..reader.len())
                .map(|i| reader.source(i).unwrap())
                .collect();
            assert_eq!(got, want.indices(), "epoch {epoch}");
            assert_eq!(epochs.epoch(), epoch);
            assert_eq!(epochs.indices(), got);
        }
        assert_eq!(reader.source(reader.len()), None);
        assert_eq!(reader.dataset_len(), 11);
    }
}
