//! The Learner's optimizer sharded (ZeRO stage 1,
//! [`DdpTraining::with_sharded_optimizer`](crate::train::DdpTraining::with_sharded_optimizer)):
//! the strategy shards around the Learner's own optimizer. Each optimizer
//! step hands the Learner the averaged gradients of this rank's parameters
//! only (its optimizer steps and keeps state for those alone), then every
//! other parameter comes from its owner. Burn 0.22's Learner keeps its model
//! private and takes a new one only as a host-memory record, so the current
//! model is kept here and the Learner's copy serves only for its optimizer
//! step (the parameters it does not own stay as they were there: memory
//! for one more copy of them, never read).
//!
//! Checkpoints: each rank saves its part of the state in parts (beside
//! Burn's files, whose `optim-N` then holds rank 0's part) and a resume on
//! any world size reads only what each rank keeps. Where the ranks do not
//! share one folder, every rank's part is gathered on rank 0 instead, which
//! lets Burn's checkpointer save the whole state. The Learner hands its
//! optimizer's record out only to a checkpointer, so one that captures it
//! is used to read it.

use crate::shard_record::{
    gather_whole, owned_part, record_bytes, record_from_bytes, record_from_entries, state_entries,
};
use crate::shared::shard::{gather_values, ownership, scatter_gradients, trained_ids};
use crate::shared::sharded_checkpoint::{
    agree_loaded, open_parts, read_kept_state, save_parts, StateSink, Trained,
};
use crate::shared::train::quiet::SaveNow;
use crate::{shim, CommError, ProcessGroup, Result, ShardConfig};
use burn::optim::lr_scheduler::LrSchedulerRecord;
use burn::optim::{GradientsParams, OptimizerRecord};
use burn::store::ModuleRecord;
use burn::train::checkpoint::{AsyncCheckpointer, Checkpoint, Checkpointer, CheckpointerError};
use burn::train::metric::store::EventStoreClient;
use burn::train::{Learner, LearnerModel, LearningCheckpointer};
use burn_ddp_comm::Sharder;
use std::path::Path;
use std::sync::mpsc;

/// The sharded optimizer's state beside the Learner: the owners and rounds,
/// and the current model.
pub(super) struct ShardedLearning<M> {
    sharder: Sharder,
    model: M,
    /// [`ShardConfig::max_grad_norm`].
    max_grad_norm: Option<f64>,
    /// Checkpoints in parts (every rank sees the checkpoint folder), or
    /// gathered whole on rank 0.
    in_parts: bool,
}

impl<M: LearnerModel> ShardedLearning<M> {
    /// Sharding over `group` from the Learner as it starts (rank 0's
    /// parameters on every rank): this rank keeps its part of the optimizer
    /// state the Learner holds (all of it when resuming from a whole
    /// checkpoint), or reads its part from `parts` (resuming from a
    /// checkpoint in parts). `in_parts`: whether its checkpoints are saved
    /// in parts. Collective.
    pub fn start(
        config: &ShardConfig,
        group: &ProcessGroup,
        learner: &mut Learner<M>,
        store: &EventStoreClient,
        parts: Option<&Path>,
        in_parts: bool,
    ) -> Result<Self> {
        let mut sharder = config.sharder(group)?;
        let model = learner.model();
        let part = match parts {
            Some(dir) => {
                let kept = ownership(&mut sharder, shim::grad_walker(&model));
                let read = kept.and_then(|kept| read_parts(group.rank(), &model, dir, &kept));
                agree_loaded(group, read)?
            }
            None => owned_part(
                &mut sharder,
                &model,
                optimizer_record(learner, store, group.rank())?,
            )?,
        };
        learner.load_optim(part);
        Ok(Self {
            sharder,
            model,
            max_grad_norm: config.max_grad_norm,
            in_parts,
        })
    }

    /// Whether this run's checkpoints are saved in parts.
    pub fn in_parts(&self) -> bool {
        self.in_parts
    }

    /// The current model (every parameter up to date).
    pub fn model(&self) -> &M {
        &self.model
    }

    /// One optimizer step on this rank's local gradients: the averaged
    /// gradients of its own parameters to the Learner's optimizer (with the
    /// scheduler's step, as burn-train 0.22 does), then every other
    /// parameter from its owner. Collective.
    pub fn step(&mut self, learner: &mut Learner<M>, grads: GradientsParams) -> Result<()> {
        let walk = shim::grad_walker(&self.model);
        let owned = scatter_gradients(&mut self.sharder, walk, grads, self.max_grad_norm)?;
        learner.lr_step();
        learner.optimizer_step(owned);
        let stepped = learner.model();
        let values = gather_values(&mut self.sharder, shim::grad_walker(&stepped))?;
        self.model = shim::install_values(stepped, values);
        Ok(())
    }

