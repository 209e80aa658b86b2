//! Remote hooks (issue 11), pure: hook registrations -> the `hooks` field of `initialize`,
//! a `hook_callback` input -> what ostler records ([`HookCall`]), a client's answer
//! ([`HookAnswer`]) -> the JSON the CLI takes back, checked against what the hook event
//! takes.
//!
//! Measured on 1.0.108 .. 2.1.330 (`cargo xtask compat probe`): the CLI calls
//! `hook_callback` with `callback_id` = one of the registration's `hookCallbackIds`, `input`
//! = the hook input (`hook_event_name`, `session_id`, `cwd`, and per event `tool_name`,
//! `tool_input`, `tool_use_id`, `prompt`, ...) and a request-level `tool_use_id` (the tool
//! use for tool events, a random uuid otherwise). A PreToolUse answer
//! `hookSpecificOutput.permissionDecision = "deny"` keeps the tool from running and its
//! reason reaches the model as the tool's error result. 1.0.58 / 1.0.59 do not answer
//! `initialize` and never call hooks.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

/// The hook events a registration may name: the Agent SDKs' list (TypeScript SDK 0.3.332).
/// Which of them a release knows is measured per release (`hook_events` in
/// docs/compatibility.md); CreateSession refuses a registration the running release does
/// not know.
pub const HOOK_EVENTS: &[&str] = &[
    "PreToolUse",
    "PostToolUse",
    "PostToolUseFailure",
    "PostToolBatch",
    "Notification",
    "UserPromptSubmit",
    "UserPromptExpansion",
    "SessionStart",
    "SessionEnd",
    "Stop",
    "StopFailure",
    "SubagentStart",
    "SubagentStop",
    "PreCompact",
    "PostCompact",
    "PreModelSwitch",
    "PostModelSwitch",
    "PermissionRequest",
    "PermissionDenied",
    "Setup",
    "TeammateIdle",
    "TaskCreated",
    "TaskCompleted",
    "Elicitation",
    "ElicitationResult",
    "ConfigChange",
    "WorktreeCreate",
    "WorktreeRemove",
    "InstructionsLoaded",
    "CwdChanged",
    "FileChanged",
    "DirectoryAdded",
    "MessageDisplay",
    "PreSkillShellCommand",
];

/// What an event's answer may carry besides CONTINUE, `stop` and `system_message` (the
/// Agent SDKs' `hookSpecificOutput` types of TypeScript SDK 0.3.332).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventTakes {
    /// Decisions other than CONTINUE.
    pub decisions: &'static [HookDecision],
    /// `updated_input` (with ALLOW).
    pub updated_input: bool,
    /// `additional_context`.
    pub additional_context: bool,
}

/// What `event`'s answer may carry.
pub fn event_takes(event: &str) -> EventTakes {
    use HookDecision::{Allow, Ask, Block, Deny};
    const PERMISSION: &[HookDecision] = &[Allow, Deny, Ask];
    let (decisions, updated_input, additional_context): (&'static [HookDecision], bool, bool) =
        match event {
            "PreToolUse" => (PERMISSION, true, true),
            "PreSkillShellCommand" => (PERMISSION, true, false),
            "PreModelSwitch" => (PERMISSION, false, false),
            "PermissionRequest" => (&[Allow, Deny], true, false),
            "PostToolUse" | "UserPromptSubmit" | "Stop" | "SubagentStop" => (&[Block], false, true),
            "PostToolUseFailure"
            | "PostToolBatch"
            | "Notification"
            | "UserPromptExpansion"
            | "SessionStart"
            | "Setup"
            | "SubagentStart"
            | "PostModelSwitch" => (&[], false, true),
            _ => (&[], false, false),
        };
    EventTakes {
        decisions,
        updated_input,
        additional_context,
    }
}

fn events_where(f: impl Fn(&EventTakes) -> bool) -> String {
    HOOK_EVENTS
        .iter()
        .filter(|e| f(&event_takes(e)))
        .copied()
        .collect::<Vec<_>>()
        .join(", ")
}

/// Limits of a registration and an answer.
pub mod limits {
    /// Registrations per session.
    pub const HOOKS: usize = 64;
    /// A registration id.
    pub const ID_BYTES: usize = 64;
    /// A matcher.
    pub const MATCHER_BYTES: usize = 1024;
    /// Seconds a registration may wait for a client.
    pub const MAX_TIMEOUT_SECS: u32 = 3600;
    /// The wait when a registration says 0.
    pub const DEFAULT_TIMEOUT_SECS: u32 = 60;
    /// A reason, stop reason, system message, additional context.
    pub const TEXT_BYTES: usize = 64 * 1024;
    /// Replacement tool input (JSON text).
    pub const INPUT_BYTES: usize = 1024 * 1024;
}

/// Seconds the CLI is told to wait beyond ours, so that ostler's default answers first.
const CLI_TIMEOUT_MARGIN_SECS: u32 = 30;

/// What a hook answer tells the CLI (`ostler.v1.HookDecision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookDecision {
    /// Go on as if no hook had run (may still carry context, a message, a stop).
    #[default]
    Continue,
    /// PreToolUse: allow the tool (`permissionDecision: "allow"`).
    Allow,
    /// PreToolUse: deny the tool; the reason is told to the model.
    Deny,
    /// PreToolUse: let the CLI ask (its permission prompt).
    Ask,
    /// `decision: "block"` (PostToolUse, UserPromptSubmit, Stop, SubagentStop).
    Block,
}

