//! Checkpoints written atomically: a crash mid-save leaves the previous file
//! intact, never a truncated one.
//!
//! One file holds the model (Burn 0.22's burnpack bytes), the optimizer's
//! state and the epoch, as sections of `burn_ddp_training::files::Sections`,
//! written with `burn_ddp_training::files::write_atomic` (a temporary file beside
//! the target, flushed, renamed over it).

use crate::shared::checkpoint::RecordFault;
use burn::module::Module;
use burn::optim::ModuleOptimizer;
use burn::store::{ModuleRecord, RecordError};
use burn::tensor::Bytes;
use burn_ddp_training::files::{self, Sections};
use std::path::{Path, PathBuf};

/// The extension of the checkpoint files.
pub const EXTENSION: &str = "ckpt";

/// Why a checkpoint could not be written or read (never `Shape` on Burn
/// 0.22: Burn's own validation refuses other shapes, as `Record`).
pub type CheckpointError = crate::shared::checkpoint::CheckpointError<RecordError>;

/// Burn 0.22 validates a record against the model as it loads it: an error
/// there is another model's record (or damaged bytes, which the sections'
/// checks catch first as `Format`).
impl RecordFault for RecordError {
    fn another_model(&self) -> bool {
        true
    }
}

/// `path` with the `.ckpt` extension.
pub fn checkpoint_path(path: impl AsRef<Path>) -> PathBuf {
    files::with_extension(path, EXTENSION)
}

/// A checkpoint read back: the model's record, the optimizer's state (if it
/// was saved) and the epoch.
pub struct Checkpoint {
    path: PathBuf,
    model: ModuleRecord,
    optimizer: Option<Vec<u8>>,
    /// The epoch stored with it (the number of epochs done).
    pub epoch: usize,
}

impl Checkpoint {
    /// `model` with the saved parameters (an error naming the parameter if
    /// the shapes differ).
    pub fn load_model<M: Module>(&self, model: M) -> Result<M, CheckpointError> {
        model
            .try_load_record(self.model.clone())
            .map_err(|source| self.record_error(source))
    }

    /// `optimizer` with the saved state; unchanged if none was saved.
    pub fn load_optimizer(
        &self,
        optimizer: ModuleOptimizer,
    ) -> Result<ModuleOptimizer, CheckpointError> {
        match &self.optimizer {
            Some(bytes) => optimizer
                .from_bytes(Bytes::from_bytes_vec(bytes.clone()))
                .map_err(|source| self.record_error(source)),
            None => Ok(optimizer),
        }
    }

    fn record_error(&self, source: RecordError) -> CheckpointError {
        CheckpointError::Record {
            path: self.path.clone(),
            source,
        }
    }
}

/// Writes `model`, `optimizer`'s state and `epoch` to `path` (`.ckpt` added
/// if missing) atomically; returns the file written. Call it from one rank
/// only (rank 0), then `barrier()`.
pub fn save_atomic<M: Module>(
    path: impl AsRef<Path>,
    model: &M,
    optimizer: Option<&ModuleOptimizer>,
    epoch: usize,
) -> Result<PathBuf, CheckpointError> {
    let target = checkpoint_path(path);
    let record_error = |source| CheckpointError::Record {
        path: target.clone(),
        source,
    };
    let model = model
        .clone()
        .into_record()
        .into_bytes()
        .map_err(record_error)?;
    let mut sections = Sections::new()
        .with("model", model.to_vec())
        .with("epoch", (epoch as u64).to_le_bytes().to_vec());
    if let Some(optimizer) = optimizer {
        let state = optimizer.into_bytes().map_err(record_error)?;
        sections = sections.with("optimizer", state.to_vec());
    }
    files::write_atomic(&target, &sections.encode())?;
    Ok(target)
}

/// Reads a checkpoint written by [`save_atomic`].
pub fn load(path: impl AsRef<Path>) -> Result<Checkpoint, CheckpointError> {
    let path = checkpoint_path(path);
    let format = |problem: String| CheckpointError::Format {
        path: path.clone(),
        problem,
    };
    let sections = Sections::decode(&files::read(&path)?).map_err(format)?;
    let missing = |name: &str| format(format!("no {name} section"));
    let model = sections.get("model").ok_or_else(|| missing("model"))?;
    let model =
        ModuleRecord::from_bytes(Bytes::from_bytes_vec(model.to_vec())).map_err(|source| {
            CheckpointError::Record {
                path: path.clone(),
                source,
            }
        })?;
    let epoch = sections
        .get("epoch")
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .ok_or_else(|| missing("epoch"))?;
    Ok(Checkpoint {
        model,
        optimizer: sections.get("optimizer").map(<[u8]>::to_vec),
        epoch: u64::from_le_bytes(epoch) as usize,
        path,
    })
}

