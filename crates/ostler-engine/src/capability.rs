//! What the running Claude Code release can do, checked before anything is sent to it.
//!
//! - Control requests (`set_model`, `interrupt`, ...): the compatibility matrix records,
//!   per pinned release, whether the CLI answers each subtype (`cargo xtask compat probe`).
//!   A request the release does not serve fails at once with `FailedPrecondition` naming the
//!   release and the request, instead of waiting for the control timeout (1.0.x ignores
//!   subtypes it does not know).
//! - Resume: `--resume ID` needs the CLI's transcript (`<config>/projects/*/<ID>.jsonl`);
//!   without it every message makes the CLI exit ("No conversation found"). [`resume_plan`]
//!   refuses such a resume, or continues with a fresh conversation when the caller asks.

use std::path::{Path, PathBuf};

use ostler_protocol::outbound::OutRequest;
use ostler_supervisor::Installation;
use ostler_supervisor::compat::{ControlSupport, ResumeAtKey};

use crate::blocking::blocking;
use crate::error::{Error, Result};
use crate::handle::SessionEntry;
use crate::types::{EngineNotice, EventPayload};

/// The wire subtype of a control request ostler sends.
pub(crate) fn subtype(request: &OutRequest) -> &str {
    match request {
        OutRequest::Initialize(_) => "initialize",
        OutRequest::Interrupt => "interrupt",
        OutRequest::SetModel(_) => "set_model",
        OutRequest::SetPermissionMode(_) => "set_permission_mode",
        OutRequest::SetMaxThinkingTokens(_) => "set_max_thinking_tokens",
        OutRequest::McpStatus => "mcp_status",
        OutRequest::Other { subtype, .. } => subtype,
    }
}

/// `Ok` when the installed release serves `request` (or it was never measured), else a
/// `FailedPrecondition` naming the release, the request and what was measured.
pub(crate) fn check_control(inst: &Installation, request: &OutRequest) -> Result<()> {
    let sub = subtype(request);
    let support = inst.capabilities.control_support(sub);
    if support.served() {
        return Ok(());
    }
    let measured = match support {
        ControlSupport::NoAnswer => "it does not answer it",
        ControlSupport::Unsupported => "it refuses it as an unsupported request",
        _ => "it does not serve it",
    };
    Err(Error::precondition(format!(
        "Claude Code {} cannot serve the `{sub}` control request ({measured}; see \
         docs/compatibility.md); use a newer release for this call",
        inst.version
    )))
}

/// Whether ostler sends `rename_session` on its own (the title a client gave with
/// `UpdateSession`, so the CLI's transcript follows it): only where the release is measured
/// to answer it. A release not measured for it (an unpinned one in a gap) is left alone
/// too: ostler's record holds the title either way, and nothing waits on the answer.
pub(crate) fn answers_rename(inst: &Installation) -> bool {
    inst.capabilities.control_support("rename_session") == ControlSupport::Answered
}

/// Control subtypes ostler sends or answers itself, with the call that does it: a
/// `SendControlRequest` of one of them is refused (it would bypass what the call records,
/// e.g. the session's model).
const OWN_CONTROLS: &[(&str, &str)] = &[
    (
        "initialize",
        "CreateSession / ResumeSession (sent at every start)",
    ),
    ("interrupt", "Interrupt"),
    ("set_model", "SetModel"),
    ("set_permission_mode", "SetPermissionMode"),
    ("set_max_thinking_tokens", "SetMaxThinkingTokens"),
    ("mcp_status", "GetMcpStatus"),
    ("get_context_usage", "GetContextUsage"),
    ("rewind_files", "RewindFiles"),
    ("mcp_set_servers", "SetMcpServers"),
    ("mcp_toggle", "ToggleMcpServer"),
    ("mcp_reconnect", "ReconnectMcpServer"),
    ("stop_task", "StopTask"),
    // The CLI exits on it: the session would be recorded as ended by itself (EXITED).
    ("end_session", "StopSession"),
];

/// Control subtypes the CLI sends (ostler answers them), with the call that answers.
const CLI_CONTROLS: &[(&str, &str)] = &[
    ("can_use_tool", "RespondToPermission"),
    ("hook_callback", "RespondToHook"),
    ("mcp_message", "RespondToToolCall"),
    ("elicitation", "RespondToElicitation"),
    ("request_user_dialog", "RespondToDialog"),
];

/// `Ok` when `subtype` may be sent by `SendControlRequest` on the installed release: not one
/// ostler sends itself (else `Invalid` naming the call to use), and either measured served
/// or the release answers control requests it does not know. Releases that ignore unknown
/// subtypes (any probed subtype measured `no answer`: 1.0.x to 2.1.0) would leave an unknown
/// one waiting for the control timeout, so it is refused at once.
pub(crate) fn check_passthrough(inst: &Installation, subtype: &str) -> Result<()> {
    if let Some((_, call)) = OWN_CONTROLS.iter().find(|(s, _)| *s == subtype) {
        return Err(Error::invalid(
            "subtype",
            format!("`{subtype}` is sent by ostler itself; use {call}"),
        ));
    }
    if let Some((_, call)) = CLI_CONTROLS.iter().find(|(s, _)| *s == subtype) {
        return Err(Error::invalid(
            "subtype",
            format!(
                "`{subtype}` is a request the CLI sends, not one it takes; answer it with {call}"
            ),
        ));
    }
    let caps = &inst.capabilities;
    match caps.control_support(subtype) {
        ControlSupport::Unknown => {}
        _ => {
            return check_control(
                inst,
                &OutRequest::Other {
                    subtype: subtype.to_owned(),
                    fields: Default::default(),
                },
            );
        }
    }
    let ignored: Vec<&str> = caps
        .control
        .iter()
        .filter(|(_, s)| **s == ControlSupport::NoAnswer)
        .map(|(c, _)| c.as_str())
        .collect();
    if let Some(first) = ignored.first() {
        return Err(Error::precondition(format!(
            "Claude Code {} does not answer control requests it does not know (measured: it \
             leaves `{first}` unanswered; see docs/compatibility.md), so `{subtype}` would wait \
             for the control timeout; use a release that answers every probed control request \
             (2.1.120 and later)",
            inst.version
        )));
    }
    Ok(())
}