impl HookDecision {
    pub fn as_str(self) -> &'static str {
        match self {
            HookDecision::Continue => "continue",
            HookDecision::Allow => "allow",
            HookDecision::Deny => "deny",
            HookDecision::Ask => "ask",
            HookDecision::Block => "block",
        }
    }
}

/// An answer to a hook call: a client's (RespondToHook) or a registration's default.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct HookAnswer {
    pub decision: HookDecision,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// PreToolUse with ALLOW: the replacement tool input (an object).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_input: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub additional_context: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub stop: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_message: Option<String>,
    /// More `hookSpecificOutput` fields, passed through (`displayContent`, `sessionTitle`,
    /// ...); never one of [`OWN_SPECIFIC_KEYS`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hook_specific: Option<Map<String, Value>>,
}

/// `hookSpecificOutput` keys ostler sets from an answer's own fields (key, field).
pub const OWN_SPECIFIC_KEYS: &[(&str, &str)] = &[
    ("hookEventName", "the hook's event"),
    ("permissionDecision", "decision"),
    ("permissionDecisionReason", "reason"),
    ("decision", "decision"),
    ("updatedInput", "updated_input_json"),
    ("additionalContext", "additional_context"),
];

/// One hook a client answers (`ostler.v1.HookRegistration`), as recorded in the session's
/// spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HookRegistration {
    /// Unique within the session; also the callback id registered with the CLI.
    pub id: String,
    pub event: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matcher: Option<String>,
    /// Seconds to wait for a client (0 = [`limits::DEFAULT_TIMEOUT_SECS`]).
    #[serde(default)]
    pub timeout_secs: u32,
    /// Taken when nobody answers in time, and after a daemon restart.
    #[serde(default)]
    pub default: HookAnswer,
}

impl HookRegistration {
    /// The wait for a client's answer, in seconds.
    pub fn wait_secs(&self) -> u32 {
        if self.timeout_secs == 0 {
            limits::DEFAULT_TIMEOUT_SECS
        } else {
            self.timeout_secs
        }
    }
}

/// A registration or answer that is refused: the field (as clients write it) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct HookError {
    pub field: String,
    pub message: String,
}

fn bad(field: impl Into<String>, message: impl Into<String>) -> HookError {
    HookError {
        field: field.into(),
        message: message.into(),
    }
}

fn shown(s: &str) -> String {
    const MAX: usize = 60;
    if s.chars().count() <= MAX {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(MAX).collect();
        format!("{head:?}... ({} bytes)", s.len())
    }
}

fn text(field: &str, v: &str, max: usize) -> Result<(), HookError> {
    if v.len() > max {
        return Err(bad(
            field,
            format!("is {} bytes long; at most {max} are allowed", v.len()),
        ));
    }
    if v.contains('\0') {
        return Err(bad(field, "contains a NUL byte"));
    }
    Ok(())
}

