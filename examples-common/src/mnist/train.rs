//! The MNIST trainer's hand-written loop: a DistributedSampler with
//! `set_epoch`, the average loss all-reduced and printed by rank 0, test
//! accuracy over a test set sharded without duplicates, snapshots in
//! `--checkpoint-dir`, and the final model saved by rank 0.

use super::{splits, MnistArgs, MnistFiles, MnistTrainingConfig, ResumeFrom};
use crate::fail;
use crate::idx::Split;
use crate::run_config;
use crate::stopped::Stopped;
use crate::training::{self, BurnVersion, Training};
use burn_ddp_comm::{ProcessGroup, ReduceOp};
use burn_ddp_sampler::{DistributedSampler, EpochHandle};
use burn_ddp_training::sum::sum_over_ranks;
use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Instant;

/// Beside the hand-written loop's snapshots.
const SNAPSHOT_CONFIG_FILE: &str = "mnist_config.json";

/// The MNIST trainer's Burn side: [`Training`] (the CNN, AdamW,
/// cross-entropy), its loaders and its evaluation.
pub trait MnistTraining: Training + MnistFiles {
    /// This rank's test loader (on the backend without autodiff).
    type TestLoader;

    /// A loader of `batch_size` images over `split` in `sampler`'s order
    /// (this rank's shard), and the handle that sets the sampler's epoch.
    fn train_loader(
        &self,
        split: Arc<Split>,
        sampler: DistributedSampler,
        batch_size: usize,
    ) -> (Self::Loader, EpochHandle);
    /// The test loader over this rank's part of `split`, and the handle
    /// on that part (dealt again when the world changes).
    fn test_loader(
        &self,
        split: Arc<Split>,
        sampler: DistributedSampler,
        batch_size: usize,
    ) -> (Self::TestLoader, EpochHandle);
    /// Correct predictions and samples seen on this rank's test shard (on
    /// the model's copy without autodiff).
    fn evaluate(
        &self,
        model: &Self::Model,
        loader: &Self::TestLoader,
    ) -> Result<(i64, i64), String>;
}

/// Trains the tutorial's CNN as `args` say (the hand-written loop).
pub fn train<T: MnistTraining>(trainer: &T, args: &MnistArgs) {
    if let Some(log) = &args.replay {
        return replay(trainer, args, log);
    }
    let group = T::FRONT_END.init();
    let (rank, world_size) = (group.rank(), group.world_size());
    // A replacement that joined the running job takes rank 0's state and
    // place (and batch) first, as the others hand them over.
    let joined =
        (group.joined_running()).then(|| training::join_running(trainer, &group, args.seed));
    let batch_size = match &joined {
        Some((_, _, at)) => at.batch_size,
        None => training::batch_size(&group, args.batch_size, args.global_batch_size),
    };
    let (train_set, test_set) = splits(trainer, args, &group);
    let config = MnistTrainingConfig::new(
        args.epochs,
        batch_size,
        world_size,
        args.lr,
        args.seed,
        train_set.len(),
    )
    .with_max_steps(args.max_steps);
    let snapshots = args.checkpoint_dir.as_deref();
    if args.resume.is_some() && snapshots.is_none() {
        fail(
            Some(rank),
            "--resume without --learner resumes from --checkpoint-dir's snapshots: give \
             --checkpoint-dir DIR",
        );
    }

    let sampler = burn_ddp_sampler::distributed_sampler(&group, train_set.len())
        .unwrap_or_else(|e| fail(Some(rank), e))
        .seed(args.seed);
    // Every step of the epoch within --max-steps (a world that shrinks in
    // the middle deals the rest over fewer ranks: more steps each).
    let max_steps = args.max_steps.unwrap_or(usize::MAX);
    let (train_loader, epoch_handle) = trainer.train_loader(train_set, sampler, batch_size);
    // The test set is split without padding, so summed counts are exact.
    let test_sampler = burn_ddp_sampler::evaluation_sampler(&group, test_set.len())
        .unwrap_or_else(|e| fail(Some(rank), e));
    let (test_loader, test_shard) =
        trainer.test_loader(test_set, test_sampler, args.test_batch_size);

    // Where to go on from, chosen before the model draws its initial
    // weights; a replacement that joined the running job takes rank 0's
    // state instead.
    let (model, optimizer, first_epoch, joined_at) = if let Some((model, optimizer, at)) = joined {
        training::place_shards(&at, &[&epoch_handle, &test_shard], &group);
        (model, optimizer, at.epoch, Some(at))
    } else {
        let resume = match (args.resume, snapshots) {
            (Some(ResumeFrom::Auto), Some(dir)) => {
                training::newest_snapshot(trainer, &group, dir, &config, SNAPSHOT_CONFIG_FILE)
            }
            (Some(ResumeFrom::Epoch(epoch)), Some(dir)) => {
                Some(crate::resume::snapshot_path(dir, epoch))
            }
            _ => None,
        };
        let snapshot = resume.as_deref();
        let files = (snapshots, SNAPSHOT_CONFIG_FILE);
        let (model, optimizer, first_epoch) =
            training::start(trainer, &group, args.seed, snapshot, &config, files);
        (model, optimizer, first_epoch, None)
    };

    // Ctrl-C or SIGTERM: every rank stops before the same step (asked each
    // step) and rank 0 saves the model trained so far.
    burn_ddp_training::stop::catch_stop_signals();
    let mut run = MnistRun {
        trainer,
        group,
        args,
        max_steps,
        batch_size,
    };
    let loaders = (&train_loader, &test_loader, (&epoch_handle, &test_shard));
    let (model, stopped) = run.epochs(loaders, first_epoch, (model, optimizer), joined_at);
    run.finish(&model, stopped, &config);
}

