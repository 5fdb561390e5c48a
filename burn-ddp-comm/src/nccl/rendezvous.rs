// Used by the `nccl` feature; compiled without it too, so CI tests it.
#![cfg_attr(not(feature = "nccl"), allow(dead_code))]

//! What ranks agree on before NCCL starts: which communicator this is, its
//! unique id, and that no two ranks drive the same GPU.

use crate::error::{CommError, Result, StoreErrorKind};
use crate::store::Store;
use std::time::Duration;

/// Bytes in an `ncclUniqueId`.
pub(crate) const UNIQUE_ID_BYTES: usize = 128;

/// The store keys of one communicator: under its group's prefix (job id and
/// group generation), numbered by creation within the group.
pub(crate) struct NcclKeys {
    base: String,
}

impl NcclKeys {
    fn unique_id(&self) -> String {
        format!("{}unique-id", self.base)
    }

    fn device(&self, rank: usize) -> String {
        format!("{}device/{rank}", self.base)
    }
}

/// The keys of the communicator the ranks of the group whose keys are under
/// `group_prefix` are creating now: each creation bumps a counter once per
/// rank, and creation is collective, so each communicator's `world_size`
/// increments are consecutive and no stale id is ever handed out.
pub(crate) fn next_communicator(
    store: &dyn Store,
    group_prefix: &str,
    world_size: usize,
) -> Result<NcclKeys> {
    let counted = store.add(&format!("{group_prefix}nccl/created"), 1)?;
    Ok(NcclKeys {
        base: format!("{group_prefix}nccl/{}/", generation_of(counted, world_size)),
    })
}

fn generation_of(counted: i64, world_size: usize) -> u64 {
    (counted.max(1) as u64 - 1) / world_size as u64
}

/// Rank 0 publishes `id` (when given); every rank returns the published id.
pub(crate) fn share_unique_id(
    store: &dyn Store,
    keys: &NcclKeys,
    rank: usize,
    id: Option<[u8; UNIQUE_ID_BYTES]>,
    timeout: Duration,
) -> Result<[u8; UNIQUE_ID_BYTES]> {
    let key = keys.unique_id();
    if let Some(id) = id {
        store.set(&key, &id)?;
        return Ok(id);
    }
    let bytes = store.get(&key, timeout)?;
    bytes.try_into().map_err(|bytes: Vec<u8>| {
        CommError::store(
            Some(rank),
            StoreErrorKind::BadValue,
            format!(
                "the NCCL unique id under {key:?} has {} bytes, not {UNIQUE_ID_BYTES}",
                bytes.len()
            ),
        )
    })
}

/// Publishes which GPU this rank drives and fails (on every rank alike) when
/// two ranks share one: NCCL refuses that, and would say so less clearly.
///
/// `gpu` identifies the physical GPU (its UUID), not its ordinal: with a
/// per-rank `CUDA_VISIBLE_DEVICES` every rank sees its own GPU as `cuda:0`.
pub(crate) fn check_one_gpu_per_rank(
    store: &dyn Store,
    keys: &NcclKeys,
    rank: usize,
    world_size: usize,
    gpu: &str,
    ordinal: usize,
    timeout: Duration,
) -> Result<()> {
    store.set(&keys.device(rank), format!("{gpu}#{ordinal}").as_bytes())?;
    let places = (0..world_size)
        .map(|r| {
            store
                .get(&keys.device(r), timeout)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .map_err(CommError::from)
        })
        .collect::<Result<Vec<_>>>()?;
    match first_shared_device(&places) {
        None => Ok(()),
        Some((a, b)) => {
            let (gpu, ordinal_a) = places[a].rsplit_once('#').unwrap_or((&places[a], "?"));
            let ordinal_b = places[b].rsplit('#').next().unwrap_or("?");
            Err(CommError::config(
                Some(rank),
                "device",
                format!(
                "rank {rank}: ranks {a} and {b} both drive the GPU {gpu} (their cuda:{ordinal_a} \
                 and cuda:{ordinal_b}), and NCCL needs one GPU per rank; give each rank its own \
                 device (cuda:LOCAL_RANK, with as many ranks per machine as GPUs), or set \
                 BURN_DDP_BACKEND=tcp"
            ),
            ))
        }
    }
}

