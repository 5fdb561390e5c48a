//! Averaging gradients across ranks, bucket by bucket.
//!
//! Two front ends share one path: `Ddp<B>::backward` (parameters found by
//! [`crate::tracking`]) and [`sync_gradients`] (parameters found by walking a
//! module, for any autodiff backend). Both hand a list of flat gradients to
//! [`average_gradients`], which concatenates each bucket on the device, moves
//! it through the reducer in one collective and slices it back.

use crate::device::{self, Bucket};
use crate::global;
use crate::tracking::{self, TrackedAutodiff};
use crate::{CommError, ParamLayout, Reducer, Result};
use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, Tensor, TensorData, TensorPrimitive};
use burn_backend::tensor::FloatTensor;
use burn_ddp_comm::DType as WireDType;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Where gradient synchronisation spent its time (since the last reset).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SyncStats {
    /// Synchronisations (backward passes or `sync_gradients` calls).
    pub syncs: u64,
    /// Buckets reduced.
    pub buckets: u64,
    /// Gradient bytes reduced.
    pub bytes: u64,
    /// Buckets averaged on the GPU over NCCL (the others went through host memory).
    pub device_buckets: u64,
    /// Waiting for the slowest rank to finish its backward pass (load imbalance,
    /// not communication).
    pub wait: Duration,
    /// Flattening gradients into buckets (and, on the host path, reading them
    /// out of the backend).
    pub pack: Duration,
    /// The collectives themselves (on the GPU path, including the wait for the
    /// kernels that fill the bucket).
    pub reduce: Duration,
    /// Writing buckets back and splitting them into gradients.
    pub unpack: Duration,
}

static STATS: Mutex<SyncStats> = Mutex::new(SyncStats {
    syncs: 0,
    buckets: 0,
    bytes: 0,
    device_buckets: 0,
    wait: Duration::ZERO,
    pack: Duration::ZERO,
    reduce: Duration::ZERO,
    unpack: Duration::ZERO,
});

/// Time spent synchronising gradients so far.
pub fn sync_stats() -> SyncStats {
    *STATS.lock().unwrap()
}

/// Starts [`sync_stats`] from zero.
pub fn reset_sync_stats() {
    *STATS.lock().unwrap() = SyncStats::default();
}

static NO_SYNC_DEPTH: AtomicUsize = AtomicUsize::new(0);

/// While alive, `Ddp<B>::backward` keeps gradients local (PyTorch's `no_sync()`).
///
/// Use it to accumulate gradients over several micro-batches and communicate
/// once: run the first k-1 backward passes under the guard, accumulate the
/// `GradientsParams` yourself, then average the sum with [`sync_gradients`] (or
/// run the last backward without the guard, which averages only that pass).
///
/// ```no_run
/// use burn::backend::{Autodiff, NdArray};
/// use burn::nn::LinearConfig;
/// use burn::optim::{GradientsAccumulator, Optimizer, SgdConfig};
/// use burn::tensor::Tensor;
/// type B = burn_ddp::Ddp<Autodiff<NdArray>>;
///
/// # fn main() -> burn_ddp::Result<()> {
/// let device = Default::default();
/// let group = burn_ddp::init_process_group()?;
/// let mut model = burn_ddp::wrap(LinearConfig::new(4, 1).init::<B>(&device), &group)?;
/// let mut optimizer = SgdConfig::new().init();
/// let mut accumulator = GradientsAccumulator::new();
/// for _micro_batch in 0..4 {
///     let loss = model.forward(Tensor::<B, 2>::ones([8, 4], &device)).mean();
///     let _local = burn_ddp::no_sync(); // no communication in this backward
///     accumulator.accumulate(&model, burn::optim::GradientsParams::from_grads(loss.backward(), &model));
/// }
/// // One all-reduce for the four micro-batches.
/// let grads = burn_ddp::sync_gradients(&model, accumulator.grads())?;
/// model = optimizer.step(0.01, model, grads);
/// # Ok(())
/// # }
/// ```
#[must_use = "gradients stay local only while the guard is alive"]
pub struct NoSyncGuard {
    _private: (),
}

/// Turns off gradient synchronisation until the returned guard is dropped.
pub fn no_sync() -> NoSyncGuard {
    NO_SYNC_DEPTH.fetch_add(1, Ordering::SeqCst);
    NoSyncGuard { _private: () }
}

