//! The toy trainer (the PyTorch DDP tutorial's ToyModel script), written once for
//! both Burn versions: its command line, saved hyper-parameters, data and
//! training loop. What a Burn version spells its own way (the model, the
//! loader, the training step, checkpoints) is its program's [`ToyTraining`]
//! (examples/toy on Burn 0.21, examples-22/toy on 0.22).

use crate::cli::{positive, BackendChoice};
use crate::stopped::Stopped;
use crate::training::{self, BurnVersion, Training};
use crate::{fail, IndexOutOfRange};
use burn_ddp_comm::{ProcessGroup, ReduceOp};
use burn_ddp_sampler::{DistributedSampler, EpochHandle};
use clap::Parser;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

/// What the toy trainer's programs differ in on the command line.
pub trait ToyProgram {
    /// `--backend`'s default (a [`BackendChoice`] value: `ndarray` on Burn
    /// 0.21, `flex` on Burn 0.22, which has no NdArray).
    const DEFAULT_BACKEND: &'static str;
}

/// `--backend ndarray` by default: the Burn 0.21 program.
#[derive(Clone, Debug)]
pub struct NdArrayByDefault;

impl ToyProgram for NdArrayByDefault {
    const DEFAULT_BACKEND: &'static str = "ndarray";
}

/// `--backend flex` by default: the Burn 0.22 program (Burn 0.22 has no NdArray).
#[derive(Clone, Debug)]
pub struct FlexByDefault;

impl ToyProgram for FlexByDefault {
    const DEFAULT_BACKEND: &'static str = "flex";
}

/// The trainer's command line: the tutorial's argparse flags (dashes or
/// underscores); `P` says the program's `--backend` default.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "toy",
    version,
    about = "DDP training of the tutorial's ToyModel (Linear 10 -> 1)."
)]
pub struct ToyArgs<P: ToyProgram> {
    /// Training epochs.
    #[arg(long, default_value_t = 5)]
    pub epochs: usize,
    /// Batch size per process.
    #[arg(long = "batch-size", visible_alias = "batch_size", default_value_t = 64,
          value_parser = positive)]
    pub batch_size: usize,
    /// Batch size of one optimizer step over all processes, split evenly over
    /// them instead of --batch-size (refused when it does not divide).
    #[arg(long = "global-batch-size", visible_alias = "global_batch_size",
          conflicts_with = "batch_size", value_parser = positive)]
    pub global_batch_size: Option<usize>,
    /// Learning rate.
    #[arg(long, default_value_t = 0.01)]
    pub lr: f64,
    /// Number of synthetic samples.
    #[arg(
        long = "dataset-size",
        visible_alias = "dataset_size",
        default_value_t = 2048
    )]
    pub dataset_size: usize,
    /// Save a checkpoint every N epochs.
    #[arg(long = "save-interval", visible_alias = "save_interval", default_value_t = 2,
          value_parser = positive)]
    pub save_interval: usize,
    /// Where model_epoch_N.mpk and toy_config.json go.
    #[arg(
        long = "checkpoint-dir",
        visible_alias = "checkpoint_dir",
        default_value = "."
    )]
    pub checkpoint_dir: PathBuf,
    /// Checkpoint to resume from (every rank loads it), or `auto`: the newest
    /// model_epoch_N.mpk in --checkpoint-dir that loads (a corrupt one is
    /// skipped, another run's is an error; none: start afresh), as a job
    /// restarted by `burn-ddp-run --max-restarts` needs.
    #[arg(long, value_name = "PATH|auto")]
    pub resume: Option<PathBuf>,
    /// Seed of the data and the initial model.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Decimals of the logged loss.
    #[arg(
        long = "loss-precision",
        visible_alias = "loss_precision",
        default_value_t = 4
    )]
    pub loss_precision: usize,
    /// Rank 0 appends every step's global batch (its sample indices, rank
    /// after rank) to FILE, one line a step, whatever the world: a run that
    /// went on without a rank can be replayed in one process (--replay).
    #[arg(
        long = "log-batches",
        visible_alias = "log_batches",
        value_name = "FILE"
    )]
    pub log_batches: Option<PathBuf>,
    /// Train in this one process on the global batches FILE lists (written
    /// by --log-batches), in order, from the seed's model: the run replayed.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["log_batches", "resume"])]
    pub replay: Option<PathBuf>,
    /// Rank 0 prints every parameter's value at the end (to compare runs to
    /// a tolerance).
    #[arg(long = "print-params", visible_alias = "print_params")]
    pub print_params: bool,
    /// Backend: flex, ndarray (Burn 0.21 only), or cuda when built with the cuda
    /// feature.
    #[arg(long, value_enum, default_value = P::DEFAULT_BACKEND)]
    pub backend: BackendChoice,
    /// The program these flags are for.
    #[arg(skip)]
    pub program: PhantomData<P>,
}

