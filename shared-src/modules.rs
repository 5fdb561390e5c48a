//! The public modules both front-ends export with the same contents (each
//! crate's root re-exports them; what differs per Burn stays in the crate).

/// The process group and the launcher's environment it is made from
/// (`torch.distributed`'s `init_process_group`, `new_group`, ...).
pub mod group {
    pub use crate::shared::session::{default_group, destroy_process_group, init_process_group};
    pub use burn_ddp_comm::{
        CollectiveBackend, LaunchEnv, Launcher, ProcessGroup, ProcessGroupBuilder,
        WeakProcessGroup, BACKEND_VAR,
    };
}

/// The settings of `wrap` and of the sharded optimizer.
pub mod config {
    pub use crate::shared::config::{
        BucketConfig, DdpConfig, GradientCompression, Overlap, ShardConfig, OVERLAP_VAR,
    };
}
