//! What a session runs with, as the CLI reported it: the answer to `initialize` (recorded
//! as the `engine_notice` `session_initialized`, raw JSON kept whole in `data`), the last
//! `system/init`, and the notices recorded for the control requests that change a session.
//! Read back by `Engine::session_details` (`GetSessionInfo`).

use ostler_protocol::outbound::OutRequest;
use serde_json::{Map, Value};

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
        "apply_flag_settings" => FLAG_SETTINGS_APPLIED,
        "set_mcp_permission_mode_override" => MCP_MODE_OVERRIDE_SET,
        "set_peer_delivery" => PEER_DELIVERY_SET,
        "decide_held_peer_message" => HELD_PEER_MESSAGE_DECIDED,
        _ => "control",
    }
}

/// The `engine_notice` code of an `apply_flag_settings` the CLI accepted (`data.request`:
/// the request's fields, its `settings` whole; shown with `env`/`headers` values redacted).
pub const FLAG_SETTINGS_APPLIED: &str = "flag_settings_applied";
/// The `engine_notice` code of a `set_mcp_permission_mode_override` the CLI accepted.
pub const MCP_MODE_OVERRIDE_SET: &str = "mcp_permission_mode_override_set";
/// The `engine_notice` code of a `set_peer_delivery` the CLI accepted (`data`: `request`,
/// `answer` with the `always_deliver` choices in force).
pub const PEER_DELIVERY_SET: &str = "peer_delivery_set";
/// The `engine_notice` code of a `decide_held_peer_message` the CLI answered (`data`:
/// `request`, `answer` with the `outcome` and the `always_deliver` choices in force).
pub const HELD_PEER_MESSAGE_DECIDED: &str = "held_peer_message_decided";
/// The `engine_notice` code of a runtime control sent again after a respawn and accepted
/// (`data`: `subtype`, `request`, `answer`).
pub const CONTROL_RESTORED: &str = "control_restored";
/// The `engine_notice` code of a runtime control sent again after a respawn that the CLI
/// refused, did not answer, or that the release cannot take (`data`: `subtype`, `request`,
/// `error`): the process runs without it.
pub const CONTROL_RESTORE_FAILED: &str = "control_restore_failed";

/// The `engine_notice` code of a `rename_session` ostler sent so that the CLI's transcript
/// carries the title ostler holds (after an `UpdateSession` rename, or at a respawn whose
/// CLI announced another title), answered with success (`data`: `request`, `answer`).
pub const CLI_TITLE_SET: &str = "cli_title_set";
/// The `engine_notice` code of such a `rename_session` the CLI refused or did not answer
/// (`data`: `request`, `error`): ostler's title stands; the CLI's transcript keeps its own.
pub const CLI_TITLE_SET_FAILED: &str = "cli_title_set_failed";

