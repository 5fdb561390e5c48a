//! The Learner strategy's multi-process checks, shared by both Burn
//! front-ends: each front-end's `tests/learner` binary is a program (one rank
//! of a scenario, its Burn version's code) and [`run_suite`], which starts the
//! scenarios as real processes and checks what they print and write:
//! parameters against a single-process reference, the files of each rank,
//! the experiment folder, resume, a missing checkpoint, early stopping,
//! interrupts, gradient accumulation, unequal loaders and a world of one.

use crate::{all_ok, check, survivors_failed_within, Case, RankOutcome, World};
use burn_ddp_training::sharded::CRASH_IN_SAVE_VAR;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The scenario's folder.
pub const DIR_VAR: &str = "LEARNER_TEST_DIR";
/// Set: every rank uses the folder itself (resume); unset: `rank<N>` below it.
pub const SHARED_DIR_VAR: &str = "LEARNER_TEST_SHARED_DIR";
/// `sgd` (default) or `adamw`.
pub const OPTIMIZER_VAR: &str = "LEARNER_TEST_OPTIMIZER";
/// Epochs to train.
pub const EPOCHS_VAR: &str = "LEARNER_TEST_EPOCHS";
/// The epoch to resume after.
pub const RESUME_VAR: &str = "LEARNER_TEST_RESUME";
/// Set: the Learner's optimizer is sharded (`with_sharded_optimizer`).
pub const SHARDED_VAR: &str = "LEARNER_TEST_SHARDED";
/// Each rank's batch in the `train` scenario (default 8).
pub const BATCH_VAR: &str = "LEARNER_TEST_BATCH";
/// Epochs when [`EPOCHS_VAR`] is not set.
pub const EPOCHS: usize = 2;

/// The extension of Burn's checkpoint files (`mpk` for 0.21, `bpk` for 0.22).
static CHECKPOINT_EXTENSION: OnceLock<&'static str> = OnceLock::new();

fn checkpoint_extension() -> &'static str {
    CHECKPOINT_EXTENSION.get().copied().unwrap_or("mpk")
}

/// A learner test binary's `main`: as a rank (the scenario variable set),
/// runs `program(scenario)` and exits; otherwise runs every case, and the
/// front-end's `extra` ones, whose ranks are this binary again.
/// `checkpoint_extension` is what the Burn version's file checkpointer writes.
pub fn run_suite(
    program: fn(&str) -> Result<(), String>,
    checkpoint_extension: &'static str,
    extra: &[Case],
) -> ! {
    let _ = CHECKPOINT_EXTENSION.set(checkpoint_extension);
    let cases: &[Case] = &[
        (
            "two_ranks_equal_one_process_with_twice_the_batch",
            equals_big_batch,
        ),
        ("only_rank_0_writes_files", files),
        (
            "the_artifact_folder_is_prepared_once_for_every_rank",
            artifact_dir,
        ),
        ("resume_continues_as_if_uninterrupted", resume),
        (
            "a_sharded_optimizer_equals_one_process_with_twice_the_batch",
            sharded_equals_big_batch,
        ),
        (
            "a_sharded_run_saves_in_parts_and_resumes_on_1_2_and_4_ranks_sharded_or_not",
            sharded_resume,
        ),
        (
            "a_rank_killed_while_saving_in_parts_leaves_the_epoch_before",
            killed_while_saving_in_parts,
        ),
        (
            "a_missing_checkpoint_is_named_on_the_rank",
            missing_checkpoint,
        ),
        ("early_stopping_on_rank_0_stops_every_rank", early_stopping),
        ("an_interrupt_on_rank_1_stops_both_ranks", interrupt),
        (
            "gradient_accumulation_syncs_once_per_optimizer_step",
            accumulation,
        ),
        ("unequal_loaders_fail_on_every_rank", unequal_loaders),
        (
            "a_world_of_one_is_burns_single_device_strategy",
            world_of_one,
        ),
    ];
    crate::run_program_or_cases(program, cases, extra)
}

