//! The sharded optimizer (ZeRO stage 1): N ranks stepping with it end with
//! the parameters of N ranks with the plain optimizer under DDP and of one
//! process on the combined batch, every rank identical; each rank's
//! optimizer record holds only the parameters it owns, the ranks' records
//! together hold exactly the plain one's entries; a world of one is the
//! plain optimizer bit for bit.

use super::contract::{DdpModel, LoadParts, LoadWhole, RecordSize, ShardedStep};
use super::scenarios::{start, Task};
use super::{e, Res};
use crate::shim::ddp::ProcessGroup;
use crate::shim::prelude::*;
use crate::shim::{self, ddp};
use burn_ddp_testkit::numbers::{identical_across_ranks, max_relative_difference, shards};

/// Steps: three passes over four batches per rank.
const STEPS: usize = 12;

/// How [`equivalence`] trains.
#[derive(Clone, Copy, PartialEq)]
pub enum Mode {
    /// A constant learning rate, local gradients to the sharded step.
    Plain,
    /// The learning rate decays linearly, step by step (a scheduler).
    Scheduled,
    /// The sharded step is given gradients already averaged (Burn 0.21:
    /// `Ddp<B>`'s backward outside `no_sync`; 0.22: `sync_gradients` first):
    /// the same result, at more bytes.
    PreAveraged,
}

/// Trains three copies from the same start, `STEPS` steps of 4 samples per
/// rank: the sharded optimizer on local gradients, the plain one under DDP,
/// and the plain one in one process on every rank's samples. Prints the
/// gaps (`vs_ddp`, `vs_reference`), the records' sizes and the bytes each
/// way moved.
pub fn equivalence<T: Task, S, P, R>(
    make_sharded: impl FnOnce(&ProcessGroup) -> Res<S>,
    mut plain: P,
    mut opt_ref: R,
    lr: f64,
    mode: Mode,
) -> Res<()>
where
    S: ShardedStep<T::Model>,
    P: Step<T::Model> + RecordSize,
    R: Step<T::Reference>,
{
    let group = ddp::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = shim::device();
    let (mut model, mut reference) = start::<T>(&group)?;
    let mut ddp_model = T::build(&device)
        .load_params(&model.flat_params())
        .wrap(&group)?;
    let mut sharded = make_sharded(&group)?;
    let b = 4;
    let shards = shards(world * b * 4, world);
    let (mut sharded_bytes, mut ddp_bytes) = (0, 0);
    for step in 0..STEPS {
        let at = (step % 4) * b;
        let mine = &shards[rank][at..at + b];
        let lr = match mode {
            Mode::Scheduled => lr * (1.0 - step as f64 / (2 * STEPS) as f64),
            _ => lr,
        };

        let before = group.collective_bytes();
        let loss = T::loss(&model, mine, &device);
        let grads = match mode {
            Mode::PreAveraged => model.synced_grads(loss)?,
            _ => model.local_grads(loss),
        };
        model = ShardedStep::step(&mut sharded, lr, model, grads)?;
        sharded_bytes += group.collective_bytes() - before;

        let before = group.collective_bytes();
        let grads = ddp_model.synced_grads(T::loss(&ddp_model, mine, &device))?;
        ddp_model = plain.step(lr, ddp_model, grads);
        ddp_bytes += group.collective_bytes() - before;

        let global: Vec<usize> = shards.iter().flat_map(|s| s[at..at + b].to_vec()).collect();
        let grads = reference.local_grads(T::reference_loss(&reference, &global, &device));
        reference = opt_ref.step(lr, reference, grads);
        identical_across_ranks(&group, &model.flat_params(), &format!("after step {step}"))?;
    }
    let params = model.flat_params();
    let vs_ddp = max_relative_difference(&params, &ddp_model.flat_params());
    let vs_reference = max_relative_difference(&params, &reference.flat_params());
    println!("vs_ddp {vs_ddp:e}");
    println!("vs_reference {vs_reference:e}");
    if world == 1 && params != ddp_model.flat_params() {
        return Err(format!(
            "in a world of one the sharded optimizer differs from the plain one by {vs_ddp:e}"
        ));
    }
    let owners = sharded.owners();
    let owned = owners.iter().filter(|&&owner| owner == rank).count();
    println!("owned {owned} of {}", owners.len());
    let (entries, bytes) = sharded.record_size();
    let (plain_entries, plain_bytes) = plain.record_size();
    println!("record_entries {entries}");
    println!("plain_record_entries {plain_entries}");
    println!("record_bytes {bytes}");
    println!("plain_record_bytes {plain_bytes}");
    println!("sharded_bytes {sharded_bytes}");
    println!("ddp_bytes {ddp_bytes}");
    ddp::destroy_process_group().map_err(e)
}