/// The runtime controls passed through `SendControlRequest` that a respawn must not lose,
/// rebuilt from the session's log (the notices of the requests the CLI answered with
/// success) and sent again right after `initialize`, before any user message.
///
/// `apply_flag_settings`, measured on 2.1.332 (`get_settings` after each request):
/// successive requests shallow-merge top-level keys into the flag settings layer (a second
/// request with another key keeps the first; one with the same key replaces its whole value:
/// `env: {A}` then `env: {B}` leaves `env: {B}`); `null` removes the key from the layer (a
/// value the session's `--settings` gave shows again) and, for `effortLevel`, resets the
/// effort to the model's default (not to `--settings`'/`--effort`'s); a refused request
/// (a setting that would make the CLI drop the layer, `settings` not an object) applies
/// nothing. Requests written right after `initialize`, before its answer, are applied the
/// same. So replaying the accepted requests in order re-creates the layer exactly; earlier
/// requests whose keys are all set again later are dropped (the list stays as short as the
/// keys used), except where the order matters beyond the layer: per the Agent SDK's
/// documentation an `effortLevel` that moves the level without an `ultracode` key turns
/// ultracode off, so a request with `effortLevel` or `ultracode` is only dropped when a
/// later one sets both, or no request kept mentions `ultracode`. `model` is left out of
/// the replay: the model a request switched to is the session's model, given as `--model`
/// at every spawn (a later `SetModel` wins, as it did live).
///
/// `set_mcp_permission_mode_override` (`serverName`, `mode`: `default`, `auto`, or `null`
/// to clear; measured on 2.1.332: stored per server name, also for a server not connected
/// yet, with a `warning` in the answer): the last mode per server, cleared ones left out.
///
/// `reload_plugins` with `add_plugins` (plugins loaded mid-session, each "as one more
/// `--plugin-dir` would"; measured on 2.1.332: a new process has none of them): every path
/// added, in order, the last entry given for a path, sent again as one `reload_plugins`;
/// each path is checked again then (a directory inside `sessions.allowed_roots`), and one
/// that no longer is is left out, recorded as `control_restore_failed`.
///
/// `set_peer_delivery` (what the host knows about delivering messages from other sessions;
/// read in 2.1.332's code: every field it holds lives in the process, a field left out stays
/// as it is): `shows_held_messages` as last set, and the "always deliver" choices in force
/// as the CLI's last answer to a `set_peer_delivery` or `decide_held_peer_message` (with
/// `always`) reported them (`always_deliver`: `session` {`scope`, `made_in`, `session_id`}
/// or null, `account`), sent again as one `set_peer_delivery`; the answer to that is the
/// state from then on. The CLI applies a `session` choice only in the conversation it
/// names: a process that runs another conversation id (a fork) keeps none, which the
/// `control_restored` notice says, and it is not sent again.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct RuntimeSettings {
    /// The `settings` of the `apply_flag_settings` requests to replay, oldest first.
    pub flag_settings: Vec<Map<String, Value>>,
    /// Server name -> permission mode override.
    pub mcp_mode_overrides: std::collections::BTreeMap<String, Value>,
    /// The peer message delivery the host set.
    pub peer_delivery: PeerDelivery,
    /// The `add_plugins` entries of the `reload_plugins` the CLI accepted (one per path,
    /// the last one given), loaded again by one `reload_plugins`.
    pub plugins: Vec<Map<String, Value>>,
}

/// What `set_peer_delivery` and `decide_held_peer_message` set in a CLI process (see
/// [`RuntimeSettings`]).
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct PeerDelivery {
    /// `shows_held_messages`, the last value sent.
    pub shows_held_messages: Option<bool>,
    /// The choice to always deliver in one conversation: `scope`, `made_in`, `session_id`.
    pub session: Option<Map<String, Value>>,
    /// The choice to always deliver messages from the person's own sessions.
    pub account: bool,
}

impl PeerDelivery {
    /// Takes in an accepted request and the CLI's answer to it.
    fn record(&mut self, subtype: &str, request: &Map<String, Value>, answer: Option<&Value>) {
        if subtype == "set_peer_delivery"
            && let Some(shows) = request.get("shows_held_messages").and_then(Value::as_bool)
        {
            self.shows_held_messages = Some(shows);
        }
        // The state the CLI reports is the truth; without it (a release that answers
        // otherwise), what a `set_peer_delivery` asked for.
        let (session, account) = match answer.and_then(|a| a.get("always_deliver")) {
            Some(Value::Object(state)) => (state.get("session"), state.get("account")),
            _ if subtype == "set_peer_delivery" => (request.get("session"), request.get("account")),
            _ => (None, None),
        };
        match session {
            Some(Value::Object(choice)) => {
                let mut kept = choice.clone();
                // Reported, not set.
                kept.remove("paused");
                self.session = Some(kept);
            }
            Some(Value::Null) => self.session = None,
            _ => {}
        }
        if let Some(account) = account.and_then(Value::as_bool) {
            self.account = account;
        }
    }

    /// The `set_peer_delivery` that re-creates this in a new process, when anything is set.
    fn request(&self) -> Option<OutRequest> {
        let mut fields = Map::new();
        if let Some(shows) = self.shows_held_messages {
            fields.insert("shows_held_messages".into(), Value::Bool(shows));
        }
        if let Some(session) = &self.session {
            fields.insert("session".into(), Value::Object(session.clone()));
        }
        if self.account {
            fields.insert("account".into(), Value::Bool(true));
        }
        (!fields.is_empty()).then(|| OutRequest::Other {
            subtype: "set_peer_delivery".into(),
            fields,
        })
    }
}

