//! The MNIST trainer (the PyTorch DDP tutorial's script), written once for both Burn
//! versions: its command line, saved hyper-parameters, data, and the
//! hand-written loop ([`train`]; the Learner's is [`crate::learner`]). What
//! a Burn version spells its own way (the CNN, loaders, training step,
//! evaluation, checkpoints, where MNIST comes from without `--data-dir`) is
//! its program's [`MnistFiles`] and [`MnistTraining`] (examples/mnist on
//! Burn 0.21, examples-22/mnist on 0.22).

mod train;

pub use train::{train, MnistTraining};

use crate::cli::{positive, BackendChoice};
use crate::idx::{self, Split};
use crate::training::Program;
use crate::{fail, IndexOutOfRange};
use burn_ddp_comm::{LaunchEnv, ProcessGroup};
use clap::Parser;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The trainer's command line: the tutorial's argparse flags (dashes or
/// underscores).
#[derive(Parser, Debug, Clone)]
#[command(
    name = "mnist",
    version,
    about = "DDP training of the tutorial's MNIST CNN."
)]
pub struct MnistArgs {
    /// Training epochs.
    #[arg(long, default_value_t = 2)]
    pub epochs: usize,
    /// Batch size per process.
    #[arg(long = "batch-size", visible_alias = "batch_size", default_value_t = 128,
          value_parser = positive)]
    pub batch_size: usize,
    /// Batch size of one optimizer step over all processes, split evenly over
    /// them instead of --batch-size (refused when it does not divide).
    #[arg(long = "global-batch-size", visible_alias = "global_batch_size",
          conflicts_with = "batch_size", value_parser = positive)]
    pub global_batch_size: Option<usize>,
    /// AdamW learning rate.
    #[arg(long, default_value_t = 0.001)]
    pub lr: f64,
    /// Folder with the four MNIST IDX files (.gz or not). Without it, burn-dataset's
    /// MnistDataset (downloaded once per machine into ~/.cache/burn-dataset/mnist).
    #[arg(long = "data-dir", visible_alias = "data_dir")]
    pub data_dir: Option<PathBuf>,
    /// Without --data-dir: seconds the download of MNIST may take (burn-dataset's
    /// downloader has no timeout of its own).
    #[arg(long = "download-timeout", value_name = "SECS", default_value_t = 600,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub download_timeout: u64,
    /// Use only the first N training images.
    #[arg(
        long = "train-samples",
        visible_alias = "train_samples",
        value_name = "N"
    )]
    pub train_samples: Option<usize>,
    /// Use only the first N test images.
    #[arg(
        long = "test-samples",
        visible_alias = "test_samples",
        value_name = "N"
    )]
    pub test_samples: Option<usize>,
    /// Batch size for evaluation.
    #[arg(long = "test-batch-size", visible_alias = "test_batch_size", default_value_t = 1000,
          value_parser = positive)]
    pub test_batch_size: usize,
    /// Stop each epoch after N steps (quick runs; hand-written loop only).
    #[arg(
        long = "max-steps",
        visible_alias = "max_steps",
        value_name = "N",
        conflicts_with = "learner"
    )]
    pub max_steps: Option<usize>,
    /// Seed of the initial model and the shuffle.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where rank 0 saves the final model (.mpk) and its configuration (.config.json).
    #[arg(long, default_value = "mnist_ddp")]
    pub output: PathBuf,
    /// Backend: flex (fast CPU), ndarray (slow convolutions), or cuda / cuda-fused with the cuda feature.
    #[arg(long, value_enum, default_value = "flex")]
    pub backend: BackendChoice,
    /// Train through Burn's Learner (SupervisedTraining) instead of the hand-written loop.
    #[arg(long)]
    pub learner: bool,
    /// With --learner: the experiment folder (logs, metrics, checkpoints, the model).
    #[arg(
        long = "artifact-dir",
        visible_alias = "artifact_dir",
        default_value = "mnist_learner",
        requires = "learner"
    )]
    pub artifact_dir: PathBuf,
    /// Hand-written loop: where rank 0 writes a snapshot (model, optimizer,
    /// epochs done: model_epoch_N.mpk) every --save-interval epochs, and the
    /// run's configuration (mnist_config.json). Without it, no snapshots.
    #[arg(
        long = "checkpoint-dir",
        visible_alias = "checkpoint_dir",
        value_name = "DIR",
        conflicts_with = "learner"
    )]
    pub checkpoint_dir: Option<PathBuf>,
    /// Hand-written loop: epochs between two snapshots.
    #[arg(long = "save-interval", visible_alias = "save_interval", value_name = "N",
          default_value_t = 1, value_parser = positive, requires = "checkpoint_dir")]
    pub save_interval: usize,
    /// Resume after this epoch (the Learner's checkpoint of it, or
    /// model_epoch_N.mpk in --checkpoint-dir), or `auto`: after the newest
    /// one that is whole, if any (a damaged one is skipped, another run's
    /// folder is an error), as a job restarted by `burn-ddp-run
    /// --max-restarts` needs.
    #[arg(long, value_name = "EPOCH|auto", value_parser = resume_from)]
    pub resume: Option<ResumeFrom>,
    /// Hand-written loop: rank 0 appends every step's global batch (its
    /// training-set indices, rank after rank) to FILE, whatever the world:
    /// a run that went on without a rank can be replayed (--replay).
    #[arg(
        long = "log-batches",
        visible_alias = "log_batches",
        value_name = "FILE",
        conflicts_with = "learner"
    )]
    pub log_batches: Option<PathBuf>,
    /// Train in this one process on the global batches FILE lists (written
    /// by --log-batches), in order, from the seed's model: the run replayed.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["learner", "log_batches", "resume"])]
    pub replay: Option<PathBuf>,
    /// Rank 0 prints every parameter's value at the end (to compare runs to
    /// a tolerance).
    #[arg(long = "print-params", visible_alias = "print_params")]
    pub print_params: bool,
}

