//! burn-ddp across real processes: the scenarios both front-ends share
//! (shared-tests/multiprocess, through this crate's `shim`: tensor
//! collectives, half precision, `Ddp<B>` training against single-process
//! references, ...), whose checks are testkit's, and the `Ddp<B>`
//! decorator's own: a layout change of a model never wrapped, two models
//! wrapped separately (a GAN), a stray gradient, memory over 2,000 steps,
//! a killed checkpoint writer, and SyncBatchNorm on a plain `Autodiff<..>`
//! backend whose sum over the ranks no one registered.

#[path = "../common/mod.rs"]
mod common;
mod decorator;
mod gan;
mod overlap;
mod shared;
mod shim;

use burn_ddp_testkit::{
    all_ok, check, every_rank_failed, survivors_failed_within, World, SCENARIO_VAR,
};

fn main() {
    burn_ddp_testkit::multiprocess::run_suite(
        program,
        "burn-ddp was built without its `cuda` feature",
        &[
            (
                "a_layout_change_on_one_rank_fails_every_rank",
                layout_change,
            ),
            (
                "two_wrapped_models_synchronise_separately_a_gan",
                two_models,
            ),
            (
                "a_gradient_outside_every_wrapped_model_fails_every_rank",
                stray_gradient,
            ),
            ("two_thousand_steps_do_not_grow_memory", memory),
            (
                "buckets_sent_during_backward_change_no_bit_at_2_and_3_ranks",
                overlapped_equals_after_backward,
            ),
            (
                "a_rank_dying_while_buckets_are_in_flight_is_named_fast",
                rank_dies_mid_overlap,
            ),
            (
                "burn_ddp_overlap_decides_the_default_and_a_bad_value_is_named",
                overlap_by_variable,
            ),
            (
                "a_killed_checkpoint_writer_leaves_a_whole_checkpoint",
                killed_checkpoint_writer,
            ),
            (
                "sync_batch_norm_on_an_unregistered_backend_names_the_fix",
                sync_batch_norm_unregistered,
            ),
            (
                "sync_batch_norm_under_gradient_checkpointing_is_unchanged",
                sync_batch_norm_checkpointing,
            ),
        ],
    )
}

/// One rank: this crate's own scenarios, then the shared ones.
fn program(name: &str) -> Result<(), String> {
    match name {
        "layout_change" => decorator::layout_changes_on_one_rank(),
        "memory" => decorator::memory(),
        "save_forever" => decorator::save_forever(),
        "gan" => gan::run(),
        "overlap" => overlap::run(),
        "die_mid_overlap" => overlap::die_mid_overlap(),
        "overlap_by_variable" => overlap::by_variable(),
        "stray_gradient" => gan::stray_gradient(),
        "sync_bn_unregistered" => decorator::sync_batch_norm_unregistered(),
        "sync_bn_checkpointing" => decorator::sync_batch_norm_checkpointing(),
        other => shared::run(other),
    }
}

fn overlapped_equals_after_backward() -> Result<(), String> {
    for world in [2, 3] {
        let outcomes = World::new(world).run("overlap");
        all_ok(&outcomes)?;
        for o in &outcomes {
            check(o.stdout.matches("equal over 6 steps").count() == 4, || {
                format!("rank {}: {}", o.rank, o.stdout)
            })?;
        }
    }
    Ok(())
}

fn rank_dies_mid_overlap() -> Result<(), String> {
    let mut world = World::new(3).rank_env(1, "DIE_AT_STEP", "3");
    world.timeout_secs = 60.0;
    world.deadline = std::time::Duration::from_secs(90);
    let outcomes = world.run("die_mid_overlap");
    // backward() cannot return an error: it panics with the reason.
    let needles = ["gradient synchronisation failed", "rank 1"];
    survivors_failed_within(
        &outcomes,
        1,
        std::time::Duration::from_secs(20),
        false,
        &needles,
    )
}

/// On one machine the default sends buckets during backward only when
/// `BURN_DDP_OVERLAP=always` says so; a value it does not know stops `wrap`
/// on every rank, naming the rank, the variable and the choices.
fn overlap_by_variable() -> Result<(), String> {
    let early = |value: Option<&str>| -> Result<Vec<u64>, String> {
        // Unset: empty, whatever the test runner's environment holds.
        let world = World::new(2).env("BURN_DDP_OVERLAP", value.unwrap_or(""));
        let outcomes = world.run("overlap_by_variable");
        all_ok(&outcomes)?;
        outcomes
            .iter()
            .map(|o| {
                let line = o.stdout.lines().find(|l| l.starts_with("early buckets: "));
                let count = line.and_then(|l| l["early buckets: ".len()..].split(' ').next());
                count.and_then(|c| c.parse().ok()).ok_or_else(|| {
                    format!("rank {}: no count of early buckets in {}", o.rank, o.stdout)
                })
            })
            .collect()
    };
    let always = early(Some("always"))?;
    check(always.iter().all(|&n| n > 0), || {
        format!("BURN_DDP_OVERLAP=always: early buckets per rank {always:?}")
    })?;
    for value in [None, Some("never"), Some("auto")] {
        let counts = early(value)?;
        check(counts.iter().all(|&n| n == 0), || {
            format!("BURN_DDP_OVERLAP={value:?} on one machine: early buckets {counts:?}")
        })?;
    }
    let outcomes = World::new(2)
        .env("BURN_DDP_OVERLAP", "sometimes")
        .run("overlap_by_variable");
    every_rank_failed(
        &outcomes,
        false,
        &[
            "rank {rank}: BURN_DDP_OVERLAP=\"sometimes\"",
            "expected always, never or auto",
        ],
    )
}

