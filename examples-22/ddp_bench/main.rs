//! Benchmarks of the Burn 0.22 training step with burn-ddp-22, the
//! counterpart of examples/ddp_bench (same model, batch and tables, so the
//! two front-ends compare in one invocation: scripts/front-end-bench.sh).
//! Each prints ratios against a baseline measured in the same run.
//!
//! ```text
//! # wrap + sync_gradients at world size 1 against the plain step, MNIST CNN:
//! target/release/examples/ddp_bench22 --mode overhead
//! # share of a 2-rank MNIST CNN step spent synchronising gradients:
//! target/release/burn-ddp-run --standalone --nproc-per-node 2 target/release/examples/ddp_bench22 --mode share
//! # SyncBatchNorm against BatchNorm in a 2-rank CNN step:
//! target/release/burn-ddp-run --standalone --nproc-per-node 2 target/release/examples/ddp_bench22 --mode sync-bn
//! # the sharded optimizer (ZeRO-1) against DDP, 50M parameters, AdamW
//! # (--variant plain|sharded alone, for each one's peak memory):
//! target/release/burn-ddp-run --standalone --nproc-per-node 4 target/release/examples/ddp_bench22 --mode zero --iters 5 --batch-size 8
//! ```

mod bn_net;
#[path = "../mnist/net.rs"]
mod net;
mod zero;

use bn_net::{BnNet, Norm};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::BatchNorm;
use burn::optim::{GradientsParams, SgdConfig};
use burn::tensor::{Device, Distribution, Int, Tensor};
use burn_ddp_examples_common as common;
use clap::Parser;
use common::alloc;
use common::bench::median;
use common::cli::positive;
use common::fail;
use net::Net;
use std::time::Instant;

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

/// Which benchmark to run.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Mode {
    /// wrap + sync_gradients at world size 1 against the plain step (no launcher).
    Overhead,
    /// Share of a training step spent synchronising gradients.
    Share,
    /// SyncBatchNorm's cost: a CNN step with it against one with BatchNorm.
    SyncBn,
    /// The sharded optimizer (ZeRO stage 1) against DDP: optimizer state,
    /// peak memory and step time on a stack of Linear layers with AdamW.
    Zero,
}

#[derive(Parser, Debug)]
#[command(
    name = "ddp_bench22",
    version,
    about = "Benchmarks of the Burn 0.22 training step with burn-ddp-22."
)]
struct BenchArgs {
    /// What to measure.
    #[arg(long, value_enum, default_value = "overhead")]
    mode: Mode,
    /// Measured iterations per variant.
    #[arg(long, default_value_t = 20, value_parser = positive)]
    iters: usize,
    /// MNIST batch size per process (--mode zero: 8 is a good size).
    #[arg(long = "batch-size", visible_alias = "batch_size", default_value_t = 128,
          value_parser = positive)]
    batch_size: usize,
    /// --mode zero: which optimizer(s) to step.
    #[arg(long, value_enum, default_value = "both")]
    variant: zero::Variant,
    /// --mode zero: the Linear layers' width.
    #[arg(long, default_value_t = 2048, value_parser = positive)]
    width: usize,
    /// --mode zero: how many Linear layers (12 x 2048 x 2048: 50.3M parameters).
    #[arg(long, default_value_t = 12, value_parser = positive)]
    layers: usize,
}

/// One MNIST CNN training step (forward, backward, gradients averaged over
/// the ranks when `sync`, SGD step): the model, the step's seconds, the
/// seconds and bytes of the gradient handling between backward and step.
fn mnist_step(model: Net, batch: usize, sync: bool, device: &Device) -> (Net, f64, f64, u64) {
    let images = Tensor::<4>::random([batch, 1, 28, 28], Distribution::Normal(0.0, 1.0), device);
    let labels = Tensor::<1, Int>::random([batch], Distribution::Uniform(0.0, 10.0), device);
    let started = Instant::now();
    let loss = CrossEntropyLossConfig::new()
        .init(device)
        .forward(model.forward(images), labels);
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let sync_started = Instant::now();
    let allocated = alloc::allocated();
    let grads = if sync {
        burn_ddp_22::sync_gradients(&model, grads).unwrap_or_else(|e| fail(None, e))
    } else {
        grads
    };
    let allocated = alloc::allocated() - allocated;
    let sync_time = sync_started.elapsed().as_secs_f64();
    let model = SgdConfig::new().init().step(0.01, model, grads);
    (model, started.elapsed().as_secs_f64(), sync_time, allocated)
}

fn overhead(group: &burn_ddp_22::ProcessGroup, iters: usize, batch: usize, device: &Device) {
    let rank = group.rank();
    let mut plain = Net::new(device);
    let mut wrapped =
        burn_ddp_22::wrap(Net::new(device), group).unwrap_or_else(|e| fail(Some(rank), e));
    let (mut plain_times, mut wrapped_times) = (Vec::new(), Vec::new());
    for i in 0..iters + 2 {
        // Interleaved, so drift in the machine's speed hits both alike.
        let (m, t, _, _) = mnist_step(plain, batch, false, device);
        plain = m;
        let (m, u, _, _) = mnist_step(wrapped, batch, true, device);
        wrapped = m;
        if i >= 2 {
            plain_times.push(t);
            wrapped_times.push(u);
        }
    }
    let (p, w) = (median(plain_times), median(wrapped_times));
    println!("MNIST CNN step, batch {batch}, world size 1, {iters} steps each (median)");
    println!("| step | time | ratio |");
    println!("| --- | ---: | ---: |");
    println!("| plain (Burn 0.22, Flex) | {:.1} ms | 1.000 |", p * 1e3);
    println!(
        "| wrap + sync_gradients | {:.1} ms | {:.3} |",
        w * 1e3,
        w / p
    );
}