/// Checks the registrations of a session (`field` is how clients name the list, `hooks`).
pub fn validate_registrations(field: &str, hooks: &[HookRegistration]) -> Result<(), HookError> {
    if hooks.len() > limits::HOOKS {
        return Err(bad(
            field,
            format!(
                "has {} entries; at most {} are allowed",
                hooks.len(),
                limits::HOOKS
            ),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (i, h) in hooks.iter().enumerate() {
        let f = |name: &str| format!("{field}[{i}].{name}");
        let id_ok = !h.id.is_empty()
            && h.id.len() <= limits::ID_BYTES
            && h.id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !id_ok {
            return Err(bad(
                f("id"),
                format!(
                    "{} is not an id (1-{} of A-Z a-z 0-9 . _ -)",
                    shown(&h.id),
                    limits::ID_BYTES
                ),
            ));
        }
        if !seen.insert(h.id.as_str()) {
            return Err(bad(
                f("id"),
                format!("{} names two registrations", shown(&h.id)),
            ));
        }
        if !HOOK_EVENTS.contains(&h.event.as_str()) {
            return Err(bad(
                f("event"),
                format!(
                    "{} is not a hook event (one of {})",
                    shown(&h.event),
                    HOOK_EVENTS.join(", ")
                ),
            ));
        }
        if let Some(m) = &h.matcher {
            text(&f("matcher"), m, limits::MATCHER_BYTES)?;
            if let Some(why) = unbalanced(m) {
                // The CLI compiles a matcher as a regular expression; one that does not
                // compile matches nothing, and the hook would be silently off.
                return Err(bad(
                    f("matcher"),
                    format!(
                        "{} is not a regular expression the CLI can use: {why}",
                        shown(m)
                    ),
                ));
            }
        }
        if h.timeout_secs > limits::MAX_TIMEOUT_SECS {
            return Err(bad(
                f("timeout_secs"),
                format!(
                    "{} is more than {} seconds",
                    h.timeout_secs,
                    limits::MAX_TIMEOUT_SECS
                ),
            ));
        }
        validate_answer(&format!("{field}[{i}].default_"), &h.event, &h.default)?;
    }
    Ok(())
}

/// Checks an answer against what `event` takes (`prefix` goes before the field names:
/// `""` for RespondToHook, `hooks[3].default_` for a registration's default).
pub fn validate_answer(prefix: &str, event: &str, a: &HookAnswer) -> Result<(), HookError> {
    let f = |name: &str| format!("{prefix}{name}");
    let takes = event_takes(event);
    if a.decision != HookDecision::Continue && !takes.decisions.contains(&a.decision) {
        let upper = |d: &HookDecision| d.as_str().to_uppercase();
        let mut taken = vec!["CONTINUE".to_string()];
        taken.extend(takes.decisions.iter().map(upper));
        let d = a.decision;
        let hint = if d == HookDecision::Block && event == "PreToolUse" {
            "; use DENY".to_string()
        } else {
            format!("; {} takes it", events_where(|t| t.decisions.contains(&d)))
        };
        return Err(bad(
            f("decision"),
            format!(
                "a {event} hook does not take {} (it takes {}){hint}",
                upper(&d),
                taken.join(", ")
            ),
        ));
    }
    for (name, v) in [
        ("reason", &a.reason),
        ("stop_reason", &a.stop_reason),
        ("system_message", &a.system_message),
        ("additional_context", &a.additional_context),
    ] {
        if let Some(v) = v {
            text(&f(name), v, limits::TEXT_BYTES)?;
        }
    }
    if let Some(u) = &a.updated_input {
        if !(takes.updated_input && a.decision == HookDecision::Allow) {
            return Err(bad(
                f("updated_input_json"),
                format!(
                    "only a hook answered ALLOW takes a replacement input, and only of {}",
                    events_where(|t| t.updated_input)
                ),
            ));
        }
        if !u.is_object() {
            return Err(bad(f("updated_input_json"), "must be a JSON object"));
        }
    }
    if a.additional_context.is_some() && !takes.additional_context {
        return Err(bad(
            f("additional_context"),
            format!(
                "a {event} hook does not take additional context (only {})",
                events_where(|t| t.additional_context)
            ),
        ));
    }
    if a.stop_reason.is_some() && !a.stop {
        return Err(bad(f("stop_reason"), "is set but `stop` is not"));
    }
    let own = a
        .hook_specific
        .as_ref()
        .and_then(|m| OWN_SPECIFIC_KEYS.iter().find(|(k, _)| m.contains_key(*k)));
    if let Some((key, field)) = own {
        return Err(bad(
            f("hook_specific_output_json"),
            format!("sets `{key}`; ostler sets it from {field}"),
        ));
    }
    Ok(())
}

/// The `hooks` field of `initialize`: per event the matchers, each with its registration's
/// id as callback id and a timeout a little longer than ours (so ostler's default answers
/// before the CLI gives up). `None` without registrations.
pub fn initialize_hooks(hooks: &[HookRegistration]) -> Option<Map<String, Value>> {
    if hooks.is_empty() {
        return None;
    }
    let mut out = Map::new();
    for h in hooks {
        let mut m = Map::new();
        if let Some(matcher) = &h.matcher {
            m.insert("matcher".into(), matcher.clone().into());
        }
        m.insert("hookCallbackIds".into(), json!([h.id]));
        m.insert(
            "timeout".into(),
            (h.wait_secs() + CLI_TIMEOUT_MARGIN_SECS).into(),
        );
        match out
            .entry(h.event.clone())
            .or_insert_with(|| Value::Array(Vec::new()))
        {
            Value::Array(a) => a.push(Value::Object(m)),
            other => *other = Value::Array(vec![Value::Object(m)]),
        }
    }
    Some(out)
}

/// What ostler reads from a `hook_callback` input.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HookCall {
    /// `hook_event_name` (or the registration's event when the input lacks it).
    pub hook_event: String,
    pub tool_name: Option<String>,
    /// The tool use the hook is about (tool events only).
    pub tool_use_id: Option<String>,
    /// The sub-agent the hook fires in (the input's `agent_id`, which the CLI sets only
    /// inside a sub-agent; the same id as its permission requests' `agent_id`).
    pub agent_id: Option<String>,
}

/// Reads a `hook_callback`: the input's event name, tool name, tool use id and sub-agent
/// id (`agent_id`; an empty one counts as none). The request-level `tool_use_id` counts
/// only for tool events (for others the CLI sends a random uuid).
pub fn read_call(
    input: Option<&Value>,
    request_tool_use_id: Option<&str>,
    registered_event: &str,
) -> HookCall {
    let get = |k: &str| {
        input
            .and_then(|i| i.get(k))
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    let hook_event = get("hook_event_name").unwrap_or_else(|| registered_event.to_owned());
    let tool_name = get("tool_name");
    let tool_use_id = get("tool_use_id").or_else(|| {
        tool_name
            .as_ref()
            .and(request_tool_use_id.map(str::to_owned))
    });
    HookCall {
        hook_event,
        tool_name,
        tool_use_id,
        agent_id: get("agent_id").filter(|a| !a.is_empty()),
    }
}

/// The answer to the CLI for `event` (assumed checked with [`validate_answer`]).
pub fn output_json(event: &str, a: &HookAnswer) -> Value {
    let mut out = Map::new();
    let mut specific = Map::new();
    match a.decision {
        HookDecision::Continue => {}
        // PermissionRequest answers the permission prompt itself (the CLI then withdraws
        // its `can_use_tool` request).
        HookDecision::Allow if event == "PermissionRequest" => {
            let mut d = Map::new();
            d.insert("behavior".into(), "allow".into());
            if let Some(u) = &a.updated_input {
                d.insert("updatedInput".into(), u.clone());
            }
            specific.insert("decision".into(), Value::Object(d));
        }
        HookDecision::Deny if event == "PermissionRequest" => {
            let mut d = Map::new();
            d.insert("behavior".into(), "deny".into());
            d.insert(
                "message".into(),
                a.reason
                    .clone()
                    .unwrap_or_else(|| "Denied by a hook".into())
                    .into(),
            );
            specific.insert("decision".into(), Value::Object(d));
        }
        HookDecision::Allow | HookDecision::Deny | HookDecision::Ask => {
            specific.insert("permissionDecision".into(), a.decision.as_str().into());
            if let Some(r) = &a.reason {
                specific.insert("permissionDecisionReason".into(), r.clone().into());
            }
            if let Some(u) = &a.updated_input {
                specific.insert("updatedInput".into(), u.clone());
            }
        }
        HookDecision::Block => {
            out.insert("decision".into(), "block".into());
            out.insert(
                "reason".into(),
                a.reason
                    .clone()
                    .unwrap_or_else(|| "Blocked by a hook".into())
                    .into(),
            );
        }
    }
    if let Some(c) = &a.additional_context {
        specific.insert("additionalContext".into(), c.clone().into());
    }
    if let Some(m) = &a.hook_specific {
        for (k, v) in m {
            specific.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    if !specific.is_empty() {
        specific.insert("hookEventName".into(), event.into());
        out.insert("hookSpecificOutput".into(), Value::Object(specific));
    }
    if a.stop {
        out.insert("continue".into(), false.into());
        if let Some(r) = &a.stop_reason {
            out.insert("stopReason".into(), r.clone().into());
        }
    }
    if let Some(m) = &a.system_message {
        out.insert("systemMessage".into(), m.clone().into());
    }
    Value::Object(out)
}

/// How a hook call was resolved (`ostler.v1.Resolution` ANSWERED / EXPIRED / CANCELLED).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookResolution {
    /// A client answered.
    Answered,
    /// The registration's default was taken (expiry, daemon restart).
    Expired,
    /// Withdrawn by the CLI, or the process ended.
    Cancelled,
}

/// The stored `hook_requested` event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HookRequested {
    pub request_id: String,
    pub hook_event: String,
    pub registration_id: String,
    /// The hook input as the CLI sent it.
    pub input: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    pub expires_at_ms: i64,
    /// The sub-agent the hook fires in; `None` for the main conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
}

/// The stored `hook_resolved` event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HookResolved {
    pub request_id: String,
    pub resolution: HookResolution,
    pub answer: HookAnswer,
    /// `client:<id>`, `default:expiry`, `default:restart`, `cli`, `engine`.
    pub resolved_by: String,
    /// What was sent to the CLI (none when cancelled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
}

/// Why `pattern` cannot be a regular expression, if its groups, classes or a trailing
/// escape say so (`(`, `Bash|(`, `[a-`, `x\\`): the mistakes a matcher can make in any
/// dialect; anything finer is the CLI's to judge.
fn unbalanced(pattern: &str) -> Option<&'static str> {
    let mut depth = 0usize;
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.next().is_none() => return Some("it ends with a lone `\\`"),
            '\\' => {}
            '[' => {
                // A class: up to its first unescaped `]` (one right after `[` or `[^` is
                // a literal).
                let mut first = true;
                let mut closed = false;
                while let Some(k) = chars.next() {
                    match k {
                        '\\' => {
                            chars.next();
                        }
                        '^' if first => continue,
                        ']' if !first => {
                            closed = true;
                            break;
                        }
                        _ => {}
                    }
                    first = false;
                }
                if !closed {
                    return Some("a `[` is not closed");
                }
            }
            '(' => depth += 1,
            ')' => {
                if depth == 0 {
                    return Some("a `)` has no `(`");
                }
                depth -= 1;
            }
            _ => {}
        }
    }
    (depth > 0).then_some("a `(` is not closed")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(id: &str, event: &str) -> HookRegistration {
        HookRegistration {
            id: id.into(),
            event: event.into(),
            matcher: Some("Bash".into()),
            timeout_secs: 0,
            default: HookAnswer::default(),
        }
    }

    #[test]
    fn registrations_become_the_initialize_shape() {
        let mut r2 = reg("b", "PreToolUse");
        r2.matcher = None;
        r2.timeout_secs = 5;
        let h = initialize_hooks(&[reg("a", "PreToolUse"), r2, reg("c", "Stop")]).unwrap();
        assert_eq!(
            Value::Object(h),
            json!({
                "PreToolUse": [
                    {"matcher": "Bash", "hookCallbackIds": ["a"], "timeout": 90},
                    {"hookCallbackIds": ["b"], "timeout": 35}
                ],
                "Stop": [{"matcher": "Bash", "hookCallbackIds": ["c"], "timeout": 90}]
            })
        );
        assert!(initialize_hooks(&[]).is_none());
    }

    /// A matcher the CLI could not compile is refused (the hook would never fire); the
    /// CLI's own spellings pass.
    #[test]
    fn matchers_that_cannot_compile_are_refused() {
        for bad in ["(", "[", "Bash|(", "a)", "[a-", "x\\", "(Edit|Write"] {
            let mut r = reg("a", "PreToolUse");
            r.matcher = Some(bad.into());
            let e = validate_registrations("hooks", &[r]).unwrap_err();
            assert!(e.to_string().contains("hooks[0].matcher"), "{bad}: {e}");
        }
        for good in [
            "Bash",
            "*",
            "",
            "Edit|Write",
            "mcp__.*",
            "Ba.h",
            "(Edit|Write)",
            "[]a]",
            "[^)]+",
            "\\(",
            "Notebook\\.*",
            "[(]",
        ] {
            let mut r = reg("a", "PreToolUse");
            r.matcher = Some(good.into());
            validate_registrations("hooks", &[r]).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
    }

    #[test]
    fn registrations_are_checked_naming_the_field() {
        let e = validate_registrations("hooks", &[reg("a", "PreToolUse"), reg("a", "Stop")])
            .unwrap_err();
        assert_eq!(e.field, "hooks[1].id");
        let e = validate_registrations("hooks", &[reg("a", "BeforeLunch")]).unwrap_err();
        assert_eq!(e.field, "hooks[0].event");
        let e = validate_registrations("hooks", &[reg("a b", "Stop")]).unwrap_err();
        assert_eq!(e.field, "hooks[0].id");
        let mut r = reg("a", "Stop");
        r.timeout_secs = 3601;
        let e = validate_registrations("hooks", &[r]).unwrap_err();
        assert_eq!(e.field, "hooks[0].timeout_secs");
        let mut r = reg("a", "Stop");
        r.default.decision = HookDecision::Deny;
        let e = validate_registrations("hooks", &[r]).unwrap_err();
        assert_eq!(e.field, "hooks[0].default_decision");
        let many: Vec<_> = (0..65).map(|i| reg(&format!("h{i}"), "Stop")).collect();
        assert_eq!(
            validate_registrations("hooks", &many).unwrap_err().field,
            "hooks"
        );
        let long = "x".repeat(10_000);
        let e = validate_registrations("hooks", &[reg(&long, "Stop")]).unwrap_err();
        assert!(e.message.len() < 300, "{}", e.message);
    }

    #[test]
    fn decisions_an_event_does_not_take_are_refused() {
        let a = |decision| HookAnswer {
            decision,
            ..Default::default()
        };
        assert!(validate_answer("", "PreToolUse", &a(HookDecision::Deny)).is_ok());
        assert!(validate_answer("", "PreToolUse", &a(HookDecision::Block)).is_err());
        assert!(validate_answer("", "Stop", &a(HookDecision::Block)).is_ok());
        assert!(validate_answer("", "Stop", &a(HookDecision::Allow)).is_err());
        assert!(validate_answer("", "Notification", &a(HookDecision::Block)).is_err());
        let ctx = HookAnswer {
            additional_context: Some("x".into()),
            ..Default::default()
        };
        assert!(validate_answer("", "UserPromptSubmit", &ctx).is_ok());
        assert!(validate_answer("", "PostToolBatch", &ctx).is_ok());
        assert_eq!(
            validate_answer("", "PreCompact", &ctx).unwrap_err().field,
            "additional_context"
        );
        // Events of newer releases (the SDK's list): their own decisions only.
        assert!(validate_answer("", "PreModelSwitch", &a(HookDecision::Deny)).is_ok());
        assert!(validate_answer("", "PermissionRequest", &a(HookDecision::Allow)).is_ok());
        let e = validate_answer("", "PermissionRequest", &a(HookDecision::Ask)).unwrap_err();
        assert_eq!(e.field, "decision");
        assert!(
            e.message.contains("(it takes CONTINUE, ALLOW, DENY)"),
            "{}",
            e.message
        );
        let e = validate_answer("", "MessageDisplay", &a(HookDecision::Block)).unwrap_err();
        assert!(
            e.message
                .contains("PostToolUse, UserPromptSubmit, Stop, SubagentStop takes it"),
            "{}",
            e.message
        );
        for key in [
            "hookEventName",
            "permissionDecision",
            "additionalContext",
            "decision",
        ] {
            let own = HookAnswer {
                hook_specific: json!({ key: 1 }).as_object().cloned(),
                ..Default::default()
            };
            let e = validate_answer("", "PreToolUse", &own).unwrap_err();
            assert_eq!(e.field, "hook_specific_output_json");
            assert!(e.message.contains(key), "{}", e.message);
        }
        let edit = HookAnswer {
            decision: HookDecision::Deny,
            updated_input: Some(json!({})),
            ..Default::default()
        };
        assert_eq!(
            validate_answer("", "PreToolUse", &edit).unwrap_err().field,
            "updated_input_json"
        );
    }

    #[test]
    fn answers_take_the_cli_shape() {
        let deny = HookAnswer {
            decision: HookDecision::Deny,
            reason: Some("no rm".into()),
            system_message: Some("told".into()),
            ..Default::default()
        };
        assert_eq!(
            output_json("PreToolUse", &deny),
            json!({"hookSpecificOutput": {"hookEventName": "PreToolUse",
                "permissionDecision": "deny", "permissionDecisionReason": "no rm"},
                "systemMessage": "told"})
        );
        let allow = HookAnswer {
            decision: HookDecision::Allow,
            updated_input: Some(json!({"command": "ls"})),
            ..Default::default()
        };
        assert_eq!(
            output_json("PreToolUse", &allow),
            json!({"hookSpecificOutput": {"hookEventName": "PreToolUse",
                "permissionDecision": "allow", "updatedInput": {"command": "ls"}}})
        );
        let block = HookAnswer {
            decision: HookDecision::Block,
            reason: Some("keep going".into()),
            stop: true,
            stop_reason: Some("halt".into()),
            ..Default::default()
        };
        assert_eq!(
            output_json("Stop", &block),
            json!({"decision": "block", "reason": "keep going", "continue": false, "stopReason": "halt"})
        );
        let ctx = HookAnswer {
            additional_context: Some("more".into()),
            ..Default::default()
        };
        assert_eq!(
            output_json("UserPromptSubmit", &ctx),
            json!({"hookSpecificOutput": {"hookEventName": "UserPromptSubmit", "additionalContext": "more"}})
        );
        assert_eq!(output_json("Stop", &HookAnswer::default()), json!({}));
        // PermissionRequest answers the prompt: `decision.behavior`, not permissionDecision.
        assert_eq!(
            output_json("PermissionRequest", &allow),
            json!({"hookSpecificOutput": {"hookEventName": "PermissionRequest",
                "decision": {"behavior": "allow", "updatedInput": {"command": "ls"}}}})
        );
        assert_eq!(
            output_json("PermissionRequest", &deny),
            json!({"hookSpecificOutput": {"hookEventName": "PermissionRequest",
                "decision": {"behavior": "deny", "message": "no rm"}}, "systemMessage": "told"})
        );
        assert_eq!(
            output_json("PreModelSwitch", &deny)["hookSpecificOutput"]["permissionDecision"],
            "deny"
        );
        // Fields beyond ostler's own pass through into hookSpecificOutput.
        let shown = HookAnswer {
            hook_specific: json!({"displayContent": "[redacted]"}).as_object().cloned(),
            ..Default::default()
        };
        assert!(validate_answer("", "MessageDisplay", &shown).is_ok());
        assert_eq!(
            output_json("MessageDisplay", &shown),
            json!({"hookSpecificOutput": {"hookEventName": "MessageDisplay", "displayContent": "[redacted]"}})
        );
    }

    #[test]
    fn calls_are_read_from_the_input() {
        let input =
            json!({"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_use_id": "toolu_1"});
        let c = read_call(Some(&input), Some("toolu_1"), "PreToolUse");
        assert_eq!(c.tool_name.as_deref(), Some("Bash"));
        assert_eq!(c.tool_use_id.as_deref(), Some("toolu_1"));
        // 1.0.128: no tool_use_id in the input; the request's counts for tool events.
        let input = json!({"hook_event_name": "PreToolUse", "tool_name": "Bash"});
        let c = read_call(Some(&input), Some("toolu_2"), "PreToolUse");
        assert_eq!(c.tool_use_id.as_deref(), Some("toolu_2"));
        // Not a tool event: the request's random uuid is not a tool use.
        let input = json!({"hook_event_name": "Stop"});
        let c = read_call(Some(&input), Some("6b1c"), "Stop");
        assert_eq!((c.hook_event.as_str(), c.tool_use_id), ("Stop", None));
        assert_eq!(read_call(None, None, "Stop").hook_event, "Stop");
        // Inside a sub-agent the input names it (2.1.332); the main agent's does not, or
        // leaves it empty.
        let input = json!({"hook_event_name": "PreToolUse", "tool_name": "Bash",
            "agent_id": "a1b2", "agent_type": "general-purpose"});
        let c = read_call(Some(&input), None, "PreToolUse");
        assert_eq!(c.agent_id.as_deref(), Some("a1b2"));
        for input in [
            json!({"hook_event_name": "PreToolUse", "agent_id": ""}),
            json!({"hook_event_name": "PreToolUse", "agent_type": "general-purpose"}),
        ] {
            assert_eq!(read_call(Some(&input), None, "PreToolUse").agent_id, None);
        }
    }
}
