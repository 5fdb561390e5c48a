//! Commands and statuses of the store's wire protocol (one frame each way).

/// Set a key.
pub const SET: u8 = 1;
/// Get a key, waiting up to a timeout.
pub const GET: u8 = 2;
/// Add to an integer key.
pub const ADD: u8 = 3;
/// Wait for several keys.
pub const WAIT: u8 = 4;
/// Check several keys without waiting.
pub const CHECK: u8 = 5;
/// A client's first frame: the job token it presents (empty for none) and its
/// rank (-1 for none). A store with a token serves nothing before it.
pub const HELLO: u8 = 6;

/// The command succeeded; fields follow as the command defines.
pub const OK: u8 = 0;
/// The wait ran out of time.
pub const TIMED_OUT: u8 = 1;
/// The server refused the request; a message follows.
pub const ERROR: u8 = 2;
