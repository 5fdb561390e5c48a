//! Saving in the background (PyTorch's `dcp.async_save`): what a rank saves
//! is staged in memory first (the caller's copy, taken between steps) or
//! handed over as a value the thread serialises itself, a thread writes it
//! to the rank's part while training goes on, and `finish` (collective)
//! waits for the thread and commits.

use super::format::{EntryKind, ParamShape};
use super::save::ShardedSave;
use burn_ddp_comm::Result;
use std::path::PathBuf;
use std::thread::JoinHandle;

/// Where a rank's entries go: its part ([`ShardedSave`]) or memory
/// ([`Staged`], for a save in the background).
pub trait EntrySink {
    /// Adds an entry; whatever goes wrong is reported at the commit.
    fn write(&mut self, kind: EntryKind, position: u64, bytes: &[u8]);
    /// This rank could not produce an entry (`message` says why): the save
    /// fails on every rank, naming this one.
    fn fail(&mut self, message: String);
}

impl EntrySink for ShardedSave {
    fn write(&mut self, kind: EntryKind, position: u64, bytes: &[u8]) {
        ShardedSave::write(self, kind, position, bytes)
    }
    fn fail(&mut self, message: String) {
        ShardedSave::fail(self, message)
    }
}

/// A rank's entries copied out, to be written later.
#[derive(Default)]
pub struct Staged {
    entries: Vec<(EntryKind, u64, Vec<u8>)>,
    failed: Option<String>,
}

impl Staged {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.entries.iter().map(|(_, _, b)| b.len()).sum()
    }
}

impl EntrySink for Staged {
    fn write(&mut self, kind: EntryKind, position: u64, bytes: &[u8]) {
        self.entries.push((kind, position, bytes.to_vec()));
    }
    fn fail(&mut self, message: String) {
        self.failed.get_or_insert(message);
    }
}

/// A checkpoint in parts being written by a thread: [`finish`](Self::finish)
/// it (every rank, at the same point of the program) before the next one.
pub struct BackgroundSave {
    writer: JoinHandle<ShardedSave>,
    model: Vec<ParamShape>,
    info: String,
}

impl BackgroundSave {
    /// Whether this rank's part is written (its thread is done).
    pub fn is_written(&self) -> bool {
        self.writer.is_finished()
    }

    /// Waits for this rank's part, then commits the checkpoint as
    /// [`ShardedSave::commit`] does: whole on every rank, or an error on
    /// every rank. Collective.
    pub fn finish(self) -> Result<PathBuf> {
        let save = self
            .writer
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        save.commit(&self.model, &self.info)
    }
}

impl ShardedSave {
    /// Hands this rank's `staged` entries to a thread that writes them to
    /// its part while the caller goes on, then lets `rest` write more there
    /// (what the thread can serialise itself, from a value the caller no
    /// longer changes); [`BackgroundSave::finish`] commits with the model's
    /// parameters `model` and `info`. No communication.
    pub fn in_background(
        mut self,
        staged: Staged,
        rest: impl FnOnce(&mut dyn EntrySink) + Send + 'static,
        model: Vec<ParamShape>,
        info: &str,
    ) -> Result<BackgroundSave> {
        if let Some(failed) = staged.failed {
            self.fail(failed);
        }
        let rank = self.rank();
        let writer = std::thread::Builder::new()
            .name(format!("burn-ddp-save-{rank}"))
            .spawn(move || {
                for (kind, position, bytes) in staged.entries {
                    self.write(kind, position, &bytes);
                }
                rest(&mut self);
                self
            })
            .map_err(|err| {
                super::format::error(
                    rank,
                    format!("cannot start the checkpoint's writer thread: {err}"),
                )
            })?;
        Ok(BackgroundSave {
            writer,
            model,
            info: info.to_string(),
        })
    }
}
