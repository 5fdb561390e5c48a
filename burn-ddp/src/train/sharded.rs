//! The Learner's optimizer sharded (ZeRO stage 1,
//! [`DdpTraining::with_sharded_optimizer`](crate::train::DdpTraining::with_sharded_optimizer)):
//! the strategy shards around the Learner's own optimizer. Each optimizer
//! step hands the Learner the averaged gradients of this rank's parameters
//! only (its optimizer steps and keeps state for those alone), then every
//! other parameter comes from its owner and the Learner takes the model
//! (Burn 0.21's records hold device tensors: no copy).
//!
//! Checkpoints: each rank saves its part of the state in parts (beside
//! Burn's files, whose `optim-N` then holds rank 0's part) and a resume on
//! any world size reads only what each rank keeps. Where the ranks do not
//! share one folder, every rank's part is gathered on rank 0 instead, which
//! lets Burn's checkpointer save the whole state. The Learner hands its
//! optimizer's record out only to a checkpointer, so one that captures it
//! is used to read it.

use crate::shard::share_values;
use crate::shard_record::{gather_whole, owned_part, record_from_entries, state_entries};
use crate::shared::shard::{ownership, scatter_gradients, trained_ids};
use crate::shared::sharded_checkpoint::{
    agree_loaded, open_parts, read_kept_state, save_parts, StateSink, Trained,
};
use crate::shared::train::quiet::SaveNow;
use crate::{shim, CommError, ProcessGroup, Result, ShardConfig};
use burn::module::Module;
use burn::optim::GradientsParams;
use burn::record::Record;
use burn::tensor::backend::Backend;
use burn::train::checkpoint::{AsyncCheckpointer, Checkpointer, CheckpointerError};
use burn::train::metric::store::EventStoreClient;
use burn::train::{Learner, LearnerOptimizerRecord, LearningCheckpointer, LearningComponentsTypes};
use burn_ddp_comm::Sharder;
use std::path::Path;
use std::sync::mpsc;

/// The sharded optimizer's owners and rounds, beside the Learner.
pub(super) struct ShardedLearning {
    sharder: Sharder,
    /// [`ShardConfig::max_grad_norm`].
    max_grad_norm: Option<f64>,
    /// Checkpoints in parts (every rank sees the checkpoint folder), or
    /// gathered whole on rank 0.
    in_parts: bool,
}

impl ShardedLearning {
    /// Sharding over `group` from the Learner as it starts (rank 0's
    /// parameters on every rank): this rank keeps its part of the optimizer
    /// state the Learner holds (all of it when resuming from a whole
    /// checkpoint), or reads its part from `parts` (resuming from a
    /// checkpoint in parts). `in_parts`: whether its checkpoints are saved
    /// in parts. Collective.
    pub fn start<LC: LearningComponentsTypes>(
        config: &ShardConfig,
        group: &ProcessGroup,
        learner: &mut Learner<LC>,
        store: &EventStoreClient,
        parts: Option<&Path>,
        in_parts: bool,
    ) -> Result<Self> {
        let mut sharder = config.sharder(group)?;
        let model = learner.model();
        let part = match parts {
            Some(dir) => {
                let kept = ownership(&mut sharder, shim::grad_walker(&model));
                let read = kept.and_then(|kept| read_parts::<LC>(group.rank(), &model, dir, &kept));
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
            max_grad_norm: config.max_grad_norm,
            in_parts,
        })
    }

    /// Whether this run's checkpoints are saved in parts.
    pub fn in_parts(&self) -> bool {
        self.in_parts
    }

    /// One optimizer step on this rank's local gradients: the averaged
    /// gradients of its own parameters to the Learner's optimizer, then
    /// every other parameter from its owner. Collective.
    pub fn step<LC: LearningComponentsTypes>(
        &mut self,
        learner: &mut Learner<LC>,
        grads: GradientsParams,
    ) -> Result<()> {
        let model = learner.model();
        let walk = shim::grad_walker(&model);
        let owned = scatter_gradients(&mut self.sharder, walk, grads, self.max_grad_norm)?;
        learner.optimizer_step(owned);
        let model = share_values(&mut self.sharder, learner.model())?;
        learner.load_model(model.into_record());
        Ok(())
    }

