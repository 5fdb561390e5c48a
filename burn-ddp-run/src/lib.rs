//! burn-ddp-run: a torchrun-style launcher.
//!
//! It starts one worker per rank with torchrun's environment variables, hosts
//! the rendezvous store, passes output through, and when one worker fails stops
//! the others and exits with the failure's code.

#![warn(missing_docs)]

pub mod cargo_ddp;
pub mod cli;
mod output;
mod signals;
mod supervisor;

pub use cli::{parse, Command, LaunchConfig, USAGE};

/// Runs a parsed launch; returns the process exit code.
pub fn launch(config: &LaunchConfig) -> i32 {
    match supervisor::run(config) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("burn-ddp-run: error: {message}");
            1
        }
    }
}
