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
//!   [`sync_gradients`](crate::sync_gradients), walking the model. Gradient
//!   accumulation therefore communicates once per `k` micro-batches, and which
//!   parameter tensors happen to be alive (rank 0's asynchronous checkpointer
//!   holds clones of old ones) cannot change what is reduced. Works with
//!   `Ddp<Autodiff<B>>` and with a plain `Autodiff<B>`.
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

mod checkpoints;
mod metrics;
mod quiet;
mod strategy;

pub use metrics::{GlobalMetric, GLOBAL_METRICS_FILE};
pub use quiet::{NeverCheckpoint, SilentRenderer};
pub use strategy::DdpLearningStrategy;

use crate::data::{DistributedDataset, DistributedSampler, EpochHandle};
use crate::{BucketConfig, ProcessGroup, Reducer, Result};
use burn::data::dataset::Dataset;
use burn::train::{LearningComponentsTypes, SupervisedTraining, TrainingStrategy};
use metrics::{GlobalMetricLogger, MetricTotals};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One rank's part in a Learner run: the group, the model's gradient reducer
/// (its own, over that group), the experiment folder and the shards whose
/// epochs the strategy advances.
#[derive(Clone)]
pub struct DdpTraining {
    group: ProcessGroup,
    reducer: Arc<Mutex<Reducer>>,
    directory: PathBuf,
    shards: Arc<Mutex<Vec<EpochHandle>>>,
    totals: Arc<MetricTotals>,
    metrics_wait: Duration,
    on_epoch_end: Option<Arc<EpochCallback>>,
}

type EpochCallback = dyn Fn(&EpochReport) + Send + Sync;

/// What rank 0 knows at the end of an epoch, for [`DdpTraining::on_epoch_end`].
#[derive(Debug, Clone)]
pub struct EpochReport {
    /// Burn's 1-based epoch.
    pub epoch: usize,
    /// Epochs in the run.
    pub num_epochs: usize,
    /// Every numeric metric of both splits, summed over the ranks.
    pub figures: Vec<GlobalMetric>,
    /// Wall time of the training part of the epoch (all ranks move together).
    pub train_time: Duration,
    /// Wall time of the validation part.
    pub valid_time: Duration,
}

impl DdpTraining {
    /// For `group` (usually the one [`init_process_group`](crate::init_process_group)
    /// returned; any group will do, gradients are averaged over it) and the
    /// experiment folder given to `SupervisedTraining::new`. Buckets are
    /// PyTorch's defaults; see [`with_buckets`](Self::with_buckets).
    pub fn new(group: &ProcessGroup, directory: impl AsRef<Path>) -> Self {
        Self {
            group: group.clone(),
            reducer: Arc::new(Mutex::new(Reducer::new(group, BucketConfig::new()))),
            directory: directory.as_ref().to_path_buf(),
            shards: Arc::default(),
            totals: Arc::default(),
            metrics_wait: Duration::from_secs(120),
            on_epoch_end: None,
        }
    }

    /// Calls `report` on rank 0 after each epoch's figures are summed (to print
    /// one line per epoch, feed a dashboard, ...).
    pub fn on_epoch_end(mut self, report: impl Fn(&EpochReport) + Send + Sync + 'static) -> Self {
        self.on_epoch_end = Some(Arc::new(report));
        self
    }

    /// Gradient buckets of other sizes than PyTorch's defaults.
    pub fn with_buckets(self, buckets: BucketConfig) -> Self {
        self.reducer.lock().unwrap().set_config(buckets);
        self
    }

    /// What averaging the model's gradients has cost so far.
    pub fn sync_stats(&self) -> crate::SyncStats {
        self.reducer.lock().unwrap().stats()
    }

    /// How long the end of an epoch waits for this rank's metric threads to
    /// catch up before its figures are summed (default 120 s).
    pub fn with_metrics_wait(mut self, wait: Duration) -> Self {
        self.metrics_wait = wait;
        self
    }

    /// This rank's shard of a training set: PyTorch's `DistributedSampler`
    /// (shuffled with seed 0, padded to equal lengths), advanced every epoch.
    pub fn shard<D: Dataset<I>, I>(&self, dataset: D) -> Result<DistributedDataset<D, I>> {
        let sampler = crate::distributed_sampler(&self.group, dataset.len())?;
        Ok(self.shard_with(dataset, sampler))
    }

