//! Client side of the store: one connection per rank, one request at a time.

use super::connect::connect_with_retry;
use super::protocol::{self, ADD, CHECK, GET, SET, WAIT};
use super::Store;
use crate::error::{io_is_timeout, CommError, Result};
use crate::frame::{read_frame, write_frame, FieldReader, FieldWriter};
use std::net::{SocketAddr, TcpStream};
use std::sync::Mutex;
use std::time::Duration;

/// Extra time the client waits beyond a server-side timeout before calling the server dead.
const REPLY_GRACE: Duration = Duration::from_secs(5);

/// A connection to a [`super::StoreServer`].
pub struct TcpStoreClient {
    conn: Mutex<TcpStream>,
    rank: Option<usize>,
    server: SocketAddr,
    /// Bound for requests that do not wait by design (set, add, check).
    request_timeout: Duration,
}

impl TcpStoreClient {
    /// Connects to `host:port`, retrying until `timeout` (the server may start later).
    pub fn connect(host: &str, port: u16, rank: Option<usize>, timeout: Duration) -> Result<Self> {
        let (server, conn) = connect_with_retry(host, port, timeout)
            .map_err(|message| CommError::Store { rank, message })?;
        Ok(Self {
            conn: Mutex::new(conn),
            rank,
            server,
            request_timeout: timeout.max(Duration::from_secs(1)),
        })
    }

    /// The server's address.
    pub fn server_addr(&self) -> SocketAddr {
        self.server
    }

    /// The local address of our connection: the interface this host uses to reach
    /// the store, which is also the one peers can reach us on.
    pub fn local_ip(&self) -> Result<std::net::IpAddr> {
        let conn = self.conn.lock().unwrap();
        conn.local_addr()
            .map(|addr| addr.ip())
            .map_err(|err| self.error(format!("cannot read the local address: {err}")))
    }

    fn error(&self, message: String) -> CommError {
        CommError::Store {
            rank: self.rank,
            message,
        }
    }

    /// Sends one request and reads its reply, allowing `wait` for the server to answer.
    fn request(&self, payload: Vec<u8>, wait: Duration, what: &str) -> Result<Vec<u8>> {
        let mut conn = self.conn.lock().unwrap();
        let bound = wait + REPLY_GRACE;
        conn.set_read_timeout(Some(bound))
            .and_then(|()| conn.set_write_timeout(Some(bound)))
            .map_err(|err| self.error(err.to_string()))?;
        let lost = |err: std::io::Error| {
            if io_is_timeout(&err) {
                self.error(format!(
                    "the store at {} did not answer {what} within {:.1}s",
                    self.server,
                    bound.as_secs_f64()
                ))
            } else {
                self.error(format!(
                    "lost the connection to the store at {} during {what}: {err}; \
                     the rank or launcher hosting it probably exited",
                    self.server
                ))
            }
        };
        write_frame(&mut *conn, &payload).map_err(lost)?;
        match read_frame(&mut *conn).map_err(lost)? {
            Some(reply) => Ok(reply),
            None => Err(self.error(format!(
                "the store at {} closed the connection during {what}; the rank or \
                 launcher hosting it probably exited",
                self.server
            ))),
        }
    }

    fn timeout_error(&self, what: String, after: Duration) -> CommError {
        CommError::Timeout {
            rank: self.rank.unwrap_or(usize::MAX),
            what,
            after,
        }
    }

    /// Splits a reply into status and fields, turning server errors into ours.
    fn parse<'a>(&self, reply: &'a [u8]) -> Result<(u8, FieldReader<'a>)> {
        let (status, mut fields) =
            FieldReader::new(reply).map_err(|err| self.error(err.to_string()))?;
        if status == protocol::ERROR {
            let message = fields.string().unwrap_or("unreadable error").to_owned();
            return Err(self.error(format!("the store refused the request: {message}")));
        }
        Ok((status, fields))
    }
}

