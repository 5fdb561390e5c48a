//! Running the example programs and the launcher from tests: where cargo put
//! them, a scratch folder, a bounded run with its output, the toy trainer's
//! losses. Shared by the Burn 0.21 and Burn 0.22 trainers' tests.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// target/debug (or release), where cargo put the examples and the launcher.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

pub fn example(name: &str) -> PathBuf {
    let path = target_dir().join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo test --workspace`",
        path.display()
    );
    path
}

pub fn launcher() -> PathBuf {
    let path = target_dir().join("burn-ddp-run");
    assert!(
        path.exists(),
        "{} is missing: run `cargo test --workspace`, which builds the launcher",
        path.display()
    );
    path
}

pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("burn-ddp-examples-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `cmd` in `dir`, killing it after `limit`. Output is read while the
/// program runs, so a chatty one cannot fill the pipe and stall.
pub fn run(mut cmd: Command, dir: &Path, limit: Duration) -> Output {
    // The test's own RUST_LOG must not change what a program prints.
    if cmd.get_envs().all(|(name, _)| name != "RUST_LOG") {
        cmd.env_remove("RUST_LOG");
    }
    cmd.current_dir(dir)
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("starting the example");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("{cmd:?} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn assert_success(out: &Output) {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        stdout(out),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `(epoch, loss)` from the toy trainer's "Epoch e/E, Avg Loss: x" lines.
pub fn toy_losses(text: &str) -> Vec<(usize, f64)> {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("Epoch ")?;
            let (epoch, rest) = rest.split_once('/')?;
            let loss = rest.split("Avg Loss: ").nth(1)?;
            Some((epoch.parse().ok()?, loss.trim().parse().ok()?))
        })
        .collect()
}

pub fn relative(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

/// Ctrl-C at the terminal (SIGINT to the launcher and every worker, then the
/// launcher's forwarded copy): both ranks stop before the same step within
/// seconds, rank 0 names the checkpoint to go on from, the launcher exits
/// 130, and the run goes on from that checkpoint. For the toy trainer of
/// either Burn version (`toy`, `toy22`).
pub fn toy_ctrl_c_then_resume(toy: &Path, name: &str) {
    let dir = scratch(name);
    let mut cmd = Command::new(launcher());
    cmd.args(["--standalone", "--nproc-per-node", "2", "--prefix-output"])
        .arg(toy)
        .args([
            "--epochs",
            "100000",
            "--batch-size",
            "4",
            "--save-interval",
            "1",
        ]);
    let mut job = Interactive::start(cmd, &dir);
    job.wait_for("[rank 0] Epoch 2/100000", Duration::from_secs(120));
    job.ctrl_c();
    let (out, elapsed) = job.wait(Duration::from_secs(60));
    let text = stdout(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{text}\n{stderr}");
    // Well under the launcher's 30 s shutdown timeout: the ranks stopped by
    // themselves.
    assert!(
        elapsed < Duration::from_secs(20),
        "{elapsed:?} from Ctrl-C to the end"
    );
    let stopped: Vec<&str> = text
        .lines()
        .filter_map(|line| {
            line.split_once(" stopped by SIGINT before ")
                .map(|(_, at)| at)
        })
        .collect();
    assert_eq!(stopped.len(), 2, "{text}");
    assert_eq!(
        stopped[0], stopped[1],
        "the ranks stopped at different steps: {text}"
    );
    let resume = text
        .lines()
        .find_map(|line| {
            line.split_once("go on with --resume ")
                .map(|(_, path)| path)
        })
        .unwrap_or_else(|| panic!("rank 0 named no checkpoint:\n{text}"));
    // model_epoch_N.mpk (Burn 0.21) or model_epoch_N.ckpt (Burn 0.22).
    let epochs_done: usize = Path::new(resume)
        .file_stem()
        .and_then(|stem| stem.to_str()?.rsplit('_').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no epoch in {resume}"));
    assert!(epochs_done >= 2, "{resume}");
    let mut again = Command::new(launcher());
    again
        .args(["--standalone", "--nproc-per-node", "2"])
        .arg(toy)
        .args(["--batch-size", "4", "--resume", resume])
        .arg("--epochs")
        .arg((epochs_done + 1).to_string());
    let out = run(again, &dir, Duration::from_secs(120));
    assert_success(&out);
    assert!(
        stdout(&out).contains(&format!("at epoch {epochs_done}")),
        "{}",
        stdout(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The real MNIST files of the project's shared data, from a package's
/// manifest folder (`env!("CARGO_MANIFEST_DIR")`) up to the `shared` beside
/// the checkout.
pub fn mnist_data(manifest_dir: &str) -> PathBuf {
    let dir = Path::new(manifest_dir)
        .ancestors()
        .map(|d| d.join("../shared/data/mnist"))
        .find(|d| d.join("train-images-idx3-ubyte.gz").is_file())
        .unwrap_or_else(|| {
            panic!(
                "the real MNIST files are expected in ../shared/data/mnist beside {manifest_dir}"
            )
        });
    dir
}

/// The number after `name=` in one of the MNIST trainer's `epoch=...` lines.
pub fn field(line: &str, name: &str) -> f64 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .map(|v| v.trim_end_matches(['%', 's']).parse().unwrap())
        .unwrap_or_else(|| panic!("no {name} in {line:?}"))
}

/// A program started as a terminal would start it: in a process group of its
/// own, so [`Interactive::ctrl_c`] reaches it and everything it started, as
/// the terminal's Ctrl-C does. Its output is collected while it runs.
pub struct Interactive {
    child: std::process::Child,
    started: Instant,
    stdout: std::sync::Arc<std::sync::Mutex<String>>,
    stderr: std::thread::JoinHandle<Vec<u8>>,
    reader: std::thread::JoinHandle<()>,
}

impl Interactive {
    /// Starts `cmd` in `dir` (as [`run`] does, without the launcher's
    /// variables of the test's own environment).
    pub fn start(mut cmd: Command, dir: &Path) -> Self {
        use std::os::unix::process::CommandExt;
        if cmd.get_envs().all(|(name, _)| name != "RUST_LOG") {
            cmd.env_remove("RUST_LOG");
        }
        cmd.current_dir(dir)
            .env_remove("RANK")
            .env_remove("WORLD_SIZE")
            .process_group(0)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().expect("starting the program");
        let stdout = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut pipe = child.stdout.take().unwrap();
        let collected = std::sync::Arc::clone(&stdout);
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                collected
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let mut err_pipe = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = err_pipe.read_to_end(&mut bytes);
            bytes
        });
        Self {
            child,
            started: Instant::now(),
            stdout,
            stderr,
            reader,
        }
    }

    /// The program's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The output so far.
    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// Waits until the output holds `needle`; kills the group and panics
    /// after `limit` or when the program ends first.
    pub fn wait_for(&mut self, needle: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.stdout().contains(needle) {
            let ended = self.child.try_wait().unwrap().is_some();
            if ended || Instant::now() > deadline {
                self.signal(libc::SIGKILL);
                panic!(
                    "no {needle:?} after {:?} ({}):\n{}",
                    self.started.elapsed(),
                    if ended {
                        "the program ended"
                    } else {
                        "timed out"
                    },
                    self.stdout()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` to the whole process group.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill on our own child's process group.
        unsafe { libc::kill(-(self.child.id() as libc::pid_t), signal) };
    }

    /// SIGINT to the whole group, as the terminal's Ctrl-C.
    pub fn ctrl_c(&self) {
        self.signal(libc::SIGINT);
    }

    /// Waits for the end (killing the group after `limit`); the output and
    /// how long the wait took.
    pub fn wait(mut self, limit: Duration) -> (Output, Duration) {
        let waited = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            if waited.elapsed() > limit {
                self.signal(libc::SIGKILL);
                break self.child.wait().unwrap();
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let elapsed = waited.elapsed();
        let _ = self.reader.join();
        let stdout = self.stdout.lock().unwrap().clone().into_bytes();
        let stderr = self.stderr.join().unwrap_or_default();
        (
            Output {
                status,
                stdout,
                stderr,
            },
            elapsed,
        )
    }
}

