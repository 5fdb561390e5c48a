//! Epoch figures summed over the ranks.
//!
//! Burn computes metrics on background threads (the event processor, then the
//! event store). A collective issued there would interleave differently on each
//! rank with the gradient collectives of the main thread, so the work is split:
//! [`GlobalMetricLogger`], one of the store's metric loggers, only *records*
//! this rank's per-iteration entries as count-weighted sums; at the end of an
//! epoch the strategy, on the main thread, waits until the logger has seen that
//! epoch end, sums the figures over the ranks ([`reduce_epoch`]) and publishes
//! them back into the logger. The store asks loggers in registration order, so
//! from then on rank 0's early stopping and best-checkpoint choice read the
//! global figures.
//!
//! The global value of a metric is the count-weighted mean of every rank's
//! per-iteration values: exactly Burn's own epoch aggregate taken over all the
//! ranks' batches. For metrics that are means over items (loss, accuracy,
//! top-k accuracy) that is what one process with the whole global batch would
//! report; for metrics that are non-linear per batch (F-score, AUROC, CER) it is
//! the mean of per-batch values over the smaller per-rank batches.

use crate::{ProcessGroup, ReduceOp, Result};
use burn::train::logger::MetricLogger;
use burn::train::metric::store::{EpochSummary, MetricsUpdate, Split};
use burn::train::metric::{MetricAttributes, MetricDefinition, MetricId, NumericEntry};
use burn::train::LearnerSummary;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The file in the experiment folder where rank 0 appends the global epoch
/// figures: `epoch,split,metric,value,count`.
pub const GLOBAL_METRICS_FILE: &str = "global-metrics.csv";

/// A metric's epoch figure over all ranks.
#[derive(Debug, Clone, PartialEq)]
pub struct GlobalMetric {
    /// Burn's 1-based epoch.
    pub epoch: usize,
    /// `"train"` or `"valid"`.
    pub split: &'static str,
    /// The metric's name (`Loss`, `Accuracy`, ...).
    pub name: String,
    /// Count-weighted mean over every rank's iterations.
    pub value: f64,
    /// Items (or entries) it covers, over all ranks.
    pub count: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Part {
    Train,
    Valid,
}

impl Part {
    fn of(split: &Split) -> Option<Self> {
        match split {
            Split::Train => Some(Self::Train),
            Split::Valid => Some(Self::Valid),
            Split::Test(_) => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Train => "train",
            Self::Valid => "valid",
        }
    }
}

type Key = (usize, Part, String);

#[derive(Default)]
struct Totals {
    names: HashMap<MetricId, String>,
    /// Names of the numeric metrics, the same on every rank that registered the
    /// same metrics (whatever data it saw).
    numeric: BTreeSet<String>,
    /// Σ value·count and Σ count of this rank's entries.
    local: HashMap<Key, (f64, u64)>,
    ended: HashSet<(usize, Part)>,
    global: HashMap<Key, (f64, u64)>,
}

/// State shared by the logger (store thread) and the strategy (main thread).
#[derive(Default)]
pub(crate) struct MetricTotals {
    totals: Mutex<Totals>,
    changed: Condvar,
    /// A logger records into it (the strategy installed without `.ddp()` has none).
    attached: AtomicBool,
}

impl MetricTotals {
    /// Keeps only the earlier run's figures of epochs before `starting_epoch`
    /// (a fresh run keeps none, a run resumed after epoch n keeps 1..=n), and
    /// on rank 0 rewrites [`GLOBAL_METRICS_FILE`] to match, so the file and
    /// the store hold one figure per epoch, split and metric.
    pub(crate) fn start_at(&self, starting_epoch: usize, directory: &Path, main: bool) {
        let kept: Vec<(Key, (f64, u64))> = {
            let mut totals = self.totals.lock().unwrap();
            totals
                .global
                .retain(|(epoch, _, _), _| *epoch < starting_epoch);
            totals.global.iter().map(|(k, v)| (k.clone(), *v)).collect()
        };
        let path = directory.join(GLOBAL_METRICS_FILE);
        if !main || !path.exists() {
            return;
        }
        let mut figures: Vec<GlobalMetric> = kept
            .into_iter()
            .map(|((epoch, part, name), (value, count))| GlobalMetric {
                epoch,
                split: part.name(),
                name,
                value,
                count,
            })
            .collect();
        figures.sort_by(|a, b| (a.epoch, a.split, &a.name).cmp(&(b.epoch, b.split, &b.name)));
        // Written beside and renamed over, so a crash leaves the old file or the new.
        let partial = directory.join(format!("{GLOBAL_METRICS_FILE}.tmp"));
        let rewrite = || -> std::io::Result<()> {
            std::fs::write(&partial, format!("{HEADER}{}", rows(&figures)))?;
            std::fs::rename(&partial, &path)
        };
        if let Err(err) = rewrite() {
            log::warn!("rank 0: cannot rewrite {}: {err}", path.display());
        }
    }

