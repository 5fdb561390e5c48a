//! Saving: every rank streams its entries into its own part; `commit` makes
//! the checkpoint whole on every rank, or fails on every rank.

use super::format::{
    error, header, part_file, save_id_text, to_json, EntryIndex, EntryKind, Metadata, ParamShape,
    PartIndex, PartReport, FORMAT, METADATA_FILE, VERSION,
};
use crate::files;
use burn_ddp_comm::{ProcessGroup, Result};
use std::fs::{self, File};
use std::hash::{BuildHasher, Hasher};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// For the fault tests: `RANK:MOMENT` makes rank RANK kill itself
/// (SIGKILL) at that moment of a sharded save: `begun`, `writing` (its
/// first entry written), `written` (its part on disk under its name),
/// `committing` (rank 0: the metadata written, the folder not yet renamed),
/// `renamed` (rank 0: the checkpoint whole, the others not told yet).
#[doc(hidden)]
pub const CRASH_IN_SAVE_VAR: &str = "BURN_DDP_TEST_CRASH_IN_SAVE";

fn crash_point(rank: usize, moment: &str) {
    if std::env::var(CRASH_IN_SAVE_VAR).is_ok_and(|v| v == format!("{rank}:{moment}")) {
        // SAFETY: signalling this process.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

/// A sharded checkpoint being written (PyTorch's `dcp.save`): begun by every
/// rank together, written by each rank alone, committed by every rank
/// together.
///
/// ```no_run
/// # use burn_ddp_training::sharded::{EntryKind, ParamShape, ShardedSave};
/// # fn save(group: &burn_ddp_comm::ProcessGroup, mine: Vec<(u64, Vec<u8>)>, model: &[ParamShape]) -> burn_ddp_comm::Result<()> {
/// let mut save = ShardedSave::begin(group, "checkpoints/epoch-3".as_ref())?;
/// for (position, state) in mine {
///     save.write(EntryKind::OptimizerState, position, &state);
/// }
/// save.commit(model, "epoch 3")?; // whole on every rank, or an error on every rank
/// # Ok(())
/// # }
/// ```
pub struct ShardedSave {
    group: ProcessGroup,
    target: PathBuf,
    partial: PathBuf,
    save_id: u64,
    part: Option<PartWriter>,
    entries: Vec<EntryIndex>,
    /// The first thing that went wrong here, reported at `commit`.
    failed: Option<String>,
}

/// This rank's part, written to a temporary name until it is whole.
struct PartWriter {
    file: BufWriter<File>,
    temporary: PathBuf,
    written: u64,
}

impl ShardedSave {
    /// Begins a save into the folder `target`, which every rank must see (a
    /// shared file system) and which must not exist yet: a checkpoint is
    /// never written over. Leftovers of an interrupted save under the same
    /// name are removed. Collective; an error on every rank.
    pub fn begin(group: &ProcessGroup, target: &Path) -> Result<Self> {
        let rank = group.rank();
        let begun = if rank == 0 { prepare(target) } else { Ok(0) };
        let save_id = agree(group, begun.map_err(|e| format!("rank 0: {e}")))?;
        let partial = partial_folder(target, save_id);
        crash_point(rank, "begun");
        Ok(Self {
            group: group.clone(),
            target: target.to_path_buf(),
            partial,
            save_id,
            part: None,
            entries: Vec::new(),
            failed: None,
        })
    }

    /// This rank's rank.
    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    /// This rank's scratch file in the save's folder
    /// ([`EntrySink::scratch_file`](super::EntrySink::scratch_file)): gone
    /// with the folder if the save never finishes.
    pub(super) fn scratch(&self) -> PathBuf {
        self.partial
            .join(format!(".scratch-{}.tmp", self.group.rank()))
    }

    /// Adds an entry to this rank's part. Never fails here: whatever went
    /// wrong is reported by [`commit`](Self::commit), on every rank.
    pub fn write(&mut self, kind: EntryKind, position: u64, bytes: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        if let Err(message) = self.append(kind, position, bytes) {
            self.failed = Some(message);
        }
        if self.entries.len() == 1 {
            crash_point(self.group.rank(), "writing");
        }
    }

    /// Records that this rank could not produce what it should write
    /// (`message` says why): [`commit`](Self::commit) then fails on every
    /// rank, naming this one. Call `commit` anyway, so no rank waits.
    pub fn fail(&mut self, message: impl Into<String>) {
        self.failed.get_or_insert_with(|| message.into());
    }

    fn append(
        &mut self,
        kind: EntryKind,
        position: u64,
        bytes: &[u8],
    ) -> std::result::Result<(), String> {
        if self.part.is_none() {
            self.part = Some(self.open_part()?);
        }
        let part = self.part.as_mut().expect("opened above");
        part.file
            .write_all(bytes)
            .map_err(|e| format!("writing {}: {e}", part.temporary.display()))?;
        self.entries.push(EntryIndex {
            kind,
            position,
            part: self.group.rank(),
            offset: part.written,
            len: bytes.len() as u64,
            crc32: crc32fast::hash(bytes),
        });
        part.written += bytes.len() as u64;
        Ok(())
    }

    fn open_part(&self) -> std::result::Result<PartWriter, String> {
        let rank = self.group.rank();
        if !self.partial.is_dir() {
            return Err(format!(
                "the checkpoint's folder {} is not visible here: every rank must see the same \
                 folder (a shared file system)",
                self.partial.display()
            ));
        }
        let temporary = self.partial.join(format!(".{}.writing", part_file(rank)));
        let file = File::create(&temporary)
            .map_err(|e| format!("cannot create {}: {e}", temporary.display()))?;
        let mut file = BufWriter::with_capacity(1 << 20, file);
        let head = header(self.save_id, rank, self.group.world_size());
        file.write_all(&head)
            .map_err(|e| format!("writing {}: {e}", temporary.display()))?;
        Ok(PartWriter {
            file,
            temporary,
            written: head.len() as u64,
        })
    }

    /// Ends the save: each rank's part is flushed to disk and put in place,
    /// rank 0 checks that every part is there, whole, then writes the
    /// metadata (`model`: the parameters by position; `info`: the front-end's
    /// own description) and renames the folder to its name. Returns the
    /// folder. Collective; an error on every rank, naming the rank that
    /// failed and why. No folder appears under the name unless whole;
    /// what a failed save leaves beside it (`NAME.partial-ID`) is never
    /// loaded and goes with the next save of that name. A rank still
    /// writing holds the others here, up to the group's timeout: a part
    /// that takes longer to write fails the save.
    pub fn commit(mut self, model: &[ParamShape], info: &str) -> Result<PathBuf> {
        let rank = self.group.rank();
        let report = PartReport {
            part: self.finish_part(),
            entries: std::mem::take(&mut self.entries),
        };
        crash_point(rank, "written");
        let gathered = self.group.gather_bytes(0, &to_json(rank, &report)?)?;
        let outcome = match gathered {
            Some(reports) => self.complete(reports, model, info),
            None => Ok(0),
        };
        if rank == 0 && outcome.is_err() {
            let _ = fs::remove_dir_all(&self.partial);
        }
        agree(&self.group, outcome)?;
        Ok(self.target)
    }

    /// This rank's part on disk under its name (none if it wrote nothing).
    fn finish_part(&mut self) -> std::result::Result<Option<PartIndex>, String> {
        if let Some(failed) = self.failed.take() {
            return Err(failed);
        }
        let Some(part) = self.part.take() else {
            return Ok(None);
        };
        let PartWriter {
            file,
            temporary,
            written,
        } = part;
        let file = file
            .into_inner()
            .map_err(|e| format!("writing {}: {}", temporary.display(), e.error()))?;
        file.sync_all()
            .map_err(|e| format!("flushing {} to disk: {e}", temporary.display()))?;
        let name = part_file(self.group.rank());
        fs::rename(&temporary, self.partial.join(&name))
            .map_err(|e| format!("renaming {}: {e}", temporary.display()))?;
        Ok(Some(PartIndex {
            rank: self.group.rank(),
            file: name,
            bytes: written,
        }))
    }

    /// Rank 0: every part there and whole, the metadata written last, the
    /// folder renamed. The save id on success.
    fn complete(
        &self,
        reports: Vec<Vec<u8>>,
        model: &[ParamShape],
        info: &str,
    ) -> std::result::Result<u64, String> {
        let mut parts = Vec::new();
        let mut entries = Vec::new();
        for (rank, bytes) in reports.iter().enumerate() {
            let report: PartReport = serde_json::from_slice(bytes)
                .map_err(|e| format!("rank {rank}'s report is unreadable: {e}"))?;
            let part = report.part.map_err(|e| format!("rank {rank}: {e}"))?;
            if let Some(part) = part {
                let path = self.partial.join(&part.file);
                let found = fs::metadata(&path).map(|m| m.len()).ok();
                if found != Some(part.bytes) {
                    return Err(format!(
                        "{} (rank {rank}'s part) is {} in {}: every rank must write into \
                         the same folder (a shared file system)",
                        part.file,
                        found.map_or("missing".into(), |n| format!(
                            "{n} bytes, not {}",
                            part.bytes
                        )),
                        self.partial.display()
                    ));
                }
                parts.push(part);
            }
            entries.extend(report.entries);
        }
        let metadata = Metadata {
            format: FORMAT.into(),
            version: VERSION,
            save_id: save_id_text(self.save_id),
            world_size: self.group.world_size(),
            info: info.into(),
            model: model.to_vec(),
            parts,
            entries,
        };
        let json = serde_json::to_vec_pretty(&metadata).map_err(|e| e.to_string())?;
        files::write_atomic(&self.partial.join(METADATA_FILE), &json).map_err(|e| e.to_string())?;
        crash_point(0, "committing");
        fs::rename(&self.partial, &self.target).map_err(|e| {
            format!(
                "renaming {} to {}: {e}",
                self.partial.display(),
                self.target.display()
            )
        })?;
        sync_folder(self.target.parent());
        crash_point(0, "renamed");
        Ok(self.save_id)
    }
}

/// Rank 0 before a save: the target free, leftovers of interrupted saves
/// under its name gone, a fresh save id and its folder made.
fn prepare(target: &Path) -> std::result::Result<u64, String> {
    if target.exists() {
        return Err(format!(
            "{} exists: a checkpoint is never written over; save under a new name (with the \
             step or epoch in it) or remove it first",
            target.display()
        ));
    }
    let parent = parent_of(target);
    fs::create_dir_all(&parent)
        .map_err(|e| format!("cannot create the folder {}: {e}", parent.display()))?;
    remove_interrupted(target);
    let save_id = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
        ^ std::process::id() as u64;
    let partial = partial_folder(target, save_id);
    fs::create_dir(&partial)
        .map_err(|e| format!("cannot create the folder {}: {e}", partial.display()))?;
    Ok(save_id)
}

/// Removes `NAME.partial-*` folders beside `target` (saves that never
/// finished: nothing loads them).
fn remove_interrupted(target: &Path) {
    let Some(name) = target.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return;
    };
    let prefix = format!("{name}.partial-");
    let Ok(listing) = fs::read_dir(parent_of(target)) else {
        return;
    };
    for entry in listing.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// Where a save writes until it is whole.
fn partial_folder(target: &Path, save_id: u64) -> PathBuf {
    let name = target.file_name().unwrap_or_default().to_string_lossy();
    parent_of(target).join(format!("{name}.partial-{}", save_id_text(save_id)))
}

fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Makes a rename in `folder` durable.
fn sync_folder(folder: Option<&Path>) {
    let folder = match folder {
        Some(f) if !f.as_os_str().is_empty() => f,
        _ => Path::new("."),
    };
    if let Ok(dir) = File::open(folder) {
        let _ = dir.sync_all();
    }
}

/// Rank 0's outcome on every rank: the save id, or rank 0's message as this
/// rank's error. Collective.
fn agree(group: &ProcessGroup, outcome: std::result::Result<u64, String>) -> Result<u64> {
    let rank = group.rank();
    // [0 = ok, 1 = failed, save id, message length], then the message.
    let mut head = [0i64; 3];
    if rank == 0 {
        head = match &outcome {
            Ok(id) => [0, *id as i64, 0],
            Err(message) => [1, 0, message.len() as i64],
        };
    }
    group.broadcast(&mut head, 0)?;
    if head[0] == 0 {
        return Ok(head[1] as u64);
    }
    let mut words = vec![0i64; (head[2] as usize).div_ceil(8)];
    if let (0, Err(message)) = (rank, &outcome) {
        for (word, chunk) in words.iter_mut().zip(message.as_bytes().chunks(8)) {
            let mut bytes = [0u8; 8];
            bytes[..chunk.len()].copy_from_slice(chunk);
            *word = i64::from_le_bytes(bytes);
        }
    }
    group.broadcast(&mut words, 0)?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let message = String::from_utf8_lossy(&bytes[..head[2] as usize]);
    Err(error(
        rank,
        format!("the checkpoint was not saved: {message}"),
    ))
}
