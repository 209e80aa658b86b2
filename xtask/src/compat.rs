//! `cargo xtask compat probe|generate`: the Claude Code compatibility matrix.
//!
//! - `probe --release V...`: install each release (test kit installer), measure it and write
//!   `contracts/compat/<V>.toml`:
//!   - the stdio permission protocol, by a real turn against the fake model server: the
//!     model asks for `Bash touch probe-created.txt`; it works when a `can_use_tool`
//!     control request arrives and, once allowed, the file exists;
//!   - which flags the release accepts (`ostler_supervisor::discover::probe_flags`: print
//!     mode with stdin at EOF, unknown options are reported by the option parser);
//!   - the `capabilities` it announces in `system/init`;
//!   - which control request subtypes it serves (`control_probe`): `initialize` before the
//!     first user message, one real turn, then every other probed subtype at once with
//!     harmless arguments; each is recorded as answered, error-answered (known subtype,
//!     refused arguments), unsupported (`unsupported_request`) or no answer within
//!     [`control_bound`];
//!   - which hook events it knows (`hook_event_probe`: its own list of event names).
//! - `generate [--check]`: turn the evidence of every pinned release
//!   (`contracts/releases.toml`) into `crates/ostler-supervisor/src/matrix_generated.rs` and
//!   `docs/compatibility.md`; the minimum supported release and the capability boundaries
//!   are derived from the evidence. `--check` fails when either file would change or a
//!   pinned release has no evidence.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use ostler_testkit::timeouts::secs;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

#[derive(clap::Args)]
pub struct ProbeArgs {
    /// Releases to measure (default: every pinned release).
    #[arg(long = "release")]
    pub releases: Vec<String>,
    /// Only the newest pinned release (what `cargo xtask test` checks with `--check`).
    #[arg(long, conflicts_with = "releases")]
    pub newest: bool,
    /// Only print the evidence, do not write it.
    #[arg(long)]
    pub dry_run: bool,
    /// Measure again and fail if a release no longer matches its recorded evidence.
    #[arg(long)]
    pub check: bool,
    /// Only measure the session-option flags (`options`), keeping the rest of the
    /// recorded evidence.
    #[arg(long)]
    pub options_only: bool,
    /// With `--options-only`: measure only these flags (repeatable), keeping the other
    /// recorded flags.
    #[arg(long = "option", value_name = "FLAG", requires = "options_only")]
    pub only_options: Vec<String>,
    /// Only measure which control requests from the CLI ostler can serve
    /// (`cli_requests`), keeping the rest of the recorded evidence.
    #[arg(long)]
    pub cli_requests_only: bool,
    /// Only measure which control requests the release serves (`control`,
    /// `control_errors`), keeping the rest of the recorded evidence.
    #[arg(long)]
    pub controls_only: bool,
    /// Only measure the dialect facts (`dialect`: what `--resume-session-at` matches),
    /// keeping the rest of the recorded evidence.
    #[arg(long)]
    pub dialect_only: bool,
    /// Only read which hook events the release knows (`hook_events`) and measure which it
    /// calls (`hook_calls`), keeping the rest of the recorded evidence.
    #[arg(long)]
    pub hook_events_only: bool,
    /// Only measure which messages the release writes on request (`outputs`), keeping the
    /// rest of the recorded evidence.
    #[arg(long)]
    pub outputs_only: bool,
    /// Only measure which user-message fields the release honours (`inputs`), keeping the
    /// rest of the recorded evidence.
    #[arg(long)]
    pub inputs_only: bool,
    /// Only measure which `initialize` fields the release honours (`init_fields`), keeping
    /// the rest of the recorded evidence.
    #[arg(long)]
    pub init_fields_only: bool,
    /// With `--init-fields-only`: measure only these fields (repeatable, e.g.
    /// `dialog_kinds`), keeping the other recorded fields.
    #[arg(
        long = "init-field",
        value_name = "FIELD",
        requires = "init_fields_only"
    )]
    pub only_init_fields: Vec<String>,
    /// Only measure which policies the release enforces (`policies`), keeping the rest of
    /// the recorded evidence.
    #[arg(long)]
    pub policies_only: bool,
}

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// Fail if the generated files are out of date instead of writing them.
    #[arg(long)]
    pub check: bool,
}

/// `contracts/compat/<version>.toml`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Evidence {
    pub version: String,
    /// A `can_use_tool` control request arrived for a permission-needing tool.
    pub stdio_permission_prompt: bool,
    /// What happened in the permission probe, in words.
    pub permission_probe: String,
    pub include_partial_messages: bool,
    pub fork_session: bool,
    pub max_turns: bool,
    /// `absent`, `loopback`, `anthropic_only`.
    pub sdk_url: String,
    /// `capabilities` announced in `system/init` (empty: none).
    #[serde(default)]
    pub announced: Vec<String>,
    /// Control request subtype -> `answered`, `error_answered`, `unsupported`, `no_answer`.
    #[serde(default)]
    pub control: BTreeMap<String, String>,
    /// The error text of error-answered and unsupported subtypes (clipped).
    #[serde(default)]
    pub control_errors: BTreeMap<String, String>,
    /// Session-option flag (`PROBED_OPTIONS`) -> accepted by the option parser.
    #[serde(default)]
    pub options: BTreeMap<String, bool>,
    /// Control requests from the CLI that ostler serves (issue 11) -> whether a whole
    /// exchange worked: `mcp_message` = an SDK MCP server's tool was listed, called by the
    /// model and its result reached the model.
    #[serde(default)]
    pub cli_requests: BTreeMap<String, bool>,
    /// Dialect facts (`ostler_supervisor::compat::Dialect`): `resume_session_at` = `uuid`,
    /// `message_id` or `absent` (what `--resume-session-at` matches in the transcript).
    #[serde(default)]
    pub dialect: BTreeMap<String, String>,
    /// Hook event (`ostler_protocol::hooks::HOOK_EVENTS`, the Agent SDKs' names) -> whether
    /// the release's own list of hook event names has it ([`hook_event_probe`]).
    #[serde(default)]
    pub hook_events: BTreeMap<String, bool>,
    /// Hook events whose calls are measured in a turn ([`hook_call_probe`]) -> whether the
    /// release called the registered hook. A known event measured `false` here is never
    /// called in a session of ostler's, so it counts as unusable in the matrix.
    #[serde(default)]
    pub hook_calls: BTreeMap<String, bool>,
    /// Messages written on request ([`output_probe`]) -> whether the release wrote one:
    /// `prompt_suggestion` = a suggestion came after the second of two turns of a session
    /// whose `initialize` asked for `promptSuggestions`.
    #[serde(default)]
    pub outputs: BTreeMap<String, bool>,
    /// User-message fields (`ostler_supervisor::compat::MESSAGE_FIELDS`) -> whether the
    /// release honoured each ([`input_probe`]).
    #[serde(default)]
    pub inputs: BTreeMap<String, bool>,
    /// `initialize` fields (`ostler_supervisor::compat::INIT_FIELDS`) -> whether the release
    /// honoured each ([`init_field_probe`]).
    #[serde(default)]
    pub init_fields: BTreeMap<String, bool>,
    /// Policies (`ostler_supervisor::compat::POLICIES`) -> whether the release enforced each
    /// ([`policy_probe`]).
    #[serde(default)]
    pub policies: BTreeMap<String, bool>,
}

fn root() -> PathBuf {
    ostler_testkit::workspace_root()
}

fn evidence_dir() -> PathBuf {
    root().join("contracts").join("compat")
}

fn evidence_path(v: &str) -> PathBuf {
    evidence_dir().join(format!("{v}.toml"))
}

pub fn probe(a: ProbeArgs) -> Result<()> {
    let releases: Vec<String> = if a.newest {
        vec![ostler_testkit::releases::newest()?.version]
    } else if a.releases.is_empty() {
        ostler_testkit::releases::pinned()?
            .into_iter()
            .map(|r| r.version)
            .collect()
    } else {
        a.releases
    };
    let rt = tokio::runtime::Runtime::new()?;
    let mut drift = Vec::new();
    for v in releases {
        // A partial probe keeps the rest of the recorded evidence.
        let recorded = || -> Result<(Evidence, PathBuf)> {
            let ev: Evidence = toml::from_str(
                &std::fs::read_to_string(evidence_path(&v))
                    .with_context(|| format!("no recorded evidence for {v}"))?,
            )?;
            let cache = ostler_testkit::releases::default_cache_dir();
            Ok((ev, ostler_testkit::releases::ensure(&v, &cache)?))
        };
        let ev = if a.controls_only {
            let (mut ev, binary) = recorded()?;
            (ev.control, ev.control_errors) = rt
                .block_on(control_probe(&binary))
                .with_context(|| format!("control probe of {v}"))?;
            ev
        } else if a.cli_requests_only {
            let (mut ev, binary) = recorded()?;
            ev.cli_requests = rt.block_on(cli_request_probe(&binary))?;
            ev
        } else if a.dialect_only {
            let (mut ev, binary) = recorded()?;
            ev.dialect = rt.block_on(dialect_probe(&binary))?;
            ev
        } else if a.hook_events_only {
            let (mut ev, binary) = recorded()?;
            ev.hook_events = hook_event_probe(&binary)?;
            ev.hook_calls = rt.block_on(hook_call_probe(&binary))?;
            ev
        } else if a.outputs_only {
            let (mut ev, binary) = recorded()?;
            ev.outputs = rt.block_on(output_probe(&binary))?;
            ev
        } else if a.inputs_only {
            let (mut ev, binary) = recorded()?;
            ev.inputs = rt.block_on(input_probe(&binary))?;
            ev
        } else if a.init_fields_only {
            let (mut ev, binary) = recorded()?;
            if a.only_init_fields.is_empty() {
                ev.init_fields = rt.block_on(init_field_probe(&binary, &ev.control))?;
            } else {
                for f in &a.only_init_fields {
                    let honoured = rt.block_on(init_field_probe_one(&binary, &ev.control, f))?;
                    ev.init_fields.insert(f.clone(), honoured);
                }
            }
            ev
        } else if a.policies_only {
            let (mut ev, binary) = recorded()?;
            ev.policies = rt.block_on(policy_probe(&binary, &ev.options))?;
            ev
        } else if a.options_only {
            let (mut ev, binary) = recorded()?;
            let measured = rt.block_on(option_probe(&binary, &a.only_options))?;
            if a.only_options.is_empty() {
                ev.options = measured;
            } else {
                ev.options.extend(measured);
            }
            ev
        } else {
            rt.block_on(measure(&v))?
        };
        if a.check {
            let recorded: Evidence = toml::from_str(
                &std::fs::read_to_string(evidence_path(&v))
                    .with_context(|| format!("no recorded evidence for {v}"))?,
            )?;
            if recorded == ev {
                println!("{v}: matches its recorded evidence");
            } else {
                println!("{v}: DRIFT\n  recorded: {recorded:?}\n  measured: {ev:?}");
                drift.push(v);
            }
            continue;
        }
        let text = format!(
            "# Measured by `cargo xtask compat probe --release {v}`; regenerate, do not edit.\n{}",
            toml::to_string(&ev)?
        );
        if a.dry_run {
            println!("{text}");
        } else {
            std::fs::create_dir_all(evidence_dir())?;
            std::fs::write(evidence_path(&v), text)?;
            println!(
                "{v}: stdio permissions {}, partial messages {}, fork {}, max-turns {}, sdk-url {}",
                ev.stdio_permission_prompt,
                ev.include_partial_messages,
                ev.fork_session,
                ev.max_turns,
                ev.sdk_url
            );
        }
    }
    if !drift.is_empty() {
        bail!(
            "releases no longer match their evidence: {}",
            drift.join(", ")
        );
    }
    Ok(())
}

const PROBE_SCENARIO: &str = r#"
description = "compat probe: does --permission-prompt-tool stdio produce can_use_tool?"
default_text = "ok"
[[model]]
name = "tool"
when = { last_user_text_contains = "PROBE-PERMISSION", stream = true }
blocks = [ { type = "tool_use", id = "toolu_probe_1", name = "Bash", input = { command = "touch probe-created.txt", description = "create a file" } } ]
[[model]]
name = "after"
when = { has_tool_result_for = "toolu_probe_1" }
blocks = [ { type = "text", text = "probe done" } ]
"#;

async fn measure(version: &str) -> Result<Evidence> {
    let cache = ostler_testkit::releases::default_cache_dir();
    let v = version.to_string();
    let binary =
        tokio::task::spawn_blocking(move || ostler_testkit::releases::ensure(&v, &cache)).await??;
    // The progress-summary probe's sessions wait out a fixed window (most of the whole
    // measurement's time), idle: it runs beside the other probes, which run in turn.
    let (progress, evidence) = tokio::join!(
        progress_summary_probe(&binary),
        measure_but_progress(version, &binary)
    );
    let mut evidence = evidence?;
    evidence
        .init_fields
        .insert("agent_progress_summaries".to_string(), progress?);
    Ok(evidence)
}

/// [`measure`] but the initialize field `agent_progress_summaries`.
async fn measure_but_progress(version: &str, binary: &Path) -> Result<Evidence> {
    let flags = ostler_supervisor::discover::probe_flags(binary, secs(30))
        .await
        .with_context(|| format!("flag probe of {version}"))?;
    let (stdio, what, announced) = permission_probe(binary).await?;
    let (control, control_errors) = control_probe(binary)
        .await
        .with_context(|| format!("control probe of {version}"))?;
    let get = |f: ostler_supervisor::Flag| flags.accepted.get(&f).copied().unwrap_or(false);
    let options = option_probe(binary, &[]).await?;
    let policies = policy_probe(binary, &options).await?;
    let init_fields = init_fields_but_progress(binary, &control).await?;
    Ok(Evidence {
        version: version.to_string(),
        stdio_permission_prompt: stdio,
        permission_probe: what,
        include_partial_messages: get(ostler_supervisor::Flag::IncludePartialMessages),
        fork_session: get(ostler_supervisor::Flag::ForkSession),
        max_turns: get(ostler_supervisor::Flag::MaxTurns),
        sdk_url: flags.sdk_url.as_str().to_string(),
        announced,
        control,
        control_errors,
        options,
        cli_requests: cli_request_probe(binary).await?,
        dialect: dialect_probe(binary).await?,
        hook_events: hook_event_probe(binary)?,
        hook_calls: hook_call_probe(binary).await?,
        outputs: output_probe(binary).await?,
        inputs: input_probe(binary).await?,
        init_fields,
        policies,
    })
}

