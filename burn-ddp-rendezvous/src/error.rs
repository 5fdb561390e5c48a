//! What can go wrong before and around the rendezvous: a launcher variable
//! that is missing or wrong, a store that cannot be reached or answers an
//! error, a wait on the store that runs out.
//!
//! Every message says which rank saw the problem and, where we know it, what
//! to do about it; the rank, the setting and the kind are fields too, so
//! callers (the launcher, the process group) decide on them, never on text.

use std::fmt;
use std::io;
use std::time::Duration;

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, RendezvousError>;

/// What went wrong reading the launcher's environment or talking to the store.
#[derive(Debug)]
#[non_exhaustive]
pub enum RendezvousError {
    /// A launcher variable (or builder input) is missing or invalid.
    Config {
        /// The rank that read it, once known.
        rank: Option<usize>,
        /// The variable or setting at fault (`"MASTER_PORT"`, `"RANK"`).
        setting: String,
        /// What is wrong and how to fix it (names the setting too).
        message: String,
    },
    /// A wait on the store ran past its timeout.
    Timeout {
        /// The rank that gave up waiting (`None` for the launcher).
        rank: Option<usize>,
        /// What it was waiting for.
        what: String,
        /// How long it waited.
        after: Duration,
    },
    /// The store could not be reached or answered an error.
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
}

/// What went wrong with the rendezvous store: decisions (reconnect, fall
/// back to another address) are taken on this, never on a message's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
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

impl RendezvousError {
    /// A store error without an underlying socket error.
    pub fn store(rank: Option<usize>, kind: StoreErrorKind, message: impl Into<String>) -> Self {
        Self::Store {
            rank,
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// A setting at fault: `message` names it and the fix.
    pub fn config(
        rank: Option<usize>,
        setting: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self::Config {
            rank,
            setting: setting.into(),
            message: message.into(),
        }
    }

    /// The same error, caused by `source` (a store error; any other kind is
    /// returned as it is).
    pub fn caused_by(mut self, cause: io::Error) -> Self {
        if let Self::Store { source, .. } = &mut self {
            *source = Some(cause);
        }
        self
    }

    /// The kind of a store error.
    pub fn store_kind(&self) -> Option<StoreErrorKind> {
        match self {
            Self::Store { kind, .. } => Some(*kind),
            _ => None,
        }
    }

    /// Whether this error is a wait that ran out.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Self::Timeout { .. })
    }
}

impl fmt::Display for RendezvousError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config { message, .. } => write!(f, "burn-ddp configuration error: {message}"),
            Self::Timeout { rank, what, after } => {
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
            Self::Store { rank, message, .. } => match rank {
                Some(rank) => write!(f, "rank {rank}: rendezvous store: {message}"),
                None => write!(f, "rendezvous store: {message}"),
            },
        }
    }
}

impl std::error::Error for RendezvousError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Store { source, .. } => source
                .as_ref()
                .map(|err| err as &(dyn std::error::Error + 'static)),
            _ => None,
        }
    }
}

/// Whether an I/O error is a socket timeout (Unix reports `WouldBlock`, Windows `TimedOut`).
pub fn io_is_timeout(err: &io::Error) -> bool {
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
    fn sources_kinds_and_fields_are_kept() {
        let lost = RendezvousError::store(Some(2), StoreErrorKind::ConnectionLost, "went away")
            .caused_by(io::Error::from(io::ErrorKind::ConnectionReset));
        assert_eq!(lost.to_string(), "rank 2: rendezvous store: went away");
        assert_eq!(lost.store_kind(), Some(StoreErrorKind::ConnectionLost));
        let source = lost.source().unwrap().downcast_ref::<io::Error>().unwrap();
        assert_eq!(source.kind(), io::ErrorKind::ConnectionReset);
        let bad = RendezvousError::config(Some(1), "MASTER_PORT", "MASTER_PORT=\"x\" ...");
        assert!(matches!(
            &bad,
            RendezvousError::Config { rank: Some(1), setting, .. } if setting == "MASTER_PORT"
        ));
        assert!(bad.source().is_none() && bad.store_kind().is_none());
        let late = RendezvousError::Timeout {
            rank: None,
            what: "keys".into(),
            after: Duration::from_secs(2),
        };
        assert!(late.is_timeout());
        assert!(
            late.to_string().starts_with("timed out after 2.0s"),
            "{late}"
        );
    }
}
