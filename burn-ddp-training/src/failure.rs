//! A failure where no `Result` fits. Burn's `backward()` cannot return an
//! error, nor can an autodiff op's backward pass or an optimizer's step, so
//! a communication failure there (a peer died, a link was cut, the models
//! differ) ends the rank's work as a panic. Rust's own panic report would
//! say where in burn-ddp the panic was raised ("thread 'main' panicked at
//! ...") and, under `RUST_BACKTRACE=1`, print burn-ddp's and Burn's stack:
//! noise around the one thing a user needs, which rank failed and why. So
//! the message is printed as one line, and the thread unwinds without the
//! panic hook.

/// Prints `message` on stderr as one line (the error should name the rank
/// and the cause), then unwinds the calling thread with it as the panic's
/// payload, a `String` as `panic!`'s: a program that does not catch it
/// exits with code 101, one that does (`catch_unwind`, a thread's `join`)
/// reads the message as from any panic. The panic hook is not run, so
/// neither Rust's report nor a backtrace is printed.
pub fn panic_with_message(message: impl Into<String>) -> ! {
    let message: String = message.into();
    eprintln!("{}", one_line(&message));
    std::panic::resume_unwind(Box::new(message))
}

/// `message` on one line: line breaks (an error's cause on its own line)
/// become spaces.
fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Set in the child process the test below starts.
    const CHILD_VAR: &str = "BURN_DDP_TRAINING_PANIC_CHILD";

    #[test]
    fn the_payload_is_the_message() {
        let caught =
            std::panic::catch_unwind(|| panic_with_message("rank 3: cut off")).unwrap_err();
        assert_eq!(caught.downcast_ref::<String>().unwrap(), "rank 3: cut off");
        assert_eq!(one_line("a\n  caused by: b\n"), "a caused by: b");
    }

    /// What the child prints: one line, no "panicked at", no backtrace,
    /// although RUST_BACKTRACE=1.
    #[test]
    fn one_line_and_no_backtrace() {
        if std::env::var_os(CHILD_VAR).is_some() {
            panic_with_message("rank 2: gradient synchronisation failed:\ntimed out after 10.0s");
        }
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "failure::tests::one_line_and_no_backtrace"])
            .args(["--nocapture", "--test-threads", "1"])
            .env(CHILD_VAR, "1")
            .env("RUST_BACKTRACE", "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "the child test should fail");
        assert_eq!(
            stderr.lines().collect::<Vec<_>>(),
            ["rank 2: gradient synchronisation failed: timed out after 10.0s"],
            "{stderr}"
        );
    }
}
