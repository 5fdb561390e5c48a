//! Ring collectives over TCP.
//!
//! Each rank keeps two connections: one it writes to (the next rank) and one it
//! reads from (the previous rank). All-reduce is reduce-scatter followed by
//! all-gather around the ring, so every rank sends and receives about twice the
//! buffer size whatever the world size, and large chunks stream in pieces so the
//! reduction overlaps the transfer.

use super::encoding::{Landing, Plain, Scratch, Sixteen, WireEncoding, PIECE_BYTES};
use super::{chunk_range, Rendezvous, WireCompression};
use crate::element::{finish_reduce, DType, Element, ReduceOp};
use crate::error::{io_is_timeout, CommError, Result};
use crate::job::MAX_TOKEN_BYTES;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::time::{Duration, Instant};

/// Sends at or below this size are written before reading instead of from a
/// helper thread: the kernel's socket buffers hold them without the peer reading.
const INLINE_SEND_BYTES: usize = 32 << 10;

/// First bytes of the handshake, so a stray connection is recognised.
const HANDSHAKE_MAGIC: &[u8; 4] = b"BDDP";
const PROTOCOL_VERSION: u32 = 2;

/// A ring of TCP connections between the ranks of one group.
pub struct TcpRing {
    /// This rank's index in the ring (its group rank unless a sub-group's).
    rank: usize,
    world_size: usize,
    /// Group rank of each index, for messages.
    members: Vec<usize>,
    timeout: Duration,
    next: TcpStream,
    prev: TcpStream,
    /// Set by the first failure: the ring's byte streams are out of step after
    /// one, so every later call fails fast with the original reason.
    broken: Option<String>,
    /// Piece buffers for sending and receiving, kept across collectives.
    scratch: [Scratch; 2],
}

