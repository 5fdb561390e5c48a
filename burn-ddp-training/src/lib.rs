//! The training layer of burn-ddp: what data-parallel training needs beyond
//! communication, for every Burn front-end, with no Burn dependency.
//!
//! Layers, each knowing only the one below: `burn-ddp-rendezvous` (who am
//! I, the store) → `burn-ddp-comm` (process group, transports, the
//! reducer) → this crate → the Burn front-ends (`burn-ddp` for Burn 0.21,
//! `burn-ddp-22` for 0.22 and 0.23), which walk Burn modules and move
//! tensors.
//!
//! - [`session`]: the default group and each wrapped model's reducer, an
//!   owned [`Session`] (each front-end keeps one; there is no global here);
//! - [`learner`]: what a Learner strategy on several processes agrees on,
//!   the experiment folder, epoch figures summed over the ranks, resuming;
//! - [`snapshots`], [`files`]: the newest snapshot that loads, files written
//!   atomically;
//! - [`stop`]: Ctrl-C and SIGTERM as a stop every rank agrees on;
//! - [`failure`]: a failure where no `Result` fits (`backward()`) as one
//!   line and a panic, without Rust's report or a backtrace;
//! - [`replicas`], [`sum`]: every rank holds the same parameters; per-rank
//!   figures summed over the group.
//!
//! ```
//! use burn_ddp_training::Session;
//!
//! # fn main() -> burn_ddp_comm::Result<()> {
//! let session = Session::new(); // a front-end keeps one for the process
//! let group = session.init()?; // RANK, WORLD_SIZE, ... (a world of one here)
//! assert!(session.default_group().unwrap().is_same(&group));
//! session.destroy()?;
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

pub mod failure;
pub mod files;
pub mod join;
pub mod learner;
pub mod recovery;
pub mod replicas;
pub mod session;
pub mod sharded;
pub mod snapshots;
pub mod stop;
pub mod sum;
#[cfg(test)]
mod test_groups;

pub use burn_ddp_comm::{CommError, Result};
pub use session::Session;
