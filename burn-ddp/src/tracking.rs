//! Which tensors are parameters: every leaf marked `require_grad`, in the order
//! they were marked.
//!
//! Burn 0.21 cannot enumerate a `Gradients` container, and `ParamId`s are
//! random per process, so `Ddp<B>` watches `float_set_require_grad(_, true)`:
//! initialisation, `Param::from_tensor`, loading a record and every optimizer
//! update pass through it. Each parameter is kept as a *slot*: its node id, a
//! key tensor that addresses its gradient without owning its data, and a weak
//! liveness signal, so a parameter replaced by the optimizer is forgotten at the
//! next backward instead of being kept alive.

use burn_autodiff::checkpoint::strategy::CheckpointStrategy;
use burn_autodiff::Autodiff;
use burn_backend::backend::{AutodiffBackend, Backend};
use burn_backend::ops::FloatTensorOps;
use burn_backend::tensor::FloatTensor;
use burn_backend::{DType, Shape, TensorMetadata};
use std::any::Any;
use std::collections::HashSet;
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

/// An autodiff backend whose parameters burn-ddp can follow.
pub trait TrackedAutodiff: AutodiffBackend {
    /// The slot of a leaf tensor that requires gradients, `None` for any other tensor.
    fn param_slot(tensor: &FloatTensor<Self>) -> Option<ParamSlot<Self>>;
}

impl<B: Backend, C: CheckpointStrategy> TrackedAutodiff for Autodiff<B, C> {
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
}

/// A slot of any backend, type-erased so one registry serves the process.
struct Entry {
    id: u64,
    alive: Weak<dyn Any + Send + Sync>,
    slot: Box<dyn Any + Send>,
}

#[derive(Default)]
struct Registry {
    entries: Vec<Entry>,
    ids: HashSet<u64>,
    /// Live entries after the last pruning, to prune again once dead ones pile up.
    live_after_prune: usize,
}

impl Registry {
    fn prune(&mut self) {
        let ids = &mut self.ids;
        self.entries.retain(|entry| {
            let alive = entry.alive.strong_count() > 0;
            if !alive {
                ids.remove(&entry.id);
            }
            alive
        });
        self.live_after_prune = self.entries.len();
    }
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
    with_registry(|registry| {
        // A tensor that is already a parameter keeps its node: nothing new.
        if !registry.ids.insert(slot.id) {
            return;
        }
        registry.entries.push(Entry {
            id: slot.id,
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

/// The live parameters of backend `B`, in registration order, after forgetting
/// dead ones. Keys are cloned out so no lock is held while gradients move.
pub(crate) fn live_params<B: TrackedAutodiff>() -> Vec<(Vec<usize>, DType, FloatTensor<B>)> {
    with_registry(|registry| {
        registry.prune();
        registry
            .entries
            .iter()
            .filter_map(|entry| entry.slot.downcast_ref::<ParamSlot<B>>())
            .map(|slot| (slot.shape.clone(), slot.dtype, slot.key.clone()))
            .collect()
    })
}

/// Number of entries held (live or not yet pruned), for memory tests.
pub fn tracked_len() -> usize {
    with_registry(|registry| registry.entries.len())
}