/// A fresh folder for a case.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("burn-ddp-learner-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn params(outcome: &RankOutcome) -> Result<Vec<u32>, String> {
    let line = outcome.value("params").ok_or_else(|| {
        format!(
            "rank {} printed no parameters:\n{}",
            outcome.rank, outcome.stdout
        )
    })?;
    Ok(line
        .split(',')
        .map(|bits| u32::from_str_radix(bits, 16).unwrap())
        .collect())
}

fn same_on_every_rank(outcomes: &[RankOutcome]) -> Result<Vec<u32>, String> {
    let first = params(&outcomes[0])?;
    for o in &outcomes[1..] {
        check(params(o)? == first, || {
            format!("rank {}'s parameters differ from rank 0's", o.rank)
        })?;
    }
    Ok(first)
}

/// Two ranks of the scenario in `dir`, with `extra` environment variables.
pub fn learner_world(dir: &Path, extra: &[(&str, &str)]) -> World {
    learner_world_of(2, dir, extra)
}

/// `ranks` ranks of the scenario in `dir`, with `extra` environment variables.
pub fn learner_world_of(ranks: usize, dir: &Path, extra: &[(&str, &str)]) -> World {
    let mut world = World::new(ranks).env(DIR_VAR, dir.to_str().unwrap());
    for (key, value) in extra {
        world = world.env(key, value);
    }
    world
}

/// 2 ranks x batch 8 against one process with batch 16 over the same global
/// order (rank 0's initial parameters, rank 1 built from another seed), with
/// SGD and AdamW; each rank prints its gap to the reference.
fn equals_big_batch() -> Result<(), String> {
    big_batch(&[])
}

/// [`equals_big_batch`] with the Learner's optimizer sharded.
fn sharded_equals_big_batch() -> Result<(), String> {
    big_batch(&[(SHARDED_VAR, "1")])
}

fn big_batch(extra: &[(&str, &str)]) -> Result<(), String> {
    for optimizer in ["sgd", "adamw"] {
        let dir = scratch(&format!("big-batch-{optimizer}-{}", extra.len()));
        let mut env = vec![(OPTIMIZER_VAR, optimizer)];
        env.extend_from_slice(extra);
        let outcomes = learner_world(&dir, &env).run("against_reference");
        all_ok(&outcomes)?;
        same_on_every_rank(&outcomes)?;
        for o in &outcomes {
            let gap: f64 = o.value("max_rel_diff").unwrap().parse().unwrap();
            check(gap < 1e-6, || {
                format!(
                    "{optimizer}: rank {} is {gap} away from the reference",
                    o.rank
                )
            })?;
        }
        if extra.contains(&(SHARDED_VAR, "1")) {
            // Each rank has its own folder: the sharded state is gathered
            // whole for Burn's checkpointer, and rank 0's log says why.
            let log = std::fs::read_to_string(dir.join("rank0").join("experiment.log"))
                .map_err(|e| format!("experiment.log: {e}"))?;
            check(log.contains("rank(s) 1 do not see"), || {
                format!("rank 0's log does not say why it gathers the state:\n{log}")
            })?;
            let parts = dir.join("rank0").join("checkpoint").join("optim-parts-1");
            check(!parts.exists(), || {
                format!("{} was written", parts.display())
            })?;
        }
        // Rank 0's global valid accuracy is the reference's over the whole set.
        let csv = std::fs::read_to_string(dir.join("rank0").join("global-metrics.csv"))
            .map_err(|e| format!("global-metrics.csv: {e}"))?;
        let expected: f64 = outcomes[0]
            .value("reference_valid_accuracy")
            .unwrap()
            .parse()
            .unwrap();
        let reported = csv
            .lines()
            .rfind(|l| l.contains(",valid,Accuracy,"))
            .and_then(|l| l.split(',').nth(3))
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| format!("no valid accuracy in {csv}"))?;
        check((reported - expected).abs() < 1e-9, || {
            format!("global valid accuracy {reported} != reference {expected}")
        })?;
        // The end-of-training summary a program shows is the global one too,
        // not rank 0's half of the validation set.
        let summarized: f64 = outcomes[0]
            .value("summary_valid_Accuracy")
            .ok_or_else(|| format!("rank 0 printed no summary:\n{}", outcomes[0].stdout))?
            .parse()
            .unwrap();
        check((summarized - expected).abs() < 1e-9, || {
            format!("the summary's valid accuracy {summarized} != the global {expected}")
        })?;
    }
    Ok(())
}

