//! Collectives through shared memory, for ranks on one machine.
//!
//! Every rank maps one file in `/dev/shm` holding a header (one cache line per
//! rank: a phase counter and its pid), one input slot per rank and a result
//! slot. A collective moves through the buffer in slot-sized pieces; for each
//! piece a rank writes its input to its slot, waits for all, works on the slots
//! (all-reduce: reduces its own segment into the result slot), waits again and
//! reads what it needs. Data crosses process boundaries once, at memory speed,
//! instead of twice through the kernel's TCP stack.
//!
//! Waiting is a spin on the other ranks' counters (yielding, then sleeping when
//! it lasts), bounded by the group's timeout; a rank whose process has exited is
//! detected within milliseconds and named.

use super::chunk_range;
use crate::element::{finish_reduce, reduce_into, Element, ReduceOp};
use crate::error::{CommError, Result};
use crate::store::Store;
use memmap2::MmapMut;
use std::fs::OpenOptions;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Bytes per slot: big enough to amortise the two waits per piece, small enough
/// to stay cache-friendly.
pub const SLOT_BYTES: usize = 4 << 20;
const LINE: usize = 64;
/// Phase counter value of a rank whose collective failed.
const FAILED: u64 = u64::MAX;

/// Shared-memory collectives between the ranks of one machine.
pub struct SharedMemory {
    rank: usize,
    world_size: usize,
    timeout: Duration,
    map: MmapMut,
    /// Barriers passed so far; every rank passes the same sequence.
    phase: u64,
    pids: Vec<u32>,
    /// Whether a peer's process is still there ([`process_alive`]; tests
    /// replace it to stage a peer exiting at an awkward moment).
    alive: fn(u32) -> bool,
    broken: Option<String>,
}

impl SharedMemory {
    /// Maps the group's segment: rank 0 creates it and publishes its path in the
    /// store; once every rank has mapped it, the file is unlinked, so nothing is
    /// left in `/dev/shm` even if the job crashes.
    pub fn connect(
        rank: usize,
        world_size: usize,
        store: &dyn Store,
        key_prefix: &str,
        timeout: Duration,
    ) -> Result<Self> {
        let size = LINE * world_size + SLOT_BYTES * (world_size + 1);
        let setup = |detail: String| CommError::Peer {
            rank,
            peer: rank,
            op: "shared-memory transport setup".into(),
            detail,
        };
        let path_key = format!("{key_prefix}shm/path");
        let path = if rank == 0 {
            let dir = if std::path::Path::new("/dev/shm").is_dir() {
                PathBuf::from("/dev/shm")
            } else {
                std::env::temp_dir()
            };
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            let path = dir.join(format!("burn-ddp-{}-{nanos}", std::process::id()));
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(|e| setup(format!("cannot create {}: {e}", path.display())))?;
            file.set_len(size as u64)
                .map_err(|e| setup(format!("cannot size {}: {e}", path.display())))?;
            store.set(&path_key, path.to_string_lossy().as_bytes())?;
            path
        } else {
            PathBuf::from(String::from_utf8_lossy(&store.get(&path_key, timeout)?).into_owned())
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| setup(format!("cannot open {}: {e}", path.display())))?;
        // SAFETY: the file is private to this group and sized above; all access
        // to it goes through this struct, synchronised by the phase counters.
        let map = unsafe { MmapMut::map_mut(&file) }
            .map_err(|e| setup(format!("cannot map {}: {e}", path.display())))?;
        let mut transport = Self {
            rank,
            world_size,
            timeout,
            map,
            phase: 0,
            pids: vec![0; world_size],
            alive: process_alive,
            broken: None,
        };
        transport
            .pid_cell(rank)
            .store(std::process::id() as u64, Ordering::SeqCst);
        store.set(&format!("{key_prefix}shm/mapped/{rank}"), b"1")?;
        let keys: Vec<String> = (0..world_size)
            .map(|r| format!("{key_prefix}shm/mapped/{r}"))
            .collect();
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        store.wait(&keys, timeout)?;
        if rank == 0 {
            let _ = std::fs::remove_file(&path);
        }
        for peer in 0..world_size {
            transport.pids[peer] = transport.pid_cell(peer).load(Ordering::SeqCst) as u32;
        }
        Ok(transport)
    }

    fn counter(&self, rank: usize) -> &AtomicU64 {
        // SAFETY: the header holds one 64-byte line per rank, 8-byte aligned (the
        // mapping is page aligned); atomics are the only access to it.
        unsafe { &*(self.map.as_ptr().add(rank * LINE) as *const AtomicU64) }
    }

