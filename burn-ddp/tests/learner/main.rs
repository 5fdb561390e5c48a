//! Burn's Learner under burn-ddp's strategy, across real processes: the
//! ranks run the program both front-ends share (shared-tests/learner,
//! through this crate's `shim`), the checks are testkit's.

#[path = "../common/mod.rs"]
mod common;
mod shared;
mod shim;

fn main() {
    burn_ddp_testkit::learner::run_suite(shared::run, shim::CHECKPOINT_EXTENSION, &[])
}
