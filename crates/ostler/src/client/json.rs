//! JSON forms of API messages for `--json` output (one object per line).
//!
//! Events: `{"type": "<payload kind>", "session_id", "seq", "ts_ms", ...payload fields}`;
//! the payload kinds are the `SessionEvent.payload` field names (`assistant_block`,
//! `permission_requested`, `turn_completed`, ...). Fields that the API carries as JSON text
//! (`*_json`) are emitted parsed, under the name without the `_json` suffix (text that is
//! not valid JSON is kept as a string). Enums are lower-case names (`idle`, `allowed`).

use ostler_proto::v1 as pb;
use pb::session_event::Payload;
use serde_json::{Value, json};

/// Parse JSON text; empty text becomes `null`, invalid text stays a string.
pub(super) fn parsed(text: &str) -> Value {
    if text.is_empty() {
        return Value::Null;
    }
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

fn lower(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix)
        .unwrap_or(name)
        .to_ascii_lowercase()
}

pub fn state_name(v: i32) -> String {
    match pb::SessionState::try_from(v) {
        Ok(s) => lower(s.as_str_name(), "SESSION_STATE_"),
        Err(_) => format!("unknown({v})"),
    }
}

pub fn mode_name(v: i32) -> String {
    match pb::PermissionMode::try_from(v) {
        Ok(pb::PermissionMode::Unspecified) => "default".to_owned(),
        Ok(m) => lower(m.as_str_name(), "PERMISSION_MODE_"),
        Err(_) => format!("unknown({v})"),
    }
}

/// A hook decision's name (`allow`, `deny`, ...).
pub fn hook_decision_name(v: i32) -> String {
    match pb::HookDecision::try_from(v) {
        Ok(d) => lower(d.as_str_name(), "HOOK_DECISION_"),
        Err(_) => format!("unknown({v})"),
    }
}

/// A tool result's content blocks as JSON.
pub fn tool_content(c: &[pb::ToolContent]) -> Value {
    use pb::tool_content::Block;
    c.iter()
        .map(|b| match &b.block {
            Some(Block::Text(t)) => json!({"type": "text", "text": t}),
            Some(Block::Image(i)) => {
                json!({"type": "image", "mimeType": i.media_type, "data": i.data_base64})
            }
            Some(Block::Json(j)) => parsed(j),
            None => Value::Null,
        })
        .collect()
}

/// An elicitation action's name (`accept`, `decline`, `cancel`).
pub fn elicitation_action_name(v: i32) -> String {
    match pb::ElicitationAction::try_from(v) {
        Ok(a) => lower(a.as_str_name(), "ELICITATION_ACTION_"),
        Err(_) => format!("unknown({v})"),
    }
}

pub fn resolution_name(v: i32) -> String {
    match pb::Resolution::try_from(v) {
        Ok(r) => lower(r.as_str_name(), "RESOLUTION_"),
        Err(_) => format!("unknown({v})"),
    }
}

pub fn usage(u: Option<&pb::Usage>) -> Value {
    let u = u.copied().unwrap_or_default();
    json!({
        "input_tokens": u.input_tokens,
        "output_tokens": u.output_tokens,
        "cache_creation_input_tokens": u.cache_creation_input_tokens,
        "cache_read_input_tokens": u.cache_read_input_tokens,
    })
}

pub fn exit(e: &pb::ProcessExited) -> Value {
    json!({
        "exit_code": e.exit_code,
        "signal": e.signal,
        "stderr_tail": e.stderr_tail,
        "reason": e.reason,
    })
}

/// A session.
pub fn session(s: &pb::Session) -> Value {
    json!({
        "id": s.id,
        "cli_session_id": s.cli_session_id,
        "state": state_name(s.state),
        "cwd": s.cwd,
        "model": s.model,
        "permission_mode": mode_name(s.permission_mode),
        "labels": s.labels,
        "created_at_ms": s.created_at_ms,
        "updated_at_ms": s.updated_at_ms,
        "last_seq": s.last_seq,
        "pending_interactions": s.pending_interactions,
        "cli_version": s.cli_version,
        "last_exit": s.last_exit.as_ref().map(exit),
        "turns": s.turns,
        "usage": usage(s.usage.as_ref()),
        "total_cost_usd": s.total_cost_usd,
        "title": s.title,
        "archived": s.archived,
    })
}

