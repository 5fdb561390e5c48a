//! The example trainers end to end: real processes through the launcher.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use burn_ddp_testkit::mnist_learner::{self, MnistLearner};
use burn_ddp_testkit::programs::{
    assert_success, example, field, launcher, mnist_data, relative, run, scratch, stdout,
    toy_ctrl_c_then_resume, toy_losses, worker_pid, Interactive,
};

#[test]
fn toy_two_ranks_equal_one_big_batch_and_resume_from_a_checkpoint() {
    let dir = scratch("toy");
    let toy = example("toy");
    let mut two = Command::new(launcher());
    two.args(["--standalone", "--nproc-per-node", "2"])
        .arg(&toy)
        .args([
            "--epochs",
            "4",
            "--batch_size",
            "64",
            "--loss-precision",
            "9",
        ]);
    let out = run(two, &dir, Duration::from_secs(300));
    assert_success(&out);
    let distributed = toy_losses(&stdout(&out));
    assert_eq!(
        distributed.iter().map(|(e, _)| *e).collect::<Vec<_>>(),
        vec![1, 2, 3, 4]
    );
    assert!(
        distributed[3].1 < distributed[0].1,
        "the loss should fall: {distributed:?}"
    );
    assert_eq!(stdout(&out).matches("starting training").count(), 2);
    for epoch in [2, 4] {
        assert!(dir.join(format!("model_epoch_{epoch}.mpk")).is_file());
    }
    // The run's hyper-parameters, a Burn Config, beside the checkpoints.
    let config = std::fs::read_to_string(dir.join("toy_config.json")).unwrap();
    for field in ["\"batch_size\": 64", "\"world_size\": 2", "\"lr\": 0.01"] {
        assert!(config.contains(field), "{field} missing from {config}");
    }
    // By default the libraries' debug records stay hidden.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("DEBUG"), "{stderr}");

    // One process with batch 2 x 64 computes the same thing.
    let single_dir = scratch("toy-single");
    let mut one = Command::new(&toy);
    one.args([
        "--epochs",
        "4",
        "--batch-size",
        "128",
        "--loss-precision",
        "9",
    ]);
    let out = run(one, &single_dir, Duration::from_secs(300));
    assert_success(&out);
    let single = toy_losses(&stdout(&out));
    for ((e, a), (_, b)) in distributed.iter().zip(&single) {
        assert!(
            relative(*a, *b) < 1e-5,
            "epoch {e}: 2x64 gives {a}, 1x128 gives {b}"
        );
    }

    // Resuming from epoch 2 continues where that run was; RUST_LOG shows what
    // the libraries do, each record naming its rank.
    let mut resume = Command::new(launcher());
    resume
        .env("RUST_LOG", "burn_ddp=debug")
        .args(["--standalone", "--nproc-per-node", "2"])
        .arg(&toy)
        .args([
            "--epochs",
            "4",
            "--loss-precision",
            "9",
            "--resume",
            "model_epoch_2.mpk",
        ]);
    let out = run(resume, &dir, Duration::from_secs(300));
    assert_success(&out);
    assert!(stdout(&out).contains("at epoch 2"), "{}", stdout(&out));
    let resumed = toy_losses(&stdout(&out));
    assert_eq!(
        resumed.iter().map(|(e, _)| *e).collect::<Vec<_>>(),
        vec![3, 4]
    );
    for ((e, a), (_, b)) in resumed.iter().zip(&distributed[2..]) {
        assert!(
            relative(*a, *b) < 1e-5,
            "epoch {e}: resumed {a}, uninterrupted {b}"
        );
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    for record in [
        "rank 0: all 2 ranks joined",
        "rank 1: process group of 2 ready over shm",
        "rank 0: 2 parameters in 1 bucket(s)",
        "rank 1: gradient sync of 44 bytes in 1 bucket(s)",
    ] {
        assert!(
            stderr.contains(record),
            "{record:?} missing from:\n{stderr}"
        );
    }
    assert!(!stderr.contains("other hyper-parameters"), "{stderr}");

    // A resume with another learning rate says what changed.
    let mut changed = Command::new(&toy);
    changed.args(["--epochs", "3", "--resume", "model_epoch_2", "--lr", "0.02"]);
    changed.args(["--batch-size", "128"]);
    let out = run(changed, &dir, Duration::from_secs(300));
    assert_success(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("other hyper-parameters")
            && stderr.contains("lr: 0.01 -> 0.02")
            && stderr.contains("world_size: 2 -> 1")
            && !stderr.contains("epochs:"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&single_dir);
}

/// The trainers' command lines: clap's help, version, typo suggestions and
/// usage errors (exit 2), the reference scripts' underscore spellings.
/// `--global-batch-size 128` on 2 ranks is 64 per rank's loader and trains
/// as one process with batch 128; 64 over 3 ranks is refused on every rank
/// before any data is touched, naming the multiples that would work.
#[test]
fn toy_global_batch_size_splits_over_the_ranks_or_is_refused() {
    let dir = scratch("toy-global-batch");
    let toy = example("toy");
    let mut two = Command::new(launcher());
    two.args(["--standalone", "--nproc-per-node", "2"])
        .arg(&toy)
        .args([
            "--epochs",
            "2",
            "--global-batch-size",
            "128",
            "--loss-precision",
            "9",
        ]);
    let out = run(two, &dir, Duration::from_secs(300));
    assert_success(&out);
    let split = toy_losses(&stdout(&out));
    let config = std::fs::read_to_string(dir.join("toy_config.json")).unwrap();
    assert!(config.contains("\"batch_size\": 64"), "{config}");

    let single_dir = scratch("toy-global-batch-single");
    let mut one = Command::new(&toy);
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
    assert_eq!(split.len(), 2);
    for ((e, a), (_, b)) in split.iter().zip(&single) {
        assert!(
            relative(*a, *b) < 1e-5,
            "epoch {e}: 2 ranks {a}, one process {b}"
        );
    }

    let mut three = Command::new(launcher());
    three
        .args(["--standalone", "--nproc-per-node", "3"])
        .arg(&toy)
        .args(["--global-batch-size", "64"]);
    let out = run(three, &dir, Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The first rank to fail ends the others, which may not get to print.
    assert!(
        (0..3).any(|rank| stderr.contains(&format!(
            "rank {rank}: a global batch of 64 does not divide over 3 ranks"
        ))),
        "{stderr}"
    );
    assert!(stderr.contains("such as 63 or 66"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&single_dir);
}

/// Ctrl-C at the terminal stops both ranks before the same step; the run goes
/// on from the checkpoint rank 0 names.
#[test]
fn toy_ctrl_c_stops_every_rank_before_the_same_step() {
    toy_ctrl_c_then_resume(&example("toy"), "toy-ctrl-c");
}

#[test]
fn trainer_command_lines() {
    let dir = scratch("cli");
    for name in ["toy", "mnist"] {
        let invoke = |args: &[&str]| {
            let mut cmd = Command::new(example(name));
            cmd.args(args);
            let out = run(cmd, &dir, Duration::from_secs(60));
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            (out, stderr)
        };
        let (out, _) = invoke(&["--version"]);
        assert_success(&out);
        assert_eq!(
            stdout(&out).trim(),
            format!("{name} {}", env!("CARGO_PKG_VERSION"))
        );
        let (out, _) = invoke(&["--help"]);
        assert_success(&out);
        let help = stdout(&out);
        assert!(
            help.contains("--batch-size") && help.contains("batch_size"),
            "{help}"
        );
        for (args, expect) in [
            (&["--batch-sise", "3"][..], "--batch-size"),
            (&["--batch_size", "0"][..], "not a positive integer"),
            (&["--backend", "tpu"][..], "flex, ndarray, cuda"),
            (
                &["--batch-size", "8", "--global-batch-size", "16"][..],
                "cannot be used with",
            ),
            (&["--global-batch-size", "0"][..], "not a positive integer"),
        ] {
            let (out, stderr) = invoke(args);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
            assert!(stderr.contains(expect), "{args:?}: {stderr}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn toy_resume_from_a_missing_checkpoint_names_the_file() {
    let dir = scratch("toy-missing");
    let mut cmd = Command::new(example("toy"));
    cmd.args(["--resume", "nowhere/model_epoch_9"]);
    let out = run(cmd, &dir, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("nowhere/model_epoch_9.mpk") && stderr.contains("rank 0"),
        "{stderr}"
    );
}

#[test]
fn mnist_short_run_on_two_ranks_learns_and_saves_the_model() {
    let dir = scratch("mnist");
    let mut cmd = Command::new(launcher());
    cmd.args(["--standalone", "--nproc-per-node", "2"])
        .arg(example("mnist"))
        .arg("--data-dir")
        .arg(mnist_data(env!("CARGO_MANIFEST_DIR")))
        .args([
            "--train-samples",
            "640",
            "--test-samples",
            "300",
            "--epochs",
            "2",
            "--batch-size",
            "32",
        ]);
    let out = run(cmd, &dir, Duration::from_secs(600));
    assert_success(&out);
    let text = stdout(&out);
    let epochs: Vec<&str> = text.lines().filter(|l| l.starts_with("epoch=")).collect();
    assert_eq!(
        epochs.len(),
        2,
        "rank 0 alone logs, once per epoch:\n{text}"
    );
    let (first, last) = (field(epochs[0], "avg_loss"), field(epochs[1], "avg_loss"));
    assert!(last < first, "the loss should fall: {first} then {last}");
    let accuracy = field(epochs[1], "test_acc");
    assert!(
        accuracy > 50.0,
        "640 samples should already beat chance by far: {accuracy}%"
    );
    assert!(dir.join("mnist_ddp.mpk").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Writes an IDX file of unsigned bytes.
fn write_idx(path: &Path, magic: u32, dims: &[u32], data: &[u8]) {
    let mut bytes = magic.to_be_bytes().to_vec();
    for d in dims {
        bytes.extend_from_slice(&d.to_be_bytes());
    }
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).unwrap();
}

fn small_mnist(dir: &Path, train: u32, test: u32) {
    let images = |n: u32| (0..n * 784).map(|i| (i % 251) as u8).collect::<Vec<u8>>();
    let labels = |n: u32| (0..n).map(|i| (i % 10) as u8).collect::<Vec<u8>>();
    write_idx(
        &dir.join("train-images-idx3-ubyte"),
        0x803,
        &[train, 28, 28],
        &images(train),
    );
    write_idx(
        &dir.join("train-labels-idx1-ubyte"),
        0x801,
        &[train],
        &labels(train),
    );
    write_idx(
        &dir.join("t10k-images-idx3-ubyte"),
        0x803,
        &[test, 28, 28],
        &images(test),
    );
    write_idx(
        &dir.join("t10k-labels-idx1-ubyte"),
        0x801,
        &[test],
        &labels(test),
    );
}

#[test]
fn mnist_reads_uncompressed_idx_files_the_test_writes() {
    let dir = scratch("mnist-small");
    small_mnist(&dir, 48, 20);
    let mut cmd = Command::new(example("mnist"));
    cmd.args(["--data-dir", ".", "--epochs", "1", "--batch-size", "16"]);
    let out = run(cmd, &dir, Duration::from_secs(300));
    assert_success(&out);
    assert!(
        stdout(&out).contains("epoch=0 avg_loss="),
        "{}",
        stdout(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mnist_missing_or_corrupt_files_are_named() {
    let dir = scratch("mnist-bad");
    let mut cmd = Command::new(example("mnist"));
    cmd.args(["--data-dir", "absent"]);
    let out = run(cmd, &dir, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("train-images-idx3-ubyte") && stderr.contains("--data-dir"),
        "{stderr}"
    );

    small_mnist(&dir, 8, 8);
    write_idx(&dir.join("t10k-labels-idx1-ubyte"), 0x803, &[8], &[0; 8]);
    let mut cmd = Command::new(example("mnist"));
    cmd.args(["--data-dir", "."]);
    let out = run(cmd, &dir, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("t10k-labels-idx1-ubyte") && stderr.contains("magic 0x00000803"),
        "{stderr}"
    );

    small_mnist(&dir, 8, 8);
    std::fs::write(
        dir.join("train-images-idx3-ubyte"),
        &[0, 0, 8, 3, 0, 0, 0, 8][..],
    )
    .unwrap();
    let mut cmd = Command::new(example("mnist"));
    cmd.args(["--data-dir", "."]);
    let out = run(cmd, &dir, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        stderr.contains("train-images-idx3-ubyte") && stderr.contains("truncated"),
        "{stderr}"
    );

    // The test split's image size is checked too, not only the training split's.
    small_mnist(&dir, 8, 8);
    write_idx(
        &dir.join("t10k-images-idx3-ubyte"),
        0x803,
        &[8, 14, 14],
        &[0; 8 * 14 * 14],
    );
    let mut cmd = Command::new(example("mnist"));
    cmd.args(["--data-dir", "."]);
    let out = run(cmd, &dir, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("t10k-images-idx3-ubyte") && stderr.contains("14x14"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The toy trainer over 2 machines x 2 ranks x batch 32 (network namespaces,
/// a launcher on each, TCP between them) computes what one process computes
/// with batch 128.
#[test]
fn toy_on_two_machines_equals_one_big_batch() {
    burn_ddp_testkit::programs::toy_on_two_machines_equals_one_big_batch(&example("toy"), "toy");
}

/// burn-dataset's MNIST cache (`$XDG_CACHE_HOME/burn-dataset/mnist/{train,test}`),
/// filled from the shared files, so no download happens.
fn fill_burn_dataset_cache(cache_home: &Path) {
    use std::io::Read;
    for (split, files) in [
        (
            "train",
            ["train-images-idx3-ubyte", "train-labels-idx1-ubyte"],
        ),
        ("test", ["t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]),
    ] {
        let folder = cache_home.join("burn-dataset").join("mnist").join(split);
        std::fs::create_dir_all(&folder).unwrap();
        for name in files {
            let gz = std::fs::File::open(
                mnist_data(env!("CARGO_MANIFEST_DIR")).join(format!("{name}.gz")),
            )
            .unwrap();
            let mut bytes = Vec::new();
            flate2::read::GzDecoder::new(gz)
                .read_to_end(&mut bytes)
                .unwrap();
            std::fs::write(folder.join(name), bytes).unwrap();
        }
    }
}

/// Without --data-dir both trainers take MNIST from burn-dataset's
/// `MnistDataset` (its cache, filled here; rank 0 first, the other after a barrier).
#[test]
fn mnist_without_data_dir_reads_burn_datasets_cache() {
    let dir = scratch("mnist-burn-dataset");
    let cache = dir.join("cache");
    fill_burn_dataset_cache(&cache);
    for learner in [false, true] {
        let mut cmd = Command::new(launcher());
        cmd.env("XDG_CACHE_HOME", &cache)
            // Nothing may be downloaded: any attempt fails at once.
            .env("HTTPS_PROXY", "http://127.0.0.1:9")
            .env("https_proxy", "http://127.0.0.1:9")
            .args(["--standalone", "--nproc-per-node", "2"])
            .arg(example("mnist"))
            .args(["--train-samples", "256", "--test-samples", "128"])
            .args(["--epochs", "1", "--batch-size", "32"]);
        if learner {
            cmd.arg("--learner");
        }
        let out = run(cmd, &dir, Duration::from_secs(600));
        assert_success(&out);
        let text = stdout(&out);
        assert_eq!(
            text.lines().filter(|l| l.starts_with("epoch=")).count(),
            1,
            "learner {learner}: {text}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Offline with an empty cache: one clear error naming --data-dir and the cache.
#[test]
fn mnist_offline_without_cache_names_data_dir_and_the_cache() {
    let dir = scratch("mnist-offline");
    let cache = dir.join("empty-cache");
    let mut cmd = Command::new(example("mnist"));
    cmd.env("XDG_CACHE_HOME", &cache)
        .env("HTTPS_PROXY", "http://127.0.0.1:9")
        .env("https_proxy", "http://127.0.0.1:9")
        .args(["--epochs", "1"]);
    let out = run(cmd, &dir, Duration::from_secs(120));
    assert!(!out.status.success(), "{}", stdout(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let folder = cache.join("burn-dataset").join("mnist");
    for needle in [
        "--data-dir",
        &folder.display().to_string(),
        "could not be downloaded",
    ] {
        assert!(
            stderr.contains(needle),
            "{needle:?} missing from:\n{stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A download that stalls (a proxy that accepts and never answers) ends with
/// one error naming --download-timeout and --data-dir, within the limit.
#[test]
fn mnist_stalled_download_ends_within_the_timeout() {
    let dir = scratch("mnist-stalled");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy = format!("http://{}", listener.local_addr().unwrap());
    // Accept connections and hold them open without a byte of reply.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    let mut cmd = Command::new(example("mnist"));
    cmd.env("XDG_CACHE_HOME", dir.join("empty-cache"))
        .env("HTTPS_PROXY", &proxy)
        .env("https_proxy", &proxy)
        .args(["--epochs", "1", "--download-timeout", "2"]);
    let started = Instant::now();
    let out = run(cmd, &dir, Duration::from_secs(60));
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}",
        started.elapsed()
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "did not finish within 2 s",
        "--download-timeout",
        "--data-dir",
    ] {
        assert!(
            stderr.contains(needle),
            "{needle:?} missing from:\n{stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--max-restarts 3`, `--resume auto` and rank 1 SIGKILLed in three rounds,
/// each at an epoch drawn at random: every round resumes from the newest
/// snapshot (losing at most the epoch under way), the launcher exits 0, every
/// epoch's loss is the uninterrupted run's digit for digit, and the final
/// parameters are the uninterrupted run's bit for bit (their fingerprint).
#[test]
fn toy_killed_three_times_under_max_restarts_ends_as_an_uninterrupted_run() {
    let toy_args = [
        "--epochs",
        "10",
        "--batch-size",
        "2",
        "--loss-precision",
        "9",
        "--save-interval",
        "1",
    ];
    let reference_dir = scratch("toy-restarts-reference");
    let mut reference = Command::new(launcher());
    reference
        .args(["--standalone", "--nproc-per-node", "2"])
        .arg(example("toy"))
        .args(toy_args);
    let reference = run(reference, &reference_dir, Duration::from_secs(120));
    assert_success(&reference);
    let expected = toy_losses(&stdout(&reference));
    assert_eq!(expected.len(), 10, "{}", stdout(&reference));

    // Rank 1 dies in rounds 0, 1 and 2, each time 1 or 2 epochs (drawn at
    // random) after the round began: after epoch 1-2, then after the epoch
    // the round resumed at plus 1-2.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as usize;
    let dir = scratch("toy-restarts");
    let mut cmd = Command::new(launcher());
    cmd.args([
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "3",
    ])
    .args(["--prefix-output"])
    .arg(example("toy"))
    .args(toy_args)
    .args(["--resume", "auto"]);
    let mut job = Interactive::start(cmd, &dir);
    let mut kill_after = Vec::new();
    for round in 0..3 {
        let began_at = if round == 0 {
            0
        } else {
            let marker = format!("[rank 0 round {round}] Resumed from ");
            job.wait_for(&marker, Duration::from_secs(120));
            job.stdout()
                .lines()
                .filter_map(|l| l.strip_prefix(&marker))
                .find_map(|l| l.rsplit_once("at epoch ")?.1.trim().parse().ok())
                .unwrap_or_else(|| panic!("round {round}: no epoch resumed at"))
        };
        let epoch: usize = began_at + 1 + (seed >> (4 * round)) % 2;
        kill_after.push(epoch);
        job.wait_for(
            &format!("[rank 0 round {round}] Epoch {epoch}/10"),
            Duration::from_secs(120),
        );
        let victim = worker_pid(job.pid(), 1)
            .unwrap_or_else(|| panic!("round {round}: no rank 1 (kills at {kill_after:?})"));
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(victim, libc::SIGKILL) };
    }
    let (out, _) = job.wait(Duration::from_secs(120));
    let text = stdout(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let context = format!("kills after epochs {kill_after:?}\n{text}\n{stderr}");
    assert_eq!(out.status.code(), Some(0), "{context}");
    assert!(
        stderr.contains("killed by SIGKILL") && stderr.contains("succeeded in round 3"),
        "{context}"
    );
    for (round, killed_after) in kill_after.iter().enumerate() {
        assert!(
            stderr.contains(&format!("round {round} of the job failed")),
            "{context}"
        );
        // The next round resumes from the last epoch saved before the kill:
        // the one killed after, or the one before when the kill came first.
        let resumed: usize = text
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("[rank 0 round {}] Resumed from ", round + 1)))
            .find_map(|l| l.rsplit_once("at epoch ")?.1.trim().parse().ok())
            .unwrap_or_else(|| panic!("round {} did not resume\n{context}", round + 1));
        assert!(
            resumed + 1 >= *killed_after && resumed <= *killed_after + 1,
            "round {}: resumed at epoch {resumed}, killed after {killed_after}\n{context}",
            round + 1
        );
    }
    // Each epoch's last printed loss (a round may have redone one) is the
    // uninterrupted run's.
    let mut last = std::collections::BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("[rank 0 round ") {
            if let Some((_, line)) = rest.split_once("] ") {
                for (epoch, loss) in toy_losses(line) {
                    last.insert(epoch, loss);
                }
            }
        }
    }
    let last: Vec<(usize, f64)> = last.into_iter().collect();
    assert_eq!(last, expected, "{context}");
    let fingerprint = |text: &str| {
        text.lines()
            .find_map(|l| Some(l.split_once("Parameters fingerprint: ")?.1.to_string()))
    };
    let reference_fingerprint = fingerprint(&stdout(&reference));
    assert!(reference_fingerprint.is_some(), "{}", stdout(&reference));
    assert_eq!(
        fingerprint(&text),
        reference_fingerprint,
        "the final parameters differ from the uninterrupted run's\n{context}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&reference_dir);
}

/// A rank stopped with SIGSTOP under `--max-restarts 1` and a 5 s timeout:
/// the hang becomes a failure within the timeout, the workers start again,
/// resume from the newest snapshot, and end with the uninterrupted run's
/// parameters.
#[test]
fn toy_stopped_rank_under_max_restarts_becomes_a_restart() {
    let toy_args = ["--epochs", "6", "--save-interval", "1"];
    let fingerprint = |text: &str| {
        text.lines()
            .find_map(|l| Some(l.split_once("Parameters fingerprint: ")?.1.to_string()))
    };
    let reference_dir = scratch("toy-sigstop-reference");
    let mut reference = Command::new(launcher());
    reference
        .args(["--standalone", "--nproc-per-node", "2"])
        .arg(example("toy"))
        .args(toy_args)
        .args(["--batch-size", "2"]);
    let reference = run(reference, &reference_dir, Duration::from_secs(120));
    assert_success(&reference);
    let expected = fingerprint(&stdout(&reference));
    assert!(expected.is_some(), "{}", stdout(&reference));

    let dir = scratch("toy-sigstop");
    let mut cmd = Command::new(launcher());
    cmd.args([
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
    ])
    .args(["--prefix-output"])
    .arg(example("toy"))
    .args(toy_args)
    .args(["--batch-size", "2", "--resume", "auto"])
    .env("BURN_DDP_TIMEOUT_SECS", "5");
    let mut job = Interactive::start(cmd, &dir);
    job.wait_for("[rank 0 round 0] Epoch 2/6", Duration::from_secs(120));
    let victim = worker_pid(job.pid(), 1).expect("rank 1 runs");
    let stopped_at = Instant::now();
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(victim, libc::SIGSTOP) };
    job.wait_for("[rank 0 round 1] Resumed from", Duration::from_secs(60));
    let resumed_after = stopped_at.elapsed();
    let (out, _) = job.wait(Duration::from_secs(120));
    let text = stdout(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let context = format!("{text}\n{stderr}");
    assert_eq!(out.status.code(), Some(0), "{context}");
    // The 5 s timeout, the stop of the others, the restart and the load.
    assert!(
        resumed_after < Duration::from_secs(20),
        "resumed {resumed_after:?} after the SIGSTOP\n{context}"
    );
    assert!(
        stderr.contains("round 0 of the job failed") && stderr.contains("succeeded in round 1"),
        "{context}"
    );
    assert_eq!(fingerprint(&text), expected, "{context}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&reference_dir);
}

/// `--resume auto` with bad folders: a corrupt newest snapshot is skipped
/// with a warning naming it; another run's folder (other settings) is an
/// error naming the saved configuration and what differs; a folder that
/// cannot be written is refused before the first step, naming it.
#[test]
fn toy_resume_auto_skips_a_corrupt_snapshot_and_refuses_another_run() {
    let dir = scratch("toy-auto");
    let toy = |extra: &[&str]| {
        let mut cmd = Command::new(example("toy"));
        cmd.args(["--save-interval", "1", "--resume", "auto"])
            .args(extra);
        run(cmd, &dir, Duration::from_secs(120))
    };
    let first = toy(&["--epochs", "3"]);
    assert_success(&first);
    assert!(
        stdout(&first).contains("No snapshot in .: starting afresh"),
        "{}",
        stdout(&first)
    );
    std::fs::write(dir.join("model_epoch_3.mpk"), b"half a file").unwrap();
    let again = toy(&["--epochs", "4"]);
    assert_success(&again);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(
        stderr.contains("snapshot ./model_epoch_3.mpk cannot be read")
            && stdout(&again).contains("Resumed from ./model_epoch_2 at epoch 2"),
        "{stderr}\n{}",
        stdout(&again)
    );
    let other = toy(&["--epochs", "4", "--lr", "0.5"]);
    assert_eq!(other.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert!(
        stderr.contains("another run's")
            && stderr.contains("toy_config.json")
            && stderr.contains("lr: 0.01 -> 0.5"),
        "{stderr}"
    );
    let unwritable = dir.join("model_epoch_4.mpk").join("sub");
    let refused = toy(&[
        "--epochs",
        "4",
        "--checkpoint-dir",
        unwritable.to_str().unwrap(),
    ]);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains(unwritable.to_str().unwrap()) && !stdout(&refused).contains("Epoch 1/"),
        "{stderr}\n{}",
        stdout(&refused)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The toy on the two-machine bed (2 x 2 ranks) under `--max-restarts 2` and
/// `--resume auto`: rank 3 (machine 1) SIGKILLed in round 0, rank 0 (machine
/// 0) in round 1. Both machines' launchers end each round together, start
/// their workers again, and exit 0; the run ends with the parameters of an
/// uninterrupted run on the same two machines.
#[test]
fn toy_on_two_machines_survives_a_worker_killed_on_either() {
    let Some(machines) = burn_ddp_testkit::Machines::create(2).unwrap() else {
        return;
    };
    let toy_args = [
        "--epochs",
        "8",
        "--batch-size",
        "4",
        "--save-interval",
        "1",
        "--loss-precision",
        "9",
    ];
    let launcher_on = |node: usize, dir: &Path, restarts: &[&str]| {
        let mut cmd = machines.command_in(node, dir, launcher().to_str().unwrap());
        cmd.args(["--nnodes", "2", "--node-rank", &node.to_string()])
            .args(["--nproc-per-node", "2", "--master-port", "29500"])
            .args(["--master-addr", &machines.addr(0).to_string()])
            .args(["--prefix-output"])
            .args(restarts)
            .arg(example("toy"))
            .args(toy_args)
            .env("BURN_DDP_JOB_TOKEN", "toy-restarts-on-two-machines")
            .env("BURN_DDP_TIMEOUT_SECS", "30");
        cmd
    };
    let fingerprint = |text: &str| {
        text.lines()
            .find_map(|l| Some(l.split_once("Parameters fingerprint: ")?.1.to_string()))
    };

    let reference_dir = scratch("toy-machines-restarts-reference");
    let runs: Vec<_> = (0..2)
        .map(|node| {
            let cmd = launcher_on(node, &reference_dir, &[]);
            let dir = reference_dir.clone();
            std::thread::spawn(move || run(cmd, &dir, Duration::from_secs(300)))
        })
        .collect();
    let reference: Vec<Output> = runs.into_iter().map(|r| r.join().unwrap()).collect();
    for out in &reference {
        assert_success(out);
    }
    let expected = fingerprint(&stdout(&reference[0]));
    assert!(expected.is_some(), "{}", stdout(&reference[0]));

    let dir = scratch("toy-machines-restarts");
    let restarts = ["--max-restarts", "2"];
    let mut jobs: Vec<Interactive> = (0..2)
        .map(|node| {
            let mut cmd = launcher_on(node, &dir, &restarts);
            cmd.args(["--resume", "auto"]);
            Interactive::start(cmd, &dir)
        })
        .collect();
    // (round, the epoch rank 0 reports before the kill, machine, rank there).
    for (round, epoch, node, rank) in [(0, 2, 1, 3), (1, 4, 0, 0)] {
        jobs[0].wait_for(
            &format!("[rank 0 round {round}] Epoch {epoch}/8"),
            Duration::from_secs(120),
        );
        let victim = worker_pid(jobs[node].pid(), rank)
            .unwrap_or_else(|| panic!("round {round}: no rank {rank} on machine {node}"));
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(victim, libc::SIGKILL) };
    }
    let outs: Vec<(Output, Duration)> = jobs
        .into_iter()
        .map(|job| job.wait(Duration::from_secs(300)))
        .collect();
    let context: String = outs
        .iter()
        .enumerate()
        .map(|(node, (out, _))| {
            format!(
                "--- machine {node}: {:?}\n{}\n{}\n",
                out.status,
                stdout(out),
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .collect();
    for (out, _) in &outs {
        assert_eq!(out.status.code(), Some(0), "{context}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("starting every worker again: round 2"),
            "{context}"
        );
    }
    // Each machine's launcher saw the other's failure or its own.
    let stderr1 = String::from_utf8_lossy(&outs[1].0.stderr);
    assert!(
        stderr1.contains("round 1 failed on another machine (machine 0: rank 0 killed by SIGKILL)"),
        "{context}"
    );
    let stderr0 = String::from_utf8_lossy(&outs[0].0.stderr);
    assert!(
        stderr0.contains("round 0 failed on another machine (machine 1: rank 3 killed by SIGKILL)"),
        "{context}"
    );
    assert_eq!(fingerprint(&stdout(&outs[0].0)), expected, "{context}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&reference_dir);
}

/// The hand-written MNIST loop's snapshots: 2 ranks train 2 epochs into
/// `--checkpoint-dir`, then `--resume auto --epochs 3` goes on from
/// model_epoch_2 and ends with the parameters of an uninterrupted 3-epoch
/// run; another run's folder and `--resume` without a folder are refused.
#[test]
fn mnist_snapshots_resume_by_themselves_and_end_as_uninterrupted() {
    let dir = scratch("mnist-snapshots");
    small_mnist(&dir, 96, 20);
    let mnist = |extra: &[&str]| {
        let mut cmd = Command::new(launcher());
        cmd.args(["--standalone", "--nproc-per-node", "2"])
            .arg(example("mnist"))
            .args(["--data-dir", ".", "--batch-size", "8"])
            .args(extra);
        run(cmd, &dir, Duration::from_secs(300))
    };
    let fingerprint = |text: &str| {
        text.lines()
            .find_map(|l| Some(l.split_once("parameters fingerprint: ")?.1.to_string()))
    };
    let straight = mnist(&["--epochs", "3", "--output", "straight"]);
    assert_success(&straight);
    let expected = fingerprint(&stdout(&straight));
    assert!(expected.is_some(), "{}", stdout(&straight));

    let first = mnist(&[
        "--epochs",
        "2",
        "--checkpoint-dir",
        "ck",
        "--resume",
        "auto",
    ]);
    assert_success(&first);
    assert!(
        stdout(&first).contains("No snapshot in ck: starting afresh")
            && dir.join("ck/model_epoch_2.mpk").is_file(),
        "{}",
        stdout(&first)
    );
    let resumed = mnist(&[
        "--epochs",
        "3",
        "--checkpoint-dir",
        "ck",
        "--resume",
        "auto",
    ]);
    assert_success(&resumed);
    let text = stdout(&resumed);
    assert!(
        text.contains("Resumed from ck/model_epoch_2 at epoch 2")
            && text.contains("epoch=2 ")
            && !text.contains("epoch=1 "),
        "{text}"
    );
    assert_eq!(fingerprint(&text), expected, "{text}");

    let other = mnist(&[
        "--epochs",
        "4",
        "--lr",
        "0.01",
        "--checkpoint-dir",
        "ck",
        "--resume",
        "auto",
    ]);
    assert_eq!(other.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert!(
        stderr.contains("another run's") && stderr.contains("mnist_config.json"),
        "{stderr}"
    );
    let mut bare = Command::new(example("mnist"));
    bare.args(["--data-dir", ".", "--resume", "auto"]);
    let bare = run(bare, &dir, Duration::from_secs(60));
    assert_eq!(bare.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&bare.stderr).contains("give --checkpoint-dir DIR"),
        "{}",
        String::from_utf8_lossy(&bare.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `mnist --learner` (Burn 0.21) as testkit's Learner scenarios check it.
fn mnist_learner() -> MnistLearner {
    MnistLearner {
        program: example("mnist"),
        data: mnist_data(env!("CARGO_MANIFEST_DIR")),
        checkpoint_extension: "mpk",
        model_file: "model.mpk".into(),
    }
}

#[test]
fn mnist_learner_on_two_ranks_writes_one_experiment() {
    mnist_learner::writes_one_experiment(&mnist_learner());
}

#[test]
fn mnist_learner_ctrl_c_stops_cleanly_and_resumes() {
    mnist_learner::ctrl_c_stops_cleanly_and_resumes(&mnist_learner());
}

#[test]
fn mnist_learner_killed_mid_epoch_resumes_by_itself_and_ends_as_uninterrupted() {
    mnist_learner::killed_mid_epoch_resumes_by_itself(&mnist_learner());
}
