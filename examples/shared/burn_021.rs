//! What the Burn 0.21 programs share: the `Ddp` backend `--backend` names
//! (one macro, since each trainer is generic over it), burn-ddp's functions
//! for the shared loops, and what every trainer does alike with its model
//! (seeding, `wrap`, checkpoints, the fingerprint).

use burn::module::AutodiffModule;
use burn::optim::Optimizer;
use burn::tensor::backend::AutodiffBackend;
use burn_ddp::snapshots::LoadError;
use burn_ddp::ProcessGroup;
use burn_ddp_examples_common::front_end::FrontEnd;
use burn_ddp_examples_common::training::{BurnVersion, Saved};
use std::path::Path;

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

/// burn-ddp's functions the shared loops call (examples-common's).
pub(crate) const BURN_DDP: FrontEnd = FrontEnd {
    init_process_group: burn_ddp::init_process_group,
    destroy_process_group: burn_ddp::destroy_process_group,
    sync_stats: burn_ddp::sync::sync_stats,
    reset_sync_stats: burn_ddp::sync::reset_sync_stats,
    reform_process_group: burn_ddp::reform_process_group,
    admit_joiners: burn_ddp::admit_joiners,
};

/// Burn 0.21 on backend `B` (on `device`): what the trainers do alike with
/// any model `M` and its optimizer `O`.
pub struct Burn021<B: AutodiffBackend> {
    pub device: B::Device,
}

impl<B, M, O> BurnVersion<M, O> for Burn021<B>
where
    B: AutodiffBackend,
    M: AutodiffModule<B>,
    O: Optimizer<M, B>,
{
    /// Burn's named MessagePack records.
    const EXTENSION: &'static str = "mpk";

    fn seed(&self, seed: u64) {
        B::seed(&self.device, seed);
    }

    fn wrap(&self, model: M, group: &ProcessGroup) -> burn_ddp::Result<M> {
        burn_ddp::wrap(model, group)
    }

    /// The model's shapes checked; an error says what it means for a resume.
    fn load(&self, path: &Path, model: M, optimizer: O) -> Result<(M, O, usize), LoadError> {
        let (model_record, optimizer_record, epochs_done): (M::Record, O::Record, usize) =
            burn_ddp::checkpoint::load::<B, _>(path, &self.device).map_err(|e| e.for_snapshot())?;
        let model = burn_ddp::checkpoint::load_record_checked(model, model_record, path)
            .map_err(|e| e.for_snapshot())?;
        Ok((model, optimizer.load_record(optimizer_record), epochs_done))
    }

    /// One record: the model's, the optimizer's and the epochs done.
    fn save(&self, path: &Path, model: &M, optimizer: &O, epochs: usize) -> Saved {
        let record = (model.clone().into_record(), optimizer.to_record(), epochs);
        Ok(burn_ddp::checkpoint::save_atomic::<B, _>(record, path)?)
    }

    fn save_model(&self, path: &Path, model: &M, _epochs: usize) -> Saved {
        Ok(burn_ddp::checkpoint::save_atomic::<B, _>(
            model.clone().into_record(),
            path,
        )?)
    }

    fn fingerprint(&self, model: &M) -> u64 {
        burn_ddp::replicas::parameters_fingerprint(model)
    }

    fn parameter_values(&self, model: &M) -> Vec<f32> {
        burn_ddp::replicas::parameter_values(model)
    }

    fn share_state(
        &self,
        (model, optimizer): (M, O),
        group: &ProcessGroup,
    ) -> burn_ddp::Result<(M, O)> {
        burn_ddp::replicas::share_training_state(model, optimizer, group, &self.device)
    }
}
