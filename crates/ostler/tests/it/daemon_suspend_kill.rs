//! Issue 12 acceptance: kill -9 of the daemon while sessions are suspended and while one is
//! resuming (a message sent to a suspended session, its CLI starting), with the test kit's
//! fake CLI. After a restart on the same store nothing a client received is lost (every
//! event is stored with the same seq and payload, logs gap-free) and every session comes
//! back on demand: the next message resumes it and completes a turn that still knows the
//! conversation (the fake's `fake:recall` answers with the previous user message, read back
//! from its transcript). Also: a message the CLI had not taken when the daemon was killed
//! (queued in the fake, and in the real 2.1.332) is failed at the next resume and its id
//! is free for the retry.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error

use crate::common;

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
                ..Default::default()
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

async fn send_with_id(
    c: &mut pb::session_service_client::SessionServiceClient<tonic::transport::Channel>,
    id: &str,
    prompt: &str,
    client_message_id: &str,
) -> pb::SendMessageResponse {
    c.send_message(pb::SendMessageRequest {
        session_id: id.to_owned(),
        content: text(prompt),
        client_message_id: client_message_id.to_owned(),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
}

/// A message sent before a kill -9 of the daemon: its prompt, client id and answer.
struct Sent<'a> {
    prompt: &'a str,
    id: &'a str,
    answer: pb::SendMessageResponse,
}

/// After the restart: the retry of `queued` (same prompt and id) is delivered and its turn
/// ends; the log is gap-free and holds exactly one `delivery_failed`, for `queued`; the
/// retry of `taken` is the duplicate. Returns the retried turn's events.
async fn retry_after_restart(
    c: &mut pb::session_service_client::SessionServiceClient<tonic::transport::Channel>,
    sid: &str,
    queued: &Sent<'_>,
    taken: &Sent<'_>,
) -> Vec<pb::SessionEvent> {
    let last = history(c, sid).await.last().map(|e| e.seq).unwrap_or(0);
    let mut events = subscribe(c, sid, last, false).await;
    let mut seen = Vec::new();
    let retry = send_with_id(c, sid, queued.prompt, queued.id).await;
    assert!(
        !retry.duplicate && retry.seq > queued.answer.seq,
        "the retry of the message the CLI never took is delivered: {retry:?} (first: {:?})",
        queued.answer
    );
    read_until(
        &mut events,
        &mut seen,
        "the retried turn's end",
        is_turn_completed,
    )
    .await;
    let h = history(c, sid).await;
    assert_gap_free(&h, 1);
    let failed: Vec<serde_json::Value> = h
        .iter()
        .filter_map(|e| match &e.payload {
            Some(P::EngineNotice(n)) if n.code == "delivery_failed" => {
                Some(serde_json::from_str(&n.data_json).unwrap())
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        failed,
        vec![serde_json::json!({"seq": queued.answer.seq, "client_message_id": queued.id})],
        "exactly the queued message is failed"
    );
    // The taken one, whose turn the kill cut off, is said to be unanswered (a client
    // following its retry stops waiting for a turn that never comes).
    let unanswered: Vec<u64> = h
        .iter()
        .filter_map(|e| match &e.payload {
            Some(P::EngineNotice(n)) if n.code == "message_unanswered" => {
                serde_json::from_str::<serde_json::Value>(&n.data_json).unwrap()["seq"].as_u64()
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        unanswered,
        vec![taken.answer.seq],
        "the taken message's turn was cut off"
    );
    let again = send_with_id(c, sid, taken.prompt, taken.id).await;
    assert!(
        again.duplicate && again.seq == taken.answer.seq,
        "the message the CLI took stays taken: {again:?}"
    );
    seen
}

/// A message the CLI had not taken when the daemon was killed (queued behind a running
/// turn) is not answered as a duplicate after the restart: the resume finds it missing from
/// the CLI's transcript, records `delivery_failed` for it, and the retry with the same
/// client id is delivered. The message the CLI did take (the running turn's) stays taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_with_a_message_the_cli_had_not_taken_frees_its_id() {
    let mut world = World::new(NEW).await;
    world.claude = fake_claude_binary().await;
    let mut daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "q").await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    // A turn that runs until the kill. The fake writes the message to its transcript and
    // then its init line, so once the init is seen the CLI has taken this one.
    let taken = send_with_id(&mut c, &s.id, "fake:sleep 600000", "m-taken").await;
    read_until(&mut events, &mut seen, "the long turn's init", |e| {
        matches!(&e.payload, Some(P::SessionStarted(_)))
    })
    .await;
    // Written to the CLI's stdin (answered), but queued behind the running turn.
    let queued = send_with_id(&mut c, &s.id, "fake:recall", "m-queued").await;
    assert!(!queued.duplicate);
    daemon.kill9();
    drop(events);

    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let queued = Sent {
        prompt: "fake:recall",
        id: "m-queued",
        answer: queued,
    };
    let taken = Sent {
        prompt: "fake:sleep 600000",
        id: "m-taken",
        answer: taken,
    };
    let seen = retry_after_restart(&mut c, &s.id, &queued, &taken).await;
    let answer: Vec<&str> = seen.iter().filter_map(assistant_text).collect();
    assert!(
        answer.contains(&"fake:sleep 600000"),
        "the resumed conversation holds the taken message and not the queued one: {answer:?}"
    );
    drop(daemon);
}

/// Whether a CLI transcript under `home` mentions `text`.
fn transcripts_mention(home: &std::path::Path, text: &str) -> bool {
    let Ok(projects) = std::fs::read_dir(home.join(".claude").join("projects")) else {
        return false;
    };
    projects.flatten().any(|p| {
        std::fs::read_dir(p.path())
            .into_iter()
            .flatten()
            .flatten()
            .any(|f| {
                f.path().extension().is_some_and(|e| e == "jsonl")
                    && std::fs::read_to_string(f.path()).is_ok_and(|t| t.contains(text))
            })
    })
}

/// The real CLI's side of it (2.1.332): a turn held at the fake model, a second message
/// the CLI has queued behind it (its `command_lifecycle` says `queued`, so it is in the
/// CLI's memory, not in its pipe), then kill -9 of the daemon (the CLI dies with it). The
/// transcript has the first message only, so the second one is failed at the resume and its
/// retry starts a turn; the first stays taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_with_a_message_queued_in_the_real_cli_frees_its_id() {
    const HELD: &str = r#"
default_text = "OK."

[[model]]
name = "held"
when = { last_user_text_contains = "HOLD-THIS-TURN" }
hold_until = "never"
blocks = [{ type = "text", text = "late" }]
"#;
    let world = World::with_scenario(NEW, HELD).await;
    let mut daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "q").await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    let lifecycle = |id: String, state: &'static str| move |e: &pb::SessionEvent| matches!(&e.payload, Some(P::MessageLifecycle(l)) if l.message_id == id && l.state == state);
    // A first complete turn: the CLI writes its transcript.
    send_with_id(&mut c, &s.id, "hello", "m-first").await;
    read_until(
        &mut events,
        &mut seen,
        "the first turn's end",
        is_turn_completed,
    )
    .await;
    let asked = world.fake.requests().len();
    let taken = send_with_id(&mut c, &s.id, "HOLD-THIS-TURN", "m-taken").await;
    read_until(
        &mut events,
        &mut seen,
        "the held turn starts",
        lifecycle(taken.message_id.clone(), "started"),
    )
    .await;
    assert!(
        world.fake.wait_for_requests(asked + 1, guard()).await > asked,
        "the held turn asks the model"
    );
    // The CLI writes the message to its transcript around that request; the file has no
    // event to await, so it is looked at until the entry is there.
    let deadline = std::time::Instant::now() + guard();
    while !transcripts_mention(&world.home, &taken.message_id) {
        assert!(
            std::time::Instant::now() < deadline,
            "the CLI's transcript never got the held message"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let queued = send_with_id(&mut c, &s.id, "second message", "m-queued").await;
    read_until(
        &mut events,
        &mut seen,
        "the CLI queues the second message",
        lifecycle(queued.message_id.clone(), "queued"),
    )
    .await;
    daemon.kill9();
    drop(events);

    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let queued = Sent {
        prompt: "second message",
        id: "m-queued",
        answer: queued,
    };
    let taken = Sent {
        prompt: "HOLD-THIS-TURN",
        id: "m-taken",
        answer: taken,
    };
    retry_after_restart(&mut c, &s.id, &queued, &taken).await;
    drop(daemon);
}

/// Messages the real CLI (2.1.332) queued together behind a running turn run as one turn,
/// and its transcript keeps them as one entry: the last message's uuid, the others in
/// `mergedSendUuids`. None of them is failed at the next resume (they were answered; a
/// retry would put them into the conversation twice) and each retry is the duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn messages_the_cli_merged_into_one_turn_are_not_failed_at_the_resume() {
    const HELD: &str = r#"
default_text = "OK."

[[model]]
name = "held"
when = { last_user_text_contains = "HOLD-THIS-TURN" }
hold_until = "go"
blocks = [{ type = "text", text = "released" }]
"#;
    let world = World::with_scenario(NEW, HELD).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "q").await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    let lifecycle = |id: String, state: &'static str| move |e: &pb::SessionEvent| matches!(&e.payload, Some(P::MessageLifecycle(l)) if l.message_id == id && l.state == state);
    let held = send_with_id(&mut c, &s.id, "HOLD-THIS-TURN", "m-held").await;
    read_until(
        &mut events,
        &mut seen,
        "the held turn starts",
        lifecycle(held.message_id.clone(), "started"),
    )
    .await;
    let mut queued = Vec::new();
    for (i, id) in ["m-q0", "m-q1", "m-q2"].into_iter().enumerate() {
        let sent = send_with_id(&mut c, &s.id, &format!("queued {i}"), id).await;
        read_until(
            &mut events,
            &mut seen,
            "the CLI queues the message",
            lifecycle(sent.message_id.clone(), "queued"),
        )
        .await;
        queued.push((id, sent));
    }
    world.fake.signal("go");
    // Every queued message is named by a finished turn.
    let mut answered = std::collections::HashSet::new();
    while !queued.iter().all(|(_, q)| answered.contains(&q.message_id)) {
        let e = read_until(
            &mut events,
            &mut seen,
            "the queued turns end",
            is_turn_completed,
        )
        .await;
        if let Some(P::TurnCompleted(t)) = &e.payload {
            answered.extend(t.user_message_ids.iter().cloned());
        }
    }
    assert!(
        transcripts_mention(&world.home, "mergedSendUuids"),
        "2.1.332 merges messages queued together into one transcript entry (what this test is about)"
    );
    drop(events);
    stop_and_resume(&mut c, &s.id).await;
    let failed: Vec<String> = history(&mut c, &s.id)
        .await
        .iter()
        .filter_map(|e| match &e.payload {
            Some(P::EngineNotice(n)) if n.code == "delivery_failed" => Some(n.data_json.clone()),
            _ => None,
        })
        .collect();
    assert!(failed.is_empty(), "answered messages failed: {failed:?}");
    for (id, q) in &queued {
        let again = send_with_id(&mut c, &s.id, "retry", id).await;
        assert!(
            again.duplicate && again.seq == q.seq,
            "the retry of {id} is the duplicate: {again:?}"
        );
    }
    drop(daemon);
}
