//! The reducer: averages a model's gradients over a process group, bucket by
//! bucket, and owns the whole pipeline (the plan, the cross-rank layout
//! check, packing, one all-reduce per bucket, the average, unpacking), with
//! its bucket buffers kept from one step to the next.
//!
//! It knows parameters only by shape, element type and placement, never by
//! the framework that produced them: a front-end implements [`GradientSet`]
//! (hand over each gradient, take the average back) and calls
//! [`Reducer::synchronize`]; or [`Reducer::begin`], hands gradients over as
//! backward finishes them ([`SyncRound::ready`]: each complete bucket leaves at
//! once), and ends with [`Reducer::finish`].

mod comm_thread;
mod gradient_set;
mod host_copies;
mod layout;
mod plan;
mod shard_plan;
mod sharder;
mod stats;
mod sync_round;

pub use gradient_set::{
    DeviceBucket, DeviceFence, GradientSet, ParamInfo, PendingDeviceBucket, Piece, Placement,
};
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
use comm_thread::Averaging;
use std::sync::Arc;
use sync_round::Planned;
pub use sync_round::SyncRound;

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
    planned: Arc<Planned>,
    /// One host buffer per bucket, reused across steps (lent to each round).
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
            planned: Arc::default(),
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
            self.planned = Arc::default();
        }
    }

    /// What this reducer's synchronisations cost so far.
    pub fn stats(&self) -> SyncStats {
        self.stats
    }

    /// The current plan (empty before the first synchronisation).
    pub fn plan(&self) -> &BucketPlan {
        &self.planned.plan
    }

    /// Averages every gradient of `set` over all ranks, in place; returns
    /// what this synchronisation cost, `None` when no gradient moved (a world
    /// of one, see [`ProcessGroup::synchronizes`]; or no rank had a gradient).
    ///
    /// Collective: every rank calls it at the same point, with the same
    /// layout. A parameter without a gradient counts as zero.
    pub fn synchronize(&mut self, set: &mut dyn GradientSet) -> Result<Option<SyncStats>> {
        match self.begin(set.params())? {
            Some(round) => self.finish(round, set),
            None => Ok(None),
        }
    }

    /// Starts a synchronisation of parameters `params` (as
    /// [`GradientSet::params`] will list them) whose gradients may be handed
    /// over one by one as they become final ([`SyncRound::ready`]), the buckets
    /// leaving meanwhile; `None` when nothing will move (a world of one, no
    /// parameters). Nothing is sent before the first complete bucket.
    pub fn begin(&mut self, params: &[ParamInfo]) -> Result<Option<SyncRound>> {
        self.check_config()?;
        let group = self.group()?;
        if !group.synchronizes() {
            return Ok(None);
        }
        let Some(placement) = one_placement(self.rank, params)? else {
            return Ok(None);
        };
        let on_device = match placement {
            Placement::Device { ordinal } => group.uses_device_collectives(ordinal)?,
            Placement::Host => false,
        };
        let layouts = || params.iter().map(|p| &p.layout);
        if !layouts().eq(self.planned.layout.iter()) {
            let layout: Vec<ParamLayout> = layouts().cloned().collect();
            let plan = BucketPlan::new(&layout, self.config);
            log::debug!(
                "rank {}: {} parameters in {} bucket(s) of {:?} elements (caps {} and {} bytes)",
                self.rank,
                layout.len(),
                plan.buckets.len(),
                plan.buckets.iter().map(|b| b.numel).collect::<Vec<_>>(),
                self.config.first_cap_bytes,
                self.config.cap_bytes
            );
            self.host_buckets = (0..plan.buckets.len())
                .map(|_| AlignedBuf::default())
                .collect();
            self.planned = Arc::new(Planned::new(layout, plan));
        }
        let averaging = Averaging {
            compression: self.compression.unwrap_or(group.wire_compression()),
            device_mean: comm_thread::nccl_mean,
            group,
        };
        let mut buffers = std::mem::take(&mut self.host_buckets);
        // A round dropped without `finish` (an error) took them along.
        buffers.resize_with(self.planned.plan.buckets.len(), AlignedBuf::default);
        Ok(Some(SyncRound::new(
            averaging,
            self.planned.clone(),
            buffers,
            on_device,
        )))
    }

    /// Gives up a synchronisation [`begin`](Self::begin) started before
    /// anything was handed over (nothing will go early after all): its
    /// bucket buffers come back for the next one.
    pub fn abandon(&mut self, round: SyncRound) {
        debug_assert_eq!(round.sent(), 0, "abandoned after buckets left");
        if round.sent() == 0 {
            self.host_buckets = round.into_buffers();
        }
    }

    /// Ends a synchronisation [`begin`](Self::begin) started with the
    /// gradients of `set` (the same parameters): every gradient not handed
    /// over yet is read, the remaining buckets sent, every average written
    /// back. Returns what it cost, `None` when no rank had a gradient.
    /// Collective, as [`synchronize`](Self::synchronize).
    pub fn finish(
        &mut self,
        mut round: SyncRound,
        set: &mut dyn GradientSet,
    ) -> Result<Option<SyncStats>> {
        let result = round.finish(set);
        let mut buffers = round.into_buffers();
        // A failed round may keep buffers on its dead thread: fresh ones then.
        buffers.resize_with(self.planned.plan.buckets.len(), AlignedBuf::default);
        self.host_buckets = buffers;
        let stats = result?;
        if let Some(stats) = &stats {
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
            self.stats.add(stats);
        }
        Ok(stats)
    }

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
