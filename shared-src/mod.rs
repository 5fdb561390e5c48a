//! The sources both Burn front-ends compile: burn-ddp (Burn 0.21) and
//! burn-ddp-22 (Burn 0.22 and 0.23) link this folder in as their `shared`
//! module (a symbolic link, so each published crate carries the files). What
//! a Burn version spells differently is named once, in each crate's own
//! `shim` module; nothing here names a Burn item the versions do not share.
//!
//! Written once: the dtype table, the configs, the module walk and what is
//! done with it (wrap, replicas, gradient sync), the gradient set the reducer
//! reads, the tensor collectives' host path, the session, and the Learner
//! glue (feature `train`).

pub(crate) mod checkpoint;
pub(crate) mod collective;
pub(crate) mod config;
pub(crate) mod contract;
#[cfg(feature = "cuda")]
pub(crate) mod device;
pub(crate) mod dtype;
pub(crate) mod gradients;
// For the device code (packed CUDA buffers), which not every build compiles.
#[allow(dead_code)]
pub(crate) mod layout;
pub(crate) mod modules;
pub(crate) mod replicas;
pub(crate) mod session;
pub(crate) mod shard;
pub(crate) mod sharded_checkpoint;
pub(crate) mod sync;
pub(crate) mod sync_batch_norm;
#[cfg(feature = "train")]
pub(crate) mod train;
pub(crate) mod walk;
pub(crate) mod wrap;
