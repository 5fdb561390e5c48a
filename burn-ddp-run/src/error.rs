//! What can stop the launcher (and `cargo ddp`) itself, as opposed to a
//! worker failing: a bad setting, a store that cannot be hosted or reached,
//! a worker that cannot be started, node 0 not saying what follows a round,
//! a build that gives no program.
//!
//! Every message reads as it always did (the tests and users match them);
//! the settings, ranks and rounds are fields too, and the underlying error,
//! where there is one, is the [`source`](std::error::Error::source).

use burn_ddp_rendezvous::job::JOB_ID_VAR;
use burn_ddp_rendezvous::RendezvousError;
use std::fmt;
use std::io;
use std::time::Duration;

/// Why a launch (or a `cargo ddp` build) ended before or instead of its
/// workers' verdict; `burn_ddp_run::launch` logs it and exits with 1.
#[derive(Debug)]
#[non_exhaustive]
pub enum LaunchError {
    /// `BURN_DDP_JOB_TOKEN` is not a usable token (the setting's error).
    Token(RendezvousError),
    /// No random job token could be made for a single-machine job.
    MakeToken(io::Error),
    /// `BURN_DDP_JOB_ID` cannot be part of a store key.
    JobId {
        /// The id as given.
        id: String,
    },
    /// No random job id could be made for a single-machine job.
    MakeJobId(io::Error),
    /// Node 0 could not start the rendezvous store (a port in use, say).
    HostStore(RendezvousError),
    /// Another machine cannot reach node 0's store to agree on restarts.
    ReachPeers(RendezvousError),
    /// A worker could not be started.
    Spawn {
        /// The program, as given.
        program: String,
        /// The rank it was to run.
        rank: usize,
        /// Why the operating system refused.
        source: io::Error,
    },
    /// A worker's `--log-dir` file could not be opened.
    LogFile {
        /// The rank whose log it is.
        rank: usize,
        /// Why it could not be opened.
        source: io::Error,
    },
    /// Node 0 starts a round past this machine's `--max-restarts`.
    RestartsDiffer {
        /// The round node 0 starts.
        round: u32,
        /// This machine's `--max-restarts`.
        max_restarts: u32,
    },
    /// Node 0 said nothing on what follows a round within the wait.
    NoVerdict {
        /// The failed round.
        round: u32,
        /// How long this machine waited.
        waited: Duration,
    },
    /// Node 0's store went away before saying what follows a round.
    StoreGone {
        /// The failed round.
        round: u32,
        /// The store's error.
        source: RendezvousError,
    },
    /// The machines could not agree through node 0's store which of them
    /// start the job (`--on-failure continue` on several machines).
    Membership(RendezvousError),
    /// `--nnodes MIN:MAX`: fewer than MIN machines came within the wait.
    TooFewMachines {
        /// Machines there.
        present: usize,
        /// `MIN`.
        min: usize,
        /// How long node 0 waited.
        waited: Duration,
    },
    /// Node 0's verdict on a round was there but could not be read.
    VerdictUnread {
        /// The failed round.
        round: u32,
        /// The store's error.
        source: RendezvousError,
    },
    /// Node 0's verdict on a round is neither `restart` nor `stop CODE`.
    VerdictGarbled {
        /// The failed round.
        round: u32,
        /// What the store held.
        text: String,
    },
    /// `cargo ddp`: cargo itself could not be run.
    Cargo {
        /// The cargo program (`$CARGO`, else `cargo`).
        cargo: String,
        /// Why it could not be run.
        source: io::Error,
    },
    /// `cargo ddp`: `cargo build --release` failed (its errors are above).
    BuildFailed,
    /// `cargo ddp`: the build gave no executable of the target named.
    NoSuchTarget {
        /// `bin` or `example`.
        kind: String,
        /// The name asked for.
        name: String,
    },
    /// `cargo ddp`: no target was named and the build gave no binary.
    NoBinary,
    /// `cargo ddp`: no target was named and the build gave several binaries.
    SeveralBinaries {
        /// Their file names.
        names: Vec<String>,
    },
}

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // The setting's own message (it names the variable and the fix),
            // without the library's "configuration error" heading.
            Self::Token(RendezvousError::Config { message, .. }) => f.write_str(message),
            Self::Token(err) => write!(f, "{err}"),
            Self::MakeToken(err) => write!(f, "cannot make a job token: {err}"),
            Self::JobId { id } => write!(
                f,
                "{JOB_ID_VAR}={id:?} must be 1 to 64 characters of letters, digits, \
                 '.', '_' and '-'"
            ),
            Self::MakeJobId(err) => write!(f, "cannot make a job id: {err}"),
            Self::HostStore(err) => write!(
                f,
                "{err} (use --master-port to pick another port, or --standalone for a free one)"
            ),
            Self::ReachPeers(err) => {
                write!(f, "cannot reach the store to agree on restarts: {err}")
            }
            Self::Membership(err) => write!(
                f,
                "cannot agree with node 0 through its store which machines start the job: {err}"
            ),
            Self::TooFewMachines {
                present,
                min,
                waited,
            } => write!(
                f,
                "only {present} machine(s) came within {:.0}s (BURN_DDP_TIMEOUT_SECS), and \
                 --nnodes asks for at least {min}: start the others' launchers (same \
                 --master-addr, --master-port and job token), or lower MIN",
                waited.as_secs_f64()
            ),
            Self::Spawn {
                program,
                rank,
                source,
            } => write!(f, "cannot start {program:?} for rank {rank}: {source}"),
            Self::LogFile { rank, source } => {
                write!(f, "cannot open the log for rank {rank}: {source}")
            }
            Self::RestartsDiffer {
                round,
                max_restarts,
            } => write!(
                f,
                "node 0 starts round {round} but this machine's --max-restarts is \
                 {max_restarts}; give every machine's launcher the same --max-restarts"
            ),
            Self::NoVerdict { round, waited } => write!(
                f,
                "no word from node 0 on what follows round {round} within {waited:?}; \
                 ending this machine's part of the job"
            ),
            Self::StoreGone { round, source } => write!(
                f,
                "node 0's store went away before saying what follows round {round} \
                 ({source}); ending this machine's part of the job"
            ),
            Self::VerdictUnread { round, source } => {
                write!(f, "cannot read node 0's verdict on round {round}: {source}")
            }
            Self::VerdictGarbled { round, text } => {
                write!(
                    f,
                    "node 0's verdict on round {round} is unreadable: {text:?}"
                )
            }
            Self::Cargo { cargo, source } => write!(f, "cannot run {cargo}: {source}"),
            Self::BuildFailed => f.write_str("cargo build --release failed (see above)"),
            Self::NoSuchTarget { kind, name } => {
                write!(f, "cargo built no {kind} named {name:?}")
            }
            Self::NoBinary => {
                f.write_str("cargo built no binary; name one with --bin or --example")
            }
            Self::SeveralBinaries { names } => write!(
                f,
                "cargo built several binaries ({}); pick one with --bin NAME or --example NAME",
                names.join(", ")
            ),
        }
    }
}