fn share(group: &burn_ddp_22::ProcessGroup, iters: usize, batch: usize, device: &Device) {
    let rank = group.rank();
    let mut model =
        burn_ddp_22::wrap(Net::new(device), group).unwrap_or_else(|e| fail(Some(rank), e));
    let (mut synced, mut local, mut synced_sync, mut local_sync) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut synced_bytes, mut local_bytes) = (Vec::new(), Vec::new());
    for i in 0..iters + 2 {
        if i == 2 {
            burn_ddp_22::sync::reset_sync_stats();
        }
        // Start every measured step together: a local step lets the ranks
        // drift apart, and the next sync would otherwise absorb that drift.
        group.barrier().unwrap_or_else(|e| fail(Some(rank), e));
        let (m, t, b, x) = mnist_step(model, batch, true, device);
        group.barrier().unwrap_or_else(|e| fail(Some(rank), e));
        let (m, u, c, y) = mnist_step(m, batch, false, device);
        model = m;
        if i >= 2 {
            synced.push(t);
            local.push(u);
            synced_sync.push(b);
            local_sync.push(c);
            synced_bytes.push(x as f64);
            local_bytes.push(y as f64);
        }
    }
    let sync_allocated = median(synced_bytes) - median(local_bytes);
    let (s, l) = (median(synced), median(local));
    let sync = median(synced_sync) - median(local_sync);
    if group.is_main() {
        common::bench::print_share(&common::bench::ShareReport {
            batch,
            world_size: group.world_size(),
            transport: group.transport_name(),
            iters,
            synced: s,
            local: l,
            sync_label: "sync_gradients call",
            sync,
            stats: burn_ddp_22::sync::sync_stats(),
            sync_allocated,
        });
    }
}

/// One training step of the normalised CNN (gradients synchronised): the
/// model and the step's seconds.
fn bn_step<N: Norm>(model: BnNet<N>, batch: usize, device: &Device) -> (BnNet<N>, f64) {
    let images = Tensor::<4>::random([batch, 1, 28, 28], Distribution::Normal(0.0, 1.0), device);
    let labels = Tensor::<1, Int>::random([batch], Distribution::Uniform(0.0, 10.0), device);
    let started = Instant::now();
    let loss = CrossEntropyLossConfig::new()
        .init(device)
        .forward(model.forward(images), labels);
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let grads = burn_ddp_22::sync_gradients(&model, grads).unwrap_or_else(|e| fail(None, e));
    let model = SgdConfig::new().init().step(0.01, model, grads);
    (model, started.elapsed().as_secs_f64())
}

fn sync_bn(group: &burn_ddp_22::ProcessGroup, iters: usize, batch: usize, device: &Device) {
    let rank = Some(group.rank());
    let mut local =
        burn_ddp_22::wrap(BnNet::<BatchNorm>::new(device), group).unwrap_or_else(|e| fail(rank, e));
    let mut synced = burn_ddp_22::wrap(BnNet::<burn_ddp_22::SyncBatchNorm>::new(device), group)
        .unwrap_or_else(|e| fail(rank, e));
    let (mut local_times, mut synced_times, mut extra_bytes) = (Vec::new(), Vec::new(), 0);
    for i in 0..iters + 2 {
        // Interleaved, every step started together.
        group.barrier().unwrap_or_else(|e| fail(rank, e));
        let before = group.collective_bytes();
        let (m, t) = bn_step(local, batch, device);
        local = m;
        let local_bytes = group.collective_bytes() - before;
        group.barrier().unwrap_or_else(|e| fail(rank, e));
        let before = group.collective_bytes();
        let (m, u) = bn_step(synced, batch, device);
        synced = m;
        // The same parameters, so the same gradient sync: the rest is
        // SyncBatchNorm's statistics.
        extra_bytes = group.collective_bytes() - before - local_bytes;
        if i >= 2 {
            local_times.push(t);
            synced_times.push(u);
        }
    }
    // The same collectives alone: a tensor all-reduce per layer and direction
    // of its 3 x channels statistics.
    let mut alone = Vec::new();
    for _ in 0..iters {
        group.barrier().unwrap_or_else(|e| fail(rank, e));
        let started = Instant::now();
        for n in [3 * 8, 3 * 16, 3 * 16, 3 * 8] {
            let stats = Tensor::<1>::zeros([n], &Device::flex());
            burn_ddp_22::collective::all_reduce(
                group,
                stats,
                burn_ddp_22::collective::ReduceOp::Sum,
            )
            .unwrap_or_else(|e| fail(rank, e));
        }
        alone.push(started.elapsed().as_secs_f64());
    }
    if group.is_main() {
        common::bench::print_sync_bn(&common::bench::SyncBnReport {
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

fn main() {
    common::cli::init_logger();
    let args = BenchArgs::parse();
    let (iters, batch) = (args.iters, args.batch_size);
    let device = Device::flex().autodiff();
    let group = burn_ddp_22::init_process_group().unwrap_or_else(|e| fail(None, e));
    match args.mode {
        Mode::Overhead if group.world_size() == 1 => overhead(&group, iters, batch, &device),
        Mode::Overhead => fail(
            Some(group.rank()),
            "--mode overhead runs at world size 1 (no launcher)",
        ),
        Mode::Share => share(&group, iters, batch, &device),
        Mode::SyncBn => sync_bn(&group, iters, batch, &device),
        Mode::Zero => zero::run(
            &group,
            args.variant,
            args.width,
            args.layers,
            iters,
            batch,
            &device,
        ),
    }
    burn_ddp_22::destroy_process_group().unwrap_or_else(|e| fail(Some(group.rank()), e));
}
