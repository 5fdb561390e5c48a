//! CUDA tensors over NCCL: Burn's `Cuda` backend plain (`CubeBackend<CudaRuntime>`)
//! or fused (`Fusion<CubeBackend<CudaRuntime>>`, burn-cuda's default), under
//! `Autodiff` or not.
//!
//! A fused tensor is first resolved to its CUDA tensor (burn-fusion drains the
//! stream that computes it, the public path Burn's own collectives take), and
//! the result is registered back with the same fusion client as a new tensor.
//!
//! Ordering with cubecl: before NCCL reads or writes a buffer we take the
//! buffer (`get_resource`, which makes this thread's cubecl stream wait for
//! any other stream that wrote it) and then wait for everything queued on that
//! stream, so the buffer is fully written; every NCCL call returns only after
//! its own stream has finished, before cubecl queues anything that reads the
//! result. The allocation is held for the whole call, so it cannot be freed or
//! reused meanwhile. A bucket sent during backward (`pack_pending`) is
//! taken and waited for the same way, on the communication thread, by its
//! fence; there the tensor kept with the bucket until `unpack` is what holds
//! the allocation.
//!
//! Layout: NCCL reads and writes `numel` packed elements, and cubecl pads the
//! rows of CUDA tensors of rank 2 or more unless told otherwise. Every buffer
//! handed to NCCL comes from [`super::packed`] (the same logic for every cubecl
//! runtime, tested on WebGPU), which `pin` checks; buffers written in place are
//! also exclusively owned.

use super::packed::{empty_packed_like, is_packed_tensor, readable, writable};
use super::TensorOp;
use crate::shared::contract::{CudaBuffer, Pinned};
use crate::shared::device;
use crate::{CommError, ProcessGroup, Result};
use burn::tensor::backend::Backend;
use burn::tensor::{BasicOps, Float, Int, Tensor, TensorPrimitive};
use burn_autodiff::Autodiff;
use burn_backend::backend::AutodiffBackend;
use burn_backend::tensor::{FloatTensor, IntTensor};
use burn_backend::TensorMetadata;
use burn_cubecl::fusion::FusionCubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeBackend;
use burn_ddp_comm::{DeviceBucket, DeviceBuffer, DeviceFence, PendingDeviceBucket};
use burn_fusion::stream::OperationStreams;
use burn_fusion::{Fusion, FusionTensor, NoOp};
use burn_ir::{BackendIr, InitOperationIr, OperationIr, OperationOutput};
use cubecl::cuda::{CudaDevice, CudaRuntime};
use std::any::Any;

type CudaTensor = CubeTensor<CudaRuntime>;
/// The float/int element types of Burn's `Cuda` alias.
type CudaInner = CubeBackend<CudaRuntime, f32, i32, u8>;

/// Burn's CUDA backend without fusion: what `burn::backend::Cuda` is when
/// burn-cuda's `fusion` feature is off. Named so a program can pick either
/// whatever features its Burn dependency enables; NCCL takes both.
pub type PlainCuda = CudaInner;
/// Burn's CUDA backend with fusion: what `burn::backend::Cuda` is with
/// burn-cuda's default features (`burn = { features = ["cuda"] }`).
pub type FusedCuda = Fusion<CudaInner>;
/// A tensor of [`FusedCuda`] (float, int and bool primitives are all this type).
type FusedTensor = FusionTensor<FusionCubeRuntime<CudaRuntime>>;

/// Which kind of fused tensor is resolved (they are registered back alike).
#[derive(Clone, Copy)]
enum Kind {
    Float,
    Int,
}

/// The CUDA tensor behind a fused one, after everything queued to compute it
/// ran, and the way back: a new fused tensor of the same client holding the
/// (possibly new) CUDA tensor.
fn unfuse(
    tensor: FusedTensor,
    kind: Kind,
) -> (CudaTensor, Box<dyn FnOnce(CudaTensor) -> FusedTensor>) {
    let client = tensor.client.clone();
    let cuda = match kind {
        Kind::Float => client.resolve_tensor_float::<CudaInner>(tensor),
        Kind::Int => client.resolve_tensor_int::<CudaInner>(tensor),
    };
    let refuse = move |cuda: CudaTensor| {
        let (shape, dtype) = (cuda.shape(), cuda.dtype());
        let handle = match kind {
            Kind::Float => <CudaInner as BackendIr>::float_tensor_handle(cuda),
            Kind::Int => <CudaInner as BackendIr>::int_tensor_handle(cuda),
        };
        let init = InitOperationIr::create(shape, dtype, || client.register_tensor_handle(handle));
        client
            .register(
                OperationStreams::default(),
                OperationIr::Init(init),
                NoOp::<CudaInner>::new(),
            )
            .output()
    };
    (cuda, Box::new(refuse))
}

