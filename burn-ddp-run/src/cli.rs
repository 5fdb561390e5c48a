//! Command-line flags, spelled as torchrun spells them (clap, derive).
//!
//! [`LaunchOptions`] is shared by `burn-ddp-run` and `cargo ddp`, so both take
//! the same flags with the same checks and messages.

use clap::error::ErrorKind;
use clap::{Args, CommandFactory, Parser};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// How long node 0 waits for more machines once MIN are there, as
/// torchrun's `last_call_timeout`.
const DEFAULT_LAST_CALL: Duration = Duration::from_secs(30);

/// Default rendezvous port, as torchrun's.
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// What the user asked the launcher to do, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchConfig {
    /// Single machine, store on loopback at a free port.
    pub standalone: bool,
    /// Worker processes on this machine.
    pub nproc_per_node: usize,
    /// Machines in the job (the most it takes, with a range).
    pub nnodes: usize,
    /// The fewest machines it starts with (`--nnodes MIN:MAX`; `nnodes`
    /// when fixed).
    pub min_nodes: usize,
    /// With a range of machines: how long node 0 waits for more once the
    /// fewest are there.
    pub last_call: Duration,
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
    /// Leave glibc's allocator to its own adjustment instead of setting
    /// `MALLOC_MMAP_THRESHOLD_` and `MALLOC_TRIM_THRESHOLD_` in the workers.
    pub no_malloc_tuning: bool,
    /// Whether each worker runs on CPUs of its own (`--cpu-bind`).
    pub cpu_bind: CpuBind,
    /// Times the workers are started again after a failure (torchrun's
    /// `--max-restarts`); 0 ends the job at the first failure.
    pub max_restarts: u32,
    /// What a worker's failure does to the others (`--on-failure`).
    pub on_failure: OnFailure,
    /// The worker program and its arguments.
    pub program: Vec<String>,
}

/// Where the workers of one machine run.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CpuBind {
    /// Each on an equal share of the CPUs the launcher may use, of its own
    /// (whole cores where there are enough), when several run and there
    /// are at least as many CPUs as workers.
    #[default]
    Cores,
    /// Where the scheduler puts them.
    None,
}

/// What a worker's failure does to the other workers.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnFailure {
    /// Stop them (then start every worker again under --max-restarts).
    #[default]
    Stop,
    /// Let them go on without it: a program that calls
    /// `reform_process_group` after a failed step keeps training with the
    /// ranks still there; the job succeeds if they finish. With restarts
    /// left (--max-restarts), a replacement is started (one restart each),
    /// which the others admit at a step's end (`admit_joiners`) and hand
    /// their state. If they all fail too, the round failed as under `stop`.
    Continue,
}

const ENVIRONMENT_HELP: &str = "\
Underscore spellings (--nproc_per_node, --master_addr, ...) are accepted too.
Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, MASTER_ADDR and MASTER_PORT, and
OMP_NUM_THREADS and RAYON_NUM_THREADS when several run and those are not set (the
number of CPUs each has of its own, else 1), and, on Linux with glibc,
MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ (glibc keeps freed tensor
memory for the next step) unless a MALLOC_ variable or a glibc.malloc tunable is
set, or --no-malloc-tuning is given. When several run on Linux, each is bound to
an equal share of the CPUs the launcher may use (whole cores where there are
enough; --cpu-bind none leaves them to the scheduler).
If one worker fails, the others are stopped and the launcher exits with the first
failure's code; with --max-restarts N every worker is started again instead, up
to N times, with TORCHELASTIC_RESTART_COUNT set to the round (0 first). With
--on-failure continue the others go on without it instead (the program forms
the next group with reform_process_group), and the job succeeds if they finish;
with restarts left, a replacement joins them (admit_joiners). On several
machines, a machine whose workers all failed leaves the job to the others; its
launcher started again with the same command joins the job again.
RUST_LOG=burn_ddp_run=debug shows what the launcher does.

