//! The hand-written training loops' shared parts (the toy and MNIST
//! trainers, on both Burn versions). What a loop needs of a program is the
//! [`Training`] trait (the model, its optimizer, the loader's batches, one
//! training step) and of its Burn version [`BurnVersion`] (seeding, `wrap`,
//! checkpoints), each implemented in that Burn's spelling; the rest (each
//! rank's batch, the resume, the agreed stop) is written here once.

use crate::front_end::FrontEnd;
use crate::stopped::Stopped;
use crate::{fail, resume, run_config};
use burn_ddp_comm::ProcessGroup;
use burn_ddp_training::snapshots::LoadError;
use burn_ddp_training::stop;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::error::Error;
use std::path::{Path, PathBuf};

/// A Burn version's program: the front-end crate it trains with.
pub trait Program {
    /// `burn_ddp`'s functions on Burn 0.21, `burn_ddp_22`'s on 0.22.
    const FRONT_END: FrontEnd;
}

/// One epoch's batches from a loader, each one or the loader's error.
pub type Batches<'a, B> = Box<dyn Iterator<Item = Result<B, String>> + 'a>;

/// Why a checkpoint could not be written (the front-end's `CheckpointError`).
pub type SaveError = Box<dyn Error + Send + Sync>;

/// The file a checkpoint was written to, or why it was not.
pub type Saved = Result<PathBuf, SaveError>;

/// A training step whose gradient average failed (a rank is gone): the
/// model as it was before the step, and why.
pub struct Failed<M> {
    /// The model, not updated.
    pub model: M,
    /// The failure.
    pub error: burn_ddp_comm::CommError,
}

/// What one training step leaves.
pub struct Step<M> {
    /// The model after the optimizer's update.
    pub model: M,
    /// This rank's loss on its batch (before the update).
    pub loss: f64,
    /// The batch's items.
    pub samples: usize,
}

/// What a Burn version does alike for every model `M` trained with
/// optimizer `O`: seeding, `wrap`, checkpoints, the fingerprint (each
/// version's programs implement it once, for all their models).
pub trait BurnVersion<M, O> {
    /// Checkpoint files' extension (`mpk` on Burn 0.21, `ckpt` on 0.22).
    const EXTENSION: &'static str;

    /// Seeds the backend's generator (the initial weights).
    fn seed(&self, seed: u64);
    /// `wrap(model, group)`: rank 0's weights on every rank, gradients averaged.
    fn wrap(&self, model: M, group: &ProcessGroup) -> burn_ddp_comm::Result<M>;
    /// `model` and `optimizer` with a snapshot's values, and its epochs done.
    fn load(&self, path: &Path, model: M, optimizer: O) -> Result<(M, O, usize), LoadError>;
    /// Writes a snapshot (model, optimizer, epochs done) atomically; the file.
    fn save(&self, path: &Path, model: &M, optimizer: &O, epochs: usize) -> Saved;
    /// Writes the model alone atomically (the trained one); the file.
    fn save_model(&self, path: &Path, model: &M, epochs: usize) -> Saved;
    /// A digest of every parameter: equal exactly when the values are.
    fn fingerprint(&self, model: &M) -> u64;
    /// Every float parameter's values, in order (`replicas::parameter_values`).
    fn parameter_values(&self, model: &M) -> Vec<f32>;
    /// Rank 0's model and optimizer state on every rank
    /// (`replicas::share_training_state`).
    fn share_state(&self, state: (M, O), group: &ProcessGroup) -> burn_ddp_comm::Result<(M, O)>;
}

/// What a hand-written training loop needs of a program: its model and
/// optimizer, its loader's batches, one training step, each in its Burn's
/// API (`Tensor<B, D>` and `Ddp<B>` on 0.21, `Tensor<D>` and
/// `sync_gradients` on 0.22), and its Burn's [`BurnVersion`].
pub trait Training: Program {
    /// The model (before and after `wrap`).
    type Model;
    /// The optimizer, with its state.
    type Optimizer;
    /// One training batch.
    type Batch;
    /// This rank's training loader.
    type Loader;
    /// Seeding, `wrap`, checkpoints, the fingerprint.
    type Burn: BurnVersion<Self::Model, Self::Optimizer>;

