//! `Deserialize` for [`RawJson`] that works both directly from serde_json (verbatim text,
//! via serde_json's raw-value protocol) and from serde's buffered content (internally
//! tagged enums such as [`crate::Event`]), where the value is re-encoded as JSON text in
//! the order it is visited.
//!
//! [`from_slice_any_depth`] reads stored JSON back whatever its nesting depth: the CLI may
//! send values nested past serde_json's recursion limit (128), which the decoder keeps as
//! raw text, so what was published live must be readable from the store too.

use std::fmt::{self, Write as _};

use serde::de::DeserializeOwned;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::model::RawJson;

/// serde_json's marker for raw values (stable since serde_json 1.0.29).
const RAW_TOKEN: &str = "$serde_json::private::RawValue";

impl<'de> Deserialize<'de> for RawJson {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = d.deserialize_newtype_struct(RAW_TOKEN, RawOrTranscode)?;
        RawValue::from_string(text)
            .map(RawJson)
            .map_err(de::Error::custom)
    }
}

fn scalar<T: Serialize + ?Sized, E: de::Error>(v: &T) -> Result<String, E> {
    serde_json::to_string(v).map_err(E::custom)
}

/// Accepts serde_json's raw-value map, or any value (transcoded).
struct RawOrTranscode;

impl<'de> Visitor<'de> for RawOrTranscode {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(Transcode)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<String, A::Error> {
        let Some(first) = map.next_key::<String>()? else {
            return Ok("{}".to_string());
        };
        if first == RAW_TOKEN {
            return map.next_value::<String>();
        }
        transcode_map(Some(first), map)
    }
    forward_scalars!();
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<String, A::Error> {
        Transcode.visit_seq(seq)
    }
}

/// Re-encodes any visited value as JSON text.
struct Transcode;

impl<'de> DeserializeSeed<'de> for Transcode {
    type Value = String;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(Transcode)
    }
}

macro_rules! forward_scalars {
    () => {
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
            Ok(if v { "true" } else { "false" }.to_string())
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
            scalar(&v)
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
            scalar(v)
        }
        fn visit_unit<E: de::Error>(self) -> Result<String, E> {
            Ok("null".to_string())
        }
        fn visit_none<E: de::Error>(self) -> Result<String, E> {
            Ok("null".to_string())
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
            d.deserialize_any(Transcode)
        }
    };
}
use forward_scalars;