fn files_under(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                found.push(path.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    found.sort();
    found
}

/// Each rank gets its own folder: rank 1's stays empty, rank 0's holds exactly
/// what a single-process Learner writes plus the global figures.
fn files() -> Result<(), String> {
    let dir = scratch("files");
    let outcomes = learner_world(&dir, &[]).run("against_reference");
    all_ok(&outcomes)?;
    let rank1 = files_under(&dir.join("rank1"));
    check(rank1.is_empty(), || format!("rank 1 wrote {rank1:?}"))?;
    let mut expected: Vec<String> = vec!["experiment.log".into(), "global-metrics.csv".into()];
    for epoch in 1..=EPOCHS {
        for name in ["model", "optim", "scheduler"] {
            expected.push(format!(
                "checkpoint/{name}-{epoch}.{}",
                checkpoint_extension()
            ));
        }
        for split in ["train", "valid"] {
            for metric in ["Accuracy", "Loss"] {
                expected.push(format!("{split}/epoch-{epoch}/{metric}.log"));
            }
        }
    }
    expected.sort();
    let rank0 = files_under(&dir.join("rank0"));
    check(rank0 == expected, || {
        format!("rank 0 wrote {rank0:?}, expected {expected:?}")
    })?;
    // Only errors may reach the terminal from rank 1: nothing at all here.
    let stderr = outcomes[1].stderr.trim();
    check(stderr.is_empty(), || format!("rank 1 printed {stderr:?}"))
}

/// 3 ranks share a folder with a stale file: gone for all after
/// `recreate_artifact_dir`, rank 0's new file kept by `create_artifact_dir`,
/// and an impossible folder an error on every rank naming it.
fn artifact_dir() -> Result<(), String> {
    let dir = scratch("artifact-dir");
    std::fs::write(dir.join("stale.txt"), "from an earlier run").unwrap();
    let world = World::new(3)
        .env(DIR_VAR, dir.to_str().unwrap())
        .env(SHARED_DIR_VAR, "1");
    let outcomes = world.run("artifact_dir");
    all_ok(&outcomes)?;
    let impossible = dir.join("fresh.txt").join("sub");
    for o in &outcomes {
        check(o.value("stale_left") == Some("false"), || o.stdout.clone())?;
        check(o.value("fresh_kept") == Some("true"), || o.stdout.clone())?;
        let error = o.value("prepare_error").unwrap_or_default();
        let expected = if o.rank == 0 {
            format!(
                "rank 0: cannot recreate the experiment folder {}",
                impossible.display()
            )
        } else {
            format!(
                "rank {}: rank 0 could not prepare the experiment folder {}",
                o.rank,
                impossible.display()
            )
        };
        check(error.starts_with(&expected), || o.stdout.clone())?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// 4 epochs straight, against 2 then a resume to 4 in one shared folder
/// (full-precision checkpoints): identical parameters on both ranks, and the
/// metric files continue at epoch 3.
fn resume() -> Result<(), String> {
    let straight_dir = scratch("straight");
    let straight =
        learner_world(&straight_dir, &[(SHARED_DIR_VAR, "1"), (EPOCHS_VAR, "4")]).run("train");
    all_ok(&straight)?;
    let seen_straight = straight[0]
        .value("valid_loss_by_epoch")
        .unwrap_or("")
        .to_string();
    let straight = same_on_every_rank(&straight)?;

    let dir = scratch("resumed");
    let first = learner_world(&dir, &[(SHARED_DIR_VAR, "1"), (EPOCHS_VAR, "2")]).run("train");
    all_ok(&first)?;
    let loss_epoch_1 = std::fs::read_to_string(dir.join("train/epoch-1/Loss.log")).unwrap();
    let resumed = learner_world(
        &dir,
        &[(SHARED_DIR_VAR, "1"), (EPOCHS_VAR, "4"), (RESUME_VAR, "2")],
    )
    .run("train");
    all_ok(&resumed)?;
    // Rank 0's store still knows the global figures of epochs 1 and 2 (Burn's
    // best-checkpoint and early-stopping strategies ask it), as in the run
    // that never stopped.
    let seen_resumed = resumed[0]
        .value("valid_loss_by_epoch")
        .unwrap_or("")
        .to_string();
    check(
        seen_resumed == seen_straight && !seen_straight.contains("none"),
        || format!("after the resume the store answers {seen_resumed}, straight {seen_straight}"),
    )?;
    // One row per epoch, split and metric, the same figures as the straight run.
    let csv = |d: &Path| std::fs::read_to_string(d.join("global-metrics.csv")).unwrap_or_default();
    check(
        csv(&dir) == csv(&straight_dir) && csv(&dir).lines().count() == 17,
        || {
            format!(
                "global-metrics.csv after the resume:\n{}\nstraight:\n{}",
                csv(&dir),
                csv(&straight_dir)
            )
        },
    )?;
    let resumed = same_on_every_rank(&resumed)?;
    // Redoing epochs 3 and 4 in the folder that already has them replaces
    // their rows instead of adding a second set.
    let redo = learner_world(
        &straight_dir,
        &[(SHARED_DIR_VAR, "1"), (EPOCHS_VAR, "4"), (RESUME_VAR, "2")],
    )
    .run("train");
    all_ok(&redo)?;
    check(csv(&straight_dir) == csv(&dir), || {
        format!("after redoing epochs 3-4:\n{}", csv(&straight_dir))
    })?;
    check(resumed == straight, || {
        "2 epochs + resume to 4 ended with other parameters than 4 epochs straight".into()
    })?;
    for epoch in [3, 4] {
        let path = dir.join(format!("train/epoch-{epoch}/Loss.log"));
        check(path.exists(), || {
            format!("{} is missing after the resume", path.display())
        })?;
    }
    let after = std::fs::read_to_string(dir.join("train/epoch-1/Loss.log")).unwrap();
    check(after == loss_epoch_1, || {
        "the resumed run wrote into epoch 1's metric files".into()
    })
}

/// AdamW on 2 ranks, its state sharded for 2 epochs in one shared folder:
/// each epoch's checkpoint holds the optimizer state in parts, one per rank
/// (`optim-parts-N`). Then resumed to 4 epochs from copies of that folder:
/// sharded and not on 2 ranks, sharded on 4 (batch 4 each) and unsharded on
/// 1 (batch 16), the global batch 16 throughout. Each ends with the
/// parameters of 4 epochs straight on 2 ranks without sharding, within 1e-6
/// (the global batches hold the same samples whatever the world: the
/// sampler deals contiguous blocks of its order; Burn 0.21's Learner takes
/// the shared parameters as a record, which settles SyncBatchNorm's running
/// mean, its variance's shift, at other moments: rounding), and a resume on
/// 4 ranks saves its own checkpoints in 4 parts.
fn sharded_resume() -> Result<(), String> {
    let straight_dir = scratch("sharded-straight");
    let straight =
        learner_world(&straight_dir, &[(SHARED_DIR_VAR, "1"), (EPOCHS_VAR, "4")]).run("train");
    all_ok(&straight)?;
    let straight = same_on_every_rank(&straight)?;
    let first_dir = scratch("sharded-first");
    let sharded = [(SHARED_DIR_VAR, "1"), (SHARDED_VAR, "1")];
    let first =
        learner_world(&first_dir, &[sharded[0], sharded[1], (EPOCHS_VAR, "2")]).run("train");
    all_ok(&first)?;
    for epoch in 1..=2 {
        check_parts(&first_dir, epoch, 2)?;
    }
    for (ranks, batch, resume_sharded) in [
        (2, "8", false),
        (2, "8", true),
        (4, "4", true),
        (1, "16", false),
    ] {
        let dir = scratch(&format!("sharded-resume-{ranks}-{resume_sharded}"));
        copy_folder(&first_dir, &dir)?;
        let mut env = vec![
            (SHARED_DIR_VAR, "1"),
            (EPOCHS_VAR, "4"),
            (RESUME_VAR, "2"),
            (BATCH_VAR, batch),
        ];
        if resume_sharded {
            env.push((SHARDED_VAR, "1"));
        }
        let resumed = learner_world_of(ranks, &dir, &env).run("train");
        all_ok(&resumed)?;
        let resumed = same_on_every_rank(&resumed)?;
        let floats = |bits: &[u32]| bits.iter().map(|b| f32::from_bits(*b)).collect::<Vec<_>>();
        let gap = crate::numbers::max_relative_difference(&floats(&resumed), &floats(&straight));
        let how = if resume_sharded {
            "sharded"
        } else {
            "unsharded"
        };
        check(gap <= 1e-6, || {
            format!(
                "2 sharded epochs + a resume to 4 on {ranks} rank(s) ({how}) ended {gap:e} away \
                 from 4 epochs straight"
            )
        })?;
        if resume_sharded {
            check_parts(&dir, 4, ranks)?;
        } else {
            let parts = dir.join("checkpoint").join("optim-parts-4");
            check(!parts.exists(), || {
                format!("an unsharded run wrote {}", parts.display())
            })?;
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_dir_all(&first_dir);
    let _ = std::fs::remove_dir_all(&straight_dir);
    Ok(())
}

/// The sharded Learner, 2 ranks in one shared folder, after a first run
/// of 1 epoch: a rank SIGKILLed while epoch 2 is saved in parts (rank 1 in
/// the middle of its part; rank 0 after the parts are whole, before Burn's
/// files). The other rank fails within the timeout naming it; the newest
/// checkpoint is still epoch 1 (`latest_checkpoint`, what `--resume auto`
/// programs call, picks it), and the run resumed from it ends as 3 epochs
/// straight (1e-6), with epochs 2 and 3 whole in parts and nothing of the
/// interrupted save left.
fn killed_while_saving_in_parts() -> Result<(), String> {
    let straight_dir = scratch("parts-kill-straight");
    let straight =
        learner_world(&straight_dir, &[(SHARED_DIR_VAR, "1"), (EPOCHS_VAR, "3")]).run("train");
    all_ok(&straight)?;
    let straight = same_on_every_rank(&straight)?;
    for (dead, moment) in [(1, "writing"), (0, "renamed")] {
        let dir = scratch(&format!("parts-kill-{moment}"));
        let sharded = [(SHARED_DIR_VAR, "1"), (SHARDED_VAR, "1")];
        let first = learner_world(&dir, &[sharded[0], sharded[1], (EPOCHS_VAR, "1")]).run("train");
        all_ok(&first)?;
        let crash = format!("{dead}:{moment}");
        let again = [
            sharded[0],
            sharded[1],
            (EPOCHS_VAR, "3"),
            (RESUME_VAR, "auto"),
        ];
        let mut killed_env = again.to_vec();
        killed_env.push((CRASH_IN_SAVE_VAR, &crash));
        let killed = learner_world(&dir, &killed_env).run("train");
        let names_dead = format!("rank {dead}");
        survivors_failed_within(
            &killed,
            dead,
            Duration::from_secs(30),
            false,
            &[&names_dead],
        )
        .map_err(|err| format!("killed {moment}: {err}"))?;
        let model_2 = dir
            .join("checkpoint")
            .join(format!("model-2.{}", checkpoint_extension()));
        check(!model_2.exists(), || {
            format!("killed {moment}: {} was written", model_2.display())
        })?;
        let resumed = learner_world(&dir, &again).run("train");
        all_ok(&resumed)?;
        check(resumed[0].value("resumed_from") == Some("1"), || {
            format!(
                "killed {moment}: resumed from {:?}, not epoch 1",
                resumed[0].value("resumed_from")
            )
        })?;
        let resumed = same_on_every_rank(&resumed)?;
        let floats = |bits: &[u32]| bits.iter().map(|b| f32::from_bits(*b)).collect::<Vec<_>>();
        let gap = crate::numbers::max_relative_difference(&floats(&resumed), &floats(&straight));
        check(gap <= 1e-6, || {
            format!("killed {moment}: the resumed run ended {gap:e} away from 3 epochs straight")
        })?;
        check_parts(&dir, 2, 2)?;
        check_parts(&dir, 3, 2)?;
        let left: Vec<String> = std::fs::read_dir(dir.join("checkpoint"))
            .map_err(|e| e.to_string())?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|name| name.contains(".partial-"))
            .collect();
        check(left.is_empty(), || {
            format!("killed {moment}: {left:?} left in the checkpoint folder")
        })?;
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_dir_all(&straight_dir);
    Ok(())
}

/// Epoch `epoch`'s checkpoint in `dir` has its optimizer state in `ranks`
/// parts, whole (its metadata, written last, there).
fn check_parts(dir: &Path, epoch: usize, ranks: usize) -> Result<(), String> {
    let parts = dir.join("checkpoint").join(format!("optim-parts-{epoch}"));
    let mut names: Vec<String> = std::fs::read_dir(&parts)
        .map_err(|e| format!("{}: {e}", parts.display()))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut expected: Vec<String> = (0..ranks).map(|r| format!("part-{r:05}.bin")).collect();
    expected.push("metadata.json".into());
    expected.sort();
    check(names == expected, || {
        format!("{} holds {names:?}, not {expected:?}", parts.display())
    })
}

/// A copy of the folder `from` (files and folders) at `to`.
fn copy_folder(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::create_dir_all(to).map_err(|e| e.to_string())?;
    for entry in std::fs::read_dir(from)
        .map_err(|e| e.to_string())?
        .flatten()
    {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_folder(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Rank 1 has its own (empty) folder: it must load the checkpoint itself, so it
/// fails naming the folder and what to do.
fn missing_checkpoint() -> Result<(), String> {
    let dir = scratch("missing");
    let first = learner_world(&dir, &[(EPOCHS_VAR, "1")]).run("train");
    all_ok(&first)?;
    let outcomes = learner_world(&dir, &[(EPOCHS_VAR, "2"), (RESUME_VAR, "1")]).run("train");
    let rank1 = &outcomes[1];
    check(rank1.code != Some(0), || {
        "rank 1 resumed without a checkpoint".into()
    })?;
    let folder = dir.join("rank1").join("checkpoint");
    for needle in [
        "rank 1: cannot resume from epoch 1",
        &folder.display().to_string(),
        "copy the experiment's checkpoint folder",
    ] {
        check(rank1.stderr.contains(needle), || {
            format!("rank 1's error lacks {needle:?}:\n{}", rank1.stderr)
        })?;
    }
    // Rank 0 is not left waiting: it ends within the world's deadline too.
    check(outcomes.iter().all(|o| !o.killed_at_deadline), || {
        format!("a rank hung: {outcomes:?}")
    })
}

fn epochs_run(o: &RankOutcome) -> usize {
    o.value("epochs_run")
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX)
}

/// An early-stopping strategy that says stop after epoch 2 on rank 0 only.
fn early_stopping() -> Result<(), String> {
    let dir = scratch("early");
    let started = Instant::now();
    let outcomes = learner_world(&dir, &[(EPOCHS_VAR, "10")]).run("early_stop");
    all_ok(&outcomes)?;
    for o in &outcomes {
        check(epochs_run(o) == 2, || {
            format!(
                "rank {} ran {} epochs, not 2:\n{}",
                o.rank,
                epochs_run(o),
                o.stdout
            )
        })?;
    }
    check(started.elapsed() < Duration::from_secs(60), || {
        format!("early stopping took {:?}", started.elapsed())
    })
}

/// Rank 1's interrupter is stopped while it fetches its 5th batch of epoch 1:
/// both ranks stop before that iteration, after 4 optimizer steps.
fn interrupt() -> Result<(), String> {
    let dir = scratch("interrupt");
    let outcomes = learner_world(&dir, &[(EPOCHS_VAR, "3")]).run("interrupt_rank_1");
    all_ok(&outcomes)?;
    for o in &outcomes {
        let steps = o.value("optimizer_steps").unwrap_or("?");
        check(steps == "4", || {
            format!(
                "rank {} took {steps} optimizer steps, not 4:\n{}",
                o.rank, o.stdout
            )
        })?;
    }
    Ok(())
}

/// Gradient accumulation with rank 0 checkpointing (0.21: 4 micro-batches a
/// step on `Ddp<Autodiff<NdArray>>`; 0.22: 3, with an epoch's leftover
/// applied at its end): one gradient sync per optimizer step, and the
/// parameters of one process summing the same micro-batches.
fn accumulation() -> Result<(), String> {
    let dir = scratch("accumulation");
    let outcomes = learner_world(&dir, &[]).run("accumulation");
    all_ok(&outcomes)?;
    same_on_every_rank(&outcomes)?;
    for o in &outcomes {
        let syncs = o.value("syncs").unwrap_or("?");
        let steps = o.value("optimizer_steps").unwrap_or("?");
        check(syncs == steps && syncs != "0", || {
            format!("rank {}: {syncs} syncs for {steps} optimizer steps", o.rank)
        })?;
        let gap: f64 = o.value("max_rel_diff").unwrap().parse().unwrap();
        check(gap < 1e-6, || {
            format!("rank {} is {gap} from the reference", o.rank)
        })?;
    }
    Ok(())
}

/// Rank 1's training set is shorter and not padded: both ranks fail before the
/// first step, naming every rank's length.
fn unequal_loaders() -> Result<(), String> {
    let dir = scratch("unequal");
    let started = Instant::now();
    let outcomes = learner_world(&dir, &[]).run("unequal");
    for o in &outcomes {
        check(o.code != Some(0), || format!("rank {} succeeded", o.rank))?;
        for needle in ["different lengths", "rank 0: 64, rank 1: 48"] {
            check(o.stderr.contains(needle), || {
                format!("rank {}'s error lacks {needle:?}:\n{}", o.rank, o.stderr)
            })?;
        }
    }
    check(started.elapsed() < Duration::from_secs(60), || {
        format!("took {:?}", started.elapsed())
    })
}

/// One process: burn-ddp's strategy and Burn's SingleDevice end bitwise equal.
fn world_of_one() -> Result<(), String> {
    let dir = scratch("one");
    let outcomes = World::new(1)
        .env(DIR_VAR, dir.to_str().unwrap())
        .run("single_device_parity");
    all_ok(&outcomes)?;
    let o = &outcomes[0];
    check(o.value("bitwise_equal") == Some("true"), || {
        o.stdout.clone()
    })
}
