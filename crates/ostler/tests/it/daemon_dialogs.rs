//! gRPC acceptance of dialogs (the CLI's `request_user_dialog`, the Agent SDKs'
//! `supportedDialogKinds` / `onUserDialog`) against the real CLI 2.1.332 and the fake model
//! server: a session declaring `refusal_fallback_prompt` in `dialog_kinds`, on a model the
//! fake refuses (`claude-fable-5`, a streamed `stop_reason: refusal` with `stop_details`),
//! with `switchModelsOnFlag: false` so that the CLI asks rather than switching by itself.
//! The CLI retries the first refusal once, then asks; ostler makes the dialog a pending
//! interaction that a client answers with RespondToDialog. `retry_fallback` sends the turn
//! to the fallback model; CANCELLED lets the refusal stand; `edit_prompt` aborts the turn
//! without it; nobody answering, or an `Interrupt`, lets the CLI withdraw it; a session
//! without the option is never asked.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error

use crate::common;

use common::grpc::*;
use common::*;
use ostler_proto::v1 as pb;
use pb::session_event::Payload as P;

/// 2.1.330 and later honour `supportedDialogKinds` (measured: docs/compatibility.md).
const NEW: &str = "2.1.332";

/// The model the fake refuses.
const REFUSED_MODEL: &str = "claude-fable-5";
/// What any other model (the fallback) answers.
const FALLBACK_TEXT: &str = "FALLBACK-MODEL-ANSWER";

const SCENARIO: &str = r#"
default_text = "FALLBACK-MODEL-ANSWER"
[[model]]
name = "refused"
when = { model_contains = "claude-fable-5" }
stop_reason = "refusal"
stop_details = { type = "refusal", category = "cyber", explanation = "not this one" }
blocks = []
"#;

type Client =
    ostler_proto::v1::session_service_client::SessionServiceClient<tonic::transport::Channel>;

