//! The Burn 0.21 trainers end to end (examples/toy, examples/mnist): real
//! processes through the launcher. The scenarios both Burn versions' trainers
//! pass are testkit's (`trainers`, `mnist_learner`; examples-22's
//! tests/trainers.rs runs them on Burn 0.22's); the rest is what only these
//! programs do (MNIST from burn-dataset's download, the restarts).

use burn_ddp_testkit::numbers::max_relative_difference;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use burn_ddp_testkit::programs::{
    assert_success, example, launcher, mnist_data, run, scratch, stdout, toy_losses, worker_pid,
    Interactive,
};
use burn_ddp_testkit::trainers::{fingerprint, Trainers};

/// The toy trainer's line with its final parameters' digest.
const TOY_FINGERPRINT: &str = "Parameters fingerprint";

// Every scenario both Burn versions' trainers pass (testkit's `trainers`).
burn_ddp_testkit::trainer_tests!(Trainers::burn_021(cfg!(feature = "cuda")));

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

/// The MNIST trainer, its own loop and the Learner, with its buckets sent
/// during backward (`BURN_DDP_OVERLAP=always`, on one machine) against
/// after backward (`never`): the same losses, accuracies and final
/// parameters, digit for digit, and only the first sent any bucket while
/// backward ran.
#[test]
fn mnist_buckets_sent_during_backward_end_as_after_backward_digit_for_digit() {
    let dir = scratch("mnist-overlap");
    let data = mnist_data(env!("CARGO_MANIFEST_DIR"));
    let train = |overlap: &str, learner: bool| {
        let mut cmd = Command::new(launcher());
        cmd.env("BURN_DDP_OVERLAP", overlap)
            .args(["--standalone", "--nproc-per-node", "2"])
            .arg(example("mnist"))
            .arg("--data-dir")
            .arg(&data)
            .args(["--train-samples", "640", "--test-samples", "300"])
            .args(["--epochs", "2", "--batch-size", "32"]);
        if learner {
            cmd.arg("--learner")
                .arg("--artifact-dir")
                .arg(dir.join(overlap));
        }
        let out = run(cmd, &dir, Duration::from_secs(600));
        assert_success(&out);
        let text = stdout(&out);
        let early: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("Gradient sync: "))
            .and_then(|l| {
                l.split(", ")
                    .find(|part| part.ends_with("sent during backward"))
            })
            .and_then(|part| part.split(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no count of buckets sent during backward:\n{text}"));
        let results: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with("epoch=") || l.starts_with("parameters fingerprint"))
            // The times differ from run to run; the numbers must not.
            .map(|l| l.split(" epoch_time=").next().unwrap_or(l).to_string())
            .collect();
        (early, results)
    };
    for learner in [false, true] {
        let (early, during) = train("always", learner);
        let (none, after) = train("never", learner);
        assert_eq!(during.len(), 3, "learner {learner}: {during:?}");
        assert_eq!(during, after, "learner {learner}");
        assert!(
            early > 0 && none == 0,
            "learner {learner}: sent during backward: {early} and {none}"
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

/// The values a trainer's `--print-params` printed (`Parameters: v v ...`).
fn parameters(text: &str) -> Vec<f32> {
    text.lines()
        .find_map(|l| l.split_once("Parameters: ").map(|(_, v)| v.to_string()))
        .unwrap_or_else(|| panic!("no parameters in {text}"))
        .split(' ')
        .map(|v| v.parse().unwrap())
        .collect()
}

/// `--on-failure continue`: the toy on 3 ranks, rank 1 SIGKILLed after an
/// epoch drawn at random. Ranks 0 and 2 go on in the processes they started
/// in (each starts training once and says it goes on as generation 1 of 2
/// ranks), the rest of the epoch dealt over them; every epoch is reported,
/// the two replicas end identical, and the launcher exits 0 naming the rank
/// it lost. Rank 0 logs every step's global batch: one process trained on
/// those batches ends within 1e-5 of the ranks.
#[test]
fn toy_goes_on_without_a_killed_rank_under_on_failure_continue() {
    for (i, program) in ["toy", "toy22"].into_iter().enumerate() {
        let dir = scratch(&format!("{program}-go-on"));
        let epoch = 1 + (seed() >> (2 * i)) % 3;
        let (out, text, context) = toy_with_rank_1_killed(program, &dir, &[], ("[rank 0]", epoch));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{context}");
        for (rank, now) in [(0, 0), (2, 1)] {
            let line =
                format!("[rank {rank}] Rank {rank} goes on as rank {now} of 2 (generation 1)");
            assert!(text.contains(&line), "no {line:?}\n{context}");
            let started = format!("[rank {rank}] Rank {rank} starting training");
            assert_eq!(text.matches(&started).count(), 1, "{context}");
        }
        for epoch in 1..=6 {
            assert!(
                text.contains(&format!("[rank 0] Epoch {epoch}/6")),
                "{context}"
            );
        }
        assert!(
            text.contains("[rank 0] Replicas identical: 2 ranks")
                && stderr.contains("rank 1 ended (killed by SIGKILL)")
                && stderr.contains("the job finished without rank(s) 1"),
            "{context}"
        );
        // One process trained on the global batches the ranks logged ends
        // where the ranks did (to rounding: 3 then 2 ranks sum in another order).
        let gap = toy_replay_gap(program, &dir, &text);
        assert!(
            gap <= 1e-5,
            "{program}: the replay ended {gap:e} away\n{context}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A seed for the tests' random choices, from the clock.
fn seed() -> usize {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as usize
}

/// The toy (3 ranks, 6 epochs, batch 2, `--print-params`, rank 0 logging
/// the global batches to `dir/batches.log`) through the launcher with
/// `--on-failure continue --prefix-output` and `flags`, rank 1 SIGKILLed
/// once `prefix`'s rank 0 reported epoch `epoch`: its output, stdout, and
/// both for a failure's message.
fn toy_with_rank_1_killed(
    program: &str,
    dir: &Path,
    flags: &[&str],
    (prefix, epoch): (&str, usize),
) -> (Output, String, String) {
    let mut cmd = Command::new(launcher());
    cmd.args(["--standalone", "--nproc-per-node", "3"])
        .args(["--on-failure", "continue", "--prefix-output"])
        .args(flags)
        .arg(example(program))
        .args(["--epochs", "6", "--batch-size", "2", "--print-params"])
        .arg("--log-batches")
        .arg(dir.join("batches.log"));
    let mut job = Interactive::start(cmd, dir);
    job.wait_for(
        &format!("{prefix} Epoch {epoch}/6"),
        Duration::from_secs(120),
    );
    let victim = worker_pid(job.pid(), 1).expect("rank 1 runs");
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(victim, libc::SIGKILL) };
    let (out, _) = job.wait(Duration::from_secs(120));
    let text = stdout(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let context = format!("{program} killed after epoch {epoch}\n{text}\n{stderr}");
    (out, text, context)
}

/// One process trained on the global batches `dir/batches.log` lists: how
/// far (the largest relative difference) its parameters end from `text`'s.
fn toy_replay_gap(program: &str, dir: &Path, text: &str) -> f32 {
    let mut replay = Command::new(example(program));
    replay
        .args(["--epochs", "6", "--batch-size", "2", "--print-params"])
        .arg("--replay")
        .arg(dir.join("batches.log"));
    let replayed = run(replay, dir, Duration::from_secs(300));
    assert_success(&replayed);
    max_relative_difference(&parameters(text), &parameters(&stdout(&replayed)))
}

/// `--on-failure continue --max-restarts 1`: the toy trainer (both Burns)
/// on 3 ranks, rank 1 SIGKILLed after a random epoch. Ranks 0 and 2 go on
/// in their own processes as generation 1, the launcher starts a
/// replacement, which the two admit at a step's end as rank 2 of
/// generation 2 and hand the parameters, the optimizer state and the
/// loop's place from rank 0 (the time it took printed); the world is back
/// to 3, every replica ends identical, the launcher exits 0, and one
/// process trained on the global batches rank 0 logged ends within 1e-5.
#[test]
fn toy_heals_a_killed_rank_with_a_replacement_from_a_peer() {
    for (i, program) in ["toy", "toy22"].into_iter().enumerate() {
        let dir = scratch(&format!("{program}-heal"));
        let epoch = 1 + (seed() >> (2 * i)) % 3;
        let flags = ["--max-restarts", "1"];
        let (out, text, context) =
            toy_with_rank_1_killed(program, &dir, &flags, ("[rank 0 round 0]", epoch));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{context}");
        for (rank, now) in [(0, 0), (2, 1)] {
            let line = format!(
                "[rank {rank} round 0] Rank {rank} goes on as rank {now} of 2 (generation 1)"
            );
            assert!(text.contains(&line), "no {line:?}\n{context}");
            let started = format!("[rank {rank} round 0] Rank {rank} starting training");
            assert_eq!(text.matches(&started).count(), 1, "{context}");
            let healed = format!("[rank {rank} round 0] Rank {now} of 3 has the state of rank 0");
            assert!(text.contains(&healed), "no {healed:?}\n{context}");
        }
        // The replacement: launched as rank 1, rank 2 of the third generation.
        let joined = "[rank 1 round 0] Rank 2 of 3 has the state of rank 0 (generation 2, epoch";
        let line = text.lines().find(|l| l.starts_with(joined));
        let line = line.unwrap_or_else(|| panic!("no {joined:?}\n{context}"));
        let ms: u64 = (line.rsplit(" after ").next())
            .and_then(|t| t.trim_end_matches(" ms").parse().ok())
            .unwrap_or_else(|| panic!("no time in {line:?}"));
        eprintln!("{program}: the replacement had the state {ms} ms after its admission");
        assert!(
            text.contains("[rank 0 round 0] Replicas identical: 3 ranks")
                && text.contains("[rank 0 round 0] Epoch 6/6")
                && stderr.contains("starting a replacement for rank 1 (restart 1 of 1)")
                && stderr.contains("rank(s) 1 failed on the way and 1 replacement(s) started"),
            "{context}"
        );
        // The log: 3 ranks, 2 from the failure, 3 again once the replacement joined.
        let logged = std::fs::read_to_string(dir.join("batches.log")).unwrap();
        let worlds: Vec<&str> = logged
            .lines()
            .filter_map(|l| l.split(':').next()?.split(' ').nth(2))
            .collect();
        let first_two = worlds.iter().position(|w| *w == "2");
        let first_two = first_two.unwrap_or_else(|| panic!("no step on 2 ranks\n{context}"));
        let back = worlds[first_two..].iter().position(|w| *w == "3");
        assert!(back.is_some(), "never back to 3 ranks\n{context}");
        let gap = toy_replay_gap(program, &dir, &text);
        assert!(
            gap <= 1e-5,
            "{program}: the replay ended {gap:e} away\n{context}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The same on 2 ranks: rank 1 SIGKILLed, rank 0 goes on alone (a group of
/// one, which keeps the launcher's store and its watch), admits the
/// replacement as rank 1 of generation 2, and both end identical.
#[test]
fn toy_heals_the_last_survivor_of_two() {
    for program in ["toy", "toy22"] {
        let dir = scratch(&format!("{program}-heal-two"));
        let mut cmd = Command::new(launcher());
        cmd.args([
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
        ])
        .args(["--on-failure", "continue", "--prefix-output"])
        .arg(example(program))
        .args(["--epochs", "30", "--batch-size", "2"]);
        let mut job = Interactive::start(cmd, &dir);
        job.wait_for("[rank 0 round 0] Epoch 1/30", Duration::from_secs(120));
        let victim = worker_pid(job.pid(), 1).expect("rank 1 runs");
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(victim, libc::SIGKILL) };
        let (out, _) = job.wait(Duration::from_secs(120));
        let text = stdout(&out);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let context = format!("{program}\n{text}\n{stderr}");
        assert_eq!(out.status.code(), Some(0), "{context}");
        for line in [
            "[rank 0 round 0] Rank 0 goes on as rank 0 of 1 (generation 1)",
            "[rank 1 round 0] Rank 1 of 2 has the state of rank 0 (generation 2",
            "[rank 0 round 0] Replicas identical: 2 ranks",
            "[rank 0 round 0] Epoch 30/30",
        ] {
            assert!(text.contains(line), "no {line:?}\n{context}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A run trained with AdamW and one process replaying its logged global
/// batches end close. AdamW turns rounding (3 and 2 ranks sum in other
/// orders than one process) into up to a step's size for the parameters
/// whose gradients are about zero, so a few parameters drift; a wrong or
/// missing batch moves nearly all of them. Measured by hand: 99th
/// percentile 2e-6 to 3e-5, median 4e-8 to 1e-7; with one logged step left
/// out of the replay, 7e-3 and 3e-4.
fn assert_adamw_replay_close(program: &str, ranks: &str, replayed: &str, context: &str) {
    let (ranks, one) = (parameters(ranks), parameters(replayed));
    let scale = one.iter().fold(0f32, |m, v| m.max(v.abs()));
    let mut gaps: Vec<f32> = (ranks.iter().zip(&one))
        .map(|(a, b)| (a - b).abs() / scale)
        .collect();
    gaps.sort_by(f32::total_cmp);
    let at = |share: usize| gaps[(gaps.len() - 1) * share / 100];
    let (median, p99, max) = (at(50), at(99), at(100));
    assert!(
        median <= 1e-6 && p99 <= 1e-4 && max <= 1e-2,
        "{program}: the replay ended {median:e} (median), {p99:e} (99th percentile), \
         {max:e} (largest) away\n{context}"
    );
}

/// `--on-failure continue --max-restarts 1`: the MNIST trainer (both Burns,
/// AdamW) on 3 ranks, rank 1 SIGKILLed once the first epoch is reported.
/// Ranks 0 and 2 go on as generation 1; the replacement the launcher starts
/// is admitted at a step's end as rank 2 of generation 2 and gets the model,
/// AdamW's state and the loop's place (training and test shards) from rank
/// 0; every epoch is reported, the 3 replicas end identical, the launcher
/// exits 0, and one process on the global batches rank 0 logged ends where
/// the ranks did.
#[test]
fn mnist_heals_a_killed_rank_with_a_replacement_from_a_peer() {
    for program in ["mnist", "mnist22"] {
        let dir = scratch(&format!("{program}-heal"));
        let flags = ["--max-restarts", "1"];
        let (out, text, context) =
            mnist_with_rank_1_killed(program, &dir, &flags, ("[rank 0 round 0]", 4));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{context}");
        for (rank, now) in [(0, 0), (2, 1)] {
            let line = format!(
                "[rank {rank} round 0] Rank {rank} goes on as rank {now} of 2 (generation 1)"
            );
            assert!(text.contains(&line), "no {line:?}\n{context}");
        }
        let joined = "[rank 1 round 0] Rank 2 of 3 has the state of rank 0 (generation 2";
        assert!(text.contains(joined), "no {joined:?}\n{context}");
        for epoch in 0..4 {
            let line = format!("[rank 0 round 0] epoch={epoch} ");
            assert!(text.contains(&line), "no {line:?}\n{context}");
        }
        assert!(
            text.contains("[rank 0 round 0] replicas identical: 3 ranks")
                && stderr.contains("rank(s) 1 failed on the way and 1 replacement(s) started"),
            "{context}"
        );
        mnist_replay_close(program, &dir, (4, &text), &context);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `--on-failure continue`: the MNIST trainer (both Burns) on 3 ranks, rank
/// 1 SIGKILLed once the first epoch is reported: ranks 0 and 2 go on in
/// their own processes as generation 1 of 2 ranks (the rest of the
/// training and the test set dealt over them), report every epoch, end with
/// identical replicas and save the model; the launcher exits 0. One process
/// on the global batches rank 0 logged ends where they did (AdamW: the
/// median parameter within 1e-6, 99% within 1e-4, every one within 1e-2).
#[test]
fn mnist_goes_on_without_a_killed_rank_under_on_failure_continue() {
    for program in ["mnist", "mnist22"] {
        let dir = scratch(&format!("{program}-go-on"));
        let (out, text, context) = mnist_with_rank_1_killed(program, &dir, &[], ("[rank 0]", 3));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{context}");
        for (rank, now) in [(0, 0), (2, 1)] {
            let line =
                format!("[rank {rank}] Rank {rank} goes on as rank {now} of 2 (generation 1)");
            assert!(text.contains(&line), "no {line:?}\n{context}");
        }
        for epoch in 0..3 {
            assert!(
                text.contains(&format!("[rank 0] epoch={epoch} ")),
                "{context}"
            );
        }
        assert!(
            text.contains("[rank 0] replicas identical: 2 ranks")
                && text.contains("[rank 0] saved ")
                && stderr.contains("the job finished without rank(s) 1"),
            "{context}"
        );
        // One process on the global batches rank 0 logged ends where the ranks did.
        mnist_replay_close(program, &dir, (3, &text), &context);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The MNIST subset the go-on tests train on.
const MNIST_SUBSET: [&str; 4] = ["--train-samples", "960", "--test-samples", "300"];

/// The MNIST trainer (3 ranks, `epochs` epochs of batch 16,
/// `--print-params`, rank 0 logging the global batches to
/// `dir/batches.log`) through the launcher with `--on-failure continue
/// --prefix-output` and `flags`, rank 1 SIGKILLed once `prefix`'s rank 0
/// reported the first epoch: its output, stdout, and both for a failure's
/// message.
fn mnist_with_rank_1_killed(
    program: &str,
    dir: &Path,
    flags: &[&str],
    (prefix, epochs): (&str, usize),
) -> (Output, String, String) {
    let mut cmd = Command::new(launcher());
    cmd.args(["--standalone", "--nproc-per-node", "3"])
        .args(["--on-failure", "continue", "--prefix-output"])
        .args(flags)
        .arg(example(program))
        .arg("--data-dir")
        .arg(mnist_data(env!("CARGO_MANIFEST_DIR")))
        .args(MNIST_SUBSET)
        .args(["--epochs", &epochs.to_string(), "--batch-size", "16"])
        .arg("--print-params")
        .arg("--log-batches")
        .arg(dir.join("batches.log"));
    let mut job = Interactive::start(cmd, dir);
    job.wait_for(&format!("{prefix} epoch=0 "), Duration::from_secs(300));
    let victim = worker_pid(job.pid(), 1).expect("rank 1 runs");
    // SAFETY: kill has no memory-safety preconditions.
    unsafe { libc::kill(victim, libc::SIGKILL) };
    let (out, _) = job.wait(Duration::from_secs(300));
    let text = stdout(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let context = format!("{program}\n{text}\n{stderr}");
    (out, text, context)
}

/// One process trained on the global batches `dir/batches.log` lists ends
/// where the ranks did (`text`'s parameters, after `epochs`), to AdamW's
/// tolerances.
fn mnist_replay_close(program: &str, dir: &Path, (epochs, text): (usize, &str), context: &str) {
    let mut replay = Command::new(example(program));
    replay
        .arg("--data-dir")
        .arg(mnist_data(env!("CARGO_MANIFEST_DIR")))
        .args(MNIST_SUBSET)
        .args(["--epochs", &epochs.to_string(), "--batch-size", "16"])
        .args(["--print-params", "--replay"])
        .arg(dir.join("batches.log"));
    let replayed = run(replay, dir, Duration::from_secs(300));
    assert_success(&replayed);
    assert_adamw_replay_close(program, text, &stdout(&replayed), context);
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
    let reference_fingerprint = fingerprint(&stdout(&reference), TOY_FINGERPRINT);
    assert!(reference_fingerprint.is_some(), "{}", stdout(&reference));
    assert_eq!(
        fingerprint(&text, TOY_FINGERPRINT),
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
    let reference_dir = scratch("toy-sigstop-reference");
    let mut reference = Command::new(launcher());
    reference
        .args(["--standalone", "--nproc-per-node", "2"])
        .arg(example("toy"))
        .args(toy_args)
        .args(["--batch-size", "2"]);
    let reference = run(reference, &reference_dir, Duration::from_secs(120));
    assert_success(&reference);
    let expected = fingerprint(&stdout(&reference), TOY_FINGERPRINT);
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
    assert_eq!(fingerprint(&text, TOY_FINGERPRINT), expected, "{context}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&reference_dir);
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
    let expected = fingerprint(&stdout(&reference[0]), TOY_FINGERPRINT);
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
    assert_eq!(
        fingerprint(&stdout(&outs[0].0), TOY_FINGERPRINT),
        expected,
        "{context}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&reference_dir);
}