/// `Ok` when the installed release calls hooks registered in `initialize`
/// (`hook_callback`, measured by `cargo xtask compat probe`; a release not measured for it
/// is judged by whether it answers `initialize`) and knows the event of every registration
/// (`hook_events`; an event not measured is allowed), else a `FailedPrecondition` naming
/// the release (issue 11).
pub(crate) fn check_hooks(
    inst: &Installation,
    hooks: &[ostler_protocol::hooks::HookRegistration],
) -> Result<()> {
    let caps = &inst.capabilities;
    let support = match caps.control_support("hook_callback") {
        ControlSupport::Unknown => caps.control_support("initialize"),
        s => s,
    };
    if !support.served() {
        return Err(Error::precondition(format!(
            "Claude Code {} does not call hooks registered over the control protocol \
             (`hook_callback` measured: {}; see docs/compatibility.md); leave `hooks` empty or \
             use a newer release",
            inst.version,
            support.as_str()
        )));
    }
    for (i, h) in hooks.iter().enumerate() {
        if caps.knows_hook_event(&h.event) == Some(false) {
            return Err(Error::precondition(format!(
                "hooks[{i}].event: Claude Code {} does not know the hook event {}, or never \
                 calls it in a session of ostler's (measured; the events each release calls are \
                 in docs/compatibility.md, \"Hook events\"); drop that registration or use a \
                 newer release",
                inst.version, h.event
            )));
        }
    }
    Ok(())
}
/// `Ok` unless the session declares client-hosted tool servers and the installed release
/// is measured not to serve SDK MCP servers (`mcp_message`): then `FailedPrecondition`
/// naming the release.
pub(crate) fn check_tool_servers(
    inst: &Installation,
    options: &ostler_supervisor::CliOptions,
) -> Result<()> {
    if options.tool_servers.is_empty()
        || inst.capabilities.cli_requests.get("mcp_message") != Some(&false)
    {
        return Ok(());
    }
    Err(Error::precondition(format!(
        "Claude Code {} does not serve SDK MCP servers (`mcp_message`, measured: see \
         docs/compatibility.md), which tool_servers needs; leave tool_servers empty or use a \
         newer release (1.0.108 and later serve them)",
        inst.version
    )))
}

/// `Ok` unless the session asks for prompt suggestions and the installed release is
/// measured not to write them (`output:prompt_suggestion`): then `FailedPrecondition`
/// naming the release.
pub(crate) fn check_outputs(
    inst: &Installation,
    options: &ostler_supervisor::CliOptions,
) -> Result<()> {
    if !options.prompt_suggestions
        || inst.capabilities.outputs.get("prompt_suggestion") != Some(&false)
    {
        return Ok(());
    }
    Err(Error::precondition(format!(
        "Claude Code {} does not write prompt suggestions (measured: see docs/compatibility.md, \
         \"Messages on request\"), which prompt_suggestions asks for; leave it off or use a \
         newer release (2.1.120 and later write them)",
        inst.version
    )))
}

/// `Ok` unless the session asks for an `initialize` field
/// (`ostler_supervisor::compat::INIT_FIELDS`) the installed release is measured not to
/// honour: then `FailedPrecondition` naming the option and the release.
pub(crate) fn check_init_fields(
    inst: &Installation,
    options: &ostler_supervisor::CliOptions,
) -> Result<()> {
    let asked = [
        (
            "skills",
            if options.all_skills {
                "all_skills"
            } else {
                "skills"
            },
            options.all_skills || !options.skills.is_empty(),
        ),
        (
            "plan_mode_instructions",
            "plan_mode_instructions",
            options.plan_mode_instructions.is_some(),
        ),
        (
            "tool_aliases",
            "tool_aliases",
            !options.tool_aliases.is_empty(),
        ),
        (
            "exclude_dynamic_sections",
            "exclude_dynamic_sections",
            options.exclude_dynamic_sections,
        ),
        (
            "forward_subagent_text",
            "forward_subagent_text",
            options.forward_subagent_text,
        ),
        (
            "per_task_stop_affordance",
            "per_task_stop_affordance",
            options.per_task_stop_affordance,
        ),
        (
            "agent_progress_summaries",
            "agent_progress_summaries",
            options.agent_progress_summaries,
        ),
        (
            "dialog_kinds",
            "dialog_kinds",
            !options.dialog_kinds.is_empty(),
        ),
        (
            "question_preview_format",
            "question_preview_format",
            options.question_preview_format.is_some(),
        ),
        (
            "question_extended",
            "question_extended",
            options.question_extended,
        ),
        (
            "question_optional_descriptions",
            "question_optional_descriptions",
            options.question_optional_descriptions,
        ),
    ];
    for (field, option, on) in asked {
        if on && inst.capabilities.init_fields.get(field) == Some(&false) {
            return Err(Error::precondition(format!(
                "Claude Code {} ignores `{option}` (measured: see docs/compatibility.md, \
                 \"Initialize fields\"); leave it unset or use a release that honours it",
                inst.version
            )));
        }
    }
    Ok(())
}

