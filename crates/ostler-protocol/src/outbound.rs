//! Messages ostler writes to the CLI's stdin. Each encodes to one JSON line (with `\n`).

use serde_json::{Map, Value, json};

use crate::model::{CanUseTool, Question, QuestionOption};

/// Content of a user message.
#[derive(Debug, Clone, PartialEq)]
pub enum UserContent {
    Text(String),
    /// Anthropic content blocks (text, image, ...), passed through.
    Blocks(Vec<Value>),
}

/// How the CLI is to take a user message: the fields the Agent SDKs set on a streamed
/// user message besides its content. The default writes none of them (the CLI's own
/// default: the message runs after the turn under way and the messages queued before it,
/// as typed).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Delivery {
    /// `priority`; `None` writes none (the CLI's default, `next`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    /// `client_composed: true`: the text is delivered as written, with no `@path`
    /// expansion and no slash-command dispatch.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub verbatim: bool,
    /// `shouldQuery: false`: the message joins the conversation without starting a turn;
    /// the next turn's request carries it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub context_only: bool,
    /// `pasted_content`: text the user pasted rather than typed, one entry per paste; the
    /// CLI appends each after the typed text, marked as pasted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pasted: Vec<String>,
}

impl Delivery {
    /// No field set: the message is written as before these fields existed.
    pub fn is_plain(&self) -> bool {
        *self == Delivery::default()
    }
}

/// A user message's `priority`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// `now`: the turn under way is stopped and this message runs at once.
    Now,
    /// `next`: after the turn under way, ahead of messages queued `later`.
    Next,
    /// `later`: after every message queued `next`.
    Later,
}

impl Priority {
    /// The wire value.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Now => "now",
            Priority::Next => "next",
            Priority::Later => "later",
        }
    }
}

/// Our answer to a `control_request` from the CLI.
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseBody {
    /// `{"behavior":"allow","updatedInput":...}`; `updated_input` is always sent (the
    /// original input when not edited).
    Allow {
        updated_input: Value,
        updated_permissions: Option<Value>,
    },
    /// `{"behavior":"deny","message":...}`; the message is always present.
    Deny { message: String, interrupt: bool },
    /// A generic success payload (e.g. a hook callback answer).
    Success(Value),
    /// `subtype: error`.
    Error { message: String },
}

/// Control requests we send.
#[derive(Debug, Clone, PartialEq)]
pub enum OutRequest {
    /// Fields passed through (hooks, systemPrompt, ...).
    Initialize(serde_json::Map<String, Value>),
    Interrupt,
    /// `None` resets to the default model.
    SetModel(Option<String>),
    SetPermissionMode(String),
    SetMaxThinkingTokens(Option<u32>),
    McpStatus,
    /// Any other subtype, with its fields.
    Other {
        subtype: String,
        fields: serde_json::Map<String, Value>,
    },
}

impl OutRequest {
    fn other(subtype: &str, fields: Value) -> Self {
        OutRequest::Other {
            subtype: subtype.to_string(),
            fields: match fields {
                Value::Object(m) => m,
                _ => Map::new(),
            },
        }
    }

    /// `interrupt` with `cancel_queued: true`: also drop the user messages the CLI has
    /// queued behind the running turn (releases announcing `interrupt_cancel_queued_v1`;
    /// older ones ignore the field). The answer lists the cancelled uuids (`cancelled`).
    pub fn interrupt_cancel_queued() -> Self {
        Self::other("interrupt", json!({"cancel_queued": true}))
    }

    /// `get_context_usage`: the context window's use by category; `summary` asks for
    /// `detail: "summary"` (no token-count calls; 2.1.332).
    pub fn get_context_usage(summary: bool) -> Self {
        if summary {
            Self::other("get_context_usage", json!({"detail": "summary"}))
        } else {
            Self::other("get_context_usage", json!({}))
        }
    }

