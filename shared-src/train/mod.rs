//! The Learner glue both Burns share: [`DdpTraining`] (one rank's part in a
//! Learner run: the job, and the shards it advances), the metric logger that
//! makes the epoch figures global, and the quiet renderers of ranks > 0.
//! Each front-end's `train` module adds its Burn's strategy (the loop is
//! burn-ddp-training's `learner::fit`) and builder call.

pub(crate) mod metrics;
pub(crate) mod quiet;

use crate::shared::config::{BucketConfig, Overlap, ShardConfig};
use crate::shared::contract::{check_whole_checkpoint, DistributedDataset};
use burn::data::dataset::Dataset;
use burn_ddp_comm::{ProcessGroup, Result, SyncStats};
use burn_ddp_sampler::{
    batch_size_per_rank, distributed_sampler, evaluation_sampler, DistributedSampler,
};
use burn_ddp_training::learner::{EpochReport, LearnerJob, ShardChange};
use std::path::Path;
use std::time::Duration;

/// One rank's part in a Learner run: the group, the model's gradient reducer
/// (its own, over that group), the experiment folder and the shards whose
/// epochs the strategy advances. What does not touch Burn (the agreements,
/// the folder, the epoch figures, resuming) is burn-ddp-training's
/// [`LearnerJob`], whose methods it has too.
#[derive(Clone)]
pub struct DdpTraining {
    job: LearnerJob,
    /// Trains with Burn's gradient checkpointing (Burn 0.22's
    /// `with_gradient_checkpointing`; Burn 0.21 chooses it by backend type).
    #[allow(dead_code)] // read by Burn 0.22's strategy only
    pub(crate) gradient_checkpointing: bool,
    /// Shards the Learner's optimizer state across the ranks (ZeRO stage 1).
    pub(crate) sharded: Option<ShardConfig>,
    /// Goes on without a rank that is gone ([`with_recovery`](Self::with_recovery)).
    pub(crate) recovery: bool,
    /// When buckets may leave during backward ([`with_overlap_backward`](Self::with_overlap_backward)).
    #[allow(dead_code)] // read by Burn 0.21's strategy only
    pub(crate) overlap: Overlap,
}

impl DdpTraining {
    /// For `group` (usually the one `init_process_group` returned; any group
    /// will do, gradients are averaged over it) and the experiment folder
    /// given to `SupervisedTraining::new`. Buckets are PyTorch's defaults;
    /// see [`with_buckets`](Self::with_buckets).
    pub fn new(group: &ProcessGroup, directory: impl AsRef<Path>) -> Self {
        let mut job = LearnerJob::new(group, directory);
        // The default group's next generation stays the session's default.
        if crate::shared::session::default_group().is_some_and(|default| default.is_same(group)) {
            job = job.with_reform(crate::shared::session::reform_process_group);
        }
        Self {
            job,
            gradient_checkpointing: false,
            sharded: None,
            recovery: false,
            overlap: Overlap::AcrossMachines,
        }
    }

    /// When each step's gradient buckets may leave during backward, as
    /// [`DdpConfig::overlap_backward`](crate::config::DdpConfig) says for a
    /// wrapped model (by default when the ranks span machines;
    /// `BURN_DDP_OVERLAP` decides that default). Burn 0.21 with the `Ddp<B>`
    /// backend, on the host path, without gradient accumulation or a sharded
    /// optimizer; otherwise, as on Burn 0.22, the buckets leave after
    /// backward. The averages are the same, bit for bit; the step's
    /// `TrainOutput` then carries them (as PyTorch's DDP step sees averaged
    /// gradients after `backward()`), where otherwise the strategy averages
    /// what the step returns. Every rank must decide the same: the first
    /// step stops every rank, naming the setting, if they do not.
    pub fn with_overlap_backward(self, overlap: Overlap) -> Self {
        Self { overlap, ..self }
    }

    /// Under `burn-ddp-run --on-failure continue`, a rank that is gone
    /// (killed, stalled past the timeout, cut off) costs the step it broke,
    /// not the run: the others form the group's next generation in their
    /// own processes, drop that step, finish the epoch on their own shards
    /// (the lost rank's rest of the epoch is not trained on) and deal the
    /// next epochs over themselves; rank 0 keeps writing the one set of
    /// checkpoints. Without the launcher's `continue` it changes nothing.
    /// Not with a sharded optimizer (the lost rank's part of the state is
    /// gone: the run stops, and `--max-restarts` resumes it from the last
    /// checkpoint).
    pub fn with_recovery(self) -> Self {
        Self {
            recovery: true,
            ..self
        }
    }

    /// Whether the run goes on without ranks that are gone: the option and
    /// the launcher's `--on-failure continue`.
    pub(crate) fn goes_on(&self) -> bool {
        self.recovery && burn_ddp_training::recovery::goes_on_after_failure()
    }

