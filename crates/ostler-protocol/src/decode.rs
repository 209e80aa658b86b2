//! Stateful per-session decoding: frames in, canonical events out.
//!
//! # One pass, borrowed
//!
//! Each line is parsed once into a borrowed envelope (`wire::Envelope`): strings borrow
//! from the line when they have no escapes, nested objects (`message`, `event`, `request`,
//! ...) are captured as `&RawValue` slices and only parsed into typed views when the
//! message type needs them. No `serde_json::Value` tree is built except for tool inputs
//! (which consumers need as values). The line itself is returned untouched in
//! [`DecodedLine::raw`], so the store never re-serializes anything.
//!
//! # Assistant block de-duplication
//!
//! The CLI emits one `assistant` frame per content block (frames of one API message share
//! `message.id`); older write-ups describe cumulative snapshots (each frame repeats every
//! block so far). Both must yield each block exactly once. Blocks are keyed by
//! `(message.id, index)`, where `index` is the block's position in its API message. The
//! decoder keeps, per recent `message.id`, the fingerprints (hash of the block's raw JSON)
//! of the blocks already emitted, in order:
//!
//! - a block whose fingerprint equals the one already at its position (snapshot repeat), or
//!   that was already emitted anywhere in the message (per-block frame repeated), is
//!   skipped;
//! - any other block is new: it gets the next index (`= number of blocks emitted so far`).
//!
//! So per-block frames `[a]`, `[b]`, `[c]` and snapshots `[a]`, `[a,b]`, `[a,b,c]` both yield
//! `a@0`, `b@1`, `c@2`. The state is bounded (the last [`DEDUP_MESSAGES`] message ids).
//! Frames without `message.id` are grouped until the next non-assistant frame. A message
//! that really contains two byte-identical blocks yields the block once (accepted).

use std::collections::VecDeque;
use std::hash::{DefaultHasher, Hash, Hasher};

use bytes::Bytes;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::adapter::{self, AdapterInfo};
use crate::framing::Frame;
use crate::model::*;
use crate::scan;
use crate::wire::{
    Envelope, LContent, LObj, LStr, WireBlock, WireCliRequest, WireDelta, WireDenial,
    WireResultMeta, WireUsage, is_null, view,
};

/// How many recent assistant message ids the de-duplication remembers.
pub const DEDUP_MESSAGES: usize = 64;

/// Max bytes of an offending line kept in a diagnostic's excerpt.
pub const EXCERPT_BYTES: usize = 256;

/// One input line and what it decoded to. `raw` is the line exactly as the CLI wrote it
/// (without terminator), so the store need not re-serialize anything. For an oversized
/// line, `raw` is the kept head only (not valid JSON) and the event is `Truncated`.
#[derive(Debug, Clone)]
pub struct DecodedLine {
    pub raw: Bytes,
    pub events: Vec<Event>,
}

/// Decoder for one session's stdout. Keeps the state needed to emit every assistant block
/// exactly once, whether the release sends per-block frames or cumulative snapshots.
#[derive(Debug)]
pub struct Decoder {
    adapter: &'static AdapterInfo,
    tolerant: bool,
    blocks: BlockDedup,
    /// Current API message id of the stream per `parent_tool_use_id` (for releases whose
    /// `stream_event`s carry the id only in `message_start`).
    stream_ids: Vec<(Option<String>, String)>,
}

impl Decoder {
    /// The adapter for `release` (the newest, in tolerant mode, when `None` or newer than
    /// every adapter's range).
    pub fn for_release(release: Option<&semver::Version>) -> Self {
        let sel = adapter::selection(release);
        Self {
            adapter: sel.adapter,
            tolerant: sel.tolerant,
            blocks: BlockDedup::default(),
            stream_ids: Vec::new(),
        }
    }

