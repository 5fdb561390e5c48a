//! Burn 0.22's Learner under burn-ddp-22's strategy, across real processes:
//! the checks are testkit's (shared with burn-ddp), the ranks run program.rs.

#[allow(dead_code)]
#[path = "../multiprocess/models.rs"]
mod models;
mod program;

use burn_ddp_testkit::learner::{learner_world, scratch, EPOCHS_VAR};
use burn_ddp_testkit::{all_ok, check};

fn main() {
    burn_ddp_testkit::learner::run_suite(
        program::run,
        "bpk",
        &[(
            "a_loader_error_on_rank_1_stops_both_ranks_naming_it",
            loader_error,
        )],
    )
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
