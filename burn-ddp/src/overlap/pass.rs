//! One backward pass with buckets leaving during it: the rounds begun before
//! Burn's backward, reachable by the hooks (which run on this thread, inside
//! Burn's backward) until the pass ends.

use crate::shared::dtype;
use crate::shared::session::SESSION;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use burn_backend::backend::Backend;
use burn_backend::tensor::FloatTensor;
use burn_backend::TensorMetadata;
use burn_ddp_comm::{CommError, Result, SyncRound};
use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;

/// The round begun for one wrapped model: its scope, its parameters' node
/// ids in the round's order, those whose hooks report to it (with their
/// positions), and those the forward pass never used (in as zeros at once,
/// so their buckets need not wait for the end).
pub(crate) struct Begun {
    pub scope: u64,
    pub round: SyncRound,
    pub params: Vec<u64>,
    /// Element counts, by position (the GPU path packs zeros for unused ones).
    pub numels: Vec<usize>,
    pub reporting: Vec<(u64, usize)>,
    pub unused: Vec<u64>,
}

/// What the end of backward gets back: the round (an error if a gradient
/// could not be handed over), for the model and parameters it was begun
/// for, and the gradients the round took (by position), to be the
/// parameters' gradients again: read out on the host path, as tensors on
/// the GPU path (those whose bucket has not left yet; the others come back
/// averaged).
pub(crate) struct Ended {
    pub scope: u64,
    pub round: Result<SyncRound>,
    pub params: Vec<u64>,
    pub unused: Vec<u64>,
    pub taken: Vec<(usize, TensorData)>,
    pub kept_on_device: HashMap<usize, Box<dyn Any>>,
}

/// The round of the backward pass under way on this thread.
struct Pass {
    /// Per parameter node id: its position in the round.
    positions: HashMap<u64, usize>,
    numels: Vec<usize>,
    ended: Ended,
}

thread_local! {
    static PASS: RefCell<Option<Pass>> = const { RefCell::new(None) };
}

/// While alive, the hooks on this thread hand gradients to this round;
/// dropped without [`take`](Self::take) (a panic inside backward), the round
/// goes too, and its thread with it.
pub(crate) struct Installed(());

impl Installed {
    pub fn new(begun: Option<Begun>) -> Self {
        let pass = begun.map(|begun| Pass {
            positions: begun.reporting.into_iter().collect(),
            numels: begun.numels,
            ended: Ended {
                scope: begun.scope,
                round: Ok(begun.round),
                params: begun.params,
                unused: begun.unused,
                taken: Vec::new(),
                kept_on_device: HashMap::new(),
            },
        });
        PASS.with(|p| *p.borrow_mut() = pass);
        Self(())
    }

    /// The round, if one was begun.
    pub fn take(self) -> Option<Ended> {
        PASS.with(|p| p.borrow_mut().take()).map(|pass| pass.ended)
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        PASS.with(|p| p.borrow_mut().take());
    }
}

/// A hook's report: parameter `param`'s gradient is final. Handed to the
/// round if the parameter's bucket can leave during backward: the gradient
/// is taken (its data read into the bucket without a copy, kept to be the
/// parameter's gradient again at the end of backward). Otherwise it goes
/// back to the parameter. An error is kept for the end of backward (a hook
/// cannot return one, and must not panic inside Burn's backward).
pub(crate) fn ready<I: Backend>(param: u64, grad: FloatTensor<I>) -> Option<FloatTensor<I>> {
    PASS.with(|p| {
        let mut pass = p.borrow_mut();
        let Some(pass) = pass.as_mut() else {
            return Some(grad);
        };
        let Some(&position) = pass.positions.get(&param) else {
            return Some(grad);
        };
        let Ok(round) = &mut pass.ended.round else {
            return Some(grad);
        };
        if round.on_device() {
            ready_on_device::<I>(pass, position, grad);
            return None;
        }
        // Uniquely held here: its own buffer, no copy.
        let mut data = Tensor::<I, 1>::from_primitive(TensorPrimitive::Float(grad)).into_data();
        if let Err(err) = round.ready(position, |out| copy_bytes(&mut data, out)) {
            pass.ended.round = Err(err);
        }
        pass.ended.taken.push((position, data));
        None
    })
}

/// The GPU path: the gradient stays a tensor until its bucket is complete;
/// then the bucket is concatenated on the device (zeros for unused members)
/// and leaves for the communication thread, which waits for the kernels.
fn ready_on_device<I: Backend>(pass: &mut Pass, position: usize, grad: FloatTensor<I>) {
    let device = I::float_device(&grad);
    let Ended {
        round,
        kept_on_device: kept,
        ..
    } = &mut pass.ended;
    kept.insert(position, Box::new(grad));
    let Ok(sync_round) = round else {
        return;
    };
    let numels = &pass.numels;
    let rank = SESSION.rank().unwrap_or(0);
    let mut pack = |members: &[usize], _numel: usize, wire| {
        let dtype = dtype::to_burn(wire);
        let mut parts = Vec::with_capacity(members.len());
        for &member in members {
            let numel = numels[member];
            let Some(grad) = kept.remove(&member) else {
                parts.push(I::float_zeros([numel].into(), &device, dtype.into()));
                continue;
            };
            let grad = *grad
                .downcast::<FloatTensor<I>>()
                .expect("kept as this type");
            if grad.shape().num_elements() != numel {
                // Reshaping would panic inside Burn's backward.
                return Err(CommError::InvalidArgument {
                    rank,
                    message: format!(
                        "gradient of parameter #{member}: {} elements for a parameter of {numel}",
                        grad.shape().num_elements()
                    ),
                });
            }
            if grad.dtype() != dtype {
                // Concatenating would panic; the host path refuses it too.
                return Err(CommError::InvalidArgument {
                    rank,
                    message: format!(
                        "gradient of parameter #{member}: {:?} elements for a {dtype:?} parameter",
                        grad.dtype()
                    ),
                });
            }
            parts.push(I::float_reshape(grad, [numel].into()));
        }
        crate::device::pack_pending::<I>(rank, I::float_cat(parts, 0))
    };
    if let Err(err) = sync_round.ready_on_device(position, &mut pack) {
        *round = Err(err);
    }
}

/// A gradient's elements as bytes into `out`, as the host path reads one
/// (a tensor's data is its elements in row-major order whatever its rank).
fn copy_bytes(data: &mut TensorData, out: &mut [u8]) -> Result<()> {
    let rank = SESSION.rank().unwrap_or(0);
    let element = data.dtype;
    let bytes = dtype::element_bytes(data).ok_or_else(|| CommError::InvalidArgument {
        rank,
        message: format!("a {element:?} gradient is not moved by the collectives"),
    })?;
    if bytes.len() != out.len() {
        return Err(CommError::InvalidArgument {
            rank,
            message: format!(
                "a gradient of {} bytes for {} in its bucket",
                bytes.len(),
                out.len()
            ),
        });
    }
    out.copy_from_slice(bytes);
    Ok(())
}
