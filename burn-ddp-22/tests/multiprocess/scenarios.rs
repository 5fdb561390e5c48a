//! What each rank does. Every training scenario compares a model trained on
//! this rank's shard, its gradients averaged with `sync_gradients`, with a
//! plain single-process reference trained, in the same process, on the
//! union of all ranks' batches.

use crate::models::*;
use burn::module::Module;
use burn::nn::loss::{CrossEntropyLossConfig, MseLoss, Reduction};
use burn::optim::{AdamWConfig, GradientsAccumulator, GradientsParams, ModuleOptimizer, SgdConfig};
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_ddp_22::{ProcessGroup, ReduceOp};
use burn_ddp_testkit::numbers::{identical_across_ranks as check_identical_across_ranks, shards};

type Res<T> = Result<T, String>;

fn e<E: std::fmt::Display>(err: E) -> String {
    err.to_string()
}

fn device() -> Device {
    Device::flex().autodiff()
}

/// A model and how a batch of item indices becomes a loss.
pub trait Task {
    type Model: Module;
    fn build(device: &Device) -> Self::Model;
    fn loss(model: &Self::Model, items: &[usize], device: &Device) -> Tensor<1>;
}

pub struct ToyTask;

impl Task for ToyTask {
    type Model = Toy;
    fn build(device: &Device) -> Toy {
        Toy::new(device, 1)
    }
    fn loss(model: &Toy, items: &[usize], device: &Device) -> Tensor<1> {
        let (x, y) = toy_batch(items, device);
        MseLoss::new().forward(model.forward(x), y, Reduction::Mean)
    }
}

pub struct ConvTask;

impl Task for ConvTask {
    type Model = SmallConv;
    fn build(device: &Device) -> SmallConv {
        SmallConv::new(device)
    }
    fn loss(model: &SmallConv, items: &[usize], device: &Device) -> Tensor<1> {
        let (x, y) = image_batch(items, device);
        CrossEntropyLossConfig::new()
            .init(device)
            .forward(model.forward(x), y)
    }
}

/// A model wrapped from per-rank seeds, and the reference with its start.
fn start<T: Task>(group: &ProcessGroup) -> Res<(T::Model, T::Model)> {
    let device = device();
    // Deliberately different seeds: wrapping must make the replicas identical.
    device.seed(1000 + group.rank() as u64);
    let model = T::build(&device);
    let own = flat_params(&model);
    if group.world_size() > 1 && check_identical_across_ranks(group, &own, "before wrap").is_ok() {
        return Err(
            "differently seeded replicas started identical; the test proves nothing".into(),
        );
    }
    let model = burn_ddp_22::wrap(model, group).map_err(e)?;
    let wrapped = flat_params(&model);
    check_identical_across_ranks(group, &wrapped, "after wrap")?;
    // The reference is a separate model (its own parameter ids), never wrapped.
    let reference = load_params(T::build(&device), &wrapped);
    Ok((model, reference))
}

/// 10 steps (batch b per rank) against one process with batch N*b.
fn equivalence<T: Task>(
    mut opt: ModuleOptimizer,
    mut opt_ref: ModuleOptimizer,
    lr: f64,
) -> Res<()> {
    let group = burn_ddp_22::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = device();
    let (mut model, mut reference) = start::<T>(&group)?;
    let b = 4;
    let shards = shards(world * b * 10 + 1, world);
    for step in 0..10 {
        let mine = &shards[rank][step * b..(step + 1) * b];
        let loss = T::loss(&model, mine, &device);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let grads = burn_ddp_22::sync_gradients(&model, grads).map_err(e)?;
        model = opt.step(lr, model, grads);

        let global: Vec<usize> = shards
            .iter()
            .flat_map(|s| s[step * b..(step + 1) * b].to_vec())
            .collect();
        let loss = T::loss(&reference, &global, &device);
        let grads = GradientsParams::from_grads(loss.backward(), &reference);
        reference = opt_ref.step(lr, reference, grads);

        check_identical_across_ranks(&group, &flat_params(&model), &format!("after step {step}"))?;
    }
    let diff = max_relative_difference(&flat_params(&model), &flat_params(&reference));
    println!("max_rel_diff {diff:e}");
    if diff > 1e-5 {
        return Err(format!(
            "DDP and the single-process reference differ by {diff:e} (relative)"
        ));
    }
    // One synchronisation per step, covering every parameter byte, by the
    // model's own reducer.
    let stats = burn_ddp_22::sync_stats_of(&model).ok_or("no stats for the model")?;
    let param_bytes = 4 * flat_params(&model).len() as u64;
    if stats.syncs != 10 || stats.bytes != 10 * param_bytes || stats.buckets < 10 {
        return Err(format!(
            "10 synchronised steps of {param_bytes} bytes, but the stats say {stats:?}"
        ));
    }
    burn_ddp_22::destroy_process_group().map_err(e)
}