    /// This program's [`BurnVersion`] (its device).
    fn burn(&self) -> &Self::Burn;
    /// A new model and optimizer.
    fn init(&self) -> (Self::Model, Self::Optimizer);
    /// The loader's batches for one epoch (the sampler's epoch set first).
    fn batches<'a>(&self, loader: &'a Self::Loader) -> Batches<'a, Self::Batch>;
    /// Forward, loss, backward, gradients averaged over the ranks, update;
    /// a failed average gives the model back, not updated.
    fn train_step(
        &self,
        model: Self::Model,
        optimizer: &mut Self::Optimizer,
        batch: Self::Batch,
        lr: f64,
    ) -> Result<Step<Self::Model>, Failed<Self::Model>>;
}

/// The checkpoint files' extension of `T`'s Burn.
fn extension<T: Training>() -> &'static str {
    <T::Burn as BurnVersion<T::Model, T::Optimizer>>::EXTENSION
}

/// Each rank's loader batch: `--batch-size`, or its share of
/// `--global-batch-size` (refused when the ranks do not divide it).
pub fn batch_size(group: &ProcessGroup, batch_size: usize, global: Option<usize>) -> usize {
    match global {
        Some(global) => {
            burn_ddp_sampler::batch_size_per_rank(group, global).unwrap_or_else(|e| fail(None, e))
        }
        None => batch_size,
    }
}

/// `--resume auto`: the newest snapshot in `dir` that loads into this run's
/// model and optimizer, the same for every rank (a folder whose
/// `config_file` is another run's is refused).
pub fn newest_snapshot<T: Training, C: Serialize + DeserializeOwned>(
    trainer: &T,
    group: &ProcessGroup,
    dir: &Path,
    config: &C,
    config_file: &str,
) -> Option<PathBuf> {
    resume::newest_snapshot(
        group,
        dir,
        extension::<T>(),
        config,
        &dir.join(config_file),
        &["epochs"],
        |snapshot| {
            let (model, optimizer) = trainer.init();
            let burn = trainer.burn();
            burn.load(&snapshot.path, model, optimizer).map(|_| ())
        },
    )
}

/// The model and optimizer a run starts with, and its first epoch: seeded
/// and new, or (given a snapshot) loaded on every rank, then wrapped. Rank 0
/// says where it resumed, warns when the saved `config_file` beside the
/// snapshot holds other settings than `config` (its epochs aside), then
/// saves `config` in `dir` (if snapshots are kept).
pub fn start<T: Training, C: Serialize + DeserializeOwned>(
    trainer: &T,
    group: &ProcessGroup,
    seed: u64,
    snapshot: Option<&Path>,
    config: &C,
    (dir, config_file): (Option<&Path>, &str),
) -> (T::Model, T::Optimizer, usize) {
    let rank = group.rank();
    trainer.burn().seed(seed);
    let (mut model, mut optimizer) = trainer.init();
    let mut first_epoch = 0;
    if let Some(path) = snapshot {
        (model, optimizer, first_epoch) = trainer
            .burn()
            .load(path, model, optimizer)
            .unwrap_or_else(|e| fail(Some(rank), e));
        group.barrier().unwrap_or_else(|e| fail(Some(rank), e));
        if group.is_main() {
            println!("Resumed from {} at epoch {first_epoch}", path.display());
            let saved = path.with_file_name(config_file);
            if let Some(warning) = run_config::resume_warning(config, &saved, &["epochs"]) {
                log::warn!("rank {rank}: {warning}");
            }
        }
    }
    if let Some(dir) = dir {
        save_config(group, dir, config, config_file);
    }
    let model = trainer
        .burn()
        .wrap(model, group)
        .unwrap_or_else(|e| fail(Some(rank), e));
    (model, optimizer, first_epoch)
}

