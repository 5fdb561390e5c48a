//! Distributed Data Parallel training for Burn.
//!
//! One process per device; after `backward()` the gradients are all-reduced and
//! averaged across processes, so every replica takes the same optimizer step.
//! This crate is the user-facing layer: it re-exports the process group from
//! `burn-ddp-comm` and adds collectives on Burn tensors.

#![warn(missing_docs)]

mod collective;
pub mod data;
mod global;

pub use burn_ddp_comm::{
    env::LaunchEnv, CommError, Launcher, ProcessGroup, ProcessGroupBuilder, ReduceOp, Result,
};
pub use collective::{all_gather, all_reduce, broadcast, reduce_scatter};
pub use data::{distributed_sampler, evaluation_sampler, sum_over_ranks};
pub use global::{default_group, destroy_process_group, init_process_group};
