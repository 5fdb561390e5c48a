//! Where a job's shared-memory segments live and how they are named, so the
//! transport that makes them and the launcher that cleans up after killed
//! workers agree without knowing each other.
//!
//! A segment is `burn-ddp-<pid of its creator>-<random>` in [`dir`]: the pid
//! tells a launcher which files its dead workers left behind.

use std::path::{Path, PathBuf};

/// First characters of every segment file's name.
const PREFIX: &str = "burn-ddp-";

/// Where segments are made: `/dev/shm` (memory), else the temporary directory.
pub fn dir() -> PathBuf {
    if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    }
}

/// The path of a new segment made by process `creator`; `random` keeps two
/// segments of one process apart.
pub fn path_for(creator: u32, random: &[u8]) -> PathBuf {
    let suffix: String = random.iter().map(|b| format!("{b:02x}")).collect();
    dir().join(format!("{PREFIX}{creator}-{suffix}"))
}

/// Whether `path` names a segment: a file in [`dir`] with a segment's name.
pub fn is_segment_path(path: &Path) -> bool {
    path.parent() == Some(dir().as_path())
        && path
            .file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with(PREFIX))
}

/// The pid that made the segment called `file_name`, if it is one.
fn creator(file_name: &str) -> Option<u32> {
    file_name
        .strip_prefix(PREFIX)?
        .split('-')
        .next()?
        .parse()
        .ok()
}

/// Removes the segment files that processes `pids` created and left behind
/// (killed before they could unlink them); a launcher calls it for its workers.
/// Returns how many it removed.
pub fn remove_left_by(pids: &[u32]) -> usize {
    let Ok(entries) = std::fs::read_dir(dir()) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|entry| {
            creator(&entry.file_name().to_string_lossy()).is_some_and(|pid| pids.contains(&pid))
        })
        .filter(|entry| std::fs::remove_file(entry.path()).is_ok())
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_their_creator_and_only_segments_are_removed() {
        // A creator pid no process has, so nothing else is touched.
        let ghost = 3_999_999_998u32;
        let path = path_for(ghost, &[0xab, 0x01]);
        assert_eq!(
            path.file_name().unwrap().to_string_lossy(),
            format!("burn-ddp-{ghost}-ab01")
        );
        assert!(is_segment_path(&path));
        assert!(!is_segment_path(Path::new("/etc/passwd")));
        assert!(!is_segment_path(&dir().join("other-file")));
        assert!(!is_segment_path(
            &std::env::temp_dir().join("x").join("burn-ddp-1-aa")
        ));
        assert_eq!(creator("burn-ddp-42-ff"), Some(42));
        assert_eq!(creator("burn-ddp-x-ff"), None);
        assert_eq!(creator("other-42-ff"), None);

        std::fs::write(&path, b"left behind").unwrap();
        let bystander = dir().join(format!("not-burn-ddp-{ghost}-00"));
        std::fs::write(&bystander, b"keep").unwrap();
        assert_eq!(remove_left_by(&[ghost + 1]), 0);
        assert!(path.exists());
        assert_eq!(remove_left_by(&[ghost]), 1);
        assert!(!path.exists() && bystander.exists());
        std::fs::remove_file(bystander).unwrap();
    }
}
