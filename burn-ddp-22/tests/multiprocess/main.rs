//! burn-ddp-22 across real processes: the scenarios both front-ends share
//! (shared-tests/multiprocess, through this crate's `shim`: tensor
//! collectives, half precision, training with `sync_gradients` against
//! single-process references, ...), whose checks are testkit's, and its own:
//! a layout change of a wrapped model, a killed rank and a stopped one.

#[path = "../common/mod.rs"]
mod common;
mod own;
mod shared;
mod shim;

use burn_ddp_testkit::{check, every_rank_failed, World};
use std::time::Duration;

fn main() {
    // A Flex tensor is not a CUDA tensor, or there is no CUDA path at all.
    let nccl_refusal = if cfg!(feature = "cuda") {
        "this tensor is on Device<Flex"
    } else {
        "burn-ddp-22 was built without its `cuda` feature"
    };
    burn_ddp_testkit::multiprocess::run_suite(
        program,
        nccl_refusal,
        &[
            (
                "a_layout_change_on_one_rank_fails_every_rank",
                layout_change,
            ),
            ("a_killed_rank_ends_the_others_within_seconds", killed_rank),
            (
                "a_stopped_rank_ends_the_others_at_the_timeout",
                stopped_rank,
            ),
        ],
    )
}

/// One rank: this crate's own scenarios, then the shared ones.
fn program(name: &str) -> Result<(), String> {
    match name {
        "layout_change" => own::layout_change(),
        "train_forever" => own::train_forever(),
        other => shared::run(other),
    }
}

fn layout_change() -> Result<(), String> {
    let outcomes = World::new(2).run("layout_change");
    every_rank_failed(&outcomes, true, &["parameters differ between rank", "[1]"])
}

/// Rank 1 SIGKILLed mid-training: rank 0 exits non-zero within 5 s, naming it.
fn killed_rank() -> Result<(), String> {
    let mut world = World::new(2);
    world.timeout_secs = 60.0;
    world.deadline = Duration::from_secs(60);
    world.signal_when = Some((1, "ready", libc::SIGKILL));
    let outcomes = world.run("train_forever");
    let killed_at = outcomes[1].elapsed;
    let o = &outcomes[0];
    check(o.code == Some(1), || format!("{o:?}"))?;
    check(o.elapsed < killed_at + Duration::from_secs(5), || {
        format!("{:?} after the kill", o.elapsed - killed_at)
    })?;
    check(o.stderr.contains("rank 1"), || o.stderr.clone())
}

/// Rank 1 SIGSTOPped with a 3 s timeout: rank 0 exits within 8 s naming it.
fn stopped_rank() -> Result<(), String> {
    let mut world = World::new(2);
    world.timeout_secs = 3.0;
    world.deadline = Duration::from_secs(9);
    world.signal_when = Some((1, "ready", libc::SIGSTOP));
    let outcomes = world.run("train_forever");
    let o = &outcomes[0];
    check(o.code == Some(1), || format!("{o:?}"))?;
    check(o.elapsed < Duration::from_secs(8), || {
        format!("took {:?}", o.elapsed)
    })?;
    check(o.stderr.contains("rank 1"), || o.stderr.clone())?;
    check(outcomes[1].killed_at_deadline, || {
        format!("{:?}", outcomes[1])
    })
}
