//! Ring collectives over TCP.
//!
//! Each rank keeps two connections: one it writes to (the next rank) and one it
//! reads from (the previous rank). All-reduce is reduce-scatter followed by
//! all-gather around the ring, so every rank sends and receives about twice the
//! buffer size whatever the world size, and large chunks stream in pieces so the
//! reduction overlaps the transfer.

use super::chunk_range;
use crate::element::{finish_reduce, reduce_into, Element, ReduceOp};
use crate::error::{io_is_timeout, CommError, Result};
use crate::store::Store;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::time::{Duration, Instant};

/// Bytes received and reduced at a time: big enough to amortise system calls,
/// small enough to stay in cache while being reduced.
const PIECE_BYTES: usize = 256 << 10;

/// Sends at or below this size are written before reading instead of from a
/// helper thread: the kernel's socket buffers hold them without the peer reading.
const INLINE_SEND_BYTES: usize = 32 << 10;

/// First bytes of the handshake, so a stray connection is recognised.
const HANDSHAKE_MAGIC: &[u8; 4] = b"BDDP";
const PROTOCOL_VERSION: u32 = 1;

/// A ring of TCP connections between the ranks of one group.
pub struct TcpRing {
    rank: usize,
    world_size: usize,
    timeout: Duration,
    next: TcpStream,
    prev: TcpStream,
    /// Set by the first failure: the ring's byte streams are out of step after
    /// one, so every later call fails fast with the original reason.
    broken: Option<String>,
}

/// How a received chunk lands in the local buffer.
#[derive(Clone, Copy)]
enum Landing {
    Overwrite,
    Reduce(ReduceOp),
}

impl TcpRing {
    /// Connects this rank into the ring, exchanging listening addresses through `store`.
    ///
    /// `bind_ip` is the address peers can reach this rank on. Needs `world_size >= 2`.
    pub fn connect(
        rank: usize,
        world_size: usize,
        store: &dyn Store,
        key_prefix: &str,
        bind_ip: IpAddr,
        timeout: Duration,
    ) -> Result<Self> {
        assert!(world_size >= 2, "a ring needs at least two ranks");
        let deadline = Instant::now() + timeout;
        let setup_err = |what: String| CommError::Peer {
            rank,
            peer: rank,
            op: "TCP transport setup".into(),
            detail: what,
        };
        let listener = TcpListener::bind(SocketAddr::new(bind_ip, 0))
            .map_err(|err| setup_err(format!("cannot listen on {bind_ip}: {err}")))?;
        let my_addr = listener
            .local_addr()
            .map_err(|err| setup_err(err.to_string()))?;
        store.set(
            &format!("{key_prefix}tcp/addr/{rank}"),
            my_addr.to_string().as_bytes(),
        )?;

        let next_rank = (rank + 1) % world_size;
        let prev_rank = (rank + world_size - 1) % world_size;
        let next_addr = store.get(&format!("{key_prefix}tcp/addr/{next_rank}"), timeout)?;
        let next_addr: SocketAddr = std::str::from_utf8(&next_addr)
            .ok()
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| setup_err(format!("rank {next_rank} published a bad address")))?;

        let next = connect_with_retry(next_addr, deadline).map_err(|err| CommError::Peer {
            rank,
            peer: next_rank,
            op: "connecting the TCP ring".into(),
            detail: format!("cannot connect to {next_addr}: {err}"),
        })?;
        let mut hello = Vec::with_capacity(16);
        hello.extend_from_slice(HANDSHAKE_MAGIC);
        hello.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        hello.extend_from_slice(&(rank as u32).to_le_bytes());
        hello.extend_from_slice(&(world_size as u32).to_le_bytes());
        (&next)
            .write_all(&hello)
            .map_err(|err| setup_err(format!("handshake with rank {next_rank}: {err}")))?;

        let prev = accept_from(&listener, prev_rank, world_size, deadline).map_err(|detail| {
            if detail.contains("timed out") {
                CommError::Timeout {
                    rank,
                    what: format!("rank {prev_rank} to connect to the TCP ring"),
                    after: timeout,
                }
            } else {
                CommError::Peer {
                    rank,
                    peer: prev_rank,
                    op: "accepting the TCP ring connection".into(),
                    detail,
                }
            }
        })?;

