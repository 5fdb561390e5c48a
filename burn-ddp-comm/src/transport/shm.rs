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

use super::{chunk_range, Rendezvous};
use crate::element::{finish_reduce, reduce_into, Element, ReduceOp};
use crate::error::{CommError, Result};
use crate::job::segments;
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
/// The segment starts with its magic, world size, size and the job's token.
const SEGMENT_HEADER: usize = 4 * LINE;
const SEGMENT_MAGIC: &[u8; 8] = b"BDDPSHM2";
fn segment_size(world_size: usize) -> usize {
    SEGMENT_HEADER + LINE * world_size + SLOT_BYTES * (world_size + 1)
}

/// Rank 0's segment file until every rank has mapped it; removed when dropped.
struct CreatedSegment {
    path: PathBuf,
    file: std::fs::File,
}

impl CreatedSegment {
    fn create(size: usize) -> std::result::Result<Self, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut random = [0u8; 8];
        getrandom::fill(&mut random).map_err(|err| format!("no randomness: {err}"))?;
        let path = segments::path_for(std::process::id(), &random);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        let segment = Self { path, file };
        segment.file.set_len(size as u64).map_err(|e| {
            format!(
                "cannot size {} to {size} bytes: {e} (is /dev/shm full? `df -h /dev/shm`)",
                segment.path.display()
            )
        })?;
        Ok(segment)
    }

    fn map(&self) -> std::result::Result<MmapMut, String> {
        // SAFETY: the file is ours (created above, mode 0600) and sized.
        unsafe { MmapMut::map_mut(&self.file) }
            .map_err(|e| format!("cannot map {}: {e}", self.path.display()))
    }
}

impl Drop for CreatedSegment {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn write_header(map: &mut MmapMut, rdzv: &Rendezvous<'_>) {
    let token = rdzv.token_bytes();
    map[..8].copy_from_slice(SEGMENT_MAGIC);
    map[8..16].copy_from_slice(&(rdzv.world_size as u64).to_le_bytes());
    let size = map.len() as u64;
    map[16..24].copy_from_slice(&size.to_le_bytes());
    map[24..32].copy_from_slice(&(token.len() as u64).to_le_bytes());
    map[32..32 + token.len()].copy_from_slice(token);
}

/// Opens and maps the segment rank 0 named, after checking it is one: a wrong
/// path must not make us overwrite another file, nor a short one crash us
/// (SIGBUS) at the first collective.
fn open_segment(
    path: &std::path::Path,
    size: usize,
    rdzv: &Rendezvous<'_>,
) -> std::result::Result<MmapMut, String> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    if !segments::is_segment_path(path) {
        return Err(format!(
            "the store names {} as the segment, which is not a burn-ddp segment in {}",
            path.display(),
            segments::dir().display()
        ));
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| {
            format!(
                "cannot open {}: {e} (every rank on a machine must run as the same user)",
                path.display()
            )
        })?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot inspect {}: {e}", path.display()))?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !meta.is_file() || meta.uid() != me || meta.len() != size as u64 {
        return Err(format!(
            "{} is not this job's segment (a file of uid {} and {} bytes; expected uid {me} \
             and {size} bytes for {} ranks)",
            path.display(),
            meta.uid(),
            meta.len(),
            rdzv.world_size
        ));
    }
    // SAFETY: a regular file of ours, of the size we will access.
    let map = unsafe { MmapMut::map_mut(&file) }
        .map_err(|e| format!("cannot map {}: {e}", path.display()))?;
    let word = |at: usize| u64::from_le_bytes(map[at..at + 8].try_into().unwrap());
    let token_len = word(24) as usize;
    let genuine = &map[..8] == SEGMENT_MAGIC
        && word(8) == rdzv.world_size as u64
        && word(16) == size as u64
        && token_len <= SEGMENT_HEADER - 32
        && rdzv.admits(&map[32..32 + token_len]);
    if !genuine {
        return Err(format!(
            "{} does not hold this job's segment header (another job's, or not a segment); \
             every rank must run under the same launcher or {}",
            path.display(),
            crate::job::JOB_TOKEN_VAR
        ));
    }
    Ok(map)
}

