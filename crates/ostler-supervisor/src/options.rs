//! The CLI options of a session, in one serde-able struct: what `CreateSession` asks for,
//! what the engine records in the session's first event (`session_created`) and re-applies
//! on every resume, and what the session's command line is written from
//! (`session::spawn::session_args`).
//!
//! [`CliOptions::validate`] checks every field before anything is spawned (NUL bytes,
//! lengths, counts, shapes); [`CliOptions::unsupported_by`] names every option the
//! running release lacks (measured: `Capabilities::options`, from `contracts/compat/`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::compat::Capabilities;
pub use ostler_protocol::sdk_mcp::{ToolDecl, ToolServerDecl};

/// The options of one session's CLI process. Field names are the ones recorded in
/// `session_created` payloads since the first release of ostler (`allowed_tools`,
/// `append_system_prompt`, ...); every field defaults, so old payloads still read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CliOptions {
    /// `--model`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `--permission-mode`: `default`, `acceptEdits`, `plan`, `bypassPermissions`, ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permission_mode: Option<String>,
    /// `--allowedTools`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_tools: Vec<String>,
    /// `--disallowedTools`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub disallowed_tools: Vec<String>,
    /// `--system-prompt`: replaces the CLI's system prompt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    /// `--append-system-prompt`: appended to the CLI's (or the replaced) system prompt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub append_system_prompt: Option<String>,
    /// `--max-turns` (dropped with a warning on releases without it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u32>,
    /// MCP servers by name, passed as one `--mcp-config` JSON document.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub mcp_servers: BTreeMap<String, McpServer>,
    /// `--strict-mcp-config`: only the servers above, none from the CLI's own settings.
    #[serde(skip_serializing_if = "is_false")]
    pub strict_mcp_config: bool,
    /// Client-hosted tool servers (issue 11): `{"type":"sdk"}` entries of `--mcp-config`,
    /// served by the daemon (`ostler_protocol::sdk_mcp`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_servers: Vec<ToolServerDecl>,
    /// `--add-dir`: more directories the CLI's tools may use (absolute paths).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub add_dirs: Vec<String>,
    /// `--max-budget-usd`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_budget_usd: Option<f64>,
    /// `--max-thinking-tokens`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_thinking_tokens: Option<u32>,
    /// `--task-budget`: the model is told its remaining token budget for the task (sent
    /// as `output_config.task_budget`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_budget_tokens: Option<u32>,
    /// `--fallback-model`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback_model: Option<String>,
    /// `--settings`: an absolute path to a settings file, or inline JSON (an object).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settings: Option<String>,
    /// `--managed-settings`: settings at the CLI's policy tier (inline JSON, an object),
    /// above every user-controlled layer; the CLI keeps only what restricts (deny and ask
    /// rules, ...). At spawn the daemon's
    /// `sessions.managed_settings` is merged in ([`merge_managed_settings`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub managed_settings: Option<String>,
    /// `--setting-sources` (`user`, `project`, `local`), comma-joined.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub setting_sources: Vec<String>,
    /// `--setting-sources=` (empty): no filesystem settings (the Agent SDKs'
    /// `settingSources: []`); not with `setting_sources`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub no_setting_sources: bool,
    /// `--agents`: custom sub-agents, a JSON object (`{"name": {"description", "prompt",
    /// ...}}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agents: Option<String>,
    /// `--json-schema`: a JSON schema (an object) the final result must follow.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub json_schema: Option<String>,
    /// Environment variables for this session, set after the daemon's allowlist and
    /// `[sessions.env]` (they win). Values may be secrets: never logged, and
    /// [`CliOptions::redact`] hides them wherever options are shown.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Hooks answered by clients (issue 11): registered with the CLI in `initialize` at
    /// every spawn (create, resume), answered through `hook_callback`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<ostler_protocol::hooks::HookRegistration>,
    /// `--tools`: the built-in tools (`""` none, `default`, or names joined by commas).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<String>,
    /// `--agent`: the agent the main thread runs as.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// `--effort`: one of [`EFFORT_LEVELS`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effort: Option<String>,
    /// `--plugin-dir`, once per entry: plugin directories (absolute paths).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub plugin_dirs: Vec<String>,
    /// `--include-hook-events`: the CLI reports every hook it runs (`system/hook_started`,
    /// `hook_progress`, `hook_response`), not only SessionStart's.
    #[serde(skip_serializing_if = "is_false")]
    pub include_hook_events: bool,
    /// `--betas`, comma-joined: API beta headers to ask for (the CLI sends the ones the
    /// model takes, e.g. `context-1m-2025-08-07` with Sonnet 4.5).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub betas: Vec<String>,
    /// Not a flag: `promptSuggestions` in `initialize`; after each turn but the first the
    /// CLI writes the model's guess at the user's next prompt.
    #[serde(skip_serializing_if = "is_false")]
    pub prompt_suggestions: bool,
    /// Not a flag: `skills` in `initialize`: only these skills (a SKILL.md's `name` or
    /// directory, or `plugin:skill`) are listed to the model and usable; the session is
    /// allowed the Skill tool for each (`Skill(name)`), as the Agent SDKs do.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<String>,
    /// Not a flag: `skills: "all"` in `initialize`, and the Skill tool allowed.
    #[serde(skip_serializing_if = "is_false")]
    pub all_skills: bool,
    /// Not a flag: `planModeInstructions` in `initialize`: in plan mode this text replaces
    /// the CLI's own planning workflow in its plan-mode reminder.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan_mode_instructions: Option<String>,
    /// Not a flag: `toolAliases` in `initialize`: a tool call the model makes by one of
    /// these names runs the tool it maps to (one hop), e.g. `Bash` -> an MCP tool.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub tool_aliases: BTreeMap<String, String>,
    /// Not a flag: `excludeDynamicSections` in `initialize`: the per-session sections of
    /// the system prompt (working directory, environment, memory, ...) go in the first
    /// user message instead, so the system prompt is the same for every session.
    #[serde(skip_serializing_if = "is_false")]
    pub exclude_dynamic_sections: bool,
    /// Not a flag: `forwardSubagentText` in `initialize`: a foreground sub-agent's text
    /// and thinking are written too (with `parent_tool_use_id`), not only its tool calls
    /// and their results.
    #[serde(skip_serializing_if = "is_false")]
    pub forward_subagent_text: bool,
    /// Not a flag: `perTaskStopAffordance` in `initialize`: background tasks are stopped
    /// one at a time (`stop_task`), so an interrupt stops only the turn and spares them.
    #[serde(skip_serializing_if = "is_false")]
    pub per_task_stop_affordance: bool,
    /// Not a flag: `agentProgressSummaries` in `initialize`: a running sub-agent's
    /// conversation is summed up every ~30 s (one model request each) in a short line,
    /// sent as `task_progress`'s `summary`.
    #[serde(skip_serializing_if = "is_false")]
    pub agent_progress_summaries: bool,
    /// Not a flag: `supportedDialogKinds` in `initialize`: the kinds of dialog the CLI may
    /// ask the host (its `request_user_dialog` control request, e.g.
    /// `refusal_fallback_prompt`); only a declared kind is ever asked. Empty: not sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dialog_kinds: Vec<String>,
    /// Not a flag: `CLAUDE_CODE_QUESTION_PREVIEW_FORMAT` in the CLI's environment (the
    /// Agent SDKs' `toolConfig.askUserQuestion.previewFormat`): one of
    /// [`QUESTION_PREVIEW_FORMATS`]; AskUserQuestion's options may carry a `preview` in
    /// that format (the tool's description tells the model how to write one). `None`: not
    /// set (2.1.332 as ostler runs it then offers no previews).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question_preview_format: Option<String>,
    /// Not a flag: `CLAUDE_CODE_QUESTION_EXTENDED=1` (`extendedQuestions`): AskUserQuestion
    /// also asks free-text and number questions (`kind`), with a form `title`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub question_extended: bool,
    /// Not a flag: `CLAUDE_CODE_QUESTION_OPTIONAL_DESCRIPTIONS=1`
    /// (`optionalDescriptions`): an AskUserQuestion option's `description` is optional.
    #[serde(default, skip_serializing_if = "is_false")]
    pub question_optional_descriptions: bool,
    /// `--permission-prompts`: `host` (ostler's clients answer, the default) or `none`
    /// (anything that would prompt is denied at once and the model is told).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permission_prompts: Option<String>,
    /// `--thinking`: one of [`THINKING_MODES`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    /// `--thinking-display`: one of [`THINKING_DISPLAYS`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking_display: Option<String>,
    /// Not a flag: the engine answers every elicitation (an MCP server's request for the
    /// user's input) `decline` at once instead of asking the clients.
    #[serde(skip_serializing_if = "is_false")]
    pub decline_elicitations: bool,
    /// Not a flag: the engine sends every user message of the session with
    /// `client_composed` (the Agent SDKs' `verbatimPrompts`): the CLI delivers its text as
    /// written, with no `@path` expansion and no slash-command dispatch.
    #[serde(skip_serializing_if = "is_false")]
    pub verbatim_prompts: bool,
    /// `--allow-dangerously-skip-permissions` (the Agent SDKs'
    /// `allowDangerouslySkipPermissions`): the session may be switched to
    /// `bypassPermissions` later (`set_permission_mode`), whatever mode it starts in. As
    /// root the CLI refuses to start with it unless the session's environment has
    /// `IS_SANDBOX=1`.
    #[serde(skip_serializing_if = "is_false")]
    pub allow_dangerously_skip_permissions: bool,
    /// `--project-config-root` (the Agent SDKs' `projectConfigRoot`): the trusted checkout
    /// the working directory is a worktree of (an absolute path, made canonical by the
    /// engine at create). The project's settings, `.mcp.json`, the `.claude` trees and
    /// `CLAUDE_PROJECT_DIR` come from there instead of from the working directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_config_root: Option<String>,
    /// The CLI's debug log (the Agent SDKs' `debug` / `debugFile`): `--debug-file` into
    /// [`Self::debug_file`], which the daemon chooses (never a client). Recorded with the
    /// session, so every resume logs again (appended to the same file).
    #[serde(default, skip_serializing_if = "is_false")]
    pub debug: bool,
    /// `--debug=<filter>` (with `debug` only): the CLI's category filter, comma-separated
    /// categories all included (`api,hooks`) or all excluded (`!statsig,!file`); see
    /// [`check_debug_filter`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debug_filter: Option<String>,
    /// `--debug-file <path>`: where the CLI writes its debug log (with `debug`). Set by the
    /// engine at every spawn (a file named by the session id in the daemon's debug
    /// directory); never recorded nor taken from a client. `None` with `debug`: plain
    /// `--debug` (the CLI's own default file).
    #[serde(skip)]
    pub debug_file: Option<String>,
}

