//! The Burn 0.22 GPU check for scripts/gpu-check.sh (needs `--features cuda`
//! and a GPU): what examples/gpu_check's `nccl` run checks of Burn 0.21's
//! tensors, on Burn 0.22's CUDA tensors (fused: burn-ddp-22's `cuda`
//! feature builds Burn's fusion): the four collectives through NCCL against
//! their closed forms (what the host path gives), f32 and i32, a tensor
//! with a distinct value per element and a last dimension of 3, the bytes
//! NCCL would be handed (a fresh tensor, a slice, a transposed view, a
//! concatenated bucket), the averaged gradients of a model on a CUDA device,
//! SyncBatchNorm over NCCL against Burn's BatchNorm on the global batch,
//! and the sharded optimizer's NCCL rounds against one process's AdamW.
//! `gpu_check22 nccl` runs them under the launcher with
//! `BURN_DDP_BACKEND=nccl`; it prints `RESULT <name> PASS|FAIL <detail>`
//! lines and exits 1 on any FAIL. `gpu_check22 toy [FLAGS]` is the toy
//! trainer (examples-22/toy, its own code) on this rank's GPU: one binary
//! carries both to the GPU machine (a Burn 0.22 CUDA binary is 130 MiB
//! stripped, most of it LLVM; two would not fit beside Burn 0.21's).

#[allow(dead_code)] // its `main`: `gpu_check22 toy` calls `train`
#[path = "../toy/main.rs"]
mod toy;

use burn::module::Module;
use burn::nn::{BatchNormConfig, Linear, LinearConfig};
use burn::optim::{AdamWConfig, GradientsParams};
use burn::tensor::{Device, Int, Tensor, TensorData};
use burn_ddp_22::collective::ReduceOp;
use burn_ddp_22::group::CollectiveBackend;
use burn_ddp_22::{ProcessGroup, ShardConfig, ShardedOptimizer};
use burn_ddp_examples_common::cli::BackendChoice;
use burn_ddp_examples_common::fail;
use burn_ddp_examples_common::gpu_check as expect;

/// Prints the check's line (rank 0 only) and returns whether it passed.
fn report(group: &ProcessGroup, name: &str, passed: bool, detail: String) -> bool {
    if group.is_main() {
        let verdict = if passed { "PASS" } else { "FAIL" };
        println!("RESULT {name} {verdict} {detail}");
    }
    passed
}

fn floats(data: TensorData) -> Vec<f32> {
    data.convert::<f32>()
        .try_to_vec::<f32>()
        .unwrap_or_default()
}

