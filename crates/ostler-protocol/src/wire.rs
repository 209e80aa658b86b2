//! Borrowed, lenient views of wire messages (private to the decoder).
//!
//! Every field is optional and accepts any JSON type: a value of the wrong type reads as
//! absent instead of failing the whole line (tolerant reader). Strings borrow from the line
//! when they contain no escapes; nested objects are captured as `&RawValue` slices and only
//! parsed when needed.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::model::Usage;

/// A string field; any other JSON type reads as `None`.
#[derive(Debug, Default, Clone)]
pub(crate) struct LStr<'a>(pub Option<Cow<'a, str>>);

impl<'a> LStr<'a> {
    pub fn as_deref(&self) -> Option<&str> {
        self.0.as_deref()
    }
    pub fn owned(&self) -> Option<String> {
        self.0.as_ref().map(|c| c.to_string())
    }
    pub fn is_some(&self) -> bool {
        self.0.is_some()
    }
}

struct LStrVisitor;

impl<'de> Visitor<'de> for LStrVisitor {
    type Value = LStr<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(LStr(Some(Cow::Borrowed(v))))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(LStr(Some(Cow::Owned(v.to_owned()))))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(LStr(Some(Cow::Owned(v))))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(LStr(None))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(LStr(None))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(LStr(None))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(LStr(None))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(LStr(None))
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(LStr(None))
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(LStrVisitor)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(LStr(None))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(LStr(None))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for LStr<'a> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(LStrVisitor)
    }
}

/// A number field; numbers given as strings are accepted, anything else reads as `None`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LNum(pub Option<f64>);

impl LNum {
    pub fn u64(self) -> Option<u64> {
        self.0
            .filter(|f| f.is_finite() && *f >= 0.0)
            .map(|f| f.min(u64::MAX as f64) as u64)
    }
    pub fn u32(self) -> Option<u32> {
        self.u64().map(|u| u.min(u64::from(u32::MAX)) as u32)
    }
    pub fn f64(self) -> Option<f64> {
        self.0.filter(|f| f.is_finite())
    }
}

struct LNumVisitor;

