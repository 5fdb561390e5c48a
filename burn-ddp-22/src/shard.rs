//! The sharded optimizer (ZeRO stage 1, PyTorch's `ZeroRedundancyOptimizer`)
//! for Burn 0.22: each rank keeps the optimizer state of the parameters it
//! owns (about 1/N of them, balanced by size), steps only those, and
//! receives every other parameter from its owner. One call replaces
//! `sync_gradients` + `optimizer.step`, with the bytes of one all-reduce.

use crate::shared::config::ShardConfig;
use crate::shared::shard::{gather_values, scatter_gradients};
use crate::{shim, ProcessGroup, Result, ShardPlan, SyncStats};
use burn::module::Module;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLearningRate;
use burn::optim::record::OptimizerRecord;
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn_ddp_comm::Sharder;

/// A Burn optimizer whose state is split across the ranks: each rank steps
/// and keeps state for the parameters it owns, and the updated parameters
/// are shared, so every rank ends with the parameters plain DDP would give
/// (to rounding) while holding about 1/N of the optimizer state.
///
/// ```no_run
/// use burn::nn::LinearConfig;
/// use burn::optim::{AdamWConfig, GradientsParams};
/// use burn::tensor::{Device, Tensor};
///
/// # fn main() -> burn_ddp_22::Result<()> {
/// let device = Device::default().autodiff();
/// let group = burn_ddp_22::init_process_group()?;
/// let mut model = burn_ddp_22::wrap(LinearConfig::new(10, 1).init(&device), &group)?;
/// let mut optimizer = burn_ddp_22::ShardedOptimizer::new(AdamWConfig::new().init(), &group)?;
/// for _step in 0..10 {
///     let loss = model.forward(Tensor::<2>::ones([32, 10], &device)).mean();
///     let grads = GradientsParams::from_grads(loss.backward(), &model); // local
///     model = optimizer.step(1e-3, model, grads)?; // average, step, share
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct ShardedOptimizer {
    inner: ModuleOptimizer,
    sharder: Sharder,
}

impl ShardedOptimizer {
    /// `inner` (any Burn optimizer: `SgdConfig::new().init()`, AdamW, with
    /// its gradient clipping and parameter groups) sharded over `group`.
    pub fn new(inner: ModuleOptimizer, group: &ProcessGroup) -> Result<Self> {
        Self::with_config(inner, group, &ShardConfig::new())
    }

    /// [`new`](Self::new) with the round sizes of `config`.
    pub fn with_config(
        inner: ModuleOptimizer,
        group: &ProcessGroup,
        config: &ShardConfig,
    ) -> Result<Self> {
        Ok(Self {
            inner,
            sharder: config.sharder(group)?,
        })
    }

    /// One step on this rank's local gradients `grads` (straight from
    /// `GradientsParams::from_grads`, not averaged): the gradients of the
    /// parameters this rank owns averaged over the ranks, the inner
    /// optimizer stepping those, every other parameter received from its
    /// owner. A parameter missing from `grads` counts as zero, as in
    /// [`crate::sync_gradients`]; in a world of one it is the inner
    /// optimizer's step exactly. Collective.
    ///
    /// Gradient accumulation: sum the micro-batches' `GradientsParams`
    /// (Burn's `GradientsAccumulator`) and call this once. Do not call
    /// `sync_gradients` first: it would average twice the bytes for the same
    /// result.
    pub fn step<M: Module>(
        &mut self,
        lr: impl Into<ModuleLearningRate>,
        model: M,
        grads: GradientsParams,
    ) -> Result<M> {
        let owned = scatter_gradients(&mut self.sharder, shim::grad_walker(&model), grads)?;
        let model = self.inner.step(lr, model, owned);
        let values = gather_values(&mut self.sharder, shim::grad_walker(&model))?;
        Ok(shim::install_values(model, values))
    }

    /// This rank's part of the optimizer state: the parameters it owns.
    pub fn to_record(&self) -> OptimizerRecord {
        self.inner.to_record()
    }

    /// The optimizer that steps this rank's parameters.
    pub fn inner(&self) -> &ModuleOptimizer {
        &self.inner
    }

    /// Who owns which parameter (by position among the trainable ones, in
    /// declaration order), as of the last step.
    pub fn plan(&self) -> &ShardPlan {
        self.sharder.plan()
    }

    /// What the sharded steps' collectives moved so far.
    pub fn stats(&self) -> SyncStats {
        self.sharder.stats()
    }
}