/// The newest whole checkpoint in parts among the folders in `parent`
/// (the one saved last), to resume from by itself: a save that did not
/// finish (a `NAME.partial-ID` folder) is never picked. `None` without one.
pub use burn_ddp_training::sharded::newest_complete as newest_parts;

/// Loads a checkpoint in parts (written by
/// [`ShardedOptimizer::save_parts`](crate::ShardedOptimizer::save_parts) on
/// any number of ranks) into `model` and a plain, unsharded `optimizer`:
/// every parameter's value and state. To resume a sharded run in one
/// process or under plain DDP (a [`ShardedOptimizer`](crate::ShardedOptimizer)
/// reads only its part: its own `load_parts`). Returns the model, the
/// optimizer and the `info` it was saved with. No communication.
pub fn load_parts<M: Module>(
    model: M,
    optimizer: ModuleOptimizer,
    dir: impl AsRef<Path>,
) -> crate::Result<(M, ModuleOptimizer, String)> {
    use crate::shared::sharded_checkpoint::{open_parts, read_kept_state, read_values};
    let rank = crate::shared::session::SESSION.rank().unwrap_or(0);
    let checkpoint = open_parts(dir.as_ref(), rank, crate::shim::walker(&model))?;
    let model = read_values(&checkpoint, rank, |r| crate::shim::rewrite(model, r))?;
    let every = crate::shared::shard::trained_ids(crate::shim::grad_walker(&model));
    let kept: Vec<(u64, bool)> = every.into_iter().map(|id| (id, true)).collect();
    let (ids, entries) = read_kept_state(&checkpoint, &kept)?;
    let record = crate::shard_record::record_from_entries(rank, &ids, entries)?;
    Ok((
        model,
        optimizer.load_record(record),
        checkpoint.info().to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::{Linear, LinearConfig};
    use burn::optim::{GradientsParams, SgdConfig};
    use burn::tensor::{Device, Tensor};
    use std::fs;

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("burn-ddp-22-ckpt-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn model_optimizer_and_epoch_round_trip() {
        let dir = temp_dir("roundtrip");
        let device = Device::flex().autodiff();
        let model: Linear = LinearConfig::new(3, 2).init(&device);
        let mut optimizer = burn::optim::AdamWConfig::new().init();
        let loss = model.forward(Tensor::<2>::ones([4, 3], &device)).sum();
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let model = optimizer.step(0.1, model, grads);
        let path = save_atomic(dir.join("ckpt"), &model, Some(&optimizer), 7).unwrap();
        assert_eq!(path, dir.join("ckpt.ckpt"));
        let back = load(&path).unwrap();
        assert_eq!(back.epoch, 7);
        let loaded = back
            .load_model(LinearConfig::new(3, 2).init(&device))
            .unwrap();
        assert_eq!(
            loaded.weight.val().into_data(),
            model.weight.val().into_data()
        );
        back.load_optimizer(burn::optim::AdamWConfig::new().init())
            .unwrap();
        // A model of other sizes is refused, naming the file.
        let err = back
            .load_model(LinearConfig::new(4, 2).init(&device))
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("ckpt.ckpt") && err.contains("different model"),
            "{err}"
        );
        let _ = SgdConfig::new();
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn corrupt_missing_and_foreign_files_are_named() {
        let dir = temp_dir("corrupt");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("bad.ckpt"), b"not a checkpoint").unwrap();
        let err = load(dir.join("bad")).err().unwrap().to_string();
        assert!(
            err.contains("bad.ckpt") && err.contains("not a burn-ddp checkpoint"),
            "{err}"
        );
        let err = load(dir.join("missing")).err().unwrap().to_string();
        assert!(err.contains("missing.ckpt"), "{err}");
        let model: Linear = LinearConfig::new(3, 2).init(&Device::flex());
        let path = save_atomic(dir.join("whole"), &model, None, 1).unwrap();
        let bytes = fs::read(&path).unwrap();
        fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        let err = load(&path).err().unwrap().to_string();
        assert!(err.contains("truncated"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
