//! SyncBatchNorm across the ranks: a small CNN with a normalisation after its
//! convolution trained on N ranks equals the same CNN with Burn's BatchNorm
//! trained by one process on the combined batch (parameters and running
//! statistics); Burn's BatchNorm under DDP does not (so the comparison
//! cannot pass by accident). Also the differentiable sum it is built on, its
//! cost (one collective per layer and direction, also under `no_sync`), eval
//! without collectives, and its errors.

use super::contract::DdpModel;
use super::{e, Res};
use crate::shim::prelude::*;
use crate::shim::{self, ddp};
use burn::optim::SgdConfig;
use burn::tensor::activation::log_softmax;
use burn_ddp_testkit::numbers::{identical_across_ranks, max_relative_difference};

const STEPS: usize = 3;
const CHANNELS: usize = 4;

/// Each rank's samples per step: 1 x 128, 2 x 64, 3 x 32 (`even`); rank r
/// with 2r more (`uneven`); rank 0 with none (`empty`).
fn sizes(world: usize, layout: &str) -> Vec<usize> {
    let base = match world {
        1 => 128,
        2 => 64,
        _ => 32,
    };
    (0..world)
        .map(|r| match layout {
            "uneven" => base + 2 * r,
            "empty" if r == 0 => 0,
            _ => base,
        })
        .collect()
}

/// The cross-entropy summed over `items`, times `scale`; a sum (not a mean)
/// so that a rank without samples has a loss too (zero).
macro_rules! loss {
    ($model:expr, $items:expr, $device:expr, $scale:expr) => {{
        let (x, y) = shim::image_batch($items, $device);
        let n = $items.len();
        log_softmax($model.forward(x), 1)
            .gather(1, y.reshape([n, 1]))
            .sum()
            .mul_scalar(-$scale)
    }};
}

/// Trains on SyncBatchNorm (`layout`: see [`sizes`]) and prints what the
/// test checks: the difference from one process with Burn's BatchNorm
/// (`sync_diff`), the same for Burn's BatchNorm under DDP (`plain_diff`),
/// the bytes one step's forward and backward pass sum over the ranks, the
/// bytes of an eval pass, whether the ranks agree.
pub fn equivalence(layout: &str) -> Res<()> {
    let group = ddp::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = shim::bn_device();
    let sizes = sizes(world, layout);
    let global: usize = sizes.iter().sum();
    let start: usize = sizes[..rank].iter().sum();
    let mine = |step: usize| -> Vec<usize> {
        let from = step * global + start;
        (from..from + sizes[rank]).collect()
    };
    let everyone = |step: usize| -> Vec<usize> { (step * global..(step + 1) * global).collect() };
    // DDP averages the ranks' gradients: world / global makes every sample
    // weigh 1 / global, as in the single process.
    let scale = world as f32 / global as f32;

    let mut model = shim::SyncBnConv::new(&device).wrap(&group)?;
    let start = model.flat_params();
    let mut reference = shim::ReferenceBnConv::new(&device).load_params(&start);
    let (mut optim, mut optim_ref) = (SgdConfig::new().init(), SgdConfig::new().init());
    for step in 0..STEPS {
        let grads = reference.local_grads(loss!(
            reference,
            &everyone(step),
            &device,
            1.0 / global as f32
        ));
        reference = optim_ref.step(0.1, reference, grads);
        let grads = model.synced_grads(loss!(model, &mine(step), &device, scale))?;
        model = optim.step(0.1, model, grads);
    }
    // Settled: the last step's running-statistics update included (Burn
    // keeps it pending until `valid()`).
    let synced = model.settled_params();
    let diff = max_relative_difference(&synced, &reference.settled_params());
    println!("sync_diff {diff:e}");
    identical_across_ranks(&group, &synced, "after training")?;
    println!("replicas_identical true");

    if layout == "empty" {
        // No rank with a sample: the running statistics stay as they are.
        let before = model.settled_params();
        let nothing: &[usize] = &[];
        let _ = loss!(model, nothing, &device, scale);
        println!("all_empty_unchanged {}", model.settled_params() == before);
    }

    // One collective per layer and direction, also when the gradients stay
    // local (`no_sync` on Burn 0.21; no `sync_gradients` on 0.22).
    let before = group.collective_bytes();
    let loss = loss!(model, &mine(STEPS), &device, scale);
    let forward = group.collective_bytes() - before;
    let _ = model.local_grads(loss);
    let backward = group.collective_bytes() - before - forward;
    println!("forward_bytes {forward}");
    println!("backward_bytes {backward}");

    // Eval: the running statistics, no collective; the same on every rank.
    let before = group.collective_bytes();
    let (x, _) = shim::image_batch(&[1, 2, 3], &device);
    let outputs = model.evaluate(x);
    println!(
        "eval_collective_bytes {}",
        group.collective_bytes() - before
    );
    identical_across_ranks(&group, &outputs, "eval outputs")?;

    // Burn's BatchNorm under DDP: each rank normalises by its own batch (and
    // cannot normalise an empty one: Burn 0.21 panics, 0.22 makes NaNs).
    if layout == "empty" {
        return ddp::destroy_process_group().map_err(e);
    }
    let mut local = shim::LocalBnConv::new(&device)
        .load_params(&start)
        .wrap(&group)?;
    let mut optim = SgdConfig::new().init();
    for step in 0..STEPS {
        let grads = local.synced_grads(loss!(local, &mine(step), &device, scale))?;
        local = optim.step(0.1, local, grads);
    }
    let diff = max_relative_difference(&local.settled_params(), &reference.settled_params());
    println!("plain_diff {diff:e}");
    ddp::destroy_process_group().map_err(e)
}