    pub fn adapter(&self) -> &'static AdapterInfo {
        self.adapter
    }

    /// Whether the adapter serves this release only as a fallback (release unknown or
    /// outside every adapter's range).
    pub fn is_tolerant(&self) -> bool {
        self.tolerant
    }

    /// Decode one framed line. Never fails: what cannot be read becomes a
    /// `Diagnostic`/`Unknown`/`Truncated` event.
    pub fn decode(&mut self, frame: Frame) -> DecodedLine {
        match frame {
            Frame::Line(raw) => {
                // Almost every line is one event: one allocation of its size, not of four.
                let mut events = Vec::with_capacity(1);
                self.decode_into(&raw, &mut events);
                DecodedLine { raw, events }
            }
            Frame::Oversized {
                head,
                original_size,
            } => {
                let events = vec![Event::Truncated(scan::truncated(&head, original_size))];
                DecodedLine { raw: head, events }
            }
        }
    }

    /// Decode one complete line (without terminator), appending its events to `out`.
    pub fn decode_into(&mut self, line: &[u8], out: &mut Vec<Event>) {
        let first = line.iter().copied().find(|b| !b.is_ascii_whitespace());
        if first != Some(b'{') {
            out.push(not_an_object(line));
            return;
        }
        // One UTF-8 check for the whole line; then strings borrow without re-validation.
        let text = match std::str::from_utf8(line) {
            Ok(t) => t,
            Err(e) => {
                out.push(diagnostic(
                    DiagnosticCode::NotJson,
                    format!("not JSON: invalid UTF-8 at byte {}", e.valid_up_to()),
                    line,
                ));
                return;
            }
        };
        let env: Envelope<'_> = match serde_json::from_str(text) {
            Ok(env) => env,
            Err(err) => {
                out.push(parse_failure(line, &err));
                if err.classify() == serde_json::error::Category::Data {
                    // Valid JSON whose shape we could not read (e.g. duplicate keys): keep it.
                    if let Some(raw) = whole(line) {
                        out.push(Event::Unknown(Unknown {
                            message_type: "?".to_string(),
                            raw,
                        }));
                    }
                }
                return;
            }
        };
        let Some(ty) = env.ty.as_deref() else {
            out.push(diagnostic(
                DiagnosticCode::NotAMessage,
                "JSON object without a string `type`".to_string(),
                line,
            ));
            return;
        };
        if ty != "assistant" {
            self.blocks.forget_anonymous();
        }
        let known = |t: &str| self.adapter.knows(t);
        match ty {
            "system" => match env.subtype.as_deref() {
                Some("init") if known("system/init") => out.push(session_started(&env)),
                Some(sub) => {
                    if self.adapter.knows_sub(ty, sub) {
                        out.push(system_notice(ty, &env, line));
                    } else {
                        out.push(unknown(format!("system/{sub}"), line));
                    }
                }
                None => out.push(unknown("system".to_string(), line)),
            },
            "assistant" if known(ty) => self.assistant(&env, line, out),
            "user" if known(ty) => user(&env, line, out),
            "result" if known(ty) => out.push(turn_result(&env)),
            "stream_event" if known(ty) => self.stream_event(&env, line, out),
            "control_request" if known(ty) => control_request(&env, line, out),
            "control_response" if known(ty) => control_response(&env, line, out),
            "control_cancel_request" if known(ty) => match env.request_id.owned() {
                Some(request_id) => out.push(Event::ControlCancel(ControlCancel { request_id })),
                None => bad_shape(ty, "control_cancel_request without request_id", line, out),
            },
            "keep_alive" if known(ty) => out.push(Event::KeepAlive),
            other => {
                if known(other) {
                    out.push(system_notice(other, &env, line));
                } else {
                    let key = match env.subtype.as_deref() {
                        Some(sub) => format!("{other}/{sub}"),
                        None => other.to_string(),
                    };
                    out.push(unknown(key, line));
                }
            }
        }
    }

    fn assistant(&mut self, env: &Envelope<'_>, line: &[u8], out: &mut Vec<Event>) {
        let Some(msg) = env.message.0.as_ref() else {
            return bad_shape(
                "assistant",
                "assistant frame without a `message` object",
                line,
                out,
            );
        };
        let message_id = msg.id.owned();
        let parent_tool_use_id = env.parent_tool_use_id.owned();
        let model = msg.model.owned();
        let stop_reason = msg.stop_reason.owned();
        let usage = msg.usage.and_then(view::<WireUsage>).map(|u| u.to_usage());
        let error = env.error.owned();
        let agent = SubAgent::of(env);
        let mut push = |index: u32, block: ContentBlock| {
            out.push(Event::AssistantBlock(AssistantBlock {
                message_id: message_id.clone(),
                index,
                parent_tool_use_id: parent_tool_use_id.clone(),
                model: model.clone(),
                block,
                stop_reason: stop_reason.clone(),
                usage,
                error: error.clone(),
                agent_id: agent.agent_id.clone(),
                subagent_type: agent.subagent_type.clone(),
                task_description: agent.task_description.clone(),
            }))
        };
        let id = msg.id.as_deref();
        match &msg.content {
            LContent::Absent => {}
            LContent::Text(t) => {
                let fp = fingerprint(&[b"text", t.as_bytes()]);
                if let Some(index) = self.blocks.admit(id, 0, fp) {
                    push(
                        index,
                        ContentBlock::Text {
                            text: t.to_string(),
                        },
                    );
                }
            }
            LContent::Blocks(items) => {
                // Raw slices of the blocks, read only if a block cannot be typed.
                let mut raws: Option<Vec<&RawValue>> = None;
                for (pos, item) in items.iter().enumerate() {
                    let typed = item
                        .0
                        .as_ref()
                        .and_then(|b| typed_fingerprint(b).map(|fp| (b, fp)));
                    if let Some((b, fp)) = typed {
                        let Some(index) = self.blocks.admit(id, pos, fp) else {
                            continue;
                        };
                        if let Some(block) = typed_block(b) {
                            push(index, block);
                            continue;
                        }
                        // Typed fingerprint but not buildable (tool input past the
                        // recursion limit): emitted raw below under the same index.
                        let raws = raws.get_or_insert_with(|| raw_content_items(line));
                        let raw = raws.get(pos).copied().unwrap_or(RawValue::NULL);
                        push(index, content_block(raw));
                        continue;
                    }
                    let raws = raws.get_or_insert_with(|| raw_content_items(line));
                    let raw = raws.get(pos).copied().unwrap_or(RawValue::NULL);
                    if let Some(index) =
                        self.blocks
                            .admit(id, pos, fingerprint(&[b"raw", raw.get().as_bytes()]))
                    {
                        push(index, content_block(raw));
                    }
                }
            }
            LContent::Odd => {
                for raw in raw_content_items(line) {
                    if let Some(index) =
                        self.blocks
                            .admit(id, 0, fingerprint(&[b"raw", raw.get().as_bytes()]))
                    {
                        push(index, content_block(raw));
                    }
                }
            }
        }
    }

    fn stream_event(&mut self, env: &Envelope<'_>, line: &[u8], out: &mut Vec<Event>) {
        let Some(ev) = env.event.0.as_ref() else {
            return bad_shape(
                "stream_event",
                "stream_event without an `event` object",
                line,
                out,
            );
        };
        let Some(ety) = ev.ty.as_deref() else {
            return bad_shape(
                "stream_event",
                "stream_event whose event has no `type`",
                line,
                out,
            );
        };
        let parent = env.parent_tool_use_id.owned();
        let mut marker = StreamMarker {
            event_type: ety.to_string(),
            message_id: None,
            index: ev.index.u32(),
            parent_tool_use_id: parent.clone(),
            block_type: None,
            tool_use_id: None,
            tool_name: None,
            stop_reason: None,
            usage: None,
        };
        match ety {
            "message_start" => {
                let msg = ev.message.0.as_ref();
                let id = env
                    .api_message_id
                    .owned()
                    .or_else(|| msg.as_ref().and_then(|m| m.id.owned()));
                if let Some(id) = &id {
                    self.set_stream_id(parent.clone(), id.clone());
                }
                marker.message_id = id;
                marker.usage = msg
                    .and_then(|m| m.usage)
                    .and_then(view::<WireUsage>)
                    .map(|u| u.to_usage());
                out.push(Event::StreamMarker(marker));
            }
            "content_block_delta" => {
                let delta = match ev.delta {
                    Some(raw) => delta(raw),
                    None => Delta::Other {
                        delta_type: String::new(),
                        raw: raw_json_str("null"),
                    },
                };
                out.push(Event::PartialDelta(PartialDelta {
                    message_id: self.stream_id(env, &parent),
                    index: ev.index.u32().unwrap_or(0),
                    parent_tool_use_id: parent,
                    delta,
                }));
            }
            "content_block_start" => {
                marker.message_id = self.stream_id(env, &parent);
                if let Some(b) = ev.content_block.0.as_ref() {
                    marker.block_type = b.ty.owned();
                    marker.tool_use_id = b.id.owned();
                    marker.tool_name = b.name.owned();
                }
                out.push(Event::StreamMarker(marker));
            }
            "message_delta" => {
                marker.message_id = self.stream_id(env, &parent);
                if let Some(d) = ev.delta.and_then(view::<WireDelta<'_>>) {
                    marker.stop_reason = d.stop_reason.owned();
                }
                marker.usage = ev.usage.and_then(view::<WireUsage>).map(|u| u.to_usage());
                out.push(Event::StreamMarker(marker));
            }
            "content_block_stop" | "message_stop" | "ping" | "error" => {
                marker.message_id = self.stream_id(env, &parent);
                out.push(Event::StreamMarker(marker));
            }
            other => out.push(unknown(format!("stream_event/{other}"), line)),
        }
    }

    fn stream_id(&self, env: &Envelope<'_>, parent: &Option<String>) -> Option<String> {
        env.api_message_id.owned().or_else(|| {
            self.stream_ids
                .iter()
                .find(|(p, _)| p == parent)
                .map(|(_, id)| id.clone())
        })
    }

    fn set_stream_id(&mut self, parent: Option<String>, id: String) {
        if let Some(slot) = self.stream_ids.iter_mut().find(|(p, _)| *p == parent) {
            slot.1 = id;
            return;
        }
        if self.stream_ids.len() >= DEDUP_MESSAGES {
            self.stream_ids.remove(0);
        }
        self.stream_ids.push((parent, id));
    }
}

