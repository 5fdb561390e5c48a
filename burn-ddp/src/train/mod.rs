//! Burn's Learner on several processes (feature `train`).
//!
//! A single-process `SupervisedTraining` program becomes a DDP program with a
//! handful of lines: join the group, shard the datasets through a
//! [`DdpTraining`] handle, and call [`DdpSupervisedTraining::ddp`] last on the
//! builder.
//!
//! ```no_run
//! use burn::data::dataset::{Dataset, InMemDataset};
//! # use burn::backend::{Autodiff, NdArray};
//! use burn_ddp::train::{DdpSupervisedTraining, DdpTraining};
//! # fn program(train: InMemDataset<f32>, test: InMemDataset<f32>) -> burn_ddp::Result<()> {
//! let group = burn_ddp::init_process_group()?;              // + RANK, WORLD_SIZE, ...
//! let ddp = DdpTraining::new(&group, "/tmp/artifacts");     // + the experiment folder
//! let train = ddp.shard(train)?;                            // + this rank's shard, reshuffled each epoch
//! let test = ddp.shard_eval(test)?;                         // + each item on exactly one rank
//! // ... DataLoaderBuilder::new(batcher).batch_size(64).build(train) as before, without .shuffle():
//! // the sampler shuffles, identically on every rank.
//! // SupervisedTraining::new(dir, loader_train, loader_valid)
//! //     .metrics((AccuracyMetric::new(), LossMetric::new()))
//! //     .num_epochs(10)
//! //     .ddp(&ddp)                                         // + last
//! //     .launch(Learner::new(model, optim, lr));
//! burn_ddp::destroy_process_group()?;
//! # Ok(())
//! # }
//! ```
//!
//! What each rank does, and why:
//! - **Data**: every shard registered here gets its epoch set before each epoch
//!   (Burn's epochs are 1-based; the sampler sees `epoch - 1`, as a PyTorch loop
//!   calls `set_epoch(0)` first), so a resumed run sees exactly the order an
//!   uninterrupted one would.
//! - **Gradients**: every backward pass runs under [`no_sync`](crate::no_sync);
//!   the strategy averages once per optimizer step with
//!   [`sync_gradients`](crate::sync::sync_gradients), walking the model. Gradient
//!   accumulation therefore communicates once per `k` micro-batches, and which
//!   parameter tensors happen to be alive (rank 0's asynchronous checkpointer
//!   holds clones of old ones) cannot change what is reduced. Works with
//!   `Ddp<Autodiff<B>>` and with a plain `Autodiff<B>`. On `Ddp<B>` the
//!   step's backward pass still sends the leading buckets as their
//!   gradients become final (by default when the ranks span machines; see
//!   [`DdpTraining::with_overlap_backward`]) and ends the average there
//!   (all of it where no bucket can leave early), so the step returns
//!   averaged gradients, as a PyTorch DDP step sees them.
//! - **Agreement**: the ranks vote at every training iteration, so an interrupt
//!   on any rank stops all of them at the same iteration and a rank whose loader
//!   ran out early is an error on every rank (the loaders' lengths are compared
//!   before each epoch too). Early stopping is decided by rank 0 and broadcast.
//! - **Files**: rank 0 writes what a single-process Learner writes; the other
//!   ranks write nothing and print only errors (no renderer, no experiment log,
//!   no metric files, no checkpoints) but load checkpoints themselves, onto
//!   their own device.
//! - **Metrics**: at the end of each epoch every rank's numeric metrics are
//!   summed over the ranks; rank 0's epoch figures (the `global-metrics.csv`
//!   file, its log line, early stopping, best-checkpoint choice) are global.
//!   Per-iteration files and the live display stay rank 0's own batches.
//!
//! Burn's own `ExecutionStrategy::ddp` (feature `distributed`) is one process
//! with a thread per GPU and cannot be combined with `Ddp<B>`; Burn's
//! `MultiDevice` with `Ddp<B>` would run several backward passes in one
//! process. Use this strategy (or `SingleDevice` in a world of one).

pub(crate) mod checkpoints;
mod quiet;
mod sharded;
mod strategy;

pub use crate::shared::train::quiet::{NeverCheckpoint, SilentRenderer, SummaryRenderer};
pub use crate::shared::train::DdpTraining;
pub use burn_ddp_training::learner::{EpochReport, GlobalMetric, LearnerJob, GLOBAL_METRICS_FILE};
pub use strategy::DdpLearningStrategy;

use crate::shared::train::metrics::GlobalMetricLogger;
use burn::train::{LearningComponentsTypes, SupervisedTraining, TrainingStrategy};
use std::sync::Arc;

/// Installs burn-ddp's strategy on a `SupervisedTraining` builder.
pub trait DdpSupervisedTraining: Sized {
    /// Trains with [`DdpLearningStrategy`] and, on every rank but 0, silences the
    /// renderer, the experiment log, the metric files and checkpoint saving.
    /// Call it last: a later `.renderer(...)` or `.with_checkpointing_strategy(...)`
    /// would apply to every rank.
    fn ddp(self, ddp: &DdpTraining) -> Self;
}

impl<LC> DdpSupervisedTraining for SupervisedTraining<LC>
where
    LC: LearningComponentsTypes + Send + 'static,
{
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
                .renderer(SilentRenderer)
                .with_application_logger(None)
                .with_checkpointing_strategy(NeverCheckpoint)
        }
    }
}
