//! Persist-before-publish, many subscribers, gap-free replay + live, lag recovery.

use crate::common;

use common::*;
use ostler_engine::*;

async fn persisted_before_published(version: &'static str) {
    let env = Env::new(version, scenario("plain_text")).await;
    let s = env.session(None).await;
    let mut a = env.follow(&s.id, 0).await;
    let mut b = env.follow(&s.id, 0).await;
    env.send(&s.id, "Say hello.").await;

    // Every event a subscriber receives is already in the store when it arrives.
    let mut got_a = Vec::new();
    let r = tokio::time::timeout(timeout(), async {
        loop {
            let ev = a.next().await.expect("open").expect("event");
            let seq = ev.seq.expect("stored events only");
            let stored = env
                .store
                .events_after(&s.id, seq - 1, 1)
                .expect("store read");
            assert_eq!(stored.len(), 1, "seq {seq} visible before it was committed");
            assert_eq!(stored[0].kind.as_ref(), ev.payload.kind());
            got_a.push(ev.clone());
            if is_turn_end(&ev) {
                break;
            }
        }
    })
    .await;
    assert!(r.is_ok(), "timed out: {:?}", kinds(&got_a));
    let last = got_a.last().and_then(|e| e.seq).expect("last");
    assert_seqs(&got_a, 1, last);
    let kinds_a = kinds(&got_a);
    for k in [
        "engine_notice",
        "state_changed",
        "user_message_sent",
        "session_started",
        "assistant_block",
        "turn_completed",
    ] {
        assert!(
            kinds_a.iter().any(|x| x.ends_with(k)),
            "{k} missing in {kinds_a:?}"
        );
    }
    // The text answer arrived as an assistant block.
    assert!(got_a.iter().any(|e| matches!(&e.payload,
        EventPayload::AssistantBlock(b) if matches!(&b.block, ostler_protocol::ContentBlock::Text { text } if text.contains("Hello from the fake model")))));

    // The second subscriber sees the same events, in the same order.
    let (_, got_b) = until(&mut b, is_turn_end).await;
    assert_eq!(kinds(&got_b), kinds_a);
    assert!(
        got_a
            .iter()
            .zip(&got_b)
            .all(|(x, y)| std::sync::Arc::ptr_eq(x, y) || x == y)
    );

    // A later replay without follow is the same history and ends.
    let hist = env.history(&s.id).await;
    assert!(hist.len() as u64 >= last);
    assert_eq!(kinds(&hist[..last as usize]), kinds_a);

    // Subscribing after N delivers exactly N+1..=last.
    let mut sub = env
        .engine
        .subscribe(SubscribeRequest {
            session_id: s.id.clone(),
            after_seq: last / 2,
            include_partials: false,
            follow: false,
        })
        .await
        .expect("subscribe");
    let mut rest = Vec::new();
    while let Some(ev) = sub.next().await {
        rest.push(ev.expect("event"));
    }
    let end = rest.last().and_then(|e| e.seq).expect("rest");
    assert_seqs(&rest, last / 2 + 1, end);
}

