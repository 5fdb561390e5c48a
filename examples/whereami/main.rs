//! What each rank of a job sees, before any training: its rank and local
//! rank as burn-ddp reads them from the launcher (burn-ddp-run, torchrun,
//! mpirun or Slurm's srun), where the rendezvous store is and what that name
//! resolves to, and the GPU the rank would drive. No rendezvous is made, so a
//! wrong setting shows here instead of as a timeout.
//!
//! ```text
//! srun --nodes 2 --ntasks-per-node 4 --gpus-per-task 1 target/release/examples/whereami
//! burn-ddp-run --standalone --nproc-per-node 2 target/release/examples/whereami
//! ```
//!
//! Each rank prints one line of `key=value` fields. How many GPUs a rank sees
//! comes from the driver in a build with `--features cuda`, else from what
//! `CUDA_VISIBLE_DEVICES` lists (`gpu=unknown` when it is unset).

use burn_ddp_comm::gpu::{choose_gpu, listed_devices, VISIBLE_DEVICES_VAR};
use burn_ddp_comm::{LaunchEnv, Launcher, StoreHost};
use std::net::ToSocketAddrs;

/// No flags: `--help` and `--version` only.
#[derive(clap::Parser)]
#[command(
    name = "whereami",
    version,
    about = "Print, on every rank, the rank, the store's address and the GPU burn-ddp would use."
)]
struct Args {}

fn main() {
    let _: Args = clap::Parser::parse();
    let env = match LaunchEnv::from_env() {
        Ok(env) => env,
        Err(err) => {
            eprintln!("error: {err}");
            std::process::exit(1);
        }
    };
    let host = hostname();
    let store = match &env.master_addr {
        Some(addr) => format!(
            "{addr}:{} store_host={} store_resolves={}",
            env.master_port,
            match env.store_host {
                StoreHost::RankZero => "rank-0",
                StoreHost::Launcher => "launcher",
                StoreHost::TorchrunAgent => "torchrun-agent",
            },
            resolve(addr, env.master_port)
        ),
        None => "none".to_string(),
    };
    let launcher = match env.launcher {
        Launcher::None => "none",
        Launcher::BurnDdpRun => "burn-ddp-run",
        Launcher::Torchrun => "torchrun",
        Launcher::Env => "env",
        Launcher::OpenMpi => "mpirun",
        Launcher::Slurm => "srun",
    };
    // Whether the job's secret reached this rank, never the secret itself.
    let token = if env.job_token.is_some() {
        "set"
    } else {
        "unset"
    };
    println!(
        "rank={} world_size={} local_rank={} local_world_size={} node_rank={} host={host} \
         launcher={launcher} store={store} job_token={token} {}",
        env.rank,
        env.world_size,
        env.local_rank,
        env.local_world_size,
        env.node_rank.map_or("-".to_string(), |n| n.to_string()),
        gpu(&env),
    );
}

/// `text` as one `key=value` field: no spaces.
fn field(text: &str) -> String {
    text.replace(' ', "_")
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .unwrap_or_else(|_| "?".to_string())
}

/// The store's addresses as this rank resolves them (comma-separated), or
/// why not.
fn resolve(addr: &str, port: u16) -> String {
    match (addr, port).to_socket_addrs() {
        Ok(found) => {
            let found: Vec<String> = found.map(|a| a.ip().to_string()).collect();
            found.join(",")
        }
        Err(err) => format!("error:{}", field(&err.to_string())),
    }
}

/// The visible GPUs and the one this rank takes (`cuda:N`, and which entry of
/// `CUDA_VISIBLE_DEVICES` that is).
fn gpu(env: &LaunchEnv) -> String {
    let list = std::env::var(VISIBLE_DEVICES_VAR).ok();
    let shown = format!(
        "cuda_visible_devices={}",
        list.as_deref().unwrap_or("unset")
    );
    let Some(visible) = visible_gpus(list.as_deref()) else {
        return format!("{shown} gpu=unknown");
    };
    match choose_gpu(
        env.local_rank,
        env.local_world_size,
        visible,
        list.as_deref(),
    ) {
        Ok(choice) => {
            let entry = list
                .as_deref()
                .and_then(|list| list.split(',').nth(choice.ordinal))
                .map_or(String::new(), |entry| {
                    format!(" gpu_listed_as={}", entry.trim())
                });
            format!(
                "{shown} gpus_visible={visible} gpu=cuda:{}{entry} gpu_shared={}",
                choice.ordinal, choice.shared
            )
        }
        Err(err) => format!("{shown} gpu=none gpu_error={}", field(&err.to_string())),
    }
}

/// How many GPUs the process sees: the driver's count in a CUDA build, else
/// what `CUDA_VISIBLE_DEVICES` lists (`None` when it is unset too).
fn visible_gpus(list: Option<&str>) -> Option<usize> {
    #[cfg(feature = "cuda")]
    if let Ok(count) = burn_ddp_comm::nccl::cuda_device_count() {
        return Some(count);
    }
    list.map(listed_devices)
}
