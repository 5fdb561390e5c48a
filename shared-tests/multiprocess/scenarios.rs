//! Training on every rank against a plain single-process reference trained,
//! in the same process, on the union of all ranks' batches; a parameter
//! unused on one rank; accumulated micro-batches; models and replicas that
//! differ between ranks; the collective backend for CPU tensors.

use super::contract::DdpModel;
use super::{e, Res};
use crate::shim::ddp::collective::ReduceOp;
use crate::shim::ddp::ProcessGroup;
use crate::shim::prelude::*;
use crate::shim::{self, ddp, Device};
use burn::nn::loss::{CrossEntropyLossConfig, MseLoss, Reduction};
use burn::optim::{GradientsAccumulator, SgdConfig};
use burn_ddp_testkit::numbers::{
    identical_across_ranks as check_identical_across_ranks, max_relative_difference, shards,
};

/// A model and how a batch of item indices becomes a loss, for the model the
/// ranks train and for its single-process reference (Burn 0.21's models name
/// their backend: two types; Burn 0.22's one).
pub trait Task {
    type Model: DdpModel<Loss = shim::Loss>;
    type Reference: DdpModel<Loss = shim::ReferenceLoss>;
    fn build(device: &Device) -> Self::Model;
    fn reference(device: &Device) -> Self::Reference;
    fn loss(model: &Self::Model, items: &[usize], device: &Device) -> shim::Loss;
    fn reference_loss(
        model: &Self::Reference,
        items: &[usize],
        device: &Device,
    ) -> shim::ReferenceLoss;
}

/// The tutorial's ToyModel (one Linear(10, 1)) on a regression.
pub struct ToyTask;

impl Task for ToyTask {
    type Model = shim::Toy;
    type Reference = shim::ReferenceToy;
    fn build(device: &Device) -> shim::Toy {
        shim::Toy::new(device, 1)
    }
    fn reference(device: &Device) -> shim::ReferenceToy {
        shim::ReferenceToy::new(device, 1)
    }
    fn loss(model: &shim::Toy, items: &[usize], device: &Device) -> shim::Loss {
        let (x, y) = shim::toy_batch(items, device);
        MseLoss::new().forward(model.forward(x), y, Reduction::Mean)
    }
    fn reference_loss(
        model: &shim::ReferenceToy,
        items: &[usize],
        device: &Device,
    ) -> shim::ReferenceLoss {
        let (x, y) = shim::toy_batch(items, device);
        MseLoss::new().forward(model.forward(x), y, Reduction::Mean)
    }
}

/// A small conv + linear classifier on 1x8x8 images.
pub struct ConvTask;

impl Task for ConvTask {
    type Model = shim::SmallConv;
    type Reference = shim::ReferenceSmallConv;
    fn build(device: &Device) -> shim::SmallConv {
        shim::SmallConv::new(device)
    }
    fn reference(device: &Device) -> shim::ReferenceSmallConv {
        shim::ReferenceSmallConv::new(device)
    }
    fn loss(model: &shim::SmallConv, items: &[usize], device: &Device) -> shim::Loss {
        let (x, y) = shim::image_batch(items, device);
        CrossEntropyLossConfig::new()
            .init(device)
            .forward(model.forward(x), y)
    }
    fn reference_loss(
        model: &shim::ReferenceSmallConv,
        items: &[usize],
        device: &Device,
    ) -> shim::ReferenceLoss {
        let (x, y) = shim::image_batch(items, device);
        CrossEntropyLossConfig::new()
            .init(device)
            .forward(model.forward(x), y)
    }
}

