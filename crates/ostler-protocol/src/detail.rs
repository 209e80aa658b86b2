//! Typed fields of the notices clients need ([`NoticeDetail`]) and of a result's
//! `modelUsage` ([`TurnResult::models`]), read leniently from the wire.
//!
//! Shapes (2.1.330, `contracts/claude-code/2.1.330/{subagent,control,interrupt}.ndjson` and
//! the release's own message schemas):
//! - `{"type":"system","subtype":"task_started","task_id","tool_use_id","description",
//!   "task_type","subagent_type","is_backgrounded",...}`
//! - `{"type":"system","subtype":"task_progress","task_id","tool_use_id","description",
//!   "usage":{"total_tokens","tool_uses","duration_ms"},"last_tool_name","summary"}`
//! - `{"type":"system","subtype":"task_notification","task_id","tool_use_id","status",
//!   "output_file","summary","usage"}`
//! - `{"type":"rate_limit_event","rate_limit_info":{"status","resetsAt","rateLimitType",
//!   "utilization","isUsingOverage",...}}`
//! - `{"type":"system","subtype":"compact_boundary","compact_metadata":{"trigger",
//!   "pre_tokens","post_tokens"}}`
//! - `{"type":"system","subtype":"status","status":"requesting"|"compacting"|null,
//!   "permissionMode"?}`
//! - `{"type":"command_lifecycle","command_uuid","state":"queued"|"started"|"completed",
//!   "uuid","session_id"}` (2.1.330, for user messages that carry a `uuid`)
//! - `{"type":"system","subtype":"elicitation_complete","mcp_server_name","elicitation_id",
//!   "uuid","session_id"}` (2.1.332, when an MCP server reports a URL elicitation done)
//! - `{"type":"system","subtype":"hook_started"|"hook_progress"|"hook_response","hook_id",
//!   "hook_name","hook_event","stdout","stderr","output","exit_code","outcome","uuid",
//!   "session_id"}` (2.1.332 with `--include-hook-events`: progress and response carry
//!   the output; response the exit code and `success`/`error`/`cancelled`). 2.0.x sends
//!   `hook_response` (SessionStart's) without `hook_id`, `output` and `outcome`.
//! - `{"type":"system","subtype":"informational","content","level":"info"|"notice"|
//!   "suggestion"|"warning","tool_use_id"?,"prevent_continuation"?,"tag"?,...}` (2.1.x: a
//!   text banner: a hook's block reason, a failed hook callback, slash-command output;
//!   2.1.332 adds e.g. `prompt_submit_outcome` to a blocked prompt's, kept in `fields`)
//! - `{"type":"prompt_suggestion","suggestion","uuid","session_id"}` (2.1.120+, after a
//!   turn's `result` when `initialize` asked for `promptSuggestions`)
//!
//! A notice whose required field (`task_id`, `status` of a notification or rate limit,
//! `command_uuid` and `state` of a lifecycle, `elicitation_id`, a hook's `hook_event`, a
//! banner's `content`, a suggestion's `suggestion`) is missing or of another type gets no
//! detail: it stays a plain notice, never a guess.

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::model::*;
use crate::wire::{LBool, LNum, LStr, view};

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WireNotice<'a> {
    #[serde(borrow)]
    task_id: LStr<'a>,
    #[serde(borrow)]
    tool_use_id: LStr<'a>,
    #[serde(borrow)]
    description: LStr<'a>,
    #[serde(borrow)]
    task_type: LStr<'a>,
    #[serde(borrow)]
    subagent_type: LStr<'a>,
    is_backgrounded: LBool,
    #[serde(borrow)]
    last_tool_name: LStr<'a>,
    #[serde(borrow)]
    summary: LStr<'a>,
    #[serde(borrow)]
    output_file: LStr<'a>,
    #[serde(borrow)]
    usage: Option<&'a RawValue>,
    /// `status` (a string, or `null` on `system/status`).
    #[serde(borrow)]
    status: LStr<'a>,
    #[serde(rename = "permissionMode", borrow)]
    permission_mode: LStr<'a>,
    #[serde(borrow)]
    compact_metadata: Option<&'a RawValue>,
    #[serde(borrow)]
    rate_limit_info: Option<&'a RawValue>,
    #[serde(borrow)]
    command_uuid: LStr<'a>,
    #[serde(borrow)]
    state: LStr<'a>,
    #[serde(borrow)]
    mcp_server_name: LStr<'a>,
    #[serde(borrow)]
    elicitation_id: LStr<'a>,
    #[serde(borrow)]
    hook_id: LStr<'a>,
    #[serde(borrow)]
    hook_name: LStr<'a>,
    #[serde(borrow)]
    hook_event: LStr<'a>,
    #[serde(borrow)]
    stdout: LStr<'a>,
    #[serde(borrow)]
    stderr: LStr<'a>,
    #[serde(borrow)]
    output: LStr<'a>,
    exit_code: LNum,
    #[serde(borrow)]
    outcome: LStr<'a>,
    #[serde(borrow)]
    content: LStr<'a>,
    #[serde(borrow)]
    level: LStr<'a>,
    prevent_continuation: LBool,
    #[serde(borrow)]
    tag: LStr<'a>,
    #[serde(borrow)]
    suggestion: LStr<'a>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WireTaskUsage {
    total_tokens: LNum,
    tool_uses: LNum,
    duration_ms: LNum,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WireCompact<'a> {
    #[serde(borrow)]
    trigger: LStr<'a>,
    pre_tokens: LNum,
    post_tokens: LNum,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WireRateLimit<'a> {
    #[serde(borrow)]
    status: LStr<'a>,
    #[serde(rename = "resetsAt")]
    resets_at: LNum,
    #[serde(rename = "rateLimitType", borrow)]
    rate_limit_type: LStr<'a>,
    utilization: LNum,
    #[serde(rename = "isUsingOverage")]
    is_using_overage: LBool,
}

