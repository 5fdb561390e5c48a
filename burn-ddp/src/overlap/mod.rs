//! Gradient buckets that leave during backward (PyTorch DDP's overlap), for
//! `Ddp<B>` on Burn 0.21.
//!
//! - During the forward pass every op of `Ddp<B>` shows its float inputs to
//!   [`Uses`] ([`forward`]): on its first use in the step, a parameter of a
//!   model wrapped with `overlap_backward` is put behind a readiness
//!   [`hook`], and every later use in the step goes through the same hook.
//!   The hook's backward level is chosen so no other node's level changes:
//!   the deepest it can be under every use seen (this step's first use, and
//!   every use of the previous step), so the gradients are the same, bit for
//!   bit, as without it.
//! - `Ddp<B>::backward` begins a [`SyncRound`](burn_ddp_comm::SyncRound)
//!   for the first model wrapped with `overlap_backward` before Burn's
//!   backward ([`pass`], `crate::sync`); each hook hands its parameter's
//!   final gradient to the round, which sends every bucket as soon as it is
//!   complete, on its communication thread. After backward, the round reads
//!   the gradients no hook reported (parameters used on the inputs
//!   directly) and writes every average back.
//!
//! A step with a collective inside backward (SyncBatchNorm's sum, see
//! [`armed`]) sends no bucket early: two threads' collectives could
//! interleave differently on different ranks. docs/overlap.md has the rest.

pub(crate) mod armed;
pub(crate) mod asked;
pub(crate) mod forward;
pub(crate) mod hook;
pub(crate) mod pass;

pub(crate) use forward::Uses;
