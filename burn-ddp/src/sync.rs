//! Averaging gradients across ranks: finding them and handing them to the
//! model's reducer, which does the rest (buckets, the layout check, the
//! collectives, the average).
//!
//! Two ways in: `Ddp<B>::backward` (parameters found by [`crate::tracking`],
//! each wrapped model synchronised with its own reducer) and
//! [`sync_gradients`] (parameters found by walking a module, for any
//! autodiff backend).

use crate::gradients::TensorGradients;
use crate::tracking::{self, LiveParam, TrackedAutodiff};
use crate::{CollectiveBackend, CommError, ProcessGroup, Reducer, Result};
use burn::module::{AutodiffModule, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Tensor, TensorPrimitive};
use burn_backend::tensor::FloatTensor;
use burn_ddp_comm::default_group;
use burn_ddp_comm::reducer::models::{self as scope, ModelScope, Silence, DEFAULT_SCOPE};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

pub use burn_ddp_comm::SyncStats;

/// Time spent synchronising gradients so far, by every model of this process.
pub fn sync_stats() -> SyncStats {
    burn_ddp_comm::reducer::process_stats()
}

/// Starts [`sync_stats`] from zero.
pub fn reset_sync_stats() {
    burn_ddp_comm::reducer::reset_process_stats()
}

/// What synchronising `model`'s gradients cost so far: its own reducer's
/// figures if it was wrapped, else those of the default group's reducer
/// (shared by every model never wrapped); `None` without either.
pub fn sync_stats_of<B: AutodiffBackend, M: AutodiffModule<B>>(model: &M) -> Option<SyncStats> {
    scope::stats_of(first_trainable(model))
}

/// While alive, `Ddp<B>::backward` on this thread keeps gradients local
/// (PyTorch's `no_sync()`): for every model ([`no_sync`]) or for one
/// ([`no_sync_for`]). Other threads are not affected.
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
    _silence: Silence,
    /// Dropped on the thread that made it (the state is per thread).
    _not_send: std::marker::PhantomData<*const ()>,
}

/// Turns off gradient synchronisation in `backward()` on this thread, for
/// every model, until the returned guard is dropped.
pub fn no_sync() -> NoSyncGuard {
    NoSyncGuard {
        _silence: Silence::all(),
        _not_send: std::marker::PhantomData,
    }
}

/// Turns off gradient synchronisation in `backward()` on this thread for
/// `model` alone (PyTorch's `ddp_model.no_sync()`), until the guard is
/// dropped. A GAN's generator step, whose loss also runs through the
/// discriminator, keeps the discriminator's gradients local this way. A model
/// that was never wrapped stands for every model of the default group.
pub fn no_sync_for<B: AutodiffBackend, M: AutodiffModule<B>>(model: &M) -> NoSyncGuard {
    let scope = scope_of(model).map_or(DEFAULT_SCOPE, |scope| scope.id);
    NoSyncGuard {
        _silence: Silence::one(scope),
        _not_send: std::marker::PhantomData,
    }
}

/// Whether backward passes on this thread currently synchronise (no
/// [`no_sync`] guard is alive).
pub fn sync_enabled() -> bool {
    scope::all_enabled()
}

/// The state of the model `model` belongs to, if it was wrapped.
fn scope_of<B: AutodiffBackend, M: AutodiffModule<B>>(
    model: &M,
) -> Option<std::sync::Arc<ModelScope>> {
    first_trainable(model).and_then(scope::of_param)
}

/// The id of `model`'s first trainable parameter, which names its scope.
fn first_trainable<B: AutodiffBackend, M: AutodiffModule<B>>(model: &M) -> Option<u64> {
    let mut first = FirstTrainable(None);
    model.visit(&mut first);
    first.0.map(|id| id.val())
}

/// The id of a module's first trainable parameter.
struct FirstTrainable(Option<ParamId>);

impl<B: AutodiffBackend> ModuleVisitor<B> for FirstTrainable {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if self.0.is_none() && param.val().is_require_grad() {
            self.0 = Some(param.id);
        }
    }
}

/// Whether a reducer over `group` has anything to do: not in a world of one,
/// unless the device backend is `nccl` (so one process can exercise the GPU
/// path).
fn has_peers(group: &ProcessGroup) -> bool {
    group.world_size() > 1 || group.device_backend() == CollectiveBackend::Nccl
}

