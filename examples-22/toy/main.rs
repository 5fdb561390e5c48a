//! The ToyModel DDP trainer (document 003) on Burn 0.22: the same program,
//! flags and checkpoints as examples/toy, written against burn-ddp-22. The
//! one line that differs in the loop is `sync_gradients` before the
//! optimizer step (Burn 0.22 has no backend decorator to average inside
//! `backward()`).
//!
//! ```text
//! cargo run --release -p burn-ddp-22-examples --example toy22                  # one process
//! burn-ddp-run --standalone --nproc-per-node 2 target/release/examples/toy22 --epochs 10
//! ```

#[path = "../device.rs"]
pub(crate) mod device;

use burn::data::dataloader::{batcher::Batcher, DataLoaderBuilder};
use burn::data::dataset::{Dataset, DatasetError};
use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig};
use burn::optim::{GradientsParams, ModuleOptimizer, SgdConfig};
use burn::tensor::{Device, Tensor, TensorData};
use burn_ddp_22::collective::ReduceOp;
use burn_ddp_22::data::DistributedDataset;
use burn_ddp_examples_common as common;
use clap::Parser;
use common::stopped::Stopped;
use common::toy::{toy_data, ToyProgram, ToyTrainingConfig, CONFIG_FILE};
use common::{fail, run_config};
use std::path::{Path, PathBuf};

/// This program, for its command line: `--backend`'s default is Flex (Burn
/// 0.22 has no NdArray).
#[derive(Clone, Debug)]
pub(crate) struct Burn022Toy;

impl ToyProgram for Burn022Toy {
    const DEFAULT_BACKEND: &'static str = "flex";
}

/// The toy trainer's command line, with this program's `--backend` default.
pub(crate) type ToyArgs = common::toy::ToyArgs<Burn022Toy>;

/// The document's ToyModel.
#[derive(Module, Debug)]
struct ToyModel {
    linear: Linear,
}

impl ToyModel {
    fn new(device: &Device) -> Self {
        Self {
            linear: LinearConfig::new(10, 1).init(device),
        }
    }

    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.linear.forward(x)
    }
}

/// The document's ToyDataset ([`toy_data`]).
struct ToyDataset {
    features: Vec<[f32; 10]>,
    labels: Vec<f32>,
}

#[derive(Clone, Debug)]
struct ToyItem {
    features: [f32; 10],
    label: f32,
}

impl Dataset<ToyItem> for ToyDataset {
    fn get(&self, index: usize) -> Result<ToyItem, DatasetError> {
        Ok(ToyItem {
            features: self.features[index],
            label: self.labels[index],
        })
    }

    fn len(&self) -> usize {
        self.labels.len()
    }
}

#[derive(Clone)]
struct ToyBatcher;