/// Beside the checkpoints; not `config.json`, which the default folder (the
/// current one) may already hold.
pub const CONFIG_FILE: &str = "toy_config.json";

/// The hyper-parameters that define a run, saved as `toy_config.json` next to the
/// checkpoints; a resume compares them with its own.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone)]
pub struct ToyTrainingConfig {
    /// Training epochs (a resume may raise it).
    pub epochs: usize,
    /// Batch size per process.
    pub batch_size: usize,
    /// Processes; the global batch is `batch_size * world_size`.
    pub world_size: usize,
    /// SGD learning rate.
    pub lr: f64,
    /// Synthetic samples.
    pub dataset_size: usize,
    /// Seed of the data and the initial model.
    pub seed: u64,
}

impl ToyTrainingConfig {
    /// A run's hyper-parameters, the arguments in the fields' order (as Burn's
    /// `Config` derive made `new`).
    pub fn new(
        epochs: usize,
        batch_size: usize,
        world_size: usize,
        lr: f64,
        dataset_size: usize,
        seed: u64,
    ) -> Self {
        Self {
            epochs,
            batch_size,
            world_size,
            lr,
            dataset_size,
            seed,
        }
    }
}

/// The tutorial's ToyDataset: `randn(size, 10)` features and `randn(size, 1)`
/// labels, drawn from a fixed seed so every rank holds the same data.
pub fn toy_data(size: usize, seed: u64) -> (Vec<[f32; 10]>, Vec<f32>) {
    let mut normal = crate::Normal::new(seed);
    let features = (0..size)
        .map(|_| std::array::from_fn(|_| normal.sample()))
        .collect();
    let labels = (0..size).map(|_| normal.sample()).collect();
    (features, labels)
}

/// The tutorial's ToyDataset ([`toy_data`]), for a program's Burn `Dataset`.
pub struct ToyData {
    features: Vec<[f32; 10]>,
    labels: Vec<f32>,
}

/// One sample: ten features and a label.
#[derive(Clone, Debug)]
pub struct ToyItem {
    pub features: [f32; 10],
    pub label: f32,
}

impl ToyData {
    /// `size` samples drawn from `seed`.
    pub fn new(size: usize, seed: u64) -> Self {
        let (features, labels) = toy_data(size, seed);
        Self { features, labels }
    }

    /// Sample `index`.
    pub fn get(&self, index: usize) -> Result<ToyItem, IndexOutOfRange> {
        match self.features.get(index) {
            Some(features) => Ok(ToyItem {
                features: *features,
                label: self.labels[index],
            }),
            None => Err(IndexOutOfRange::new(index, self.len())),
        }
    }

    /// The samples at `indices`, in that order.
    pub fn select(&self, indices: &[usize]) -> Result<Self, IndexOutOfRange> {
        let items: Vec<ToyItem> = indices
            .iter()
            .map(|&i| self.get(i))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            features: items.iter().map(|item| item.features).collect(),
            labels: items.iter().map(|item| item.label).collect(),
        })
    }

    /// The number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

/// A batch's features (ten per sample, sample after sample) and labels.
pub fn features_and_labels(items: &[ToyItem]) -> (Vec<f32>, Vec<f32>) {
    let features = items.iter().flat_map(|item| item.features).collect();
    let labels = items.iter().map(|item| item.label).collect();
    (features, labels)
}

