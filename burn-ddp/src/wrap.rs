//! Preparing a model for data-parallel training, as `DistributedDataParallel(model)`.

use crate::{global, CommError, ProcessGroup};
use burn::config::Config;
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{BasicOps, Int, Tensor};
use burn_ddp_comm::reducer::check_same_layout;
use burn_ddp_comm::ParamLayout;

/// How gradients are grouped into buckets, in bytes: a Burn `Config` (save it
/// with `.save(path)`, read it back with `BucketConfig::load(path)`).
/// [`DdpConfig`] sets it in MiB, as PyTorch's `bucket_cap_mb`.
///
/// ```
/// use burn::config::Config;
/// let buckets = burn_ddp::BucketConfig::new().with_cap_bytes(4 << 20);
/// assert_eq!(buckets.first_cap_bytes, 1 << 20);
/// ```
#[derive(Config, Debug, PartialEq, Eq)]
pub struct BucketConfig {
    /// Largest bucket, in bytes (PyTorch: 25 MiB).
    #[config(default = 26214400)]
    pub cap_bytes: usize,
    /// Largest first bucket, in bytes (PyTorch: 1 MiB), so the first collective
    /// can start early.
    #[config(default = 1048576)]
    pub first_cap_bytes: usize,
}

impl From<BucketConfig> for burn_ddp_comm::BucketConfig {
    fn from(config: BucketConfig) -> Self {
        Self {
            cap_bytes: config.cap_bytes,
            first_cap_bytes: config.first_cap_bytes,
        }
    }
}

/// How gradients are synchronised; defaults follow PyTorch's DDP. A Burn
/// `Config`: save it next to a run's other settings with `.save(path)`.
///
/// ```no_run
/// use burn::config::Config;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # type B = burn_ddp::Ddp<burn::backend::Autodiff<burn::backend::NdArray>>;
/// # let model = burn::nn::LinearConfig::new(4, 2).init::<B>(&Default::default());
/// let group = burn_ddp::init_process_group()?;
/// let config = burn_ddp::DdpConfig::new().with_bucket_cap_mb(50.0);
/// config.save("ddp.json")?;
/// let model = config.wrap(model, &group)?; // as DistributedDataParallel(model, bucket_cap_mb=50)
/// # Ok(())
/// # }
/// ```
#[derive(Config, Debug)]
pub struct DdpConfig {
    /// Largest gradient bucket, in MiB (PyTorch's `bucket_cap_mb`).
    #[config(default = 25.0)]
    pub bucket_cap_mb: f64,
    /// Largest first bucket, in MiB (PyTorch uses 1 MiB).
    #[config(default = 1.0)]
    pub first_bucket_cap_mb: f64,
    /// How gradients cross machines: as they are, or as 16-bit floats added in
    /// f32 where they arrive (half the bytes on the slowest links; PyTorch's
    /// `bf16_compress_hook`). Only f32 sums between machines are compressed.
    #[config(default = "GradientCompression::None")]
    pub gradient_compression: GradientCompression,
}

/// [`DdpConfig::gradient_compression`].
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum GradientCompression {
    /// Full f32.
    None,
    /// bfloat16 (f32's range, 8 bits of precision): the usual choice.
    Bf16,
    /// IEEE half (11 bits of precision, values up to 65504).
    F16,
}

impl From<GradientCompression> for burn_ddp_comm::WireCompression {
    fn from(compression: GradientCompression) -> Self {
        match compression {
            GradientCompression::None => Self::None,
            GradientCompression::Bf16 => Self::Bf16,
            GradientCompression::F16 => Self::F16,
        }
    }
}

impl DdpConfig {
    /// Broadcasts rank 0's parameters and buffers (batch-norm statistics, ...)
    /// to every rank, so all replicas start identical whatever seed each used,
    /// and applies this configuration to the default group's reducer.
    ///
    /// Every parameter is initialised here, in declaration order, which is also
    /// the order `Ddp<B>` keeps them in; call it once, after building (or
    /// loading) the model and before the first forward pass.
    pub fn wrap<B: Backend, M: Module<B>>(
        &self,
        model: M,
        group: &ProcessGroup,
    ) -> crate::Result<M> {
        let config = self.bucket_config(group.rank())?;
        if let Some(state) = global::state() {
            state.reducer.lock().unwrap().set_config(config);
        }
        if self.gradient_compression != GradientCompression::None {
            group.set_wire_compression(self.gradient_compression.into());
        }
        // Broadcasting tensors of different sizes would garble or hang: compare
        // the models first, so a mismatch is a clear error on every rank.
        let mut layout = LayoutOf(Vec::new());
        model.visit(&mut layout);
        check_same_layout(group, &layout.0)?;
        let mut broadcaster = Broadcaster { group, error: None };
        let model = model.map(&mut broadcaster);
        match broadcaster.error {
            Some(err) => Err(err),
            None => Ok(model),
        }
    }
}