    /// This rank's shard of an evaluation set: every item on exactly one rank,
    /// unshuffled, so summed figures are exact.
    pub fn shard_eval<D: Dataset<I>, I>(&self, dataset: D) -> Result<DistributedDataset<D, I>> {
        let sampler = crate::evaluation_sampler(&self.group, dataset.len())?;
        Ok(self.shard_with(dataset, sampler))
    }

    /// A shard with a sampler of your own (another seed, `drop_last`, no shuffle).
    pub fn shard_with<D: Dataset<I>, I>(
        &self,
        dataset: D,
        sampler: DistributedSampler,
    ) -> DistributedDataset<D, I> {
        let shard = DistributedDataset::new(dataset, sampler);
        self.shards.lock().unwrap().push(shard.epoch_handle());
        shard
    }

    /// Each rank's loader batch size for `global_batch` items per optimizer
    /// step: every rank's loader takes its own batch, so `.batch_size(64)` on 2
    /// ranks trains with 128. A global batch the world size does not divide is
    /// an error naming the nearest multiples.
    pub fn batch_size_per_rank(&self, global_batch: usize) -> Result<usize> {
        crate::batch_size_per_rank(&self.group, global_batch)
    }

    /// Creates the experiment folder (and its parents) on rank 0, keeping what
    /// it holds (a resume's checkpoints); every rank returns once it exists.
    /// Call it instead of `create_dir_all` on every rank.
    pub fn create_artifact_dir(&self) -> Result<()> {
        self.prepare_artifact_dir(false)
    }

    /// Empties the experiment folder on rank 0, as Burn's examples do at the
    /// start of a fresh run (`remove_dir_all` then `create_dir_all`); every
    /// rank returns once it is there and empty. On every rank, the same two
    /// calls would race: a late rank would delete files rank 0 had started.
    pub fn recreate_artifact_dir(&self) -> Result<()> {
        self.prepare_artifact_dir(true)
    }

    /// Rank 0 prepares the folder; its outcome reaches every rank, so a
    /// failure there is an error everywhere instead of a wait in the barrier.
    fn prepare_artifact_dir(&self, empty_first: bool) -> Result<()> {
        let rank = self.group.rank();
        let mut failed = [0i64];
        let mut problem = None;
        if rank == 0 {
            let prepare = || -> std::io::Result<()> {
                if empty_first && self.directory.exists() {
                    std::fs::remove_dir_all(&self.directory)?;
                }
                std::fs::create_dir_all(&self.directory)
            };
            if let Err(err) = prepare() {
                failed[0] = 1;
                problem = Some(err);
            }
        }
        self.group.broadcast(&mut failed, 0)?;
        if failed[0] == 0 {
            return Ok(());
        }
        let message = match problem {
            Some(err) => format!(
                "cannot {} the experiment folder {}: {err}; give DdpTraining a folder this user \
                 can write",
                if empty_first { "recreate" } else { "create" },
                self.directory.display()
            ),
            None => format!(
                "rank 0 could not prepare the experiment folder {}; its error says why",
                self.directory.display()
            ),
        };
        Err(crate::CommError::InvalidArgument { rank, message })
    }

    /// The group.
    pub fn group(&self) -> &ProcessGroup {
        &self.group
    }

    /// Whether this is rank 0, the rank that writes files and reports.
    pub fn is_main(&self) -> bool {
        self.group.rank() == 0
    }

    /// The experiment folder.
    pub fn directory(&self) -> &Path {
        &self.directory
    }

    /// Sets every registered shard to Burn's 1-based `epoch`.
    pub(crate) fn set_epoch(&self, epoch: usize) {
        for shard in self.shards.lock().unwrap().iter() {
            shard.set_epoch(epoch.saturating_sub(1));
        }
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

impl<LC> DdpSupervisedTraining for SupervisedTraining<LC>
where
    LC: LearningComponentsTypes + Send + 'static,
{
    fn ddp(self, ddp: &DdpTraining) -> Self {
        let strategy = Arc::new(DdpLearningStrategy::new(ddp.clone()));
        // Registered first, so the store asks it (global figures) before the files.
        let training = self
            .with_training_strategy(TrainingStrategy::Custom(strategy))
            .with_metric_logger(GlobalMetricLogger::new(
                Arc::clone(&ddp.totals),
                &ddp.directory,
            ));
        if ddp.is_main() {
            // Registering any logger replaces Burn's default file logger: put it back.
            training.with_metric_logger(burn::train::logger::FileMetricLogger::new(&ddp.directory))
        } else {
            training
                .renderer(SilentRenderer)
                .with_application_logger(None)
                .with_checkpointing_strategy(NeverCheckpoint)
        }
    }
}
