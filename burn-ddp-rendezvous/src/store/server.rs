//! The store's server: one thread serving every connection from an event loop.
//!
//! It runs inside the launcher (or rank 0), whose death ends the job, so no
//! client may pin it: a connection costs a buffer, not a thread (a flood of
//! connections is cheap to refuse); its socket is released when it closes; a
//! frame must arrive whole within [`FRAME_DEADLINE`]; a store with a job token
//! serves nothing before a matching hello (due within [`HELLO_DEADLINE`]); the
//! number of connections and the bytes stored are capped. Waiting requests
//! (`get`, `wait`) are parked and answered when their keys appear or their
//! time runs out.

use super::protocol::{self, ADD, CHECK, GET, HELLO, SET, WAIT};
use crate::error::{RendezvousError, Result, StoreErrorKind};
use crate::frame::{FieldReader, FieldWriter, MAX_FRAME_BYTES};
use crate::job::JobToken;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Connections served at once; more are closed on arrival. Each rank holds two.
pub const MAX_CONNECTIONS: usize = 8192;
/// Bytes of keys and values the store holds at most (it carries addresses and
/// ids, a few hundred bytes per rank).
pub const MAX_STORED_BYTES: usize = 64 << 20;
/// Time a frame may take to arrive once its first byte has.
pub const FRAME_DEADLINE: Duration = Duration::from_secs(10);
/// Time a new connection has to present the job token, when there is one.
pub const HELLO_DEADLINE: Duration = Duration::from_secs(10);

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const FIRST_CONNECTION: usize = 2;
/// Longest a parked request may wait, so every deadline is representable.
const MAX_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// What a client without the job's token is told.
pub(crate) const REFUSAL: &str = "this store serves one job only, and this process did not \
    present its token (BURN_DDP_JOB_TOKEN); start every rank from the same burn-ddp-run, or \
    export the same BURN_DDP_JOB_TOKEN to all of them";

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

    fn has_all(&self, keys: &[String]) -> bool {
        keys.iter().all(|key| self.map.contains_key(key))
    }
}

/// What the serving thread shares with the [`StoreServer`] handle.
#[derive(Default)]
struct Shared {
    values: Mutex<Values>,
    stopping: AtomicBool,
    connections: AtomicUsize,
}