impl Batcher<ToyItem, (Tensor<2>, Tensor<2>)> for ToyBatcher {
    fn batch(&self, items: Vec<ToyItem>, device: &Device) -> (Tensor<2>, Tensor<2>) {
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
    let device = device::for_backend(args.backend, "toy");
    train(&args, device);
}

/// Rank 0 saves `model_epoch_{epochs_done}` atomically and says where.
fn save(
    dir: &Path,
    model: &ToyModel,
    optimizer: &ModuleOptimizer,
    epochs_done: usize,
    rank: usize,
) -> PathBuf {
    let path = common::resume::snapshot_path(dir, epochs_done);
    let path = burn_ddp_22::checkpoint::save_atomic(path, model, Some(optimizer), epochs_done)
        .unwrap_or_else(|e| fail(Some(rank), e));
    println!("Rank {rank} saved checkpoint to {}", path.display());
    path
}

pub(crate) fn train(args: &ToyArgs, device: Device) {
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

    let group = burn_ddp_22::init_process_group().unwrap_or_else(|e| fail(None, e));
    let (rank, world_size) = (group.rank(), group.world_size());
    // Each rank's loader batch: --batch-size, or its share of --global-batch-size.
    let batch_size = match args.global_batch_size {
        Some(global) => {
            burn_ddp_22::data::batch_size_per_rank(&group, global).unwrap_or_else(|e| fail(None, e))
        }
        None => args.batch_size,
    };
    let config = ToyTrainingConfig::new(epochs, batch_size, world_size, lr, dataset_size, seed);

    // 1. Dataset and sampler: this rank's shard, reshuffled every epoch.
    let (features, labels) = toy_data(dataset_size, seed);
    let dataset = ToyDataset { features, labels };
    let sampler = burn_ddp_22::distributed_sampler(&group, dataset.len())
        .unwrap_or_else(|e| fail(Some(rank), e));
    let shard = DistributedDataset::new(dataset, sampler);
    let epoch_handle = shard.epoch_handle();
    let loader = DataLoaderBuilder::new(ToyBatcher)
        .batch_size(batch_size)
        .set_device(device.clone())
        .build(shard);

    // 2. Model and optimizer, resumed on every rank before wrapping.
    let resume = match args.resume.as_deref() {
        // The newest snapshot that loads into this model, the same for every rank.
        Some(path) if path == Path::new("auto") => common::resume::newest_snapshot(
            &group,
            checkpoint_dir,
            burn_ddp_22::checkpoint::EXTENSION,
            &config,
            &checkpoint_dir.join(CONFIG_FILE),
            &["epochs"],
            |snapshot| {
                let checkpoint =
                    burn_ddp_22::checkpoint::load(&snapshot.path).map_err(|e| e.for_snapshot())?;
                checkpoint
                    .load_model(ToyModel::new(&device))
                    .map_err(|e| e.for_snapshot())?;
                Ok(())
            },
        ),
        other => other.map(Path::to_path_buf),
    };
    device.seed(seed);
    let mut model = ToyModel::new(&device);
    let mut optimizer = SgdConfig::new().init();
    let mut first_epoch = 0;
    if let Some(path) = &resume {
        let checkpoint =
            burn_ddp_22::checkpoint::load(path).unwrap_or_else(|e| fail(Some(rank), e));
        model = checkpoint
            .load_model(model)
            .unwrap_or_else(|e| fail(Some(rank), e));
        optimizer = checkpoint
            .load_optimizer(optimizer)
            .unwrap_or_else(|e| fail(Some(rank), e));
        first_epoch = checkpoint.epoch;
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
    let mut model = burn_ddp_22::wrap(model, &group).unwrap_or_else(|e| fail(Some(rank), e));
    let criterion = MseLoss::new();

    // Ctrl-C or SIGTERM: every rank stops before the same step (asked each step).
    burn_ddp_22::stop::catch_stop_signals();
    let mut stopped = None;
    let mut last_saved = None;
    println!("Rank {rank} starting training...");
    'training: for epoch in first_epoch..epochs {
        epoch_handle.set_epoch(epoch); // important for shuffling
        let mut epoch_loss = 0.0f64;
        let mut num_batches = 0usize;
        for batch in loader.iter() {
            if let Some(signal) =
                burn_ddp_22::stop::stop_requested(&group).unwrap_or_else(|e| fail(Some(rank), e))
            {
                stopped = Some(Stopped {
                    signal,
                    epoch,
                    step: num_batches,
                });
                break 'training;
            }
            let (features, labels) = batch.unwrap_or_else(|e| fail(Some(rank), e));
            let outputs = model.forward(features);
            let loss = criterion.forward(outputs, labels, Reduction::Mean);
            let mut loss_value = [loss.clone().into_scalar::<f64>()];
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            // Averaged over ranks here (inside backward() on Burn 0.21).
            let grads =
                burn_ddp_22::sync_gradients(&model, grads).unwrap_or_else(|e| fail(Some(rank), e));
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
            last_saved = Some(save(checkpoint_dir, &model, &optimizer, epoch + 1, rank));
        }
        // Every rank finishes the epoch (and rank 0 its checkpoint) before going on.
        group.barrier().unwrap_or_else(|e| fail(Some(rank), e));
    }
    if let Some(stop) = stopped {
        println!("{}", stop.rank_line(rank));
        if group.is_main() {
            // Stopped between epochs: the finished epochs are saved, nothing is lost.
            if stop.step == 0 && stop.epoch > first_epoch && stop.epoch % save_interval != 0 {
                last_saved = Some(save(checkpoint_dir, &model, &optimizer, stop.epoch, rank));
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
        burn_ddp_22::destroy_process_group().unwrap_or_else(|e| fail(Some(rank), e));
        std::process::exit(stop.exit_code());
    }
    burn_ddp_22::destroy_process_group().unwrap_or_else(|e| fail(Some(rank), e));
    let sync = burn_ddp_22::sync::sync_stats();
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
            burn_ddp_22::replicas::parameters_fingerprint(&model)
        );
        println!("Training complete.");
    }
}
