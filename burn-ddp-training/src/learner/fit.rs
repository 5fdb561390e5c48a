//! The Learner's epoch loop on several processes, written once: every
//! iteration's vote, gradient accumulation, one synchronised optimizer step
//! per accumulation, the epoch's figures, the after-epoch decision agreed
//! before the checkpoint, and a closing barrier. A front-end drives it with
//! its Burn version's Learner through [`Learning`]; what differs between
//! Burn versions (events, the scheduler's cadence, the leftover
//! micro-batches of an epoch) is the front-end's side of that trait or a
//! field of [`Plan`].

use super::{AfterEpoch, LearnerJob, NextIteration};
use burn_ddp_comm::{CommError, Result};
use std::time::Instant;

/// What one rank's Learner does at each point of the loop, in its Burn
/// version's terms. Nothing here is collective: the loop makes the
/// collectives, the front-end runs Burn.
pub trait Learning {
    /// One training batch.
    type Item;
    /// What a training step produced, to report once the step is done.
    type Output;

    /// The training split of `epoch` starts: the front-end starts its loader
    /// (and its events); returns the loader's length.
    fn start_training(&mut self, epoch: usize) -> usize;
    /// The loader's next batch; `None` at its end, or after an error (which
    /// the front-end records as an interrupt).
    fn next_item(&mut self) -> Option<Self::Item>;
    /// Forward and backward of one micro-batch; its gradients are kept (and
    /// accumulated) until [`optimizer_step`](Self::optimizer_step).
    fn train_step(&mut self, item: Self::Item) -> Self::Output;
    /// Averages the kept gradients over the ranks (collective) and steps the
    /// optimizer with them.
    fn optimizer_step(&mut self) -> Result<()>;
    /// Reports a finished iteration (1-based within the epoch).
    fn report(&mut self, output: Self::Output, iteration: usize);
    /// The training split of `epoch` ended (`completed`: not stopped).
    fn end_training(&mut self, epoch: usize, completed: bool);
    /// The whole validation split of `epoch`: no collective (shards may
    /// differ by one item); a stop during it is an interrupt.
    fn validate(&mut self, epoch: usize);
    /// Rank 0's early-stopping strategy after `epoch` (asked on rank 0 only).
    fn early_stop(&mut self, epoch: usize) -> bool;
    /// Saves `epoch`'s checkpoint (rank 0's checkpointer; the others' never
    /// save).
    fn checkpoint(&mut self, epoch: usize);
    /// Whether this rank's interrupter was stopped (by the user, a failed
    /// loader, another thread).
    fn interrupted(&self) -> bool;
    /// Why it was, for the log.
    fn stop_reason(&self) -> Option<String>;
    /// Stops this rank's interrupter, saying why.
    fn interrupt(&self, reason: &str);
}

/// What a run of the loop covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// The first epoch (1-based; after a resumed checkpoint, the next).
    pub starting_epoch: usize,
    /// The last epoch.
    pub num_epochs: usize,
    /// Micro-batches per optimizer step (`None`: one).
    pub grad_accumulation: Option<usize>,
    /// Whether an epoch's leftover micro-batches (fewer than
    /// `grad_accumulation` at its end) make one more step, as Burn 0.22's own
    /// strategy does; Burn 0.21's drops them.
    pub step_leftover: bool,
    /// Whether a rank that is gone is gone on from (`burn-ddp-run
    /// --on-failure continue` and the strategy's option): the others form
    /// the group's next generation, drop the step it broke and finish the
    /// epoch on their own shards; later epochs are dealt over them.
    pub go_on: bool,
}

/// Why the loop could not go on in step with the other ranks: what it was
/// doing, and the error.
#[derive(Debug)]
pub struct FitError {
    /// What the rank was doing ("averaging gradients").
    pub what: &'static str,
    /// The collective's error.
    pub error: CommError,
}

impl FitError {
    /// The message a strategy that cannot return errors panics with: a
    /// disagreement between the ranks already names this rank.
    pub fn message(&self, rank: usize) -> String {
        match &self.error {
            CommError::InvalidArgument { .. } => self.error.to_string(),
            error => format!("rank {rank}: {}: {error}", self.what),
        }
    }
}

impl std::fmt::Display for FitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what, self.error)
    }
}

impl std::error::Error for FitError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

