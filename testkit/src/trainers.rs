//! The example trainers' scenarios, written once for both Burn versions
//! (their loops are written once too, in burn-ddp-examples-common):
//! [`trainer_tests!`](crate::trainer_tests) makes a `#[test]` of each, which
//! tests/examples.rs runs on examples/'s `toy` and `mnist` (Burn 0.21) and
//! examples-22's tests/trainers.rs on `toy22` and `mnist22`. Real processes
//! through the launcher, against one process with the combined batch.

use crate::mnist_learner::{self, MnistLearner};
use crate::programs::{
    self, assert_success, field, launcher, relative, run, scratch, stdout, toy_losses,
};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);

/// One Burn version's trainers.
pub struct Trainers {
    /// The toy trainer (`toy`, `toy22`).
    pub toy: PathBuf,
    /// The MNIST trainer (`mnist`, `mnist22`).
    pub mnist: PathBuf,
    /// The real MNIST files.
    pub data: PathBuf,
    /// What the snapshots and the saved model are written as (`mpk` on
    /// Burn 0.21, `ckpt` on 0.22).
    pub extension: &'static str,
    /// What a trainer says of a file that is not a checkpoint of its Burn.
    pub not_a_checkpoint: &'static str,
    /// What Burn's Learner checkpointer writes (`mpk`, `bpk`).
    pub learner_extension: &'static str,
    /// Whether the programs were built with the `cuda` feature.
    pub cuda: bool,
}

/// The `#[test]` functions of every scenario of [`crate::trainers`], each
/// on the trainers `$trainers` (an expression making a [`Trainers`]).
#[macro_export]
macro_rules! trainer_tests {
    ($trainers:expr) => {
        $crate::trainer_tests!(
            @each $trainers;
            toy_two_ranks_equal_one_big_batch_and_resume,
            toy_global_batch_size_splits_over_the_ranks_or_is_refused,
            toy_ctrl_c_stops_every_rank_before_the_same_step,
            toy_resume_from_a_missing_checkpoint_names_the_file,
            toy_resume_auto_skips_a_corrupt_snapshot_and_refuses_another_run,
            toy_on_two_machines_equals_one_big_batch,
            trainer_command_lines,
            mnist_short_run_on_two_ranks_learns_and_saves_the_model,
            mnist_reads_uncompressed_idx_files_the_test_writes,
            mnist_missing_or_corrupt_files_are_named,
            mnist_snapshots_resume_by_themselves_and_end_as_uninterrupted,
            mnist_learner_on_two_ranks_writes_one_experiment,
            mnist_learner_ctrl_c_stops_cleanly_and_resumes,
            mnist_learner_killed_mid_epoch_resumes_by_itself_and_ends_as_uninterrupted,
            mnist_learner_goes_on_without_a_rank_killed_mid_epoch,
        );
    };
    (@each $trainers:expr; $($scenario:ident),* $(,)?) => {
        $(
            #[test]
            fn $scenario() {
                $crate::trainers::$scenario(&$trainers);
            }
        )*
    };
}

impl Trainers {
    /// examples/'s `toy` and `mnist` on Burn 0.21 (built with the `cuda`
    /// feature or not).
    pub fn burn_021(cuda: bool) -> Self {
        Self {
            toy: programs::example("toy"),
            mnist: programs::example("mnist"),
            data: programs::mnist_data(env!("CARGO_MANIFEST_DIR")),
            extension: "mpk",
            not_a_checkpoint: "not a record of this model",
            learner_extension: "mpk",
            cuda,
        }
    }

    /// examples-22's `toy22` and `mnist22` on Burn 0.22.
    pub fn burn_022(cuda: bool) -> Self {
        Self {
            toy: programs::example("toy22"),
            mnist: programs::example("mnist22"),
            data: programs::mnist_data(env!("CARGO_MANIFEST_DIR")),
            extension: "ckpt",
            not_a_checkpoint: "not a burn-ddp checkpoint",
            learner_extension: "bpk",
            cuda,
        }
    }

