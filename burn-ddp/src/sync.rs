//! Averaging gradients across ranks: finding them and handing them to the
//! model's reducer, which does the rest (buckets, the layout check, the
//! collectives, the average).
//!
//! Two ways in: `Ddp<B>::backward` (parameters found by watching them being marked trainable,
//! each wrapped model synchronised with its own reducer) and
//! [`sync_gradients`] (parameters found by walking a module, for any
//! autodiff backend).

use crate::no_sync::{self, Silence};
use crate::overlap::{
    self,
    asked::{self, Asked},
    pass::{Begun, Ended, Installed},
};
use crate::shared::gradients::{FlatGrad, TensorGradients};
use crate::shared::session::SESSION;
pub use crate::shared::session::{reset_sync_stats, sync_stats};
use crate::shared::walk::first_trainable;
use crate::shim;
use crate::tracking::{self, LiveParam, TrackedAutodiff};
use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::{Shape, TensorData};
use burn_backend::tensor::FloatTensor;
use burn_ddp_comm::ParamLayout;
pub use burn_ddp_comm::SyncStats;
use burn_ddp_comm::{CommError, GradientSet, Placement, ProcessGroup, Reducer, Result};
use burn_ddp_training::session::{ModelScope, DEFAULT_SCOPE};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// What synchronising `model`'s gradients cost so far: its own reducer's
/// figures if it was wrapped, else those of the default group's reducer
/// (shared by every model never wrapped); `None` without either.
pub fn sync_stats_of<B: AutodiffBackend, M: AutodiffModule<B>>(model: &M) -> Option<SyncStats> {
    SESSION.stats_of(first_trainable(shim::walker(model)))
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
/// let grads = burn_ddp::sync::sync_gradients(&model, accumulator.grads())?;
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

thread_local! {
    /// The failure of the gradient averaging in this thread's last
    /// `backward()`, kept for [`try_backward`].
    static FAILURE: std::cell::RefCell<Option<crate::CommError>> =
        const { std::cell::RefCell::new(None) };
}

thread_local! {
    /// Whether this thread is inside [`try_backward`], which returns the
    /// failure instead of letting it end the program.
    static TRYING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Ends `backward()` with `err`: for [`try_backward`] to return (the
/// unwinding is quiet there), or as a one-line panic.
pub(crate) fn fail_backward(err: crate::CommError) -> ! {
    let message = format!("burn-ddp: gradient synchronisation failed: {err}");
    FAILURE.with(|kept| *kept.borrow_mut() = Some(err));
    if TRYING.with(std::cell::Cell::get) {
        std::panic::resume_unwind(Box::new(message))
    }
    burn_ddp_training::failure::panic_with_message(message)
}

/// `loss.backward()`, with a failure of the gradient averaging (a rank
/// killed, stalled past the timeout or cut off) returned as the error
/// instead of a panic, so the ranks still there can go on: form the next
/// generation of the group ([`reform_process_group`](crate::reform_process_group)),
/// wrap the model again over it and redo the step (the parameters and the
/// optimizer are as before the step). Any other panic goes on unwinding.
pub fn try_backward<B: AutodiffBackend>(
    loss: burn::tensor::Tensor<B, 1>,
) -> crate::Result<B::Gradients> {
    FAILURE.with(|kept| kept.borrow_mut().take());
    let was = TRYING.with(|trying| trying.replace(true));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| loss.backward()));
    TRYING.with(|trying| trying.set(was));
    match outcome {
        Ok(grads) => Ok(grads),
        Err(payload) => match FAILURE.with(|kept| kept.borrow_mut().take()) {
            Some(err) => Err(err),
            None => std::panic::resume_unwind(payload),
        },
    }
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
    let scope = first_trainable(shim::walker(model))
        .and_then(|id| SESSION.of_param(id))
        .map_or(DEFAULT_SCOPE, |scope| scope.id);
    NoSyncGuard {
        _silence: Silence::one(scope),
        _not_send: std::marker::PhantomData,
    }
}

/// Whether backward passes on this thread currently synchronise (no
/// [`no_sync`] guard is alive).
pub fn sync_enabled() -> bool {
    no_sync::all_enabled()
}

/// A wrapped model's state (none: the default scope) and its live parameters.
type ScopeParams<B> = (Option<Arc<ModelScope>>, Vec<LiveParam<B>>);

/// `Ddp<B>::backward`: `B`'s backward, then each wrapped model's gradients
/// averaged with its own reducer, in wrap order (without wrapped models,
/// every parameter over the default group). The first model wrapped with
/// `overlap_backward` sends its buckets during backward, as soon as their
/// gradients are final ([`crate::overlap`]), and is synchronised first. The
/// gradients come back with the synchronisation's outcome.
pub(crate) fn backward<B: TrackedAutodiff>(tensor: FloatTensor<B>) -> (B::Gradients, Result<()>) {
    let step = overlap::forward::end_step();
    if let Some(asked) = asked::take_for_backward() {
        return (backward_asked::<B>(tensor, &step, asked), Ok(()));
    }
    if !no_sync::all_enabled() {
        return (B::backward(tensor), Ok(()));
    }
    let early = if step.collective_inside {
        None
    } else {
        begin_early::<B>(&step)
    };
    let installed = Installed::new(early);
    let mut grads = B::backward(tensor);
    let early = installed.take();
    // After backward: tensors only its graph kept alive are gone, so these
    // are the parameters the models hold.
    let outcome = synchronize_models::<B>(&mut grads, models::<B>(), early);
    (grads, outcome)
}

/// The live parameters by model, in wrap order. Parameters of a model
/// forgotten with its group (destroy_process_group) are back in the default
/// scope, as if never wrapped.
fn models<B: TrackedAutodiff>() -> BTreeMap<u64, ScopeParams<B>> {
    let mut by_scope: BTreeMap<u64, Vec<LiveParam<B>>> = BTreeMap::new();
    for param in tracking::live_params::<B>() {
        by_scope.entry(param.scope).or_default().push(param);
    }
    let mut models: BTreeMap<u64, ScopeParams<B>> = BTreeMap::new();
    for (id, params) in by_scope {
        let model = (id != DEFAULT_SCOPE).then(|| SESSION.by_id(id)).flatten();
        let id = model.as_ref().map_or(DEFAULT_SCOPE, |m| m.id);
        let entry = models.entry(id).or_insert_with(|| (model, Vec::new()));
        entry.1.extend(params);
    }
    models
}

/// Whether the model of `scope` sends its buckets during backward and is
/// synchronised first: wrapped with `overlap_backward`, not under `no_sync`.
fn overlaps(scope: u64, model: &Option<Arc<ModelScope>>) -> bool {
    model.as_ref().is_some_and(|m| m.overlaps_backward()) && no_sync::enabled(scope)
}

/// The layout each model had at its last synchronisation, by scope: the
/// parameters every rank agreed the model holds.
static SYNCED_LAYOUTS: Mutex<BTreeMap<u64, Vec<ParamLayout>>> = Mutex::new(BTreeMap::new());

/// A round for the first model that overlaps, begun before backward, with
/// the parameters no op of the forward pass took already in as zeros (the
/// gradient an unused parameter gets). Before backward, tensors the graph
/// alone keeps alive (replaced parameters not yet freed) still count as
/// parameters, differently on each rank; so the round begins only when the
/// model's parameters have the layout every rank agreed at its last
/// synchronisation, else the model waits for the end of backward (a first
/// step, a changed model). Only one model a step overlaps: two models'
/// collectives over one group must come in the same order on every rank.
///
/// Only the leading buckets whose every gradient is reported by a hook (or
/// unused) can leave before backward ends; the hooks of the others do not
/// report (their gradients are read once backward is over, without a copy),
/// and without such a bucket there is no round at all.
fn begin_early<B: TrackedAutodiff>(step: &overlap::forward::Step) -> Option<Begun> {
    if step.hooked.is_empty() {
        return None; // no model overlaps, or no gradient will be reported
    }
    let overlapping = || {
        let models = models::<B>();
        models.into_iter().find(|(id, (m, _))| overlaps(*id, m))
    };
    let (scope, (model, mut params)) = overlapping()?;
    let model = model?;
    let mut reducer = model.reducer.lock().unwrap();
    let group = reducer.group().ok()?;
    if !model.overlaps_on_gpu() && reduced_on_gpu::<B>(&group, &params[0]) {
        return None; // NCCL: after backward unless asked for (Overlap::Always)
    }
    let agreed = SYNCED_LAYOUTS.lock().unwrap().get(&scope).cloned()?;
    let agreeing = |params: &[LiveParam<B>]| {
        let set = gradient_set::<B>(&group, params, |_, _| None).ok()?;
        let layouts = set.params().iter().map(|p| &p.layout);
        layouts.eq(agreed.iter()).then_some(set)
    };
    let set = match agreeing(&params) {
        Some(set) => set,
        None => {
            // Replaced parameters that only Burn's graph still holds count
            // until it lets them go; once it has, the model may agree.
            tracking::release_orphaned_nodes::<B>(&params[0]);
            params = overlapping().filter(|(id, _)| *id == scope)?.1 .1;
            agreeing(&params)?
        }
    };
    early_round(&mut reducer, set.params(), step, scope)
}

/// A round of `reducer` over `params` whose leading buckets can leave
/// during backward: every gradient in them reported by a hook, or unused
/// (in as zeros at once). `None` when no bucket can.
fn early_round(
    reducer: &mut Reducer,
    params: &[burn_ddp_comm::ParamInfo],
    step: &overlap::forward::Step,
    scope: u64,
) -> Option<Begun> {
    let unused = |i: usize| !step.used.contains(&params[i].id);
    let early = |i: usize| unused(i) || step.hooked.contains(&params[i].id);
    let mut round = reducer.begin(params).ok()??;
    let plan = reducer.plan();
    let leading = (0..plan.buckets.len())
        .take_while(|&b| plan.members(b).iter().all(|&i| early(i)))
        .count();
    let reporting: Vec<(u64, usize)> = (0..leading)
        .flat_map(|b| plan.members(b).iter().copied())
        .filter(|&i| !unused(i))
        .map(|i| (params[i].id, i))
        .collect();
    if reporting.is_empty() {
        // No leading bucket, or the model is not in this step's graph.
        reducer.abandon(round);
        return None;
    }
    let unused: Vec<u64> = (0..params.len())
        .filter(|&i| unused(i))
        .map(|i| {
            round.zero(i);
            params[i].id
        })
        .collect();
    Some(Begun {
        scope,
        round,
        params: params.iter().map(|p| p.id).collect(),
        numels: params
            .iter()
            .map(|p| p.layout.shape.iter().product())
            .collect(),
        reporting,
        unused,
    })
}

/// The backward pass of a Learner step whose average the strategy asked
/// for ([`asked`]): the round's leading buckets leave as their hooks
/// report, and the rest once Burn's backward is over, as for a wrapped
/// model (all of it then, where no bucket can leave early), so the step
/// returns its gradients averaged, as PyTorch's DDP step sees them, and
/// whatever it does with them applies to the averages. The question counts
/// even under `no_sync` (the strategy runs its steps so).
fn backward_asked<B: TrackedAutodiff>(
    tensor: FloatTensor<B>,
    step: &overlap::forward::Step,
    asked: Asked,
) -> B::Gradients {
    let begun = if step.collective_inside || step.hooked.is_empty() {
        None
    } else {
        let mut reducer = asked.reducer.lock().unwrap();
        early_round(&mut reducer, &asked.params, step, DEFAULT_SCOPE)
    };
    let installed = Installed::new(begun);
    let mut grads = B::backward(tensor);
    let ended = installed.take();
    let mut live: HashMap<u64, LiveParam<B>> = tracking::live_params::<B>()
        .into_iter()
        .map(|param| (param.id, param))
        .collect();
    let ids = asked.params.iter().map(|p| p.id);
    let params: Option<Vec<LiveParam<B>>> = ids.map(|id| live.remove(&id)).collect();
    let averaged = match (params, ended) {
        (Some(params), ended) => {
            let group = asked.reducer.lock().unwrap().group();
            group
                .and_then(|group| {
                    sync_params::<B>(&asked.reducer, &group, params, &mut grads, ended, false)
                })
                .map(|_| ())
        }
        // Nothing sent: the strategy averages after the step, as without overlap.
        (None, None) => {
            asked::answer(None);
            return grads;
        }
        // The walk found them through the tracking: a burn-ddp bug.
        (None, Some(_)) => Err(CommError::InvalidArgument {
            rank: rank_here(),
            message: "a parameter the Learner's round began with is not tracked (a burn-ddp \
                      bug; please report it)"
                .into(),
        }),
    };
    asked::answer(Some(averaged));
    grads
}

/// Whether the gradients of the model `param` belongs to are averaged by
/// NCCL on the GPU (a CUDA tensor, a group that reduces there).
fn reduced_on_gpu<B: TrackedAutodiff>(group: &ProcessGroup, param: &LiveParam<B>) -> bool {
    let device = B::float_device(&param.key);
    match <shim::Grad<B> as FlatGrad>::placement(&device) {
        Placement::Device { ordinal } => group.uses_device_collectives(ordinal).unwrap_or(true),
        Placement::Host => false,
    }
}

/// Each model's gradients averaged: the first model that overlaps first
/// (its buckets have been leaving during backward), then the others in wrap
/// order.
fn synchronize_models<B: TrackedAutodiff>(
    grads: &mut B::Gradients,
    models: BTreeMap<u64, ScopeParams<B>>,
    mut early: Option<Ended>,
) -> Result<()> {
    let first = models
        .iter()
        .find(|(id, (m, _))| overlaps(**id, m))
        .map(|(id, _)| *id);
    let (first, rest): (Vec<_>, Vec<_>) =
        models.into_iter().partition(|(id, _)| Some(*id) == first);
    let wrapped = SESSION.any_wrapped();
    for (id, (model, params)) in first.into_iter().chain(rest) {
        if !no_sync::enabled(id) {
            continue;
        }
        if id == DEFAULT_SCOPE {
            if wrapped {
                check_outside_models::<B>(&params, grads)?;
                continue;
            }
            let Some(state) = SESSION.required_if_distributed()? else {
                continue;
            };
            sync_params::<B>(&state.reducer, &state.group, params, grads, None, false)?;
            continue;
        }
        let model = model.expect("a wrapped model's scope");
        let group = model.reducer.lock().unwrap().group().map_err(|_| {
            CommError::config(
                None,
                "wrap",
                "a wrapped model's process group was destroyed, but its backward pass \
                 still runs; wrap the model again over a live group",
            )
        })?;
        let round = early.take_if(|ended| ended.scope == id);
        let keep = model.overlaps_backward();
        let layout = sync_params::<B>(&model.reducer, &group, params, grads, round, keep)?;
        if let Some(layout) = layout {
            SYNCED_LAYOUTS.lock().unwrap().insert(id, layout);
        }
    }
    Ok(())
}

/// The gradients of `params` (those `grad` gives, by position) as the
/// reducer's set.
fn gradient_set<B: TrackedAutodiff>(
    group: &ProcessGroup,
    params: &[LiveParam<B>],
    mut grad: impl FnMut(usize, &LiveParam<B>) -> Option<shim::Grad<B>>,
) -> Result<TensorGradients<shim::Grad<B>>> {
    let device = B::float_device(&params[0].key);
    let mut set = TensorGradients::<shim::Grad<B>>::new(group.rank(), device);
    for (index, param) in params.iter().enumerate() {
        let grad = grad(index, param);
        set.push(param.id, param.shape.clone(), param.dtype, grad)?;
    }
    Ok(set)
}

/// One scope's gradients, out of `grads`, averaged (ending the round begun
/// for it before backward, if there is one), and back in. Returns the
/// layout synchronised, with `keep_layout`.
fn sync_params<B: TrackedAutodiff>(
    reducer: &Mutex<Reducer>,
    group: &ProcessGroup,
    params: Vec<LiveParam<B>>,
    grads: &mut B::Gradients,
    mut round: Option<Ended>,
    keep_layout: bool,
) -> Result<Option<Vec<ParamLayout>>> {
    if !group.synchronizes() || params.is_empty() {
        return Ok(None);
    }
    if let Some(ended) = &round {
        check_round::<B>(&params, ended, grads)?;
    }
    // The gradients the round took during backward come back as they were;
    // a parameter this pass did not reach gets a zero gradient, so every
    // rank issues the same collectives.
    let (mut taken, mut kept): (HashMap<usize, TensorData>, _) = match &mut round {
        Some(ended) => (
            std::mem::take(&mut ended.taken).into_iter().collect(),
            std::mem::take(&mut ended.kept_on_device),
        ),
        None => Default::default(),
    };
    let device = B::float_device(&params[0].key);
    let mut set = gradient_set::<B>(group, &params, |index, param| {
        let numel = param.shape.iter().product();
        if let Some(grad) = kept.remove(&index) {
            let grad = grad.downcast::<FloatTensor<B::InnerBackend>>();
            return Some(shim::flat_grad(*grad.expect("kept as this type"), numel));
        }
        let Some(mut data) = taken.remove(&index) else {
            return B::grad_remove(&param.key, grads).map(|g| shim::flat_grad(g, numel));
        };
        data.shape = Shape::new([numel]);
        let dtype = data.dtype;
        Some(FlatGrad::from_data(data, &device, dtype))
    })?;
    crate::shared::sync::check_backend(group, &set)?;
    let layout = keep_layout.then(|| set.params().iter().map(|p| p.layout.clone()).collect());
    let moved = match round {
        Some(ended) => SESSION.finish(reducer, ended.round?, &mut set)?,
        None => SESSION.synchronize(reducer, &mut set)?,
    };
    let averaged = if moved {
        set.into_averaged()
    } else {
        set.into_original()
    };
    for (param, grad) in params.iter().zip(averaged) {
        if let Some(grad) = grad {
            B::grad_replace(&param.key, grads, shim::shaped_grad(grad, &param.shape));
        }
    }
    Ok(layout)
}

/// A round begun before backward covers the parameters the model holds
/// after it, and those it took as unused got no gradient: otherwise its
/// buckets went out wrong, and this rank says why.
fn check_round<B: TrackedAutodiff>(
    params: &[LiveParam<B>],
    ended: &Ended,
    grads: &B::Gradients,
) -> Result<()> {
    let rank = rank_here();
    // The Learner's rounds are the default scope's; a wrapped model's are its own.
    let fix = if ended.scope == DEFAULT_SCOPE {
        "train with DdpTraining::with_overlap_backward(burn_ddp::config::Overlap::Never)"
    } else {
        "wrap the model with DdpConfig::new().with_overlap_backward(burn_ddp::config::Overlap::Never)"
    };
    if !params.iter().map(|p| p.id).eq(ended.params.iter().copied()) {
        return Err(CommError::config(
            Some(rank),
            "overlap_backward",
            format!(
                "rank {rank}: the model's parameters changed during backward() ({} before, {} \
                 after), after its first buckets were sent; {fix}",
                ended.params.len(),
                params.len()
            ),
        ));
    }
    let seen_unused = |p: &&LiveParam<B>| ended.unused.contains(&p.id);
    let Some(param) = params
        .iter()
        .filter(seen_unused)
        .find(|p| B::grad(&p.key, grads).is_some())
    else {
        return Ok(());
    };
    Err(CommError::config(
        Some(rank),
        "overlap_backward",
        format!(
            "rank {rank}: a parameter (shape {:?}) got a gradient in backward() although no \
             operation of this step's forward pass took it through Ddp<B> (a graph built \
             before the previous backward?), so its bucket was sent with zeros; {fix}",
            param.shape
        ),
    ))
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
    let rank = rank_here();
    Err(CommError::config(
        Some(rank),
        "wrap",
        format!(
            "rank {rank}: a tensor that requires gradients (shape {:?}) got a gradient in \
         backward() but belongs to no wrapped model, so it would train on this rank's \
         gradient alone; wrap the model it belongs to with burn_ddp::wrap (again after \
         loading a record into it or moving it to another device), or make it a \
         constant (no require_grad)",
            stray.shape
        ),
    ))
}

/// This process's rank, as the session's groups know it (0 without any).
fn rank_here() -> usize {
    SESSION.rank().unwrap_or(0)
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
    let first = first_trainable(shim::walker(module));
    crate::shared::sync::sync_gradients(first, shim::grad_walker(module), grads)
}

/// [`sync_gradients`] with a given reducer (the Learner strategy's own).
#[cfg_attr(not(feature = "train"), allow(dead_code))]
pub(crate) fn sync_module<B: AutodiffBackend, M: AutodiffModule<B>>(
    reducer: &Mutex<Reducer>,
    group: &ProcessGroup,
    module: &M,
    grads: GradientsParams,
) -> Result<GradientsParams> {
    crate::shared::sync::sync_module(reducer, group, shim::grad_walker(module), grads)
}