        for stream in [&next, &prev] {
            stream
                .set_nodelay(true)
                .and_then(|()| stream.set_read_timeout(Some(timeout)))
                .and_then(|()| stream.set_write_timeout(Some(timeout)))
                .map_err(|err| setup_err(err.to_string()))?;
        }
        Ok(Self {
            rank,
            world_size,
            timeout,
            next,
            prev,
            broken: None,
        })
    }

    fn next_rank(&self) -> usize {
        (self.rank + 1) % self.world_size
    }

    fn prev_rank(&self) -> usize {
        (self.rank + self.world_size - 1) % self.world_size
    }

    fn check_usable(&self, op: &str) -> Result<()> {
        match &self.broken {
            Some(reason) => Err(CommError::Peer {
                rank: self.rank,
                peer: self.rank,
                op: op.into(),
                detail: format!("the TCP ring is unusable after an earlier error: {reason}"),
            }),
            None => Ok(()),
        }
    }

    /// Runs `body`; on failure, marks the ring broken and closes both connections
    /// so the neighbours fail at once instead of waiting out their timeouts.
    fn guarded(&mut self, op: &str, body: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        self.check_usable(op)?;
        let result = body(self);
        if let Err(err) = &result {
            self.broken = Some(err.to_string());
            let _ = self.next.shutdown(Shutdown::Both);
            let _ = self.prev.shutdown(Shutdown::Both);
        }
        result
    }

    fn io_error(&self, err: io::Error, peer: usize, op: &str, direction: &str) -> CommError {
        if io_is_timeout(&err) {
            CommError::Timeout {
                rank: self.rank,
                what: format!("{direction} rank {peer} during {op}"),
                after: self.timeout,
            }
        } else {
            let detail = match err.kind() {
                io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::ConnectionAborted => format!(
                    "connection closed ({err}); rank {peer} exited, crashed or failed earlier"
                ),
                _ => err.to_string(),
            };
            CommError::Peer {
                rank: self.rank,
                peer,
                op: op.into(),
                detail,
            }
        }
    }

    /// One ring step: sends `data[send]` to the next rank while receiving the
    /// previous rank's chunk into `data[recv]`.
    fn step<T: Element>(
        &self,
        data: &mut [T],
        send: Range<usize>,
        recv: Range<usize>,
        landing: Landing,
        op: &str,
    ) -> Result<()> {
        let (outgoing, incoming) = split_disjoint(data, send, recv);
        let out_bytes: &[u8] = bytemuck::cast_slice(outgoing);
        if out_bytes.len() <= INLINE_SEND_BYTES {
            (&self.next)
                .write_all(out_bytes)
                .map_err(|err| self.io_error(err, self.next_rank(), op, "sending to"))?;
            return self.receive(incoming, landing, op);
        }
        std::thread::scope(|scope| {
            let writer = scope.spawn(|| (&self.next).write_all(out_bytes));
            let received = self.receive(incoming, landing, op);
            let sent = match writer.join() {
                Ok(sent) => {
                    sent.map_err(|err| self.io_error(err, self.next_rank(), op, "sending to"))
                }
                Err(_) => Err(CommError::Peer {
                    rank: self.rank,
                    peer: self.next_rank(),
                    op: op.into(),
                    detail: "the sending thread panicked".into(),
                }),
            };
            if received.is_err() {
                // Unblock a writer stuck on a peer that stopped reading.
                let _ = self.next.shutdown(Shutdown::Both);
            }
            received.and(sent)
        })
    }

    /// Receives `target.len()` elements from the previous rank.
    fn receive<T: Element>(&self, target: &mut [T], landing: Landing, op: &str) -> Result<()> {
        let peer = self.prev_rank();
        let read_err = |err| self.io_error(err, peer, op, "receiving from");
        match landing {
            Landing::Overwrite => {
                (&self.prev)
                    .read_exact(bytemuck::cast_slice_mut(target))
                    .map_err(read_err)?;
            }
            Landing::Reduce(reduce_op) => {
                let piece_len = (PIECE_BYTES / std::mem::size_of::<T>()).min(target.len());
                let mut scratch = vec![T::zeroed(); piece_len];
                for acc in target.chunks_mut(piece_len.max(1)) {
                    let incoming = &mut scratch[..acc.len()];
                    (&self.prev)
                        .read_exact(bytemuck::cast_slice_mut(incoming))
                        .map_err(read_err)?;
                    reduce_into(reduce_op, acc, incoming);
                }
            }
        }
        Ok(())
    }

    /// Reduce-scatter phase: afterwards `chunks(rank)` holds the reduced chunk.
    fn ring_reduce_scatter<T: Element>(
        &self,
        data: &mut [T],
        op: ReduceOp,
        chunks: &dyn Fn(usize) -> Range<usize>,
        name: &str,
    ) -> Result<()> {
        let n = self.world_size;
        for s in 0..n - 1 {
            let send = chunks((self.rank + 2 * n - s - 1) % n);
            let recv = chunks((self.rank + 2 * n - s - 2) % n);
            self.step(data, send, recv, Landing::Reduce(op), name)?;
        }
        Ok(())
    }

    /// All-gather phase: starting from `chunks(rank)`, fills every chunk.
    fn ring_all_gather<T: Element>(
        &self,
        data: &mut [T],
        chunks: &dyn Fn(usize) -> Range<usize>,
        name: &str,
    ) -> Result<()> {
        let n = self.world_size;
        for s in 0..n - 1 {
            let send = chunks((self.rank + n - s) % n);
            let recv = chunks((self.rank + 2 * n - s - 1) % n);
            self.step(data, send, recv, Landing::Overwrite, name)?;
        }
        Ok(())
    }

    fn all_reduce_typed<T: Element>(&mut self, data: &mut [T], op: ReduceOp) -> Result<()> {
        let n = self.world_size;
        let len = data.len();
        self.guarded("all_reduce", |ring| {
            let chunks = |i| chunk_range(len, n, i);
            ring.ring_reduce_scatter(data, op, &chunks, "all_reduce")?;
            finish_reduce(op, &mut data[chunks(ring.rank)], n);
            ring.ring_all_gather(data, &chunks, "all_reduce")
        })
    }

    fn reduce_scatter_typed<T: Element>(&mut self, data: &mut [T], op: ReduceOp) -> Result<()> {
        let n = self.world_size;
        let len = data.len();
        self.guarded("reduce_scatter", |ring| {
            let chunks = |i| chunk_range(len, n, i);
            ring.ring_reduce_scatter(data, op, &chunks, "reduce_scatter")?;
            finish_reduce(op, &mut data[chunks(ring.rank)], n);
            Ok(())
        })
    }

    fn all_gather_typed<T: Element>(&mut self, data: &mut [T]) -> Result<()> {
        let n = self.world_size;
        let len = data.len();
        self.guarded("all_gather", |ring| {
            ring.ring_all_gather(data, &|i| chunk_range(len, n, i), "all_gather")
        })
    }

    fn broadcast_typed<T: Element>(&mut self, data: &mut [T], root: usize) -> Result<()> {
        self.guarded("broadcast", |ring| {
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(data);
            let forward = ring.next_rank() != root;
            if ring.rank == root {
                return (&ring.next).write_all(bytes).map_err(|err| {
                    ring.io_error(err, ring.next_rank(), "broadcast", "sending to")
                });
            }
            // A chain from the root around the ring: receive a piece, pass it on.
            for piece in bytes.chunks_mut(PIECE_BYTES) {
                (&ring.prev).read_exact(piece).map_err(|err| {
                    ring.io_error(err, ring.prev_rank(), "broadcast", "receiving from")
                })?;
                if forward {
                    (&ring.next).write_all(piece).map_err(|err| {
                        ring.io_error(err, ring.next_rank(), "broadcast", "sending to")
                    })?;
                }
            }
            Ok(())
        })
    }
}