/// Fingerprints of the blocks emitted per recent assistant message (see module docs).
#[derive(Debug, Default)]
struct BlockDedup {
    msgs: VecDeque<DedupSlot>,
}

/// One recent message: its id, a cheap key of the id (compared first: the ids of one
/// session share their prefix, so comparing the strings of all recent messages for each
/// new one cost more than the rest of the dedup), and the fingerprints of its blocks.
#[derive(Debug)]
struct DedupSlot {
    key: u64,
    id: Option<String>,
    seen: Vec<u64>,
}

/// A cheap, non-cryptographic key of a message id (`None` has its own); equal ids have
/// equal keys, and the ids are still compared when the keys are equal.
fn id_key(id: Option<&str>) -> u64 {
    let Some(id) = id else { return 0 };
    let mut h = 0x243F_6A88_85A3_08D3_u64 ^ id.len() as u64;
    for chunk in id.as_bytes().chunks(8) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    h | 1
}

impl BlockDedup {
    /// `Some(index)` if the block at `pos` of a frame of message `id` is new.
    fn admit(&mut self, id: Option<&str>, pos: usize, fp: u64) -> Option<u32> {
        let key = id_key(id);
        let found = self
            .msgs
            .iter()
            .rposition(|m| m.key == key && m.id.as_deref() == id);
        let slot = match found {
            Some(i) => i,
            None => {
                if self.msgs.len() >= DEDUP_MESSAGES {
                    self.msgs.pop_front();
                }
                self.msgs.push_back(DedupSlot {
                    key,
                    id: id.map(str::to_string),
                    seen: Vec::new(),
                });
                self.msgs.len() - 1
            }
        };
        let seen = &mut self.msgs.get_mut(slot)?.seen;
        if seen.get(pos) == Some(&fp) || seen.contains(&fp) {
            return None;
        }
        seen.push(fp);
        u32::try_from(seen.len() - 1).ok()
    }

