//! The communication core of burn-ddp: launcher environment, rendezvous store,
//! process group and collectives over pluggable transports.
//!
//! It knows nothing of Burn, so the launcher can use it without pulling Burn in,
//! and any way of feeding gradients (a backend decorator today, a gradient
//! synchroniser for newer Burn later) can sit on top.
//!
//! Layers, each knowing only the one below: [`env`](mod@env) (who am I) → [`store`]
//! (rendezvous) → [`transport`] (moving bytes) → [`ProcessGroup`] (validated
//! collectives for callers).
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
pub mod env;
mod error;
pub mod frame;
mod group;
pub mod job;
pub mod nccl;
pub mod reducer;
pub mod store;
pub mod transport;
mod watch;
#[cfg(test)]
mod wire_properties;

pub use backend::{CollectiveBackend, BACKEND_VAR};
pub use element::{finish_reduce, reduce_into, BufferMut, DType, Element, ReduceOp};
pub use env::{LaunchEnv, Launcher, StoreHost};
pub use error::{CommError, Result};
pub use group::{
    Algorithm, ProcessGroup, ProcessGroupBuilder, TransportChoice, ALGORITHM_VAR, BLAME_KEY,
    DEBUG_VAR, TRANSPORT_VAR,
};
pub use job::JobToken;
pub use reducer::{BucketConfig, BucketPlan, ParamLayout, Reducer};
pub use transport::{WireCompression, COMPRESSION_VAR};
