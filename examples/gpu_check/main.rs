//! GPU checks for scripts/gpu-check.sh (needs `--features cuda` and a GPU).
//!
//! `gpu_check nccl` checks NCCL collectives on device buffers for correctness,
//! in a world of any size (one GPU per rank). `gpu_check bench` times bucket
//! all-reduces from 1 MiB to 1 GiB: straight NCCL on a device buffer against
//! the path gradients take (a CUDA tensor through `burn_ddp::collective::all_reduce`).
//! `gpu_check overhead` times an MNIST CNN training step on `Autodiff<Cuda>`
//! against `Ddp<Autodiff<Cuda>>` at world size 1. `nccl` also runs
//! SyncBatchNorm and the sharded optimizer (its rounds in NCCL) against one
//! process on the global batch. `gpu_check toy [FLAGS]` is
//! the toy trainer (examples/toy, its own code) on `Ddp<Autodiff<Cuda>>`, and
//! `gpu_check toy-fused [FLAGS]` the same on Burn's fused CUDA backend (what
//! `burn::backend::Cuda` is with burn-cuda's default features), so one binary
//! carries every check to the GPU machine.
//! Each prints `RESULT <name> PASS|FAIL <detail>` lines for the script.

#[path = "../mnist/net.rs"]
mod net;
#[allow(dead_code)] // its `main`: the checks call `train` directly
#[path = "../toy/main.rs"]
mod toy;

use burn::backend::cuda::{Cuda, CudaDevice};
use burn::backend::Autodiff;
use burn::module::{Module, Param};
use burn::nn::loss::CrossEntropyLossConfig;
use burn::nn::Linear;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::AutodiffBackend;
use burn::tensor::backend::Backend;
use burn::tensor::Distribution;
use burn::tensor::{Int, Tensor, TensorData};
use burn_ddp::collective::ReduceOp;
use burn_ddp::config::Overlap;
use burn_ddp::cuda::nccl::cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use burn_ddp::cuda::nccl::{DeviceBuffer, NcclCommunicator};
use burn_ddp::group::CollectiveBackend;
use burn_ddp::{DdpConfig, ProcessGroup, ShardConfig};
use burn_ddp_examples_common::gpu_check as expect;
use std::sync::Arc;
use std::time::Instant;

/// The checks scripts/gpu-check.sh runs.
#[derive(clap::Parser, Debug)]
#[command(
    name = "gpu_check",
    version,
    about = "NCCL and CUDA checks for scripts/gpu-check.sh."
)]
enum Check {
    /// NCCL collectives on device buffers, at any world size (one GPU per rank).
    Nccl,
    /// Bucket all-reduce times: straight NCCL against burn_ddp::collective::all_reduce.
    Bench,
    /// An MNIST CNN step on Autodiff<Cuda> against Ddp<Autodiff<Cuda>>, world 1.
    Overhead,
    /// The toy trainer on Ddp<Autodiff<Cuda>>, with the toy's flags.
    Toy(toy::ToyArgs),
    /// The toy trainer on Ddp<Autodiff<FusedCuda>> (Burn's default fused backend).
    ToyFused(toy::ToyArgs),
    /// The toy trainer on plain Autodiff<Cuda>, no Ddp: the reference the two
    /// above must equal at world size 1.
    ToyReference(toy::ToyArgs),
}

fn main() {
    burn_ddp_examples_common::cli::init_logger();
    let mode = match <Check as clap::Parser>::parse() {
        Check::Overhead => return overhead(),
        Check::Toy(args) => return toy_on_cuda::<burn_ddp::cuda::PlainCuda>(&args),
        Check::ToyFused(args) => return toy_on_cuda::<burn_ddp::cuda::FusedCuda>(&args),
        Check::ToyReference(args) => {
            let device = burn_ddp::cuda::cuda_device_for_rank(0, 1).unwrap_or_else(|e| die(e));
            return toy::train::<Autodiff<burn_ddp::cuda::PlainCuda>>(&args, device);
        }
        Check::Nccl => "nccl",
        Check::Bench => "bench",
    };
    let group = burn_ddp::init_process_group().unwrap_or_else(|e| die(e));
    let device = burn_ddp::cuda::cuda_device_for_rank(group.local_rank(), group.local_world_size())
        .unwrap_or_else(|e| die(e));
    if group.device_backend() != CollectiveBackend::Nccl {
        die("run with BURN_DDP_BACKEND=nccl (scripts/gpu-check.sh does): these checks need NCCL");
    }
    let comm = group
        .nccl_communicator(device.index)
        .unwrap_or_else(|e| die(e))
        .expect("BURN_DDP_BACKEND=nccl gives a communicator or an error");
    let ok = match mode {
        "nccl" => check_collectives(&group, &comm, &device),
        _ => bench(&group, &comm, &device),
    };
    burn_ddp::destroy_process_group().unwrap_or_else(|e| die(e));
    std::process::exit(if ok { 0 } else { 1 });
}

