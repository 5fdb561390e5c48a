//! Resuming a Learner run by itself: the newest epoch whose checkpoint
//! (Burn 0.22's file checkpointer: `model-N.bpk`, `optim-N.bpk` and
//! `scheduler-N.bpk`, burnpack) is complete and whole. The choice and the
//! check that every rank has it are burn-ddp-comm's [`LearnerJob`]; what
//! "whole" means for Burn 0.22's files (each reads back as its record:
//! header, metadata and every tensor's bytes there) is here.

use super::{DdpTraining, LearnerJob};
use crate::Result;
use burn::optim::lr_scheduler::LrSchedulerRecord;
use burn::optim::OptimizerRecord;
use burn::store::ModuleRecord;
use burn::train::checkpoint::Checkpoint;
use burn_ddp_training::snapshots::{LoadError, Snapshot};
use std::path::Path;

impl DdpTraining {
    /// The newest epoch whose checkpoint in `<directory>/checkpoint` is
    /// complete (model, optimizer and scheduler) and whole, for every rank
    /// alike (rank 0 decides, every rank must have it): give it to
    /// `SupervisedTraining::checkpoint` to go on after a restart
    /// (`burn-ddp-run --max-restarts`). A damaged newest one is skipped with
    /// a warning naming the file; `None` when there is none (start afresh);
    /// an error when every one is damaged. Collective: every rank calls it,
    /// before `SupervisedTraining::launch`.
    pub fn latest_checkpoint(&self) -> Result<Option<usize>> {
        LearnerJob::latest_checkpoint(self, check_whole)
    }

    /// Every rank has `epoch`'s checkpoint in `<directory>/checkpoint`,
    /// complete and whole, or every rank fails naming the ranks that do not
    /// (their folder, what is missing or damaged). Collective: call it
    /// before `SupervisedTraining::checkpoint(epoch)` when you choose the
    /// epoch yourself; [`latest_checkpoint`](Self::latest_checkpoint) does.
    pub fn verify_checkpoint(&self, epoch: usize) -> Result<()> {
        LearnerJob::verify_checkpoint(self, epoch, check_whole)
    }
}

/// Whether each file of an epoch's checkpoint reads back as its record
/// (files in the order of `CHECKPOINT_NAMES`: model, optimizer, scheduler).
fn check_whole(snapshot: &Snapshot) -> std::result::Result<(), LoadError> {
    let [model, optim, scheduler] = snapshot.files.as_slice() else {
        return Err(LoadError::Corrupt("not a Learner checkpoint".into()));
    };
    whole::<ModuleRecord>(model)?;
    whole::<OptimizerRecord>(optim)?;
    whole::<LrSchedulerRecord>(scheduler)
}

fn whole<R: Checkpoint>(file: &Path) -> std::result::Result<(), LoadError> {
    R::load(file.to_path_buf())
        .map(drop)
        .map_err(|err| LoadError::Corrupt(format!("{}: {err}", file.display()).into()))
}
