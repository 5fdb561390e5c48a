//! The Burn 0.22 trainers end to end (toy22, mnist22): real processes
//! through burn-ddp-run, a simulated torchrun agent and Open MPI's mpirun.
//! The scenarios both Burn versions' trainers pass are testkit's
//! (`trainers`, `mnist_learner`; tests/examples.rs runs them on Burn
//! 0.21's); the rest is what only these programs do.

use burn_ddp_testkit::programs::{example, run, scratch, toy_losses};
use burn_ddp_testkit::trainers::{assert_close, Trainers};
use burn_ddp_testkit::{all_ok, mpirun_program, Hosting, World};
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);

// Every scenario both Burn versions' trainers pass (testkit's `trainers`).
burn_ddp_testkit::trainer_tests!(Trainers::burn_022(cfg!(feature = "cuda")));

/// A backend only the Burn 0.21 trainers have is named with the alternatives.
#[test]
fn toy22_refuses_ndarray_naming_the_alternatives() {
    let dir = scratch("toy22-ndarray");
    let mut ndarray = Command::new(example("toy22"));
    ndarray.args(["--backend", "ndarray"]);
    let out = run(ndarray, &dir, LIMIT);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--backend ndarray") && stderr.contains("flex or cuda"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The same run under torchrun (its agent's c10d store, simulated) and under
/// `mpirun -np 2` gives the single-process losses.
#[test]
fn toy22_under_torchrun_and_mpirun_equals_one_big_batch() {
    let dir = scratch("toy22-launchers");
    let single = Trainers::burn_022(cfg!(feature = "cuda")).single_process_losses(4);
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
