//! The engine's domain types: sessions, events, requests. No tonic, no protobuf.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use ostler_protocol as proto;

use crate::permission::PermissionRule;

pub use ostler_store::{
    ExitFacts, ExitInfo, FeedKind, InteractionKind, InteractionState, SessionRecord, SessionState,
    UsageTotals,
};
pub use ostler_supervisor::options as cli_options;
pub use ostler_supervisor::{
    CliOptions, McpServer, McpToolPolicy, McpTuning, ToolDecl, ToolServerDecl,
};

/// A CLI's answer (a control response, `mcp_status`) as clients may see it: the values of
/// every `env` and `headers` object in it (an MCP server's configuration, settings' `env`:
/// possible secrets) replaced by `"<redacted>"`, and the credentials and query of every
/// `url` ([`redact_url`]), at any depth.
pub fn redact_env_and_headers(v: &mut Value) {
    match v {
        Value::Object(m) => {
            for (k, child) in m.iter_mut() {
                if (k == "env" || k == "headers")
                    && let Value::Object(secrets) = child
                {
                    for s in secrets.values_mut() {
                        *s = Value::String(cli_options::REDACTED.into());
                    }
                } else if k == "url"
                    && let Value::String(url) = child
                {
                    if let Some(shown) = redact_url(url) {
                        *url = shown;
                    }
                } else {
                    redact_env_and_headers(child);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(redact_env_and_headers),
        _ => {}
    }
}

/// `url` with its credentials (`user:password@`) and its query (`?token=...`) replaced by
/// `<redacted>`; `None` when it has neither.
pub fn redact_url(url: &str) -> Option<String> {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| start + i);
    let mut out = String::with_capacity(url.len());
    out.push_str(&url[..start]);
    let authority = &url[start..end];
    let mut changed = false;
    match authority.rfind('@') {
        Some(at) => {
            out.push_str(cli_options::REDACTED);
            out.push_str(&authority[at..]);
            changed = true;
        }
        None => out.push_str(authority),
    }
    let rest = &url[end..];
    match rest.find('?') {
        Some(q) => {
            out.push_str(&rest[..=q]);
            out.push_str(cli_options::REDACTED);
            if let Some(h) = rest[q..].find('#') {
                out.push_str(&rest[q + h..]);
            }
            changed = true;
        }
        None => out.push_str(rest),
    }
    changed.then_some(out)
}

/// An `engine_notice`'s data as clients (and webhooks) may see it: for `session_created`,
/// the values of the session's environment variables, of its MCP servers' `env` and
/// `headers`, and of the `env` and `headers` in its inline `settings` and
/// `managed_settings` (possible secrets) are replaced by `"<redacted>"`, as are the
/// credentials and query of its MCP servers' urls; the servers of `mcp_servers_set`
/// (`SetMcpServers`, or its repetition after a resume) likewise, and the `env` / `headers`
/// values in the request and answer of a passed-through control's notice (`control`,
/// `flag_settings_applied`, `control_restored`, ...); other notices unchanged.
pub fn redacted_notice_data(code: &str, data: &Value) -> Value {
    fn hide(v: Option<&mut Value>) {
        if let Some(Value::Object(m)) = v {
            for v in m.values_mut() {
                *v = Value::String(cli_options::REDACTED.into());
            }
        }
    }
    fn hide_servers(servers: Option<&mut Value>) {
        if let Some(servers @ Value::Object(_)) = servers {
            redact_env_and_headers(servers);
        }
    }
    /// Settings given inline (a JSON object in a string): its `env` and `headers` values.
    fn hide_in_settings(settings: Option<&mut Value>) {
        if let Some(Value::String(text)) = settings
            && let Ok(mut v @ Value::Object(_)) = serde_json::from_str::<Value>(text)
        {
            redact_env_and_headers(&mut v);
            *text = v.to_string();
        }
    }
    let mut d = data.clone();
    match code {
        "session_created" => {
            hide(d.get_mut("env"));
            hide_servers(d.get_mut("mcp_servers"));
            hide_in_settings(d.get_mut("settings"));
            hide_in_settings(d.get_mut("managed_settings"));
        }
        "mcp_servers_set" => {
            hide_servers(d.get_mut("request").and_then(|r| r.get_mut("servers")));
        }
        // Control requests passed through (`SendControlRequest`) and those sent again after
        // a respawn: settings may carry `env` values, MCP server configs `headers`, in the
        // request and in the answer (`get_settings` answers the settings in force).
        "control"
        | crate::runtime::FLAG_SETTINGS_APPLIED
        | crate::runtime::MCP_MODE_OVERRIDE_SET
        | crate::runtime::CONTROL_RESTORED
        | crate::runtime::CONTROL_RESTORE_FAILED => {
            redact_env_and_headers(&mut d);
        }
        _ => {}
    }
    d
}

/// How a session's CLI process ended: the store's exit record (code, signal, reason, time)
/// plus the stderr tail. Stored inside `process_exited` events as one flat object
/// (`code`, `signal`, `reason`, `at_ms`, `stderr_tail`), as every earlier build wrote it.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ExitStatus {
    /// Code and signal, why (in words: "stopped on request", "the CLI exited", ...), when.
    #[serde(flatten)]
    pub exit: ExitInfo,
    /// The last lines the CLI wrote to stderr.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stderr_tail: String,
}

/// A session as clients see it: the stored record, whose `state` is the live actor's while
/// one runs, plus what only the live actor knows. Reads through to the record
/// (`info.id`, `info.state`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionInfo {
    pub record: SessionRecord,
    /// Pending permission requests, questions, hook calls and tool calls.
    pub pending_interactions: u32,
    /// The last lines the CLI wrote to stderr (live sessions; empty otherwise).
    pub stderr_tail: String,
}

