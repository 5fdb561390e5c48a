//! A stand-in for the c10d `TCPStore` torchrun's agent hosts, written from the
//! protocol (not from burn-ddp's client), so tests can run ranks "under torchrun"
//! without PyTorch: one thread per connection, one shared map.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

const VALIDATE: u8 = 0;
const SET: u8 = 1;
const GET: u8 = 3;
const ADD: u8 = 4;
const CHECK: u8 = 5;
const WAIT: u8 = 6;
const CANCEL_WAIT: u8 = 12;
const MAGIC: u32 = 0x3C85_F7CE;
const STOP_WAITING: u8 = 0;
const WAIT_CANCELED: u8 = 1;

#[derive(Default)]
struct Shared {
    map: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
    changed: Condvar,
}

/// Serves the c10d store protocol on 127.0.0.1 until dropped (the accept
/// thread then lingers harmlessly until the test process exits).
pub struct C10dTestServer {
    port: u16,
    shared: Arc<Shared>,
}

impl C10dTestServer {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared::default());
        let for_accept = Arc::clone(&shared);
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let shared = Arc::clone(&for_accept);
                std::thread::spawn(move || {
                    let _ = serve(conn, &shared);
                });
            }
        });
        Self { port, shared }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Every key set so far (to check the namespace clients used).
    pub fn keys(&self) -> Vec<String> {
        let map = self.shared.map.lock().unwrap();
        let mut keys: Vec<String> = map
            .keys()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        keys.sort();
        keys
    }
}

fn serve(mut conn: TcpStream, shared: &Shared) -> std::io::Result<()> {
    // Like the real server, the first message must validate the connection.
    if read_u8(&mut conn)? != VALIDATE || read_u32(&mut conn)? != MAGIC {
        return Ok(()); // hang up
    }
    loop {
        match read_u8(&mut conn)? {
            SET => {
                let key = read_bytes(&mut conn)?;
                let value = read_bytes(&mut conn)?;
                shared.map.lock().unwrap().insert(key, value);
                shared.changed.notify_all();
            }
            GET => {
                let key = read_bytes(&mut conn)?;
                let value = shared.map.lock().unwrap().get(&key).cloned();
                let value = value.unwrap_or_default();
                conn.write_all(&(value.len() as u64).to_le_bytes())?;
                conn.write_all(&value)?;
            }
            ADD => {
                let key = read_bytes(&mut conn)?;
                let delta = i64::from_le_bytes(read_array(&mut conn)?);
                let mut map = shared.map.lock().unwrap();
                let old = map
                    .get(&key)
                    .map(|v| String::from_utf8_lossy(v).parse::<i64>().unwrap())
                    .unwrap_or(0);
                map.insert(key, (old + delta).to_string().into_bytes());
                drop(map);
                shared.changed.notify_all();
                conn.write_all(&(old + delta).to_le_bytes())?;
            }
            CHECK => {
                let keys = read_keys(&mut conn)?;
                let map = shared.map.lock().unwrap();
                let ready = keys.iter().all(|k| map.contains_key(k));
                conn.write_all(&[if ready { 0 } else { 1 }])?;
            }
            WAIT => {
                let keys = read_keys(&mut conn)?;
                let reply = wait_or_cancel(&mut conn, shared, &keys)?;
                conn.write_all(&[reply])?;
            }
            _ => return Ok(()), // unknown command: hang up, as the real server does
        }
    }
}

/// Waits until every key is set (STOP_WAITING) or the client withdraws the
/// wait with CANCEL_WAIT (WAIT_CANCELED), whichever comes first.
fn wait_or_cancel(conn: &mut TcpStream, shared: &Shared, keys: &[Vec<u8>]) -> std::io::Result<u8> {
    loop {
        let map = shared.map.lock().unwrap();
        if keys.iter().all(|k| map.contains_key(k)) {
            return Ok(STOP_WAITING);
        }
        drop(
            shared
                .changed
                .wait_timeout(map, Duration::from_millis(20))
                .unwrap(),
        );
        conn.set_nonblocking(true)?;
        let mut byte = [0u8; 1];
        let peeked = conn.peek(&mut byte);
        conn.set_nonblocking(false)?;
        match peeked {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(_) if byte[0] == CANCEL_WAIT => {
                read_u8(conn)?;
                return Ok(WAIT_CANCELED);
            }
            Ok(_) => return Err(std::io::ErrorKind::InvalidData.into()),
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(err) => return Err(err),
        }
    }
}

fn read_array<const N: usize>(conn: &mut TcpStream) -> std::io::Result<[u8; N]> {
    let mut buf = [0u8; N];
    conn.read_exact(&mut buf)?;
    Ok(buf)
}

fn read_u8(conn: &mut TcpStream) -> std::io::Result<u8> {
    Ok(read_array::<1>(conn)?[0])
}

fn read_u32(conn: &mut TcpStream) -> std::io::Result<u32> {
    Ok(u32::from_le_bytes(read_array(conn)?))
}

fn read_bytes(conn: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let len = u64::from_le_bytes(read_array(conn)?) as usize;
    let mut buf = vec![0u8; len];
    conn.read_exact(&mut buf)?;
    Ok(buf)
}

fn read_keys(conn: &mut TcpStream) -> std::io::Result<Vec<Vec<u8>>> {
    let count = u64::from_le_bytes(read_array(conn)?);
    (0..count).map(|_| read_bytes(conn)).collect()
}
