//! What every example's command line shares: the backend choice, value
//! checks, and the logger.

use std::io::Write;

/// The CPU or GPU backend a trainer runs on (`--backend`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendChoice {
    /// Burn's Flex: fast pure-Rust CPU kernels (GEMM convolutions).
    Flex,
    /// Burn's NdArray (its transposed convolution is slow).
    Ndarray,
    /// Burn's Cuda without fusion, one GPU per local rank (needs the `cuda` feature).
    Cuda,
    /// Burn's fused Cuda (what `burn::backend::Cuda` is with Burn's default
    /// features), one GPU per local rank (needs the `cuda` feature).
    CudaFused,
}

/// A clap value parser for counts that must be at least 1.
pub fn positive(value: &str) -> Result<usize, String> {
    value
        .parse::<usize>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{value:?} is not a positive integer"))
}

/// Installs the examples' logger. Only warnings and errors show by default,
/// so a trainer's output stays its own; `RUST_LOG=burn_ddp=debug,burn_ddp_comm=debug`
/// shows the rendezvous, the transport, bucket plans and sync timings.
pub fn init_logger() {
    let env = env_logger::Env::default().default_filter_or("warn");
    let _ = env_logger::Builder::from_env(env)
        .format(|out, record| {
            writeln!(
                out,
                "[{} {}] {}",
                record.level(),
                record.target(),
                record.args()
            )
        })
        .try_init();
}