impl std::ops::Deref for SessionInfo {
    type Target = SessionRecord;
    fn deref(&self) -> &SessionRecord {
        &self.record
    }
}

impl SessionInfo {
    /// How the process last ended, when it has, with the stderr tail.
    pub fn exit(&self) -> Option<ExitStatus> {
        self.record.exit.clone().map(|exit| ExitStatus {
            exit,
            stderr_tail: self.stderr_tail.clone(),
        })
    }
}

/// A user message's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "value", rename_all = "snake_case")]
pub enum MessageContent {
    Text(String),
    /// Anthropic content blocks (text, image, ...), passed through.
    Blocks(Vec<Value>),
}

/// `CreateSession`.
#[derive(Debug, Clone, Default)]
pub struct CreateSession {
    /// Must exist, be a directory, and lie under one of the configured allowed roots.
    pub cwd: PathBuf,
    /// The CLI's options (model, mode, tools, prompts, MCP servers, budgets, settings,
    /// agents, schema, environment): validated before anything is created, recorded in
    /// the session's first event and re-applied on every resume.
    pub options: CliOptions,
    /// A client-chosen session id (`None`: a new uuid). Creating with an id that exists
    /// returns that session when cwd, options and rules are the same (an idempotent
    /// retry), `AlreadyExists` otherwise.
    pub session_id: Option<String>,
    /// Where the conversation comes from (`None`: a new one).
    pub origin: Option<Origin>,
    pub labels: BTreeMap<String, String>,
    /// Per-session permission rules evaluated by ostler (in addition to the configured ones).
    pub rules: Vec<PermissionRule>,
    /// Sent as the first user message once the process is up.
    pub first_prompt: Option<MessageContent>,
    /// Who is creating it (recorded on the first prompt).
    pub client: ClientRef,
    /// The session's title; `None` = the first prompt's text, shortened.
    pub title: Option<String>,
    /// File checkpointing (`CLAUDE_CODE_ENABLE_SDK_FILE_CHECKPOINTING`): the CLI keeps the
    /// files' state at each user message, so `RewindFiles` can restore it.
    pub enable_file_checkpointing: bool,
}

/// Where a new session's CLI conversation comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Origin {
    /// Continue a CLI conversation ostler did not start: its CLI session id, whose
    /// transcript must exist under the daemon's HOME (`--resume`).
    Adopt { claude_session_id: String },
    /// Branch another ostler session's conversation into this new session (`--resume
    /// --fork-session`); the other session and its log are untouched, this session's
    /// first event names the fork point (session, seq, CLI session). With
    /// `at_message_id`, the branch is cut after that message (`--resume-session-at`).
    Fork {
        session_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at_message_id: Option<String>,
        /// With `at_message_id`: the user message starting the one turn the cut may drop
        /// (`--resume-drops-turn`); the CLI refuses the fork when more lies past the cut.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        drops_turn_message_id: Option<String>,
    },
}

/// Who makes a call: recorded on decisions and user messages.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientRef {
    /// Stable client id (e.g. from request metadata); empty when anonymous.
    pub id: String,
    /// Display name, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ClientRef {
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            name: None,
        }
    }

    /// How the client is named in `decided_by`: `client:<id>` (plus ` (<name>)`).
    pub fn label(&self) -> String {
        let id = if self.id.is_empty() {
            "anonymous"
        } else {
            &self.id
        };
        match &self.name {
            Some(n) if !n.is_empty() => format!("client:{id} ({n})"),
            _ => format!("client:{id}"),
        }
    }
}

/// `ListSessions`.
#[derive(Debug, Clone, Default)]
pub struct ListSessions {
    /// Sessions in any of these states (empty: all).
    pub states: Vec<SessionState>,
    /// Sessions carrying all of these labels.
    pub labels: Vec<(String, String)>,
    /// At most this many (0: a default of 100).
    pub page_size: u32,
    /// From a previous page.
    pub page_token: Option<String>,
    /// Only archived sessions (`Some(true)`) or only the others (`Some(false)`).
    pub archived: Option<bool>,
}

/// `UpdateSession`: what to change (at least one of them).
#[derive(Debug, Clone, Default)]
pub struct UpdateSession {
    /// The new title.
    pub title: Option<String>,
    /// Labels to add or to give a new value.
    pub set_labels: BTreeMap<String, String>,
    /// Label keys to remove.
    pub remove_labels: Vec<String>,
    /// Archive or unarchive.
    pub archived: Option<bool>,
    /// The most labels the session may carry afterwards (0: no limit).
    pub max_labels: usize,
}

