//! A tool's structured result (`tool_use_result`) and the permission facts of its call
//! (`tool_result_meta`), sent at the top level of the CLI's `user` frame beside its
//! `tool_result` block, reach the canonical `ToolResult` verbatim: data-driven over every
//! recorded `user` frame of the contract corpus (`contracts/claude-code/<release>/`), plus
//! the releases' own lines and the cases no release was seen sending.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
use crate::common;

use bytes::Bytes;
use common::{cli_lines, recordings, releases};
use ostler_protocol::*;
use semver::Version;
use serde_json::{Value, json};

/// The CLI's `user` lines with tool results in the recordings of `release`.
fn recorded_tool_result_lines(release: &str) -> Vec<Bytes> {
    let mut out = Vec::new();
    for f in recordings(release) {
        for line in cli_lines(&f) {
            let v: Value = serde_json::from_slice(&line).unwrap();
            let results = v["message"]["content"].as_array().map_or(0, |c| {
                c.iter().filter(|b| b["type"] == "tool_result").count()
            });
            if v["type"] == "user" && results > 0 {
                out.push(line);
            }
        }
    }
    out
}

fn decode(release: &str, line: &[u8]) -> Vec<ToolResult> {
    let mut d = Decoder::for_release(Some(&Version::parse(release).unwrap()));
    let mut events = Vec::new();
    d.decode_into(line, &mut events);
    events
        .into_iter()
        .filter_map(|e| match e {
            Event::ToolResult(t) => Some(t),
            _ => None,
        })
        .collect()
}

/// The top-level field `key` of `line` as the CLI wrote it (its bytes).
fn verbatim<'a>(line: &'a [u8], key: &str) -> Option<&'a str> {
    let top: std::collections::HashMap<&str, &serde_json::value::RawValue> =
        serde_json::from_slice(line).unwrap();
    top.get(key).map(|v| v.get())
}

/// Every recorded tool result of `release` carries the frame's fields, byte for byte;
/// returns how many frames had each.
fn check_release(release: &str) -> (usize, usize) {
    let lines = recorded_tool_result_lines(release);
    assert!(!lines.is_empty(), "{release}: no recorded tool results");
    let (mut with_result, mut with_meta) = (0, 0);
    for line in &lines {
        let results = decode(release, line);
        let ctx = String::from_utf8_lossy(line);
        // The CLI sends one tool result per frame (see `several_blocks_...` below).
        assert_eq!(results.len(), 1, "{release}: {ctx}");
        let t = &results[0];
        assert_eq!(
            t.tool_use_result.as_ref().map(|r| r.get()),
            verbatim(line, "tool_use_result"),
            "{release}: {ctx}"
        );
        assert_eq!(
            t.tool_result_meta.as_ref().map(|r| r.get()),
            verbatim(line, "tool_result_meta"),
            "{release}: {ctx}"
        );
        // The old spelling (the CLI's on-disk transcript) never reaches stdout.
        assert_eq!(verbatim(line, "toolUseResult"), None, "{release}: {ctx}");
        with_result += usize::from(t.tool_use_result.is_some());
        with_meta += usize::from(t.tool_result_meta.is_some());
    }
    (with_result, with_meta)
}

#[test]
fn recorded_tool_results_carry_the_structured_result_on_every_release() {
    let mut seen = Vec::new();
    for release in &releases() {
        if recorded_tool_result_lines(release).is_empty() {
            continue;
        }
        let (with_result, with_meta) = check_release(release);
        seen.push((release.clone(), with_result, with_meta));
    }
    let count = |r: &str| seen.iter().find(|s| s.0 == r).map(|s| (s.1, s.2));
    // 1.0.x sends neither; 2.0.x adds `tool_use_result`; 2.1.330 adds `tool_result_meta`.
    assert_eq!(count("1.0.128"), Some((0, 0)), "{seen:?}");
    assert!(
        count("2.0.77").is_some_and(|(r, m)| r > 0 && m == 0),
        "{seen:?}"
    );
    assert!(
        count("2.1.0").is_some_and(|(r, m)| r > 0 && m == 0),
        "{seen:?}"
    );
    assert!(
        count("2.1.332").is_some_and(|(r, m)| r > 0 && m > 0),
        "{seen:?}"
    );
}

fn tool_allowed(release: &str) -> ToolResult {
    let lines = recorded_tool_result_lines(release);
    let line = lines
        .iter()
        .find(|l| String::from_utf8_lossy(l).contains("toolu_touch_1"))
        .unwrap();
    decode(release, line).remove(0)
}

#[test]
fn bash_result_of_2_1_332_separates_stdout_and_stderr() {
    let t = tool_allowed("2.1.332");
    assert_eq!(t.tool_use_id.as_deref(), Some("toolu_touch_1"));
    let r: Value = serde_json::from_str(t.tool_use_result.unwrap().get()).unwrap();
    assert_eq!(
        r,
        json!({"stdout":"","stderr":"","interrupted":false,"isImage":false,"noOutputExpected":true})
    );
    let m: Value = serde_json::from_str(t.tool_result_meta.unwrap().get()).unwrap();
    assert_eq!(m[0]["id"], "toolu_touch_1");
    assert_eq!(m[0]["permission_decision"]["decision"], "accept");
    assert_eq!(m[0]["permission_decision"]["source"], "user_temporary");
}

