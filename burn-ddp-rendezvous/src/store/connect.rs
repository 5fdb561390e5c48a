//! Reaching a store server, shared by both store clients.

use super::Store;
use crate::error::Result as StoreResult;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

/// How long a name that does not resolve is retried (name services can lag
/// behind a job's start), before the error instead of the whole timeout.
const RESOLVE_GRACE: Duration = Duration::from_secs(5);

/// Connects to `host:port`, retrying until `timeout` because the server (rank 0,
/// a launcher, torchrun's agent) may start after us. Every address the name
/// resolves to is tried. The error is one sentence that already names
/// MASTER_ADDR/MASTER_PORT.
pub(crate) fn connect_with_retry(
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<(SocketAddr, TcpStream), String> {
    let started = Instant::now();
    let deadline = started + timeout;
    loop {
        let last_error = match (host, port).to_socket_addrs() {
            Err(err) if started.elapsed() >= RESOLVE_GRACE.min(timeout) => {
                return Err(format!(
                    "cannot resolve MASTER_ADDR {host:?} ({err}); set MASTER_ADDR to the \
                     host name or address of rank 0's machine (or the launcher's \
                     --master-addr), the same on every rank"
                ))
            }
            Err(err) => format!("cannot resolve MASTER_ADDR {host:?}: {err}"),
            Ok(addrs) => {
                let mut last = format!("MASTER_ADDR {host:?} resolves to no address");
                for addr in addrs {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let attempt = left.clamp(Duration::from_millis(10), Duration::from_secs(2));
                    match TcpStream::connect_timeout(&addr, attempt) {
                        Ok(conn) => {
                            conn.set_nodelay(true).map_err(|err| {
                                format!("cannot configure the connection to {addr}: {err}")
                            })?;
                            return Ok((addr, conn));
                        }
                        Err(err) => last = format!("cannot connect to {addr}: {err}"),
                    }
                }
                last
            }
        };
        if Instant::now() >= deadline {
            return Err(format!(
                "no store at {host}:{port} after {:.1}s ({last_error}); check that \
                 MASTER_ADDR/MASTER_PORT are the same on every rank and that rank 0 \
                 (or the launcher) is running",
                timeout.as_secs_f64()
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How long a store request may go unanswered.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Patience {
    /// The client's own bound.
    Usual,
    /// An impatient view's ([`super::Store::impatient`]): the request's own
    /// wait, if it has one, plus this.
    Grace(Duration),
}

/// A store client's requests, each with its patience. Every such client is
/// a [`Store`] (its usual patience), and its impatient view is a
/// [`WithPatience`] of the same requests.
pub(crate) trait Requests: Send + Sync {
    fn set_with(&self, key: &str, value: &[u8], patience: Patience) -> StoreResult<()>;
    fn get_with(&self, key: &str, timeout: Duration, patience: Patience) -> StoreResult<Vec<u8>>;
    fn add_with(&self, key: &str, delta: i64, patience: Patience) -> StoreResult<i64>;
    fn wait_with(&self, keys: &[&str], timeout: Duration, patience: Patience) -> StoreResult<()>;
    fn check_with(&self, keys: &[&str], patience: Patience) -> StoreResult<bool>;
}

impl<C: Requests> Store for C {
    fn set(&self, key: &str, value: &[u8]) -> StoreResult<()> {
        self.set_with(key, value, Patience::Usual)
    }

    fn get(&self, key: &str, timeout: Duration) -> StoreResult<Vec<u8>> {
        self.get_with(key, timeout, Patience::Usual)
    }

    fn add(&self, key: &str, delta: i64) -> StoreResult<i64> {
        self.add_with(key, delta, Patience::Usual)
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> StoreResult<()> {
        self.wait_with(keys, timeout, Patience::Usual)
    }

    fn check(&self, keys: &[&str]) -> StoreResult<bool> {
        self.check_with(keys, Patience::Usual)
    }

    fn impatient(&self, grace: Duration) -> Box<dyn Store + '_> {
        Box::new(WithPatience {
            client: self,
            patience: Patience::Grace(grace),
        })
    }
}

/// A client's requests, all with one patience ([`Store::impatient`]'s view).
pub(crate) struct WithPatience<'a, C> {
    client: &'a C,
    patience: Patience,
}

impl<C: Requests> Store for WithPatience<'_, C> {
    fn set(&self, key: &str, value: &[u8]) -> StoreResult<()> {
        self.client.set_with(key, value, self.patience)
    }

    fn get(&self, key: &str, timeout: Duration) -> StoreResult<Vec<u8>> {
        self.client.get_with(key, timeout, self.patience)
    }

    fn add(&self, key: &str, delta: i64) -> StoreResult<i64> {
        self.client.add_with(key, delta, self.patience)
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> StoreResult<()> {
        self.client.wait_with(keys, timeout, self.patience)
    }

    fn check(&self, keys: &[&str]) -> StoreResult<bool> {
        self.client.check_with(keys, self.patience)
    }

    fn impatient(&self, grace: Duration) -> Box<dyn Store + '_> {
        self.client.impatient(grace)
    }
}

/// A client's connection to its server, and whether it can still be used.
pub(crate) struct Connection {
    pub stream: TcpStream,
    /// Why it was given up: a request ended without its whole reply (which
    /// may still come, and would be read as the next request's), or the
    /// connection broke.
    pub given_up: Option<String>,
}

impl Connection {
    pub fn new(stream: TcpStream) -> Mutex<Self> {
        Mutex::new(Self {
            stream,
            given_up: None,
        })
    }
}

/// The connection, once no other request holds it; an impatient request
/// waits for it only until `deadline` (`None`: it stayed busy).
pub(crate) fn lock(
    conn: &Mutex<Connection>,
    patience: Patience,
    deadline: Instant,
) -> Option<MutexGuard<'_, Connection>> {
    if let Patience::Usual = patience {
        return Some(conn.lock().unwrap());
    }
    loop {
        match conn.try_lock() {
            Ok(conn) => return Some(conn),
            Err(TryLockError::Poisoned(poisoned)) => return Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(TryLockError::WouldBlock) => return None,
        }
    }
}

/// A connection's stream with a deadline: each read or write first sets the
/// socket's timeout to the time left, and none starts after the deadline. A
/// request is then bounded as a whole, however many reads its reply takes
/// and however often a signal interrupts one (an interrupted read is
/// retried, and a plain socket timeout would start again in full).
pub(crate) struct By<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl<'a> By<'a> {
    pub fn new(stream: &'a TcpStream, deadline: Instant) -> Self {
        Self { stream, deadline }
    }

    fn time_left(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(io::ErrorKind::TimedOut.into())
        } else {
            Ok(left)
        }
    }
}

impl Read for By<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(Some(self.time_left()?))?;
        (&*self.stream).read(buf)
    }
}

impl Write for By<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(self.time_left()?))?;
        (&*self.stream).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