Example:
  burn-ddp-run --standalone --nproc-per-node 2 target/release/examples/mnist --epochs 1";

/// The launcher's own flags (torchrun's names), shared with `cargo ddp`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct LaunchOptions {
    /// One machine; rendezvous on 127.0.0.1 at a free port.
    #[arg(long)]
    pub standalone: bool,
    /// Processes on this machine (one per GPU).
    #[arg(long = "nproc-per-node", visible_alias = "nproc_per_node", value_name = "N",
          default_value_t = 1, value_parser = positive)]
    pub nproc_per_node: usize,
    /// Machines in the job: N, or MIN:MAX (torchrun's elastic range, with
    /// --on-failure continue): the job starts with the machines there once
    /// MIN are (after --last-call, or at once with MAX), and machines that
    /// come later join it while it runs.
    #[arg(long, value_name = "N|MIN:MAX", default_value = "1", value_parser = node_count)]
    pub nnodes: NodeCount,
    /// With --nnodes MIN:MAX: how long node 0 waits for more machines once
    /// MIN are there (torchrun's last_call_timeout) [default: 30].
    #[arg(long = "last-call", visible_alias = "last_call", value_name = "SECS",
          value_parser = seconds)]
    pub last_call: Option<Duration>,
    /// This machine's index, 0..nnodes.
    #[arg(
        long = "node-rank",
        visible_alias = "node_rank",
        value_name = "N",
        default_value_t = 0
    )]
    pub node_rank: usize,
    /// Host of node 0, where the store runs [default: 127.0.0.1].
    #[arg(
        long = "master-addr",
        visible_alias = "master_addr",
        value_name = "HOST"
    )]
    pub master_addr: Option<String>,
    /// Port of the store [default: 29500].
    #[arg(long = "master-port", visible_alias = "master_port", value_name = "PORT",
          value_parser = port)]
    pub master_port: Option<u16>,
    /// HOST:PORT of the store, as torchrun's c10d rendezvous (instead of
    /// --master-addr/--master-port).
    #[arg(long = "rdzv-endpoint", visible_alias = "rdzv_endpoint", value_name = "HOST:PORT",
          conflicts_with_all = ["master_addr", "master_port"])]
    pub rdzv_endpoint: Option<String>,
    /// When a worker fails, stop the others and start every worker again, up
    /// to N times (on every machine: the launchers agree through the store);
    /// each round forms a fresh group.
    #[arg(
        long = "max-restarts",
        visible_alias = "max_restarts",
        value_name = "N",
        default_value_t = 0
    )]
    pub max_restarts: u32,
    /// What a worker's failure does to the others: `stop` them (then
    /// --max-restarts applies), or let them `continue` without it (the
    /// program goes on with `reform_process_group`).
    #[arg(
        long = "on-failure",
        visible_alias = "on_failure",
        value_enum,
        value_name = "WHAT",
        default_value = "stop"
    )]
    pub on_failure: OnFailure,
    /// After a failure, SIGTERM the other workers, then SIGKILL them after this
    /// many seconds; after a Ctrl-C or SIGTERM to the launcher, the time the
    /// workers get to stop by themselves (a second one kills them at once).
    #[arg(long = "shutdown-timeout", visible_alias = "shutdown_timeout", value_name = "SECS",
          default_value = "30", value_parser = seconds)]
    pub shutdown_timeout: Duration,
    /// Prefix every output line with [rank N].
    #[arg(long = "prefix-output", visible_alias = "prefix_output")]
    pub prefix_output: bool,
    /// Also write each rank's output to DIR/rank_N.log.
    #[arg(long = "log-dir", visible_alias = "log_dir", value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
    /// Leave glibc's allocator to its own adjustment: do not set
    /// MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ in the workers.
    #[arg(long = "no-malloc-tuning", visible_alias = "no_malloc_tuning")]
    pub no_malloc_tuning: bool,
    /// Run each worker on CPUs of its own (cores), or where the scheduler
    /// puts them (none).
    #[arg(
        long = "cpu-bind",
        visible_alias = "cpu_bind",
        value_enum,
        default_value_t
    )]
    pub cpu_bind: CpuBind,
}

