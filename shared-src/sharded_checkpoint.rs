//! The sharded optimizer's checkpoints in parts (burn-ddp-training's
//! `sharded`), the model's side written once for both Burns: its values by
//! position (float and int parameters in declaration order, as a rewrite
//! walks them), each rank writing those of the trained parameters it owns
//! and rank 0 the untrained ones, read back whole on every rank (the model
//! is replicated). The optimizer state's entries come from each crate's
//! records (`shard_record`).

use super::contract::{ElementType, Kind, ParamSlot, ParamView, Rewrite, Visit};
use super::dtype;
use super::walk::Walker;
use burn::tensor::{DType, TensorData};
use burn_ddp_comm::{CommError, DType as Wire, ProcessGroup, Result};
use burn_ddp_training::sharded::{
    BackgroundSave, EntryKind, EntrySink, ParamShape, ShardedCheckpoint, ShardedSave, Staged,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The optimizer state that belongs to no parameter (Burn 0.22's records
/// may hold some), saved by rank 0 and read by every rank.
pub(crate) const SHARED_STATE: u64 = u64::MAX;

/// The trained parameters as a save sees them: each one's position by its
/// id, and whether this rank owns it (by position).
pub(crate) struct Trained {
    pub positions: HashMap<u64, u64>,
    pub owned: Vec<bool>,
}

impl Trained {
    /// From the sharded plan's ownership (each trained parameter's id and
    /// whether this rank owns it, in order).
    pub fn of(ownership: &[(u64, bool)]) -> Self {
        Self {
            positions: (ownership.iter().enumerate())
                .map(|(position, (id, _))| (*id, position as u64))
                .collect(),
            owned: ownership.iter().map(|(_, mine)| *mine).collect(),
        }
    }
}

/// Where the optimizer state's entries go, one at a time: its position
/// among the trained parameters, its bytes.
pub(crate) type StateSink<'a> = dyn FnMut(u64, &[u8]) + 'a;

/// Hands the optimizer state's entries to the sink; may use the scratch
/// file it is given (on the checkpoint's file system) and removes it.
pub(crate) trait StateWriter:
    FnOnce(&mut StateSink<'_>, Option<&Path>) -> Result<()>
{
}
impl<F: FnOnce(&mut StateSink<'_>, Option<&Path>) -> Result<()>> StateWriter for F {}

/// Writes a checkpoint in parts into the folder `dir`: the values of the
/// model `walk` walks that this rank saves (`owned`: the trained parameters
/// it owns), then its optimizer state, which `state` hands to the sink
/// entry by entry (so no second copy of it is held; an error makes the save
/// fail on every rank, naming this one). Collective.
pub(crate) fn save_parts(
    group: &ProcessGroup,
    dir: &Path,
    walk: impl Walker,
    owned: &[bool],
    state: impl StateWriter,
    info: &str,
) -> Result<PathBuf> {
    let rank = group.rank();
    let mut save = ShardedSave::begin(group, dir)?;
    write_values(&mut save, &walk, owned, rank);
    write_state(&mut save, state);
    save.commit(&model_shapes(&walk), info)
}

/// [`save_parts`] in the background: the values this rank saves are copied
/// out now (in memory), and a thread writes them, then serialises and
/// writes the optimizer state (`state` owns its copy of it), while
/// training goes on; [`BackgroundSave::finish`] (collective) commits.
/// Collective (the save begins on every rank).
pub(crate) fn save_parts_in_background(
    group: &ProcessGroup,
    dir: &Path,
    walk: impl Walker,
    owned: &[bool],
    state: impl StateWriter + Send + 'static,
    info: &str,
) -> Result<BackgroundSave> {
    let save = ShardedSave::begin(group, dir)?;
    let mut staged = Staged::default();
    write_values(&mut staged, &walk, owned, group.rank());
    let rest = move |sink: &mut dyn EntrySink| write_state(sink, state);
    Ok(save.in_background(staged, rest, model_shapes(&walk), info))
}

/// The optimizer state's entries into `sink`, or why not.
fn write_state(sink: &mut dyn EntrySink, state: impl StateWriter) {
    let scratch = sink.scratch_file();
    let written = state(
        &mut |position, bytes| sink.write(EntryKind::OptimizerState, position, bytes),
        scratch.as_deref(),
    );
    if let Err(err) = written {
        sink.fail(err.to_string());
    }
}

/// Opens the checkpoint in parts in `dir` for the model `walk` walks: an
/// error unless it was saved from a model of the same parameters.
pub(crate) fn open_parts(dir: &Path, rank: usize, walk: impl Walker) -> Result<ShardedCheckpoint> {
    let checkpoint = ShardedCheckpoint::open(dir, rank)?;
    checkpoint.check_model(&model_shapes(walk))?;
    Ok(checkpoint)
}

/// The optimizer state entries at `positions` that the checkpoint holds (a
/// parameter without state has none), and the shared one if there is one.
fn read_state(
    checkpoint: &ShardedCheckpoint,
    positions: impl IntoIterator<Item = u64>,
) -> Result<StateEntries> {
    let mut entries = Vec::new();
    for position in positions.into_iter().chain([SHARED_STATE]) {
        if let Some(bytes) = checkpoint.read(EntryKind::OptimizerState, position)? {
            entries.push((position, bytes));
        }
    }
    Ok(entries)
}

/// Optimizer state entries: each one's position and bytes.
pub(crate) type StateEntries = Vec<(u64, Vec<u8>)>;

/// The optimizer state entries in `checkpoint` of the trained parameters
/// this rank keeps state for (`kept`: each trained parameter's id and
/// whether this rank keeps its state, in the model's order), with every
/// trained parameter's id in order: what the crate's `record_from_entries`
/// takes.
pub(crate) fn read_kept_state(
    checkpoint: &ShardedCheckpoint,
    kept: &[(u64, bool)],
) -> Result<(Vec<u64>, StateEntries)> {
    let ids = kept.iter().map(|(id, _)| *id).collect();
    let positions = (kept.iter().enumerate())
        .filter(|(_, (_, keeps))| *keeps)
        .map(|(position, _)| position as u64);
    Ok((ids, read_state(checkpoint, positions)?))
}

/// `loaded` on every rank, or an error on every rank: a rank that could
/// not load says why, the others how many could not. Collective.
pub(crate) fn agree_loaded<T>(group: &ProcessGroup, loaded: Result<T>) -> Result<T> {
    let failed = group.all_gather(&[loaded.is_err() as i64])?;
    let ranks: Vec<String> = (failed.iter().enumerate())
        .filter(|(_, &f)| f != 0)
        .map(|(rank, _)| rank.to_string())
        .collect();
    match loaded {
        Ok(_) if !ranks.is_empty() => Err(CommError::InvalidArgument {
            rank: group.rank(),
            message: format!(
                "the checkpoint did not load on rank(s) {}; their errors say why",
                ranks.join(", ")
            ),
        }),
        loaded => loaded,
    }
}

/// Whether a parameter has a position (bool ones are not rewritten).
fn counted(param: &dyn ParamView) -> bool {
    param.kind() != Kind::Bool
}

/// The model's parameters as the checkpoint's metadata records them.
pub(crate) fn model_shapes(walk: impl Walker) -> Vec<ParamShape> {
    struct Shapes(Vec<ParamShape>);
    impl Visit for Shapes {
        fn param(&mut self, param: &dyn ParamView) {
            if counted(param) {
                self.0.push(shape_of(&param.dims(), param.dtype()));
            }
        }
    }
    let mut shapes = Shapes(Vec::new());
    walk(&mut shapes);
    shapes.0
}

fn shape_of(dims: &[usize], dtype: DType) -> ParamShape {
    ParamShape {
        shape: dims.to_vec(),
        dtype: format!("{dtype:?}"),
    }
}

/// Writes the values this rank saves: the trained parameters it owns
/// (`owned`, by position among the trained ones, as the sharded plan
/// says) and, on rank 0, every untrained one.
pub(crate) fn write_values(
    save: &mut dyn EntrySink,
    walk: impl Walker,
    owned: &[bool],
    rank: usize,
) {
    struct Writer<'a> {
        save: &'a mut dyn EntrySink,
        owned: &'a [bool],
        rank: usize,
        position: u64,
        trained: usize,
    }
    impl Visit for Writer<'_> {
        fn param(&mut self, param: &dyn ParamView) {
            if !counted(param) {
                return;
            }
            let position = self.position;
            self.position += 1;
            let mine = if param.require_grad() {
                self.trained += 1;
                self.owned.get(self.trained - 1).copied().unwrap_or(false)
            } else {
                self.rank == 0
            };
            if !mine {
                return;
            }
            match encode(&param.dims(), param.data()) {
                Some(bytes) => self.save.write(EntryKind::Param, position, &bytes),
                None => self.save.fail(format!(
                    "parameter #{position} holds {:?} elements, which a checkpoint in parts \
                     does not store (f32, f64, f16, bf16, i32, i64)",
                    param.dtype()
                )),
            }
        }
    }
    walk(&mut Writer {
        save,
        owned,
        rank,
        position: 0,
        trained: 0,
    });
}

/// Every parameter's value from `checkpoint`, into the model `rewrite`
/// rebuilds (check the model's shapes first:
/// [`ShardedCheckpoint::check_model`]).
pub(crate) fn read_values<M>(
    checkpoint: &ShardedCheckpoint,
    rank: usize,
    rewrite: impl FnOnce(&mut dyn Rewrite) -> M,
) -> Result<M> {
    struct Reader<'a> {
        checkpoint: &'a ShardedCheckpoint,
        rank: usize,
        position: u64,
        error: Option<CommError>,
    }
    impl Rewrite for Reader<'_> {
        fn param(&mut self, param: &mut dyn ParamSlot) {
            let position = self.position;
            self.position += 1;
            if self.error.is_some() {
                return;
            }
            let data = match self.checkpoint.read(EntryKind::Param, position) {
                Ok(Some(bytes)) => decode(&bytes),
                Ok(None) => None,
                Err(err) => {
                    self.error = Some(err);
                    return;
                }
            };
            match data {
                Some((dims, data))
                    if dims == param.dims() && data.element_type() == param.dtype() =>
                {
                    param.load(data)
                }
                _ => {
                    self.error = Some(CommError::InvalidArgument {
                        rank: self.rank,
                        message: format!(
                            "{} holds no readable values of parameter #{position} ({:?} \
                             {:?}); it was saved by another program or is damaged",
                            self.checkpoint.dir().display(),
                            param.dims(),
                            param.dtype()
                        ),
                    })
                }
            }
        }
    }
    let mut reader = Reader {
        checkpoint,
        rank,
        position: 0,
        error: None,
    };
    let model = rewrite(&mut reader);
    match reader.error {
        Some(err) => Err(err),
        None => Ok(model),
    }
}