/// Whether a notice of this wire `type` / `subtype` has a typed detail.
pub fn has_detail(source_type: &str, subtype: Option<&str>) -> bool {
    match source_type {
        "rate_limit_event" | "command_lifecycle" | "prompt_suggestion" => true,
        "system" => matches!(
            subtype,
            Some(
                "task_started"
                    | "task_progress"
                    | "task_notification"
                    | "compact_boundary"
                    | "status"
                    | "elicitation_complete"
                    | "hook_started"
                    | "hook_progress"
                    | "hook_response"
                    | "informational"
            )
        ),
        _ => false,
    }
}

/// The typed detail of a notice, read from its whole message (`fields`); `None` for
/// notices without one or whose required fields are missing.
pub fn notice_detail(
    source_type: &str,
    subtype: Option<&str>,
    fields: &RawValue,
) -> Option<NoticeDetail> {
    if !has_detail(source_type, subtype) {
        return None;
    }
    let n = view::<WireNotice<'_>>(fields)?;
    let usage = || {
        n.usage.and_then(view::<WireTaskUsage>).map(|u| TaskUsage {
            total_tokens: u.total_tokens.u64().unwrap_or_default(),
            tool_uses: u.tool_uses.u64().unwrap_or_default(),
            duration_ms: u.duration_ms.u64().unwrap_or_default(),
        })
    };
    if source_type == "rate_limit_event" {
        let r = view::<WireRateLimit<'_>>(n.rate_limit_info?)?;
        return Some(NoticeDetail::RateLimit(RateLimit {
            status: r.status.owned()?,
            resets_at: r
                .resets_at
                .f64()
                .filter(|f| f.abs() < 9.0e15)
                .map(|f| f as i64),
            rate_limit_type: r.rate_limit_type.owned(),
            utilization: r.utilization.f64(),
            is_using_overage: r.is_using_overage.0,
        }));
    }
    if source_type == "prompt_suggestion" {
        return Some(NoticeDetail::PromptSuggestion(PromptSuggestion {
            suggestion: n.suggestion.owned()?,
        }));
    }
    if source_type == "command_lifecycle" {
        return Some(NoticeDetail::MessageLifecycle(MessageLifecycle {
            message_id: n.command_uuid.owned()?,
            state: n.state.owned()?,
        }));
    }
    Some(match subtype? {
        "task_started" => NoticeDetail::TaskStarted(TaskStarted {
            task_id: n.task_id.owned()?,
            tool_use_id: n.tool_use_id.owned(),
            description: n.description.owned(),
            task_type: n.task_type.owned(),
            subagent_type: n.subagent_type.owned(),
            is_backgrounded: n.is_backgrounded.0,
        }),
        "task_progress" => NoticeDetail::TaskProgress(TaskProgress {
            task_id: n.task_id.owned()?,
            tool_use_id: n.tool_use_id.owned(),
            description: n.description.owned(),
            last_tool_name: n.last_tool_name.owned(),
            summary: n.summary.owned(),
            usage: usage(),
        }),
        "task_notification" => NoticeDetail::TaskNotification(TaskNotification {
            task_id: n.task_id.owned()?,
            tool_use_id: n.tool_use_id.owned(),
            status: n.status.owned()?,
            summary: n.summary.owned(),
            output_file: n.output_file.owned(),
            usage: usage(),
        }),
        "compact_boundary" => {
            let m = n
                .compact_metadata
                .and_then(view::<WireCompact<'_>>)
                .unwrap_or_default();
            NoticeDetail::CompactBoundary(CompactBoundary {
                trigger: m.trigger.owned(),
                pre_tokens: m.pre_tokens.u64(),
                post_tokens: m.post_tokens.u64(),
            })
        }
        "status" => NoticeDetail::Status(CliStatus {
            status: n.status.owned(),
            permission_mode: n.permission_mode.owned(),
        }),
        "elicitation_complete" => NoticeDetail::ElicitationComplete(ElicitationComplete {
            mcp_server_name: n.mcp_server_name.owned(),
            elicitation_id: n.elicitation_id.owned()?,
        }),
        phase @ ("hook_started" | "hook_progress" | "hook_response") => {
            NoticeDetail::HookActivity(HookActivity {
                phase: phase.trim_start_matches("hook_").to_owned(),
                hook_id: n.hook_id.owned(),
                hook_name: n.hook_name.owned(),
                hook_event: n.hook_event.owned()?,
                stdout: n.stdout.owned(),
                stderr: n.stderr.owned(),
                output: n.output.owned(),
                exit_code: n
                    .exit_code
                    .f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() <= f64::from(i32::MAX))
                    .map(|f| f as i32),
                outcome: n.outcome.owned(),
            })
        }
        "informational" => NoticeDetail::Informational(Informational {
            content: n.content.owned()?,
            level: n.level.owned(),
            tool_use_id: n.tool_use_id.owned(),
            prevent_continuation: n.prevent_continuation.0.unwrap_or(false),
            tag: n.tag.owned(),
        }),
        _ => return None,
    })
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WireModelUsage {
    #[serde(rename = "inputTokens")]
    input_tokens: LNum,
    #[serde(rename = "outputTokens")]
    output_tokens: LNum,
    #[serde(rename = "cacheReadInputTokens")]
    cache_read_input_tokens: LNum,
    #[serde(rename = "cacheCreationInputTokens")]
    cache_creation_input_tokens: LNum,
    #[serde(rename = "webSearchRequests")]
    web_search_requests: LNum,
    #[serde(rename = "costUSD")]
    cost_usd: LNum,
    #[serde(rename = "contextWindow")]
    context_window: LNum,
    #[serde(rename = "maxOutputTokens")]
    max_output_tokens: LNum,
}

impl TurnResult {
    /// `modelUsage` per model, in the order sent (empty when the release sent none or it
    /// is not an object of objects; entries that are not objects are skipped).
    pub fn models(&self) -> Vec<ModelUsage> {
        let Some(raw) = &self.model_usage else {
            return Vec::new();
        };
        let Some(map) = view::<indexmap_free::Entries<'_>>(&raw.0) else {
            return Vec::new();
        };
        map.0
            .into_iter()
            .filter_map(|(model, v)| {
                let u = view::<WireModelUsage>(v)?;
                Some(ModelUsage {
                    model,
                    input_tokens: u.input_tokens.u64().unwrap_or_default(),
                    output_tokens: u.output_tokens.u64().unwrap_or_default(),
                    cache_read_input_tokens: u.cache_read_input_tokens.u64().unwrap_or_default(),
                    cache_creation_input_tokens: u
                        .cache_creation_input_tokens
                        .u64()
                        .unwrap_or_default(),
                    web_search_requests: u.web_search_requests.u64().unwrap_or_default(),
                    cost_usd: u.cost_usd.f64().unwrap_or_default(),
                    context_window: u.context_window.u64().unwrap_or_default(),
                    max_output_tokens: u.max_output_tokens.u64().unwrap_or_default(),
                })
            })
            .collect()
    }
}

/// An object's entries in wire order, values kept raw (no map type needed).
mod indexmap_free {
    use std::fmt;

    use serde::Deserialize;
    use serde::de::{self, MapAccess, Visitor};
    use serde_json::value::RawValue;

    pub(super) struct Entries<'a>(pub Vec<(String, &'a RawValue)>);

    impl<'de: 'a, 'a> Deserialize<'de> for Entries<'a> {
        fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Entries<'de>;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                    let mut out = Vec::new();
                    while let Some((k, v)) = map.next_entry::<String, &'de RawValue>()? {
                        out.push((k, v));
                    }
                    Ok(Entries(out))
                }
            }
            d.deserialize_map(V)
        }
    }
}
