//! The reducer: averages a model's gradients over a process group, bucket by
//! bucket, and owns the whole pipeline (the plan, the cross-rank layout
//! check, packing, one all-reduce per bucket, the average, unpacking), with
//! its bucket buffers kept from one step to the next.
//!
//! It knows parameters only by shape, element type and placement, never by
//! the framework that produced them: a front-end implements [`GradientSet`]
//! (hand over each gradient, take the average back) and calls
//! [`Reducer::synchronize`].

mod gradient_set;
mod host_copies;
mod layout;
mod pipeline;
mod plan;
mod shard_plan;
mod sharder;
mod stats;

pub use gradient_set::{DeviceBucket, GradientSet, ParamInfo, Piece, Placement};
pub use host_copies::{ElementBytes, HostCopies};
pub use layout::{check_layouts_agree, check_same_layout, ParamLayout};
pub use plan::{Bucket, BucketConfig, BucketPlan};
pub use shard_plan::{Round, RoundMode, ShardPlan};
pub use sharder::Sharder;
pub use stats::SyncStats;

use crate::element::AlignedBuf;
use crate::error::{CommError, Result};
use crate::group::{ProcessGroup, WeakProcessGroup};
use crate::transport::WireCompression;
use pipeline::{Averaging, CommThread, Landed, Packed};
use std::time::Instant;

/// Buckets and all-reduces one model's gradients over a process group.
///
/// The plan is rebuilt only when the layout changes, and before every
/// synchronisation all ranks check in one small collective that they have the
/// same layout (a mismatch fails on every rank, naming the first difference).
/// It holds the group weakly: a destroyed group is an error, not kept alive.
pub struct Reducer {
    group: WeakProcessGroup,
    rank: usize,
    config: BucketConfig,
    layout: Vec<ParamLayout>,
    plan: BucketPlan,
    /// One host buffer per bucket, reused across steps.
    host_buckets: Vec<AlignedBuf>,
    /// How the buckets' f32 means cross machines (`None`: the group's own setting).
    compression: Option<WireCompression>,
    stats: SyncStats,
}

impl Reducer {
    /// A reducer over `group` (`burn_ddp::BucketConfig`, a Burn `Config`,
    /// converts into this crate's).
    pub fn new(group: &ProcessGroup, config: impl Into<BucketConfig>) -> Self {
        Self {
            group: group.downgrade(),
            rank: group.rank(),
            config: config.into(),
            layout: Vec::new(),
            plan: BucketPlan::default(),
            host_buckets: Vec::new(),
            compression: None,
            stats: SyncStats::default(),
        }
    }

    /// Sends this reducer's buckets across machines as `compression` says,
    /// whatever the group's own setting (a model wrapped with its own
    /// gradient compression, as PyTorch's communication hooks are per model).
    pub fn with_compression(mut self, compression: WireCompression) -> Self {
        self.compression = Some(compression);
        self
    }

    /// The group it reduces over, while it lives.
    pub fn group(&self) -> Result<ProcessGroup> {
        self.group.upgrade().ok_or(CommError::Destroyed)
    }

    /// Its bucket sizes.
    pub fn config(&self) -> BucketConfig {
        self.config
    }

    /// Changes the bucket sizes (the plan is rebuilt on the next call).
    pub fn set_config(&mut self, config: impl Into<BucketConfig>) {
        let config = config.into();
        if config != self.config {
            self.config = config;
            self.layout.clear();
        }
    }

    /// What this reducer's synchronisations cost so far.
    pub fn stats(&self) -> SyncStats {
        self.stats
    }

    /// The current plan (empty before the first synchronisation).
    pub fn plan(&self) -> &BucketPlan {
        &self.plan
    }

