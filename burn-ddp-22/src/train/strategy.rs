//! The learning strategy: burn-train 0.22's single-device loop, with the
//! ranks kept in step.
//!
//! It follows `SingleDeviceTrainingStrategy` of burn-train 0.22
//! (`learner/supervised/strategies/single/`) line for line where one rank is
//! concerned (events, scheduler cadence, the leftover micro-batches of an
//! epoch, no checkpoint after an interrupt), so a world of one trains as
//! Burn's own strategy does, and adds what several processes need: shard
//! epochs, one gradient average per optimizer step, a vote per iteration,
//! global epoch figures, rank 0's early stopping decision, and a closing
//! barrier. The agreements themselves are burn-ddp-comm's `LearnerJob`.

use super::burn_version;
use super::metrics::globalize;
use super::DdpTraining;
use crate::CommError;
use burn::data::dataloader::Progress;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::Device;
use burn::train::{
    EventProcessorTraining, InferenceStep, Interrupter, Learner, LearnerEvent, LearnerModel,
    LearningResult, SupervisedLearningStrategy, SupervisedTrainingEventProcessor, TrainLoader,
    TrainingComponents, TrainingItem, ValidLoader,
};
use burn_ddp_training::learner::{AfterEpoch, NextIteration};
use burn_ddp_training::stop;
use std::time::Instant;

/// burn-ddp's `SupervisedLearningStrategy`; installed by
/// [`DdpSupervisedTraining::ddp`](super::DdpSupervisedTraining::ddp).
pub struct DdpLearningStrategy {
    ddp: DdpTraining,
}

impl DdpLearningStrategy {
    /// The strategy for one rank of `ddp`'s group.
    pub fn new(ddp: DdpTraining) -> Self {
        Self { ddp }
    }

    /// A communication failure leaves no way to continue in step with the
    /// others: stop this rank with the reason (burn-train's `TrainingError`
    /// has no place for it, and the other ranks fail on their next
    /// collective, within the group's timeout).
    fn fail(&self, what: &str, err: CommError) -> ! {
        match err {
            // A disagreement between the ranks: its message names this rank.
            CommError::InvalidArgument { .. } => panic!("{err}"),
            err => panic!("rank {}: {what}: {err}", self.ddp.rank()),
        }
    }

    /// This rank's device, with autodiff (Burn's own strategies are handed
    /// one; a custom one gets the model's): where the model was built, not
    /// the backend's default (`cuda:0` for every rank).
    fn device_of<M: LearnerModel>(&self, learner: &Learner<M>) -> Device {
        let device = learner
            .model()
            .devices()
            .into_iter()
            .next()
            .unwrap_or_default();
        let device = device.inner().autodiff();
        if self.ddp.gradient_checkpointing {
            device.gradient_checkpointing()
        } else {
            device
        }
    }

    fn train_epoch<M: LearnerModel>(
        &self,
        learner: &mut Learner<M>,
        loader: &TrainLoader<M>,
        global_progress: &Progress,
        processor: &mut SupervisedTrainingEventProcessor<M>,
        interrupter: &Interrupter,
        grad_accumulation: Option<usize>,
    ) -> bool {
        let epoch = global_progress.items_processed;
        log::info!("Executing training step for epoch {epoch}");
        let lengths = self
            .ddp
            .check_lengths("training", loader.num_items())
            .unwrap_or_else(|err| self.fail("comparing loader lengths", err));
        let mut iterator = loader.iter();
        interrupter.fail_on_error(processor.process_train(burn_version::start_split(
            epoch,
            loader.num_items(),
            iterator.progress(),
        )));
        let mut iteration = 0;
        let mut accumulator = GradientsAccumulator::new();
        let mut accumulated = 0;
        // What every rank agreed on last: the whole epoch, or a stop. Only
        // the vote decides what comes next (the leftover step, validation),
        // never this rank's own interrupter, which other threads (the event
        // processor, the checkpointer) may set at any time.
        let completed = loop {
            let item = match iterator.next() {
                Some(Ok(item)) => Some(item),
                Some(Err(err)) => {
                    // Voted as an interrupt below, so the others stop too.
                    interrupter.fail(err);
                    None
                }
                None => {
                    // An error the processor found in the last items comes
                    // back on a later call: now, so it is in the vote.
                    interrupter.fail_on_error(processor.flush());
                    None
                }
            };
            let next = self
                .ddp
                .next_iteration(
                    epoch,
                    iteration,
                    item.is_some() || interrupter.should_stop(),
                    interrupter.should_stop(),
                    &lengths,
                )
                .unwrap_or_else(|err| self.fail("agreeing on the next iteration", err));
            let item = match (next, item) {
                (NextIteration::Train, Some(item)) => item,
                (NextIteration::Stop { reason }, _) => {
                    if let Some(reason) = reason {
                        interrupter.stop(Some(&reason));
                    }
                    break false;
                }
                _ => break true,
            };
            iteration += 1;
            let progress = iterator.progress();
            let output = learner.train_step(item);
            let grads = match grad_accumulation {
                Some(k) => {
                    accumulator.accumulate(&learner.model(), output.grads);
                    accumulated += 1;
                    (accumulated >= k).then(|| {
                        accumulated = 0;
                        accumulator.grads()
                    })
                }
                None => Some(output.grads),
            };
            if let Some(grads) = grads {
                self.step(learner, grads);
            }
            let item = TrainingItem::new(
                output.item,
                progress,
                Some(iteration),
                Some(learner.lr_current()),
            );
            interrupter.fail_on_error(processor.process_train(LearnerEvent::ProcessedItem(item)));
        };
        // The epoch's leftover micro-batches, which Burn's own strategy
        // applies too (0.22 with the last item, 0.23 after it); every rank's
        // shard has the same length, so every rank has them (none after an
        // agreed stop).
        if completed && accumulated > 0 {
            self.step(learner, accumulator.grads());
        }
        let end = burn_version::end_split(epoch, iterator.progress(), completed);
        interrupter.fail_on_error(processor.process_train(end));
        completed
    }