    /// `mcp_set_servers`: replaces the session's dynamically added MCP servers with
    /// `servers` (name -> config: `{"type":"stdio","command":..,"args":..,"env":..}`,
    /// `{"type":"http"|"sse","url":..,"headers":..}`).
    pub fn mcp_set_servers(servers: Map<String, Value>) -> Self {
        Self::other("mcp_set_servers", json!({ "servers": servers }))
    }

    /// `mcp_toggle`: enable or disable one MCP server by name.
    pub fn mcp_toggle(server_name: &str, enabled: bool) -> Self {
        Self::other(
            "mcp_toggle",
            json!({"serverName": server_name, "enabled": enabled}),
        )
    }

    /// `mcp_reconnect`: reconnect one MCP server by name.
    pub fn mcp_reconnect(server_name: &str) -> Self {
        Self::other("mcp_reconnect", json!({ "serverName": server_name }))
    }

    /// `rewind_files`: restore the files the session changed (Write/Edit/NotebookEdit) to
    /// their state at the user message `user_message_id` (its `uuid`); `dry_run` only
    /// reports what would change. Needs file checkpointing
    /// (`CLAUDE_CODE_ENABLE_SDK_FILE_CHECKPOINTING`).
    pub fn rewind_files(user_message_id: &str, dry_run: bool) -> Self {
        let mut f = json!({ "user_message_id": user_message_id });
        if dry_run {
            f["dry_run"] = true.into();
        }
        Self::other("rewind_files", f)
    }

    /// `stop_task`: stop a background task (its id from the task events).
    pub fn stop_task(task_id: &str) -> Self {
        Self::other("stop_task", json!({ "task_id": task_id }))
    }

    /// The model the request switches the session to (`Some(None)`: back to the default),
    /// or `None` when it switches none: `set_model`, and `apply_flag_settings` whose
    /// `settings` set `model` (a string, or null for the default). The CLI answers a
    /// switch only after the session's PreModelSwitch hooks returned (measured on
    /// 2.1.332); the other control requests measured there call no hook before their
    /// answer (`set_permission_mode`, `set_max_thinking_tokens`, `mcp_set_servers`,
    /// `rename_session`, `reload_plugins`, `rewind_files`, `interrupt`, ...).
    pub fn model_switch(&self) -> Option<Option<&str>> {
        match self {
            OutRequest::SetModel(m) => Some(m.as_deref()),
            OutRequest::Other { subtype, fields } if subtype == "apply_flag_settings" => fields
                .get("settings")
                .and_then(Value::as_object)
                .and_then(|s| s.get("model"))
                .and_then(|m| match m {
                    Value::String(m) => Some(Some(m.as_str())),
                    Value::Null => Some(None),
                    _ => None,
                }),
            _ => None,
        }
    }
}

