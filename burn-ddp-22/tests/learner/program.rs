//! One rank of a learner test on Burn 0.22: a small classifier trained by
//! Burn's Learner with burn-ddp-22's strategy, and the single-process
//! references it must equal (burn-ddp's tests/learner/program.rs in Burn
//! 0.22's API).

use crate::models::{flat_params, load_params, max_relative_difference};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::{DataLoader, DataLoaderBuilder};
use burn::data::dataset::{Dataset, DatasetError, InMemDataset};
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{AdamWConfig, GradientsAccumulator, GradientsParams, ModuleOptimizer, SgdConfig};
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn::train::checkpoint::{CheckpointingAction, CheckpointingStrategy};
use burn::train::metric::store::{Aggregate, EventStoreClient, Split};
use burn::train::metric::{AccuracyMetric, LossMetric};
use burn::train::{
    ClassificationOutput, EarlyStoppingStrategy, ExecutionStrategy, InferenceStep, Interrupter,
    Learner, LearnerSummary, SupervisedTraining, TrainOutput, TrainStep, TrainingStrategy,
};
use burn_ddp_22::data::DistributedSampler;
use burn_ddp_22::train::{DdpSupervisedTraining, DdpTraining, SilentRenderer, SummaryRenderer};
use burn_ddp_testkit::learner::{
    DIR_VAR, EPOCHS, EPOCHS_VAR, OPTIMIZER_VAR, RESUME_VAR, SHARED_DIR_VAR,
};
use burn_ddp_testkit::numbers::value;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

const TRAIN_ITEMS: usize = 64;
const VALID_ITEMS: usize = 40;
const BATCH: usize = 8;
const VALID_BATCH: usize = 16;
const LR: f64 = 0.05;
const INIT_SEED: u64 = 100;

type Res<T> = Result<T, String>;

fn device() -> Device {
    Device::flex().autodiff()
}

#[derive(Module, Debug)]
pub struct Classifier {
    hidden: Linear,
    out: Linear,
    relu: Relu,
}

impl Classifier {
    fn new(device: &Device) -> Self {
        Self {
            hidden: LinearConfig::new(6, 16).init(device),
            out: LinearConfig::new(16, 3).init(device),
            relu: Relu::new(),
        }
    }

    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.out.forward(self.relu.forward(self.hidden.forward(x)))
    }

    fn classify(&self, (x, targets): Batch) -> ClassificationOutput {
        let output = self.forward(x);
        let loss = CrossEntropyLossConfig::new()
            .init(&output.device())
            .forward(output.clone(), targets.clone());
        ClassificationOutput::new(loss, output, targets)
    }
}

type Batch = (Tensor<2>, Tensor<1, Int>);