/// One page of sessions.
#[derive(Debug, Clone)]
pub struct SessionPage {
    pub sessions: Vec<SessionInfo>,
    pub next_page_token: Option<String>,
}

/// `SendMessage`.
#[derive(Debug, Clone)]
pub struct SendMessage {
    pub content: MessageContent,
    /// A retried send with the same id is not delivered twice: the seq of the first is
    /// returned.
    pub client_message_id: Option<String>,
    pub client: ClientRef,
    /// How the CLI is to take it (checked against the running release).
    pub delivery: crate::Delivery,
}

/// `Subscribe`.
#[derive(Debug, Clone, Default)]
pub struct SubscribeRequest {
    pub session_id: String,
    /// Deliver stored events with seq > `after_seq` (0: from the beginning).
    pub after_seq: u64,
    /// Also deliver live-only partial deltas / stream markers (never replayed).
    pub include_partials: bool,
    /// Keep following live events after the replay; otherwise end once caught up.
    pub follow: bool,
}

/// A client's answer to a permission request.
#[derive(Debug, Clone, PartialEq)]
pub enum PermissionResponse {
    Allow {
        /// Replaces the tool input; `None` sends the original input.
        updated_input: Option<Value>,
        /// "Remember for this session": rules added to the session's rule set (normally
        /// `Allow` rules for this tool).
        remember: Vec<PermissionRule>,
        /// Permission updates for the CLI to apply (its `updatedPermissions`: a JSON array
        /// of `PermissionUpdate`s, e.g. the request's `suggestions`).
        updated_permissions: Option<Value>,
    },
    Deny {
        /// Sent to the CLI (a default is used when empty).
        message: String,
        /// Also interrupt the turn.
        interrupt: bool,
    },
}

/// The answer to one question of an AskUserQuestion call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuestionAnswer {
    /// The question text, exactly as asked.
    pub question: String,
    /// Chosen option labels (more than one only for multi-select questions).
    pub selected: Vec<String>,
    /// Free text ("Other"), accepted when the engine allows free-text answers or the
    /// question has no options. Counts as one choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_text: Option<String>,
}

/// What `SendMessage` returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendOutcome {
    /// The seq of the recorded `user_message_sent` event.
    pub seq: u64,
    /// A retry with a `client_message_id` already seen: nothing was sent again, `seq` is the
    /// first send's.
    pub duplicate: bool,
    /// The uuid the message carries on the wire (see [`UserMessageSent::message_id`]);
    /// `None` for a duplicate.
    pub message_id: Option<String>,
}

/// What `RespondToPermission` / `AnswerQuestion` return.
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    /// The seq of the `interaction_resolved` event.
    pub seq: u64,
    pub resolved: InteractionResolved,
}

/// What `RespondToHook` returns.
#[derive(Debug, Clone, PartialEq)]
pub struct HookDecided {
    /// The seq of the `hook_resolved` event.
    pub seq: u64,
    pub resolved: ostler_protocol::hooks::HookResolved,
}

/// A tool call answered through `RespondToToolCall`.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCallDecided {
    /// The seq of the `tool_call_resolved` event.
    pub seq: u64,
    pub resolved: ToolCallResolved,
}

/// What became of a permission request or question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Resolution {
    Allowed {
        /// What was sent as `updatedInput`.
        updated_input: Value,
        /// Was the input edited by the decider?
        #[serde(default)]
        edited: bool,
        /// What was sent as `updatedPermissions` (the CLI's permission updates), if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        updated_permissions: Option<Value>,
    },
    Denied {
        message: String,
        #[serde(default)]
        interrupt: bool,
    },
    Answered {
        answers: Vec<QuestionAnswer>,
    },
    /// Nobody decided before the configured expiry: denied with a message.
    Expired {
        message: String,
    },
    /// Withdrawn by the CLI (`control_cancel_request`) or because the process ended.
    Cancelled {
        reason: String,
    },
}

impl Resolution {
    pub fn as_str(&self) -> &'static str {
        match self {
            Resolution::Allowed { .. } => "allowed",
            Resolution::Denied { .. } => "denied",
            Resolution::Answered { .. } => "answered",
            Resolution::Expired { .. } => "expired",
            Resolution::Cancelled { .. } => "cancelled",
        }
    }
}

/// A permission request forwarded to clients.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PermissionRequested {
    /// The CLI's request id (unique within the session).
    pub request_id: String,
    pub tool_name: String,
    pub input: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_reason: Option<String>,
    /// The CLI's `permission_suggestions`, verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suggestions: Option<Value>,
    /// When it expires (epoch ms), if expiry is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
    /// The background agent (sub-agent task) that asks: its `task_id` from
    /// `task_started`; `None` for the main conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
}

/// An AskUserQuestion call forwarded to clients.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuestionAsked {
    pub request_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<String>,
    pub questions: Vec<proto::Question>,
    /// The tool input, verbatim.
    pub input: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
}

/// A permission request or question was resolved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InteractionResolved {
    pub request_id: String,
    /// `permission` or `question`. (Serialized as `interaction_kind`: `kind` is the event
    /// payload's tag.)
    #[serde(rename = "interaction_kind")]
    pub kind: InteractionKind,
    pub resolution: Resolution,
    /// `client:<id>`, `rule:<rule text>`, `expiry`, `cli` (cancelled by the CLI), `engine`.
    pub decided_by: String,
}

