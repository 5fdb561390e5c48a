//! The device `--backend` names, for the Burn 0.22 trainers: Flex, or this
//! rank's GPU (`cuda:LOCAL_RANK`, with the `cuda` feature), with autodiff.

use burn::tensor::Device;
use burn_ddp_examples_common::cli::BackendChoice;
use burn_ddp_examples_common::fail;

/// The device for `--backend` (`trainer`: the Burn 0.21 trainer's name, for
/// the backend only it has).
pub fn for_backend(backend: BackendChoice, trainer: &str) -> Device {
    match backend {
        BackendChoice::Flex => Device::flex().autodiff(),
        // Burn 0.22 picks fusion when it is built, not per tensor, and
        // burn-ddp-22's `cuda` feature builds it: both names are fused CUDA.
        BackendChoice::Cuda | BackendChoice::CudaFused => gpu_of_this_rank().autodiff(),
        BackendChoice::Ndarray => fail(
            None,
            format!(
                "--backend ndarray: the Burn 0.22 trainers run on flex or cuda (the Burn 0.21 \
                 trainer examples/{trainer} has ndarray)"
            ),
        ),
    }
}

/// `cuda:LOCAL_RANK`, as `torch.cuda.set_device(local_rank)`.
#[cfg(feature = "cuda")]
fn gpu_of_this_rank() -> Device {
    let env = burn_ddp_22::group::LaunchEnv::from_env().unwrap_or_else(|e| fail(None, e));
    burn_ddp_22::cuda::cuda_device_for_rank(env.local_rank, env.local_world_size)
        .unwrap_or_else(|e| fail(Some(env.rank), e))
}

#[cfg(not(feature = "cuda"))]
fn gpu_of_this_rank() -> Device {
    fail(
        None,
        "--backend cuda or cuda-fused: this binary was built without CUDA; rebuild with \
         --features cuda",
    )
}
