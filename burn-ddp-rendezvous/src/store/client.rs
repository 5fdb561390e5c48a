//! Client side of the store: one connection per rank, one request at a time.

use super::connect::{connect_with_retry, lock, By, Connection, Patience, Requests};
use super::protocol::{self, ADD, CHECK, GET, HELLO, SET, WAIT};
use crate::error::{io_is_timeout, RendezvousError, Result, StoreErrorKind};
use crate::frame::{read_frame, write_frame, FieldReader, FieldWriter};
use crate::job::JobToken;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Extra time the client waits beyond a server-side timeout before calling the server dead.
const REPLY_GRACE: Duration = Duration::from_secs(5);

/// A connection to a [`super::StoreServer`].
pub struct TcpStoreClient {
    conn: Mutex<Connection>,
    rank: Option<usize>,
    server: SocketAddr,
    /// Bound for requests that do not wait by design (set, add, check).
    request_timeout: Duration,
}

impl TcpStoreClient {
    /// Connects to `host:port`, retrying until `timeout` (the server may start
    /// later), without a job token.
    pub fn connect(host: &str, port: u16, rank: Option<usize>, timeout: Duration) -> Result<Self> {
        Self::connect_with_token(host, port, rank, timeout, None)
    }

    /// Connects and presents `token`; a store of another job refuses us at once.
    pub fn connect_with_token(
        host: &str,
        port: u16,
        rank: Option<usize>,
        timeout: Duration,
        token: Option<&JobToken>,
    ) -> Result<Self> {
        let (server, conn) = connect_with_retry(host, port, timeout).map_err(|message| {
            RendezvousError::store(rank, StoreErrorKind::Unreachable, message)
        })?;
        let client = Self {
            conn: Connection::new(conn),
            rank,
            server,
            request_timeout: timeout.max(Duration::from_secs(1)),
        };
        let hello = FieldWriter::new(HELLO)
            .bytes(token.map_or(&b""[..], |t| t.as_str().as_bytes()))
            .i64(rank.map_or(-1, |r| r as i64))
            .finish();
        let reply = client.request(hello, None, Patience::Usual, "hello")?;
        client.parse(&reply)?;
        Ok(client)
    }