/// A running store; stops (and disconnects every client) when dropped.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    waker: Arc<Waker>,
    thread: Option<JoinHandle<()>>,
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
            .map_err(|err| {
                RendezvousError::store(
                    None,
                    StoreErrorKind::Listen,
                    format!(
                        "cannot resolve the master address {host:?} ({err}); give a host \
                         name or address of this machine"
                    ),
                )
                .caused_by(err)
            })?
            .collect();
        let mut last_error = None;
        for addr in &resolved {
            match Self::start(*addr, token.clone()) {
                Ok(server) => return Ok(server),
                Err(err) => last_error = Some(err),
            }
        }
        // The address is not one of this machine's (the bind's own error says so).
        let not_local = |err: &RendezvousError| {
            std::error::Error::source(err)
                .and_then(|source| source.downcast_ref::<io::Error>())
                .is_some_and(|source| source.kind() == io::ErrorKind::AddrNotAvailable)
        };
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
            (_, None) => Err(RendezvousError::store(
                None,
                StoreErrorKind::Listen,
                format!("the master address {host:?} resolves to no address"),
            )),
        }
    }

    fn start(addr: SocketAddr, token: Option<JobToken>) -> Result<Self> {
        let fail = |message: String| RendezvousError::store(None, StoreErrorKind::Listen, message);
        let listener = TcpListener::bind(addr).map_err(|err| {
            let fix = if err.kind() == io::ErrorKind::AddrInUse {
                "another job (or a stale process) holds that port: set MASTER_PORT to a free \
                 port, or let burn-ddp-run --standalone pick one"
            } else {
                "check MASTER_ADDR names an address of this machine"
            };
            fail(format!("cannot listen on {addr}: {err}; {fix}")).caused_by(err)
        })?;
        let addr = listener
            .local_addr()
            .map_err(|err| fail(format!("cannot read the listening address: {err}")))?;
        let poll = Poll::new().map_err(|err| fail(format!("cannot start polling: {err}")))?;
        let waker = Arc::new(
            Waker::new(poll.registry(), WAKER)
                .map_err(|err| fail(format!("cannot start polling: {err}")))?,
        );
        let shared = Arc::new(Shared::default());
        let mut event_loop = EventLoop {
            poll,
            listener,
            connections: HashMap::new(),
            next_token: FIRST_CONNECTION,
            shared: Arc::clone(&shared),
            token,
            accept_paused_until: None,
            logged: Logged::default(),
        };
        event_loop
            .poll
            .registry()
            .register(&mut event_loop.listener, LISTENER, Interest::READABLE)
            .map_err(|err| fail(format!("cannot start polling: {err}")))?;
        let thread = std::thread::Builder::new()
            .name("burn-ddp-store".into())
            .spawn(move || event_loop.run())
            .map_err(|err| fail(format!("cannot start the store's thread: {err}")))?;
        Ok(Self {
            addr,
            shared,
            waker,
            thread: Some(thread),
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections open now (ranks, and anything not yet refused).
    pub fn connection_count(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// The keys under `prefix` and their values, read in this process (a
    /// launcher reads what its workers reported).
    pub fn entries(&self, prefix: &str) -> Vec<(String, Vec<u8>)> {
        let values = self.shared.values.lock().unwrap();
        let mut found: Vec<_> = values
            .map
            .iter()
            .filter(|(key, _)| key.starts_with(prefix))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        found.sort();
        found
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Each kind of trouble is logged once, so a scan cannot flood the log.
#[derive(Default)]
struct Logged {
    refusal: bool,
    full: bool,
    accept_error: bool,
}

fn log_once(flag: &mut bool, message: impl FnOnce() -> String) {
    if !std::mem::replace(flag, true) {
        log::warn!(
            "rendezvous store: {}; further ones are not logged",
            message()
        );
    }
}

/// A request parked until its keys exist or its deadline passes.
struct Parked {
    keys: Vec<String>,
    /// `get` answers with the value of its one key; `wait` with OK.
    get: bool,
    deadline: Instant,
}

struct Connection {
    stream: TcpStream,
    peer: SocketAddr,
    admitted: bool,
    opened: Instant,
    inbox: Vec<u8>,
    /// When the frame now arriving started; `None` between frames.
    frame_started: Option<Instant>,
    outbox: Vec<u8>,
    parked: Option<Parked>,
    /// Close once the outbox is written (after a refusal).
    closing: bool,
}

enum Outcome {
    Reply(Vec<u8>),
    Park(Parked),
    Refuse,
}

struct EventLoop {
    poll: Poll,
    listener: TcpListener,
    connections: HashMap<Token, Connection>,
    next_token: usize,
    shared: Arc<Shared>,
    token: Option<JobToken>,
    accept_paused_until: Option<Instant>,
    logged: Logged,
}

impl EventLoop {
    fn run(mut self) {
        let mut events = Events::with_capacity(256);
        while !self.shared.stopping.load(Ordering::SeqCst) {
            let timeout = self.next_deadline().map(|at| {
                at.saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1))
            });
            if let Err(err) = self.poll.poll(&mut events, timeout) {
                if err.kind() != io::ErrorKind::Interrupted {
                    log::error!("rendezvous store: polling failed ({err}); the store stops");
                    return;
                }
            }
            let mut ready = Vec::new();
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.accept_all(),
                    WAKER => {}
                    token => ready.push(token),
                }
            }
            if self
                .accept_paused_until
                .is_some_and(|until| Instant::now() >= until)
            {
                self.accept_paused_until = None;
                self.accept_all();
            }
            let mut changed = false;
            for token in ready {
                changed |= self.serve(token);
            }
            if changed {
                self.answer_parked();
            }
            self.expire();
        }
        // Dropping the connections closes them: clients see the store go.
        self.shared.connections.store(0, Ordering::SeqCst);
    }

    /// The earliest moment something times out.
    fn next_deadline(&self) -> Option<Instant> {
        let per_connection = self.connections.values().filter_map(|c| {
            let hello = (!c.admitted).then_some(c.opened + HELLO_DEADLINE);
            let frame = c.frame_started.map(|at| at + FRAME_DEADLINE);
            let parked = c.parked.as_ref().map(|p| p.deadline);
            [hello, frame, parked].into_iter().flatten().min()
        });
        per_connection.chain(self.accept_paused_until).min()
    }

    fn accept_all(&mut self) {
        if self.accept_paused_until.is_some() {
            return;
        }
        loop {
            let (mut stream, peer) = match self.listener.accept() {
                Ok(accepted) => accepted,
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => return,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => {
                    // Out of descriptors, mostly: back off instead of spinning.
                    log_once(&mut self.logged.accept_error, || {
                        format!("cannot accept a connection ({err})")
                    });
                    self.accept_paused_until = Some(Instant::now() + Duration::from_millis(50));
                    return;
                }
            };
            if self.connections.len() >= MAX_CONNECTIONS {
                log_once(&mut self.logged.full, || {
                    format!("{MAX_CONNECTIONS} connections are open; closed one from {peer}")
                });
                continue; // dropped: closed
            }
            let token = Token(self.next_token);
            self.next_token += 1;
            // Edge-triggered: writable fires once room frees up after a short write.
            let registered = self.poll.registry().register(
                &mut stream,
                token,
                Interest::READABLE | Interest::WRITABLE,
            );
            if registered.is_err() {
                continue;
            }
            let _ = stream.set_nodelay(true);
            self.connections.insert(
                token,
                Connection {
                    stream,
                    peer,
                    admitted: self.token.is_none(),
                    opened: Instant::now(),
                    inbox: Vec::new(),
                    frame_started: None,
                    outbox: Vec::new(),
                    parked: None,
                    closing: false,
                },
            );
            self.shared
                .connections
                .store(self.connections.len(), Ordering::SeqCst);
        }
    }

    /// Reads, handles and writes what one connection has ready. Returns whether
    /// the values changed (parked requests may now be answered).
    fn serve(&mut self, token: Token) -> bool {
        let Some(mut conn) = self.connections.remove(&token) else {
            return false;
        };
        let (keep, changed) = self.serve_connection(&mut conn);
        if keep {
            self.connections.insert(token, conn);
        } else {
            self.forget(conn);
        }
        changed
    }

    fn forget(&mut self, mut conn: Connection) {
        let _ = self.poll.registry().deregister(&mut conn.stream);
        if !conn.admitted {
            log_once(&mut self.logged.refusal, || {
                format!(
                    "closed a connection from {} that did not present this job's token \
                     (a process of another job, or a port scan)",
                    conn.peer
                )
            });
        }
        self.shared
            .connections
            .store(self.connections.len(), Ordering::SeqCst);
    }

    fn serve_connection(&mut self, conn: &mut Connection) -> (bool, bool) {
        if !flush(conn) {
            return (false, false);
        }
        if conn.closing {
            return (!conn.outbox.is_empty(), false);
        }
        let mut buf = [0u8; 16 << 10];
        loop {
            match conn.stream.read(&mut buf) {
                Ok(0) => return (false, false),
                Ok(n) => {
                    if conn.inbox.is_empty() {
                        conn.frame_started = Some(Instant::now());
                    }
                    conn.inbox.extend_from_slice(&buf[..n]);
                    if conn.inbox.len() > MAX_FRAME_BYTES + 4 + 64 {
                        return (false, false); // more than a frame ahead: not a client
                    }
                }
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return (false, false),
            }
        }
        let mut changed = false;
        // One request at a time: a parked one holds the rest back.
        while conn.parked.is_none() && !conn.closing {
            let Some(frame) = take_frame(conn) else { break };
            let Ok(frame) = frame else {
                return (false, changed); // a frame above the limit
            };
            match self.handle(conn, &frame) {
                (Outcome::Reply(reply), did_change) => {
                    changed |= did_change;
                    queue(conn, &reply);
                }
                (Outcome::Park(parked), _) => conn.parked = Some(parked),
                (Outcome::Refuse, _) => {
                    log_once(&mut self.logged.refusal, || {
                        format!(
                            "refused a connection from {} without this job's token (a \
                             process of another job, or a port scan)",
                            conn.peer
                        )
                    });
                    let refusal = FieldWriter::new(protocol::ERROR)
                        .bytes(REFUSAL.as_bytes())
                        .finish();
                    queue(conn, &refusal);
                    conn.closing = true;
                    conn.admitted = true; // already logged
                }
            }
        }
        let alive = flush(conn);
        (alive && !(conn.closing && conn.outbox.is_empty()), changed)
    }

    /// One request; returns its outcome and whether it changed the values.
    fn handle(&mut self, conn: &mut Connection, request: &[u8]) -> (Outcome, bool) {
        let (command, mut fields) = match FieldReader::new(request) {
            Ok(split) => split,
            Err(err) => return (error_reply(&err), false),
        };
        if command == HELLO {
            let presented = fields.bytes().unwrap_or_default();
            if self.token.as_ref().is_some_and(|t| !t.matches(presented)) {
                return (Outcome::Refuse, false);
            }
            conn.admitted = true;
            return (
                Outcome::Reply(FieldWriter::new(protocol::OK).finish()),
                false,
            );
        }
        if !conn.admitted {
            return (Outcome::Refuse, false);
        }
        match self.execute(command, &mut fields) {
            Ok(outcome) => outcome,
            Err(err) => (error_reply(&err), false),
        }
    }

    fn execute(
        &mut self,
        command: u8,
        fields: &mut FieldReader<'_>,
    ) -> io::Result<(Outcome, bool)> {
        let mut values = self.shared.values.lock().unwrap();
        let ok = || FieldWriter::new(protocol::OK);
        Ok(match command {
            SET => {
                let key = fields.string()?.to_owned();
                let value = fields.bytes()?.to_vec();
                values.insert(key, value)?;
                (Outcome::Reply(ok().finish()), true)
            }
            GET => {
                let key = fields.string()?.to_owned();
                let wait = Duration::from_millis(fields.u64()?);
                match values.map.get(&key) {
                    Some(value) => (Outcome::Reply(ok().bytes(value).finish()), false),
                    None => (Outcome::Park(parked(vec![key], true, wait)), false),
                }
            }
            ADD => {
                let key = fields.string()?.to_owned();
                let delta = fields.i64()?;
                let current = match values.map.get(&key) {
                    Some(bytes) => parse_counter(bytes)?,
                    None => 0,
                };
                let sum = current.checked_add(delta).ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("add of {delta} to {current} overflows a 64-bit counter"),
                    )
                })?;
                values.insert(key, sum.to_string().into_bytes())?;
                (Outcome::Reply(ok().i64(sum).finish()), true)
            }
            WAIT | CHECK => {
                let count = fields.u64()?;
                // Each key takes at least its 4-byte length: a count above what
                // the frame can hold is a lie, refused before allocating.
                if count > (MAX_FRAME_BYTES / 4) as u64 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("{count} keys in one request"),
                    ));
                }
                let keys = (0..count)
                    .map(|_| fields.string().map(str::to_owned))
                    .collect::<io::Result<Vec<_>>>()?;
                let ready = values.has_all(&keys);
                if command == CHECK {
                    (Outcome::Reply(ok().i64(ready as i64).finish()), false)
                } else {
                    let wait = Duration::from_millis(fields.u64()?);
                    if ready {
                        (Outcome::Reply(ok().finish()), false)
                    } else {
                        (Outcome::Park(parked(keys, false, wait)), false)
                    }
                }
            }
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("unknown store command {other}"),
                ))
            }
        })
    }

    /// Answers the parked requests whose keys now all exist.
    fn answer_parked(&mut self) {
        let mut answered = Vec::new();
        {
            let values = self.shared.values.lock().unwrap();
            for (token, conn) in &mut self.connections {
                let Some(parked) = &conn.parked else { continue };
                if !values.has_all(&parked.keys) {
                    continue;
                }
                let reply = if parked.get {
                    FieldWriter::new(protocol::OK)
                        .bytes(&values.map[&parked.keys[0]])
                        .finish()
                } else {
                    FieldWriter::new(protocol::OK).finish()
                };
                conn.parked = None;
                queue(conn, &reply);
                answered.push(*token);
            }
        }
        self.after_answers(answered);
    }

    /// Closes connections past their hello or frame deadline, and answers
    /// parked requests past theirs.
    fn expire(&mut self) {
        let now = Instant::now();
        let overdue: Vec<Token> = self
            .connections
            .iter()
            .filter(|(_, c)| {
                (!c.admitted && now >= c.opened + HELLO_DEADLINE)
                    || (c.frame_started.is_some_and(|at| now >= at + FRAME_DEADLINE)
                        && !holds_whole_frame(c))
            })
            .map(|(token, _)| *token)
            .collect();
        for token in overdue {
            if let Some(conn) = self.connections.remove(&token) {
                self.forget(conn);
            }
        }
        let mut answered = Vec::new();
        for (token, conn) in &mut self.connections {
            if conn.parked.as_ref().is_some_and(|p| now >= p.deadline) {
                conn.parked = None;
                queue(conn, &FieldWriter::new(protocol::TIMED_OUT).finish());
                answered.push(*token);
            }
        }
        self.after_answers(answered);
    }

    /// After answering parked requests: flush, and go on with the requests that
    /// came in behind them.
    fn after_answers(&mut self, tokens: Vec<Token>) {
        let mut changed = false;
        for token in tokens {
            changed |= self.serve(token);
        }
        if changed {
            self.answer_parked();
        }
    }
}