/// A user message ostler sent to the CLI.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UserMessageSent {
    pub content: MessageContent,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_message_id: Option<String>,
    /// `client:<id>` of the sender.
    pub sent_by: String,
    /// The uuid ostler gave the message on the wire (`uuid`): the id `RewindFiles` takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    /// How the client asked the CLI to take it.
    #[serde(default, skip_serializing_if = "crate::Delivery::is_plain")]
    pub delivery: crate::Delivery,
}

/// The session's state changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateChanged {
    pub from: SessionState,
    pub to: SessionState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The session's CLI process ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessExited {
    pub status: ExitStatus,
}

/// A notice from ostler itself (model or mode changed, process spawned, resumed, ...).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineNotice {
    /// e.g. `model_set`, `permission_mode_set`, `spawned`, `resumed`, `stall`, `rule_added`.
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

/// One event's payload: the canonical model plus what ostler itself adds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EventPayload {
    /// `system/init`.
    SessionStarted(proto::SessionStarted),
    /// One assistant content block (text, thinking, tool_use, ...).
    AssistantBlock(proto::AssistantBlock),
    /// Live-only streaming delta (never stored, `seq` is `None`).
    PartialDelta(proto::PartialDelta),
    /// Live-only stream boundary (never stored, `seq` is `None`).
    StreamMarker(proto::StreamMarker),
    /// A `user` frame from the CLI that is not a tool result (echo, interruption marker).
    UserMessage(proto::UserMessage),
    /// A user message ostler sent.
    UserMessageSent(UserMessageSent),
    ToolResult(proto::ToolResult),
    PermissionRequested(PermissionRequested),
    QuestionAsked(QuestionAsked),
    /// A permission request or question was resolved (by whom is recorded).
    InteractionResolved(InteractionResolved),
    /// `result`: a turn ended (usage, cost).
    TurnCompleted(proto::TurnResult),
    StateChanged(StateChanged),
    /// `system/*` other than init and auxiliary CLI messages.
    SystemNotice(proto::SystemNotice),
    /// A control request from the CLI other than `can_use_tool` (answered with an error).
    CliControlRequest(proto::ControlRequest),
    /// The CLI's answer to one of our control requests.
    ControlResponse(proto::ControlResponse),
    EngineNotice(EngineNotice),
    ProcessExited(ProcessExited),
    /// Unreadable stdout (not JSON, ...).
    Diagnostic(proto::Diagnostic),
    /// A line longer than the cap.
    Truncated(proto::Truncated),
    /// A message type not understood, kept whole.
    Unknown(proto::Unknown),
    /// Live-only, per subscriber: partial deltas this subscriber did not get (it fell
    /// behind the live ring); never stored, `seq` is `None`.
    PartialsMissed(PartialsMissed),
    /// The CLI called a hook registered by the session (issue 11), pending for clients.
    HookRequested(ostler_protocol::hooks::HookRequested),
    /// A hook call was answered (client, default) or cancelled.
    HookResolved(ostler_protocol::hooks::HookResolved),
    /// A call of a client-hosted tool, pending (issue 11).
    ToolCallRequested(ToolCallRequested),
    /// A client-hosted tool call was answered (client, expiry, restart, cancellation).
    ToolCallResolved(ToolCallResolved),
    /// An MCP server asked the user for input (the CLI's `elicitation`), pending.
    ElicitationRequested(ElicitationRequested),
    /// An elicitation was answered (client, expiry, restart, cancellation).
    ElicitationResolved(ElicitationResolved),
    /// The CLI asks for a dialog of a declared kind (`request_user_dialog`), pending.
    DialogRequested(DialogRequested),
    /// A dialog was answered (client, expiry, restart, withdrawal, cancellation).
    DialogResolved(DialogResolved),
}

/// The CLI's `request_user_dialog`: a dialog of a kind the session declared
/// (`dialog_kinds`), for clients to answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DialogRequested {
    pub request_id: String,
    pub dialog_kind: String,
    /// What the dialog shows (a JSON object, fields per kind).
    pub payload: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<String>,
    /// When it is answered `cancelled` if nobody answered (epoch ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
    /// The request as the CLI sent it (fields newer releases add included).
    pub request: Value,
}

/// How a dialog was closed (the CLI's `behavior`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DialogBehavior {
    Completed,
    Cancelled,
}

impl DialogBehavior {
    /// The CLI's name (`completed`, `cancelled`).
    pub fn as_str(self) -> &'static str {
        match self {
            DialogBehavior::Completed => "completed",
            DialogBehavior::Cancelled => "cancelled",
        }
    }
}

/// A dialog was answered (`behavior` and `result` as sent to the CLI).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DialogResolved {
    pub request_id: String,
    pub outcome: ToolCallOutcome,
    pub behavior: DialogBehavior,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// `client:<id>`, `expiry`, `restart`, `cli`, `engine`.
    pub resolved_by: String,
}

/// A dialog answered through `RespondToDialog`.
#[derive(Debug, Clone, PartialEq)]
pub struct DialogDecided {
    /// The seq of the `dialog_resolved` event.
    pub seq: u64,
    pub resolved: DialogResolved,
}

