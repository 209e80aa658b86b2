//! Mapping between the engine's domain types and `ostler.v1` messages, plus request
//! validation (missing ids, bad enums, malformed JSON, NUL bytes, over-long values, too many
//! entries -> `INVALID_ARGUMENT` naming the field, before the engine is called).
//!
//! Limits ([`limits`]) keep every value the CLI gets on its command line below what the
//! kernel accepts (`MAX_ARG_STRLEN` per string, `ARG_MAX` in all), so a spawn never fails
//! with `E2BIG`; echoed input is cut ([`crate::error::shown`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use ostler_engine as eng;
use ostler_proto::v1 as pb;
use ostler_protocol as cp;
use tonic::Status;

// ---------------------------------------------------------------- validation helpers

/// Request limits (documented in docs/api.md, "Limits").
pub mod limits {
    /// Ids: `session_id`, `request_id`, `client_message_id`.
    pub const ID_BYTES: usize = 256;
    /// `pasted` entries of a message (the CLI looks at no more).
    pub const PASTES: usize = 100;
    /// `page_token`.
    pub const PAGE_TOKEN_BYTES: usize = 1024;
    /// `cwd` (Linux `PATH_MAX`).
    pub const PATH_BYTES: usize = 4096;
    /// `model`.
    pub const MODEL_BYTES: usize = 256;
    /// `append_system_prompt` (one command-line argument; the kernel's cap is 128 KiB).
    pub const PROMPT_ARG_BYTES: usize = 100 * 1024;
    /// Entries of `allowed_tools` / `disallowed_tools`.
    pub const TOOLS: usize = 256;
    /// One tool rule of `allowed_tools` / `disallowed_tools`.
    pub const TOOL_BYTES: usize = 1024;
    /// Everything a create request puts on the CLI's command line, together.
    pub const ARGV_TOTAL_BYTES: usize = 256 * 1024;
    /// Labels of a session.
    pub const LABELS: usize = 64;
    /// A label key.
    pub const LABEL_KEY_BYTES: usize = 128;
    /// A label value.
    pub const LABEL_VALUE_BYTES: usize = 1024;
    /// Label filters of `ListSessions` (each is one SQL condition).
    pub const LABEL_FILTERS: usize = 32;
    /// State filters of `ListSessions`.
    pub const STATE_FILTERS: usize = 16;
    /// Permission rules in one request (`rules`, `allow.remember`).
    pub const RULES: usize = 256;
    /// A rule's tool name.
    pub const RULE_TOOL_BYTES: usize = 256;
    /// A rule's pattern.
    pub const RULE_PATTERN_BYTES: usize = 4096;
    /// Content blocks of one message.
    pub const BLOCKS: usize = 1000;
    /// Answers to one question request, and labels selected per answer.
    pub const ANSWERS: usize = 64;
    /// A question, a label selected, a free-text answer, a deny message.
    pub const TEXT_BYTES: usize = 64 * 1024;
}

/// An optional JSON object given as text (empty: none), at most `max` bytes.
pub(crate) fn json_object(
    field: &str,
    text: &str,
    max: usize,
) -> Result<Option<serde_json::Map<String, serde_json::Value>>, Status> {
    bounded(field, text, max)?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(m)) => Ok(Some(m)),
        Ok(_) => Err(Status::invalid_argument(format!(
            "{field}: must be a JSON object"
        ))),
        Err(e) => Err(Status::invalid_argument(format!(
            "{field}: is not valid JSON: {e}"
        ))),
    }
}

/// A value that is limited in length and may not contain NUL (the CLI gets it on its
/// command line, or it is an id): `INVALID_ARGUMENT` naming `field` otherwise.
pub(crate) fn bounded(field: &str, value: &str, max: usize) -> Result<(), Status> {
    if value.len() > max {
        return Err(Status::invalid_argument(format!(
            "{field} is {} bytes long; at most {max} are allowed",
            value.len()
        )));
    }
    if let Some(i) = value.find('\0') {
        return Err(Status::invalid_argument(format!(
            "{field} contains a NUL byte (at byte {i})"
        )));
    }
    Ok(())
}

/// Too many entries in a repeated field.
fn count(field: &str, n: usize, max: usize) -> Result<(), Status> {
    if n > max {
        return Err(Status::invalid_argument(format!(
            "{field} has {n} entries; at most {max} are allowed"
        )));
    }
    Ok(())
}

/// A required id field (`session_id`, `request_id`, ...): non-empty after trimming, at most
/// [`limits::ID_BYTES`], no NUL.
pub(crate) fn required<'a>(field: &str, value: &'a str) -> Result<&'a str, Status> {
    bounded(field, value, limits::ID_BYTES)?;
    required_text(field, value)
}

/// An image block (a message's, a tool result's): an `image/` media type and base64 data
/// (standard alphabet, padded, no whitespace), which the CLI would otherwise replace with
/// "[Image could not be processed]" without telling anyone.
pub(crate) fn check_image(f: &str, media_type: &str, data_base64: &str) -> Result<(), Status> {
    required(&format!("{f}.image.media_type"), media_type)?;
    if !media_type.starts_with("image/") {
        return Err(Status::invalid_argument(format!(
            "{f}.image.media_type: {} is not an image type (image/png, image/jpeg, ...)",
            crate::error::shown(media_type)
        )));
    }
    let data = data_base64.as_bytes();
    let body = data
        .strip_suffix(b"==")
        .or_else(|| data.strip_suffix(b"="))
        .unwrap_or(data);
    if data.is_empty()
        || !data.len().is_multiple_of(4)
        || !body
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/'))
    {
        return Err(Status::invalid_argument(format!(
            "{f}.image.data_base64: not base64 data (standard alphabet, padded with '=' to a \
             multiple of 4 characters, no whitespace)"
        )));
    }
    Ok(())
}

/// A required field of any length: non-empty after trimming.
fn required_text<'a>(field: &str, value: &'a str) -> Result<&'a str, Status> {
    let v = value.trim();
    if v.is_empty() {
        return Err(Status::invalid_argument(format!("{field} is required")));
    }
    Ok(v)
}

fn opt_string(s: String) -> Option<String> {
    (!s.trim().is_empty()).then_some(s)
}

fn parse_json_object(field: &str, text: &str) -> Result<serde_json::Value, Status> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        Status::invalid_argument(format!(
            "{field} is not valid JSON: {}",
            crate::error::clip_message(e.to_string())
        ))
    })?;
    if !v.is_object() {
        return Err(Status::invalid_argument(format!(
            "{field} must be a JSON object"
        )));
    }
    Ok(v)
}

fn json_text<T: serde::Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// JSON the event keeps verbatim, as text (empty when absent): no re-serialising.
fn raw_text(v: Option<&cp::RawJson>) -> String {
    v.map(|r| r.get().to_owned()).unwrap_or_default()
}

// ---------------------------------------------------------------- enums

pub(crate) fn state_to_pb(s: eng::SessionState) -> pb::SessionState {
    match s {
        eng::SessionState::Starting => pb::SessionState::Starting,
        eng::SessionState::Idle => pb::SessionState::Idle,
        eng::SessionState::Running => pb::SessionState::Running,
        eng::SessionState::AwaitingPermission => pb::SessionState::AwaitingPermission,
        eng::SessionState::Stopped => pb::SessionState::Stopped,
        eng::SessionState::Exited => pb::SessionState::Exited,
        eng::SessionState::Resumable => pb::SessionState::Resumable,
        eng::SessionState::Suspended => pb::SessionState::Suspended,
    }
}

pub(crate) fn state_from_pb(field: &str, v: i32) -> Result<eng::SessionState, Status> {
    match pb::SessionState::try_from(v) {
        Ok(pb::SessionState::Starting) => Ok(eng::SessionState::Starting),
        Ok(pb::SessionState::Idle) => Ok(eng::SessionState::Idle),
        Ok(pb::SessionState::Running) => Ok(eng::SessionState::Running),
        Ok(pb::SessionState::AwaitingPermission) => Ok(eng::SessionState::AwaitingPermission),
        Ok(pb::SessionState::Stopped) => Ok(eng::SessionState::Stopped),
        Ok(pb::SessionState::Exited) => Ok(eng::SessionState::Exited),
        Ok(pb::SessionState::Resumable) => Ok(eng::SessionState::Resumable),
        Ok(pb::SessionState::Suspended) => Ok(eng::SessionState::Suspended),
        Ok(pb::SessionState::Unspecified) => Err(Status::invalid_argument(format!(
            "{field}: SESSION_STATE_UNSPECIFIED is not a state"
        ))),
        Err(_) => Err(Status::invalid_argument(format!(
            "{field}: {v} is not a known SessionState"
        ))),
    }
}

