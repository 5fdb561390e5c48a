//! A client for PyTorch's c10d `TCPStore`, the store torchrun's agent hosts.
//!
//! Under `torchrun` with `TORCHELASTIC_USE_AGENT_STORE=True` the agent already
//! listens on MASTER_PORT, so rank 0 cannot host our own store there; the ranks
//! speak the agent's protocol instead. Written from reading PyTorch's
//! `TCPStore.cpp` and `TCPStoreLibUvBackend.cpp`:
//!
//! - every request starts with one command byte ([`command`]);
//! - strings and byte values are a `u64` length followed by the bytes;
//! - integers are fixed-size, in the host's byte order (little-endian on every
//!   platform PyTorch ships for), which is what we write;
//! - a new connection first sends `VALIDATE` and the magic number, unanswered;
//! - `SET` is unanswered, `GET` answers a value, `ADD` an `i64`, `CHECK` and
//!   `WAIT` one status byte; a timed-out `WAIT` is withdrawn with `CANCEL_WAIT`.
//!
//! The server has no "get with timeout": like PyTorch's client, `get` waits for
//! the key first and then reads it.

use super::connect::{connect_with_retry, lock, By, Connection, Patience, Requests};
use crate::error::{io_is_timeout, RendezvousError, Result, StoreErrorKind};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Command bytes (PyTorch's `QueryType`, in declaration order).
pub mod command {
    /// First message on a connection: the magic number follows.
    pub const VALIDATE: u8 = 0;
    /// key, value; no reply.
    pub const SET: u8 = 1;
    /// key; replies with the value.
    pub const GET: u8 = 3;
    /// key, i64; replies with the new i64.
    pub const ADD: u8 = 4;
    /// u64 count, keys; replies READY or NOT_READY.
    pub const CHECK: u8 = 5;
    /// u64 count, keys; replies STOP_WAITING once all are set.
    pub const WAIT: u8 = 6;
    /// Withdraws this connection's pending wait; replies WAIT_CANCELED.
    pub const CANCEL_WAIT: u8 = 12;
}

/// The number `VALIDATE` carries, which the server checks.
pub const VALIDATION_MAGIC: u32 = 0x3C85_F7CE;
/// `CHECK` reply: every key is set.
pub const CHECK_READY: u8 = 0;
/// `WAIT` reply: every key is set.
pub const WAIT_STOP_WAITING: u8 = 0;
/// `CANCEL_WAIT` reply.
pub const WAIT_CANCELED: u8 = 1;

/// How long we allow a reply that does not wait by design, and the answer to a
/// `CANCEL_WAIT`.
const REPLY_BOUND: Duration = Duration::from_secs(30);

/// A connection to a c10d `TCPStore` server, with every key placed under a
/// namespace (as PyTorch's `PrefixStore` does for torchrun's workers).
pub struct C10dStoreClient {
    conn: Mutex<Connection>,
    rank: Option<usize>,
    server: SocketAddr,
    namespace: String,
}

impl C10dStoreClient {
    /// Connects to the store at `host:port` (retrying until `timeout`) and
    /// validates the connection. Keys are used as given; see [`Self::namespaced`].
    pub fn connect(host: &str, port: u16, rank: Option<usize>, timeout: Duration) -> Result<Self> {
        let (server, conn) = connect_with_retry(host, port, timeout).map_err(|message| {
            RendezvousError::store(rank, StoreErrorKind::Unreachable, message)
        })?;
        let client = Self {
            conn: Connection::new(conn),
            rank,
            server,
            namespace: String::new(),
        };
        let mut hello = Request::new(command::VALIDATE);
        hello.u32(VALIDATION_MAGIC);
        client.exchange(&hello.bytes, Reply::None, Patience::Usual, "validate")?;
        Ok(client)
    }

    /// Puts every key under `namespace` (joined with `/`), so our keys never meet
    /// those of torchrun's agent or of an earlier attempt of the same job.
    pub fn namespaced(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// The server's address.
    pub fn server_addr(&self) -> SocketAddr {
        self.server
    }

    /// The local address of our connection (the interface peers can reach us on).
    pub fn local_ip(&self) -> Result<IpAddr> {
        let conn = self.conn.lock().unwrap();
        conn.stream
            .local_addr()
            .map(|addr| addr.ip())
            .map_err(|err| {
                self.error(
                    StoreErrorKind::ConnectionLost,
                    "cannot read the local address",
                )
                .caused_by(err)
            })
    }

    fn key(&self, key: &str) -> String {
        if self.namespace.is_empty() {
            key.to_owned()
        } else {
            format!("{}/{key}", self.namespace)
        }
    }

    fn error(&self, kind: StoreErrorKind, message: impl std::fmt::Display) -> RendezvousError {
        RendezvousError::store(
            self.rank,
            kind,
            format!("c10d TCPStore at {}: {message}", self.server),
        )
    }

    fn lost_message(what: &str, bound: Duration, err: &std::io::Error) -> String {
        if io_is_timeout(err) {
            format!("no answer to {what} within {:.1}s", bound.as_secs_f64())
        } else if err.kind() == std::io::ErrorKind::UnexpectedEof {
            format!(
                "the server closed the connection during {what}; torchrun's agent \
                 probably exited, or it rejected the request"
            )
        } else {
            format!("connection lost during {what}: {err}")
        }
    }

    /// How long a reply that does not wait by design may take.
    fn bound(patience: Patience) -> Duration {
        match patience {
            Patience::Usual => REPLY_BOUND,
            Patience::Grace(grace) => grace,
        }
        .max(Duration::from_millis(1))
    }

    /// The connection for one request of `what`, unless it is busy past
    /// `bound` (an impatient request) or was given up; and when the request
    /// must be done by: `bound` from now, or for an impatient request from
    /// when it began to wait for the connection.
    fn connection(
        &self,
        patience: Patience,
        bound: Duration,
        what: &str,
    ) -> Result<(MutexGuard<'_, Connection>, Instant)> {
        let started = Instant::now();
        let Some(conn) = lock(&self.conn, patience, started + bound) else {
            return Err(self.error(
                StoreErrorKind::ConnectionLost,
                format!("{what} not sent: the connection stayed busy with another request"),
            ));
        };
        if let Some(why) = &conn.given_up {
            return Err(self.error(
                StoreErrorKind::ConnectionLost,
                format!("{what} not sent: the connection was given up earlier ({why})"),
            ));
        }
        let deadline = match patience {
            Patience::Usual => Instant::now() + bound,
            Patience::Grace(_) => started + bound,
        };
        Ok((conn, deadline))
    }

    /// Gives the connection up after `err` (its requests are out of step, or
    /// it broke) and returns the error.
    fn give_up(
        &self,
        conn: &mut Connection,
        what: &str,
        bound: Duration,
        err: std::io::Error,
    ) -> RendezvousError {
        let message = Self::lost_message(what, bound, &err);
        conn.given_up = Some(message.clone());
        self.error(StoreErrorKind::ConnectionLost, message)
            .caused_by(err)
    }

    /// Sends a request and reads its reply (see [`Reply`]).
    fn exchange(
        &self,
        bytes: &[u8],
        reply: Reply,
        patience: Patience,
        what: &str,
    ) -> Result<Vec<u8>> {
        let bound = Self::bound(patience);
        let (mut conn, deadline) = self.connection(patience, bound, what)?;
        let mut stream = By::new(&conn.stream, deadline);
        let result = stream.write_all(bytes).and_then(|()| match reply {
            Reply::None => Ok(Vec::new()),
            Reply::Fixed(len) => read_reply(&mut stream, Some(len)),
            Reply::Value => read_reply(&mut stream, None),
        });
        result.map_err(|err| self.give_up(&mut conn, what, bound, err))
    }

    fn keys_request(&self, cmd: u8, keys: &[&str]) -> Request {
        let mut request = Request::new(cmd);
        request.u64(keys.len() as u64);
        for key in keys {
            request.string(self.key(key));
        }
        request
    }
}

impl Requests for C10dStoreClient {
    fn set_with(&self, key: &str, value: &[u8], patience: Patience) -> Result<()> {
        let mut request = Request::new(command::SET);
        request.string(self.key(key));
        request.string(value);
        self.exchange(
            &request.bytes,
            Reply::None,
            patience,
            &format!("set {key:?}"),
        )
        .map(drop)
    }

    fn get_with(&self, key: &str, timeout: Duration, patience: Patience) -> Result<Vec<u8>> {
        self.wait_with(&[key], timeout, patience)?;
        let mut request = Request::new(command::GET);
        request.string(self.key(key));
        self.exchange(
            &request.bytes,
            Reply::Value,
            patience,
            &format!("get {key:?}"),
        )
    }

    fn add_with(&self, key: &str, delta: i64, patience: Patience) -> Result<i64> {
        let mut request = Request::new(command::ADD);
        request.string(self.key(key));
        request.i64(delta);
        let reply = self.exchange(
            &request.bytes,
            Reply::Fixed(8),
            patience,
            &format!("add {key:?}"),
        )?;
        Ok(i64::from_le_bytes(reply.try_into().expect("eight bytes")))
    }

    fn wait_with(&self, keys: &[&str], timeout: Duration, patience: Patience) -> Result<()> {
        let request = self.keys_request(command::WAIT, keys);
        let what = format!("wait {keys:?}");
        let bound = Self::bound(patience);
        let (mut conn, deadline) = self.connection(patience, bound, &what)?;
        let sent = By::new(&conn.stream, deadline).write_all(&request.bytes);
        if let Err(err) = sent {
            return Err(self.give_up(&mut conn, &what, bound, err));
        }
        // The wait itself: the server answers once every key is set.
        let waited = timeout.max(Duration::from_millis(1));
        match read_reply(&mut By::new(&conn.stream, Instant::now() + waited), Some(1)) {
            Ok(reply) if reply[0] == WAIT_STOP_WAITING => return Ok(()),
            Ok(reply) => {
                let message = format!("unexpected reply {} to {what}", reply[0]);
                conn.given_up = Some(message.clone());
                return Err(self.error(StoreErrorKind::Protocol, message));
            }
            Err(err) if io_is_timeout(&err) => {}
            Err(err) => return Err(self.give_up(&mut conn, &what, bound, err)),
        }
        // Withdraw the wait so the connection stays usable. The keys may have
        // arrived meanwhile: then STOP_WAITING comes before WAIT_CANCELED.
        let mut arrived = false;
        let mut stream = By::new(&conn.stream, Instant::now() + bound);
        let cancelled = stream
            .write_all(&[command::CANCEL_WAIT])
            .and_then(|()| loop {
                match read_reply(&mut stream, Some(1))?[0] {
                    WAIT_STOP_WAITING => arrived = true,
                    _ => return Ok(()),
                }
            });
        if let Err(err) = cancelled {
            return Err(self.give_up(&mut conn, "cancel_wait", bound, err));
        }
        if arrived {
            return Ok(());
        }
        Err(RendezvousError::Timeout {
            rank: self.rank,
            what: format!("c10d store keys {keys:?} at {}", self.server),
            after: timeout,
        })
    }

    fn check_with(&self, keys: &[&str], patience: Patience) -> Result<bool> {
        let request = self.keys_request(command::CHECK, keys);
        let reply = self.exchange(&request.bytes, Reply::Fixed(1), patience, "check")?;
        Ok(reply[0] == CHECK_READY)
    }
}

/// What a request's reply is.
#[derive(Clone, Copy)]
enum Reply {
    /// None (`VALIDATE`, `SET`).
    None,
    /// So many bytes.
    Fixed(usize),
    /// A `u64`-length-prefixed value.
    Value,
}

/// Reads a fixed-size reply, or a `u64`-length-prefixed value.
pub(crate) fn read_reply(conn: &mut impl Read, len: Option<usize>) -> std::io::Result<Vec<u8>> {
    let len = match len {
        Some(len) => len,
        None => {
            let mut header = [0u8; 8];
            conn.read_exact(&mut header)?;
            // A confused or hostile server must not make us allocate at will:
            // the values this crate stores are bytes to kilobytes.
            let len = u64::from_le_bytes(header);
            usize::try_from(len)
                .ok()
                .filter(|len| *len <= crate::frame::MAX_FRAME_BYTES)
                .ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "the store announced a value of {len} bytes, above the {}-byte \
                             limit (is this a c10d TCPStore?)",
                            crate::frame::MAX_FRAME_BYTES
                        ),
                    )
                })?
        }
    };
    let mut reply = vec![0u8; len];
    conn.read_exact(&mut reply)?;
    Ok(reply)
}

