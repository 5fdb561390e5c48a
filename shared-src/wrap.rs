//! Preparing a model for data-parallel training, as
//! `DistributedDataParallel(model)`: its layout checked on every rank, its
//! state registered in the session, rank 0's tensors broadcast. Each
//! front-end's `wrap` is these steps around its Burn's module walk.

use super::contract::{Kind, ParamSlot, ParamView, Rewrite, Visit};
use super::dtype;
use super::walk::Walker;
use burn_ddp_comm::ParamLayout;
use burn_ddp_comm::{CommError, ProcessGroup, Result};
use burn_ddp_training::session::{check_module, ModuleLayout};

/// The shapes and types of a module's tensors, and its trainable ids, in
/// visiting order (an error names `rank` and the first type the collectives
/// do not move).
pub(crate) fn module_layout(rank: usize, walk: impl Walker) -> Result<ModuleLayout> {
    let mut layout = LayoutOf {
        rank,
        found: ModuleLayout::default(),
        error: None,
    };
    walk(&mut layout);
    match layout.error {
        Some(err) => Err(err),
        None => Ok(layout.found),
    }
}

/// Fails on every rank unless all hold the same trainable parameters (and,
/// with `buffers`, the same other tensors). Collective.
pub(crate) fn check_layout(group: &ProcessGroup, buffers: bool, walk: impl Walker) -> Result<()> {
    check_module(group, &module_layout(group.rank(), walk)?, buffers)
}

/// Rank 0's trainable parameters (and, with `buffers`, every other float and
/// int tensor) on every rank, through `rewrite` (a module's mapping walk).
/// The layouts must have been checked to agree.
pub(crate) fn broadcast_checked<M>(
    group: &ProcessGroup,
    buffers: bool,
    rewrite: impl FnOnce(&mut dyn Rewrite) -> M,
) -> Result<M> {
    let mut broadcaster = Broadcaster {
        group,
        buffers,
        error: None,
    };
    let model = rewrite(&mut broadcaster);
    match broadcaster.error {
        Some(err) => Err(err),
        None => Ok(model),
    }
}

/// The shape and type of every tensor a module holds.
struct LayoutOf {
    rank: usize,
    found: ModuleLayout,
    error: Option<CommError>,
}

impl Visit for LayoutOf {
    fn param(&mut self, param: &dyn ParamView) {
        if param.kind() == Kind::Bool {
            return; // never moved
        }
        match dtype::wire_or_error(self.rank, param.dtype(), "wrap") {
            Ok(dtype) => {
                let layout = ParamLayout {
                    shape: param.dims(),
                    dtype,
                };
                if param.require_grad() {
                    self.found.trainable.push(layout);
                    self.found.trainable_ids.insert(param.id());
                } else {
                    self.found.buffers.push(layout);
                }
            }
            Err(err) => {
                self.error.get_or_insert(err);
            }
        }
    }
}

/// Replaces a module's trainable tensors (and, with `buffers`, every other
/// float and int tensor) by rank 0's.
struct Broadcaster<'a> {
    group: &'a ProcessGroup,
    buffers: bool,
    /// The first failure; later tensors are left alone so no rank waits on a
    /// collective the others will not join.
    error: Option<CommError>,
}

impl Rewrite for Broadcaster<'_> {
    fn param(&mut self, param: &mut dyn ParamSlot) {
        if self.error.is_some() || !(param.require_grad() || self.buffers) {
            return;
        }
        if let Err(err) = param.broadcast(self.group, 0) {
            self.error = Some(err);
        }
    }
}
