//! `grpc.health.v1.Health` (tonic-health's), with every response stream ending when
//! shutdown begins: a `Watch` stream otherwise stays open after its NOT_SERVING and holds
//! the server's drain for its whole timeout (gRPC clients with client-side health checking
//! keep one per connection).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::Frame;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tonic::body::Body;
use tonic::server::NamedService;

/// The health service `S` whose response bodies end once `ended` is cancelled (after the
/// final NOT_SERVING has been set).
#[derive(Clone)]
pub(crate) struct Ending<S> {
    inner: S,
    ended: CancellationToken,
}

impl<S> Ending<S> {
    pub(crate) fn new(inner: S, ended: CancellationToken) -> Self {
        Self { inner, ended }
    }
}

impl<S: NamedService> NamedService for Ending<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> tower::Service<http::Request<Body>> for Ending<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let ended = self.ended.clone().cancelled_owned();
        let call = self.inner.call(req);
        Box::pin(async move {
            let response = call.await?;
            Ok(response.map(|inner| {
                Body::new(EndingBody {
                    inner,
                    ended: Box::pin(ended),
                    done: false,
                })
            }))
        })
    }
}

/// A response body that ends with `UNAVAILABLE` trailers once `ended` fires, unless the
/// inner body ended first; what the inner body has ready is passed on before.
struct EndingBody {
    inner: Body,
    ended: Pin<Box<WaitForCancellationFutureOwned>>,
    done: bool,
}

impl http_body::Body for EndingBody {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                self.done = true;
                return Poll::Ready(None);
            }
            Poll::Ready(Some(frame)) => return Poll::Ready(Some(frame)),
            Poll::Pending => {}
        }
        if self.ended.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.done = true;
        let mut trailers = http::HeaderMap::new();
        let status = tonic::Status::unavailable("the daemon is shutting down");
        // A fixed ASCII message: its headers are always valid.
        let _ = status.add_header(&mut trailers);
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }

    /// The inner body's answer too: an error answered "trailers-only" (the status in the
    /// response headers, an empty body) must be sent as one HEADERS frame with END_STREAM;
    /// an empty DATA frame after it is not valid gRPC, and grpc-core clients (Python's
    /// grpcio) read it as UNKNOWN instead of the status (NOT_FOUND for an unknown service).
    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        if self.done {
            http_body::SizeHint::with_exact(0)
        } else {
            self.inner.size_hint()
        }
    }
}