/// Longest `debug_filter`.
pub const DEBUG_FILTER_BYTES: usize = 512;

/// A `debug_filter` the CLI honours: 1 to 32 comma-separated categories, each 1-64 of
/// `[A-Za-z0-9._-]` (a category is the lowercased text before a log line's first `:`, or
/// an MCP server's name), either all plain (only these) or all prefixed with `!` (all but
/// these). The CLI silently ignores a filter that mixes the two (2.1.332's parser), so
/// that is refused here.
pub fn check_debug_filter(f: &str) -> Result<(), InvalidOption> {
    const FIELD: &str = "debug_filter";
    if f.len() > DEBUG_FILTER_BYTES {
        return Err(bad(
            FIELD,
            format!("is {} bytes; at most {DEBUG_FILTER_BYTES}", f.len()),
        ));
    }
    let items: Vec<&str> = f.split(',').map(str::trim).collect();
    if items.len() > 32 {
        return Err(bad(FIELD, "has more than 32 categories"));
    }
    let mut excluded = 0;
    for item in &items {
        let name = item.strip_prefix('!').unwrap_or(item);
        if item.starts_with('!') {
            excluded += 1;
        }
        let ok = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !ok {
            return Err(bad(
                FIELD,
                format!(
                    "{} is not a category (1-64 of [A-Za-z0-9._-], optionally after '!')",
                    shown(item)
                ),
            ));
        }
    }
    if excluded != 0 && excluded != items.len() {
        return Err(bad(
            FIELD,
            format!(
                "{} mixes included and excluded ('!') categories, which the CLI ignores; \
                 use either kind only",
                shown(f)
            ),
        ));
    }
    Ok(())
}

/// The levels `--effort` takes (2.1.332's help, the TypeScript Agent SDK 0.3.332's
/// `EffortLevel`).
pub const EFFORT_LEVELS: [&str; 5] = ["low", "medium", "high", "xhigh", "max"];

/// The values `--permission-prompts` takes (2.1.332's help).
pub const PERMISSION_PROMPTS: [&str; 2] = ["host", "none"];

/// The modes `--thinking` takes (2.1.332's choices; `enabled` is `adaptive` there).
pub const THINKING_MODES: [&str; 3] = ["adaptive", "enabled", "disabled"];

/// The values `question_preview_format` takes (`CLAUDE_CODE_QUESTION_PREVIEW_FORMAT`;
/// 2.1.332 ignores any other value).
pub const QUESTION_PREVIEW_FORMATS: [&str; 2] = ["markdown", "html"];

/// The variables of the CLI's environment the AskUserQuestion options set, each with its
/// option's field name (see [`CliOptions::question_env`]).
pub const QUESTION_ENV: [(&str, &str); 3] = [
    (
        "CLAUDE_CODE_QUESTION_PREVIEW_FORMAT",
        "question_preview_format",
    ),
    ("CLAUDE_CODE_QUESTION_EXTENDED", "question_extended"),
    (
        "CLAUDE_CODE_QUESTION_OPTIONAL_DESCRIPTIONS",
        "question_optional_descriptions",
    ),
];

/// The values `--thinking-display` takes on every release that has it (2.1.120 and
/// 2.1.332; 2.1.330+ also take `highlights`).
pub const THINKING_DISPLAYS: [&str; 2] = ["summarized", "omitted"];

fn is_false(b: &bool) -> bool {
    !*b
}

/// One MCP server, serialized the way the CLI's `--mcp-config` takes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum McpServer {
    /// A process speaking MCP over stdio.
    Stdio {
        command: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        args: Vec<String>,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        env: BTreeMap<String, String>,
        #[serde(flatten)]
        tuning: McpTuning,
    },
    /// Streamable HTTP.
    Http {
        url: String,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        headers: BTreeMap<String, String>,
        #[serde(flatten)]
        tuning: McpTuning,
    },
    /// Server-sent events.
    Sse {
        url: String,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        headers: BTreeMap<String, String>,
        #[serde(flatten)]
        tuning: McpTuning,
    },
}

impl McpServer {
    /// The keys of the CLI's config this server type takes (`type` included): what
    /// [`McpServer`] holds, so that no other key is dropped unseen.
    pub fn known_keys(server_type: &str) -> &'static [&'static str] {
        match server_type {
            "stdio" => &["type", "command", "args", "env", "timeout", "alwaysLoad"],
            _ => &["type", "url", "headers", "timeout", "alwaysLoad", "tools"],
        }
    }

    /// The per-server settings every transport shares.
    pub fn tuning(&self) -> &McpTuning {
        match self {
            McpServer::Stdio { tuning, .. }
            | McpServer::Http { tuning, .. }
            | McpServer::Sse { tuning, .. } => tuning,
        }
    }
}

/// What the CLI's MCP server configs take besides the transport (measured in 2.1.332's
/// config schema; the Agent SDKs' `McpStdioServerConfig`/`McpHttpServerConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpTuning {
    /// `timeout`: the per-server tool-call timeout in milliseconds (the CLI ignores values
    /// below 1000; overrides `MCP_TOOL_TIMEOUT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    /// `alwaysLoad`: true keeps every tool of the server in the prompt (never deferred
    /// behind tool search), false defers them all.
    #[serde(
        default,
        rename = "alwaysLoad",
        skip_serializing_if = "Option::is_none"
    )]
    pub always_load: Option<bool>,
    /// `tools`: per-tool permission policies (http and sse servers only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<McpToolPolicy>,
}

/// One entry of an MCP server's `tools`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpToolPolicy {
    /// The tool's name as the server lists it.
    pub name: String,
    /// `always_allow`, `always_ask` (asks even under allow rules or `bypassPermissions`)
    /// or `always_deny`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permission_policy: Option<String>,
    /// An organisation's ceiling: `allow`, `ask` or `blocked`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub org_max_permission: Option<String>,
}

/// `McpToolPolicy::permission_policy`'s values.
pub const MCP_TOOL_POLICIES: [&str; 3] = ["always_allow", "always_ask", "always_deny"];
/// `McpToolPolicy::org_max_permission`'s values.
pub const MCP_TOOL_CEILINGS: [&str; 3] = ["allow", "ask", "blocked"];

