//! The MNIST DDP trainer of the PyTorch DDP tutorial, on Burn 0.22: the program of
//! examples/mnist (a two-conv CNN, cross-entropy, AdamW lr 1e-3,
//! per-process batch 128, a DistributedSampler with `set_epoch`, the
//! average loss all-reduced, test accuracy over a test set sharded without
//! duplicates, snapshots, the final model saved by rank 0), with the same
//! flags. This file is Burn 0.22's side of the hand-written loop (the
//! dataset, the batcher, the training step, evaluation; seeding and
//! checkpoints: burn_022.rs; learner.rs the Learner's); the loops are examples-common's, shared with
//! the Burn 0.21 program.
//!
//! ```text
//! burn-ddp-run --standalone --nproc-per-node 2 target/release/examples/mnist22 \
//!     --epochs 2 --data-dir ../shared/data/mnist
//! ```

#[path = "../burn_022.rs"]
mod burn_022;
mod learner;
mod net;

use burn::data::dataloader::{batcher::Batcher, DataLoader, DataLoaderBuilder};
use burn::data::dataset::{Dataset, DatasetError};
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer};
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_022::Burn022;
use burn_ddp_22::data::{DistributedDataset, DistributedSampler, EpochHandle};
use burn_ddp_22::ProcessGroup;
use burn_ddp_examples_common as common;
use clap::Parser;
use common::front_end::FrontEnd;
use common::idx::{self, Split};
use common::mnist::{MnistArgs, MnistFiles, MnistItem, MnistTraining};
use common::training::{Batches, Failed, Program, Step, Training};
use net::Net;
use std::sync::Arc;

/// One split of MNIST as a Burn dataset over shared pixel buffers.
#[derive(Clone)]
struct Mnist(Arc<Split>);

impl Dataset<MnistItem> for Mnist {
    fn get(&self, index: usize) -> Result<MnistItem, DatasetError> {
        MnistItem::of(&self.0, index).map_err(DatasetError::new)
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

/// `ToTensor()` then `Normalize((0.1307,), (0.3081,))`.
#[derive(Clone)]
struct MnistBatcher;

impl Batcher<MnistItem, (Tensor<4>, Tensor<1, Int>)> for MnistBatcher {
    fn batch(&self, items: Vec<MnistItem>, device: &Device) -> (Tensor<4>, Tensor<1, Int>) {
        let n = items.len();
        let pixels = common::mnist::normalized_pixels(&items);
        let labels = common::mnist::labels(&items);
        (
            Tensor::from_data(TensorData::new(pixels, [n, 1, 28, 28]), device),
            Tensor::from_data(TensorData::new(labels, [n]), device),
        )
    }
}

fn main() {
    let args = MnistArgs::parse();
    common::mnist::init_logger(&args);
    let burn = Burn022 {
        device: burn_022::for_backend(args.backend, "mnist"),
    };
    if args.learner {
        common::learner::train(&MnistCnn { burn }, &args);
    } else {
        common::mnist::train(&MnistCnn { burn }, &args);
    }
}

/// The MNIST trainer on an autodiff device.
struct MnistCnn {
    burn: Burn022,
}

impl Program for MnistCnn {
    const FRONT_END: FrontEnd = burn_022::BURN_DDP_22;
}

impl MnistFiles for MnistCnn {
    /// Without --data-dir, burn-dataset's cache (this trainer does not download).
    fn read(&self, args: &MnistArgs, _group: &ProcessGroup) -> Result<(Split, Split), String> {
        match &args.data_dir {
            Some(dir) => common::mnist::read_idx(dir),
            None => common::mnist::read_idx(&idx::burn_dataset_cache()).map_err(|e| {
                format!(
                    "{e} (no --data-dir given, so burn-dataset's cache was read; this trainer \
                     does not download: give --data-dir with the four MNIST IDX files)"
                )
            }),
        }
    }
}

type MnistBatch = (Tensor<4>, Tensor<1, Int>);

impl Training for MnistCnn {
    type Model = Net;
    type Optimizer = ModuleOptimizer;
    type Batch = MnistBatch;
    type Loader = Arc<dyn DataLoader<MnistBatch>>;
    type Burn = Burn022;

    fn burn(&self) -> &Burn022 {
        &self.burn
    }

    fn init(&self) -> (Self::Model, Self::Optimizer) {
        (Net::new(&self.burn.device), AdamWConfig::new().init())
    }

    fn batches<'a>(&self, loader: &'a Self::Loader) -> Batches<'a, Self::Batch> {
        Box::new(loader.iter().map(|batch| batch.map_err(|e| e.to_string())))
    }

    fn train_step(
        &self,
        model: Self::Model,
        optimizer: &mut Self::Optimizer,
        (images, targets): Self::Batch,
        lr: f64,
    ) -> Result<Step<Self::Model>, Failed<Self::Model>> {
        let samples = targets.dims()[0];
        let logits = model.forward(images);
        let loss = CrossEntropyLossConfig::new()
            .init(&logits.device())
            .forward(logits, targets);
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

impl MnistTraining for MnistCnn {
    type TestLoader = Arc<dyn DataLoader<MnistBatch>>;

    fn train_loader(
        &self,
        split: Arc<Split>,
        sampler: DistributedSampler,
        batch_size: usize,
    ) -> (Self::Loader, EpochHandle) {
        let shard = DistributedDataset::new(Mnist(split), sampler);
        let epochs = shard.epoch_handle();
        let loader = DataLoaderBuilder::new(MnistBatcher)
            .batch_size(batch_size)
            .set_device(self.burn.device.clone())
            .build(shard);
        (loader, epochs)
    }

    fn test_loader(
        &self,
        split: Arc<Split>,
        sampler: DistributedSampler,
        batch_size: usize,
    ) -> (Self::TestLoader, EpochHandle) {
        let shard = DistributedDataset::new(Mnist(split), sampler);
        let handle = shard.epoch_handle();
        let loader = DataLoaderBuilder::new(MnistBatcher)
            .batch_size(batch_size)
            .set_device(self.burn.device.clone().inner())
            .build(shard);
        (loader, handle)
    }

    /// On the model's copy without autodiff.
    fn evaluate(&self, model: &Net, loader: &Self::TestLoader) -> Result<(i64, i64), String> {
        let model = model.valid();
        let (mut correct, mut total) = (0i64, 0i64);
        for batch in loader.iter() {
            let (images, targets) = batch.map_err(|e| e.to_string())?;
            total += targets.dims()[0] as i64;
            let predicted = model.forward(images).argmax(1).flatten::<1>(0, 1);
            correct += predicted.equal(targets).int().sum().into_scalar::<i64>();
        }
        Ok((correct, total))
    }
}