/// The four collectives on CUDA tensors, then the bytes NCCL would be handed.
fn collectives(group: &ProcessGroup, device: &Device) -> bool {
    let (rank, world) = (group.rank(), group.world_size());
    let mut all = true;

    let values = expect::scaled_index(rank);
    let tensor = Tensor::<1>::from_data(TensorData::new(values, [4096]), device);
    let summed = burn_ddp_22::collective::all_reduce(group, tensor, ReduceOp::Sum)
        .map(|t| floats(t.into_data()));
    all &= report(
        group,
        "tensor_all_reduce_sum",
        summed
            .as_ref()
            .is_ok_and(|v| expect::is_scaled_index_sum(v, world)),
        format!("4096 f32 on {device:?}: {:?}", summed.err()),
    );

    let ints = Tensor::<1, Int>::from_data(TensorData::new(vec![rank as i32; 8], [8]), device);
    let max = burn_ddp_22::collective::all_reduce(group, ints, ReduceOp::Max).map(|t| {
        t.into_data()
            .convert::<i32>()
            .try_to_vec::<i32>()
            .unwrap_or_default()
    });
    all &= report(
        group,
        "tensor_all_reduce_max_i32",
        max.as_ref()
            .is_ok_and(|v| v.iter().all(|x| *x == world as i32 - 1)),
        format!("{:?}", max.err()),
    );

    // A distinct value per element, last dimension 3: a padded row or a
    // misplaced element shows.
    let distinct = expect::distinct;
    let rows = Tensor::<2>::from_data(TensorData::new(distinct(rank), [2, 3]), device);
    let gathered = burn_ddp_22::collective::all_gather(group, rows.clone());
    let fine = gathered.as_ref().is_ok_and(|parts| {
        parts.len() == world
            && parts
                .iter()
                .enumerate()
                .all(|(r, p)| floats(p.clone().into_data()) == distinct(r))
    });
    all &= report(
        group,
        "tensor_all_gather",
        fine,
        format!("{:?}", gathered.err()),
    );

    let root = world - 1;
    let broadcast =
        burn_ddp_22::collective::broadcast(group, rows, root).map(|t| floats(t.into_data()));
    all &= report(
        group,
        "tensor_broadcast",
        broadcast.as_ref().is_ok_and(|v| *v == distinct(root)),
        format!("{:?}", broadcast.err()),
    );

    let tall = expect::reduce_scatter_input(rank, world);
    let tall = Tensor::<2>::from_data(TensorData::new(tall, [2 * world, 3]), device);
    let part =
        burn_ddp_22::collective::reduce_scatter(group, tall, ReduceOp::Sum).map(|t| t.into_data());
    let want = expect::reduce_scatter_want(rank, world);
    let fine = part
        .as_ref()
        .is_ok_and(|d| d.shape().to_vec() == [2, 3] && floats(d.clone()) == want);
    all &= report(
        group,
        "tensor_reduce_scatter",
        fine,
        format!("{:?}", part.err()),
    );
    all & device_pointers(group, device)
}

/// The bytes at the address a collective hands NCCL, copied back: a fresh
/// tensor, a slice, a transposed view, a concatenated bucket.
fn device_pointers(group: &ProcessGroup, device: &Device) -> bool {
    let mut all = true;
    let fresh = Tensor::<2>::from_data(TensorData::new(expect::grid(), [3, 5]), device);
    let cases = [
        ("fresh", fresh.clone()),
        ("slice", fresh.clone().slice([1..3, 1..4])),
        ("transposed", fresh.clone().transpose()),
        (
            "bucket",
            Tensor::cat(
                vec![fresh.clone(), fresh.clone().transpose().reshape([3, 5])],
                0,
            ),
        ),
    ];
    for (name, tensor) in cases {
        let want = floats(tensor.clone().into_data());
        let seen = burn_ddp_22::cuda::nccl_view(group, tensor)
            .map(|bytes| bytes.map(|b| expect::f32s(&b)));
        let fine = matches!(&seen, Ok(Some(values)) if *values == want);
        all &= report(
            group,
            &format!("device_pointer_round_trip_{name}"),
            fine,
            format!("want {want:?}, NCCL would see {seen:?}"),
        );
    }
    all
}

/// A Linear layer's gradients on a CUDA autodiff device averaged by
/// `sync_gradients` over NCCL: each rank's input is `rank + 1`, so the
/// average is the gradient of the mean input.
fn gradients(group: &ProcessGroup, device: &Device) -> bool {
    let device = device.clone().autodiff();
    let model = match burn_ddp_22::wrap(LinearConfig::new(4, 1).init(&device), group) {
        Ok(model) => model,
        Err(err) => return report(group, "gradients_averaged", false, err.to_string()),
    };
    let grad_of = |value: f32| {
        let x = Tensor::<2>::full([2, 4], value, &device);
        GradientsParams::from_grads(model.forward(x).sum().backward(), &model)
    };
    let world = group.world_size() as f32;
    let mean_input = (1..=group.world_size()).sum::<usize>() as f32 / world;
    let expected = grad_of(mean_input)
        .get::<2>(model.weight.id)
        .map(|g| floats(g.into_data()));
    let synced = burn_ddp_22::sync_gradients(&model, grad_of(group.rank() as f32 + 1.0))
        .map(|g| g.get::<2>(model.weight.id).map(|g| floats(g.into_data())));
    let fine = matches!((&synced, &expected), (Ok(Some(a)), Some(b)) if expect::close(a, b, 1e-5));
    report(
        group,
        "gradients_averaged",
        fine,
        format!("{synced:?} against {expected:?}"),
    )
}

