//! The interface between the reducer and a front-end (the Burn 0.21 crate, a
//! Burn 0.22 crate, anything else that has gradients): the front-end lists its
//! parameters and moves each gradient in and out as bytes, or a bucket of
//! them as one device buffer; the reducer does everything else.

use super::layout::ParamLayout;
use crate::element::{DType, DeviceBuffer};
use crate::error::{CommError, Result};
use std::any::Any;

/// Where a gradient lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placement {
    /// Host memory (CPU backends, or any tensor read back to the host).
    Host,
    /// The memory of GPU `ordinal` (`cuda:ordinal`), which NCCL can work on.
    Device {
        /// The GPU's index among those this process sees.
        ordinal: usize,
    },
}

/// One piece of a sharded optimizer's round on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    /// Parameter `index`'s gradient (or value).
    Param(usize),
    /// This many zeros (padding, or another rank's chunk).
    Zeros(usize),
}

/// One parameter taking part in a synchronisation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamInfo {
    /// The front-end's id for it (for messages; the reducer goes by position).
    pub id: u64,
    /// Its gradient's shape and element type.
    pub layout: ParamLayout,
    /// Where its gradient lives.
    pub placement: Placement,
}

/// A packed device buffer holding one bucket's gradients, with whatever keeps
/// its memory alive until the front-end takes it back.
pub struct DeviceBucket {
    buffer: DeviceBuffer,
    keep: Box<dyn Any>,
}

impl DeviceBucket {
    /// A bucket in `buffer`, kept alive by `keep` (the front-end's tensor and
    /// its pinned allocation).
    ///
    /// # Safety
    /// `buffer` must be live device memory holding its `len` elements, fully
    /// written (every kernel writing it has finished), on the GPU the group
    /// reduces on, and used by nothing else until the bucket is handed back
    /// to [`GradientSet::unpack_device`] (it is reduced in place meanwhile).
    pub unsafe fn new(buffer: DeviceBuffer, keep: Box<dyn Any>) -> Self {
        Self { buffer, keep }
    }

    /// The device memory.
    pub fn buffer(&self) -> DeviceBuffer {
        self.buffer
    }

    /// What the front-end keeps alive with it.
    pub fn into_keep(self) -> Box<dyn Any> {
        self.keep
    }
}

/// Waits, on the thread that calls it, for every kernel writing a bucket
/// packed during backward, and gives the bucket's device memory. On CUDA the
/// producing stream's work is ordered before the caller's stream by an event,
/// and only the caller's stream is waited for, not the whole device.
pub type DeviceFence = Box<dyn FnOnce() -> Result<DeviceBuffer> + Send>;

/// A bucket packed on the device while backward still runs (its kernels may
/// still be queued): the communication thread runs its fence, then NCCL
/// averages it in place; `finish` hands it back to
/// [`GradientSet::unpack_device`].
pub struct PendingDeviceBucket {
    pub(super) fence: DeviceFence,
    pub(super) keep: Box<dyn Any>,
}

impl PendingDeviceBucket {
    /// A bucket whose memory `fence` gives once it is written, kept alive by
    /// `keep`.
    ///
    /// # Safety
    /// The memory `fence` returns must be live device memory of its `len`
    /// elements, fully written when `fence` returns, on the GPU the group
    /// reduces on, held by `keep` and used by nothing else until the bucket
    /// is handed back to [`GradientSet::unpack_device`].
    pub unsafe fn new(fence: DeviceFence, keep: Box<dyn Any>) -> Self {
        Self { fence, keep }
    }
}

/// A front-end's gradients for one synchronisation, averaged in place.
///
/// The reducer calls, for every bucket of its plan: either [`read_host`]
/// for each member then [`write_host`] for each (host path), or
/// [`pack_device`] then [`unpack_device`] (device path, when the group
/// reduces device buffers on the GPU). Every parameter is read exactly once
/// and written exactly once.
///
/// [`read_host`]: GradientSet::read_host
/// [`write_host`]: GradientSet::write_host
/// [`pack_device`]: GradientSet::pack_device
/// [`unpack_device`]: GradientSet::unpack_device
pub trait GradientSet {
    /// The parameters, in the same order on every rank (declaration order).
    fn params(&self) -> &[ParamInfo];

    /// Whether this rank has any gradient to share (a rank with none still
    /// takes part, with zeros, if another rank has some).
    fn has_gradients(&self) -> bool {
        true
    }

    /// Writes parameter `index`'s gradient into `out` (exactly
    /// `layout.bytes()` bytes, the elements in row-major order), or zeros if
    /// it has none.
    fn read_host(&mut self, index: usize, out: &mut [u8]) -> Result<()>;

    /// Takes back parameter `index`'s averaged gradient (`layout.bytes()`
    /// bytes).
    fn write_host(&mut self, index: usize, averaged: &[u8]) -> Result<()>;

    /// Parameter `index`'s gradient was read before (handed to a
    /// [`SyncRound`](super::SyncRound) during backward) and will not be read
    /// here: the set may keep its memory for the average
    /// ([`write_host`](Self::write_host)) instead of allocating. A hint.
    fn keep_for_average(&mut self, index: usize) {
        let _ = index;
    }

    /// The gradients of `members` (zeros for missing ones) packed, in that
    /// order, into one device buffer of `numel` elements of `dtype`. Only
    /// called for parameters on a device, when the group reduces on it.
    fn pack_device(
        &mut self,
        members: &[usize],
        numel: usize,
        dtype: DType,
    ) -> Result<DeviceBucket> {
        let _ = (members, numel, dtype);
        Err(CommError::config(
            None,
            "GradientSet",
            "this front-end keeps its gradients in host memory but said they were on a GPU",
        ))
    }

    /// A sharded optimizer's round on the device: `pieces` (parameters'
    /// gradients or values, zeros for missing ones, and runs of zeros) packed,
    /// in that order, into one device buffer of `dtype`. Only called for
    /// parameters on a device, when the group reduces on it.
    fn pack_device_pieces(&mut self, pieces: &[Piece], dtype: DType) -> Result<DeviceBucket> {
        let _ = (pieces, dtype);
        Err(CommError::config(
            None,
            "GradientSet",
            "this front-end keeps its gradients in host memory but said they were on a GPU",
        ))
    }

    /// Takes back the averaged bucket: member `members[i]` is at element
    /// `offsets[i]`.
    fn unpack_device(
        &mut self,
        members: &[usize],
        offsets: &[usize],
        bucket: DeviceBucket,
    ) -> Result<()> {
        let _ = (members, offsets, bucket);
        Err(CommError::config(
            None,
            "GradientSet",
            "this front-end keeps its gradients in host memory but said they were on a GPU",
        ))
    }
}
