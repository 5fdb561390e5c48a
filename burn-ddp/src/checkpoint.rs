//! Checkpoints written atomically: a crash mid-save leaves the previous file
//! intact, never a truncated one.
//!
//! The file is Burn's named MessagePack format (`NamedMpkFileRecorder` with full
//! precision reads it too), written by `burn_ddp_training::files::write_atomic`
//! (a temporary file beside the target, flushed, renamed over it).

use crate::shared::checkpoint::RecordFault;
use burn::module::{Module, ModuleVisitor, Param};
use burn::record::{FullPrecisionSettings, NamedMpkBytesRecorder, Record, Recorder, RecorderError};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Int, Tensor};
use burn_ddp_training::files;
use std::path::{Path, PathBuf};

/// Why a checkpoint could not be written or read (never `Format` on Burn
/// 0.21: its checkpoints are bare records, which Burn's recorder decodes).
pub type CheckpointError = crate::shared::checkpoint::CheckpointError<RecorderError>;

/// Burn 0.21's recorder fails on bytes it cannot decode; another model's
/// shapes are found by [`load_record_checked`] instead (`Shape`).
impl RecordFault for RecorderError {
    fn another_model(&self) -> bool {
        false
    }
}

/// `path` with the `.mpk` extension Burn's recorders use.
pub fn checkpoint_path(path: impl AsRef<Path>) -> PathBuf {
    files::with_extension(path, "mpk")
}

/// Writes `record` to `path` (`.mpk` added if missing) atomically; returns the
/// file written. Call it from one rank only (rank 0), then `barrier()`.
pub fn save_atomic<B: Backend, R: Record<B>>(
    record: R,
    path: impl AsRef<Path>,
) -> Result<PathBuf, CheckpointError> {
    let target = checkpoint_path(path);
    let bytes = NamedMpkBytesRecorder::<FullPrecisionSettings>::new()
        .record(record, ())
        .map_err(|source| CheckpointError::Record {
            path: target.clone(),
            source,
        })?;
    files::write_atomic(&target, &bytes)?;
    Ok(target)
}

/// Reads a record written by [`save_atomic`] (or Burn's `NamedMpkFileRecorder`).
pub fn load<B: Backend, R: Record<B>>(
    path: impl AsRef<Path>,
    device: &B::Device,
) -> Result<R, CheckpointError> {
    let path = checkpoint_path(path);
    let bytes = files::read(&path)?;
    NamedMpkBytesRecorder::<FullPrecisionSettings>::new()
        .load(bytes, device)
        .map_err(|source| CheckpointError::Record { path, source })
}

/// Loads `record` (read from `path`) into `model`, refusing a record whose
/// parameters have other shapes than the model's.
pub fn load_record_checked<B: Backend, M: Module<B>>(
    model: M,
    record: M::Record,
    path: impl AsRef<Path>,
) -> Result<M, CheckpointError> {
    let expected = parameter_shapes(&model);
    let loaded = model.load_record(record);
    let found = parameter_shapes(&loaded);
    for ((parameter, expected), (_, found)) in expected.into_iter().zip(found) {
        if expected != found {
            return Err(CheckpointError::Shape {
                path: checkpoint_path(path),
                parameter,
                expected,
                found,
            });
        }
    }
    Ok(loaded)
}

/// Reads the checkpoint at `path` into `model` ([`load`], then
/// [`load_record_checked`]).
pub fn load_into<B: Backend, M: Module<B>>(
    model: M,
    path: impl AsRef<Path>,
    device: &B::Device,
) -> Result<M, CheckpointError> {
    let record = load::<B, M::Record>(&path, device)?;
    load_record_checked(model, record, path)
}

