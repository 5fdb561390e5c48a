//! The example programs' shared, Burn-free code, written once for both Burn
//! versions: the trainers' loops (toy, MNIST by hand and through the
//! Learner), the benchmarks' measurements and the GPU check's expectations,
//! each over a small trait a Burn version's program implements in its
//! Burn's API; command lines, saved settings, the resume choice, MNIST's
//! files, benchmark tables, a seeded normal generator.

pub mod alloc;
pub mod bench;
pub mod cli;
pub mod front_end;
pub mod gpu_check;
pub mod idx;
pub mod learner;
pub mod mnist;
pub mod resume;
pub mod run_config;
pub mod stopped;
pub mod toy;
pub mod training;

/// A seeded generator of standard normal numbers (SplitMix64 + Box-Muller), so
/// synthetic data is identical on every rank and every run.
pub struct Normal {
    state: u64,
    spare: Option<f32>,
}

impl Normal {
    pub fn new(seed: u64) -> Self {
        Self {
            state: seed ^ 0x5DEE_CE66_D1CE_4E5B,
            spare: None,
        }
    }

    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    pub fn sample(&mut self) -> f32 {
        if let Some(value) = self.spare.take() {
            return value;
        }
        let (u, v) = (self.uniform(), self.uniform());
        let radius = (-2.0 * u.ln()).sqrt();
        let angle = 2.0 * std::f64::consts::PI * v;
        self.spare = Some((radius * angle.sin()) as f32);
        (radius * angle.cos()) as f32
    }
}

/// Exits with the error, prefixed by the rank when it is known.
pub fn fail(rank: Option<usize>, err: impl std::fmt::Display) -> ! {
    let line = match rank {
        Some(rank) => format!("rank {rank}: error: {err}\n"),
        None => format!("error: {err}\n"),
    };
    // One write: `eprintln!` writes each formatted piece on its own, and the
    // ranks share the launcher's stderr, so their lines could interleave.
    use std::io::Write;
    let _ = std::io::stderr().write_all(line.as_bytes());
    std::process::exit(1)
}

/// A dataset asked for an item past its end.
#[derive(Debug)]
pub struct IndexOutOfRange {
    index: usize,
    len: usize,
}

impl IndexOutOfRange {
    pub fn new(index: usize, len: usize) -> Self {
        Self { index, len }
    }
}

impl std::fmt::Display for IndexOutOfRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "item {} of a dataset of {}", self.index, self.len)
    }
}

impl std::error::Error for IndexOutOfRange {}
