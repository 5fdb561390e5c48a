//! One NCCL communicator per process group: collectives on device buffers,
//! each enqueued on our own CUDA stream and waited for with a deadline.

use super::rendezvous::{share_unique_id, NcclKeys, UNIQUE_ID_BYTES};
use super::wait::{wait_bounded, Progress, WaitError};
use crate::element::{DType, DeviceBuffer, ReduceOp};
use crate::error::{CommError, Result};
use crate::store::Store;
use cudarc::driver::{sys as cu, CudaContext, CudaSlice, CudaStream};
use cudarc::nccl::{result as nccl, sys as nsys};
use std::ffi::CStr;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An NCCL communicator spanning every rank of a process group.
///
/// Calls are serialised and each returns only once the GPU has finished the
/// collective, so buffers may be reused (or freed) as soon as a call returns.
/// A failed or timed-out collective aborts the communicator: NCCL cannot
/// recover from a lost peer, and every later call reports the first failure.
pub struct NcclCommunicator {
    comm: nsys::ncclComm_t,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// One element for barriers.
    scratch: CudaSlice<i32>,
    rank: usize,
    world_size: usize,
    ordinal: usize,
    timeout: Duration,
    /// Why the communicator was aborted, once it has been.
    broken: Mutex<Option<String>>,
}

// SAFETY: the raw communicator is only used under `broken`'s lock, one call at
// a time, which is what NCCL requires of a communicator shared by threads.
unsafe impl Send for NcclCommunicator {}
unsafe impl Sync for NcclCommunicator {}

/// Moves a freshly created communicator out of its init thread.
struct CommHandle(nsys::ncclComm_t);
// SAFETY: the handle is only moved, then used by the receiving thread alone.
unsafe impl Send for CommHandle {}

