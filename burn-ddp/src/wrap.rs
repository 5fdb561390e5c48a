//! Preparing a model for data-parallel training, as `DistributedDataParallel(model)`.

use crate::tracking::WrappingScope;
use crate::{CommError, ProcessGroup};
use burn::config::Config;
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{BasicOps, Int, Tensor};
use burn_ddp_comm::reducer::models::{self as scope, ModuleLayout, WrapSettings};
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
    /// Whether `wrap` also gives every rank rank 0's buffers (tensors without
    /// gradients: batch-norm statistics, frozen weights), as PyTorch's
    /// `broadcast_buffers`. Off, each rank keeps its own, and they may differ
    /// between ranks (a frozen tensor only one rank has).
    #[config(default = true)]
    pub broadcast_buffers: bool,
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
    /// Prepares `model` for data-parallel training over `group`, as
    /// `DistributedDataParallel(model, process_group=group)`: rank 0's
    /// parameters (and buffers, unless [`broadcast_buffers`](Self::broadcast_buffers)
    /// is off) are broadcast to every rank, so all replicas start identical
    /// whatever seed each used, and the model gets its own synchronisation
    /// state (reducer, buckets, statistics) over `group`, so two models
    /// wrapped separately are synchronised separately.
    ///
    /// Every parameter is initialised here, in declaration order, which is also
    /// the order `Ddp<B>` keeps them in; call it once, after building (or
    /// loading) the model and before the first forward pass, and again after
    /// loading a record into it or moving it to another device.
    pub fn wrap<B: Backend, M: Module<B>>(
        &self,
        model: M,
        group: &ProcessGroup,
    ) -> crate::Result<M> {
        let settings = WrapSettings {
            buckets: self.bucket_config(group.rank())?.into(),
            compression: self.gradient_compression.into(),
            broadcast_buffers: self.broadcast_buffers,
        };
        let scope = scope::wrap(group, settings, module_layout(&model, group.rank())?)?;
        // Parameters marked while broadcasting are this model's (`Ddp<B>`).
        let _wrapping = scope.map(|scope| WrappingScope::enter(scope.id));
        broadcast_checked(model, group, self.broadcast_buffers)
    }
}

/// Rank 0's trainable parameters (and, with `buffers`, every other tensor)
/// on every rank, after checking that all ranks hold the same ones.
#[cfg_attr(not(feature = "train"), allow(dead_code))]
pub(crate) fn broadcast_module<B: Backend, M: Module<B>>(
    model: M,
    group: &ProcessGroup,
    buffers: bool,
) -> crate::Result<M> {
    check_module(&model, group, buffers)?;
    broadcast_checked(model, group, buffers)
}

/// Fails on every rank unless all hold the same trainable parameters (and,
/// with `buffers`, the same other tensors).
fn check_module<B: Backend, M: Module<B>>(
    model: &M,
    group: &ProcessGroup,
    buffers: bool,
) -> crate::Result<()> {
    scope::check_module(group, &module_layout(model, group.rank())?, buffers)
}

/// The shapes and types of `model`'s tensors, and its trainable ids.
fn module_layout<B: Backend, M: Module<B>>(model: &M, rank: usize) -> crate::Result<ModuleLayout> {
    let mut layout = LayoutOf {
        rank,
        found: ModuleLayout::default(),
        error: None,
    };
    model.visit(&mut layout);
    match layout.error {
        Some(err) => Err(err),
        None => Ok(layout.found),
    }
}

/// [`broadcast_module`] once [`check_module`] passed.
fn broadcast_checked<B: Backend, M: Module<B>>(
    model: M,
    group: &ProcessGroup,
    buffers: bool,
) -> crate::Result<M> {
    let mut broadcaster = Broadcaster {
        group,
        buffers,
        error: None,
    };
    let model = model.map(&mut broadcaster);
    match broadcaster.error {
        Some(err) => Err(err),
        None => Ok(model),
    }
}

impl DdpConfig {
    /// The bucket sizes in bytes; an error names `rank` and the bad setting.
    pub fn bucket_config(&self, rank: usize) -> crate::Result<BucketConfig> {
        let bytes = burn_ddp_comm::BucketConfig::from_mib(
            rank,
            self.bucket_cap_mb,
            self.first_bucket_cap_mb,
        )?;
        Ok(BucketConfig {
            cap_bytes: bytes.cap_bytes,
            first_cap_bytes: bytes.first_cap_bytes,
        })
    }
}

/// [`DdpConfig::wrap`] with the default configuration.
pub fn wrap<B: Backend, M: Module<B>>(model: M, group: &ProcessGroup) -> crate::Result<M> {
    DdpConfig::new().wrap(model, group)
}

/// Replaces a module's trainable tensors (and, with `buffers`, every other
/// tensor) by rank 0's.
struct Broadcaster<'a> {
    group: &'a ProcessGroup,
    buffers: bool,
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
        if !require_grad && !self.buffers {
            return Param::from_mapped_value(id, tensor, mapper);
        }
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
        if !self.buffers {
            return Param::from_mapped_value(id, tensor, mapper);
        }
        Param::from_mapped_value(id, self.broadcast(tensor), mapper)
    }
}

/// The shape and type of every tensor a module holds, in visiting order:
/// trainable parameters (with their ids) apart from buffers.
struct LayoutOf {
    rank: usize,
    found: ModuleLayout,
    error: Option<CommError>,
}

impl LayoutOf {
    fn push(&mut self, trainable: Option<u64>, dims: Vec<usize>, dtype: burn::tensor::DType) {
        match crate::dtype::wire_or_error(self.rank, dtype, "wrap") {
            Ok(dtype) => {
                let layout = ParamLayout { shape: dims, dtype };
                match trainable {
                    Some(id) => {
                        self.found.trainable.push(layout);
                        self.found.trainable_ids.insert(id);
                    }
                    None => self.found.buffers.push(layout),
                }
            }
            Err(err) => {
                self.error.get_or_insert(err);
            }
        }
    }
}

impl<B: Backend> ModuleVisitor<B> for LayoutOf {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let value = param.val();
        let trainable = value.is_require_grad().then(|| param.id.val());
        self.push(trainable, value.dims().to_vec(), value.dtype());
    }

    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<B, D, Int>>) {
        let value = param.val();
        self.push(None, value.dims().to_vec(), value.dtype());
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