/// The `initialize` request sent at spawn, before the first user message (as the Agent
/// SDKs do). Every field is optional; an empty request still makes the CLI answer with
/// its commands, models, account and output styles.
///
/// This is where the options that belong to `initialize` go: issue 11 registers hooks
/// (`hooks`: event -> matchers with `hookCallbackIds`, answered through `hook_callback`)
/// and SDK MCP servers (`sdkMcpServers`: names whose JSON-RPC goes through
/// `mcp_message`) here.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InitializeRequest {
    /// `hooks`: `{ "PreToolUse": [{ "matcher": .., "hookCallbackIds": [..] }], .. }`.
    pub hooks: Option<Map<String, Value>>,
    /// `sdkMcpServers`: names of MCP servers served over the control channel.
    pub sdk_mcp_servers: Vec<String>,
    /// `agents`: custom sub-agent definitions, by name.
    pub agents: Option<Map<String, Value>>,
    /// `systemPrompt` / `appendSystemPrompt` (for releases that take them here).
    pub system_prompt: Option<String>,
    pub append_system_prompt: Option<String>,
    /// `jsonSchema`: structured output.
    pub json_schema: Option<Value>,
    /// `promptSuggestions`: after each turn (not the first) the CLI writes a
    /// `prompt_suggestion`, the model's guess at the user's next prompt.
    pub prompt_suggestions: bool,
    /// `skills`: `"all"` or a list of skill names; only those are listed to the model.
    pub skills: Option<Value>,
    /// `planModeInstructions`: replaces the planning workflow of the plan-mode reminder.
    pub plan_mode_instructions: Option<String>,
    /// `toolAliases`: tool name the model may use -> the tool that runs.
    pub tool_aliases: Option<Map<String, Value>>,
    /// `excludeDynamicSections`: the per-session sections (working directory,
    /// environment, memory, ...) go in the first user message, not the system prompt, so
    /// the system prompt is the same across sessions.
    pub exclude_dynamic_sections: bool,
    /// `forwardSubagentText`: a foreground sub-agent's text and thinking are written too
    /// (with `parent_tool_use_id`), not only its tool calls and results.
    pub forward_subagent_text: bool,
    /// `perTaskStopAffordance`: the client stops background tasks one at a time
    /// (`stop_task`), so an interrupt stops only the turn and spares them.
    pub per_task_stop_affordance: bool,
    /// `agentProgressSummaries`: a running sub-agent's conversation is summed up every
    /// ~30 s in a short line, sent as `task_progress`'s `summary`.
    pub agent_progress_summaries: bool,
    /// `supportedDialogKinds`: the dialogs (`request_user_dialog`) the host can show; the
    /// CLI asks only these. Empty: not sent.
    pub dialog_kinds: Vec<String>,
    /// `title`: the session's name (the CLI records it as its transcript's `custom-title`
    /// and writes `system/session_title_changed`). `None`: not sent.
    pub title: Option<String>,
}

impl InitializeRequest {
    /// The control request (only the fields that are set).
    pub fn into_request(self) -> OutRequest {
        let mut f = Map::new();
        if let Some(h) = self.hooks {
            f.insert("hooks".into(), Value::Object(h));
        }
        if !self.sdk_mcp_servers.is_empty() {
            f.insert("sdkMcpServers".into(), json!(self.sdk_mcp_servers));
        }
        if let Some(a) = self.agents {
            f.insert("agents".into(), Value::Object(a));
        }
        if let Some(p) = self.system_prompt {
            f.insert("systemPrompt".into(), p.into());
        }
        if let Some(p) = self.append_system_prompt {
            f.insert("appendSystemPrompt".into(), p.into());
        }
        if let Some(s) = self.json_schema {
            f.insert("jsonSchema".into(), s);
        }
        if self.prompt_suggestions {
            f.insert("promptSuggestions".into(), true.into());
        }
        if let Some(s) = self.skills {
            f.insert("skills".into(), s);
        }
        if let Some(p) = self.plan_mode_instructions {
            f.insert("planModeInstructions".into(), p.into());
        }
        if let Some(a) = self.tool_aliases {
            f.insert("toolAliases".into(), Value::Object(a));
        }
        if self.exclude_dynamic_sections {
            f.insert("excludeDynamicSections".into(), true.into());
        }
        if self.forward_subagent_text {
            f.insert("forwardSubagentText".into(), true.into());
        }
        if self.per_task_stop_affordance {
            f.insert("perTaskStopAffordance".into(), true.into());
        }
        if self.agent_progress_summaries {
            f.insert("agentProgressSummaries".into(), true.into());
        }
        if !self.dialog_kinds.is_empty() {
            f.insert("supportedDialogKinds".into(), self.dialog_kinds.into());
        }
        if let Some(t) = self.title {
            f.insert("title".into(), t.into());
        }
        OutRequest::Initialize(f)
    }
}

/// One message to the CLI.
#[derive(Debug, Clone, PartialEq)]
pub enum Outbound {
    User {
        content: UserContent,
        parent_tool_use_id: Option<String>,
        session_id: String,
        /// The message's uuid, chosen by ostler (sent as `uuid`; omitted when `None`). The
        /// CLI keeps it as the message's id: `rewind_files` names a user message by it.
        uuid: Option<String>,
        /// How the CLI is to take it.
        delivery: Delivery,
    },
    ControlResponse {
        request_id: String,
        body: ResponseBody,
    },
    ControlRequest {
        request_id: String,
        request: OutRequest,
    },
    ControlCancel {
        request_id: String,
    },
    KeepAlive,
}

