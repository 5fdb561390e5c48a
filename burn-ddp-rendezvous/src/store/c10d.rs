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

use super::connect::connect_with_retry;
use super::Store;
use crate::error::{io_is_timeout, RendezvousError, Result, StoreErrorKind};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Mutex;
use std::time::Duration;

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
    conn: Mutex<TcpStream>,
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
            conn: Mutex::new(conn),
            rank,
            server,
            namespace: String::new(),
        };
        let mut hello = Request::new(command::VALIDATE);
        hello.u32(VALIDATION_MAGIC);
        client.send(&hello.bytes, "validate")?;
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
        conn.local_addr().map(|addr| addr.ip()).map_err(|err| {
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

    fn lost(&self, what: &str, err: std::io::Error) -> RendezvousError {
        let message = if io_is_timeout(&err) {
            format!("no answer to {what} within {}s", REPLY_BOUND.as_secs())
        } else if err.kind() == std::io::ErrorKind::UnexpectedEof {
            format!(
                "the server closed the connection during {what}; torchrun's agent \
                 probably exited, or it rejected the request"
            )
        } else {
            format!("connection lost during {what}: {err}")
        };
        self.error(StoreErrorKind::ConnectionLost, message)
            .caused_by(err)
    }

    fn send(&self, bytes: &[u8], what: &str) -> Result<()> {
        let mut conn = self.conn.lock().unwrap();
        conn.set_write_timeout(Some(REPLY_BOUND))
            .and_then(|()| conn.write_all(bytes))
            .map_err(|err| self.lost(what, err))
    }

    /// Sends a request and reads a reply of `reply_len` bytes, or a length-prefixed
    /// value when `reply_len` is `None`.
    fn exchange(&self, bytes: &[u8], reply_len: Option<usize>, what: &str) -> Result<Vec<u8>> {
        let mut conn = self.conn.lock().unwrap();
        conn.set_write_timeout(Some(REPLY_BOUND))
            .and_then(|()| conn.set_read_timeout(Some(REPLY_BOUND)))
            .and_then(|()| conn.write_all(bytes))
            .and_then(|()| read_reply(&mut *conn, reply_len))
            .map_err(|err| self.lost(what, err))
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

impl Store for C10dStoreClient {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut request = Request::new(command::SET);
        request.string(self.key(key));
        request.string(value);
        self.send(&request.bytes, &format!("set {key:?}"))
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.wait(&[key], timeout)?;
        let mut request = Request::new(command::GET);
        request.string(self.key(key));
        self.exchange(&request.bytes, None, &format!("get {key:?}"))
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let mut request = Request::new(command::ADD);
        request.string(self.key(key));
        request.i64(delta);
        let reply = self.exchange(&request.bytes, Some(8), &format!("add {key:?}"))?;
        Ok(i64::from_le_bytes(reply.try_into().expect("eight bytes")))
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let request = self.keys_request(command::WAIT, keys);
        let what = format!("wait {keys:?}");
        let mut conn = self.conn.lock().unwrap();
        conn.set_write_timeout(Some(REPLY_BOUND))
            .and_then(|()| conn.write_all(&request.bytes))
            .and_then(|()| conn.set_read_timeout(Some(timeout.max(Duration::from_millis(1)))))
            .map_err(|err| self.lost(&what, err))?;
        match read_reply(&mut *conn, Some(1)) {
            Ok(reply) if reply[0] == WAIT_STOP_WAITING => return Ok(()),
            Ok(reply) => {
                return Err(self.error(
                    StoreErrorKind::Protocol,
                    format!("unexpected reply {} to {what}", reply[0]),
                ));
            }
            Err(err) if io_is_timeout(&err) => {}
            Err(err) => return Err(self.lost(&what, err)),
        }
        // Withdraw the wait so the connection stays usable. The keys may have
        // arrived meanwhile: then STOP_WAITING comes before WAIT_CANCELED.
        let mut arrived = false;
        conn.write_all(&[command::CANCEL_WAIT])
            .and_then(|()| conn.set_read_timeout(Some(REPLY_BOUND)))
            .and_then(|()| loop {
                match read_reply(&mut *conn, Some(1))?[0] {
                    WAIT_STOP_WAITING => arrived = true,
                    _ => return Ok(()),
                }
            })
            .map_err(|err| self.lost("cancel_wait", err))?;
        if arrived {
            return Ok(());
        }
        Err(RendezvousError::Timeout {
            rank: self.rank,
            what: format!("c10d store keys {keys:?} at {}", self.server),
            after: timeout,
        })
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        let request = self.keys_request(command::CHECK, keys);
        let reply = self.exchange(&request.bytes, Some(1), "check")?;
        Ok(reply[0] == CHECK_READY)
    }
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
