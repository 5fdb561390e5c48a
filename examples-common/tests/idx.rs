//! MNIST's IDX files as the trainers read them: files the test writes, gzip or
//! not, and each way a file can be wrong.

use burn_ddp_examples_common::idx::{load_split, IdxError};
use flate2::write::GzEncoder;
use flate2::Compression;
use std::io::Write;
use std::path::{Path, PathBuf};

const IMAGES_MAGIC: u32 = 0x0000_0803;
const LABELS_MAGIC: u32 = 0x0000_0801;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "burn-ddp-examples-common-idx-{name}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn idx_bytes(magic: u32, dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut bytes = magic.to_be_bytes().to_vec();
    for dim in dims {
        bytes.extend(dim.to_be_bytes());
    }
    bytes.extend(data);
    bytes
}

/// `n` 28x28 images (image `i` all `i`) and labels `i % 10`, the images
/// gzip-compressed when `gz`.
fn write_split(dir: &Path, prefix: &str, n: u32, gz: bool) {
    let pixels: Vec<u8> = (0..n).flat_map(|i| [i as u8; 28 * 28]).collect();
    let images = idx_bytes(IMAGES_MAGIC, &[n, 28, 28], &pixels);
    let labels: Vec<u8> = (0..n).map(|i| (i % 10) as u8).collect();
    let labels = idx_bytes(LABELS_MAGIC, &[n], &labels);
    let images_path = dir.join(format!("{prefix}-images-idx3-ubyte"));
    if gz {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
        encoder.write_all(&images).unwrap();
        let gz_path = images_path.with_file_name(format!("{prefix}-images-idx3-ubyte.gz"));
        std::fs::write(gz_path, encoder.finish().unwrap()).unwrap();
    } else {
        std::fs::write(images_path, images).unwrap();
    }
    std::fs::write(dir.join(format!("{prefix}-labels-idx1-ubyte")), labels).unwrap();
}

#[test]
fn reads_plain_and_gzip_files_and_truncates() {
    let dir = scratch("read");
    write_split(&dir, "train", 12, true);
    write_split(&dir, "t10k", 3, false);
    let mut train = load_split(&dir, "train").unwrap();
    assert_eq!(
        (train.len(), train.rows, train.cols, train.pixels()),
        (12, 28, 28, 784)
    );
    assert_eq!(train.images.len(), 12 * 784);
    assert_eq!(train.images[5 * 784], 5);
    assert_eq!(train.labels[11], 1);
    train.truncate(4);
    assert_eq!((train.len(), train.images.len()), (4, 4 * 784));
    train.truncate(0);
    assert!(train.is_empty() && train.images.is_empty());
    let test = load_split(&dir, "t10k").unwrap();
    assert_eq!(test.labels, [0, 1, 2]);
    let _ = std::fs::remove_dir_all(&dir);
}

fn refused(dir: &Path) -> IdxError {
    match load_split(dir, "train") {
        Ok(_) => panic!("{} was read", dir.display()),
        Err(err) => err,
    }
}

#[test]
fn bad_files_are_named_with_what_is_wrong() {
    let dir = scratch("bad");
    let err = refused(&dir);
    assert!(
        err.to_string().contains("not found")
            && err.to_string().contains("train-images-idx3-ubyte.gz")
            && err.to_string().contains("--data-dir"),
        "{err}"
    );

    write_split(&dir, "train", 2, false);
    let labels = dir.join("train-labels-idx1-ubyte");
    std::fs::write(&labels, idx_bytes(LABELS_MAGIC, &[2], &[3, 12])).unwrap();
    let err = refused(&dir);
    assert_eq!(err.path, labels);
    assert!(err.to_string().contains("label 12 is not a digit"), "{err}");

    std::fs::write(&labels, idx_bytes(LABELS_MAGIC, &[3], &[1, 2, 3])).unwrap();
    let err = refused(&dir);
    assert!(err.to_string().contains("holds 3 labels but"), "{err}");

    std::fs::write(&labels, idx_bytes(IMAGES_MAGIC, &[2], &[1, 2])).unwrap();
    let err = refused(&dir);
    assert!(err.to_string().contains("not an MNIST label file"), "{err}");

    std::fs::write(&labels, [0, 0]).unwrap();
    let err = refused(&dir);
    assert!(
        err.to_string().contains("shorter than the IDX header"),
        "{err}"
    );

    let images = dir.join("train-images-idx3-ubyte");
    std::fs::write(&images, idx_bytes(IMAGES_MAGIC, &[1, 2, 2], &[0; 4])).unwrap();
    let err = refused(&dir);
    assert!(err.to_string().contains("holds 2x2 images"), "{err}");

    std::fs::write(&images, idx_bytes(IMAGES_MAGIC, &[1, 28, 28], &[0; 100])).unwrap();
    let err = refused(&dir);
    assert!(err.to_string().contains("truncated or padded"), "{err}");

    std::fs::write(&images, [0x1f, 0x8b, 0, 1, 2]).unwrap();
    let err = refused(&dir);
    assert!(err.to_string().contains("corrupt gzip data"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
