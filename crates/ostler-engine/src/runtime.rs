//! What a session runs with, as the CLI reported it: the answer to `initialize` (recorded
//! as the `engine_notice` `session_initialized`, raw JSON kept whole in `data`), the last
//! `system/init`, and the notices recorded for the control requests that change a session.
//! Read back by `Engine::session_details` (`GetSessionInfo`).

use ostler_protocol::outbound::OutRequest;
use serde_json::Value;

use ostler_protocol::model::SessionStarted;

/// The `engine_notice` code of the CLI's answer to `initialize` (answer whole in `data`).
pub const SESSION_INITIALIZED: &str = "session_initialized";
/// The `engine_notice` code recorded when `initialize` got an error or no answer.
pub const INITIALIZE_FAILED: &str = "initialize_failed";

/// A short summary of an `initialize` answer for the notice's message.
pub(crate) fn initialize_summary(answer: Option<&Value>) -> String {
    let Some(a) = answer else {
        return "no payload".into();
    };
    let count = |k: &str| a.get(k).and_then(Value::as_array).map_or(0, Vec::len);
    format!(
        "{} commands, {} models, {} agents",
        count("commands"),
        count("models"),
        count("agents")
    )
}

/// The notice code of a control request that changed the session.
pub(crate) fn control_notice_code(subtype: &str) -> &'static str {
    match subtype {
        "interrupt" => "interrupted",
        "mcp_set_servers" => "mcp_servers_set",
        "mcp_toggle" => "mcp_server_toggled",
        "mcp_reconnect" => "mcp_server_reconnected",
        "rewind_files" => "files_rewound",
        "stop_task" => "task_stopped",
        _ => "control",
    }
}

/// A refusal the CLI sent as a success answer: 2.0.x to 2.1.0 answer a `rewind_files` they
/// cannot do (checkpointing off) with success carrying `error`, where 2.1.332 sends an
/// error response. Either is a refusal, and nothing is recorded as done.
pub(crate) fn refusal_in_answer(
    request: &OutRequest,
    answer: Option<&ostler_protocol::model::RawJson>,
) -> Option<String> {
    let OutRequest::Other { subtype, .. } = request else {
        return None;
    };
    if subtype != "rewind_files" {
        return None;
    }
    let v = answer?.to_value().ok()?;
    v["error"]
        .as_str()
        .filter(|e| !e.trim().is_empty())
        .map(str::to_owned)
}

/// What the notice of a control request keeps: the request's fields and the CLI's answer.
pub(crate) fn control_notice_data(
    request: &OutRequest,
    answer: Option<&ostler_protocol::model::RawJson>,
) -> Option<Value> {
    let fields = match request {
        OutRequest::Other { fields, .. } => Value::Object(fields.clone()),
        OutRequest::SetMaxThinkingTokens(n) => serde_json::json!({ "max_thinking_tokens": n }),
        _ => Value::Null,
    };
    let answer = answer.and_then(|a| a.to_value().ok());
    if fields.is_null() && answer.is_none() {
        return None;
    }
    Some(serde_json::json!({ "request": fields, "answer": answer }))
}

/// One slash command the CLI offers (`initialize` answer `commands`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlashCommand {
    pub name: String,
    pub description: String,
    pub argument_hint: String,
}

/// One model the CLI offers (`initialize` answer `models`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelChoice {
    pub value: String,
    pub display_name: String,
    pub description: String,
}

/// The account the CLI runs as (`initialize` answer `account`; fields it did not send are
/// empty).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Account {
    pub email: String,
    pub organization: String,
    pub subscription_type: String,
    pub api_key_source: String,
}

/// The CLI's answer to `initialize`: the stable fields typed, the answer whole in `raw`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Initialized {
    pub commands: Vec<SlashCommand>,
    pub models: Vec<ModelChoice>,
    pub account: Account,
    pub output_style: String,
    pub available_output_styles: Vec<String>,
    /// Agent names (`agents`: a list of names or of objects with `name`).
    pub agents: Vec<String>,
    /// The answer as the CLI sent it.
    pub raw: Value,
}

