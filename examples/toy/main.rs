//! Port of the PyTorch DDP tutorial's ToyModel trainer: one Linear(10, 1), MSE,
//! SGD, a synthetic dataset identical on every rank, a DistributedSampler, the
//! loss all-reduced for logging, rank-0 checkpoints every `--save-interval`
//! epochs, and `--resume` from one.
//!
//! This file is the Burn 0.21 side (the model, the batcher, the training
//! step; seeding and checkpoints are shared/burn_021.rs's, for every Burn
//! 0.21 trainer); the loop around it is examples-common's `toy::train`,
//! which the Burn 0.22 program (examples-22/toy) shares.
//!
//! ```text
//! cargo run --release --example toy                                  # one process
//! burn-ddp-run --standalone --nproc-per-node 2 target/release/examples/toy --epochs 10 --batch_size 32
//! ```

// `pub(crate)` items here are reused by examples/gpu_check (the same trainer,
// linked into the one binary carried to GPU machines).
#[macro_use]
#[path = "../shared/burn_021.rs"]
mod burn_021;

use burn::data::dataloader::{batcher::Batcher, DataLoader, DataLoaderBuilder};
use burn::data::dataset::Dataset;
use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig};
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{GradientsParams, Optimizer, Sgd, SgdConfig};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Tensor, TensorData};
use burn_021::Burn021;
use burn_ddp::data::{DistributedDataset, DistributedSampler, EpochHandle};
use burn_ddp_examples_common as common;
use clap::Parser;
use common::front_end::FrontEnd;
use common::toy::{ToyData, ToyItem, ToyTraining};
use common::training::{Batches, Failed, Program, Step, Training};
use std::sync::Arc;

/// The toy trainer's command line; `--backend`'s default is NdArray.
pub(crate) type ToyArgs = common::toy::ToyArgs<common::toy::NdArrayByDefault>;

/// The tutorial's ToyModel.
#[derive(Module, Debug)]
struct ToyModel<B: Backend> {
    linear: Linear<B>,
}

impl<B: Backend> ToyModel<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            linear: LinearConfig::new(10, 1).init(device),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.linear.forward(x)
    }
}

/// The tutorial's ToyDataset: random features and labels, the same on every rank.
struct ToyDataset(ToyData);

impl Dataset<ToyItem> for ToyDataset {
    fn get(&self, index: usize) -> Option<ToyItem> {
        self.0.get(index).ok()
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

#[derive(Clone)]
struct ToyBatcher;

impl<B: Backend> Batcher<B, ToyItem, (Tensor<B, 2>, Tensor<B, 2>)> for ToyBatcher {
    fn batch(&self, items: Vec<ToyItem>, device: &B::Device) -> (Tensor<B, 2>, Tensor<B, 2>) {
        let n = items.len();
        let (x, y) = common::toy::features_and_labels(&items);
        (
            Tensor::from_data(TensorData::new(x, [n, 10]), device),
            Tensor::from_data(TensorData::new(y, [n, 1]), device),
        )
    }
}

fn main() {
    common::cli::init_logger();
    let args = ToyArgs::parse();
    run_on_backend!(args, train);
}

pub(crate) fn train<B: AutodiffBackend>(args: &ToyArgs, device: B::Device) {
    let burn = Burn021::<B> { device };
    common::toy::train(&Toy { burn }, args);
}

/// The toy trainer on backend `B` (`Ddp<..>` averages the gradients inside
/// `backward()`; a plain `Autodiff<..>` trains alone, the GPU check's reference).
struct Toy<B: AutodiffBackend> {
    burn: Burn021<B>,
}

impl<B: AutodiffBackend> Program for Toy<B> {
    const FRONT_END: FrontEnd = burn_021::BURN_DDP;
}

impl<B: AutodiffBackend> Training for Toy<B> {
    type Model = ToyModel<B>;
    type Optimizer = OptimizerAdaptor<Sgd<B::InnerBackend>, ToyModel<B>, B>;
    type Batch = (Tensor<B, 2>, Tensor<B, 2>);
    type Loader = Arc<dyn DataLoader<B, Self::Batch>>;
    type Burn = Burn021<B>;

    fn burn(&self) -> &Burn021<B> {
        &self.burn
    }

    fn init(&self) -> (Self::Model, Self::Optimizer) {
        (ToyModel::new(&self.burn.device), SgdConfig::new().init())
    }

    fn batches<'a>(&self, loader: &'a Self::Loader) -> Batches<'a, Self::Batch> {
        Box::new(loader.iter().map(Ok))
    }

    fn train_step(
        &self,
        model: Self::Model,
        optimizer: &mut Self::Optimizer,
        (features, labels): Self::Batch,
        lr: f64,
    ) -> Result<Step<Self::Model>, Failed<Self::Model>> {
        let samples = labels.dims()[0];
        let outputs = model.forward(features);
        let loss = MseLoss::new().forward(outputs, labels, Reduction::Mean);
        let loss_value = loss.clone().into_scalar().elem::<f64>();
        // Averaged over ranks here; a rank that is gone is an error, not a panic.
        let grads = match burn_ddp::sync::try_backward(loss) {
            Ok(grads) => GradientsParams::from_grads(grads, &model),
            Err(error) => return Err(Failed { model, error }),
        };
        let model = optimizer.step(lr, model, grads);
        Ok(Step {
            model,
            loss: loss_value,
            samples,
        })
    }
}

impl<B: AutodiffBackend> ToyTraining for Toy<B> {
    fn loader(
        &self,
        data: ToyData,
        sampler: DistributedSampler,
        batch_size: usize,
    ) -> (Self::Loader, EpochHandle) {
        let shard = DistributedDataset::new(ToyDataset(data), sampler);
        let epochs = shard.epoch_handle();
        let loader = DataLoaderBuilder::new(ToyBatcher)
            .batch_size(batch_size)
            .set_device(self.burn.device.clone())
            .build(shard);
        (loader, epochs)
    }
}
