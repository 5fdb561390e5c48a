//! Saving in the background (PyTorch's `dcp.async_save`): what a rank saves
//! is staged in memory first (the caller's copy, taken between steps) or
//! handed over as a value the thread serialises itself, a thread writes it
//! to the rank's part while training goes on, and `finish` (collective)
//! waits for the thread and commits.

use super::format::{EntryKind, ParamShape};
use super::save::ShardedSave;
use burn_ddp_comm::Result;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Where a rank's entries go: its part ([`ShardedSave`]) or memory
/// ([`Staged`], for a save in the background).
pub trait EntrySink {
    /// Adds an entry; whatever goes wrong is reported at the commit.
    fn write(&mut self, kind: EntryKind, position: u64, bytes: &[u8]);
    /// This rank could not produce an entry (`message` says why): the save
    /// fails on every rank, naming this one.
    fn fail(&mut self, message: String);
    /// A file this rank may use while it prepares its entries (something
    /// it can serialise only whole, streamed to disk and read back entry by
    /// entry instead of held in memory), on the checkpoint's file system;
    /// the caller removes it before the save commits. `None`: keep it in
    /// memory.
    fn scratch_file(&self) -> Option<PathBuf> {
        None
    }
}

impl EntrySink for ShardedSave {
    fn write(&mut self, kind: EntryKind, position: u64, bytes: &[u8]) {
        ShardedSave::write(self, kind, position, bytes)
    }
    fn fail(&mut self, message: String) {
        ShardedSave::fail(self, message)
    }
    fn scratch_file(&self) -> Option<PathBuf> {
        Some(self.scratch())
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
/// Dropped without `finish`, this rank never commits and the others wait
/// for it until the group's timeout.
pub struct BackgroundSave {
    writing: Writing,
    model: Vec<ParamShape>,
    info: String,
}

/// Where this rank's part is being written.
enum Writing {
    Thread(JoinHandle<ShardedSave>),
    /// The system refused a thread: written on the caller's, already.
    Done(ShardedSave),
}

impl BackgroundSave {
    /// Whether this rank's part is written (its thread is done).
    pub fn is_written(&self) -> bool {
        match &self.writing {
            Writing::Thread(thread) => thread.is_finished(),
            Writing::Done(_) => true,
        }
    }

    /// Waits for this rank's part, then commits the checkpoint as
    /// [`ShardedSave::commit`] does: whole on every rank, or an error on
    /// every rank. Collective.
    pub fn finish(self) -> Result<PathBuf> {
        let save = match self.writing {
            // The thread never panics out: it catches a panic and records it.
            Writing::Thread(thread) => thread.join().expect("the writer catches its panics"),
            Writing::Done(save) => save,
        };
        save.commit(&self.model, &self.info)
    }
}

impl ShardedSave {
    /// Hands this rank's `staged` entries to a thread that writes them to
    /// its part while the caller goes on, then lets `rest` write more there
    /// (what the thread can serialise itself, from a value the caller no
    /// longer changes); [`BackgroundSave::finish`] commits with the model's
    /// parameters `model` and `info`. A panic on the thread fails the save
    /// on every rank; without a thread (the system refuses one) it is all
    /// written here, now. No communication.
    pub fn in_background(
        mut self,
        staged: Staged,
        rest: impl FnOnce(&mut dyn EntrySink) + Send + 'static,
        model: Vec<ParamShape>,
        info: &str,
    ) -> BackgroundSave {
        if let Some(failed) = staged.failed {
            self.fail(failed);
        }
        let rank = self.rank();
        let job = Arc::new(Mutex::new(Some((self, staged.entries, rest))));
        let for_thread = Arc::clone(&job);
        let spawned = std::thread::Builder::new()
            .name(format!("burn-ddp-save-{rank}"))
            .spawn(move || {
                let job = for_thread.lock().unwrap().take();
                let (save, entries, rest) = job.expect("taken once");
                write_all(save, entries, rest)
            });
        let writing = match spawned {
            Ok(thread) => Writing::Thread(thread),
            Err(_) => {
                let job = job.lock().unwrap().take();
                let (save, entries, rest) = job.expect("the thread never started");
                Writing::Done(write_all(save, entries, rest))
            }
        };
        BackgroundSave {
            writing,
            model,
            info: info.to_string(),
        }
    }
}

/// Writes `entries`, then what `rest` writes, into `save`; a panic becomes
/// the save's failure (so the commit still runs on every rank).
fn write_all(
    mut save: ShardedSave,
    entries: Vec<(EntryKind, u64, Vec<u8>)>,
    rest: impl FnOnce(&mut dyn EntrySink),
) -> ShardedSave {
    let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        for (kind, position, bytes) in entries {
            save.write(kind, position, &bytes);
        }
        rest(&mut save);
    }));
    if let Err(panic) = written {
        let why = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("a panic");
        save.fail(format!("writing its part panicked: {why}"));
    }
    save
}
