//! What each rank does. Every scenario compares `Ddp<B>` training on this
//! rank's shard with a plain single-process reference trained, in the same
//! process, on the union of all ranks' batches.

use crate::models::*;
use burn::backend::{Autodiff, NdArray};
use burn::module::AutodiffModule;
use burn::nn::loss::{CrossEntropyLossConfig, MseLoss, Reduction};
use burn::optim::{AdamWConfig, GradientsAccumulator, GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::Tensor;
use burn_ddp::{Ddp, ProcessGroup};
use burn_ddp_testkit::numbers::{identical_across_ranks as check_identical_across_ranks, shards};

pub type Wrapped = Ddp<Autodiff<NdArray>>;
pub type Plain = Autodiff<NdArray>;

type Res<T> = Result<T, String>;

fn e<E: std::fmt::Display>(err: E) -> String {
    err.to_string()
}

/// A model and how a batch of item indices becomes a loss.
pub trait Task {
    type Model<B: AutodiffBackend>: AutodiffModule<B>;
    fn build<B: AutodiffBackend>(device: &B::Device) -> Self::Model<B>;
    fn loss<B: AutodiffBackend>(
        model: &Self::Model<B>,
        items: &[usize],
        device: &B::Device,
    ) -> Tensor<B, 1>;
}

pub struct ToyTask;

impl Task for ToyTask {
    type Model<B: AutodiffBackend> = Toy<B>;
    fn build<B: AutodiffBackend>(device: &B::Device) -> Toy<B> {
        Toy::new(device, 1)
    }
    fn loss<B: AutodiffBackend>(
        model: &Toy<B>,
        items: &[usize],
        device: &B::Device,
    ) -> Tensor<B, 1> {
        let (x, y) = toy_batch::<B>(items, device);
        MseLoss::new().forward(model.forward(x), y, Reduction::Mean)
    }
}

pub struct ConvTask;

impl Task for ConvTask {
    type Model<B: AutodiffBackend> = SmallConv<B>;
    fn build<B: AutodiffBackend>(device: &B::Device) -> SmallConv<B> {
        SmallConv::new(device)
    }
    fn loss<B: AutodiffBackend>(
        model: &SmallConv<B>,
        items: &[usize],
        device: &B::Device,
    ) -> Tensor<B, 1> {
        let (x, y) = image_batch::<B>(items, device);
        CrossEntropyLossConfig::new()
            .init(device)
            .forward(model.forward(x), y)
    }
}

/// A `Ddp` model wrapped from per-rank seeds, and the reference with its start.
fn start<T: Task>(group: &ProcessGroup) -> Res<(T::Model<Wrapped>, T::Model<Plain>)> {
    let device = Default::default();
    // Deliberately different seeds: wrapping must make the replicas identical.
    <Wrapped as burn::tensor::backend::Backend>::seed(&device, 1000 + group.rank() as u64);
    let model = T::build::<Wrapped>(&device);
    let own = flat_params(&model);
    if group.world_size() > 1 && check_identical_across_ranks(group, &own, "before wrap").is_ok() {
        return Err(
            "differently seeded replicas started identical; the test proves nothing".into(),
        );
    }
    let model = burn_ddp::wrap(model, group).map_err(e)?;
    let wrapped = flat_params(&model);
    check_identical_across_ranks(group, &wrapped, "after wrap")?;
    let reference = load_params(T::build::<Plain>(&device), &wrapped);
    Ok((model, reference))
}

/// 10 steps of `Ddp` (batch b per rank) against one process with batch N*b.
fn equivalence<T: Task, O1, O2>(mut opt: O1, mut opt_ref: O2, lr: f64) -> Res<()>
where
    O1: Optimizer<T::Model<Wrapped>, Wrapped>,
    O2: Optimizer<T::Model<Plain>, Plain>,
{
    let group = burn_ddp::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = Default::default();
    let (mut model, mut reference) = start::<T>(&group)?;
    let b = 4;
    let shards = shards(world * b * 10 + 1, world);
    for step in 0..10 {
        let mine = &shards[rank][step * b..(step + 1) * b];
        let loss = T::loss::<Wrapped>(&model, mine, &device);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = opt.step(lr, model, grads);

        let global: Vec<usize> = shards
            .iter()
            .flat_map(|s| s[step * b..(step + 1) * b].to_vec())
            .collect();
        let loss = T::loss::<Plain>(&reference, &global, &device);
        let grads = GradientsParams::from_grads(loss.backward(), &reference);
        reference = opt_ref.step(lr, reference, grads);

        check_identical_across_ranks(&group, &flat_params(&model), &format!("after step {step}"))?;
    }
    let diff = max_relative_difference(&flat_params(&model), &flat_params(&reference));
    println!("max_rel_diff {diff:e}");
    if diff > 1e-5 {
        return Err(format!(
            "Ddp and the single-process reference differ by {diff:e} (relative)"
        ));
    }
    // One synchronisation per step, covering every parameter byte.
    let stats = burn_ddp::sync_stats();
    let param_bytes = 4 * flat_params(&model).len() as u64;
    if stats.syncs != 10 || stats.bytes != 10 * param_bytes || stats.buckets < 10 {
        return Err(format!(
            "10 synchronised steps of {param_bytes} bytes, but the stats say {stats:?}"
        ));
    }
    burn_ddp::destroy_process_group().map_err(e)
}

/// Rank 0 trains head A, rank 1 head B: each head's gradient is missing on
/// one rank and must count as zero there.
fn unused_parameter() -> Res<()> {
    let group = burn_ddp::init_process_group().map_err(e)?;
    let rank = group.rank();
    if group.world_size() != 2 {
        return Err("the unused-parameter scenario is written for exactly 2 ranks".into());
    }
    let device = Default::default();
    <Wrapped as burn::tensor::backend::Backend>::seed(&device, 50 + rank as u64);
    let model = burn_ddp::wrap(TwoHeads::<Wrapped>::new(&device), &group).map_err(e)?;
    let mut reference = load_params(TwoHeads::<Plain>::new(&device), &flat_params(&model));
    let mut model = model;
    let (mut opt, mut opt_ref) = (SgdConfig::new().init(), SgdConfig::new().init());
    let b = 4;
    for step in 0..5 {
        let items = |r: usize| {
            (0..b)
                .map(|i| 100 * step + 10 * r + i)
                .collect::<Vec<usize>>()
        };
        let (x, y) = toy_batch::<Wrapped>(&items(rank), &device);
        let loss = MseLoss::new().forward(model.forward(x, rank == 1), y, Reduction::Mean);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = opt.step(0.1, model, grads);

        let (x0, y0) = toy_batch::<Plain>(&items(0), &device);
        let (x1, y1) = toy_batch::<Plain>(&items(1), &device);
        let l0 = MseLoss::new().forward(reference.forward(x0, false), y0, Reduction::Mean);
        let l1 = MseLoss::new().forward(reference.forward(x1, true), y1, Reduction::Mean);
        let grads = GradientsParams::from_grads((l0 + l1).div_scalar(2.0).backward(), &reference);
        reference = opt_ref.step(0.1, reference, grads);
        check_identical_across_ranks(&group, &flat_params(&model), &format!("after step {step}"))?;
    }
    let diff = max_relative_difference(&flat_params(&model), &flat_params(&reference));
    println!("max_rel_diff {diff:e}");
    if diff > 1e-5 {
        return Err(format!(
            "unused-parameter training differs from the reference by {diff:e}"
        ));
    }
    burn_ddp::destroy_process_group().map_err(e)
}

/// One tensor collective and one backward pass, reporting what each did (for
/// the `BURN_DDP_BACKEND` cases).
fn one_step() -> Res<()> {
    let group = burn_ddp::init_process_group().map_err(e)?;
    let device = Default::default();
    let ones = Tensor::<NdArray, 1>::ones([3], &device);
    match burn_ddp::all_reduce(&group, ones, burn_ddp::ReduceOp::Sum) {
        Ok(sum) => println!("tensor_sum {:?}", sum.into_data().to_vec::<f32>().unwrap()),
        Err(err) => println!("tensor_error {err}"),
    }
    let model = burn_ddp::wrap(TwoHeads::<Wrapped>::new(&device), &group).map_err(e)?;
    let (x, y) = toy_batch::<Wrapped>(&[0, 1, 2, 3], &device);
    let loss = MseLoss::new().forward(model.forward(x, true), y, Reduction::Mean);
    let _ = loss.backward(); // panics with the reason if synchronisation fails
    println!("stepped {}", burn_ddp::sync_stats().buckets);
    burn_ddp::destroy_process_group().map_err(e)
}

/// Rank 1 builds a wider layer than rank 0: wrapping must fail on every rank.
fn different_models() -> Res<()> {
    let group = burn_ddp::init_process_group().map_err(e)?;
    let device = Default::default();
    let model = Toy::<Wrapped>::new(&device, 1 + group.rank());
    match burn_ddp::wrap(model, &group) {
        Ok(_) => Err("wrapping different models should fail".into()),
        Err(err) => Err(err.to_string()),
    }
}

/// Replicas started from per-rank seeds, wrapped and trained in step, are
/// identical (`compared N`); then every rank freezes the bias and the last
/// rank alone shifts it, so the check fails on every rank naming a buffer
/// (`replica_error ...`).
fn replicas() -> Res<()> {
    let group = burn_ddp::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = Default::default();
    let (mut model, _) = start::<ToyTask>(&group)?;
    let mut opt = SgdConfig::new().init();
    let shards = shards(world * 8, world);
    for step in 0..3 {
        let loss = ToyTask::loss::<Wrapped>(&model, &shards[rank][2 * step..2 * step + 2], &device);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = opt.step(0.1, model, grads);
    }
    let compared = burn_ddp::check_replicas(&model, &group).map_err(e)?;
    println!("compared {compared}");
    let (id, bias, _) = model.linear.bias.take().unwrap().consume();
    let bias = if rank == world - 1 {
        bias.add_scalar(1.0)
    } else {
        bias
    };
    model.linear.bias = Some(burn::module::Param::initialized(
        id,
        bias.set_require_grad(false),
    ));
    match burn_ddp::check_replicas(&model, &group) {
        Ok(_) => return Err("a rank with another buffer went unnoticed".into()),
        Err(err) => println!("replica_error {err}"),
    }
    burn_ddp::destroy_process_group().map_err(e)
}

/// A model that was never wrapped is synchronised with every other tensor
/// of the default group (the process-wide behaviour of a program that does
/// not wrap): after two steps rank 1 alone marks an extra tensor
/// `require_grad` (a new parameter to `Ddp`), and the next backward must fail
/// on every rank, not sum misaligned buckets. (A wrapped model ignores such a
/// tensor: the GAN scenario.)
fn layout_changes_on_one_rank() -> Res<()> {
    let group = burn_ddp::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = Default::default();
    let mut model = ToyTask::build::<Wrapped>(&device);
    let mut opt = SgdConfig::new().init();
    let shards = shards(world * 8, world);
    let mut extra = None;
    for step in 0..3 {
        if step == 2 && rank == 1 {
            extra = Some(Tensor::<Wrapped, 1>::zeros([7], &device).require_grad());
        }
        let loss = ToyTask::loss::<Wrapped>(&model, &shards[rank][2 * step..2 * step + 2], &device);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = opt.step(0.1, model, grads);
    }
    drop(extra);
    Err("a layout change on one rank should have failed the backward".into())
}

/// k micro-batches under `no_sync`, accumulated, then averaged once.
fn accumulation() -> Res<()> {
    let group = burn_ddp::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = Default::default();
    let (mut model, mut reference) = start::<ToyTask>(&group)?;
    let (mut opt, mut opt_ref) = (SgdConfig::new().init(), SgdConfig::new().init());
    let (b, k) = (4, 3);
    let shards = shards(world * b * k * 4, world);
    for step in 0..4 {
        let mut accumulator = GradientsAccumulator::new();
        {
            let _local = burn_ddp::no_sync();
            for m in 0..k {
                let at = (step * k + m) * b;
                let loss = ToyTask::loss::<Wrapped>(&model, &shards[rank][at..at + b], &device);
                accumulator
                    .accumulate(&model, GradientsParams::from_grads(loss.backward(), &model));
            }
        }
        let grads = burn_ddp::sync_gradients(&model, accumulator.grads()).map_err(e)?;
        model = opt.step(0.05, model, grads);

        let global: Vec<usize> = shards
            .iter()
            .flat_map(|s| s[step * k * b..(step + 1) * k * b].to_vec())
            .collect();
        let loss = ToyTask::loss::<Plain>(&reference, &global, &device).mul_scalar(k as f32);
        let grads = GradientsParams::from_grads(loss.backward(), &reference);
        reference = opt_ref.step(0.05, reference, grads);
        check_identical_across_ranks(&group, &flat_params(&model), &format!("after step {step}"))?;
    }
    let diff = max_relative_difference(&flat_params(&model), &flat_params(&reference));
    println!("max_rel_diff {diff:e}");
    if diff > 1e-5 {
        return Err(format!(
            "accumulated training differs from the big batch by {diff:e}"
        ));
    }
    burn_ddp::destroy_process_group().map_err(e)
}

fn resident_kib() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4
}

