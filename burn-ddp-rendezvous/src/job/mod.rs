//! Which job a process belongs to: a secret token that admits it to the job's
//! store and transports, and a public id that keeps the job's store keys apart
//! from any other job's.
//!
//! burn-ddp-run creates both and hands them to its workers in the environment
//! ([`JOB_TOKEN_VAR`], [`JOB_ID_VAR`]). A job started another way (mpirun, srun,
//! by hand) is admitted by a token only if the user exports the same
//! [`JOB_TOKEN_VAR`] to every rank; without one, anything that can reach the
//! store's port can talk to it (as with torchrun and PyTorch's TCPStore).
//!
//! What else belongs to a job lives here too, so a launcher needs nothing
//! below it: the layout of its store keys ([`keys`]) and the names of its
//! shared-memory files ([`segments`]).

pub mod keys;
pub mod segments;

use crate::error::{RendezvousError, Result};
use std::fmt;

/// The job's secret, shared by its launcher(s) and ranks.
pub const JOB_TOKEN_VAR: &str = "BURN_DDP_JOB_TOKEN";
/// The job's public id, part of every store key (default: the launcher's
/// run id — torchrun's, Slurm's or Open MPI's — else `default`).
pub const JOB_ID_VAR: &str = "BURN_DDP_JOB_ID";

/// Longest token accepted, so a handshake stays one small, bounded read.
pub const MAX_TOKEN_BYTES: usize = 128;

/// The secret a process presents to the job's store and to its peers.
///
/// `Debug` does not print it; compare with [`JobToken::matches`], which takes
/// the same time whatever the input.
#[derive(Clone, PartialEq, Eq)]
pub struct JobToken(String);

impl JobToken {
    /// A fresh random token (128 bits, hex).
    pub fn generate() -> std::io::Result<Self> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(|err| std::io::Error::other(err.to_string()))?;
        Ok(Self(bytes.iter().map(|b| format!("{b:02x}")).collect()))
    }

    /// A token given by the user or a launcher: 1 to [`MAX_TOKEN_BYTES`]
    /// printable ASCII characters. Anything else is a
    /// [`RendezvousError::Config`] of [`JOB_TOKEN_VAR`] (no rank: the caller
    /// knows whose token it read) whose message says how to make a good one.
    pub fn new(text: impl Into<String>) -> Result<Self> {
        let text = text.into();
        let refuse = |message: String| RendezvousError::config(None, JOB_TOKEN_VAR, message);
        if text.is_empty() || text.len() > MAX_TOKEN_BYTES {
            return Err(refuse(format!(
                "{JOB_TOKEN_VAR} must hold 1 to {MAX_TOKEN_BYTES} characters (got {}); \
                 `openssl rand -hex 16` makes a good one",
                text.len()
            )));
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(refuse(format!(
                "{JOB_TOKEN_VAR} must be printable ASCII without spaces; \
                 `openssl rand -hex 16` makes a good one"
            )));
        }
        Ok(Self(text))
    }

    /// The token as it travels in the environment and on the wire.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `presented` is this token, in time independent of where they differ.
    pub fn matches(&self, presented: &[u8]) -> bool {
        let mine = self.0.as_bytes();
        if presented.len() != mine.len() {
            return false;
        }
        mine.iter()
            .zip(presented)
            .fold(0u8, |diff, (a, b)| diff | (a ^ b))
            == 0
    }
}

impl fmt::Debug for JobToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobToken(..)")
    }
}

/// A fresh random job id (64 bits, hex), for a launcher to hand its workers.
pub fn generate_job_id() -> std::io::Result<String> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|err| std::io::Error::other(err.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Whether a job id can be part of a store key: 1 to 64 characters of
/// `[A-Za-z0-9._-]`.
pub fn valid_job_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_differ_and_are_valid() {
        let a = JobToken::generate().unwrap();
        let b = JobToken::generate().unwrap();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 32);
        assert_eq!(JobToken::new(a.as_str()).unwrap(), a);
        assert!(valid_job_id(&generate_job_id().unwrap()));
    }

    #[test]
    fn matches_only_the_same_bytes() {
        let token = JobToken::new("secret-1").unwrap();
        assert!(token.matches(b"secret-1"));
        assert!(!token.matches(b"secret-2"));
        assert!(!token.matches(b"secret-11"));
        assert!(!token.matches(b""));
    }

    #[test]
    fn bad_tokens_and_ids_are_refused_with_the_fix() {
        for bad in ["", "has space", "tab\t", &"x".repeat(MAX_TOKEN_BYTES + 1)] {
            match JobToken::new(bad).unwrap_err() {
                RendezvousError::Config {
                    rank: None,
                    setting,
                    message,
                } => assert!(
                    setting == JOB_TOKEN_VAR
                        && message.starts_with(JOB_TOKEN_VAR)
                        && message.contains("openssl rand"),
                    "{setting}: {message}"
                ),
                other => panic!("not a setting's error: {other}"),
            }
        }
        assert!(!valid_job_id(""));
        assert!(!valid_job_id("a/b"));
        assert!(valid_job_id("slurm-1234.0"));
    }

    #[test]
    fn debug_hides_the_secret() {
        let token = JobToken::new("do-not-print").unwrap();
        assert!(!format!("{token:?}").contains("do-not-print"));
    }
}