impl std::error::Error for LaunchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Token(err)
            | Self::HostStore(err)
            | Self::ReachPeers(err)
            | Self::Membership(err)
            | Self::StoreGone { source: err, .. }
            | Self::VerdictUnread { source: err, .. } => Some(err),
            Self::MakeToken(err)
            | Self::MakeJobId(err)
            | Self::Spawn { source: err, .. }
            | Self::LogFile { source: err, .. }
            | Self::Cargo { source: err, .. } => Some(err),
            Self::JobId { .. }
            | Self::TooFewMachines { .. }
            | Self::RestartsDiffer { .. }
            | Self::NoVerdict { .. }
            | Self::VerdictGarbled { .. }
            | Self::BuildFailed
            | Self::NoSuchTarget { .. }
            | Self::NoBinary
            | Self::SeveralBinaries { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_ddp_rendezvous::job::{JobToken, JOB_TOKEN_VAR};
    use std::error::Error;

    #[test]
    fn messages_read_as_before_and_keep_their_cause() {
        // A bad token reads as the setting's message alone.
        let token = LaunchError::Token(JobToken::new("has space").unwrap_err());
        assert!(
            token.to_string().starts_with(JOB_TOKEN_VAR) && token.source().is_some(),
            "{token}"
        );
        let spawn = LaunchError::Spawn {
            program: "./train".into(),
            rank: 3,
            source: io::Error::from(io::ErrorKind::NotFound),
        };
        assert!(spawn
            .to_string()
            .starts_with("cannot start \"./train\" for rank 3: "));
        let cause = spawn.source().unwrap().downcast_ref::<io::Error>().unwrap();
        assert_eq!(cause.kind(), io::ErrorKind::NotFound);
        let differ = LaunchError::RestartsDiffer {
            round: 3,
            max_restarts: 2,
        };
        assert_eq!(
            differ.to_string(),
            "node 0 starts round 3 but this machine's --max-restarts is 2; give every \
             machine's launcher the same --max-restarts"
        );
        assert!(differ.source().is_none());
        let several = LaunchError::SeveralBinaries {
            names: vec!["a".into(), "b".into()],
        };
        assert_eq!(
            several.to_string(),
            "cargo built several binaries (a, b); pick one with --bin NAME or --example NAME"
        );
    }
}
