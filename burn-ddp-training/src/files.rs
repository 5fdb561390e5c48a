//! Files written atomically, for checkpoints: a crash mid-save leaves the
//! previous file intact, never a truncated one. The bytes go to a temporary
//! file beside the target, are flushed to disk, then renamed over it. Both
//! front-ends' checkpoints (Burn 0.21's records, Burn 0.22's burnpacks) are
//! written through here; [`Sections`] is the container the 0.22 one uses.

use std::fmt;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Why a file could not be written or read.
#[derive(Debug)]
#[non_exhaustive]
pub enum FileError {
    /// The file system refused the file.
    Io {
        /// The file involved.
        path: PathBuf,
        /// What it said.
        source: io::Error,
    },
    /// The folder for the file cannot be created or written into.
    Folder {
        /// The folder.
        folder: PathBuf,
        /// What the file system said.
        source: io::Error,
    },
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileError::Io { path, source } => {
                write!(f, "checkpoint {}: {source}", path.display())
            }
            FileError::Folder { folder, source } => write!(
                f,
                "cannot write checkpoints into the folder {}: {source}; choose a folder this \
                 user can write to (the trainers' --output or --checkpoint-dir), or fix its \
                 permissions or free space",
                folder.display()
            ),
        }
    }
}

impl std::error::Error for FileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FileError::Io { source, .. } | FileError::Folder { source, .. } => Some(source),
        }
    }
}

/// `path` with `extension` added unless it already ends with it.
pub fn with_extension(path: impl AsRef<Path>, extension: &str) -> PathBuf {
    let path = path.as_ref();
    match path.extension() {
        Some(ext) if ext == extension => path.to_path_buf(),
        _ => {
            let mut name = path.as_os_str().to_owned();
            name.push(".");
            name.push(extension);
            PathBuf::from(name)
        }
    }
}

/// Writes `bytes` to `target` atomically (creating its folder). Call it from
/// one rank only, then `barrier()`.
pub fn write_atomic(target: &Path, bytes: &[u8]) -> Result<(), FileError> {
    let dir = match target.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let folder_err = |source| FileError::Folder {
        folder: dir.clone(),
        source,
    };
    fs::create_dir_all(&dir).map_err(folder_err)?;
    let file_name = target.file_name().unwrap_or_default().to_string_lossy();
    remove_abandoned_partials(&dir, &file_name);
    let temporary = dir.join(format!(".{file_name}.{}.partial", std::process::id()));
    let mut file = File::create(&temporary).map_err(folder_err)?;
    let written = file.write_all(bytes).and_then(|()| file.sync_all());
    drop(file);
    if let Err(source) = written {
        let _ = fs::remove_file(&temporary);
        // Mostly a full disk: the folder's problem, not the file's.
        return Err(folder_err(source));
    }
    fs::rename(&temporary, target).map_err(|source| {
        let _ = fs::remove_file(&temporary);
        FileError::Io {
            path: target.to_path_buf(),
            source,
        }
    })?;
    // Make the rename itself durable.
    if let Ok(dir) = File::open(&dir) {
        let _ = dir.sync_all();
    }
    Ok(())
}

