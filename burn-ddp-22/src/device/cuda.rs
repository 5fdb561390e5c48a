//! CUDA tensors over NCCL. In Burn 0.22 there is no CUDA tensor type: every
//! cubecl runtime is the one `Cube` backend (fused: the `cuda` feature turns
//! Burn's fusion on) and a tensor is on CUDA when its device says so. A
//! tensor is unwrapped through its dispatch layers (`into_dispatch`: plain,
//! autodiff, int) down to the fused tensor, and rebuilt the same way.
//!
//! A fused tensor is first resolved to its cubecl tensor (burn-fusion drains
//! the stream that computes it, the public path Burn's own collectives take),
//! and the result is registered back with the same fusion client as a new
//! tensor.
//!
//! Ordering with cubecl: before NCCL reads or writes a buffer we take the
//! buffer (`get_resource`, which makes this thread's cubecl stream wait for
//! any other stream that wrote it) and then wait for everything queued on that
//! stream, so the buffer is fully written; every NCCL call returns only after
//! its own stream has finished, before cubecl queues anything that reads the
//! result. The allocation is held for the whole call, so it cannot be freed,
//! reused or moved meanwhile.
//!
//! Layout: NCCL reads and writes `numel` packed elements, and cubecl pads the
//! rows of CUDA tensors of rank 2 or more unless told otherwise, or tiles a
//! tensor for a matmul. Every buffer handed to NCCL comes from
//! [`super::packed`], which `pin` checks; buffers written in place are also
//! exclusively owned.

use super::packed::{empty_packed_like, is_packed_tensor, readable, writable};
use super::TensorOp;
use crate::collective::CollectiveKind;
use crate::shared::contract::{CudaBuffer, Pinned};
use crate::shared::device;
use crate::{CommError, ProcessGroup, Result};
use burn::backend::fusion::stream::StreamId;
use burn::backend::fusion::{Client as FusionClient, FusionTensor, NoOp};
use burn::backend::ir::{BackendIr, InitOperationIr, OperationIr, OperationOutput};
use burn::backend::{
    Autodiff, AutodiffBackend, BackendTensor, Cube, CubeDevice, DispatchAutodiffContext,
    DispatchDevice, DispatchTensor, DispatchTensorKind, TensorMetadata,
};
use burn::tensor::{Device, Tensor};
use burn_cubecl::cubecl::cuda::CudaRuntime;
use burn_cubecl::fusion::FusionCubeRuntime;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeBackend;
use burn_ddp_comm::{DeviceBucket, DeviceBuffer};
use cubecl_runtime::runtime::Runtime;

/// A fused tensor of the `Cube` backend (float and int alike).
type Fused = FusionTensor<FusionCubeRuntime>;
/// cubecl-cuda's server, whose memory `get_resource` addresses (the type
/// itself is private to cubecl-cuda).
type CudaServer = <CudaRuntime as Runtime>::Server;

/// The GPU for the rank with index `local_rank` among `local_world_size` on
/// its machine: `cuda:LOCAL_RANK` among the visible GPUs, wrapped around
/// ([`burn_ddp_comm::gpu::choose_gpu`]; under Slurm's `--gpus-per-task=1`
/// every rank's own GPU is its `cuda:0`). When ranks share GPUs, which only
/// the host path allows (NCCL needs one GPU per rank), that is said once on
/// stderr.
///
/// Burn 0.22's CUDA runtime compiles its kernels to PTX through LLVM, linked
/// into the program, so unlike the Burn 0.21 crate there is no NVRTC or CUDA
/// header to check for here (only cubecl's `cuda-cpp` feature, which nothing
/// here enables, brings back CUDA C++ and NVRTC).
pub fn cuda_device_for_rank(local_rank: usize, local_world_size: usize) -> Result<Device> {
    let count = burn_ddp_comm::nccl::cuda_device_count()?;
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
    Ok(Device::cuda(choice.ordinal))
}

/// The GPU of `device` when it is a CUDA device (with autodiff or not).
pub(crate) fn ordinal_of(device: &Device) -> Option<usize> {
    let mut device = device.as_dispatch();
    if let DispatchDevice::Autodiff(inner) = device {
        device = inner;
    }
    match device {
        DispatchDevice::Cube(cube) => cuda_index(cube),
        _ => None,
    }
}

/// The index of a cubecl device on the CUDA runtime.
fn cuda_index(device: &CubeDevice) -> Option<usize> {
    match device {
        CubeDevice::Cuda(cuda) => Some(cuda.index),
        _ => None,
    }
}

/// How a tensor held its fused tensor, to hold a result the same way.
#[derive(Clone, Copy)]
enum Holder {
    Float,
    /// A float tensor on an autodiff device: a result is a fresh, untracked
    /// leaf, as after any collective.
    AutodiffFloat,
    Int,
}

