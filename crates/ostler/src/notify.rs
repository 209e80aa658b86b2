//! Webhook notifications (`[[notify]]`): each notifier follows the daemon-wide feed with its
//! own cursor, persisted in the store, and POSTs one JSON object per item to its URL,
//! signed with HMAC-SHA256, retried with exponential backoff.
//!
//! Delivery is at least once: the cursor is saved after the receiver acknowledged (2xx) an
//! item, so a daemon restart re-delivers what was not acknowledged; receivers de-duplicate
//! on the item's `id` (also the `x-ostler-delivery` header). Nothing here can block a
//! session: the feed is read from the store, a bounded queue sits between the reader and the
//! sender, and a full queue (a slow receiver) only pauses this notifier's reading (counted
//! and logged; the items wait in the store).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use hmac::{Hmac, Mac as _};
use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use ostler_engine::{Engine, FeedItem, FeedKind, WatchRequest};
use ostler_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::Sha256;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Signature header: `sha256=<hex HMAC-SHA256 of the body with the secret>`.
pub const SIGNATURE_HEADER: &str = "x-ostler-signature";
/// Delivery id header: the feed cursor (unique per daemon store, never reused).
pub const DELIVERY_HEADER: &str = "x-ostler-delivery";
/// The item's kind (`permission_requested`, ...).
pub const KIND_HEADER: &str = "x-ostler-event";

/// One `[[notify]]` entry as written in the configuration.
#[derive(Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NotifyConfig {
    /// Names the notifier's persisted cursor (default: the URL). Renaming it restarts
    /// delivery from the newest item.
    pub name: String,
    /// `https://host[:port]/path` (the certificate checked against the system's roots and
    /// `ca_file`) or `http://...` (plain, for a receiver on loopback or a trusted network).
    pub url: String,
    /// PEM file of extra CA certificates trusted for this notifier's https receiver (a
    /// private CA, a self-signed receiver), on top of the system's roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// Key of the HMAC-SHA256 signature (empty: no signature header).
    pub secret: String,
    /// Feed kinds to deliver (empty: all): session_created, state_changed, turn_completed,
    /// permission_requested, question_asked, interaction_resolved, process_exited,
    /// hook_pending, tool_call_requested, elicitation_requested, session_deleted,
    /// dialog_requested, session_updated (UpdateSession changed the title, labels or
    /// archived mark). The pending ones (permission_requested, question_asked,
    /// hook_pending, tool_call_requested, elicitation_requested: an MCP server waits for the
    /// user's input, dialog_requested: the CLI waits for a dialog's answer) call for
    /// someone's attention; their answers are interaction_resolved.
    pub kinds: Vec<String>,
    /// Only sessions carrying all of these labels.
    pub labels: BTreeMap<String, String>,
    /// Items read ahead of the sender.
    pub queue: usize,
    /// Attempts per item before it is given up (logged, counted).
    pub max_attempts: u32,
    /// First retry delay; doubles per attempt up to `retry_max_ms`.
    pub retry_initial_ms: u64,
    pub retry_max_ms: u64,
    /// Per request (connect + answer).
    pub timeout_secs: u64,
}

impl Default for NotifyConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            url: String::new(),
            ca_file: None,
            secret: String::new(),
            kinds: Vec::new(),
            labels: BTreeMap::new(),
            queue: 256,
            max_attempts: 8,
            retry_initial_ms: 500,
            retry_max_ms: 60_000,
            timeout_secs: 10,
        }
    }
}

impl std::fmt::Debug for NotifyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = match self.url.parse::<hyper::Uri>() {
            Ok(u) => redacted_url(&u),
            Err(_) => "<not a URL>".to_owned(),
        };
        f.debug_struct("NotifyConfig")
            .field("name", &self.name)
            .field("url", &url)
            .field(
                "secret",
                &if self.secret.is_empty() {
                    ""
                } else {
                    "<redacted>"
                },
            )
            .field("kinds", &self.kinds)
            .field("labels", &self.labels)
            .field("queue", &self.queue)
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

