//! The learning strategy: burn-train 0.22's single-device loop, with the
//! ranks kept in step.
//!
//! The epoch loop (the vote per iteration, one gradient average per
//! optimizer step, the after-epoch decision, the closing barrier) is
//! burn-ddp-training's [`LearnerJob::fit`]; this file is burn-train 0.22's
//! side of it. It follows `SingleDeviceTrainingStrategy` of burn-train 0.22
//! (`learner/supervised/strategies/single/`) where one rank is concerned
//! (events, the scheduler stepped with the optimizer, the leftover
//! micro-batches of an epoch applied, no checkpoint after an interrupt), so a
//! world of one trains as Burn's own strategy does.

use super::burn_version;
use super::sharded::{load_whole_state, ShardedLearning};
use super::DdpTraining;
use crate::shared::train::metrics::globalize;
use burn::data::dataloader::{DataLoaderIterator, Progress};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::Device;
use burn::train::{
    EventProcessorTraining, InferenceStep, Learner, LearnerEvent, LearnerModel, LearningResult,
    SupervisedLearningStrategy, SupervisedTrainingEventProcessor, TrainLoader, TrainStep,
    TrainingComponents, TrainingItem, ValidLoader,
};
use burn_ddp_training::learner::{FitError, LearnerJob, Learning, Plan};
use burn_ddp_training::stop;

type TrainItem<M> = <M as TrainStep>::Input;
type TrainOutput<M> = <M as TrainStep>::Output;

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
    fn fail(&self, err: FitError) -> ! {
        burn_ddp_training::failure::panic_with_message(err.message(self.ddp.rank()))
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

    /// Rank 0's parameters everywhere, as `DistributedDataParallel(model)` does.
    fn broadcast_parameters<M: LearnerModel>(&self, learner: &mut Learner<M>) {
        let model = crate::wrap::broadcast_module(learner.model(), &self.ddp.group(), true)
            .unwrap_or_else(|error| {
                self.fail(FitError {
                    what: "broadcasting rank 0's parameters",
                    error,
                })
            });
        learner.load_model(model.into_record());
    }

    /// With a sharded optimizer, this rank's part of the state, from the
    /// Learner or, resuming from a checkpoint in parts, from those parts;
    /// without, the whole state from those parts where the checkpoint has
    /// them (Burn's `optim-N` of a sharded run holds rank 0's part only).
    fn start_sharding<M: LearnerModel>(
        &self,
        learner: &mut Learner<M>,
        components: &TrainingComponents<M>,
    ) -> Option<ShardedLearning<M>> {
        let job = self.ddp.job();
        let parts = components.checkpoint.and_then(|epoch| job.parts_of(epoch));
        let started = match &self.ddp.sharded {
            Some(config) => {
                let checkpoints = components.checkpointer.is_some();
                let in_parts = job.folder_is_shared().map(|shared| shared && checkpoints);
                in_parts.and_then(|in_parts| {
                    let store = &components.event_store;
                    let (group, parts) = (&self.ddp.group(), parts.as_deref());
                    ShardedLearning::start(config, group, learner, store, parts, in_parts).map(Some)
                })
            }
            None => match &parts {
                Some(dir) => load_whole_state(&self.ddp.group(), learner, dir).map(|()| None),
                None => Ok(None),
            },
        };
        started.unwrap_or_else(|error| {
            self.fail(FitError {
                what: "loading the optimizer state",
                error,
            })
        })
    }
}

/// One rank's burn-train 0.22 Learner, as the shared loop drives it.
struct Epochs<'a, M: LearnerModel> {
    job: &'a LearnerJob,
    learner: Learner<M>,
    train: &'a TrainLoader<M>,
    valid: &'a ValidLoader<M>,
    /// Burn's event processor, checkpointer, interrupter, early stopping...
    components: TrainingComponents<M>,
    /// The epoch under way, its loader and where it is.
    epoch: Progress,
    items: Option<Box<dyn DataLoaderIterator<TrainItem<M>> + 'a>>,
    progress: Option<Progress>,
    /// The gradients since the last optimizer step.
    accumulator: GradientsAccumulator<M>,
    grads: Option<GradientsParams>,
    /// With a sharded optimizer: its state, and the current model.
    sharded: Option<ShardedLearning<M>>,
}

