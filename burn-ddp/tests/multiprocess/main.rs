//! burn-ddp across real processes: tensor collectives and `Ddp<B>` training on
//! NdArray, checked against single-process references.

mod gan;
mod half;
mod models;
mod scenarios;

use burn::backend::NdArray;
use burn::tensor::{Int, Tensor, TensorData};
use burn_ddp::ReduceOp;
use burn_ddp_testkit::{all_ok, check, run_cases, Case, World, SCENARIO_VAR};

type B = NdArray;

fn main() {
    if let Ok(name) = std::env::var(SCENARIO_VAR) {
        let result = scenarios::run(&name);
        if let Err(message) = result {
            eprintln!("ERROR: {message}");
            std::process::exit(1);
        }
        std::process::exit(0);
    }
    let cases: &[Case] = &[
        ("tensor_collectives_world_1_to_3", tensor_collectives_case),
        ("f16_and_bf16_collectives_and_gradients", half_precision),
        ("ddp_equals_one_big_batch_toy_sgd", || {
            equivalence("toy_sgd")
        }),
        ("ddp_equals_one_big_batch_toy_adamw", || {
            equivalence("toy_adamw")
        }),
        ("ddp_equals_one_big_batch_conv_sgd", || {
            equivalence("conv_sgd")
        }),
        ("ddp_equals_one_big_batch_conv_adamw", || {
            equivalence("conv_adamw")
        }),
        (
            "a_parameter_unused_on_one_rank_counts_as_zero",
            unused_parameter,
        ),
        ("different_models_fail_on_every_rank", different_models),
        (
            "check_replicas_names_the_parameter_and_rank_that_differ",
            replicas,
        ),
        ("no_sync_accumulation_equals_the_big_batch", accumulation),
        (
            "a_layout_change_on_one_rank_fails_every_rank",
            layout_change,
        ),
        (
            "two_wrapped_models_synchronise_separately_a_gan",
            two_models,
        ),
        (
            "a_gradient_outside_every_wrapped_model_fails_every_rank",
            stray_gradient,
        ),
        ("two_thousand_steps_do_not_grow_memory", memory),
        (
            "burn_ddp_backend_on_cpu_tensors",
            backend_choice_on_cpu_tensors,
        ),
        (
            "a_killed_checkpoint_writer_leaves_a_whole_checkpoint",
            killed_checkpoint_writer,
        ),
    ];
    run_cases(cases);
}

/// 2 and 3 ranks; each rank checks itself against the reference and prints the gap.
fn equivalence(scenario: &str) -> Result<(), String> {
    for world in [2, 3] {
        let outcomes = World::new(world).run(scenario);
        all_ok(&outcomes)?;
        for o in &outcomes {
            check(o.value("max_rel_diff").is_some(), || o.stdout.clone())?;
        }
    }
    Ok(())
}

fn half_precision() -> Result<(), String> {
    for world in [1, 2, 3] {
        let outcomes = World::new(world).run("half");
        all_ok(&outcomes)?;
        for o in &outcomes {
            check(o.value("done") == Some("yes"), || o.stdout.clone())?;
        }
    }
    Ok(())
}

fn unused_parameter() -> Result<(), String> {
    all_ok(&World::new(2).run("unused"))
}

/// `BURN_DDP_BACKEND` with CPU tensors: `tcp` and `auto` take the host path;
/// `nccl` is refused with the reason, even in a world of one (where it forces
/// the synchronisation that would otherwise be skipped); a typo is named.
fn backend_choice_on_cpu_tensors() -> Result<(), String> {
    for value in ["tcp", "auto"] {
        let outcomes = World::new(2).env("BURN_DDP_BACKEND", value).run("one_step");
        all_ok(&outcomes)?;
        for o in &outcomes {
            check(o.value("tensor_sum") == Some("[2.0, 2.0, 2.0]"), || {
                o.stdout.clone()
            })?;
            check(o.value("stepped").is_some_and(|b| b != "0"), || {
                o.stdout.clone()
            })?;
        }
    }
    for world in [1, 2] {
        let outcomes = World::new(world)
            .env("BURN_DDP_BACKEND", "nccl")
            .run("one_step");
        for o in &outcomes {
            let refused = format!(
                "rank {}: BURN_DDP_BACKEND=nccl, but burn-ddp was built without its `cuda` feature",
                o.rank
            );
            check(o.code.is_some_and(|c| c != 0), || format!("{o:?}"))?;
            check(
                o.stdout.contains(&format!(
                    "tensor_error burn-ddp configuration error: {refused}"
                )) && o.stderr.contains(&refused)
                    && !o.stdout.contains("stepped"),
                || format!("world {world}: {o:?}"),
            )?;
        }
    }
    let outcomes = World::new(2).env("BURN_DDP_BACKEND", "mpi").run("one_step");
    for o in &outcomes {
        check(
            o.stdout.contains("expected nccl, tcp or auto")
                || o.stderr.contains("expected nccl, tcp or auto"),
            || format!("{o:?}"),
        )?;
    }
    Ok(())
}

