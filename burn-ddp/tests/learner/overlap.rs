//! Burn 0.21's Learner with buckets sent during backward: the strategy asks
//! each step's backward pass to begin the average over the parameters it
//! walks. The same run with `Overlap::Always` and `Overlap::Never` must end
//! with the same parameters, bit for bit, on each rank (the batch norm's
//! running statistics are each rank's own), and only the first may send
//! buckets early. Rank 0's asynchronous checkpointer holds clones
//! of old parameters meanwhile; they must not change what is reduced.

use crate::shared::{self, contract::Training, Res, LR, TRAIN_ITEMS, VALID_ITEMS};
use crate::shim::{self, Classifier, Plain};
use burn::nn::BatchNorm;
use burn::optim::SgdConfig;
use burn::train::metric::{AccuracyMetric, LossMetric};
use burn::train::SupervisedTraining;
use burn_ddp::config::{BucketConfig, Overlap};
use burn_ddp::train::{DdpSupervisedTraining, DdpTraining, SilentRenderer};
use burn_ddp::Ddp;
use burn_ddp_testkit::learner::{learner_world_of, scratch, EPOCHS};
use burn_ddp_testkit::{all_ok, check, Case};
use shim::prelude::*;

/// The classifier on `Ddp<B>`, whose hooks report gradients, with Burn's
/// own batch norm: no collective inside backward.
type Model = Classifier<Ddp<Plain>, BatchNorm<Ddp<Plain>>>;

pub const CASE: Case = (
    "the_learner_sends_buckets_during_backward_with_the_same_result_at_2_and_3_ranks",
    check_overlap,
);

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

/// One rank: the same training with each setting, over the same group.
pub fn program() -> Res<()> {
    let run = shared::setup()?;
    let group = run.ddp.group();
    for (name, overlap) in [("always", Overlap::Always), ("never", Overlap::Never)] {
        // Buckets of a few hundred bytes: the output layer's gradients
        // (ready first) leave alone; the first layer's wait for the end.
        let buckets = BucketConfig::new()
            .with_first_cap_bytes(128)
            .with_cap_bytes(256);
        let ddp = DdpTraining::new(&group, run.dir.join(name))
            .with_buckets(buckets)
            .with_overlap_backward(overlap);
        let train = ddp
            .shard(shared::points(0, TRAIN_ITEMS))
            .map_err(shared::e)?;
        let valid = ddp
            .shard_eval(shared::points(1000, VALID_ITEMS))
            .map_err(shared::e)?;
        let (train, valid) = shared::loaders_of::<Model>(train, valid, 8);
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
    }
    burn_ddp::destroy_process_group().map_err(shared::e)
}