trait Doing<T> {
    fn doing(self, what: &'static str) -> std::result::Result<T, FitError>;
}

impl<T> Doing<T> for Result<T> {
    fn doing(self, what: &'static str) -> std::result::Result<T, FitError> {
        self.map_err(|error| FitError { what, error })
    }
}

/// The loop's collectives, in the order a rank meets them: where a rank
/// stands when the survivors compare places after a failure.
const STAGES: [&str; 6] = [
    "comparing loader lengths",
    "agreeing on the next iteration",
    "averaging gradients",
    "summing the epoch's metrics",
    "agreeing on early stopping",
    "the closing barrier",
];

/// Where a rank stands in the loop: Burn's epoch, the iterations done in
/// it, the optimizer steps taken in the run.
#[derive(Debug, Clone, Copy)]
struct At {
    epoch: usize,
    iteration: usize,
    steps: u64,
}

impl LearnerJob {
    /// `collective` (one of [`STAGES`]: `what`), and under `plan.go_on`,
    /// again on the group's next generation for as long as it fails because
    /// ranks are gone (each time the survivors first agree that they stand
    /// at the same place, `at`).
    fn going_on<T>(
        &self,
        plan: Plan,
        what: &'static str,
        at: At,
        mut collective: impl FnMut() -> Result<T>,
    ) -> std::result::Result<T, FitError> {
        loop {
            match collective() {
                Ok(value) => return Ok(value),
                Err(error) if plan.go_on && error.is_peer_failure() => {
                    self.go_on_after(error, what, at).doing(what)?;
                }
                Err(error) => return Err(FitError { what, error }),
            }
        }
    }

    /// The survivors' next generation after `error`, agreed to stand at the
    /// same place.
    fn go_on_after(&self, error: CommError, what: &str, at: At) -> Result<()> {
        log::warn!("{error}; going on without the ranks that are gone");
        self.go_on_without_the_lost()?;
        self.agree_on_place(what, at)?;
        log::warn!(
            "going on as rank {} of {} (generation {})",
            self.rank(),
            self.group().world_size(),
            self.group().generation()
        );
        Ok(())
    }

    /// Every survivor failed at the same collective of the same iteration,
    /// with the same optimizer steps taken, or an error on every rank naming
    /// where each stands. A collective can complete on some ranks and fail
    /// on others (a rank died as its last pieces were on their way): those
    /// ranks moved on, and going on would put the ranks out of step (their
    /// next collectives would not match), so the run stops and a restart
    /// (`--max-restarts`) takes over. Collective.
    fn agree_on_place(&self, what: &str, at: At) -> Result<()> {
        let stage = STAGES
            .iter()
            .position(|s| *s == what)
            .unwrap_or(STAGES.len());
        let mine = [
            at.epoch as i64,
            at.iteration as i64,
            at.steps as i64,
            stage as i64,
        ];
        let all = self.group().all_gather(&mine)?;
        if all.chunks(4).all(|place| place == &all[..4]) {
            return Ok(());
        }
        let places: Vec<String> = (all.chunks(4).enumerate())
            .map(|(rank, p)| {
                let stage = STAGES.get(p[3] as usize).unwrap_or(&"elsewhere");
                format!(
                    "rank {rank}: epoch {}, iteration {}, {} optimizer steps, {stage}",
                    p[0], p[1], p[2]
                )
            })
            .collect();
        Err(CommError::InvalidArgument {
            rank: self.rank(),
            message: format!(
                "the ranks still there stand at different places of the loop after the failure \
                 ({}): a collective completed on some of them only, and going on would put \
                 them out of step; start again from the last checkpoint (burn-ddp-run \
                 --max-restarts N)",
                places.join("; ")
            ),
        })
    }

