//! The engine's typed errors. Each variant maps onto exactly one gRPC status code (see
//! [`Error::code_kind`]), so ostler-server's single `From<Error> for Status` is a `match`
//! on [`CodeKind`].

/// `Result` with the engine's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The status class of an [`Error`], named after the gRPC code it maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CodeKind {
    /// `NOT_FOUND`
    NotFound,
    /// `ALREADY_EXISTS`
    AlreadyExists,
    /// `FAILED_PRECONDITION`
    FailedPrecondition,
    /// `INVALID_ARGUMENT`
    InvalidArgument,
    /// `RESOURCE_EXHAUSTED`
    ResourceExhausted,
    /// `OUT_OF_RANGE`
    OutOfRange,
    /// `UNAVAILABLE`
    Unavailable,
    /// `INTERNAL`
    Internal,
}

/// Everything an engine call can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A session, permission request or question that does not exist.
    #[error("{what} not found")]
    NotFound {
        /// e.g. `session "0193..."`, `permission request "req_1" in session "..."`.
        what: String,
    },

    /// Something with this identity already exists.
    #[error("{what} already exists")]
    AlreadyExists {
        /// What was to be created.
        what: String,
    },

    /// The call is valid but the target is in the wrong state (e.g. sending to a stopped
    /// session, answering an interaction that is already decided).
    #[error("{message}")]
    FailedPrecondition {
        /// A human-readable explanation.
        message: String,
        /// For interactions decided by someone else: who decided (client id or
        /// `rule:<rule text>`).
        decided_by: Option<String>,
    },

    /// A bad argument (cwd missing or outside the allowed roots, bad answers, ...).
    /// Shown `field: message` (as the server's own checks say it; the status code already
    /// says "invalid argument").
    #[error("{}", field_message(.field, .message))]
    InvalidArgument {
        /// The offending argument's name, e.g. `cwd`, `answers[0]`.
        field: String,
        /// What is wrong with it.
        message: String,
    },

    /// A configured limit is reached (e.g. max live sessions).
    #[error("{message}")]
    ResourceExhausted {
        /// A human-readable explanation naming the limit.
        message: String,
    },

    /// A position the daemon can no longer serve completely: a feed cursor before entries
    /// that were pruned since (`WatchSessions`).
    #[error("{message}")]
    OutOfRange {
        /// What is gone and where to start again.
        message: String,
        /// The feed cursor to watch again from, when the position is a feed cursor:
        /// the edge gives it to clients as a structured detail (`google.rpc.ErrorInfo`).
        resume_from: Option<u64>,
    },

    /// The engine or the session's process is not available right now (shutting down, the
    /// CLI process went away mid-call, ...). Retrying later may work.
    #[error("unavailable: {0}")]
    Unavailable(String),

    /// A bug or an unexpected failure below the engine (store I/O, ...).
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// Which gRPC code this error maps to.
    pub fn code_kind(&self) -> CodeKind {
        match self {
            Error::NotFound { .. } => CodeKind::NotFound,
            Error::AlreadyExists { .. } => CodeKind::AlreadyExists,
            Error::FailedPrecondition { .. } => CodeKind::FailedPrecondition,
            Error::InvalidArgument { .. } => CodeKind::InvalidArgument,
            Error::ResourceExhausted { .. } => CodeKind::ResourceExhausted,
            Error::OutOfRange { .. } => CodeKind::OutOfRange,
            Error::Unavailable(_) => CodeKind::Unavailable,
            Error::Internal(_) => CodeKind::Internal,
        }
    }

    pub(crate) fn not_found(what: impl Into<String>) -> Self {
        Error::NotFound { what: what.into() }
    }

    pub(crate) fn session_not_found(id: &str) -> Self {
        Error::not_found(format!("session {id:?}"))
    }

    pub(crate) fn precondition(message: impl Into<String>) -> Self {
        Error::FailedPrecondition {
            message: message.into(),
            decided_by: None,
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field: field.into(),
            message: message.into(),
        }
    }

    pub(crate) fn internal(message: impl std::fmt::Display) -> Self {
        Error::Internal(message.to_string())
    }
}