/// The CLI's `--permission-mode` spelling.
pub(crate) fn mode_to_cli(m: pb::PermissionMode) -> Option<&'static str> {
    match m {
        pb::PermissionMode::Unspecified => None,
        pb::PermissionMode::Default => Some("default"),
        pb::PermissionMode::AcceptEdits => Some("acceptEdits"),
        pb::PermissionMode::Plan => Some("plan"),
        pb::PermissionMode::BypassPermissions => Some("bypassPermissions"),
    }
}

pub(crate) fn mode_from_cli(s: &str) -> pb::PermissionMode {
    match s {
        "default" => pb::PermissionMode::Default,
        "acceptEdits" => pb::PermissionMode::AcceptEdits,
        "plan" => pb::PermissionMode::Plan,
        "bypassPermissions" => pb::PermissionMode::BypassPermissions,
        _ => pb::PermissionMode::Unspecified,
    }
}

/// A permission mode field: `allow_unspecified` lets UNSPECIFIED through as `None`.
pub(crate) fn mode_field(
    field: &str,
    v: i32,
    allow_unspecified: bool,
) -> Result<Option<&'static str>, Status> {
    let m = pb::PermissionMode::try_from(v).map_err(|_| {
        Status::invalid_argument(format!("{field}: {v} is not a known PermissionMode"))
    })?;
    match mode_to_cli(m) {
        None if !allow_unspecified => Err(Status::invalid_argument(format!(
            "{field} is required (PERMISSION_MODE_UNSPECIFIED given)"
        ))),
        other => Ok(other),
    }
}

fn resolution_to_pb(r: &eng::Resolution) -> pb::Resolution {
    match r {
        eng::Resolution::Allowed { .. } => pb::Resolution::Allowed,
        eng::Resolution::Denied { .. } => pb::Resolution::Denied,
        eng::Resolution::Answered { .. } => pb::Resolution::Answered,
        eng::Resolution::Expired { .. } => pb::Resolution::Expired,
        eng::Resolution::Cancelled { .. } => pb::Resolution::Cancelled,
    }
}

// ---------------------------------------------------------------- requests

/// SendMessage's delivery fields. An unknown priority, too many or empty pastes are
/// refused here; the combinations and the release's support are the engine's to check.
pub(crate) fn delivery(
    priority: i32,
    verbatim: bool,
    context_only: bool,
    pasted: Vec<String>,
) -> Result<eng::Delivery, Status> {
    let p = pb::MessagePriority::try_from(priority).map_err(|_| {
        Status::invalid_argument(format!(
            "priority: {priority} is not a known MessagePriority"
        ))
    })?;
    count("pasted", pasted.len(), limits::PASTES)?;
    if let Some(i) = pasted.iter().position(|p| p.trim().is_empty()) {
        return Err(Status::invalid_argument(format!(
            "pasted[{i}] is empty or blank: leave out a paste with no text"
        )));
    }
    Ok(eng::Delivery {
        priority: priority_from_pb(p),
        verbatim,
        context_only,
        pasted,
    })
}

fn priority_from_pb(p: pb::MessagePriority) -> Option<eng::Priority> {
    match p {
        pb::MessagePriority::Unspecified => None,
        pb::MessagePriority::Next => Some(eng::Priority::Next),
        pb::MessagePriority::Now => Some(eng::Priority::Now),
        pb::MessagePriority::Later => Some(eng::Priority::Later),
    }
}

fn priority_to_pb(p: Option<eng::Priority>) -> pb::MessagePriority {
    match p {
        None => pb::MessagePriority::Unspecified,
        Some(eng::Priority::Next) => pb::MessagePriority::Next,
        Some(eng::Priority::Now) => pb::MessagePriority::Now,
        Some(eng::Priority::Later) => pb::MessagePriority::Later,
    }
}

pub(crate) fn message_content(
    field: &str,
    c: Option<pb::MessageContent>,
) -> Result<eng::MessageContent, Status> {
    use pb::message_content::Content;
    match c.and_then(|c| c.content) {
        None => Err(Status::invalid_argument(format!(
            "{field} is required (text or blocks)"
        ))),
        Some(Content::Text(t)) => {
            if t.trim().is_empty() {
                Err(Status::invalid_argument(format!("{field}.text is empty")))
            } else {
                Ok(eng::MessageContent::Text(t))
            }
        }
        Some(Content::Blocks(b)) => {
            if b.blocks.is_empty() {
                return Err(Status::invalid_argument(format!(
                    "{field}.blocks has no blocks"
                )));
            }
            count(&format!("{field}.blocks"), b.blocks.len(), limits::BLOCKS)?;
            let mut out = Vec::with_capacity(b.blocks.len());
            for (i, block) in b.blocks.into_iter().enumerate() {
                use pb::input_block::Block;
                let f = format!("{field}.blocks[{i}]");
                let v = match block.block {
                    None => {
                        return Err(Status::invalid_argument(format!("{f} is empty")));
                    }
                    Some(Block::Text(t)) => serde_json::json!({"type": "text", "text": t}),
                    Some(Block::Image(img)) => {
                        check_image(&f, &img.media_type, &img.data_base64)?;
                        serde_json::json!({
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": img.media_type,
                                "data": img.data_base64,
                            }
                        })
                    }
                    Some(Block::Json(j)) => {
                        let v = parse_json_object(&format!("{f}.json"), &j)?;
                        if v.get("type").and_then(|t| t.as_str()).is_none() {
                            return Err(Status::invalid_argument(format!(
                                "{f}.json needs a string \"type\""
                            )));
                        }
                        v
                    }
                };
                out.push(v);
            }
            Ok(eng::MessageContent::Blocks(out))
        }
    }
}

pub(crate) fn rule_from_pb(
    field: &str,
    r: pb::PermissionRule,
) -> Result<eng::PermissionRule, Status> {
    let action = match pb::RuleAction::try_from(r.action) {
        Ok(pb::RuleAction::Unspecified | pb::RuleAction::Allow) => eng::RuleAction::Allow,
        Ok(pb::RuleAction::Deny) => eng::RuleAction::Deny,
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "{field}.action: {} is not a known RuleAction",
                r.action
            )));
        }
    };
    bounded(&format!("{field}.tool"), &r.tool, limits::RULE_TOOL_BYTES)?;
    required_text(&format!("{field}.tool"), &r.tool)?;
    bounded(
        &format!("{field}.pattern"),
        &r.pattern,
        limits::RULE_PATTERN_BYTES,
    )?;
    Ok(eng::PermissionRule {
        tool: r.tool.trim().to_owned(),
        pattern: opt_string(r.pattern),
        action,
    })
}

/// A session title's limit (CreateSessionRequest.title, UpdateSessionRequest.title).
fn title_field(field: &str, title: &str) -> Result<(), Status> {
    bounded(field, title, crate::watch::TITLE_BYTES)
}

/// Labels a session is to carry (CreateSessionRequest.labels, UpdateSessionRequest.set_labels):
/// at most [`limits::LABELS`], non-empty keys, keys and values within their sizes.
fn session_labels(
    field: &str,
    given: std::collections::HashMap<String, String>,
) -> Result<BTreeMap<String, String>, Status> {
    use crate::error::shown;
    count(field, given.len(), limits::LABELS)?;
    let mut labels = BTreeMap::new();
    for (k, v) in given {
        if k.trim().is_empty() {
            return Err(Status::invalid_argument(format!(
                "{field}: a label key is empty"
            )));
        }
        bounded(&format!("{field}: a key"), &k, limits::LABEL_KEY_BYTES)?;
        bounded(
            &format!("{field}[{}]", shown(&k)),
            &v,
            limits::LABEL_VALUE_BYTES,
        )?;
        labels.insert(k, v);
    }
    Ok(labels)
}

