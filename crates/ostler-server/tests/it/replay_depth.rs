//! Replay equals live for JSON nested past serde_json's recursion limit: the stored-event
//! codec (`EventPayload::encode_stored` / `decode_stored`, what the engine's hub writes and
//! replay reads) gives back exactly the payload that was published live, at 126, 127, 500
//! and 5,000 levels, without overflowing the stack.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use ostler_engine::{EventPayload, PermissionRequested};
use ostler_protocol::{
    AssistantBlock, CliRequest, ContentBlock, ControlOutcome, ControlRequest, ControlResponse,
    RawJson, SystemNotice,
};

/// JSON nested `depth` levels (objects and arrays alternating) around a string.
fn nested(depth: usize) -> String {
    let mut s = String::new();
    for i in 0..depth {
        s.push_str(if i % 2 == 0 { "{\"k\":" } else { "[" });
    }
    s.push_str("\"leaf\"");
    for i in (0..depth).rev() {
        s.push(if i % 2 == 0 { '}' } else { ']' });
    }
    s
}

fn block(b: ContentBlock) -> EventPayload {
    EventPayload::AssistantBlock(AssistantBlock {
        message_id: Some("msg_1".into()),
        index: 0,
        parent_tool_use_id: None,
        model: Some("m".into()),
        block: b,
        stop_reason: None,
        usage: None,
        error: None,
        agent_id: None,
        subagent_type: None,
        task_description: None,
    })
}

/// Payloads the engine publishes live for a CLI message nested `depth` levels deep.
fn payloads(depth: usize) -> Vec<EventPayload> {
    let raw = RawJson::from_string(nested(depth)).unwrap();
    let mut v = vec![
        // A tool_use block whose input is past the decoder's limit is kept whole.
        block(ContentBlock::Other {
            block_type: "tool_use".into(),
            raw: raw.clone(),
        }),
        // A can_use_tool with such an input is kept whole (and answered with an error).
        EventPayload::CliControlRequest(ControlRequest {
            request_id: "req_1".into(),
            request: CliRequest::Other {
                request_subtype: "can_use_tool".into(),
                raw: raw.clone(),
            },
        }),
        EventPayload::ControlResponse(ControlResponse {
            request_id: "req_2".into(),
            outcome: ControlOutcome::Success {
                response: Some(raw.clone()),
            },
        }),
        EventPayload::SystemNotice(SystemNotice {
            source_type: "system".into(),
            subtype: Some("deep".into()),
            parent_tool_use_id: None,
            fields: raw.clone(),
            detail: None,
        }),
    ];
    if depth < 128 {
        // Inputs the decoder parses (up to 127 levels) are values, one or two levels
        // deeper once wrapped in the stored event.
        let value: serde_json::Value = serde_json::from_str(raw.get()).unwrap();
        v.push(block(ContentBlock::ToolUse {
            id: "toolu_1".into(),
            name: "Deep".into(),
            input: value.clone(),
        }));
        v.push(EventPayload::PermissionRequested(PermissionRequested {
            request_id: "req_3".into(),
            tool_name: "Deep".into(),
            input: value,
            tool_use_id: Some("toolu_1".into()),
            description: None,
            display_name: None,
            blocked_path: None,
            decision_reason: None,
            suggestions: None,
            expires_at_ms: None,
            agent_id: None,
        }));
    }
    v
}

#[test]
fn stored_events_read_back_as_published_at_any_depth() {
    for depth in [126, 127, 500, 5_000] {
        let mut unreadable_before = 0;
        for p in payloads(depth) {
            let stored = p.encode_stored().unwrap();
            // serde_json with its recursion limit (the codec before) cannot read it.
            if serde_json::from_slice::<serde_json::Value>(&stored).is_err() {
                unreadable_before += 1;
            }
            let back = EventPayload::decode_stored(p.kind(), &stored)
                .unwrap_or_else(|e| panic!("depth {depth}, {}: {e}", p.kind()));
            assert_eq!(back, p, "depth {depth}, {}", p.kind());
            // The tagged form (read through serde's buffering) too.
            let back: EventPayload = ostler_protocol::from_slice_any_depth(&tagged(&p)).unwrap();
            assert_eq!(back, p, "tagged, depth {depth}, {}", p.kind());
        }
        assert!(
            unreadable_before > 0,
            "depth {depth}: nothing here was unreadable before, the test proves nothing"
        );
    }
}

/// The tagged form (`{"kind":...}`), which serde reads through its buffering.
fn tagged(p: &EventPayload) -> Vec<u8> {
    serde_json::to_vec(p).unwrap()
}

#[test]
fn damaged_or_absurdly_deep_payloads_are_errors_not_crashes() {
    let deep = "[".repeat(ostler_protocol::MAX_READ_DEPTH + 10);
    assert!(EventPayload::decode_stored("system_notice", deep.as_bytes()).is_err());
    let half = format!("{{\"fields\":{}", "[".repeat(20_000));
    assert!(EventPayload::decode_stored("system_notice", half.as_bytes()).is_err());
}
