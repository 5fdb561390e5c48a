//! The rounds of a job that restarts (`--max-restarts`): whether a failed
//! round is followed by another. On several machines node 0's launcher
//! decides so and the others follow (`peers`).

use crate::signals;

/// What follows a failed round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Start every worker again.
    Restart,
    /// End the job with this exit code.
    Stop(i32),
}

/// How a round failed, as the decision needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// The launcher's code for the first failure.
    pub code: i32,
    /// Whether every rank joined the round's group.
    pub formed: bool,
    /// Why the group could not stand, when a rank was claimed twice.
    pub duplicate: Option<String>,
    /// The user stopped the job (on some machine).
    pub interrupted: bool,
}

/// The restart policy: restarts are for crashes; what a setting or the
/// program causes would only happen again.
pub(crate) struct Policy {
    max_restarts: u32,
    /// The code of the last round, when it failed before its group formed.
    failed_before_forming: Option<i32>,
}

impl Policy {
    pub fn new(max_restarts: u32) -> Self {
        Self {
            max_restarts,
            failed_before_forming: None,
        }
    }

    /// The verdict after round `round` failed, said on stderr when it ends
    /// the job or when the failure looks like a setting.
    pub fn after(&mut self, round: u32, failure: &Failure) -> Verdict {
        let code = failure.code;
        if failure.interrupted || self.max_restarts == 0 {
            return Verdict::Stop(code);
        }
        if round == self.max_restarts {
            log::error!(
                "no restarts left ({} used): the job failed with the root cause above",
                self.max_restarts
            );
            return Verdict::Stop(code);
        }
        if let Some(why) = &failure.duplicate {
            log::error!(
                "not restarting: {why}; that is a configuration error, which every round \
                 would repeat"
            );
            return Verdict::Stop(code);
        }
        if failure.formed {
            self.failed_before_forming = None;
            return Verdict::Restart;
        }
        if self.failed_before_forming == Some(code) {
            log::error!(
                "not restarting: round {round} failed as round {} did ({}), before its ranks \
                 formed their group, so before any training step: a setting, a missing file \
                 or the program itself, not bad luck; fix it and start the job again",
                round - 1,
                describe_code(code)
            );
            return Verdict::Stop(code);
        }
        log::warn!(
            "round {round} failed ({}) before its ranks formed their group, so before any \
             training step; if the next round fails the same way it is not bad luck and the \
             job ends",
            describe_code(code)
        );
        self.failed_before_forming = Some(code);
        Verdict::Restart
    }
}

/// A launcher's exit code in words.
pub(crate) fn describe_code(code: i32) -> String {
    if code > 128 && code < 128 + 65 {
        format!("killed by {}", signals::name(code - 128))
    } else {
        format!("exit code {code}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(code: i32, formed: bool) -> Failure {
        Failure {
            code,
            formed,
            duplicate: None,
            interrupted: false,
        }
    }

    #[test]
    fn crashes_are_restarted_until_the_restarts_run_out() {
        let mut policy = Policy::new(2);
        assert_eq!(policy.after(0, &failure(137, true)), Verdict::Restart);
        assert_eq!(policy.after(1, &failure(1, true)), Verdict::Restart);
        assert_eq!(policy.after(2, &failure(1, true)), Verdict::Stop(1));
    }

    #[test]
    fn settings_and_interrupts_are_not_restarted() {
        let mut policy = Policy::new(5);
        let mut duplicate = failure(1, true);
        duplicate.duplicate = Some("rank 0 was claimed by two processes".into());
        assert_eq!(policy.after(0, &duplicate), Verdict::Stop(1));
        let mut interrupted = failure(130, true);
        interrupted.interrupted = true;
        assert_eq!(policy.after(0, &interrupted), Verdict::Stop(130));
        // Before forming: once is given the benefit of the doubt, twice alike is not.
        assert_eq!(policy.after(0, &failure(4, false)), Verdict::Restart);
        assert_eq!(policy.after(1, &failure(4, false)), Verdict::Stop(4));
        // Another code, or a round that formed in between, starts the count again.
        let mut policy = Policy::new(5);
        assert_eq!(policy.after(0, &failure(4, false)), Verdict::Restart);
        assert_eq!(policy.after(1, &failure(2, false)), Verdict::Restart);
        assert_eq!(policy.after(2, &failure(1, true)), Verdict::Restart);
        assert_eq!(policy.after(3, &failure(1, false)), Verdict::Restart);
        assert_eq!(policy.after(4, &failure(1, false)), Verdict::Stop(1));
        // Without restarts, every failure stops.
        assert_eq!(Policy::new(0).after(0, &failure(1, true)), Verdict::Stop(1));
    }
}
