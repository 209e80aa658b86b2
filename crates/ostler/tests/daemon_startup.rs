//! Daemon start-up: the README's run command on a fresh machine (no config file, no
//! `--store`) and one daemon per database.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error
#![allow(clippy::disallowed_methods)] // the test runs the daemon binary itself

mod daemon_harness;

use std::process::{Command, Stdio};

use daemon_harness::*;

#[tokio::test]
async fn serve_starts_without_a_config_file_and_uses_the_data_dir() {
    let world = World::new(NEW).await;
    let ready = world.dir.path().join("ready");
    let mut cmd = Command::new(OSTLER);
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--no-probe",
        "--ready-file",
    ])
    .arg(&ready)
    .arg("--claude")
    .arg(&world.claude)
    .env_clear()
    .env("PATH", std::env::var("PATH").unwrap_or_default())
    // A fresh HOME: no ~/.config/ostler/config.toml, no data directory yet.
    .env("HOME", &world.home)
    .env("ANTHROPIC_BASE_URL", world.fake.url())
    .env("ANTHROPIC_API_KEY", "test-key")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let (log, lines) = collect_stderr(&mut child);
    let became_ready = tokio::task::spawn_blocking(move || {
        while let Ok(l) = lines.recv_timeout(GUARD) {
            if l.contains("ostler daemon ready") {
                return true;
            }
        }
        false
    })
    .await
    .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        became_ready,
        "daemon did not start without a config file:\n{}",
        log.lock().unwrap().join("\n")
    );
    assert!(ready.is_file(), "ready file written");
    let data = world.home.join(".local/share/ostler");
    let has_db = std::fs::read_dir(&data)
        .map(|d| {
            d.flatten().any(|e| {
                e.path()
                    .extension()
                    .is_some_and(|x| x == "db" || x == "sqlite")
            })
        })
        .unwrap_or(false);
    assert!(has_db, "no database under {}", data.display());
}

#[tokio::test]
async fn a_second_daemon_on_the_same_store_is_refused() {
    let world = World::new(NEW).await;
    let first = world.daemon(&[]).await;
    let out = Command::new(OSTLER)
        .args(["serve", "--listen", "127.0.0.1:0", "--no-probe", "--store"])
        .arg(&world.store)
        .arg("--claude")
        .arg(&world.claude)
        .arg("--config")
        .arg(world.dir.path().join("no-config.toml"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", &world.home)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "second daemon started: {stderr}");
    assert!(
        stderr.contains("in use by another ostler daemon"),
        "unclear refusal: {stderr}"
    );
    // The first daemon is unaffected.
    let mut c = first.sessions().await;
    let _ = create_session(&mut c, &world.work, "still-serving").await;
}

/// `[permissions]` rules from the config file decide before any client is asked.
#[tokio::test]
async fn config_permission_rules_decide_without_asking_clients() {
    use ostler_proto::v1 as pb;
    use pb::session_event::Payload as P;

    let world = World::new(NEW).await;
    let config = world.dir.path().join("rules.toml");
    std::fs::write(
        &config,
        "[permissions]\nallow = [\"Bash(touch allowed.txt)\"]\n",
    )
    .unwrap();
    let ready = world.dir.path().join("ready-rules");
    let mut child = Command::new(OSTLER)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--no-probe",
            "--ready-file",
        ])
        .arg(&ready)
        .arg("--config")
        .arg(&config)
        .arg("--store")
        .arg(&world.store)
        .arg("--claude")
        .arg(&world.claude)
        .arg("--allowed-root")
        .arg(&world.work)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", &world.home)
        .env("ANTHROPIC_BASE_URL", world.fake.url())
        .env("ANTHROPIC_API_KEY", "test-key")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (log, lines) = collect_stderr(&mut child);
    let became_ready = tokio::task::spawn_blocking(move || {
        while let Ok(l) = lines.recv_timeout(GUARD) {
            if l.contains("ostler daemon ready") {
                return true;
            }
        }
        false
    })
    .await
    .unwrap();
    assert!(became_ready, "{}", log.lock().unwrap().join("\n"));
    let addr = std::fs::read_to_string(&ready)
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("tcp://").map(str::to_owned))
        .unwrap();
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = pb::session_service_client::SessionServiceClient::new(channel);
    let s = create_session(&mut c, &world.work, "rules").await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "Create the file allowed.txt please").await;
    read_until(&mut events, &mut seen, "turn completed", is_turn_completed).await;
    let _ = child.kill();
    let _ = child.wait();

    assert!(
        world.work.join("allowed.txt").exists(),
        "the tool did not run"
    );
    let resolved: Vec<&pb::PermissionResolved> = seen
        .iter()
        .filter_map(|e| match &e.payload {
            Some(P::PermissionResolved(r)) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(
        resolved.len(),
        1,
        "{:#?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );
    assert_eq!(
        resolved[0].resolved_by,
        "rule:allow Bash(touch allowed.txt)"
    );
}
