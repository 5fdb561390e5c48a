//! Distributed Data Parallel training for Burn.
//!
//! One process per device; after `backward()` the gradients are all-reduced and
//! averaged across processes, so every replica takes the same optimizer step.
//!
//! ```ignore
//! type B = burn_ddp::Ddp<burn::backend::Autodiff<burn::backend::NdArray>>;
//!
//! let group = burn_ddp::init_process_group()?;           // RANK, WORLD_SIZE, MASTER_ADDR, ...
//! let model = burn_ddp::wrap(ModelConfig::new().init::<B>(&device), &group)?;
//! // ... the usual loop: loss.backward() now returns averaged gradients.
//! burn_ddp::destroy_process_group()?;
//! ```
//!
//! Layers: `burn-ddp-comm` (environment, store, transports, process group,
//! reducer) knows nothing of Burn; this crate adds collectives on tensors, the
//! `Ddp<B>` backend, model wrapping and data sharding.

#![warn(missing_docs)]

mod backend;
pub mod checkpoint;
mod collective;
pub mod data;
mod device;
mod global;
mod sync;
pub mod tracking;
mod wrap;

pub use backend::Ddp;
#[cfg(feature = "cuda")]
pub use burn_ddp_comm::nccl;
pub use burn_ddp_comm::{
    env::LaunchEnv, BucketConfig, CommError, Launcher, ParamLayout, ProcessGroup,
    ProcessGroupBuilder, ReduceOp, Reducer, Result,
};
pub use burn_ddp_comm::{CollectiveBackend, BACKEND_VAR};
pub use collective::{all_gather, all_reduce, broadcast, reduce_scatter};
pub use data::{distributed_sampler, evaluation_sampler, sum_over_ranks};
#[cfg(feature = "cuda")]
pub use device::cuda_device_for_rank;
pub use global::{default_group, destroy_process_group, init_process_group};
pub use sync::{
    no_sync, reset_sync_stats, sync_enabled, sync_gradients, sync_stats, NoSyncGuard, SyncStats,
};
pub use tracking::TrackedAutodiff;
pub use wrap::{wrap, DdpConfig};