impl<M: LearnerModel> Epochs<'_, M> {
    /// The current model.
    fn model(&self) -> M {
        match &self.sharded {
            Some(sharded) => sharded.model().clone(),
            None => self.learner.model(),
        }
    }
}

impl<'a, M: LearnerModel> Learning for Epochs<'a, M> {
    type Item = TrainItem<M>;
    type Output = TrainOutput<M>;

    fn start_training(&mut self, epoch: usize) -> usize {
        self.epoch = Progress::new(
            epoch,
            self.components.num_epochs,
            Some("epochs".to_string()),
        );
        let items = self.train.iter();
        let start = burn_version::start_split(epoch, self.train.num_items(), items.progress());
        self.components
            .interrupter
            .fail_on_error(self.components.event_processor.process_train(start));
        self.items = Some(items);
        self.train.num_items()
    }

    fn next_item(&mut self) -> Option<Self::Item> {
        let items = self.items.as_mut()?;
        let item = match items.next() {
            Some(Ok(item)) => Some(item),
            Some(Err(err)) => {
                // Voted as an interrupt, so the others stop too.
                self.components.interrupter.fail(err);
                None
            }
            None => {
                // An error the processor found in the last items comes
                // back on a later call: now, so it is in the vote.
                self.components
                    .interrupter
                    .fail_on_error(self.components.event_processor.flush());
                None
            }
        };
        self.progress = Some(items.progress());
        item
    }

    fn train_step(&mut self, item: Self::Item) -> Self::Output {
        let output = match &self.sharded {
            // What `Learner::train_step` does, on the current model.
            Some(sharded) => TrainStep::step(sharded.model(), item),
            None => self.learner.train_step(item),
        };
        match self.components.grad_accumulation {
            Some(_) => self.accumulator.accumulate(&self.model(), output.grads),
            None => self.grads = Some(output.grads),
        }
        output.item
    }

    fn optimizer_step(&mut self) -> crate::Result<()> {
        let grads = match self.grads.take() {
            Some(grads) => grads,
            None => self.accumulator.grads(),
        };
        if let Some(sharded) = &mut self.sharded {
            return sharded.step(&mut self.learner, grads);
        }
        let model = self.learner.model();
        let grads = crate::sync::sync_module(self.job.reducer(), &self.job.group(), &model, grads)?;
        // burn-train 0.22 steps the scheduler with the optimizer.
        self.learner.lr_step();
        self.learner.optimizer_step(grads);
        Ok(())
    }

    fn report(&mut self, output: Self::Output, iteration: usize) {
        let progress = self.progress.clone().expect("an item's progress");
        let item = TrainingItem::new(
            output,
            progress,
            Some(iteration),
            Some(self.learner.lr_current()),
        );
        self.components.interrupter.fail_on_error(
            self.components
                .event_processor
                .process_train(LearnerEvent::ProcessedItem(item)),
        );
    }

    fn end_training(&mut self, epoch: usize, completed: bool) {
        let Some(items) = self.items.take() else {
            return;
        };
        let end = burn_version::end_split(epoch, items.progress(), completed);
        self.components
            .interrupter
            .fail_on_error(self.components.event_processor.process_train(end));
    }

