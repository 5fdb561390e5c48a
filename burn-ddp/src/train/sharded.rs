//! The Learner's optimizer sharded (ZeRO stage 1,
//! [`DdpTraining::with_sharded_optimizer`](crate::train::DdpTraining::with_sharded_optimizer)):
//! the strategy shards around the Learner's own optimizer. Each optimizer
//! step hands the Learner the averaged gradients of this rank's parameters
//! only (its optimizer steps and keeps state for those alone), then every
//! other parameter comes from its owner and the Learner takes the model
//! (Burn 0.21's records hold device tensors: no copy).
//!
//! Checkpoints: every rank's part of the state is gathered on rank 0, which
//! lets Burn's checkpointer save the whole state (an unsharded Learner
//! resumes from it, on any number of ranks), then goes on with its part.
//! The Learner hands its optimizer's record out only to a checkpointer, so
//! one that captures it is used to read it.

use crate::shard::share_values;
use crate::shard_record::{gather_whole, owned_part};
use crate::shared::shard::scatter_gradients;
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
use std::sync::mpsc;

/// The sharded optimizer's owners and rounds, beside the Learner.
pub(super) struct ShardedLearning {
    sharder: Sharder,
    /// [`ShardConfig::max_grad_norm`].
    max_grad_norm: Option<f64>,
}

impl ShardedLearning {
    /// Sharding over `group` from the Learner as it starts (rank 0's
    /// parameters on every rank): of the optimizer state it holds (all of
    /// it when resuming), only this rank's part is kept.
    pub fn start<LC: LearningComponentsTypes>(
        config: &ShardConfig,
        group: &ProcessGroup,
        learner: &mut Learner<LC>,
        store: &EventStoreClient,
    ) -> Result<Self> {
        let mut sharder = config.sharder(group)?;
        let state = optimizer_record(learner, store, group.rank())?;
        let part = owned_part(&mut sharder, &learner.model(), state)?;
        learner.load_optim(part);
        Ok(Self {
            sharder,
            max_grad_norm: config.max_grad_norm,
        })
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

    /// Gathers the whole optimizer state on rank 0, which runs Burn's
    /// checkpointer with it and then keeps its own part again. Collective:
    /// every rank calls it when checkpoints are on.
    pub fn checkpoint<LC: LearningComponentsTypes>(
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
