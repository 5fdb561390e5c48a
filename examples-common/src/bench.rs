//! What the two front-ends' benchmarks (examples/ddp_bench, examples-22's
//! ddp_bench22) print alike: medians, and the table of a training step's
//! share spent synchronising gradients.

use burn_ddp_comm::SyncStats;

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
        "| sync work: pack {:.2} + all-reduce {:.2} + unpack {:.2} ms ({:.1} MB, {} buckets) | {work:.2} ms = {:.1}% of the step |",
        per_step(stats.pack),
        per_step(stats.reduce),
        per_step(stats.unpack),
        stats.bytes as f64 / 1e6 / stats.syncs.max(1) as f64,
        stats.buckets / stats.syncs.max(1),
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