    /// Averages every gradient of `set` over all ranks, in place; returns
    /// what this synchronisation cost, `None` when no gradient moved (a world
    /// of one, see [`ProcessGroup::synchronizes`]; or no rank had a gradient).
    ///
    /// Collective: every rank calls it at the same point, with the same
    /// layout. A parameter without a gradient counts as zero.
    pub fn synchronize(&mut self, set: &mut dyn GradientSet) -> Result<Option<SyncStats>> {
        self.check_config()?;
        let group = self.group()?;
        if !group.synchronizes() {
            return Ok(None);
        }
        let Some(placement) = one_placement(self.rank, set.params())? else {
            return Ok(None);
        };
        let on_device = match placement {
            Placement::Device { ordinal } => group.uses_device_collectives(ordinal)?,
            Placement::Host => false,
        };
        let mut stats = SyncStats {
            syncs: 1,
            ..SyncStats::default()
        };
        // The agreement is the one small collective every rank makes; it also
        // absorbs the wait for the slowest rank, so its time is told apart
        // from the time the bucket collectives take.
        let waiting = Instant::now();
        if !self.prepare(&group, set)? {
            return Ok(None);
        }
        stats.wait = waiting.elapsed();
        if on_device {
            for index in 0..self.plan.buckets.len() {
                self.reduce_on_device(&group, index, set, &mut stats)?;
            }
        } else {
            self.reduce_on_host(&group, set, &mut stats)?;
        }
        log::debug!(
            "rank {}: gradient sync of {} bytes in {} bucket(s) ({} on the GPU): wait {:?}, \
             pack {:?}, all-reduce {:?}, unpack {:?}",
            self.rank,
            stats.bytes,
            stats.buckets,
            stats.device_buckets,
            stats.wait,
            stats.pack,
            stats.reduce,
            stats.unpack
        );
        self.stats.add(&stats);
        Ok(Some(stats))
    }

    /// Checks with every rank that the layouts agree and that someone has a
    /// gradient, and plans the buckets for a new layout.
    /// Bucket caps must be at least one byte (in every world size, so a bad
    /// setting shows on one machine before it reaches a cluster).
    fn check_config(&self) -> Result<()> {
        if self.config.cap_bytes == 0 || self.config.first_cap_bytes == 0 {
            // Every parameter would get its own bucket (one collective each).
            return Err(CommError::InvalidArgument {
                rank: self.rank,
                message: format!(
                    "bucket caps of {} bytes (first bucket {} bytes): a cap must be at least \
                     one byte; PyTorch's defaults are 25 MiB and 1 MiB \
                     (BucketConfig::default())",
                    self.config.cap_bytes, self.config.first_cap_bytes
                ),
            });
        }
        Ok(())
    }

