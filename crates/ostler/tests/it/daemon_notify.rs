//! `[[notify]]` webhooks against a loopback HTTP receiver: signed JSON POSTs of the feed
//! items a notifier asked for, retried after HTTP 500, resumed from the persisted cursor
//! after a daemon restart (acknowledged items are not sent again).
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use common::grpc::{as_client, text};
use common::metrics::{Metrics, metrics_addr};
use common::{Daemon, NEW, World, guard};
use hmac::{Hmac, Mac as _};
use ostler_proto::v1 as pb;
use serde_json::Value;
use sha2::Sha256;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;

/// One request the receiver got, and the status it answered.
#[derive(Debug, Clone)]
struct Received {
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
    status: u16,
}

/// A loopback HTTP/1.1 receiver answering 500 to the first `fail_first` attempts of each
/// delivery id, then 200.
async fn receiver(fail_first: usize) -> (u16, mpsc::UnboundedReceiver<Received>) {
    let (port, rx, _) = receiver_with(fail_first, None).await;
    (port, rx)
}

/// [`receiver`] over TLS with `acceptor` when given; the third receiver gets a unit for
/// each TLS handshake that failed.
async fn receiver_with(
    fail_first: usize,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
) -> (
    u16,
    mpsc::UnboundedReceiver<Received>,
    mpsc::UnboundedReceiver<()>,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    let (failed_tx, failed_rx) = mpsc::unbounded_channel();
    let attempts: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                return;
            };
            let tx = tx.clone();
            let attempts = attempts.clone();
            match &acceptor {
                None => {
                    tokio::spawn(answer(sock, fail_first, tx, attempts));
                }
                Some(acceptor) => {
                    let acceptor = acceptor.clone();
                    let failed = failed_tx.clone();
                    tokio::spawn(async move {
                        // A client that does not trust the certificate ends here.
                        match acceptor.accept(sock).await {
                            Ok(tls) => answer(tls, fail_first, tx, attempts).await,
                            Err(_) => {
                                let _ = failed.send(());
                            }
                        }
                    });
                }
            }
        }
    });
    (port, rx, failed_rx)
}