/// `BURN_DDP_BACKEND=nccl` with gradients in host memory is refused, as it is
/// for tensor collectives.
fn check_backend<I: burn::tensor::backend::Backend>(
    group: &ProcessGroup,
    set: &TensorGradients<I>,
) -> Result<()> {
    if group.device_backend() == CollectiveBackend::Nccl
        && set.placement() == burn_ddp_comm::Placement::Host
    {
        return Err(crate::device::nccl_refused::<FloatTensor<I>>(group));
    }
    Ok(())
}

/// Averages `set` with `reducer`; `Ok(None)` when nothing moved.
fn synchronize<I: burn::tensor::backend::Backend>(
    reducer: &Mutex<Reducer>,
    group: &ProcessGroup,
    mut set: TensorGradients<I>,
) -> Result<Vec<Option<FloatTensor<I>>>> {
    check_backend(group, &set)?;
    let moved = reducer.lock().unwrap().synchronize(&mut set)?;
    Ok(if moved {
        set.into_averaged()
    } else {
        set.into_original()
    })
}

/// A wrapped model's state (none: the default scope) and its live parameters.
type ScopeParams<B> = (Option<Arc<ModelScope>>, Vec<LiveParam<B>>);

/// Called by `Ddp<B>::backward` with the fresh gradients: each wrapped model's
/// parameters averaged with its own reducer, in wrap order; without wrapped
/// models, every parameter over the default group.
pub(crate) fn after_backward<B: TrackedAutodiff>(grads: &mut B::Gradients) -> Result<()> {
    if !scope::all_enabled() {
        return Ok(());
    }
    // Parameters of a model forgotten with its group (destroy_process_group)
    // are back in the default scope, as if never wrapped.
    let mut by_scope: BTreeMap<u64, Vec<LiveParam<B>>> = BTreeMap::new();
    for param in tracking::live_params::<B>() {
        by_scope.entry(param.scope).or_default().push(param);
    }
    let mut models: BTreeMap<u64, ScopeParams<B>> = BTreeMap::new();
    for (id, params) in by_scope {
        let model = (id != DEFAULT_SCOPE).then(|| scope::by_id(id)).flatten();
        let id = model.as_ref().map_or(DEFAULT_SCOPE, |m| m.id);
        let entry = models.entry(id).or_insert_with(|| (model, Vec::new()));
        entry.1.extend(params);
    }
    let wrapped = scope::any_wrapped();
    for (id, (model, params)) in models {
        if !scope::enabled(id) {
            continue;
        }
        if id == DEFAULT_SCOPE {
            if wrapped {
                check_outside_models::<B>(&params, grads)?;
                continue;
            }
            let Some(state) = default_group::required_if_distributed()? else {
                continue;
            };
            sync_params::<B>(&state.reducer, &state.group, params, grads)?;
            continue;
        }
        let model = model.expect("a wrapped model's scope");
        let group = model.reducer.lock().unwrap().group().map_err(|_| {
            CommError::config(
                "a wrapped model's process group was destroyed, but its backward pass \
                 still runs; wrap the model again over a live group",
            )
        })?;
        sync_params::<B>(&model.reducer, &group, params, grads)?;
    }
    Ok(())
}

/// One scope's gradients, out of `grads`, averaged, and back in.
fn sync_params<B: TrackedAutodiff>(
    reducer: &Mutex<Reducer>,
    group: &ProcessGroup,
    params: Vec<LiveParam<B>>,
    grads: &mut B::Gradients,
) -> Result<()> {
    if !has_peers(group) || params.is_empty() {
        return Ok(());
    }
    let device = B::float_device(&params[0].key);
    let mut set = TensorGradients::<B::InnerBackend>::new(group.rank(), device);
    for param in &params {
        // A parameter this pass did not reach gets a zero gradient, so every
        // rank issues the same collectives.
        let grad = B::grad_remove(&param.key, grads);
        set.push(param.id, param.shape.clone(), param.dtype, grad)?;
    }
    let averaged = synchronize(reducer, group, set)?;
    for (param, grad) in params.iter().zip(averaged) {
        if let Some(grad) = grad {
            B::grad_replace(&param.key, grads, grad);
        }
    }
    Ok(())
}

