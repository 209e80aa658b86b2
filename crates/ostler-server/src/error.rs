//! The one mapping from engine errors to gRPC statuses, at the edge.
//!
//! `impl From<ostler_engine::Error> for tonic::Status` cannot be written here (both types
//! are foreign), so the edge type is [`ApiError`]: handlers use `?` on engine results
//! (`From<ostler_engine::Error> for ApiError`) and tonic gets a `Status` through
//! `From<ApiError> for Status`. The message is the engine's, written for a person.

use ostler_engine::{CodeKind, Error};
use tonic::{Code, Status};

/// An engine error on its way to the client.
#[derive(Debug)]
pub struct ApiError(pub Status);

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        ApiError(status_of(&e))
    }
}

impl From<Status> for ApiError {
    fn from(s: Status) -> Self {
        ApiError(s)
    }
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Self {
        e.0
    }
}

/// The status for an engine error.
pub fn status_of(e: &Error) -> Status {
    let code = match e.code_kind() {
        CodeKind::NotFound => Code::NotFound,
        CodeKind::AlreadyExists => Code::AlreadyExists,
        CodeKind::FailedPrecondition => Code::FailedPrecondition,
        CodeKind::InvalidArgument => Code::InvalidArgument,
        CodeKind::ResourceExhausted => Code::ResourceExhausted,
        CodeKind::Unavailable => Code::Unavailable,
        CodeKind::Internal => Code::Internal,
    };
    let mut message = e.to_string();
    if let Error::FailedPrecondition {
        decided_by: Some(by),
        ..
    } = e
        && !message.contains(by.as_str())
    {
        message.push_str(&format!(" (decided by {by})"));
    }
    if code == Code::Internal {
        tracing::error!(error = %e, "internal error returned to a client");
    }
    Status::new(code, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_maps_to_its_code() {
        let cases = [
            (
                Error::NotFound {
                    what: "session \"x\"".into(),
                },
                Code::NotFound,
            ),
            (
                Error::FailedPrecondition {
                    message: "permission request \"r1\" was already answered".into(),
                    decided_by: Some("client:b".into()),
                },
                Code::FailedPrecondition,
            ),
            (
                Error::InvalidArgument {
                    field: "cwd".into(),
                    message: "/nope does not exist".into(),
                },
                Code::InvalidArgument,
            ),
            (
                Error::ResourceExhausted {
                    message: "256 live sessions (max_sessions)".into(),
                },
                Code::ResourceExhausted,
            ),
            (
                Error::Unavailable("shutting down".into()),
                Code::Unavailable,
            ),
            (Error::Internal("disk".into()), Code::Internal),
            (
                Error::AlreadyExists { what: "x".into() },
                Code::AlreadyExists,
            ),
        ];
        for (e, code) in cases {
            let s: Status = ApiError::from(e).into();
            assert_eq!(s.code(), code, "{s:?}");
        }
    }

    #[test]
    fn messages_name_the_field_and_the_decider() {
        let s = status_of(&Error::InvalidArgument {
            field: "cwd".into(),
            message: "/nope does not exist".into(),
        });
        assert!(
            s.message().contains("cwd") && s.message().contains("/nope"),
            "{}",
            s.message()
        );
        let s = status_of(&Error::FailedPrecondition {
            message: "already answered".into(),
            decided_by: Some("client:b".into()),
        });
        assert!(s.message().contains("client:b"), "{}", s.message());
    }
}
