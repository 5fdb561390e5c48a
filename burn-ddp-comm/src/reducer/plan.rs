//! Which parameter goes into which bucket: PyTorch's assignment, last
//! parameter first, a bucket closed once it reaches its cap, a new one at
//! each change of element type.

use super::layout::ParamLayout;
use crate::element::DType;
use std::ops::Range;

/// How gradients are grouped, as PyTorch's `bucket_cap_mb`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketConfig {
    /// Largest bucket, in bytes (PyTorch: 25 MiB).
    pub cap_bytes: usize,
    /// Largest first bucket, in bytes (PyTorch: 1 MiB), so the first collective
    /// can start early once reduction overlaps backward.
    pub first_cap_bytes: usize,
}

impl Default for BucketConfig {
    fn default() -> Self {
        Self {
            cap_bytes: 25 << 20,
            first_cap_bytes: 1 << 20,
        }
    }
}

impl BucketConfig {
    /// Sizes given in MiB (a front-end's `DdpConfig`, as PyTorch's
    /// `bucket_cap_mb`); an error names `rank` and the bad setting.
    pub fn from_mib(rank: usize, cap_mb: f64, first_cap_mb: f64) -> crate::Result<Self> {
        let to_bytes = |mb: f64, name: &str| {
            if mb.is_finite() && mb > 0.0 && mb * 1024.0 * 1024.0 < usize::MAX as f64 {
                Ok(((mb * 1024.0 * 1024.0) as usize).max(1))
            } else {
                Err(crate::CommError::config(
                    Some(rank),
                    name,
                    format!(
                        "rank {rank}: DdpConfig {name} = {mb} must be a positive number of MiB \
                     (PyTorch's default is 25 for bucket_cap_mb, 1 for the first bucket)"
                    ),
                ))
            }
        };
        Ok(Self {
            cap_bytes: to_bytes(cap_mb, "bucket_cap_mb")?,
            first_cap_bytes: to_bytes(first_cap_mb, "first_bucket_cap_mb")?,
        })
    }
}

/// A run of consecutive parameters (in bucket order) reduced by one collective.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// Positions in [`BucketPlan::order`] of the parameters it holds.
    pub slots: Range<usize>,
    /// Offset of each of those parameters in the flat buffer.
    pub offsets: Vec<usize>,
    /// Total elements.
    pub numel: usize,
    /// Element type shared by its parameters.
    pub dtype: DType,
}

/// Which parameter goes into which bucket, for one layout.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BucketPlan {
    /// Parameter indices in bucket order: last parameter first, as PyTorch
    /// orders them (roughly the order backward produces gradients).
    pub order: Vec<usize>,
    /// The buckets, covering `order` without gaps.
    pub buckets: Vec<Bucket>,
}

impl BucketPlan {
    /// The parameters of bucket `index`, in bucket order.
    pub fn members(&self, index: usize) -> &[usize] {
        &self.order[self.buckets[index].slots.clone()]
    }

    /// Assigns parameters to buckets as PyTorch does: in reverse order, each
    /// parameter added to the open bucket, which closes once it holds at
    /// least its cap (the first bucket's cap for the first, so it leaves
    /// early when reduction overlaps backward); a change of element type
    /// also starts a new bucket. A parameter over the cap thus shares its
    /// bucket with the smaller ones before it instead of being held back
    /// until the next one fills.
    pub fn new(layout: &[ParamLayout], config: BucketConfig) -> Self {
        let order: Vec<usize> = (0..layout.len()).rev().collect();
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut open = false;
        let mut bytes = 0usize;
        for (slot, &param) in order.iter().enumerate() {
            let p = &layout[param];
            let joins = open && buckets.last().is_some_and(|b| b.dtype == p.dtype);
            if joins {
                let bucket = buckets.last_mut().unwrap();
                bucket.offsets.push(bucket.numel);
                bucket.numel += p.numel();
                bucket.slots.end = slot + 1;
                bytes += p.bytes();
            } else {
                buckets.push(Bucket {
                    slots: slot..slot + 1,
                    offsets: vec![0],
                    numel: p.numel(),
                    dtype: p.dtype,
                });
                bytes = p.bytes();
            }
            let cap = if buckets.len() == 1 {
                config.first_cap_bytes
            } else {
                config.cap_bytes
            };
            open = bytes < cap;
        }
        Self { order, buckets }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reducer::layout::tests::f32s;

    #[test]
    fn buckets_respect_caps_in_reverse_order() {
        // Four params of 1 KiB (256 f32) each; first cap 1 KiB, then 2 KiB.
        let layout = f32s(&[&[256], &[16, 16], &[256], &[256]]);
        let config = BucketConfig {
            cap_bytes: 2048,
            first_cap_bytes: 1024,
        };
        let plan = BucketPlan::new(&layout, config);
        assert_eq!(plan.order, vec![3, 2, 1, 0]);
        let slots: Vec<_> = plan.buckets.iter().map(|b| b.slots.clone()).collect();
        assert_eq!(slots, vec![0..1, 1..3, 3..4]);
        assert_eq!(plan.buckets[1].offsets, vec![0, 256]);
        assert_eq!(plan.buckets[1].numel, 512);
    }

    #[test]
    fn an_oversized_param_closes_the_open_bucket_and_dtype_changes_start_new_ones() {
        let mut layout = f32s(&[&[10], &[1000], &[10]]);
        layout[0].dtype = DType::F64;
        let plan = BucketPlan::new(
            &layout,
            BucketConfig {
                cap_bytes: 1000,
                first_cap_bytes: 1000,
            },
        );
        let slots: Vec<_> = plan
            .buckets
            .iter()
            .map(|b| (b.slots.clone(), b.dtype))
            .collect();
        assert_eq!(slots, vec![(0..2, DType::F32), (2..3, DType::F64)]);
    }

    #[test]
    fn default_caps_put_the_mnist_cnns_fc1_with_the_layers_after_it() {
        let layout = f32s(&[
            &[32, 1, 3, 3],
            &[32],
            &[64, 32, 3, 3],
            &[64],
            &[9216, 128],
            &[128],
            &[128, 10],
            &[10],
        ]);
        let plan = BucketPlan::new(&layout, BucketConfig::default());
        // fc1's 4.7 MB weight fills the 1 MiB first bucket with fc2 and fc1's
        // bias, whose gradients backward produces first; the convolutions'
        // come last, in the second bucket.
        assert_eq!(plan.members(0), &[7, 6, 5, 4]);
        assert_eq!(plan.members(1), &[3, 2, 1, 0]);
        assert_eq!(plan.buckets.len(), 2);
    }
}
