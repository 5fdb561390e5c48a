//! Benchmarks of the `Ddp<B>` training step; each prints ratios against a
//! baseline measured in the same run.
//!
//! ```text
//! # Ddp at world size 1 against the plain backend, MNIST CNN step:
//! target/release/examples/ddp_bench --mode overhead
//! # gradient sync of a 256-parameter model, buckets against one collective per parameter:
//! target/release/burn-ddp-run --standalone --nproc-per-node 2 target/release/examples/ddp_bench --mode buckets
//! # share of a 2-rank MNIST CNN step spent synchronising gradients:
//! target/release/burn-ddp-run --standalone --nproc-per-node 2 target/release/examples/ddp_bench --mode share
//! # gradient sync exposed by a step, buckets sent during backward against after it:
//! target/release/burn-ddp-run --standalone --nproc-per-node 2 target/release/examples/ddp_bench --mode overlap --batch-size 64
//! # SyncBatchNorm against BatchNorm in a 2-rank CNN step:
//! target/release/burn-ddp-run --standalone --nproc-per-node 2 target/release/examples/ddp_bench --mode sync-bn
//! ```

mod bn_net;
#[allow(dead_code, unused_macros)] // burn-ddp's functions only: the benchmark runs on Flex
#[path = "../shared/burn_021.rs"]
mod burn_021;
#[path = "../mnist/net.rs"]
mod net;

use burn_021::BURN_DDP;

use bn_net::{BnNet, Norm};
use burn::backend::{Autodiff, Flex};
use burn::module::AutodiffModule;
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{BatchNorm, Linear, LinearConfig};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Int, Tensor};
use burn_ddp::collective::ReduceOp;
use burn_ddp::config::Overlap;
use burn_ddp::{Ddp, DdpConfig, SyncBatchNorm};
use burn_ddp_examples_common as common;
use clap::Parser;
use common::alloc;
use common::bench::{self, median, Timing};
use common::fail;
use net::Net;
use std::time::Instant;

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

type Plain = Autodiff<Flex>;
type Wrapped = Ddp<Autodiff<Flex>>;

/// Which benchmark to run.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum Mode {
    /// Ddp at world size 1 against the plain backend (no launcher).
    Overhead,
    /// Bucketed gradient sync against one collective per parameter.
    Buckets,
    /// Share of a training step spent synchronising gradients.
    Share,
    /// SyncBatchNorm's cost: a CNN step with it against one with BatchNorm.
    SyncBn,
    /// Gradient sync left exposed by a step: buckets sent during backward
    /// (`Overlap::Always`) against after it, no sync at all, and no sync
    /// followed by a barrier (the wait for the slowest rank), alternating;
    /// with the process's CPU time per step.
    Overlap,
}

#[derive(Parser, Debug)]
#[command(
    name = "ddp_bench",
    version,
    about = "Benchmarks of the Ddp training step."
)]
struct BenchArgs {
    /// What to measure.
    #[arg(long, value_enum, default_value = "overhead")]
    mode: Mode,
    #[command(flatten)]
    measure: bench::Measure,
}

/// One MNIST CNN training step (forward, backward, AdamW-free SGD step):
/// the model, the step's seconds, the backward's seconds and bytes allocated.
fn mnist_step<B: AutodiffBackend>(model: Net<B>, batch: usize, sync: bool) -> (Net<B>, Timing) {
    let device = Default::default();
    let images =
        Tensor::<B, 4>::random([batch, 1, 28, 28], Distribution::Normal(0.0, 1.0), &device);
    let labels = Tensor::<B, 1, Int>::random([batch], Distribution::Uniform(0.0, 10.0), &device);
    let started = Instant::now();
    let loss = CrossEntropyLossConfig::new()
        .init(&device)
        .forward(model.forward(images), labels);
    let backward_started = Instant::now();
    let allocated = alloc::allocated();
    let grads = if sync {
        loss.backward()
    } else {
        let _local = burn_ddp::no_sync();
        loss.backward()
    };
    let allocated = alloc::allocated() - allocated;
    let backward = backward_started.elapsed().as_secs_f64();
    let grads = GradientsParams::from_grads(grads, &model);
    let model = SgdConfig::new().init().step(0.01, model, grads);
    let step = started.elapsed().as_secs_f64();
    let timing = Timing {
        step,
        sync: backward,
        allocated,
    };
    (model, timing)
}

fn overhead(iters: usize, batch: usize) {
    let device = Default::default();
    let models = (Net::<Plain>::new(&device), Net::<Wrapped>::new(&device));
    let (p, w) = bench::overhead(
        iters,
        models,
        |model| mnist_step(model, batch, true),
        |model| mnist_step(model, batch, true),
    );
    bench::print_overhead(
        batch,
        iters,
        ["backend", "step"],
        ("Autodiff<Flex>", p),
        ("Ddp<Autodiff<Flex>>", w),
    );
}