/// 2,000 synchronised steps: neither the parameter registry nor the process grows.
fn memory() -> Res<()> {
    let group = burn_ddp::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = Default::default();
    let (mut model, _) = start::<ToyTask>(&group)?;
    let mut opt = SgdConfig::new().init();
    let b = 2;
    let shards = shards(world * b * 2000, world);
    let (mut tracked_early, mut rss_early) = (0, 0);
    for step in 0..2000 {
        let loss =
            ToyTask::loss::<Wrapped>(&model, &shards[rank][step * b..(step + 1) * b], &device);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = opt.step(0.01, model, grads);
        if step == 200 {
            tracked_early = burn_ddp::tracking::tracked_len();
            rss_early = resident_kib();
        }
    }
    let tracked = burn_ddp::tracking::tracked_len();
    let rss = resident_kib();
    println!("tracked {tracked_early} -> {tracked}; rss_kib {rss_early} -> {rss}");
    if tracked > tracked_early.max(2) * 2 + 64 {
        return Err(format!(
            "parameter registry grew from {tracked_early} to {tracked}"
        ));
    }
    if rss > rss_early + 16 * 1024 {
        return Err(format!(
            "resident memory grew from {rss_early} KiB to {rss} KiB"
        ));
    }
    burn_ddp::destroy_process_group().map_err(e)
}

