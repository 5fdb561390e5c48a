//! The SyncBatchNorm benchmark's CNN: two convolutions, each followed by a
//! normalisation (Burn's BatchNorm or burn-ddp's SyncBatchNorm), on MNIST-
//! sized images.

use burn::module::{Module, ModuleDisplay};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig};
use burn::tensor::activation::relu;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use burn_ddp::SyncBatchNorm;

/// A normalisation over the channels of `[batch, channels, height, width]`.
pub trait Norm<B: Backend>: Module<B> + ModuleDisplay {
    fn create(channels: usize, device: &B::Device) -> Self;
    fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4>;
}

impl<B: Backend> Norm<B> for BatchNorm<B> {
    fn create(channels: usize, device: &B::Device) -> Self {
        BatchNormConfig::new(channels).init(device)
    }
    fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        self.forward(x)
    }
}

impl<B: Backend> Norm<B> for SyncBatchNorm<B> {
    fn create(channels: usize, device: &B::Device) -> Self {
        burn_ddp::sync_batch_norm::sync_batch_norm(&BatchNormConfig::new(channels), device)
    }
    fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        self.forward(x)
    }
}

/// Conv(1 -> 8) + norm + ReLU + pool, Conv(8 -> 16) + norm + ReLU, Linear.
#[derive(Module, Debug)]
pub struct BnNet<B: Backend, N> {
    conv1: Conv2d<B>,
    norm1: N,
    pool: MaxPool2d,
    conv2: Conv2d<B>,
    norm2: N,
    out: Linear<B>,
}

impl<B: Backend, N: Norm<B>> BnNet<B, N> {
    pub fn new(device: &B::Device) -> Self {
        Self {
            conv1: Conv2dConfig::new([1, 8], [3, 3])
                .with_bias(false)
                .init(device),
            norm1: N::create(8, device),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            conv2: Conv2dConfig::new([8, 16], [3, 3])
                .with_bias(false)
                .init(device),
            norm2: N::create(16, device),
            out: LinearConfig::new(16 * 11 * 11, 10).init(device),
        }
    }

    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = self
            .pool
            .forward(relu(self.norm1.apply(self.conv1.forward(x))));
        let x = relu(self.norm2.apply(self.conv2.forward(x)));
        self.out.forward(x.flatten(1, 3))
    }
}
