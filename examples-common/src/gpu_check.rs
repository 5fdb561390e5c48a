//! What the GPU checks of both Burn versions expect (examples/gpu_check,
//! examples-22/gpu_check), written once: each check's inputs, different on
//! every rank so that a collective doing nothing fails it, and the right
//! answer; the programs run the collectives on their Burn's CUDA tensors and
//! print the `RESULT` lines scripts/gpu-check.sh reads.

use burn_ddp_comm::{RoundMode, ShardPlan};

/// Rank `rank`'s 4096 floats for the tensor sum: `i * (rank + 1)`.
pub fn scaled_index(rank: usize) -> Vec<f32> {
    (0..4096).map(|i| i as f32 * (rank as f32 + 1.0)).collect()
}

/// Whether `summed` is the sum of every rank's [`scaled_index`]: `i` times
/// `world (world + 1) / 2` at every index.
pub fn is_scaled_index_sum(summed: &[f32], world: usize) -> bool {
    let world = world as f32;
    let factor = world * (world + 1.0) / 2.0;
    summed.len() == 4096
        && summed
            .iter()
            .enumerate()
            .all(|(i, v)| *v == i as f32 * factor)
}

/// A rank's `[2, 3]` tensor with a distinct value per element (the last
/// dimension 3, not a power of two): a padded row or a misplaced element shows.
pub fn distinct(rank: usize) -> Vec<f32> {
    (0..6).map(|i| rank as f32 * 100.0 + i as f32).collect()
}

/// Rank `rank`'s `[2 world, 3]` input of the reduce-scatter: `index + rank`.
pub fn reduce_scatter_input(rank: usize, world: usize) -> Vec<f32> {
    (0..6 * world).map(|i| i as f32 + rank as f32).collect()
}

/// Rank `rank`'s `[2, 3]` part of the reduce-scatter's sum: rows `2 rank`
/// and `2 rank + 1` of `world * index + world (world - 1) / 2`.
pub fn reduce_scatter_want(rank: usize, world: usize) -> Vec<f32> {
    let world = world as f32;
    let offset = world * (world - 1.0) / 2.0;
    (6 * rank..6 * rank + 6)
        .map(|i| world * i as f32 + offset)
        .collect()
}

/// The `[3, 5]` grid of the device-pointer round trips (`i + 0.5`).
pub fn grid() -> Vec<f32> {
    (0..15).map(|i| i as f32 + 0.5).collect()
}

/// Little-endian f32 bytes (what NCCL would be handed) as floats.
pub fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Whether `a` and `b` have the same length and differ by at most
/// `tolerance` everywhere.
pub fn close(a: &[f32], b: &[f32], tolerance: f32) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tolerance)
}

/// Rank `rank`'s `[3, 4, 5]` input of the SyncBatchNorm check.
pub fn batch_norm_rows(rank: usize) -> Vec<f32> {
    (0..3 * 4 * 5)
        .map(|i| ((i * 7 + rank * 13) % 17) as f32 / 4.0 - 2.0)
        .collect()
}

/// What SyncBatchNorm gave and what Burn's BatchNorm gave on the global
/// batch in one process: this rank's output rows, its input gradient, the
/// running mean.
pub struct BatchNormSeen {
    pub output: Vec<f32>,
    pub want_output: Vec<f32>,
    pub grad: Option<Vec<f32>>,
    pub want_grad: Option<Vec<f32>>,
    pub running_mean: Vec<f32>,
    pub want_running_mean: Vec<f32>,
}

/// The SyncBatchNorm check's verdict and its detail.
pub fn batch_norm_verdict(seen: &BatchNormSeen) -> (bool, String) {
    let out_ok = close(&seen.output, &seen.want_output, 1e-5);
    let grad_ok = matches!((&seen.grad, &seen.want_grad), (Some(a), Some(b)) if close(a, b, 1e-4));
    let mean_ok = close(&seen.running_mean, &seen.want_running_mean, 1e-6);
    (
        out_ok && grad_ok && mean_ok,
        format!("output {out_ok}, input gradient {grad_ok}, running mean {mean_ok}"),
    )
}

/// Rank `rank`'s `[4, 6]` batch of the sharded-optimizer check.
pub fn shard_batch(rank: usize) -> Vec<f32> {
    (0..4 * 6)
        .map(|i| ((i * 3 + rank * 7) % 13) as f32 / 6.0 - 1.0)
        .collect()
}

/// The sharded-optimizer check's verdict and its detail: the parameters
/// after its steps (`got`) within 1e-5 of one process with the global
/// batch (`want`), rounds through NCCL, and every round replicated exactly
/// when asked (a padding limit of 1 with several ranks: this model's chunks
/// are uneven).
pub fn shard_verdict(
    got: &[f32],
    want: &[f32],
    on_gpu: u64,
    plan: &ShardPlan,
    padding_limit: f64,
    world: usize,
) -> (bool, String) {
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    let modes: Vec<RoundMode> = plan.rounds.iter().map(|r| r.mode).collect();
    let replicate = padding_limit <= 1.0 && world > 1;
    let modes_as_asked = modes
        .iter()
        .all(|&mode| (mode == RoundMode::Replicated) == replicate);
    (
        got.len() == want.len() && worst <= 1e-5 && on_gpu > 0 && modes_as_asked,
        format!(
            "largest difference from one process with the global batch {worst:e}, \
             {on_gpu} rounds through NCCL, owners {:?}, rounds {modes:?}",
            plan.owners
        ),
    )
}
