//! Burn 0.22's Learner on several processes (feature `train`).
//!
//! A single-process `SupervisedTraining` program becomes a DDP program with a
//! handful of lines: join the group, shard the datasets through a
//! [`DdpTraining`] handle, and call [`DdpSupervisedTraining::ddp`] last on the
//! builder.
//!
//! ```no_run
//! use burn::data::dataset::InMemDataset;
//! use burn_ddp_22::train::{DdpSupervisedTraining, DdpTraining};
//! # fn program(train: InMemDataset<f32>, test: InMemDataset<f32>) -> burn_ddp_22::Result<()> {
//! let group = burn_ddp_22::init_process_group()?;              // + RANK, WORLD_SIZE, ...
//! let ddp = DdpTraining::new(&group, "/tmp/artifacts");        // + the experiment folder
//! let train = ddp.shard(train)?;                               // + this rank's shard, reshuffled each epoch
//! let test = ddp.shard_eval(test)?;                            // + each item on exactly one rank
//! // ... DataLoaderBuilder::new(batcher).batch_size(64).build(train) as before, without .shuffle():
//! // the sampler shuffles, identically on every rank.
//! // SupervisedTraining::new(dir, loader_train, loader_valid)
//! //     .metrics((AccuracyMetric::new(), LossMetric::new()))
//! //     .num_epochs(10)
//! //     .ddp(&ddp)                                            // + last
//! //     .launch(Learner::new(model, optim, lr));
//! burn_ddp_22::destroy_process_group()?;
//! # Ok(())
//! # }
//! ```
//!
//! What each rank does is what burn-ddp's strategy does on Burn 0.21
//! (the loop, agreements, folder, figures and resume are burn-ddp-training's
//! [`LearnerJob`], shared by both): every shard's epoch is set before each
//! epoch; gradients are averaged once per optimizer step (after the
//! micro-batches of `grads_accumulation`); the ranks vote at every iteration,
//! so an interrupt, a Ctrl-C or a loader error on any rank stops all of them
//! at the same iteration; rank 0 alone writes files, renders and checkpoints,
//! every rank loads checkpoints itself; the epoch figures are summed over the
//! ranks.
//!
//! Burn 0.22 differences a program sees: the resume checkpoint is loaded by
//! `SupervisedTraining::launch` itself, before the strategy runs, so check it
//! first with [`LearnerJob::verify_checkpoint`] (or take it from
//! [`DdpTraining::latest_checkpoint`], which does); `gradient_checkpointing()`
//! on the builder is not seen by a custom strategy, use
//! [`DdpTraining::with_gradient_checkpointing`] instead.

mod burn_version;
pub(crate) mod checkpoints;
mod quiet;
mod sharded;
mod strategy;

pub use crate::shared::train::quiet::{NeverCheckpoint, SilentRenderer, SummaryRenderer};
pub use crate::shared::train::DdpTraining;
pub use burn_ddp_training::learner::{EpochReport, GlobalMetric, LearnerJob, GLOBAL_METRICS_FILE};
pub use strategy::DdpLearningStrategy;

use crate::shared::train::metrics::GlobalMetricLogger;
use burn::train::{LearnerModel, SupervisedTraining, TrainingStrategy};
use std::sync::Arc;

impl DdpTraining {
    /// Trains with Burn's gradient checkpointing (the builder's
    /// `.gradient_checkpointing()` does not reach a custom strategy in Burn
    /// 0.22).
    pub fn with_gradient_checkpointing(mut self) -> Self {
        self.gradient_checkpointing = true;
        self
    }
}

/// Installs burn-ddp's strategy on a `SupervisedTraining` builder.
pub trait DdpSupervisedTraining: Sized {
    /// Trains with [`DdpLearningStrategy`] and, on every rank but 0, silences the
    /// renderer, the experiment log, the metric files and checkpoint saving.
    /// Call it last: a later `.renderer(...)` or `.with_checkpointing_strategy(...)`
    /// would apply to every rank.
    fn ddp(self, ddp: &DdpTraining) -> Self;
}

impl<M: LearnerModel> DdpSupervisedTraining for SupervisedTraining<M> {
    fn ddp(self, ddp: &DdpTraining) -> Self {
        let strategy = Arc::new(DdpLearningStrategy::new(ddp.clone()));
        // Registered first, so the store asks it (global figures) before the files.
        let training = self
            .with_training_strategy(TrainingStrategy::Custom(strategy))
            .with_metric_logger(GlobalMetricLogger::new(ddp));
        if ddp.is_main() {
            // Registering any logger replaces Burn's default file logger: put it back.
            training.with_metric_logger(burn::train::logger::FileMetricLogger::new(ddp.directory()))
        } else {
            training
                .renderer(Box::new(SilentRenderer))
                .with_application_logger(None)
                .with_checkpointing_strategy(NeverCheckpoint)
        }
    }
}
