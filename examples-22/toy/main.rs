//! The ToyModel DDP trainer of the PyTorch DDP tutorial, on Burn 0.22: the same program,
//! flags and checkpoints as examples/toy (the loop is examples-common's
//! `toy::train`, shared by both), with Burn 0.22's model, batcher and
//! training step (seeding and checkpoints: burn_022.rs, every trainer's). The one line that differs in the step is
//! `sync_gradients` before the optimizer step (Burn 0.22 has no backend
//! decorator to average inside `backward()`).
//!
//! ```text
//! cargo run --release -p burn-ddp-22-examples --example toy22                  # one process
//! burn-ddp-run --standalone --nproc-per-node 2 target/release/examples/toy22 --epochs 10
//! ```

#[path = "../burn_022.rs"]
pub(crate) mod burn_022;

use burn::data::dataloader::{batcher::Batcher, DataLoader, DataLoaderBuilder};
use burn::data::dataset::{Dataset, DatasetError};
use burn::module::Module;
use burn::nn::loss::{MseLoss, Reduction};
use burn::nn::{Linear, LinearConfig};
use burn::optim::{GradientsParams, ModuleOptimizer, SgdConfig};
use burn::tensor::{Device, Tensor, TensorData};
use burn_022::Burn022;
use burn_ddp_22::data::{DistributedDataset, DistributedSampler, EpochHandle};
use burn_ddp_examples_common as common;
use clap::Parser;
use common::front_end::FrontEnd;
use common::toy::{ToyData, ToyItem, ToyTraining};
use common::training::{Batches, Failed, Program, Step, Training};
use std::sync::Arc;

/// The toy trainer's command line; `--backend`'s default is Flex (Burn 0.22
/// has no NdArray).
pub(crate) type ToyArgs = common::toy::ToyArgs<common::toy::FlexByDefault>;

/// The tutorial's ToyModel.
#[derive(Module, Debug)]
struct ToyModel {
    linear: Linear,
}

impl ToyModel {
    fn new(device: &Device) -> Self {
        Self {
            linear: LinearConfig::new(10, 1).init(device),
        }
    }

    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.linear.forward(x)
    }
}

/// The tutorial's ToyDataset: random features and labels, the same on every rank.
struct ToyDataset(ToyData);

impl Dataset<ToyItem> for ToyDataset {
    fn get(&self, index: usize) -> Result<ToyItem, DatasetError> {
        self.0.get(index).map_err(DatasetError::new)
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

#[derive(Clone)]
struct ToyBatcher;

impl Batcher<ToyItem, (Tensor<2>, Tensor<2>)> for ToyBatcher {
    fn batch(&self, items: Vec<ToyItem>, device: &Device) -> (Tensor<2>, Tensor<2>) {
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
    let device = burn_022::for_backend(args.backend, "toy");
    train(&args, device);
}

pub(crate) fn train(args: &ToyArgs, device: Device) {
    let burn = Burn022 { device };
    common::toy::train(&Toy { burn }, args);
}

/// The toy trainer on an autodiff device.
struct Toy {
    burn: Burn022,
}

impl Program for Toy {
    const FRONT_END: FrontEnd = burn_022::BURN_DDP_22;
}

impl Training for Toy {
    type Model = ToyModel;
    type Optimizer = ModuleOptimizer;
    type Batch = (Tensor<2>, Tensor<2>);
    type Loader = Arc<dyn DataLoader<Self::Batch>>;
    type Burn = Burn022;

    fn burn(&self) -> &Burn022 {
        &self.burn
    }

    fn init(&self) -> (Self::Model, Self::Optimizer) {
        (ToyModel::new(&self.burn.device), SgdConfig::new().init())
    }

    fn batches<'a>(&self, loader: &'a Self::Loader) -> Batches<'a, Self::Batch> {
        Box::new(loader.iter().map(|batch| batch.map_err(|e| e.to_string())))
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
        let loss_value = loss.clone().into_scalar::<f64>();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        // Averaged over ranks here (inside backward() on Burn 0.21).
        let grads = match burn_ddp_22::sync_gradients(&model, grads) {
            Ok(grads) => grads,
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

impl ToyTraining for Toy {
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
