//! `ostler run`'s session-option flags: one flag per `CreateSessionRequest` option
//! (docs/api.md). Values are checked by the daemon; here only what must be read locally
//! (an `--mcp-config` file) or split (`NAME=VALUE`).

use std::collections::HashMap;

use ostler_proto::v1 as pb;

#[derive(Debug, Clone, Default, clap::Args)]
pub struct SessionOptionArgs {
    /// Replace the CLI's system prompt
    #[arg(long, value_name = "TEXT")]
    pub system_prompt: Option<String>,
    /// MCP servers: a file or inline JSON in the CLI's format ({"mcpServers": {NAME: {"type":
    /// "stdio"|"http"|"sse", ...}}}); repeatable
    #[arg(long = "mcp-config", value_name = "FILE|JSON", value_parser = parse_mcp_config)]
    pub mcp_config: Vec<McpServers>,
    /// Only the MCP servers of --mcp-config, none from the CLI's settings
    #[arg(long)]
    pub strict_mcp_config: bool,
    /// Answer every MCP server's request for input (elicitation) with a decline at once,
    /// instead of asking
    #[arg(long)]
    pub decline_elicitations: bool,
    /// Register a remote hook: the CLI calls it for EVENT (PreToolUse, UserPromptSubmit,
    /// Stop, ...; with MATCHER only for those tools, e.g. `PreToolUse:Bash|Write`), and each
    /// call is asked at the terminal or answered with `ostler hook` (repeatable)
    #[arg(long = "hook", value_name = "EVENT[:MATCHER]", value_parser = parse_hook)]
    pub hooks: Vec<pb::HookRegistration>,
    /// With --hook: seconds a hook call waits for an answer before it continues (default
    /// 60)
    #[arg(long, value_name = "SECS", requires = "hooks")]
    pub hook_timeout: Option<u32>,
    /// Show every hook the CLI runs (its settings' shell hooks too): a failed hook's
    /// output, and with --verbose each hook's start
    #[arg(long)]
    pub hook_events: bool,
    /// An API beta to ask for, e.g. `context-1m-2025-08-07` (repeatable)
    #[arg(long = "beta", value_name = "NAME")]
    pub betas: Vec<String>,
    /// After each turn, show the model's guess at your next prompt (2.1.120 and later)
    #[arg(long)]
    pub prompt_suggestions: bool,
    /// Enable only this skill (its SKILL.md name, or plugin:skill), and allow the Skill
    /// tool for it (repeatable; 2.1.120 and later)
    #[arg(long = "skill", value_name = "NAME", conflicts_with = "all_skills")]
    pub skills: Vec<String>,
    /// Enable every skill the CLI finds, and allow the Skill tool
    #[arg(long)]
    pub all_skills: bool,
    /// In plan mode, plan this way instead of the CLI's own workflow (2.1.120 and later)
    #[arg(long, value_name = "TEXT")]
    pub plan_instructions: Option<String>,
    /// Run tool TO when the model calls FROM, e.g. `Bash=mcp__box__bash` (repeatable;
    /// 2.1.330 and later)
    #[arg(long = "tool-alias", value_name = "FROM=TO", value_parser = parse_env)]
    pub tool_aliases: Vec<(String, String)>,
    /// Keep the per-session sections (working directory, environment, memory) out of the
    /// system prompt, in the first message instead, so the system prompt is the same for
    /// every session (2.1.120 and later)
    #[arg(long)]
    pub exclude_dynamic_sections: bool,
    /// Show a foreground sub-agent's text and thinking too, not only its tool calls
    /// (2.1.120 and later)
    #[arg(long)]
    pub subagent_text: bool,
    /// An interrupt stops only the turn: background tasks (sub-agents) go on until stopped
    /// one by one (`ostler stop-task`); without it an interrupt kills them too
    #[arg(long)]
    pub per_task_stop: bool,
    /// Show a short model-written line of what each running sub-agent is doing, asked for
    /// about every 30 s while it runs (one extra model request each time)
    #[arg(long)]
    pub progress_summaries: bool,
    /// Dialogs the CLI may ask this session's clients for (comma-separated kinds, e.g.
    /// `refusal_fallback_prompt`: when the model refuses, retry on the fallback model?);
    /// answer them with `ostler dialog`. 2.1.330 and later
    #[arg(long, value_name = "KIND,...", value_delimiter = ',')]
    pub dialog_kinds: Vec<String>,
    /// AskUserQuestion's option previews: `markdown` or `html` (a self-contained HTML
    /// fragment, for web clients); unset: no previews. 2.1.120 and later
    #[arg(long, value_name = "FORMAT", value_parser = ["markdown", "html"])]
    pub question_preview_format: Option<String>,
    /// AskUserQuestion may also ask free-text and number questions, with a form title
    /// (2.1.330 and later)
    #[arg(long)]
    pub question_extended: bool,
    /// AskUserQuestion's options need no description (2.1.330 and later)
    #[arg(long)]
    pub question_optional_descriptions: bool,
    /// Send the first prompt and every later message as written, whoever sends it: no
    /// `@path` file expansion, no slash commands (for prompts built from text nobody typed)
    #[arg(long)]
    pub verbatim_prompts: bool,
    /// The trusted checkout the session's directory is a worktree of (an absolute path on
    /// the daemon's machine): the project's settings (hooks, permissions), `.mcp.json` and
    /// `.claude` trees come from there, not from the branch checked out (2.1.330 and later)
    #[arg(long, value_name = "DIR")]
    pub project_config_root: Option<String>,
    /// Keep the CLI's debug log (in a file the daemon chooses; read it with `ostler
    /// debug-log ID`); the daemon caps it (`sessions.debug_log_max_bytes`, the oldest
    /// half dropped past it) (2.1.120 and later)
    #[arg(long)]
    pub debug: bool,
    /// With --debug: only these categories (`api,hooks`), or all but these
    /// (`!statsig,!file`)
    #[arg(long, value_name = "CATEGORIES", requires = "debug")]
    pub debug_filter: Option<String>,
    /// A plugin directory to load for this session (repeatable)
    #[arg(long = "plugin-dir", value_name = "DIR")]
    pub plugin_dirs: Vec<String>,
    /// Another directory the session's tools may use (repeatable)
    #[arg(long = "add-dir", value_name = "DIR")]
    pub add_dirs: Vec<String>,
    /// Stop spending after this many US dollars
    #[arg(long, value_name = "USD")]
    pub max_budget_usd: Option<f64>,
    /// A token budget for the task: the model is told what remains and wraps up
    #[arg(long, value_name = "TOKENS")]
    pub task_budget: Option<u32>,
    /// Thinking token budget
    #[arg(long, value_name = "N")]
    pub max_thinking_tokens: Option<u32>,
    /// Model to fall back to when the model is overloaded
    #[arg(long, value_name = "MODEL")]
    pub fallback_model: Option<String>,
    /// Settings: inline JSON or the absolute path of a file
    #[arg(long, value_name = "FILE|JSON")]
    pub settings: Option<String>,
    /// Policy settings the session's CLI enforces (inline JSON, e.g. deny rules that hold
    /// whatever the permission mode); merged into the daemon's own
    #[arg(long, value_name = "JSON")]
    pub managed_settings: Option<String>,
    /// Setting sources to load: user, project, local (comma-separated); "" for none (no
    /// user, project or local settings, no CLAUDE.md)
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub setting_sources: Vec<String>,
    /// Custom sub-agents, a JSON object ({"name": {"description": ..., "prompt": ...}})
    #[arg(long, value_name = "JSON")]
    pub agents: Option<String>,
    /// The built-in tools the session has: "" for none, `default`, or names joined by
    /// commas (e.g. `Read,Grep`)
    #[arg(long, value_name = "LIST")]
    pub tools: Option<String>,
    /// Run the main thread as this agent (one of --agents, or of the CLI's settings)
    #[arg(long, value_name = "NAME")]
    pub agent: Option<String>,
    /// Who answers permission prompts: `host` (you, the default) or `none` (denied at
    /// once; the model is told)
    #[arg(long, value_name = "TARGET")]
    pub permission_prompts: Option<String>,
    /// Thinking: adaptive, enabled or disabled
    #[arg(long, value_name = "MODE")]
    pub thinking: Option<String>,
    /// How thinking comes back: summarized or omitted
    #[arg(long, value_name = "DISPLAY")]
    pub thinking_display: Option<String>,
    /// Effort level: low, medium, high, xhigh, max
    #[arg(long, value_name = "LEVEL")]
    pub effort: Option<String>,
    /// JSON schema the result must follow
    #[arg(long, value_name = "JSON")]
    pub json_schema: Option<String>,
    /// A tool rule the session's CLI runs without asking anyone (its --allowedTools, e.g.
    /// `Bash(git status)`; repeatable, one rule each: a rule may hold commas). Unlike
    /// --allow-tools, which this client answers prompts with, these hold for every client
    #[arg(long = "allowed-tool", alias = "allowed-tools", value_name = "RULE")]
    pub allowed_tools: Vec<String>,
    /// A tool rule the session's CLI refuses outright (its --disallowedTools; repeatable)
    #[arg(
        long = "disallowed-tool",
        alias = "disallowed-tools",
        value_name = "RULE"
    )]
    pub disallowed_tools: Vec<String>,
    /// Let the session be switched to bypassPermissions later (`ostler mode ...`) whatever
    /// mode it starts in: then every tool call runs without asking. Only for sandboxed
    /// sessions; a daemon running as root also needs `--env IS_SANDBOX=1`
    #[arg(long)]
    pub allow_dangerously_skip_permissions: bool,
    /// Keep checkpoints of the files the session changes, so `ostler rewind` can restore
    /// them
    #[arg(long)]
    pub file_checkpointing: bool,
    /// An environment variable for this session's CLI (repeatable)
    #[arg(long = "env", value_name = "NAME=VALUE", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Choose the session id (a retry with the same id and options returns the session)
    #[arg(long, value_name = "ID")]
    pub session_id: Option<String>,
    /// Continue a CLI conversation ostler did not start (its CLI session id)
    #[arg(long, value_name = "CLI_SESSION_ID", conflicts_with = "fork_from")]
    pub adopt: Option<String>,
    /// Fork an ostler session's conversation into the new session
    #[arg(long, value_name = "SESSION_ID")]
    pub fork_from: Option<String>,
    /// With --fork-from: branch after this message of the source (an assistant block's
    /// `message_id`) instead of at its end
    #[arg(long, value_name = "MESSAGE_ID", requires = "fork_from")]
    pub fork_at: Option<String>,
    /// With --fork-at: guard the cut (--resume-drops-turn, Claude Code 2.1.330+): the
    /// `message_id` of the source's user message starting the one turn the cut means to
    /// drop; the fork is refused when anything else lies past the cut
    #[arg(long, value_name = "MESSAGE_ID", requires = "fork_at")]
    pub fork_drops_turn: Option<String>,
}