/// One request's bytes, built field by field.
struct Request {
    bytes: Vec<u8>,
}

impl Request {
    fn new(command: u8) -> Self {
        Self {
            bytes: vec![command],
        }
    }

    fn u32(&mut self, value: u32) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    fn u64(&mut self, value: u64) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    fn i64(&mut self, value: i64) {
        self.bytes.extend_from_slice(&value.to_le_bytes());
    }

    fn string(&mut self, value: impl AsRef<[u8]>) {
        let value = value.as_ref();
        self.u64(value.len() as u64);
        self.bytes.extend_from_slice(value);
    }
}

#[cfg(test)]
mod tests {
    //! Byte-level fixtures: a scripted peer records exactly what the client sends
    //! and answers with bytes written out by hand from the protocol.

    use super::*;
    use crate::store::Store;
    use std::net::TcpListener;
    use std::sync::mpsc;
    use std::time::Instant;

    /// One expected request (exact bytes) and the reply to send back.
    struct Step {
        expect: Vec<u8>,
        reply: Vec<u8>,
    }

    fn le64(n: u64) -> Vec<u8> {
        n.to_le_bytes().to_vec()
    }

    #[test]
    fn an_oversized_value_length_is_refused_before_allocating() {
        let mut wire = std::io::Cursor::new(le64(u64::MAX / 2));
        let err = read_reply(&mut wire, None).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("byte limit"), "{err}");
        let mut wire = std::io::Cursor::new([le64(3), b"abc".to_vec()].concat());
        assert_eq!(read_reply(&mut wire, None).unwrap(), b"abc");
    }

    fn string(s: &str) -> Vec<u8> {
        [le64(s.len() as u64), s.as_bytes().to_vec()].concat()
    }

    /// Serves one connection: reads each step's exact request, checks it and
    /// replies. Reports the bytes received for any mismatch.
    fn scripted_server(steps: Vec<Step>) -> (u16, mpsc::Receiver<std::result::Result<(), String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (done, result) = mpsc::channel();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let outcome = steps.into_iter().enumerate().try_for_each(|(i, step)| {
                let mut got = vec![0u8; step.expect.len()];
                conn.read_exact(&mut got)
                    .map_err(|e| format!("step {i}: {e}"))?;
                if got != step.expect {
                    return Err(format!("step {i}: expected {:?}, got {got:?}", step.expect));
                }
                conn.write_all(&step.reply)
                    .map_err(|e| format!("step {i}: {e}"))
            });
            done.send(outcome).unwrap();
            // Hold the connection until the client is done with it.
            let _ = conn.read(&mut [0u8; 1]);
        });
        (port, result)
    }

    fn validate() -> Step {
        Step {
            expect: vec![0x00, 0xCE, 0xF7, 0x85, 0x3C],
            reply: vec![],
        }
    }

    fn connect(port: u16) -> C10dStoreClient {
        C10dStoreClient::connect("127.0.0.1", port, Some(1), Duration::from_secs(5)).unwrap()
    }

    #[test]
    fn requests_match_the_wire_format_byte_for_byte() {
        let set = [vec![1u8], string("ns/k"), string("abc")].concat();
        let add = [vec![4u8], string("ns/n"), (-3i64).to_le_bytes().to_vec()].concat();
        let check = [vec![5u8], le64(2), string("ns/a"), string("ns/b")].concat();
        let wait = [vec![6u8], le64(1), string("ns/k")].concat();
        let get = [vec![3u8], string("ns/k")].concat();
        let (port, result) = scripted_server(vec![
            validate(),
            Step {
                expect: set,
                reply: vec![],
            },
            Step {
                expect: add,
                reply: 39i64.to_le_bytes().to_vec(),
            },
            Step {
                expect: check,
                reply: vec![1], // NOT_READY
            },
            Step {
                expect: wait,
                reply: vec![0], // STOP_WAITING
            },
            Step {
                expect: get,
                reply: [le64(3), b"abc".to_vec()].concat(),
            },
        ]);
        let client = connect(port).namespaced("ns");
        client.set("k", b"abc").unwrap();
        assert_eq!(client.add("n", -3).unwrap(), 39);
        assert!(!client.check(&["a", "b"]).unwrap());
        assert_eq!(client.get("k", Duration::from_secs(5)).unwrap(), b"abc");
        result
            .recv_timeout(Duration::from_secs(5))
            .unwrap()
            .unwrap();
    }

    #[test]
    fn a_timed_out_wait_is_cancelled_and_reported_with_rank_and_key() {
        let wait = [vec![6u8], le64(1), string("late")].concat();
        let (port, result) = scripted_server(vec![
            validate(),
            Step {
                expect: wait,
                reply: vec![], // never set
            },
            Step {
                expect: vec![12], // CANCEL_WAIT
                reply: vec![1],   // WAIT_CANCELED
            },
            Step {
                expect: [vec![5u8], le64(1), string("late")].concat(),
                reply: vec![0], // READY: the connection is still in step
            },
        ]);
        let client = connect(port);
        let started = Instant::now();
        let err = client
            .wait(&["late"], Duration::from_millis(200))
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(3));
        assert!(err.is_timeout(), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("rank 1") && text.contains("\"late\""),
            "{text}"
        );
        assert!(client.check(&["late"]).unwrap());
        result
            .recv_timeout(Duration::from_secs(5))
            .unwrap()
            .unwrap();
    }

    #[test]
    fn keys_arriving_while_the_wait_is_cancelled_count_as_arrived() {
        let wait = [vec![6u8], le64(1), string("k")].concat();
        let (port, result) = scripted_server(vec![
            validate(),
            Step {
                expect: wait,
                reply: vec![],
            },
            Step {
                expect: vec![12],
                reply: vec![0, 1], // STOP_WAITING raced ahead of WAIT_CANCELED
            },
        ]);
        let client = connect(port);
        client.wait(&["k"], Duration::from_millis(100)).unwrap();
        result
            .recv_timeout(Duration::from_secs(5))
            .unwrap()
            .unwrap();
    }

    /// An agent that reads everything and never answers: behind a cut link.
    fn silent_server() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut sink = [0u8; 256];
            while conn.read(&mut sink).is_ok_and(|n| n > 0) {}
        });
        port
    }

    #[test]
    fn an_impatient_request_gives_up_within_its_grace_and_the_connection_with_it() {
        let client = connect(silent_server());
        let view = client.impatient(Duration::from_millis(300));
        let started = Instant::now();
        let err = view.check(&["duplicate"]).unwrap_err().to_string();
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_secs(2),
            "{took:?} (the usual bound is 30 s)"
        );
        assert!(
            err.contains("rank 1") && err.contains("no answer to check within 0.3s"),
            "{err}"
        );
        let started = Instant::now();
        let err = client.add("n", 1).unwrap_err().to_string();
        assert!(err.contains("given up earlier"), "{err}");
        assert!(started.elapsed() < Duration::from_millis(100));
        // A wait runs its own timeout, then its cancellation gets the grace.
        let client = connect(silent_server());
        let started = Instant::now();
        let err = client
            .impatient(Duration::from_millis(200))
            .get("k", Duration::from_millis(300))
            .unwrap_err()
            .to_string();
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(450) && took < Duration::from_secs(2),
            "{took:?}"
        );
        assert!(err.contains("cancel_wait"), "{err}");
    }

    #[test]
    fn a_server_that_hangs_up_is_named_in_the_error() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let _ = conn.read(&mut [0u8; 5]);
            drop(conn);
        });
        let client = connect(port);
        let err = client.add("n", 1).unwrap_err().to_string();
        assert!(
            err.contains("rank 1") && err.contains("c10d TCPStore") && err.contains("add"),
            "{err}"
        );
    }
}