    /// Rank 0's end-of-training summary with each epoch's global figure in
    /// place of rank 0's own. Burn builds the summary from the per-iteration
    /// files, which hold rank 0's batches only; the summary is the one result
    /// many programs show, so it must be the job's. An epoch without a global
    /// figure (one stopped half-way) is left out rather than shown as rank 0's.
    pub(crate) fn globalize(&self, mut summary: LearnerSummary) -> LearnerSummary {
        let totals = self.totals.lock().unwrap();
        let splits = [
            (Part::Train, &mut summary.metrics.train),
            (Part::Valid, &mut summary.metrics.valid),
        ];
        for (part, metrics) in splits {
            for metric in metrics.iter_mut() {
                let name = metric.name.clone();
                metric.entries.retain_mut(|entry| {
                    match totals.global.get(&(entry.step, part, name.clone())) {
                        Some(&(value, _)) => {
                            entry.value = value;
                            true
                        }
                        None => false,
                    }
                });
            }
            metrics.retain(|metric| !metric.entries.is_empty());
        }
        summary
    }

    /// Waits (at most `wait`) until both splits of `epoch` have ended in the
    /// store; returns whether they did.
    fn wait_epoch(&self, epoch: usize, wait: Duration) -> bool {
        if !self.attached.load(Ordering::SeqCst) {
            return true;
        }
        let deadline = Instant::now() + wait;
        let mut totals = self.totals.lock().unwrap();
        loop {
            if [Part::Train, Part::Valid]
                .iter()
                .all(|part| totals.ended.contains(&(epoch, *part)))
            {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            totals = self.changed.wait_timeout(totals, left).unwrap().0;
        }
    }
}

/// Sums this rank's epoch figures with every other rank's; every rank gets the
/// totals, rank 0 also appends them to [`GLOBAL_METRICS_FILE`] and logs them.
/// Every rank must call it once per epoch (it is a collective).
pub(crate) fn reduce_epoch(
    group: &ProcessGroup,
    totals: &MetricTotals,
    epoch: usize,
    wait: Duration,
    directory: &Path,
) -> Result<Vec<GlobalMetric>> {
    let rank = group.rank();
    if !totals.wait_epoch(epoch, wait) {
        log::warn!(
            "rank {rank}: the metric threads had not finished epoch {epoch} after {wait:?}; \
             its figures from this rank are partial"
        );
    }
    let (keys, mut sums) = {
        let totals = totals.totals.lock().unwrap();
        let keys: Vec<(Part, String)> = [Part::Train, Part::Valid]
            .into_iter()
            .flat_map(|part| totals.numeric.iter().map(move |name| (part, name.clone())))
            .collect();
        let mut sums = Vec::with_capacity(2 * keys.len());
        for (part, name) in &keys {
            let (sum, count) = totals
                .local
                .get(&(epoch, *part, name.clone()))
                .copied()
                .unwrap_or((0.0, 0));
            sums.extend([sum, count as f64]);
        }
        (keys, sums)
    };
    // Ranks that registered other metrics would sum unrelated numbers: compare
    // the lists first (a fingerprint each), and stay rank-local if they differ.
    let fingerprint = fnv1a(
        keys.iter()
            .map(|(part, name)| format!("{}/{name}", part.name())),
    );
    let fingerprints = group.all_gather(&[fingerprint as i64, keys.len() as i64])?;
    if fingerprints
        .chunks(2)
        .any(|other| other != fingerprints.chunks(2).next().unwrap())
    {
        log::warn!(
            "rank {rank}: the ranks registered different metrics; epoch {epoch}'s figures \
             are this rank's own"
        );
    } else if !sums.is_empty() {
        group.all_reduce(&mut sums, ReduceOp::Sum)?;
    }
    let mut figures = Vec::new();
    {
        let mut shared = totals.totals.lock().unwrap();
        for ((part, name), pair) in keys.into_iter().zip(sums.chunks(2)) {
            let count = pair[1].round() as u64;
            if count == 0 {
                continue;
            }
            let value = pair[0] / pair[1];
            shared
                .global
                .insert((epoch, part, name.clone()), (value, count));
            figures.push(GlobalMetric {
                epoch,
                split: part.name(),
                name,
                value,
                count,
            });
        }
    }
    if rank == 0 && !figures.is_empty() {
        report(&figures, group.world_size(), directory);
    }
    Ok(figures)
}

fn report(figures: &[GlobalMetric], world_size: usize, directory: &Path) {
    let line: Vec<String> = figures
        .iter()
        .map(|f| format!("{} {} {:.4}", f.split, f.name, f.value))
        .collect();
    log::info!(
        "epoch {} over {world_size} rank(s): {}",
        figures[0].epoch,
        line.join(", ")
    );
    let path = directory.join(GLOBAL_METRICS_FILE);
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(directory)?;
        let header = if path.exists() { "" } else { HEADER };
        let text = format!("{header}{}", rows(figures));
        // One write of whole lines: a crash leaves whole epochs, never half a line.
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        file.write_all(text.as_bytes())?;
        file.sync_data()
    };
    if let Err(err) = write() {
        log::warn!("rank 0: cannot append to {}: {err}", path.display());
    }
}

const HEADER: &str = "epoch,split,metric,value,count\n";

/// Figures as CSV rows (`{}` prints an f64 that parses back to the same value).
fn rows(figures: &[GlobalMetric]) -> String {
    figures
        .iter()
        .map(|f| {
            format!(
                "{},{},{},{},{}\n",
                f.epoch, f.split, f.name, f.value, f.count
            )
        })
        .collect()
}

fn fnv1a(items: impl Iterator<Item = String>) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for item in items {
        for byte in item.bytes().chain([0u8]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

/// The store-side half: records entries, serves global figures once published.
pub(crate) struct GlobalMetricLogger {
    shared: Arc<MetricTotals>,
}

impl GlobalMetricLogger {
    /// Also reads the figures an earlier run left in `directory` (a resumed run
    /// must still know the epochs before the resume: Burn's best-checkpoint
    /// strategy compares every epoch from the first).
    pub(crate) fn new(shared: Arc<MetricTotals>, directory: &Path) -> Self {
        shared.attached.store(true, Ordering::SeqCst);
        let earlier = read_figures(&directory.join(GLOBAL_METRICS_FILE));
        shared.totals.lock().unwrap().global.extend(earlier);
        Self { shared }
    }
}

/// The rows of a `global-metrics.csv` (a later row for the same epoch, split
/// and metric wins: a resumed run appends the epochs it redoes); none when
/// the file is missing. Rows that do not parse are skipped.
fn read_figures(path: &Path) -> HashMap<Key, (f64, u64)> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return HashMap::new();
    };
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let [epoch, split, name, value, count] =
                <[&str; 5]>::try_from(line.split(',').collect::<Vec<_>>()).ok()?;
            let part = match split {
                "train" => Part::Train,
                "valid" => Part::Valid,
                _ => return None,
            };
            Some((
                (epoch.parse().ok()?, part, name.to_string()),
                (value.parse().ok()?, count.parse().ok()?),
            ))
        })
        .collect()
}