/// Rank 0 trains head A, rank 1 head B: each head's gradient is missing on
/// one rank and must count as zero there.
fn unused_parameter() -> Res<()> {
    let group = burn_ddp_22::init_process_group().map_err(e)?;
    let rank = group.rank();
    if group.world_size() != 2 {
        return Err("the unused-parameter scenario is written for exactly 2 ranks".into());
    }
    let device = device();
    device.seed(50 + rank as u64);
    let mut model = burn_ddp_22::wrap(TwoHeads::new(&device), &group).map_err(e)?;
    let mut reference = load_params(TwoHeads::new(&device), &flat_params(&model));
    let (mut opt, mut opt_ref) = (SgdConfig::new().init(), SgdConfig::new().init());
    let b = 4;
    for step in 0..5 {
        let items = |r: usize| {
            (0..b)
                .map(|i| 100 * step + 10 * r + i)
                .collect::<Vec<usize>>()
        };
        let (x, y) = toy_batch(&items(rank), &device);
        let loss = MseLoss::new().forward(model.forward(x, rank == 1), y, Reduction::Mean);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let grads = burn_ddp_22::sync_gradients(&model, grads).map_err(e)?;
        model = opt.step(0.1, model, grads);

        let (x0, y0) = toy_batch(&items(0), &device);
        let (x1, y1) = toy_batch(&items(1), &device);
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
    burn_ddp_22::destroy_process_group().map_err(e)
}

/// k micro-batches accumulated locally (Burn's `GradientsAccumulator`), then
/// averaged once: equal to one step on the whole big batch.
fn accumulation() -> Res<()> {
    let group = burn_ddp_22::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = device();
    let (mut model, mut reference) = start::<ToyTask>(&group)?;
    let (mut opt, mut opt_ref) = (SgdConfig::new().init(), SgdConfig::new().init());
    let (b, k) = (4, 3);
    let shards = shards(world * b * k * 4, world);
    for step in 0..4 {
        let mut accumulator = GradientsAccumulator::new();
        for m in 0..k {
            let at = (step * k + m) * b;
            let loss = ToyTask::loss(&model, &shards[rank][at..at + b], &device);
            accumulator.accumulate(&model, GradientsParams::from_grads(loss.backward(), &model));
        }
        let grads = burn_ddp_22::sync_gradients(&model, accumulator.grads()).map_err(e)?;
        model = opt.step(0.05, model, grads);

        let global: Vec<usize> = shards
            .iter()
            .flat_map(|s| s[step * k * b..(step + 1) * k * b].to_vec())
            .collect();
        let loss = ToyTask::loss(&reference, &global, &device).mul_scalar(k as f32);
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
    let syncs = burn_ddp_22::sync_stats_of(&model).map(|s| s.syncs);
    if syncs != Some(4) {
        return Err(format!(
            "4 steps of {k} micro-batches synchronised {syncs:?} times"
        ));
    }
    burn_ddp_22::destroy_process_group().map_err(e)
}

/// Rank 1 builds a wider layer than rank 0: wrapping must fail on every rank.
fn different_models() -> Res<()> {
    let group = burn_ddp_22::init_process_group().map_err(e)?;
    let model = Toy::new(&device(), 1 + group.rank());
    match burn_ddp_22::wrap(model, &group) {
        Ok(_) => Err("wrapping different models should fail".into()),
        Err(err) => Err(err.to_string()),
    }
}

/// After two steps rank 1 freezes the bias (no longer trainable there): the
/// next sync must fail on every rank, not sum misaligned buckets.
fn layout_change() -> Res<()> {
    let group = burn_ddp_22::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = device();
    let mut model = burn_ddp_22::wrap(ToyTask::build(&device), &group).map_err(e)?;
    let mut opt = SgdConfig::new().init();
    let shards = shards(world * 8, world);
    for step in 0..3 {
        if step == 2 && rank == 1 {
            let bias = model.linear.bias.take().unwrap();
            let (id, value, _) = bias.consume();
            model.linear.bias = Some(burn::module::Param::initialized(
                id,
                value.set_require_grad(false),
            ));
        }
        let loss = ToyTask::loss(&model, &shards[rank][2 * step..2 * step + 2], &device);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let grads = burn_ddp_22::sync_gradients(&model, grads).map_err(e)?;
        model = opt.step(0.1, model, grads);
    }
    Err("a layout change on one rank should have failed the sync".into())
}

/// Replicas started from per-rank seeds, wrapped and trained in step, are
/// identical (`compared N`); then the last rank takes one step alone and the
/// check fails on every rank (`replica_error ...`).
fn replicas() -> Res<()> {
    let group = burn_ddp_22::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let (mut model, _) = start::<ToyTask>(&group)?;
    let device = device();
    let mut opt = SgdConfig::new().init();
    let shards = shards(world * 8, world);
    for step in 0..3 {
        let loss = ToyTask::loss(&model, &shards[rank][2 * step..2 * step + 2], &device);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let grads = burn_ddp_22::sync_gradients(&model, grads).map_err(e)?;
        model = opt.step(0.1, model, grads);
    }
    let compared = burn_ddp_22::check_replicas(&model, &group).map_err(e)?;
    println!("compared {compared}");
    if rank == world - 1 {
        let loss = ToyTask::loss(&model, &shards[rank][6..8], &device);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = opt.step(0.1, model, grads);
    }
    match burn_ddp_22::check_replicas(&model, &group) {
        Ok(_) => return Err("a rank that stepped alone went unnoticed".into()),
        Err(err) => println!("replica_error {err}"),
    }
    burn_ddp_22::destroy_process_group().map_err(e)
}

/// Trains until killed: prints `ready` after two steps, then keeps going
/// (for the fault cases).
fn train_forever() -> Res<()> {
    let group = burn_ddp_22::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = device();
    let mut model = burn_ddp_22::wrap(ToyTask::build(&device), &group).map_err(e)?;
    let mut opt = SgdConfig::new().init();
    let shards = shards(world * 8, world);
    for step in 0.. {
        let at = 2 * (step % 4);
        let loss = ToyTask::loss(&model, &shards[rank][at..at + 2], &device);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let grads = burn_ddp_22::sync_gradients(&model, grads).map_err(e)?;
        model = opt.step(0.01, model, grads);
        if step == 2 {
            println!("ready");
        }
    }
    unreachable!()
}

/// One tensor collective and one synchronised step, reporting what each did
/// (for the `BURN_DDP_BACKEND` cases).
fn one_step() -> Res<()> {
    let group = burn_ddp_22::init_process_group().map_err(e)?;
    let device = device();
    let ones = Tensor::<1>::ones([3], &device);
    match burn_ddp_22::all_reduce(&group, ones, ReduceOp::Sum) {
        Ok(sum) => println!(
            "tensor_sum {:?}",
            sum.into_data().try_to_vec::<f32>().unwrap()
        ),
        Err(err) => println!("tensor_error {err}"),
    }
    let model = burn_ddp_22::wrap(ToyTask::build(&device), &group).map_err(e)?;
    let loss = ToyTask::loss(&model, &[0, 1, 2, 3], &device);
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    burn_ddp_22::sync_gradients(&model, grads).map_err(e)?;
    println!("stepped {}", burn_ddp_22::sync_stats().buckets);
    burn_ddp_22::destroy_process_group().map_err(e)
}

/// Float and int tensors of rank 2, each collective against its closed form.
fn tensor_collectives() -> Res<()> {
    let group = burn_ddp_22::init_process_group().map_err(e)?;
    let (rank, n) = (group.rank(), group.world_size());
    let device = Device::flex();
    let same = |what: &str, got: TensorData, want: TensorData| {
        if got == want {
            Ok(())
        } else {
            Err(format!("{what}: got {got:?}, want {want:?}"))
        }
    };
    // A [2, 3] float tensor: value (rank + 1) * (index + 1).
    let mine = |r: usize| {
        Tensor::<1, Int>::arange(1..7, &device)
            .float()
            .mul_scalar((r + 1) as f32)
            .reshape([2, 3])
    };
    let total: f32 = (1..=n).map(|r| r as f32).sum();
    let sum = burn_ddp_22::all_reduce(&group, mine(rank), ReduceOp::Sum).map_err(e)?;
    same(
        "sum",
        sum.into_data(),
        mine(0).mul_scalar(total).into_data(),
    )?;
    let mean = burn_ddp_22::all_reduce(&group, mine(rank), ReduceOp::Mean).map_err(e)?;
    mean.into_data().assert_approx_eq::<f32>(
        &mine(0).mul_scalar(total / n as f32).into_data(),
        Default::default(),
    );
    let max = burn_ddp_22::all_reduce(&group, mine(rank), ReduceOp::Max).map_err(e)?;
    same("max", max.into_data(), mine(n - 1).into_data())?;

    let ints = Tensor::<2, Int>::from_ints([[rank as i64, -(rank as i64)]], &device);
    let gathered = burn_ddp_22::all_gather(&group, ints).map_err(e)?;
    if gathered.len() != n {
        return Err(format!("all_gather returned {} tensors", gathered.len()));
    }
    for (r, t) in gathered.into_iter().enumerate() {
        let want = Tensor::<2, Int>::from_ints([[r as i64, -(r as i64)]], &device);
        same("all_gather", t.into_data(), want.into_data())?;
    }

    // An empty tensor gathers as one empty tensor per rank.
    let empty = burn_ddp_22::all_gather(&group, Tensor::<1>::zeros([0], &device)).map_err(e)?;
    if empty.len() != n || empty.iter().any(|t| t.dims() != [0]) {
        return Err(format!(
            "all_gather of empty tensors gave {} tensors",
            empty.len()
        ));
    }

    let root = n - 1;
    let value = if rank == root {
        mine(7)
    } else {
        mine(rank).zeros_like()
    };
    let got = burn_ddp_22::broadcast(&group, value, root).map_err(e)?;
    same("broadcast", got.into_data(), mine(7).into_data())?;

    // [2n, 3] split along dim 0: rank r gets rows 2r..2r+2 summed over ranks.
    let rows = Tensor::<1, Int>::arange(0..(6 * n) as i64, &device)
        .float()
        .reshape([2 * n, 3]);
    let scattered =
        burn_ddp_22::reduce_scatter(&group, rows.clone().add_scalar(rank as f32), ReduceOp::Sum)
            .map_err(e)?;
    let offset: f32 = (0..n).map(|r| r as f32).sum();
    let want = rows
        .slice(2 * rank..2 * rank + 2)
        .mul_scalar(n as f32)
        .add_scalar(offset);
    same("reduce_scatter", scattered.into_data(), want.into_data())?;

    // f64 keeps its type through the host round trip.
    let wide = TensorData::new(vec![rank as f64 + 0.5], [1]);
    let wide = Tensor::<1>::from_data(wide, (&device, burn::tensor::DType::F64));
    let wide = burn_ddp_22::all_reduce(&group, wide, ReduceOp::Sum).map_err(e)?;
    let want: f64 = (0..n).map(|r| r as f64 + 0.5).sum();
    same(
        "f64 sum",
        wide.into_data(),
        TensorData::new(vec![want], [1]),
    )?;

    if n > 1 {
        let odd = Tensor::<2>::zeros([2 * n + 1, 1], &device);
        let err = burn_ddp_22::reduce_scatter(&group, odd, ReduceOp::Sum)
            .unwrap_err()
            .to_string();
        if !err.contains("multiple of") {
            return Err(format!("bad reduce_scatter error: {err}"));
        }
        let err = burn_ddp_22::broadcast(&group, mine(0), n)
            .unwrap_err()
            .to_string();
        if !err.contains(&format!("broadcast from rank {n} in a world of {n}")) {
            return Err(format!("bad broadcast error: {err}"));
        }
    }
    let bytes = TensorData::new(vec![1u8, 2], [2]);
    let bytes = Tensor::<1, Int>::from_data(bytes, (&device, burn::tensor::DType::U8));
    match burn_ddp_22::all_reduce(&group, bytes, ReduceOp::Sum) {
        Err(err) if err.to_string().contains("not U8") => {}
        other => return Err(format!("a u8 tensor should be refused: {other:?}")),
    }
    burn_ddp_22::destroy_process_group().map_err(e)?;
    println!("done yes");
    Ok(())
}

pub fn run(name: &str) -> Res<()> {
    match name {
        "toy_sgd" => equivalence::<ToyTask>(SgdConfig::new().init(), SgdConfig::new().init(), 0.1),
        "toy_adamw" => {
            equivalence::<ToyTask>(AdamWConfig::new().init(), AdamWConfig::new().init(), 0.01)
        }
        "conv_sgd" => {
            equivalence::<ConvTask>(SgdConfig::new().init(), SgdConfig::new().init(), 0.1)
        }
        "conv_adamw" => {
            equivalence::<ConvTask>(AdamWConfig::new().init(), AdamWConfig::new().init(), 0.01)
        }
        "unused" => unused_parameter(),
        "accumulation" => accumulation(),
        "different_models" => different_models(),
        "replicas" => replicas(),
        "layout_change" => layout_change(),
        "train_forever" => train_forever(),
        "one_step" => one_step(),
        "tensor_collectives" => tensor_collectives(),
        "half" => crate::half::run(),
        other => Err(format!("unknown scenario {other}")),
    }
}