impl<'de> Visitor<'de> for LNumVisitor {
    type Value = LNum;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(LNum(v.trim().parse::<f64>().ok()))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(LNum(None))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(LNum(Some(v as f64)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(LNum(Some(v as f64)))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(LNum(Some(v)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(LNum(None))
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(LNum(None))
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(LNumVisitor)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(LNum(None))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(LNum(None))
    }
}

impl<'de> Deserialize<'de> for LNum {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(LNumVisitor)
    }
}

/// A boolean field; `"true"`/`"false"` strings accepted, anything else reads as `None`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LBool(pub Option<bool>);

struct LBoolVisitor;

impl<'de> Visitor<'de> for LBoolVisitor {
    type Value = LBool;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(LBool(Some(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(LBool(match v.trim() {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        }))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(LBool(None))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(LBool(None))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(LBool(None))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(LBool(None))
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(LBool(None))
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(LBoolVisitor)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(LBool(None))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(LBool(None))
    }
}

impl<'de> Deserialize<'de> for LBool {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(LBoolVisitor)
    }
}

/// An object field read in the same pass as its parent; any other JSON type reads as
/// `None`.
#[derive(Debug)]
pub(crate) struct LObj<T>(pub Option<T>);

impl<T> Default for LObj<T> {
    fn default() -> Self {
        LObj(None)
    }
}

struct LObjVisitor<T>(std::marker::PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for LObjVisitor<T> {
    type Value = LObj<T>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        T::deserialize(de::value::MapAccessDeserializer::new(map)).map(|t| LObj(Some(t)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(LObj(None))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(LObj(None))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(LObj(None))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(LObj(None))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(LObj(None))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(LObj(None))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(LObj(None))
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(LObj(None))
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for LObj<T> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(LObjVisitor(std::marker::PhantomData))
    }
}

/// `message.content`, read in the same pass as the message: a string, or blocks (a
/// non-object element reads as `None`; the caller then falls back to the raw line).
#[derive(Debug, Default)]
pub(crate) enum LContent<'a> {
    #[default]
    Absent,
    Text(Cow<'a, str>),
    Blocks(Vec<LObj<WireBlock<'a>>>),
    /// An object or scalar where a string or list was expected.
    Odd,
}

struct LContentVisitor;

impl<'de> Visitor<'de> for LContentVisitor {
    type Value = LContent<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(LContent::Text(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(LContent::Text(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(LContent::Text(Cow::Owned(v)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(1).min(64));
        while let Some(b) = seq.next_element::<LObj<WireBlock<'de>>>()? {
            v.push(b);
        }
        Ok(LContent::Blocks(v))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(LContent::Odd)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(LContent::Odd)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(LContent::Odd)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(LContent::Odd)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(LContent::Odd)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(LContent::Absent)
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(LContent::Absent)
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(LContentVisitor)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for LContent<'a> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(LContentVisitor)
    }
}

/// `result.result`: text, or any other JSON re-encoded as text.
#[derive(Debug, Default)]
pub(crate) struct LText<'a>(pub Option<Cow<'a, str>>);

struct LTextVisitor;

impl<'de> Visitor<'de> for LTextVisitor {
    type Value = LText<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(LText(Some(Cow::Borrowed(v))))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(LText(Some(Cow::Owned(v.to_owned()))))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(LText(Some(Cow::Owned(v))))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(LText(None))
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(LText(None))
    }
    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(LTextVisitor)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok(LText(Some(Cow::Owned(v.to_string()))))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(LText(Some(Cow::Owned(v.to_string()))))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(LText(Some(Cow::Owned(v.to_string()))))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok(LText(serde_json::to_string(&v).ok().map(Cow::Owned)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        crate::rawjson::transcode_seq(seq).map(|s| LText(Some(Cow::Owned(s))))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        crate::rawjson::transcode_map_access(map).map(|s| LText(Some(Cow::Owned(s))))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for LText<'a> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(LTextVisitor)
    }
}

/// The top-level fields of every message type, read in one pass. Nested objects are kept
/// as raw slices.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Envelope<'a> {
    #[serde(rename = "type", borrow)]
    pub ty: LStr<'a>,
    #[serde(borrow)]
    pub subtype: LStr<'a>,
    #[serde(borrow)]
    pub message: LObj<WireMessage<'a>>,
    /// Boxed, like `response`: only `stream_event` and `control_response` lines have one,
    /// and inline they made every line's envelope 1,440 bytes instead of 920, moved
    /// several times per line (callgrind: ~1,000 instructions of `memcpy` per event).
    #[serde(borrow)]
    pub event: LObj<Box<WireStreamEvent<'a>>>,
    #[serde(borrow)]
    pub request: Option<&'a RawValue>,
    #[serde(borrow)]
    pub response: LObj<Box<WireCliResponse<'a>>>,
    #[serde(borrow)]
    pub request_id: LStr<'a>,
    #[serde(borrow)]
    pub parent_tool_use_id: LStr<'a>,
    #[serde(borrow)]
    pub session_id: LStr<'a>,
    #[serde(borrow)]
    pub api_message_id: LStr<'a>,
    #[serde(rename = "isSynthetic")]
    pub is_synthetic: LBool,
    #[serde(rename = "isReplay")]
    pub is_replay: LBool,
    /// The line's own id; on a `user` frame echoed by `--replay-user-messages`, the id of
    /// the message that was written.
    #[serde(borrow)]
    pub uuid: LStr<'a>,
    #[serde(borrow)]
    pub error: LStr<'a>,
    // system/init
    #[serde(borrow)]
    pub cwd: LStr<'a>,
    #[serde(borrow)]
    pub model: LStr<'a>,
    #[serde(borrow)]
    pub tools: Option<&'a RawValue>,
    /// On system/init; also on system/status, with `status` below.
    #[serde(rename = "permissionMode", borrow)]
    pub permission_mode: LStr<'a>,
    /// system/status (a string, or `null`): read here so that a status line, which the
    /// CLI writes with every request, is not parsed a second time for its detail.
    #[serde(borrow)]
    pub status: LStr<'a>,
    #[serde(borrow)]
    pub claude_code_version: LStr<'a>,
    #[serde(borrow)]
    pub capabilities: Option<&'a RawValue>,
    #[serde(rename = "apiKeySource", borrow)]
    pub api_key_source: LStr<'a>,
    #[serde(borrow)]
    pub slash_commands: Option<&'a RawValue>,
    #[serde(borrow)]
    pub mcp_servers: Option<&'a RawValue>,
    // result
    pub is_error: LBool,
    #[serde(borrow)]
    pub result: LText<'a>,
    pub num_turns: LNum,
    pub duration_ms: LNum,
    pub duration_api_ms: LNum,
    pub total_cost_usd: LNum,
    #[serde(borrow)]
    pub usage: Option<&'a RawValue>,
    #[serde(rename = "modelUsage", borrow)]
    pub model_usage: Option<&'a RawValue>,
    #[serde(borrow)]
    pub permission_denials: Option<&'a RawValue>,
    #[serde(borrow)]
    pub errors: Option<&'a RawValue>,
    #[serde(borrow)]
    pub stop_reason: LStr<'a>,
    #[serde(borrow)]
    pub terminal_reason: LStr<'a>,
    /// The answer in the `--json-schema` shape (2.x sessions started with one).
    #[serde(borrow)]
    pub structured_output: Option<&'a RawValue>,
    /// The user messages a turn answered (2.1.330+: on `result`, and also on a turn's first
    /// `assistant` frame, where it is not read).
    #[serde(borrow)]
    pub user_message_uuids: Option<&'a RawValue>,
    #[serde(borrow)]
    pub user_message_uuid: LStr<'a>,
    // user (tool results)
    /// The tool's structured result, one per `user` frame (2.0.x and later; its shape is the
    /// tool's and the release's).
    #[serde(borrow)]
    pub tool_use_result: Option<&'a RawValue>,
    /// Per tool use: `[{"id", "permission_decision", ...}]` (2.1.330 and later).
    #[serde(borrow)]
    pub tool_result_meta: Option<&'a RawValue>,
    // assistant / user frames of a sub-agent (2.1.330 and later)
    #[serde(borrow)]
    pub agent_id: LStr<'a>,
    #[serde(borrow)]
    pub subagent_type: LStr<'a>,
    #[serde(borrow)]
    pub task_description: LStr<'a>,
}

/// One entry of `tool_result_meta`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct WireResultMeta<'a> {
    #[serde(borrow)]
    pub id: LStr<'a>,
    #[serde(borrow)]
    pub permission_decision: LObj<WirePermissionDecision<'a>>,
}

/// `tool_result_meta[].permission_decision`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct WirePermissionDecision<'a> {
    #[serde(borrow)]
    pub decision: LStr<'a>,
    #[serde(borrow)]
    pub source: LStr<'a>,
    #[serde(borrow)]
    pub reason_type: LStr<'a>,
}

/// `message` of `assistant` / `user` frames.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct WireMessage<'a> {
    #[serde(borrow)]
    pub id: LStr<'a>,
    #[serde(borrow)]
    pub model: LStr<'a>,
    #[serde(borrow)]
    pub content: LContent<'a>,
    #[serde(borrow)]
    pub stop_reason: LStr<'a>,
    #[serde(borrow)]
    pub usage: Option<&'a RawValue>,
}

/// One content block (any type).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct WireBlock<'a> {
    #[serde(rename = "type", borrow)]
    pub ty: LStr<'a>,
    #[serde(borrow)]
    pub text: LStr<'a>,
    #[serde(borrow)]
    pub thinking: LStr<'a>,
    #[serde(borrow)]
    pub signature: LStr<'a>,
    #[serde(borrow)]
    pub data: LStr<'a>,
    #[serde(borrow)]
    pub id: LStr<'a>,
    #[serde(borrow)]
    pub name: LStr<'a>,
    #[serde(borrow)]
    pub input: Option<&'a RawValue>,
    #[serde(borrow)]
    pub tool_use_id: LStr<'a>,
    #[serde(borrow)]
    pub content: Option<&'a RawValue>,
    pub is_error: LBool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct WireUsage {
    pub input_tokens: LNum,
    pub output_tokens: LNum,
    pub cache_creation_input_tokens: LNum,
    pub cache_read_input_tokens: LNum,
}

impl WireUsage {
    pub fn to_usage(&self) -> Usage {
        Usage {
            input_tokens: self.input_tokens.u64().unwrap_or(0),
            output_tokens: self.output_tokens.u64().unwrap_or(0),
            cache_creation_input_tokens: self.cache_creation_input_tokens.u64().unwrap_or(0),
            cache_read_input_tokens: self.cache_read_input_tokens.u64().unwrap_or(0),
        }
    }
}

/// `event` of a `stream_event` frame (an Anthropic API stream event).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct WireStreamEvent<'a> {
    #[serde(rename = "type", borrow)]
    pub ty: LStr<'a>,
    pub index: LNum,
    #[serde(borrow)]
    pub message: LObj<WireMessage<'a>>,
    #[serde(borrow)]
    pub content_block: LObj<WireBlock<'a>>,
    #[serde(borrow)]
    pub delta: Option<&'a RawValue>,
    #[serde(borrow)]
    pub usage: Option<&'a RawValue>,
}

/// `delta` of `content_block_delta` / `message_delta`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct WireDelta<'a> {
    #[serde(rename = "type", borrow)]
    pub ty: LStr<'a>,
    #[serde(borrow)]
    pub text: LStr<'a>,
    #[serde(borrow)]
    pub thinking: LStr<'a>,
    #[serde(borrow)]
    pub partial_json: LStr<'a>,
    #[serde(borrow)]
    pub signature: LStr<'a>,
    #[serde(borrow)]
    pub stop_reason: LStr<'a>,
}

/// `request` of a `control_request` from the CLI.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct WireCliRequest<'a> {
    #[serde(borrow)]
    pub subtype: LStr<'a>,
    #[serde(borrow)]
    pub tool_name: LStr<'a>,
    #[serde(borrow)]
    pub input: Option<&'a RawValue>,
    #[serde(borrow)]
    pub tool_use_id: LStr<'a>,
    #[serde(borrow)]
    pub permission_suggestions: Option<&'a RawValue>,
    #[serde(borrow)]
    pub blocked_path: LStr<'a>,
    #[serde(borrow)]
    pub decision_reason: Option<&'a RawValue>,
    #[serde(borrow)]
    pub description: LStr<'a>,
    #[serde(borrow)]
    pub display_name: LStr<'a>,
    #[serde(borrow)]
    pub agent_id: LStr<'a>,
    #[serde(borrow)]
    pub callback_id: LStr<'a>,
}

/// `response` of a `control_response` from the CLI.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct WireCliResponse<'a> {
    #[serde(borrow)]
    pub subtype: LStr<'a>,
    #[serde(borrow)]
    pub request_id: LStr<'a>,
    #[serde(borrow)]
    pub response: Option<&'a RawValue>,
    #[serde(borrow)]
    pub error: LStr<'a>,
    #[serde(borrow)]
    pub error_code: LStr<'a>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct WireDenial<'a> {
    #[serde(borrow)]
    pub tool_name: LStr<'a>,
    #[serde(borrow)]
    pub tool_use_id: LStr<'a>,
    #[serde(borrow)]
    pub tool_input: Option<&'a RawValue>,
}

/// Whether a raw value is JSON `null` (a `RawValue` keeps nulls verbatim).
pub(crate) fn is_null(raw: &RawValue) -> bool {
    raw.get().trim() == "null"
}

/// Parse a raw slice into a borrowed view; `None` when it does not fit (wrong JSON type).
pub(crate) fn view<'a, T: Deserialize<'a>>(raw: &'a RawValue) -> Option<T> {
    serde_json::from_str(raw.get()).ok()
}
