//! The session controls beyond interrupt / set_model / set_permission_mode: thinking
//! budget, context usage, MCP servers, file rewind, background tasks, and the session
//! details (`GetSessionInfo`). Every control goes through the capability check (an
//! unserved subtype fails at once with `FailedPrecondition` naming release and request)
//! and then the session's live actor ([`Engine::call`]), like the older controls.

use ostler_protocol::outbound::OutRequest;
use serde_json::{Map, Value};

use super::Engine;
use crate::blocking::blocking;
use crate::error::{Error, Result};
use crate::handle::Command;
use crate::runtime::{INITIALIZE_FAILED, Initialized, SESSION_INITIALIZED, SessionDetails};
use crate::types::EventPayload;

/// What a passed-through request may not do past the daemon's policy (measured on
/// 2.1.332):
/// - an `mcp_call` runs its tool as the model's own call would be decided
///   (`check_permissions: true`): permission rules, the permission mode, managed settings
///   (the daemon's `sessions.managed_settings` deny rules) and hooks. Without it the CLI
///   runs the tool with no check at all; asking for that (`false`) is refused, and so is
///   every `mcp_call` on a release without the field (2.1.120 and 2.1.121 take `mcp_call`
///   but not `check_permissions`: measured in their schemas; 2.1.330 has it);
/// - an `update_settings` of `userSettings` writes the user settings file of the daemon's
///   user, the default of every session the daemon runs (the CLI saves `effortLevel` there
///   for its model): refused, naming the per-session way (`apply_flag_settings`, kept
///   across respawns). `localSettings` writes the project's own local settings file.
fn within_policy(
    version: &semver::Version,
    subtype: &str,
    fields: &mut Map<String, Value>,
) -> Result<()> {
    if subtype == "update_settings" {
        if fields.get("source").and_then(Value::as_str) == Some("userSettings") {
            return Err(Error::invalid(
                "request_json.source",
                "userSettings is the settings file every session of this daemon reads; set \
                 this session's effort with apply_flag_settings {\"settings\": \
                 {\"effortLevel\": ...}} instead",
            ));
        }
        return Ok(());
    }
    if subtype != "mcp_call" {
        return Ok(());
    }
    if *version < MCP_CALL_CHECKED_SINCE {
        return Err(Error::precondition(format!(
            "Claude Code {version} runs an mcp_call with no permission check (it has no \
             `check_permissions`, measured on {MCP_CALL_CHECKED_SINCE} and later), past the \
             session's rules and the daemon's managed settings; ostler does not send it"
        )));
    }
    match fields.get("check_permissions") {
        None | Some(Value::Bool(true)) => {
            fields.insert("check_permissions".into(), Value::Bool(true));
            Ok(())
        }
        Some(_) => Err(Error::invalid(
            "request_json.check_permissions",
            "an mcp_call through ostler is always decided by the session's permission rules, \
             managed settings and hooks; leave check_permissions out or true",
        )),
    }
}

/// The first release measured to take `mcp_call`'s `check_permissions`.
const MCP_CALL_CHECKED_SINCE: semver::Version = semver::Version::new(2, 1, 330);

/// The first release measured to take `get_context_usage`'s `detail` (2.1.330's schema has
/// no such field).
const CONTEXT_SUMMARY_SINCE: semver::Version = semver::Version::new(2, 1, 332);

/// The capability a release announces when its `interrupt` honours `cancel_queued`.
pub const INTERRUPT_CANCEL_QUEUED: &str = "interrupt_cancel_queued_v1";

/// Longest MCP server name / task id / message id accepted (the CLI's are far shorter).
const MAX_NAME: usize = 256;

fn name_arg(field: &str, v: &str) -> Result<()> {
    if v.trim().is_empty() {
        return Err(Error::invalid(field, "empty"));
    }
    if v.len() > MAX_NAME {
        return Err(Error::invalid(
            field,
            format!("{} bytes (at most {MAX_NAME})", v.len()),
        ));
    }
    if v.contains('\0') {
        return Err(Error::invalid(field, "contains a NUL byte"));
    }
    Ok(())
}