/// A value as an entry: its element type's code, its rank, its dimensions,
/// then its elements as they lie in memory.
fn encode(dims: &[usize], mut data: TensorData) -> Option<Vec<u8>> {
    let (wire, elements) = dtype::bytes_mut(&mut data)?;
    let mut bytes = Vec::with_capacity(2 + 8 * dims.len() + elements.len());
    bytes.push(wire.code() as u8);
    bytes.push(dims.len() as u8);
    for &d in dims {
        bytes.extend_from_slice(&(d as u64).to_le_bytes());
    }
    bytes.extend_from_slice(elements);
    Some(bytes)
}

/// [`encode`]'s inverse: the dimensions and the value.
fn decode(bytes: &[u8]) -> Option<(Vec<usize>, TensorData)> {
    let (&code, rest) = bytes.split_first()?;
    let (&ndim, mut rest) = rest.split_first()?;
    let wire = Wire::from_code(code as i64)?;
    let mut dims = Vec::with_capacity(ndim as usize);
    for _ in 0..ndim {
        let (d, tail) = rest.split_at_checked(8)?;
        dims.push(u64::from_le_bytes(d.try_into().ok()?) as usize);
        rest = tail;
    }
    let numel: usize = dims.iter().product();
    if rest.len() != numel * wire.size() {
        return None;
    }
    let data = TensorData::from_bytes_vec(rest.to_vec(), dims.clone(), dtype::to_burn(wire));
    Some((dims, data))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_and_damaged_ones_are_refused() {
        let values = [1.5f32, -2.0, 3.25, 0.0, 7.0, 8.5];
        let data = TensorData::new(values.to_vec(), [2, 3]);
        let bytes = encode(&[2, 3], data).unwrap();
        let (dims, back) = decode(&bytes).unwrap();
        assert_eq!(dims, [2, 3]);
        assert_eq!(back.as_slice::<f32>().unwrap(), values);
        assert!(decode(&bytes[..bytes.len() - 1]).is_none());
        let ints = TensorData::new(vec![1i64, -4], [2]);
        let (_, back) = decode(&encode(&[2], ints).unwrap()).unwrap();
        assert_eq!(back.as_slice::<i64>().unwrap(), [1, -4]);
    }
}
