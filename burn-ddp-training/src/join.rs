//! Loops over inputs of different lengths on different ranks (PyTorch's
//! `Join`): a rank whose batches have run out goes on taking part in every
//! step, in shadow, until every rank's have, so no rank waits forever on a
//! collective the others never reach.
//!
//! Each step the ranks agree on how many samples each one has (one small
//! all-gather before the step). A rank with none steps in shadow: its last
//! batch again (or the one it was given), its loss scaled to zero, so its
//! gradients are zeros and it takes part in the gradient average and the
//! optimizer step like the others, and every replica stays identical. The
//! others scale their loss so the average over the ranks is the mean over
//! the step's samples: `samples_here * world_size / samples_in_the_step`.
//! The loop ends, on every rank, at the first step where no rank has a
//! sample.

use burn_ddp_comm::{CommError, ProcessGroup, Result};

/// A rank's batches, stepped through with the other ranks' (see the
/// [module](self)).
///
/// ```no_run
/// # use burn_ddp_training::join::Join;
/// # fn run(group: &burn_ddp_comm::ProcessGroup, batches: Vec<Vec<usize>>) -> burn_ddp_comm::Result<()> {
/// let mut join = Join::new(group, batches.into_iter(), |batch: &Vec<usize>| batch.len());
/// while let Some(step) = join.next_step()? {
///     // loss = model.forward(step.batch) ... .mul_scalar(step.loss_scale);
///     // backward, gradient average, optimizer step, as always.
/// }
/// # Ok(())
/// # }
/// ```
pub struct Join<I: Iterator, F> {
    group: ProcessGroup,
    batches: std::iter::Fuse<I>,
    samples: F,
    /// What a rank without batches steps with: its last one, or the one it
    /// was given.
    shadow: Option<I::Item>,
    steps: usize,
    ended: bool,
}

/// One step of a [`Join`] loop on this rank.
#[derive(Debug, Clone)]
pub struct JoinStep<T> {
    /// The batch to train on (in shadow: one to compute a loss from, which
    /// counts zero).
    pub batch: T,
    /// Multiply the batch's mean loss by this before the backward pass:
    /// the gradient average over the ranks is then the mean over every
    /// sample of the step (zero in shadow).
    pub loss_scale: f32,
    /// This rank's batches have run out: the step is in shadow.
    pub shadow: bool,
    /// The samples of this step over every rank.
    pub samples_in_step: usize,
    /// The step's number, from 0.
    pub step: usize,
}

