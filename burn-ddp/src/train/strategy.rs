//! The learning strategy: burn-train 0.21's single-device loop, with the
//! ranks kept in step.
//!
//! The epoch loop (the vote per iteration, one gradient average per
//! optimizer step, the after-epoch decision, the closing barrier) is
//! burn-ddp-training's [`LearnerJob::fit`]; this file is burn-train 0.21's
//! side of it. It follows `SingleDeviceTrainingStrategy` of burn-train 0.21
//! (`learner/supervised/strategies/single/`) where one rank is concerned (the
//! scheduler stepped before every iteration, the leftover micro-batches of an
//! epoch dropped), so a world of one trains bitwise as Burn's own strategy
//! does.

use super::sharded::{load_whole_state, ShardedLearning};
use super::DdpTraining;
use crate::config::{Overlap, OVERLAP_VAR};
use crate::overlap::asked::{self, AskGuard, Asked};
use crate::shared::train::metrics::globalize;
use burn::data::dataloader::{DataLoaderIterator, Progress};
use burn::module::{AutodiffModule, Module};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::backend::DeviceOps;
use burn::train::{
    EventProcessorTraining, InferenceStep, Learner, LearnerEvent, LearningComponentsTypes,
    LearningResult, SupervisedLearningStrategy, SupervisedTrainingEventProcessor, TrainLoader,
    TrainStep, TrainingComponents, TrainingItem, TrainingModel, ValidLoader,
};
use burn_ddp_comm::{CollectiveBackend, Placement, ReduceOp};
use burn_ddp_training::learner::{FitError, LearnerJob, Learning, Plan};
use burn_ddp_training::stop;
use std::collections::HashSet;

type InferenceModelOf<LC> = <LC as LearningComponentsTypes>::InferenceModel;
type DeviceOf<LC> = burn::tensor::Device<<LC as LearningComponentsTypes>::Backend>;
type TrainItem<LC> = <<LC as LearningComponentsTypes>::TrainingModel as TrainStep>::Input;
type TrainOutput<LC> = <<LC as LearningComponentsTypes>::TrainingModel as TrainStep>::Output;

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
    /// others: stop this rank with the reason (burn-train's strategies cannot
    /// return errors; the other ranks fail on their next collective).
    fn fail(&self, err: FitError) -> ! {
        burn_ddp_training::failure::panic_with_message(err.message(self.ddp.rank()))
    }

    /// The overlap setting, checked: a bad `BURN_DDP_OVERLAP` stops the
    /// rank, naming it, and ranks that would decide differently stop every
    /// rank (the step's gradients come back averaged with overlap, local
    /// without: a step that edits them, or runs a collective after
    /// backward, would then differ between ranks). Collective.
    fn overlap(&self) -> Overlap {
        let group = self.ddp.group();
        let agreed = self.ddp.overlap.applies_to(&group).and_then(|on| {
            if !group.synchronizes() {
                return Ok(());
            }
            // [on, off] summed: both non-zero when the ranks differ.
            let mut votes = [on.host as i64, !on.host as i64];
            group.all_reduce(&mut votes, ReduceOp::Sum)?;
            if votes[0] == 0 || votes[1] == 0 {
                return Ok(());
            }
            let rank = group.rank();
            Err(burn_ddp_comm::CommError::config(
                Some(rank),
                OVERLAP_VAR,
                format!(
                    "rank {rank}: the ranks differ on sending gradient buckets during backward \
                     ({} with it, {} without; this rank {}): set the same \
                     DdpTraining::with_overlap_backward and {OVERLAP_VAR} on every rank",
                    votes[0],
                    votes[1],
                    if on.host { "with" } else { "without" }
                ),
            ))
        });
        if let Err(error) = agreed {
            self.fail(FitError {
                what: "agreeing on the overlap setting",
                error,
            })
        }
        self.ddp.overlap
    }

    /// Rank 0's parameters everywhere, as `DistributedDataParallel(model)` does.
    fn broadcast_parameters<LC: LearningComponentsTypes>(&self, learner: &mut Learner<LC>) {
        let model = crate::wrap::broadcast_module(learner.model(), &self.ddp.group(), true)
            .unwrap_or_else(|error| {
                self.fail(FitError {
                    what: "broadcasting rank 0's parameters",
                    error,
                })
            });
        learner.load_model(model.into_record());
    }
}