/// Which hook events ([`HOOK_EVENTS`]) the release knows, read from the list of hook event
/// names it carries (`cli.js`, or the JavaScript in the native binary): the longest run of
/// quoted names starting `"PreToolUse","PostToolUse"`. The CLI validates the hook settings
/// it loads against that list and fires only its events; a registration of another event in
/// `initialize` is accepted and never called (measured by hand on 1.0.128 and 2.0.77 with
/// all 34 of the TypeScript SDK 0.3.332's events registered: only events in their lists
/// were called).
fn hook_event_probe(binary: &Path) -> Result<BTreeMap<String, bool>> {
    use ostler_protocol::hooks::HOOK_EVENTS;
    let path =
        std::fs::canonicalize(binary).with_context(|| format!("resolve {}", binary.display()))?;
    let bytes = std::fs::read(&path).with_context(|| format!("read {}", path.display()))?;
    let mut longest: Vec<&str> = Vec::new();
    for at in memchr::memmem::find_iter(&bytes, br#""PreToolUse","PostToolUse""#) {
        let names = quoted_names(&bytes[at..]);
        if names.len() > longest.len() {
            longest = names;
        }
    }
    if longest.is_empty() {
        bail!("{}: no list of hook event names found", path.display());
    }
    let unknown: Vec<&str> = longest
        .iter()
        .copied()
        .filter(|n| !HOOK_EVENTS.contains(n))
        .collect();
    if !unknown.is_empty() {
        println!(
            "{}: hook events ostler does not take yet: {}",
            path.display(),
            unknown.join(", ")
        );
    }
    Ok(HOOK_EVENTS
        .iter()
        .map(|e| (e.to_string(), longest.contains(e)))
        .collect())
}

/// The names of a run `"A","B",...` at the start of `b` (letters only), up to the first
/// byte that continues it no further.
fn quoted_names(b: &[u8]) -> Vec<&str> {
    let mut out = Vec::new();
    let mut i = 0;
    while b.get(i) == Some(&b'"') {
        let start = i + 1;
        let len = b[start..]
            .iter()
            .take_while(|c| c.is_ascii_alphabetic())
            .count();
        let end = start + len;
        if len == 0 || b.get(end) != Some(&b'"') {
            break;
        }
        // ASCII letters only, so this cannot fail.
        if let Ok(name) = std::str::from_utf8(&b[start..end]) {
            out.push(name);
        }
        i = end + 1;
        if b.get(i) != Some(&b',') {
            break;
        }
        i += 1;
    }
    out
}

const RESUME_AT_SCENARIO: &str = r#"
description = "compat probe: what does --resume-session-at match?"
default_text = "ok"
[[model]]
name = "first"
when = { last_user_text_contains = "PROBE-FIRST" }
blocks = [ { type = "text", text = "first answer" } ]
[[model]]
name = "second"
when = { last_user_text_contains = "PROBE-SECOND" }
blocks = [ { type = "text", text = "second answer" } ]
"#;

/// Reads a probe child's whole stderr in the background.
fn collect_stderr(child: &mut tokio::process::Child) -> Result<tokio::task::JoinHandle<String>> {
    let stderr = child.stderr.take().context("stderr")?;
    Ok(tokio::spawn(async move {
        let mut s = String::new();
        let mut r = BufReader::new(stderr);
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut r, &mut s).await;
        s
    }))
}

/// Ends a probe child (stdin closed, 10 s to exit, then killed) and returns its stderr.
async fn finish(
    mut child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    err_task: tokio::task::JoinHandle<String>,
) -> String {
    drop(stdin);
    let _ = tokio::time::timeout(secs(10), child.wait()).await;
    let _ = child.start_kill();
    tokio::time::timeout(secs(5), err_task)
        .await
        .ok()
        .and_then(|r| r.ok())
        .unwrap_or_default()
}

/// One stream-json run in `herm` with `extra` arguments and one user message: the lines
/// up to its `result` (or the end of output) and its stderr.
async fn probe_turn(
    herm: &ostler_testkit::cli::Hermetic,
    binary: &Path,
    server: &ostler_testkit::FakeModelServer,
    extra: &[&str],
    text: &str,
) -> Result<(Vec<serde_json::Value>, String)> {
    // A text-only turn: no permission prompt (older releases lack the stdio tool).
    let mut args = ostler_protocol::argv::StreamJsonArgs::base();
    for pair in extra.chunks(2) {
        if let [flag, value] = pair {
            args.option(flag, *value);
        }
    }
    let mut child = herm
        .command(binary, &args.into_args(), &server.url(), &BTreeMap::new())
        .spawn()?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let stdout = child.stdout.take().context("stdout")?;
    let err_task = collect_stderr(&mut child)?;
    let user = serde_json::json!({"type":"user","message":{"role":"user","content":text},"parent_tool_use_id":null,"session_id":""});
    // A release that exits at once may have closed stdin already.
    let _ = stdin.write_all(format!("{user}\n").as_bytes()).await;
    let _ = stdin.flush().await;
    let mut lines = BufReader::new(stdout).lines();
    let mut out = Vec::new();
    let run = async {
        while let Some(line) = lines.next_line().await? {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let done = v["type"] == "result";
            out.push(v);
            if done {
                break;
            }
        }
        anyhow::Ok(())
    };
    let _ = tokio::time::timeout(secs(90), run).await;
    let stderr = finish(child, stdin, err_task).await;
    Ok((out, stderr))
}

/// What `--resume-session-at` matches: one turn, then a resume at that turn's assistant
/// entry by its transcript `uuid`. The flag unknown: `absent`; the resumed turn runs:
/// `uuid`; "No assistant message found with message.id" (1.0.128 matches the API
/// `message.id`): `message_id`, confirmed by a resume at the message id. Anything else is
/// left unmeasured.
async fn dialect_probe(binary: &Path) -> Result<BTreeMap<String, String>> {
    use ostler_supervisor::compat::{Dialect, ResumeAtKey};
    let scenario =
        ostler_testkit::Scenario::from_toml("compat-probe-resume-at", RESUME_AT_SCENARIO)?;
    let server = ostler_testkit::FakeModelServer::start(scenario).await?;
    let herm = ostler_testkit::cli::Hermetic::new()?;
    let (first, stderr) = probe_turn(&herm, binary, &server, &[], "PROBE-FIRST").await?;
    let session = first
        .iter()
        .find_map(|v| v["session_id"].as_str().filter(|s| !s.is_empty()))
        .with_context(|| format!("resume-at probe: no session id in the first turn: {stderr}"))?
        .to_string();
    let assistant = first
        .iter()
        .rfind(|v| v["type"] == "assistant")
        .with_context(|| format!("resume-at probe: no assistant message: {stderr}"))?;
    let uuid = assistant["uuid"].as_str().unwrap_or_default().to_string();
    let message_id = assistant["message"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let ran = |out: &[serde_json::Value]| {
        out.iter()
            .any(|v| v["type"] == "result" && v["subtype"] == "success")
    };
    let (out, err) = probe_turn(
        &herm,
        binary,
        &server,
        &["--resume", &session, "--resume-session-at", &uuid],
        "PROBE-SECOND",
    )
    .await?;
    let value = if err.contains("unknown option '--resume-session-at'") {
        Some(ResumeAtKey::ABSENT)
    } else if ran(&out) && !uuid.is_empty() {
        Some(ResumeAtKey::Uuid.as_str())
    } else if err.contains("No assistant message found with message.id") {
        let (out, _) = probe_turn(
            &herm,
            binary,
            &server,
            &["--resume", &session, "--resume-session-at", &message_id],
            "PROBE-SECOND",
        )
        .await?;
        ran(&out).then_some(ResumeAtKey::MessageId.as_str())
    } else {
        None
    };
    Ok(value
        .map(|v| (Dialect::RESUME_SESSION_AT.to_string(), v.to_string()))
        .into_iter()
        .collect())
}

/// A scenario for the probes of control requests from the CLI: the model calls `tool`
/// with `input` (TOML inline table) when the user's text has `trigger`, then ends the turn.
fn tool_call_scenario(description: &str, trigger: &str, tool: &str, input: &str) -> String {
    format!(
        r#"
description = "compat probe: {description}"
default_text = "ok"
[[model]]
name = "tool"
when = {{ last_user_text_contains = "{trigger}", stream = true }}
blocks = [ {{ type = "tool_use", id = "toolu_probe", name = "{tool}", input = {input} }} ]
[[model]]
name = "after"
when = {{ has_tool_result_for = "toolu_probe" }}
blocks = [ {{ type = "text", text = "probe done" }} ]
"#
    )
}

/// Which control requests from the CLI ostler can serve: `mcp_message` works when a
/// session with an SDK MCP server (`--mcp-config` `{"type":"sdk"}`, answered by
/// `ostler_protocol::sdk_mcp`) has its tool called by the model and the tool's result
/// reaches the model; `elicitation` works when a stdio MCP server's `elicitation/create`
/// reaches ostler as the `elicitation` control request and the accepted form's content
/// reaches the server (and, in the tool's result, the model).
async fn cli_request_probe(binary: &Path) -> Result<BTreeMap<String, bool>> {
    use ostler_protocol::sdk_mcp;
    const RESULT_TEXT: &str = "PROBE-SDK-MCP-RESULT";
    let decl = vec![sdk_mcp::ToolServerDecl {
        name: "ostler_probe".into(),
        tools: vec![sdk_mcp::ToolDecl {
            name: "probe_tool".into(),
            description: "probe".into(),
            input_schema: String::new(),
        }],
        timeout_secs: 60,
    }];
    let scenario = tool_call_scenario(
        "does the CLI call a tool of an SDK MCP server (mcp_message)?",
        "PROBE-SDK-MCP",
        "mcp__ostler_probe__probe_tool",
        r#"{ id = "P-1" }"#,
    );
    let server = serve_turn(
        binary,
        &scenario,
        &[
            (
                "--mcp-config",
                r#"{"mcpServers":{"ostler_probe":{"type":"sdk","name":"ostler_probe"}}}"#.into(),
            ),
            ("--allowedTools", "mcp__ostler_probe__probe_tool".into()),
        ],
        "PROBE-SDK-MCP please",
        |request| match request["subtype"].as_str() {
            Some("mcp_message") => {
                let name = request["server_name"].as_str().unwrap_or("");
                let mcp = match sdk_mcp::handle(&decl, name, &request["message"]) {
                    sdk_mcp::Handled::Respond(r)
                    | sdk_mcp::Handled::Cancelled { answer: r, .. } => r,
                    sdk_mcp::Handled::Call(c) => sdk_mcp::call_result(
                        &c.id,
                        &[sdk_mcp::Content::Text {
                            text: RESULT_TEXT.into(),
                        }],
                        false,
                    ),
                };
                sdk_mcp::control_body(mcp)
            }
            _ => serde_json::json!({"behavior":"allow","updatedInput":request["input"]}),
        },
    )
    .await?;
    let mcp_message = tool_result_reached(&server, RESULT_TEXT);
    // MCP elicitation: the test kit's stdio MCP server (this binary, `xtask test-mcp`) asks
    // for a form during its tool call; the release passes it on as the `elicitation`
    // control request, and the accepted form's content comes back in the tool's result.
    const ANSWER: &str = "PROBE-ELICITATION-ANSWER";
    let me = std::env::current_exe().context("the xtask binary's path")?;
    let config = serde_json::json!({"mcpServers": {"probe": {
        "type": "stdio", "command": me, "args": [TEST_MCP_COMMAND],
    }}});
    let tool = format!("mcp__probe__{}", ostler_testkit::mcp_server::ELICITING_TOOL);
    let scenario = tool_call_scenario(
        "does the CLI pass an MCP server's elicitation on (elicitation)?",
        "PROBE-ELICITATION",
        &tool,
        r#"{ ticket = "P-1" }"#,
    );
    let server = serve_turn(
        binary,
        &scenario,
        &[
            ("--mcp-config", config.to_string()),
            ("--allowedTools", tool.clone()),
        ],
        "PROBE-ELICITATION please",
        |request| match request["subtype"].as_str() {
            Some("elicitation") => {
                serde_json::json!({"action": "accept", "content": {"reason": ANSWER}})
            }
            _ => serde_json::json!({"behavior":"allow","updatedInput":request["input"]}),
        },
    )
    .await?;
    let elicitation = tool_result_reached(&server, ANSWER);
    Ok(BTreeMap::from([
        ("elicitation".to_string(), elicitation),
        ("mcp_message".to_string(), mcp_message),
    ]))
}

/// The hidden xtask subcommand that serves the test kit's stdio MCP server
/// (`ostler_testkit::mcp_server`), for the elicitation probe.
pub const TEST_MCP_COMMAND: &str = "test-mcp";

/// One session-mode turn of `binary` against a fake model server playing `scenario`, with
/// `options` and one user message `text`; every control request from the CLI is answered
/// `answer(request)`. Returns the model server, to see what reached the model.
async fn serve_turn(
    binary: &Path,
    scenario: &str,
    options: &[(&str, String)],
    text: &str,
    mut answer: impl FnMut(&serde_json::Value) -> serde_json::Value,
) -> Result<ostler_testkit::FakeModelServer> {
    serve_turn_in(
        &ostler_testkit::cli::Hermetic::new()?,
        binary,
        scenario,
        options,
        None,
        text,
        &mut answer,
    )
    .await
}

/// [`serve_turn`] in `herm`, with `initialize` (these fields) sent before the message when
/// given.
async fn serve_turn_in(
    herm: &ostler_testkit::cli::Hermetic,
    binary: &Path,
    scenario: &str,
    options: &[(&str, String)],
    initialize: Option<serde_json::Value>,
    text: &str,
    answer: &mut dyn FnMut(&serde_json::Value) -> serde_json::Value,
) -> Result<ostler_testkit::FakeModelServer> {
    let turns = Turns {
        initialize,
        texts: &[text],
        until: None,
        limit: secs(90),
    };
    serve_turns(herm, binary, scenario, options, turns, answer).await
}

/// What [`serve_turns`] sends, and when it stops.
struct Turns<'a> {
    /// Sent (as the fields of `initialize`) before the first message.
    initialize: Option<serde_json::Value>,
    /// The user messages: the first at once, each other when the turn before ended.
    texts: &'a [&'a str],
    /// Stop at the line this picks; `None`: at the last turn's `result`.
    until: Option<&'a mut dyn FnMut(&serde_json::Value) -> bool>,
    /// How long it may all take (a line `until` waits for that never comes ends here).
    limit: Duration,
}

/// Session-mode turns of `binary` against a fake model server playing `scenario`, with
/// `options`; every control request from the CLI is answered `answer(request)`. Returns
/// the model server, to see what reached the model.
async fn serve_turns(
    herm: &ostler_testkit::cli::Hermetic,
    binary: &Path,
    scenario: &str,
    options: &[(&str, String)],
    turns: Turns<'_>,
    answer: &mut dyn FnMut(&serde_json::Value) -> serde_json::Value,
) -> Result<ostler_testkit::FakeModelServer> {
    serve_turns_env(
        herm,
        binary,
        scenario,
        options,
        &BTreeMap::new(),
        turns,
        answer,
    )
    .await
}