/// `SetMcpServers`' configs checked as `CreateSession.mcp_servers` are (the same shapes
/// and limits: a name of 1-64 of `[A-Za-z0-9_-]`, `type` stdio (the default with a
/// `command`), http or sse), and written as the CLI's `mcp_set_servers` takes them: a
/// stdio server always with `args` (the CLI fails on one without, with a JavaScript error).
fn mcp_servers_to_send(servers: Map<String, Value>) -> Result<Map<String, Value>> {
    use ostler_supervisor::McpServer;
    let mut parsed = std::collections::BTreeMap::new();
    for (name, mut config) in servers {
        let field = format!("servers[{}]", ostler_supervisor::options::shown(&name));
        let Value::Object(m) = &mut config else {
            return Err(Error::invalid(field, "is not a JSON object"));
        };
        if !m.contains_key("type") && m.contains_key("command") {
            m.insert("type".into(), Value::from("stdio"));
        }
        // A key ostler would not pass on is refused, not dropped unseen (a `tools` policy
        // that denies a tool must not vanish).
        let known = McpServer::known_keys(m.get("type").and_then(Value::as_str).unwrap_or(""));
        if let Some(k) = m.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(Error::invalid(
                format!("{field}.{}", ostler_supervisor::options::shown(k)),
                format!("is not a key ostler passes on for this server type (known: {known:?})"),
            ));
        }
        let server: McpServer = serde_json::from_value(config).map_err(|e| {
            Error::invalid(
                &field,
                format!(
                    "is not an MCP server config ({e}): {{\"type\": \"stdio\", \"command\", \
                     \"args\"?, \"env\"?, \"timeout\"?, \"alwaysLoad\"?}} or {{\"type\": \
                     \"http\"|\"sse\", \"url\", \"headers\"?, \"timeout\"?, \"alwaysLoad\"?, \
                     \"tools\"?}}"
                ),
            )
        })?;
        parsed.insert(name, server);
    }
    ostler_supervisor::options::validate_mcp_servers("servers", &parsed)
        .map_err(|e| Error::invalid(e.field, e.message))?;
    let mut out = Map::new();
    for (name, server) in parsed {
        let stdio = matches!(server, McpServer::Stdio { .. });
        let mut v = serde_json::to_value(&server).map_err(|e| Error::internal(e.to_string()))?;
        if stdio && let Value::Object(m) = &mut v {
            m.entry("args").or_insert_with(|| Value::Array(Vec::new()));
        }
        out.insert(name, v);
    }
    Ok(out)
}

/// What every control request passes before it is sent: the release serves it (see
/// [`crate::capability::check_control`]), and a model it switches to is one the session can
/// be resumed with (the model is recorded and given as `--model` at every later spawn: a
/// value the spawn would refuse would leave the session never resumable).
pub(crate) fn check_request(
    inst: &ostler_supervisor::Installation,
    request: &OutRequest,
) -> Result<()> {
    if let Some(Some(model)) = request.model_switch() {
        ostler_supervisor::options::check_model(model)
            .map_err(|e| Error::invalid(e.field, e.message))?;
    }
    crate::capability::check_control(inst, request)
}

impl Engine {
    /// Sends a control request the release is known (or not known not) to serve and
    /// returns the CLI's success payload as JSON.
    pub(super) async fn control_answer(
        &self,
        id: &str,
        request: OutRequest,
    ) -> Result<Option<Value>> {
        check_request(&self.shared.installation, &request)?;
        let answer = self
            .call(id, |reply| Command::Control { request, reply })
            .await?;
        Ok(answer.and_then(|a| a.to_value().ok()))
    }

    /// `Interrupt` with `cancel_queued`: also drops the user messages the CLI queued
    /// behind the running turn (releases announcing `interrupt_cancel_queued_v1`; others
    /// would ignore the flag, so they get `FailedPrecondition`). Returns the CLI's answer
    /// (`cancelled`: the uuids of the dropped messages).
    pub async fn interrupt_cancel_queued(&self, session_id: &str) -> Result<Option<Value>> {
        let inst = &self.shared.installation;
        if !inst.capabilities.announces(INTERRUPT_CANCEL_QUEUED) {
            return Err(Error::precondition(format!(
                "Claude Code {} cannot cancel queued messages on interrupt (it does not \
                 announce `{INTERRUPT_CANCEL_QUEUED}`); interrupt without cancel_queued",
                inst.version
            )));
        }
        self.control_answer(session_id, OutRequest::interrupt_cancel_queued())
            .await
    }

    /// `SetMaxThinkingTokens` (`None` clears the limit).
    pub async fn set_max_thinking_tokens(&self, session_id: &str, n: Option<u32>) -> Result<()> {
        self.control_answer(session_id, OutRequest::SetMaxThinkingTokens(n))
            .await
            .map(|_| ())
    }