/// A model wrapped from per-rank seeds, and the reference with its start.
pub fn start<T: Task>(group: &ProcessGroup) -> Res<(T::Model, T::Reference)> {
    let device = shim::device();
    // Deliberately different seeds: wrapping must make the replicas identical.
    shim::seed(&device, 1000 + group.rank() as u64);
    let model = T::build(&device);
    let own = model.flat_params();
    if group.world_size() > 1 && check_identical_across_ranks(group, &own, "before wrap").is_ok() {
        return Err(
            "differently seeded replicas started identical; the test proves nothing".into(),
        );
    }
    let model = model.wrap(group)?;
    let wrapped = model.flat_params();
    check_identical_across_ranks(group, &wrapped, "after wrap")?;
    // The reference is a separate model (its own parameter ids), never wrapped.
    let reference = T::reference(&device).load_params(&wrapped);
    Ok((model, reference))
}

/// 10 steps (batch b per rank) against one process with batch N*b.
pub fn equivalence<T: Task, O1, O2>(mut opt: O1, mut opt_ref: O2, lr: f64) -> Res<()>
where
    O1: Step<T::Model>,
    O2: Step<T::Reference>,
{
    let group = ddp::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = shim::device();
    let (mut model, mut reference) = start::<T>(&group)?;
    let b = 4;
    let shards = shards(world * b * 10 + 1, world);
    for step in 0..10 {
        let mine = &shards[rank][step * b..(step + 1) * b];
        let grads = model.synced_grads(T::loss(&model, mine, &device))?;
        model = opt.step(lr, model, grads);

        let global: Vec<usize> = shards
            .iter()
            .flat_map(|s| s[step * b..(step + 1) * b].to_vec())
            .collect();
        let loss = T::reference_loss(&reference, &global, &device);
        let grads = reference.local_grads(loss);
        reference = opt_ref.step(lr, reference, grads);

        check_identical_across_ranks(&group, &model.flat_params(), &format!("after step {step}"))?;
    }
    let diff = max_relative_difference(&model.flat_params(), &reference.flat_params());
    println!("max_rel_diff {diff:e}");
    if diff > 1e-5 {
        return Err(format!(
            "the ranks and the single-process reference differ by {diff:e} (relative)"
        ));
    }
    // One synchronisation per step, covering every parameter byte: in the
    // session's totals and by the model's own reducer.
    let param_bytes = 4 * model.flat_params().len() as u64;
    let own = model.sync_stats().ok_or("no stats for the model")?;
    for stats in [ddp::sync::sync_stats(), own] {
        if stats.syncs != 10 || stats.bytes != 10 * param_bytes || stats.buckets < 10 {
            return Err(format!(
                "10 synchronised steps of {param_bytes} bytes, but the stats say {stats:?}"
            ));
        }
    }
    ddp::destroy_process_group().map_err(e)
}

/// Uneven inputs (`data::Join`): 3 ranks with 10, 7 and 0 batches of 4
/// (rank 1's last batch holds 2). Every rank takes 10 steps and the loop
/// ends on all of them together; a rank whose batches have run out steps
/// in shadow. Every replica is identical after every step, and the result
/// equals one process trained on the union of each step's batches (1e-5).
pub fn uneven<T: Task, O1, O2>(mut opt: O1, mut opt_ref: O2, lr: f64) -> Res<()>
where
    O1: Step<T::Model>,
    O2: Step<T::Reference>,
{
    let group = ddp::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    if world != 3 {
        return Err("the uneven-inputs scenario is written for exactly 3 ranks".into());
    }
    let device = shim::device();
    let (mut model, mut reference) = start::<T>(&group)?;
    let batches_of = |r: usize| -> Vec<Vec<usize>> {
        let sizes: Vec<usize> = match r {
            0 => vec![4; 10],
            1 => [vec![4; 6], vec![2]].concat(),
            _ => Vec::new(),
        };
        let mut next = 100 * r;
        sizes
            .into_iter()
            .map(|n| {
                next += n;
                (next - n..next).collect()
            })
            .collect()
    };
    let mut join = ddp::data::Join::new(&group, batches_of(rank).into_iter(), |b: &Vec<usize>| {
        b.len()
    })
    .with_shadow(vec![0, 1, 2, 3]);
    let mut steps = 0;
    while let Some(step) = join.next_step().map_err(e)? {
        let loss = T::loss(&model, &step.batch, &device).mul_scalar(step.loss_scale);
        let grads = model.synced_grads(loss)?;
        model = opt.step(lr, model, grads);

        let union: Vec<usize> = (0..world)
            .flat_map(|r| batches_of(r).get(steps).cloned().unwrap_or_default())
            .collect();
        let grads = reference.local_grads(T::reference_loss(&reference, &union, &device));
        reference = opt_ref.step(lr, reference, grads);
        check_identical_across_ranks(&group, &model.flat_params(), &format!("after step {steps}"))?;
        steps += 1;
    }
    if steps != 10 {
        return Err(format!(
            "the loop took {steps} steps, not the longest rank's 10"
        ));
    }
    let diff = max_relative_difference(&model.flat_params(), &reference.flat_params());
    println!("uneven_steps {steps}");
    println!("max_rel_diff {diff:e}");
    if diff > 1e-5 {
        return Err(format!(
            "training on uneven inputs differs from one process on each step's union by {diff:e}"
        ));
    }
    ddp::destroy_process_group().map_err(e)
}

