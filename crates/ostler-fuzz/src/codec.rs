//! Target `codec`: the stored-event encoding round trip, and the outbound conversion.

use std::sync::Arc;

use ostler_engine::{EngineEvent, EventPayload};
use ostler_protocol::{Decoder, Event};
use proptest::prelude::*;
use proptest::sample::{Index, select};

use crate::generate::{Blob, apply_edits, byte_edits, json, message, mutated_line, text};
use crate::{Budget, Failure, Report, corpus, drive};

#[derive(Debug, Clone)]
struct Case {
    /// The CLI line fed to the decoder.
    line: Blob,
    release: Index,
    /// Damage applied to each encoded payload before decoding it again.
    damage: Vec<(usize, u8, u8)>,
}

/// A value for a typed field: usually of the wire's type, sometimes anything.
fn field(good: BoxedStrategy<serde_json::Value>) -> BoxedStrategy<Option<serde_json::Value>> {
    prop::option::of(prop_oneof![4 => good, 1 => json()]).boxed()
}

fn string_value() -> BoxedStrategy<serde_json::Value> {
    prop_oneof![
        select(
            &[
                "task-1",
                "completed",
                "allowed_warning",
                "auto",
                "",
                "requesting"
            ][..]
        )
        .prop_map(serde_json::Value::from),
        "\\PC{0,16}".prop_map(serde_json::Value::from),
    ]
    .boxed()
}

fn number_value() -> BoxedStrategy<serde_json::Value> {
    prop_oneof![
        any::<u32>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        "[0-9]{1,20}".prop_map(serde_json::Value::from),
    ]
    .boxed()
}

/// A notice of one of the typed shapes (task lifecycle, rate limit, compact boundary,
/// status, a result's `modelUsage`) with fields of the right type or not, present or not.
fn typed_notice() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::{Map, Value};
    let kind = select(
        &[
            "task_started",
            "task_progress",
            "task_notification",
            "compact_boundary",
            "status",
            "rate_limit_event",
            "result",
        ][..],
    );
    let strings = prop::collection::vec(field(string_value()), 6);
    let numbers = prop::collection::vec(field(number_value()), 4);
    (
        kind,
        strings,
        numbers,
        field(any::<bool>().prop_map(Value::from).boxed()),
    )
        .prop_map(|(kind, s, n, b)| {
            let mut m = Map::new();
            let mut put = |k: &str, v: &Option<Value>| {
                if let Some(v) = v {
                    m.insert(k.to_owned(), v.clone());
                }
            };
            let usage = |n: &[Option<Value>]| {
                let mut u = Map::new();
                for (k, v) in ["total_tokens", "tool_uses", "duration_ms"].iter().zip(n) {
                    if let Some(v) = v {
                        u.insert((*k).to_owned(), v.clone());
                    }
                }
                Some(Value::Object(u))
            };
            match kind {
                "rate_limit_event" => {
                    let mut info = Map::new();
                    for (k, v) in [("status", &s[0]), ("rateLimitType", &s[1])] {
                        if let Some(v) = v {
                            info.insert(k.to_owned(), v.clone());
                        }
                    }
                    for (k, v) in [("resetsAt", &n[0]), ("utilization", &n[1])] {
                        if let Some(v) = v {
                            info.insert(k.to_owned(), v.clone());
                        }
                    }
                    if let Some(v) = &b {
                        info.insert("isUsingOverage".into(), v.clone());
                    }
                    put("type", &Some(Value::from("rate_limit_event")));
                    put("rate_limit_info", &Some(Value::Object(info)));
                }
                "result" => {
                    let mut per = Map::new();
                    for (k, v) in ["inputTokens", "contextWindow", "costUSD", "outputTokens"]
                        .iter()
                        .zip(&n)
                    {
                        if let Some(v) = v {
                            per.insert((*k).to_owned(), v.clone());
                        }
                    }
                    let mut models = Map::new();
                    models.insert(
                        s[0].as_ref()
                            .and_then(Value::as_str)
                            .unwrap_or("m")
                            .to_owned(),
                        Value::Object(per),
                    );
                    put("type", &Some(Value::from("result")));
                    put("subtype", &Some(Value::from("success")));
                    put("is_error", &Some(Value::from(false)));
                    put("modelUsage", &Some(Value::Object(models)));
                    put("terminal_reason", &s[1]);
                }
                sub => {
                    put("type", &Some(Value::from("system")));
                    put("subtype", &Some(Value::from(sub)));
                    put("task_id", &s[0]);
                    put("tool_use_id", &s[1]);
                    put("description", &s[2]);
                    put("status", &s[3]);
                    put("summary", &s[4]);
                    put("permissionMode", &s[5]);
                    put("is_backgrounded", &b);
                    put("usage", &usage(&n));
                    let mut meta = Map::new();
                    if let Some(v) = &s[3] {
                        meta.insert("trigger".into(), v.clone());
                    }
                    if let Some(v) = &n[0] {
                        meta.insert("pre_tokens".into(), v.clone());
                    }
                    put("compact_metadata", &Some(Value::Object(meta)));
                }
            }
            Value::Object(m)
        })
}

