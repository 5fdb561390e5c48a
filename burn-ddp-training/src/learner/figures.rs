//! Epoch figures summed over the ranks.
//!
//! Burn computes metrics on background threads (the event processor, then
//! the event store). A collective issued there would interleave differently
//! on each rank with the gradient collectives of the main thread, so the work
//! is split: the front-end's metric logger (one of the store's loggers) only
//! *records* this rank's per-iteration entries here as count-weighted sums;
//! at the end of an epoch the strategy, on the main thread, waits until the
//! logger has seen both splits of that epoch end, sums the figures over the
//! ranks ([`EpochFigures::reduce_epoch`]) and publishes them back here. The
//! store asks loggers in registration order, so from then on rank 0's early
//! stopping and best-checkpoint choice read the global figures.
//!
//! The global value of a metric is the count-weighted mean of every rank's
//! per-iteration values ([`Entry::Iteration`]): the epoch's aggregate taken
//! over all the ranks' batches. Where a front-end's metrics also report a
//! final epoch value ([`Entry::Final`], e.g. a precision from the epoch's
//! summed confusion counts), the global figure is the mean of the ranks'
//! final values weighted by their entry counts instead, so a world of one
//! reports exactly what the single-process Learner reports. For metrics that
//! are means over items (loss, accuracy, top-k accuracy) either is what one
//! process with the whole global batch would report; for ratios of sums
//! (precision, recall, perplexity) the weighted mean of the ranks' ratios is
//! close to it, not equal. Per-iteration values that are not finite (a ratio
//! of 0/0 on a batch) are left out rather than poisoning the epoch. Which of
//! its framework's entries is which is the front-end's to say.

use burn_ddp_comm::{ProcessGroup, ReduceOp, Result};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// One entry a metric logged, translated from the front-end's framework.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Entry {
    /// A per-iteration value: `sum` over `count` items.
    Iteration {
        /// The value times its item count.
        sum: f64,
        /// The items it covers.
        count: u64,
    },
    /// The metric's final value for the epoch.
    Final(f64),
}

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

/// The two parts of an epoch whose figures are summed (a test split is not:
/// evaluation after training is each program's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Split {
    /// Training.
    Train,
    /// Validation.
    Valid,
}

impl Split {
    /// `"train"` or `"valid"`, as in [`GLOBAL_METRICS_FILE`].
    pub fn name(self) -> &'static str {
        match self {
            Self::Train => "train",
            Self::Valid => "valid",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        match name {
            "train" => Some(Self::Train),
            "valid" => Some(Self::Valid),
            _ => None,
        }
    }
}

type Key = (usize, Split, String);

#[derive(Default)]
struct Totals {
    /// Names of the numeric metrics, the same on every rank that registered
    /// the same metrics (whatever data it saw).
    numeric: BTreeSet<String>,
    /// Σ value·count and Σ count of this rank's entries.
    local: HashMap<Key, (f64, u64)>,
    /// This rank's final epoch value of the metrics that report one.
    finals: HashMap<Key, f64>,
    ended: HashSet<(usize, Split)>,
    global: HashMap<Key, (f64, u64)>,
}

/// State shared by the metric logger (store thread) and the strategy (main
/// thread).
#[derive(Default)]
pub struct EpochFigures {
    totals: Mutex<Totals>,
    changed: Condvar,
    /// A logger records into it (a strategy installed without its logger
    /// has none, and must not wait for one).
    attached: AtomicBool,
}

impl EpochFigures {
    /// A logger records here from now on; the figures an earlier run left in
    /// `directory` are read back (a resumed run must still know the epochs
    /// before the resume: Burn's best-checkpoint strategy compares every
    /// epoch from the first).
    pub fn attach(&self, directory: &Path) {
        self.attached.store(true, Ordering::SeqCst);
        let earlier = read_figures(&directory.join(GLOBAL_METRICS_FILE));
        self.totals.lock().unwrap().global.extend(earlier);
    }

    /// The logger saw a metric's definition.
    pub fn define(&self, name: &str, numeric: bool) {
        if numeric {
            self.totals.lock().unwrap().numeric.insert(name.to_string());
        }
    }

    /// One per-iteration entry of this rank: `sum` is value × `count`
    /// (left out when it is not finite).
    pub fn record(&self, epoch: usize, split: Split, name: &str, sum: f64, count: u64) {
        if !sum.is_finite() {
            return;
        }
        let mut totals = self.totals.lock().unwrap();
        let slot = totals
            .local
            .entry((epoch, split, name.to_string()))
            .or_default();
        slot.0 += sum;
        slot.1 += count;
    }

