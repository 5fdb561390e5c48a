//! Catching SIGINT/SIGTERM sent to the launcher so they can be passed on.

use std::sync::atomic::{AtomicI32, Ordering};

static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn remember(signal: libc::c_int) {
    // Only an atomic store: the one thing a signal handler may safely do here.
    RECEIVED.store(signal, Ordering::SeqCst);
}

/// Installs handlers for SIGINT and SIGTERM that record the signal.
pub fn install() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `remember` is async-signal-safe and lives for the whole program.
        unsafe {
            libc::signal(signal, remember as *const () as libc::sighandler_t);
        }
    }
}

/// The signal received since the last call, if any.
pub fn take() -> Option<i32> {
    match RECEIVED.swap(0, Ordering::SeqCst) {
        0 => None,
        signal => Some(signal),
    }
}

/// Sends `signal` to process `pid`, ignoring a process that is already gone.
pub fn send(pid: u32, signal: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(pid as libc::pid_t, signal);
    }
}

/// A signal's conventional name.
pub fn name(signal: i32) -> String {
    match signal {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGKILL => "SIGKILL".into(),
        libc::SIGSEGV => "SIGSEGV".into(),
        libc::SIGABRT => "SIGABRT".into(),
        libc::SIGBUS => "SIGBUS".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGPIPE => "SIGPIPE".into(),
        other => format!("signal {other}"),
    }
}