    fn pid_cell(&self, rank: usize) -> &AtomicU64 {
        unsafe { &*(self.map.as_ptr().add(rank * LINE + 8) as *const AtomicU64) }
    }

    /// Slot `index` (`world_size` is the result slot) as elements of `T`.
    #[allow(clippy::mut_from_ref)]
    fn slot<T: Element>(&self, index: usize) -> &mut [T] {
        let start = LINE * self.world_size + index * SLOT_BYTES;
        // SAFETY: in bounds by construction and 64-byte aligned; the protocol
        // guarantees that a slot is written by one rank at a time and read only
        // after the barrier that follows the write.
        unsafe {
            let ptr = self.map.as_ptr().add(start) as *mut T;
            std::slice::from_raw_parts_mut(ptr, SLOT_BYTES / std::mem::size_of::<T>())
        }
    }

    /// Announces this rank's arrival and waits for every other rank.
    fn barrier(&mut self, op: &str) -> Result<()> {
        self.phase += 1;
        let phase = self.phase;
        self.counter(self.rank).store(phase, Ordering::Release);
        let deadline = Instant::now() + self.timeout;
        let mut spins = 0u32;
        let mut next_liveness_check = Instant::now() + Duration::from_millis(10);
        loop {
            if let Some(peer) = (0..self.world_size)
                .find(|&q| q != self.rank && self.counter(q).load(Ordering::Acquire) == FAILED)
            {
                return Err(CommError::Peer {
                    rank: self.rank,
                    peer,
                    op: op.into(),
                    detail: format!("rank {peer} failed an earlier collective"),
                });
            }
            let lagging =
                (0..self.world_size).find(|&q| self.counter(q).load(Ordering::Acquire) < phase);
            let Some(peer) = lagging else { return Ok(()) };
            spins += 1;
            if spins < 2_000 {
                std::hint::spin_loop();
            } else if spins < 4_000 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
            let now = Instant::now();
            if now >= next_liveness_check {
                next_liveness_check = now + Duration::from_millis(10);
                // The peer may have arrived, finished and exited since we saw it
                // lagging (the last collective of a program): only a dead peer
                // whose counter is still behind will never come.
                if !(self.alive)(self.pids[peer])
                    && self.counter(peer).load(Ordering::Acquire) < phase
                {
                    return Err(CommError::Peer {
                        rank: self.rank,
                        peer,
                        op: op.into(),
                        detail: format!(
                            "rank {peer} (pid {}) exited, crashed or failed earlier",
                            self.pids[peer]
                        ),
                    });
                }
                if now >= deadline {
                    return Err(CommError::Timeout {
                        rank: self.rank,
                        what: format!("rank {peer} to reach {op}"),
                        after: self.timeout,
                    });
                }
            }
        }
    }

    fn guarded(&mut self, op: &str, body: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        if let Some(reason) = &self.broken {
            return Err(CommError::Peer {
                rank: self.rank,
                peer: self.rank,
                op: op.into(),
                detail: format!(
                    "shared-memory transport unusable after an earlier error: {reason}"
                ),
            });
        }
        let result = body(self);
        if let Err(err) = &result {
            // Ranks are out of step now: tell the others at once.
            self.broken = Some(err.to_string());
            self.counter(self.rank).store(FAILED, Ordering::Release);
        }
        result
    }

    fn piece_len<T: Element>(&self) -> usize {
        SLOT_BYTES / std::mem::size_of::<T>()
    }

    fn all_reduce_typed<T: Element>(&mut self, data: &mut [T], op: ReduceOp) -> Result<()> {
        let (n, r) = (self.world_size, self.rank);
        let piece = self.piece_len::<T>();
        self.guarded("all_reduce", |shm| {
            for chunk in data.chunks_mut(piece) {
                let len = chunk.len();
                shm.slot::<T>(r)[..len].copy_from_slice(chunk);
                shm.barrier("all_reduce")?;
                let segment = chunk_range(len, n, r);
                let result = &mut shm.slot::<T>(n)[segment.clone()];
                result.copy_from_slice(&shm.slot::<T>(0)[segment.clone()]);
                for q in 1..n {
                    reduce_into(op, result, &shm.slot::<T>(q)[segment.clone()]);
                }
                finish_reduce(op, result, n);
                shm.barrier("all_reduce")?;
                chunk.copy_from_slice(&shm.slot::<T>(n)[..len]);
            }
            Ok(())
        })
    }

