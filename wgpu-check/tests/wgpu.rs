//! `Ddp<Autodiff<Wgpu>>` with Burn's default WebGPU backend (fusion and
//! autotune on) across real processes: two ranks with batch `b` end with the
//! parameters of one process with batch `2b`, identical on both ranks, and
//! every gradient bucket takes the host path (a fused tensor is not a CUDA one).
//!
//! Run by `scripts/wgpu-check.sh` on a machine with a Vulkan, Metal or DX12
//! device. A probe first checks Burn's Wgpu backend itself against the CPU
//! (NdArray) on the same model: where the backend computes wrong values (as on
//! Mesa's software Vulkan, lavapipe), that is reported as such, not as a
//! burn-ddp failure. Without any device it skips, unless
//! `BURN_DDP_REQUIRE_WGPU=1`.

use burn::backend::Autodiff;
use burn::module::{Module, Param};
use burn::nn::{Linear, LinearConfig};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{ElementConversion, Tensor, TensorData};
use burn_ddp::ProcessGroup;
use burn_ddp_testkit::{all_ok, check, run_cases, Case, World, SCENARIO_VAR};
use burn_wgpu::{Wgpu, WgpuDevice};

type Plain = Autodiff<Wgpu>;
type Wrapped = Autodiff<Wgpu>; // DEBUG

const REQUIRE_VAR: &str = "BURN_DDP_REQUIRE_WGPU";
const STEPS: usize = 6;
const BATCH: usize = 4;

fn main() {
    if let Ok(name) = std::env::var(SCENARIO_VAR) {
        let result = match name.as_str() {
            "probe" => probe(),
            "equivalence" => equivalence(),
            other => Err(format!("unknown scenario {other}")),
        };
        if let Err(message) = result {
            eprintln!("ERROR: {message}");
            std::process::exit(1);
        }
        std::process::exit(0);
    }
    let cases: &[Case] = &[(
        "ddp_autodiff_wgpu_two_ranks_equal_one_big_batch",
        two_ranks_equal_one_big_batch,
    )];
    run_cases(cases);
}

fn two_ranks_equal_one_big_batch() -> Result<(), String> {
    // A rank process that cannot reach a Vulkan device says so; without one
    // there is nothing to test here, unless CI requires it.
    let mut probe = World::new(1);
    probe.deadline = std::time::Duration::from_secs(300);
    let probed = probe.run("probe");
    if let Err(why) = all_ok(&probed) {
        let required = std::env::var(REQUIRE_VAR).is_ok_and(|v| v == "1");
        if why.contains("NO_DEVICE") && !required {
            println!(
                "    skipped: no device for Burn's Wgpu backend ({REQUIRE_VAR}=1 requires one)"
            );
            return Ok(());
        }
        return Err(format!("Burn's Wgpu backend cannot be used here: {why}"));
    }
    let mut world = World::new(2);
    world.deadline = std::time::Duration::from_secs(600);
    world.timeout_secs = 300.0;
    let outcomes = world.run("equivalence");
    all_ok(&outcomes)?;
    for o in &outcomes {
        check(o.value("max_rel_diff").is_some(), || o.stdout.clone())?;
        println!(
            "    rank {}: {}",
            o.rank,
            o.stdout.trim().replace('\n', "; ")
        );
    }
    Ok(())
}

/// Whether Burn's Wgpu backend works here: a device at all (`NO_DEVICE`
/// otherwise), then the model's loss and gradient equal the CPU's, three
/// times over (`WRONG_VALUES` otherwise).
fn probe() -> Result<(), String> {
    type Cpu = Autodiff<burn::backend::NdArray>;
    let device = WgpuDevice::default();
    let first = std::panic::catch_unwind(|| {
        Tensor::<Wgpu, 1>::from_floats([1.0, 2.0, 3.0], &device)
            .sum()
            .into_scalar()
    });
    if first.is_err() {
        return Err("NO_DEVICE: Burn's Wgpu backend found no device (see the panic above)".into());
    }
    Plain::seed(&device, 7);
    let net = Net::<Plain>::new(&device);
    let cpu = copy_params(Net::<Cpu>::new(&Default::default()), &flat_params(&net));
    let items: Vec<usize> = (0..8).collect();
    let expected = loss_and_gradient(&cpu, &items, &Default::default());
    for attempt in 0..3 {
        let got = loss_and_gradient(&net, &items, &device);
        let gap = max_relative_gap(&got, &expected);
        if gap > 1e-4 {
            return Err(format!(
                "WRONG_VALUES: on {device:?}, Burn's Wgpu backend computes loss and output-layer \
                 gradient {got:?} where the CPU computes {expected:?} (attempt {attempt}, \
                 relative gap {gap:e}); Ddp cannot be checked on a backend that is wrong here"
            ));
        }
    }
    println!("device {device:?}");
    Ok(())
}

/// The loss and the output layer's weight gradient, as numbers.
fn loss_and_gradient<B: burn::tensor::backend::AutodiffBackend>(
    net: &Net<B>,
    items: &[usize],
    device: &B::Device,
) -> Vec<f32> {
    let loss = net.loss(items, device);
    let grads = loss.clone().backward();
    let mut values = vec![loss.into_scalar().elem::<f32>()];
    let grad = net.out.weight.grad(&grads).expect("a gradient");
    values.extend(grad.into_data().convert::<f32>().to_vec::<f32>().unwrap());
    values
}

fn max_relative_gap(ours: &[f32], theirs: &[f32]) -> f32 {
    ours.iter()
        .zip(theirs)
        .map(|(a, b)| (a - b).abs() / b.abs().max(1e-3))
        .fold(0.0f32, f32::max)
}