    fn validate(&mut self, epoch: usize) {
        log::info!("Executing validation step for epoch {epoch}");
        let model = self.model().valid();
        let mut iterator = self.valid.iter();
        let start = burn_version::start_split(epoch, self.valid.num_items(), iterator.progress());
        self.components
            .interrupter
            .fail_on_error(self.components.event_processor.process_valid(start));
        let mut iteration = 0;
        // No collective here: shards may differ by one item, and an
        // interrupt is agreed on at the end of the epoch.
        while let Some(item) = iterator.next() {
            let item = match item {
                Ok(item) => item,
                Err(err) => {
                    self.components.interrupter.fail(err);
                    break;
                }
            };
            if let Some(signal) = stop::stop_signal() {
                // Ctrl-C during validation: this rank's figures end here; the
                // ranks agree to stop at the end of the epoch.
                let reason = format!("{} received", stop::signal_name(signal));
                self.components.interrupter.stop(Some(&reason));
                break;
            }
            let progress = iterator.progress();
            iteration += 1;
            let item = InferenceStep::step(&model, item);
            let item = TrainingItem::new(item, progress, Some(iteration), None);
            self.components.interrupter.fail_on_error(
                self.components
                    .event_processor
                    .process_valid(LearnerEvent::ProcessedItem(item)),
            );
            if self.components.interrupter.should_stop() {
                break;
            }
        }
        let completed = !self.components.interrupter.should_stop();
        let end = burn_version::end_split(epoch, iterator.progress(), completed);
        self.components
            .interrupter
            .fail_on_error(self.components.event_processor.process_valid(end));
        self.components.interrupter.fail_on_error(
            self.components
                .event_processor
                .process_train(LearnerEvent::EndEpoch(epoch)),
        );
        // The store's thread has the epoch's events once the processor's
        // has; the figures wait for the store (EpochFigures::reduce_epoch).
        self.components
            .interrupter
            .fail_on_error(self.components.event_processor.flush());
    }

    fn early_stop(&mut self, epoch: usize) -> bool {
        self.components
            .early_stopping
            .as_mut()
            .is_some_and(|strategy| strategy.should_stop(epoch, &self.components.event_store))
    }

    fn checkpoint(&mut self, epoch: usize) {
        let Some(checkpointer) = &mut self.components.checkpointer else {
            return;
        };
        let store = &self.components.event_store;
        if self.job.is_main() {
            self.job.clear_epoch(epoch);
        }
        let saved = match &mut self.sharded {
            Some(sharded) if sharded.in_parts() => {
                let dir = self.job.parts_folder(epoch);
                let saved = sharded.save_parts(&mut self.learner, store, &dir, epoch);
                saved.map(|()| checkpointer.checkpoint(&self.learner, epoch, store))
            }
            Some(sharded) => {
                sharded.checkpoint_whole(&mut self.learner, checkpointer, epoch, store)
            }
            None => {
                checkpointer.checkpoint(&self.learner, epoch, store);
                Ok(())
            }
        };
        if let Err(error) = saved {
            let what = "saving the sharded optimizer state for a checkpoint";
            burn_ddp_training::failure::panic_with_message(
                FitError { what, error }.message(self.job.rank()),
            );
        }
        if self.job.is_main() {
            self.job.prune_parts(Some(epoch));
        }
    }

    fn interrupted(&self) -> bool {
        self.components.interrupter.should_stop()
    }

    fn stop_reason(&self) -> Option<String> {
        self.components
            .interrupter
            .interruption()
            .and_then(|interruption| interruption.reason)
    }

    fn interrupt(&self, reason: &str) {
        self.components.interrupter.stop(Some(reason));
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
            .job()
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
            .map(|summary| globalize(self.ddp.job().figures(), summary));
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
        let sharded = self.start_sharding(&mut learner, &components);
        let plan = Plan {
            starting_epoch,
            num_epochs: components.num_epochs,
            grad_accumulation: components.grad_accumulation,
            step_leftover: true,
            // A sharded optimizer cannot go on: the lost rank's part is gone.
            go_on: self.ddp.goes_on() && sharded.is_none(),
        };
        let mut epochs = Epochs {
            job: self.ddp.job(),
            learner,
            train: &dataloader_train,
            valid: &dataloader_valid,
            epoch: Progress::new(starting_epoch, components.num_epochs, Some("epochs".into())),
            components,
            items: None,
            progress: None,
            accumulator: GradientsAccumulator::new(),
            grads: None,
            sharded,
        };
        if let Err(err) = self.ddp.job().fit(&mut epochs, plan) {
            self.fail(err);
        }
        if let Some(sharded) = epochs.sharded.take() {
            sharded.finish(&mut epochs.learner);
        }
        // Burn's checkpointer finishes its writes as it is dropped; then the
        // parts of the epochs its strategy removed can go.
        drop(epochs.components.checkpointer.take());
        if self.ddp.is_main() {
            self.ddp.job().prune_parts(None);
        }
        (epochs.learner.model(), epochs.components.event_processor)
    }
}