/// A checked notifier.
#[derive(Clone)]
pub struct Notifier {
    /// The key of its saved position (and the body's `notifier`): `name`, else the URL.
    pub name: String,
    /// What logs and messages call it: `name`, else the URL without credentials or query
    /// (a URL may hold a secret).
    pub shown: String,
    pub uri: hyper::Uri,
    host: String,
    port: u16,
    /// For https: the connector (roots checked at validation) and the name to verify.
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls_pki_types::ServerName<'static>,
    )>,
    secret: Option<Vec<u8>>,
    kinds: Option<Vec<FeedKind>>,
    labels: BTreeMap<String, String>,
    queue: usize,
    max_attempts: u32,
    retry_initial: Duration,
    retry_max: Duration,
    timeout: Duration,
}

impl Notifier {
    /// Plain `http://` to a host that is not loopback (`localhost`, `127.0.0.0/8`, `::1`).
    fn in_the_clear(&self) -> bool {
        let loopback = self.host.eq_ignore_ascii_case("localhost")
            || self
                .host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        self.tls.is_none() && !loopback
    }
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("name", &self.shown)
            .field("uri", &redacted_url(&self.uri))
            .finish_non_exhaustive()
    }
}

impl NotifyConfig {
    /// Checks the entry `notify[i]`; errors name the key.
    pub fn validate(&self, i: usize) -> Result<Notifier> {
        let key = |k: &str| format!("notify[{i}].{k}");
        // The url is never quoted back whole: it may hold a password or a token.
        let uri: hyper::Uri = self.url.trim().parse().map_err(|e| {
            anyhow::anyhow!(
                "{}: not a URL ({e}); expected http(s)://HOST[:PORT]/PATH",
                key("url")
            )
        })?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => bail!(
                "{}: must start with https:// or http:// (it starts with {:?})",
                key("url"),
                uri.scheme_str().unwrap_or("")
            ),
        };
        let host = uri
            .host()
            .filter(|h| !h.is_empty())
            .with_context(|| format!("{}: {} has no host", key("url"), redacted_url(&uri)))?
            .trim_matches(['[', ']'])
            .to_owned();
        // A port written but not one (`:65616`): hyper reads no port at all.
        let written_port = uri
            .authority()
            .map(|a| a.as_str().rsplit('@').next().unwrap_or(""))
            .and_then(|hostport| {
                hostport
                    .rsplit_once(']')
                    .map_or(Some(hostport), |(_, p)| Some(p))
            })
            .is_some_and(|rest| rest.contains(':'));
        let port = match (written_port, uri.port_u16()) {
            (true, None) => bail!(
                "{}: the port of {} is not a port number (1 to 65535)",
                key("url"),
                redacted_url(&uri)
            ),
            (_, Some(0)) => bail!("{}: port 0 is not a port to send to", key("url")),
            (_, Some(p)) => p,
            (false, None) => {
                if https {
                    443
                } else {
                    80
                }
            }
        };
        let tls = if https {
            let name = rustls_pki_types::ServerName::try_from(host.clone())
                .with_context(|| format!("{}: {host:?} is not a TLS server name", key("url")))?;
            Some((
                tls_connector(self.ca_file.as_deref(), &key("ca_file"))?,
                name,
            ))
        } else {
            if self.ca_file.is_some() {
                bail!("{} is only used with an https:// url", key("ca_file"));
            }
            None
        };
        let kinds = if self.kinds.is_empty() {
            None
        } else {
            let mut out = Vec::new();
            for (j, k) in self.kinds.iter().enumerate() {
                let kind = FeedKind::ALL
                    .into_iter()
                    .find(|f| f.as_str() == k.trim())
                    .with_context(|| {
                        let names: Vec<&str> = FeedKind::ALL.iter().map(|f| f.as_str()).collect();
                        format!(
                            "{}[{j}]: {k:?} is not a feed kind (one of: {})",
                            key("kinds"),
                            names.join(", ")
                        )
                    })?;
                out.push(kind);
            }
            Some(out)
        };
        if !(1..=1_000_000).contains(&self.queue) {
            bail!(
                "{} is {}; it must be from 1 to 1000000",
                key("queue"),
                self.queue
            );
        }
        if self.max_attempts == 0 {
            bail!("{} must be at least 1", key("max_attempts"));
        }
        if !(1..=3600).contains(&self.timeout_secs) {
            bail!(
                "{} is {}; it must be from 1 to 3600 seconds",
                key("timeout_secs"),
                self.timeout_secs
            );
        }
        let (name, shown) = if self.name.trim().is_empty() {
            (self.url.trim().to_owned(), redacted_url(&uri))
        } else {
            (self.name.trim().to_owned(), self.name.trim().to_owned())
        };
        Ok(Notifier {
            name,
            shown,
            uri,
            host,
            port,
            tls,
            secret: (!self.secret.is_empty()).then(|| self.secret.clone().into_bytes()),
            kinds,
            labels: self.labels.clone(),
            queue: self.queue,
            max_attempts: self.max_attempts,
            retry_initial: Duration::from_millis(self.retry_initial_ms.max(1)),
            retry_max: Duration::from_millis(self.retry_max_ms.max(self.retry_initial_ms).max(1)),
            timeout: Duration::from_secs(self.timeout_secs),
        })
    }
}

