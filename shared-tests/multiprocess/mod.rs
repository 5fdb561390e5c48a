//! The multi-process scenarios both front-ends run, written once against
//! each crate's test shim (`crate::shim`: its Burn's spelling of the models,
//! devices, tensors and optimizer steps, and its implementation of
//! [`contract`]). Each is one rank's part; testkit's
//! `multiprocess::run_suite` starts the ranks and checks what they print
//! and how they exit.

mod collectives;
pub mod contract;
mod half;
pub mod scenarios;
mod sharded;
mod sync_batch_norm;

use crate::shim;
use crate::shim::ddp;
use burn::grad_clipping::GradientClippingConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{AdamWConfig, SgdConfig};

pub type Res<T> = Result<T, String>;

pub fn e<E: std::fmt::Display>(err: E) -> String {
    err.to_string()
}

/// SGD with momentum 0.9 (state: one velocity per parameter), of whichever
/// optimizer type the call site needs (Burn 0.21's depends on the model).
macro_rules! sgd_momentum {
    () => {
        SgdConfig::new()
            .with_momentum(Some(MomentumConfig::new().with_momentum(0.9)))
            .init()
    };
}

/// AdamW with each parameter's gradient norm clipped at 0.05.
macro_rules! adamw_clipped {
    () => {
        AdamWConfig::new()
            .with_grad_clipping(Some(GradientClippingConfig::Norm(0.05)))
            .init()
    };
}

/// Runs the shared scenario `name` as this rank.
pub fn run(name: &str) -> Res<()> {
    use scenarios::{equivalence, ConvTask, ToyTask};
    use sharded::Mode;
    match name {
        "toy_sgd" => {
            equivalence::<ToyTask, _, _>(SgdConfig::new().init(), SgdConfig::new().init(), 0.1)
        }
        "toy_adamw" => {
            equivalence::<ToyTask, _, _>(AdamWConfig::new().init(), AdamWConfig::new().init(), 0.01)
        }
        "conv_sgd" => {
            equivalence::<ConvTask, _, _>(SgdConfig::new().init(), SgdConfig::new().init(), 0.1)
        }
        "conv_adamw" => equivalence::<ConvTask, _, _>(
            AdamWConfig::new().init(),
            AdamWConfig::new().init(),
            0.01,
        ),
        "unused" => scenarios::unused_parameter(),
        "survive_toy_adamw" => scenarios::survive::<ToyTask, _, _>(
            AdamWConfig::new().init(),
            AdamWConfig::new().init(),
            0.01,
        ),
        "survive_conv_adamw" => scenarios::survive::<ConvTask, _, _>(
            AdamWConfig::new().init(),
            AdamWConfig::new().init(),
            0.01,
        ),
        "uneven_toy_sgd" => scenarios::uneven::<ToyTask, _, _>(
            SgdConfig::new().init(),
            SgdConfig::new().init(),
            0.1,
        ),
        "uneven_conv_adamw" => scenarios::uneven::<ConvTask, _, _>(
            AdamWConfig::new().init(),
            AdamWConfig::new().init(),
            0.01,
        ),
        "accumulation" => scenarios::accumulation(),
        "different_models" => scenarios::different_models(),
        "replicas" => scenarios::replicas(),
        "one_step" => scenarios::one_step(),
        "tensor_collectives" => collectives::run(),
        "half" => half::run(),
        "sharded_toy_sgd" => sharded::equivalence::<ToyTask, _, _, _>(
            |group| shim::shard(sgd_momentum!(), group),
            sgd_momentum!(),
            sgd_momentum!(),
            0.1,
            Mode::Plain,
        ),
        "sharded_conv_sgd" => sharded::equivalence::<ConvTask, _, _, _>(
            |group| shim::shard(sgd_momentum!(), group),
            sgd_momentum!(),
            sgd_momentum!(),
            0.1,
            Mode::Scheduled,
        ),
        "sharded_conv_adamw" => sharded::equivalence::<ConvTask, _, _, _>(
            |group| shim::shard(AdamWConfig::new().init(), group),
            AdamWConfig::new().init(),
            AdamWConfig::new().init(),
            0.01,
            Mode::Plain,
        ),
        // Burn's clipping is per parameter: local to its owner, exact.
        "sharded_conv_adamw_clipped" => sharded::equivalence::<ConvTask, _, _, _>(
            |group| shim::shard(adamw_clipped!(), group),
            adamw_clipped!(),
            adamw_clipped!(),
            0.01,
            Mode::Plain,
        ),
        "sharded_lost_shard" => {
            sharded::lost_shard::<ToyTask, _>(|group| shim::shard(AdamWConfig::new().init(), group))
        }
        "sharded_toy_adamw_pre_averaged" => sharded::equivalence::<ToyTask, _, _, _>(
            |group| shim::shard(AdamWConfig::new().init(), group),
            AdamWConfig::new().init(),
            AdamWConfig::new().init(),
            0.01,
            Mode::PreAveraged,
        ),
        "sharded_conv_global_clip" => sharded::global_clip::<ConvTask, _, _, _>(
            |group, max_norm| {
                let config = ddp::ShardConfig::new().with_max_grad_norm(Some(max_norm));
                shim::shard_with(AdamWConfig::new().init(), group, &config)
            },
            AdamWConfig::new().init(),
            SgdConfig::new().init(),
        ),
        "sharded_accumulation" => sharded::accumulation(),
        "sharded_different_models" => sharded::different_models(),
        "sharded_one_step" => sharded::one_step(),
        "sharded_save" => sharded::checkpoint("save"),
        "sharded_resume" => sharded::checkpoint("resume"),
        "sharded_foreign" => sharded::checkpoint("foreign"),
        "sync_bn" => sync_batch_norm::equivalence("even"),
        "sync_bn_uneven" => sync_batch_norm::equivalence("uneven"),
        "sync_bn_empty" => sync_batch_norm::equivalence("empty"),
        "tracked_sum" => sync_batch_norm::tracked_sum(),
        "sync_bn_channels_differ" => sync_batch_norm::channels_differ(),
        "sync_bn_before_init" => sync_batch_norm::before_init(),
        other => Err(format!("unknown scenario {other}")),
    }
}