/// An MCP server's request for the user's input (MCP `elicitation/create`), passed on by
/// the CLI as its `elicitation` control request, for clients to answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElicitationRequested {
    pub request_id: String,
    pub mcp_server_name: String,
    pub message: String,
    /// `form` or `url` (the CLI's `mode`; `form` when it names none).
    pub mode: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elicitation_id: Option<String>,
    /// Form mode: the JSON Schema of the content asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_schema: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// When it is answered `cancel` if nobody answered (epoch ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
    /// The request as the CLI sent it (fields newer releases add included).
    pub request: Value,
}

/// How the user answered an elicitation (MCP `ElicitResult.action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ElicitationAction {
    Accept,
    Decline,
    Cancel,
}

impl ElicitationAction {
    /// The MCP name (`accept`, `decline`, `cancel`).
    pub fn as_str(self) -> &'static str {
        match self {
            ElicitationAction::Accept => "accept",
            ElicitationAction::Decline => "decline",
            ElicitationAction::Cancel => "cancel",
        }
    }
}

/// An elicitation was answered (`action` and `content` as sent to the CLI).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElicitationResolved {
    pub request_id: String,
    pub outcome: ToolCallOutcome,
    pub action: ElicitationAction,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Value>,
    /// `client:<id>`, `expiry`, `restart`, `cli`, `engine`.
    pub resolved_by: String,
}

/// An elicitation answered through `RespondToElicitation`.
#[derive(Debug, Clone, PartialEq)]
pub struct ElicitationDecided {
    /// The seq of the `elicitation_resolved` event.
    pub seq: u64,
    pub resolved: ElicitationResolved,
}

/// A call of a client-hosted tool (`mcp_message` `tools/call`), for clients to answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRequested {
    pub request_id: String,
    pub server_name: String,
    pub tool_name: String,
    /// The call's arguments (a JSON object).
    pub arguments: Value,
    /// The model's tool use id, when the CLI named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<String>,
    /// When the call gets an error result if nobody answered (epoch ms).
    pub expires_at_ms: i64,
    /// The JSON-RPC id the CLI's call carried (answered with it).
    pub rpc_id: Value,
}

/// How a client-hosted tool call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallOutcome {
    Answered,
    Expired,
    Cancelled,
}

impl ToolCallOutcome {
    /// The stored interaction's final state.
    pub fn state(self) -> ostler_store::InteractionState {
        match self {
            ToolCallOutcome::Answered => ostler_store::InteractionState::Answered,
            ToolCallOutcome::Expired => ostler_store::InteractionState::Expired,
            ToolCallOutcome::Cancelled => ostler_store::InteractionState::Cancelled,
        }
    }
}

/// A client-hosted tool call was answered (`content` and `is_error` as sent to the CLI).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallResolved {
    pub request_id: String,
    pub outcome: ToolCallOutcome,
    pub content: Vec<ostler_protocol::sdk_mcp::Content>,
    pub is_error: bool,
    /// `client:<id>`, `expiry`, `restart`, `cli`, `engine`.
    pub resolved_by: String,
}

/// Partial deltas a subscriber missed (see [`EventPayload::PartialsMissed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartialsMissed {
    pub count: u64,
}

