//! CreateSession's options against the real CLI (1.0.128 and the newest pinned 2.1.x):
//! each option reaches the CLI's command line (read from `/proc/<pid>/cmdline` of the
//! process the daemon spawned) and, where cheap, its behaviour (the replaced system
//! prompt is in the fake model's request); the session's own environment variables are
//! in `/proc/<pid>/environ` and nowhere in RPC answers or the log; an option the release
//! lacks fails at once with FAILED_PRECONDITION; bad values are INVALID_ARGUMENT naming
//! the field before anything is created; a client-chosen id makes create idempotent.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error

use crate::common;

use std::collections::BTreeMap;

use common::grpc::*;
use common::*;
use ostler_proto::v1 as pb;
use ostler_proto::v1::session_service_client::SessionServiceClient;
use tonic::Code;
use tonic::transport::Channel;

fn nul_separated(path: String) -> Vec<String> {
    std::fs::read(path)
        .unwrap()
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

/// The one CLI process of the daemon (`session` just created or resumed): its argv and
/// environment, read once the session settled (see [`settled`]).
async fn the_cli(
    daemon: &Daemon,
    c: &mut SessionServiceClient<Channel>,
    session: &pb::Session,
) -> (Vec<String>, BTreeMap<String, String>) {
    settled(c, session).await;
    let kids = children(daemon.pid());
    assert_eq!(kids.len(), 1, "one CLI process under the daemon: {kids:?}");
    let raw = cmdline(kids[0]);
    // `--settings` and `--mcp-config` JSON (secrets: MCP headers and env) is not on the
    // command line, which every local user can read: the CLI reads it from `/dev/fd/N`,
    // read here through `/proc` for the checks.
    for flag in ["--settings", "--mcp-config"] {
        assert!(
            value_of(&raw, flag).is_none_or(|v| !v.starts_with('{')),
            "{flag} JSON on the command line: {raw:?}"
        );
    }
    let argv = raw
        .into_iter()
        .map(|a| match a.strip_prefix("/dev/fd/") {
            Some(n) => std::fs::read_to_string(format!("/proc/{}/fd/{n}", kids[0]))
                .unwrap_or_else(|e| panic!("the CLI's {a}: {e}")),
            None => a,
        })
        .collect();
    let env = nul_separated(format!("/proc/{}/environ", kids[0]))
        .into_iter()
        .filter_map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
        })
        .collect();
    (argv, env)
}

fn value_of<'a>(argv: &'a [String], flag: &str) -> Option<&'a str> {
    argv.windows(2)
        .find(|w| w[0] == flag)
        .map(|w| w[1].as_str())
}

/// Creates a session from `req` (in the world's work directory), sends `prompt` and reads
/// its events until the turn ends: the session, its event stream, and what was read.
async fn create_and_turn(
    c: &mut SessionServiceClient<Channel>,
    world: &World,
    req: pb::CreateSessionRequest,
    prompt: &str,
) -> (pb::Session, Events, Vec<pb::SessionEvent>) {
    let session = c
        .create_session(pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            ..req
        })
        .await
        .unwrap()
        .into_inner();
    let mut events = subscribe(c, &session.id, 0, false).await;
    send(c, &session.id, prompt).await;
    let mut seen = Vec::new();
    read_until(&mut events, &mut seen, "the turn's end", is_turn_completed).await;
    (session, events, seen)
}

/// The model requests that carry `prompt` (the warmups left out), oldest first.
fn turn_requests(world: &World, prompt: &str) -> Vec<ostler_testkit::server::RecordedRequest> {
    world
        .fake
        .requests()
        .into_iter()
        .filter(|r| {
            r.body.as_ref().is_some_and(|b| {
                b.to_string().contains(prompt) && !ostler_testkit::server::is_warmup(b)
            })
        })
        .collect()
}

const SYSTEM: &str = "OSTLER-REPLACED-SYSTEM-PROMPT: answer in one word.";
const APPENDED: &str = "OSTLER-APPENDED-TEXT";
const SECRET: &str = "per-session-secret-4711";
const MCP_SECRET: &str = "mcp-header-secret-0815";

fn full_request(world: &World, extra_dir: &str, new_release: bool) -> pb::CreateSessionRequest {
    let mcp = |t| pb::McpServerSpec {
        transport: Some(t),
        ..Default::default()
    };
    use pb::mcp_server_spec::Transport;
    pb::CreateSessionRequest {
        cwd: world.work.display().to_string(),
        system_prompt: SYSTEM.into(),
        append_system_prompt: APPENDED.into(),
        add_dirs: vec![extra_dir.to_owned()],
        fallback_model: "claude-ostler-fallback".into(),
        settings: r#"{"cleanupPeriodDays": 3}"#.into(),
        setting_sources: vec!["user".into(), "local".into()],
        agents_json: r#"{"reviewer": {"description": "Reviews code", "prompt": "Review."}}"#.into(),
        strict_mcp_config: true,
        mcp_servers: [
            (
                "tickets".to_string(),
                mcp(Transport::Stdio(pb::McpStdioServerSpec {
                    command: "/bin/cat".into(),
                    args: vec![],
                    env: [("TICKETS_TOKEN".to_string(), MCP_SECRET.to_string())].into(),
                })),
            ),
            (
                "remote".to_string(),
                pb::McpServerSpec {
                    // The per-server settings (measured in 2.1.332's config schema).
                    timeout_ms: new_release.then_some(30_000),
                    always_load: new_release.then_some(false),
                    tools: if new_release {
                        vec![pb::McpToolPolicy {
                            name: "wipe".into(),
                            permission_policy: "always_deny".into(),
                            ..Default::default()
                        }]
                    } else {
                        vec![]
                    },
                    ..mcp(Transport::Http(pb::McpRemoteServerSpec {
                        url: "http://127.0.0.1:9/mcp".into(),
                        headers: [("Authorization".to_string(), MCP_SECRET.to_string())].into(),
                    }))
                },
            ),
        ]
        .into(),
        env: [("OPTS_SESSION_TOKEN".to_string(), SECRET.to_string())].into(),
        max_budget_usd: new_release.then_some(2.5),
        max_thinking_tokens: new_release.then_some(4096),
        json_schema: if new_release {
            r#"{"type": "object"}"#.into()
        } else {
            String::new()
        },
        tools: new_release.then(|| "Read,Bash".to_owned()),
        agent: if new_release {
            "reviewer".into()
        } else {
            String::new()
        },
        effort: if new_release {
            "low".into()
        } else {
            String::new()
        },
        ..Default::default()
    }
}

