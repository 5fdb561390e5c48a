//! Burn 0.22's Learner under burn-ddp-22's strategy, across real processes:
//! the ranks run the program both front-ends share (shared-tests/learner,
//! through this crate's `shim`) and this crate's own loader-error scenario
//! (Burn 0.22's datasets return errors); the shared checks are testkit's.

#[path = "../common/mod.rs"]
mod common;
mod shared;
mod shim;

use burn::data::dataset::{Dataset, DatasetError, InMemDataset};
use burn::optim::SgdConfig;
use burn::train::SupervisedTraining;
use burn_ddp_22::train::{DdpSupervisedTraining, SilentRenderer};
use burn_ddp_testkit::learner::{learner_world, scratch, EPOCHS_VAR};
use burn_ddp_testkit::{all_ok, check};
use shared::contract::Training;
use shared::{Res, BATCH, LR, TRAIN_ITEMS, VALID_ITEMS};
use std::sync::atomic::{AtomicUsize, Ordering};

fn main() {
    burn_ddp_testkit::learner::run_suite(
        program,
        shim::CHECKPOINT_EXTENSION,
        &[(
            "a_loader_error_on_rank_1_stops_both_ranks_naming_it",
            loader_error,
        )],
    )
}

/// One rank: this crate's own scenario, then the shared ones.
fn program(name: &str) -> Res<()> {
    match name {
        "loader_error_rank_1" => loader_error_rank_1(),
        other => shared::run(other),
    }
}

/// Burn 0.22's loaders yield errors: one on rank 1 is voted as an interrupt,
/// so both ranks stop before the same iteration (after 4 optimizer steps);
/// rank 1's result carries the error, rank 0's names the rank that stopped.
fn loader_error() -> Result<(), String> {
    let dir = scratch("loader-error");
    let outcomes = learner_world(&dir, &[(EPOCHS_VAR, "2")]).run("loader_error_rank_1");
    all_ok(&outcomes)?;
    for o in &outcomes {
        check(o.value("optimizer_steps") == Some("4"), || o.stdout.clone())?;
    }
    let error = outcomes[1].value("training_error").unwrap_or_default();
    check(error.contains("item 33 cannot be read"), || {
        outcomes[1].stdout.clone()
    })?;
    let reason = outcomes[0].value("interruption").unwrap_or_default();
    check(reason == "interrupted on rank 1", || {
        outcomes[0].stdout.clone()
    })?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
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
    let run = shared::setup()?;
    let fail_at = if run.rank == 1 { 33 } else { usize::MAX };
    let train = run.ddp.shard(Breaking {
        inner: shared::points(0, TRAIN_ITEMS),
        fail_at,
        read: AtomicUsize::new(0),
    });
    let valid = run
        .ddp
        .shard_eval(shared::points(1000, VALID_ITEMS))
        .map_err(shared::e)?;
    let (train, valid) = shared::loaders_of::<shim::Model>(train.map_err(shared::e)?, valid, BATCH);
    let result = SupervisedTraining::new(&run.dir, train, valid)
        .num_epochs(2)
        .render_with(SilentRenderer)
        .ddp(&run.ddp)
        .launch(shim::learner(
            shared::initial(run.rank, shim::Model::new),
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
    burn_ddp_22::destroy_process_group().map_err(shared::e)
}
