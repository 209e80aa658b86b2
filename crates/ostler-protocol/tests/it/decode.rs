//! Decoder behaviour: real CLI lines (fixtures captured from 1.0.128, 2.0.77, 2.1.0 and
//! 2.1.330 against a loopback model server) and hand-written tolerant-reader cases.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
use bytes::Bytes;
use ostler_protocol::framing::{Frame, FramerOptions, LineFramer};
use ostler_protocol::*;
use semver::Version;
use serde_json::json;

fn decoder(release: &str) -> Decoder {
    Decoder::for_release(Some(&Version::parse(release).unwrap()))
}

fn decode_lines(d: &mut Decoder, text: &str) -> Vec<Event> {
    let mut framer = LineFramer::new(FramerOptions::default());
    let mut frames = Vec::new();
    framer.push(text.as_bytes(), &mut frames);
    framer.finish(&mut frames);
    frames
        .into_iter()
        .flat_map(|f| d.decode(f).events)
        .collect()
}

fn one(release: &str, line: serde_json::Value) -> Vec<Event> {
    decode_lines(&mut decoder(release), &line.to_string())
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/tests/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn blocks(events: &[Event]) -> Vec<(Option<String>, u32, ContentBlock)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::AssistantBlock(b) => Some((b.message_id.clone(), b.index, b.block.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn real_fixtures_decode_without_diagnostics_or_unknowns() {
    for (file, release) in [
        ("1.0.128-tool.ndjson", "1.0.128"),
        ("1.0.128-partial-tool.ndjson", "1.0.128"),
        ("2.0.77-tool.ndjson", "2.0.77"),
        ("2.1.0-tool.ndjson", "2.1.0"),
        ("2.1.330-tool.ndjson", "2.1.330"),
        ("2.1.330-partial-tool.ndjson", "2.1.330"),
    ] {
        let mut d = decoder(release);
        let events = decode_lines(&mut d, &fixture(file));
        let bad: Vec<_> = events
            .iter()
            .filter(|e| matches!(e, Event::Diagnostic(_) | Event::Unknown(_)))
            .collect();
        assert!(bad.is_empty(), "{file}: {bad:#?}");
        // Thinking, text, tool_use of the first message, then the final text: once each.
        let b = blocks(&events);
        let kinds: Vec<_> = b
            .iter()
            .map(|(_, i, blk)| {
                let t = match blk {
                    ContentBlock::Text { .. } => "text",
                    ContentBlock::Thinking { .. } => "thinking",
                    ContentBlock::ToolUse { .. } => "tool_use",
                    _ => "other",
                };
                (*i, t)
            })
            .collect();
        assert_eq!(
            kinds,
            [
                (0, "thinking"),
                (1, "text"),
                (2, "tool_use"),
                (0, "text"),
                (0, "text")
            ],
            "{file}"
        );
        let req = events
            .iter()
            .find_map(|e| match e {
                Event::ControlRequest(ControlRequest {
                    request: CliRequest::CanUseTool(c),
                    ..
                }) => Some(c.clone()),
                _ => None,
            })
            .expect("can_use_tool");
        assert_eq!(req.tool_name, "Bash");
        assert_eq!(req.input["command"], "touch foo.txt");
        if release == "1.0.128" {
            assert_eq!(req.tool_use_id, None);
            assert_eq!(req.absent, ["tool_use_id"]);
        } else {
            assert!(req.tool_use_id.as_deref().unwrap().starts_with("toolu_"));
            assert!(req.absent.is_empty());
        }
        let results: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                Event::TurnResult(r) => Some(r),
                _ => None,
            })
            .collect();
        assert_eq!(results.len(), 2, "{file}");
        assert_eq!(
            results[0].result.as_deref(),
            Some("Done, the file exists now.")
        );
        assert!(!results[0].is_error);
        let tool_results: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                Event::ToolResult(r) => Some(r),
                _ => None,
            })
            .collect();
        assert_eq!(tool_results.len(), 1);
        assert!(tool_results[0].tool_use_id.is_some());
        let started: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                Event::SessionStarted(s) => Some(s),
                _ => None,
            })
            .collect();
        assert!(!started.is_empty());
        assert!(started[0].tools.contains(&"Bash".to_string()));
        assert_eq!(started[0].permission_mode.as_deref(), Some("default"));
        match release {
            "1.0.128" => assert!(started[0].absent.contains(&"cli_version".to_string())),
            r => assert_eq!(started[0].cli_version.as_deref(), Some(r)),
        }
        if release == "2.1.330" {
            assert!(!started[0].capabilities.is_empty());
        }
    }
}