/// `Ok` unless the session's CLI would get a policy (`managed_settings`: the session's own
/// or the daemon's `sessions.managed_settings`) the installed release is measured not to
/// enforce (`ostler_supervisor::compat::POLICIES`): then `FailedPrecondition` naming the
/// option and the release. A release that accepts the flag may still ignore it, so
/// acceptance alone is not enough.
pub(crate) fn check_policies(inst: &Installation, managed_settings: bool) -> Result<()> {
    if managed_settings && inst.capabilities.policies.get("managed_settings") == Some(&false) {
        return Err(Error::precondition(format!(
            "Claude Code {} does not enforce `managed_settings` (--managed-settings; \
             measured: see docs/compatibility.md, \"Policies\"); leave it unset or use a \
             release that enforces it",
            inst.version
        )));
    }
    Ok(())
}

/// `Ok` unless the session option `verbatim_prompts` is set and the installed release is
/// measured to ignore `verbatim` (`client_composed`): its messages would then run with
/// `@path` expanded and slash commands dispatched, what the option is there to prevent.
pub(crate) fn check_verbatim_prompts(
    inst: &Installation,
    options: &ostler_supervisor::CliOptions,
) -> Result<()> {
    if options.verbatim_prompts && inst.capabilities.inputs.get("verbatim") == Some(&false) {
        return Err(Error::precondition(format!(
            "Claude Code {} ignores `verbatim` (measured: see docs/compatibility.md, \
             \"User-message fields\"), which the session option `verbatim_prompts` needs: its \
             messages would run with `@path` mentions expanded and slash commands \
             dispatched; leave it unset or use a release that honours it",
            inst.version
        )));
    }
    Ok(())
}

/// `Ok` unless a message asks for a field (`ostler_supervisor::compat::MESSAGE_FIELDS`)
/// the installed release is measured not to honour: then `FailedPrecondition` naming the
/// field and the release. A field not measured for the release is written.
pub(crate) fn check_delivery(inst: &Installation, d: &crate::Delivery) -> Result<()> {
    let asked = [
        (
            "priority_now",
            "priority NOW",
            d.priority == Some(crate::Priority::Now),
        ),
        (
            "priority_later",
            "priority LATER",
            d.priority == Some(crate::Priority::Later),
        ),
        ("verbatim", "verbatim", d.verbatim),
        ("context_only", "context_only", d.context_only),
        ("pasted_content", "pasted", !d.pasted.is_empty()),
    ];
    for (field, name, on) in asked {
        if on && inst.capabilities.inputs.get(field) == Some(&false) {
            return Err(Error::precondition(format!(
                "Claude Code {} ignores {name} (measured: see docs/compatibility.md, \
                 \"User-message fields\"), so the message would run as if it were not set; \
                 send it without {name} or use a release that honours it",
                inst.version
            )));
        }
    }
    Ok(())
}

/// The variable that turns on the CLI's file checkpointing (what `RewindFiles` restores
/// from), as the Agent SDKs set it for `enable_file_checkpointing`.
pub const FILE_CHECKPOINTING_VAR: &str = "CLAUDE_CODE_ENABLE_SDK_FILE_CHECKPOINTING";

/// The session environment, with file checkpointing turned on when asked.
pub(crate) fn with_checkpointing(
    mut env: Vec<(String, String)>,
    enable: bool,
) -> Vec<(String, String)> {
    if enable {
        env.push((FILE_CHECKPOINTING_VAR.into(), "true".into()));
    }
    env
}

/// How `ResumeSession` treats the CLI conversation. A plain `bool` converts into it as
/// `fork`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResumeOptions {
    /// Branch the CLI conversation (`--fork-session`) instead of continuing it in place.
    pub fork: bool,
    /// Cut the conversation after this message (`--resume-session-at`): an
    /// `AssistantBlock.message_id` (the whole API message is kept) or a
    /// `UserMessage.message_id`; releases without the flag refuse it at once.
    pub at_message_id: Option<String>,
    /// With `at_message_id`: the `UserMessage.message_id` starting the one turn the cut
    /// may drop (`--resume-drops-turn`); the CLI refuses the resume when anything else
    /// lies past the cut. Without `at_message_id`: `InvalidArgument`.
    pub drops_turn_message_id: Option<String>,
    /// When the CLI's transcript of the conversation is gone, continue in the same ostler
    /// session with a fresh CLI conversation (an `engine_notice` `context_lost` says the
    /// model's earlier context is lost) instead of failing with `FailedPrecondition`.
    pub fresh_if_missing: bool,
}

impl From<bool> for ResumeOptions {
    fn from(fork: bool) -> Self {
        ResumeOptions {
            fork,
            ..Default::default()
        }
    }
}

/// The `engine_notice` code recorded when a resume starts a fresh CLI conversation.
pub const CONTEXT_LOST: &str = "context_lost";

/// What a resume will do about the CLI conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ResumePlan {
    /// `--resume` the conversation: its transcript exists (or cannot be looked for).
    Continue(String),
    /// The transcript is gone and the caller asked for a fresh conversation.
    Fresh { lost: String },
}

