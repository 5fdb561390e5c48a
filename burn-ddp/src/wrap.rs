//! Preparing a model for data-parallel training, as
//! `DistributedDataParallel(model)`: the steps are the shared `wrap`'s, over
//! Burn 0.21's module walk, with the parameters marked as the model's while
//! they are broadcast (so `Ddp<B>::backward` knows them).

use crate::shared::session::SESSION;
use crate::shared::wrap::{broadcast_checked, check_layout, module_layout};
use crate::tracking::WrappingScope;
use crate::{shim, DdpConfig, ProcessGroup, Result};
use burn::module::Module;
use burn::tensor::backend::Backend;

impl DdpConfig {
    /// Prepares `model` for data-parallel training over `group`, as
    /// `DistributedDataParallel(model, process_group=group)`: rank 0's
    /// parameters (and buffers, unless [`broadcast_buffers`](Self::broadcast_buffers)
    /// is off) are broadcast to every rank, so all replicas start identical
    /// whatever seed each used, and the model gets its own synchronisation
    /// state (reducer, buckets, statistics) over `group`, so two models
    /// wrapped separately are synchronised separately.
    ///
    /// Every parameter is initialised here, in declaration order, which is also
    /// the order `Ddp<B>` keeps them in; call it once, after building (or
    /// loading) the model and before the first forward pass, and again after
    /// loading a record into it or moving it to another device.
    pub fn wrap<B: Backend, M: Module<B>>(&self, model: M, group: &ProcessGroup) -> Result<M> {
        let layout = module_layout(group.rank(), shim::walker(&model))?;
        let settings = self.settings(group)?;
        let overlaps = settings.overlap_backward || settings.overlap_on_gpu;
        let scope = SESSION.wrap(group, settings, layout)?;
        if overlaps && group.synchronizes() {
            crate::overlap::armed::arm();
        }
        // Parameters marked while broadcasting are this model's (`Ddp<B>`).
        let _wrapping = scope.map(|scope| WrappingScope::enter(scope.id));
        broadcast_checked(group, self.broadcast_buffers, |r| shim::rewrite(model, r))
    }
}

/// Rank 0's trainable parameters (and, with `buffers`, every other tensor)
/// on every rank, after checking that all ranks hold the same ones.
#[cfg_attr(not(feature = "train"), allow(dead_code))]
pub(crate) fn broadcast_module<B: Backend, M: Module<B>>(
    model: M,
    group: &ProcessGroup,
    buffers: bool,
) -> Result<M> {
    check_layout(group, buffers, shim::walker(&model))?;
    broadcast_checked(group, buffers, |r| shim::rewrite(model, r))
}

/// [`DdpConfig::wrap`] with the default configuration.
pub fn wrap<B: Backend, M: Module<B>>(model: M, group: &ProcessGroup) -> Result<M> {
    DdpConfig::new().wrap(model, group)
}
