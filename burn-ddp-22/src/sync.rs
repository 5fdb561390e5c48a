//! Averaging a model's gradients across ranks: taking them out of
//! `GradientsParams`, handing them to the model's reducer (which does the
//! rest: buckets, the layout check, the collectives, the average) and putting
//! the averages back.
//!
//! Burn 0.22 has no hook inside `backward()` (its `Tensor` has no backend
//! parameter, so no backend decorator), so the call is explicit:
//! `sync_gradients(&model, grads)` between `GradientsParams::from_grads` and
//! `optimizer.step`, where PyTorch's DDP averages inside `backward()`.

use crate::gradients::TensorGradients;
use crate::{ProcessGroup, Reducer, Result};
use burn::module::{Module, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::Tensor;
use burn_ddp_comm::reducer::models;
use std::collections::HashMap;
use std::sync::Mutex;

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
pub fn sync_stats_of<M: Module>(model: &M) -> Option<SyncStats> {
    models::stats_of(first_trainable(model))
}

/// The id of `model`'s first trainable parameter, which names its scope.
pub(crate) fn first_trainable<M: Module>(model: &M) -> Option<u64> {
    struct FirstTrainable(Option<ParamId>);
    impl ModuleVisitor for FirstTrainable {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if self.0.is_none() && param.val().is_require_grad() {
                self.0 = Some(param.id);
            }
        }
    }
    let mut first = FirstTrainable(None);
    model.visit(&mut first);
    first.0.map(|id| id.val())
}

/// Averages the gradients of `model` over all ranks (PyTorch's DDP does this
/// inside `backward()`; on Burn 0.22 it is this call, before
/// `optimizer.step`): over the group and with the buckets the model was
/// wrapped with ([`crate::wrap`]), or over the default group if it never was.
///
/// Every trainable parameter takes part, in declaration order; one missing
/// from `grads` (not reached by this rank's forward pass) counts as zero.
/// Collective: every rank calls it at the same point.
///
/// Gradient accumulation is summing `GradientsParams` over micro-batches
/// (Burn's `GradientsAccumulator`) and calling this once, on the sum: one
/// all-reduce for all of them.
pub fn sync_gradients<M: Module>(model: &M, grads: GradientsParams) -> Result<GradientsParams> {
    let Some(target) = models::target_for(first_trainable(model))? else {
        return Ok(grads);
    };
    let group = target.group()?;
    sync_module(target.reducer(), &group, model, grads)
}

/// [`sync_gradients`] with a given reducer (a Learner strategy's own).
pub(crate) fn sync_module<M: Module>(
    reducer: &Mutex<Reducer>,
    group: &ProcessGroup,
    model: &M,
    mut grads: GradientsParams,
) -> Result<GradientsParams> {
    let mut collect = CollectGrads {
        grads: &mut grads,
        rank: group.rank(),
        ids: Vec::new(),
        set: None,
        error: None,
    };
    model.visit(&mut collect);
    let CollectGrads {
        ids, set, error, ..
    } = collect;
    if let Some(err) = error {
        return Err(err);
    }
    let Some(mut set) = set else {
        return Ok(grads);
    };
    check_backend(group, &set)?;
    let moved = reducer.lock().unwrap().synchronize(&mut set)?;
    let averaged = if moved {
        set.into_averaged()
    } else {
        set.into_original()
    };
    let mut put_back = PutBack {
        grads: &mut grads,
        averaged: ids
            .into_iter()
            .zip(averaged)
            .filter_map(|(id, grad)| Some((id, grad?)))
            .collect(),
    };
    model.visit(&mut put_back);
    Ok(grads)
}

/// `BURN_DDP_BACKEND=nccl` with gradients in host memory is refused, as it is
/// for tensor collectives.
fn check_backend(group: &ProcessGroup, set: &TensorGradients) -> Result<()> {
    if group.device_backend() == burn_ddp_comm::CollectiveBackend::Nccl
        && set.placement() == burn_ddp_comm::Placement::Host
    {
        return Err(crate::device::nccl_refused(
            group,
            "the gradients are",
            set.device(),
        ));
    }
    Ok(())
}

/// Takes each trainable parameter's gradient out, in declaration order.
struct CollectGrads<'a> {
    grads: &'a mut GradientsParams,
    rank: usize,
    ids: Vec<ParamId>,
    set: Option<TensorGradients>,
    error: Option<crate::CommError>,
}

impl ModuleVisitor for CollectGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let value = param.val();
        if !value.is_require_grad() || self.error.is_some() {
            return; // buffers (batch-norm statistics) are not trained
        }
        let dims = value.dims();
        let numel = dims.iter().product::<usize>();
        let set = self
            .set
            .get_or_insert_with(|| TensorGradients::new(self.rank, value.device().inner()));
        let grad = self.grads.remove::<D>(param.id).map(|g| g.reshape([numel]));
        match set.push(param.id.val(), dims.to_vec(), value.dtype(), grad) {
            Ok(()) => self.ids.push(param.id),
            Err(err) => self.error = Some(err),
        }
    }
}

/// Puts the averaged gradients back under their parameter ids, in shape.
struct PutBack<'a> {
    grads: &'a mut GradientsParams,
    averaged: HashMap<ParamId, Tensor<1>>,
}

impl ModuleVisitor for PutBack<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if let Some(grad) = self.averaged.remove(&param.id) {
            let dims: [usize; D] = param.val().dims();
            self.grads.register::<D>(param.id, grad.reshape(dims));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;
    use burn_ddp_comm::CollectiveBackend;

    #[test]
    fn nccl_with_gradients_in_host_memory_is_refused_naming_why() {
        let set = TensorGradients::new(0, Device::flex());
        let nccl = ProcessGroup::builder(0, 1)
            .device_backend(CollectiveBackend::Nccl)
            .build()
            .unwrap();
        let err = check_backend(&nccl, &set).unwrap_err().to_string();
        let why = if cfg!(feature = "cuda") {
            "the gradients are on Device<Flex"
        } else {
            "burn-ddp-22 was built without its `cuda` feature"
        };
        assert!(
            err.contains(&format!("rank 0: BURN_DDP_BACKEND=nccl, but {why}")),
            "{err}"
        );
        for backend in [CollectiveBackend::Auto, CollectiveBackend::Host] {
            let group = ProcessGroup::builder(0, 1)
                .device_backend(backend)
                .build()
                .unwrap();
            check_backend(&group, &set).unwrap();
        }
    }
}
