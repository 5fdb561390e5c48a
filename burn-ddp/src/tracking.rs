//! Which tensors are parameters, and of which wrapped model: every leaf
//! marked `require_grad`, in the order they were marked.
//!
//! Burn 0.21 cannot enumerate a `Gradients` container, and a backward pass
//! knows no module, so `Ddp<B>` watches `float_set_require_grad(_, true)`:
//! initialisation, `Param::from_tensor`, loading a record and every optimizer
//! update pass through it. Each parameter is kept as a *slot*: its node id, a
//! key tensor that addresses its gradient without owning its data, and a weak
//! liveness signal, so a parameter replaced by the optimizer is forgotten at the
//! next backward instead of being kept alive.
//!
//! Each slot also carries the scope (wrapped model) it belongs to: the one
//! being wrapped when it was marked, or, for an optimizer update, the scope
//! of the parameter it replaces. Burn's optimizers take the old parameter's
//! inner tensor (`inner()`) and mark the new one right after
//! (`from_inner(..).require_grad()`), with nothing of `Ddp<B>` in between, so
//! the last `inner()` of a parameter on this thread, if its shape and type
//! match, names the predecessor. Anything else is in the default scope.

use crate::overlap::hook::OnReady;
use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::Autodiff;
use burn_backend::backend::{AutodiffBackend, Backend};
use burn_backend::ops::FloatTensorOps;
use burn_backend::tensor::FloatTensor;
use burn_backend::{DType, Shape, TensorMetadata};
use burn_ddp_training::session::DEFAULT_SCOPE;
use std::any::{Any, TypeId};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

/// A parameter as the reducer sees it.
pub struct ParamSlot<B: AutodiffBackend> {
    /// Unique, process-wide id of the parameter's autodiff node.
    pub id: u64,
    /// Addresses the gradient (`B::grad_remove`, `B::grad_replace`) without
    /// holding the parameter's data.
    pub key: FloatTensor<B>,
    /// Dead once every copy of the parameter tensor is dropped.
    pub alive: Weak<dyn Any + Send + Sync>,
    /// Gradient shape.
    pub shape: Vec<usize>,
    /// Gradient element type.
    pub dtype: DType,
}

/// An autodiff backend whose parameters burn-ddp can follow: Burn's
/// `Autodiff`, over any backend and checkpointing strategy.
pub trait TrackedAutodiff: crate::autograd::AutodiffCollectives + Slots {}

impl<B: Backend, C: CheckpointStrategy> TrackedAutodiff for Autodiff<B, C> {}

/// How a parameter's slot is read off a tensor of the backend: public in
/// name only (this module is private), so no other crate implements
/// [`TrackedAutodiff`] or sees the slots.
pub trait Slots: AutodiffBackend {
    /// The slot of a leaf tensor that requires gradients, `None` for any other tensor.
    fn param_slot(tensor: &FloatTensor<Self>) -> Option<ParamSlot<Self>>;

    /// The autodiff node id of a tensor that requires gradients.
    fn node_id(tensor: &FloatTensor<Self>) -> Option<u64>;

    /// A tensor's node id and backward level (a leaf's is 0, an op's its
    /// deepest input's plus one).
    fn node_level(tensor: &FloatTensor<Self>) -> (u64, usize);

    /// Whether it is a parameter: a leaf that requires gradients.
    fn is_param(tensor: &FloatTensor<Self>) -> bool;

    /// `param` through a readiness hook at backward level `level`
    /// ([`crate::overlap`]); `None` where it cannot have one.
    fn hooked(
        param: &FloatTensor<Self>,
        level: usize,
        on_ready: OnReady<Self::InnerBackend>,
    ) -> Option<FloatTensor<Self>>;
}

impl<B: Backend, C: CheckpointStrategy> Slots for Autodiff<B, C> {
    fn param_slot(tensor: &FloatTensor<Self>) -> Option<ParamSlot<Self>> {
        if !Self::float_is_require_grad(tensor) || !tensor.node.parents.is_empty() {
            return None;
        }
        let shape = tensor.shape();
        let dtype = tensor.dtype();
        let device = B::float_device(&tensor.primitive);
        // Gradients are found by node id alone, so the key keeps the node but
        // swaps the data for an empty tensor and the shared reference count (which
        // the graph's memory manager watches) for a private one.
        let mut key = tensor.clone();
        key.primitive = B::float_zeros(Shape::new([0]), &device, dtype.into());
        key.rc = Arc::new(*tensor.rc);
        let alive: Weak<dyn Any + Send + Sync> = Arc::downgrade(&tensor.rc) as _;
        Some(ParamSlot {
            id: tensor.node.id.value,
            key,
            alive,
            shape: shape.to_vec(),
            dtype,
        })
    }