#[test]
fn bash_result_of_2_0_77_has_no_meta() {
    let t = tool_allowed("2.0.77");
    let r: Value = serde_json::from_str(t.tool_use_result.unwrap().get()).unwrap();
    assert_eq!(
        r,
        json!({"stdout":"","stderr":"","interrupted":false,"isImage":false})
    );
    assert!(t.tool_result_meta.is_none());
}

#[test]
fn refused_call_result_is_a_plain_string() {
    let lines = recorded_tool_result_lines("2.1.332");
    let line = lines
        .iter()
        .find(|l| String::from_utf8_lossy(l).contains("toolu_touch_2"))
        .unwrap();
    let t = decode("2.1.332", line).remove(0);
    assert!(t.is_error);
    assert_eq!(
        t.tool_use_result.unwrap().get(),
        r#""Error: The user does not want this file.""#
    );
}

/// Lines as 2.1.332 writes them (Write, observed against the fake model server), kept
/// verbatim: key order and escapes as sent, nothing re-shaped.
#[test]
fn write_result_is_kept_verbatim() {
    let line = br#"{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_w1","type":"tool_result","content":"File created successfully at: /tmp/cwd/a.txt"}]},"parent_tool_use_id":null,"session_id":"s","uuid":"u","timestamp":"1970-01-01T00:00:00.000Z","tool_use_result":{"type":"create","filePath":"/tmp/cwd/a.txt","content":"hello\n\u00e9","structuredPatch":[],"originalFile":null,"userModified":false},"tool_result_meta":[{"id":"toolu_w1","permission_decision":{"decision":"accept","source":"config","reason_type":"rule"}}]}"#;
    let t = decode("2.1.332", line).remove(0);
    assert_eq!(
        t.tool_use_result.as_ref().unwrap().get(),
        r#"{"type":"create","filePath":"/tmp/cwd/a.txt","content":"hello\n\u00e9","structuredPatch":[],"originalFile":null,"userModified":false}"#
    );
    // The stored form (serde, read back by kind as the store does) carries both, verbatim,
    // and reads back equal.
    let stored = serde_json::to_string(&t).unwrap();
    assert!(stored.contains(r#""filePath":"/tmp/cwd/a.txt","content":"hello\n\u00e9""#));
    let back: ToolResult = serde_json::from_str(&stored).unwrap();
    assert_eq!(back, t);
}

/// No release was seen sending several tool results in one frame (two tool calls in one
/// answer come back as two frames, each with its own `tool_use_result`); should one, its
/// single `tool_use_result` goes on the first block's event, once, not on every block.
#[test]
fn several_blocks_in_one_frame_put_the_fields_on_the_first_block_only() {
    let line = json!({"type":"user","message":{"role":"user","content":[
        {"type":"tool_result","tool_use_id":"a","content":"one"},
        {"type":"text","text":"between"},
        {"type":"tool_result","tool_use_id":"b","content":"two"}
    ]},"tool_use_result":{"stdout":"one"},"tool_result_meta":[{"id":"a"},{"id":"b"}]})
    .to_string();
    let r = decode("2.1.332", line.as_bytes());
    assert_eq!(r.len(), 2);
    assert_eq!(
        r[0].tool_use_result.as_ref().unwrap().get(),
        r#"{"stdout":"one"}"#
    );
    assert_eq!(
        r[0].tool_result_meta.as_ref().unwrap().get(),
        r#"[{"id":"a"},{"id":"b"}]"#
    );
    assert!(r[1].tool_use_result.is_none() && r[1].tool_result_meta.is_none());
}

#[test]
fn null_or_missing_fields_are_none_and_any_shape_is_kept() {
    let base = |extra: Value| {
        let mut v = json!({"type":"user","message":{"role":"user","content":[
            {"type":"tool_result","tool_use_id":"a","content":"x"}]}});
        for (k, val) in extra.as_object().unwrap() {
            v[k] = val.clone();
        }
        decode("2.1.332", v.to_string().as_bytes()).remove(0)
    };
    let t = base(json!({"tool_use_result": null, "tool_result_meta": null}));
    assert!(t.tool_use_result.is_none() && t.tool_result_meta.is_none());
    assert!(t.absent.is_empty());
    for shape in [json!(7), json!("s"), json!([1, {"a": []}]), json!(true)] {
        let t = base(json!({ "tool_use_result": shape.clone(), "tool_result_meta": shape }));
        assert_eq!(t.tool_use_result.unwrap().get(), shape.to_string());
        assert_eq!(t.tool_result_meta.unwrap().get(), shape.to_string());
    }
    // Nested past serde_json's recursion limit: kept whole, the event still decodes.
    let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
    let line = format!(
        r#"{{"type":"user","message":{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"a","content":"x"}}]}},"tool_use_result":{deep}}}"#
    );
    let t = decode("2.1.332", line.as_bytes()).remove(0);
    assert_eq!(t.tool_use_result.unwrap().get(), deep);
}

/// Events stored before the fields existed still read.
#[test]
fn stored_tool_results_without_the_fields_still_decode() {
    let old =
        r#"{"tool_use_id":"toolu_1","content":{"type":"text","value":"ok"},"is_error":false}"#;
    let t: ToolResult = serde_json::from_str(old).unwrap();
    assert_eq!(t.tool_use_id.as_deref(), Some("toolu_1"));
    assert!(t.tool_use_result.is_none() && t.tool_result_meta.is_none());
    // ... and a payload without them is written as before (no new keys).
    assert_eq!(serde_json::to_string(&t).unwrap(), old);
}
