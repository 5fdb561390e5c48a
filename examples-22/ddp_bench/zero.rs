//! The sharded optimizer (ZeRO stage 1) against plain DDP on a stack of
//! Linear layers (at least 50M parameters by default) with AdamW: the
//! optimizer state each rank holds (its record's bytes), the process's peak
//! resident memory, and the step time, each variant alone or both
//! alternating in one run.

use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::optim::{AdamWConfig, GradientsParams};
use burn::tensor::{Device, Distribution, Tensor};
use burn_ddp_22::{ProcessGroup, ShardedOptimizer};
use burn_ddp_examples_common::bench::median;
use burn_ddp_examples_common::fail;
use std::time::Instant;

/// `layers` square Linear layers of `width`, tanh between them.
#[derive(Module, Debug)]
pub struct Stack {
    pub layers: Vec<Linear>,
}

impl Stack {
    pub fn new(width: usize, layers: usize, device: &Device) -> Self {
        let layers = (0..layers)
            .map(|_| LinearConfig::new(width, width).init(device))
            .collect();
        Self { layers }
    }

    pub fn loss(&self, batch: usize, width: usize, device: &Device) -> Tensor<1> {
        let mut x = Tensor::<2>::random([batch, width], Distribution::Normal(0.0, 1.0), device);
        for layer in &self.layers {
            x = layer.forward(x).tanh();
        }
        x.powi_scalar(2).mean()
    }

    /// The loss of this rank's rows of global batch `step` (`world` ranks
    /// of `batch` rows each): the same samples in each step's global batch
    /// whatever the world size, so runs on different world sizes can be
    /// compared.
    pub fn loss_of_step(
        &self,
        step: u64,
        (rank, world): (usize, usize),
        batch: usize,
        width: usize,
        device: &Device,
    ) -> Tensor<1> {
        device.seed(step);
        let global = Tensor::<2>::random(
            [batch * world, width],
            Distribution::Normal(0.0, 1.0),
            device,
        );
        let mut x = global.narrow(0, rank * batch, batch);
        for layer in &self.layers {
            x = layer.forward(x).tanh();
        }
        x.powi_scalar(2).mean()
    }

    /// Every parameter's values, in order.
    pub fn values(&self) -> Vec<f32> {
        self.layers
            .iter()
            .flat_map(|layer| {
                let mut values = layer.weight.val().into_data().try_to_vec::<f32>().unwrap();
                if let Some(bias) = &layer.bias {
                    values.extend(bias.val().into_data().try_to_vec::<f32>().unwrap());
                }
                values
            })
            .collect()
    }

    pub fn parameters(&self) -> usize {
        self.num_params()
    }
}

/// Which optimizer(s) the run steps.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
pub enum Variant {
    /// Plain DDP (sync_gradients, AdamW) and the sharded optimizer, alternating.
    Both,
    /// Plain DDP only (for its peak memory).
    Plain,
    /// The sharded optimizer only (for its peak memory).
    Sharded,
}

/// The median of `times` in milliseconds, `-` without any.
fn median_ms(times: &[f64]) -> String {
    if times.is_empty() {
        return "-".into();
    }
    format!("{:.0} ms", median(times.to_vec()) * 1e3)
}

/// The process's peak resident memory (`VmHWM`), in MiB.
pub fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
            line.split_whitespace().nth(1)?.parse::<f64>().ok()
        })
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

