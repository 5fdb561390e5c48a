//! The sharded optimizer's two walks over a module (ZeRO stage 1), written
//! once for both Burns: the averaged gradients of the parameters this rank
//! owns, and every other parameter's updated value from its owner. The
//! communication is burn-ddp-comm's [`Sharder`]; each front-end's
//! `ShardedOptimizer` steps its Burn's optimizer in between and installs
//! the received values (its shim's `install_values`).

use super::config::ShardConfig;
use super::contract::FlatGrad;
use super::gradients::TensorGradients;
use super::sync::{check_backend, GradWalker};
use burn::optim::GradientsParams;
use burn_ddp_comm::{CommError, ParamLayout, ProcessGroup, ReduceOp, Result};
use burn_ddp_comm::{GradientSet, Sharder};

impl ShardConfig {
    /// The sharder this configuration describes, over `group`; a bad
    /// setting is an error naming the rank and the setting.
    pub(crate) fn sharder(&self, group: &ProcessGroup) -> Result<Sharder> {
        let rank = group.rank();
        let (mb, limit) = (self.bucket_cap_mb, self.padding_limit);
        let bad = |setting: &str, message: String| {
            Err(CommError::config(
                Some(rank),
                setting,
                format!("rank {rank}: ShardConfig {setting} = {message}"),
            ))
        };
        if !(mb.is_finite() && mb > 0.0 && mb < 1e12) {
            return bad(
                "bucket_cap_mb",
                format!("{mb} must be a positive number of MiB (25 by default, as DDP's)"),
            );
        }
        if !(limit.is_finite() && limit >= 1.0) {
            return bad(
                "padding_limit",
                format!(
                    "{limit} must be a number of at least 1 (1.5 by default: a round padded \
                     beyond 1.5 times its elements is all-reduced instead)"
                ),
            );
        }
        if let Some(norm) = self.max_grad_norm {
            if !(norm.is_finite() && norm > 0.0) {
                return bad(
                    "max_grad_norm",
                    format!("{norm} must be a positive number (or None: no clipping)"),
                );
            }
        }
        let cap_bytes = ((mb * 1024.0 * 1024.0) as usize).max(1);
        Ok(Sharder::new(group, cap_bytes, limit))
    }
}

/// The gradients in `grads` averaged over the ranks, keeping only those of
/// the parameters this rank owns (the others are dropped once sent). Every
/// trainable parameter takes part, in declaration order; one missing from
/// `grads` counts as zero. In a world of one, `grads` as they are. With
/// `max_grad_norm`, clipped to that norm over the whole model
/// ([`clip_to_global_norm`]). Collective.
pub(crate) fn scatter_gradients<G: FlatGrad>(
    sharder: &mut Sharder,
    walk: impl GradWalker<G>,
    mut grads: GradientsParams,
    max_grad_norm: Option<f64>,
) -> Result<GradientsParams> {
    let group = sharder.group()?;
    let mut set = None;
    let mut error = None;
    walk(&mut |param| {
        if error.is_some() {
            return;
        }
        let set =
            set.get_or_insert_with(|| TensorGradients::new(group.rank(), param.grad_device()));
        let grad = param.take_grad(&mut grads);
        if let Err(err) = set.push(param.id(), param.dims(), param.dtype(), grad) {
            error = Some(err);
        }
    });
    if let Some(err) = error {
        return Err(err);
    }
    let Some(mut set) = set else {
        return Ok(grads);
    };
    if !group.synchronizes() {
        // A world of one: the inner optimizer's step exactly; the plan (this
        // rank owns everything) only for `plan()`.
        let layout = set.params().iter().map(|p| p.layout.clone()).collect();
        sharder.plan_for(layout)?;
    } else {
        // Host tensors with BURN_DDP_BACKEND=nccl are refused, as for DDP.
        check_backend(&group, &set)?;
    }
    let mut averaged = if sharder.scatter_gradients(&mut set)? {
        set.into_averaged()
    } else {
        set.into_original()
    };
    if let Some(max_norm) = max_grad_norm {
        clip_to_global_norm(&group, &mut averaged, max_norm)?;
    }
    let mut averaged = averaged.into_iter();
    walk(&mut |param| {
        if let Some(grad) = averaged.next().flatten() {
            param.put_grad(&mut grads, grad);
        }
    });
    Ok(grads)
}