/// Limits of [`CliOptions::validate`].
pub mod limits {
    /// A prompt (`system_prompt`, `append_system_prompt`): one command-line argument (the
    /// kernel's cap per argument is 128 KiB).
    pub const PROMPT_BYTES: usize = 100 * 1024;
    /// A JSON document on the command line (`settings`, `agents`, `json_schema`, the MCP
    /// configuration).
    pub const JSON_BYTES: usize = 100 * 1024;
    /// A model name (`model`, `fallback_model`).
    pub const MODEL_BYTES: usize = 256;
    /// A path, a command, a URL.
    pub const PATH_BYTES: usize = 4096;
    /// Entries of `allowed_tools` / `disallowed_tools`.
    pub const TOOLS: usize = 256;
    /// One tool rule.
    pub const TOOL_BYTES: usize = 1024;
    /// `plugin_dirs` entries.
    pub const PLUGIN_DIRS: usize = 16;
    /// `betas` entries, and the bytes of one.
    pub const BETAS: usize = 16;
    pub const BETA_BYTES: usize = 64;
    /// `tool_aliases` entries.
    pub const TOOL_ALIASES: usize = 64;
    /// A tool name (`tool_aliases`).
    pub const TOOL_NAME_BYTES: usize = 128;
    /// `skills` entries, and the bytes of one.
    pub const SKILLS: usize = 128;
    pub const SKILL_BYTES: usize = 128;
    /// `dialog_kinds` entries, and the bytes of one.
    pub const DIALOG_KINDS: usize = 16;
    pub const DIALOG_KIND_BYTES: usize = 64;
    /// `add_dirs` entries.
    pub const ADD_DIRS: usize = 64;
    /// MCP servers of a session.
    pub const MCP_SERVERS: usize = 32;
    /// An MCP server's name.
    pub const MCP_NAME_BYTES: usize = 64;
    /// An MCP server's tool-call `timeout`: a day, in milliseconds.
    pub const MCP_TIMEOUT_MS: u64 = 24 * 3600 * 1000;
    /// Arguments of an MCP stdio server.
    pub const MCP_ARGS: usize = 256;
    /// Environment variables or headers of one MCP server; variables of `env`.
    pub const VARS: usize = 64;
    /// One variable or header value.
    pub const VALUE_BYTES: usize = 32 * 1024;
    /// Client-hosted tool servers of a session.
    pub const TOOL_SERVERS: usize = 16;
    /// Tools of one tool server.
    pub const TOOLS_PER_SERVER: usize = 64;
    /// A tool's input schema or description.
    pub const TOOL_SCHEMA_BYTES: usize = 64 * 1024;
    /// A tool call's wait for a client's answer.
    pub const TOOL_TIMEOUT_SECS: u32 = 3600;
    /// Everything on the command line together.
    pub const ARGV_TOTAL_BYTES: usize = 256 * 1024;
    /// The per-session environment together.
    pub const ENV_TOTAL_BYTES: usize = 128 * 1024;
}

/// The setting sources the CLI knows.
pub const SETTING_SOURCES: [&str; 3] = ["user", "project", "local"];

/// A field of [`CliOptions`] that is refused, and why (the message shows at most ~200
/// characters of the value).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct InvalidOption {
    /// The field's name as clients write it (`mcp_servers["x"].url`, `env["A B"]`).
    pub field: String,
    pub message: String,
}

fn bad(field: impl Into<String>, message: impl Into<String>) -> InvalidOption {
    InvalidOption {
        field: field.into(),
        message: message.into(),
    }
}

/// `s` quoted, cut to about 200 characters.
pub fn shown(s: &str) -> String {
    const MAX: usize = 200;
    if s.chars().count() <= MAX {
        return format!("{s:?}");
    }
    let head: String = s.chars().take(MAX).collect();
    format!("{head:?}... ({} bytes)", s.len())
}

/// Length and NUL check.
fn text(field: &str, v: &str, max: usize) -> Result<(), InvalidOption> {
    if v.len() > max {
        return Err(bad(
            field,
            format!("is {} bytes long; at most {max} are allowed", v.len()),
        ));
    }
    if let Some(i) = v.find('\0') {
        return Err(bad(field, format!("contains a NUL byte (at byte {i})")));
    }
    Ok(())
}

/// A value that goes on the command line after a flag: bounded, no NUL, not empty, not
/// read as an option.
fn arg(field: &str, v: &str, max: usize) -> Result<(), InvalidOption> {
    text(field, v, max)?;
    if v.trim().is_empty() {
        return Err(bad(field, "is empty"));
    }
    if v.starts_with('-') {
        return Err(bad(
            field,
            format!(
                "{} starts with '-' (it would be read as an option)",
                shown(v)
            ),
        ));
    }
    Ok(())
}

/// A model a running session is switched to (`SetModel`, `apply_flag_settings`): the checks
/// of `--model` at spawn, so that the session can be resumed with it.
pub fn check_model(v: &str) -> Result<(), InvalidOption> {
    arg("model", v, limits::MODEL_BYTES)
}

fn json_object(field: &str, v: &str) -> Result<(), InvalidOption> {
    arg(field, v, limits::JSON_BYTES)?;
    match serde_json::from_str::<serde_json::Value>(v) {
        Ok(serde_json::Value::Object(_)) => Ok(()),
        Ok(_) => Err(bad(field, "must be a JSON object")),
        Err(e) => Err(bad(field, format!("is not valid JSON: {e}"))),
    }
}

/// The managed settings a session runs with: the daemon's (`sessions.managed_settings`)
/// and the session's own, merged so that the daemon's policy holds. Objects merge key by
/// key, lists are joined (the daemon's entries first, none twice), and where both set a
/// value that is neither, the daemon's wins. `None` when neither sets any.
pub fn merge_managed_settings(
    daemon: Option<&serde_json::Map<String, serde_json::Value>>,
    session: Option<&str>,
) -> Option<String> {
    use serde_json::Value;
    fn merge(into: &mut Value, from: Value) {
        match (into, from) {
            (Value::Object(a), Value::Object(b)) => {
                for (k, v) in b {
                    match a.get_mut(&k) {
                        Some(mine) => merge(mine, v),
                        None => {
                            a.insert(k, v);
                        }
                    }
                }
            }
            (Value::Array(a), Value::Array(b)) => {
                for v in b {
                    if !a.contains(&v) {
                        a.push(v);
                    }
                }
            }
            // The daemon's value stands.
            _ => {}
        }
    }
    let session = session.and_then(|s| serde_json::from_str::<Value>(s).ok());
    match (daemon, session) {
        (None, None) => None,
        (None, Some(s)) => Some(s.to_string()),
        (Some(d), s) => {
            let mut out = Value::Object(d.clone());
            if let Some(s) = s {
                merge(&mut out, s);
            }
            Some(out.to_string())
        }
    }
}

/// A list of names (`betas`, `skills`): at most `max.0`, each an argument of at most
/// `max.1` bytes made of bytes `ok` accepts (else `what` says what a name is), none named
/// twice. Returns the bytes they add to the command line.
fn names(
    field: &str,
    list: &[String],
    max: (usize, usize),
    ok: fn(u8) -> bool,
    what: &str,
) -> Result<usize, InvalidOption> {
    count(field, list.len(), max.0)?;
    let mut bytes = 0;
    for (i, n) in list.iter().enumerate() {
        let f = format!("{field}[{i}]");
        arg(&f, n, max.1)?;
        if !n.bytes().all(ok) {
            return Err(bad(f, format!("{} is not {what}", shown(n))));
        }
        if list[..i].contains(n) {
            return Err(bad(f, format!("{} is named twice", shown(n))));
        }
        bytes += n.len() + 1;
    }
    Ok(bytes)
}

fn count(field: &str, n: usize, max: usize) -> Result<(), InvalidOption> {
    if n > max {
        return Err(bad(
            field,
            format!("has {n} entries; at most {max} are allowed"),
        ));
    }
    Ok(())
}

fn var_name(field: &str, name: &str) -> Result<(), InvalidOption> {
    crate::env::validate_name(name).map_err(|e| {
        let e = match e {
            crate::env::EnvNameError::Invalid(_) => format!(
                "{} is not a variable name (letters, digits and `_`, not starting with a digit)",
                shown(name)
            ),
            other => other.to_string(),
        };
        bad(field, e)
    })
}

