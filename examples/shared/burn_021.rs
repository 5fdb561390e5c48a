//! The `Ddp` backend `--backend` names, for the Burn 0.21 trainers (toy and
//! mnist): one macro, since each trainer's `train` is generic over it.

/// Calls `$train::<B>(&args, device)` with the `Ddp` backend that `--backend`
/// names: flex, ndarray, or cuda / cuda-fused (one GPU per local rank) with the
/// cuda feature.
macro_rules! run_on_backend {
    ($args:expr, $train:ident) => {{
        use burn::backend::{Autodiff, Flex, NdArray};
        use burn_ddp::Ddp;
        use burn_ddp_examples_common::cli::BackendChoice;
        match $args.backend {
            BackendChoice::Flex => $train::<Ddp<Autodiff<Flex>>>(&$args, Default::default()),
            BackendChoice::Ndarray => $train::<Ddp<Autodiff<NdArray>>>(&$args, Default::default()),
            #[cfg(feature = "cuda")]
            BackendChoice::Cuda | BackendChoice::CudaFused => {
                // cuda:LOCAL_RANK, as `torch.cuda.set_device(local_rank)`.
                let env = burn_ddp::group::LaunchEnv::from_env()
                    .unwrap_or_else(|e| burn_ddp_examples_common::fail(None, e));
                let device = burn_ddp::cuda::cuda_device_for_rank(env.local_rank, env.local_world_size)
                    .unwrap_or_else(|e| burn_ddp_examples_common::fail(Some(env.rank), e));
                if $args.backend == BackendChoice::Cuda {
                    $train::<Ddp<Autodiff<burn_ddp::cuda::PlainCuda>>>(&$args, device)
                } else {
                    $train::<Ddp<Autodiff<burn_ddp::cuda::FusedCuda>>>(&$args, device)
                }
            }
            #[cfg(not(feature = "cuda"))]
            BackendChoice::Cuda | BackendChoice::CudaFused => burn_ddp_examples_common::fail(
                None,
                "--backend cuda or cuda-fused: this binary was built without CUDA; rebuild with --features cuda",
            ),
        }
    }};
}
