//! The Prometheus endpoint of `ostler serve` (`[metrics] listen`): plain HTTP/1.1 (hyper),
//! `GET /metrics` (and `HEAD`) answers the OpenMetrics text of [`ostler_metrics::render`];
//! any other path is 404, any other method 405.
//!
//! The gauges (sessions per state, live processes, pending interactions, subscribers, store
//! up) are read from the engine at each scrape ([`Engine::health`]: in-memory counts and a
//! cheap store probe), never copied; counters and histograms are the process-wide ones of
//! `ostler-metrics`. No authentication: the output holds counts only (no session ids,
//! prompts or paths); bind it to loopback or a private interface.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, Result};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use ostler_engine::Engine;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The one path served.
pub const PATH: &str = "/metrics";

/// A client that sends no complete request head within this long is disconnected.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Connections served at once; more are closed at once (a scraper needs one).
const MAX_CONNECTIONS: usize = 64;

/// Binds the endpoint's listener (a failure names the key).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("metrics.listen: cannot listen on {addr}"))
}

/// Serves `/metrics` on `listener` until `shutdown` is cancelled.
pub fn spawn(
    listener: TcpListener,
    engine: Engine,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        loop {
            let stream = tokio::select! {
                () = shutdown.cancelled() => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Out of file descriptors and the like: do not spin.
                        tracing::warn!(error = %e, "metrics endpoint: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::debug!("metrics endpoint: too many connections; one refused");
                continue;
            };
            let engine = engine.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let service = hyper::service::service_fn(move |req| answer(req, engine.clone()));
                let mut builder = hyper::server::conn::http1::Builder::new();
                builder
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT);
                let conn = builder.serve_connection(TokioIo::new(stream), service);
                tokio::pin!(conn);
                let served = tokio::select! {
                    r = conn.as_mut() => r,
                    () = shutdown.cancelled() => {
                        conn.as_mut().graceful_shutdown();
                        conn.await
                    }
                };
                if let Err(e) = served {
                    tracing::debug!(error = %e, "metrics endpoint: connection ended");
                }
            });
        }
    })
}

async fn answer(
    req: Request<Incoming>,
    engine: Engine,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.uri().path() != PATH {
        return Ok(plain(
            StatusCode::NOT_FOUND,
            "not found: the metrics are at /metrics\n",
        ));
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut r = plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "use GET or HEAD for /metrics\n",
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        return Ok(r);
    }
    let gauges = match engine.health().await {
        Ok(report) => Some(gauges(&report)),
        Err(e) => {
            // Counters and histograms are still worth serving.
            tracing::warn!(error = %e, "metrics endpoint: engine health unavailable");
            None
        }
    };
    Ok(match ostler_metrics::render(gauges.as_ref()) {
        Ok(text) => {
            let mut r = Response::new(Full::new(Bytes::from(text)));
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static(ostler_metrics::CONTENT_TYPE),
            );
            r
        }
        Err(e) => {
            tracing::error!(error = %e, "metrics endpoint: cannot encode the metrics");
            plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot encode the metrics (see the daemon's log)\n",
            )
        }
    })
}

/// The engine's health report as the gauges of a scrape.
fn gauges(r: &ostler_engine::HealthReport) -> ostler_metrics::Gauges {
    ostler_metrics::Gauges {
        sessions_by_state: r
            .sessions_by_state
            .iter()
            .map(|(s, n)| (s.as_str(), *n))
            .collect(),
        live_processes: r.live_sessions,
        max_live_processes: r.max_live_sessions,
        pending_interactions: r.pending_interactions,
        subscribers: r.subscribers,
        store_up: r.store.is_ok(),
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}