impl TcpRing {
    /// Connects this rank into the ring, exchanging listening addresses through
    /// the rendezvous store.
    ///
    /// `bind_ip` is the address peers can reach this rank on. Needs `world_size >= 2`.
    /// Connections that do not present a valid handshake (a port scan, a process
    /// of another job) are dropped and the wait for the real neighbour goes on.
    pub fn connect(rdzv: Rendezvous<'_>, bind_ip: IpAddr) -> Result<Self> {
        let Rendezvous {
            rank,
            world_size,
            store,
            key_prefix,
            timeout,
            ..
        } = rdzv;
        assert!(world_size >= 2, "a ring needs at least two ranks");
        let members = rdzv.member_ranks();
        let name = |index: usize| members[index];
        let deadline = Instant::now() + timeout;
        let setup_err = |what: String| CommError::Peer {
            rank: name(rank),
            peer: name(rank),
            op: "TCP transport setup".into(),
            detail: what,
            source: None,
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
            .ok_or_else(|| {
                setup_err(format!("rank {} published a bad address", name(next_rank)))
            })?;

        let next = connect_with_retry(next_addr, deadline).map_err(|err| CommError::Peer {
            rank: name(rank),
            peer: name(next_rank),
            op: "connecting the TCP ring".into(),
            detail: format!("cannot connect to {next_addr}: {err}"),
            source: None,
        })?;
        (&next)
            .write_all(&Handshake::encode(&rdzv))
            .map_err(|err| setup_err(format!("handshake with rank {}: {err}", name(next_rank))))?;

        let prev =
            accept_from(&listener, &rdzv, prev_rank, deadline).map_err(
                |failure| match failure {
                    AcceptFailure::TimedOut => CommError::Timeout {
                        rank: Some(name(rank)),
                        peer: Some(name(prev_rank)),
                        what: format!("rank {} to connect to the TCP ring", name(prev_rank)),
                        after: timeout,
                    },
                    AcceptFailure::Failed(detail) => CommError::peer(
                        name(rank),
                        name(prev_rank),
                        "accepting the TCP ring connection",
                        detail,
                    ),
                },
            )?;

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
            members,
            timeout,
            next,
            prev,
            broken: None,
            scratch: Default::default(),
        })
    }

    fn next_rank(&self) -> usize {
        (self.rank + 1) % self.world_size
    }

    fn prev_rank(&self) -> usize {
        (self.rank + self.world_size - 1) % self.world_size
    }

    /// The group rank of ring index `index`.
    fn name(&self, index: usize) -> usize {
        self.members[index]
    }

    fn check_usable(&self, op: &str) -> Result<()> {
        match &self.broken {
            Some(reason) => Err(CommError::Peer {
                rank: self.name(self.rank),
                peer: self.name(self.rank),
                op: op.into(),
                detail: format!("the TCP ring is unusable after an earlier error: {reason}"),
                source: None,
            }),
            None => Ok(()),
        }
    }

    /// Runs `body` with the ring's piece buffers; on failure, marks the ring
    /// broken and closes both connections so the neighbours fail at once
    /// instead of waiting out their timeouts.
    fn guarded(
        &mut self,
        op: &str,
        body: impl FnOnce(&Self, &mut [Scratch; 2]) -> Result<()>,
    ) -> Result<()> {
        self.check_usable(op)?;
        let mut scratch = std::mem::take(&mut self.scratch);
        let result = body(self, &mut scratch);
        self.scratch = scratch;
        if let Err(err) = &result {
            self.broken = Some(err.to_string());
            self.break_ring();
        }
        result
    }

    /// Closes both connections (the neighbours see them close) and keeps the
    /// ring unusable.
    fn break_ring(&mut self) {
        self.broken
            .get_or_insert_with(|| "it was aborted after another level failed".into());
        let _ = self.next.shutdown(Shutdown::Both);
        let _ = self.prev.shutdown(Shutdown::Both);
    }

    fn io_error(&self, err: io::Error, peer: usize, op: &str, direction: &str) -> CommError {
        let (rank, peer) = (self.name(self.rank), self.name(peer));
        if io_is_timeout(&err) {
            CommError::Timeout {
                rank: Some(rank),
                peer: Some(peer),
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
            CommError::peer(rank, peer, op, detail).caused_by(err)
        }
    }

    /// One ring step: sends `data[send]` to the next rank while receiving the
    /// previous rank's chunk into `data[recv]`, both in `encoding`.
    #[allow(clippy::too_many_arguments)]
    fn step<T: Element, E: WireEncoding<T>>(
        &self,
        scratch: &mut [Scratch; 2],
        data: &mut [T],
        send: Range<usize>,
        recv: Range<usize>,
        landing: Landing,
        encoding: &E,
        op: &str,
    ) -> Result<()> {
        let (outgoing, incoming) = split_disjoint(data, send, recv);
        let [send_scratch, recv_scratch] = scratch;
        // One bound for the whole step: a peer that takes a byte now and then
        // must not stretch it (per-call socket timeouts would).
        let deadline = Instant::now() + self.timeout;
        let inline = encoding.wire_bytes(outgoing.len()) <= INLINE_SEND_BYTES;
        let mut send_all = move || {
            encoding
                .send(outgoing, send_scratch, &mut |bytes| {
                    write_all_by(&self.next, bytes, deadline)
                })
                .map_err(|err| self.io_error(err, self.next_rank(), op, "sending to"))
        };
        let mut receive_all = || {
            encoding
                .receive(incoming, landing, recv_scratch, &mut |buf| {
                    read_exact_by(&self.prev, buf, deadline)
                })
                .map_err(|err| self.io_error(err, self.prev_rank(), op, "receiving from"))
        };
        if inline {
            send_all()?;
            return receive_all();
        }
        std::thread::scope(|scope| {
            let writer = scope.spawn(send_all);
            let received = receive_all();
            if received.is_err() {
                // Unblock a writer stuck on a peer that stopped reading, before
                // waiting for it (it would wait out its own timeout).
                let _ = self.next.shutdown(Shutdown::Both);
            }
            let sent = writer.join().unwrap_or_else(|_| {
                Err(CommError::peer(
                    self.name(self.rank),
                    self.name(self.next_rank()),
                    op,
                    "the sending thread panicked",
                ))
            });
            received.and(sent)
        })
    }

    /// Reduce-scatter phase: afterwards `chunks(rank)` holds the reduced chunk.
    fn ring_reduce_scatter<T: Element, E: WireEncoding<T>>(
        &self,
        scratch: &mut [Scratch; 2],
        data: &mut [T],
        op: ReduceOp,
        encoding: &E,
        name: &str,
    ) -> Result<()> {
        let (n, len) = (self.world_size, data.len());
        let chunks = |i| chunk_range(len, n, i);
        for s in 0..n - 1 {
            let send = chunks((self.rank + 2 * n - s - 1) % n);
            let recv = chunks((self.rank + 2 * n - s - 2) % n);
            self.step(
                scratch,
                data,
                send,
                recv,
                Landing::Reduce(op),
                encoding,
                name,
            )?;
        }
        Ok(())
    }

    /// All-gather phase: starting from `chunks(rank)`, fills every chunk.
    fn ring_all_gather<T: Element, E: WireEncoding<T>>(
        &self,
        scratch: &mut [Scratch; 2],
        data: &mut [T],
        encoding: &E,
        name: &str,
    ) -> Result<()> {
        let (n, len) = (self.world_size, data.len());
        let chunks = |i| chunk_range(len, n, i);
        for s in 0..n - 1 {
            let send = chunks((self.rank + n - s) % n);
            let recv = chunks((self.rank + 2 * n - s - 1) % n);
            self.step(
                scratch,
                data,
                send,
                recv,
                Landing::Overwrite,
                encoding,
                name,
            )?;
        }
        Ok(())
    }

    /// This rank's chunk of the ring's partition of `len` elements.
    fn own_chunk(&self, len: usize) -> Range<usize> {
        chunk_range(len, self.world_size, self.rank)
    }

    fn all_reduce_typed<T: Element>(&mut self, data: &mut [T], op: ReduceOp) -> Result<()> {
        self.all_reduce_with(data, op, WireCompression::None)
    }

    /// An all-reduce whose f32 sums and means travel as `compression` says.
    fn all_reduce_with<T: Element>(
        &mut self,
        data: &mut [T],
        op: ReduceOp,
        compression: WireCompression,
    ) -> Result<()> {
        let n = self.world_size;
        let compressible = matches!(op, ReduceOp::Sum | ReduceOp::Mean) && T::DTYPE == DType::F32;
        if compressible && compression != WireCompression::None {
            let codec = Sixteen(compression);
            let data: &mut [f32] = bytemuck::cast_slice_mut(data);
            return self.guarded("all_reduce", |ring, scratch| {
                ring.ring_reduce_scatter(scratch, data, op, &codec, "all_reduce")?;
                // Round the chunk this rank finished as the others receive it,
                // so every rank ends with the same bits.
                let own = ring.own_chunk(data.len());
                for value in &mut data[own] {
                    *value = codec.0.decode(codec.0.encode(*value));
                }
                ring.ring_all_gather(scratch, data, &codec, "all_reduce")?;
                finish_reduce(op, data, n);
                Ok(())
            });
        }
        self.guarded("all_reduce", |ring, scratch| {
            ring.ring_reduce_scatter(scratch, data, op, &Plain, "all_reduce")?;
            let own = ring.own_chunk(data.len());
            finish_reduce(op, &mut data[own], n);
            ring.ring_all_gather(scratch, data, &Plain, "all_reduce")
        })
    }

    fn reduce_scatter_typed<T: Element>(&mut self, data: &mut [T], op: ReduceOp) -> Result<()> {
        let n = self.world_size;
        self.guarded("reduce_scatter", |ring, scratch| {
            ring.ring_reduce_scatter(scratch, data, op, &Plain, "reduce_scatter")?;
            let own = ring.own_chunk(data.len());
            finish_reduce(op, &mut data[own], n);
            Ok(())
        })
    }

    fn all_gather_typed<T: Element>(&mut self, data: &mut [T]) -> Result<()> {
        self.guarded("all_gather", |ring, scratch| {
            ring.ring_all_gather(scratch, data, &Plain, "all_gather")
        })
    }

    fn broadcast_typed<T: Element>(&mut self, data: &mut [T], root: usize) -> Result<()> {
        self.guarded("broadcast", |ring, _scratch| {
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(data);
            let forward = ring.next_rank() != root;
            let deadline = Instant::now() + ring.timeout;
            if ring.rank == root {
                return write_all_by(&ring.next, bytes, deadline).map_err(|err| {
                    ring.io_error(err, ring.next_rank(), "broadcast", "sending to")
                });
            }
            // A chain from the root around the ring: receive a piece, pass it on.
            for piece in bytes.chunks_mut(PIECE_BYTES) {
                read_exact_by(&ring.prev, piece, deadline).map_err(|err| {
                    ring.io_error(err, ring.prev_rank(), "broadcast", "receiving from")
                })?;
                if forward {
                    write_all_by(&ring.next, piece, deadline).map_err(|err| {
                        ring.io_error(err, ring.next_rank(), "broadcast", "sending to")
                    })?;
                }
            }
            Ok(())
        })
    }
}