    /// One optimizer step with the gradients averaged over the ranks.
    fn step<M: LearnerModel>(&self, learner: &mut Learner<M>, grads: GradientsParams) {
        let grads = crate::sync::sync_module(
            self.ddp.reducer(),
            self.ddp.group(),
            &learner.model(),
            grads,
        )
        .unwrap_or_else(|err| self.fail("averaging gradients", err));
        learner.lr_step();
        learner.optimizer_step(grads);
    }

    fn valid_epoch<M: LearnerModel>(
        &self,
        learner: &Learner<M>,
        loader: &ValidLoader<M>,
        global_progress: &Progress,
        processor: &mut SupervisedTrainingEventProcessor<M>,
        interrupter: &Interrupter,
    ) {
        let epoch = global_progress.items_processed;
        log::info!("Executing validation step for epoch {epoch}");
        let model = learner.model().valid();
        let mut iterator = loader.iter();
        interrupter.fail_on_error(processor.process_valid(burn_version::start_split(
            epoch,
            loader.num_items(),
            iterator.progress(),
        )));
        let mut iteration = 0;
        // No collective here: shards may differ by one item, and an
        // interrupt is agreed on at the end of the epoch.
        while let Some(item) = iterator.next() {
            let item = match item {
                Ok(item) => item,
                Err(err) => {
                    interrupter.fail(err);
                    break;
                }
            };
            if let Some(signal) = stop::stop_signal() {
                // Ctrl-C during validation: this rank's figures end here; the
                // ranks agree to stop at the end of the epoch.
                interrupter.stop(Some(&format!("{} received", stop::signal_name(signal))));
                break;
            }
            let progress = iterator.progress();
            iteration += 1;
            let item = InferenceStep::step(&model, item);
            let item = TrainingItem::new(item, progress, Some(iteration), None);
            interrupter.fail_on_error(processor.process_valid(LearnerEvent::ProcessedItem(item)));
            if interrupter.should_stop() {
                break;
            }
        }
        let end = burn_version::end_split(epoch, iterator.progress(), !interrupter.should_stop());
        interrupter.fail_on_error(processor.process_valid(end));
    }

    /// Rank 0's parameters everywhere, as `DistributedDataParallel(model)` does.
    fn broadcast_parameters<M: LearnerModel>(&self, learner: &mut Learner<M>) {
        let model = crate::wrap::broadcast_module(learner.model(), self.ddp.group(), true)
            .unwrap_or_else(|err| self.fail("broadcasting rank 0's parameters", err));
        learner.load_model(model.into_record());
    }
}