fn parked(keys: Vec<String>, get: bool, wait: Duration) -> Parked {
    Parked {
        keys,
        get,
        deadline: Instant::now() + wait.min(MAX_WAIT),
    }
}

fn error_reply(err: &io::Error) -> Outcome {
    Outcome::Reply(
        FieldWriter::new(protocol::ERROR)
            .bytes(err.to_string().as_bytes())
            .finish(),
    )
}

/// The next whole frame in the inbox: `None` while incomplete, `Err` for a
/// length above the limit.
fn take_frame(conn: &mut Connection) -> Option<std::result::Result<Vec<u8>, ()>> {
    if conn.inbox.len() < 4 {
        return None;
    }
    let len = u32::from_le_bytes(conn.inbox[..4].try_into().unwrap()) as usize;
    if len > MAX_FRAME_BYTES {
        return Some(Err(()));
    }
    if conn.inbox.len() < 4 + len {
        return None;
    }
    let frame = conn.inbox[4..4 + len].to_vec();
    conn.inbox.drain(..4 + len);
    conn.frame_started = (!conn.inbox.is_empty()).then(Instant::now);
    Some(Ok(frame))
}

/// Whether the inbox holds a whole frame (waiting behind a parked request).
fn holds_whole_frame(conn: &Connection) -> bool {
    conn.inbox.len() >= 4
        && conn.inbox.len() >= 4 + u32::from_le_bytes(conn.inbox[..4].try_into().unwrap()) as usize
}

fn queue(conn: &mut Connection, payload: &[u8]) {
    conn.outbox
        .extend_from_slice(&(payload.len() as u32).to_le_bytes());
    conn.outbox.extend_from_slice(payload);
}

/// Writes what the socket takes now; `false` if the connection is gone.
fn flush(conn: &mut Connection) -> bool {
    while !conn.outbox.is_empty() {
        match conn.stream.write(&conn.outbox) {
            Ok(0) => return false,
            Ok(n) => {
                conn.outbox.drain(..n);
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
    true
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
