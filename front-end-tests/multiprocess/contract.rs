//! What each crate's multiprocess shim implements for its Burn (the shared
//! scenarios call only these and the shim's names).

use crate::shim::ddp::{ProcessGroup, SyncStats};
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
    /// What averaging this model's gradients has cost so far.
    fn sync_stats(&self) -> Option<SyncStats>;
}