/// SyncBatchNorm over NCCL against Burn's BatchNorm on the global batch in
/// this process: this rank's output rows and input gradient, the running mean.
fn sync_batch_norm(group: &ProcessGroup, device: &Device) -> bool {
    let device = device.clone().autodiff();
    let (rank, world) = (group.rank(), group.world_size());
    let rows = expect::batch_norm_rows;
    let config = BatchNormConfig::new(4);
    let norm = burn_ddp_22::sync_batch_norm::sync_batch_norm(&config, &device);
    let mine = Tensor::<1>::from_floats(rows(rank).as_slice(), &device)
        .reshape([3, 4, 5])
        .require_grad();
    let out = norm.forward(mine.clone());
    let grads = (out.clone() * out.clone()).sum().backward();
    let grad = mine.grad(&grads).map(|g| floats(g.into_data()));

    let reference = config.init(&device);
    let all: Vec<f32> = (0..world).flat_map(rows).collect();
    let whole = Tensor::<1>::from_floats(all.as_slice(), &device)
        .reshape([3 * world, 4, 5])
        .require_grad();
    let want = reference.forward(whole.clone());
    let want_grads = (want.clone() * want.clone()).sum().backward();
    let want_grad = whole
        .grad(&want_grads)
        .map(|g| floats(g.narrow(0, 3 * rank, 3).into_data()));
    let (passed, detail) = expect::batch_norm_verdict(&expect::BatchNormSeen {
        output: floats(out.into_data()),
        want_output: floats(want.narrow(0, 3 * rank, 3).into_data()),
        grad,
        want_grad,
        running_mean: floats(norm.running_mean.value_sync().into_data()),
        want_running_mean: floats(reference.running_mean.value_sync().into_data()),
    });
    report(group, "sync_batch_norm_cuda", passed, detail)
}

/// Two Linear layers: 30, 5, 15 and 3 elements; on two ranks rank 0 owns
/// the first weight, rank 1 the rest (23 elements), so the round is padded.
#[derive(Module, Debug)]
struct Mlp {
    first: Linear,
    second: Linear,
}

impl Mlp {
    fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.second
            .forward(burn::tensor::activation::relu(self.first.forward(x)))
    }

    fn loss(&self, rows: &[f32], device: &Device) -> Tensor<1> {
        let x = Tensor::<1>::from_floats(rows, device).reshape([rows.len() / 6, 6]);
        let out = self.forward(x);
        (out.clone() * out).mean()
    }

    fn floats(&self) -> Vec<f32> {
        let mut all = Vec::new();
        for linear in [&self.first, &self.second] {
            all.extend(floats(linear.weight.val().into_data()));
            if let Some(bias) = &linear.bias {
                all.extend(floats(bias.val().into_data()));
            }
        }
        all
    }
}

