//! Target `codec`: the stored-event encoding round trip, and the outbound conversion.

use std::sync::Arc;

use ostler_engine::{EngineEvent, EventPayload};
use ostler_protocol::{Decoder, Event};
use proptest::prelude::*;
use proptest::sample::Index;

use crate::generate::{Blob, apply_edits, byte_edits, message, mutated_line, text};
use crate::{Budget, Failure, Report, corpus, drive};

#[derive(Debug, Clone)]
struct Case {
    /// The CLI line fed to the decoder.
    line: Blob,
    release: Index,
    /// Damage applied to each encoded payload before decoding it again.
    damage: Vec<(usize, u8, u8)>,
}

fn case() -> impl Strategy<Value = Case> {
    let line = prop_oneof![
        3 => mutated_line().prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
        2 => message().prop_map(|v| serde_json::to_vec(&v).unwrap_or_default()),
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
