//! The Prometheus endpoint of `ostler serve` (`[metrics] listen`): plain HTTP/1.1 (hyper),
//! `GET /metrics` (and `HEAD`) answers the OpenMetrics text of [`ostler_metrics::render`];
//! any other path is 404, any other method 405.
//!
//! Served from the moment the daemon listens, before its store is open: until
//! [`Metrics::serve_engine`], a scrape answers `ostler_ready 0` and the counters (a long
//! schema migration then shows as "up, not ready" instead of a scrape that times out).
//! Then `ostler_ready 1` and the gauges (sessions per state, live processes, pending
//! interactions, subscribers, store up), read from the engine at each scrape
//! ([`Engine::health`]: in-memory counts and a cheap store probe), never copied; counters
//! and histograms are the process-wide ones of `ostler-metrics`.
//!
//! No authentication: the output holds counts only (no session ids, prompts or paths);
//! bind it to loopback or a private interface.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
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

/// The running endpoint: hands it the engine once the daemon is ready.
pub struct Metrics {
    engine: Arc<OnceLock<Engine>>,
}

impl Metrics {
    /// From now on scrapes report the engine's gauges and `ostler_ready 1`.
    pub fn serve_engine(&self, engine: Engine) {
        // Set once, by the one start of the daemon.
        let _ = self.engine.set(engine);
    }
}

/// Serves `/metrics` on `listener` until `shutdown` is cancelled, as a starting daemon until
/// [`Metrics::serve_engine`].
pub fn spawn(listener: TcpListener, shutdown: CancellationToken) -> Metrics {
    let engine: Arc<OnceLock<Engine>> = Arc::default();
    let metrics = Metrics {
        engine: engine.clone(),
    };
    tokio::spawn(async move {
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
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
    });
    metrics
}

async fn answer(
    req: Request<Incoming>,
    engine: Arc<OnceLock<Engine>>,
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
    // `None` while the daemon starts; then the gauges, or `None` inside when they could
    // not be read (the counters and histograms are still worth serving).
    let read = match engine.get() {
        None => None,
        Some(engine) => Some(match engine.health().await {
            Ok(report) => Some(gauges(&report)),
            Err(e) => {
                tracing::warn!(error = %e, "metrics endpoint: engine health unavailable");
                None
            }
        }),
    };
    let phase = match &read {
        None => ostler_metrics::Phase::Starting,
        Some(g) => ostler_metrics::Phase::Ready(g.as_ref()),
    };
    // OpenMetrics for a scraper that asks for it (Prometheus does); the classic text
    // format otherwise (curl, parsers of the 0.0.4 format), as Prometheus' own clients do.
    let openmetrics = req
        .headers()
        .get(hyper::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(wants_openmetrics);
    Ok(match ostler_metrics::render(phase) {
        Ok(text) => {
            let (body, content_type) = if openmetrics {
                (text, ostler_metrics::CONTENT_TYPE)
            } else {
                (
                    ostler_metrics::to_prometheus_text(&text),
                    ostler_metrics::TEXT_CONTENT_TYPE,
                )
            };
            let mut r = Response::new(Full::new(Bytes::from(body)));
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
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

/// Whether an `Accept` header prefers OpenMetrics: its media type (any case) with a q
/// above 0 and at least that of `text/plain` (or `text/*`, `*/*`).
fn wants_openmetrics(accept: &str) -> bool {
    let (mut om, mut text): (Option<f32>, Option<f32>) = (None, None);
    for range in accept.split(',') {
        let mut parts = range.split(';');
        let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let q = parts
            .filter_map(|p| {
                let (k, v) = p.split_once('=')?;
                k.trim()
                    .eq_ignore_ascii_case("q")
                    .then(|| v.trim().parse::<f32>().ok())
                    .flatten()
            })
            .next()
            .unwrap_or(1.0);
        let best = |old: Option<f32>| Some(old.map_or(q, |o| o.max(q)));
        match media.as_str() {
            "application/openmetrics-text" => om = best(om),
            "text/plain" | "text/*" | "*/*" => text = best(text),
            _ => {}
        }
    }
    om.is_some_and(|q| q > 0.0 && q >= text.unwrap_or(0.0))
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a failure should panic with the error

    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    #[test]
    fn accept_is_read_with_its_q_values() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                          version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(wants_openmetrics(prometheus));
        assert!(wants_openmetrics("APPLICATION/OPENMETRICS-TEXT"));
        assert!(!wants_openmetrics("application/openmetrics-text;q=0"));
        assert!(!wants_openmetrics(
            "text/plain;q=1, application/openmetrics-text;q=0.5"
        ));
        assert!(!wants_openmetrics("application/openmetrics-textx"));
        assert!(!wants_openmetrics("*/*"));
    }

    /// GET /metrics on a fresh connection: the status line and the body.
    async fn scrape(addr: SocketAddr) -> (String, String) {
        let (status, _, body) = scrape_accepting(addr, None).await;
        (status, body)
    }

    /// GET /metrics with an `Accept` header: the status line, the content type, the body.
    async fn scrape_accepting(addr: SocketAddr, accept: Option<&str>) -> (String, String, String) {
        let accept = accept
            .map(|a| format!("Accept: {a}\r\n"))
            .unwrap_or_default();
        let exchange = async {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let req =
                format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{accept}Connection: close\r\n\r\n");
            s.write_all(req.as_bytes()).await.unwrap();
            let mut raw = String::new();
            s.read_to_string(&mut raw).await.unwrap();
            raw
        };
        let text = tokio::time::timeout(ostler_testkit::timeouts::guard(), exchange)
            .await
            .expect("a starting daemon's endpoint answers at once");
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let content_type = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-type: ")
                    .map(str::to_owned)
            })
            .unwrap_or_default();
        (
            head.lines().next().unwrap().to_owned(),
            content_type,
            body.to_owned(),
        )
    }

    #[tokio::test]
    async fn before_the_engine_a_scrape_answers_not_ready_with_the_counters() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let _metrics = spawn(listener, shutdown.clone());
        let (status, body) = scrape(addr).await;
        assert!(status.contains(" 200 "), "{status}");
        let parsed = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_owned())))
            .expect("parsable");
        let value = |name: &str| {
            parsed
                .samples
                .iter()
                .find(|x| x.metric == name)
                .map(|x| x.value.clone())
        };
        assert!(
            matches!(value("ostler_ready"), Some(prometheus_parse::Value::Gauge(v)) if v == 0.0),
            "{body}"
        );
        assert!(
            value("ostler_store_up").is_none(),
            "no gauges before the engine: {body}"
        );
        assert!(value("ostler_events_appended_total").is_some(), "{body}");
        // The classic format unless OpenMetrics is asked for (as Prometheus does).
        let (_, plain, body) = scrape_accepting(addr, Some("*/*")).await;
        assert!(plain.starts_with("text/plain; version=0.0.4"), "{plain}");
        assert!(!body.contains("# EOF"), "{body}");
        let prometheus =
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5";
        let (_, om, body) = scrape_accepting(addr, Some(prometheus)).await;
        assert!(om.starts_with("application/openmetrics-text"), "{om}");
        assert!(body.ends_with("# EOF\n"), "{body}");
        shutdown.cancel();
    }
}
