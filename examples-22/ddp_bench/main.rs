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
#[allow(dead_code)] // burn-ddp-22's functions only: the benchmark runs on Flex
#[path = "../burn_022.rs"]
mod burn_022;
mod checkpoint;
#[path = "../mnist/net.rs"]
mod net;
mod zero;

use burn_022::BURN_DDP_22;

use bn_net::{BnNet, Norm};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::BatchNorm;
use burn::optim::{GradientsParams, SgdConfig};
use burn::tensor::{Device, Distribution, Int, Tensor};
use burn_ddp_22::collective::ReduceOp;
use burn_ddp_examples_common as common;
use clap::Parser;
use common::alloc;
use common::bench::{self, Timing};
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
    /// peak memory and step time on a stack of Linear layers with AdamW
    /// (--batch-size 8 is a good size).
    Zero,
    /// The sharded optimizer's checkpoint of the --mode zero stack (AdamW):
    /// saved (--checkpoint-dir) or resumed (--resume), in parts or whole
    /// (--format), with each rank's peak memory while training and while
    /// saving or loading.
    Checkpoint,
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
    #[command(flatten)]
    measure: bench::Measure,
    /// --mode zero: which optimizer(s) to step.
    #[arg(long, value_enum, default_value = "both")]
    variant: zero::Variant,
    /// --mode zero: the Linear layers' width.
    #[arg(long, default_value_t = 2048, value_parser = positive)]
    width: usize,
    /// --mode zero: how many Linear layers (12 x 2048 x 2048: 50.3M parameters).
    #[arg(long, default_value_t = 12, value_parser = positive)]
    layers: usize,
    /// --mode checkpoint: the checkpoint's folder.
    #[arg(long, default_value = "ddp-bench-checkpoint")]
    checkpoint_dir: std::path::PathBuf,
    /// --mode checkpoint: load the checkpoint (then train --iters steps)
    /// instead of training and saving it.
    #[arg(long)]
    resume: bool,
    /// --mode checkpoint: in parts (each rank its own) or whole (rank 0).
    #[arg(long, value_enum, default_value = "parts")]
    format: checkpoint::Format,
    /// --mode checkpoint: the same samples in each step's global batch on
    /// any world size; the save writes the uninterrupted run's parameters
    /// 2 steps later to this file, the resume compares with them.
    #[arg(long)]
    compare: Option<std::path::PathBuf>,
}

/// One MNIST CNN training step (forward, backward, gradients averaged over
/// the ranks when `sync`, SGD step): the model, the step's seconds, the
/// seconds and bytes of the gradient handling between backward and step.
fn mnist_step(model: Net, batch: usize, sync: bool, device: &Device) -> (Net, Timing) {
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
    let timing = Timing {
        step: started.elapsed().as_secs_f64(),
        sync: sync_time,
        allocated,
    };
    (model, timing)
}

fn overhead(group: &burn_ddp_22::ProcessGroup, iters: usize, batch: usize, device: &Device) {
    let rank = group.rank();
    let plain = Net::new(device);
    let wrapped =
        burn_ddp_22::wrap(Net::new(device), group).unwrap_or_else(|e| fail(Some(rank), e));
    let (p, w) = bench::overhead(
        iters,
        (plain, wrapped),
        |model| mnist_step(model, batch, false, device),
        |model| mnist_step(model, batch, true, device),
    );
    bench::print_overhead(
        batch,
        iters,
        ["step", "time"],
        ("plain (Burn 0.22, Flex)", p),
        ("wrap + sync_gradients", w),
    );
}

fn share(group: &burn_ddp_22::ProcessGroup, iters: usize, batch: usize, device: &Device) {
    let rank = group.rank();
    let model = burn_ddp_22::wrap(Net::new(device), group).unwrap_or_else(|e| fail(Some(rank), e));
    let label = "sync_gradients call";
    bench::share(
        group,
        BURN_DDP_22,
        (iters, batch),
        label,
        model,
        |model, sync| mnist_step(model, batch, sync, device),
    );
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
    let local =
        burn_ddp_22::wrap(BnNet::<BatchNorm>::new(device), group).unwrap_or_else(|e| fail(rank, e));
    let synced = burn_ddp_22::wrap(BnNet::<burn_ddp_22::SyncBatchNorm>::new(device), group)
        .unwrap_or_else(|e| fail(rank, e));
    let all_reduce = |n| {
        let stats = Tensor::<1>::zeros([n], &Device::flex());
        burn_ddp_22::collective::all_reduce(group, stats, ReduceOp::Sum).map(|_| ())
    };
    let steps = (
        |model| bn_step(model, batch, device),
        |model| bn_step(model, batch, device),
    );
    bench::sync_bn(group, (iters, batch), (local, synced), steps, all_reduce);
}

fn main() {
    common::cli::init_logger();
    let args = BenchArgs::parse();
    let (iters, batch) = (args.measure.iters, args.measure.batch_size);
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
        Mode::Checkpoint => checkpoint::run(checkpoint::Run {
            group: &group,
            width: args.width,
            layers: args.layers,
            iters,
            batch,
            device: &device,
            dir: &args.checkpoint_dir,
            format: args.format,
            resume: args.resume,
            compare: args.compare.as_deref(),
        }),
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