    fn forget_anonymous(&mut self) {
        if self.msgs.iter().any(|m| m.id.is_none()) {
            self.msgs.retain(|m| m.id.is_some());
        }
    }
}

fn fingerprint(parts: &[&[u8]]) -> u64 {
    let mut h = DefaultHasher::new();
    for p in parts {
        p.hash(&mut h);
    }
    h.finish()
}

/// Fingerprint of a block read in the main pass; `None` if it has to be read raw (a type
/// or shape [`typed_block`] does not build).
fn typed_fingerprint(b: &WireBlock<'_>) -> Option<u64> {
    fn s<'b>(l: &'b LStr<'_>) -> Option<&'b [u8]> {
        l.as_deref().map(str::as_bytes)
    }
    match b.ty.as_deref()? {
        "text" => Some(fingerprint(&[b"text", s(&b.text)?])),
        "thinking" => Some(fingerprint(&[
            b"thinking",
            s(&b.thinking)?,
            s(&b.signature).unwrap_or_default(),
        ])),
        "redacted_thinking" => Some(fingerprint(&[b"redacted", s(&b.data)?])),
        "tool_use" => Some(fingerprint(&[
            b"tool_use",
            s(&b.id)?,
            s(&b.name)?,
            b.input.map(|i| i.get().as_bytes()).unwrap_or_default(),
        ])),
        _ => None,
    }
}

/// The raw slices of `message.content` (a list's items, or the single value), for blocks
/// the main pass could not type. Re-reads the line; only used for unusual blocks.
fn raw_content_items(line: &[u8]) -> Vec<&RawValue> {
    #[derive(serde::Deserialize)]
    struct M<'a> {
        #[serde(borrow, default)]
        message: Option<&'a RawValue>,
    }
    #[derive(serde::Deserialize)]
    struct C<'a> {
        #[serde(borrow, default)]
        content: Option<&'a RawValue>,
    }
    let Some(content) = serde_json::from_slice::<M<'_>>(line)
        .ok()
        .and_then(|m| m.message)
        .and_then(view::<C<'_>>)
        .and_then(|c| c.content)
    else {
        return Vec::new();
    };
    if content.get().trim_start().starts_with('[') {
        view(content).unwrap_or_default()
    } else {
        vec![content]
    }
}

fn raw_json_str(s: &str) -> RawJson {
    // Only called with literals that are valid JSON.
    RawJson::from_string(s.to_string()).unwrap_or_else(|_| RawJson(RawValue::NULL.to_owned()))
}

fn raw_json(raw: &RawValue) -> RawJson {
    RawJson(raw.to_owned())
}

/// The whole line as opaque JSON (`None` if it is not valid JSON).
fn whole(line: &[u8]) -> Option<RawJson> {
    serde_json::from_slice::<Box<RawValue>>(line)
        .ok()
        .map(RawJson)
}

fn excerpt(line: &[u8]) -> String {
    let cut = line.len().min(EXCERPT_BYTES);
    String::from_utf8_lossy(line.get(..cut).unwrap_or_default()).into_owned()
}

fn diagnostic(code: DiagnosticCode, message: String, line: &[u8]) -> Event {
    Event::Diagnostic(Diagnostic {
        code,
        message,
        excerpt: excerpt(line),
        line_len: line.len() as u64,
    })
}