/// The differentiable sum: rank r sums `x_r = [r+1, 2(r+1)]` over the ranks
/// and weighs the sum by its own `w_r = [r+1, 1]`; one process holding every
/// rank's part has the loss `sum_r (sum_q x_q) . w_r`, so each rank's `x`
/// must get `sum_r w_r` as its gradient, not its own `w_r` (what a sum
/// detached from autodiff would give).
pub fn tracked_sum() -> Res<()> {
    let group = ddp::init_process_group().map_err(e)?;
    let r = group.rank() as f32;
    let device = shim::bn_device();
    let x = shim::Trained::<1>::from_floats([r + 1.0, 2.0 * (r + 1.0)], &device).require_grad();
    let w = shim::Trained::<1>::from_floats([r + 1.0, 1.0], &device);
    let sum = ddp::collective::all_reduce_sum_tracked(&group, x.clone()).map_err(e)?;
    println!("sum {:?}", shim::floats(sum.to_data()));
    let grads = (sum * w).sum().backward();
    let grad = x.grad(&grads).ok_or("x has no gradient")?;
    println!("grad {:?}", shim::floats(grad.into_data()));
    // Without gradients, the same sum.
    let plain = shim::Trained::<1>::from_floats([r + 1.0, 2.0 * (r + 1.0)], &device);
    let sum = ddp::collective::all_reduce_sum_tracked(&group, plain).map_err(e)?;
    println!("untracked {:?}", shim::floats(sum.into_data()));
    ddp::destroy_process_group().map_err(e)
}

/// Rank 1's layer has one channel more than rank 0's. Wrapped (the usual
/// case: the layer inside a wrapped model), the layout check fails every
/// rank naming the parameter's shapes; a lone layer fails every rank at its
/// first training pass, naming its rank and the layer, instead of mixing
/// channels.
pub fn channels_differ() -> Res<()> {
    let group = ddp::init_process_group().map_err(e)?;
    let device = shim::bn_device();
    let channels = CHANNELS + group.rank();
    match ddp::wrap(shim::sync_norm(channels, &device), &group) {
        Ok(_) => return Err("wrap accepted layers of different widths".into()),
        Err(err) => println!("wrap_error {err}"),
    }
    let norm = shim::sync_norm(channels, &device);
    let x = shim::Trained::<1>::from_floats([0.5; 8], &device)
        .reshape([2, 1, 2, 2])
        .repeat_dim(1, channels);
    let _ = norm.forward(x);
    Err("the forward pass went through".into())
}

/// SyncBatchNorm in training, launched as several ranks, without
/// `init_process_group`: a clear error on every rank.
pub fn before_init() -> Res<()> {
    let device = shim::bn_device();
    let norm = shim::sync_norm(CHANNELS, &device);
    let x = shim::Trained::<1>::from_floats([0.5; 16], &device).reshape([2, CHANNELS, 2, 1]);
    let _ = norm.forward(x);
    Err("the forward pass went through".into())
}
