//! Reaching a store server, shared by both store clients.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Connects to `host:port`, retrying until `timeout` because the server (rank 0,
/// a launcher, torchrun's agent) may start after us. The error is one sentence
/// that already names MASTER_ADDR/MASTER_PORT.
pub(crate) fn connect_with_retry(
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<(SocketAddr, TcpStream), String> {
    let deadline = Instant::now() + timeout;
    loop {
        let attempt = (host, port)
            .to_socket_addrs()
            .map_err(|err| format!("cannot resolve MASTER_ADDR {host:?}: {err}"))
            .and_then(|mut addrs| {
                addrs
                    .next()
                    .ok_or_else(|| format!("MASTER_ADDR {host:?} resolves to no address"))
            })
            .and_then(|addr| {
                TcpStream::connect_timeout(&addr, Duration::from_secs(2))
                    .map(|conn| (addr, conn))
                    .map_err(|err| format!("cannot connect to {addr}: {err}"))
            });
        let last_error = match attempt {
            Ok((addr, conn)) => {
                conn.set_nodelay(true)
                    .map_err(|err| format!("cannot configure the connection to {addr}: {err}"))?;
                return Ok((addr, conn));
            }
            Err(message) => message,
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
