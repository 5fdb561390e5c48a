//! One error type for the whole communication stack.
//!
//! Every message says which rank saw the problem, what it was doing and, where we
//! know it, what the user can do about it: distributed failures are read in the
//! log of one rank among many.

use std::fmt;
use std::io;
use std::time::Duration;

/// Result alias used across burn-ddp.
pub type Result<T> = std::result::Result<T, CommError>;

/// What went wrong in the process group, the store or a transport.
#[derive(Debug)]
pub enum CommError {
    /// The launcher environment (or builder input) is invalid.
    Config {
        /// What is wrong and how to fix it.
        message: String,
    },
    /// A wait ran past the group's timeout.
    Timeout {
        /// The rank that gave up waiting.
        rank: usize,
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
    },
    /// The process group was already shut down.
    Destroyed,
}

/// What went wrong with the rendezvous store: decisions (reconnect, fall
/// back to another address) are taken on this, never on a message's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrorKind {
    /// It could not be reached at all (within the timeout).
    Unreachable,
    /// It was reached, then the connection closed or broke.
    ConnectionLost,
    /// It answered with a refusal (wrong token, full, a bad request).
    Refused,
    /// Its answer was not what the protocol allows.
    Protocol,
    /// A store could not be started: the address cannot be listened on.
    Listen,
    /// The store's content is unusable (a counter that is not a number).
    BadValue,
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

    /// A configuration error with a message that already names the setting and the fix.
    pub fn config(message: impl Into<String>) -> Self {
        CommError::Config {
            message: message.into(),
        }
    }

    /// Whether this error is a timeout (of any wait).
    pub fn is_timeout(&self) -> bool {
        matches!(self, CommError::Timeout { .. })
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
            CommError::Config { message } => write!(f, "burn-ddp configuration error: {message}"),
            CommError::Timeout {
                rank, what, after, ..
            } => write!(
                f,
                "rank {rank}: timed out after {:.1}s waiting for {what}; \
                 a peer may have died or never started (raise the timeout with \
                 BURN_DDP_TIMEOUT_SECS if it is only slow)",
                after.as_secs_f64()
            ),
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
            CommError::Device { rank, message } => {
                write!(f, "rank {rank}: GPU collective: {message}")
            }
            CommError::Destroyed => write!(f, "the process group was already destroyed"),
        }
    }
}

impl std::error::Error for CommError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CommError::Peer { source, .. } | CommError::Store { source, .. } => source
                .as_ref()
                .map(|err| err as &(dyn std::error::Error + 'static)),
            _ => None,
        }
    }
}

/// Whether an I/O error is a socket timeout (Unix reports `WouldBlock`, Windows `TimedOut`).
pub(crate) fn io_is_timeout(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
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
        assert!(CommError::config("x").source().is_none());
        assert_eq!(CommError::config("x").store_kind(), None);
    }
}
