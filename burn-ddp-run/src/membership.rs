//! Which machines a job starts with, and this machine's place among them.
//! With a fixed `--nnodes N`, all N in node-rank order. With a range
//! (`--nnodes MIN:MAX`), each launcher says it is there through node 0's
//! store, and node 0 decides once MAX are there, or MIN and the last call
//! passed; ranks follow the machines' order in that list. A machine that
//! comes after the decision, or a launcher started again for a job that
//! runs on without it, starts its workers as replacements: they join the
//! running job at its next step (`--on-failure continue`).

use crate::cli::{LaunchConfig, OnFailure};
use crate::error::LaunchError;
use crate::job::JobIdentity;
use burn_ddp_rendezvous::env::{DEFAULT_TIMEOUT, TIMEOUT_VAR};
use burn_ddp_rendezvous::job::keys::JobKeys;
use burn_ddp_rendezvous::store::{Store, TcpStoreClient};
use std::time::{Duration, Instant};

/// How often node 0 looks at who is there.
const POLL: Duration = Duration::from_millis(100);

/// This machine's place in the job's first round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Membership {
    /// Its place among the machines the job started with: its workers are
    /// ranks `index * nproc_per_node ..`.
    pub index: usize,
    /// How many machines the job started with.
    pub machines: usize,
    /// The job runs without this machine: its workers join it as
    /// replacements.
    pub rejoining: bool,
}

impl Membership {
    /// A fixed job: machine `node_rank` of `nnodes`.
    pub fn fixed(config: &LaunchConfig) -> Self {
        Self {
            index: config.node_rank,
            machines: config.nnodes,
            rejoining: false,
        }
    }
}

/// This machine's place: decided with the other launchers through node 0's
/// store at `port` where the job may change (`--on-failure continue` on
/// several machines, or a range of machines).
pub(crate) fn find(
    config: &LaunchConfig,
    job: &JobIdentity,
    port: u16,
) -> Result<Membership, LaunchError> {
    let fixed = Membership::fixed(config);
    let elastic = config.min_nodes < config.nnodes;
    let may_rejoin = config.on_failure == OnFailure::Continue && config.node_rank > 0;
    if !elastic && !may_rejoin {
        return Ok(fixed);
    }
    let wait = launch_wait();
    // A fixed job's other machines only look whether it runs without them
    // (a store not there yet is a job not started yet).
    let reach = if elastic {
        wait
    } else {
        Duration::from_secs(3)
    };
    let store = match TcpStoreClient::connect_with_token(
        &config.master_addr,
        port,
        None,
        reach,
        job.token.as_ref(),
    ) {
        Ok(store) => store,
        Err(_) if !elastic => return Ok(fixed),
        Err(err) => return Err(LaunchError::Membership(err)),
    };
    let keys = JobKeys::new(&job.id, 0);
    if config.node_rank > 0 && runs(&store, &keys) {
        return Ok(Membership {
            rejoining: true,
            ..fixed
        });
    }
    if !elastic {
        return Ok(fixed);
    }
    let node = config.node_rank;
    let at_store = LaunchError::Membership;
    store
        .set(&keys.launcher_present(node), b"1")
        .map_err(at_store)?;
    if node == 0 {
        decide(&store, &keys, config, wait)?;
    }
    let list = store
        .get(&keys.launcher_machines(), wait)
        .map_err(at_store)?;
    let machines: Vec<usize> = String::from_utf8_lossy(&list)
        .split(',')
        .filter_map(|n| n.parse().ok())
        .collect();
    Ok(match machines.iter().position(|&n| n == node) {
        Some(index) => Membership {
            index,
            machines: machines.len(),
            rejoining: false,
        },
        // Came after the decision: it joins the job as it runs (its ranks
        // are placeholders the job replaces, within the most machines).
        None => Membership {
            index: node,
            machines: config.nnodes,
            rejoining: true,
        },
    })
}

/// Whether the job's first group formed already (it runs).
fn runs(store: &TcpStoreClient, keys: &JobKeys) -> bool {
    store.check(&[&keys.group(0).join(0)]).unwrap_or(false)
}

/// Node 0: waits until every machine is there, or the fewest are and the
/// last call has passed (bounded by `wait`), then names them.
fn decide(
    store: &TcpStoreClient,
    keys: &JobKeys,
    config: &LaunchConfig,
    wait: Duration,
) -> Result<(), LaunchError> {
    let started = Instant::now();
    let mut enough_since: Option<Instant> = None;
    loop {
        let present: Vec<usize> = (0..config.nnodes)
            .filter(|&n| store.check(&[&keys.launcher_present(n)]).unwrap_or(false))
            .collect();
        let now = Instant::now();
        if present.len() >= config.min_nodes {
            let since = *enough_since.get_or_insert(now);
            if present.len() == config.nnodes || now >= since + config.last_call {
                let list: Vec<String> = present.iter().map(usize::to_string).collect();
                log::info!(
                    "starting the job on {} of up to {} machines (node ranks {}); machines that \
                     come later join it as it runs",
                    present.len(),
                    config.nnodes,
                    list.join(", ")
                );
                return store
                    .set(&keys.launcher_machines(), list.join(",").as_bytes())
                    .map_err(LaunchError::Membership);
            }
        }
        if now >= started + wait {
            return Err(LaunchError::TooFewMachines {
                present: present.len(),
                min: config.min_nodes,
                waited: wait,
            });
        }
        std::thread::sleep(POLL);
    }
}

/// How long the launchers wait for each other: the job's timeout
/// (`BURN_DDP_TIMEOUT_SECS`, else burn-ddp's default).
fn launch_wait() -> Duration {
    std::env::var(TIMEOUT_VAR)
        .ok()
        .and_then(|secs| secs.parse::<f64>().ok())
        .filter(|secs| secs.is_finite() && *secs > 0.0)
        .map_or(DEFAULT_TIMEOUT, Duration::from_secs_f64)
}
