//! Burn 0.21's Learner with buckets sent during backward: the strategy asks
//! each step's backward pass to begin the average over the parameters it
//! walks. The same run with `Overlap::Always` and `Overlap::Never` must end
//! with the same parameters, bit for bit, on each rank (the batch norm's
//! running statistics are each rank's own), and only the first may send
//! buckets early. Rank 0's asynchronous checkpointer holds clones
//! of old parameters meanwhile; they must not change what is reduced. Ranks
//! that disagree on the setting, and a step with two backward passes, are
//! errors on every rank.

use crate::shared::contract::Learned;
use crate::shared::{self, contract::Training, Res, LR, TRAIN_ITEMS, VALID_ITEMS};
use crate::shim::{self, Classifier, Plain};
use burn::data::dataloader::DataLoader;
use burn::module::Module;
use burn::nn::BatchNorm;
use burn::optim::SgdConfig;
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::train::metric::{AccuracyMetric, LossMetric};
use burn::train::SupervisedTraining;
use burn::train::{ClassificationOutput, InferenceStep, TrainOutput, TrainStep};
use burn_ddp::config::{BucketConfig, Overlap};
use burn_ddp::train::{DdpSupervisedTraining, DdpTraining, SilentRenderer};
use burn_ddp::Ddp;
use burn_ddp_testkit::learner::{learner_world_of, scratch, EPOCHS};
use burn_ddp_testkit::{all_ok, check, Case};
use shim::prelude::*;
use std::sync::Arc;

/// The classifier on `Ddp<B>`, whose hooks report gradients, with Burn's
/// own batch norm: no collective inside backward.
type Model = Classifier<Ddp<Plain>, BatchNorm<Ddp<Plain>>>;

pub const CASES: [Case; 3] = [
    (
        "the_learner_sends_buckets_during_backward_with_the_same_result_at_2_and_3_ranks",
        check_overlap,
    ),
    (
        "a_learner_step_with_two_backward_passes_under_overlap_fails_every_rank_naming_the_fix",
        check_twice,
    ),
    (
        "learner_ranks_that_differ_on_overlap_fail_before_the_first_step_naming_the_setting",
        check_mixed,
    ),
];