/// The environment a session's CLI gets, as the transcript checks must see it: the
/// daemon's session environment, then the session's own variables (which win, as in the
/// spawn), so a per-session `HOME` or `CLAUDE_CONFIG_DIR` is where the transcript is
/// looked for.
pub(crate) fn session_env(
    spawn_env: &[(String, String)],
    session: &ostler_supervisor::CliOptions,
) -> Vec<(String, String)> {
    spawn_env
        .iter()
        .cloned()
        .chain(session.env.iter().map(|(k, v)| (k.clone(), v.clone())))
        .collect()
}

/// Where the CLI keeps its state for the environment a session gets: `CLAUDE_CONFIG_DIR`,
/// else `$HOME/.claude` (the session environment wins over the daemon's).
fn config_dir(spawn_env: &[(String, String)]) -> Option<PathBuf> {
    let get = |name: &str| {
        spawn_env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var(name).ok())
            .filter(|v| !v.is_empty())
    };
    get("CLAUDE_CONFIG_DIR")
        .map(PathBuf::from)
        .or_else(|| get("HOME").map(|h| Path::new(&h).join(".claude")))
}

/// The transcript file of CLI conversation `id` under `config`, if there is one.
fn transcript_file(config: &Path, id: &str) -> Option<PathBuf> {
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return None;
    }
    let file = format!("{id}.jsonl");
    std::fs::read_dir(config.join("projects"))
        .ok()?
        .flatten()
        .map(|d| d.path().join(&file))
        .find(|p| p.is_file())
}

/// Which of the user messages `uuids` the CLI's transcript of conversation `cid` holds
/// (entries of type `user` with that `uuid`: every release checked, 1.0.128 to 2.1.330,
/// keeps the uuid ostler sends with a message; or listing it in `mergedSendUuids`, 2.1.332's
/// one entry for messages queued together). `None` when nothing can be said: no
/// configuration directory to look in, or a transcript that cannot be read. An empty set
/// when the CLI wrote no transcript (no conversation id, or no file). Blocking: call
/// through `blocking`.
pub(crate) fn transcript_user_entries(
    spawn_env: &[(String, String)],
    cid: Option<&str>,
    uuids: &[String],
) -> Option<std::collections::HashSet<String>> {
    use std::io::BufRead;
    let config = config_dir(spawn_env)?;
    let mut found = std::collections::HashSet::new();
    let Some(file) = cid.and_then(|cid| transcript_file(&config, cid)) else {
        return Some(found);
    };
    let text = std::fs::File::open(&file).ok()?;
    let mut reader = std::io::BufReader::new(text);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(file = %file.display(), error = %e, "cannot read the CLI's transcript");
                return None;
            }
        }
        let Ok(l) = std::str::from_utf8(&line) else {
            continue;
        };
        for u in uuids {
            if found.contains(u) || !l.contains(u.as_str()) {
                continue;
            }
            // 2.1.x merges messages queued together into one entry: the last one's uuid,
            // the others in `mergedSendUuids`.
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(l)
                && v["type"] == "user"
                && (v["uuid"] == u.as_str()
                    || v["mergedSendUuids"]
                        .as_array()
                        .is_some_and(|m| m.iter().any(|m| m == u.as_str())))
            {
                found.insert(u.clone());
            }
        }
        if found.len() == uuids.len() {
            break;
        }
    }
    Some(found)
}

/// The running cost a CLI resuming conversation `cid` starts from: the `totalCostUSD` of
/// the transcript's last `cost-state` entry of that conversation. 2.1.330 and newer write
/// those entries and restore the last one at `--resume` (also with `--fork-session`), so
/// their `total_cost_usd` then goes on from it; older releases write none and start at 0
/// (measured on 1.0.128, 2.1.0, 2.1.121, 2.1.330 and 2.1.332: a turn, stop, resume, a
/// turn). 0 when there is no transcript or no entry. Blocking: call through `blocking`.
pub(crate) fn transcript_cost(spawn_env: &[(String, String)], cid: &str) -> f64 {
    use std::io::{BufRead, Read, Seek};
    /// Read from the end first: the entries follow each turn, so the last is near it.
    const TAIL: u64 = 1 << 20;
    let Some(file) = config_dir(spawn_env).and_then(|c| transcript_file(&c, cid)) else {
        return 0.0;
    };
    let last_in = |reader: &mut dyn BufRead| {
        let mut last = None;
        let mut line = Vec::new();
        while reader.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
            if line.windows(11).any(|w| w == b"\"cost-state")
                && let Ok(v) = serde_json::from_slice::<serde_json::Value>(&line)
                && v["type"] == "cost-state"
                && v["sessionId"].as_str().is_none_or(|s| s == cid)
                && let Some(total) = v["totalCostUSD"].as_f64().filter(|t| t.is_finite())
            {
                last = Some(total);
            }
            line.clear();
        }
        last
    };
    let Ok(mut f) = std::fs::File::open(&file) else {
        return 0.0;
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len > TAIL && f.seek(std::io::SeekFrom::Start(len - TAIL)).is_ok() {
        let mut tail = std::io::BufReader::new((&mut f).take(TAIL));
        // The first line may be cut: skipped (it does not parse, or is read whole below).
        if let Some(total) = last_in(&mut tail) {
            return total.max(0.0);
        }
        if f.rewind().is_err() {
            return 0.0;
        }
    }
    last_in(&mut std::io::BufReader::new(f)).map_or(0.0, |t| t.max(0.0))
}

/// Longest message id accepted to resume at.
pub const MESSAGE_ID_BYTES: usize = 128;

