//! The sharded optimizer (ZeRO stage 1, PyTorch's `ZeroRedundancyOptimizer`)
//! for Burn 0.21: each rank keeps the optimizer state of the parameters it
//! owns (about 1/N of them, balanced by size), steps only those, and
//! receives every other parameter from its owner.
//!
//! With `Ddp<B>`, run the backward passes under [`crate::no_sync`]: the
//! sharded step averages the gradients itself (a reduce-scatter), so an
//! all-reduce inside `backward()` would move the same gradients once more
//! for the same result.

use crate::shard_record::{gather_whole, owned_part, record_from_entries, state_entries};
pub use crate::shared::config::ShardConfig;
use crate::shared::session::SESSION;
use crate::shared::shard::{gather_values, ownership, scatter_gradients};
use crate::shared::sharded_checkpoint::{
    agree_loaded, open_parts, read_kept_state, read_values, save_parts, save_parts_in_background,
    StateSink, StateWriter, Trained,
};
use crate::shared::walk::first_trainable;
use crate::shim;
use crate::tracking::WrappingScope;
use burn::module::AutodiffModule;
use burn::optim::{GradientsParams, MultiGradientsParams, Optimizer};
use burn::tensor::backend::AutodiffBackend;
use burn_ddp_comm::Sharder;
use burn_ddp_comm::{ProcessGroup, Result, SyncStats};
pub use burn_ddp_comm::{Round, RoundMode, ShardPlan};
pub use burn_ddp_training::sharded::BackgroundSave;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

/// A Burn optimizer whose state is split across the ranks: each rank steps
/// and keeps state for the parameters it owns, and the updated parameters
/// are shared, so every rank ends with the parameters plain DDP would give
/// (to rounding) while holding about 1/N of the optimizer state. It is an
/// [`Optimizer`] itself, so it goes wherever the inner one went.
///
/// ```no_run
/// use burn::backend::{Autodiff, NdArray};
/// use burn::nn::LinearConfig;
/// use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
/// use burn::tensor::Tensor;
/// type B = burn_ddp::Ddp<Autodiff<NdArray>>;
///
/// # fn main() -> burn_ddp::Result<()> {
/// let device = Default::default();
/// let group = burn_ddp::init_process_group()?;
/// let mut model = burn_ddp::wrap(LinearConfig::new(10, 1).init::<B>(&device), &group)?;
/// let mut optimizer = burn_ddp::ShardedOptimizer::new(AdamWConfig::new().init(), &group)?;
/// for _step in 0..10 {
///     let loss = model.forward(Tensor::<B, 2>::ones([32, 10], &device)).mean();
///     let grads = {
///         let _local = burn_ddp::no_sync(); // the sharded step averages
///         GradientsParams::from_grads(loss.backward(), &model)
///     };
///     model = optimizer.step(1e-3, model, grads); // average, step, share
/// }
/// # Ok(())
/// # }
/// ```
pub struct ShardedOptimizer<O, B> {
    inner: O,
    sharder: Sharder,
    /// Whether the inner optimizer may hold state for parameters this rank
    /// does not own (given whole, or loaded from a whole record): split at
    /// the next step or consolidation, when the model is known.
    unsplit: bool,
    /// [`ShardConfig::max_grad_norm`].
    max_grad_norm: Option<f64>,
    _backend: PhantomData<fn() -> B>,
}

impl<O: Clone, B> Clone for ShardedOptimizer<O, B> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            sharder: self.sharder.clone(),
            unsplit: self.unsplit,
            max_grad_norm: self.max_grad_norm,
            _backend: PhantomData,
        }
    }
}

impl<O, B: AutodiffBackend> ShardedOptimizer<O, B> {
    /// `inner` (any Burn optimizer: `SgdConfig::new().init()`, AdamW, with
    /// its gradient clipping) sharded over `group`. An `inner` holding state
    /// (a whole record loaded into it, from any world size) keeps only this
    /// rank's part from the first step on.
    pub fn new(inner: O, group: &ProcessGroup) -> Result<Self> {
        Self::with_config(inner, group, &ShardConfig::new())
    }

