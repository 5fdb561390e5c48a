//! One backward pass with buckets leaving during it: the rounds begun before
//! Burn's backward, reachable by the hooks (which run on this thread, inside
//! Burn's backward) until the pass ends.

use crate::shared::dtype;
use crate::shared::session::SESSION;
use crate::shim;
use burn_backend::backend::Backend;
use burn_backend::tensor::FloatTensor;
use burn_backend::TensorMetadata;
use burn_ddp_comm::{CommError, Result, SyncRound};
use std::cell::RefCell;
use std::collections::HashMap;

/// The round begun for one wrapped model: its scope, its parameters' node
/// ids in the round's order, and those the forward pass never used (in as
/// zeros at once, so their buckets need not wait for the end).
pub(crate) struct Begun {
    pub scope: u64,
    pub round: SyncRound,
    pub params: Vec<u64>,
    pub unused: Vec<u64>,
}

/// What the end of backward gets back: the round (an error if a gradient
/// could not be handed over), for the model and parameters it was begun for.
pub(crate) struct Ended {
    pub scope: u64,
    pub round: Result<SyncRound>,
    pub params: Vec<u64>,
    pub unused: Vec<u64>,
}

/// The round of the backward pass under way on this thread.
struct Pass {
    /// Per parameter node id: its position in the round.
    positions: HashMap<u64, usize>,
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
            positions: begun
                .params
                .iter()
                .enumerate()
                .map(|(i, id)| (*id, i))
                .collect(),
            ended: Ended {
                scope: begun.scope,
                round: Ok(begun.round),
                params: begun.params,
                unused: begun.unused,
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

/// A hook's report: parameter `param`'s gradient is final. Handed to its
/// round, if one was begun for its model; an error is kept for the end of
/// backward (a hook cannot return one, and must not panic inside Burn's
/// backward).
pub(crate) fn ready<I: Backend>(param: u64, grad: &FloatTensor<I>) {
    PASS.with(|p| {
        let mut pass = p.borrow_mut();
        let Some(pass) = pass.as_mut() else {
            return;
        };
        let Some(&position) = pass.positions.get(&param) else {
            return;
        };
        let slot = &mut pass.ended.round;
        let Ok(round) = slot else {
            return;
        };
        if let Err(err) = round.ready(position, |out| read_grad::<I>(grad, out)) {
            *slot = Err(err);
        }
    });
}

/// `grad`'s elements as bytes into `out`, as the host path reads a gradient.
fn read_grad<I: Backend>(grad: &FloatTensor<I>, out: &mut [u8]) -> Result<()> {
    let numel = grad.shape().num_elements();
    let mut data = shim::flat_grad::<I>(grad.clone(), numel).into_data();
    let rank = SESSION.rank().unwrap_or(0);
    let element = data.dtype;
    let bytes = dtype::element_bytes(&mut data).ok_or_else(|| CommError::InvalidArgument {
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
