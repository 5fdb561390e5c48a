//! The Learner's side of the epoch figures summed over the ranks: a metric
//! logger that records this rank's entries into burn-ddp-training's
//! [`EpochFigures`] (the reduction, the file and the waiting are there) and
//! answers the store with the global figures once summed; and the end-of-run
//! summary with the global figures in place of rank 0's own. Which of Burn's
//! entries is a per-iteration value and which a final one is the shim's
//! `FigureEntry`.

use super::DdpTraining;
use crate::shared::contract::FigureEntry;
use burn::train::logger::MetricLogger;
use burn::train::metric::store::{EpochSummary, MetricsUpdate, Split};
use burn::train::metric::{MetricAttributes, MetricDefinition, MetricId, NumericEntry};
use burn::train::LearnerSummary;
use burn_ddp_training::learner::{figures, EpochFigures};
use std::collections::HashMap;
use std::sync::Arc;

/// The figures' split of Burn's (none for the test split).
fn split_of(split: &Split) -> Option<figures::Split> {
    match split {
        Split::Train => Some(figures::Split::Train),
        Split::Valid => Some(figures::Split::Valid),
        Split::Test(_) => None,
    }
}

/// The store-side half: records entries, serves global figures once published.
pub(crate) struct GlobalMetricLogger {
    figures: Arc<EpochFigures>,
    names: HashMap<MetricId, String>,
}

impl GlobalMetricLogger {
    pub(crate) fn new(ddp: &DdpTraining) -> Self {
        ddp.job().figures().attach(ddp.directory());
        Self {
            figures: Arc::clone(ddp.job().figures()),
            names: HashMap::new(),
        }
    }
}

impl MetricLogger for GlobalMetricLogger {
    fn log(&mut self, update: MetricsUpdate, epoch: usize, split: &Split) {
        let Some(split) = split_of(split) else {
            return;
        };
        for numeric in &update.entries_numeric {
            let Some(name) = self.names.get(&numeric.entry.metric_id) else {
                continue;
            };
            if let Some(entry) = numeric.numeric_entry.figure() {
                self.figures.record_entry(epoch, split, name, entry);
            }
        }
    }

    fn read_numeric(
        &mut self,
        name: &str,
        epoch: usize,
        split: &Split,
    ) -> Result<Vec<NumericEntry>, String> {
        let Some(part) = split_of(split) else {
            return Err("burn-ddp keeps no test-split figures".into());
        };
        // Unknown here (an epoch of an earlier run without global figures):
        // the store then asks the next logger, rank 0's metric files.
        let (value, count) = self
            .figures
            .read(epoch, part, name)
            .ok_or_else(|| format!("burn-ddp has no {split} {name} figure for epoch {epoch}"))?;
        Ok(vec![NumericEntry::Aggregated {
            aggregated_value: value,
            count: count as usize,
        }])
    }

    fn log_metric_definition(&mut self, definition: MetricDefinition) {
        let numeric = matches!(definition.attributes, MetricAttributes::Numeric(_));
        self.figures.define(&definition.name, numeric);
        self.names
            .insert(definition.metric_id, definition.name.to_string());
    }

    fn log_epoch_summary(&mut self, summary: EpochSummary) {
        if let Some(split) = split_of(&summary.split) {
            self.figures.end_split(summary.epoch_number, split);
        }
    }
}

/// Rank 0's end-of-training summary with each epoch's global figure in
/// place of rank 0's own. Burn builds the summary from the per-iteration
/// files, which hold rank 0's batches only; the summary is the one result
/// many programs show, so it must be the job's. An epoch without a global
/// figure (one stopped half-way) is left out rather than shown as rank 0's.
pub(crate) fn globalize(figures: &EpochFigures, mut summary: LearnerSummary) -> LearnerSummary {
    let splits = [
        (figures::Split::Train, &mut summary.metrics.train),
        (figures::Split::Valid, &mut summary.metrics.valid),
    ];
    for (split, metrics) in splits {
        for metric in metrics.iter_mut() {
            let name = metric.name.clone();
            metric
                .entries
                .retain_mut(|entry| match figures.global(entry.step, split, &name) {
                    Some(value) => {
                        entry.value = value;
                        true
                    }
                    None => false,
                });
        }
        metrics.retain(|metric| !metric.entries.is_empty());
    }
    summary
}
