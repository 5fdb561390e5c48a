//! The sharded optimizer (ZeRO stage 1, PyTorch's `ZeroRedundancyOptimizer`)
//! for Burn 0.22: each rank keeps the optimizer state of the parameters it
//! owns (about 1/N of them, balanced by size), steps only those, and
//! receives every other parameter from its owner. One call replaces
//! `sync_gradients` + `optimizer.step`, with the bytes of one all-reduce.

use crate::shard_record;
pub use crate::shared::config::ShardConfig;
use crate::shared::shard::{gather_values, ownership, scatter_gradients};
use crate::shared::sharded_checkpoint::{
    agree_loaded, open_parts, read_kept_state, read_values, save_parts, save_parts_in_background,
    StateSink, StateWriter, Trained,
};
use crate::shim;
use burn::module::Module;
use burn::optim::lr_scheduler::module_lr_scheduler::ModuleLearningRate;
use burn::optim::record::OptimizerRecord;
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn_ddp_comm::Sharder;
use burn_ddp_comm::{ProcessGroup, Result, SyncStats};
pub use burn_ddp_comm::{Round, RoundMode, ShardPlan};
pub use burn_ddp_training::sharded::BackgroundSave;
use std::path::{Path, PathBuf};

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
    /// Whether the inner optimizer may hold state for parameters this rank
    /// does not own (given whole, or loaded from a whole record): split at
    /// the next step or consolidation, when the model is known.
    unsplit: bool,
    /// [`ShardConfig::max_grad_norm`].
    max_grad_norm: Option<f64>,
}

