//! Burn 0.21's renderer traits for the shared quiet renderers (a
//! display that shows nothing, and one that only hands over the
//! end-of-training summary): the traits differ between Burn versions.

use crate::shared::train::quiet::{SilentRenderer, SummaryRenderer};

macro_rules! quiet_renderer {
    ($renderer:ty) => {
        impl burn::train::renderer::MetricsRendererTraining for $renderer {
            fn update_train(&mut self, _state: burn::train::renderer::MetricState) {}
            fn update_valid(&mut self, _state: burn::train::renderer::MetricState) {}
            fn render_train(
                &mut self,
                _item: burn::train::renderer::TrainingProgress,
                _indicators: Vec<burn::train::renderer::ProgressType>,
            ) {
            }
            fn render_valid(
                &mut self,
                _item: burn::train::renderer::TrainingProgress,
                _indicators: Vec<burn::train::renderer::ProgressType>,
            ) {
            }
            fn on_train_end(
                &mut self,
                summary: Option<burn::train::LearnerSummary>,
            ) -> Result<(), Box<dyn core::error::Error>> {
                if let Some(summary) = summary {
                    crate::shared::contract::Quiet::summary(self, summary);
                }
                Ok(())
            }
        }

        impl burn::train::renderer::MetricsRendererEvaluation for $renderer {
            fn update_test(
                &mut self,
                _name: burn::train::renderer::EvaluationName,
                _state: burn::train::renderer::MetricState,
            ) {
            }
            fn render_test(
                &mut self,
                _item: burn::train::renderer::EvaluationProgress,
                _indicators: Vec<burn::train::renderer::ProgressType>,
            ) {
            }
            fn on_test_end(
                &mut self,
                _summary: Option<burn::train::LearnerSummary>,
            ) -> Result<(), Box<dyn core::error::Error>> {
                Ok(())
            }
        }

        impl burn::train::renderer::MetricsRenderer for $renderer {
            fn manual_close(&mut self) {}
            fn register_metric(&mut self, _definition: burn::train::metric::MetricDefinition) {}
        }
    };
}

quiet_renderer!(SilentRenderer);
quiet_renderer!(SummaryRenderer);
