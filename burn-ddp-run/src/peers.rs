//! On several machines, how the launchers agree on each round through the
//! rendezvous store.
//!
//! The launcher that sees the first failure of a round reports it under the
//! round's keys; every other launcher watches for that report and stops its
//! own workers, so the whole job ends the round within a poll. Node 0's
//! launcher, which sees the store's keys, then decides (restart or stop) and
//! publishes the decision; the others follow it, and say they have read it,
//! so node 0 does not take the store away first.

use crate::error::LaunchError;
use crate::rounds::Verdict;
use crate::signals;
use burn_ddp_rendezvous::job::keys::JobKeys;
use burn_ddp_rendezvous::job::JobToken;
use burn_ddp_rendezvous::store::{Store, TcpStoreClient};
use std::time::Duration;

/// Bound on one request to the store (it is on node 0).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A machine's report of a round, as the store carries it (JSON): which
/// machine, whether the round was interrupted there (a stop signal) or
/// failed, and what happened. Decisions are taken on `interrupted`, never on
/// the words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RoundReport {
    /// The machine that reported (`None`: the store could not be reached).
    pub machine: Option<usize>,
    /// Interrupted by a stop signal rather than failed.
    pub interrupted: bool,
    /// What happened, in words.
    pub what: String,
}

impl RoundReport {
    fn encode(&self) -> Vec<u8> {
        serde_json::json!({
            "machine": self.machine,
            "kind": if self.interrupted { "interrupted" } else { "failed" },
            "what": self.what,
        })
        .to_string()
        .into_bytes()
    }

    /// A report read from the store; anything else there counts as a
    /// failure described by its bytes.
    fn decode(bytes: &[u8]) -> Self {
        let value: Option<serde_json::Value> = serde_json::from_slice(bytes).ok();
        let field = |name: &str| value.as_ref().and_then(|v| v.get(name).cloned());
        match (field("kind"), field("what")) {
            (Some(serde_json::Value::String(kind)), Some(serde_json::Value::String(what))) => {
                Self {
                    machine: field("machine")
                        .and_then(|m| m.as_u64())
                        .map(|m| m as usize),
                    interrupted: kind == "interrupted",
                    what,
                }
            }
            _ => Self {
                machine: None,
                interrupted: false,
                what: String::from_utf8_lossy(bytes).into_owned(),
            },
        }
    }
}

impl std::fmt::Display for RoundReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.interrupted {
            f.write_str("interrupted ")?;
        }
        match self.machine {
            Some(machine) if self.interrupted => write!(f, "on machine {machine}: {}", self.what),
            Some(machine) => write!(f, "machine {machine}: {}", self.what),
            None => f.write_str(&self.what),
        }
    }
}

/// The other machines' launchers, reached through the store.
pub(crate) struct Peers {
    store: TcpStoreClient,
    node: usize,
    nnodes: usize,
    job_id: String,
    /// How long to wait for node 0's decision: its workers may take the
    /// shutdown timeout to stop.
    decision_wait: Duration,
}

impl Peers {
    /// Connects to the store at `host:port` as machine `node` of `nnodes`.
    pub fn connect(
        host: &str,
        port: u16,
        token: Option<&JobToken>,
        node: usize,
        nnodes: usize,
        job_id: &str,
        shutdown_timeout: Duration,
    ) -> Result<Self, LaunchError> {
        let store =
            TcpStoreClient::connect_with_token(host, port, None, Duration::from_secs(300), token)
                .map_err(LaunchError::ReachPeers)?
                // Polled while the workers run (every 200 ms, every 20 ms in a
                // failure's grace): a request must not hang on a machine that
                // went away.
                .with_request_timeout(REQUEST_TIMEOUT);
        Ok(Self {
            store,
            node,
            nnodes,
            job_id: job_id.to_string(),
            decision_wait: shutdown_timeout + Duration::from_secs(60),
        })
    }

    fn keys(&self, round: u32) -> JobKeys {
        JobKeys::new(&self.job_id, round as usize)
    }

    /// Tells the other machines that round `round` failed here (`what`), or
    /// was interrupted here; the first report of a round stands.
    pub fn report(&self, round: u32, what: &str, interrupted: bool) {
        let key = self.keys(round).launcher_failed();
        let report = RoundReport {
            machine: Some(self.node),
            interrupted,
            what: what.to_string(),
        };
        if !matches!(self.store.check(&[&key]), Ok(true)) {
            if let Err(err) = self.store.set(&key, &report.encode()) {
                log::warn!("cannot tell the other machines that round {round} failed: {err}");
            }
        }
    }

