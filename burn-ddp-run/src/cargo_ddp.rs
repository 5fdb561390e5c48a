//! `cargo ddp`: build a target in release, then launch it like burn-ddp-run.
//!
//! `cargo ddp --nproc-per-node 2 --example mnist -- --epochs 1` is
//! `cargo build --release --example mnist` followed by
//! `burn-ddp-run --standalone --nproc-per-node 2 target/release/examples/mnist --epochs 1`.

use crate::cli::{self, Command, LaunchConfig};
use std::path::PathBuf;
use std::process::Stdio;

/// Help text.
pub const CARGO_DDP_USAGE: &str = "\
cargo ddp: build a binary or example in release and launch one process per rank

USAGE:
    cargo ddp [LAUNCHER OPTIONS] [TARGET] [-- PROGRAM ARGS...]

TARGET (passed to cargo build --release; one binary or example):
    --example NAME            an example of the package
    --bin NAME                a binary of the package
    -p, --package SPEC        the package that owns it
    -F, --features LIST       features to enable
    --no-default-features, --all-features
    --manifest-path PATH      Cargo.toml to build from

LAUNCHER OPTIONS: those of burn-ddp-run (see burn-ddp-run --help), e.g.
    --nproc-per-node N, --nnodes N, --node-rank N, --master-addr HOST,
    --master-port PORT, --shutdown-timeout SECS, --prefix-output, --log-dir DIR
    Without --nnodes/--master-addr/--master-port the job is --standalone.

EXAMPLE:
    cargo ddp --nproc-per-node 2 --example mnist -- --epochs 1 --data-dir ../shared/data/mnist
";

/// A parsed `cargo ddp` command line.
#[derive(Debug, Clone, PartialEq)]
pub struct CargoDdp {
    /// Arguments for `cargo build --release`.
    pub build_args: Vec<String>,
    /// The target asked for: `("example" | "bin", name)`, if named.
    pub target: Option<(String, String)>,
    /// Arguments for the launcher, the program excluded.
    pub launcher_args: Vec<String>,
    /// Arguments for the program.
    pub program_args: Vec<String>,
}

/// What `cargo ddp` was asked to do.
#[derive(Debug, PartialEq)]
pub enum CargoDdpCommand {
    /// Build and launch.
    Run(CargoDdp),
    /// Print help.
    Help,
}

/// Cargo flags that take a value, and those that do not.
const CARGO_VALUE_FLAGS: &[&str] = &[
    "--example",
    "--bin",
    "-p",
    "--package",
    "-F",
    "--features",
    "--manifest-path",
    "--target-dir",
];
const CARGO_SWITCHES: &[&str] = &[
    "--no-default-features",
    "--all-features",
    "--locked",
    "--offline",
];

/// Launcher flags that take no value.
const LAUNCHER_SWITCHES: &[&str] = &["--standalone", "--prefix-output"];

/// Splits the arguments cargo passes (`cargo-ddp ddp ...`, the `ddp` already
/// removed) into build, launcher and program arguments.
pub fn parse_cargo_ddp<I: IntoIterator<Item = String>>(args: I) -> Result<CargoDdpCommand, String> {
    let mut parsed = CargoDdp {
        build_args: Vec::new(),
        target: None,
        launcher_args: Vec::new(),
        program_args: Vec::new(),
    };
    let mut multi_node = false;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        if arg == "--" {
            parsed.program_args.extend(args.by_ref());
            break;
        }
        if arg == "-h" || arg == "--help" {
            return Ok(CargoDdpCommand::Help);
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) => (flag.to_string(), Some(value.to_string())),
            None => (arg.clone(), None),
        };
        let needs_value = format!("{flag} needs a value");
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or(needs_value.clone())
        };
        if CARGO_VALUE_FLAGS.contains(&flag.as_str()) {
            let v = value()?;
            if flag == "--example" || flag == "--bin" {
                if let Some((kind, name)) = &parsed.target {
                    return Err(format!(
                        "one target per launch: --{kind} {name} and {flag} {v} were both given"
                    ));
                }
                parsed.target = Some((flag[2..].to_string(), v.clone()));
            }
            parsed.build_args.extend([flag, v]);
        } else if CARGO_SWITCHES.contains(&flag.as_str()) {
            parsed.build_args.push(flag);
        } else if flag.starts_with("--") {
            let canonical = flag.replace('_', "-");
            multi_node |= matches!(
                canonical.as_str(),
                "--nnodes" | "--master-addr" | "--master-port" | "--node-rank"
            );
            parsed.launcher_args.push(flag);
            if !LAUNCHER_SWITCHES.contains(&canonical.as_str()) {
                parsed.launcher_args.push(value()?);
            }
        } else {
            return Err(format!(
                "unexpected argument {arg:?}; program arguments go after `--`"
            ));
        }
    }
    if !multi_node && !parsed.launcher_args.iter().any(|a| a == "--standalone") {
        parsed.launcher_args.insert(0, "--standalone".into());
    }
    Ok(CargoDdpCommand::Run(parsed))
}

impl CargoDdp {
    /// The launcher configuration for `program` (checks the launcher flags).
    pub fn launch_config(&self, program: &str) -> Result<LaunchConfig, String> {
        let args = self
            .launcher_args
            .iter()
            .cloned()
            .chain(["--".to_string(), program.to_string()])
            .chain(self.program_args.iter().cloned());
        match cli::parse(args)? {
            Command::Launch(config) => Ok(config),
            Command::Help | Command::Version => Err("unexpected --help/--version".into()),
        }
    }