/// PyTorch's `clip_grad_norm_` over every parameter, on sharded gradients:
/// each rank sums the squares of the averaged gradients it owns (owners are
/// disjoint, so the ranks' sums add up to the whole model's), one all-reduce
/// of that number gives the global norm, and every owned gradient is scaled
/// by `max_norm / (norm + 1e-6)` where that is below 1 (a NaN norm makes
/// every gradient NaN, as in PyTorch, rather than passing unclipped).
/// Collective.
fn clip_to_global_norm<G: FlatGrad>(
    group: &ProcessGroup,
    owned: &mut [Option<G>],
    max_norm: f64,
) -> Result<()> {
    let mine: Vec<&G> = owned.iter().flatten().collect();
    let mut squares = [G::sum_of_squares(&mine)];
    if group.synchronizes() {
        group.all_reduce(&mut squares, ReduceOp::Sum)?;
    }
    let norm = squares[0].sqrt();
    let factor = max_norm / (norm + 1e-6);
    if factor.is_nan() || factor < 1.0 {
        for grad in owned.iter_mut() {
            *grad = grad.take().map(|g| g.scaled(factor));
        }
    }
    Ok(())
}

/// Every trainable parameter's value from its owner, in declaration order:
/// `Some` for those this rank does not own (to install), `None` for its own.
/// Call it right after the step that followed [`scatter_gradients`].
/// Collective.
pub(crate) fn gather_values<G: FlatGrad>(
    sharder: &mut Sharder,
    walk: impl GradWalker<G>,
) -> Result<Vec<Option<G>>> {
    let group = sharder.group()?;
    if !group.synchronizes() {
        return Ok(Vec::new());
    }
    let mut set = None;
    let mut index = 0;
    let mut error = None;
    walk(&mut |param| {
        if error.is_some() {
            return;
        }
        let set =
            set.get_or_insert_with(|| TensorGradients::new(group.rank(), param.grad_device()));
        let value = sharder.owns(index).then(|| param.value());
        index += 1;
        if let Err(err) = set.push(param.id(), param.dims(), param.dtype(), value) {
            error = Some(err);
        }
    });
    if let Some(err) = error {
        return Err(err);
    }
    let Some(mut set) = set else {
        return Ok(Vec::new());
    };
    sharder.gather_values(&mut set)?;
    Ok(set.into_averaged())
}

/// Each trainable parameter's id, in declaration order, and whether this
/// rank owns it under the plan for the model `walk` walks and the group's
/// size (what splitting a whole optimizer record needs). No communication.
pub(crate) fn ownership<G: FlatGrad>(
    sharder: &mut Sharder,
    walk: impl GradWalker<G>,
) -> Result<Vec<(u64, bool)>> {
    let rank = sharder.group()?.rank();
    let mut ids = Vec::new();
    let mut layout = Vec::new();
    let mut error = None;
    walk(&mut |param| {
        match super::dtype::gradient_wire(rank, param.dtype()) {
            Ok(dtype) => layout.push(ParamLayout {
                shape: param.dims(),
                dtype,
            }),
            Err(err) => error = error.take().or(Some(err)),
        }
        ids.push(param.id());
    });
    if let Some(err) = error {
        return Err(err);
    }
    let plan = sharder.plan_for(layout)?;
    Ok(ids
        .into_iter()
        .zip(&plan.owners)
        .map(|(id, &owner)| (id, owner == rank))
        .collect())
}

/// Each trained parameter's id, in declaration order (its position is its
/// index).
pub(crate) fn trained_ids<G: FlatGrad>(walk: impl GradWalker<G>) -> Vec<u64> {
    let mut ids = Vec::new();
    walk(&mut |param| ids.push(param.id()));
    ids
}

/// Optimizer state for parameters the model does not have: a record saved
/// for another model, or the model's own record not loaded first (Burn's
/// parameter ids are random until a record sets them).
pub(crate) fn foreign_state(rank: usize, id: u64, params: usize) -> CommError {
    CommError::InvalidArgument {
        rank,
        message: format!(
            "the optimizer state holds parameter id {id}, which none of the model's {params} \
             trained parameters has: load the model's record saved with the optimizer state \
             first (parameter ids come from it), or state saved for this model"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_shard_settings_are_errors_naming_the_rank_and_the_setting() {
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        assert!(ShardConfig::new().sharder(&group).is_ok());
        let clipped = ShardConfig::new().with_max_grad_norm(Some(1.0));
        assert!(clipped.sharder(&group).is_ok());
        let cases = [
            (ShardConfig::new().with_bucket_cap_mb(0.0), "bucket_cap_mb"),
            (ShardConfig::new().with_padding_limit(0.5), "padding_limit"),
            (
                ShardConfig::new().with_max_grad_norm(Some(-1.0)),
                "max_grad_norm",
            ),
            (
                ShardConfig::new().with_max_grad_norm(Some(f64::NAN)),
                "max_grad_norm",
            ),
        ];
        for (config, name) in cases {
            let Err(err) = config.sharder(&group) else {
                panic!("{name}: a bad setting was taken");
            };
            assert!(
                matches!(&err, CommError::Config { rank: Some(0), setting, .. } if setting == name),
                "{err:?}"
            );
            let text = err.to_string();
            assert!(
                text.contains(&format!("rank 0: ShardConfig {name} = ")),
                "{text}"
            );
        }
    }
}