fn weighted(entry: &NumericEntry) -> (f64, u64) {
    match entry {
        NumericEntry::Value(value) => (*value, 1),
        NumericEntry::Aggregated {
            aggregated_value,
            count,
        } => (aggregated_value * *count as f64, *count as u64),
    }
}

impl MetricLogger for GlobalMetricLogger {
    fn log(&mut self, update: MetricsUpdate, epoch: usize, split: &Split) {
        let Some(part) = Part::of(split) else {
            return;
        };
        let mut totals = self.shared.totals.lock().unwrap();
        for numeric in &update.entries_numeric {
            let Some(name) = totals.names.get(&numeric.entry.metric_id).cloned() else {
                continue;
            };
            let (sum, count) = weighted(&numeric.numeric_entry);
            let slot = totals.local.entry((epoch, part, name)).or_default();
            slot.0 += sum;
            slot.1 += count;
        }
    }

    fn read_numeric(
        &mut self,
        name: &str,
        epoch: usize,
        split: &Split,
    ) -> std::result::Result<Vec<NumericEntry>, String> {
        let Some(part) = Part::of(split) else {
            return Err("burn-ddp keeps no test-split figures".into());
        };
        let totals = self.shared.totals.lock().unwrap();
        let key = (epoch, part, name.to_string());
        if let Some(&(value, count)) = totals.global.get(&key) {
            return Ok(vec![NumericEntry::Aggregated {
                aggregated_value: value,
                count: count as usize,
            }]);
        }
        // Not summed yet: this rank's own figure.
        match totals.local.get(&key) {
            Some(&(sum, count)) if count > 0 => Ok(vec![NumericEntry::Aggregated {
                aggregated_value: sum / count as f64,
                count: count as usize,
            }]),
            // Unknown here (an epoch of an earlier run without global figures):
            // the store then asks the next logger, rank 0's metric files.
            _ => Err(format!(
                "burn-ddp has no {split} {name} figure for epoch {epoch}"
            )),
        }
    }

    fn log_metric_definition(&mut self, definition: MetricDefinition) {
        let mut totals = self.shared.totals.lock().unwrap();
        if matches!(definition.attributes, MetricAttributes::Numeric(_)) {
            totals.numeric.insert(definition.name.clone());
        }
        totals.names.insert(definition.metric_id, definition.name);
    }

    fn log_epoch_summary(&mut self, summary: EpochSummary) {
        if let Some(part) = Part::of(&summary.split) {
            let mut totals = self.shared.totals.lock().unwrap();
            totals.ended.insert((summary.epoch_number, part));
            // Old epochs' raw sums are no longer needed for the reduction.
            totals
                .local
                .retain(|(epoch, _, _), _| *epoch + 2 >= summary.epoch_number);
            self.shared.changed.notify_all();
        }
    }
}