fn case() -> impl Strategy<Value = Case> {
    let line = prop_oneof![
        3 => mutated_line().prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
        2 => message().prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
        2 => typed_notice().prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
        1 => text().prop_map(String::into_bytes),
    ];
    (line, any::<Index>(), byte_edits()).prop_map(|(line, release, damage)| Case {
        line: Blob(line),
        release,
        damage,
    })
}

/// The stored payload of a decoded event, as the engine records it (live-only and
/// control-flow events have none).
fn payload(ev: Event) -> Option<EventPayload> {
    Some(match ev {
        Event::SessionStarted(x) => EventPayload::SessionStarted(x),
        Event::AssistantBlock(x) => EventPayload::AssistantBlock(x),
        Event::PartialDelta(x) => EventPayload::PartialDelta(x),
        Event::StreamMarker(x) => EventPayload::StreamMarker(x),
        Event::UserMessage(x) => EventPayload::UserMessage(x),
        Event::ToolResult(x) => EventPayload::ToolResult(x),
        Event::ControlRequest(x) => EventPayload::CliControlRequest(x),
        Event::ControlResponse(x) => EventPayload::ControlResponse(x),
        Event::TurnResult(x) => EventPayload::TurnCompleted(x),
        Event::SystemNotice(x) => EventPayload::SystemNotice(x),
        Event::Truncated(x) => EventPayload::Truncated(x),
        Event::Diagnostic(x) => EventPayload::Diagnostic(x),
        Event::Unknown(x) => EventPayload::Unknown(x),
        Event::ControlCancel(_) | Event::KeepAlive => return None,
    })
}

/// encode -> decode gives the same payload, and encoding that again the same bytes.
fn round_trip(p: &EventPayload) -> Result<Vec<u8>, TestCaseError> {
    let bytes = p
        .encode_stored()
        .map_err(|e| TestCaseError::fail(format!("encoding {} failed: {e}", p.kind())))?;
    let back = EventPayload::decode_stored(p.kind(), &bytes).map_err(|e| {
        TestCaseError::fail(format!(
            "stored {} cannot be read back: {e}; stored: {}",
            p.kind(),
            crate::clip(String::from_utf8_lossy(&bytes).into_owned(), 2048)
        ))
    })?;
    prop_assert_eq!(&back, p);
    let again = back
        .encode_stored()
        .map_err(|e| TestCaseError::fail(format!("re-encoding failed: {e}")))?;
    prop_assert_eq!(&again, &bytes, "re-encoding differs");
    Ok(bytes)
}

fn check(c: Case) -> Result<(), TestCaseError> {
    let release = c.release.get(corpus::releases());
    let mut decoder = Decoder::for_release(release.as_ref());
    let mut events = Vec::new();
    decoder.decode_into(&c.line.0, &mut events);
    for ev in events {
        // A typed detail is what its own stored message says (replay equals live), and
        // per-model usage reads without panicking.
        if let Event::SystemNotice(n) = &ev {
            let again =
                ostler_protocol::notice_detail(&n.source_type, n.subtype.as_deref(), &n.fields.0);
            prop_assert_eq!(&again, &n.detail, "detail differs from its fields");
        }
        if let Event::TurnResult(r) = &ev {
            for m in r.models() {
                prop_assert!(m.cost_usd.is_finite(), "cost {}", m.cost_usd);
            }
        }
        let Some(p) = payload(ev) else { continue };
        let mut bytes = round_trip(&p)?;

        // What clients would get: the outbound conversion never panics.
        let event = EngineEvent {
            session_id: Arc::from("s"),
            seq: Some(1),
            ts_ms: 0,
            parent_tool_use_id: p.parent_tool_use_id().map(str::to_owned),
            payload: p.clone(),
            redelivered: false,
        };
        let _ = ostler_server::fuzzing::event_to_pb(&event);

        // A damaged stored payload: an error or a value, never a panic; a value it does
        // read is stable from then on.
        apply_edits(&mut bytes, &c.damage);
        if let Ok(q) = EventPayload::decode_stored(p.kind(), &bytes) {
            round_trip(&q)?;
        }
        // The tagged form (kind unknown to the column) is read the same way.
        if let Ok(q) = EventPayload::decode_stored("no_such_kind", &bytes) {
            round_trip(&q)?;
        }
    }
    Ok(())
}

/// Runs the codec target until the budget's deadline.
pub fn codec(budget: Budget) -> Result<Report, Failure> {
    drive("codec", budget, case(), check)
}
