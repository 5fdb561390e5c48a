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
//! (the agreements, folder, figures and resume are burn-ddp-comm's
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
mod checkpoints;
mod metrics;
mod quiet;
mod strategy;

pub use burn_ddp_training::learner::{EpochReport, GlobalMetric, LearnerJob, GLOBAL_METRICS_FILE};
pub use quiet::{NeverCheckpoint, SilentRenderer, SummaryRenderer};
pub use strategy::DdpLearningStrategy;

use crate::data::DistributedDataset;
use crate::{ProcessGroup, Result};
use burn::data::dataset::Dataset;
use burn::train::{LearnerModel, SupervisedTraining, TrainingStrategy};
use burn_ddp_sampler::DistributedSampler;
use metrics::GlobalMetricLogger;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// One rank's part in a Learner run: the group, the model's gradient reducer
/// (its own, over that group), the experiment folder and the shards whose
/// epochs the strategy advances. What does not touch Burn (the agreements,
/// the folder, the epoch figures, resuming) is burn-ddp-comm's
/// [`LearnerJob`], whose methods it has too.
#[derive(Clone)]
pub struct DdpTraining {
    job: LearnerJob,
    gradient_checkpointing: bool,
}

impl std::ops::Deref for DdpTraining {
    type Target = LearnerJob;

    fn deref(&self) -> &LearnerJob {
        &self.job
    }
}

impl DdpTraining {
    /// For `group` (usually the one [`init_process_group`](crate::init_process_group)
    /// returned; any group will do, gradients are averaged over it) and the
    /// experiment folder given to `SupervisedTraining::new`. Buckets are
    /// PyTorch's defaults; see [`with_buckets`](Self::with_buckets).
    pub fn new(group: &ProcessGroup, directory: impl AsRef<Path>) -> Self {
        Self {
            job: LearnerJob::new(group, directory),
            gradient_checkpointing: false,
        }
    }

    /// Calls `report` on rank 0 after each epoch's figures are summed (to print
    /// one line per epoch, feed a dashboard, ...).
    pub fn on_epoch_end(self, report: impl Fn(&EpochReport) + Send + Sync + 'static) -> Self {
        Self {
            job: self.job.on_epoch_end(report),
            ..self
        }
    }

    /// Gradient buckets of other sizes than PyTorch's defaults
    /// (`BucketConfig::from_mib(rank, cap_mb, first_cap_mb)`).
    pub fn with_buckets(self, buckets: crate::BucketConfig) -> Self {
        Self {
            job: self.job.with_buckets(buckets.into()),
            ..self
        }
    }

    /// How long the end of an epoch waits for this rank's metric threads to
    /// catch up before its figures are summed (default 120 s).
    pub fn with_metrics_wait(self, wait: Duration) -> Self {
        Self {
            job: self.job.with_metrics_wait(wait),
            ..self
        }
    }

    /// Trains with Burn's gradient checkpointing (the builder's
    /// `.gradient_checkpointing()` does not reach a custom strategy in Burn
    /// 0.22).
    pub fn with_gradient_checkpointing(self) -> Self {
        Self {
            gradient_checkpointing: true,
            ..self
        }
    }

    /// This rank's shard of a training set: PyTorch's `DistributedSampler`
    /// (shuffled with seed 0, padded to equal lengths), advanced every epoch.
    pub fn shard<D: Dataset<I>, I>(&self, dataset: D) -> Result<DistributedDataset<D, I>> {
        let sampler = crate::distributed_sampler(self.group(), dataset.len())?;
        Ok(self.shard_with(dataset, sampler))
    }

    /// This rank's shard of an evaluation set: every item on exactly one rank,
    /// unshuffled, so summed figures are exact.
    pub fn shard_eval<D: Dataset<I>, I>(&self, dataset: D) -> Result<DistributedDataset<D, I>> {
        let sampler = crate::evaluation_sampler(self.group(), dataset.len())?;
        Ok(self.shard_with(dataset, sampler))
    }

    /// A shard with a sampler of your own (another seed, `drop_last`, no shuffle).
    pub fn shard_with<D: Dataset<I>, I>(
        &self,
        dataset: D,
        sampler: DistributedSampler,
    ) -> DistributedDataset<D, I> {
        let shard = DistributedDataset::new(dataset, sampler);
        let epochs = shard.epoch_handle();
        self.job
            .register_shard(move |epoch| epochs.set_epoch(epoch));
        shard
    }

    /// Each rank's loader batch size for `global_batch` items per optimizer
    /// step: every rank's loader takes its own batch, so `.batch_size(64)` on 2
    /// ranks trains with 128. A global batch the world size does not divide is
    /// an error naming the nearest multiples.
    pub fn batch_size_per_rank(&self, global_batch: usize) -> Result<usize> {
        crate::batch_size_per_rank(self.group(), global_batch)
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