/// The kind of an event (`assistant_block`, ...); `none` for an event without payload.
pub fn kind(p: Option<&Payload>) -> &'static str {
    match p {
        None => "none",
        Some(Payload::SessionStarted(_)) => "session_started",
        Some(Payload::UserMessage(_)) => "user_message",
        Some(Payload::AssistantBlock(_)) => "assistant_block",
        Some(Payload::ToolResult(_)) => "tool_result",
        Some(Payload::PermissionRequested(_)) => "permission_requested",
        Some(Payload::PermissionResolved(_)) => "permission_resolved",
        Some(Payload::QuestionAsked(_)) => "question_asked",
        Some(Payload::QuestionAnswered(_)) => "question_answered",
        Some(Payload::TurnCompleted(_)) => "turn_completed",
        Some(Payload::StateChanged(_)) => "state_changed",
        Some(Payload::SystemNotice(_)) => "system_notice",
        Some(Payload::ProcessExited(_)) => "process_exited",
        Some(Payload::Diagnostic(_)) => "diagnostic",
        Some(Payload::Unknown(_)) => "unknown",
        Some(Payload::PartialDelta(_)) => "partial_delta",
        Some(Payload::EngineNotice(_)) => "engine_notice",
        Some(Payload::PartialsMissed(_)) => "partials_missed",
        Some(Payload::HookRequested(_)) => "hook_requested",
        Some(Payload::HookResolved(_)) => "hook_resolved",
        Some(Payload::ToolCallRequested(_)) => "tool_call_requested",
        Some(Payload::ToolCallResolved(_)) => "tool_call_resolved",
        Some(Payload::ElicitationRequested(_)) => "elicitation_requested",
        Some(Payload::ElicitationResolved(_)) => "elicitation_resolved",
        Some(Payload::ElicitationCompleted(_)) => "elicitation_completed",
        Some(Payload::DialogRequested(_)) => "dialog_requested",
        Some(Payload::DialogResolved(_)) => "dialog_resolved",
        Some(Payload::HookActivity(_)) => "hook_activity",
        Some(Payload::Informational(_)) => "informational",
        Some(Payload::PromptSuggestion(_)) => "prompt_suggestion",
        Some(Payload::TaskStarted(_)) => "task_started",
        Some(Payload::TaskProgress(_)) => "task_progress",
        Some(Payload::TaskNotification(_)) => "task_notification",
        Some(Payload::RateLimit(_)) => "rate_limit",
        Some(Payload::CompactBoundary(_)) => "compact_boundary",
        Some(Payload::CliStatus(_)) => "cli_status",
        Some(Payload::MessageLifecycle(_)) => "message_lifecycle",
    }
}

fn answers(a: &[pb::QuestionAnswer]) -> Value {
    a.iter()
        .map(
            |a| json!({"question": a.question, "selected": a.selected, "other_text": a.other_text}),
        )
        .collect()
}

/// A turn's result.
pub fn turn(t: &pb::TurnCompleted) -> Value {
    json!({
        "subtype": t.subtype,
        "is_error": t.is_error,
        "result": t.result,
        "num_turns": t.num_turns,
        "duration_ms": t.duration_ms,
        "duration_api_ms": t.duration_api_ms,
        "total_cost_usd": t.total_cost_usd,
        "usage": usage(t.usage.as_ref()),
        "errors": t.errors,
        "stop_reason": t.stop_reason,
        "denied_tools": t.denied_tools,
        "model_usage": t.model_usage.iter().map(|m| json!({
            "model": m.model, "input_tokens": m.input_tokens, "output_tokens": m.output_tokens,
            "cache_read_input_tokens": m.cache_read_input_tokens,
            "cache_creation_input_tokens": m.cache_creation_input_tokens,
            "web_search_requests": m.web_search_requests, "cost_usd": m.cost_usd,
            "context_window": m.context_window, "max_output_tokens": m.max_output_tokens,
        })).collect::<Vec<_>>(),
        "terminal_reason": t.terminal_reason,
        "structured_output": parsed(&t.structured_output_json),
        "user_message_ids": t.user_message_ids,
    })
}