    /// Saves this rank's part of the optimizer state (and its share of the
    /// parameters) in parts into `dir`, for `epoch`'s checkpoint, and hands
    /// the Learner the current model for Burn's files. Collective: every
    /// rank calls it when checkpoints are on.
    pub fn save_parts(
        &mut self,
        learner: &mut Learner<M>,
        store: &EventStoreClient,
        dir: &Path,
        epoch: usize,
    ) -> Result<()> {
        let group = self.sharder.group()?;
        let rank = group.rank();
        let walk = shim::grad_walker(&self.model);
        let trained = Trained::of(&ownership(&mut self.sharder, walk)?);
        let record = optimizer_record(learner, store, rank)?;
        let positions = trained.positions;
        let state = move |sink: &mut StateSink<'_>, scratch: Option<&Path>| {
            state_entries(rank, &positions, record, rank == 0, scratch, sink)
        };
        let info = format!("burn-ddp Learner, epoch {epoch}");
        let walk = shim::walker(&self.model);
        save_parts(&group, dir, walk, &trained.owned, state, &info)?;
        learner.load_model(self.model.clone().into_record());
        Ok(())
    }

    /// Gathers the whole optimizer state on rank 0, which runs Burn's
    /// checkpointer with it (and the current model) and then keeps its own
    /// part again (the ranks do not share a folder). Collective: every rank
    /// calls it when checkpoints are on.
    pub fn checkpoint_whole(
        &mut self,
        learner: &mut Learner<M>,
        checkpointer: &mut LearningCheckpointer<M>,
        epoch: usize,
        store: &EventStoreClient,
    ) -> Result<()> {
        let rank = self.sharder.group()?.rank();
        let part = optimizer_record(learner, store, rank)?;
        let Some(whole) = gather_whole(&mut self.sharder, &self.model, part)? else {
            return Ok(());
        };
        let bytes = record_bytes(rank, whole)?;
        learner.load_optim(record_from_bytes(rank, bytes.clone())?);
        learner.load_model(self.model.clone().into_record());
        checkpointer.checkpoint(learner, epoch, store);
        let mine = owned_part(
            &mut self.sharder,
            &self.model,
            record_from_bytes(rank, bytes)?,
        )?;
        learner.load_optim(mine);
        Ok(())
    }

    /// The Learner with the current model, for the end of training.
    pub fn finish(self, learner: &mut Learner<M>) {
        learner.load_model(self.model.into_record());
    }
}

/// The optimizer state this rank keeps (`kept`, by the model's trained
/// parameters) from the checkpoint in parts `dir`.
fn read_parts<M: LearnerModel>(
    rank: usize,
    model: &M,
    dir: &Path,
    kept: &[(u64, bool)],
) -> Result<OptimizerRecord> {
    let checkpoint = open_parts(dir, rank, shim::walker(model))?;
    let (ids, entries) = read_kept_state(&checkpoint, kept)?;
    record_from_entries(rank, &ids, entries)
}

/// The whole optimizer state from the checkpoint in parts `dir` into an
/// unsharded Learner (resuming from a sharded run). Collective: an error
/// on every rank when one cannot read it.
pub(super) fn load_whole_state<M: LearnerModel>(
    group: &ProcessGroup,
    learner: &mut Learner<M>,
    dir: &Path,
) -> Result<()> {
    let model = learner.model();
    let every: Vec<(u64, bool)> = trained_ids(shim::grad_walker(&model))
        .into_iter()
        .map(|id| (id, true))
        .collect();
    let read = read_parts(group.rank(), &model, dir, &every);
    learner.load_optim(agree_loaded(group, read)?);
    Ok(())
}

/// The Learner's optimizer state, read through a checkpointer that keeps
/// what it is asked to save (the model's and scheduler's records it is
/// handed are dropped).
fn optimizer_record<M: LearnerModel>(
    learner: &Learner<M>,
    store: &EventStoreClient,
    rank: usize,
) -> Result<OptimizerRecord> {
    let (sender, receiver) = mpsc::channel();
    let mut capture: LearningCheckpointer<M> = LearningCheckpointer::new(
        AsyncCheckpointer::<ModuleRecord>::new(Keep(None)),
        AsyncCheckpointer::new(Keep(Some(sender))),
        AsyncCheckpointer::<LrSchedulerRecord>::new(Keep(None)),
        Box::new(SaveNow),
    );
    capture.checkpoint(learner, 0, store);
    // Dropping it waits for its threads: the record has been handed over.
    drop(capture);
    receiver.try_recv().map_err(|_| CommError::InvalidArgument {
        rank,
        message: "the Learner's checkpointer did not hand its optimizer's state over".into(),
    })
}

/// A checkpointer that sends what it saves to a channel (`None`: drops it).
struct Keep<R>(Option<mpsc::Sender<R>>);

impl<R: Checkpoint> Checkpointer<R> for Keep<R> {
    fn save(&self, _epoch: usize, record: R) -> std::result::Result<(), CheckpointerError> {
        if let Some(sender) = &self.0 {
            let _ = sender.send(record);
        }
        Ok(())
    }

    fn delete(&self, _epoch: usize) -> std::result::Result<(), CheckpointerError> {
        Ok(())
    }

    fn restore(&self, _epoch: usize) -> std::result::Result<R, CheckpointerError> {
        Err(CheckpointerError::Unknown(
            "nothing to restore: this checkpointer only reads the state".into(),
        ))
    }
}