/// A TLS client trusting the system's root certificates and those in `ca_file`.
fn tls_connector(
    ca_file: Option<&std::path::Path>,
    key: &str,
) -> Result<tokio_rustls::TlsConnector> {
    use rustls_pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    // Unreadable system certificates are skipped (rustls-native-certs reports them); an
    // empty store only matters to receivers that a `ca_file` does not cover.
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    if let Some(path) = ca_file {
        let mut n = 0;
        for cert in rustls_pki_types::CertificateDer::pem_file_iter(path)
            .with_context(|| format!("{key}: cannot read {}", path.display()))?
        {
            let cert = cert.with_context(|| format!("{key}: {} is not PEM", path.display()))?;
            roots.add(cert).with_context(|| {
                format!("{key}: a certificate in {} is not usable", path.display())
            })?;
            n += 1;
        }
        if n == 0 {
            bail!("{key}: {} holds no certificate", path.display());
        }
    }
    if roots.is_empty() {
        bail!("{key}: no trusted certificate (the system has none readable): set ca_file");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// `sha256=<hex>` of `body` keyed with `secret`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    // HMAC accepts keys of any length.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(m) => m,
        Err(_) => return String::new(),
    };
    mac.update(body);
    let bytes = mac.finalize().into_bytes();
    let mut hex = String::with_capacity(7 + bytes.len() * 2);
    hex.push_str("sha256=");
    for b in bytes {
        use std::fmt::Write as _;
        let _ = write!(hex, "{b:02x}");
    }
    hex
}

/// The JSON body of one item.
pub fn body(notifier: &str, item: &FeedItem) -> Vec<u8> {
    // A notice's secrets (a session's env values, MCP servers' env and headers) are hidden
    // as from clients.
    let mut payload = serde_json::to_value(&item.event.payload).unwrap_or_default();
    if let ostler_engine::EventPayload::EngineNotice(n) = &item.event.payload
        && let Some(data) = &n.data
    {
        payload["data"] = ostler_engine::redacted_notice_data(&n.code, data);
    }
    let v = json!({
        "id": item.cursor,
        "notifier": notifier,
        "kind": item.kind.as_str(),
        "session_id": item.session_id,
        "title": item.title,
        "cwd": item.cwd,
        "labels": item.labels,
        "state": item.state.as_str(),
        "event": {
            "seq": item.event.seq,
            "ts_ms": item.event.ts_ms,
            "payload": payload,
        },
    });
    serde_json::to_vec(&v).unwrap_or_default()
}