/// [`serve_turns`] with `env` added to the CLI's environment.
async fn serve_turns_env(
    herm: &ostler_testkit::cli::Hermetic,
    binary: &Path,
    scenario: &str,
    options: &[(&str, String)],
    env: &BTreeMap<String, String>,
    mut turns: Turns<'_>,
    answer: &mut dyn FnMut(&serde_json::Value) -> serde_json::Value,
) -> Result<ostler_testkit::FakeModelServer> {
    let mut s = ProbeSession::start_env(herm, binary, scenario, options, env).await?;
    if let Some(mut fields) = turns.initialize.take() {
        fields["subtype"] = "initialize".into();
        let init = serde_json::json!({"type":"control_request","request_id":"probe-init","request":fields});
        s.send(&[init]).await?;
    }
    let mut texts = turns.texts.iter();
    if let Some(t) = texts.next() {
        s.send(&[user_message(t, serde_json::json!({}))]).await?;
    }
    let deadline = tokio::time::Instant::now() + turns.limit;
    while let Some(v) = s.next(deadline, answer).await? {
        if turns.until.as_mut().is_some_and(|until| until(&v)) {
            break;
        }
        if v["type"] == "result" {
            match texts.next() {
                Some(t) => s.send(&[user_message(t, serde_json::json!({}))]).await?,
                None if turns.until.is_none() => break,
                None => {}
            }
        }
    }
    Ok(s.finish().await)
}

/// A stream-json user message with `text`, and `fields` (an object) added to it.
fn user_message(text: &str, fields: serde_json::Value) -> serde_json::Value {
    let mut m = serde_json::json!({"type":"user","message":{"role":"user","content":text},"parent_tool_use_id":null,"session_id":""});
    if let (Some(m), serde_json::Value::Object(f)) = (m.as_object_mut(), fields) {
        m.extend(f);
    }
    m
}

/// A session-mode CLI process of a probe, against its own fake model server: lines written
/// as given, lines read one at a time with the CLI's control requests answered.
struct ProbeSession {
    server: ostler_testkit::FakeModelServer,
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    /// When the process was seen to exit.
    exited: Option<tokio::time::Instant>,
}

impl ProbeSession {
    /// `binary` in `herm` with `options`, its model played by `scenario`.
    async fn start(
        herm: &ostler_testkit::cli::Hermetic,
        binary: &Path,
        scenario: &str,
        options: &[(&str, String)],
    ) -> Result<Self> {
        Self::start_env(herm, binary, scenario, options, &BTreeMap::new()).await
    }

    /// [`Self::start`] with `env` added to the CLI's environment.
    async fn start_env(
        herm: &ostler_testkit::cli::Hermetic,
        binary: &Path,
        scenario: &str,
        options: &[(&str, String)],
        env: &BTreeMap<String, String>,
    ) -> Result<Self> {
        let scenario = ostler_testkit::Scenario::from_toml("compat-probe", scenario)?;
        let server = ostler_testkit::FakeModelServer::start(scenario).await?;
        let mut args = ostler_protocol::argv::StreamJsonArgs::session();
        for (flag, value) in options {
            args.option(flag, value);
        }
        let mut child = herm
            .command(binary, &args.into_args(), &server.url(), env)
            .spawn()?;
        let stdin = child.stdin.take().context("stdin")?;
        let stdout = child.stdout.take().context("stdout")?;
        Ok(Self {
            server,
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            exited: None,
        })
    }

    /// Writes `lines` in one write (a release reads them together). A release that
    /// exited has closed stdin: what it did is read from its output and the model server.
    async fn send(&mut self, lines: &[serde_json::Value]) -> Result<()> {
        let mut buf = String::new();
        for l in lines {
            writeln!(buf, "{l}")?;
        }
        let written = async {
            self.stdin.write_all(buf.as_bytes()).await?;
            self.stdin.flush().await
        };
        match written.await {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            r => Ok(r?),
        }
    }

    /// The next JSON line, `None` at the end of output or at `deadline`. A control request
    /// is answered `answer(request)` before it is returned.
    async fn next(
        &mut self,
        deadline: tokio::time::Instant,
        answer: &mut dyn FnMut(&serde_json::Value) -> serde_json::Value,
    ) -> Result<Option<serde_json::Value>> {
        loop {
            // A release that exited may leave a process behind that holds its stdout open
            // (1.0.58): what it wrote is read for 2 s more, not until the deadline.
            let line = match self.exited {
                Some(at) => {
                    let until = deadline.min(at + secs(2));
                    match tokio::time::timeout_at(until, self.lines.next_line()).await {
                        Ok(line) => line?,
                        Err(_) => None,
                    }
                }
                None => tokio::select! {
                    line = tokio::time::timeout_at(deadline, self.lines.next_line()) => match line {
                        Ok(line) => line?,
                        Err(_) => None,
                    },
                    _ = self.child.wait() => {
                        self.exited = Some(tokio::time::Instant::now());
                        continue;
                    }
                },
            };
            let Some(line) = line else {
                return Ok(None);
            };
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if v["type"] == "control_request" {
                let body = answer(&v["request"]);
                let resp = serde_json::json!({"type":"control_response","response":{"subtype":"success","request_id":v["request_id"],"response":body}});
                self.send(&[resp]).await?;
            }
            return Ok(Some(v));
        }
    }