/// Shared-memory collectives between the ranks of one machine.
pub struct SharedMemory {
    /// This rank's index among the machine's ranks in the group.
    rank: usize,
    world_size: usize,
    /// Group rank of each index, for messages.
    members: Vec<usize>,
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
    /// Maps the group's segment: rank 0 creates it (readable by this user
    /// only) and publishes its path in the store; the others check that the
    /// path is a segment of this job — in the segment directory, ours, of the
    /// expected size, holding the job's token — before they map it. Once every
    /// rank has mapped it, the file is unlinked, so nothing is left in
    /// `/dev/shm` even if the job crashes; a set-up that fails removes it too.
    pub fn connect(rdzv: Rendezvous<'_>) -> Result<Self> {
        let Rendezvous {
            rank,
            world_size,
            store,
            key_prefix,
            timeout,
            ..
        } = rdzv;
        let size = segment_size(world_size);
        let members = rdzv.member_ranks();
        let setup = |detail: String| CommError::Peer {
            rank: members[rank],
            peer: members[rank],
            op: "shared-memory transport setup".into(),
            detail,
            source: None,
        };
        let path_key = format!("{key_prefix}shm/path");
        let (map, created) = if rank == 0 {
            let created = CreatedSegment::create(size).map_err(setup)?;
            let mut map = created.map().map_err(setup)?;
            write_header(&mut map, &rdzv);
            store.set(&path_key, created.path.to_string_lossy().as_bytes())?;
            (map, Some(created))
        } else {
            let path = String::from_utf8_lossy(&store.get(&path_key, timeout)?).into_owned();
            let map = open_segment(std::path::Path::new(&path), size, &rdzv).map_err(setup)?;
            (map, None)
        };
        let mut transport = Self {
            rank,
            world_size,
            members,
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
        drop(created); // unlinks: every rank holds its mapping now
        for peer in 0..world_size {
            transport.pids[peer] = transport.pid_cell(peer).load(Ordering::SeqCst) as u32;
        }
        Ok(transport)
    }

    fn counter(&self, rank: usize) -> &AtomicU64 {
        // SAFETY: after the segment header come one 64-byte line per rank,
        // 8-byte aligned (the mapping is page aligned); atomics are the only
        // access to them.
        unsafe { &*(self.map.as_ptr().add(SEGMENT_HEADER + rank * LINE) as *const AtomicU64) }
    }

    fn pid_cell(&self, rank: usize) -> &AtomicU64 {
        unsafe { &*(self.map.as_ptr().add(SEGMENT_HEADER + rank * LINE + 8) as *const AtomicU64) }
    }

    /// Slot `index` (`world_size` is the result slot) as elements of `T`.
    #[allow(clippy::mut_from_ref)]
    fn slot<T: Element>(&self, index: usize) -> &mut [T] {
        let start = SEGMENT_HEADER + LINE * self.world_size + index * SLOT_BYTES;
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
                let peer = self.members[peer];
                return Err(CommError::Peer {
                    rank: self.members[self.rank],
                    peer,
                    op: op.into(),
                    detail: format!("rank {peer} failed an earlier collective"),
                    source: None,
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
                        rank: self.members[self.rank],
                        peer: self.members[peer],
                        op: op.into(),
                        detail: format!(
                            "rank {} (pid {}) exited, crashed or failed earlier",
                            self.members[peer], self.pids[peer]
                        ),
                        source: None,
                    });
                }
                if now >= deadline {
                    let peer = self.members[peer];
                    return Err(CommError::Timeout {
                        rank: Some(self.members[self.rank]),
                        peer: Some(peer),
                        what: format!("rank {peer} to reach {op}"),
                        after: self.timeout,
                    });
                }
            }
        }
    }

    /// Marks this rank failed, so the others fail at once, and stays unusable.
    fn fail(&mut self) {
        self.broken
            .get_or_insert_with(|| "it was aborted after another level failed".into());
        self.counter(self.rank).store(FAILED, Ordering::Release);
    }

    fn guarded(&mut self, op: &str, body: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        if let Some(reason) = &self.broken {
            return Err(CommError::Peer {
                rank: self.members[self.rank],
                peer: self.members[self.rank],
                op: op.into(),
                detail: format!(
                    "shared-memory transport unusable after an earlier error: {reason}"
                ),
                source: None,
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

typed_transport!(SharedMemory, "shm", fail);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::JobToken;
    use crate::store::{MemoryStore, Store};
    use std::sync::atomic::AtomicPtr;

    fn rdzv<'a>(
        rank: usize,
        store: &'a MemoryStore,
        token: Option<&'a JobToken>,
    ) -> Rendezvous<'a> {
        Rendezvous::for_test(rank, 2, store, token, Duration::from_secs(5))
    }

    /// Rank 0 of a two-rank group (rank 1 maps the file on another thread, then
    /// takes no further part).
    fn rank_zero() -> SharedMemory {
        let store = std::sync::Arc::new(MemoryStore::new());
        let peer_store = std::sync::Arc::clone(&store);
        let peer =
            std::thread::spawn(move || SharedMemory::connect(rdzv(1, &peer_store, None)).unwrap());
        let zero = SharedMemory::connect(rdzv(0, &store, None)).unwrap();
        drop(peer.join().unwrap());
        zero
    }

    /// Rank 0 creating its segment on another thread; returns the path it
    /// published (rank 0 then waits for rank 1 up to `timeout`).
    fn creating_rank_zero(
        store: &std::sync::Arc<MemoryStore>,
        token: Option<JobToken>,
        timeout: Duration,
    ) -> (std::thread::JoinHandle<Result<SharedMemory>>, PathBuf) {
        let zero_store = std::sync::Arc::clone(store);
        let zero = std::thread::spawn(move || {
            let mut r = rdzv(0, &zero_store, token.as_ref());
            r.timeout = timeout;
            SharedMemory::connect(r)
        });
        let path = store.get("t/shm/path", Duration::from_secs(5)).unwrap();
        (zero, PathBuf::from(String::from_utf8(path).unwrap()))
    }

    #[test]
    fn the_segment_is_private_and_removed_when_set_up_fails() {
        use std::os::unix::fs::MetadataExt;
        let store = std::sync::Arc::new(MemoryStore::new());
        let (zero, path) = creating_rank_zero(&store, None, Duration::from_millis(500));
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600, "{}", path.display());
        assert!(path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with(&format!("burn-ddp-{}-", std::process::id())));
        // Rank 1 never maps it: rank 0 times out and removes the file.
        let err = zero.join().unwrap().err().unwrap();
        assert!(err.is_timeout(), "{err}");
        assert!(!path.exists(), "{} left behind", path.display());
    }

    #[test]
    fn a_rank_refuses_a_path_that_is_not_this_jobs_segment() {
        let dir = segments::dir();
        // A creator pid no process has, so the sweep below touches nothing else.
        let creator = 3_999_999_999u32;
        let short = dir.join(format!("burn-ddp-{creator}-short"));
        std::fs::write(&short, b"too short").unwrap();
        let outside = std::env::temp_dir().join("not-a-segment");
        for (path, expect) in [
            (PathBuf::from("/etc/passwd"), "not a burn-ddp segment"),
            (dir.join("other-file"), "not a burn-ddp segment"),
            (short.clone(), "not this job's segment"),
            (outside, "not a burn-ddp segment"),
        ] {
            let store = MemoryStore::new();
            store
                .set("t/shm/path", path.to_string_lossy().as_bytes())
                .unwrap();
            let err = SharedMemory::connect(rdzv(1, &store, None))
                .err()
                .unwrap()
                .to_string();
            assert!(
                err.contains("rank 1") && err.contains(expect),
                "{}: {err}",
                path.display()
            );
        }
        assert_eq!(std::fs::read(&short).unwrap(), b"too short", "untouched");
        assert_eq!(segments::remove_left_by(&[creator]), 1);
        assert!(!short.exists());
    }

    #[test]
    fn a_rank_of_another_job_cannot_map_the_segment() {
        let store = std::sync::Arc::new(MemoryStore::new());
        let ours = JobToken::new("our-job").unwrap();
        let (zero, _path) = creating_rank_zero(&store, Some(ours.clone()), Duration::from_secs(1));
        let theirs = JobToken::new("their-job").unwrap();
        let err = SharedMemory::connect(rdzv(1, &store, Some(&theirs)))
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("header") && err.contains("BURN_DDP_JOB_TOKEN"),
            "{err}"
        );
        // The genuine rank 1 still gets in.
        let one = SharedMemory::connect(rdzv(1, &store, Some(&ours)));
        assert!(one.is_ok(), "{:?}", one.err());
        assert!(zero.join().unwrap().is_ok());
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