    /// Another machine's report of round `round`, once there is one; a store
    /// that cannot be reached (node 0's machine is gone) counts as one.
    pub fn failure(&self, round: u32) -> Option<RoundReport> {
        let key = self.keys(round).launcher_failed();
        match self.store.check(&[&key]) {
            Ok(true) => self
                .store
                .get(&key, REQUEST_TIMEOUT)
                .ok()
                .map(|bytes| RoundReport::decode(&bytes)),
            Ok(false) => None,
            Err(err) => Some(RoundReport {
                machine: None,
                interrupted: false,
                what: format!("the store on node 0 cannot be reached ({err})"),
            }),
        }
    }

    /// Whether round `round` was interrupted by the user somewhere.
    pub fn interrupted(&self, round: u32) -> bool {
        self.failure(round).is_some_and(|report| report.interrupted)
    }

    /// Node 0: publishes the verdict on round `round`, then waits (a few
    /// seconds) until every other machine has read it.
    pub fn publish(&self, round: u32, verdict: &Verdict) {
        let keys = self.keys(round);
        let text = match verdict {
            Verdict::Restart => "restart".to_string(),
            Verdict::Stop(code) => format!("stop {code}"),
        };
        if let Err(err) = self.store.set(&keys.launcher_verdict(), text.as_bytes()) {
            log::warn!("cannot tell the other machines what follows round {round}: {err}");
            return;
        }
        let seen: Vec<String> = (1..self.nnodes).map(|n| keys.launcher_seen(n)).collect();
        let seen: Vec<&str> = seen.iter().map(String::as_str).collect();
        // As long as a machine may take to stop its workers and look.
        if self.store.wait(&seen, self.decision_wait).is_err() {
            log::warn!(
                "not every machine read the verdict on round {round} within {:?}",
                self.decision_wait
            );
        }
    }

    /// Another node: waits for node 0's verdict on round `round` (a Ctrl-C
    /// meanwhile ends the wait: `Stop(130)`).
    pub fn verdict(&self, round: u32) -> Result<Verdict, LaunchError> {
        let keys = self.keys(round);
        let deadline = std::time::Instant::now() + self.decision_wait;
        let key = keys.launcher_verdict();
        loop {
            if let Some(signal) = signals::take() {
                return Ok(Verdict::Stop(128 + signal));
            }
            match self.store.check(&[&key]) {
                Ok(true) => break,
                Ok(false) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Ok(false) => {
                    return Err(LaunchError::NoVerdict {
                        round,
                        waited: self.decision_wait,
                    })
                }
                Err(source) => return Err(LaunchError::StoreGone { round, source }),
            }
        }
        let text = self
            .store
            .get(&key, REQUEST_TIMEOUT)
            .map_err(|source| LaunchError::VerdictUnread { round, source })?;
        let _ = self.store.set(&keys.launcher_seen(self.node), b"1");
        let text = String::from_utf8_lossy(&text);
        match text.strip_prefix("stop ") {
            Some(code) => Ok(Verdict::Stop(code.trim().parse().unwrap_or(1))),
            None if text == "restart" => Ok(Verdict::Restart),
            None => Err(LaunchError::VerdictGarbled {
                round,
                text: text.into_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_reports_travel_as_data_and_read_as_before() {
        let interrupted = RoundReport {
            machine: Some(1),
            interrupted: true,
            what: "the launcher got a stop signal".into(),
        };
        let back = RoundReport::decode(&interrupted.encode());
        assert_eq!(back, interrupted);
        assert_eq!(
            back.to_string(),
            "interrupted on machine 1: the launcher got a stop signal"
        );
        // The words do not decide: a failure whose text says "interrupted" is one.
        let failed = RoundReport {
            machine: Some(0),
            interrupted: false,
            what: "interrupted by rank 3 exit code 1".into(),
        };
        let back = RoundReport::decode(&failed.encode());
        assert!(!back.interrupted);
        assert_eq!(
            back.to_string(),
            "machine 0: interrupted by rank 3 exit code 1"
        );
        // Something else in the key (an older launcher) is a failure, in its words.
        let other = RoundReport::decode(b"interrupted on machine 2: x");
        assert!(!other.interrupted && other.what == "interrupted on machine 2: x");
    }
}