impl ShardedOptimizer {
    /// `inner` (any Burn optimizer: `SgdConfig::new().init()`, AdamW, with
    /// its gradient clipping and parameter groups) sharded over `group`. An
    /// `inner` holding state (a whole record loaded into it, from any world
    /// size: `Checkpoint::load_optimizer`) keeps only this rank's part from
    /// the first step on.
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
            max_grad_norm: config.max_grad_norm,
            unsplit: true,
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
        self.split(&model)?;
        let walk = shim::grad_walker(&model);
        let owned = scatter_gradients(&mut self.sharder, walk, grads, self.max_grad_norm)?;
        let model = self.inner.step(lr, model, owned);
        let values = gather_values(&mut self.sharder, shim::grad_walker(&model))?;
        Ok(shim::install_values(model, values))
    }

    /// This rank's part of the optimizer state: the parameters it owns (the
    /// whole state: [`consolidate`](Self::consolidate)).
    pub fn to_record(&self) -> OptimizerRecord {
        self.inner.to_record()
    }

    /// Loads a whole record (from [`consolidate`](Self::consolidate) or an
    /// unsharded optimizer, saved on any number of ranks) or this rank's
    /// part; the next step keeps only what this rank owns. Load the model's
    /// record first: the entries are matched by parameter id.
    pub fn load_record(mut self, record: OptimizerRecord) -> Self {
        self.inner = self.inner.load_record(record);
        self.unsplit = true;
        self
    }

    /// The whole optimizer state, as one process training `model` with the
    /// inner optimizer would hold it, on rank 0 (`None` on the others): a
    /// plain `ModuleOptimizer` holding every rank's part, keyed by rank 0's
    /// parameter ids, to save beside rank 0's model
    /// (`checkpoint::save_atomic(path, &model, whole.as_ref(), epoch)`) and
    /// load into an unsharded optimizer, or a sharded one on any number of
    /// ranks. Collective: every rank calls it (PyTorch's
    /// `consolidate_state_dict` + `state_dict`).
    pub fn consolidate<M: Module>(&mut self, model: &M) -> Result<Option<ModuleOptimizer>> {
        self.split(model)?;
        let part = self.inner.to_record();
        let whole = shard_record::gather_whole(&mut self.sharder, model, part)?;
        Ok(whole.map(|whole| self.inner.clone().load_record(whole)))
    }

    /// Saves `model` and this optimizer's state as a checkpoint in parts in
    /// the folder `dir` (PyTorch's `torch.distributed.checkpoint.save`):
    /// each rank writes the state of the parameters it owns and their
    /// values (rank 0 the untrained ones too), so no rank holds more than
    /// its part, and rank 0 writes a small `metadata.json` last. `dir` must
    /// not exist yet and every rank must see it (a shared file system);
    /// `info` (the epoch, the step) comes back from
    /// [`load_parts`](Self::load_parts). The checkpoint counts only once
    /// whole: a crash at any moment leaves the earlier ones as they were.
    /// Collective; an error on every rank, naming the rank that failed.
    pub fn save_parts<M: Module>(
        &mut self,
        model: &M,
        dir: impl AsRef<Path>,
        info: &str,
    ) -> Result<PathBuf> {
        let (group, owned, state) = self.prepare_save(model)?;
        save_parts(
            &group,
            dir.as_ref(),
            shim::walker(model),
            &owned,
            state,
            info,
        )
    }

    /// [`save_parts`](Self::save_parts) written in the background
    /// (PyTorch's `async_save`): what this rank saves is copied into memory
    /// now, between steps, and a thread writes it while training goes on.
    /// [`finish`](BackgroundSave::finish) the save it returns (every rank,
    /// at the same point of the program: it commits, collectively) before
    /// the next one. Holds a copy of this rank's part until then.
    /// Collective.
    pub fn save_parts_in_background<M: Module>(
        &mut self,
        model: &M,
        dir: impl AsRef<Path>,
        info: &str,
    ) -> Result<BackgroundSave> {
        let (group, owned, state) = self.prepare_save(model)?;
        let walk = shim::walker(model);
        save_parts_in_background(&group, dir.as_ref(), walk, &owned, state, info)
    }

    /// What a save of `model` needs: the group, which trained parameters
    /// this rank owns, and its optimizer state, serialised entry by entry
    /// when the save asks (a copy of the record, owned: a thread may do it).
    #[allow(clippy::type_complexity)] // one tuple, taken apart at once
    fn prepare_save<M: Module>(
        &mut self,
        model: &M,
    ) -> Result<(ProcessGroup, Vec<bool>, impl StateWriter + Send + 'static)> {
        self.split(model)?;
        let group = self.sharder.group()?;
        let trained = Trained::of(&ownership(&mut self.sharder, shim::grad_walker(model))?);
        let (rank, positions, record) = (group.rank(), trained.positions, self.inner.to_record());
        let state = move |sink: &mut StateSink<'_>, scratch: Option<&Path>| {
            shard_record::state_entries(rank, &positions, record, rank == 0, scratch, sink)
        };
        Ok((group, trained.owned, state))
    }

    /// Loads a checkpoint in parts (saved by [`save_parts`](Self::save_parts)
    /// on any number of ranks) into `model` and this optimizer: every
    /// parameter's value, and the state of the parameters this rank owns in
    /// this world, each read alone from its part, so no rank reads the
    /// whole state. Returns the model and the `info` it was saved with.
    /// Collective; an error on every rank if any rank could not load.
    pub fn load_parts<M: Module>(
        &mut self,
        model: M,
        dir: impl AsRef<Path>,
    ) -> Result<(M, String)> {
        let group = self.sharder.group()?;
        let loaded = self.read_parts(group.rank(), model, dir.as_ref());
        let (model, record, info) = agree_loaded(&group, loaded)?;
        self.inner = self.inner.clone().load_record(record);
        self.unsplit = false;
        Ok((model, info))
    }

    fn read_parts<M: Module>(
        &mut self,
        rank: usize,
        model: M,
        dir: &Path,
    ) -> Result<(M, OptimizerRecord, String)> {
        let checkpoint = open_parts(dir, rank, shim::walker(&model))?;
        let model = read_values(&checkpoint, rank, |r| shim::rewrite(model, r))?;
        let kept = ownership(&mut self.sharder, shim::grad_walker(&model))?;
        let (ids, entries) = read_kept_state(&checkpoint, &kept)?;
        let record = shard_record::record_from_entries(rank, &ids, entries)?;
        Ok((model, record, checkpoint.info().to_string()))
    }

    /// Keeps only the state of the parameters this rank owns, once the
    /// inner optimizer may hold more; an entry for a parameter `model` does
    /// not have is an error (the same on every rank: they hold the same
    /// whole record).
    fn split<M: Module>(&mut self, model: &M) -> Result<()> {
        if !self.unsplit {
            return Ok(());
        }
        let kept = shard_record::owned_part(&mut self.sharder, model, self.inner.to_record())?;
        self.inner = self.inner.clone().load_record(kept);
        self.unsplit = false;
        Ok(())
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