    /// Bounds every later request by `timeout` instead of the connect
    /// timeout: for a client that polls, and must not hang on a store whose
    /// machine went away.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout.max(Duration::from_millis(100));
        self
    }

    /// The server's address.
    pub fn server_addr(&self) -> SocketAddr {
        self.server
    }

    /// The local address of our connection: the interface this host uses to reach
    /// the store, which is also the one peers can reach us on.
    pub fn local_ip(&self) -> Result<std::net::IpAddr> {
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

    fn error(&self, kind: StoreErrorKind, message: impl Into<String>) -> RendezvousError {
        RendezvousError::store(self.rank, kind, message)
    }

    /// Sends one request and reads its reply, allowing `wait` (the server's
    /// own wait, if the request has one) and `patience` for it. A request
    /// that ends without its reply gives the connection up.
    fn request(
        &self,
        payload: Vec<u8>,
        wait: Option<Duration>,
        patience: Patience,
        what: &str,
    ) -> Result<Vec<u8>> {
        let bound = match patience {
            Patience::Usual => wait.unwrap_or(self.request_timeout) + REPLY_GRACE,
            Patience::Grace(grace) => wait.unwrap_or_default() + grace,
        };
        let started = Instant::now();
        let Some(mut conn) = lock(&self.conn, patience, started + bound) else {
            return Err(self.error(
                StoreErrorKind::ConnectionLost,
                format!(
                    "{what} not sent: the connection to the store at {} stayed busy with \
                     another request",
                    self.server
                ),
            ));
        };
        if let Some(why) = &conn.given_up {
            return Err(self.error(
                StoreErrorKind::ConnectionLost,
                format!(
                    "{what} not sent: the connection to the store at {} was given up \
                     earlier ({why})",
                    self.server
                ),
            ));
        }
        let lost = |err: std::io::Error| {
            let message = if io_is_timeout(&err) {
                format!(
                    "the store at {} did not answer {what} within {:.1}s",
                    self.server,
                    bound.as_secs_f64()
                )
            } else {
                format!(
                    "lost the connection to the store at {} during {what}: {err}; \
                     the rank or launcher hosting it probably exited",
                    self.server
                )
            };
            (message, err)
        };
        // The usual bound starts once the connection is ours (another
        // request may hold it for its whole wait); an impatient one's
        // includes waiting for it.
        let deadline = match patience {
            Patience::Usual => Instant::now() + bound,
            Patience::Grace(_) => started + bound,
        };
        let mut stream = By::new(&conn.stream, deadline);
        let reply = write_frame(&mut stream, &payload)
            .and_then(|()| read_frame(&mut stream))
            .map_err(lost);
        match reply {
            Ok(Some(reply)) => Ok(reply),
            Ok(None) => {
                let message = format!(
                    "the store at {} closed the connection during {what}; the rank or \
                     launcher hosting it probably exited",
                    self.server
                );
                conn.given_up = Some(message.clone());
                Err(self.error(StoreErrorKind::ConnectionLost, message))
            }
            Err((message, err)) => {
                conn.given_up = Some(message.clone());
                Err(self
                    .error(StoreErrorKind::ConnectionLost, message)
                    .caused_by(err))
            }
        }
    }

    fn timeout_error(&self, what: String, after: Duration) -> RendezvousError {
        RendezvousError::Timeout {
            rank: self.rank,
            what,
            after,
        }
    }

    /// Splits a reply into status and fields, turning server errors into ours.
    fn parse<'a>(&self, reply: &'a [u8]) -> Result<(u8, FieldReader<'a>)> {
        let (status, mut fields) = FieldReader::new(reply)
            .map_err(|err| self.error(StoreErrorKind::Protocol, err.to_string()))?;
        if status == protocol::ERROR {
            let message = fields.string().unwrap_or("unreadable error").to_owned();
            return Err(self.error(
                StoreErrorKind::Refused,
                format!("the store refused the request: {message}"),
            ));
        }
        Ok((status, fields))
    }
}

impl Requests for TcpStoreClient {
    fn set_with(&self, key: &str, value: &[u8], patience: Patience) -> Result<()> {
        let payload = FieldWriter::new(SET)
            .bytes(key.as_bytes())
            .bytes(value)
            .finish();
        let reply = self.request(payload, None, patience, &format!("set {key:?}"))?;
        self.parse(&reply).map(|_| ())
    }

    fn get_with(&self, key: &str, timeout: Duration, patience: Patience) -> Result<Vec<u8>> {
        let payload = FieldWriter::new(GET)
            .bytes(key.as_bytes())
            .u64(timeout.as_millis() as u64)
            .finish();
        let reply = self.request(payload, Some(timeout), patience, &format!("get {key:?}"))?;
        let (status, mut fields) = self.parse(&reply)?;
        if status == protocol::TIMED_OUT {
            return Err(self.timeout_error(format!("store key {key:?}"), timeout));
        }
        fields
            .bytes()
            .map(<[u8]>::to_vec)
            .map_err(|err| self.error(StoreErrorKind::Protocol, err.to_string()))
    }

    fn add_with(&self, key: &str, delta: i64, patience: Patience) -> Result<i64> {
        let payload = FieldWriter::new(ADD)
            .bytes(key.as_bytes())
            .i64(delta)
            .finish();
        let reply = self.request(payload, None, patience, &format!("add {key:?}"))?;
        let (_, mut fields) = self.parse(&reply)?;
        fields
            .i64()
            .map_err(|err| self.error(StoreErrorKind::Protocol, err.to_string()))
    }

    fn wait_with(&self, keys: &[&str], timeout: Duration, patience: Patience) -> Result<()> {
        let mut payload = FieldWriter::new(WAIT).u64(keys.len() as u64);
        for key in keys {
            payload = payload.bytes(key.as_bytes());
        }
        let payload = payload.u64(timeout.as_millis() as u64).finish();
        let reply = self.request(payload, Some(timeout), patience, &format!("wait {keys:?}"))?;
        let (status, _) = self.parse(&reply)?;
        if status == protocol::TIMED_OUT {
            return Err(self.timeout_error(format!("store keys {keys:?}"), timeout));
        }
        Ok(())
    }

