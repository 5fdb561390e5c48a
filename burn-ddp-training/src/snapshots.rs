//! Numbered snapshots in a folder (`model_epoch_3.mpk`, `model_epoch_4.mpk`,
//! ...), and the newest one that loads: what a trainer restarted after a
//! crash resumes from by itself. A corrupt snapshot (a damaged file) is
//! skipped with a warning naming it, so the previous one is used; a snapshot
//! that loads but belongs to another model or configuration is an error,
//! never a silent fresh start. Both front-ends' trainers go through here;
//! the loading itself (Burn's records) is theirs.

use std::path::{Path, PathBuf};

/// One snapshot and its number (the epoch or step it was taken after).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Its file (the first of [`files`](Self::files)).
    pub path: PathBuf,
    /// Every file it is made of (one, or Burn's Learner's model, optimizer
    /// and scheduler files of one epoch).
    pub files: Vec<PathBuf>,
    /// The number in its name.
    pub number: usize,
}

/// The loader's own error (Burn's recorder, the file system), kept as a source.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// Why a snapshot could not be resumed from, with the loader's error.
#[derive(Debug)]
#[non_exhaustive]
pub enum LoadError {
    /// The file is damaged or unreadable: an older snapshot may do.
    Corrupt(Cause),
    /// The file is whole but not this run's (another model or
    /// configuration): resuming from any snapshot here would be wrong.
    Refused(Cause),
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Corrupt(why) | LoadError::Refused(why) => write!(f, "{why}"),
        }
    }
}

impl std::error::Error for LoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoadError::Corrupt(why) | LoadError::Refused(why) => Some(why.as_ref()),
        }
    }
}

/// Why no snapshot of a folder can be resumed from.
#[derive(Debug)]
#[non_exhaustive]
pub enum ResumeError {
    /// `snapshot` is whole but another run's: resume with the model and
    /// settings it was made with, or give another folder.
    NotThisRun {
        /// The snapshot refused.
        snapshot: PathBuf,
        /// Why (the loader's error).
        source: Cause,
    },
    /// Every snapshot is damaged (remove them to start afresh).
    NoneReadable {
        /// Each snapshot, newest first, and why it cannot be read.
        snapshots: Vec<(PathBuf, Cause)>,
    },
}

impl std::fmt::Display for ResumeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResumeError::NotThisRun { snapshot, source } => write!(
                f,
                "snapshot {} is not this run's: {source}; resume with the model and settings \
                 it was made with, or give another checkpoint folder",
                snapshot.display()
            ),
            ResumeError::NoneReadable { snapshots } => {
                let each: Vec<String> = snapshots
                    .iter()
                    .map(|(path, why)| unreadable(path, why))
                    .collect();
                write!(
                    f,
                    "no snapshot can be resumed from: {}; remove them to start afresh",
                    each.join("; ")
                )
            }
        }
    }
}

impl std::error::Error for ResumeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ResumeError::NotThisRun { source, .. } => Some(source.as_ref()),
            ResumeError::NoneReadable { snapshots } => snapshots
                .first()
                .map(|(_, why)| why.as_ref() as &(dyn std::error::Error + 'static)),
        }
    }
}

/// The warning for a snapshot that cannot be read.
fn unreadable(path: &Path, why: &Cause) -> String {
    format!(
        "snapshot {} cannot be read ({why}); trying the one before",
        path.display()
    )
}

/// What [`newest_loadable`] found.
#[derive(Debug)]
pub struct Resumed<T> {
    /// What the loader made of the snapshot.
    pub value: T,
    /// The snapshot it came from.
    pub snapshot: Snapshot,
    /// A warning per newer snapshot that was corrupt and skipped.
    pub skipped: Vec<String>,
}

/// The snapshots `<stem><N><extension>` in `dir` (`stem` = `model_epoch_`,
/// `extension` = `.mpk`), newest (highest `N`) first; none when `dir` does
/// not exist. Files being written (`*.partial`, temporary names) do not match.
pub fn list(dir: &Path, stem: &str, extension: &str) -> std::io::Result<Vec<Snapshot>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(err),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let Some(number) = name
            .to_str()
            .and_then(|name| name.strip_prefix(stem)?.strip_suffix(extension))
            .filter(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|digits| digits.parse().ok())
        else {
            continue;
        };
        found.push(Snapshot {
            path: entry.path(),
            files: vec![entry.path()],
            number,
        });
    }
    found.sort_by_key(|snapshot| std::cmp::Reverse(snapshot.number));
    Ok(found)
}

/// The epochs `N` for which `dir` holds a file `<name>-<N>.<extension>` for
/// every one of `names` (Burn's file checkpointer: `model-3.mpk`,
/// `optim-3.mpk`, `scheduler-3.mpk`), newest first, each with its files in
/// the order of `names`. An epoch missing one of them is not complete.
pub fn complete_epochs(dir: &Path, names: &[&str]) -> std::io::Result<Vec<Snapshot>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(err),
    };
    let mut by_epoch: std::collections::BTreeMap<usize, Vec<Option<PathBuf>>> =
        std::collections::BTreeMap::new();
    for entry in entries {
        let entry = entry?;
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            continue;
        };
        for (i, name) in names.iter().enumerate() {
            let epoch = file_name
                .strip_prefix(name)
                .and_then(|rest| rest.strip_prefix('-'))
                .and_then(|rest| rest.split_once('.'))
                .filter(|(digits, _)| {
                    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
                })
                .and_then(|(digits, _)| digits.parse::<usize>().ok());
            if let Some(epoch) = epoch {
                by_epoch
                    .entry(epoch)
                    .or_insert_with(|| vec![None; names.len()])[i] = Some(entry.path());
            }
        }
    }
    Ok(by_epoch
        .into_iter()
        .rev()
        .filter_map(|(number, files)| {
            let files: Vec<PathBuf> = files.into_iter().collect::<Option<_>>()?;
            Some(Snapshot {
                path: files[0].clone(),
                files,
                number,
            })
        })
        .collect())
}

