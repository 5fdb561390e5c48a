//! Burn 0.21's spelling of what shared-tests/learner uses: the
//! classifier (generic over its backend: the Learner trains it on
//! `Autodiff<NdArray>`, validates it on `NdArray`, and the accumulation
//! scenario trains it on `Ddp<Autodiff<NdArray>>`), its batches and loaders,
//! and what Burn 0.21's `SupervisedTraining` and `Learner` spell otherwise.

pub use crate::common::{Params, Step};
pub use burn_ddp as ddp;

use crate::common::Norm;
use crate::shared::contract::{Learned, Loader, Training};
use burn::backend::ndarray::NdArrayDevice;
use burn::backend::{Autodiff, NdArray};
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataloader::{DataLoader, DataLoaderBuilder};
use burn::data::dataset::Dataset;
use burn::module::{AutodiffModule, Module};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::{BatchNorm, Linear, LinearConfig, Relu};
use burn::optim::Optimizer;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{ElementConversion, Int, Tensor, TensorData};
use burn::train::renderer::MetricsRenderer;
use burn::train::{
    ClassificationOutput, InferenceStep, Learner, LearningComponentsMarker,
    LearningComponentsTypes, SupervisedTraining, TrainOutput, TrainStep,
};
use burn_ddp::train::DdpTraining;
use burn_ddp::SyncBatchNorm;
use std::sync::Arc;

/// The traits of this shim the shared sources call methods of.
pub mod prelude {
    pub use super::{LearnerOptimizer, Params, Step};
}

/// The extension of the file checkpointer's files (named MessagePack).
pub const CHECKPOINT_EXTENSION: &str = "mpk";

/// Micro-batches a step in the accumulation scenario: Burn 0.21 drops an
/// epoch's leftover micro-batches, so 4, which divides its 8.
pub const GRADS_ACCUMULATION: usize = 4;
/// Whether the Learner steps on an epoch's leftover micro-batches.
pub const STEPS_ON_LEFTOVER_MICRO_BATCHES: bool = false;

pub type Plain = Autodiff<NdArray>;
/// The classifier the Learner trains, the one it validates, and the one the
/// accumulation scenario trains on `Ddp<B>` (rank 0's asynchronous
/// checkpointer holds clones of its parameters).
pub type Model = Classifier<Plain, SyncBatchNorm<Plain>>;
pub type ValidModel = Classifier<NdArray, SyncBatchNorm<NdArray>>;
pub type AccumulationModel = Classifier<burn_ddp::Ddp<Plain>, SyncBatchNorm<burn_ddp::Ddp<Plain>>>;
/// The single-process reference: Burn's BatchNorm where the model has
/// SyncBatchNorm.
pub type Reference = Classifier<Plain, BatchNorm<Plain>>;

pub type Device = NdArrayDevice;

pub fn device() -> Device {
    Default::default()
}

pub fn valid_device() -> Device {
    Default::default()
}

pub fn seed(device: &Device, seed: u64) {
    Plain::seed(device, seed)
}

/// The Learner trains on a plain `Autodiff<NdArray>` (not `Ddp<..>`): the
/// program registers its sum over the ranks for the model's SyncBatchNorm.
pub fn enable_sync_batch_norm() {
    burn_ddp::autodiff::enable_sync_batch_norm::<Plain>();
}

pub fn valid(model: &Model) -> ValidModel {
    model.valid()
}

/// The reference's parameters and running statistics, its last update
/// included (`valid()` settles the running statistics, as the Learner does
/// with the model it returns).
pub fn reference_params(reference: &Reference) -> Vec<f32> {
    reference.valid().flat_params()
}

pub fn int_scalar<B: Backend>(tensor: Tensor<B, 1, Int>) -> i64 {
    tensor.into_scalar().elem::<i64>()
}

/// Linear(6 -> 16), a normalisation, ReLU, Linear(16 -> 3).
#[derive(Module, Debug)]
pub struct Classifier<B: Backend, N> {
    hidden: Linear<B>,
    norm: N,
    out: Linear<B>,
    relu: Relu,
}

impl<B: Backend, N: Norm<B>> Params for Classifier<B, N> {
    fn flat_params(&self) -> Vec<f32> {
        crate::common::flat_params(self)
    }
    fn load_params(self, values: &[f32]) -> Self {
        crate::common::load_params(self, values)
    }
}

