//! Models, data and parameter helpers shared by the scenarios (Burn 0.22).

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, Relu};
use burn::tensor::{Device, Int, Tensor, TensorData};

/// The document's ToyModel: one Linear(10, 1).
#[derive(Module, Debug)]
pub struct Toy {
    pub linear: Linear,
}

impl Toy {
    pub fn new(device: &Device, outputs: usize) -> Self {
        Self {
            linear: LinearConfig::new(10, outputs).init(device),
        }
    }

    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.linear.forward(x)
    }
}

/// A small conv + linear classifier on 1x8x8 images, 3 classes.
#[derive(Module, Debug)]
pub struct SmallConv {
    conv: Conv2d,
    pool: MaxPool2d,
    linear: Linear,
    relu: Relu,
}

impl SmallConv {
    pub fn new(device: &Device) -> Self {
        Self {
            conv: Conv2dConfig::new([1, 4], [3, 3]).init(device),
            pool: MaxPool2dConfig::new([2, 2]).init(),
            linear: LinearConfig::new(4 * 3 * 3, 3).init(device),
            relu: Relu::new(),
        }
    }

    pub fn forward(&self, x: Tensor<4>) -> Tensor<2> {
        let x = self.relu.forward(self.conv.forward(x));
        self.linear.forward(self.pool.forward(x).flatten(1, 3))
    }
}

/// A shared trunk with two heads; a rank may use only one of them.
#[derive(Module, Debug)]
pub struct TwoHeads {
    trunk: Linear,
    head_a: Linear,
    head_b: Linear,
}

impl TwoHeads {
    pub fn new(device: &Device) -> Self {
        Self {
            trunk: LinearConfig::new(10, 4).init(device),
            head_a: LinearConfig::new(4, 1).init(device),
            head_b: LinearConfig::new(4, 1).init(device),
        }
    }

    pub fn forward(&self, x: Tensor<2>, use_b: bool) -> Tensor<2> {
        let h = self.trunk.forward(x);
        if use_b {
            self.head_b.forward(h)
        } else {
            self.head_a.forward(h)
        }
    }
}

pub use burn_ddp_testkit::numbers::max_relative_difference;

/// Features [n, 10] and regression targets [n, 1] of the given items.
pub fn toy_batch(items: &[usize], device: &Device) -> (Tensor<2>, Tensor<2>) {
    let (x, y) = burn_ddp_testkit::numbers::toy_rows(items);
    (
        Tensor::from_data(TensorData::new(x, [items.len(), 10]), device),
        Tensor::from_data(TensorData::new(y, [items.len(), 1]), device),
    )
}

/// Images [n, 1, 8, 8] and class labels [n] of the given items.
pub fn image_batch(items: &[usize], device: &Device) -> (Tensor<4>, Tensor<1, Int>) {
    let (x, y) = burn_ddp_testkit::numbers::image_rows(items);
    (
        Tensor::from_data(TensorData::new(x, [items.len(), 1, 8, 8]), device),
        Tensor::from_data(TensorData::new(y, [items.len()]), device),
    )
}

struct Collect(Vec<f32>);

impl ModuleVisitor for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        self.0
            .extend(param.val().into_data().try_to_vec::<f32>().unwrap());
    }
}

/// Every float parameter, flattened in declaration order.
pub fn flat_params<M: Module>(model: &M) -> Vec<f32> {
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    collect.0
}

struct Load {
    values: Vec<f32>,
    at: usize,
}

impl ModuleMapper for Load {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        let shape = tensor.shape();
        let n = shape.num_elements();
        let data = TensorData::new(self.values[self.at..self.at + n].to_vec(), shape);
        self.at += n;
        let value = Tensor::from_data(data, &tensor.device()).require_grad();
        Param::from_mapped_value(id, value, mapper)
    }
}

/// `model` with its float parameters replaced by `values` (as [`flat_params`] gives them).
pub fn load_params<M: Module>(model: M, values: &[f32]) -> M {
    let mut load = Load {
        values: values.to_vec(),
        at: 0,
    };
    let model = model.map(&mut load);
    assert_eq!(load.at, values.len(), "parameter count mismatch");
    model
}
