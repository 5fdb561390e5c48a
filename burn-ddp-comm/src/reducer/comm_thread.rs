//! The communication thread of a synchronisation that starts during
//! backward: it runs the layout agreement and then each bucket's all-reduce,
//! one at a time and in the order they were handed over, while the caller
//! goes on with backward. Every rank hands over the same sequence,
//! so the collectives match and the sums are those of a bucket-by-bucket
//! loop, bit for bit.
//!
//! Only byte buffers and layouts cross to the thread; the gradients (and
//! whatever framework holds them) stay with the caller. The thread ends with
//! its synchronisation: [`CommThread::join`], or its `Drop` on an error.

use super::gradient_set::DeviceFence;
use super::layout::{agree_on, ParamLayout};
use crate::element::{AlignedBuf, BufferMut, DType, DeviceBuffer, ReduceOp};
use crate::error::{CommError, Result};
use crate::group::ProcessGroup;
use crate::transport::WireCompression;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A packed bucket to average.
pub(super) struct Packed {
    pub index: usize,
    pub buffer: AlignedBuf,
    pub bytes: usize,
    pub dtype: DType,
}

/// Work for the communication thread.
pub(super) enum Job {
    /// The check every synchronisation starts with (see `agree_on`).
    Agree {
        layout: Arc<Vec<ParamLayout>>,
        has_gradients: bool,
    },
    /// One bucket's all-reduce.
    Bucket(Packed),
    /// One bucket's all-reduce on the GPU, once its fence says it is written.
    DeviceBucket { index: usize, fence: DeviceFence },
}

/// A job done.
pub(super) enum Landed {
    /// Whether any rank has gradients, and how long the agreement took (it
    /// absorbs the wait for the slowest rank).
    Agreed {
        any_gradients: Result<bool>,
        took: Duration,
    },
    /// A bucket, averaged unless `result` says otherwise.
    Bucket {
        packed: Packed,
        reduce: Duration,
        result: Result<()>,
    },
    /// A device bucket (its memory, once its fence gave it), averaged
    /// unless `result` says otherwise.
    DeviceBucket {
        index: usize,
        buffer: Option<DeviceBuffer>,
        reduce: Duration,
        result: Result<()>,
    },
}

impl Landed {
    fn failed(&self) -> bool {
        match self {
            Landed::Agreed { any_gradients, .. } => !matches!(any_gradients, Ok(true)),
            Landed::Bucket { result, .. } | Landed::DeviceBucket { result, .. } => result.is_err(),
        }
    }
}

/// How a synchronisation averages: the group, how f32 means cross machines,
/// and how a device buffer is averaged (NCCL; a test's stand-in).
#[derive(Clone)]
pub(super) struct Averaging {
    pub group: ProcessGroup,
    pub compression: WireCompression,
    pub device_mean: DeviceMean,
}

/// Averages a device buffer over the group, in place.
pub(super) type DeviceMean = fn(&ProcessGroup, DeviceBuffer) -> Result<()>;

/// NCCL's average, in place.
pub(super) fn nccl_mean(group: &ProcessGroup, buffer: DeviceBuffer) -> Result<()> {
    #[cfg(feature = "nccl")]
    // SAFETY: `DeviceBucket::new`'s and `PendingDeviceBucket::new`'s contract:
    // live, fully written device memory nothing else uses until it is handed back.
    return unsafe { group.all_reduce_device(buffer, ReduceOp::Mean) };
    #[cfg(not(feature = "nccl"))]
    {
        let _ = buffer;
        Err(CommError::InvalidArgument {
            rank: group.rank(),
            message: "a device bucket in a build without NCCL (a burn-ddp bug; please report it)"
                .into(),
        })
    }
}

