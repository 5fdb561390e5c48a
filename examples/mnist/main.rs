//! Port of the MNIST DDP trainer (document 000): a two-conv CNN, cross-entropy,
//! AdamW (lr 1e-3), per-process batch 128, a DistributedSampler with
//! `set_epoch`, the average loss all-reduced and printed by rank 0, and the
//! final model saved by rank 0 as `mnist_ddp.mpk`. Test accuracy is measured on
//! a test set sharded across ranks without duplicates.
//!
//! ```text
//! burn-ddp-run --standalone --nproc-per-node 2 target/release/examples/mnist \
//!     --epochs 2 --data-dir ../shared/data/mnist
//! ```

#[macro_use]
#[path = "../shared/backend.rs"]
mod backend;
mod learner;
mod net;
mod source;

use burn_ddp_examples_common as common;
use common::idx;
use common::mnist::{MnistArgs, MnistTrainingConfig, ResumeFrom};

/// Beside the hand-written loop's snapshots.
const SNAPSHOT_CONFIG_FILE: &str = "mnist_config.json";
use burn::data::dataloader::{batcher::Batcher, DataLoaderBuilder};
use burn::data::dataset::Dataset;
use burn::module::{AutodiffModule, Module};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use burn_ddp::collective::ReduceOp;
use burn_ddp::data::DistributedDataset;
use clap::Parser;
use common::stopped::Stopped;
use common::{fail, run_config};
use net::Net;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Instant;

/// One split of MNIST as a Burn dataset of indices into shared pixel buffers.
#[derive(Clone)]
pub struct Mnist {
    split: Arc<idx::Split>,
}

#[derive(Clone, Debug)]
pub struct MnistItem {
    split: Arc<[u8]>,
    label: u8,
}

impl Dataset<MnistItem> for Mnist {
    fn get(&self, index: usize) -> Option<MnistItem> {
        let pixels = self.split.pixels();
        let image = self
            .split
            .images
            .get(index * pixels..(index + 1) * pixels)?;
        Some(MnistItem {
            split: Arc::from(image),
            label: self.split.labels[index],
        })
    }

    fn len(&self) -> usize {
        self.split.len()
    }
}

/// `ToTensor()` then `Normalize((0.1307,), (0.3081,))`.
#[derive(Clone)]
pub struct MnistBatcher;