    /// `SendControlRequest`: a control request ostler has no call of its own for, sent as
    /// is (`subtype` checked by [`crate::capability::check_passthrough`]); the CLI's success
    /// payload.
    pub async fn send_control(
        &self,
        session_id: &str,
        subtype: &str,
        fields: Map<String, Value>,
    ) -> Result<Option<Value>> {
        crate::capability::check_passthrough(&self.shared.installation, subtype)?;
        let mut fields = fields;
        within_policy(&self.shared.installation.version, subtype, &mut fields)?;
        self.confine_paths(subtype, &mut fields).await?;
        self.control_answer(
            session_id,
            OutRequest::Other {
                subtype: subtype.to_owned(),
                fields,
            },
        )
        .await
    }

    /// The directories a passed-through request makes the CLI work in or load code from
    /// (`set_cwd`'s `path`, `register_repo_root`'s `directory`, `reload_plugins`'
    /// `add_plugins[].path`; measured on 2.1.332: the CLI takes a plugin from anywhere and,
    /// with its trust echo, a working directory anywhere) are held to
    /// `sessions.allowed_roots` as `cwd`, `add_dirs` and `plugin_dirs` are: absolute,
    /// existing, inside a root; and sent canonical, so the CLI resolves what was checked.
    async fn confine_paths(&self, subtype: &str, fields: &mut Map<String, Value>) -> Result<()> {
        let mut targets: Vec<(String, &mut Value)> = Vec::new();
        match subtype {
            "set_cwd" => targets.extend(fields.get_mut("path").map(|v| ("path".to_owned(), v))),
            "register_repo_root" => targets.extend(
                fields
                    .get_mut("directory")
                    .map(|v| ("directory".to_owned(), v)),
            ),
            "reload_plugins" => {
                if let Some(Value::Array(plugins)) = fields.get_mut("add_plugins") {
                    for (i, p) in plugins.iter_mut().enumerate() {
                        if let Some(v) = p.get_mut("path") {
                            targets.push((format!("add_plugins[{i}].path"), v));
                        }
                    }
                }
            }
            _ => return Ok(()),
        }
        for (field, v) in targets {
            // A path that is not a string is the CLI's to refuse.
            let Some(p) = v.as_str() else { continue };
            if !p.starts_with('/') {
                return Err(Error::invalid(
                    format!("request_json.{field}"),
                    format!(
                        "{} is not an absolute path (relative and `~` paths are resolved by \
                         the CLI, where ostler's allowed roots cannot be checked)",
                        ostler_supervisor::options::shown(p)
                    ),
                ));
            }
            let c = self
                .validate_dir(&format!("request_json.{field}"), std::path::Path::new(p))
                .await?;
            *v = Value::String(c.to_string_lossy().into_owned());
        }
        Ok(())
    }

    /// `GetContextUsage`: the CLI's breakdown of the context window; `summary` without the
    /// per-category token-count calls (releases measured to take `detail`; the others
    /// would ignore it and count in full, so they refuse it at once).
    pub async fn context_usage(&self, session_id: &str, summary: bool) -> Result<Option<Value>> {
        let version = &self.shared.installation.version;
        if summary && *version < CONTEXT_SUMMARY_SINCE {
            return Err(Error::precondition(format!(
                "Claude Code {version} always counts context usage in full (`detail: \
                 \"summary\"` is measured on {CONTEXT_SUMMARY_SINCE} and later); ask without \
                 summary"
            )));
        }
        self.control_answer(session_id, OutRequest::get_context_usage(summary))
            .await
    }

    /// `GetMcpStatus`: the CLI's MCP servers with their status.
    pub async fn mcp_status(&self, session_id: &str) -> Result<Option<Value>> {
        self.control_answer(session_id, OutRequest::McpStatus).await
    }

    /// `SetMcpServers`: replaces the servers added at runtime (name -> config object).
    pub async fn set_mcp_servers(
        &self,
        session_id: &str,
        servers: Map<String, Value>,
    ) -> Result<Option<Value>> {
        let servers = mcp_servers_to_send(servers)?;
        self.control_answer(session_id, OutRequest::mcp_set_servers(servers))
            .await
    }

    /// `ToggleMcpServer`.
    pub async fn toggle_mcp_server(
        &self,
        session_id: &str,
        server_name: &str,
        enabled: bool,
    ) -> Result<()> {
        name_arg("server_name", server_name)?;
        self.control_answer(session_id, OutRequest::mcp_toggle(server_name, enabled))
            .await
            .map(|_| ())
    }

