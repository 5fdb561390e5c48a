//! Passing workers' output through, optionally prefixed and copied to log files.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Where one worker's lines go.
#[derive(Clone)]
pub struct LineSink {
    prefix: Option<String>,
    log: Option<Arc<Mutex<File>>>,
}

impl LineSink {
    /// A sink for `rank`; `log_dir` adds `rank_N.log` there.
    pub fn new(rank: usize, prefix: bool, log_dir: Option<&Path>) -> io::Result<Self> {
        let log = match log_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                let file = File::create(dir.join(format!("rank_{rank}.log")))?;
                Some(Arc::new(Mutex::new(file)))
            }
            None => None,
        };
        Ok(Self {
            prefix: prefix.then(|| format!("[rank {rank}] ")),
            log,
        })
    }

    /// Copies `stream` line by line to the launcher's stdout or stderr.
    pub fn pump(self, stream: impl Read + Send + 'static, to_stderr: bool) -> JoinHandle<()> {
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stream);
            let mut line = Vec::new();
            loop {
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                if !line.ends_with(b"\n") {
                    line.push(b'\n');
                }
                let mut out = Vec::with_capacity(line.len() + 12);
                if let Some(prefix) = &self.prefix {
                    out.extend_from_slice(prefix.as_bytes());
                }
                out.extend_from_slice(&line);
                // The launcher's own output going away (a closed pipe) must not
                // stop the worker: keep draining.
                let _ = if to_stderr {
                    io::stderr().lock().write_all(&out)
                } else {
                    io::stdout().lock().write_all(&out)
                };
                if let Some(log) = &self.log {
                    let _ = log.lock().unwrap().write_all(&line);
                }
            }
        })
    }
}
