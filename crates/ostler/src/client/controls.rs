//! The session-control commands: `info`, `context`, `mcp`, `rewind`, `control`.

use anyhow::{Context as _, Result, anyhow};
use ostler_proto::v1 as pb;
use serde_json::{Value, json};

use super::ids::{self, SessionArg};
use super::render::json_line;
use super::{Conn, ConnectArgs, connect, status_error};

/// A session id, `--json` and the connection: the same arguments as `ostler show`.
pub type InfoArgs = super::commands::IdArgs;

#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "Examples:
  ostler context @last
  ostler context 3f2a --summary --json")]
pub struct ContextArgs {
    #[command(flatten)]
    pub id: InfoArgs,
    /// An estimate from the last response's usage, without the CLI's per-category token
    /// counting (Claude Code 2.1.332 and later)
    #[arg(long)]
    pub summary: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct McpArgs {
    #[command(flatten)]
    pub session: SessionArg,
    #[command(subcommand)]
    pub action: McpAction,
    /// Print the result as JSON
    #[arg(long, global = true)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum McpAction {
    /// The session's MCP servers and their status
    Status,
    /// Enable (`on`) or disable (`off`) one MCP server
    Toggle {
        name: String,
        #[arg(value_parser = ["on", "off"])]
        state: String,
    },
    /// Reconnect one MCP server
    Reconnect { name: String },
    /// Replace the servers added at runtime with those of FILE: a JSON object of name ->
    /// config, or `{"mcpServers": {...}}` as in an `--mcp-config` file
    Set { file: std::path::PathBuf },
}

#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "Examples:
  ostler control @last get_settings
  ostler control 3f2a list_models --json
  ostler control 3f2a rename_session '{\"title\": \"release notes\"}'")]
pub struct ControlArgs {
    /// Session id, a unique suffix or prefix of one, or @last (the newest session)
    #[arg(value_name = "ID")]
    pub id: String,
    /// The control request's subtype (the Agent SDKs' names)
    pub subtype: String,
    /// The request's other fields, a JSON object
    #[arg(value_name = "FIELDS_JSON")]
    pub fields: Option<String>,
    /// Print the answer on one line
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "Examples:
  ostler model @last claude-opus-4-1
  ostler model 3f2a --default")]
pub struct ModelArgs {
    /// Session id, a unique suffix or prefix of one, or @last (the newest session)
    #[arg(value_name = "ID")]
    pub id: String,
    /// The model (name or alias) for the following turns
    #[arg(value_name = "MODEL", required_unless_present = "default")]
    pub model: Option<String>,
    /// Back to the CLI's default model
    #[arg(long, conflicts_with = "model")]
    pub default: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "Examples:
  ostler mode @last plan
  ostler mode 3f2a acceptEdits")]
pub struct ModeArgs {
    /// Session id, a unique suffix or prefix of one, or @last (the newest session)
    #[arg(value_name = "ID")]
    pub id: String,
    /// default, acceptEdits, plan or bypassPermissions
    #[arg(value_name = "MODE", value_parser = super::run::parse_mode)]
    pub mode: pb::PermissionMode,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "Examples:
  ostler thinking @last 8000
  ostler thinking 3f2a --reset")]
pub struct ThinkingArgs {
    /// Session id, a unique suffix or prefix of one, or @last (the newest session)
    #[arg(value_name = "ID")]
    pub id: String,
    /// The most tokens the model may think per turn
    #[arg(value_name = "TOKENS", required_unless_present = "reset")]
    pub tokens: Option<u32>,
    /// Clear the limit (the release's default)
    #[arg(long, conflicts_with = "tokens")]
    pub reset: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct StopTaskArgs {
    /// Session id, a unique suffix or prefix of one, or @last (the newest session)
    #[arg(value_name = "ID")]
    pub id: String,
    /// The background task's id (from its `task_started` event)
    #[arg(value_name = "TASK_ID")]
    pub task_id: String,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RewindArgs {
    #[command(flatten)]
    pub session: SessionArg,
    /// The user message to go back to (its message id, from `send --json` or `show
    /// --events --json`)
    #[arg(long = "to", value_name = "MESSAGE_ID")]
    pub to: String,
    /// Only report what would change
    #[arg(long)]
    pub dry_run: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

async fn session(c: &ConnectArgs, s: &SessionArg) -> Result<(Conn, String)> {
    let mut conn = connect(c).await?;
    let id = ids::resolve(&mut conn.sessions, s.raw()).await?;
    Ok((conn, id))
}

fn raw(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

fn servers_json(servers: &[pb::McpServerStatus]) -> Value {
    servers
        .iter()
        .map(|s| json!({"name": s.name, "status": s.status, "tools": s.tools, "error": s.error}))
        .collect()
}

fn print_servers(servers: &[pb::McpServerStatus]) {
    if servers.is_empty() {
        outln!("no MCP servers");
    }
    for s in servers {
        let tools = if s.tools.is_empty() {
            String::new()
        } else {
            format!(" ({} tools: {})", s.tools.len(), s.tools.join(", "))
        };
        let error = if s.error.is_empty() {
            String::new()
        } else {
            format!(" - {}", s.error)
        };
        outln!("{:<24} {}{tools}{error}", s.name, s.status);
    }
}

/// `ostler info ID`: what the session runs with.
pub async fn info(a: InfoArgs) -> Result<i32> {
    let (mut conn, id) = session(&a.connect, &a.session).await?;
    let i = conn
        .sessions
        .get_session_info(pb::GetSessionInfoRequest {
            session_id: id.clone(),
        })
        .await
        .map_err(|s| status_error("get session info", s))?
        .into_inner();
    if a.json {
        json_line(&json!({
            "session_id": i.session_id,
            "cli_version": i.cli_version,
            "live": i.live,
            "model": i.model,
            "permission_mode": i.permission_mode,
            "tools": i.tools,
            "mcp_servers": servers_json(&i.mcp_servers),
            "slash_commands": i.slash_commands,
            "initialized": i.initialized.as_ref().map(|x| raw(&x.raw_json)),
            "initialize_error": i.initialize_error,
            "capabilities": i.capabilities,
        }));
        return Ok(0);
    }
    outln!("session       {}", i.session_id);
    outln!(
        "cli           Claude Code {}{}",
        i.cli_version,
        if i.live {
            " (running)"
        } else {
            " (no process)"
        }
    );
    if i.init_seen {
        outln!("model         {}", i.model);
        outln!("mode          {}", i.permission_mode);
        outln!("tools         {}", i.tools.join(", "));
    } else {
        outln!("tools         (known after the first turn)");
    }
    if let Some(init) = &i.initialized {
        let models: Vec<&str> = init.models.iter().map(|m| m.value.as_str()).collect();
        let commands: Vec<String> = init
            .commands
            .iter()
            .map(|c| format!("/{}", c.name))
            .collect();
        outln!("models        {}", models.join(", "));
        outln!("commands      {}", commands.join(" "));
        if !init.output_style.is_empty() {
            outln!("output style  {}", init.output_style);
        }
        if let Some(acc) = &init.account
            && !(acc.email.is_empty() && acc.api_key_source.is_empty())
        {
            outln!("account       {} {}", acc.email, acc.api_key_source);
        }
    } else if !i.initialize_error.is_empty() {
        outln!("initialize    failed: {}", i.initialize_error);
    }
    outln!("mcp servers");
    print_servers(&i.mcp_servers);
    outln!("capabilities  {}", i.capabilities.join(" "));
    Ok(0)
}

/// `ostler control ID SUBTYPE [FIELDS_JSON]`: the CLI's answer, as JSON (pretty unless
/// `--json`; `null` when it sent none).
pub async fn control(a: ControlArgs) -> Result<i32> {
    let target = SessionArg {
        id: Some(a.id.clone()),
        last: false,
    };
    let (mut conn, id) = session(&a.connect, &target).await?;
    let answer = conn
        .sessions
        .send_control_request(pb::SendControlRequestRequest {
            session_id: id,
            subtype: a.subtype.clone(),
            request_json: a.fields.clone().unwrap_or_default(),
        })
        .await
        .map_err(|s| {
            // A subtype ostler sends or answers itself is refused (INVALID_ARGUMENT, naming
            // the RPC): name the command that does it.
            let hint = (s.code() == tonic::Code::InvalidArgument)
                .then(|| command_for(&a.subtype))
                .flatten();
            let e = status_error(&format!("send {}", a.subtype), s);
            match hint {
                Some(cmd) => e.context(format!("use `{cmd}`")),
                None => e,
            }
        })?
        .into_inner();
    let v = raw(&answer.response_json);
    if a.json {
        json_line(&v);
    } else {
        outln!("{}", serde_json::to_string_pretty(&v)?);
    }
    Ok(0)
}

/// A session named by a positional `ID` (before other positionals, so no `--last`).
fn by_id(id: &str) -> SessionArg {
    SessionArg {
        id: Some(id.to_owned()),
        last: false,
    }
}

/// What a session-changing command prints: a line, or with `--json` one object.
fn done(json: bool, id: &str, what: &str, fields: Value) -> Result<i32> {
    if json {
        let mut v = json!({"session_id": id, "done": what});
        if let (Value::Object(m), Value::Object(f)) = (&mut v, fields) {
            m.extend(f);
        }
        json_line(&v);
    } else {
        outln!("{what}");
    }
    Ok(0)
}

/// `ostler model ID MODEL|--default`: the model of the following turns (SetModel).
pub async fn model(a: ModelArgs) -> Result<i32> {
    let (mut conn, id) = session(&a.connect, &by_id(&a.id)).await?;
    let model = if a.default {
        String::new()
    } else {
        let m = a.model.clone().unwrap_or_default();
        if m.trim().is_empty() {
            usage!("the model is empty (use --default to go back to the CLI's default model)");
        }
        m
    };
    conn.sessions
        .set_model(pb::SetModelRequest {
            session_id: id.clone(),
            model: model.clone(),
        })
        .await
        .map_err(|s| status_error("set the model", s))?;
    // The CLI may map the name to another: the session says what it runs now.
    let now = conn
        .sessions
        .get_session(pb::GetSessionRequest {
            session_id: id.clone(),
        })
        .await
        .map(|r| r.into_inner().model)
        .unwrap_or(model);
    done(
        a.json,
        &id,
        &format!("model set to {now}"),
        json!({"model": now}),
    )
}

/// `ostler mode ID MODE`: the permission mode (SetPermissionMode).
pub async fn mode(a: ModeArgs) -> Result<i32> {
    let (mut conn, id) = session(&a.connect, &by_id(&a.id)).await?;
    let now = conn
        .sessions
        .set_permission_mode(pb::SetPermissionModeRequest {
            session_id: id.clone(),
            mode: a.mode as i32,
        })
        .await
        .map_err(|s| status_error("set the permission mode", s))?
        .into_inner();
    let asked = super::json::mode_name(a.mode as i32);
    // The mode in effect, which the CLI may have chosen otherwise.
    let name = if now.cli_mode.is_empty() {
        asked.to_owned()
    } else {
        now.cli_mode
    };
    let text = if name == asked {
        format!("permission mode set to {name}")
    } else {
        format!("permission mode set to {name} (asked for {asked})")
    };
    done(a.json, &id, &text, json!({"permission_mode": name}))
}

/// `ostler thinking ID TOKENS|--reset`: the thinking budget (SetMaxThinkingTokens).
pub async fn thinking(a: ThinkingArgs) -> Result<i32> {
    let (mut conn, id) = session(&a.connect, &by_id(&a.id)).await?;
    let tokens = if a.reset { None } else { a.tokens };
    conn.sessions
        .set_max_thinking_tokens(pb::SetMaxThinkingTokensRequest {
            session_id: id.clone(),
            max_thinking_tokens: tokens,
        })
        .await
        .map_err(|s| status_error("set the thinking budget", s))?;
    let what = match tokens {
        Some(n) => format!("max thinking tokens set to {n}"),
        None => "max thinking tokens reset".to_owned(),
    };
    done(a.json, &id, &what, json!({"max_thinking_tokens": tokens}))
}

/// `ostler stop-task ID TASK_ID`: stops a background task (StopTask).
pub async fn stop_task(a: StopTaskArgs) -> Result<i32> {
    let (mut conn, id) = session(&a.connect, &by_id(&a.id)).await?;
    conn.sessions
        .stop_task(pb::StopTaskRequest {
            session_id: id.clone(),
            task_id: a.task_id.clone(),
        })
        .await
        .map_err(|s| status_error("stop the task", s))?;
    done(
        a.json,
        &id,
        &format!("asked the CLI to stop task {}", a.task_id),
        json!({"task_id": a.task_id}),
    )
}

/// The command that does what a control `subtype` ostler sends or answers itself does
/// (the daemon refuses those in SendControlRequest, naming its RPC).
fn command_for(subtype: &str) -> Option<&'static str> {
    Some(match subtype {
        "initialize" => "ostler run` / `ostler resume",
        "set_model" => "ostler model ID MODEL",
        "set_permission_mode" => "ostler mode ID MODE",
        "set_max_thinking_tokens" => "ostler thinking ID TOKENS",
        "get_context_usage" => "ostler context ID",
        "mcp_status" | "mcp_set_servers" | "mcp_toggle" | "mcp_reconnect" => "ostler mcp ID ...",
        "rewind_files" => "ostler rewind ID --to MESSAGE_ID",
        "stop_task" => "ostler stop-task ID TASK_ID",
        "interrupt" => "ostler interrupt ID",
        "end_session" => "ostler stop ID",
        "can_use_tool" => "ostler approve REQUEST_ID` / `ostler deny REQUEST_ID",
        "hook_callback" => "ostler hook REQUEST_ID",
        "mcp_message" => "ostler tool-result REQUEST_ID",
        "elicitation" => "ostler elicitation REQUEST_ID",
        _ => return None,
    })
}

/// `ostler context ID`: the context window's use.
pub async fn context(args: ContextArgs) -> Result<i32> {
    let a = &args.id;
    let (mut conn, id) = session(&a.connect, &a.session).await?;
    let u = conn
        .sessions
        .get_context_usage(pb::GetContextUsageRequest {
            session_id: id.clone(),
            summary: args.summary,
        })
        .await
        .map_err(|s| status_error("get context usage", s))?
        .into_inner();
    if a.json {
        json_line(&raw(&u.raw_json));
        return Ok(0);
    }
    outln!(
        "{} of {} tokens ({:.1}%){}",
        u.total_tokens,
        u.max_tokens,
        u.percentage,
        if u.model.is_empty() {
            String::new()
        } else {
            format!(" on {}", u.model)
        }
    );
    if let Some(cats) = raw(&u.raw_json).get("categories").and_then(Value::as_array) {
        for c in cats {
            let name = c.get("name").and_then(Value::as_str).unwrap_or("?");
            let tokens = c.get("tokens").and_then(Value::as_u64).unwrap_or(0);
            outln!("  {name:<28} {tokens}");
        }
    }
    Ok(0)
}

/// The servers of an MCP config file: `{"mcpServers": {...}}` or the map itself.
fn servers_of(text: &str) -> Result<std::collections::HashMap<String, String>> {
    let v: Value = serde_json::from_str(text).context("the file is not JSON")?;
    let map = v.get("mcpServers").unwrap_or(&v);
    let map = map
        .as_object()
        .ok_or_else(|| anyhow!("expected a JSON object of server name -> config"))?;
    Ok(map
        .iter()
        .map(|(k, v)| (k.clone(), v.to_string()))
        .collect())
}

/// `ostler mcp ID status|toggle NAME on|off|reconnect NAME|set FILE`.
pub async fn mcp(a: McpArgs) -> Result<i32> {
    let (mut conn, id) = session(&a.connect, &a.session).await?;
    let c = &mut conn.sessions;
    match a.action {
        McpAction::Status => {
            let r = c
                .get_mcp_status(pb::GetMcpStatusRequest {
                    session_id: id.clone(),
                })
                .await
                .map_err(|s| status_error("get MCP status", s))?
                .into_inner();
            if a.json {
                json_line(&json!({"session_id": id, "servers": servers_json(&r.servers)}));
            } else {
                print_servers(&r.servers);
            }
        }
        McpAction::Toggle { name, state } => {
            let enabled = state == "on";
            c.toggle_mcp_server(pb::ToggleMcpServerRequest {
                session_id: id.clone(),
                server_name: name.clone(),
                enabled,
            })
            .await
            .map_err(|s| status_error("toggle MCP server", s))?;
            if a.json {
                json_line(&json!({"session_id": id, "server": name, "enabled": enabled}));
            } else {
                outln!(
                    "MCP server {name} {}",
                    if enabled { "enabled" } else { "disabled" }
                );
            }
        }
        McpAction::Reconnect { name } => {
            c.reconnect_mcp_server(pb::ReconnectMcpServerRequest {
                session_id: id.clone(),
                server_name: name.clone(),
            })
            .await
            .map_err(|s| status_error("reconnect MCP server", s))?;
            if a.json {
                json_line(&json!({"session_id": id, "server": name, "reconnected": true}));
            } else {
                outln!("MCP server {name} reconnected");
            }
        }
        McpAction::Set { file } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let servers_json =
                servers_of(&text).with_context(|| format!("reading {}", file.display()))?;
            let r = c
                .set_mcp_servers(pb::SetMcpServersRequest {
                    session_id: id.clone(),
                    servers_json,
                })
                .await
                .map_err(|s| status_error("set MCP servers", s))?
                .into_inner();
            if a.json {
                json_line(&raw(&r.raw_json));
            } else {
                outln!(
                    "added: {}; removed: {}",
                    r.added.join(", "),
                    r.removed.join(", ")
                );
                for (name, e) in &r.errors {
                    outln!("error: {name}: {e}");
                }
            }
            if !r.errors.is_empty() {
                return Ok(super::EXIT_FAILED);
            }
        }
    }
    Ok(0)
}

/// `ostler rewind ID --to MESSAGE_ID [--dry-run]`.
pub async fn rewind(a: RewindArgs) -> Result<i32> {
    let (mut conn, id) = session(&a.connect, &a.session).await?;
    let r = conn
        .sessions
        .rewind_files(pb::RewindFilesRequest {
            session_id: id.clone(),
            message_id: a.to.clone(),
            dry_run: a.dry_run,
        })
        .await
        .map_err(|s| status_error("rewind files", s))?
        .into_inner();
    if a.json {
        json_line(&json!({
            "session_id": id,
            "message_id": a.to,
            "dry_run": a.dry_run,
            "can_rewind": r.can_rewind,
            "error": r.error,
            "files_changed": r.files_changed,
            "insertions": r.insertions,
            "deletions": r.deletions,
        }));
    } else if !r.can_rewind {
        outln!("cannot rewind: {}", r.error);
    } else {
        outln!(
            "{} {} files (+{} -{}) to their state at message {}",
            if a.dry_run { "would rewind" } else { "rewound" },
            r.files_changed,
            r.insertions,
            r.deletions,
            a.to
        );
    }
    Ok(if r.can_rewind { 0 } else { super::EXIT_FAILED })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mcp_config_files_of_either_shape() {
        let a = servers_of(r#"{"mcpServers": {"t": {"type": "stdio", "command": "x"}}}"#).unwrap();
        let b = servers_of(r#"{"t": {"type": "stdio", "command": "x"}}"#).unwrap();
        assert_eq!(a, b);
        assert!(a["t"].contains("\"command\":\"x\""));
        assert!(servers_of("[1]").is_err());
        assert!(servers_of("nope").is_err());
    }
}