impl From<ostler_store::Error> for Error {
    fn from(e: ostler_store::Error) -> Self {
        use ostler_store::Error as S;
        match e {
            S::NotFound { what } => Error::NotFound { what },
            S::AlreadyExists { what } => Error::AlreadyExists { what },
            S::InvalidArgument(message) => Error::InvalidArgument {
                field: String::new(),
                message,
            },
            S::SessionFull { .. } => Error::ResourceExhausted {
                message: e.to_string(),
            },
            S::Closed => Error::Unavailable("the store is closed".into()),
            S::Unwritable { reason, .. } => {
                Error::Unavailable(format!("store not writable: {reason}"))
            }
            other => Error::Internal(format!("store: {other}")),
        }
    }
}

impl From<ostler_supervisor::Error> for Error {
    fn from(e: ostler_supervisor::Error) -> Self {
        use ostler_supervisor::Error as S;
        match e {
            S::Incompatible { .. } | S::Unsupported { .. } | S::RootBypass { .. } => {
                Error::precondition(e.to_string())
            }
            S::InvalidOptions(m) => Error::invalid("options", m),
            // The kernel or std refused the arguments themselves (E2BIG, a NUL byte):
            // retrying cannot help.
            S::Spawn { ref source, .. }
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::ArgumentListTooLong | std::io::ErrorKind::InvalidInput
                ) =>
            {
                Error::invalid("options", e.to_string())
            }
            // The binary is gone or cannot be run (removed by an upgrade, permissions, not
            // an executable): every retry fails the same way until the installation is
            // mended.
            S::Spawn { ref source, .. }
                if matches!(
                    source.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
                ) || source.raw_os_error() == Some(libc_enoexec()) =>
            {
                Error::precondition(format!(
                    "{e}; the Claude Code installation the daemon started with cannot be run \
                     any more: mend it (`ostler doctor`) or restart the daemon"
                ))
            }
            S::ProcessGone | S::Stdin(_) | S::Spawn { .. } => Error::Unavailable(e.to_string()),
            S::NotPending(m) => Error::precondition(format!("not pending: {m}")),
        }
    }
}

/// `field: message`, or the message alone when no field is named.
fn field_message(field: &str, message: &str) -> String {
    if field.is_empty() {
        message.to_owned()
    } else {
        format!("{field}: {message}")
    }
}

/// `ENOEXEC` (a file the kernel cannot execute), 8 on Linux.
const fn libc_enoexec() -> i32 {
    8
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A binary that is gone or cannot be run fails the same way at every retry: not
    /// UNAVAILABLE; a spawn refused for want of resources is.
    #[test]
    fn a_binary_that_cannot_run_is_a_precondition() {
        let spawn = |source: std::io::Error| ostler_supervisor::Error::Spawn {
            path: "/opt/claude".into(),
            source,
        };
        for source in [
            std::io::Error::from(std::io::ErrorKind::NotFound),
            std::io::Error::from(std::io::ErrorKind::PermissionDenied),
            std::io::Error::from_raw_os_error(8),
        ] {
            let e = Error::from(spawn(source));
            assert!(matches!(e, Error::FailedPrecondition { .. }), "{e:?}");
            assert!(e.to_string().contains("/opt/claude"), "{e}");
        }
        let e = Error::from(spawn(std::io::Error::from_raw_os_error(11)));
        assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
    }

    /// A session at its greatest seq is a limit reached (not a retry-later, not internal),
    /// and the message says what to do.
    #[test]
    fn a_full_session_is_resource_exhausted() {
        let e = Error::from(ostler_store::Error::SessionFull { max: 7 });
        assert_eq!(e.code_kind(), CodeKind::ResourceExhausted);
        assert!(e.to_string().contains("start a new session"), "{e}");
        let closed = Error::from(ostler_store::Error::Closed);
        assert_eq!(closed.code_kind(), CodeKind::Unavailable);
    }
}