impl NcclCommunicator {
    /// Creates the communicator on GPU `ordinal`, collectively: rank 0 makes the
    /// unique id, the store hands it to the others (under `keys`, see
    /// `rendezvous`), and every rank joins, bounded by `timeout`.
    pub(crate) fn connect(
        store: &dyn Store,
        keys: &NcclKeys,
        rank: usize,
        world_size: usize,
        ordinal: usize,
        timeout: Duration,
    ) -> Result<Self> {
        // The driver's or NCCL's error is kept as the source.
        let device_error = |what: &str, source: Box<dyn std::error::Error + Send + Sync>| {
            CommError::device(
                rank,
                format!("{what} on cuda:{ordinal}: {source}"),
                Some(source),
            )
        };
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| device_error("cannot open the GPU", Box::new(e)))?;
        let stream = ctx
            .new_stream()
            .map_err(|e| device_error("cannot create a CUDA stream", Box::new(e)))?;
        let scratch = stream
            .alloc_zeros::<i32>(1)
            .map_err(|e| device_error("cannot allocate", Box::new(e)))?;
        let mine = if rank == 0 {
            let id = nccl::get_uniqueid()
                .map_err(|e| device_error("ncclGetUniqueId failed", Box::new(NcclFailure(e.0))))?;
            Some(id.internal.map(|c| c as u8))
        } else {
            None
        };
        let id = share_unique_id(store, keys, rank, mine, timeout)?;
        let comm = init_rank(&ctx, id, rank, world_size, timeout).map_err(|e| match e {
            WaitError::Failed(source) => device_error("ncclCommInitRank failed", source),
            WaitError::TimedOut(after) => CommError::Timeout {
                rank: Some(rank),
                peer: None,
                what: format!(
                    "every rank to join the NCCL communicator on cuda:{ordinal} (a rank may \
                     have died, or reached this point without a CUDA tensor)"
                ),
                after,
            },
        })?;
        Ok(Self {
            comm,
            ctx,
            stream,
            scratch,
            rank,
            world_size,
            ordinal,
            timeout,
            broken: Mutex::new(None),
        })
    }

    /// The GPU this communicator runs on.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Reduces `data` in place across ranks.
    ///
    /// # Safety
    /// `data` must be live device memory on this GPU, holding `len` elements that
    /// are fully written (all kernels writing it finished), and nothing else may
    /// use it until this returns.
    pub unsafe fn all_reduce(&self, data: DeviceBuffer, op: ReduceOp) -> Result<()> {
        self.all_reduce_into(data, data, op)
    }

    /// Writes the reduction of every rank's `send` into `recv` (which may be
    /// `send` itself).
    ///
    /// # Safety
    /// As [`Self::all_reduce`], for both buffers.
    pub unsafe fn all_reduce_into(
        &self,
        send: DeviceBuffer,
        recv: DeviceBuffer,
        op: ReduceOp,
    ) -> Result<()> {
        self.same_shape("all_reduce", send, recv, send.len)?;
        self.run("all_reduce", |comm, stream| unsafe {
            nccl::all_reduce(
                send.ptr as *const _,
                recv.ptr as *mut _,
                send.len,
                data_type(send.dtype),
                reduce_op(op),
                comm,
                stream,
            )
        })
    }

    /// `data` ← the sum over ranks of `scale` × each rank's `data`, in place,
    /// with NCCL's pre-multiplied sum (`ncclRedOpCreatePreMulSum`, NCCL 2.11+).
    /// NCCL applies the scale itself, so even a world of one changes the data:
    /// the GPU check uses it to prove an in-place collective wrote its buffer.
    /// f32 and f64 only.
    ///
    /// # Safety
    /// As [`Self::all_reduce`].
    pub unsafe fn all_reduce_scaled(&self, data: DeviceBuffer, scale: f64) -> Result<()> {
        let mut scale_f32 = scale as f32;
        let mut scale_f64 = scale;
        let scalar: *mut std::ffi::c_void = match data.dtype {
            DType::F32 => (&mut scale_f32 as *mut f32).cast(),
            DType::F64 => (&mut scale_f64 as *mut f64).cast(),
            other => {
                return Err(self.invalid(format!(
                    "all_reduce_scaled takes f32 or f64 buffers, not {other:?}"
                )))
            }
        };
        self.run("all_reduce_scaled", |comm, stream| unsafe {
            // NCCL numbers user operations from ncclNumOps; cudarc types the
            // handle as an enum that ends there, so it is received as an int
            // and used only when it is that first value (it is, as long as each
            // operation is destroyed before the next is made, as here).
            let mut raw: i32 = -1;
            nsys::ncclRedOpCreatePreMulSum(
                (&mut raw as *mut i32).cast::<nsys::ncclRedOp_t>(),
                scalar,
                data_type(data.dtype),
                nsys::ncclScalarResidence_t::ncclScalarHostImmediate,
                comm,
            )
            .result()?;
            if raw != nsys::ncclRedOp_t::ncclNumOps as i32 {
                return Err(nccl::NcclError(nsys::ncclResult_t::ncclInternalError));
            }
            let op = nsys::ncclRedOp_t::ncclNumOps;
            let enqueued = nccl::all_reduce(
                data.ptr as *const _,
                data.ptr as *mut _,
                data.len,
                data_type(data.dtype),
                op,
                comm,
                stream,
            );
            // An operation may be destroyed once the calls using it are enqueued.
            nsys::ncclRedOpDestroy(op, comm).result()?;
            enqueued
        })
    }

    /// Every rank's `send` side by side, in rank order, into `recv`
    /// (`world_size` times as long).
    ///
    /// # Safety
    /// As [`Self::all_reduce`], for both buffers.
    pub unsafe fn all_gather(&self, send: DeviceBuffer, recv: DeviceBuffer) -> Result<()> {
        self.same_shape("all_gather", send, recv, send.len * self.world_size)?;
        self.run("all_gather", |comm, stream| unsafe {
            nccl::all_gather(
                send.ptr as *const _,
                recv.ptr as *mut _,
                send.len,
                data_type(send.dtype),
                comm,
                stream,
            )
        })
    }

    /// Reduces `send` (`world_size` equal chunks) across ranks and writes chunk
    /// `rank` of the result into `recv`.
    ///
    /// # Safety
    /// As [`Self::all_reduce`], for both buffers.
    pub unsafe fn reduce_scatter(
        &self,
        send: DeviceBuffer,
        recv: DeviceBuffer,
        op: ReduceOp,
    ) -> Result<()> {
        if send.len != recv.len * self.world_size {
            return Err(self.invalid(format!(
                "reduce_scatter: the input has {} elements, not {} x the output's {}",
                send.len, self.world_size, recv.len
            )));
        }
        self.same_shape("reduce_scatter", send, recv, recv.len)?;
        self.run("reduce_scatter", |comm, stream| unsafe {
            nccl::reduce_scatter(
                send.ptr as *const _,
                recv.ptr as *mut _,
                recv.len,
                data_type(send.dtype),
                reduce_op(op),
                comm,
                stream,
            )
        })
    }

    /// Copies `data` of rank `root` into `data` on every rank.
    ///
    /// # Safety
    /// As [`Self::all_reduce`].
    pub unsafe fn broadcast(&self, data: DeviceBuffer, root: usize) -> Result<()> {
        if root >= self.world_size {
            return Err(self.invalid(format!(
                "broadcast from rank {root} in a world of {}",
                self.world_size
            )));
        }
        self.run("broadcast", |comm, stream| unsafe {
            nccl::broadcast(
                data.ptr as *const _,
                data.ptr as *mut _,
                data.len,
                data_type(data.dtype),
                root as i32,
                comm,
                stream,
            )
        })
    }

    /// Returns once every rank has called it (a one-element all-reduce).
    pub fn barrier(&self) -> Result<()> {
        let (ptr, _sync) = cudarc::driver::DevicePtr::device_ptr(&self.scratch, &self.stream);
        let scratch = DeviceBuffer {
            ptr,
            len: 1,
            dtype: DType::I32,
        };
        // SAFETY: our own one-element allocation on this GPU, used by nobody else.
        unsafe { self.all_reduce(scratch, ReduceOp::Sum) }
    }

    /// Copies `buffer`'s bytes back to the host, in the order NCCL reads them:
    /// a diagnostic for the GPU check (is the address handed to NCCL the
    /// tensor's values, packed?).
    ///
    /// # Safety
    /// `buffer` must be a live allocation on this communicator's GPU of at
    /// least `len` elements, not written meanwhile.
    pub unsafe fn read_back(&self, buffer: DeviceBuffer) -> Result<Vec<u8>> {
        self.ctx.bind_to_thread().map_err(|e| {
            let message = format!("read_back: cannot use cuda:{}: {e}", self.ordinal);
            self.device(message, Some(Box::new(e)))
        })?;
        let mut bytes = vec![0u8; buffer.len * buffer.dtype.size()];
        // SAFETY: the caller vouches for the allocation; the copy is synchronous.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut bytes, buffer.ptr) }.map_err(
            |e| {
                let message = format!("read_back: copying from the device failed: {e}");
                self.device(message, Some(Box::new(e)))
            },
        )?;
        Ok(bytes)
    }

    fn invalid(&self, message: String) -> CommError {
        CommError::InvalidArgument {
            rank: self.rank,
            message,
        }
    }

    /// `recv` has `recv_len` elements and the type of `send`.
    fn same_shape(
        &self,
        op: &str,
        send: DeviceBuffer,
        recv: DeviceBuffer,
        recv_len: usize,
    ) -> Result<()> {
        if send.dtype != recv.dtype || recv.len != recv_len {
            return Err(self.invalid(format!(
                "{op}: output of {} {:?} elements where {recv_len} {:?} are needed",
                recv.len, recv.dtype, send.dtype
            )));
        }
        Ok(())
    }

    /// Enqueues one collective on our stream and waits for it, bounded.
    fn run(
        &self,
        op: &str,
        enqueue: impl FnOnce(
            nsys::ncclComm_t,
            nsys::cudaStream_t,
        ) -> std::result::Result<nccl::NcclStatus, nccl::NcclError>,
    ) -> Result<()> {
        let mut broken = self.broken.lock().unwrap();
        if let Some(reason) = broken.as_ref() {
            return Err(self.device(
                format!("{op}: the NCCL communicator was aborted earlier ({reason})"),
                None,
            ));
        }
        self.ctx.bind_to_thread().map_err(|e| {
            let message = format!("{op}: cannot use cuda:{}: {e}", self.ordinal);
            self.device(message, Some(Box::new(e)))
        })?;
        let stream = self.stream.cu_stream();
        if let Err(e) = enqueue(self.comm, stream as nsys::cudaStream_t) {
            let source = NcclFailure(e.0);
            let message = format!("{op}: NCCL refused it: {source}");
            return Err(self.device(message, Some(Box::new(source))));
        }
        let comm = self.comm;
        let finished = wait_bounded(self.timeout, || {
            // SAFETY: our stream and communicator, both alive for this call.
            match unsafe { cu::cuStreamQuery(stream) } {
                cu::CUresult::CUDA_SUCCESS => Progress::Done,
                cu::CUresult::CUDA_ERROR_NOT_READY => match unsafe { async_error(comm) } {
                    None => Progress::Pending,
                    Some(reason) => Progress::Failed(reason),
                },
                other => Progress::Failed(Box::new(cudarc::driver::DriverError(other))),
            }
        });
        let error = match finished {
            Ok(()) => return Ok(()),
            Err(WaitError::Failed(reason)) => {
                let message = format!("{op} failed: {reason}; a peer probably died");
                self.device(message, Some(reason))
            }
            Err(WaitError::TimedOut(after)) => CommError::Timeout {
                rank: Some(self.rank),
                peer: None,
                what: format!("NCCL {op} on cuda:{} to finish", self.ordinal),
                after,
            },
        };
        // Aborting unblocks the kernels still waiting for the lost peer.
        // SAFETY: our communicator; nothing else uses it while we hold the lock.
        let _ = unsafe { nccl::comm_abort(self.comm) };
        *broken = Some(error.to_string());
        Err(error)
    }

    fn device(
        &self,
        message: String,
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    ) -> CommError {
        CommError::device(self.rank, message, source)
    }
}

