//! gRPC acceptance of the session controls of issue 10 against the real CLI: the
//! `initialize` answer and GetSessionInfo, SetMaxThinkingTokens, GetContextUsage, the MCP
//! controls with the test kit's stdio MCP server (listed, toggled, reconnected, its tool
//! called by the model), RewindFiles with file checkpointing, StopTask, Interrupt with
//! cancel_queued; on 1.0.128 the controls it does not serve fail at once with
//! FAILED_PRECONDITION naming the release and the request.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error

use crate::common;

use std::time::Instant;

use common::grpc::*;
use common::*;
use ostler_proto::v1 as pb;
use ostler_proto::v1::session_service_client::SessionServiceClient;
use ostler_testkit::timeouts::{millis, secs};
use pb::session_event::Payload as P;
use tonic::transport::Channel;

/// The daemon tests' script plus what these tests make the model do.
const CONTROLS: &str = r#"
[[model]]
name = "write for rewind"
when = { last_user_text_contains = "Write the rewind file", stream = true }
blocks = [
  { type = "tool_use", id = "toolu_write_1", name = "Write", input = { file_path = "REWIND_PATH", content = "to be rewound\n" } },
]

[[model]]
name = "after write"
when = { tool_result_for = "toolu_write_1", stream = true }
blocks = [{ type = "text", text = "Wrote the rewind file." }]

[[model]]
name = "ticket"
when = { last_user_text_contains = "Look up ticket T-42", stream = true }
blocks = [
  { type = "tool_use", id = "toolu_mcp_1", name = "mcp__tickets__echo_ticket", input = { ticket = "T-42" } },
]

[[model]]
name = "after ticket"
when = { tool_result_for = "toolu_mcp_1", stream = true }
blocks = [{ type = "text", text = "The ticket is open." }]
"#;

type Client = SessionServiceClient<Channel>;

/// Reads the session's events until the answer to `initialize` is recorded; panics when it
/// failed.
async fn await_initialized(events: &mut Events, seen: &mut Vec<pb::SessionEvent>) {
    let ev = read_until(events, seen, "session_initialized", |e| {
        matches!(&e.payload, Some(P::EngineNotice(n))
            if n.code == "session_initialized" || n.code == "initialize_failed")
    })
    .await;
    let Some(P::EngineNotice(n)) = ev.payload else {
        unreachable!()
    };
    assert_eq!(n.code, "session_initialized", "{}", n.message);
}

async fn info(c: &mut Client, id: &str) -> pb::GetSessionInfoResponse {
    c.get_session_info(pb::GetSessionInfoRequest {
        session_id: id.into(),
    })
    .await
    .unwrap()
    .into_inner()
}

