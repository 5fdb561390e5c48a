//! Resuming a Learner run by itself: the newest epoch whose checkpoint
//! (Burn 0.22's file checkpointer: `model-N.bpk`, `optim-N.bpk` and
//! `scheduler-N.bpk`, burnpack) is complete and whole. The choice and the
//! check that every rank has it are burn-ddp-training's `LearnerJob`
//! (through `DdpTraining::latest_checkpoint`); what
//! "whole" means for Burn 0.22's files (each reads back as its record:
//! header, metadata and every tensor's bytes there) is here.

use burn::optim::lr_scheduler::LrSchedulerRecord;
use burn::optim::OptimizerRecord;
use burn::store::ModuleRecord;
use burn::train::checkpoint::Checkpoint;
use burn_ddp_training::snapshots::{LoadError, Snapshot};
use std::path::Path;

/// Whether each file of an epoch's checkpoint reads back as its record
/// (files in the order of `CHECKPOINT_NAMES`: model, optimizer, scheduler).
pub(crate) fn check_whole(snapshot: &Snapshot) -> std::result::Result<(), LoadError> {
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
