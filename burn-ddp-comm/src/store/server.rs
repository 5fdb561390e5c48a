//! The store's server: one thread accepting, one thread per connected rank.

use super::protocol::{self, ADD, CHECK, GET, SET, WAIT};
use crate::error::{CommError, Result};
use crate::frame::{read_frame, write_frame, FieldReader, FieldWriter};
use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[derive(Default)]
struct State {
    values: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
    stopping: AtomicBool,
    connections: Mutex<Vec<TcpStream>>,
}

/// A running store; stops (and disconnects every client) when dropped.
pub struct StoreServer {
    addr: SocketAddr,
    state: Arc<State>,
    acceptor: Option<JoinHandle<()>>,
}

impl StoreServer {
    /// Binds `addr` and starts serving. Port 0 picks a free port (see [`Self::addr`]).
    pub fn bind(addr: SocketAddr) -> Result<Self> {
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
        let state = Arc::new(State::default());
        let acceptor = {
            let state = Arc::clone(&state);
            std::thread::Builder::new()
                .name("burn-ddp-store".into())
                .spawn(move || accept_loop(listener, state))
                .expect("spawning the store thread")
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
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.state.stopping.store(true, Ordering::SeqCst);
        self.state.changed.notify_all();
        // Wake the acceptor with a connection of our own, then close every client.
        let wake = if self.addr.ip().is_unspecified() {
            SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), self.addr.port())
        } else {
            self.addr
        };
        let _ = TcpStream::connect_timeout(&wake, Duration::from_millis(200));
        for conn in self.state.connections.lock().unwrap().drain(..) {
            let _ = conn.shutdown(std::net::Shutdown::Both);
        }
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn accept_loop(listener: TcpListener, state: Arc<State>) {
    for conn in listener.incoming() {
        if state.stopping.load(Ordering::SeqCst) {
            break;
        }
        let Ok(conn) = conn else { continue };
        let _ = conn.set_nodelay(true);
        if let Ok(clone) = conn.try_clone() {
            state.connections.lock().unwrap().push(clone);
        }
        let state = Arc::clone(&state);
        let _ = std::thread::Builder::new()
            .name("burn-ddp-store-conn".into())
            .spawn(move || serve_connection(conn, state));
    }
}

fn serve_connection(mut conn: TcpStream, state: Arc<State>) {
    // A client that vanishes just ends its thread; requests are independent.
    while let Ok(Some(request)) = read_frame(&mut conn) {
        let reply = match handle(&request, &state) {
            Ok(reply) => reply,
            Err(err) => FieldWriter::new(protocol::ERROR)
                .bytes(err.to_string().as_bytes())
                .finish(),
        };
        if write_frame(&mut conn, &reply).is_err() {
            break;
        }
    }
}

fn handle(request: &[u8], state: &State) -> io::Result<Vec<u8>> {
    let (command, mut fields) = FieldReader::new(request)?;
    match command {
        SET => {
            let key = fields.string()?.to_owned();
            let value = fields.bytes()?.to_vec();
            state.values.lock().unwrap().insert(key, value);
            state.changed.notify_all();
            Ok(FieldWriter::new(protocol::OK).finish())
        }
        GET => {
            let key = fields.string()?;
            let timeout = Duration::from_millis(fields.u64()?);
            let values = wait_for(state, &[key], timeout);
            Ok(match values {
                Some(values) => FieldWriter::new(protocol::OK).bytes(&values[key]).finish(),
                None => FieldWriter::new(protocol::TIMED_OUT).finish(),
            })
        }
        ADD => {
            let key = fields.string()?.to_owned();
            let delta = fields.i64()?;
            let mut values = state.values.lock().unwrap();
            let current = match values.get(&key) {
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
            values.insert(key, sum.to_string().into_bytes());
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
) -> Option<std::sync::MutexGuard<'a, HashMap<String, Vec<u8>>>> {
    let deadline = Instant::now() + timeout;
    let mut values = state.values.lock().unwrap();
    loop {
        if keys.iter().all(|key| values.contains_key(*key)) {
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
