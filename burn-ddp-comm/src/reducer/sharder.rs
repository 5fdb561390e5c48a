//! ZeRO stage 1's communication: after backward each rank receives the
//! averaged gradients of the parameters it owns (a reduce-scatter, where
//! plain DDP all-reduces), its optimizer steps only those, and every rank
//! then receives each updated parameter from its owner (an all-gather). The
//! two together move the bytes of one all-reduce.
//!
//! Like the [`Reducer`](super::Reducer) it knows parameters only by layout:
//! a front-end hands gradients and values over through a [`GradientSet`].

use super::gradient_set::{GradientSet, Placement};
use super::layout::{self, check_same_layout, ParamLayout};
use super::shard_plan::{RoundMode, ShardPlan};
use super::stats::SyncStats;
#[cfg(feature = "nccl")]
use crate::element::DeviceBuffer;
use crate::element::{AlignedBuf, BufferMut, ReduceOp};
use crate::error::{CommError, Result};
use crate::group::{ProcessGroup, WeakProcessGroup};
use std::time::Instant;

/// The owners, rounds and buffers of one model's sharded optimizer.
pub struct Sharder {
    group: WeakProcessGroup,
    rank: usize,
    cap_bytes: usize,
    padding_limit: f64,
    layout: Vec<ParamLayout>,
    plan: ShardPlan,
    /// One host buffer per round, reused across steps (gradients in, this
    /// rank's averaged chunk out; then the values).
    buffers: Vec<AlignedBuf>,
    stats: SyncStats,
}

impl Clone for Sharder {
    /// A sharder with the same group, settings and plan (its buffers are
    /// its own, made at its first step).
    fn clone(&self) -> Self {
        Self {
            group: self.group.clone(),
            rank: self.rank,
            cap_bytes: self.cap_bytes,
            padding_limit: self.padding_limit,
            layout: self.layout.clone(),
            plan: self.plan.clone(),
            buffers: Vec::new(),
            stats: self.stats,
        }
    }
}

impl Sharder {
    /// A sharder over `group`, with rounds of about `cap_bytes` (PyTorch's
    /// bucket cap) and padding allowed up to `padding_limit` times a round's
    /// elements before the round is replicated instead.
    pub fn new(group: &ProcessGroup, cap_bytes: usize, padding_limit: f64) -> Self {
        Self {
            group: group.downgrade(),
            rank: group.rank(),
            cap_bytes: cap_bytes.max(1),
            padding_limit,
            layout: Vec::new(),
            plan: ShardPlan::default(),
            buffers: Vec::new(),
            stats: SyncStats::default(),
        }
    }

    /// The group it shards over, while it lives.
    pub fn group(&self) -> Result<ProcessGroup> {
        self.group.upgrade().ok_or(CommError::Destroyed)
    }

    /// The plan of the last layout seen (empty before the first step).
    pub fn plan(&self) -> &ShardPlan {
        &self.plan
    }

    /// Whether this rank owns parameter `index` of the current plan.
    pub fn owns(&self, index: usize) -> bool {
        self.plan.owners.get(index) == Some(&self.rank)
    }

    /// What the collectives moved so far (gradients and values).
    pub fn stats(&self) -> SyncStats {
        self.stats
    }

    /// The plan for `layout` over the group, without communicating: what
    /// [`scatter_gradients`](Self::scatter_gradients) would use (to split a
    /// checkpoint's optimizer state, say).
    pub fn plan_for(&mut self, layout: Vec<ParamLayout>) -> Result<&ShardPlan> {
        let world = self.group()?.world_size();
        if layout != self.layout || self.plan.owners.len() != layout.len() {
            self.plan = ShardPlan::new(&layout, world, self.cap_bytes, self.padding_limit);
            self.layout = layout;
            self.buffers.clear();
        }
        self.buffers
            .resize_with(self.plan.rounds.len(), AlignedBuf::default);
        Ok(&self.plan)
    }