/// The global gradient norm [`global_clip`] clips to: below about half of
/// the conv task's step norms (0.6 to 0.9 over its 12 steps).
const MAX_GRAD_NORM: f64 = 0.7;

/// Gradients clipped to a global norm (`ShardConfig::max_grad_norm`) under
/// the sharded AdamW: equal to one process on the combined batch whose
/// gradients are scaled as PyTorch's `clip_grad_norm_` does, its norm read
/// off an SGD step of rate 1 on the reference (the parameters move by
/// exactly the gradient, then are put back). `opt_ref` is the sharded
/// one's inner optimizer, `probe` plain SGD. Prints how many steps clipped
/// and the gap (`vs_reference`).
pub fn global_clip<T: Task, S, R, Q>(
    make_sharded: impl FnOnce(&ProcessGroup, f64) -> Res<S>,
    mut opt_ref: R,
    mut probe: Q,
) -> Res<()>
where
    S: ShardedStep<T::Model>,
    R: Step<T::Reference>,
    Q: Step<T::Reference>,
{
    let group = ddp::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = shim::device();
    let (mut model, mut reference) = start::<T>(&group)?;
    let mut sharded = make_sharded(&group, MAX_GRAD_NORM)?;
    let b = 4;
    let shards = shards(world * b * 4, world);
    let (mut clipped, mut norms) = (0, Vec::new());
    for step in 0..STEPS {
        let at = (step % 4) * b;
        let loss = T::loss(&model, &shards[rank][at..at + b], &device);
        let grads = model.local_grads(loss);
        model = ShardedStep::step(&mut sharded, 0.01, model, grads)?;

        let global: Vec<usize> = shards.iter().flat_map(|s| s[at..at + b].to_vec()).collect();
        let before = reference.flat_params();
        let grads = reference.local_grads(T::reference_loss(&reference, &global, &device));
        let moved = probe.step(1.0, reference, grads);
        let after = moved.flat_params();
        let norm = before
            .iter()
            .zip(&after)
            .map(|(b, m)| f64::from(b - m).powi(2))
            .sum::<f64>()
            .sqrt();
        reference = moved.load_params(&before); // its ids, AdamW's keys, kept
        let factor = (MAX_GRAD_NORM / (norm + 1e-6)).min(1.0);
        clipped += usize::from(factor < 1.0);
        norms.push(format!("{norm:.3}"));
        let loss = T::reference_loss(&reference, &global, &device).mul_scalar(factor as f32);
        let grads = reference.local_grads(loss);
        reference = opt_ref.step(0.01, reference, grads);
        identical_across_ranks(&group, &model.flat_params(), &format!("after step {step}"))?;
    }
    let vs_reference = max_relative_difference(&model.flat_params(), &reference.flat_params());
    println!("clipped {clipped} of {STEPS}");
    println!("norms {}", norms.join(" "));
    println!("vs_reference {vs_reference:e}");
    ddp::destroy_process_group().map_err(e)
}

