//! Distributed Data Parallel training for Burn 0.22: one process per device,
//! the gradients averaged across processes before every optimizer step, so
//! every replica takes the same step. Burn 0.22 itself has no multi-process
//! training.
//!
//! ```no_run
//! use burn::nn::LinearConfig;
//! use burn::optim::{GradientsParams, Optimizer, SgdConfig};
//! use burn::tensor::{Device, Tensor};
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let device = Device::default().autodiff();
//!     let group = burn_ddp_22::init_process_group()?; // RANK, WORLD_SIZE, MASTER_ADDR, ...
//!     let mut model = burn_ddp_22::wrap(LinearConfig::new(10, 1).init(&device), &group)?;
//!     let mut optimizer = SgdConfig::new().init();
//!     for _step in 0..10 {
//!         let x = Tensor::<2>::ones([32, 10], &device); // this rank's batch
//!         let loss = model.forward(x).powi_scalar(2).mean();
//!         let grads = GradientsParams::from_grads(loss.backward(), &model);
//!         let grads = burn_ddp_22::sync_gradients(&model, grads)?; // the one added line
//!         model = optimizer.step(0.01, model, grads);
//!     }
//!     burn_ddp_22::destroy_process_group()?;
//!     Ok(())
//! }
//! ```
//!
//! Launch it with `burn-ddp-run --standalone --nproc-per-node 2 PROGRAM`
//! (or torchrun, `mpirun`, `srun`); run alone, it is a world of one.
//!
//! The same core as `burn-ddp` (the Burn 0.21 crate) runs underneath:
//! `burn-ddp-comm` (environment, store, transports, process group, reducer,
//! per-model state) and `burn-ddp-sampler`. This crate is only the Burn 0.22
//! tensor glue: it finds a module's parameters, moves gradients in and out of
//! the reducer's buckets, and offers collectives on tensors and data
//! sharding. Where Burn 0.21's crate averages inside `backward()` (its
//! `Ddp<B>` backend decorator), Burn 0.22 leaves no place for a decorator
//! (`Tensor` has no backend parameter), so the average is the explicit
//! [`sync_gradients`] call before `optimizer.step`.
//!
//! On GPUs (the `cuda` feature): gradients and tensor collectives of tensors
//! on Burn's CUDA devices go over NCCL in place on the device; pick each
//! rank's GPU with `cuda_device_for_rank`. Every other tensor goes through
//! host memory.

#![deny(missing_docs)]

mod autograd;
pub mod checkpoint;
pub mod collective;
pub mod data;
mod device;
pub mod replicas;
pub mod shard;
mod shard_record;
mod shared;
mod shim;
pub mod sync;
pub mod sync_batch_norm;
#[cfg(feature = "train")]
pub mod train;
mod wrap;

// What the program in the README uses; everything else is in the modules.
pub use burn_ddp_comm::{CommError, ProcessGroup, Result};
pub use data::distributed_sampler;
pub use shard::ShardedOptimizer;
pub use shared::config::{DdpConfig, ShardConfig};
pub use shared::session::{
    admit_joiners, destroy_process_group, init_process_group, reform_process_group,
};
pub use sync::sync_gradients;
pub use sync_batch_norm::{SyncBatchNorm, SyncBatchNormConfig};
pub use wrap::wrap;

pub use shared::modules::{config, group};

/// Stopping every rank at the same step on Ctrl-C or SIGTERM.
pub use burn_ddp_training::stop;

/// Going on after a rank is gone (with [`reform_process_group`]): whether
/// the launcher lets the others go on, and that the survivors stand at the
/// same step.
pub use burn_ddp_training::recovery;

/// Snapshots of a whole training state, for `--max-restarts` and `--resume`.
pub use burn_ddp_training::snapshots;

/// CUDA tensors over NCCL (feature `cuda`): each rank's GPU, NCCL itself.
#[cfg(feature = "cuda")]
pub mod cuda {
    pub use crate::device::cuda_device_for_rank;
    /// For a GPU check program: the bytes NCCL would be handed for a tensor.
    #[doc(hidden)]
    pub use crate::device::nccl_view;
    pub use burn_ddp_comm::nccl;
}

/// docs/burn-0.22.md's code blocks, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/burn-0.22.md")]
struct Burn022Guide;
