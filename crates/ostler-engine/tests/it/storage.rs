//! What the engine stores per event: the canonical payload always, the CLI's raw line at
//! most once (with the first stored event of its line, and not at all when the payload
//! already holds the line verbatim), live-only partials never.

use crate::common;

use std::collections::HashSet;

use common::*;
use ostler_engine::*;

#[tokio::test(flavor = "multi_thread")]
async fn raw_lines_stored_once_partials_never() {
    let env = Env::new(NEW, scenarios(&["plain_text", "tool_allowed"])).await;
    let s = env.session(None).await;
    let mut sub = env.follow(&s.id, 0).await;
    env.send(&s.id, "Say hello.").await;
    until(&mut sub, is_turn_end).await;
    env.send(&s.id, "Create the file allowed.txt please.").await;
    let (req, _) = until(&mut sub, is_kind("permission_requested")).await;
    let EventPayload::PermissionRequested(p) = &req.payload else {
        unreachable!()
    };
    env.engine
        .respond_permission(
            &s.id,
            &p.request_id,
            PermissionResponse::Allow {
                updated_input: None,
                remember: vec![],
                updated_permissions: None,
            },
            ClientRef::new("alice"),
        )
        .await
        .expect("allow");
    until(&mut sub, is_turn_end).await;

    let stored = env.store.events_after(&s.id, 0, 10_000).expect("read");
    let mut raws = HashSet::new();
    let (mut payload_bytes, mut raw_bytes) = (0usize, 0usize);
    for ev in &stored {
        assert!(
            !matches!(ev.kind.as_ref(), "partial_delta" | "stream_marker"),
            "live-only event stored at seq {}",
            ev.seq
        );
        payload_bytes += ev.payload.len();
        if let Some(raw) = &ev.raw {
            raw_bytes += raw.len();
            assert!(
                raws.insert(raw.clone()),
                "raw line stored twice (seq {})",
                ev.seq
            );
            assert!(
                !matches!(ev.kind.as_ref(), "unknown" | "system_notice"),
                "payload already holds the line, raw is redundant (seq {})",
                ev.seq
            );
        }
        // Events ostler originates have no raw line.
        if matches!(
            ev.kind.as_ref(),
            "state_changed" | "user_message_sent" | "interaction_resolved" | "engine_notice"
        ) {
            assert!(ev.raw.is_none(), "{} has a raw line", ev.kind);
        }
        // The canonical payload round-trips.
        let p = EventPayload::decode_stored(&ev.kind, &ev.payload).expect("payload decodes");
        assert_eq!(p.kind(), ev.kind.as_ref());
    }
    // CLI-originated events keep their raw line (the permission request, assistant blocks).
    assert!(
        stored
            .iter()
            .any(|e| e.kind.as_ref() == "permission_requested" && e.raw.is_some())
    );
    assert!(
        stored
            .iter()
            .any(|e| e.kind.as_ref() == "assistant_block" && e.raw.is_some())
    );
    eprintln!(
        "storage: {} events, payload {payload_bytes} B, raw {raw_bytes} B ({} raw lines), raw/payload = {:.2}",
        stored.len(),
        raws.len(),
        raw_bytes as f64 / payload_bytes.max(1) as f64
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn raw_lines_can_be_switched_off() {
    let env = Env::with(NEW, scenario("plain_text"), |o| o.store_raw_lines = false).await;
    let s = env.session(Some("Say hello.")).await;
    let mut sub = env.follow(&s.id, 0).await;
    let (_, evs) = until(&mut sub, is_turn_end).await;
    assert!(evs.iter().any(|e| e.payload.kind() == "assistant_block"));
    let stored = env.store.events_after(&s.id, 0, 10_000).expect("read");
    assert!(!stored.is_empty());
    assert!(stored.iter().all(|e| e.raw.is_none()));
}
