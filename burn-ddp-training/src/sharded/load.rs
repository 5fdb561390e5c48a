//! Loading: the metadata read and checked against the parts on disk, then
//! each entry read from its part by its byte range, alone.

use super::format::{
    error, save_id_of, save_id_text, EntryIndex, EntryKind, Metadata, ParamShape, PartIndex,
    FORMAT, HEADER_BYTES, METADATA_FILE, VERSION,
};
use burn_ddp_comm::Result;
use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// A sharded checkpoint opened for reading (PyTorch's `dcp.load`): any rank
/// of any world size reads the entries it needs, and only those.
pub struct ShardedCheckpoint {
    dir: PathBuf,
    rank: usize,
    metadata: Metadata,
    index: HashMap<(EntryKind, u64), EntryIndex>,
    parts: HashMap<usize, PartIndex>,
    open: RefCell<HashMap<usize, File>>,
}

impl ShardedCheckpoint {
    /// Whether `dir` holds a whole sharded checkpoint (its metadata, which
    /// is written last); a save that did not finish never does.
    pub fn is_complete(dir: &Path) -> bool {
        !is_partial(dir) && dir.join(METADATA_FILE).is_file()
    }

    /// Opens the checkpoint in `dir` on `rank` (for messages): its metadata
    /// read, and every part it names found, of the length it says, from the
    /// same save. An error names the file, the rank that wrote it and what
    /// is wrong. No communication.
    pub fn open(dir: &Path, rank: usize) -> Result<Self> {
        if is_partial(dir) {
            return Err(error(
                rank,
                format!(
                    "{} is the folder of a save that did not finish (even with its metadata \
                     written, it was never renamed into place); resume from another checkpoint",
                    dir.display()
                ),
            ));
        }
        let path = dir.join(METADATA_FILE);
        let bytes = fs::read(&path).map_err(|e| {
            let why = if e.kind() == std::io::ErrorKind::NotFound {
                "not a whole sharded checkpoint (its metadata is written last: a save that did \
                 not finish has none); resume from another checkpoint"
                    .to_string()
            } else {
                e.to_string()
            };
            error(rank, format!("{}: {why}", path.display()))
        })?;
        let metadata: Metadata = serde_json::from_slice(&bytes).map_err(|e| {
            error(
                rank,
                format!(
                    "{} is not a burn-ddp sharded checkpoint's metadata: {e}",
                    path.display()
                ),
            )
        })?;
        if metadata.format != FORMAT || metadata.version != VERSION {
            return Err(error(
                rank,
                format!(
                    "{} is {:?} version {}; this burn-ddp reads {FORMAT:?} version {VERSION}",
                    path.display(),
                    metadata.format,
                    metadata.version
                ),
            ));
        }
        let checkpoint = Self {
            dir: dir.to_path_buf(),
            rank,
            index: metadata
                .entries
                .iter()
                .map(|e| ((e.kind, e.position), e.clone()))
                .collect(),
            parts: metadata.parts.iter().map(|p| (p.rank, p.clone())).collect(),
            metadata,
            open: RefCell::new(HashMap::new()),
        };
        for part in &checkpoint.metadata.parts {
            checkpoint.check_part(part)?;
        }
        Ok(checkpoint)
    }