impl RuntimeSettings {
    /// Takes in the notice of a control the CLI accepted, when it is one to restore.
    /// Builds before the dedicated codes recorded `apply_flag_settings`,
    /// `set_peer_delivery` and `decide_held_peer_message` as `control` with the message
    /// `<subtype> done`: read too.
    pub fn record(&mut self, code: &str, message: &str, data: Option<&Value>) {
        let Some(request) = data
            .and_then(|d| d.get("request"))
            .and_then(Value::as_object)
        else {
            return;
        };
        if code == FLAG_SETTINGS_APPLIED
            || (code == "control" && message == "apply_flag_settings done")
        {
            if let Some(settings) = request.get("settings").and_then(Value::as_object) {
                self.apply_flag_settings(settings.clone());
            }
        } else if code == "control" && message == "reload_plugins done" {
            let added = request.get("add_plugins").and_then(Value::as_array);
            for plugin in added.into_iter().flatten() {
                let Some(entry) = plugin.as_object() else {
                    continue;
                };
                let path = entry.get("path").and_then(Value::as_str);
                self.plugins
                    .retain(|p| p.get("path").and_then(Value::as_str) != path);
                self.plugins.push(entry.clone());
            }
        } else if let Some(subtype) = match (code, message) {
            (PEER_DELIVERY_SET, _) | ("control", "set_peer_delivery done") => {
                Some("set_peer_delivery")
            }
            (CONTROL_RESTORED, _)
                if data.and_then(|d| d.get("subtype")).and_then(Value::as_str)
                    == Some("set_peer_delivery") =>
            {
                Some("set_peer_delivery")
            }
            (HELD_PEER_MESSAGE_DECIDED, _) | ("control", "decide_held_peer_message done") => {
                Some("decide_held_peer_message")
            }
            _ => None,
        } {
            let answer = data.and_then(|d| d.get("answer"));
            self.peer_delivery.record(subtype, request, answer);
        } else if code == MCP_MODE_OVERRIDE_SET
            && let Some(server) = request.get("serverName").and_then(Value::as_str)
        {
            match request.get("mode") {
                None | Some(Value::Null) => {
                    self.mcp_mode_overrides.remove(server);
                }
                Some(mode) => {
                    self.mcp_mode_overrides
                        .insert(server.to_owned(), mode.clone());
                }
            }
        }
    }

    /// Adds an accepted `apply_flag_settings`' settings, dropping the earlier ones it makes
    /// redundant (see the type's documentation).
    pub fn apply_flag_settings(&mut self, settings: Map<String, Value>) {
        const EFFORT: &str = "effortLevel";
        const ULTRACODE: &str = "ultracode";
        if settings.is_empty() {
            return;
        }
        self.flag_settings.push(settings);
        let any_ultracode = self.flag_settings.iter().any(|s| s.contains_key(ULTRACODE));
        let all = &self.flag_settings;
        let keep: Vec<bool> = all
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let later = &all[i + 1..];
                let overridden =
                    !later.is_empty() && e.keys().all(|k| later.iter().any(|l| l.contains_key(k)));
                let order_free = !(e.contains_key(EFFORT) || e.contains_key(ULTRACODE))
                    || later
                        .iter()
                        .any(|l| l.contains_key(EFFORT) && l.contains_key(ULTRACODE))
                    || !any_ultracode;
                !(overridden && order_free)
            })
            .collect();
        let mut it = keep.into_iter();
        self.flag_settings.retain(|_| it.next().unwrap_or(true));
    }

    /// The requests that re-create these settings in a new process, in order.
    pub fn requests(&self) -> Vec<OutRequest> {
        let mut out = Vec::new();
        for settings in &self.flag_settings {
            let mut settings = settings.clone();
            settings.remove("model");
            if settings.is_empty() {
                continue;
            }
            let mut fields = Map::new();
            fields.insert("settings".into(), Value::Object(settings));
            out.push(OutRequest::Other {
                subtype: "apply_flag_settings".into(),
                fields,
            });
        }
        for (server, mode) in &self.mcp_mode_overrides {
            let mut fields = Map::new();
            fields.insert("serverName".into(), Value::from(server.as_str()));
            fields.insert("mode".into(), mode.clone());
            out.push(OutRequest::Other {
                subtype: "set_mcp_permission_mode_override".into(),
                fields,
            });
        }
        out.extend(self.peer_delivery.request());
        if !self.plugins.is_empty() {
            let plugins = self.plugins.iter().cloned().map(Value::Object).collect();
            let mut fields = Map::new();
            fields.insert("add_plugins".into(), Value::Array(plugins));
            out.push(OutRequest::Other {
                subtype: "reload_plugins".into(),
                fields,
            });
        }
        out
    }
}