/// Per-step recovery: 10 steps, each on a global batch of 12 items split
/// among the ranks there (the loss scaled so the average is the global
/// batch's mean); rank `SURVIVE_VICTIM` prints `ready` before step
/// `SURVIVE_STEP` and is SIGKILLed by the driver. The survivors get the
/// failure as an error, form the next generation
/// (`reform_process_group`), wrap the model again and redo the step on
/// the same global batch: every replica identical after every step, and
/// the result equal to one process trained on the 10 global batches (1e-5).
pub fn survive<T: Task, O1, O2>(mut opt: O1, mut opt_ref: O2, lr: f64) -> Res<()>
where
    O1: Step<T::Model>,
    O2: Step<T::Reference>,
{
    let env_usize = |name: &str| -> Res<usize> {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("{name} unset"))
    };
    let (victim, die_at) = (env_usize("SURVIVE_VICTIM")?, env_usize("SURVIVE_STEP")?);
    let mut group = ddp::init_process_group().map_err(e)?;
    let device = shim::device();
    let (mut model, mut reference) = start::<T>(&group)?;
    const GLOBAL: usize = 12;
    let mut step = 0;
    let mut failed_at = None;
    while step < 10 {
        if step == die_at && group.generation() == 0 && group.rank() == victim {
            println!("ready");
            std::io::Write::flush(&mut std::io::stdout()).map_err(e)?;
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        let (rank, world) = (group.rank(), group.world_size());
        // This rank's share of the step's global batch, whatever the world.
        let (from, to) = (GLOBAL * rank / world, GLOBAL * (rank + 1) / world);
        let mine: Vec<usize> = (step * GLOBAL + from..step * GLOBAL + to).collect();
        let scale = (mine.len() * world) as f32 / GLOBAL as f32;
        let started = std::time::Instant::now();
        let loss = T::loss(&model, &mine, &device).mul_scalar(scale);
        match model.try_synced_grads(loss) {
            Ok(grads) => {
                model = opt.step(lr, model, grads);
                let global: Vec<usize> = (step * GLOBAL..(step + 1) * GLOBAL).collect();
                let loss = T::reference_loss(&reference, &global, &device);
                let grads = reference.local_grads(loss);
                reference = opt_ref.step(lr, reference, grads);
                check_identical_across_ranks(
                    &group,
                    &model.flat_params(),
                    &format!("after step {step}"),
                )?;
                if let Some(at) = failed_at.take() {
                    let at: std::time::Instant = at;
                    println!("recovered_in_ms {}", at.elapsed().as_millis());
                }
                step += 1;
            }
            Err(err) => {
                eprintln!("step {step}: {err}");
                failed_at.get_or_insert(started);
                group = ddp::reform_process_group(std::time::Duration::from_secs(10)).map_err(e)?;
                ddp::recovery::agree_on_progress(&group, step as u64).map_err(e)?;
                model = model.wrap(&group)?;
                println!(
                    "generation {} rank {} of {}",
                    group.generation(),
                    group.rank(),
                    group.world_size()
                );
            }
        }
    }
    let diff = max_relative_difference(&model.flat_params(), &reference.flat_params());
    println!("steps {step} world {}", group.world_size());
    println!("max_rel_diff {diff:e}");
    if diff > 1e-5 {
        return Err(format!(
            "after recovering, the ranks differ from one process on the same global batches by \
             {diff:e}"
        ));
    }
    ddp::destroy_process_group().map_err(e)
}