    /// Reads until a line `pick` returns true for (`true`), or the end of output or
    /// `limit` (`false`); control requests are answered with an empty success.
    async fn until(
        &mut self,
        limit: Duration,
        mut pick: impl FnMut(&serde_json::Value) -> bool,
    ) -> Result<bool> {
        let deadline = tokio::time::Instant::now() + limit;
        while let Some(v) = self.next(deadline, &mut |_| serde_json::json!({})).await? {
            if pick(&v) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Waits until a request to the model satisfies `pick` (`true`), or `limit` passes or
    /// the process exits without one (`false`).
    async fn request(
        &mut self,
        limit: Duration,
        pick: impl Fn(&ostler_testkit::server::RecordedRequest) -> bool,
    ) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let seen = self.server.requests();
            if seen.iter().any(&pick) {
                return true;
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() || self.exited.is_some() {
                return false;
            }
            tokio::select! {
                _ = self.server.wait_for_requests(seen.len() + 1, left) => {}
                _ = self.child.wait() => self.exited = Some(tokio::time::Instant::now()),
            }
        }
    }

    /// Closes stdin, gives the process 10 s to exit, then kills it; returns the model
    /// server, to see what reached the model.
    async fn finish(mut self) -> ostler_testkit::FakeModelServer {
        drop(self.stdin);
        let _ = tokio::time::timeout(secs(10), self.child.wait()).await;
        let _ = self.child.start_kill();
        self.server
    }
}

/// The prompt the CLI sends the model for a prompt suggestion starts with this (2.1.120
/// and 2.1.332, measured by hand with `OSTLER_FAKE_MODEL_BODIES=1`).
const SUGGESTION_MODE: &str = "[SUGGESTION MODE";

/// What the probe's model suggests as the next prompt. The CLI drops suggestions that do
/// not look like a user's prompt (2.1.332 dropped `PROBE-SUGGESTED-PROMPT`).
const PROBE_SUGGESTION: &str = "run the probe tests";

/// Which messages the release writes when a session asks for them: `prompt_suggestion`,
/// asked for with `promptSuggestions` in `initialize`. The CLI suggests nothing after a
/// session's first turn (the Agent SDKs' documentation; measured on 2.1.332), so the
/// probe runs two turns and waits a while after the second `result` for the suggestion
/// the model gave. Measured by hand before: 2.1.120 and 2.1.332 write it, 2.1.0 does not.
async fn output_probe(binary: &Path) -> Result<BTreeMap<String, bool>> {
    let scenario = format!(
        "description = \"compat probe: prompt suggestions\"\ndefault_text = \"ok\"\n\
         [[model]]\nname = \"suggestion\"\nwhen = {{ last_user_text_contains = {SUGGESTION_MODE:?} }}\n\
         blocks = [ {{ type = \"text\", text = {PROBE_SUGGESTION:?} }} ]\n"
    );
    let mut suggested = false;
    let mut until = |v: &serde_json::Value| {
        suggested |= v["type"] == "prompt_suggestion"
            && v["suggestion"]
                .as_str()
                .is_some_and(|t| t.contains(PROBE_SUGGESTION));
        suggested
    };
    let turns = Turns {
        initialize: Some(serde_json::json!({"promptSuggestions": true})),
        texts: &["hello", "tell me more"],
        until: Some(&mut until),
        // A release that suggests nothing is known by the wait running out (2.1.332 wrote
        // the suggestion 60 ms after the result).
        limit: secs(40),
    };
    let herm = ostler_testkit::cli::Hermetic::new()?;
    serve_turns(&herm, binary, &scenario, &[], turns, &mut |_| {
        serde_json::json!({})
    })
    .await?;
    Ok(BTreeMap::from([(
        "prompt_suggestion".to_string(),
        suggested,
    )]))
}

/// The probe model's rule that holds an answer until the probe releases it (or 60 s).
const HOLD_SCENARIO: &str = "description = \"compat probe: user-message fields\"\n\
    default_text = \"ok\"\n\
    [[model]]\nname = \"held\"\nwhen = { last_user_text_contains = \"PROBE-HOLD\" }\n\
    hold_until = \"probe-hold\"\nblocks = [ { type = \"text\", text = \"held\" } ]\n";

/// Whether the last user message of a request to the model has `text` in it.
fn last_user_has(r: &ostler_testkit::server::RecordedRequest, text: &str) -> bool {
    r.matches(&ostler_testkit::scenario::Match {
        last_user_text_contains: Some(text.into()),
        ..Default::default()
    })
}

/// Which fields of a user message the release honours
/// (`ostler_supervisor::compat::MESSAGE_FIELDS`), each in a session of its own:
/// - `verbatim`: `PROBE-VERBATIM-1 @file` with `client_composed: true`, then the same
///   without it (`-2`): honoured when the file's text reached the model with the second
///   and not the first (a release that never expands `@path` cannot show it: not
///   honoured);
/// - `context_only`: `PROBE-CONTEXT` with `shouldQuery: false`, then `PROBE-AFTER`:
///   honoured when no request was made for the first alone and the request for the second
///   carried it;
/// - `priority_now`: `PROBE-HOLD` (its answer held), then `PROBE-NOW` with `priority:
///   now`: honoured when a `result` came while the answer was still held and `PROBE-NOW`
///   reached the model;
/// - `priority_later`: `PROBE-HOLD`, then `PROBE-LATER` (`priority: later`) and
///   `PROBE-NEXT` (none) in one write, the answer released once the release says both are
///   queued (`command_lifecycle`) or after 3 s: honoured when `PROBE-NEXT` reached the
///   model in a turn before `PROBE-LATER`'s;
/// - `pasted_content`: see [`pasted_content_probe`].
///
/// Measured by hand before: 2.1.330 and 2.1.332 honour the first four; 2.1.121 `priority: now`
/// and `shouldQuery` but not `client_composed`, and it takes a `later` message into one
/// turn with the message queued after it (not honoured); 2.0.77 and older none.
async fn input_probe(binary: &Path) -> Result<BTreeMap<String, bool>> {
    let mut out = BTreeMap::new();
    out.insert("verbatim".to_string(), verbatim_probe(binary).await?);
    out.insert(
        "context_only".to_string(),
        context_only_probe(binary).await?,
    );
    out.insert(
        "priority_now".to_string(),
        priority_now_probe(binary).await?,
    );
    out.insert(
        "priority_later".to_string(),
        priority_later_probe(binary).await?,
    );
    out.insert(
        "pasted_content".to_string(),
        pasted_content_probe(binary).await?,
    );
    Ok(out)
}

/// `pasted_content`: a message whose text is typed and whose `pasted_content` has one
/// entry; honoured when the request its turn makes carries the pasted text in its last
/// user message. Measured by hand before: 2.1.332 appends it after the typed text inside
/// `<pasted_content>` tags.
async fn pasted_content_probe(binary: &Path) -> Result<bool> {
    let herm = ostler_testkit::cli::Hermetic::new()?;
    let mut s = ProbeSession::start(&herm, binary, HOLD_SCENARIO, &[]).await?;
    let pasted = serde_json::json!({"pasted_content": ["PROBE-PASTED-TEXT"]});
    s.send(&[user_message("PROBE-PASTE typed", pasted)]).await?;
    s.until(secs(60), |v| v["type"] == "result").await?;
    let server = s.finish().await;
    Ok(server
        .requests()
        .iter()
        .any(|r| last_user_has(r, "PROBE-PASTE") && last_user_has(r, "PROBE-PASTED-TEXT")))
}

async fn verbatim_probe(binary: &Path) -> Result<bool> {
    const CONTENT: &str = "PROBE-FILE-CONTENT";
    let herm = ostler_testkit::cli::Hermetic::new()?;
    let file = herm.root().join("probe-notes.txt");
    std::fs::write(&file, format!("{CONTENT}\n"))?;
    let mention = format!("please look at @{}", file.display());
    let mut s = ProbeSession::start(&herm, binary, HOLD_SCENARIO, &[]).await?;
    let verbatim = serde_json::json!({"client_composed": true});
    s.send(&[user_message(
        &format!("PROBE-VERBATIM-1 {mention}"),
        verbatim,
    )])
    .await?;
    s.until(secs(60), |v| v["type"] == "result").await?;
    s.send(&[user_message(
        &format!("PROBE-VERBATIM-2 {mention}"),
        serde_json::json!({}),
    )])
    .await?;
    s.until(secs(60), |v| v["type"] == "result").await?;
    let server = s.finish().await;
    let expanded = |marker: &str| {
        server.requests().iter().any(|r| {
            last_user_has(r, marker)
                && r.body
                    .as_ref()
                    .is_some_and(|b| b.to_string().contains(CONTENT))
        })
    };
    let reached = server
        .requests()
        .iter()
        .any(|r| last_user_has(r, "PROBE-VERBATIM-1"));
    Ok(reached && !expanded("PROBE-VERBATIM-1") && expanded("PROBE-VERBATIM-2"))
}

async fn context_only_probe(binary: &Path) -> Result<bool> {
    let herm = ostler_testkit::cli::Hermetic::new()?;
    let mut s = ProbeSession::start(&herm, binary, HOLD_SCENARIO, &[]).await?;
    let no_query = serde_json::json!({"shouldQuery": false});
    s.send(&[user_message("PROBE-CONTEXT", no_query)]).await?;
    s.until(secs(60), |v| v["type"] == "result").await?;
    s.send(&[user_message("PROBE-AFTER", serde_json::json!({}))])
        .await?;
    s.until(secs(60), |v| v["type"] == "result").await?;
    let server = s.finish().await;
    let requests = server.requests();
    // The next turn's request may join the two in its last user message.
    let queried = requests
        .iter()
        .any(|r| last_user_has(r, "PROBE-CONTEXT") && !last_user_has(r, "PROBE-AFTER"));
    let carried = requests.iter().any(|r| {
        last_user_has(r, "PROBE-AFTER")
            && r.body
                .as_ref()
                .is_some_and(|b| b["messages"].to_string().contains("PROBE-CONTEXT"))
    });
    Ok(!queried && carried)
}

/// A session of `binary` in `herm` whose turn `PROBE-HOLD` reached the model, its answer
/// held until the probe signals `probe-hold`; `None` when it never reached the model (a
/// release that cannot run this session: there is no turn to queue behind).
async fn held_turn(
    herm: &ostler_testkit::cli::Hermetic,
    binary: &Path,
) -> Result<Option<ProbeSession>> {
    let mut s = ProbeSession::start(herm, binary, HOLD_SCENARIO, &[]).await?;
    s.send(&[user_message("PROBE-HOLD", serde_json::json!({}))])
        .await?;
    if s.request(secs(60), |r| last_user_has(r, "PROBE-HOLD"))
        .await
    {
        return Ok(Some(s));
    }
    s.finish().await;
    Ok(None)
}

async fn priority_now_probe(binary: &Path) -> Result<bool> {
    let herm = ostler_testkit::cli::Hermetic::new()?;
    let Some(mut s) = held_turn(&herm, binary).await? else {
        return Ok(false);
    };
    let now = serde_json::json!({"priority": "now"});
    s.send(&[user_message("PROBE-NOW", now)]).await?;
    // Honoured: the held turn ends at once. Ignored: it waits for the answer.
    let stopped = s.until(secs(15), |v| v["type"] == "result").await?;
    s.server.signal("probe-hold");
    let reached = s.request(secs(60), |r| last_user_has(r, "PROBE-NOW")).await;
    s.finish().await;
    Ok(stopped && reached)
}

async fn priority_later_probe(binary: &Path) -> Result<bool> {
    let herm = ostler_testkit::cli::Hermetic::new()?;
    let Some(mut s) = held_turn(&herm, binary).await? else {
        return Ok(false);
    };
    let later =
        serde_json::json!({"priority": "later", "uuid": "00000000-0000-4000-8000-00000000001a"});
    let next = serde_json::json!({"uuid": "00000000-0000-4000-8000-00000000001b"});
    s.send(&[
        user_message("PROBE-LATER", later),
        user_message("PROBE-NEXT", next),
    ])
    .await?;
    // Both queued before the answer is released (a release without command_lifecycle
    // gets the whole bound).
    let mut queued = 0;
    s.until(secs(3), |v| {
        queued += usize::from(v["type"] == "command_lifecycle" && v["state"] == "queued");
        queued == 2
    })
    .await?;
    s.server.signal("probe-hold");
    let first = |r: &ostler_testkit::server::RecordedRequest| {
        last_user_has(r, "PROBE-NEXT") || last_user_has(r, "PROBE-LATER")
    };
    s.request(secs(60), first).await;
    // Both answered, or the bound.
    s.request(secs(60), |r| last_user_has(r, "PROBE-LATER"))
        .await;
    let server = s.finish().await;
    let requests = server.requests();
    let next_first = requests
        .iter()
        .find(|r| first(r))
        .is_some_and(|r| last_user_has(r, "PROBE-NEXT") && !last_user_has(r, "PROBE-LATER"));
    let later_after = requests.iter().any(|r| last_user_has(r, "PROBE-LATER"));
    Ok(next_first && later_after)
}

/// What the probe's plan-mode instructions say (`planModeInstructions`).
const PROBE_PLAN: &str = "PROBE-PLAN-INSTRUCTIONS: write the plan as a list";

/// Which `initialize` fields the release honours
/// (`ostler_supervisor::compat::INIT_FIELDS`), from one turn in plan mode of a session
/// whose project has two skills (`probe-alpha`, `probe-beta`, each with a description of
/// its own) and whose `initialize` sends `skills: ["probe-alpha"]` and
/// `planModeInstructions`: `skills` is honoured when alpha's description reached the
/// model and beta's did not (a release that lists no skills at all cannot show it: not
/// honoured); `plan_mode_instructions` when its text reached the model. Measured by hand
/// before: 2.1.120 and later honour both; 2.1.0 lists both skills and drops the text;
/// 1.0.128 lists no skills. `tool_aliases`, `exclude_dynamic_sections` and
/// `forward_subagent_text` in sessions of their own ([`tool_alias_probe`],
/// [`dynamic_sections_probe`], [`subagent_text_probe`]), `per_task_stop_affordance`
/// ([`task_stop_probe`]) where the release answers `stop_task` (`control`: the control
/// probe's results), and `agent_progress_summaries` ([`progress_summary_probe`], beside
/// the others: its sessions wait out a fixed window, idle).
async fn init_field_probe(
    binary: &Path,
    control: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, bool>> {
    let (progress, fields) = tokio::join!(
        progress_summary_probe(binary),
        init_fields_but_progress(binary, control)
    );
    let mut fields = fields?;
    fields.insert("agent_progress_summaries".to_string(), progress?);
    Ok(fields)
}

/// [`init_field_probe`] but `agent_progress_summaries`.
async fn init_fields_but_progress(
    binary: &Path,
    control: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, bool>> {
    let herm = ostler_testkit::cli::Hermetic::new()?;
    for (name, desc) in [
        ("probe-alpha", "PROBE-ALPHA-SKILL"),
        ("probe-beta", "PROBE-BETA-SKILL"),
    ] {
        let dir = herm.cwd().join(".claude/skills").join(name);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(
            dir.join("SKILL.md"),
            format!("---\nname: {name}\ndescription: {desc} does probe things\n---\nBody.\n"),
        )?;
    }
    let init = serde_json::json!({"skills": ["probe-alpha"], "planModeInstructions": PROBE_PLAN});
    let server = serve_turn_in(
        &herm,
        binary,
        PROBE_SCENARIO,
        &[("--permission-mode", "plan".to_string())],
        Some(init),
        "PROBE-INIT-FIELDS hello",
        &mut |_| serde_json::json!({}),
    )
    .await?;
    let turn: Vec<String> = server
        .requests()
        .iter()
        .filter(|r| last_user_has(r, "PROBE-INIT-FIELDS"))
        .filter_map(|r| r.body.as_ref().map(|b| b.to_string()))
        .collect();
    let any = |t: &str| turn.iter().any(|b| b.contains(t));
    Ok(BTreeMap::from([
        (
            "skills".to_string(),
            any("PROBE-ALPHA-SKILL") && !any("PROBE-BETA-SKILL"),
        ),
        ("plan_mode_instructions".to_string(), any(PROBE_PLAN)),
        ("tool_aliases".to_string(), tool_alias_probe(binary).await?),
        (
            "exclude_dynamic_sections".to_string(),
            dynamic_sections_probe(binary).await?,
        ),
        (
            "forward_subagent_text".to_string(),
            subagent_text_probe(binary).await?,
        ),
        (
            "per_task_stop_affordance".to_string(),
            task_stop_probe(binary, control).await?,
        ),
        ("dialog_kinds".to_string(), dialog_probe(binary).await?),
    ])
    .into_iter()
    .chain(question_probe(binary, &[]).await?)
    .chain([("title".to_string(), title_probe(binary).await?)])
    .collect())
}

/// One field of [`init_field_probe`] (`skills` and `plan_mode_instructions` share a
/// session: that whole probe runs for either).
async fn init_field_probe_one(
    binary: &Path,
    control: &BTreeMap<String, String>,
    field: &str,
) -> Result<bool> {
    Ok(match field {
        "tool_aliases" => tool_alias_probe(binary).await?,
        "exclude_dynamic_sections" => dynamic_sections_probe(binary).await?,
        "forward_subagent_text" => subagent_text_probe(binary).await?,
        "per_task_stop_affordance" => task_stop_probe(binary, control).await?,
        "agent_progress_summaries" => progress_summary_probe(binary).await?,
        "dialog_kinds" => dialog_probe(binary).await?,
        "title" => title_probe(binary).await?,
        "question_preview_format" | "question_extended" | "question_optional_descriptions" => {
            question_probe(binary, &[field])
                .await?
                .get(field)
                .copied()
                .unwrap_or(false)
        }
        "skills" | "plan_mode_instructions" => init_field_probe(binary, control)
            .await?
            .get(field)
            .copied()
            .unwrap_or(false),
        other => anyhow::bail!(
            "{other} is not an initialize field the probe measures ({})",
            ostler_supervisor::compat::INIT_FIELDS
                .iter()
                .map(|(f, _)| *f)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })
}

/// The AskUserQuestion tool definition (its `description` and `input_schema`, as JSON)
/// in the model request of one turn with `env` in the CLI's environment; `None` when no
/// request of the turn offered the tool.
async fn question_tool_definition(
    binary: &Path,
    env: &BTreeMap<String, String>,
) -> Result<Option<String>> {
    let herm = ostler_testkit::cli::Hermetic::new()?;
    let turns = Turns {
        initialize: None,
        texts: &["PROBE-QUESTION-TOOL hello"],
        until: None,
        limit: secs(90),
    };
    let server = serve_turns_env(&herm, binary, PROBE_SCENARIO, &[], env, turns, &mut |_| {
        serde_json::json!({})
    })
    .await?;
    Ok(server
        .requests()
        .iter()
        .filter(|r| last_user_has(r, "PROBE-QUESTION-TOOL"))
        .filter_map(|r| r.body.as_ref())
        .filter_map(|b| b["tools"].as_array())
        .flatten()
        .find(|t| t["name"] == "AskUserQuestion")
        .map(|t| {
            serde_json::json!({"description": t["description"], "input_schema": t["input_schema"]})
                .to_string()
        }))
}

/// The session options that set AskUserQuestion's configuration through the CLI's
/// environment (the Agent SDKs' `toolConfig.askUserQuestion`), each with the variable and
/// the value it is probed with.
const QUESTION_OPTIONS: [(&str, &str, &str); 3] = [
    (
        "question_preview_format",
        "CLAUDE_CODE_QUESTION_PREVIEW_FORMAT",
        "html",
    ),
    ("question_extended", "CLAUDE_CODE_QUESTION_EXTENDED", "1"),
    (
        "question_optional_descriptions",
        "CLAUDE_CODE_QUESTION_OPTIONAL_DESCRIPTIONS",
        "1",
    ),
];

/// The AskUserQuestion options ([`QUESTION_OPTIONS`]; `only`: those named, empty: all):
/// a turn without any of the variables, then one turn with each; honoured when the
/// AskUserQuestion tool the model is offered (description and input schema) differs from
/// the one offered without it. A release whose binary lacks the variable's name cannot
/// honour it: not honoured, not run. Measured by hand before on 2.1.332 (an `sdk-cli`
/// entry point, as ostler's sessions are): `html` adds the preview's rules to the tool's
/// description; `EXTENDED` adds text and number questions (`kind`) to the schema;
/// `OPTIONAL_DESCRIPTIONS` makes an option's `description` optional.
async fn question_probe(binary: &Path, only: &[&str]) -> Result<BTreeMap<String, bool>> {
    let path =
        std::fs::canonicalize(binary).with_context(|| format!("resolve {}", binary.display()))?;
    let bytes = std::fs::read(&path).with_context(|| format!("read {}", path.display()))?;
    let known: Vec<bool> = QUESTION_OPTIONS
        .iter()
        .map(|(_, var, _)| memchr::memmem::find(&bytes, var.as_bytes()).is_some())
        .collect();
    drop(bytes);
    let mut out = BTreeMap::new();
    let mut baseline = None::<Option<String>>;
    for ((field, var, value), known) in QUESTION_OPTIONS.iter().zip(known) {
        if !only.is_empty() && !only.contains(field) {
            continue;
        }
        if !known {
            out.insert(field.to_string(), false);
            continue;
        }
        let without = match &baseline {
            Some(b) => b.clone(),
            None => {
                let b = question_tool_definition(binary, &BTreeMap::new()).await?;
                baseline = Some(b.clone());
                b
            }
        };
        let env = BTreeMap::from([(var.to_string(), value.to_string())]);
        let with = question_tool_definition(binary, &env).await?;
        out.insert(
            field.to_string(),
            without.is_some() && with.is_some() && with != without,
        );
    }
    Ok(out)
}

/// The title [`title_probe`] gives its session.
const PROBE_TITLE: &str = "PROBE-TITLE-7 release notes";

/// What one turn with `init` in `initialize` shows of the session's title: whether the
/// CLI's transcript (under HOME's `.claude/projects/`) has a `custom-title` entry with
/// [`PROBE_TITLE`], and whether it wrote `system/session_title_changed` with it.
async fn title_seen(binary: &Path, init: Option<serde_json::Value>) -> Result<(bool, bool)> {
    let herm = ostler_testkit::cli::Hermetic::new()?;
    let mut changed = false;
    let mut until = |v: &serde_json::Value| {
        changed |= v["type"] == "system"
            && v["subtype"] == "session_title_changed"
            && v["title"] == PROBE_TITLE;
        v["type"] == "result"
    };
    let turns = Turns {
        initialize: init,
        texts: &["PROBE-TITLE hello"],
        until: Some(&mut until),
        limit: secs(90),
    };
    serve_turns(&herm, binary, PROBE_SCENARIO, &[], turns, &mut |_| {
        serde_json::json!({})
    })
    .await?;
    let mut in_transcript = false;
    let projects = herm.home().join(".claude/projects");
    for dir in std::fs::read_dir(&projects).into_iter().flatten().flatten() {
        for f in std::fs::read_dir(dir.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let text = std::fs::read_to_string(f.path()).unwrap_or_default();
            in_transcript |= text.lines().any(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .is_ok_and(|v| v["type"] == "custom-title" && v["customTitle"] == PROBE_TITLE)
            });
        }
    }
    Ok((in_transcript, changed))
}

/// `title` in `initialize` (CreateSessionRequest.title given by the client): a turn
/// without it and one with it; honoured when with it the CLI's transcript has the title as
/// its `custom-title` (the name it keeps for the session) and without it has none. The
/// `session_title_changed` line is not required: 2.1.120 and 2.1.121 record the title but
/// have no such line (their binaries do not name it); 2.1.330 and 2.1.332 write it at
/// `initialize`. Measured by hand before on 2.1.332: no model request generates a title in
/// either turn (one request each), so that is no sign.
async fn title_probe(binary: &Path) -> Result<bool> {
    let (without, _) = title_seen(binary, None).await?;
    let (with, _) = title_seen(binary, Some(serde_json::json!({"title": PROBE_TITLE}))).await?;
    Ok(with && !without)
}

/// The fake model of [`dialog_probe`]: every request for the probe's model is refused
/// (streamed `stop_reason: refusal` with `stop_details`), any other model answers.
const DIALOG_SCENARIO: &str = r#"
description = "compat probe: does supportedDialogKinds bring a refusal_fallback_prompt dialog?"
default_text = "PROBE-FALLBACK-ANSWER"
[[model]]
name = "refused"
when = { model_contains = "claude-fable-5" }
stop_reason = "refusal"
stop_details = { type = "refusal", category = "cyber", explanation = "probe refusal" }
blocks = []
"#;

/// `supportedDialogKinds: ["refusal_fallback_prompt"]` (`dialog_kinds`): a session on a
/// model the fake refuses (`claude-fable-5`, with `switchModelsOnFlag: false` so that the
/// CLI asks instead of switching by itself), whose dialog is answered `retry_fallback`.
/// Honoured when the CLI sent `request_user_dialog` of that kind and, once answered, the
/// model got a request on the dialog's `fallbackModel`. A release whose binary lacks the
/// field's name (`supportedDialogKinds`) cannot honour it: not honoured, not run. Measured
/// by hand before on 2.1.332: the first refusal is retried once by itself, the second
/// brings the dialog.
async fn dialog_probe(binary: &Path) -> Result<bool> {
    let path =
        std::fs::canonicalize(binary).with_context(|| format!("resolve {}", binary.display()))?;
    let bytes = std::fs::read(&path).with_context(|| format!("read {}", path.display()))?;
    if memchr::memmem::find(&bytes, b"supportedDialogKinds").is_none() {
        return Ok(false);
    }
    drop(bytes);
    let mut fallback = None::<String>;
    let mut answer = |request: &serde_json::Value| {
        if request["subtype"] == "request_user_dialog"
            && request["dialog_kind"] == "refusal_fallback_prompt"
        {
            fallback = request["payload"]["fallbackModel"]
                .as_str()
                .map(str::to_owned);
            serde_json::json!({"behavior": "completed", "result": "retry_fallback"})
        } else {
            serde_json::json!({})
        }
    };
    let server = serve_turn_in(
        &ostler_testkit::cli::Hermetic::new()?,
        binary,
        DIALOG_SCENARIO,
        &[
            ("--model", "claude-fable-5".to_string()),
            ("--settings", r#"{"switchModelsOnFlag":false}"#.to_string()),
        ],
        Some(serde_json::json!({"supportedDialogKinds": ["refusal_fallback_prompt"]})),
        "PROBE-DIALOG hello",
        &mut answer,
    )
    .await?;
    let Some(fallback) = fallback else {
        return Ok(false);
    };
    Ok(server.requests().iter().any(|r| {
        r.body.as_ref().is_some_and(|b| {
            b["model"] == fallback.as_str() && b.to_string().contains("PROBE-DIALOG")
        })
    }))
}

/// The fake model of [`progress_summary_probe`]: the main agent starts a sub-agent, which
/// runs one Bash command; its next model call is held for the whole probe, so the
/// sub-agent keeps running. A summary fork (its prompt asks for the agent's "most recent
/// action") is answered with [`PROBE_SUMMARY`].
const PROGRESS_SUMMARY_SCENARIO: &str = r#"
description = "compat probe: does agentProgressSummaries send a running sub-agent's summary?"
default_text = "ok"
[[model]]
name = "summary"
when = { last_user_text_contains = "most recent action" }
blocks = [ { type = "text", text = "Probing the summary module" } ]
[[model]]
name = "main after task"
when = { tool_result_for = "toolu_probe_sum_task" }
blocks = [ { type = "text", text = "probe delegated" } ]
[[model]]
name = "sub held"
when = { tool_result_for = "toolu_probe_sum_echo" }
hold_until = "never"
blocks = [ { type = "text", text = "never sent" } ]
[[model]]
name = "sub runs a command"
when = { last_user_text_contains = "PROBE-SUM-SUBTASK" }
blocks = [ { type = "tool_use", id = "toolu_probe_sum_echo", name = "Bash", input = { command = "echo probe", description = "Echo probe" } } ]
[[model]]
name = "main delegates"
when = { last_user_text_contains = "PROBE-SUM-DELEGATE" }
blocks = [ { type = "tool_use", id = "toolu_probe_sum_task", name = ["Agent", "Task"], input = { description = "Probe", prompt = "PROBE-SUM-SUBTASK: run a command.", subagent_type = "general-purpose" } } ]
"#;

/// The summary [`PROGRESS_SUMMARY_SCENARIO`]'s model writes.
const PROBE_SUMMARY: &str = "Probing the summary module";

/// How long [`progress_summary_probe`] watches a session: the CLI asks for a summary 30 s
/// after the sub-agent's first model call (2.1.332: a fixed interval, no variable shortens
/// it), plus a margin. Behaviour measured, not a guard: not scaled.
const PROGRESS_SUMMARY_WINDOW: Duration = Duration::from_secs(45);

/// `agentProgressSummaries`: one session without it and one with it, side by side, each
/// starting a sub-agent that keeps running; honoured when, within
/// [`PROGRESS_SUMMARY_WINDOW`], the session with it wrote a `task_progress` whose
/// `summary` is the fake model's answer to the summary fork, and the session without it
/// sent no summary request. A release whose JavaScript lacks the field's name
/// (`agentProgressSummaries`) cannot honour it: not honoured, not run (it would cost the
/// whole window). Measured by hand before on 2.1.332: the summary comes 30 s into the
/// sub-agent.
async fn progress_summary_probe(binary: &Path) -> Result<bool> {
    let path =
        std::fs::canonicalize(binary).with_context(|| format!("resolve {}", binary.display()))?;
    let bytes = std::fs::read(&path).with_context(|| format!("read {}", path.display()))?;
    if memchr::memmem::find(&bytes, b"agentProgressSummaries").is_none() {
        return Ok(false);
    }
    drop(bytes);
    let (without, with) = tokio::join!(
        progress_summary_seen(binary, serde_json::json!({})),
        progress_summary_seen(binary, serde_json::json!({"agentProgressSummaries": true})),
    );
    let (without_written, without_asked) = without?;
    let (with_written, with_asked) = with?;
    Ok(with_written && with_asked && !without_written && !without_asked)
}

/// In a session of [`PROGRESS_SUMMARY_SCENARIO`] whose `initialize` had `fields`: whether
/// a `task_progress` with [`PROBE_SUMMARY`] was written within [`PROGRESS_SUMMARY_WINDOW`],
/// and whether the model got a summary request.
async fn progress_summary_seen(binary: &Path, fields: serde_json::Value) -> Result<(bool, bool)> {
    let herm = ostler_testkit::cli::Hermetic::new()?;
    let mut s = ProbeSession::start(&herm, binary, PROGRESS_SUMMARY_SCENARIO, &[]).await?;
    let mut init = fields;
    init["subtype"] = "initialize".into();
    s.send(&[
        serde_json::json!({"type":"control_request","request_id":"probe-init","request":init}),
        user_message("PROBE-SUM-DELEGATE please", serde_json::json!({})),
    ])
    .await?;
    let deadline = tokio::time::Instant::now() + PROGRESS_SUMMARY_WINDOW;
    let mut allow = |request: &serde_json::Value| serde_json::json!({"behavior": "allow", "updatedInput": request["input"]});
    let mut written = false;
    while let Some(v) = s.next(deadline, &mut allow).await? {
        if v["type"] == "system" && v["subtype"] == "task_progress" && v["summary"] == PROBE_SUMMARY
        {
            written = true;
            break;
        }
    }
    let server = s.finish().await;
    let asked = server
        .requests()
        .iter()
        .any(|r| r.rule_name.as_deref() == Some("summary"));
    Ok((written, asked))
}

/// The fake model of [`task_stop_probe`]: the main agent starts a sub-agent and ends its
/// turn; the sub-agent's own model call is held for the whole session, so a sub-agent that
/// runs in the background stays running.
const TASK_STOP_SCENARIO: &str = r#"
description = "compat probe: does perTaskStopAffordance spare a background task from an interrupt?"
default_text = "ok"
[[model]]
name = "main after task"
when = { tool_result_for = "toolu_probe_bg" }
blocks = [ { type = "text", text = "probe delegated" } ]
[[model]]
name = "sub held"
when = { last_user_text_contains = "PROBE-BG-SUBTASK" }
hold_until = "never"
blocks = [ { type = "text", text = "never sent" } ]
[[model]]
name = "main delegates"
when = { last_user_text_contains = "PROBE-BG-DELEGATE" }
blocks = [ { type = "tool_use", id = "toolu_probe_bg", name = ["Agent", "Task"], input = { description = "Probe", prompt = "PROBE-BG-SUBTASK: wait.", subagent_type = "general-purpose", run_in_background = true } } ]
"#;

/// `perTaskStopAffordance`: one session without it and one with it, each starting a
/// background sub-agent (held running) and ending its turn, then sending `interrupt`;
/// honoured when the interrupt ended the task (`task_updated` to a final status, or
/// `task_notification`, before the interrupt's answer) without the field, and with it did
/// not, while a `stop_task` sent afterwards did (`stop_task` alone proves nothing: 2.1.332
/// answers it with success for a task already killed). A release that does not answer `stop_task` (the
/// control probe) has no per-task stop: not honoured, not run. Measured by hand before on
/// 2.1.332: without the field the interrupt writes `task_updated` `killed`; with it the
/// task goes on.
async fn task_stop_probe(binary: &Path, control: &BTreeMap<String, String>) -> Result<bool> {
    let answers = |s: &str| matches!(s, "answered" | "error_answered");
    if !control.get("stop_task").is_some_and(|s| answers(s)) {
        return Ok(false);
    }
    let without = task_outlives_interrupt(binary, serde_json::json!({})).await?;
    let with =
        task_outlives_interrupt(binary, serde_json::json!({"perTaskStopAffordance": true})).await?;
    Ok(with == Some(true) && without == Some(false))
}

/// Whether the background task of [`TASK_STOP_SCENARIO`] outlived an interrupt after the
/// turn, in a session whose `initialize` had `fields`; `None` when no background task
/// started (or an answer did not come in time).
async fn task_outlives_interrupt(binary: &Path, fields: serde_json::Value) -> Result<Option<bool>> {
    let herm = ostler_testkit::cli::Hermetic::new()?;
    let mut s = ProbeSession::start(&herm, binary, TASK_STOP_SCENARIO, &[]).await?;
    let mut init = fields;
    init["subtype"] = "initialize".into();
    s.send(&[
        serde_json::json!({"type":"control_request","request_id":"probe-init","request":init}),
        user_message("PROBE-BG-DELEGATE please", serde_json::json!({})),
    ])
    .await?;
    let deadline = tokio::time::Instant::now() + secs(90);
    let mut allow = |request: &serde_json::Value| serde_json::json!({"behavior": "allow", "updatedInput": request["input"]});
    let mut task = None;
    while let Some(v) = s.next(deadline, &mut allow).await? {
        if v["type"] == "system" && v["subtype"] == "task_started" {
            task = v["task_id"].as_str().map(str::to_owned);
        }
        if v["type"] == "result" {
            break;
        }
    }
    let Some(task) = task else {
        return Ok(None);
    };
    // The answer to the control request `id`: whether it succeeded.
    let answered = |v: &serde_json::Value, id: &str| {
        (v["type"] == "control_response" && v["response"]["request_id"] == id)
            .then(|| v["response"]["subtype"] == "success")
    };
    // The task's end: its `task_updated` to a final status, or its `task_notification`.
    let ended = |v: &serde_json::Value| {
        v["type"] == "system"
            && v["task_id"] == task.as_str()
            && (v["subtype"] == "task_notification"
                || (v["subtype"] == "task_updated" && v["patch"]["status"].is_string()))
    };
    s.send(&[serde_json::json!({"type":"control_request","request_id":"probe-interrupt","request":{"subtype":"interrupt"}})])
        .await?;
    // 2.1.332 ends the tasks it kills before it answers the interrupt.
    let mut killed = false;
    loop {
        let Some(v) = s.next(deadline, &mut allow).await? else {
            return Ok(None);
        };
        killed |= ended(&v);
        if answered(&v, "probe-interrupt").is_some() {
            break;
        }
    }
    if killed {
        return Ok(Some(false));
    }
    // Not ended by the interrupt: it must still be running, so that stopping it ends it (a
    // notice that would have been seen had the interrupt ended it).
    s.send(&[serde_json::json!({"type":"control_request","request_id":"probe-stop","request":{"subtype":"stop_task","task_id":task}})])
        .await?;
    while let Some(v) = s.next(deadline, &mut allow).await? {
        if ended(&v) {
            return Ok(Some(true));
        }
    }
    Ok(None)
}

/// `excludeDynamicSections`: one turn without it and one with it, each in a hermetic
/// HOME and cwd; honoured when the session's paths (its working directory, its memory
/// directory under HOME) are in the model request's `system` without the field, and with
/// it are not in `system` but in the messages. Measured by hand before: 2.1.120 and
/// 2.1.121 move the environment section (the working directory) out of `system`; 2.1.330
/// and 2.1.332 have it in the first message anyway and move the memory section (its
/// directory) out too; 2.1.0 changes nothing.
async fn dynamic_sections_probe(binary: &Path) -> Result<bool> {
    let (without_in_system, _) = session_paths_in_request(binary, None).await?;
    let init = serde_json::json!({"excludeDynamicSections": true});
    let (with_in_system, with_in_messages) = session_paths_in_request(binary, Some(init)).await?;
    Ok(without_in_system && !with_in_system && with_in_messages)
}

/// Whether the hermetic root (the parent of HOME and cwd) appears in the `system` and in
/// the `messages` of the model request of one turn with `init` in `initialize`.
async fn session_paths_in_request(
    binary: &Path,
    init: Option<serde_json::Value>,
) -> Result<(bool, bool)> {
    let herm = ostler_testkit::cli::Hermetic::new()?;
    let root = herm
        .cwd()
        .parent()
        .context("the hermetic cwd has a parent")?
        .display()
        .to_string();
    let server = serve_turn_in(
        &herm,
        binary,
        PROBE_SCENARIO,
        &[],
        init,
        "PROBE-DYNAMIC-SECTIONS hello",
        &mut |_| serde_json::json!({}),
    )
    .await?;
    let requests = server.requests();
    // A release whose turn never reached the model (1.0.58) shows nothing: not honoured.
    let Some(body) = requests
        .iter()
        .filter(|r| last_user_has(r, "PROBE-DYNAMIC-SECTIONS"))
        .find_map(|r| r.body.clone())
    else {
        return Ok((false, false));
    };
    Ok((
        body["system"].to_string().contains(&root),
        body["messages"].to_string().contains(&root),
    ))
}

/// The fake model of [`subagent_text_probe`]: the main agent starts a foreground
/// sub-agent (`run_in_background: false`; a release whose Task tool does not take the
/// field runs it in the foreground anyway), whose answer is one text block.
const SUBAGENT_TEXT_SCENARIO: &str = r#"
description = "compat probe: does forwardSubagentText write a sub-agent's text?"
default_text = "ok"
[[model]]
name = "main after task"
when = { tool_result_for = "toolu_probe_task" }
blocks = [ { type = "text", text = "probe done" } ]
[[model]]
name = "sub answers"
when = { last_user_text_contains = "PROBE-SUBTASK" }
blocks = [ { type = "text", text = "PROBE-SUBAGENT-TEXT" } ]
[[model]]
name = "main delegates"
when = { last_user_text_contains = "PROBE-DELEGATE" }
blocks = [ { type = "tool_use", id = "toolu_probe_task", name = ["Agent", "Task"], input = { description = "Probe", prompt = "PROBE-SUBTASK: say something.", subagent_type = "general-purpose", run_in_background = false } } ]
"#;

/// `forwardSubagentText`: one turn without it and one with it, each starting a foreground
/// sub-agent that answers with text; honoured when the sub-agent's text is written (an
/// assistant message with `parent_tool_use_id` and that text) with the field and not
/// without. Measured by hand before: 2.1.120, 2.1.121, 2.1.330 and 2.1.332 write a
/// foreground sub-agent's text and thinking only with it (a background sub-agent's text
/// is written either way on 2.1.332); 2.1.0 never writes it.
async fn subagent_text_probe(binary: &Path) -> Result<bool> {
    let without = subagent_text_written(binary, None).await?;
    let init = serde_json::json!({"forwardSubagentText": true});
    let with = subagent_text_written(binary, Some(init)).await?;
    Ok(with && !without)
}

/// Whether the sub-agent's text of [`SUBAGENT_TEXT_SCENARIO`] was written, in one turn
/// with `init` in `initialize`.
async fn subagent_text_written(binary: &Path, init: Option<serde_json::Value>) -> Result<bool> {
    let mut written = false;
    let mut until = |v: &serde_json::Value| {
        written |= v["type"] == "assistant"
            && !v["parent_tool_use_id"].is_null()
            && v["message"]["content"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|b| b["type"] == "text" && b["text"] == "PROBE-SUBAGENT-TEXT")
            });
        v["type"] == "result"
    };
    let turns = Turns {
        initialize: init,
        texts: &["PROBE-DELEGATE please"],
        until: Some(&mut until),
        limit: secs(90),
    };
    let herm = ostler_testkit::cli::Hermetic::new()?;
    let server = serve_turns(
        &herm,
        binary,
        SUBAGENT_TEXT_SCENARIO,
        &[],
        turns,
        &mut |request| serde_json::json!({"behavior": "allow", "updatedInput": request["input"]}),
    )
    .await?;
    // A release that never started the sub-agent shows nothing: not honoured.
    let started = server
        .requests()
        .iter()
        .any(|r| last_user_has(r, "PROBE-SUBTASK"));
    Ok(started && written)
}

/// The id of the tool call [`read_call_scenario`] makes.
const PROBE_CALL_ID: &str = "toolu_probe_1";

/// A fake-model scenario (`what` names it) whose model, asked `trigger`, calls `tool`
/// with `file` as its `file_path`, then answers once the call's result came back.
fn read_call_scenario(what: &str, trigger: &str, tool: &str, file: &Path) -> String {
    format!(
        "description = \"compat probe: {what}\"\ndefault_text = \"ok\"\n\
         [[model]]\nname = \"after\"\nwhen = {{ tool_result_for = \"{PROBE_CALL_ID}\" }}\n\
         blocks = [ {{ type = \"text\", text = \"probe done\" }} ]\n\
         [[model]]\nname = \"call\"\nwhen = {{ last_user_text_contains = \"{trigger}\" }}\n\
         blocks = [ {{ type = \"tool_use\", id = \"{PROBE_CALL_ID}\", name = \"{tool}\", \
         input = {{ file_path = {:?} }} }} ]\n",
        file.display().to_string()
    )
}

/// `toolAliases`: the model calls `ProbeFetch` (no such tool) to read a file, with
/// `{ProbeFetch: Read}` in `initialize`; honoured when the file's text came back to the
/// model in the call's tool result (a permission prompt for Read is allowed). Measured by
/// hand before: 2.1.332 ran Read (its prompt named Read); 2.1.121 did not.
async fn tool_alias_probe(binary: &Path) -> Result<bool> {
    const CONTENT: &str = "PROBE-ALIASED-READ";
    let herm = ostler_testkit::cli::Hermetic::new()?;
    let file = herm.root().join("probe-alias.txt");
    std::fs::write(&file, format!("{CONTENT}\n"))?;
    let scenario = read_call_scenario("tool aliases", "PROBE-ALIAS", "ProbeFetch", &file);
    let init = serde_json::json!({"toolAliases": {"ProbeFetch": "Read"}});
    let server = serve_turn_in(
        &herm,
        binary,
        &scenario,
        &[],
        Some(init),
        "PROBE-ALIAS read it",
        &mut |request| serde_json::json!({"behavior": "allow", "updatedInput": request["input"]}),
    )
    .await?;
    Ok(tool_result_reached(&server, CONTENT))
}

/// One `name -> bool` column of a generated `TestedRelease` (`name: &[(key, bool), ...]`).
fn bool_map(s: &mut String, name: &str, map: &BTreeMap<String, bool>) -> Result<()> {
    if map.is_empty() {
        writeln!(s, "            {name}: &[],")?;
        return Ok(());
    }
    writeln!(s, "            {name}: &[")?;
    for (k, ok) in map {
        writeln!(s, "                ({k:?}, {ok}),")?;
    }
    s.push_str("            ],\n");
    Ok(())
}

/// Which policies the release enforces (`ostler_supervisor::compat::POLICIES`):
/// `managed_settings` when, with `--managed-settings '{"permissions":{"deny":["Read"]}}'`,
/// the model's Read of a file in the working directory (which the CLI runs without
/// asking) comes back without the file's text. Measured by hand before: 2.1.330 and
/// 2.1.332 answer "No such tool available: Read"; 2.1.120 and 2.1.121 accept the flag and
/// read the file (they honour it only under an Agent SDK's `CLAUDE_CODE_ENTRYPOINT`).
/// A release whose option parser refuses the flag (`options`) does not enforce it.
async fn policy_probe(
    binary: &Path,
    options: &BTreeMap<String, bool>,
) -> Result<BTreeMap<String, bool>> {
    const CONTENT: &str = "PROBE-POLICY-READ";
    if options.get("--managed-settings") == Some(&false) {
        return Ok(BTreeMap::from([("managed_settings".to_string(), false)]));
    }
    let herm = ostler_testkit::cli::Hermetic::new()?;
    let file = herm.cwd().join("probe-policy.txt");
    std::fs::write(&file, format!("{CONTENT}\n"))?;
    let scenario = read_call_scenario("managed settings", "PROBE-POLICY", "Read", &file);
    let server = serve_turn_in(
        &herm,
        binary,
        &scenario,
        &[(
            "--managed-settings",
            r#"{"permissions":{"deny":["Read"]}}"#.to_string(),
        )],
        None,
        "PROBE-POLICY read it",
        &mut |request| serde_json::json!({"behavior": "allow", "updatedInput": request["input"]}),
    )
    .await?;
    // The call must have been answered: a release that never got that far proves nothing.
    let answered = tool_result_reached(&server, PROBE_CALL_ID);
    if !answered {
        anyhow::bail!("managed settings probe: the model's Read call was never answered");
    }
    Ok(BTreeMap::from([(
        "managed_settings".to_string(),
        !tool_result_reached(&server, CONTENT),
    )]))
}

/// Which hook events the release calls in a session like ostler's, for the events whose
/// call depends on more than the release's list: `PermissionRequest`, registered in
/// `initialize` for a turn whose Bash tool needs permission while permission prompts go to
/// the host (`can_use_tool`, allowed). Measured by hand before: 2.0.77 knows the event but
/// never calls it then; 2.1.332 calls it beside the prompt.
async fn hook_call_probe(binary: &Path) -> Result<BTreeMap<String, bool>> {
    const CALLBACK: &str = "probe_permission_request";
    let herm = ostler_testkit::cli::Hermetic::new()?;
    let mut called = false;
    let hooks = serde_json::json!({"hooks": {"PermissionRequest": [
        {"matcher": "Bash", "hookCallbackIds": [CALLBACK]},
    ]}});
    serve_turn_in(
        &herm,
        binary,
        PROBE_SCENARIO,
        &[],
        Some(hooks),
        "PROBE-PERMISSION please",
        &mut |request| {
            if request["subtype"] == "hook_callback" {
                called |= request["callback_id"] == CALLBACK;
                // No decision: the prompt decides.
                return serde_json::json!({});
            }
            serde_json::json!({"behavior": "allow", "updatedInput": request["input"]})
        },
    )
    .await?;
    Ok(BTreeMap::from([("PermissionRequest".to_string(), called)]))
}

/// Whether a request to the model carried a tool result with `text` in it.
fn tool_result_reached(server: &ostler_testkit::FakeModelServer, text: &str) -> bool {
    server.requests().iter().any(|r| {
        r.body.as_ref().is_some_and(|b| {
            let t = b.to_string();
            t.contains("tool_result") && t.contains(text)
        })
    })
}

/// Which session-option flags the option parser accepts: each flag alone (with its probe
/// value) after the stream-json base, stdin at EOF, an unreachable API; `unknown option`
/// in the output means absent, anything else (or still running after 60 s) accepted.
/// Measures every flag of `PROBED_OPTIONS`, or only those named in `only` (each must be
/// one of them).
async fn option_probe(binary: &Path, only: &[String]) -> Result<BTreeMap<String, bool>> {
    let probed = &ostler_supervisor::compat::PROBED_OPTIONS;
    if let Some(unknown) = only.iter().find(|f| !probed.iter().any(|(p, _)| p == f)) {
        bail!("{unknown} is not one of compat::PROBED_OPTIONS");
    }
    let herm = ostler_testkit::cli::Hermetic::new()?;
    let runs = probed
        .iter()
        .filter(|(flag, _)| only.is_empty() || only.iter().any(|o| o == flag))
        .map(|(flag, value)| {
            let mut args = ostler_protocol::argv::StreamJsonArgs::base();
            match value {
                Some(v) => args.option(flag, *v),
                None => args.flag(flag),
            };
            let mut cmd = herm.command(
                binary,
                &args.into_args(),
                "http://127.0.0.1:9",
                &BTreeMap::new(),
            );
            cmd.stdin(std::process::Stdio::null());
            async move {
                let out = tokio::time::timeout(secs(60), cmd.output()).await;
                let accepted = match out {
                    Err(_) => true,
                    Ok(out) => {
                        let out = out?;
                        let text = format!(
                            "{}{}",
                            String::from_utf8_lossy(&out.stderr),
                            String::from_utf8_lossy(&out.stdout)
                        );
                        !text.contains(&format!("unknown option '{flag}'"))
                    }
                };
                anyhow::Ok(((*flag).to_string(), accepted))
            }
        });
    // One at a time: concurrent node start-ups on a busy machine can outlast the bound,
    // and a run still going at the bound counts as accepted.
    let mut out = BTreeMap::new();
    for run in runs {
        let (flag, ok) = run.await?;
        out.insert(flag, ok);
    }
    Ok(out)
}

/// How long a release gets to answer a control request before it counts as `no_answer`
/// (1.0.x answers in milliseconds; it never answers subtypes it does not know): 10 s,
/// scaled by `OSTLER_TEST_TIMEOUT_SCALE` like every other wait of the probe.
fn control_bound() -> Duration {
    secs(10)
}

/// The harmless arguments of each probed subtype (field names as the Agent SDKs send them).
fn control_fields(subtype: &str) -> serde_json::Value {
    use serde_json::json;
    match subtype {
        "set_model" => json!({"model": "default"}),
        "set_permission_mode" => json!({"mode": "default"}),
        "set_max_thinking_tokens" => json!({"max_thinking_tokens": 1024}),
        "rewind_files" => {
            json!({"user_message_id": "00000000-0000-4000-8000-000000000000", "dry_run": true})
        }
        "mcp_set_servers" => json!({"servers": {}}),
        "mcp_toggle" => json!({"serverName": "ostler-probe-absent", "enabled": false}),
        "mcp_reconnect" => json!({"serverName": "ostler-probe-absent"}),
        "stop_task" => json!({"task_id": "ostler-probe-absent"}),
        "rename_session" => json!({"title": "ostler probe"}),
        // A hook the probe's turn calls (`hook_callback`, measured in the turn).
        "initialize" => json!({"hooks": {"UserPromptSubmit": [{"hookCallbackIds": [PROBE_HOOK]}]}}),
        _ => json!({}),
    }
}

/// The callback id of the probe's hook.
const PROBE_HOOK: &str = "ostler-probe-hook";

fn control_line(request_id: &str, subtype: &str) -> String {
    let mut req = control_fields(subtype);
    req["subtype"] = subtype.into();
    let msg =
        serde_json::json!({"type": "control_request", "request_id": request_id, "request": req});
    format!("{msg}\n")
}

/// Classifies a `control_response.response`.
fn classify(response: &serde_json::Value) -> (&'static str, Option<String>) {
    if response["subtype"] == "success" {
        return ("answered", None);
    }
    let text = response["error"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| response.to_string());
    let clipped: String = text.chars().take(160).collect();
    let unsupported = response["error_code"] == "unsupported_request"
        || text.contains("Unsupported control request")
        || text.contains("Unknown control request");
    (
        if unsupported {
            "unsupported"
        } else {
            "error_answered"
        },
        Some(clipped),
    )
}

/// Control responses received so far: subtype -> (classification, error text).
type Answers = BTreeMap<String, (&'static str, Option<String>)>;

/// Which control request subtypes a release serves: `initialize` before the first message,
/// one turn, then every other subtype at once; answers are collected for [`control_bound`].
async fn control_probe(
    binary: &Path,
) -> Result<(BTreeMap<String, String>, BTreeMap<String, String>)> {
    let scenario = ostler_testkit::Scenario::from_toml(
        "compat-control-probe",
        "description = \"compat control probe\"\ndefault_text = \"ok\"\n",
    )?;
    let server = ostler_testkit::FakeModelServer::start(scenario).await?;
    let herm = ostler_testkit::cli::Hermetic::new()?;
    // No permission prompt tool: 1.0.58 (INCOMPATIBLE) refuses `stdio` but is measured too.
    let args = ostler_protocol::argv::StreamJsonArgs::base().into_args();
    let mut child = herm
        .command(binary, &args, &server.url(), &BTreeMap::new())
        .spawn()?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let stdout = child.stdout.take().context("stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let mut answers = Answers::new();
    let id_of = |subtype: &str| format!("ostler-probe-{subtype}");
    let subtype_of = |id: &str| id.strip_prefix("ostler-probe-").map(str::to_string);
    // Reads lines until `stop` says so or the deadline passes; records control responses.
    async fn read_until(
        lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
        answers: &mut Answers,
        subtype_of: &dyn Fn(&str) -> Option<String>,
        deadline: Duration,
        stop: &dyn Fn(&serde_json::Value, &Answers) -> bool,
    ) -> Result<bool> {
        let run = async {
            while let Some(line) = lines.next_line().await? {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                if v["type"] == "control_response"
                    && let Some(st) = v["response"]["request_id"].as_str().and_then(subtype_of)
                {
                    answers.insert(st, classify(&v["response"]));
                }
                if stop(&v, answers) {
                    return anyhow::Ok(true);
                }
            }
            anyhow::Ok(false)
        };
        tokio::time::timeout(deadline, run)
            .await
            .unwrap_or(Ok(false))
    }
    stdin
        .write_all(control_line(&id_of("initialize"), "initialize").as_bytes())
        .await?;
    stdin.flush().await?;
    read_until(
        &mut lines,
        &mut answers,
        &subtype_of,
        control_bound(),
        &|_, a| a.contains_key("initialize"),
    )
    .await?;
    let user = serde_json::json!({"type":"user","message":{"role":"user","content":"say ok"},"parent_tool_use_id":null,"session_id":""});
    stdin.write_all(format!("{user}\n").as_bytes()).await?;
    stdin.flush().await?;
    // The turn; the probe's hook is answered (with nothing to change) when the CLI calls it.
    let is_hook = |v: &serde_json::Value| {
        v["type"] == "control_request"
            && v["request"]["subtype"] == "hook_callback"
            && v["request"]["callback_id"] == PROBE_HOOK
    };
    let mut hook_called = false;
    let turn = async {
        while let Some(line) = lines.next_line().await? {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if v["type"] == "control_response"
                && let Some(st) = v["response"]["request_id"].as_str().and_then(subtype_of)
            {
                answers.insert(st, classify(&v["response"]));
            }
            if is_hook(&v) {
                hook_called = true;
                let resp = serde_json::json!({"type": "control_response", "response": {"subtype": "success", "request_id": v["request_id"], "response": {}}});
                stdin.write_all(format!("{resp}\n").as_bytes()).await?;
                stdin.flush().await?;
            }
            if v["type"] == "result" {
                return anyhow::Ok(true);
            }
        }
        anyhow::Ok(false)
    };
    let turned = tokio::time::timeout(secs(90), turn)
        .await
        .unwrap_or(Ok(false))?;
    if hook_called {
        answers.insert("hook_callback".into(), ("answered", None));
    }
    let rest: Vec<&str> = ostler_supervisor::compat::PROBED_CONTROLS
        .iter()
        .copied()
        .filter(|c| *c != "initialize" && *c != "hook_callback")
        .collect();
    if turned {
        for c in &rest {
            stdin
                .write_all(control_line(&id_of(c), c).as_bytes())
                .await?;
        }
        stdin.flush().await?;
        // Until every one of them is answered: `answers` also holds `initialize` and
        // `hook_callback`, so a count would stop one answer early (the slowest, which
        // 2.1.330 and later make `get_context_usage`: it calls the token-count API).
        read_until(
            &mut lines,
            &mut answers,
            &subtype_of,
            control_bound(),
            &|_, a| rest.iter().all(|c| a.contains_key(*c)),
        )
        .await?;
    }
    drop(stdin);
    let _ = tokio::time::timeout(secs(10), child.wait()).await;
    let _ = child.start_kill();
    let mut control = BTreeMap::new();
    let mut errors = BTreeMap::new();
    for c in ostler_supervisor::compat::PROBED_CONTROLS {
        // Without a completed turn nothing after `initialize` was asked: not measured.
        if !turned && c != "initialize" {
            continue;
        }
        let (status, err) = answers.remove(c).unwrap_or(("no_answer", None));
        control.insert(c.to_string(), status.to_string());
        if let Some(e) = err {
            errors.insert(c.to_string(), e);
        }
    }
    Ok((control, errors))
}

/// One real turn with `--permission-prompt-tool stdio`.
async fn permission_probe(binary: &Path) -> Result<(bool, String, Vec<String>)> {
    let scenario = ostler_testkit::Scenario::from_toml("compat-probe", PROBE_SCENARIO)?;
    let server = ostler_testkit::FakeModelServer::start(scenario).await?;
    let herm = ostler_testkit::cli::Hermetic::new()?;
    let args = ostler_protocol::argv::StreamJsonArgs::session().into_args();
    let mut child = herm
        .command(binary, &args, &server.url(), &BTreeMap::new())
        .spawn()?;
    let mut stdin = child.stdin.take().context("stdin")?;
    let stdout = child.stdout.take().context("stdout")?;
    let err_task = collect_stderr(&mut child)?;
    let user = serde_json::json!({"type":"user","message":{"role":"user","content":"PROBE-PERMISSION please"},"parent_tool_use_id":null,"session_id":""});
    stdin.write_all(format!("{user}\n").as_bytes()).await?;
    stdin.flush().await?;
    let mut lines = BufReader::new(stdout).lines();
    let mut can_use_tool = false;
    let mut result: Option<String> = None;
    let mut announced = Vec::new();
    let run = async {
        while let Some(line) = lines.next_line().await? {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            match v["type"].as_str() {
                Some("system") if v["subtype"] == "init" => {
                    if let Some(c) = v["capabilities"].as_array() {
                        announced = c
                            .iter()
                            .filter_map(|x| x.as_str().map(str::to_string))
                            .collect();
                    }
                }
                Some("control_request") if v["request"]["subtype"] == "can_use_tool" => {
                    can_use_tool = true;
                    let resp = serde_json::json!({"type":"control_response","response":{"subtype":"success","request_id":v["request_id"],"response":{"behavior":"allow","updatedInput":v["request"]["input"]}}});
                    stdin.write_all(format!("{resp}\n").as_bytes()).await?;
                    stdin.flush().await?;
                }
                Some("result") => {
                    result = Some(v["subtype"].as_str().unwrap_or("?").to_string());
                    break;
                }
                _ => {}
            }
        }
        anyhow::Ok(())
    };
    let timed_out = tokio::time::timeout(secs(90), run).await.is_err();
    let stderr = finish(child, stdin, err_task).await;
    let ran = herm.cwd().join("probe-created.txt").exists();
    let works = can_use_tool && ran;
    let what = if works {
        format!(
            "can_use_tool control_request for Bash `touch`; allowed; the tool ran; result {}",
            result.as_deref().unwrap_or("-")
        )
    } else {
        let first_err = stderr
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with("Error") || l.starts_with("error"))
            .unwrap_or_else(|| stderr.trim())
            .chars()
            .take(200)
            .collect::<String>();
        format!(
            "no working stdio permission prompt (can_use_tool {can_use_tool}, tool ran {ran}, result {}, timed out {timed_out}): {first_err}",
            result.as_deref().unwrap_or("-")
        )
    };
    Ok((works, what, announced))
}

/// The matrix derived from the evidence.
struct Derived {
    rows: Vec<(semver::Version, Evidence, String)>,
    minimum: semver::Version,
    boundaries: Vec<(String, semver::Version, semver::Version)>,
}

fn derive() -> Result<Derived> {
    let pinned = ostler_testkit::releases::pinned()?;
    let mut rows = Vec::new();
    for p in &pinned {
        let path = evidence_path(&p.version);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "no evidence for pinned release {0} ({1}): run `cargo xtask compat probe --release {0}`",
                p.version,
                path.display()
            )
        })?;
        let ev: Evidence =
            toml::from_str(&text).with_context(|| format!("parse {}", path.display()))?;
        if ev.version != p.version {
            bail!("{} says version {}", path.display(), ev.version);
        }
        let v = semver::Version::parse(&p.version)?;
        rows.push((v, ev, p.note.clone().unwrap_or_default()));
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    // Minimum: the oldest release with working stdio permissions; every newer pinned
    // release must have them too (else the evidence contradicts itself).
    let first = rows
        .iter()
        .position(|r| r.1.stdio_permission_prompt)
        .context("no pinned release has working stdio permission prompts")?;
    if let Some(bad) = rows[first..].iter().find(|r| !r.1.stdio_permission_prompt) {
        bail!(
            "{} lacks stdio permission prompts but an older pinned release has them",
            bad.0
        );
    }
    let minimum = rows[first].0.clone();
    let mut boundaries = Vec::new();
    type Has = fn(&Evidence) -> bool;
    let caps: [(&str, Has); 6] = [
        ("--permission-prompt-tool", |e| e.stdio_permission_prompt),
        ("--include-partial-messages", |e| e.include_partial_messages),
        ("--fork-session", |e| e.fork_session),
        ("--max-turns", |e| e.max_turns),
        ("--sdk-url", |e| e.sdk_url != "absent"),
        (SDK_URL_RESTRICTED, |e| e.sdk_url == "anthropic_only"),
    ];
    for (name, has) in caps {
        for w in rows.windows(2) {
            if !has(&w[0].1) && has(&w[1].1) {
                boundaries.push((name.to_string(), w[0].0.clone(), w[1].0.clone()));
            }
            if has(&w[0].1) && !has(&w[1].1) {
                bail!(
                    "{name}: {} has it but the newer {} does not",
                    w[0].0,
                    w[1].0
                );
            }
        }
    }
    Ok(Derived {
        rows,
        minimum,
        boundaries,
    })
}

/// The boundary after which `--sdk-url` refuses non-Anthropic hosts (a restriction gained,
/// recorded like a capability).
const SDK_URL_RESTRICTED: &str = ostler_supervisor::compat::SDK_URL_RESTRICTED;

fn sdk_url_variant(s: &str) -> Result<&'static str> {
    Ok(match s {
        "absent" => "SdkUrl::Absent",
        "loopback" => "SdkUrl::Loopback",
        "anthropic_only" => "SdkUrl::AnthropicOnly",
        "unknown" => "SdkUrl::Unknown",
        other => bail!("unknown sdk_url value {other:?}"),
    })
}

