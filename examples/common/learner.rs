//! What `mnist --learner` does alike on both Burn versions (the rest is each
//! version's Learner API): one line per epoch from the global figures,
//! `--resume auto`'s check that the folder holds this run's checkpoints, the
//! newest finished epoch, and what rank 0 says after a stop.

use super::{fail, run_config};
use burn::config::Config;
use burn_ddp_comm::learner::{EpochReport, Split, CHECKPOINT_NAMES};
use burn_ddp_comm::snapshots;
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
/// epochs) was saved in: an error naming it, not a resume from its checkpoints.
pub fn refuse_another_run<C: Config>(config: &C, saved: &Path, rank: usize) {
    if !saved.exists() {
        return;
    }
    let changed = C::load(saved)
        .map(|saved| run_config::differences(&saved, config, &["epochs"]))
        .unwrap_or_else(|err| vec![format!("unreadable ({err})")]);
    if !changed.is_empty() {
        fail(
            Some(rank),
            format!(
                "--resume auto: the checkpoints beside {} are another run's ({}); run with \
                 those settings, or give another --artifact-dir",
                saved.display(),
                changed.join(", ")
            ),
        );
    }
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
        super::stopped::signal_name(signal)
    )
}
