//! One rank of a learner test, written once against each crate's test shim
//! (`crate::shim`: its Burn's classifier, its batches and `Learner`, and its
//! implementation of [`contract`]): a small classifier trained by Burn's Learner with the
//! front-end's strategy, and the single-process references it must equal.
//! testkit's `learner::run_suite` starts the ranks and checks them.

use crate::shim::ddp::data::DistributedSampler;
use crate::shim::ddp::train::{
    DdpSupervisedTraining, DdpTraining, SilentRenderer, SummaryRenderer,
};
pub mod contract;

use crate::shim::prelude::*;
use crate::shim::{self, ddp};
use burn::data::dataset::{Dataset, InMemDataset};
use burn::optim::{AdamWConfig, GradientsAccumulator, GradientsParams, SgdConfig};
use burn::train::checkpoint::{CheckpointingAction, CheckpointingStrategy};
use burn::train::metric::store::{Aggregate, EventStoreClient, Split};
use burn::train::metric::{AccuracyMetric, LossMetric};
use burn::train::{
    EarlyStoppingStrategy, ExecutionStrategy, Interrupter, LearnerSummary, SupervisedTraining,
    TrainingStrategy,
};
use burn_ddp_testkit::learner::{
    BATCH_VAR, DIR_VAR, EPOCHS, EPOCHS_VAR, OPTIMIZER_VAR, RESUME_VAR, SHARDED_VAR, SHARED_DIR_VAR,
};
use burn_ddp_testkit::numbers::max_relative_difference;
use contract::{Learned, Loader, Training};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

pub const TRAIN_ITEMS: usize = 64;
pub const VALID_ITEMS: usize = 40;
pub const BATCH: usize = 8;
pub const VALID_BATCH: usize = 16;
pub const LR: f64 = 0.05;
const INIT_SEED: u64 = 100;

pub type Res<T> = Result<T, String>;

pub fn e<E: std::fmt::Display>(err: E) -> String {
    err.to_string()
}

/// Items `offset..offset + n` of the synthetic set (testkit's `point_rows`
/// makes their features and classes).
pub fn points(offset: usize, n: usize) -> InMemDataset<usize> {
    InMemDataset::new((offset..offset + n).collect())
}

static BATCHES: AtomicUsize = AtomicUsize::new(0);
static INTERRUPT: OnceLock<(Interrupter, usize)> = OnceLock::new();