/// Rank 0 makes the checkpoint folder if missing and saves the run's
/// settings there; refused here, before the first step, if it cannot.
fn save_config<C: Serialize>(group: &ProcessGroup, dir: &Path, config: &C, file: &str) {
    if group.is_main() {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("--checkpoint-dir {}: {e}", dir.display()))
            .and_then(|()| run_config::save(config, &dir.join(file)))
            .unwrap_or_else(|e| fail(Some(group.rank()), e));
    }
}

/// Writes the snapshot after `epochs_done` epochs into `dir`; the file.
pub fn save_snapshot<T: Training>(
    trainer: &T,
    dir: &Path,
    model: &T::Model,
    optimizer: &T::Optimizer,
    epochs_done: usize,
    rank: usize,
) -> PathBuf {
    let path = resume::snapshot_path(dir, epochs_done);
    trainer
        .burn()
        .save(&path, model, optimizer, epochs_done)
        .unwrap_or_else(|e| fail(Some(rank), e))
}

/// How one epoch's steps went on this rank.
pub struct Epoch<M> {
    /// The model after its last step.
    pub model: M,
    /// What `after_step` made of each step's loss, summed.
    pub loss: f64,
    /// Steps taken.
    pub steps: usize,
    /// Items trained on.
    pub samples: usize,
    /// Where a Ctrl-C or SIGTERM on some rank stopped every rank, if one did.
    pub stopped: Option<Stopped>,
    /// A collective that failed, when the launcher lets the others go on
    /// without a failed rank (`burn-ddp-run --on-failure continue`): the
    /// steps before it are taken, the one it broke is not.
    pub failed: Option<burn_ddp_comm::CommError>,
    /// The last step was taken but its loss could not be summed (the
    /// failure came after the update).
    pub loss_lost: bool,
    /// Replacement workers wait to join (`ProcessGroup::joiners_waiting`,
    /// the same on every rank): the epoch stopped after its last step for
    /// the caller to admit them ([`admit`]).
    pub joiners: bool,
}

/// Epoch `epoch`'s steps over `batches`. Every rank asks before each step
/// whether a Ctrl-C or SIGTERM reached any rank (`catch_stop_signals`), so
/// all stop before the same one; `after_step` gets each step's loss (to sum
/// it over the ranks, move a progress bar) and returns what to add up. A
/// failed collective ends the process naming it, unless the launcher lets
/// the others go on: then the epoch ends there with the failure
/// ([`Epoch::failed`]) for the caller to go on from.
pub fn train_epoch<T: Training>(
    trainer: &T,
    group: &ProcessGroup,
    batches: Batches<'_, T::Batch>,
    (mut model, optimizer): (T::Model, &mut T::Optimizer),
    (epoch, lr): (usize, f64),
    mut after_step: impl FnMut(f64) -> burn_ddp_comm::Result<f64>,
) -> Epoch<T::Model> {
    let rank = group.rank();
    let goes_on = burn_ddp_training::recovery::goes_on_after_failure();
    // A failed collective ends the process, unless the others go on.
    let give_up_or_keep = |error: burn_ddp_comm::CommError| {
        if !goes_on {
            fail(Some(rank), error);
        }
        Some(error)
    };
    let (mut loss, mut steps, mut samples) = (0.0, 0, 0);
    let (mut stopped, mut failed, mut loss_lost, mut joiners) = (None, None, false, false);
    for batch in batches {
        match stop::stop_requested(group) {
            Ok(Some(signal)) => {
                stopped = Some(Stopped {
                    signal,
                    epoch,
                    step: steps,
                });
                break;
            }
            Ok(None) => {}
            Err(error) => {
                failed = give_up_or_keep(error);
                break;
            }
        }
        let batch = batch.unwrap_or_else(|e| fail(Some(rank), e));
        match trainer.train_step(model, optimizer, batch, lr) {
            Ok(step) => {
                model = step.model;
                steps += 1;
                samples += step.samples;
                match after_step(step.loss) {
                    Ok(value) => loss += value,
                    Err(error) => {
                        failed = give_up_or_keep(error);
                        loss_lost = true;
                        break;
                    }
                }
                // Every rank learnt it in this step's gradient average.
                if group.joiners_waiting() {
                    joiners = true;
                    break;
                }
            }
            Err(Failed { model: kept, error }) => {
                model = kept;
                failed = give_up_or_keep(error);
                break;
            }
        }
    }
    Epoch {
        model,
        loss,
        steps,
        samples,
        stopped,
        failed,
        loss_lost,
        joiners,
    }
}