/// Stops this rank with `err` (naming the rank) and a failed setup row for
/// the script.
fn die(err: impl std::fmt::Display) -> ! {
    let err = match burn_ddp::group::LaunchEnv::from_env() {
        Ok(env) => format!("rank {}: {err}", env.rank),
        Err(_) => err.to_string(),
    };
    eprintln!("gpu_check: {err}");
    println!("RESULT setup FAIL {err}");
    std::process::exit(1)
}

fn report(group: &ProcessGroup, name: &str, passed: bool, detail: String) -> bool {
    if group.is_main() || !passed {
        let verdict = if passed { "PASS" } else { "FAIL" };
        println!("RESULT {name} {verdict} rank {}: {detail}", group.rank());
    }
    passed
}

/// Device memory of our own, outside Burn, for the raw NCCL calls.
struct Raw {
    stream: Arc<CudaStream>,
}

impl Raw {
    fn new(ordinal: usize) -> Self {
        let ctx = CudaContext::new(ordinal).unwrap_or_else(|e| die(e));
        Self {
            stream: ctx.default_stream(),
        }
    }

    fn upload(&self, values: &[f32]) -> CudaSlice<f32> {
        let slice = self.stream.clone_htod(values).unwrap_or_else(|e| die(e));
        self.stream.synchronize().unwrap_or_else(|e| die(e));
        slice
    }

    fn download(&self, slice: &CudaSlice<f32>) -> Vec<f32> {
        self.stream.clone_dtoh(slice).unwrap_or_else(|e| die(e))
    }

    fn buffer(&self, slice: &CudaSlice<f32>) -> DeviceBuffer {
        let (ptr, _record) = slice.device_ptr(&self.stream);
        DeviceBuffer {
            ptr,
            len: slice.len(),
            dtype: burn_ddp::cuda::nccl::DType::F32,
        }
    }
}

/// Each check is built so that doing nothing fails it: outputs start as a
/// sentinel (-1), and inputs differ per rank.
fn check_collectives(group: &ProcessGroup, comm: &NcclCommunicator, device: &CudaDevice) -> bool {
    let mut all = raw_nccl(group, comm, device);
    all &= tensor_collectives(group, device);
    all &= device_pointers(group, device);
    all &= fused_tensors(group, device);
    all &= sync_batch_norm_on_cuda(group, device);
    all &= sharded_optimizer_on_cuda(group, device, ShardConfig::new(), "sharded_optimizer_cuda");
    all &= overlap_on_cuda(group, device);
    // Every round all-reduced, each owner broadcasting its parameters: only
    // with several ranks (alone, nothing is padded and every round is
    // sharded; the rows then check the packing and that NCCL was used).
    if group.world_size() > 1 {
        all &= sharded_optimizer_on_cuda(
            group,
            device,
            ShardConfig::new().with_padding_limit(1.0),
            "sharded_optimizer_replicated_cuda",
        );
    }

    let barrier = comm.barrier();
    all &= report(
        group,
        "nccl_barrier",
        barrier.is_ok(),
        format!("{barrier:?}"),
    );
    all
}