    fn check_with(&self, keys: &[&str], patience: Patience) -> Result<bool> {
        let mut payload = FieldWriter::new(CHECK).u64(keys.len() as u64);
        for key in keys {
            payload = payload.bytes(key.as_bytes());
        }
        let reply = self.request(payload.finish(), None, patience, "check")?;
        let (_, mut fields) = self.parse(&reply)?;
        Ok(fields
            .i64()
            .map_err(|err| self.error(StoreErrorKind::Protocol, err.to_string()))?
            != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::server::{FRAME_DEADLINE, HELLO_DEADLINE, MAX_STORED_BYTES};
    use crate::store::Store;
    use crate::store::{store_barrier, StoreServer};
    use std::io::Write;
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

    /// A server that answers the hello, then reads requests and never answers
    /// again: a store behind a link cut after the group formed.
    fn silent_store() -> std::net::SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let _hello = read_frame(&mut conn).unwrap();
            write_frame(&mut conn, &FieldWriter::new(protocol::OK).finish()).unwrap();
            while let Ok(Some(_)) = read_frame(&mut conn) {}
        });
        addr
    }

    #[test]
    fn an_impatient_request_gives_up_within_its_grace_and_the_connection_with_it() {
        let addr = silent_store();
        let client =
            TcpStoreClient::connect("127.0.0.1", addr.port(), Some(2), Duration::from_secs(20))
                .unwrap();
        let view = client.impatient(Duration::from_millis(300));
        let started = Instant::now();
        let err = view.check(&["duplicate"]).unwrap_err().to_string();
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_secs(2),
            "{took:?} (the usual bound is 25 s)"
        );
        assert!(
            err.contains("rank 2") && err.contains("did not answer check within 0.3s"),
            "{err}"
        );
        // Its reply may still come: nothing more is sent on that connection,
        // through the view or not.
        let started = Instant::now();
        let err = view.set("blame/2", b"0").unwrap_err().to_string();
        assert!(err.contains("given up earlier"), "{err}");
        let err = client
            .get("k", Duration::from_secs(5))
            .unwrap_err()
            .to_string();
        assert!(err.contains("given up earlier"), "{err}");
        assert!(started.elapsed() < Duration::from_millis(100));
        // A get's own wait comes first, then the grace.
        let client = TcpStoreClient::connect(
            "127.0.0.1",
            silent_store().port(),
            Some(2),
            Duration::from_secs(20),
        )
        .unwrap();
        let started = Instant::now();
        let view = client.impatient(Duration::from_millis(200));
        assert!(view.get("k", Duration::from_millis(300)).is_err());
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(450) && took < Duration::from_secs(2),
            "{took:?}"
        );
    }

    /// A signal interrupts a read, which is then retried: the request still
    /// ends at its deadline. (With the socket's timeout alone each retry
    /// would wait it out in full again: the launcher's SIGTERMs to a rank
    /// that catches them kept it in its error path, past its deadline.)
    #[test]
    fn signals_do_not_stretch_a_request() {
        extern "C" fn ignore(_: libc::c_int) {}
        // SAFETY: a handler that does nothing, installed without SA_RESTART
        // (so a blocked read returns EINTR) for a signal nothing else uses.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = ignore as *const () as usize;
            libc::sigaction(libc::SIGUSR2, &action, std::ptr::null_mut());
        }
        let addr = silent_store();
        let client =
            TcpStoreClient::connect("127.0.0.1", addr.port(), Some(2), Duration::from_secs(20))
                .unwrap();
        let (id_tx, id_rx) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            // SAFETY: pthread_self has no preconditions.
            id_tx.send(unsafe { libc::pthread_self() }).unwrap();
            let started = Instant::now();
            let result = client.impatient(Duration::from_millis(600)).check(&["k"]);
            (result.is_err(), started.elapsed())
        });
        let thread = id_rx.recv().unwrap();
        let until = Instant::now() + Duration::from_secs(3);
        while !worker.is_finished() && Instant::now() < until {
            // SAFETY: the thread is not joined yet, so its id is valid.
            unsafe { libc::pthread_kill(thread, libc::SIGUSR2) };
            std::thread::sleep(Duration::from_millis(150));
        }
        let (failed, took) = worker.join().unwrap();
        assert!(failed && took < Duration::from_millis(1500), "{took:?}");
    }

    #[test]
    fn an_impatient_request_does_not_wait_long_for_a_busy_connection() {
        let addr = silent_store();
        let client = Arc::new(
            TcpStoreClient::connect("127.0.0.1", addr.port(), Some(1), Duration::from_secs(3))
                .unwrap(),
        );
        // Another thread's request holds the connection for its usual bound (8 s).
        let holder = Arc::clone(&client);
        let _busy = std::thread::spawn(move || holder.set("k", b"v"));
        std::thread::sleep(Duration::from_millis(100));
        let started = Instant::now();
        let err = client
            .impatient(Duration::from_millis(300))
            .check(&["k"])
            .unwrap_err()
            .to_string();
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(err.contains("stayed busy with another request"), "{err}");
    }

    #[test]
    fn binding_a_busy_port_names_the_fix() {
        let server = local_server();
        let err = StoreServer::bind(server.addr()).err().unwrap().to_string();
        assert!(err.contains("MASTER_PORT"), "{err}");
    }

    #[test]
    fn a_store_with_a_token_serves_only_clients_that_present_it() {
        let token = JobToken::new("job-a").unwrap();
        let server =
            StoreServer::bind_with_token("127.0.0.1:0".parse().unwrap(), Some(token.clone()))
                .unwrap();
        let port = server.addr().port();
        let connect = |token: Option<&JobToken>| {
            TcpStoreClient::connect_with_token(
                "127.0.0.1",
                port,
                Some(1),
                Duration::from_secs(10),
                token,
            )
        };
        let member = connect(Some(&token)).unwrap();
        member.set("secret", b"gradient address").unwrap();
        for stranger in [None, Some(JobToken::new("job-b").unwrap())] {
            let started = Instant::now();
            let err = connect(stranger.as_ref()).err().unwrap().to_string();
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "refused at once, not after the 10 s timeout"
            );
            assert!(
                err.contains("rank 1") && err.contains("BURN_DDP_JOB_TOKEN"),
                "{err}"
            );
        }
        // A raw request without a hello is refused and gets nothing.
        let mut raw = std::net::TcpStream::connect(server.addr()).unwrap();
        let get = FieldWriter::new(GET).bytes(b"secret").u64(0).finish();
        write_frame(&mut raw, &get).unwrap();
        let reply = read_frame(&mut raw).unwrap().unwrap();
        let (status, mut fields) = FieldReader::new(&reply).unwrap();
        assert_eq!(status, protocol::ERROR);
        assert!(fields.string().unwrap().contains("token"));
        assert!(
            read_frame(&mut raw).unwrap().is_none(),
            "closed after refusing"
        );
        assert_eq!(
            member.get("secret", Duration::from_secs(1)).unwrap(),
            b"gradient address"
        );
    }

    /// (The launcher's descriptor count is checked by the launcher's tests: this
    /// process runs other tests at the same time.)
    #[test]
    fn connect_close_cycles_leave_no_connections_behind() {
        let server = local_server();
        let member = client(&server, 0);
        for _ in 0..2_000 {
            drop(std::net::TcpStream::connect(server.addr()).unwrap());
        }
        // Let the server see the closes.
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.connection_count() > 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(server.connection_count(), 1, "only the member's");
        member.set("still", b"served").unwrap();
    }

    #[test]
    fn idle_and_stalled_connections_do_not_block_members() {
        let token = JobToken::new("job-c").unwrap();
        let server =
            StoreServer::bind_with_token("127.0.0.1:0".parse().unwrap(), Some(token.clone()))
                .unwrap();
        let idle: Vec<_> = (0..500)
            .map(|_| std::net::TcpStream::connect(server.addr()).unwrap())
            .collect();
        let mut stalled = std::net::TcpStream::connect(server.addr()).unwrap();
        stalled.write_all(&[200, 0]).unwrap(); // half a length prefix, then nothing
        let started = Instant::now();
        let members: Vec<_> = (0..4)
            .map(|rank| {
                let token = token.clone();
                let port = server.addr().port();
                std::thread::spawn(move || {
                    let c = TcpStoreClient::connect_with_token(
                        "127.0.0.1",
                        port,
                        Some(rank),
                        Duration::from_secs(5),
                        Some(&token),
                    )
                    .unwrap();
                    store_barrier(&c, "b/0", 4, Duration::from_secs(5))
                })
            })
            .collect();
        for member in members {
            member.join().unwrap().unwrap();
        }
        assert!(started.elapsed() < Duration::from_secs(8));
        // Strangers that never say hello are closed after the hello deadline.
        let mut probe = [0u8; 1];
        stalled
            .set_read_timeout(Some(HELLO_DEADLINE + Duration::from_secs(5)))
            .unwrap();
        use std::io::Read;
        assert_eq!(stalled.read(&mut probe).unwrap(), 0, "closed by the server");
        let deadline = Instant::now() + Duration::from_secs(5);
        while server.connection_count() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(server.connection_count(), 0);
        drop(idle);
    }

    #[test]
    fn a_frame_that_stalls_midway_is_dropped_after_the_frame_deadline() {
        let server = local_server();
        let member = client(&server, 0);
        let mut stalled = std::net::TcpStream::connect(server.addr()).unwrap();
        let hello = FieldWriter::new(HELLO).bytes(b"").i64(-1).finish();
        write_frame(&mut stalled, &hello).unwrap();
        assert!(read_frame(&mut stalled).unwrap().is_some());
        stalled.write_all(&[100, 0, 0, 0, 1]).unwrap(); // 1 of 100 promised bytes
        let started = Instant::now();
        stalled
            .set_read_timeout(Some(FRAME_DEADLINE + Duration::from_secs(5)))
            .unwrap();
        use std::io::Read;
        let mut probe = [0u8; 1];
        assert_eq!(stalled.read(&mut probe).unwrap(), 0, "closed by the server");
        assert!(started.elapsed() >= FRAME_DEADLINE - Duration::from_millis(500));
        member.set("k", b"v").unwrap();
    }

    #[test]
    fn the_store_refuses_to_grow_past_its_cap() {
        let server = local_server();
        let c = client(&server, 2);
        let chunk = vec![7u8; 8 << 20];
        let mut stored = 0;
        let err = loop {
            match c.set(&format!("big/{stored}"), &chunk) {
                Ok(()) => stored += 1,
                Err(err) => break err.to_string(),
            }
            assert!(stored <= MAX_STORED_BYTES / chunk.len(), "no cap");
        };
        assert!(
            err.contains("rank 2") && err.contains("store is full"),
            "{err}"
        );
        // Overwriting a key does not count twice; the store keeps serving.
        c.set("big/0", &chunk).unwrap();
        assert_eq!(c.add("n", 1).unwrap(), 1);
    }

    #[test]
    fn the_store_listens_only_where_the_master_address_points() {
        let local = StoreServer::bind_master("127.0.0.1", 0, None).unwrap();
        assert!(local.addr().ip().is_loopback(), "{}", local.addr());
        let named = StoreServer::bind_master("localhost", 0, None).unwrap();
        assert!(named.addr().ip().is_loopback(), "{}", named.addr());
        // An address this machine does not have (TEST-NET-3): every interface,
        // with a warning, rather than no store at all.
        let elsewhere = StoreServer::bind_master("203.0.113.7", 0, None).unwrap();
        assert!(
            elsewhere.addr().ip().is_unspecified(),
            "{}",
            elsewhere.addr()
        );
        let err = StoreServer::bind_master("no-such-host.invalid", 0, None)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("cannot resolve the master address"), "{err}");
    }
}
