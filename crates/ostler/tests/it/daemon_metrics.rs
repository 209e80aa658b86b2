//! The Prometheus endpoint of the real daemon (`[metrics] listen`), with sessions on the
//! fast fake CLI (`ostler-fake-claude`): `/metrics` is scraped over HTTP and parsed with a
//! Prometheus text-format parser, and its values are checked against what the sessions did
//! (events stored, states, a permission decided by a client, a control request, exits).
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error

use crate::common;

use common::grpc::*;
use common::metrics::*;
use common::*;
use ostler_proto::v1 as pb;
use pb::session_event::Payload as P;

/// The stored events of a session, from the store (not following).
async fn last_seq(
    c: &mut pb::session_service_client::SessionServiceClient<tonic::transport::Channel>,
    id: &str,
) -> u64 {
    history(c, id).await.last().map(|e| e.seq).unwrap_or(0)
}

fn is_state(e: &pb::SessionEvent, to: pb::SessionState) -> bool {
    matches!(&e.payload, Some(P::StateChanged(s)) if s.to() == to)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_sessions_on_the_fake_cli() {
    let mut world = World::new(NEW).await;
    world.claude = fake_claude_binary().await;
    // The config file layer (the flag and OSTLER_METRICS__LISTEN are the same key).
    std::fs::write(&world.config, "[metrics]\nlisten = \"127.0.0.1:0\"\n").unwrap();
    let (cmd, ready) = world.serve_command(&[]);
    let daemon = Daemon::spawn(cmd, &world, ready.clone(), &[]).await;
    let metrics = metrics_addr(&std::fs::read_to_string(&ready).unwrap())
        .expect("the metrics endpoint in the ready file");

    // Only /metrics, only GET/HEAD.
    assert_eq!(http(metrics, "GET", "/").await.0, 404);
    assert_eq!(http(metrics, "GET", "/metrics/x").await.0, 404);
    assert_eq!(http(metrics, "POST", "/metrics").await.0, 405);
    assert_eq!(http(metrics, "HEAD", "/metrics").await.0, 200);

    let m = Metrics::scrape(metrics).await;
    assert_eq!(
        m.get("ostler_ready", &[]),
        Some(1.0),
        "a ready daemon says so"
    );
    assert_eq!(m.get("ostler_store_up", &[]), Some(1.0));
    assert_eq!(m.get("ostler_live_processes", &[]), Some(0.0));
    assert_eq!(m.get("ostler_subscribers", &[]), Some(0.0));
    assert_eq!(m.sessions("idle"), 0.0);
    assert_eq!(
        m.count("ostler_events_appended_total", &[]),
        0.0,
        "a new store"
    );

    // A session whose turn asks for a permission (the fake's recorded Bash tool turn).
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "metrics").await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "fake:tool").await;
    let asked = read_until(&mut events, &mut seen, "permission request", |e| {
        matches!(e.payload, Some(P::PermissionRequested(_)))
    })
    .await;
    let Some(P::PermissionRequested(req)) = asked.payload else {
        unreachable!()
    };
    // The state change is stored (and counted) after the request it follows from.
    read_until(&mut events, &mut seen, "awaiting permission", |e| {
        is_state(e, pb::SessionState::AwaitingPermission)
    })
    .await;

    // While it waits: counted in its state, pending, followed, live.
    let m = Metrics::scrape(metrics).await;
    assert_eq!(m.sessions("awaiting_permission"), 1.0);
    assert_eq!(m.get("ostler_pending_interactions", &[]), Some(1.0));
    assert_eq!(m.get("ostler_subscribers", &[]), Some(1.0));
    assert_eq!(m.get("ostler_live_processes", &[]), Some(1.0));
    let client_allowed = [
        ("kind", "permission"),
        ("source", "client"),
        ("outcome", "allowed"),
    ];
    assert_eq!(
        m.count("ostler_interaction_decisions_total", &client_allowed),
        0.0
    );

    common::grpc::allow(&mut c, "metrics", &s.id, &req.request_id).await;
    read_until(&mut events, &mut seen, "turn completed", is_turn_completed).await;
    read_until(&mut events, &mut seen, "idle", |e| {
        is_state(e, pb::SessionState::Idle)
    })
    .await;

    // A control request the fake answers.
    let before = Metrics::scrape(metrics).await;
    c.set_model(pb::SetModelRequest {
        session_id: s.id.clone(),
        model: "claude-sonnet-4-5".into(),
    })
    .await
    .unwrap();
    read_until(
        &mut events,
        &mut seen,
        "model notice",
        |e| matches!(&e.payload, Some(P::EngineNotice(n)) if n.code == "model_set"),
    )
    .await;

    let stored = last_seq(&mut c, &s.id).await;
    let m = Metrics::scrape(metrics).await;
    assert_eq!(
        last_seq(&mut c, &s.id).await,
        stored,
        "the session is quiet: nothing appended while scraping"
    );
    assert_eq!(
        m.count("ostler_events_appended_total", &[]),
        stored as f64,
        "every event of the only session, counted once"
    );
    assert_eq!(
        m.count("ostler_interaction_decisions_total", &client_allowed),
        1.0
    );
    assert_eq!(m.get("ostler_pending_interactions", &[]), Some(0.0));
    assert_eq!(m.sessions("idle"), 1.0);
    assert_eq!(m.sessions("awaiting_permission"), 0.0);
    assert!(
        m.count("ostler_control_request_seconds", &[])
            >= before.count("ostler_control_request_seconds", &[]) + 1.0,
        "set_model observed"
    );
    assert_eq!(m.count("ostler_control_request_timeouts_total", &[]), 0.0);
    assert!(m.count("ostler_store_commit_seconds", &[]) >= 1.0);

    // Exits by cause: one stopped on request, one crashing CLI.
    c.stop_session(pb::StopSessionRequest {
        session_id: s.id.clone(),
    })
    .await
    .unwrap();
    let crash = create_session(&mut c, &world.work, "metrics").await;
    let mut crash_events = subscribe(&mut c, &crash.id, 0, false).await;
    send(&mut c, &crash.id, "fake:exit 3").await;
    read_until(&mut crash_events, &mut Vec::new(), "exit", |e| {
        matches!(e.payload, Some(P::ProcessExited(_)))
    })
    .await;
    read_until(&mut crash_events, &mut Vec::new(), "exited state", |e| {
        is_state(e, pb::SessionState::Exited)
    })
    .await;
    let m = Metrics::scrape(metrics).await;
    assert_eq!(
        m.count("ostler_cli_exits_total", &[("cause", "requested")]),
        1.0
    );
    assert_eq!(
        m.count("ostler_cli_exits_total", &[("cause", "error")]),
        1.0
    );
    assert_eq!(m.sessions("stopped"), 1.0);
    assert_eq!(m.sessions("exited"), 1.0);
    assert_eq!(m.sessions("idle"), 0.0);
    assert_eq!(m.get("ostler_live_processes", &[]), Some(0.0));
    let stored = last_seq(&mut c, &s.id).await + last_seq(&mut c, &crash.id).await;
    assert_eq!(m.count("ostler_events_appended_total", &[]), stored as f64);
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_off_by_default() {
    let mut world = World::new(NEW).await;
    world.claude = fake_claude_binary().await;
    let (cmd, ready) = world.serve_command(&[]);
    let _daemon = Daemon::spawn(cmd, &world, ready.clone(), &[]).await;
    let text = std::fs::read_to_string(&ready).unwrap();
    assert!(
        !text.contains("http://"),
        "no metrics endpoint unless configured: {text}"
    );
}
