//! The sharded optimizer (ZeRO stage 1, PyTorch's `ZeroRedundancyOptimizer`)
//! for Burn 0.21: each rank keeps the optimizer state of the parameters it
//! owns (about 1/N of them, balanced by size), steps only those, and
//! receives every other parameter from its owner.
//!
//! With `Ddp<B>`, run the backward passes under [`crate::no_sync`]: the
//! sharded step averages the gradients itself (a reduce-scatter), so an
//! all-reduce inside `backward()` would move the same gradients once more
//! for the same result.

use crate::shared::config::ShardConfig;
use crate::shared::session::SESSION;
use crate::shared::shard::{foreign_state, gather_values, ownership, scatter_gradients};
use crate::shared::walk::first_trainable;
use crate::tracking::WrappingScope;
use crate::{shim, CommError, ProcessGroup, Result, ShardPlan, SyncStats};
use burn::module::{AutodiffModule, ParamId};
use burn::optim::{GradientsParams, MultiGradientsParams, Optimizer};
use burn::record::{BinBytesRecorder, DoublePrecisionSettings, Record, Recorder};
use burn::tensor::backend::AutodiffBackend;
use burn_ddp_comm::Sharder;
use hashbrown::HashMap;
use std::marker::PhantomData;

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
    _backend: PhantomData<fn() -> B>,
}

impl<O: Clone, B> Clone for ShardedOptimizer<O, B> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            sharder: self.sharder.clone(),
            unsplit: self.unsplit,
            _backend: PhantomData,
        }
    }
}

/// The record of Burn 0.21's optimizers: one entry per parameter id.
type Keyed<R> = HashMap<ParamId, R>;

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
    pub fn try_step<M, R>(&mut self, lr: f64, model: M, grads: GradientsParams) -> Result<M>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B, Record = Keyed<R>>,
        R: Record<B>,
    {
        self.split(&model)?;
        let owned = scatter_gradients(&mut self.sharder, shim::grad_walker(&model), grads)?;
        let model = self.inner.step(lr, model, owned);
        let values = gather_values(&mut self.sharder, shim::grad_walker(&model))?;
        // The received parameters are the wrapped model's, as the ones the
        // inner optimizer replaced are (`Ddp<B>` follows them by scope).
        let scope = first_trainable(shim::walker(&model)).and_then(|id| SESSION.of_param(id));
        let _scope = scope.map(|scope| WrappingScope::enter(scope.id));
        Ok(shim::install_values(model, values))
    }

    /// The whole optimizer state, as one process training `model` with the
    /// inner optimizer would hold it, on rank 0 (`None` on the others):
    /// every rank's part, keyed by rank 0's parameter ids, so it loads into
    /// an unsharded optimizer beside rank 0's model record, or into a
    /// sharded one on any number of ranks. Collective: every rank calls it
    /// (PyTorch's `consolidate_state_dict` + `state_dict`).
    pub fn consolidate<M, R>(&mut self, model: &M) -> Result<Option<Keyed<R>>>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B, Record = Keyed<R>>,
        R: Record<B>,
    {
        self.split(model)?;
        let group = self.sharder.group()?;
        let ids = ownership(&mut self.sharder, shim::grad_walker(model))?;
        let part = self.inner.to_record();
        if group.world_size() == 1 {
            return Ok(Some(part));
        }
        // Parameter ids are each rank's own: the parts travel keyed by position.
        let position: HashMap<u64, usize> = ids
            .iter()
            .enumerate()
            .map(|(p, (id, _))| (*id, p))
            .collect();
        let mut by_position = Keyed::new();
        for (id, state) in part {
            let p = position
                .get(&id.val())
                .ok_or_else(|| foreign_state(group.rank(), id.val(), ids.len()))?;
            by_position.insert(ParamId::from(*p as u64), state);
        }
        let bytes = record_bytes(group.rank(), by_position)?;
        let Some(parts) = group.gather_bytes(0, &bytes)? else {
            return Ok(None);
        };
        let device = model.devices().into_iter().next().unwrap_or_default();
        let mut whole = Keyed::new();
        for bytes in parts {
            let part: Keyed<R> = recorder()
                .load(bytes, &device)
                .map_err(|err| record_error(0, err))?;
            for (p, state) in part {
                let (id, _) = ids
                    .get(p.val() as usize)
                    .ok_or_else(|| record_error(0, "a part names a parameter past the model's"))?;
                whole.insert(ParamId::from(*id), state);
            }
        }
        Ok(Some(whole))
    }

    /// Keeps only the state of the parameters this rank owns, once the
    /// inner optimizer may hold more; an entry for a parameter `model` does
    /// not have is an error (the same on every rank: they hold the same
    /// whole record).
    fn split<M, R>(&mut self, model: &M) -> Result<()>
    where
        M: AutodiffModule<B>,
        O: Optimizer<M, B, Record = Keyed<R>>,
        R: Record<B>,
    {
        if !self.unsplit {
            return Ok(());
        }
        let rank = self.sharder.group()?.rank();
        let ids = ownership(&mut self.sharder, shim::grad_walker(model))?;
        let record = self.inner.to_record();
        if !record.is_empty() {
            let owned: HashMap<u64, bool> = ids.iter().copied().collect();
            let mut kept = Keyed::new();
            for (id, state) in record {
                match owned.get(&id.val()) {
                    None => return Err(foreign_state(rank, id.val(), ids.len())),
                    Some(true) => {
                        kept.insert(id, state);
                    }
                    Some(false) => {}
                }
            }
            self.inner = self.inner.clone().load_record(kept);
        }
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

/// Records in transit: Burn's binary format at double precision, so f16,
/// bf16, f32 and f64 state all cross exactly.
fn recorder() -> BinBytesRecorder<DoublePrecisionSettings> {
    BinBytesRecorder::new()
}

fn record_bytes<B: AutodiffBackend, R: Record<B>>(rank: usize, record: R) -> Result<Vec<u8>> {
    Recorder::<B>::record(&recorder(), record, ()).map_err(|err| record_error(rank, err))
}

fn record_error(rank: usize, err: impl std::fmt::Display) -> CommError {
    CommError::InvalidArgument {
        rank,
        message: format!("the sharded optimizer's record: {err}"),
    }
}

/// Burn's [`Optimizer`], for the optimizers whose record is one entry per
/// parameter (all of Burn 0.21's: SGD, Adam, AdamW, RMSprop, AdaGrad...).
impl<O, M, B, R> Optimizer<M, B> for ShardedOptimizer<O, B>
where
    O: Optimizer<M, B, Record = Keyed<R>>,
    M: AutodiffModule<B>,
    B: AutodiffBackend,
    R: Record<B>,
{
    /// This rank's part of the state: the parameters it owns (the whole
    /// state: [`consolidate`](ShardedOptimizer::consolidate)).
    type Record = O::Record;

    /// [`try_step`](Self::try_step); a failed collective (a dead peer, ranks
    /// whose models differ) panics naming the rank, as `Ddp<B>::backward`
    /// does.
    fn step(&mut self, lr: f64, module: M, grads: GradientsParams) -> M {
        self.try_step(lr, module, grads)
            .unwrap_or_else(|err| panic!("sharded optimizer step: {err}"))
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
