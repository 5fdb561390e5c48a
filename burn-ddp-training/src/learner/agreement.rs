//! What the ranks of a Learner run agree on, so they stay in step: the
//! loaders' lengths before an epoch, whether to run the next iteration (every
//! rank has a batch and nobody was interrupted) and whether to go on after an
//! epoch (rank 0's early stopping, anyone's interrupt). Each is one small
//! collective on the main thread; a Ctrl-C or SIGTERM caught by
//! [`crate::stop`] counts as an interrupt.

use super::LearnerJob;
use crate::stop;
use burn_ddp_comm::{CommError, Result};

/// What every rank does next within a training epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NextIteration {
    /// Every rank has a batch and nobody was interrupted: train on it.
    Train,
    /// Every rank's loader is done: the epoch is over.
    EpochDone,
    /// Some rank was interrupted: every rank stops before this iteration.
    /// `reason` is what to tell this rank's interrupter (`None` when it was
    /// this rank's own interrupter that stopped).
    Stop {
        /// Why, in words, when it did not come from this rank's interrupter.
        reason: Option<String>,
    },
}

/// What every rank does after an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterEpoch {
    /// The next epoch.
    Continue,
    /// Some rank was interrupted (or caught a stop signal).
    Interrupted,
    /// Rank 0's early-stopping strategy said stop.
    EarlyStop,
}

impl LearnerJob {
    /// Compares the loaders' lengths (`items` here), so a rank that would run
    /// out of batches early is an error on every rank before the epoch
    /// starts. Returns every rank's length.
    pub fn check_lengths(&self, what: &str, items: usize) -> Result<Vec<usize>> {
        let lengths: Vec<usize> = self
            .group()
            .all_gather(&[items as i64])?
            .into_iter()
            .map(|n| n as usize)
            .collect();
        if lengths.iter().any(|&n| n != lengths[0]) {
            return Err(self.invalid(format!(
                "the {what} loaders have different lengths on the ranks ({}); every rank must \
                 run the same number of iterations: shard the training set with \
                 DdpTraining::shard (which pads it to equal shards) and use one batch size",
                describe(&lengths)
            )));
        }
        Ok(lengths)
    }

    /// The per-iteration vote before iteration `iteration + 1` of Burn's
    /// `epoch`: whether this rank has a batch, whether its interrupter
    /// stopped (a stop signal counts too). `lengths` (from
    /// [`check_lengths`](Self::check_lengths)) name the problem when some
    /// ranks ran out of batches and others did not. A stop is logged with
    /// what is finished; the epoch's checkpoint must then not be written (it
    /// would claim a whole epoch).
    pub fn next_iteration(
        &self,
        epoch: usize,
        iteration: usize,
        has_batch: bool,
        interrupted: bool,
        lengths: &[usize],
    ) -> Result<NextIteration> {
        let signal = stop::stop_signal();
        let (with_batch, stopped) = self.ballots(has_batch, interrupted || signal.is_some())?;
        let with_batch = with_batch.len();
        let world = self.group().world_size();
        if !stopped.is_empty() {
            let reason = match (interrupted, signal) {
                (true, _) => None,
                (false, Some(signal)) => Some(format!("{} received", stop::signal_name(signal))),
                (false, None) => Some(format!("interrupted on {}", ranks(&stopped))),
            };
            let finished = match epoch.saturating_sub(1) {
                0 => "no epoch is finished".to_string(),
                done => format!("epochs 1 to {done} are finished"),
            };
            log::info!(
                "rank {}: stopping before iteration {} of epoch {epoch}; {finished}",
                self.rank(),
                iteration + 1,
            );
            return Ok(NextIteration::Stop { reason });
        }
        if with_batch == 0 {
            return Ok(NextIteration::EpochDone);
        }
        if !has_batch {
            return Err(self.invalid(format!(
                "this rank's training loader ended after {iteration} iterations while \
                 {with_batch} of {world} ranks still had batches (loader lengths {}); use one \
                 batch size and DdpTraining::shard on every rank",
                describe(lengths)
            )));
        }
        if with_batch < world {
            return Err(self.invalid(format!(
                "{} of {world} ranks ran out of training batches after {iteration} iterations \
                 (loader lengths {}); use one batch size and DdpTraining::shard on every rank",
                world - with_batch,
                describe(lengths)
            )));
        }
        Ok(NextIteration::Train)
    }