impl Outbound {
    /// The NDJSON line, terminated by `\n`.
    pub fn to_line(&self) -> Vec<u8> {
        let mut line = self.to_value().to_string().into_bytes();
        line.push(b'\n');
        line
    }

    /// The message as a JSON value (what [`Outbound::to_line`] serializes).
    pub fn to_value(&self) -> Value {
        match self {
            Outbound::User {
                content,
                parent_tool_use_id,
                session_id,
                uuid,
                delivery,
            } => {
                let content = match content {
                    UserContent::Text(t) => Value::String(t.clone()),
                    UserContent::Blocks(b) => Value::Array(b.clone()),
                };
                let mut v = json!({
                    "type": "user",
                    "message": {"role": "user", "content": content},
                    "parent_tool_use_id": parent_tool_use_id,
                    "session_id": session_id,
                });
                if let Value::Object(m) = &mut v {
                    if let Some(id) = uuid {
                        m.insert("uuid".into(), id.clone().into());
                    }
                    if let Some(p) = delivery.priority {
                        m.insert("priority".into(), p.as_str().into());
                    }
                    if delivery.verbatim {
                        m.insert("client_composed".into(), true.into());
                    }
                    if delivery.context_only {
                        m.insert("shouldQuery".into(), false.into());
                    }
                    if !delivery.pasted.is_empty() {
                        m.insert("pasted_content".into(), json!(delivery.pasted));
                    }
                }
                v
            }
            Outbound::ControlResponse { request_id, body } => {
                let response = match body {
                    ResponseBody::Allow {
                        updated_input,
                        updated_permissions,
                    } => {
                        let mut r = Map::new();
                        r.insert("behavior".into(), "allow".into());
                        r.insert("updatedInput".into(), updated_input.clone());
                        if let Some(p) = updated_permissions {
                            r.insert("updatedPermissions".into(), p.clone());
                        }
                        success(request_id, Value::Object(r))
                    }
                    ResponseBody::Deny { message, interrupt } => {
                        let mut r = Map::new();
                        r.insert("behavior".into(), "deny".into());
                        r.insert("message".into(), message.clone().into());
                        if *interrupt {
                            r.insert("interrupt".into(), true.into());
                        }
                        success(request_id, Value::Object(r))
                    }
                    ResponseBody::Success(v) => success(request_id, v.clone()),
                    ResponseBody::Error { message } => json!({
                        "subtype": "error",
                        "request_id": request_id,
                        "error": message,
                    }),
                };
                json!({"type": "control_response", "response": response})
            }
            Outbound::ControlRequest {
                request_id,
                request,
            } => {
                let mut r = Map::new();
                match request {
                    OutRequest::Initialize(fields) => {
                        r.insert("subtype".into(), "initialize".into());
                        extend(&mut r, fields);
                    }
                    OutRequest::Interrupt => {
                        r.insert("subtype".into(), "interrupt".into());
                    }
                    OutRequest::SetModel(model) => {
                        r.insert("subtype".into(), "set_model".into());
                        let model = model.clone().unwrap_or_else(|| "default".to_string());
                        r.insert("model".into(), model.into());
                    }
                    OutRequest::SetPermissionMode(mode) => {
                        r.insert("subtype".into(), "set_permission_mode".into());
                        r.insert("mode".into(), mode.clone().into());
                    }
                    OutRequest::SetMaxThinkingTokens(n) => {
                        r.insert("subtype".into(), "set_max_thinking_tokens".into());
                        r.insert("max_thinking_tokens".into(), json!(n));
                    }
                    OutRequest::McpStatus => {
                        r.insert("subtype".into(), "mcp_status".into());
                    }
                    OutRequest::Other { subtype, fields } => {
                        r.insert("subtype".into(), subtype.clone().into());
                        extend(&mut r, fields);
                    }
                }
                json!({"type": "control_request", "request_id": request_id, "request": r})
            }
            Outbound::ControlCancel { request_id } => {
                json!({"type": "control_cancel_request", "request_id": request_id})
            }
            Outbound::KeepAlive => json!({"type": "keep_alive"}),
        }
    }

