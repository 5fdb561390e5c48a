//! burn-ddp-run: a torchrun-style launcher.
//!
//! It starts one worker per rank with torchrun's environment variables, hosts
//! the rendezvous store, passes output through, and when one worker fails stops
//! the others and exits with the failure's code.
//!
//! The binaries are the interface (`burn-ddp-run --help`, `cargo ddp --help`);
//! the library parses and runs the same command lines:
//!
//! ```no_run
//! let config = burn_ddp_run::parse([
//!     "burn-ddp-run", "--standalone", "--nproc-per-node", "2", "./train", "--epochs", "1",
//! ])
//! .unwrap_or_else(|usage| usage.exit());
//! assert_eq!(config.program, ["./train", "--epochs", "1"]);
//! std::process::exit(burn_ddp_run::launch(&config));
//! ```

#![deny(missing_docs)]

pub mod cargo_ddp;
pub mod cli;
mod cpu_binding;
mod driver;
mod error;
mod job;
mod membership;
mod output;
mod peers;
mod processes;
mod rounds;
mod signals;
mod summary;
mod supervision;
mod worker;
mod worker_env;

pub use cli::{parse, LaunchConfig, LaunchOptions, LauncherArgs};
pub use error::LaunchError;

/// Installs the launcher's logger: its notices read `NAME: message` on stderr,
/// as torchrun's do; `RUST_LOG` (e.g. `burn_ddp_run=debug`) shows more.
pub fn init_logger(name: &'static str) {
    use std::io::Write;
    let env = env_logger::Env::default().default_filter_or("info");
    let _ = env_logger::Builder::from_env(env)
        .format(move |out, record| match record.level() {
            log::Level::Info => writeln!(out, "{name}: {}", record.args()),
            level => writeln!(
                out,
                "{name}: {}: {}",
                level.as_str().to_lowercase(),
                record.args()
            ),
        })
        .try_init();
}

/// Runs a parsed launch; returns the process exit code.
pub fn launch(config: &LaunchConfig) -> i32 {
    match driver::run(config) {
        Ok(code) => code,
        Err(err) => {
            log::error!("{err}");
            1
        }
    }
}
