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
mod collective;
pub mod data;
mod device;
mod no_sync;
mod replicas;
mod shard;
mod shard_record;
mod shared;
mod shim;
pub(crate) mod sync;
pub mod sync_batch_norm;
pub mod tracking;
#[cfg(feature = "train")]
pub mod train;
pub(crate) mod wrap;

// The shared sources, where the crate's own modules name them.
use shared::dtype;

pub use autograd::{all_reduce_sum_tracked, enable_sync_batch_norm, AutodiffCollectives};
pub use backend::Ddp;
#[cfg(feature = "cuda")]
pub use burn_ddp_comm::nccl;
pub use burn_ddp_comm::{
    CollectiveBackend, CommError, Element, LaunchEnv, Launcher, ParamLayout, ProcessGroup,
    ProcessGroupBuilder, ReduceOp, Reducer, Result, Round, RoundMode, ShardPlan, SyncStats,
    WeakProcessGroup, BACKEND_VAR,
};
pub use burn_ddp_training::snapshots;
pub use burn_ddp_training::stop::{catch_stop_signals, stop_requested, stop_signal};
pub use collective::{all_gather, all_reduce, broadcast, reduce_scatter};
pub use data::{
    batch_size_per_rank, distributed_sampler, evaluation_sampler, sum_over_ranks, RankSum,
};
#[doc(hidden)]
#[cfg(feature = "cuda")]
pub use device::nccl_view;
#[cfg(feature = "cuda")]
pub use device::{cuda_device_for_rank, FusedCuda, PlainCuda};
pub use replicas::{check_replicas, parameters_fingerprint};
pub use shard::ShardedOptimizer;
pub use shared::config::{BucketConfig, GradientCompression, ShardConfig};
pub use shared::session::{
    default_group, destroy_process_group, init_process_group, reset_sync_stats, sync_stats,
};
pub use sync::{no_sync, no_sync_for, sync_enabled, sync_gradients, sync_stats_of, NoSyncGuard};
pub use sync_batch_norm::{sync_batch_norm, SyncBatchNorm, SyncBatchNormConfig};
pub use tracking::TrackedAutodiff;
pub use wrap::wrap;

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
