//! What ranks other than 0 get instead of a display and checkpoint saving,
//! and a renderer that only reports the end-of-training summary.

use burn::train::checkpoint::{CheckpointingAction, CheckpointingStrategy};
use burn::train::metric::store::EventStoreClient;
use burn::train::metric::MetricDefinition;
use burn::train::renderer::{
    EvaluationName, EvaluationProgress, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining, ProgressType, TrainingProgress,
};
use burn::train::LearnerSummary;

/// A renderer that shows nothing (not even the end-of-training summary).
#[derive(Debug, Default, Clone, Copy)]
pub struct SilentRenderer;

impl MetricsRendererTraining for SilentRenderer {
    fn update_train(&mut self, _state: MetricState) {}
    fn update_valid(&mut self, _state: MetricState) {}
    fn render_train(&mut self, _item: TrainingProgress, _indicators: Vec<ProgressType>) {}
    fn render_valid(&mut self, _item: TrainingProgress, _indicators: Vec<ProgressType>) {}
    fn on_train_end(
        &mut self,
        _summary: Option<LearnerSummary>,
    ) -> Result<(), Box<dyn core::error::Error>> {
        Ok(())
    }
}

impl MetricsRendererEvaluation for SilentRenderer {
    fn update_test(&mut self, _name: EvaluationName, _state: MetricState) {}
    fn render_test(&mut self, _item: EvaluationProgress, _indicators: Vec<ProgressType>) {}
    fn on_test_end(
        &mut self,
        _summary: Option<LearnerSummary>,
    ) -> Result<(), Box<dyn core::error::Error>> {
        Ok(())
    }
}

impl MetricsRenderer for SilentRenderer {
    fn manual_close(&mut self) {}
    fn register_metric(&mut self, _definition: MetricDefinition) {}
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

impl MetricsRendererTraining for SummaryRenderer {
    fn update_train(&mut self, _state: MetricState) {}
    fn update_valid(&mut self, _state: MetricState) {}
    fn render_train(&mut self, _item: TrainingProgress, _indicators: Vec<ProgressType>) {}
    fn render_valid(&mut self, _item: TrainingProgress, _indicators: Vec<ProgressType>) {}
    fn on_train_end(
        &mut self,
        summary: Option<LearnerSummary>,
    ) -> Result<(), Box<dyn core::error::Error>> {
        if let Some(summary) = summary {
            (self.report)(summary);
        }
        Ok(())
    }
}

impl MetricsRendererEvaluation for SummaryRenderer {
    fn update_test(&mut self, _name: EvaluationName, _state: MetricState) {}
    fn render_test(&mut self, _item: EvaluationProgress, _indicators: Vec<ProgressType>) {}
    fn on_test_end(
        &mut self,
        _summary: Option<LearnerSummary>,
    ) -> Result<(), Box<dyn core::error::Error>> {
        Ok(())
    }
}

impl MetricsRenderer for SummaryRenderer {
    fn manual_close(&mut self) {}
    fn register_metric(&mut self, _definition: MetricDefinition) {}
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