typed_transport!(TcpRing, "tcp", break_ring, all_reduce_with);

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

/// The time left before `deadline` as a socket timeout, or a timeout error.
fn time_left(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        Err(io::ErrorKind::TimedOut.into())
    } else {
        Ok(left)
    }
}

/// How stale a socket timeout may get before it is set again to the time
/// left: the deadline is overshot by at most this, and the many small reads of
/// a large transfer do not each pay for a system call.
const REARM: Duration = Duration::from_millis(100);

/// Keeps a socket's timeout near the time left before a deadline.
struct Rearm {
    deadline: Instant,
    armed_at: Option<Instant>,
}

impl Rearm {
    fn new(deadline: Instant) -> Self {
        Self {
            deadline,
            armed_at: None,
        }
    }

    /// Calls `set` with the time left when the last one is stale.
    fn arm(&mut self, set: impl FnOnce(Option<Duration>) -> io::Result<()>) -> io::Result<()> {
        let now = Instant::now();
        if self.armed_at.is_none_or(|at| now >= at + REARM) {
            set(Some(time_left(self.deadline)?))?;
            self.armed_at = Some(now);
        } else if now >= self.deadline {
            return Err(io::ErrorKind::TimedOut.into());
        }
        Ok(())
    }
}

/// `write_all`, finished by `deadline` or failed with a timeout.
fn write_all_by(stream: &TcpStream, mut bytes: &[u8], deadline: Instant) -> io::Result<()> {
    let mut timer = Rearm::new(deadline);
    while !bytes.is_empty() {
        timer.arm(|t| stream.set_write_timeout(t))?;
        match (&*stream).write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// `read_exact`, finished by `deadline` or failed with a timeout.
fn read_exact_by(stream: &TcpStream, mut buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    let mut timer = Rearm::new(deadline);
    while !buf.is_empty() {
        timer.arm(|t| stream.set_read_timeout(t))?;
        match (&*stream).read(buf) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf = &mut buf[n..],
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(())
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

/// What a rank sends first on its connection to the next rank.
pub(crate) struct Handshake;

impl Handshake {
    /// Magic, version, rank, world size, token length: five little-endian words.
    const HEADER: usize = 20;

    pub(crate) fn encode(rdzv: &Rendezvous<'_>) -> Vec<u8> {
        let token = rdzv.token_bytes();
        let mut hello = Vec::with_capacity(Self::HEADER + token.len());
        hello.extend_from_slice(HANDSHAKE_MAGIC);
        for word in [
            PROTOCOL_VERSION,
            rdzv.rank as u32,
            rdzv.world_size as u32,
            token.len() as u32,
        ] {
            hello.extend_from_slice(&word.to_le_bytes());
        }
        hello.extend_from_slice(token);
        hello
    }

    /// `Ok(None)` while more bytes are needed; `Err` for a connection that is
    /// not a rank of this job (dropped); `Ok(Some((rank, world)))` once whole.
    pub(crate) fn decode(
        bytes: &[u8],
        rdzv: &Rendezvous<'_>,
    ) -> std::result::Result<Option<(usize, usize)>, String> {
        let word = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
        let magic = bytes.len().min(4);
        if bytes[..magic] != HANDSHAKE_MAGIC[..magic]
            || (bytes.len() >= 8 && word(4) != PROTOCOL_VERSION)
        {
            return Err("not a burn-ddp rank of this version".into());
        }
        if bytes.len() < Self::HEADER {
            return Ok(None);
        }
        let token_len = word(16) as usize;
        if token_len > MAX_TOKEN_BYTES {
            return Err(format!("a token of {token_len} bytes"));
        }
        if bytes.len() < Self::HEADER + token_len {
            return Ok(None);
        }
        if bytes.len() > Self::HEADER + token_len || !rdzv.admits(&bytes[Self::HEADER..]) {
            return Err("without this job's token".into());
        }
        Ok(Some((word(8) as usize, word(12) as usize)))
    }
}

/// How long an accepted connection may take to send its handshake.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);

/// Why the previous rank's connection was not accepted.
enum AcceptFailure {
    /// It did not come before the deadline.
    TimedOut,
    /// It came with a conflicting view of the job, or the socket failed.
    Failed(String),
}

/// A connection accepted while waiting for the previous rank.
struct Pending {
    stream: TcpStream,
    from: SocketAddr,
    received: Vec<u8>,
    since: Instant,
}

/// Accepts the previous rank's connection, checking handshakes as they arrive
/// (all pending ones at once, so a silent connection delays nobody). Strangers
/// are dropped, and logged once; a genuine rank with a conflicting view of the
/// job (world size, rank) ends the set-up with the reason.
fn accept_from(
    listener: &TcpListener,
    rdzv: &Rendezvous<'_>,
    expected_rank: usize,
    deadline: Instant,
) -> std::result::Result<TcpStream, AcceptFailure> {
    listener
        .set_nonblocking(true)
        .map_err(|err| AcceptFailure::Failed(err.to_string()))?;
    let mut pending: Vec<Pending> = Vec::new();
    let mut logged_stranger = false;
    loop {
        let mut progressed = false;
        match listener.accept() {
            Ok((stream, from)) => {
                stream
                    .set_nonblocking(true)
                    .map_err(|err| AcceptFailure::Failed(err.to_string()))?;
                pending.push(Pending {
                    stream,
                    from,
                    received: Vec::new(),
                    since: Instant::now(),
                });
                progressed = true;
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
            Err(err) => return Err(AcceptFailure::Failed(err.to_string())),
        }
        let mut index = 0;
        while index < pending.len() {
            let conn = &mut pending[index];
            let verdict = read_handshake(conn, rdzv);
            match verdict {
                Ok(None) if conn.since.elapsed() < HANDSHAKE_DEADLINE => {
                    index += 1;
                    continue;
                }
                Ok(None) | Err(_) => {
                    let why = verdict
                        .err()
                        .unwrap_or_else(|| "no handshake in time".into());
                    if !logged_stranger {
                        logged_stranger = true;
                        log::warn!(
                            "rank {}: dropped a connection to the TCP ring from {} ({why}); \
                             further ones are not logged",
                            rdzv.rank,
                            conn.from
                        );
                    }
                    pending.swap_remove(index);
                    progressed = true;
                }
                Ok(Some((rank, world))) => {
                    let members = rdzv.member_ranks();
                    let name = |index: usize| members.get(index).copied().unwrap_or(index);
                    if world != rdzv.world_size {
                        return Err(AcceptFailure::Failed(format!(
                            "rank {} believes WORLD_SIZE is {world}, this rank {}; \
                             start every rank with the same WORLD_SIZE",
                            name(rank),
                            rdzv.world_size
                        )));
                    }
                    if rank != expected_rank {
                        return Err(AcceptFailure::Failed(format!(
                            "expected rank {} to connect, got rank {}; two processes may \
                             share a RANK",
                            name(expected_rank),
                            name(rank)
                        )));
                    }
                    let conn = pending.swap_remove(index);
                    conn.stream
                        .set_nonblocking(false)
                        .map_err(|err| AcceptFailure::Failed(err.to_string()))?;
                    return Ok(conn.stream);
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(AcceptFailure::TimedOut);
        }
        if !progressed {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Reads what has arrived of a pending handshake without blocking.
fn read_handshake(
    conn: &mut Pending,
    rdzv: &Rendezvous<'_>,
) -> std::result::Result<Option<(usize, usize)>, String> {
    let mut buf = [0u8; Handshake::HEADER + MAX_TOKEN_BYTES];
    loop {
        // Never read past the handshake: what follows is the ring's data.
        let wanted = match Handshake::decode(&conn.received, rdzv)? {
            Some(found) => return Ok(Some(found)),
            None if conn.received.len() < Handshake::HEADER => {
                Handshake::HEADER - conn.received.len()
            }
            None => {
                Handshake::HEADER
                    + u32::from_le_bytes(conn.received[16..20].try_into().unwrap()) as usize
                    - conn.received.len()
            }
        };
        match (&conn.stream).read(&mut buf[..wanted]) {
            Ok(0) => return Err("closed before its handshake".into()),
            Ok(n) => conn.received.extend_from_slice(&buf[..n]),
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => return Ok(None),
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::element::BufferMut;
    use crate::job::JobToken;
    use crate::store::{MemoryStore, Store};
    use crate::transport::Transport;
    use std::sync::Arc;

    fn rdzv<'a>(
        rank: usize,
        store: &'a MemoryStore,
        token: Option<&'a JobToken>,
    ) -> Rendezvous<'a> {
        Rendezvous::for_test(rank, 2, store, token, Duration::from_secs(10))
    }

    /// Two ranks on threads; `meddle` runs against rank 1's listening address
    /// before rank 0 connects to it (rank 0 starts once `meddle` returns).
    fn ring_pair(
        token: Option<JobToken>,
        meddle: impl FnOnce(SocketAddr),
    ) -> (Result<TcpRing>, Result<TcpRing>) {
        let store = Arc::new(MemoryStore::new());
        let one = {
            let (store, token) = (Arc::clone(&store), token.clone());
            std::thread::spawn(move || {
                TcpRing::connect(rdzv(1, &store, token.as_ref()), [127, 0, 0, 1].into())
            })
        };
        let addr = store.get("t/tcp/addr/1", Duration::from_secs(5)).unwrap();
        meddle(String::from_utf8(addr).unwrap().parse().unwrap());
        let zero = TcpRing::connect(rdzv(0, &store, token.as_ref()), [127, 0, 0, 1].into());
        (zero, one.join().unwrap())
    }

    fn sums_work(zero: TcpRing, one: TcpRing) {
        let other = std::thread::spawn(move || {
            let mut one = one;
            let mut x = [2.0f32, 3.0];
            one.all_reduce(BufferMut::F32(&mut x), ReduceOp::Sum)
                .unwrap();
            x
        });
        let mut zero = zero;
        let mut x = [1.0f32, 1.0];
        zero.all_reduce(BufferMut::F32(&mut x), ReduceOp::Sum)
            .unwrap();
        assert_eq!(x, [3.0, 4.0]);
        assert_eq!(other.join().unwrap(), [3.0, 4.0]);
    }

    #[test]
    fn garbage_silent_and_half_handshakes_do_not_stop_the_ring_forming() {
        let token = JobToken::new("ring-token").unwrap();
        let mut strays = Vec::new();
        let started = Instant::now();
        let (zero, one) = ring_pair(Some(token), |addr| {
            let connect = || TcpStream::connect(addr).unwrap();
            // Silent, garbage, a closed probe, half a handshake, a wrong token.
            strays.push(connect());
            let mut garbage = connect();
            garbage.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
            strays.push(garbage);
            drop(connect());
            let mut half = connect();
            half.write_all(&HANDSHAKE_MAGIC[..]).unwrap();
            strays.push(half);
            let wrong = JobToken::new("other-job").unwrap();
            let store = MemoryStore::new();
            let mut impostor = connect();
            impostor
                .write_all(&Handshake::encode(&rdzv(0, &store, Some(&wrong))))
                .unwrap();
            strays.push(impostor);
        });
        // No stray held the real neighbour back for its handshake deadline.
        assert!(
            started.elapsed() < HANDSHAKE_DEADLINE,
            "{:?}",
            started.elapsed()
        );
        sums_work(zero.unwrap(), one.unwrap());
    }

    #[test]
    fn a_rank_with_another_world_size_is_named() {
        let (zero, one) = ring_pair(None, |addr| {
            let store = MemoryStore::new();
            let mut liar = rdzv(0, &store, None);
            liar.world_size = 3;
            let mut conn = TcpStream::connect(addr).unwrap();
            conn.write_all(&Handshake::encode(&liar)).unwrap();
            std::mem::forget(conn);
        });
        let err = one.err().unwrap().to_string();
        assert!(
            err.contains("rank 1") && err.contains("WORLD_SIZE is 3"),
            "{err}"
        );
        drop(zero);
    }

    #[test]
    fn compressed_sums_are_close_and_the_same_on_every_rank() {
        // 1001 elements are written inline; 300,001 (several pieces of
        // 256 KiB each way, the last one short) from a helper thread.
        for (codec, len) in [
            (WireCompression::Bf16, 1001),
            (WireCompression::F16, 1001),
            (WireCompression::Bf16, 300_001),
        ] {
            let (zero, one) = ring_pair(None, |_| {});
            let run = |mut ring: TcpRing, rank: usize| {
                std::thread::spawn(move || {
                    let mut x: Vec<f32> = (0..len)
                        .map(|i| 0.001 * i as f32 + rank as f32 * 0.37)
                        .collect();
                    ring.all_reduce_compressed(BufferMut::F32(&mut x), ReduceOp::Mean, codec)
                        .unwrap();
                    // Integers and max never travel compressed.
                    let mut ints = [1i64 << 40, 7];
                    ring.all_reduce_compressed(BufferMut::I64(&mut ints), ReduceOp::Sum, codec)
                        .unwrap();
                    let mut top = [0.1f32 + rank as f32];
                    ring.all_reduce_compressed(BufferMut::F32(&mut top), ReduceOp::Max, codec)
                        .unwrap();
                    (x, ints, top)
                })
            };
            let a = run(zero.unwrap(), 0);
            let b = run(one.unwrap(), 1);
            let ((xa, ia, ta), (xb, ib, tb)) = (a.join().unwrap(), b.join().unwrap());
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&xa), bits(&xb), "{codec:?}: ranks differ");
            for (i, got) in xa.iter().enumerate() {
                let exact = 0.001 * i as f32 + 0.185;
                assert!(
                    (got - exact).abs() <= exact.abs() / 128.0 + 1e-6,
                    "{codec:?} [{i}]: {got} vs {exact}"
                );
            }
            // And they did travel in 16 bits: most differ from the f32 means.
            let rounded = xa
                .iter()
                .enumerate()
                .filter(|(i, got)| {
                    let sum = 0.001 * *i as f32 + (0.001 * *i as f32 + 0.37);
                    **got != sum / 2.0
                })
                .count();
            assert!(
                rounded > len / 2,
                "{codec:?}: only {rounded} of {len} were rounded"
            );
            assert_eq!((ia, ib), ([2i64 << 40, 14], [2i64 << 40, 14]));
            assert_eq!((ta, tb), ([1.1f32], [1.1f32]));
        }
    }
}
