//! One error type for the whole communication stack.
//!
//! Every message says which rank saw the problem, what it was doing and, where we
//! know it, what the user can do about it: distributed failures are read in the
//! log of one rank among many.

pub(crate) use burn_ddp_rendezvous::io_is_timeout;
use burn_ddp_rendezvous::RendezvousError;
pub use burn_ddp_rendezvous::StoreErrorKind;
use std::fmt;
use std::io;
use std::time::Duration;

/// Result alias used across burn-ddp.
pub type Result<T> = std::result::Result<T, CommError>;

/// What went wrong in the process group, the store or a transport.
///
/// The rank, the setting, the peer and the kind are fields, so a program (or
/// the launcher) decides on them; the message is for people.
#[derive(Debug)]
#[non_exhaustive]
pub enum CommError {
    /// The launcher environment (or builder input, or a setting) is invalid.
    Config {
        /// The rank that found it, once known.
        rank: Option<usize>,
        /// The variable or setting at fault (`"MASTER_PORT"`, `"bucket_cap_mb"`).
        setting: String,
        /// What is wrong and how to fix it (names the setting too).
        message: String,
    },
    /// A wait ran past the group's timeout.
    Timeout {
        /// The rank that gave up waiting (`None`: the launcher's store client).
        rank: Option<usize>,
        /// What it was waiting for.
        what: String,
        /// The rank it was waiting for, when one rank was awaited.
        peer: Option<usize>,
        /// How long it waited.
        after: Duration,
    },
    /// A peer closed its connection or sent something unexpected.
    Peer {
        /// The rank reporting the error.
        rank: usize,
        /// The peer it was talking to.
        peer: usize,
        /// The operation under way.
        op: String,
        /// What happened.
        detail: String,
        /// The socket's own error, where there was one.
        source: Option<io::Error>,
    },
    /// The rendezvous store could not be reached or answered an error.
    Store {
        /// The rank reporting the error (`None` for the launcher).
        rank: Option<usize>,
        /// What kind of failure it was.
        kind: StoreErrorKind,
        /// What happened.
        message: String,
        /// The socket's own error, where there was one.
        source: Option<io::Error>,
    },
    /// Ranks disagree about the shape of a collective call.
    Mismatch {
        /// The rank reporting the error.
        rank: usize,
        /// What differs.
        message: String,
    },
    /// An input the collective cannot handle (wrong length, unsupported op).
    InvalidArgument {
        /// The rank reporting the error.
        rank: usize,
        /// What is wrong.
        message: String,
    },
    /// A GPU collective failed (NCCL or the CUDA driver).
    Device {
        /// The rank reporting the error.
        rank: usize,
        /// What happened.
        message: String,
        /// The driver's or NCCL's own error (cudarc's), where there was one.
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// The process group was already shut down.
    Destroyed,
    /// A replacement worker ([`JOINING_VAR`](crate::JOINING_VAR)) found the
    /// job's training finished before it could join: nothing is left for it
    /// to do (not a failure).
    NothingToJoin {
        /// The rank it was started in place of.
        rank: usize,
    },
}

impl CommError {
    /// A store error without an underlying socket error.
    pub fn store(rank: Option<usize>, kind: StoreErrorKind, message: impl Into<String>) -> Self {
        CommError::Store {
            rank,
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// A failure talking to `peer`, without an underlying socket error.
    pub fn peer(
        rank: usize,
        peer: usize,
        op: impl Into<String>,
        detail: impl Into<String>,
    ) -> Self {
        CommError::Peer {
            rank,
            peer,
            op: op.into(),
            detail: detail.into(),
            source: None,
        }
    }

    /// The same error, caused by `source` (a store or peer error; any other
    /// kind is returned as it is).
    pub fn caused_by(mut self, cause: io::Error) -> Self {
        if let CommError::Store { source, .. } | CommError::Peer { source, .. } = &mut self {
            *source = Some(cause);
        }
        self
    }

    /// The kind of a store error.
    pub fn store_kind(&self) -> Option<StoreErrorKind> {
        match self {
            CommError::Store { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// A setting at fault, found by `rank` (once known): `message` names it
    /// and the fix.
    pub fn config(
        rank: Option<usize>,
        setting: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        CommError::Config {
            rank,
            setting: setting.into(),
            message: message.into(),
        }
    }

    /// A GPU failure on `rank`, caused by the driver's or NCCL's `source`.
    pub fn device(
        rank: usize,
        message: impl Into<String>,
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        CommError::Device {
            rank,
            message: message.into(),
            source,
        }
    }

    /// The rank that reported this error, where it names one.
    pub fn rank(&self) -> Option<usize> {
        match self {
            CommError::Config { rank, .. }
            | CommError::Timeout { rank, .. }
            | CommError::Store { rank, .. } => *rank,
            CommError::Peer { rank, .. }
            | CommError::Mismatch { rank, .. }
            | CommError::InvalidArgument { rank, .. }
            | CommError::Device { rank, .. }
            | CommError::NothingToJoin { rank } => Some(*rank),
            CommError::Destroyed => None,
        }
    }

    /// Whether this error is a timeout (of any wait).
    pub fn is_timeout(&self) -> bool {
        matches!(self, CommError::Timeout { .. })
    }

    /// Whether this error says a peer is gone (it closed its connection,
    /// failed, or was waited for past the timeout), the failures the ranks
    /// still there can go on from ([`ProcessGroup::reform`](crate::ProcessGroup::reform));
    /// not a setting, a mismatch or a replaced group, which going on would
    /// only repeat.
    pub fn is_peer_failure(&self) -> bool {
        matches!(self, CommError::Peer { .. } | CommError::Timeout { .. })
    }

    /// The other rank this error points at: the peer that closed its
    /// connection, failed, or was waited for in vain. A launcher follows these
    /// to the rank that failed first (a stalled rank never reports itself).
    pub fn blamed_peer(&self) -> Option<usize> {
        match self {
            CommError::Peer { rank, peer, .. } if peer != rank => Some(*peer),
            CommError::Timeout { peer, .. } => *peer,
            _ => None,
        }
    }
}

impl fmt::Display for CommError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommError::Config { message, .. } => {
                write!(f, "burn-ddp configuration error: {message}")
            }
            CommError::Timeout {
                rank, what, after, ..
            } => {
                if let Some(rank) = rank {
                    write!(f, "rank {rank}: ")?;
                }
                write!(
                    f,
                    "timed out after {:.1}s waiting for {what}; a peer may have died or \
                     never started (raise the timeout with BURN_DDP_TIMEOUT_SECS if it is \
                     only slow)",
                    after.as_secs_f64()
                )
            }
            CommError::Peer {
                rank,
                peer,
                op,
                detail,
                ..
            } => write!(f, "rank {rank}: {op} with rank {peer} failed: {detail}"),
            CommError::Store { rank, message, .. } => match rank {
                Some(rank) => write!(f, "rank {rank}: rendezvous store: {message}"),
                None => write!(f, "rendezvous store: {message}"),
            },
            CommError::Mismatch { rank, message } => {
                write!(f, "rank {rank}: ranks disagree: {message}")
            }
            CommError::InvalidArgument { rank, message } => write!(f, "rank {rank}: {message}"),
            CommError::Device { rank, message, .. } => {
                write!(f, "rank {rank}: GPU collective: {message}")
            }
            CommError::Destroyed => write!(f, "the process group was already destroyed"),
            CommError::NothingToJoin { rank } => write!(
                f,
                "rank {rank}: the job's training finished before this replacement could \
                 join it; nothing is left to do"
            ),
        }
    }
}

impl std::error::Error for CommError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CommError::Peer { source, .. } | CommError::Store { source, .. } => source
                .as_ref()
                .map(|err| err as &(dyn std::error::Error + 'static)),
            CommError::Device { source, .. } => source
                .as_deref()
                .map(|err| err as &(dyn std::error::Error + 'static)),
            _ => None,
        }
    }
}

/// The rendezvous layer's errors are this stack's, field for field.
impl From<RendezvousError> for CommError {
    fn from(err: RendezvousError) -> Self {
        match err {
            RendezvousError::Config {
                rank,
                setting,
                message,
            } => CommError::Config {
                rank,
                setting,
                message,
            },
            RendezvousError::Timeout { rank, what, after } => CommError::Timeout {
                rank,
                what,
                peer: None,
                after,
            },
            RendezvousError::Store {
                rank,
                kind,
                message,
                source,
            } => CommError::Store {
                rank,
                kind,
                message,
                source,
            },
            // A kind the layer below may add later: keep its words.
            other => CommError::Config {
                rank: None,
                setting: String::new(),
                message: other.to_string(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    #[test]
    fn sources_are_kept_and_messages_unchanged() {
        let lost = CommError::store(Some(2), StoreErrorKind::ConnectionLost, "went away")
            .caused_by(io::Error::from(io::ErrorKind::ConnectionReset));
        assert_eq!(lost.to_string(), "rank 2: rendezvous store: went away");
        assert_eq!(lost.store_kind(), Some(StoreErrorKind::ConnectionLost));
        let source = lost.source().unwrap().downcast_ref::<io::Error>().unwrap();
        assert_eq!(source.kind(), io::ErrorKind::ConnectionReset);

        let peer = CommError::peer(0, 1, "all_reduce", "closed")
            .caused_by(io::Error::from(io::ErrorKind::UnexpectedEof));
        assert_eq!(
            peer.to_string(),
            "rank 0: all_reduce with rank 1 failed: closed"
        );
        assert!(peer.source().is_some());
        assert_eq!(peer.blamed_peer(), Some(1));
        assert!(CommError::config(None, "X", "x").source().is_none());
        assert_eq!(CommError::config(None, "X", "x").store_kind(), None);
    }
}