/// 128 small linear layers: 256 parameter tensors.
#[derive(Module, Debug)]
struct ManySmall<B: Backend> {
    layers: Vec<Linear<B>>,
}

impl<B: Backend> ManySmall<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            layers: (0..128)
                .map(|_| LinearConfig::new(16, 16).init(device))
                .collect(),
        }
    }

    fn forward(&self, mut x: Tensor<B, 2>) -> Tensor<B, 2> {
        for layer in &self.layers {
            x = layer.forward(x).tanh();
        }
        x
    }
}

fn backward_time(model: &ManySmall<Wrapped>, sync: bool) -> f64 {
    let device = Default::default();
    let x = Tensor::<Wrapped, 2>::random([8, 16], Distribution::Default, &device);
    let loss = model.forward(x).sum();
    let started = Instant::now();
    let _grads = if sync {
        loss.backward()
    } else {
        let _local = burn_ddp::no_sync();
        loss.backward()
    };
    started.elapsed().as_secs_f64()
}

fn buckets(group: &burn_ddp::ProcessGroup, iters: usize) {
    let device = Default::default();
    let mut results = Vec::new();
    for (name, config) in [
        (
            "one bucket per parameter",
            DdpConfig::new()
                .with_bucket_cap_mb(1e-9)
                .with_first_bucket_cap_mb(1e-9),
        ),
        ("default buckets (25 MiB, first 1 MiB)", DdpConfig::new()),
    ] {
        let model = config
            .wrap(ManySmall::<Wrapped>::new(&device), group)
            .unwrap_or_else(|e| fail(Some(group.rank()), e));
        let (mut with, mut without) = (Vec::new(), Vec::new());
        for i in 0..iters + 3 {
            let (a, b) = (backward_time(&model, true), backward_time(&model, false));
            if i >= 3 {
                with.push(a);
                without.push(b);
            }
        }
        results.push((name, median(with) - median(without)));
    }
    if group.is_main() {
        println!("gradient sync of 256 parameters (128 x Linear(16, 16)), world size {}, {iters} backward passes each", group.world_size());
        println!("| variant | sync time per backward | speed-up |");
        println!("| --- | ---: | ---: |");
        let base = results[0].1;
        for (name, t) in &results {
            println!("| {name} | {:.3} ms | {:.1}x |", t * 1e3, base / t);
        }
    }
}

fn share(group: &burn_ddp::ProcessGroup, iters: usize, batch: usize) {
    let device = Default::default();
    let model = burn_ddp::wrap(Net::<Wrapped>::new(&device), group)
        .unwrap_or_else(|e| fail(Some(group.rank()), e));
    let label = "backward with sync - without";
    bench::share(
        group,
        BURN_DDP,
        (iters, batch),
        label,
        model,
        |model, sync| mnist_step(model, batch, sync),
    );
}

/// The MNIST CNN's step three ways, each started by every rank together, in
/// turn: synchronised with buckets sent during backward, synchronised after
/// backward (the same model wrapped with `Overlap::Never`), and under
/// `no_sync`; 2 warm-ups, then `iters` of each. Rank 0 prints the medians
/// and the sync each way leaves exposed (its step minus the `no_sync` one).
fn overlap(group: &burn_ddp::ProcessGroup, iters: usize, batch: usize) {
    let device = Default::default();
    let rank = Some(group.rank());
    let wrap = |overlap: Overlap| {
        let model = DdpConfig::new()
            .with_overlap_backward(overlap)
            .wrap(Net::<Wrapped>::new(&device), group);
        Some(model.unwrap_or_else(|e| fail(rank, e)))
    };
    // During backward, after backward, no_sync, and no_sync followed by a
    // barrier: the step no synchronous training can beat, the slowest
    // rank's, which overlap cannot hide (PyTorch's DDP waits for it too).
    let mut models = [
        wrap(Overlap::Always),
        wrap(Overlap::Never),
        wrap(Overlap::Never),
        wrap(Overlap::Never),
    ];
    let mut steps: [Vec<f64>; 4] = Default::default();
    let mut cpu: [Vec<f64>; 4] = Default::default();
    for i in 0..iters + 2 {
        for kind in 0..models.len() {
            group.barrier().unwrap_or_else(|e| fail(rank, e));
            // The other wrapped models sit this step out, as in a program
            // with one model: a wrapped model no forward pass used still
            // agrees with the other ranks at every backward (one collective
            // each, some rank might have its gradients).
            let _idle: Vec<_> = models
                .iter()
                .enumerate()
                .filter(|(other, _)| *other != kind)
                .map(|(_, m)| burn_ddp::sync::no_sync_for(m.as_ref().expect("put back")))
                .collect();
            let slot = &mut models[kind];
            let model = slot.take().expect("each model is put back after its step");
            let cpu_before = process_cpu_seconds();
            let (model, timing) = mnist_step(model, batch, kind < 2);
            let waited = Instant::now();
            if kind == 3 {
                group.barrier().unwrap_or_else(|e| fail(rank, e));
            }
            let waited = waited.elapsed().as_secs_f64();
            let cpu_used = process_cpu_seconds() - cpu_before;
            *slot = Some(model);
            if i >= 2 {
                steps[kind].push(timing.step + waited);
                cpu[kind].push(cpu_used);
            }
        }
    }
    let overlapped = models[0].as_ref().expect("put back");
    let early = burn_ddp::sync::sync_stats_of(overlapped).unwrap_or_default();
    if group.is_main() {
        let [during, after, local, slowest] = steps.map(|s| median(s) * 1e3);
        let [cpu_during, cpu_after, cpu_local, _] = cpu.map(|s| median(s) * 1e3);
        println!(
            "MNIST CNN step, batch {batch} per rank, world size {}, transport {}, {iters} steps each (median)",
            group.world_size(),
            group.transport_name()
        );
        println!(
            "| step | time | sync exposed (step - no_sync step) | beyond the slowest rank (step - (no_sync, then a barrier)) | CPU of rank 0's process | sync's CPU (- no_sync's) |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: |");
        for (name, step, cpu) in [
            ("buckets sent during backward", during, cpu_during),
            ("buckets sent after backward", after, cpu_after),
        ] {
            println!(
                "| {name} | {step:.1} ms | {:.1} ms | {:.1} ms | {cpu:.1} ms | {:.1} ms |",
                step - local,
                step - slowest,
                cpu - cpu_local
            );
        }
        println!("| no_sync | {local:.1} ms | | | {cpu_local:.1} ms | |");
        println!("| no_sync, then a barrier | {slowest:.1} ms | | | | |");
        println!(
            "buckets sent during backward: {} of {}",
            early.early_buckets, early.buckets
        );
    }
}