fn task_usage(u: Option<&pb::TaskUsage>) -> Value {
    u.map_or(Value::Null, |u| {
        json!({"total_tokens": u.total_tokens, "tool_uses": u.tool_uses, "duration_ms": u.duration_ms})
    })
}

fn payload(p: &Payload) -> Value {
    use pb::assistant_block::Block;
    use pb::partial_delta::Delta;
    match p {
        Payload::SessionStarted(s) => json!({
            "cli_session_id": s.cli_session_id, "model": s.model, "cwd": s.cwd,
            "tools": s.tools, "permission_mode": s.permission_mode,
            "cli_version": s.cli_version, "capabilities": s.capabilities,
        }),
        Payload::UserMessage(m) => json!({
            "sent_by": m.sent_by, "text": m.text, "content": parsed(&m.content_json),
            "client_message_id": m.client_message_id, "is_synthetic": m.is_synthetic,
            "is_replay": m.is_replay, "message_id": m.message_id,
            "priority": match m.priority() {
                pb::MessagePriority::Now => "now",
                pb::MessagePriority::Next => "next",
                pb::MessagePriority::Later => "later",
                pb::MessagePriority::Unspecified => "",
            },
            "verbatim": m.verbatim, "context_only": m.context_only, "pasted": m.pasted,
        })
        .with_agent(&m.agent_id, &m.subagent_type, &m.task_description),
        Payload::AssistantBlock(b) => {
            let block = match &b.block {
                Some(Block::Text(t)) => json!({"type": "text", "text": t.text}),
                Some(Block::Thinking(t)) => {
                    json!({"type": "thinking", "thinking": t.thinking, "signature": t.signature})
                }
                Some(Block::ToolUse(t)) => json!({
                    "type": "tool_use", "id": t.id, "name": t.name, "input": parsed(&t.input_json),
                }),
                Some(Block::RedactedThinking(t)) => {
                    json!({"type": "redacted_thinking", "data": t.data})
                }
                Some(Block::Other(o)) => {
                    json!({"type": o.block_type, "raw": parsed(&o.raw_json)})
                }
                None => Value::Null,
            };
            json!({
                "message_id": b.message_id, "index": b.index, "model": b.model,
                "block": block, "stop_reason": b.stop_reason,
                "usage": b.usage.as_ref().map(|u| usage(Some(u))), "error": b.error,
            })
            .with_agent(&b.agent_id, &b.subagent_type, &b.task_description)
        }
        Payload::ToolResult(r) => {
            let content = match &r.content {
                Some(pb::tool_result::Content::Text(t)) => Value::String(t.clone()),
                Some(pb::tool_result::Content::BlocksJson(j)) => parsed(j),
                None => Value::Null,
            };
            json!({
                "tool_use_id": r.tool_use_id, "content": content, "is_error": r.is_error,
                "tool_use_result": parsed(&r.tool_use_result_json),
                "tool_result_meta": parsed(&r.tool_result_meta_json),
            })
            .with_set(&[
                ("permission_decision", &r.permission_decision),
                ("permission_source", &r.permission_source),
                ("permission_reason_type", &r.permission_reason_type),
            ])
            .with_agent(&r.agent_id, &r.subagent_type, &r.task_description)
        }
        Payload::PermissionRequested(r) => json!({
            "request_id": r.request_id, "tool_name": r.tool_name, "input": parsed(&r.input_json),
            "tool_use_id": r.tool_use_id, "suggestions": parsed(&r.suggestions_json),
            "blocked_path": r.blocked_path, "decision_reason": r.decision_reason,
            "description": r.description, "agent_id": r.agent_id,
        }),
        Payload::PermissionResolved(r) => json!({
            "request_id": r.request_id, "resolution": resolution_name(r.resolution),
            "message": r.message, "updated_input": parsed(&r.updated_input_json),
            "resolved_by": r.resolved_by, "edited": r.edited, "interrupt": r.interrupt,
            "updated_permissions": parsed(&r.updated_permissions_json),
        }),
        Payload::QuestionAsked(q) => json!({
            "request_id": q.request_id, "tool_use_id": q.tool_use_id,
            "questions": q.questions.iter().map(question).collect::<Vec<_>>(),
        })
        .with_set(&[("title", &q.title)]),
        Payload::QuestionAnswered(a) => json!({
            "request_id": a.request_id, "answers": answers(&a.answers),
            "resolution": resolution_name(a.resolution), "resolved_by": a.resolved_by,
        }),
        Payload::TurnCompleted(t) => turn(t),
        Payload::StateChanged(s) => json!({
            "from": state_name(s.from), "to": state_name(s.to), "reason": s.reason,
        }),
        Payload::SystemNotice(n) => json!({
            "source_type": n.source_type, "subtype": n.subtype, "fields": parsed(&n.fields_json),
        }),
        Payload::ProcessExited(e) => exit(e),
        Payload::Diagnostic(d) => json!({
            "code": d.code, "message": d.message, "excerpt": d.excerpt, "line_len": d.line_len,
        }),
        Payload::Unknown(u) => json!({"message_type": u.message_type, "raw": parsed(&u.raw_json)}),
        Payload::PartialDelta(d) => {
            let (k, v) = match &d.delta {
                Some(Delta::Text(t)) => ("text", Value::String(t.clone())),
                Some(Delta::Thinking(t)) => ("thinking", Value::String(t.clone())),
                Some(Delta::InputJson(t)) => ("input_json", Value::String(t.clone())),
                Some(Delta::Signature(t)) => ("signature", Value::String(t.clone())),
                Some(Delta::OtherJson(t)) => ("other", parsed(t)),
                None => ("none", Value::Null),
            };
            json!({"message_id": d.message_id, "index": d.index, "delta_type": k, "delta": v})
        }
        Payload::EngineNotice(n) => json!({
            "code": n.code, "message": n.message, "data": parsed(&n.data_json),
        }),
        Payload::PartialsMissed(m) => json!({"count": m.count}),
        Payload::HookRequested(h) => json!({
            "request_id": h.request_id, "hook_event": h.hook_event,
            "registration_id": h.registration_id, "input": parsed(&h.input_json),
            "tool_use_id": h.tool_use_id, "tool_name": h.tool_name,
            "expires_at_ms": h.expires_at_ms, "agent_id": h.agent_id,
        }),
        Payload::HookResolved(h) => json!({
            "request_id": h.request_id, "resolution": resolution_name(h.resolution),
            "decision": hook_decision_name(h.decision), "reason": h.reason,
            "updated_input": parsed(&h.updated_input_json),
            "additional_context": h.additional_context, "stop": h.stop,
            "stop_reason": h.stop_reason, "system_message": h.system_message,
            "resolved_by": h.resolved_by, "output": parsed(&h.output_json),
        }),
        Payload::ToolCallRequested(t) => json!({
            "request_id": t.request_id, "server_name": t.server_name,
            "tool_name": t.tool_name, "arguments": parsed(&t.arguments_json),
            "expires_at_ms": t.expires_at_ms,
        }),
        Payload::ToolCallResolved(t) => json!({
            "request_id": t.request_id, "resolution": resolution_name(t.resolution),
            "content": tool_content(&t.content), "is_error": t.is_error,
            "resolved_by": t.resolved_by,
        }),
        Payload::ElicitationRequested(e) => json!({
            "request_id": e.request_id, "mcp_server_name": e.mcp_server_name,
            "message": e.message, "mode": e.mode, "url": e.url,
            "elicitation_id": e.elicitation_id,
            "requested_schema": parsed(&e.requested_schema_json),
            "title": e.title, "display_name": e.display_name, "description": e.description,
            "expires_at_ms": e.expires_at_ms, "request": parsed(&e.request_json),
        }),
        Payload::ElicitationResolved(e) => json!({
            "request_id": e.request_id, "resolution": resolution_name(e.resolution),
            "action": elicitation_action_name(e.action), "content": parsed(&e.content_json),
            "resolved_by": e.resolved_by,
        }),
        Payload::DialogRequested(d) => json!({
            "request_id": d.request_id, "dialog_kind": d.dialog_kind,
            "payload": parsed(&d.payload_json), "tool_use_id": d.tool_use_id,
            "expires_at_ms": d.expires_at_ms, "request": parsed(&d.request_json),
        }),
        Payload::DialogResolved(d) => json!({
            "request_id": d.request_id, "resolution": resolution_name(d.resolution),
            "behavior": super::dialogs::behavior_name(d.behavior),
            "result": parsed(&d.result_json), "resolved_by": d.resolved_by,
        }),
        Payload::HookActivity(h) => json!({
            "phase": h.phase, "hook_id": h.hook_id, "hook_name": h.hook_name,
            "hook_event": h.hook_event, "stdout": h.stdout, "stderr": h.stderr,
            "output": h.output, "exit_code": h.exit_code, "outcome": h.outcome,
        }),
        Payload::Informational(i) => json!({
            "content": i.content, "level": i.level, "tool_use_id": i.tool_use_id,
            "prevent_continuation": i.prevent_continuation, "tag": i.tag,
        }),
        Payload::PromptSuggestion(p) => json!({ "suggestion": p.suggestion }),
        Payload::ElicitationCompleted(e) => json!({
            "mcp_server_name": e.mcp_server_name, "elicitation_id": e.elicitation_id,
            "fields": parsed(&e.fields_json),
        }),
        Payload::TaskStarted(t) => json!({
            "task_id": t.task_id, "tool_use_id": t.tool_use_id, "description": t.description,
            "task_type": t.task_type, "subagent_type": t.subagent_type,
            "is_backgrounded": t.is_backgrounded, "fields": parsed(&t.fields_json),
        }),
        Payload::TaskProgress(t) => json!({
            "task_id": t.task_id, "tool_use_id": t.tool_use_id, "description": t.description,
            "last_tool_name": t.last_tool_name, "summary": t.summary,
            "usage": task_usage(t.usage.as_ref()), "fields": parsed(&t.fields_json),
        }),
        Payload::TaskNotification(t) => json!({
            "task_id": t.task_id, "tool_use_id": t.tool_use_id, "status": t.status,
            "summary": t.summary, "output_file": t.output_file,
            "usage": task_usage(t.usage.as_ref()), "fields": parsed(&t.fields_json),
        }),
        Payload::RateLimit(r) => json!({
            "status": r.status, "resets_at": r.resets_at, "rate_limit_type": r.rate_limit_type,
            "utilization": r.utilization, "is_using_overage": r.is_using_overage,
            "fields": parsed(&r.fields_json),
        }),
        Payload::CompactBoundary(c) => json!({
            "trigger": c.trigger, "pre_tokens": c.pre_tokens, "post_tokens": c.post_tokens,
            "fields": parsed(&c.fields_json),
        }),
        Payload::CliStatus(c) => json!({
            "status": c.status, "permission_mode": c.permission_mode,
            "fields": parsed(&c.fields_json),
        }),
        Payload::MessageLifecycle(m) => json!({
            "message_id": m.message_id, "state": m.state,
            "fields": parsed(&m.fields_json),
        }),
    }
}

