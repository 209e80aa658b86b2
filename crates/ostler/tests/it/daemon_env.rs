//! The environment a session's CLI gets, read from `/proc/<pid>/environ` of the real CLI
//! process the daemon spawned: `CLAUDE_CODE_OAUTH_TOKEN` and the CLI's documented
//! variables pass, `[sessions.env]` (file, `OSTLER_SESSIONS__ENV__*`, `--session-env`) is
//! set, `sessions.env_allow` extends the allowlist, and everything else is scrubbed. No
//! secret appears in the daemon's log or in an RPC answer.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error
#![allow(clippy::disallowed_methods)] // the test runs the daemon binary itself

use crate::common;

use std::collections::BTreeMap;
use std::process::Command;

use common::grpc::*;
use common::*;
use ostler_proto::v1 as pb;

fn environ(pid: u32) -> BTreeMap<String, String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    raw.split(|b| *b == 0)
        .filter(|kv| !kv.is_empty())
        .filter_map(|kv| {
            let s = String::from_utf8_lossy(kv);
            s.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned()))
        })
        .collect()
}

#[tokio::test]
async fn session_environment_passes_credentials_and_config_and_scrubs_the_rest() {
    let world = World::new(NEW).await;
    let config = world.dir.path().join("config.toml");
    std::fs::write(
        &config,
        "[sessions]\nenv_allow = [\"MYCO_*\"]\n[sessions.env]\nFROM_TOML = \"toml-secret-value\"\n",
    )
    .unwrap();
    let ready = world.dir.path().join("ready");
    // `env` adds variables after the harness clears the daemon's environment, then execs
    // the daemon (same pid).
    let mut cmd = Command::new("/usr/bin/env");
    cmd.args([
        "CLAUDE_CODE_OAUTH_TOKEN=oauth-secret-123",
        "MAX_THINKING_TOKENS=2048",
        "MYCO_REGION=eu-west",
        "RANDOM_SECRET=must-not-pass",
        "CLAUDECODE=1",
        "CLAUDE_CODE_ENTRYPOINT=cli",
        "OSTLER_SESSIONS__ENV__FROM_OSTLER_ENV=env-secret-value",
    ])
    .arg(OSTLER)
    .args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--no-probe",
        "--session-env",
        "FROM_FLAG=flag-secret-value",
        "--config",
    ])
    .arg(&config)
    .arg("--store")
    .arg(&world.store)
    .arg("--ready-file")
    .arg(&ready)
    .arg("--claude")
    .arg(&world.claude);
    let daemon = Daemon::spawn(cmd, &world, ready, &[]).await;
    let mut c = daemon.sessions().await;
    let session = create_session(&mut c, &world.work, "env-test").await;
    settled(&mut c, &session).await;

    let kids = children(daemon.pid());
    assert_eq!(kids.len(), 1, "one CLI process under the daemon: {kids:?}");
    let env = environ(kids[0]);
    let get = |k: &str| env.get(k).map(String::as_str);
    assert_eq!(get("CLAUDE_CODE_OAUTH_TOKEN"), Some("oauth-secret-123"));
    assert_eq!(get("MAX_THINKING_TOKENS"), Some("2048"));
    assert_eq!(get("MYCO_REGION"), Some("eu-west"), "sessions.env_allow");
    assert_eq!(get("FROM_TOML"), Some("toml-secret-value"));
    assert_eq!(get("FROM_OSTLER_ENV"), Some("env-secret-value"));
    assert_eq!(get("FROM_FLAG"), Some("flag-secret-value"));
    assert_eq!(get("ANTHROPIC_BASE_URL"), Some(world.fake.url().as_str()));
    for gone in [
        "RANDOM_SECRET",
        "CLAUDECODE",
        "CLAUDE_CODE_ENTRYPOINT",
        "RUST_LOG",
    ] {
        assert_eq!(get(gone), None, "{gone} reached the session");
    }
    // The daemon's own variables never pass; the one OSTLER_ variable a session has is the
    // process-tree mark the daemon sets itself (not inherited, not a secret).
    assert!(
        get(ostler_supervisor::proctree::MARK_VAR).is_some_and(|m| m.contains('/')),
        "every session process carries its process-tree mark"
    );
    assert!(
        !env.keys()
            .any(|k| k.starts_with("OSTLER_") && k != ostler_supervisor::proctree::MARK_VAR),
        "OSTLER_* reached the session: {:?}",
        env.keys().collect::<Vec<_>>()
    );

    // No secret in RPC answers or in the daemon's log.
    let got = c
        .get_session(pb::GetSessionRequest {
            session_id: session.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let health = daemon
        .daemon_client()
        .await
        .get_health_details(pb::GetHealthDetailsRequest {})
        .await
        .unwrap()
        .into_inner();
    let answers = format!("{session:?} {got:?} {health:?}");
    let log = daemon.log_text();
    for secret in [
        "oauth-secret-123",
        "toml-secret-value",
        "env-secret-value",
        "flag-secret-value",
    ] {
        assert!(!answers.contains(secret), "{secret} in an RPC answer");
        assert!(!log.contains(secret), "{secret} in the daemon's log");
    }
}