pub fn run(
    group: &ProcessGroup,
    variant: Variant,
    width: usize,
    layers: usize,
    iters: usize,
    batch: usize,
    device: &Device,
) {
    let rank = group.rank();
    let start = burn_ddp_22::wrap(Stack::new(width, layers, device), group)
        .unwrap_or_else(|e| fail(Some(rank), e));
    let params = start.parameters();
    let lr = 1e-4;
    let run_plain = variant != Variant::Sharded;
    let run_sharded = variant != Variant::Plain;
    let mut plain = run_plain.then(|| (start.clone(), AdamWConfig::new().init()));
    let mut sharded = run_sharded.then(|| {
        let optimizer = ShardedOptimizer::new(AdamWConfig::new().init(), group)
            .unwrap_or_else(|e| fail(Some(rank), e));
        (start.clone(), optimizer)
    });
    drop(start);
    let (mut plain_times, mut sharded_times) = (Vec::new(), Vec::new());
    // One warm-up step each, then `iters` measured, alternating.
    for step in 0..=iters {
        if let Some((model, optimizer)) = plain.take() {
            group.barrier().unwrap_or_else(|e| fail(Some(rank), e));
            let started = Instant::now();
            let grads =
                GradientsParams::from_grads(model.loss(batch, width, device).backward(), &model);
            let grads =
                burn_ddp_22::sync_gradients(&model, grads).unwrap_or_else(|e| fail(Some(rank), e));
            let mut optimizer = optimizer;
            let model = optimizer.step(lr, model, grads);
            model.layers[0].weight.val().into_data(); // wait for the step's kernels
            if step > 0 {
                plain_times.push(started.elapsed().as_secs_f64());
            }
            plain = Some((model, optimizer));
        }
        if let Some((model, mut optimizer)) = sharded.take() {
            group.barrier().unwrap_or_else(|e| fail(Some(rank), e));
            let started = Instant::now();
            let grads =
                GradientsParams::from_grads(model.loss(batch, width, device).backward(), &model);
            let model = optimizer
                .step(lr, model, grads)
                .unwrap_or_else(|e| fail(Some(rank), e));
            model.layers[0].weight.val().into_data();
            if step > 0 {
                sharded_times.push(started.elapsed().as_secs_f64());
            }
            sharded = Some((model, optimizer));
        }
    }
    let bytes = |record: burn::optim::OptimizerRecord| {
        record
            .into_bytes()
            .map(|b| b.len())
            .unwrap_or_else(|e| fail(Some(rank), e))
    };
    let plain_state = plain
        .as_ref()
        .map(|(_, optimizer)| bytes(optimizer.to_record()));
    let sharded_state = sharded
        .as_ref()
        .map(|(_, optimizer)| bytes(optimizer.to_record()));
    // Every rank's figures, in rank order (one line each).
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    println!(
        "rank {rank}/{}: {params} parameters ({} x Linear({width}, {width})), batch {batch}: \
         optimizer state plain {} sharded {}, peak RSS {:.0} MiB, step plain {} sharded {}",
        group.world_size(),
        layers,
        plain_state.map_or("-".into(), |b| format!("{:.1} MiB", mib(b))),
        sharded_state.map_or("-".into(), |b| format!("{:.1} MiB", mib(b))),
        peak_rss_mib(),
        median_ms(&plain_times),
        median_ms(&sharded_times),
    );
    let per_step = |stats: burn_ddp_22::sync::SyncStats| {
        let steps = (iters + 1) as f64;
        format!(
            "wait {:.0} ms, pack {:.0} ms, collectives {:.0} ms, unpack {:.0} ms",
            stats.wait.as_secs_f64() * 1e3 / steps,
            stats.pack.as_secs_f64() * 1e3 / steps,
            stats.reduce.as_secs_f64() * 1e3 / steps,
            stats.unpack.as_secs_f64() * 1e3 / steps
        )
    };
    if let Some(stats) = plain
        .as_ref()
        .and_then(|(model, _)| burn_ddp_22::sync::sync_stats_of(model))
    {
        println!("rank {rank}: DDP per step: {}", per_step(stats));
    }
    if let Some((_, optimizer)) = &sharded {
        println!(
            "rank {rank}: sharded per step: {}",
            per_step(optimizer.stats())
        );
    }
    if variant == Variant::Both && rank == 0 {
        let (p, s) = (median(plain_times), median(sharded_times));
        println!("| world | step, DDP | step, sharded | ratio |");
        println!("| ---: | ---: | ---: | ---: |");
        println!(
            "| {} | {:.0} ms | {:.0} ms | {:.3} |",
            group.world_size(),
            p * 1e3,
            s * 1e3,
            s / p
        );
    }
}