/// Reads a whole file, the error naming it.
pub fn read(path: &Path) -> Result<Vec<u8>, FileError> {
    fs::read(path).map_err(|source| FileError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Deletes what earlier saves of `file_name` left when they were killed
/// between writing and renaming: `.{file_name}.{pid}.partial` files whose
/// process no longer exists (Linux's `/proc` tells; elsewhere none is touched).
fn remove_abandoned_partials(dir: &Path, file_name: &str) {
    let proc = Path::new("/proc");
    if !proc.join("self").exists() {
        return;
    }
    let prefix = format!(".{file_name}.");
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let pid = name
            .strip_prefix(&prefix)
            .and_then(|rest| rest.strip_suffix(".partial"))
            .and_then(|pid| pid.parse::<u32>().ok());
        if let Some(pid) = pid {
            if pid != std::process::id() && !proc.join(pid.to_string()).exists() {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

/// Named byte sections in one file (a model, an optimizer, a training
/// state), so a checkpoint of several parts is still one atomic rename.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Sections {
    parts: Vec<(String, Vec<u8>)>,
}

const MAGIC: &[u8; 8] = b"BURNDDP1";

impl Sections {
    /// No sections.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) section `name`.
    pub fn with(mut self, name: &str, bytes: Vec<u8>) -> Self {
        self.parts.retain(|(n, _)| n != name);
        self.parts.push((name.to_owned(), bytes));
        self
    }

    /// Section `name`'s bytes.
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.parts
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b.as_slice())
    }

    /// The names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.parts.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// The file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend((self.parts.len() as u64).to_le_bytes());
        for (name, bytes) in &self.parts {
            out.extend((name.len() as u64).to_le_bytes());
            out.extend(name.as_bytes());
            out.extend((bytes.len() as u64).to_le_bytes());
            out.extend(bytes);
        }
        out
    }

    /// Reads what [`encode`](Self::encode) wrote; `Err` says what is wrong
    /// (not such a file, truncated).
    pub fn decode(mut bytes: &[u8]) -> Result<Self, String> {
        fn take<'a>(bytes: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
            if bytes.len() < n {
                return Err("truncated".into());
            }
            let (head, rest) = bytes.split_at(n);
            *bytes = rest;
            Ok(head)
        }
        fn length(bytes: &mut &[u8]) -> Result<usize, String> {
            let raw = take(bytes, 8)?;
            usize::try_from(u64::from_le_bytes(raw.try_into().unwrap()))
                .map_err(|_| "a length past this machine's memory".to_string())
        }
        if take(&mut bytes, MAGIC.len()).ok() != Some(MAGIC.as_slice()) {
            return Err("not a burn-ddp checkpoint".into());
        }
        let count = length(&mut bytes)?;
        let mut parts = Vec::new();
        for _ in 0..count {
            let n = length(&mut bytes)?;
            let name = String::from_utf8(take(&mut bytes, n)?.to_vec())
                .map_err(|_| "a section name that is not UTF-8".to_string())?;
            let n = length(&mut bytes)?;
            parts.push((name, take(&mut bytes, n)?.to_vec()));
        }
        if !bytes.is_empty() {
            return Err(format!("{} bytes after the last section", bytes.len()));
        }
        Ok(Self { parts })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("burn-ddp-files-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn sections_round_trip_and_damage_is_named() {
        let file = Sections::new()
            .with("model", vec![1, 2, 3])
            .with("state", b"{}".to_vec())
            .with("model", vec![4]);
        let bytes = file.encode();
        let back = Sections::decode(&bytes).unwrap();
        assert_eq!(back, file);
        assert_eq!(back.names(), ["state", "model"]);
        assert_eq!(back.get("model"), Some(&[4u8][..]));
        assert!(Sections::decode(&bytes[..bytes.len() - 1])
            .unwrap_err()
            .contains("truncated"));
        assert!(Sections::decode(b"PK\x03\x04")
            .unwrap_err()
            .contains("not a burn-ddp"));
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Sections::decode(&longer)
            .unwrap_err()
            .contains("after the last"));
    }

    #[test]
    fn an_atomic_write_replaces_whole_and_a_failed_one_keeps_the_old() {
        let dir = temp_dir("atomic");
        let target = dir.join("ckpt.bin");
        write_atomic(&target, b"first").unwrap();
        write_atomic(&target, b"second").unwrap();
        assert_eq!(read(&target).unwrap(), b"second");
        fs::create_dir_all(dir.join(format!(".ckpt.bin.{}.partial", std::process::id()))).unwrap();
        let err = write_atomic(&target, b"third").unwrap_err().to_string();
        assert!(err.contains("choose a folder"), "{err}");
        assert_eq!(read(&target).unwrap(), b"second");
        assert!(read(&dir.join("missing"))
            .unwrap_err()
            .to_string()
            .contains("missing"));
        assert_eq!(with_extension(dir.join("a"), "bin"), dir.join("a.bin"));
        assert_eq!(with_extension(dir.join("a.bin"), "bin"), dir.join("a.bin"));
        fs::remove_dir_all(&dir).unwrap();
    }
}