/// The GPU for the rank with index `local_rank` among `local_world_size` on
/// its machine: `cuda:LOCAL_RANK` among the visible GPUs, wrapped around
/// ([`burn_ddp_comm::gpu::choose_gpu`]; under Slurm's `--gpus-per-task=1`
/// every rank's own GPU is its `cuda:0`). When ranks share GPUs, which only
/// the host path allows (NCCL needs one GPU per rank), that is said once on
/// stderr.
///
/// It also checks what Burn's CUDA backend needs to compile its kernels at run
/// time (NVRTC and the CUDA headers), which would otherwise panic at the first
/// kernel.
pub fn cuda_device_for_rank(local_rank: usize, local_world_size: usize) -> Result<CudaDevice> {
    let count = burn_ddp_comm::nccl::cuda_device_count()?;
    let who = format!("local rank {local_rank}");
    burn_ddp_comm::nccl::check_nvrtc(&who)?;
    burn_ddp_comm::nccl::check_cuda_headers(
        &who,
        cubecl::cuda::install::cuda_path().as_deref(),
        std::env::var_os("CUDA_PATH").is_some(),
    )?;
    let visible_devices = std::env::var(burn_ddp_comm::gpu::VISIBLE_DEVICES_VAR).ok();
    let choice = burn_ddp_comm::gpu::choose_gpu(
        local_rank,
        local_world_size,
        count,
        visible_devices.as_deref(),
    )?;
    if choice.shared && local_rank == 0 {
        log::warn!(
            "local rank {local_rank}: {local_world_size} ranks share {count} GPU(s) on this machine; NCCL \
             needs one GPU per rank, so gradients go through host memory (or set \
             BURN_DDP_BACKEND=tcp)"
        );
    }
    Ok(CudaDevice {
        index: choice.ordinal,
    })
}

/// The GPU of `device` when tensors of `I` are CUDA tensors burn-ddp can
/// hand to NCCL (Burn's plain or fused `Cuda` with its default element
/// types), else `None`.
pub(crate) fn ordinal_of<I: Backend>(device: &I::Device) -> Option<usize> {
    use std::any::TypeId;
    let primitive = TypeId::of::<FloatTensor<I>>();
    if primitive != TypeId::of::<CudaTensor>() && primitive != TypeId::of::<FusedTensor>() {
        return None;
    }
    (device as &dyn Any)
        .downcast_ref::<CudaDevice>()
        .map(|device| device.index)
}

/// A gradient bucket handed to the reducer: the CUDA tensor, the way back to
/// `I`'s tensor, and the held allocation.
struct Packed<I: Backend> {
    cuda: CudaTensor,
    wrap: Wrap<FloatTensor<I>>,
    pinned: Box<dyn Any>,
}

/// A bucket's CUDA tensor, packed and exclusively ours, and how to wrap it
/// back.
fn bucket_to_cuda<I: Backend>(
    rank: usize,
    bucket: FloatTensor<I>,
) -> Result<(CudaTensor, Wrap<FloatTensor<I>>)> {
    let Ok((cuda, wrap)) = float_to_cuda::<I>(bucket) else {
        return Err(CommError::device(
            rank,
            "a gradient bucket said to be on a GPU is not a CUDA tensor (a burn-ddp bug; \
             please report it)",
            None,
        ));
    };
    Ok((writable(cuda), wrap))
}

/// `bucket` (a flat tensor this synchronisation owns) as a device buffer
/// for NCCL to average in place.
pub(crate) fn pack<I: Backend>(rank: usize, bucket: FloatTensor<I>) -> Result<DeviceBucket> {
    let (cuda, wrap) = bucket_to_cuda::<I>(rank, bucket)?;
    let pinned = pin(rank, &cuda)?;
    let buffer = pinned.buffer;
    let packed = Packed::<I> {
        cuda,
        wrap,
        pinned: Box::new(pinned),
    };
    // SAFETY: `pin` waited for every write and holds the allocation (in
    // `packed`) until `unpack`; the tensor is exclusively ours and packed.
    Ok(unsafe { DeviceBucket::new(buffer, Box::new(packed)) })
}

