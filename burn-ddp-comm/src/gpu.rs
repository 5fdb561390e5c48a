//! Which GPU a rank drives: `cuda:LOCAL_RANK` among the GPUs the process
//! sees, wrapping around when ranks outnumber them. Kept free of CUDA so the
//! rule is tested everywhere. It is right for each way GPUs are handed out:
//!
//! - every rank sees all of its machine's GPUs (torchrun, burn-ddp-run,
//!   `srun --gpus-per-node`): local rank `i` takes GPU `i`;
//! - every rank sees one GPU of its own (`srun --gpus-per-task=1`, or a
//!   per-rank `CUDA_VISIBLE_DEVICES`): it is that rank's `cuda:0`;
//! - every rank sees `k` of its own: it takes the `LOCAL_RANK mod k`-th.

use crate::error::CommError;

/// The variable CUDA reads to hide or renumber GPUs.
pub const VISIBLE_DEVICES_VAR: &str = "CUDA_VISIBLE_DEVICES";

/// The GPU chosen for a rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuChoice {
    /// Its ordinal among the GPUs the process sees (`cuda:N`).
    pub ordinal: usize,
    /// Whether ranks of this machine share GPUs: more ranks than GPUs, all
    /// seeing the same ones. burn-ddp then reduces gradients through host
    /// memory (with `BURN_DDP_BACKEND=nccl`, an error): NCCL needs a GPU per
    /// rank.
    pub shared: bool,
}

/// The GPU for local rank `local_rank` of `local_world_size`, given `visible`
/// GPUs and the process's `CUDA_VISIBLE_DEVICES` (`None` when unset).
///
/// Sharing is reported only when `CUDA_VISIBLE_DEVICES` is unset, so every
/// rank surely sees the same GPUs: under a `CUDA_VISIBLE_DEVICES` (Slurm's
/// `--gpus-per-task`, a per-rank list) this rank cannot tell whether the
/// others see the same ones; NCCL's set-up compares the GPUs' UUIDs and
/// names two ranks on one GPU. No GPU visible is a `CommError::Config` of
/// `CUDA_VISIBLE_DEVICES`.
pub fn choose_gpu(
    local_rank: usize,
    local_world_size: usize,
    visible: usize,
    visible_devices: Option<&str>,
) -> Result<GpuChoice, CommError> {
    if visible == 0 {
        let why = match visible_devices {
            Some(list) => format!("{VISIBLE_DEVICES_VAR}={list:?} leaves none"),
            None => "check the driver with nvidia-smi".to_string(),
        };
        return Err(CommError::config(
            None,
            VISIBLE_DEVICES_VAR,
            format!("local rank {local_rank}: no CUDA device is visible ({why})"),
        ));
    }
    Ok(GpuChoice {
        ordinal: local_rank % visible,
        shared: local_world_size > visible && visible_devices.is_none(),
    })
}

/// How many GPUs `CUDA_VISIBLE_DEVICES` lists: entries up to the first empty
/// or negative one, as CUDA stops there. What the driver then shows can be
/// fewer (an index past the last GPU hides it and those after it).
pub fn listed_devices(visible_devices: &str) -> usize {
    visible_devices
        .split(',')
        .map(str::trim)
        .take_while(|entry| !entry.is_empty() && !entry.starts_with('-'))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ordinals(local_world_size: usize, visible: usize, list: Option<&str>) -> Vec<usize> {
        (0..local_world_size)
            .map(|rank| {
                choose_gpu(rank, local_world_size, visible, list)
                    .unwrap()
                    .ordinal
            })
            .collect()
    }

    #[test]
    fn every_rank_seeing_every_gpu_takes_its_local_rank() {
        assert_eq!(ordinals(4, 4, None), [0, 1, 2, 3]);
        assert_eq!(ordinals(2, 2, Some("0,1")), [0, 1]);
        assert!(!choose_gpu(3, 4, 4, None).unwrap().shared);
    }

    #[test]
    fn a_gpu_of_its_own_is_cuda_0_and_not_shared() {
        // srun --gpus-per-task=1: CUDA_VISIBLE_DEVICES=0 on one task, =1 on the
        // next (or 0 on both, renumbered, under cgroup device confinement).
        for list in ["0", "1"] {
            let choice = choose_gpu(1, 2, 1, Some(list)).unwrap();
            assert_eq!(
                choice,
                GpuChoice {
                    ordinal: 0,
                    shared: false
                }
            );
        }
        // srun --gpus-per-task=2: each task takes a different one of its own,
        // and four such tasks on a node are not taken to share.
        assert_eq!(ordinals(2, 2, Some("2,3")), [0, 1]);
        assert!(!choose_gpu(0, 4, 2, Some("0,1")).unwrap().shared);
    }

    #[test]
    fn more_ranks_than_gpus_all_seeing_them_share_them() {
        assert_eq!(ordinals(4, 2, None), [0, 1, 0, 1]);
        assert!(choose_gpu(0, 4, 2, None).unwrap().shared);
        assert!(choose_gpu(0, 2, 1, None).unwrap().shared);
    }

    #[test]
    fn no_visible_gpu_is_an_error_naming_the_rank_and_the_cause() {
        let err = choose_gpu(1, 2, 0, Some("")).unwrap_err().to_string();
        assert!(
            err.contains("local rank 1") && err.contains("CUDA_VISIBLE_DEVICES=\"\""),
            "{err}"
        );
        let err = choose_gpu(0, 1, 0, None).unwrap_err().to_string();
        assert!(err.contains("nvidia-smi"), "{err}");
    }

    #[test]
    fn the_list_is_read_as_cuda_reads_it() {
        assert_eq!(listed_devices("0"), 1);
        assert_eq!(listed_devices("0,1,2,3"), 4);
        assert_eq!(listed_devices("GPU-8f2a,GPU-11bc"), 2);
        assert_eq!(listed_devices("0,2,-1,3"), 2);
        assert_eq!(listed_devices(""), 0);
        assert_eq!(listed_devices("-1"), 0);
    }
}