    /// This rank's final value of a metric for a split of `epoch` (Burn
    /// 0.22 logs it at the split's end); it replaces the per-iteration mean.
    pub fn record_final(&self, epoch: usize, split: Split, name: &str, value: f64) {
        let mut totals = self.totals.lock().unwrap();
        totals
            .finals
            .insert((epoch, split, name.to_string()), value);
    }

    /// Records `entry` of metric `name` ([`record`](Self::record) or
    /// [`record_final`](Self::record_final)).
    pub fn record_entry(&self, epoch: usize, split: Split, name: &str, entry: Entry) {
        match entry {
            Entry::Iteration { sum, count } => self.record(epoch, split, name, sum, count),
            Entry::Final(value) => self.record_final(epoch, split, name, value),
        }
    }

    /// The logger saw `split` of `epoch` end.
    pub fn end_split(&self, epoch: usize, split: Split) {
        let mut totals = self.totals.lock().unwrap();
        totals.ended.insert((epoch, split));
        // Old epochs' raw sums are no longer needed for the reduction.
        totals.local.retain(|(e, _, _), _| *e + 2 >= epoch);
        totals.finals.retain(|(e, _, _), _| *e + 2 >= epoch);
        self.changed.notify_all();
    }

    /// What the store should answer for a metric: the global mean and count
    /// once summed, this rank's own before that, `None` when unknown here
    /// (the store then asks its next logger).
    pub fn read(&self, epoch: usize, split: Split, name: &str) -> Option<(f64, u64)> {
        let totals = self.totals.lock().unwrap();
        let key = (epoch, split, name.to_string());
        if let Some(&figure) = totals.global.get(&key) {
            return Some(figure);
        }
        let local = totals.local.get(&key).copied().filter(|&(_, n)| n > 0);
        match (totals.finals.get(&key), local) {
            (Some(&value), local) => Some((value, local.map_or(1, |(_, n)| n))),
            (None, Some((sum, count))) => Some((sum / count as f64, count)),
            (None, None) => None,
        }
    }

    /// The global figure of a metric, once summed.
    pub fn global(&self, epoch: usize, split: Split, name: &str) -> Option<f64> {
        let totals = self.totals.lock().unwrap();
        totals
            .global
            .get(&(epoch, split, name.to_string()))
            .map(|&(value, _)| value)
    }