async fn options_reach_the_cli(release: &str) {
    let world = World::new(release).await;
    let extra = world.work.join("extra");
    std::fs::create_dir_all(&extra).unwrap();
    let extra = extra.display().to_string();
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let new = release != OLD;
    let session = c
        .create_session(full_request(&world, &extra, new))
        .await
        .unwrap_or_else(|s| panic!("{release}: create: {s:?}"))
        .into_inner();

    let (argv, env) = the_cli(&daemon, &mut c, &session).await;
    let show = argv.join(" ");
    assert_eq!(value_of(&argv, "--system-prompt"), Some(SYSTEM), "{show}");
    assert_eq!(value_of(&argv, "--append-system-prompt"), Some(APPENDED));
    assert_eq!(value_of(&argv, "--add-dir"), Some(extra.as_str()));
    assert_eq!(
        value_of(&argv, "--fallback-model"),
        Some("claude-ostler-fallback")
    );
    assert_eq!(
        value_of(&argv, "--settings"),
        Some(r#"{"cleanupPeriodDays": 3}"#)
    );
    assert_eq!(value_of(&argv, "--setting-sources"), Some("user,local"));
    assert!(value_of(&argv, "--agents").is_some_and(|a| a.contains("reviewer")));
    assert!(argv.iter().any(|a| a == "--strict-mcp-config"), "{show}");
    let mcp: serde_json::Value =
        serde_json::from_str(value_of(&argv, "--mcp-config").unwrap()).unwrap();
    assert_eq!(mcp["mcpServers"]["tickets"]["type"], "stdio");
    assert_eq!(mcp["mcpServers"]["tickets"]["command"], "/bin/cat");
    assert_eq!(mcp["mcpServers"]["remote"]["type"], "http");
    assert_eq!(
        mcp["mcpServers"]["remote"]["headers"]["Authorization"],
        MCP_SECRET
    );
    if new {
        let remote = &mcp["mcpServers"]["remote"];
        assert_eq!(remote["timeout"], 30_000, "{remote}");
        assert_eq!(remote["alwaysLoad"], false, "{remote}");
        assert_eq!(
            remote["tools"],
            serde_json::json!([{"name": "wipe", "permission_policy": "always_deny"}])
        );
    } else {
        assert!(mcp["mcpServers"]["remote"].get("timeout").is_none());
    }
    if new {
        assert_eq!(value_of(&argv, "--max-budget-usd"), Some("2.5"));
        assert_eq!(value_of(&argv, "--max-thinking-tokens"), Some("4096"));
        assert_eq!(
            value_of(&argv, "--json-schema"),
            Some(r#"{"type": "object"}"#)
        );
        assert_eq!(value_of(&argv, "--tools"), Some("Read,Bash"));
        assert_eq!(value_of(&argv, "--agent"), Some("reviewer"));
        assert_eq!(value_of(&argv, "--effort"), Some("low"));
    } else {
        for flag in ["--tools", "--agent", "--effort"] {
            assert!(!argv.iter().any(|a| a == flag), "{release}: {show}");
        }
    }
    // The session's own variable is in the CLI's environment.
    assert_eq!(
        env.get("OPTS_SESSION_TOKEN").map(String::as_str),
        Some(SECRET)
    );

    // The CLI took them all: the session runs (no exit); the recorded options show no
    // secret.
    let got = c
        .get_session(pb::GetSessionRequest {
            session_id: session.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let events = history(&mut c, &session.id).await;
    let created = events
        .iter()
        .find_map(|e| match &e.payload {
            Some(pb::session_event::Payload::EngineNotice(n)) if n.code == "session_created" => {
                Some(n.data_json.clone())
            }
            _ => None,
        })
        .expect("session_created notice");
    assert!(created.contains("OPTS_SESSION_TOKEN") && created.contains("<redacted>"));
    assert!(created.contains(SYSTEM), "{created}");
    let answers = format!("{session:?} {got:?} {events:?}");
    for secret in [SECRET, MCP_SECRET] {
        assert!(
            !answers.contains(secret),
            "{release}: {secret} in an RPC answer"
        );
        assert!(
            !daemon.log_text().contains(secret),
            "{release}: {secret} in the daemon's log"
        );
    }
    assert!(
        !events.iter().any(|e| matches!(
            e.payload,
            Some(pb::session_event::Payload::ProcessExited(_))
        )),
        "{release}: the CLI exited: {:#?}",
        events.iter().map(describe).collect::<Vec<_>>()
    );

    // A resume re-applies every option (read back from the session's log).
    c.stop_session(pb::StopSessionRequest {
        session_id: session.id.clone(),
    })
    .await
    .unwrap();
    let resumed = c
        .resume_session(pb::ResumeSessionRequest {
            session_id: session.id.clone(),
            fresh_conversation_if_missing: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (again, env) = the_cli(&daemon, &mut c, &resumed).await;
    for flag in [
        "--system-prompt",
        "--append-system-prompt",
        "--add-dir",
        "--fallback-model",
        "--settings",
        "--setting-sources",
        "--agents",
        "--mcp-config",
    ] {
        assert_eq!(
            value_of(&again, flag),
            value_of(&argv, flag),
            "{release}: {flag} after resume"
        );
    }
    assert!(again.iter().any(|a| a == "--strict-mcp-config"));
    if new {
        for flag in ["--max-budget-usd", "--tools", "--agent", "--effort"] {
            assert_eq!(
                value_of(&again, flag),
                value_of(&argv, flag),
                "{release}: {flag} after resume"
            );
        }
    }
    assert_eq!(
        env.get("OPTS_SESSION_TOKEN").map(String::as_str),
        Some(SECRET)
    );
}

#[tokio::test]
async fn options_reach_the_cli_new() {
    options_reach_the_cli(NEW).await;
}

#[tokio::test]
async fn options_reach_the_cli_old() {
    options_reach_the_cli(OLD).await;
}

/// The replaced system prompt (and the appended text) are what the model is sent.
async fn system_prompt_reaches_the_model(release: &str) {
    let world = World::new(release).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let req = pb::CreateSessionRequest {
        system_prompt: SYSTEM.into(),
        append_system_prompt: APPENDED.into(),
        ..Default::default()
    };
    create_and_turn(&mut c, &world, req, "Say hello").await;
    let systems: Vec<String> = turn_requests(&world, "Say hello")
        .iter()
        .filter_map(|r| r.body.as_ref())
        .map(|b| b["system"].to_string())
        .collect();
    // The turn's request carries both (a release may send side requests, e.g. a topic
    // check, with a system prompt of their own).
    assert!(
        systems
            .iter()
            .any(|s| s.contains("OSTLER-REPLACED-SYSTEM-PROMPT") && s.contains(APPENDED)),
        "{release}: {systems:#?}"
    );
}

#[tokio::test]
async fn system_prompt_reaches_the_model_new() {
    system_prompt_reaches_the_model(NEW).await;
}

#[tokio::test]
async fn system_prompt_reaches_the_model_old() {
    system_prompt_reaches_the_model(OLD).await;
}

/// Whether some object in `v` has `key` set to the string `value`.
fn sets(v: &serde_json::Value, key: &str, value: &str) -> bool {
    match v {
        serde_json::Value::Object(m) => {
            m.get(key).and_then(|x| x.as_str()) == Some(value)
                || m.values().any(|x| sets(x, key, value))
        }
        serde_json::Value::Array(a) => a.iter().any(|x| sets(x, key, value)),
        _ => false,
    }
}

/// `tools`, `agent`, `effort` and `plugin_dirs` reach the CLI: the turn's request offers
/// only the built-in tools named, its system prompt is the agent's, and it carries the
/// effort; the plugin's command is among the session's slash commands.
#[tokio::test]
async fn tools_agent_effort_and_plugins_reach_the_cli() {
    let world = World::new(NEW).await;
    let plugin = world.work.join("plugin");
    std::fs::create_dir_all(plugin.join(".claude-plugin")).unwrap();
    std::fs::create_dir_all(plugin.join("commands")).unwrap();
    std::fs::write(
        plugin.join(".claude-plugin/plugin.json"),
        r#"{"name": "ostlerplug", "version": "0.1.0", "description": "a test plugin"}"#,
    )
    .unwrap();
    std::fs::write(
        plugin.join("commands/plugword.md"),
        "---\ndescription: say the plugin word\n---\nReply with PLUGIN-WORD-77.\n",
    )
    .unwrap();
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let req = pb::CreateSessionRequest {
        tools: Some("Read,Grep".into()),
        agents_json: r#"{"reviewer": {"description": "Reviews code", "prompt": "OSTLER-AGENT-PROMPT: review carefully."}}"#.into(),
        agent: "reviewer".into(),
        effort: "low".into(),
        plugin_dirs: vec![plugin.display().to_string()],
        ..Default::default()
    };
    let (session, ..) = create_and_turn(&mut c, &world, req, "Say hello").await;
    let turn = turn_requests(&world, "Say hello")
        .into_iter()
        .find_map(|r| r.body)
        .expect("the turn's request");
    let tools: Vec<&str> = turn["tools"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["name"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        tools.contains(&"Read") && tools.contains(&"Grep"),
        "{tools:?}"
    );
    for absent in ["Bash", "Write", "Edit"] {
        assert!(!tools.contains(&absent), "{absent} offered: {tools:?}");
    }
    assert!(
        turn["system"].to_string().contains("OSTLER-AGENT-PROMPT"),
        "{}",
        turn["system"]
    );
    // The effort level is sent with the request (2.1.332: in `output_config`).
    assert!(
        sets(&turn, "effort", "low"),
        "no effort in the request: {}",
        turn.to_string().chars().take(2000).collect::<String>()
    );
    let info = c
        .get_session_info(pb::GetSessionInfoRequest {
            session_id: session.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        info.slash_commands
            .iter()
            .any(|c| c == "ostlerplug:plugword"),
        "{:?}",
        info.slash_commands
    );
}

fn hook_activity(e: &pb::SessionEvent) -> Option<&pb::HookActivity> {
    match &e.payload {
        Some(pb::session_event::Payload::HookActivity(h)) => Some(h),
        _ => None,
    }
}

/// `include_hook_events`: a shell hook of the session's settings (Stop) is reported as
/// HookActivity, started then ended with its output, exit code and outcome, before the
/// turn's end, live and replayed; a prompt a UserPromptSubmit hook blocks ends its turn
/// with the hook's failure and the CLI's `Informational` banner giving the reason; a
/// session without the option gets no HookActivity for the same hook. `betas` reach the model as the `anthropic-beta` header (2.1.332 sends
/// `context-1m-2025-08-07` for Sonnet 4.5).
#[tokio::test]
async fn hook_events_and_betas_reach_the_cli() {
    let world = World::new(NEW).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    // A Stop hook with output, and a UserPromptSubmit hook that blocks prompts naming
    // BLOCK-ME (exit 2, its stderr the reason).
    let settings = r#"{"hooks": {
        "Stop": [{"hooks": [{"type": "command", "command": "echo STOP-HOOK-OUT; echo STOP-HOOK-ERR >&2"}]}],
        "UserPromptSubmit": [{"hooks": [{"type": "command", "command": "grep -q BLOCK-ME && { echo 'no BLOCK-ME prompts here' >&2; exit 2; }; exit 0"}]}]
    }}"#;
    let mut hooks_seen = Vec::new();
    for (include, prompt) in [(true, "Say hello"), (false, "Say goodbye")] {
        let req = pb::CreateSessionRequest {
            settings: settings.into(),
            include_hook_events: include,
            model: "claude-sonnet-4-5-20250929".into(),
            betas: if include {
                vec!["context-1m-2025-08-07".into()]
            } else {
                vec![]
            },
            ..Default::default()
        };
        let (session, mut events, seen) = create_and_turn(&mut c, &world, req, prompt).await;
        let live: Vec<pb::HookActivity> = seen
            .iter()
            .filter_map(hook_activity)
            .filter(|h| h.hook_event == "Stop")
            .cloned()
            .collect();
        let turn = turn_requests(&world, prompt)
            .pop()
            .expect("the turn's request");
        let beta = turn.anthropic_beta.unwrap_or_default();
        if !include {
            assert!(live.is_empty(), "hook events without the option: {live:?}");
            assert!(!beta.contains("context-1m"), "{beta}");
            continue;
        }
        assert!(
            beta.split(',').any(|b| b == "context-1m-2025-08-07"),
            "betas not sent: {beta:?}"
        );
        let phases: Vec<&str> = live.iter().map(|h| h.phase.as_str()).collect();
        assert_eq!(phases.first(), Some(&"started"), "{live:?}");
        assert_eq!(phases.last(), Some(&"response"), "{live:?}");
        let (start, end) = (&live[0], &live[live.len() - 1]);
        assert!(
            !start.hook_id.is_empty() && start.hook_id == end.hook_id,
            "{live:?}"
        );
        assert_eq!(end.hook_name, "Stop");
        assert_eq!(end.stdout, "STOP-HOOK-OUT\n");
        assert_eq!(end.stderr, "STOP-HOOK-ERR\n");
        assert_eq!(end.exit_code, Some(0));
        assert_eq!(end.outcome, "success");
        assert!(
            end.fields_json.contains("\"hook_response\""),
            "{}",
            end.fields_json
        );
        // Stored and replayed typed, in the same order.
        let mut replay = subscribe(&mut c, &session.id, 0, false).await;
        let mut again = Vec::new();
        read_until(
            &mut replay,
            &mut again,
            "the replayed turn's end",
            is_turn_completed,
        )
        .await;
        let replayed: Vec<pb::HookActivity> = again
            .iter()
            .filter_map(hook_activity)
            .filter(|h| h.hook_event == "Stop")
            .cloned()
            .collect();
        assert_eq!(replayed, live);
        hooks_seen = live;
        // A prompt the UserPromptSubmit hook blocks: the hook's end says so (exit 2), the
        // CLI's banner carries its reason, the turn ends, and the model is not asked.
        let before = world.fake.requests().len();
        send(&mut c, &session.id, "please BLOCK-ME now").await;
        let mut blocked = Vec::new();
        read_until(
            &mut events,
            &mut blocked,
            "the blocked turn's end",
            is_turn_completed,
        )
        .await;
        let end = blocked
            .iter()
            .filter_map(hook_activity)
            .find(|h| h.hook_event == "UserPromptSubmit" && h.phase == "response")
            .unwrap_or_else(|| panic!("no end of the UserPromptSubmit hook: {blocked:?}"));
        assert_eq!(
            (end.exit_code, end.outcome.as_str()),
            (Some(2), "error"),
            "{end:?}"
        );
        assert!(end.stderr.contains("no BLOCK-ME prompts here"), "{end:?}");
        let banner = blocked
            .iter()
            .find_map(|e| match &e.payload {
                Some(pb::session_event::Payload::Informational(i)) => Some(i),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no banner: {blocked:?}"));
        assert_eq!(banner.level, "warning");
        assert!(banner.prevent_continuation);
        assert!(
            banner.content.contains("no BLOCK-ME prompts here"),
            "{banner:?}"
        );
        assert!(
            !world.fake.requests()[before..].iter().any(|r| r
                .body
                .as_ref()
                .is_some_and(|b| b.to_string().contains("BLOCK-ME"))),
            "the blocked prompt reached the model"
        );
    }
    assert!(!hooks_seen.is_empty());
}

/// The CLI asks the model for a prompt suggestion with a prompt that starts with this
/// (2.1.120, 2.1.332).
const SUGGESTIONS: &str = r#"
default_text = "OK."

[[model]]
name = "suggestion"
when = { last_user_text_contains = "[SUGGESTION MODE" }
blocks = [{ type = "text", text = "run the tests next" }]
"#;

/// `prompt_suggestions`: after the second turn (the CLI suggests nothing after the first)
/// the model's suggestion reaches the client as PromptSuggestion after the turn's end,
/// live and replayed; a release measured not to write suggestions refuses the option at
/// once.
#[tokio::test]
async fn prompt_suggestions_reach_the_client() {
    let world = World::with_scenario(NEW, SUGGESTIONS).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let req = pb::CreateSessionRequest {
        prompt_suggestions: true,
        ..Default::default()
    };
    let (session, mut events, mut seen) = create_and_turn(&mut c, &world, req, "Say hello").await;
    send(&mut c, &session.id, "Tell me more").await;
    read_until(
        &mut events,
        &mut seen,
        "the second turn's end",
        is_turn_completed,
    )
    .await;
    let suggested = |e: &pb::SessionEvent| match &e.payload {
        Some(pb::session_event::Payload::PromptSuggestion(p)) => Some(p.suggestion.clone()),
        _ => None,
    };
    let ev = read_until(&mut events, &mut seen, "the suggestion", |e| {
        suggested(e).is_some()
    })
    .await;
    assert_eq!(suggested(&ev).as_deref(), Some("run the tests next"));
    let mut replay = subscribe(&mut c, &session.id, 0, false).await;
    let mut again = Vec::new();
    let replayed = read_until(&mut replay, &mut again, "the replayed suggestion", |e| {
        e.seq == ev.seq
    })
    .await;
    assert_eq!(replayed, ev);

    let old = World::new(OLD).await;
    let daemon = old.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let e = c
        .create_session(pb::CreateSessionRequest {
            cwd: old.work.display().to_string(),
            prompt_suggestions: true,
            ..Default::default()
        })
        .await
        .expect_err("refused on the old release");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains(OLD) && e.message().contains("prompt_suggestions"),
        "{}",
        e.message()
    );
    assert!(children(daemon.pid()).is_empty());
}

/// A turn whose Bash call needs permission, then text once its result came.
const NEEDS_PERMISSION: &str = r#"
default_text = "OK."

[[model]]
name = "bash"
when = { last_user_text_contains = "Create the file" }
blocks = [{ type = "tool_use", id = "toolu_pp_1", name = "Bash", input = { command = "touch made-by-bash.txt", description = "create a file" } }]

[[model]]
name = "after"
when = { tool_result_for = "toolu_pp_1" }
blocks = [{ type = "text", text = "Done." }]
"#;

/// `permission_prompts = "none"`: a tool call that would prompt is denied by the CLI at
/// once (no PermissionRequested; the model gets the denial and the turn ends), nothing is
/// run; `thinking` and `thinking_display` reach the model's requests (2.1.332 sends
/// Sonnet 4.5 `{"type":"disabled"}`, and `summarized` as asked; `omitted` it sends as its
/// default `updates`, measured by hand); `task_budget_tokens` reaches the model as
/// `output_config.task_budget`.
#[tokio::test]
async fn permission_prompts_and_thinking_reach_the_cli() {
    let world = World::with_scenario(NEW, NEEDS_PERMISSION).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let req = pb::CreateSessionRequest {
        permission_prompts: "none".into(),
        model: "claude-sonnet-4-5-20250929".into(),
        thinking: "disabled".into(),
        ..Default::default()
    };
    let (_, _, seen) = create_and_turn(&mut c, &world, req, "Create the file please").await;
    use pb::session_event::Payload as P;
    assert!(
        !seen
            .iter()
            .any(|e| matches!(e.payload, Some(P::PermissionRequested(_)))),
        "a prompt was raised: {:?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );
    assert!(!world.work.join("made-by-bash.txt").exists());
    assert!(
        world.model_saw("no approval surface"),
        "the model was not told"
    );
    let turn = turn_requests(&world, "Create the file")
        .into_iter()
        .find_map(|r| r.body)
        .expect("the turn's request");
    assert_eq!(turn["thinking"]["type"], "disabled", "{}", turn["thinking"]);

    let before_display = world.fake.requests().len();
    assert!(
        !world
            .fake
            .requests()
            .iter()
            .filter_map(|r| r.body.as_ref())
            .any(|b| b["thinking"]["display"] == "summarized"),
        "summarized thinking asked for without the option"
    );
    let req = pb::CreateSessionRequest {
        thinking_display: "summarized".into(),
        task_budget_tokens: Some(50_000),
        ..Default::default()
    };
    create_and_turn(&mut c, &world, req, "Say hello").await;
    // The task budget reaches the model with the turn's request.
    let budget = turn_requests(&world, "Say hello")
        .into_iter()
        .find_map(|r| r.body)
        .expect("the turn's request");
    assert_eq!(
        budget["output_config"]["task_budget"],
        serde_json::json!({"type": "tokens", "total": 50_000}),
        "{}",
        budget["output_config"]
    );
    // The turn's request asks for it (without the option 2.1.332 asks for `updates`).
    let summarized = |from: usize| {
        world.fake.requests()[from..]
            .iter()
            .filter_map(|r| r.body.as_ref())
            .any(|b| b["thinking"]["display"] == "summarized")
    };
    assert!(
        summarized(before_display),
        "no request asked for summarized thinking: {:?}",
        world.fake.requests()[before_display..]
            .iter()
            .filter_map(|r| r.body.as_ref())
            .map(|b| (b["model"].clone(), b["thinking"].clone()))
            .collect::<Vec<_>>()
    );
}

/// As root, 2.1.332 exits 1 at start when it may bypass permissions outside a declared
/// sandbox ("--dangerously-skip-permissions cannot be used with root/sudo privileges").
/// The daemon refuses such a create at once with FAILED_PRECONDITION saying what to set,
/// and records nothing; with `IS_SANDBOX=1` in the session's env the same request makes a
/// session whose CLI runs a turn. Not as root the CLI starts either way (checked too).
#[tokio::test]
async fn a_bypass_session_as_root_needs_a_declared_sandbox() {
    let world = World::with_scenario(NEW, NEEDS_PERMISSION).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let root = nix::unistd::getuid().is_root();
    let bypass = pb::CreateSessionRequest {
        cwd: world.work.display().to_string(),
        permission_mode: pb::PermissionMode::BypassPermissions as i32,
        ..Default::default()
    };
    let allow = pb::CreateSessionRequest {
        cwd: world.work.display().to_string(),
        allow_dangerously_skip_permissions: true,
        ..Default::default()
    };
    for (req, which) in [
        (bypass.clone(), "permission_mode bypassPermissions"),
        (allow, "allow_dangerously_skip_permissions"),
    ] {
        let made = c.create_session(req).await;
        if root {
            let e = made.expect_err("refused as root without a sandbox");
            assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
            for needle in [which, "root", "IS_SANDBOX=1", "2.1.332"] {
                assert!(e.message().contains(needle), "{needle}: {}", e.message());
            }
        } else {
            let s = made.expect("not root: the CLI starts").into_inner();
            c.stop_session(pb::StopSessionRequest { session_id: s.id })
                .await
                .unwrap();
        }
    }
    if root {
        let list = c
            .list_sessions(pb::ListSessionsRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert!(list.sessions.is_empty(), "{:?}", list.sessions);
        assert!(children(daemon.pid()).is_empty());
    }

    // Declared a sandbox, the same session starts and bypasses the prompt.
    let made = c
        .create_session(pb::CreateSessionRequest {
            env: [("IS_SANDBOX".to_string(), "1".to_string())].into(),
            ..bypass
        })
        .await
        .expect("IS_SANDBOX=1 declares a sandbox")
        .into_inner();
    let mut events = subscribe(&mut c, &made.id, 0, false).await;
    send(&mut c, &made.id, "Create the file please").await;
    let mut seen = Vec::new();
    let asked = next_permission_request(&mut events, &mut seen).await;
    assert!(
        asked.is_none(),
        "{:?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );
    assert!(world.work.join("made-by-bash.txt").exists());
}

/// `allow_dangerously_skip_permissions` against 2.1.332 (tests run as root: the session's
/// env carries IS_SANDBOX=1, which the daemon does not pass on from its own environment).
/// A session created in `default` with the option is started with
/// `--allow-dangerously-skip-permissions` and can be switched to bypassPermissions: the
/// model's Bash call then runs without a PermissionRequested (its file exists). A resume
/// passes the flag again and starts in the mode the session was switched to. Without the
/// option the switch is refused with FAILED_PRECONDITION saying which option to create the
/// session with.
#[tokio::test]
async fn allow_dangerously_skip_permissions_lets_a_session_switch_to_bypass() {
    let world = World::with_scenario(NEW, NEEDS_PERMISSION).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let sandbox: std::collections::HashMap<String, String> =
        [("IS_SANDBOX".to_string(), "1".to_string())].into();
    let allowed = c
        .create_session(pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            allow_dangerously_skip_permissions: true,
            env: sandbox.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_ne!(
        allowed.permission_mode(),
        pb::PermissionMode::BypassPermissions
    );
    let (argv, env) = the_cli(&daemon, &mut c, &allowed).await;
    assert!(
        argv.iter()
            .any(|a| a == "--allow-dangerously-skip-permissions"),
        "{argv:?}"
    );
    assert_eq!(env.get("IS_SANDBOX").map(String::as_str), Some("1"));
    c.set_permission_mode(pb::SetPermissionModeRequest {
        session_id: allowed.id.clone(),
        mode: pb::PermissionMode::BypassPermissions as i32,
    })
    .await
    .expect("switched to bypass");
    assert_eq!(
        session(&mut c, &allowed.id).await.permission_mode(),
        pb::PermissionMode::BypassPermissions
    );
    let mut events = subscribe(&mut c, &allowed.id, 0, false).await;
    send(&mut c, &allowed.id, "Create the file please").await;
    let mut seen = Vec::new();
    let asked = next_permission_request(&mut events, &mut seen).await;
    assert!(
        asked.is_none(),
        "a prompt was raised in bypassPermissions: {:?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );
    assert!(
        world.work.join("made-by-bash.txt").exists(),
        "the Bash call did not run: {:?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );

    // A resume passes the flag again, in the mode the session was switched to.
    c.stop_session(pb::StopSessionRequest {
        session_id: allowed.id.clone(),
    })
    .await
    .unwrap();
    let resumed = c
        .resume_session(pb::ResumeSessionRequest {
            session_id: allowed.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (again, env) = the_cli(&daemon, &mut c, &resumed).await;
    assert!(
        again
            .iter()
            .any(|a| a == "--allow-dangerously-skip-permissions"),
        "{again:?}"
    );
    assert_eq!(
        value_of(&again, "--permission-mode"),
        Some("bypassPermissions")
    );
    assert_eq!(env.get("IS_SANDBOX").map(String::as_str), Some("1"));
    c.stop_session(pb::StopSessionRequest {
        session_id: allowed.id.clone(),
    })
    .await
    .unwrap();

    // Without the option the CLI refuses the switch, and the answer says what to do.
    let plain = c
        .create_session(pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            env: sandbox,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (argv, _) = the_cli(&daemon, &mut c, &plain).await;
    assert!(
        !argv
            .iter()
            .any(|a| a == "--allow-dangerously-skip-permissions"),
        "{argv:?}"
    );
    let e = c
        .set_permission_mode(pb::SetPermissionModeRequest {
            session_id: plain.id.clone(),
            mode: pb::PermissionMode::BypassPermissions as i32,
        })
        .await
        .expect_err("no bypass without the option");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("allow_dangerously_skip_permissions")
            && e.message().contains("IS_SANDBOX=1"),
        "{}",
        e.message()
    );
    assert_eq!(
        session(&mut c, &plain.id).await.permission_mode(),
        plain.permission_mode(),
        "the mode is unchanged"
    );
}

/// Bash calls, one per prompt, each creating a file in the working directory, then text.
const PROJECT_BASH: &str = r#"
default_text = "OK."

[[model]]
name = "first"
when = { last_user_text_contains = "Create the file" }
blocks = [{ type = "tool_use", id = "toolu_pcr_1", name = "Bash", input = { command = "touch made-by-bash.txt", description = "create a file" } }]

[[model]]
name = "again"
when = { last_user_text_contains = "Create another" }
blocks = [{ type = "tool_use", id = "toolu_pcr_2", name = "Bash", input = { command = "touch made-again.txt", description = "create a file" } }]

[[model]]
name = "control"
when = { last_user_text_contains = "Try the file" }
blocks = [{ type = "tool_use", id = "toolu_pcr_3", name = "Bash", input = { command = "touch made-by-bash.txt", description = "create a file" } }]

[[model]]
name = "read"
when = { last_user_text_contains = "Read the notes" }
blocks = [{ type = "tool_use", id = "toolu_pcr_read", name = "Read", input = { file_path = "notes.txt" } }]

[[model]]
name = "after-read"
when = { tool_result_for = "toolu_pcr_read" }
blocks = [{ type = "text", text = "Read them." }]

[[model]]
name = "read-control"
when = { last_user_text_contains = "Read again" }
blocks = [{ type = "tool_use", id = "toolu_pcr_read_2", name = "Read", input = { file_path = "notes.txt" } }]

[[model]]
name = "after-read-control"
when = { tool_result_for = "toolu_pcr_read_2" }
blocks = [{ type = "text", text = "Tried to read." }]

[[model]]
name = "after"
when = { tool_result_for = "toolu_pcr_1" }
blocks = [{ type = "text", text = "Done." }]

[[model]]
name = "after-again"
when = { tool_result_for = "toolu_pcr_2" }
blocks = [{ type = "text", text = "Done again." }]

[[model]]
name = "after-control"
when = { tool_result_for = "toolu_pcr_3" }
blocks = [{ type = "text", text = "Tried." }]
"#;

/// Sends `prompt` and reads this turn's events until it ends or a permission prompt
/// comes: what was read, and whether the turn ended without a prompt.
async fn turn_without_prompt(
    c: &mut SessionServiceClient<Channel>,
    id: &str,
    prompt: &str,
) -> (Vec<pb::SessionEvent>, bool) {
    let after = session(c, id).await.last_seq;
    let mut events = subscribe(c, id, after, false).await;
    send(c, id, prompt).await;
    let mut seen = Vec::new();
    let asked = next_permission_request(&mut events, &mut seen).await;
    (seen, asked.is_none())
}

/// `project_config_root` against the real CLI 2.1.332: a trusted repository R commits a
/// `.claude/settings.json` denying Bash; the session runs in W, a `git worktree` of R
/// whose branch replaces it with one denying Read instead. With project_config_root = R
/// the session follows R: the model's Bash call is refused by the CLI itself (no
/// permission prompt, no file), also after a daemon restart (the option is recorded with
/// the session and passed again), and its Read of a file in W runs (W's deny not read).
/// Without it the session follows the branch: the Read is denied, the same Bash call asks.
/// (An `allow` rule for Bash in a project's settings is not honoured by 2.1.332 either
/// way, measured: the deny is what shows which settings the CLI read.)
#[tokio::test]
async fn project_config_root_takes_the_project_settings_from_the_trusted_checkout() {
    use pb::session_event::Payload as P;
    let world = World::with_scenario(NEW, PROJECT_BASH).await;
    let trusted = world.work.join("trusted");
    let task = world.work.join("task");
    std::fs::create_dir_all(trusted.join(".claude")).unwrap();
    std::fs::write(
        trusted.join(".claude/settings.json"),
        r#"{"permissions": {"deny": ["Bash"]}}"#,
    )
    .unwrap();
    let git = |dir: &std::path::Path, args: &[&str]| {
        // The test's own fixture, a git worktree: not a process the daemon would spawn.
        #[allow(clippy::disallowed_methods)]
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(["-c", "user.name=t", "-c", "user.email=t@example.invalid"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
    };
    git(&trusted, &["init", "-q"]);
    git(&trusted, &["add", "."]);
    git(&trusted, &["commit", "-q", "-m", "deny Bash"]);
    git(
        &trusted,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "task",
            task.to_str().unwrap(),
        ],
    );
    std::fs::write(
        task.join(".claude/settings.json"),
        r#"{"permissions": {"deny": ["Read"]}}"#,
    )
    .unwrap();
    git(
        &task,
        &[
            "commit",
            "-q",
            "-am",
            "the branch trades the deny of Bash for Read",
        ],
    );
    const NOTES: &str = "PCR-NOTES-31";
    std::fs::write(task.join("notes.txt"), format!("{NOTES}\n")).unwrap();
    let shown = |seen: &[pb::SessionEvent]| seen.iter().map(describe).collect::<Vec<_>>();
    let denied = |id: &str, seen: &[pb::SessionEvent]| {
        let result = tool_result(&world, id)
            .unwrap_or_else(|| panic!("the model never got {id}'s result: {:?}", shown(seen)));
        assert_eq!(result["is_error"], true, "{result}");
        assert!(
            !seen
                .iter()
                .any(|e| matches!(e.payload, Some(P::PermissionRequested(_)))),
            "denied by the CLI, nobody asked: {:?}",
            shown(seen)
        );
    };

    let mut daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = c
        .create_session(pb::CreateSessionRequest {
            cwd: task.display().to_string(),
            project_config_root: trusted.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (argv, _) = the_cli(&daemon, &mut c, &s).await;
    let canonical = std::fs::canonicalize(&trusted).unwrap();
    let canonical = canonical.to_str().unwrap();
    assert_eq!(
        value_of(&argv, "--project-config-root"),
        Some(canonical),
        "{argv:?}"
    );
    let (seen, ended) = turn_without_prompt(&mut c, &s.id, "Create the file please").await;
    assert!(ended, "R's deny was not applied: {:?}", shown(&seen));
    denied("toolu_pcr_1", &seen);
    assert!(
        !task.join("made-by-bash.txt").exists(),
        "the denied Bash ran"
    );
    let (seen, ended) = turn_without_prompt(&mut c, &s.id, "Read the notes please").await;
    assert!(ended, "{:?}", shown(&seen));
    assert!(
        world.model_saw(NOTES),
        "the branch's deny of Read was applied: {:?}",
        tool_result(&world, "toolu_pcr_read")
    );

    // Recorded with the session: after a daemon restart the resumed CLI gets it again.
    daemon.terminate().await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let (seen, ended) = turn_without_prompt(&mut c, &s.id, "Create another file please").await;
    assert!(ended, "R's deny was lost on resume: {:?}", shown(&seen));
    denied("toolu_pcr_2", &seen);
    assert!(!task.join("made-again.txt").exists(), "the denied Bash ran");
    let resumed = session(&mut c, &s.id).await;
    let (again, _) = the_cli(&daemon, &mut c, &resumed).await;
    assert_eq!(
        value_of(&again, "--project-config-root"),
        Some(canonical),
        "{again:?}"
    );
    c.stop_session(pb::StopSessionRequest {
        session_id: s.id.clone(),
    })
    .await
    .unwrap();

    // Without it the session follows the branch: its deny of Read holds, and it has no
    // deny of Bash, so the Bash call asks.
    let plain = c
        .create_session(pb::CreateSessionRequest {
            cwd: task.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (argv, _) = the_cli(&daemon, &mut c, &plain).await;
    assert!(
        value_of(&argv, "--project-config-root").is_none(),
        "{argv:?}"
    );
    let (seen, ended) = turn_without_prompt(&mut c, &plain.id, "Read again please").await;
    assert!(ended, "{:?}", shown(&seen));
    denied("toolu_pcr_read_2", &seen);
    let (seen, ended) = turn_without_prompt(&mut c, &plain.id, "Try the file please").await;
    assert!(!ended, "no prompt without the option: {:?}", shown(&seen));
    assert!(
        matches!(seen.last().and_then(|e| e.payload.as_ref()), Some(P::PermissionRequested(p)) if p.tool_name == "Bash"),
        "{:?}",
        shown(&seen)
    );
    assert!(tool_result(&world, "toolu_pcr_3").is_none(), "not denied");

    // The checkout is checked again at a resume, like the working directory.
    std::fs::rename(&trusted, world.work.join("moved")).unwrap();
    let e = c
        .resume_session(pb::ResumeSessionRequest {
            session_id: s.id.clone(),
            ..Default::default()
        })
        .await
        .expect_err("the checkout is gone");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("project_config_root") && e.message().contains(canonical),
        "{}",
        e.message()
    );
}

/// The newest pinned release without `--project-config-root` (2.1.121, measured) refuses
/// the option at once, naming release, option and flag; nothing is created.
#[tokio::test]
async fn project_config_root_is_refused_by_a_release_without_the_flag() {
    let world = World::new("2.1.121").await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let e = c
        .create_session(pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            project_config_root: world.work.display().to_string(),
            ..Default::default()
        })
        .await
        .expect_err("2.1.121 lacks the flag");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    for needle in ["2.1.121", "project_config_root", "--project-config-root"] {
        assert!(e.message().contains(needle), "{needle}: {}", e.message());
    }
    let list = c
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(list.sessions.is_empty(), "{:?}", list.sessions);
    assert!(children(daemon.pid()).is_empty());
}

/// `skills` and `plan_mode_instructions` (sent in `initialize`) against the real CLI: with
/// two skills in the project and `skills: [alpha]`, only alpha's description reaches the
/// model and the CLI is allowed `Skill(alpha)`; in plan mode the instructions reach the
/// model. With `all_skills` both skills are listed; without plan_mode_instructions, the
/// text is not sent.
#[tokio::test]
async fn skills_and_plan_instructions_reach_the_model() {
    let world = World::new(NEW).await;
    for (name, desc) in [("alpha", "ALPHA-SKILL-DESC"), ("beta", "BETA-SKILL-DESC")] {
        let dir = world.work.join(".claude/skills").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("SKILL.md"),
            format!("---\nname: {name}\ndescription: {desc} does {name} things\n---\nBody.\n"),
        )
        .unwrap();
    }
    const PLAN: &str = "PLAN-INSTRUCTIONS-77: write the plan as a numbered list";
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let req = pb::CreateSessionRequest {
        skills: vec!["alpha".into()],
        plan_mode_instructions: PLAN.into(),
        permission_mode: pb::PermissionMode::Plan as i32,
        ..Default::default()
    };
    let (session, _, _) = create_and_turn(&mut c, &world, req, "SKILLS-ONE hello").await;
    let (argv, _) = the_cli(&daemon, &mut c, &session).await;
    let allowed: Vec<&String> = argv
        .iter()
        .skip_while(|a| *a != "--allowedTools")
        .skip(1)
        .take_while(|a| !a.starts_with("--"))
        .collect();
    assert_eq!(allowed, ["Skill(alpha)"], "{argv:?}");
    let turn: Vec<String> = turn_requests(&world, "SKILLS-ONE")
        .into_iter()
        .filter_map(|r| r.body.map(|b| b.to_string()))
        .collect();
    assert!(!turn.is_empty());
    assert!(turn.iter().any(|b| b.contains("ALPHA-SKILL-DESC")));
    assert!(!turn.iter().any(|b| b.contains("BETA-SKILL-DESC")));
    assert!(
        turn.iter().any(|b| b.contains(PLAN)),
        "no plan instructions"
    );
    let req = pb::CreateSessionRequest {
        all_skills: true,
        permission_mode: pb::PermissionMode::Plan as i32,
        ..Default::default()
    };
    create_and_turn(&mut c, &world, req, "SKILLS-TWO hello").await;
    let turn: Vec<String> = turn_requests(&world, "SKILLS-TWO")
        .into_iter()
        .filter_map(|r| r.body.map(|b| b.to_string()))
        .collect();
    assert!(turn.iter().any(|b| b.contains("ALPHA-SKILL-DESC")));
    assert!(turn.iter().any(|b| b.contains("BETA-SKILL-DESC")));
    assert!(
        !turn.iter().any(|b| b.contains(PLAN)),
        "instructions not asked for"
    );
}

/// A scenario whose model, asked `trigger`, calls `tool` on `notes.txt` (call id
/// [`NOTES_CALL`]), then answers once the call's result came back.
fn notes_call(trigger: &str, tool: &str) -> String {
    format!(
        r#"
default_text = "ok"

[[model]]
name = "after the call"
when = {{ tool_result_for = "{NOTES_CALL}" }}
blocks = [{{ type = "text", text = "Done with the notes." }}]

[[model]]
name = "the call"
when = {{ last_user_text_contains = "{trigger}" }}
blocks = [{{ type = "tool_use", id = "{NOTES_CALL}", name = "{tool}", input = {{ file_path = "notes.txt" }} }}]
"#
    )
}

const NOTES_CALL: &str = "toolu_notes_1";

/// `tool_aliases` (sent in `initialize`) against the real CLI: the model calls
/// `FetchNotes`, which no tool is called; with `{FetchNotes: Read}` the CLI runs Read and
/// the file's text comes back to the model. Without the alias the call fails.
#[tokio::test]
async fn tool_aliases_run_the_mapped_tool() {
    let world = World::with_scenario(NEW, &notes_call("Fetch the notes", "FetchNotes")).await;
    std::fs::write(world.work.join("notes.txt"), "ALIASED-NOTES-5\n").unwrap();
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let req = pb::CreateSessionRequest {
        tool_aliases: [("FetchNotes".to_string(), "Read".to_string())].into(),
        ..Default::default()
    };
    create_and_turn(&mut c, &world, req, "Fetch the notes, please.").await;
    assert!(world.model_saw("ALIASED-NOTES-5"), "Read did not run");

    let plain = World::with_scenario(NEW, &notes_call("Fetch the notes", "FetchNotes")).await;
    std::fs::write(plain.work.join("notes.txt"), "ALIASED-NOTES-5\n").unwrap();
    let daemon = plain.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    create_and_turn(
        &mut c,
        &plain,
        Default::default(),
        "Fetch the notes, please.",
    )
    .await;
    assert!(
        !plain.model_saw("ALIASED-NOTES-5"),
        "the call ran without an alias"
    );
}

/// `exclude_dynamic_sections` (`excludeDynamicSections` in `initialize`) against the real
/// CLI: the system prompt of the turn's model request names neither the session's working
/// directory nor its memory directory (under HOME), which go in the messages instead;
/// without it the memory directory is in the system prompt (2.1.332 has the working
/// directory in the first message either way).
#[tokio::test]
async fn exclude_dynamic_sections_keeps_the_session_paths_out_of_the_system_prompt() {
    let world = World::new(NEW).await;
    let home = world.home.display().to_string();
    let work = world.work.display().to_string();
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let system_and_messages = |prompt: &str| {
        let turn = turn_requests(&world, prompt);
        let body = turn.first().and_then(|r| r.body.clone()).unwrap();
        (body["system"].to_string(), body["messages"].to_string())
    };
    let req = pb::CreateSessionRequest {
        exclude_dynamic_sections: true,
        ..Default::default()
    };
    create_and_turn(&mut c, &world, req, "DYNAMIC-ONE hello").await;
    let (system, messages) = system_and_messages("DYNAMIC-ONE");
    assert!(
        !system.contains(&home),
        "memory directory in the system prompt"
    );
    assert!(
        !system.contains(&work),
        "working directory in the system prompt"
    );
    assert!(
        messages.contains(&home),
        "the model lost the memory section"
    );
    assert!(
        messages.contains(&work),
        "the model lost the working directory"
    );

    create_and_turn(&mut c, &world, Default::default(), "DYNAMIC-TWO hello").await;
    let (system, _) = system_and_messages("DYNAMIC-TWO");
    assert!(
        system.contains(&home),
        "without it the memory section is in the system prompt"
    );
}

/// The AskUserQuestion tool the model was offered in the first model request of the turn
/// of `prompt`: its description and input schema.
fn question_tool(world: &World, prompt: &str) -> (String, serde_json::Value) {
    let turn = turn_requests(world, prompt);
    let body = turn.first().and_then(|r| r.body.clone()).unwrap();
    let tool = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "AskUserQuestion")
        .unwrap_or_else(|| panic!("{prompt}: no AskUserQuestion offered"))
        .clone();
    (
        tool["description"].as_str().unwrap().to_owned(),
        tool["input_schema"].clone(),
    )
}

/// What the AskUserQuestion options change in the tool the model is offered (measured on
/// 2.1.332): the preview format adds a "Preview feature" section to the description, in
/// HTML or markdown terms; extended questions add a `kind` (choice, text, number) to each
/// question; optional descriptions drop `description` from an option's required fields.
#[derive(Debug, PartialEq)]
struct QuestionTool {
    html_previews: bool,
    markdown_previews: bool,
    kinds: bool,
    description_required: bool,
}

fn question_tool_shape(world: &World, prompt: &str) -> QuestionTool {
    let (description, schema) = question_tool(world, prompt);
    let question = &schema["properties"]["questions"]["items"];
    let option_required = question["properties"]["options"]["items"]["required"]
        .as_array()
        .unwrap_or_else(|| panic!("{prompt}: option schema {question}"));
    QuestionTool {
        html_previews: description.contains("self-contained HTML fragment"),
        markdown_previews: description.contains("rendered as markdown"),
        kinds: question["properties"]["kind"]["enum"]
            == serde_json::json!(["choice", "text", "number"]),
        description_required: option_required.iter().any(|r| r == "description"),
    }
}

/// `question_preview_format`, `question_extended` and `question_optional_descriptions`
/// (AskUserQuestion's configuration, in the CLI's environment) against the real CLI: each
/// changes the AskUserQuestion tool the model is offered, and only that part; the
/// variables are in the CLI's environment only when asked for; a resume sets them again.
#[tokio::test]
async fn question_options_change_the_question_tool_and_survive_a_resume() {
    let world = World::new(NEW).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let plain = QuestionTool {
        html_previews: false,
        markdown_previews: false,
        kinds: false,
        description_required: true,
    };
    let (session, _, _) =
        create_and_turn(&mut c, &world, Default::default(), "QUESTION-NONE hello").await;
    assert_eq!(question_tool_shape(&world, "QUESTION-NONE"), plain);
    let (_, env) = the_cli(&daemon, &mut c, &session).await;
    assert!(
        !env.keys().any(|k| k.starts_with("CLAUDE_CODE_QUESTION_")),
        "{env:?}"
    );
    c.stop_session(pb::StopSessionRequest {
        session_id: session.id.clone(),
    })
    .await
    .unwrap();
    let cases = [
        (
            pb::CreateSessionRequest {
                question_preview_format: "html".into(),
                ..Default::default()
            },
            "QUESTION-HTML",
            QuestionTool {
                html_previews: true,
                ..plain
            },
        ),
        (
            pb::CreateSessionRequest {
                question_preview_format: "markdown".into(),
                ..Default::default()
            },
            "QUESTION-MARKDOWN",
            QuestionTool {
                markdown_previews: true,
                ..plain
            },
        ),
        (
            pb::CreateSessionRequest {
                question_extended: true,
                ..Default::default()
            },
            "QUESTION-EXTENDED",
            QuestionTool {
                kinds: true,
                // Extended questions make descriptions optional too (2.1.332).
                description_required: false,
                ..plain
            },
        ),
        (
            pb::CreateSessionRequest {
                question_optional_descriptions: true,
                ..Default::default()
            },
            "QUESTION-OPTIONAL",
            QuestionTool {
                description_required: false,
                ..plain
            },
        ),
    ];
    for (req, prompt, want) in cases {
        let (session, _, _) =
            create_and_turn(&mut c, &world, req, &format!("{prompt} hello")).await;
        assert_eq!(question_tool_shape(&world, prompt), want, "{prompt}");
        c.stop_session(pb::StopSessionRequest {
            session_id: session.id.clone(),
        })
        .await
        .unwrap();
    }

    // All three, and again after a resume (the CLI's environment and what the model gets).
    let all = pb::CreateSessionRequest {
        question_preview_format: "html".into(),
        question_extended: true,
        question_optional_descriptions: true,
        // The same value as the option: allowed.
        env: [("CLAUDE_CODE_QUESTION_EXTENDED".to_string(), "1".to_string())].into(),
        ..Default::default()
    };
    let want = QuestionTool {
        html_previews: true,
        markdown_previews: false,
        kinds: true,
        description_required: false,
    };
    let (session, _, _) = create_and_turn(&mut c, &world, all, "QUESTION-ALL hello").await;
    assert_eq!(question_tool_shape(&world, "QUESTION-ALL"), want);
    let vars = |env: &BTreeMap<String, String>| {
        env.iter()
            .filter(|(k, _)| k.starts_with("CLAUDE_CODE_QUESTION_"))
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
    };
    let expected = [
        "CLAUDE_CODE_QUESTION_EXTENDED=1",
        "CLAUDE_CODE_QUESTION_OPTIONAL_DESCRIPTIONS=1",
        "CLAUDE_CODE_QUESTION_PREVIEW_FORMAT=html",
    ];
    let (_, env) = the_cli(&daemon, &mut c, &session).await;
    assert_eq!(vars(&env), expected);
    c.stop_session(pb::StopSessionRequest {
        session_id: session.id.clone(),
    })
    .await
    .unwrap();
    let resumed = c
        .resume_session(pb::ResumeSessionRequest {
            session_id: session.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (_, env) = the_cli(&daemon, &mut c, &resumed).await;
    assert_eq!(vars(&env), expected, "after resume");
    let mut events = subscribe(&mut c, &resumed.id, resumed.last_seq, false).await;
    send(&mut c, &resumed.id, "QUESTION-RESUMED hello").await;
    read_until(
        &mut events,
        &mut Vec::new(),
        "the turn's end",
        is_turn_completed,
    )
    .await;
    assert_eq!(question_tool_shape(&world, "QUESTION-RESUMED"), want);
}

/// 2.1.121 knows `CLAUDE_CODE_QUESTION_PREVIEW_FORMAT` only (measured): a session with
/// the preview format runs, one with extended questions or optional descriptions is
/// refused at once naming release and option.
#[tokio::test]
async fn question_options_a_release_does_not_honour_are_refused() {
    let world = World::new("2.1.121").await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    for (req, field) in [
        (
            pb::CreateSessionRequest {
                question_extended: true,
                ..Default::default()
            },
            "question_extended",
        ),
        (
            pb::CreateSessionRequest {
                question_optional_descriptions: true,
                ..Default::default()
            },
            "question_optional_descriptions",
        ),
    ] {
        let e = c
            .create_session(pb::CreateSessionRequest {
                cwd: world.work.display().to_string(),
                ..req
            })
            .await
            .expect_err(field);
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        for needle in ["2.1.121", field] {
            assert!(e.message().contains(needle), "{needle}: {}", e.message());
        }
    }
    assert!(children(daemon.pid()).is_empty());
    let req = pb::CreateSessionRequest {
        question_preview_format: "html".into(),
        ..Default::default()
    };
    let (session, _, _) = create_and_turn(&mut c, &world, req, "QUESTION-OLD hello").await;
    let (description, _) = question_tool(&world, "QUESTION-OLD");
    assert!(description.contains("HTML"), "{description}");
    let (_, env) = the_cli(&daemon, &mut c, &session).await;
    assert_eq!(
        env.get("CLAUDE_CODE_QUESTION_PREVIEW_FORMAT")
            .map(String::as_str),
        Some("html")
    );
}

/// The `custom-title` entries of the CLI's transcript of `cli_session_id` (under the
/// world's HOME, `.claude/projects/<dir>/<id>.jsonl`), oldest first.
fn custom_titles(world: &World, cli_session_id: &str) -> Vec<String> {
    let mut titles = Vec::new();
    let projects = world.home.join(".claude/projects");
    for dir in std::fs::read_dir(&projects).unwrap().flatten() {
        let file = dir.path().join(format!("{cli_session_id}.jsonl"));
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            if v["type"] == "custom-title" {
                titles.push(v["customTitle"].as_str().unwrap().to_owned());
            }
        }
    }
    titles
}

fn title_changed(e: &pb::SessionEvent) -> Option<String> {
    match &e.payload {
        Some(pb::session_event::Payload::Unknown(u))
            if u.message_type == "system/session_title_changed" =>
        {
            let v: serde_json::Value = serde_json::from_str(&u.raw_json).unwrap();
            Some(v["title"].as_str().unwrap().to_owned())
        }
        _ => None,
    }
}

/// A title the client gives names the CLI's session too (`title` in `initialize`): the
/// CLI writes `session_title_changed` with it and records it as its transcript's
/// `custom-title`. A session titled by its first prompt (no title given) sends none, and a
/// resume sends none (the CLI's own persisted title wins).
#[tokio::test]
async fn a_given_title_names_the_cli_session_at_create_only() {
    const TITLE: &str = "TITLE-CLI-9 release notes";
    let world = World::new(NEW).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let req = pb::CreateSessionRequest {
        title: TITLE.into(),
        ..Default::default()
    };
    let (titled, _, seen) = create_and_turn(&mut c, &world, req, "TITLED hello").await;
    let titled = session(&mut c, &titled.id).await;
    assert_eq!(titled.title, TITLE);
    assert_eq!(
        seen.iter().filter_map(title_changed).collect::<Vec<_>>(),
        [TITLE]
    );
    assert!(!titled.cli_session_id.is_empty());
    let titles = custom_titles(&world, &titled.cli_session_id);
    assert!(
        !titles.is_empty() && titles.iter().all(|t| t == TITLE),
        "{titles:?}"
    );

    // Titled by its first prompt: ostler's own fallback, not sent.
    let untitled = c
        .create_session(pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            first_prompt: text("UNTITLED-3 hello"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut events = subscribe(&mut c, &untitled.id, 0, false).await;
    let mut seen = Vec::new();
    read_until(&mut events, &mut seen, "the turn's end", is_turn_completed).await;
    let untitled = session(&mut c, &untitled.id).await;
    assert_eq!(untitled.title, "UNTITLED-3 hello", "ostler's own fallback");
    assert_eq!(seen.iter().filter_map(title_changed).count(), 0);
    assert_eq!(
        custom_titles(&world, &untitled.cli_session_id),
        Vec::<String>::new()
    );

    // A resume does not send the title; the CLI announces the title it has (2.1.332).
    c.stop_session(pb::StopSessionRequest {
        session_id: titled.id.clone(),
    })
    .await
    .unwrap();
    let resumed = c
        .resume_session(pb::ResumeSessionRequest {
            session_id: titled.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut events = subscribe(&mut c, &resumed.id, resumed.last_seq, false).await;
    send(&mut c, &resumed.id, "TITLED-AGAIN hello").await;
    let mut seen = Vec::new();
    read_until(&mut events, &mut seen, "the turn's end", is_turn_completed).await;
    for t in seen.iter().filter_map(title_changed) {
        assert_eq!(t, TITLE);
    }
    assert_eq!(session(&mut c, &titled.id).await.title, TITLE);
    c.stop_session(pb::StopSessionRequest {
        session_id: titled.id.clone(),
    })
    .await
    .unwrap();

    // Adopting the CLI conversation with another title: the CLI's own title wins, the
    // client's is not sent (ostler keeps whatever the CLI announces).
    let req = pb::CreateSessionRequest {
        title: "ADOPTED-TITLE-2".into(),
        adopt_claude_session_id: titled.cli_session_id.clone(),
        ..Default::default()
    };
    let (adopted, _, seen) = create_and_turn(&mut c, &world, req, "ADOPTED hello").await;
    assert!(
        seen.iter().filter_map(title_changed).all(|t| t == TITLE),
        "{:?}",
        seen.iter().filter_map(title_changed).collect::<Vec<_>>()
    );
    let titles = custom_titles(&world, &titled.cli_session_id);
    assert!(!titles.iter().any(|t| t.contains("ADOPTED")), "{titles:?}");
    c.stop_session(pb::StopSessionRequest {
        session_id: adopted.id.clone(),
    })
    .await
    .unwrap();

    // A fork is a new CLI session: it takes the title given for it.
    let req = pb::CreateSessionRequest {
        title: "FORKED-TITLE-5".into(),
        fork_from_session_id: titled.id.clone(),
        ..Default::default()
    };
    let (forked, _, seen) = create_and_turn(&mut c, &world, req, "FORKED hello").await;
    let forked = session(&mut c, &forked.id).await;
    assert_eq!(
        seen.iter().filter_map(title_changed).next_back().as_deref(),
        Some("FORKED-TITLE-5")
    );
    assert_ne!(forked.cli_session_id, titled.cli_session_id);
    assert_eq!(
        custom_titles(&world, &forked.cli_session_id)
            .last()
            .map(String::as_str),
        Some("FORKED-TITLE-5")
    );
    assert_eq!(forked.title, "FORKED-TITLE-5");
}

/// A release that does not honour `title` (2.0.77, measured) is not sent it, and the
/// create goes on: the title is ostler's own.
#[tokio::test]
async fn a_title_is_not_refused_by_a_release_without_it() {
    const TITLE: &str = "TITLE-OLD-4";
    let world = World::new("2.0.77").await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let req = pb::CreateSessionRequest {
        title: TITLE.into(),
        ..Default::default()
    };
    let (s, _, seen) = create_and_turn(&mut c, &world, req, "OLD-TITLE hello").await;
    let s = session(&mut c, &s.id).await;
    assert_eq!(s.title, TITLE);
    assert_eq!(seen.iter().filter_map(title_changed).count(), 0);
    assert_eq!(
        custom_titles(&world, &s.cli_session_id),
        Vec::<String>::new()
    );
}

/// The sub-agent's answer in [`FOREGROUND_SUBAGENT`].
const SUBAGENT_TEXT: &str = "SUBAGENT-TEXT-9: all done here.";

/// The model starts a sub-agent in the foreground (`run_in_background: false`), which
/// answers with one text block.
const FOREGROUND_SUBAGENT: &str = r#"
default_text = "ok"

[[model]]
name = "main after task"
when = { tool_result_for = "toolu_fg_task" }
blocks = [{ type = "text", text = "The sub-agent answered." }]

[[model]]
name = "sub answers"
when = { last_user_text_contains = "FG-SUBTASK" }
blocks = [{ type = "text", text = "SUBAGENT-TEXT-9: all done here." }]

[[model]]
name = "main delegates"
when = { last_user_text_contains = "Ask a sub-agent" }
blocks = [{ type = "tool_use", id = "toolu_fg_task", name = ["Agent", "Task"], input = { description = "Say done", prompt = "FG-SUBTASK: say you are done.", subagent_type = "general-purpose", run_in_background = false } }]
"#;

/// Whether `seen` has the sub-agent's text as an assistant block of the sub-agent (its
/// `parent_tool_use_id` the call that started it).
fn subagent_text_seen(seen: &[pb::SessionEvent]) -> bool {
    seen.iter().any(|e| {
        e.parent_tool_use_id.as_deref() == Some("toolu_fg_task")
            && matches!(&e.payload, Some(pb::session_event::Payload::AssistantBlock(b))
                if matches!(&b.block, Some(pb::assistant_block::Block::Text(t)) if t.text == SUBAGENT_TEXT))
    })
}

/// `forward_subagent_text` (`forwardSubagentText` in `initialize`) against the real CLI:
/// a foreground sub-agent's text reaches the client as an assistant block under the call
/// that started it; without the option only its tool calls and results would (its text
/// comes back only inside the call's result).
#[tokio::test]
async fn forward_subagent_text_delivers_a_subagents_text() {
    let world = World::with_scenario(NEW, FOREGROUND_SUBAGENT).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let req = pb::CreateSessionRequest {
        forward_subagent_text: true,
        ..Default::default()
    };
    let (_, _, seen) = create_and_turn(&mut c, &world, req, "Ask a sub-agent, please.").await;
    assert!(
        subagent_text_seen(&seen),
        "{:#?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );

    let plain = World::with_scenario(NEW, FOREGROUND_SUBAGENT).await;
    let daemon = plain.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let (_, _, seen) = create_and_turn(
        &mut c,
        &plain,
        Default::default(),
        "Ask a sub-agent, please.",
    )
    .await;
    assert!(plain.model_saw("FG-SUBTASK"), "the sub-agent never ran");
    assert!(
        !subagent_text_seen(&seen),
        "the sub-agent's text without the option"
    );
}

/// The model starts a sub-agent in the background, whose own model call is held for the
/// whole test: the task keeps running after the main turn ends.
const BACKGROUND_SUBAGENT: &str = r#"
default_text = "ok"

[[model]]
name = "main after task"
when = { tool_result_for = "toolu_bg_task" }
blocks = [{ type = "text", text = "Delegated." }]

[[model]]
name = "sub held"
when = { last_user_text_contains = "BG-SUBTASK" }
hold_until = "never"
blocks = [{ type = "text", text = "never sent" }]

[[model]]
name = "main delegates"
when = { last_user_text_contains = "Delegate the work" }
blocks = [{ type = "tool_use", id = "toolu_bg_task", name = ["Agent", "Task"], input = { description = "Bg work", prompt = "BG-SUBTASK: wait.", subagent_type = "general-purpose", run_in_background = true } }]
"#;

/// Whether `e` says that background task `task` ended: its `task_notification`
/// (typed), or its `task_updated` (a SystemNotice) to a status.
fn task_ended(e: &pb::SessionEvent, task: &str) -> bool {
    match &e.payload {
        Some(pb::session_event::Payload::TaskNotification(n)) => n.task_id == task,
        Some(pb::session_event::Payload::SystemNotice(n)) if n.subtype == "task_updated" => {
            serde_json::from_str::<serde_json::Value>(&n.fields_json)
                .is_ok_and(|v| v["task_id"] == task && v["patch"]["status"].is_string())
        }
        _ => false,
    }
}

/// A session with `per_task_stop_affordance` (or not) starts a background sub-agent, its
/// turn ends, and a client interrupts: returns whether the interrupt ended the task (its
/// `task_updated` to a final status or its `task_notification`, seen by the end of a next
/// turn), and otherwise checks that it was still running (StopTask ends it).
async fn interrupt_kills_the_background_task(per_task_stop_affordance: bool) -> bool {
    let world = World::with_scenario(NEW, BACKGROUND_SUBAGENT).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let req = pb::CreateSessionRequest {
        per_task_stop_affordance,
        ..Default::default()
    };
    let (s, mut events, seen) = create_and_turn(&mut c, &world, req, "Delegate the work.").await;
    let task = seen
        .iter()
        .find_map(|e| match &e.payload {
            Some(pb::session_event::Payload::TaskStarted(t)) => Some(t.task_id.clone()),
            _ => None,
        })
        .expect("no task_started: the sub-agent did not start in the background");
    c.interrupt(pb::InterruptRequest {
        session_id: s.id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    // The CLI ends the tasks an interrupt kills before it answers it, so by the end of a
    // next turn every such notice has been delivered.
    send(&mut c, &s.id, "Say hi.").await;
    let mut after = Vec::new();
    read_until(
        &mut events,
        &mut after,
        "the next turn's end",
        is_turn_completed,
    )
    .await;
    let ended = |e: &pb::SessionEvent| task_ended(e, &task);
    if after.iter().any(ended) {
        return true;
    }
    // Still running: stopping it ends it.
    c.stop_task(pb::StopTaskRequest {
        session_id: s.id.clone(),
        task_id: task.clone(),
    })
    .await
    .unwrap();
    read_until(&mut events, &mut after, "the stopped task's end", ended).await;
    false
}

/// `per_task_stop_affordance` (`perTaskStopAffordance` in `initialize`) against the real
/// CLI: an interrupt after the turn spares a running background sub-agent, which StopTask
/// then stops; without the option the interrupt kills it.
#[tokio::test]
async fn per_task_stop_affordance_spares_background_tasks_from_an_interrupt() {
    assert!(
        !interrupt_kills_the_background_task(true).await,
        "the interrupt killed the task although the session stops tasks one by one"
    );
    assert!(
        interrupt_kills_the_background_task(false).await,
        "without the option the interrupt spared the task"
    );
}

/// The model starts a sub-agent, which runs one Bash command and whose next model call is
/// held (`sub-done`); a summary fork (its prompt asks for the agent's "most recent action")
/// is answered with [`PROGRESS_SUMMARY`].
const SUMMARIZED_SUBAGENT: &str = r#"
default_text = "ok"

[[model]]
name = "summary"
when = { last_user_text_contains = "most recent action" }
blocks = [{ type = "text", text = "Analyzing the fake module" }]

[[model]]
name = "main after task"
when = { tool_result_for = "toolu_sum_task" }
blocks = [{ type = "text", text = "Delegated." }]

[[model]]
name = "sub held"
when = { tool_result_for = "toolu_sub_echo" }
hold_until = "sub-done"
blocks = [{ type = "text", text = "Sub-agent done." }]

[[model]]
name = "sub runs a command"
when = { last_user_text_contains = "SUM-SUBTASK" }
blocks = [{ type = "tool_use", id = "toolu_sub_echo", name = "Bash", input = { command = "echo progress", description = "Echo progress" } }]

[[model]]
name = "main delegates"
when = { last_user_text_contains = "Delegate and report" }
blocks = [{ type = "tool_use", id = "toolu_sum_task", name = ["Agent", "Task"], input = { description = "Summed work", prompt = "SUM-SUBTASK: run a command.", subagent_type = "general-purpose" } }]
"#;

/// The summary the fake model writes for [`SUMMARIZED_SUBAGENT`].
const PROGRESS_SUMMARY: &str = "Analyzing the fake module";

/// The summary of a TaskProgress event, if `e` is one with a summary.
fn progress_summary(e: &pb::SessionEvent) -> Option<&str> {
    match &e.payload {
        Some(pb::session_event::Payload::TaskProgress(p)) if !p.summary.is_empty() => {
            Some(p.summary.as_str())
        }
        _ => None,
    }
}

/// `agent_progress_summaries` (`agentProgressSummaries` in `initialize`) against the real
/// CLI: a running sub-agent's progress summary, the fake model's answer to the CLI's
/// summary fork (about 30 s after the sub-agent's first model call), reaches the client as
/// TaskProgress.summary. A session without the option, started first so that its
/// sub-agent has run longer when the other's summary arrives, has no summary request at
/// the fake model by then, and none at all by its end.
#[tokio::test]
async fn agent_progress_summaries_reach_the_client() {
    let plain = World::with_scenario(NEW, SUMMARIZED_SUBAGENT).await;
    let plain_daemon = plain.daemon(&[]).await;
    let mut pc = plain_daemon.sessions().await;
    let (ps, mut plain_events, mut plain_seen) =
        create_and_turn(&mut pc, &plain, Default::default(), "Delegate and report.").await;
    await_model_request(&plain.fake, "sub held").await;

    let world = World::with_scenario(NEW, SUMMARIZED_SUBAGENT).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let req = pb::CreateSessionRequest {
        agent_progress_summaries: true,
        ..Default::default()
    };
    let (_, mut events, mut seen) =
        create_and_turn(&mut c, &world, req, "Delegate and report.").await;
    let got = read_until(&mut events, &mut seen, "a progress summary", |e| {
        progress_summary(e).is_some()
    })
    .await;
    assert_eq!(progress_summary(&got), Some(PROGRESS_SUMMARY));
    let asked = |w: &World| {
        w.fake
            .requests()
            .iter()
            .any(|r| r.rule_name.as_deref() == Some("summary"))
    };
    assert!(asked(&world));
    assert!(
        !asked(&plain),
        "a summary was asked for in the session without the option"
    );

    // Both sub-agents finish; the one without the option never had a summary.
    world.fake.signal("sub-done");
    plain.fake.signal("sub-done");
    let task_done = |e: &pb::SessionEvent| {
        matches!(
            &e.payload,
            Some(pb::session_event::Payload::TaskNotification(_))
        )
    };
    read_until(
        &mut plain_events,
        &mut plain_seen,
        "the sub-agent's end",
        task_done,
    )
    .await;
    assert!(
        !plain_seen.iter().any(|e| progress_summary(e).is_some()) && !asked(&plain),
        "a summary without the option: {:#?}",
        plain_seen.iter().map(describe).collect::<Vec<_>>()
    );
    drop(ps);
}

/// The `tool_result` the model got for `id`, if any.
fn tool_result(world: &World, id: &str) -> Option<serde_json::Value> {
    world.fake.requests().iter().find_map(|r| {
        r.body.as_ref()?["messages"]
            .as_array()?
            .iter()
            .filter_map(|m| m["content"].as_array())
            .flatten()
            .find(|b| b["type"] == "tool_result" && b["tool_use_id"] == id)
            .cloned()
    })
}

/// `sessions.managed_settings` (here from `OSTLER_SESSIONS__MANAGED_SETTINGS`) against the
/// real CLI: its deny rule holds in a session that allows the tool in its own `settings`
/// and runs in ACCEPT_EDITS (the model's Read of a file in the working directory, which
/// the CLI runs without asking, comes back an error; the file's text never reaches the
/// model); a session's own `managed_settings` is merged in (the CLI's argument has both
/// deny rules). Without the policy the same session reads the file. (BYPASS_PERMISSIONS
/// cannot be tried here: the CLI refuses it to root, and CI runs as root.)
async fn managed_settings_hold_whatever_the_session_asks(release: &str) {
    const NOTES: &str = "POLICY-NOTES-7";
    let permissive = || pb::CreateSessionRequest {
        permission_mode: pb::PermissionMode::AcceptEdits as i32,
        settings: r#"{"permissions": {"allow": ["Read"]}}"#.into(),
        ..Default::default()
    };
    let world = World::with_scenario(release, &notes_call("Read the notes", "Read")).await;
    std::fs::write(world.work.join("notes.txt"), format!("{NOTES}\n")).unwrap();
    let daemon = world
        .daemon_with_env(
            &[],
            &[(
                "OSTLER_SESSIONS__MANAGED_SETTINGS",
                r#"{"permissions": {"deny": ["Read"]}}"#,
            )],
        )
        .await;
    let mut c = daemon.sessions().await;
    let (session, _, seen) = create_and_turn(&mut c, &world, permissive(), "Read the notes.").await;
    let result = tool_result(&world, NOTES_CALL).unwrap_or_else(|| {
        panic!(
            "the model never got the Read's result: {:#?}",
            seen.iter().map(describe).collect::<Vec<_>>()
        )
    });
    assert_eq!(result["is_error"], true, "{result}");
    assert!(!world.model_saw(NOTES), "the denied Read ran: {result}");
    assert!(
        !seen.iter().any(|e| matches!(
            e.payload,
            Some(pb::session_event::Payload::PermissionRequested(_))
        )),
        "denied by the CLI, nobody asked"
    );
    c.stop_session(pb::StopSessionRequest {
        session_id: session.id.clone(),
    })
    .await
    .unwrap();

    // The session's own policy joins the daemon's.
    let own = c
        .create_session(pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            managed_settings: r#"{"permissions": {"deny": ["WebFetch"]}}"#.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let (argv, _) = the_cli(&daemon, &mut c, &own).await;
    let policy: serde_json::Value = serde_json::from_str(
        value_of(&argv, "--managed-settings").expect("--managed-settings on the command line"),
    )
    .unwrap();
    assert_eq!(
        policy,
        serde_json::json!({"permissions": {"deny": ["Read", "WebFetch"]}})
    );

    // The control: no policy, the same session reads the file.
    let plain = World::with_scenario(release, &notes_call("Read the notes", "Read")).await;
    std::fs::write(plain.work.join("notes.txt"), format!("{NOTES}\n")).unwrap();
    let daemon = plain.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    create_and_turn(&mut c, &plain, permissive(), "Read the notes.").await;
    assert!(
        plain.model_saw(NOTES),
        "the Read did not run without a policy"
    );
}

#[tokio::test]
async fn managed_settings_hold_whatever_the_session_asks_2_1_332() {
    managed_settings_hold_whatever_the_session_asks(NEW).await;
}

/// The oldest pinned release measured to enforce `--managed-settings` (docs/compatibility.md,
/// "Policies").
#[tokio::test]
async fn managed_settings_hold_whatever_the_session_asks_2_1_330() {
    managed_settings_hold_whatever_the_session_asks("2.1.330").await;
}

/// A daemon whose policy the release would not enforce does not start (exit 78, the key
/// and the release named): sessions without the policy would be worse than none. Both
/// ways a release falls short: 1.0.128 has no such flag, 2.1.121 accepts it and reads the
/// file anyway (measured). A session's own `managed_settings` on 2.1.121 is refused at
/// once, nothing created.
#[tokio::test]
async fn a_policy_the_release_would_not_enforce_is_refused() {
    for release in [OLD, "2.1.121"] {
        let world = World::new(release).await;
        std::fs::write(
            &world.config,
            "[sessions.managed_settings]\npermissions = { deny = [\"Bash\"] }\n",
        )
        .unwrap();
        let starting = world.start_daemon(&[], &[]);
        let (code, log) = tokio::task::spawn_blocking(move || starting.exit_blocking())
            .await
            .unwrap();
        assert_eq!(code, Some(78), "{release}: {log}");
        assert!(
            log.contains("sessions.managed_settings") && log.contains(release),
            "{log}"
        );
    }
    let world = World::new("2.1.121").await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let e = c
        .create_session(pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            managed_settings: r#"{"permissions": {"deny": ["Read"]}}"#.into(),
            ..Default::default()
        })
        .await
        .expect_err("a policy 2.1.121 ignores");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("2.1.121")
            && e.message().contains("managed_settings")
            && e.message().contains("Policies"),
        "{}",
        e.message()
    );
    let list = c
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(list.sessions.is_empty(), "{:?}", list.sessions);
}

/// The model answers a `--json-schema` session through the CLI's `StructuredOutput` tool.
const STRUCTURED: &str = r#"
default_text = "OK."

[[model]]
name = "structured"
when = { last_user_text_contains = "What is 2+2" }
times = 1
blocks = [{ type = "tool_use", id = "toolu_structured_1", name = "StructuredOutput", input = { answer = "4", confidence = 0.9 } }]

[[model]]
name = "after the structured answer"
when = { tool_result_for = "toolu_structured_1" }
blocks = [{ type = "text", text = "Answered." }]
"#;

/// `json_schema`: the schema reaches the model (as the CLI's `StructuredOutput` tool) and
/// the answer in its shape reaches the client in `TurnCompleted.structured_output_json`,
/// live and replayed; a session without a schema has none.
#[tokio::test]
async fn structured_output_reaches_the_client() {
    let world = World::with_scenario(NEW, STRUCTURED).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let schema = r#"{"type":"object","properties":{"answer":{"type":"string"},"confidence":{"type":"number"}},"required":["answer"]}"#;
    let s = c
        .create_session(pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            json_schema: schema.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    send(&mut c, &s.id, "What is 2+2?").await;
    let mut seen = Vec::new();
    let end = read_until(&mut events, &mut seen, "the turn's end", is_turn_completed).await;
    let Some(pb::session_event::Payload::TurnCompleted(t)) = &end.payload else {
        unreachable!()
    };
    let out: serde_json::Value =
        serde_json::from_str(&t.structured_output_json).unwrap_or_else(|e| {
            panic!(
                "{e}: {t:?}\n{:#?}",
                seen.iter().map(describe).collect::<Vec<_>>()
            )
        });
    assert_eq!(out, serde_json::json!({"answer": "4", "confidence": 0.9}));
    let offered = world
        .fake
        .requests()
        .iter()
        .filter_map(|r| r.body.as_ref())
        .any(|b| {
            b["tools"].as_array().is_some_and(|tools| {
                tools.iter().any(|t| {
                    t["name"] == "StructuredOutput" && t.to_string().contains("confidence")
                })
            })
        });
    assert!(
        offered,
        "the schema reached the model as the StructuredOutput tool"
    );
    let stored = history(&mut c, &s.id).await;
    assert!(stored.iter().any(|e| e == &end), "replayed as delivered");

    let plain = create_session(&mut c, &world.work, "plain").await;
    let mut events = subscribe(&mut c, &plain.id, 0, false).await;
    send(&mut c, &plain.id, "Say hello").await;
    let end = read_until(
        &mut events,
        &mut Vec::new(),
        "the turn's end",
        is_turn_completed,
    )
    .await;
    let Some(pb::session_event::Payload::TurnCompleted(t)) = &end.payload else {
        unreachable!()
    };
    assert_eq!(
        t.structured_output_json, "",
        "no schema, no structured output"
    );
}

#[tokio::test]
async fn an_option_the_old_release_lacks_fails_at_once() {
    let world = World::new(OLD).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    for (req, field, flag) in [
        (
            pb::CreateSessionRequest {
                max_budget_usd: Some(1.0),
                ..Default::default()
            },
            "max_budget_usd",
            "--max-budget-usd",
        ),
        (
            pb::CreateSessionRequest {
                max_thinking_tokens: Some(1000),
                ..Default::default()
            },
            "max_thinking_tokens",
            "--max-thinking-tokens",
        ),
        (
            pb::CreateSessionRequest {
                json_schema: r#"{"type": "object"}"#.into(),
                ..Default::default()
            },
            "json_schema",
            "--json-schema",
        ),
        (
            pb::CreateSessionRequest {
                effort: "high".into(),
                ..Default::default()
            },
            "effort",
            "--effort",
        ),
        (
            pb::CreateSessionRequest {
                tools: Some(String::new()),
                ..Default::default()
            },
            "tools",
            "--tools",
        ),
        (
            pb::CreateSessionRequest {
                plugin_dirs: vec![world.work.display().to_string()],
                ..Default::default()
            },
            "plugin_dirs",
            "--plugin-dir",
        ),
        (
            pb::CreateSessionRequest {
                include_hook_events: true,
                ..Default::default()
            },
            "include_hook_events",
            "--include-hook-events",
        ),
        (
            pb::CreateSessionRequest {
                debug: true,
                ..Default::default()
            },
            "debug",
            "--debug-file",
        ),
        (
            pb::CreateSessionRequest {
                betas: vec!["context-1m-2025-08-07".into()],
                ..Default::default()
            },
            "betas",
            "--betas",
        ),
        (
            pb::CreateSessionRequest {
                permission_prompts: "none".into(),
                ..Default::default()
            },
            "permission_prompts",
            "--permission-prompts",
        ),
        (
            pb::CreateSessionRequest {
                thinking: "disabled".into(),
                ..Default::default()
            },
            "thinking",
            "--thinking",
        ),
        (
            pb::CreateSessionRequest {
                task_budget_tokens: Some(1000),
                ..Default::default()
            },
            "task_budget_tokens",
            "--task-budget",
        ),
        (
            pb::CreateSessionRequest {
                managed_settings: r#"{"permissions": {"deny": ["Bash"]}}"#.into(),
                ..Default::default()
            },
            "managed_settings",
            "--managed-settings",
        ),
        (
            pb::CreateSessionRequest {
                skills: vec!["pdf".into()],
                ..Default::default()
            },
            "skills",
            "Initialize fields",
        ),
        (
            pb::CreateSessionRequest {
                all_skills: true,
                ..Default::default()
            },
            "all_skills",
            "Initialize fields",
        ),
        (
            pb::CreateSessionRequest {
                plan_mode_instructions: "Plan in haiku.".into(),
                ..Default::default()
            },
            "plan_mode_instructions",
            "Initialize fields",
        ),
        (
            pb::CreateSessionRequest {
                tool_aliases: [("Shell".to_string(), "Bash".to_string())].into(),
                ..Default::default()
            },
            "tool_aliases",
            "Initialize fields",
        ),
        (
            pb::CreateSessionRequest {
                allow_dangerously_skip_permissions: true,
                ..Default::default()
            },
            "allow_dangerously_skip_permissions",
            "--allow-dangerously-skip-permissions",
        ),
        (
            pb::CreateSessionRequest {
                project_config_root: world.work.display().to_string(),
                ..Default::default()
            },
            "project_config_root",
            "--project-config-root",
        ),
        (
            pb::CreateSessionRequest {
                exclude_dynamic_sections: true,
                ..Default::default()
            },
            "exclude_dynamic_sections",
            "Initialize fields",
        ),
        (
            pb::CreateSessionRequest {
                forward_subagent_text: true,
                ..Default::default()
            },
            "forward_subagent_text",
            "Initialize fields",
        ),
        (
            pb::CreateSessionRequest {
                per_task_stop_affordance: true,
                ..Default::default()
            },
            "per_task_stop_affordance",
            "Initialize fields",
        ),
        (
            pb::CreateSessionRequest {
                agent_progress_summaries: true,
                ..Default::default()
            },
            "agent_progress_summaries",
            "Initialize fields",
        ),
        (
            pb::CreateSessionRequest {
                dialog_kinds: vec!["refusal_fallback_prompt".into()],
                ..Default::default()
            },
            "dialog_kinds",
            "Initialize fields",
        ),
        (
            pb::CreateSessionRequest {
                question_preview_format: "html".into(),
                ..Default::default()
            },
            "question_preview_format",
            "Initialize fields",
        ),
        (
            pb::CreateSessionRequest {
                question_extended: true,
                ..Default::default()
            },
            "question_extended",
            "Initialize fields",
        ),
        (
            pb::CreateSessionRequest {
                question_optional_descriptions: true,
                ..Default::default()
            },
            "question_optional_descriptions",
            "Initialize fields",
        ),
        (
            pb::CreateSessionRequest {
                verbatim_prompts: true,
                ..Default::default()
            },
            "verbatim_prompts",
            "User-message fields",
        ),
        (
            pb::CreateSessionRequest {
                enable_file_checkpointing: true,
                ..Default::default()
            },
            "enable_file_checkpointing",
            "rewind_files",
        ),
    ] {
        let started = std::time::Instant::now();
        let e = c
            .create_session(pb::CreateSessionRequest {
                cwd: world.work.display().to_string(),
                ..req
            })
            .await
            .expect_err(field);
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(
            e.message().contains(OLD) && e.message().contains(field) && e.message().contains(flag),
            "{}",
            e.message()
        );
        assert!(
            started.elapsed() < ostler_testkit::timeouts::secs(5),
            "refused at once, not after a spawn"
        );
    }
    // Nothing was created, nothing spawned.
    let list = c
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(list.sessions.is_empty(), "{:?}", list.sessions);
    assert!(children(daemon.pid()).is_empty());
}

#[tokio::test]
async fn bad_options_are_invalid_argument_naming_the_field() {
    let world = World::new(NEW).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let cwd = world.work.display().to_string();
    let huge = "x".repeat(3 << 20);
    let outside = world.dir.path().display().to_string();
    let a_file = world.work.join("a-file.txt");
    std::fs::write(&a_file, "not a directory").unwrap();
    let a_file = a_file.display().to_string();
    let cases: Vec<(pb::CreateSessionRequest, &str)> = vec![
        (
            pb::CreateSessionRequest {
                system_prompt: "a\0b".into(),
                ..Default::default()
            },
            "system_prompt",
        ),
        (
            pb::CreateSessionRequest {
                model: "claude-sonnet-4-5".into(),
                fallback_model: "claude-sonnet-4-5".into(),
                ..Default::default()
            },
            "fallback_model",
        ),
        (
            pb::CreateSessionRequest {
                effort: "extreme".into(),
                ..Default::default()
            },
            "effort",
        ),
        (
            pb::CreateSessionRequest {
                betas: vec!["Context 1M".into()],
                ..Default::default()
            },
            "betas[0]",
        ),
        (
            pb::CreateSessionRequest {
                betas: vec![
                    "context-1m-2025-08-07".into(),
                    "context-1m-2025-08-07".into(),
                ],
                ..Default::default()
            },
            "betas[1]",
        ),
        (
            pb::CreateSessionRequest {
                task_budget_tokens: Some(0),
                ..Default::default()
            },
            "task_budget_tokens",
        ),
        (
            pb::CreateSessionRequest {
                managed_settings: "/etc/claude/policy.json".into(),
                ..Default::default()
            },
            "managed_settings",
        ),
        (
            pb::CreateSessionRequest {
                skills: vec!["pdf tools".into()],
                ..Default::default()
            },
            "skills[0]",
        ),
        (
            pb::CreateSessionRequest {
                skills: vec!["pdf".into()],
                all_skills: true,
                ..Default::default()
            },
            "all_skills",
        ),
        (
            pb::CreateSessionRequest {
                tool_aliases: [("Bash".to_string(), "mcp box bash".to_string())].into(),
                ..Default::default()
            },
            "tool_aliases[\"Bash\"]",
        ),
        (
            pb::CreateSessionRequest {
                tool_aliases: [("Bash".to_string(), "Bash".to_string())].into(),
                ..Default::default()
            },
            "tool_aliases[\"Bash\"]",
        ),
        (
            pb::CreateSessionRequest {
                permission_prompts: "nobody".into(),
                ..Default::default()
            },
            "permission_prompts",
        ),
        (
            pb::CreateSessionRequest {
                thinking_display: "highlights".into(),
                ..Default::default()
            },
            "thinking_display",
        ),
        (
            pb::CreateSessionRequest {
                question_preview_format: "svg".into(),
                ..Default::default()
            },
            "question_preview_format",
        ),
        (
            pb::CreateSessionRequest {
                question_preview_format: "HTML".into(),
                ..Default::default()
            },
            "question_preview_format",
        ),
        (
            pb::CreateSessionRequest {
                question_preview_format: "html".into(),
                env: [(
                    "CLAUDE_CODE_QUESTION_PREVIEW_FORMAT".to_string(),
                    "markdown".to_string(),
                )]
                .into(),
                ..Default::default()
            },
            "env[CLAUDE_CODE_QUESTION_PREVIEW_FORMAT]",
        ),
        (
            pb::CreateSessionRequest {
                question_extended: true,
                env: [("CLAUDE_CODE_QUESTION_EXTENDED".to_string(), "0".to_string())].into(),
                ..Default::default()
            },
            "question_extended",
        ),
        (
            pb::CreateSessionRequest {
                plugin_dirs: vec!["plugins/mine".into()],
                ..Default::default()
            },
            "plugin_dirs[0]",
        ),
        (
            pb::CreateSessionRequest {
                plugin_dirs: vec![outside.clone()],
                ..Default::default()
            },
            "plugin_dirs[0]",
        ),
        (
            pb::CreateSessionRequest {
                tools: Some("--dangerously-skip-permissions".into()),
                ..Default::default()
            },
            "tools",
        ),
        (
            pb::CreateSessionRequest {
                agent: "-x".into(),
                ..Default::default()
            },
            "agent",
        ),
        (
            pb::CreateSessionRequest {
                system_prompt: huge.clone(),
                ..Default::default()
            },
            "system_prompt",
        ),
        (
            pb::CreateSessionRequest {
                add_dirs: vec![cwd.clone(); 65],
                ..Default::default()
            },
            "add_dirs",
        ),
        (
            pb::CreateSessionRequest {
                add_dirs: vec![outside.clone()],
                ..Default::default()
            },
            "add_dirs[0]",
        ),
        (
            pb::CreateSessionRequest {
                project_config_root: "relative/checkout".into(),
                ..Default::default()
            },
            "project_config_root",
        ),
        (
            pb::CreateSessionRequest {
                project_config_root: outside,
                ..Default::default()
            },
            "project_config_root",
        ),
        (
            pb::CreateSessionRequest {
                project_config_root: format!("{cwd}/no-such-checkout"),
                ..Default::default()
            },
            "project_config_root",
        ),
        (
            pb::CreateSessionRequest {
                project_config_root: a_file.clone(),
                ..Default::default()
            },
            "project_config_root",
        ),
        (
            pb::CreateSessionRequest {
                project_config_root: format!("{cwd}\0"),
                ..Default::default()
            },
            "project_config_root",
        ),
        (
            pb::CreateSessionRequest {
                settings: format!("{{{huge}"),
                ..Default::default()
            },
            "settings",
        ),
        (
            pb::CreateSessionRequest {
                settings: "/no/such/settings.json".into(),
                ..Default::default()
            },
            "settings",
        ),
        (
            pb::CreateSessionRequest {
                env: [("OSTLER_AUTH__TOKENS".to_string(), "x".to_string())].into(),
                ..Default::default()
            },
            "env",
        ),
        (
            pb::CreateSessionRequest {
                env: [(huge.clone(), "x".to_string())].into(),
                ..Default::default()
            },
            "env",
        ),
        (
            pb::CreateSessionRequest {
                max_budget_usd: Some(-1.0),
                ..Default::default()
            },
            "max_budget_usd",
        ),
        (
            pb::CreateSessionRequest {
                setting_sources: vec!["everywhere".into()],
                ..Default::default()
            },
            "setting_sources[0]",
        ),
        (
            pb::CreateSessionRequest {
                agents_json: "not json".into(),
                ..Default::default()
            },
            "agents",
        ),
        (
            pb::CreateSessionRequest {
                mcp_servers: [(
                    "x".to_string(),
                    pb::McpServerSpec {
                        transport: Some(pb::mcp_server_spec::Transport::Sse(
                            pb::McpRemoteServerSpec {
                                url: format!("file:///{huge}"),
                                headers: Default::default(),
                            },
                        )),
                        ..Default::default()
                    },
                )]
                .into(),
                ..Default::default()
            },
            "mcp_servers[\"x\"].url",
        ),
        (
            pb::CreateSessionRequest {
                session_id: "../etc".into(),
                ..Default::default()
            },
            "session_id",
        ),
    ];
    for (req, field) in cases {
        let e = c
            .create_session(pb::CreateSessionRequest {
                cwd: cwd.clone(),
                ..req
            })
            .await
            .expect_err(field);
        assert_eq!(e.code(), Code::InvalidArgument, "{field}: {e:?}");
        assert!(e.message().contains(field), "{field}: {}", e.message());
        assert!(e.message().len() < 1024, "{field}: a long message");
    }
    let list = c
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(list.sessions.is_empty(), "{:?}", list.sessions);
    assert!(children(daemon.pid()).is_empty(), "nothing spawned");
}

#[tokio::test]
async fn a_client_chosen_id_makes_create_idempotent() {
    let world = World::new(NEW).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let req = pb::CreateSessionRequest {
        cwd: world.work.display().to_string(),
        session_id: "build-42.retry_ok".into(),
        system_prompt: SYSTEM.into(),
        first_prompt: text("Say hello"),
        ..Default::default()
    };
    let a = c.create_session(req.clone()).await.unwrap().into_inner();
    assert_eq!(a.id, "build-42.retry_ok");
    let b = c.create_session(req.clone()).await.unwrap().into_inner();
    assert_eq!(b.id, a.id);
    assert_eq!(
        b.created_at_ms, a.created_at_ms,
        "the same session, not a new one"
    );
    assert_eq!(children(daemon.pid()).len(), 1, "one CLI process");
    let e = c
        .create_session(pb::CreateSessionRequest {
            system_prompt: "something else".into(),
            ..req.clone()
        })
        .await
        .expect_err("other options");
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    assert!(e.message().contains("build-42.retry_ok"), "{}", e.message());
    assert!(
        e.message().contains("a different system_prompt)"),
        "what differs is named: {}",
        e.message()
    );
    let e = c
        .create_session(pb::CreateSessionRequest {
            model: "claude-other".into(),
            allowed_tools: vec!["Read".into()],
            ..req.clone()
        })
        .await
        .expect_err("other options");
    assert!(
        e.message().contains("a different allowed_tools, model)"),
        "{}",
        e.message()
    );
    // Labels are set once, at creation: other labels are another request.
    let e = c
        .create_session(pb::CreateSessionRequest {
            labels: [("team".to_owned(), "blue".to_owned())].into(),
            ..req.clone()
        })
        .await
        .expect_err("other labels");
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    assert!(e.message().contains("different labels"), "{}", e.message());
    // Another first prompt is another request too (it would not be sent).
    let e = c
        .create_session(pb::CreateSessionRequest {
            first_prompt: text("Say goodbye"),
            ..req.clone()
        })
        .await
        .expect_err("another first prompt");
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    assert!(
        e.message().contains("a different first_prompt)"),
        "{}",
        e.message()
    );
    // The create's first prompt carries ostler's own id, which clients cannot use.
    let e = c
        .send_message(pb::SendMessageRequest {
            session_id: a.id.clone(),
            content: text("mine"),
            client_message_id: "ostler:first_prompt".into(),
            ..Default::default()
        })
        .await
        .expect_err("a reserved id");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("\"ostler:\""), "{}", e.message());
    // The retry did not send the first prompt again.
    let mut events = subscribe(&mut c, &a.id, 0, false).await;
    let mut seen = Vec::new();
    read_until(
        &mut events,
        &mut seen,
        "the first turn's end",
        is_turn_completed,
    )
    .await;
    let sent = history(&mut c, &a.id)
        .await
        .iter()
        .filter(|e| matches!(&e.payload, Some(pb::session_event::Payload::UserMessage(u)) if u.text == "Say hello" && !u.sent_by.is_empty() && u.client_message_id == "ostler:first_prompt"))
        .count();
    assert_eq!(sent, 1);

    // A session that exists without its first prompt (the first try failed before sending
    // it; here: created without one): the retry sends it, once.
    let bare = pb::CreateSessionRequest {
        session_id: "build-43.no_prompt_yet".into(),
        first_prompt: None,
        ..req.clone()
    };
    let d = c.create_session(bare.clone()).await.unwrap().into_inner();
    let with = pb::CreateSessionRequest {
        first_prompt: text("Say hello"),
        ..bare
    };
    for _ in 0..2 {
        let r = c.create_session(with.clone()).await.unwrap().into_inner();
        assert_eq!(r.created_at_ms, d.created_at_ms, "the same session");
    }
    let mut events = subscribe(&mut c, &d.id, 0, false).await;
    let mut seen = Vec::new();
    read_until(
        &mut events,
        &mut seen,
        "the prompt's turn",
        is_turn_completed,
    )
    .await;
    let sent = history(&mut c, &d.id)
        .await
        .iter()
        .filter(|e| matches!(&e.payload, Some(pb::session_event::Payload::UserMessage(u)) if u.text == "Say hello" && !u.sent_by.is_empty()))
        .count();
    assert_eq!(sent, 1, "sent by the first retry only");
}

#[tokio::test]
async fn fork_into_a_new_session_and_adopt_a_cli_conversation() {
    let world = World::new(NEW).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let cwd = world.work.display().to_string();
    let a = create_session(&mut c, &world.work, "forker").await;
    turn(&mut c, &a.id, "Remember the word PINEAPPLE").await;

    // Fork: a new session whose first event names the fork point, with A's context.
    let a_before = session(&mut c, &a.id).await;
    let b = c
        .create_session(pb::CreateSessionRequest {
            cwd: cwd.clone(),
            fork_from_session_id: a.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_ne!(b.id, a.id);
    // The fork point is A's log end at the fork (A may still record a late event, e.g. its
    // `initialize` answer on a loaded machine, so it lies between the two reads).
    let a_now = session(&mut c, &a.id).await;
    let a_log = history(&mut c, &a.id).await;
    assert_eq!(a_log.last().map(|e| e.seq), Some(a_now.last_seq));
    let first = history(&mut c, &b.id).await;
    let Some(pb::session_event::Payload::EngineNotice(n)) = &first[0].payload else {
        panic!("first event: {:?}", first[0]);
    };
    let data: serde_json::Value = serde_json::from_str(&n.data_json).unwrap();
    assert_eq!(data["fork_point"]["session_id"], a.id.as_str(), "{data}");
    let fork_seq = data["fork_point"]["seq"].as_u64().unwrap();
    assert!(
        (a_before.last_seq..=a_now.last_seq).contains(&fork_seq),
        "{data} not within {}..={}",
        a_before.last_seq,
        a_now.last_seq
    );
    assert_eq!(
        data["fork_point"]["claude_session_id"],
        a_now.cli_session_id.as_str()
    );
    let answer = turn(&mut c, &b.id, "What was the word?").await;
    assert!(
        answer.contains("PINEAPPLE"),
        "the fork kept A's context: {answer:?}"
    );
    let b_now = c
        .get_session(pb::GetSessionRequest {
            session_id: b.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_ne!(
        b_now.cli_session_id, a_now.cli_session_id,
        "a new CLI conversation"
    );
    // The original is untouched.
    assert_eq!(history(&mut c, &a.id).await, a_log);

    // Adopt: continue A's CLI conversation in a session of its own.
    c.stop_session(pb::StopSessionRequest {
        session_id: a.id.clone(),
    })
    .await
    .unwrap();
    let d = c
        .create_session(pb::CreateSessionRequest {
            cwd: cwd.clone(),
            adopt_claude_session_id: a_now.cli_session_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(d.cli_session_id, a_now.cli_session_id);
    let answer = turn(&mut c, &d.id, "What was the word?").await;
    assert!(answer.contains("PINEAPPLE"), "adopted context: {answer:?}");

    // A conversation that does not exist under the daemon's HOME: refused before anything.
    let e = c
        .create_session(pb::CreateSessionRequest {
            cwd,
            adopt_claude_session_id: "0b9d4a6e-1c2f-4a57-9a43-6f5e0d1c2b3a".into(),
            ..Default::default()
        })
        .await
        .expect_err("no such conversation");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("No conversation found"),
        "{}",
        e.message()
    );
}

/// A resume checks again what the create checked, before anything is recorded: the
/// session's directory must still be itself (not swapped for a link to elsewhere) and under
/// the daemon's allowed roots, and the running release must accept the session's options.
/// Refused, the session stays resumable, and a daemon that can run it resumes it on demand.
#[tokio::test]
async fn a_resume_checks_the_directory_the_roots_and_the_release_again() {
    let mut world = World::new(NEW).await;
    let other = world.dir.path().join("other-root");
    let swapped = world.work.join("swapped");
    let outside = world.dir.path().join("outside");
    for d in [&other, &swapped, &outside] {
        std::fs::create_dir_all(d).unwrap();
    }
    let other_arg = other.display().to_string();
    let mut daemon = world.daemon(&["--allowed-root", &other_arg]).await;
    let mut c = daemon.sessions().await;
    let mk = |cwd: &std::path::Path, id: &str, effort: &str| pb::CreateSessionRequest {
        cwd: cwd.display().to_string(),
        session_id: id.into(),
        effort: effort.into(),
        ..Default::default()
    };
    for req in [
        mk(&other, "in-other-root", ""),
        mk(&swapped, "swapped-dir", ""),
        mk(&world.work, "with-effort", "high"),
        mk(&world.work, "plain", ""),
    ] {
        let s = c.create_session(req).await.unwrap().into_inner();
        settled(&mut c, &s).await;
    }
    daemon.terminate().await;

    std::fs::remove_dir(&swapped).unwrap();
    std::os::unix::fs::symlink(&outside, &swapped).unwrap();
    let new_claude = std::mem::replace(&mut world.claude, claude_binary(OLD));
    let mut daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    for (id, needle) in [
        ("in-other-root", "outside the daemon's allowed roots"),
        ("swapped-dir", "now leads to"),
        ("with-effort", "does not accept `--effort`"),
    ] {
        let before = session(&mut c, id).await;
        assert_eq!(before.state(), pb::SessionState::Resumable, "{id}");
        let sent = c
            .send_message(pb::SendMessageRequest {
                session_id: id.into(),
                content: text("hello again"),
                ..Default::default()
            })
            .await;
        assert_refused(sent, Code::FailedPrecondition, needle);
        let resumed = c
            .resume_session(pb::ResumeSessionRequest {
                session_id: id.into(),
                ..Default::default()
            })
            .await;
        assert_refused(resumed, Code::FailedPrecondition, needle);
        let after = session(&mut c, id).await;
        assert_eq!(after.state(), pb::SessionState::Resumable, "{id}");
        assert_eq!(after.last_seq, before.last_seq, "{id}: nothing recorded");
    }
    assert!(
        children(daemon.pid()).is_empty(),
        "no CLI was started for a refused resume"
    );
    // A session the other release can run is resumed by it, and the log says so.
    let before = session(&mut c, "plain").await;
    assert_eq!(before.cli_version, NEW);
    let answer = turn(&mut c, "plain", "Say hello").await;
    assert!(!answer.is_empty());
    let after = session(&mut c, "plain").await;
    assert_eq!(after.cli_version, OLD, "the record follows the release");
    let log = history(&mut c, "plain").await;
    let changed = log
        .iter()
        .find_map(|e| match &e.payload {
            Some(pb::session_event::Payload::EngineNotice(n))
                if n.code == "cli_release_changed" =>
            {
                Some(n.clone())
            }
            _ => None,
        })
        .expect("a cli_release_changed notice");
    let data: serde_json::Value = serde_json::from_str(&changed.data_json).unwrap();
    assert_eq!(data["from"], NEW, "{data}");
    assert_eq!(data["to"], OLD, "{data}");
    daemon.terminate().await;

    // The release that accepts the option resumes the session on demand.
    world.claude = new_claude;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let answer = turn(&mut c, "with-effort", "Say hello").await;
    assert!(!answer.is_empty());
}

/// The CLI's `total_cost_usd` is its running total; a 2.1.330+ CLI resuming a conversation
/// goes on from the total it saved at its last exit (the transcript's `cost-state`), older
/// ones start again at 0 (measured). The session's cost counts each turn once either way.
async fn session_cost_counts_each_turn_once_across_a_resume(release: &str, restores: bool) {
    let world = World::new(release).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let a = create_session(&mut c, &world.work, "cost").await;
    turn(&mut c, &a.id, "The first question").await;
    c.stop_session(pb::StopSessionRequest {
        session_id: a.id.clone(),
    })
    .await
    .unwrap();
    c.resume_session(pb::ResumeSessionRequest {
        session_id: a.id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    turn(&mut c, &a.id, "The second question, a little longer").await;
    let totals: Vec<f64> = history(&mut c, &a.id)
        .await
        .iter()
        .filter_map(|e| match &e.payload {
            Some(pb::session_event::Payload::TurnCompleted(t)) => Some(t.total_cost_usd),
            _ => None,
        })
        .collect();
    let [first, second] = totals[..] else {
        panic!("{release}: two turns: {totals:?}");
    };
    assert!(first > 0.0 && second > 0.0, "{release}: {totals:?}");
    // What the two turns cost: the second total goes on from the first where it is restored.
    let spent = if restores { second } else { first + second };
    let s = session(&mut c, &a.id).await;
    assert!(
        (s.total_cost_usd - spent).abs() < 1e-9,
        "{release}: the session says {} for turns of totals {totals:?} (spent {spent})",
        s.total_cost_usd
    );
    assert_eq!(s.turns, 2, "{release}");
}

#[tokio::test]
async fn session_cost_counts_each_turn_once_across_a_resume_new() {
    session_cost_counts_each_turn_once_across_a_resume(NEW, true).await;
}

#[tokio::test]
async fn session_cost_counts_each_turn_once_across_a_resume_old() {
    session_cost_counts_each_turn_once_across_a_resume(OLD, false).await;
}

/// Write a file, then edit it: each needs permission in the default mode.
const WRITE_THEN_EDIT: &str = r#"
default_text = "OK."

[[model]]
name = "write"
when = { last_user_text_contains = "Write the note" }
blocks = [{ type = "tool_use", id = "toolu_note_w", name = "Write", input = { file_path = "NOTE_PATH", content = "a" } }]

[[model]]
name = "after write"
when = { tool_result_for = "toolu_note_w" }
blocks = [{ type = "text", text = "Written." }]

[[model]]
name = "edit"
when = { last_user_text_contains = "Edit the note" }
blocks = [{ type = "tool_use", id = "toolu_note_e", name = "Edit", input = { file_path = "NOTE_PATH", old_string = "a", new_string = "b" } }]

[[model]]
name = "after edit"
when = { tool_result_for = "toolu_note_e" }
blocks = [{ type = "text", text = "Edited." }]
"#;

/// An allow that carries the CLI's own suggestion (`updated_permissions_json`, the SDKs'
/// `updatedPermissions`): 2.1.332 suggests `setMode acceptEdits` for a write in the cwd,
/// and once it is sent with the allow, the next edit runs without asking. The resolution
/// records what was sent.
#[tokio::test]
async fn an_allow_can_apply_the_clis_permission_suggestions() {
    let scratch = tempfile::tempdir().unwrap();
    let note = scratch.path().join("note.txt");
    let scenario = WRITE_THEN_EDIT.replace("NOTE_PATH", &note.display().to_string());
    let world = World::with_scenario(NEW, &scenario).await;
    let root = scratch.path().display().to_string();
    let daemon = world.daemon(&["--allowed-root", &root]).await;
    let mut c = daemon.sessions().await;
    let s = c
        .create_session(pb::CreateSessionRequest {
            cwd: root.clone(),
            first_prompt: text("Write the note"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    let asked = read_until(&mut events, &mut seen, "the write's prompt", |e| {
        matches!(
            &e.payload,
            Some(pb::session_event::Payload::PermissionRequested(_))
        )
    })
    .await;
    let Some(pb::session_event::Payload::PermissionRequested(p)) = asked.payload else {
        unreachable!()
    };
    assert_eq!(p.tool_name, "Write");
    let suggestions: serde_json::Value = serde_json::from_str(&p.suggestions_json).unwrap();
    assert!(
        suggestions.as_array().is_some_and(|a| a
            .iter()
            .any(|u| u["type"] == "setMode" && u["mode"] == "acceptEdits")),
        "{suggestions}"
    );
    let decided = c
        .respond_to_permission(pb::RespondToPermissionRequest {
            session_id: s.id.clone(),
            request_id: p.request_id.clone(),
            decision: Some(pb::respond_to_permission_request::Decision::Allow(
                pb::PermissionAllow {
                    updated_permissions_json: p.suggestions_json.clone(),
                    ..Default::default()
                },
            )),
        })
        .await
        .unwrap()
        .into_inner();
    let resolved = decided.resolved.unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&resolved.updated_permissions_json).unwrap(),
        suggestions
    );
    read_until(
        &mut events,
        &mut seen,
        "the write's turn",
        is_turn_completed,
    )
    .await;
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "a");

    send(&mut c, &s.id, "Edit the note").await;
    let next = read_until(&mut events, &mut seen, "the edit's turn or a prompt", |e| {
        is_turn_completed(e)
            || matches!(
                &e.payload,
                Some(pb::session_event::Payload::PermissionRequested(_))
            )
    })
    .await;
    assert!(is_turn_completed(&next), "the edit asked again: {next:?}");
    assert_eq!(std::fs::read_to_string(&note).unwrap(), "b");
}

const EXTENDED_QUESTIONS: &str = r#"
[[model]]
name = "form"
when = { last_user_text_contains = "Plan my deck", stream = true }
blocks = [
  { type = "tool_use", id = "toolu_form_1", name = "AskUserQuestion", input = { title = "Before I build your deck", questions = [
    { question = "Which layout?", header = "Layout", multiSelect = false, options = [
      { label = "Grid", description = "Tiles", preview = "<div><b>Grid</b> of tiles</div>" },
      { label = "List", description = "Rows", preview = "<div><b>List</b> of rows</div>" },
    ] },
    { question = "Deck name?", header = "Name", kind = "text", description = "Shown on the cover", placeholder = "Q3 review" },
    { question = "How many slides?", header = "Slides", kind = "number", min = 3, max = 20, step = 1, defaultValue = 8, unit = "slides" },
  ] } },
]

[[model]]
name = "after form"
when = { tool_result_for = "toolu_form_1", stream = true }
blocks = [{ type = "text", text = "Building it." }]
"#;

/// With `question_extended` and `question_preview_format`, the questions the model asks
/// carry what a client needs to show them (the form's title, each question's kind, the
/// number range, the options' previews), and text and number questions are answered with
/// `other_text`, a number checked against its range; the CLI gets the answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn extended_questions_reach_clients_whole_and_take_text_and_number_answers() {
    let world = World::with_scenario(NEW, EXTENDED_QUESTIONS).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = c
        .create_session(pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            question_extended: true,
            question_preview_format: "html".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "Plan my deck").await;
    let ev = read_until(&mut events, &mut seen, "the questions", |e| {
        matches!(
            e.payload,
            Some(pb::session_event::Payload::QuestionAsked(_))
        )
    })
    .await;
    let Some(pb::session_event::Payload::QuestionAsked(q)) = ev.payload else {
        unreachable!()
    };
    assert_eq!(q.title, "Before I build your deck");
    let input: serde_json::Value = serde_json::from_str(&q.input_json).unwrap();
    assert_eq!(input["questions"][2]["unit"], "slides", "{input}");
    let [layout, name, slides] = &q.questions[..] else {
        panic!("{q:?}")
    };
    // 2.1.332 fills in the default kind.
    assert_eq!(layout.kind, "choice");
    assert_eq!(layout.options[0].preview, "<div><b>Grid</b> of tiles</div>");
    assert_eq!(name.kind, "text");
    assert!(name.options.is_empty());
    assert_eq!(name.description, "Shown on the cover");
    assert_eq!(name.placeholder, "Q3 review");
    assert_eq!(slides.kind, "number");
    assert_eq!(
        (slides.min, slides.max, slides.step, slides.default_value),
        (Some(3.0), Some(20.0), Some(1.0), Some(8.0))
    );
    assert_eq!(slides.unit, "slides");
    // A form's questions may each be left unanswered.
    assert!(layout.optional && name.optional && slides.optional, "{q:?}");

    // "Which layout?" is left unanswered (no choice, no text).
    let answer = |slides: &str| pb::AnswerQuestionRequest {
        session_id: s.id.clone(),
        request_id: q.request_id.clone(),
        answers: vec![
            pb::QuestionAnswer {
                question: "Which layout?".into(),
                selected: vec![],
                other_text: String::new(),
            },
            pb::QuestionAnswer {
                question: "Deck name?".into(),
                selected: vec![],
                other_text: "Launch plan".into(),
            },
            pb::QuestionAnswer {
                question: "How many slides?".into(),
                selected: vec![],
                other_text: slides.into(),
            },
        ],
    };
    // Out of range: refused before the CLI sees it; the question stays pending.
    let err = c.answer_question(answer("40")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("answers[2].other_text") && err.message().contains("from 3 to 20"),
        "{err:?}"
    );
    // Something answered is still checked: an option the question lacks is refused.
    let mut wrong = answer("12");
    wrong.answers[0].selected = vec!["Carousel".into()];
    let err = c.answer_question(wrong).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("answers[0].selected"), "{err:?}");
    c.answer_question(answer("12")).await.unwrap();
    read_until(&mut events, &mut seen, "the turn's end", is_turn_completed).await;
    // The tool result the CLI made: the answered questions only (2.1.332 says "The user
    // answered: ..." when a text answer is among them).
    let result = world
        .fake
        .requests()
        .into_iter()
        .filter_map(|r| r.body)
        .flat_map(|b| b["messages"].as_array().cloned().unwrap_or_default())
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .find(|b| b["type"] == "tool_result" && b["tool_use_id"] == "toolu_form_1")
        .map(|b| b["content"].to_string())
        .unwrap_or_default();
    assert!(
        result.contains("The user answered: ")
            && result.contains(r#"\"Deck name?\"=\"Launch plan\""#)
            && result.contains(r#"\"How many slides?\"=\"12\""#)
            && !result.contains("Which layout?"),
        "the model gets the answers, the skipped question left out: {result}"
    );
    // The skipped question is also marked so, as 2.1.332 announces it takes
    // (ask_user_question_unanswered_v1): the CLI keeps the mark in its transcript.
    fn transcripts(dir: &std::path::Path, out: &mut String) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                transcripts(&p, out);
            } else if p.extension().is_some_and(|x| x == "jsonl") {
                out.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
            }
        }
    }
    let mut t = String::new();
    transcripts(&world.home, &mut t);
    assert!(
        t.contains(r#""Which layout?":{"unanswered":"skipped"}"#),
        "the CLI recorded the skip: {}",
        t.lines()
            .filter(|l| l.contains("toolUseResult"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