/// Starts every notifier; they stop when `shutdown` is cancelled.
/// Starts every notifier. Awaited before the daemon says it is ready: a new notifier's
/// cursor ("what happens from now on") is fixed here, so no item committed after
/// readiness is missed, however late its task first runs.
pub async fn spawn_all(
    notifiers: Vec<Notifier>,
    engine: &Engine,
    store: &Store,
    shutdown: &CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::with_capacity(notifiers.len());
    for n in notifiers {
        let start = match start_cursor(&n, store).await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(notifier = %n.shown, error = %format!("{e:#}"), "notifier stopped");
                continue;
            }
        };
        tasks.push({
            if n.in_the_clear() {
                tracing::warn!(
                    notifier = %n.shown,
                    host = %n.host,
                    "notifier sends over plain http:// to a host that is not loopback: its \
                     items (titles, prompts, tool inputs) and any credentials in its url \
                     cross the network unencrypted; use https://"
                );
            }
            let engine = engine.clone();
            let store = store.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let shown = n.shown.clone();
                if let Err(e) = run(n, start, engine, store, shutdown).await {
                    tracing::error!(notifier = %shown, error = %format!("{e:#}"), "notifier stopped");
                }
            })
        });
    }
    tasks
}

/// `Basic base64(user:password)` of a url's credentials (percent-decoded), if it has any.
fn basic_auth(uri: &hyper::Uri) -> Option<String> {
    let (userinfo, _) = uri.authority()?.as_str().rsplit_once('@')?;
    let decoded = percent_decode(userinfo);
    Some(format!("Basic {}", base64_encode(decoded.as_bytes())))
}

