//! Buckets sent during backward (`overlap_backward`, the default) against the
//! same model wrapped without it, trained side by side on the same batches
//! in one process: after every step both hold the same parameters, bit for
//! bit, and only the overlapped one sent buckets before backward returned.
//! Models: a small CNN, a layer used twice in one forward, a parameter no
//! forward uses, two micro-batches accumulated under `no_sync`, and the CNN
//! under gradient checkpointing.

use crate::shared::{e, Res};
use crate::shim::flat_params;
use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::{Autodiff, NdArray};
use burn::module::{AutodiffModule, Module};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{GradientsAccumulator, GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{Distribution, Tensor};
use burn_ddp::config::Overlap;
use burn_ddp::{Ddp, DdpConfig, ProcessGroup};

type Wrapped = Ddp<Autodiff<NdArray>>;
type Checkpointed = Ddp<Autodiff<NdArray, BalancedCheckpointing>>;

#[derive(Module, Debug)]
pub struct Net<B: Backend> {
    conv1: Conv2d<B>,
    conv2: Conv2d<B>,
    pool: MaxPool2d,
    /// Applied twice in `Shape::Shared`.
    fc1: Linear<B>,
    fc2: Linear<B>,
    /// Never used in a forward pass.
    unused: Linear<B>,
    relu: Relu,
}

/// Which forward pass (and which model wiring) a run uses.
#[derive(Clone, Copy, Debug)]
enum Wiring {
    /// conv, conv, pool, fc1, fc2.
    Plain,
    /// fc1 applied twice (weight sharing).
    Shared,
}

impl<B: Backend> Net<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            conv1: Conv2dConfig::new([1, 4], [3, 3]).init(device),
            conv2: Conv2dConfig::new([4, 6], [3, 3]).init(device),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            fc1: LinearConfig::new(6 * 2 * 2, 24).init(device),
            fc2: LinearConfig::new(24, 3).init(device),
            unused: LinearConfig::new(3, 3).init(device),
            relu: Relu::new(),
        }
    }

    fn forward(&self, x: Tensor<B, 4>, wiring: Wiring) -> Tensor<B, 2> {
        let x = self.relu.forward(self.conv1.forward(x));
        let x = self.relu.forward(self.conv2.forward(x));
        let x = self.pool.forward(x).flatten(1, 3);
        let x = self.fc1.forward(x).tanh();
        let x = match wiring {
            Wiring::Plain => x,
            // fc1 again: 24 -> 24 needs a square layer, so through its first
            // 24 inputs (a slice of the same weight, a second use of it).
            Wiring::Shared => {
                let weight = self.fc1.weight.val().slice([0..24, 0..24]);
                x.clone().matmul(weight).tanh() + x
            }
        };
        self.fc2.forward(x)
    }
}

/// Small buckets, so the CNN's gradients fill several.
fn config(overlap: Overlap) -> DdpConfig {
    DdpConfig::new()
        .with_bucket_cap_mb(0.0005)
        .with_first_bucket_cap_mb(0.0001)
        .with_overlap_backward(overlap)
}

fn batch<B: Backend>(rank: usize, step: usize, device: &B::Device) -> (Tensor<B, 4>, Tensor<B, 2>) {
    B::seed(device, (1000 * step + rank) as u64);
    let x = Tensor::random([5, 1, 8, 8], Distribution::Normal(0.0, 1.0), device);
    let y = Tensor::random([5, 3], Distribution::Normal(0.0, 1.0), device);
    (x, y)
}

fn loss<B: Backend>(
    model: &Net<B>,
    x: Tensor<B, 4>,
    y: Tensor<B, 2>,
    wiring: Wiring,
) -> Tensor<B, 1> {
    (model.forward(x, wiring) - y).powi_scalar(2).mean()
}

/// One step of each model on the same batches: `micro` micro-batches, all
/// but the last under `no_sync`, accumulated.
fn step<B: AutodiffBackend>(
    model: Net<B>,
    rank: usize,
    step: usize,
    (wiring, micro): (Wiring, usize),
) -> Net<B>
where
    Net<B>: AutodiffModule<B>,
{
    let device = Default::default();
    let mut accumulator = GradientsAccumulator::new();
    for m in 0..micro {
        let (x, y) = batch::<B>(rank, step * micro + m, &device);
        let loss = loss(&model, x, y, wiring);
        let grads = if m + 1 < micro {
            let _local = burn_ddp::no_sync();
            loss.backward()
        } else {
            loss.backward()
        };
        accumulator.accumulate(&model, GradientsParams::from_grads(grads, &model));
    }
    SgdConfig::new()
        .init()
        .step(0.05, model, accumulator.grads())
}

