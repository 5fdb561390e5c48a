//! The transport of a world of one process: every collective is the identity.

use super::Transport;
use crate::element::{BufferMut, ReduceOp};
use crate::error::Result;

/// Collectives for `world_size == 1`: no network, nothing to combine.
#[derive(Debug, Default)]
pub struct SingleProcess;

impl Transport for SingleProcess {
    fn name(&self) -> &'static str {
        "local"
    }

    // Sum, max and min of one value is that value; the mean divides by one.
    fn all_reduce(&mut self, _data: BufferMut<'_>, _op: ReduceOp) -> Result<()> {
        Ok(())
    }

    fn reduce_scatter(&mut self, _data: BufferMut<'_>, _op: ReduceOp) -> Result<()> {
        Ok(())
    }

    fn all_gather(&mut self, _data: BufferMut<'_>) -> Result<()> {
        Ok(())
    }

    fn broadcast(&mut self, _data: BufferMut<'_>, _root: usize) -> Result<()> {
        Ok(())
    }

    fn abort(&mut self) {}
}