impl Store for TcpStoreClient {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let payload = FieldWriter::new(SET)
            .bytes(key.as_bytes())
            .bytes(value)
            .finish();
        let reply = self.request(payload, self.request_timeout, &format!("set {key:?}"))?;
        self.parse(&reply).map(|_| ())
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let payload = FieldWriter::new(GET)
            .bytes(key.as_bytes())
            .u64(timeout.as_millis() as u64)
            .finish();
        let reply = self.request(payload, timeout, &format!("get {key:?}"))?;
        let (status, mut fields) = self.parse(&reply)?;
        if status == protocol::TIMED_OUT {
            return Err(self.timeout_error(format!("store key {key:?}"), timeout));
        }
        fields
            .bytes()
            .map(<[u8]>::to_vec)
            .map_err(|err| self.error(err.to_string()))
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let payload = FieldWriter::new(ADD)
            .bytes(key.as_bytes())
            .i64(delta)
            .finish();
        let reply = self.request(payload, self.request_timeout, &format!("add {key:?}"))?;
        let (_, mut fields) = self.parse(&reply)?;
        fields.i64().map_err(|err| self.error(err.to_string()))
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        let mut payload = FieldWriter::new(WAIT).u64(keys.len() as u64);
        for key in keys {
            payload = payload.bytes(key.as_bytes());
        }
        let payload = payload.u64(timeout.as_millis() as u64).finish();
        let reply = self.request(payload, timeout, &format!("wait {keys:?}"))?;
        let (status, _) = self.parse(&reply)?;
        if status == protocol::TIMED_OUT {
            return Err(self.timeout_error(format!("store keys {keys:?}"), timeout));
        }
        Ok(())
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        let mut payload = FieldWriter::new(CHECK).u64(keys.len() as u64);
        for key in keys {
            payload = payload.bytes(key.as_bytes());
        }
        let reply = self.request(payload.finish(), self.request_timeout, "check")?;
        let (_, mut fields) = self.parse(&reply)?;
        Ok(fields.i64().map_err(|err| self.error(err.to_string()))? != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{store_barrier, StoreServer};
    use std::sync::Arc;
    use std::time::Instant;

    fn local_server() -> StoreServer {
        StoreServer::bind("127.0.0.1:0".parse().unwrap()).unwrap()
    }

    fn client(server: &StoreServer, rank: usize) -> TcpStoreClient {
        let addr = server.addr();
        TcpStoreClient::connect("127.0.0.1", addr.port(), Some(rank), Duration::from_secs(5))
            .unwrap()
    }

    #[test]
    fn set_get_add_check_wait() {
        let server = local_server();
        let a = client(&server, 0);
        let b = client(&server, 1);
        a.set("k", b"value").unwrap();
        assert_eq!(b.get("k", Duration::from_secs(1)).unwrap(), b"value");
        assert_eq!(a.add("n", 3).unwrap(), 3);
        assert_eq!(b.add("n", -1).unwrap(), 2);
        assert_eq!(b.get("n", Duration::from_secs(1)).unwrap(), b"2");
        assert!(!a.check(&["k", "missing"]).unwrap());
        assert!(a.check(&["k", "n"]).unwrap());
        a.wait(&["k", "n"], Duration::from_secs(1)).unwrap();
    }

    #[test]
    fn blocking_get_wakes_when_another_client_sets() {
        let server = local_server();
        let waiter = client(&server, 1);
        let setter = client(&server, 0);
        let handle = std::thread::spawn(move || waiter.get("late", Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(100));
        setter.set("late", b"here").unwrap();
        assert_eq!(handle.join().unwrap().unwrap(), b"here");
    }

    #[test]
    fn get_of_a_missing_key_times_out_with_rank_and_key() {
        let server = local_server();
        let c = client(&server, 3);
        let started = Instant::now();
        let err = c.get("never", Duration::from_millis(200)).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(3));
        assert!(err.is_timeout());
        let text = err.to_string();
        assert!(
            text.contains("rank 3") && text.contains("\"never\""),
            "{text}"
        );
    }

    #[test]
    fn add_on_a_non_integer_is_a_clear_error() {
        let server = local_server();
        let c = client(&server, 0);
        c.set("text", b"abc").unwrap();
        let err = c.add("text", 1).unwrap_err().to_string();
        assert!(err.contains("does not hold an integer"), "{err}");
    }

    #[test]
    fn a_counter_overflow_is_an_error_and_the_store_keeps_serving() {
        let server = local_server();
        let c = client(&server, 0);
        assert_eq!(c.add("n", i64::MAX - 1).unwrap(), i64::MAX - 1);
        let err = c.add("n", 2).unwrap_err().to_string();
        assert!(err.contains("overflows"), "{err}");
        // The lock is not poisoned: other requests, new connections go on.
        let other = client(&server, 1);
        assert_eq!(other.add("n", -1).unwrap(), i64::MAX - 2);
        other.set("k", b"v").unwrap();
        assert_eq!(other.get("k", Duration::from_secs(1)).unwrap(), b"v");
        let memory = crate::store::MemoryStore::new();
        memory.add("n", i64::MIN).unwrap();
        let err = memory.add("n", -1).unwrap_err().to_string();
        assert!(err.contains("overflows"), "{err}");
    }

    #[test]
    fn barrier_releases_all_participants() {
        let server = Arc::new(local_server());
        let handles: Vec<_> = (0..4)
            .map(|rank| {
                let c = client(&server, rank);
                std::thread::spawn(move || store_barrier(&c, "b/0", 4, Duration::from_secs(5)))
            })
            .collect();
        for handle in handles {
            handle.join().unwrap().unwrap();
        }
    }

    #[test]
    fn connect_without_a_server_fails_within_the_timeout() {
        let port = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap().port()
        };
        let started = Instant::now();
        let err = TcpStoreClient::connect("127.0.0.1", port, Some(2), Duration::from_millis(300))
            .err()
            .unwrap()
            .to_string();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(
            err.contains("rank 2") && err.contains("MASTER_ADDR"),
            "{err}"
        );
    }

    #[test]
    fn a_dropped_server_disconnects_its_clients() {
        let server = local_server();
        let c = client(&server, 1);
        drop(server);
        let err = c.get("k", Duration::from_secs(5)).unwrap_err().to_string();
        assert!(err.contains("store"), "{err}");
    }

    #[test]
    fn binding_a_busy_port_names_the_fix() {
        let server = local_server();
        let err = StoreServer::bind(server.addr()).err().unwrap().to_string();
        assert!(err.contains("MASTER_PORT"), "{err}");
    }
}
