//! Deterministic data and float comparisons the front-ends' tests share, so
//! the Burn 0.21 and 0.22 tests train on the same numbers.

/// A deterministic value in [-1, 1) for (item, feature): the same on every rank.
pub fn value(item: usize, feature: usize) -> f32 {
    let mut h = (item as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (feature as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    h ^= h >> 29;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^= h >> 32;
    (h % 20_000) as f32 / 10_000.0 - 1.0
}

/// Features (10 per item, row-major) and regression targets (one per item)
/// of the toy task.
pub fn toy_rows(items: &[usize]) -> (Vec<f32>, Vec<f32>) {
    let x = items
        .iter()
        .flat_map(|&i| (0..10).map(move |f| value(i, f)))
        .collect();
    let y = items
        .iter()
        .map(|&i| {
            (0..10)
                .map(|f| value(i, f) * (f as f32 - 4.5) / 5.0)
                .sum::<f32>()
                + 0.1 * value(i, 99)
        })
        .collect();
    (x, y)
}

/// Pixels (1x8x8 per item) and class labels (3 classes) of the image task.
pub fn image_rows(items: &[usize]) -> (Vec<f32>, Vec<i64>) {
    let x = items
        .iter()
        .flat_map(|&i| (0..64).map(move |f| value(i, f)))
        .collect();
    let y = items.iter().map(|&i| (i % 3) as i64).collect();
    (x, y)
}

/// Features (6 per item, row-major) and classes (3: they depend on the
/// features, so accuracy moves) of the Learner tests' classification task.
pub fn point_rows(items: &[usize]) -> (Vec<f32>, Vec<i64>) {
    let x = items
        .iter()
        .flat_map(|&i| (0..6).map(move |f| value(i, f)))
        .collect();
    let y = items
        .iter()
        .map(|&i| {
            if value(i, 0) + value(i, 1) > 0.3 {
                0
            } else if value(i, 2) > 0.0 {
                1
            } else {
                2
            }
        })
        .collect();
    (x, y)
}

/// Largest difference relative to the largest magnitude of `b` (at least 1).
pub fn max_relative_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    a.iter()
        .zip(b)
        .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()))
        / scale
}

/// Each rank's indices for one epoch as PyTorch's DistributedSampler gives
/// them with seed 3.
pub fn shards(len: usize, world: usize) -> Vec<Vec<usize>> {
    (0..world)
        .map(|r| {
            burn_ddp_sampler::DistributedSampler::new(len, world, r)
                .unwrap()
                .seed(3)
                .indices()
        })
        .collect()
}

/// Fails unless every rank of `group` holds exactly (bit for bit) the same
/// `values` (a model's parameters), naming the first rank that differs.
pub fn identical_across_ranks(
    group: &burn_ddp_comm::ProcessGroup,
    values: &[f32],
    when: &str,
) -> Result<(), String> {
    let all = group.all_gather(values).map_err(|e| e.to_string())?;
    for (r, theirs) in all.chunks(values.len().max(1)).enumerate() {
        let same = theirs
            .iter()
            .zip(values)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        if !same {
            return Err(format!(
                "{when}: parameters of rank {r} differ from rank {}",
                group.rank()
            ));
        }
    }
    Ok(())
}