/// Trains the model overlapped and not, side by side; `Err` on the first
/// step where they differ, or if nothing was sent during backward.
fn side_by_side<B: AutodiffBackend>(group: &ProcessGroup, run: (Wiring, usize)) -> Res<()>
where
    Net<B>: AutodiffModule<B>,
{
    let device = Default::default();
    // Two models of the same values (their own parameter ids: two scopes).
    let new = || {
        B::seed(&device, 7);
        Net::<B>::new(&device)
    };
    let mut overlapped = config(Overlap::Always).wrap(new(), group).map_err(e)?;
    let mut reference = config(Overlap::Never).wrap(new(), group).map_err(e)?;
    let rank = group.rank();
    for i in 0..6 {
        overlapped = step(overlapped, rank, i, run);
        reference = step(reference, rank, i, run);
        let (a, b) = (flat_params(&overlapped), flat_params(&reference));
        if a.iter()
            .map(|v| v.to_bits())
            .ne(b.iter().map(|v| v.to_bits()))
        {
            let first = a
                .iter()
                .zip(&b)
                .position(|(x, y)| x.to_bits() != y.to_bits());
            return Err(format!(
                "{run:?}, step {i}: parameters differ first at {first:?}"
            ));
        }
    }
    let early = burn_ddp::sync::sync_stats_of(&overlapped).ok_or("no stats")?;
    let late = burn_ddp::sync::sync_stats_of(&reference).ok_or("no stats")?;
    if early.early_buckets == 0 || late.early_buckets != 0 || early.buckets != late.buckets {
        return Err(format!(
            "{run:?}: {} of {} buckets sent during backward overlapped, {} of {} without",
            early.early_buckets, early.buckets, late.early_buckets, late.buckets
        ));
    }
    println!(
        "{run:?}: equal over 6 steps; {} of {} buckets sent during backward",
        early.early_buckets, early.buckets
    );
    Ok(())
}

/// Rank `DIE_AT_STEP`'s process exits before that step's backward, while
/// the others' first bucket is already on its way during theirs: they must
/// fail within the timeout, naming it, not hang.
pub fn die_mid_overlap() -> Res<()> {
    let group = burn_ddp::init_process_group().map_err(e)?;
    let die_at: Option<usize> = std::env::var("DIE_AT_STEP")
        .ok()
        .and_then(|v| v.parse().ok());
    let device = Default::default();
    Wrapped::seed(&device, 7);
    let mut model = config(Overlap::Always)
        .wrap(Net::<Wrapped>::new(&device), &group)
        .map_err(e)?;
    for i in 0..8 {
        if die_at == Some(i) {
            std::process::exit(7);
        }
        model = step(model, group.rank(), i, (Wiring::Plain, 1));
    }
    Err("the steps with a dead peer should have failed".into())
}

/// The default setting (`AcrossMachines`) on one machine, with whatever
/// `BURN_DDP_OVERLAP` the test set: trains 4 steps and prints how many
/// buckets left during backward; a bad value fails `wrap`.
pub fn by_variable() -> Res<()> {
    let group = burn_ddp::init_process_group().map_err(e)?;
    let device = Default::default();
    Wrapped::seed(&device, 7);
    let mut model = config(Overlap::AcrossMachines)
        .wrap(Net::<Wrapped>::new(&device), &group)
        .map_err(e)?;
    for i in 0..4 {
        model = step(model, group.rank(), i, (Wiring::Plain, 1));
    }
    let stats = burn_ddp::sync::sync_stats_of(&model).ok_or("no stats")?;
    println!(
        "early buckets: {} of {}",
        stats.early_buckets, stats.buckets
    );
    burn_ddp::destroy_process_group().map_err(e)
}

/// Every model of this file, overlapped and not.
pub fn run() -> Res<()> {
    let group = burn_ddp::init_process_group().map_err(e)?;
    side_by_side::<Wrapped>(&group, (Wiring::Plain, 1))?;
    side_by_side::<Wrapped>(&group, (Wiring::Shared, 1))?;
    side_by_side::<Wrapped>(&group, (Wiring::Plain, 2))?;
    side_by_side::<Checkpointed>(&group, (Wiring::Plain, 1))?;
    burn_ddp::destroy_process_group().map_err(e)
}