/// The servers of one `--mcp-config` value.
#[derive(Debug, Clone, Default)]
pub struct McpServers(pub Vec<(String, pb::McpServerSpec)>);

/// `--hook EVENT[:MATCHER]`: a registration the daemon checks (the event, the matcher);
/// nobody answering continues.
fn parse_hook(s: &str) -> Result<pb::HookRegistration, String> {
    let (event, matcher) = s.split_once(':').unwrap_or((s, ""));
    if event.is_empty() {
        return Err("expected EVENT or EVENT:MATCHER (e.g. PreToolUse:Bash)".to_owned());
    }
    Ok(pb::HookRegistration {
        event: event.to_owned(),
        matcher: matcher.to_owned(),
        ..Default::default()
    })
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err("expected NAME=VALUE".to_owned()),
    }
}

fn string_map(v: Option<&serde_json::Value>) -> Result<HashMap<String, String>, String> {
    let Some(v) = v else {
        return Ok(HashMap::new());
    };
    let m = v.as_object().ok_or("env/headers must be an object")?;
    m.iter()
        .map(|(k, v)| {
            v.as_str()
                .map(|s| (k.clone(), s.to_owned()))
                .ok_or_else(|| format!("{k}: the value must be a string"))
        })
        .collect()
}

/// `--mcp-config`: inline JSON, else a file holding it.
pub fn parse_mcp_config(s: &str) -> Result<McpServers, String> {
    let text = if s.trim_start().starts_with('{') {
        s.to_owned()
    } else {
        std::fs::read_to_string(s).map_err(|e| format!("{s}: {e}"))?
    };
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("not JSON: {e}"))?;
    let servers = v
        .get("mcpServers")
        .and_then(|m| m.as_object())
        .ok_or("expected {\"mcpServers\": {NAME: {...}}}")?;
    let mut out = Vec::new();
    for (name, def) in servers {
        let ty = def.get("type").and_then(|t| t.as_str()).unwrap_or("stdio");
        // What ostler would not pass on is refused here, not dropped unseen.
        let known = ostler_supervisor::McpServer::known_keys(ty);
        if let Some(k) = def
            .as_object()
            .and_then(|m| m.keys().find(|k| !known.contains(&k.as_str())))
        {
            return Err(format!(
                "{name}: `{k}` is not a key ostler passes on (known: {})",
                known.join(", ")
            ));
        }
        let text = |k: &str| {
            def.get(k)
                .and_then(|v| v.as_str())
                .map(str::to_owned)
                .ok_or_else(|| format!("{name}: `{k}` is missing or not a string"))
        };
        use pb::mcp_server_spec::Transport;
        let transport = match ty {
            "stdio" => Transport::Stdio(pb::McpStdioServerSpec {
                command: text("command")?,
                args: def
                    .get("args")
                    .and_then(|a| a.as_array())
                    .map(|a| {
                        a.iter()
                            .map(|x| x.as_str().map(str::to_owned))
                            .collect::<Option<Vec<_>>>()
                    })
                    .unwrap_or(Some(Vec::new()))
                    .ok_or_else(|| format!("{name}: `args` must be strings"))?,
                env: string_map(def.get("env")).map_err(|e| format!("{name}: {e}"))?,
            }),
            "http" | "sse" => {
                let r = pb::McpRemoteServerSpec {
                    url: text("url")?,
                    headers: string_map(def.get("headers")).map_err(|e| format!("{name}: {e}"))?,
                };
                if ty == "http" {
                    Transport::Http(r)
                } else {
                    Transport::Sse(r)
                }
            }
            other => return Err(format!("{name}: unknown type {other:?} (stdio, http, sse)")),
        };
        let timeout_ms = match def.get("timeout") {
            None => None,
            Some(t) => Some(
                t.as_u64()
                    .ok_or_else(|| format!("{name}: `timeout` is not a whole number of ms"))?,
            ),
        };
        let always_load = match def.get("alwaysLoad") {
            None => None,
            Some(b) => Some(
                b.as_bool()
                    .ok_or_else(|| format!("{name}: `alwaysLoad` is not true or false"))?,
            ),
        };
        let tools = match def.get("tools") {
            None => Vec::new(),
            Some(list) => {
                let policies: Vec<ostler_supervisor::McpToolPolicy> =
                    serde_json::from_value(list.clone()).map_err(|e| {
                        format!(
                            "{name}: `tools` is not a list of {{\"name\", \
                             \"permission_policy\"?, \"org_max_permission\"?}}: {e}"
                        )
                    })?;
                policies
                    .into_iter()
                    .map(|p| pb::McpToolPolicy {
                        name: p.name,
                        permission_policy: p.permission_policy.unwrap_or_default(),
                        org_max_permission: p.org_max_permission.unwrap_or_default(),
                    })
                    .collect()
            }
        };
        out.push((
            name.clone(),
            pb::McpServerSpec {
                transport: Some(transport),
                timeout_ms,
                always_load,
                tools,
            },
        ));
    }
    Ok(McpServers(out))
}