/// The way from a cubecl tensor back to a `Tensor` like the one it came from.
struct WayBack {
    client: FusionClient<FusionCubeRuntime>,
    holder: Holder,
    autodiff: DispatchAutodiffContext,
}

impl WayBack {
    fn tensor<const D: usize, K: CollectiveKind>(self, cube: CubeTensor) -> Tensor<D, K> {
        let fused = self.refuse(cube);
        let kind = match self.holder {
            Holder::Float => DispatchTensorKind::Cube(BackendTensor::Float(fused)),
            Holder::Int => DispatchTensorKind::Cube(BackendTensor::Int(fused)),
            Holder::AutodiffFloat => {
                let leaf = <Autodiff<Cube> as AutodiffBackend>::from_inner(fused);
                let inner = DispatchTensorKind::Cube(BackendTensor::Autodiff(leaf));
                DispatchTensorKind::Autodiff(Box::new(inner))
            }
        };
        Tensor::from_dispatch(DispatchTensor {
            kind,
            autodiff: self.autodiff,
        })
    }

    /// `cube` as a new fused tensor of the client it was resolved from.
    fn refuse(&self, cube: CubeTensor) -> Fused {
        let (shape, dtype) = (cube.shape(), cube.dtype());
        let handle = match self.holder {
            Holder::Int => <CubeBackend as BackendIr>::int_tensor_handle(cube),
            Holder::Float | Holder::AutodiffFloat => {
                <CubeBackend as BackendIr>::float_tensor_handle(cube)
            }
        };
        let client = &self.client;
        let init = InitOperationIr::create(shape, dtype, || client.register_tensor_handle(handle));
        client
            .register(
                StreamId::current(),
                OperationIr::Init(init),
                NoOp::<CubeBackend>::new(),
            )
            .output()
    }
}

/// A tensor taken apart for the device path, or left as it was.
// Made and taken apart once per collective: boxing would gain nothing.
#[allow(clippy::large_enum_variant)]
enum Taken<const D: usize, K: CollectiveKind> {
    /// Its cubecl tensor and the way back.
    Cuda(CubeTensor, WayBack),
    Other(Tensor<D, K>),
}

/// The cubecl tensor inside a float or int `tensor` on a CUDA device (after
/// everything queued to compute it ran), and the way back; any other tensor
/// as it was.
fn unwrap<const D: usize, K: CollectiveKind>(tensor: Tensor<D, K>) -> Taken<D, K> {
    if ordinal_of(&tensor.device()).is_none() {
        return Taken::Other(tensor);
    }
    let DispatchTensor { kind, autodiff } = tensor.into_dispatch();
    let untouched = |kind| Taken::Other(Tensor::from_dispatch(DispatchTensor { kind, autodiff }));
    let (fused, holder): (Fused, Holder) = match kind {
        DispatchTensorKind::Cube(BackendTensor::Float(fused)) => (fused, Holder::Float),
        DispatchTensorKind::Cube(BackendTensor::Int(fused)) => (fused, Holder::Int),
        DispatchTensorKind::Autodiff(inner) => match *inner {
            DispatchTensorKind::Cube(BackendTensor::Autodiff(tracked)) => {
                (tracked.into_primitive(), Holder::AutodiffFloat)
            }
            other => return untouched(DispatchTensorKind::Autodiff(Box::new(other))),
        },
        other => return untouched(other),
    };
    let client = fused.client.clone();
    let cube = match holder {
        Holder::Int => client.resolve_tensor_int::<CubeBackend>(fused),
        Holder::Float | Holder::AutodiffFloat => client.resolve_tensor_float::<CubeBackend>(fused),
    };
    let way_back = WayBack {
        client,
        holder,
        autodiff,
    };
    Taken::Cuda(cube, way_back)
}

/// A gradient bucket handed to the reducer: the cubecl tensor, the way back
/// to a `Tensor`, and the held allocation.
struct Packed {
    cube: CubeTensor,
    way_back: WayBack,
    pinned: Box<dyn std::any::Any>,
}