impl CliOptions {
    /// Checks every field (no I/O: whether paths exist is the caller's business).
    pub fn validate(&self) -> Result<(), InvalidOption> {
        let mut argv = 0usize;
        for (field, v, max) in [
            ("model", &self.model, limits::MODEL_BYTES),
            ("fallback_model", &self.fallback_model, limits::MODEL_BYTES),
            ("agent", &self.agent, limits::MODEL_BYTES),
            (
                "permission_mode",
                &self.permission_mode,
                limits::MODEL_BYTES,
            ),
        ] {
            if let Some(v) = v {
                arg(field, v, max)?;
                argv += v.len() + 1;
            }
        }
        // Releases before 2.1 exit at start on this (and then at every resume).
        if let (Some(m), Some(f)) = (&self.model, &self.fallback_model)
            && m.trim() == f.trim()
        {
            return Err(bad(
                "fallback_model",
                "is the same as model; a fallback must be another model (or leave it unset)",
            ));
        }
        for (field, v) in [
            ("system_prompt", &self.system_prompt),
            ("append_system_prompt", &self.append_system_prompt),
        ] {
            if let Some(v) = v {
                text(field, v, limits::PROMPT_BYTES)?;
                argv += v.len() + 1;
            }
        }
        if let Some(t) = &self.tools {
            // "" (none) is a value here, unlike elsewhere.
            text("tools", t, limits::TOOLS * limits::TOOL_BYTES)?;
            if t.starts_with('-') {
                return Err(bad(
                    "tools",
                    format!(
                        "{} starts with '-' (it would be read as an option)",
                        shown(t)
                    ),
                ));
            }
            argv += t.len() + 1;
        }
        for (field, v, allowed, what) in [
            ("effort", &self.effort, &EFFORT_LEVELS[..], "a level"),
            (
                "permission_prompts",
                &self.permission_prompts,
                &PERMISSION_PROMPTS[..],
                "a target",
            ),
            ("thinking", &self.thinking, &THINKING_MODES[..], "a mode"),
            (
                "thinking_display",
                &self.thinking_display,
                &THINKING_DISPLAYS[..],
                "a display",
            ),
            (
                "question_preview_format",
                &self.question_preview_format,
                &QUESTION_PREVIEW_FORMATS[..],
                "a preview format",
            ),
        ] {
            if let Some(v) = v
                && !allowed.contains(&v.as_str())
            {
                return Err(bad(
                    field,
                    format!("{} is not {what} (one of {})", shown(v), allowed.join(", ")),
                ));
            }
        }
        if self.max_turns == Some(0) {
            return Err(bad(
                "max_turns",
                "must be at least 1 (leave it unset for no limit)",
            ));
        }
        for (field, tools) in [
            ("allowed_tools", &self.allowed_tools),
            ("disallowed_tools", &self.disallowed_tools),
        ] {
            count(field, tools.len(), limits::TOOLS)?;
            for (i, t) in tools.iter().enumerate() {
                arg(&format!("{field}[{i}]"), t, limits::TOOL_BYTES)?;
                argv += t.len() + 1;
            }
        }
        count("add_dirs", self.add_dirs.len(), limits::ADD_DIRS)?;
        count("plugin_dirs", self.plugin_dirs.len(), limits::PLUGIN_DIRS)?;
        for (field, dirs) in [
            ("add_dirs", &self.add_dirs),
            ("plugin_dirs", &self.plugin_dirs),
        ] {
            for (i, d) in dirs.iter().enumerate() {
                let f = format!("{field}[{i}]");
                arg(&f, d, limits::PATH_BYTES)?;
                if !d.starts_with('/') {
                    return Err(bad(f, format!("{} is not an absolute path", shown(d))));
                }
                argv += d.len() + 1;
            }
        }
        if let Some(f) = &self.debug_filter {
            if !self.debug {
                return Err(bad("debug_filter", "needs debug"));
            }
            check_debug_filter(f)?;
            argv += f.len() + 9;
        }
        if let Some(d) = &self.project_config_root {
            arg("project_config_root", d, limits::PATH_BYTES)?;
            if !d.starts_with('/') {
                return Err(bad(
                    "project_config_root",
                    format!("{} is not an absolute path", shown(d)),
                ));
            }
            argv += d.len() + 1;
        }
        argv += names(
            "betas",
            &self.betas,
            (limits::BETAS, limits::BETA_BYTES),
            |c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-',
            "a beta name (lower-case letters, digits and '-', e.g. \"context-1m-2025-08-07\")",
        )?;
        // Each also goes on the command line as `Skill(name)`.
        argv += names(
            "skills",
            &self.skills,
            (limits::SKILLS, limits::SKILL_BYTES),
            |c| c.is_ascii_alphanumeric() || b"-_.:".contains(&c),
            "a skill name (letters, digits, '-', '_', '.', ':', e.g. \"pdf\" or \"docs:pdf\")",
        )? + 7 * self.skills.len();
        // Not on the command line (`initialize`).
        names(
            "dialog_kinds",
            &self.dialog_kinds,
            (limits::DIALOG_KINDS, limits::DIALOG_KIND_BYTES),
            |c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_',
            "a dialog kind (lower-case letters, digits and '_', e.g. \"refusal_fallback_prompt\")",
        )?;
        if self.all_skills && !self.skills.is_empty() {
            return Err(bad(
                "all_skills",
                "cannot go with skills (all_skills enables every skill; skills only those listed)",
            ));
        }
        if let Some(p) = &self.plan_mode_instructions {
            text("plan_mode_instructions", p, limits::PROMPT_BYTES)?;
        }
        count(
            "tool_aliases",
            self.tool_aliases.len(),
            limits::TOOL_ALIASES,
        )?;
        for (from, to) in &self.tool_aliases {
            let f = format!("tool_aliases[{}]", shown(from));
            for name in [from, to] {
                arg(&f, name, limits::TOOL_NAME_BYTES)?;
                if !name
                    .bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
                {
                    return Err(bad(
                        f,
                        format!(
                            "{} is not a tool name (letters, digits, '_' and '-', e.g. \"Bash\" or \"mcp__box__bash\")",
                            shown(name)
                        ),
                    ));
                }
            }
            if from == to {
                return Err(bad(f, "maps a tool to itself"));
            }
        }
        if let Some(b) = self.max_budget_usd
            && !(b.is_finite() && b > 0.0 && b <= 1_000_000.0)
        {
            return Err(bad(
                "max_budget_usd",
                format!("{b:?} is not a budget (more than 0, at most 1000000 USD)"),
            ));
        }
        if self.task_budget_tokens == Some(0) {
            return Err(bad(
                "task_budget_tokens",
                "must be at least 1 (leave it unset for no budget)",
            ));
        }
        if self.max_thinking_tokens == Some(0) {
            return Err(bad(
                "max_thinking_tokens",
                "must be at least 1 (leave it unset for the CLI's default)",
            ));
        }
        if let Some(s) = &self.settings {
            if s.trim_start().starts_with('{') {
                json_object("settings", s)?;
            } else {
                arg("settings", s, limits::PATH_BYTES)?;
                if !s.starts_with('/') {
                    return Err(bad(
                        "settings",
                        format!(
                            "{} is neither inline JSON (an object) nor an absolute path",
                            shown(s)
                        ),
                    ));
                }
            }
            argv += s.len() + 1;
        }
        if let Some(m) = &self.managed_settings {
            json_object("managed_settings", m)?;
            argv += m.len() + 1;
        }
        count(
            "setting_sources",
            self.setting_sources.len(),
            SETTING_SOURCES.len(),
        )?;
        if self.no_setting_sources && !self.setting_sources.is_empty() {
            return Err(bad(
                "no_setting_sources",
                "no_setting_sources loads no setting source; leave setting_sources empty \
                 with it",
            ));
        }
        for (i, s) in self.setting_sources.iter().enumerate() {
            if !SETTING_SOURCES.contains(&s.as_str()) {
                return Err(bad(
                    format!("setting_sources[{i}]"),
                    format!(
                        "{} is not a setting source (known: {SETTING_SOURCES:?})",
                        shown(s)
                    ),
                ));
            }
            if self.setting_sources[..i].contains(s) {
                return Err(bad(
                    format!("setting_sources[{i}]"),
                    format!("{s:?} is repeated"),
                ));
            }
        }
        for (field, v) in [("agents", &self.agents), ("json_schema", &self.json_schema)] {
            if let Some(v) = v {
                json_object(field, v)?;
                argv += v.len() + 1;
            }
        }
        if let Some(js) = &self.json_schema
            && let Ok(schema) = serde_json::from_str::<serde_json::Value>(js)
        {
            check_json_schema("json_schema", &schema, 0)?;
        }
        if let Some(a) = &self.agents
            && let Ok(serde_json::Value::Object(m)) = serde_json::from_str(a)
        {
            for (name, def) in m {
                let f = format!("agents[{}]", shown(&name));
                let ok = def.get("description").is_some_and(|d| d.is_string())
                    && def.get("prompt").is_some_and(|p| p.is_string());
                if !ok {
                    return Err(bad(
                        f,
                        "an agent needs a string `description` and a string `prompt`",
                    ));
                }
                // The fields the CLI reads with a shape of their own (it exits at start on
                // another shape, and again at every resume).
                for key in ["tools", "disallowedTools"] {
                    if let Some(v) = def.get(key)
                        && !v
                            .as_array()
                            .is_some_and(|a| a.iter().all(serde_json::Value::is_string))
                    {
                        return Err(bad(
                            format!("{f}.{key}"),
                            "is a list of tool names (strings)",
                        ));
                    }
                }
                if let Some(v) = def.get("model")
                    && !v.is_string()
                {
                    return Err(bad(format!("{f}.model"), "is a model name (a string)"));
                }
            }
        }
        self.validate_mcp()?;
        self.validate_hooks()?;
        self.validate_tool_servers()?;
        if let Some(c) = self.mcp_config_json() {
            if c.len() > limits::JSON_BYTES {
                return Err(bad(
                    "mcp_servers",
                    format!(
                        "come to {} bytes of JSON; at most {} are allowed",
                        c.len(),
                        limits::JSON_BYTES
                    ),
                ));
            }
            argv += c.len() + 1;
        }
        if argv > limits::ARGV_TOTAL_BYTES {
            return Err(bad(
                "options",
                format!(
                    "the options come to {argv} bytes on the CLI's command line; at most {} \
                     are allowed together",
                    limits::ARGV_TOTAL_BYTES
                ),
            ));
        }
        count("env", self.env.len(), limits::VARS)?;
        let mut env_total = 0;
        for (k, v) in &self.env {
            var_name("env", k)?;
            // The value is never shown: it may be a secret.
            text(&format!("env[{k}]"), v, limits::VALUE_BYTES)?;
            env_total += k.len() + v.len() + 2;
        }
        // A question option and the session's own variable of the same name would fight
        // over one variable: refused when they differ (the same value is harmless).
        for (var, value, field) in self.question_env() {
            if let Some(mine) = self.env.get(var)
                && *mine != value
            {
                return Err(bad(
                    format!("env[{var}]"),
                    format!(
                        "contradicts {field} (which sets {var}={value}); set {field} only, \
                         or leave {var} out of env"
                    ),
                ));
            }
        }
        if env_total > limits::ENV_TOTAL_BYTES {
            return Err(bad(
                "env",
                format!(
                    "comes to {env_total} bytes; at most {} are allowed",
                    limits::ENV_TOTAL_BYTES
                ),
            ));
        }
        Ok(())
    }