/// 3 ranks: identical after training in step (2 tensors compared), then the
/// last rank's frozen bias differs and every rank names `linear.bias`, rank 2
/// and that it is a buffer.
fn replicas() -> Result<(), String> {
    let outcomes = World::new(3).run("replicas");
    all_ok(&outcomes)?;
    for o in &outcomes {
        check(o.value("compared") == Some("2"), || o.stdout.clone())?;
        let error = o.value("replica_error").unwrap_or_default();
        check(
            error.starts_with(&format!("rank {}:", o.rank))
                && error.contains("parameter `linear.bias` (2 of 2) on rank(s) 2 is not rank 0's")
                && error.contains("a buffer, not trained"),
            || o.stdout.clone(),
        )?;
    }
    Ok(())
}

fn different_models() -> Result<(), String> {
    let outcomes = World::new(2).run("different_models");
    for o in &outcomes {
        check(o.code == Some(1), || format!("{o:?}"))?;
        check(
            o.stderr.contains("parameter #0")
                && o.stderr.contains("[10, 1]")
                && o.stderr.contains("[10, 2]")
                && o.stderr.contains(&format!("rank {}", o.rank)),
            || o.stderr.clone(),
        )?;
    }
    Ok(())
}

fn layout_change() -> Result<(), String> {
    let outcomes = World::new(2).run("layout_change");
    for o in &outcomes {
        // backward() cannot return an error: it panics with the reason.
        check(o.code.is_some_and(|c| c != 0), || format!("{o:?}"))?;
        check(
            o.stderr.contains("gradient synchronisation failed")
                && o.stderr.contains("parameters differ between rank")
                && o.stderr.contains("[7]"),
            || o.stderr.clone(),
        )?;
    }
    Ok(())
}

/// The GAN of `gan.rs` at 2 and 3 ranks.
fn two_models() -> Result<(), String> {
    for world in [2, 3] {
        let outcomes = World::new(world).run("gan");
        all_ok(&outcomes)?;
        for o in &outcomes {
            check(o.value("max_rel_diff").is_some(), || o.stdout.clone())?;
        }
    }
    Ok(())
}

fn stray_gradient() -> Result<(), String> {
    let outcomes = World::new(2).run("stray_gradient");
    for o in &outcomes {
        check(o.code.is_some_and(|c| c != 0), || format!("{o:?}"))?;
        check(
            o.stderr.contains("gradient synchronisation failed")
                && o.stderr.contains(&format!(
                    "rank {}: a tensor that requires gradients",
                    o.rank
                ))
                && o.stderr.contains("belongs to no wrapped model")
                && o.stderr.contains("burn_ddp::wrap"),
            || o.stderr.clone(),
        )?;
    }
    Ok(())
}

fn accumulation() -> Result<(), String> {
    all_ok(&World::new(2).run("accumulation"))
}

fn memory() -> Result<(), String> {
    let outcomes = World::new(2).run("memory");
    all_ok(&outcomes)?;
    check(outcomes[0].stdout.contains("tracked"), || {
        outcomes[0].stdout.clone()
    })
}

fn tensor_collectives_case() -> Result<(), String> {
    for world in 1..=3 {
        let outcomes = World::new(world).run("tensor_collectives");
        all_ok(&outcomes)?;
        for o in &outcomes {
            check(o.value("done") == Some("yes"), || o.stdout.clone())?;
        }
    }
    Ok(())
}

