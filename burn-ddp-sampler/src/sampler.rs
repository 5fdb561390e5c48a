//! Which dataset indices a rank visits in an epoch.

use crate::mt19937::randperm;
use std::fmt;

/// A sampler argument that cannot work.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SamplerError {
    /// `rank` is not in `0..num_replicas` (or `num_replicas` is 0).
    InvalidRank {
        /// The rank given.
        rank: usize,
        /// The number of replicas given.
        num_replicas: usize,
    },
}

impl fmt::Display for SamplerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SamplerError::InvalidRank { rank, num_replicas } if *num_replicas == 0 => write!(
                f,
                "Invalid rank {rank}: num_replicas is 0; pass the world size (at least 1) \
                 as num_replicas"
            ),
            SamplerError::InvalidRank { rank, num_replicas } => write!(
                f,
                "Invalid rank {rank}, rank should be in the interval [0, {}]; pass this \
                 process's rank and the world size (group.rank(), group.world_size())",
                num_replicas - 1
            ),
        }
    }
}

impl std::error::Error for SamplerError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// PyTorch's DistributedSampler: equal shards, padded or truncated.
    Train,
    /// Strided shards without padding: every sample exactly once over all ranks.
    Evaluation,
}

/// Shards `0..dataset_len` across replicas exactly as PyTorch's
/// `torch.utils.data.DistributedSampler` does, including its shuffle.
///
/// ```
/// use burn_ddp_sampler::DistributedSampler;
/// let mut sampler = DistributedSampler::new(10, 2, 0).unwrap().seed(0);
/// sampler.set_epoch(0);
/// assert_eq!(sampler.indices(), vec![4, 7, 3, 0, 6]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedSampler {
    dataset_len: usize,
    num_replicas: usize,
    rank: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
    epoch: usize,
    mode: Mode,
}

impl DistributedSampler {
    /// A sampler for `rank` of `num_replicas` over a dataset of `dataset_len`
    /// items; shuffles with seed 0 and pads, like PyTorch's defaults.
    pub fn new(dataset_len: usize, num_replicas: usize, rank: usize) -> Result<Self, SamplerError> {
        if rank >= num_replicas {
            return Err(SamplerError::InvalidRank { rank, num_replicas });
        }
        if dataset_len == 0 {
            // Not an error (an empty validation split can be deliberate), but
            // training zero steps without a word is never what anyone wants.
            log::warn!(
                "rank {rank}: the dataset is empty, so every epoch runs zero steps; check \
                 the data path and any filtering"
            );
        }
        Ok(Self {
            dataset_len,
            num_replicas,
            rank,
            shuffle: true,
            seed: 0,
            drop_last: false,
            epoch: 0,
            mode: Mode::Train,
        })
    }

    /// A sampler for evaluation: no shuffle, no padding, rank `r` takes items
    /// `r, r + R, r + 2R, ...`, so over all ranks every item is seen exactly once
    /// and metrics summed over ranks are exact. Shards may differ in length by one.
    pub fn evaluation(
        dataset_len: usize,
        num_replicas: usize,
        rank: usize,
    ) -> Result<Self, SamplerError> {
        let mut sampler = Self::new(dataset_len, num_replicas, rank)?;
        sampler.shuffle = false;
        sampler.mode = Mode::Evaluation;
        Ok(sampler)
    }

    /// Whether to shuffle (default true). Ignored in evaluation mode.
    pub fn shuffle(mut self, shuffle: bool) -> Self {
        self.shuffle = shuffle && self.mode == Mode::Train;
        self
    }

    /// The shuffle seed, the same on every rank (default 0).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Drop the tail that does not divide evenly instead of padding (default false).
    pub fn drop_last(mut self, drop_last: bool) -> Self {
        self.drop_last = drop_last;
        self
    }

    /// Selects the epoch, which reseeds the shuffle with `seed + epoch`. Call it at
    /// the start of every epoch, or every epoch sees the same order. It takes a
    /// `usize`, as Burn's loops and configs count epochs; Burn's `Learner`
    /// counts from 1, a hand-written loop usually from 0 (PyTorch's does).
    pub fn set_epoch(&mut self, epoch: usize) {
        self.epoch = epoch;
    }