/// `%XX` sequences decoded (invalid ones kept as they are).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%'
            && let (Some(h), Some(l)) = (
                b.get(i + 1).copied().and_then(hex),
                b.get(i + 2).copied().and_then(hex),
            )
        {
            out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Standard base64 with padding.
fn base64_encode(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// `scheme://host[:port]/path`, without credentials, and `?…` for a query: what may be
/// logged of a notifier's URL.
pub fn redacted_url(uri: &hyper::Uri) -> String {
    let mut out = format!(
        "{}://{}",
        uri.scheme_str().unwrap_or("http"),
        uri.host().unwrap_or_default()
    );
    if let Some(p) = uri.port_u16() {
        out.push_str(&format!(":{p}"));
    }
    out.push_str(uri.path());
    if uri.query().is_some() {
        out.push_str("?…");
    }
    out
}

struct Delivery {
    cursor: u64,
    kind: &'static str,
    body: Bytes,
}

/// Where `n` starts: its saved cursor, or for a new notifier the feed's position now
/// (saved at once).
async fn start_cursor(n: &Notifier, store: &Store) -> Result<u64> {
    let name = n.name.clone();
    let saved = {
        let (store, name) = (store.clone(), name.clone());
        tokio::task::spawn_blocking(move || store.notify_cursor(&name))
            .await
            .context("cursor read task")?
            .context("reading the notifier's cursor")?
    };
    let start = match saved {
        Some(c) => {
            let pruned = store.feed_pruned_to();
            if c < pruned {
                // Pruning stops at a configured notifier's cursor: this one was not
                // configured for a while (`feed.deleted_retention_secs`).
                tracing::error!(notifier = %n.shown, after_cursor = c, pruned_to = pruned,
                    "session-deleted feed items this notifier had not delivered were pruned \
                     while it was not configured: it continues without them");
            }
            c
        }
        None => {
            // A new notifier starts with what happens from now on.
            let now = *store.feed_watch().borrow();
            store
                .set_notify_cursor(&name, now)
                .await
                .context("saving the notifier's cursor")?;
            now
        }
    };
    Ok(start)
}

/// Delivers `n`'s items after cursor `start` until `shutdown`.
pub async fn run(
    n: Notifier,
    start: u64,
    engine: Engine,
    store: Store,
    shutdown: CancellationToken,
) -> Result<()> {
    let name = n.name.clone();
    let shown = n.shown.clone();
    tracing::info!(notifier = %shown, url = %redacted_url(&n.uri), after_cursor = start, "notifier started");
    let (tx, mut rx) = mpsc::channel::<Delivery>(n.queue);
    let mut watch = engine.watch(WatchRequest {
        after_cursor: start,
        follow: true,
        labels: n.labels.clone(),
        states: Vec::new(),
        kinds: n.kinds.clone(),
    });
    let reader_shown = shown.clone();
    let reader_stop = shutdown.clone();
    let reader = tokio::spawn(async move {
        // Times this notifier's queue was found full (a slow receiver), for the log.
        let mut full = 0u64;
        loop {
            let next = tokio::select! {
                () = reader_stop.cancelled() => return,
                next = watch.next() => next,
            };
            let item = match next {
                None => return,
                Some(Err(e)) => {
                    tracing::error!(notifier = %reader_shown, error = %e, "reading the feed failed");
                    return;
                }
                Some(Ok(item)) => item,
            };
            let d = Delivery {
                cursor: item.cursor,
                kind: item.kind.as_str(),
                body: Bytes::from(body(&reader_shown, &item)),
            };
            match tx.try_send(d) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Closed(_)) => return,
                Err(mpsc::error::TrySendError::Full(d)) => {
                    full += 1;
                    ostler_metrics::notification("queue_full");
                    tracing::warn!(notifier = %reader_shown, cursor = d.cursor, times = full,
                        "notification queue full (slow receiver): reading the feed pauses");
                    tokio::select! {
                        () = reader_stop.cancelled() => return,
                        sent = tx.send(d) => if sent.is_err() { return },
                    }
                }
            }
        }
    });
    loop {
        let d = tokio::select! {
            () = shutdown.cancelled() => break,
            d = rx.recv() => match d { Some(d) => d, None => break },
        };
        let Some(ok) = deliver(&n, &d, &shutdown).await else {
            break; // shutting down: not acknowledged, delivered again after the restart
        };
        if !ok {
            ostler_metrics::notification("given_up");
            tracing::error!(notifier = %shown, cursor = d.cursor, attempts = n.max_attempts,
                "notification given up after every attempt failed");
        }
        if let Err(e) = store.set_notify_cursor(&name, d.cursor).await {
            tracing::warn!(notifier = %shown, error = %e, "cannot save the notifier's cursor");
        }
    }
    reader.abort();
    Ok(())
}