pub fn run(name: &str) -> Res<()> {
    match name {
        "toy_sgd" => {
            equivalence::<ToyTask, _, _>(SgdConfig::new().init(), SgdConfig::new().init(), 0.1)
        }
        "toy_adamw" => {
            equivalence::<ToyTask, _, _>(AdamWConfig::new().init(), AdamWConfig::new().init(), 0.01)
        }
        "conv_sgd" => {
            equivalence::<ConvTask, _, _>(SgdConfig::new().init(), SgdConfig::new().init(), 0.1)
        }
        "conv_adamw" => equivalence::<ConvTask, _, _>(
            AdamWConfig::new().init(),
            AdamWConfig::new().init(),
            0.01,
        ),
        "unused" => unused_parameter(),
        "different_models" => different_models(),
        "replicas" => replicas(),
        "accumulation" => accumulation(),
        "layout_change" => layout_changes_on_one_rank(),
        "memory" => memory(),
        "tensor_collectives" => crate::tensor_collectives(),
        "half" => crate::half::run(),
        "gan" => crate::gan::run(),
        "stray_gradient" => crate::gan::stray_gradient(),
        "one_step" => one_step(),
        "save_forever" => save_forever(),
        other => Err(format!("unknown scenario {other}")),
    }
}

/// Saves checkpoints of a 1024x1024 linear layer at `CHECKPOINT` until killed.
fn save_forever() -> Res<()> {
    use burn::module::Module;
    let path = std::env::var("CHECKPOINT").map_err(e)?;
    let device = Default::default();
    for round in 0u64.. {
        let model: burn::nn::Linear<NdArray> =
            burn::nn::LinearConfig::new(1024, 1024).init(&device);
        burn_ddp::checkpoint::save_atomic::<NdArray, _>((model.into_record(), round), &path)
            .map_err(e)?;
        if round == 0 {
            println!("saving");
        }
    }
    Ok(())
}