fn not_an_object(line: &[u8]) -> Event {
    match serde_json::from_slice::<serde::de::IgnoredAny>(line) {
        Ok(_) => diagnostic(
            DiagnosticCode::NotAMessage,
            "JSON value that is not an object".to_string(),
            line,
        ),
        Err(e) => diagnostic(DiagnosticCode::NotJson, format!("not JSON: {e}"), line),
    }
}

fn parse_failure(line: &[u8], err: &serde_json::Error) -> Event {
    match err.classify() {
        serde_json::error::Category::Data => diagnostic(
            DiagnosticCode::BadShape,
            format!("unreadable message: {err}"),
            line,
        ),
        _ => diagnostic(DiagnosticCode::NotJson, format!("not JSON: {err}"), line),
    }
}

fn unknown(message_type: String, line: &[u8]) -> Event {
    match whole(line) {
        Some(raw) => Event::Unknown(Unknown { message_type, raw }),
        None => diagnostic(
            DiagnosticCode::NotJson,
            "line is not valid JSON".to_string(),
            line,
        ),
    }
}

/// A known type whose shape could not be read: a diagnostic, and the message kept whole.
fn bad_shape(ty: &str, why: &str, line: &[u8], out: &mut Vec<Event>) {
    out.push(diagnostic(DiagnosticCode::BadShape, why.to_string(), line));
    out.push(unknown(ty.to_string(), line));
}

fn system_notice(source_type: &str, env: &Envelope<'_>, line: &[u8]) -> Event {
    match whole(line) {
        Some(fields) => Event::SystemNotice(SystemNotice {
            source_type: source_type.to_string(),
            subtype: env.subtype.owned(),
            parent_tool_use_id: env.parent_tool_use_id.owned(),
            detail: match (source_type, env.subtype.as_deref()) {
                // Both of its fields are in the envelope (the same lenient reading as the
                // detail's own parse).
                ("system", Some("status")) => Some(NoticeDetail::Status(CliStatus {
                    status: env.status.owned(),
                    permission_mode: env.permission_mode.owned(),
                })),
                (ty, sub) => crate::detail::notice_detail(ty, sub, &fields.0),
            },
            fields,
        }),
        None => diagnostic(
            DiagnosticCode::NotJson,
            "line is not valid JSON".to_string(),
            line,
        ),
    }
}

/// Names from a list of strings or of objects with a `name` (older docs show tool schemas).
fn name_list(raw: Option<&RawValue>) -> Option<Vec<String>> {
    let raw = raw?;
    let items: Vec<&RawValue> = view(raw)?;
    Some(
        items
            .into_iter()
            .filter_map(|item| {
                let s: Option<LStr<'_>> = view(item);
                if let Some(name) = s.and_then(|s| s.owned()) {
                    return Some(name);
                }
                #[derive(serde::Deserialize)]
                struct Named<'a> {
                    #[serde(borrow, default)]
                    name: LStr<'a>,
                }
                view::<Named<'_>>(item).and_then(|n| n.name.owned())
            })
            .collect(),
    )
}

fn session_started(env: &Envelope<'_>) -> Event {
    let mut absent = Vec::new();
    let mut need = |present: bool, name: &str| {
        if !present {
            absent.push(name.to_string());
        }
    };
    need(env.session_id.is_some(), "session_id");
    need(env.model.is_some(), "model");
    need(env.cwd.is_some(), "cwd");
    let tools = name_list(env.tools);
    need(tools.is_some(), "tools");
    need(env.permission_mode.is_some(), "permission_mode");
    need(env.claude_code_version.is_some(), "cli_version");
    let capabilities = name_list(env.capabilities);
    need(capabilities.is_some(), "capabilities");
    Event::SessionStarted(SessionStarted {
        session_id: env.session_id.owned().unwrap_or_default(),
        model: env.model.owned(),
        cwd: env.cwd.owned(),
        tools: tools.unwrap_or_default(),
        permission_mode: env.permission_mode.owned(),
        cli_version: env.claude_code_version.owned(),
        capabilities: capabilities.unwrap_or_default(),
        api_key_source: env.api_key_source.owned(),
        slash_commands: name_list(env.slash_commands).unwrap_or_default(),
        mcp_servers: env.mcp_servers.map(raw_json),
        absent,
    })
}

/// A block from its raw slice: typed when possible, else kept whole as `Other`.
fn content_block(raw: &RawValue) -> ContentBlock {
    // A bare string is a text block.
    if let Some(text) = view::<LStr<'_>>(raw).and_then(|s| s.owned()) {
        return ContentBlock::Text { text };
    }
    let b = view::<WireBlock<'_>>(raw);
    if let Some(block) = b.as_ref().and_then(typed_block) {
        return block;
    }
    ContentBlock::Other {
        block_type: b.and_then(|b| b.ty.owned()).unwrap_or_default(),
        raw: raw_json(raw),
    }
}