/// Called as every batch is made: counts batches and, on the rank given an
/// interrupter in `INTERRUPT`, stops it while fetching batch number `at`
/// (1-based).
pub fn on_batch() {
    let n = BATCHES.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some((interrupter, at)) = INTERRUPT.get() {
        if n == *at {
            interrupter.stop(Some("test interrupt"));
        }
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn print_params(model: &impl Params) {
    let bits: Vec<String> = model
        .flat_params()
        .iter()
        .map(|v| format!("{:08x}", v.to_bits()))
        .collect();
    println!("params {}", bits.join(","));
}

/// The rank's model, made by `build`: rank 0 starts from the reference's
/// initial parameters, the others from another seed (the strategy must
/// broadcast rank 0's).
pub fn initial<M: Params>(rank: usize, build: impl FnOnce(&shim::Device) -> M) -> M {
    let start = reference_start();
    let model = build(&shim::device());
    if rank == 0 {
        model.load_params(&start.flat_params())
    } else {
        model
    }
}

fn reference_start() -> shim::Reference {
    let device = shim::device();
    shim::seed(&device, INIT_SEED);
    shim::Reference::new(&device)
}

pub struct Run {
    pub ddp: DdpTraining,
    pub rank: usize,
    pub dir: PathBuf,
}

pub fn setup() -> Res<Run> {
    let group = ddp::init_process_group().map_err(e)?;
    shim::enable_sync_batch_norm();
    let base = PathBuf::from(std::env::var(DIR_VAR).map_err(|_| "no test dir")?);
    let rank = group.rank();
    let dir = if std::env::var_os(SHARED_DIR_VAR).is_some() {
        base
    } else {
        base.join(format!("rank{rank}"))
    };
    let mut ddp = DdpTraining::new(&group, &dir);
    if std::env::var_os(SHARDED_VAR).is_some() {
        ddp = ddp.with_sharded_optimizer(ddp::ShardConfig::new());
    }
    Ok(Run { ddp, rank, dir })
}

/// `M`'s loaders of `train` in batches of `batch` and of `valid` in batches
/// of `VALID_BATCH`, counting batches with [`on_batch`].
pub fn loaders_of<M: Learned>(
    train: impl Dataset<usize> + 'static,
    valid: impl Dataset<usize> + 'static,
    batch: usize,
) -> (M::TrainLoader, M::ValidLoader) {
    (
        Loader::new(train, batch, on_batch),
        Loader::new(valid, VALID_BATCH, on_batch),
    )
}

/// `M`'s loaders of this rank's shards (see [`loaders_of`]).
pub fn loaders<M: Learned>(run: &Run, batch: usize) -> Res<(M::TrainLoader, M::ValidLoader)> {
    let train = run.ddp.shard(points(0, TRAIN_ITEMS)).map_err(e)?;
    let valid = run.ddp.shard_eval(points(1000, VALID_ITEMS)).map_err(e)?;
    Ok(loaders_of::<M>(train, valid, batch))
}

/// Runs the shared scenario `name` as this rank.
pub fn run(name: &str) -> Res<()> {
    match name {
        "against_reference" => against_reference(),
        "train" => train_and_resume(),
        "early_stop" => early_stop(),
        "interrupt_rank_1" => interrupt_rank_1(),
        "artifact_dir" => artifact_dir(),
        "accumulation" => accumulation(),
        "unequal" => unequal(),
        "single_device_parity" => single_device_parity(),
        other => Err(format!("unknown scenario {other}")),
    }
}

/// One process with batch `world * batch` (sums of `accumulate`
/// micro-batches, and at an epoch's end the sum of what is left where the
/// Burn version's Learner applies it) over the order the ranks' samplers
/// give, epoch by epoch.
fn reference<O: Step<shim::Reference>>(
    world: usize,
    batch: usize,
    accumulate: usize,
    epochs: usize,
    mut optimizer: O,
) -> shim::Reference {
    let device = shim::device();
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
            let output = model.classify(shim::batch_of(&items, &device));
            let grads = GradientsParams::from_grads(output.loss.backward(), &model);
            accumulator.accumulate(&model, grads);
            pending += 1;
            if pending == accumulate {
                pending = 0;
                model = optimizer.step(LR, model, accumulator.grads());
            }
        }
        if pending > 0 && shim::STEPS_ON_LEFTOVER_MICRO_BATCHES {
            model = optimizer.step(LR, model, accumulator.grads());
        }
    }
    model
}

