//! `mnist --learner`, written once for both Burn versions: the run around
//! Burn's Learner (the data, the settings, the resume choice, the stop, the
//! replicas' check, the saved model). What is each Burn's own (the
//! front-end's `DdpTraining`, building and launching `SupervisedTraining`)
//! is its program's [`LearnerTraining`].

use crate::idx;
use crate::mnist::{splits, MnistArgs, MnistFiles, MnistTrainingConfig, ResumeFrom};
use crate::training::SaveError;
use crate::{fail, run_config};
use burn_ddp_comm::{ProcessGroup, ReduceOp, Result};
use burn_ddp_training::learner::{EpochReport, Split, CHECKPOINT_NAMES};
use burn_ddp_training::{snapshots, stop};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `mnist --learner`'s Burn side: burn-ddp's Learner handle and Burn's
/// Learner (`SupervisedTraining`), in that Burn's API.
pub trait LearnerTraining: MnistFiles {
    /// The front-end's `train::DdpTraining`.
    type Ddp;
    /// The model the Learner returns (without autodiff).
    type Model;

    /// `DdpTraining::new(group, directory)`, printing each epoch's line
    /// ([`print_epoch`]).
    fn ddp(&self, group: &ProcessGroup, directory: &Path) -> Self::Ddp;
    /// `ddp.create_artifact_dir()`: rank 0 creates the folder, keeping it.
    fn create_artifact_dir(&self, ddp: &Self::Ddp) -> Result<()>;
    /// `ddp.latest_checkpoint()`: the newest whole checkpoint, every rank alike.
    fn latest_checkpoint(&self, ddp: &Self::Ddp) -> Result<Option<usize>>;
    /// `ddp.verify_checkpoint(epoch)`: every rank has that checkpoint whole.
    fn verify_checkpoint(&self, ddp: &Self::Ddp, epoch: usize) -> Result<()>;
    /// Shards the splits, builds the loaders, the model and the Learner
    /// (resumed after epoch `resume`) and trains; the trained model.
    fn fit(
        &self,
        ddp: &Self::Ddp,
        args: &MnistArgs,
        batch_size: usize,
        splits: (Arc<idx::Split>, Arc<idx::Split>),
        resume: Option<usize>,
    ) -> Self::Model;
    /// `ddp.group()`: the group after training (its next generation if the
    /// run went on without a rank).
    fn group(&self, ddp: &Self::Ddp) -> ProcessGroup;
    /// `replicas::check_replicas`: every rank holds rank 0's parameters.
    fn check_replicas(&self, model: &Self::Model, group: &ProcessGroup) -> Result<usize>;
    /// `replicas::parameters_fingerprint`.
    fn fingerprint(&self, model: &Self::Model) -> u64;
    /// Writes the trained model atomically; the file.
    fn save_model(
        &self,
        model: Self::Model,
        path: &Path,
        epochs: usize,
    ) -> std::result::Result<PathBuf, SaveError>;
}

/// Trains the tutorial's CNN through Burn's Learner as `args` say.
pub fn train<T: LearnerTraining>(trainer: &T, args: &MnistArgs) {
    let group = T::FRONT_END.init(); // burn-ddp
    let rank = group.rank();
    // Each rank's loader batch: the ranks together train with world_size times it.
    let batch_size = crate::training::batch_size(&group, args.batch_size, args.global_batch_size);
    let (train_set, test_set) = splits(trainer, args, &group);
    let directory = &args.artifact_dir;
    let config = MnistTrainingConfig::new(
        args.epochs,
        batch_size,
        group.world_size(),
        args.lr,
        args.seed,
        train_set.len(),
    );
    // burn-ddp: the run's handle; one line per epoch from the global figures.
    let ddp = trainer.ddp(&group, directory);
    // Rank 0 creates the folder, the others wait (kept as it is: a resume needs
    // its checkpoints; `recreate_artifact_dir` would empty it first).
    trainer
        .create_artifact_dir(&ddp)
        .unwrap_or_else(|e| fail(None, e));
    let resume = resume_after(trainer, &ddp, &group, &config, args);
    if group.is_main() {
        // burn-ddp: one writer per file; every rank would write the same config.
        run_config::save(&config, &directory.join("config.json"))
            .unwrap_or_else(|e| fail(Some(rank), e));
    }
    let model = trainer.fit(&ddp, args, batch_size, (train_set, test_set), resume);
    // burn-ddp: the ranks that finished (the group's next generation if some
    // were gone on from).
    let group = trainer.group(&ddp);
    let rank = group.rank();
    // burn-ddp: a Ctrl-C or SIGTERM on any rank stopped every rank at the same
    // iteration (unless it came after the last one: then the run is complete).
    // Stop here: the model in hand is half-trained, and must not replace a
    // finished one; the checkpoints are what to go on from.
    if let Some(signal) = stopped_before_the_end(&group, directory, args.epochs) {
        T::FRONT_END.destroy(rank);
        std::process::exit(128 + signal);
    }
    finish(trainer, &group, model, args);
}

/// The epoch to go on after: `--resume EPOCH` (every rank must have its
/// checkpoint), or `--resume auto`'s newest whole checkpoint of this run.
fn resume_after<T: LearnerTraining>(
    trainer: &T,
    ddp: &T::Ddp,
    group: &ProcessGroup,
    config: &MnistTrainingConfig,
    args: &MnistArgs,
) -> Option<usize> {
    let directory = &args.artifact_dir;
    match args.resume {
        // burn-ddp: Burn's launch loads it on every rank; check they all have it.
        Some(ResumeFrom::Epoch(epoch)) => {
            trainer
                .verify_checkpoint(ddp, epoch)
                .unwrap_or_else(|e| fail(None, e));
            Some(epoch)
        }
        Some(ResumeFrom::Auto) => {
            refuse_another_run(config, &directory.join("config.json"), group);
            // burn-ddp: rank 0 finds the newest whole checkpoint, every rank takes it.
            let latest = trainer
                .latest_checkpoint(ddp)
                .unwrap_or_else(|e| fail(None, e));
            if group.is_main() {
                announce_resume(latest, directory);
            }
            latest
        }
        None => None,
    }
}

/// A finished run: every rank holds rank 0's parameters (a digest per
/// tensor, compared); rank 0 alone saves the model beside the experiment,
/// atomically (Burn's MNIST example saves it there too).
fn finish<T: LearnerTraining>(
    trainer: &T,
    group: &ProcessGroup,
    model: T::Model,
    args: &MnistArgs,
) {
    let rank = group.rank();
    let compared = trainer
        .check_replicas(&model, group)
        .unwrap_or_else(|e| fail(None, e));
    if group.is_main() {
        println!(
            "replicas identical: {compared} parameter tensors on {} ranks",
            group.world_size()
        );
        // Equal for two runs exactly when they ended with the same parameters.
        println!(
            "parameters fingerprint: {:016x}",
            trainer.fingerprint(&model)
        );
        if let Some(summary) = T::FRONT_END.sync_summary() {
            println!("{summary}");
        }
        let path = trainer
            .save_model(model, &args.artifact_dir.join("model"), args.epochs)
            .unwrap_or_else(|e| fail(Some(rank), e));
        println!("saved {}", path.display());
    }
    T::FRONT_END.destroy(rank); // burn-ddp
}

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
