//! Host buckets in flight: while a communication thread all-reduces bucket
//! `i`, the caller packs bucket `i + 1` and unpacks the buckets that have
//! landed. The collectives still run one at a time and in bucket order, so
//! every rank issues the same sequence and the results are the ones a
//! bucket-by-bucket loop gives, bit for bit.
//!
//! Only byte buffers cross to the thread; the gradients (and whatever
//! framework holds them) stay with the caller. The thread lives for one
//! synchronisation (a scoped thread), so none outlives an error.

use crate::element::{AlignedBuf, BufferMut, DType, ReduceOp};
use crate::error::{CommError, Result};
use crate::group::ProcessGroup;
use crate::transport::WireCompression;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

/// A packed bucket for the communication thread.
pub(super) struct Packed {
    pub index: usize,
    pub buffer: AlignedBuf,
    pub bytes: usize,
    pub dtype: DType,
    /// How long packing it took.
    pub pack: Duration,
}

/// A bucket back from the communication thread, averaged unless `result`
/// says otherwise.
pub(super) struct Landed {
    pub index: usize,
    pub buffer: AlignedBuf,
    pub bytes: usize,
    /// How long packing it took.
    pub pack: Duration,
    /// How long its all-reduce took.
    pub reduce: Duration,
    pub result: Result<()>,
}

/// How the buckets are averaged: the group, and how f32 means cross machines.
#[derive(Clone)]
pub(super) struct Averaging {
    pub group: ProcessGroup,
    pub compression: WireCompression,
}

impl Averaging {
    /// Averages one packed bucket over the group, in place.
    pub fn reduce(&self, mut packed: Packed) -> Landed {
        let started = Instant::now();
        let bytes = packed.buffer.bytes(packed.bytes);
        let result = match BufferMut::from_bytes(packed.dtype, bytes) {
            Some(data) => self
                .group
                .all_reduce_compressed(data, ReduceOp::Mean, self.compression),
            None => Err(CommError::InvalidArgument {
                rank: self.group.rank(),
                message: format!(
                    "bucket {}: {} bytes are not whole {:?} elements",
                    packed.index, packed.bytes, packed.dtype
                ),
            }),
        };
        Landed {
            index: packed.index,
            buffer: packed.buffer,
            bytes: packed.bytes,
            pack: packed.pack,
            reduce: started.elapsed(),
            result,
        }
    }
}

/// The communication thread of one synchronisation.
pub(super) struct CommThread<'scope> {
    submit: Option<Sender<Packed>>,
    landed: Receiver<Landed>,
    in_flight: usize,
    thread: ScopedJoinHandle<'scope, ()>,
}

impl<'scope> CommThread<'scope> {
    /// Starts the thread in `scope`; it averages what is submitted, in order,
    /// and stops after the first failure (the group is unusable then).
    pub fn start<'env>(scope: &'scope Scope<'scope, 'env>, averaging: Averaging) -> Self {
        let (submit, jobs) = mpsc::channel::<Packed>();
        let (landed_tx, landed) = mpsc::channel();
        let thread = scope.spawn(move || {
            for packed in jobs {
                let landed = averaging.reduce(packed);
                let failed = landed.result.is_err();
                if landed_tx.send(landed).is_err() || failed {
                    break;
                }
            }
        });
        Self {
            submit: Some(submit),
            landed,
            in_flight: 0,
            thread,
        }
    }

    /// Queues a packed bucket; `false` when the thread has stopped (a failed
    /// collective, which [`next_landed`](Self::next_landed) reports).
    pub fn submit(&mut self, packed: Packed) -> bool {
        let sent = self
            .submit
            .as_ref()
            .is_some_and(|submit| submit.send(packed).is_ok());
        self.in_flight += sent as usize;
        sent
    }

    /// A bucket that has landed, without waiting.
    pub fn try_landed(&mut self) -> Option<Landed> {
        let landed = self.landed.try_recv().ok()?;
        self.in_flight -= 1;
        Some(landed)
    }

    /// The next bucket to land, waiting for it; `None` once none is in
    /// flight (or the thread stopped).
    pub fn next_landed(&mut self) -> Option<Landed> {
        if self.in_flight == 0 {
            return None;
        }
        let landed = self.landed.recv().ok()?;
        self.in_flight -= 1;
        Some(landed)
    }

    /// No more buckets: the thread ends once the queued ones have landed.
    pub fn close(&mut self) {
        self.submit = None;
    }

    /// Waits for the thread to end (after [`close`](Self::close) and the
    /// last bucket landed, it has nothing left to do); a panic on it goes on
    /// here, on the caller's thread.
    pub fn join(mut self) {
        self.close();
        drop(self.landed);
        if let Err(panic) = self.thread.join() {
            std::panic::resume_unwind(panic);
        }
    }

    /// Whether the thread has ended.
    #[cfg(test)]
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CollectiveBackend;

    fn averaging() -> Averaging {
        // A world of one forced to reduce: the collective runs for real.
        let group = ProcessGroup::builder(0, 1)
            .device_backend(CollectiveBackend::Nccl)
            .build()
            .unwrap();
        Averaging {
            group,
            compression: WireCompression::None,
        }
    }

    fn packed(index: usize, values: &[f32]) -> Packed {
        let mut buffer = AlignedBuf::default();
        let bytes = buffer.bytes(values.len() * 4);
        bytes.copy_from_slice(bytemuck::cast_slice(values));
        Packed {
            index,
            buffer,
            bytes: values.len() * 4,
            dtype: DType::F32,
            pack: Duration::ZERO,
        }
    }

    #[test]
    fn buckets_land_in_the_order_they_were_submitted_and_the_thread_ends() {
        std::thread::scope(|scope| {
            let mut comm = CommThread::start(scope, averaging());
            for index in 0..5 {
                assert!(comm.submit(packed(index, &[index as f32; 3])));
            }
            comm.close();
            let mut order = Vec::new();
            while let Some(mut landed) = comm.next_landed() {
                landed.result.unwrap();
                let values: &[f32] = bytemuck::cast_slice(landed.buffer.bytes(landed.bytes));
                assert_eq!(values, [landed.index as f32; 3]);
                order.push(landed.index);
            }
            assert_eq!(order, [0, 1, 2, 3, 4]);
            let deadline = Instant::now() + Duration::from_secs(10);
            while !comm.is_finished() {
                assert!(Instant::now() < deadline, "the thread outlived its buckets");
                std::thread::sleep(Duration::from_millis(1));
            }
        });
    }

    #[test]
    fn a_failed_bucket_stops_the_thread_and_is_reported() {
        std::thread::scope(|scope| {
            let mut comm = CommThread::start(scope, averaging());
            let mut broken = packed(0, &[1.0]);
            broken.bytes = 3; // not a whole f32
            assert!(comm.submit(broken));
            let err = comm.next_landed().unwrap().result.unwrap_err().to_string();
            assert!(
                err.contains("rank 0") && err.contains("bucket 0: 3 bytes are not whole F32"),
                "{err}"
            );
            // The thread has stopped: later buckets are refused, not lost in a queue.
            let deadline = Instant::now() + Duration::from_secs(10);
            while !comm.is_finished() {
                assert!(Instant::now() < deadline, "the thread outlived its failure");
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(!comm.submit(packed(1, &[1.0])));
            assert!(comm.next_landed().is_none());
            comm.join();
        });
    }
}
