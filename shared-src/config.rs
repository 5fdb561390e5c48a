//! How a model is synchronised, as Burn `Config`s (saved beside a run's other
//! settings with `.save(path)`, read back with `::load(path)`): PyTorch DDP's
//! defaults, in its units.

use burn::config::Config;
use burn_ddp_comm::ProcessGroup;
use burn_ddp_training::session::WrapSettings;

/// How gradients are grouped into buckets, in bytes: a Burn `Config`.
/// [`DdpConfig`] sets it in MiB, as PyTorch's `bucket_cap_mb`.
///
/// ```
/// use burn::config::Config;
#[doc = concat!("let buckets = ", env!("CARGO_CRATE_NAME"), "::config::BucketConfig::new().with_cap_bytes(4 << 20);")]
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

impl BucketConfig {
    /// Buckets of `cap_mb` MiB, the first of `first_cap_mb` (PyTorch's
    /// `bucket_cap_mb`); a size that is not a positive number of MiB is an
    /// error naming `rank` and the setting.
    pub fn from_mib(rank: usize, cap_mb: f64, first_cap_mb: f64) -> burn_ddp_comm::Result<Self> {
        let bytes = burn_ddp_comm::BucketConfig::from_mib(rank, cap_mb, first_cap_mb)?;
        Ok(Self {
            cap_bytes: bytes.cap_bytes,
            first_cap_bytes: bytes.first_cap_bytes,
        })
    }
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
    /// `bf16_compress_hook`). Only f32 sums between machines are compressed;
    /// unset, the group's own setting (`BURN_DDP_COMPRESSION`) applies.
    #[config(default = "GradientCompression::None")]
    pub gradient_compression: GradientCompression,
    /// Whether `wrap` also gives every rank rank 0's buffers (tensors without
    /// gradients: batch-norm statistics, frozen weights), as PyTorch's
    /// `broadcast_buffers`. Off, each rank keeps its own, and they may differ
    /// between ranks (a frozen tensor only one rank has).
    #[config(default = true)]
    pub broadcast_buffers: bool,
    /// When each bucket's all-reduce may start during `backward()`, as soon
    /// as its gradients are final, overlapping the rest of backward (as
    /// PyTorch's DDP does; the averages are the same, bit for bit). Only
    /// Burn 0.21's `Ddp<B>` can tell when a gradient is final; elsewhere
    /// (`sync_gradients`, Burn 0.22) gradients are reduced after backward.
    #[config(default = "Overlap::AcrossMachines")]
    pub overlap_backward: Overlap,
}

/// [`DdpConfig::overlap_backward`]: when buckets may leave during backward.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum Overlap {
    /// Never: every bucket after backward.
    Never,
    /// When the model's group spans machines (the default): there the link
    /// is slow and backward hides it. Within one machine the all-reduce
    /// through shared memory is fast, and running it beside backward only
    /// takes CPU time from it. On CUDA with NCCL, after backward: the GPU
    /// path of the overlap has not run on a GPU yet. `BURN_DDP_OVERLAP=always`
    /// or `never` decides instead, without a change to the program.
    AcrossMachines,
    /// Always, within one machine and on CUDA with NCCL too.
    Always,
}

/// `always` or `never` decides what [`Overlap::AcrossMachines`] (the
/// default) does; unset or `auto`, it goes by whether the group spans
/// machines. A program that sets `Always` or `Never` keeps it.
pub const OVERLAP_VAR: &str = "BURN_DDP_OVERLAP";

/// Where buckets leave during backward, as a model's settings say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Overlapping {
    /// On the host path.
    pub host: bool,
    /// On the GPU path (NCCL): only when asked for outright (`Always`, or
    /// `BURN_DDP_OVERLAP=always`) until a GPU has run it.
    pub gpu: bool,
}

impl Overlap {
    /// Where buckets leave during backward for a model over `group`; an
    /// error names the rank and a bad [`OVERLAP_VAR`].
    pub(crate) fn applies_to(self, group: &ProcessGroup) -> burn_ddp_comm::Result<Overlapping> {
        let both = |on: bool| Overlapping { host: on, gpu: on };
        match self {
            Overlap::Never => Ok(both(false)),
            Overlap::Always => Ok(both(true)),
            Overlap::AcrossMachines => {
                let value = std::env::var(OVERLAP_VAR).unwrap_or_default();
                match value.as_str() {
                    "" | "auto" => Ok(Overlapping {
                        host: group.spans_machines(),
                        gpu: false,
                    }),
                    "always" => Ok(both(true)),
                    "never" => Ok(both(false)),
                    other => Err(burn_ddp_comm::CommError::config(
                        Some(group.rank()),
                        OVERLAP_VAR,
                        format!(
                            "rank {}: {OVERLAP_VAR}={other:?}; expected always, never or auto \
                             (unset: during backward when the ranks span machines)",
                            group.rank()
                        ),
                    )),
                }
            }
        }
    }
}

/// How the sharded optimizer (ZeRO stage 1) moves gradients and parameters:
/// a Burn `Config`, as [`DdpConfig`].
#[derive(Config, Debug)]
pub struct ShardConfig {
    /// About how many MiB one collective moves (all ranks' chunks together),
    /// as DDP's `bucket_cap_mb`.
    #[config(default = 25.0)]
    pub bucket_cap_mb: f64,
    /// A round is padded so every rank's chunk is as long as the longest;
    /// past this many times its real elements (one huge parameter among
    /// small ones) it is all-reduced instead and each owner broadcasts its
    /// parameters.
    #[config(default = 1.5)]
    pub padding_limit: f64,
    /// Clips the averaged gradients to this L2 norm over all parameters
    /// together, as PyTorch's `clip_grad_norm_` before `step` (one
    /// all-reduce of one number a step); `None`: no clipping. Burn's own
    /// `with_grad_clipping` on the inner optimizer clips each parameter by
    /// itself, and works too.
    pub max_grad_norm: Option<f64>,
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
    /// The bucket sizes in bytes; an error names `rank` and the bad setting.
    pub fn bucket_config(&self, rank: usize) -> burn_ddp_comm::Result<BucketConfig> {
        BucketConfig::from_mib(rank, self.bucket_cap_mb, self.first_bucket_cap_mb)
    }

    /// What the session registers for a model wrapped over `group`.
    pub(crate) fn settings(&self, group: &ProcessGroup) -> burn_ddp_comm::Result<WrapSettings> {
        let overlapping = self.overlap_backward.applies_to(group)?;
        Ok(WrapSettings {
            buckets: self.bucket_config(group.rank())?.into(),
            compression: self.gradient_compression.into(),
            broadcast_buffers: self.broadcast_buffers,
            overlap_backward: overlapping.host,
            overlap_on_gpu: overlapping.gpu,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_save_and_load_as_json() {
        let dir = std::env::temp_dir().join(format!(
            "{}-config-{}",
            env!("CARGO_CRATE_NAME"),
            std::process::id()
        ));
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
        assert!(loaded.broadcast_buffers);
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
                .unwrap_err();
            assert!(
                matches!(&err, burn_ddp_comm::CommError::Config { rank: Some(3), setting, .. }
                    if setting == "bucket_cap_mb"),
                "{err:?}"
            );
            assert!(err.to_string().contains("rank 3"), "{err}");
        }
    }
}