/// A block of a known type with the fields it needs; `None` otherwise (then kept raw).
fn typed_block(b: &WireBlock<'_>) -> Option<ContentBlock> {
    match b.ty.as_deref()? {
        "text" => Some(ContentBlock::Text {
            text: b.text.owned()?,
        }),
        "thinking" => Some(ContentBlock::Thinking {
            thinking: b.thinking.owned()?,
            signature: b.signature.owned(),
        }),
        "redacted_thinking" => Some(ContentBlock::RedactedThinking {
            data: b.data.owned()?,
        }),
        "tool_use" => {
            // An input that is present but cannot be built as a value (only possible past
            // serde_json's recursion limit) keeps the block whole rather than inventing one.
            let input = match b.input {
                None => Some(Value::Object(Default::default())),
                Some(i) => serde_json::from_str::<Value>(i.get()).ok(),
            };
            Some(ContentBlock::ToolUse {
                id: b.id.owned()?,
                name: b.name.owned()?,
                input: input?,
            })
        }
        _ => None,
    }
}

fn delta(raw: &RawValue) -> Delta {
    let other = |delta_type: &str| Delta::Other {
        delta_type: delta_type.to_string(),
        raw: raw_json(raw),
    };
    let Some(d) = view::<WireDelta<'_>>(raw) else {
        return other("");
    };
    let ty = d.ty.as_deref().unwrap_or("");
    let got = match ty {
        "text_delta" => d.text.owned().map(Delta::Text),
        "thinking_delta" => d.thinking.owned().map(Delta::Thinking),
        "input_json_delta" => d.partial_json.owned().map(Delta::InputJson),
        "signature_delta" => d.signature.owned().map(Delta::Signature),
        _ => None,
    };
    got.unwrap_or_else(|| other(ty))
}

fn user(env: &Envelope<'_>, line: &[u8], out: &mut Vec<Event>) {
    let Some(msg) = env.message.0.as_ref() else {
        return bad_shape("user", "user frame without a `message` object", line, out);
    };
    let parent = env.parent_tool_use_id.owned();
    let agent = SubAgent::of(env);
    let mut message = UserMessage {
        parent_tool_use_id: parent.clone(),
        text: None,
        content: None,
        is_synthetic: env.is_synthetic.0.unwrap_or(false),
        is_replay: env.is_replay.0.unwrap_or(false),
        uuid: env.uuid.owned(),
        agent_id: agent.agent_id.clone(),
        subagent_type: agent.subagent_type.clone(),
        task_description: agent.task_description.clone(),
    };
    let items = match &msg.content {
        LContent::Absent => {
            out.push(Event::UserMessage(message));
            return;
        }
        LContent::Text(t) => {
            message.is_synthetic |= is_interruption_marker(t);
            message.text = Some(t.to_string());
            out.push(Event::UserMessage(message));
            return;
        }
        LContent::Odd => {
            message.content = raw_content_items(line).first().map(|r| raw_json(r));
            out.push(Event::UserMessage(message));
            return;
        }
        LContent::Blocks(items) => items,
    };
    let mut rest: Vec<usize> = Vec::new();
    let mut texts: Vec<&str> = Vec::new();
    let mut all_text = true;
    // The frame's structured result (one per frame): on its first tool result's event.
    let not_null = |v: &Option<&RawValue>| v.filter(|v| !is_null(v)).map(raw_json);
    let mut structured = Some((
        not_null(&env.tool_use_result),
        not_null(&env.tool_result_meta),
    ));
    // The entries of `tool_result_meta`, read once per frame (2.1.330 and later).
    let metas: Vec<LObj<WireResultMeta<'_>>> =
        env.tool_result_meta.and_then(view).unwrap_or_default();
    for (pos, item) in items.iter().enumerate() {
        let b = item.0.as_ref();
        match b.and_then(|b| b.ty.as_deref()) {
            Some("tool_result") => {
                if let Some(b) = b {
                    let (result, meta) = structured.take().unwrap_or_default();
                    let decision = permission_decision(&metas, b.tool_use_id.as_deref());
                    out.push(tool_result(
                        b,
                        parent.clone(),
                        result,
                        meta,
                        decision,
                        &agent,
                    ));
                }
            }
            Some("text") if b.is_some_and(|b| b.text.is_some()) => {
                texts.push(b.and_then(|b| b.text.as_deref()).unwrap_or_default());
                rest.push(pos);
            }
            _ => {
                all_text = false;
                rest.push(pos);
            }
        }
    }
    if rest.is_empty() {
        return;
    }
    if all_text {
        let text = texts.join("\n");
        // The CLI writes its interruption marker as a plain user frame without
        // `isSynthetic` (2.1.330, 1.0.x): it is the CLI's, not the user's.
        message.is_synthetic |= is_interruption_marker(&text);
        message.text = Some(text);
    } else {
        let raws = raw_content_items(line);
        let joined = rest
            .iter()
            .map(|p| raws.get(*p).map_or("null", |r| r.get()))
            .collect::<Vec<_>>()
            .join(",");
        message.content = RawJson::from_string(format!("[{joined}]")).ok();
    }
    out.push(Event::UserMessage(message));
}

