//! SyncBatchNorm: N ranks with batch b end with the parameters and running
//! statistics of one process with batch N·b and Burn's BatchNorm (a linear
//! layer before the norm, so the input gradient matters too); with Burn's
//! BatchNorm under DDP instead, the same comparison fails.

use crate::shared::{e, Res};
use burn::backend::{Autodiff, NdArray};
use burn::module::{AutodiffModule, Module};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::Tensor;
use burn_ddp::{Ddp, SyncBatchNorm};

type Plain = Autodiff<NdArray>;
type Wrapped = Ddp<Autodiff<NdArray>>;

const PER_RANK: usize = 4;
const STEPS: usize = 5;

/// A normalisation layer: Burn's or ours.
pub trait Norm<B: Backend>: Module<B> + burn::module::ModuleDisplay + Sized {
    fn create(device: &B::Device) -> Self;
    fn apply(&self, x: Tensor<B, 3>) -> Tensor<B, 3>;
    fn running_statistics(&self) -> Vec<f32>;
}

fn floats<B: Backend>(t: Tensor<B, 1>) -> Vec<f32> {
    t.to_data().convert::<f32>().to_vec::<f32>().unwrap()
}

impl<B: Backend> Norm<B> for BatchNorm<B> {
    fn create(device: &B::Device) -> Self {
        BatchNormConfig::new(3).init(device)
    }
    fn apply(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.forward(x)
    }
    fn running_statistics(&self) -> Vec<f32> {
        let mut out = floats(self.running_mean.value());
        out.extend(floats(self.running_var.value()));
        out
    }
}

impl<B: Backend> Norm<B> for SyncBatchNorm<B> {
    fn create(device: &B::Device) -> Self {
        burn_ddp::sync_batch_norm(&BatchNormConfig::new(3), device)
    }
    fn apply(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        self.forward(x)
    }
    fn running_statistics(&self) -> Vec<f32> {
        let mut out = floats(self.running_mean.value());
        out.extend(floats(self.running_var.value()));
        out
    }
}

#[derive(Module, Debug)]
pub struct Net<B: Backend, N> {
    first: Linear<B>,
    norm: N,
    last: Linear<B>,
}

impl<B: Backend, N: Norm<B>> Net<B, N> {
    fn new(device: &B::Device) -> Self {
        B::seed(device, 7);
        Self {
            first: LinearConfig::new(5, 12).init(device),
            norm: N::create(device),
            last: LinearConfig::new(12, 1).init(device),
        }
    }

    /// The squared error summed over the samples, times `scale`: 1 / the global
    /// batch in one process, world / the global batch on a rank (DDP averages
    /// the ranks' gradients), so uneven batches weigh every sample alike.
    fn loss(&self, x: Tensor<B, 2>, y: Tensor<B, 2>, scale: f32) -> Tensor<B, 1> {
        let batch = x.dims()[0];
        let h = self.first.forward(x).reshape([batch, 3, 4]);
        let h = self.norm.apply(h).reshape([batch, 12]);
        (self.last.forward(h) - y).square().sum().mul_scalar(scale)
    }
}

/// Samples `from..to` of a fixed data set.
fn batch<B: Backend>(from: usize, to: usize, device: &B::Device) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let x: Vec<f32> = (from * 5..to * 5)
        .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
        .collect();
    let y: Vec<f32> = (from..to).map(|i| ((i * 13 % 7) as f32) / 3.0).collect();
    let n = to - from;
    (
        Tensor::<B, 1>::from_floats(x.as_slice(), device).reshape([n, 5]),
        Tensor::<B, 1>::from_floats(y.as_slice(), device).reshape([n, 1]),
    )
}

/// The net's parameters, then its running statistics, in order.
fn values<B: Backend, N: Norm<B>>(net: &Net<B, N>) -> Vec<f32> {
    let mut out = Vec::new();
    collect(net, &mut out);
    out.extend(net.norm.running_statistics());
    out
}

fn collect<B: Backend, M: Module<B>>(module: &M, out: &mut Vec<f32>) {
    struct Collector<'a>(&'a mut Vec<f32>);
    impl<B: Backend> burn::module::ModuleVisitor<B> for Collector<'_> {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<B, D>>) {
            let data = param.val().to_data().convert::<f32>();
            self.0.extend(data.to_vec::<f32>().unwrap());
        }
    }
    module.visit(&mut Collector(out));
}

/// Trains `Net<B, N>` for STEPS steps on samples `[from, to)` of each step's
/// global batch of `global`, the loss scaled by `scale`.
fn train<B: AutodiffBackend, N: Norm<B> + burn::module::AutodiffModule<B>>(
    mut net: Net<B, N>,
    global: usize,
    slice: (usize, usize),
    scale: f32,
    device: &B::Device,
) -> Net<B, N>
where
    Net<B, N>: AutodiffModule<B>,
{
    let mut optim = SgdConfig::new().init();
    for step in 0..STEPS {
        let base = step * global;
        let (x, y) = batch::<B>(base + slice.0, base + slice.1, device);
        let grads = net.loss(x, y, scale).backward();
        let grads = GradientsParams::from_grads(grads, &net);
        net = optim.step(0.1, net, grads);
    }
    net
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// `uneven`: rank r trains on PER_RANK + r samples per step.
pub fn run(uneven: bool) -> Res<()> {
    let group = burn_ddp::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = Default::default();
    let size = |r: usize| PER_RANK + if uneven { r } else { 0 };
    let global: usize = (0..world).map(size).sum();
    let start: usize = (0..rank).map(size).sum();
    let mine = (start, start + size(rank));
    let scale = world as f32 / global as f32;
    // One process, the whole global batch, Burn's BatchNorm.
    let reference = Net::<Plain, BatchNorm<Plain>>::new(&device);
    let reference = values(&train(
        reference,
        global,
        (0, global),
        1.0 / global as f32,
        &device,
    ));
    // N ranks, SyncBatchNorm.
    let net =
        burn_ddp::wrap(Net::<Wrapped, SyncBatchNorm<Wrapped>>::new(&device), &group).map_err(e)?;
    let net = train(net, global, mine, scale, &device);
    let synced = values(&net);
    // Eval: the running statistics, no collective.
    let before = group.collective_bytes();
    let _ = net
        .norm
        .valid()
        .forward(Tensor::<NdArray, 3>::ones([2, 3, 4], &device));
    println!(
        "eval_collective_bytes {}",
        group.collective_bytes() - before
    );
    // N ranks, Burn's BatchNorm: each rank normalises by its own batch.
    let net =
        burn_ddp::wrap(Net::<Wrapped, BatchNorm<Wrapped>>::new(&device), &group).map_err(e)?;
    let local = values(&train(net, global, mine, scale, &device));
    println!("sync_diff {:e}", max_diff(&synced, &reference));
    println!("plain_diff {:e}", max_diff(&local, &reference));
    let gathered = burn_ddp::all_gather(
        &group,
        Tensor::<NdArray, 1>::from_floats(synced.as_slice(), &device),
    )
    .map_err(e)?;
    let same = gathered
        .iter()
        .all(|t| t.to_data().to_vec::<f32>().unwrap() == synced);
    println!("replicas_identical {same}");
    burn_ddp::destroy_process_group().map_err(e)
}
