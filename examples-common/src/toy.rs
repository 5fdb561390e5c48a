//! The toy trainer's command line, saved hyper-parameters and data, shared by its
//! Burn 0.21 and Burn 0.22 programs (no Burn here; each program says its own
//! `--backend` default through [`ToyProgram`]).

use crate::cli::{positive, BackendChoice};
use clap::Parser;
use std::marker::PhantomData;
use std::path::PathBuf;

/// What the toy trainer's programs differ in on the command line.
pub trait ToyProgram {
    /// `--backend`'s default (a [`BackendChoice`] value: `ndarray` on Burn
    /// 0.21, `flex` on Burn 0.22, which has no NdArray).
    const DEFAULT_BACKEND: &'static str;
}

/// The trainer's command line: the document's argparse flags (dashes or
/// underscores); `P` says the program's `--backend` default.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "toy",
    version,
    about = "DDP training of the document's ToyModel (Linear 10 -> 1)."
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

/// The document's ToyDataset: `randn(size, 10)` features and `randn(size, 1)`
/// labels, drawn from a fixed seed so every rank holds the same data.
pub fn toy_data(size: usize, seed: u64) -> (Vec<[f32; 10]>, Vec<f32>) {
    let mut normal = crate::Normal::new(seed);
    let features = (0..size)
        .map(|_| std::array::from_fn(|_| normal.sample()))
        .collect();
    let labels = (0..size).map(|_| normal.sample()).collect();
    (features, labels)
}