typed_transport!(TcpRing, "tcp");

/// Borrows two disjoint ranges of one slice, one shared and one mutable.
fn split_disjoint<T>(
    data: &mut [T],
    shared: Range<usize>,
    unique: Range<usize>,
) -> (&[T], &mut [T]) {
    if shared.start >= unique.end {
        let (head, tail) = data.split_at_mut(shared.start);
        (&tail[..shared.len()], &mut head[unique])
    } else {
        assert!(unique.start >= shared.end, "ring chunks overlap");
        let (head, tail) = data.split_at_mut(unique.start);
        (&head[shared], &mut tail[..unique.len()])
    }
}

fn connect_with_retry(addr: SocketAddr, deadline: Instant) -> io::Result<TcpStream> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(
            &addr,
            left.clamp(Duration::from_millis(1), Duration::from_secs(2)),
        ) {
            Ok(stream) => return Ok(stream),
            Err(err) if Instant::now() >= deadline => return Err(err),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// Accepts the previous rank's connection and checks its handshake.
fn accept_from(
    listener: &TcpListener,
    expected_rank: usize,
    world_size: usize,
    deadline: Instant,
) -> std::result::Result<TcpStream, String> {
    listener
        .set_nonblocking(true)
        .map_err(|err| err.to_string())?;
    loop {
        match listener.accept() {
            Ok((stream, from)) => {
                stream
                    .set_nonblocking(false)
                    .and_then(|()| {
                        let left = deadline.saturating_duration_since(Instant::now());
                        stream.set_read_timeout(Some(left.max(Duration::from_millis(100))))
                    })
                    .map_err(|err| err.to_string())?;
                let mut hello = [0u8; 16];
                (&stream)
                    .read_exact(&mut hello)
                    .map_err(|err| format!("handshake from {from}: {err}"))?;
                let word = |i: usize| u32::from_le_bytes(hello[i..i + 4].try_into().unwrap());
                if &hello[..4] != HANDSHAKE_MAGIC || word(4) != PROTOCOL_VERSION {
                    return Err(format!(
                        "{from} is not a burn-ddp rank of this version (bad handshake)"
                    ));
                }
                let (rank, world) = (word(8) as usize, word(12) as usize);
                if world != world_size {
                    return Err(format!(
                        "rank {rank} believes WORLD_SIZE is {world}, this rank {world_size}; \
                         start every rank with the same WORLD_SIZE"
                    ));
                }
                if rank != expected_rank {
                    return Err(format!(
                        "expected rank {expected_rank} to connect, got rank {rank}; \
                         two processes may share a RANK"
                    ));
                }
                return Ok(stream);
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err("timed out".into());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(err) => return Err(err.to_string()),
        }
    }
}
