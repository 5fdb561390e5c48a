//! Two models wrapped separately are synchronised separately: a GAN-shaped
//! program (generator and discriminator, alternating backward passes) where
//! each `backward()` all-reduces only its own model's parameters, counted in
//! the bytes the group was handed, and ends equal to one process training on
//! the combined batch. The discriminator carries an extra frozen tensor on
//! rank 1 only, and rank 1 holds a trainable tensor of no model: neither may
//! disturb the others.

use crate::shared::{e, Res};
use crate::shim::{flat_params, load_params, Plain, Wrapped};
use burn::module::{Module, Param, ParamId};
use burn::nn::{Linear, LinearConfig};
use burn::optim::{GradientsParams, Optimizer, SgdConfig};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use burn_ddp::{DdpConfig, ProcessGroup};
use burn_ddp_testkit::numbers::{max_relative_difference, value};

const NOISE: usize = 4;
const SAMPLE: usize = 6;

#[derive(Module, Debug)]
pub struct Generator<B: Backend> {
    linear: Linear<B>,
}

#[derive(Module, Debug)]
pub struct Discriminator<B: Backend> {
    linear: Linear<B>,
    /// A frozen tensor some ranks have (a probe, a statistic): not trained.
    probe: Option<Param<Tensor<B, 1>>>,
}

impl<B: Backend> Generator<B> {
    fn new(device: &B::Device) -> Self {
        Self {
            linear: LinearConfig::new(NOISE, SAMPLE).init(device),
        }
    }

    fn forward(&self, noise: Tensor<B, 2>) -> Tensor<B, 2> {
        self.linear.forward(noise).tanh()
    }
}

impl<B: Backend> Discriminator<B> {
    fn new(device: &B::Device, probe: bool) -> Self {
        Self {
            linear: LinearConfig::new(SAMPLE, 1).init(device),
            probe: probe.then(|| Param::initialized(ParamId::new(), Tensor::zeros([5], device))),
        }
    }

    fn forward(&self, samples: Tensor<B, 2>) -> Tensor<B, 2> {
        self.linear.forward(samples)
    }
}

/// Trainable parameters only (rank 1's discriminator has a frozen extra).
fn trainable<B: Backend, M: Module<B>>(model: &M) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl<B: Backend> burn::module::ModuleVisitor<B> for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
            if param.val().is_require_grad() {
                self.0
                    .extend(param.val().into_data().to_vec::<f32>().unwrap());
            }
        }
    }
    let mut collect = Collect(Vec::new());
    model.visit(&mut collect);
    collect.0
}

fn rows<B: Backend>(
    items: &[usize],
    width: usize,
    salt: usize,
    device: &B::Device,
) -> Tensor<B, 2> {
    let values: Vec<f32> = items
        .iter()
        .flat_map(|&i| (0..width).map(move |f| value(i, f + salt)))
        .collect();
    Tensor::from_data(TensorData::new(values, [items.len(), width]), device)
}

/// The discriminator's loss: real samples scored up, the generator's down.
fn loss_d<B: burn::tensor::backend::AutodiffBackend>(
    g: &Generator<B>,
    d: &Discriminator<B>,
    items: &[usize],
    device: &B::Device,
) -> Tensor<B, 1> {
    let fake = g.forward(rows(items, NOISE, 100, device)).detach();
    let real = rows(items, SAMPLE, 200, device);
    d.forward(fake).mean() - d.forward(real).mean()
}

/// The generator's loss, through the discriminator.
fn loss_g<B: burn::tensor::backend::AutodiffBackend>(
    g: &Generator<B>,
    d: &Discriminator<B>,
    items: &[usize],
    device: &B::Device,
) -> Tensor<B, 1> {
    -d.forward(g.forward(rows(items, NOISE, 100, device))).mean()
}

fn f32_bytes(values: &[f32]) -> u64 {
    4 * values.len() as u64
}

fn expect(what: &str, got: u64, want: u64) -> Res<()> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: got {got}, want {want}"))
    }
}

fn identical(group: &ProcessGroup, values: &[f32], what: &str) -> Res<()> {
    let all = group.all_gather(values).map_err(e)?;
    for (rank, theirs) in all.chunks(values.len()).enumerate() {
        if theirs
            .iter()
            .zip(values)
            .any(|(a, b)| a.to_bits() != b.to_bits())
        {
            return Err(format!(
                "{what}: rank {rank} differs from rank {}",
                group.rank()
            ));
        }
    }
    Ok(())
}

