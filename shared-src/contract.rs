//! The one door between the shared sources and the crate that compiles
//! them: the traits the shared code is written against, which each crate's
//! shim implements for its Burn's tensors, module walks and metric entries,
//! and, named below, the few items the shared code takes from the crate
//! itself. Nowhere else in this folder does a path start with `crate::`
//! (other than `crate::shared::`, the folder itself): tests/library_features.rs
//! fails the build on one. The dependencies run one way: shared code → this
//! contract ← the crate.

use burn::optim::GradientsParams;
use burn::tensor::{DType, TensorData};
use burn_ddp_comm::{CommError, ProcessGroup, Result};
use burn_ddp_comm::{Placement, ReduceOp};

/// A `TensorData`'s element type (a field in Burn 0.21, a method in 0.22).
pub(crate) trait ElementType {
    fn element_type(&self) -> DType;
}

/// Which kind of tensor a parameter holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Float,
    Int,
    Bool,
}

/// One parameter of a module, as the shared code reads it.
pub(crate) trait ParamView {
    /// Float, int or bool.
    fn kind(&self) -> Kind;
    /// Burn's `ParamId`, which survives optimizer steps.
    fn id(&self) -> u64;
    fn dims(&self) -> Vec<usize>;
    fn dtype(&self) -> DType;
    /// Whether it is trained: a float tensor that requires gradients.
    fn require_grad(&self) -> bool;
    /// Whether its device tracks gradients at all (int and bool: `false`).
    fn autodiff(&self) -> bool;
    /// Its values.
    fn data(&self) -> TensorData;
}

/// What a read-only walk does with each parameter, in declaration order.
pub(crate) trait Visit {
    fn param(&mut self, param: &dyn ParamView);
    /// A submodule (field, list element) begins: `name` is its field name
    /// or index.
    fn enter_module(&mut self, _name: &str) {}
    fn exit_module(&mut self) {}
}

/// A parameter a [`Rewrite`] may replace.
pub(crate) trait ParamSlot: ParamView {
    /// Takes rank `root`'s value (the tensor collective: NCCL for CUDA
    /// tensors), keeping whether it requires gradients.
    fn broadcast(&mut self, group: &ProcessGroup, root: usize) -> Result<()>;
    /// Takes `data` (of its shape and element type) as its value, on its
    /// device, keeping whether it requires gradients.
    fn load(&mut self, data: TensorData);
}

/// What a rewriting walk does with each float and int parameter, in
/// declaration order (bool parameters are left as they are).
pub(crate) trait Rewrite {
    fn param(&mut self, param: &mut dyn ParamSlot);
}

/// What the shared code reads of a parameter's tensor: each shim implements
/// it for its Burn's float, int and bool tensors.
pub(crate) trait TensorFacts: Clone {
    fn dims(&self) -> Vec<usize>;
    fn dtype(&self) -> DType;
    fn into_data(self) -> TensorData;
}

/// Marks a tensor a collective replaced as a parameter again (float:
/// `require_grad`; int: as it is).
pub(crate) trait Retrain {
    fn retrain(self) -> Self;
}

/// Which tensor collective to run.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
#[derive(Debug, Clone, Copy)]
pub(crate) enum TensorOp {
    AllReduce(ReduceOp),
    Broadcast(usize),
    AllGather,
    ReduceScatter(ReduceOp),
}

/// A tensor the collectives take: each shim implements it for its Burn's
/// float and int tensors.
pub(crate) trait CollectiveTensor: Sized {
    type Device;
    fn device(&self) -> Self::Device;
    fn dims(&self) -> Vec<usize>;
    fn into_data(self) -> TensorData;
    /// A tensor of `data`, of `data`'s own element type, on `device`.
    fn from_data(data: TensorData, device: &Self::Device) -> Self;
    /// Rows `start..start + len` of dimension 0.
    fn narrow_rows(&self, start: usize, len: usize) -> Self;
    /// Runs `op` over NCCL if this is a CUDA tensor the group reduces on
    /// the device; `Err(self)` hands any other tensor to the host path (an
    /// error when `BURN_DDP_BACKEND=nccl` forbids that). All-gather returns
    /// the ranks' tensors along dimension 0, reduce-scatter this rank's part.
    fn on_device(
        self,
        group: &ProcessGroup,
        op: TensorOp,
    ) -> Result<std::result::Result<Self, Self>>;
}