/// The markers the CLI writes when a turn is interrupted: `[Request interrupted by user]`
/// and `[Request interrupted by user for tool use]`.
pub fn is_interruption_marker(text: &str) -> bool {
    let t = text.trim();
    t.starts_with("[Request interrupted by user") && t.ends_with(']') && t.len() <= 64
}

/// The sub-agent identity of an `assistant` / `user` frame (2.1.330 and later).
struct SubAgent {
    agent_id: Option<String>,
    subagent_type: Option<String>,
    task_description: Option<String>,
}

impl SubAgent {
    fn of(env: &Envelope<'_>) -> Self {
        SubAgent {
            agent_id: env.agent_id.owned(),
            subagent_type: env.subagent_type.owned(),
            task_description: env.task_description.owned(),
        }
    }
}

/// The `permission_decision` of the `tool_result_meta` entry whose `id` is `tool_use_id`.
fn permission_decision(
    metas: &[LObj<WireResultMeta<'_>>],
    tool_use_id: Option<&str>,
) -> Option<PermissionDecision> {
    let id = tool_use_id?;
    let d = metas
        .iter()
        .filter_map(|m| m.0.as_ref())
        .find(|m| m.id.as_deref() == Some(id))?
        .permission_decision
        .0
        .as_ref()?;
    Some(PermissionDecision {
        decision: d.decision.owned(),
        source: d.source.owned(),
        reason_type: d.reason_type.owned(),
    })
}

fn tool_result(
    b: &WireBlock<'_>,
    parent_tool_use_id: Option<String>,
    tool_use_result: Option<RawJson>,
    tool_result_meta: Option<RawJson>,
    permission_decision: Option<PermissionDecision>,
    agent: &SubAgent,
) -> Event {
    let mut absent = Vec::new();
    let tool_use_id = b.tool_use_id.owned();
    if tool_use_id.is_none() {
        absent.push("tool_use_id".to_string());
    }
    let content = match b.content {
        None => {
            absent.push("content".to_string());
            ToolResultContent::Null
        }
        Some(c) if is_null(c) => ToolResultContent::Null,
        Some(c) => match view::<LStr<'_>>(c).and_then(|s| s.owned()) {
            Some(text) => ToolResultContent::Text(text),
            None => ToolResultContent::Blocks(raw_json(c)),
        },
    };
    Event::ToolResult(ToolResult {
        tool_use_id,
        parent_tool_use_id,
        content,
        is_error: b.is_error.0.unwrap_or(false),
        tool_use_result,
        tool_result_meta,
        permission_decision,
        agent_id: agent.agent_id.clone(),
        subagent_type: agent.subagent_type.clone(),
        task_description: agent.task_description.clone(),
        absent,
    })
}

/// `result.result`: plain text, or text that was itself JSON-encoded (`"\"text\""`).
fn result_text(text: Option<&str>) -> Option<String> {
    let text = text?;
    let t = text.trim();
    if t.len() >= 2
        && t.starts_with('"')
        && t.ends_with('"')
        && let Ok(inner) = serde_json::from_str::<String>(t)
    {
        return Some(inner);
    }
    Some(text.to_string())
}

fn turn_result(env: &Envelope<'_>) -> Event {
    let mut absent = Vec::new();
    let subtype = env.subtype.owned();
    if subtype.is_none() {
        absent.push("subtype".to_string());
    }
    let subtype = subtype.unwrap_or_default();
    let is_error = match env.is_error.0 {
        Some(b) => b,
        None => {
            absent.push("is_error".to_string());
            subtype != "success"
        }
    };
    let usage = env.usage.and_then(view::<WireUsage>).map(|u| u.to_usage());
    if usage.is_none() {
        absent.push("usage".to_string());
    }
    let total_cost_usd = env.total_cost_usd.f64();
    if total_cost_usd.is_none() {
        absent.push("total_cost_usd".to_string());
    }
    let permission_denials = env
        .permission_denials
        .and_then(view::<Vec<&RawValue>>)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|d| {
            let d = view::<WireDenial<'_>>(d)?;
            Some(PermissionDenial {
                tool_name: d.tool_name.owned().unwrap_or_default(),
                tool_use_id: d.tool_use_id.owned(),
                tool_input: d
                    .tool_input
                    .and_then(|i| serde_json::from_str::<Value>(i.get()).ok()),
            })
        })
        .collect();
    let errors = env
        .errors
        .and_then(view::<Vec<&RawValue>>)
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            view::<LStr<'_>>(e)
                .and_then(|s| s.owned())
                .unwrap_or_else(|| e.get().to_string())
        })
        .collect();
    let mut user_message_uuids: Vec<String> = env
        .user_message_uuids
        .and_then(view::<Vec<&RawValue>>)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|u| view::<LStr<'_>>(u).and_then(|s| s.owned()))
        .collect();
    if user_message_uuids.is_empty()
        && let Some(u) = env.user_message_uuid.owned()
    {
        user_message_uuids.push(u);
    }
    Event::TurnResult(TurnResult {
        subtype,
        is_error,
        result: result_text(env.result.0.as_deref()),
        session_id: env.session_id.owned(),
        num_turns: env.num_turns.u32(),
        duration_ms: env.duration_ms.u64(),
        duration_api_ms: env.duration_api_ms.u64(),
        total_cost_usd,
        usage,
        model_usage: env.model_usage.map(raw_json),
        permission_denials,
        errors,
        stop_reason: env.stop_reason.owned(),
        terminal_reason: env.terminal_reason.owned(),
        structured_output: env
            .structured_output
            .filter(|v| v.get() != "null")
            .map(raw_json),
        user_message_uuids,
        absent,
    })
}

