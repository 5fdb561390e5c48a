//! The learning strategy: burn-train's single-device loop, with the ranks kept
//! in step.
//!
//! It follows `SingleDeviceTrainingStrategy` of burn-train 0.21
//! (`learner/supervised/strategies/single/`) line for line where one rank is
//! concerned, so a world of one trains bitwise as Burn's own strategy does, and
//! adds what several processes need: shard epochs, one gradient average per
//! optimizer step, a vote per iteration, global epoch figures, rank 0's early
//! stopping decision, and a closing barrier.

use super::metrics::globalize;
use super::DdpTraining;
use crate::CommError;
use burn::data::dataloader::Progress;
use burn::module::{AutodiffModule, Module};
use burn::optim::GradientsAccumulator;
use burn::tensor::backend::DeviceOps;
use burn::train::{
    EventProcessorTraining, Interrupter, Learner, LearnerEvent, LearningComponentsTypes,
    LearningResult, SupervisedLearningStrategy, SupervisedTrainingEventProcessor, TrainLoader,
    TrainingComponents, TrainingItem, TrainingModel, ValidLoader,
};
use burn_ddp_training::learner::{AfterEpoch, NextIteration};
use burn_ddp_training::stop;
use std::time::Instant;

type InferenceModelOf<LC> = <LC as LearningComponentsTypes>::InferenceModel;
type DeviceOf<LC> = burn::tensor::Device<<LC as LearningComponentsTypes>::Backend>;

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

    fn rank(&self) -> usize {
        self.ddp.rank()
    }

    /// A communication failure leaves no way to continue in step with the
    /// others: stop this rank with the reason (burn-train's strategies cannot
    /// return errors).
    fn fail(&self, what: &str, err: CommError) -> ! {
        match err {
            // A disagreement between the ranks: its message names this rank.
            CommError::InvalidArgument { .. } => panic!("{err}"),
            err => panic!("rank {}: {what}: {err}", self.rank()),
        }
    }

    fn train_epoch<LC: LearningComponentsTypes>(
        &self,
        learner: &mut Learner<LC>,
        loader: &TrainLoader<LC>,
        global_progress: &Progress,
        processor: &mut SupervisedTrainingEventProcessor<LC>,
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
        let mut iteration = 0;
        let mut accumulator = GradientsAccumulator::new();
        let mut accumulated = 0;
        // What every rank agreed on last: the whole epoch, or a stop. Only
        // the vote decides what comes next, never this rank's own
        // interrupter, which other threads may set at any time.
        let completed = loop {
            let item = iterator.next();
            let next = self
                .ddp
                .next_iteration(
                    epoch,
                    iteration,
                    item.is_some(),
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
            learner.lr_step();
            let progress = iterator.progress();
            // Local backward passes; the average is taken once per optimizer step.
            let output = {
                let _local = crate::no_sync();
                learner.train_step(item)
            };
            let model = learner.model();
            let grads = match grad_accumulation {
                Some(k) => {
                    accumulator.accumulate(&model, output.grads);
                    accumulated += 1;
                    if accumulated >= k {
                        accumulated = 0;
                        Some(accumulator.grads())
                    } else {
                        None
                    }
                }
                None => Some(output.grads),
            };
            if let Some(grads) = grads {
                let grads =
                    crate::sync::sync_module(self.ddp.reducer(), self.ddp.group(), &model, grads)
                        .unwrap_or_else(|err| self.fail("averaging gradients", err));
                learner.optimizer_step(grads);
            }
            let item = TrainingItem::new(
                output.item,
                progress,
                global_progress.clone(),
                Some(iteration),
                Some(learner.lr_current()),
            );
            processor.process_train(LearnerEvent::ProcessedItem(item));
        };
        processor.process_train(LearnerEvent::EndEpoch(epoch));
        completed
    }

    fn valid_epoch<LC: LearningComponentsTypes>(
        &self,
        learner: &Learner<LC>,
        loader: &ValidLoader<LC>,
        global_progress: &Progress,
        processor: &mut SupervisedTrainingEventProcessor<LC>,
        interrupter: &Interrupter,
    ) {
        use burn::train::InferenceStep;
        let epoch = global_progress.items_processed;
        log::info!("Executing validation step for epoch {epoch}");
        let model = learner.model().valid();
        let mut iterator = loader.iter();
        let mut iteration = 0;
        // No collective here: shards may differ by one item, and an interrupt is
        // agreed on at the end of the epoch.
        while let Some(item) = iterator.next() {
            if let Some(signal) = stop::stop_signal() {
                // Ctrl-C during validation: this rank's figures end here; the
                // ranks agree to stop at the end of the epoch.
                interrupter.stop(Some(&format!("{} received", stop::signal_name(signal))));
                break;
            }
            let progress = iterator.progress();
            iteration += 1;
            let item = model.step(item);
            let item = TrainingItem::new(
                item,
                progress,
                global_progress.clone(),
                Some(iteration),
                None,
            );
            processor.process_valid(LearnerEvent::ProcessedItem(item));
        }
        processor.process_valid(LearnerEvent::EndEpoch(epoch));
    }

    /// Rank 0's parameters everywhere, as `DistributedDataParallel(model)` does.
    fn broadcast_parameters<LC: LearningComponentsTypes>(&self, learner: &mut Learner<LC>) {
        let model = crate::wrap::broadcast_module(learner.model(), self.ddp.group(), true)
            .unwrap_or_else(|err| self.fail("broadcasting rank 0's parameters", err));
        learner.load_model(model.into_record());
    }
}