    /// The CLI's environment variables the AskUserQuestion options set, as (variable,
    /// value, option field): none for options left unset.
    pub fn question_env(&self) -> Vec<(&'static str, String, &'static str)> {
        let [preview, extended, optional] = QUESTION_ENV;
        let mut v = Vec::new();
        if let Some(f) = &self.question_preview_format {
            v.push((preview.0, f.clone(), preview.1));
        }
        if self.question_extended {
            v.push((extended.0, "1".to_string(), extended.1));
        }
        if self.question_optional_descriptions {
            v.push((optional.0, "1".to_string(), optional.1));
        }
        v
    }

    /// `--allowedTools`: `allowed_tools`, and the Skill tool for the skills the session
    /// enables (`Skill` with `all_skills`, `Skill(name)` for each of `skills`) where not
    /// listed already.
    pub fn allowed_tools_with_skills(&self) -> Vec<String> {
        let mut tools = self.allowed_tools.clone();
        let skill_rules: Vec<String> = if self.all_skills {
            vec!["Skill".to_string()]
        } else {
            self.skills.iter().map(|n| format!("Skill({n})")).collect()
        };
        for r in skill_rules {
            if !tools.contains(&r) {
                tools.push(r);
            }
        }
        tools
    }

    /// `skills` for `initialize`: `"all"`, the names, or `None` (the CLI's default).
    pub fn skills_field(&self) -> Option<serde_json::Value> {
        if self.all_skills {
            Some("all".into())
        } else if self.skills.is_empty() {
            None
        } else {
            Some(serde_json::json!(self.skills))
        }
    }

    /// The hook registrations (ids, events, timeouts, defaults; see
    /// `ostler_protocol::hooks::validate_registrations`).
    pub fn validate_hooks(&self) -> Result<(), InvalidOption> {
        ostler_protocol::hooks::validate_registrations("hooks", &self.hooks)
            .map_err(|e| bad(e.field, e.message))
    }

    fn validate_mcp(&self) -> Result<(), InvalidOption> {
        validate_mcp_servers("mcp_servers", &self.mcp_servers)
    }

    /// The `--mcp-config` document (`{"mcpServers": {...}}`), when there are servers; tool
    /// servers are `{"type":"sdk","name":...}` entries.
    pub fn mcp_config_json(&self) -> Option<String> {
        if self.mcp_servers.is_empty() && self.tool_servers.is_empty() {
            return None;
        }
        let mut servers = serde_json::to_value(&self.mcp_servers).ok()?;
        if let Some(map) = servers.as_object_mut() {
            for t in &self.tool_servers {
                map.insert(
                    t.name.clone(),
                    serde_json::json!({"type": "sdk", "name": t.name}),
                );
            }
        }
        serde_json::to_string(&serde_json::json!({ "mcpServers": servers })).ok()
    }

    /// Checks `tool_servers` (names, counts, schemas, timeouts; see `limits`).
    fn validate_tool_servers(&self) -> Result<(), InvalidOption> {
        count(
            "tool_servers",
            self.tool_servers.len(),
            limits::TOOL_SERVERS,
        )?;
        let name_ok = |n: &str| {
            !n.is_empty()
                && n.len() <= limits::MCP_NAME_BYTES
                && n.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        };
        let mut seen = std::collections::BTreeSet::new();
        for (i, s) in self.tool_servers.iter().enumerate() {
            let f = format!("tool_servers[{i}]");
            if !name_ok(&s.name) {
                return Err(bad(
                    format!("{f}.name"),
                    format!(
                        "{} is not a tool server name: 1 to {} letters, digits, `_` or `-`",
                        shown(&s.name),
                        limits::MCP_NAME_BYTES
                    ),
                ));
            }
            if self.mcp_servers.contains_key(&s.name) || !seen.insert(s.name.as_str()) {
                return Err(bad(
                    format!("{f}.name"),
                    format!(
                        "the name {} is already used by another tool or MCP server",
                        shown(&s.name)
                    ),
                ));
            }
            if s.timeout_secs == 0 || s.timeout_secs > limits::TOOL_TIMEOUT_SECS {
                return Err(bad(
                    format!("{f}.timeout_secs"),
                    format!("at most {} seconds", limits::TOOL_TIMEOUT_SECS),
                ));
            }
            if s.tools.is_empty() {
                return Err(bad(format!("{f}.tools"), "a tool server needs a tool"));
            }
            count(
                &format!("{f}.tools"),
                s.tools.len(),
                limits::TOOLS_PER_SERVER,
            )?;
            let mut names = std::collections::BTreeSet::new();
            for (j, t) in s.tools.iter().enumerate() {
                let tf = format!("{f}.tools[{j}]");
                if !name_ok(&t.name) {
                    return Err(bad(
                        format!("{tf}.name"),
                        format!(
                            "{} is not a tool name: 1 to {} letters, digits, `_` or `-`",
                            shown(&t.name),
                            limits::MCP_NAME_BYTES
                        ),
                    ));
                }
                if !names.insert(t.name.as_str()) {
                    return Err(bad(
                        format!("{tf}.name"),
                        format!("the tool {} is declared twice", shown(&t.name)),
                    ));
                }
                text(
                    &format!("{tf}.description"),
                    &t.description,
                    limits::TOOL_SCHEMA_BYTES,
                )?;
                text(
                    &format!("{tf}.input_schema_json"),
                    &t.input_schema,
                    limits::TOOL_SCHEMA_BYTES,
                )?;
                if !t.input_schema.is_empty() {
                    json_object(&format!("{tf}.input_schema_json"), &t.input_schema)?;
                }
            }
        }
        Ok(())
    }

    /// The session-option flags these options put on the command line whose presence
    /// differs between releases (see `compat::PROBED_OPTIONS`), each with the option field
    /// that needs it.
    pub fn gated_options(&self) -> Vec<(&'static str, &'static str)> {
        let mut v = Vec::new();
        let mut on = |cond: bool, flag: &'static str, field: &'static str| {
            if cond {
                v.push((flag, field));
            }
        };
        on(
            self.system_prompt.is_some(),
            "--system-prompt",
            "system_prompt",
        );
        on(
            self.append_system_prompt.is_some(),
            "--append-system-prompt",
            "append_system_prompt",
        );
        on(
            self.fallback_model.is_some(),
            "--fallback-model",
            "fallback_model",
        );
        on(!self.add_dirs.is_empty(), "--add-dir", "add_dirs");
        on(
            self.max_budget_usd.is_some(),
            "--max-budget-usd",
            "max_budget_usd",
        );
        on(
            self.max_thinking_tokens.is_some(),
            "--max-thinking-tokens",
            "max_thinking_tokens",
        );
        on(
            self.task_budget_tokens.is_some(),
            "--task-budget",
            "task_budget_tokens",
        );
        on(self.settings.is_some(), "--settings", "settings");
        on(
            self.managed_settings.is_some(),
            "--managed-settings",
            "managed_settings",
        );
        on(
            !self.setting_sources.is_empty(),
            "--setting-sources",
            "setting_sources",
        );
        on(
            self.no_setting_sources,
            "--setting-sources",
            "no_setting_sources",
        );
        on(
            !self.mcp_servers.is_empty() || !self.tool_servers.is_empty(),
            "--mcp-config",
            "mcp_servers",
        );
        on(
            self.strict_mcp_config,
            "--strict-mcp-config",
            "strict_mcp_config",
        );
        on(self.agents.is_some(), "--agents", "agents");
        on(self.json_schema.is_some(), "--json-schema", "json_schema");
        on(self.tools.is_some(), "--tools", "tools");
        on(self.agent.is_some(), "--agent", "agent");
        on(self.effort.is_some(), "--effort", "effort");
        on(!self.plugin_dirs.is_empty(), "--plugin-dir", "plugin_dirs");
        on(
            self.include_hook_events,
            "--include-hook-events",
            "include_hook_events",
        );
        on(!self.betas.is_empty(), "--betas", "betas");
        on(
            self.permission_prompts.is_some(),
            "--permission-prompts",
            "permission_prompts",
        );
        on(self.thinking.is_some(), "--thinking", "thinking");
        on(
            self.thinking_display.is_some(),
            "--thinking-display",
            "thinking_display",
        );
        on(
            self.allow_dangerously_skip_permissions,
            "--allow-dangerously-skip-permissions",
            "allow_dangerously_skip_permissions",
        );
        on(
            self.project_config_root.is_some(),
            "--project-config-root",
            "project_config_root",
        );
        on(self.debug, "--debug-file", "debug");
        v
    }