/// `burn-ddp-run [OPTIONS] PROGRAM [ARGS...]`.
#[derive(Parser, Debug)]
#[command(
    name = "burn-ddp-run",
    version,
    about = "Start one process per rank and supervise them (torchrun's job).",
    after_help = ENVIRONMENT_HELP
)]
pub struct LauncherArgs {
    #[command(flatten)]
    options: LaunchOptions,
    /// The program to start on every rank, and its arguments (passed through
    /// untouched; `--` before the program is optional).
    #[arg(value_name = "PROGRAM", required = true, trailing_var_arg = true, num_args = 1..)]
    program: Vec<String>,
}

/// Parses a whole command line (program name first). `--help`, `--version`
/// and usage errors come back as clap errors: `.exit()` prints them and exits
/// with 0 or 2.
pub fn parse<I, T>(args: I) -> Result<LaunchConfig, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let parsed = LauncherArgs::try_parse_from(args)?;
    parsed
        .options
        .into_config(parsed.program)
        .map_err(|message| LauncherArgs::command().error(ErrorKind::ArgumentConflict, message))
}

/// `--nnodes`: a count, or a range of machines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeCount {
    /// The fewest.
    pub min: usize,
    /// The most.
    pub max: usize,
}

impl LaunchOptions {
    /// Whether any flag that only a multi-machine job needs was given.
    pub fn names_a_rendezvous(&self) -> bool {
        self.nnodes.max > 1
            || self.master_addr.is_some()
            || self.master_port.is_some()
            || self.rdzv_endpoint.is_some()
    }

    /// Checks the flags together and builds the launch of `program`; the
    /// error is a usage message.
    pub fn into_config(self, program: Vec<String>) -> Result<LaunchConfig, String> {
        if program.is_empty() {
            return Err("no program to launch".into());
        }
        let NodeCount { min, max } = self.nnodes;
        if self.node_rank >= max {
            return Err(format!(
                "--node-rank {} but --nnodes {max}: node ranks run from 0 to {}",
                self.node_rank,
                max - 1
            ));
        }
        if min == max && self.last_call.is_some() {
            return Err(format!(
                "--last-call is for a range of machines (--nnodes MIN:MAX); with --nnodes {max} \
                 the job waits for all of them: drop --last-call"
            ));
        }
        if min < max && self.on_failure != OnFailure::Continue {
            return Err(format!(
                "--nnodes {min}:{max} needs --on-failure continue: machines that come later \
                 join the running job, and the others go on without a machine that leaves"
            ));
        }
        let (master_addr, master_port) = match &self.rdzv_endpoint {
            Some(endpoint) => split_endpoint(endpoint)?,
            None => (self.master_addr.clone(), self.master_port),
        };
        let master_port = if self.standalone {
            if max != 1 {
                return Err("--standalone runs on one machine; drop --nnodes".into());
            }
            if master_addr.is_some() || master_port.is_some() {
                return Err("--standalone picks its own address and port; drop \
                            --master-addr/--master-port/--rdzv-endpoint"
                    .into());
            }
            0
        } else {
            if max > 1 && master_addr.is_none() {
                return Err(
                    "--nnodes > 1 needs --master-addr (the host of node 0), the same \
                            on every node"
                        .into(),
                );
            }
            master_port.unwrap_or(DEFAULT_MASTER_PORT)
        };
        Ok(LaunchConfig {
            standalone: self.standalone,
            nproc_per_node: self.nproc_per_node,
            nnodes: max,
            min_nodes: min,
            last_call: self.last_call.unwrap_or(DEFAULT_LAST_CALL),
            node_rank: self.node_rank,
            master_addr: master_addr.unwrap_or_else(|| "127.0.0.1".into()),
            master_port,
            shutdown_timeout: self.shutdown_timeout,
            prefix_output: self.prefix_output,
            log_dir: self.log_dir,
            no_malloc_tuning: self.no_malloc_tuning,
            cpu_bind: self.cpu_bind,
            max_restarts: self.max_restarts,
            on_failure: self.on_failure,
            program,
        })
    }
}