/// Every parameter's path and shape, in the module's order.
fn parameter_shapes<B: Backend, M: Module<B>>(module: &M) -> Vec<(String, Vec<usize>)> {
    struct Shapes {
        path: Vec<String>,
        found: Vec<(String, Vec<usize>)>,
    }
    impl Shapes {
        fn push(&mut self, dims: Vec<usize>) {
            self.found.push((self.path.join("."), dims));
        }
    }
    impl<B: Backend> ModuleVisitor<B> for Shapes {
        fn enter_module(&mut self, name: &str, _container: &str) {
            self.path.push(name.to_owned());
        }
        fn exit_module(&mut self, _name: &str, _container: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.push(param.lazy_shape().dims::<D>().to_vec());
        }
        fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
            self.push(param.lazy_shape().dims::<D>().to_vec());
        }
        fn visit_bool<const D: usize>(&mut self, param: &Param<Tensor<B, D, Bool>>) {
            self.push(param.lazy_shape().dims::<D>().to_vec());
        }
    }
    let mut shapes = Shapes {
        path: Vec::new(),
        found: Vec::new(),
    };
    module.visit(&mut shapes);
    shapes.found
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
pub fn load_parts<B, M, O>(
    model: M,
    optimizer: O,
    dir: impl AsRef<Path>,
) -> crate::Result<(M, O, String)>
where
    B: burn::tensor::backend::AutodiffBackend,
    M: burn::module::AutodiffModule<B>,
    O: burn::optim::Optimizer<M, B>,
{
    use crate::shared::sharded_checkpoint::{open_parts, read_kept_state, read_values};
    let rank = crate::shared::session::SESSION.rank().unwrap_or(0);
    let checkpoint = open_parts(dir.as_ref(), rank, crate::shim::walker(&model))?;
    let model = read_values(&checkpoint, rank, |r| crate::shim::rewrite(model, r))?;
    let every = crate::shared::shard::trained_ids(crate::shim::grad_walker(&model));
    let kept: Vec<(u64, bool)> = every.into_iter().map(|id| (id, true)).collect();
    let (ids, entries) = read_kept_state(&checkpoint, &kept)?;
    let device = model.devices().into_iter().next().unwrap_or_default();
    let record =
        crate::shard_record::record_from_entries::<B, O::Record>(rank, &ids, entries, &device)?;
    Ok((
        model,
        optimizer.load_record(record),
        checkpoint.info().to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;
    use burn::module::Module;
    use burn::nn::{Linear, LinearConfig};
    use burn::record::NamedMpkFileRecorder;
    use std::fs;

    type B = NdArray;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("burn-ddp-ckpt-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn round_trip_with_epoch_and_burns_own_recorder_reads_it() {
        let dir = temp_dir("roundtrip");
        let device = Default::default();
        let model: Linear<B> = LinearConfig::new(3, 2).init(&device);
        let weights = model.weight.val().into_data();
        let path =
            save_atomic::<B, _>((model.clone().into_record(), 7usize), dir.join("ckpt")).unwrap();
        assert_eq!(path, dir.join("ckpt.mpk"));
        let (record, epoch): (<Linear<B> as Module<B>>::Record, usize) =
            load::<B, _>(&path, &device).unwrap();
        assert_eq!(epoch, 7);
        let loaded = LinearConfig::new(3, 2)
            .init::<B>(&device)
            .load_record(record);
        assert_eq!(loaded.weight.val().into_data(), weights);
        // Burn's own file recorder reads the file too.
        let recorder = NamedMpkFileRecorder::<FullPrecisionSettings>::new();
        let via_burn = LinearConfig::new(3, 2).init::<B>(&device).load_file(
            dir.join("ckpt.mpk"),
            &recorder,
            &device,
        );
        assert!(
            via_burn.is_err(),
            "a (record, epoch) tuple is not a bare Linear record"
        );
        let bare = save_atomic::<B, _>(loaded.clone().into_record(), dir.join("bare")).unwrap();
        let via_burn = LinearConfig::new(3, 2)
            .init::<B>(&device)
            .load_file(bare, &recorder, &device)
            .unwrap();
        assert_eq!(via_burn.weight.val().into_data(), weights);
        // Nothing temporary is left behind.
        let leftovers: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".partial"))
            .collect();
        assert!(leftovers.is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_save_keeps_the_previous_checkpoint() {
        let dir = temp_dir("keep");
        let device = Default::default();
        let model: Linear<B> = LinearConfig::new(3, 2).init(&device);
        let path = save_atomic::<B, _>(model.into_record(), dir.join("ckpt")).unwrap();
        let before = fs::read(&path).unwrap();
        // A directory where the temporary file would go makes the write fail.
        fs::create_dir_all(dir.join(format!(".ckpt.mpk.{}.partial", std::process::id()))).unwrap();
        let other: Linear<B> = LinearConfig::new(3, 2).init(&device);
        let err = save_atomic::<B, _>(other.into_record(), dir.join("ckpt")).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(dir.to_str().unwrap()) && text.contains("choose a folder"),
            "{text}"
        );
        assert_eq!(fs::read(&path).unwrap(), before);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_killed_save_leaves_nothing_after_the_next_one() {
        let dir = temp_dir("killed");
        fs::create_dir_all(&dir).unwrap();
        // What a save killed before its rename leaves: a dead process's partial
        // file (no pid reaches 2^31 - 1 on Linux), next to a live process's.
        let abandoned = dir.join(".ckpt.mpk.2147483646.partial");
        let in_progress = dir.join(".ckpt.mpk.1.partial");
        fs::write(&abandoned, b"half").unwrap();
        fs::write(&in_progress, b"someone else's").unwrap();
        let device = Default::default();
        let model: Linear<B> = LinearConfig::new(3, 2).init(&device);
        save_atomic::<B, _>(model.into_record(), dir.join("ckpt")).unwrap();
        assert!(!abandoned.exists(), "the abandoned partial file is removed");
        assert!(in_progress.exists(), "pid 1 is alive: its file stays");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn loading_a_corrupt_or_missing_file_is_a_clear_error() {
        let dir = temp_dir("corrupt");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("bad.mpk"), b"not a record").unwrap();
        let device = Default::default();
        let err = load::<B, <Linear<B> as Module<B>>::Record>(dir.join("bad"), &device)
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("bad.mpk") && err.to_string().contains("not a record"),
            "{err}"
        );
        let err = load::<B, <Linear<B> as Module<B>>::Record>(dir.join("missing"), &device)
            .err()
            .unwrap();
        assert!(err.to_string().contains("missing.mpk"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_checkpoint_of_other_sizes_is_refused_naming_the_parameter() {
        let dir = temp_dir("shapes");
        let device = Default::default();
        let small: Linear<B> = LinearConfig::new(3, 2).init(&device);
        let weights = small.weight.val().into_data();
        let path = save_atomic::<B, _>(small.into_record(), dir.join("small")).unwrap();
        // Burn itself loads it into a model of other sizes without a word.
        let record = load::<B, <Linear<B> as Module<B>>::Record>(&path, &device).unwrap();
        let silently = LinearConfig::new(4, 2)
            .init::<B>(&device)
            .load_record(record);
        assert_eq!(silently.weight.val().dims(), [3, 2]);
        // Checked, it is an error naming the parameter and both shapes.
        let big: Linear<B> = LinearConfig::new(4, 2).init(&device);
        let err = load_into::<B, _>(big, &path, &device)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("weight")
                && err.contains("[3, 2]")
                && err.contains("[4, 2]")
                && err.contains("small.mpk"),
            "{err}"
        );
        // The same sizes load.
        let same =
            load_into::<B, _>(LinearConfig::new(3, 2).init::<B>(&device), &path, &device).unwrap();
        assert_eq!(same.weight.val().into_data(), weights);
        let _ = fs::remove_dir_all(&dir);
    }
}
