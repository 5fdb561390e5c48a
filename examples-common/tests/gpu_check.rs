//! The GPU checks' expectations against the collectives done by hand on
//! the host: what the right answer is must be right without a GPU.

use burn_ddp_comm::{DType, Round, RoundMode, ShardPlan};
use burn_ddp_examples_common::gpu_check::{
    batch_norm_rows, batch_norm_verdict, close, distinct, f32s, grid, is_scaled_index_sum,
    reduce_scatter_input, reduce_scatter_want, scaled_index, shard_batch, shard_verdict,
    BatchNormSeen,
};

/// Every rank's input summed element by element.
fn summed(world: usize, input: impl Fn(usize) -> Vec<f32>) -> Vec<f32> {
    (0..world).map(input).fold(Vec::new(), |mut sum, one| {
        sum.resize(one.len(), 0.0);
        sum.iter_mut().zip(one).for_each(|(s, v)| *s += v);
        sum
    })
}

#[test]
fn the_sum_is_recognised_and_doing_nothing_is_not() {
    for world in 1..=4 {
        assert!(is_scaled_index_sum(&summed(world, scaled_index), world));
        // A collective that left rank 0's input (or returned nothing) fails,
        // with one rank as soon as the values must change (never here: a
        // world of one sums to its input, the raw NCCL rows cover it).
        if world > 1 {
            assert!(!is_scaled_index_sum(&scaled_index(0), world));
        }
        assert!(!is_scaled_index_sum(&[], world));
    }
}

#[test]
fn each_rank_keeps_its_rows_of_the_reduce_scatter() {
    for world in 1..=4 {
        let sum = summed(world, |rank| reduce_scatter_input(rank, world));
        for rank in 0..world {
            assert_eq!(
                reduce_scatter_want(rank, world),
                sum[6 * rank..6 * rank + 6]
            );
        }
    }
}

#[test]
fn inputs_differ_per_rank() {
    for input in [distinct, batch_norm_rows, shard_batch, scaled_index] {
        assert_ne!(input(0), input(1));
    }
    assert_eq!(distinct(2), [200.0, 201.0, 202.0, 203.0, 204.0, 205.0]);
    assert_eq!((grid()[0], grid()[14], grid().len()), (0.5, 14.5, 15));
    let bytes: Vec<u8> = grid().iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(f32s(&bytes), grid());
    assert!(close(&[1.0, 2.0], &[1.0, 2.0 + 1e-6], 1e-5));
    assert!(!close(&[1.0, 2.0], &[1.0], 1.0) && !close(&[1.0], &[1.1], 1e-5));
}

#[test]
fn batch_norm_verdict_names_each_part() {
    let seen = |grad: Option<Vec<f32>>| BatchNormSeen {
        output: vec![1.0],
        want_output: vec![1.0],
        grad,
        want_grad: Some(vec![2.0]),
        running_mean: vec![0.5],
        want_running_mean: vec![0.5],
    };
    let (passed, detail) = batch_norm_verdict(&seen(Some(vec![2.0])));
    assert!(passed, "{detail}");
    assert_eq!(
        detail,
        "output true, input gradient true, running mean true"
    );
    let (passed, detail) = batch_norm_verdict(&seen(None));
    assert!(!passed);
    assert_eq!(
        detail,
        "output true, input gradient false, running mean true"
    );
}

#[test]
fn shard_verdict_wants_closeness_nccl_and_the_modes_asked() {
    let plan = |mode| ShardPlan {
        owners: vec![0, 1],
        rounds: vec![Round {
            dtype: DType::F32,
            mode,
            members: vec![vec![0], vec![1]],
            offsets: vec![vec![0], vec![0]],
            chunks: vec![(0, 1), (1, 1)],
            numel: 2,
        }],
    };
    let sharded = plan(RoundMode::Sharded);
    let (passed, detail) = shard_verdict(&[1.0, 2.0], &[1.0, 2.0], 3, &sharded, 4.0, 2);
    assert!(passed, "{detail}");
    assert!(
        detail.starts_with("largest difference from one process with the global batch 0e0, 3 rounds through NCCL, owners [0, 1]"),
        "{detail}"
    );
    // Too far, not through NCCL, or sharded where replication was asked.
    assert!(!shard_verdict(&[1.0, 2.1], &[1.0, 2.0], 3, &sharded, 4.0, 2).0);
    assert!(!shard_verdict(&[1.0, 2.0], &[1.0, 2.0], 0, &sharded, 4.0, 2).0);
    assert!(!shard_verdict(&[1.0, 2.0], &[1.0, 2.0], 3, &sharded, 1.0, 2).0);
    let replicated = plan(RoundMode::Replicated);
    assert!(shard_verdict(&[1.0], &[1.0], 3, &replicated, 1.0, 2).0);
    // Alone, every round is sharded whatever the limit.
    assert!(shard_verdict(&[1.0], &[1.0], 3, &sharded, 1.0, 1).0);
}