/// Gradients of 3 micro-batches per rank summed locally (Burn's
/// `GradientsAccumulator`), then one sharded step: equal to one process
/// stepping on all ranks' micro-batches at once, with one scatter per step.
pub fn accumulation() -> Res<()> {
    use super::scenarios::ToyTask;
    use burn::optim::GradientsAccumulator;
    let group = ddp::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = shim::device();
    let (mut model, mut reference) = start::<ToyTask>(&group)?;
    let mut sharded = shim::shard(burn::optim::AdamWConfig::new().init(), &group)?;
    let mut opt_ref = burn::optim::AdamWConfig::new().init();
    let (b, k) = (4, 3);
    let shards = shards(world * b * k * 4, world);
    for step in 0..4 {
        let mut accumulator = GradientsAccumulator::new();
        for m in 0..k {
            let at = (step * k + m) * b;
            let loss = ToyTask::loss(&model, &shards[rank][at..at + b], &device);
            accumulator.accumulate(&model, model.local_grads(loss));
        }
        model = ShardedStep::step(&mut sharded, 0.01, model, accumulator.grads())?;
        let global: Vec<usize> = shards
            .iter()
            .flat_map(|s| s[step * k * b..(step + 1) * k * b].to_vec())
            .collect();
        let loss = ToyTask::reference_loss(&reference, &global, &device).mul_scalar(k as f32);
        let grads = reference.local_grads(loss);
        reference = opt_ref.step(0.01, reference, grads);
        identical_across_ranks(&group, &model.flat_params(), &format!("after step {step}"))?;
    }
    let diff = max_relative_difference(&model.flat_params(), &reference.flat_params());
    println!("max_rel_diff {diff:e}");
    if diff > 1e-6 {
        return Err(format!(
            "accumulated sharded training differs from the big batch by {diff:e}"
        ));
    }
    ddp::destroy_process_group().map_err(e)
}

/// Samples per step in all, whatever the number of ranks (12 = 2 x 6 = 3 x 4).
const GLOBAL: usize = 12;
/// Steps before the checkpoint, and after it.
const BEFORE: usize = 4;
const AFTER: usize = 4;

/// Step `step`'s samples: `GLOBAL` of them, split evenly in rank order.
fn batch(step: usize, rank: usize, world: usize) -> Vec<usize> {
    let per_rank = GLOBAL / world;
    let from = step * GLOBAL + rank * per_rank;
    (from..from + per_rank).collect()
}

