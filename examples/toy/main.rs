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
use common::flags::{Flag, Flags};
use common::{fail, Normal};
use std::path::PathBuf;

pub(crate) const FLAGS: &[Flag] = &[
    Flag {
        name: "epochs",
        default: Some("5"),
        help: "training epochs",
    },
    Flag {
        name: "batch-size",
        default: Some("64"),
        help: "batch size per process",
    },
    Flag {
        name: "lr",
        default: Some("0.01"),
        help: "learning rate",
    },
    Flag {
        name: "dataset-size",
        default: Some("2048"),
        help: "number of synthetic samples",
    },
    Flag {
        name: "save-interval",
        default: Some("2"),
        help: "save a checkpoint every N epochs",
    },
    Flag {
        name: "checkpoint-dir",
        default: Some("."),
        help: "where model_epoch_N.mpk files go",
    },
    Flag {
        name: "resume",
        default: None,
        help: "checkpoint to resume from (every rank loads it)",
    },
    Flag {
        name: "seed",
        default: Some("0"),
        help: "seed of the data and the initial model",
    },
    Flag {
        name: "loss-precision",
        default: Some("4"),
        help: "decimals of the logged loss",
    },
    Flag {
        name: "backend",
        default: Some("ndarray"),
        help: "ndarray, flex, or cuda when built with the cuda feature",
    },
];

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
    let flags = Flags::parse(
        "toy",
        "DDP training of the document's ToyModel (Linear 10 -> 1).",
        FLAGS,
    );
    run_on_backend!(flags, train);
}

pub(crate) fn train<B: AutodiffBackend>(flags: &Flags, device: B::Device) {
    let epochs: usize = flags.get("epochs");
    let batch_size: usize = flags.get("batch-size");
    let lr: f64 = flags.get("lr");
    let dataset_size: usize = flags.get("dataset-size");
    let save_interval: usize = flags.get("save-interval");
    let checkpoint_dir: PathBuf = flags.get("checkpoint-dir");
    let seed: u64 = flags.get("seed");
    let precision: usize = flags.get("loss-precision");
    if batch_size == 0 || save_interval == 0 {
        fail(None, "--batch-size and --save-interval must be positive");
    }

    let group = burn_ddp::init_process_group().unwrap_or_else(|e| fail(None, e));
    let (rank, world_size) = (group.rank(), group.world_size());

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
    if let Some(path) = flags.optional::<PathBuf>("resume") {
        let (model_record, optimizer_record, epoch) =
            burn_ddp::checkpoint::load::<B, _>(&path, &device)
                .unwrap_or_else(|e| fail(Some(rank), e));
        model = model.load_record(model_record);
        optimizer = optimizer.load_record(optimizer_record);
        first_epoch = epoch;
        group.barrier().unwrap_or_else(|e| fail(Some(rank), e));
        if group.is_main() {
            println!("Resumed from {} at epoch {first_epoch}", path.display());
        }
    }
    let mut model = burn_ddp::wrap(model, &group).unwrap_or_else(|e| fail(Some(rank), e));
    let criterion = MseLoss::new();

    println!("Rank {rank} starting training...");
    for epoch in first_epoch..epochs {
        epoch_handle.set_epoch(epoch as u64); // important for shuffling
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
