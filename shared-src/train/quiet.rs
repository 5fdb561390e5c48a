//! What ranks other than 0 get instead of a display and checkpoint saving,
//! a renderer that only reports the end-of-training summary, and a
//! strategy that saves at once. Burn's
//! renderer traits (which differ between Burn versions) are implemented for
//! both in each front-end's `train::quiet`.

use crate::shared::contract::Quiet;
use burn::train::checkpoint::{CheckpointingAction, CheckpointingStrategy};
use burn::train::metric::store::EventStoreClient;
use burn::train::LearnerSummary;

/// A renderer that shows nothing (not even the end-of-training summary).
#[derive(Debug, Default, Clone, Copy)]
pub struct SilentRenderer;

impl Quiet for SilentRenderer {
    fn summary(&mut self, _summary: LearnerSummary) {}
}

type SummaryReport = dyn FnMut(LearnerSummary) + Send + Sync;

/// A renderer that shows nothing during training and hands the
/// end-of-training summary (with `.summary()` on the builder; on rank 0 its
/// figures are summed over the ranks) to a closure: to print it, log it,
/// compare it. Install it before `.ddp(&ddp)`, which silences ranks > 0.
pub struct SummaryRenderer {
    report: Box<SummaryReport>,
}

impl SummaryRenderer {
    /// Calls `report` with the summary when training ends.
    pub fn new(report: impl FnMut(LearnerSummary) + Send + Sync + 'static) -> Self {
        Self {
            report: Box::new(report),
        }
    }
}

impl Quiet for SummaryRenderer {
    fn summary(&mut self, summary: LearnerSummary) {
        (self.report)(summary);
    }
}

/// A checkpointing strategy that never saves nor deletes: the rank still
/// *loads* checkpoints (each rank restores its own optimizer state on resume).
#[derive(Debug, Default, Clone, Copy)]
pub struct NeverCheckpoint;

impl CheckpointingStrategy for NeverCheckpoint {
    fn checkpointing(
        &mut self,
        _epoch: usize,
        _collector: &EventStoreClient,
    ) -> Vec<CheckpointingAction> {
        Vec::new()
    }
}

/// A checkpointing strategy that saves at once, whatever the epoch (the
/// sharded optimizer's capture of the Learner's optimizer state).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SaveNow;

impl CheckpointingStrategy for SaveNow {
    fn checkpointing(
        &mut self,
        _epoch: usize,
        _collector: &EventStoreClient,
    ) -> Vec<CheckpointingAction> {
        vec![CheckpointingAction::Save]
    }
}
