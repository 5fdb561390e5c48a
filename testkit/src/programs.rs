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
