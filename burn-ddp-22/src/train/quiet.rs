//! What ranks other than 0 get instead of a display and checkpoint saving.

use burn::train::checkpoint::{CheckpointingAction, CheckpointingStrategy};
use burn::train::logger::{EvaluationProgressLogger, TrainingProgressLogger};
use burn::train::metric::store::EventStoreClient;
use burn::train::metric::MetricDefinition;
use burn::train::renderer::{
    EvaluationName, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining,
};
use burn::train::LearnerSummary;

/// A renderer that shows nothing (not even the end-of-training summary).
#[derive(Debug, Default, Clone, Copy)]
pub struct SilentRenderer;

impl MetricsRendererTraining for SilentRenderer {
    fn update_train(&mut self, _state: MetricState) {}
    fn update_valid(&mut self, _state: MetricState) {}
    fn on_train_end(
        &mut self,
        _summary: Option<LearnerSummary>,
    ) -> Result<(), Box<dyn core::error::Error>> {
        Ok(())
    }
}

impl MetricsRendererEvaluation for SilentRenderer {
    fn update_test(&mut self, _name: EvaluationName, _state: MetricState) {}
    fn on_test_end(
        &mut self,
        _summary: Option<LearnerSummary>,
    ) -> Result<(), Box<dyn core::error::Error>> {
        Ok(())
    }
}

impl TrainingProgressLogger for SilentRenderer {
    fn start(
        &mut self,
        _epochs: usize,
        _starting: usize,
        _items: Option<usize>,
        _label: Option<&str>,
    ) {
    }
    fn update_epoch(&mut self, _epoch: usize) {}
    fn start_split(&mut self, _split: &str, _total_items: usize) {}
    fn update_split(&mut self, _items_processed: usize) {}
    fn end_split(&mut self) {}
    fn end(&mut self) {}
    fn log_event_training(&mut self, _event: String) {}
}

impl EvaluationProgressLogger for SilentRenderer {
    fn start_global_progress(&mut self, _total_tests: usize) {}
    fn start_test(&mut self, _name: &str, _total_items: usize) {}
    fn update_test_progress(&mut self, _items_processed: usize) {}
    fn end_test(&mut self) {}
    fn end_global_progress(&mut self) {}
    fn log_event_evaluation(&mut self, _event: String) {}
}

impl MetricsRenderer for SilentRenderer {
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