pub(crate) fn create_session(
    r: pb::CreateSessionRequest,
    client: eng::ClientRef,
) -> Result<eng::CreateSession, Status> {
    use crate::error::shown;
    bounded("cwd", &r.cwd, limits::PATH_BYTES)?;
    let cwd = required_text("cwd", &r.cwd)?;
    let permission_mode = mode_field("permission_mode", r.permission_mode, true)?;
    bounded("model", &r.model, limits::MODEL_BYTES)?;
    if r.model.trim_start().starts_with('-') {
        return Err(Status::invalid_argument(format!(
            "model {} is not a model name",
            shown(&r.model)
        )));
    }
    bounded(
        "append_system_prompt",
        &r.append_system_prompt,
        limits::PROMPT_ARG_BYTES,
    )?;
    title_field("title", &r.title)?;
    let labels = session_labels("labels", r.labels)?;
    let first_prompt = match r.first_prompt {
        Some(p) => Some(message_content("first_prompt", Some(p))?),
        None => None,
    };
    count("rules", r.rules.len(), limits::RULES)?;
    let rules = r
        .rules
        .into_iter()
        .enumerate()
        .map(|(i, rule)| rule_from_pb(&format!("rules[{i}]"), rule))
        .collect::<Result<Vec<_>, _>>()?;
    if r.max_turns == Some(0) {
        return Err(Status::invalid_argument(
            "max_turns must be at least 1 (leave it unset for no limit)",
        ));
    }
    let mut argv_total = r.model.len() + r.append_system_prompt.len();
    for (name, list) in [
        ("allowed_tools", &r.allowed_tools),
        ("disallowed_tools", &r.disallowed_tools),
    ] {
        count(name, list.len(), limits::TOOLS)?;
        for (i, t) in list.iter().enumerate() {
            let f = format!("{name}[{i}]");
            bounded(&f, t, limits::TOOL_BYTES)?;
            if t.trim().is_empty() {
                return Err(Status::invalid_argument(format!("{f} is empty")));
            }
            if t.starts_with('-') {
                return Err(Status::invalid_argument(format!(
                    "{f} {} is not a tool rule (it would be read as an option)",
                    shown(t)
                )));
            }
            argv_total += t.len() + 1;
        }
    }
    if argv_total > limits::ARGV_TOTAL_BYTES {
        return Err(Status::invalid_argument(format!(
            "model, append_system_prompt, allowed_tools and disallowed_tools come to \
             {argv_total} bytes together; at most {} are allowed (they go on the CLI's \
             command line)",
            limits::ARGV_TOTAL_BYTES
        )));
    }
    let mcp_servers = mcp_servers_from_pb(r.mcp_servers)?;
    let hooks = crate::hooks::registrations(r.hooks)?;
    let tool_servers = crate::tools::tool_servers_from_pb(r.tool_servers)?;
    {
        use eng::cli_options::limits as cli;
        for (name, list, max) in [
            ("add_dirs", r.add_dirs.len(), cli::ADD_DIRS),
            ("plugin_dirs", r.plugin_dirs.len(), cli::PLUGIN_DIRS),
            ("betas", r.betas.len(), cli::BETAS),
            (
                "setting_sources",
                r.setting_sources.len(),
                eng::cli_options::SETTING_SOURCES.len(),
            ),
        ] {
            // The entries are checked in detail by the engine; the counts here, before
            // anything is copied, with the same limits.
            count(name, list, max)?;
        }
    }
    let options = eng::CliOptions {
        model: opt_string(r.model),
        permission_mode: permission_mode.map(str::to_owned),
        allowed_tools: r.allowed_tools,
        disallowed_tools: r.disallowed_tools,
        system_prompt: opt_string(r.system_prompt),
        append_system_prompt: opt_string(r.append_system_prompt),
        max_turns: r.max_turns,
        mcp_servers,
        strict_mcp_config: r.strict_mcp_config,
        add_dirs: r.add_dirs,
        max_budget_usd: r.max_budget_usd,
        max_thinking_tokens: r.max_thinking_tokens,
        fallback_model: opt_string(r.fallback_model),
        settings: opt_string(r.settings),
        managed_settings: opt_string(r.managed_settings),
        setting_sources: r.setting_sources,
        no_setting_sources: r.no_setting_sources,
        agents: opt_string(r.agents_json),
        json_schema: opt_string(r.json_schema),
        env: r.env.into_iter().collect(),
        hooks,
        tool_servers,
        decline_elicitations: r.decline_elicitations,
        tools: r.tools,
        agent: opt_string(r.agent),
        effort: opt_string(r.effort),
        plugin_dirs: r.plugin_dirs,
        include_hook_events: r.include_hook_events,
        betas: r.betas,
        prompt_suggestions: r.prompt_suggestions,
        permission_prompts: opt_string(r.permission_prompts),
        thinking: opt_string(r.thinking),
        thinking_display: opt_string(r.thinking_display),
        skills: r.skills,
        all_skills: r.all_skills,
        plan_mode_instructions: opt_string(r.plan_mode_instructions),
        tool_aliases: r.tool_aliases.into_iter().collect(),
        exclude_dynamic_sections: r.exclude_dynamic_sections,
        forward_subagent_text: r.forward_subagent_text,
        per_task_stop_affordance: r.per_task_stop_affordance,
        agent_progress_summaries: r.agent_progress_summaries,
        dialog_kinds: r.dialog_kinds,
        question_preview_format: opt_string(r.question_preview_format),
        question_extended: r.question_extended,
        question_optional_descriptions: r.question_optional_descriptions,
        verbatim_prompts: r.verbatim_prompts,
        task_budget_tokens: r.task_budget_tokens,
        allow_dangerously_skip_permissions: r.allow_dangerously_skip_permissions,
        project_config_root: opt_string(r.project_config_root),
        debug: r.debug,
        debug_filter: opt_string(r.debug_filter),
        // The daemon's choice, set at spawn; never the client's.
        debug_file: None,
    };
    // Every option field, checked before the engine is called (the engine checks again).
    options
        .validate()
        .map_err(|e| Status::invalid_argument(format!("{}: {}", e.field, e.message)))?;
    bounded(
        "adopt_claude_session_id",
        &r.adopt_claude_session_id,
        limits::ID_BYTES,
    )?;
    bounded(
        "fork_from_session_id",
        &r.fork_from_session_id,
        limits::ID_BYTES,
    )?;
    if !r.fork_drops_turn_message_id.is_empty() && r.fork_at_message_id.is_empty() {
        return Err(Status::invalid_argument(
            "fork_drops_turn_message_id: only with fork_at_message_id (it guards that cut)",
        ));
    }
    let origin = match (
        opt_string(r.adopt_claude_session_id),
        opt_string(r.fork_from_session_id),
    ) {
        (Some(_), Some(_)) => {
            return Err(Status::invalid_argument(
                "adopt_claude_session_id and fork_from_session_id: set at most one",
            ));
        }
        (Some(claude_session_id), None) => Some(eng::Origin::Adopt { claude_session_id }),
        (None, Some(session_id)) => Some(eng::Origin::Fork {
            session_id,
            at_message_id: opt_string(r.fork_at_message_id),
            drops_turn_message_id: opt_string(r.fork_drops_turn_message_id),
        }),
        (None, None) => {
            if !r.fork_at_message_id.is_empty() {
                return Err(Status::invalid_argument(
                    "fork_at_message_id: only with fork_from_session_id",
                ));
            }
            None
        }
    };
    Ok(eng::CreateSession {
        cwd: PathBuf::from(cwd),
        options,
        origin,
        session_id: opt_string(r.session_id),
        labels,
        rules,
        first_prompt,
        client,
        title: opt_string(r.title),
        enable_file_checkpointing: r.enable_file_checkpointing,
    })
}

/// `CreateSessionRequest.mcp_servers`: a transport for each.
fn mcp_servers_from_pb(
    servers: std::collections::HashMap<String, pb::McpServerSpec>,
) -> Result<BTreeMap<String, eng::McpServer>, Status> {
    use crate::error::shown;
    use pb::mcp_server_spec::Transport;
    count(
        "mcp_servers",
        servers.len(),
        eng::cli_options::limits::MCP_SERVERS,
    )?;
    servers
        .into_iter()
        .map(|(name, spec)| {
            let opt = |s: String| (!s.is_empty()).then_some(s);
            let tuning = eng::McpTuning {
                timeout: spec.timeout_ms,
                always_load: spec.always_load,
                tools: spec
                    .tools
                    .into_iter()
                    .map(|t| eng::McpToolPolicy {
                        name: t.name,
                        permission_policy: opt(t.permission_policy),
                        org_max_permission: opt(t.org_max_permission),
                    })
                    .collect(),
            };
            let server = match spec.transport {
                Some(Transport::Stdio(s)) => eng::McpServer::Stdio {
                    command: s.command,
                    args: s.args,
                    env: s.env.into_iter().collect(),
                    tuning,
                },
                Some(Transport::Http(h)) => eng::McpServer::Http {
                    url: h.url,
                    headers: h.headers.into_iter().collect(),
                    tuning,
                },
                Some(Transport::Sse(h)) => eng::McpServer::Sse {
                    url: h.url,
                    headers: h.headers.into_iter().collect(),
                    tuning,
                },
                None => {
                    return Err(Status::invalid_argument(format!(
                        "mcp_servers[{}]: no transport (stdio, http or sse) is set",
                        shown(&name)
                    )));
                }
            };
            Ok((name, server))
        })
        .collect()
}

