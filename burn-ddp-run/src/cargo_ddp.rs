//! `cargo ddp`: build a target in release, then launch it like burn-ddp-run.
//!
//! `cargo ddp --nproc-per-node 2 --example mnist -- --epochs 1` is
//! `cargo build --release --example mnist` followed by
//! `burn-ddp-run --standalone --nproc-per-node 2 target/release/examples/mnist --epochs 1`.

use crate::cli::{LaunchConfig, LaunchOptions};
use crate::error::LaunchError;
use clap::error::ErrorKind;
use clap::{Args, CommandFactory, Parser};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;

/// `cargo ddp [LAUNCHER OPTIONS] [TARGET] [-- PROGRAM ARGS...]`.
#[derive(Parser, Debug, Clone, PartialEq)]
#[command(
    name = "cargo-ddp",
    bin_name = "cargo ddp",
    version,
    about = "Build a binary or example in release and launch one process per rank.",
    after_help = "Without --nnodes/--master-addr/--master-port/--rdzv-endpoint the job is \
                  --standalone.\n\nExample:\n  cargo ddp --nproc-per-node 2 --example mnist -- \
                  --epochs 1 --data-dir ../shared/data/mnist"
)]
pub struct CargoDdp {
    /// The launcher's flags (see burn-ddp-run --help).
    #[command(flatten)]
    pub launch: LaunchOptions,
    /// What to build (passed to `cargo build --release`).
    #[command(flatten, next_help_heading = "Target")]
    pub target: BuildTarget,
    /// Arguments for the program, after `--`.
    #[arg(last = true, value_name = "PROGRAM ARGS")]
    pub program_args: Vec<String>,
}

/// The `cargo build` flags `cargo ddp` passes on.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct BuildTarget {
    /// An example of the package.
    #[arg(long, value_name = "NAME", conflicts_with = "bin")]
    pub example: Option<String>,
    /// A binary of the package.
    #[arg(long, value_name = "NAME")]
    pub bin: Option<String>,
    /// The package that owns it.
    #[arg(short, long, value_name = "SPEC")]
    pub package: Option<String>,
    /// Features to enable.
    #[arg(short = 'F', long, value_name = "LIST")]
    pub features: Vec<String>,
    /// Do not enable the default features.
    #[arg(long = "no-default-features")]
    pub no_default_features: bool,
    /// Enable every feature.
    #[arg(long = "all-features")]
    pub all_features: bool,
    /// Cargo.toml to build from.
    #[arg(long = "manifest-path", value_name = "PATH")]
    pub manifest_path: Option<PathBuf>,
    /// Where cargo puts what it builds.
    #[arg(long = "target-dir", value_name = "DIR")]
    pub target_dir: Option<PathBuf>,
    /// Require Cargo.lock to be up to date.
    #[arg(long)]
    pub locked: bool,
    /// Build without touching the network.
    #[arg(long)]
    pub offline: bool,
}

/// Parses `cargo ddp`'s command line as cargo passes it (`cargo-ddp ddp
/// ARGS...`; the `ddp` may be missing when run directly). Help, version and
/// usage errors come back as clap errors (`.exit()` prints them).
pub fn parse_cargo_ddp<I, T>(args: I) -> Result<CargoDdp, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let mut args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    if args.get(1).is_some_and(|a| a == "ddp") {
        args.remove(1);
    }
    let mut parsed = CargoDdp::try_parse_from(args)?;
    if !parsed.launch.names_a_rendezvous() {
        parsed.launch.standalone = true;
    }
    // Check the launcher flags now, before a long release build.
    parsed.launch_config("PROGRAM")?;
    Ok(parsed)
}

impl BuildTarget {
    /// The arguments for `cargo build --release`.
    pub fn cargo_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        let mut value = |flag: &str, value: &Option<String>| {
            if let Some(value) = value {
                args.extend([flag.to_string(), value.clone()]);
            }
        };
        value("--example", &self.example);
        value("--bin", &self.bin);
        value("--package", &self.package);
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.to_string_lossy().into_owned());
        value("--manifest-path", &path(&self.manifest_path));
        value("--target-dir", &path(&self.target_dir));
        for list in &self.features {
            args.extend(["--features".to_string(), list.clone()]);
        }
        for (on, flag) in [
            (self.no_default_features, "--no-default-features"),
            (self.all_features, "--all-features"),
            (self.locked, "--locked"),
            (self.offline, "--offline"),
        ] {
            if on {
                args.push(flag.to_string());
            }
        }
        args
    }

    /// The target asked for: `("example" | "bin", name)`, if named.
    pub fn named(&self) -> Option<(String, String)> {
        match (&self.example, &self.bin) {
            (Some(name), _) => Some(("example".into(), name.clone())),
            (None, Some(name)) => Some(("bin".into(), name.clone())),
            (None, None) => None,
        }
    }
}

