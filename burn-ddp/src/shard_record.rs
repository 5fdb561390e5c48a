//! Burn 0.21's optimizer records split, re-keyed and merged, for the sharded
//! optimizer: every optimizer of Burn 0.21 keeps a map from parameter id to
//! that parameter's state, and its record's serialised form (the record's
//! item) is a map keyed by the id's text. The parts are handled in that
//! form, so any optimizer whose record has it can be sharded, whatever its
//! state's type (the Learner knows its optimizer's record only as a type).

use crate::shared::shard::{foreign_state, ownership};
use crate::shared::sharded_checkpoint::StateSink;
use crate::{shim, CommError, Result};
use burn::module::{AutodiffModule, ParamId};
use burn::record::{DoublePrecisionSettings, FullPrecisionSettings, PrecisionSettings, Record};
use burn::tensor::backend::AutodiffBackend;
use burn_ddp_comm::Sharder;
use ciborium::Value;
use std::collections::HashMap;

/// A record's entries: each parameter id with its state (as serialised, at
/// double precision so every float type crosses exactly).
type Entries = Vec<(u64, Value)>;

/// This rank's `part` of the optimizer state of `model`, gathered with every
/// other rank's on rank 0 into the whole record, keyed by rank 0's
/// parameter ids (`None` on the other ranks). Collective.
pub(crate) fn gather_whole<B, M, R>(sharder: &mut Sharder, model: &M, part: R) -> Result<Option<R>>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    R: Record<B>,
{
    let group = sharder.group()?;
    let rank = group.rank();
    if group.world_size() == 1 {
        return Ok(Some(part));
    }
    let ids = ownership(sharder, shim::grad_walker::<B, M>(model))?;
    // Parameter ids are each rank's own: the parts travel keyed by position.
    let position: HashMap<u64, u64> = ids
        .iter()
        .enumerate()
        .map(|(p, (id, _))| (*id, p as u64))
        .collect();
    let mut by_position = Entries::new();
    for (id, state) in entries(rank, part)? {
        let p = position
            .get(&id)
            .ok_or_else(|| foreign_state(rank, id, ids.len()))?;
        by_position.push((*p, state));
    }
    let Some(parts) = group.gather_bytes(0, &encode(rank, by_position)?)? else {
        return Ok(None);
    };
    let mut whole = Entries::new();
    for bytes in parts {
        for (p, state) in decode(rank, &bytes)? {
            let (id, _) = ids
                .get(p as usize)
                .ok_or_else(|| foreign_state(rank, p, ids.len()))?;
            whole.push((*id, state));
        }
    }
    let device = model.devices().into_iter().next().unwrap_or_default();
    record_of(rank, whole, &device).map(Some)
}

/// The entries of `record` (whole, or any part) for the parameters of
/// `model` this rank owns; an entry for a parameter `model` does not have is
/// an error (the same on every rank when they hold the same record). No
/// communication.
pub(crate) fn owned_part<B, M, R>(sharder: &mut Sharder, model: &M, record: R) -> Result<R>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    R: Record<B>,
{
    let rank = sharder.group()?.rank();
    let ids = ownership(sharder, shim::grad_walker::<B, M>(model))?;
    let owned: HashMap<u64, bool> = ids.iter().copied().collect();
    let mut kept = Entries::new();
    for (id, state) in entries(rank, record)? {
        match owned.get(&id) {
            None => return Err(foreign_state(rank, id, ids.len())),
            Some(true) => kept.push((id, state)),
            Some(false) => {}
        }
    }
    let device = model.devices().into_iter().next().unwrap_or_default();
    record_of(rank, kept, &device)
}

/// `record`'s entries as a checkpoint in parts stores them, handed to
/// `sink` one at a time: each parameter's state (CBOR) under its position
/// among the trained parameters (`positions`: by parameter id). At full
/// precision unless the backend's floats are f64 (exact either way). Burn
/// 0.21 serialises a record only whole: its item, then its value, are
/// made first (each a copy of this rank's share, briefly both), then the
/// entries go one by one. No communication.
pub(crate) fn state_entries<B: AutodiffBackend, R: Record<B>>(
    rank: usize,
    positions: &HashMap<u64, u64>,
    record: R,
    sink: &mut StateSink<'_>,
) -> Result<()> {
    let value = if in_double::<B>() {
        Value::serialized(&record.into_item::<DoublePrecisionSettings>())
    } else {
        Value::serialized(&record.into_item::<FullPrecisionSettings>())
    };
    let Value::Map(map) = value.map_err(|err| error(rank, err))? else {
        return Err(not_keyed(rank));
    };
    let mut bytes = Vec::new();
    for (key, state) in map {
        let id = key
            .as_text()
            .and_then(ParamId::try_deserialize)
            .ok_or_else(|| not_keyed(rank))?
            .val();
        let position = positions
            .get(&id)
            .ok_or_else(|| foreign_state(rank, id, positions.len()))?;
        bytes.clear();
        ciborium::into_writer(&state, &mut bytes).map_err(|err| error(rank, err))?;
        drop(state);
        sink(*position, &bytes);
    }
    Ok(())
}

