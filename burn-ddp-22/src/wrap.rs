//! Preparing a model for data-parallel training, as `DistributedDataParallel(model)`.

use crate::{CommError, ProcessGroup};
use burn::config::Config;
use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{Int, Tensor};
use burn_ddp_comm::reducer::models::{self as scope, ModuleLayout, WrapSettings};
use burn_ddp_comm::ParamLayout;

/// How gradients are synchronised; defaults follow PyTorch's DDP. A Burn
/// `Config`: save it next to a run's other settings with `.save(path)`.
///
/// ```no_run
/// use burn::config::Config;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let model = burn::nn::LinearConfig::new(4, 2).init(&Default::default());
/// let group = burn_ddp_22::init_process_group()?;
/// let config = burn_ddp_22::DdpConfig::new().with_bucket_cap_mb(50.0);
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
    /// f32 where they arrive (PyTorch's `bf16_compress_hook`).
    #[config(default = "GradientCompression::None")]
    pub gradient_compression: GradientCompression,
    /// Whether `wrap` also gives every rank rank 0's buffers (tensors without
    /// gradients), as PyTorch's `broadcast_buffers`.
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
    /// state (reducer, buckets, statistics) over `group`, used by
    /// [`crate::sync_gradients`].
    ///
    /// Call it once, after building (or loading) the model and before the
    /// first step, and again after loading a record into it.
    pub fn wrap<M: Module>(&self, model: M, group: &ProcessGroup) -> crate::Result<M> {
        let buckets = burn_ddp_comm::BucketConfig::from_mib(
            group.rank(),
            self.bucket_cap_mb,
            self.first_bucket_cap_mb,
        )?;
        let settings = WrapSettings {
            buckets,
            compression: self.gradient_compression.into(),
            broadcast_buffers: self.broadcast_buffers,
        };
        scope::wrap(group, settings, module_layout(&model, group.rank())?)?;
        broadcast_module(model, group, self.broadcast_buffers)
    }
}

/// [`DdpConfig::wrap`] with the default configuration.
pub fn wrap<M: Module>(model: M, group: &ProcessGroup) -> crate::Result<M> {
    DdpConfig::new().wrap(model, group)
}

/// Rank 0's trainable parameters (and, with `buffers`, every other tensor)
/// on every rank; the layouts were checked to agree.
pub(crate) fn broadcast_module<M: Module>(
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

/// The shapes and types of `model`'s tensors, and its trainable ids.
fn module_layout<M: Module>(model: &M, rank: usize) -> crate::Result<ModuleLayout> {
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
    fn broadcast<const D: usize, K: crate::collective::CollectiveKind>(
        &mut self,
        tensor: Tensor<D, K>,
    ) -> Tensor<D, K> {
        if self.error.is_some() {
            return tensor;
        }
        match crate::broadcast(self.group, tensor.clone(), 0) {
            Ok(value) => value,
            Err(err) => {
                self.error = Some(err);
                tensor // the module is dropped with the error
            }
        }
    }
}

impl ModuleMapper for Broadcaster<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
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

    fn map_int<const D: usize>(&mut self, param: Param<Tensor<D, Int>>) -> Param<Tensor<D, Int>> {
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

impl ModuleVisitor for LayoutOf {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let value = param.val();
        let trainable = value.is_require_grad().then(|| param.id.val());
        self.push(trainable, value.dims().to_vec(), value.dtype());
    }

    fn visit_int<const D: usize>(&mut self, param: &Param<Tensor<D, Int>>) {
        let value = param.val();
        self.push(None, value.dims().to_vec(), value.dtype());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_save_and_load_as_json() {
        let dir = std::env::temp_dir().join(format!("burn-ddp-22-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ddp = DdpConfig::new()
            .with_bucket_cap_mb(50.0)
            .with_gradient_compression(GradientCompression::Bf16);
        ddp.save(dir.join("ddp.json")).unwrap();
        let loaded = DdpConfig::load(dir.join("ddp.json")).unwrap();
        assert_eq!(loaded.gradient_compression, GradientCompression::Bf16);
        assert_eq!(loaded.bucket_cap_mb, 50.0);
        assert!(loaded.broadcast_buffers);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