    /// Runs the epochs of `plan` with `learning`, in step with every other
    /// rank; returns once every rank is done (a closing barrier), so nobody
    /// leaves while another rank may still need it.
    pub fn fit<L: Learning>(
        &self,
        learning: &mut L,
        plan: Plan,
    ) -> std::result::Result<(), FitError> {
        // Optimizer steps taken, for the survivors' agreement.
        let mut steps = 0u64;
        for epoch in plan.starting_epoch..=plan.num_epochs {
            self.set_epoch(epoch);
            let started = Instant::now();
            if !self.train_epoch(learning, epoch, plan, &mut steps)? {
                let reason = learning.stop_reason();
                log::info!(
                    "Training interrupted: {}",
                    reason.as_deref().unwrap_or("reason unknown")
                );
                break;
            }
            let train_time = started.elapsed();
            let started = Instant::now();
            learning.validate(epoch);
            let valid_time = started.elapsed();
            let at = At {
                epoch,
                iteration: 0,
                steps,
            };
            self.going_on(plan, "summing the epoch's metrics", at, || {
                self.end_epoch(epoch, plan.num_epochs, train_time, valid_time)
            })?;
            let early_stop =
                self.is_main() && !learning.interrupted() && learning.early_stop(epoch);
            // Agreed before the checkpoint: an epoch interrupted on any rank
            // (its validation cut short) is not saved; an epoch early
            // stopping ends on is.
            let after = self.going_on(plan, "agreeing on early stopping", at, || {
                self.after_epoch(epoch, early_stop, learning.interrupted())
            })?;
            if after == AfterEpoch::Interrupted {
                if !learning.interrupted() {
                    learning.interrupt("interrupted on another rank");
                }
                break;
            }
            learning.checkpoint(epoch);
            if after == AfterEpoch::EarlyStop {
                break;
            }
        }
        let at = At {
            epoch: plan.num_epochs,
            iteration: 0,
            steps,
        };
        self.going_on(plan, "the closing barrier", at, || self.group().barrier())
    }