/// [`state_entries`]' inverse: the record of `entries`, keyed by `ids`
/// (this model's parameter ids, by position among the trained ones).
pub(crate) fn record_from_entries<B: AutodiffBackend, R: Record<B>>(
    rank: usize,
    ids: &[u64],
    entries: Vec<(u64, Vec<u8>)>,
    device: &B::Device,
) -> Result<R> {
    let entries = entries
        .into_iter()
        .map(|(position, bytes)| {
            let id = ids
                .get(position as usize)
                .ok_or_else(|| foreign_state(rank, position, ids.len()))?;
            let state: Value = ciborium::from_reader(bytes.as_slice())
                .map_err(|err| unreadable(rank, position, err))?;
            Ok((*id, state))
        })
        .collect::<Result<Entries>>()?;
    let record = if in_double::<B>() {
        record_at::<B, R, DoublePrecisionSettings>(rank, entries, device)
    } else {
        record_at::<B, R, FullPrecisionSettings>(rank, entries, device)
    };
    record.map_err(|err| {
        error(
            rank,
            format!(
                "the checkpoint's optimizer state does not fit this optimizer ({err}); resume \
                 with the optimizer and the Burn version it was saved with"
            ),
        )
    })
}

/// A checkpoint entry that does not decode: the parameter it is for, and
/// the likely cause.
fn unreadable(rank: usize, position: u64, err: impl std::fmt::Display) -> CommError {
    error(
        rank,
        format!(
            "the checkpoint's optimizer state of parameter #{position} does not decode ({err}); \
             it was saved by another optimizer or Burn version, or is damaged"
        ),
    )
}

/// `record`'s entries; an error unless it is keyed by parameter.
fn entries<B: AutodiffBackend, R: Record<B>>(rank: usize, record: R) -> Result<Entries> {
    let item = record.into_item::<DoublePrecisionSettings>();
    let value = Value::serialized(&item).map_err(|err| error(rank, err))?;
    let Value::Map(map) = value else {
        return Err(not_keyed(rank));
    };
    map.into_iter()
        .map(|(key, state)| {
            let id = key
                .as_text()
                .and_then(ParamId::try_deserialize)
                .ok_or_else(|| not_keyed(rank))?;
            Ok((id.val(), state))
        })
        .collect()
}

/// The record of `entries`.
fn record_of<B: AutodiffBackend, R: Record<B>>(
    rank: usize,
    entries: Entries,
    device: &B::Device,
) -> Result<R> {
    record_at::<B, R, DoublePrecisionSettings>(rank, entries, device)
}

/// [`record_of`] from entries serialised at precision `S`.
fn record_at<B: AutodiffBackend, R: Record<B>, S: PrecisionSettings>(
    rank: usize,
    entries: Entries,
    device: &B::Device,
) -> Result<R> {
    let map = entries
        .into_iter()
        .map(|(id, state)| (Value::Text(ParamId::from(id).serialize()), state))
        .collect();
    let item: R::Item<S> = Value::Map(map)
        .deserialized()
        .map_err(|err| error(rank, err))?;
    Ok(R::from_item(item, device))
}

/// Whether checkpoints in parts hold the state at double precision: only
/// when the backend's floats are f64 (full precision is exact otherwise,
/// at half the size).
fn in_double<B: AutodiffBackend>() -> bool {
    <B::FloatElem as burn_backend::Element>::dtype() == burn::tensor::DType::F64
}

fn encode(rank: usize, entries: Entries) -> Result<Vec<u8>> {
    let map = entries
        .into_iter()
        .map(|(id, state)| (Value::Integer(id.into()), state))
        .collect();
    let mut bytes = Vec::new();
    ciborium::into_writer(&Value::Map(map), &mut bytes).map_err(|err| error(rank, err))?;
    Ok(bytes)
}

fn decode(rank: usize, bytes: &[u8]) -> Result<Entries> {
    let value: Value = ciborium::from_reader(bytes).map_err(|err| error(rank, err))?;
    let Value::Map(map) = value else {
        return Err(error(rank, "a part is not a map"));
    };
    map.into_iter()
        .map(|(key, state)| {
            let id = key
                .as_integer()
                .and_then(|id| u64::try_from(id).ok())
                .ok_or_else(|| error(rank, "a part's key is not a position"))?;
            Ok((id, state))
        })
        .collect()
}

fn not_keyed(rank: usize) -> CommError {
    error(
        rank,
        "it is not keyed by parameter id: sharding needs an optimizer whose state is one \
         entry per parameter, as all of Burn's (SGD, Adam, AdamW, RMSprop, AdaGrad...)",
    )
}

fn error(rank: usize, err: impl std::fmt::Display) -> CommError {
    CommError::InvalidArgument {
        rank,
        message: format!("the sharded optimizer's record: {err}"),
    }
}