impl Drop for NcclCommunicator {
    fn drop(&mut self) {
        if self.broken.lock().unwrap().is_none() {
            let _ = self.ctx.bind_to_thread();
            // SAFETY: ours, and no call is in flight (we hold `&mut self`).
            let _ = unsafe { nccl::comm_destroy(self.comm) };
        }
    }
}

/// `ncclCommInitRank` on a helper thread, so a rank that never arrives cannot
/// block us past `timeout` (the helper is then abandoned, blocked in NCCL).
fn init_rank(
    ctx: &Arc<CudaContext>,
    id: [u8; UNIQUE_ID_BYTES],
    rank: usize,
    world_size: usize,
    timeout: Duration,
) -> std::result::Result<nsys::ncclComm_t, WaitError> {
    let (done, result) = mpsc::channel();
    let ctx = Arc::clone(ctx);
    std::thread::spawn(move || {
        let outcome = ctx
            .bind_to_thread()
            .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
            .and_then(|()| {
                let id = nsys::ncclUniqueId {
                    internal: id.map(|b| b as std::ffi::c_char),
                };
                let mut comm = std::ptr::null_mut();
                // SAFETY: `comm` is a valid out-pointer; the id came from rank 0.
                unsafe { nccl::comm_init_rank(&mut comm, world_size as i32, id, rank as i32) }
                    .map(|_| CommHandle(comm))
                    .map_err(|e| Box::new(NcclFailure(e.0)) as _)
            });
        let _ = done.send(outcome);
    });
    match result.recv_timeout(timeout) {
        Ok(Ok(handle)) => Ok(handle.0),
        Ok(Err(detail)) => Err(WaitError::Failed(detail)),
        Err(_) => Err(WaitError::TimedOut(timeout)),
    }
}

