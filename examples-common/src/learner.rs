//! What `mnist --learner` does alike on both Burn versions (the rest is each
//! version's Learner API): one line per epoch from the global figures,
//! `--resume auto`'s check that the folder holds this run's checkpoints, the
//! newest finished epoch, and what rank 0 says after a stop.

use crate::{fail, run_config};
use burn_ddp_comm::{ProcessGroup, ReduceOp};
use burn_ddp_training::learner::{EpochReport, Split, CHECKPOINT_NAMES};
use burn_ddp_training::{snapshots, stop};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::Path;

/// The hand-written trainer's epoch line, from the figures summed over the ranks.
pub fn print_epoch(report: &EpochReport) {
    let figure = |split, name| report.value(split, name).unwrap_or(f64::NAN);
    println!(
        "epoch={} train_loss={:.4} valid_loss={:.4} test_acc={:.2}% epoch_time={:.1}s",
        report.epoch,
        figure(Split::Train, "Loss"),
        figure(Split::Valid, "Loss"),
        figure(Split::Valid, "Accuracy"),
        report.train_time.as_secs_f64()
    );
}

/// `--resume auto` in a folder another run's configuration (other than its
/// epochs) was saved in: an error on every rank (rank 0 reads the file and
/// names what differs), not a resume from its checkpoints. Collective.
pub fn refuse_another_run<C: Serialize + DeserializeOwned>(
    config: &C,
    saved: &Path,
    group: &ProcessGroup,
) {
    let rank = group.rank();
    let mut changed = Vec::new();
    if group.is_main() && saved.exists() {
        changed = run_config::load::<C>(saved)
            .map(|saved| run_config::differences(&saved, config, &["epochs"]))
            .unwrap_or_else(|err| vec![format!("unreadable ({err})")]);
    }
    let mut refused = [!changed.is_empty() as i64];
    group
        .broadcast(&mut refused, 0)
        .unwrap_or_else(|e| fail(Some(rank), e));
    if refused[0] == 0 {
        return;
    }
    let why = if group.is_main() {
        format!("another run's ({})", changed.join(", "))
    } else {
        "another run's (rank 0 names what differs)".to_string()
    };
    fail(
        Some(rank),
        format!(
            "--resume auto: the checkpoints beside {} are {why}; run with those settings, or \
             give another --artifact-dir",
            saved.display()
        ),
    );
}

/// What rank 0 says of `--resume auto`'s choice.
pub fn announce_resume(latest: Option<usize>, directory: &Path) {
    match latest {
        Some(epoch) => println!("resuming after epoch {epoch}"),
        None => println!("no checkpoint in {}: starting afresh", directory.display()),
    }
}

/// The newest epoch with a complete checkpoint in the experiment folder.
pub fn last_checkpoint(directory: &Path) -> Option<usize> {
    snapshots::complete_epochs(&directory.join("checkpoint"), &CHECKPOINT_NAMES)
        .ok()?
        .first()
        .map(|snapshot| snapshot.number)
}

/// Whether a Ctrl-C or SIGTERM on any rank stopped training before its last
/// epoch, and which; rank 0 then says what to go on from. Collective, and
/// decided alike on every rank: a rank whose folder lacks the last epoch's
/// checkpoint (another machine's disk, a save still landing) counts for all.
/// A signal after the last iteration leaves a complete run: `None`.
pub fn stopped_before_the_end(
    group: &ProcessGroup,
    directory: &Path,
    epochs: usize,
) -> Option<i32> {
    let signal = stop::stop_requested(group).unwrap_or_else(|e| fail(None, e));
    let finished = last_checkpoint(directory);
    let mut incomplete = [i64::from(finished.is_none_or(|epoch| epoch < epochs))];
    group
        .all_reduce(&mut incomplete, ReduceOp::Max)
        .unwrap_or_else(|e| fail(None, e));
    let signal = signal.filter(|_| incomplete[0] == 1)?;
    if group.is_main() {
        println!("{}", stopped_line(signal, finished));
    }
    Some(signal)
}

/// Rank 0's line after a Ctrl-C or SIGTERM stopped training.
pub fn stopped_line(signal: i32, finished: Option<usize>) -> String {
    let resume = match finished {
        Some(epoch) => format!("go on with --resume {epoch}"),
        None => "no epoch was finished".to_string(),
    };
    format!(
        "Stopped by {} before the end of training; {resume}",
        crate::stopped::signal_name(signal)
    )
}