/// A checkpoint of the sharded optimizer (AdamW) taken on some ranks and
/// resumed on others. `save`: `BEFORE` steps from the usual start (written
/// to `dir/start` for the reference), then rank 0 saves the model and the
/// consolidated state in `dir`. `resume`: every rank loads the model, then
/// the state into a sharded optimizer (a plain one with `BURN_DDP_TEST_PLAIN`
/// set, in a world of one), `AFTER` more steps; the parameters must equal
/// one process trained with AdamW on the same global batches for all
/// `BEFORE + AFTER` steps (`resumed_diff`, within 1e-6). `foreign`: the
/// state loaded into a model whose record was not loaded fails the step.
/// With `BURN_DDP_TEST_PARTS=NAME`, the checkpoint is written in parts
/// (`save_parts`, into `dir/NAME`) and read back by `load_parts`: each
/// rank reads the values and only the state it owns (the plain optimizer:
/// all of it); with `BURN_DDP_TEST_BACKGROUND` too, written by a thread
/// while two more steps run (which the checkpoint must not hold).
pub fn checkpoint(phase: &str) -> Res<()> {
    use super::scenarios::ToyTask;
    use burn::optim::AdamWConfig;
    type ToyModel = <ToyTask as Task>::Model;
    let group = ddp::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    if !GLOBAL.is_multiple_of(world) {
        return Err(format!(
            "{GLOBAL} samples a step do not split over {world} ranks"
        ));
    }
    let device = shim::device();
    let dir = std::path::PathBuf::from(std::env::var("BURN_DDP_TEST_DIR").map_err(e)?);
    let start_file = dir.join("start");
    let parts_name = std::env::var("BURN_DDP_TEST_PARTS").ok();
    let in_parts = parts_name.is_some();
    let parts = dir.join(parts_name.as_deref().unwrap_or("parts"));
    const PARTS_INFO: &str = "toy, AdamW, after the first steps";
    let check_info = |info: String| match info.as_str() {
        PARTS_INFO => Ok(()),
        other => Err(format!("the checkpoint's info came back as {other:?}")),
    };
    if phase == "save" {
        let (mut model, _) = start::<ToyTask>(&group)?;
        if rank == 0 {
            let bits: Vec<String> = model
                .flat_params()
                .iter()
                .map(|v| v.to_bits().to_string())
                .collect();
            std::fs::write(&start_file, bits.join(" ")).map_err(e)?;
        }
        let mut sharded = shim::shard(AdamWConfig::new().init(), &group)?;
        for step in 0..BEFORE {
            let grads =
                model.local_grads(ToyTask::loss(&model, &batch(step, rank, world), &device));
            model = ShardedStep::step(&mut sharded, 0.01, model, grads)?;
        }
        if in_parts && std::env::var_os("BURN_DDP_TEST_BACKGROUND").is_some() {
            let save =
                ShardedStep::save_parts_in_background(&mut sharded, &model, &parts, PARTS_INFO)?;
            // Training goes on while the thread writes: steps the checkpoint
            // must not hold (it holds the state as the save began).
            for step in BEFORE..BEFORE + 2 {
                let grads =
                    model.local_grads(ToyTask::loss(&model, &batch(step, rank, world), &device));
                model = ShardedStep::step(&mut sharded, 0.01, model, grads)?;
            }
            save.finish().map_err(e)?;
        } else if in_parts {
            ShardedStep::save_parts(&mut sharded, &model, &parts, PARTS_INFO)?;
        } else {
            sharded.save(&model, &dir)?;
        }
        println!("saved");
        return ddp::destroy_process_group().map_err(e);
    }
    if phase == "foreign" {
        // The optimizer state without the model's record: its parameter ids
        // are not this model's.
        let model = ToyTask::build(&device).wrap(&group)?;
        let sharded = shim::shard(AdamWConfig::new().init(), &group)?;
        let mut sharded = LoadWhole::<ToyModel>::load_whole(sharded, &dir)?;
        let grads = model.local_grads(ToyTask::loss(&model, &batch(0, rank, world), &device));
        ShardedStep::step(&mut sharded, 0.01, model, grads)?;
        return Err("state for another model's parameters went unnoticed".into());
    }
    let model = if std::env::var_os("BURN_DDP_TEST_PLAIN").is_some() {
        let (model, mut plain) = if in_parts {
            let plain = AdamWConfig::new().init();
            let (model, plain, info) =
                LoadParts::load_parts(plain, ToyTask::build(&device), &parts)?;
            check_info(info)?;
            (model.wrap(&group)?, plain)
        } else {
            let model = shim::load_model(ToyTask::build(&device), &dir)?.wrap(&group)?;
            let plain = LoadWhole::<ToyModel>::load_whole(AdamWConfig::new().init(), &dir)?;
            (model, plain)
        };
        let mut model = model;
        for step in BEFORE..BEFORE + AFTER {
            let grads =
                model.local_grads(ToyTask::loss(&model, &batch(step, rank, world), &device));
            model = plain.step(0.01, model, grads);
        }
        model
    } else {
        let mut sharded = shim::shard(AdamWConfig::new().init(), &group)?;
        let model = if in_parts {
            let built = ToyTask::build(&device);
            let (model, info) = ShardedStep::load_parts(&mut sharded, built, &parts)?;
            check_info(info)?;
            model.wrap(&group)?
        } else {
            let model = shim::load_model(ToyTask::build(&device), &dir)?.wrap(&group)?;
            sharded = LoadWhole::<ToyModel>::load_whole(sharded, &dir)?;
            model
        };
        let mut model = model;
        for step in BEFORE..BEFORE + AFTER {
            let grads =
                model.local_grads(ToyTask::loss(&model, &batch(step, rank, world), &device));
            model = ShardedStep::step(&mut sharded, 0.01, model, grads)?;
        }
        model
    };
    let start: Vec<f32> = std::fs::read_to_string(&start_file)
        .map_err(e)?
        .split_whitespace()
        .map(|bits| bits.parse().map(f32::from_bits).map_err(e))
        .collect::<Res<_>>()?;
    let mut reference = ToyTask::reference(&device).load_params(&start);
    let mut opt_ref = AdamWConfig::new().init();
    for step in 0..BEFORE + AFTER {
        let loss = ToyTask::reference_loss(&reference, &batch(step, 0, 1), &device);
        let grads = reference.local_grads(loss);
        reference = opt_ref.step(0.01, reference, grads);
    }
    let diff = max_relative_difference(&model.flat_params(), &reference.flat_params());
    println!("resumed_diff {diff:e}");
    identical_across_ranks(&group, &model.flat_params(), "after resuming")?;
    if diff > 1e-6 {
        return Err(format!(
            "resumed on {world} rank(s), the parameters differ from one uninterrupted process by {diff:e}"
        ));
    }
    ddp::destroy_process_group().map_err(e)
}