/// A message id to resume at: 1 to [`MESSAGE_ID_BYTES`] letters, digits, `-`, `_` (the
/// CLI's uuids and the API's `msg_...` ids), not starting with `-`.
pub(crate) fn validate_message_id(field: &str, id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= MESSAGE_ID_BYTES
        && !id.starts_with('-')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        return Ok(());
    }
    Err(Error::invalid(
        field,
        format!(
            "{} is not a message id (an AssistantBlock.message_id or a \
             UserMessage.message_id: letters, digits, `-`, `_`)",
            ostler_supervisor::options::shown(id)
        ),
    ))
}

/// The value `--resume-session-at` takes to cut CLI conversation `cid` after message `at`,
/// in what the release matches (`key`). Blocking (reads the transcript): call through
/// `blocking`. `at` is an entry's `uuid` or an assistant entry's API `message.id` (by
/// uuid: the last entry of that message, so the whole message is kept). Not in the
/// transcript: `NotFound`. No transcript or configuration to look in: `at` as given (the
/// CLI then decides).
pub(crate) fn resume_at_value(
    spawn_env: &[(String, String)],
    cid: &str,
    field: &str,
    at: &str,
    key: ResumeAtKey,
) -> Result<String> {
    let Some(Named {
        by_uuid,
        last_of_message,
        ..
    }) = entries_naming(spawn_env, cid, at)?
    else {
        return Ok(at.to_string());
    };
    let found = by_uuid.is_some() || last_of_message.is_some();
    if !found {
        return Err(Error::not_found(format!(
            "{field}: message {at} in the CLI's transcript of conversation {cid}"
        )));
    }
    match key {
        ResumeAtKey::Uuid => Ok(last_of_message.unwrap_or_else(|| at.to_string())),
        ResumeAtKey::MessageId => match by_uuid {
            None => Ok(at.to_string()),
            Some(v) if v["type"] == "assistant" => v["message"]["id"]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| Error::not_found(format!("{field}: the API id of message {at}"))),
            Some(_) => Err(Error::invalid(
                field,
                "this Claude Code release resumes only at an assistant message (give an \
                 AssistantBlock.message_id)",
            )),
        },
    }
}

/// `Ok` when the installed release takes `--resume-drops-turn` (measured: 2.1.330 and
/// later), else a `FailedPrecondition` naming the release, the flag and `field`; a release
/// never measured for it is refused too (an unknown flag would end its process at start).
pub(crate) fn check_drops_turn(inst: &Installation, field: &str) -> Result<()> {
    let flag = ostler_protocol::argv::RESUME_DROPS_TURN;
    match inst.capabilities.accepts_option(flag) {
        Some(true) => Ok(()),
        Some(false) => Err(Error::precondition(format!(
            "Claude Code {} cannot guard a cut ({field}: it has no `{flag}`, measured: see \
             docs/compatibility.md); use 2.1.330 or newer, or cut without the guard",
            inst.version
        ))),
        None => Err(Error::precondition(format!(
            "whether Claude Code {} has `{flag}` ({field}) was not measured \
             (docs/compatibility.md); use a pinned release",
            inst.version
        ))),
    }
}

/// The value `--resume-drops-turn` takes to guard a cut of CLI conversation `cid`: the
/// transcript uuid of the user message `turn` (ostler's `UserMessage.message_id` is the
/// uuid the CLI records it under). Blocking (reads the transcript): call through
/// `blocking`. Not in the transcript: `NotFound`; another kind of entry (an assistant
/// message): `InvalidArgument`. No transcript or configuration to look in: `turn` as given
/// (the CLI then decides).
pub(crate) fn drops_turn_value(
    spawn_env: &[(String, String)],
    cid: &str,
    field: &str,
    turn: &str,
) -> Result<String> {
    let Some(named) = entries_naming(spawn_env, cid, turn)? else {
        return Ok(turn.to_string());
    };
    let kind = match named.by_uuid {
        Some(v) => v["type"].as_str().map(str::to_string),
        None => named.of_message.then(|| "assistant".to_string()),
    };
    match kind.as_deref() {
        Some("user") => Ok(turn.to_string()),
        Some(other) => Err(Error::invalid(
            field,
            format!(
                "message {turn} is a {other} entry of the CLI's transcript: give the \
                 UserMessage.message_id that starts the turn to drop"
            ),
        )),
        None => Err(Error::not_found(format!(
            "{field}: message {turn} in the CLI's transcript of conversation {cid}"
        ))),
    }
}

/// The entries of CLI conversation `cid`'s transcript that name `id`.
struct Named {
    /// The last entry whose `uuid` is `id`.
    by_uuid: Option<serde_json::Value>,
    /// Whether an assistant entry's API `message.id` is `id`.
    of_message: bool,
    /// The `uuid` of the last such assistant entry (a message's blocks are entries of their
    /// own; the last one ends the message).
    last_of_message: Option<String>,
}

/// Reads CLI conversation `cid`'s transcript for the entries naming `id` (its `uuid`, or an
/// assistant entry's API `message.id`). Blocking. `None`: no configuration or transcript
/// to look in. Lines that are not JSON are skipped; a read error ends the scan.
fn entries_naming(spawn_env: &[(String, String)], cid: &str, id: &str) -> Result<Option<Named>> {
    let Some(file) = config_dir(spawn_env).and_then(|c| transcript_file(&c, cid)) else {
        return Ok(None);
    };
    let text = std::fs::File::open(&file)
        .map_err(|e| Error::Internal(format!("cannot read {}: {e}", file.display())))?;
    let mut named = Named {
        by_uuid: None,
        of_message: false,
        last_of_message: None,
    };
    for line in std::io::BufRead::lines(std::io::BufReader::new(text)) {
        let Ok(line) = line else { break };
        // Cheap test first: most lines do not mention the id at all.
        if !line.contains(id) {
            continue;
        }
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if v["uuid"] == id {
            named.by_uuid = Some(v);
        } else if v["type"] == "assistant" && v["message"]["id"] == id {
            named.of_message = true;
            if let Some(u) = v["uuid"].as_str() {
                named.last_of_message = Some(u.to_string());
            }
        }
    }
    Ok(Some(named))
}

