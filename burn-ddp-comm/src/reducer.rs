//! The reducer: groups gradients into buckets and all-reduces them bucket by bucket.
//!
//! It knows parameters only by shape and element type, never by the framework
//! that produced them, so any front end (a backend decorator, an explicit
//! gradient synchroniser) feeds it the same way: describe the layout, then hand
//! over each bucket's flat buffer. Averaging happens in the collective.

use crate::element::{DType, Element, ReduceOp};
use crate::error::{CommError, Result};
use crate::group::ProcessGroup;
use std::ops::Range;
use std::sync::Arc;

/// Shape and element type of one parameter's gradient.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ParamLayout {
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DType,
}

impl ParamLayout {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    fn bytes(&self) -> usize {
        self.numel() * dtype_size(self.dtype)
    }
}

fn dtype_size(dtype: DType) -> usize {
    dtype.size()
}

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketPlan {
    /// Parameter indices in bucket order: last parameter first, as PyTorch
    /// orders them (roughly the order backward produces gradients).
    pub order: Vec<usize>,
    /// The buckets, covering `order` without gaps.
    pub buckets: Vec<Bucket>,
}

impl BucketPlan {
    /// Assigns parameters to buckets: in reverse order, a new bucket whenever the
    /// cap would be exceeded or the element type changes. A parameter larger than
    /// the cap gets a bucket of its own.
    pub fn new(layout: &[ParamLayout], config: BucketConfig) -> Self {
        let order: Vec<usize> = (0..layout.len()).rev().collect();
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut bytes = 0usize;
        for (slot, &param) in order.iter().enumerate() {
            let p = &layout[param];
            let fits = buckets.last().is_some_and(|b| {
                let cap = if buckets.len() == 1 {
                    config.first_cap_bytes
                } else {
                    config.cap_bytes
                };
                b.dtype == p.dtype && bytes + p.bytes() <= cap
            });
            if fits {
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
        }
        Self { order, buckets }
    }
}

/// Buckets and all-reduces gradients over a process group.
///
/// The plan is rebuilt only when the layout changes, and each time it is, every
/// rank first checks that all ranks have the same layout: a mismatch would
/// otherwise sum unrelated numbers or hang.
pub struct Reducer {
    group: Arc<ProcessGroup>,
    config: BucketConfig,
    layout: Vec<ParamLayout>,
    plan: BucketPlan,
}

impl Reducer {
    /// A reducer over `group` (`burn_ddp::BucketConfig`, a Burn `Config`,
    /// converts into this crate's).
    pub fn new(group: Arc<ProcessGroup>, config: impl Into<BucketConfig>) -> Self {
        Self {
            group,
            config: config.into(),
            layout: Vec::new(),
            plan: BucketPlan {
                order: Vec::new(),
                buckets: Vec::new(),
            },
        }
    }

    /// The group it reduces over.
    pub fn group(&self) -> &Arc<ProcessGroup> {
        &self.group
    }

    /// Changes the bucket sizes (the plan is rebuilt on the next call).
    pub fn set_config(&mut self, config: impl Into<BucketConfig>) {
        let config = config.into();
        if config != self.config {
            self.config = config;
            self.layout.clear();
        }
    }

    /// The plan for `layout`, after checking that every rank has the same one.
    ///
    /// The check is one tiny collective on every call, made by all ranks alike:
    /// deciding locally ("my layout changed, let me check") would leave a rank
    /// whose layout changed alone running a different collective than the
    /// others, which garbles the sums instead of failing.
    pub fn prepare(&mut self, layout: &[ParamLayout]) -> Result<&BucketPlan> {
        if self.config.cap_bytes == 0 || self.config.first_cap_bytes == 0 {
            // Every parameter would get its own bucket (one collective each).
            return Err(CommError::InvalidArgument {
                rank: self.group.rank(),
                message: format!(
                    "bucket caps of {} bytes (first bucket {} bytes): a cap must be at least \
                     one byte; PyTorch's defaults are 25 MiB and 1 MiB \
                     (BucketConfig::default())",
                    self.config.cap_bytes, self.config.first_cap_bytes
                ),
            });
        }
        if self.group.world_size() > 1 {
            let mine = fingerprint(layout);
            // max(fp) and max(-fp) = -min(fp): equal to ours on every rank iff all agree.
            let mut seen = [mine, mine.wrapping_neg()];
            self.group.all_reduce(&mut seen, ReduceOp::Max)?;
            if seen != [mine, mine.wrapping_neg()] {
                check_same_layout(&self.group, layout)?;
                return Err(CommError::Mismatch {
                    rank: self.group.rank(),
                    message: "ranks' parameter layouts hash differently but compare equal; \
                              please report this"
                        .into(),
                });
            }
        }
        if layout != self.layout.as_slice() || self.plan.order.len() != layout.len() {
            self.plan = BucketPlan::new(layout, self.config);
            self.layout = layout.to_vec();
            log::debug!(
                "rank {}: {} parameters in {} bucket(s) of {:?} elements (caps {} and {} bytes)",
                self.group.rank(),
                layout.len(),
                self.plan.buckets.len(),
                self.plan
                    .buckets
                    .iter()
                    .map(|b| b.numel)
                    .collect::<Vec<_>>(),
                self.config.first_cap_bytes,
                self.config.cap_bytes
            );
        }
        Ok(&self.plan)
    }

    /// Averages one bucket's flat buffer over all ranks, in place.
    pub fn reduce_bucket<T: Element>(&self, data: &mut [T]) -> Result<()> {
        self.group.all_reduce(data, ReduceOp::Mean)
    }

