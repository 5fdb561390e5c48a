//! Port of the ToyModel DDP trainer (document 003): one Linear(10, 1), MSE,
//! SGD, a synthetic dataset identical on every rank, a DistributedSampler, the
//! loss all-reduced for logging, rank-0 checkpoints every `--save-interval`
//! epochs, and `--resume` from one.
//!
//! ```text
//! cargo run --release --example toy                                  # one process
//! burn-ddp-run --standalone --nproc-per-node 2 target/release/examples/toy --epochs 10 --batch_size 32
//! ```

// `pub(crate)` items here are reused by examples/gpu_check (the same trainer,
// linked into the one binary carried to GPU machines).
#[macro_use]
#[path = "../common/mod.rs"]
pub(crate) mod common;

use burn::config::Config;
use burn::data::dataloader::{batcher::Batcher, DataLoaderBuilder};
use burn::data::dataset::Dataset;
use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor, TensorData};
use burn_ddp::data::DistributedDataset;
use burn_ddp::ReduceOp;
use clap::Parser;
use common::cli::{positive, BackendChoice};
use common::{fail, run_config, Normal};
use std::path::PathBuf;

/// The trainer's command line: the document's argparse flags (dashes or
/// underscores).
#[derive(Parser, Debug, Clone)]
#[command(
    name = "toy",
    version,
    about = "DDP training of the document's ToyModel (Linear 10 -> 1)."
)]
pub(crate) struct ToyArgs {
    /// Training epochs.
    #[arg(long, default_value_t = 5)]
    pub epochs: usize,
    /// Batch size per process.
    #[arg(long = "batch-size", visible_alias = "batch_size", default_value_t = 64,
          value_parser = positive)]
    pub batch_size: usize,
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
    /// Checkpoint to resume from (every rank loads it).
    #[arg(long)]
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
    /// Backend: ndarray, flex, or cuda when built with the cuda feature.
    #[arg(long, value_enum, default_value = "ndarray")]
    pub backend: BackendChoice,
}

/// Beside the checkpoints; not `config.json`, which the default folder (the
/// current one) may already hold.
const CONFIG_FILE: &str = "toy_config.json";

/// The hyper-parameters that define a run, saved as `toy_config.json` next to the
/// checkpoints; a resume compares them with its own.
#[derive(Config, Debug)]
pub(crate) struct ToyTrainingConfig {
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

/// The document's ToyModel.
#[derive(Module, Debug)]
struct ToyModel<B: Backend> {
    linear: Linear<B>,
}

impl<B: Backend> ToyModel<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            linear: LinearConfig::new(10, 1).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.linear.forward(x)
    }
}

/// The document's ToyDataset: `randn(size, 10)` features and `randn(size, 1)`
/// labels, drawn from a fixed seed so every rank holds the same data.
struct ToyDataset {
    features: Vec<[f32; 10]>,
    labels: Vec<f32>,
}

impl ToyDataset {
    fn new(size: usize, seed: u64) -> Self {
        let mut normal = Normal::new(seed);
        let features = (0..size)
            .map(|_| std::array::from_fn(|_| normal.sample()))
            .collect();
        let labels = (0..size).map(|_| normal.sample()).collect();
        Self { features, labels }
    }
}

#[derive(Clone, Debug)]
struct ToyItem {
    features: [f32; 10],
    label: f32,
}

impl Dataset<ToyItem> for ToyDataset {
    fn get(&self, index: usize) -> Option<ToyItem> {
        Some(ToyItem {
            features: *self.features.get(index)?,
            label: self.labels[index],
        })
    }

    fn len(&self) -> usize {
        self.labels.len()
    }
}

#[derive(Clone)]
struct ToyBatcher;

impl<B: Backend> Batcher<B, ToyItem, (Tensor<B, 2>, Tensor<B, 2>)> for ToyBatcher {
    fn batch(&self, items: Vec<ToyItem>, device: &B::Device) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let n = items.len();
        let x: Vec<f32> = items.iter().flat_map(|i| i.features).collect();
        let y: Vec<f32> = items.iter().map(|i| i.label).collect();
        (
            Tensor::from_data(TensorData::new(x, [n, 10]), device),
            Tensor::from_data(TensorData::new(y, [n, 1]), device),
        )
    }
}

fn main() {
    common::cli::init_logger();
    let args = ToyArgs::parse();
    run_on_backend!(args, train);
}