/// Reads one request from `sock` and answers it (500 for the first `fail_first` attempts
/// of a delivery id, then 200).
async fn answer<S>(
    mut sock: S,
    fail_first: usize,
    tx: mpsc::UnboundedSender<Received>,
    attempts: Arc<Mutex<HashMap<String, usize>>>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    {
        {
            {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let head_end = loop {
                    let n = sock.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                let headers: BTreeMap<String, String> = head
                    .lines()
                    .skip(1)
                    .filter_map(|l| l.split_once(':'))
                    .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
                    .collect();
                let len: usize = headers
                    .get("content-length")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let mut body = buf[head_end + 4..].to_vec();
                while body.len() < len {
                    let n = sock.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    body.extend_from_slice(&chunk[..n]);
                }
                let id = headers
                    .get("x-ostler-delivery")
                    .cloned()
                    .unwrap_or_default();
                let seen = {
                    let mut a = attempts.lock().unwrap();
                    let n = a.entry(id).or_insert(0);
                    *n += 1;
                    *n
                };
                let status = if seen <= fail_first { 500 } else { 200 };
                let reason = if status == 200 {
                    "OK"
                } else {
                    "Internal Server Error"
                };
                let _ = sock
                    .write_all(
                        format!(
                            "HTTP/1.1 {status} {reason}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        )
                        .as_bytes(),
                    )
                    .await;
                let _ = sock.shutdown().await;
                let _ = tx.send(Received {
                    headers,
                    body,
                    status,
                });
            }
        }
    }
}

/// A session in the world's work directory with no first prompt.
async fn plain_session(
    c: &mut ostler_proto::v1::session_service_client::SessionServiceClient<
        tonic::transport::Channel,
    >,
    world: &World,
) -> pb::Session {
    c.create_session(as_client(
        "tester",
        pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            ..Default::default()
        },
    ))
    .await
    .unwrap()
    .into_inner()
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Received>, what: &str) -> Received {
    tokio::time::timeout(guard(), rx.recv())
        .await
        .unwrap_or_else(|_| panic!("no webhook request for {what}"))
        .unwrap()
}

/// The test-hook url's credentials, `hookuser:hookpw`, as Basic authentication.
const HOOK_AUTH: Option<&str> = Some("Basic aG9va3VzZXI6aG9va3B3");

fn expected_signature(body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(b"s3cret").unwrap();
    mac.update(body);
    let hex: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256={hex}")
}

/// Reads requests until one is answered 200; checks every signature on the way, and that
/// `Host` never carries a url's credentials. Returns the accepted body and how many
/// attempts it took.
async fn accepted(
    rx: &mut mpsc::UnboundedReceiver<Received>,
    what: &str,
    auth: Option<&str>,
) -> (Value, usize) {
    let mut attempts = 0;
    let mut id = None;
    loop {
        let r = next(rx, what).await;
        attempts += 1;
        let host = r.headers.get("host").cloned().unwrap_or_default();
        assert!(!host.is_empty() && !host.contains('@'), "Host {host:?}");
        assert_eq!(
            r.headers.get("authorization").map(String::as_str),
            auth,
            "{what}"
        );
        assert_eq!(
            r.headers.get("x-ostler-signature").map(String::as_str),
            Some(expected_signature(&r.body).as_str()),
            "signature of {what}"
        );
        assert_eq!(
            r.headers.get("content-type").map(String::as_str),
            Some("application/json")
        );
        let delivery = r.headers.get("x-ostler-delivery").cloned().unwrap();
        // Retries repeat the same delivery until it is accepted.
        assert_eq!(id.get_or_insert(delivery.clone()), &delivery, "{what}");
        if r.status == 200 {
            let v: Value = serde_json::from_slice(&r.body).unwrap();
            assert_eq!(v["id"].to_string(), delivery);
            return (v, attempts);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_are_signed_retried_and_resumed_after_a_restart() {
    let world = World::new(NEW).await;
    let (port, mut rx) = receiver(2).await;
    std::fs::write(
        &world.config,
        format!(
            r#"
[[notify]]
name = "test-hook"
url = "http://hookuser:hookpw@127.0.0.1:{port}/hook"
secret = "s3cret"
kinds = ["session_created", "turn_completed"]
retry_initial_ms = 20
retry_max_ms = 100

# A URL holding secrets (a password, a query token) is never logged.
[[notify]]
url = "http://user:pa55word@127.0.0.1:9/elsewhere?key=qs3cret"
kinds = ["permission_requested"]
"#
        ),
    )
    .unwrap();
    let (cmd, ready) = world.serve_command(&["--metrics-listen", "127.0.0.1:0"]);
    let mut daemon = Daemon::spawn(cmd, &world, ready.clone(), &[]).await;
    let metrics = metrics_addr(&std::fs::read_to_string(&ready).unwrap())
        .expect("the metrics endpoint in the ready file");
    let mut c = daemon.sessions().await;
    let a = c
        .create_session(as_client(
            "tester",
            pb::CreateSessionRequest {
                cwd: world.work.display().to_string(),
                first_prompt: text("Say hello"),
                title: "hooked".into(),
                env: [("API_TOKEN".to_owned(), "env5ecret".to_owned())].into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();

    // Each item: two 500s, then accepted on the third attempt; in feed order.
    let (created, n) = accepted(&mut rx, "session_created", HOOK_AUTH).await;
    assert_eq!(n, 3);
    assert_eq!(created["kind"], "session_created");
    assert_eq!(created["session_id"], a.id.as_str());
    assert_eq!(created["title"], "hooked");
    assert_eq!(created["notifier"], "test-hook");
    // The session's env values are hidden, as from clients.
    let notice = created["event"]["payload"].to_string();
    assert!(
        !notice.contains("env5ecret") && notice.contains("API_TOKEN"),
        "{notice}"
    );
    assert_eq!(created["event"]["seq"], 1);
    let (turn, n) = accepted(&mut rx, "turn_completed", HOOK_AUTH).await;
    assert_eq!(n, 3);
    assert_eq!(turn["kind"], "turn_completed");
    assert_eq!(turn["event"]["payload"]["kind"], "turn_completed");
    assert!(turn["id"].as_u64().unwrap() > created["id"].as_u64().unwrap());
    let log = daemon.log_text();
    assert!(
        log.contains("notification failed; retrying"),
        "retries are logged"
    );
    assert!(
        log.contains("notifier=http://127.0.0.1:9/elsewhere?…"),
        "the unnamed notifier is named by its URL, redacted: {log}"
    );
    assert!(
        !log.contains("pa55word") && !log.contains("qs3cret") && !log.contains("hookpw"),
        "a secret of a notifier's URL was logged: {log}"
    );
    // And counted: two failed attempts of each item were retried (each retry is counted
    // before its attempt goes out), the first item delivered before the second was sent.
    let m = Metrics::scrape(metrics).await;
    let count = |outcome| m.count("ostler_notifications_total", &[("outcome", outcome)]);
    assert!(count("retried") >= 4.0, "retried {}", count("retried"));
    assert!(
        count("delivered") >= 1.0,
        "delivered {}",
        count("delivered")
    );
    assert_eq!(count("given_up"), 0.0);

    // Restart: the notifier continues from its persisted cursor. Acknowledged items are
    // not sent again (at least once: only the last acknowledged one may be, if its cursor
    // was not saved before the kill).
    daemon.kill9();
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let b = plain_session(&mut c, &world).await;
    loop {
        let (v, _) = accepted(&mut rx, "after the restart", HOOK_AUTH).await;
        assert_ne!(
            v["id"], created["id"],
            "an acknowledged item was delivered again"
        );
        if v["session_id"] == b.id.as_str() {
            assert_eq!(v["kind"], "session_created");
            break;
        }
        assert_eq!(
            v["id"], turn["id"],
            "only the last acknowledged item may come again"
        );
    }
}

/// An https receiver whose self-signed certificate the notifier trusts through `ca_file`
/// gets the signed item; a notifier without `ca_file` does not trust it and never gets a
/// request through (the handshake fails and is retried, logged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_reach_an_https_receiver_that_ca_file_trusts() {
    let world = World::new(NEW).await;
    let rcgen::CertifiedKey { cert, signing_key } =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let ca = world.dir.path().join("receiver-ca.pem");
    std::fs::write(&ca, cert.pem()).unwrap();
    let key = rustls_pki_types::PrivateKeyDer::Pkcs8(rustls_pki_types::PrivatePkcs8KeyDer::from(
        signing_key.serialize_der(),
    ));
    let server = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert.der().clone()], key)
    .unwrap();
    let (port, mut rx, mut failed) =
        receiver_with(0, Some(tokio_rustls::TlsAcceptor::from(Arc::new(server)))).await;
    std::fs::write(
        &world.config,
        format!(
            r#"
[[notify]]
name = "tls-hook"
url = "https://localhost:{port}/hook"
ca_file = "{ca}"
secret = "s3cret"
kinds = ["session_created"]

[[notify]]
name = "untrusting"
url = "https://localhost:{port}/hook"
kinds = ["session_created"]
retry_initial_ms = 20
retry_max_ms = 100
"#,
            ca = ca.display()
        ),
    )
    .unwrap();
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let a = plain_session(&mut c, &world).await;
    let (created, n) = accepted(&mut rx, "session_created over https", None).await;
    assert_eq!(n, 1);
    assert_eq!(created["notifier"], "tls-hook");
    assert_eq!(created["session_id"], a.id.as_str());
    // The untrusting notifier's handshakes fail (it does not trust the certificate), and
    // it retries: two failed handshakes seen by the receiver.
    for _ in 0..2 {
        tokio::time::timeout(guard(), failed.recv())
            .await
            .expect("the untrusting notifier's handshake fails")
            .unwrap();
    }
    assert!(
        daemon.log_text().contains("TLS handshake"),
        "the failure is logged with its step"
    );
    while let Ok(r) = rx.try_recv() {
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            v["notifier"], "tls-hook",
            "no request through an untrusted handshake"
        );
    }
}
