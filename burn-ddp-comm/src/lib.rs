//! The communication layer of burn-ddp: the process group and its
//! collectives over pluggable transports, and the gradient reducer.
//!
//! It knows nothing of Burn, nor of training. Its one process-wide value is
//! how many groups each rank has started (`group/join.rs`), so a new group's
//! store keys never meet an earlier one's; everything else is owned. The
//! layer below is `burn-ddp-rendezvous` (who am I, the job, the store; its
//! `LaunchEnv`, `Launcher`, `StoreHost`, `JobToken` and `Store` are
//! re-exported here), the layer above `burn-ddp-training` (the session with
//! the default group and each model's reducer, the Learner loop) and the
//! Burn front-ends.
//!
//! Inside, each part knows only the one below: [`ProcessGroup`] (collectives,
//! dispatched to the host transports for host buffers and to [`nccl`] for
//! device buffers) → [`Reducer`] (a model's gradients, bucket by bucket,
//! behind the [`GradientSet`] a front-end implements).
//!
//! ```
//! use burn_ddp_comm::{ProcessGroup, ReduceOp};
//!
//! # fn main() -> burn_ddp_comm::Result<()> {
//! // RANK, WORLD_SIZE, MASTER_ADDR, ... from the launcher; a world of one without.
//! let group = ProcessGroup::from_env()?;
//! let mut loss = [0.25f64];
//! group.all_reduce(&mut loss, ReduceOp::Sum)?;
//! let everyone = group.all_gather(&[group.rank() as i64])?; // [0, 1, ..., world - 1]
//! assert_eq!(everyone.len(), group.world_size());
//! group.barrier()?;
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

mod backend;
mod element;
mod error;
pub mod gpu;
mod group;
pub mod nccl;
mod reducer;
mod transport;
#[cfg(test)]
mod wire_properties;

pub use backend::{CollectiveBackend, BACKEND_VAR};
pub use element::{finish_reduce, reduce_into, BufferMut, DType, DeviceBuffer, Element, ReduceOp};
// The layer below, under the paths this crate has always used for it.
pub use burn_ddp_rendezvous::env::{FORCE_STOP_AFTER, JOINING_VAR, ON_FAILURE_VAR};
pub use burn_ddp_rendezvous::store::Store;
pub use burn_ddp_rendezvous::JobToken;
use burn_ddp_rendezvous::{env, job, store};
pub use burn_ddp_rendezvous::{LaunchEnv, Launcher, RendezvousError, StoreHost};
pub use error::{CommError, Result, StoreErrorKind};
pub use group::settings::{Algorithm, TransportChoice, ALGORITHM_VAR, DEBUG_VAR, TRANSPORT_VAR};
pub use group::{ProcessGroup, ProcessGroupBuilder, WeakProcessGroup};
pub use reducer::{
    check_layouts_agree, check_same_layout, Bucket, BucketConfig, BucketPlan, DeviceBucket,
    DeviceFence, ElementBytes, GradientSet, HostCopies, ParamInfo, ParamLayout,
    PendingDeviceBucket, Piece, Placement, Reducer, Round, RoundMode, ShardPlan, Sharder,
    SyncRound, SyncStats,
};
pub use transport::{WireCompression, COMPRESSION_VAR};
