//! gRPC acceptance of client-hosted tools (issue 11) against the real CLI (2.1.332 and
//! 2.0.77) and the fake model server: the daemon serves the session's declared tool server
//! to the CLI as an SDK MCP server; the model's call becomes a ToolCallRequested that two
//! clients see, the second client's answer wins and reaches the model, the first client's
//! late answer is refused; error results; expiry gives the CLI an error result and the turn
//! goes on; kill -9 with a call pending resolves it with an error result (`restart`) and
//! the resumed session goes on; a call the CLI gives up on (its own MCP timeout, an
//! interrupt) is closed at once by `cli`; a release without SDK MCP servers (1.0.59) refuses
//! CreateSession with tool_servers at once.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error
#![allow(clippy::disallowed_methods)] // runs the ostler binary under test as a client

use crate::common;

use common::grpc::*;
use common::*;
use ostler_proto::v1 as pb;
use ostler_proto::v1::session_service_client::SessionServiceClient;
use pb::session_event::Payload as P;
use tonic::transport::Channel;

type Client = SessionServiceClient<Channel>;

/// The model calls the ticket tool, then answers after its result; with `hold`, that
/// answer waits until the test signals `hold`.
fn script(hold: Option<&str>) -> String {
    let hold = hold
        .map(|h| format!("hold_until = {h:?}\n"))
        .unwrap_or_default();
    format!(
        r#"
[[model]]
name = "ticket"
when = {{ last_user_text_contains = "Look up ticket T-7", stream = true }}
blocks = [
  {{ type = "tool_use", id = "toolu_t1", name = "mcp__tickets__lookup_ticket", input = {{ id = "T-7" }} }},
]

[[model]]
name = "after ticket"
when = {{ tool_result_for = "toolu_t1", stream = true }}
{hold}blocks = [{{ type = "text", text = "Ticket handled." }}]
"#
    )
}

const OLDEST_2_0: &str = "2.0.77";
/// A pinned release measured not to take SDK MCP servers (its `--mcp-config` parser
/// refuses `{"type":"sdk"}`).
const WITHOUT_SDK_MCP: &str = "1.0.59";

async fn world(release: &str) -> World {
    World::with_scenario(release, &format!("{SCENARIO}\n{}", script(None))).await
}

fn tickets(timeout_secs: u32) -> pb::ToolServer {
    pb::ToolServer {
        name: "tickets".into(),
        tools: vec![pb::ToolDefinition {
            name: "lookup_ticket".into(),
            description: "Look up a support ticket by id".into(),
            input_schema_json:
                r#"{"type":"object","properties":{"id":{"type":"string"}},"required":["id"]}"#
                    .into(),
        }],
        timeout_secs,
    }
}

async fn create(c: &mut Client, world: &World, timeout_secs: u32) -> pb::Session {
    create_with(c, world, timeout_secs, true, Default::default()).await
}

/// A session with the ticket server (`timeout_secs` for its calls), its tool allowed or
/// not, `env` in the CLI's environment.
async fn create_with(
    c: &mut Client,
    world: &World,
    timeout_secs: u32,
    allowed: bool,
    env: std::collections::HashMap<String, String>,
) -> pb::Session {
    let allowed_tools = if allowed {
        vec!["mcp__tickets__lookup_ticket".into()]
    } else {
        vec![]
    };
    c.create_session(as_client(
        "creator",
        pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            allowed_tools,
            tool_servers: vec![tickets(timeout_secs)],
            env,
            ..Default::default()
        },
    ))
    .await
    .unwrap()
    .into_inner()
}

fn text_block(t: &str) -> pb::ToolContent {
    pb::ToolContent {
        block: Some(pb::tool_content::Block::Text(t.into())),
    }
}

async fn await_call(
    events: &mut Events,
    seen: &mut Vec<pb::SessionEvent>,
) -> pb::ToolCallRequested {
    let ev = read_until(events, seen, "tool call", |e| {
        matches!(e.payload, Some(P::ToolCallRequested(_)))
    })
    .await;
    let Some(P::ToolCallRequested(t)) = ev.payload else {
        unreachable!()
    };
    t
}

async fn await_resolved(
    events: &mut Events,
    seen: &mut Vec<pb::SessionEvent>,
) -> pb::ToolCallResolved {
    let ev = read_until(events, seen, "tool call resolved", |e| {
        matches!(e.payload, Some(P::ToolCallResolved(_)))
    })
    .await;
    let Some(P::ToolCallResolved(t)) = ev.payload else {
        unreachable!()
    };
    t
}