fn control_request(env: &Envelope<'_>, line: &[u8], out: &mut Vec<Event>) {
    let Some(request_id) = env.request_id.owned() else {
        return bad_shape(
            "control_request",
            "control_request without request_id",
            line,
            out,
        );
    };
    let Some(raw_req) = env.request else {
        return bad_shape(
            "control_request",
            "control_request without `request`",
            line,
            out,
        );
    };
    let Some(req) = view::<WireCliRequest<'_>>(raw_req) else {
        return bad_shape("control_request", "`request` is not an object", line, out);
    };
    let request = match req.subtype.as_deref() {
        Some("can_use_tool") => {
            let mut absent = Vec::new();
            let tool_name = req.tool_name.owned();
            if tool_name.is_none() {
                absent.push("tool_name".to_string());
            }
            let input = match req.input {
                None => None,
                Some(i) => match serde_json::from_str::<Value>(i.get()) {
                    Ok(v) => Some(v),
                    // Present but not buildable (past the recursion limit): kept whole, so
                    // the owner answers it with an error instead of acting on a guess.
                    Err(_) => {
                        out.push(Event::ControlRequest(ControlRequest {
                            request_id,
                            request: CliRequest::Other {
                                request_subtype: "can_use_tool".to_string(),
                                raw: raw_json(raw_req),
                            },
                        }));
                        return;
                    }
                },
            };
            if input.is_none() {
                absent.push("input".to_string());
            }
            let tool_use_id = req.tool_use_id.owned();
            if tool_use_id.is_none() {
                absent.push("tool_use_id".to_string());
            }
            CliRequest::CanUseTool(CanUseTool {
                tool_name: tool_name.unwrap_or_default(),
                input: input.unwrap_or(Value::Null),
                tool_use_id,
                permission_suggestions: req
                    .permission_suggestions
                    .filter(|r| !is_null(r))
                    .map(raw_json),
                blocked_path: req.blocked_path.owned(),
                decision_reason: req.decision_reason.filter(|r| !is_null(r)).map(|r| {
                    view::<LStr<'_>>(r)
                        .and_then(|s| s.owned())
                        .unwrap_or_else(|| r.get().to_string())
                }),
                description: req.description.owned(),
                display_name: req.display_name.owned(),
                agent_id: req.agent_id.owned(),
                absent,
            })
        }
        Some("hook_callback") => CliRequest::HookCallback(HookCallback {
            callback_id: req.callback_id.owned().unwrap_or_default(),
            input: req.input.filter(|r| !is_null(r)).map(raw_json),
            tool_use_id: req.tool_use_id.owned(),
        }),
        other => CliRequest::Other {
            request_subtype: other.unwrap_or("").to_string(),
            raw: raw_json(raw_req),
        },
    };
    out.push(Event::ControlRequest(ControlRequest {
        request_id,
        request,
    }));
}

fn control_response(env: &Envelope<'_>, line: &[u8], out: &mut Vec<Event>) {
    let Some(resp) = env.response.0.as_ref() else {
        return bad_shape(
            "control_response",
            "control_response without `response`",
            line,
            out,
        );
    };
    let Some(request_id) = resp.request_id.owned().or_else(|| env.request_id.owned()) else {
        return bad_shape(
            "control_response",
            "control_response without request_id",
            line,
            out,
        );
    };
    let outcome = match resp.subtype.as_deref() {
        Some("success") => ControlOutcome::Success {
            response: resp.response.filter(|r| !is_null(r)).map(raw_json),
        },
        Some("error") => ControlOutcome::Error {
            error: resp.error.owned().unwrap_or_default(),
            error_code: resp.error_code.owned(),
        },
        Some(other) => {
            out.push(unknown(format!("control_response/{other}"), line));
            return;
        }
        None => {
            return bad_shape(
                "control_response",
                "control_response without subtype",
                line,
                out,
            );
        }
    };
    out.push(Event::ControlResponse(ControlResponse {
        request_id,
        outcome,
    }));
}
