//! Burn 0.22's spelling of what shared-tests/learner uses: the
//! classifier (no backend parameter: one type for training, validation and
//! the accumulation scenario), its batches and loaders, and what Burn 0.22's
//! `SupervisedTraining` and `Learner` spell otherwise.

pub use crate::common::{Params, Step};
pub use burn_ddp_22 as ddp;

use crate::common::Norm;
use crate::shared::contract::{Learned, Loader, Training};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::{DataLoader, DataLoaderBuilder};
use burn::data::dataset::Dataset;
use burn::module::Module;
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{BatchNorm, Linear, LinearConfig, Relu};
use burn::optim::ModuleOptimizer;
use burn::tensor::{Int, Tensor, TensorData};

pub use burn::tensor::Device;
use burn::train::renderer::MetricsRenderer;
use burn::train::{
    ClassificationOutput, InferenceStep, Learner, LearnerModel, SupervisedTraining, TrainOutput,
    TrainStep,
};
use burn_ddp_22::train::DdpTraining;
use burn_ddp_22::SyncBatchNorm;
use std::sync::Arc;

/// The traits of this shim the shared sources call methods of.
pub mod prelude {
    pub use super::{LearnerOptimizer, Params, Step};
}

/// The extension of the default checkpointers' files (burnpack).
pub const CHECKPOINT_EXTENSION: &str = "bpk";

/// Micro-batches a step in the accumulation scenario: 8 an epoch, steps
/// after 3 and 6, and Burn 0.22 applies the 2 left over at the epoch's end.
pub const GRADS_ACCUMULATION: usize = 3;
/// Whether the Learner steps on an epoch's leftover micro-batches.
pub const STEPS_ON_LEFTOVER_MICRO_BATCHES: bool = true;

/// One classifier type for what the Learner trains and validates and for
/// the accumulation scenario.
pub type Model = Classifier<SyncBatchNorm>;
pub type ValidModel = Classifier<SyncBatchNorm>;
pub type AccumulationModel = Classifier<SyncBatchNorm>;
/// The single-process reference: Burn's BatchNorm where the model has
/// SyncBatchNorm.
pub type Reference = Classifier<BatchNorm>;

pub fn device() -> Device {
    Device::flex().autodiff()
}

pub fn valid_device() -> Device {
    Device::flex()
}

pub fn seed(device: &Device, seed: u64) {
    device.seed(seed)
}

/// Nothing to register on Burn 0.22 (the crate's `flex` feature routes
/// SyncBatchNorm's sum over the ranks).
pub fn enable_sync_batch_norm() {}

pub fn valid(model: &Model) -> ValidModel {
    model.valid()
}

/// The reference's parameters and running statistics, its last update
/// included (`valid()` settles the running statistics, as the Learner does
/// with the model it returns).
pub fn reference_params(reference: &Reference) -> Vec<f32> {
    reference.valid().flat_params()
}

pub fn int_scalar(tensor: Tensor<1, Int>) -> i64 {
    tensor.into_scalar()
}

/// Linear(6 -> 16), a normalisation, ReLU, Linear(16 -> 3).
#[derive(Module, Debug)]
pub struct Classifier<N: Norm> {
    hidden: Linear,
    norm: N,
    out: Linear,
    relu: Relu,
}

impl<N: Norm> Classifier<N> {
    pub fn new(device: &Device) -> Self {
        Self {
            // No bias before a normalisation (its gradient is zero: AdamW would
            // step on rounding noise).
            hidden: LinearConfig::new(6, 16).with_bias(false).init(device),
            norm: N::create(16, device),
            out: LinearConfig::new(16, 3).init(device),
            relu: Relu::new(),
        }
    }

    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let hidden = self.norm.apply(self.hidden.forward(x));
        self.out.forward(self.relu.forward(hidden))
    }

    pub fn classify(&self, (x, targets): Batch) -> ClassificationOutput {
        let output = self.forward(x);
        let loss = CrossEntropyLossConfig::new()
            .init(&output.device())
            .forward(output.clone(), targets.clone());
        ClassificationOutput::new(loss, output, targets)
    }
}

pub type Batch = (Tensor<2>, Tensor<1, Int>);

impl<N: Norm> TrainStep for Classifier<N> {
    type Input = Batch;
    type Output = ClassificationOutput;
    fn step(&self, batch: Batch) -> TrainOutput<ClassificationOutput> {
        let item = self.classify(batch);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl<N: Norm> InferenceStep for Classifier<N> {
    type Input = Batch;
    type Output = ClassificationOutput;
    fn step(&self, batch: Batch) -> ClassificationOutput {
        self.classify(batch)
    }
}

/// The features and classes of `items` (testkit's `point_rows`).
pub fn batch_of(items: &[usize], device: &Device) -> Batch {
    let (x, y) = burn_ddp_testkit::numbers::point_rows(items);
    (
        Tensor::from_data(TensorData::new(x, [items.len(), 6]), device),
        Tensor::from_data(TensorData::new(y, [items.len()]), device),
    )
}

/// Makes batches of items, calling its function as each one is made.
#[derive(Clone)]
pub struct PointBatcher(fn());

impl Batcher<usize, Batch> for PointBatcher {
    fn batch(&self, items: Vec<usize>, device: &Device) -> Batch {
        (self.0)();
        batch_of(&items, device)
    }
}

impl Loader for Arc<dyn DataLoader<Batch>> {
    fn new(items: impl Dataset<usize> + 'static, batch: usize, on_batch: fn()) -> Self {
        DataLoaderBuilder::new(PointBatcher(on_batch))
            .batch_size(batch)
            .build(items)
    }
}

impl<N: Norm> Learned for Classifier<N> {
    type TrainLoader = Arc<dyn DataLoader<Batch>>;
    type ValidLoader = Arc<dyn DataLoader<Batch>>;
}

/// An optimizer the Learner takes (Burn 0.22: a `ModuleOptimizer`).
pub trait LearnerOptimizer: Into<ModuleOptimizer> {}

impl<O: Into<ModuleOptimizer>> LearnerOptimizer for O {}

/// `Learner::new`.
pub fn learner<M: LearnerModel>(
    model: M,
    optimizer: impl Into<ModuleOptimizer>,
    lr: f64,
) -> Learner<M> {
    Learner::new(model, optimizer.into(), lr)
}

/// Burn 0.22's checkpointers (burnpack files) keep full precision; its
/// `launch` loads the resumed checkpoint on every rank before the strategy
/// runs, so every rank checks it has it first.
impl<M: LearnerModel> Training for SupervisedTraining<M> {
    fn with_checkpoints(self) -> Self {
        self.with_default_checkpointers()
    }

    fn render_with(self, renderer: impl MetricsRenderer + 'static) -> Self {
        self.renderer(Box::new(renderer))
    }

    fn resume_from(self, ddp: &DdpTraining, epoch: usize) -> Result<Self, String> {
        ddp.verify_checkpoint(epoch).map_err(|e| e.to_string())?;
        Ok(self.checkpoint(epoch))
    }
}