/// What a runtime control sent again after a respawn and answered with success did not
/// re-create: a `set_peer_delivery` whose conversation choice the new process did not keep
/// (it runs another conversation id).
pub(crate) fn restore_shortfall(
    request: &OutRequest,
    answer: Option<&ostler_protocol::model::RawJson>,
) -> Option<String> {
    let OutRequest::Other { subtype, fields } = request else {
        return None;
    };
    if subtype != "set_peer_delivery" {
        return None;
    }
    let asked = fields.get("session")?.get("session_id")?.as_str()?;
    let v = answer?.to_value().ok()?;
    match v.get("always_deliver").map(|d| d.get("session")) {
        Some(Some(Value::Null)) => Some(format!(
            "the choice to always deliver peer messages was made in conversation {asked}; the \
             CLI runs another and kept none"
        )),
        _ => None,
    }
}

/// The permission mode in effect after a `set_permission_mode` the CLI accepted: the one
/// its answer names (2.1.332's `claude -p` answers `{"mode": ...}`, which can differ from
/// the mode asked for; the Agent SDK 0.3.334: "record `mode`, not the argument"), else the
/// one asked for (releases that answer with no payload).
pub(crate) fn mode_in_effect(asked: &str, answer: Option<&Value>) -> String {
    answer
        .and_then(|v| v.get("mode").and_then(Value::as_str).map(str::to_owned))
        .filter(|m| !m.trim().is_empty() && m.len() <= 64)
        .unwrap_or_else(|| asked.to_owned())
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
    fn the_mode_in_effect_is_the_one_the_answer_names() {
        let answer = |s: &str| serde_json::from_str::<Value>(s).ok();
        assert_eq!(
            mode_in_effect("acceptEdits", answer(r#"{"mode":"default"}"#).as_ref()),
            "default"
        );
        assert_eq!(
            mode_in_effect("plan", answer(r#"{"mode":"plan"}"#).as_ref()),
            "plan"
        );
        // No payload, no mode, or not a mode: the one asked for.
        assert_eq!(mode_in_effect("plan", None), "plan");
        assert_eq!(mode_in_effect("plan", answer("{}").as_ref()), "plan");
        assert_eq!(
            mode_in_effect("plan", answer(r#"{"mode":7}"#).as_ref()),
            "plan"
        );
        assert_eq!(
            mode_in_effect("plan", answer(r#"{"mode":" "}"#).as_ref()),
            "plan"
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

#[cfg(test)]
mod runtime_settings_tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    fn settings_sent(r: &RuntimeSettings) -> Vec<Value> {
        r.requests()
            .into_iter()
            .filter_map(|q| match q {
                OutRequest::Other { subtype, fields } if subtype == "apply_flag_settings" => {
                    fields.get("settings").cloned()
                }
                _ => None,
            })
            .collect()
    }

    #[test]
    fn flag_settings_replay_in_order_without_redundant_requests() {
        let mut r = RuntimeSettings::default();
        r.apply_flag_settings(obj(json!({"env": {"A": "1"}, "permissions": {}})));
        r.apply_flag_settings(obj(json!({"alwaysThinkingEnabled": false})));
        r.apply_flag_settings(obj(json!({"env": {"B": "2"}})));
        // The first is kept: `permissions` was not set again.
        assert_eq!(r.flag_settings.len(), 3);
        r.apply_flag_settings(obj(
            json!({"permissions": null, "alwaysThinkingEnabled": true}),
        ));
        assert_eq!(
            settings_sent(&r),
            [
                json!({"env": {"B": "2"}}),
                json!({"permissions": null, "alwaysThinkingEnabled": true})
            ]
        );
        // Effort changes: without ultracode anywhere, only the last counts.
        r.apply_flag_settings(obj(json!({"effortLevel": "low"})));
        r.apply_flag_settings(obj(json!({"effortLevel": "high"})));
        assert_eq!(settings_sent(&r).len(), 3);
        // With ultracode, an effort move matters: kept until both keys are set again.
        r.apply_flag_settings(obj(json!({"ultracode": true})));
        r.apply_flag_settings(obj(json!({"effortLevel": "low"})));
        assert_eq!(settings_sent(&r).len(), 5);
        r.apply_flag_settings(obj(json!({"effortLevel": "max", "ultracode": false})));
        assert_eq!(
            settings_sent(&r).last(),
            Some(&json!({"effortLevel": "max", "ultracode": false}))
        );
        assert_eq!(settings_sent(&r).len(), 3);
    }

    #[test]
    fn the_model_is_not_replayed_and_overrides_are_per_server() {
        let mut r = RuntimeSettings::default();
        let applied = |s: Value| json!({"request": {"settings": s}, "answer": null});
        r.record(
            FLAG_SETTINGS_APPLIED,
            "",
            Some(&applied(json!({"model": "claude-x"}))),
        );
        r.record(
            "control",
            "apply_flag_settings done",
            Some(&applied(json!({"model": "claude-y", "effortLevel": "low"}))),
        );
        // Another control's notice is not taken.
        r.record(
            "control",
            "rename_session done",
            Some(&applied(json!({"x": 1}))),
        );
        assert_eq!(settings_sent(&r), [json!({"effortLevel": "low"})]);
        let set = |server: &str, mode: Value| json!({"request": {"serverName": server, "mode": mode}, "answer": {}});
        r.record(MCP_MODE_OVERRIDE_SET, "", Some(&set("a", json!("default"))));
        r.record(MCP_MODE_OVERRIDE_SET, "", Some(&set("b", json!("auto"))));
        r.record(MCP_MODE_OVERRIDE_SET, "", Some(&set("a", Value::Null)));
        let overrides: Vec<_> = r
            .requests()
            .into_iter()
            .filter_map(|q| match q {
                OutRequest::Other { subtype, fields }
                    if subtype == "set_mcp_permission_mode_override" =>
                {
                    Some(Value::Object(fields))
                }
                _ => None,
            })
            .collect();
        assert_eq!(overrides, [json!({"serverName": "b", "mode": "auto"})]);
    }

    fn peer_request(r: &RuntimeSettings) -> Option<Value> {
        r.requests().into_iter().find_map(|q| match q {
            OutRequest::Other { subtype, fields } if subtype == "set_peer_delivery" => {
                Some(Value::Object(fields))
            }
            _ => None,
        })
    }

    #[test]
    fn peer_delivery_is_replayed_as_the_cli_last_reported_it() {
        let mut r = RuntimeSettings::default();
        assert_eq!(peer_request(&r), None);
        let noticed = |request: Value, answer: Value| json!({"request": request, "answer": answer});
        let choice = json!({"scope": "mine", "made_in": "prompting", "session_id": "c1"});
        r.record(
            PEER_DELIVERY_SET,
            "set_peer_delivery done",
            Some(&noticed(
                json!({"shows_held_messages": true, "session": choice}),
                json!({"always_deliver": {
                    "session": {"scope": "mine", "made_in": "prompting", "session_id": "c1", "paused": false},
                    "account": false
                }}),
            )),
        );
        assert_eq!(
            peer_request(&r),
            Some(json!({"shows_held_messages": true, "session": choice}))
        );
        // A field left out stays; the account choice as the answer reports it.
        r.record(
            "control",
            "set_peer_delivery done",
            Some(&noticed(
                json!({"account": true}),
                json!({"always_deliver": {"session": choice, "account": true}}),
            )),
        );
        assert_eq!(
            peer_request(&r),
            Some(json!({"shows_held_messages": true, "session": choice, "account": true}))
        );
        // A decision with `always` in another conversation: the CLI's answer is the state.
        let other = json!({"scope": "anyone", "made_in": "bypass", "session_id": "c1"});
        r.record(
            HELD_PEER_MESSAGE_DECIDED,
            "decide_held_peer_message done",
            Some(&noticed(
                json!({"hold_id": "h", "decision": "deliver", "always": {"scope": "anyone", "made_in": "bypass"}}),
                json!({"outcome": "delivered", "always_deliver": {"session": other, "account": false}}),
            )),
        );
        assert_eq!(
            peer_request(&r),
            Some(json!({"shows_held_messages": true, "session": other}))
        );
        // Ended: nothing but what the host shows.
        r.record(
            PEER_DELIVERY_SET,
            "",
            Some(&noticed(
                json!({"session": null, "shows_held_messages": false}),
                json!({"always_deliver": {"session": null, "account": false}}),
            )),
        );
        assert_eq!(
            peer_request(&r),
            Some(json!({"shows_held_messages": false}))
        );
        // Sent again after a respawn: the new process's answer is the state from then on
        // (a fork runs another conversation and kept no choice: not sent again).
        r.record(
            PEER_DELIVERY_SET,
            "",
            Some(&noticed(
                json!({"session": choice}),
                json!({"always_deliver": {"session": choice, "account": false}}),
            )),
        );
        r.record(
            CONTROL_RESTORED,
            "set_peer_delivery sent again after the respawn, in part: ...",
            Some(&json!({
                "subtype": "set_peer_delivery",
                "request": {"shows_held_messages": false, "session": choice},
                "answer": {"always_deliver": {"session": null, "account": false}}
            })),
        );
        assert_eq!(
            peer_request(&r),
            Some(json!({"shows_held_messages": false}))
        );
        // Another control's restore is not taken.
        r.record(
            CONTROL_RESTORED,
            "",
            Some(&json!({
                "subtype": "apply_flag_settings",
                "request": {"settings": {"x": 1}},
                "answer": {"always_deliver": {"session": choice, "account": true}}
            })),
        );
        assert_eq!(
            peer_request(&r),
            Some(json!({"shows_held_messages": false}))
        );
        // Without `always_deliver` in the answer, what the request asked for.
        r.record(
            PEER_DELIVERY_SET,
            "",
            Some(&noticed(json!({"account": true}), Value::Null)),
        );
        assert_eq!(
            peer_request(&r),
            Some(json!({"shows_held_messages": false, "account": true}))
        );
    }

    #[test]
    fn added_plugins_are_loaded_again_once_per_path() {
        let mut r = RuntimeSettings::default();
        let done = |request: Value| json!({"request": request, "answer": {}});
        r.record(
            "control",
            "reload_plugins done",
            Some(&done(json!({"add_plugins": [
                {"type": "local", "path": "/p/a"},
                {"type": "local", "path": "/p/b", "skipMcpDiscovery": true}
            ]}))),
        );
        // A reload without plugins adds nothing; the same path again: its last entry.
        r.record("control", "reload_plugins done", Some(&done(json!({}))));
        r.record(
            "control",
            "reload_plugins done",
            Some(&done(json!({"add_plugins": [{"type": "local", "path": "/p/a", "skipMcpDiscovery": true}]}))),
        );
        let sent: Vec<Value> = r
            .requests()
            .into_iter()
            .filter_map(|q| match q {
                OutRequest::Other { subtype, fields } if subtype == "reload_plugins" => {
                    Some(Value::Object(fields))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            sent,
            [json!({"add_plugins": [
                {"type": "local", "path": "/p/b", "skipMcpDiscovery": true},
                {"type": "local", "path": "/p/a", "skipMcpDiscovery": true}
            ]})]
        );
    }

    #[test]
    fn a_conversation_choice_the_new_process_did_not_keep_is_a_shortfall() {
        let request = OutRequest::Other {
            subtype: "set_peer_delivery".into(),
            fields: obj(
                json!({"session": {"scope": "mine", "made_in": "prompting", "session_id": "c1"}}),
            ),
        };
        let answer = |s: &str| ostler_protocol::model::RawJson::from_string(s.into()).ok();
        let kept = answer(
            r#"{"always_deliver":{"session":{"scope":"mine","made_in":"prompting","session_id":"c1","paused":false},"account":false}}"#,
        );
        assert_eq!(restore_shortfall(&request, kept.as_ref()), None);
        let dropped = answer(r#"{"always_deliver":{"session":null,"account":false}}"#);
        assert!(
            restore_shortfall(&request, dropped.as_ref())
                .unwrap()
                .contains("conversation c1")
        );
        // Nothing asked for the conversation: nothing missing.
        let shows = OutRequest::Other {
            subtype: "set_peer_delivery".into(),
            fields: obj(json!({"shows_held_messages": true})),
        };
        assert_eq!(restore_shortfall(&shows, dropped.as_ref()), None);
    }
}