    /// Runs `cargo build --release` and returns the executable it built.
    pub fn build(&self) -> Result<PathBuf, String> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let output = std::process::Command::new(&cargo)
            .args([
                "build",
                "--release",
                "--message-format=json-render-diagnostics",
            ])
            .args(&self.build_args)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .map_err(|e| format!("cannot run {cargo}: {e}"))?;
        if !output.status.success() {
            return Err("cargo build --release failed (see above)".into());
        }
        executable_from_messages(&String::from_utf8_lossy(&output.stdout), &self.target)
    }
}

/// Finds the executable `cargo build --message-format=json` reported for the
/// target (or the only executable, when no target was named).
pub fn executable_from_messages(
    messages: &str,
    target: &Option<(String, String)>,
) -> Result<PathBuf, String> {
    let mut found = Vec::new();
    for line in messages.lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if message["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(executable) = message["executable"].as_str() else {
            continue;
        };
        let name = message["target"]["name"].as_str().unwrap_or_default();
        let kinds: Vec<&str> = message["target"]["kind"]
            .as_array()
            .map(|k| k.iter().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default();
        let wanted = match target {
            Some((kind, wanted)) => name == wanted && kinds.contains(&kind.as_str()),
            None => kinds.contains(&"bin"),
        };
        if wanted {
            found.push(PathBuf::from(executable));
        }
    }
    match (found.len(), target) {
        (1, _) => Ok(found.remove(0)),
        (0, Some((kind, name))) => Err(format!("cargo built no {kind} named {name:?}")),
        (0, None) => Err("cargo built no binary; name one with --bin or --example".into()),
        (_, _) => Err(format!(
            "cargo built several binaries ({}); pick one with --bin NAME or --example NAME",
            found
                .iter()
                .filter_map(|p| p.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn run(list: &[&str]) -> CargoDdp {
        match parse_cargo_ddp(args(list)).unwrap() {
            CargoDdpCommand::Run(parsed) => parsed,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn splits_build_launcher_and_program_arguments() {
        let c = run(&[
            "--nproc-per-node",
            "2",
            "--example",
            "mnist",
            "--features=cuda",
            "--prefix-output",
            "--",
            "--epochs",
            "1",
        ]);
        assert_eq!(
            c.build_args,
            args(&["--example", "mnist", "--features", "cuda"])
        );
        assert_eq!(c.target, Some(("example".into(), "mnist".into())));
        assert_eq!(
            c.launcher_args,
            args(&["--standalone", "--nproc-per-node", "2", "--prefix-output"])
        );
        assert_eq!(c.program_args, args(&["--epochs", "1"]));
        let config = c.launch_config("/t/mnist").unwrap();
        assert!(config.standalone);
        assert_eq!(config.nproc_per_node, 2);
        assert_eq!(config.program, args(&["/t/mnist", "--epochs", "1"]));
    }

    #[test]
    fn multi_node_flags_turn_standalone_off() {
        let c = run(&[
            "--nnodes",
            "2",
            "--master_addr",
            "10.0.0.1",
            "--bin",
            "train",
        ]);
        assert!(!c.launcher_args.contains(&"--standalone".to_string()));
        let config = c.launch_config("train").unwrap();
        assert_eq!(
            (config.nnodes, config.master_addr.as_str()),
            (2, "10.0.0.1")
        );
    }

    #[test]
    fn bad_input_is_a_usage_error() {
        let err = parse_cargo_ddp(args(&["--example", "a", "--bin", "b"])).unwrap_err();
        assert!(err.contains("one target per launch"), "{err}");
        let err = parse_cargo_ddp(args(&["stray"])).unwrap_err();
        assert!(err.contains("after `--`"), "{err}");
        let err = run(&["--nproc-per-node", "zero", "--bin", "x"])
            .launch_config("x")
            .unwrap_err();
        assert!(err.contains("--nproc-per-node"), "{err}");
        assert_eq!(
            parse_cargo_ddp(args(&["--help"])).unwrap(),
            CargoDdpCommand::Help
        );
    }

    #[test]
    fn the_executable_comes_from_cargos_messages() {
        let messages = r#"{"reason":"compiler-artifact","target":{"kind":["lib"],"name":"dep"},"executable":null}
{"reason":"compiler-artifact","target":{"kind":["example"],"name":"toy"},"executable":"/t/release/examples/toy"}
{"reason":"compiler-artifact","target":{"kind":["example"],"name":"mnist"},"executable":"/t/release/examples/mnist"}
{"reason":"compiler-artifact","target":{"kind":["bin"],"name":"mnist"},"executable":"/t/release/mnist"}
{"reason":"build-finished","success":true}"#;
        let example = Some(("example".to_string(), "mnist".to_string()));
        assert_eq!(
            executable_from_messages(messages, &example).unwrap(),
            PathBuf::from("/t/release/examples/mnist")
        );
        assert_eq!(
            executable_from_messages(messages, &None).unwrap(),
            PathBuf::from("/t/release/mnist")
        );
        let missing = Some(("bin".to_string(), "nope".to_string()));
        let err = executable_from_messages(messages, &missing).unwrap_err();
        assert!(err.contains("no bin named \"nope\""), "{err}");
    }
}