/// A flattened gradient (a float tensor of rank 1) of the front-end's Burn.
pub(crate) trait FlatGrad: Sized {
    /// The device gradients live on (without autodiff).
    type Device: Clone;
    /// Where tensors on `device` live, for the reducer.
    fn placement(device: &Self::Device) -> Placement;
    /// The error for gradients on `device` when `BURN_DDP_BACKEND=nccl`
    /// forbids the host path.
    fn nccl_refused(group: &ProcessGroup, device: &Self::Device) -> CommError;
    /// Its values (its own buffer, when nothing else holds it).
    fn into_data(self) -> TensorData;
    /// A tensor of `data`, of element type `dtype`, on `device`.
    fn from_data(data: TensorData, device: &Self::Device, dtype: DType) -> Self;
    /// The sum of the squares of every element of `grads` (a global
    /// gradient norm's square), added up on their device and read back
    /// once, not once per gradient; squared in f32 (f64 elements in f64).
    fn sum_of_squares(grads: &[&Self]) -> f64;
    /// Every element times `factor`.
    fn scaled(self, factor: f64) -> Self;
    /// Its element type.
    #[cfg(feature = "cuda")]
    fn dtype(&self) -> DType;
    /// `numel` zeros of `dtype` on `device`.
    #[cfg(feature = "cuda")]
    fn zeros(numel: usize, device: &Self::Device, dtype: DType) -> Self;
    /// `parts` one after the other.
    #[cfg(feature = "cuda")]
    fn cat(parts: Vec<Self>) -> Self;
    /// Elements `offset..offset + len`.
    #[cfg(feature = "cuda")]
    fn narrow(&self, offset: usize, len: usize) -> Self;
    /// `bucket` (a flat tensor this synchronisation owns) as a device buffer
    /// for NCCL to average in place.
    #[cfg(feature = "cuda")]
    fn pack(
        rank: usize,
        bucket: Self,
        wire: burn_ddp_comm::DType,
    ) -> Result<burn_ddp_comm::DeviceBucket>;
    /// The averaged bucket as a tensor again.
    #[cfg(feature = "cuda")]
    fn unpack(bucket: burn_ddp_comm::DeviceBucket) -> Self;
}

/// A trainable parameter whose gradient a synchronisation moves.
pub(crate) trait GradParam<G: FlatGrad> {
    fn id(&self) -> u64;
    fn dims(&self) -> Vec<usize>;
    fn dtype(&self) -> DType;
    /// The device its gradient lives on (without autodiff).
    fn grad_device(&self) -> G::Device;
    /// Takes its gradient out of `grads`, flattened.
    fn take_grad(&self, grads: &mut GradientsParams) -> Option<G>;
    /// Registers `grad` (flattened) as its gradient, in its shape.
    fn put_grad(&self, grads: &mut GradientsParams, grad: G);
    /// Its value, flattened, without autodiff (for the sharded optimizer to
    /// send to the other ranks).
    fn value(&self) -> G;
}

/// What a gradient walk calls with each trainable parameter.
pub(crate) type EachGrad<'a, G> = &'a mut dyn FnMut(&dyn GradParam<G>);

/// A device buffer for NCCL, with its allocation held until it is dropped.
#[cfg(feature = "cuda")]
pub(crate) struct Pinned {
    pub buffer: burn_ddp_comm::DeviceBuffer,
    pub _alive: Box<dyn std::any::Any>,
}

/// A CUDA tensor of the front-end's cubecl: what NCCL may be handed.
#[cfg(feature = "cuda")]
pub(crate) trait CudaBuffer: Sized {
    /// A packed tensor with these values that nothing else holds, to be
    /// written in place (itself when it already is one).
    fn writable(self) -> Self;
    /// A packed tensor with these values, to be read.
    fn readable(self) -> Self;
    /// An uninitialised packed tensor like this one with `rows(dim 0)` rows.
    fn empty_like(&self, rows: impl Fn(usize) -> usize) -> Self;
    /// Waits for every write to it and hands out its device address, held
    /// until the returned value is dropped.
    fn pin(&self, rank: usize) -> Result<Pinned>;
}

/// A metric entry Burn logged, in burn-ddp-training's terms (`None`: not a
/// figure).
#[cfg(feature = "train")]
pub(crate) trait FigureEntry {
    fn figure(&self) -> Option<burn_ddp_training::learner::figures::Entry>;
}

/// A renderer that shows nothing but may want the end-of-training summary
/// (each front-end implements Burn's renderer traits for it).
#[cfg(feature = "train")]
pub(crate) trait Quiet {
    /// Training ended with `summary`.
    fn summary(&mut self, summary: burn::train::LearnerSummary);
}

/// The crate's `Dataset` over a rank's shard (Burn's `Dataset` trait has an
/// error type from 0.22 on).
#[cfg(feature = "train")]
pub(crate) use crate::data::DistributedDataset;

/// Whether an epoch's Learner checkpoint files read back whole, in the
/// formats of the crate's Burn.
#[cfg(feature = "train")]
pub(crate) use crate::train::checkpoints::check_whole as check_whole_checkpoint;

/// What the shared sources' unit tests run on: the crate's test backend.
#[cfg(test)]
pub(crate) mod testing {
    pub(crate) use crate::shim::{test_device, test_tensor, TestGrad};
}