/// Loads the newest of `snapshots` (newest first, as [`list`] gives them)
/// that `load` accepts. A corrupt one is skipped with a warning; a refused one
/// ends the search with its error; when every one is corrupt that is an error
/// too (naming them), not a fresh start. `Ok(None)`: there are none.
pub fn newest_loadable<T>(
    snapshots: &[Snapshot],
    mut load: impl FnMut(&Snapshot) -> Result<T, LoadError>,
) -> Result<Option<Resumed<T>>, ResumeError> {
    let mut corrupt: Vec<(PathBuf, Cause)> = Vec::new();
    for snapshot in snapshots {
        match load(snapshot) {
            Ok(value) => {
                let skipped = corrupt
                    .iter()
                    .map(|(path, why)| unreadable(path, why))
                    .collect();
                return Ok(Some(Resumed {
                    value,
                    snapshot: snapshot.clone(),
                    skipped,
                }));
            }
            Err(LoadError::Corrupt(why)) => corrupt.push((snapshot.path.clone(), why)),
            Err(LoadError::Refused(source)) => {
                return Err(ResumeError::NotThisRun {
                    snapshot: snapshot.path.clone(),
                    source,
                })
            }
        }
    }
    if corrupt.is_empty() {
        Ok(None)
    } else {
        Err(ResumeError::NoneReadable { snapshots: corrupt })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn folder(name: &str, files: &[&str]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("snapshots-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for file in files {
            std::fs::write(dir.join(file), file.as_bytes()).unwrap();
        }
        dir
    }

    #[test]
    fn snapshots_are_listed_newest_first_and_others_ignored() {
        let dir = folder(
            "list",
            &[
                "model_epoch_2.mpk",
                "model_epoch_10.mpk",
                "model_epoch_9.mpk",
                "model_epoch_.mpk",
                "model_epoch_3.mpk.partial",
                "model_epoch_x.mpk",
                "config.json",
            ],
        );
        let numbers: Vec<usize> = list(&dir, "model_epoch_", ".mpk")
            .unwrap()
            .iter()
            .map(|s| s.number)
            .collect();
        assert_eq!(numbers, [10, 9, 2]);
        assert!(list(&dir.join("absent"), "model_epoch_", ".mpk")
            .unwrap()
            .is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_epoch_is_complete_when_every_file_of_it_is_there() {
        let dir = folder(
            "epochs",
            &[
                "model-1.mpk",
                "optim-1.mpk",
                "scheduler-1.mpk",
                "model-2.mpk",
                "optim-2.mpk",
                "scheduler-2.mpk",
                // Epoch 3's optimizer was never written: not complete.
                "model-3.mpk",
                "scheduler-3.mpk",
                "model-x.mpk",
            ],
        );
        let epochs = complete_epochs(&dir, &["model", "optim", "scheduler"]).unwrap();
        let numbers: Vec<usize> = epochs.iter().map(|s| s.number).collect();
        assert_eq!(numbers, [2, 1]);
        let names: Vec<String> = epochs[0]
            .files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["model-2.mpk", "optim-2.mpk", "scheduler-2.mpk"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_corrupt_newest_falls_back_with_a_warning_naming_it() {
        let dir = folder("corrupt", &["s_3.bin", "s_2.bin", "s_1.bin"]);
        let snapshots = list(&dir, "s_", ".bin").unwrap();
        let resumed = newest_loadable(&snapshots, |s| match s.number {
            3 => Err(LoadError::Corrupt("truncated".into())),
            n => Ok(n),
        })
        .unwrap()
        .unwrap();
        assert_eq!((resumed.value, resumed.snapshot.number), (2, 2));
        assert_eq!(resumed.skipped.len(), 1);
        assert!(
            resumed.skipped[0].contains("s_3.bin") && resumed.skipped[0].contains("truncated"),
            "{:?}",
            resumed.skipped
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn another_runs_snapshot_is_an_error_not_a_fresh_start() {
        let dir = folder("refused", &["s_2.bin", "s_1.bin"]);
        let snapshots = list(&dir, "s_", ".bin").unwrap();
        let err = newest_loadable(&snapshots, |_| -> Result<(), _> {
            Err(LoadError::Refused(
                "linear.weight is [10, 1], not [784, 10]".into(),
            ))
        })
        .unwrap_err();
        assert!(
            matches!(&err, ResumeError::NotThisRun { snapshot, .. } if snapshot.ends_with("s_2.bin")),
            "{err:?}"
        );
        let err = err.to_string();
        assert!(
            err.contains("s_2.bin") && err.contains("[784, 10]") && err.contains("not this run's"),
            "{err}"
        );
        // Every one corrupt: an error naming them.
        let err = newest_loadable(&snapshots, |_| -> Result<(), _> {
            Err(LoadError::Corrupt("bad".into()))
        })
        .unwrap_err();
        assert!(
            matches!(&err, ResumeError::NoneReadable { snapshots } if snapshots.len() == 2),
            "{err:?}"
        );
        let err = err.to_string();
        assert!(err.contains("s_2.bin") && err.contains("s_1.bin"), "{err}");
        // None at all: a fresh start.
        assert!(newest_loadable(&[], |_| Ok(())).unwrap().is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