    fn node_id(tensor: &FloatTensor<Self>) -> Option<u64> {
        Self::float_is_require_grad(tensor).then_some(tensor.node.id.value)
    }

    fn node_level(tensor: &FloatTensor<Self>) -> (u64, usize) {
        (tensor.node.id.value, tensor.node.order)
    }

    fn is_param(tensor: &FloatTensor<Self>) -> bool {
        tensor.node.parents.is_empty() && Self::float_is_require_grad(tensor)
    }

    fn hooked(
        param: &FloatTensor<Self>,
        level: usize,
        on_ready: OnReady<B>,
    ) -> Option<FloatTensor<Self>> {
        crate::overlap::hook::hooked::<B, C>(param, level, on_ready)
    }
}

/// A slot of any backend, type-erased so one registry serves the process.
struct Entry {
    id: u64,
    scope: u64,
    alive: Weak<dyn Any + Send + Sync>,
    slot: Box<dyn Any + Send>,
}

/// Reads the node id of a parameter off a float primitive of one backend.
type NodeIdReader = fn(&dyn Any) -> Option<u64>;

#[derive(Default)]
struct Registry {
    /// Per float primitive type of a backend that marked parameters: how
    /// to read a parameter's node id (a walk over a model of any backend
    /// type finds the parameters this way).
    readers: Vec<(TypeId, NodeIdReader)>,
    entries: Vec<Entry>,
    /// Node id -> scope, for every entry.
    scopes: HashMap<u64, u64>,
    /// Live entries after the last pruning, to prune again once dead ones pile up.
    live_after_prune: usize,
}

impl Registry {
    fn prune(&mut self) {
        let scopes = &mut self.scopes;
        self.entries.retain(|entry| {
            let alive = entry.alive.strong_count() > 0;
            if !alive {
                scopes.remove(&entry.id);
            }
            alive
        });
        self.live_after_prune = self.entries.len();
    }
}

/// What the last `inner()` of a parameter on this thread was: a new
/// parameter of the same shape and type marked next takes its scope.
#[derive(Clone, PartialEq)]
struct Predecessor {
    scope: u64,
    shape: Vec<usize>,
    dtype: DType,
}

thread_local! {
    static PREDECESSOR: RefCell<Option<Predecessor>> = const { RefCell::new(None) };
    /// The scope of the model being wrapped on this thread, while it is.
    static WRAPPING: Cell<Option<u64>> = const { Cell::new(None) };
}

/// While alive, parameters marked on this thread belong to `scope` (the
/// model `wrap` is broadcasting).
pub(crate) struct WrappingScope {
    before: Option<u64>,
}

impl WrappingScope {
    pub fn enter(scope: u64) -> Self {
        Self {
            before: WRAPPING.with(|w| w.replace(Some(scope))),
        }
    }
}

impl Drop for WrappingScope {
    fn drop(&mut self) {
        WRAPPING.with(|w| w.set(self.before));
    }
}

/// Called by `Ddp<B>::inner`: remembers a parameter whose inner tensor is
/// taken, as the predecessor of the next one marked.
pub(crate) fn taking_inner<B: TrackedAutodiff>(tensor: &FloatTensor<B>) {
    let Some(id) = B::node_id(tensor) else {
        return;
    };
    let scope = with_registry(|registry| registry.scopes.get(&id).copied());
    if let Some(scope) = scope.filter(|s| *s != DEFAULT_SCOPE) {
        let predecessor = Predecessor {
            scope,
            shape: tensor.shape().to_vec(),
            dtype: tensor.dtype(),
        };
        PREDECESSOR.with(|p| *p.borrow_mut() = Some(predecessor));
    }
}

/// The scope a parameter marked now belongs to.
fn scope_for(shape: &[usize], dtype: DType) -> u64 {
    if let Some(scope) = WRAPPING.with(Cell::get) {
        return scope;
    }
    PREDECESSOR
        .with(|p| p.borrow_mut().take())
        .filter(|p| p.shape == shape && p.dtype == dtype)
        .map_or(DEFAULT_SCOPE, |p| p.scope)
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

fn with_registry<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    let mut guard = REGISTRY.lock().unwrap();
    f(guard.get_or_insert_with(Registry::default))
}

/// `B::float_set_require_grad`, recording the result when it becomes a parameter.
pub(crate) fn set_require_grad<B: TrackedAutodiff>(
    tensor: FloatTensor<B>,
    require_grad: bool,
) -> FloatTensor<B> {
    let tensor = B::float_set_require_grad(tensor, require_grad);
    if require_grad {
        if let Some(slot) = B::param_slot(&tensor) {
            register(slot);
        }
    }
    tensor
}