/// The label and state filters of a listing or a watch: counts, sizes, known states.
pub(crate) fn session_filters(
    labels: &std::collections::HashMap<String, String>,
    states: &[i32],
) -> Result<Vec<eng::SessionState>, Status> {
    count("states", states.len(), limits::STATE_FILTERS)?;
    count("labels", labels.len(), limits::LABEL_FILTERS)?;
    for (k, v) in labels {
        // No session carries one (CreateSession refuses it): a typo, not "nothing matches".
        if k.trim().is_empty() {
            return Err(Status::invalid_argument(
                "labels: a label key is empty (no session can carry one)",
            ));
        }
        bounded("labels: a key", k, limits::LABEL_KEY_BYTES)?;
        bounded(
            &format!("labels[{}]", crate::error::shown(k)),
            v,
            limits::LABEL_VALUE_BYTES,
        )?;
    }
    states
        .iter()
        .enumerate()
        .map(|(i, s)| state_from_pb(&format!("states[{i}]"), *s))
        .collect()
}

pub(crate) fn list_sessions(r: pb::ListSessionsRequest) -> Result<eng::ListSessions, Status> {
    let states = session_filters(&r.labels, &r.states)?;
    bounded("page_token", &r.page_token, limits::PAGE_TOKEN_BYTES)?;
    Ok(eng::ListSessions {
        states,
        labels: r.labels.into_iter().collect(),
        page_size: r.page_size.min(500),
        page_token: opt_string(r.page_token),
        archived: r.archived,
    })
}

// ---- UpdateSession (title, labels and archived mark after create)

/// UpdateSessionRequest with CreateSession's title and label rules and limits (the same
/// helpers); the session may carry at most [`limits::LABELS`] labels afterwards (checked
/// by the store against the labels it carries).
pub(crate) fn update_session(r: pb::UpdateSessionRequest) -> Result<eng::UpdateSession, Status> {
    if let Some(t) = &r.title {
        title_field("title", t)?;
        if t.trim().is_empty() {
            return Err(Status::invalid_argument(
                "title is empty (a session's title cannot be removed, only replaced)",
            ));
        }
    }
    let set_labels = session_labels("set_labels", r.set_labels)?;
    count("remove_labels", r.remove_labels.len(), limits::LABELS)?;
    for k in &r.remove_labels {
        bounded("remove_labels: a key", k, limits::LABEL_KEY_BYTES)?;
    }
    Ok(eng::UpdateSession {
        title: r.title,
        set_labels,
        remove_labels: r.remove_labels,
        archived: r.archived,
        max_labels: limits::LABELS,
    })
}

pub(crate) fn permission_response(
    r: Option<pb::respond_to_permission_request::Decision>,
) -> Result<eng::PermissionResponse, Status> {
    use pb::respond_to_permission_request::Decision;
    match r {
        None => Err(Status::invalid_argument(
            "decision is required (allow or deny)",
        )),
        Some(Decision::Allow(a)) => {
            let updated_input = if a.updated_input_json.trim().is_empty() {
                None
            } else {
                Some(parse_json_object(
                    "allow.updated_input_json",
                    &a.updated_input_json,
                )?)
            };
            let updated_permissions = if a.updated_permissions_json.trim().is_empty() {
                None
            } else {
                bounded(
                    "allow.updated_permissions_json",
                    &a.updated_permissions_json,
                    limits::TEXT_BYTES,
                )?;
                Some(permission_updates(&a.updated_permissions_json)?)
            };
            count("allow.remember", a.remember.len(), limits::RULES)?;
            let remember = a
                .remember
                .into_iter()
                .enumerate()
                .map(|(i, r)| rule_from_pb(&format!("allow.remember[{i}]"), r))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(eng::PermissionResponse::Allow {
                updated_input,
                remember,
                updated_permissions,
            })
        }
        Some(Decision::Deny(d)) => {
            if d.message.trim().is_empty() {
                return Err(Status::invalid_argument(
                    "deny.message is required (it is told to the model)",
                ));
            }
            bounded("deny.message", &d.message, limits::TEXT_BYTES)?;
            Ok(eng::PermissionResponse::Deny {
                message: d.message,
                interrupt: d.interrupt,
            })
        }
    }
}

/// `allow.updated_permissions_json`: a non-empty JSON array of objects, each with a string
/// `type` (the CLI's `PermissionUpdate`s; their fields are the CLI's to check).
fn permission_updates(text: &str) -> Result<serde_json::Value, Status> {
    const FIELD: &str = "allow.updated_permissions_json";
    let v: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| Status::invalid_argument(format!("{FIELD} is not valid JSON ({e})")))?;
    let Some(items) = v.as_array().filter(|a| !a.is_empty()) else {
        return Err(Status::invalid_argument(format!(
            "{FIELD} must be a JSON array of permission updates, e.g. \
             [{{\"type\":\"setMode\",\"mode\":\"acceptEdits\",\"destination\":\"session\"}}]"
        )));
    };
    if let Some(i) = items
        .iter()
        .position(|u| !u.get("type").is_some_and(serde_json::Value::is_string))
    {
        return Err(Status::invalid_argument(format!(
            "{FIELD}[{i}] must be an object with a string \"type\" (setMode, addRules, \
             replaceRules, removeRules, addDirectories, removeDirectories)"
        )));
    }
    Ok(v)
}

/// The answers' sizes; whether each question is answered as it must be (an optional
/// question may have no answer, or one with nothing in it) is the engine's to check
/// against the questions asked.
pub(crate) fn answers(a: Vec<pb::QuestionAnswer>) -> Result<Vec<eng::QuestionAnswer>, Status> {
    count("answers", a.len(), limits::ANSWERS)?;
    a.into_iter()
        .enumerate()
        .map(|(i, a)| {
            bounded(
                &format!("answers[{i}].question"),
                &a.question,
                limits::TEXT_BYTES,
            )?;
            required_text(&format!("answers[{i}].question"), &a.question)?;
            count(
                &format!("answers[{i}].selected"),
                a.selected.len(),
                limits::ANSWERS,
            )?;
            for (j, l) in a.selected.iter().enumerate() {
                bounded(
                    &format!("answers[{i}].selected[{j}]"),
                    l,
                    limits::TEXT_BYTES,
                )?;
            }
            bounded(
                &format!("answers[{i}].other_text"),
                &a.other_text,
                limits::TEXT_BYTES,
            )?;
            let other_text = (!a.other_text.trim().is_empty()).then_some(a.other_text);
            Ok(eng::QuestionAnswer {
                question: a.question,
                selected: a.selected,
                other_text,
            })
        })
        .collect()
}

// ---------------------------------------------------------------- responses

fn usage_to_pb(u: &cp::Usage) -> pb::Usage {
    pb::Usage {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        cache_creation_input_tokens: u.cache_creation_input_tokens,
        cache_read_input_tokens: u.cache_read_input_tokens,
    }
}

fn exit_to_pb(e: &eng::ExitStatus) -> pb::ProcessExited {
    pb::ProcessExited {
        exit_code: e.exit.facts.code,
        signal: e.exit.facts.signal,
        stderr_tail: e.stderr_tail.clone(),
        reason: e.exit.reason.clone().unwrap_or_default(),
    }
}

pub(crate) fn session_to_pb(s: &eng::SessionInfo) -> pb::Session {
    pb::Session {
        id: s.id.clone(),
        cli_session_id: s.claude_session_id.clone().unwrap_or_default(),
        state: state_to_pb(s.state) as i32,
        cwd: s.cwd.clone(),
        model: s.model.clone().unwrap_or_default(),
        permission_mode: s
            .permission_mode
            .as_deref()
            .map(mode_from_cli)
            .unwrap_or(pb::PermissionMode::Unspecified) as i32,
        labels: s
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        created_at_ms: s.created_ms,
        updated_at_ms: s.updated_ms,
        last_seq: s.last_seq,
        pending_interactions: s.pending_interactions,
        cli_version: s.cli_release.clone().unwrap_or_default(),
        last_exit: s.exit().as_ref().map(exit_to_pb),
        turns: s.turns,
        usage: Some(pb::Usage {
            input_tokens: s.usage.input_tokens,
            output_tokens: s.usage.output_tokens,
            cache_creation_input_tokens: s.usage.cache_creation_input_tokens,
            cache_read_input_tokens: s.usage.cache_read_input_tokens,
        }),
        total_cost_usd: s.usage.cost_usd,
        title: s.title.clone().unwrap_or_default(),
        archived: s.archived,
    }
}

