//! All-reduce benchmark in the style of nccl-tests: per message size, the median
//! latency, the algorithm bandwidth (size / time) and the bus bandwidth
//! (algbw * 2(n-1)/n, comparable across world sizes).
//!
//! ```text
//! cargo build --release -p burn-ddp-comm -p burn-ddp-run --bins --example allreduce_bench
//! target/release/burn-ddp-run --standalone --nproc-per-node 2 \
//!     target/release/examples/allreduce_bench --sizes 4K,1M,16M,100M --iters 20
//! ```

use burn_ddp_comm::{ProcessGroup, ReduceOp};
use std::time::Instant;

fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => text.split_at(i),
        None => (text, ""),
    };
    let number: f64 = number.parse().map_err(|_| format!("bad size {text:?}"))?;
    let scale = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1.0,
        "K" | "KB" | "KIB" => 1024.0,
        "M" | "MB" | "MIB" => 1024.0 * 1024.0,
        "G" | "GB" | "GIB" => 1024.0 * 1024.0 * 1024.0,
        _ => return Err(format!("bad unit in {text:?}")),
    };
    Ok((number * scale) as usize)
}

/// The benchmark's command line.
#[derive(clap::Parser, Debug)]
#[command(
    name = "allreduce_bench",
    version,
    about = "All-reduce bandwidth per message size."
)]
struct Args {
    /// Message sizes, comma-separated (B, K, M, G suffixes).
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "4K,64K,1M,16M,100M")]
    sizes: Vec<usize>,
    /// Measured iterations per size.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Unmeasured iterations first.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
}

fn main() {
    let Args {
        sizes,
        iters,
        warmup,
    } = clap::Parser::parse();
    let group = ProcessGroup::from_env().unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1)
    });
    let n = group.world_size();
    if group.is_main() {
        println!(
            "all_reduce (sum, f32), {n} ranks, transport {}, {iters} iterations after {warmup} warm-up",
            group.transport_name()
        );
        println!("| size | median latency | algbw | busbw |");
        println!("| ---: | ---: | ---: | ---: |");
    }
    for &bytes in &sizes {
        let mut data = vec![1.0f32; bytes / 4];
        let mut times = Vec::with_capacity(iters);
        for i in 0..warmup + iters {
            group.barrier().unwrap();
            let start = Instant::now();
            group.all_reduce(&mut data, ReduceOp::Sum).unwrap();
            if i >= warmup {
                times.push(start.elapsed().as_secs_f64());
            }
        }
        times.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let median = times[times.len() / 2];
        let algbw = bytes as f64 / median / 1e9;
        let busbw = algbw * 2.0 * (n as f64 - 1.0) / n as f64;
        if group.is_main() {
            println!(
                "| {} | {:.3} ms | {algbw:.2} GB/s | {busbw:.2} GB/s |",
                human(bytes),
                median * 1e3
            );
        }
    }
    group.destroy().unwrap();
}

fn human(bytes: usize) -> String {
    if bytes >= 1 << 20 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}
