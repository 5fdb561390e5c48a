//! Distributed Data Parallel training for Burn.
//!
//! One process per device; after `backward()` the gradients are all-reduced and
//! averaged across processes, so every replica takes the same optimizer step.
//!
//! ```no_run
//! use burn::backend::{Autodiff, NdArray};
//! use burn::nn::LinearConfig;
//! use burn::optim::{GradientsParams, Optimizer, SgdConfig};
//! use burn::tensor::Tensor;
//!
//! type B = burn_ddp::Ddp<Autodiff<NdArray>>; // was Autodiff<NdArray>
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let device = Default::default();
//!     let group = burn_ddp::init_process_group()?; // RANK, WORLD_SIZE, MASTER_ADDR, ...
//!     let mut model = burn_ddp::wrap(LinearConfig::new(10, 1).init::<B>(&device), &group)?;
//!     let mut optimizer = SgdConfig::new().init();
//!     for _step in 0..10 {
//!         let x = Tensor::<B, 2>::ones([32, 10], &device); // this rank's batch
//!         let loss = model.forward(x).powi_scalar(2).mean();
//!         // The usual loop: backward() returns gradients averaged over all ranks.
//!         let grads = GradientsParams::from_grads(loss.backward(), &model);
//!         model = optimizer.step(0.01, model, grads);
//!     }
//!     burn_ddp::destroy_process_group()?;
//!     Ok(())
//! }
//! ```
//!
//! Launch it with `burn-ddp-run --standalone --nproc-per-node 2 PROGRAM`
//! (or torchrun, `mpirun`, `srun`); run alone, it is a world of one.
//!
//! Training through Burn's Learner instead of a hand-written loop: enable the
//! `train` feature and see the `train` module (`.ddp(&ddp)` on `SupervisedTraining`).
//!
//! A model with batch norm: [`SyncBatchNorm`] in place of Burn's `BatchNorm`
//! normalises by the whole global batch (one small all-reduce per layer and
//! direction), so N ranks x b still equal one process x N·b.
//!
//! Layers: `burn-ddp-comm` (environment, store, transports, process group,
//! reducer) knows nothing of Burn; this crate is the Burn 0.21 front-end: it
//! moves Burn tensors in and out of the reducer's buckets, finds the
//! parameters, and offers collectives on tensors, the `Ddp<B>` backend, model
//! wrapping, data sharding and the Learner strategy.

#![deny(missing_docs)]

mod autograd;
mod backend;
pub mod checkpoint;
pub mod collective;
pub mod data;
mod device;
mod no_sync;
mod overlap;
pub mod replicas;
pub mod shard;
mod shard_record;
mod shared;
mod shim;
pub mod sync;
pub mod sync_batch_norm;
mod tracking;
#[cfg(feature = "train")]
pub mod train;
mod wrap;

// What the program in the README uses; everything else is in the modules.
pub use backend::Ddp;
pub use burn_ddp_comm::{CommError, ProcessGroup, Result};
pub use data::distributed_sampler;
pub use shard::ShardedOptimizer;
pub use shared::config::ShardConfig;
pub use shared::session::{
    admit_joiners, destroy_process_group, init_process_group, reform_process_group,
};
pub use sync::no_sync;
pub use sync_batch_norm::{SyncBatchNorm, SyncBatchNormConfig};
pub use wrap::wrap;

pub use shared::modules::{config, group};

/// `Ddp<B>` and what it builds on: the backend that averages gradients inside
/// `backward()`, the autodiff backends it decorates, and the differentiable
/// sum over the ranks (SyncBatchNorm's).
pub mod autodiff {
    pub use crate::autograd::{enable_sync_batch_norm, AutodiffCollectives};
    pub use crate::backend::Ddp;
    pub use crate::tracking::{tracked_parameters, TrackedAutodiff};
}

/// Stopping every rank at the same step on Ctrl-C or SIGTERM.
pub use burn_ddp_training::stop;

/// Going on after a rank is gone (with [`reform_process_group`]): whether
/// the launcher lets the others go on, and that the survivors stand at the
/// same step.
pub use burn_ddp_training::recovery;

/// Snapshots of a whole training state, for `--max-restarts` and `--resume`.
pub use burn_ddp_training::snapshots;

/// CUDA tensors over NCCL (feature `cuda`): each rank's GPU, the CUDA
/// backends `Ddp<B>` averages on the device, NCCL itself.
#[cfg(feature = "cuda")]
pub mod cuda {
    #[doc(hidden)]
    pub use crate::device::nccl_view;
    pub use crate::device::{cuda_device_for_rank, FusedCuda, PlainCuda};
    pub use burn_ddp_comm::nccl;
}

/// How gradients are synchronised; defaults follow PyTorch's DDP.
///
/// ```no_run
/// use burn::config::Config;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # type B = burn_ddp::Ddp<burn::backend::Autodiff<burn::backend::NdArray>>;
/// # let model = burn::nn::LinearConfig::new(4, 2).init::<B>(&Default::default());
/// let group = burn_ddp::init_process_group()?;
/// let config = burn_ddp::DdpConfig::new().with_bucket_cap_mb(50.0);
/// config.save("ddp.json")?;
/// let model = config.wrap(model, &group)?; // as DistributedDataParallel(model, bucket_cap_mb=50)
/// # Ok(())
/// # }
/// ```
#[doc(inline)]
pub use shared::config::DdpConfig;

/// docs/training.md's code blocks, compiled (and the first one run) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/training.md")]
struct TrainingGuide;

/// docs/learner.md's code blocks, compiled as doctests.
#[cfg(all(doctest, feature = "train"))]
#[doc = include_str!("../../docs/learner.md")]
struct LearnerGuide;
