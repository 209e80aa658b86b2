//! Daemon start-up: the README's run command on a fresh machine (no config file, no
//! `--store`), one daemon per database, and `[permissions]` rules from the config file.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error
#![allow(clippy::disallowed_methods)] // the test runs the daemon binary itself

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::grpc::*;
use common::*;
use ostler_proto::v1 as pb;
use pb::session_event::Payload as P;

/// `ostler serve --listen 127.0.0.1:0 --no-probe --ready-file READY --claude CLAUDE`.
fn serve(world: &World, ready: &Path) -> Command {
    let mut cmd = Command::new(OSTLER);
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--no-probe",
        "--ready-file",
    ])
    .arg(ready)
    .arg("--claude")
    .arg(&world.claude);
    cmd
}

#[tokio::test]
async fn serve_starts_without_a_config_file_and_uses_the_data_dir() {
    let world = World::new(NEW).await;
    let ready = world.dir.path().join("ready");
    // HOME is fresh: no ~/.config/ostler/config.toml, no data directory yet.
    let daemon = Daemon::spawn(serve(&world, &ready), &world, ready, &[]).await;
    let mut c = daemon.sessions().await;
    let _ = create_session(&mut c, &world.work, "defaults").await;
    let data = world.home.join(".local/share/ostler");
    let has_db = std::fs::read_dir(&data)
        .map(|d| {
            d.flatten()
                .any(|e| e.path().extension().is_some_and(|x| x == "db"))
        })
        .unwrap_or(false);
    assert!(has_db, "no database under {}", data.display());
}

/// `runtime.worker_threads` sets the async worker threads the daemon runs, and a daemon on
/// one of them serves a turn.
#[tokio::test]
async fn worker_threads_sets_the_async_workers() {
    let world = World::new(NEW).await;
    let ready = world.dir.path().join("ready");
    let daemon = Daemon::spawn(
        serve(&world, &ready),
        &world,
        ready,
        &[("OSTLER_RUNTIME__WORKER_THREADS", "1")],
    )
    .await;
    // The runtime reports its own worker count (tokio's metrics) in the start-up log;
    // thread names cannot tell workers from blocking threads.
    let started = daemon
        .log
        .lock()
        .unwrap()
        .iter()
        .find(|l| l.contains("async runtime started"))
        .cloned()
        .expect("the runtime's start-up line");
    assert!(started.contains("workers=1"), "{started}");
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "one-worker").await;
    let text = turn(&mut c, &s.id, "Say hello").await;
    assert!(!text.is_empty(), "the turn's answer reached the client");
}

#[tokio::test]
async fn a_second_daemon_on_the_same_store_is_refused() {
    let world = World::new(NEW).await;
    let first = world.daemon(&[]).await;
    let out = serve(&world, &world.dir.path().join("ready-second"))
        .arg("--store")
        .arg(&world.store)
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
    let world = World::new(NEW).await;
    let config = world.dir.path().join("rules.toml");
    std::fs::write(
        &config,
        "[permissions]\nallow = [\"Bash(touch allowed.txt)\"]\n",
    )
    .unwrap();
    let ready = world.dir.path().join("ready-rules");
    let mut cmd = serve(&world, &ready);
    cmd.arg("--config")
        .arg(&config)
        .arg("--store")
        .arg(&world.store)
        .arg("--allowed-root")
        .arg(&world.work);
    let daemon = Daemon::spawn(cmd, &world, ready, &[]).await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "rules").await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "Create the file allowed.txt please").await;
    read_until(&mut events, &mut seen, "turn completed", is_turn_completed).await;

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
