//! Wire shape of a recording and its comparison (the live contract check).
//!
//! The shape of a recording is one line per envelope: direction, `type/subtype`, the
//! sorted top-level keys, and the sorted keys of the discriminated payload
//! (`request`, `response`, `event`, `message`), content block types and delta types.
//! Values are not part of the shape.
//!
//! Tolerated nondeterminism (explicit, see [`canonical`]):
//! - `system/status` lines (2.1.x) are emitted by the CLI around API requests at points
//!   that depend on timing; they are kept but each run of them is moved to the end of the
//!   contiguous block of CLI lines it sits in (its content is still compared);
//! - key *sets* are compared, never key order.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::record::{msg_subtype, msg_type};
use crate::{Error, Result};

fn keys(v: Option<&Value>) -> String {
    match v.and_then(Value::as_object) {
        Some(m) => {
            let k: BTreeSet<&str> = m.keys().map(String::as_str).collect();
            format!("{{{}}}", k.into_iter().collect::<Vec<_>>().join(","))
        }
        None => "-".into(),
    }
}

fn block_types(content: Option<&Value>) -> String {
    match content {
        Some(Value::Array(bs)) => {
            let t: Vec<String> = bs
                .iter()
                .map(|b| {
                    let ty = b.get("type").and_then(Value::as_str).unwrap_or("?");
                    format!("{ty}{}", keys(Some(b)))
                })
                .collect();
            format!("[{}]", t.join(" "))
        }
        Some(Value::String(_)) => "string".into(),
        _ => "-".into(),
    }
}

/// Shape of one protocol message.
pub fn message_shape(v: &Value) -> String {
    let ty = msg_type(v).unwrap_or("?");
    let sub = msg_subtype(v).map(|s| format!("/{s}")).unwrap_or_default();
    let mut s = format!("{ty}{sub} {}", keys(Some(v)));
    match ty {
        "control_request" => {
            s.push_str(&format!(" request{}", keys(v.get("request"))));
        }
        "control_response" => {
            let r = v.get("response");
            s.push_str(&format!(" response{}", keys(r)));
            if let Some(inner) = r.and_then(|r| r.get("response")) {
                s.push_str(&format!(" response.response{}", keys(Some(inner))));
            }
        }
        "stream_event" => {
            let e = v.get("event");
            s.push_str(&format!(" event{}", keys(e)));
            if let Some(d) = e.and_then(|e| e.get("delta")) {
                let dt = d.get("type").and_then(Value::as_str).unwrap_or("-");
                s.push_str(&format!(" delta:{dt}{}", keys(Some(d))));
            }
            if let Some(b) = e.and_then(|e| e.get("content_block")) {
                s.push_str(&format!(" block{}", keys(Some(b))));
            }
        }
        "assistant" | "user" => {
            let m = v.get("message");
            s.push_str(&format!(" message{}", keys(m)));
            s.push_str(&format!(
                " content{}",
                block_types(m.and_then(|m| m.get("content")))
            ));
        }
        _ => {}
    }
    s
}

/// The shape lines of a recording's text (header included as `header`).
pub fn shape(recording: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for (n, line) in recording.lines().enumerate() {
        if line.is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(line)
            .map_err(|e| Error::Recording(format!("line {}: {e}", n + 1)))?;
        if n == 0 {
            let unsupported = v
                .get("unsupported_flags")
                .map(|u| u.to_string())
                .unwrap_or_default();
            out.push(format!("header unsupported_flags={unsupported}"));
            continue;
        }
        let dir = v.get("dir").and_then(Value::as_str).unwrap_or("?");
        let s = match (dir, v.get("line"), v.get("text")) {
            ("meta", _, _) => format!(
                "meta {} {}",
                v.get("event").and_then(Value::as_str).unwrap_or("?"),
                v.get("code")
                    .map(|c| format!("code={c}"))
                    .unwrap_or_default()
            ),
            (_, Some(l), _) => format!("{dir} {}", message_shape(l)),
            (_, None, Some(_)) => format!("{dir} text"),
            _ => format!("{dir} ?"),
        };
        out.push(s.trim_end().to_string());
    }
    Ok(canonical(out))
}

fn is_status(s: &str) -> bool {
    s.starts_with("cli system/status ")
}

