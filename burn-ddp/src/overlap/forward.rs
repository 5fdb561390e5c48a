//! What the forward pass tells the overlap: every op's float inputs, so a
//! parameter's first use in a step can put it behind its readiness hook, at
//! a level under which no other node's level moves.
//!
//! A node's level is its deepest input's plus one. A hook at level `h` on
//! parameter `p` lifts `p`'s own chain (the ops that take `p`, or a tensor
//! made from `p` alone, and nothing else: a bias's reshape) by `h`; an op
//! where such a chain meets other inputs keeps its level as long as the
//! chain, `d` ops long, stays at or under them: `h + d <= q`, `q` the
//! deepest other input (counted without any hook of its own, so two hooked
//! chains meeting cannot lift each other). The slack `q - d` is known at an
//! op with other inputs; a hook made at a parameter's first use takes the
//! smallest slack of that use and of the previous step's uses.

use super::armed;
use super::hook::OnReady;
use crate::shared::session::SESSION;
use crate::tracking::{self, TrackedAutodiff};
use burn_backend::tensor::FloatTensor;
use std::any::Any;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Chain links kept at most between two backward passes.
const MAX_CHAIN_LINKS: usize = 1 << 16;

/// How a parameter is used in this step.
enum Route {
    /// Through this hook (a `FloatTensor<B>`).
    Hooked(Box<dyn Any>),
    /// As itself: no hook (level 0, or a model without overlap).
    Direct,
}

/// One thread's forward pass since its last backward.
#[derive(Default)]
struct Forward {
    routes: HashMap<u64, Route>,
    /// Tensors made from one parameter alone: node id -> (parameter, ops since).
    chains: HashMap<u64, (u64, usize)>,
    /// Per parameter: the smallest slack over this step's uses.
    slack: HashMap<u64, usize>,
    /// Parameters in order of first use.
    first_uses: Vec<u64>,
    /// Per first-use position, the slack the previous step saw.
    remembered: Vec<usize>,
}

thread_local! {
    static FORWARD: RefCell<Forward> = RefCell::new(Forward::default());
}

/// What a forward pass leaves to its backward.
#[derive(Default)]
pub(crate) struct Step {
    /// A collective runs inside this backward (SyncBatchNorm's sum).
    pub collective_inside: bool,
    /// The parameters some op of the pass took (node ids).
    pub used: HashSet<u64>,
    /// Those of them behind a hook: their gradients are reported during
    /// backward.
    pub hooked: HashSet<u64>,
}

/// Forgets what forward passes without a backward pass left on this thread
/// (an evaluation on the training backend, a model loaded and broadcast):
/// a step known to begin here (the Learner's) then numbers its first uses
/// from the start, as the previous step's remembered slack expects.
pub(crate) fn discard_unfinished() {
    FORWARD.with(|f| {
        let mut f = f.borrow_mut();
        f.routes.clear();
        f.chains.clear();
        f.slack.clear();
        f.first_uses.clear();
    });
}

/// Ends this thread's forward pass (at the start of backward): the hooks are
/// let go (the graph holds what backward needs), the slack of each
/// first-use position remembered for the next step.
pub(crate) fn end_step() -> Step {
    if !armed::is_armed() {
        return Step::default();
    }
    FORWARD.with(|f| {
        let mut f = f.borrow_mut();
        let slack = std::mem::take(&mut f.slack);
        let first_uses = std::mem::take(&mut f.first_uses);
        f.remembered = first_uses
            .iter()
            .map(|p| slack.get(p).copied().unwrap_or(0))
            .collect();
        f.chains.clear();
        let mut step = Step {
            collective_inside: armed::take_collective(),
            ..Step::default()
        };
        for (id, route) in f.routes.drain() {
            step.used.insert(id);
            if let Route::Hooked(_) = route {
                step.hooked.insert(id);
            }
        }
        step
    })
}

/// One float input of an op: its level, and the parameter whose chain it is
/// (with the chain's length) if any.
struct Input {
    level: usize,
    chain: Option<(u64, usize)>,
}

impl Input {
    /// Its level without any hook: a chain's length, else its level.
    fn unhooked_level(&self) -> usize {
        self.chain.map_or(self.level, |(_, depth)| depth)
    }
}

/// One op's float inputs, as `Ddp<B>` sees them: shown ([`see`](Self::see)),
/// then routed ([`route`](Self::route)), then the op's output registered
/// ([`output`](Self::output)). Does nothing until [`armed::arm`].
pub(crate) struct Uses {
    armed: bool,
    inputs: Vec<Input>,
    recorded: bool,
}

impl Uses {
    pub fn new() -> Self {
        Self {
            armed: armed::is_armed(),
            inputs: Vec::new(),
            recorded: false,
        }
    }

    pub fn see<B: TrackedAutodiff>(&mut self, tensor: &FloatTensor<B>) {
        if !self.armed {
            return;
        }
        let (id, level) = B::node_level(tensor);
        let chain = if B::is_param(tensor) {
            Some((id, 0))
        } else {
            FORWARD.with(|f| f.borrow().chains.get(&id).copied())
        };
        self.inputs.push(Input { level, chain });
    }

    pub fn see_opt<B: TrackedAutodiff>(&mut self, tensor: &Option<FloatTensor<B>>) {
        if let Some(tensor) = tensor {
            self.see::<B>(tensor);
        }
    }

