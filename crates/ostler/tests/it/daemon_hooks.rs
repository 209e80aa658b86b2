//! gRPC acceptance of remote hooks (issue 11) against the real CLI and the fake model
//! server: a PreToolUse hook pending for two clients is answered by the second, the first
//! client's late answer is refused; a denying hook keeps the tool from running and its
//! reason reaches the model; a UserPromptSubmit hook's additional context reaches the
//! model; an unanswered hook takes its registration's default at expiry; a hook pending
//! when the daemon is killed (-9) is answered with its default at the restart and the
//! session resumes; a release that does not call hooks refuses CreateSession with hooks;
//! a queued message whose UserPromptSubmit hook a client answers late is not given up;
//! 2.1.332's PermissionRequest hook answers the permission prompt and its PostToolBatch
//! hook adds context; events a release does not know are refused at CreateSession.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error

use crate::common;

use common::grpc::*;
use common::*;
use ostler_proto::v1 as pb;
use ostler_proto::v1::session_service_client::SessionServiceClient;
use pb::session_event::Payload as P;
use tonic::transport::Channel;

const NEW: &str = "2.1.332";
const V2_0: &str = "2.0.77";
/// Measured: does not answer `initialize`, never calls hooks.
const NO_HOOKS: &str = "1.0.59";

const HOOKS_SCENARIO: &str = r#"
[[model]]
name = "after tool"
when = { tool_result_for = "toolu_touch_h" }
blocks = [{ type = "text", text = "Understood, the file question is settled." }]

[[model]]
name = "use tool"
when = { last_user_text_contains = "Create the file hooked.txt", stream = true }
blocks = [
  { type = "text", text = "I will create the file." },
  { type = "tool_use", id = "toolu_touch_h", name = "Bash", input = { command = "touch hooked.txt", description = "Create hooked.txt" } },
]

[[model]]
name = "hello"
when = { last_user_text_contains = "Say hello", stream = true }
blocks = [{ type = "text", text = "Hello from the fake model!" }]
"#;

type Client = SessionServiceClient<Channel>;

fn pre_tool_use(
    default: pb::HookDecision,
    reason: &str,
    timeout_secs: u32,
) -> pb::HookRegistration {
    pb::HookRegistration {
        id: "policy".into(),
        event: "PreToolUse".into(),
        matcher: "Bash".into(),
        timeout_secs,
        default_decision: default as i32,
        default_reason: reason.into(),
        ..Default::default()
    }
}

async fn create_with_hooks(
    c: &mut Client,
    world: &World,
    hooks: Vec<pb::HookRegistration>,
) -> Result<pb::Session, tonic::Status> {
    c.create_session(as_client(
        "creator",
        pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            hooks,
            ..Default::default()
        },
    ))
    .await
    .map(|r| r.into_inner())
}

fn hook_requested(e: &pb::SessionEvent) -> Option<&pb::HookRequested> {
    match &e.payload {
        Some(P::HookRequested(h)) => Some(h),
        _ => None,
    }
}

fn hook_resolved(e: &pb::SessionEvent) -> Option<&pb::HookResolved> {
    match &e.payload {
        Some(P::HookResolved(h)) => Some(h),
        _ => None,
    }
}

fn respond(
    client: &str,
    session_id: &str,
    request_id: &str,
    decision: pb::HookDecision,
    reason: &str,
) -> tonic::Request<pb::RespondToHookRequest> {
    as_client(
        client,
        pb::RespondToHookRequest {
            session_id: session_id.into(),
            request_id: request_id.into(),
            decision: decision as i32,
            reason: reason.into(),
            ..Default::default()
        },
    )
}