#[test]
fn per_block_frames_and_cumulative_snapshots_yield_the_same_blocks() {
    let a = json!({"type":"text","text":"a"});
    let b = json!({"type":"tool_use","id":"t1","name":"Bash","input":{"command":"ls"}});
    let c = json!({"type":"text","text":"c"});
    let frame = |content: serde_json::Value| {
        json!({"type":"assistant","message":{"id":"m1","content":content},"parent_tool_use_id":null})
            .to_string()
    };
    let per_block = [frame(json!([a])), frame(json!([b])), frame(json!([c]))].join("\n");
    let snapshots = [
        frame(json!([a])),
        frame(json!([a, b])),
        frame(json!([a, b, c])),
        frame(json!([a, b, c])),
    ]
    .join("\n");
    let x = blocks(&decode_lines(&mut decoder("2.1.330"), &per_block));
    let y = blocks(&decode_lines(&mut decoder("2.1.330"), &snapshots));
    assert_eq!(x.len(), 3);
    assert_eq!(x, y);
    assert_eq!(x.iter().map(|(_, i, _)| *i).collect::<Vec<_>>(), [0, 1, 2]);
    // A repeated per-block frame is not emitted twice.
    let again = [frame(json!([a])), frame(json!([a])), frame(json!([b]))].join("\n");
    assert_eq!(
        blocks(&decode_lines(&mut decoder("2.1.330"), &again)).len(),
        2
    );
}

#[test]
fn different_messages_are_not_deduplicated() {
    let f = |id: &str| {
        json!({"type":"assistant","message":{"id":id,"content":[{"type":"text","text":"OK"}]}})
            .to_string()
    };
    let events = decode_lines(&mut decoder("2.1.330"), &[f("m1"), f("m2")].join("\n"));
    assert_eq!(blocks(&events).len(), 2);
}

#[test]
fn a_repeated_frame_of_any_recent_message_is_recognised_by_its_whole_id() {
    // Ids as the CLI writes them: one length, a long shared prefix, differing late.
    let id = |i: usize| format!("msg_01XFDUDYJgAACzvnptvVoYEL{i:04}");
    let f = |id: Option<&str>, text: &str| {
        json!({"type":"assistant","message":{"id":id,"content":[{"type":"text","text":text}]}})
            .to_string()
    };
    let n = ostler_protocol::decode::DEDUP_MESSAGES;
    let mut lines: Vec<String> = (0..n).map(|i| f(Some(&id(i)), "OK")).collect();
    // Every recent message's frame again, newest first: nothing new.
    lines.extend((0..n).rev().map(|i| f(Some(&id(i)), "OK")));
    // A second block of the oldest recent message: new, at index 1 of that message.
    lines.push(f(Some(&id(0)), "more"));
    let events = decode_lines(&mut decoder("2.1.330"), &lines.join("\n"));
    let got = blocks(&events);
    assert_eq!(got.len(), n + 1, "{got:?}");
    let last = got.last().expect("blocks");
    assert_eq!(last.0.as_deref(), Some(id(0).as_str()));
    assert_eq!(last.1, 1);

    // A frame without an id is not taken for one with an id, and an id that differs
    // from a recent one only in its last byte is a message of its own.
    let lines = [
        f(Some(&id(7)), "OK"),
        f(None, "OK"),
        f(Some(&id(7)), "OK"),
        f(Some(&format!("{}X", &id(7)[..id(7).len() - 1])), "OK"),
    ];
    let got = blocks(&decode_lines(&mut decoder("2.1.330"), &lines.join("\n")));
    assert_eq!(got.len(), 3, "{got:?}");
}