/// The first two ranks that drive the same GPU (`gpu#ordinal` entries with
/// the same `gpu`).
fn first_shared_device(places: &[String]) -> Option<(usize, usize)> {
    let gpu = |place: &String| {
        place
            .rsplit_once('#')
            .map_or(place.clone(), |(g, _)| g.to_string())
    };
    places.iter().enumerate().find_map(|(b, place)| {
        places[..b]
            .iter()
            .position(|p| gpu(p) == gpu(place))
            .map(|a| (a, b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;

    fn keys(generation: u64) -> NcclKeys {
        NcclKeys {
            base: format!("g/nccl/{generation}/"),
        }
    }

    #[test]
    fn generations_advance_once_per_collective_creation() {
        let world = 3;
        let seen: Vec<u64> = (1..=9).map(|n| generation_of(n, world)).collect();
        assert_eq!(seen, [0, 0, 0, 1, 1, 1, 2, 2, 2]);
        let store = MemoryStore::new();
        let first: Vec<String> = (0..world)
            .map(|_| next_communicator(&store, "g/", world).unwrap().base)
            .collect();
        let second = next_communicator(&store, "g/", world).unwrap().base;
        assert_eq!(first, ["g/nccl/0/", "g/nccl/0/", "g/nccl/0/"]);
        assert_eq!(second, "g/nccl/1/");
        // Another group's communicators count from 0 under its own prefix.
        let other = next_communicator(&store, "h/", world).unwrap();
        assert_eq!(other.unique_id(), "h/nccl/0/unique-id");
    }

    #[test]
    fn the_unique_id_travels_through_the_store() {
        let store = MemoryStore::new();
        let mut id = [0u8; UNIQUE_ID_BYTES];
        id.iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8 ^ 0x5a);
        let timeout = Duration::from_millis(100);
        assert_eq!(
            share_unique_id(&store, &keys(4), 0, Some(id), timeout).unwrap(),
            id
        );
        assert_eq!(
            share_unique_id(&store, &keys(4), 1, None, timeout).unwrap(),
            id
        );
        // Another generation has no id yet: a bounded wait, then a timeout.
        let err = share_unique_id(&store, &keys(5), 1, None, timeout).unwrap_err();
        assert!(err.is_timeout(), "{err}");
        store.set("g/nccl/6/unique-id", b"short").unwrap();
        let err = share_unique_id(&store, &keys(6), 2, None, timeout)
            .unwrap_err()
            .to_string();
        assert!(err.contains("rank 2") && err.contains("5 bytes"), "{err}");
    }

    #[test]
    fn two_ranks_on_one_gpu_are_named() {
        let places = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            first_shared_device(&places(&["gpu-a#0", "gpu-b#1", "gpu-c#0"])),
            None
        );
        assert_eq!(
            first_shared_device(&places(&["gpu-a#0", "gpu-b#1", "gpu-a#0"])),
            Some((0, 2))
        );
        let store = MemoryStore::new();
        let timeout = Duration::from_millis(100);
        check_one_gpu_per_rank(&store, &keys(0), 1, 2, "gpu-a", 0, timeout).unwrap_err();
        let store = MemoryStore::new();
        store.set("g/nccl/0/device/0", b"gpu-a#0").unwrap();
        let err = check_one_gpu_per_rank(&store, &keys(0), 1, 2, "gpu-a", 1, timeout)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("rank 1")
                && err.contains("ranks 0 and 1 both drive the GPU gpu-a")
                && err.contains("cuda:0 and cuda:1"),
            "{err}"
        );
        assert!(err.contains("BURN_DDP_BACKEND=tcp"), "{err}");
    }

    #[test]
    fn ranks_that_each_see_their_gpu_as_cuda_0_are_not_refused() {
        // A per-rank CUDA_VISIBLE_DEVICES: every rank's GPU is its cuda:0.
        let store = MemoryStore::new();
        let timeout = Duration::from_millis(100);
        store.set("g/nccl/0/device/0", b"gpu-a#0").unwrap();
        check_one_gpu_per_rank(&store, &keys(0), 1, 2, "gpu-b", 0, timeout).unwrap();
    }
}