impl<'de> Visitor<'de> for Transcode {
    type Value = String;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    forward_scalars!();
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(Transcode)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<String, A::Error> {
        let mut out = String::from("[");
        let mut first = true;
        while let Some(item) = seq.next_element_seed(Transcode)? {
            if !first {
                out.push(',');
            }
            first = false;
            out.push_str(&item);
        }
        out.push(']');
        Ok(out)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<String, A::Error> {
        transcode_map(None, map)
    }
}

/// Re-encode the rest of a sequence as JSON text.
pub(crate) fn transcode_seq<'de, A: SeqAccess<'de>>(seq: A) -> Result<String, A::Error> {
    Transcode.visit_seq(seq)
}

/// Re-encode the rest of a map as JSON text.
pub(crate) fn transcode_map_access<'de, A: MapAccess<'de>>(map: A) -> Result<String, A::Error> {
    transcode_map(None, map)
}

fn transcode_map<'de, A: MapAccess<'de>>(
    first_key: Option<String>,
    mut map: A,
) -> Result<String, A::Error> {
    let mut out = String::from("{");
    let mut key = match first_key {
        Some(k) => Some(k),
        None => map.next_key::<String>()?,
    };
    let mut first = true;
    while let Some(k) = key {
        if !first {
            out.push(',');
        }
        first = false;
        let v = map.next_value_seed(Transcode)?;
        let _ = write!(out, "{}:{}", scalar::<_, A::Error>(&k)?, v);
        key = map.next_key::<String>()?;
    }
    out.push('}');
    Ok(out)
}

/// The deepest nesting [`from_slice_any_depth`] reads (a line of the CLI is capped at
/// 10 MiB; this is far past anything a tool input or a request needs).
pub const MAX_READ_DEPTH: usize = 50_000;

/// Up to this depth the caller's stack is used (serde_json's own limit is 128).
const SHALLOW: usize = 100;

/// Stack per nesting level on the deep path: serde_json's recursive descent, serde's
/// buffering of internally tagged enums, re-encoding ([`RawJson`]) and the drop of the
/// buffered tree each add frames per level. Measured on the tests' shapes in a debug build:
/// 1 KiB per level overflows at 5,000 levels, 2 KiB does not; 8 KiB leaves a margin (the
/// stack is reserved address space, touched only as deep as the reader goes).
const STACK_PER_LEVEL: usize = 8 * 1024;

/// The nesting depth of JSON text (arrays and objects; strings skipped). Not a validator:
/// malformed text gives some number, and the parser reports the error.
pub fn nesting_depth(bytes: &[u8]) -> usize {
    let (mut depth, mut max, mut in_str, mut esc) = (0usize, 0usize, false, false);
    for &b in bytes {
        if in_str {
            if esc {
                esc = false;
            } else if b == b'\\' {
                esc = true;
            } else if b == b'"' {
                in_str = false;
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// How many `{` and `[` bytes `bytes` holds: a bound on its [`nesting_depth`].
fn opening_brackets(bytes: &[u8]) -> usize {
    bytes.iter().filter(|&&b| b == b'{' || b == b'[').count()
}

/// `serde_json::from_slice` for text of any nesting depth up to [`MAX_READ_DEPTH`]. Shallow
/// text (the usual case) is read on the caller's stack; deeper text is read with
/// serde_json's recursion limit off, on a scoped thread whose stack is sized for the depth,
/// so it cannot overflow the caller's stack. Deeper than [`MAX_READ_DEPTH`] is an error.
pub fn from_slice_any_depth<T: DeserializeOwned + Send>(bytes: &[u8]) -> serde_json::Result<T> {
    // The depth is at most the number of opening brackets (in strings or not). Counting
    // them is a loop the compiler vectorises, several times cheaper than the exact scan,
    // and settles the usual case; replay reads every stored payload through here.
    let depth = match opening_brackets(bytes) {
        bound if bound <= SHALLOW => bound,
        _ => nesting_depth(bytes),
    };
    if depth <= SHALLOW {
        return serde_json::from_slice(bytes);
    }
    if depth > MAX_READ_DEPTH {
        return Err(de::Error::custom(format!(
            "JSON nested {depth} levels deep; at most {MAX_READ_DEPTH} can be read"
        )));
    }
    let stack = depth * STACK_PER_LEVEL + (1 << 20);
    std::thread::scope(|scope| {
        let reader = std::thread::Builder::new()
            .name("ostler-deep-json".into())
            .stack_size(stack)
            .spawn_scoped(scope, || {
                let mut de = serde_json::Deserializer::from_slice(bytes);
                de.disable_recursion_limit();
                let v = T::deserialize(&mut de)?;
                de.end()?;
                Ok(v)
            })
            .map_err(|e| {
                <serde_json::Error as de::Error>::custom(format!(
                    "no thread to read JSON nested {depth} levels deep: {e}"
                ))
            })?;
        reader.join().unwrap_or_else(|_| {
            Err(de::Error::custom(format!(
                "reading JSON nested {depth} levels deep failed"
            )))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Event, Unknown};

    #[test]
    fn direct_keeps_text_and_buffered_keeps_order() {
        let text = r#"{"z":1,"a":[true,null,"s",1.5,-2],"m":{"y":{}}}"#;
        let direct: RawJson = serde_json::from_str(text).unwrap();
        assert_eq!(direct.get(), text);
        let ev = Event::Unknown(Unknown {
            message_type: "x".into(),
            raw: direct,
        });
        let s = serde_json::to_string(&ev).unwrap();
        let back: Event = serde_json::from_str(&s).unwrap();
        assert_eq!(back, ev);
        let v: RawJson = serde_json::from_value(serde_json::json!({"k": [1]})).unwrap();
        assert_eq!(v.get(), r#"{"k":[1]}"#);
    }

    fn nested(depth: usize) -> String {
        let mut s = String::new();
        for i in 0..depth {
            if i % 2 == 0 {
                s.push_str("{\"k\":");
            } else {
                s.push('[');
            }
        }
        s.push_str("\"leaf\"");
        for i in (0..depth).rev() {
            s.push(if i % 2 == 0 { '}' } else { ']' });
        }
        s
    }

    #[test]
    fn depth_is_measured_outside_strings() {
        assert_eq!(nesting_depth(br#"{"a":[1,{"b":"[[[{"}]}"#), 3);
        assert_eq!(nesting_depth(br#""\"[""#), 0);
        assert_eq!(nesting_depth(nested(500).as_bytes()), 500);
    }

    /// The quick count that lets shallow text skip the exact scan never says less than the
    /// depth, and text with many brackets in its strings still reads as what it is.
    #[test]
    fn the_bracket_count_bounds_the_depth() {
        let texts = [
            nested(0),
            nested(1),
            nested(99),
            nested(100),
            nested(101),
            nested(3_000),
            r#"{"a":[1,{"b":"[[[{"}]}"#.to_owned(),
            format!(r#"{{"t":"{}","u":[[{{}}]]}}"#, "[{".repeat(400)),
        ];
        for t in &texts {
            assert!(
                opening_brackets(t.as_bytes()) >= nesting_depth(t.as_bytes()),
                "{t:.40}"
            );
        }
        let text = texts.last().unwrap();
        assert!(opening_brackets(text.as_bytes()) > SHALLOW);
        let v: serde_json::Value = from_slice_any_depth(text.as_bytes()).unwrap();
        assert_eq!(v["t"].as_str().unwrap().len(), 800);
        for depth in [100, 101, 3_000] {
            let v: RawJson = from_slice_any_depth(nested(depth).as_bytes()).unwrap();
            assert_eq!(v.get(), nested(depth), "depth {depth}");
        }
    }

    /// Stored events whose raw parts nest past serde_json's recursion limit read back as
    /// they were written, inside internally tagged enums (buffered by serde) too.
    #[test]
    fn deep_values_read_back_equal() {
        use crate::model::{
            AssistantBlock, CliRequest, ContentBlock, ControlOutcome, ControlRequest,
            ControlResponse,
        };
        for depth in [127, 128, 500, 5_000] {
            let raw = RawJson::from_string(nested(depth)).unwrap();
            let block = AssistantBlock {
                message_id: Some("m".into()),
                index: 0,
                model: None,
                parent_tool_use_id: None,
                block: ContentBlock::Other {
                    block_type: "tool_use".into(),
                    raw: raw.clone(),
                },
                stop_reason: None,
                usage: None,
                error: None,
                agent_id: None,
                subagent_type: None,
                task_description: None,
            };
            let bytes = serde_json::to_vec(&block).unwrap();
            if depth >= 127 {
                assert!(
                    serde_json::from_slice::<AssistantBlock>(&bytes).is_err(),
                    "serde_json alone reads depth {depth}: the test proves nothing"
                );
            }
            let back: AssistantBlock = from_slice_any_depth(&bytes).unwrap();
            assert_eq!(back, block, "depth {depth}");

            let req = ControlRequest {
                request_id: "r".into(),
                request: CliRequest::Other {
                    request_subtype: "can_use_tool".into(),
                    raw: raw.clone(),
                },
            };
            let back: ControlRequest =
                from_slice_any_depth(&serde_json::to_vec(&req).unwrap()).unwrap();
            assert_eq!(back, req, "depth {depth}");

            let resp = ControlResponse {
                request_id: "r".into(),
                outcome: ControlOutcome::Success {
                    response: Some(raw.clone()),
                },
            };
            let back: ControlResponse =
                from_slice_any_depth(&serde_json::to_vec(&resp).unwrap()).unwrap();
            assert_eq!(back, resp, "depth {depth}");

            // Through the tagged `Event` too (every part buffered by serde).
            let ev = Event::Unknown(Unknown {
                message_type: "x".into(),
                raw,
            });
            let back: Event = from_slice_any_depth(&serde_json::to_vec(&ev).unwrap()).unwrap();
            assert_eq!(back, ev, "depth {depth}");
        }
    }

    #[test]
    fn too_deep_and_malformed_are_errors_not_crashes() {
        let deep = "[".repeat(MAX_READ_DEPTH + 1);
        let e = from_slice_any_depth::<serde_json::Value>(deep.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("levels deep"), "{e}");
        let e = from_slice_any_depth::<serde_json::Value>("[".repeat(1000).as_bytes());
        assert!(e.is_err());
    }
}
