//! The experiment folder, prepared once for every rank: on every rank, the
//! `remove_dir_all` + `create_dir_all` of Burn's examples would race (a late
//! rank would delete files rank 0 had started).

use super::LearnerJob;
use burn_ddp_comm::{CommError, Result};

impl LearnerJob {
    /// Creates the experiment folder (and its parents) on rank 0, keeping
    /// what it holds (a resume's checkpoints); every rank returns once it
    /// exists. Call it instead of `create_dir_all` on every rank.
    pub fn create_artifact_dir(&self) -> Result<()> {
        self.prepare_artifact_dir(false)
    }

    /// Empties the experiment folder on rank 0, as Burn's examples do at the
    /// start of a fresh run (`remove_dir_all` then `create_dir_all`); every
    /// rank returns once it is there and empty.
    pub fn recreate_artifact_dir(&self) -> Result<()> {
        self.prepare_artifact_dir(true)
    }

    /// Rank 0 prepares the folder; its outcome reaches every rank, so a
    /// failure there is an error everywhere instead of a wait in a barrier.
    fn prepare_artifact_dir(&self, empty_first: bool) -> Result<()> {
        let rank = self.rank();
        let mut failed = [0i64];
        let mut problem = None;
        if self.is_main() {
            let prepare = || -> std::io::Result<()> {
                if empty_first && self.directory.exists() {
                    std::fs::remove_dir_all(&self.directory)?;
                }
                std::fs::create_dir_all(&self.directory)
            };
            if let Err(err) = prepare() {
                failed[0] = 1;
                problem = Some(err);
            }
        }
        self.group().broadcast(&mut failed, 0)?;
        if failed[0] == 0 {
            return Ok(());
        }
        let message = match problem {
            Some(err) => format!(
                "cannot {} the experiment folder {}: {err}; give DdpTraining a folder this user \
                 can write",
                if empty_first { "recreate" } else { "create" },
                self.directory.display()
            ),
            None => format!(
                "rank 0 could not prepare the experiment folder {}; its error says why",
                self.directory.display()
            ),
        };
        Err(CommError::InvalidArgument { rank, message })
    }
}