/// Rank 0 trains head A, rank 1 head B: each head's gradient is missing on
/// one rank and must count as zero there.
pub fn unused_parameter() -> Res<()> {
    let group = ddp::init_process_group().map_err(e)?;
    let rank = group.rank();
    if group.world_size() != 2 {
        return Err("the unused-parameter scenario is written for exactly 2 ranks".into());
    }
    let device = shim::device();
    shim::seed(&device, 50 + rank as u64);
    let mut model = shim::TwoHeads::new(&device).wrap(&group)?;
    let mut reference = shim::ReferenceTwoHeads::new(&device).load_params(&model.flat_params());
    let (mut opt, mut opt_ref) = (SgdConfig::new().init(), SgdConfig::new().init());
    let b = 4;
    for step in 0..5 {
        let items = |r: usize| {
            (0..b)
                .map(|i| 100 * step + 10 * r + i)
                .collect::<Vec<usize>>()
        };
        let (x, y) = shim::toy_batch(&items(rank), &device);
        let loss = MseLoss::new().forward(model.forward(x, rank == 1), y, Reduction::Mean);
        let grads = model.synced_grads(loss)?;
        model = opt.step(0.1, model, grads);

        let (x0, y0) = shim::toy_batch(&items(0), &device);
        let (x1, y1) = shim::toy_batch(&items(1), &device);
        let l0 = MseLoss::new().forward(reference.forward(x0, false), y0, Reduction::Mean);
        let l1 = MseLoss::new().forward(reference.forward(x1, true), y1, Reduction::Mean);
        let grads = reference.local_grads((l0 + l1).div_scalar(2.0));
        reference = opt_ref.step(0.1, reference, grads);
        check_identical_across_ranks(&group, &model.flat_params(), &format!("after step {step}"))?;
    }
    let diff = max_relative_difference(&model.flat_params(), &reference.flat_params());
    println!("max_rel_diff {diff:e}");
    if diff > 1e-5 {
        return Err(format!(
            "unused-parameter training differs from the reference by {diff:e}"
        ));
    }
    ddp::destroy_process_group().map_err(e)
}

/// k micro-batches with local gradients, accumulated (Burn's
/// `GradientsAccumulator`), then averaged once with `sync_gradients`: equal
/// to one step on the whole big batch, one synchronisation a step.
pub fn accumulation() -> Res<()> {
    let group = ddp::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = shim::device();
    let (mut model, mut reference) = start::<ToyTask>(&group)?;
    let (mut opt, mut opt_ref) = (SgdConfig::new().init(), SgdConfig::new().init());
    let (b, k) = (4, 3);
    let shards = shards(world * b * k * 4, world);
    for step in 0..4 {
        let mut accumulator = GradientsAccumulator::new();
        for m in 0..k {
            let at = (step * k + m) * b;
            let loss = ToyTask::loss(&model, &shards[rank][at..at + b], &device);
            accumulator.accumulate(&model, model.local_grads(loss));
        }
        let grads = ddp::sync::sync_gradients(&model, accumulator.grads()).map_err(e)?;
        model = opt.step(0.05, model, grads);

        let global: Vec<usize> = shards
            .iter()
            .flat_map(|s| s[step * k * b..(step + 1) * k * b].to_vec())
            .collect();
        let loss = ToyTask::reference_loss(&reference, &global, &device).mul_scalar(k as f32);
        let grads = reference.local_grads(loss);
        reference = opt_ref.step(0.05, reference, grads);
        check_identical_across_ranks(&group, &model.flat_params(), &format!("after step {step}"))?;
    }
    let diff = max_relative_difference(&model.flat_params(), &reference.flat_params());
    println!("max_rel_diff {diff:e}");
    if diff > 1e-5 {
        return Err(format!(
            "accumulated training differs from the big batch by {diff:e}"
        ));
    }
    let syncs = model.sync_stats().map(|s| s.syncs);
    if syncs != Some(4) {
        return Err(format!(
            "4 steps of {k} micro-batches synchronised {syncs:?} times"
        ));
    }
    ddp::destroy_process_group().map_err(e)
}