#[tokio::test(flavor = "multi_thread")]
async fn persisted_before_published_new() {
    persisted_before_published(NEW).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn persisted_before_published_old() {
    persisted_before_published(OLD).await;
}

/// A subscriber that reconnects mid-stream with `after_seq` = the last seq it saw gets
/// every event exactly once, across two turns.
#[tokio::test(flavor = "multi_thread")]
async fn reconnect_mid_stream_sees_every_event_once() {
    let env = Env::new(NEW, scenario("two_turns")).await;
    let s = env.session(Some("What is 2+2?")).await;
    let mut first = env.follow(&s.id, 0).await;
    let mut seen = Vec::new();
    // Read a few events of the running turn, then "disconnect".
    for _ in 0..4 {
        seen.push(first.next().await.expect("open").expect("event"));
    }
    let resume_at = first.last_seq();
    drop(first);
    let mut second = env.follow(&s.id, resume_at).await;
    let (_, rest) = until(&mut second, is_turn_end).await;
    seen.extend(rest);
    env.send(&s.id, "And 3+3?").await;
    let (_, rest) = until(&mut second, is_turn_end).await;
    seen.extend(rest);
    let last = seen.last().and_then(|e| e.seq).expect("last");
    assert_seqs(&seen, 1, last);
    let answers: Vec<String> = seen
        .iter()
        .filter_map(|e| match &e.payload {
            EventPayload::AssistantBlock(b) => match &b.block {
                ostler_protocol::ContentBlock::Text { text } => Some(text.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    assert_eq!(
        answers,
        vec!["2+2 is 4.".to_string(), "3+3 is 6.".to_string()]
    );

    // Usage is per turn; the CLI's cost is cumulative per process: the session's total is
    // the last result's total, not the sum of both.
    let results: Vec<_> = seen
        .iter()
        .filter_map(|e| match &e.payload {
            EventPayload::TurnCompleted(t) => Some(t.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 2);
    let info = env.engine.get_session(&s.id).await.expect("get");
    assert_eq!(info.turns, 2);
    let last_total = results[1].total_cost_usd.expect("cost");
    assert!(
        (info.usage.cost_usd - last_total).abs() < 1e-9,
        "{info:?} vs {last_total}"
    );
    let input: u64 = results
        .iter()
        .map(|r| r.usage.expect("usage").input_tokens)
        .sum();
    assert_eq!(info.usage.input_tokens, input);
}

/// With a live buffer of one event, a subscriber that does not read falls behind; it still
/// gets every event in order (from the store), and the other subscriber is unaffected.
#[tokio::test(flavor = "multi_thread")]
async fn lagging_subscriber_continues_from_the_store() {
    let env = Env::with(NEW, scenario("two_turns"), |o| o.broadcast_capacity = 1).await;
    let s = env.session(None).await;
    let mut slow = env.follow(&s.id, 0).await;
    // Catch up with what exists (session_created, state_changed) so `slow` is live.
    let mut slow_seen = vec![slow.next().await.expect("open").expect("event")];
    slow_seen.push(slow.next().await.expect("open").expect("event"));
    let reads_before = slow.store_reads();

    let mut fast = env.follow(&s.id, 0).await;
    env.send(&s.id, "What is 2+2?").await;
    let (_, fast_seen) = until(&mut fast, is_turn_end).await;
    env.send(&s.id, "And 3+3?").await;
    let (_, fast_seen2) = until(&mut fast, is_turn_end).await;
    let fast_all: Vec<_> = fast_seen.into_iter().chain(fast_seen2).collect();
    let last = fast_all.last().and_then(|e| e.seq).expect("last");
    assert_seqs(&fast_all, 1, last);

    // Now the slow one reads everything.
    while slow_seen.last().and_then(|e| e.seq) != Some(last) {
        let ev = tokio::time::timeout(timeout(), slow.next())
            .await
            .expect("slow subscriber stalled")
            .expect("open")
            .expect("event");
        slow_seen.push(ev);
    }
    assert_seqs(&slow_seen, 1, last);
    assert!(
        slow.store_reads() > reads_before,
        "the lagging subscriber should have gone back to the store"
    );
    assert_eq!(kinds(&slow_seen), kinds(&fast_all));
}

/// Subscribing to an unknown session is NOT_FOUND.
#[tokio::test(flavor = "multi_thread")]
async fn subscribe_unknown_session_is_not_found() {
    let env = Env::new(NEW, scenario("plain_text")).await;
    let err = env
        .engine
        .subscribe(SubscribeRequest {
            session_id: "nope".into(),
            follow: true,
            ..Default::default()
        })
        .await
        .expect_err("unknown");
    assert_eq!(err.code_kind(), CodeKind::NotFound);

    // A position past the end of the log is a bad argument, not a silent wait.
    let s = env.session(None).await;
    let err = env
        .engine
        .subscribe(SubscribeRequest {
            session_id: s.id.clone(),
            after_seq: s.last_seq + 100,
            follow: true,
            ..Default::default()
        })
        .await
        .expect_err("beyond the end");
    assert_eq!(err.code_kind(), CodeKind::InvalidArgument);
}