fn valid_accuracy(model: &shim::ValidModel) -> f64 {
    let items: Vec<usize> = (1000..1000 + VALID_ITEMS).collect();
    let (x, targets) = shim::batch_of(&items, &shim::valid_device());
    let correct = model
        .forward(x)
        .argmax(1)
        .flatten::<1>(0, 1)
        .equal(targets)
        .int()
        .sum();
    100.0 * shim::int_scalar(correct) as f64 / VALID_ITEMS as f64
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

fn launch<O: LearnerOptimizer>(run: &Run, optimizer: O) -> Res<shim::ValidModel> {
    let (train, valid) = loaders::<shim::Model>(run, BATCH)?;
    let result = SupervisedTraining::new(&run.dir, train, valid)
        .metrics((AccuracyMetric::new(), LossMetric::new()))
        .with_checkpoints()
        .num_epochs(EPOCHS)
        .summary()
        .render_with(SummaryRenderer::new(print_summary))
        .ddp(&run.ddp)
        .launch(shim::learner(
            initial(run.rank, shim::Model::new),
            optimizer,
            LR,
        ));
    Ok(result.model)
}

fn against_reference() -> Res<()> {
    let run = setup()?;
    let world = run.ddp.group().world_size();
    let (trained, reference) = match std::env::var(OPTIMIZER_VAR).as_deref() {
        Ok("adamw") => (
            launch(&run, AdamWConfig::new().init())?,
            reference(world, BATCH, 1, EPOCHS, AdamWConfig::new().init()),
        ),
        _ => (
            launch(&run, SgdConfig::new().init())?,
            reference(world, BATCH, 1, EPOCHS, SgdConfig::new().init()),
        ),
    };
    // As the model the ranks validate (SyncBatchNorm's eval is BatchNorm's).
    let reference = shim::valid(
        &shim::Model::new(&shim::device()).load_params(&shim::reference_params(&reference)),
    );
    print_params(&trained);
    println!(
        "max_rel_diff {}",
        max_relative_difference(&trained.flat_params(), &reference.flat_params())
    );
    println!("reference_valid_accuracy {}", valid_accuracy(&reference));
    ddp::destroy_process_group().map_err(e)
}

fn train_and_resume() -> Res<()> {
    let run = setup()?;
    let (train, valid) = loaders::<shim::Model>(&run, env_usize(BATCH_VAR, BATCH))?;
    let mut training = SupervisedTraining::new(&run.dir, train, valid)
        .metrics((AccuracyMetric::new(), LossMetric::new()))
        .with_checkpoints()
        .num_epochs(env_usize(EPOCHS_VAR, EPOCHS))
        .with_checkpointing_strategy(StoreProbe)
        .render_with(SilentRenderer);
    let resume = match std::env::var(RESUME_VAR).as_deref() {
        // What `burn-ddp-run --resume auto` programs do.
        Ok("auto") => run.ddp.latest_checkpoint().map_err(e)?,
        Ok(epoch) => epoch.parse().ok(),
        Err(_) => None,
    };
    if let Some(epoch) = resume {
        println!("resumed_from {epoch}");
        training = training.resume_from(&run.ddp, epoch)?;
    }
    let model = initial(run.rank, shim::Model::new);
    let result = training
        .ddp(&run.ddp)
        .launch(shim::learner(model, AdamWConfig::new().init(), LR));
    print_params(&result.model);
    if run.rank == 0 {
        println!(
            "valid_loss_by_epoch {}",
            STORE_SEEN.lock().unwrap().join(",")
        );
    }
    ddp::destroy_process_group().map_err(e)
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
    let (train, valid) = loaders::<shim::Model>(&run, BATCH)?;
    ddp::sync::reset_sync_stats();
    let result = SupervisedTraining::new(&run.dir, train, valid)
        .metrics((AccuracyMetric::new(), LossMetric::new()))
        .num_epochs(env_usize(EPOCHS_VAR, 10))
        .early_stopping(StopOnRankZero { rank: run.rank })
        .render_with(SilentRenderer)
        .ddp(&run.ddp)
        .launch(shim::learner(
            initial(run.rank, shim::Model::new),
            SgdConfig::new().init(),
            LR,
        ));
    drop(result);
    let syncs = ddp::sync::sync_stats().syncs as usize;
    println!("epochs_run {}", syncs / steps_per_epoch(world, BATCH));
    ddp::destroy_process_group().map_err(e)
}

/// Every rank calls `recreate_artifact_dir` on one shared folder holding a
/// stale file: none of them sees it afterwards (they waited for rank 0's
/// wipe). Rank 0 then writes a file, `create_artifact_dir` keeps it, and a
/// folder under a file is an error on every rank.
fn artifact_dir() -> Res<()> {
    let run = setup()?;
    run.ddp.recreate_artifact_dir().map_err(e)?;
    println!("stale_left {}", run.dir.join("stale.txt").exists());
    if run.rank == 0 {
        std::fs::write(run.dir.join("fresh.txt"), "rank 0").map_err(e)?;
    }
    run.ddp.group().barrier().map_err(e)?;
    run.ddp.create_artifact_dir().map_err(e)?;
    println!("fresh_kept {}", run.dir.join("fresh.txt").exists());
    let impossible = DdpTraining::new(&run.ddp.group(), run.dir.join("fresh.txt").join("sub"));
    match impossible.recreate_artifact_dir() {
        Ok(()) => return Err("a folder under a file was created".into()),
        Err(err) => println!("prepare_error {err}"),
    }
    ddp::destroy_process_group().map_err(e)
}

fn interrupt_rank_1() -> Res<()> {
    let run = setup()?;
    let (train, valid) = loaders::<shim::Model>(&run, BATCH)?;
    ddp::sync::reset_sync_stats();
    let training = SupervisedTraining::new(&run.dir, train, valid)
        .metrics((AccuracyMetric::new(), LossMetric::new()))
        .num_epochs(env_usize(EPOCHS_VAR, 3))
        .render_with(SilentRenderer);
    if run.rank == 1 {
        let _ = INTERRUPT.set((training.interrupter(), 5));
    }
    let result = training.ddp(&run.ddp).launch(shim::learner(
        initial(run.rank, shim::Model::new),
        SgdConfig::new().init(),
        LR,
    ));
    drop(result);
    println!("optimizer_steps {}", ddp::sync::sync_stats().syncs);
    ddp::destroy_process_group().map_err(e)
}

/// Gradient accumulation with rank 0 checkpointing: one gradient sync per
/// optimizer step, and the parameters of one process summing the same
/// micro-batches.
fn accumulation() -> Res<()> {
    const MICRO: usize = 4;
    const K: usize = shim::GRADS_ACCUMULATION;
    let run = setup()?;
    let world = run.ddp.group().world_size();
    let (train, valid) = loaders::<shim::AccumulationModel>(&run, MICRO)?;
    ddp::sync::reset_sync_stats();
    let result = SupervisedTraining::new(&run.dir, train, valid)
        .metrics((AccuracyMetric::new(), LossMetric::new()))
        .num_epochs(EPOCHS)
        // Rank 0's asynchronous checkpointer holds old parameters while the
        // next epoch trains: they must not change what is reduced.
        .with_checkpoints()
        .grads_accumulation(K)
        .render_with(SilentRenderer)
        .ddp(&run.ddp)
        .launch(shim::learner(
            initial(run.rank, shim::AccumulationModel::new),
            SgdConfig::new().init(),
            LR,
        ));
    println!("syncs {}", ddp::sync::sync_stats().syncs);
    let micro_batches = steps_per_epoch(world, MICRO);
    let steps = if shim::STEPS_ON_LEFTOVER_MICRO_BATCHES {
        micro_batches.div_ceil(K)
    } else {
        micro_batches / K
    };
    println!("optimizer_steps {}", EPOCHS * steps);
    print_params(&result.model);
    let reference = reference(world, MICRO, K, EPOCHS, SgdConfig::new().init());
    println!(
        "max_rel_diff {}",
        max_relative_difference(
            &result.model.flat_params(),
            &shim::reference_params(&reference)
        )
    );
    ddp::destroy_process_group().map_err(e)
}

fn unequal() -> Res<()> {
    let run = setup()?;
    // Not sharded: each rank keeps a set of its own length.
    let len = if run.rank == 0 { 64 } else { 48 };
    let train = run
        .ddp
        .shard_with(points(0, len), DistributedSampler::new(len, 1, 0).unwrap());
    let valid = run.ddp.shard_eval(points(1000, VALID_ITEMS)).map_err(e)?;
    let (train, valid) = loaders_of::<shim::Model>(train, valid, BATCH);
    let result = SupervisedTraining::new(&run.dir, train, valid)
        .num_epochs(1)
        .render_with(SilentRenderer)
        .ddp(&run.ddp)
        .launch(shim::learner(
            initial(run.rank, shim::Model::new),
            SgdConfig::new().init(),
            LR,
        ));
    drop(result);
    Err("training with unequal loaders finished".into())
}

fn single_device_parity() -> Res<()> {
    let run = setup()?;
    let device = shim::device();
    let fit = |ours: bool, dir: PathBuf| {
        let sampler = || {
            DistributedSampler::new(TRAIN_ITEMS, 1, 0)
                .unwrap()
                .shuffle(false)
        };
        let ddp = DdpTraining::new(&run.ddp.group(), &dir);
        let train = ddp.shard_with(points(0, TRAIN_ITEMS), sampler());
        let valid = ddp.shard_eval(points(1000, VALID_ITEMS)).unwrap();
        let (train, valid) = loaders_of::<shim::Model>(train, valid, BATCH);
        let training = SupervisedTraining::new(&dir, train, valid)
            .metrics((AccuracyMetric::new(), LossMetric::new()))
            .num_epochs(EPOCHS)
            .render_with(SilentRenderer);
        let training = if ours {
            training.ddp(&ddp)
        } else {
            training.with_training_strategy(TrainingStrategy::Default(
                ExecutionStrategy::SingleDevice(shim::device()),
            ))
        };
        let model = shim::Model::new(&device).load_params(&reference_start().flat_params());
        training
            .launch(shim::learner(model, AdamWConfig::new().init(), LR))
            .model
    };
    let ours = fit(true, run.dir.join("ddp"));
    let burns = fit(false, run.dir.join("single"));
    let (a, b) = (ours.flat_params(), burns.flat_params());
    let equal = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()) && a.len() == b.len();
    println!("bitwise_equal {equal}");
    println!("max_rel_diff {}", max_relative_difference(&a, &b));
    ddp::destroy_process_group().map_err(e)
}
