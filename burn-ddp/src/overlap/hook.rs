//! The readiness hook: an identity op between a parameter and its consumers
//! whose backward step runs once every consumer's has, so it is handed the
//! parameter's final gradient while backward goes on.
//!
//! Burn 0.21 runs backward steps level by level from the deepest (a node's
//! level is its deepest input's plus one, a leaf's is 0), so an op made on a
//! parameter would sit at level 1 and run last. The hook is placed at the
//! level of its consumer's other input instead (an untracked input one
//! level below sets it): no consumer's level changes, every original step
//! keeps its place, and the gradients stay bit for bit those without it
//! (checked below on random graphs). Every use of the parameter in the step
//! goes through the one hook, so a parameter used several times is final
//! when it fires, with no counting.

use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_autodiff::Autodiff;
use burn_backend::backend::Backend;
use burn_backend::tensor::FloatTensor;
use std::fmt;
use std::sync::Arc;

/// Handed, during backward, a parameter's node id and its final gradient;
/// gives the gradient back to be registered for the parameter, or keeps it
/// (`None`: whoever took it puts the parameter's gradient back later).
pub(crate) type OnReady<B> =
    Arc<dyn Fn(u64, FloatTensor<B>) -> Option<FloatTensor<B>> + Send + Sync>;

/// The hook's state: which parameter, and whom to tell.
struct Ready<B: Backend> {
    param: u64,
    on_ready: OnReady<B>,
}

impl<B: Backend> Clone for Ready<B> {
    fn clone(&self) -> Self {
        Self {
            param: self.param,
            on_ready: self.on_ready.clone(),
        }
    }
}

impl<B: Backend> fmt::Debug for Ready<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ready(parameter node {})", self.param)
    }
}

#[derive(Debug)]
struct GradientReady;

impl<B: Backend> Backward<B, 2> for GradientReady {
    type State = Ready<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let grad = grads.consume::<B>(&ops.node);
        let Some(grad) = (ops.state.on_ready)(ops.state.param, grad) else {
            return;
        };
        // The second input only set the hook's level: never tracked.
        if let Some(param) = &ops.parents[0] {
            grads.register::<B>(param.id, grad);
        }
    }
}

/// `param` through a readiness hook at backward level `level` (the level of
/// the shallowest other input of the ops that use it); `None` at level 0 (a
/// parameter used on the step's inputs directly: its gradient is final only
/// at the end) or when `param` needs no gradient.
pub(crate) fn hooked<B: Backend, C: CheckpointStrategy>(
    param: &FloatTensor<Autodiff<B, C>>,
    level: usize,
    on_ready: OnReady<B>,
) -> Option<FloatTensor<Autodiff<B, C>>> {
    if level == 0 {
        return None;
    }
    // An untracked leaf one level below: the hook's level is its inputs'
    // deepest plus one. Fresh, so its node is not shared yet.
    let mut below = <FloatTensor<Autodiff<B, C>>>::new(param.primitive.clone());
    Arc::get_mut(&mut below.node)?.order = level - 1;
    let state = Ready {
        param: param.node.id.value,
        on_ready,
    };
    // Compute bound: a recomputation (gradient checkpointing) never re-runs it.
    match GradientReady
        .prepare::<C>([param.node.clone(), below.node.clone()])
        .compute_bound()
        .stateful()
    {
        OpsKind::Tracked(prep) => Some(prep.finish(state, param.primitive.clone())),
        OpsKind::UnTracked(_) => None,
    }
}

#[cfg(test)]
mod tests;
