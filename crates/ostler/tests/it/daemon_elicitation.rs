//! gRPC acceptance of elicitations against the real CLI and the fake model server: an MCP
//! server of the session (the test kit's `ostler-test-mcp`) asks the user for input in the
//! middle of its tool call (MCP `elicitation/create`); the CLI passes the question on as
//! its `elicitation` control request, and ostler makes it a pending interaction that a
//! client answers with RespondToElicitation. The answer (accept with content, decline)
//! reaches the MCP server and so the model; an interrupt withdraws a pending one; bad
//! answers are refused without reaching the CLI; a late answer names who answered.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error

use crate::common;

use common::grpc::*;
use common::*;
use ostler_proto::v1 as pb;
use pb::session_event::Payload as P;

/// 2.1.120 and later offer elicitation to MCP servers (2.1.0, 2.0.77 and 1.0.x answer the
/// server "method not found" themselves, measured).
const NEW: &str = "2.1.332";

/// Later tickets first: a `tool_result_for` rule matches any later request of the session
/// too (the result stays in the history), so each ticket's rules come before the earlier
/// tickets'.
const SCENARIO: &str = r#"
[[model]]
name = "after T-5"
when = { tool_result_for = "toolu_elicit_5" }
blocks = [{ type = "text", text = "Ticket T-5 is settled." }]
[[model]]
name = "close T-5"
when = { last_user_text_contains = "Close ticket T-5", stream = true }
blocks = [
  { type = "tool_use", id = "toolu_elicit_5", name = "mcp__tickets__confirm_ticket", input = { ticket = "T-5" } },
]

[[model]]
name = "after T-4"
when = { tool_result_for = "toolu_elicit_4" }
blocks = [{ type = "text", text = "Ticket T-4 is settled." }]
[[model]]
name = "close T-4"
when = { last_user_text_contains = "Close ticket T-4", stream = true }
blocks = [
  { type = "tool_use", id = "toolu_elicit_4", name = "mcp__tickets__confirm_ticket", input = { ticket = "T-4", url = "https://sso.example.test/login" } },
]

[[model]]
name = "after T-3"
when = { tool_result_for = "toolu_elicit_3" }
blocks = [{ type = "text", text = "Ticket T-3 is settled." }]
[[model]]
name = "close T-3"
when = { last_user_text_contains = "Close ticket T-3", stream = true }
blocks = [
  { type = "tool_use", id = "toolu_elicit_3", name = "mcp__tickets__confirm_ticket", input = { ticket = "T-3" } },
]

[[model]]
name = "after T-2"
when = { tool_result_for = "toolu_elicit_2" }
blocks = [{ type = "text", text = "Ticket T-2 is settled." }]
[[model]]
name = "close T-2"
when = { last_user_text_contains = "Close ticket T-2", stream = true }
blocks = [
  { type = "tool_use", id = "toolu_elicit_2", name = "mcp__tickets__confirm_ticket", input = { ticket = "T-2", url = "https://sso.example.test/login" } },
]

[[model]]
name = "after T-1"
when = { tool_result_for = "toolu_elicit_1" }
blocks = [{ type = "text", text = "Ticket T-1 is settled." }]
[[model]]
name = "close T-1"
when = { last_user_text_contains = "Close ticket T-1", stream = true }
blocks = [
  { type = "tool_use", id = "toolu_elicit_1", name = "mcp__tickets__confirm_ticket", input = { ticket = "T-1" } },
]
"#;

fn elicitation(e: &pb::SessionEvent) -> Option<&pb::ElicitationRequested> {
    match &e.payload {
        Some(P::ElicitationRequested(r)) => Some(r),
        _ => None,
    }
}

/// Reads events until the next ElicitationRequested.
async fn await_elicitation(
    events: &mut Events,
    seen: &mut Vec<pb::SessionEvent>,
    what: &str,
) -> pb::ElicitationRequested {
    let ev = read_until(events, seen, what, |e| elicitation(e).is_some()).await;
    elicitation(&ev).cloned().unwrap_or_default()
}