    /// The flags of [`Self::gated_options`].
    pub fn gated_flags(&self) -> Vec<&'static str> {
        self.gated_options().into_iter().map(|(f, _)| f).collect()
    }

    /// The first of [`Self::gated_options`] whose flag the release is measured not to
    /// accept, as (flag, field) (`None`: all accepted or not measured, then the CLI is
    /// tried).
    /// Every set option whose flag `caps` says the release lacks: `(flag, field)`.
    pub fn unsupported_by(&self, caps: &Capabilities) -> Vec<(&'static str, &'static str)> {
        self.gated_options()
            .into_iter()
            .filter(|(f, _)| caps.accepts_option(f) == Some(false))
            .collect()
    }

    /// A copy fit to show: values of `env`, of MCP servers' `env` and `headers` replaced by
    /// `"<redacted>"`.
    pub fn redact(&self) -> CliOptions {
        let mut c = self.clone();
        redact_map(&mut c.env);
        for s in c.mcp_servers.values_mut() {
            match s {
                McpServer::Stdio { env, .. } => redact_map(env),
                McpServer::Http { headers, .. } | McpServer::Sse { headers, .. } => {
                    redact_map(headers)
                }
            }
        }
        c
    }
}

/// What replaces a secret value in anything shown.
pub const REDACTED: &str = "<redacted>";

fn redact_map(m: &mut BTreeMap<String, String>) {
    for v in m.values_mut() {
        *v = REDACTED.to_owned();
    }
}

/// The keywords of JSON Schema (draft-07 and 2020-12): the CLI compiles `--json-schema` in
/// strict mode and exits at start on any other ("strict mode: unknown keyword"), and again
/// at every resume.
const SCHEMA_KEYWORDS: &[&str] = &[
    "$schema",
    "$id",
    "$ref",
    "$anchor",
    "$dynamicRef",
    "$dynamicAnchor",
    "$recursiveRef",
    "$recursiveAnchor",
    "$vocabulary",
    "$comment",
    "$defs",
    "definitions",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "dependentSchemas",
    "dependencies",
    "prefixItems",
    "items",
    "additionalItems",
    "contains",
    "properties",
    "patternProperties",
    "additionalProperties",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "type",
    "enum",
    "const",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "maxLength",
    "minLength",
    "pattern",
    "maxItems",
    "minItems",
    "uniqueItems",
    "maxContains",
    "minContains",
    "maxProperties",
    "minProperties",
    "required",
    "dependentRequired",
    "title",
    "description",
    "default",
    "deprecated",
    "readOnly",
    "writeOnly",
    "examples",
    "format",
    "contentEncoding",
    "contentMediaType",
    "contentSchema",
];

/// JSON Schema's types.
const SCHEMA_TYPES: &[&str] = &[
    "string", "number", "integer", "boolean", "object", "array", "null",
];

