//! Reading MNIST's IDX files (gzip-compressed or not), with errors that name the file.

use flate2::read::GzDecoder;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

const IMAGES_MAGIC: u32 = 0x0000_0803;
const LABELS_MAGIC: u32 = 0x0000_0801;

/// Images of `rows` x `cols` bytes and their labels.
pub struct Split {
    pub images: Vec<u8>,
    pub labels: Vec<u8>,
    pub rows: usize,
    pub cols: usize,
}

impl Split {
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// The images and labels at `indices`, in that order (each must be
    /// below [`len`](Self::len)).
    pub fn select(&self, indices: &[usize]) -> Self {
        let pixels = self.pixels();
        Self {
            images: (indices.iter())
                .flat_map(|&i| self.images[i * pixels..(i + 1) * pixels].iter().copied())
                .collect(),
            labels: indices.iter().map(|&i| self.labels[i]).collect(),
            rows: self.rows,
            cols: self.cols,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    pub fn pixels(&self) -> usize {
        self.rows * self.cols
    }

    /// Keeps the first `n` samples.
    pub fn truncate(&mut self, n: usize) {
        let n = n.min(self.len());
        self.labels.truncate(n);
        self.images.truncate(n * self.pixels());
    }
}

/// A problem with one file.
#[derive(Debug)]
pub struct IdxError {
    pub path: PathBuf,
    pub problem: String,
}

impl fmt::Display for IdxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MNIST file {}: {}", self.path.display(), self.problem)
    }
}

impl std::error::Error for IdxError {}

/// Loads the `train` or `t10k` split from `dir`.
pub fn load_split(dir: &Path, prefix: &str) -> Result<Split, IdxError> {
    let images_path = find(dir, &format!("{prefix}-images-idx3-ubyte"))?;
    let labels_path = find(dir, &format!("{prefix}-labels-idx1-ubyte"))?;
    let (dims, images) = read_idx(&images_path, IMAGES_MAGIC, 3)?;
    // Both splits: the CNN's shapes are fixed to 28x28.
    if (dims[1], dims[2]) != (28, 28) {
        return Err(IdxError {
            path: images_path,
            problem: format!(
                "holds {}x{} images, but MNIST's (and this CNN's) are 28x28",
                dims[1], dims[2]
            ),
        });
    }
    let (label_dims, labels) = read_idx(&labels_path, LABELS_MAGIC, 1)?;
    if dims[0] != label_dims[0] {
        return Err(IdxError {
            path: labels_path,
            problem: format!(
                "holds {} labels but {} holds {} images",
                label_dims[0],
                images_path.display(),
                dims[0]
            ),
        });
    }
    if let Some(bad) = labels.iter().find(|l| **l > 9) {
        return Err(IdxError {
            path: labels_path,
            problem: format!("label {bad} is not a digit (0-9); the file is corrupt"),
        });
    }
    Ok(Split {
        images,
        labels,
        rows: dims[1],
        cols: dims[2],
    })
}

/// `name.gz` or `name` in `dir`.
fn find(dir: &Path, name: &str) -> Result<PathBuf, IdxError> {
    for candidate in [dir.join(format!("{name}.gz")), dir.join(name)] {
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(IdxError {
        path: dir.join(name),
        problem: format!(
            "not found (looked for {name}.gz and {name} in {}); pass --data-dir with the four \
             MNIST IDX files, e.g. --data-dir ../shared/data/mnist",
            dir.display()
        ),
    })
}

/// Reads an IDX file of unsigned bytes with the given magic and number of dimensions.
fn read_idx(path: &Path, magic: u32, ndims: usize) -> Result<(Vec<usize>, Vec<u8>), IdxError> {
    let err = |problem: String| IdxError {
        path: path.to_path_buf(),
        problem,
    };
    let raw = std::fs::read(path).map_err(|e| err(format!("cannot read: {e}")))?;
    let bytes = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        GzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .map_err(|e| err(format!("corrupt gzip data: {e}")))?;
        out
    } else {
        raw
    };
    let header = 4 + 4 * ndims;
    if bytes.len() < header {
        return Err(err(format!(
            "truncated: {} bytes, shorter than the IDX header",
            bytes.len()
        )));
    }
    let word = |i: usize| u32::from_be_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
    if word(0) != magic {
        return Err(err(format!(
            "not an MNIST {} file (magic 0x{:08x}, expected 0x{magic:08x})",
            if magic == IMAGES_MAGIC {
                "image"
            } else {
                "label"
            },
            word(0)
        )));
    }
    let dims: Vec<usize> = (1..=ndims).map(|i| word(i) as usize).collect();
    let expected: usize = dims.iter().product();
    let body = &bytes[header..];
    if body.len() != expected {
        return Err(err(format!(
            "truncated or padded: header promises {expected} bytes of data ({dims:?}), found {}",
            body.len()
        )));
    }
    Ok((dims, body.to_vec()))
}

/// burn-dataset's MNIST cache: `dirs::cache_dir()/burn-dataset/mnist`, that is
/// `$XDG_CACHE_HOME` (when absolute) or `$HOME/.cache` on Linux.
pub fn burn_dataset_cache() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|path| path.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    base.join("burn-dataset").join("mnist")
}