/// The training loader, the test loader and the handles on both shards.
type Loaders<'a, T> = (
    &'a <T as Training>::Loader,
    &'a <T as MnistTraining>::TestLoader,
    (&'a EpochHandle, &'a EpochHandle),
);

/// What an epoch's steps have come to so far (over every generation of the
/// group it ran on).
#[derive(Default)]
struct Taken {
    /// Their losses, summed.
    loss: f64,
    steps: usize,
    /// Items trained on here.
    samples: usize,
}

/// An MNIST run under way.
struct MnistRun<'a, T: MnistTraining> {
    trainer: &'a T,
    group: ProcessGroup,
    args: &'a MnistArgs,
    /// At most this many steps an epoch (`--max-steps`).
    max_steps: usize,
    /// Each rank's batch.
    batch_size: usize,
}

impl<T: MnistTraining> MnistRun<'_, T> {
    /// The epochs from `first` on, each ending with its line on rank 0 and,
    /// every `--save-interval` epochs, a snapshot; where a stop came, if one
    /// did. Under `burn-ddp-run --on-failure continue`, a rank that is gone
    /// costs one step: the others go on as the group's next generation, the
    /// rest of the epoch (and the test set) dealt over them; a replacement
    /// the launcher starts is admitted at a step's end and given rank 0's
    /// state (`joined_at`: this process is one, and the loop stands there).
    fn epochs(
        &mut self,
        (train_loader, test_loader, (epoch_handle, test_shard)): Loaders<'_, T>,
        first: usize,
        (mut model, mut optimizer): (T::Model, T::Optimizer),
        mut joined_at: Option<training::Position>,
    ) -> (T::Model, Option<Stopped>) {
        for epoch in first..self.args.epochs {
            let mut taken = Taken::default();
            match joined_at.take() {
                // Joined in the middle of this epoch (its shards placed):
                // rank 0's steps so far count as this rank's.
                Some(at) => (taken.loss, taken.steps) = (at.loss, at.steps),
                None => epoch_handle.set_epoch(epoch),
            }
            let started = Instant::now();
            let steps = epoch_handle.indices().len().div_ceil(self.batch_size);
            let progress = progress_bar(self.group.is_main(), steps.min(self.max_steps), epoch);
            loop {
                let group = self.group.clone();
                // The shard's batches (dealt again if the world changed),
                // within --max-steps.
                let left = epoch_handle.indices().len().div_ceil(self.batch_size);
                let cap = self.max_steps.saturating_sub(taken.steps);
                let batches = Box::new(self.trainer.batches(train_loader).take(left.min(cap)));
                // Steps since the shard was (re)dealt, for the batch log.
                let (before, mut dealt_steps) = (taken.steps, 0);
                let done = training::train_epoch(
                    self.trainer,
                    &group,
                    batches,
                    (model, &mut optimizer),
                    (epoch, self.args.lr),
                    |loss| {
                        if let Some(log) = self.args.log_batches.as_deref() {
                            if group.is_main() {
                                let items = epoch_handle.global_batch(dealt_steps, self.batch_size);
                                let at = (epoch, before + dealt_steps, group.world_size());
                                training::log_global_batch(log, at, &items);
                            }
                        }
                        dealt_steps += 1;
                        if let Some(bar) = &progress {
                            bar.inc(1);
                        }
                        Ok(loss)
                    },
                );
                model = done.model;
                taken.loss += done.loss;
                taken.steps += done.steps;
                taken.samples += done.samples;
                if done.stopped.is_some() {
                    if let Some(bar) = progress {
                        bar.finish_and_clear();
                    }
                    return (model, done.stopped);
                }
                let shards = [(epoch_handle, done.samples), (test_shard, 0)];
                if done.joiners {
                    let at = training::Position {
                        epoch,
                        steps: taken.steps,
                        loss: taken.loss,
                        batch_size: self.batch_size,
                        ..Default::default()
                    };
                    let state = (model, optimizer);
                    let admitted =
                        training::admit(self.trainer, state, &mut self.group, &shards, at);
                    (model, optimizer, _) = admitted;
                    continue;
                }
                let Some(error) = done.failed else { break };
                let at = training::progress(epoch, taken.steps);
                model = training::go_on(self.trainer, (error, model), &mut self.group, &shards, at);
            }
            if let Some(bar) = progress {
                bar.finish_and_clear();
            }
            self.report(epoch, (&model, &taken), started, test_loader);
            let (group, rank) = (&self.group, self.group.rank());
            let save_interval = self.args.save_interval;
            let dir = self.args.checkpoint_dir.as_deref();
            if let Some(dir) = dir.filter(|_| (epoch + 1).is_multiple_of(save_interval)) {
                if group.is_main() {
                    training::save_snapshot(self.trainer, dir, &model, &optimizer, epoch + 1, rank);
                }
                // Every rank goes on once the snapshot is whole.
                group.barrier().unwrap_or_else(|e| fail(Some(rank), e));
            }
        }
        (model, None)
    }

    /// Rank 0's line for the epoch: the average loss over the ranks, the
    /// test accuracy over the whole test set, the time and throughput.
    fn report(
        &self,
        epoch: usize,
        (model, done): (&T::Model, &Taken),
        started: Instant,
        test: &T::TestLoader,
    ) {
        let (group, rank) = (&self.group, self.group.rank());
        // avg = all_reduce(total_loss / len(loader)) / world_size, as the tutorial computes it.
        let mut average = [done.loss / done.steps.max(1) as f64];
        group
            .all_reduce(&mut average, ReduceOp::Sum)
            .unwrap_or_else(|e| fail(Some(rank), e));
        let average = average[0] / group.world_size() as f64;
        let [all_samples] =
            sum_over_ranks(group, [done.samples]).unwrap_or_else(|e| fail(Some(rank), e));
        let elapsed = started.elapsed().as_secs_f64();
        let (correct, total) = self
            .trainer
            .evaluate(model, test)
            .unwrap_or_else(|e| fail(Some(rank), e));
        let [correct, total] =
            sum_over_ranks(group, [correct, total]).unwrap_or_else(|e| fail(Some(rank), e));
        if group.is_main() {
            println!(
                "epoch={epoch} avg_loss={average:.4} test_acc={:.2}% epoch_time={elapsed:.1}s samples/s={:.0}",
                100.0 * correct as f64 / total.max(1) as f64,
                all_samples as f64 / elapsed
            );
        }
    }

    /// The end: rank 0 saves the model (the one trained so far after a
    /// stop) and its configuration; a stopped run exits with the signal's code.
    fn finish(&self, model: &T::Model, stopped: Option<Stopped>, config: &MnistTrainingConfig) {
        let rank = self.group.rank();
        if let Some(stop) = stopped {
            println!("{}", stop.rank_line(rank));
        }
        // Every replica ends with rank 0's parameters (their digests compared).
        let replicas = training::check_identical(self.trainer, &self.group, model);
        if self.group.is_main() {
            println!("replicas identical: {replicas} ranks");
            if let Some(summary) = T::FRONT_END.sync_summary() {
                println!("{summary}");
            }
            // Equal for two runs exactly when they ended with the same parameters.
            println!(
                "parameters fingerprint: {:016x}",
                self.trainer.burn().fingerprint(model)
            );
            if self.args.print_params {
                training::print_params_of(&self.trainer.burn().parameter_values(model));
            }
            let output = &self.args.output;
            let epochs_done = stopped.map_or(self.args.epochs, |stop| stop.epoch);
            let path = self
                .trainer
                .burn()
                .save_model(output, model, epochs_done)
                .unwrap_or_else(|e| fail(Some(rank), e));
            run_config::save(config, &output.with_extension("config.json"))
                .unwrap_or_else(|e| fail(Some(rank), e));
            println!("saved {}", path.display());
            if let Some(stop) = stopped {
                println!(
                    "{}; the model saved is the one trained so far",
                    stop.describe()
                );
            }
        }
        T::FRONT_END.destroy(rank);
        if let Some(stop) = stopped {
            std::process::exit(stop.exit_code());
        }
    }
}