impl<B: Backend, N: Norm<B>> Classifier<B, N> {
    pub fn new(device: &B::Device) -> Self {
        Self {
            // No bias before a normalisation (its gradient is zero: AdamW would
            // step on rounding noise).
            hidden: LinearConfig::new(6, 16).with_bias(false).init(device),
            norm: N::create(16, device),
            out: LinearConfig::new(16, 3).init(device),
            relu: Relu::new(),
        }
    }

    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let hidden = self.norm.apply(self.hidden.forward(x));
        self.out.forward(self.relu.forward(hidden))
    }

    pub fn classify(&self, (x, targets): Batch<B>) -> ClassificationOutput<B> {
        let output = self.forward(x);
        let loss = CrossEntropyLossConfig::new()
            .init(&output.device())
            .forward(output.clone(), targets.clone());
        ClassificationOutput::new(loss, output, targets)
    }
}

pub type Batch<B> = (Tensor<B, 2>, Tensor<B, 1, Int>);

impl<B: AutodiffBackend, N: Norm<B> + AutodiffModule<B>> TrainStep for Classifier<B, N>
where
    N::InnerModule: Norm<B::InnerBackend>,
{
    type Input = Batch<B>;
    type Output = ClassificationOutput<B>;
    fn step(&self, batch: Batch<B>) -> TrainOutput<ClassificationOutput<B>> {
        let item = self.classify(batch);
        TrainOutput::new(self, item.loss.backward(), item)
    }
}

impl<B: Backend, N: Norm<B>> InferenceStep for Classifier<B, N> {
    type Input = Batch<B>;
    type Output = ClassificationOutput<B>;
    fn step(&self, batch: Batch<B>) -> ClassificationOutput<B> {
        self.classify(batch)
    }
}

/// The features and classes of `items` (testkit's `point_rows`).
pub fn batch_of<B: Backend>(items: &[usize], device: &B::Device) -> Batch<B> {
    let (x, y) = burn_ddp_testkit::numbers::point_rows(items);
    (
        Tensor::from_data(TensorData::new(x, [items.len(), 6]), device),
        Tensor::from_data(TensorData::new(y, [items.len()]), device),
    )
}

/// Makes batches of items, calling its function as each one is made.
#[derive(Clone)]
pub struct PointBatcher(fn());

impl<B: Backend> Batcher<B, usize, Batch<B>> for PointBatcher {
    fn batch(&self, items: Vec<usize>, device: &B::Device) -> Batch<B> {
        (self.0)();
        batch_of(&items, device)
    }
}

impl<B: Backend> Loader for Arc<dyn DataLoader<B, Batch<B>>> {
    fn new(items: impl Dataset<usize> + 'static, batch: usize, on_batch: fn()) -> Self {
        DataLoaderBuilder::new(PointBatcher(on_batch))
            .batch_size(batch)
            .build(items)
    }
}

/// Trained on its backend, validated on the inner one.
impl<B: AutodiffBackend, N: Norm<B> + AutodiffModule<B>> Learned for Classifier<B, N>
where
    N::InnerModule: Norm<B::InnerBackend>,
{
    type TrainLoader = Arc<dyn DataLoader<B, Batch<B>>>;
    type ValidLoader = Arc<dyn DataLoader<B::InnerBackend, Batch<B::InnerBackend>>>;
}

/// An optimizer the Learner takes for [`Model`].
pub trait LearnerOptimizer: Optimizer<Model, Plain> + 'static {}

impl<O: Optimizer<Model, Plain> + 'static> LearnerOptimizer for O {}

/// `Learner::new`: any backend, optimizer and learning rate.
pub fn learner<B, M, O>(
    model: M,
    optimizer: O,
    lr: f64,
) -> Learner<LearningComponentsMarker<B, f64, M, O>>
where
    B: AutodiffBackend,
    M: TrainStep + AutodiffModule<B> + core::fmt::Display + 'static,
    M::InnerModule: InferenceStep,
    O: Optimizer<M, B> + 'static,
{
    Learner::new(model, optimizer, lr)
}

/// Burn 0.21's file checkpointer in full precision (named MessagePack); its
/// strategy checks that every rank has the resumed checkpoint.
impl<LC: LearningComponentsTypes> Training for SupervisedTraining<LC> {
    fn with_checkpoints(self) -> Self {
        self.with_file_checkpointer(NamedMpkFileRecorder::<FullPrecisionSettings>::new())
    }

    fn render_with(self, renderer: impl MetricsRenderer + 'static) -> Self {
        self.renderer(renderer)
    }

    fn resume_from(self, _ddp: &DdpTraining, epoch: usize) -> Result<Self, String> {
        Ok(self.checkpoint(epoch))
    }
}