    fn reduce_scatter_typed<T: Element>(&mut self, data: &mut [T], op: ReduceOp) -> Result<()> {
        let (n, r) = (self.world_size, self.rank);
        let k = data.len() / n;
        let piece = (self.piece_len::<T>() / n).max(1);
        if k == 0 {
            return Ok(());
        }
        self.guarded("reduce_scatter", |shm| {
            for offset in (0..k).step_by(piece) {
                let len = piece.min(k - offset);
                let slot = shm.slot::<T>(r);
                for q in 0..n {
                    slot[q * len..(q + 1) * len]
                        .copy_from_slice(&data[q * k + offset..q * k + offset + len]);
                }
                shm.barrier("reduce_scatter")?;
                let mine = &mut data[r * k + offset..r * k + offset + len];
                mine.copy_from_slice(&shm.slot::<T>(0)[r * len..(r + 1) * len]);
                for q in 1..n {
                    reduce_into(op, mine, &shm.slot::<T>(q)[r * len..(r + 1) * len]);
                }
                finish_reduce(op, mine, n);
                shm.barrier("reduce_scatter")?;
            }
            Ok(())
        })
    }

    fn all_gather_typed<T: Element>(&mut self, data: &mut [T]) -> Result<()> {
        let (n, r) = (self.world_size, self.rank);
        let k = data.len() / n;
        let piece = self.piece_len::<T>();
        if k == 0 {
            return Ok(());
        }
        self.guarded("all_gather", |shm| {
            for offset in (0..k).step_by(piece) {
                let len = piece.min(k - offset);
                shm.slot::<T>(r)[..len]
                    .copy_from_slice(&data[r * k + offset..r * k + offset + len]);
                shm.barrier("all_gather")?;
                for q in (0..n).filter(|&q| q != r) {
                    data[q * k + offset..q * k + offset + len]
                        .copy_from_slice(&shm.slot::<T>(q)[..len]);
                }
                shm.barrier("all_gather")?;
            }
            Ok(())
        })
    }

    fn broadcast_typed<T: Element>(&mut self, data: &mut [T], root: usize) -> Result<()> {
        let piece = self.piece_len::<T>();
        let rank = self.rank;
        self.guarded("broadcast", |shm| {
            for chunk in data.chunks_mut(piece) {
                if rank == root {
                    shm.slot::<T>(root)[..chunk.len()].copy_from_slice(chunk);
                }
                shm.barrier("broadcast")?;
                if rank != root {
                    chunk.copy_from_slice(&shm.slot::<T>(root)[..chunk.len()]);
                }
                shm.barrier("broadcast")?;
            }
            Ok(())
        })
    }
}

/// Whether a process exists and has not exited (a zombie counts as exited).
fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with(['Z', 'X']),
        // Without /proc, ask the kernel directly.
        // SAFETY: kill with signal 0 only checks for existence.
        Err(_) => unsafe { libc::kill(pid as libc::pid_t, 0) == 0 },
    }
}

typed_transport!(SharedMemory, "shm");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;
    use std::sync::atomic::AtomicPtr;

    /// Rank 0 of a two-rank group (rank 1 maps the file on another thread, then
    /// takes no further part).
    fn rank_zero() -> SharedMemory {
        let store = std::sync::Arc::new(MemoryStore::new());
        let peer_store = std::sync::Arc::clone(&store);
        let peer = std::thread::spawn(move || {
            SharedMemory::connect(1, 2, &*peer_store, "t/", Duration::from_secs(5)).unwrap()
        });
        let zero = SharedMemory::connect(0, 2, &*store, "t/", Duration::from_secs(5)).unwrap();
        drop(peer.join().unwrap());
        zero
    }

    /// Rank 1's arrival counter, as rank 0 maps it.
    static PEER_COUNTER: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());

    /// The peer reaches the barrier and exits just before rank 0 looks at it.
    fn arrived_then_exited(_pid: u32) -> bool {
        // SAFETY: set to rank 0's live mapping before the barrier starts.
        unsafe { (*PEER_COUNTER.load(Ordering::SeqCst)).store(1, Ordering::Release) };
        false
    }

    #[test]
    fn a_peer_that_arrived_before_exiting_completes_the_barrier() {
        let mut zero = rank_zero();
        PEER_COUNTER.store(zero.counter(1) as *const _ as *mut _, Ordering::SeqCst);
        zero.alive = arrived_then_exited;
        zero.barrier("the last collective").unwrap();
    }

    #[test]
    fn a_peer_that_exited_without_arriving_is_named() {
        let mut zero = rank_zero();
        zero.alive = |_| false;
        let started = Instant::now();
        let err = zero.barrier("all_reduce").unwrap_err().to_string();
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(
            err.contains("rank 0: all_reduce with rank 1 failed") && err.contains("exited"),
            "{err}"
        );
    }
}
