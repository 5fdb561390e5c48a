//! One synchronisation, from [`Reducer::begin`](super::Reducer::begin) to
//! [`Reducer::finish`](super::Reducer::finish): gradients may be handed
//! over one by one as they become final ([`SyncRound::ready`], during backward),
//! and each bucket leaves for the communication thread as soon as it and
//! every bucket before it are complete; `finish` reads the rest, sends what
//! is left and writes every average back.

use super::comm_thread::{Averaging, CommThread, Job, Landed, Packed};
use super::gradient_set::{DeviceBucket, GradientSet, PendingDeviceBucket};
use super::layout::ParamLayout;
use super::plan::BucketPlan;
use super::stats::SyncStats;
use crate::element::{AlignedBuf, DType};
use crate::error::{CommError, Result};
use std::any::Any;
use std::sync::Arc;
use std::time::Instant;

/// A layout and its bucket plan, with where each parameter sits.
#[derive(Debug, Default)]
pub(super) struct Planned {
    /// Shared with the agreement each round runs.
    pub layout: Arc<Vec<ParamLayout>>,
    pub plan: BucketPlan,
    /// Per parameter: its bucket and its first element there.
    pub place: Vec<(usize, usize)>,
}

impl Planned {
    pub fn new(layout: Vec<ParamLayout>, plan: BucketPlan) -> Self {
        let mut place = vec![(0, 0); layout.len()];
        for (index, bucket) in plan.buckets.iter().enumerate() {
            for (&param, &offset) in plan.members(index).iter().zip(&bucket.offsets) {
                place[param] = (index, offset);
            }
        }
        Self {
            layout: Arc::new(layout),
            plan,
            place,
        }
    }

    fn bucket_bytes(&self, index: usize) -> usize {
        let bucket = &self.plan.buckets[index];
        bucket.numel * bucket.dtype.size()
    }

    /// Parameter `param`'s byte range in its bucket.
    fn range(&self, param: usize) -> std::ops::Range<usize> {
        let (bucket, offset) = self.place[param];
        let start = offset * self.plan.buckets[bucket].dtype.size();
        start..start + self.layout[param].bytes()
    }
}

/// Packs one complete bucket on the device, given its members, element
/// count and type ([`SyncRound::ready_on_device`]).
pub type PackOnDevice<'a> = dyn FnMut(&[usize], usize, DType) -> Result<PendingDeviceBucket> + 'a;

/// Where the ranks' agreement stands.
enum Agreement {
    NotAsked,
    /// Handed to the communication thread, ahead of the first bucket.
    Asked,
    /// Some rank has gradients: the buckets go.
    Reached,
}

/// One synchronisation in progress: through host memory, or on the GPU
/// (NCCL) with [`SyncRound::ready_on_device`].
pub struct SyncRound {
    averaging: Averaging,
    planned: Arc<Planned>,
    layout: Arc<Vec<ParamLayout>>,
    buffers: Vec<AlignedBuf>,
    /// Per bucket: members not read yet.
    unread: Vec<usize>,
    read: Vec<bool>,
    /// Buckets handed over (always a prefix), and buckets written back.
    submitted: usize,
    unpacked: usize,
    /// Reduced by NCCL on the GPU, not through host memory.
    on_device: bool,

    agreement: Agreement,
    /// Declared before `device_kept`, so dropped first: its thread is joined
    /// (NCCL done with every bucket) before their memory may go.
    comm: Option<CommThread>,
    /// Per bucket sent during backward on the GPU path: what holds its
    /// memory until `finish` hands it back to the front-end.
    device_kept: Vec<Option<Box<dyn Any>>>,
    pub(super) stats: SyncStats,
}

impl SyncRound {
    pub(super) fn new(
        averaging: Averaging,
        planned: Arc<Planned>,
        buffers: Vec<AlignedBuf>,
        on_device: bool,
    ) -> Self {
        let unread: Vec<usize> = planned.plan.buckets.iter().map(|b| b.slots.len()).collect();
        let device_kept = unread.iter().map(|_| None).collect();
        Self {
            averaging,
            layout: planned.layout.clone(),
            read: vec![false; planned.layout.len()],
            planned,
            buffers,
            unread,
            submitted: 0,
            unpacked: 0,
            on_device,
            agreement: Agreement::NotAsked,
            comm: None,
            device_kept,
            stats: SyncStats {
                syncs: 1,
                ..SyncStats::default()
            },
        }
    }

