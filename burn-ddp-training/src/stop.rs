//! Ctrl-C and SIGTERM as a stop every rank agrees on.
//!
//! By default SIGINT ends a worker wherever it is: mid-step, with no checkpoint
//! written, metric files cut short and a terminal UI left in the alternate
//! screen. A training loop that calls [`catch_stop_signals`] records the signal
//! instead and asks [`stop_requested`] once per step (one 8-byte all-reduce),
//! so every rank stops after the same step, and the program ends the way it
//! would at the end of training (its checkpointer finishes, its files close).
//!
//! The terminal's Ctrl-C reaches the launcher and every worker at once, and
//! the launcher passes it on as well, so a worker sees it twice within
//! milliseconds: that counts as one. A second signal at least
//! [`FORCE_AFTER`] after the first ends the process at once with exit status
//! 128 + the signal, what a shell shows for a program the signal ended (the
//! launcher's second Ctrl-C kills the workers itself).

use burn_ddp_comm::ProcessGroup;
use burn_ddp_comm::ReduceOp;
use burn_ddp_comm::Result;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;
use std::time::Duration;

/// How long after the first signal another one means "stop now" (as for
/// burn-ddp-run: one rule for the launcher and its workers).
pub const FORCE_AFTER: Duration = burn_ddp_comm::FORCE_STOP_AFTER;

/// The first stop signal received and when, in one word so a handler never
/// sees one without the other: `ms_of_monotonic_clock << 8 | signal` (0: none).
static RECEIVED: AtomicU64 = AtomicU64::new(0);
static INSTALL: Once = Once::new();

fn monotonic_ms() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime only writes the struct; it is async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    // Casts: time_t and c_long are 32 bits on some targets.
    #[allow(clippy::unnecessary_cast)]
    let ms = now.tv_sec as u64 * 1000 + now.tv_nsec as u64 / 1_000_000;
    ms
}

extern "C" fn record(signal: libc::c_int) {
    // Only atomics, the clock and _exit: what a signal handler may do.
    let now = monotonic_ms();
    let word = (now << 8) | (signal as u64 & 0xff);
    if let Err(first) = RECEIVED.compare_exchange(0, word, Ordering::SeqCst, Ordering::SeqCst) {
        if now.saturating_sub(first >> 8) >= FORCE_AFTER.as_millis() as u64 {
            // SAFETY: _exit is async-signal-safe and ends the process.
            unsafe { libc::_exit(128 + signal) };
        }
    }
}

/// From now on SIGINT and SIGTERM are recorded instead of ending the process
/// (see the module documentation); idempotent. Interrupted system calls are
/// restarted, so collectives under way are not disturbed.
pub fn catch_stop_signals() {
    INSTALL.call_once(|| {
        for signal in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: `record` is async-signal-safe and lives for the whole
            // program; the sigaction struct is fully initialised.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = record as *const () as libc::sighandler_t;
                action.sa_flags = libc::SA_RESTART;
                // Neither signal interrupts the handler of the other.
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaddset(&mut action.sa_mask, libc::SIGINT);
                libc::sigaddset(&mut action.sa_mask, libc::SIGTERM);
                libc::sigaction(signal, &action, std::ptr::null_mut());
            }
        }
    });
}

/// The stop signal this process received, if any (`libc::SIGINT`, ...).
pub fn stop_signal() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        word => Some((word & 0xff) as i32),
    }
}

/// Whether any rank of `group` received a stop signal, and which (the
/// highest-numbered when ranks differ). A collective: every rank calls it at
/// the same point of every step, so all of them stop after the same one.
pub fn stop_requested(group: &ProcessGroup) -> Result<Option<i32>> {
    let mut signal = [i64::from(stop_signal().unwrap_or(0))];
    group.all_reduce(&mut signal, ReduceOp::Max)?;
    Ok(match signal[0] {
        0 => None,
        signal => Some(signal as i32),
    })
}

/// A signal's name, for messages.
pub fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        other => format!("signal {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_signal_is_recorded_and_agreed_on() {
        let group = ProcessGroup::builder(0, 1).build().unwrap();
        assert_eq!(stop_requested(&group).unwrap(), None);
        catch_stop_signals();
        // SAFETY: raising a signal whose handler was just installed.
        unsafe { libc::raise(libc::SIGTERM) };
        assert_eq!(stop_signal(), Some(libc::SIGTERM));
        // A repeat right away (the terminal's and the launcher's copies) is
        // the same stop, not a forced end.
        unsafe { libc::raise(libc::SIGINT) };
        assert_eq!(stop_requested(&group).unwrap(), Some(libc::SIGTERM));
        assert_eq!(signal_name(libc::SIGINT), "SIGINT");
    }
}