    /// After Burn's `epoch`: rank 0's early-stopping decision (`early_stop`
    /// is read on rank 0 only) and anyone's interrupt, known to all (and
    /// logged when training ends there).
    pub fn after_epoch(
        &self,
        epoch: usize,
        early_stop: bool,
        interrupted: bool,
    ) -> Result<AfterEpoch> {
        let early_stop = early_stop && self.is_main();
        let interrupted = interrupted || stop::stop_signal().is_some();
        let (stop, interrupted) = self.ballots(early_stop, interrupted)?;
        Ok(if !interrupted.is_empty() {
            log::info!(
                "Training interrupted after epoch {epoch} (on {})",
                ranks(&interrupted)
            );
            AfterEpoch::Interrupted
        } else if !stop.is_empty() {
            log::info!("Early stopping after epoch {epoch} (decided by rank 0)");
            AfterEpoch::EarlyStop
        } else {
            AfterEpoch::Continue
        })
    }

    /// Which ranks say yes to each of two questions (one small all-gather).
    fn ballots(&self, first: bool, second: bool) -> Result<(Vec<usize>, Vec<usize>)> {
        let votes = self.group().all_gather(&[first as i64, second as i64])?;
        let yes = |question: usize| -> Vec<usize> {
            votes
                .chunks(2)
                .enumerate()
                .filter(|(_, ballot)| ballot[question] != 0)
                .map(|(rank, _)| rank)
                .collect()
        };
        Ok((yes(0), yes(1)))
    }

    fn invalid(&self, message: String) -> CommError {
        CommError::InvalidArgument {
            rank: self.rank(),
            message,
        }
    }
}

/// `rank 1` or `ranks 0, 2`.
fn ranks(ranks: &[usize]) -> String {
    let list: Vec<String> = ranks.iter().map(usize::to_string).collect();
    match list.len() {
        1 => format!("rank {}", list[0]),
        _ => format!("ranks {}", list.join(", ")),
    }
}

/// `rank 0: 8, rank 1: 7`.
fn describe(lengths: &[usize]) -> String {
    lengths
        .iter()
        .enumerate()
        .map(|(rank, n)| format!("rank {rank}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_ddp_comm::ProcessGroup;

    fn job() -> LearnerJob {
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        LearnerJob::new(&group, std::env::temp_dir())
    }

    #[test]
    fn a_world_of_one_trains_until_its_loader_ends() {
        let job = job();
        assert_eq!(job.check_lengths("training", 5).unwrap(), [5]);
        assert_eq!(
            job.next_iteration(1, 0, true, false, &[5]).unwrap(),
            NextIteration::Train
        );
        assert_eq!(
            job.next_iteration(1, 5, false, false, &[5]).unwrap(),
            NextIteration::EpochDone
        );
        assert_eq!(
            job.next_iteration(1, 2, true, true, &[5]).unwrap(),
            NextIteration::Stop { reason: None }
        );
        assert_eq!(
            job.after_epoch(1, true, false).unwrap(),
            AfterEpoch::EarlyStop
        );
        assert_eq!(
            job.after_epoch(1, true, true).unwrap(),
            AfterEpoch::Interrupted
        );
        assert_eq!(
            job.after_epoch(1, false, false).unwrap(),
            AfterEpoch::Continue
        );
    }

    #[test]
    fn lengths_and_ranks_are_described() {
        assert_eq!(describe(&[8, 7]), "rank 0: 8, rank 1: 7");
        assert_eq!(ranks(&[1]), "rank 1");
        assert_eq!(ranks(&[0, 2]), "ranks 0, 2");
    }
}