    /// A part there, whole, of this save.
    fn check_part(&self, part: &PartIndex) -> Result<()> {
        let path = self.dir.join(&part.file);
        let whose = format!(
            "{} (written by rank {} of {})",
            part.file, part.rank, self.metadata.world_size
        );
        let fail = |what: String| {
            Err(error(
                self.rank,
                format!("{whose} in {}: {what}", self.dir.display()),
            ))
        };
        let mut file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return fail("missing; the checkpoint is incomplete".into())
            }
            Err(e) => return fail(e.to_string()),
        };
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        if len != part.bytes {
            let what = if len < part.bytes {
                "truncated"
            } else {
                "longer than saved"
            };
            return fail(format!(
                "{what}: {len} bytes, the metadata says {}",
                part.bytes
            ));
        }
        let mut head = [0u8; HEADER_BYTES];
        let read = file.read_exact(&mut head);
        match read.ok().and_then(|()| save_id_of(&head)) {
            Some(id) if save_id_text(id) == self.metadata.save_id => Ok(()),
            Some(id) => fail(format!(
                "from another save (save id {}; the metadata's is {}): the folder mixes two \
                 saves' files",
                save_id_text(id),
                self.metadata.save_id
            )),
            None => fail("not a part of a burn-ddp sharded checkpoint".into()),
        }
    }

    /// That the checkpoint was saved from a model of these parameters (by
    /// position); an error names the first that differs.
    pub fn check_model(&self, model: &[ParamShape]) -> Result<()> {
        let saved = &self.metadata.model;
        if let Some(position) =
            (0..saved.len().max(model.len())).find(|&p| saved.get(p) != model.get(p))
        {
            let describe = |p: Option<&ParamShape>| {
                p.map_or("absent".to_string(), |p| {
                    format!("{:?} {}", p.shape, p.dtype)
                })
            };
            return Err(error(
                self.rank,
                format!(
                    "{} holds another model: parameter #{position} is {} there and {} here ({} \
                     parameters there, {} here); resume with the model it was saved from",
                    self.dir.display(),
                    describe(saved.get(position)),
                    describe(model.get(position)),
                    saved.len(),
                    model.len()
                ),
            ));
        }
        Ok(())
    }

    /// Its folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The world size it was saved with.
    pub fn world_size(&self) -> usize {
        self.metadata.world_size
    }

    /// The front-end's description, as saved.
    pub fn info(&self) -> &str {
        &self.metadata.info
    }

    /// The model's parameters, as saved.
    pub fn model(&self) -> &[ParamShape] {
        &self.metadata.model
    }

    /// Whether it holds an entry of `kind` for the parameter at `position`.
    pub fn has(&self, kind: EntryKind, position: u64) -> bool {
        self.index.contains_key(&(kind, position))
    }

    /// The entry of `kind` for the parameter at `position` (`None` if the
    /// save had none), read from its part alone and checked against its
    /// checksum.
    pub fn read(&self, kind: EntryKind, position: u64) -> Result<Option<Vec<u8>>> {
        let Some(entry) = self.index.get(&(kind, position)) else {
            return Ok(None);
        };
        let part = self.parts.get(&entry.part).ok_or_else(|| {
            error(
                self.rank,
                format!(
                    "{}: an entry in the part of rank {}, which it does not list",
                    self.dir.join(METADATA_FILE).display(),
                    entry.part
                ),
            )
        })?;
        let what = match kind {
            EntryKind::Param => "values",
            EntryKind::OptimizerState => "optimizer state",
        };
        let fail = |why: String| {
            error(
                self.rank,
                format!(
                    "{} (written by rank {}): parameter #{position}'s {what}: {why}",
                    self.dir.join(&part.file).display(),
                    part.rank
                ),
            )
        };
        let mut open = self.open.borrow_mut();
        let file = match open.entry(entry.part) {
            std::collections::hash_map::Entry::Occupied(file) => file.into_mut(),
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(File::open(self.dir.join(&part.file)).map_err(|e| fail(e.to_string()))?)
            }
        };
        let mut bytes = vec![0u8; entry.len as usize];
        file.seek(SeekFrom::Start(entry.offset))
            .and_then(|_| file.read_exact(&mut bytes))
            .map_err(|e| fail(e.to_string()))?;
        if crc32fast::hash(&bytes) != entry.crc32 {
            return Err(fail("fails its checksum: the file is damaged".into()));
        }
        Ok(Some(bytes))
    }
}

/// The newest whole checkpoint in parts among the folders in `parent` (the
/// one whose metadata was written last; on a tie, the name that sorts
/// last), for resuming by itself; a save that did not finish is never
/// picked. `None` when there is none (or no
/// `parent`).
pub fn newest_complete(parent: &Path) -> Option<PathBuf> {
    let listing = std::fs::read_dir(parent).ok()?;
    listing
        .flatten()
        .map(|entry| entry.path())
        .filter(|dir| ShardedCheckpoint::is_complete(dir))
        .filter_map(|dir| {
            let written = dir.join(METADATA_FILE).metadata().ok()?.modified().ok()?;
            Some((written, dir))
        })
        .max()
        .map(|(_, dir)| dir)
}

/// Whether `dir` is a save's folder before its rename (`NAME.partial-ID`).
fn is_partial(dir: &Path) -> bool {
    dir.file_name()
        .is_some_and(|name| name.to_string_lossy().contains(".partial-"))
}