fn resolved(e: &pb::SessionEvent) -> Option<&pb::ElicitationResolved> {
    match &e.payload {
        Some(P::ElicitationResolved(r)) => Some(r),
        _ => None,
    }
}

fn respond(
    client: &str,
    session_id: &str,
    request_id: &str,
    action: pb::ElicitationAction,
    content_json: &str,
) -> tonic::Request<pb::RespondToElicitationRequest> {
    as_client(
        client,
        pb::RespondToElicitationRequest {
            session_id: session_id.into(),
            request_id: request_id.into(),
            action: action as i32,
            content_json: content_json.into(),
        },
    )
}

type Client =
    ostler_proto::v1::session_service_client::SessionServiceClient<tonic::transport::Channel>;

/// A session with the test kit's MCP server as `tickets`, its eliciting tool allowed.
async fn create(c: &mut Client, world: &World) -> pb::Session {
    create_with(c, world, false).await
}

/// [`create`], with `decline_elicitations` as given.
async fn create_with(c: &mut Client, world: &World, decline_elicitations: bool) -> pb::Session {
    c.create_session(pb::CreateSessionRequest {
        cwd: world.work.display().to_string(),
        mcp_servers: tickets_server().await,
        allowed_tools: vec!["mcp__tickets__confirm_ticket".into()],
        decline_elicitations,
        ..Default::default()
    })
    .await
    .unwrap()
    .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn elicitations_are_answered_by_clients_2_1_332() {
    let world = World::with_scenario(NEW, SCENARIO).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create(&mut c, &world).await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();

    // A form: the server asks why; a client accepts with a reason.
    send(&mut c, &s.id, "Close ticket T-1 please.").await;
    let asked = await_elicitation(&mut events, &mut seen, "the first elicitation").await;
    assert_eq!(asked.mcp_server_name, "tickets");
    assert_eq!(asked.message, "Close ticket T-1?");
    assert_eq!(asked.mode, "form");
    let schema: serde_json::Value = serde_json::from_str(&asked.requested_schema_json).unwrap();
    assert_eq!(
        schema["required"],
        serde_json::json!(["reason"]),
        "{schema}"
    );
    let request: serde_json::Value = serde_json::from_str(&asked.request_json).unwrap();
    assert_eq!(request["subtype"], "elicitation", "{request}");
    // Listed as pending, and the session waits on a client.
    let pending = pending_interactions(&mut c).await;
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0].request_id, asked.request_id);
    assert_eq!(
        session(&mut c, &s.id).await.state(),
        pb::SessionState::AwaitingPermission
    );

    // Answers without meaning are refused before the CLI sees them.
    for (id, action, content, code, needle) in [
        (
            &asked.request_id,
            pb::ElicitationAction::Unspecified,
            "",
            tonic::Code::InvalidArgument,
            "action: required",
        ),
        (
            &asked.request_id,
            pb::ElicitationAction::Decline,
            r#"{"reason":"x"}"#,
            tonic::Code::InvalidArgument,
            "only an ACCEPT carries content",
        ),
        (
            &asked.request_id,
            pb::ElicitationAction::Accept,
            r#"["duplicate"]"#,
            tonic::Code::InvalidArgument,
            "content_json: must be a JSON object",
        ),
        (
            &"no-such-request".to_owned(),
            pb::ElicitationAction::Cancel,
            "",
            tonic::Code::NotFound,
            "no-such-request",
        ),
    ] {
        assert_refused(
            c.respond_to_elicitation(respond("c", &s.id, id, action, content))
                .await,
            code,
            needle,
        );
    }

    // Answered as another kind of interaction: refused, naming what it is.
    assert_refused(
        c.respond_to_tool_call(pb::RespondToToolCallRequest {
            session_id: s.id.clone(),
            request_id: asked.request_id.clone(),
            is_error: true,
            ..Default::default()
        })
        .await,
        tonic::Code::FailedPrecondition,
        "is a pending elicitation, not a tool call",
    );

    let done = c
        .respond_to_elicitation(respond(
            "phone",
            &s.id,
            &asked.request_id,
            pb::ElicitationAction::Accept,
            r#"{"reason": "duplicate of T-0"}"#,
        ))
        .await
        .unwrap()
        .into_inner();
    let r = done.resolved.unwrap();
    assert_eq!(r.resolution(), pb::Resolution::Answered);
    assert_eq!(r.action(), pb::ElicitationAction::Accept);
    assert_eq!(r.resolved_by, "client:phone");
    assert!(done.seq > asked_seq(&seen, &asked.request_id));
    // The first answer won: a second one names who answered.
    assert_refused(
        c.respond_to_elicitation(respond(
            "laptop",
            &s.id,
            &asked.request_id,
            pb::ElicitationAction::Decline,
            "",
        ))
        .await,
        tonic::Code::FailedPrecondition,
        "client:phone",
    );
    read_until(
        &mut events,
        &mut seen,
        "the first turn's end",
        is_turn_completed,
    )
    .await;
    assert!(
        world.model_saw(r#"elicitation for T-1: {\"action\":\"accept\",\"content\":{\"reason\":\"duplicate of T-0\"}}"#),
        "the MCP server got the answer, and the model its tool result"
    );
    assert!(
        seen.iter().any(|e| resolved(e).is_some_and(
            |r| r.request_id == asked.request_id && r.content_json.contains("duplicate of T-0")
        )),
        "every subscriber sees the resolution with its content"
    );

    // A URL elicitation; an interrupt withdraws it (the CLI cancels its request).
    send(&mut c, &s.id, "Close ticket T-2 please.").await;
    let url = await_elicitation(&mut events, &mut seen, "the URL elicitation").await;
    assert_eq!(url.mode, "url");
    assert_eq!(url.url, "https://sso.example.test/login");
    assert!(!url.elicitation_id.is_empty(), "{url:?}");
    c.interrupt(pb::InterruptRequest {
        session_id: s.id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let ev = read_until(&mut events, &mut seen, "the withdrawal", |e| {
        resolved(e).is_some_and(|r| r.request_id == url.request_id)
    })
    .await;
    let r = resolved(&ev).unwrap();
    assert_eq!(r.resolution(), pb::Resolution::Cancelled, "{r:?}");
    assert_eq!(r.action(), pb::ElicitationAction::Cancel);
    assert_eq!(r.resolved_by, "cli");
    read_until(
        &mut events,
        &mut seen,
        "the interrupted turn's end",
        is_turn_completed,
    )
    .await;
    assert!(pending_interactions(&mut c).await.is_empty());

    // A decline reaches the server as a decline.
    send(&mut c, &s.id, "Close ticket T-3 please.").await;
    let third = await_elicitation(&mut events, &mut seen, "the third elicitation").await;
    // Answered with the terminal client, by a prefix of the id.
    let prefix: String = third.request_id.chars().take(8).collect();
    let out = ostler(
        &world,
        &daemon,
        &["elicitation", &prefix, "--decline", "--json"],
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let said: serde_json::Value =
        serde_json::from_slice(out.stdout.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(
        (said["action"].as_str(), said["request_id"].as_str()),
        (Some("decline"), Some(third.request_id.as_str())),
        "{said}"
    );
    read_until(
        &mut events,
        &mut seen,
        "the third turn's end",
        is_turn_completed,
    )
    .await;
    assert!(
        world.model_saw(r#"elicitation for T-3: {\"action\":\"decline\"}"#),
        "the decline reached the MCP server"
    );

    // A URL elicitation accepted: the server reports the user done at the URL, and the
    // CLI's `system/elicitation_complete` reaches clients typed, naming its id.
    send(&mut c, &s.id, "Close ticket T-4 please.").await;
    let url = await_elicitation(&mut events, &mut seen, "the second URL elicitation").await;
    c.respond_to_elicitation(respond(
        "c",
        &s.id,
        &url.request_id,
        pb::ElicitationAction::Accept,
        "",
    ))
    .await
    .unwrap();
    let ev = read_until(&mut events, &mut seen, "the completion", |e| {
        matches!(&e.payload, Some(P::ElicitationCompleted(_)))
    })
    .await;
    let Some(P::ElicitationCompleted(done)) = &ev.payload else {
        unreachable!()
    };
    assert_eq!(
        (done.mcp_server_name.as_str(), done.elicitation_id.as_str()),
        ("tickets", url.elicitation_id.as_str()),
        "{done:?}"
    );
    assert!(
        done.fields_json.contains("elicitation_complete"),
        "{done:?}"
    );
    assert!(
        asked_seq(&seen, &url.request_id) < ev.seq,
        "reported after it was asked"
    );
    read_until(
        &mut events,
        &mut seen,
        "the fourth turn's end",
        is_turn_completed,
    )
    .await;
    assert!(world.model_saw(r#"elicitation for T-4: {\"action\":\"accept\"}"#));
    // Read back, it is the same typed event.
    let stored = history(&mut c, &s.id).await;
    assert_eq!(
        stored.iter().find(|e| e.seq == ev.seq),
        Some(&ev),
        "read back as it was sent"
    );
    assert_gap_free(&seen, 1);
    assert_eq!(session(&mut c, &s.id).await.state(), pb::SessionState::Idle);
}

/// Nobody answers: the elicitation is cancelled at the permission expiry
/// (`sessions.permission_expiry_secs`) and the server hears `cancel`. One pending when the
/// daemon is killed (-9) is closed by `restart` when the next daemon starts, and the
/// session resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn elicitations_expire_and_close_at_a_restart_2_1_332() {
    let world = World::with_scenario(NEW, SCENARIO).await;
    let expiry = ostler_testkit::timeouts::secs(2)
        .as_secs()
        .max(1)
        .to_string();
    let mut daemon = world
        .daemon_with_env(&[], &[("OSTLER_SESSIONS__PERMISSION_EXPIRY_SECS", &expiry)])
        .await;
    let mut c = daemon.sessions().await;
    let s = create(&mut c, &world).await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();

    send(&mut c, &s.id, "Close ticket T-1 please.").await;
    let asked = await_elicitation(&mut events, &mut seen, "the elicitation").await;
    assert!(asked.expires_at_ms > 0, "{asked:?}");
    let ev = read_until(&mut events, &mut seen, "the expiry", |e| {
        resolved(e).is_some()
    })
    .await;
    let r = resolved(&ev).unwrap();
    assert_eq!(r.request_id, asked.request_id);
    assert_eq!(r.resolution(), pb::Resolution::Expired, "{r:?}");
    assert_eq!(
        (r.action(), r.resolved_by.as_str()),
        (pb::ElicitationAction::Cancel, "expiry")
    );
    read_until(&mut events, &mut seen, "the turn's end", is_turn_completed).await;
    assert!(world.model_saw(r#"elicitation for T-1: {\"action\":\"cancel\"}"#));

    send(&mut c, &s.id, "Close ticket T-3 please.").await;
    let left = await_elicitation(&mut events, &mut seen, "the second elicitation").await;
    daemon.kill9();
    drop(events);

    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let history = history(&mut c, &s.id).await;
    assert_gap_free(&history, 1);
    let closed = history
        .iter()
        .find_map(|e| resolved(e).filter(|r| r.request_id == left.request_id))
        .unwrap_or_else(|| {
            panic!(
                "closed at the restart: {:#?}",
                history.iter().map(describe).collect::<Vec<_>>()
            )
        });
    assert_eq!(closed.resolution(), pb::Resolution::Cancelled);
    assert_eq!(closed.resolved_by, "restart");
    assert!(pending_interactions(&mut c).await.is_empty());
    assert_refused(
        c.respond_to_elicitation(respond(
            "c",
            &s.id,
            &left.request_id,
            pb::ElicitationAction::Decline,
            "",
        ))
        .await,
        tonic::Code::FailedPrecondition,
        "restart",
    );
    c.resume_session(pb::ResumeSessionRequest {
        session_id: s.id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let last = history.last().map(|e| e.seq).unwrap_or_default();
    let mut events = subscribe(&mut c, &s.id, last, false).await;
    let mut seen = Vec::new();
    // Another ticket than the one the kill cut short: its tool call (the same id again)
    // would leave the model's rules to tell two calls apart.
    send(&mut c, &s.id, "Close ticket T-5 please.").await;
    let again = await_elicitation(&mut events, &mut seen, "an elicitation after the restart").await;
    // The terminal client fills the form's field.
    let out = ostler(
        &world,
        &daemon,
        &[
            "elicitation",
            &again.request_id,
            "--accept",
            "--field",
            "reason=after the restart",
        ],
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let ev = read_until(&mut events, &mut seen, "the resolution", |e| {
        resolved(e).is_some()
    })
    .await;
    assert_eq!(
        resolved(&ev).unwrap().content_json,
        r#"{"reason":"after the restart"}"#
    );
    // The end of this turn, the model's answer to the tool's result: the CLI may first end
    // the turn the kill cut short (its tool call never answered), seen under load.
    read_until(
        &mut events,
        &mut seen,
        "the resumed turn's end",
        |e| matches!(&e.payload, Some(P::TurnCompleted(t)) if t.result.contains("T-5 is settled")),
    )
    .await;
    assert!(world.model_saw("after the restart"));
}

/// A session made with `decline_elicitations` answers each elicitation DECLINE at once,
/// as the Agent SDKs do without onElicitation: recorded, never pending, the session never
/// waits on a client; still so after a stop and resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_session_can_decline_every_elicitation_2_1_332() {
    let world = World::with_scenario(NEW, SCENARIO).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_with(&mut c, &world, true).await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "Close ticket T-1 please.").await;
    read_until(&mut events, &mut seen, "the turn's end", is_turn_completed).await;
    let asked = seen
        .iter()
        .find_map(elicitation)
        .expect("the elicitation is recorded")
        .clone();
    let r = seen
        .iter()
        .find_map(|e| resolved(e).filter(|r| r.request_id == asked.request_id))
        .expect("and its answer");
    assert_eq!(r.action(), pb::ElicitationAction::Decline);
    assert_eq!(
        (r.resolution(), r.resolved_by.as_str()),
        (pb::Resolution::Answered, "policy")
    );
    assert!(world.model_saw(r#"elicitation for T-1: {\"action\":\"decline\"}"#));
    assert!(
        !seen.iter().any(|e| matches!(&e.payload,
            Some(P::StateChanged(c)) if c.to() == pb::SessionState::AwaitingPermission)),
        "the session never waited: {:#?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );
    assert!(pending_interactions(&mut c).await.is_empty());

    // Kept across a stop and resume, like the other session options.
    stop_and_resume(&mut c, &s.id).await;
    let last = seen.last().map(|e| e.seq).unwrap_or_default();
    let mut events = subscribe(&mut c, &s.id, last, false).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "Close ticket T-3 please.").await;
    let ev = read_until(&mut events, &mut seen, "the answer after the resume", |e| {
        resolved(e).is_some()
    })
    .await;
    assert_eq!(resolved(&ev).unwrap().resolved_by, "policy");
    read_until(
        &mut events,
        &mut seen,
        "the resumed turn's end",
        is_turn_completed,
    )
    .await;
    assert!(world.model_saw(r#"elicitation for T-3: {\"action\":\"decline\"}"#));
}

/// `ostler ARGS` as a client of `daemon` (no terminal).
async fn ostler(world: &World, daemon: &Daemon, args: &[&str]) -> std::process::Output {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let mut cmd = client_command(world, &daemon.addr.to_string(), &args);
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().unwrap();
    tokio::task::spawn_blocking(move || wait_output(child))
        .await
        .unwrap()
}

/// The seq of the ElicitationRequested event of `request_id`.
fn asked_seq(seen: &[pb::SessionEvent], request_id: &str) -> u64 {
    seen.iter()
        .find(|e| elicitation(e).is_some_and(|r| r.request_id == request_id))
        .map(|e| e.seq)
        .unwrap_or_default()
}
