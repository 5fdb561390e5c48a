//! The Burn 0.22 trainers end to end: real processes through burn-ddp-run, a
//! simulated torchrun agent and Open MPI's mpirun, against one process with
//! the combined batch.

use burn_ddp_testkit::mnist_learner::{self, MnistLearner};
use burn_ddp_testkit::programs::{
    assert_success, example, field, launcher, mnist_data, relative, run, scratch, stdout,
    toy_ctrl_c_then_resume, toy_losses, toy_on_two_machines_equals_one_big_batch,
};
use burn_ddp_testkit::{all_ok, mpirun_program, Hosting, World};
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);

/// 4 epochs of the toy at batch 128 in one process: the reference.
fn single_process_losses(dir: &std::path::Path) -> Vec<(usize, f64)> {
    let mut one = Command::new(example("toy22"));
    one.args([
        "--epochs",
        "4",
        "--batch-size",
        "128",
        "--loss-precision",
        "9",
    ]);
    let out = run(one, dir, LIMIT);
    assert_success(&out);
    toy_losses(&stdout(&out))
}

fn assert_close(what: &str, got: &[(usize, f64)], want: &[(usize, f64)]) {
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

#[test]
fn toy22_two_ranks_equal_one_big_batch_and_resume_from_a_checkpoint() {
    let dir = scratch("toy22");
    let mut two = Command::new(launcher());
    two.args(["--standalone", "--nproc-per-node", "2"])
        .arg(example("toy22"))
        .args([
            "--epochs",
            "4",
            "--batch_size",
            "64",
            "--loss-precision",
            "9",
        ]);
    let out = run(two, &dir, LIMIT);
    assert_success(&out);
    let distributed = toy_losses(&stdout(&out));
    assert!(
        distributed[3].1 < distributed[0].1,
        "the loss should fall: {distributed:?}"
    );
    assert_eq!(stdout(&out).matches("starting training").count(), 2);
    for epoch in [2, 4] {
        assert!(dir.join(format!("model_epoch_{epoch}.ckpt")).is_file());
    }
    let config = std::fs::read_to_string(dir.join("toy_config.json")).unwrap();
    for field in ["\"batch_size\": 64", "\"world_size\": 2"] {
        assert!(config.contains(field), "{field} missing from {config}");
    }

    let single_dir = scratch("toy22-single");
    let single = single_process_losses(&single_dir);
    assert_close("2 x 64", &distributed, &single);

    // Resuming from epoch 2 continues where that run was.
    let mut resume = Command::new(launcher());
    resume
        .args(["--standalone", "--nproc-per-node", "2"])
        .arg(example("toy22"))
        .args([
            "--epochs",
            "4",
            "--loss-precision",
            "9",
            "--resume",
            "model_epoch_2.ckpt",
        ]);
    let out = run(resume, &dir, LIMIT);
    assert_success(&out);
    assert!(stdout(&out).contains("at epoch 2"), "{}", stdout(&out));
    assert_close("resumed", &toy_losses(&stdout(&out)), &distributed[2..]);

    // A file that is not a checkpoint is named, on every rank.
    std::fs::write(dir.join("junk.ckpt"), b"junk").unwrap();
    let mut bad = Command::new(launcher());
    bad.args(["--standalone", "--nproc-per-node", "2"])
        .arg(example("toy22"))
        .args(["--resume", "junk.ckpt"]);
    let out = run(bad, &dir, LIMIT);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("junk.ckpt") && stderr.contains("not a burn-ddp checkpoint"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&single_dir);
}

/// The same run under torchrun (its agent's c10d store, simulated) and under
/// `mpirun -np 2` gives the single-process losses.
#[test]
fn toy22_under_torchrun_and_mpirun_equals_one_big_batch() {
    let dir = scratch("toy22-launchers");
    let single = single_process_losses(&dir);
    let args = [
        "--epochs",
        "4",
        "--batch-size",
        "64",
        "--loss-precision",
        "9",
    ];
    let ckpt = dir.join("torchrun");
    std::fs::create_dir_all(&ckpt).unwrap();
    let mut world = World::new(2).program(example("toy22"), &args);
    world.hosting = Hosting::TorchrunAgent;
    world.dir = Some(ckpt);
    world.deadline = LIMIT;
    let outcomes = world.run("toy22");
    all_ok(&outcomes).unwrap();
    assert_close("torchrun 2 x 64", &toy_losses(&outcomes[0].stdout), &single);

    let mpi_dir = dir.join("mpirun");
    let mut mpi_args = args.to_vec();
    mpi_args.extend(["--checkpoint-dir", mpi_dir.to_str().unwrap()]);
    std::fs::create_dir_all(&mpi_dir).unwrap();
    let Some(outcomes) = mpirun_program(2, "toy22", &example("toy22"), &mpi_args, LIMIT).unwrap()
    else {
        return; // not installed here; .ci/run installs it and requires it
    };
    all_ok(&outcomes).unwrap();
    assert_close("mpirun 2 x 64", &toy_losses(&outcomes[0].stdout), &single);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Ctrl-C at the terminal stops both ranks before the same step; the run goes
/// on from the checkpoint rank 0 names.
#[test]
fn toy22_ctrl_c_stops_every_rank_before_the_same_step() {
    toy_ctrl_c_then_resume(&example("toy22"), "toy22-ctrl-c");
}

/// `--global-batch-size 128` on 2 ranks trains as one process with batch 128.
#[test]
fn toy22_global_batch_size_equals_one_big_batch() {
    let dir = scratch("toy22-global-batch");
    let mut two = Command::new(launcher());
    two.args(["--standalone", "--nproc-per-node", "2"])
        .arg(example("toy22"))
        .args([
            "--epochs",
            "4",
            "--global-batch-size",
            "128",
            "--loss-precision",
            "9",
        ]);
    let out = run(two, &dir, LIMIT);
    assert_success(&out);
    let reference = single_process_losses(&dir);
    assert_close(
        "2 ranks sharing 128",
        &toy_losses(&stdout(&out)),
        &reference,
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The shared command line: clap's errors, a backend only the Burn 0.21
/// trainer has named with the alternatives, and CUDA without the feature
/// naming the rebuild.
#[test]
fn toy22_command_line() {
    let dir = scratch("toy22-cli");
    let mut typo = Command::new(example("toy22"));
    typo.arg("--epoch");
    let out = run(typo, &dir, LIMIT);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--epochs"));
    let mut ndarray = Command::new(example("toy22"));
    ndarray.args(["--backend", "ndarray"]);
    let out = run(ndarray, &dir, LIMIT);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--backend ndarray") && stderr.contains("flex or cuda"),
        "{stderr}"
    );
    if !cfg!(feature = "cuda") {
        let mut cuda = Command::new(example("toy22"));
        cuda.args(["--backend", "cuda"]);
        let out = run(cuda, &dir, LIMIT);
        assert_eq!(out.status.code(), Some(1));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("rebuild with --features cuda"), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The MNIST trainer on Burn 0.22, 2 ranks on a real subset: the loss falls,
/// accuracy beats chance by far, rank 0 alone logs and saves.
#[test]
fn mnist22_short_run_on_two_ranks_learns_and_saves_the_model() {
    let dir = scratch("mnist22");
    let mut cmd = Command::new(launcher());
    cmd.args(["--standalone", "--nproc-per-node", "2"])
        .arg(example("mnist22"))
        .arg("--data-dir")
        .arg(mnist_data(env!("CARGO_MANIFEST_DIR")))
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
    assert!(dir.join("mnist_ddp.ckpt").is_file());
    assert!(dir.join("mnist_ddp.config.json").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}

/// `toy22 --resume auto` on 2 ranks: 2 epochs saved every epoch, then the
/// run goes on to 4 from model_epoch_2.ckpt by itself (a damaged newer file
/// skipped with a warning naming it) and ends with the parameters of an
/// uninterrupted 4-epoch run; the MNIST trainer refuses snapshots for now.
#[test]
fn toy22_resume_auto_ends_as_an_uninterrupted_run() {
    let dir = scratch("toy22-auto");
    let toy = |extra: &[&str]| {
        let mut cmd = Command::new(launcher());
        cmd.args(["--standalone", "--nproc-per-node", "2"])
            .arg(example("toy22"))
            .args(["--save-interval", "1", "--batch-size", "16"])
            .args(extra);
        run(cmd, &dir, LIMIT)
    };
    let fingerprint = |text: &str| {
        text.lines()
            .find_map(|l| Some(l.split_once("Parameters fingerprint: ")?.1.to_string()))
    };
    let straight = toy(&["--epochs", "4", "--checkpoint-dir", "straight"]);
    assert_success(&straight);
    let expected = fingerprint(&stdout(&straight));
    assert!(expected.is_some(), "{}", stdout(&straight));
    std::fs::create_dir_all(dir.join("ck")).unwrap();
    let first = toy(&[
        "--epochs",
        "2",
        "--checkpoint-dir",
        "ck",
        "--resume",
        "auto",
    ]);
    assert_success(&first);
    assert!(
        stdout(&first).contains("No snapshot in ck: starting afresh"),
        "{}",
        stdout(&first)
    );
    std::fs::write(dir.join("ck/model_epoch_3.ckpt"), b"not a checkpoint").unwrap();
    let resumed = toy(&[
        "--epochs",
        "4",
        "--checkpoint-dir",
        "ck",
        "--resume",
        "auto",
    ]);
    assert_success(&resumed);
    let (text, stderr) = (
        stdout(&resumed),
        String::from_utf8_lossy(&resumed.stderr).into_owned(),
    );
    assert!(
        text.contains("Resumed from ck/model_epoch_2 at epoch 2")
            && stderr.contains("model_epoch_3.ckpt cannot be read"),
        "{text}\n{stderr}"
    );
    assert_eq!(fingerprint(&text), expected, "{text}");
    let mut mnist = Command::new(example("mnist22"));
    mnist.args(["--checkpoint-dir", "ck", "--resume", "auto"]);
    let refused = run(mnist, &dir, LIMIT);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("not built yet"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `mnist22 --learner` as testkit's Learner scenarios check it (the same
/// scenarios as the Burn 0.21 trainer's).
fn mnist22_learner() -> MnistLearner {
    MnistLearner {
        program: example("mnist22"),
        data: mnist_data(env!("CARGO_MANIFEST_DIR")),
        checkpoint_extension: "bpk",
        model_file: "model.ckpt".into(),
    }
}

#[test]
fn mnist22_learner_on_two_ranks_writes_one_experiment() {
    mnist_learner::writes_one_experiment(&mnist22_learner());
}

#[test]
fn mnist22_learner_ctrl_c_stops_cleanly_and_resumes() {
    mnist_learner::ctrl_c_stops_cleanly_and_resumes(&mnist22_learner());
}

#[test]
fn mnist22_learner_killed_mid_epoch_resumes_by_itself_and_ends_as_uninterrupted() {
    mnist_learner::killed_mid_epoch_resumes_by_itself(&mnist22_learner());
}

/// toy22 over 2 machines x 2 ranks x batch 32 (network namespaces, a launcher
/// on each) computes what one process computes with batch 128.
#[test]
fn toy22_on_two_machines_equals_one_big_batch() {
    toy_on_two_machines_equals_one_big_batch(&example("toy22"), "toy22");
}