    /// `ReconnectMcpServer`.
    pub async fn reconnect_mcp_server(&self, session_id: &str, server_name: &str) -> Result<()> {
        name_arg("server_name", server_name)?;
        self.control_answer(session_id, OutRequest::mcp_reconnect(server_name))
            .await
            .map(|_| ())
    }

    /// `RewindFiles`: the files the session changed go back to their state at user message
    /// `message_id` (a `SendMessage` answer's `message_id`); `dry_run` only reports.
    pub async fn rewind_files(
        &self,
        session_id: &str,
        message_id: &str,
        dry_run: bool,
    ) -> Result<Option<Value>> {
        name_arg("message_id", message_id)?;
        self.control_answer(session_id, OutRequest::rewind_files(message_id, dry_run))
            .await
    }

    /// `StopTask`: stops a background task by id.
    pub async fn stop_task(&self, session_id: &str, task_id: &str) -> Result<()> {
        name_arg("task_id", task_id)?;
        self.control_answer(session_id, OutRequest::stop_task(task_id))
            .await
            .map(|_| ())
    }

    /// `GetSessionInfo`: the last `initialize` answer and `system/init` from the session's
    /// log (one pass over it, decoding only those two kinds of event), and the capabilities
    /// detected for the release. Works in any state.
    pub async fn session_details(&self, session_id: &str) -> Result<SessionDetails> {
        self.entry(session_id).await?;
        let store = self.shared.store.clone();
        let sid = session_id.to_owned();
        let (init, initialized, initialize_error) = blocking(move || {
            // Newest first, only `session_started` and `engine_notice` rows: the latest
            // init, the latest initialize answer, and an `initialize_failed` only when it
            // came after that answer.
            let mut init = None;
            let mut initialized = None;
            let mut failed = None;
            let mut before = u64::MAX;
            while init.is_none() || initialized.is_none() {
                let page = store.events_of_kinds_before(
                    &sid,
                    &["session_started", "engine_notice"],
                    before,
                    64,
                )?;
                let Some(last) = page.last() else { break };
                before = last.seq;
                for ev in &page {
                    match EventPayload::decode_stored(&ev.kind, &ev.payload) {
                        Ok(EventPayload::SessionStarted(s)) if init.is_none() => init = Some(s),
                        Ok(EventPayload::EngineNotice(n))
                            if n.code == SESSION_INITIALIZED && initialized.is_none() =>
                        {
                            initialized =
                                Some(Initialized::from_answer(n.data.unwrap_or(Value::Null)));
                        }
                        Ok(EventPayload::EngineNotice(n))
                            if n.code == INITIALIZE_FAILED
                                && initialized.is_none()
                                && failed.is_none() =>
                        {
                            failed = Some(n.message);
                        }
                        _ => {}
                    }
                }
            }
            Ok::<_, Error>((init, initialized, failed))
        })
        .await?;
        let inst = &self.shared.installation;
        Ok(SessionDetails {
            session_id: session_id.to_owned(),
            cli_version: inst.version.to_string(),
            live: self.live_handle(session_id).is_some(),
            initialized,
            initialize_error,
            init,
            capabilities: inst.capabilities.names(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fields(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    #[test]
    fn a_passed_through_mcp_call_is_always_checked() {
        let new = semver::Version::new(2, 1, 332);
        let mut f = fields(json!({"tool": "mcp__t__x"}));
        within_policy(&new, "mcp_call", &mut f).expect("sent");
        assert_eq!(f["check_permissions"], true);
        let mut f = fields(json!({"tool": "mcp__t__x", "check_permissions": false}));
        assert!(matches!(
            within_policy(&new, "mcp_call", &mut f),
            Err(Error::InvalidArgument { .. })
        ));
        // 2.1.121 takes mcp_call but would run it unchecked.
        let old = semver::Version::new(2, 1, 121);
        let mut f = fields(json!({"tool": "mcp__t__x"}));
        assert!(matches!(
            within_policy(&old, "mcp_call", &mut f),
            Err(Error::FailedPrecondition { .. })
        ));
        // Others pass as they are; the shared user settings do not.
        let mut f = fields(json!({"source": "localSettings", "settings": {}}));
        within_policy(&old, "update_settings", &mut f).expect("local");
        let mut f = fields(json!({"source": "userSettings", "settings": {}}));
        assert!(within_policy(&new, "update_settings", &mut f).is_err());
        let mut f = fields(json!({"x": 1}));
        within_policy(&old, "get_settings", &mut f).expect("passes");
        assert_eq!(f, fields(json!({"x": 1})));
    }
}
