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
    /// A sink for `rank` in restart round `round` (`None` when the job is
    /// not restarted: no round in the prefix); `log_dir` adds `rank_N.log`
    /// there, begun afresh by round 0 and continued by later rounds.
    pub fn new(
        rank: usize,
        round: Option<u32>,
        prefix: bool,
        log_dir: Option<&Path>,
    ) -> io::Result<Self> {
        let log = match log_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                let path = dir.join(format!("rank_{rank}.log"));
                let mut file = match round {
                    Some(round) if round > 0 => {
                        File::options().append(true).create(true).open(path)?
                    }
                    _ => File::create(path)?,
                };
                if let Some(round) = round {
                    writeln!(file, "--- burn-ddp-run: round {round} ---")?;
                }
                Some(Arc::new(Mutex::new(file)))
            }
            None => None,
        };
        let label = match round {
            Some(round) => format!("[rank {rank} round {round}] "),
            None => format!("[rank {rank}] "),
        };
        Ok(Self {
            prefix: prefix.then_some(label),
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