/// After a collective failed and the launcher lets the others go on
/// ([`Epoch::failed`]): `group` becomes its next generation among the ranks
/// still there, agreed to stand at the same step (`at`), the model is
/// wrapped over it, and each shard's rest of the epoch is dealt over it
/// (`shards`: each one's handle and the items each rank of the old world
/// had taken since the last deal). The failed step is to be taken again.
pub fn go_on<T: Training>(
    trainer: &T,
    (error, model): (burn_ddp_comm::CommError, T::Model),
    group: &mut ProcessGroup,
    shards: &[(&burn_ddp_sampler::EpochHandle, usize)],
    at: u64,
) -> T::Model {
    let was = group.rank();
    if !error.is_peer_failure() {
        // Not a rank gone (a mismatch, a bad setting): going on would not help.
        fail(Some(was), error);
    }
    eprintln!("{error}; going on without the ranks that are gone");
    // A rank still busy outside any collective (saving, evaluating) arrives
    // within the group's timeout: waiting less would leave it out.
    let wait = group.timeout();
    let next = (T::FRONT_END.reform_process_group)(wait).unwrap_or_else(|e| fail(Some(was), e));
    let rank = next.rank();
    burn_ddp_training::recovery::agree_on_progress(&next, at)
        .unwrap_or_else(|e| fail(Some(rank), e));
    let model = trainer
        .burn()
        .wrap(model, &next)
        .unwrap_or_else(|e| fail(Some(rank), e));
    for (shard, taken) in shards {
        shard
            .regroup(next.world_size(), rank, *taken)
            .unwrap_or_else(|e| fail(Some(rank), e));
    }
    println!(
        "Rank {was} goes on as rank {rank} of {} (generation {})",
        next.world_size(),
        next.generation()
    );
    *group = next;
    model
}

/// Where a hand-written loop stands in its epoch: what a replacement that
/// joins takes from rank 0 ([`hand_over`]).
#[derive(Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Position {
    /// The epoch under way.
    pub epoch: usize,
    /// Steps taken in it.
    pub steps: usize,
    /// The step losses summed over the ranks so far, and how many went in
    /// (rank 0 reports their mean at the epoch's end).
    pub loss: f64,
    pub losses: usize,
    /// Each shard's place in the epoch (`EpochHandle::position`).
    pub shards: Vec<(usize, usize)>,
    /// Each rank's batch (a replacement's loader takes the others').
    pub batch_size: usize,
}

