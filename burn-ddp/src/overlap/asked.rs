//! A round asked for by the Learner strategy, for the next backward pass on
//! its thread.
//!
//! The strategy knows its model's parameters exactly: it walks the model.
//! Which parameter tensors are alive does not say it (rank 0's asynchronous
//! checkpointer keeps clones of replaced ones), so the strategy runs each
//! step's backward under `no_sync` and averages afterwards. Asking lets
//! that backward pass still send the leading buckets as their hooks report:
//! the round is begun over the walked parameters and ended when Burn's
//! backward is over, as a wrapped model's, so the step gets its gradients
//! averaged (whether or not a bucket could leave early) and the strategy
//! does not average them again.

use super::armed;
use burn_ddp_comm::{ParamInfo, Reducer, Result};
use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// What the strategy asks of the next backward pass: a round of `reducer`
/// over `params` (node ids, in walk order).
pub(crate) struct Asked {
    pub reducer: Arc<Mutex<Reducer>>,
    pub params: Vec<ParamInfo>,
}

/// What the backward pass leaves the strategy.
#[cfg_attr(not(feature = "train"), allow(dead_code))]
pub(crate) struct Answer {
    /// Whether the pass averaged the gradients (an error if that failed);
    /// `None`: it could not (not one of `Ddp<B>`'s parameters), average
    /// after the step as usual.
    pub averaged: Option<Result<()>>,
    /// Backward passes that ran on this thread while the answer waited: a
    /// step with more than one would sum an average and local gradients.
    pub passes: usize,
}

#[cfg_attr(not(feature = "train"), allow(dead_code))]
enum State {
    Asked(Asked, HashSet<u64>),
    Answered(Box<Answer>),
}

thread_local! {
    static STATE: RefCell<Option<State>> = const { RefCell::new(None) };
}

/// Asks the next backward pass on this thread for a round; the guard takes
/// the answer, and forgets the question if it is dropped first.
#[cfg_attr(not(feature = "train"), allow(dead_code))]
pub(crate) fn ask(asked: Asked) -> AskGuard {
    armed::arm();
    let ids = asked.params.iter().map(|p| p.id).collect();
    STATE.with(|s| *s.borrow_mut() = Some(State::Asked(asked, ids)));
    AskGuard(std::marker::PhantomData)
}

/// Whether parameter `id` should be behind a hook: it is in the round asked for.
pub(crate) fn is_asked(id: u64) -> bool {
    STATE.with(|s| matches!(&*s.borrow(), Some(State::Asked(_, ids)) if ids.contains(&id)))
}

/// For a backward pass: the question, if one waits (once); a later backward
/// pass before the answer is taken is counted.
pub(crate) fn take_for_backward() -> Option<Asked> {
    STATE.with(|s| {
        let mut state = s.borrow_mut();
        match state.take() {
            Some(State::Asked(asked, _)) => Some(asked),
            Some(State::Answered(mut answer)) => {
                answer.passes += 1;
                *state = Some(State::Answered(answer));
                None
            }
            None => None,
        }
    })
}

/// The backward pass's answer to a question it took.
pub(crate) fn answer(averaged: Option<Result<()>>) {
    let answer = Box::new(Answer {
        averaged,
        passes: 1,
    });
    STATE.with(|s| *s.borrow_mut() = Some(State::Answered(answer)));
}

/// Holds the question until [`answer`](Self::answer); dropped, the thread
/// forgets both (a step that panicked leaves nothing for the next one).
#[cfg_attr(not(feature = "train"), allow(dead_code))]
pub(crate) struct AskGuard(std::marker::PhantomData<*const ()>);

#[cfg_attr(not(feature = "train"), allow(dead_code))]
impl AskGuard {
    /// The answer; `None` when no backward pass of `Ddp<B>` took the
    /// question (another backend, a step without backward).
    pub fn answer(self) -> Option<Answer> {
        match STATE.with(|s| s.borrow_mut().take()) {
            Some(State::Answered(answer)) => Some(*answer),
            _ => None,
        }
    }
}

impl Drop for AskGuard {
    fn drop(&mut self) {
        STATE.with(|s| s.borrow_mut().take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_ddp_comm::{BucketConfig, DType, ParamLayout, Placement, ProcessGroup};

    fn asked(ids: &[u64]) -> Asked {
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        let params = ids
            .iter()
            .map(|&id| ParamInfo {
                id,
                layout: ParamLayout {
                    shape: vec![2],
                    dtype: DType::F32,
                },
                placement: Placement::Host,
            })
            .collect();
        Asked {
            reducer: Arc::new(Mutex::new(Reducer::new(&group, BucketConfig::default()))),
            params,
        }
    }

    #[test]
    fn a_question_is_taken_once_and_later_passes_are_counted() {
        let guard = ask(asked(&[7, 9]));
        assert!(is_asked(7) && is_asked(9) && !is_asked(8));
        let taken = take_for_backward().expect("the first backward pass takes it");
        assert_eq!(taken.params.len(), 2);
        assert!(!is_asked(7), "hooks are for the question's step only");
        answer(None);
        assert!(take_for_backward().is_none());
        assert!(take_for_backward().is_none());
        let answer = guard.answer().expect("answered");
        assert_eq!(answer.passes, 3);
        assert!(answer.averaged.is_none());
    }

    #[test]
    fn an_unanswered_or_dropped_question_leaves_nothing_behind() {
        assert!(
            ask(asked(&[1])).answer().is_none(),
            "no backward pass took it"
        );
        drop(ask(asked(&[2])));
        assert!(!is_asked(2));
        assert!(take_for_backward().is_none());
    }
}
