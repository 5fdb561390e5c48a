//! Where the trainers' MNIST comes from: IDX files in `--data-dir`, or
//! burn-dataset's `MnistDataset` (downloaded once into its cache folder).

use burn::data::dataset::Dataset;
use burn_dataset::vision::MnistDataset;
use burn_ddp::ProcessGroup;
use burn_ddp_examples_common::idx::{burn_dataset_cache, Split};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;

/// The training and test splits, each rank's full copy.
///
/// Without `data_dir`, the first rank of each machine fills burn-dataset's cache
/// (downloading at most once per machine) while the others wait at a barrier;
/// then every rank reads the cached files.
pub fn load(
    data_dir: Option<&Path>,
    download_limit: Duration,
    group: &ProcessGroup,
) -> Result<(Split, Split), String> {
    if let Some(dir) = data_dir {
        return burn_ddp_examples_common::mnist::read_idx(dir);
    }
    let local_rank = burn_ddp::group::LaunchEnv::from_env()
        .map(|env| env.local_rank)
        .unwrap_or(0);
    // A replacement joining the running job finds the files there already,
    // and the others are not waiting at this barrier.
    if group.joined_running() {
        return from_burn_dataset(download_limit);
    }
    let first = if local_rank == 0 {
        Some(from_burn_dataset(download_limit)?)
    } else {
        None
    };
    group
        .barrier()
        .map_err(|e| format!("waiting for the first rank of this machine to prepare MNIST: {e}"))?;
    match first {
        Some(splits) => Ok(splits),
        None => from_burn_dataset(download_limit),
    }
}

/// `MnistDataset::{train,test}()`, whose failures (offline, a broken cache) are
/// panics inside burn-dataset and whose download can stall (burn-dataset's
/// downloader has no timeout of its own): turned into one error that says what
/// to do, within `limit`.
fn from_burn_dataset(limit: Duration) -> Result<(Split, Split), String> {
    let cache = burn_dataset_cache();
    let previous_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let (done, result) = mpsc::channel();
    std::thread::spawn(move || {
        let loaded = std::panic::catch_unwind(|| {
            let (train, test) = (MnistDataset::train(), MnistDataset::test());
            (to_split(&train), to_split(&test))
        });
        let _ = done.send(loaded);
    });
    let loaded = result.recv_timeout(limit);
    std::panic::set_hook(previous_hook);
    let loaded = match loaded {
        Ok(loaded) => loaded,
        Err(_) => {
            return Err(format!(
                "MNIST was not in burn-dataset's cache ({}) and its download did not finish \
                 within {} s (--download-timeout); pass --data-dir with a folder holding the \
                 four MNIST IDX files, or fill the cache on a better connection",
                cache.display(),
                limit.as_secs()
            ))
        }
    };
    match loaded {
        Ok(splits) => Ok(splits),
        Err(panic) => {
            let reason = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown failure".into());
            Err(format!(
                "MNIST is not in burn-dataset's cache ({}) and could not be downloaded \
                 ({reason}); pass --data-dir with a folder holding the four MNIST IDX files \
                 (.gz or not), or run once with network access to fill the cache",
                cache.display()
            ))
        }
    }
}

/// burn-dataset's items (pixels as 0-255 floats) back into bytes, so both
/// sources feed the same dataset type and batcher.
fn to_split(dataset: &MnistDataset) -> Split {
    let mut images = Vec::with_capacity(dataset.len() * 28 * 28);
    let mut labels = Vec::with_capacity(dataset.len());
    for item in dataset.iter() {
        images.extend(item.image.iter().flatten().map(|&p| p as u8));
        labels.push(item.label);
    }
    Split {
        images,
        labels,
        rows: 28,
        cols: 28,
    }
}