impl CargoDdp {
    /// The launcher configuration for `program`, its arguments appended.
    pub fn launch_config(&self, program: &str) -> Result<LaunchConfig, clap::Error> {
        let program = std::iter::once(program.to_string())
            .chain(self.program_args.iter().cloned())
            .collect();
        self.launch
            .clone()
            .into_config(program)
            .map_err(|message| CargoDdp::command().error(ErrorKind::ArgumentConflict, message))
    }

    /// Runs `cargo build --release` and returns the executable it built.
    pub fn build(&self) -> Result<PathBuf, LaunchError> {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let output = std::process::Command::new(&cargo)
            .args([
                "build",
                "--release",
                "--message-format=json-render-diagnostics",
            ])
            .args(self.target.cargo_args())
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .map_err(|source| LaunchError::Cargo {
                cargo: cargo.clone(),
                source,
            })?;
        if !output.status.success() {
            return Err(LaunchError::BuildFailed);
        }
        executable_from_messages(
            &String::from_utf8_lossy(&output.stdout),
            &self.target.named(),
        )
    }
}

/// Finds the executable `cargo build --message-format=json` reported for the
/// target (or the only executable, when no target was named).
pub fn executable_from_messages(
    messages: &str,
    target: &Option<(String, String)>,
) -> Result<PathBuf, LaunchError> {
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
        (0, Some((kind, name))) => Err(LaunchError::NoSuchTarget {
            kind: kind.clone(),
            name: name.clone(),
        }),
        (0, None) => Err(LaunchError::NoBinary),
        (_, _) => Err(LaunchError::SeveralBinaries {
            names: found
                .iter()
                .filter_map(|p| p.file_name())
                .map(|n| n.to_string_lossy().into_owned())
                .collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn run(list: &[&str]) -> Result<CargoDdp, clap::Error> {
        parse_cargo_ddp(["cargo-ddp", "ddp"].iter().chain(list))
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
        ])
        .unwrap();
        assert_eq!(
            c.target.cargo_args(),
            strings(&["--example", "mnist", "--features", "cuda"])
        );
        assert_eq!(c.target.named(), Some(("example".into(), "mnist".into())));
        assert_eq!(c.program_args, strings(&["--epochs", "1"]));
        let config = c.launch_config("/t/mnist").unwrap();
        assert!(config.standalone && config.prefix_output);
        assert_eq!(config.nproc_per_node, 2);
        assert_eq!(config.program, strings(&["/t/mnist", "--epochs", "1"]));
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
        ])
        .unwrap();
        assert!(!c.launch.standalone);
        let config = c.launch_config("train").unwrap();
        assert_eq!(
            (config.nnodes, config.master_addr.as_str()),
            (2, "10.0.0.1")
        );
    }

    #[test]
    fn bad_input_is_a_usage_error() {
        let message = |list: &[&str]| {
            let err = run(list).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{list:?}");
            err.to_string()
        };
        let err = message(&["--example", "a", "--bin", "b"]);
        assert!(err.contains("cannot be used with"), "{err}");
        let err = message(&["stray"]);
        assert!(err.contains("'stray'"), "{err}");
        let err = message(&["--nproc-per-node", "zero", "--bin", "x"]);
        assert!(err.contains("--nproc-per-node"), "{err}");
        let err = message(&[
            "--standalone",
            "--nnodes",
            "2",
            "--master-addr",
            "h",
            "--bin",
            "x",
        ]);
        assert!(err.contains("drop --nnodes"), "{err}");
        assert_eq!(run(&["--help"]).unwrap_err().kind(), ErrorKind::DisplayHelp);
        let help = CargoDdp::command().render_long_help().to_string();
        assert!(
            help.contains("--example") && help.contains("--nproc-per-node"),
            "{help}"
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
        assert!(
            matches!(&err, LaunchError::NoSuchTarget { kind, name } if kind == "bin" && name == "nope")
                && err.to_string() == "cargo built no bin named \"nope\"",
            "{err}"
        );
    }
}