impl Averaging {
    /// Does one job, on the calling thread.
    pub fn run(&self, job: Job) -> Landed {
        let started = Instant::now();
        match job {
            Job::Agree {
                layout,
                has_gradients,
            } => Landed::Agreed {
                any_gradients: agree_on(&self.group, &layout, has_gradients),
                took: started.elapsed(),
            },
            Job::Bucket(mut packed) => {
                let result = self.reduce(&mut packed);
                Landed::Bucket {
                    packed,
                    reduce: started.elapsed(),
                    result,
                }
            }
            Job::DeviceBucket { index, fence } => {
                let (buffer, result) = match fence() {
                    Ok(buffer) => (Some(buffer), (self.device_mean)(&self.group, buffer)),
                    Err(err) => (None, Err(err)),
                };
                Landed::DeviceBucket {
                    index,
                    buffer,
                    reduce: started.elapsed(),
                    result,
                }
            }
        }
    }

    fn reduce(&self, packed: &mut Packed) -> Result<()> {
        let (index, len, dtype) = (packed.index, packed.bytes, packed.dtype);
        let Some(data) = BufferMut::from_bytes(dtype, packed.buffer.bytes(len)) else {
            return Err(CommError::InvalidArgument {
                rank: self.group.rank(),
                message: format!("bucket {index}: {len} bytes are not whole {dtype:?} elements"),
            });
        };
        self.group
            .all_reduce_compressed(data, ReduceOp::Mean, self.compression)
    }
}

/// The communication thread of one synchronisation.
pub(super) struct CommThread {
    submit: Option<Sender<Job>>,
    landed: Receiver<Landed>,
    in_flight: usize,
    thread: Option<JoinHandle<()>>,
}

impl CommThread {
    /// Starts the thread; it does what is submitted, in order, and stops
    /// after the first failure (or an agreement that nobody has gradients:
    /// nothing may follow it). An error when the system refuses a thread.
    pub fn start(averaging: Averaging) -> Result<Self> {
        let (submit, jobs) = mpsc::channel::<Job>();
        let (landed_tx, landed) = mpsc::channel();
        let rank = averaging.group.rank();
        let thread = std::thread::Builder::new()
            .name(format!("burn-ddp-comm-{rank}"))
            .spawn(move || {
                for job in jobs {
                    let landed = averaging.run(job);
                    let failed = landed.failed();
                    if landed_tx.send(landed).is_err() || failed {
                        break;
                    }
                }
            })
            .map_err(|err| CommError::InvalidArgument {
                rank,
                message: format!("cannot start the gradient communication thread: {err}"),
            })?;
        Ok(Self {
            submit: Some(submit),
            landed,
            in_flight: 0,
            thread: Some(thread),
        })
    }

    /// Queues a job; `false` when the thread has stopped (after a failure,
    /// which [`next_landed`](Self::next_landed) reports).
    pub fn submit(&mut self, job: Job) -> bool {
        let sent = self
            .submit
            .as_ref()
            .is_some_and(|submit| submit.send(job).is_ok());
        self.in_flight += sent as usize;
        sent
    }

    /// A job done, without waiting.
    pub fn try_landed(&mut self) -> Option<Landed> {
        let landed = self.landed.try_recv().ok()?;
        self.in_flight -= 1;
        Some(landed)
    }

    /// The next job done, waiting for it; `None` once none is in flight (or
    /// the thread stopped).
    pub fn next_landed(&mut self) -> Option<Landed> {
        if self.in_flight == 0 {
            return None;
        }
        let landed = self.landed.recv().ok()?;
        self.in_flight -= 1;
        Some(landed)
    }

    /// Ends the thread: no more jobs; the one under way finishes (bounded by
    /// the group's timeout), queued ones are dropped. A panic on the thread
    /// goes on here, on the caller's.
    pub fn join(mut self) {
        if let Err(panic) = self.stop() {
            std::panic::resume_unwind(panic);
        }
    }

    fn stop(&mut self) -> std::thread::Result<()> {
        self.submit = None;
        // Its next send fails, so it stops after the job under way.
        let (_, closed) = mpsc::channel();
        drop(std::mem::replace(&mut self.landed, closed));
        self.thread.take().map_or(Ok(()), JoinHandle::join)
    }