    /// Whether its buckets are averaged on the GPU (NCCL): gradients are then
    /// handed over with [`ready_on_device`](Self::ready_on_device), not
    /// [`ready`](Self::ready).
    pub fn on_device(&self) -> bool {
        self.on_device
    }

    /// Parameter `param`'s gradient is final: `read` writes it into its
    /// slot of the bucket (exactly `layout.bytes()` bytes), and every bucket
    /// now complete, in order, leaves for the communication thread. The
    /// parameter is not read again at [`finish`](super::Reducer::finish).
    /// The ranks need not hand them over in the same order: the buckets
    /// leave in the same order everywhere. On the GPU path nothing happens
    /// (see [`ready_on_device`](Self::ready_on_device)).
    pub fn ready(
        &mut self,
        param: usize,
        read: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<()> {
        if self.on_device || self.read[param] {
            return Ok(());
        }
        self.read_into_bucket(param, read)?;
        let sent = self.submitted;
        self.send_complete_buckets()?;
        self.stats.early_buckets += (self.submitted - sent) as u64;
        Ok(())
    }

    /// Parameter `param` gets no gradient in this pass (an unused one): its
    /// slot is zeros, as [`finish`](super::Reducer::finish) would read it.
    /// Nothing is sent on its account; the next [`ready`](Self::ready)
    /// sends every bucket it completed.
    pub fn zero(&mut self, param: usize) {
        if self.read[param] {
            return;
        }
        if self.on_device {
            // Its bucket's packing puts zeros in its place.
            self.mark_read(param);
            return;
        }
        let zeros = |out: &mut [u8]| {
            out.fill(0);
            Ok(())
        };
        self.read_into_bucket(param, zeros)
            .expect("filling a bucket slot with zeros cannot fail");
    }

    fn read_into_bucket(
        &mut self,
        param: usize,
        read: impl FnOnce(&mut [u8]) -> Result<()>,
    ) -> Result<()> {
        let started = Instant::now();
        let bucket = self.planned.place[param].0;
        let bytes = self.buffers[bucket].bytes(self.planned.bucket_bytes(bucket));
        read(&mut bytes[self.planned.range(param)])?;
        self.mark_read(param);
        self.stats.pack += started.elapsed();
        Ok(())
    }

    fn mark_read(&mut self, param: usize) {
        self.read[param] = true;
        self.unread[self.planned.place[param].0] -= 1;
    }

    /// The GPU path's [`ready`](Self::ready): parameter `param`'s gradient
    /// is final (the front-end keeps it). Every bucket now complete, in
    /// order, is packed by `pack` (its members, its element count and type;
    /// the kernels may still be queued) and leaves for the communication
    /// thread, which waits on the bucket's fence and has NCCL average it
    /// while backward goes on. `finish` hands each back to the front-end.
    pub fn ready_on_device(&mut self, param: usize, pack: &mut PackOnDevice<'_>) -> Result<()> {
        if !self.on_device || self.read[param] {
            return Ok(());
        }
        self.mark_read(param);
        while self.submitted < self.unread.len() && self.unread[self.submitted] == 0 {
            self.ask_agreement_first()?;
            let index = self.submitted;
            let planned = self.planned.clone();
            let bucket = &planned.plan.buckets[index];
            let started = Instant::now();
            let pending = pack(planned.plan.members(index), bucket.numel, bucket.dtype)?;
            self.stats.pack += started.elapsed();
            self.device_kept[index] = Some(pending.keep);
            self.submit(Job::DeviceBucket {
                index,
                fence: pending.fence,
            })?;
            self.submitted += 1;
            self.stats.early_buckets += 1;
        }
        Ok(())
    }

    /// Sends the agreement ahead of the first bucket, if nobody asked for it
    /// yet (this rank has a gradient then: whatever the others say, some
    /// rank has).
    fn ask_agreement_first(&mut self) -> Result<()> {
        if let Agreement::NotAsked = self.agreement {
            self.submit(Job::Agree {
                layout: self.layout.clone(),
                has_gradients: true,
            })?;
            self.agreement = Agreement::Asked;
        }
        Ok(())
    }

    /// Hands over every complete bucket after the last one handed over,
    /// preceded by the agreement if nobody asked for it yet.
    fn send_complete_buckets(&mut self) -> Result<()> {
        while self.submitted < self.unread.len() && self.unread[self.submitted] == 0 {
            self.ask_agreement_first()?;
            let packed = self.take_packed(self.submitted);
            self.submit(Job::Bucket(packed))?;
            self.submitted += 1;
        }
        Ok(())
    }

    fn take_packed(&mut self, index: usize) -> Packed {
        Packed {
            index,
            buffer: std::mem::take(&mut self.buffers[index]),
            bytes: self.planned.bucket_bytes(index),
            dtype: self.planned.plan.buckets[index].dtype,
        }
    }

    fn submit(&mut self, job: Job) -> Result<()> {
        if self.comm.is_none() {
            self.comm = Some(CommThread::start(self.averaging.clone())?);
        }
        let comm = self.comm.as_mut().expect("started above");
        if comm.submit(job) {
            return Ok(());
        }
        // Stopped on a failure: that is the error to report.
        while let Some(landed) = comm.next_landed() {
            if let Landed::Agreed {
                any_gradients: Err(err),
                ..
            }
            | Landed::Bucket {
                result: Err(err), ..
            }
            | Landed::DeviceBucket {
                result: Err(err), ..
            } = landed
            {
                return Err(err);
            }
        }
        Err(self.thread_lost())
    }

    /// Reads every gradient not handed over yet, sends the rest and writes
    /// every average back; `None` when no rank had a gradient.
    pub(super) fn finish(&mut self, set: &mut dyn GradientSet) -> Result<Option<SyncStats>> {
        if let Agreement::NotAsked = self.agreement {
            if !self.agree_first(set.has_gradients())? {
                return Ok(None);
            }
        }
        if self.on_device {
            return self.finish_on_device(set).map(Some);
        }
        self.keep_read_ones(set);
        if self.comm.is_none() {
            // Nothing sent during backward: nothing left to overlap with, so
            // bucket after bucket on this thread (a thread's hand-offs cost
            // more than packing the next bucket saves on the host).
            self.read_rest(set)?;
            for index in 0..self.unread.len() {
                let packed = self.take_packed(index);
                let landed = self.averaging.run(Job::Bucket(packed));
                self.unpack(landed, set)?;
            }
            return Ok(Some(self.stats));
        }
        // Buckets filled before finish by zeros alone go first.
        self.send_complete_buckets()?;
        for param in self.planned.plan.order.clone() {
            if !self.read[param] {
                self.read_into_bucket(param, |out| set.read_host(param, out))?;
                self.send_complete_buckets()?;
                self.unpack_landed(set, false)?;
            }
        }
        self.unpack_landed(set, true)?;
        if self.unpacked != self.unread.len() {
            return Err(self.thread_lost());
        }
        if let Some(comm) = self.comm.take() {
            comm.join();
        }
        Ok(Some(self.stats))
    }

    /// The set may keep the memory of the gradients read before `finish`.
    fn keep_read_ones(&self, set: &mut dyn GradientSet) {
        (0..self.read.len())
            .filter(|&param| self.read[param])
            .for_each(|param| set.keep_for_average(param));
    }

    fn read_rest(&mut self, set: &mut dyn GradientSet) -> Result<()> {
        for param in self.planned.plan.order.clone() {
            if !self.read[param] {
                self.read_into_bucket(param, |out| set.read_host(param, out))?;
            }
        }
        Ok(())
    }

    /// The agreement before anything was handed over: on this thread (it is
    /// the only job, nothing to overlap it with).
    fn agree_first(&mut self, has_gradients: bool) -> Result<bool> {
        let landed = self.averaging.run(Job::Agree {
            layout: self.layout.clone(),
            has_gradients,
        });
        let Landed::Agreed {
            any_gradients,
            took,
        } = landed
        else {
            unreachable!("an agreement lands as one");
        };
        self.stats.wait = took;
        let any = any_gradients?;
        if any {
            self.agreement = Agreement::Reached;
        }
        Ok(any)
    }

    /// Writes back what has landed: all of it, waiting, with `wait`.
    fn unpack_landed(&mut self, set: &mut dyn GradientSet, wait: bool) -> Result<()> {
        loop {
            let Some(comm) = self.comm.as_mut() else {
                return Ok(());
            };
            let landed = if wait {
                comm.next_landed()
            } else {
                comm.try_landed()
            };
            let Some(landed) = landed else {
                break;
            };
            self.unpack(landed, set)?;
        }
        Ok(())
    }

    fn unpack(&mut self, landed: Landed, set: &mut dyn GradientSet) -> Result<()> {
        match landed {
            Landed::Agreed {
                any_gradients,
                took,
            } => {
                self.stats.wait = took;
                // Asked for because this rank had a gradient: the answer is yes.
                any_gradients?;
                self.agreement = Agreement::Reached;
                Ok(())
            }
            Landed::Bucket {
                mut packed,
                reduce,
                result,
            } => {
                result?;
                let started = Instant::now();
                let bytes = packed.buffer.bytes(packed.bytes);
                for &param in self.planned.plan.members(packed.index) {
                    set.write_host(param, &bytes[self.planned.range(param)])?;
                }
                self.stats
                    .count_bucket(packed.bytes, reduce, started.elapsed());
                self.buffers[packed.index] = packed.buffer;
                self.unpacked += 1;
                Ok(())
            }
            Landed::DeviceBucket {
                index,
                buffer,
                reduce,
                result,
            } => {
                result?;
                let started = Instant::now();
                let (Some(buffer), Some(keep)) = (buffer, self.device_kept[index].take()) else {
                    return Err(self.thread_lost());
                };
                // SAFETY: the fence gave this memory once written, NCCL is done
                // with it (the job landed), and `keep` has held it since packing.
                let averaged = unsafe { DeviceBucket::new(buffer, keep) };
                let planned = self.planned.clone();
                let bucket = &planned.plan.buckets[index];
                set.unpack_device(planned.plan.members(index), &bucket.offsets, averaged)?;
                self.stats.device_buckets += 1;
                let bytes = bucket.numel * bucket.dtype.size();
                self.stats.count_bucket(bytes, reduce, started.elapsed());
                self.unpacked += 1;
                Ok(())
            }
        }
    }

    fn thread_lost(&self) -> CommError {
        CommError::InvalidArgument {
            rank: self.averaging.group.rank(),
            message: "the gradient communication thread ended before its buckets came back".into(),
        }
    }

    /// The buckets sent during backward land first (in order); then every
    /// other bucket on the GPU, one after the other: the front-end packs it
    /// into one device buffer, NCCL averages it in place, the front-end
    /// unpacks it.
    fn finish_on_device(&mut self, set: &mut dyn GradientSet) -> Result<SyncStats> {
        self.unpack_landed(set, true)?;
        if self.unpacked != self.submitted {
            return Err(self.thread_lost());
        }
        if let Some(comm) = self.comm.take() {
            comm.join();
        }
        for index in self.submitted..self.unread.len() {
            let started = Instant::now();
            let bucket = &self.planned.plan.buckets[index];
            let members = self.planned.plan.members(index);
            let packed_bucket = set.pack_device(members, bucket.numel, bucket.dtype)?;
            let packed = Instant::now();
            // `DeviceBucket::new`'s contract: live, fully written device memory
            // of `numel` elements, used by nobody else until it is handed back
            // below; the call returns once NCCL is done with it.
            (self.averaging.device_mean)(&self.averaging.group, packed_bucket.buffer())?;
            let reduced = Instant::now();
            set.unpack_device(members, &bucket.offsets, packed_bucket)?;
            self.stats.device_buckets += 1;
            let bytes = bucket.numel * bucket.dtype.size();
            self.stats
                .count_bucket_since(bytes, [started, packed, reduced]);
        }
        Ok(self.stats)
    }

    /// Buckets handed to the communication thread so far.
    pub(super) fn sent(&self) -> usize {
        self.submitted
    }

    /// The bucket buffers, for the next synchronisation.
    pub(super) fn into_buffers(self) -> Vec<AlignedBuf> {
        self.buffers
    }
}