/// One sharded step on the toy, the same model on every rank (with
/// `BURN_DDP_BACKEND=nccl` and host tensors: refused before anything moves).
pub fn one_step() -> Res<()> {
    let group = ddp::init_process_group().map_err(e)?;
    let device = shim::device();
    let model = shim::Toy::new(&device, 1);
    let mut sharded = shim::shard(burn::optim::SgdConfig::new().init(), &group)?;
    let loss = super::scenarios::ToyTask::loss(&model, &[0, 1, 2, 3], &device);
    let grads = model.local_grads(loss);
    ShardedStep::step(&mut sharded, 0.1, model, grads)?;
    println!("stepped");
    ddp::destroy_process_group().map_err(e)
}

/// Rank 1's layer is wider than rank 0's: the sharded step fails on every
/// rank, naming the parameter's shapes, instead of mixing unrelated numbers.
pub fn different_models() -> Res<()> {
    let group = ddp::init_process_group().map_err(e)?;
    let device = shim::device();
    let model = shim::Toy::new(&device, 1 + group.rank());
    let mut sharded = shim::shard(burn::optim::SgdConfig::new().init(), &group)?;
    let loss = super::scenarios::ToyTask::loss(&model, &[0, 1, 2, 3], &device);
    let grads = model.local_grads(loss);
    match ShardedStep::step(&mut sharded, 0.1, model, grads) {
        Ok(_) => Err("a sharded step over different models went through".into()),
        Err(err) => Err(err),
    }
}

/// A rank of 3 killed while the optimizer is sharded (rank 1, before step
/// 3): the survivors form the next generation and wrap the model again, but
/// the sharded optimizer cannot go on (rank 1's part of its state is lost):
/// its next step is refused, naming the fix (the newest snapshot), on every
/// survivor. Exits with that error.
pub fn lost_shard<T: Task, S>(make_sharded: impl FnOnce(&ProcessGroup) -> Res<S>) -> Res<()>
where
    S: ShardedStep<T::Model>,
{
    let mut group = ddp::init_process_group().map_err(e)?;
    let device = shim::device();
    let (mut model, _) = start::<T>(&group)?;
    let mut sharded = make_sharded(&group)?;
    for step in 0..6 {
        if step == 3 && group.rank() == 1 {
            println!("ready");
            std::io::Write::flush(&mut std::io::stdout()).map_err(e)?;
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        let mine: Vec<usize> = (0..4).map(|i| 100 * step + 10 * group.rank() + i).collect();
        let grads = model.local_grads(T::loss(&model, &mine, &device));
        match ShardedStep::step(&mut sharded, 0.01, model, grads) {
            Ok(next) => model = next,
            Err(err) if group.generation() == 0 => {
                eprintln!("step {step}: {err}");
                group = ddp::reform_process_group(std::time::Duration::from_secs(10)).map_err(e)?;
                // The failed step took the model: any will do to show the refusal.
                model = T::build(&device).wrap(&group)?;
                println!(
                    "generation 1 rank {} of {}",
                    group.rank(),
                    group.world_size()
                );
            }
            Err(err) => return Err(err),
        }
    }
    Err("the sharded optimizer went on without a lost part of its state".into())
}
