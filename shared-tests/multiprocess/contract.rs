//! What each crate's multiprocess shim implements for its Burn (the shared
//! scenarios call only these and the shim's names).

use crate::shim::ddp::sync::SyncStats;
use crate::shim::ddp::ProcessGroup;
use crate::shim::Params;
use burn::optim::GradientsParams;

/// What the shared scenarios do with a model: wrap it, and take its
/// gradients, local or averaged over the ranks (Burn 0.21: by `Ddp<B>`
/// inside `backward()`; Burn 0.22: by `sync_gradients`).
pub trait DdpModel: Params {
    type Loss;
    fn wrap(self, group: &ProcessGroup) -> Result<Self, String>;
    /// This rank's own gradients.
    fn local_grads(&self, loss: Self::Loss) -> GradientsParams;
    /// The gradients averaged over the ranks.
    fn synced_grads(&self, loss: Self::Loss) -> Result<GradientsParams, String>;
    /// [`synced_grads`](Self::synced_grads) with a failed average as an
    /// error, never a panic (Burn 0.21: `sync::try_backward`).
    fn try_synced_grads(&self, loss: Self::Loss) -> Result<GradientsParams, String> {
        self.synced_grads(loss)
    }
    /// What averaging this model's gradients has cost so far.
    fn sync_stats(&self) -> Option<SyncStats>;
}

/// The crate's `ShardedOptimizer` as the shared scenarios drive it.
pub trait ShardedStep<M> {
    /// One step on this rank's local gradients.
    fn step(&mut self, lr: f64, model: M, grads: GradientsParams) -> Result<M, String>;
    /// The owning rank of each trainable parameter, as of the last step.
    fn owners(&self) -> Vec<usize>;
    /// This rank's optimizer record: (entries, serialised bytes).
    fn record_size(&self) -> (usize, usize);
    /// Consolidates the whole state on rank 0, which saves it in `dir` with
    /// `model`'s record (collective).
    fn save(&mut self, model: &M, dir: &std::path::Path) -> Result<(), String>;
    /// Saves `model` and this rank's part of the state as a checkpoint in
    /// parts in the folder `dir` (`save_parts`, collective).
    fn save_parts(&mut self, model: &M, dir: &std::path::Path, info: &str) -> Result<(), String>;
    /// [`save_parts`](Self::save_parts) written by a thread: the save under
    /// way, to finish (collective).
    fn save_parts_in_background(
        &mut self,
        model: &M,
        dir: &std::path::Path,
        info: &str,
    ) -> Result<crate::shim::ddp::shard::BackgroundSave, String>;
    /// Loads a checkpoint in parts into `model` and this optimizer
    /// (`load_parts`, collective): the model and the saved `info`.
    fn load_parts(&mut self, model: M, dir: &std::path::Path) -> Result<(M, String), String>;
}

/// A plain optimizer that takes a checkpoint in parts whole
/// (`checkpoint::load_parts`): the model, the optimizer and the saved `info`.
pub trait LoadParts<M>: Sized {
    fn load_parts(self, model: M, dir: &std::path::Path) -> Result<(M, Self, String), String>;
}

/// An optimizer (sharded or not) that takes the whole state saved by
/// [`ShardedStep::save`].
pub trait LoadWhole<M>: Sized {
    fn load_whole(self, dir: &std::path::Path) -> Result<Self, String>;
}

/// A plain optimizer's record: (entries, serialised bytes), in the units of
/// [`ShardedStep::record_size`].
pub trait RecordSize {
    fn record_size(&self) -> (usize, usize);
}
