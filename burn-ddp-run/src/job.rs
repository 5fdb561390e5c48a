//! The job as the launcher holds it: its identity (token and id, handed to
//! every worker), the rendezvous store node 0 hosts, and what the store says
//! about a failed round.

use crate::cli::LaunchConfig;
use crate::error::LaunchError;
use burn_ddp_rendezvous::job::keys::JobKeys;
use burn_ddp_rendezvous::job::{
    generate_job_id, valid_job_id, JobToken, JOB_ID_VAR, JOB_TOKEN_VAR,
};
use burn_ddp_rendezvous::store::StoreServer;
use std::net::SocketAddr;

/// What admits a process to this job, handed to every worker.
pub(crate) struct JobIdentity {
    /// The secret, when there is one.
    pub token: Option<JobToken>,
    /// The public id, part of every store key.
    pub id: String,
}

impl JobIdentity {
    /// The user's (the same on every machine of a multi-node job), else a fresh
    /// one for a single-node job. Several launchers cannot agree on a fresh
    /// one, so a multi-node job without a token runs open, and says so.
    pub fn for_job(config: &LaunchConfig) -> Result<Self, LaunchError> {
        let single_node = config.nnodes == 1;
        let token = match std::env::var(JOB_TOKEN_VAR) {
            Ok(text) => Some(JobToken::new(text).map_err(LaunchError::Token)?),
            Err(_) if single_node => Some(JobToken::generate().map_err(LaunchError::MakeToken)?),
            Err(_) => {
                if config.node_rank == 0 {
                    log::warn!(
                        "no {JOB_TOKEN_VAR} set: the rendezvous store of this {}-machine job \
                         serves anything that reaches {}:{}; export the same \
                         {JOB_TOKEN_VAR} (e.g. `openssl rand -hex 16`) on every machine to \
                         admit only this job's ranks",
                        config.nnodes,
                        config.master_addr,
                        config.master_port
                    );
                }
                None
            }
        };
        let id = match std::env::var(JOB_ID_VAR) {
            Ok(id) if valid_job_id(&id) => id,
            Ok(id) => return Err(LaunchError::JobId { id }),
            Err(_) if single_node => generate_job_id().map_err(LaunchError::MakeJobId)?,
            Err(_) => "default".into(),
        };
        Ok(Self { token, id })
    }
}

/// Node 0's rendezvous store, on loopback at a free port (`--standalone`)
/// or where `--master-addr`/`--master-port` say.
pub(crate) fn host_store(
    config: &LaunchConfig,
    token: Option<JobToken>,
) -> Result<StoreServer, LaunchError> {
    let server = if config.standalone {
        StoreServer::bind_with_token(SocketAddr::from(([127, 0, 0, 1], 0)), token)
    } else {
        StoreServer::bind_master(&config.master_addr, config.master_port, token)
    };
    let server = server.map_err(LaunchError::HostStore)?;
    log::debug!("rendezvous store listening on {}", server.addr());
    Ok(server)
}

/// Whether every rank joined the attempt's first group (`keys`: the round's).
pub(crate) fn formed(store: Option<&StoreServer>, keys: &JobKeys, world_size: usize) -> bool {
    let Some(store) = store else {
        return true; // unknown here: count it as a crash
    };
    let group = keys.group(0);
    let joined = store.entries(group.prefix());
    (0..world_size).all(|rank| joined.iter().any(|(key, _)| *key == group.join(rank)))
}

/// The message of a duplicate rank claim in the attempt, if any.
pub(crate) fn duplicate(store: Option<&StoreServer>, keys: &JobKeys) -> Option<String> {
    store?
        .entries(keys.prefix())
        .into_iter()
        .find(|(key, _)| key.ends_with("/duplicate"))
        .map(|(_, why)| String::from_utf8_lossy(&why).into_owned())
}
