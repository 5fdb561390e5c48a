//! Code the example trainers share: command-line helpers, the logger, saved
//! hyper-parameters, a seeded normal generator and the choice of backend.

#![allow(dead_code)]

pub mod bench;
pub mod cli;
pub mod learner;
pub mod resume;
pub mod run_config;
pub mod stopped;

/// Calls `$train::<B>(&args, device)` with the `Ddp` backend that `--backend`
/// names: flex, ndarray, or cuda / cuda-fused (one GPU per local rank) with the
/// cuda feature.
#[allow(unused_macros)]
macro_rules! run_on_backend {
    ($args:expr, $train:ident) => {{
        use burn::backend::{Autodiff, Flex, NdArray};
        use burn_ddp::Ddp;
        use common::cli::BackendChoice;
        match $args.backend {
            BackendChoice::Flex => $train::<Ddp<Autodiff<Flex>>>(&$args, Default::default()),
            BackendChoice::Ndarray => $train::<Ddp<Autodiff<NdArray>>>(&$args, Default::default()),
            #[cfg(feature = "cuda")]
            BackendChoice::Cuda | BackendChoice::CudaFused => {
                // cuda:LOCAL_RANK, as `torch.cuda.set_device(local_rank)`.
                let env = burn_ddp::LaunchEnv::from_env().unwrap_or_else(|e| common::fail(None, e));
                let device = burn_ddp::cuda_device_for_rank(env.local_rank, env.local_world_size)
                    .unwrap_or_else(|e| common::fail(Some(env.rank), e));
                if $args.backend == BackendChoice::Cuda {
                    $train::<Ddp<Autodiff<burn_ddp::PlainCuda>>>(&$args, device)
                } else {
                    $train::<Ddp<Autodiff<burn_ddp::FusedCuda>>>(&$args, device)
                }
            }
            #[cfg(not(feature = "cuda"))]
            BackendChoice::Cuda | BackendChoice::CudaFused => common::fail(
                None,
                "--backend cuda or cuda-fused: this binary was built without CUDA; rebuild with --features cuda",
            ),
        }
    }};
}

/// A seeded generator of standard normal numbers (SplitMix64 + Box-Muller), so
/// synthetic data is identical on every rank and every run.
pub struct Normal {
    state: u64,
    spare: Option<f32>,
}

impl Normal {
    pub fn new(seed: u64) -> Self {
        Self {
            state: seed ^ 0x5DEE_CE66_D1CE_4E5B,
            spare: None,
        }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    pub fn sample(&mut self) -> f32 {
        if let Some(value) = self.spare.take() {
            return value;
        }
        let (u, v) = (self.uniform(), self.uniform());
        let radius = (-2.0 * u.ln()).sqrt();
        let angle = 2.0 * std::f64::consts::PI * v;
        self.spare = Some((radius * angle.sin()) as f32);
        (radius * angle.cos()) as f32
    }
}

/// Exits with the error, prefixed by the rank when it is known.
pub fn fail(rank: Option<usize>, err: impl std::fmt::Display) -> ! {
    match rank {
        Some(rank) => eprintln!("rank {rank}: error: {err}"),
        None => eprintln!("error: {err}"),
    }
    std::process::exit(1)
}