/// Two layers, so a bucket holds several parameters of rank 1 and 2.
#[derive(Module, Debug)]
struct Net<B: Backend> {
    hidden: Linear<B>,
    out: Linear<B>,
}

impl<B: Backend> Net<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            hidden: LinearConfig::new(6, 5).init(device),
            out: LinearConfig::new(5, 1).init(device),
        }
    }

    fn loss(&self, items: &[usize], device: &B::Device) -> Tensor<B, 1> {
        let (x, y) = batch::<B>(items, device);
        let pred = self
            .out
            .forward(burn::tensor::activation::relu(self.hidden.forward(x)));
        // A product, not powi_scalar(2): Burn lowers that to pow(), which
        // SPIR-V leaves undefined for a negative base (Mesa's lavapipe
        // returns garbage there).
        let error = pred - y;
        (error.clone() * error).mean()
    }
}

/// Item `i` of a fixed synthetic regression set.
fn batch<B: Backend>(items: &[usize], device: &B::Device) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let x: Vec<f32> = items
        .iter()
        .flat_map(|&i| (0..6).map(move |j| ((i * 7 + j * 3) % 11) as f32 / 11.0 - 0.5))
        .collect();
    let y: Vec<f32> = items.iter().map(|&i| (i % 5) as f32 / 5.0).collect();
    let n = items.len();
    (
        Tensor::from_data(TensorData::new(x, [n, 6]), device),
        Tensor::from_data(TensorData::new(y, [n, 1]), device),
    )
}

fn flat_params<B: Backend, M: Module<B>>(module: &M) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl<B: Backend> burn::module::ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            self.0.extend(
                param
                    .val()
                    .into_data()
                    .convert::<f32>()
                    .to_vec::<f32>()
                    .unwrap(),
            );
        }
    }
    let mut collect = Collect(Vec::new());
    module.visit(&mut collect);
    collect.0
}

/// `module` with its float parameters replaced, in visiting order, by `values`.
fn copy_params<B: Backend, M: Module<B>>(module: M, values: &[f32]) -> M {
    struct Fill<'a>(&'a [f32]);
    impl<B: Backend> burn::module::ModuleMapper<B> for Fill<'_> {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
            let (id, tensor, mapper) = param.consume();
            let (shape, device) = (tensor.shape(), tensor.device());
            let (mine, rest) = self.0.split_at(shape.num_elements());
            self.0 = rest;
            let value = Tensor::from_data(TensorData::new(mine.to_vec(), shape), &device);
            Param::from_mapped_value(id, value.require_grad(), mapper)
        }
    }
    module.map(&mut Fill(values))
}

fn check_identical(group: &ProcessGroup, values: &[f32], when: &str) -> Result<(), String> {
    let all = group.all_gather(values).map_err(|e| e.to_string())?;
    for (r, theirs) in all.chunks(values.len()).enumerate() {
        if theirs
            .iter()
            .zip(values)
            .any(|(a, b)| a.to_bits() != b.to_bits())
        {
            return Err(format!(
                "{when}: parameters of rank {r} differ from rank {}",
                group.rank()
            ));
        }
    }
    Ok(())
}

fn equivalence() -> Result<(), String> {
    let group = burn_ddp::init_process_group().map_err(|e| e.to_string())?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = WgpuDevice::default();
    // The reference starts where the model does (wrap then broadcasts rank
    // 0's values, the same ones: every rank seeds alike).
    Plain::seed(&device, 7);
    let mut reference = Net::<Plain>::new(&device);
    let model = copy_params(Net::<Wrapped>::new(&device), &flat_params(&reference));
    if flat_params(&model) != flat_params(&reference) {
        return Err("the copied model starts apart from the reference".into());
    }
    let mut model = burn_ddp::wrap(model, &group).map_err(|e| e.to_string())?;
    let (mut opt, mut opt_ref) = (
        SgdConfig::new().init::<Wrapped, Net<Wrapped>>(),
        SgdConfig::new().init::<Plain, Net<Plain>>(),
    );
    burn_ddp::sync::reset_sync_stats();
    for step in 0..STEPS {
        // Rank r takes items r, r + world, ... of the step's global batch.
        let global: Vec<usize> = (step * BATCH * world..(step + 1) * BATCH * world).collect();
        let mine: Vec<usize> = global.iter().copied().skip(rank).step_by(world).collect();
        let loss = model.loss(&mine, &device);
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = opt.step(0.1, model, grads);

        let loss = reference.loss(&global, &device);
        let grads = GradientsParams::from_grads(loss.backward(), &reference);
        reference = opt_ref.step(0.1, reference, grads);
        check_identical(&group, &flat_params(&model), &format!("after step {step}"))?;
    }
    let (ours, theirs) = (flat_params(&model), flat_params(&reference));
    let diff = max_relative_gap(&ours, &theirs);
    let stats = burn_ddp::sync::sync_stats();
    println!("max_rel_diff {diff:e}");
    println!(
        "syncs {} buckets {} device_buckets {}",
        stats.syncs, stats.buckets, stats.device_buckets
    );
    if diff > 1e-4 {
        return Err(format!(
            "Ddp<Autodiff<Wgpu>> and one process on the global batch differ by {diff:e}"
        ));
    }
    if stats.syncs != STEPS as u64 || stats.buckets < STEPS as u64 || stats.device_buckets != 0 {
        return Err(format!(
            "{STEPS} synchronised steps over host memory expected, the stats say {stats:?}"
        ));
    }
    burn_ddp::destroy_process_group().map_err(|e| e.to_string())
}
