//! What `mnist --learner` does alike on both Burn versions (the rest is each
//! version's Learner API): one line per epoch from the global figures,
//! `--resume auto`'s check that the folder holds this run's checkpoints, the
//! newest finished epoch, and what rank 0 says after a stop.

use crate::{fail, run_config};
use burn_ddp_comm::ProcessGroup;
use burn_ddp_training::learner::{EpochReport, Split, CHECKPOINT_NAMES};
use burn_ddp_training::snapshots;
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
