//! Burn's Learner under burn-ddp's strategy, across real processes: the
//! checks are testkit's (shared with burn-ddp-22), the ranks run program.rs.

#[allow(dead_code)]
#[path = "../multiprocess/models.rs"]
mod models;
mod program;

fn main() {
    burn_ddp_testkit::learner::run_suite(program::run, "mpk", &[])
}