/// The toy trainer's Burn side: [`Training`] (ToyModel, SGD, MSE) and its
/// loader over this rank's shard.
pub trait ToyTraining: Training {
    /// A loader of `batch_size` items over `data` in `sampler`'s order
    /// (this rank's shard), and the handle that sets the sampler's epoch.
    fn loader(
        &self,
        data: ToyData,
        sampler: DistributedSampler,
        batch_size: usize,
    ) -> (Self::Loader, EpochHandle);
}

/// `--resume auto`.
const RESUME_AUTO: &str = "auto";

/// Trains the ToyModel as `args` say: a DistributedSampler over data
/// identical on every rank, the loss all-reduced for logging, rank 0's
/// checkpoints every `--save-interval` epochs, `--resume` from one.
pub fn train<T: ToyTraining, P: ToyProgram>(trainer: &T, args: &ToyArgs<P>) {
    if let Some(log) = &args.replay {
        return replay(trainer, args, log);
    }
    let group = T::FRONT_END.init();
    let (rank, world_size) = (group.rank(), group.world_size());
    // A replacement that joined the running job takes rank 0's state and
    // place (and batch) first, as the others hand them over.
    let joined =
        (group.joined_running()).then(|| training::join_running(trainer, &group, args.seed));
    let batch_size = match &joined {
        Some((_, _, at)) => at.batch_size,
        None => training::batch_size(&group, args.batch_size, args.global_batch_size),
    };
    let config = ToyTrainingConfig::new(
        args.epochs,
        batch_size,
        world_size,
        args.lr,
        args.dataset_size,
        args.seed,
    );

    // 1. Dataset and sampler: this rank's shard, reshuffled every epoch.
    let data = ToyData::new(args.dataset_size, args.seed);
    let sampler = burn_ddp_sampler::distributed_sampler(&group, data.len())
        .unwrap_or_else(|e| fail(Some(rank), e));
    let (loader, epoch_handle) = trainer.loader(data, sampler, batch_size);

    // 2. Model and optimizer, resumed on every rank before wrapping; a
    // replacement that joined the running job takes rank 0's instead.
    let dir = &args.checkpoint_dir;
    let mut resume = None;
    let (model, optimizer, first_epoch, joined_at) = if let Some((model, optimizer, at)) = joined {
        training::place_shards(&at, &[&epoch_handle], &group);
        (model, optimizer, at.epoch, Some(at))
    } else {
        resume = match args.resume.as_deref() {
            Some(path) if path == Path::new(RESUME_AUTO) => {
                training::newest_snapshot(trainer, &group, dir, &config, CONFIG_FILE)
            }
            other => other.map(Path::to_path_buf),
        };
        let snapshot = resume.as_deref();
        let files = (Some(dir.as_path()), CONFIG_FILE);
        let (model, optimizer, first_epoch) =
            training::start(trainer, &group, args.seed, snapshot, &config, files);
        (model, optimizer, first_epoch, None)
    };

    // 3. The epochs; Ctrl-C or SIGTERM: every rank stops before the same step.
    burn_ddp_training::stop::catch_stop_signals();
    let mut run = ToyRun {
        trainer,
        batch_size,
        group,
        args,
        first_epoch,
        resume,
    };
    println!("Rank {rank} starting training...");
    let end = run.epochs(&loader, &epoch_handle, (model, optimizer), joined_at);
    run.finish(end);
}

/// A toy run under way.
struct ToyRun<'a, T: ToyTraining, P: ToyProgram> {
    trainer: &'a T,
    /// Each rank's batch.
    batch_size: usize,
    group: ProcessGroup,
    args: &'a ToyArgs<P>,
    first_epoch: usize,
    /// The snapshot it resumed from.
    resume: Option<PathBuf>,
}

/// Where a toy run ended: its model and optimizer, the last snapshot saved,
/// and the stop that ended it early, if one did.
struct ToyEnd<T: Training> {
    model: T::Model,
    optimizer: T::Optimizer,
    last_saved: Option<PathBuf>,
    stopped: Option<Stopped>,
}