impl<B: Backend> Batcher<B, MnistItem, (Tensor<B, 4>, Tensor<B, 1, Int>)> for MnistBatcher {
    fn batch(
        &self,
        items: Vec<MnistItem>,
        device: &B::Device,
    ) -> (Tensor<B, 4>, Tensor<B, 1, Int>) {
        let n = items.len();
        let pixels: Vec<f32> = items
            .iter()
            .flat_map(|item| {
                item.split
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
    if args.learner {
        // Burn's Learner sends rank 0's messages to experiment.log; the other
        // ranks print warnings and errors.
        if burn_ddp::group::LaunchEnv::from_env().is_ok_and(|env| env.rank != 0) {
            common::cli::init_logger();
        }
        run_on_backend!(args, train_learner);
    } else {
        common::cli::init_logger();
        run_on_backend!(args, train);
    }
}

fn train_learner<B: AutodiffBackend>(args: &MnistArgs, device: B::Device) {
    learner::train::<B>(args, device)
}

/// This rank's copy of both splits, limited by --train-samples/--test-samples.
fn load(args: &MnistArgs, group: &burn_ddp::ProcessGroup) -> (Mnist, Mnist) {
    let rank = group.rank();
    let (mut train, mut test) = source::load(
        args.data_dir.as_deref(),
        std::time::Duration::from_secs(args.download_timeout),
        group,
    )
    .unwrap_or_else(|e| fail(Some(rank), e));
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

fn train<B: AutodiffBackend>(args: &MnistArgs, device: B::Device) {
    let MnistArgs {
        epochs,
        lr,
        seed,
        max_steps,
        ..
    } = *args;

    let group = burn_ddp::init_process_group().unwrap_or_else(|e| fail(None, e));
    let (rank, world_size) = (group.rank(), group.world_size());
    // Each rank's loader batch: --batch-size, or its share of --global-batch-size.
    let batch_size = match args.global_batch_size {
        Some(global) => {
            burn_ddp::data::batch_size_per_rank(&group, global).unwrap_or_else(|e| fail(None, e))
        }
        None => args.batch_size,
    };
    let (train_set, test_set) = load(args, &group);
    let config =
        MnistTrainingConfig::new(epochs, batch_size, world_size, lr, seed, train_set.len())
            .with_max_steps(max_steps);
    let snapshots = args.checkpoint_dir.as_deref();
    if args.resume.is_some() && snapshots.is_none() {
        fail(
            Some(rank),
            "--resume without --learner resumes from --checkpoint-dir's snapshots: give \
             --checkpoint-dir DIR",
        );
    }

    let sampler = burn_ddp::distributed_sampler(&group, train_set.len())
        .unwrap_or_else(|e| fail(Some(rank), e))
        .seed(seed);
    let shard = DistributedDataset::new(train_set, sampler);
    let epoch_handle = shard.epoch_handle();
    let shard_len = shard.len();
    let train_loader = DataLoaderBuilder::<B, _, _>::new(MnistBatcher)
        .batch_size(batch_size)
        .set_device(device.clone())
        .build(shard);
    // The test set is split without padding, so summed counts are exact.
    let test_sampler = burn_ddp::data::evaluation_sampler(&group, test_set.len())
        .unwrap_or_else(|e| fail(Some(rank), e));
    let test_loader = DataLoaderBuilder::<B::InnerBackend, _, _>::new(MnistBatcher)
        .batch_size(args.test_batch_size)
        .set_device(device.clone())
        .build(DistributedDataset::new(test_set, test_sampler));

    // Where to go on from, chosen before the model draws its initial weights.
    let resume = match (args.resume, snapshots) {
        (Some(ResumeFrom::Auto), Some(dir)) => common::resume::newest_snapshot(
            &group,
            dir,
            "mpk",
            &config,
            &dir.join(SNAPSHOT_CONFIG_FILE),
            &["epochs"],
            |snapshot| load_snapshot::<B>(&snapshot.path, &device).map(|_| ()),
        ),
        (Some(ResumeFrom::Epoch(epoch)), Some(dir)) => {
            Some(common::resume::snapshot_path(dir, epoch))
        }
        _ => None,
    };
    if let (Some(dir), true) = (snapshots, group.is_main()) {
        // Refused here, before the first step, when the folder cannot be written.
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("--checkpoint-dir {}: {e}", dir.display()))
            .and_then(|()| run_config::save(&config, &dir.join(SNAPSHOT_CONFIG_FILE)))
            .unwrap_or_else(|e| fail(Some(rank), e));
    }
    B::seed(&device, seed);
    let mut model = Net::<B>::new(&device);
    let mut optimizer = AdamWConfig::new().init();
    let mut first_epoch = 0;
    if let Some(path) = &resume {
        let (loaded, optimizer_record, epochs_done) =
            load_snapshot::<B>(path, &device).unwrap_or_else(|e| fail(Some(rank), e));
        model = loaded;
        optimizer = optimizer.load_record(optimizer_record);
        first_epoch = epochs_done;
        if group.is_main() {
            println!("Resumed from {} at epoch {first_epoch}", path.display());
        }
    }
    let mut model = burn_ddp::wrap(model, &group).unwrap_or_else(|e| fail(Some(rank), e));
    let loss_fn = CrossEntropyLossConfig::new().init(&device);

    // Ctrl-C or SIGTERM: every rank stops before the same step (asked each
    // step) and rank 0 saves the model trained so far.
    burn_ddp::stop::catch_stop_signals();
    let mut stopped = None;
    'training: for epoch in first_epoch..epochs {
        epoch_handle.set_epoch(epoch);
        let started = Instant::now();
        let steps_per_epoch = shard_len
            .div_ceil(batch_size)
            .min(max_steps.unwrap_or(usize::MAX));
        let progress = progress_bar(group.is_main(), steps_per_epoch, epoch);
        let (mut total_loss, mut steps, mut samples) = (0.0f64, 0usize, 0usize);
        for (images, targets) in train_loader.iter().take(steps_per_epoch) {
            if let Some(signal) =
                burn_ddp::stop::stop_requested(&group).unwrap_or_else(|e| fail(Some(rank), e))
            {
                if let Some(bar) = &progress {
                    bar.finish_and_clear();
                }
                stopped = Some(Stopped {
                    signal,
                    epoch,
                    step: steps,
                });
                break 'training;
            }
            samples += targets.dims()[0];
            let logits = model.forward(images);
            let loss = loss_fn.forward(logits, targets);
            total_loss += loss.clone().into_scalar().elem::<f64>();
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            model = optimizer.step(lr, model, grads);
            steps += 1;
            if let Some(bar) = &progress {
                bar.inc(1);
            }
        }
        if let Some(bar) = progress {
            bar.finish_and_clear();
        }
        // avg = all_reduce(total_loss / len(loader)) / world_size, as the document computes it.
        let mut average = [total_loss / steps.max(1) as f64];
        group
            .all_reduce(&mut average, ReduceOp::Sum)
            .unwrap_or_else(|e| fail(Some(rank), e));
        let average = average[0] / world_size as f64;
        let [all_samples] = burn_ddp::data::sum_over_ranks(&group, [samples])
            .unwrap_or_else(|e| fail(Some(rank), e));
        let elapsed = started.elapsed().as_secs_f64();
        let (correct, total) = evaluate(&model.valid(), test_loader.as_ref());
        let [correct, total] = burn_ddp::data::sum_over_ranks(&group, [correct, total])
            .unwrap_or_else(|e| fail(Some(rank), e));
        if group.is_main() {
            println!(
                "epoch={epoch} avg_loss={average:.4} test_acc={:.2}% epoch_time={elapsed:.1}s samples/s={:.0}",
                100.0 * correct as f64 / total.max(1) as f64,
                all_samples as f64 / elapsed
            );
        }
        if let Some(dir) = snapshots.filter(|_| (epoch + 1) % args.save_interval == 0) {
            if group.is_main() {
                let record = (
                    model.clone().into_record(),
                    optimizer.to_record(),
                    epoch + 1,
                );
                let path = common::resume::snapshot_path(dir, epoch + 1);
                burn_ddp::checkpoint::save_atomic::<B, _>(record, path)
                    .unwrap_or_else(|e| fail(Some(rank), e));
            }
            // Every rank goes on once the snapshot is whole.
            group.barrier().unwrap_or_else(|e| fail(Some(rank), e));
        }
    }

    if let Some(stop) = stopped {
        println!("{}", stop.rank_line(rank));
    }
    if group.is_main() {
        // Equal for two runs exactly when they ended with the same parameters.
        println!(
            "parameters fingerprint: {:016x}",
            burn_ddp::replicas::parameters_fingerprint(&model)
        );
        let path = burn_ddp::checkpoint::save_atomic::<B, _>(model.into_record(), &args.output)
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
    burn_ddp::destroy_process_group().unwrap_or_else(|e| fail(Some(rank), e));
    if let Some(stop) = stopped {
        std::process::exit(stop.exit_code());
    }
}

/// The model, optimizer state and epochs done of a snapshot, the model's
/// shapes checked; an error says what it means for a resume.
#[allow(clippy::type_complexity)]
fn load_snapshot<B: AutodiffBackend>(
    path: &std::path::Path,
    device: &B::Device,
) -> Result<
    (
        Net<B>,
        <burn::optim::adaptor::OptimizerAdaptor<burn::optim::AdamW, Net<B>, B> as Optimizer<
            Net<B>,
            B,
        >>::Record,
        usize,
    ),
    burn_ddp::snapshots::LoadError,
> {
    let (model_record, optimizer_record, epochs_done): (_, _, usize) =
        burn_ddp::checkpoint::load::<B, _>(path, device).map_err(|e| e.for_snapshot())?;
    let model =
        burn_ddp::checkpoint::load_record_checked(Net::<B>::new(device), model_record, path)
            .map_err(|e| e.for_snapshot())?;
    Ok((model, optimizer_record, epochs_done))
}

/// Correct predictions and samples seen on this rank's test shard.
fn evaluate<B: Backend>(
    model: &Net<B>,
    loader: &dyn burn::data::dataloader::DataLoader<B, (Tensor<B, 4>, Tensor<B, 1, Int>)>,
) -> (i64, i64) {
    let (mut correct, mut total) = (0i64, 0i64);
    for (images, targets) in loader.iter() {
        total += targets.dims()[0] as i64;
        let predicted = model.forward(images).argmax(1).flatten::<1>(0, 1);
        correct += predicted
            .equal(targets)
            .int()
            .sum()
            .into_scalar()
            .elem::<i64>();
    }
    (correct, total)
}

/// A bar on rank 0 when a person is watching (stderr is a terminal).
fn progress_bar(main: bool, steps: usize, epoch: usize) -> Option<indicatif::ProgressBar> {
    if !main || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(steps as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "epoch {msg} [{bar:30}] {pos}/{len} steps, {per_sec}, eta {eta}",
        )
        .unwrap()
        .progress_chars("=> "),
    );
    bar.set_message(epoch.to_string());
    Some(bar)
}
