//! Hostile input into framer + decoder: random bytes, truncated lines, invalid UTF-8,
//! 50 MB lines, deeply nested JSON. No panic, bounded memory, and the stream goes on (a
//! valid line after the hostile one still decodes).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
use ostler_protocol::framing::{FramerOptions, LineFramer};
use ostler_protocol::{CliRequest, ContentBlock, Decoder, DiagnosticCode, Event};
use proptest::prelude::*;

const KEEP_ALIVE: &[u8] = b"{\"type\":\"keep_alive\"}\n";

/// Feed `chunks` then a valid line; check the buffer bound after every push and that the
/// valid line comes out last.
fn feed(cap: usize, chunks: &[Vec<u8>]) -> Vec<Event> {
    let mut framer = LineFramer::new(FramerOptions {
        max_payload_bytes: cap,
    });
    let mut decoder = Decoder::for_release(None);
    let mut frames = Vec::new();
    let mut events = Vec::new();
    for c in chunks {
        framer.push(c, &mut frames);
        assert!(
            framer.buffer_capacity() <= cap + c.len(),
            "buffer capacity {} > cap {cap} + chunk {}",
            framer.buffer_capacity(),
            c.len()
        );
        for f in frames.drain(..) {
            events.extend(decoder.decode(f).events);
        }
    }
    // Terminate whatever was pending, then a valid line.
    framer.push(b"\n", &mut frames);
    framer.push(KEEP_ALIVE, &mut frames);
    framer.finish(&mut frames);
    for f in frames.drain(..) {
        events.extend(decoder.decode(f).events);
    }
    assert_eq!(
        events.last(),
        Some(&Event::KeepAlive),
        "stream did not go on"
    );
    events
}

fn fixture_lines() -> Vec<Vec<u8>> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let mut out = Vec::new();
    for name in ["2.1.330-partial-tool.ndjson", "1.0.128-tool.ndjson"] {
        let text = std::fs::read(format!("{dir}/{name}")).unwrap();
        out.extend(text.split(|b| *b == b'\n').map(<[u8]>::to_vec));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_in_random_chunks(
        data in proptest::collection::vec(any::<u8>(), 0..4096),
        cuts in proptest::collection::vec(1usize..300, 1..40),
        cap in 32usize..2048,
    ) {
        let mut chunks = Vec::new();
        let mut rest = &data[..];
        for c in cuts.iter().cycle() {
            if rest.is_empty() { break; }
            let n = (*c).min(rest.len());
            chunks.push(rest[..n].to_vec());
            rest = &rest[n..];
        }
        feed(cap, &chunks);
    }

    #[test]
    fn real_lines_truncated_and_corrupted(
        picks in proptest::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), any::<u8>(), any::<bool>()), 1..20),
        chunk in 1usize..512,
    ) {
        let lines = fixture_lines();
        let mut stream = Vec::new();
        for (line_ix, cut_ix, byte, corrupt) in picks {
            let line = line_ix.get(&lines);
            if line.is_empty() { continue; }
            let cut = cut_ix.index(line.len());
            let mut l = line[..cut].to_vec();
            if corrupt && !l.is_empty() {
                // Invalid UTF-8 / garbage somewhere inside.
                let at = cut_ix.index(l.len());
                l[at] = byte | 0x80;
            }
            stream.extend_from_slice(&l);
            stream.push(b'\n');
        }
        let chunks: Vec<Vec<u8>> = stream.chunks(chunk).map(<[u8]>::to_vec).collect();
        feed(10 * 1024 * 1024, &chunks);
    }

    #[test]
    fn arbitrary_json_values_never_panic(v in arb_json()) {
        let mut line = serde_json::to_vec(&v).unwrap();
        line.push(b'\n');
        feed(1 << 20, &[line]);
    }
}

fn arb_json() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::{Value, json};
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|i| json!(i)),
        "[a-z_]{0,12}".prop_map(Value::String),
        prop::sample::select(vec![
            "system",
            "init",
            "assistant",
            "user",
            "result",
            "stream_event",
            "control_request",
            "control_response",
            "can_use_tool",
            "tool_result",
            "tool_use",
            "text",
            "success",
            "message_start",
            "content_block_delta",
            "keep_alive",
        ])
        .prop_map(|s| Value::String(s.to_string())),
    ];
    let keys = prop::sample::select(vec![
        "type",
        "subtype",
        "message",
        "content",
        "event",
        "delta",
        "request",
        "response",
        "request_id",
        "id",
        "index",
        "usage",
        "input",
        "tool_use_id",
        "result",
        "is_error",
        "text",
        "parent_tool_use_id",
        "session_id",
        "tools",
        "errors",
        "permission_denials",
    ]);
    leaf.prop_recursive(6, 64, 8, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec((keys.clone(), inner), 0..8).prop_map(|kv| {
                Value::Object(kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            }),
        ]
    })
}