impl DdpConfig {
    /// The bucket sizes in bytes; an error names `rank` and the bad setting.
    pub fn bucket_config(&self, rank: usize) -> crate::Result<BucketConfig> {
        let to_bytes = |mb: f64, name: &str| {
            if mb.is_finite() && mb > 0.0 && mb * 1024.0 * 1024.0 < usize::MAX as f64 {
                Ok(((mb * 1024.0 * 1024.0) as usize).max(1))
            } else {
                Err(CommError::config(format!(
                    "rank {rank}: DdpConfig {name} = {mb} must be a positive number of MiB \
                     (PyTorch's default is 25 for bucket_cap_mb, 1 for the first bucket)"
                )))
            }
        };
        Ok(BucketConfig {
            cap_bytes: to_bytes(self.bucket_cap_mb, "bucket_cap_mb")?,
            first_cap_bytes: to_bytes(self.first_bucket_cap_mb, "first_bucket_cap_mb")?,
        })
    }
}

/// [`DdpConfig::wrap`] with the default configuration.
pub fn wrap<B: Backend, M: Module<B>>(model: M, group: &ProcessGroup) -> crate::Result<M> {
    DdpConfig::new().wrap(model, group)
}

/// Replaces every float and int tensor of a module by rank 0's.
struct Broadcaster<'a> {
    group: &'a ProcessGroup,
    /// The first failure; later tensors are left alone so no rank waits on a
    /// collective the others will not join.
    error: Option<CommError>,
}

impl Broadcaster<'_> {
    /// Rank 0's `tensor` (through `crate::broadcast`: NCCL for CUDA tensors,
    /// host memory otherwise).
    fn broadcast<B: Backend, const D: usize, K: BasicOps<B> + 'static>(
        &mut self,
        tensor: Tensor<B, D, K>,
    ) -> Tensor<B, D, K> {
        if self.error.is_some() {
            return tensor;
        }
        let (shape, device) = (tensor.shape(), tensor.device());
        match crate::broadcast(self.group, tensor, 0) {
            Ok(value) => value,
            Err(err) => {
                self.error = Some(err);
                // The module is dropped with the error; any value will do.
                Tensor::empty(shape, &device)
            }
        }
    }
}

impl<B: Backend> ModuleMapper<B> for Broadcaster<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let require_grad = tensor.is_require_grad();
        let mut value = self.broadcast(tensor);
        if require_grad {
            value = value.require_grad();
        }
        Param::from_mapped_value(id, value, mapper)
    }

    fn map_int<const D: usize>(
        &mut self,
        param: Param<Tensor<B, D, Int>>,
    ) -> Param<Tensor<B, D, Int>> {
        let (id, tensor, mapper) = param.consume();
        Param::from_mapped_value(id, self.broadcast(tensor), mapper)
    }
}

/// The shape and type of every tensor a module holds, in visiting order.
struct LayoutOf(Vec<ParamLayout>);

impl LayoutOf {
    fn push(&mut self, dims: Vec<usize>, dtype: burn::tensor::DType) {
        use burn_ddp_comm::DType as Wire;
        let dtype = match dtype {
            burn::tensor::DType::F64 => Wire::F64,
            burn::tensor::DType::I64 => Wire::I64,
            burn::tensor::DType::I32 => Wire::I32,
            burn::tensor::DType::F16 => Wire::F16,
            burn::tensor::DType::BF16 => Wire::BF16,
            _ => Wire::F32,
        };
        self.0.push(ParamLayout { shape: dims, dtype });
    }
}

impl<B: Backend> ModuleVisitor<B> for LayoutOf {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        self.push(value.dims().to_vec(), value.dtype());
    }

    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
        let value = param.val();
        self.push(value.dims().to_vec(), value.dtype());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_save_and_load_as_json() {
        let dir = std::env::temp_dir().join(format!("burn-ddp-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(
            DdpConfig::new().gradient_compression,
            GradientCompression::None
        );
        let ddp = DdpConfig::new()
            .with_bucket_cap_mb(50.0)
            .with_first_bucket_cap_mb(0.5)
            .with_gradient_compression(GradientCompression::Bf16);
        ddp.save(dir.join("ddp.json")).unwrap();
        let text = std::fs::read_to_string(dir.join("ddp.json")).unwrap();
        assert!(text.contains("\"bucket_cap_mb\": 50.0"), "{text}");
        assert!(
            text.contains("\"gradient_compression\": \"Bf16\""),
            "{text}"
        );
        let loaded = DdpConfig::load(dir.join("ddp.json")).unwrap();
        assert_eq!(loaded.gradient_compression, GradientCompression::Bf16);
        assert_eq!(
            burn_ddp_comm::WireCompression::from(loaded.gradient_compression),
            burn_ddp_comm::WireCompression::Bf16
        );
        assert_eq!(
            loaded.bucket_config(0).unwrap(),
            BucketConfig::new()
                .with_cap_bytes(50 << 20)
                .with_first_cap_bytes(512 << 10)
        );
        let buckets = BucketConfig::new().with_cap_bytes(123);
        buckets.save(dir.join("buckets.json")).unwrap();
        assert_eq!(
            BucketConfig::load(dir.join("buckets.json")).unwrap(),
            buckets
        );
        let comm: burn_ddp_comm::BucketConfig = BucketConfig::new().into();
        assert_eq!(comm, burn_ddp_comm::BucketConfig::default());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn bad_bucket_sizes_name_the_rank_and_setting() {
        for mb in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e300] {
            let err = DdpConfig::new()
                .with_bucket_cap_mb(mb)
                .bucket_config(3)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("rank 3") && err.contains("bucket_cap_mb"),
                "{err}"
            );
        }
    }
}
