//! Port of the PyTorch DDP tutorial's MNIST trainer: a two-conv CNN, cross-entropy,
//! AdamW (lr 1e-3), per-process batch 128, a DistributedSampler with
//! `set_epoch`, the average loss all-reduced and printed by rank 0, and the
//! final model saved by rank 0 as `mnist_ddp.mpk`. Test accuracy is measured on
//! a test set sharded across ranks without duplicates.
//!
//! This file is the Burn 0.21 side of the hand-written loop (the dataset,
//! the batcher, the training step, evaluation; seeding and checkpoints are
//! shared/burn_021.rs's; learner.rs the Learner's); the loops around them are examples-common's `mnist::train`
//! and `learner::train`, which the Burn 0.22 program (examples-22/mnist) shares.
//!
//! ```text
//! burn-ddp-run --standalone --nproc-per-node 2 target/release/examples/mnist \
//!     --epochs 2 --data-dir ../shared/data/mnist
//! ```

#[macro_use]
#[path = "../shared/burn_021.rs"]
mod burn_021;
mod learner;
mod net;
mod source;

use burn::data::dataloader::{batcher::Batcher, DataLoader, DataLoaderBuilder};
use burn::data::dataset::Dataset;
use burn::module::AutodiffModule;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{AdamW, AdamWConfig, GradientsParams, Optimizer};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use burn_021::Burn021;
use burn_ddp::data::{DistributedDataset, DistributedSampler, EpochHandle};
use burn_ddp::ProcessGroup;
use burn_ddp_examples_common as common;
use clap::Parser;
use common::front_end::FrontEnd;
use common::idx::Split;
use common::mnist::{MnistArgs, MnistFiles, MnistItem, MnistTraining};
use common::training::{Batches, Failed, Program, Step, Training};
use net::Net;
use std::sync::Arc;

/// One split of MNIST as a Burn dataset over shared pixel buffers.
#[derive(Clone)]
pub struct Mnist(Arc<Split>);

impl Dataset<MnistItem> for Mnist {
    fn get(&self, index: usize) -> Option<MnistItem> {
        MnistItem::of(&self.0, index).ok()
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

/// `ToTensor()` then `Normalize((0.1307,), (0.3081,))`.
#[derive(Clone)]
pub struct MnistBatcher;

impl<B: Backend> Batcher<B, MnistItem, (Tensor<B, 4>, Tensor<B, 1, Int>)> for MnistBatcher {
    fn batch(
        &self,
        items: Vec<MnistItem>,
        device: &B::Device,
    ) -> (Tensor<B, 4>, Tensor<B, 1, Int>) {
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
    if args.learner {
        run_on_backend!(args, train_learner);
    } else {
        run_on_backend!(args, train);
    }
}

fn train<B: AutodiffBackend>(args: &MnistArgs, device: B::Device) {
    let burn = Burn021::<B> { device };
    common::mnist::train(&MnistCnn { burn }, args);
}

fn train_learner<B: AutodiffBackend>(args: &MnistArgs, device: B::Device) {
    let burn = Burn021::<B> { device };
    common::learner::train(&MnistCnn { burn }, args);
}

/// The MNIST trainer on backend `B` (`Ddp<..>`: gradients averaged inside
/// `backward()`).
pub struct MnistCnn<B: AutodiffBackend> {
    burn: Burn021<B>,
}

impl<B: AutodiffBackend> Program for MnistCnn<B> {
    const FRONT_END: FrontEnd = burn_021::BURN_DDP;
}

impl<B: AutodiffBackend> MnistFiles for MnistCnn<B> {
    fn read(&self, args: &MnistArgs, group: &ProcessGroup) -> Result<(Split, Split), String> {
        let limit = std::time::Duration::from_secs(args.download_timeout);
        source::load(args.data_dir.as_deref(), limit, group)
    }
}

type MnistBatch<B> = (Tensor<B, 4>, Tensor<B, 1, Int>);

impl<B: AutodiffBackend> Training for MnistCnn<B> {
    type Model = Net<B>;
    type Optimizer = OptimizerAdaptor<AdamW, Net<B>, B>;
    type Batch = MnistBatch<B>;
    type Loader = Arc<dyn DataLoader<B, MnistBatch<B>>>;
    type Burn = Burn021<B>;

    fn burn(&self) -> &Burn021<B> {
        &self.burn
    }

    fn init(&self) -> (Self::Model, Self::Optimizer) {
        (Net::new(&self.burn.device), AdamWConfig::new().init())
    }

    fn batches<'a>(&self, loader: &'a Self::Loader) -> Batches<'a, Self::Batch> {
        Box::new(loader.iter().map(Ok))
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

impl<B: AutodiffBackend> MnistTraining for MnistCnn<B> {
    type TestLoader = Arc<dyn DataLoader<B::InnerBackend, MnistBatch<B::InnerBackend>>>;

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
            .set_device(self.burn.device.clone())
            .build(shard);
        (loader, handle)
    }

    /// On the model's copy without autodiff.
    fn evaluate(&self, model: &Net<B>, loader: &Self::TestLoader) -> Result<(i64, i64), String> {
        let model = model.valid();
        let (mut correct, mut total) = (0i64, 0i64);
        for (images, targets) in loader.iter() {
            total += targets.dims()[0] as i64;
            let predicted = model.forward(images).argmax(1).flatten::<1>(0, 1);
            correct += predicted
                .equal(targets)
                .int()
                .sum()
                .into_scalar()
                .elem::<i64>();
        }
        Ok((correct, total))
    }
}
