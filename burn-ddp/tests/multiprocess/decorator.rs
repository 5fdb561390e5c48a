//! The `Ddp<B>` decorator's own scenarios (Burn 0.21 only): a layout change
//! of a model that was never wrapped, the parameter registry's size over
//! 2,000 steps, and a checkpoint writer (burn-ddp's record files) to kill.

use crate::shared::scenarios::{start, Task, ToyTask};
use crate::shared::{e, Res};
use crate::shim::{self, Wrapped};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::Tensor;
use burn_ddp_testkit::numbers::shards;

/// A model that was never wrapped is synchronised with every other tensor
/// of the default group (the process-wide behaviour of a program that does
/// not wrap): after two steps rank 1 alone marks an extra tensor
/// `require_grad` (a new parameter to `Ddp`), and the next backward must fail
/// on every rank, not sum misaligned buckets. (A wrapped model ignores such a
/// tensor: the GAN scenario.)
pub fn layout_changes_on_one_rank() -> Res<()> {
    let group = burn_ddp::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = shim::device();
    let mut model = ToyTask::build(&device);
    let mut opt = SgdConfig::new().init();
    let shards = shards(world * 8, world);
    let mut extra = None;
    for step in 0..3 {
        if step == 2 && rank == 1 {
            extra = Some(Tensor::<Wrapped, 1>::zeros([7], &device).require_grad());
        }
        let loss = ToyTask::loss(&model, &shards[rank][2 * step..2 * step + 2], &device);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = opt.step(0.1, model, grads);
    }
    drop(extra);
    Err("a layout change on one rank should have failed the backward".into())
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
pub fn memory() -> Res<()> {
    let group = burn_ddp::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = shim::device();
    let (mut model, _) = start::<ToyTask>(&group)?;
    let mut opt = SgdConfig::new().init();
    let b = 2;
    let shards = shards(world * b * 2000, world);
    let (mut tracked_early, mut rss_early) = (0, 0);
    for step in 0..2000 {
        let loss = ToyTask::loss(&model, &shards[rank][step * b..(step + 1) * b], &device);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = opt.step(0.01, model, grads);
        if step == 200 {
            tracked_early = burn_ddp::autodiff::tracked_parameters();
            rss_early = resident_kib();
        }
    }
    let tracked = burn_ddp::autodiff::tracked_parameters();
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

/// Saves checkpoints of a 1024x1024 linear layer at `CHECKPOINT` until killed.
pub fn save_forever() -> Res<()> {
    use burn::backend::NdArray;
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

/// A SyncBatchNorm training on `Autodiff<Flex>`, whose tracked sum no one
/// registered (no `Ddp<..>`, no `enable_sync_batch_norm`): must fail.
pub fn sync_batch_norm_unregistered() -> Res<()> {
    type Plain = burn::backend::Autodiff<burn::backend::Flex>;
    burn_ddp::init_process_group().map_err(e)?;
    let device = Default::default();
    let norm = burn_ddp::sync_batch_norm::sync_batch_norm::<Plain>(
        &burn::nn::BatchNormConfig::new(3),
        &device,
    );
    let _ = norm.forward(Tensor::<Plain, 3>::ones([2, 3, 4], &device));
    Err("the forward pass went through".into())
}

/// SyncBatchNorm under gradient checkpointing (`BalancedCheckpointing`
/// recomputes memory-bound operations in the backward pass; the sum over the
/// ranks is compute-bound, so it is never run again out of step): the same
/// input gradient as without, and the same number of collectives.
pub fn sync_batch_norm_checkpointing() -> Res<()> {
    use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
    use burn::backend::{Autodiff, Flex};

    // A plain autodiff backend (its sum registered by the program): the input
    // is a leaf that requires gradients, which `Ddp<..>` would count as a
    // parameter outside every wrapped model.
    fn input_gradient<B: crate::shim::ddp::autodiff::AutodiffCollectives>(
        group: &burn_ddp::ProcessGroup,
    ) -> Res<(Vec<f32>, u64)> {
        burn_ddp::autodiff::enable_sync_batch_norm::<B>();
        let device = Default::default();
        let norm = burn_ddp::sync_batch_norm::sync_batch_norm::<B>(
            &burn::nn::BatchNormConfig::new(3),
            &device,
        );
        let r = group.rank() as f32;
        let values: Vec<f32> = (0..24).map(|i| ((i * 5) % 7) as f32 + r).collect();
        let x = Tensor::<B, 1>::from_floats(values.as_slice(), &device)
            .reshape([2, 3, 4])
            .require_grad();
        let before = group.collective_bytes();
        // Memory-bound work on both sides of the norm, which the balanced
        // strategy recomputes.
        let y = norm.forward(x.clone().exp().div_scalar(10.0)).tanh();
        let grads = (y.clone() * y).sum().backward();
        let grad = x.grad(&grads).ok_or("no gradient")?;
        Ok((
            grad.into_data()
                .to_vec::<f32>()
                .map_err(|e| format!("{e:?}"))?,
            group.collective_bytes() - before,
        ))
    }

    let group = burn_ddp::init_process_group().map_err(e)?;
    let (plain, plain_bytes) = input_gradient::<Autodiff<Flex>>(&group)?;
    let (balanced, balanced_bytes) =
        input_gradient::<Autodiff<Flex, BalancedCheckpointing>>(&group)?;
    println!("same_gradient {}", plain == balanced);
    println!("same_bytes {}", plain_bytes == balanced_bytes);
    burn_ddp::destroy_process_group().map_err(e)
}