/// This rank's device: where the model was built, not the backend's default
/// (`cuda:0` for every rank).
fn device_of<LC: LearningComponentsTypes>(learner: &Learner<LC>) -> DeviceOf<LC> {
    learner
        .model()
        .devices()
        .into_iter()
        .next()
        .unwrap_or_default()
}

impl<LC: LearningComponentsTypes> SupervisedLearningStrategy<LC> for DdpLearningStrategy {
    fn train(
        &self,
        mut learner: Learner<LC>,
        dataloader_train: TrainLoader<LC>,
        dataloader_valid: ValidLoader<LC>,
        mut components: TrainingComponents<LC>,
    ) -> LearningResult<InferenceModelOf<LC>> {
        // Ctrl-C and SIGTERM stop every rank after the same iteration, through
        // the same path as the TUI's quit key, instead of killing it mid-step.
        stop::catch_stop_signals();
        let device = device_of(&learner);
        let starting_epoch = match components.checkpoint {
            Some(epoch) => {
                if let Some(checkpointer) = &mut components.checkpointer {
                    self.ddp
                        .verify_checkpoint(epoch)
                        .unwrap_or_else(|err| self.fail("checking the checkpoint", err));
                    learner = checkpointer.load_checkpoint(learner, &device, epoch);
                }
                epoch + 1
            }
            None => 1,
        };
        // Rank 0's parameters on every rank, fresh or resumed: the replicas
        // start identical whatever each rank loaded.
        self.broadcast_parameters(&mut learner);
        self.ddp
            .figures()
            .start_at(starting_epoch, self.ddp.directory(), self.ddp.is_main());
        let summary = components.summary.clone().filter(|_| self.rank() == 0);
        components
            .event_processor
            .process_train(LearnerEvent::Start);
        if starting_epoch > 1 {
            // burn-train's metric store numbers epochs from 1 whatever the
            // checkpoint: end the epochs already done, so a resumed run's metric
            // files continue at `starting_epoch`.
            components
                .event_processor
                .process_train(LearnerEvent::EndEpoch(starting_epoch - 1));
            components
                .event_processor
                .process_valid(LearnerEvent::EndEpoch(starting_epoch - 1));
        }
        let (model, mut processor) = self.fit(
            components,
            learner,
            dataloader_train,
            dataloader_valid,
            starting_epoch,
        );
        let summary = summary
            .and_then(|summary| summary.init().ok())
            .map(|summary| globalize(self.ddp.figures(), summary));
        processor.process_train(LearnerEvent::End(summary));
        let model = model.valid();
        let renderer = processor.renderer();
        LearningResult { model, renderer }
    }

    fn fit(
        &self,
        components: TrainingComponents<LC>,
        mut learner: Learner<LC>,
        dataloader_train: TrainLoader<LC>,
        dataloader_valid: ValidLoader<LC>,
        starting_epoch: usize,
    ) -> (TrainingModel<LC>, SupervisedTrainingEventProcessor<LC>) {
        let device = device_of(&learner);
        let dataloader_train = dataloader_train.to_device(&device);
        let dataloader_valid = dataloader_valid.to_device(device.inner());
        learner.fork(&device);
        let mut processor = components.event_processor;
        let mut checkpointer = components.checkpointer;
        let mut early_stopping = components.early_stopping;
        let interrupter = components.interrupter;
        let num_epochs = components.num_epochs;

        for epoch in starting_epoch..=num_epochs {
            let progress = Progress::new(epoch, num_epochs);
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
                    .get_message()
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
            let valid_time = started.elapsed();
            self.ddp
                .end_epoch(epoch, num_epochs, train_time, valid_time)
                .unwrap_or_else(|err| self.fail("summing the epoch's metrics", err));
            let early_stop = self.ddp.is_main()
                && early_stopping
                    .as_mut()
                    .is_some_and(|strategy| strategy.should_stop(epoch, &components.event_store));
            // Agreed before the checkpoint: an epoch interrupted on any rank
            // (its validation cut short) is not saved; an epoch early
            // stopping ends on is.
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