    /// Saves this rank's part of the optimizer state (and its share of the
    /// parameters) in parts into `dir`, for `epoch`'s checkpoint.
    /// Collective: every rank calls it when checkpoints are on.
    pub fn save_parts<LC: LearningComponentsTypes>(
        &mut self,
        learner: &Learner<LC>,
        store: &EventStoreClient,
        dir: &Path,
        epoch: usize,
    ) -> Result<()> {
        let group = self.sharder.group()?;
        let rank = group.rank();
        let model = learner.model();
        let trained = Trained::of(&ownership(&mut self.sharder, shim::grad_walker(&model))?);
        let record = optimizer_record(learner, store, rank)?;
        let positions = trained.positions;
        let state = move |sink: &mut StateSink<'_>, _: Option<&Path>| {
            state_entries::<LC::Backend, _>(rank, &positions, record, sink)
        };
        let info = format!("burn-ddp Learner, epoch {epoch}");
        save_parts(
            &group,
            dir,
            shim::walker(&model),
            &trained.owned,
            state,
            &info,
        )?;
        Ok(())
    }

    /// Gathers the whole optimizer state on rank 0, which runs Burn's
    /// checkpointer with it and then keeps its own part again (the ranks do
    /// not share a folder). Collective: every rank calls it when
    /// checkpoints are on.
    pub fn checkpoint_whole<LC: LearningComponentsTypes>(
        &mut self,
        learner: &mut Learner<LC>,
        checkpointer: &mut LearningCheckpointer<LC>,
        epoch: usize,
        store: &EventStoreClient,
    ) -> Result<()> {
        let rank = self.sharder.group()?.rank();
        let model = learner.model();
        let part = optimizer_record(learner, store, rank)?;
        let Some(whole) = gather_whole(&mut self.sharder, &model, part)? else {
            return Ok(());
        };
        // Records are not `Clone`; their items are (double precision: any
        // float type crosses exactly).
        let item = whole.into_item::<burn::record::DoublePrecisionSettings>();
        let device = model.devices().into_iter().next().unwrap_or_default();
        learner.load_optim(Record::from_item(item.clone(), &device));
        checkpointer.checkpoint(learner, epoch, store);
        let whole: LearnerOptimizerRecord<LC> = Record::from_item(item, &device);
        learner.load_optim(owned_part(&mut self.sharder, &model, whole)?);
        Ok(())
    }
}

/// The optimizer state this rank keeps (`kept`, by the model's trained
/// parameters) from the checkpoint in parts `dir`.
fn read_parts<LC: LearningComponentsTypes>(
    rank: usize,
    model: &LC::TrainingModel,
    dir: &Path,
    kept: &[(u64, bool)],
) -> Result<LearnerOptimizerRecord<LC>> {
    let checkpoint = open_parts(dir, rank, shim::walker(model))?;
    let (ids, entries) = read_kept_state(&checkpoint, kept)?;
    let device = model.devices().into_iter().next().unwrap_or_default();
    record_from_entries::<LC::Backend, _>(rank, &ids, entries, &device)
}

/// The whole optimizer state from the checkpoint in parts `dir` into an
/// unsharded Learner (resuming from a sharded run). Collective: an error
/// on every rank when one cannot read it.
pub(super) fn load_whole_state<LC: LearningComponentsTypes>(
    group: &ProcessGroup,
    learner: &mut Learner<LC>,
    dir: &Path,
) -> Result<()> {
    let model = learner.model();
    let every: Vec<(u64, bool)> = trained_ids(shim::grad_walker(&model))
        .into_iter()
        .map(|id| (id, true))
        .collect();
    let read = read_parts::<LC>(group.rank(), &model, dir, &every);
    learner.load_optim(agree_loaded(group, read)?);
    Ok(())
}

/// The Learner's optimizer state, read through a checkpointer that keeps
/// what it is asked to save (the model's and scheduler's records it is
/// handed are dropped).
fn optimizer_record<LC: LearningComponentsTypes>(
    learner: &Learner<LC>,
    store: &EventStoreClient,
    rank: usize,
) -> Result<LearnerOptimizerRecord<LC>> {
    let (sender, receiver) = mpsc::channel();
    let mut capture: LearningCheckpointer<LC> = LearningCheckpointer::new(
        AsyncCheckpointer::new(Keep(None)),
        AsyncCheckpointer::new(Keep(Some(sender))),
        AsyncCheckpointer::new(Keep(None)),
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

impl<R: Record<B>, B: Backend> Checkpointer<R, B> for Keep<R> {
    fn save(&self, _epoch: usize, record: R) -> std::result::Result<(), CheckpointerError> {
        if let Some(sender) = &self.0 {
            let _ = sender.send(record);
        }
        Ok(())
    }

    fn delete(&self, _epoch: usize) -> std::result::Result<(), CheckpointerError> {
        Ok(())
    }

    fn restore(
        &self,
        _epoch: usize,
        _device: &B::Device,
    ) -> std::result::Result<R, CheckpointerError> {
        Err(CheckpointerError::Unknown(
            "nothing to restore: this checkpointer only reads the state".into(),
        ))
    }
}