    pub fn see_all<B: TrackedAutodiff>(&mut self, tensors: &[FloatTensor<B>]) {
        tensors.iter().for_each(|t| self.see::<B>(t));
    }

    /// The input as the op takes it: a parameter through its hook.
    pub fn route<B: TrackedAutodiff>(&mut self, tensor: FloatTensor<B>) -> FloatTensor<B> {
        if !self.armed {
            return tensor;
        }
        self.record();
        if !B::is_param(&tensor) {
            return tensor;
        }
        let (id, _) = B::node_level(&tensor);
        let slack = self.slack_of(id);
        FORWARD.with(|f| f.borrow_mut().route::<B>(tensor, id, slack))
    }

    pub fn route_opt<B: TrackedAutodiff>(
        &mut self,
        tensor: Option<FloatTensor<B>>,
    ) -> Option<FloatTensor<B>> {
        tensor.map(|t| self.route::<B>(t))
    }

    pub fn route_all<B: TrackedAutodiff>(
        &mut self,
        tensors: Vec<FloatTensor<B>>,
    ) -> Vec<FloatTensor<B>> {
        tensors.into_iter().map(|t| self.route::<B>(t)).collect()
    }

    /// The op's output, a link of a parameter's chain if the op took that
    /// parameter's chain and nothing else.
    pub fn output<B: TrackedAutodiff>(self, output: FloatTensor<B>) -> FloatTensor<B> {
        let Some((param, depth)) = self.sole_chain() else {
            return output;
        };
        let (id, _) = B::node_level(&output);
        FORWARD.with(|f| {
            let mut f = f.borrow_mut();
            // Forward passes without a backward (an evaluation on the
            // training backend) would pile links up: losing them only costs
            // a hook some depth.
            if f.chains.len() >= MAX_CHAIN_LINKS {
                f.chains.clear();
            }
            f.chains.insert(id, (param, depth + 1));
        });
        output
    }

    /// The parameter whose chain is this op's only input kind, with the
    /// chain's longest length.
    fn sole_chain(&self) -> Option<(u64, usize)> {
        let (param, _) = self.inputs.first()?.chain?;
        let mut depth = 0;
        for input in &self.inputs {
            match input.chain {
                Some((p, d)) if p == param => depth = depth.max(d),
                _ => return None,
            }
        }
        Some((param, depth))
    }

    /// `param`'s slack at this op: `None` when the op takes nothing else
    /// (the chain goes on).
    fn slack_of(&self, param: u64) -> Option<usize> {
        let mut others = None;
        let mut depth = 0;
        for input in &self.inputs {
            match input.chain {
                Some((p, d)) if p == param => depth = depth.max(d),
                _ => others = Some(others.unwrap_or(0).max(input.unhooked_level())),
            }
        }
        others.map(|q: usize| q.saturating_sub(depth))
    }

    /// Every chain's slack at this op, once.
    fn record(&mut self) {
        if std::mem::replace(&mut self.recorded, true) {
            return;
        }
        let params: Vec<u64> = self
            .inputs
            .iter()
            .filter_map(|i| i.chain)
            .map(|c| c.0)
            .collect();
        if params.is_empty() {
            return;
        }
        FORWARD.with(|f| {
            let mut f = f.borrow_mut();
            for param in params {
                if let Some(slack) = self.slack_of(param) {
                    let entry = f.slack.entry(param).or_insert(slack);
                    *entry = (*entry).min(slack);
                }
            }
        });
    }
}

impl Forward {
    fn route<B: TrackedAutodiff>(
        &mut self,
        param: FloatTensor<B>,
        id: u64,
        slack: Option<usize>,
    ) -> FloatTensor<B> {
        match self.routes.get(&id) {
            Some(Route::Hooked(hook)) => {
                if let Some(hook) = hook.downcast_ref::<FloatTensor<B>>() {
                    return hook.clone();
                }
                return param;
            }
            Some(Route::Direct) => return param,
            None => {}
        }
        let position = self.first_uses.len();
        self.first_uses.push(id);
        let level = match (slack, self.remembered.get(position).copied()) {
            (Some(now), Some(before)) => now.min(before),
            (Some(level), None) | (None, Some(level)) => level,
            (None, None) => 0,
        };
        match hook_for::<B>(&param, id, level) {
            Some(hook) => {
                self.routes
                    .insert(id, Route::Hooked(Box::new(hook.clone())));
                hook
            }
            None => {
                self.routes.insert(id, Route::Direct);
                param
            }
        }
    }
}

/// `param`'s hook at `level`, if it belongs to a model wrapped with
/// `overlap_backward` or to the round the Learner strategy asked for, and
/// the level leaves room for one.
fn hook_for<B: TrackedAutodiff>(
    param: &FloatTensor<B>,
    id: u64,
    level: usize,
) -> Option<FloatTensor<B>> {
    if level == 0 {
        return None;
    }
    let overlaps = || {
        let scope = tracking::scope_of(id)?;
        SESSION.by_id(scope).map(|model| model.overlaps_backward())
    };
    if !super::asked::is_asked(id) && overlaps() != Some(true) {
        return None;
    }
    let on_ready: OnReady<B::InnerBackend> = Arc::new(super::pass::ready::<B::InnerBackend>);
    B::hooked(param, level, on_ready)
}