/// No interaction is pending any more, and a late answer to `request_id` is refused.
async fn nothing_left_to_answer(c: &mut Client, session_id: &str, request_id: &str) {
    let pending = pending_interactions(c).await;
    assert!(pending.is_empty(), "{pending:?}");
    let late = c
        .respond_to_tool_call(pb::RespondToToolCallRequest {
            session_id: session_id.to_owned(),
            request_id: request_id.to_owned(),
            content: vec![text_block("late")],
            is_error: false,
        })
        .await
        .unwrap_err();
    assert_eq!(late.code(), tonic::Code::FailedPrecondition, "{late:?}");
}

/// The `tool_result` block for `toolu_t1` in the model requests the fake server saw, as
/// JSON text, and whether it is marked as an error.
fn tool_result_seen(world: &World) -> Option<(String, bool)> {
    for r in world.fake.requests() {
        let Some(body) = r.body else { continue };
        let Some(messages) = body.get("messages").and_then(|m| m.as_array()) else {
            continue;
        };
        for m in messages {
            let Some(blocks) = m.get("content").and_then(|c| c.as_array()) else {
                continue;
            };
            for b in blocks {
                if b.get("type").and_then(|t| t.as_str()) == Some("tool_result")
                    && b.get("tool_use_id").and_then(|t| t.as_str()) == Some("toolu_t1")
                {
                    let is_error = b.get("is_error").and_then(|e| e.as_bool()) == Some(true);
                    return Some((
                        b.get("content").map(|c| c.to_string()).unwrap_or_default(),
                        is_error,
                    ));
                }
            }
        }
    }
    None
}

