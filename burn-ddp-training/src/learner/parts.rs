//! A sharded Learner's checkpoints: each epoch's optimizer state in parts
//! (`optim-parts-N/`, burn-ddp-training's [`sharded`](crate::sharded)
//! format, one part per rank) beside Burn's own `model-N`, `optim-N` and
//! `scheduler-N` files, whose `optim-N` then holds rank 0's part only.
//!
//! The parts of an epoch are committed before Burn's files are written, so
//! an epoch whose Burn files are complete has its parts whole; Burn's
//! checkpointing strategy decides which epochs stay, and the parts of an
//! epoch whose files it removed are removed after it.

use super::LearnerJob;
use crate::sharded::ShardedCheckpoint;
use crate::snapshots::{LoadError, Snapshot};
use burn_ddp_comm::Result;
use std::path::{Path, PathBuf};

/// The prefix of an epoch's folder of parts: `optim-parts-N`.
pub const PARTS_PREFIX: &str = "optim-parts-";

impl LearnerJob {
    /// Where the optimizer state of `epoch`'s checkpoint goes in parts.
    pub fn parts_folder(&self, epoch: usize) -> PathBuf {
        self.checkpoint_folder()
            .join(format!("{PARTS_PREFIX}{epoch}"))
    }

    /// The folder of `epoch`'s optimizer state in parts, when that
    /// checkpoint has one (a sharded run saved it); `None`: Burn's `optim-N`
    /// holds the whole state.
    pub fn parts_of(&self, epoch: usize) -> Option<PathBuf> {
        let folder = self.parts_folder(epoch);
        folder.is_dir().then_some(folder)
    }

    /// `check`, and where the epoch has its optimizer state in parts, those
    /// parts whole (every part there, of its length, from one save).
    pub(super) fn with_parts<'a>(
        &'a self,
        check: impl Fn(&Snapshot) -> std::result::Result<(), LoadError> + 'a,
    ) -> impl Fn(&Snapshot) -> std::result::Result<(), LoadError> + 'a {
        move |snapshot| {
            check(snapshot)?;
            match self.parts_of(snapshot.number) {
                Some(folder) => ShardedCheckpoint::open(&folder, self.rank())
                    .map(drop)
                    .map_err(|err| LoadError::Corrupt(err.to_string().into())),
                None => Ok(()),
            }
        }
    }

    /// Whether every rank sees rank 0's experiment folder (one folder on a
    /// shared file system), which a save in parts needs: rank 0 writes a
    /// token there and each rank looks for it. Collective.
    pub fn folder_is_shared(&self) -> Result<bool> {
        let folder = self.directory.clone();
        let mut nonce = [0i64];
        if self.is_main() {
            let token = token_nonce();
            let written = std::fs::create_dir_all(&folder)
                .and_then(|()| std::fs::write(token_file(&folder, token), token.to_string()));
            nonce[0] = match written {
                Ok(()) => token,
                Err(err) => {
                    log::warn!(
                        "rank 0: cannot write in {} ({err}); the run will fail there",
                        folder.display()
                    );
                    -1
                }
            };
        }
        self.group().broadcast(&mut nonce, 0)?;
        let token = nonce[0];
        let seen = token >= 0
            && std::fs::read_to_string(token_file(&folder, token))
                .is_ok_and(|text| text == token.to_string());
        let seen_by = self.group().all_gather(&[seen as i64])?;
        if self.is_main() && token >= 0 {
            let _ = std::fs::remove_file(token_file(&folder, token));
        }
        let blind: Vec<String> = (seen_by.iter().enumerate())
            .filter(|(_, &seen)| seen == 0)
            .map(|(rank, _)| rank.to_string())
            .collect();
        if !blind.is_empty() && self.is_main() {
            log::warn!(
                "rank 0: rank(s) {} do not see {} (each rank has its own folder): the sharded \
                 optimizer's checkpoints are gathered whole on rank 0 instead of saved in parts; \
                 give every rank the same folder on a shared file system to save in parts",
                blind.join(", "),
                folder.display()
            );
        }
        Ok(blind.is_empty())
    }

    /// Rank 0, before saving `epoch`: removes whatever of that epoch a run
    /// before left (its parts, a save of them that did not finish, Burn's
    /// files), so the epoch is never complete with files of two runs.
    pub fn clear_epoch(&self, epoch: usize) {
        let folder = self.checkpoint_folder();
        for (path, of) in epoch_entries(&folder) {
            if of == epoch {
                remove(&path);
            }
        }
    }

    /// Rank 0, after a checkpoint: removes the parts of every epoch whose
    /// Burn files are gone (Burn's checkpointing strategy removed them, or
    /// they were never written), and the leftovers of saves that did not
    /// finish. During training (`newest`: the epoch just saved) the epochs
    /// from `newest - 1` on are left alone, as Burn's own threads may still
    /// be writing or removing them; at the end (`None`) every one is
    /// looked at.
    pub fn prune_parts(&self, newest: Option<usize>) {
        let folder = self.checkpoint_folder();
        let entries = epoch_entries(&folder);
        let has_model = |epoch: usize| {
            entries.iter().any(|(path, of)| {
                *of == epoch
                    && path
                        .file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("model-"))
            })
        };
        for (path, epoch) in &entries {
            let parts =
                (path.file_name()).is_some_and(|n| n.to_string_lossy().starts_with(PARTS_PREFIX));
            let settled = newest.is_none_or(|newest| epoch + 1 < newest);
            if parts && settled && !has_model(*epoch) {
                remove(path);
            }
        }
    }
}