impl EventPayload {
    /// Stable snake_case name (the store's `kind` column).
    pub fn kind(&self) -> &'static str {
        match self {
            EventPayload::SessionStarted(_) => "session_started",
            EventPayload::AssistantBlock(_) => "assistant_block",
            EventPayload::PartialDelta(_) => "partial_delta",
            EventPayload::StreamMarker(_) => "stream_marker",
            EventPayload::UserMessage(_) => "user_message",
            EventPayload::UserMessageSent(_) => "user_message_sent",
            EventPayload::ToolResult(_) => "tool_result",
            EventPayload::PermissionRequested(_) => "permission_requested",
            EventPayload::QuestionAsked(_) => "question_asked",
            EventPayload::InteractionResolved(_) => "interaction_resolved",
            EventPayload::TurnCompleted(_) => "turn_completed",
            EventPayload::StateChanged(_) => "state_changed",
            EventPayload::SystemNotice(_) => "system_notice",
            EventPayload::CliControlRequest(_) => "cli_control_request",
            EventPayload::ControlResponse(_) => "control_response",
            EventPayload::EngineNotice(_) => "engine_notice",
            EventPayload::ProcessExited(_) => "process_exited",
            EventPayload::Diagnostic(_) => "diagnostic",
            EventPayload::Truncated(_) => "truncated",
            EventPayload::Unknown(_) => "unknown",
            EventPayload::PartialsMissed(_) => "partials_missed",
            EventPayload::HookRequested(_) => "hook_requested",
            EventPayload::HookResolved(_) => "hook_resolved",
            EventPayload::ToolCallRequested(_) => "tool_call_requested",
            EventPayload::ToolCallResolved(_) => "tool_call_resolved",
            EventPayload::ElicitationRequested(_) => "elicitation_requested",
            EventPayload::ElicitationResolved(_) => "elicitation_resolved",
            EventPayload::DialogRequested(_) => "dialog_requested",
            EventPayload::DialogResolved(_) => "dialog_resolved",
        }
    }

    /// The stored encoding: the variant's own JSON, without the `kind` tag (the store keeps
    /// the kind in its own column). Decoding by kind avoids serde's buffering of internally
    /// tagged enums, which made replay several times slower.
    pub fn encode_stored(&self) -> serde_json::Result<Vec<u8>> {
        self.encode_stored_sized(128)
    }

    /// [`EventPayload::encode_stored`] into a buffer of `capacity` bytes to start with (a
    /// payload read from a CLI line is about as long as the line: sized so, it is written
    /// without growing the buffer on the way).
    pub fn encode_stored_sized(&self, capacity: usize) -> serde_json::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(capacity);
        macro_rules! enc {
            ($($v:ident),*) => {
                match self {
                    $(EventPayload::$v(x) => serde_json::to_writer(&mut out, x),)*
                }
            };
        }
        enc!(
            SessionStarted,
            AssistantBlock,
            PartialDelta,
            StreamMarker,
            UserMessage,
            UserMessageSent,
            ToolResult,
            PermissionRequested,
            QuestionAsked,
            InteractionResolved,
            TurnCompleted,
            StateChanged,
            SystemNotice,
            CliControlRequest,
            ControlResponse,
            EngineNotice,
            ProcessExited,
            Diagnostic,
            Truncated,
            Unknown,
            PartialsMissed,
            HookRequested,
            HookResolved,
            ToolCallRequested,
            ToolCallResolved,
            ElicitationRequested,
            ElicitationResolved,
            DialogRequested,
            DialogResolved
        )?;
        Ok(out)
    }

    /// Decodes a stored payload of `kind` (see [`EventPayload::encode_stored`]); the tagged
    /// form (`{"kind": ...}`) is accepted too. Any nesting depth the CLI can send reads
    /// back (`ostler_protocol::from_slice_any_depth`): replay equals live.
    pub fn decode_stored(kind: &str, bytes: &[u8]) -> serde_json::Result<EventPayload> {
        macro_rules! dec {
            ($($v:ident => $k:literal),*) => {
                match kind {
                    $($k => ostler_protocol::from_slice_any_depth(bytes).map(EventPayload::$v),)*
                    _ => ostler_protocol::from_slice_any_depth::<EventPayload>(bytes),
                }
            };
        }
        let r = dec!(
            SessionStarted => "session_started",
            AssistantBlock => "assistant_block",
            PartialDelta => "partial_delta",
            StreamMarker => "stream_marker",
            UserMessage => "user_message",
            UserMessageSent => "user_message_sent",
            ToolResult => "tool_result",
            PermissionRequested => "permission_requested",
            QuestionAsked => "question_asked",
            InteractionResolved => "interaction_resolved",
            TurnCompleted => "turn_completed",
            StateChanged => "state_changed",
            SystemNotice => "system_notice",
            CliControlRequest => "cli_control_request",
            ControlResponse => "control_response",
            EngineNotice => "engine_notice",
            ProcessExited => "process_exited",
            Diagnostic => "diagnostic",
            Truncated => "truncated",
            Unknown => "unknown",
            PartialsMissed => "partials_missed",
            HookRequested => "hook_requested",
            HookResolved => "hook_resolved",
            ToolCallRequested => "tool_call_requested",
            ToolCallResolved => "tool_call_resolved",
            ElicitationRequested => "elicitation_requested",
            ElicitationResolved => "elicitation_resolved",
            DialogRequested => "dialog_requested",
            DialogResolved => "dialog_resolved"
        );
        match r {
            Ok(p) if p.kind() == kind => Ok(p),
            Ok(p) => ostler_protocol::from_slice_any_depth::<EventPayload>(bytes).or(Ok(p)),
            Err(e) => ostler_protocol::from_slice_any_depth::<EventPayload>(bytes).map_err(|_| e),
        }
    }

    /// Live-only payloads are published without a seq and never stored.
    pub fn is_live_only(&self) -> bool {
        matches!(
            self,
            EventPayload::PartialDelta(_)
                | EventPayload::StreamMarker(_)
                | EventPayload::PartialsMissed(_)
        )
    }

    /// The sub-agent tool call this event belongs to, if any.
    pub fn parent_tool_use_id(&self) -> Option<&str> {
        match self {
            EventPayload::AssistantBlock(e) => e.parent_tool_use_id.as_deref(),
            EventPayload::PartialDelta(e) => e.parent_tool_use_id.as_deref(),
            EventPayload::StreamMarker(e) => e.parent_tool_use_id.as_deref(),
            EventPayload::UserMessage(e) => e.parent_tool_use_id.as_deref(),
            EventPayload::ToolResult(e) => e.parent_tool_use_id.as_deref(),
            EventPayload::SystemNotice(e) => e.parent_tool_use_id.as_deref(),
            _ => None,
        }
    }
}

/// One event of a session, shared (`Arc<EngineEvent>`) between every subscriber.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineEvent {
    pub session_id: std::sync::Arc<str>,
    /// The store's seq (gap-free from 1); `None` only for live-only partials.
    pub seq: Option<u64>,
    /// Epoch milliseconds.
    pub ts_ms: i64,
    pub parent_tool_use_id: Option<String>,
    pub payload: EventPayload,
    /// True when this is a pending permission request / question delivered again at the
    /// start of a subscription whose `after_seq` is already past it (so the subscriber can
    /// still answer it). Its `seq` is the original one.
    pub redelivered: bool,
}

