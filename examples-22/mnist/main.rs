//! The MNIST DDP trainer (document 000) on Burn 0.22: the hand-written loop of
//! examples/mnist (a two-conv CNN, cross-entropy, AdamW lr 1e-3, per-process
//! batch 128, a DistributedSampler with `set_epoch`, the average loss
//! all-reduced, test accuracy over a test set sharded without duplicates,
//! the final model saved by rank 0), written against burn-ddp-22, with the
//! same flags.
//!
//! ```text
//! burn-ddp-run --standalone --nproc-per-node 2 target/release/examples/mnist22 \
//!     --epochs 2 --data-dir ../shared/data/mnist
//! ```

#[path = "../device.rs"]
mod device;
mod learner;
mod net;

use burn::data::dataloader::{batcher::Batcher, DataLoader, DataLoaderBuilder};
use burn::data::dataset::{Dataset, DatasetError};
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamWConfig, GradientsParams};
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_ddp_22::collective::ReduceOp;
use burn_ddp_22::data::DistributedDataset;
use burn_ddp_examples_common as common;
use clap::Parser;
use common::idx;
use common::mnist::{MnistArgs, MnistTrainingConfig};
use common::stopped::Stopped;
use common::{fail, run_config};
use net::Net;
use std::sync::Arc;
use std::time::Instant;

/// One split of MNIST as a Burn dataset over shared pixel buffers.
#[derive(Clone)]
struct Mnist {
    split: Arc<idx::Split>,
}

#[derive(Clone, Debug)]
struct MnistItem {
    image: Arc<[u8]>,
    label: u8,
}

impl Dataset<MnistItem> for Mnist {
    fn get(&self, index: usize) -> Result<MnistItem, DatasetError> {
        let pixels = self.split.pixels();
        Ok(MnistItem {
            image: Arc::from(&self.split.images[index * pixels..(index + 1) * pixels]),
            label: self.split.labels[index],
        })
    }

    fn len(&self) -> usize {
        self.split.len()
    }
}

/// `ToTensor()` then `Normalize((0.1307,), (0.3081,))`.
#[derive(Clone)]
struct MnistBatcher;

impl Batcher<MnistItem, (Tensor<4>, Tensor<1, Int>)> for MnistBatcher {
    fn batch(&self, items: Vec<MnistItem>, device: &Device) -> (Tensor<4>, Tensor<1, Int>) {
        let n = items.len();
        let pixels: Vec<f32> = items
            .iter()
            .flat_map(|item| {
                item.image
                    .iter()
                    .map(|p| (*p as f32 / 255.0 - 0.1307) / 0.3081)
            })
            .collect();
        let labels: Vec<i64> = items.iter().map(|item| item.label as i64).collect();
        (
            Tensor::from_data(TensorData::new(pixels, [n, 1, 28, 28]), device),
            Tensor::from_data(TensorData::new(labels, [n]), device),
        )
    }
}

fn main() {
    let args = MnistArgs::parse();
    // With --learner, Burn's Learner sends rank 0's messages to experiment.log;
    // the other ranks (and the hand-written loop) print warnings and errors.
    if !args.learner || burn_ddp_22::group::LaunchEnv::from_env().is_ok_and(|env| env.rank != 0) {
        common::cli::init_logger();
    }
    if !args.learner && (args.checkpoint_dir.is_some() || args.resume.is_some()) {
        fail(
            None,
            "--checkpoint-dir/--resume: snapshots of the Burn 0.22 hand-written MNIST loop are \
             not built yet; resume through the Learner (--learner --resume auto), or run \
             examples/mnist on Burn 0.21",
        );
    }
    let device = device::for_backend(args.backend, "mnist");
    if args.learner {
        learner::train(&args, device);
    } else {
        train(&args, device);
    }
}

/// This rank's copy of both splits, limited by --train-samples/--test-samples.
fn load(args: &MnistArgs, rank: usize) -> (Mnist, Mnist) {
    let dir = args
        .data_dir
        .clone()
        .unwrap_or_else(idx::burn_dataset_cache);
    let read = |prefix| {
        idx::load_split(&dir, prefix).unwrap_or_else(|e| {
            let hint = if args.data_dir.is_none() {
                " (no --data-dir given, so burn-dataset's cache was read; this trainer \
                 does not download: give --data-dir with the four MNIST IDX files)"
            } else {
                ""
            };
            fail(Some(rank), format!("{e}{hint}"))
        })
    };
    let (mut train, mut test) = (read("train"), read("t10k"));
    if let Some(n) = args.train_samples {
        train.truncate(n);
    }
    if let Some(n) = args.test_samples {
        test.truncate(n);
    }
    (
        Mnist {
            split: Arc::new(train),
        },
        Mnist {
            split: Arc::new(test),
        },
    )
}