/// `--replay FILE`: one process trains on the global batches `FILE` lists,
/// in order, from the seed's model: what the logged run trained.
fn replay<T: MnistTraining>(trainer: &T, args: &MnistArgs, log: &std::path::Path) {
    let group = training::replay_group::<T>();
    let rank = group.rank();
    let (train_set, _) = splits(trainer, args, &group);
    let config = MnistTrainingConfig::new(1, 1, 1, args.lr, args.seed, train_set.len());
    let files = (None, SNAPSHOT_CONFIG_FILE);
    let (model, mut optimizer, _) =
        training::start(trainer, &group, args.seed, None, &config, files);
    let batch_of = |items: &[usize]| {
        if let Some(&bad) = items.iter().find(|&&i| i >= train_set.len()) {
            let why = format!("--replay: item {bad} is past the training set");
            fail(Some(rank), why);
        }
        let step_set = Arc::new(train_set.select(items));
        let sampler = training::in_order(items.len(), rank);
        let (loader, _) = trainer.train_loader(step_set, sampler, items.len());
        training::first_batch(trainer, &loader, rank)
    };
    let run = (model, &mut optimizer);
    training::replay(
        trainer,
        &group,
        run,
        (args.lr, log, args.print_params),
        batch_of,
    );
}

/// A bar on rank 0 when a person is watching (stderr is a terminal).
fn progress_bar(main: bool, steps: usize, epoch: usize) -> Option<indicatif::ProgressBar> {
    if !main || !std::io::stderr().is_terminal() {
        return None;
    }
    let bar = indicatif::ProgressBar::new(steps as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "epoch {msg} [{bar:30}] {pos}/{len} steps, {per_sec}, eta {eta}",
        )
        .unwrap()
        .progress_chars("=> "),
    );
    bar.set_message(epoch.to_string());
    Some(bar)
}