    /// Shards the Learner's optimizer state across the ranks (ZeRO stage 1,
    /// PyTorch's `ZeroRedundancyOptimizer`): each rank's optimizer keeps
    /// state for and steps only the parameters it owns (about 1/N of them,
    /// balanced by size), and the updated parameters are shared; the
    /// gradients are reduce-scattered instead of all-reduced, the same bytes
    /// in all. The Learner is built as usual, with any Burn optimizer.
    /// Checkpoints keep it sharded: each rank saves its part into
    /// `checkpoint/optim-parts-N` beside Burn's files, and a run resumes
    /// from them on any number of ranks, sharded or not, each rank reading
    /// only what it keeps. That needs one folder every rank sees; where
    /// each rank has its own, the state is gathered whole on rank 0 for
    /// Burn's checkpointer instead (rank 0's log says so).
    pub fn with_sharded_optimizer(self, config: ShardConfig) -> Self {
        Self {
            sharded: Some(config),
            ..self
        }
    }

    /// The job: the agreements, the folder, the figures, resuming.
    pub(crate) fn job(&self) -> &LearnerJob {
        &self.job
    }

    /// The group gradients are averaged over (its latest generation).
    pub fn group(&self) -> ProcessGroup {
        self.job.group()
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.job.rank()
    }

    /// Whether this is rank 0, the rank that writes files and reports.
    pub fn is_main(&self) -> bool {
        self.job.is_main()
    }

    /// The experiment folder.
    pub fn directory(&self) -> &Path {
        self.job.directory()
    }

    /// What averaging the model's gradients has cost so far.
    pub fn sync_stats(&self) -> SyncStats {
        self.job.sync_stats()
    }

    /// Creates the experiment folder (and its parents) on rank 0, keeping
    /// what it holds (a resume's checkpoints); every rank returns once it
    /// exists. Call it instead of `create_dir_all` on every rank. Collective.
    pub fn create_artifact_dir(&self) -> Result<()> {
        self.job.create_artifact_dir()
    }

    /// Empties the experiment folder on rank 0, as Burn's examples do at the
    /// start of a fresh run (`remove_dir_all` then `create_dir_all`); every
    /// rank returns once it is there and empty. Collective.
    pub fn recreate_artifact_dir(&self) -> Result<()> {
        self.job.recreate_artifact_dir()
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
    pub fn with_buckets(self, buckets: BucketConfig) -> Self {
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

    /// This rank's shard of a training set: PyTorch's `DistributedSampler`
    /// (shuffled with seed 0, padded to equal lengths), advanced every epoch.
    pub fn shard<D: Dataset<I>, I>(&self, dataset: D) -> Result<DistributedDataset<D, I>> {
        let sampler = distributed_sampler(&self.group(), dataset.len())?;
        Ok(self.shard_with(dataset, sampler))
    }

    /// This rank's shard of an evaluation set: every item on exactly one rank,
    /// unshuffled, so summed figures are exact.
    pub fn shard_eval<D: Dataset<I>, I>(&self, dataset: D) -> Result<DistributedDataset<D, I>> {
        let sampler = evaluation_sampler(&self.group(), dataset.len())?;
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
        self.job.register_shard(move |change| match change {
            ShardChange::Epoch(epoch) => epochs.set_epoch(epoch),
            ShardChange::Regroup { num_replicas, rank } => epochs
                .regroup_from_next_epoch(num_replicas, rank)
                .expect("a rank of its world"),
        });
        shard
    }

    /// The newest epoch whose checkpoint in `<directory>/checkpoint` is
    /// complete (model, optimizer and scheduler, and the optimizer state in
    /// parts where a sharded run saved it so) and whole, for every rank
    /// alike (rank 0 decides, every rank must have it): give it to
    /// `SupervisedTraining::checkpoint` to go on after a restart
    /// (`burn-ddp-run --max-restarts`). A damaged newest one is skipped with
    /// a warning naming the file; `None` when there is none (start afresh);
    /// an error when every one is damaged. Collective: every rank calls it,
    /// before `SupervisedTraining::launch`.
    pub fn latest_checkpoint(&self) -> Result<Option<usize>> {
        self.job.latest_checkpoint(check_whole_checkpoint)
    }

    /// Every rank has `epoch`'s checkpoint in `<directory>/checkpoint`,
    /// complete and whole, or every rank fails naming the ranks that do not
    /// (their folder, what is missing or damaged). Collective: call it
    /// before `SupervisedTraining::checkpoint(epoch)` when you choose the
    /// epoch yourself; [`latest_checkpoint`](Self::latest_checkpoint) does.
    pub fn verify_checkpoint(&self, epoch: usize) -> Result<()> {
        self.job.verify_checkpoint(epoch, check_whole_checkpoint)
    }

    /// Each rank's loader batch size for `global_batch` items per optimizer
    /// step: every rank's loader takes its own batch, so `.batch_size(64)` on 2
    /// ranks trains with 128. A global batch the world size does not divide is
    /// an error naming the nearest multiples.
    pub fn batch_size_per_rank(&self, global_batch: usize) -> Result<usize> {
        batch_size_per_rank(&self.group(), global_batch)
    }
}
