//! Start-up refusals and authentication of the real daemon process.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error
#![allow(clippy::disallowed_methods)] // runs the ostler binary under test

use crate::common;

use std::process::{Command, Stdio};

use common::*;
use ostler_proto::v1 as pb;
use tonic::Code;

fn serve(args: &[&str], dir: &std::path::Path) -> std::process::Output {
    serve_env(args, dir, &[])
}

fn serve_env(args: &[&str], dir: &std::path::Path, env: &[(&str, &str)]) -> std::process::Output {
    std::fs::write(dir.join("empty.toml"), "").unwrap();
    Command::new(OSTLER)
        .arg("serve")
        .arg("--config")
        .arg(dir.join("empty.toml"))
        .arg("--store")
        .arg(dir.join("ostler.db"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", dir)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn non_loopback_without_tokens_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let out = serve(&["--listen", "0.0.0.0:0"], dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(
        stderr.contains("listen.addr") && stderr.contains("auth.tokens"),
        "names the keys: {stderr}"
    );
    assert!(
        !dir.path().join("ostler.db").exists(),
        "nothing was started"
    );
}

#[test]
fn missing_claude_exits_72() {
    let dir = tempfile::tempdir().unwrap();
    let out = serve(
        &[
            "--listen",
            "127.0.0.1:0",
            "--claude",
            "/nonexistent/bin/claude",
        ],
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(72), "{stderr}");
    assert!(stderr.contains("/nonexistent/bin/claude"), "{stderr}");
}

#[test]
fn incompatible_claude_exits_78() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    // A "claude" far below the supported range.
    let fake = dir.path().join("claude");
    std::fs::write(&fake, "#!/bin/sh\necho '0.1.0 (Claude Code)'\n").unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = serve(
        &[
            "--listen",
            "127.0.0.1:0",
            "--no-probe",
            "--claude",
            fake.to_str().unwrap(),
        ],
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("0.1.0"), "{stderr}");
    // Refused: its discovery is not cached (the next start measures it again).
    let cache = dir.path().join("claude-discovery.json");
    assert!(!cache.exists(), "{} was left behind", cache.display());
}

/// TLS material that does not load is a configuration error (78, which the shipped unit
/// does not restart on), found before the store is created; the CLI's discovery, measured
/// before it, is not cached next to the store either (a start that fails leaves nothing).
#[test]
fn unusable_tls_material_exits_78() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("claude");
    std::fs::write(&fake, "#!/bin/sh\necho '2.1.332 (Claude Code)'\n").unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let out = serve(
        &[
            "--listen",
            "127.0.0.1:0",
            "--no-probe",
            "--claude",
            fake.to_str().unwrap(),
            "--tls-cert",
            garbage.to_str().unwrap(),
            "--tls-key",
            garbage.to_str().unwrap(),
        ],
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("tls.cert"), "{stderr}");
    assert!(
        !dir.path().join("ostler.db").exists(),
        "nothing was started"
    );
    let cache = dir.path().join("claude-discovery.json");
    assert!(!cache.exists(), "{} was left behind", cache.display());
}

#[test]
fn bad_config_key_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let out = serve(
        &["--listen", "127.0.0.1:0", "--log-format", "xml"],
        dir.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("log.format"), "{stderr}");
}

/// `serve` on loopback with `env`, which must refuse to start (78): its stderr.
fn refused_with(env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = serve_env(&["--listen", "127.0.0.1:0"], dir.path(), env);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    stderr
}

/// A bad value from the environment is named by its variable, as the operator wrote it.
#[test]
fn a_bad_variable_is_named_as_written() {
    let stderr = refused_with(&[("OSTLER_SESSIONS__MAX_LIVE", "many")]);
    assert!(
        stderr.contains("OSTLER_SESSIONS__MAX_LIVE") && !stderr.contains("SESSIONS.MAX_LIVE"),
        "{stderr}"
    );
}

#[test]
fn a_subscriber_buffer_out_of_range_is_refused_with_the_range() {
    let stderr = refused_with(&[("OSTLER_SESSIONS__SUBSCRIBER_BUFFER", "100000000")]);
    assert!(
        stderr.contains("sessions.subscriber_buffer") && stderr.contains("65536"),
        "names the key and the range: {stderr}"
    );
}

#[test]
fn environment_layer_is_read_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    // OSTLER_LISTEN__ADDR is read (and refused: non-loopback without tokens) ...
    let out = serve_env(&[], dir.path(), &[("OSTLER_LISTEN__ADDR", "0.0.0.0:0")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains("0.0.0.0:0"), "{stderr}");
    // ... a flag overrides it (and the run then fails later, on the missing CLI: 72) ...
    let out = serve_env(
        &["--listen", "127.0.0.1:0", "--claude", "/nonexistent/claude"],
        dir.path(),
        &[("OSTLER_LISTEN__ADDR", "0.0.0.0:0")],
    );
    assert_eq!(
        out.status.code(),
        Some(72),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // ... and unrelated OSTLER_* variables do not break start-up.
    let out = serve_env(
        &["--listen", "127.0.0.1:0", "--claude", "/nonexistent/claude"],
        dir.path(),
        &[("OSTLER_SOMETHING_ELSE", "1")],
    );
    assert_eq!(
        out.status.code(),
        Some(72),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_token_is_rejected() {
    let world = World::new(NEW).await;
    let tokens = world.dir.path().join("tokens");
    std::fs::write(&tokens, "# clients\nright-token-123\n").unwrap();
    // Listening on every interface requires tokens; the test connects over loopback only.
    let daemon = world
        .daemon(&[
            "--listen",
            "0.0.0.0:0",
            "--token-file",
            tokens.to_str().unwrap(),
        ])
        .await;
    let port = daemon.addr.port();
    let ch = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut s = ostler_proto::v1::session_service_client::SessionServiceClient::new(ch.clone());
    let list = |token: Option<&str>| {
        let mut r = tonic::Request::new(pb::ListSessionsRequest::default());
        if let Some(t) = token {
            r.metadata_mut()
                .insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        r
    };
    let e = s.list_sessions(list(None)).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    let e = s
        .list_sessions(list(Some("wrong-token")))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    s.list_sessions(list(Some("right-token-123")))
        .await
        .unwrap();
    // Health stays reachable for probes.
    let mut health = tonic_health::pb::health_client::HealthClient::new(ch);
    health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap();
    assert!(
        !daemon.log_text().contains("right-token-123"),
        "tokens never appear in logs"
    );
}
