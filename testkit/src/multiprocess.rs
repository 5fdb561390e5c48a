//! The multi-process checks both Burn front-ends share: each front-end's
//! `tests/multiprocess` binary is a program (one rank of a scenario: the
//! scenarios of front-end-tests/multiprocess, written once, and the
//! front-end's own) and [`run_suite`], which starts the scenarios as real
//! processes and checks what they print and how they exit: the tensor
//! collectives, half precision, training against a single-process
//! reference, a parameter unused on one rank, gradient accumulation, models
//! that differ between ranks, replicas that drift apart and the collective
//! backend chosen for CPU tensors.

use crate::{all_ok, check, every_rank_failed, Case, World};
use std::sync::OnceLock;

/// Why `BURN_DDP_BACKEND=nccl` is refused for the front-end's CPU tensors.
static NCCL_REFUSAL: OnceLock<&'static str> = OnceLock::new();

/// A multiprocess test binary's `main`: as a rank (the scenario variable
/// set), runs `program(scenario)` and exits; otherwise runs every shared
/// case, and the front-end's `extra` ones, whose ranks are this binary again.
/// `nccl_refusal` is why the front-end refuses `BURN_DDP_BACKEND=nccl` for
/// the CPU tensors of its tests (the end of the message).
pub fn run_suite(
    program: fn(&str) -> Result<(), String>,
    nccl_refusal: &'static str,
    extra: &[Case],
) -> ! {
    let _ = NCCL_REFUSAL.set(nccl_refusal);
    let cases: &[Case] = &[
        ("tensor_collectives_world_1_to_3", tensor_collectives),
        ("f16_and_bf16_collectives_and_gradients", half_precision),
        ("ddp_equals_one_big_batch_toy_sgd", || {
            equivalence("toy_sgd")
        }),
        ("ddp_equals_one_big_batch_toy_adamw", || {
            equivalence("toy_adamw")
        }),
        ("ddp_equals_one_big_batch_conv_sgd", || {
            equivalence("conv_sgd")
        }),
        ("ddp_equals_one_big_batch_conv_adamw", || {
            equivalence("conv_adamw")
        }),
        (
            "a_parameter_unused_on_one_rank_counts_as_zero",
            unused_parameter,
        ),
        (
            "accumulated_micro_batches_sync_once_and_equal_the_big_batch",
            accumulation,
        ),
        ("different_models_fail_on_every_rank", different_models),
        (
            "check_replicas_names_the_parameter_and_rank_that_differ",
            replicas,
        ),
        ("burn_ddp_backend_on_cpu_tensors", backend_choice),
    ];
    crate::run_program_or_cases(program, cases, extra)
}

/// Each rank checks every collective on float and int tensors against its
/// closed form, on 1 to 3 ranks.
fn tensor_collectives() -> Result<(), String> {
    every_rank_says_done("tensor_collectives")
}

/// f16, bf16 and f64 tensors through every collective, and the averaged
/// gradients of a model trained in half precision, on 1 to 3 ranks.
fn half_precision() -> Result<(), String> {
    every_rank_says_done("half")
}

fn every_rank_says_done(scenario: &str) -> Result<(), String> {
    for world in 1..=3 {
        let outcomes = World::new(world).run(scenario);
        all_ok(&outcomes)?;
        for o in &outcomes {
            check(o.value("done") == Some("yes"), || o.stdout.clone())?;
        }
    }
    Ok(())
}

/// 2 and 3 ranks; each rank checks itself against the reference and prints the gap.
fn equivalence(scenario: &str) -> Result<(), String> {
    for world in [2, 3] {
        let outcomes = World::new(world).run(scenario);
        all_ok(&outcomes)?;
        for o in &outcomes {
            check(o.value("max_rel_diff").is_some(), || o.stdout.clone())?;
        }
    }
    Ok(())
}

fn unused_parameter() -> Result<(), String> {
    all_ok(&World::new(2).run("unused"))
}

fn accumulation() -> Result<(), String> {
    all_ok(&World::new(2).run("accumulation"))
}

/// Rank 1's layer is wider: wrapping fails on every rank, naming the shapes.
fn different_models() -> Result<(), String> {
    let outcomes = World::new(2).run("different_models");
    every_rank_failed(
        &outcomes,
        true,
        &["parameter #0", "[10, 1]", "[10, 2]", "rank {rank}"],
    )
}

/// 3 ranks: identical after training in step (2 tensors compared); then the
/// last rank steps alone and every rank names `linear.weight`, rank 2 and
/// that it is trained; then the last rank's frozen bias differs and every
/// rank names `linear.bias`, rank 2 and that it is a buffer.
fn replicas() -> Result<(), String> {
    let outcomes = World::new(3).run("replicas");
    all_ok(&outcomes)?;
    for o in &outcomes {
        check(o.value("compared") == Some("2"), || o.stdout.clone())?;
        let error = o.value("replica_error_trained").unwrap_or_default();
        check(
            error.starts_with(&format!("rank {}:", o.rank))
                && error
                    .contains("parameter `linear.weight` (1 of 2) on rank(s) 2 is not rank 0's")
                && error.contains("a trained parameter"),
            || o.stdout.clone(),
        )?;
        let error = o.value("replica_error_buffer").unwrap_or_default();
        check(
            error.starts_with(&format!("rank {}:", o.rank))
                && error.contains("parameter `linear.bias` (2 of 2) on rank(s) 2 is not rank 0's")
                && error.contains("a buffer, not trained"),
            || o.stdout.clone(),
        )?;
    }
    Ok(())
}

/// `BURN_DDP_BACKEND` with CPU tensors: `tcp` and `auto` take the host path;
/// `nccl` is refused for tensors and gradients with the reason, even in a
/// world of one (where it forces the synchronisation that would otherwise be
/// skipped); a typo is named.
fn backend_choice() -> Result<(), String> {
    for value in ["tcp", "auto"] {
        let outcomes = World::new(2).env("BURN_DDP_BACKEND", value).run("one_step");
        all_ok(&outcomes)?;
        for o in &outcomes {
            check(o.value("tensor_sum") == Some("[2.0, 2.0, 2.0]"), || {
                o.stdout.clone()
            })?;
            check(o.value("stepped").is_some_and(|b| b != "0"), || {
                o.stdout.clone()
            })?;
        }
    }
    let why = NCCL_REFUSAL.get().copied().unwrap_or_default();
    for world in [1, 2] {
        let outcomes = World::new(world)
            .env("BURN_DDP_BACKEND", "nccl")
            .run("one_step");
        for o in &outcomes {
            let refused = format!("rank {}: BURN_DDP_BACKEND=nccl, but {why}", o.rank);
            check(o.code == Some(1), || format!("{o:?}"))?;
            // Tensor collectives and gradients alike: nothing silently on the host.
            let tensor_refused = format!("tensor_error burn-ddp configuration error: {refused}");
            check(
                o.stderr.contains(&refused)
                    && o.stdout.contains(&tensor_refused)
                    && !o.stdout.contains("stepped"),
                || format!("world {world}: {o:?}"),
            )?;
        }
    }
    let outcomes = World::new(2).env("BURN_DDP_BACKEND", "mpi").run("one_step");
    for o in &outcomes {
        check(
            o.stdout.contains("expected nccl, tcp or auto")
                || o.stderr.contains("expected nccl, tcp or auto"),
            || format!("{o:?}"),
        )?;
    }
    Ok(())
}