fn train(args: &MnistArgs, device: Device) {
    let MnistArgs {
        epochs,
        lr,
        seed,
        max_steps,
        ..
    } = *args;

    let group = burn_ddp_22::init_process_group().unwrap_or_else(|e| fail(None, e));
    let (rank, world_size) = (group.rank(), group.world_size());
    // Each rank's loader batch: --batch-size, or its share of --global-batch-size.
    let batch_size = match args.global_batch_size {
        Some(global) => {
            burn_ddp_22::data::batch_size_per_rank(&group, global).unwrap_or_else(|e| fail(None, e))
        }
        None => args.batch_size,
    };
    let (train_set, test_set) = load(args, rank);
    let config =
        MnistTrainingConfig::new(epochs, batch_size, world_size, lr, seed, train_set.len())
            .with_max_steps(max_steps);

    let sampler = burn_ddp_22::distributed_sampler(&group, train_set.len())
        .unwrap_or_else(|e| fail(Some(rank), e))
        .seed(seed);
    let shard = DistributedDataset::new(train_set, sampler);
    let epoch_handle = shard.epoch_handle();
    let shard_len = shard.len();
    let train_loader = DataLoaderBuilder::new(MnistBatcher)
        .batch_size(batch_size)
        .set_device(device.clone())
        .build(shard);
    // The test set is split without padding, so summed counts are exact.
    let test_sampler = burn_ddp_22::data::evaluation_sampler(&group, test_set.len())
        .unwrap_or_else(|e| fail(Some(rank), e));
    let test_loader = DataLoaderBuilder::new(MnistBatcher)
        .batch_size(args.test_batch_size)
        .set_device(device.clone().inner())
        .build(DistributedDataset::new(test_set, test_sampler));

    device.seed(seed);
    let mut model =
        burn_ddp_22::wrap(Net::new(&device), &group).unwrap_or_else(|e| fail(Some(rank), e));
    let mut optimizer = AdamWConfig::new().init();
    let loss_fn = CrossEntropyLossConfig::new().init(&device);

    // Ctrl-C or SIGTERM: every rank stops before the same step (asked each
    // step) and rank 0 saves the model trained so far.
    burn_ddp_22::stop::catch_stop_signals();
    let mut stopped = None;
    'training: for epoch in 0..epochs {
        epoch_handle.set_epoch(epoch);
        let started = Instant::now();
        let steps_per_epoch = shard_len
            .div_ceil(batch_size)
            .min(max_steps.unwrap_or(usize::MAX));
        let (mut total_loss, mut steps, mut samples) = (0.0f64, 0usize, 0usize);
        for batch in train_loader.iter().take(steps_per_epoch) {
            if let Some(signal) =
                burn_ddp_22::stop::stop_requested(&group).unwrap_or_else(|e| fail(Some(rank), e))
            {
                stopped = Some(Stopped {
                    signal,
                    epoch,
                    step: steps,
                });
                break 'training;
            }
            let (images, targets) = batch.unwrap_or_else(|e| fail(Some(rank), e));
            samples += targets.dims()[0];
            let loss = loss_fn.forward(model.forward(images), targets);
            total_loss += loss.clone().into_scalar::<f64>();
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            let grads =
                burn_ddp_22::sync_gradients(&model, grads).unwrap_or_else(|e| fail(Some(rank), e));
            model = optimizer.step(lr, model, grads);
            steps += 1;
        }
        // avg = all_reduce(total_loss / len(loader)) / world_size, as the document computes it.
        let mut average = [total_loss / steps.max(1) as f64];
        group
            .all_reduce(&mut average, ReduceOp::Sum)
            .unwrap_or_else(|e| fail(Some(rank), e));
        let average = average[0] / world_size as f64;
        let [all_samples] = burn_ddp_22::data::sum_over_ranks(&group, [samples])
            .unwrap_or_else(|e| fail(Some(rank), e));
        let elapsed = started.elapsed().as_secs_f64();
        let (correct, total) = evaluate(&model, test_loader.as_ref(), rank);
        let [correct, total] = burn_ddp_22::data::sum_over_ranks(&group, [correct, total])
            .unwrap_or_else(|e| fail(Some(rank), e));
        if group.is_main() {
            println!(
                "epoch={epoch} avg_loss={average:.4} test_acc={:.2}% epoch_time={elapsed:.1}s samples/s={:.0}",
                100.0 * correct as f64 / total.max(1) as f64,
                all_samples as f64 / elapsed
            );
        }
    }

    if let Some(stop) = stopped {
        println!("{}", stop.rank_line(rank));
    }
    if group.is_main() {
        let epochs_done = stopped.map_or(epochs, |stop| stop.epoch);
        let path = burn_ddp_22::checkpoint::save_atomic(&args.output, &model, None, epochs_done)
            .unwrap_or_else(|e| fail(Some(rank), e));
        run_config::save(&config, &args.output.with_extension("config.json"))
            .unwrap_or_else(|e| fail(Some(rank), e));
        println!("saved {}", path.display());
        if let Some(stop) = stopped {
            println!(
                "{}; the model saved is the one trained so far",
                stop.describe()
            );
        }
    }
    burn_ddp_22::destroy_process_group().unwrap_or_else(|e| fail(Some(rank), e));
    if let Some(stop) = stopped {
        std::process::exit(stop.exit_code());
    }
}

/// Correct predictions and samples seen on this rank's test shard (on the
/// model's validation snapshot, without autodiff).
fn evaluate(
    model: &Net,
    loader: &dyn DataLoader<(Tensor<4>, Tensor<1, Int>)>,
    rank: usize,
) -> (i64, i64) {
    let model = model.valid();
    let (mut correct, mut total) = (0i64, 0i64);
    for batch in loader.iter() {
        let (images, targets) = batch.unwrap_or_else(|e| fail(Some(rank), e));
        total += targets.dims()[0] as i64;
        let predicted = model.forward(images).argmax(1).flatten::<1>(0, 1);
        correct += predicted.equal(targets).int().sum().into_scalar::<i64>();
    }
    (correct, total)
}