/// With models wrapped, a trainable tensor of none of them that got a
/// gradient would silently train on this rank's gradient alone: an error.
fn check_outside_models<B: TrackedAutodiff>(
    params: &[LiveParam<B>],
    grads: &B::Gradients,
) -> Result<()> {
    let Some(stray) = params.iter().find(|p| B::grad(&p.key, grads).is_some()) else {
        return Ok(());
    };
    let rank = crate::LaunchEnv::from_env().map_or(0, |env| env.rank);
    Err(CommError::config(format!(
        "rank {rank}: a tensor that requires gradients (shape {:?}) got a gradient in \
         backward() but belongs to no wrapped model, so it would train on this rank's \
         gradient alone; wrap the model it belongs to with burn_ddp::wrap (again after \
         loading a record into it or moving it to another device), or make it a \
         constant (no require_grad)",
        stray.shape
    )))
}

/// Averages the gradients of `module` over all ranks, for any autodiff
/// backend (no `Ddp<B>` needed): over the group and with the buckets it was
/// wrapped with, or over the default group if it never was.
///
/// Every trainable parameter takes part, in declaration order; one missing
/// from `grads` counts as zero. Use it after accumulating micro-batches under
/// [`no_sync`], or with a plain `Autodiff<B>` backend.
pub fn sync_gradients<B: AutodiffBackend, M: AutodiffModule<B>>(
    module: &M,
    grads: GradientsParams,
) -> Result<GradientsParams> {
    let Some(target) = scope::target_for(first_trainable(module))? else {
        return Ok(grads);
    };
    let group = target.group()?;
    sync_module(target.reducer(), &group, module, grads)
}

/// [`sync_gradients`] with a given reducer (the Learner strategy's own).
pub(crate) fn sync_module<B: AutodiffBackend, M: AutodiffModule<B>>(
    reducer: &Mutex<Reducer>,
    group: &ProcessGroup,
    module: &M,
    mut grads: GradientsParams,
) -> Result<GradientsParams> {
    if !has_peers(group) {
        return Ok(grads);
    }
    let mut collect = CollectGrads::<B> {
        grads: &mut grads,
        rank: group.rank(),
        ids: Vec::new(),
        set: None,
        error: None,
    };
    module.visit(&mut collect);
    let CollectGrads {
        ids, set, error, ..
    } = collect;
    if let Some(err) = error {
        return Err(err);
    }
    let Some(set) = set else {
        return Ok(grads);
    };
    let averaged = synchronize(reducer, group, set)?;
    let mut put_back = PutBack::<B> {
        grads: &mut grads,
        averaged: ids
            .into_iter()
            .zip(averaged)
            .filter_map(|(id, grad)| Some((id, grad?)))
            .collect(),
    };
    module.visit(&mut put_back);
    Ok(grads)
}

/// Takes each trainable parameter's gradient out, in declaration order.
struct CollectGrads<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    rank: usize,
    ids: Vec<ParamId>,
    set: Option<TensorGradients<B::InnerBackend>>,
    error: Option<CommError>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for CollectGrads<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        if !value.is_require_grad() || self.error.is_some() {
            return; // buffers (batch-norm statistics) are not trained
        }
        let set = self
            .set
            .get_or_insert_with(|| TensorGradients::new(self.rank, value.device()));
        let grad = self.grads.remove::<B::InnerBackend, D>(param.id);
        let pushed = set.push(
            param.id.val(),
            value.dims().to_vec(),
            value.dtype(),
            grad.map(|g| g.into_primitive().tensor()),
        );
        match pushed {
            Ok(()) => self.ids.push(param.id),
            Err(err) => self.error = Some(err),
        }
    }
}

/// Puts the averaged gradients back under their parameter ids.
struct PutBack<'a, B: AutodiffBackend> {
    grads: &'a mut GradientsParams,
    averaged: HashMap<ParamId, FloatTensor<B::InnerBackend>>,
}

impl<B: AutodiffBackend> ModuleVisitor<B> for PutBack<'_, B> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        if let Some(grad) = self.averaged.remove(&param.id) {
            let grad = Tensor::<B::InnerBackend, D>::from_primitive(TensorPrimitive::Float(grad));
            self.grads.register(param.id, grad);
        }
    }
}