/// A JSON Schema's keywords (at every level) and `type` values, as the CLI's strict
/// compilation checks them; `at`: where in the schema (for the message).
fn check_json_schema(at: &str, v: &serde_json::Value, depth: usize) -> Result<(), InvalidOption> {
    use serde_json::Value;
    if depth > 64 {
        return Err(bad(at, "nests schemas more than 64 deep"));
    }
    let m = match v {
        Value::Bool(_) => return Ok(()),
        Value::Object(m) => m,
        _ => return Err(bad(at, "is not a schema (an object, or true / false)")),
    };
    for (k, val) in m {
        if !SCHEMA_KEYWORDS.contains(&k.as_str()) {
            return Err(bad(
                at,
                format!(
                    "{} is not a JSON Schema keyword (the CLI compiles the schema strictly and \
                     would exit at start)",
                    shown(k)
                ),
            ));
        }
        let here = format!("{at}.{k}");
        match k.as_str() {
            "type" => {
                let ok = |t: &Value| t.as_str().is_some_and(|t| SCHEMA_TYPES.contains(&t));
                let fine = match val {
                    Value::Array(a) => !a.is_empty() && a.iter().all(ok),
                    t => ok(t),
                };
                if !fine {
                    return Err(bad(
                        here,
                        format!(
                            "is not a JSON Schema type (one of {})",
                            SCHEMA_TYPES.join(", ")
                        ),
                    ));
                }
            }
            "not"
            | "if"
            | "then"
            | "else"
            | "contains"
            | "additionalProperties"
            | "propertyNames"
            | "additionalItems"
            | "unevaluatedItems"
            | "unevaluatedProperties"
            | "contentSchema" => {
                check_json_schema(&here, val, depth + 1)?;
            }
            "items" => match val {
                Value::Array(a) => {
                    for (i, s) in a.iter().enumerate() {
                        check_json_schema(&format!("{here}[{i}]"), s, depth + 1)?;
                    }
                }
                s => check_json_schema(&here, s, depth + 1)?,
            },
            "allOf" | "anyOf" | "oneOf" | "prefixItems" => {
                let Value::Array(a) = val else {
                    return Err(bad(here, "is a list of schemas"));
                };
                for (i, s) in a.iter().enumerate() {
                    check_json_schema(&format!("{here}[{i}]"), s, depth + 1)?;
                }
            }
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => {
                let Value::Object(named) = val else {
                    return Err(bad(here, "maps names to schemas"));
                };
                for (name, s) in named {
                    check_json_schema(&format!("{here}[{}]", shown(name)), s, depth + 1)?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Checks MCP server configs as `--mcp-config` (and `mcp_set_servers`) take them: names of
/// 1-64 of `[A-Za-z0-9_-]`, a command or an http(s) URL, bounded args, env and headers.
/// Errors name `field[name]...`.
pub fn validate_mcp_servers(
    field: &str,
    servers: &BTreeMap<String, McpServer>,
) -> Result<(), InvalidOption> {
    count(field, servers.len(), limits::MCP_SERVERS)?;
    for (name, server) in servers {
        let f = format!("{field}[{}]", shown(name));
        let name_ok = !name.is_empty()
            && name.len() <= limits::MCP_NAME_BYTES
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok {
            return Err(bad(
                f,
                format!(
                    "an MCP server name is 1 to {} letters, digits, `_` or `-`",
                    limits::MCP_NAME_BYTES
                ),
            ));
        }
        let t = server.tuning();
        if let Some(ms) = t.timeout
            && !(1..=limits::MCP_TIMEOUT_MS).contains(&ms)
        {
            return Err(bad(
                format!("{f}.timeout"),
                format!(
                    "{ms} ms; 1 to {} ms (the CLI ignores values below 1000)",
                    limits::MCP_TIMEOUT_MS
                ),
            ));
        }
        if !t.tools.is_empty() && matches!(server, McpServer::Stdio { .. }) {
            return Err(bad(
                format!("{f}.tools"),
                "tool policies are for http and sse servers (the CLI's stdio config has none)",
            ));
        }
        count(&format!("{f}.tools"), t.tools.len(), limits::TOOLS)?;
        for (i, p) in t.tools.iter().enumerate() {
            let pf = format!("{f}.tools[{i}]");
            if p.name.is_empty() || p.name.len() > limits::TOOL_NAME_BYTES {
                return Err(bad(
                    format!("{pf}.name"),
                    format!("a tool name is 1 to {} bytes", limits::TOOL_NAME_BYTES),
                ));
            }
            for (key, v, known) in [
                (
                    "permission_policy",
                    &p.permission_policy,
                    &MCP_TOOL_POLICIES,
                ),
                (
                    "org_max_permission",
                    &p.org_max_permission,
                    &MCP_TOOL_CEILINGS,
                ),
            ] {
                if let Some(v) = v
                    && !known.contains(&v.as_str())
                {
                    return Err(bad(
                        format!("{pf}.{key}"),
                        format!("{} is not one of {known:?}", shown(v)),
                    ));
                }
            }
        }
        match server {
            McpServer::Stdio {
                command, args, env, ..
            } => {
                arg(&format!("{f}.command"), command, limits::PATH_BYTES)?;
                count(&format!("{f}.args"), args.len(), limits::MCP_ARGS)?;
                for (i, a) in args.iter().enumerate() {
                    text(&format!("{f}.args[{i}]"), a, limits::PATH_BYTES)?;
                }
                count(&format!("{f}.env"), env.len(), limits::VARS)?;
                for (k, v) in env {
                    var_name(&format!("{f}.env"), k)?;
                    text(&format!("{f}.env[{k}]"), v, limits::VALUE_BYTES)?;
                }
            }
            McpServer::Http { url, headers, .. } | McpServer::Sse { url, headers, .. } => {
                let uf = format!("{f}.url");
                arg(&uf, url, limits::PATH_BYTES)?;
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(bad(
                        uf,
                        format!("{} is not an http:// or https:// URL", shown(url)),
                    ));
                }
                count(&format!("{f}.headers"), headers.len(), limits::VARS)?;
                for (k, v) in headers {
                    let hf = format!("{f}.headers");
                    let ok = !k.is_empty()
                        && k.len() <= 256
                        && k.bytes().all(|b| b.is_ascii_graphic() && b != b':');
                    if !ok {
                        return Err(bad(hf, format!("{} is not a header name", shown(k))));
                    }
                    // Values are never shown: they often carry tokens.
                    if v.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0)
                        || v.len() > limits::VALUE_BYTES
                    {
                        return Err(bad(
                            format!("{hf}[{k}]"),
                            format!(
                                "a header value has no CR, LF or NUL and is at most {} bytes",
                                limits::VALUE_BYTES
                            ),
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skills_allow_the_skill_tool_and_go_in_initialize() {
        let none = CliOptions::default();
        assert!(none.allowed_tools_with_skills().is_empty());
        assert_eq!(none.skills_field(), None);
        let some = CliOptions {
            allowed_tools: vec!["Read".into(), "Skill(pdf)".into()],
            skills: vec!["pdf".into(), "docs:xlsx".into()],
            ..Default::default()
        };
        assert_eq!(
            some.allowed_tools_with_skills(),
            ["Read", "Skill(pdf)", "Skill(docs:xlsx)"]
        );
        assert_eq!(
            some.skills_field(),
            Some(serde_json::json!(["pdf", "docs:xlsx"]))
        );
        let all = CliOptions {
            all_skills: true,
            ..Default::default()
        };
        assert_eq!(all.allowed_tools_with_skills(), ["Skill"]);
        assert_eq!(all.skills_field(), Some(serde_json::json!("all")));
        for (bad, field) in [
            (
                CliOptions {
                    skills: vec!["pdf".into()],
                    all_skills: true,
                    ..Default::default()
                },
                "all_skills",
            ),
            (
                CliOptions {
                    skills: vec!["Skill(x)".into()],
                    ..Default::default()
                },
                "skills[0]",
            ),
            (
                CliOptions {
                    skills: vec!["pdf".into(), "pdf".into()],
                    ..Default::default()
                },
                "skills[1]",
            ),
        ] {
            assert_eq!(bad.validate().unwrap_err().field, field);
        }
    }

    /// The daemon's policy holds: its values win, lists join, the session's own keys are
    /// added; either alone is passed as it is.
    #[test]
    fn managed_settings_merge_keeps_the_daemons_policy() {
        use serde_json::json;
        let daemon = json!({
            "permissions": {"deny": ["Bash(rm:*)"], "disableBypassPermissionsMode": "disable"},
            "cleanupPeriodDays": 3
        });
        let daemon = daemon.as_object().unwrap();
        let session = r#"{"permissions": {"deny": ["Read(./secret/**)", "Bash(rm:*)"],
            "ask": ["WebFetch"], "disableBypassPermissionsMode": "allow"},
            "cleanupPeriodDays": 30, "allowManagedHooksOnly": true}"#;
        let merged: serde_json::Value =
            serde_json::from_str(&merge_managed_settings(Some(daemon), Some(session)).unwrap())
                .unwrap();
        assert_eq!(
            merged,
            json!({
                "permissions": {
                    "deny": ["Bash(rm:*)", "Read(./secret/**)"],
                    "ask": ["WebFetch"],
                    "disableBypassPermissionsMode": "disable"
                },
                "cleanupPeriodDays": 3,
                "allowManagedHooksOnly": true
            })
        );
        assert_eq!(merge_managed_settings(None, None), None);
        let alone: serde_json::Value =
            serde_json::from_str(&merge_managed_settings(Some(daemon), None).unwrap()).unwrap();
        assert_eq!(&alone, &serde_json::Value::Object(daemon.clone()));
        let own: serde_json::Value =
            serde_json::from_str(&merge_managed_settings(None, Some(session)).unwrap()).unwrap();
        assert_eq!(own["cleanupPeriodDays"], 30);
        // A session value that is not an object where the daemon has one: the daemon's stays.
        let odd = merge_managed_settings(Some(daemon), Some(r#"{"permissions": "none"}"#));
        let odd: serde_json::Value = serde_json::from_str(&odd.unwrap()).unwrap();
        assert_eq!(odd["permissions"]["deny"], json!(["Bash(rm:*)"]));
    }

    fn stdio(cmd: &str) -> McpServer {
        McpServer::Stdio {
            command: cmd.into(),
            args: vec!["--port".into(), "1".into()],
            env: BTreeMap::from([("TOKEN".into(), "s3cret".into())]),
            tuning: McpTuning::default(),
        }
    }

    #[test]
    fn mcp_server_settings_reach_the_config_as_the_cli_spells_them() {
        let json = r#"{"type":"http","url":"https://x.test/mcp","timeout":5000,"alwaysLoad":false,"tools":[{"name":"rm","permission_policy":"always_deny"},{"name":"ls","org_max_permission":"ask"}]}"#;
        let server: McpServer = serde_json::from_str(json).expect("a server");
        assert_eq!(server.tuning().timeout, Some(5000));
        assert_eq!(server.tuning().always_load, Some(false));
        let o = CliOptions {
            mcp_servers: BTreeMap::from([("web".into(), server)]),
            ..Default::default()
        };
        o.validate().expect("valid");
        let v: serde_json::Value =
            serde_json::from_str(&o.mcp_config_json().expect("servers")).expect("json");
        let expected: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(v["mcpServers"]["web"], expected);
        // Without them, nothing more than before.
        let plain = serde_json::to_value(stdio("/bin/t")).unwrap();
        assert_eq!(
            plain.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["args", "command", "env", "type"]
        );
        // A policy with a key the CLI does not take is not a policy.
        assert!(
            serde_json::from_str::<McpToolPolicy>(r#"{"name":"x","policy":"always_deny"}"#)
                .is_err()
        );
    }

    #[test]
    fn old_session_created_payloads_still_read() {
        let old = r#"{"allowed_tools":["Read"],"disallowed_tools":[],"append_system_prompt":"x","max_turns":3,"rules":[]}"#;
        let o: CliOptions = serde_json::from_str(old).expect("old payload");
        assert_eq!(o.allowed_tools, vec!["Read".to_string()]);
        assert_eq!(o.append_system_prompt.as_deref(), Some("x"));
        assert_eq!(o.max_turns, Some(3));
        let full = CliOptions {
            system_prompt: Some("s".into()),
            mcp_servers: BTreeMap::from([("t".into(), stdio("/bin/t"))]),
            max_budget_usd: Some(0.5),
            env: BTreeMap::from([("A".into(), "b".into())]),
            ..Default::default()
        };
        let back: CliOptions =
            serde_json::from_str(&serde_json::to_string(&full).expect("ser")).expect("de");
        assert_eq!(back, full);
    }

    fn tool_server(name: &str, tool: &str, schema: &str) -> ToolServerDecl {
        ToolServerDecl {
            name: name.into(),
            tools: vec![ToolDecl {
                name: tool.into(),
                description: "d".into(),
                input_schema: schema.into(),
            }],
            timeout_secs: 120,
        }
    }

    #[test]
    fn tool_servers_are_sdk_entries_and_validated() {
        let o = CliOptions {
            mcp_servers: BTreeMap::from([("t".into(), stdio("/bin/t"))]),
            tool_servers: vec![tool_server("tickets", "lookup_ticket", "")],
            ..Default::default()
        };
        o.validate().expect("valid");
        let v: serde_json::Value =
            serde_json::from_str(&o.mcp_config_json().expect("servers")).expect("json");
        assert_eq!(
            v["mcpServers"]["tickets"],
            serde_json::json!({"type": "sdk", "name": "tickets"})
        );
        assert_eq!(v["mcpServers"]["t"]["type"], "stdio");
        assert_eq!(o.gated_flags(), vec!["--mcp-config"]);
        let refused = |o: CliOptions| o.validate().expect_err("refused").field;
        let mut dup = o.clone();
        dup.tool_servers[0].name = "t".into();
        assert_eq!(refused(dup), "tool_servers[0].name");
        let mut bad_schema = o.clone();
        bad_schema.tool_servers[0].tools[0].input_schema = "[1]".into();
        assert_eq!(
            refused(bad_schema),
            "tool_servers[0].tools[0].input_schema_json"
        );
        let mut bad_tool = o.clone();
        bad_tool.tool_servers[0].tools[0].name = "no spaces".into();
        assert_eq!(refused(bad_tool), "tool_servers[0].tools[0].name");
        let mut no_tools = o.clone();
        no_tools.tool_servers[0].tools.clear();
        assert_eq!(refused(no_tools), "tool_servers[0].tools");
        let mut slow = o;
        slow.tool_servers[0].timeout_secs = 3601;
        assert_eq!(refused(slow), "tool_servers[0].timeout_secs");
    }

    #[test]
    fn mcp_config_is_the_cli_shape() {
        let o = CliOptions {
            mcp_servers: BTreeMap::from([
                ("local".into(), stdio("/bin/t")),
                (
                    "web".into(),
                    McpServer::Http {
                        url: "https://x.test/mcp".into(),
                        headers: BTreeMap::new(),
                        tuning: McpTuning::default(),
                    },
                ),
            ]),
            ..Default::default()
        };
        let v: serde_json::Value =
            serde_json::from_str(&o.mcp_config_json().expect("servers")).expect("json");
        assert_eq!(v["mcpServers"]["local"]["type"], "stdio");
        assert_eq!(v["mcpServers"]["local"]["command"], "/bin/t");
        assert_eq!(v["mcpServers"]["local"]["args"][0], "--port");
        assert_eq!(v["mcpServers"]["local"]["env"]["TOKEN"], "s3cret");
        assert_eq!(v["mcpServers"]["web"]["type"], "http");
        assert!(v["mcpServers"]["web"].get("headers").is_none());
        let r = o.redact();
        assert_eq!(
            r.mcp_config_json().map(|j| j.contains("s3cret")),
            Some(false)
        );
    }

    #[test]
    fn validation_names_the_field_and_never_echoes_much() {
        let check = |o: CliOptions, field: &str| {
            let e = o.validate().expect_err(field);
            assert!(e.field.starts_with(field), "{field}: {e:?}");
            assert!(e.message.len() < 400, "{field}: message too long");
        };
        // The debug filter: only with debug; one kind of category; each a plain name.
        let long_filter = "a,".repeat(300);
        for (debug, filter) in [
            (false, "api"),
            (true, "api,!hooks"),
            (true, "api,,hooks"),
            (true, "api hooks"),
            (true, "!"),
            (true, long_filter.as_str()),
        ] {
            check(
                CliOptions {
                    debug,
                    debug_filter: Some(filter.into()),
                    ..Default::default()
                },
                "debug_filter",
            );
        }
        for filter in ["api,hooks", "!statsig,!file", "mcp", "my-server.v2"] {
            CliOptions {
                debug: true,
                debug_filter: Some(filter.into()),
                ..Default::default()
            }
            .validate()
            .expect(filter);
        }
        let huge = "x".repeat(limits::PROMPT_BYTES + 1);
        check(
            CliOptions {
                system_prompt: Some(huge.clone()),
                ..Default::default()
            },
            "system_prompt",
        );
        check(
            CliOptions {
                system_prompt: Some("a\0b".into()),
                ..Default::default()
            },
            "system_prompt",
        );
        check(
            CliOptions {
                add_dirs: vec!["relative/dir".into()],
                ..Default::default()
            },
            "add_dirs[0]",
        );
        for bad_root in ["relative/dir", "", "/a\0b", "-x"] {
            check(
                CliOptions {
                    project_config_root: Some(bad_root.into()),
                    ..Default::default()
                },
                "project_config_root",
            );
        }
        check(
            CliOptions {
                add_dirs: vec!["/d".into(); limits::ADD_DIRS + 1],
                ..Default::default()
            },
            "add_dirs",
        );
        check(
            CliOptions {
                max_budget_usd: Some(f64::NAN),
                ..Default::default()
            },
            "max_budget_usd",
        );
        // A huge number is shown short, not written out in 309 digits.
        let e = CliOptions {
            max_budget_usd: Some(1e308),
            ..Default::default()
        }
        .validate()
        .expect_err("1e308 USD");
        assert!(e.message.starts_with("1e308 "), "{e:?}");
        check(
            CliOptions {
                managed_settings: Some("/etc/policy.json".into()),
                ..Default::default()
            },
            "managed_settings",
        );
        check(
            CliOptions {
                managed_settings: Some(r#"["Read"]"#.into()),
                ..Default::default()
            },
            "managed_settings",
        );
        check(
            CliOptions {
                settings: Some(format!("{{{huge}")),
                ..Default::default()
            },
            "settings",
        );
        check(
            CliOptions {
                settings: Some("relative.json".into()),
                ..Default::default()
            },
            "settings",
        );
        check(
            CliOptions {
                setting_sources: vec!["user".into(), "user".into()],
                ..Default::default()
            },
            "setting_sources[1]",
        );
        check(
            CliOptions {
                setting_sources: vec!["user".into()],
                no_setting_sources: true,
                ..Default::default()
            },
            "no_setting_sources",
        );
        check(
            CliOptions {
                agents: Some(r#"{"r": {"description": "d"}}"#.into()),
                ..Default::default()
            },
            "agents",
        );
        check(
            CliOptions {
                json_schema: Some("[1]".into()),
                ..Default::default()
            },
            "json_schema",
        );
        // What the CLI's strict schema compilation refuses (it would exit at start, and at
        // every resume), at any depth; and agent fields of the wrong shape.
        for (schema, at) in [
            (r#"{"foo": 1}"#, "json_schema"),
            (r#"{"type": "bogus"}"#, "json_schema.type"),
            (
                r#"{"type": "object", "properties": {"x": {"type": "strin"}}}"#,
                "json_schema.properties[\"x\"].type",
            ),
            (
                r#"{"anyOf": [{"type": "string"}, {"minimun": 1}]}"#,
                "json_schema.anyOf[1]",
            ),
            (r#"{"type": []}"#, "json_schema.type"),
        ] {
            let e = CliOptions {
                json_schema: Some(schema.into()),
                ..Default::default()
            }
            .validate()
            .expect_err(schema);
            assert_eq!(e.field, at, "{schema}: {e:?}");
        }
        let fine = r#"{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
            "properties": {"a": {"type": ["string", "null"], "description": "d"},
            "b": {"type": "array", "items": {"enum": [1, 2]}}}, "required": ["a"],
            "additionalProperties": false, "$defs": {"x": true}}"#;
        CliOptions {
            json_schema: Some(fine.into()),
            ..Default::default()
        }
        .validate()
        .expect("a schema of known keywords");
        check(
            CliOptions {
                agents: Some(
                    r#"{"a": {"description": "d", "prompt": "p", "tools": "notalist"}}"#.into(),
                ),
                ..Default::default()
            },
            "agents[\"a\"].tools",
        );
        check(
            CliOptions {
                mcp_servers: BTreeMap::from([("bad name".into(), stdio("/bin/t"))]),
                ..Default::default()
            },
            "mcp_servers",
        );
        check(
            CliOptions {
                mcp_servers: BTreeMap::from([(
                    "w".into(),
                    McpServer::Sse {
                        url: format!("ftp://{huge}"),
                        headers: BTreeMap::new(),
                        tuning: McpTuning::default(),
                    },
                )]),
                ..Default::default()
            },
            "mcp_servers[\"w\"].url",
        );
        let tuned = |server_json: &str| -> CliOptions {
            CliOptions {
                mcp_servers: BTreeMap::from([(
                    "w".into(),
                    serde_json::from_str(server_json).expect("a server"),
                )]),
                ..Default::default()
            }
        };
        check(
            tuned(r#"{"type":"stdio","command":"/bin/t","timeout":0}"#),
            "mcp_servers[\"w\"].timeout",
        );
        check(
            tuned(r#"{"type":"stdio","command":"/bin/t","tools":[{"name":"x"}]}"#),
            "mcp_servers[\"w\"].tools",
        );
        check(
            tuned(
                r#"{"type":"http","url":"https://x.test","tools":[{"name":"x","permission_policy":"never"}]}"#,
            ),
            "mcp_servers[\"w\"].tools[0].permission_policy",
        );
        check(
            tuned(r#"{"type":"sse","url":"https://x.test","tools":[{"name":""}]}"#),
            "mcp_servers[\"w\"].tools[0].name",
        );
        check(
            CliOptions {
                env: BTreeMap::from([("OSTLER_AUTH__TOKENS".into(), "x".into())]),
                ..Default::default()
            },
            "env",
        );
        check(
            CliOptions {
                env: BTreeMap::from([(huge.clone(), "x".into())]),
                ..Default::default()
            },
            "env",
        );
        check(
            CliOptions {
                allowed_tools: vec!["--evil".into()],
                ..Default::default()
            },
            "allowed_tools[0]",
        );
        // A secret value is never echoed.
        let e = CliOptions {
            env: BTreeMap::from([("A".into(), format!("s3cret\0{huge}"))]),
            ..Default::default()
        }
        .validate()
        .expect_err("NUL in env value");
        assert!(!e.to_string().contains("s3cret"), "{e}");
        let ok = CliOptions {
            system_prompt: Some("be brief".into()),
            add_dirs: vec!["/tmp".into()],
            max_budget_usd: Some(1.5),
            settings: Some(r#"{"x": 1}"#.into()),
            setting_sources: vec!["user".into(), "project".into()],
            agents: Some(r#"{"r": {"description": "d", "prompt": "p"}}"#.into()),
            json_schema: Some(r#"{"type": "object"}"#.into()),
            mcp_servers: BTreeMap::from([("t".into(), stdio("/bin/t"))]),
            env: BTreeMap::from([("MY_VAR".into(), "1".into())]),
            ..Default::default()
        };
        assert_eq!(ok.validate(), Ok(()));
        assert_eq!(
            ok.gated_flags(),
            vec![
                "--system-prompt",
                "--add-dir",
                "--max-budget-usd",
                "--settings",
                "--setting-sources",
                "--mcp-config",
                "--agents",
                "--json-schema"
            ]
        );
    }
}
