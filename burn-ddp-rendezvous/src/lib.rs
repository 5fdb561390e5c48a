//! The bottom layer of burn-ddp, what the launcher and the process group
//! share: who a rank is ([`env`](mod@env): torchrun, burn-ddp-run, Open MPI and Slurm
//! variables), its job ([`job`]: the token, the layout of the job's store
//! keys, the names of its shared-memory files) and where the ranks meet
//! ([`store`]: our key/value store, or a client of PyTorch's c10d
//! `TCPStore`).
//!
//! It knows nothing of collectives, training or Burn: the launcher
//! (`burn-ddp-run`) is built on this crate alone.
//!
//! ```
//! use burn_ddp_rendezvous::env::LaunchEnv;
//!
//! // RANK, WORLD_SIZE, MASTER_ADDR, ... (a world of one without a launcher).
//! let env = LaunchEnv::from_lookup(|name| match name {
//!     "RANK" => Some("1".into()),
//!     "WORLD_SIZE" => Some("2".into()),
//!     "MASTER_ADDR" => Some("127.0.0.1".into()),
//!     _ => None,
//! })?;
//! assert_eq!((env.rank, env.world_size, env.local_rank), (1, 2, 1));
//! # Ok::<(), burn_ddp_rendezvous::RendezvousError>(())
//! ```

#![deny(missing_docs)]

pub mod env;
mod error;
mod frame;
pub mod job;
pub mod store;
#[cfg(test)]
mod wire_properties;

pub use env::{LaunchEnv, Launcher, StoreHost};
pub use error::{io_is_timeout, RendezvousError, Result, StoreErrorKind};
pub use job::JobToken;
