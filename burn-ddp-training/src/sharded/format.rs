//! What a sharded checkpoint's files hold: the parts' header, the metadata
//! file (JSON, so a person can read it), and their names.

use burn_ddp_comm::{CommError, Result};
use serde::{Deserialize, Serialize};

/// The metadata file, written last: a folder without it is no checkpoint.
pub const METADATA_FILE: &str = "metadata.json";

/// What the metadata file says it is.
pub(super) const FORMAT: &str = "burn-ddp sharded checkpoint";
pub(super) const VERSION: u32 = 1;

/// The first bytes of every part: magic, then the save id, the writer's rank
/// and the world size (little endian), so a part from another save is told.
pub(super) const MAGIC: &[u8; 8] = b"BDDPPART";
pub(super) const HEADER_BYTES: usize = 8 + 8 + 4 + 4;

/// What an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A parameter's values.
    Param,
    /// A parameter's optimizer state.
    OptimizerState,
}

/// A parameter's shape and element type, as the metadata records the model
/// (a load checks them before reading anything).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamShape {
    /// Dimensions.
    pub shape: Vec<usize>,
    /// Element type, as the front-end names it (`F32`, ...).
    pub dtype: String,
}

/// Where one entry is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct EntryIndex {
    pub kind: EntryKind,
    /// Its parameter's position in the model.
    pub position: u64,
    /// The rank whose part holds it.
    pub part: usize,
    pub offset: u64,
    pub len: u64,
    pub crc32: u32,
}

/// One rank's part file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct PartIndex {
    pub rank: usize,
    pub file: String,
    pub bytes: u64,
}

/// The metadata file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Metadata {
    pub format: String,
    pub version: u32,
    /// The same in every part's header.
    pub save_id: String,
    pub world_size: usize,
    /// The front-end's own description (what was trained, how far).
    pub info: String,
    /// The model's parameters, by position.
    pub model: Vec<ParamShape>,
    pub parts: Vec<PartIndex>,
    pub entries: Vec<EntryIndex>,
}

/// What each rank reports to rank 0 once its part is on disk.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct PartReport {
    /// Its part (none if it had nothing to write), or why it failed.
    pub part: std::result::Result<Option<PartIndex>, String>,
    pub entries: Vec<EntryIndex>,
}

/// The part file rank `rank` writes.
pub(super) fn part_file(rank: usize) -> String {
    format!("part-{rank:05}.bin")
}

/// The header of a part of save `save_id` written by `rank` of `world_size`.
pub(super) fn header(save_id: u64, rank: usize, world_size: usize) -> [u8; HEADER_BYTES] {
    let mut bytes = [0u8; HEADER_BYTES];
    bytes[..8].copy_from_slice(MAGIC);
    bytes[8..16].copy_from_slice(&save_id.to_le_bytes());
    bytes[16..20].copy_from_slice(&(rank as u32).to_le_bytes());
    bytes[20..24].copy_from_slice(&(world_size as u32).to_le_bytes());
    bytes
}

/// A header's save id, if `bytes` is one.
pub(super) fn save_id_of(bytes: &[u8]) -> Option<u64> {
    if bytes.len() < HEADER_BYTES || &bytes[..8] != MAGIC {
        return None;
    }
    Some(u64::from_le_bytes(bytes[8..16].try_into().ok()?))
}

/// A save id as the metadata writes it.
pub(super) fn save_id_text(save_id: u64) -> String {
    format!("{save_id:016x}")
}

/// An error of `rank` about the checkpoint (shown as "rank R: message").
pub(super) fn error(rank: usize, message: String) -> CommError {
    CommError::InvalidArgument { rank, message }
}

/// JSON, or an error of `rank` saying what could not be encoded.
pub(super) fn to_json<T: Serialize>(rank: usize, value: &T) -> Result<Vec<u8>> {
    serde_json::to_vec_pretty(value)
        .map_err(|e| error(rank, format!("cannot encode a checkpoint's index: {e}")))
}