fn control_variant(s: &str) -> Result<&'static str> {
    Ok(match s {
        "answered" => "ControlSupport::Answered",
        "error_answered" => "ControlSupport::ErrorAnswered",
        "unsupported" => "ControlSupport::Unsupported",
        "no_answer" => "ControlSupport::NoAnswer",
        other => bail!("unknown control support value {other:?}"),
    })
}

fn control_mark(s: Option<&String>) -> &'static str {
    match s.map(String::as_str) {
        Some("answered") => "yes",
        Some("error_answered") => "yes (error)",
        Some("unsupported") => "unsupported",
        Some("no_answer") => "no answer",
        _ => "-",
    }
}

fn render_rust(d: &Derived) -> Result<String> {
    let mut s = String::new();
    s.push_str("// @generated by `cargo xtask compat generate` from contracts/releases.toml and\n");
    s.push_str(
        "// contracts/compat/*.toml. Do not edit; `cargo xtask compat generate --check` fails\n",
    );
    s.push_str("// when this file drifts from the contracts.\n\n");
    s.push_str("use super::*;\n\n");
    s.push_str("pub(crate) static MATRIX: Matrix = Matrix {\n");
    writeln!(s, "    minimum: {:?},", d.minimum.to_string())?;
    s.push_str("    tested: &[\n");
    for (v, e, note) in &d.rows {
        s.push_str("        TestedRelease {\n");
        writeln!(s, "            version: {:?},", v.to_string())?;
        writeln!(
            s,
            "            stdio_permission_prompt: {},",
            e.stdio_permission_prompt
        )?;
        writeln!(
            s,
            "            include_partial_messages: {},",
            e.include_partial_messages
        )?;
        writeln!(s, "            fork_session: {},", e.fork_session)?;
        writeln!(s, "            max_turns: {},", e.max_turns)?;
        writeln!(s, "            sdk_url: {},", sdk_url_variant(&e.sdk_url)?)?;
        if e.announced.is_empty() {
            s.push_str("            announced: &[],\n");
        } else {
            s.push_str("            announced: &[\n");
            for c in &e.announced {
                writeln!(s, "                {c:?},")?;
            }
            s.push_str("            ],\n");
        }
        bool_map(&mut s, "options", &e.options)?;
        bool_map(&mut s, "cli_requests", &e.cli_requests)?;
        if e.dialect.is_empty() {
            s.push_str("            dialect: &[],\n");
        } else {
            s.push_str("            dialect: &[\n");
            for (k, val) in &e.dialect {
                writeln!(s, "                ({k:?}, {val:?}),")?;
            }
            s.push_str("            ],\n");
        }
        if e.hook_events.is_empty() {
            s.push_str("            hook_events: &[],\n");
        } else {
            s.push_str("            hook_events: &[\n");
            for (k, known) in &e.hook_events {
                // Known but measured never called: as unusable as unknown.
                let usable = *known && e.hook_calls.get(k) != Some(&false);
                writeln!(s, "                ({k:?}, {usable}),")?;
            }
            s.push_str("            ],\n");
        }
        bool_map(&mut s, "outputs", &e.outputs)?;
        bool_map(&mut s, "inputs", &e.inputs)?;
        bool_map(&mut s, "init_fields", &e.init_fields)?;
        bool_map(&mut s, "policies", &e.policies)?;
        if e.control.is_empty() {
            s.push_str("            control: &[],\n");
        } else {
            s.push_str("            control: &[\n");
            for (c, st) in &e.control {
                writeln!(s, "                ({c:?}, {}),", control_variant(st)?)?;
            }
            s.push_str("            ],\n");
        }
        writeln!(s, "            note: {note:?},")?;
        s.push_str("        },\n");
    }
    s.push_str("    ],\n");
    s.push_str("    boundaries: &[\n");
    for (name, without, with) in &d.boundaries {
        let ev_without = &d
            .rows
            .iter()
            .find(|r| r.0 == *without)
            .map(|r| r.1.permission_probe.clone())
            .unwrap_or_default();
        let evidence = if name == "--permission-prompt-tool" {
            format!("{without}: {ev_without}")
        } else if name == SDK_URL_RESTRICTED {
            format!(
                "{without} accepts --sdk-url ws://127.0.0.1; {with} refuses it (not an approved Anthropic endpoint)"
            )
        } else {
            format!("{without} rejects {name} as an unknown option; {with} accepts it")
        };
        s.push_str("        Boundary {\n");
        writeln!(s, "            capability: {name:?},")?;
        writeln!(s, "            last_without: {:?},", without.to_string())?;
        writeln!(s, "            first_with: {:?},", with.to_string())?;
        writeln!(s, "            evidence: {evidence:?},")?;
        s.push_str("        },\n");
    }
    s.push_str("    ],\n};\n");
    Ok(s)
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// A list of `fields` (name, what honouring it means), then a table of whether each
/// release honours each (`measured` picks the evidence column).
fn field_table(
    s: &mut String,
    d: &Derived,
    fields: &[(&str, &str)],
    measured: impl Fn(&Evidence) -> &BTreeMap<String, bool>,
) -> Result<()> {
    for (field, what) in fields {
        writeln!(s, "- `{field}`: {what}.")?;
    }
    s.push_str("\n| release |");
    for (field, _) in fields {
        write!(s, " `{field}` |")?;
    }
    s.push_str("\n| --- |");
    for _ in fields {
        s.push_str(" --- |");
    }
    s.push('\n');
    for (v, e, _) in &d.rows {
        write!(s, "| {v} |")?;
        for (field, _) in fields {
            write!(s, " {} |", mark(measured(e).get(*field)))?;
        }
        s.push('\n');
    }
    Ok(())
}

/// A measured yes/no in a table: `-` when not measured.
fn mark(v: Option<&bool>) -> &'static str {
    match v {
        Some(true) => "yes",
        Some(false) => "no",
        None => "-",
    }
}

