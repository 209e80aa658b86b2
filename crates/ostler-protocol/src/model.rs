//! The canonical event model: the daemon's language, independent of wire spelling.
//!
//! One CLI line becomes zero or more [`Event`]s (an `assistant` snapshot that repeats blocks
//! already seen yields only the new ones). Events are `Serialize + Deserialize` (tagged by
//! `kind`), so the store can keep them and the daemon can replay them.
//!
//! Fields the CLI release did not send are `None` and, where a consumer could otherwise
//! mistake "absent" for "empty", named in the event's `absent` list (for example
//! `tool_use_id` in `can_use_tool` on 1.0.x).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_json::value::RawValue;

/// Opaque JSON kept verbatim (no tree is built for it). Compares by its text.
///
/// `Deserialize` is implemented by hand (`rawjson.rs`): straight from serde_json it keeps
/// the text verbatim; inside buffered contexts (the internally tagged [`Event`]) it
/// re-encodes the value in its original field order, so stored events can be read back.
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub struct RawJson(pub Box<RawValue>);

impl RawJson {
    /// The JSON text.
    pub fn get(&self) -> &str {
        self.0.get()
    }

    /// Parse into a value tree (allocates; use only where the structure is needed).
    pub fn to_value(&self) -> serde_json::Result<Value> {
        serde_json::from_str(self.0.get())
    }

    /// Wrap JSON text that is already known to be valid.
    pub fn from_string(json: String) -> serde_json::Result<Self> {
        RawValue::from_string(json).map(RawJson)
    }
}

impl PartialEq for RawJson {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

/// Names of fields a release did not send.
pub type Absent = Vec<String>;

/// A canonical event.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    /// `system/init`.
    SessionStarted(SessionStarted),
    /// One content block of an assistant message (text, thinking, tool_use, ...), once.
    AssistantBlock(AssistantBlock),
    /// A streaming delta (`stream_event` / `content_block_delta`). Live-only.
    PartialDelta(PartialDelta),
    /// Other `stream_event` frames (message_start, content_block_start/stop, message_delta,
    /// message_stop). Live-only.
    StreamMarker(StreamMarker),
    /// A `user` frame that is not a tool result (echo, replay, `[Request interrupted by user]`).
    UserMessage(UserMessage),
    /// One `tool_result` block of a `user` frame.
    ToolResult(ToolResult),
    /// A `control_request` from the CLI (permission, hook callback, ...).
    ControlRequest(ControlRequest),
    /// `control_cancel_request` from the CLI.
    ControlCancel(ControlCancel),
    /// A `control_response` to one of our requests.
    ControlResponse(ControlResponse),
    /// `result`: a turn ended.
    TurnResult(TurnResult),
    /// `system/*` other than init, and auxiliary top-level types (`tool_progress`,
    /// `tool_use_summary`, `auth_status`, ...).
    SystemNotice(SystemNotice),
    /// `keep_alive`.
    KeepAlive,
    /// A line longer than the per-line cap: what could be read from its beginning.
    Truncated(Truncated),
    /// Something on stdout we could not read as a message (not JSON, not an object, ...).
    Diagnostic(Diagnostic),
    /// A message type not understood: kept whole.
    Unknown(Unknown),
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SessionStarted {
    pub session_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default)]
    pub tools: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_mode: Option<String>,
    /// `claude_code_version` (absent on 1.0.x).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cli_version: Option<String>,
    /// The `capabilities` list recent releases announce.
    #[serde(default)]
    pub capabilities: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_source: Option<String>,
    #[serde(default)]
    pub slash_commands: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_servers: Option<RawJson>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub absent: Absent,
}

