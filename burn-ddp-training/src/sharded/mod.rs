//! Checkpoints written in parts, one per rank, as PyTorch's distributed
//! checkpoint (DCP) writes them: each rank saves only what it holds (the
//! optimizer state it owns under the sharded optimizer, its share of the
//! parameters), one small metadata file names every entry's part and byte
//! range, and a load on any world size reads only the entries it needs.
//!
//! A checkpoint is a folder. It counts only once whole: every rank writes its
//! part into `NAME.partial-SAVEID/` (then flushes it to disk and renames it
//! into place), rank 0 checks that every part is there with the length its
//! writer reported, writes `metadata.json` last (flushed, renamed) and only
//! then renames the folder to `NAME`. A crash at any moment leaves either
//! the previous checkpoints untouched beside a `.partial-` folder nothing
//! loads, or the whole new one.
//!
//! What the entries hold (serialised optimizer state, tensors) is the
//! front-end's business: here they are byte strings keyed by what they are
//! ([`EntryKind`]) and the position of their parameter in the model.

mod background;
mod format;
mod load;
mod save;

pub use background::{BackgroundSave, EntrySink, Staged};
pub use format::{EntryKind, ParamShape, METADATA_FILE};
pub use load::{newest_complete, ShardedCheckpoint};
pub use save::{ShardedSave, CRASH_IN_SAVE_VAR};

#[cfg(test)]
mod tests;
