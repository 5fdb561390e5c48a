//! The store's server: one thread accepting, one thread per connected rank.
//!
//! It runs inside the launcher (or rank 0), whose death ends the job, so no
//! client may pin it: a connection's socket is released when it closes, a frame
//! must arrive whole within [`FRAME_DEADLINE`], a store with a job token serves
//! nothing before a matching hello (due within [`HELLO_DEADLINE`]), and the
//! number of connections and the bytes stored are capped.

use super::protocol::{self, ADD, CHECK, GET, HELLO, SET, WAIT};
use crate::error::{CommError, Result};
use crate::frame::{read_frame, write_frame, FieldReader, FieldWriter};
use crate::job::JobToken;
use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Connections served at once; more are closed on arrival. Each rank holds one.
pub const MAX_CONNECTIONS: usize = 8192;
/// Bytes of keys and values the store holds at most (it carries addresses and
/// ids, a few hundred bytes per rank).
pub const MAX_STORED_BYTES: usize = 64 << 20;
/// Time a frame may take to arrive once its first byte has.
pub const FRAME_DEADLINE: Duration = Duration::from_secs(10);
/// Time a new connection has to present the job token, when there is one.
pub const HELLO_DEADLINE: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Values {
    map: HashMap<String, Vec<u8>>,
    bytes: usize,
}

impl Values {
    /// Inserts unless the store would grow past [`MAX_STORED_BYTES`].
    fn insert(&mut self, key: String, value: Vec<u8>) -> io::Result<()> {
        let old = self.map.get(&key).map_or(0, |v| key.len() + v.len());
        let new_total = self.bytes - old + key.len() + value.len();
        if new_total > MAX_STORED_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!(
                    "the store is full ({} of {MAX_STORED_BYTES} bytes); {} more bytes \
                     for key {key:?} refused",
                    self.bytes,
                    key.len() + value.len()
                ),
            ));
        }
        self.bytes = new_total;
        self.map.insert(key, value);
        Ok(())
    }
}

#[derive(Default)]
struct State {
    values: Mutex<Values>,
    changed: Condvar,
    stopping: AtomicBool,
    /// Open connections by id, so `drop` can close them; each removes itself.
    connections: Mutex<HashMap<u64, TcpStream>>,
    next_id: AtomicU64,
    token: Option<JobToken>,
    /// Each kind of refusal is logged once, so a scan cannot flood the log.
    logged_refusal: AtomicBool,
    logged_full: AtomicBool,
    logged_accept_error: AtomicBool,
}

impl State {
    fn log_once(&self, flag: &AtomicBool, message: impl FnOnce() -> String) {
        if !flag.swap(true, Ordering::Relaxed) {
            log::warn!(
                "rendezvous store: {}; further ones are not logged",
                message()
            );
        }
    }
}

/// A running store; stops (and disconnects every client) when dropped.
pub struct StoreServer {
    addr: SocketAddr,
    state: Arc<State>,
    acceptor: Option<JoinHandle<()>>,
}

impl StoreServer {
    /// Binds `addr` and serves any client that reaches it. Port 0 picks a free
    /// port (see [`Self::addr`]).
    pub fn bind(addr: SocketAddr) -> Result<Self> {
        Self::start(addr, None)
    }

    /// Binds `addr` and serves only clients that present `token` first (any
    /// client when `None`).
    pub fn bind_with_token(addr: SocketAddr, token: Option<JobToken>) -> Result<Self> {
        Self::start(addr, token)
    }

    /// Serves the job at `host:port` (its MASTER_ADDR), listening only on the
    /// interface that name resolves to: loopback for a single machine, the
    /// master's address otherwise. When the name is not an address of this
    /// machine (NAT, containers), falls back to every interface, with a warning.
    pub fn bind_master(host: &str, port: u16, token: Option<JobToken>) -> Result<Self> {
        let resolved: Vec<SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
            .map_err(|err| CommError::Store {
                rank: None,
                message: format!(
                    "cannot resolve the master address {host:?} ({err}); give a host name \
                     or address of this machine"
                ),
            })?
            .collect();
        let mut last_error = None;
        for addr in &resolved {
            match Self::start(*addr, token.clone()) {
                Ok(server) => return Ok(server),
                Err(err) => last_error = Some(err),
            }
        }
        let not_local = |err: &CommError| err.to_string().contains("Cannot assign requested");
        match (resolved.first(), last_error) {
            (Some(first), Some(err)) if not_local(&err) && !first.ip().is_loopback() => {
                let any: std::net::IpAddr = if first.is_ipv4() {
                    std::net::Ipv4Addr::UNSPECIFIED.into()
                } else {
                    std::net::Ipv6Addr::UNSPECIFIED.into()
                };
                log::warn!(
                    "rendezvous store: {host} ({first}) is not an address of this machine; \
                     listening on every interface instead{}",
                    if token.is_none() {
                        ", and without a job token anything that reaches the port is served"
                    } else {
                        ""
                    }
                );
                Self::start(SocketAddr::new(any, port), token)
            }
            (_, Some(err)) => Err(err),
            (None, None) => Err(CommError::Store {
                rank: None,
                message: format!("the master address {host:?} resolves to no address"),
            }),
            (Some(_), None) => unreachable!("every resolved address was tried"),
        }
    }