#[test]
fn tolerant_reader_rules() {
    // Unknown fields ignored, numbers as strings, fields in any order.
    let ev = one(
        "2.1.330",
        json!({"zzz":{"deep":[1,2,3]},"num_turns":"3","duration_ms":"1200","total_cost_usd":"0.5",
               "usage":{"input_tokens":"10","output_tokens":5},"subtype":"success","is_error":false,
               "result":"done","type":"result"}),
    );
    let Event::TurnResult(r) = &ev[0] else {
        panic!("{ev:?}")
    };
    assert_eq!(r.num_turns, Some(3));
    assert_eq!(r.duration_ms, Some(1200));
    assert_eq!(r.total_cost_usd, Some(0.5));
    assert_eq!(r.usage.unwrap().input_tokens, 10);
    assert_eq!(r.result.as_deref(), Some("done"));
    assert!(r.absent.is_empty());

    // Wrong-typed optional fields read as absent instead of failing the line.
    let ev = one(
        "2.1.330",
        json!({"type":"system","subtype":"init","session_id":"s","model":42,"cwd":["x"],"tools":"nope"}),
    );
    let Event::SessionStarted(s) = &ev[0] else {
        panic!("{ev:?}")
    };
    assert_eq!(s.session_id, "s");
    assert_eq!(s.model, None);
    assert!(s.absent.contains(&"model".to_string()));
    assert!(s.absent.contains(&"tools".to_string()));
}

#[test]
fn double_encoded_result_and_error_subtypes() {
    let ev = one(
        "2.1.330",
        json!({"type":"result","subtype":"success","is_error":false,"result":"\"inner \\\"quoted\\\" text\""}),
    );
    let Event::TurnResult(r) = &ev[0] else {
        panic!()
    };
    assert_eq!(r.result.as_deref(), Some("inner \"quoted\" text"));

    let ev = one(
        "2.1.330",
        json!({"type":"result","subtype":"error_max_turns","errors":["too many"],
               "permission_denials":[{"tool_name":"Bash","tool_use_id":"t1","tool_input":{"command":"rm"}}]}),
    );
    let Event::TurnResult(r) = &ev[0] else {
        panic!()
    };
    assert!(r.is_error, "missing is_error defaults from the subtype");
    assert!(r.absent.contains(&"is_error".to_string()));
    assert_eq!(r.errors, ["too many"]);
    assert_eq!(r.permission_denials[0].tool_name, "Bash");
    assert_eq!(r.permission_denials[0].tool_use_id.as_deref(), Some("t1"));

    // API failure reported as success + is_error.
    let ev = one(
        "2.1.330",
        json!({"type":"result","subtype":"success","is_error":true,"result":"API Error: 500"}),
    );
    let Event::TurnResult(r) = &ev[0] else {
        panic!()
    };
    assert!(r.is_error);
    assert_eq!(r.subtype, "success");
}

#[test]
fn a_result_names_the_messages_it_answered() {
    let ids = |line: serde_json::Value| {
        let ev = one("2.1.332", line);
        let Event::TurnResult(r) = &ev[0] else {
            panic!("{ev:?}")
        };
        r.user_message_uuids.clone()
    };
    // Two queued messages answered in one turn (2.1.x): every id, in the order taken.
    assert_eq!(
        ids(json!({"type":"result","subtype":"success","is_error":false,
                   "user_message_uuid":"b","user_message_uuids":["a","b"]})),
        ["a", "b"]
    );
    // Only the single id.
    assert_eq!(
        ids(json!({"type":"result","subtype":"success","is_error":false,"user_message_uuid":"a"})),
        ["a"]
    );
    // Releases that do not say, and shapes that are not a list of strings: none, no guess.
    assert!(ids(json!({"type":"result","subtype":"success","is_error":false})).is_empty());
    assert_eq!(
        ids(json!({"type":"result","subtype":"success","is_error":false,
                   "user_message_uuids":["a", 7, null, "b"]})),
        ["a", "b"]
    );
    assert!(
        ids(json!({"type":"result","subtype":"success","is_error":false,
                   "user_message_uuids":{"a":1}}))
        .is_empty()
    );
}

