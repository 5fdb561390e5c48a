//! What the two front-ends' benchmarks (examples/ddp_bench, examples-22's
//! ddp_bench22) measure and print alike, written once: the interleaved
//! timing loops of `--mode overhead`, `share` and `sync-bn` (each program
//! hands them its Burn's training step), medians and the tables.

use crate::fail;
use crate::front_end::FrontEnd;
use burn_ddp_comm::{ProcessGroup, SyncStats};

/// What every benchmark's command line has: how long to measure, on what batch.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct Measure {
    /// Measured iterations per variant.
    #[arg(long, default_value_t = 20, value_parser = crate::cli::positive)]
    pub iters: usize,
    /// MNIST batch size per process.
    #[arg(long = "batch-size", visible_alias = "batch_size", default_value_t = 128,
          value_parser = crate::cli::positive)]
    pub batch_size: usize,
}

/// What one measured training step took.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timing {
    /// The whole step, in seconds.
    pub step: f64,
    /// The part that synchronises gradients (as the program can time it:
    /// the backward pass on Burn 0.21, `sync_gradients` on 0.22), in seconds.
    pub sync: f64,
    /// Bytes allocated during that part.
    pub allocated: u64,
}

/// `--mode overhead`: the plain step against the wrapped one at world size
/// 1, interleaved (so drift in the machine's speed hits both alike), 2
/// warm-ups then `iters` each; their medians.
pub fn overhead<P, W>(
    iters: usize,
    (mut plain, mut wrapped): (P, W),
    mut step_plain: impl FnMut(P) -> (P, Timing),
    mut step_wrapped: impl FnMut(W) -> (W, Timing),
) -> (f64, f64) {
    let (mut plain_times, mut wrapped_times) = (Vec::new(), Vec::new());
    for i in 0..iters + 2 {
        let (m, t) = step_plain(plain);
        plain = m;
        let (m, u) = step_wrapped(wrapped);
        wrapped = m;
        if i >= 2 {
            plain_times.push(t.step);
            wrapped_times.push(u.step);
        }
    }
    (median(plain_times), median(wrapped_times))
}

/// `--mode overhead`'s table: a header naming the two columns, then each
/// step's median and its ratio to the plain one.
pub fn print_overhead(
    batch: usize,
    iters: usize,
    columns: [&str; 2],
    (plain, p): (&str, f64),
    (wrapped, w): (&str, f64),
) {
    println!("MNIST CNN step, batch {batch}, world size 1, {iters} steps each (median)");
    println!("| {} | {} | ratio |", columns[0], columns[1]);
    println!("| --- | ---: | ---: |");
    println!("| {plain} | {:.1} ms | 1.000 |", p * 1e3);
    println!("| {wrapped} | {:.1} ms | {:.3} |", w * 1e3, w / p);
}

/// `--mode share`: `step(model, sync)` with the gradient sync and without,
/// alternating, each started by every rank together, 2 warm-ups then
/// `iters` each; rank 0 prints [`print_share`]'s table (the sync's own time
/// as `sync_label` says).
pub fn share<M>(
    group: &ProcessGroup,
    front_end: FrontEnd,
    (iters, batch): (usize, usize),
    sync_label: &str,
    mut model: M,
    mut step: impl FnMut(M, bool) -> (M, Timing),
) {
    let rank = group.rank();
    let (mut synced, mut local) = (Vec::new(), Vec::new());
    for i in 0..iters + 2 {
        if i == 2 {
            (front_end.reset_sync_stats)();
        }
        // Start every measured step together: a step without sync lets the
        // ranks drift apart, and the next sync would otherwise absorb that drift.
        group.barrier().unwrap_or_else(|e| fail(Some(rank), e));
        let (m, with) = step(model, true);
        group.barrier().unwrap_or_else(|e| fail(Some(rank), e));
        let (m, without) = step(m, false);
        model = m;
        if i >= 2 {
            synced.push(with);
            local.push(without);
        }
    }
    let medians =
        |timings: &[Timing], of: fn(&Timing) -> f64| median(timings.iter().map(of).collect());
    let sync_allocated =
        medians(&synced, |t| t.allocated as f64) - medians(&local, |t| t.allocated as f64);
    let sync = medians(&synced, |t| t.sync) - medians(&local, |t| t.sync);
    if group.is_main() {
        print_share(&ShareReport {
            batch,
            world_size: group.world_size(),
            transport: group.transport_name(),
            iters,
            synced: medians(&synced, |t| t.step),
            local: medians(&local, |t| t.step),
            sync_label,
            sync,
            stats: (front_end.sync_stats)(),
            sync_allocated,
        });
    }
}