    fn prepare(&mut self, group: &ProcessGroup, set: &dyn GradientSet) -> Result<bool> {
        let params = set.params();
        let layouts = || params.iter().map(|p| &p.layout);
        let agreement = layout::agree(group, layouts(), set.has_gradients())?;
        if !agreement.same_layout {
            let mine: Vec<ParamLayout> = layouts().cloned().collect();
            check_same_layout(group, &mine)?;
            return Err(CommError::Mismatch {
                rank: self.rank,
                message: "ranks' parameter layouts hash differently but compare equal; \
                          please report this"
                    .into(),
            });
        }
        if !agreement.any_gradients {
            return Ok(false);
        }
        if !layouts().eq(self.layout.iter()) {
            self.layout = layouts().cloned().collect();
            self.plan = BucketPlan::new(&self.layout, self.config);
            self.host_buckets = (0..self.plan.buckets.len())
                .map(|_| AlignedBuf::default())
                .collect();
            log::debug!(
                "rank {}: {} parameters in {} bucket(s) of {:?} elements (caps {} and {} bytes)",
                self.rank,
                self.layout.len(),
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
        Ok(true)
    }

    /// Every bucket through host memory: gradients copied into the bucket's
    /// buffer here, averaged by the host transport on a communication thread
    /// while the next bucket is packed, copied back out as they land.
    fn reduce_on_host(
        &mut self,
        group: &ProcessGroup,
        set: &mut dyn GradientSet,
        stats: &mut SyncStats,
    ) -> Result<()> {
        let averaging = Averaging {
            group: group.clone(),
            compression: self.compression.unwrap_or(group.wire_compression()),
        };
        if self.plan.buckets.len() == 1 {
            // Nothing to overlap the collective with: no thread.
            let packed = self.pack_host(0, set)?;
            return self.unpack_host(averaging.reduce(packed), set, stats);
        }
        std::thread::scope(|scope| {
            let mut comm = CommThread::start(scope, averaging);
            let result = self.pipeline_host(&mut comm, set, stats);
            comm.join();
            result
        })
    }

    /// Packs and submits every bucket in order, unpacking those that have
    /// landed in between, then waits for the rest.
    fn pipeline_host(
        &mut self,
        comm: &mut CommThread<'_>,
        set: &mut dyn GradientSet,
        stats: &mut SyncStats,
    ) -> Result<()> {
        let mut unpacked = 0;
        for index in 0..self.plan.buckets.len() {
            let packed = self.pack_host(index, set)?;
            if !comm.submit(packed) {
                break; // the thread stopped on a failure, which has landed
            }
            while let Some(landed) = comm.try_landed() {
                self.unpack_host(landed, set, stats)?;
                unpacked += 1;
            }
        }
        comm.close();
        while let Some(landed) = comm.next_landed() {
            self.unpack_host(landed, set, stats)?;
            unpacked += 1;
        }
        if unpacked != self.plan.buckets.len() {
            return Err(CommError::InvalidArgument {
                rank: self.rank,
                message: format!(
                    "{unpacked} of {} gradient buckets came back from the communication thread",
                    self.plan.buckets.len()
                ),
            });
        }
        Ok(())
    }

    /// Bucket `index`'s gradients read into its buffer.
    fn pack_host(&mut self, index: usize, set: &mut dyn GradientSet) -> Result<Packed> {
        let started = Instant::now();
        let bucket = &self.plan.buckets[index];
        let size = bucket.dtype.size();
        let mut buffer = std::mem::take(&mut self.host_buckets[index]);
        let bytes = buffer.bytes(bucket.numel * size);
        for (&param, &offset) in self.plan.members(index).iter().zip(&bucket.offsets) {
            let len = self.layout[param].numel() * size;
            set.read_host(param, &mut bytes[offset * size..offset * size + len])?;
        }
        Ok(Packed {
            index,
            buffer,
            bytes: bucket.numel * size,
            dtype: bucket.dtype,
            pack: started.elapsed(),
        })
    }

    /// A landed bucket's averages written back, its buffer kept for the next step.
    fn unpack_host(
        &mut self,
        landed: Landed,
        set: &mut dyn GradientSet,
        stats: &mut SyncStats,
    ) -> Result<()> {
        landed.result?;
        let started = Instant::now();
        let Landed {
            index,
            mut buffer,
            bytes: len,
            pack,
            reduce,
            ..
        } = landed;
        let bucket = &self.plan.buckets[index];
        let size = bucket.dtype.size();
        let bytes = buffer.bytes(len);
        for (&param, &offset) in self.plan.members(index).iter().zip(&bucket.offsets) {
            let len = self.layout[param].numel() * size;
            set.write_host(param, &bytes[offset * size..offset * size + len])?;
        }
        self.host_buckets[index] = buffer;
        stats.count_bucket(len, [pack, reduce, started.elapsed()]);
        Ok(())
    }

    /// One bucket on the GPU: the front-end packs it into one device buffer,
    /// NCCL averages it in place, the front-end unpacks it.
    #[cfg(feature = "nccl")]
    fn reduce_on_device(
        &mut self,
        group: &ProcessGroup,
        index: usize,
        set: &mut dyn GradientSet,
        stats: &mut SyncStats,
    ) -> Result<()> {
        let started = Instant::now();
        let bucket = &self.plan.buckets[index];
        let members = self.plan.members(index);
        let packed_bucket = set.pack_device(members, bucket.numel, bucket.dtype)?;
        let packed = Instant::now();
        // SAFETY: `DeviceBucket::new`'s contract: live, fully written device
        // memory of `numel` elements, used by nobody else until it is handed
        // back below; the call returns once NCCL is done with it.
        unsafe { group.all_reduce_device(packed_bucket.buffer(), ReduceOp::Mean)? };
        let reduced = Instant::now();
        set.unpack_device(members, &bucket.offsets, packed_bucket)?;
        stats.device_buckets += 1;
        stats.count_bucket_since(
            bucket.numel * bucket.dtype.size(),
            [started, packed, reduced],
        );
        Ok(())
    }

    #[cfg(not(feature = "nccl"))]
    fn reduce_on_device(
        &mut self,
        _group: &ProcessGroup,
        _index: usize,
        _set: &mut dyn GradientSet,
        _stats: &mut SyncStats,
    ) -> Result<()> {
        unreachable!("without NCCL the group never reduces on the device")
    }
}

/// Where all of `params` live, or an error naming two places; `None` without
/// parameters.
fn one_placement(rank: usize, params: &[ParamInfo]) -> Result<Option<Placement>> {
    let Some(first) = params.first() else {
        return Ok(None);
    };
    match params.iter().find(|p| p.placement != first.placement) {
        None => Ok(Some(first.placement)),
        Some(other) => Err(CommError::config(
            Some(rank),
            "device",
            format!(
                "rank {rank}: the model's gradients are in two places ({:?} and {:?}); burn-ddp \
             drives one device per process: put the whole model on one device",
                first.placement, other.placement
            ),
        )),
    }
}

#[cfg(test)]
mod tests;