impl DdpLearningStrategy {
    /// With a sharded optimizer, this rank's part of the state, from the
    /// Learner or, resuming from a checkpoint in parts, from those parts;
    /// without, the whole state from those parts where the checkpoint has
    /// them (Burn's `optim-N` of a sharded run holds rank 0's part only).
    fn start_sharding<LC: LearningComponentsTypes>(
        &self,
        learner: &mut Learner<LC>,
        components: &TrainingComponents<LC>,
    ) -> Option<ShardedLearning> {
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

/// One rank's burn-train 0.21 Learner, as the shared loop drives it.
struct Epochs<'a, LC: LearningComponentsTypes> {
    job: &'a LearnerJob,
    learner: Learner<LC>,
    train: &'a TrainLoader<LC>,
    valid: &'a ValidLoader<LC>,
    /// Burn's event processor, checkpointer, interrupter, early stopping...
    components: TrainingComponents<LC>,
    /// The epoch under way, its loader and where it is.
    epoch: Progress,
    items: Option<Box<dyn DataLoaderIterator<TrainItem<LC>> + 'a>>,
    progress: Option<Progress>,
    /// The gradients since the last optimizer step.
    accumulator: GradientsAccumulator<TrainingModel<LC>>,
    grads: Option<GradientsParams>,
    /// With a sharded optimizer: its owners and rounds.
    sharded: Option<ShardedLearning>,
    /// When each step's buckets may leave during its backward pass (read
    /// against the group each step: a reformed one may span other machines).
    overlap: Overlap,
    /// Whether the last step's backward pass averaged its gradients (it
    /// was asked to), or failed to; `None`: the optimizer step averages.
    averaged: Option<crate::Result<()>>,
}

impl<LC: LearningComponentsTypes> Epochs<'_, LC> {
    /// Asks the coming step's backward pass to average the model's
    /// gradients, sending the leading buckets as they become final: with
    /// overlap on, one backward pass per optimizer step (no accumulation),
    /// no sharded optimizer, host gradients, and a group that averages.
    fn ask_for_overlap(&self) -> Option<AskGuard> {
        let group = self.job.group();
        // NCCL refuses host gradients: the average after the step says so,
        // before anything is sent.
        let wanted = self.sharded.is_none()
            && self.components.grad_accumulation.is_none()
            && group.synchronizes()
            && group.device_backend() != CollectiveBackend::Nccl
            && self.overlap.applies_to(&group).is_ok_and(|on| on.host);
        if !wanted {
            return None;
        }
        let model = self.learner.model();
        // An error here comes back from the average after the step, as usual.
        let mut params =
            crate::shared::sync::walked_params(self.job.rank(), crate::shim::grad_walker(&model))
                .ok()
                .filter(|params| !params.is_empty())?;
        if params.iter().any(|p| p.placement != Placement::Host) {
            return None; // the GPU path: after backward (docs/overlap.md)
        }
        // The walk names parameters by Burn's `ParamId`; backward knows
        // their autodiff nodes. None on a backend without `Ddp<B>`'s hooks.
        // A tensor shared by two parameters (tied weights) is one node.
        let nodes = crate::tracking::node_ids(&model).filter(|n| n.len() == params.len())?;
        let distinct: HashSet<u64> = nodes.iter().copied().collect();
        if distinct.len() != nodes.len() {
            return None;
        }
        params
            .iter_mut()
            .zip(nodes)
            .for_each(|(p, node)| p.id = node);
        let reducer = self.job.reducer().clone();
        // The step numbers its parameters' first uses from the start.
        crate::overlap::forward::discard_unfinished();
        Some(asked::ask(Asked { reducer, params }))
    }

    /// Whether the step's backward pass averaged its gradients.
    fn answered(&self, guard: AskGuard) -> Option<crate::Result<()>> {
        let answer = guard.answer()?;
        let averaged = answer.averaged?;
        if averaged.is_ok() && answer.passes > 1 {
            let rank = self.job.rank();
            return Some(Err(burn_ddp_comm::CommError::config(
                Some(rank),
                "overlap_backward",
                format!(
                    "rank {rank}: the training step ran backward() {} times; the first one \
                     averaged its gradients across the ranks, the others did not. Use \
                     DdpTraining::with_overlap_backward(Overlap::Never) for such a step",
                    answer.passes
                ),
            )));
        }
        Some(averaged)
    }
}

impl<'a, LC: LearningComponentsTypes> Learning for Epochs<'a, LC> {
    type Item = TrainItem<LC>;
    type Output = TrainOutput<LC>;

