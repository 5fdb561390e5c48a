//! `Ddp<B>` in a single process: a faithful stand-in for the backend it wraps.

use burn::backend::{Autodiff, NdArray};
use burn::module::{Module, ModuleVisitor, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{activation, Distribution, Tensor, TensorData};
use burn_ddp::Ddp;

/// NdArray's random generator is process-wide: tests that seed it take turns.
static RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());

type Plain = Autodiff<NdArray>;
type Wrapped = Ddp<Autodiff<NdArray>>;

#[derive(Module, Debug)]
struct ConvNet<B: Backend> {
    conv: Conv2d<B>,
    pool: MaxPool2d,
    linear: Linear<B>,
    relu: Relu,
}

impl<B: Backend> ConvNet<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            conv: Conv2dConfig::new([1, 4], [3, 3]).init(device),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            linear: LinearConfig::new(4 * 3 * 3, 2).init(device),
            relu: Relu::new(),
        }
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = self.relu.forward(self.conv.forward(x));
        let x = self.pool.forward(x).flatten(1, 3);
        activation::softmax(self.linear.forward(x), 1)
    }
}

struct Collect(Vec<TensorData>);

impl<B: Backend> ModuleVisitor<B> for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.0.push(param.val().into_data());
    }
}

fn params<B: Backend, M: Module<B>>(model: &M) -> Vec<TensorData> {
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    collect.0
}

/// Five SGD steps from a seeded start; returns the parameters after each step.
fn train<B: AutodiffBackend>() -> Vec<Vec<TensorData>> {
    let _rng = RNG.lock().unwrap_or_else(|e| e.into_inner());
    let device = Default::default();
    B::seed(&device, 7);
    let mut model = ConvNet::<B>::new(&device);
    let mut optim = SgdConfig::new().init();
    let mut history = Vec::new();
    for _ in 0..5 {
        let x = Tensor::<B, 4>::random([3, 1, 8, 8], Distribution::Normal(0.0, 1.0), &device);
        let y = Tensor::<B, 2>::random([3, 2], Distribution::Default, &device);
        let loss = MseLoss::new().forward(model.forward(x), y, Reduction::Mean);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(0.1, model, grads);
        history.push(params(&model));
    }
    history
}

#[test]
fn ddp_trains_bit_identically_to_the_backend_it_wraps() {
    let plain = train::<Plain>();
    let wrapped = train::<Wrapped>();
    assert_eq!(plain.len(), wrapped.len());
    for (step, (a, b)) in plain.iter().zip(&wrapped).enumerate() {
        assert_eq!(a, b, "parameters differ after step {step}");
    }
    // And training did move the parameters.
    assert_ne!(plain[0], plain[4]);
}

#[test]
fn backend_name_says_ddp() {
    let device = Default::default();
    assert_eq!(
        <Wrapped as Backend>::name(&device),
        format!("ddp<{}>", <Plain as Backend>::name(&device))
    );
}

#[test]
fn parameters_are_tracked_and_dead_ones_forgotten() {
    let device = Default::default();
    let _rng = RNG.lock().unwrap_or_else(|e| e.into_inner());
    let before = burn_ddp::autodiff::tracked_parameters();
    let mut model = ConvNet::<Wrapped>::new(&device);
    let mut optim = SgdConfig::new().init();
    for _ in 0..300 {
        let x = Tensor::<Wrapped, 4>::random([2, 1, 8, 8], Distribution::Default, &device);
        let loss = model.forward(x).sum();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(0.1, model, grads);
    }
    // 4 parameters live; dead ones are pruned in batches, so the registry stays
    // bounded instead of growing by 4 per step (1200 here).
    let held = burn_ddp::autodiff::tracked_parameters()
        - before.min(burn_ddp::autodiff::tracked_parameters());
    assert!(held <= 200, "registry holds {held} entries after 300 steps");
}
