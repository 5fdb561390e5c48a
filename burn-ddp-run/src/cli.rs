//! Command-line flags, spelled as torchrun spells them.

use std::path::PathBuf;
use std::time::Duration;

/// Default rendezvous port, as torchrun's.
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// What the user asked the launcher to do.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchConfig {
    /// Single machine, store on loopback at a free port.
    pub standalone: bool,
    /// Worker processes on this machine.
    pub nproc_per_node: usize,
    /// Machines in the job.
    pub nnodes: usize,
    /// This machine's index.
    pub node_rank: usize,
    /// Host of the rendezvous store (node 0).
    pub master_addr: String,
    /// Port of the rendezvous store; 0 picks a free one (standalone).
    pub master_port: u16,
    /// Grace period between SIGTERM and SIGKILL when stopping workers.
    pub shutdown_timeout: Duration,
    /// Prefix every output line with `[rank N]`.
    pub prefix_output: bool,
    /// Also write each rank's output to `DIR/rank_N.log`.
    pub log_dir: Option<PathBuf>,
    /// The worker program and its arguments.
    pub program: Vec<String>,
}

/// The parse result: run, or print something and exit.
#[derive(Debug, PartialEq)]
pub enum Command {
    /// Launch workers.
    Launch(LaunchConfig),
    /// Print help.
    Help,
    /// Print the version.
    Version,
}

/// Help text.
pub const USAGE: &str = "\
burn-ddp-run: start one process per rank and supervise them (torchrun's job)

USAGE:
    burn-ddp-run [OPTIONS] PROGRAM [ARGS...]
    burn-ddp-run [OPTIONS] -- PROGRAM [ARGS...]

OPTIONS:
    --standalone              one machine; rendezvous on 127.0.0.1 at a free port
    --nproc-per-node N        processes on this machine (default 1)
    --nnodes N                machines in the job (default 1)
    --node-rank N             this machine's index, 0..nnodes (default 0)
    --master-addr HOST        host of node 0, where the store runs (default 127.0.0.1)
    --master-port PORT        port of the store (default 29500)
    --shutdown-timeout SECS   after a failure, SIGTERM the others, then SIGKILL
                              them after this many seconds (default 30)
    --prefix-output           prefix every output line with [rank N]
    --log-dir DIR             also write each rank's output to DIR/rank_N.log
    -h, --help                print this help
    -V, --version             print the version

Underscore spellings (--nproc_per_node, --master_addr, ...) are accepted too.
Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, and
OMP_NUM_THREADS=1 and RAYON_NUM_THREADS=1 when several run and those are not set.
If one worker fails, the others are stopped and the launcher exits with the first
failure's code.

EXAMPLE:
    burn-ddp-run --standalone --nproc-per-node 2 target/release/examples/mnist --epochs 1
";