/// Whether `<config>/projects/<any project>/<id>.jsonl` exists. `None`: no config directory
/// is known, so nothing can be said.
fn transcript_exists(config: &Path, id: &str) -> Option<bool> {
    // The CLI's session ids are uuids; anything else cannot name a file safely.
    Some(transcript_file(config, id).is_some())
}

/// Decides how to resume CLI conversation `claude_session_id` (blocking file system reads:
/// call through `blocking`). Missing transcript: `FailedPrecondition` explaining it, or
/// [`ResumePlan::Fresh`] when `fresh_if_missing`.
pub(crate) fn resume_plan(
    spawn_env: &[(String, String)],
    session_id: &str,
    claude_session_id: String,
    fresh_if_missing: bool,
) -> Result<ResumePlan> {
    let Some(config) = config_dir(spawn_env) else {
        return Ok(ResumePlan::Continue(claude_session_id));
    };
    if transcript_exists(&config, &claude_session_id) != Some(false) {
        return Ok(ResumePlan::Continue(claude_session_id));
    }
    if fresh_if_missing {
        return Ok(ResumePlan::Fresh {
            lost: claude_session_id,
        });
    }
    Err(Error::precondition(format!(
        "session {session_id:?} cannot be resumed: the CLI's transcript of conversation \
         {claude_session_id} is not under {}/projects (the CLI's home was wiped or changed, \
         or it ended before writing it), so the CLI would exit with \"No conversation \
         found\"; resume with fresh_conversation_if_missing to continue this session in a \
         new CLI conversation (the model's earlier context is lost)",
        config.display()
    )))
}