/// Token usage (numbers-as-strings accepted on input).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Usage {
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default)]
    pub cache_creation_input_tokens: u64,
    #[serde(default)]
    pub cache_read_input_tokens: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AssistantBlock {
    /// `message.id`; blocks are keyed by (message_id, index).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// Position of the block inside its API message.
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_tool_use_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    pub block: ContentBlock,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// `error` on the assistant frame (e.g. "rate_limit", "server_error").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The sub-agent that wrote the frame (2.1.330 and later, on the frames of a Task/Agent
    /// call beside `parent_tool_use_id`): its `agent_id` (the `task_id` of its
    /// `task_started`), `subagent_type` (e.g. "general-purpose") and `task_description`
    /// (the call's `description`). `None` on main-thread frames and on older releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subagent_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_description: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text {
        text: String,
    },
    Thinking {
        thinking: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    RedactedThinking {
        data: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    /// A block type not understood, kept whole.
    Other {
        block_type: String,
        raw: RawJson,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PartialDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    pub index: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_tool_use_id: Option<String>,
    pub delta: Delta,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", content = "value", rename_all = "snake_case")]
pub enum Delta {
    Text(String),
    Thinking(String),
    /// A fragment of a tool_use block's input JSON.
    InputJson(String),
    Signature(String),
    Other {
        delta_type: String,
        raw: RawJson,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StreamMarker {
    /// The API stream event type (`message_start`, `content_block_start`, ...).
    pub event_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_tool_use_id: Option<String>,
    /// For content_block_start: the block's type, and for tool_use its id and name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    /// For message_delta.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct UserMessage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_tool_use_id: Option<String>,
    /// Plain text when the content was a string or text blocks only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The content when it was not plain text (blocks other than tool results).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<RawJson>,
    #[serde(default)]
    pub is_synthetic: bool,
    /// The echo of a message written to the CLI (`--replay-user-messages`): the CLI took it
    /// into a turn. `isReplay` on 2.x; on 1.0.x the engine knows it by its `uuid`.
    #[serde(default)]
    pub is_replay: bool,
    /// The frame's `uuid`: for an echo, the id of the message written (the
    /// `UserMessageSent`'s `message_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// The sub-agent that wrote the frame (2.1.330 and later, on the frames of a Task/Agent
    /// call beside `parent_tool_use_id`): its `agent_id` (the `task_id` of its
    /// `task_started`), `subagent_type` (e.g. "general-purpose") and `task_description`
    /// (the call's `description`). `None` on main-thread frames and on older releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subagent_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_description: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ToolResult {
    /// Absent on some releases/frames; then named in `absent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_tool_use_id: Option<String>,
    pub content: ToolResultContent,
    #[serde(default)]
    pub is_error: bool,
    /// The tool's structured result as the CLI sent it, verbatim (`tool_use_result` at the
    /// top level of the `user` frame: Bash `{"stdout","stderr","interrupted",...}`,
    /// Write/Edit `{"type","filePath","structuredPatch",...}`, a plain string for a refused
    /// call, ...). Its shape is the CLI's and varies by tool and release; 2.0.x and later
    /// send it, 1.0.x does not. The CLI sends one per frame and one `tool_result` block per
    /// frame; should a frame hold several blocks, it is on the first block's event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_result: Option<RawJson>,
    /// The frame's `tool_result_meta`, verbatim (2.1.330 and later): one entry per tool use,
    /// named by `id`, e.g. `[{"id":"toolu_1","permission_decision":{"decision":"accept",
    /// "source":"user_temporary"}}]`. On the same event as `tool_use_result`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_result_meta: Option<RawJson>,
    /// This tool use's entry of `tool_result_meta` (matched by `id`), read: how the call
    /// was allowed. On every tool result of the frame that has an entry, not only the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_decision: Option<PermissionDecision>,
    /// The sub-agent that wrote the frame (2.1.330 and later, on the frames of a Task/Agent
    /// call beside `parent_tool_use_id`): its `agent_id` (the `task_id` of its
    /// `task_started`), `subagent_type` (e.g. "general-purpose") and `task_description`
    /// (the call's `description`). `None` on main-thread frames and on older releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subagent_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_description: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub absent: Absent,
}

/// `tool_result_meta[].permission_decision` (2.1.330 and later), strings as the CLI sends
/// them: `decision` "accept" / "reject"; `source` "user_temporary" (a one-off answer to
/// the permission request), "user_reject", "config" (a permission rule or mode), "hook";
/// `reason_type` (sometimes) "rule" / "hook". Values ostler does not know are kept as
/// sent; a value that is not a string is `None`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PermissionDecision {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_type: Option<String>,
}

/// `tool_result.content` is polymorphic on the wire.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", content = "value", rename_all = "snake_case")]
pub enum ToolResultContent {
    Text(String),
    Blocks(RawJson),
    Null,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ControlRequest {
    pub request_id: String,
    pub request: CliRequest,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "subtype", rename_all = "snake_case")]
pub enum CliRequest {
    CanUseTool(CanUseTool),
    HookCallback(HookCallback),
    /// A request subtype not understood: kept whole so the owner can answer with an error.
    Other {
        request_subtype: String,
        raw: RawJson,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CanUseTool {
    pub tool_name: String,
    pub input: Value,
    /// Absent on 1.0.x (then named in `absent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_suggestions: Option<RawJson>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub absent: Absent,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HookCallback {
    pub callback_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<RawJson>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<String>,
}

/// One question of an AskUserQuestion tool call.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Question {
    pub question: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    #[serde(default)]
    pub options: Vec<QuestionOption>,
    #[serde(default)]
    pub multi_select: bool,
    /// `kind` (2.1.330 and later with `CLAUDE_CODE_QUESTION_EXTENDED`): `choice` (also
    /// when absent), `text` or `number`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// A helper line shown under the question.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// `text` questions: the empty box's placeholder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placeholder: Option<String>,
    /// `number` questions: range, increment, starting value and unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_value: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// The question may be left unanswered: it is part of an extended form (every question
    /// of the call carries a `kind`, the rule 2.1.330+ uses to tell a form from classic
    /// questions; 2.1.332 fills in `"choice"`). The form "lets the user type their own
    /// answer or leave a question unanswered"; classic questions are all answered.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

impl Question {
    /// A `number` question (its answer is a number in `min..=max`).
    pub fn is_number(&self) -> bool {
        self.kind.as_deref() == Some("number")
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct QuestionOption {
    pub label: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Content shown while the option is focused (`CLAUDE_CODE_QUESTION_PREVIEW_FORMAT`:
    /// markdown or an HTML fragment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ControlCancel {
    pub request_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ControlResponse {
    pub request_id: String,
    pub outcome: ControlOutcome,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "subtype", rename_all = "snake_case")]
pub enum ControlOutcome {
    Success {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        response: Option<RawJson>,
    },
    Error {
        error: String,
        /// e.g. `unsupported_request` (2.1.x).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_code: Option<String>,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TurnResult {
    /// `success`, `error_during_execution`, `error_max_turns`, `error_max_budget_usd`, ...
    pub subtype: String,
    pub is_error: bool,
    /// The final text; decoded when the wire carried JSON-encoded text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_turns: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_api_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_cost_usd: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_usage: Option<RawJson>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub permission_denials: Vec<PermissionDenial>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// Why the CLI's query loop ended (`completed`, `aborted_streaming`, ...; 2.1.x).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal_reason: Option<String>,
    /// The answer as JSON in the shape of the session's `--json-schema`, verbatim, when the
    /// CLI sends one (`structured_output`; not sent, or `null`, without a schema).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_output: Option<RawJson>,
    /// The wire ids (`uuid`) of the user messages this turn answered, in the order the CLI
    /// took them: `user_message_uuids`, else `user_message_uuid` (2.1.330 and later). Queued
    /// messages can run as one turn (2.1.x), so this is how a sender knows which result is
    /// its answer. Empty when the release does not say.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_message_uuids: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub absent: Absent,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PermissionDenial {
    pub tool_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_input: Option<Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SystemNotice {
    /// The wire `type` (`system`, `tool_progress`, `auth_status`, ...).
    pub source_type: String,
    /// The wire `subtype` when there is one (`status`, `compact_boundary`, `api_retry`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subtype: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_tool_use_id: Option<String>,
    /// The whole message, verbatim.
    pub fields: RawJson,
    /// The fields clients need, typed, for the notices that have them (background tasks,
    /// rate limits, compaction, status); read from `fields` by the decoder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<NoticeDetail>,
}

/// The typed part of a [`SystemNotice`] (see `detail.rs` for the wire shapes).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum NoticeDetail {
    /// `system/task_started`: a background task (sub-agent, shell) began.
    TaskStarted(TaskStarted),
    /// `system/task_progress`.
    TaskProgress(TaskProgress),
    /// `system/task_notification`: a background task ended.
    TaskNotification(TaskNotification),
    /// `rate_limit_event`: the account's rate-limit state changed.
    RateLimit(RateLimit),
    /// `system/compact_boundary`: the conversation was compacted.
    CompactBoundary(CompactBoundary),
    /// `system/status`: what the CLI is doing (`requesting`, `compacting`, none), and the
    /// permission mode when it changed.
    Status(CliStatus),
    /// `command_lifecycle` (2.1.x releases that announce `msg_lifecycle_v1`): what became
    /// of a user message written to the CLI.
    MessageLifecycle(MessageLifecycle),
    /// `system/elicitation_complete` (2.1.x releases that offer elicitation): an MCP server
    /// reported a URL elicitation finished (the user is done at the URL).
    ElicitationComplete(ElicitationComplete),
    /// `system/hook_started`, `hook_progress`, `hook_response`: a hook the CLI runs
    /// (with `--include-hook-events` every hook, else SessionStart's).
    HookActivity(HookActivity),
    /// `system/informational` (2.1.x): a text banner for the user (a hook's block reason,
    /// a failed hook callback, slash-command output).
    Informational(Informational),
    /// `prompt_suggestion` (2.1.120+, asked for in `initialize`): the model's guess at the
    /// user's next prompt, after a turn.
    PromptSuggestion(PromptSuggestion),
}

/// `task_started`. `tool_use_id` is the tool call that started the task (the `Task`
/// call of a sub-agent): the task's own messages carry it as `parent_tool_use_id`, and
/// its permission requests carry `task_id` as `agent_id`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TaskStarted {
    pub task_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subagent_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_backgrounded: Option<bool>,
}

/// `task_progress`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TaskProgress {
    pub task_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_tool_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<TaskUsage>,
}

/// `task_notification`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TaskNotification {
    pub task_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<String>,
    /// `completed`, `failed`, `stopped`.
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<TaskUsage>,
}

/// What a background task used so far.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TaskUsage {
    #[serde(default)]
    pub total_tokens: u64,
    #[serde(default)]
    pub tool_uses: u64,
    #[serde(default)]
    pub duration_ms: u64,
}

/// `rate_limit_event.rate_limit_info`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct RateLimit {
    /// `allowed`, `allowed_warning`, `rejected`.
    pub status: String,
    /// When the limit resets (epoch seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resets_at: Option<i64>,
    /// `five_hour`, `seven_day`, `seven_day_opus`, ..., `overage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit_type: Option<String>,
    /// 0..1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_using_overage: Option<bool>,
}

/// `compact_boundary.compact_metadata`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CompactBoundary {
    /// `manual` or `auto`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<String>,
    /// Tokens in the context before compaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_tokens: Option<u64>,
}

/// `command_lifecycle`: `{"type":"command_lifecycle","command_uuid","state","uuid",
/// "session_id"}`. `message_id` is the `uuid` of the user message it is about (the id
/// ostler sends and records as the UserMessage's `message_id`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct MessageLifecycle {
    pub message_id: String,
    /// `queued` (written while a turn runs), `started` (the CLI took it), `completed` (its
    /// turn ended); other values are passed through as sent.
    pub state: String,
}

/// `system/elicitation_complete`: `{"type":"system","subtype":"elicitation_complete",
/// "mcp_server_name","elicitation_id","uuid","session_id"}`, sent when the MCP server
/// sends `notifications/elicitation/complete` for a URL elicitation (measured on 2.1.332).
/// `elicitation_id` is the one of the URL elicitation it closes (the `elicitation` control
/// request's `elicitation_id`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ElicitationComplete {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_server_name: Option<String>,
    pub elicitation_id: String,
}

/// `system/hook_started` / `hook_progress` / `hook_response` (measured on 2.1.332 with
/// `--include-hook-events`): a hook's run, its output so far, and its end. The three
/// messages of one run share `hook_id`; `hook_name` is the event, with the tool's name for
/// tool hooks (`PostToolUse:Bash`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct HookActivity {
    /// `started`, `progress` or `response` (the subtype without `hook_`).
    pub phase: String,
    /// Absent on 2.0.x.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook_name: Option<String>,
    /// `PreToolUse`, `PostToolUse`, `Stop`, `SessionStart`, ...
    pub hook_event: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    /// stdout and stderr as they came, interleaved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// `success`, `error` or `cancelled` (the end only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
}

/// `system/informational`: a banner the CLI shows its user, as plain text at a level.
/// Measured on 2.1.332: a UserPromptSubmit hook that exits 2 gives one at `warning` with
/// `prevent_continuation` ("UserPromptSubmit operation blocked by hook: ...").
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Informational {
    pub content: String,
    /// `info`, `notice`, `suggestion` or `warning`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<String>,
    /// The CLI stops after it (a hook blocked the prompt or denied continuing).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prevent_continuation: bool,
    /// A feature tag (`hook_no_verdict`, ...), when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// `prompt_suggestion`: `{"type":"prompt_suggestion","suggestion","uuid","session_id"}`,
/// written after a turn's `result` (never after a session's first turn; measured on
/// 2.1.120 and 2.1.332).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct PromptSuggestion {
    pub suggestion: String,
}

/// `system/status`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CliStatus {
    /// `requesting`, `compacting`; `None` when the CLI reports no activity (`null`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Sent when the permission mode changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_mode: Option<String>,
}