impl SessionOptionArgs {
    /// Sets the request's session-option fields.
    pub fn apply(&self, r: &mut pb::CreateSessionRequest) {
        r.system_prompt = self.system_prompt.clone().unwrap_or_default();
        r.mcp_servers = self
            .mcp_config
            .iter()
            .flat_map(|m| m.0.iter().cloned())
            .collect();
        r.strict_mcp_config = self.strict_mcp_config;
        r.decline_elicitations = self.decline_elicitations;
        r.hooks = self
            .hooks
            .iter()
            .map(|h| pb::HookRegistration {
                timeout_secs: self.hook_timeout.unwrap_or(h.timeout_secs),
                ..h.clone()
            })
            .collect();
        r.add_dirs = self.add_dirs.clone();
        r.plugin_dirs = self.plugin_dirs.clone();
        r.project_config_root = self.project_config_root.clone().unwrap_or_default();
        r.include_hook_events = self.hook_events;
        r.debug = self.debug;
        r.debug_filter = self.debug_filter.clone().unwrap_or_default();
        r.betas = self.betas.clone();
        r.prompt_suggestions = self.prompt_suggestions;
        r.skills = self.skills.clone();
        r.all_skills = self.all_skills;
        r.plan_mode_instructions = self.plan_instructions.clone().unwrap_or_default();
        r.tool_aliases = self.tool_aliases.iter().cloned().collect();
        r.exclude_dynamic_sections = self.exclude_dynamic_sections;
        r.forward_subagent_text = self.subagent_text;
        r.per_task_stop_affordance = self.per_task_stop;
        r.agent_progress_summaries = self.progress_summaries;
        r.dialog_kinds = self.dialog_kinds.clone();
        r.question_preview_format = self.question_preview_format.clone().unwrap_or_default();
        r.question_extended = self.question_extended;
        r.question_optional_descriptions = self.question_optional_descriptions;
        r.verbatim_prompts = self.verbatim_prompts;
        r.permission_prompts = self.permission_prompts.clone().unwrap_or_default();
        r.thinking = self.thinking.clone().unwrap_or_default();
        r.thinking_display = self.thinking_display.clone().unwrap_or_default();
        r.max_budget_usd = self.max_budget_usd;
        r.max_thinking_tokens = self.max_thinking_tokens;
        r.task_budget_tokens = self.task_budget;
        r.fallback_model = self.fallback_model.clone().unwrap_or_default();
        r.settings = self.settings.clone().unwrap_or_default();
        r.managed_settings = self.managed_settings.clone().unwrap_or_default();
        // `--setting-sources ""`: none at all.
        if self.setting_sources.iter().all(String::is_empty) && !self.setting_sources.is_empty() {
            r.no_setting_sources = true;
        } else {
            r.setting_sources = self.setting_sources.clone();
        }
        r.agents_json = self.agents.clone().unwrap_or_default();
        r.json_schema = self.json_schema.clone().unwrap_or_default();
        r.allowed_tools = self.allowed_tools.clone();
        r.disallowed_tools = self.disallowed_tools.clone();
        r.enable_file_checkpointing = self.file_checkpointing;
        r.allow_dangerously_skip_permissions = self.allow_dangerously_skip_permissions;
        r.tools = self.tools.clone();
        r.agent = self.agent.clone().unwrap_or_default();
        r.effort = self.effort.clone().unwrap_or_default();
        r.env = self.env.iter().cloned().collect();
        r.session_id = self.session_id.clone().unwrap_or_default();
        r.adopt_claude_session_id = self.adopt.clone().unwrap_or_default();
        r.fork_from_session_id = self.fork_from.clone().unwrap_or_default();
        r.fork_at_message_id = self.fork_at.clone().unwrap_or_default();
        r.fork_drops_turn_message_id = self.fork_drops_turn.clone().unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mcp_config_in_the_cli_format() {
        let m = parse_mcp_config(
            r#"{"mcpServers": {"t": {"command": "/bin/t", "args": ["-v"], "env": {"K": "v"}},
                "w": {"type": "sse", "url": "https://x/sse", "headers": {"A": "b"}}}}"#,
        )
        .expect("parse");
        let mut r = pb::CreateSessionRequest::default();
        SessionOptionArgs {
            mcp_config: vec![m],
            ..Default::default()
        }
        .apply(&mut r);
        use pb::mcp_server_spec::Transport;
        assert!(matches!(
            &r.mcp_servers["t"].transport,
            Some(Transport::Stdio(s)) if s.command == "/bin/t" && s.args == ["-v"] && s.env["K"] == "v"
        ));
        assert!(matches!(
            &r.mcp_servers["w"].transport,
            Some(Transport::Sse(h)) if h.url == "https://x/sse"
        ));
        assert!(parse_mcp_config(r#"{"mcpServers": {"x": {"type": "ws"}}}"#).is_err());
        // The per-server settings pass; a key ostler would drop is refused.
        let m = parse_mcp_config(
            r#"{"mcpServers": {"t": {"command": "/bin/t", "timeout": 5000, "alwaysLoad": true},
                "w": {"type": "http", "url": "https://x/mcp",
                      "tools": [{"name": "rm", "permission_policy": "always_deny"}]}}}"#,
        )
        .expect("parse");
        let t = &m.0.iter().find(|(n, _)| n == "t").unwrap().1;
        assert_eq!((t.timeout_ms, t.always_load), (Some(5000), Some(true)));
        let w = &m.0.iter().find(|(n, _)| n == "w").unwrap().1;
        assert_eq!(w.tools[0].name, "rm");
        assert_eq!(w.tools[0].permission_policy, "always_deny");
        let e = parse_mcp_config(r#"{"mcpServers": {"t": {"command": "/bin/t", "oauth": {}}}}"#)
            .unwrap_err();
        assert!(e.contains("`oauth`"), "{e}");
        assert!(
            parse_mcp_config(r#"{"mcpServers": {"t": {"command": "/bin/t", "timeout": "5s"}}}"#)
                .is_err()
        );
        assert!(parse_mcp_config("/nonexistent/file.json").is_err());
    }

    #[test]
    fn hooks_by_event_and_matcher() {
        let mut r = pb::CreateSessionRequest::default();
        SessionOptionArgs {
            hooks: vec![
                parse_hook("PreToolUse:Bash|Write").expect("hook"),
                parse_hook("Stop").expect("hook"),
            ],
            hook_timeout: Some(300),
            ..Default::default()
        }
        .apply(&mut r);
        let got: Vec<(&str, &str, u32)> = r
            .hooks
            .iter()
            .map(|h| (h.event.as_str(), h.matcher.as_str(), h.timeout_secs))
            .collect();
        assert_eq!(got, [("PreToolUse", "Bash|Write", 300), ("Stop", "", 300)]);
        assert!(parse_hook(":Bash").is_err());
    }
    /// The request `ostler run ARGS` builds from its session-option flags.
    fn request(args: &[&str]) -> Result<pb::CreateSessionRequest, clap::Error> {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            opts: SessionOptionArgs,
        }
        let cli = Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied()))?;
        let mut r = pb::CreateSessionRequest::default();
        cli.opts.apply(&mut r);
        Ok(r)
    }

    #[test]
    fn skill_plan_and_alias_flags_parse() {
        let r = request(&[
            "--skill",
            "pdf",
            "--skill",
            "docs:xlsx",
            "--plan-instructions",
            "Plan in steps.",
            "--tool-alias",
            "Bash=mcp__box__bash",
            "--managed-settings",
            r#"{"permissions":{"deny":["Bash"]}}"#,
        ])
        .expect("parses");
        assert_eq!(r.managed_settings, r#"{"permissions":{"deny":["Bash"]}}"#);
        assert_eq!(r.skills, ["pdf", "docs:xlsx"]);
        assert!(!r.all_skills);
        assert_eq!(r.plan_mode_instructions, "Plan in steps.");
        assert_eq!(r.tool_aliases["Bash"], "mcp__box__bash");
        assert!(request(&["--skill", "pdf", "--all-skills"]).is_err());
        let r = request(&["--all-skills"]).expect("parses");
        assert!(r.all_skills && r.skills.is_empty());
    }

    #[test]
    fn initialize_switches_parse() {
        let r = request(&[
            "--exclude-dynamic-sections",
            "--subagent-text",
            "--per-task-stop",
            "--verbatim-prompts",
            "--progress-summaries",
            "--dialog-kinds",
            "refusal_fallback_prompt,enum_prompt",
            "--question-preview-format",
            "html",
            "--question-extended",
            "--question-optional-descriptions",
        ])
        .expect("parses");
        assert_eq!(r.dialog_kinds, ["refusal_fallback_prompt", "enum_prompt"]);
        assert_eq!(r.question_preview_format, "html");
        assert!(r.question_extended && r.question_optional_descriptions);
        assert!(r.exclude_dynamic_sections);
        assert!(r.forward_subagent_text);
        assert!(r.per_task_stop_affordance);
        assert!(r.verbatim_prompts);
        assert!(r.agent_progress_summaries);
        let r = request(&[]).expect("parses");
        assert!(
            !r.exclude_dynamic_sections
                && !r.forward_subagent_text
                && !r.per_task_stop_affordance
                && !r.verbatim_prompts
                && !r.agent_progress_summaries
                && r.dialog_kinds.is_empty()
                && r.question_preview_format.is_empty()
                && !r.question_extended
                && !r.question_optional_descriptions
        );
        assert!(request(&["--question-preview-format", "svg"]).is_err());
    }

    #[test]
    fn allow_dangerously_skip_permissions_flag() {
        let r = request(&[
            "--allow-dangerously-skip-permissions",
            "--env",
            "IS_SANDBOX=1",
        ])
        .expect("parses");
        assert!(r.allow_dangerously_skip_permissions);
        assert_eq!(r.env["IS_SANDBOX"], "1");
        assert!(
            !request(&[])
                .expect("parses")
                .allow_dangerously_skip_permissions
        );
    }

    #[test]
    fn setting_sources_empty_is_none_at_all() {
        let r = request(&["--setting-sources", "user,local"]).expect("parses");
        assert_eq!(r.setting_sources, ["user", "local"]);
        assert!(!r.no_setting_sources);
        let r = request(&["--setting-sources", ""]).expect("parses");
        assert!(r.setting_sources.is_empty());
        assert!(r.no_setting_sources);
        let r = request(&[]).expect("parses");
        assert!(r.setting_sources.is_empty() && !r.no_setting_sources);
    }

    #[test]
    fn project_config_root_flag() {
        let r = request(&["--project-config-root", "/srv/repo"]).expect("parses");
        assert_eq!(r.project_config_root, "/srv/repo");
        assert_eq!(request(&[]).expect("parses").project_config_root, "");
        assert!(
            request(&["--project-config-root"]).is_err(),
            "needs a value"
        );
    }

    #[test]
    fn debug_flags() {
        let r = request(&["--debug", "--debug-filter", "!statsig,!file"]).expect("parses");
        assert!(r.debug);
        assert_eq!(r.debug_filter, "!statsig,!file");
        let r = request(&[]).expect("parses");
        assert!(!r.debug && r.debug_filter.is_empty());
        assert!(
            request(&["--debug-filter", "api"]).is_err(),
            "a filter needs --debug"
        );
    }
}