impl Drop for NoSyncGuard {
    fn drop(&mut self) {
        NO_SYNC_DEPTH.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether backward passes currently synchronise.
pub fn sync_enabled() -> bool {
    NO_SYNC_DEPTH.load(Ordering::SeqCst) == 0
}

/// Called by `Ddp<B>::backward` with the fresh gradients.
pub(crate) fn after_backward<B: TrackedAutodiff>(grads: &mut B::Gradients) -> Result<()> {
    if !sync_enabled() {
        return Ok(());
    }
    let Some(state) = global::require_state_if_distributed()? else {
        return Ok(());
    };
    if skip_single_process(&state.group)? {
        return Ok(());
    }
    let params = tracking::live_params::<B>();
    let Some(device) = params.first().map(|(_, _, key)| B::float_device(key)) else {
        return Ok(());
    };
    let layout = params
        .iter()
        .map(|(shape, dtype, _)| param_layout(state.group.rank(), shape, *dtype))
        .collect::<Result<Vec<_>>>()?;
    // A parameter this pass did not reach gets a zero gradient, so every rank
    // issues the same collectives.
    let local: Vec<Option<FloatTensor<B::InnerBackend>>> = params
        .iter()
        .map(|(_, _, key)| B::grad_remove(key, grads))
        .collect();
    let mut reducer = state.reducer.lock().unwrap();
    let averaged = average_gradients::<B::InnerBackend>(&mut reducer, &layout, local, &device)?;
    for ((_, _, key), grad) in params.iter().zip(averaged) {
        B::grad_replace(key, grads, grad);
    }
    Ok(())
}

/// A world of one has nothing to average, unless `BURN_DDP_BACKEND=nccl` asks
/// for the GPU path anyway (so one process can exercise it).
fn skip_single_process(group: &crate::ProcessGroup) -> Result<bool> {
    Ok(group.world_size() == 1
        && device::configured_backend(group)? != crate::CollectiveBackend::Nccl)
}

fn param_layout(rank: usize, shape: &[usize], dtype: DType) -> Result<ParamLayout> {
    let dtype = match dtype {
        DType::F32 => WireDType::F32,
        DType::F64 => WireDType::F64,
        DType::F16 => WireDType::F16,
        DType::BF16 => WireDType::BF16,
        other => {
            return Err(CommError::InvalidArgument {
                rank,
                message: format!(
                    "burn-ddp averages f32, f64, f16 and bf16 gradients; a parameter has \
                     {other:?} (train in one of those, or cast the parameter)"
                ),
            })
        }
    };
    Ok(ParamLayout {
        shape: shape.to_vec(),
        dtype,
    })
}

/// Averages `grads` (missing ones count as zero) over all ranks, returning them
/// in the same order and shapes.
pub(crate) fn average_gradients<I: Backend>(
    reducer: &mut Reducer,
    layout: &[ParamLayout],
    mut grads: Vec<Option<FloatTensor<I>>>,
    device: &I::Device,
) -> Result<Vec<FloatTensor<I>>> {
    let rank = reducer.group().rank();
    let mut averaged: Vec<Option<FloatTensor<I>>> = (0..layout.len()).map(|_| None).collect();
    let mut stats = SyncStats {
        syncs: 1,
        ..SyncStats::default()
    };
    // `prepare` makes the one small collective that checks every rank has the
    // same layout; it also absorbs the wait for the slowest rank, so its time is
    // told apart from the time the bucket collectives take.
    let waiting = Instant::now();
    let plan = reducer.prepare(layout)?.clone();
    stats.wait = waiting.elapsed();
    for bucket in &plan.buckets {
        let started = Instant::now();
        let members = &plan.order[bucket.slots.clone()];
        let parts: Vec<Tensor<I, 1>> = members
            .iter()
            .map(|&p| {
                let numel = layout[p].numel();
                let flat = match grads[p].take() {
                    Some(grad) => I::float_reshape(grad, [numel].into()),
                    None => I::float_zeros([numel].into(), device, float_dtype(&layout[p]).into()),
                };
                Tensor::from_primitive(TensorPrimitive::Float(flat))
            })
            .collect();
        let flat = Tensor::cat(parts, 0).into_primitive().tensor();
        let catted = Instant::now();
        stats.buckets += 1;
        stats.bytes += members
            .iter()
            .map(|&p| layout[p].numel() * float_dtype(&layout[p]).size())
            .sum::<usize>() as u64;
        let (flat, packed, reduced) = match device::average_bucket::<I>(reducer, flat)? {
            Bucket::Averaged(flat) => {
                stats.device_buckets += 1;
                (flat, catted, Instant::now())
            }
            Bucket::OnHost(flat) => {
                let mut data =
                    Tensor::<I, 1>::from_primitive(TensorPrimitive::Float(flat)).into_data();
                let packed = Instant::now();
                reduce_data(reducer, &mut data, rank)?;
                let reduced = Instant::now();
                let dtype = data.dtype;
                let flat = Tensor::<I, 1>::from_data(data, (device, dtype));
                (flat.into_primitive().tensor(), packed, reduced)
            }
        };
        let flat = Tensor::<I, 1>::from_primitive(TensorPrimitive::Float(flat));
        for (&p, &offset) in members.iter().zip(&bucket.offsets) {
            let numel = layout[p].numel();
            let part = flat
                .clone()
                .slice(offset..offset + numel)
                .into_primitive()
                .tensor();
            averaged[p] = Some(I::float_reshape(part, layout[p].shape.clone().into()));
        }
        stats.pack += packed - started;
        stats.reduce += reduced - packed;
        stats.unpack += reduced.elapsed();
    }
    log::debug!(
        "rank {rank}: gradient sync of {} bytes in {} bucket(s) ({} over NCCL): wait {:?}, \
         pack {:?}, all-reduce {:?}, unpack {:?}",
        stats.bytes,
        stats.buckets,
        stats.device_buckets,
        stats.wait,
        stats.pack,
        stats.reduce,
        stats.unpack
    );
    let mut total = STATS.lock().unwrap();
    total.syncs += stats.syncs;
    total.buckets += stats.buckets;
    total.bytes += stats.bytes;
    total.device_buckets += stats.device_buckets;
    total.wait += stats.wait;
    total.pack += stats.pack;
    total.reduce += stats.reduce;
    total.unpack += stats.unpack;
    drop(total);
    Ok(averaged
        .into_iter()
        .map(|g| g.expect("every parameter is in a bucket"))
        .collect())
}

fn float_dtype(layout: &ParamLayout) -> DType {
    match layout.dtype {
        WireDType::F64 => DType::F64,
        WireDType::F16 => DType::F16,
        WireDType::BF16 => DType::BF16,
        _ => DType::F32,
    }
}

fn reduce_data(reducer: &Reducer, data: &mut TensorData, rank: usize) -> Result<()> {
    let view_error = |err| CommError::InvalidArgument {
        rank,
        message: format!("cannot view a gradient bucket as numbers: {err:?}"),
    };
    match data.dtype {
        DType::F32 => reducer.reduce_bucket(data.as_mut_slice::<f32>().map_err(view_error)?),
        DType::F64 => reducer.reduce_bucket(data.as_mut_slice::<f64>().map_err(view_error)?),
        DType::F16 => reducer.reduce_bucket(data.as_mut_slice::<half::f16>().map_err(view_error)?),
        DType::BF16 => {
            reducer.reduce_bucket(data.as_mut_slice::<half::bf16>().map_err(view_error)?)
        }
        other => Err(CommError::InvalidArgument {
            rank,
            message: format!("gradient bucket of unsupported type {other:?}"),
        }),
    }
}

/// Averages accumulated gradients of `module` over all ranks of the default
/// group, for any autodiff backend (no `Ddp<B>` needed).
///
/// Every trainable parameter takes part, in declaration order; one missing
/// from `grads` counts as zero. Use it after accumulating micro-batches under
/// [`no_sync`], or with a plain `Autodiff<B>` backend.
pub fn sync_gradients<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    mut grads: GradientsParams,
) -> Result<GradientsParams> {
    let Some(state) = global::require_state_if_distributed()? else {
        return Ok(grads);
    };
    let group = &state.group;
    if skip_single_process(group)? {
        return Ok(grads);
    }
    let mut collect = CollectGrads::<B> {
        grads: &mut grads,
        rank: group.rank(),
        ids: Vec::new(),
        layout: Vec::new(),
        local: Vec::new(),
        device: None,
        error: None,
    };
    module.visit(&mut collect);
    if let Some(err) = collect.error {
        return Err(err);
    }
    let CollectGrads {
        ids,
        layout,
        local,
        device,
        ..
    } = collect;
    let Some(device) = device else {
        return Ok(grads);
    };
    let averaged = {
        let mut reducer = state.reducer.lock().unwrap();
        average_gradients::<B::InnerBackend>(&mut reducer, &layout, local, &device)?
    };
    let mut put_back = PutBack::<B> {
        grads: &mut grads,
        averaged: ids.into_iter().zip(averaged).collect(),
    };
    module.visit(&mut put_back);
    Ok(grads)
}

/// Takes each trainable parameter's gradient out, in declaration order.
struct CollectGrads<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    rank: usize,
    ids: Vec<ParamId>,
    layout: Vec<ParamLayout>,
    local: Vec<Option<FloatTensor<B::InnerBackend>>>,
    device: Option<burn_backend::tensor::Device<B::InnerBackend>>,
    error: Option<CommError>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for CollectGrads<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        if !value.is_require_grad() {
            return; // buffers (batch-norm statistics) are not trained
        }
        match param_layout(self.rank, &value.dims(), value.dtype()) {
            Ok(layout) => self.layout.push(layout),
            Err(err) => {
                self.error.get_or_insert(err);
                return;
            }
        }
        self.device.get_or_insert_with(|| value.device());
        self.ids.push(param.id);
        let grad = self.grads.remove::<B::InnerBackend, D>(param.id);
        self.local.push(grad.map(|g| g.into_primitive().tensor()));
    }
}

/// Puts the averaged gradients back under their parameter ids.
struct PutBack<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    averaged: std::collections::HashMap<ParamId, FloatTensor<B::InnerBackend>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for PutBack<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(grad) = self.averaged.remove(&param.id) {
            let grad = Tensor::<B::InnerBackend, D>::from_primitive(TensorPrimitive::Float(grad));
            self.grads.register(param.id, grad);
        }
    }
}