/// Fields of an event object that are shown only when set (the CLI sends them on some
/// frames of some releases).
trait WithSet: Sized {
    /// Adds each `(key, value)` whose value is not empty.
    fn with_set(self, fields: &[(&str, &str)]) -> Self;
    /// Adds `key` when `value` is `Some` (an empty string too).
    fn with_some(self, key: &str, value: Option<impl Into<Value>>) -> Self;
    /// Adds `key: true` when `flag` is set.
    fn with_flag(self, key: &str, flag: bool) -> Self {
        self.with_some(key, flag.then_some(true))
    }
    /// The sub-agent that wrote the frame (`agent_id`, `subagent_type`,
    /// `task_description`), when it is one.
    fn with_agent(self, agent_id: &str, subagent_type: &str, task: &str) -> Self {
        self.with_set(&[
            ("agent_id", agent_id),
            ("subagent_type", subagent_type),
            ("task_description", task),
        ])
    }
}

impl WithSet for Value {
    fn with_set(mut self, fields: &[(&str, &str)]) -> Self {
        if let Value::Object(m) = &mut self {
            for (k, v) in fields.iter().filter(|(_, v)| !v.is_empty()) {
                m.insert((*k).to_owned(), Value::String((*v).to_owned()));
            }
        }
        self
    }

