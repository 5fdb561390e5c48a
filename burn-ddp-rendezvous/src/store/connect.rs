//! Reaching a store server, shared by both store clients.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
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