/// `bucket` (a flat tensor packed during backward, its kernels perhaps still
/// queued on this thread's stream) for the communication thread: its fence
/// takes the memory there, which makes cubecl order that thread's stream
/// after the writer's with an event, and waits for that stream alone, so
/// backward goes on queueing kernels meanwhile.
pub(crate) fn pack_pending<I: Backend>(
    rank: usize,
    bucket: FloatTensor<I>,
) -> Result<PendingDeviceBucket> {
    let (cuda, wrap) = bucket_to_cuda::<I>(rank, bucket)?;
    let written = cuda.clone();
    // The allocation stays with `keep` (the tensor); the fence only needs
    // the address once every write to it is done.
    let fence: DeviceFence = Box::new(move || pin(rank, &written).map(|pinned| pinned.buffer));
    let packed = Packed::<I> {
        cuda,
        wrap,
        pinned: Box::new(()),
    };
    // SAFETY: the fence returns once the writer's kernels are done (`pin`),
    // the tensor is exclusively ours and packed, and `packed` keeps it until
    // `unpack`.
    Ok(unsafe { PendingDeviceBucket::new(fence, Box::new(packed)) })
}

/// The averaged bucket back as a tensor of `I`.
pub(crate) fn unpack<I: Backend>(bucket: DeviceBucket) -> FloatTensor<I> {
    let packed = bucket
        .into_keep()
        .downcast::<Packed<I>>()
        .expect("a bucket made by pack");
    let Packed { cuda, wrap, pinned } = *packed;
    drop(pinned);
    wrap(cuda)
}

/// Runs a tensor collective over NCCL when `tensor` is a CUDA tensor and the
/// group uses NCCL; `Err` hands the tensor back otherwise.
pub(crate) fn tensor_collective<B: Backend, const D: usize, K: BasicOps<B> + 'static>(
    group: &ProcessGroup,
    tensor: Tensor<B, D, K>,
    op: TensorOp,
) -> Result<std::result::Result<Tensor<B, D, K>, Tensor<B, D, K>>> {
    let (cuda, wrap) = match tensor_to_cuda(tensor) {
        Ok(found) => found,
        Err(other) => return Ok(Err(other)),
    };
    if !group.uses_device_collectives(cuda.device.index)? {
        return Ok(Err(wrap(cuda)));
    }
    Ok(Ok(wrap(device::collective(group, cuda, op)?)))
}

/// The bytes at the device address an in-place collective (`all_reduce`,
/// `broadcast`, a gradient bucket) would hand NCCL for `tensor`, copied back:
/// for the GPU check, which compares them with the tensor's values. `None`
/// when the tensor is not a CUDA tensor or the group does not use NCCL.
#[doc(hidden)]
pub fn nccl_view<B: Backend, const D: usize>(
    group: &ProcessGroup,
    tensor: Tensor<B, D>,
) -> Result<Option<Vec<u8>>> {
    let Ok((cuda, _wrap)) = tensor_to_cuda(tensor) else {
        return Ok(None);
    };
    if !group.uses_device_collectives(cuda.device.index)? {
        return Ok(None);
    }
    device::view(group, cuda).map(Some)
}

impl CudaBuffer for CudaTensor {
    fn writable(self) -> Self {
        writable(self)
    }
    fn readable(self) -> Self {
        readable(self)
    }
    fn empty_like(&self, rows: impl Fn(usize) -> usize) -> Self {
        empty_packed_like(self, rows)
    }
    fn pin(&self, rank: usize) -> Result<Pinned> {
        pin(rank, self)
    }
}

/// Takes `tensor`'s memory (so this thread's cubecl stream waits for whatever
/// stream wrote it), waits for every kernel queued on that stream, and hands
/// out its device address. Only a packed buffer is handed out.
fn pin(rank: usize, tensor: &CudaTensor) -> Result<Pinned> {
    let dtype = crate::shared::dtype::wire_or_error(rank, tensor.dtype, "collectives")?;
    let device = |what: &str, detail: String| {
        CommError::device(
            rank,
            format!("{what} on cuda:{}: {detail}", tensor.device.index),
            None,
        )
    };
    if !is_packed_tensor(tensor) {
        return Err(device(
            "a strided buffer would have been handed to NCCL (a burn-ddp bug; please report it)",
            format!(
                "shape {:?}, strides {:?}",
                tensor.meta.shape(),
                tensor.meta.strides()
            ),
        ));
    }
    // First the resource, then the wait: taking it is what queues the wait for
    // another stream's writes on ours, and the host wait must cover that too.
    let resource = tensor
        .client
        .get_resource(tensor.handle.clone())
        .map_err(|e| device("cannot address a tensor's memory", format!("{e:?}")))?;
    cubecl::future::block_on(tensor.client.sync())
        .map_err(|e| device("waiting for queued kernels failed", format!("{e:?}")))?;
    Ok(Pinned {
        buffer: DeviceBuffer {
            ptr: resource.resource().ptr,
            len: tensor.meta.shape().num_elements(),
            dtype,
        },
        _alive: Box::new(resource),
    })
}

