//! What each crate's learner shim implements for its Burn (the shared
//! program calls only these and the shim's names): the loaders of a
//! classifier's backend, and the `SupervisedTraining` calls the two Burns
//! spell differently.

use crate::shim::ddp::train::DdpTraining;
use crate::shim::Params;
use burn::data::dataset::Dataset;
use burn::train::renderer::MetricsRenderer;

/// A classifier the Learner trains, with the loaders it takes (Burn 0.21:
/// training on the classifier's backend, validation on its inner one).
pub trait Learned: Params {
    type TrainLoader: Loader;
    type ValidLoader: Loader;
}

/// A data loader of the synthetic set's item indices.
pub trait Loader {
    /// `items` in batches of `batch`, calling `on_batch` as each is made.
    fn new(items: impl Dataset<usize> + 'static, batch: usize, on_batch: fn()) -> Self;
}

/// What Burn's `SupervisedTraining` spells differently in 0.21 and 0.22.
pub trait Training: Sized {
    /// Checkpoints in full precision (a resume then equals an uninterrupted
    /// run bit for bit).
    fn with_checkpoints(self) -> Self;
    fn render_with(self, renderer: impl MetricsRenderer + 'static) -> Self;
    /// Resumes after `epoch`'s checkpoint.
    fn resume_from(self, ddp: &DdpTraining, epoch: usize) -> Result<Self, String>;
}
