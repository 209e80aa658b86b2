//! The metrics endpoint's helpers for the daemon tests: one HTTP/1.1 request, a parsed
//! scrape (a real Prometheus text-format parser).
#![allow(clippy::unwrap_used)] // test helpers: a failure should panic with the error

use std::net::SocketAddr;

use prometheus_parse::{Scrape, Value};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::{guard, listed};

/// The metrics endpoint listed in a ready file or a log line (`http://ADDR/metrics`).
pub fn metrics_addr(text: &str) -> Option<SocketAddr> {
    listed(text, "http")?.strip_suffix("/metrics")?.parse().ok()
}

/// One HTTP/1.1 request on a fresh connection: (status code, body).
pub async fn http(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            // Prometheus' own Accept: OpenMetrics first, the classic format after.
            format!(
                "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: \
                 application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n\
                 Connection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await.unwrap();
        String::from_utf8(raw).unwrap()
    };
    let text = tokio::time::timeout(guard(), exchange)
        .await
        .expect("the metrics endpoint answers");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, body.to_owned())
}

pub struct Metrics(Scrape);

impl Metrics {
    pub async fn scrape(addr: SocketAddr) -> Metrics {
        let (status, body) = http(addr, "GET", "/metrics").await;
        assert_eq!(status, 200, "{body}");
        assert!(
            body.ends_with("# EOF\n"),
            "OpenMetrics text ends with # EOF"
        );
        Metrics(Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).expect("parsable"))
    }

    /// The value of the sample `name` whose labels include `labels` (a histogram: its
    /// count, the `+Inf` bucket); `None` when absent.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.0
            .samples
            .iter()
            .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match &s.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
                Value::Histogram(h) => h.last().map(|b| b.count).unwrap_or(0.0),
                Value::Summary(_) => f64::NAN,
            })
    }

    /// Like [`Metrics::get`], absent counted as 0 (a labelled counter appears on first use).
    pub fn count(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or(0.0)
    }

    pub fn sessions(&self, state: &str) -> f64 {
        self.get("ostler_sessions", &[("state", state)])
            .unwrap_or_else(|| panic!("ostler_sessions{{state={state:?}}} is always listed"))
    }
}