/// NCCL itself on device memory of our own: sum and average out of place,
/// a pre-multiplied sum in place.
fn raw_nccl(group: &ProcessGroup, comm: &NcclCommunicator, device: &CudaDevice) -> bool {
    let (rank, world) = (group.rank() as f32, group.world_size() as f32);
    let n = 1 << 20;
    let raw = Raw::new(device.index);
    let input: Vec<f32> = (0..n).map(|i| (i % 97) as f32 + 1000.0 * rank).collect();
    let send = raw.upload(&input);
    let mut all = true;

    // Out of place, so a no-op leaves the sentinel.
    let recv = raw.upload(&vec![-1.0; n]);
    let expect_sum = |i: usize| world * (i % 97) as f32 + 1000.0 * world * (world - 1.0) / 2.0;
    // SAFETY: both buffers are ours, uploaded and synchronised, alive until the end.
    let done = unsafe { comm.all_reduce_into(raw.buffer(&send), raw.buffer(&recv), ReduceOp::Sum) };
    let out = raw.download(&recv);
    let bad = (0..n).find(|&i| out[i] != expect_sum(i));
    all &= report(
        group,
        "nccl_all_reduce_sum",
        done.is_ok() && bad.is_none(),
        format!("{n} f32 out of place, {done:?}, first bad index {bad:?}"),
    );

    let recv = raw.upload(&vec![-1.0; n]);
    let done =
        unsafe { comm.all_reduce_into(raw.buffer(&send), raw.buffer(&recv), ReduceOp::Mean) };
    let out = raw.download(&recv);
    let bad = (0..n).find(|&i| (out[i] - expect_sum(i) / world).abs() > 1e-3);
    all &= report(
        group,
        "nccl_all_reduce_avg",
        done.is_ok() && bad.is_none(),
        format!("{done:?}, first bad index {bad:?}"),
    );

    // In place with a scale NCCL applies itself (pre-multiplied sum): the data
    // must change even in a world of one, so an in-place call that does
    // nothing fails here.
    let data = raw.upload(&input);
    // SAFETY: our buffer, uploaded and synchronised, alive until the end.
    let done = unsafe { comm.all_reduce_scaled(raw.buffer(&data), 0.5) };
    let out = raw.download(&data);
    let bad = (0..n).find(|&i| out[i] != 0.5 * expect_sum(i));
    all &= report(
        group,
        "nccl_premul_sum_in_place",
        done.is_ok() && bad.is_none(),
        format!("{n} f32 in place, scale 0.5, {done:?}, first bad index {bad:?}"),
    );
    all
}

/// The four collectives on CUDA tensors (Burn's memory), in place.
fn tensor_collectives(group: &ProcessGroup, device: &CudaDevice) -> bool {
    let mut all = true;
    let (rank, world) = (group.rank(), group.world_size());
    let values = expect::scaled_index(rank);
    let tensor = Tensor::<Cuda, 1>::from_data(TensorData::new(values, [4096]), device);
    let summed =
        burn_ddp::collective::all_reduce(group, tensor, ReduceOp::Sum).map(|t| t.into_data());
    let fine = is_scaled_index(&summed, world);
    all &= report(
        group,
        "tensor_all_reduce_sum",
        fine,
        format!("4096 f32 on {device:?}: {:?}", summed.err()),
    );

    let ints =
        Tensor::<Cuda, 1, Int>::from_data(TensorData::new(vec![rank as i32; 8], [8]), device);
    let max = burn_ddp::collective::all_reduce(group, ints, ReduceOp::Max).map(|t| t.into_data());
    let fine = max.as_ref().is_ok_and(|d| {
        d.as_slice::<i32>()
            .unwrap()
            .iter()
            .all(|v| *v == world as i32 - 1)
    });
    all &= report(
        group,
        "tensor_all_reduce_max_i32",
        fine,
        format!("{:?}", max.err()),
    );

    // Rank-2 tensors with a distinct value per element and a last dimension
    // of 3 (not a power of two): a padded row or a misplaced element shows.
    let distinct = expect::distinct;
    let rows = Tensor::<Cuda, 2>::from_data(TensorData::new(distinct(rank), [2, 3]), device);
    let gathered = burn_ddp::collective::all_gather(group, rows.clone());
    let fine = is_gathered(&gathered, world);
    all &= report(
        group,
        "tensor_all_gather",
        fine,
        format!("{:?}", gathered.err()),
    );

    let root = world - 1;
    let broadcast = burn_ddp::collective::broadcast(group, rows, root).map(|t| t.into_data());
    let fine = broadcast
        .as_ref()
        .is_ok_and(|d| d.as_slice::<f32>().unwrap() == distinct(root));
    all &= report(
        group,
        "tensor_broadcast",
        fine,
        format!("{:?}", broadcast.err()),
    );

    // [2w, 3] of index + rank on each rank: rank r keeps rows 2r and 2r + 1 of
    // the sum, world * index + w(w-1)/2.
    let tall = expect::reduce_scatter_input(rank, world);
    let tall = Tensor::<Cuda, 2>::from_data(TensorData::new(tall, [2 * world, 3]), device);
    let part =
        burn_ddp::collective::reduce_scatter(group, tall, ReduceOp::Sum).map(|t| t.into_data());
    let want = expect::reduce_scatter_want(rank, world);
    let fine = part
        .as_ref()
        .is_ok_and(|d| d.shape.to_vec() == [2, 3] && d.as_slice::<f32>().unwrap() == want);
    all &= report(
        group,
        "tensor_reduce_scatter",
        fine,
        format!("{:?}", part.err()),
    );
    all
}