/// `--mode sync-bn`: a CNN step with Burn's BatchNorm (`local`) against one
/// with SyncBatchNorm (`synced`), interleaved, every step started together,
/// 2 warm-ups then `iters` each; then the same collectives alone
/// (`all_reduce(n)`: a tensor all-reduce of `n` floats, one per layer and
/// direction of its 3 x channels statistics). Rank 0 prints the table.
pub fn sync_bn<L, S>(
    group: &ProcessGroup,
    (iters, batch): (usize, usize),
    (mut local, mut synced): (L, S),
    (mut step_local, mut step_synced): (impl FnMut(L) -> (L, f64), impl FnMut(S) -> (S, f64)),
    mut all_reduce: impl FnMut(usize) -> burn_ddp_comm::Result<()>,
) {
    let rank = Some(group.rank());
    let (mut local_times, mut synced_times, mut extra_bytes) = (Vec::new(), Vec::new(), 0);
    for i in 0..iters + 2 {
        group.barrier().unwrap_or_else(|e| fail(rank, e));
        let before = group.collective_bytes();
        let (m, t) = step_local(local);
        local = m;
        let local_bytes = group.collective_bytes() - before;
        group.barrier().unwrap_or_else(|e| fail(rank, e));
        let before = group.collective_bytes();
        let (m, u) = step_synced(synced);
        synced = m;
        // The same parameters, so the same gradient sync: the rest is
        // SyncBatchNorm's statistics.
        extra_bytes = group.collective_bytes() - before - local_bytes;
        if i >= 2 {
            local_times.push(t);
            synced_times.push(u);
        }
    }
    let mut alone = Vec::new();
    for _ in 0..iters {
        group.barrier().unwrap_or_else(|e| fail(rank, e));
        let started = std::time::Instant::now();
        for n in [3 * 8, 3 * 16, 3 * 16, 3 * 8] {
            all_reduce(n).unwrap_or_else(|e| fail(rank, e));
        }
        alone.push(started.elapsed().as_secs_f64());
    }
    if group.is_main() {
        print_sync_bn(&SyncBnReport {
            batch,
            world_size: group.world_size(),
            transport: group.transport_name(),
            iters,
            local: median(local_times),
            synced: median(synced_times),
            layers: 2,
            extra_bytes,
            collectives: median(alone),
        });
    }
}

/// The median of `times` (which must not be empty).
pub fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    times[times.len() / 2]
}

/// One `--mode share` run, as measured on rank 0.
pub struct ShareReport<'a> {
    pub batch: usize,
    pub world_size: usize,
    pub transport: &'a str,
    pub iters: usize,
    /// Median step with the gradient sync, in seconds.
    pub synced: f64,
    /// Median step without it.
    pub local: f64,
    /// What the sync's own time is ("backward with sync - without", ...).
    pub sync_label: &'a str,
    /// That time, in seconds.
    pub sync: f64,
    /// The reducer's figures over the measured steps.
    pub stats: SyncStats,
    /// Bytes the sync allocates per step (median with - without).
    pub sync_allocated: f64,
}

/// The table of docs/benchmarks.md's "Gradient sync as a share" sections.
pub fn print_share(report: &ShareReport) {
    let ShareReport { stats, .. } = report;
    let step_ms = report.synced * 1e3;
    let per_step = |d: std::time::Duration| d.as_secs_f64() * 1e3 / stats.syncs.max(1) as f64;
    println!(
        "MNIST CNN step, batch {} per rank, world size {}, transport {}, {} steps each (median)",
        report.batch, report.world_size, report.transport, report.iters
    );
    println!("| measure | time |");
    println!("| --- | ---: |");
    println!("| step with gradient sync | {step_ms:.1} ms |");
    println!("| step without | {:.1} ms |", report.local * 1e3);
    println!("| {} | {:.1} ms |", report.sync_label, report.sync * 1e3);
    let total = per_step(stats.wait + stats.pack + stats.reduce + stats.unpack);
    let work = per_step(stats.pack + stats.reduce + stats.unpack);
    println!(
        "| waiting for the slower rank | {:.2} ms = {:.1}% of the step |",
        per_step(stats.wait),
        100.0 * per_step(stats.wait) / step_ms
    );
    println!(
        "| sync work: pack {:.2} + all-reduce {:.2} + unpack {:.2} ms ({:.1} MB, {} buckets, {} sent during backward) | {work:.2} ms = {:.1}% of the step |",
        per_step(stats.pack),
        per_step(stats.reduce),
        per_step(stats.unpack),
        stats.bytes as f64 / 1e6 / stats.syncs.max(1) as f64,
        stats.buckets / stats.syncs.max(1),
        stats.early_buckets / stats.syncs.max(1),
        100.0 * work / step_ms
    );
    println!(
        "| total in sync | {total:.2} ms = {:.1}% of the step |",
        100.0 * total / step_ms
    );
    println!(
        "| allocated by the sync (with sync - without, median) | {:.1} KiB |",
        report.sync_allocated / 1024.0
    );
}

/// What `ddp_bench --mode sync-bn` measured (either Burn's front-end).
pub struct SyncBnReport<'a> {
    pub batch: usize,
    pub world_size: usize,
    pub transport: &'a str,
    pub iters: usize,
    /// Median step with Burn's BatchNorm (each rank's own statistics), in seconds.
    pub local: f64,
    /// Median step with SyncBatchNorm.
    pub synced: f64,
    /// Normalisation layers in the model.
    pub layers: usize,
    /// Bytes SyncBatchNorm's collectives carried in one step.
    pub extra_bytes: u64,
    /// Median time of one step's worth of those collectives run alone
    /// (tensor all-reduces of the same sizes), in seconds.
    pub collectives: f64,
}

/// The table of docs/benchmarks.md's SyncBatchNorm section.
pub fn print_sync_bn(report: &SyncBnReport) {
    let (local, synced) = (report.local * 1e3, report.synced * 1e3);
    println!(
        "CNN with {} normalisations, batch {} per rank, world size {}, transport {}, {} steps each (median)",
        report.layers, report.batch, report.world_size, report.transport, report.iters
    );
    println!("| normalisation | step | ratio |");
    println!("| --- | ---: | ---: |");
    println!("| BatchNorm (each rank's own batch) | {local:.2} ms | 1.000 |");
    println!("| SyncBatchNorm | {synced:.2} ms | {:.3} |", synced / local);
    println!(
        "SyncBatchNorm's collectives: {} per step ({} layers x forward and backward), {} bytes; \
         {:.3} ms timed alone = {:.1}% of its step",
        2 * report.layers,
        report.layers,
        report.extra_bytes,
        report.collectives * 1e3,
        100.0 * report.collectives / report.synced
    );
}
