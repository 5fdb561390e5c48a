//! What the Burn 0.22 programs share: the device `--backend` names (Flex,
//! or this rank's GPU, `cuda:LOCAL_RANK` with the `cuda` feature, with
//! autodiff), burn-ddp-22's functions for the shared loops, and what every
//! trainer does alike with its model (seeding, `wrap`, checkpoints, the
//! fingerprint).

use burn::module::Module;
use burn::optim::ModuleOptimizer;
use burn::tensor::Device;
use burn_ddp_22::snapshots::LoadError;
use burn_ddp_22::ProcessGroup;
use burn_ddp_examples_common::cli::BackendChoice;
use burn_ddp_examples_common::fail;
use burn_ddp_examples_common::front_end::FrontEnd;
use burn_ddp_examples_common::training::{BurnVersion, Saved};
use std::path::Path;

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

/// burn-ddp-22's functions the shared loops call (examples-common's).
pub const BURN_DDP_22: FrontEnd = FrontEnd {
    init_process_group: burn_ddp_22::init_process_group,
    destroy_process_group: burn_ddp_22::destroy_process_group,
    sync_stats: burn_ddp_22::sync::sync_stats,
    reset_sync_stats: burn_ddp_22::sync::reset_sync_stats,
    reform_process_group: burn_ddp_22::reform_process_group,
    admit_joiners: burn_ddp_22::admit_joiners,
};

/// Burn 0.22 on `device` (an autodiff device): what the trainers do alike
/// with any model and its optimizer (Burn 0.22's are all `ModuleOptimizer`s).
pub struct Burn022 {
    pub device: Device,
}

impl<M: Module> BurnVersion<M, ModuleOptimizer> for Burn022 {
    /// burn-ddp-22's sections: the model's burnpack, the optimizer's, the epochs.
    const EXTENSION: &'static str = burn_ddp_22::checkpoint::EXTENSION;

    fn seed(&self, seed: u64) {
        self.device.seed(seed);
    }

    fn wrap(&self, model: M, group: &ProcessGroup) -> burn_ddp_22::Result<M> {
        burn_ddp_22::wrap(model, group)
    }

    fn load(
        &self,
        path: &Path,
        model: M,
        optimizer: ModuleOptimizer,
    ) -> Result<(M, ModuleOptimizer, usize), LoadError> {
        let checkpoint = burn_ddp_22::checkpoint::load(path).map_err(|e| e.for_snapshot())?;
        let model = checkpoint.load_model(model).map_err(|e| e.for_snapshot())?;
        let optimizer = checkpoint
            .load_optimizer(optimizer)
            .map_err(|e| e.for_snapshot())?;
        Ok((model, optimizer, checkpoint.epoch))
    }

    fn save(&self, path: &Path, model: &M, optimizer: &ModuleOptimizer, epochs: usize) -> Saved {
        Ok(burn_ddp_22::checkpoint::save_atomic(
            path,
            model,
            Some(optimizer),
            epochs,
        )?)
    }

    fn save_model(&self, path: &Path, model: &M, epochs: usize) -> Saved {
        Ok(burn_ddp_22::checkpoint::save_atomic(
            path, model, None, epochs,
        )?)
    }

    fn fingerprint(&self, model: &M) -> u64 {
        burn_ddp_22::replicas::parameters_fingerprint(model)
    }

    fn parameter_values(&self, model: &M) -> Vec<f32> {
        burn_ddp_22::replicas::parameter_values(model)
    }

    fn share_state(
        &self,
        (model, optimizer): (M, ModuleOptimizer),
        group: &ProcessGroup,
    ) -> burn_ddp_22::Result<(M, ModuleOptimizer)> {
        burn_ddp_22::replicas::share_training_state(model, optimizer, group)
    }
}