/// Every file or folder of `folder` that belongs to an epoch, with its
/// epoch: Burn's `NAME-N.EXT` files and the parts' `optim-parts-N` (and
/// `optim-parts-N.partial-ID`) folders.
fn epoch_entries(folder: &Path) -> Vec<(PathBuf, usize)> {
    let Ok(listing) = std::fs::read_dir(folder) else {
        return Vec::new();
    };
    listing
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            Some((entry.path(), epoch_of(&name)?))
        })
        .collect()
}

/// The epoch of a checkpoint file or folder's name.
fn epoch_of(name: &str) -> Option<usize> {
    let rest = match name.strip_prefix(PARTS_PREFIX) {
        Some(rest) => rest,
        None => {
            let (stem, rest) = name.split_once('-')?;
            if !super::CHECKPOINT_NAMES.contains(&stem) {
                return None;
            }
            rest
        }
    };
    let digits = rest.split('.').next()?;
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

fn remove(path: &Path) {
    let removed = if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    if let Err(err) = removed {
        if err.kind() != std::io::ErrorKind::NotFound {
            log::warn!("rank 0: cannot remove {}: {err}", path.display());
        }
    }
}

fn token_file(folder: &Path, token: i64) -> PathBuf {
    folder.join(format!(".burn-ddp-shared-{token}"))
}

/// A token no earlier run left behind: the time and this process.
fn token_nonce() -> i64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    ((nanos ^ ((std::process::id() as u64) << 40)) >> 1) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_ddp_comm::ProcessGroup;

    fn job(name: &str) -> (LearnerJob, PathBuf) {
        let dir = std::env::temp_dir().join(format!("ddp-learner-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        let job = LearnerJob::new(&group, &dir);
        std::fs::create_dir_all(job.checkpoint_folder()).unwrap();
        (job, dir)
    }

    fn names(job: &LearnerJob) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(job.checkpoint_folder())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn epochs_are_read_from_burns_names_and_the_parts_folders() {
        assert_eq!(epoch_of("model-12.mpk"), Some(12));
        assert_eq!(epoch_of("scheduler-3.bpk"), Some(3));
        assert_eq!(epoch_of("optim-parts-4"), Some(4));
        assert_eq!(epoch_of("optim-parts-4.partial-00ab"), Some(4));
        assert_eq!(epoch_of("optim-x.mpk"), None);
        assert_eq!(epoch_of("metrics-3.csv"), None);
    }

    #[test]
    fn parts_follow_burns_files_and_a_cleared_epoch_leaves_nothing() {
        let (job, dir) = job("parts-prune");
        let folder = job.checkpoint_folder();
        // Burn kept epochs 3 and 4; parts of 1 to 4, a save of 2 that did
        // not finish.
        for epoch in 3..=4 {
            for name in super::super::CHECKPOINT_NAMES {
                std::fs::write(folder.join(format!("{name}-{epoch}.mpk")), b"x").unwrap();
            }
        }
        for parts in [1, 2, 3, 4] {
            std::fs::create_dir_all(job.parts_folder(parts)).unwrap();
        }
        std::fs::create_dir_all(folder.join("optim-parts-2.partial-0001")).unwrap();
        assert_eq!(job.parts_of(3), Some(job.parts_folder(3)));
        assert_eq!(job.parts_of(5), None);
        // During training at epoch 2, nothing from epoch 1 on is settled.
        job.prune_parts(Some(2));
        assert!(job.parts_folder(1).is_dir());
        // At epoch 4: epochs 1 and 2 have no model file: their parts go.
        job.prune_parts(Some(4));
        assert_eq!(
            names(&job),
            [
                "model-3.mpk",
                "model-4.mpk",
                "optim-3.mpk",
                "optim-4.mpk",
                "optim-parts-3",
                "optim-parts-4",
                "scheduler-3.mpk",
                "scheduler-4.mpk"
            ]
        );
        // Burn removes epoch 4's files; at the end every epoch is looked at.
        for name in super::super::CHECKPOINT_NAMES {
            std::fs::remove_file(folder.join(format!("{name}-4.mpk"))).unwrap();
        }
        job.prune_parts(None);
        assert!(!job.parts_folder(4).exists() && job.parts_folder(3).is_dir());
        job.clear_epoch(3);
        assert!(names(&job).is_empty(), "{:?}", names(&job));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_epoch_whose_parts_are_not_whole_is_not_resumed_from() {
        let (job, dir) = job("parts-whole");
        let folder = job.checkpoint_folder();
        for epoch in 1..=2 {
            for name in super::super::CHECKPOINT_NAMES {
                std::fs::write(folder.join(format!("{name}-{epoch}.mpk")), b"x").unwrap();
            }
        }
        // Epoch 2's parts have no metadata: not whole.
        std::fs::create_dir_all(job.parts_folder(2)).unwrap();
        assert_eq!(job.latest_checkpoint(|_| Ok(())).unwrap(), Some(1));
        let err = job
            .verify_checkpoint(2, |_| Ok(()))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot resume from epoch 2") && err.contains("optim-parts-2"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_folder_of_ones_own_is_shared_and_leaves_no_token() {
        let (job, dir) = job("parts-shared");
        assert!(job.folder_is_shared().unwrap());
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, ["checkpoint"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