/// `HOST:PORT` (`[v6]:PORT` for IPv6), as torchrun's `--rdzv-endpoint`.
fn split_endpoint(endpoint: &str) -> Result<(Option<String>, Option<u16>), String> {
    let bad = || format!("--rdzv-endpoint {endpoint:?}: expected HOST:PORT, e.g. node0:29500");
    let (host, port) = endpoint.rsplit_once(':').ok_or_else(bad)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(bad());
    }
    let port = self::port(port).map_err(|_| bad())?;
    Ok((Some(host.to_string()), Some(port)))
}

fn positive(value: &str) -> Result<usize, String> {
    value
        .parse::<usize>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{value:?} is not a positive integer"))
}

fn node_count(value: &str) -> Result<NodeCount, String> {
    let Some((min, max)) = value.split_once(':') else {
        let n = positive(value)?;
        return Ok(NodeCount { min: n, max: n });
    };
    let (min, max) = (positive(min)?, positive(max)?);
    if min > max {
        return Err(format!("{value}: MIN:MAX with MIN above MAX"));
    }
    Ok(NodeCount { min, max })
}

fn port(value: &str) -> Result<u16, String> {
    value
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| format!("{value:?} is not a port (1-65535)"))
}

fn seconds(value: &str) -> Result<Duration, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && (0.0..=1e9).contains(s))
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{value:?} is not a number of seconds"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(list: &[&str]) -> LaunchConfig {
        parse(std::iter::once("burn-ddp-run").chain(list.iter().copied()))
            .unwrap_or_else(|e| panic!("{list:?}: {e}"))
    }

    fn error(list: &[&str]) -> clap::Error {
        parse(std::iter::once("burn-ddp-run").chain(list.iter().copied())).unwrap_err()
    }

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
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
            strings(&["train", "--epochs", "2", "--nnodes", "9"])
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
        assert_eq!(c.program, strings(&["-x"]));
        // Defaults, and a program flag that is also a launcher flag.
        let c = launch(&["prog", "--standalone"]);
        assert!(!c.standalone);
        assert_eq!(
            (c.master_addr.as_str(), c.master_port),
            ("127.0.0.1", 29500)
        );
        assert_eq!(c.program, strings(&["prog", "--standalone"]));
    }

    #[test]
    fn rdzv_endpoint_is_master_addr_and_port() {
        let c = launch(&["--nnodes=2", "--rdzv-endpoint", "node0:29400", "p"]);
        assert_eq!((c.master_addr.as_str(), c.master_port), ("node0", 29400));
        let c = launch(&["--rdzv_endpoint=[::1]:1234", "p"]);
        assert_eq!((c.master_addr.as_str(), c.master_port), ("::1", 1234));
        let e = error(&["--rdzv-endpoint", "node0", "p"]).to_string();
        assert!(e.contains("expected HOST:PORT"), "{e}");
        let e = error(&["--rdzv-endpoint", "a:1", "--master-port", "2", "p"]);
        assert_eq!(e.kind(), ErrorKind::ArgumentConflict);
    }

    #[test]
    fn usage_errors_say_what_is_wrong() {
        let message = |list: &[&str]| {
            let e = error(list);
            assert_eq!(e.exit_code(), 2, "{list:?}");
            e.to_string()
        };
        assert!(message(&["--nproc-per-node", "0", "p"]).contains("positive"));
        assert!(message(&["--nproc-per-node"]).contains("a value is required"));
        let typo = message(&["--nproc-per-nod", "2", "p"]);
        assert!(typo.contains("'--nproc-per-nod'"), "{typo}");
        assert!(
            typo.contains("--nproc-per-node"),
            "suggests the flag: {typo}"
        );
        assert!(message(&["--standalone"]).contains("<PROGRAM>"));
        assert!(message(&["--nnodes", "2", "--node-rank", "2", "p"]).contains("0 to 1"));
        assert!(message(&["--nnodes", "2", "p"]).contains("--master-addr"));
        assert!(message(&["--nnodes", "1:4", "--master-addr", "n", "p"]).contains("continue"));
        assert!(message(&["--nnodes", "3:2", "p"]).contains("MIN above MAX"));
        assert!(message(&["--last-call", "5", "p"]).contains("drop --last-call"));
        let elastic = [
            "--nnodes",
            "1:4",
            "--master-addr",
            "n",
            "--on-failure",
            "continue",
            "--last-call",
            "2",
            "p",
        ];
        let c = launch(&elastic);
        assert_eq!(
            (c.min_nodes, c.nnodes, c.last_call),
            (1, 4, Duration::from_secs(2))
        );
        assert!(message(&["--master-port", "70000", "p"]).contains("port"));
        assert!(message(&["--standalone", "--master-port", "1234", "p"]).contains("drop"));
        assert!(message(&["--max-restarts", "-1", "p"]).contains("-1"));
        assert!(message(&["--max-restarts", "many", "p"]).contains("many"));
        assert_eq!(launch(&["--max-restarts", "3", "p"]).max_restarts, 3);
        assert_eq!(launch(&["p"]).max_restarts, 0);
        assert_eq!(launch(&["p"]).on_failure, OnFailure::Stop);
        let go_on = launch(&["--on-failure", "continue", "p"]);
        assert_eq!(go_on.on_failure, OnFailure::Continue);
        let two = [
            "--on-failure",
            "continue",
            "--nnodes",
            "2",
            "--master-addr",
            "node0",
            "p",
        ];
        assert_eq!(launch(&two).nnodes, 2);
        assert!(error(&["--on-failure", "ignore", "p"])
            .to_string()
            .contains("ignore"));
        assert!(message(&["--shutdown-timeout", "1e20", "p"]).contains("seconds"));
        assert!(message(&["--standalone=false", "p"]).contains("--standalone"));
        assert_eq!(error(&["-h"]).kind(), ErrorKind::DisplayHelp);
        assert_eq!(error(&["--version"]).kind(), ErrorKind::DisplayVersion);
        assert_eq!(error(&["--version"]).exit_code(), 0);
    }

    #[test]
    fn help_lists_both_spellings() {
        let help = LauncherArgs::command().render_long_help().to_string();
        for flag in [
            "--nproc-per-node",
            "nproc_per_node",
            "--rdzv-endpoint",
            "RANK",
            "no_malloc_tuning",
        ] {
            assert!(help.contains(flag), "{flag} missing from:\n{help}");
        }
    }

    #[test]
    fn malloc_tuning_is_on_unless_turned_off_in_either_spelling() {
        assert!(!launch(&["./train"]).no_malloc_tuning);
        assert!(launch(&["--no-malloc-tuning", "./train"]).no_malloc_tuning);
        assert!(launch(&["--no_malloc_tuning", "./train"]).no_malloc_tuning);
        // After the program, it is the program's.
        let passed_on = launch(&["./train", "--no-malloc-tuning"]);
        assert!(!passed_on.no_malloc_tuning);
        assert_eq!(passed_on.program, ["./train", "--no-malloc-tuning"]);
    }

    #[test]
    fn workers_are_bound_unless_asked_not_to() {
        assert_eq!(launch(&["./train"]).cpu_bind, CpuBind::Cores);
        assert_eq!(
            launch(&["--cpu-bind", "none", "./train"]).cpu_bind,
            CpuBind::None
        );
        assert_eq!(
            launch(&["--cpu_bind=cores", "./train"]).cpu_bind,
            CpuBind::Cores
        );
        let unknown = error(&["--cpu-bind", "socket", "./train"]).to_string();
        assert!(
            unknown.contains("[possible values: cores, none]"),
            "{unknown}"
        );
    }
}