/// The model's call reaches two clients; the second answers, the first is refused; the
/// answer reaches the model and the turn ends.
async fn answered_by_second_client(release: &str) {
    let world = world(release).await;
    let daemon = world.daemon(&[]).await;
    let mut a = daemon.sessions().await;
    let mut b = daemon.sessions().await;
    let s = create(&mut a, &world, 0).await;
    let mut ea = subscribe(&mut a, &s.id, 0, false).await;
    let mut eb = subscribe(&mut b, &s.id, 0, false).await;
    let (mut sa, mut sb) = (Vec::new(), Vec::new());
    send(&mut a, &s.id, "Look up ticket T-7 please").await;
    let call = await_call(&mut ea, &mut sa).await;
    let call_seq = sa.last().unwrap().seq;
    let call_b = await_call(&mut eb, &mut sb).await;
    assert_eq!(call, call_b);
    assert_eq!(call.server_name, "tickets");
    assert_eq!(call.tool_name, "lookup_ticket");
    let args: serde_json::Value = serde_json::from_str(&call.arguments_json).unwrap();
    assert_eq!(args, serde_json::json!({"id": "T-7"}));
    assert!(call.expires_at_ms > 0);

    // Listed among the pending interactions while it waits.
    let pending = pending_interactions(&mut a).await;
    assert!(
        pending.iter().any(|p| p.request_id == call.request_id
            && matches!(
                p.event.as_ref().and_then(|e| e.payload.as_ref()),
                Some(P::ToolCallRequested(_))
            )),
        "{pending:?}"
    );
    // A subscriber arriving late gets it again.
    let mut late = subscribe(&mut a, &s.id, call_seq, false).await;
    let mut sl = Vec::new();
    let again = read_until(&mut late, &mut sl, "redelivered call", |e| {
        matches!(e.payload, Some(P::ToolCallRequested(_)))
    })
    .await;
    assert!(again.redelivered);

    let won = b
        .respond_to_tool_call(as_client(
            "bob",
            pb::RespondToToolCallRequest {
                session_id: s.id.clone(),
                request_id: call.request_id.clone(),
                content: vec![text_block("TICKET-T7: open, printer on fire")],
                is_error: false,
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let resolved = won.resolved.unwrap();
    assert_eq!(resolved.resolved_by, "client:bob");
    assert_eq!(resolved.resolution(), pb::Resolution::Answered);
    assert!(won.seq > 0);
    let late = a
        .respond_to_tool_call(as_client(
            "alice",
            pb::RespondToToolCallRequest {
                session_id: s.id.clone(),
                request_id: call.request_id.clone(),
                content: vec![text_block("too late")],
                is_error: false,
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(late.code(), tonic::Code::FailedPrecondition, "{late:?}");
    assert!(late.message().contains("client:bob"), "{}", late.message());

    let r = await_resolved(&mut ea, &mut sa).await;
    assert_eq!(r.resolved_by, "client:bob");
    read_until(&mut ea, &mut sa, "the model's answer", |e| {
        assistant_text(e) == Some("Ticket handled.")
    })
    .await;
    read_until(&mut ea, &mut sa, "turn end", is_turn_completed).await;
    let (content, is_error) = tool_result_seen(&world).expect("the model got the tool result");
    assert!(content.contains("printer on fire"), "{content}");
    assert!(!content.contains("too late"), "{content}");
    assert!(!is_error);

    // The feed has the pending call (FEED_KIND_TOOL_CALL_PENDING) and its resolution.
    let mut feed = a
        .watch_sessions(pb::WatchSessionsRequest {
            follow: false,
            kinds: vec![
                pb::FeedKind::ToolCallPending as i32,
                pb::FeedKind::Resolved as i32,
            ],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut items = Vec::new();
    while let Some(i) = feed.message().await.unwrap() {
        items.push(i);
    }
    let kinds: Vec<(pb::FeedKind, Option<&P>)> = items
        .iter()
        .map(|i| (i.kind(), i.event.as_ref().and_then(|e| e.payload.as_ref())))
        .collect();
    assert!(
        matches!(
            kinds.as_slice(),
            [
                (pb::FeedKind::ToolCallPending, Some(P::ToolCallRequested(_))),
                (pb::FeedKind::Resolved, Some(P::ToolCallResolved(_)))
            ]
        ),
        "{items:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn answered_by_second_client_2_1_330() {
    answered_by_second_client(NEW).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn answered_by_second_client_2_0_77() {
    answered_by_second_client(OLDEST_2_0).await;
}

/// `ostler ARGS` as a client of `daemon` (no terminal): exit code and stdout.
async fn ostler(world: &World, daemon: &Daemon, args: &[&str]) -> (Option<i32>, String) {
    let mut cmd = std::process::Command::new(OSTLER);
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", &world.home)
        .env("OSTLER_ADDR", daemon.addr.to_string())
        .env("OSTLER_CONFIG", &world.config)
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null());
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Without `allowed_tools` the CLI asks permission for the client-hosted tool like for any
/// tool; then an error result (given with `ostler tool-result --error`) reaches the model
/// as a failed tool call; bad answers are refused with INVALID_ARGUMENT naming the field.
async fn error_result(release: &str) {
    let world = world(release).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_with(&mut c, &world, 0, false, Default::default()).await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "Look up ticket T-7").await;
    let ev = read_until(&mut events, &mut seen, "permission prompt", |e| {
        matches!(
            e.payload,
            Some(P::PermissionRequested(_) | P::ToolCallRequested(_))
        )
    })
    .await;
    let Some(P::PermissionRequested(p)) = ev.payload else {
        panic!("the tool ran without asking: {}", describe(&ev))
    };
    assert_eq!(p.tool_name, "mcp__tickets__lookup_ticket");
    c.respond_to_permission(pb::RespondToPermissionRequest {
        session_id: s.id.clone(),
        request_id: p.request_id.clone(),
        decision: Some(pb::respond_to_permission_request::Decision::Allow(
            pb::PermissionAllow::default(),
        )),
    })
    .await
    .unwrap();
    let call = await_call(&mut events, &mut seen).await;
    // `ostler pending` shows it.
    let (code, out) = ostler(&world, &daemon, &["pending", "--json"]).await;
    assert_eq!(code, Some(0), "{out}");
    let listed: serde_json::Value = serde_json::from_str(out.lines().next().unwrap_or("")).unwrap();
    assert_eq!(listed["kind"], "tool_call", "{out}");
    assert_eq!(listed["request_id"], call.request_id.as_str(), "{out}");
    let bad = c
        .respond_to_tool_call(pb::RespondToToolCallRequest {
            session_id: s.id.clone(),
            request_id: call.request_id.clone(),
            content: vec![pb::ToolContent {
                block: Some(pb::tool_content::Block::Json("[1]".into())),
            }],
            is_error: false,
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    assert!(
        bad.message().contains("content[0].json"),
        "{}",
        bad.message()
    );
    let missing = c
        .respond_to_tool_call(pb::RespondToToolCallRequest {
            session_id: s.id.clone(),
            request_id: "no-such-call".into(),
            content: vec![text_block("x")],
            is_error: false,
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound, "{missing:?}");
    let prefix: String = call.request_id.chars().take(8).collect();
    let (code, out) = ostler(
        &world,
        &daemon,
        &[
            "tool-result",
            &prefix,
            "--error",
            "no ticket T-7 in the tracker",
            "--json",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "{out}");
    let answered: serde_json::Value =
        serde_json::from_str(out.lines().next().unwrap_or("")).unwrap();
    assert_eq!(answered["is_error"], true, "{out}");
    let r = await_resolved(&mut events, &mut seen).await;
    assert!(r.is_error);
    assert_eq!(r.resolution(), pb::Resolution::Answered);
    read_until(&mut events, &mut seen, "turn end", is_turn_completed).await;
    // Answered already: the client says so.
    let (code, out) = ostler(
        &world,
        &daemon,
        &["tool-result", &call.request_id, "--text", "x"],
    )
    .await;
    assert_ne!(code, Some(0), "{out}");
    let (content, is_error) = tool_result_seen(&world).expect("the model got the tool result");
    assert!(content.contains("no ticket T-7"), "{content}");
    assert!(is_error, "an error result: {content}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn error_result_2_1_330() {
    error_result(NEW).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn error_result_2_0_77() {
    error_result(OLDEST_2_0).await;
}

/// Nobody answers within the server's timeout: the CLI gets an error result and the turn
/// goes on.
async fn expiry(release: &str) {
    let world = world(release).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create(&mut c, &world, 1).await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "Look up ticket T-7").await;
    let call = await_call(&mut events, &mut seen).await;
    let r = await_resolved(&mut events, &mut seen).await;
    assert_eq!(r.request_id, call.request_id);
    assert_eq!(r.resolution(), pb::Resolution::Expired);
    assert_eq!(r.resolved_by, "expiry");
    assert!(r.is_error);
    read_until(&mut events, &mut seen, "the turn goes on", |e| {
        assistant_text(e) == Some("Ticket handled.")
    })
    .await;
    read_until(&mut events, &mut seen, "turn end", is_turn_completed).await;
    let (content, is_error) = tool_result_seen(&world).expect("the model got the tool result");
    assert!(content.contains("no client answered"), "{content}");
    assert!(is_error);
    let late = c
        .respond_to_tool_call(pb::RespondToToolCallRequest {
            session_id: s.id.clone(),
            request_id: call.request_id.clone(),
            content: vec![text_block("late")],
            is_error: false,
        })
        .await
        .unwrap_err();
    assert_eq!(late.code(), tonic::Code::FailedPrecondition, "{late:?}");
    assert!(late.message().contains("expiry"), "{}", late.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expiry_2_1_330() {
    expiry(NEW).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expiry_2_0_77() {
    expiry(OLDEST_2_0).await;
}

/// How the CLI gives up on a tool call in [`withdrawn_by_the_cli`].
#[derive(Clone, Copy)]
enum GivesUp {
    /// Its own `MCP_TOOL_TIMEOUT` (set in the session's environment): the turn goes on.
    Timeout,
    /// A client's `Interrupt`: the turn ends.
    Interrupt,
}

/// The CLI withdraws a pending call with an MCP `notifications/cancelled` (not a
/// `control_cancel_request`): the call is closed at once by `cli`, before the turn ends,
/// not left for a client to answer into nothing.
async fn withdrawn_by_the_cli(release: &str, how: GivesUp) {
    // The answer after the CLI's own error result waits until the test saw the call
    // closed: 2.1.332 sends its notice after that error result, and could otherwise end
    // the turn first on a busy machine.
    let world = World::with_scenario(
        release,
        &format!("{SCENARIO}\n{}", script(Some("resolved"))),
    )
    .await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let mut env = std::collections::HashMap::new();
    if let GivesUp::Timeout = how {
        env.insert("MCP_TOOL_TIMEOUT".to_owned(), "1000".to_owned());
    }
    // Far longer than the test: only the CLI can close the call.
    let s = create_with(&mut c, &world, 3600, true, env).await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "Look up ticket T-7").await;
    let call = await_call(&mut events, &mut seen).await;
    if let GivesUp::Interrupt = how {
        c.interrupt(pb::InterruptRequest {
            session_id: s.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    let ev = read_until(
        &mut events,
        &mut seen,
        "the call closed or the turn ended",
        |e| matches!(e.payload, Some(P::ToolCallResolved(_))) || is_turn_completed(e),
    )
    .await;
    let Some(P::ToolCallResolved(r)) = ev.payload else {
        panic!(
            "the turn ended with the call still pending: {:?}",
            seen.iter().map(describe).collect::<Vec<_>>()
        )
    };
    assert_eq!(r.request_id, call.request_id);
    assert_eq!(r.resolution(), pb::Resolution::Cancelled);
    assert_eq!(r.resolved_by, "cli");
    assert!(r.is_error);
    let why: Vec<&str> = r
        .content
        .iter()
        .filter_map(|b| match &b.block {
            Some(pb::tool_content::Block::Text(t)) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    assert!(
        why.iter().any(|t| t.contains("withdrawn by the CLI")),
        "{why:?}"
    );
    nothing_left_to_answer(&mut c, &s.id, &call.request_id).await;
    if let GivesUp::Timeout = how {
        world.fake.signal("resolved");
        read_until(&mut events, &mut seen, "the turn goes on", |e| {
            assistant_text(e) == Some("Ticket handled.")
        })
        .await;
        let (content, is_error) =
            tool_result_seen(&world).expect("the model got the CLI's own error result");
        assert!(content.contains("timed out"), "{content}");
        assert!(is_error);
    }
    read_until(&mut events, &mut seen, "turn end", is_turn_completed).await;
    // Closed once: the turn's end found nothing more to close.
    let closed = seen
        .iter()
        .filter(|e| matches!(e.payload, Some(P::ToolCallResolved(_))))
        .count();
    assert_eq!(
        closed,
        1,
        "{:?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn withdrawn_by_the_cli_on_its_timeout_2_1_330() {
    withdrawn_by_the_cli(NEW, GivesUp::Timeout).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn withdrawn_by_the_cli_on_its_timeout_2_0_77() {
    withdrawn_by_the_cli(OLDEST_2_0, GivesUp::Timeout).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn withdrawn_by_the_cli_on_an_interrupt_2_1_330() {
    withdrawn_by_the_cli(NEW, GivesUp::Interrupt).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn withdrawn_by_the_cli_on_an_interrupt_2_0_77() {
    withdrawn_by_the_cli(OLDEST_2_0, GivesUp::Interrupt).await;
}

/// kill -9 of the daemon with a tool call pending; the new daemon resolves it with an
/// error result by `restart`, and the resumed session (tool server registered again) goes on.
async fn kill9_with_call_pending(release: &str) {
    let world = world(release).await;
    let mut daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create(&mut c, &world, 0).await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "Hello there.").await;
    read_until(&mut events, &mut seen, "first turn end", is_turn_completed).await;
    send(&mut c, &s.id, "Look up ticket T-7").await;
    let call = await_call(&mut events, &mut seen).await;
    daemon.kill9();
    drop(events);

    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let history = history(&mut c, &s.id).await;
    assert_gap_free(&history, 1);
    let resolved = history
        .iter()
        .find_map(|e| match &e.payload {
            Some(P::ToolCallResolved(r)) if r.request_id == call.request_id => Some(r.clone()),
            _ => None,
        })
        .unwrap_or_else(|| {
            panic!(
                "resolved at restart: {:#?}",
                history.iter().map(describe).collect::<Vec<_>>()
            )
        });
    assert_eq!(resolved.resolved_by, "restart");
    assert!(resolved.is_error);
    assert_eq!(resolved.resolution(), pb::Resolution::Cancelled);
    nothing_left_to_answer(&mut c, &s.id, &call.request_id).await;

    let last = history.last().map(|e| e.seq).unwrap_or_default();
    c.resume_session(pb::ResumeSessionRequest {
        session_id: s.id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let mut events = subscribe(&mut c, &s.id, last, false).await;
    let mut seen = Vec::new();
    // The tool server is registered again: a new call reaches the clients.
    send(&mut c, &s.id, "Look up ticket T-7 again").await;
    let again = await_call(&mut events, &mut seen).await;
    assert_ne!(again.request_id, call.request_id);
    c.respond_to_tool_call(pb::RespondToToolCallRequest {
        session_id: s.id.clone(),
        request_id: again.request_id.clone(),
        content: vec![text_block("TICKET-T7 after restart")],
        is_error: false,
    })
    .await
    .unwrap();
    read_until(&mut events, &mut seen, "turn end", is_turn_completed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_with_call_pending_2_1_330() {
    kill9_with_call_pending(NEW).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_with_call_pending_2_0_77() {
    kill9_with_call_pending(OLDEST_2_0).await;
}

/// Bad declarations are INVALID_ARGUMENT naming the field; a release without SDK MCP
/// servers refuses tool servers at once with FAILED_PRECONDITION naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refused_declarations() {
    let world = world(WITHOUT_SDK_MCP).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let mut bad = tickets(0);
    bad.tools[0].input_schema_json = "[1]".into();
    let e = c
        .create_session(pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            tool_servers: vec![bad],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(
        e.message()
            .contains("tool_servers[0].tools[0].input_schema_json"),
        "{}",
        e.message()
    );
    let e = c
        .create_session(pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            tool_servers: vec![tickets(0)],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains(WITHOUT_SDK_MCP), "{}", e.message());
    assert!(e.message().contains("tool_servers"), "{}", e.message());
    let sessions = c
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sessions;
    assert!(sessions.is_empty(), "nothing was created: {sessions:?}");
}