fn answers_to_pb(a: &[eng::QuestionAnswer]) -> Vec<pb::QuestionAnswer> {
    a.iter()
        .map(|a| pb::QuestionAnswer {
            question: a.question.clone(),
            selected: a.selected.clone(),
            other_text: a.other_text.clone().unwrap_or_default(),
        })
        .collect()
}

pub(crate) fn permission_resolved(r: &eng::InteractionResolved) -> pb::PermissionResolved {
    let updated_permissions_json = match &r.resolution {
        eng::Resolution::Allowed {
            updated_permissions: Some(p),
            ..
        } => json_text(p),
        _ => String::new(),
    };
    let (message, updated_input_json, edited, interrupt) = match &r.resolution {
        eng::Resolution::Allowed {
            updated_input,
            edited,
            ..
        } => (String::new(), json_text(updated_input), *edited, false),
        eng::Resolution::Denied { message, interrupt } => {
            (message.clone(), String::new(), false, *interrupt)
        }
        eng::Resolution::Expired { message } => (message.clone(), String::new(), false, false),
        eng::Resolution::Cancelled { reason } => (reason.clone(), String::new(), false, false),
        eng::Resolution::Answered { .. } => (String::new(), String::new(), false, false),
    };
    pb::PermissionResolved {
        request_id: r.request_id.clone(),
        resolution: resolution_to_pb(&r.resolution) as i32,
        message,
        updated_input_json,
        resolved_by: r.decided_by.clone(),
        edited,
        interrupt,
        updated_permissions_json,
    }
}

pub(crate) fn question_answered(r: &eng::InteractionResolved) -> pb::QuestionAnswered {
    pb::QuestionAnswered {
        request_id: r.request_id.clone(),
        answers: match &r.resolution {
            eng::Resolution::Answered { answers } => answers_to_pb(answers),
            _ => Vec::new(),
        },
        resolution: resolution_to_pb(&r.resolution) as i32,
        resolved_by: r.decided_by.clone(),
    }
}

fn question_to_pb(q: &cp::Question) -> pb::Question {
    pb::Question {
        question: q.question.clone(),
        header: q.header.clone().unwrap_or_default(),
        options: q
            .options
            .iter()
            .map(|o| pb::QuestionOption {
                label: o.label.clone(),
                description: o.description.clone().unwrap_or_default(),
                preview: o.preview.clone().unwrap_or_default(),
            })
            .collect(),
        multi_select: q.multi_select,
        kind: q.kind.clone().unwrap_or_default(),
        description: q.description.clone().unwrap_or_default(),
        placeholder: q.placeholder.clone().unwrap_or_default(),
        min: q.min,
        max: q.max,
        step: q.step,
        default_value: q.default_value,
        unit: q.unit.clone().unwrap_or_default(),
        optional: q.optional,
    }
}

/// One field of a tool result's permission decision, empty when it has none.
fn decision_field(
    t: &cp::ToolResult,
    field: impl Fn(&cp::PermissionDecision) -> &Option<String>,
) -> String {
    t.permission_decision
        .as_ref()
        .and_then(|d| field(d).clone())
        .unwrap_or_default()
}

fn assistant_block(b: &cp::AssistantBlock) -> pb::AssistantBlock {
    use pb::assistant_block::Block;
    let block = match &b.block {
        cp::ContentBlock::Text { text } => Block::Text(pb::TextBlock { text: text.clone() }),
        cp::ContentBlock::Thinking {
            thinking,
            signature,
        } => Block::Thinking(pb::ThinkingBlock {
            thinking: thinking.clone(),
            signature: signature.clone().unwrap_or_default(),
        }),
        cp::ContentBlock::RedactedThinking { data } => {
            Block::RedactedThinking(pb::RedactedThinkingBlock { data: data.clone() })
        }
        cp::ContentBlock::ToolUse { id, name, input } => Block::ToolUse(pb::ToolUseBlock {
            id: id.clone(),
            name: name.clone(),
            input_json: json_text(input),
        }),
        cp::ContentBlock::Other { block_type, raw } => Block::Other(pb::OtherBlock {
            block_type: block_type.clone(),
            raw_json: raw.get().to_owned(),
        }),
    };
    pb::AssistantBlock {
        message_id: b.message_id.clone().unwrap_or_default(),
        index: b.index,
        model: b.model.clone().unwrap_or_default(),
        block: Some(block),
        stop_reason: b.stop_reason.clone().unwrap_or_default(),
        usage: b.usage.as_ref().map(usage_to_pb),
        error: b.error.clone().unwrap_or_default(),
        agent_id: b.agent_id.clone().unwrap_or_default(),
        subagent_type: b.subagent_type.clone().unwrap_or_default(),
        task_description: b.task_description.clone().unwrap_or_default(),
    }
}

fn user_content(c: &eng::MessageContent) -> (String, String) {
    match c {
        eng::MessageContent::Text(t) => (t.clone(), String::new()),
        eng::MessageContent::Blocks(b) => (String::new(), json_text(b)),
    }
}

fn system_notice_json<T: serde::Serialize>(
    source_type: &str,
    subtype: &str,
    v: &T,
) -> pb::SystemNotice {
    pb::SystemNotice {
        source_type: source_type.to_owned(),
        subtype: subtype.to_owned(),
        fields_json: json_text(v),
    }
}

