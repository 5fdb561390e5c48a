//! Resuming a Learner run: the newest epoch whose checkpoint (Burn's file
//! checkpointer: `model-N`, `optim-N` and `scheduler-N` in the experiment's
//! `checkpoint` folder) is complete and whole, chosen by rank 0 for every
//! rank, and there on every rank (each loads its own copy). What "whole"
//! means for a Burn version's files is the front-end's `check` closure.

use super::LearnerJob;
use crate::snapshots::{self, LoadError, Snapshot};
use burn_ddp_comm::{CommError, Result};
use std::path::PathBuf;

/// The files Burn's Learner writes per epoch, in its `checkpoint` folder.
pub const CHECKPOINT_NAMES: [&str; 3] = ["model", "optim", "scheduler"];

impl LearnerJob {
    /// Where Burn's Learner keeps its checkpoints.
    pub fn checkpoint_folder(&self) -> PathBuf {
        self.directory.join("checkpoint")
    }

    /// The newest epoch whose checkpoint is complete and passes `check`
    /// (rank 0 decides, for every rank); `None` when there is none. A damaged
    /// newest one is skipped with a warning naming the file; every one
    /// damaged is an error. The chosen epoch must be there on every rank
    /// ([`verify_checkpoint`](Self::verify_checkpoint)). Collective.
    pub fn latest_checkpoint(
        &self,
        check: impl Fn(&Snapshot) -> std::result::Result<(), LoadError>,
    ) -> Result<Option<usize>> {
        let rank = self.rank();
        let mut chosen = [-1i64];
        let mut problem = None;
        if self.is_main() {
            match self.newest_whole(&check) {
                Ok(Some(epoch)) => chosen[0] = epoch as i64,
                Ok(None) => {}
                Err(err) => {
                    chosen[0] = -2;
                    problem = Some(err);
                }
            }
        }
        self.group().broadcast(&mut chosen, 0)?;
        match chosen[0] {
            -1 => Ok(None),
            -2 => Err(problem.unwrap_or_else(|| {
                CommError::config(
                    Some(rank),
                    "checkpoint",
                    format!(
                    "rank {rank}: rank 0 could not choose a checkpoint in {}; its error says why",
                    self.checkpoint_folder().display()
                ),
                )
            })),
            epoch => {
                let epoch = epoch as usize;
                self.verify_checkpoint(epoch, check)?;
                Ok(Some(epoch))
            }
        }
    }

    fn newest_whole(
        &self,
        check: impl Fn(&Snapshot) -> std::result::Result<(), LoadError>,
    ) -> Result<Option<usize>> {
        let rank = self.rank();
        let folder = self.checkpoint_folder();
        let epochs = snapshots::complete_epochs(&folder, &CHECKPOINT_NAMES).map_err(|err| {
            CommError::config(
                Some(rank),
                "checkpoint",
                format!(
                    "rank {rank}: cannot read the checkpoints in {}: {err}",
                    folder.display()
                ),
            )
        })?;
        let found = snapshots::newest_loadable(&epochs, self.with_parts(check)).map_err(|err| {
            CommError::config(Some(rank), "checkpoint", format!("rank {rank}: {err}"))
        })?;
        Ok(found.map(|found| {
            for warning in &found.skipped {
                log::warn!("rank {rank}: {warning}");
            }
            found.snapshot.number
        }))
    }

    /// Every rank has `epoch`'s model, optimizer and scheduler files, and
    /// they pass `check` there, or every rank fails with an error naming the
    /// ranks without them or with damaged ones (each rank loads its own
    /// copy, so on several machines the folder must be copied to each or
    /// shared). Collective.
    pub fn verify_checkpoint(
        &self,
        epoch: usize,
        check: impl Fn(&Snapshot) -> std::result::Result<(), LoadError>,
    ) -> Result<()> {
        let folder = self.checkpoint_folder();
        let snapshot = snapshots::complete_epochs(&folder, &CHECKPOINT_NAMES)
            .ok()
            .and_then(|epochs| epochs.into_iter().find(|s| s.number == epoch));
        let problem = match &snapshot {
            None => Some(format!(
                "no complete checkpoint of it in {} ({})",
                folder.display(),
                CHECKPOINT_NAMES
                    .iter()
                    .map(|name| format!("{name}-{epoch}.*"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            Some(snapshot) => (self.with_parts(check))(snapshot)
                .err()
                .map(|why| why.to_string()),
        };
        let states = self.group().all_gather(&[problem.is_some() as i64])?;
        let failing: Vec<usize> = states
            .iter()
            .enumerate()
            .filter(|(_, &bad)| bad != 0)
            .map(|(rank, _)| rank)
            .collect();
        if failing.is_empty() {
            return Ok(());
        }
        let fix = "every rank loads the checkpoint itself, so on several machines copy the \
                   experiment's checkpoint folder to each of them (or put it on a shared file \
                   system)";
        let who = failing
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        let message = match problem {
            Some(problem) => format!(
                "cannot resume from epoch {epoch}: {problem} (rank(s) {who} cannot load it); {fix}"
            ),
            None => format!(
                "cannot resume from epoch {epoch}: rank(s) {who} have no whole checkpoint of it; \
                 {fix}"
            ),
        };
        Err(CommError::InvalidArgument {
            rank: self.rank(),
            message,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_ddp_comm::ProcessGroup;

    #[test]
    fn the_newest_whole_epoch_is_chosen_and_a_missing_one_named() {
        let dir = std::env::temp_dir().join(format!("ddp-learner-ckpt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let folder = dir.join("checkpoint");
        std::fs::create_dir_all(&folder).unwrap();
        for epoch in 1..=3 {
            for name in CHECKPOINT_NAMES {
                std::fs::write(folder.join(format!("{name}-{epoch}.bpk")), b"x").unwrap();
            }
        }
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        let job = LearnerJob::new(&group, &dir);
        let latest = job
            .latest_checkpoint(|snapshot| match snapshot.number {
                3 => Err(LoadError::Corrupt("cut short".into())),
                _ => Ok(()),
            })
            .unwrap();
        assert_eq!(latest, Some(2));
        let err = job
            .verify_checkpoint(7, |_| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("rank 0: cannot resume from epoch 7")
                && err.contains(&folder.display().to_string())
                && err.contains("model-7.*")
                && err.contains("shared"),
            "{err}"
        );
        let err = job
            .latest_checkpoint(|_| Err(LoadError::Corrupt("bad".into())))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("model-3.bpk") && err.contains("model-1.bpk"),
            "{err}"
        );
        // There, but damaged here: named as what the check says.
        let err = job
            .verify_checkpoint(2, |_| Err(LoadError::Corrupt("cut short".into())))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot resume from epoch 2: cut short (rank(s) 0"),
            "{err}"
        );
        std::fs::remove_dir_all(&folder).unwrap();
        assert_eq!(job.latest_checkpoint(|_| Ok(())).unwrap(), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
