//! The one mapping from engine errors to gRPC statuses, at the edge.
//!
//! `impl From<ostler_engine::Error> for tonic::Status` cannot be written here (both types
//! are foreign), so the edge type is [`ApiError`]: handlers use `?` on engine results
//! (`From<ostler_engine::Error> for ApiError`) and tonic gets a `Status` through
//! `From<ApiError> for Status`. The message is the engine's, written for a person; a long
//! one (it may quote a client's input) is cut by [`clip_message`].
//!
//! [`BadRequestLayer`] turns tonic's INTERNAL for a request body that is not a valid
//! protobuf message of the RPC into INVALID_ARGUMENT (the client's fault, not ours).

use std::task::{Context, Poll};

use futures::future::{BoxFuture, FutureExt as _};
use http::{HeaderMap, Request, Response};
use ostler_engine::{CodeKind, Error};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt as _};
use tower::{Layer, Service};

/// `google.rpc.ErrorInfo.domain` of the structured details ostler puts in a status.
pub const ERROR_DOMAIN: &str = "ostler";

/// `google.rpc.ErrorInfo.reason` of the OUT_OF_RANGE for a feed cursor before pruned
/// entries (`WatchSessions`); its metadata `after_cursor` is the cursor to watch again from.
pub const REASON_FEED_PRUNED: &str = "FEED_PRUNED";

/// Characters of client input quoted in an error message.
pub const ECHO_CHARS: usize = 200;

/// `s` for quoting in an error message: at most [`ECHO_CHARS`] characters, then how much
/// was left out. Debug-quoted, so control characters and NUL bytes are visible.
pub fn shown(s: &str) -> String {
    let mut it = s.char_indices();
    match it.nth(ECHO_CHARS) {
        None => format!("{s:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes in all)", &s[..cut], s.len()),
    }
}

/// A message longer than ~850 characters keeps its first 600 and its last 200 characters:
/// an engine message that quotes a long input stays readable and small, and one that is
/// long only because it says what to do (where it looked, which releases can) is whole.
pub fn clip_message(m: String) -> String {
    const HEAD: usize = 600;
    const TAIL: usize = 200;
    let n = m.chars().count();
    if n <= HEAD + TAIL + 50 {
        return m;
    }
    let head: String = m.chars().take(HEAD).collect();
    let tail: String = m.chars().skip(n - TAIL).collect();
    format!("{head}... [{} characters cut] ...{tail}", n - HEAD - TAIL)
}

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
        CodeKind::OutOfRange => Code::OutOfRange,
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
    let message = clip_message(message);
    if code == Code::Internal {
        tracing::error!(error = %message, "internal error returned to a client");
    }
    match e {
        Error::OutOfRange {
            resume_from: Some(cursor),
            ..
        } => Status::with_error_details(
            code,
            message,
            ErrorDetails::with_error_info(
                REASON_FEED_PRUNED,
                ERROR_DOMAIN,
                [("after_cursor".to_owned(), cursor.to_string())],
            ),
        ),
        _ => Status::new(code, message),
    }
}

/// Tower layer: a request that tonic could not decode (not a protobuf message of the RPC's
/// request type, or no message at all) gets INVALID_ARGUMENT instead of tonic's INTERNAL.
/// Such errors are answered before any handler runs, as trailers-only responses, so the
/// status is in the response headers.
#[derive(Clone, Copy, Debug, Default)]
pub struct BadRequestLayer;

impl<S> Layer<S> for BadRequestLayer {
    type Service = BadRequestService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BadRequestService { inner }
    }
}

/// The service produced by [`BadRequestLayer`].
#[derive(Clone, Debug)]
pub struct BadRequestService<S> {
    inner: S,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for BadRequestService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let fut = self.inner.call(req);
        async move {
            let mut res = fut.await?;
            reclassify_decode_error(res.headers_mut());
            Ok(res)
        }
        .boxed()
    }
}

/// prost's `DecodeError` text, as tonic's codec puts it in the status.
const PROST_DECODE: &str = "failed to decode Protobuf message: ";

fn reclassify_decode_error(h: &mut HeaderMap) {
    if h.get(Status::GRPC_STATUS).map(|v| v.as_bytes()) != Some(b"13") {
        return;
    }
    let Some(st) = Status::from_header_map(h) else {
        return;
    };
    let message = if let Some(why) = st.message().strip_prefix(PROST_DECODE) {
        format!(
            "the request is not a valid protobuf message for this RPC ({}); check that \
             client and daemon use the same ostler.v1 protos",
            clip_message(why.to_owned())
        )
    } else if st.message() == "Missing request message." {
        "the request carries no message".to_owned()
    } else {
        return;
    };
    h.remove(Status::GRPC_STATUS_DETAILS);
    let _ = Status::invalid_argument(message).add_header(h);
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
                Error::OutOfRange {
                    message: "after_cursor 3 is before cursor 9".into(),
                    resume_from: Some(9),
                },
                Code::OutOfRange,
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
    fn long_messages_and_echoes_are_cut() {
        let huge = "x".repeat(1 << 20);
        let s = status_of(&Error::NotFound {
            what: format!("session \"{huge}\""),
        });
        assert!(s.message().len() < 1000, "{}", s.message().len());
        assert!(s.message().starts_with("session \"xxx"), "{}", s.message());
        // A message long only for its advice is not cut.
        let advice = format!("{} end", "where it looked, what to do; ".repeat(25));
        assert_eq!(clip_message(advice.clone()), advice);
        let short = shown("abc");
        assert_eq!(short, "\"abc\"");
        let cut = shown(&"é".repeat(1000));
        assert!(cut.contains("2000 bytes in all"), "{cut}");
        assert!(cut.chars().count() < 250, "{cut}");
        assert_eq!(clip_message("short".into()), "short");
    }

    #[test]
    fn decode_errors_become_invalid_argument() {
        let mut h = HeaderMap::new();
        Status::internal(
            "failed to decode Protobuf message: SessionRequest.cwd: invalid wire type",
        )
        .add_header(&mut h)
        .unwrap();
        reclassify_decode_error(&mut h);
        let st = Status::from_header_map(&h).unwrap();
        assert_eq!(st.code(), Code::InvalidArgument);
        assert!(
            st.message().contains("SessionRequest.cwd"),
            "{}",
            st.message()
        );

        let mut h = HeaderMap::new();
        Status::internal("disk on fire").add_header(&mut h).unwrap();
        reclassify_decode_error(&mut h);
        assert_eq!(Status::from_header_map(&h).unwrap().code(), Code::Internal);
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