/// Float and int tensors of rank 2, each collective against its closed form.
pub fn tensor_collectives() -> Result<(), String> {
    let group = burn_ddp::init_process_group().map_err(|e| e.to_string())?;
    let (rank, n) = (group.rank(), group.world_size());
    let e = |e: burn_ddp::CommError| e.to_string();
    let device = Default::default();
    let same = |what: &str, got: TensorData, want: TensorData| {
        if got == want {
            Ok(())
        } else {
            Err(format!("{what}: got {got:?}, want {want:?}"))
        }
    };

    // A [2, 3] float tensor: value (rank + 1) * (index + 1).
    let mine = |r: usize| {
        Tensor::<B, 1, Int>::arange(1..7, &device)
            .float()
            .mul_scalar((r + 1) as f32)
            .reshape([2, 3])
    };
    let total: f32 = (1..=n).map(|r| r as f32).sum();
    let sum = burn_ddp::all_reduce(&group, mine(rank), ReduceOp::Sum).map_err(e)?;
    same(
        "sum",
        sum.into_data(),
        mine(0).mul_scalar(total).into_data(),
    )?;
    let mean = burn_ddp::all_reduce(&group, mine(rank), ReduceOp::Mean).map_err(e)?;
    mean.into_data().assert_approx_eq::<f32>(
        &mine(0).mul_scalar(total / n as f32).into_data(),
        Default::default(),
    );
    let max = burn_ddp::all_reduce(&group, mine(rank), ReduceOp::Max).map_err(e)?;
    same("max", max.into_data(), mine(n - 1).into_data())?;

    let ints = Tensor::<B, 2, Int>::from_ints([[rank as i64, -(rank as i64)]], &device);
    let gathered = burn_ddp::all_gather(&group, ints).map_err(e)?;
    if gathered.len() != n {
        return Err(format!("all_gather returned {} tensors", gathered.len()));
    }
    for (r, t) in gathered.into_iter().enumerate() {
        let want = Tensor::<B, 2, Int>::from_ints([[r as i64, -(r as i64)]], &device);
        same("all_gather", t.into_data(), want.into_data())?;
    }

    let root = n - 1;
    let value = if rank == root {
        mine(7)
    } else {
        mine(rank).zeros_like()
    };
    let got = burn_ddp::broadcast(&group, value, root).map_err(e)?;
    same("broadcast", got.into_data(), mine(7).into_data())?;

    // [2n, 3] split along dim 0: rank r gets rows 2r..2r+2 summed over ranks.
    let rows = Tensor::<B, 1, Int>::arange(0..(6 * n) as i64, &device)
        .float()
        .reshape([2 * n, 3]);
    let scattered =
        burn_ddp::reduce_scatter(&group, rows.clone().add_scalar(rank as f32), ReduceOp::Sum)
            .map_err(e)?;
    let offset: f32 = (0..n).map(|r| r as f32).sum();
    let want = rows
        .slice(2 * rank..2 * rank + 2)
        .mul_scalar(n as f32)
        .add_scalar(offset);
    same("reduce_scatter", scattered.into_data(), want.into_data())?;

    if n > 1 {
        let odd = Tensor::<B, 2>::zeros([2 * n + 1, 1], &device);
        let err = burn_ddp::reduce_scatter(&group, odd, ReduceOp::Sum)
            .unwrap_err()
            .to_string();
        if !err.contains("multiple of") {
            return Err(format!("bad reduce_scatter error: {err}"));
        }
    }
    burn_ddp::destroy_process_group().map_err(e)?;
    println!("done yes");
    Ok(())
}

/// A process saving checkpoints in a loop is SIGKILLed at five moments: the
/// file at the checkpoint's path is always a whole checkpoint that loads, and
/// the next save leaves no partial file behind.
fn killed_checkpoint_writer() -> Result<(), String> {
    use burn::module::Module;
    use std::io::{BufRead, BufReader};
    let dir = std::env::temp_dir().join(format!("burn-ddp-killed-writer-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let path = dir.join("model.mpk");
    type Record = (<burn::nn::Linear<B> as Module<B>>::Record, u64);
    let device = Default::default();
    for (attempt, delay_ms) in [0u64, 40, 90, 170, 260].into_iter().enumerate() {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .env(SCENARIO_VAR, "save_forever")
            .env("CHECKPOINT", &path)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .map_err(|e| e.to_string())?;
        check(first.trim() == "saving", || {
            format!("writer said {first:?}")
        })?;
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        child.kill().map_err(|e| e.to_string())?; // SIGKILL
        child.wait().map_err(|e| e.to_string())?;
        let loaded = burn_ddp::checkpoint::load::<B, Record>(&path, &device);
        check(loaded.is_ok(), || {
            format!(
                "attempt {attempt}: {:?}",
                loaded.err().map(|e| e.to_string())
            )
        })?;
        let model: burn::nn::Linear<B> = burn::nn::LinearConfig::new(1024, 1024).init(&device);
        burn_ddp::checkpoint::save_atomic::<B, _>((model.into_record(), 0u64), &path)
            .map_err(|e| e.to_string())?;
        let left: Vec<_> = std::fs::read_dir(&dir)
            .map_err(|e| e.to_string())?
            .flatten()
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .filter(|name| name != "model.mpk")
            .collect();
        check(left.is_empty(), || {
            format!("attempt {attempt}: left {left:?}")
        })?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