    /// The current epoch.
    pub fn epoch(&self) -> usize {
        self.epoch
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of replicas.
    pub fn num_replicas(&self) -> usize {
        self.num_replicas
    }

    /// The dataset length the sampler was made for.
    pub fn dataset_len(&self) -> usize {
        self.dataset_len
    }

    /// Items per rank per epoch.
    pub fn num_samples(&self) -> usize {
        let (len, replicas) = (self.dataset_len, self.num_replicas);
        match self.mode {
            Mode::Evaluation => (len + replicas - 1 - self.rank) / replicas,
            // PyTorch: ceil((len - R) / R) when dropping an uneven tail, which is
            // floor(len / R) (and 0 when len < R); otherwise ceil(len / R).
            Mode::Train if self.drop_last && len % replicas != 0 => len / replicas,
            Mode::Train => len.div_ceil(replicas),
        }
    }

    /// Items over all ranks per epoch, padding included.
    pub fn total_size(&self) -> usize {
        match self.mode {
            Mode::Evaluation => self.dataset_len,
            Mode::Train => self.num_samples() * self.num_replicas,
        }
    }

    /// This rank's indices for the current epoch, in visiting order.
    pub fn indices(&self) -> Vec<usize> {
        self.indices_after(0)
    }

    /// This rank's indices of the rest of the current epoch once its first
    /// `start` items (of the epoch's order over every rank, before padding)
    /// are done, dealt over this sampler's ranks as a whole epoch is
    /// (padded or truncated alike): what each rank visits when the world
    /// changed in the middle of an epoch (the items ranks of the old world
    /// had not reached yet, each once, on the new one).
    pub fn indices_after(&self, start: usize) -> Vec<usize> {
        let order: Vec<usize> = if self.shuffle {
            randperm(self.dataset_len, self.seed.wrapping_add(self.epoch as u64))
        } else {
            (0..self.dataset_len).collect()
        };
        let mut rest: Vec<usize> = order.into_iter().skip(start).collect();
        if self.mode == Mode::Train {
            let (len, replicas) = (rest.len(), self.num_replicas);
            let total = if self.drop_last && len % replicas != 0 {
                len / replicas * replicas
            } else {
                len.div_ceil(replicas) * replicas
            };
            if total > len && len > 0 {
                // Pad by repeating from the front, cyclically if need be.
                for i in 0..total - len {
                    rest.push(rest[i % len]);
                }
            } else {
                rest.truncate(total);
            }
        }
        rest.into_iter()
            .skip(self.rank)
            .step_by(self.num_replicas)
            .collect()
    }

    /// The same sampler (seed, shuffle, epoch, mode) for rank `rank` of a
    /// world of `num_replicas`: after the world changed.
    pub fn regrouped(&self, num_replicas: usize, rank: usize) -> Result<Self, SamplerError> {
        if rank >= num_replicas {
            return Err(SamplerError::InvalidRank { rank, num_replicas });
        }
        Ok(Self {
            num_replicas,
            rank,
            ..self.clone()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(len: usize, replicas: usize, rank: usize) -> DistributedSampler {
        DistributedSampler::new(len, replicas, rank).unwrap()
    }

    #[test]
    fn reference_values_from_pytorch() {
        let mut r0 = sampler(10, 2, 0).seed(0);
        let mut r1 = sampler(10, 2, 1).seed(0);
        assert_eq!(r0.indices(), vec![4, 7, 3, 0, 6]);
        assert_eq!(r1.indices(), vec![1, 5, 9, 8, 2]);
        r0.set_epoch(1);
        r1.set_epoch(1);
        assert_eq!(r0.indices(), vec![5, 1, 0, 9, 7]);
        assert_eq!(r1.indices(), vec![6, 2, 8, 3, 4]);
    }

    #[test]
    fn the_rest_of_an_epoch_is_dealt_over_a_new_world_each_item_once() {
        // 3 ranks took 2 items each (6 of the order); 2 ranks go on.
        let old: Vec<_> = (0..3).map(|r| sampler(20, 3, r).seed(4)).collect();
        let order: Vec<usize> = {
            let mut all = vec![0; 21];
            for (r, s) in old.iter().enumerate() {
                for (j, i) in s.indices().into_iter().enumerate() {
                    all[r + 3 * j] = i;
                }
            }
            all.truncate(20);
            all
        };
        let done: Vec<usize> = old.iter().flat_map(|s| s.indices()[..2].to_vec()).collect();
        let new: Vec<Vec<usize>> = (0..2)
            .map(|r| old[0].regrouped(2, r).unwrap().indices_after(6))
            .collect();
        assert_eq!(new[0].len(), 7);
        assert_eq!(new[1].len(), 7);
        let mut seen: Vec<usize> = done.into_iter().chain(new.concat()).collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..20).collect::<Vec<_>>(), "each item once");
        assert_eq!(new[0][0], order[6]);
        assert_eq!(new[1][0], order[7]);
        // From the start, the same as a whole epoch; past the end, nothing.
        assert_eq!(old[1].indices_after(0), old[1].indices());
        assert!(old[1].indices_after(25).is_empty());
        assert!(old[0].regrouped(2, 2).is_err());
    }

    #[test]
    fn padding_and_dropping_follow_pytorch() {
        // len 5, 3 replicas, no shuffle: [0,1,2,3,4] padded to [0,1,2,3,4,0].
        let shards: Vec<_> = (0..3)
            .map(|r| sampler(5, 3, r).shuffle(false).indices())
            .collect();
        assert_eq!(shards, vec![vec![0, 3], vec![1, 4], vec![2, 0]]);
        // Padding longer than the data repeats it cyclically: len 2, 5 replicas.
        let shards: Vec<_> = (0..5)
            .map(|r| sampler(2, 5, r).shuffle(false).indices())
            .collect();
        assert_eq!(shards, vec![vec![0], vec![1], vec![0], vec![1], vec![0]]);
        // drop_last: len 5, 3 replicas keeps 3 items.
        let s = sampler(5, 3, 2).shuffle(false).drop_last(true);
        assert_eq!(
            (s.num_samples(), s.total_size(), s.indices()),
            (1, 3, vec![2])
        );
        // drop_last with fewer items than replicas: nothing at all.
        let s = sampler(2, 4, 1).drop_last(true);
        assert_eq!((s.num_samples(), s.indices()), (0, vec![]));
        // Empty dataset.
        let s = sampler(0, 3, 2);
        assert_eq!(
            (s.num_samples(), s.total_size(), s.indices()),
            (0, 0, vec![])
        );
    }

    #[test]
    fn invalid_ranks_are_errors_with_the_fix() {
        let err = DistributedSampler::new(10, 2, 2).unwrap_err().to_string();
        assert!(
            err.starts_with("Invalid rank 2, rank should be in the interval [0, 1]"),
            "{err}"
        );
        assert!(err.contains("world size"), "{err}");
        let err = DistributedSampler::new(10, 0, 0).unwrap_err().to_string();
        assert!(err.contains("num_replicas is 0"), "{err}");
        assert!(DistributedSampler::evaluation(3, 1, 1).is_err());
    }

    #[test]
    fn evaluation_shards_cover_each_item_once() {
        let shards: Vec<_> = (0..3)
            .map(|r| DistributedSampler::evaluation(7, 3, r).unwrap())
            .collect();
        assert_eq!(shards[0].indices(), vec![0, 3, 6]);
        assert_eq!(shards[1].indices(), vec![1, 4]);
        assert_eq!(shards[2].indices(), vec![2, 5]);
        assert_eq!(
            shards.iter().map(|s| s.num_samples()).collect::<Vec<_>>(),
            vec![3, 2, 2]
        );
        let shuffled = DistributedSampler::evaluation(7, 3, 0)
            .unwrap()
            .shuffle(true);
        assert_eq!(shuffled.indices(), vec![0, 3, 6]);
    }
}
