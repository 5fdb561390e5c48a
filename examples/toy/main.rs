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
#[path = "../shared/backend.rs"]
mod backend;

use burn_ddp_examples_common as common;
use common::toy::{toy_data, ToyProgram, ToyTrainingConfig, CONFIG_FILE};

/// This program, for its command line: `--backend`'s default is NdArray.
#[derive(Clone, Debug)]
pub(crate) struct Burn021Toy;

impl ToyProgram for Burn021Toy {
    const DEFAULT_BACKEND: &'static str = "ndarray";
}

/// The toy trainer's command line, with this program's `--backend` default.
pub(crate) type ToyArgs = common::toy::ToyArgs<Burn021Toy>;

use burn::data::dataloader::{batcher::Batcher, DataLoaderBuilder};
use burn::data::dataset::Dataset;
use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor, TensorData};
use burn_ddp::collective::ReduceOp;
use burn_ddp::data::DistributedDataset;
use clap::Parser;
use common::stopped::Stopped;
use common::{fail, run_config};
use std::path::{Path, PathBuf};

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

/// The document's ToyDataset ([`toy_data`]).
struct ToyDataset {
    features: Vec<[f32; 10]>,
    labels: Vec<f32>,
}

impl ToyDataset {
    fn new(size: usize, seed: u64) -> Self {
        let (features, labels) = toy_data(size, seed);
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

/// Rank 0 saves `model_epoch_{epochs_done}` atomically and says where.
fn save<B: AutodiffBackend>(
    record: impl burn::record::Record<B>,
    dir: &Path,
    epochs_done: usize,
    rank: usize,
) -> PathBuf {
    let path = common::resume::snapshot_path(dir, epochs_done);
    let path = burn_ddp::checkpoint::save_atomic::<B, _>(record, path)
        .unwrap_or_else(|e| fail(Some(rank), e));
    println!("Rank {rank} saved checkpoint to {}", path.display());
    path
}

/// `--resume auto`.
const RESUME_AUTO: &str = "auto";

/// `--resume auto`: the newest snapshot in `dir` that loads into a ToyModel
/// and its SGD state, the same for every rank ([`common::resume`]).
fn newest_snapshot<B: AutodiffBackend>(
    group: &burn_ddp::ProcessGroup,
    config: &ToyTrainingConfig,
    dir: &Path,
    device: &B::Device,
) -> Option<PathBuf> {
    common::resume::newest_snapshot(
        group,
        dir,
        "mpk",
        config,
        &dir.join(CONFIG_FILE),
        &["epochs"],
        |snapshot| {
            let (model_record, optimizer_record, _epoch): (_, _, usize) =
                burn_ddp::checkpoint::load::<B, _>(&snapshot.path, device)
                    .map_err(|e| e.for_snapshot())?;
            burn_ddp::checkpoint::load_record_checked(
                ToyModel::<B>::new(device),
                model_record,
                &snapshot.path,
            )
            .map_err(|e| e.for_snapshot())?;
            let _ = SgdConfig::new()
                .init::<B, ToyModel<B>>()
                .load_record(optimizer_record);
            Ok(())
        },
    )
}

fn main() {
    common::cli::init_logger();
    let args = ToyArgs::parse();
    run_on_backend!(args, train);
}

pub(crate) fn train<B: AutodiffBackend>(args: &ToyArgs, device: B::Device) {
    let ToyArgs {
        epochs,
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
    // Each rank's loader batch: --batch-size, or its share of --global-batch-size.
    let batch_size = match args.global_batch_size {
        Some(global) => {
            burn_ddp::data::batch_size_per_rank(&group, global).unwrap_or_else(|e| fail(None, e))
        }
        None => args.batch_size,
    };
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
    let resume = match args.resume.as_deref() {
        Some(path) if path == Path::new(RESUME_AUTO) => {
            newest_snapshot::<B>(&group, &config, checkpoint_dir, &device)
        }
        other => other.map(Path::to_path_buf),
    };
    B::seed(&device, seed);
    let mut model = ToyModel::<B>::new(&device);
    let mut optimizer = SgdConfig::new().init();
    let mut first_epoch = 0;
    if let Some(path) = &resume {
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
        // Made if missing; refused here, before the first step, if it cannot be.
        std::fs::create_dir_all(checkpoint_dir)
            .map_err(|e| format!("--checkpoint-dir {}: {e}", checkpoint_dir.display()))
            .and_then(|()| run_config::save(&config, &checkpoint_dir.join(CONFIG_FILE)))
            .unwrap_or_else(|e| fail(Some(rank), e));
    }
    let mut model = burn_ddp::wrap(model, &group).unwrap_or_else(|e| fail(Some(rank), e));
    let criterion = MseLoss::new();

    // Ctrl-C or SIGTERM: every rank stops before the same step (asked each step).
    burn_ddp::stop::catch_stop_signals();
    let mut stopped = None;
    let mut last_saved = None;
    println!("Rank {rank} starting training...");
    'training: for epoch in first_epoch..epochs {
        epoch_handle.set_epoch(epoch); // important for shuffling
        let mut epoch_loss = 0.0f64;
        let mut num_batches = 0usize;
        for (features, labels) in loader.iter() {
            if let Some(signal) =
                burn_ddp::stop::stop_requested(&group).unwrap_or_else(|e| fail(Some(rank), e))
            {
                stopped = Some(Stopped {
                    signal,
                    epoch,
                    step: num_batches,
                });
                break 'training;
            }
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
            let record = (
                model.clone().into_record(),
                optimizer.to_record(),
                epoch + 1,
            );
            last_saved = Some(save::<B>(record, checkpoint_dir, epoch + 1, rank));
        }
        // Every rank finishes the epoch (and rank 0 its checkpoint) before going on.
        group.barrier().unwrap_or_else(|e| fail(Some(rank), e));
    }
    if let Some(stop) = stopped {
        println!("{}", stop.rank_line(rank));
        if group.is_main() {
            // Stopped between epochs: the finished epochs are saved, nothing is lost.
            if stop.step == 0 && stop.epoch > first_epoch && stop.epoch % save_interval != 0 {
                let record = (
                    model.clone().into_record(),
                    optimizer.to_record(),
                    stop.epoch,
                );
                last_saved = Some(save::<B>(record, checkpoint_dir, stop.epoch, rank));
            }
            match last_saved.as_deref().or(resume.as_deref()) {
                Some(path) => println!(
                    "{}; go on with --resume {}",
                    stop.describe(),
                    path.display()
                ),
                None => println!("{}; no checkpoint was saved yet", stop.describe()),
            }
        }
        burn_ddp::destroy_process_group().unwrap_or_else(|e| fail(Some(rank), e));
        std::process::exit(stop.exit_code());
    }
    burn_ddp::destroy_process_group().unwrap_or_else(|e| fail(Some(rank), e));
    let sync = burn_ddp::sync::sync_stats();
    if rank == 0 && sync.syncs > 0 {
        println!(
            "Gradient sync: {} buckets, {} of them on the GPU over NCCL",
            sync.buckets, sync.device_buckets
        );
    }
    if rank == 0 {
        // Equal for two runs exactly when they ended with the same parameters.
        println!(
            "Parameters fingerprint: {:016x}",
            burn_ddp::replicas::parameters_fingerprint(&model)
        );
        println!("Training complete.");
    }
}
