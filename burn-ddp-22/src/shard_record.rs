//! Burn 0.22's optimizer records re-keyed and merged, for the sharded
//! optimizer: a `ModuleOptimizer`'s record is a burnpack whose every entry
//! names its parameter id (tensors `"{id}.{field}"` with `param_id`,
//! scalars `"{id}.{...}"`, the path under `"{id}"`), and its fields are
//! private, so the parts are moved through the burnpack format itself.

use crate::shared::shard::{foreign_state, ownership};
use crate::shared::sharded_checkpoint::{StateSink, SHARED_STATE};
use crate::{shim, CommError, Result};
use burn::module::Module;
use burn::optim::record::OptimizerRecord;
use burn::tensor::Bytes;
use burn_ddp_comm::Sharder;
use burn_pack::{Reader, Scalar, Writer};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// This rank's `part` of the optimizer state of `model`, gathered with every
/// other rank's on rank 0 into the whole record, keyed by rank 0's
/// parameter ids (`None` on the other ranks). Collective.
pub(crate) fn gather_whole<M: Module>(
    sharder: &mut Sharder,
    model: &M,
    part: OptimizerRecord,
) -> Result<Option<OptimizerRecord>> {
    let group = sharder.group()?;
    let rank = group.rank();
    if group.world_size() == 1 {
        return Ok(Some(part));
    }
    let ids = ownership(sharder, shim::grad_walker(model))?;
    // Parameter ids are each rank's own: the parts travel keyed by position.
    let position: HashMap<u64, u64> = ids
        .iter()
        .enumerate()
        .map(|(p, (id, _))| (*id, p as u64))
        .collect();
    let part = rekey(rank, part, |id| {
        position
            .get(&id)
            .map(|p| Some(*p))
            .ok_or_else(|| foreign_state(rank, id, ids.len()))
    })?;
    let Some(parts) = group.gather_bytes(0, &record_bytes(rank, part)?)? else {
        return Ok(None);
    };
    let mut records = Vec::with_capacity(parts.len());
    for bytes in parts {
        records.push(rekey(rank, record_from_bytes(rank, bytes)?, |p| {
            let (id, _) = ids
                .get(p as usize)
                .ok_or_else(|| foreign_state(rank, p, ids.len()))?;
            Ok(Some(*id))
        })?);
    }
    merge(rank, records).map(Some)
}

/// The entries of `record` (whole, or any part) for the parameters of
/// `model` this rank owns; an entry for a parameter `model` does not have is
/// an error (the same on every rank when they hold the same record). Scalars
/// count too: SGD without momentum keeps no tensor per parameter, only its
/// rank. No communication.
pub(crate) fn owned_part<M: Module>(
    sharder: &mut Sharder,
    model: &M,
    record: OptimizerRecord,
) -> Result<OptimizerRecord> {
    let rank = sharder.group()?.rank();
    let ids = ownership(sharder, shim::grad_walker(model))?;
    let owned: HashMap<u64, bool> = ids.iter().copied().collect();
    rekey(rank, record, |id| match owned.get(&id) {
        None => Err(foreign_state(rank, id, ids.len())),
        Some(&mine) => Ok(mine.then_some(id)),
    })
}