    /// `mnist --learner` as [`mnist_learner`]'s scenarios take it.
    fn learner(&self) -> MnistLearner {
        MnistLearner {
            program: self.mnist.clone(),
            data: self.data.clone(),
            checkpoint_extension: self.learner_extension,
            model_file: format!("model.{}", self.extension),
        }
    }

    /// The toy program's name, for scratch folders.
    fn name(&self) -> String {
        self.toy
            .file_name()
            .map_or("toy".into(), |name| name.to_string_lossy().into_owned())
    }

    /// A scratch folder named after the program and `what`.
    fn scratch(&self, what: &str) -> PathBuf {
        scratch(&format!("{}-{what}", self.name()))
    }

    /// The toy on `ranks` ranks through the launcher (one process without
    /// it), in `dir`, with `args`.
    fn toy(&self, ranks: usize, dir: &Path, args: &[&str]) -> Output {
        let mut cmd = if ranks == 1 {
            Command::new(&self.toy)
        } else {
            let mut cmd = Command::new(launcher());
            cmd.args(["--standalone", "--nproc-per-node", &ranks.to_string()])
                .arg(&self.toy);
            cmd
        };
        cmd.args(args);
        run(cmd, dir, LIMIT)
    }

    /// `epochs` epochs of the toy at batch 128 in one process: the
    /// reference for 2 ranks at batch 64.
    pub fn single_process_losses(&self, epochs: usize) -> Vec<(usize, f64)> {
        // A folder of its own: the tests calling it run at once.
        static RUNS: AtomicUsize = AtomicUsize::new(0);
        let dir = self.scratch(&format!("single-{}", RUNS.fetch_add(1, Ordering::Relaxed)));
        let epochs = epochs.to_string();
        let args = ["--epochs", &epochs, "--batch-size", "128"];
        let out = self.toy(1, &dir, &[&args[..], &["--loss-precision", "9"]].concat());
        assert_success(&out);
        let _ = std::fs::remove_dir_all(&dir);
        toy_losses(&stdout(&out))
    }
}

/// The same epochs, each loss within 1e-5 (relative) of the reference's.
pub fn assert_close(what: &str, got: &[(usize, f64)], want: &[(usize, f64)]) {
    assert_eq!(
        got.iter().map(|(e, _)| *e).collect::<Vec<_>>(),
        want.iter().map(|(e, _)| *e).collect::<Vec<_>>(),
        "{what}: epochs"
    );
    for ((e, a), (_, b)) in got.iter().zip(want) {
        assert!(
            relative(*a, *b) < 1e-5,
            "epoch {e}: {what} gives {a}, the reference {b}"
        );
    }
}

/// What a trainer's `<prefix>: <hex>` line says (`Parameters fingerprint`
/// for the toy, `parameters fingerprint` for MNIST).
pub fn fingerprint(text: &str, prefix: &str) -> Option<String> {
    text.lines()
        .find_map(|l| Some(l.split_once(&format!("{prefix}: "))?.1.to_string()))
}