#[test]
fn fifty_megabyte_line_is_bounded_and_reported() {
    let cap = ostler_protocol::DEFAULT_MAX_PAYLOAD_BYTES;
    let chunk_size = 64 * 1024;
    let mut framer = LineFramer::new(FramerOptions::default());
    let mut decoder = Decoder::for_release(None);
    let mut frames = Vec::new();
    let head = br#"{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_big","type":"tool_result","content":""#;
    framer.push(head, &mut frames);
    let filler = vec![b'a'; chunk_size];
    let total: usize = 50 * 1024 * 1024;
    let mut sent = head.len();
    while sent < total {
        framer.push(&filler, &mut frames);
        sent += filler.len();
        assert!(framer.buffer_capacity() <= cap + chunk_size);
        assert!(frames.is_empty());
    }
    framer.push(b"\"}]}}\n", &mut frames);
    framer.push(KEEP_ALIVE, &mut frames);
    assert_eq!(frames.len(), 2);
    let first = decoder.decode(frames.remove(0));
    let Event::Truncated(t) = &first.events[0] else {
        panic!("{:?}", first.events)
    };
    assert_eq!(t.original_size, (sent + 5) as u64);
    assert_eq!(t.message_type.as_deref(), Some("user"));
    assert!(
        t.ids
            .contains(&("tool_use_id".to_string(), "toolu_big".to_string()))
    );
    assert!(t.marker.starts_with("[truncated: original_size="));
    assert!(first.raw.len() <= ostler_protocol::framing::OVERSIZED_HEAD_BYTES);
    assert_eq!(decoder.decode(frames.remove(0)).events, [Event::KeepAlive]);
}

fn nested(depth: usize) -> String {
    format!(
        r#"{{"type":"assistant","message":{{"id":"m","content":[{{"type":"tool_use","id":"t","name":"X","input":{}{}}}]}}}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    )
}

#[test]
fn serde_json_recursion_limit_protects_against_deep_nesting() {
    // The library claim: building a value tree stops at 128 levels with an error.
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    assert!(serde_json::from_str::<serde_json::Value>(&deep(127)).is_ok());
    let err = serde_json::from_str::<serde_json::Value>(&deep(129)).unwrap_err();
    assert!(
        err.to_string().contains("recursion limit exceeded"),
        "{err}"
    );

    // Within the limit: the tool input decodes.
    let ok = feed(1 << 20, &[nested(100).into_bytes()]);
    assert!(
        ok.iter().any(|e| matches!(e, Event::AssistantBlock(b) if matches!(b.block, ContentBlock::ToolUse { .. }))),
        "{ok:?}"
    );
    // Over the limit, up to a million levels: no stack overflow, nothing invented (the
    // block is kept whole as Other), and the stream goes on.
    for depth in [130usize, 10_000, 1_000_000] {
        let ev = feed(8 << 20, &[nested(depth).into_bytes()]);
        let Some(Event::AssistantBlock(b)) = ev.first() else {
            panic!("depth {depth}: {ev:?}")
        };
        let ContentBlock::Other { block_type, raw } = &b.block else {
            panic!("depth {depth}: {:?}", b.block)
        };
        assert_eq!(block_type, "tool_use");
        assert!(raw.get().len() > 2 * depth);
    }
    // The same inside a permission request: kept whole, never acted on with a guess.
    let line = format!(
        r#"{{"type":"control_request","request_id":"r","request":{{"subtype":"can_use_tool","tool_name":"Bash","input":{}}}}}"#,
        deep(5_000)
    );
    let ev = feed(1 << 20, &[line.into_bytes()]);
    assert!(
        matches!(&ev[0], Event::ControlRequest(c) if matches!(&c.request, CliRequest::Other { request_subtype, .. } if request_subtype == "can_use_tool")),
        "{ev:?}"
    );
    // Unterminated deep nesting in an unknown type and at top level: diagnostics.
    let ev = feed(
        8 << 20,
        &[format!(r#"{{"type":"zzz","a":{}"#, "{\"a\":".repeat(100_000)).into_bytes()],
    );
    assert!(matches!(ev.first(), Some(Event::Diagnostic(_))));
    let ev = feed(8 << 20, &[deep(1_000_000).into_bytes()]);
    assert!(
        matches!(ev.first(), Some(Event::Diagnostic(d)) if d.code == DiagnosticCode::NotAMessage)
    );
    // A deep but complete unknown message is kept whole.
    let ev = feed(
        8 << 20,
        &[format!(r#"{{"type":"zzz","a":{}}}"#, deep(100_000)).into_bytes()],
    );
    assert!(matches!(ev.first(), Some(Event::Unknown(u)) if u.message_type == "zzz"));
}