/// `value` as `T`, which the caller knows is its own type.
fn cast<A: 'static, T: 'static>(value: A) -> T {
    *(Box::new(value) as Box<dyn Any>)
        .downcast::<T>()
        .expect("a value cast to its own type")
}

/// `value` as `T` if that is its type, else `value` back.
fn try_cast<A: 'static, T: 'static>(value: A) -> std::result::Result<T, A> {
    match (Box::new(value) as Box<dyn Any>).downcast::<T>() {
        Ok(found) => Ok(*found),
        Err(other) => Err(*other.downcast::<A>().expect("unchanged")),
    }
}

type Wrap<T> = Box<dyn FnOnce(CudaTensor) -> T>;

/// The CUDA tensor inside a float primitive of `B` (plain or fused `Cuda`, or
/// an autodiff tensor over either, as `Autodiff<Cuda>` and `Ddp<Autodiff<Cuda>>`
/// use), and how to wrap a result the same way (an autodiff result is a fresh,
/// untracked leaf, as after any collective).
#[allow(clippy::type_complexity)]
fn float_to_cuda<B: Backend>(
    primitive: FloatTensor<B>,
) -> std::result::Result<(CudaTensor, Wrap<FloatTensor<B>>), FloatTensor<B>> {
    let primitive = match try_cast::<_, CudaTensor>(primitive) {
        Ok(cuda) => return Ok((cuda, Box::new(cast))),
        Err(other) => other,
    };
    let primitive = match try_cast::<_, FusedTensor>(primitive) {
        Ok(fused) => {
            let (cuda, refuse) = unfuse(fused, Kind::Float);
            return Ok((cuda, Box::new(move |cuda| cast(refuse(cuda)))));
        }
        Err(other) => other,
    };
    let primitive = match try_cast::<_, FloatTensor<Autodiff<CudaInner>>>(primitive) {
        Ok(tracked) => {
            return Ok((
                tracked.primitive,
                Box::new(|cuda| cast(<Autodiff<CudaInner> as AutodiffBackend>::from_inner(cuda))),
            ))
        }
        Err(other) => other,
    };
    match try_cast::<_, FloatTensor<Autodiff<FusedCuda>>>(primitive) {
        Ok(tracked) => {
            let (cuda, refuse) = unfuse(tracked.primitive, Kind::Float);
            Ok((
                cuda,
                Box::new(move |cuda| {
                    cast(<Autodiff<FusedCuda> as AutodiffBackend>::from_inner(
                        refuse(cuda),
                    ))
                }),
            ))
        }
        Err(other) => Err(other),
    }
}

/// The CUDA tensor inside a float or int tensor of `B`, and the way back.
#[allow(clippy::type_complexity)]
fn tensor_to_cuda<B: Backend, const D: usize, K: BasicOps<B> + 'static>(
    tensor: Tensor<B, D, K>,
) -> std::result::Result<(CudaTensor, Wrap<Tensor<B, D, K>>), Tensor<B, D, K>> {
    let tensor = match try_cast::<_, Tensor<B, D, Float>>(tensor) {
        Ok(float) => {
            let rebuild = |p: TensorPrimitive<B>| cast(Tensor::<B, D, Float>::from_primitive(p));
            return match float.into_primitive() {
                TensorPrimitive::Float(p) => match float_to_cuda::<B>(p) {
                    Ok((cuda, wrap)) => Ok((
                        cuda,
                        Box::new(move |c| rebuild(TensorPrimitive::Float(wrap(c)))),
                    )),
                    Err(p) => Err(rebuild(TensorPrimitive::Float(p))),
                },
                quantized => Err(rebuild(quantized)),
            };
        }
        Err(other) => other,
    };
    match try_cast::<_, Tensor<B, D, Int>>(tensor) {
        Ok(int) => {
            let rebuild = |p: IntTensor<B>| cast(Tensor::<B, D, Int>::from_primitive(p));
            let primitive = match try_cast::<_, CudaTensor>(int.into_primitive()) {
                Ok(cuda) => return Ok((cuda, Box::new(move |c| rebuild(cast(c))))),
                Err(p) => p,
            };
            match try_cast::<_, FusedTensor>(primitive) {
                Ok(fused) => {
                    let (cuda, refuse) = unfuse(fused, Kind::Int);
                    Ok((cuda, Box::new(move |c| rebuild(cast(refuse(c))))))
                }
                Err(p) => Err(rebuild(p)),
            }
        }
        Err(other) => Err(other),
    }
}
