//! Burn's Learner on several processes, the part that does not touch Burn:
//! what one rank of a Learner run knows ([`LearnerJob`]: its group, the
//! model's reducer, the experiment folder, the shards whose epochs advance),
//! the agreements the ranks reach at every iteration and epoch
//! ([`agreement`]), the experiment folder prepared once ([`LearnerJob::create_artifact_dir`]),
//! epoch figures summed over the ranks ([`figures`]) and the newest whole
//! checkpoint ([`LearnerJob::latest_checkpoint`]), with a sharded run's
//! optimizer state in parts ([`LearnerJob::parts_folder`]).
//!
//! The epoch loop itself is written once ([`LearnerJob::fit`]); each Burn
//! front-end's strategy drives it through [`Learning`] with its Burn
//! version's Learner, and the Burn types (metrics, events, records) stay on
//! its side.

pub mod agreement;
mod artifacts;
mod checkpoints;
pub mod fit;
mod parts;

pub use checkpoints::CHECKPOINT_NAMES;
pub use parts::PARTS_PREFIX;
pub mod figures;

pub use agreement::{AfterEpoch, NextIteration};
pub use figures::{EpochFigures, GlobalMetric, Split, GLOBAL_METRICS_FILE};
pub use fit::{FitError, Learning, Plan};

use burn_ddp_comm::{BucketConfig, ProcessGroup, Reducer, Result, SyncStats};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What happens to a shard as the run goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardChange {
    /// The next pass is the sampler's (0-based) epoch.
    Epoch(usize),
    /// The ranks that are gone were gone on from: from the next epoch on,
    /// this rank is `rank` of `num_replicas` (the epoch under way keeps its
    /// items: its loader is iterating them).
    Regroup {
        /// Ranks in the new world.
        num_replicas: usize,
        /// This rank's place in it.
        rank: usize,
    },
}

/// Applies a [`ShardChange`] to one shard.
type ShardSetter = Box<dyn Fn(ShardChange) + Send>;

/// Called on rank 0 with each epoch's figures.
type EpochCallback = dyn Fn(&EpochReport) + Send + Sync;

/// Forms the next generation of the job's group after a failure (the
/// front-end's session, where the group is its default one).
type Reform = dyn Fn(Duration) -> Result<ProcessGroup> + Send + Sync;

/// One rank's part in a Learner run: the group, the model's gradient reducer
/// (its own, over that group), the experiment folder, the shards whose epochs
/// the strategy advances and the epoch figures. Cloning shares all of it.
#[derive(Clone)]
pub struct LearnerJob {
    /// The group, replaced by its next generation when the run goes on
    /// without a rank that is gone ([`fit`](Self::fit) with `Plan::go_on`).
    group: Arc<Mutex<ProcessGroup>>,
    reducer: Arc<Mutex<Reducer>>,
    directory: PathBuf,
    shards: Arc<Mutex<Vec<ShardSetter>>>,
    figures: Arc<EpochFigures>,
    metrics_wait: Duration,
    on_epoch_end: Option<Arc<EpochCallback>>,
    reform: Option<Arc<Reform>>,
}

/// What rank 0 knows at the end of an epoch, for `on_epoch_end`.
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

impl EpochReport {
    /// The value of metric `name` (`Loss`, `Accuracy`, ...) for `split`, if
    /// the run has it.
    pub fn value(&self, split: Split, name: &str) -> Option<f64> {
        self.figures
            .iter()
            .find(|figure| figure.split == split.name() && figure.name == name)
            .map(|figure| figure.value)
    }
}

impl LearnerJob {
    /// For `group` and the experiment folder given to Burn's
    /// `SupervisedTraining::new`; buckets are PyTorch's defaults.
    pub fn new(group: &ProcessGroup, directory: impl AsRef<Path>) -> Self {
        Self {
            group: Arc::new(Mutex::new(group.clone())),
            reducer: Arc::new(Mutex::new(Reducer::new(group, BucketConfig::default()))),
            directory: directory.as_ref().to_path_buf(),
            shards: Arc::default(),
            figures: Arc::default(),
            metrics_wait: Duration::from_secs(120),
            on_epoch_end: None,
            reform: None,
        }
    }