    /// [`new`](Self::new) with the round sizes of `config`.
    pub fn with_config(inner: O, group: &ProcessGroup, config: &ShardConfig) -> Result<Self> {
        Ok(Self {
            inner,
            sharder: config.sharder(group)?,
            max_grad_norm: config.max_grad_norm,
            unsplit: true,
            _backend: PhantomData,
        })
    }

    /// [`Optimizer::step`], with a failed collective as an error instead of
    /// a panic: this rank's local gradients averaged for the parameters it
    /// owns, the inner optimizer stepping those, every other parameter
    /// received from its owner. A parameter missing from `grads` counts as
    /// zero; in a world of one it is the inner optimizer's step exactly.
    /// Collective.
    pub fn try_step<M>(&mut self, lr: f64, model: M, grads: GradientsParams) -> Result<M>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        self.split(&model)?;
        let walk = shim::grad_walker(&model);
        let owned = scatter_gradients(&mut self.sharder, walk, grads, self.max_grad_norm)?;
        let model = self.inner.step(lr, model, owned);
        share_values(&mut self.sharder, model)
    }

    /// The whole optimizer state, as one process training `model` with the
    /// inner optimizer would hold it, on rank 0 (`None` on the others):
    /// every rank's part, keyed by rank 0's parameter ids, so it loads into
    /// an unsharded optimizer beside rank 0's model record, or into a
    /// sharded one on any number of ranks. Collective: every rank calls it
    /// (PyTorch's `consolidate_state_dict` + `state_dict`).
    pub fn consolidate<M>(&mut self, model: &M) -> Result<Option<O::Record>>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        self.split(model)?;
        gather_whole(&mut self.sharder, model, self.inner.to_record())
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
    pub fn save_parts<M>(&mut self, model: &M, dir: impl AsRef<Path>, info: &str) -> Result<PathBuf>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
        O::Record: 'static,
    {
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
    pub fn save_parts_in_background<M>(
        &mut self,
        model: &M,
        dir: impl AsRef<Path>,
        info: &str,
    ) -> Result<BackgroundSave>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
        O::Record: 'static,
    {
        let (group, owned, state) = self.prepare_save(model)?;
        let walk = shim::walker(model);
        save_parts_in_background(&group, dir.as_ref(), walk, &owned, state, info)
    }

    /// What a save of `model` needs: the group, which trained parameters
    /// this rank owns, and its optimizer state, serialised entry by entry
    /// when the save asks (a copy of the record, owned: a thread may do it).
    #[allow(clippy::type_complexity)] // one tuple, taken apart at once
    fn prepare_save<M>(
        &mut self,
        model: &M,
    ) -> Result<(ProcessGroup, Vec<bool>, impl StateWriter + Send + 'static)>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
        O::Record: 'static,
    {
        self.split(model)?;
        let group = self.sharder.group()?;
        let trained = Trained::of(&ownership(&mut self.sharder, shim::grad_walker(model))?);
        let (rank, positions, record) = (group.rank(), trained.positions, self.inner.to_record());
        let state = move |sink: &mut StateSink<'_>, _: Option<&Path>| {
            state_entries::<B, _>(rank, &positions, record, sink)
        };
        Ok((group, trained.owned, state))
    }

    /// Loads a checkpoint in parts (saved by [`save_parts`](Self::save_parts)
    /// on any number of ranks) into `model` and this optimizer: every
    /// parameter's value, and the state of the parameters this rank owns in
    /// this world, each read alone from its part, so no rank reads the
    /// whole state. Returns the model and the `info` it was saved with.
    /// Collective; an error on every rank if any rank could not load.
    pub fn load_parts<M>(&mut self, model: M, dir: impl AsRef<Path>) -> Result<(M, String)>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let group = self.sharder.group()?;
        let loaded = self.read_parts(group.rank(), model, dir.as_ref());
        let (model, record, info) = agree_loaded(&group, loaded)?;
        self.inner = self.inner.clone().load_record(record);
        self.unsplit = false;
        Ok((model, info))
    }

    fn read_parts<M>(&mut self, rank: usize, model: M, dir: &Path) -> Result<(M, O::Record, String)>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        let checkpoint = open_parts(dir, rank, shim::walker(&model))?;
        let model = read_values(&checkpoint, rank, |r| shim::rewrite(model, r))?;
        let kept = ownership(&mut self.sharder, shim::grad_walker(&model))?;
        let (ids, entries) = read_kept_state(&checkpoint, &kept)?;
        let device = model.devices().into_iter().next().unwrap_or_default();
        let record = record_from_entries::<B, O::Record>(rank, &ids, entries, &device)?;
        Ok((model, record, checkpoint.info().to_string()))
    }

    /// Keeps only the state of the parameters this rank owns, once the
    /// inner optimizer may hold more; an entry for a parameter `model` does
    /// not have is an error (the same on every rank: they hold the same
    /// whole record).
    fn split<M>(&mut self, model: &M) -> Result<()>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B>,
    {
        if !self.unsplit {
            return Ok(());
        }
        let part = owned_part(&mut self.sharder, model, self.inner.to_record())?;
        self.inner = self.inner.clone().load_record(part);
        self.unsplit = false;
        Ok(())
    }

    /// The optimizer that steps this rank's parameters.
    pub fn inner(&self) -> &O {
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

/// Every other parameter of `model` (just stepped, this rank's own) from
/// its owner. Collective.
pub(crate) fn share_values<B: AutodiffBackend, M: AutodiffModule<B>>(
    sharder: &mut Sharder,
    model: M,
) -> Result<M> {
    let values = gather_values(sharder, shim::grad_walker(&model))?;
    // The received parameters are the wrapped model's, as the ones the inner
    // optimizer replaced are (`Ddp<B>` follows them by scope).
    let scope = first_trainable(shim::walker(&model)).and_then(|id| SESSION.of_param(id));
    let _scope = scope.map(|scope| WrappingScope::enter(scope.id));
    Ok(shim::install_values(model, values))
}

/// Burn's [`Optimizer`]. Checkpoints need a record keyed by parameter, as
/// all of Burn 0.21's optimizers have (SGD, Adam, AdamW, RMSprop,
/// AdaGrad...).
impl<O, M, B> Optimizer<M, B> for ShardedOptimizer<O, B>
where
    O: Optimizer<M, B>,
    M: AutodiffModule<B>,
    B: AutodiffBackend,
{
    /// This rank's part of the state: the parameters it owns (the whole
    /// state: [`consolidate`](ShardedOptimizer::consolidate)).
    type Record = O::Record;

    /// [`try_step`](Self::try_step); a failed collective (a dead peer, ranks
    /// whose models differ) panics naming the rank, as `Ddp<B>::backward`
    /// does.
    fn step(&mut self, lr: f64, module: M, grads: GradientsParams) -> M {
        self.try_step(lr, module, grads).unwrap_or_else(|err| {
            burn_ddp_training::failure::panic_with_message(format!("sharded optimizer step: {err}"))
        })
    }

    fn step_multi(&mut self, lr: f64, module: M, grads: MultiGradientsParams) -> M {
        let grads = shim::merge_multi(&module, grads);
        Optimizer::step(self, lr, module, grads)
    }

    fn to_record(&self) -> O::Record {
        self.inner.to_record()
    }

    /// Loads a whole record (from [`consolidate`](ShardedOptimizer::consolidate)
    /// or an unsharded optimizer, saved on any number of ranks) or this
    /// rank's part; the next step keeps only what this rank owns. Load the
    /// model's record first: the entries are matched by parameter id.
    fn load_record(mut self, record: O::Record) -> Self {
        self.inner = self.inner.load_record(record);
        self.unsplit = true;
        self
    }
}
