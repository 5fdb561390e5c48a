//! The Learner events whose shape Burn 0.23 changed: a split starts and ends
//! with its loader's progress there, with its item count in Burn 0.22.
//! `cfg(burn_023)` is set when these sources are built against Burn 0.23
//! (scripts/burn-023-check.sh); everything else in the strategy is the same
//! for both.

use burn::data::dataloader::Progress;
use burn::train::LearnerEvent;

/// A split (train or valid) of `epoch` starts, over a loader of `items`
/// items whose iterator is at `progress`.
#[cfg(not(burn_023))]
pub(crate) fn start_split<T>(epoch: usize, items: usize, _progress: Progress) -> LearnerEvent<T> {
    LearnerEvent::StartSplit {
        epoch_number: epoch,
        total_items: items,
    }
}

/// A split of `epoch` ended with its iterator at `progress` (`completed`:
/// it was not interrupted).
#[cfg(not(burn_023))]
pub(crate) fn end_split<T>(epoch: usize, _progress: Progress, _completed: bool) -> LearnerEvent<T> {
    LearnerEvent::EndSplit(epoch)
}

/// A split (train or valid) of `epoch` starts, over a loader of `items`
/// items whose iterator is at `progress`.
#[cfg(burn_023)]
pub(crate) fn start_split<T>(epoch: usize, _items: usize, progress: Progress) -> LearnerEvent<T> {
    LearnerEvent::StartSplit {
        epoch_number: epoch,
        progress,
    }
}

/// A split of `epoch` ended with its iterator at `progress` (`completed`:
/// it was not interrupted, so its total is what it saw).
#[cfg(burn_023)]
pub(crate) fn end_split<T>(
    epoch: usize,
    mut progress: Progress,
    completed: bool,
) -> LearnerEvent<T> {
    if completed {
        progress.resolve_total();
    }
    LearnerEvent::EndSplit { epoch, progress }
}

/// Empty training and evaluation progress loggers for a renderer that shows
/// nothing (their methods take counts in Burn 0.22, `Progress` in 0.23).
#[cfg(not(burn_023))]
macro_rules! quiet_progress {
    ($renderer:ty) => {
        impl burn::train::logger::TrainingProgressLogger for $renderer {
            fn start(&mut self, _: usize, _: usize, _: Option<usize>, _: Option<&str>) {}
            fn update_epoch(&mut self, _epoch: usize) {}
            fn start_split(&mut self, _split: &str, _total_items: usize) {}
            fn update_split(&mut self, _items_processed: usize) {}
            fn end_split(&mut self) {}
            fn end(&mut self) {}
            fn log_event_training(&mut self, _event: String) {}
        }

        impl burn::train::logger::EvaluationProgressLogger for $renderer {
            fn start_global_progress(&mut self, _total_tests: usize) {}
            fn start_test(&mut self, _name: &str, _total_items: usize) {}
            fn update_test_progress(&mut self, _items_processed: usize) {}
            fn end_test(&mut self) {}
            fn end_global_progress(&mut self) {}
            fn log_event_evaluation(&mut self, _event: String) {}
        }
    };
}

/// Empty training and evaluation progress loggers for a renderer that shows
/// nothing (their methods take counts in Burn 0.22, `Progress` in 0.23).
#[cfg(burn_023)]
macro_rules! quiet_progress {
    ($renderer:ty) => {
        impl burn::train::logger::TrainingProgressLogger for $renderer {
            fn start(&mut self, _: usize, _: usize, _: Option<usize>, _: Option<&str>) {}
            fn update_epoch(&mut self, _epoch: usize) {}
            fn start_split(&mut self, _split: &str, _progress: &burn::data::dataloader::Progress) {}
            fn update_split(&mut self, _progress: &burn::data::dataloader::Progress) {}
            fn end_split(&mut self, _progress: &burn::data::dataloader::Progress) {}
            fn end(&mut self) {}
            fn log_event_training(&mut self, _event: String) {}
        }

        impl burn::train::logger::EvaluationProgressLogger for $renderer {
            fn start_global_progress(&mut self, _total_tests: usize) {}
            fn start_test(&mut self, _name: &str, _progress: &burn::data::dataloader::Progress) {}
            fn update_test_progress(&mut self, _progress: &burn::data::dataloader::Progress) {}
            fn end_test(&mut self, _progress: &burn::data::dataloader::Progress) {}
            fn end_global_progress(&mut self) {}
            fn log_event_evaluation(&mut self, _event: String) {}
        }
    };
}

pub(crate) use quiet_progress;