fn check_overlap() -> Result<(), String> {
    for ranks in [2, 3] {
        let dir = scratch(&format!("overlap-{ranks}"));
        let outcomes = learner_world_of(ranks, &dir, &[]).run("overlap");
        all_ok(&outcomes)?;
        for o in &outcomes {
            let (always, never) = (o.value("params_always"), o.value("params_never"));
            check(always.is_some() && always == never, || {
                format!(
                    "{ranks} ranks: rank {}'s parameters differ with overlap:\n{}",
                    o.rank, o.stdout
                )
            })?;
            let (early, steps) = (o.value("early_always"), o.value("syncs_always"));
            check(
                early.is_some() && early == steps && early != Some("0"),
                || {
                    format!(
                        "{ranks} ranks: rank {}: early buckets {early:?} for {steps:?} steps",
                        o.rank
                    )
                },
            )?;
            check(o.value("early_never") == Some("0"), || {
                format!(
                    "{ranks} ranks: rank {} sent buckets early under Never:\n{}",
                    o.rank, o.stdout
                )
            })?;
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// Both ranks stop at the first optimizer step, naming the two passes and
/// the setting that allows them.
fn check_twice() -> Result<(), String> {
    every_rank_fails(
        "overlap_twice",
        &[
            "the training step ran backward() 2 times",
            "with_overlap_backward(Overlap::Never)",
        ],
    )
}

/// Rank 0 overlapping and rank 1 not: both stop before training, naming
/// the setting.
fn check_mixed() -> Result<(), String> {
    every_rank_fails(
        "overlap_mixed",
        &[
            "the ranks differ on sending gradient buckets during backward (1 with it, 1 without",
            "DdpTraining::with_overlap_backward and BURN_DDP_OVERLAP",
        ],
    )
}

/// Every rank of `scenario` fails, its error naming itself and `needles`,
/// within a minute.
fn every_rank_fails(scenario: &str, needles: &[&str]) -> Result<(), String> {
    let dir = scratch(scenario);
    let started = std::time::Instant::now();
    let outcomes = learner_world_of(2, &dir, &[]).run(scenario);
    for o in &outcomes {
        check(o.code != Some(0), || format!("rank {} succeeded", o.rank))?;
        let rank = format!("rank {}: ", o.rank);
        for needle in std::iter::once(rank.as_str()).chain(needles.iter().copied()) {
            check(o.stderr.contains(needle), || {
                format!("rank {}'s error lacks {needle:?}:\n{}", o.rank, o.stderr)
            })?;
        }
    }
    check(
        started.elapsed() < std::time::Duration::from_secs(60),
        || format!("took {:?}", started.elapsed()),
    )?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// Buckets of a few hundred bytes: the output layer's gradients (ready
/// first) leave alone; the first layer's wait for the end.
fn overlap_job(run: &shared::Run, name: &str, overlap: Overlap) -> DdpTraining {
    let buckets = BucketConfig::new()
        .with_first_cap_bytes(128)
        .with_cap_bytes(256);
    DdpTraining::new(&run.ddp.group(), run.dir.join(name))
        .with_buckets(buckets)
        .with_overlap_backward(overlap)
}

/// `M`'s loaders of this rank's shards, dealt by `ddp` (whose strategy
/// advances their epochs), in batches of 8.
fn loaders<M: Learned>(ddp: &DdpTraining) -> Res<(M::TrainLoader, M::ValidLoader)> {
    let train = ddp
        .shard(shared::points(0, TRAIN_ITEMS))
        .map_err(shared::e)?;
    let valid = ddp
        .shard_eval(shared::points(1000, VALID_ITEMS))
        .map_err(shared::e)?;
    Ok(shared::loaders_of::<M>(train, valid, 8))
}

/// One rank: rank 0 overlapping, the others not.
pub fn program_mixed() -> Res<()> {
    let run = shared::setup()?;
    let mixed = if run.rank == 0 {
        Overlap::Always
    } else {
        Overlap::Never
    };
    train(&run, "mixed", mixed)?;
    Err("the run did not stop".into())
}

/// One rank: a step that runs backward twice (an auxiliary pass first).
pub fn program_twice() -> Res<()> {
    let run = shared::setup()?;
    let ddp = overlap_job(&run, "twice", Overlap::Always);
    let (train, valid) = loaders::<Twice<Ddp<Plain>>>(&ddp)?;
    let model = Twice {
        inner: shared::initial(run.rank, Model::new),
    };
    SupervisedTraining::new(run.dir.join("twice"), train, valid)
        .num_epochs(1)
        .render_with(SilentRenderer)
        .ddp(&ddp)
        .launch(shim::learner(model, SgdConfig::new().init(), LR));
    Err("the run did not stop".into())
}

/// One rank: the same training with each setting, over the same group.
pub fn program() -> Res<()> {
    let run = shared::setup()?;
    for (name, overlap) in [("always", Overlap::Always), ("never", Overlap::Never)] {
        train(&run, name, overlap)?;
    }
    burn_ddp::destroy_process_group().map_err(shared::e)
}

/// Trains the classifier with `overlap`, printing its parameters and how
/// many buckets left early.
fn train(run: &shared::Run, name: &str, overlap: Overlap) -> Res<()> {
    let ddp = overlap_job(run, name, overlap);
    let (train, valid) = loaders::<Model>(&ddp)?;
    let result = SupervisedTraining::new(run.dir.join(name), train, valid)
        .metrics((AccuracyMetric::new(), LossMetric::new()))
        .num_epochs(EPOCHS)
        .with_checkpoints()
        .render_with(SilentRenderer)
        .ddp(&ddp)
        .launch(shim::learner(
            shared::initial(run.rank, Model::new),
            SgdConfig::new().init(),
            LR,
        ));
    let bits: Vec<String> = result
        .model
        .flat_params()
        .iter()
        .map(|v| format!("{:08x}", v.to_bits()))
        .collect();
    println!("params_{name} {}", bits.join(","));
    let stats = ddp.sync_stats();
    println!("early_{name} {}", stats.early_buckets);
    println!("syncs_{name} {}", stats.syncs);
    Ok(())
}

/// The classifier with a training step that runs backward twice: an
/// auxiliary pass whose gradients it drops, then the real one.
#[derive(Module, Debug)]
pub struct Twice<B: Backend> {
    inner: Classifier<B, BatchNorm<B>>,
}

impl<B: AutodiffBackend> TrainStep for Twice<B> {
    type Input = shim::Batch<B>;
    type Output = ClassificationOutput<B>;
    fn step(&self, batch: shim::Batch<B>) -> TrainOutput<ClassificationOutput<B>> {
        let _auxiliary = self.inner.classify(batch.clone()).loss.backward();
        let item = self.inner.classify(batch);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl<B: Backend> InferenceStep for Twice<B> {
    type Input = shim::Batch<B>;
    type Output = ClassificationOutput<B>;
    fn step(&self, batch: shim::Batch<B>) -> ClassificationOutput<B> {
        self.inner.classify(batch)
    }
}

impl<B: Backend> shim::Params for Twice<B> {
    fn flat_params(&self) -> Vec<f32> {
        self.inner.flat_params()
    }
    fn load_params(self, values: &[f32]) -> Self {
        Self {
            inner: self.inner.load_params(values),
        }
    }
}

impl<B: AutodiffBackend> Learned for Twice<B> {
    type TrainLoader = Arc<dyn DataLoader<B, shim::Batch<B>>>;
    type ValidLoader = Arc<dyn DataLoader<B::InnerBackend, shim::Batch<B::InnerBackend>>>;
}