    fn start(addr: SocketAddr, token: Option<JobToken>) -> Result<Self> {
        let listener = TcpListener::bind(addr).map_err(|err| {
            let fix = if err.kind() == io::ErrorKind::AddrInUse {
                "another job (or a stale process) holds that port: set MASTER_PORT to a free \
                 port, or let burn-ddp-run --standalone pick one"
            } else {
                "check MASTER_ADDR names an address of this machine"
            };
            CommError::Store {
                rank: None,
                message: format!("cannot listen on {addr}: {err}; {fix}"),
            }
        })?;
        let addr = listener.local_addr().map_err(|err| CommError::Store {
            rank: None,
            message: format!("cannot read the listening address: {err}"),
        })?;
        let state = Arc::new(State {
            token,
            ..State::default()
        });
        let acceptor = {
            let state = Arc::clone(&state);
            std::thread::Builder::new()
                .name("burn-ddp-store".into())
                .spawn(move || accept_loop(listener, state))
                .map_err(|err| CommError::Store {
                    rank: None,
                    message: format!("cannot start the store's thread: {err}"),
                })?
        };
        Ok(Self {
            addr,
            state,
            acceptor: Some(acceptor),
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections open now (ranks, and anything not yet refused).
    pub fn connection_count(&self) -> usize {
        self.state.connections.lock().unwrap().len()
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.state.stopping.store(true, Ordering::SeqCst);
        self.state.changed.notify_all();
        // Wake the acceptor with a connection of our own, then close every client.
        let wake = if self.addr.ip().is_unspecified() {
            let loopback: std::net::IpAddr = match self.addr {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            };
            SocketAddr::new(loopback, self.addr.port())
        } else {
            self.addr
        };
        let _ = TcpStream::connect_timeout(&wake, Duration::from_millis(200));
        for (_, conn) in self.state.connections.lock().unwrap().drain() {
            let _ = conn.shutdown(std::net::Shutdown::Both);
        }
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn accept_loop(listener: TcpListener, state: Arc<State>) {
    loop {
        let accepted = listener.accept();
        if state.stopping.load(Ordering::SeqCst) {
            break;
        }
        let (conn, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                // Out of descriptors, mostly: back off instead of spinning.
                state.log_once(&state.logged_accept_error, || {
                    format!("cannot accept a connection ({err})")
                });
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let id = state.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut open = state.connections.lock().unwrap();
            if open.len() >= MAX_CONNECTIONS {
                state.log_once(&state.logged_full, || {
                    format!("{MAX_CONNECTIONS} connections are open; closed one from {peer}")
                });
                continue;
            }
            match conn.try_clone() {
                Ok(clone) => open.insert(id, clone),
                Err(_) => continue,
            };
        }
        let _ = conn.set_nodelay(true);
        let worker = {
            let state = Arc::clone(&state);
            std::thread::Builder::new()
                .name("burn-ddp-store-conn".into())
                .stack_size(256 << 10)
                .spawn(move || {
                    serve_connection(conn, peer, &state);
                    state.connections.lock().unwrap().remove(&id);
                })
        };
        if worker.is_err() {
            state.connections.lock().unwrap().remove(&id);
        }
    }
}

/// Reads from a socket with an overall deadline (none: wait as long as it takes).
struct DeadlineReader<'a> {
    conn: &'a TcpStream,
    deadline: Option<Instant>,
}

impl Read for DeadlineReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = match self.deadline {
            None => None,
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                Some(left)
            }
        };
        self.conn.set_read_timeout(left)?;
        let mut conn = self.conn;
        conn.read(buf)
    }
}

/// The next request: waits for its first byte until `idle_deadline`, then
/// gives the rest [`FRAME_DEADLINE`]. `None` when the client is gone or too slow.
fn next_request(conn: &TcpStream, idle_deadline: Option<Instant>) -> Option<Vec<u8>> {
    let mut first = [0u8; 1];
    DeadlineReader {
        conn,
        deadline: idle_deadline,
    }
    .read_exact(&mut first)
    .ok()?;
    let rest = DeadlineReader {
        conn,
        deadline: Some(Instant::now() + FRAME_DEADLINE),
    };
    read_frame(&mut (&first[..]).chain(rest)).ok().flatten()
}

fn serve_connection(mut conn: TcpStream, peer: SocketAddr, state: &State) {
    // A client that vanishes just ends its thread; requests are independent.
    let mut admitted = state.token.is_none();
    let hello_deadline = Instant::now() + HELLO_DEADLINE;
    loop {
        let idle_deadline = (!admitted).then_some(hello_deadline);
        let Some(request) = next_request(&conn, idle_deadline) else {
            if !admitted {
                state.log_once(&state.logged_refusal, || {
                    format!("closed a connection from {peer} that sent no hello")
                });
            }
            return;
        };
        let reply = match FieldReader::new(&request) {
            Ok((HELLO, mut fields)) => {
                let presented = fields.bytes().unwrap_or_default();
                match &state.token {
                    Some(token) if !token.matches(presented) => {
                        state.log_once(&state.logged_refusal, || {
                            format!(
                                "refused a connection from {peer} without this job's token \
                                 (a process of another job, or a port scan)"
                            )
                        });
                        let refusal = FieldWriter::new(protocol::ERROR)
                            .bytes(REFUSAL.as_bytes())
                            .finish();
                        let _ = write_frame(&mut conn, &refusal);
                        return;
                    }
                    _ => {
                        admitted = true;
                        Ok(FieldWriter::new(protocol::OK).finish())
                    }
                }
            }
            _ if !admitted => {
                state.log_once(&state.logged_refusal, || {
                    format!("refused a request from {peer} that did not say hello first")
                });
                let refusal = FieldWriter::new(protocol::ERROR)
                    .bytes(REFUSAL.as_bytes())
                    .finish();
                let _ = write_frame(&mut conn, &refusal);
                return;
            }
            _ => handle(&request, state),
        };
        let reply = match reply {
            Ok(reply) => reply,
            Err(err) => FieldWriter::new(protocol::ERROR)
                .bytes(err.to_string().as_bytes())
                .finish(),
        };
        if write_frame(&mut conn, &reply).is_err() {
            return;
        }
    }
}

/// What a client without the job's token is told.
pub(crate) const REFUSAL: &str = "this store serves one job only, and this process did not \
    present its token (BURN_DDP_JOB_TOKEN); start every rank from the same burn-ddp-run, or \
    export the same BURN_DDP_JOB_TOKEN to all of them";

fn handle(request: &[u8], state: &State) -> io::Result<Vec<u8>> {
    let (command, mut fields) = FieldReader::new(request)?;
    match command {
        SET => {
            let key = fields.string()?.to_owned();
            let value = fields.bytes()?.to_vec();
            state.values.lock().unwrap().insert(key, value)?;
            state.changed.notify_all();
            Ok(FieldWriter::new(protocol::OK).finish())
        }
        GET => {
            let key = fields.string()?;
            let timeout = Duration::from_millis(fields.u64()?);
            let values = wait_for(state, &[key], timeout);
            Ok(match values {
                Some(values) => FieldWriter::new(protocol::OK)
                    .bytes(&values.map[key])
                    .finish(),
                None => FieldWriter::new(protocol::TIMED_OUT).finish(),
            })
        }
        ADD => {
            let key = fields.string()?.to_owned();
            let delta = fields.i64()?;
            let mut values = state.values.lock().unwrap();
            let current = match values.map.get(&key) {
                Some(bytes) => parse_counter(bytes)?,
                None => 0,
            };
            // Checked: an overflow is the client's error, not a panic that
            // would poison the lock and take the whole store down.
            let sum = current.checked_add(delta).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("add of {delta} to {current} overflows a 64-bit counter"),
                )
            })?;
            values.insert(key, sum.to_string().into_bytes())?;
            drop(values);
            state.changed.notify_all();
            Ok(FieldWriter::new(protocol::OK).i64(sum).finish())
        }
        WAIT | CHECK => {
            let count = fields.u64()? as usize;
            let keys = (0..count)
                .map(|_| fields.string())
                .collect::<io::Result<Vec<_>>>()?;
            let timeout = if command == WAIT {
                Duration::from_millis(fields.u64()?)
            } else {
                Duration::ZERO
            };
            let ready = wait_for(state, &keys, timeout).is_some();
            Ok(match (command, ready) {
                (CHECK, ready) => FieldWriter::new(protocol::OK).i64(ready as i64).finish(),
                (_, true) => FieldWriter::new(protocol::OK).finish(),
                (_, false) => FieldWriter::new(protocol::TIMED_OUT).finish(),
            })
        }
        other => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("unknown store command {other}"),
        )),
    }
}

/// Counters are stored as decimal text, as PyTorch's store does, so `get` reads them too.
fn parse_counter(bytes: &[u8]) -> io::Result<i64> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "add on a key that does not hold an integer",
            )
        })
}

/// Waits until all keys exist; returns a guard over the map then, `None` on timeout.
fn wait_for<'a>(
    state: &'a State,
    keys: &[&str],
    timeout: Duration,
) -> Option<std::sync::MutexGuard<'a, Values>> {
    let deadline = Instant::now() + timeout;
    let mut values = state.values.lock().unwrap();
    loop {
        if keys.iter().all(|key| values.map.contains_key(*key)) {
            return Some(values);
        }
        let now = Instant::now();
        if now >= deadline || state.stopping.load(Ordering::SeqCst) {
            return None;
        }
        values = state
            .changed
            .wait_timeout(values, deadline - now)
            .unwrap()
            .0;
    }
}
