//! Properties of the sampler over random lengths, replica counts, seeds and epochs.

use burn_ddp_sampler::DistributedSampler;
use proptest::prelude::*;
use std::collections::HashSet;

fn shards(
    len: usize,
    replicas: usize,
    drop_last: bool,
    seed: u64,
    epoch: usize,
) -> Vec<Vec<usize>> {
    (0..replicas)
        .map(|rank| {
            let mut s = DistributedSampler::new(len, replicas, rank)
                .unwrap()
                .seed(seed)
                .drop_last(drop_last);
            s.set_epoch(epoch);
            s.indices()
        })
        .collect()
}

proptest! {
    #[test]
    fn shards_are_equal_sized_and_in_range(
        len in 0usize..300, replicas in 1usize..9, drop_last: bool, seed in 0u64..1000, epoch in 0usize..50
    ) {
        let all = shards(len, replicas, drop_last, seed, epoch);
        let expected = DistributedSampler::new(len, replicas, 0).unwrap().drop_last(drop_last).num_samples();
        for shard in &all {
            prop_assert_eq!(shard.len(), expected);
            prop_assert!(shard.iter().all(|i| *i < len));
        }
    }

    #[test]
    fn without_drop_last_the_union_covers_the_dataset(
        len in 0usize..300, replicas in 1usize..9, seed in 0u64..1000, epoch in 0usize..50
    ) {
        let union: HashSet<usize> = shards(len, replicas, false, seed, epoch).into_iter().flatten().collect();
        prop_assert_eq!(union.len(), len);
    }

    #[test]
    fn ranks_are_disjoint_when_the_length_divides(
        per_rank in 0usize..40, replicas in 1usize..9, seed in 0u64..1000, epoch in 0usize..50
    ) {
        let len = per_rank * replicas;
        let all: Vec<usize> = shards(len, replicas, false, seed, epoch).into_iter().flatten().collect();
        let distinct: HashSet<usize> = all.iter().copied().collect();
        prop_assert_eq!(distinct.len(), all.len());
        prop_assert_eq!(all.len(), len);
    }

    #[test]
    fn drop_last_shards_are_disjoint(
        len in 0usize..300, replicas in 1usize..9, seed in 0u64..1000
    ) {
        let all: Vec<usize> = shards(len, replicas, true, seed, 0).into_iter().flatten().collect();
        let distinct: HashSet<usize> = all.iter().copied().collect();
        prop_assert_eq!(distinct.len(), all.len());
        prop_assert_eq!(all.len(), len / replicas * replicas);
    }

    #[test]
    fn order_is_deterministic_and_changes_with_the_epoch(
        len in 20usize..300, replicas in 1usize..5, seed in 0u64..1000, epoch in 0usize..50
    ) {
        let a = shards(len, replicas, false, seed, epoch);
        prop_assert_eq!(&a, &shards(len, replicas, false, seed, epoch));
        // 20+ items: two epochs giving the same permutation has odds below 1/20!.
        prop_assert_ne!(&a, &shards(len, replicas, false, seed, epoch + 1));
    }

    #[test]
    fn evaluation_shards_partition_the_dataset(len in 0usize..300, replicas in 1usize..9) {
        let mut all: Vec<usize> = (0..replicas)
            .flat_map(|r| DistributedSampler::evaluation(len, replicas, r).unwrap().indices())
            .collect();
        all.sort_unstable();
        prop_assert_eq!(all, (0..len).collect::<Vec<_>>());
    }
}
