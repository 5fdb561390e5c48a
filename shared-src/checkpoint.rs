//! Why a checkpoint could not be written or read, for both Burns: the
//! variants and their messages are the same, only the recorder's own error
//! type (`R`) is each Burn's.

use burn_ddp_training::files::FileError;
use burn_ddp_training::snapshots::LoadError;
use std::fmt;
use std::path::PathBuf;

/// What a Burn recorder's error means for a resume.
pub(crate) trait RecordFault: std::error::Error + Send + Sync + 'static {
    /// Whether the record was read whole and refused as another model's (so
    /// no older snapshot of the same folder would do better); otherwise the
    /// bytes themselves are damaged.
    fn another_model(&self) -> bool;
}

/// Why a checkpoint could not be written or read.
#[derive(Debug)]
#[non_exhaustive]
pub enum CheckpointError<R> {
    /// The file or its folder (see [`FileError`]).
    File(FileError),
    /// The file is not a whole checkpoint (another file, a truncated one).
    Format {
        /// The file involved.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The record could not be encoded or decoded, or does not fit the model
    /// (a different model or configuration, a corrupt file).
    Record {
        /// The file involved.
        path: PathBuf,
        /// What Burn's recorder said.
        source: R,
    },
    /// The record fits the model's structure but a parameter has another
    /// shape (a model built with other sizes), which Burn 0.21 would load
    /// silently.
    Shape {
        /// The file involved.
        path: PathBuf,
        /// The parameter's path in the module (`fc1.weight`).
        parameter: String,
        /// Its shape in the model.
        expected: Vec<usize>,
        /// Its shape in the checkpoint.
        found: Vec<usize>,
    },
}

impl<R: fmt::Display> fmt::Display for CheckpointError<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckpointError::File(err) => err.fmt(f),
            CheckpointError::Format { path, problem } => write!(
                f,
                "checkpoint {}: {problem}; give a file saved by {}::checkpoint::save_atomic",
                path.display(),
                env!("CARGO_CRATE_NAME")
            ),
            CheckpointError::Record { path, source } => write!(
                f,
                "checkpoint {}: not a record of this model ({source}); was it written by a \
                 different model or configuration?",
                path.display()
            ),
            CheckpointError::Shape {
                path,
                parameter,
                expected,
                found,
            } => write!(
                f,
                "checkpoint {}: parameter {parameter} has shape {found:?}, the model's is \
                 {expected:?}; it was written by a model of other sizes: build the model with \
                 the configuration saved beside the checkpoint, or start without resuming",
                path.display()
            ),
        }
    }
}

#[allow(private_bounds)] // `RecordFault` is each crate's recorder error, nothing a user names
impl<R: RecordFault> CheckpointError<R> {
    /// What the error means for resuming from a snapshot: a record refused
    /// as another model's (other parameters or shapes) is another run's,
    /// which no snapshot of the folder fixes; a file that cannot be read, is
    /// not whole or does not decode is corrupt (an older snapshot may do).
    pub fn for_snapshot(self) -> LoadError {
        let refused = match &self {
            CheckpointError::Shape { .. } => true,
            CheckpointError::Record { source, .. } => source.another_model(),
            CheckpointError::File(_) | CheckpointError::Format { .. } => false,
        };
        if refused {
            LoadError::Refused(Box::new(self))
        } else {
            LoadError::Corrupt(Box::new(self))
        }
    }
}

impl<R: std::error::Error + 'static> std::error::Error for CheckpointError<R> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CheckpointError::File(err) => Some(err),
            CheckpointError::Record { source, .. } => Some(source),
            CheckpointError::Format { .. } | CheckpointError::Shape { .. } => None,
        }
    }
}

impl<R> From<FileError> for CheckpointError<R> {
    fn from(err: FileError) -> Self {
        CheckpointError::File(err)
    }
}