/// [`resume_plan`] for a session about to be resumed: the CLI session to `--resume`, or
/// `None` for a fresh conversation (the `context_lost` notice is then recorded first).
pub(crate) async fn resume_checked(
    spawn_env: &[(String, String)],
    entry: &SessionEntry,
    claude_session_id: Option<String>,
    opts: ResumeOptions,
) -> Result<Option<String>> {
    let Some(cid) = claude_session_id else {
        return Ok(None);
    };
    let env = spawn_env.to_vec();
    let sid = entry.id.to_string();
    let fresh = opts.fresh_if_missing;
    let plan = blocking(move || resume_plan(&env, &sid, cid, fresh)).await?;
    match plan {
        ResumePlan::Continue(c) => Ok(Some(c)),
        ResumePlan::Fresh { lost } if opts.fork => Err(Error::precondition(format!(
            "session {:?} cannot be forked: the CLI's transcript of conversation {lost} is \
             gone (resume without fork and with fresh_conversation_if_missing to continue in \
             a new conversation)",
            entry.id
        ))),
        ResumePlan::Fresh { lost } => {
            entry
                .hub
                .emit_one(EventPayload::EngineNotice(EngineNotice {
                    code: CONTEXT_LOST.into(),
                    message: format!(
                        "the CLI's transcript of conversation {lost} is gone: continuing in a \
                         new CLI conversation; the model's earlier context is lost (this \
                         session's event log is complete)"
                    ),
                    data: Some(serde_json::json!({ "lost_claude_session_id": lost })),
                }))
                .await?;
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pinned release as the recorded matrix describes it.
    fn inst(v: &str) -> Installation {
        Installation::assume(
            "/bin/false".into(),
            semver::Version::parse(v).expect("version"),
            None,
        )
    }

    /// ostler sends `rename_session` on its own only to a release measured to answer it
    /// (2.1.330 and later): not to 1.0.x to 2.1.0 (they leave it unanswered), nor 2.1.120
    /// and 2.1.121 (they refuse it as unsupported), nor a release never measured for it.
    #[test]
    fn rename_is_sent_only_where_measured_answered() {
        for v in ["2.1.330", "2.1.332"] {
            assert!(answers_rename(&inst(v)), "{v}");
        }
        for (v, measured) in [
            ("1.0.58", ControlSupport::NoAnswer),
            ("1.0.128", ControlSupport::NoAnswer),
            ("2.1.0", ControlSupport::NoAnswer),
            ("2.1.121", ControlSupport::Unsupported),
        ] {
            let i = inst(v);
            assert_eq!(
                i.capabilities.control_support("rename_session"),
                measured,
                "{v}"
            );
            assert!(!answers_rename(&i), "{v}");
        }
        let mut i = inst("2.1.332");
        i.capabilities.control.remove("rename_session");
        assert!(!answers_rename(&i), "never measured");
    }

    /// A guarded cut (`--resume-drops-turn`) is refused at once, naming the release and the
    /// flag, before 2.1.330 (measured) and where the flag was never measured; the guard's
    /// id must be a user entry of the transcript.
    #[test]
    fn a_guarded_cut_needs_the_flag_and_a_user_message() {
        for v in ["2.1.330", "2.1.332"] {
            check_drops_turn(&inst(v), "f").expect(v);
        }
        for v in ["1.0.58", "1.0.128", "2.1.0", "2.1.121"] {
            let e = check_drops_turn(&inst(v), "drops_turn_message_id").expect_err(v);
            assert!(matches!(e, Error::FailedPrecondition { .. }), "{v}: {e:?}");
            let text = e.to_string();
            for part in [v, "--resume-drops-turn", "drops_turn_message_id"] {
                assert!(text.contains(part), "{part:?} in {text}");
            }
        }
        let mut i = inst("2.1.332");
        i.capabilities.options.remove("--resume-drops-turn");
        let e = check_drops_turn(&i, "f").expect_err("never measured");
        assert!(e.to_string().contains("not measured"), "{e}");

        let dir = tempfile::tempdir().expect("tempdir");
        let env = vec![(
            "CLAUDE_CONFIG_DIR".to_string(),
            dir.path().to_string_lossy().into_owned(),
        )];
        let cid = "0b9d4a6e-1c2f-4a57-9a43-6f5e0d1c2b3a";
        let project = dir.path().join("projects/-w");
        std::fs::create_dir_all(&project).expect("project");
        std::fs::write(
            project.join(format!("{cid}.jsonl")),
            concat!(
                r#"{"type":"user","uuid":"u-1","message":{"role":"user","content":"hi"}}"#,
                "\n",
                r#"{"type":"assistant","uuid":"a-1","message":{"id":"msg_1","content":[]}}"#,
                "\n",
            ),
        )
        .expect("transcript");
        assert_eq!(
            drops_turn_value(&env, cid, "f", "u-1").expect("user"),
            "u-1"
        );
        for not_user in ["a-1", "msg_1"] {
            let e = drops_turn_value(&env, cid, "f", not_user).expect_err(not_user);
            assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
        }
        let e = drops_turn_value(&env, cid, "f", "u-9").expect_err("absent");
        assert!(matches!(e, Error::NotFound { .. }), "{e:?}");
    }

    #[test]
    fn transcript_is_found_in_any_project_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().to_string_lossy().into_owned();
        let env = vec![("HOME".to_string(), home.clone())];
        let id = "0b9d4a6e-1c2f-4a57-9a43-6f5e0d1c2b3a";
        let err = resume_plan(&env, "s1", id.into(), false).expect_err("no transcript");
        assert!(matches!(err, Error::FailedPrecondition { .. }), "{err:?}");
        assert!(err.to_string().contains("No conversation found"), "{err}");
        assert_eq!(
            resume_plan(&env, "s1", id.into(), true).expect("fresh"),
            ResumePlan::Fresh { lost: id.into() }
        );
        let project = dir.path().join(".claude/projects/-some-cwd");
        std::fs::create_dir_all(&project).expect("mkdir");
        std::fs::write(project.join(format!("{id}.jsonl")), "{}\n").expect("write");
        assert_eq!(
            resume_plan(&env, "s1", id.into(), false).expect("found"),
            ResumePlan::Continue(id.into())
        );
        // A path-like id never reaches the file system.
        assert!(resume_plan(&env, "s1", "../x".into(), false).is_err());
    }

    /// A HOME whose CLI transcript of one conversation holds `lines`: (the directory, the
    /// environment naming it, the conversation id).
    fn transcript_at_home(
        lines: &[&str],
    ) -> (tempfile::TempDir, Vec<(String, String)>, &'static str) {
        let dir = tempfile::tempdir().expect("tempdir");
        let env = vec![(
            "HOME".to_string(),
            dir.path().to_string_lossy().into_owned(),
        )];
        let id = "0b9d4a6e-1c2f-4a57-9a43-6f5e0d1c2b3a";
        let project = dir.path().join(".claude/projects/-w");
        std::fs::create_dir_all(&project).expect("mkdir");
        std::fs::write(project.join(format!("{id}.jsonl")), lines.join("\n")).expect("write");
        (dir, env, id)
    }

    /// The cost a resuming CLI starts from: the last `cost-state` of the conversation,
    /// found in a long transcript's tail or, when the tail has none, anywhere; 0 without.
    #[test]
    fn transcript_cost_is_the_last_cost_state_of_the_conversation() {
        let state = |id: &str, total: f64| {
            format!(r#"{{"type":"cost-state","sessionId":"{id}","totalCostUSD":{total}}}"#)
        };
        let id = "0b9d4a6e-1c2f-4a57-9a43-6f5e0d1c2b3a";
        let filler = format!(
            r#"{{"type":"user","message":{{"content":"{}"}}}}"#,
            "x".repeat(4000)
        );
        let (first, mine, other) = (state(id, 0.5), state(id, 1.25), state("other", 9.0));
        let (_dir, env, _) = transcript_at_home(&[&first, &filler, &mine, &other, "not json"]);
        assert_eq!(transcript_cost(&env, id), 1.25);
        // Past the tail read first (1 MiB): the entry before it is still found.
        let many: Vec<&str> = std::iter::once(first.as_str())
            .chain(std::iter::repeat_n(filler.as_str(), 400))
            .collect();
        let (_dir, env, _) = transcript_at_home(&many);
        assert_eq!(transcript_cost(&env, id), 0.5);
        let tail: Vec<&str> = many.iter().copied().chain([mine.as_str()]).collect();
        let (_dir, env, _) = transcript_at_home(&tail);
        assert_eq!(transcript_cost(&env, id), 1.25);
        let (_dir, env, _) = transcript_at_home(&[&filler]);
        assert_eq!(transcript_cost(&env, id), 0.0);
        assert_eq!(transcript_cost(&env, "no-such-conversation"), 0.0);
    }

    /// The transcript says which user messages the CLI took: by the uuid of a `user`
    /// entry; no transcript means none; no configuration directory means "cannot say".
    #[test]
    fn transcript_user_entries_by_uuid() {
        let (_dir, env, id) = transcript_at_home(&[
            r#"{"type":"queue-operation","operation":"enqueue","content":"u-2"}"#,
            r#"{"type":"user","uuid":"u-1","message":{"role":"user","content":"hi"}}"#,
            r#"{"type":"assistant","uuid":"a-1","parentUuid":"u-3","message":{"content":[]}}"#,
            "not json u-4",
            // 2.1.332: messages queued together, one entry (the last one's uuid).
            r#"{"type":"user","uuid":"u-7","mergedSendUuids":["u-5","u-6"],"message":{"role":"user","content":"a\nb\nc"}}"#,
            r#"{"type":"assistant","uuid":"a-2","mergedSendUuids":["u-8"],"message":{"content":[]}}"#,
        ]);
        let ids: Vec<String> = ["u-1", "u-2", "u-3", "u-4", "u-5", "u-6", "u-7", "u-8"]
            .map(String::from)
            .into();
        let found = transcript_user_entries(&env, Some(id), &ids).expect("a transcript");
        assert_eq!(
            found,
            ["u-1", "u-5", "u-6", "u-7"]
                .map(String::from)
                .into_iter()
                .collect()
        );
        let none = transcript_user_entries(&env, Some("other"), &ids).expect("no transcript");
        assert!(none.is_empty());
        assert!(
            transcript_user_entries(&env, None, &ids)
                .expect("no id")
                .is_empty()
        );
    }

    /// The message to resume at is looked up in the transcript and given in the release's
    /// dialect: by uuid the last entry of an API message, by message id only assistants.
    #[test]
    fn resume_at_is_translated_per_dialect() {
        let (_dir, env, id) = transcript_at_home(&[
            r#"{"type":"user","uuid":"u-1","message":{"role":"user","content":"hi"}}"#,
            r#"{"type":"assistant","uuid":"a-1","message":{"id":"msg_1","content":[]}}"#,
            r#"{"type":"assistant","uuid":"a-2","message":{"id":"msg_1","content":[]}}"#,
            r#"{"type":"assistant","uuid":"a-3","message":{"id":"msg_2","content":[]}}"#,
        ]);
        let at = |x: &str, k| resume_at_value(&env, id, "at", x, k);
        assert_eq!(at("msg_1", ResumeAtKey::Uuid).expect("by id"), "a-2");
        assert_eq!(at("a-1", ResumeAtKey::Uuid).expect("by uuid"), "a-1");
        assert_eq!(at("u-1", ResumeAtKey::Uuid).expect("a user entry"), "u-1");
        assert_eq!(at("msg_2", ResumeAtKey::MessageId).expect("id"), "msg_2");
        assert_eq!(at("a-2", ResumeAtKey::MessageId).expect("uuid"), "msg_1");
        let user = at("u-1", ResumeAtKey::MessageId).expect_err("user on message_id");
        assert!(matches!(user, Error::InvalidArgument { .. }), "{user:?}");
        let missing = at("msg_9", ResumeAtKey::Uuid).expect_err("absent");
        assert!(matches!(missing, Error::NotFound { .. }), "{missing:?}");
        assert!(validate_message_id("at", "msg_01ABC-x").is_ok());
        for bad in ["", "-x", "a/b", "a b", &"a".repeat(MESSAGE_ID_BYTES + 1)] {
            assert!(validate_message_id("at", bad).is_err(), "{bad:?}");
        }
    }

    /// A session's own `HOME` or `CLAUDE_CONFIG_DIR` is where its CLI keeps transcripts:
    /// the check looks there, not in the daemon's.
    #[test]
    fn session_environment_decides_where_the_transcript_is() {
        let daemon_home = tempfile::tempdir().expect("tempdir");
        let session_home = tempfile::tempdir().expect("tempdir");
        let config = tempfile::tempdir().expect("tempdir");
        let id = "0b9d4a6e-1c2f-4a57-9a43-6f5e0d1c2b3a";
        let put = |claude_dir: &Path| {
            let project = claude_dir.join("projects/-some-cwd");
            std::fs::create_dir_all(&project).expect("mkdir");
            std::fs::write(project.join(format!("{id}.jsonl")), "{}\n").expect("write");
        };
        put(&session_home.path().join(".claude"));
        let daemon = vec![(
            "HOME".to_string(),
            daemon_home.path().to_string_lossy().into_owned(),
        )];
        let mut opts = ostler_supervisor::CliOptions::default();
        // The daemon's HOME has no transcript.
        assert!(resume_plan(&session_env(&daemon, &opts), "s", id.into(), false).is_err());
        // The session's HOME has it.
        opts.env.insert(
            "HOME".into(),
            session_home.path().to_string_lossy().into_owned(),
        );
        assert_eq!(
            resume_plan(&session_env(&daemon, &opts), "s", id.into(), false).expect("found"),
            ResumePlan::Continue(id.into())
        );
        // CLAUDE_CONFIG_DIR wins over HOME: not there yet, then there.
        opts.env.insert(
            "CLAUDE_CONFIG_DIR".into(),
            config.path().to_string_lossy().into_owned(),
        );
        assert!(resume_plan(&session_env(&daemon, &opts), "s", id.into(), false).is_err());
        put(config.path());
        assert_eq!(
            resume_plan(&session_env(&daemon, &opts), "s", id.into(), false).expect("found"),
            ResumePlan::Continue(id.into())
        );
    }
}