    /// Whether the thread has ended.
    #[cfg(test)]
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }
}

impl Drop for CommThread {
    /// No thread outlives its synchronisation, even on an error path.
    fn drop(&mut self) {
        if self.stop().is_err() {
            log::error!("the gradient communication thread panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CollectiveBackend;

    fn averaging() -> Averaging {
        // A world of one forced to reduce: the collectives run for real.
        let group = ProcessGroup::builder(0, 1)
            .device_backend(CollectiveBackend::Nccl)
            .build()
            .unwrap();
        Averaging {
            group,
            compression: WireCompression::None,
            device_mean: nccl_mean,
        }
    }

    fn bucket(index: usize, values: &[f32]) -> Job {
        let mut buffer = AlignedBuf::default();
        let bytes = buffer.bytes(values.len() * 4);
        bytes.copy_from_slice(bytemuck::cast_slice(values));
        Job::Bucket(Packed {
            index,
            buffer,
            bytes: values.len() * 4,
            dtype: DType::F32,
        })
    }

    fn wait_until_finished(comm: &CommThread) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !comm.is_finished() {
            assert!(Instant::now() < deadline, "the thread outlived its work");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn jobs_land_in_the_order_they_were_submitted() {
        let mut comm = CommThread::start(averaging()).unwrap();
        let layout = Arc::new(vec![ParamLayout {
            shape: vec![3],
            dtype: DType::F32,
        }]);
        assert!(comm.submit(Job::Agree {
            layout,
            has_gradients: true
        }));
        for index in 0..5 {
            assert!(comm.submit(bucket(index, &[index as f32; 3])));
        }
        let Some(Landed::Agreed { any_gradients, .. }) = comm.next_landed() else {
            panic!("the agreement lands first");
        };
        assert!(any_gradients.unwrap());
        let mut order = Vec::new();
        while let Some(landed) = comm.next_landed() {
            let Landed::Bucket {
                mut packed, result, ..
            } = landed
            else {
                panic!("one agreement only");
            };
            result.unwrap();
            let values: &[f32] = bytemuck::cast_slice(packed.buffer.bytes(packed.bytes));
            assert_eq!(values, [packed.index as f32; 3]);
            order.push(packed.index);
        }
        assert_eq!(order, [0, 1, 2, 3, 4]);
        comm.join();
    }

    #[test]
    fn a_failed_bucket_stops_the_thread_and_is_reported() {
        let mut comm = CommThread::start(averaging()).unwrap();
        let Job::Bucket(mut broken) = bucket(0, &[1.0]) else {
            unreachable!()
        };
        broken.bytes = 3; // not a whole f32
        assert!(comm.submit(Job::Bucket(broken)));
        let Some(Landed::Bucket { result, .. }) = comm.next_landed() else {
            panic!("the bucket lands");
        };
        let err = result.unwrap_err().to_string();
        assert!(
            err.contains("rank 0") && err.contains("bucket 0: 3 bytes are not whole F32"),
            "{err}"
        );
        // The thread has stopped: later jobs are refused, not lost in a queue.
        wait_until_finished(&comm);
        assert!(!comm.submit(bucket(1, &[1.0])));
        assert!(comm.next_landed().is_none());
    }

    #[test]
    fn dropping_it_mid_work_returns_within_a_bound() {
        let mut comm = CommThread::start(averaging()).unwrap();
        for index in 0..200 {
            comm.submit(bucket(index, &[1.0; 1 << 16]));
        }
        let (done, dropped) = mpsc::channel();
        std::thread::spawn(move || {
            drop(comm);
            done.send(()).unwrap();
        });
        dropped
            .recv_timeout(Duration::from_secs(10))
            .expect("dropping the thread's handle returned (its thread joined)");
    }
}
