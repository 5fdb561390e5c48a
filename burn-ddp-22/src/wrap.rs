//! Preparing a model for data-parallel training, as
//! `DistributedDataParallel(model)`: the steps are the shared `wrap`'s, over
//! Burn 0.22's module walk.

use crate::shared::session::SESSION;
use crate::shared::wrap::{broadcast_checked, check_layout, module_layout};
use crate::{shim, DdpConfig, ProcessGroup, Result};
use burn::module::Module;

impl DdpConfig {
    /// Prepares `model` for data-parallel training over `group`, as
    /// `DistributedDataParallel(model, process_group=group)`: rank 0's
    /// parameters (and buffers, unless [`broadcast_buffers`](Self::broadcast_buffers)
    /// is off) are broadcast to every rank, so all replicas start identical
    /// whatever seed each used, and the model gets its own synchronisation
    /// state (reducer, buckets, statistics) over `group`, used by
    /// [`crate::sync_gradients`].
    ///
    /// Call it once, after building (or loading) the model and before the
    /// first step, and again after loading a record into it.
    pub fn wrap<M: Module>(&self, model: M, group: &ProcessGroup) -> Result<M> {
        let layout = module_layout(group.rank(), shim::walker(&model))?;
        SESSION.wrap(group, self.settings(group)?, layout)?;
        broadcast_checked(group, self.broadcast_buffers, |r| shim::rewrite(model, r))
    }
}

/// Rank 0's trainable parameters (and, with `buffers`, every other tensor)
/// on every rank, after checking that all ranks hold the same ones.
#[cfg_attr(not(feature = "train"), allow(dead_code))]
pub(crate) fn broadcast_module<M: Module>(
    model: M,
    group: &ProcessGroup,
    buffers: bool,
) -> Result<M> {
    check_layout(group, buffers, shim::walker(&model))?;
    broadcast_checked(group, buffers, |r| shim::rewrite(model, r))
}

/// [`DdpConfig::wrap`] with the default configuration.
pub fn wrap<M: Module>(model: M, group: &ProcessGroup) -> Result<M> {
    DdpConfig::new().wrap(model, group)
}