/// The sharded optimizer (AdamW) on a CUDA autodiff device, its rounds
/// reduce-scattered and all-gathered by NCCL on the GPU, against plain AdamW
/// on the whole global batch in this process: the parameters after three
/// steps must agree, and the rounds must have gone through NCCL.
fn sharded_optimizer(
    group: &ProcessGroup,
    device: &Device,
    config: ShardConfig,
    name: &str,
) -> bool {
    let device = device.clone().autodiff();
    let (rank, world) = (group.rank(), group.world_size());
    let batch = expect::shard_batch;
    let start = Mlp {
        first: LinearConfig::new(6, 5).init(&device),
        second: LinearConfig::new(5, 3).init(&device),
    };
    // Rank 0's values everywhere, the reference starting from them too.
    let mut model = match burn_ddp_22::wrap(start, group) {
        Ok(model) => model,
        Err(err) => return report(group, name, false, err.to_string()),
    };
    let mut optimizer =
        match ShardedOptimizer::with_config(AdamWConfig::new().init(), group, &config) {
            Ok(optimizer) => optimizer,
            Err(err) => return report(group, name, false, err.to_string()),
        };
    let mut reference = model.clone();
    let mut plain = AdamWConfig::new().init();
    let everyone: Vec<f32> = (0..world).flat_map(batch).collect();
    for _step in 0..3 {
        let grads =
            GradientsParams::from_grads(model.loss(&batch(rank), &device).backward(), &model);
        model = match optimizer.step(0.05, model, grads) {
            Ok(model) => model,
            Err(err) => return report(group, name, false, err.to_string()),
        };
        let grads =
            GradientsParams::from_grads(reference.loss(&everyone, &device).backward(), &reference);
        reference = plain.step(0.05, reference, grads);
    }
    let (passed, detail) = expect::shard_verdict(
        &model.floats(),
        &reference.floats(),
        optimizer.stats().device_buckets,
        optimizer.plan(),
        config.padding_limit,
        world,
    );
    report(group, name, passed, detail)
}

/// What scripts/gpu-check.sh runs of Burn 0.22.
#[derive(clap::Parser, Debug)]
#[command(
    name = "gpu_check22",
    version,
    about = "Burn 0.22's NCCL and CUDA checks for scripts/gpu-check.sh."
)]
enum Check {
    /// CUDA tensors through NCCL, gradients, SyncBatchNorm (BURN_DDP_BACKEND=nccl).
    Nccl,
    /// The toy trainer (toy22) on this rank's GPU, with the toy's flags
    /// (`--backend` aside: it always runs on the GPU).
    Toy(toy::ToyArgs),
}

fn main() {
    burn_ddp_examples_common::cli::init_logger();
    if let Check::Toy(args) = <Check as clap::Parser>::parse() {
        // The GPU, whatever --backend says (as Burn 0.21's `gpu_check toy`):
        // a check that silently trained on the CPU would prove nothing.
        let device = toy::burn_022::for_backend(BackendChoice::Cuda, "toy");
        return toy::train(&args, device);
    }
    let group = burn_ddp_22::init_process_group().unwrap_or_else(|e| {
        println!("RESULT setup FAIL {e}");
        fail(None, e)
    });
    let device =
        burn_ddp_22::cuda::cuda_device_for_rank(group.local_rank(), group.local_world_size())
            .unwrap_or_else(|e| {
                println!("RESULT setup FAIL {e}");
                fail(Some(group.rank()), e)
            });
    if group.device_backend() != CollectiveBackend::Nccl {
        let why =
            "run with BURN_DDP_BACKEND=nccl (scripts/gpu-check.sh does): these checks need NCCL";
        println!("RESULT setup FAIL {why}");
        fail(Some(group.rank()), why);
    }
    let mut ok = collectives(&group, &device);
    ok &= gradients(&group, &device);
    ok &= sync_batch_norm(&group, &device);
    ok &= sharded_optimizer(
        &group,
        &device,
        ShardConfig::new(),
        "sharded_optimizer_cuda",
    );
    // Every round all-reduced, each owner broadcasting its parameters: only
    // with several ranks (alone, nothing is padded and every round is
    // sharded; the rows then check the packing and that NCCL was used).
    if group.world_size() > 1 {
        ok &= sharded_optimizer(
            &group,
            &device,
            ShardConfig::new().with_padding_limit(1.0),
            "sharded_optimizer_replicated_cuda",
        );
    }
    let barrier = group.barrier();
    ok &= report(&group, "barrier", barrier.is_ok(), format!("{barrier:?}"));
    burn_ddp_22::destroy_process_group().unwrap_or_else(|e| fail(Some(group.rank()), e));
    std::process::exit(if ok { 0 } else { 1 });
}