/// The device-pointer round trip: the bytes at the address a collective
/// hands NCCL, copied back, must be the tensor's values in order, for a
/// fresh tensor, a slice, a transposed view and a concatenated bucket of
/// rank-2 tensors (defects of a pitched or strided buffer show here even
/// with one rank).
fn device_pointers(group: &ProcessGroup, device: &CudaDevice) -> bool {
    let mut all = true;
    let fresh = Tensor::<Cuda, 2>::from_data(TensorData::new(expect::grid(), [3, 5]), device);
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
        let want: Vec<f32> = tensor.clone().into_data().to_vec::<f32>().unwrap();
        let seen =
            burn_ddp::cuda::nccl_view(group, tensor).map(|bytes| bytes.map(|b| expect::f32s(&b)));
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

/// Burn's fused backend (burn-cuda's default): resolved to CUDA tensors for
/// NCCL and registered back; the values must come through as on plain CUDA.
fn fused_tensors(group: &ProcessGroup, device: &CudaDevice) -> bool {
    type Fused = burn_ddp::cuda::FusedCuda;
    let values = expect::scaled_index(group.rank());
    let fused =
        Tensor::<Fused, 1>::from_data(TensorData::new(values, [4096]), device).mul_scalar(1.0); // queued in the fusion stream, not yet run
    let summed =
        burn_ddp::collective::all_reduce(group, fused, ReduceOp::Sum).map(|t| t.into_data());
    let fine = is_scaled_index(&summed, group.world_size());
    let mut all = report(
        group,
        "fused_tensor_all_reduce_sum",
        fine,
        format!("{:?}", summed.err()),
    );
    let rows = Tensor::<Fused, 2>::from_data(
        TensorData::new(expect::distinct(group.rank()), [2, 3]),
        device,
    );
    let gathered = burn_ddp::collective::all_gather(group, rows);
    let fine = is_gathered(&gathered, group.world_size());
    all &= report(
        group,
        "fused_tensor_all_gather",
        fine,
        format!("{:?}", gathered.err()),
    );
    all
}

/// SyncBatchNorm on `Autodiff<Cuda>` (its statistics summed over NCCL,
/// forward and backward) against Burn's BatchNorm on the whole global batch
/// in this process: this rank's rows of the output and of the input's
/// gradient, and the running mean, must agree.
fn sync_batch_norm_on_cuda(group: &ProcessGroup, device: &CudaDevice) -> bool {
    // Plain autodiff, its sum registered here (under `Ddp<..>` the input, a
    // leaf that requires gradients, would count as a stray parameter).
    type Synced = Autodiff<Cuda>;
    type Plain = Autodiff<Cuda>;
    burn_ddp::autodiff::enable_sync_batch_norm::<Synced>();
    let (rank, world) = (group.rank(), group.world_size());
    let rows = expect::batch_norm_rows;
    let config = burn::nn::BatchNormConfig::new(4);
    let norm = burn_ddp::sync_batch_norm::sync_batch_norm::<Synced>(&config, device);
    let mine = Tensor::<Synced, 1>::from_floats(rows(rank).as_slice(), device)
        .reshape([3, 4, 5])
        .require_grad();
    let out = norm.forward(mine.clone());
    let grads = (out.clone() * out.clone()).sum().backward();
    let grad = mine.grad(&grads).map(|g| floats(g.into_data()));

    let reference = config.init::<Plain>(device);
    let all: Vec<f32> = (0..world).flat_map(rows).collect();
    let whole = Tensor::<Plain, 1>::from_floats(all.as_slice(), device)
        .reshape([3 * world, 4, 5])
        .require_grad();
    let want = reference.forward(whole.clone());
    // The sum over the ranks of every rank's loss: each rank's loss is its
    // own rows' squares.
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

/// Two Linear layers with the same values on every rank and in every
/// backend (no random initialisation to broadcast).
#[derive(Module, Debug)]
struct Mlp<B: Backend> {
    first: Linear<B>,
    second: Linear<B>,
}

impl<B: Backend> Mlp<B> {
    fn new(device: &B::Device) -> Self {
        let values = |n: usize, salt: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * 5 + salt) % 11) as f32 / 10.0 - 0.5)
                .collect()
        };
        let linear = |d_in: usize, d_out: usize, salt: usize| Linear {
            weight: Param::from_data(
                TensorData::new(values(d_in * d_out, salt), [d_in, d_out]),
                device,
            ),
            bias: Some(Param::from_data(
                TensorData::new(values(d_out, salt + 3), [d_out]),
                device,
            )),
        };
        // 30, 5, 15 and 3 elements: on two ranks rank 0 owns the first
        // weight, rank 1 the rest (23 elements), so the round is padded.
        Self {
            first: linear(6, 5, 1),
            second: linear(5, 3, 2),
        }
    }

    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.second
            .forward(burn::tensor::activation::relu(self.first.forward(x)))
    }

    fn floats(&self) -> Vec<f32> {
        let mut all = Vec::new();
        for linear in [&self.first, &self.second] {
            all.extend(
                linear
                    .weight
                    .val()
                    .into_data()
                    .to_vec::<f32>()
                    .unwrap_or_default(),
            );
            if let Some(bias) = &linear.bias {
                all.extend(bias.val().into_data().to_vec::<f32>().unwrap_or_default());
            }
        }
        all
    }
}

