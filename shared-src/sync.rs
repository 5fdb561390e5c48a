//! Averaging a model's gradients across ranks by walking the model: each
//! trainable parameter's gradient taken out of `GradientsParams`, handed to
//! the model's reducer (which does the rest: buckets, the layout check, the
//! collectives, the average) and the average put back.

use super::contract::{EachGrad, FlatGrad};
use super::gradients::TensorGradients;
use super::session::SESSION;
use burn::optim::GradientsParams;
use burn_ddp_comm::{CollectiveBackend, GradientSet, ParamInfo, Placement};
use burn_ddp_comm::{ProcessGroup, Reducer, Result};
use std::collections::HashMap;
use std::sync::Mutex;

/// A walk over a module's trainable parameters, in declaration order (each
/// shim's `grad_walker`).
pub(crate) trait GradWalker<G: FlatGrad>: Fn(EachGrad<'_, G>) {}
impl<G: FlatGrad, F: Fn(EachGrad<'_, G>)> GradWalker<G> for F {}

/// Averages the gradients of the model `walk` walks over all ranks: over the
/// group and with the buckets it was wrapped with, or over the default group
/// if it never was. Every trainable parameter takes part, in declaration
/// order; one missing from `grads` counts as zero. Collective.
pub(crate) fn sync_gradients<G: FlatGrad>(
    first_trainable: Option<u64>,
    walk: impl GradWalker<G>,
    grads: GradientsParams,
) -> Result<GradientsParams> {
    let Some(target) = SESSION.target_for(first_trainable)? else {
        return Ok(grads);
    };
    let group = target.group()?;
    sync_module(target.reducer(), &group, walk, grads)
}

/// [`sync_gradients`] with a given reducer (a Learner strategy's own).
pub(crate) fn sync_module<G: FlatGrad>(
    reducer: &Mutex<Reducer>,
    group: &ProcessGroup,
    walk: impl GradWalker<G>,
    mut grads: GradientsParams,
) -> Result<GradientsParams> {
    if !group.synchronizes() {
        return Ok(grads);
    }
    let mut set: Option<TensorGradients<G>> = None;
    let mut ids = Vec::new();
    let mut error = None;
    walk(&mut |param| {
        if error.is_some() {
            return;
        }
        let set =
            set.get_or_insert_with(|| TensorGradients::new(group.rank(), param.grad_device()));
        let grad = param.take_grad(&mut grads);
        match set.push(param.id(), param.dims(), param.dtype(), grad) {
            Ok(()) => ids.push(param.id()),
            Err(err) => error = Some(err),
        }
    });
    if let Some(err) = error {
        return Err(err);
    }
    let Some(mut set) = set else {
        return Ok(grads);
    };
    check_backend(group, &set)?;
    let moved = SESSION.synchronize(reducer, &mut set)?;
    let averaged = if moved {
        set.into_averaged()
    } else {
        set.into_original()
    };
    let mut averaged: HashMap<u64, G> = ids
        .into_iter()
        .zip(averaged)
        .filter_map(|(id, grad)| Some((id, grad?)))
        .collect();
    walk(&mut |param| {
        if let Some(grad) = averaged.remove(&param.id()) {
            param.put_grad(&mut grads, grad);
        }
    });
    Ok(grads)
}

/// The parameters `walk` walks as a reducer lists them, before any
/// gradient exists (a round begun for the coming backward pass: Burn
/// 0.21's Learner).
#[allow(dead_code)]
pub(crate) fn walked_params<G: FlatGrad>(
    rank: usize,
    walk: impl GradWalker<G>,
) -> Result<Vec<ParamInfo>> {
    let mut set: Option<TensorGradients<G>> = None;
    let mut error = None;
    walk(&mut |param| {
        let set = set.get_or_insert_with(|| TensorGradients::new(rank, param.grad_device()));
        if error.is_none() {
            error = set
                .push(param.id(), param.dims(), param.dtype(), None)
                .err();
        }
    });
    match error {
        Some(err) => Err(err),
        None => Ok(set.map(|set| set.params().to_vec()).unwrap_or_default()),
    }
}

/// `BURN_DDP_BACKEND=nccl` with gradients in host memory is refused, as it is
/// for tensor collectives.
pub(crate) fn check_backend<G: FlatGrad>(
    group: &ProcessGroup,
    set: &TensorGradients<G>,
) -> Result<()> {
    if group.device_backend() == CollectiveBackend::Nccl && set.placement() == Placement::Host {
        return Err(G::nccl_refused(group, set.device()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::contract::testing::{self as shim, TestGrad};
    use burn_ddp_comm::CommError;

    #[test]
    fn nccl_with_gradients_in_host_memory_is_refused_naming_why() {
        let set = TensorGradients::<TestGrad>::new(0, shim::test_device());
        let nccl = ProcessGroup::builder(0, 1)
            .device_backend(CollectiveBackend::Nccl)
            .build()
            .unwrap();
        let err = check_backend(&nccl, &set).unwrap_err();
        assert!(
            matches!(&err, CommError::Config { rank: Some(0), setting, .. } if setting == burn_ddp_comm::BACKEND_VAR),
            "{err:?}"
        );
        let err = err.to_string();
        assert!(err.contains("rank 0: BURN_DDP_BACKEND=nccl, but "), "{err}");
        for backend in [CollectiveBackend::Auto, CollectiveBackend::Host] {
            let group = ProcessGroup::builder(0, 1)
                .device_backend(backend)
                .build()
                .unwrap();
            check_backend(&group, &set).unwrap();
        }
    }
}