/// The protobuf payload of an engine event. `None` for payloads not exposed on the API
/// (stream markers: live-only framing that clients do not need).
pub(crate) fn payload_to_pb(p: &eng::EventPayload) -> Option<pb::session_event::Payload> {
    use pb::session_event::Payload as P;
    Some(match p {
        eng::EventPayload::SessionStarted(s) => P::SessionStarted(pb::SessionStarted {
            cli_session_id: s.session_id.clone(),
            model: s.model.clone().unwrap_or_default(),
            cwd: s.cwd.clone().unwrap_or_default(),
            tools: s.tools.clone(),
            permission_mode: s.permission_mode.clone().unwrap_or_default(),
            cli_version: s.cli_version.clone().unwrap_or_default(),
            capabilities: s.capabilities.clone(),
        }),
        eng::EventPayload::AssistantBlock(b) => P::AssistantBlock(assistant_block(b)),
        eng::EventPayload::PartialDelta(d) => {
            use pb::partial_delta::Delta;
            let delta = match &d.delta {
                cp::Delta::Text(t) => Delta::Text(t.clone()),
                cp::Delta::Thinking(t) => Delta::Thinking(t.clone()),
                cp::Delta::InputJson(t) => Delta::InputJson(t.clone()),
                cp::Delta::Signature(t) => Delta::Signature(t.clone()),
                cp::Delta::Other { raw, .. } => Delta::OtherJson(raw.get().to_owned()),
            };
            P::PartialDelta(pb::PartialDelta {
                message_id: d.message_id.clone().unwrap_or_default(),
                index: d.index,
                delta: Some(delta),
            })
        }
        eng::EventPayload::StreamMarker(_) => return None,
        eng::EventPayload::PartialsMissed(m) => {
            P::PartialsMissed(pb::PartialsMissed { count: m.count })
        }
        eng::EventPayload::UserMessage(u) => P::UserMessage(pb::UserMessage {
            text: u.text.clone().unwrap_or_default(),
            content_json: u
                .content
                .as_ref()
                .map(|c| c.get().to_owned())
                .unwrap_or_default(),
            client_message_id: String::new(),
            is_synthetic: u.is_synthetic,
            is_replay: u.is_replay,
            sent_by: String::new(),
            priority: pb::MessagePriority::Unspecified.into(),
            verbatim: false,
            context_only: false,
            pasted: Vec::new(),
            agent_id: u.agent_id.clone().unwrap_or_default(),
            subagent_type: u.subagent_type.clone().unwrap_or_default(),
            task_description: u.task_description.clone().unwrap_or_default(),
            // An echo names the message echoed.
            message_id: if u.is_replay {
                u.uuid.clone().unwrap_or_default()
            } else {
                String::new()
            },
        }),
        eng::EventPayload::UserMessageSent(u) => {
            let (text, content_json) = user_content(&u.content);
            P::UserMessage(pb::UserMessage {
                text,
                content_json,
                client_message_id: u.client_message_id.clone().unwrap_or_default(),
                is_synthetic: false,
                is_replay: false,
                sent_by: u.sent_by.clone(),
                message_id: u.message_id.clone().unwrap_or_default(),
                priority: priority_to_pb(u.delivery.priority).into(),
                verbatim: u.delivery.verbatim,
                context_only: u.delivery.context_only,
                pasted: u.delivery.pasted.clone(),
                ..Default::default()
            })
        }
        eng::EventPayload::ToolResult(t) => {
            use pb::tool_result::Content;
            P::ToolResult(pb::ToolResult {
                tool_use_id: t.tool_use_id.clone().unwrap_or_default(),
                content: match &t.content {
                    cp::ToolResultContent::Text(s) => Some(Content::Text(s.clone())),
                    cp::ToolResultContent::Blocks(b) => {
                        Some(Content::BlocksJson(b.get().to_owned()))
                    }
                    cp::ToolResultContent::Null => None,
                },
                is_error: t.is_error,
                tool_use_result_json: raw_text(t.tool_use_result.as_ref()),
                tool_result_meta_json: raw_text(t.tool_result_meta.as_ref()),
                permission_decision: decision_field(t, |d| &d.decision),
                permission_source: decision_field(t, |d| &d.source),
                permission_reason_type: decision_field(t, |d| &d.reason_type),
                agent_id: t.agent_id.clone().unwrap_or_default(),
                subagent_type: t.subagent_type.clone().unwrap_or_default(),
                task_description: t.task_description.clone().unwrap_or_default(),
            })
        }
        eng::EventPayload::PermissionRequested(r) => {
            P::PermissionRequested(pb::PermissionRequested {
                request_id: r.request_id.clone(),
                tool_name: r.tool_name.clone(),
                input_json: json_text(&r.input),
                tool_use_id: r.tool_use_id.clone().unwrap_or_default(),
                suggestions_json: r.suggestions.as_ref().map(json_text).unwrap_or_default(),
                blocked_path: r.blocked_path.clone().unwrap_or_default(),
                decision_reason: r.decision_reason.clone().unwrap_or_default(),
                description: r.description.clone().unwrap_or_default(),
                agent_id: r.agent_id.clone().unwrap_or_default(),
            })
        }
        eng::EventPayload::QuestionAsked(q) => P::QuestionAsked(pb::QuestionAsked {
            request_id: q.request_id.clone(),
            tool_use_id: q.tool_use_id.clone().unwrap_or_default(),
            questions: q.questions.iter().map(question_to_pb).collect(),
            title: q.input["title"].as_str().unwrap_or_default().to_owned(),
            input_json: q.input.to_string(),
        }),
        eng::EventPayload::InteractionResolved(r) => match r.kind {
            eng::InteractionKind::Permission => P::PermissionResolved(permission_resolved(r)),
            eng::InteractionKind::Question => P::QuestionAnswered(question_answered(r)),
            // Hook calls, tool calls and elicitations resolve with their own events, never
            // `interaction_resolved`.
            eng::InteractionKind::Hook
            | eng::InteractionKind::ToolCall
            | eng::InteractionKind::Elicitation
            | eng::InteractionKind::Dialog => return None,
        },
        eng::EventPayload::HookRequested(r) => P::HookRequested(crate::hooks::requested_to_pb(r)),
        eng::EventPayload::HookResolved(r) => P::HookResolved(crate::hooks::resolved_to_pb(r)),
        eng::EventPayload::ToolCallRequested(t) => {
            P::ToolCallRequested(crate::tools::requested_to_pb(t))
        }
        eng::EventPayload::ToolCallResolved(t) => {
            P::ToolCallResolved(crate::tools::resolved_to_pb(t))
        }
        eng::EventPayload::ElicitationRequested(e) => {
            P::ElicitationRequested(crate::elicitations::requested_to_pb(e))
        }
        eng::EventPayload::ElicitationResolved(e) => {
            P::ElicitationResolved(crate::elicitations::resolved_to_pb(e))
        }
        eng::EventPayload::DialogRequested(d) => {
            P::DialogRequested(crate::dialogs::requested_to_pb(d))
        }
        eng::EventPayload::DialogResolved(d) => {
            P::DialogResolved(crate::dialogs::resolved_to_pb(d))
        }
        eng::EventPayload::TurnCompleted(t) => P::TurnCompleted(pb::TurnCompleted {
            subtype: t.subtype.clone(),
            is_error: t.is_error,
            result: t.result.clone().unwrap_or_default(),
            num_turns: t.num_turns.unwrap_or_default(),
            duration_ms: t.duration_ms.unwrap_or_default(),
            duration_api_ms: t.duration_api_ms.unwrap_or_default(),
            total_cost_usd: t.total_cost_usd.unwrap_or_default(),
            usage: t.usage.as_ref().map(usage_to_pb),
            errors: t.errors.clone(),
            stop_reason: t.stop_reason.clone().unwrap_or_default(),
            denied_tools: t
                .permission_denials
                .iter()
                .map(|d| d.tool_name.clone())
                .collect(),
            model_usage: crate::notices::model_usage(t),
            terminal_reason: t.terminal_reason.clone().unwrap_or_default(),
            structured_output_json: t
                .structured_output
                .as_ref()
                .map(|s| s.get().to_owned())
                .unwrap_or_default(),
            user_message_ids: t.user_message_uuids.clone(),
        }),
        eng::EventPayload::StateChanged(s) => P::StateChanged(pb::StateChanged {
            from: state_to_pb(s.from) as i32,
            to: state_to_pb(s.to) as i32,
            reason: s.reason.clone().unwrap_or_default(),
        }),
        eng::EventPayload::SystemNotice(n) => match crate::notices::typed_notice(n) {
            Some(typed) => typed,
            None => P::SystemNotice(pb::SystemNotice {
                source_type: n.source_type.clone(),
                subtype: n.subtype.clone().unwrap_or_default(),
                fields_json: n.fields.get().to_owned(),
            }),
        },
        eng::EventPayload::CliControlRequest(r) => {
            let subtype = match &r.request {
                cp::CliRequest::CanUseTool(_) => "can_use_tool".to_owned(),
                cp::CliRequest::HookCallback(_) => "hook_callback".to_owned(),
                cp::CliRequest::Other {
                    request_subtype, ..
                } => request_subtype.clone(),
            };
            P::SystemNotice(system_notice_json("control_request", &subtype, r))
        }
        eng::EventPayload::ControlResponse(r) => {
            let subtype = match &r.outcome {
                cp::ControlOutcome::Success { .. } => "success",
                cp::ControlOutcome::Error { .. } => "error",
            };
            // An answer may carry MCP servers' configurations (`mcp_status`) or settings
            // with an `env`: their values are not shown.
            let mut v = serde_json::to_value(r).unwrap_or_default();
            eng::redact_env_and_headers(&mut v);
            P::SystemNotice(system_notice_json("control_response", subtype, &v))
        }
        eng::EventPayload::EngineNotice(n) => P::EngineNotice(pb::EngineNotice {
            code: n.code.clone(),
            message: n.message.clone(),
            // The options recorded at create may carry secrets (environment values, MCP
            // headers): shown redacted.
            data_json: n
                .data
                .as_ref()
                .map(|d| json_text(&eng::redacted_notice_data(&n.code, d)))
                .unwrap_or_default(),
        }),
        eng::EventPayload::ProcessExited(e) => P::ProcessExited(exit_to_pb(&e.status)),
        eng::EventPayload::Diagnostic(d) => P::Diagnostic(pb::Diagnostic {
            code: match d.code {
                cp::DiagnosticCode::NotJson => "not_json",
                cp::DiagnosticCode::NotAMessage => "not_a_message",
                cp::DiagnosticCode::BadShape => "bad_shape",
            }
            .to_owned(),
            message: d.message.clone(),
            excerpt: d.excerpt.clone(),
            line_len: d.line_len,
        }),
        eng::EventPayload::Truncated(t) => P::Diagnostic(pb::Diagnostic {
            code: "truncated".to_owned(),
            message: t.marker.clone(),
            excerpt: json_text(t),
            line_len: t.original_size,
        }),
        eng::EventPayload::Unknown(u) => P::Unknown(pb::UnknownRaw {
            message_type: u.message_type.clone(),
            raw_json: u.raw.get().to_owned(),
        }),
    })
}

/// The protobuf event, or `None` when its payload is not exposed.
/// The most of an interaction's stored response `GetInteraction` returns.
pub(crate) const INTERACTION_RESPONSE_MAX: usize = 64 * 1024;