async fn send_turn(
    c: &mut Client,
    events: &mut Events,
    seen: &mut Vec<pb::SessionEvent>,
    id: &str,
    t: &str,
) -> pb::SendMessageResponse {
    let r = c
        .send_message(pb::SendMessageRequest {
            session_id: id.into(),
            content: text(t),
            client_message_id: String::new(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // Tools the CLI asks about (a Write outside the working directory) are allowed.
    allow_until_turn_end(c, "tester", id, events, seen).await;
    r
}

async fn mcp_servers(c: &mut Client, id: &str) -> Vec<pb::McpServerStatus> {
    c.get_mcp_status(pb::GetMcpStatusRequest {
        session_id: id.into(),
    })
    .await
    .unwrap()
    .into_inner()
    .servers
}

/// Polls GetMcpStatus until server `name` has `status` (the CLI connects in the
/// background and sends no event for it).
async fn await_mcp_status(c: &mut Client, id: &str, name: &str, status: &str) {
    let deadline = Instant::now() + guard();
    loop {
        let servers = mcp_servers(c, id).await;
        if servers.iter().any(|s| s.name == name && s.status == status) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "MCP server {name} never reached {status}: {servers:?}"
        );
        tokio::time::sleep(millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn controls_2_1_330() {
    let scratch = tempfile::tempdir().unwrap();
    let target = scratch.path().join("rewind.txt");
    let scenario = format!(
        "{SCENARIO}\n{}",
        CONTROLS.replace("REWIND_PATH", &target.display().to_string())
    );
    let world = World::with_scenario(NEW, &scenario).await;
    let mcp = testkit_binary("ostler-test-mcp").await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = c
        .create_session(pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            permission_mode: pb::PermissionMode::AcceptEdits as i32,
            allowed_tools: vec!["mcp__tickets__echo_ticket".into()],
            enable_file_checkpointing: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();

    // initialize is answered at spawn, before any message.
    await_initialized(&mut events, &mut seen).await;
    let i = info(&mut c, &s.id).await;
    assert_eq!(i.cli_version, NEW);
    assert!(i.live);
    let init = i.initialized.expect("the initialize answer");
    let raw: serde_json::Value = serde_json::from_str(&init.raw_json).unwrap();
    assert!(raw.get("commands").is_some(), "{raw}");
    assert!(!init.commands.is_empty(), "{raw}");
    assert!(
        i.capabilities.iter().any(|c| c == "control:rewind_files"),
        "{:?}",
        i.capabilities
    );
    assert!(!i.init_seen, "no system/init before the first turn");

    // The first turn writes a file, checkpointed at its user message.
    let write = send_turn(
        &mut c,
        &mut events,
        &mut seen,
        &s.id,
        "Write the rewind file",
    )
    .await;
    assert!(!write.message_id.is_empty());
    assert!(
        target.is_file(),
        "the model's Write ran: {:#?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );
    // The message id is in the log too.
    assert!(seen.iter().any(
        |e| matches!(&e.payload, Some(P::UserMessage(u)) if u.message_id == write.message_id)
    ));
    let i = info(&mut c, &s.id).await;
    assert!(i.init_seen);
    assert!(i.tools.iter().any(|t| t == "Write"), "{:?}", i.tools);
    assert!(!i.model.is_empty());
    assert_eq!(i.reported_cli_version, NEW);

    c.set_max_thinking_tokens(pb::SetMaxThinkingTokensRequest {
        session_id: s.id.clone(),
        max_thinking_tokens: Some(2048),
    })
    .await
    .unwrap();
    c.set_max_thinking_tokens(pb::SetMaxThinkingTokensRequest {
        session_id: s.id.clone(),
        max_thinking_tokens: None,
    })
    .await
    .unwrap();

    // In full, the CLI counts each category with the token-count API; a summary does
    // not call it.
    let counted = || {
        world
            .fake
            .requests()
            .iter()
            .filter(|r| r.path.contains("count_tokens"))
            .count()
    };
    let before = counted();
    let usage = c
        .get_context_usage(pb::GetContextUsageRequest {
            session_id: s.id.clone(),
            summary: false,
        })
        .await
        .unwrap()
        .into_inner();
    let raw: serde_json::Value = serde_json::from_str(&usage.raw_json).unwrap();
    assert!(raw.is_object(), "{raw}");
    assert!(usage.max_tokens > 0, "{raw}");
    let full_counts = counted() - before;
    assert!(full_counts > 0, "the full answer counted nothing");
    let before = counted();
    let summary = c
        .get_context_usage(pb::GetContextUsageRequest {
            session_id: s.id.clone(),
            summary: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        counted(),
        before,
        "a summary counts nothing: {}",
        summary.raw_json
    );
    assert_eq!(summary.max_tokens, usage.max_tokens, "{}", summary.raw_json);

    // The test kit's MCP server, added at runtime.
    let set = c
        .set_mcp_servers(pb::SetMcpServersRequest {
            session_id: s.id.clone(),
            // As `--mcp-config` takes it: no `type` (stdio), no `args`; with a tool-call
            // timeout and its tools never deferred.
            servers_json: [(
                "tickets".to_string(),
                serde_json::json!({
                    "command": mcp.display().to_string(),
                    "timeout": 60_000,
                    "alwaysLoad": true,
                })
                .to_string(),
            )]
            .into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(set.errors.is_empty(), "{}", set.raw_json);
    // A key ostler would not pass on is refused, not dropped.
    let refused = c
        .set_mcp_servers(pb::SetMcpServersRequest {
            session_id: s.id.clone(),
            servers_json: [(
                "other".to_string(),
                serde_json::json!({"command": "/bin/cat", "tools": [{"name": "x"}]}).to_string(),
            )]
            .into(),
        })
        .await;
    assert_refused(refused, tonic::Code::InvalidArgument, "\"tools\"");
    await_mcp_status(&mut c, &s.id, "tickets", "connected").await;
    let servers = mcp_servers(&mut c, &s.id).await;
    let tickets = servers.iter().find(|s| s.name == "tickets").unwrap();
    assert!(
        tickets.tools.iter().any(|t| t.contains("echo_ticket")),
        "{tickets:?}"
    );

    // The model calls its tool; the tool's answer reaches the model.
    send_turn(&mut c, &mut events, &mut seen, &s.id, "Look up ticket T-42").await;
    assert!(
        seen.iter()
            .any(|e| assistant_text(e) == Some("The ticket is open.")),
        "{:#?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );
    let answered = world.fake.requests().iter().any(|r| {
        r.body
            .as_ref()
            .is_some_and(|b| b.to_string().contains("ticket T-42 is open"))
    });
    assert!(answered, "the MCP tool's result reached the model");

    // Toggle, reconnect; an unknown server is the CLI's error, as FAILED_PRECONDITION.
    for enabled in [false, true] {
        c.toggle_mcp_server(pb::ToggleMcpServerRequest {
            session_id: s.id.clone(),
            server_name: "tickets".into(),
            enabled,
        })
        .await
        .unwrap();
    }
    await_mcp_status(&mut c, &s.id, "tickets", "connected").await;
    c.reconnect_mcp_server(pb::ReconnectMcpServerRequest {
        session_id: s.id.clone(),
        server_name: "tickets".into(),
    })
    .await
    .unwrap();
    let err = c
        .toggle_mcp_server(pb::ToggleMcpServerRequest {
            session_id: s.id.clone(),
            server_name: "no-such-server".into(),
            enabled: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("no-such-server"), "{err:?}");

    // Rewind: a dry run reports, the real one removes the file the first turn created.
    let dry = c
        .rewind_files(pb::RewindFilesRequest {
            session_id: s.id.clone(),
            message_id: write.message_id.clone(),
            dry_run: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(dry.can_rewind, "{}", dry.raw_json);
    assert!(target.is_file(), "a dry run changes nothing");
    // ... and is not recorded as a rewind.
    let dry_notice = read_until(&mut events, &mut seen, "the dry run's notice", |e| {
        matches!(&e.payload, Some(P::EngineNotice(n))
            if n.code == "files_rewind_checked" || n.code == "files_rewound")
    })
    .await;
    assert!(
        matches!(&dry_notice.payload, Some(P::EngineNotice(n)) if n.code == "files_rewind_checked"),
        "{dry_notice:?}"
    );
    let done = c
        .rewind_files(pb::RewindFilesRequest {
            session_id: s.id.clone(),
            message_id: write.message_id.clone(),
            dry_run: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(done.can_rewind, "{}", done.raw_json);
    assert!(!target.exists(), "rewound: {}", done.raw_json);

    c.stop_task(pb::StopTaskRequest {
        session_id: s.id.clone(),
        task_id: "no-such-task".into(),
    })
    .await
    .unwrap();
    let r = c
        .interrupt(pb::InterruptRequest {
            session_id: s.id.clone(),
            cancel_queued: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.cancelled.is_empty(), "nothing was queued: {r:?}");

    // Bad input is refused at the edge.
    let err = c
        .rewind_files(pb::RewindFilesRequest {
            session_id: s.id.clone(),
            message_id: " ".into(),
            dry_run: true,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    // Configs CreateSession would refuse are refused here too, naming the server.
    for (name, config, needle) in [
        ("x", "[1]", "must be a JSON object"),
        (
            "bad name!",
            r#"{"command": "/bin/true"}"#,
            "an MCP server name",
        ),
        ("w", r#"{"type": "weird"}"#, "not an MCP server config"),
        (
            "f",
            r#"{"type": "http", "url": "file:///etc/passwd"}"#,
            "http:// or https://",
        ),
        ("d", r#"{"command": "-rf"}"#, "servers[\"d\"].command"),
    ] {
        let r = c
            .set_mcp_servers(pb::SetMcpServersRequest {
                session_id: s.id.clone(),
                servers_json: [(name.to_string(), config.to_string())].into(),
            })
            .await;
        assert_refused(r, tonic::Code::InvalidArgument, needle);
    }

    // What was set at runtime outlives the process: a resumed session gets the thinking
    // budget on its command line and the MCP servers again.
    c.set_max_thinking_tokens(pb::SetMaxThinkingTokensRequest {
        session_id: s.id.clone(),
        max_thinking_tokens: Some(3000),
    })
    .await
    .unwrap();
    c.stop_session(pb::StopSessionRequest {
        session_id: s.id.clone(),
    })
    .await
    .unwrap();
    let resumed = c
        .resume_session(pb::ResumeSessionRequest {
            session_id: s.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    settled(&mut c, &resumed).await;
    let kids = children(daemon.pid());
    assert_eq!(kids.len(), 1, "{kids:?}");
    let argv = cmdline(kids[0]);
    assert!(
        argv.windows(2)
            .any(|w| w[0] == "--max-thinking-tokens" && w[1] == "3000"),
        "{argv:?}"
    );
    await_mcp_status(&mut c, &s.id, "tickets", "connected").await;
}

/// 1.0.128 answers `initialize` and `mcp_status` but none of the newer subtypes: each of
/// those RPCs fails at once (not after the 30 s control timeout) naming release and request.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn controls_1_0_128() {
    let world = World::new(OLD).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "old").await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    await_initialized(&mut events, &mut seen).await;
    send_turn(&mut c, &mut events, &mut seen, &s.id, "Say hello").await;

    let i = info(&mut c, &s.id).await;
    assert_eq!(i.cli_version, OLD);
    assert!(i.initialized.is_some());
    assert!(i.init_seen);
    assert!(!i.tools.is_empty());
    assert!(
        !i.capabilities.iter().any(|c| c == "control:rewind_files"),
        "{:?}",
        i.capabilities
    );
    // mcp_status is served.
    mcp_servers(&mut c, &s.id).await;

    let id = s.id.clone();
    let refused: Vec<(&str, tonic::Status)> = vec![
        (
            "set_max_thinking_tokens",
            c.set_max_thinking_tokens(pb::SetMaxThinkingTokensRequest {
                session_id: id.clone(),
                max_thinking_tokens: Some(1024),
            })
            .await
            .unwrap_err(),
        ),
        (
            "get_context_usage",
            c.get_context_usage(pb::GetContextUsageRequest {
                session_id: id.clone(),
                summary: false,
            })
            .await
            .unwrap_err(),
        ),
        (
            "mcp_set_servers",
            c.set_mcp_servers(pb::SetMcpServersRequest {
                session_id: id.clone(),
                servers_json: Default::default(),
            })
            .await
            .unwrap_err(),
        ),
        (
            "mcp_toggle",
            c.toggle_mcp_server(pb::ToggleMcpServerRequest {
                session_id: id.clone(),
                server_name: "x".into(),
                enabled: true,
            })
            .await
            .unwrap_err(),
        ),
        (
            "mcp_reconnect",
            c.reconnect_mcp_server(pb::ReconnectMcpServerRequest {
                session_id: id.clone(),
                server_name: "x".into(),
            })
            .await
            .unwrap_err(),
        ),
        (
            "rewind_files",
            c.rewind_files(pb::RewindFilesRequest {
                session_id: id.clone(),
                message_id: "m".into(),
                dry_run: true,
            })
            .await
            .unwrap_err(),
        ),
        (
            "stop_task",
            c.stop_task(pb::StopTaskRequest {
                session_id: id.clone(),
                task_id: "t".into(),
            })
            .await
            .unwrap_err(),
        ),
        (
            "get_settings",
            c.send_control_request(pb::SendControlRequestRequest {
                session_id: id.clone(),
                subtype: "get_settings".into(),
                request_json: String::new(),
            })
            .await
            .unwrap_err(),
        ),
        (
            "interrupt_cancel_queued_v1",
            c.interrupt(pb::InterruptRequest {
                session_id: id.clone(),
                cancel_queued: true,
            })
            .await
            .unwrap_err(),
        ),
        (
            "summary",
            c.get_context_usage(pb::GetContextUsageRequest {
                session_id: id.clone(),
                summary: true,
            })
            .await
            .unwrap_err(),
        ),
    ];
    for (what, err) in &refused {
        assert_eq!(
            err.code(),
            tonic::Code::FailedPrecondition,
            "{what}: {err:?}"
        );
        assert!(
            err.message().contains(OLD) && err.message().contains(what),
            "{what}: {}",
            err.message()
        );
    }
    // At once: every refusal together well within the control timeout.
    let started = Instant::now();
    let err = c
        .rewind_files(pb::RewindFilesRequest {
            session_id: id.clone(),
            message_id: "m".into(),
            dry_run: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(
        started.elapsed() < secs(2),
        "refused after {:?}",
        started.elapsed()
    );
    // The session still works.
    send_turn(&mut c, &mut events, &mut seen, &s.id, "Say hello").await;
}

/// SendControlRequest: control requests ostler has no RPC for reach the CLI and its answer
/// comes back (get_settings, list_models, rename_session, and Agent SDK 0.3.334's
/// set_peer_delivery and decide_held_peer_message); one the release does not know is
/// FAILED_PRECONDITION with the CLI's words; subtypes an RPC sends, bad subtypes and bad
/// fields are INVALID_ARGUMENT; each answer is recorded in the session's log; the CLI's
/// rename is the session's title.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn control_requests_passed_through_2_1_332() {
    let world = World::new(NEW).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    // Settings with an `env` value: `get_settings` answers them, redacted.
    let s = c
        .create_session(as_client(
            "passthrough",
            pb::CreateSessionRequest {
                cwd: world.work.display().to_string(),
                settings: r#"{"env":{"PASS_SECRET":"SEKRIT-PASS"}}"#.into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    await_initialized(&mut events, &mut seen).await;
    send_turn(&mut c, &mut events, &mut seen, &s.id, "Say hello").await;
    let send = |subtype: &str, request_json: &str| send_control(&c, &s.id, subtype, request_json);
    let settings = send("get_settings", "").await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&settings.response_json).unwrap();
    assert!(v.get("applied").is_some(), "{v}");
    assert!(
        settings.response_json.contains("PASS_SECRET")
            && !settings.response_json.contains("SEKRIT-PASS"),
        "{v}"
    );
    let models = send("list_models", "{}").await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&models.response_json).unwrap();
    assert!(!v["models"].as_array().unwrap().is_empty(), "{v}");
    // Subtypes the Agent SDK 0.3.334 added, which ostler has no RPC for: each answered at
    // once as 2.1.332 answers it (measured 4-16 ms), none left waiting for the timeout.
    let peer = send("set_peer_delivery", r#"{"shows_held_messages": false}"#)
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&peer.response_json).unwrap();
    assert!(v.get("always_deliver").is_some(), "{v}");
    let held = send(
        "decide_held_peer_message",
        r#"{"hold_id": "no-such-hold", "decision": "drop"}"#,
    )
    .await
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&held.response_json).unwrap();
    assert_eq!(v["outcome"], "gone", "{v}");
    assert_refused(
        send("decide_held_peer_message", r#"{"hold_id": "no-such-hold"}"#).await,
        tonic::Code::FailedPrecondition,
        "Invalid decide_held_peer_message",
    );
    assert_refused(
        send(
            "update_queued_message",
            r#"{"message_uuid": "00000000-0000-0000-0000-000000000000"}"#,
        )
        .await,
        tonic::Code::FailedPrecondition,
        "Unsupported control request",
    );
    send("rename_session", r#"{"title": "RENAMED-8"}"#)
        .await
        .unwrap();

    assert_refused(
        send("bogus_subtype", "").await,
        tonic::Code::FailedPrecondition,
        "Unsupported control request",
    );
    for (subtype, json, field) in [
        ("set_model", "", "SetModel"),
        ("initialize", "", "CreateSession"),
        ("Get-Settings", "", "subtype"),
        (&"x".repeat(100_000), "", "subtype"),
        ("get_settings", "[1]", "request_json"),
        ("get_settings", r#"{"subtype": "x"}"#, "request_json"),
    ] {
        assert_refused(
            send(subtype, json).await,
            tonic::Code::InvalidArgument,
            field,
        );
    }
    // The CLI renamed its session, and the answers are in the log. The CLI's line and
    // ostler's notice of the answer come in either order.
    let title_changed = |e: &pb::SessionEvent| {
        matches!(&e.payload, Some(P::Unknown(u))
            if u.message_type == "system/session_title_changed" && u.raw_json.contains("RENAMED-8"))
    };
    let rename_noticed = |e: &pb::SessionEvent| {
        matches!(&e.payload, Some(P::EngineNotice(n))
            if n.code == "control" && n.message == "rename_session done")
    };
    if !seen.iter().any(title_changed) {
        read_until(&mut events, &mut seen, "title change", title_changed).await;
    }
    // ... and the session is renamed: whoever saw that line finds the new title.
    assert_eq!(session(&mut c, &s.id).await.title, "RENAMED-8");
    if !seen.iter().any(rename_noticed) {
        read_until(&mut events, &mut seen, "rename notice", rename_noticed).await;
    }
    let logged: Vec<&str> = seen
        .iter()
        .filter_map(|e| match &e.payload {
            Some(P::EngineNotice(n)) if n.code == "control" => Some(n.message.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        logged,
        [
            "get_settings done",
            "list_models done",
            "rename_session done"
        ]
    );
    let peer: Vec<(&str, &str)> = seen
        .iter()
        .filter_map(|e| match &e.payload {
            Some(P::EngineNotice(n)) if n.code.contains("peer") => {
                Some((n.code.as_str(), n.message.as_str()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        peer,
        [
            ("peer_delivery_set", "set_peer_delivery done"),
            ("held_peer_message_decided", "decide_held_peer_message done")
        ]
    );
    // The session still works.
    send_turn(&mut c, &mut events, &mut seen, &s.id, "Say hello").await;
}

/// `set_peer_delivery` outlives the process: what the host set (held messages shown, the
/// choices to always deliver in this conversation and from the person's own sessions) lives
/// in the CLI process (2.1.332); after a stop and resume the new process reports the same
/// choices, the request sent again is recorded as `control_restored`; a fork (another
/// conversation) keeps no conversation choice, its notice says so, and the next process is
/// not sent it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn peer_delivery_survives_a_respawn_2_1_332() {
    let world = World::new(NEW).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "peers").await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    send_turn(&mut c, &mut events, &mut seen, &s.id, "Say hello 1").await;
    let conversation = session(&mut c, &s.id).await.cli_session_id;
    assert!(!conversation.is_empty());
    let cc = c.clone();
    let peer_delivery = |request_json: String| {
        let answer = send_control(&cc, &s.id, "set_peer_delivery", &request_json);
        async move {
            let v: serde_json::Value =
                serde_json::from_str(&answer.await.unwrap().response_json).unwrap();
            v["always_deliver"].clone()
        }
    };
    // A fresh process: nothing chosen. A choice for another conversation is not applied.
    let fresh = peer_delivery("{}".into()).await;
    assert_eq!(fresh["session"], serde_json::Value::Null, "{fresh}");
    assert_eq!(fresh["account"], false, "{fresh}");
    let elsewhere = peer_delivery(
        r#"{"session": {"scope": "mine", "made_in": "prompting", "session_id": "not-this-one"}}"#
            .into(),
    )
    .await;
    assert_eq!(elsewhere["session"], serde_json::Value::Null, "{elsewhere}");
    let chosen = peer_delivery(format!(
        r#"{{"shows_held_messages": true, "account": true,
            "session": {{"scope": "anyone", "made_in": "prompting", "session_id": "{conversation}"}}}}"#
    ))
    .await;
    assert_eq!(chosen["session"]["scope"], "anyone", "{chosen}");
    assert_eq!(chosen["account"], true, "{chosen}");

    // Stopped and resumed: the new process reports the same choices.
    stop_and_resume(&mut c, &s.id).await;
    assert_eq!(
        session(&mut c, &s.id).await.cli_session_id,
        conversation,
        "the resumed CLI runs the same conversation"
    );
    let after = peer_delivery("{}".into()).await;
    assert_eq!(after["session"]["scope"], "anyone", "{after}");
    assert_eq!(after["session"]["made_in"], "prompting", "{after}");
    assert_eq!(
        after["session"]["session_id"],
        conversation.as_str(),
        "{after}"
    );
    assert_eq!(after["account"], true, "{after}");
    send_turn(&mut c, &mut events, &mut seen, &s.id, "Say hello 2").await;
    let restore_noticed = |e: &pb::SessionEvent| matches!(&e.payload, Some(P::EngineNotice(n)) if n.code.starts_with("control_restore"));
    if !seen.iter().any(restore_noticed) {
        read_until(&mut events, &mut seen, "control_restored", restore_noticed).await;
    }

    // One `set_peer_delivery` sent again, recorded with what the host had set.
    let stored = history(&mut c, &s.id).await;
    let restored: Vec<serde_json::Value> = stored
        .iter()
        .filter_map(|e| match &e.payload {
            Some(P::EngineNotice(n)) if n.code.starts_with("control_restore") => {
                Some(serde_json::from_str(&n.data_json).unwrap())
            }
            _ => None,
        })
        .collect();
    assert_eq!(restored.len(), 1, "{restored:#?}");
    assert_eq!(restored[0]["subtype"], "set_peer_delivery");
    assert_eq!(
        restored[0]["request"],
        serde_json::json!({
            "shows_held_messages": true,
            "account": true,
            "session": {"scope": "anyone", "made_in": "prompting", "session_id": conversation},
        }),
        "{restored:#?}"
    );
    assert_eq!(
        restored[0]["answer"]["always_deliver"]["account"], true,
        "{restored:#?}"
    );

    // A fork runs another conversation: the CLI keeps no choice made in this one.
    c.stop_session(pb::StopSessionRequest {
        session_id: s.id.clone(),
    })
    .await
    .unwrap();
    c.resume_session(pb::ResumeSessionRequest {
        session_id: s.id.clone(),
        fork: true,
        ..Default::default()
    })
    .await
    .unwrap();
    send_turn(&mut c, &mut events, &mut seen, &s.id, "Say hello 3").await;
    assert_ne!(session(&mut c, &s.id).await.cli_session_id, conversation);
    let in_part = |e: &pb::SessionEvent| {
        matches!(&e.payload, Some(P::EngineNotice(n))
            if n.code == "control_restored" && n.message.contains("in part")
                && n.message.contains(&conversation))
    };
    if !seen.iter().any(in_part) {
        read_until(&mut events, &mut seen, "a restore in part", in_part).await;
    }
    let forked = seen
        .iter()
        .find_map(|e| match &e.payload {
            Some(P::EngineNotice(n)) if in_part(e) => {
                Some(serde_json::from_str::<serde_json::Value>(&n.data_json).unwrap())
            }
            _ => None,
        })
        .unwrap();
    let state = &forked["answer"]["always_deliver"];
    assert_eq!(state["session"], serde_json::Value::Null, "{forked}");
    assert_eq!(state["account"], true, "{forked}");
    // ... and the next process is not sent that choice again.
    stop_and_resume(&mut c, &s.id).await;
    send_turn(&mut c, &mut events, &mut seen, &s.id, "Say hello 4").await;
    let restored = |e: &pb::SessionEvent| matches!(&e.payload, Some(P::EngineNotice(n)) if n.code == "control_restored");
    if seen.iter().filter(|e| restored(e)).count() < 3 {
        read_until(&mut events, &mut seen, "the third restore", restored).await;
    }
    let last = seen
        .iter()
        .rev()
        .find_map(|e| match &e.payload {
            Some(P::EngineNotice(n)) if n.code == "control_restored" => {
                Some(serde_json::from_str::<serde_json::Value>(&n.data_json).unwrap())
            }
            _ => None,
        })
        .unwrap();
    assert_eq!(
        last["request"],
        serde_json::json!({"shows_held_messages": true, "account": true}),
        "{last}"
    );
}

/// The command line: `ostler info`, `context`, `mcp status|set|toggle|reconnect`,
/// `control` and `rewind` with `--json`.
#[test]
fn control_commands() {
    use common::client::{Served, describe, scenario_text};
    let mcp = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(testkit_binary("ostler-test-mcp"));
    let d = Served::start(&scenario_text());
    let ev = d.ok_json(&["run", "--json", "Say hello"]);
    let id = ev[0]["session"]["id"].as_str().expect("id").to_owned();

    let info = d.ok_json(&["info", &id, "--json"]);
    assert_eq!(info[0]["cli_version"], NEW);
    assert!(
        info[0]["tools"].as_array().is_some_and(|t| !t.is_empty()),
        "{info:?}"
    );
    assert!(info[0]["initialized"]["commands"].is_array(), "{info:?}");
    let human = d.client(&["info", &id], None);
    assert!(
        String::from_utf8_lossy(&human.stdout).contains("Claude Code 2.1.332"),
        "{}",
        describe(&human)
    );

    let context = d.ok_json(&["context", &id, "--json"]);
    assert!(context[0].is_object(), "{context:?}");
    let settings = d.ok_json(&["control", &id, "get_settings", "--json"]);
    assert!(settings[0].get("applied").is_some(), "{settings:?}");
    for (subtype, use_instead, command) in [
        ("set_model", "SetModel", "ostler model ID MODEL"),
        ("end_session", "StopSession", "ostler stop ID"),
    ] {
        let refused = d.client(&["control", &id, subtype, "{}"], None);
        assert_eq!(refused.status.code(), Some(1), "{}", describe(&refused));
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            stderr.contains(&format!("use {use_instead}"))
                && stderr.contains(&format!("use `{command}`")),
            "the RPC and the command that does it: {}",
            describe(&refused)
        );
    }

    // The controls with a command of their own; each is recorded in the session's log.
    let model = d.ok_json(&["model", &id, "claude-opus-test", "--json"]);
    assert_eq!(model[0]["model"], "claude-opus-test", "{model:?}");
    let mode = d.ok_json(&["mode", &id, "plan", "--json"]);
    assert_eq!(mode[0]["permission_mode"], "plan", "{mode:?}");
    let thinking = d.ok_json(&["thinking", &id, "4096", "--json"]);
    assert_eq!(thinking[0]["max_thinking_tokens"], 4096, "{thinking:?}");
    d.ok_json(&["thinking", &id, "--reset", "--json"]);
    d.ok_json(&["stop-task", &id, "no-such-task", "--json"]);
    let shown = d.ok_json(&["show", &id, "--json"]);
    assert_eq!(shown[0]["model"], "claude-opus-test", "{shown:?}");
    assert_eq!(shown[0]["permission_mode"], "plan", "{shown:?}");
    let bad = d.client(&["mode", &id, "sideways"], None);
    assert_eq!(bad.status.code(), Some(2), "{}", describe(&bad));
    let none = d.client(&["thinking", &id], None);
    assert_eq!(none.status.code(), Some(2), "{}", describe(&none));
    d.ok_json(&["mode", &id, "default", "--json"]);

    let config = d.work.join("mcp.json");
    std::fs::write(
        &config,
        serde_json::json!({"mcpServers": {"tickets": {
            "type": "stdio", "command": mcp.display().to_string(), "args": [], "env": {}
        }}})
        .to_string(),
    )
    .unwrap();
    let set = d.ok_json(&["mcp", &id, "set", &config.display().to_string(), "--json"]);
    assert_eq!(set[0]["added"][0], "tickets", "{set:?}");
    let deadline = Instant::now() + guard();
    loop {
        let status = d.ok_json(&["mcp", &id, "status", "--json"]);
        let servers = status[0]["servers"].as_array().cloned().unwrap_or_default();
        if servers
            .iter()
            .any(|s| s["name"] == "tickets" && s["status"] == "connected")
        {
            break;
        }
        assert!(Instant::now() < deadline, "never connected: {status:?}");
        std::thread::sleep(millis(100));
    }
    let off = d.ok_json(&["mcp", &id, "toggle", "tickets", "off", "--json"]);
    assert_eq!(off[0]["enabled"], false);
    d.ok_json(&["mcp", &id, "toggle", "tickets", "on", "--json"]);

    // Not created with file checkpointing, and no such message: refused, exit 1.
    let rewind = d.client(&["rewind", &id, "--to", "no-such-message", "--json"], None);
    assert_eq!(rewind.status.code(), Some(1), "{}", describe(&rewind));
}

/// `no_setting_sources` (the Agent SDKs' `settingSources: []`): the CLI loads no user,
/// project or local settings, also after a respawn; a session without it does (seen from
/// outside: the effort the model is asked with, which a user and a project settings file
/// set); with `setting_sources` too it is INVALID_ARGUMENT.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_setting_sources_loads_no_filesystem_settings_2_1_332() {
    let world = World::new(NEW).await;
    for dir in [&world.home, &world.work] {
        std::fs::create_dir_all(dir.join(".claude")).unwrap();
        std::fs::write(
            dir.join(".claude/settings.json"),
            r#"{"effortLevel":"low"}"#,
        )
        .unwrap();
    }
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let create = |no_setting_sources: bool, setting_sources: Vec<String>| {
        let mut c = c.clone();
        let r = pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            no_setting_sources,
            setting_sources,
            ..Default::default()
        };
        async move { c.create_session(as_client("isolated", r)).await }
    };
    let loaded = create(false, vec![]).await.unwrap().into_inner();
    let isolated = create(true, vec![]).await.unwrap().into_inner();
    assert_refused(
        create(true, vec!["user".into()]).await,
        tonic::Code::InvalidArgument,
        "no_setting_sources",
    );
    let mut seen = Vec::new();
    let mut events = subscribe(&mut c, &loaded.id, 0, false).await;
    send_turn(&mut c, &mut events, &mut seen, &loaded.id, "Say hello L").await;
    let mut events = subscribe(&mut c, &isolated.id, 0, false).await;
    let mut seen = Vec::new();
    send_turn(&mut c, &mut events, &mut seen, &isolated.id, "Say hello I1").await;
    assert_eq!(
        effort_of(&world, "Say hello L"),
        "low",
        "the files are read"
    );
    assert_ne!(effort_of(&world, "Say hello I1"), "low", "no file is read");
    stop_and_resume(&mut c, &isolated.id).await;
    send_turn(&mut c, &mut events, &mut seen, &isolated.id, "Say hello I2").await;
    assert_ne!(
        effort_of(&world, "Say hello I2"),
        "none after the respawn either"
    );
}

/// The `output_config.effort` of the last model request whose messages carry `prompt`.
fn effort_of(world: &World, prompt: &str) -> String {
    let reqs = world.fake.requests();
    let r = reqs
        .iter()
        .rev()
        .find(|r| {
            r.body
                .as_ref()
                .is_some_and(|b| b["messages"].to_string().contains(prompt))
        })
        .unwrap_or_else(|| panic!("no model request for {prompt:?}"));
    let body = r.body.as_ref().unwrap();
    body["output_config"]["effort"]
        .as_str()
        .unwrap_or_else(|| panic!("no effort in {}", body["output_config"]))
        .to_owned()
}

/// `apply_flag_settings` (SendControlRequest) outlives the process: after an idle suspension
/// and an on-demand resume, and after a stop and resume, the CLI runs with the settings
/// applied (seen from outside: the effort the model is asked with, and the CLI's own
/// `get_settings`), merged as the CLI merged them; each respawn records `control_restored`;
/// the settings' `env` values never reach a client.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn flag_settings_survive_respawns_2_1_332() {
    let world = World::new(NEW).await;
    std::fs::write(&world.config, "[sessions]\nidle_suspend_secs = 1\n").unwrap();
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = c
        .create_session(as_client(
            "flags",
            pb::CreateSessionRequest {
                cwd: world.work.display().to_string(),
                settings: r#"{"effortLevel":"high"}"#.into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    // Two requests with different keys: the CLI merges them; one it refuses is not kept.
    send_control(
        &c,
        &s.id,
        "apply_flag_settings",
        r#"{"settings":{"effortLevel":"low","env":{"FLAG_SECRET":"SEKRIT-FLAG"}}}"#,
    )
    .await
    .unwrap();
    send_control(
        &c,
        &s.id,
        "apply_flag_settings",
        r#"{"settings":{"alwaysThinkingEnabled":false}}"#,
    )
    .await
    .unwrap();
    let refused = send_control(
        &c,
        &s.id,
        "apply_flag_settings",
        r#"{"settings":{"permissions":{"defaultMode":"weird"}}}"#,
    )
    .await;
    assert_refused(
        refused,
        tonic::Code::FailedPrecondition,
        "nothing in this request",
    );
    send_turn(&mut c, &mut events, &mut seen, &s.id, "Say hello 1").await;
    assert_eq!(effort_of(&world, "Say hello 1"), "low");

    // Idle: suspended; the next message resumes it on demand, with the settings.
    read_until(
        &mut events,
        &mut seen,
        "idle suspension",
        |e| matches!(&e.payload, Some(P::StateChanged(s)) if s.to() == pb::SessionState::Suspended),
    )
    .await;
    let restored_before = seen
        .iter()
        .filter(|e| matches!(&e.payload, Some(P::EngineNotice(n)) if n.code == "control_restored"))
        .count();
    send_turn(&mut c, &mut events, &mut seen, &s.id, "Say hello 2").await;
    assert_eq!(
        effort_of(&world, "Say hello 2"),
        "low",
        "after the suspension"
    );
    if seen[..]
        .iter()
        .filter(|e| matches!(&e.payload, Some(P::EngineNotice(n)) if n.code == "control_restored"))
        .count()
        == restored_before
    {
        read_until(
            &mut events,
            &mut seen,
            "control_restored",
            |e| matches!(&e.payload, Some(P::EngineNotice(n)) if n.code == "control_restored"),
        )
        .await;
    }

    // Stopped and resumed: the CLI's flag settings layer is what it was, both keys.
    stop_and_resume(&mut c, &s.id).await;
    let settings = send_control(&c, &s.id, "get_settings", "").await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&settings.response_json).unwrap();
    let flags = &v["effective"];
    assert_eq!(flags["effortLevel"], "low", "{v}");
    assert_eq!(flags["alwaysThinkingEnabled"], false, "{v}");
    assert!(flags["env"].get("FLAG_SECRET").is_some(), "{v}");
    assert!(!settings.response_json.contains("SEKRIT-FLAG"), "{v}");
    send_turn(&mut c, &mut events, &mut seen, &s.id, "Say hello 3").await;
    assert_eq!(
        effort_of(&world, "Say hello 3"),
        "low",
        "after stop + resume"
    );

    // The applied settings are recorded, and their env values shown redacted.
    let stored = history(&mut c, &s.id).await;
    let notices: Vec<&pb::EngineNotice> = stored
        .iter()
        .filter_map(|e| match &e.payload {
            Some(P::EngineNotice(n)) => Some(n),
            _ => None,
        })
        .collect();
    assert_eq!(
        notices
            .iter()
            .filter(|n| n.code == "flag_settings_applied")
            .count(),
        2,
        "{notices:#?}"
    );
    // One `control_restored` per request sent again, in the order they were applied.
    for key in ["FLAG_SECRET", "alwaysThinkingEnabled"] {
        assert!(
            notices
                .iter()
                .any(|n| n.code == "control_restored" && n.data_json.contains(key)),
            "{notices:#?}"
        );
    }
    assert!(
        !notices.iter().any(|n| n.code == "control_restore_failed"),
        "{notices:#?}"
    );
    for e in &stored {
        assert!(!format!("{e:?}").contains("SEKRIT-FLAG"), "{}", describe(e));
    }
}

/// Directories a passed-through request makes the CLI work in or load code from are held to
/// the daemon's allowed roots (2.1.332 itself takes a plugin from anywhere, and a working
/// directory anywhere once its trust question is echoed): outside a root, relative, or not
/// a directory is INVALID_ARGUMENT before anything is sent, as is an `update_settings` of
/// the daemon user's settings file (every session's default). A plugin added inside a root is
/// loaded again after a respawn (the new process has none of them), and left out, with
/// `control_restore_failed`, once its directory is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn passed_through_paths_stay_in_the_allowed_roots_2_1_332() {
    let world = World::new(NEW).await;
    let plugin = |dir: &std::path::Path, name: &str| {
        std::fs::create_dir_all(dir.join(".claude-plugin")).unwrap();
        std::fs::create_dir_all(dir.join("commands")).unwrap();
        std::fs::write(
            dir.join(".claude-plugin/plugin.json"),
            format!(r#"{{"name":"{name}"}}"#),
        )
        .unwrap();
        std::fs::write(
            dir.join("commands/greet.md"),
            "---\ndescription: Greets\n---\nSay hello.\n",
        )
        .unwrap();
    };
    let inside = world.work.join("plugins/inside");
    let outside = world.dir.path().join("outside");
    plugin(&inside, "insideplug");
    plugin(&outside, "outsideplug");
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "paths").await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    send_turn(&mut c, &mut events, &mut seen, &s.id, "Say hello 1").await;
    let add = |path: &str| format!(r#"{{"add_plugins":[{{"type":"local","path":"{path}"}}]}}"#);
    for (subtype, json, needle) in [
        (
            "reload_plugins",
            add(&outside.display().to_string()),
            "outside the allowed roots",
        ),
        (
            "reload_plugins",
            add("plugins/inside"),
            "not an absolute path",
        ),
        (
            "set_cwd",
            r#"{"path":"/"}"#.to_string(),
            "outside the allowed roots",
        ),
        (
            "set_cwd",
            r#"{"path":"~"}"#.to_string(),
            "not an absolute path",
        ),
        (
            "register_repo_root",
            r#"{"directory":"/no/such/dir"}"#.to_string(),
            "request_json.directory",
        ),
        // The daemon user's settings file: every session's default.
        (
            "update_settings",
            r#"{"source":"userSettings","settings":{"effortLevel":"low"}}"#.to_string(),
            "apply_flag_settings",
        ),
    ] {
        assert_refused(
            send_control(&c, &s.id, subtype, &json).await,
            tonic::Code::InvalidArgument,
            needle,
        );
    }
    assert!(
        !world.home.join(".claude/settings.json").exists(),
        "the shared user settings were written"
    );
    // Inside a root: sent canonical, loaded.
    let loaded = send_control(
        &c,
        &s.id,
        "reload_plugins",
        &add(&format!("{}/../inside", inside.display())),
    )
    .await
    .unwrap();
    assert!(
        loaded.response_json.contains("insideplug"),
        "{}",
        loaded.response_json
    );

    // A respawn loads it again.
    stop_and_resume(&mut c, &s.id).await;
    send_turn(&mut c, &mut events, &mut seen, &s.id, "Say hello 2").await;
    let restore = |e: &pb::SessionEvent| matches!(&e.payload, Some(P::EngineNotice(n)) if n.code.starts_with("control_restore"));
    if !seen.iter().any(restore) {
        read_until(&mut events, &mut seen, "the plugin loaded again", restore).await;
    }
    let notice = |e: &pb::SessionEvent| match &e.payload {
        Some(P::EngineNotice(n)) if restore(e) => Some((n.code.clone(), n.data_json.clone())),
        _ => None,
    };
    let (code, data) = seen.iter().find_map(notice).unwrap();
    assert_eq!(code, "control_restored", "{data}");
    let v: serde_json::Value = serde_json::from_str(&data).unwrap();
    assert_eq!(v["subtype"], "reload_plugins");
    assert_eq!(
        v["request"]["add_plugins"][0]["path"],
        inside.canonicalize().unwrap().display().to_string(),
        "recorded canonical: {v}"
    );
    assert!(v["answer"].to_string().contains("insideplug"), "{v}");

    // Gone: left out of the next process, and said so.
    std::fs::remove_dir_all(&inside).unwrap();
    let before = seen.iter().filter(|e| restore(e)).count();
    stop_and_resume(&mut c, &s.id).await;
    send_turn(&mut c, &mut events, &mut seen, &s.id, "Say hello 3").await;
    if seen.iter().filter(|e| restore(e)).count() == before {
        read_until(&mut events, &mut seen, "the plugin left out", restore).await;
    }
    let (code, data) = seen.iter().rev().find_map(notice).unwrap();
    assert_eq!(code, "control_restore_failed", "{data}");
    assert!(data.contains("inside"), "{data}");
}

/// An `mcp_call` passed through is decided as the model's own call to the tool would be
/// (`check_permissions` forced on): a tool the session's rules deny is refused (2.1.332
/// runs it with no check otherwise); one they allow runs; asking for no check is
/// INVALID_ARGUMENT.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mcp_calls_are_decided_by_the_session_rules_2_1_332() {
    let world = World::new(NEW).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let echo = "mcp__tickets__echo_ticket".to_string();
    let mut sessions = Vec::new();
    for (allowed, denied) in [(vec![echo.clone()], vec![]), (vec![], vec![echo.clone()])] {
        let s = c
            .create_session(pb::CreateSessionRequest {
                cwd: world.work.display().to_string(),
                mcp_servers: tickets_server().await,
                allowed_tools: allowed,
                disallowed_tools: denied,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let mut events = subscribe(&mut c, &s.id, 0, false).await;
        send_turn(&mut c, &mut events, &mut Vec::new(), &s.id, "Say hello").await;
        await_mcp_status(&mut c, &s.id, "tickets", "connected").await;
        sessions.push(s.id);
    }
    let call = |id: &str, extra: &str| {
        send_control(
            &c,
            id,
            "mcp_call",
            &format!(r#"{{"tool":"{echo}","arguments":{{"ticket":"T-9"}}{extra}}}"#),
        )
    };
    let allowed = call(&sessions[0], "").await.unwrap();
    assert!(
        allowed.response_json.contains("ticket T-9 is open"),
        "{}",
        allowed.response_json
    );
    match call(&sessions[1], "").await {
        Err(status) => assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}"),
        Ok(r) => panic!("the denied tool ran: {}", r.response_json),
    }
    assert_refused(
        call(&sessions[0], r#","check_permissions":false"#).await,
        tonic::Code::InvalidArgument,
        "check_permissions",
    );
}
