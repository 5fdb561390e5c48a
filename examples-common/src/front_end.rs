//! The burn-ddp crate of a program's Burn version (`burn_ddp` on Burn 0.21,
//! `burn_ddp_22` on 0.22), as the shared trainers call it: its process group
//! belongs to that crate's session, so the shared code cannot make one itself.

use crate::fail;
use burn_ddp_comm::{ProcessGroup, Result, SyncStats};

/// A front-end's functions of the same names; each Burn version's programs
/// fill one in (`burn_ddp::init_process_group`, ...).
#[derive(Clone, Copy)]
pub struct FrontEnd {
    /// `init_process_group`: joins the launcher's group (a world of one
    /// without a launcher) and makes it the default one.
    pub init_process_group: fn() -> Result<ProcessGroup>,
    /// `destroy_process_group`: waits for every rank, then forgets the group.
    pub destroy_process_group: fn() -> Result<()>,
    /// `sync::sync_stats`: what averaging gradients has cost this process.
    pub sync_stats: fn() -> SyncStats,
    /// `sync::reset_sync_stats`: starts those figures from zero.
    pub reset_sync_stats: fn(),
    /// `reform_process_group`: after a failure, the next generation of the
    /// default group among the ranks still there.
    pub reform_process_group: fn(std::time::Duration) -> Result<ProcessGroup>,
    /// `admit_joiners`: replacements waiting, the next generation of the
    /// default group with them appended.
    pub admit_joiners: fn(std::time::Duration) -> Result<ProcessGroup>,
}

impl FrontEnd {
    /// The group, or the process ends naming why (no rank is known yet).
    pub fn init(&self) -> ProcessGroup {
        match (self.init_process_group)() {
            Ok(group) => group,
            // A replacement the job no longer needs: it finished without it.
            Err(err @ burn_ddp_comm::CommError::NothingToJoin { .. }) => {
                println!("{err}");
                std::process::exit(0)
            }
            Err(err) => fail(None, err),
        }
    }

    /// Leaves the group, or the process ends naming `rank` and why.
    pub fn destroy(&self, rank: usize) {
        (self.destroy_process_group)().unwrap_or_else(|e| fail(Some(rank), e))
    }

    /// What averaging gradients moved in this process, in one line (none
    /// if nothing was synchronised): scripts read the buckets and those on
    /// the GPU as its 3rd and 5th words.
    pub fn sync_summary(&self) -> Option<String> {
        let sync = (self.sync_stats)();
        (sync.syncs > 0).then(|| {
            format!(
                "Gradient sync: {} buckets, {} of them on the GPU over NCCL, {} sent during \
                 backward",
                sync.buckets, sync.device_buckets, sync.early_buckets
            )
        })
    }
}