    /// Keeps only the earlier run's figures of epochs before `starting_epoch`
    /// (a fresh run keeps none, a run resumed after epoch n keeps 1..=n), and
    /// on rank 0 (`main`) rewrites [`GLOBAL_METRICS_FILE`] to match, so the
    /// file and the store hold one figure per epoch, split and metric.
    pub fn start_at(&self, starting_epoch: usize, directory: &Path, main: bool) {
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
            .map(|((epoch, split, name), (value, count))| GlobalMetric {
                epoch,
                split: split.name(),
                name,
                value,
                count,
            })
            .collect();
        figures.sort_by(|a, b| (a.epoch, a.split, &a.name).cmp(&(b.epoch, b.split, &b.name)));
        let text = format!("{HEADER}{}", rows(&figures));
        // Written beside and renamed over: a crash leaves the old file or the new.
        if let Err(err) = crate::files::write_atomic(&path, text.as_bytes()) {
            log::warn!("rank 0: cannot rewrite {}: {err}", path.display());
        }
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
            if [Split::Train, Split::Valid]
                .iter()
                .all(|split| totals.ended.contains(&(epoch, *split)))
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

    /// Sums this rank's figures of `epoch` with every other rank's; every
    /// rank gets the totals, rank 0 also appends them to
    /// [`GLOBAL_METRICS_FILE`] in `directory` and logs them. Every rank calls
    /// it once per epoch (it is a collective).
    pub fn reduce_epoch(
        &self,
        group: &ProcessGroup,
        epoch: usize,
        wait: Duration,
        directory: &Path,
    ) -> Result<Vec<GlobalMetric>> {
        let rank = group.rank();
        if !self.wait_epoch(epoch, wait) {
            log::warn!(
                "rank {rank}: the metric threads had not finished epoch {epoch} after {wait:?}; \
                 its figures from this rank are partial"
            );
        }
        let (keys, mut sums) = {
            let totals = self.totals.lock().unwrap();
            let keys: Vec<(Split, String)> = [Split::Train, Split::Valid]
                .into_iter()
                .flat_map(|split| totals.numeric.iter().map(move |name| (split, name.clone())))
                .collect();
            let mut sums = Vec::with_capacity(2 * keys.len());
            for (split, name) in &keys {
                let key = (epoch, *split, name.clone());
                let (sum, count) = totals.local.get(&key).copied().unwrap_or((0.0, 0));
                let (sum, count) = match totals.finals.get(&key) {
                    // The final value, weighted by the entries it covers.
                    Some(&value) if value.is_finite() => {
                        let weight = count.max(1);
                        (value * weight as f64, weight)
                    }
                    _ => (sum, count),
                };
                sums.extend([sum, count as f64]);
            }
            (keys, sums)
        };
        // Ranks that registered other metrics would sum unrelated numbers:
        // compare the lists first (a fingerprint each), and stay rank-local if
        // they differ.
        let fingerprint = fnv1a(
            keys.iter()
                .map(|(split, name)| format!("{}/{name}", split.name())),
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
            let mut totals = self.totals.lock().unwrap();
            for ((split, name), pair) in keys.into_iter().zip(sums.chunks(2)) {
                let count = pair[1].round() as u64;
                if count == 0 {
                    continue;
                }
                let value = pair[0] / pair[1];
                totals
                    .global
                    .insert((epoch, split, name.clone()), (value, count));
                figures.push(GlobalMetric {
                    epoch,
                    split: split.name(),
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
            Some((
                (epoch.parse().ok()?, Split::parse(split)?, name.to_string()),
                (value.parse().ok()?, count.parse().ok()?),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_count_weighted_and_survive_a_resume() {
        let dir = std::env::temp_dir().join(format!("ddp-figures-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        let figures = EpochFigures::default();
        figures.attach(&dir);
        figures.define("Loss", true);
        figures.define("Note", false);
        for epoch in 1..=2 {
            figures.record(epoch, Split::Train, "Loss", 2.0 * 4.0, 4);
            figures.record(epoch, Split::Train, "Loss", 1.0 * 2.0, 2);
            figures.record(epoch, Split::Valid, "Loss", 3.0, 1);
            assert_eq!(
                figures.read(epoch, Split::Train, "Loss"),
                Some((10.0 / 6.0, 6))
            );
            figures.end_split(epoch, Split::Train);
            figures.end_split(epoch, Split::Valid);
            let summed = figures
                .reduce_epoch(&group, epoch, Duration::from_secs(1), &dir)
                .unwrap();
            assert_eq!(summed.len(), 2, "{summed:?}");
            assert_eq!(figures.global(epoch, Split::Valid, "Loss"), Some(3.0));
        }
        let csv = std::fs::read_to_string(dir.join(GLOBAL_METRICS_FILE)).unwrap();
        assert_eq!(csv.lines().count(), 5, "{csv}");
        assert!(
            csv.contains(&format!("1,train,Loss,{},6", 10.0 / 6.0)),
            "{csv}"
        );

        // A run resumed after epoch 1 reads the file back and keeps epoch 1.
        let resumed = EpochFigures::default();
        resumed.attach(&dir);
        assert_eq!(resumed.global(2, Split::Train, "Loss"), Some(10.0 / 6.0));
        resumed.start_at(2, &dir, true);
        assert_eq!(resumed.global(2, Split::Train, "Loss"), None);
        assert_eq!(resumed.global(1, Split::Valid, "Loss"), Some(3.0));
        let csv = std::fs::read_to_string(dir.join(GLOBAL_METRICS_FILE)).unwrap();
        assert_eq!(csv.lines().count(), 3, "{csv}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_final_value_replaces_the_mean_and_nan_entries_are_left_out() {
        let dir = std::env::temp_dir().join(format!("ddp-figures-final-{}", std::process::id()));
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        let figures = EpochFigures::default();
        figures.attach(&dir);
        figures.define("Precision", true);
        figures.record(1, Split::Train, "Precision", 0.5 * 4.0, 4);
        figures.record(1, Split::Train, "Precision", f64::NAN, 4);
        figures.record(1, Split::Train, "Precision", 1.0 * 4.0, 4);
        assert_eq!(figures.read(1, Split::Train, "Precision"), Some((0.75, 8)));
        figures.record_final(1, Split::Train, "Precision", 0.7);
        assert_eq!(figures.read(1, Split::Train, "Precision"), Some((0.7, 8)));
        figures.end_split(1, Split::Train);
        figures.end_split(1, Split::Valid);
        let summed = figures
            .reduce_epoch(&group, 1, Duration::from_secs(1), &dir)
            .unwrap();
        assert_eq!(summed.len(), 1, "{summed:?}");
        assert!((summed[0].value - 0.7).abs() < 1e-12 && summed[0].count == 8);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_strategy_without_a_logger_does_not_wait() {
        let figures = EpochFigures::default();
        assert!(figures.wait_epoch(1, Duration::from_secs(60)));
        figures.attach(Path::new("/nonexistent"));
        assert!(!figures.wait_epoch(1, Duration::from_millis(10)));
    }
}