pub(crate) fn train<B: AutodiffBackend>(args: &ToyArgs, device: B::Device) {
    let ToyArgs {
        epochs,
        batch_size,
        lr,
        dataset_size,
        save_interval,
        seed,
        loss_precision: precision,
        ..
    } = *args;
    let checkpoint_dir = &args.checkpoint_dir;

    let group = burn_ddp::init_process_group().unwrap_or_else(|e| fail(None, e));
    let (rank, world_size) = (group.rank(), group.world_size());
    let config = ToyTrainingConfig::new(epochs, batch_size, world_size, lr, dataset_size, seed);

    // 1. Dataset and sampler: this rank's shard, reshuffled every epoch.
    let dataset = ToyDataset::new(dataset_size, seed);
    let sampler = burn_ddp::distributed_sampler(&group, dataset.len())
        .unwrap_or_else(|e| fail(Some(rank), e));
    let shard = DistributedDataset::new(dataset, sampler);
    let epoch_handle = shard.epoch_handle();
    let loader = DataLoaderBuilder::<B, _, _>::new(ToyBatcher)
        .batch_size(batch_size)
        .set_device(device.clone())
        .build(shard);

    // 2. Model and optimizer, resumed on every rank before wrapping.
    B::seed(&device, seed);
    let mut model = ToyModel::<B>::new(&device);
    let mut optimizer = SgdConfig::new().init();
    let mut first_epoch = 0;
    if let Some(path) = &args.resume {
        let (model_record, optimizer_record, epoch) =
            burn_ddp::checkpoint::load::<B, _>(&path, &device)
                .unwrap_or_else(|e| fail(Some(rank), e));
        model = burn_ddp::checkpoint::load_record_checked(model, model_record, path)
            .unwrap_or_else(|e| fail(Some(rank), e));
        optimizer = optimizer.load_record(optimizer_record);
        first_epoch = epoch;
        group.barrier().unwrap_or_else(|e| fail(Some(rank), e));
        if group.is_main() {
            println!("Resumed from {} at epoch {first_epoch}", path.display());
            let saved = path.with_file_name(CONFIG_FILE);
            if let Some(warning) = run_config::resume_warning(&config, &saved, &["epochs"]) {
                log::warn!("rank {rank}: {warning}");
            }
        }
    }
    if group.is_main() {
        run_config::save(&config, &checkpoint_dir.join(CONFIG_FILE))
            .unwrap_or_else(|e| fail(Some(rank), e));
    }
    let mut model = burn_ddp::wrap(model, &group).unwrap_or_else(|e| fail(Some(rank), e));
    let criterion = MseLoss::new();

    println!("Rank {rank} starting training...");
    for epoch in first_epoch..epochs {
        epoch_handle.set_epoch(epoch); // important for shuffling
        let mut epoch_loss = 0.0f64;
        let mut num_batches = 0usize;
        for (features, labels) in loader.iter() {
            let outputs = model.forward(features);
            let loss = criterion.forward(outputs, labels, Reduction::Mean);
            let mut loss_value = [loss.clone().into_scalar().elem::<f64>()];
            let grads = GradientsParams::from_grads(loss.backward(), &model); // averaged over ranks here
            model = optimizer.step(lr, model, grads);
            // Aggregate the loss for logging.
            group
                .all_reduce(&mut loss_value, ReduceOp::Sum)
                .unwrap_or_else(|e| fail(Some(rank), e));
            epoch_loss += loss_value[0];
            num_batches += 1;
        }
        let average = epoch_loss / (num_batches.max(1) * world_size) as f64;
        if group.is_main() {
            println!(
                "Epoch {}/{epochs}, Avg Loss: {average:.precision$}",
                epoch + 1
            );
        }
        if group.is_main() && (epoch + 1) % save_interval == 0 {
            let path = checkpoint_dir.join(format!("model_epoch_{}", epoch + 1));
            let record = (
                model.clone().into_record(),
                optimizer.to_record(),
                epoch + 1,
            );
            let path = burn_ddp::checkpoint::save_atomic::<B, _>(record, path)
                .unwrap_or_else(|e| fail(Some(rank), e));
            println!("Rank {rank} saved checkpoint to {}", path.display());
        }
        // Every rank finishes the epoch (and rank 0 its checkpoint) before going on.
        group.barrier().unwrap_or_else(|e| fail(Some(rank), e));
    }
    burn_ddp::destroy_process_group().unwrap_or_else(|e| fail(Some(rank), e));
    let sync = burn_ddp::sync_stats();
    if rank == 0 && sync.syncs > 0 {
        println!(
            "Gradient sync: {} buckets, {} of them on the GPU over NCCL",
            sync.buckets, sync.device_buckets
        );
    }
    if rank == 0 {
        println!("Training complete.");
    }
}
