//! Issue 12 acceptance: kill -9 of the daemon while sessions are suspended and while one is
//! resuming (a message sent to a suspended session, its CLI starting), with the test kit's
//! fake CLI. After a restart on the same store nothing a client received is lost (every
//! event is stored with the same seq and payload, logs gap-free) and every session comes
//! back on demand: the next message resumes it and completes a turn that still knows the
//! conversation (the fake's `fake:recall` answers with the previous user message, read back
//! from its transcript).
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error

mod common;

use std::collections::BTreeMap;

use common::grpc::*;
use common::*;
use ostler_proto::v1 as pb;
use pb::session_event::Payload as P;

/// Sessions suspended before the first kill.
const SESSIONS: usize = 3;

fn is_state(e: &pb::SessionEvent, to: pb::SessionState) -> bool {
    matches!(&e.payload, Some(P::StateChanged(s)) if s.to() == to)
}

async fn state(
    c: &mut pb::session_service_client::SessionServiceClient<tonic::transport::Channel>,
    id: &str,
) -> pb::SessionState {
    c.get_session(pb::GetSessionRequest {
        session_id: id.to_owned(),
    })
    .await
    .unwrap()
    .into_inner()
    .state()
}

/// Every event `received` (stored ones: seq != 0, live deliveries and redeliveries alike) is
/// in `history` at its seq with the same content; `history` is gap-free from 1.
fn assert_received_stored(id: &str, received: &[pb::SessionEvent], history: &[pb::SessionEvent]) {
    assert_gap_free(history, 1);
    let by_seq: BTreeMap<u64, &pb::SessionEvent> = history.iter().map(|e| (e.seq, e)).collect();
    for e in received.iter().filter(|e| e.seq != 0) {
        let stored = by_seq.get(&e.seq).unwrap_or_else(|| {
            panic!(
                "session {id}: received {} is not stored (history ends at {:?})",
                describe(e),
                history.last().map(|h| h.seq)
            )
        });
        assert_eq!(
            stored.payload, e.payload,
            "session {id}: seq {} differs from what a client received",
            e.seq
        );
    }
}

/// The next message resumes the session on demand and completes a turn; the answer of
/// `fake:recall` is the previous user message of the CLI's conversation.
async fn comes_back(
    c: &mut pb::session_service_client::SessionServiceClient<tonic::transport::Channel>,
    id: &str,
    recall: &[&str],
) {
    let last = history(c, id).await.last().map(|e| e.seq).unwrap_or(0);
    let mut events = subscribe(c, id, last, false).await;
    let mut seen = Vec::new();
    let seq = send(c, id, "fake:recall").await;
    assert!(seq > last, "the log continues: {seq} <= {last}");
    read_until(
        &mut events,
        &mut seen,
        "the resumed turn's end",
        is_turn_completed,
    )
    .await;
    let answer: Vec<&str> = seen.iter().filter_map(assistant_text).collect();
    assert!(
        answer.iter().any(|a| recall.contains(a)),
        "session {id}: the resumed conversation recalls one of {recall:?}; got {answer:?}"
    );
    let h = history(c, id).await;
    assert_received_stored(id, &seen, &h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_while_suspended_and_while_resuming_loses_nothing() {
    let mut world = World::new(NEW).await;
    world.claude = fake_claude_binary().await;
    std::fs::write(&world.config, "[sessions]\nidle_suspend_secs = 1\n").unwrap();
    let mut daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;

    // Sessions that each ran a turn and then suspended (idle for a second).
    let mut ids = Vec::new();
    let mut received: BTreeMap<String, Vec<pb::SessionEvent>> = BTreeMap::new();
    for i in 0..SESSIONS {
        let s = create_session(&mut c, &world.work, "k").await;
        let mut events = subscribe(&mut c, &s.id, 0, false).await;
        let mut seen = Vec::new();
        send(&mut c, &s.id, &format!("remember KIWI-{i}")).await;
        read_until(&mut events, &mut seen, "first turn end", is_turn_completed).await;
        read_until(&mut events, &mut seen, "suspended", |e| {
            is_state(e, pb::SessionState::Suspended)
        })
        .await;
        assert_eq!(state(&mut c, &s.id).await, pb::SessionState::Suspended);
        received.insert(s.id.clone(), seen);
        ids.push(s.id);
    }

    // First kill: every session suspended.
    daemon.kill9();
    let mut daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    for id in &ids {
        let st = state(&mut c, id).await;
        assert!(
            matches!(
                st,
                pb::SessionState::Suspended | pb::SessionState::Resumable
            ),
            "session {id} has no process after the restart: {st:?}"
        );
        assert_received_stored(id, &received[id], &history(&mut c, id).await);
    }

    // Second kill: one session resuming. A long turn (`fake:sleep`) is sent to a suspended
    // session; the daemon dies as soon as a subscriber sees the resume begin, whether or not
    // the message has reached the CLI yet.
    let target = ids[0].clone();
    let last = history(&mut c, &target)
        .await
        .last()
        .map(|e| e.seq)
        .unwrap_or(0);
    let mut events = subscribe(&mut c, &target, last, false).await;
    let mut sender = c.clone();
    let t = target.clone();
    let sent = tokio::spawn(async move {
        sender
            .send_message(pb::SendMessageRequest {
                session_id: t,
                content: text("fake:sleep 600000"),
                client_message_id: String::new(),
            })
            .await
    });
    let mut seen = Vec::new();
    read_until(&mut events, &mut seen, "the resume begins", |e| {
        matches!(&e.payload, Some(P::StateChanged(s)) if s.from() == pb::SessionState::Suspended)
    })
    .await;
    daemon.kill9();
    drop(events);
    let sent = tokio::time::timeout(guard(), sent).await.unwrap().unwrap();
    received.get_mut(&target).unwrap().extend(seen);

    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let h = history(&mut c, &target).await;
    assert_received_stored(&target, &received[&target], &h);
    if let Ok(r) = &sent {
        // SendMessage answered: its message is stored at the seq it returned.
        let seq = r.get_ref().seq;
        assert!(
            h.iter().any(|e| e.seq == seq
                && matches!(&e.payload, Some(P::UserMessage(u)) if u.text == "fake:sleep 600000")),
            "the accepted message is stored at seq {seq}"
        );
    }
    let st = state(&mut c, &target).await;
    assert!(
        matches!(
            st,
            pb::SessionState::Suspended | pb::SessionState::Resumable
        ),
        "the session that was resuming has no process after the restart: {st:?}"
    );

    // Everything comes back on demand, with its conversation.
    comes_back(&mut c, &target, &["remember KIWI-0", "fake:sleep 600000"]).await;
    for (i, id) in ids.iter().enumerate().skip(1) {
        comes_back(&mut c, id, &[&format!("remember KIWI-{i}")]).await;
    }
    drop(daemon);
}