/// One model's entry of a result's `modelUsage` (see [`TurnResult::models`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelUsage {
    pub model: String,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_input_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub web_search_requests: u64,
    pub cost_usd: f64,
    /// The model's context window in tokens (0 when not sent).
    pub context_window: u64,
    pub max_output_tokens: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Truncated {
    /// `type` / `subtype` when they could be read from the line's beginning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subtype: Option<String>,
    /// Ids read from the line's beginning (`session_id`, `uuid`, `request_id`,
    /// `message.id`, `tool_use_id`, `parent_tool_use_id`), in the order seen.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ids: Vec<(String, String)>,
    pub original_size: u64,
    /// `[truncated: original_size=N bytes]`.
    pub marker: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Diagnostic {
    pub code: DiagnosticCode,
    pub message: String,
    /// The start of the offending line (lossy UTF-8, at most a few hundred bytes).
    pub excerpt: String,
    pub line_len: u64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DiagnosticCode {
    /// Not JSON at all (e.g. a log line on stdout).
    NotJson,
    /// JSON, but not an object with a string `type`.
    NotAMessage,
    /// A known type whose shape could not be read; the message is kept as Unknown too.
    BadShape,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Unknown {
    /// The wire `type` (and `subtype` if any), e.g. `system/new_thing`.
    pub message_type: String,
    pub raw: RawJson,
}

impl Event {
    /// Stable snake_case name of the variant (the store's `kind` column).
    pub fn kind(&self) -> &'static str {
        match self {
            Event::SessionStarted(_) => "session_started",
            Event::AssistantBlock(_) => "assistant_block",
            Event::PartialDelta(_) => "partial_delta",
            Event::StreamMarker(_) => "stream_marker",
            Event::UserMessage(_) => "user_message",
            Event::ToolResult(_) => "tool_result",
            Event::ControlRequest(_) => "control_request",
            Event::ControlCancel(_) => "control_cancel",
            Event::ControlResponse(_) => "control_response",
            Event::TurnResult(_) => "turn_result",
            Event::SystemNotice(_) => "system_notice",
            Event::KeepAlive => "keep_alive",
            Event::Truncated(_) => "truncated",
            Event::Diagnostic(_) => "diagnostic",
            Event::Unknown(_) => "unknown",
        }
    }

    /// Live-only events (streaming deltas and markers) need not be stored.
    pub fn is_live_only(&self) -> bool {
        matches!(
            self,
            Event::PartialDelta(_) | Event::StreamMarker(_) | Event::KeepAlive
        )
    }

    /// The sub-agent tool call this event belongs to, if any.
    pub fn parent_tool_use_id(&self) -> Option<&str> {
        match self {
            Event::AssistantBlock(e) => e.parent_tool_use_id.as_deref(),
            Event::PartialDelta(e) => e.parent_tool_use_id.as_deref(),
            Event::StreamMarker(e) => e.parent_tool_use_id.as_deref(),
            Event::UserMessage(e) => e.parent_tool_use_id.as_deref(),
            Event::ToolResult(e) => e.parent_tool_use_id.as_deref(),
            Event::SystemNotice(e) => e.parent_tool_use_id.as_deref(),
            _ => None,
        }
    }
}

impl CanUseTool {
    /// AskUserQuestion arrives as `can_use_tool`; this reads its questions (accepting
    /// `multiSelect`/`multi_select` and options given as strings or `{label, description}`).
    pub fn questions(&self) -> Option<Vec<Question>> {
        crate::outbound::parse_questions(self)
    }
}