/// Two clients see the pending PreToolUse hook; a decision PreToolUse does not take is
/// INVALID_ARGUMENT; the second client denies it; the first client's late answer is
/// FAILED_PRECONDITION naming the second; the tool did not run and the model got the
/// reason.
async fn second_client_denies(release: &str) {
    let world = World::with_scenario(release, HOOKS_SCENARIO).await;
    let daemon = world.daemon(&[]).await;
    let mut a = daemon.sessions().await;
    let mut b = daemon.sessions().await;
    let s = create_with_hooks(
        &mut a,
        &world,
        vec![pre_tool_use(pb::HookDecision::Continue, "", 600)],
    )
    .await
    .unwrap();
    let mut ea = subscribe(&mut a, &s.id, 0, false).await;
    let mut eb = subscribe(&mut b, &s.id, 0, false).await;
    let (mut sa, mut sb) = (Vec::new(), Vec::new());
    send(&mut a, &s.id, "Create the file hooked.txt please.").await;
    let ha = read_until(&mut ea, &mut sa, "hook (a)", |e| {
        hook_requested(e).is_some()
    })
    .await;
    let hb = read_until(&mut eb, &mut sb, "hook (b)", |e| {
        hook_requested(e).is_some()
    })
    .await;
    assert_eq!(ha.seq, hb.seq);
    let h = hook_requested(&ha).unwrap().clone();
    assert_eq!(h.hook_event, "PreToolUse");
    assert_eq!(h.registration_id, "policy");
    assert_eq!(h.tool_name, "Bash");
    assert_eq!(h.tool_use_id, "toolu_touch_h");
    let input: serde_json::Value = serde_json::from_str(&h.input_json).unwrap();
    assert_eq!(input["tool_input"]["command"], "touch hooked.txt");
    assert!(h.expires_at_ms > 0);

    // Pending: listed, the session awaits a client.
    let pending = pending_interactions(&mut a).await;
    assert!(
        pending
            .iter()
            .any(|p| p.request_id == h.request_id
                && p.event.as_ref().and_then(hook_requested).is_some()),
        "{pending:?}"
    );
    let got = a
        .get_session(pb::GetSessionRequest {
            session_id: s.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.state(), pb::SessionState::AwaitingPermission);

    // A subscriber that starts past the request gets it again, marked redelivered.
    let mut late_sub = subscribe(&mut b, &s.id, ha.seq, false).await;
    let again = tokio::time::timeout(guard(), late_sub.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(again.redelivered, "{again:?}");
    assert_eq!(again.seq, ha.seq);
    assert!(hook_requested(&again).is_some());
    drop(late_sub);
    // The daemon-wide feed lists it as HOOK_PENDING.
    let mut feed = a
        .watch_sessions(pb::WatchSessionsRequest {
            after_cursor: 0,
            follow: false,
            kinds: vec![pb::FeedKind::HookPending as i32],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut items = Vec::new();
    while let Some(item) = tokio::time::timeout(guard(), feed.message())
        .await
        .unwrap()
        .unwrap()
    {
        items.push(item);
    }
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0].kind(), pb::FeedKind::HookPending);
    assert_eq!(items[0].event.as_ref().map(|e| e.seq), Some(ha.seq));

    // A decision PreToolUse does not take.
    let err = a
        .respond_to_hook(respond(
            "a",
            &s.id,
            &h.request_id,
            pb::HookDecision::Block,
            "x",
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(
        err.message()
            .contains("decision: a PreToolUse hook does not take BLOCK"),
        "{}",
        err.message()
    );

    let reason = "HOOKDENY the policy service forbids touch";
    let won = b
        .respond_to_hook(respond(
            "b",
            &s.id,
            &h.request_id,
            pb::HookDecision::Deny,
            reason,
        ))
        .await
        .unwrap()
        .into_inner();
    let r = won.resolved.unwrap();
    assert_eq!(r.resolved_by, "client:b");
    assert_eq!(r.resolution(), pb::Resolution::Answered);
    assert_eq!(r.decision(), pb::HookDecision::Deny);
    let out: serde_json::Value = serde_json::from_str(&r.output_json).unwrap();
    assert_eq!(out["hookSpecificOutput"]["permissionDecision"], "deny");

    let late = a
        .respond_to_hook(respond(
            "a",
            &s.id,
            &h.request_id,
            pb::HookDecision::Allow,
            "",
        ))
        .await
        .unwrap_err();
    assert_eq!(late.code(), tonic::Code::FailedPrecondition, "{late:?}");
    assert!(
        late.message().contains("already answered by client:b"),
        "{}",
        late.message()
    );

    // Both clients see the resolution, then the turn ends.
    let ra = read_until(&mut ea, &mut sa, "resolved (a)", |e| {
        hook_resolved(e).is_some()
    })
    .await;
    assert_eq!(ra.seq, won.seq);
    read_until(&mut eb, &mut sb, "resolved (b)", |e| {
        hook_resolved(e).is_some()
    })
    .await;
    read_until(&mut ea, &mut sa, "turn end", is_turn_completed).await;
    assert!(
        !world.work.join("hooked.txt").exists(),
        "the denied tool must not run"
    );
    assert!(
        world.model_saw(reason),
        "the denial reason reaches the model"
    );
    assert!(
        !sa.iter()
            .any(|e| matches!(e.payload, Some(P::PermissionRequested(_)))),
        "a denying hook leaves nothing to ask"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn second_client_denies_2_1_330() {
    second_client_denies(NEW).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn second_client_denies_2_0_77() {
    second_client_denies(V2_0).await;
}

/// A UserPromptSubmit hook answered with additional context: the context reaches the
/// model. A PreToolUse hook nobody answers takes its default (DENY) at its expiry: the
/// tool does not run and the default reason reaches the model.
async fn context_and_expiry(release: &str) {
    let world = World::with_scenario(release, HOOKS_SCENARIO).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let default_reason = "EXPIRED-DEFAULT-DENY nobody approved this";
    let s = create_with_hooks(
        &mut c,
        &world,
        vec![
            pb::HookRegistration {
                id: "prompt".into(),
                event: "UserPromptSubmit".into(),
                timeout_secs: 600,
                ..Default::default()
            },
            pre_tool_use(pb::HookDecision::Deny, default_reason, 2),
        ],
    )
    .await
    .unwrap();
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "Create the file hooked.txt please.").await;
    let ev = read_until(&mut events, &mut seen, "prompt hook", |e| {
        hook_requested(e).is_some()
    })
    .await;
    let h = hook_requested(&ev).unwrap().clone();
    assert_eq!(h.hook_event, "UserPromptSubmit");
    assert_eq!(h.tool_use_id, "", "not a tool event");
    let input: serde_json::Value = serde_json::from_str(&h.input_json).unwrap();
    assert!(
        input["prompt"].as_str().unwrap().contains("hooked.txt"),
        "{input}"
    );
    // Additional context is not something a Stop-like answer takes here: DENY is refused.
    let err = c
        .respond_to_hook(respond(
            "c",
            &s.id,
            &h.request_id,
            pb::HookDecision::Deny,
            "x",
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    let context = "CTXMARK-42 the ticket system is read-only today";
    c.respond_to_hook(as_client(
        "c",
        pb::RespondToHookRequest {
            session_id: s.id.clone(),
            request_id: h.request_id.clone(),
            decision: pb::HookDecision::Continue as i32,
            additional_context: context.into(),
            ..Default::default()
        },
    ))
    .await
    .unwrap();

    // The PreToolUse hook: nobody answers.
    let ev = read_until(&mut events, &mut seen, "tool hook", |e| {
        hook_requested(e).is_some_and(|h| h.hook_event == "PreToolUse")
    })
    .await;
    let pre = hook_requested(&ev).unwrap().clone();
    let ev = read_until(&mut events, &mut seen, "expiry", |e| {
        hook_resolved(e).is_some_and(|r| r.request_id == pre.request_id)
    })
    .await;
    let r = hook_resolved(&ev).unwrap();
    assert_eq!(r.resolution(), pb::Resolution::Expired);
    assert_eq!(r.resolved_by, "default:expiry");
    assert_eq!(r.decision(), pb::HookDecision::Deny);
    assert_eq!(r.reason, default_reason);
    read_until(&mut events, &mut seen, "turn end", is_turn_completed).await;
    assert!(!world.work.join("hooked.txt").exists());
    assert!(
        world.model_saw(context),
        "the additional context reaches the model"
    );
    assert!(
        world.model_saw("EXPIRED-DEFAULT-DENY"),
        "the default's reason reaches the model"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn context_and_expiry_2_1_330() {
    context_and_expiry(NEW).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn context_and_expiry_2_0_77() {
    context_and_expiry(V2_0).await;
}

/// kill -9 of the daemon while a hook waits: the restart answers it with the
/// registration's default (`default:restart`, EXPIRED), nothing stays pending, and the
/// resumed session (hooks registered again) runs its next turn to the end.
async fn kill9_with_hook_pending(release: &str) {
    let world = World::with_scenario(release, HOOKS_SCENARIO).await;
    let mut daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_with_hooks(
        &mut c,
        &world,
        vec![pre_tool_use(
            pb::HookDecision::Deny,
            "restart default",
            3600,
        )],
    )
    .await
    .unwrap();
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    // A complete first turn, so the CLI has a transcript to resume.
    send(&mut c, &s.id, "Say hello").await;
    read_until(&mut events, &mut seen, "first turn end", is_turn_completed).await;
    send(&mut c, &s.id, "Create the file hooked.txt please.").await;
    let ev = read_until(&mut events, &mut seen, "hook", |e| {
        hook_requested(e).is_some()
    })
    .await;
    let pending = hook_requested(&ev).unwrap().request_id.clone();
    daemon.kill9();
    drop(events);

    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let history = history(&mut c, &s.id).await;
    assert_gap_free(&history, 1);
    let r = history
        .iter()
        .find_map(|e| hook_resolved(e).filter(|r| r.request_id == pending))
        .unwrap_or_else(|| panic!("no HookResolved after the restart: {history:#?}"));
    assert_eq!(r.resolved_by, "default:restart");
    assert_eq!(r.resolution(), pb::Resolution::Expired);
    assert_eq!(r.decision(), pb::HookDecision::Deny);
    assert_eq!(r.reason, "restart default");
    let listed = pending_interactions(&mut c).await;
    assert!(
        listed.is_empty(),
        "nothing waits after the restart: {listed:?}"
    );
    let late = c
        .respond_to_hook(respond("a", &s.id, &pending, pb::HookDecision::Allow, ""))
        .await
        .unwrap_err();
    assert_eq!(late.code(), tonic::Code::FailedPrecondition, "{late:?}");
    assert!(
        late.message().contains("default:restart"),
        "{}",
        late.message()
    );
    assert!(!world.work.join("hooked.txt").exists());

    // Resume: the hooks are registered again, the next turn ends.
    c.resume_session(pb::ResumeSessionRequest {
        session_id: s.id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let last = history.last().map(|e| e.seq).unwrap_or(0);
    let mut events = subscribe(&mut c, &s.id, last, false).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "Create the file hooked.txt please.").await;
    let ev = read_until(&mut events, &mut seen, "hook after resume", |e| {
        hook_requested(e).is_some()
    })
    .await;
    let h = hook_requested(&ev).unwrap();
    c.respond_to_hook(respond(
        "a",
        &s.id,
        &h.request_id,
        pb::HookDecision::Deny,
        "still no",
    ))
    .await
    .unwrap();
    read_until(
        &mut events,
        &mut seen,
        "turn end after resume",
        is_turn_completed,
    )
    .await;
    assert!(!world.work.join("hooked.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_with_hook_pending_2_1_330() {
    kill9_with_hook_pending(NEW).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_with_hook_pending_2_0_77() {
    kill9_with_hook_pending(V2_0).await;
}

/// Registrations are checked before anything is created, and a release that does not call
/// hooks refuses them at once, naming the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_registrations_and_releases_without_hooks_are_refused() {
    let world = World::with_scenario(NO_HOOKS, HOOKS_SCENARIO).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let mut bad = pre_tool_use(pb::HookDecision::Continue, "", 0);
    bad.event = "BeforeLunch".into();
    let err = create_with_hooks(&mut c, &world, vec![bad])
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().starts_with("hooks[0].event"),
        "{}",
        err.message()
    );
    let mut bad = pre_tool_use(pb::HookDecision::Block, "", 0);
    bad.timeout_secs = 1;
    let err = create_with_hooks(&mut c, &world, vec![bad])
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().starts_with("hooks[0].default_decision"),
        "{}",
        err.message()
    );

    let started = std::time::Instant::now();
    let err = create_with_hooks(
        &mut c,
        &world,
        vec![pre_tool_use(pb::HookDecision::Continue, "", 0)],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains(NO_HOOKS), "{}", err.message());
    assert!(
        started.elapsed() < ostler_testkit::timeouts::secs(5),
        "refused at once"
    );
    let listed = c
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.sessions.is_empty(), "nothing was created");
}

/// The terminal client: `ostler pending --json` lists the hook call (kind `hook`), and
/// `ostler hook ID --deny REASON --json` answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn client_lists_and_answers_a_hook() {
    let world = World::with_scenario(NEW, HOOKS_SCENARIO).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_with_hooks(
        &mut c,
        &world,
        vec![pre_tool_use(pb::HookDecision::Continue, "", 600)],
    )
    .await
    .unwrap();
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "Create the file hooked.txt please.").await;
    let ev = read_until(&mut events, &mut seen, "hook", |e| {
        hook_requested(e).is_some()
    })
    .await;
    let request_id = hook_requested(&ev).unwrap().request_id.clone();
    let client = |args: Vec<String>| {
        let mut cmd = client_command(&world, &daemon.addr.to_string(), &args);
        cmd.stdin(std::process::Stdio::null());
        async move {
            let out = tokio::task::spawn_blocking(move || cmd.output())
                .await
                .unwrap()
                .unwrap();
            assert!(
                out.status.success(),
                "ostler {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
                .collect::<Vec<_>>()
        }
    };
    // `ostler attach` without a terminal cannot answer it: it says how, and exits 3
    // ("needs an answer"), as for a permission prompt.
    let mut attach = client_command(
        &world,
        &daemon.addr.to_string(),
        &["attach".into(), s.id.clone(), "--until-turn".into()],
    );
    attach
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = attach.spawn().unwrap();
    let out = tokio::task::spawn_blocking(move || common::wait_output(child))
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "attach: {stderr}");
    assert!(stderr.contains("ostler hook"), "attach: {stderr}");
    let listed = client(vec!["pending".into(), "--json".into()]).await;
    let item = listed
        .iter()
        .find(|v| v["request_id"] == request_id.as_str())
        .unwrap_or_else(|| panic!("{listed:?}"));
    assert_eq!(item["kind"], "hook");
    let prefix: String = request_id.chars().take(8).collect();
    let answered = client(vec![
        "hook".into(),
        prefix,
        "--deny".into(),
        "CLIDENY from the terminal".into(),
        "--json".into(),
    ])
    .await;
    assert_eq!(answered[0]["decision"], "deny");
    assert_eq!(answered[0]["hook_event"], "PreToolUse");
    assert!(
        answered[0]["resolved_by"]
            .as_str()
            .unwrap()
            .starts_with("client:"),
        "{answered:?}"
    );
    read_until(&mut events, &mut seen, "turn end", is_turn_completed).await;
    assert!(!world.work.join("hooked.txt").exists());
    assert!(world.model_saw("CLIDENY from the terminal"));
}

const QUEUED_SCENARIO: &str = r#"
[[model]]
name = "first"
when = { last_user_text_contains = "First question", messages_lack = "Second question" }
hold_until = "go"
blocks = [{ type = "text", text = "The first answer." }]

[[model]]
name = "second"
when = { messages_contain = "Second question" }
blocks = [{ type = "text", text = "The second answer." }]
"#;

fn took_none(e: &pb::SessionEvent) -> bool {
    matches!(&e.payload, Some(P::StateChanged(s)) if s.reason.contains("took none"))
}

/// A message queued behind a running turn, whose UserPromptSubmit hook a client answers
/// only after twice `sessions.queue_grace_secs`: the CLI asked the hook for it after the
/// first turn's result and waits on the client, so the message is not forgotten. The
/// session never goes IDLE between the first message and the answer to the second, and
/// that answer's TurnCompleted names the second message.
async fn a_queued_message_waits_on_its_hook_past_the_grace(release: &str) {
    let world = World::with_scenario(release, QUEUED_SCENARIO).await;
    let grace = ostler_testkit::timeouts::secs(1).as_secs().max(1);
    let grace_env = grace.to_string();
    let daemon = world
        .daemon_with_env(&[], &[("OSTLER_SESSIONS__QUEUE_GRACE_SECS", &grace_env)])
        .await;
    let mut c = daemon.sessions().await;
    let s = create_with_hooks(
        &mut c,
        &world,
        vec![pb::HookRegistration {
            id: "prompt".into(),
            event: "UserPromptSubmit".into(),
            timeout_secs: 600,
            ..Default::default()
        }],
    )
    .await
    .unwrap();
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    let continue_hook = |request_id: &str| {
        as_client(
            "c",
            pb::RespondToHookRequest {
                session_id: s.id.clone(),
                request_id: request_id.into(),
                decision: pb::HookDecision::Continue as i32,
                ..Default::default()
            },
        )
    };

    send(&mut c, &s.id, "First question.").await;
    let ev = read_until(&mut events, &mut seen, "the first prompt's hook", |e| {
        hook_requested(e).is_some()
    })
    .await;
    let first_hook = hook_requested(&ev).unwrap().request_id.clone();
    c.respond_to_hook(continue_hook(&first_hook)).await.unwrap();
    await_model_request(&world.fake, "first").await;
    let second_id = c
        .send_message(as_client(
            "sender",
            pb::SendMessageRequest {
                session_id: s.id.clone(),
                content: text("Second question."),
                client_message_id: String::new(),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner()
        .message_id;
    world.fake.signal("go");
    read_until(
        &mut events,
        &mut seen,
        "the first answer",
        is_turn_completed,
    )
    .await;
    let ev = read_until(&mut events, &mut seen, "the queued prompt's hook", |e| {
        hook_requested(e).is_some_and(|h| h.request_id != first_hook)
    })
    .await;
    let h = hook_requested(&ev).unwrap().clone();
    assert!(h.input_json.contains("Second question"), "{}", h.input_json);
    // The client takes twice the grace to answer; the session must not give the message up.
    let hold = std::time::Duration::from_secs(2 * grace);
    let gave_up = tokio::time::timeout(hold, async {
        loop {
            match events.message().await {
                Ok(Some(e)) => {
                    let stop = took_none(&e);
                    seen.push(e);
                    if stop {
                        return;
                    }
                }
                other => panic!("the stream ended while the hook was pending: {other:?}"),
            }
        }
    })
    .await;
    assert!(
        gave_up.is_err(),
        "{release}: the queued message was forgotten while its hook waited: {:#?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );
    c.respond_to_hook(continue_hook(&h.request_id))
        .await
        .unwrap();
    let ev = read_until(
        &mut events,
        &mut seen,
        "the second answer",
        is_turn_completed,
    )
    .await;
    let Some(P::TurnCompleted(done)) = &ev.payload else {
        unreachable!()
    };
    assert_eq!(done.result, "The second answer.", "{release}");
    assert!(
        done.user_message_ids.contains(&second_id),
        "{release}: {:?} does not name {second_id}",
        done.user_message_ids
    );
    let first_send = seen
        .iter()
        .position(|e| matches!(&e.payload, Some(P::UserMessage(_))))
        .unwrap();
    let idle = seen[first_send..].iter().find(|e| {
        matches!(&e.payload, Some(P::StateChanged(x)) if x.to() == pb::SessionState::Idle)
            || took_none(e)
    });
    assert!(
        idle.is_none(),
        "{release}: the session went idle before the queued message's answer: {:#?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queued_message_waits_on_its_hook_past_the_grace_2_1_330() {
    a_queued_message_waits_on_its_hook_past_the_grace(NEW).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_queued_message_waits_on_its_hook_past_the_grace_2_0_77() {
    a_queued_message_waits_on_its_hook_past_the_grace(V2_0).await;
}

/// A daemon on `release` (with `env`) and a session with `hooks`, subscribed from its
/// start.
struct Hooked {
    world: World,
    _daemon: Daemon,
    c: Client,
    s: pb::Session,
    events: Events,
    seen: Vec<pb::SessionEvent>,
}

async fn hooked(release: &str, env: &[(&str, &str)], hooks: Vec<pb::HookRegistration>) -> Hooked {
    let world = World::with_scenario(release, HOOKS_SCENARIO).await;
    let daemon = world.daemon_with_env(&[], env).await;
    let mut c = daemon.sessions().await;
    let s = create_with_hooks(&mut c, &world, hooks).await.unwrap();
    let events = subscribe(&mut c, &s.id, 0, false).await;
    Hooked {
        world,
        _daemon: daemon,
        c,
        s,
        events,
        seen: Vec::new(),
    }
}

/// A registration's default answer carries more than a decision and a reason: a
/// UserPromptSubmit hook nobody answers takes its default at its expiry, its additional
/// context reaches the model and its system message and specific fields are in the
/// HookResolved. A default the event does not take is refused at CreateSession, naming
/// the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_default_answer_carries_context_2_1_332() {
    let context = "DEFAULT-CTX-9 nobody is watching this session";
    let mut prompt = registration("prompt", "UserPromptSubmit");
    // The wait before the default is what is tested, not a bound on the test.
    prompt.timeout_secs = 1;
    prompt.default_additional_context = context.into();
    prompt.default_system_message = "answered by the registration's default".into();
    prompt.default_hook_specific_output_json = r#"{"sessionTitle": "Unattended"}"#.into();
    let Hooked {
        _daemon,
        mut c,
        s,
        mut events,
        mut seen,
        world,
    } = hooked(NEW, &[], vec![prompt]).await;
    send(&mut c, &s.id, "Say hello").await;
    let ev = read_until(&mut events, &mut seen, "the default", |e| {
        hook_resolved(e).is_some()
    })
    .await;
    let r = hook_resolved(&ev).unwrap().clone();
    assert_eq!(
        (r.resolution(), r.resolved_by.as_str()),
        (pb::Resolution::Expired, "default:expiry")
    );
    assert_eq!(r.additional_context, context);
    assert_eq!(r.system_message, "answered by the registration's default");
    assert!(r.hook_specific_output_json.contains("Unattended"), "{r:?}");
    read_until(&mut events, &mut seen, "turn end", is_turn_completed).await;
    assert!(
        world.model_saw(context),
        "the default's context reaches the model"
    );

    for (event, field, set, why) in [
        (
            "PreModelSwitch",
            "default_additional_context",
            r#"x"#,
            "does not take additional context",
        ),
        (
            "UserPromptSubmit",
            "default_hook_specific_output_json",
            r#"{"additionalContext": "x"}"#,
            "additional_context",
        ),
        (
            "UserPromptSubmit",
            "default_hook_specific_output_json",
            "[1]",
            "object",
        ),
    ] {
        let mut bad = registration("bad", event);
        if field == "default_additional_context" {
            bad.default_additional_context = set.into();
        } else {
            bad.default_hook_specific_output_json = set.into();
        }
        let err = create_with_hooks(&mut c, &world, vec![bad])
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert!(
            err.message().starts_with(&format!("hooks[0].{field}")) && err.message().contains(why),
            "{event} {field}: {err:?}"
        );
    }
}

fn registration(id: &str, event: &str) -> pb::HookRegistration {
    pb::HookRegistration {
        id: id.into(),
        event: event.into(),
        timeout_secs: 600,
        ..Default::default()
    }
}

/// Events newer releases call (the Agent SDKs' list): on 2.1.332 a PermissionRequest hook
/// answers the permission prompt itself. The CLI asks both the hook and ostler's prompt
/// (`can_use_tool`); the hook's ALLOW with a replacement input wins, the CLI withdraws the
/// prompt (`cli`), and the replaced command runs. A PostToolBatch hook's additional
/// context then reaches the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn permission_request_and_post_tool_batch_hooks_2_1_332() {
    let Hooked {
        world,
        _daemon,
        mut c,
        s,
        mut events,
        mut seen,
    } = hooked(
        NEW,
        &[],
        vec![
            registration("grant", "PermissionRequest"),
            registration("batch", "PostToolBatch"),
        ],
    )
    .await;
    send(&mut c, &s.id, "Create the file hooked.txt please.").await;
    let ev = read_until(&mut events, &mut seen, "permission hook", |e| {
        hook_requested(e).is_some_and(|h| h.hook_event == "PermissionRequest")
    })
    .await;
    let h = hook_requested(&ev).unwrap().clone();
    assert_eq!(h.registration_id, "grant");
    assert_eq!(h.tool_name, "Bash");
    let input: serde_json::Value = serde_json::from_str(&h.input_json).unwrap();
    assert_eq!(
        input["tool_input"]["command"], "touch hooked.txt",
        "{input}"
    );

    // ASK is a PreToolUse decision; PermissionRequest takes ALLOW and DENY.
    assert_refused(
        c.respond_to_hook(respond(
            "c",
            &s.id,
            &h.request_id,
            pb::HookDecision::Ask,
            "",
        ))
        .await,
        tonic::Code::InvalidArgument,
        "PermissionRequest hook does not take ASK",
    );
    c.respond_to_hook(as_client(
        "c",
        pb::RespondToHookRequest {
            session_id: s.id.clone(),
            request_id: h.request_id.clone(),
            decision: pb::HookDecision::Allow as i32,
            updated_input_json:
                r#"{"command": "touch granted.txt", "description": "Create granted.txt"}"#.into(),
            ..Default::default()
        },
    ))
    .await
    .unwrap();

    let ev = read_until(&mut events, &mut seen, "batch hook", |e| {
        hook_requested(e).is_some_and(|h| h.hook_event == "PostToolBatch")
    })
    .await;
    let batch = hook_requested(&ev).unwrap().clone();
    assert_eq!(batch.registration_id, "batch");
    let context = "BATCHCTX-9 both files are tracked by the audit log";
    c.respond_to_hook(as_client(
        "c",
        pb::RespondToHookRequest {
            session_id: s.id.clone(),
            request_id: batch.request_id.clone(),
            decision: pb::HookDecision::Continue as i32,
            additional_context: context.into(),
            ..Default::default()
        },
    ))
    .await
    .unwrap();
    read_until(&mut events, &mut seen, "turn end", is_turn_completed).await;

    assert!(
        world.work.join("granted.txt").exists(),
        "the hook's replacement input ran"
    );
    assert!(!world.work.join("hooked.txt").exists());
    assert!(
        world.model_saw(context),
        "the batch context reaches the model"
    );
    // ostler's own prompt for the same tool use was withdrawn by the CLI, not left open.
    let prompt = seen
        .iter()
        .find_map(|e| match &e.payload {
            Some(P::PermissionRequested(p)) => Some(p.request_id.clone()),
            _ => None,
        })
        .expect("the CLI asked ostler's prompt too");
    let closed = seen
        .iter()
        .find_map(|e| match &e.payload {
            Some(P::PermissionResolved(r)) if r.request_id == prompt => Some(r.clone()),
            _ => None,
        })
        .expect("the prompt was closed");
    assert_eq!(closed.resolution(), pb::Resolution::Cancelled, "{closed:?}");
    assert_eq!(closed.resolved_by, "cli");
    let pending = pending_interactions(&mut c).await;
    assert!(pending.is_empty(), "{pending:?}");
}

/// A hook event the running release does not know would never be called: CreateSession
/// refuses it at once (FAILED_PRECONDITION naming the field, the event and the release),
/// creates nothing, and takes the events the release knows. So is PermissionRequest,
/// which 2.0.77 knows but never calls when permission prompts go to ostler (measured).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_the_release_does_not_know_are_refused_2_0_77() {
    let world = World::with_scenario(V2_0, HOOKS_SCENARIO).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    for event in [
        "PostToolBatch",
        "PreModelSwitch",
        "MessageDisplay",
        "PermissionRequest",
    ] {
        let started = std::time::Instant::now();
        let err = create_with_hooks(
            &mut c,
            &world,
            vec![
                pre_tool_use(pb::HookDecision::Continue, "", 0),
                registration("newer", event),
            ],
        )
        .await
        .unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
        let m = err.message();
        assert!(m.starts_with("hooks[1].event"), "{m}");
        assert!(m.contains(V2_0) && m.contains(event), "{m}");
        assert!(
            started.elapsed() < ostler_testkit::timeouts::secs(5),
            "refused at once"
        );
    }
    let listed = c
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.sessions.is_empty(), "nothing was created");
    // Events 2.0.77 knows (its list has 12) are taken.
    create_with_hooks(
        &mut c,
        &world,
        vec![
            registration("start", "SessionStart"),
            registration("failure", "PostToolUseFailure"),
        ],
    )
    .await
    .unwrap();
}

/// 2.1.332's PreModelSwitch hook: the CLI asks it before it answers `set_model`, so
/// SetModel waits on a client's answer while the session's other calls go on, also past
/// the control timeout (`sessions.control_timeout_secs`, short here). A DENY makes SetModel
/// fail with the CLI's reason and the model stays; CONTINUE given after the control timeout
/// still completes the SetModel and the session records the new model.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_model_switch_waits_on_its_hook_2_1_332() {
    let control_timeout = ostler_testkit::timeouts::secs(2);
    let Hooked {
        _daemon,
        mut c,
        s,
        mut events,
        mut seen,
        world: _world,
    } = hooked(
        NEW,
        &[(
            "OSTLER_SESSIONS__CONTROL_TIMEOUT_SECS",
            &control_timeout.as_secs().to_string(),
        )],
        vec![registration("switch", "PreModelSwitch")],
    )
    .await;
    // The CLI calls the hook for a switch after the first turn (before it, not at all).
    send(&mut c, &s.id, "Say hello").await;
    read_until(&mut events, &mut seen, "first turn", is_turn_completed).await;

    let model = "claude-sonnet-4-5";
    for (decision, reason) in [
        (pb::HookDecision::Deny, "STAY-7 the budget is spent"),
        (pb::HookDecision::Continue, ""),
    ] {
        let mut setter = c.clone();
        let sid = s.id.clone();
        let switch = tokio::spawn(async move {
            setter
                .set_model(pb::SetModelRequest {
                    session_id: sid,
                    model: model.into(),
                })
                .await
        });
        let ev = read_until(&mut events, &mut seen, "switch hook", |e| {
            hook_requested(e).is_some_and(|h| h.hook_event == "PreModelSwitch")
        })
        .await;
        let h = hook_requested(&ev).unwrap().clone();
        let input: serde_json::Value = serde_json::from_str(&h.input_json).unwrap();
        assert_eq!(input["to_model"], model, "{input}");
        // The session answers other calls while the switch waits.
        let got = session(&mut c, &s.id).await;
        assert_eq!(got.id, s.id);
        if decision == pb::HookDecision::Continue {
            // The person takes longer than the control timeout: what is tested is time
            // passing, not a wait for an event.
            tokio::time::sleep(control_timeout + std::time::Duration::from_secs(1)).await;
        }
        assert!(!switch.is_finished(), "SetModel waits on the hook");
        c.respond_to_hook(respond("c", &s.id, &h.request_id, decision, reason))
            .await
            .unwrap();
        let r = switch.await.unwrap();
        if decision == pb::HookDecision::Deny {
            assert_refused(r, tonic::Code::FailedPrecondition, "STAY-7");
            assert_ne!(session(&mut c, &s.id).await.model, model);
        } else {
            r.unwrap();
            assert_eq!(session(&mut c, &s.id).await.model, model);
        }
    }

    // A model switch passed through: `apply_flag_settings` with a model calls the hook too
    // and waits on it the same way, past the control timeout; the session records the
    // model.
    let mut setter = c.clone();
    let sid = s.id.clone();
    let apply = tokio::spawn(async move {
        setter
            .send_control_request(pb::SendControlRequestRequest {
                session_id: sid,
                subtype: "apply_flag_settings".into(),
                request_json: r#"{"settings": {"model": "claude-haiku-4-5"}}"#.into(),
            })
            .await
    });
    let ev = read_until(&mut events, &mut seen, "switch hook of the settings", |e| {
        hook_requested(e).is_some_and(|h| {
            h.hook_event == "PreModelSwitch" && h.input_json.contains("claude-haiku-4-5")
        })
    })
    .await;
    let h = hook_requested(&ev).unwrap().clone();
    tokio::time::sleep(control_timeout + std::time::Duration::from_secs(1)).await;
    assert!(
        !apply.is_finished(),
        "apply_flag_settings waits on the hook"
    );
    c.respond_to_hook(respond(
        "c",
        &s.id,
        &h.request_id,
        pb::HookDecision::Continue,
        "",
    ))
    .await
    .unwrap();
    apply.await.unwrap().unwrap();
    // Recorded as SetModel's switch is.
    assert_eq!(session(&mut c, &s.id).await.model, "claude-haiku-4-5");
}

/// Fields of an event's answer that ostler has no own field for pass through
/// (`hook_specific_output_json`). On 2.1.332 a MessageDisplay hook's `displayContent` is
/// what every client is shown (live and read back) instead of the model's text, and a
/// UserPromptSubmit hook's `sessionTitle` renames the CLI's session (and so the session's
/// title). A key ostler sets itself is refused, naming the field to use.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn event_specific_fields_pass_through_2_1_332() {
    let Hooked {
        _daemon,
        mut c,
        s,
        mut events,
        mut seen,
        world: _world,
    } = hooked(
        NEW,
        &[],
        vec![
            registration("title", "UserPromptSubmit"),
            registration("display", "MessageDisplay"),
        ],
    )
    .await;
    send(&mut c, &s.id, "Say hello").await;
    let answer = |request_id: &str, specific: &str| {
        as_client(
            "c",
            pb::RespondToHookRequest {
                session_id: s.id.clone(),
                request_id: request_id.into(),
                hook_specific_output_json: specific.into(),
                ..Default::default()
            },
        )
    };
    let ev = read_until(&mut events, &mut seen, "prompt hook", |e| {
        hook_requested(e).is_some_and(|h| h.hook_event == "UserPromptSubmit")
    })
    .await;
    let prompt = hook_requested(&ev).unwrap().request_id.clone();
    assert_refused(
        c.respond_to_hook(answer(&prompt, r#"{"additionalContext": "x"}"#))
            .await,
        tonic::Code::InvalidArgument,
        "additional_context",
    );
    assert_refused(
        c.respond_to_hook(answer(&prompt, "[1]")).await,
        tonic::Code::InvalidArgument,
        "must be a JSON object",
    );
    c.respond_to_hook(answer(&prompt, r#"{"sessionTitle": "TITLE-4 greetings"}"#))
        .await
        .unwrap();

    let ev = read_until(&mut events, &mut seen, "display hook", |e| {
        hook_requested(e).is_some_and(|h| h.hook_event == "MessageDisplay")
    })
    .await;
    let display = hook_requested(&ev).unwrap().request_id.clone();
    let shown = "DISPLAYED-3 [the greeting was redacted]";
    let resolved = c
        .respond_to_hook(answer(
            &display,
            &serde_json::json!({"displayContent": shown}).to_string(),
        ))
        .await
        .unwrap()
        .into_inner()
        .resolved
        .unwrap();
    let output: serde_json::Value = serde_json::from_str(&resolved.output_json).unwrap();
    assert_eq!(output["hookSpecificOutput"]["displayContent"], shown);
    assert_eq!(
        output["hookSpecificOutput"]["hookEventName"],
        "MessageDisplay"
    );
    read_until(&mut events, &mut seen, "turn end", is_turn_completed).await;

    let texts: Vec<&str> = seen.iter().filter_map(assistant_text).collect();
    assert!(texts.contains(&shown), "{texts:?}");
    assert!(
        !texts
            .iter()
            .any(|t| t.contains("Hello from the fake model")),
        "{texts:?}"
    );
    // The CLI's own line (`system/session_title_changed`, kept as an unknown message), not
    // the hook's answer.
    let titled = seen.iter().any(|e| match &e.payload {
        Some(P::Unknown(u)) => {
            u.message_type == "system/session_title_changed"
                && u.raw_json.contains("TITLE-4 greetings")
        }
        _ => false,
    });
    assert!(
        titled,
        "the CLI announced the title: {:#?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );
    // The session took the CLI's title.
    assert_eq!(session(&mut c, &s.id).await.title, "TITLE-4 greetings");
}

/// The other side of the race: on 2.1.332 the permission prompt answered first (by a client,
/// or at once by a session rule) leaves the CLI's PermissionRequest hook call open (the CLI
/// withdraws nothing and ignores a later answer). ostler closes it at once: CANCELLED by
/// `engine` before the turn ends, nothing left pending, a late answer refused.
async fn prompt_answered_before_the_hook(rule: bool) {
    let world = World::with_scenario(NEW, HOOKS_SCENARIO).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let rules = if rule {
        vec![pb::PermissionRule {
            tool: "Bash".into(),
            pattern: "touch".into(),
            ..Default::default()
        }]
    } else {
        Vec::new()
    };
    let s = c
        .create_session(as_client(
            "creator",
            pb::CreateSessionRequest {
                cwd: world.work.display().to_string(),
                hooks: vec![registration("grant", "PermissionRequest")],
                rules,
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "Create the file hooked.txt please.").await;
    let (mut hook, mut prompt) = (None, None);
    read_until(&mut events, &mut seen, "hook call and prompt", |e| {
        if let Some(h) = hook_requested(e) {
            hook = Some(h.request_id.clone());
        }
        if let Some(P::PermissionRequested(p)) = &e.payload {
            prompt = Some(p.request_id.clone());
        }
        hook.is_some() && (rule || prompt.is_some())
    })
    .await;
    let hook = hook.unwrap();
    if !rule {
        c.respond_to_permission(as_client(
            "c",
            pb::RespondToPermissionRequest {
                session_id: s.id.clone(),
                request_id: prompt.unwrap(),
                decision: Some(pb::respond_to_permission_request::Decision::Allow(
                    pb::PermissionAllow::default(),
                )),
            },
        ))
        .await
        .unwrap();
    }
    let ev = read_until(&mut events, &mut seen, "hook closed", |e| {
        hook_resolved(e).is_some_and(|r| r.request_id == hook) || is_turn_completed(e)
    })
    .await;
    let r = hook_resolved(&ev).expect("the hook call is closed before the turn ends");
    assert_eq!(r.resolution(), pb::Resolution::Cancelled, "{r:?}");
    assert_eq!(r.resolved_by, "engine");
    assert!(r.reason.contains("answered first"), "{r:?}");
    read_until(&mut events, &mut seen, "turn end", is_turn_completed).await;
    assert!(
        world.work.join("hooked.txt").exists(),
        "the prompt's allow ran it"
    );
    let pending = pending_interactions(&mut c).await;
    assert!(pending.is_empty(), "{pending:?}");
    assert_refused(
        c.respond_to_hook(respond("c", &s.id, &hook, pb::HookDecision::Deny, "late"))
            .await,
        tonic::Code::FailedPrecondition,
        "already",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_answers_the_prompt_before_the_permission_hook_2_1_332() {
    prompt_answered_before_the_hook(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rule_answers_the_prompt_before_the_permission_hook_2_1_332() {
    prompt_answered_before_the_hook(true).await;
}