/// Apply the documented tolerances: move each `system/status` line to the end of its
/// contiguous block of `cli` lines (stable).
pub fn canonical(lines: Vec<String>) -> Vec<String> {
    let mut out = Vec::with_capacity(lines.len());
    let mut block: Vec<String> = Vec::new();
    let mut statuses: Vec<String> = Vec::new();
    let flush = |out: &mut Vec<String>, block: &mut Vec<String>, statuses: &mut Vec<String>| {
        out.append(block);
        out.append(statuses);
    };
    for l in lines {
        if l.starts_with("cli ") {
            if is_status(&l) {
                statuses.push(l);
            } else {
                block.push(l);
            }
        } else {
            flush(&mut out, &mut block, &mut statuses);
            out.push(l);
        }
    }
    flush(&mut out, &mut block, &mut statuses);
    out
}

/// A unified diff of two shapes, `None` when they are equal.
pub fn diff_shapes(expected: &[String], actual: &[String]) -> Option<String> {
    if expected == actual {
        return None;
    }
    let e = expected.join("\n") + "\n";
    let a = actual.join("\n") + "\n";
    let diff = similar::TextDiff::from_lines(&e, &a);
    Some(
        diff.unified_diff()
            .context_radius(3)
            .header("recorded", "live")
            .to_string(),
    )
}

/// Compare two recordings' shapes; `Err(ContractMismatch)` with a readable diff.
pub fn compare(what: &str, recorded: &str, live: &str) -> Result<()> {
    let e = shape(recorded)?;
    let a = shape(live)?;
    match diff_shapes(&e, &a) {
        None => Ok(()),
        Some(diff) => Err(Error::ContractMismatch {
            what: what.to_string(),
            diff,
        }),
    }
}

/// Record `scenario` live with `binary` and compare its shape with the committed
/// recording of `release` (`contracts/claude-code/<release>/<scenario>.ndjson`).
pub async fn live_check(
    release: &str,
    binary: &std::path::Path,
    scenario: &crate::Scenario,
) -> Result<()> {
    let path = crate::record::recording_path(release, &scenario.name);
    let recorded = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let opts = crate::RecordOptions::new(release, binary);
    let live = crate::record(scenario, &opts).await?;
    compare(
        &format!("{release}/{}", scenario.name),
        &recorded,
        &live.text,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const REC: &str = r#"{"ostler_recording":1,"release":"x","scenario":"s","flags":[],"unsupported_flags":[]}
{"dir":"ostler","line":{"type":"user","message":{"role":"user","content":"hi"},"parent_tool_use_id":null,"session_id":""}}
{"dir":"cli","line":{"type":"system","subtype":"init","session_id":"a","tools":[]}}
{"dir":"cli","line":{"type":"system","subtype":"status","status":"requesting"}}
{"dir":"cli","line":{"type":"assistant","message":{"id":"m","content":[{"type":"text","text":"yo"}]},"session_id":"a"}}
{"dir":"cli","line":{"type":"result","subtype":"success","is_error":false}}
{"dir":"meta","event":"exit","code":0}
"#;

    #[test]
    fn shape_ignores_values_but_sees_keys() {
        let changed_value = REC.replace("\"yo\"", "\"something else\"");
        assert!(compare("t", REC, &changed_value).is_ok());
        let new_key = REC.replace("\"is_error\":false", "\"is_error\":false,\"extra\":1");
        let err = compare("t", REC, &new_key).expect_err("a new key changes the shape");
        let Error::ContractMismatch { diff, .. } = err else {
            panic!("wrong error")
        };
        assert!(
            diff.contains("+cli result/success {extra,is_error,subtype,type}"),
            "{diff}"
        );
        assert!(
            diff.contains("-cli result/success {is_error,subtype,type}"),
            "{diff}"
        );
    }

    #[test]
    fn status_position_is_tolerated_within_a_block() {
        let moved = REC.replace(
            "{\"dir\":\"cli\",\"line\":{\"type\":\"system\",\"subtype\":\"status\",\"status\":\"requesting\"}}\n",
            "",
        );
        let moved = moved.replace(
            "{\"dir\":\"meta\"",
            "{\"dir\":\"cli\",\"line\":{\"type\":\"system\",\"subtype\":\"status\",\"status\":\"requesting\"}}\n{\"dir\":\"meta\"",
        );
        assert!(compare("t", REC, &moved).is_ok());
        // but a missing status line is a difference
        let gone = REC.replace(
            "{\"dir\":\"cli\",\"line\":{\"type\":\"system\",\"subtype\":\"status\",\"status\":\"requesting\"}}\n",
            "",
        );
        assert!(compare("t", REC, &gone).is_err());
    }

    #[test]
    fn order_of_messages_matters() {
        let lines: Vec<&str> = REC.lines().collect();
        let mut swapped = lines.clone();
        swapped.swap(1, 2);
        let swapped = swapped.join("\n");
        assert!(compare("t", REC, &swapped).is_err());
    }
}