/// Where `--resume` goes on from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResumeFrom {
    /// After this epoch.
    Epoch(usize),
    /// After the newest complete checkpoint, if there is one.
    Auto,
}

fn resume_from(value: &str) -> Result<ResumeFrom, String> {
    if value == "auto" {
        return Ok(ResumeFrom::Auto);
    }
    value
        .parse()
        .ok()
        .filter(|epoch| *epoch > 0)
        .map(ResumeFrom::Epoch)
        .ok_or_else(|| format!("{value:?} is neither an epoch (1, 2, ...) nor `auto`"))
}

/// The hyper-parameters of a run, saved next to the model it produced.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone)]
pub struct MnistTrainingConfig {
    /// Training epochs.
    pub epochs: usize,
    /// Batch size per process.
    pub batch_size: usize,
    /// Processes; the global batch is `batch_size * world_size`.
    pub world_size: usize,
    /// AdamW learning rate.
    pub lr: f64,
    /// Seed of the initial model and the shuffle.
    pub seed: u64,
    /// Training images used (all when not limited).
    pub train_samples: usize,
    /// Steps per epoch, when limited.
    pub max_steps: Option<usize>,
}

impl MnistTrainingConfig {
    /// A run's hyper-parameters, the required ones in the fields' order and
    /// `max_steps` unset (as Burn's `Config` derive made `new`; set it with
    /// [`with_max_steps`](Self::with_max_steps)).
    pub fn new(
        epochs: usize,
        batch_size: usize,
        world_size: usize,
        lr: f64,
        seed: u64,
        train_samples: usize,
    ) -> Self {
        Self {
            epochs,
            batch_size,
            world_size,
            lr,
            seed,
            train_samples,
            max_steps: None,
        }
    }

    /// Sets [`max_steps`](Self::max_steps).
    pub fn with_max_steps(mut self, max_steps: Option<usize>) -> Self {
        self.max_steps = max_steps;
        self
    }
}

/// Where a Burn version's trainer finds MNIST (its hand-written loop and its
/// Learner alike).
pub trait MnistFiles: Program {
    /// Both splits whole: `--data-dir`'s IDX files ([`read_idx`]), or
    /// without it what this Burn's burn-dataset has (an error says what to do).
    fn read(&self, args: &MnistArgs, group: &ProcessGroup) -> Result<(Split, Split), String>;
}

/// The training and test splits of the four IDX files in `dir` (`.gz` or not).
pub fn read_idx(dir: &Path) -> Result<(Split, Split), String> {
    let train = idx::load_split(dir, "train").map_err(|e| e.to_string())?;
    let test = idx::load_split(dir, "t10k").map_err(|e| e.to_string())?;
    Ok((train, test))
}

/// This rank's copy of both splits, limited by --train-samples/--test-samples.
pub fn splits<T: MnistFiles>(
    burn: &T,
    args: &MnistArgs,
    group: &ProcessGroup,
) -> (Arc<Split>, Arc<Split>) {
    let (mut train, mut test) = burn
        .read(args, group)
        .unwrap_or_else(|e| fail(Some(group.rank()), e));
    if let Some(n) = args.train_samples {
        train.truncate(n);
    }
    if let Some(n) = args.test_samples {
        test.truncate(n);
    }
    (Arc::new(train), Arc::new(test))
}

/// One image (its own copy of the pixels) and its label.
#[derive(Clone, Debug)]
pub struct MnistItem {
    pub image: Arc<[u8]>,
    pub label: u8,
}

impl MnistItem {
    /// Image `index` of `split`.
    pub fn of(split: &Split, index: usize) -> Result<Self, IndexOutOfRange> {
        let pixels = split.pixels();
        match split.images.get(index * pixels..(index + 1) * pixels) {
            Some(image) => Ok(Self {
                image: Arc::from(image),
                label: split.labels[index],
            }),
            None => Err(IndexOutOfRange::new(index, split.len())),
        }
    }
}

/// The batch's pixels as the tutorial's transform makes them: `ToTensor()`
/// (0-255 to 0-1) then `Normalize((0.1307,), (0.3081,))`, image after image.
pub fn normalized_pixels(items: &[MnistItem]) -> Vec<f32> {
    items
        .iter()
        .flat_map(|item| {
            item.image
                .iter()
                .map(|p| (*p as f32 / 255.0 - 0.1307) / 0.3081)
        })
        .collect()
}

/// The batch's labels, as class indices.
pub fn labels(items: &[MnistItem]) -> Vec<i64> {
    items.iter().map(|item| item.label as i64).collect()
}

/// The trainer's logger: with `--learner`, Burn's Learner sends rank 0's
/// messages to experiment.log; the other ranks (and the hand-written loop)
/// print warnings and errors.
pub fn init_logger(args: &MnistArgs) {
    if !args.learner || LaunchEnv::from_env().is_ok_and(|env| env.rank != 0) {
        crate::cli::init_logger();
    }
}