    fn with_some(mut self, key: &str, value: Option<impl Into<Value>>) -> Self {
        if let (Value::Object(m), Some(v)) = (&mut self, value) {
            m.insert(key.to_owned(), v.into());
        }
        self
    }
}

/// One event as a JSON object.
pub fn event(e: &pb::SessionEvent) -> Value {
    let mut v = json!({
        "type": kind(e.payload.as_ref()), "session_id": e.session_id, "seq": e.seq,
        "ts_ms": e.ts_ms,
    })
    .with_some("parent_tool_use_id", e.parent_tool_use_id.as_deref())
    .with_flag("redelivered", e.redelivered);
    if let (Value::Object(m), Some(p)) = (&mut v, &e.payload)
        && let Value::Object(fields) = payload(p)
    {
        for (k, v) in fields {
            m.entry(k).or_insert(v);
        }
    }
    v
}

/// One question of a `question_asked` event; the fields of extended questions and
/// previews only when set.
fn question(q: &pb::Question) -> Value {
    let mut v = json!({
        "question": q.question, "header": q.header, "multi_select": q.multi_select,
        "options": q.options.iter().map(|o| {
            json!({"label": o.label, "description": o.description})
                .with_set(&[("preview", &o.preview)])
        }).collect::<Vec<_>>(),
    })
    .with_set(&[
        ("kind", &q.kind),
        ("description", &q.description),
        ("placeholder", &q.placeholder),
        ("unit", &q.unit),
    ]);
    for (k, n) in [
        ("min", q.min),
        ("max", q.max),
        ("step", q.step),
        ("default_value", q.default_value),
    ] {
        v = v.with_some(k, n);
    }
    v.with_flag("optional", q.optional)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_json_flattens_payload_and_parses_json_text() {
        let e = pb::SessionEvent {
            session_id: "s1".into(),
            seq: 7,
            ts_ms: 1,
            parent_tool_use_id: None,
            redelivered: true,
            payload: Some(Payload::PermissionRequested(pb::PermissionRequested {
                request_id: "r1".into(),
                tool_name: "Bash".into(),
                input_json: r#"{"command":"touch x"}"#.into(),
                ..Default::default()
            })),
        };
        let v = event(&e);
        assert_eq!(v["type"], "permission_requested");
        assert_eq!(v["seq"], 7);
        assert_eq!(v["redelivered"], true);
        assert_eq!(v["input"]["command"], "touch x");
        assert_eq!(v["suggestions"], Value::Null);
    }

    #[test]
    fn sub_agent_and_permission_decision_only_when_set() {
        let sub = pb::SessionEvent {
            payload: Some(Payload::ToolResult(pb::ToolResult {
                tool_use_id: "toolu_1".into(),
                permission_decision: "accept".into(),
                permission_source: "user_temporary".into(),
                agent_id: "task-1".into(),
                subagent_type: "general-purpose".into(),
                task_description: "Create sub.txt".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        // A sub-agent's hook call names it; the main agent's leaves it empty.
        for (agent, want) in [("task-1", "task-1"), ("", "")] {
            let h = event(&pb::SessionEvent {
                payload: Some(Payload::HookRequested(pb::HookRequested {
                    request_id: "h1".into(),
                    agent_id: agent.into(),
                    ..Default::default()
                })),
                ..Default::default()
            });
            assert_eq!(
                (&h["type"], &h["agent_id"]),
                (&json!("hook_requested"), &json!(want))
            );
        }
        let v = event(&sub);
        assert_eq!(v["permission_decision"], "accept");
        assert_eq!(v["permission_source"], "user_temporary");
        assert_eq!(v["agent_id"], "task-1");
        assert_eq!(v["subagent_type"], "general-purpose");
        assert_eq!(v["task_description"], "Create sub.txt");
        let o = v.as_object().unwrap();
        assert!(!o.contains_key("permission_reason_type"), "{v}");
        let main = pb::SessionEvent {
            payload: Some(Payload::AssistantBlock(pb::AssistantBlock {
                message_id: "msg_1".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        let v = event(&main);
        let o = v.as_object().unwrap();
        for k in ["agent_id", "subagent_type", "task_description"] {
            assert!(!o.contains_key(k), "{k} in {v}");
        }
        let user = pb::SessionEvent {
            payload: Some(Payload::UserMessage(pb::UserMessage {
                agent_id: "task-2".into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        assert_eq!(event(&user)["agent_id"], "task-2");
    }

    #[test]
    fn extended_questions_as_json() {
        let e = pb::SessionEvent {
            payload: Some(Payload::QuestionAsked(pb::QuestionAsked {
                request_id: "r".into(),
                title: "Before I build".into(),
                questions: vec![
                    pb::Question {
                        question: "Layout?".into(),
                        options: vec![pb::QuestionOption {
                            label: "Grid".into(),
                            preview: "<b>grid</b>".into(),
                            ..Default::default()
                        }],
                        ..Default::default()
                    },
                    pb::Question {
                        question: "Slides?".into(),
                        kind: "number".into(),
                        min: Some(3.0),
                        max: Some(20.0),
                        unit: "slides".into(),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            })),
            ..Default::default()
        };
        let v = event(&e);
        assert_eq!(v["title"], "Before I build");
        assert_eq!(v["questions"][0]["options"][0]["preview"], "<b>grid</b>");
        assert_eq!(v["questions"][0].get("kind"), None, "unset fields left out");
        assert_eq!(v["questions"][1]["kind"], "number");
        assert_eq!(v["questions"][1]["min"], 3.0);
        assert_eq!(v["questions"][1]["max"], 20.0);
        assert_eq!(v["questions"][1]["unit"], "slides");
        assert_eq!(v["questions"][1].get("step"), None);
    }

    #[test]
    fn elicitation_events_as_json() {
        let e = pb::SessionEvent {
            session_id: "s1".into(),
            seq: 9,
            payload: Some(Payload::ElicitationRequested(pb::ElicitationRequested {
                request_id: "el1".into(),
                mcp_server_name: "crm".into(),
                message: "Who?".into(),
                mode: "form".into(),
                requested_schema_json:
                    r#"{"type":"object","properties":{"name":{"type":"string"}}}"#.into(),
                expires_at_ms: 5,
                request_json: r#"{"subtype":"elicitation"}"#.into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        let v = event(&e);
        assert_eq!(v["type"], "elicitation_requested");
        assert_eq!(v["mcp_server_name"], "crm");
        assert_eq!(v["mode"], "form");
        assert_eq!(
            v["requested_schema"]["properties"]["name"]["type"],
            "string"
        );
        assert_eq!(v["request"]["subtype"], "elicitation");
        assert_eq!(v["expires_at_ms"], 5);
        let r = pb::SessionEvent {
            payload: Some(Payload::ElicitationResolved(pb::ElicitationResolved {
                request_id: "el1".into(),
                resolution: pb::Resolution::Answered as i32,
                action: pb::ElicitationAction::Accept as i32,
                content_json: r#"{"name":"Ada"}"#.into(),
                resolved_by: "client:x".into(),
            })),
            ..Default::default()
        };
        let v = event(&r);
        assert_eq!(v["type"], "elicitation_resolved");
        assert_eq!(v["resolution"], "answered");
        assert_eq!(v["action"], "accept");
        assert_eq!(v["content"]["name"], "Ada");
        assert_eq!(v["resolved_by"], "client:x");
        let declined = pb::ElicitationResolved {
            action: pb::ElicitationAction::Decline as i32,
            ..Default::default()
        };
        let v = payload(&Payload::ElicitationResolved(declined));
        assert_eq!(v["action"], "decline");
        assert_eq!(v["content"], Value::Null);
    }

    #[test]
    fn enum_names() {
        assert_eq!(
            state_name(pb::SessionState::AwaitingPermission as i32),
            "awaiting_permission"
        );
        assert_eq!(mode_name(0), "default");
        assert_eq!(
            mode_name(pb::PermissionMode::AcceptEdits as i32),
            "accept_edits"
        );
        assert_eq!(resolution_name(pb::Resolution::Allowed as i32), "allowed");
        assert_eq!(state_name(99), "unknown(99)");
        assert_eq!(
            elicitation_action_name(pb::ElicitationAction::Cancel as i32),
            "cancel"
        );
    }
}
