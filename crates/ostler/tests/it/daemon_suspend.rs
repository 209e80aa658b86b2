//! Idle sessions cost no process (issue 12), through the real daemon on the fast fake CLI
//! (`ostler-fake-claude`): `sessions.idle_suspend_secs` from the config file suspends an idle
//! session; a subscriber attached across the suspension sees `SUSPENDED`, then the resume
//! and the next turn on the same stream, and SendMessage alone brings the session back with
//! its conversation.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error

use crate::common;

use common::grpc::*;
use common::*;
use ostler_proto::v1 as pb;
use pb::session_event::Payload as P;

fn is_state(e: &pb::SessionEvent, to: pb::SessionState) -> bool {
    matches!(&e.payload, Some(P::StateChanged(s)) if s.to() == to)
}

fn is_notice(e: &pb::SessionEvent, code: &str) -> bool {
    matches!(&e.payload, Some(P::EngineNotice(n)) if n.code == code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_follows_a_session_across_suspend_and_resume() {
    let mut world = World::new(NEW).await;
    world.claude = fake_claude_binary().await;
    std::fs::write(&world.config, "[sessions]\nidle_suspend_secs = 1\n").unwrap();
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "suspend").await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "the word is teapot").await;
    read_until(&mut events, &mut seen, "first turn", is_turn_completed).await;
    let suspended = read_until(&mut events, &mut seen, "suspension", |e| {
        is_state(e, pb::SessionState::Suspended)
    })
    .await;
    let Some(P::StateChanged(change)) = &suspended.payload else {
        unreachable!()
    };
    assert!(change.reason.contains("idle"), "{change:?}");

    let info = c
        .get_session(pb::GetSessionRequest {
            session_id: s.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.state(), pb::SessionState::Suspended);
    let health = daemon
        .daemon_client()
        .await
        .get_health_details(pb::GetHealthDetailsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let counts = health.sessions.unwrap();
    assert_eq!((counts.suspended, counts.live), (1, 0), "{counts:?}");

    // SendMessage alone resumes it; the same stream shows the resume and the turn.
    send(&mut c, &s.id, "fake:recall").await;
    let done = read_until(&mut events, &mut seen, "resumed turn", is_turn_completed).await;
    let Some(P::TurnCompleted(t)) = &done.payload else {
        unreachable!()
    };
    assert_eq!(t.result, "the word is teapot", "the conversation survived");
    let after: Vec<_> = seen.iter().skip_while(|e| e.seq != suspended.seq).collect();
    let at = |pred: &dyn Fn(&pb::SessionEvent) -> bool| {
        after
            .iter()
            .position(|e| pred(e))
            .unwrap_or_else(|| panic!("{:#?}", seen.iter().map(describe).collect::<Vec<_>>()))
    };
    let resuming = at(&|e| is_notice(e, "resuming"));
    let idle = at(&|e| is_state(e, pb::SessionState::Idle));
    let turn = at(&|e| is_turn_completed(e));
    assert!(resuming < idle && idle < turn, "{resuming} {idle} {turn}");
    assert_gap_free(&seen, 1);
    let stored = history(&mut c, &s.id).await;
    assert_gap_free(&stored, 1);
    assert!(stored.len() >= seen.len());
}