impl<M: LearnerModel> SupervisedLearningStrategy<M> for DdpLearningStrategy {
    fn train(
        &self,
        mut learner: Learner<M>,
        dataloader_train: TrainLoader<M>,
        dataloader_valid: ValidLoader<M>,
        mut components: TrainingComponents<M>,
    ) -> LearningResult<M> {
        // Ctrl-C and SIGTERM stop every rank after the same iteration, through
        // the same path as the TUI's quit key, instead of killing it mid-step.
        stop::catch_stop_signals();
        // Burn 0.22's `launch` has loaded the checkpoint on every rank
        // already; rank 0's parameters go to every rank all the same, so
        // the replicas start identical whatever each rank loaded (or not).
        let starting_epoch = components.checkpoint.unwrap_or(0) + 1;
        self.broadcast_parameters(&mut learner);
        self.ddp
            .figures()
            .start_at(starting_epoch, self.ddp.directory(), self.ddp.is_main());
        let summary = components.summary.clone().filter(|_| self.ddp.is_main());
        let interrupter = components.interrupter.clone();
        interrupter.fail_on_error(
            components
                .event_processor
                .process_train(LearnerEvent::Start {
                    total_epochs: components.num_epochs,
                    starting_epoch,
                    label: components.label.clone(),
                }),
        );
        let (model, mut processor) = self.fit(
            components,
            learner,
            dataloader_train,
            dataloader_valid,
            starting_epoch,
        );
        // Without the model's description: burn-train keeps `with_model` to itself.
        let summary = summary
            .and_then(|summary| summary.init().ok())
            .map(|summary| globalize(self.ddp.figures(), summary));
        interrupter.fail_on_error(processor.process_train(LearnerEvent::End(summary)));
        let model = model.valid();
        interrupter.fail_on_error(processor.flush());
        let renderer = processor.renderer();
        LearningResult {
            model,
            renderer,
            interrupted: interrupter.interruption(),
            error: interrupter.error(),
        }
    }

    fn fit(
        &self,
        components: TrainingComponents<M>,
        mut learner: Learner<M>,
        dataloader_train: TrainLoader<M>,
        dataloader_valid: ValidLoader<M>,
        starting_epoch: usize,
    ) -> (M, SupervisedTrainingEventProcessor<M>) {
        let device = self.device_of(&learner);
        let dataloader_train = dataloader_train.to_device(&device);
        let dataloader_valid = dataloader_valid.to_device(&device.clone().inner());
        learner.fork(&device);
        let mut processor = components.event_processor;
        let mut checkpointer = components.checkpointer;
        let mut early_stopping = components.early_stopping;
        let interrupter = components.interrupter;
        let num_epochs = components.num_epochs;

        for epoch in starting_epoch..=num_epochs {
            let progress = Progress::new(epoch, num_epochs, Some("epochs".to_string()));
            self.ddp.set_epoch(epoch);
            let started = Instant::now();
            let completed = self.train_epoch(
                &mut learner,
                &dataloader_train,
                &progress,
                &mut processor,
                &interrupter,
                components.grad_accumulation,
            );
            if !completed {
                let reason = interrupter
                    .interruption()
                    .and_then(|interruption| interruption.reason)
                    .unwrap_or_else(|| "reason unknown".to_string());
                log::info!("Training interrupted: {reason}");
                break;
            }
            let train_time = started.elapsed();
            let started = Instant::now();
            self.valid_epoch(
                &learner,
                &dataloader_valid,
                &progress,
                &mut processor,
                &interrupter,
            );
            interrupter.fail_on_error(processor.process_train(LearnerEvent::EndEpoch(epoch)));
            let valid_time = started.elapsed();
            // The store's thread has the epoch's events once the processor's
            // has; the figures wait for the store (EpochFigures::reduce_epoch).
            interrupter.fail_on_error(processor.flush());
            self.ddp
                .end_epoch(epoch, num_epochs, train_time, valid_time)
                .unwrap_or_else(|err| self.fail("summing the epoch's metrics", err));
            let early_stop = self.ddp.is_main()
                && !interrupter.should_stop()
                && early_stopping
                    .as_mut()
                    .is_some_and(|strategy| strategy.should_stop(epoch, &components.event_store));
            // Agreed before the checkpoint: an epoch interrupted on any rank
            // (its validation cut short) is not saved, as in Burn's own
            // strategy; an epoch early stopping ends on is.
            let after = self
                .ddp
                .after_epoch(epoch, early_stop, interrupter.should_stop())
                .unwrap_or_else(|err| self.fail("agreeing on early stopping", err));
            if after == AfterEpoch::Interrupted {
                if !interrupter.should_stop() {
                    interrupter.stop(Some("interrupted on another rank"));
                }
                break;
            }
            if let Some(checkpointer) = &mut checkpointer {
                checkpointer.checkpoint(&learner, epoch, &components.event_store);
            }
            if after == AfterEpoch::EarlyStop {
                break;
            }
        }
        // Nobody leaves while another rank may still need it.
        if let Err(err) = self.ddp.group().barrier() {
            self.fail("the closing barrier", err);
        }
        (learner.model(), processor)
    }
}