/// Replacement workers wait to join (the epoch stopped for them,
/// [`Epoch::joiners`]): `group` becomes its next generation with them
/// appended, each shard's rest of the epoch is dealt over it (`shards`:
/// each one's handle and the items each rank had taken since the last
/// deal), and they get the state from rank 0 ([`hand_over`]). Every member
/// calls it at the same step boundary.
pub fn admit<T: Training>(
    trainer: &T,
    (model, optimizer): (T::Model, T::Optimizer),
    group: &mut ProcessGroup,
    shards: &[(&burn_ddp_sampler::EpochHandle, usize)],
    position: Position,
) -> (T::Model, T::Optimizer, Position) {
    let rank = group.rank();
    let wait = group.timeout();
    let next = (T::FRONT_END.admit_joiners)(wait).unwrap_or_else(|e| fail(Some(rank), e));
    if next.is_same(group) {
        return (model, optimizer, position); // nobody left to admit
    }
    for (shard, taken) in shards {
        shard
            .regroup(next.world_size(), rank, *taken)
            .unwrap_or_else(|e| fail(Some(rank), e));
    }
    let handles: Vec<_> = shards.iter().map(|(shard, _)| *shard).collect();
    *group = next;
    let (model, optimizer, position) =
        hand_over(trainer, group, (model, optimizer), &handles, position);
    place_shards(&position, &handles, group);
    (model, optimizer, position)
}

/// A replacement that joined the running job (`group.joined_running()`):
/// a new model and optimizer holding rank 0's state, and where the loop
/// stands; build the loaders with its batch size, then
/// [`place_shards`].
pub fn join_running<T: Training>(
    trainer: &T,
    group: &ProcessGroup,
    seed: u64,
) -> (T::Model, T::Optimizer, Position) {
    trainer.burn().seed(seed);
    let fresh = trainer.init();
    hand_over(trainer, group, fresh, &[], Position::default())
}

/// After a group grew (a member, from [`admit`], or a replacement that
/// joined, whose own state is a fresh start): rank 0's model and optimizer
/// state (the model then wrapped over `group`) and loop position (`shards`'
/// places filled in first) on every rank, over `group`; the time it took
/// is printed. The same collectives in the same order on every rank.
pub fn hand_over<T: Training>(
    trainer: &T,
    group: &ProcessGroup,
    (model, optimizer): (T::Model, T::Optimizer),
    shards: &[&burn_ddp_sampler::EpochHandle],
    mut position: Position,
) -> (T::Model, T::Optimizer, Position) {
    let rank = group.rank();
    let started = std::time::Instant::now();
    let burn = trainer.burn();
    let (model, optimizer) = burn
        .share_state((model, optimizer), group)
        .unwrap_or_else(|e| fail(Some(rank), e));
    let model = burn
        .wrap(model, group)
        .unwrap_or_else(|e| fail(Some(rank), e));
    position.shards = shards.iter().map(|shard| shard.position()).collect();
    let position = burn_ddp_training::recovery::share(group, &position)
        .unwrap_or_else(|e| fail(Some(rank), e));
    println!(
        "Rank {rank} of {} has the state of rank 0 (generation {}, epoch {} step {}) after {} ms",
        group.world_size(),
        group.generation(),
        position.epoch + 1,
        position.steps,
        started.elapsed().as_millis()
    );
    (model, optimizer, position)
}

/// Each of `shards` becomes this rank's part of the rest of its epoch at
/// rank 0's place (`position.shards`, in the same order).
pub fn place_shards(
    position: &Position,
    shards: &[&burn_ddp_sampler::EpochHandle],
    group: &ProcessGroup,
) {
    let rank = group.rank();
    for (shard, at) in shards.iter().zip(&position.shards) {
        shard
            .place(*at, group.world_size(), rank)
            .unwrap_or_else(|e| fail(Some(rank), e));
    }
}

/// Where a loop stands, for [`go_on`]'s agreement: the epoch and the steps
/// taken in it.
pub fn progress(epoch: usize, steps: usize) -> u64 {
    ((epoch as u64) << 32) | steps as u64
}

/// Every replica holds rank 0's parameters (their fingerprints compared
/// over `group`), or the process ends naming the first rank that differs;
/// how many ranks were compared. Collective.
pub fn check_identical<T: Training>(trainer: &T, group: &ProcessGroup, model: &T::Model) -> usize {
    let rank = group.rank();
    let fingerprint = trainer.burn().fingerprint(model);
    let all = group
        .all_gather(&[fingerprint as i64])
        .unwrap_or_else(|e| fail(Some(rank), e));
    if let Some(other) = all.iter().position(|&f| f != all[0]) {
        fail(
            Some(rank),
            format!("rank {other}'s parameters differ from rank 0's at the end"),
        );
    }
    all.len()
}