/// Rank 1 builds a wider layer than rank 0: wrapping must fail on every rank.
pub fn different_models() -> Res<()> {
    let group = ddp::init_process_group().map_err(e)?;
    let model = shim::Toy::new(&shim::device(), 1 + group.rank());
    match model.wrap(&group) {
        Ok(_) => Err("wrapping different models should fail".into()),
        Err(err) => Err(err),
    }
}

/// Replicas started from per-rank seeds, wrapped and trained in step, are
/// identical (`compared N`). Then the last rank takes one step alone (on a
/// copy) and the check fails on every rank naming a trained parameter
/// (`replica_error_trained ...`); and every rank freezes the bias, the last
/// rank alone shifting it, and the check names a buffer
/// (`replica_error_buffer ...`).
pub fn replicas() -> Res<()> {
    let group = ddp::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = shim::device();
    let (mut model, _) = start::<ToyTask>(&group)?;
    let mut opt = SgdConfig::new().init();
    let shards = shards(world * 8, world);
    for step in 0..3 {
        let loss = ToyTask::loss(&model, &shards[rank][2 * step..2 * step + 2], &device);
        let grads = model.synced_grads(loss)?;
        model = opt.step(0.1, model, grads);
    }
    let compared = ddp::replicas::check_replicas(&model, &group).map_err(e)?;
    println!("compared {compared}");

    let alone = if rank == world - 1 {
        let loss = ToyTask::loss(&model, &shards[rank][6..8], &device);
        let grads = model.local_grads(loss);
        opt.step(0.1, model.clone(), grads)
    } else {
        model.clone()
    };
    match ddp::replicas::check_replicas(&alone, &group) {
        Ok(_) => return Err("a rank that stepped alone went unnoticed".into()),
        Err(err) => println!("replica_error_trained {err}"),
    }

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
    match ddp::replicas::check_replicas(&model, &group) {
        Ok(_) => return Err("a rank with another buffer went unnoticed".into()),
        Err(err) => println!("replica_error_buffer {err}"),
    }
    ddp::destroy_process_group().map_err(e)
}

/// One tensor collective and one synchronised backward pass, reporting what
/// each did (for the `BURN_DDP_BACKEND` cases).
pub fn one_step() -> Res<()> {
    let group = ddp::init_process_group().map_err(e)?;
    let device = shim::device();
    let ones = shim::Tensor::<1>::ones([3], &device);
    match ddp::collective::all_reduce(&group, ones, ReduceOp::Sum) {
        Ok(sum) => println!("tensor_sum {:?}", shim::floats(sum.into_data())),
        Err(err) => println!("tensor_error {err}"),
    }
    let model = ToyTask::build(&device).wrap(&group)?;
    let loss = ToyTask::loss(&model, &[0, 1, 2, 3], &device);
    model.synced_grads(loss)?;
    println!("stepped {}", ddp::sync::sync_stats().buckets);
    ddp::destroy_process_group().map_err(e)
}