    /// Averages one bucket that lives in GPU memory, in place, over NCCL
    /// (the division happens inside the reduction).
    ///
    /// # Safety
    /// As [`crate::nccl::NcclCommunicator::all_reduce`].
    #[cfg(feature = "nccl")]
    pub unsafe fn reduce_device_bucket(
        &self,
        comm: &crate::nccl::NcclCommunicator,
        bucket: crate::nccl::DeviceBuffer,
    ) -> Result<()> {
        unsafe { comm.all_reduce(bucket, ReduceOp::Mean) }
    }
}

/// Fails on every rank, naming the first differing parameter, unless all ranks
/// describe the same parameters.
pub fn check_same_layout(group: &ProcessGroup, layout: &[ParamLayout]) -> Result<()> {
    let world = group.world_size();
    if world == 1 {
        return Ok(());
    }
    let words = encode(layout);
    let summary = group.all_gather(&[words.len() as i64])?;
    let longest = *summary.iter().max().unwrap() as usize;
    let mut padded = words.clone();
    padded.resize(longest, -1);
    let everyone = group.all_gather(&padded)?;
    let layouts: Vec<Vec<ParamLayout>> = (0..world)
        .map(|r| decode(&everyone[r * longest..r * longest + summary[r] as usize]))
        .collect();
    let rank = group.rank();
    for (other, theirs) in layouts.iter().enumerate() {
        if theirs == layout {
            continue;
        }
        let describe = |p: Option<&ParamLayout>| match p {
            Some(p) => format!("{:?} {:?}", p.shape, p.dtype),
            None => "nothing (fewer parameters)".to_string(),
        };
        let first = (0..layout.len().max(theirs.len()))
            .find(|&i| layout.get(i) != theirs.get(i))
            .unwrap();
        return Err(CommError::Mismatch {
            rank,
            message: format!(
                "the model's parameters differ between rank {rank} ({} parameters) and rank \
                 {other} ({} parameters): parameter #{first} is {} on rank {rank} but {} on \
                 rank {other}. Every rank must build the same model (same config, same \
                 layers in the same order)",
                layout.len(),
                theirs.len(),
                describe(layout.get(first)),
                describe(theirs.get(first)),
            ),
        });
    }
    Ok(())
}

/// FNV-1a over the encoded layout: equal layouts, equal fingerprints.
fn fingerprint(layout: &[ParamLayout]) -> i64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for word in encode(layout).into_iter().chain([layout.len() as i64]) {
        for byte in word.to_le_bytes() {
            hash = (hash ^ byte as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash as i64
}

fn dtype_code(dtype: DType) -> i64 {
    match dtype {
        DType::F32 => 0,
        DType::F64 => 1,
        DType::I32 => 2,
        DType::I64 => 3,
        DType::F16 => 4,
        DType::BF16 => 5,
    }
}

/// `[rank, dims..., dtype]` per parameter.
fn encode(layout: &[ParamLayout]) -> Vec<i64> {
    let mut words = Vec::new();
    for p in layout {
        words.push(p.shape.len() as i64);
        words.extend(p.shape.iter().map(|d| *d as i64));
        words.push(dtype_code(p.dtype));
    }
    words
}

fn decode(mut words: &[i64]) -> Vec<ParamLayout> {
    let mut layout = Vec::new();
    while let Some((&rank, rest)) = words.split_first() {
        let rank = rank as usize;
        if rest.len() < rank + 1 {
            break;
        }
        let dtype = match rest[rank] {
            0 => DType::F32,
            1 => DType::F64,
            2 => DType::I32,
            4 => DType::F16,
            5 => DType::BF16,
            _ => DType::I64,
        };
        layout.push(ParamLayout {
            shape: rest[..rank].iter().map(|d| *d as usize).collect(),
            dtype,
        });
        words = &rest[rank + 1..];
    }
    layout
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(shapes: &[&[usize]]) -> Vec<ParamLayout> {
        shapes
            .iter()
            .map(|s| ParamLayout {
                shape: s.to_vec(),
                dtype: DType::F32,
            })
            .collect()
    }

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
    fn oversized_params_and_dtype_changes_start_new_buckets() {
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
        assert_eq!(
            slots,
            vec![(0..1, DType::F32), (1..2, DType::F32), (2..3, DType::F64)]
        );
    }

    #[test]
    fn default_caps_put_small_models_in_two_buckets_at_most() {
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
        assert!(plan.buckets.len() <= 3, "{:?}", plan.buckets);
        let covered: usize = plan.buckets.iter().map(|b| b.slots.len()).sum();
        assert_eq!(covered, layout.len());
    }

    #[test]
    fn fingerprints_tell_layouts_apart() {
        let a = f32s(&[&[3, 4], &[4]]);
        let mut b = a.clone();
        assert_eq!(fingerprint(&a), fingerprint(&b));
        b[1].shape = vec![5];
        assert_ne!(fingerprint(&a), fingerprint(&b));
        assert_ne!(fingerprint(&a), fingerprint(&a[..1]));
        b = a.clone();
        b[0].dtype = DType::F64;
        assert_ne!(fingerprint(&a), fingerprint(&b));
    }

    #[test]
    fn layouts_round_trip_through_words() {
        let mut layout = f32s(&[&[3, 4], &[], &[7]]);
        layout[2].dtype = DType::I64;
        assert_eq!(decode(&encode(&layout)), layout);
    }
}
