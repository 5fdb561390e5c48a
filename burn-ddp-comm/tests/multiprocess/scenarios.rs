//! What each rank process does; every scenario exits the process.

use burn_ddp_comm::{
    BucketConfig, DType, GradientSet, ParamInfo, ParamLayout, Placement, ProcessGroup, ReduceOp,
    Reducer,
};

pub fn run(name: &str) -> ! {
    let result = match name {
        "lab" => lab(),
        "sizes" => sizes(),
        "back_to_back" => back_to_back(),
        "die" => die(),
        "mismatch" => mismatch(),
        "invalid" => invalid(),
        "twice" => twice(),
        "steady" => steady(),
        "big_loop" => big_loop(),
        "survive" => survive(),
        "compare_algorithms" => compare_algorithms(),
        "compressed" => compressed(),
        "rounds" => rounds(),
        "die_in_round" => die_in_round(),
        other => Err(format!("unknown scenario {other}")),
    };
    match result {
        Ok(()) => std::process::exit(0),
        Err(message) => {
            eprintln!("ERROR: {message}");
            std::process::exit(1)
        }
    }
}

fn group() -> Result<ProcessGroup, String> {
    ProcessGroup::from_env().map_err(|e| e.to_string())
}

fn expect<T: PartialEq + std::fmt::Debug>(what: &str, got: &[T], want: &[T]) -> Result<(), String> {
    if got == want {
        return Ok(());
    }
    let first = got.iter().zip(want).position(|(g, w)| g != w);
    Err(format!(
        "{what}: {} vs {} elements, first difference at {first:?}",
        got.len(),
        want.len()
    ))
}

/// collectives_lab.py, printed as `<op> <value>`.
fn lab() -> Result<(), String> {
    println!("pid {}", std::process::id());
    let g = group()?;
    let rank = g.rank();
    let world = g.world_size();
    let e = |e: burn_ddp_comm::CommError| e.to_string();
    println!("transport {}", g.transport_name());

    let mut x = [rank as f32];
    g.all_reduce(&mut x, ReduceOp::Sum).map_err(e)?;
    println!("all_reduce {}", x[0]);

    let gathered = g.all_gather(&[rank as i64]).map_err(e)?;
    println!("all_gather {gathered:?}");

    let mut z = [if rank == 0 { 2026i64 } else { -1 }];
    g.broadcast(&mut z, 0).map_err(e)?;
    println!("broadcast {}", z[0]);

    let input: Vec<f32> = (0..world * 2)
        .map(|i| i as f32 + rank as f32 * 100.0)
        .collect();
    let out = g.reduce_scatter(&input, ReduceOp::Sum).map_err(e)?;
    println!("reduce_scatter {out:?}");
    g.destroy().map_err(e)
}