    /// One epoch's training split; whether it completed (every rank's loader
    /// ran out) rather than stopped.
    fn train_epoch<L: Learning>(
        &self,
        learning: &mut L,
        epoch: usize,
        plan: Plan,
        steps: &mut u64,
    ) -> std::result::Result<bool, FitError> {
        log::info!("Executing training step for epoch {epoch}");
        let items = learning.start_training(epoch);
        let at = |iteration, steps: &u64| At {
            epoch,
            iteration,
            steps: *steps,
        };
        let lengths = self.going_on(plan, "comparing loader lengths", at(0, steps), || {
            self.check_lengths("training", items)
        })?;
        let per_step = plan.grad_accumulation.unwrap_or(1).max(1);
        let mut iteration = 0;
        let mut pending = 0;
        // What every rank agreed on last: the whole epoch, or a stop. Only
        // the vote decides what comes next (the leftover step, validation),
        // never this rank's own interrupter, which other threads may set at
        // any time.
        let completed = loop {
            let item = learning.next_item();
            let interrupted = learning.interrupted();
            // An interrupted rank votes as if it had a batch: a failed
            // loader is a stop, not a shorter epoch.
            let here = at(iteration, steps);
            let next = self.going_on(plan, "agreeing on the next iteration", here, || {
                self.next_iteration(
                    epoch,
                    iteration,
                    item.is_some() || interrupted,
                    interrupted,
                    &lengths,
                )
            })?;
            let item = match (next, item) {
                (NextIteration::Train, Some(item)) => item,
                (NextIteration::Stop { reason }, _) => {
                    if let Some(reason) = reason {
                        learning.interrupt(&reason);
                    }
                    break false;
                }
                _ => break true,
            };
            iteration += 1;
            let output = learning.train_step(item);
            pending += 1;
            if pending == per_step {
                pending = 0;
                self.step(learning, plan, (epoch, iteration), steps)?;
            }
            learning.report(output, iteration);
        };
        // Every rank's shard has the same length, so every rank has the same
        // leftover (none after an agreed stop).
        if completed && pending > 0 && plan.step_leftover {
            self.step(learning, plan, (epoch, iteration), steps)?;
        }
        learning.end_training(epoch, completed);
        Ok(completed)
    }
}

impl LearnerJob {
    /// One optimizer step on the gradients averaged over the ranks; under
    /// `plan.go_on`, a step that fails because ranks are gone is dropped
    /// (its gradients were this rank's alone) and the survivors go on.
    fn step<L: Learning>(
        &self,
        learning: &mut L,
        plan: Plan,
        (epoch, iteration): (usize, usize),
        steps: &mut u64,
    ) -> std::result::Result<(), FitError> {
        const WHAT: &str = "averaging gradients";
        match learning.optimizer_step() {
            Ok(()) => {
                *steps += 1;
                Ok(())
            }
            Err(error) if plan.go_on && error.is_peer_failure() => {
                let at = At {
                    epoch,
                    iteration,
                    steps: *steps,
                };
                self.go_on_after(error, WHAT, at).doing(WHAT)
            }
            Err(error) => Err(FitError {
                what: "averaging gradients",
                error,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_ddp_comm::ProcessGroup;
    use std::cell::Cell;

    /// A learner of `batches` items per epoch that records what it is told.
    struct Script {
        batches: usize,
        left: usize,
        log: Vec<String>,
        stopped: Cell<bool>,
        stop_at: Option<(usize, usize)>,
        epoch: usize,
        seen: usize,
    }

    impl Script {
        fn new(batches: usize) -> Self {
            Self {
                batches,
                left: 0,
                log: Vec::new(),
                stopped: Cell::new(false),
                stop_at: None,
                epoch: 0,
                seen: 0,
            }
        }
    }

    impl Learning for Script {
        type Item = usize;
        type Output = usize;

        fn start_training(&mut self, epoch: usize) -> usize {
            self.epoch = epoch;
            self.left = self.batches;
            self.seen = 0;
            self.log.push(format!("start {epoch}"));
            self.batches
        }
        fn next_item(&mut self) -> Option<usize> {
            if self.stop_at == Some((self.epoch, self.seen)) {
                self.stopped.set(true);
            }
            self.left = self.left.checked_sub(1)?;
            self.seen += 1;
            Some(self.seen)
        }
        fn train_step(&mut self, item: usize) -> usize {
            self.log.push(format!("train {item}"));
            item
        }
        fn optimizer_step(&mut self) -> Result<()> {
            self.log.push("step".into());
            Ok(())
        }
        fn report(&mut self, output: usize, iteration: usize) {
            assert_eq!(output, iteration);
        }
        fn end_training(&mut self, epoch: usize, completed: bool) {
            self.log.push(format!("end {epoch} {completed}"));
        }
        fn validate(&mut self, epoch: usize) {
            self.log.push(format!("valid {epoch}"));
        }
        fn early_stop(&mut self, _epoch: usize) -> bool {
            false
        }
        fn checkpoint(&mut self, epoch: usize) {
            self.log.push(format!("checkpoint {epoch}"));
        }
        fn interrupted(&self) -> bool {
            self.stopped.get()
        }
        fn interrupt(&self, _reason: &str) {
            self.stopped.set(true);
        }
        fn stop_reason(&self) -> Option<String> {
            None
        }
    }

    fn job() -> LearnerJob {
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        let dir = std::env::temp_dir().join(format!("fit-{}", std::process::id()));
        LearnerJob::new(&group, dir).with_metrics_wait(std::time::Duration::ZERO)
    }

    fn plan(accumulation: Option<usize>, leftover: bool) -> Plan {
        Plan {
            starting_epoch: 1,
            num_epochs: 2,
            grad_accumulation: accumulation,
            step_leftover: leftover,
            go_on: false,
        }
    }

    #[test]
    fn accumulation_steps_every_k_and_the_leftover_only_when_asked() {
        let steps = |accumulation, leftover| {
            let mut script = Script::new(5);
            job()
                .fit(&mut script, plan(accumulation, leftover))
                .unwrap();
            let log = script.log.join(",");
            let first = log.split("valid 1").next().unwrap().to_string();
            first.matches("step").count()
        };
        assert_eq!(steps(None, false), 5);
        assert_eq!(steps(Some(2), false), 2);
        assert_eq!(steps(Some(2), true), 3);
        assert_eq!(steps(Some(5), true), 1);
    }

    #[test]
    fn every_epoch_is_trained_validated_and_checkpointed_in_order() {
        let mut script = Script::new(1);
        job().fit(&mut script, plan(None, true)).unwrap();
        assert_eq!(
            script.log,
            [
                "start 1",
                "train 1",
                "step",
                "end 1 true",
                "valid 1",
                "checkpoint 1",
                "start 2",
                "train 1",
                "step",
                "end 2 true",
                "valid 2",
                "checkpoint 2"
            ]
        );
    }

    #[test]
    fn a_stop_ends_training_without_validation_or_checkpoint() {
        let mut script = Script::new(3);
        script.stop_at = Some((2, 1));
        job().fit(&mut script, plan(Some(2), true)).unwrap();
        let log = script.log.join(",");
        assert!(
            log.ends_with("checkpoint 1,start 2,train 1,end 2 false"),
            "{log}"
        );
    }
}