    /// A plain-text user message (a new turn) for the main session.
    pub fn user_text(text: impl Into<String>, session_id: impl Into<String>) -> Self {
        Outbound::User {
            content: UserContent::Text(text.into()),
            parent_tool_use_id: None,
            session_id: session_id.into(),
            uuid: None,
            delivery: Delivery::default(),
        }
    }

    /// Allow a `can_use_tool` request, passing its input through unchanged.
    pub fn allow(request_id: impl Into<String>, request: &CanUseTool) -> Self {
        Outbound::ControlResponse {
            request_id: request_id.into(),
            body: ResponseBody::Allow {
                updated_input: request.input.clone(),
                updated_permissions: None,
            },
        }
    }

    /// Deny a `can_use_tool` request (the message is always sent; an empty one is replaced
    /// by a generic text because recent releases reject a deny without message).
    pub fn deny(
        request_id: impl Into<String>,
        message: impl Into<String>,
        interrupt: bool,
    ) -> Self {
        let mut message = message.into();
        if message.trim().is_empty() {
            message = "Permission denied.".to_string();
        }
        Outbound::ControlResponse {
            request_id: request_id.into(),
            body: ResponseBody::Deny { message, interrupt },
        }
    }

    /// Answer an AskUserQuestion `can_use_tool` request with the chosen labels.
    pub fn answer(
        request_id: impl Into<String>,
        request: &CanUseTool,
        answers: &[(String, Vec<String>)],
    ) -> Self {
        Outbound::ControlResponse {
            request_id: request_id.into(),
            body: ResponseBody::Allow {
                updated_input: answer_questions(request, answers),
                updated_permissions: None,
            },
        }
    }
}

fn success(request_id: &str, response: Value) -> Value {
    json!({"subtype": "success", "request_id": request_id, "response": response})
}

fn extend(r: &mut Map<String, Value>, fields: &Map<String, Value>) {
    for (k, v) in fields {
        if k != "subtype" {
            r.insert(k.clone(), v.clone());
        }
    }
}

/// Separator for the labels of a multi-select answer.
pub const MULTI_SELECT_SEPARATOR: &str = ", ";

/// The `updatedInput` answering an AskUserQuestion call: the original input plus an
/// `answers` map (question text -> chosen label(s), multi-select joined as the CLI expects).
/// A question left unanswered (an optional one) is absent from `answers`, as the CLI's own
/// form sends it.
pub fn answer_questions(request: &CanUseTool, answers: &[(String, Vec<String>)]) -> Value {
    answer_questions_skipping(request, answers, &[])
}