/// `GetInteraction`'s answer.
pub(crate) fn interaction_to_pb(r: eng::InteractionRecord) -> pb::GetInteractionResponse {
    use eng::InteractionState as S;
    let i = r.interaction;
    let state = match i.state {
        S::Pending => pb::InteractionState::Pending,
        S::Allowed => pb::InteractionState::Allowed,
        S::Denied => pb::InteractionState::Denied,
        S::Answered => pb::InteractionState::Answered,
        S::Expired => pb::InteractionState::Expired,
        S::Cancelled => pb::InteractionState::Cancelled,
    };
    let kind = match i.kind {
        eng::InteractionKind::Permission => pb::InteractionKind::Permission,
        eng::InteractionKind::Question => pb::InteractionKind::Question,
        eng::InteractionKind::Hook => pb::InteractionKind::Hook,
        eng::InteractionKind::ToolCall => pb::InteractionKind::ToolCall,
        eng::InteractionKind::Elicitation => pb::InteractionKind::Elicitation,
        eng::InteractionKind::Dialog => pb::InteractionKind::Dialog,
    };
    let response = String::from_utf8_lossy(i.response.as_deref().unwrap_or_default());
    let truncated = response.len() > INTERACTION_RESPONSE_MAX;
    let mut end = response.len().min(INTERACTION_RESPONSE_MAX);
    while !response.is_char_boundary(end) {
        end -= 1;
    }
    pb::GetInteractionResponse {
        session_id: i.session_id,
        cwd: r.cwd,
        request_id: i.request_id,
        kind: kind as i32,
        state: state as i32,
        decided_by: i.decided_by.unwrap_or_default(),
        decided_ms: i.decided_ms.unwrap_or_default(),
        created_ms: i.created_ms,
        response_json: response[..end].to_owned(),
        response_truncated: truncated,
        event: r.event.as_ref().and_then(event_to_pb),
    }
}