impl<T: ToyTraining, P: ToyProgram> ToyRun<'_, T, P> {
    /// The epochs from the first on: rank 0 prints each one's average loss
    /// and saves a snapshot every `--save-interval` epochs. Under
    /// `burn-ddp-run --on-failure continue`, a rank that is gone costs one
    /// step: the others go on as the group's next generation with the rest
    /// of the epoch dealt over them; a replacement the launcher starts is
    /// admitted at the end of a step and given rank 0's state (`joined_at`:
    /// this process is one, and the loop stands there).
    fn epochs(
        &mut self,
        loader: &T::Loader,
        epoch_handle: &EpochHandle,
        (mut model, mut optimizer): (T::Model, T::Optimizer),
        mut joined_at: Option<training::Position>,
    ) -> ToyEnd<T> {
        let (epochs, precision) = (self.args.epochs, self.args.loss_precision);
        let mut last_saved = None;
        for epoch in self.first_epoch..epochs {
            // The step losses summed over the ranks, and how many went in.
            let (mut loss, mut losses, mut steps) = (0.0, 0, 0);
            match joined_at.take() {
                // Joined in the middle of this epoch: its shard is placed.
                Some(at) => (loss, losses, steps) = (at.loss, at.losses, at.steps),
                None => epoch_handle.set_epoch(epoch), // important for shuffling
            }
            loop {
                let group = self.group.clone();
                let batches = self.trainer.batches(loader);
                // Each step's loss summed over the ranks, for logging; rank 0
                // logs the step's global batch first (the step is taken).
                let (log, batch, before) = (self.log(&group), self.batch_size, steps);
                let mut dealt_steps = 0;
                let sum_over_ranks = |loss: f64| {
                    if let Some(log) = &log {
                        let items = epoch_handle.global_batch(dealt_steps, batch);
                        let at = (epoch, before + dealt_steps, group.world_size());
                        training::log_global_batch(log, at, &items);
                    }
                    dealt_steps += 1;
                    let mut loss = [loss];
                    group.all_reduce(&mut loss, ReduceOp::Sum)?;
                    Ok(loss[0])
                };
                let done = training::train_epoch(
                    self.trainer,
                    &group,
                    batches,
                    (model, &mut optimizer),
                    (epoch, self.args.lr),
                    sum_over_ranks,
                );
                model = done.model;
                loss += done.loss;
                // A step whose loss sum failed is taken but adds no loss.
                let summed = done.steps - usize::from(done.loss_lost);
                losses += summed * group.world_size();
                steps += done.steps;
                if done.stopped.is_some() {
                    let stopped = done.stopped;
                    return ToyEnd {
                        model,
                        optimizer,
                        last_saved,
                        stopped,
                    };
                }
                let shards = [(epoch_handle, done.samples)];
                if done.joiners {
                    let at = training::Position {
                        epoch,
                        steps,
                        loss,
                        losses,
                        shards: Vec::new(),
                        batch_size: self.batch_size,
                    };
                    let state = (model, optimizer);
                    let admitted =
                        training::admit(self.trainer, state, &mut self.group, &shards, at);
                    (model, optimizer, _) = admitted;
                    continue;
                }
                let Some(error) = done.failed else { break };
                let at = training::progress(epoch, steps);
                model = training::go_on(self.trainer, (error, model), &mut self.group, &shards, at);
            }
            let (main, rank) = (self.group.is_main(), self.group.rank());
            let average = loss / losses.max(1) as f64;
            if main {
                println!(
                    "Epoch {}/{epochs}, Avg Loss: {average:.precision$}",
                    epoch + 1
                );
            }
            if main && (epoch + 1).is_multiple_of(self.args.save_interval) {
                last_saved = Some(self.save(&model, &optimizer, epoch + 1));
            }
            // Every rank finishes the epoch (and rank 0 its checkpoint) before
            // going on; after a failure, the survivors meet here again (one
            // whose last step failed finds the rest of the epoch empty).
            while let Err(error) = self.group.barrier() {
                if !burn_ddp_training::recovery::goes_on_after_failure() {
                    fail(Some(rank), error);
                }
                let at = training::progress(epoch, steps);
                let shards = [(epoch_handle, 0)];
                model = training::go_on(self.trainer, (error, model), &mut self.group, &shards, at);
            }
        }
        ToyEnd {
            model,
            optimizer,
            last_saved,
            stopped: None,
        }
    }

    /// Where rank 0 of `group` logs the global batches (`--log-batches`).
    fn log(&self, group: &ProcessGroup) -> Option<PathBuf> {
        self.args.log_batches.clone().filter(|_| group.is_main())
    }

    /// Rank 0 saves `model_epoch_{epochs_done}` atomically and says where.
    fn save(&self, model: &T::Model, optimizer: &T::Optimizer, epochs_done: usize) -> PathBuf {
        let rank = self.group.rank();
        let dir = &self.args.checkpoint_dir;
        let path = training::save_snapshot(self.trainer, dir, model, optimizer, epochs_done, rank);
        println!("Rank {rank} saved checkpoint to {}", path.display());
        path
    }

    /// The end: a stopped run names the snapshot to go on from and exits
    /// with the signal's code; a finished one prints its parameters'
    /// fingerprint.
    fn finish(&self, end: ToyEnd<T>) {
        let rank = self.group.rank();
        let front_end = T::FRONT_END;
        if let Some(stop) = end.stopped {
            println!("{}", stop.rank_line(rank));
            if self.group.is_main() {
                self.say_where_to_go_on(&end, stop);
            }
            front_end.destroy(rank);
            std::process::exit(stop.exit_code());
        }
        // Every replica ends with rank 0's parameters (their digests compared).
        let replicas = training::check_identical(self.trainer, &self.group, &end.model);
        front_end.destroy(rank);
        if let Some(summary) = front_end.sync_summary().filter(|_| rank == 0) {
            println!("{summary}");
        }
        if rank == 0 {
            // Equal for two runs exactly when they ended with the same parameters.
            println!(
                "Parameters fingerprint: {:016x}",
                self.trainer.burn().fingerprint(&end.model)
            );
            println!("Replicas identical: {replicas} ranks");
            if self.args.print_params {
                training::print_params_of(&self.trainer.burn().parameter_values(&end.model));
            }
            println!("Training complete.");
        }
    }

    /// Rank 0 after a stop: the snapshot to go on from (stopped between
    /// epochs, the finished ones are saved first: nothing is lost).
    fn say_where_to_go_on(&self, end: &ToyEnd<T>, stop: Stopped) {
        let mut last_saved = end.last_saved.clone();
        let between_epochs = stop.step == 0 && stop.epoch > self.first_epoch;
        if between_epochs && !stop.epoch.is_multiple_of(self.args.save_interval) {
            last_saved = Some(self.save(&end.model, &end.optimizer, stop.epoch));
        }
        match last_saved.as_deref().or(self.resume.as_deref()) {
            Some(path) => println!(
                "{}; go on with --resume {}",
                stop.describe(),
                path.display()
            ),
            None => println!("{}; no checkpoint was saved yet", stop.describe()),
        }
    }
}

/// `--replay FILE`: one process trains on the global batches `FILE` lists,
/// in order, from the seed's model, with the run's optimizer and learning
/// rate: what the logged run trained, in one process.
fn replay<T: ToyTraining, P: ToyProgram>(trainer: &T, args: &ToyArgs<P>, log: &Path) {
    let group = training::replay_group::<T>();
    let rank = group.rank();
    let data = ToyData::new(args.dataset_size, args.seed);
    let config = ToyTrainingConfig::new(1, 1, 1, args.lr, args.dataset_size, args.seed);
    let files = (None, CONFIG_FILE);
    let (model, mut optimizer, _) =
        training::start(trainer, &group, args.seed, None, &config, files);
    let batch_of = |items: &[usize]| {
        let step_data = data.select(items).unwrap_or_else(|e| fail(Some(rank), e));
        let (loader, _) = trainer.loader(
            step_data,
            training::in_order(items.len(), rank),
            items.len(),
        );
        training::first_batch(trainer, &loader, rank)
    };
    let run = (model, &mut optimizer);
    training::replay(
        trainer,
        &group,
        run,
        (args.lr, log, args.print_params),
        batch_of,
    );
}