/// [`answer_questions`] that also marks `skipped` questions (left unanswered)
/// `annotations[question].unanswered = "skipped"`: only for a CLI that announces the
/// capability `ask_user_question_unanswered_v1` (an older CLI refuses the whole answer).
/// The model does not see the mark; the tool result lists only the answered questions.
pub fn answer_questions_skipping(
    request: &CanUseTool,
    answers: &[(String, Vec<String>)],
    skipped: &[String],
) -> Value {
    let mut input = match &request.input {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    let mut map = match input.remove("answers") {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    for (question, labels) in answers {
        map.insert(
            question.clone(),
            Value::String(labels.join(MULTI_SELECT_SEPARATOR)),
        );
    }
    input.insert("answers".into(), Value::Object(map));
    if !skipped.is_empty() {
        let mut notes = match input.remove("annotations") {
            Some(Value::Object(m)) => m,
            _ => Map::new(),
        };
        for q in skipped {
            let entry = notes
                .entry(q.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(e) = entry {
                e.insert("unanswered".into(), Value::String("skipped".into()));
            }
        }
        input.insert("annotations".into(), Value::Object(notes));
    }
    Value::Object(input)
}

/// The capability a CLI announces when an AskUserQuestion answer may mark a question
/// `annotations[question].unanswered`.
pub const ASK_USER_QUESTION_UNANSWERED: &str = "ask_user_question_unanswered_v1";

pub(crate) fn parse_questions(req: &CanUseTool) -> Option<Vec<Question>> {
    if req.tool_name != "AskUserQuestion" {
        return None;
    }
    let items = req.input.get("questions")?.as_array()?;
    // The CLI's own test for an extended form (its answer admission): a non-empty list
    // whose every entry is an object with a string `kind`.
    let form = !items.is_empty()
        && items
            .iter()
            .all(|q| q.get("kind").is_some_and(Value::is_string));
    Some(
        items
            .iter()
            .filter_map(|q| {
                let question = q.get("question")?.as_str()?.to_string();
                let header = q.get("header").and_then(Value::as_str).map(str::to_string);
                let multi_select = q
                    .get("multiSelect")
                    .or_else(|| q.get("multi_select"))
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                let options = q
                    .get("options")
                    .and_then(Value::as_array)
                    .map(|opts| {
                        opts.iter()
                            .filter_map(|o| match o {
                                Value::String(s) => Some(QuestionOption {
                                    label: s.clone(),
                                    ..Default::default()
                                }),
                                Value::Object(m) => Some(QuestionOption {
                                    label: m.get("label")?.as_str()?.to_string(),
                                    description: m
                                        .get("description")
                                        .and_then(Value::as_str)
                                        .map(str::to_string),
                                    preview: m
                                        .get("preview")
                                        .and_then(Value::as_str)
                                        .map(str::to_string),
                                }),
                                _ => None,
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let text = |k: &str| q.get(k).and_then(Value::as_str).map(str::to_string);
                let number = |k: &str| q.get(k).and_then(Value::as_f64);
                Some(Question {
                    question,
                    header,
                    options,
                    multi_select,
                    kind: text("kind"),
                    description: text("description"),
                    placeholder: text("placeholder"),
                    min: number("min"),
                    max: number("max"),
                    step: number("step"),
                    default_value: number("defaultValue"),
                    unit: text("unit"),
                    optional: form,
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_switches_are_known_by_their_fields() {
        let settings = |settings: serde_json::Value| OutRequest::Other {
            subtype: "apply_flag_settings".into(),
            fields: serde_json::json!({ "settings": settings })
                .as_object()
                .cloned()
                .unwrap_or_default(),
        };
        assert_eq!(OutRequest::SetModel(None).model_switch(), Some(None));
        assert_eq!(
            OutRequest::SetModel(Some("m".into())).model_switch(),
            Some(Some("m"))
        );
        assert_eq!(
            settings(serde_json::json!({"model": "m"})).model_switch(),
            Some(Some("m"))
        );
        assert_eq!(
            settings(serde_json::json!({"model": null})).model_switch(),
            Some(None)
        );
        let rules = serde_json::json!({"permissions": {"allow": ["Read"]}});
        assert_eq!(settings(rules).model_switch(), None);
        assert_eq!(
            settings(serde_json::json!({"model": 7})).model_switch(),
            None
        );
        assert_eq!(
            OutRequest::SetPermissionMode("plan".into()).model_switch(),
            None
        );
        assert_eq!(OutRequest::stop_task("t").model_switch(), None);
    }

    fn request(r: OutRequest) -> Value {
        Outbound::ControlRequest {
            request_id: "r".into(),
            request: r,
        }
        .to_value()["request"]
            .clone()
    }

    /// The field names are the ones the Agent SDKs send (the CLI ignores unknown ones).
    #[test]
    fn control_request_builders_use_the_sdks_field_names() {
        assert_eq!(
            request(OutRequest::mcp_toggle("tickets", false)),
            json!({"subtype": "mcp_toggle", "serverName": "tickets", "enabled": false})
        );
        assert_eq!(
            request(OutRequest::mcp_reconnect("tickets")),
            json!({"subtype": "mcp_reconnect", "serverName": "tickets"})
        );
        assert_eq!(
            request(OutRequest::rewind_files("u-1", false)),
            json!({"subtype": "rewind_files", "user_message_id": "u-1"})
        );
        assert_eq!(
            request(OutRequest::rewind_files("u-1", true))["dry_run"],
            json!(true)
        );
        assert_eq!(
            request(OutRequest::stop_task("t-9")),
            json!({"subtype": "stop_task", "task_id": "t-9"})
        );
        assert_eq!(
            request(OutRequest::interrupt_cancel_queued()),
            json!({"subtype": "interrupt", "cancel_queued": true})
        );
        let mut servers = Map::new();
        servers.insert("t".into(), json!({"type": "stdio", "command": "x"}));
        assert_eq!(
            request(OutRequest::mcp_set_servers(servers)),
            json!({"subtype": "mcp_set_servers", "servers": {"t": {"type": "stdio", "command": "x"}}})
        );
        assert_eq!(
            request(OutRequest::get_context_usage(false)),
            json!({"subtype": "get_context_usage"})
        );
        assert_eq!(
            request(OutRequest::get_context_usage(true)),
            json!({"subtype": "get_context_usage", "detail": "summary"})
        );
    }

    #[test]
    fn initialize_sends_only_what_is_set() {
        assert_eq!(
            request(InitializeRequest::default().into_request()),
            json!({"subtype": "initialize"})
        );
        let full = InitializeRequest {
            sdk_mcp_servers: vec!["inproc".into()],
            append_system_prompt: Some("be brief".into()),
            ..Default::default()
        };
        assert_eq!(
            request(full.into_request()),
            json!({"subtype": "initialize", "sdkMcpServers": ["inproc"], "appendSystemPrompt": "be brief"})
        );
        let fields = InitializeRequest {
            skills: Some(json!(["pdf"])),
            plan_mode_instructions: Some("Plan in steps.".into()),
            tool_aliases: Some(Map::from_iter([(
                "Bash".to_string(),
                json!("mcp__box__bash"),
            )])),
            exclude_dynamic_sections: true,
            forward_subagent_text: true,
            per_task_stop_affordance: true,
            agent_progress_summaries: true,
            dialog_kinds: vec!["refusal_fallback_prompt".into()],
            title: Some("release notes".into()),
            ..Default::default()
        };
        assert_eq!(
            request(fields.into_request()),
            json!({"subtype": "initialize", "skills": ["pdf"], "planModeInstructions": "Plan in steps.",
                   "toolAliases": {"Bash": "mcp__box__bash"}, "excludeDynamicSections": true,
                   "forwardSubagentText": true, "perTaskStopAffordance": true,
                   "agentProgressSummaries": true,
                   "supportedDialogKinds": ["refusal_fallback_prompt"],
                   "title": "release notes"})
        );
    }

    #[test]
    fn a_user_message_carries_its_uuid_when_given() {
        let mut m = Outbound::user_text("hi", "s");
        assert!(m.to_value().get("uuid").is_none());
        if let Outbound::User { uuid, .. } = &mut m {
            *uuid = Some("0b9d4a6e-1c2f-4a57-9a43-6f5e0d1c2b3a".into());
        }
        assert_eq!(m.to_value()["uuid"], "0b9d4a6e-1c2f-4a57-9a43-6f5e0d1c2b3a");
    }

    #[test]
    fn delivery_writes_only_what_is_set() {
        let mut m = Outbound::user_text("hi", "");
        let plain = m.to_value();
        for key in [
            "priority",
            "client_composed",
            "shouldQuery",
            "pasted_content",
        ] {
            assert!(plain.get(key).is_none(), "{key} written by default");
        }
        if let Outbound::User { delivery, .. } = &mut m {
            *delivery = Delivery {
                priority: Some(Priority::Later),
                verbatim: true,
                context_only: true,
                pasted: vec!["a log".into(), "a diff".into()],
            };
        }
        let v = m.to_value();
        assert_eq!(v["priority"], "later");
        assert_eq!(v["client_composed"], true);
        assert_eq!(v["shouldQuery"], false);
        assert_eq!(v["pasted_content"], serde_json::json!(["a log", "a diff"]));
        assert_eq!(v["message"]["content"], "hi");
    }
}
