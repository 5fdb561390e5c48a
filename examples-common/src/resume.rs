//! `--resume auto` for the hand-written trainers (both Burn versions): rank 0
//! picks the newest snapshot in the checkpoint folder that loads and belongs
//! to this run, and every rank resumes from that one. The scan and fallback
//! are burn-ddp-comm's `snapshots`; the trainer says how to try a snapshot.

use crate::{fail, run_config};
use burn_ddp_comm::ProcessGroup;
use burn_ddp_training::snapshots::{self, LoadError, Snapshot};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// The snapshot file names: `model_epoch_<N>.<extension>`, `N` epochs done
/// (`.mpk` as burn-ddp's `save_atomic` writes them, `.ckpt` burn-ddp-22's).
pub const SNAPSHOT_STEM: &str = "model_epoch_";

/// `dir`'s snapshot after `epochs_done` epochs (without its extension, as
/// `save_atomic` and `load` take it).
pub fn snapshot_path(dir: &Path, epochs_done: usize) -> PathBuf {
    dir.join(format!("{SNAPSHOT_STEM}{epochs_done}"))
}

/// The snapshot (`<dir>/model_epoch_<N>.<extension>`) every rank resumes
/// from (`None`: there is none, start afresh). A folder whose saved configuration (`saved_config`) differs from
/// `config` in more than `ignored` fields is another run's: an error on rank
/// 0, which ends the job. `try_load` says whether a snapshot loads into this
/// run's model (corrupt: the one before is tried; refused: an error).
pub fn newest_snapshot<C: Serialize + DeserializeOwned>(
    group: &ProcessGroup,
    dir: &Path,
    extension: &str,
    config: &C,
    saved_config: &Path,
    ignored: &[&str],
    try_load: impl FnMut(&Snapshot) -> Result<(), LoadError>,
) -> Option<PathBuf> {
    let rank = group.rank();
    let mut chosen = [-1i64];
    if group.is_main() {
        if saved_config.exists() {
            let changed = run_config::load::<C>(saved_config)
                .map(|saved| run_config::differences(&saved, config, ignored))
                .unwrap_or_else(|err| vec![format!("unreadable ({err})")]);
            if !changed.is_empty() {
                fail(
                    Some(rank),
                    format!(
                        "--resume auto: the snapshots in {} are another run's ({} says {}); \
                         run with those settings, or give another checkpoint folder",
                        dir.display(),
                        saved_config.display(),
                        changed.join(", ")
                    ),
                );
            }
        }
        let found = snapshots::list(dir, SNAPSHOT_STEM, &format!(".{extension}"))
            .map_err(|e| format!("{}: {e}", dir.display()))
            .and_then(|list| snapshots::newest_loadable(&list, try_load).map_err(|e| e.to_string()))
            .unwrap_or_else(|e| fail(Some(rank), format!("--resume auto: {e}")));
        match found {
            Some(found) => {
                for warning in &found.skipped {
                    log::warn!("rank {rank}: {warning}");
                }
                chosen[0] = found.snapshot.number as i64;
            }
            None => println!("No snapshot in {}: starting afresh", dir.display()),
        }
    }
    group
        .broadcast(&mut chosen, 0)
        .unwrap_or_else(|e| fail(Some(rank), e));
    usize::try_from(chosen[0])
        .ok()
        .map(|epochs_done| snapshot_path(dir, epochs_done))
}