/// Parses the arguments after the program name; errors are usage messages.
pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Command, String> {
    let mut config = LaunchConfig {
        standalone: false,
        nproc_per_node: 1,
        nnodes: 1,
        node_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: DEFAULT_MASTER_PORT,
        shutdown_timeout: Duration::from_secs(30),
        prefix_output: false,
        log_dir: None,
        program: Vec::new(),
    };
    let mut master_addr_set = false;
    let mut master_port_set = false;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "--" {
            config.program.extend(args.by_ref());
            break;
        }
        if !arg.starts_with('-') {
            config.program.push(arg);
            config.program.extend(args.by_ref());
            break;
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag.replace('_', "-"), Some(value.to_string())),
            None => (arg.replace('_', "-"), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "-V" | "--version" => return Ok(Command::Version),
            "--standalone" => config.standalone = true,
            "--prefix-output" => config.prefix_output = true,
            "--nproc-per-node" => {
                let v = value(&flag)?;
                config.nproc_per_node = positive(&flag, &v)?;
            }
            "--nnodes" => {
                let v = value(&flag)?;
                if v.contains(':') {
                    return Err(format!(
                        "--nnodes {v}: elastic ranges are not supported; give a fixed count"
                    ));
                }
                config.nnodes = positive(&flag, &v)?;
            }
            "--node-rank" => {
                let v = value(&flag)?;
                config.node_rank = v
                    .parse()
                    .map_err(|_| format!("--node-rank {v:?} is not a non-negative integer"))?;
            }
            "--master-addr" => {
                config.master_addr = value(&flag)?;
                master_addr_set = true;
            }
            "--master-port" => {
                let v = value(&flag)?;
                config.master_port = v
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| format!("--master-port {v:?} is not a port (1-65535)"))?;
                master_port_set = true;
            }
            "--shutdown-timeout" => {
                let v = value(&flag)?;
                let secs = v
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s >= 0.0)
                    .ok_or_else(|| {
                        format!("--shutdown-timeout {v:?} is not a number of seconds")
                    })?;
                config.shutdown_timeout = Duration::from_secs_f64(secs);
            }
            "--log-dir" => config.log_dir = Some(PathBuf::from(value(&flag)?)),
            _ => return Err(format!("unknown option {arg}")),
        }
    }
    if config.program.is_empty() {
        return Err("no program to launch".into());
    }
    if config.node_rank >= config.nnodes {
        return Err(format!(
            "--node-rank {} but --nnodes {}: node ranks run from 0 to {}",
            config.node_rank,
            config.nnodes,
            config.nnodes - 1
        ));
    }
    if config.standalone {
        if config.nnodes != 1 {
            return Err("--standalone runs on one machine; drop --nnodes".into());
        }
        if master_addr_set || master_port_set {
            return Err(
                "--standalone picks its own address and port; drop --master-addr/--master-port"
                    .into(),
            );
        }
        config.master_port = 0;
    } else if config.nnodes > 1 && !master_addr_set {
        return Err(
            "--nnodes > 1 needs --master-addr (the host of node 0), the same on every node".into(),
        );
    }
    Ok(Command::Launch(config))
}

fn positive(flag: &str, value: &str) -> Result<usize, String> {
    value
        .parse::<usize>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{flag} {value:?} is not a positive integer"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn launch(list: &[&str]) -> LaunchConfig {
        match parse(args(list)).unwrap() {
            Command::Launch(config) => config,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn torchrun_spellings_and_program_arguments() {
        let c = launch(&[
            "--standalone",
            "--nproc_per_node=4",
            "train",
            "--epochs",
            "2",
            "--nnodes",
            "9",
        ]);
        assert!(c.standalone);
        assert_eq!(c.nproc_per_node, 4);
        assert_eq!(c.master_port, 0);
        assert_eq!(
            c.program,
            args(&["train", "--epochs", "2", "--nnodes", "9"])
        );
        let c = launch(&[
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--nproc-per-node",
            "8",
            "--master-addr",
            "10.0.0.1",
            "--master_port",
            "29501",
            "--shutdown-timeout",
            "0.5",
            "--",
            "-x",
        ]);
        assert_eq!((c.nnodes, c.node_rank, c.nproc_per_node), (2, 1, 8));
        assert_eq!((c.master_addr.as_str(), c.master_port), ("10.0.0.1", 29501));
        assert_eq!(c.shutdown_timeout, Duration::from_millis(500));
        assert_eq!(c.program, args(&["-x"]));
    }

    #[test]
    fn usage_errors_say_what_is_wrong() {
        let err = |list: &[&str]| parse(args(list)).unwrap_err();
        assert!(err(&["--nproc-per-node", "0", "p"]).contains("positive"));
        assert!(err(&["--nproc-per-node"]).contains("needs a value"));
        assert!(err(&["--bogus", "p"]).contains("unknown option --bogus"));
        assert!(err(&["--standalone"]).contains("no program"));
        assert!(err(&["--nnodes", "2", "--node-rank", "2", "p"]).contains("0 to 1"));
        assert!(err(&["--nnodes", "2", "p"]).contains("--master-addr"));
        assert!(err(&["--nnodes", "1:4", "p"]).contains("elastic"));
        assert!(err(&["--master-port", "70000", "p"]).contains("port"));
        assert!(err(&["--standalone", "--master-port", "1234", "p"]).contains("drop"));
        assert_eq!(parse(args(&["-h"])), Ok(Command::Help));
        assert_eq!(parse(args(&["--version"])), Ok(Command::Version));
    }
}
