//! The MNIST trainer's command line and saved hyper-parameters, shared by its
//! Burn 0.21 and Burn 0.22 programs (no Burn here).

use crate::cli::{positive, BackendChoice};
use clap::Parser;
use std::path::PathBuf;

/// The trainer's command line: the document's argparse flags (dashes or
/// underscores).
#[derive(Parser, Debug, Clone)]
#[command(
    name = "mnist",
    version,
    about = "DDP training of the document's MNIST CNN."
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