/// `bucket` (a flat float tensor this synchronisation owns, on a CUDA device)
/// as a device buffer of `wire` elements for NCCL to average in place.
pub(crate) fn pack(
    rank: usize,
    bucket: Tensor<1>,
    wire: burn_ddp_comm::DType,
) -> Result<DeviceBucket> {
    let bug = |what: String| {
        CommError::device(
            rank,
            format!("{what} (a burn-ddp-22 bug; please report it)"),
            None,
        )
    };
    let (cube, way_back) = match unwrap(bucket) {
        Taken::Cuda(cube, way_back) => (cube, way_back),
        Taken::Other(other) => {
            let device = other.device();
            return Err(bug(format!(
                "a gradient bucket said to be on a GPU is on {device:?}"
            )));
        }
    };
    let cube = writable(cube);
    let pinned = pin(rank, &cube)?;
    if pinned.buffer.dtype != wire {
        return Err(bug(format!(
            "a gradient bucket of {:?} elements was asked for as {wire:?}",
            cube.dtype
        )));
    }
    let buffer = pinned.buffer;
    let packed = Packed {
        cube,
        way_back,
        pinned: Box::new(pinned),
    };
    // SAFETY: `pin` waited for every write and holds the allocation (in
    // `packed`) until `unpack`; the tensor is exclusively ours and packed.
    Ok(unsafe { DeviceBucket::new(buffer, Box::new(packed)) })
}

/// The averaged bucket back as a flat tensor.
pub(crate) fn unpack(bucket: DeviceBucket) -> Tensor<1> {
    let packed = bucket
        .into_keep()
        .downcast::<Packed>()
        .expect("a bucket made by pack");
    let Packed {
        cube,
        way_back,
        pinned,
    } = *packed;
    drop(pinned);
    way_back.tensor(cube)
}

/// Runs a tensor collective over NCCL when `tensor` is a CUDA tensor and the
/// group uses NCCL; `Err` hands the tensor back otherwise.
pub(crate) fn tensor_collective<const D: usize, K: CollectiveKind>(
    group: &ProcessGroup,
    tensor: Tensor<D, K>,
    op: TensorOp,
) -> Result<std::result::Result<Tensor<D, K>, Tensor<D, K>>> {
    let (cube, way_back) = match unwrap(tensor) {
        Taken::Cuda(cube, way_back) => (cube, way_back),
        Taken::Other(other) => return Ok(Err(other)),
    };
    let ordinal = cuda_index(&cube.device).expect("unwrap takes CUDA tensors only");
    if !group.uses_device_collectives(ordinal)? {
        return Ok(Err(way_back.tensor(cube)));
    }
    Ok(Ok(way_back.tensor(device::collective(group, cube, op)?)))
}

/// The bytes at the device address an in-place collective (`all_reduce`,
/// `broadcast`, a gradient bucket) would hand NCCL for `tensor`, copied back:
/// for a GPU check, which compares them with the tensor's values. `None`
/// when the tensor is not a CUDA tensor or the group does not use NCCL.
#[doc(hidden)]
pub fn nccl_view<const D: usize>(
    group: &ProcessGroup,
    tensor: Tensor<D>,
) -> Result<Option<Vec<u8>>> {
    let Taken::Cuda(cube, _way_back) = unwrap(tensor) else {
        return Ok(None);
    };
    let ordinal = cuda_index(&cube.device).expect("unwrap takes CUDA tensors only");
    if !group.uses_device_collectives(ordinal)? {
        return Ok(None);
    }
    device::view(group, cube).map(Some)
}

impl CudaBuffer for CubeTensor {
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
fn pin(rank: usize, tensor: &CubeTensor) -> Result<Pinned> {
    let dtype = crate::shared::dtype::wire_or_error(rank, tensor.dtype, "collectives")?;
    let device = |what: &str, detail: String| {
        CommError::device(
            rank,
            format!("{what} on {:?}: {detail}", tensor.device),
            None,
        )
    };
    if !is_packed_tensor(tensor) {
        return Err(device(
            "a strided or tiled buffer would have been handed to NCCL (a burn-ddp-22 bug; \
             please report it)",
            format!("{:?}", tensor.meta),
        ));
    }
    // First the resource, then the wait: taking it is what queues the wait for
    // another stream's writes on ours, and the host wait must cover that too.
    let resource = tensor
        .client
        .get_resource::<CudaServer>(tensor.handle.clone())
        .map_err(|e| device("cannot address a tensor's memory", format!("{e:?}")))?;
    burn_cubecl::cubecl::future::block_on(tensor.client.sync())
        .map_err(|e| device("waiting for queued kernels failed", format!("{e:?}")))?;
    let len = tensor.meta.shape().num_elements();
    let held = resource.resource().size;
    if (len * tensor.dtype.size()) as u64 > held {
        return Err(device(
            "a buffer is smaller than its tensor (a burn-ddp-22 bug; please report it)",
            format!("{len} elements of {:?} in {held} bytes", tensor.dtype),
        ));
    }
    Ok(Pinned {
        buffer: DeviceBuffer {
            ptr: resource.resource().ptr,
            len,
            dtype,
        },
        _alive: Box::new(resource),
    })
}