pub(crate) fn event_to_pb(e: &eng::EngineEvent) -> Option<pb::SessionEvent> {
    Some(pb::SessionEvent {
        session_id: e.session_id.to_string(),
        seq: e.seq.unwrap_or(0),
        ts_ms: e.ts_ms,
        parent_tool_use_id: e.parent_tool_use_id.clone(),
        redelivered: e.redelivered,
        payload: Some(payload_to_pb(&e.payload)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn create_session_validates_fields() {
        let c = eng::ClientRef::default();
        let err = create_session(pb::CreateSessionRequest::default(), c.clone()).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().contains("cwd"), "{}", err.message());

        let bad_mode = pb::CreateSessionRequest {
            cwd: "/tmp".into(),
            permission_mode: 42,
            ..Default::default()
        };
        let err = create_session(bad_mode, c.clone()).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(
            err.message().contains("permission_mode"),
            "{}",
            err.message()
        );

        let ok = pb::CreateSessionRequest {
            cwd: "/tmp".into(),
            model: "sonnet".into(),
            permission_mode: pb::PermissionMode::AcceptEdits as i32,
            max_turns: Some(3),
            first_prompt: Some(pb::MessageContent {
                content: Some(pb::message_content::Content::Text("hi".into())),
            }),
            rules: vec![pb::PermissionRule {
                tool: "Bash".into(),
                pattern: "git status".into(),
                action: 0,
            }],
            ..Default::default()
        };
        let req = create_session(ok, c.clone()).unwrap();
        assert_eq!(req.options.permission_mode.as_deref(), Some("acceptEdits"));
        assert_eq!(req.options.model.as_deref(), Some("sonnet"));
        assert_eq!(req.rules[0].action, eng::RuleAction::Allow);
        assert_eq!(
            req.first_prompt,
            Some(eng::MessageContent::Text("hi".into()))
        );

        // Every session option arrives in the engine's options; bad ones name their field.
        let mut full = pb::CreateSessionRequest {
            cwd: "/tmp".into(),
            system_prompt: "be terse".into(),
            add_dirs: vec!["/srv".into()],
            max_budget_usd: Some(0.5),
            max_thinking_tokens: Some(1024),
            fallback_model: "haiku".into(),
            settings: "{}".into(),
            managed_settings: r#"{"permissions": {"deny": ["WebFetch"]}}"#.into(),
            setting_sources: vec!["user".into()],
            agents_json: r#"{"r": {"description": "d", "prompt": "p"}}"#.into(),
            json_schema: r#"{"type": "object"}"#.into(),
            env: [("MY_TOKEN".to_string(), "s3cret".to_string())].into(),
            session_id: "my-id-1".into(),
            mcp_servers: [(
                "tickets".to_string(),
                pb::McpServerSpec {
                    transport: Some(pb::mcp_server_spec::Transport::Stdio(
                        pb::McpStdioServerSpec {
                            command: "/bin/tickets".into(),
                            args: vec!["-v".into()],
                            env: Default::default(),
                        },
                    )),
                    ..Default::default()
                },
            )]
            .into(),
            strict_mcp_config: true,
            allow_dangerously_skip_permissions: true,
            project_config_root: "/srv/trusted".into(),
            debug: true,
            debug_filter: "api,hooks".into(),
            ..Default::default()
        };
        let req = create_session(full.clone(), c.clone()).unwrap();
        assert_eq!(req.session_id.as_deref(), Some("my-id-1"));
        let o = &req.options;
        assert_eq!(o.system_prompt.as_deref(), Some("be terse"));
        assert_eq!(o.max_budget_usd, Some(0.5));
        assert_eq!(
            o.agents.as_deref(),
            Some(r#"{"r": {"description": "d", "prompt": "p"}}"#)
        );
        assert_eq!(o.env["MY_TOKEN"], "s3cret");
        assert_eq!(
            o.managed_settings.as_deref(),
            Some(r#"{"permissions": {"deny": ["WebFetch"]}}"#)
        );
        assert!(o.strict_mcp_config);
        assert!(o.allow_dangerously_skip_permissions);
        assert_eq!(o.project_config_root.as_deref(), Some("/srv/trusted"));
        assert!(o.debug);
        assert_eq!(o.debug_filter.as_deref(), Some("api,hooks"));
        assert_eq!(o.debug_file, None, "the file is the daemon's choice");
        assert!(
            matches!(&o.mcp_servers["tickets"], eng::McpServer::Stdio { command, .. } if command == "/bin/tickets")
        );
        full.env = [("OSTLER_AUTH__TOKENS".to_string(), "x".to_string())].into();
        let err = create_session(full.clone(), c.clone()).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().starts_with("env: "), "{}", err.message());
        full.env.clear();
        full.mcp_servers
            .insert("x".into(), pb::McpServerSpec::default());
        let err = create_session(full, c).unwrap_err();
        assert!(
            err.message().contains("mcp_servers[\"x\"]"),
            "{}",
            err.message()
        );
    }

    #[test]
    fn secrets_in_session_created_are_redacted() {
        let data = serde_json::json!({
            "env": {"TOKEN": "s3cret"},
            "mcp_servers": {"a": {"type": "http", "url": "https://x", "headers": {"Authorization": "Bearer s3cret"}}},
            "system_prompt": "kept"
        });
        let shown = json_text(&eng::redacted_notice_data("session_created", &data));
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("kept") && shown.contains("TOKEN"), "{shown}");
        let other = json_text(&eng::redacted_notice_data("resuming", &data));
        assert!(other.contains("s3cret"));
        // SetMcpServers' notice (the request's servers) likewise.
        let set = serde_json::json!({"request": {"servers": {
            "a": {"type": "stdio", "command": "/bin/a", "args": [], "env": {"KEY": "s3cret"}},
            "b": {"type": "http", "url": "https://x", "headers": {"X-Key": "s3cret"}},
        }}, "answer": {"added": ["a", "b"]}});
        let shown = json_text(&eng::redacted_notice_data("mcp_servers_set", &set));
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("KEY") && shown.contains("/bin/a"), "{shown}");
        // The CLI's answers (mcp_status lists each server's configuration) likewise.
        let mut status = serde_json::json!({"mcpServers": [{"name": "w", "status": "failed",
            "config": {"type": "http", "url": "http://x", "headers": {"Authorization": "Bearer s3cret"}}}]});
        eng::redact_env_and_headers(&mut status);
        let shown = status.to_string();
        assert!(
            !shown.contains("s3cret") && shown.contains("Authorization"),
            "{shown}"
        );
        // Credentials and tokens in MCP urls, `env` in inline settings.
        let data = serde_json::json!({
            "mcp_servers": {"h": {"type": "http", "url": "http://user:s3cret@host:9/mcp?token=s3cret#f", "headers": {}}},
            "settings": "{\"env\":{\"K\":\"s3cret\"},\"model\":\"kept-model\"}",
            "managed_settings": "{\"env\":{\"K\":\"s3cret\"}}",
        });
        let shown = json_text(&eng::redacted_notice_data("session_created", &data));
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(
            shown.contains("@host:9/mcp?<redacted>#f") && shown.contains("kept-model"),
            "{shown}"
        );
        assert_eq!(eng::redact_url("https://host/p"), None);
        assert_eq!(
            eng::redact_url("https://a:b@host/p").as_deref(),
            Some("https://<redacted>@host/p")
        );
    }

    #[test]
    fn content_blocks_become_anthropic_json() {
        use pb::input_block::Block;
        let c = pb::MessageContent {
            content: Some(pb::message_content::Content::Blocks(pb::ContentBlocks {
                blocks: vec![
                    pb::InputBlock {
                        block: Some(Block::Text("look".into())),
                    },
                    pb::InputBlock {
                        block: Some(Block::Image(pb::ImageBlock {
                            media_type: "image/png".into(),
                            data_base64: "AAAA".into(),
                        })),
                    },
                ],
            })),
        };
        let eng::MessageContent::Blocks(b) = message_content("content", Some(c)).unwrap() else {
            panic!("blocks expected");
        };
        assert_eq!(b[0]["type"], "text");
        assert_eq!(b[1]["source"]["media_type"], "image/png");
        // An image the CLI could not read is refused, not sent as "[Image could not be
        // processed]".
        for (media_type, data, says) in [
            ("image/png", "!!!", "not base64"),
            ("image/png", "AAA", "not base64"),
            ("image/png", "AA=A", "not base64"),
            ("image/png", "AAAA\n", "not base64"),
            ("text/plain", "AAAA", "not an image type"),
            ("image/png", "", "not base64"),
        ] {
            let c = pb::MessageContent {
                content: Some(pb::message_content::Content::Blocks(pb::ContentBlocks {
                    blocks: vec![pb::InputBlock {
                        block: Some(Block::Image(pb::ImageBlock {
                            media_type: media_type.into(),
                            data_base64: data.into(),
                        })),
                    }],
                })),
            };
            let e = message_content("content", Some(c)).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{data:?}");
            assert!(
                e.message().starts_with("content.blocks[0].image.") && e.message().contains(says),
                "{data:?}: {}",
                e.message()
            );
        }
        for ok in ["AA==", "AAA=", "aGVsbG8gd29ybGQ+/w=="] {
            check_image("b", "image/png", ok).unwrap();
        }

        let bad = pb::MessageContent {
            content: Some(pb::message_content::Content::Blocks(pb::ContentBlocks {
                blocks: vec![pb::InputBlock {
                    block: Some(Block::Json("[1]".into())),
                }],
            })),
        };
        let err = message_content("content", Some(bad)).unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(
            err.message().contains("content.blocks[0].json"),
            "{}",
            err.message()
        );
        assert_eq!(
            message_content("content", None).unwrap_err().code(),
            Code::InvalidArgument
        );
    }

    #[test]
    fn permission_decisions_are_validated() {
        use pb::respond_to_permission_request::Decision;
        assert!(permission_response(None).is_err());
        let deny_empty = Decision::Deny(pb::PermissionDeny {
            message: " ".into(),
            interrupt: false,
        });
        assert_eq!(
            permission_response(Some(deny_empty)).unwrap_err().code(),
            Code::InvalidArgument
        );
        let allow = Decision::Allow(pb::PermissionAllow {
            updated_input_json: r#"{"command":"ls"}"#.into(),
            remember: vec![pb::PermissionRule {
                tool: "Bash".into(),
                pattern: String::new(),
                action: pb::RuleAction::Allow as i32,
            }],
            updated_permissions_json:
                r#"[{"type":"setMode","mode":"acceptEdits","destination":"session"}]"#.into(),
        });
        match permission_response(Some(allow)).unwrap() {
            eng::PermissionResponse::Allow {
                updated_input,
                remember,
                updated_permissions,
            } => {
                assert_eq!(updated_input.unwrap()["command"], "ls");
                assert_eq!(remember[0].pattern, None);
                assert_eq!(updated_permissions.unwrap()[0]["mode"], "acceptEdits");
            }
            other => panic!("{other:?}"),
        }
        let bad_json = Decision::Allow(pb::PermissionAllow {
            updated_input_json: "{".into(),
            remember: vec![],
            updated_permissions_json: String::new(),
        });
        assert_eq!(
            permission_response(Some(bad_json)).unwrap_err().code(),
            Code::InvalidArgument
        );
        for (bad, says) in [
            ("[", "not valid JSON"),
            ("{}", "must be a JSON array"),
            ("[]", "must be a JSON array"),
            (r#"[{"mode":"plan"}]"#, "[0] must be an object"),
            (r#"[{"type":"setMode"}, 3]"#, "[1] must be an object"),
        ] {
            let e = permission_response(Some(Decision::Allow(pb::PermissionAllow {
                updated_permissions_json: bad.into(),
                ..Default::default()
            })))
            .unwrap_err();
            assert_eq!(e.code(), Code::InvalidArgument, "{bad}");
            assert!(
                e.message().starts_with("allow.updated_permissions_json")
                    && e.message().contains(says),
                "{bad}: {}",
                e.message()
            );
        }
    }

    #[test]
    fn answers_pass_through_checked_for_size_only() {
        // An empty answer (an optional question left unanswered) and no answers at all
        // are the engine's to judge against the questions asked.
        let a = vec![pb::QuestionAnswer {
            question: "Which?".into(),
            selected: vec![],
            other_text: "  ".into(),
        }];
        let out = answers(a).unwrap();
        assert!(out[0].selected.is_empty() && out[0].other_text.is_none());
        let a = vec![pb::QuestionAnswer {
            question: String::new(),
            ..Default::default()
        }];
        assert_eq!(answers(a).unwrap_err().code(), Code::InvalidArgument);
        let a = vec![pb::QuestionAnswer {
            question: "Which?".into(),
            selected: vec!["A".into(), "B".into()],
            other_text: String::new(),
        }];
        assert_eq!(answers(a).unwrap()[0].selected, vec!["A", "B"]);
        assert!(answers(vec![]).unwrap().is_empty());
    }

    #[test]
    fn states_round_trip_and_unspecified_is_rejected() {
        for s in eng::SessionState::ALL {
            let p = state_to_pb(s) as i32;
            assert_eq!(state_from_pb("states[0]", p).unwrap(), s);
        }
        assert_eq!(
            state_from_pb("states[0]", 0).unwrap_err().code(),
            Code::InvalidArgument
        );
        assert_eq!(
            state_from_pb("states[0]", 77).unwrap_err().code(),
            Code::InvalidArgument
        );
    }

    #[test]
    fn events_map_with_seq_and_parent() {
        let ev = eng::EngineEvent {
            session_id: "s1".into(),
            seq: Some(7),
            ts_ms: 1000,
            parent_tool_use_id: Some("toolu_1".into()),
            payload: eng::EventPayload::AssistantBlock(cp::AssistantBlock {
                message_id: Some("msg_1".into()),
                index: 0,
                parent_tool_use_id: Some("toolu_1".into()),
                model: None,
                block: cp::ContentBlock::ToolUse {
                    id: "toolu_2".into(),
                    name: "Bash".into(),
                    input: serde_json::json!({"command": "ls"}),
                },
                stop_reason: None,
                usage: None,
                error: None,
                agent_id: None,
                subagent_type: None,
                task_description: None,
            }),
            redelivered: false,
        };
        let p = event_to_pb(&ev).unwrap();
        assert_eq!(p.seq, 7);
        assert_eq!(p.parent_tool_use_id.as_deref(), Some("toolu_1"));
        let Some(pb::session_event::Payload::AssistantBlock(b)) = p.payload else {
            panic!("assistant block expected");
        };
        let Some(pb::assistant_block::Block::ToolUse(t)) = b.block else {
            panic!("tool use expected");
        };
        assert_eq!(t.name, "Bash");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&t.input_json).unwrap()["command"],
            "ls"
        );

        let resolved = eng::EngineEvent {
            session_id: "s1".into(),
            seq: Some(8),
            ts_ms: 1001,
            parent_tool_use_id: None,
            payload: eng::EventPayload::InteractionResolved(eng::InteractionResolved {
                request_id: "r1".into(),
                kind: eng::InteractionKind::Permission,
                resolution: eng::Resolution::Denied {
                    message: "no".into(),
                    interrupt: true,
                },
                decided_by: "client:b".into(),
            }),
            redelivered: false,
        };
        let Some(pb::session_event::Payload::PermissionResolved(r)) =
            event_to_pb(&resolved).unwrap().payload
        else {
            panic!("permission resolved expected");
        };
        assert_eq!(r.resolution, pb::Resolution::Denied as i32);
        assert!(r.interrupt);
        assert_eq!(r.resolved_by, "client:b");
    }
}