#[test]
fn tool_result_content_is_polymorphic() {
    let ev = one(
        "2.1.330",
        json!({"type":"user","parent_tool_use_id":"toolu_parent","message":{"role":"user","content":[
            {"type":"tool_result","tool_use_id":"a","content":"text"},
            {"type":"tool_result","tool_use_id":"b","content":[{"type":"text","text":"x"}],"is_error":true},
            {"type":"tool_result","tool_use_id":"c","content":null},
            {"type":"tool_result","content":"no id"}
        ]}}),
    );
    let r: Vec<_> = ev
        .iter()
        .map(|e| match e {
            Event::ToolResult(t) => t.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(r[0].content, ToolResultContent::Text("text".into()));
    assert!(matches!(&r[1].content, ToolResultContent::Blocks(b) if b.get().contains("\"x\"")));
    assert!(r[1].is_error);
    assert_eq!(r[2].content, ToolResultContent::Null);
    assert_eq!(r[3].tool_use_id, None);
    assert_eq!(r[3].absent, ["tool_use_id"]);
    assert!(
        r.iter()
            .all(|t| t.parent_tool_use_id.as_deref() == Some("toolu_parent"))
    );
}

#[test]
fn user_messages_text_and_interrupt() {
    let ev = one(
        "2.1.330",
        json!({"type":"user","message":{"role":"user","content":[{"type":"text","text":"[Request interrupted by user]"}]}}),
    );
    let Event::UserMessage(u) = &ev[0] else {
        panic!()
    };
    assert_eq!(u.text.as_deref(), Some("[Request interrupted by user]"));
    let ev = one(
        "2.1.330",
        json!({"type":"user","isReplay":true,"message":{"role":"user","content":"hi"}}),
    );
    let Event::UserMessage(u) = &ev[0] else {
        panic!()
    };
    assert!(u.is_replay);
    assert_eq!(u.text.as_deref(), Some("hi"));
}

#[test]
fn control_messages() {
    let ev = one(
        "2.1.330",
        json!({"type":"control_request","request_id":"r1","request":{"subtype":"hook_callback","callback_id":"cb","input":{"a":1}}}),
    );
    assert!(
        matches!(&ev[0], Event::ControlRequest(ControlRequest { request_id, request: CliRequest::HookCallback(h) })
        if request_id == "r1" && h.callback_id == "cb")
    );
    let ev = one(
        "2.1.330",
        json!({"type":"control_request","request_id":"r2","request":{"subtype":"brand_new","x":1}}),
    );
    assert!(
        matches!(&ev[0], Event::ControlRequest(ControlRequest { request: CliRequest::Other { request_subtype, .. }, .. })
        if request_subtype == "brand_new")
    );
    let ev = one(
        "2.1.330",
        json!({"type":"control_cancel_request","request_id":"r1"}),
    );
    assert_eq!(
        ev[0],
        Event::ControlCancel(ControlCancel {
            request_id: "r1".into()
        })
    );
    let ev = one(
        "2.1.330",
        json!({"type":"control_response","response":{"subtype":"error","request_id":"q","error":"Unsupported","error_code":"unsupported_request"}}),
    );
    assert!(
        matches!(&ev[0], Event::ControlResponse(ControlResponse { request_id, outcome: ControlOutcome::Error { error_code: Some(c), .. } })
        if request_id == "q" && c == "unsupported_request")
    );
    let ev = one(
        "2.1.330",
        json!({"type":"control_response","response":{"subtype":"success","request_id":"q2","response":{"mode":"plan"}}}),
    );
    assert!(
        matches!(&ev[0], Event::ControlResponse(ControlResponse { outcome: ControlOutcome::Success { response: Some(r) }, .. })
        if r.get() == r#"{"mode":"plan"}"#)
    );
}

#[test]
fn ask_user_question_is_read_and_answered() {
    let ev = one(
        "2.1.330",
        json!({"type":"control_request","request_id":"r","request":{"subtype":"can_use_tool","tool_name":"AskUserQuestion","tool_use_id":"t",
            "input":{"questions":[
                {"question":"Which DB?","header":"DB","options":[{"label":"SQLite","description":"file"},{"label":"Postgres"}],"multiSelect":false},
                {"question":"Which?","options":["a","b"],"multi_select":true}]}}}),
    );
    let Event::ControlRequest(ControlRequest {
        request: CliRequest::CanUseTool(c),
        ..
    }) = &ev[0]
    else {
        panic!()
    };
    let q = c.questions().unwrap();
    assert_eq!(q.len(), 2);
    assert_eq!(q[0].options[0].label, "SQLite");
    assert_eq!(q[0].options[0].description.as_deref(), Some("file"));
    assert!(q[1].multi_select);
    assert_eq!(q[1].options[1].label, "b");
    let line = Outbound::answer(
        "r",
        c,
        &[
            ("Which DB?".into(), vec!["SQLite".into()]),
            ("Which?".into(), vec!["a".into(), "b".into()]),
        ],
    )
    .to_line();
    let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
    let r = &v["response"]["response"];
    assert_eq!(r["behavior"], "allow");
    assert_eq!(r["updatedInput"]["answers"]["Which DB?"], "SQLite");
    assert_eq!(r["updatedInput"]["answers"]["Which?"], "a, b");
    assert_eq!(r["updatedInput"]["questions"][0]["header"], "DB");
}

#[test]
fn stream_events_track_message_ids() {
    // 1.0.x: the id only in message_start; 2.1.x: api_message_id on every frame.
    let lines = [
        json!({"type":"stream_event","event":{"type":"message_start","message":{"id":"m9","usage":{"input_tokens":3}}}}),
        json!({"type":"stream_event","event":{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"tu","name":"Bash","input":{}}}}),
        json!({"type":"stream_event","event":{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"a\""}}}),
        json!({"type":"stream_event","api_message_id":"other","event":{"type":"content_block_delta","index":0,"delta":{"type":"citations_delta","citation":{}}}}),
        json!({"type":"stream_event","event":{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":7}}}),
        json!({"type":"stream_event","event":{"type":"brand_new_event"}}),
    ]
    .map(|v| v.to_string())
    .join("\n");
    let ev = decode_lines(&mut decoder("1.0.128"), &lines);
    assert!(
        matches!(&ev[0], Event::StreamMarker(m) if m.message_id.as_deref() == Some("m9") && m.usage.unwrap().input_tokens == 3)
    );
    assert!(
        matches!(&ev[1], Event::StreamMarker(m) if m.tool_use_id.as_deref() == Some("tu") && m.block_type.as_deref() == Some("tool_use"))
    );
    assert!(
        matches!(&ev[2], Event::PartialDelta(p) if p.message_id.as_deref() == Some("m9") && p.delta == Delta::InputJson("{\"a\"".into()))
    );
    assert!(
        matches!(&ev[3], Event::PartialDelta(p) if p.message_id.as_deref() == Some("other") && matches!(&p.delta, Delta::Other { delta_type, .. } if delta_type == "citations_delta"))
    );
    assert!(
        matches!(&ev[4], Event::StreamMarker(m) if m.stop_reason.as_deref() == Some("tool_use"))
    );
    assert!(
        matches!(&ev[5], Event::Unknown(u) if u.message_type == "stream_event/brand_new_event")
    );
}

#[test]
fn unknown_types_are_kept_whole_and_gated_by_adapter() {
    let line = json!({"type":"brand_new","payload":{"x":[1,2]}});
    let ev = one("2.1.330", line.clone());
    let Event::Unknown(u) = &ev[0] else { panic!() };
    assert_eq!(u.message_type, "brand_new");
    assert_eq!(u.raw.to_value().unwrap(), line);

    // A system subtype the adapter claims -> notice; one it does not -> Unknown.
    let status = json!({"type":"system","subtype":"status","status":"compacting"});
    assert!(
        matches!(&one("2.1.330", status.clone())[0], Event::SystemNotice(n) if n.subtype.as_deref() == Some("status"))
    );
    assert!(
        matches!(&one("1.0.128", status)[0], Event::Unknown(u) if u.message_type == "system/status")
    );
    let sub = json!({"type":"tool_progress","tool_use_id":"t","parent_tool_use_id":"p","elapsed_time_seconds":"2"});
    assert!(
        matches!(&one("2.1.330", sub)[0], Event::SystemNotice(n) if n.parent_tool_use_id.as_deref() == Some("p"))
    );
    assert_eq!(
        one("2.1.330", json!({"type":"keep_alive"})),
        [Event::KeepAlive]
    );
}

#[test]
fn diagnostics_never_stop_the_stream() {
    let input = "not json at all\n[1,2]\n{\"no_type\":1}\n{\"type\":\"assistant\",\"message\":\"str\"}\n\u{1b}[31mlog\n{\"type\":\"keep_alive\"}\n";
    let ev = decode_lines(&mut decoder("2.1.330"), input);
    let codes: Vec<_> = ev
        .iter()
        .filter_map(|e| match e {
            Event::Diagnostic(d) => Some(d.code),
            _ => None,
        })
        .collect();
    assert_eq!(
        codes,
        [
            DiagnosticCode::NotJson,
            DiagnosticCode::NotAMessage,
            DiagnosticCode::NotAMessage,
            DiagnosticCode::BadShape,
            DiagnosticCode::NotJson
        ]
    );
    // A known type with an unreadable shape is also kept whole.
    assert!(
        ev.iter()
            .any(|e| matches!(e, Event::Unknown(u) if u.message_type == "assistant"))
    );
    assert_eq!(ev.last(), Some(&Event::KeepAlive));
}

#[test]
fn oversized_line_becomes_truncated_event_and_stream_goes_on() {
    let mut framer = LineFramer::new(FramerOptions {
        max_payload_bytes: 1024,
    });
    // Field order as the CLI writes it (type first); json! would sort the keys.
    let big = format!(
        r#"{{"type":"user","message":{{"role":"user","content":[{{"tool_use_id":"toolu_9","type":"tool_result","content":"{}"}}]}},"session_id":"s"}}"#,
        "x".repeat(5000)
    );
    let mut frames = Vec::new();
    framer.push(
        format!("{big}\n{{\"type\":\"keep_alive\"}}\n").as_bytes(),
        &mut frames,
    );
    let mut d = decoder("2.1.330");
    let first = d.decode(frames[0].clone());
    let Event::Truncated(t) = &first.events[0] else {
        panic!("{:?}", first.events)
    };
    assert_eq!(t.message_type.as_deref(), Some("user"));
    assert_eq!(t.original_size, big.len() as u64);
    assert_eq!(t.ids, [("tool_use_id".to_string(), "toolu_9".to_string())]);
    assert_eq!(
        t.marker,
        format!("[truncated: original_size={} bytes]", big.len())
    );
    assert_eq!(d.decode(frames[1].clone()).events, [Event::KeepAlive]);
}

#[test]
fn raw_line_is_kept_without_copy_semantics_change() {
    let line = Bytes::from_static(br#"{"type":"keep_alive","extra":1}"#);
    let out = decoder("2.1.330").decode(Frame::Line(line.clone()));
    assert_eq!(out.raw, line);
}

#[test]
fn events_round_trip_through_serde() {
    let text = fixture("2.1.330-partial-tool.ndjson");
    let ev = decode_lines(&mut decoder("2.1.330"), &text);
    for e in ev {
        let s = serde_json::to_string(&e).unwrap();
        let back: Event = serde_json::from_str(&s).unwrap();
        assert_eq!(back, e, "{s}");
    }
}

#[test]
fn outbound_messages() {
    let v = |o: Outbound| -> serde_json::Value {
        let line = o.to_line();
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
        serde_json::from_slice(&line).unwrap()
    };
    assert_eq!(
        v(Outbound::user_text("hi", "")),
        json!({"type":"user","message":{"role":"user","content":"hi"},"parent_tool_use_id":null,"session_id":""})
    );
    assert_eq!(
        v(Outbound::User {
            content: outbound::UserContent::Blocks(vec![json!({"type":"text","text":"x"})]),
            parent_tool_use_id: Some("p".into()),
            session_id: "s".into(),
            uuid: None,
            delivery: outbound::Delivery::default(),
        })["message"]["content"][0]["text"],
        "x"
    );
    assert_eq!(
        v(Outbound::ControlResponse {
            request_id: "r".into(),
            body: outbound::ResponseBody::Allow {
                updated_input: json!({"command":"ls"}),
                updated_permissions: Some(
                    json!([{"type":"setMode","mode":"acceptEdits","destination":"session"}])
                )
            }
        }),
        json!({"type":"control_response","response":{"subtype":"success","request_id":"r","response":{
            "behavior":"allow","updatedInput":{"command":"ls"},
            "updatedPermissions":[{"type":"setMode","mode":"acceptEdits","destination":"session"}]}}})
    );
    assert_eq!(
        v(Outbound::deny("r", "", true))["response"]["response"],
        json!({"behavior":"deny","message":"Permission denied.","interrupt":true})
    );
    assert_eq!(
        v(Outbound::deny("r", "no", false))["response"]["response"],
        json!({"behavior":"deny","message":"no"})
    );
    assert_eq!(
        v(Outbound::ControlResponse {
            request_id: "r".into(),
            body: outbound::ResponseBody::Error {
                message: "bad".into()
            }
        }),
        json!({"type":"control_response","response":{"subtype":"error","request_id":"r","error":"bad"}})
    );
    let req = |r: outbound::OutRequest| {
        v(Outbound::ControlRequest {
            request_id: "q".into(),
            request: r,
        })
    };
    let mut init = serde_json::Map::new();
    init.insert("systemPrompt".into(), json!("be brief"));
    assert_eq!(
        req(outbound::OutRequest::Initialize(init)),
        json!({"type":"control_request","request_id":"q","request":{"subtype":"initialize","systemPrompt":"be brief"}})
    );
    assert_eq!(
        req(outbound::OutRequest::Interrupt)["request"],
        json!({"subtype":"interrupt"})
    );
    assert_eq!(
        req(outbound::OutRequest::SetModel(Some("opus".into())))["request"],
        json!({"subtype":"set_model","model":"opus"})
    );
    assert_eq!(
        req(outbound::OutRequest::SetModel(None))["request"],
        json!({"subtype":"set_model","model":"default"})
    );
    assert_eq!(
        req(outbound::OutRequest::SetPermissionMode("plan".into()))["request"],
        json!({"subtype":"set_permission_mode","mode":"plan"})
    );
    assert_eq!(
        req(outbound::OutRequest::SetMaxThinkingTokens(None))["request"],
        json!({"subtype":"set_max_thinking_tokens","max_thinking_tokens":null})
    );
    assert_eq!(
        req(outbound::OutRequest::SetMaxThinkingTokens(Some(1024)))["request"],
        json!({"subtype":"set_max_thinking_tokens","max_thinking_tokens":1024})
    );
    assert_eq!(
        req(outbound::OutRequest::McpStatus)["request"],
        json!({"subtype":"mcp_status"})
    );
    assert_eq!(
        v(Outbound::ControlCancel {
            request_id: "q".into()
        }),
        json!({"type":"control_cancel_request","request_id":"q"})
    );
    assert_eq!(v(Outbound::KeepAlive), json!({"type":"keep_alive"}));
}

#[test]
fn transcript_detects_recordings_and_reports_oversized_cli_lines() {
    use ostler_protocol::transcript::{Output, TranscriptDecoder};
    let big = "y".repeat(1000);
    let rec = format!(
        "{}\n{}\n{}\n{}\n{}\n",
        r#"{"ostler_recording":1,"release":"1.0.128","scenario":"t"}"#,
        r#"{"dir":"ostler","line":{"type":"user","message":{"role":"user","content":"hi"}}}"#,
        format_args!(
            r#"{{"dir":"cli","line":{{"type":"user","message":{{"role":"user","content":[{{"tool_use_id":"toolu_x","type":"tool_result","content":"{big}"}}]}}}}}}"#
        ),
        r#"{"dir":"cli","text":"a log line"}"#,
        r#"{"dir":"meta","event":"exit","code":0}"#,
    );
    let mut t = TranscriptDecoder::new(
        None,
        FramerOptions {
            max_payload_bytes: 300,
        },
    );
    let mut out = Vec::new();
    // Byte by byte: chunk boundaries anywhere.
    for b in rec.as_bytes() {
        t.push(std::slice::from_ref(b), &mut out);
    }
    t.finish(&mut out);
    let s = t.summary();
    assert!(s.recording);
    assert_eq!(s.adapter, "v1_0");
    assert_eq!(s.release.as_deref(), Some("1.0.128"));
    assert_eq!(
        (s.outbound, s.truncated, s.diagnostics, s.meta),
        (1, 1, 1, 1)
    );
    assert!(matches!(&out[0], Output::Outbound(_)));
    let Output::Event(Event::Truncated(tr)) = &out[1] else {
        panic!("{out:?}")
    };
    assert_eq!(tr.message_type.as_deref(), Some("user"));
    assert_eq!(tr.ids, [("tool_use_id".to_string(), "toolu_x".to_string())]);
}

mod dedup_property {
    use super::*;
    use proptest::prelude::*;

    fn block(i: u8, kind: u8) -> serde_json::Value {
        match kind % 3 {
            0 => json!({"type":"text","text":format!("text {i}")}),
            1 => json!({"type":"thinking","thinking":format!("thought {i}"),"signature":"s"}),
            _ => json!({"type":"tool_use","id":format!("toolu_{i}"),"name":"Bash","input":{"n":i}}),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

        /// Several messages (possibly interleaved, e.g. a sub-agent's), each sent as
        /// per-block frames or as cumulative snapshots (with repeats): the same blocks,
        /// with the same indices, come out once.
        #[test]
        fn per_block_and_snapshot_framings_agree(
            msgs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..6), 1..5),
            repeat in any::<bool>(),
        ) {
            let frame = |m: usize, content: Vec<serde_json::Value>| {
                json!({"type":"assistant","message":{"id":format!("msg_{m}"),"content":content}}).to_string()
            };
            let blocks_of = |m: usize| -> Vec<serde_json::Value> {
                msgs[m].iter().enumerate().map(|(i, k)| block((m * 10 + i) as u8, *k)).collect()
            };
            let mut per_block = Vec::new();
            let mut snapshots = Vec::new();
            let longest = msgs.iter().map(Vec::len).max().unwrap_or(0);
            // Interleave messages position by position.
            for pos in 0..longest {
                for m in 0..msgs.len() {
                    let b = blocks_of(m);
                    if pos < b.len() {
                        per_block.push(frame(m, vec![b[pos].clone()]));
                        snapshots.push(frame(m, b[..=pos].to_vec()));
                        if repeat {
                            per_block.push(frame(m, vec![b[pos].clone()]));
                            snapshots.push(frame(m, b[..=pos].to_vec()));
                        }
                    }
                }
            }
            let x = blocks(&decode_lines(&mut decoder("2.1.330"), &per_block.join("\n")));
            let y = blocks(&decode_lines(&mut decoder("2.1.330"), &snapshots.join("\n")));
            prop_assert_eq!(&x, &y);
            let total: usize = msgs.iter().map(Vec::len).sum();
            prop_assert_eq!(x.len(), total);
            for (m, msg) in msgs.iter().enumerate() {
                let idx: Vec<u32> = x.iter().filter(|(id, _, _)| id.as_deref() == Some(&format!("msg_{m}"))).map(|(_, i, _)| *i).collect();
                prop_assert_eq!(idx, (0..msg.len() as u32).collect::<Vec<_>>());
            }
        }
    }
}

#[test]
fn extended_questions_and_previews_are_read() {
    // 2.1.332 with CLAUDE_CODE_QUESTION_EXTENDED and CLAUDE_CODE_QUESTION_PREVIEW_FORMAT:
    // a form title, text and number questions, an option's preview.
    let ev = one(
        "2.1.332",
        json!({"type":"control_request","request_id":"r","request":{"subtype":"can_use_tool","tool_name":"AskUserQuestion","tool_use_id":"t",
            "input":{"title":"Before I build your deck","questions":[
                {"question":"Which layout?","header":"Layout","options":[{"label":"Grid","description":"tiles","preview":"<div>grid</div>"},{"label":"List"}]},
                {"question":"Deck name?","header":"Name","kind":"text","description":"Shown on the cover","placeholder":"Q3 review"},
                {"question":"How many slides?","header":"Slides","kind":"number","min":3,"max":20,"step":1,"defaultValue":8,"unit":"slides"}]}}}),
    );
    let Event::ControlRequest(ControlRequest {
        request: CliRequest::CanUseTool(c),
        ..
    }) = &ev[0]
    else {
        panic!()
    };
    let q = c.questions().unwrap();
    assert_eq!(q.len(), 3);
    assert_eq!(q[0].kind, None);
    assert_eq!(q[0].options[0].preview.as_deref(), Some("<div>grid</div>"));
    assert_eq!(q[0].options[1].preview, None);
    assert_eq!(q[1].kind.as_deref(), Some("text"));
    assert!(q[1].options.is_empty());
    assert_eq!(q[1].description.as_deref(), Some("Shown on the cover"));
    assert_eq!(q[1].placeholder.as_deref(), Some("Q3 review"));
    assert!(q[2].is_number());
    assert_eq!(
        (q[2].min, q[2].max, q[2].step, q[2].default_value),
        (Some(3.0), Some(20.0), Some(1.0), Some(8.0))
    );
    assert_eq!(q[2].unit.as_deref(), Some("slides"));
    let line = Outbound::answer(
        "r",
        c,
        &[
            ("Which layout?".into(), vec!["Grid".into()]),
            ("Deck name?".into(), vec!["Launch".into()]),
            ("How many slides?".into(), vec!["12".into()]),
        ],
    )
    .to_line();
    let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
    let answers = &v["response"]["response"]["updatedInput"]["answers"];
    assert_eq!(answers["Deck name?"], "Launch");
    assert_eq!(answers["How many slides?"], "12");
}
