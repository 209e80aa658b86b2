//! Reading what we can from the beginning of a line that was cut off (an oversized line):
//! a tolerant JSON token scanner that never needs the rest of the document.

use crate::model::Truncated;

/// Keys whose string values identify a message, recorded with their path.
fn interesting(path_parent: Option<&str>, depth: usize, key: &str) -> Option<&'static str> {
    match (depth, path_parent, key) {
        (1, _, "type") => Some("type"),
        (1, _, "subtype") => Some("subtype"),
        (1, _, "session_id") => Some("session_id"),
        (1, _, "uuid") => Some("uuid"),
        (1, _, "request_id") => Some("request_id"),
        (1, _, "parent_tool_use_id") => Some("parent_tool_use_id"),
        (1, _, "api_message_id") => Some("api_message_id"),
        (2, Some("message"), "id") => Some("message.id"),
        (2, Some("request"), "subtype") => Some("request.subtype"),
        (2, Some("request"), "tool_name") => Some("request.tool_name"),
        (2, Some("response"), "subtype") => Some("response.subtype"),
        (2, Some("response"), "request_id") => Some("request_id"),
        (2, Some("event"), "type") => Some("event.type"),
        (_, _, "tool_use_id") => Some("tool_use_id"),
        _ => None,
    }
}

const MAX_IDS: usize = 16;

/// Build the `Truncated` event for an oversized line from its head.
pub(crate) fn truncated(head: &[u8], original_size: u64) -> Truncated {
    let found = scan_head(head);
    let mut message_type = None;
    let mut subtype = None;
    let mut ids: Vec<(String, String)> = Vec::new();
    for (k, v) in found {
        match k {
            "type" if message_type.is_none() => message_type = Some(v),
            "subtype" if subtype.is_none() => subtype = Some(v),
            "type" | "subtype" => {}
            _ => {
                if ids.len() < MAX_IDS && !ids.iter().any(|(ek, ev)| ek == k && *ev == v) {
                    ids.push((k.to_string(), v));
                }
            }
        }
    }
    Truncated {
        message_type,
        subtype,
        ids,
        original_size,
        marker: format!("[truncated: original_size={original_size} bytes]"),
    }
}

#[derive(Debug)]
enum Container {
    /// Object: the key of the value being read (if any) and whether we expect a key next.
    Object {
        key: Option<String>,
        expect_key: bool,
    },
    Array,
}

/// Scan the head of a JSON object for identifying string fields. Stops at the first thing
/// it cannot read (the cut, or malformed input); never fails.
fn scan_head(head: &[u8]) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let mut stack: Vec<Container> = Vec::new();
    let mut i = 0usize;
    // Keep the scan bounded even for pathological nesting.
    const MAX_DEPTH: usize = 64;
    while let Some(&b) = head.get(i) {
        match b {
            b' ' | b'\t' | b'\r' | b'\n' | b',' => {
                if b == b','
                    && let Some(Container::Object { key, expect_key }) = stack.last_mut()
                {
                    *key = None;
                    *expect_key = true;
                }
                i += 1;
            }
            b':' => {
                if let Some(Container::Object { expect_key, .. }) = stack.last_mut() {
                    *expect_key = false;
                }
                i += 1;
            }
            b'{' => {
                if stack.len() >= MAX_DEPTH {
                    break;
                }
                stack.push(Container::Object {
                    key: None,
                    expect_key: true,
                });
                i += 1;
            }
            b'[' => {
                if stack.len() >= MAX_DEPTH {
                    break;
                }
                stack.push(Container::Array);
                i += 1;
            }
            b'}' | b']' => {
                stack.pop();
                if stack.is_empty() {
                    break;
                }
                i += 1;
            }
            b'"' => {
                let Some(end) = string_end(head, i) else {
                    break; // cut inside a string
                };
                let Some(text) = head
                    .get(i..=end)
                    .and_then(|s| serde_json::from_slice::<String>(s).ok())
                else {
                    break;
                };
                i = end + 1;
                let depth = stack.len();
                // The parent object's key, for paths like message.id.
                let parent_key = if depth >= 2 {
                    match stack.get(depth - 2) {
                        Some(Container::Object { key, .. }) => key.clone(),
                        _ => None,
                    }
                } else {
                    None
                };
                match stack.last_mut() {
                    Some(Container::Object { key, expect_key }) => {
                        if *expect_key {
                            *key = Some(text);
                        } else if let Some(k) = key.as_deref()
                            && let Some(name) = interesting(parent_key.as_deref(), depth, k)
                        {
                            out.push((name, text));
                        }
                    }
                    Some(Container::Array) | None => {}
                }
            }
            _ => {
                // Scalar (number, true, false, null): skip to the next delimiter.
                while let Some(&c) = head.get(i) {
                    if matches!(c, b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t') {
                        break;
                    }
                    i += 1;
                }
            }
        }
    }
    out
}

/// Index of the closing quote of the string starting at `start`.
fn string_end(s: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    while let Some(&b) = s.get(i) {
        match b {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_type_and_ids_from_a_cut_line() {
        let head = br#"{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_1","type":"tool_result","content":"aaaaaaaaaaaaa"#;
        let t = truncated(head, 50_000_000);
        assert_eq!(t.message_type.as_deref(), Some("user"));
        assert_eq!(
            t.ids,
            vec![("tool_use_id".to_string(), "toolu_1".to_string())]
        );
        assert_eq!(t.marker, "[truncated: original_size=50000000 bytes]");
    }

    #[test]
    fn assistant_message_id_and_nested_type_ignored() {
        let head = br#"{"type":"assistant","message":{"id":"msg_1","type":"message","content":[{"type":"text","text":"xx"#;
        let t = truncated(head, 10);
        assert_eq!(t.message_type.as_deref(), Some("assistant"));
        assert_eq!(t.ids, vec![("message.id".to_string(), "msg_1".to_string())]);
    }

    #[test]
    fn garbage_head_is_harmless() {
        let t = truncated(b"\xff\xfe{{{{[[[\"\\", 3);
        assert_eq!(t.message_type, None);
        assert!(t.ids.is_empty());
        let deep = vec![b'['; 100_000];
        let t = truncated(&deep, 100_000);
        assert_eq!(t.message_type, None);
    }
}