/// The pid of the launcher `launcher`'s worker for `rank` (a child of it
/// with `RANK=<rank>` in its environment), if running.
pub fn worker_pid(launcher: u32, rank: usize) -> Option<i32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // pid (comm) state ppid ...: the comm may hold spaces, so from the ')'.
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            let environ = std::fs::read(entry.path().join("environ")).ok()?;
            let rank_var = format!("RANK={rank}");
            let is_rank = environ
                .split(|b| *b == 0)
                .any(|var| var == rank_var.as_bytes());
            (ppid == launcher && is_rank).then_some(pid)
        })
}

/// The toy trainer `toy` over 2 machines x 2 ranks x batch 32 (network
/// namespaces, a launcher on each, TCP between them) computes what one
/// process computes with batch 128 (skipped without root and `ip`, unless
/// the test bed is required).
pub fn toy_on_two_machines_equals_one_big_batch(toy: &Path, name: &str) {
    let Some(machines) = crate::Machines::create(2).unwrap() else {
        return;
    };
    let dir = scratch(&format!("{name}-machines"));
    let args = [
        "--epochs",
        "2",
        "--batch_size",
        "32",
        "--loss-precision",
        "9",
    ];
    let runs: Vec<_> = (0..2)
        .map(|node| {
            let mut cmd = machines.command_in(node, &dir, launcher().to_str().unwrap());
            cmd.args(["--nnodes", "2", "--node-rank", &node.to_string()])
                .args(["--nproc-per-node", "2", "--master-port", "29500"])
                .args(["--master-addr", &machines.addr(0).to_string()])
                .arg(toy)
                .args(args)
                .env("BURN_DDP_JOB_TOKEN", format!("{name}-on-two-machines"));
            let dir = dir.clone();
            std::thread::spawn(move || run(cmd, &dir, Duration::from_secs(300)))
        })
        .collect();
    let outs: Vec<Output> = runs.into_iter().map(|r| r.join().unwrap()).collect();
    for out in &outs {
        assert_success(out);
    }
    let distributed = toy_losses(&stdout(&outs[0]));
    assert_eq!(distributed.len(), 2, "{}", stdout(&outs[0]));

    let single_dir = scratch(&format!("{name}-machines-single"));
    let mut one = Command::new(toy);
    one.args([
        "--epochs",
        "2",
        "--batch-size",
        "128",
        "--loss-precision",
        "9",
    ]);
    let out = run(one, &single_dir, Duration::from_secs(300));
    assert_success(&out);
    let single = toy_losses(&stdout(&out));
    assert_eq!(single.len(), 2, "{}", stdout(&out));
    for ((e, a), (_, b)) in distributed.iter().zip(&single) {
        assert!(
            relative(*a, *b) < 1e-5,
            "epoch {e}: 4x32 over two machines gives {a}, 1x128 gives {b}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&single_dir);
}
