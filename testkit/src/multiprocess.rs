//! The multi-process checks both Burn front-ends share: each front-end's
//! `tests/multiprocess` binary is a program (one rank of a scenario: the
//! scenarios of shared-tests/multiprocess, written once, and the
//! front-end's own) and [`run_suite`], which starts the scenarios as real
//! processes and checks what they print and how they exit: the tensor
//! collectives, half precision, training against a single-process
//! reference, a parameter unused on one rank, gradient accumulation, models
//! that differ between ranks, replicas that drift apart and the collective
//! backend chosen for CPU tensors.

use crate::{all_ok, check, every_rank_failed, survivors_failed_within, Case, RankOutcome, World};
use burn_ddp_training::sharded::CRASH_IN_SAVE_VAR;
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
            "uneven_inputs_10_7_and_0_batches_step_together_and_equal_each_steps_union",
            uneven_inputs,
        ),
        (
            "a_rank_killed_mid_training_costs_one_step_the_survivors_go_on",
            survivors_redo_the_step,
        ),
        (
            "a_sharded_optimizer_cannot_go_on_without_a_rank_and_says_to_restart",
            sharded_lost_shard,
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
        (
            "a_tracked_sum_over_ranks_gets_every_ranks_gradient",
            tracked_sum,
        ),
        (
            "sharded_optimizer_equals_ddp_and_one_big_batch_sgd_momentum",
            || sharded(&["sharded_toy_sgd", "sharded_conv_sgd"], 2.2),
        ),
        (
            "sharded_optimizer_equals_ddp_and_one_big_batch_adamw",
            || sharded(&["sharded_conv_adamw", "sharded_conv_adamw_clipped"], 2.2),
        ),
        (
            "sharded_optimizer_given_averaged_gradients_equals_ddp",
            || sharded(&["sharded_toy_adamw_pre_averaged"], 3.5),
        ),
        (
            "sharded_optimizer_with_accumulated_micro_batches_equals_the_big_batch",
            sharded_accumulation,
        ),
        (
            "sharded_optimizer_over_different_models_fails_every_rank",
            sharded_different_models,
        ),
        (
            "sharded_optimizer_clipping_to_a_global_norm_equals_one_big_batch",
            sharded_global_clip,
        ),
        (
            "sharded_optimizer_refuses_nccl_for_host_tensors",
            sharded_nccl_refused,
        ),
        (
            "sharded_checkpoint_saved_on_2_resumes_on_3_and_1_and_on_3_resumes_on_2",
            sharded_checkpoint,
        ),
        (
            "sharded_checkpoint_in_parts_resharded_2_to_3_2_to_1_plain_3_to_2_1_to_2_background_and_faults",
            sharded_checkpoint_in_parts,
        ),
        (
            "sync_batch_norm_on_n_ranks_equals_batch_norm_on_one_big_batch",
            sync_batch_norm,
        ),
        (
            "sync_batch_norm_with_uneven_and_empty_ranks_is_exact",
            sync_batch_norm_uneven,
        ),
        (
            "sync_batch_norm_channels_differing_between_ranks_fail_every_rank",
            sync_batch_norm_channels_differ,
        ),
        (
            "sync_batch_norm_before_init_process_group_fails_every_rank",
            sync_batch_norm_before_init,
        ),
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

/// 3 ranks, rank 1 SIGKILLed before a step picked at random (toy and conv,
/// AdamW): the job ends with exit 0 on ranks 0 and 2, which went on as
/// generation 1 in the same processes, redid that step, and end equal to
/// one process on the 10 global batches; the step redone within 2 s of
/// its start.
fn survivors_redo_the_step() -> Result<(), String> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as usize);
    for (i, scenario) in ["survive_toy_adamw", "survive_conv_adamw"]
        .iter()
        .enumerate()
    {
        let at = 1 + (nanos / 7 + i * 3) % 8;
        let mut world = World::new(3)
            .env("SURVIVE_VICTIM", "1")
            .env("SURVIVE_STEP", &at.to_string());
        world.signal_when = Some((1, "ready", libc::SIGKILL));
        let outcomes = world.run(scenario);
        let case = |rank: usize| format!("{scenario}, rank 1 killed before step {at}, rank {rank}");
        check(outcomes[1].code.is_none(), || {
            format!("{}: {:?}", case(1), outcomes[1])
        })?;
        for o in outcomes.iter().filter(|o| o.rank != 1) {
            check(o.code == Some(0), || format!("{}: {o:?}", case(o.rank)))?;
            let expected = format!("generation 1 rank {} of 2", o.rank.min(1));
            check(o.stdout.contains(&expected), || {
                format!("{}: no {expected:?}: {}", case(o.rank), o.stdout)
            })?;
            check(o.value("steps") == Some("10 world 2"), || {
                format!("{}: {}", case(o.rank), o.stdout)
            })?;
            let recovered: u64 = o
                .value("recovered_in_ms")
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{}: {}", case(o.rank), o.stdout))?;
            check(recovered < 2000, || {
                format!(
                    "{}: the step was redone {recovered} ms after it began",
                    case(o.rank)
                )
            })?;
        }
    }
    Ok(())
}

