//! burn-ddp-22 across real processes: tensor collectives and training with
//! `sync_gradients` on Burn 0.22's Flex backend, checked against
//! single-process references; bad inputs and a killed rank.

mod half;
mod models;
mod scenarios;

use burn_ddp_testkit::{all_ok, check, run_cases, Case, World, SCENARIO_VAR};
use std::time::Duration;

fn main() {
    if let Ok(name) = std::env::var(SCENARIO_VAR) {
        if let Err(message) = scenarios::run(&name) {
            eprintln!("ERROR: {message}");
            std::process::exit(1);
        }
        std::process::exit(0);
    }
    let cases: &[Case] = &[
        ("tensor_collectives_world_1_to_3", tensor_collectives),
        ("f16_and_bf16_collectives_and_gradients", half_precision),
        ("two_ranks_equal_one_big_batch_toy_sgd", || {
            equivalence("toy_sgd")
        }),
        ("two_ranks_equal_one_big_batch_toy_adamw", || {
            equivalence("toy_adamw")
        }),
        ("two_ranks_equal_one_big_batch_conv_sgd", || {
            equivalence("conv_sgd")
        }),
        ("two_ranks_equal_one_big_batch_conv_adamw", || {
            equivalence("conv_adamw")
        }),
        ("a_parameter_unused_on_one_rank_counts_as_zero", || {
            all_ok(&World::new(2).run("unused"))
        }),
        (
            "accumulated_micro_batches_sync_once_and_equal_the_big_batch",
            || all_ok(&World::new(2).run("accumulation")),
        ),
        ("different_models_fail_on_every_rank", different_models),
        (
            "check_replicas_names_the_parameter_and_rank_that_differ",
            replicas,
        ),
        (
            "a_layout_change_on_one_rank_fails_every_rank",
            layout_change,
        ),
        ("a_killed_rank_ends_the_others_within_seconds", killed_rank),
        (
            "a_stopped_rank_ends_the_others_at_the_timeout",
            stopped_rank,
        ),
        ("burn_ddp_backend_on_cpu_tensors", backend_choice),
    ];
    run_cases(cases);
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

/// f16, bf16 and f64 tensors through every collective and `sync_gradients`
/// of a model trained in half precision, on 1 to 3 ranks.
fn half_precision() -> Result<(), String> {
    for world in [1, 2, 3] {
        let outcomes = World::new(world).run("half");
        all_ok(&outcomes)?;
        for o in &outcomes {
            check(o.value("done") == Some("yes"), || o.stdout.clone())?;
        }
    }
    Ok(())
}

fn tensor_collectives() -> Result<(), String> {
    for world in 1..=3 {
        let outcomes = World::new(world).run("tensor_collectives");
        all_ok(&outcomes)?;
        for o in &outcomes {
            check(o.value("done") == Some("yes"), || o.stdout.clone())?;
        }
    }
    Ok(())
}

fn different_models() -> Result<(), String> {
    let outcomes = World::new(2).run("different_models");
    for o in &outcomes {
        check(o.code == Some(1), || format!("{o:?}"))?;
        check(
            o.stderr.contains("parameter #0")
                && o.stderr.contains("[10, 1]")
                && o.stderr.contains("[10, 2]")
                && o.stderr.contains(&format!("rank {}", o.rank)),
            || o.stderr.clone(),
        )?;
    }
    Ok(())
}

/// 3 ranks: identical after training in step (2 tensors compared), then the
/// last rank steps alone and every rank names `linear.weight` and rank 2.
fn replicas() -> Result<(), String> {
    let outcomes = World::new(3).run("replicas");
    all_ok(&outcomes)?;
    for o in &outcomes {
        check(o.value("compared") == Some("2"), || o.stdout.clone())?;
        let error = o.value("replica_error").unwrap_or_default();
        check(
            error.starts_with(&format!("rank {}:", o.rank))
                && error
                    .contains("parameter `linear.weight` (1 of 2) on rank(s) 2 is not rank 0's")
                && error.contains("a trained parameter"),
            || o.stdout.clone(),
        )?;
    }
    Ok(())
}

fn layout_change() -> Result<(), String> {
    let outcomes = World::new(2).run("layout_change");
    for o in &outcomes {
        check(o.code == Some(1), || format!("{o:?}"))?;
        check(
            o.stderr.contains("parameters differ between rank") && o.stderr.contains("[1]"),
            || o.stderr.clone(),
        )?;
    }
    Ok(())
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
    // Why: a Flex tensor is not a CUDA tensor, or there is no CUDA path at all.
    let why = if cfg!(feature = "cuda") {
        "this tensor is on Device<Flex"
    } else {
        "burn-ddp-22 was built without its `cuda` feature"
    };
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