/// Appends one step's global batch to `log` (`--log-batches`): `epoch step
/// world: item,item,...`.
pub fn log_global_batch(log: &Path, (epoch, step, world): (usize, usize, usize), items: &[usize]) {
    use std::io::Write;
    let items: Vec<String> = items.iter().map(usize::to_string).collect();
    let line = format!("{epoch} {step} {world}: {}\n", items.join(","));
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .and_then(|mut file| file.write_all(line.as_bytes()));
    written.unwrap_or_else(|e| fail(Some(0), format!("--log-batches {}: {e}", log.display())));
}

/// `Parameters: v1 v2 ...` (`--print-params`), every value to the last bit.
pub fn print_params_of(values: &[f32]) {
    let values: Vec<String> = values.iter().map(|v| format!("{v:e}")).collect();
    println!("Parameters: {}", values.join(" "));
}

/// `--replay`'s group: this process alone (not under a launcher).
pub fn replay_group<T: Training>() -> ProcessGroup {
    let group = T::FRONT_END.init();
    if group.world_size() != 1 {
        fail(
            Some(group.rank()),
            "--replay trains in one process: run it without the launcher",
        );
    }
    group
}

/// A sampler of `n` items in their order, for a loader of one step's items.
pub fn in_order(n: usize, rank: usize) -> burn_ddp_sampler::DistributedSampler {
    burn_ddp_sampler::DistributedSampler::new(n, 1, 0)
        .unwrap_or_else(|e| fail(Some(rank), e))
        .shuffle(false)
}

/// The first batch of `loader` (a loader of one step's items).
pub fn first_batch<T: Training>(trainer: &T, loader: &T::Loader, rank: usize) -> T::Batch {
    let batch = trainer
        .batches(loader)
        .next()
        .unwrap_or_else(|| fail(Some(rank), "--replay: a step's loader gave no batch"));
    batch.unwrap_or_else(|e| fail(Some(rank), e))
}

/// `--replay LOG`: one training step on each global batch `LOG` lists
/// ([`log_global_batch`]), in order, `batch_of` making the batch of its
/// items; then the steps, the fingerprint and (`print_params`) the values
/// of the model after them, and the group left.
pub fn replay<T: Training>(
    trainer: &T,
    group: &ProcessGroup,
    (mut model, optimizer): (T::Model, &mut T::Optimizer),
    (lr, log, print_params): (f64, &Path, bool),
    batch_of: impl Fn(&[usize]) -> T::Batch,
) {
    let rank = group.rank();
    let text = std::fs::read_to_string(log)
        .unwrap_or_else(|e| fail(Some(rank), format!("--replay {}: {e}", log.display())));
    let mut steps = 0;
    for (number, line) in text.lines().enumerate() {
        let items: Vec<usize> = line
            .split_once(": ")
            .map(|(_, items)| items.split(',').filter_map(|i| i.parse().ok()).collect())
            .unwrap_or_default();
        if items.is_empty() {
            let line = number + 1;
            fail(
                Some(rank),
                format!("--replay {} line {line}: no items", log.display()),
            );
        }
        model = match trainer.train_step(model, optimizer, batch_of(&items), lr) {
            Ok(step) => step.model,
            Err(failed) => fail(Some(rank), failed.error),
        };
        steps += 1;
    }
    println!("Replayed {steps} steps");
    println!(
        "Parameters fingerprint: {:016x}",
        trainer.burn().fingerprint(&model)
    );
    if print_params {
        print_params_of(&trainer.burn().parameter_values(&model));
    }
    T::FRONT_END.destroy(rank);
}