/// The sharded optimizer's choice when a rank is gone: its part of the
/// state is lost, so the survivors, having formed the next generation,
/// are refused the next sharded step with the fix (the newest snapshot)
/// on every one; they exit with it (the launcher then restarts the round).
fn sharded_lost_shard() -> Result<(), String> {
    let mut world = World::new(3);
    world.signal_when = Some((1, "ready", libc::SIGKILL));
    let outcomes = world.run("sharded_lost_shard");
    check(outcomes[1].code.is_none(), || format!("{:?}", outcomes[1]))?;
    for o in outcomes.iter().filter(|o| o.rank != 1) {
        check(o.stdout.contains("generation 1 rank"), || format!("{o:?}"))?;
    }
    let survivors: Vec<_> = outcomes.into_iter().filter(|o| o.rank != 1).collect();
    every_rank_failed(
        &survivors,
        true,
        &["generation 0 of the group was replaced", "newest snapshot"],
    )
}

/// 3 ranks with 10, 7 and 0 batches, toy (SGD) and conv (AdamW): no hang,
/// 10 steps on every rank, equal to one process on each step's union.
fn uneven_inputs() -> Result<(), String> {
    for scenario in ["uneven_toy_sgd", "uneven_conv_adamw"] {
        let outcomes = World::new(3).run(scenario);
        all_ok(&outcomes).map_err(|err| format!("{scenario}: {err}"))?;
        for o in &outcomes {
            check(o.value("uneven_steps") == Some("10"), || o.stdout.clone())?;
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

/// `all_reduce_sum_tracked` at 2 and 3 ranks: the sum forward, the sum of
/// every rank's output gradient backward.
fn tracked_sum() -> Result<(), String> {
    for world in [2usize, 3] {
        let outcomes = World::new(world).run("tracked_sum");
        all_ok(&outcomes)?;
        let s = (1..=world).sum::<usize>() as f32;
        let want_sum = format!("{:?}", vec![s, 2.0 * s]);
        let want_grad = format!("{:?}", vec![s, world as f32]);
        for o in &outcomes {
            check(
                o.value("sum") == Some(want_sum.as_str())
                    && o.value("untracked") == Some(want_sum.as_str())
                    && o.value("grad") == Some(want_grad.as_str()),
                || {
                    format!(
                        "world {world}, rank {}: want sum {want_sum}, grad {want_grad}:\n{}",
                        o.rank, o.stdout
                    )
                },
            )?;
        }
    }
    Ok(())
}

/// The SyncBatchNorm scenario's checks: equal to one process with the
/// combined batch and Burn's BatchNorm to 1e-5 (bit for bit in a world of
/// one), Burn's BatchNorm under DDP not (above 1e-4, and 100 times the
/// synchronised gap), one collective of the
/// 4 channels' sums, squares and counts (48 bytes) per direction, none in
/// eval or in a world of one.
fn sync_batch_norm_worlds(cases: &[(usize, &str)]) -> Result<(), String> {
    for &(world, scenario) in cases {
        let outcomes = World::new(world).run(scenario);
        all_ok(&outcomes)?;
        for o in &outcomes {
            let number = |tag| {
                o.value(tag)
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(f64::NAN)
            };
            let (exact, bytes) = if world == 1 {
                (number("sync_diff") == 0.0, "0")
            } else {
                // Burn's BatchNorm cannot normalise an empty batch: the
                // uneven scenario shows it differing.
                let degenerate = scenario == "sync_bn_empty";
                (
                    number("sync_diff") <= 1e-5
                        && (degenerate
                            || number("plain_diff") > f64::max(1e-4, 100.0 * number("sync_diff"))),
                    "48",
                )
            };
            check(
                exact
                    && o.value("replicas_identical") == Some("true")
                    && o.value("forward_bytes") == Some(bytes)
                    && o.value("backward_bytes") == Some(bytes)
                    && o.value("eval_collective_bytes") == Some("0")
                    && (scenario != "sync_bn_empty"
                        || o.value("all_empty_unchanged") == Some("true")),
                || format!("{scenario}, world {world}, rank {}:\n{}", o.rank, o.stdout),
            )?;
        }
    }
    Ok(())
}

/// 1, 2 and 3 ranks with the sharded optimizer (ZeRO stage 1), against DDP
/// with the plain optimizer and one process on the combined batch: within
/// 1e-6 of DDP (a world of one: equal, checked by the rank) and 1e-5 of the
/// one process, as DDP itself; each rank's optimizer record holds only what
/// it owns (fewer entries than the plain record on several ranks), and the
/// ranks' records together hold exactly the plain record's entries; the
/// owners cover every parameter once; the sharded steps hand the
/// collectives at most `max_bytes_ratio` times DDP's bytes.
fn sharded(scenarios: &[&str], max_bytes_ratio: f64) -> Result<(), String> {
    // "owned 3 of 4": the first number; the others: the value.
    let number = |o: &RankOutcome, tag: &str, word: usize| -> Result<f64, String> {
        o.value(tag)
            .and_then(|v| v.split_whitespace().nth(word)?.parse().ok())
            .ok_or_else(|| format!("rank {}: no {tag}:\n{}", o.rank, o.stdout))
    };
    for scenario in scenarios {
        for world in 1..=3 {
            let outcomes = World::new(world).run(scenario);
            all_ok(&outcomes)?;
            let (mut entries, mut owned) = (0.0, 0.0);
            for o in &outcomes {
                let context = || {
                    format!(
                        "{scenario} on {world} rank(s), rank {}:\n{}",
                        o.rank, o.stdout
                    )
                };
                let vs_ddp = number(o, "vs_ddp", 0)?;
                check(vs_ddp <= 1e-6, || {
                    format!("sharded vs DDP {vs_ddp:e}: {}", context())
                })?;
                let vs_reference = number(o, "vs_reference", 0)?;
                check(vs_reference <= 1e-5, || {
                    format!("sharded vs one process {vs_reference:e}: {}", context())
                })?;
                let plain = number(o, "plain_record_entries", 0)?;
                let mine = number(o, "record_entries", 0)?;
                check(world == 1 || mine < plain, || {
                    format!(
                        "a rank's record holds {mine} of {plain} entries: {}",
                        context()
                    )
                })?;
                entries += mine;
                owned += number(o, "owned", 0)?;
                // The collectives' buffers: a reduce-scatter's and an
                // all-gather's are each the size of an all-reduce's (on a
                // ring each moves half its bytes), plus padding; a
                // replicated round adds its owners' broadcasts (2.2); with
                // gradients averaged before, that all-reduce too (3.5).
                let (sharded, ddp) = (number(o, "sharded_bytes", 0)?, number(o, "ddp_bytes", 0)?);
                check(sharded <= max_bytes_ratio * ddp, || {
                    format!(
                        "sharded steps handed {sharded} bytes to collectives, DDP {ddp}: {}",
                        context()
                    )
                })?;
            }
            let first = &outcomes[0];
            let plain = number(first, "plain_record_entries", 0)?;
            let params = number(first, "owned", 2)?;
            check(entries == plain && owned == params && params > 0.0, || {
                format!(
                    "{scenario} on {world} rank(s): the ranks own {owned} of {params} parameters \
                     and their records hold {entries} entries, the plain record {plain}"
                )
            })?;
        }
    }
    Ok(())
}

/// Saved on 2 ranks (the consolidated AdamW state and the model), resumed on
/// 3 ranks and by one process with the plain optimizer; saved on 3, resumed
/// on 2: each ends within 1e-6 of one uninterrupted process (the ranks
/// check it and print `resumed_diff`). The state loaded without the model's
/// record fails every rank's step, naming the fix.
fn sharded_checkpoint() -> Result<(), String> {
    for (saved_on, resumed_on, plain) in [(2, 3, false), (2, 1, true), (3, 2, false)] {
        let dir = std::env::temp_dir().join(format!(
            "burn-ddp-sharded-checkpoint-{}-{saved_on}-{resumed_on}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|err| err.to_string())?;
        let path = dir.to_string_lossy().to_string();
        let saved = World::new(saved_on)
            .env("BURN_DDP_TEST_DIR", &path)
            .run("sharded_save");
        all_ok(&saved)?;
        let mut resume = World::new(resumed_on).env("BURN_DDP_TEST_DIR", &path);
        if plain {
            resume = resume.env("BURN_DDP_TEST_PLAIN", "1");
        }
        let resumed = resume.run("sharded_resume");
        all_ok(&resumed)?;
        for o in &resumed {
            check(o.value("resumed_diff").is_some(), || o.stdout.clone())?;
        }
        if !plain {
            // The state without the model's record: parameter ids it lacks.
            let foreign = World::new(resumed_on)
                .env("BURN_DDP_TEST_DIR", &path)
                .run("sharded_foreign");
            every_rank_failed(
                &foreign,
                false,
                &[
                    "rank {rank}",
                    "none of the model's 2 trained parameters",
                    "load the model's record",
                ],
            )?;
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// The same in parts (`save_parts`, `load_parts`): saved on 2, resumed on
/// 3, by one process with the plain optimizer, saved on 3 and on 1 and
/// resumed on 2, saved on 2 in the background while two more steps run
/// and resumed on 3; each within 1e-6 of one uninterrupted process, with one
/// part per rank that owns a parameter, the metadata last, nothing left
/// beside it. A part cut short or missing stops every rank's load, naming
/// the part and its writer; a save whose rank is killed (SIGKILL) as it
/// begins, after its first entry, once its part is written, or (rank 0)
/// between the metadata and the rename fails the other ranks fast and
/// leaves no checkpoint under the name, and the one before it loads;
/// killed once rank 0 renamed the folder, the checkpoint is whole and
/// resumes exactly.
fn sharded_checkpoint_in_parts() -> Result<(), String> {
    let cases = [
        (2, 3, false, false),
        (2, 1, true, false),
        (3, 2, false, false),
        (1, 2, false, false),
        (2, 3, false, true),
    ];
    for (saved_on, resumed_on, plain, background) in cases {
        let dir = scratch_dir(&format!("parts-{saved_on}-{resumed_on}-{background}"))?;
        let path = dir.to_string_lossy().to_string();
        let world = |n: usize| {
            World::new(n)
                .env("BURN_DDP_TEST_DIR", &path)
                .env("BURN_DDP_TEST_PARTS", "parts")
        };
        let saving = match background {
            true => world(saved_on).env("BURN_DDP_TEST_BACKGROUND", "1"),
            false => world(saved_on),
        };
        all_ok(&saving.run("sharded_save"))?;
        let parts = dir.join("parts");
        let metadata = std::fs::read_to_string(parts.join("metadata.json"))
            .map_err(|err| format!("saved on {saved_on}: {err}"))?;
        let files = std::fs::read_dir(&parts)
            .map_err(|err| err.to_string())?
            .filter(|e| {
                let name = e.as_ref().map(|e| e.file_name()).unwrap_or_default();
                name.to_string_lossy().starts_with("part-")
            })
            .count();
        let states = metadata.matches("\"kind\": \"optimizer_state\"").count();
        let listed = metadata.matches("\"file\": \"part-").count();
        // One part per rank that owns a parameter (the toy has two), each
        // one listed, and the state of both parameters.
        check(
            files == listed && (1..=saved_on.min(2)).contains(&files) && states == 2,
            || {
                format!("saved on {saved_on}: {files} part files, {listed} listed, {states} states:\n{metadata}")
            },
        )?;
        let resumed = if plain {
            world(resumed_on).env("BURN_DDP_TEST_PLAIN", "1")
        } else {
            world(resumed_on)
        }
        .run("sharded_resume");
        all_ok(&resumed)?;
        for o in &resumed {
            check(o.value("resumed_diff").is_some(), || o.stdout.clone())?;
        }
        if (saved_on, resumed_on, background) == (2, 3, false) {
            parts_faults(&dir, &path)?;
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

/// [`sharded_checkpoint_in_parts`]' faults, on the checkpoint in `dir/parts`
/// saved on 2 ranks.
fn parts_faults(dir: &std::path::Path, path: &str) -> Result<(), String> {
    let resume = |name: &str| {
        World::new(3)
            .env("BURN_DDP_TEST_DIR", path)
            .env("BURN_DDP_TEST_PARTS", name)
            .run("sharded_resume")
    };
    // Killed mid-save: the others fail fast; nothing is under the new name
    // (but once rank 0 has renamed the folder: then it is whole and loads),
    // and the earlier checkpoint still loads.
    let moments = [
        (1, "begun"),
        (1, "writing"),
        (1, "written"),
        (0, "committing"),
        (0, "renamed"),
    ];
    for (dead, moment) in moments {
        let name = format!("parts-{moment}");
        let killed = World::new(2)
            .env("BURN_DDP_TEST_DIR", path)
            .env("BURN_DDP_TEST_PARTS", &name)
            .env(CRASH_IN_SAVE_VAR, &format!("{dead}:{moment}"))
            .run("sharded_save");
        let names_dead = format!("rank {dead}");
        survivors_failed_within(
            &killed,
            dead,
            std::time::Duration::from_secs(20),
            false,
            &[&names_dead],
        )
        .map_err(|err| format!("killed {moment}: {err}"))?;
        if moment == "renamed" {
            all_ok(&resume(&name)).map_err(|err| format!("killed {moment}: {err}"))?;
            continue;
        }
        check(!dir.join(&name).exists(), || {
            format!("{name} exists after a kill")
        })?;
        every_rank_failed(&resume(&name), false, &["not a whole sharded checkpoint"])?;
    }
    all_ok(&resume("parts"))?;
    // A part cut short, then missing: every rank says which, and who wrote it.
    let part = dir.join("parts").join("part-00000.bin");
    let bytes = std::fs::read(&part).map_err(|err| err.to_string())?;
    std::fs::write(&part, &bytes[..bytes.len() - 1]).map_err(|err| err.to_string())?;
    every_rank_failed(
        &resume("parts"),
        false,
        &[
            "rank {rank}: part-00000.bin (written by rank 0 of 2)",
            "truncated",
        ],
    )?;
    std::fs::remove_file(&part).map_err(|err| err.to_string())?;
    every_rank_failed(
        &resume("parts"),
        false,
        &["part-00000.bin (written by rank 0 of 2)", "missing"],
    )
}

fn scratch_dir(name: &str) -> Result<std::path::PathBuf, String> {
    let dir = std::env::temp_dir().join(format!("burn-ddp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|err| err.to_string())?;
    Ok(dir)
}

/// 3 micro-batches a step accumulated locally, one sharded step: 2 and 3
/// ranks equal one process on the whole batch (each rank checks it).
fn sharded_accumulation() -> Result<(), String> {
    for world in [2, 3] {
        let outcomes = World::new(world).run("sharded_accumulation");
        all_ok(&outcomes)?;
        for o in &outcomes {
            check(o.value("max_rel_diff").is_some(), || o.stdout.clone())?;
        }
    }
    Ok(())
}

/// Rank 1's layer is wider: the sharded step fails on every rank, naming
/// the shapes.
fn sharded_different_models() -> Result<(), String> {
    let outcomes = World::new(2).run("sharded_different_models");
    every_rank_failed(
        &outcomes,
        true,
        &["parameter #0", "[10, 1]", "[10, 2]", "rank {rank}"],
    )
}

/// Gradients clipped to a global norm on 1, 2 and 3 ranks: within 1e-5 of
/// one process on the combined batch clipped the same way, and the clipping
/// did act on some steps and not on others (a norm computed per rank, or
/// not clipped at all, would differ).
fn sharded_global_clip() -> Result<(), String> {
    for world in 1..=3 {
        let outcomes = World::new(world).run("sharded_conv_global_clip");
        all_ok(&outcomes)?;
        for o in &outcomes {
            let context = || format!("{world} rank(s), rank {}:\n{}", o.rank, o.stdout);
            let gap = o.value("vs_reference").and_then(|v| v.parse::<f64>().ok());
            check(gap.is_some_and(|gap| gap <= 1e-5), context)?;
            let clipped = o.value("clipped").and_then(|v| {
                let mut words = v.split_whitespace();
                let n: usize = words.next()?.parse().ok()?;
                let of: usize = words.nth(1)?.parse().ok()?;
                Some((n, of))
            });
            check(clipped.is_some_and(|(n, of)| n > 0 && n < of), context)?;
        }
    }
    Ok(())
}

/// `BURN_DDP_BACKEND=nccl` with CPU tensors: the sharded step is refused
/// on every rank with the reason DDP gives, and nothing is stepped; with
/// `auto` the same step goes through the host path.
fn sharded_nccl_refused() -> Result<(), String> {
    let why = NCCL_REFUSAL.get().copied().unwrap_or_default();
    let outcomes = World::new(2)
        .env("BURN_DDP_BACKEND", "nccl")
        .run("sharded_one_step");
    every_rank_failed(
        &outcomes,
        true,
        &[&format!("rank {{rank}}: BURN_DDP_BACKEND=nccl, but {why}")],
    )?;
    for o in &outcomes {
        check(!o.stdout.contains("stepped"), || format!("{o:?}"))?;
    }
    let outcomes = World::new(2)
        .env("BURN_DDP_BACKEND", "auto")
        .run("sharded_one_step");
    all_ok(&outcomes)?;
    for o in &outcomes {
        check(o.stdout.contains("stepped"), || o.stdout.clone())?;
    }
    Ok(())
}

/// 1 x 128, 2 x 64 and 3 x 32.
fn sync_batch_norm() -> Result<(), String> {
    sync_batch_norm_worlds(&[(1, "sync_bn"), (2, "sync_bn"), (3, "sync_bn")])
}

/// Rank r with 2r more samples than rank 0; rank 0 with none; then a step
/// where no rank has a sample leaves the running statistics as they were.
fn sync_batch_norm_uneven() -> Result<(), String> {
    sync_batch_norm_worlds(&[
        (2, "sync_bn_uneven"),
        (3, "sync_bn_uneven"),
        (2, "sync_bn_empty"),
        (3, "sync_bn_empty"),
    ])
}

/// Rank 1's layer has 5 channels, rank 0's 4: wrapping it fails on both,
/// naming the shapes; the lone layer's first training pass fails both
/// within the timeout, naming their rank, the layer and the other rank's
/// width.
fn sync_batch_norm_channels_differ() -> Result<(), String> {
    let mut world = World::new(2);
    world.timeout_secs = 10.0;
    world.deadline = std::time::Duration::from_secs(60);
    let outcomes = world.run("sync_bn_channels_differ");
    for o in &outcomes {
        let wrap_error = o.value("wrap_error").unwrap_or_default();
        check(
            wrap_error.contains("[4] F32 on rank") && wrap_error.contains("[5] F32 on rank"),
            || format!("rank {}: {}", o.rank, o.stdout),
        )?;
    }
    every_rank_failed(
        &outcomes,
        false,
        &[
            "rank {rank}: SyncBatchNorm with",
            "(the #1 this rank trained)",
            "channels; every rank must run the same SyncBatchNorm layers",
        ],
    )
}

/// Launched as 2 ranks, no `init_process_group`: both fail at the first
/// training forward pass, naming the fix.
fn sync_batch_norm_before_init() -> Result<(), String> {
    let outcomes = World::new(2).run("sync_bn_before_init");
    every_rank_failed(
        &outcomes,
        false,
        &[
            "rank {rank}: SyncBatchNorm with 4 channels ran in training before init_process_group",
            "call init_process_group() first",
        ],
    )
}