/// The toy on 2 ranks x 64 computes what one process computes at 128
/// (epoch for epoch), checkpoints every 2 epochs beside its settings, and a
/// resume from epoch 2 goes on where that run was (with `RUST_LOG`, the
/// libraries' records, each naming its rank). A resume with other settings
/// says what changed; a file that is not a checkpoint is named.
pub fn toy_two_ranks_equal_one_big_batch_and_resume(t: &Trainers) {
    let dir = t.scratch("two-ranks");
    let args = [
        "--epochs",
        "4",
        "--batch_size",
        "64",
        "--loss-precision",
        "9",
    ];
    let out = t.toy(2, &dir, &args);
    assert_success(&out);
    let distributed = toy_losses(&stdout(&out));
    assert!(
        distributed.len() == 4 && distributed[3].1 < distributed[0].1,
        "the loss should fall: {distributed:?}"
    );
    assert_eq!(stdout(&out).matches("starting training").count(), 2);
    for epoch in [2, 4] {
        let file = format!("model_epoch_{epoch}.{}", t.extension);
        assert!(dir.join(file).is_file());
    }
    // The run's hyper-parameters beside the checkpoints.
    let config = std::fs::read_to_string(dir.join("toy_config.json")).unwrap();
    for field in ["\"batch_size\": 64", "\"world_size\": 2", "\"lr\": 0.01"] {
        assert!(config.contains(field), "{field} missing from {config}");
    }
    // By default the libraries' debug records stay hidden.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("DEBUG"), "{stderr}");
    assert_close("2 x 64", &distributed, &t.single_process_losses(4));

    toy_resumes_from_epoch_2(t, &dir, &distributed);
    toy_resume_with_other_settings_says_what_changed(t, &dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Resuming from epoch 2 continues where that run was; RUST_LOG shows what
/// the libraries do, each record naming its rank.
fn toy_resumes_from_epoch_2(t: &Trainers, dir: &Path, uninterrupted: &[(usize, f64)]) {
    let mut resume = Command::new(launcher());
    let snapshot = format!("model_epoch_2.{}", t.extension);
    resume
        .env("RUST_LOG", "burn_ddp=debug")
        .args(["--standalone", "--nproc-per-node", "2"])
        .arg(&t.toy)
        .args([
            "--epochs",
            "4",
            "--loss-precision",
            "9",
            "--resume",
            &snapshot,
        ]);
    let out = run(resume, dir, LIMIT);
    assert_success(&out);
    assert!(stdout(&out).contains("at epoch 2"), "{}", stdout(&out));
    assert_close("resumed", &toy_losses(&stdout(&out)), &uninterrupted[2..]);
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
}

/// A resume with another learning rate on another world size warns what
/// changed; a file that is not a checkpoint is named on every rank.
fn toy_resume_with_other_settings_says_what_changed(t: &Trainers, dir: &Path) {
    let args = ["--epochs", "3", "--resume", "model_epoch_2", "--lr", "0.02"];
    let out = t.toy(1, dir, &[&args[..], &["--batch-size", "128"]].concat());
    assert_success(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("other hyper-parameters")
            && stderr.contains("lr: 0.01 -> 0.02")
            && stderr.contains("world_size: 2 -> 1")
            && !stderr.contains("epochs:"),
        "{stderr}"
    );

    let junk = format!("junk.{}", t.extension);
    std::fs::write(dir.join(&junk), b"junk").unwrap();
    let out = t.toy(2, dir, &["--resume", &junk]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&junk) && stderr.contains(t.not_a_checkpoint),
        "{stderr}"
    );
}

/// `--global-batch-size 128` on 2 ranks is 64 per rank's loader and trains
/// as one process with batch 128; 64 over 3 ranks is refused on every rank
/// before any data is touched, naming the multiples that would work.
pub fn toy_global_batch_size_splits_over_the_ranks_or_is_refused(t: &Trainers) {
    let dir = t.scratch("global-batch");
    let args = ["--epochs", "2", "--global-batch-size", "128"];
    let out = t.toy(2, &dir, &[&args[..], &["--loss-precision", "9"]].concat());
    assert_success(&out);
    let config = std::fs::read_to_string(dir.join("toy_config.json")).unwrap();
    assert!(config.contains("\"batch_size\": 64"), "{config}");
    let split = toy_losses(&stdout(&out));
    assert_close("2 ranks sharing 128", &split, &t.single_process_losses(2));

    let out = t.toy(3, &dir, &["--global-batch-size", "64"]);
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
}

/// The trainers' command lines: clap's help, version, typo suggestions and
/// usage errors (exit 2), the reference scripts' underscore spellings, and
/// CUDA asked of a build without it, naming the rebuild (exit 1).
pub fn trainer_command_lines(t: &Trainers) {
    let dir = t.scratch("cli");
    for (name, program) in [("toy", &t.toy), ("mnist", &t.mnist)] {
        let invoke = |args: &[&str]| {
            let mut cmd = Command::new(program);
            cmd.args(args);
            let out = run(cmd, &dir, Duration::from_secs(60));
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            (out, stderr)
        };
        let (out, _) = invoke(&["--version"]);
        assert_success(&out);
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(stdout(&out).trim(), format!("{name} {version}"));
        let (out, _) = invoke(&["--help"]);
        assert_success(&out);
        let help = stdout(&out);
        assert!(
            help.contains("--batch-size") && help.contains("batch_size"),
            "{help}"
        );
        for (args, expect) in [
            (&["--batch-sise", "3"][..], "--batch-size"),
            (&["--epoch", "3"][..], "--epochs"),
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
        if !t.cuda {
            let (out, stderr) = invoke(&["--backend", "cuda"]);
            assert_eq!(out.status.code(), Some(1), "{stderr}");
            assert!(stderr.contains("rebuild with --features cuda"), "{stderr}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--resume` of a file that does not exist names it (extension added) and
/// the rank.
pub fn toy_resume_from_a_missing_checkpoint_names_the_file(t: &Trainers) {
    let dir = t.scratch("missing");
    let out = t.toy(1, &dir, &["--resume", "nowhere/model_epoch_9"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let file = format!("nowhere/model_epoch_9.{}", t.extension);
    assert!(
        stderr.contains(&file) && stderr.contains("rank 0"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--resume auto` on 2 ranks, saving every epoch: an empty folder starts
/// afresh; a damaged newer snapshot is skipped with a warning naming it and
/// the run goes on from model_epoch_2 by itself, ending with the parameters
/// of an uninterrupted run; another run's folder (other settings) is an
/// error naming the saved configuration and what differs; a folder that
/// cannot be written is refused before the first step, naming it.
pub fn toy_resume_auto_skips_a_corrupt_snapshot_and_refuses_another_run(t: &Trainers) {
    let dir = t.scratch("auto");
    let toy = |extra: &[&str]| {
        let args = ["--save-interval", "1", "--batch-size", "16"];
        t.toy(2, &dir, &[&args[..], extra].concat())
    };
    let straight = toy(&["--epochs", "4", "--checkpoint-dir", "straight"]);
    assert_success(&straight);
    let expected = fingerprint(&stdout(&straight), "Parameters fingerprint");
    assert!(expected.is_some(), "{}", stdout(&straight));
    let auto = ["--checkpoint-dir", "ck", "--resume", "auto"];
    let first = toy(&[&["--epochs", "2"][..], &auto].concat());
    assert_success(&first);
    assert!(
        stdout(&first).contains("No snapshot in ck: starting afresh"),
        "{}",
        stdout(&first)
    );
    let corrupt = format!("model_epoch_3.{}", t.extension);
    std::fs::write(dir.join("ck").join(&corrupt), b"half a file").unwrap();
    let resumed = toy(&[&["--epochs", "4"][..], &auto].concat());
    assert_success(&resumed);
    let (text, stderr) = (stdout(&resumed), String::from_utf8_lossy(&resumed.stderr));
    assert!(
        text.contains("Resumed from ck/model_epoch_2 at epoch 2")
            && stderr.contains(&format!("snapshot ck/{corrupt} cannot be read")),
        "{text}\n{stderr}"
    );
    assert_eq!(
        fingerprint(&text, "Parameters fingerprint"),
        expected,
        "{text}"
    );

    let other = toy(&[&["--epochs", "4", "--lr", "0.5"][..], &auto].concat());
    assert_eq!(other.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert!(
        stderr.contains("another run's")
            && stderr.contains("toy_config.json")
            && stderr.contains("lr: 0.01 -> 0.5"),
        "{stderr}"
    );
    let unwritable = dir
        .join("ck")
        .join(format!("model_epoch_4.{}", t.extension));
    let unwritable = unwritable.join("sub");
    let folder = ["--checkpoint-dir", unwritable.to_str().unwrap()];
    let refused = toy(&[&["--epochs", "4", "--resume", "auto"][..], &folder].concat());
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains(unwritable.to_str().unwrap()) && !stdout(&refused).contains("Epoch 1/"),
        "{stderr}\n{}",
        stdout(&refused)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The MNIST trainer on 2 ranks on a real subset: the loss falls, accuracy
/// beats chance by far, rank 0 alone logs and saves the model and its
/// settings.
pub fn mnist_short_run_on_two_ranks_learns_and_saves_the_model(t: &Trainers) {
    let dir = t.scratch("mnist");
    let mut cmd = Command::new(launcher());
    cmd.args(["--standalone", "--nproc-per-node", "2"])
        .arg(&t.mnist)
        .arg("--data-dir")
        .arg(&t.data)
        .args(["--train-samples", "640", "--test-samples", "300"])
        .args(["--epochs", "2", "--batch-size", "32"]);
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
    assert!(dir.join(format!("mnist_ddp.{}", t.extension)).is_file());
    assert!(dir.join("mnist_ddp.config.json").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Writes an IDX file of unsigned bytes.
pub fn write_idx(path: &Path, magic: u32, dims: &[u32], data: &[u8]) {
    let mut bytes = magic.to_be_bytes().to_vec();
    for d in dims {
        bytes.extend_from_slice(&d.to_be_bytes());
    }
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).unwrap();
}

/// The four MNIST files, uncompressed, with `train` and `test` images of
/// made-up pixels and labels.
pub fn small_mnist(dir: &Path, train: u32, test: u32) {
    let images = |n: u32| (0..n * 784).map(|i| (i % 251) as u8).collect::<Vec<u8>>();
    let labels = |n: u32| (0..n).map(|i| (i % 10) as u8).collect::<Vec<u8>>();
    for (prefix, n) in [("train", train), ("t10k", test)] {
        let images_file = dir.join(format!("{prefix}-images-idx3-ubyte"));
        write_idx(&images_file, 0x803, &[n, 28, 28], &images(n));
        let labels_file = dir.join(format!("{prefix}-labels-idx1-ubyte"));
        write_idx(&labels_file, 0x801, &[n], &labels(n));
    }
}

/// The MNIST trainer in `dir` on the uncompressed files a test wrote.
pub fn mnist_reads_uncompressed_idx_files_the_test_writes(t: &Trainers) {
    let dir = t.scratch("mnist-small");
    small_mnist(&dir, 48, 20);
    let mut cmd = Command::new(&t.mnist);
    cmd.args(["--data-dir", ".", "--epochs", "1", "--batch-size", "16"]);
    let out = run(cmd, &dir, LIMIT);
    assert_success(&out);
    assert!(
        stdout(&out).contains("epoch=0 avg_loss="),
        "{}",
        stdout(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The MNIST trainer on `--data-dir .` in `dir`: its exit code and stderr.
fn mnist_error(t: &Trainers, dir: &Path, data_dir: &str) -> (Option<i32>, String) {
    let mut cmd = Command::new(&t.mnist);
    cmd.args(["--data-dir", data_dir]);
    let out = run(cmd, dir, Duration::from_secs(60));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code(), stderr)
}

/// A missing folder, a wrong magic number, a truncated file and a test split
/// of another image size: each named with what is wrong.
pub fn mnist_missing_or_corrupt_files_are_named(t: &Trainers) {
    let dir = t.scratch("mnist-bad");
    let (code, stderr) = mnist_error(t, &dir, "absent");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("train-images-idx3-ubyte") && stderr.contains("--data-dir"),
        "{stderr}"
    );

    small_mnist(&dir, 8, 8);
    write_idx(&dir.join("t10k-labels-idx1-ubyte"), 0x803, &[8], &[0; 8]);
    let (code, stderr) = mnist_error(t, &dir, ".");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("t10k-labels-idx1-ubyte") && stderr.contains("magic 0x00000803"),
        "{stderr}"
    );

    small_mnist(&dir, 8, 8);
    let truncated = [0, 0, 8, 3, 0, 0, 0, 8];
    std::fs::write(dir.join("train-images-idx3-ubyte"), &truncated[..]).unwrap();
    let (_, stderr) = mnist_error(t, &dir, ".");
    assert!(
        stderr.contains("train-images-idx3-ubyte") && stderr.contains("truncated"),
        "{stderr}"
    );

    // The test split's image size is checked too, not only the training split's.
    small_mnist(&dir, 8, 8);
    let small_images = dir.join("t10k-images-idx3-ubyte");
    write_idx(&small_images, 0x803, &[8, 14, 14], &[0; 8 * 14 * 14]);
    let (code, stderr) = mnist_error(t, &dir, ".");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("t10k-images-idx3-ubyte") && stderr.contains("14x14"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The hand-written MNIST loop's snapshots: 2 ranks train 2 epochs into
/// `--checkpoint-dir`, then `--resume auto --epochs 3` goes on from
/// model_epoch_2 and ends with the parameters of an uninterrupted 3-epoch
/// run; another run's folder and `--resume` without a folder are refused.
pub fn mnist_snapshots_resume_by_themselves_and_end_as_uninterrupted(t: &Trainers) {
    let dir = t.scratch("mnist-snapshots");
    small_mnist(&dir, 96, 20);
    let mnist = |extra: &[&str]| {
        let mut cmd = Command::new(launcher());
        cmd.args(["--standalone", "--nproc-per-node", "2"])
            .arg(&t.mnist)
            .args(["--data-dir", ".", "--batch-size", "8"])
            .args(extra);
        run(cmd, &dir, LIMIT)
    };
    let straight = mnist(&["--epochs", "3", "--output", "straight"]);
    assert_success(&straight);
    let expected = fingerprint(&stdout(&straight), "parameters fingerprint");
    assert!(expected.is_some(), "{}", stdout(&straight));

    let auto = ["--checkpoint-dir", "ck", "--resume", "auto"];
    let first = mnist(&[&["--epochs", "2"][..], &auto].concat());
    assert_success(&first);
    let snapshot = format!("ck/model_epoch_2.{}", t.extension);
    assert!(
        stdout(&first).contains("No snapshot in ck: starting afresh")
            && dir.join(snapshot).is_file(),
        "{}",
        stdout(&first)
    );
    let resumed = mnist(&[&["--epochs", "3"][..], &auto].concat());
    assert_success(&resumed);
    let text = stdout(&resumed);
    assert!(
        text.contains("Resumed from ck/model_epoch_2 at epoch 2")
            && text.contains("epoch=2 ")
            && !text.contains("epoch=1 "),
        "{text}"
    );
    assert_eq!(
        fingerprint(&text, "parameters fingerprint"),
        expected,
        "{text}"
    );

    let other = mnist(&[&["--epochs", "4", "--lr", "0.01"][..], &auto].concat());
    assert_eq!(other.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&other.stderr);
    assert!(
        stderr.contains("another run's") && stderr.contains("mnist_config.json"),
        "{stderr}"
    );
    let mut bare = Command::new(&t.mnist);
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

/// Ctrl-C at the terminal stops both ranks before the same step; the run
/// goes on from the checkpoint rank 0 names.
pub fn toy_ctrl_c_stops_every_rank_before_the_same_step(t: &Trainers) {
    programs::toy_ctrl_c_then_resume(&t.toy, &format!("{}-ctrl-c", t.name()));
}

/// The toy over 2 machines x 2 ranks x batch 32 (network namespaces, a
/// launcher on each, TCP between them) computes what one process computes
/// with batch 128.
pub fn toy_on_two_machines_equals_one_big_batch(t: &Trainers) {
    programs::toy_on_two_machines_equals_one_big_batch(&t.toy, &t.name());
}

/// [`mnist_learner::writes_one_experiment`].
pub fn mnist_learner_on_two_ranks_writes_one_experiment(t: &Trainers) {
    mnist_learner::writes_one_experiment(&t.learner());
}

/// [`mnist_learner::ctrl_c_stops_cleanly_and_resumes`].
pub fn mnist_learner_ctrl_c_stops_cleanly_and_resumes(t: &Trainers) {
    mnist_learner::ctrl_c_stops_cleanly_and_resumes(&t.learner());
}

/// [`mnist_learner::killed_mid_epoch_resumes_by_itself`].
pub fn mnist_learner_killed_mid_epoch_resumes_by_itself_and_ends_as_uninterrupted(t: &Trainers) {
    mnist_learner::killed_mid_epoch_resumes_by_itself(&t.learner());
}

/// [`mnist_learner::goes_on_without_a_rank_killed_mid_epoch`].
pub fn mnist_learner_goes_on_without_a_rank_killed_mid_epoch(t: &Trainers) {
    mnist_learner::goes_on_without_a_rank_killed_mid_epoch(&t.learner());
}