fn s(v: &Value, k: &str) -> String {
    v.get(k)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

impl Initialized {
    /// Reads an `initialize` answer; unknown or missing fields are left empty (never fails).
    pub fn from_answer(raw: Value) -> Self {
        let list = |k: &str| {
            raw.get(k)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default()
        };
        let commands = list("commands")
            .iter()
            .map(|c| SlashCommand {
                name: s(c, "name"),
                description: s(c, "description"),
                argument_hint: s(c, "argumentHint"),
            })
            .collect();
        let models = list("models")
            .iter()
            .map(|m| ModelChoice {
                value: s(m, "value"),
                display_name: s(m, "displayName"),
                description: s(m, "description"),
            })
            .collect();
        let acc = raw.get("account").cloned().unwrap_or(Value::Null);
        let account = Account {
            email: s(&acc, "email"),
            organization: s(&acc, "organization"),
            subscription_type: s(&acc, "subscriptionType"),
            api_key_source: s(&acc, "apiKeySource"),
        };
        let available_output_styles = list("available_output_styles")
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        let agents = list("agents")
            .iter()
            .filter_map(|a| match a {
                Value::String(n) => Some(n.clone()),
                other => other.get("name").and_then(Value::as_str).map(str::to_owned),
            })
            .collect();
        Initialized {
            commands,
            models,
            account,
            output_style: s(&raw, "output_style"),
            available_output_styles,
            agents,
            raw,
        }
    }
}

/// `GetSessionInfo`: what the session runs with.
#[derive(Debug, Clone, Default)]
pub struct SessionDetails {
    pub session_id: String,
    /// The CLI release of the session's process (the daemon's installation).
    pub cli_version: String,
    /// Whether a CLI process runs the session now.
    pub live: bool,
    /// The answer to the last `initialize` (`None`: not answered, or the release does not
    /// answer it).
    pub initialized: Option<Initialized>,
    /// Why the last `initialize` failed, when it did.
    pub initialize_error: Option<String>,
    /// The last `system/init` (tools, MCP servers with their status, model, permission
    /// mode, CLI version); `None` before the first turn of the first process.
    pub init: Option<SessionStarted>,
    /// The capabilities ostler detected for the release (`flag:...`, `control:...`,
    /// `option:...`, announced), as `GetHealthDetails` lists them.
    pub capabilities: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_initialize_answer_reads_into_typed_fields_and_stays_whole() {
        let raw = json!({
            "commands": [{"name": "compact", "description": "Compact", "argumentHint": "<x>"}],
            "models": [{"value": "sonnet", "displayName": "Sonnet", "description": "d"}],
            "account": {"email": "a@b.c", "apiKeySource": "ANTHROPIC_API_KEY"},
            "output_style": "default",
            "available_output_styles": ["default", "Explanatory"],
            "agents": [{"name": "reviewer"}, "planner"],
            "future_field": 1
        });
        let i = Initialized::from_answer(raw.clone());
        assert_eq!(i.commands[0].argument_hint, "<x>");
        assert_eq!(i.models[0].display_name, "Sonnet");
        assert_eq!(i.account.api_key_source, "ANTHROPIC_API_KEY");
        assert_eq!(i.available_output_styles.len(), 2);
        assert_eq!(
            i.agents,
            vec!["reviewer".to_string(), "planner".to_string()]
        );
        assert_eq!(i.raw, raw);
        // Anything else: empty, never an error.
        assert_eq!(Initialized::from_answer(json!([1])).commands, vec![]);
        assert_eq!(
            initialize_summary(Some(&raw)),
            "1 commands, 1 models, 2 agents"
        );
    }

    #[test]
    fn control_notices_keep_request_and_answer() {
        let d = control_notice_data(&OutRequest::stop_task("t1"), None).unwrap();
        assert_eq!(d["request"]["task_id"], "t1");
        assert!(control_notice_data(&OutRequest::Interrupt, None).is_none());
        assert_eq!(control_notice_code("rewind_files"), "files_rewound");
        // A rewind answered with success carrying `error` (2.0.x to 2.1.0) is a refusal.
        let rewind = OutRequest::rewind_files("u1", false);
        let answer = |s: &str| ostler_protocol::model::RawJson::from_string(s.into()).ok();
        assert_eq!(
            refusal_in_answer(
                &rewind,
                answer(r#"{"error":"File rewinding is not enabled."}"#).as_ref()
            )
            .as_deref(),
            Some("File rewinding is not enabled.")
        );
        assert_eq!(
            refusal_in_answer(&rewind, answer(r#"{"canRewind":true}"#).as_ref()),
            None
        );
        assert_eq!(
            refusal_in_answer(
                &OutRequest::stop_task("t"),
                answer(r#"{"error":"x"}"#).as_ref()
            ),
            None
        );
    }
}