fn register<B: TrackedAutodiff>(slot: ParamSlot<B>) {
    let scope = scope_for(&slot.shape, slot.dtype);
    with_registry(|registry| {
        let kind = TypeId::of::<FloatTensor<B>>();
        if !registry.readers.iter().any(|(k, _)| *k == kind) {
            let read: NodeIdReader = |tensor| {
                let tensor = tensor.downcast_ref::<FloatTensor<B>>()?;
                B::is_param(tensor).then(|| B::node_id(tensor)).flatten()
            };
            registry.readers.push((kind, read));
        }
        // A tensor that is already a parameter keeps its node: nothing new.
        if registry.scopes.insert(slot.id, scope).is_some() {
            return;
        }
        registry.entries.push(Entry {
            id: slot.id,
            scope,
            alive: slot.alive.clone(),
            slot: Box::new(slot),
        });
        // Parameters replaced without a backward in between (evaluation loops,
        // repeated loading) would otherwise accumulate.
        if registry.entries.len() > 2 * registry.live_after_prune.max(64) {
            registry.prune();
        }
    })
}

/// The node ids of `model`'s trainable parameters, in walk order (the
/// order of burn-ddp's gradient walks); `None` unless every one is a
/// parameter of a backend `Ddp<B>` has seen marked (a plain `Autodiff<B>`
/// model's are too, once `Ddp<B>` over the same backend marked one).
#[cfg_attr(not(feature = "train"), allow(dead_code))]
pub(crate) fn node_ids<B: burn::tensor::backend::AutodiffBackend, M: burn::module::Module<B>>(
    model: &M,
) -> Option<Vec<u64>> {
    let read = with_registry(|registry| {
        let kind = TypeId::of::<FloatTensor<B>>();
        registry
            .readers
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|r| r.1)
    })?;
    let mut walk = NodeIds {
        read,
        ids: Some(Vec::new()),
    };
    model.visit(&mut walk);
    walk.ids
}

struct NodeIds {
    read: NodeIdReader,
    ids: Option<Vec<u64>>,
}

impl<B: burn::tensor::backend::AutodiffBackend> burn::module::ModuleVisitor<B> for NodeIds {
    fn visit_float<const D: usize>(
        &mut self,
        param: &burn::module::Param<burn::tensor::Tensor<B, D>>,
    ) {
        let value = param.val();
        if !value.is_require_grad() {
            return;
        }
        let primitive = value.into_primitive().tensor();
        let id = (self.read)(&primitive);
        self.ids = self.ids.take().zip(id).map(|(mut ids, id)| {
            ids.push(id);
            ids
        });
    }
}

/// The scope (wrapped model) parameter node `id` belongs to, if it is a
/// parameter `Ddp<B>` follows.
pub(crate) fn scope_of(id: u64) -> Option<u64> {
    with_registry(|registry| registry.scopes.get(&id).copied())
}

/// A live parameter, as the backward pass needs it.
pub(crate) struct LiveParam<B: TrackedAutodiff> {
    pub id: u64,
    pub scope: u64,
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub key: FloatTensor<B>,
}

/// The live parameters of backend `B`, in registration order, after forgetting
/// dead ones. Keys are cloned out so no lock is held while gradients move.
pub(crate) fn live_params<B: TrackedAutodiff>() -> Vec<LiveParam<B>> {
    with_registry(|registry| {
        registry.prune();
        registry
            .entries
            .iter()
            .filter_map(|entry| {
                let slot = entry.slot.downcast_ref::<ParamSlot<B>>()?;
                Some(LiveParam {
                    id: slot.id,
                    scope: entry.scope,
                    shape: slot.shape.clone(),
                    dtype: slot.dtype,
                    key: slot.key.clone(),
                })
            })
            .collect()
    })
}

/// Lets Burn free the graph nodes nobody else holds now, rather than at the
/// end of the next backward pass: until then its graph keeps a replaced
/// parameter that no backward pass reached (an unused one, updated by the
/// optimizer) alive, so it still counts as a parameter. A backward pass of
/// a throwaway scalar, on `B` itself (no synchronisation), runs the cleanup
/// every backward pass ends with; the graph under construction is held by
/// its tensors and left alone.
pub(crate) fn release_orphaned_nodes<B: TrackedAutodiff>(param: &LiveParam<B>) {
    let device = B::float_device(&param.key);
    let scalar = B::float_zeros(Shape::new([1]), &device, param.dtype.into());
    let scalar = B::float_set_require_grad(scalar, true);
    drop(B::backward(B::float_sum(scalar)));
}

/// How many parameter tensors `Ddp<B>` follows on this process (live, or
/// dropped and not yet forgotten: the next backward pass prunes those), to
/// check that replaced parameters are not kept alive.
pub fn tracked_parameters() -> usize {
    with_registry(|registry| registry.entries.len())
}
