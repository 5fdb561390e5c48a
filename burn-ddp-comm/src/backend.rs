//! Which collective backend moves device tensors: NCCL on the GPU, or a round
//! trip through host memory and the host transports (TCP or shared memory).

use crate::error::{CommError, Result};

/// `nccl`, `tcp` (alias `host`) or `auto` (the default).
pub const BACKEND_VAR: &str = "BURN_DDP_BACKEND";

/// How collectives on CUDA tensors are carried out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollectiveBackend {
    /// NCCL when every rank can load it and has a GPU of its own; otherwise the
    /// host transports, said once on stderr.
    Auto,
    /// NCCL, or an error saying why not. Also used at world size 1, so a single
    /// process exercises the GPU path.
    Nccl,
    /// Always through host memory and the host transports.
    Host,
}

impl CollectiveBackend {
    /// Reads [`BACKEND_VAR`].
    pub fn from_env(rank: usize) -> Result<Self> {
        Self::parse(rank, std::env::var(BACKEND_VAR).ok().as_deref())
    }

    /// Parses a [`BACKEND_VAR`] value (`None` when unset).
    pub fn parse(rank: usize, value: Option<&str>) -> Result<Self> {
        match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") | Some("auto") => Ok(Self::Auto),
            Some("nccl") => Ok(Self::Nccl),
            Some("tcp") | Some("host") | Some("gloo") => Ok(Self::Host),
            Some(_) => Err(CommError::config(
                Some(rank),
                BACKEND_VAR,
                format!(
                    "rank {rank}: {BACKEND_VAR}={:?}; expected nccl, tcp or auto",
                    value.unwrap_or_default()
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_errors() {
        let parse = |v| CollectiveBackend::parse(2, v);
        assert_eq!(parse(None).unwrap(), CollectiveBackend::Auto);
        assert_eq!(parse(Some("")).unwrap(), CollectiveBackend::Auto);
        assert_eq!(parse(Some("NCCL")).unwrap(), CollectiveBackend::Nccl);
        assert_eq!(parse(Some("tcp")).unwrap(), CollectiveBackend::Host);
        assert_eq!(parse(Some("gloo")).unwrap(), CollectiveBackend::Host);
        let err = parse(Some("mpi")).unwrap_err().to_string();
        assert!(
            err.contains("rank 2") && err.contains("BURN_DDP_BACKEND") && err.contains("\"mpi\""),
            "{err}"
        );
    }
}