/// A session on the refused model, asking rather than switching models, with `kinds`
/// declared and `env` in the CLI's environment; subscribed, the prompt sent.
async fn refused_turn(
    c: &mut Client,
    world: &World,
    kinds: &[&str],
    env: &[(&str, &str)],
) -> (pb::Session, Events, Vec<pb::SessionEvent>) {
    let s = c
        .create_session(pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            model: REFUSED_MODEL.into(),
            settings: r#"{"switchModelsOnFlag": false}"#.into(),
            dialog_kinds: kinds.iter().map(|k| k.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let events = subscribe(c, &s.id, 0, false).await;
    send(c, &s.id, "Explain the exploit.").await;
    (s, events, Vec::new())
}

fn dialog(e: &pb::SessionEvent) -> Option<&pb::DialogRequested> {
    match &e.payload {
        Some(P::DialogRequested(d)) => Some(d),
        _ => None,
    }
}

fn resolved(e: &pb::SessionEvent) -> Option<&pb::DialogResolved> {
    match &e.payload {
        Some(P::DialogResolved(d)) => Some(d),
        _ => None,
    }
}

async fn await_dialog(
    events: &mut Events,
    seen: &mut Vec<pb::SessionEvent>,
) -> pb::DialogRequested {
    let ev = read_until(events, seen, "the dialog", |e| dialog(e).is_some()).await;
    dialog(&ev).cloned().unwrap_or_default()
}

async fn turn_end(events: &mut Events, seen: &mut Vec<pb::SessionEvent>) -> pb::TurnCompleted {
    let ev = read_until(events, seen, "the turn's end", is_turn_completed).await;
    match ev.payload {
        Some(P::TurnCompleted(t)) => t,
        _ => unreachable!("read_until stops at a turn's end"),
    }
}

/// Model requests (warmups left out) on `model`.
fn requests_on(world: &World, model: &str) -> usize {
    world
        .fake
        .requests()
        .iter()
        .filter(|r| {
            r.body.as_ref().is_some_and(|b| {
                b["model"] == model
                    && b["messages"].to_string().contains("Explain the exploit")
                    && !ostler_testkit::server::is_warmup(b)
            })
        })
        .count()
}

fn respond(
    client: &str,
    session_id: &str,
    request_id: &str,
    behavior: pb::DialogBehavior,
    result_json: &str,
) -> tonic::Request<pb::RespondToDialogRequest> {
    as_client(
        client,
        pb::RespondToDialogRequest {
            session_id: session_id.into(),
            request_id: request_id.into(),
            behavior: behavior as i32,
            result_json: result_json.into(),
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refusal_fallback_dialog_is_answered_remotely() {
    let world = World::with_scenario(NEW, SCENARIO).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let (s, mut events, mut seen) =
        refused_turn(&mut c, &world, &["refusal_fallback_prompt"], &[]).await;

    let asked = await_dialog(&mut events, &mut seen).await;
    assert_eq!(asked.dialog_kind, "refusal_fallback_prompt");
    let payload: serde_json::Value = serde_json::from_str(&asked.payload_json).unwrap();
    assert_eq!(payload["originalModel"], REFUSED_MODEL, "{payload}");
    assert_eq!(payload["apiRefusalCategory"], "cyber", "{payload}");
    let fallback = payload["fallbackModel"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        !fallback.is_empty() && fallback != REFUSED_MODEL,
        "{payload}"
    );
    let request: serde_json::Value = serde_json::from_str(&asked.request_json).unwrap();
    assert_eq!(request["subtype"], "request_user_dialog", "{request}");
    // Pending: listed, counted, the session waits on a client.
    let pending = pending_interactions(&mut c).await;
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0].request_id, asked.request_id);
    let now = session(&mut c, &s.id).await;
    assert_eq!(now.pending_interactions, 1);
    assert_eq!(now.state(), pb::SessionState::AwaitingPermission);
    assert_eq!(
        requests_on(&world, &fallback),
        0,
        "nothing on the fallback yet"
    );
    // The daemon-wide feed has it as FEED_KIND_DIALOG_PENDING.
    let mut feed = c
        .watch_sessions(pb::WatchSessionsRequest {
            kinds: vec![pb::FeedKind::DialogPending as i32],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let item = tokio::time::timeout(guard(), feed.message())
        .await
        .unwrap()
        .unwrap()
        .expect("a feed item");
    assert_eq!(item.session_id, s.id);
    assert!(matches!(
        item.event.and_then(|e| e.payload),
        Some(P::DialogRequested(d)) if d.request_id == asked.request_id
    ));

    // Answers without meaning are refused before the CLI sees them, never echoed.
    for (id, behavior, result, code, needle) in [
        (
            asked.request_id.as_str(),
            pb::DialogBehavior::Unspecified,
            "",
            tonic::Code::InvalidArgument,
            "behavior: required",
        ),
        (
            asked.request_id.as_str(),
            pb::DialogBehavior::Completed,
            "retry_fallback",
            tonic::Code::InvalidArgument,
            "result_json: not JSON",
        ),
        (
            "no-such-request",
            pb::DialogBehavior::Cancelled,
            "",
            tonic::Code::NotFound,
            "no-such-request",
        ),
    ] {
        assert_refused(
            c.respond_to_dialog(respond("c", &s.id, id, behavior, result))
                .await,
            code,
            needle,
        );
    }
    let big = format!("\"{}\"", "y".repeat(70 * 1024));
    let e = c
        .respond_to_dialog(respond(
            "c",
            &s.id,
            &asked.request_id,
            pb::DialogBehavior::Completed,
            &big,
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(
        e.message().contains("result_json") && !e.message().contains("yyyy"),
        "{}",
        e.message()
    );

    let done = c
        .respond_to_dialog(respond(
            "phone",
            &s.id,
            &asked.request_id,
            pb::DialogBehavior::Completed,
            r#""retry_fallback""#,
        ))
        .await
        .unwrap()
        .into_inner();
    let r = done.resolved.unwrap();
    assert_eq!(r.resolution(), pb::Resolution::Answered);
    assert_eq!(r.behavior(), pb::DialogBehavior::Completed);
    assert_eq!(r.result_json, r#""retry_fallback""#);
    assert_eq!(r.resolved_by, "client:phone");
    // The first answer won.
    assert_refused(
        c.respond_to_dialog(respond(
            "laptop",
            &s.id,
            &asked.request_id,
            pb::DialogBehavior::Cancelled,
            "",
        ))
        .await,
        tonic::Code::FailedPrecondition,
        "client:phone",
    );

    let end = turn_end(&mut events, &mut seen).await;
    assert!(
        !end.is_error && end.result.contains(FALLBACK_TEXT),
        "{end:?}: {:#?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );
    assert!(
        requests_on(&world, &fallback) >= 1,
        "the fallback model was asked"
    );
    assert!(
        seen.iter()
            .any(|e| resolved(e).is_some_and(|r| r.request_id == asked.request_id)),
        "subscribers see the resolution"
    );
    assert_eq!(session(&mut c, &s.id).await.pending_interactions, 0);
    assert!(pending_interactions(&mut c).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_dialog_lets_the_refusal_stand() {
    let world = World::with_scenario(NEW, SCENARIO).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let (s, mut events, mut seen) =
        refused_turn(&mut c, &world, &["refusal_fallback_prompt"], &[]).await;
    let asked = await_dialog(&mut events, &mut seen).await;
    let payload: serde_json::Value = serde_json::from_str(&asked.payload_json).unwrap();
    let fallback = payload["fallbackModel"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let r = c
        .respond_to_dialog(respond(
            "c",
            &s.id,
            &asked.request_id,
            pb::DialogBehavior::Cancelled,
            "",
        ))
        .await
        .unwrap()
        .into_inner()
        .resolved
        .unwrap();
    assert_eq!(r.behavior(), pb::DialogBehavior::Cancelled);
    assert_eq!(r.result_json, "");
    let end = turn_end(&mut events, &mut seen).await;
    assert!(
        !end.result.contains(FALLBACK_TEXT),
        "{end:?}: {:#?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );
    assert_eq!(
        requests_on(&world, &fallback),
        0,
        "no request on the fallback"
    );
    assert!(
        requests_on(&world, REFUSED_MODEL) >= 2,
        "refused, retried once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dialog_nobody_answers_is_withdrawn_by_the_cli() {
    let world = World::with_scenario(NEW, SCENARIO).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let (s, mut events, mut seen) = refused_turn(
        &mut c,
        &world,
        &["refusal_fallback_prompt"],
        &[("CLAUDE_CODE_USER_DIALOG_TIMEOUT_MS", "2000")],
    )
    .await;
    let asked = await_dialog(&mut events, &mut seen).await;
    let ev = read_until(&mut events, &mut seen, "the withdrawal", |e| {
        resolved(e).is_some_and(|r| r.request_id == asked.request_id)
    })
    .await;
    let r = resolved(&ev).unwrap();
    assert_eq!(r.resolved_by, "cli", "{r:?}");
    assert_eq!(r.resolution(), pb::Resolution::Cancelled);
    assert_eq!(r.behavior(), pb::DialogBehavior::Cancelled);
    let end = turn_end(&mut events, &mut seen).await;
    assert!(!end.result.contains(FALLBACK_TEXT), "{end:?}");
    assert_eq!(session(&mut c, &s.id).await.pending_interactions, 0);
    assert!(pending_interactions(&mut c).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_interrupt_makes_the_cli_withdraw_a_dialog() {
    let world = World::with_scenario(NEW, SCENARIO).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let (s, mut events, mut seen) =
        refused_turn(&mut c, &world, &["refusal_fallback_prompt"], &[]).await;
    let asked = await_dialog(&mut events, &mut seen).await;
    c.interrupt(pb::InterruptRequest {
        session_id: s.id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let ev = read_until(&mut events, &mut seen, "the withdrawal", |e| {
        resolved(e).is_some_and(|r| r.request_id == asked.request_id)
    })
    .await;
    let r = resolved(&ev).unwrap();
    // The CLI's own `control_cancel_request` (its request is tied to the turn's abort
    // signal), not the engine closing it at the turn's end.
    assert_eq!(r.resolved_by, "cli", "{r:?}");
    assert_eq!(r.resolution(), pb::Resolution::Cancelled);
    assert_eq!(r.behavior(), pb::DialogBehavior::Cancelled);
    let end = turn_end(&mut events, &mut seen).await;
    assert!(!end.result.contains(FALLBACK_TEXT), "{end:?}");
    let payload: serde_json::Value = serde_json::from_str(&asked.payload_json).unwrap();
    let fallback = payload["fallbackModel"].as_str().unwrap_or_default();
    assert_eq!(
        requests_on(&world, fallback),
        0,
        "no request on the fallback"
    );
    assert_eq!(session(&mut c, &s.id).await.pending_interactions, 0);
    assert!(pending_interactions(&mut c).await.is_empty());
    // A late answer is refused, naming who settled it.
    let late = c
        .respond_to_dialog(respond(
            "c",
            &s.id,
            &asked.request_id,
            pb::DialogBehavior::Completed,
            r#""retry_fallback""#,
        ))
        .await
        .unwrap_err();
    assert_eq!(late.code(), tonic::Code::FailedPrecondition, "{late:?}");
    assert!(late.message().contains("cli"), "{late:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn edit_prompt_ends_the_turn_without_the_refusal() {
    let world = World::with_scenario(NEW, SCENARIO).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    // The same refused turn, answered `cancelled`, ends with the refusal's error text:
    // the baseline `edit_prompt` is told apart from.
    let (cancelled, mut events, mut seen) =
        refused_turn(&mut c, &world, &["refusal_fallback_prompt"], &[]).await;
    let asked = await_dialog(&mut events, &mut seen).await;
    c.respond_to_dialog(respond(
        "c",
        &cancelled.id,
        &asked.request_id,
        pb::DialogBehavior::Completed,
        r#""cancelled""#,
    ))
    .await
    .unwrap();
    let refused = turn_end(&mut events, &mut seen).await;
    let refusal_said = |seen: &[pb::SessionEvent]| {
        seen.iter()
            .filter_map(assistant_text)
            .any(|t| !t.trim().is_empty())
    };
    assert!(
        refusal_said(&seen) || !refused.result.trim().is_empty(),
        "the cancelled dialog's turn says something of the refusal: {refused:?}: {:#?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );

    let (s, mut events, mut seen) =
        refused_turn(&mut c, &world, &["refusal_fallback_prompt"], &[]).await;
    let asked = await_dialog(&mut events, &mut seen).await;
    let payload: serde_json::Value = serde_json::from_str(&asked.payload_json).unwrap();
    let fallback = payload["fallbackModel"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let before = requests_on(&world, &fallback);
    let r = c
        .respond_to_dialog(respond(
            "c",
            &s.id,
            &asked.request_id,
            pb::DialogBehavior::Completed,
            r#""edit_prompt""#,
        ))
        .await
        .unwrap()
        .into_inner()
        .resolved
        .unwrap();
    assert_eq!(r.result_json, r#""edit_prompt""#);
    let end = turn_end(&mut events, &mut seen).await;
    assert!(
        !refusal_said(&seen) && end.result.trim().is_empty(),
        "edit_prompt aborts the turn without the refusal's text: {end:?}: {:#?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );
    assert_eq!(
        requests_on(&world, &fallback),
        before,
        "no request on the fallback"
    );
    // The CLI reports the prompt cancelled (a client puts it back for editing); it stays in
    // the conversation the model sees (2.1.332).
    let prompt_id = seen
        .iter()
        .find_map(|e| match &e.payload {
            Some(P::UserMessage(u)) if !u.message_id.is_empty() => Some(u.message_id.clone()),
            _ => None,
        })
        .expect("the prompt's UserMessage");
    read_until(&mut events, &mut seen, "the prompt's cancellation", |e| {
        matches!(&e.payload, Some(P::MessageLifecycle(m))
            if m.message_id == prompt_id && m.state == "cancelled")
    })
    .await;
    // The session takes the next prompt (the user's edited one): refused again here, so
    // asked again.
    send(&mut c, &s.id, "Explain the exploit, gently.").await;
    let again = await_dialog(&mut events, &mut seen).await;
    assert_ne!(again.request_id, asked.request_id);
    c.respond_to_dialog(respond(
        "c",
        &s.id,
        &again.request_id,
        pb::DialogBehavior::Cancelled,
        "",
    ))
    .await
    .unwrap();
    turn_end(&mut events, &mut seen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_dialog_kinds_the_cli_never_asks() {
    let world = World::with_scenario(NEW, SCENARIO).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let (_s, mut events, mut seen) = refused_turn(&mut c, &world, &[], &[]).await;
    let end = turn_end(&mut events, &mut seen).await;
    assert!(
        !seen.iter().any(|e| dialog(e).is_some()),
        "{:#?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );
    assert!(!end.result.contains(FALLBACK_TEXT), "{end:?}");
    assert!(requests_on(&world, REFUSED_MODEL) >= 2, "the same refusals");
}

#[tokio::test]
async fn bad_dialog_kinds_are_invalid_argument() {
    let world = World::new(NEW).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let many: Vec<String> = (0..17).map(|i| format!("kind_{i}")).collect();
    for (kinds, needle) in [
        (vec![String::new()], "dialog_kinds[0]"),
        (vec!["Refusal-Prompt".to_string()], "dialog_kinds[0]"),
        (vec!["x".repeat(65)], "dialog_kinds[0]"),
        (
            vec!["enum_prompt".to_string(), "enum_prompt".to_string()],
            "dialog_kinds[1]",
        ),
        (many, "dialog_kinds"),
    ] {
        assert_refused(
            c.create_session(pb::CreateSessionRequest {
                cwd: world.work.display().to_string(),
                dialog_kinds: kinds.clone(),
                ..Default::default()
            })
            .await,
            tonic::Code::InvalidArgument,
            needle,
        );
    }
    // A kind no release is known to send yet is passed on.
    c.create_session(pb::CreateSessionRequest {
        cwd: world.work.display().to_string(),
        dialog_kinds: vec!["refusal_fallback_prompt".into(), "some_future_kind".into()],
        ..Default::default()
    })
    .await
    .unwrap();
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

/// The terminal client: `show` names the dialog and how to answer it, `pending` lists it
/// with kind `dialog`, `send` without a terminal stops (exit 3) naming `ostler dialog`,
/// and `ostler dialog PREFIX --result` answers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_terminal_client_shows_and_answers_a_dialog() {
    let world = World::with_scenario(NEW, SCENARIO).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let (s, mut events, mut seen) =
        refused_turn(&mut c, &world, &["refusal_fallback_prompt"], &[]).await;
    let asked = await_dialog(&mut events, &mut seen).await;

    let out = ostler(&world, &daemon, &["show", &s.id, "--events"]).await;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("? dialog refusal_fallback_prompt: claude-fable-5 refused (cyber)")
            && text.contains(&format!(
                "ostler dialog {} --result '\"retry_fallback\"'",
                asked.request_id
            )),
        "{text}"
    );
    let out = ostler(&world, &daemon, &["pending", "--json"]).await;
    assert!(out.status.success(), "{out:?}");
    let listed: serde_json::Value =
        serde_json::from_slice(out.stdout.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(listed["kind"], "dialog", "{listed}");
    assert_eq!(listed["request_id"], asked.request_id.as_str(), "{listed}");

    let prefix: String = asked.request_id.chars().take(8).collect();
    let out = ostler(
        &world,
        &daemon,
        &[
            "dialog",
            &prefix,
            "--result",
            "\"retry_fallback\"",
            "--json",
        ],
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let said: serde_json::Value =
        serde_json::from_slice(out.stdout.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(
        (
            said["behavior"].as_str(),
            said["result"].as_str(),
            said["request_id"].as_str()
        ),
        (
            Some("completed"),
            Some("retry_fallback"),
            Some(asked.request_id.as_str())
        ),
        "{said}"
    );
    let end = turn_end(&mut events, &mut seen).await;
    assert!(end.result.contains(FALLBACK_TEXT), "{end:?}");

    // The session stays on the fallback model: the next prompt is not refused.
    let out = ostler(
        &world,
        &daemon,
        &["send", &s.id, "Explain the exploit again."],
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(FALLBACK_TEXT),
        "{out:?}"
    );

    // Without a terminal, `send` stops at a dialog (exit 3) naming the command that
    // answers it.
    let other = c
        .create_session(pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            model: REFUSED_MODEL.into(),
            settings: r#"{"switchModelsOnFlag": false}"#.into(),
            dialog_kinds: vec!["refusal_fallback_prompt".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let out = ostler(
        &world,
        &daemon,
        &["send", &other.id, "Explain the exploit."],
    )
    .await;
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ostler dialog ") && err.contains("retry_fallback"),
        "{err}"
    );
    assert_eq!(pending_interactions(&mut c).await.len(), 1);
}

/// The daemon's permission expiry answers a dialog `cancelled` (`expiry`); a resumed
/// session still declares its dialog kinds (the CLI asks again), and a dialog a dead
/// daemon left pending is closed by `restart`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dialogs_expire_survive_a_resume_and_close_at_a_restart() {
    let world = World::with_scenario(NEW, SCENARIO).await;
    let expiry = ostler_testkit::timeouts::secs(2)
        .as_secs()
        .max(1)
        .to_string();
    let mut daemon = world
        .daemon_with_env(&[], &[("OSTLER_SESSIONS__PERMISSION_EXPIRY_SECS", &expiry)])
        .await;
    let mut c = daemon.sessions().await;
    let (s, mut events, mut seen) =
        refused_turn(&mut c, &world, &["refusal_fallback_prompt"], &[]).await;
    let asked = await_dialog(&mut events, &mut seen).await;
    assert!(asked.expires_at_ms > 0, "{asked:?}");
    let ev = read_until(&mut events, &mut seen, "the expiry", |e| {
        resolved(e).is_some_and(|r| r.request_id == asked.request_id)
    })
    .await;
    let r = resolved(&ev).unwrap();
    assert_eq!(r.resolution(), pb::Resolution::Expired, "{r:?}");
    assert_eq!(
        (r.behavior(), r.resolved_by.as_str()),
        (pb::DialogBehavior::Cancelled, "expiry")
    );
    turn_end(&mut events, &mut seen).await;

    // Resumed: the next process is started with the kinds again.
    stop_and_resume(&mut c, &s.id).await;
    send(&mut c, &s.id, "Explain the exploit once more.").await;
    let again = read_until(
        &mut events,
        &mut seen,
        "the resumed session's dialog",
        |e| dialog(e).is_some_and(|d| d.request_id != asked.request_id),
    )
    .await;
    let left = dialog(&again).unwrap().request_id.clone();
    daemon.kill9();
    drop(events);

    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let closed = history(&mut c, &s.id)
        .await
        .into_iter()
        .find_map(|e| resolved(&e).filter(|r| r.request_id == left).cloned())
        .expect("the dialog a dead daemon left is closed at start");
    assert_eq!(closed.resolved_by, "restart", "{closed:?}");
    assert!(pending_interactions(&mut c).await.is_empty());
}