    fn start_training(&mut self, epoch: usize) -> usize {
        self.epoch = Progress::new(epoch, self.components.num_epochs);
        self.items = Some(self.train.iter());
        self.train.num_items()
    }

    fn next_item(&mut self) -> Option<Self::Item> {
        let items = self.items.as_mut()?;
        let item = items.next();
        self.progress = Some(items.progress());
        item
    }

    fn train_step(&mut self, item: Self::Item) -> Self::Output {
        // burn-train 0.21 steps the scheduler before every iteration.
        self.learner.lr_step();
        // A backward pass under no_sync: local gradients, averaged once per
        // optimizer step; with overlap, the backward pass averages them
        // itself, as it was asked.
        let asked = self.ask_for_overlap();
        let output = {
            let _local = crate::no_sync();
            self.learner.train_step(item)
        };
        self.averaged = asked.and_then(|guard| self.answered(guard));
        match self.components.grad_accumulation {
            Some(_) => self
                .accumulator
                .accumulate(&self.learner.model(), output.grads),
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
        let grads = match self.averaged.take() {
            Some(averaged) => averaged.map(|()| grads)?,
            None => {
                let model = self.learner.model();
                let (reducer, group) = (self.job.reducer(), &self.job.group());
                crate::sync::sync_module(reducer, group, &model, grads)?
            }
        };
        self.learner.optimizer_step(grads);
        Ok(())
    }

    fn report(&mut self, output: Self::Output, iteration: usize) {
        let progress = self.progress.clone().expect("an item's progress");
        let item = TrainingItem::new(
            output,
            progress,
            self.epoch.clone(),
            Some(iteration),
            Some(self.learner.lr_current()),
        );
        self.components
            .event_processor
            .process_train(LearnerEvent::ProcessedItem(item));
    }

    fn end_training(&mut self, epoch: usize, _completed: bool) {
        self.items = None;
        self.components
            .event_processor
            .process_train(LearnerEvent::EndEpoch(epoch));
    }

    fn validate(&mut self, epoch: usize) {
        log::info!("Executing validation step for epoch {epoch}");
        let model = self.learner.model().valid();
        let mut iterator = self.valid.iter();
        let mut iteration = 0;
        while let Some(item) = iterator.next() {
            if let Some(signal) = stop::stop_signal() {
                // Ctrl-C during validation: this rank's figures end here; the
                // ranks agree to stop at the end of the epoch.
                let reason = format!("{} received", stop::signal_name(signal));
                self.components.interrupter.stop(Some(&reason));
                break;
            }
            let progress = iterator.progress();
            iteration += 1;
            let item = model.step(item);
            let item = TrainingItem::new(item, progress, self.epoch.clone(), Some(iteration), None);
            self.components
                .event_processor
                .process_valid(LearnerEvent::ProcessedItem(item));
        }
        self.components
            .event_processor
            .process_valid(LearnerEvent::EndEpoch(epoch));
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
                let saved = sharded.save_parts(&self.learner, store, &dir, epoch);
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
        self.components.interrupter.get_message()
    }

    fn interrupt(&self, reason: &str) {
        self.components.interrupter.stop(Some(reason));
    }
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
                    self.ddp.verify_checkpoint(epoch).unwrap_or_else(|error| {
                        self.fail(FitError {
                            what: "checking the checkpoint",
                            error,
                        })
                    });
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
            .job()
            .figures()
            .start_at(starting_epoch, self.ddp.directory(), self.ddp.is_main());
        let summary = components.summary.clone().filter(|_| self.ddp.is_main());
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
            .map(|summary| globalize(self.ddp.job().figures(), summary));
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
        let sharded = self.start_sharding(&mut learner, &components);
        let plan = Plan {
            starting_epoch,
            num_epochs: components.num_epochs,
            grad_accumulation: components.grad_accumulation,
            step_leftover: false,
            // A sharded optimizer cannot go on: the lost rank's part is gone.
            go_on: self.ddp.goes_on() && sharded.is_none(),
        };
        let mut epochs = Epochs {
            job: self.ddp.job(),
            learner,
            train: &dataloader_train,
            valid: &dataloader_valid,
            epoch: Progress::new(starting_epoch, components.num_epochs),
            components,
            items: None,
            progress: None,
            accumulator: GradientsAccumulator::new(),
            grads: None,
            sharded,
            overlap: self.overlap(),
            averaged: None,
        };
        if let Err(err) = self.ddp.job().fit(&mut epochs, plan) {
            self.fail(err);
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