    /// Averages every gradient of `set` over the ranks, writing back only
    /// those of the parameters this rank owns. `Ok(false)`: nothing moved (a
    /// world of one, or no rank had a gradient), nothing was written.
    ///
    /// Collective, with the same layout on every rank (checked in one small
    /// collective; a mismatch fails on every rank naming the difference). A
    /// parameter without a gradient counts as zero.
    pub fn scatter_gradients(&mut self, set: &mut dyn GradientSet) -> Result<bool> {
        let group = self.group()?;
        if !group.synchronizes() {
            return Ok(false);
        }
        let layout: Vec<ParamLayout> = set.params().iter().map(|p| p.layout.clone()).collect();
        let agreement = layout::agree(&group, layout.iter(), set.has_gradients())?;
        if !agreement.same_layout {
            check_same_layout(&group, &layout)?;
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
        self.plan_for(layout)?;
        let mut stats = SyncStats {
            syncs: 1,
            ..SyncStats::default()
        };
        if on_device(&group, set)? {
            for index in 0..self.plan.rounds.len() {
                self.scatter_on_device(&group, index, set, &mut stats)?;
            }
            self.stats.add(&stats);
            return Ok(true);
        }
        for (round, buffer) in self.plan.rounds.iter().zip(&mut self.buffers) {
            let started = Instant::now();
            let size = round.dtype.size();
            let bytes = buffer.bytes(round.numel * size);
            bytes.fill(0); // the padding
            for (_, param, offset) in round.all_members() {
                let len = self.layout[param].numel() * size;
                set.read_host(param, &mut bytes[offset * size..offset * size + len])?;
            }
            let packed = Instant::now();
            let data = BufferMut::from_bytes(round.dtype, bytes).expect("an aligned round");
            match round.mode {
                RoundMode::Sharded => group.reduce_scatter_in_place(data, ReduceOp::Mean)?,
                RoundMode::Replicated => group.all_reduce_buffer(data, ReduceOp::Mean)?,
            }
            let reduced = Instant::now();
            for (&param, &offset) in round.members[self.rank]
                .iter()
                .zip(&round.offsets[self.rank])
            {
                let len = self.layout[param].numel() * size;
                set.write_host(param, &bytes[offset * size..offset * size + len])?;
            }
            stats.count_bucket_since(round.numel * size, [started, packed, reduced]);
        }
        self.stats.add(&stats);
        Ok(true)
    }

    /// Every parameter's value from its owner: `set` is read for the
    /// parameters this rank owns and written for every other one. Call it
    /// after stepping the owned parameters, with the layout of the last
    /// [`scatter_gradients`](Self::scatter_gradients). Collective.
    pub fn gather_values(&mut self, set: &mut dyn GradientSet) -> Result<()> {
        let group = self.group()?;
        if !group.synchronizes() {
            return Ok(());
        }
        let same = set.params().len() == self.layout.len()
            && set
                .params()
                .iter()
                .zip(&self.layout)
                .all(|(p, l)| &p.layout == l);
        if !same {
            return Err(CommError::InvalidArgument {
                rank: self.rank,
                message: "the parameters to gather are not those whose gradients were \
                          scattered: step the same model the gradients came from"
                    .into(),
            });
        }
        let mut stats = SyncStats::default();
        if on_device(&group, set)? {
            for index in 0..self.plan.rounds.len() {
                self.gather_on_device(&group, index, set, &mut stats)?;
            }
            self.stats.add(&stats);
            return Ok(());
        }
        for (round, buffer) in self.plan.rounds.iter().zip(&mut self.buffers) {
            let started = Instant::now();
            let size = round.dtype.size();
            let bytes = buffer.bytes(round.numel * size);
            // This rank's chunk: its parameters' new values, then padding.
            let (start, len) = round.chunks[self.rank];
            let chunk_end = match round.mode {
                RoundMode::Sharded => start + round.numel / round.members.len(),
                RoundMode::Replicated => start + len,
            };
            bytes[(start + len) * size..chunk_end * size].fill(0);
            for (&param, &offset) in round.members[self.rank]
                .iter()
                .zip(&round.offsets[self.rank])
            {
                let n = self.layout[param].numel() * size;
                set.read_host(param, &mut bytes[offset * size..offset * size + n])?;
            }
            let packed = Instant::now();
            match round.mode {
                RoundMode::Sharded => {
                    let data = BufferMut::from_bytes(round.dtype, bytes).expect("an aligned round");
                    group.all_gather_in_place(data)?;
                }
                RoundMode::Replicated => {
                    for (owner, &(start, len)) in round.chunks.iter().enumerate() {
                        if len > 0 {
                            let part = &mut bytes[start * size..(start + len) * size];
                            group.broadcast_bytes(round.dtype, part, owner)?;
                        }
                    }
                }
            }
            let reduced = Instant::now();
            for (owner, param, offset) in round.all_members() {
                if owner != self.rank {
                    let n = self.layout[param].numel() * size;
                    set.write_host(param, &bytes[offset * size..offset * size + n])?;
                }
            }
            stats.count_bucket_since(round.numel * size, [started, packed, reduced]);
        }
        self.stats.add(&stats);
        Ok(())
    }

    /// One round of gradients on the GPU: the front-end packs every rank's
    /// chunk (with its padding) into one device buffer, NCCL reduce-scatters
    /// it in place (or all-reduces a replicated round), the front-end takes
    /// back this rank's averages.
    #[cfg(feature = "nccl")]
    fn scatter_on_device(
        &self,
        group: &ProcessGroup,
        index: usize,
        set: &mut dyn GradientSet,
        stats: &mut SyncStats,
    ) -> Result<()> {
        let started = Instant::now();
        let round = &self.plan.rounds[index];
        let pieces = round.pieces(|_| true);
        let bucket = set.pack_device_pieces(&pieces, round.dtype)?;
        let packed = Instant::now();
        let whole = bucket.buffer();
        // SAFETY: `DeviceBucket::new`'s contract: live, fully written device
        // memory of the round's elements, used by nobody else until it is
        // handed back; the views lie inside it; each call returns once NCCL
        // is done with it. In place, as NCCL allows: this rank's chunk is at
        // `rank * chunk` of the send buffer.
        unsafe {
            match round.mode {
                RoundMode::Sharded => {
                    let chunk = round.numel / round.members.len();
                    let mine = view(whole, self.rank * chunk, chunk);
                    group.reduce_scatter_device(whole, mine, ReduceOp::Mean)?
                }
                RoundMode::Replicated => group.all_reduce_device(whole, ReduceOp::Mean)?,
            }
        }
        let reduced = Instant::now();
        set.unpack_device(&round.members[self.rank], &round.offsets[self.rank], bucket)?;
        stats.device_buckets += 1;
        stats.count_bucket_since(round.numel * round.dtype.size(), [started, packed, reduced]);
        Ok(())
    }

    /// One round of values on the GPU: this rank's chunk packed among zeros,
    /// NCCL all-gathers it in place (or each owner broadcasts its part of a
    /// replicated round), the front-end takes back the other ranks' values.
    #[cfg(feature = "nccl")]
    fn gather_on_device(
        &self,
        group: &ProcessGroup,
        index: usize,
        set: &mut dyn GradientSet,
        stats: &mut SyncStats,
    ) -> Result<()> {
        let started = Instant::now();
        let round = &self.plan.rounds[index];
        let pieces = round.pieces(|owner| owner == self.rank);
        let bucket = set.pack_device_pieces(&pieces, round.dtype)?;
        let packed = Instant::now();
        let whole = bucket.buffer();
        // SAFETY: as in `scatter_on_device`; this rank's chunk is at
        // `rank * chunk` of the receive buffer, as NCCL's in-place
        // all-gather wants.
        unsafe {
            match round.mode {
                RoundMode::Sharded => {
                    let chunk = round.numel / round.members.len();
                    let mine = view(whole, self.rank * chunk, chunk);
                    group.all_gather_device(mine, whole)?
                }
                RoundMode::Replicated => {
                    for (owner, &(start, len)) in round.chunks.iter().enumerate() {
                        if len > 0 {
                            group.broadcast_device(view(whole, start, len), owner)?;
                        }
                    }
                }
            }
        }
        let reduced = Instant::now();
        let (others, offsets): (Vec<usize>, Vec<usize>) = round
            .all_members()
            .filter(|&(owner, _, _)| owner != self.rank)
            .map(|(_, param, offset)| (param, offset))
            .unzip();
        set.unpack_device(&others, &offsets, bucket)?;
        stats.device_buckets += 1;
        stats.count_bucket_since(round.numel * round.dtype.size(), [started, packed, reduced]);
        Ok(())
    }

    #[cfg(not(feature = "nccl"))]
    fn scatter_on_device(
        &self,
        _group: &ProcessGroup,
        _index: usize,
        _set: &mut dyn GradientSet,
        _stats: &mut SyncStats,
    ) -> Result<()> {
        unreachable!("without NCCL the group never reduces on the device")
    }

    #[cfg(not(feature = "nccl"))]
    fn gather_on_device(
        &self,
        _group: &ProcessGroup,
        _index: usize,
        _set: &mut dyn GradientSet,
        _stats: &mut SyncStats,
    ) -> Result<()> {
        unreachable!("without NCCL the group never reduces on the device")
    }
}

/// Whether `set`'s rounds run on the GPU (its parameters on a device the
/// group reduces on over NCCL).
fn on_device(group: &ProcessGroup, set: &dyn GradientSet) -> Result<bool> {
    match super::one_placement(group.rank(), set.params())? {
        Some(Placement::Device { ordinal }) => group.uses_device_collectives(ordinal),
        _ => Ok(false),
    }
}

/// `len` elements of `buffer` from element `offset`.
#[cfg(feature = "nccl")]
fn view(buffer: DeviceBuffer, offset: usize, len: usize) -> DeviceBuffer {
    DeviceBuffer {
        ptr: buffer.ptr + (offset * buffer.dtype.size()) as u64,
        len,
        dtype: buffer.dtype,
    }
}
