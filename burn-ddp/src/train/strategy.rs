//! The learning strategy: burn-train's single-device loop, with the ranks kept
//! in step.
//!
//! It follows `SingleDeviceTrainingStrategy` of burn-train 0.21
//! (`learner/supervised/strategies/single/`) line for line where one rank is
//! concerned, so a world of one trains bitwise as Burn's own strategy does, and
//! adds what several processes need: shard epochs, one gradient average per
//! optimizer step, a vote per iteration, global epoch figures, rank 0's early
//! stopping decision, and a closing barrier.

use super::metrics::{reduce_epoch, GlobalMetric};
use super::{DdpTraining, EpochReport};
use crate::{CommError, ReduceOp};
use burn::data::dataloader::Progress;
use burn::module::{AutodiffModule, Module};
use burn::optim::GradientsAccumulator;
use burn::tensor::backend::DeviceOps;
use burn::train::{
    EventProcessorTraining, Interrupter, Learner, LearnerEvent, LearningComponentsTypes,
    LearningResult, SupervisedLearningStrategy, SupervisedTrainingEventProcessor, TrainLoader,
    TrainingComponents, TrainingItem, TrainingModel, ValidLoader,
};
use burn_ddp_comm::stop;
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
        self.ddp.group.rank()
    }

    /// A communication failure leaves no way to continue in step with the
    /// others: stop this rank with the reason (burn-train's strategies cannot
    /// return errors).
    fn fail(&self, what: &str, err: CommError) -> ! {
        panic!("rank {}: {what}: {err}", self.rank())
    }

    /// `epoch`'s checkpoint files, checked before Burn's loader panics without
    /// naming them.
    fn check_checkpoint_exists(&self, epoch: usize) {
        let folder = self.ddp.directory.join("checkpoint");
        let prefix = format!("model-{epoch}.");
        let found = std::fs::read_dir(&folder)
            .map(|entries| {
                entries
                    .flatten()
                    .any(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
            })
            .unwrap_or(false);
        if !found {
            panic!(
                "rank {}: cannot resume from epoch {epoch}: no {}* in {}; every rank loads the \
                 checkpoint itself, so on several machines copy the experiment's checkpoint \
                 folder to each of them (or put it on a shared file system)",
                self.rank(),
                prefix,
                folder.display()
            );
        }
    }

    /// Compares the loaders' lengths, so a rank that would run out of batches
    /// early is an error on every rank before the epoch starts.
    fn check_lengths(&self, what: &str, items: usize) -> Vec<usize> {
        let lengths = self
            .ddp
            .group
            .all_gather(&[items as i64])
            .unwrap_or_else(|err| self.fail("comparing loader lengths", err));
        let lengths: Vec<usize> = lengths.into_iter().map(|n| n as usize).collect();
        if lengths.iter().any(|&n| n != lengths[0]) {
            panic!(
                "rank {}: the {what} loaders have different lengths on the ranks ({}); every \
                 rank must run the same number of iterations: shard the training set with \
                 DdpTraining::shard (which pads it to equal shards) and use one batch size",
                self.rank(),
                describe(&lengths)
            );
        }
        lengths
    }

    /// How many ranks say yes to each of two questions (one small all-reduce).
    fn count_yes(&self, what: &str, first: bool, second: bool) -> (usize, usize) {
        let mut ballot = [first as i64, second as i64];
        self.ddp
            .group
            .all_reduce(&mut ballot, ReduceOp::Sum)
            .unwrap_or_else(|err| self.fail(what, err));
        (ballot[0] as usize, ballot[1] as usize)
    }

    /// The per-iteration vote: how many ranks have a batch and how many were
    /// interrupted.
    fn vote(&self, has_batch: bool, interrupted: bool) -> (usize, usize) {
        self.count_yes("agreeing on the next iteration", has_batch, interrupted)
    }

    fn train_epoch<LC: LearningComponentsTypes>(
        &self,
        learner: &mut Learner<LC>,
        loader: &TrainLoader<LC>,
        global_progress: &Progress,
        processor: &mut SupervisedTrainingEventProcessor<LC>,
        interrupter: &Interrupter,
        grad_accumulation: Option<usize>,
    ) {
        let epoch = global_progress.items_processed;
        let world = self.ddp.group.world_size();
        log::info!("Executing training step for epoch {epoch}");
        let lengths = self.check_lengths("training", loader.num_items());
        let mut iterator = loader.iter();
        let mut iteration = 0;
        let mut accumulator = GradientsAccumulator::new();
        let mut accumulated = 0;
        loop {
            let item = iterator.next();
            let signal = stop::stop_signal();
            let (with_batch, interrupted) = self.vote(
                item.is_some(),
                interrupter.should_stop() || signal.is_some(),
            );
            if interrupted > 0 {
                // Every rank stops here, before this iteration's step; the
                // epoch's checkpoint is not written (it would claim a whole epoch).
                if !interrupter.should_stop() {
                    let reason = match signal {
                        Some(signal) => format!("{} received", stop::signal_name(signal)),
                        None => format!("interrupted on {interrupted} other rank(s)"),
                    };
                    interrupter.stop(Some(&reason));
                }
                let finished = match epoch - 1 {
                    0 => "no epoch is finished".to_string(),
                    done => format!("epochs 1 to {done} are finished"),
                };
                log::info!(
                    "rank {}: stopping before iteration {} of epoch {epoch}; {finished}",
                    self.rank(),
                    iteration + 1,
                );
                break;
            }
            if with_batch == 0 {
                break;
            }
            let Some(item) = item else {
                panic!(
                    "rank {}: this rank's training loader ended after {iteration} iterations \
                     while {with_batch} of {world} ranks still had batches (loader lengths {}); \
                     use one batch size and DdpTraining::shard on every rank",
                    self.rank(),
                    describe(&lengths)
                );
            };
            if with_batch < world {
                panic!(
                    "rank {}: {} of {world} ranks ran out of training batches after \
                     {iteration} iterations (loader lengths {}); use one batch size and \
                     DdpTraining::shard on every rank",
                    self.rank(),
                    world - with_batch,
                    describe(&lengths)
                );
            }
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
                    crate::sync::sync_module(&self.ddp.reducer, &self.ddp.group, &model, grads)
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
        }
        processor.process_train(LearnerEvent::EndEpoch(epoch));
    }

    fn valid_epoch<LC: LearningComponentsTypes>(
        &self,
        learner: &Learner<LC>,
        loader: &ValidLoader<LC>,
        global_progress: &Progress,
        processor: &mut SupervisedTrainingEventProcessor<LC>,
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
            if stop::stop_signal().is_some() {
                // Ctrl-C during validation: this rank's figures end here; the
                // ranks agree to stop at the end of the epoch.
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

    /// Rank 0's early-stopping decision and anyone's interrupt, known to all.
    fn agree_to_stop(&self, early_stop_on_main: bool, interrupted: bool) -> (bool, bool) {
        let (stop, interrupted) = self.count_yes(
            "agreeing on early stopping",
            early_stop_on_main,
            interrupted,
        );
        (stop > 0, interrupted > 0)
    }

    /// Rank 0's parameters everywhere, as `DistributedDataParallel(model)` does.
    fn broadcast_parameters<LC: LearningComponentsTypes>(&self, learner: &mut Learner<LC>) {
        let model = crate::wrap::broadcast_module(learner.model(), &self.ddp.group, true)
            .unwrap_or_else(|err| self.fail("broadcasting rank 0's parameters", err));
        learner.load_model(model.into_record());
    }

    fn global_figures(&self, epoch: usize) -> Vec<GlobalMetric> {
        reduce_epoch(
            &self.ddp.group,
            &self.ddp.totals,
            epoch,
            self.ddp.metrics_wait,
            &self.ddp.directory,
        )
        .unwrap_or_else(|err| self.fail("summing the epoch's metrics", err))
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

fn describe(lengths: &[usize]) -> String {
    lengths
        .iter()
        .enumerate()
        .map(|(rank, n)| format!("rank {rank}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
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
                    self.check_checkpoint_exists(epoch);
                    learner = checkpointer.load_checkpoint(learner, &device, epoch);
                }
                epoch + 1
            }
            None => 1,
        };
        if starting_epoch == 1 {
            self.broadcast_parameters(&mut learner);
        }
        self.ddp
            .totals
            .start_at(starting_epoch, &self.ddp.directory, self.rank() == 0);
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
            .map(|summary| self.ddp.totals.globalize(summary));
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
            self.train_epoch(
                &mut learner,
                &dataloader_train,
                &progress,
                &mut processor,
                &interrupter,
                components.grad_accumulation,
            );
            if interrupter.should_stop() {
                let reason = interrupter
                    .get_message()
                    .unwrap_or_else(|| "reason unknown".to_string());
                log::info!("Training interrupted: {reason}");
                break;
            }
            let train_time = started.elapsed();
            let started = Instant::now();
            self.valid_epoch(&learner, &dataloader_valid, &progress, &mut processor);
            let valid_time = started.elapsed();
            let figures = self.global_figures(epoch);
            if let (0, Some(report)) = (self.rank(), &self.ddp.on_epoch_end) {
                report(&EpochReport {
                    epoch,
                    num_epochs,
                    figures,
                    train_time,
                    valid_time,
                });
            }
            if let Some(checkpointer) = &mut checkpointer {
                checkpointer.checkpoint(&learner, epoch, &components.event_store);
            }
            let early_stop = self.rank() == 0
                && early_stopping
                    .as_mut()
                    .is_some_and(|strategy| strategy.should_stop(epoch, &components.event_store));
            let (early_stop, interrupted) = self.agree_to_stop(
                early_stop,
                interrupter.should_stop() || stop::stop_signal().is_some(),
            );
            if interrupted {
                if !interrupter.should_stop() {
                    interrupter.stop(Some("interrupted on another rank"));
                }
                log::info!("Training interrupted after epoch {epoch}");
                break;
            }
            if early_stop {
                log::info!("Early stopping after epoch {epoch} (decided by rank 0)");
                break;
            }
        }
        // Nobody leaves while another rank may still need it.
        if let Err(err) = self.ddp.group.barrier() {
            self.fail("the closing barrier", err);
        }
        (learner.model(), processor)
    }
}
