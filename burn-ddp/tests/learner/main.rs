//! Burn's Learner under burn-ddp's strategy, across real processes: the
//! ranks run the program both front-ends share (shared-tests/learner,
//! through this crate's `shim`), the checks are testkit's.

#[path = "../common/mod.rs"]
mod common;
mod overlap;
mod shared;
mod shim;

fn main() {
    burn_ddp_testkit::learner::run_suite(program, shim::CHECKPOINT_EXTENSION, &overlap::CASES)
}

/// One rank: this crate's own scenario, then the shared ones.
fn program(name: &str) -> shared::Res<()> {
    match name {
        "overlap" => overlap::program(),
        "overlap_twice" => overlap::program_twice(),
        "overlap_mixed" => overlap::program_mixed(),
        other => shared::run(other),
    }
}