/// The sharded optimizer (AdamW) on `Ddp<Autodiff<Cuda>>`, its rounds
/// reduce-scattered and all-gathered by NCCL on the GPU, against plain AdamW
/// on the whole global batch in this process: the parameters after three
/// steps must agree, and the rounds must have gone through NCCL.
fn sharded_optimizer_on_cuda(
    group: &ProcessGroup,
    device: &CudaDevice,
    config: ShardConfig,
    name: &str,
) -> bool {
    type Sharded = burn_ddp::Ddp<Autodiff<Cuda>>;
    type Plain = Autodiff<Cuda>;
    let (rank, world) = (group.rank(), group.world_size());
    let batch = expect::shard_batch;
    let mut model = match burn_ddp::wrap(Mlp::<Sharded>::new(device), group) {
        Ok(model) => model,
        Err(err) => return report(group, name, false, err.to_string()),
    };
    let mut optimizer =
        match burn_ddp::ShardedOptimizer::with_config(AdamWConfig::new().init(), group, &config) {
            Ok(optimizer) => optimizer,
            Err(err) => return report(group, name, false, err.to_string()),
        };
    let mut reference = Mlp::<Plain>::new(device);
    let mut plain = AdamWConfig::new().init();
    let everyone: Vec<f32> = (0..world).flat_map(batch).collect();
    for _step in 0..3 {
        let x = Tensor::<Sharded, 1>::from_floats(batch(rank).as_slice(), device).reshape([4, 6]);
        let out = model.forward(x);
        let grads = {
            let _local = burn_ddp::no_sync(); // the sharded step averages
            GradientsParams::from_grads((out.clone() * out).mean().backward(), &model)
        };
        model = match optimizer.try_step(0.05, model, grads) {
            Ok(model) => model,
            Err(err) => return report(group, name, false, err.to_string()),
        };
        let x =
            Tensor::<Plain, 1>::from_floats(everyone.as_slice(), device).reshape([4 * world, 6]);
        let out = reference.forward(x);
        let grads = GradientsParams::from_grads((out.clone() * out).mean().backward(), &reference);
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

/// Buckets averaged by NCCL during backward (`Overlap::Always`: a fence on
/// the communication thread, then NCCL on its stream) against the same
/// model averaged after backward (`Never`), trained side by side on the same
/// batches: bit for bit equal after every step, and some buckets must have
/// left during backward, through NCCL. The step times of both are reported.
fn overlap_on_cuda(group: &ProcessGroup, device: &CudaDevice) -> bool {
    type Wrapped = burn_ddp::Ddp<Autodiff<Cuda>>;
    let name = "overlap_cuda";
    let rank = group.rank();
    let wrap = |overlap: Overlap| {
        // One parameter a bucket: the second layer's leave during backward.
        DdpConfig::new()
            .with_bucket_cap_mb(0.00001)
            .with_first_bucket_cap_mb(0.00001)
            .with_overlap_backward(overlap)
            .wrap(Mlp::<Wrapped>::new(device), group)
    };
    let (mut early, mut late) = match (wrap(Overlap::Always), wrap(Overlap::Never)) {
        (Ok(early), Ok(late)) => (early, late),
        (Err(err), _) | (_, Err(err)) => return report(group, name, false, err.to_string()),
    };
    let step = |model: Mlp<Wrapped>, step: usize| {
        let values: Vec<f32> = expect::shard_batch(rank)
            .iter()
            .map(|v| v + step as f32 / 10.0)
            .collect();
        let x = Tensor::<Wrapped, 1>::from_floats(values.as_slice(), device).reshape([4, 6]);
        let started = Instant::now();
        let out = model.forward(x);
        let grads = GradientsParams::from_grads((out.clone() * out).mean().backward(), &model);
        let model = SgdConfig::new().init().step(0.05, model, grads);
        let floats = model.floats(); // waits for the GPU
        (model, floats, started.elapsed().as_secs_f64() * 1e3)
    };
    let (mut times_early, mut times_late) = (Vec::new(), Vec::new());
    for i in 0..6 {
        let (model, a, t) = step(early, i);
        early = model;
        times_early.push(t);
        let (model, b, t) = step(late, i);
        late = model;
        times_late.push(t);
        if a.iter()
            .map(|v| v.to_bits())
            .ne(b.iter().map(|v| v.to_bits()))
        {
            let detail = format!("step {i}: during backward {a:?}, after {b:?}");
            return report(group, name, false, detail);
        }
    }
    let stats = burn_ddp::sync::sync_stats_of(&early).unwrap_or_default();
    let passed = stats.early_buckets > 0 && stats.device_buckets == stats.buckets;
    let median = |mut t: Vec<f64>| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    };
    let detail = format!(
        "equal bit for bit over 6 steps; {} of {} buckets left during backward, {} through \
         NCCL; step {:.2} ms during backward, {:.2} ms after (median)",
        stats.early_buckets,
        stats.buckets,
        stats.device_buckets,
        median(times_early),
        median(times_late)
    );
    report(group, name, passed, detail)
}

/// Whether a summed result is every rank's [`expect::scaled_index`] summed.
fn is_scaled_index(summed: &burn_ddp::Result<TensorData>, world: usize) -> bool {
    summed
        .as_ref()
        .is_ok_and(|d| expect::is_scaled_index_sum(d.as_slice::<f32>().unwrap(), world))
}

/// Whether `all_gather` returned every rank's `[2, 3]` tensor, rank `r`'s
/// holding [`expect::distinct`]`(r)`.
fn is_gathered<B: burn::tensor::backend::Backend>(
    gathered: &burn_ddp::Result<Vec<Tensor<B, 2>>>,
    world: usize,
) -> bool {
    gathered.as_ref().is_ok_and(|parts| {
        parts.len() == world
            && parts.iter().enumerate().all(|(r, p)| {
                p.dims() == [2, 3]
                    && p.clone().into_data().as_slice::<f32>().unwrap() == expect::distinct(r)
            })
    })
}

/// A tensor's values as f32.
fn floats(data: TensorData) -> Vec<f32> {
    data.to_vec::<f32>().unwrap()
}

/// Times one bucket all-reduce (mean) per size, over `iters` rounds after a
/// warm-up: straight NCCL on a device buffer, then a CUDA tensor through
/// `burn_ddp::collective::all_reduce` (waits for Burn's kernels, addresses the buffer,
/// NCCL in place).
fn bench(group: &ProcessGroup, comm: &NcclCommunicator, device: &CudaDevice) -> bool {
    let raw = Raw::new(device.index);
    let world = group.world_size() as f64;
    if group.is_main() {
        println!("TABLE | size | NCCL ms | bucket path ms | path / NCCL | NCCL busbw GB/s | path busbw GB/s |");
    }
    for mib in [1usize, 4, 16, 25, 64, 128, 256, 1024] {
        let n = mib * (1 << 20) / 4;
        let iters = (400 / mib).clamp(5, 50);
        let data = raw.upload(&vec![1.0f32; n]);
        let buffer = raw.buffer(&data);
        let time = |f: &mut dyn FnMut()| {
            f();
            group.barrier().unwrap_or_else(|e| die(e));
            let started = Instant::now();
            for _ in 0..iters {
                f();
            }
            started.elapsed().as_secs_f64() / iters as f64
        };
        // SAFETY: our buffer, alive for the whole loop; each call waits for NCCL.
        let nccl = time(&mut || {
            unsafe { comm.all_reduce(buffer, ReduceOp::Mean) }.unwrap_or_else(|e| die(e))
        });
        let mut tensor = Some(Tensor::<Cuda, 1>::ones([n], device));
        let path = time(&mut || {
            let t = tensor.take().unwrap();
            tensor = Some(
                burn_ddp::collective::all_reduce(group, t, ReduceOp::Mean)
                    .unwrap_or_else(|e| die(e)),
            );
        });
        let bytes = (n * 4) as f64;
        let busbw = |secs: f64| bytes / secs * 2.0 * (world - 1.0) / world / 1e9;
        if group.is_main() {
            println!(
                "TABLE | {mib} MiB | {:.3} | {:.3} | {:.2} | {:.1} | {:.1} |",
                nccl * 1e3,
                path * 1e3,
                path / nccl,
                busbw(nccl),
                busbw(path)
            );
        }
    }
    true
}

/// One MNIST CNN step (forward, backward, SGD), waited for on the GPU, in seconds.
fn mnist_step<B: AutodiffBackend>(model: net::Net<B>, device: &B::Device) -> (net::Net<B>, f64) {
    let images = Tensor::<B, 4>::random([128, 1, 28, 28], Distribution::Normal(0.0, 1.0), device);
    let labels = Tensor::<B, 1, Int>::random([128], Distribution::Uniform(0.0, 10.0), device);
    B::sync(device).unwrap_or_else(|e| die(format!("{e:?}")));
    let started = Instant::now();
    let loss = CrossEntropyLossConfig::new()
        .init(device)
        .forward(model.forward(images), labels);
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let model = SgdConfig::new().init().step(0.01, model, grads);
    B::sync(device).unwrap_or_else(|e| die(format!("{e:?}")));
    (model, started.elapsed().as_secs_f64())
}

/// `Ddp<Autodiff<Cuda>>` against `Autodiff<Cuda>` at world size 1, steps
/// interleaved so drift hits both alike; medians of 50 after 5 warm-ups. With
/// `BURN_DDP_BACKEND=nccl` (as the script runs it) the group makes every
/// backward take the bucket path over NCCL even alone, so the figure includes
/// it, not only the wrapper.
fn overhead() {
    let _group = burn_ddp::init_process_group().unwrap_or_else(|e| die(e));
    type Plain = Autodiff<Cuda>;
    type Wrapped = burn_ddp::Ddp<Autodiff<Cuda>>;
    let device = burn_ddp::cuda::cuda_device_for_rank(0, 1).unwrap_or_else(|e| die(e));
    let (mut plain, mut wrapped) = (
        net::Net::<Plain>::new(&device),
        net::Net::<Wrapped>::new(&device),
    );
    let (mut p, mut w) = (Vec::new(), Vec::new());
    for i in 0..55 {
        let (m, t) = mnist_step(plain, &device);
        plain = m;
        let (m, u) = mnist_step(wrapped, &device);
        wrapped = m;
        if i >= 5 {
            p.push(t);
            w.push(u);
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let (p, w) = (median(p), median(w));
    println!(
        "OVERHEAD {:.3} Autodiff<Cuda> {:.2} ms, Ddp<Autodiff<Cuda>> {:.2} ms (MNIST CNN, batch 128, median of 50)",
        w / p,
        p * 1e3,
        w * 1e3
    );
}

/// The toy trainer on `Ddp<Autodiff<C>>` (plain or fused CUDA), with the toy's flags.
fn toy_on_cuda<C: burn::tensor::backend::Backend<Device = CudaDevice>>(args: &toy::ToyArgs) {
    let env = burn_ddp::group::LaunchEnv::from_env().unwrap_or_else(|e| die(e));
    let device = burn_ddp::cuda::cuda_device_for_rank(env.local_rank, env.local_world_size)
        .unwrap_or_else(|e| die(e));
    toy::train::<burn_ddp::Ddp<Autodiff<C>>>(args, device);
}