fn render_md(d: &Derived) -> Result<String> {
    let mut s = String::new();
    s.push_str("# Claude Code compatibility\n\n");
    s.push_str("<!-- @generated by `cargo xtask compat generate` from contracts/releases.toml and contracts/compat/*.toml; `--check` fails on drift. -->\n\n");
    let newest = d.rows.last().map(|r| r.0.to_string()).unwrap_or_default();
    writeln!(
        s,
        "Minimum supported release: **{}**, the oldest release on which `--permission-prompt-tool stdio` \
         produces `can_use_tool` control requests (measured, see below). Tested range: {} to {newest}.\n",
        d.minimum, d.minimum
    )?;
    s.push_str("| level | meaning |\n| --- | --- |\n");
    s.push_str("| FULLY_COMPATIBLE | inside the tested range, every capability present |\n");
    s.push_str("| LIKELY_COMPATIBLE | newer than every tested release: starts with a warning, newest adapter, tolerant reader |\n");
    s.push_str("| DEGRADED | runs without a capability it lacks; the workaround is reported in health and `ostler doctor` |\n");
    s.push_str("| INCOMPATIBLE | older than the minimum (or refuses `--permission-prompt-tool stdio`): the daemon exits 78 |\n\n");
    s.push_str("## Pinned releases\n\n");
    s.push_str("| release | stdio permissions | `--include-partial-messages` | `--fork-session` | `--max-turns` | `--sdk-url` | announced capabilities | note |\n");
    s.push_str("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
    for (v, e, note) in &d.rows {
        writeln!(
            s,
            "| {v} | {} | {} | {} | {} | {} | {} | {note} |",
            yes(e.stdio_permission_prompt),
            yes(e.include_partial_messages),
            yes(e.fork_session),
            yes(e.max_turns),
            e.sdk_url,
            if e.announced.is_empty() {
                "none".to_string()
            } else {
                format!("{} (e.g. `{}`)", e.announced.len(), e.announced[0])
            }
        )?;
    }
    s.push_str("\n## Measured boundaries\n\n");
    s.push_str(
        "| capability | newest release without | oldest release with |\n| --- | --- | --- |\n",
    );
    for (name, without, with) in &d.boundaries {
        writeln!(s, "| `{name}` | {without} | {with} |")?;
    }
    s.push_str("\n## Control requests\n\n");
    s.push_str(
        "How each release treats the control requests ostler can send (`cargo xtask compat probe`): \
         `yes` answered, `yes (error)` answered with an error about the probe's harmless arguments \
         (the subtype is known), `unsupported` refused as an unknown subtype, `no answer` nothing \
         within 10 s times `OSTLER_TEST_TIMEOUT_SCALE` (default 3; 1.0.x ignores subtypes it does \
         not know), `-` not measured. An RPC that needs a request the running release does not serve fails at once with FAILED_PRECONDITION. \
         `hook_callback` goes the other way: `yes` when the CLI called a hook registered in \
         `initialize` during the probe's turn (remote hooks, CreateSession `hooks`, need it; \
         elsewhere CreateSession with hooks fails with FAILED_PRECONDITION).\n\n",
    );
    let controls = ostler_supervisor::compat::PROBED_CONTROLS;
    s.push_str("| release |");
    for c in controls {
        write!(s, " `{c}` |")?;
    }
    s.push_str("\n| --- |");
    for _ in controls {
        s.push_str(" --- |");
    }
    s.push('\n');
    for (v, e, _) in &d.rows {
        write!(s, "| {v} |")?;
        for c in controls {
            write!(s, " {} |", control_mark(e.control.get(c)))?;
        }
        s.push('\n');
    }
    let mut errs = Vec::new();
    for (v, e, _) in &d.rows {
        for (c, text) in &e.control_errors {
            errs.push(format!("- {v} `{c}`: {}", text.replace('|', "\\|")));
        }
    }
    if !errs.is_empty() {
        s.push_str("\nError answers:\n\n");
        for l in errs {
            writeln!(s, "{l}")?;
        }
    }
    s.push_str("\n## Session-option flags\n\n");
    s.push_str(
        "Whether each release's option parser accepts the flags behind session options \
         (`cargo xtask compat probe`: the flag alone with a harmless value, stdin at EOF; \
         `unknown option` means no). `-` not measured.\n\n",
    );
    let options = ostler_supervisor::compat::PROBED_OPTIONS;
    s.push_str("| release |");
    for (f, _) in options {
        write!(s, " `{f}` |")?;
    }
    s.push_str("\n| --- |");
    for _ in options {
        s.push_str(" --- |");
    }
    s.push('\n');
    for (v, e, _) in &d.rows {
        write!(s, "| {v} |")?;
        for (f, _) in options {
            let mark = match e.options.get(f) {
                Some(true) => "yes",
                Some(false) => "no",
                None => "-",
            };
            write!(s, " {mark} |")?;
        }
        s.push('\n');
    }
    s.push_str("\n## Control requests from the CLI\n\n");
    s.push_str(
        "Control requests the CLI sends that ostler serves (`cargo xtask compat probe`, \
         `--cli-requests-only` for just these). `mcp_message`: SDK MCP servers (client-hosted \
         tools, `CreateSessionRequest.tool_servers`): a session whose `--mcp-config` names a \
         `{\"type\":\"sdk\"}` server has the server's tool called by the model through \
         `mcp_message` and the tool's result reaches the model; a release measured `no` \
         refuses CreateSession with tool servers (FAILED_PRECONDITION). `elicitation`: MCP \
         elicitations (pending interactions clients answer, `RespondToElicitation`): a \
         stdio MCP server (the test kit's) asks for a form during its tool call, the \
         release passes it on as the `elicitation` control request, and the accepted \
         form's content reaches the server; a release measured `no` does not offer \
         elicitation to MCP servers and answers them itself, so ostler never sees one. \
         `-` not measured. Each served subtype is listed among the release's capabilities \
         as `cli_request:<subtype>`.\n\n",
    );
    let mut subtypes: Vec<&String> = d
        .rows
        .iter()
        .flat_map(|(_, e, _)| e.cli_requests.keys())
        .collect();
    subtypes.sort();
    subtypes.dedup();
    s.push_str("| release |");
    for c in &subtypes {
        write!(s, " `{c}` |")?;
    }
    s.push_str("\n| --- |");
    for _ in &subtypes {
        s.push_str(" --- |");
    }
    s.push('\n');
    for (v, e, _) in &d.rows {
        write!(s, "| {v} |")?;
        for c in &subtypes {
            let mark = match e.cli_requests.get(*c) {
                Some(true) => "yes",
                Some(false) => "no",
                None => "-",
            };
            write!(s, " {mark} |")?;
        }
        s.push('\n');
    }
    s.push_str("\n## Resuming at a message\n\n");
    s.push_str(
        "What `--resume-session-at <x>` matches in the CLI's transcript (`cargo xtask compat \
         probe`, `--dialect-only` for just this): `uuid` (an entry's uuid), `message_id` (the \
         API `message.id` of an assistant entry) or `absent` (no such flag: ResumeSession / \
         CreateSession at a message are refused with FAILED_PRECONDITION). ostler takes the \
         message id clients see (`AssistantBlock.message_id`, or a `UserMessage.message_id`) \
         and passes what the release matches. `-` not measured.\n\n",
    );
    s.push_str("| release | `--resume-session-at` matches |\n| --- | --- |\n");
    for (v, e, _) in &d.rows {
        let key = ostler_supervisor::compat::Dialect::RESUME_SESSION_AT;
        writeln!(
            s,
            "| {v} | {} |",
            e.dialect.get(key).map_or("-", String::as_str)
        )?;
    }
    s.push_str("\n## Messages on request\n\n");
    s.push_str(
        "Messages a release writes when a session asks for them (`cargo xtask compat probe`, \
         `--outputs-only` for just these). `prompt_suggestion` (session option \
         `prompt_suggestions`, the Agent SDKs' `promptSuggestions`): two turns of a session \
         whose `initialize` asks for suggestions; `yes` when the model's suggestion came \
         after the second turn. A release measured `no` refuses the option \
         (FAILED_PRECONDITION). Each is listed among the release's capabilities as \
         `output:<type>`. `-` not measured.\n\n",
    );
    s.push_str("| release | `prompt_suggestion` |\n| --- | --- |\n");
    for (v, e, _) in &d.rows {
        let mark = match e.outputs.get("prompt_suggestion") {
            Some(true) => "yes",
            Some(false) => "no",
            None => "-",
        };
        writeln!(s, "| {v} | {mark} |")?;
    }
    s.push_str("\n## User-message fields\n\n");
    s.push_str(
        "How a release takes a user message's fields besides its content (`cargo xtask \
         compat probe`, `--inputs-only` for just these; SendMessage's `priority`, `verbatim` \
         and `context_only`). A release that ignores a field runs the message as if it were \
         not there, so SendMessage refuses a field the running release is measured not to \
         honour with FAILED_PRECONDITION, before anything is recorded or written; \
         CreateSession and ResumeSession likewise refuse the session option \
         `verbatim_prompts` (every message `verbatim`) where `verbatim` is measured `no`. \
         Each honoured field is listed among the release's capabilities as \
         `input:<field>`. `-` not measured.\n\n",
    );
    field_table(&mut s, d, &ostler_supervisor::compat::MESSAGE_FIELDS, |e| {
        &e.inputs
    })?;
    s.push_str("\n## Initialize fields\n\n");
    s.push_str(
        "Session options sent in `initialize` rather than as flags, measured by their effect \
         (`cargo xtask compat probe`, `--init-fields-only` for just these; CreateSession's \
         `skills` / `all_skills`, `plan_mode_instructions`, `tool_aliases`, \
         `exclude_dynamic_sections`, `forward_subagent_text`, ...), and the AskUserQuestion \
         options the CLI reads from its environment (`question_preview_format`, \
         `question_extended`, `question_optional_descriptions`: the Agent SDKs' \
         `toolConfig.askUserQuestion`), measured alike. A release ignores a field it \
         does not know, so CreateSession refuses one the release is measured not to honour \
         with FAILED_PRECONDITION; except `title` (CreateSession's `title`, sent at create \
         and fork), which such a release is just not sent: the title is ostler's own too. Each honoured field is listed among the release's \
         capabilities as `init:<field>`. `-` not measured.\n\n",
    );
    field_table(&mut s, d, &ostler_supervisor::compat::INIT_FIELDS, |e| {
        &e.init_fields
    })?;
    s.push_str("\n## Policies\n\n");
    s.push_str(
        "Settings the CLI must enforce whatever the session asks, measured by their effect \
         (`cargo xtask compat probe`, `--policies-only` for just these; the daemon's \
         `sessions.managed_settings` and CreateSession's `managed_settings`, passed as \
         `--managed-settings`). A release may accept the flag and ignore it, so a session \
         with a policy is refused (CreateSession: FAILED_PRECONDITION; the daemon's: exit 78 \
         at start) unless the release is measured to enforce it. Each enforced policy is \
         listed among the release's capabilities as `policy:<name>`. `-` not measured.\n\n",
    );
    field_table(&mut s, d, &ostler_supervisor::compat::POLICIES, |e| {
        &e.policies
    })?;
    s.push_str("\n## Hook events\n\n");
    s.push_str(
        "Which hook events each release knows (`cargo xtask compat probe`, `--hook-events-only` \
         for just these): the events of the TypeScript Agent SDK 0.3.332, each looked up in the \
         release's own list of hook event names (in its `cli.js` or native binary). The CLI \
         accepts a registration of an event it does not know and never calls it, so \
         CreateSession refuses a hook registration (`hooks`) for an event the running release \
         does not know with FAILED_PRECONDITION naming the event. Knowing an event is not \
         firing it in every mode: `PermissionRequest` is also measured in a turn (a hook \
         registered in `initialize`, a Bash tool that needs permission while permission \
         prompts go to ostler as `can_use_tool`); a release that knows it but never called \
         it there is listed under \"known, never called\" and refused the same way. Where \
         it is called, it comes beside the prompt and the first answer wins.\n\n",
    );
    s.push_str(
        "| release | hook events ostler accepts | not known | known, never called |\n\
         | --- | --- | --- | --- |\n",
    );
    let names = |keep: &dyn Fn(&str) -> bool| {
        let v: Vec<String> = ostler_protocol::hooks::HOOK_EVENTS
            .iter()
            .filter(|h| keep(h))
            .map(|h| format!("`{h}`"))
            .collect();
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    for (v, e, _) in &d.rows {
        if e.hook_events.is_empty() {
            writeln!(s, "| {v} | - | - | - |")?;
            continue;
        }
        let uncalled =
            |h: &str| e.hook_events.get(h) == Some(&true) && e.hook_calls.get(h) == Some(&false);
        let usable = e
            .hook_events
            .iter()
            .filter(|(h, k)| **k && !uncalled(h))
            .count();
        writeln!(
            s,
            "| {v} | {usable} of {} | {} | {} |",
            e.hook_events.len(),
            names(&|h| e.hook_events.get(h) == Some(&false)),
            names(&uncalled),
        )?;
    }
    s.push_str("\n## Evidence of the permission probe\n\n");
    for (v, e, _) in &d.rows {
        writeln!(s, "- {v}: {}", e.permission_probe)?;
    }
    s.push_str(
        "\n## Method\n\n\
         - Permission protocol: `cargo xtask compat probe` runs one real turn per release against the \
         fake model server, which asks for `Bash touch probe-created.txt`; the release passes when a \
         `can_use_tool` control request arrives and, once allowed, the file exists. Releases before \
         the boundary accept the flag but look for an MCP tool named `stdio`.\n\
         - Flags: `claude -p --input-format stream-json --output-format stream-json --verbose <flags>` \
         with stdin at EOF, a throwaway HOME and an unreachable API URL. The option parser runs first: \
         an unknown flag gives `error: unknown option '--x'`; anything else (exit 0, or an error about \
         the empty input on older releases) means accepted. `--help` is not used: recent releases hide \
         working flags (`--permission-prompt-tool`, `--max-turns`, `--sdk-url`). `--version` is not \
         used either: it is answered before options are validated. The daemon runs the same flag probe \
         on the installed binary at start-up, so releases that were not pinned are measured too; the \
         boundaries above decide only when the probe cannot run.\n\
         - Boundaries come from adjacent pinned releases; the pinned list holds a release on each side \
         of every boundary (for `--fork-session`, 1.0.118 was never published). `--sdk-url` (the \
         WebSocket transport, not used by ostler) is reported for completeness.\n",
    );
    Ok(s)
}

pub fn generate(a: GenerateArgs) -> Result<()> {
    let d = derive()?;
    let outputs = [
        (
            root().join("crates/ostler-supervisor/src/matrix_generated.rs"),
            render_rust(&d)?,
        ),
        (root().join("docs/compatibility.md"), render_md(&d)?),
    ];
    let mut stale = Vec::new();
    for (path, text) in &outputs {
        let current = std::fs::read_to_string(path).unwrap_or_default();
        if current != *text {
            if a.check {
                stale.push(path.display().to_string());
            } else {
                std::fs::write(path, text)?;
                println!("wrote {}", path.display());
            }
        }
    }
    if !stale.is_empty() {
        bail!(
            "compatibility matrix out of date: {} (run `cargo xtask compat generate`)",
            stale.join(", ")
        );
    }
    if a.check {
        println!("compatibility matrix up to date (minimum {})", d.minimum);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cargo test` catches a matrix or doc that drifted from the contracts.
    #[test]
    fn generated_matrix_is_up_to_date() {
        generate(GenerateArgs { check: true }).expect("run `cargo xtask compat generate`");
    }

    #[test]
    fn derived_minimum_and_boundaries() {
        let d = derive().expect("derive");
        assert_eq!(d.minimum.to_string(), "1.0.59");
        let b: Vec<(String, String, String)> = d
            .boundaries
            .iter()
            .map(|(n, a, b)| (n.clone(), a.to_string(), b.to_string()))
            .collect();
        assert!(b.contains(&(
            "--include-partial-messages".into(),
            "1.0.108".into(),
            "1.0.109".into()
        )));
        assert!(b.contains(&("--fork-session".into(), "1.0.117".into(), "1.0.119".into())));
    }
}