/// `record`'s entries as a checkpoint in parts stores them, handed to
/// `sink` one at a time: each parameter's state (a burnpack of its entries
/// alone, keyed by position) under its position among the trained
/// parameters (`positions`: by parameter id), and, with `shared`, what
/// belongs to no parameter under [`SHARED_STATE`]. Burn 0.22's record
/// serialises only whole: with a `scratch` file it is streamed there and
/// read back entry by entry (so no serialised copy of it is held in
/// memory), and removed. No communication.
pub(crate) fn state_entries(
    rank: usize,
    positions: &HashMap<u64, u64>,
    record: OptimizerRecord,
    shared: bool,
    scratch: Option<&Path>,
    sink: &mut StateSink<'_>,
) -> Result<()> {
    let _removed_after = scratch.map(Scratch);
    let parts = match scratch {
        Some(file) => Parts::read_through(rank, record, file)?,
        None => Parts::read(rank, record)?,
    };
    let mut by_position: BTreeMap<u64, Parts> = BTreeMap::new();
    fn entry(by_position: &mut BTreeMap<u64, Parts>, position: u64) -> &mut Parts {
        by_position.entry(position).or_insert_with(|| Parts {
            tensors: Vec::new(),
            scalars: BTreeMap::new(),
            metadata: BTreeMap::new(),
        })
    }
    let position = |id: u64| {
        positions
            .get(&id)
            .copied()
            .ok_or_else(|| foreign_state(rank, id, positions.len()))
    };
    for tensor in parts.tensors {
        let Some(id) = tensor.param_id else {
            entry(&mut by_position, SHARED_STATE).tensors.push(tensor);
            continue;
        };
        let p = position(id)?;
        let (name, dtype, shape, _, bytes) = tensor.into_parts().map_err(|err| error(rank, err))?;
        let tensor = burn_pack::Tensor::new(renamed(&name, id, p), dtype, shape, Some(p), bytes);
        entry(&mut by_position, p).tensors.push(tensor);
    }
    for (name, value) in parts.scalars {
        let (p, name) = match key_id(&name) {
            Some(id) => (position(id)?, renamed(&name, id, position(id)?)),
            None => (SHARED_STATE, name),
        };
        entry(&mut by_position, p).scalars.insert(name, value);
    }
    for (name, value) in parts.metadata {
        let (p, name) = match key_id(&name) {
            Some(id) => (position(id)?, renamed(&name, id, position(id)?)),
            None => (SHARED_STATE, name),
        };
        entry(&mut by_position, p).metadata.insert(name, value);
    }
    // Each position's burnpack made, handed over and dropped in turn.
    while let Some((p, parts)) = by_position.pop_first() {
        if p != SHARED_STATE || shared {
            sink(p, &parts.into_bytes(rank)?);
        }
    }
    Ok(())
}

/// [`state_entries`]' inverse: one record of `entries`, keyed by `ids`
/// (this model's parameter ids, by position among the trained ones).
pub(crate) fn record_from_entries(
    rank: usize,
    ids: &[u64],
    entries: Vec<(u64, Vec<u8>)>,
) -> Result<OptimizerRecord> {
    let mut records = Vec::with_capacity(entries.len());
    for (position, bytes) in entries {
        let record = OptimizerRecord::from_bytes(Bytes::from_bytes_vec(bytes)).map_err(|err| {
            let what = match position {
                SHARED_STATE => "the state of no parameter".to_string(),
                p => format!("the state of parameter #{p}"),
            };
            error(
                rank,
                format!(
                    "the checkpoint's optimizer state, {what}, does not decode ({err}); it was \
                     saved by another optimizer or Burn version, or is damaged"
                ),
            )
        })?;
        if position == SHARED_STATE {
            records.push(record);
            continue;
        }
        records.push(rekey(rank, record, |p| {
            ids.get(p as usize)
                .map(|id| Some(*id))
                .ok_or_else(|| foreign_state(rank, p, ids.len()))
        })?);
    }
    merge(rank, records)
}

/// A record's entries, as the burnpack format holds them.
struct Parts {
    tensors: Vec<burn_pack::Tensor>,
    scalars: BTreeMap<String, Scalar>,
    metadata: BTreeMap<String, String>,
}

impl Parts {
    fn read(rank: usize, record: OptimizerRecord) -> Result<Self> {
        let bytes = record.into_bytes().map_err(|err| error(rank, err))?;
        let reader = Reader::from_bytes(bytes).map_err(|err| error(rank, err))?;
        Ok(Self {
            scalars: reader.scalars().clone(),
            metadata: reader.metadata().clone(),
            tensors: reader.into_tensors().map_err(|err| error(rank, err))?,
        })
    }

    /// [`read`](Self::read) through the file `scratch`: the record streamed
    /// there, its tensors read back from it as each is used.
    fn read_through(rank: usize, record: OptimizerRecord, scratch: &Path) -> Result<Self> {
        let at = |err: &dyn std::fmt::Display| {
            error(rank, format!("through {}: {err}", scratch.display()))
        };
        record.save(scratch).map_err(|err| at(&err))?;
        let reader = Reader::from_file_exact(scratch).map_err(|err| at(&err))?;
        Ok(Self {
            scalars: reader.scalars().clone(),
            metadata: reader.metadata().clone(),
            tensors: reader.into_tensors().map_err(|err| at(&err))?,
        })
    }

    fn write(self, rank: usize) -> Result<OptimizerRecord> {
        OptimizerRecord::from_bytes(self.into_bytes(rank)?).map_err(|err| error(rank, err))
    }

