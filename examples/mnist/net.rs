//! The tutorial's MNIST network, shared by the trainer and the benchmark.

use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

/// The tutorial's `Net`.
#[derive(Module, Debug)]
pub struct Net<B: Backend> {
    conv1: Conv2d<B>,
    conv2: Conv2d<B>,
    pool: MaxPool2d,
    fc1: Linear<B>,
    fc2: Linear<B>,
    relu: Relu,
}

impl<B: Backend> Net<B> {
    pub fn new(device: &B::Device) -> Self {
        Self {
            conv1: Conv2dConfig::new([1, 32], [3, 3]).init(device),
            conv2: Conv2dConfig::new([32, 64], [3, 3]).init(device),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            fc1: LinearConfig::new(9216, 128).init(device),
            fc2: LinearConfig::new(128, 10).init(device),
            relu: Relu::new(),
        }
    }

    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2> {
        let x = self.relu.forward(self.conv1.forward(x));
        let x = self.relu.forward(self.conv2.forward(x));
        let x = self.pool.forward(x);
        let x = x.flatten(1, 3);
        let x = self.relu.forward(self.fc1.forward(x));
        self.fc2.forward(x)
    }
}