/// A pending permission request, question or hook call.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingInteraction {
    pub session_id: String,
    pub request_id: String,
    pub kind: InteractionKind,
    /// The `permission_requested` / `question_asked` event.
    pub event: std::sync::Arc<EngineEvent>,
}

/// One interaction in any state, as `GetInteraction` returns it.
#[derive(Debug, Clone, PartialEq)]
pub struct InteractionRecord {
    /// The interaction as the store keeps it (state, who decided and when, the response).
    pub interaction: ostler_store::Interaction,
    /// Its session's working directory.
    pub cwd: String,
    /// The event that asked it (`None` when the log no longer holds it).
    pub event: Option<EngineEvent>,
}

/// Health details.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthReport {
    /// Sessions per state (every state present, zero included).
    pub sessions_by_state: BTreeMap<SessionState, u64>,
    /// Pending permission requests and questions across live sessions.
    pub pending_interactions: u64,
    /// `Ok(())` when the store answered a read, else why not.
    pub store: Result<(), String>,
    /// Live sessions / the configured maximum.
    pub live_sessions: u64,
    pub max_live_sessions: u64,
    /// Subscriptions following live events, across sessions.
    pub subscribers: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn round_trip(p: EventPayload) {
        let stored = p.encode_stored().expect("encode stored");
        assert_eq!(
            EventPayload::decode_stored(p.kind(), &stored).expect("decode stored"),
            p
        );
        let bytes = serde_json::to_vec(&p).expect("encode");
        let back: EventPayload = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            panic!(
                "{} does not decode: {e}: {}",
                p.kind(),
                String::from_utf8_lossy(&bytes)
            )
        });
        assert_eq!(back, p);
        let v: Value = serde_json::from_slice(&bytes).expect("json");
        assert_eq!(v["kind"], p.kind());
    }

    /// Every payload ostler originates survives the store (the tag `kind` must not clash
    /// with a field).
    #[test]
    fn engine_payloads_round_trip() {
        use ostler_protocol::hooks::{HookAnswer, HookDecision, HookResolution};
        round_trip(EventPayload::HookRequested(
            ostler_protocol::hooks::HookRequested {
                request_id: "r1".into(),
                hook_event: "PreToolUse".into(),
                registration_id: "policy".into(),
                input: json!({"tool_name": "Bash", "tool_input": {"command": "ls"}}),
                tool_use_id: Some("toolu_1".into()),
                tool_name: Some("Bash".into()),
                expires_at_ms: 5,
                agent_id: Some("task-1".into()),
            },
        ));
        round_trip(EventPayload::HookResolved(
            ostler_protocol::hooks::HookResolved {
                request_id: "r1".into(),
                resolution: HookResolution::Expired,
                answer: HookAnswer {
                    decision: HookDecision::Deny,
                    reason: Some("no".into()),
                    ..Default::default()
                },
                resolved_by: "default:restart".into(),
                output: Some(json!({"hookSpecificOutput": {"permissionDecision": "deny"}})),
            },
        ));
        round_trip(EventPayload::UserMessageSent(UserMessageSent {
            content: MessageContent::Blocks(vec![json!({"type": "text", "text": "hi"})]),
            client_message_id: Some("m1".into()),
            sent_by: "client:a".into(),
            message_id: Some("0b9d4a6e-1c2f-4a57-9a43-6f5e0d1c2b3a".into()),
            delivery: crate::Delivery {
                priority: Some(crate::Priority::Later),
                verbatim: true,
                context_only: true,
                pasted: vec!["a pasted log\nline 2".into()],
            },
        }));
        round_trip(EventPayload::UserMessageSent(UserMessageSent {
            content: MessageContent::Text("hi".into()),
            client_message_id: None,
            sent_by: "client:a".into(),
            message_id: None,
            delivery: crate::Delivery::default(),
        }));
        for resolution in [
            Resolution::Allowed {
                updated_input: json!({"command": "ls"}),
                edited: true,
                updated_permissions: None,
            },
            Resolution::Allowed {
                updated_input: json!({"command": "ls"}),
                edited: false,
                updated_permissions: Some(
                    json!([{"type": "setMode", "mode": "acceptEdits", "destination": "session"}]),
                ),
            },
            Resolution::Denied {
                message: "no".into(),
                interrupt: true,
            },
            Resolution::Answered {
                answers: vec![QuestionAnswer {
                    question: "Q?".into(),
                    selected: vec!["A".into()],
                    other_text: Some("x".into()),
                }],
            },
            Resolution::Expired {
                message: "late".into(),
            },
            Resolution::Cancelled {
                reason: "cli".into(),
            },
        ] {
            round_trip(EventPayload::InteractionResolved(InteractionResolved {
                request_id: "r1".into(),
                kind: InteractionKind::Question,
                resolution,
                decided_by: "client:a".into(),
            }));
        }
        round_trip(EventPayload::StateChanged(StateChanged {
            from: SessionState::Idle,
            to: SessionState::AwaitingPermission,
            reason: Some("x".into()),
        }));
        round_trip(EventPayload::EngineNotice(EngineNotice {
            code: "c".into(),
            message: "m".into(),
            data: Some(json!({"kind": "inner kind is fine inside data"})),
        }));
        round_trip(EventPayload::ProcessExited(ProcessExited {
            status: ExitStatus {
                exit: ExitInfo {
                    facts: ExitFacts {
                        code: Some(1),
                        signal: None,
                    },
                    reason: Some("crash".into()),
                    at_ms: 5,
                },
                stderr_tail: "boom".into(),
            },
        }));
        round_trip(EventPayload::PermissionRequested(PermissionRequested {
            request_id: "r".into(),
            tool_name: "Bash".into(),
            input: json!({"command": "touch x"}),
            tool_use_id: None,
            description: None,
            display_name: None,
            blocked_path: None,
            decision_reason: None,
            suggestions: Some(json!([{"type": "addRules"}])),
            expires_at_ms: Some(1),
            agent_id: Some("task-1".into()),
        }));
        round_trip(EventPayload::QuestionAsked(QuestionAsked {
            request_id: "r".into(),
            tool_use_id: Some("t".into()),
            questions: vec![proto::Question {
                question: "Q?".into(),
                header: None,
                options: vec![proto::QuestionOption {
                    label: "A".into(),
                    description: None,
                    preview: Some("<b>A</b>".into()),
                }],
                multi_select: true,
                kind: Some("choice".into()),
                min: Some(1.5),
                ..Default::default()
            }],
            input: json!({}),
            expires_at_ms: None,
        }));
    }

    /// `process_exited` payloads as builds before the one exit shape stored them (field
    /// order `code, signal, reason, stderr_tail, at_ms`; absent fields left out).
    const OLD_EXITS: [&str; 4] = [
        r#"{"status":{"code":1,"reason":"the CLI crashed or was killed","stderr_tail":"fatal: boom\n","at_ms":1763900000123}}"#,
        r#"{"status":{"signal":9,"reason":"stopped on request","at_ms":5}}"#,
        r#"{"status":{"reason":"the CLI could not be started: no such file","at_ms":7}}"#,
        r#"{"status":{"code":0,"signal":15,"at_ms":0}}"#,
    ];

    #[test]
    fn exit_payloads_of_older_builds_decode() {
        let first = EventPayload::decode_stored("process_exited", OLD_EXITS[0].as_bytes())
            .expect("old payload");
        assert_eq!(
            first,
            EventPayload::ProcessExited(ProcessExited {
                status: ExitStatus {
                    exit: ExitInfo {
                        facts: ExitFacts {
                            code: Some(1),
                            signal: None,
                        },
                        reason: Some("the CLI crashed or was killed".into()),
                        at_ms: 1_763_900_000_123,
                    },
                    stderr_tail: "fatal: boom\n".into(),
                },
            })
        );
        let second = EventPayload::decode_stored("process_exited", OLD_EXITS[1].as_bytes())
            .expect("old payload");
        let EventPayload::ProcessExited(ProcessExited { status }) = second else {
            panic!("not an exit: {second:?}");
        };
        assert_eq!(status.exit.facts.signal, Some(9));
        assert_eq!(status.exit.facts.code, None);
        assert_eq!(status.stderr_tail, "");
        for old in OLD_EXITS {
            let p = EventPayload::decode_stored("process_exited", old.as_bytes())
                .unwrap_or_else(|e| panic!("{old} does not decode: {e}"));
            // Written again, it is the same JSON object (only the order of keys may differ),
            // and that re-encoding round-trips to the very same bytes.
            let again = p.encode_stored().expect("encode");
            let as_old: Value = serde_json::from_str(old).expect("json");
            let as_new: Value = serde_json::from_slice(&again).expect("json");
            assert_eq!(as_new, as_old, "{}", String::from_utf8_lossy(&again));
            let back = EventPayload::decode_stored("process_exited", &again).expect("decode");
            assert_eq!(back, p);
            assert_eq!(back.encode_stored().expect("encode"), again);
            // The tagged form (`{"kind": ...}`) reads back too.
            let mut tagged = as_old;
            tagged["kind"] = json!("process_exited");
            let bytes = serde_json::to_vec(&tagged).expect("json");
            assert_eq!(
                EventPayload::decode_stored("process_exited", &bytes).expect("tagged"),
                p
            );
        }
        // An exit without its time was never written; it stays an error, not a zero.
        assert!(
            EventPayload::decode_stored("process_exited", br#"{"status":{"code":1}}"#).is_err()
        );
    }

    #[test]
    fn states_parse_back() {
        for s in SessionState::ALL {
            assert_eq!(s.as_str().parse::<SessionState>().expect("parse"), s);
        }
        assert!("bogus".parse::<SessionState>().is_err());
    }

    #[test]
    fn client_labels() {
        assert_eq!(ClientRef::new("a").label(), "client:a");
        assert_eq!(ClientRef::default().label(), "client:anonymous");
        let named = ClientRef {
            id: "a".into(),
            name: Some("Alice".into()),
        };
        assert_eq!(named.label(), "client:a (Alice)");
    }
}