impl TrainStep for Classifier {
    type Input = Batch;
    type Output = ClassificationOutput;
    fn step(&self, batch: Batch) -> TrainOutput<ClassificationOutput> {
        let item = self.classify(batch);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl InferenceStep for Classifier {
    type Input = Batch;
    type Output = ClassificationOutput;
    fn step(&self, batch: Batch) -> ClassificationOutput {
        self.classify(batch)
    }
}

/// Item `i` of the synthetic set: six features and one of three classes that
/// depends on them (so accuracy moves).
fn points(offset: usize, n: usize) -> InMemDataset<usize> {
    InMemDataset::new((offset..offset + n).collect())
}

fn batch_of(items: &[usize], device: &Device) -> Batch {
    let x: Vec<f32> = items
        .iter()
        .flat_map(|&i| (0..6).map(move |f| value(i, f)))
        .collect();
    let y: Vec<i64> = items
        .iter()
        .map(|&i| {
            if value(i, 0) + value(i, 1) > 0.3 {
                0
            } else if value(i, 2) > 0.0 {
                1
            } else {
                2
            }
        })
        .collect();
    (
        Tensor::from_data(TensorData::new(x, [items.len(), 6]), device),
        Tensor::from_data(TensorData::new(y, [items.len()]), device),
    )
}

/// Counts batches; on the rank named by `INTERRUPT`, stops the interrupter while
/// fetching batch number `INTERRUPT_AT` (1-based).
#[derive(Clone)]
struct PointBatcher;

static BATCHES: AtomicUsize = AtomicUsize::new(0);
static INTERRUPT: OnceLock<(Interrupter, usize)> = OnceLock::new();

impl Batcher<usize, Batch> for PointBatcher {
    fn batch(&self, items: Vec<usize>, device: &Device) -> Batch {
        let n = BATCHES.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some((interrupter, at)) = INTERRUPT.get() {
            if n == *at {
                interrupter.stop(Some("test interrupt"));
            }
        }
        batch_of(&items, device)
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn print_params<M: Module>(model: &M) {
    let bits: Vec<String> = flat_params(model)
        .iter()
        .map(|v| format!("{:08x}", v.to_bits()))
        .collect();
    println!("params {}", bits.join(","));
}

/// The rank's model: rank 0 starts from the reference's initial parameters, the
/// others from another seed (the strategy must broadcast rank 0's).
fn initial(rank: usize, device: &Device) -> Classifier {
    let start = reference_start();
    let model = Classifier::new(device);
    if rank == 0 {
        load_params(model, &flat_params(&start))
    } else {
        model
    }
}

fn reference_start() -> Classifier {
    let device = device();
    device.seed(INIT_SEED);
    Classifier::new(&device)
}

struct Run {
    ddp: DdpTraining,
    rank: usize,
    dir: PathBuf,
}

fn setup() -> Res<Run> {
    let group = burn_ddp_22::init_process_group().map_err(|e| e.to_string())?;
    let base = PathBuf::from(std::env::var(DIR_VAR).map_err(|_| "no test dir")?);
    let rank = group.rank();
    let dir = if std::env::var_os(SHARED_DIR_VAR).is_some() {
        base
    } else {
        base.join(format!("rank{rank}"))
    };
    Ok(Run {
        ddp: DdpTraining::new(&group, &dir),
        rank,
        dir,
    })
}

type Loaders = (Arc<dyn DataLoader<Batch>>, Arc<dyn DataLoader<Batch>>);

fn loaders(run: &Run, batch: usize) -> Res<Loaders> {
    let train = run
        .ddp
        .shard(points(0, TRAIN_ITEMS))
        .map_err(|e| e.to_string())?;
    let valid = run
        .ddp
        .shard_eval(points(1000, VALID_ITEMS))
        .map_err(|e| e.to_string())?;
    Ok((
        DataLoaderBuilder::new(PointBatcher)
            .batch_size(batch)
            .build(train),
        DataLoaderBuilder::new(PointBatcher)
            .batch_size(VALID_BATCH)
            .build(valid),
    ))
}

pub fn run(name: &str) -> Res<()> {
    match name {
        "against_reference" => against_reference(),
        "train" => train_and_resume(),
        "early_stop" => early_stop(),
        "interrupt_rank_1" => interrupt_rank_1(),
        "loader_error_rank_1" => loader_error_rank_1(),
        "artifact_dir" => artifact_dir(),
        "accumulation" => accumulation(),
        "unequal" => unequal(),
        "single_device_parity" => single_device_parity(),
        other => Err(format!("unknown scenario {other}")),
    }
}

/// One process with batch `world * batch` (sums of `accumulate` micro-batches,
/// and at an epoch's end the sum of what is left, as Burn 0.22 applies it)
/// over the order the ranks' samplers give, epoch by epoch.
fn reference(
    world: usize,
    batch: usize,
    accumulate: usize,
    epochs: usize,
    mut optimizer: ModuleOptimizer,
) -> Classifier {
    let device = device();
    let mut model = reference_start();
    for epoch in 1..=epochs {
        let shards: Vec<Vec<usize>> = (0..world)
            .map(|rank| {
                let mut sampler = DistributedSampler::new(TRAIN_ITEMS, world, rank).unwrap();
                sampler.set_epoch(epoch - 1);
                sampler.indices()
            })
            .collect();
        let mut accumulator = GradientsAccumulator::new();
        let mut pending = 0;
        for step in 0..shards[0].len() / batch {
            let items: Vec<usize> = shards
                .iter()
                .flat_map(|shard| shard[step * batch..(step + 1) * batch].iter().copied())
                .collect();
            let output = model.classify(batch_of(&items, &device));
            let grads = GradientsParams::from_grads(output.loss.backward(), &model);
            accumulator.accumulate(&model, grads);
            pending += 1;
            if pending == accumulate {
                pending = 0;
                model = optimizer.step(LR, model, accumulator.grads());
            }
        }
        if pending > 0 {
            model = optimizer.step(LR, model, accumulator.grads());
        }
    }
    model
}

fn valid_accuracy(model: &Classifier) -> f64 {
    let items: Vec<usize> = (1000..1000 + VALID_ITEMS).collect();
    let (x, targets) = batch_of(&items, &Device::flex());
    let correct: i64 = model
        .forward(x)
        .argmax(1)
        .flatten::<1>(0, 1)
        .equal(targets)
        .int()
        .sum()
        .into_scalar();
    100.0 * correct as f64 / VALID_ITEMS as f64
}

/// Prints the end-of-training summary's last valid entries in full
/// precision (`summary_valid_<metric>`).
fn print_summary(summary: LearnerSummary) {
    for metric in &summary.metrics.valid {
        if let Some(last) = metric.entries.iter().max_by_key(|entry| entry.step) {
            println!("summary_valid_{} {}", metric.name, last.value);
        }
    }
}

fn launch(run: &Run, optimizer: ModuleOptimizer) -> Res<Classifier> {
    let (train, valid) = loaders(run, BATCH)?;
    let result = SupervisedTraining::new(&run.dir, train, valid)
        .metrics((AccuracyMetric::new(), LossMetric::new()))
        .with_default_checkpointers()
        .num_epochs(EPOCHS)
        .summary()
        .renderer(Box::new(SummaryRenderer::new(print_summary)))
        .ddp(&run.ddp)
        .launch(Learner::new(initial(run.rank, &device()), optimizer, LR));
    Ok(result.model)
}

fn against_reference() -> Res<()> {
    let run = setup()?;
    let world = run.ddp.group().world_size();
    let optimizer = || match std::env::var(OPTIMIZER_VAR).as_deref() {
        Ok("adamw") => AdamWConfig::new().init(),
        _ => SgdConfig::new().init(),
    };
    let trained = launch(&run, optimizer())?;
    let reference = reference(world, BATCH, 1, EPOCHS, optimizer()).valid();
    print_params(&trained);
    println!(
        "max_rel_diff {}",
        max_relative_difference(&flat_params(&trained), &flat_params(&reference))
    );
    println!("reference_valid_accuracy {}", valid_accuracy(&reference));
    burn_ddp_22::destroy_process_group().map_err(|e| e.to_string())
}

fn train_and_resume() -> Res<()> {
    let run = setup()?;
    let (train, valid) = loaders(&run, BATCH)?;
    let mut training = SupervisedTraining::new(&run.dir, train, valid)
        .metrics((AccuracyMetric::new(), LossMetric::new()))
        .with_default_checkpointers()
        .num_epochs(env_usize(EPOCHS_VAR, EPOCHS))
        .with_checkpointing_strategy(StoreProbe)
        .renderer(Box::new(SilentRenderer));
    if let Some(epoch) = std::env::var(RESUME_VAR).ok().and_then(|v| v.parse().ok()) {
        // Burn 0.22's launch loads it on every rank: check every rank has it.
        run.ddp
            .verify_checkpoint(epoch)
            .map_err(|e| e.to_string())?;
        training = training.checkpoint(epoch);
    }
    let model = initial(run.rank, &device());
    let result = training
        .ddp(&run.ddp)
        .launch(Learner::new(model, AdamWConfig::new().init(), LR));
    print_params(&result.model);
    if run.rank == 0 {
        println!(
            "valid_loss_by_epoch {}",
            STORE_SEEN.lock().unwrap().join(",")
        );
    }
    burn_ddp_22::destroy_process_group().map_err(|e| e.to_string())
}

/// What rank 0's metric store answered for every epoch's validation loss at
/// the last checkpoint: what Burn's best-checkpoint and early-stopping
/// strategies see, before a resume included.
static STORE_SEEN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Saves every epoch and records what the store knows.
struct StoreProbe;

impl CheckpointingStrategy for StoreProbe {
    fn checkpointing(
        &mut self,
        epoch: usize,
        store: &EventStoreClient,
    ) -> Vec<CheckpointingAction> {
        *STORE_SEEN.lock().unwrap() = (1..=epoch)
            .map(|e| {
                store
                    .find_metric("Loss", e, Aggregate::Mean, &Split::Valid)
                    .map_or("none".to_string(), |v| v.to_string())
            })
            .collect();
        vec![CheckpointingAction::Save]
    }
}

/// Says stop after epoch 2, but only where it runs on rank 0.
#[derive(Clone)]
struct StopOnRankZero {
    rank: usize,
}

impl EarlyStoppingStrategy for StopOnRankZero {
    fn should_stop(&mut self, epoch: usize, _store: &EventStoreClient) -> bool {
        self.rank == 0 && epoch >= 2
    }
}

fn steps_per_epoch(world: usize, batch: usize) -> usize {
    TRAIN_ITEMS.div_ceil(world) / batch
}

fn early_stop() -> Res<()> {
    let run = setup()?;
    let world = run.ddp.group().world_size();
    let (train, valid) = loaders(&run, BATCH)?;
    burn_ddp_22::reset_sync_stats();
    let result = SupervisedTraining::new(&run.dir, train, valid)
        .metrics((AccuracyMetric::new(), LossMetric::new()))
        .num_epochs(env_usize(EPOCHS_VAR, 10))
        .early_stopping(StopOnRankZero { rank: run.rank })
        .renderer(Box::new(SilentRenderer))
        .ddp(&run.ddp)
        .launch(Learner::new(
            initial(run.rank, &device()),
            SgdConfig::new().init(),
            LR,
        ));
    drop(result);
    let syncs = run.ddp.sync_stats().syncs as usize;
    println!("epochs_run {}", syncs / steps_per_epoch(world, BATCH));
    burn_ddp_22::destroy_process_group().map_err(|e| e.to_string())
}

/// Every rank calls `recreate_artifact_dir` on one shared folder holding a
/// stale file: none of them sees it afterwards (they waited for rank 0's
/// wipe). Rank 0 then writes a file, `create_artifact_dir` keeps it, and a
/// folder under a file is an error on every rank.
fn artifact_dir() -> Res<()> {
    let run = setup()?;
    run.ddp.recreate_artifact_dir().map_err(|e| e.to_string())?;
    println!("stale_left {}", run.dir.join("stale.txt").exists());
    if run.rank == 0 {
        std::fs::write(run.dir.join("fresh.txt"), "rank 0").map_err(|e| e.to_string())?;
    }
    run.ddp.group().barrier().map_err(|e| e.to_string())?;
    run.ddp.create_artifact_dir().map_err(|e| e.to_string())?;
    println!("fresh_kept {}", run.dir.join("fresh.txt").exists());
    let impossible = DdpTraining::new(run.ddp.group(), run.dir.join("fresh.txt").join("sub"));
    match impossible.recreate_artifact_dir() {
        Ok(()) => return Err("a folder under a file was created".into()),
        Err(err) => println!("prepare_error {err}"),
    }
    burn_ddp_22::destroy_process_group().map_err(|e| e.to_string())
}

fn interrupt_rank_1() -> Res<()> {
    let run = setup()?;
    let (train, valid) = loaders(&run, BATCH)?;
    let training = SupervisedTraining::new(&run.dir, train, valid)
        .metrics((AccuracyMetric::new(), LossMetric::new()))
        .num_epochs(env_usize(EPOCHS_VAR, 3))
        .renderer(Box::new(SilentRenderer));
    if run.rank == 1 {
        let _ = INTERRUPT.set((training.interrupter(), 5));
    }
    let result = training.ddp(&run.ddp).launch(Learner::new(
        initial(run.rank, &device()),
        SgdConfig::new().init(),
        LR,
    ));
    drop(result);
    println!("optimizer_steps {}", run.ddp.sync_stats().syncs);
    burn_ddp_22::destroy_process_group().map_err(|e| e.to_string())
}

/// The training set of a rank whose data breaks: reading its `fail_at`-th
/// item (1-based, counted over the run) is an error, as a missing or
/// corrupt file is in a real dataset.
struct Breaking {
    inner: InMemDataset<usize>,
    fail_at: usize,
    read: AtomicUsize,
}

impl Dataset<usize> for Breaking {
    fn get(&self, index: usize) -> Result<usize, DatasetError> {
        if self.read.fetch_add(1, Ordering::SeqCst) + 1 == self.fail_at {
            return Err(DatasetError::new(std::io::Error::other(
                "item 33 cannot be read (test)",
            )));
        }
        self.inner.get(index)
    }

    fn len(&self) -> usize {
        self.inner.len()
    }
}

/// Rank 1's dataset fails in its 5th batch (item 33 of batch 8): every rank
/// stops before that iteration, after 4 optimizer steps; rank 1's result
/// carries the error, rank 0's says which rank stopped.
fn loader_error_rank_1() -> Res<()> {
    let run = setup()?;
    let fail_at = if run.rank == 1 { 33 } else { usize::MAX };
    let train = run.ddp.shard(Breaking {
        inner: points(0, TRAIN_ITEMS),
        fail_at,
        read: AtomicUsize::new(0),
    });
    let valid = run
        .ddp
        .shard_eval(points(1000, VALID_ITEMS))
        .map_err(|e| e.to_string())?;
    let result = SupervisedTraining::new(
        &run.dir,
        DataLoaderBuilder::new(PointBatcher)
            .batch_size(BATCH)
            .build(train.map_err(|e| e.to_string())?),
        DataLoaderBuilder::new(PointBatcher)
            .batch_size(VALID_BATCH)
            .build(valid),
    )
    .num_epochs(2)
    .renderer(Box::new(SilentRenderer))
    .ddp(&run.ddp)
    .launch(Learner::new(
        initial(run.rank, &device()),
        SgdConfig::new().init(),
        LR,
    ));
    println!("optimizer_steps {}", run.ddp.sync_stats().syncs);
    if let Some(error) = &result.error {
        println!("training_error {error}");
    }
    if let Some(interruption) = &result.interrupted {
        let reason = interruption.reason.as_deref().unwrap_or("none");
        println!("interruption {reason}");
    }
    burn_ddp_22::destroy_process_group().map_err(|e| e.to_string())
}

fn accumulation() -> Res<()> {
    const MICRO: usize = 4;
    // 8 micro-batches an epoch: steps after 3 and 6, the 2 left over at
    // the epoch's end.
    const K: usize = 3;
    let run = setup()?;
    let world = run.ddp.group().world_size();
    let (train, valid) = loaders(&run, MICRO)?;
    let result = SupervisedTraining::new(&run.dir, train, valid)
        .metrics((AccuracyMetric::new(), LossMetric::new()))
        .num_epochs(EPOCHS)
        // Rank 0's asynchronous checkpointer holds records of old parameters
        // while the next epoch trains: they must not change what is reduced.
        .with_default_checkpointers()
        .grads_accumulation(K)
        .renderer(Box::new(SilentRenderer))
        .ddp(&run.ddp)
        .launch(Learner::new(
            initial(run.rank, &device()),
            SgdConfig::new().init(),
            LR,
        ));
    println!("syncs {}", run.ddp.sync_stats().syncs);
    println!(
        "optimizer_steps {}",
        EPOCHS * steps_per_epoch(world, MICRO).div_ceil(K)
    );
    print_params(&result.model);
    let reference = reference(world, MICRO, K, EPOCHS, SgdConfig::new().init()).valid();
    println!(
        "max_rel_diff {}",
        max_relative_difference(&flat_params(&result.model), &flat_params(&reference))
    );
    burn_ddp_22::destroy_process_group().map_err(|e| e.to_string())
}

fn unequal() -> Res<()> {
    let run = setup()?;
    // Not sharded: each rank keeps a set of its own length.
    let len = if run.rank == 0 { 64 } else { 48 };
    let train = run
        .ddp
        .shard_with(points(0, len), DistributedSampler::new(len, 1, 0).unwrap());
    let valid = run
        .ddp
        .shard_eval(points(1000, VALID_ITEMS))
        .map_err(|e| e.to_string())?;
    let result = SupervisedTraining::new(
        &run.dir,
        DataLoaderBuilder::new(PointBatcher)
            .batch_size(BATCH)
            .build(train),
        DataLoaderBuilder::new(PointBatcher)
            .batch_size(VALID_BATCH)
            .build(valid),
    )
    .num_epochs(1)
    .renderer(Box::new(SilentRenderer))
    .ddp(&run.ddp)
    .launch(Learner::new(
        initial(run.rank, &device()),
        SgdConfig::new().init(),
        LR,
    ));
    drop(result);
    Err("training with unequal loaders finished".into())
}

fn single_device_parity() -> Res<()> {
    let run = setup()?;
    let device = device();
    let fit = |ours: bool, dir: PathBuf| {
        let sampler = || {
            DistributedSampler::new(TRAIN_ITEMS, 1, 0)
                .unwrap()
                .shuffle(false)
        };
        let ddp = DdpTraining::new(run.ddp.group(), &dir);
        let train = ddp.shard_with(points(0, TRAIN_ITEMS), sampler());
        let valid = ddp.shard_eval(points(1000, VALID_ITEMS)).unwrap();
        let training = SupervisedTraining::new(
            &dir,
            DataLoaderBuilder::new(PointBatcher)
                .batch_size(BATCH)
                .build(train),
            DataLoaderBuilder::new(PointBatcher)
                .batch_size(VALID_BATCH)
                .build(valid),
        )
        .metrics((AccuracyMetric::new(), LossMetric::new()))
        .num_epochs(EPOCHS)
        .renderer(Box::new(SilentRenderer));
        let training = if ours {
            training.ddp(&ddp)
        } else {
            training.with_training_strategy(TrainingStrategy::Default(
                ExecutionStrategy::SingleDevice(device.clone()),
            ))
        };
        let model = load_params(Classifier::new(&device), &flat_params(&reference_start()));
        training
            .launch(Learner::new(model, AdamWConfig::new().init(), LR))
            .model
    };
    let ours = fit(true, run.dir.join("ddp"));
    let burns = fit(false, run.dir.join("single"));
    let (a, b) = (flat_params(&ours), flat_params(&burns));
    let equal = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()) && a.len() == b.len();
    println!("bitwise_equal {equal}");
    println!("max_rel_diff {}", max_relative_difference(&a, &b));
    burn_ddp_22::destroy_process_group().map_err(|e| e.to_string())
}