    /// The burnpack of these entries.
    fn into_bytes(self, rank: usize) -> Result<Bytes> {
        let mut writer = Writer::new(self.tensors);
        for (key, value) in &self.scalars {
            writer = writer.with_scalar(key, *value);
        }
        for (key, value) in &self.metadata {
            writer = writer.with_metadata(key, value);
        }
        writer.into_bytes().map_err(|err| error(rank, err))
    }
}

/// A scratch file, removed when this is dropped (however the save ends).
struct Scratch<'a>(&'a Path);

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.0);
    }
}

/// `record` with each parameter id `id` replaced by `key(id)`: `Some(new)`
/// renames its entries, `None` drops them, an error stops. Entries that name
/// no parameter are kept as they are.
fn rekey(
    rank: usize,
    record: OptimizerRecord,
    mut key: impl FnMut(u64) -> Result<Option<u64>>,
) -> Result<OptimizerRecord> {
    let parts = Parts::read(rank, record)?;
    let mut out = Parts {
        tensors: Vec::with_capacity(parts.tensors.len()),
        scalars: BTreeMap::new(),
        metadata: BTreeMap::new(),
    };
    for tensor in parts.tensors {
        let Some(id) = tensor.param_id else {
            out.tensors.push(tensor);
            continue;
        };
        if let Some(new) = key(id)? {
            let (name, dtype, shape, _, bytes) =
                tensor.into_parts().map_err(|err| error(rank, err))?;
            let name = renamed(&name, id, new);
            out.tensors
                .push(burn_pack::Tensor::new(name, dtype, shape, Some(new), bytes));
        }
    }
    for (name, value) in parts.scalars {
        match key_id(&name) {
            Some(id) => {
                if let Some(new) = key(id)? {
                    out.scalars.insert(renamed(&name, id, new), value);
                }
            }
            None => {
                out.scalars.insert(name, value);
            }
        }
    }
    for (name, value) in parts.metadata {
        match key_id(&name) {
            Some(id) => {
                if let Some(new) = key(id)? {
                    out.metadata.insert(renamed(&name, id, new), value);
                }
            }
            None => {
                out.metadata.insert(name, value);
            }
        }
    }
    out.write(rank)
}

/// One record holding every entry of `records` (parts of disjoint
/// parameters).
fn merge(rank: usize, records: Vec<OptimizerRecord>) -> Result<OptimizerRecord> {
    let mut all = Parts {
        tensors: Vec::new(),
        scalars: BTreeMap::new(),
        metadata: BTreeMap::new(),
    };
    for record in records {
        let parts = Parts::read(rank, record)?;
        all.tensors.extend(parts.tensors);
        all.scalars.extend(parts.scalars);
        all.metadata.extend(parts.metadata);
    }
    all.write(rank)
}

/// A record from bytes received from another rank.
pub(crate) fn record_from_bytes(rank: usize, bytes: Vec<u8>) -> Result<OptimizerRecord> {
    OptimizerRecord::from_bytes(Bytes::from_bytes_vec(bytes)).map_err(|err| error(rank, err))
}

/// A record as bytes, to send.
pub(crate) fn record_bytes(rank: usize, record: OptimizerRecord) -> Result<Vec<u8>> {
    Ok(record
        .into_bytes()
        .map_err(|err| error(rank, err))?
        .to_vec())
}

/// The parameter id a scalar or path key starts with (`"{id}"` or
/// `"{id}.{...}"`).
fn key_id(name: &str) -> Option<u64> {
    name.split('.').next()?.parse().ok()
}

/// `name` with its leading `id` replaced by `new`.
fn renamed(name: &str, id: u64, new: u64) -> String {
    let old = id.to_string();
    match name.strip_prefix(&old) {
        Some(rest) if rest.is_empty() || rest.starts_with('.') => format!("{new}{rest}"),
        _ => name.to_string(),
    }
}

fn error(rank: usize, err: impl std::fmt::Display) -> CommError {
    CommError::InvalidArgument {
        rank,
        message: format!("the sharded optimizer's record: {err}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_renamed_only_at_their_start() {
        assert_eq!(renamed("12.moment_1", 12, 3), "3.moment_1");
        assert_eq!(renamed("12", 12, 3), "3");
        assert_eq!(renamed("123.x", 12, 3), "123.x");
        assert_eq!(key_id("77.__rank"), Some(77));
        assert_eq!(key_id("lr"), None);
    }
}