/// NCCL's asynchronous error for `comm`, if any.
///
/// # Safety
/// `comm` must be a live communicator.
unsafe fn async_error(comm: nsys::ncclComm_t) -> Option<Box<dyn std::error::Error + Send + Sync>> {
    let mut state = nsys::ncclResult_t::ncclSuccess;
    let queried = unsafe { nsys::ncclCommGetAsyncError(comm, &mut state) };
    match (queried, state) {
        (nsys::ncclResult_t::ncclSuccess, nsys::ncclResult_t::ncclSuccess)
        | (nsys::ncclResult_t::ncclSuccess, nsys::ncclResult_t::ncclInProgress) => None,
        (nsys::ncclResult_t::ncclSuccess, failed) => Some(Box::new(NcclFailure(failed))),
        (failed, _) => Some(Box::new(NcclFailure(failed))),
    }
}

/// An NCCL result code as an error (cudarc's `NcclError` is not one), kept
/// as a [`CommError::Device`]'s source.
#[derive(Debug)]
pub struct NcclFailure(pub nsys::ncclResult_t);

impl std::fmt::Display for NcclFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&describe(self.0))
    }
}

impl std::error::Error for NcclFailure {}

/// NCCL's description of a result code.
fn describe(code: nsys::ncclResult_t) -> String {
    // SAFETY: NCCL returns a static string for every code.
    let text = unsafe { nsys::ncclGetErrorString(code) };
    if text.is_null() {
        return format!("{code:?}");
    }
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    format!("{text} ({code:?})")
}

fn data_type(dtype: DType) -> nsys::ncclDataType_t {
    match dtype {
        DType::F32 => nsys::ncclDataType_t::ncclFloat32,
        DType::F64 => nsys::ncclDataType_t::ncclFloat64,
        DType::I32 => nsys::ncclDataType_t::ncclInt32,
        DType::I64 => nsys::ncclDataType_t::ncclInt64,
        DType::F16 => nsys::ncclDataType_t::ncclFloat16,
        DType::BF16 => nsys::ncclDataType_t::ncclBfloat16,
    }
}

fn reduce_op(op: ReduceOp) -> nsys::ncclRedOp_t {
    match op {
        ReduceOp::Sum => nsys::ncclRedOp_t::ncclSum,
        // Divides on the GPU, in the reduction itself (NCCL 2.10+).
        ReduceOp::Mean => nsys::ncclRedOp_t::ncclAvg,
        ReduceOp::Max => nsys::ncclRedOp_t::ncclMax,
        ReduceOp::Min => nsys::ncclRedOp_t::ncclMin,
    }
}
