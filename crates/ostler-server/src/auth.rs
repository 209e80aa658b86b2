//! Bearer-token authentication as a tower layer.
//!
//! Every request must carry `authorization: Bearer <token>` with one of the configured
//! tokens, compared in constant time. A request without one gets `UNAUTHENTICATED` with a
//! fixed message that says nothing about the configured tokens. The standard health service
//! (`grpc.health.v1.Health`) is exempt so that load balancers and probes work without a
//! secret; it reveals only SERVING / NOT_SERVING. Tokens are never logged: [`Token`]'s
//! `Debug` prints a placeholder.
//!
//! The check is also what decides which calls count as use of their connection (its idle
//! rule, [`crate::idle`]): those with a valid token, or all of them without tokens.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::{BoxFuture, FutureExt as _};
use http::{Request, Response};
use tonic::Status;
use tower::Service;

use crate::idle::{Calls, Counted};

/// Paths reachable without a token.
const PUBLIC_PREFIXES: &[&str] = &["/grpc.health.v1.Health/"];

/// A bearer token. `Debug` never prints the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// A token; surrounding whitespace is trimmed. `None` for an empty token.
    pub fn new(secret: impl AsRef<str>) -> Option<Self> {
        let t = secret.as_ref().trim();
        (!t.is_empty()).then(|| Self(t.to_owned()))
    }

    fn bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Compares two byte strings in time that depends only on their lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

/// The bearer tokens and their check; each connection's `AuthService` applies it. With
/// no tokens it lets everything through.
#[derive(Clone, Debug, Default)]
pub struct AuthLayer {
    tokens: Arc<[Token]>,
}

impl AuthLayer {
    pub fn new(tokens: Vec<Token>) -> Self {
        Self {
            tokens: tokens.into(),
        }
    }

    /// Whether requests are checked at all.
    pub fn enabled(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// Whether the `authorization` header value carries one of the tokens.
    pub fn check_header(&self, value: Option<&http::HeaderValue>) -> bool {
        let Some(value) = value.and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let Some(presented) = value
            .strip_prefix("Bearer ")
            .or_else(|| value.strip_prefix("bearer "))
        else {
            return false;
        };
        let presented = presented.trim().as_bytes();
        // Compare against every token (no early exit), so timing does not reveal which.
        let mut ok = false;
        for t in self.tokens.iter() {
            ok |= constant_time_eq(presented, t.bytes());
        }
        ok
    }

    /// `inner` behind the token check, for one connection whose authenticated calls are
    /// recorded in `calls` (see [`crate::idle`]).
    pub(crate) fn connection<S>(&self, inner: S, calls: Arc<Calls>) -> AuthService<S> {
        AuthService {
            inner,
            auth: self.clone(),
            calls,
        }
    }
}

/// The service of one connection: refuses calls without a valid token, and records those
/// that count for the connection's idle rule.
#[derive(Clone, Debug)]
pub(crate) struct AuthService<S> {
    inner: S,
    auth: AuthLayer,
    calls: Arc<Calls>,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for AuthService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = Response<Counted<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let public = PUBLIC_PREFIXES
            .iter()
            .any(|p| req.uri().path().starts_with(p));
        // Only a call with a valid token (any call, without tokens) counts as use of the
        // connection: a health call without one is served but does not keep the
        // connection.
        let authenticated = !self.auth.enabled()
            || self
                .auth
                .check_header(req.headers().get(http::header::AUTHORIZATION));
        if !authenticated && !public {
            tracing::debug!(
                path = req.uri().path(),
                "request refused: missing or wrong bearer token"
            );
            let resp = Status::unauthenticated(
                "missing or invalid bearer token (send `authorization: Bearer <token>`)",
            )
            .into_http::<ResBody>()
            .map(|body| Counted::new(body, None));
            return async move { Ok(resp) }.boxed();
        }
        // In flight from now until the response body is dropped (or this future, if the
        // client resets the stream before the response).
        let call = authenticated.then(|| self.calls.start());
        // Standard tower pattern: use the clone that was made ready, keep a fresh one.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        async move {
            let resp = inner.call(req).await?;
            Ok(resp.map(|body| Counted::new(body, call)))
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(tokens: &[&str]) -> AuthLayer {
        AuthLayer::new(tokens.iter().filter_map(Token::new).collect())
    }

    #[test]
    fn accepts_only_configured_tokens() {
        let l = layer(&["alpha", "beta"]);
        let hv = |s: &str| http::HeaderValue::from_str(s).unwrap();
        assert!(l.check_header(Some(&hv("Bearer alpha"))));
        assert!(l.check_header(Some(&hv("Bearer beta"))));
        assert!(!l.check_header(Some(&hv("Bearer alph"))));
        assert!(!l.check_header(Some(&hv("Bearer alphaa"))));
        assert!(!l.check_header(Some(&hv("alpha"))));
        assert!(!l.check_header(Some(&hv("Basic alpha"))));
        assert!(!l.check_header(None));
    }

    #[test]
    fn token_debug_is_redacted() {
        let t = Token::new("s3cret").unwrap();
        assert!(!format!("{t:?}").contains("s3cret"));
        assert!(Token::new("   ").is_none());
    }

    #[test]
    fn constant_time_eq_matches_eq() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