    /// Forms the group's next generation with `reform` when the run goes on
    /// without ranks that are gone (a front-end's `reform_process_group`,
    /// so its default group follows), instead of `ProcessGroup::reform`.
    pub fn with_reform(
        mut self,
        reform: impl Fn(Duration) -> Result<ProcessGroup> + Send + Sync + 'static,
    ) -> Self {
        self.reform = Some(Arc::new(reform));
        self
    }

    /// Calls `report` on rank 0 after each epoch's figures are summed.
    pub fn on_epoch_end(mut self, report: impl Fn(&EpochReport) + Send + Sync + 'static) -> Self {
        self.on_epoch_end = Some(Arc::new(report));
        self
    }

    /// Gradient buckets of other sizes than PyTorch's defaults.
    pub fn with_buckets(self, buckets: BucketConfig) -> Self {
        self.reducer.lock().unwrap().set_config(buckets);
        self
    }

    /// How long the end of an epoch waits for this rank's metric threads to
    /// catch up before its figures are summed (default 120 s).
    pub fn with_metrics_wait(mut self, wait: Duration) -> Self {
        self.metrics_wait = wait;
        self
    }

    /// What averaging the model's gradients has cost so far.
    pub fn sync_stats(&self) -> SyncStats {
        self.reducer.lock().unwrap().stats()
    }

    /// The model's reducer, for the strategy's gradient average (the same
    /// one for the whole run: a reformed group's replaces its content).
    pub fn reducer(&self) -> &Arc<Mutex<Reducer>> {
        &self.reducer
    }

    /// The group (its latest generation).
    pub fn group(&self) -> ProcessGroup {
        self.group.lock().unwrap().clone()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.group().rank()
    }

    /// Whether this is rank 0, the rank that writes files and reports.
    pub fn is_main(&self) -> bool {
        self.rank() == 0
    }

    /// The experiment folder.
    pub fn directory(&self) -> &Path {
        &self.directory
    }

    /// The epoch figures (filled by the front-end's metric logger).
    pub fn figures(&self) -> &Arc<EpochFigures> {
        &self.figures
    }

    /// Registers a shard: `change` is called with the sampler's 0-based
    /// epoch before each of Burn's (1-based) epochs, and with its new place
    /// when the run goes on without ranks that are gone.
    pub fn register_shard(&self, change: impl Fn(ShardChange) + Send + 'static) {
        self.shards.lock().unwrap().push(Box::new(change));
    }

    /// Sets every registered shard to Burn's 1-based `epoch` (the sampler
    /// sees `epoch - 1`, as a PyTorch loop calls `set_epoch(0)` first).
    pub fn set_epoch(&self, epoch: usize) {
        self.change_shards(ShardChange::Epoch(epoch.saturating_sub(1)));
    }

    fn change_shards(&self, change: ShardChange) {
        for shard in self.shards.lock().unwrap().iter() {
            shard(change);
        }
    }

    /// After a collective failed because ranks are gone: the group's next
    /// generation among the ranks still there (waiting for each other up to
    /// the group's timeout), a reducer over it, and the shards dealt over it
    /// from the next epoch. Collective among the survivors.
    pub(crate) fn go_on_without_the_lost(&self) -> Result<()> {
        let group = self.group();
        let next = match &self.reform {
            Some(reform) => reform(group.timeout())?,
            None => group.reform(group.timeout())?,
        };
        let config = self.reducer.lock().unwrap().config();
        *self.reducer.lock().unwrap() = Reducer::new(&next, config);
        self.change_shards(ShardChange::Regroup {
            num_replicas: next.world_size(),
            rank: next.rank(),
        });
        *self.group.lock().unwrap() = next;
        Ok(())
    }

    /// Sums this rank's figures of `epoch` with every other rank's (a
    /// collective), appends them to [`GLOBAL_METRICS_FILE`] on rank 0 and
    /// gives rank 0's `on_epoch_end` its report.
    pub fn end_epoch(
        &self,
        epoch: usize,
        num_epochs: usize,
        train_time: Duration,
        valid_time: Duration,
    ) -> Result<Vec<GlobalMetric>> {
        let figures =
            self.figures
                .reduce_epoch(&self.group(), epoch, self.metrics_wait, &self.directory)?;
        if let (true, Some(report)) = (self.is_main(), &self.on_epoch_end) {
            report(&EpochReport {
                epoch,
                num_epochs,
                figures: figures.clone(),
                train_time,
                valid_time,
            });
        }
        Ok(figures)
    }
}