pub fn run() -> Res<()> {
    let group = burn_ddp::init_process_group().map_err(e)?;
    let (rank, world) = (group.rank(), group.world_size());
    let device = Default::default();
    <Wrapped as Backend>::seed(&device, 70 + rank as u64);
    let g = Generator::<Wrapped>::new(&device);
    let d = Discriminator::<Wrapped>::new(&device, rank == 1);

    // Broadcasting the frozen extra would need it on every rank: refused,
    // naming the setting that keeps each rank's own.
    let refused = burn_ddp::wrap(d.clone(), &group)
        .err()
        .map(e)
        .unwrap_or_default();
    if !refused.contains("buffers differ") || !refused.contains("with_broadcast_buffers(false)") {
        return Err(format!("wrapping unlike buffers: {refused:?}"));
    }
    let mut g = burn_ddp::wrap(g, &group).map_err(e)?;
    let mut d = DdpConfig::new()
        .with_broadcast_buffers(false)
        .wrap(d, &group)
        .map_err(e)?;
    identical(&group, &trainable(&g), "generator after wrap")?;
    identical(&group, &trainable(&d), "discriminator after wrap")?;
    // A trainable tensor of no model, on one rank: ignored.
    let _stray = (rank == 1).then(|| Tensor::<Wrapped, 1>::zeros([7], &device).require_grad());

    let mut g_ref = load_params(Generator::<Plain>::new(&device), &flat_params(&g));
    let mut d_ref = load_params(Discriminator::<Plain>::new(&device, false), &trainable(&d));
    let (mut opt_g, mut opt_d) = (SgdConfig::new().init(), SgdConfig::new().init());
    let (mut opt_g_ref, mut opt_d_ref) = (SgdConfig::new().init(), SgdConfig::new().init());
    let (g_bytes, d_bytes) = (f32_bytes(&trainable(&g)), f32_bytes(&trainable(&d)));
    // Each model's reducer agrees on the layout (and on whether replacements
    // wait to join) in one 4 x i64 all-reduce.
    let agreement = 32;
    let b = 3;
    for step in 0..6 {
        let items = |r: usize| (0..b).map(|i| 1000 * step + 10 * r + i).collect::<Vec<_>>();
        let everyone: Vec<usize> = (0..world).flat_map(items).collect();
        let mine = items(rank);

        // Discriminator step: the generator's samples are detached, so its
        // reducer agrees there is nothing to send and only D's parameters move.
        let (before, d_before, g_before) = traffic(&group, &g, &d);
        let grads = GradientsParams::from_grads(loss_d(&g, &d, &mine, &device).backward(), &d);
        let (after, d_after, g_after) = traffic(&group, &g, &d);
        expect(
            "D step: the discriminator's bytes",
            d_after - d_before,
            d_bytes,
        )?;
        expect("D step: the generator's bytes", g_after - g_before, 0)?;
        expect(
            "D step: bytes handed to the group",
            after - before,
            2 * agreement + d_bytes,
        )?;
        d = opt_d.step(0.1, d, grads);
        let grads = GradientsParams::from_grads(
            loss_d(&g_ref, &d_ref, &everyone, &device).backward(),
            &d_ref,
        );
        d_ref = opt_d_ref.step(0.1, d_ref, grads);

        // Generator step: its loss runs through the discriminator, whose
        // gradients stay local (PyTorch's `with netD.no_sync()`).
        let (before, d_before, g_before) = traffic(&group, &g, &d);
        let grads = {
            let _d_local = burn_ddp::sync::no_sync_for(&d);
            GradientsParams::from_grads(loss_g(&g, &d, &mine, &device).backward(), &g)
        };
        let (after, d_after, g_after) = traffic(&group, &g, &d);
        expect("G step: the generator's bytes", g_after - g_before, g_bytes)?;
        expect("G step: the discriminator's bytes", d_after - d_before, 0)?;
        expect(
            "G step: bytes handed to the group",
            after - before,
            agreement + g_bytes,
        )?;
        g = opt_g.step(0.1, g, grads);
        let grads = GradientsParams::from_grads(
            loss_g(&g_ref, &d_ref, &everyone, &device).backward(),
            &g_ref,
        );
        g_ref = opt_g_ref.step(0.1, g_ref, grads);

        identical(
            &group,
            &trainable(&g),
            &format!("generator after step {step}"),
        )?;
        identical(
            &group,
            &trainable(&d),
            &format!("discriminator after step {step}"),
        )?;
    }
    // Without the guard, a backward through both models moves both.
    let (before, _, _) = traffic(&group, &g, &d);
    let _ = loss_g(&g, &d, &[rank], &device).backward();
    let (after, _, _) = traffic(&group, &g, &d);
    expect(
        "both models",
        after - before,
        2 * agreement + g_bytes + d_bytes,
    )?;

    let diff_g = max_relative_difference(&trainable(&g), &flat_params(&g_ref));
    let diff_d = max_relative_difference(&trainable(&d), &flat_params(&d_ref));
    println!("max_rel_diff {:e}", diff_g.max(diff_d));
    if diff_g.max(diff_d) > 1e-5 {
        return Err(format!(
            "the GAN differs from the one-process run: generator {diff_g:e}, discriminator \
             {diff_d:e}"
        ));
    }
    burn_ddp::destroy_process_group().map_err(e)
}

/// Bytes handed to the group, and each model's synchronised bytes, so far.
fn traffic(
    group: &ProcessGroup,
    g: &Generator<Wrapped>,
    d: &Discriminator<Wrapped>,
) -> (u64, u64, u64) {
    let of = |stats: Option<burn_ddp::sync::SyncStats>| stats.map_or(0, |s| s.bytes);
    (
        group.collective_bytes(),
        of(burn_ddp::sync::sync_stats_of(d)),
        of(burn_ddp::sync::sync_stats_of(g)),
    )
}

/// With models wrapped, a trainable tensor of none of them that gets a
/// gradient fails the backward on every rank, naming the fix.
pub fn stray_gradient() -> Res<()> {
    let group = burn_ddp::init_process_group().map_err(e)?;
    let device = Default::default();
    let g = burn_ddp::wrap(Generator::<Wrapped>::new(&device), &group).map_err(e)?;
    let stray = Tensor::<Wrapped, 1>::ones([SAMPLE], &device).require_grad();
    let noise = rows::<Wrapped>(&[group.rank()], NOISE, 0, &device);
    // Held, as a model holds its parameters (a consumed leaf is gone by then).
    let loss = (g.forward(noise) * stray.clone().unsqueeze::<2>()).mean();
    let _ = loss.backward(); // panics with the reason
    drop(stray);
    Err("a gradient outside every wrapped model should have failed the backward".into())
}