/// CPU time this process has used so far, every thread's (the
/// communication thread's included), in seconds.
fn process_cpu_seconds() -> f64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given and nothing else.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut now) };
    now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9
}

/// One training step of the normalised CNN (gradients synchronised): the
/// model and the step's seconds.
fn bn_step<N>(model: BnNet<Wrapped, N>, batch: usize) -> (BnNet<Wrapped, N>, f64)
where
    N: Norm<Wrapped> + AutodiffModule<Wrapped>,
    N::InnerModule: Norm<Flex>,
{
    let device = Default::default();
    let images =
        Tensor::<Wrapped, 4>::random([batch, 1, 28, 28], Distribution::Normal(0.0, 1.0), &device);
    let labels =
        Tensor::<Wrapped, 1, Int>::random([batch], Distribution::Uniform(0.0, 10.0), &device);
    let started = Instant::now();
    let loss = CrossEntropyLossConfig::new()
        .init(&device)
        .forward(model.forward(images), labels);
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let model = SgdConfig::new().init().step(0.01, model, grads);
    (model, started.elapsed().as_secs_f64())
}

fn sync_bn(group: &burn_ddp::ProcessGroup, iters: usize, batch: usize) {
    let device = Default::default();
    let rank = Some(group.rank());
    let local = burn_ddp::wrap(BnNet::<Wrapped, BatchNorm<Wrapped>>::new(&device), group)
        .unwrap_or_else(|e| fail(rank, e));
    let synced = burn_ddp::wrap(
        BnNet::<Wrapped, SyncBatchNorm<Wrapped>>::new(&device),
        group,
    )
    .unwrap_or_else(|e| fail(rank, e));
    let all_reduce = |n| {
        let stats = Tensor::<Flex, 1>::zeros([n], &Default::default());
        burn_ddp::collective::all_reduce(group, stats, ReduceOp::Sum).map(|_| ())
    };
    let steps = (|model| bn_step(model, batch), |model| bn_step(model, batch));
    bench::sync_bn(group, (iters, batch), (local, synced), steps, all_reduce);
}

fn main() {
    common::cli::init_logger();
    let args = BenchArgs::parse();
    let (iters, batch) = (args.measure.iters, args.measure.batch_size);
    let group = burn_ddp::init_process_group().unwrap_or_else(|e| fail(None, e));
    match args.mode {
        Mode::Overhead if group.world_size() == 1 => overhead(iters, batch),
        Mode::Overhead => fail(
            Some(group.rank()),
            "--mode overhead runs at world size 1 (no launcher)",
        ),
        Mode::Buckets => buckets(&group, iters),
        Mode::Share => share(&group, iters, batch),
        Mode::SyncBn => sync_bn(&group, iters, batch),
        Mode::Overlap => overlap(&group, iters, batch),
    }
    burn_ddp::destroy_process_group().unwrap_or_else(|e| fail(Some(group.rank()), e));
}