/// Every op, dtype and the lengths 0, 1, 7 and ~1M+3 against closed forms.
fn sizes() -> Result<(), String> {
    let g = group()?;
    let (rank, n) = (g.rank(), g.world_size());
    let e = |e: burn_ddp_comm::CommError| e.to_string();
    let pattern = |i: usize| (i % 97) as f32 - 48.0;
    for len in [0usize, 1, 7, (1 << 20) + 3] {
        let scale = |r: usize| (r + 1) as f32;
        let mine: Vec<f32> = (0..len).map(|i| pattern(i) * scale(rank)).collect();
        let total: f32 = (0..n).map(scale).sum();

        let mut sum = mine.clone();
        g.all_reduce(&mut sum, ReduceOp::Sum).map_err(e)?;
        let want: Vec<f32> = (0..len).map(|i| pattern(i) * total).collect();
        expect(&format!("sum f32 len {len}"), &sum, &want)?;

        let mut mean = mine.clone();
        g.all_reduce(&mut mean, ReduceOp::Mean).map_err(e)?;
        let want: Vec<f32> = (0..len).map(|i| pattern(i) * total / n as f32).collect();
        expect(&format!("mean f32 len {len}"), &mean, &want)?;

        let mut max = mine.clone();
        g.all_reduce(&mut max, ReduceOp::Max).map_err(e)?;
        let want: Vec<f32> = (0..len)
            .map(|i| {
                (0..n)
                    .map(|r| pattern(i) * scale(r))
                    .fold(f32::MIN, f32::max)
            })
            .collect();
        expect(&format!("max f32 len {len}"), &max, &want)?;

        let mut min = mine.clone();
        g.all_reduce(&mut min, ReduceOp::Min).map_err(e)?;
        let want: Vec<f32> = (0..len)
            .map(|i| {
                (0..n)
                    .map(|r| pattern(i) * scale(r))
                    .fold(f32::MAX, f32::min)
            })
            .collect();
        expect(&format!("min f32 len {len}"), &min, &want)?;

        let mut wide: Vec<f64> = (0..len).map(|i| i as f64 + rank as f64 * 0.5).collect();
        g.all_reduce(&mut wide, ReduceOp::Sum).map_err(e)?;
        let offset: f64 = (0..n).map(|r| r as f64 * 0.5).sum();
        let want: Vec<f64> = (0..len).map(|i| i as f64 * n as f64 + offset).collect();
        expect(&format!("sum f64 len {len}"), &wide, &want)?;

        let mut ints: Vec<i64> = (0..len as i64).map(|i| i * (rank as i64 + 1)).collect();
        g.all_reduce(&mut ints, ReduceOp::Sum).map_err(e)?;
        let factor: i64 = (1..=n as i64).sum();
        let want: Vec<i64> = (0..len as i64).map(|i| i * factor).collect();
        expect(&format!("sum i64 len {len}"), &ints, &want)?;

        let gathered = g.all_gather(&mine).map_err(e)?;
        let want: Vec<f32> = (0..n)
            .flat_map(|r| (0..len).map(move |i| pattern(i) * scale(r)))
            .collect();
        expect(&format!("all_gather len {len}"), &gathered, &want)?;

        let input: Vec<i32> = (0..len * n).map(|i| i as i32 + rank as i32).collect();
        let out = g.reduce_scatter(&input, ReduceOp::Sum).map_err(e)?;
        let ranks_sum: i32 = (0..n as i32).sum();
        let want: Vec<i32> = (rank * len..(rank + 1) * len)
            .map(|i| i as i32 * n as i32 + ranks_sum)
            .collect();
        expect(&format!("reduce_scatter len {len}"), &out, &want)?;

        // Mean, in place (a sharded optimizer's rounds): rank r holds
        // 2 * (r + 1) everywhere, so the mean is n + 1 (exact in f32).
        let mut buffer: Vec<f32> = vec![2.0 * (rank as f32 + 1.0); len * n];
        g.reduce_scatter_in_place(burn_ddp_comm::BufferMut::F32(&mut buffer), ReduceOp::Mean)
            .map_err(e)?;
        let want = vec![n as f32 + 1.0; len];
        expect(
            &format!("reduce_scatter_in_place mean len {len}"),
            &buffer[rank * len..(rank + 1) * len],
            &want,
        )?;
        let mut buffer: Vec<f32> = vec![f32::NAN; len * n];
        buffer[rank * len..(rank + 1) * len].copy_from_slice(&mine);
        g.all_gather_in_place(burn_ddp_comm::BufferMut::F32(&mut buffer))
            .map_err(e)?;
        let want: Vec<f32> = (0..n)
            .flat_map(|r| (0..len).map(move |i| pattern(i) * scale(r)))
            .collect();
        expect(&format!("all_gather_in_place len {len}"), &buffer, &want)?;

        let root = n - 1;
        let mut data: Vec<f32> = if rank == root {
            (0..len).map(pattern).collect()
        } else {
            vec![f32::NAN; len]
        };
        g.broadcast(&mut data, root).map_err(e)?;
        let want: Vec<f32> = (0..len).map(pattern).collect();
        expect(&format!("broadcast len {len}"), &data, &want)?;
    }
    g.destroy().map_err(e)
}