fn layout_change() -> Result<(), String> {
    let outcomes = World::new(2).run("layout_change");
    // backward() cannot return an error: it panics with the reason.
    every_rank_failed(
        &outcomes,
        false,
        &[
            "gradient synchronisation failed",
            "parameters differ between rank",
            "[7]",
        ],
    )
}

/// SyncBatchNorm training on `Autodiff<Flex>` (not `Ddp<..>`) without
/// `enable_sync_batch_norm`: every rank fails, naming the backend and the fix.
fn sync_batch_norm_unregistered() -> Result<(), String> {
    let outcomes = World::new(2).run("sync_bn_unregistered");
    every_rank_failed(
        &outcomes,
        false,
        &[
            "rank {rank}: SyncBatchNorm with 3 channels",
            "Autodiff<burn_flex",
            "burn_ddp::autodiff::enable_sync_batch_norm::<YourAutodiffBackend>()",
        ],
    )
}

/// SyncBatchNorm on `Ddp<Autodiff<Flex, BalancedCheckpointing>>` at 2 and 3
/// ranks: the input gradient and the collectives' bytes of the run without
/// checkpointing.
fn sync_batch_norm_checkpointing() -> Result<(), String> {
    for world in [2, 3] {
        let outcomes = World::new(world).run("sync_bn_checkpointing");
        all_ok(&outcomes)?;
        for o in &outcomes {
            check(
                o.value("same_gradient") == Some("true") && o.value("same_bytes") == Some("true"),
                || format!("world {world}, rank {}:\n{}", o.rank, o.stdout),
            )?;
        }
    }
    Ok(())
}

/// The GAN of `gan.rs` at 2 and 3 ranks.
fn two_models() -> Result<(), String> {
    for world in [2, 3] {
        let outcomes = World::new(world).run("gan");
        all_ok(&outcomes)?;
        for o in &outcomes {
            check(o.value("max_rel_diff").is_some(), || o.stdout.clone())?;
        }
    }
    Ok(())
}

fn stray_gradient() -> Result<(), String> {
    let outcomes = World::new(2).run("stray_gradient");
    every_rank_failed(
        &outcomes,
        false,
        &[
            "gradient synchronisation failed",
            "rank {rank}: a tensor that requires gradients",
            "belongs to no wrapped model",
            "burn_ddp::wrap",
        ],
    )
}

fn memory() -> Result<(), String> {
    let outcomes = World::new(2).run("memory");
    all_ok(&outcomes)?;
    check(outcomes[0].stdout.contains("tracked"), || {
        outcomes[0].stdout.clone()
    })
}

/// A process saving checkpoints in a loop is SIGKILLed at five moments: the
/// file at the checkpoint's path is always a whole checkpoint that loads, and
/// the next save leaves no partial file behind.
fn killed_checkpoint_writer() -> Result<(), String> {
    use burn::backend::NdArray;
    use burn::module::Module;
    use std::io::{BufRead, BufReader};
    type B = NdArray;
    let dir = std::env::temp_dir().join(format!("burn-ddp-killed-writer-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let path = dir.join("model.mpk");
    type Record = (<burn::nn::Linear<B> as Module<B>>::Record, u64);
    let device = Default::default();
    for (attempt, delay_ms) in [0u64, 40, 90, 170, 260].into_iter().enumerate() {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .env(SCENARIO_VAR, "save_forever")
            .env("CHECKPOINT", &path)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .map_err(|e| e.to_string())?;
        check(first.trim() == "saving", || {
            format!("writer said {first:?}")
        })?;
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        child.kill().map_err(|e| e.to_string())?; // SIGKILL
        child.wait().map_err(|e| e.to_string())?;
        let loaded = burn_ddp::checkpoint::load::<B, Record>(&path, &device);
        check(loaded.is_ok(), || {
            format!(
                "attempt {attempt}: {:?}",
                loaded.err().map(|e| e.to_string())
            )
        })?;
        let model: burn::nn::Linear<B> = burn::nn::LinearConfig::new(1024, 1024).init(&device);
        burn_ddp::checkpoint::save_atomic::<B, _>((model.into_record(), 0u64), &path)
            .map_err(|e| e.to_string())?;
        let left: Vec<_> = std::fs::read_dir(&dir)
            .map_err(|e| e.to_string())?
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .filter(|name| name != "model.mpk")
            .collect();
        check(left.is_empty(), || {
            format!("attempt {attempt}: left {left:?}")
        })?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
