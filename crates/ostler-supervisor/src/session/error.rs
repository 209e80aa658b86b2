//! Errors of the session process and of the control requests we send.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

/// Errors of the session process.
#[derive(Debug, Error)]
pub enum Error {
    #[error("cannot start {}: {source}", .path.display())]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Claude Code {version} cannot run sessions: {message}")]
    Incompatible {
        version: semver::Version,
        message: String,
    },
    #[error("{flag} is not supported by Claude Code {version}")]
    Unsupported {
        flag: &'static str,
        version: semver::Version,
    },
    #[error(
        "Claude Code {version} refuses {which} when it runs as root (the daemon's user) \
         outside a sandbox: set IS_SANDBOX=1 in the session's env (`ostler run --env \
         IS_SANDBOX=1`, or `[sessions.env]` in the daemon's configuration) if the daemon \
         runs in a container or VM, or run the daemon as another user"
    )]
    RootBypass {
        which: &'static str,
        version: semver::Version,
    },
    #[error("invalid spawn options: {0}")]
    InvalidOptions(String),
    #[error("the session process has exited")]
    ProcessGone,
    #[error("writing to the CLI's stdin failed: {0}")]
    Stdin(String),
    #[error("control request {0} is not pending (answered, cancelled, or the process is gone)")]
    NotPending(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Failure of a control request we sent.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum ControlError {
    /// `subtype: error` with `error_code: unsupported_request` (or the equivalent text).
    #[error("unsupported control request: {message}")]
    Unsupported { message: String },
    /// `subtype: error`.
    #[error("control request failed: {message}")]
    Failed {
        message: String,
        code: Option<String>,
    },
    #[error("no control response within {0:?}")]
    Timeout(Duration),
    #[error("the session process is gone")]
    ProcessGone,
}