/// Delivers one item with retries: `Some(true)` acknowledged, `Some(false)` given up,
/// `None` shutdown.
async fn deliver(n: &Notifier, d: &Delivery, stop: &CancellationToken) -> Option<bool> {
    let mut delay = n.retry_initial;
    for attempt in 1..=n.max_attempts {
        let result = tokio::select! {
            () = stop.cancelled() => return None,
            r = tokio::time::timeout(n.timeout, post(n, d)) => r,
        };
        let why = match result {
            Ok(Ok(status)) if status.is_success() => {
                ostler_metrics::notification("delivered");
                tracing::debug!(notifier = %n.shown, cursor = d.cursor, attempt, "notification delivered");
                return Some(true);
            }
            Ok(Ok(status)) => format!("HTTP {status}"),
            Ok(Err(e)) => format!("{e:#}"),
            Err(_) => format!("no answer within {:?}", n.timeout),
        };
        if attempt == n.max_attempts {
            break;
        }
        ostler_metrics::notification("retried");
        tracing::warn!(notifier = %n.shown, cursor = d.cursor, attempt, error = %why,
            retry_in_ms = delay.as_millis() as u64, "notification failed; retrying");
        tokio::select! {
            () = stop.cancelled() => return None,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(n.retry_max);
    }
    Some(false)
}

async fn post(n: &Notifier, d: &Delivery) -> Result<hyper::StatusCode> {
    let stream = tokio::net::TcpStream::connect((n.host.as_str(), n.port))
        .await
        .with_context(|| format!("connecting to {}:{}", n.host, n.port))?;
    match &n.tls {
        None => post_on(n, d, stream).await,
        Some((connector, name)) => {
            let tls = connector
                .connect(name.clone(), stream)
                .await
                .with_context(|| format!("TLS handshake with {}", n.host))?;
            post_on(n, d, tls).await
        }
    }
}

async fn post_on<S>(n: &Notifier, d: &Delivery, stream: S) -> Result<hyper::StatusCode>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("HTTP handshake")?;
    let conn = tokio::spawn(conn);
    let path = n
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    // Host is host[:port]; credentials in the url go as Basic authentication, as curl
    // sends them (never in Host).
    let authority = match n.uri.authority().and_then(|a| a.as_str().rsplit_once('@')) {
        Some((_, host)) => host.to_owned(),
        None => n
            .uri
            .authority()
            .map_or_else(|| n.host.clone(), |a| a.as_str().to_owned()),
    };
    let mut req = hyper::Request::post(path)
        .header(hyper::header::HOST, authority)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(
            hyper::header::USER_AGENT,
            concat!("ostler/", env!("CARGO_PKG_VERSION")),
        )
        .header(DELIVERY_HEADER, d.cursor.to_string())
        .header(KIND_HEADER, d.kind);
    if let Some(secret) = &n.secret {
        req = req.header(SIGNATURE_HEADER, signature(secret, &d.body));
    }
    if let Some(basic) = basic_auth(&n.uri) {
        req = req.header(hyper::header::AUTHORIZATION, basic);
    }
    let req = req
        .body(Full::new(d.body.clone()))
        .context("building the request")?;
    let resp = sender.send_request(req).await.context("sending")?;
    let status = resp.status();
    // Read (and drop) the answer so the connection ends cleanly.
    let _ = resp.into_body().collect().await;
    conn.abort();
    Ok(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_a_url_go_as_basic_auth_and_bad_urls_are_not_quoted() {
        assert_eq!(
            base64_encode(b"Aladdin:open sesame"),
            "QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
        );
        assert_eq!(base64_encode(b"a"), "YQ==");
        assert_eq!(base64_encode(b"ab"), "YWI=");
        let u: hyper::Uri = "http://al%40x:p%3Aw@127.0.0.1:9/h".parse().unwrap();
        assert_eq!(
            basic_auth(&u).as_deref(),
            Some(format!("Basic {}", base64_encode(b"al@x:p:w")).as_str())
        );
        let plain: hyper::Uri = "http://127.0.0.1:9/h".parse().unwrap();
        assert_eq!(basic_auth(&plain), None);
        for url in [
            "ftp://u:PWSECRET@127.0.0.1:1/x?token=TSECRET",
            "http://u:PWSECRET@/x?token=TSECRET",
            "http://u:PWSECRET @127.0.0.1:1/x?token=TSECRET",
            "http://u:PWSECRET@127.0.0.1:65616/x?token=TSECRET",
        ] {
            let cfg = NotifyConfig {
                url: url.into(),
                ..Default::default()
            };
            let err = format!("{:#}", cfg.validate(0).unwrap_err());
            assert!(err.starts_with("notify[0].url"), "{err}");
            assert!(
                !err.contains("PWSECRET") && !err.contains("TSECRET"),
                "{url}: {err}"
            );
        }
    }

    #[test]
    fn plain_http_to_the_network_is_told_apart_from_loopback_and_https() {
        let clear = |url: &str| {
            NotifyConfig {
                url: url.into(),
                ..Default::default()
            }
            .validate(0)
            .unwrap()
            .in_the_clear()
        };
        for url in [
            "http://127.0.0.1:9/h",
            "http://127.8.0.1/h",
            "http://[::1]:9/h",
            "http://LocalHost:9/h",
            "https://hooks.example/h",
        ] {
            assert!(!clear(url), "{url}");
        }
        for url in [
            "http://hooks.example/h",
            "http://10.0.0.7:8080/h",
            "http://[fe80::1]/h",
            "http://localhost.example/h",
        ] {
            assert!(clear(url), "{url}");
        }
    }

    #[test]
    fn a_url_is_logged_without_credentials_or_query() {
        let u: hyper::Uri = "https://me:pw@hooks.example:8443/a/b?token=t0k"
            .parse()
            .unwrap();
        assert_eq!(redacted_url(&u), "https://hooks.example:8443/a/b?…");
        let u: hyper::Uri = "http://127.0.0.1/hook".parse().unwrap();
        assert_eq!(redacted_url(&u), "http://127.0.0.1/hook");
        let cfg = NotifyConfig {
            url: "http://me:pw@h/x?token=t0k".into(),
            ..Default::default()
        };
        let shown = format!("{cfg:?} {:?}", cfg.validate(0).unwrap());
        assert!(!shown.contains("pw") && !shown.contains("t0k"), "{shown}");
    }

    #[test]
    fn signature_matches_rfc_4231_case_2() {
        // RFC 4231, test case 2: key "Jefe".
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn attention_kinds_are_feed_kinds() {
        // The pending kinds the `kinds` doc names (an elicitation as a tool call).
        for k in [
            "permission_requested",
            "question_asked",
            "hook_pending",
            "tool_call_requested",
            "elicitation_requested",
            "dialog_requested",
            "interaction_resolved",
        ] {
            let c = NotifyConfig {
                url: "http://127.0.0.1:9/hook".into(),
                kinds: vec![k.into()],
                ..Default::default()
            };
            let n = c.validate(0).unwrap_or_else(|e| panic!("{k}: {e:#}"));
            assert_eq!(
                n.kinds
                    .as_deref()
                    .map(|k| k.iter().map(|f| f.as_str()).collect::<Vec<_>>()),
                Some(vec![k])
            );
        }
    }

    #[test]
    fn entries_are_validated_with_the_key_named() {
        let ok = NotifyConfig {
            url: "http://127.0.0.1:9/hook".into(),
            kinds: vec!["turn_completed".into()],
            ..Default::default()
        };
        let n = ok.validate(0).unwrap();
        assert_eq!(
            (n.host.as_str(), n.port, n.name.as_str()),
            ("127.0.0.1", 9, "http://127.0.0.1:9/hook")
        );
        let bad = NotifyConfig {
            kinds: vec!["nope".into()],
            ..ok.clone()
        };
        let e = format!("{:#}", bad.validate(2).unwrap_err());
        assert!(
            e.contains("notify[2].kinds[0]") && e.contains("turn_completed"),
            "{e}"
        );
        let ftp = NotifyConfig {
            url: "ftp://example.invalid/x".into(),
            ..ok.clone()
        };
        assert!(format!("{:#}", ftp.validate(0).unwrap_err()).contains("notify[0].url"));
        let missing_ca = NotifyConfig {
            url: "https://example.invalid/x".into(),
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..ok.clone()
        };
        let e = format!("{:#}", missing_ca.validate(1).unwrap_err());
        assert!(e.contains("notify[1].ca_file"), "{e}");
        let ca_on_http = NotifyConfig {
            ca_file: Some("/nonexistent/ca.pem".into()),
            ..ok.clone()
        };
        let e = format!("{:#}", ca_on_http.validate(0).unwrap_err());
        assert!(e.contains("only used with an https"), "{e}");
        let secret = NotifyConfig {
            secret: "s3cret".into(),
            ..ok
        };
        assert!(!format!("{secret:?}").contains("s3cret"));
    }
}