/// Hundreds of small and medium collectives in a row stay in step.
fn back_to_back() -> Result<(), String> {
    let g = group()?;
    let (rank, n) = (g.rank(), g.world_size());
    let e = |e: burn_ddp_comm::CommError| e.to_string();
    for step in 0..600usize {
        let len = [1, 3, 1000, 40_000][step % 4];
        let mut data = vec![(rank + step) as f32; len];
        g.all_reduce(&mut data, ReduceOp::Sum).map_err(e)?;
        let want = (0..n).map(|r| (r + step) as f32).sum::<f32>();
        if data.iter().any(|v| *v != want) {
            return Err(format!("step {step}: got {} want {want}", data[0]));
        }
        if step % 50 == 0 {
            g.barrier().map_err(e)?;
        }
    }
    g.destroy().map_err(e)
}

/// The rank with DIE_AFTER_INIT exits after joining; the others try to reduce.
fn die() -> Result<(), String> {
    let g = group()?;
    if std::env::var("DIE_AFTER_INIT").is_ok() {
        std::process::exit(7);
    }
    let mut data = vec![1.0f32; 1 << 20];
    g.all_reduce(&mut data, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    Err("the all_reduce with a dead peer should have failed".into())
}

/// Ranks call all_reduce with different lengths.
fn mismatch() -> Result<(), String> {
    let g = group()?;
    let mut data = vec![1.0f32; 4 + g.rank()];
    g.all_reduce(&mut data, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    Err("mismatched all_reduce should have failed".into())
}

/// Bad arguments fail on the calling rank without touching the network, and the
/// group stays usable afterwards.
fn invalid() -> Result<(), String> {
    let g = group()?;
    let err = g
        .reduce_scatter(&[1.0f32; 3], ReduceOp::Sum)
        .unwrap_err()
        .to_string();
    if !err.contains("divisible by the world size") || !err.contains(&format!("rank {}", g.rank()))
    {
        return Err(format!("unexpected reduce_scatter error: {err}"));
    }
    let err = g.broadcast(&mut [0.0f32], 5).unwrap_err().to_string();
    if !err.contains("root 5") {
        return Err(format!("unexpected broadcast error: {err}"));
    }
    let mut x = [1.0f32];
    g.all_reduce(&mut x, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    if x[0] != g.world_size() as f32 {
        return Err(format!("group unusable after bad arguments: {}", x[0]));
    }
    g.destroy().map_err(|e| e.to_string())
}

/// Two groups one after the other in the same processes.
fn twice() -> Result<(), String> {
    for round in 0..2 {
        let g = group()?;
        let mut x = [(g.rank() + round) as i64];
        g.all_reduce(&mut x, ReduceOp::Sum)
            .map_err(|e| format!("round {round}: {e}"))?;
        let n = g.world_size() as i64;
        expect("sum", &x, &[n * (n - 1) / 2 + n * round as i64])?;
        g.destroy().map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Training-like traffic: small all-reduces for three seconds.
fn steady() -> Result<(), String> {
    println!("pid {}", std::process::id());
    let g = group()?;
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(3) {
        let mut x = [1.0f32; 64];
        g.all_reduce(&mut x, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    g.destroy().map_err(|e| e.to_string())
}

/// All-reduces of 64 MiB until one fails.
fn big_loop() -> Result<(), String> {
    let g = group()?;
    let mut data = vec![1.0f32; 16 << 20];
    println!("ready");
    loop {
        g.all_reduce(&mut data, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        data.fill(1.0);
    }
}

/// 12 steps of all-reduces that go on without a rank that is gone: rank
/// `SURVIVE_VICTIM` prints `ready` at step 5 (the driver then kills or stops
/// it) and the survivors, on the failure, form the next generation of the
/// group among themselves (`reform`) and redo the step. Each step's sum is
/// checked against its world; a stopped rank that comes back is fenced.
fn survive() -> Result<(), String> {
    let mut g = group()?;
    let victim: usize = std::env::var("SURVIVE_VICTIM")
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or("SURVIVE_VICTIM unset")?;
    let mut step = 0;
    let mut failed_at = None;
    while step < 12 {
        if step == 5 && g.generation() == 0 && g.rank() == victim {
            println!("ready");
            std::io::Write::flush(&mut std::io::stdout()).map_err(|e| e.to_string())?;
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        let world = g.world_size();
        let mut data = vec![(g.rank() + 1) as f32; 1 << 16];
        let started = std::time::Instant::now();
        match g.all_reduce(&mut data, ReduceOp::Sum) {
            Ok(()) => {
                let want = (world * (world + 1) / 2) as f32;
                if let Some(bad) = data.iter().find(|&&v| v != want) {
                    return Err(format!("step {step}: {bad}, not {want}"));
                }
                if let Some(at) = failed_at.take() {
                    let at: std::time::Instant = at;
                    println!("recovered_in_ms {}", at.elapsed().as_millis());
                }
                step += 1;
            }
            Err(err) => {
                eprintln!("step {step}: {err}");
                failed_at.get_or_insert(started);
                let wait = std::env::var("SURVIVE_WAIT_SECS")
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(10);
                g = g
                    .reform(std::time::Duration::from_secs(wait))
                    .map_err(|e| e.to_string())?;
                println!(
                    "generation {} rank {} of {}",
                    g.generation(),
                    g.rank(),
                    g.world_size()
                );
            }
        }
    }
    println!("steps {step} world {}", g.world_size());
    Ok(())
}

/// The same all-reduces under the ring and then the hierarchical algorithm
/// (two groups one after the other): integers equal exactly, floats to the
/// reassociation error, and every rank holds the same bits.
fn compare_algorithms() -> Result<(), String> {
    let e = |e: burn_ddp_comm::CommError| e.to_string();
    let mut results = Vec::new();
    for algorithm in ["ring", "hierarchical"] {
        // Single-threaded here: no other thread reads the environment.
        std::env::set_var("BURN_DDP_ALGORITHM", algorithm);
        let g = group()?;
        println!("{algorithm} transport {}", g.transport_name());
        let (rank, n) = (g.rank(), g.world_size());
        // Lengths that do and do not split into equal shards per machine.
        let mut floats: Vec<f32> = (0..(1 << 20) + 3)
            .map(|i| ((i * 7 + rank * 13) % 1000) as f32 * 0.001 + 0.1)
            .collect();
        g.all_reduce(&mut floats, ReduceOp::Sum).map_err(e)?;
        let mut means: Vec<f64> = (0..1001).map(|i| (i + rank) as f64).collect();
        g.all_reduce(&mut means, ReduceOp::Mean).map_err(e)?;
        let mut ints: Vec<i64> = (0..4099).map(|i| (i * (rank + 1)) as i64).collect();
        g.all_reduce(&mut ints, ReduceOp::Sum).map_err(e)?;
        let mut maxes: Vec<i32> = (0..17).map(|i| ((i + rank) % 5) as i32).collect();
        g.all_reduce(&mut maxes, ReduceOp::Max).map_err(e)?;
        // The same bits everywhere: gather a checksum of this rank's result.
        let checksum = floats
            .iter()
            .fold(0u64, |acc, x| acc.rotate_left(5) ^ x.to_bits() as u64);
        let sums = g.all_gather(&[checksum as i64]).map_err(e)?;
        if sums.iter().any(|s| *s != sums[0]) {
            return Err(format!(
                "{algorithm}: ranks hold different results: {sums:?}"
            ));
        }
        let expect_ints: Vec<i64> = (0..4099)
            .map(|i| i as i64 * (1..=n as i64).sum::<i64>())
            .collect();
        expect(&format!("{algorithm} i64 sum"), &ints, &expect_ints)?;
        let expect_max: Vec<i32> = (0..17)
            .map(|i| (0..n).map(|r| ((i + r) % 5) as i32).max().unwrap())
            .collect();
        expect(&format!("{algorithm} i32 max"), &maxes, &expect_max)?;
        let expect_means: Vec<f64> = (0..1001)
            .map(|i| (0..n).map(|r| (i + r) as f64).sum::<f64>() / n as f64)
            .collect();
        expect(&format!("{algorithm} f64 mean"), &means, &expect_means)?;
        results.push(floats);
        g.destroy().map_err(e)?;
    }
    let worst = results[0]
        .iter()
        .zip(&results[1])
        .map(|(a, b)| ((a - b).abs() / a.abs().max(1e-6)) as f64)
        .fold(0.0, f64::max);
    if worst > 1e-5 {
        return Err(format!(
            "f32 sums differ by up to {worst:e} between the algorithms"
        ));
    }
    println!("worst relative difference {worst:e}");
    Ok(())
}

/// An f32 sum with `BURN_DDP_COMPRESSION` set: close to the exact sum (bf16
/// rounding), visibly rounded (it did travel in 16 bits), the same bits on
/// every rank; integers exact.
fn compressed() -> Result<(), String> {
    let e = |e: burn_ddp_comm::CommError| e.to_string();
    let g = group()?;
    println!("transport {}", g.transport_name());
    let (rank, n) = (g.rank(), g.world_size());
    let value = |i: usize, r: usize| ((i * 7 + r * 13) % 1000) as f64 * 0.001 + 0.1;
    let len = (1 << 20) + 3;
    let mut x: Vec<f32> = (0..len).map(|i| value(i, rank) as f32).collect();
    g.all_reduce(&mut x, ReduceOp::Sum).map_err(e)?;
    let mut rounded = 0;
    for (i, got) in x.iter().enumerate() {
        let exact: f64 = (0..n).map(|r| value(i, r)).sum();
        let error = (*got as f64 - exact).abs() / exact;
        if error > 1.0 / 64.0 {
            return Err(format!("[{i}] = {got}, exact {exact}: off by {error:e}"));
        }
        rounded += usize::from(error > 1e-6);
    }
    if rounded < len / 2 {
        return Err(format!(
            "only {rounded} of {len} sums were rounded: not compressed?"
        ));
    }
    let checksum = x
        .iter()
        .fold(0u64, |acc, v| acc.rotate_left(5) ^ v.to_bits() as u64);
    let sums = g.all_gather(&[checksum as i64]).map_err(e)?;
    if sums.iter().any(|s| *s != sums[0]) {
        return Err(format!("ranks hold different results: {sums:?}"));
    }
    let mut ints: Vec<i64> = (0..999).map(|i| (i * (rank + 1)) as i64).collect();
    g.all_reduce(&mut ints, ReduceOp::Sum).map_err(e)?;
    let expect_ints: Vec<i64> = (0..999)
        .map(|i| i as i64 * (1..=n as i64).sum::<i64>())
        .collect();
    expect("i64 sum", &ints, &expect_ints)?;
    g.destroy().map_err(e)
}

/// Gradients in plain vectors, as a front-end holds them.
struct VecSet {
    params: Vec<ParamInfo>,
    grads: Vec<Option<Vec<f32>>>,
    reads: Vec<usize>,
}

impl VecSet {
    /// Rank `rank`'s gradients of step `step`: parameter `i`, element `j` is
    /// `(rank + 1) * (i + 1) + (j + step) % 7`; parameter `rank % 7` has none
    /// on this rank (it counts as zero).
    fn new(rank: usize, step: usize) -> Self {
        let sizes = [3usize, 1000, 5, 300_000, 7, 1100, 50];
        let params = sizes
            .iter()
            .enumerate()
            .map(|(id, &n)| ParamInfo {
                id: id as u64,
                layout: ParamLayout {
                    shape: vec![n],
                    dtype: DType::F32,
                },
                placement: Placement::Host,
            })
            .collect();
        let grads = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let value = |j: usize| ((rank + 1) * (i + 1) + (j + step) % 7) as f32;
                (i != rank % 7).then(|| (0..n).map(value).collect())
            })
            .collect();
        Self {
            params,
            grads,
            reads: Vec::new(),
        }
    }

    fn bytes(&self, index: usize, out: &mut [u8]) {
        match &self.grads[index] {
            Some(grad) => out.copy_from_slice(bytemuck::cast_slice(grad)),
            None => out.fill(0),
        }
    }
}

impl GradientSet for VecSet {
    fn params(&self) -> &[ParamInfo] {
        &self.params
    }

    fn read_host(&mut self, index: usize, out: &mut [u8]) -> burn_ddp_comm::Result<()> {
        self.reads.push(index);
        self.bytes(index, out);
        Ok(())
    }

    fn write_host(&mut self, index: usize, averaged: &[u8]) -> burn_ddp_comm::Result<()> {
        self.grads[index] = Some(bytemuck::cast_slice(averaged).to_vec());
        Ok(())
    }
}

/// Small buckets: several per step, so some leave while others fill.
fn small_buckets() -> BucketConfig {
    BucketConfig {
        cap_bytes: 4096,
        first_cap_bytes: 64,
    }
}

/// Gradients handed over one by one, in a different order on every rank
/// (as backward finishes them), average to the bits `synchronize` gives;
/// those not handed over are read at `finish`, and no one is read twice.
fn rounds() -> Result<(), String> {
    let g = group()?;
    let rank = g.rank();
    let e = |e: burn_ddp_comm::CommError| e.to_string();
    let mut whole = Reducer::new(&g, small_buckets());
    let mut early = Reducer::new(&g, small_buckets());
    for step in 0..20 {
        let mut reference = VecSet::new(rank, step);
        whole.synchronize(&mut reference).map_err(e)?;
        let mut set = VecSet::new(rank, step);
        let mut round = early.begin(set.params()).map_err(e)?.ok_or("no round")?;
        // Rank- and step-dependent order; one parameter left to `finish`.
        let order: Vec<usize> = (0..7).map(|k| (k * (rank + 2) + step) % 7).collect();
        for &param in &order[..6] {
            round
                .ready(param, |out| {
                    set.bytes(param, out);
                    Ok(())
                })
                .map_err(e)?;
        }
        early.finish(round, &mut set).map_err(e)?;
        if set.reads != [order[6]] {
            return Err(format!(
                "step {step}: read at finish {:?}, not [{}]",
                set.reads, order[6]
            ));
        }
        for i in 0..7 {
            let got = set.grads[i].as_ref().ok_or("a gradient missing")?;
            let want = reference.grads[i].as_ref().ok_or("a gradient missing")?;
            expect(&format!("step {step}, parameter {i}"), got, want)?;
        }
    }
    let buckets = early.plan().buckets.len();
    if buckets < 4 {
        return Err(format!("only {buckets} buckets: the test needs several"));
    }
    println!("rounds ok over {buckets} buckets");
    g.destroy().map_err(e)
}

/// The rank with DIE_IN_ROUND exits after handing over half its gradients
/// (some buckets have left); the others must fail, not hang.
fn die_in_round() -> Result<(), String> {
    let g = group()?;
    let e = |e: burn_ddp_comm::CommError| e.to_string();
    let mut reducer = Reducer::new(&g, small_buckets());
    let mut set = VecSet::new(g.rank(), 0);
    let mut round = reducer.begin(set.params()).map_err(e)?.ok_or("no round")?;
    for param in [6, 5, 4] {
        round
            .ready(param, |out| {
                set.bytes(param, out);
                Ok(())
            })
            .map_err(e)?;
    }
    if std::env::var("DIE_IN_ROUND").is_ok() {
        std::thread::sleep(std::time::Duration::from_millis(200));
        std::process::exit(7);
    }
    reducer.finish(round, &mut set).map_err(e)?;
    Err("the round with a dead peer should have failed".into())
}