impl<I, F> Join<I, F>
where
    I: Iterator,
    I::Item: Clone,
    F: Fn(&I::Item) -> usize,
{
    /// Steps through `batches` with the other ranks of `group`; `samples`
    /// says how many samples a batch holds (the step's mean is over them).
    pub fn new(group: &ProcessGroup, batches: I, samples: F) -> Self {
        Self {
            group: group.clone(),
            batches: batches.fuse(),
            samples,
            shadow: None,
            steps: 0,
            ended: false,
        }
    }

    /// What to step with in shadow before this rank has had a batch of its
    /// own (a rank that may have none at all needs one): any batch of the
    /// right shape, its loss counts zero.
    pub fn with_shadow(mut self, batch: I::Item) -> Self {
        self.shadow = Some(batch);
        self
    }

    /// The next step, agreed with every rank: `None` once no rank has a
    /// batch left (on every rank at the same step). Collective: every rank
    /// calls it once per step, whether its batches have run out or not.
    pub fn next_step(&mut self) -> Result<Option<JoinStep<I::Item>>> {
        if self.ended {
            return Ok(None);
        }
        let rank = self.group.rank();
        let own = self.batches.next();
        let samples = own.as_ref().map_or(0, |batch| (self.samples)(batch));
        // A rank with nothing to step with says so (-1): every rank fails.
        let stranded = samples == 0 && self.shadow.is_none();
        let said = if stranded { -1 } else { samples as i64 };
        let counts = self.group.all_gather(&[said])?;
        let without: Vec<String> = (counts.iter().enumerate())
            .filter(|(_, &n)| n < 0)
            .map(|(r, _)| r.to_string())
            .collect();
        let in_step: i64 = counts.iter().filter(|&&n| n > 0).sum();
        if in_step == 0 {
            self.ended = true;
            return Ok(None);
        }
        let step = self.steps;
        if !without.is_empty() {
            return Err(CommError::InvalidArgument {
                rank,
                message: format!(
                    "step {step}: rank(s) {} have had no batch yet and must step in shadow while \
                     other ranks train; give each one to step with: `Join::with_shadow(batch)` \
                     (any batch of the right shape: its loss counts zero)",
                    without.join(", ")
                ),
            });
        }
        self.steps += 1;
        let world = self.group.world_size();
        match own {
            Some(batch) if samples > 0 => {
                self.shadow = Some(batch.clone());
                Ok(Some(JoinStep {
                    batch,
                    loss_scale: (samples * world) as f32 / in_step as f32,
                    shadow: false,
                    samples_in_step: in_step as usize,
                    step,
                }))
            }
            // Run out (or an empty batch): the last batch again, counting zero.
            own => {
                let batch = self
                    .shadow
                    .clone()
                    .or(own)
                    .expect("checked with every rank above");
                Ok(Some(JoinStep {
                    batch,
                    loss_scale: 0.0,
                    shadow: true,
                    samples_in_step: in_step as usize,
                    step,
                }))
            }
        }
    }

    /// Steps taken so far (the same on every rank).
    pub fn steps(&self) -> usize {
        self.steps
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_groups::ranks;
    use std::thread;

    #[test]
    fn ranks_with_fewer_batches_step_in_shadow_until_every_rank_is_done() {
        // Rank 0: 3 batches of 4; rank 1: one of 4 and one of 2; rank 2: none.
        let lengths = [vec![4, 4, 4], vec![4, 2], vec![]];
        let groups = ranks(3);
        let handles: Vec<_> = groups
            .into_iter()
            .zip(lengths)
            .map(|(group, lengths)| {
                thread::spawn(move || {
                    let rank = group.rank();
                    let batches = lengths.into_iter().map(|n| vec![rank; n]);
                    let mut join =
                        Join::new(&group, batches, |b: &Vec<usize>| b.len()).with_shadow(vec![]);
                    let mut seen = Vec::new();
                    while let Some(step) = join.next_step().unwrap() {
                        seen.push((
                            step.batch.len(),
                            step.loss_scale,
                            step.shadow,
                            step.samples_in_step,
                        ));
                    }
                    assert_eq!(join.next_step().unwrap().map(|s| s.step), None);
                    seen
                })
            })
            .collect();
        let seen: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(
            seen[0],
            [(4, 1.5, false, 8), (4, 2.0, false, 6), (4, 3.0, false, 4)]
        );
        assert_eq!(
            seen[1],
            [(4, 1.5, false, 8), (2, 1.0, false, 6), (2, 0.0, true, 4)]
        );
        assert_eq!(
            seen[2],
            [(0, 0.0, true, 8), (0, 0.0, true, 6), (0, 0.0, true, 4)]
        );
    }

    #[test]
    fn a_rank_with_nothing_to_step_with_is_named() {
        let groups = ranks(2);
        let handles: Vec<_> = groups
            .into_iter()
            .map(|group| {
                thread::spawn(move || {
                    let batches = (0..(1 - group.rank())).map(|_| vec![1.0f32; 4]);
                    let mut join = Join::new(&group, batches, |b: &Vec<f32>| b.len());
                    join.next_step().map(|s| s.map(|s| s.shadow))
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        // Every rank fails, naming the one without a batch.
        for result in &results {
            let err = result.as_ref().unwrap_err().to_string();
            assert!(
                err.contains("rank(s) 1") && err.contains("with_shadow"),
                "{err}"
            );
        }
    }
}
