//! Session lifecycle against the real CLI: interrupt, set_model, stop, restart -> resumable,
//! resume, limits and errors, idempotent sends, delete.

use crate::common;

use common::*;
use ostler_engine::*;
use ostler_testkit::scenario::Match;

fn text_blocks(evs: &[std::sync::Arc<EngineEvent>]) -> Vec<String> {
    evs.iter()
        .filter_map(|e| match &e.payload {
            EventPayload::AssistantBlock(b) => match &b.block {
                ostler_protocol::ContentBlock::Text { text } => Some(text.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

async fn interrupt_mid_answer(version: &'static str) {
    let env = Env::new(version, scenario("interrupt")).await;
    let s = env.session(None).await;
    let mut sub = env
        .engine
        .subscribe(SubscribeRequest {
            session_id: s.id.clone(),
            after_seq: 0,
            include_partials: true,
            follow: true,
        })
        .await
        .expect("subscribe");
    env.send(&s.id, "Tell me a long story.").await;
    // Partial deltas are live-only: no seq.
    let (delta, _) = until(&mut sub, is_kind("partial_delta")).await;
    assert_eq!(delta.seq, None);
    env.engine.interrupt(&s.id).await.expect("interrupt");
    let (end, _) = until(&mut sub, is_turn_end).await;
    let EventPayload::TurnCompleted(t) = &end.payload else {
        unreachable!()
    };
    assert_eq!(t.subtype, "error_during_execution", "{t:?}");
    // The process stays usable.
    env.send(&s.id, "Are you still there?").await;
    let (end, evs) = until(&mut sub, is_turn_end).await;
    let EventPayload::TurnCompleted(t) = &end.payload else {
        unreachable!()
    };
    assert_eq!(t.subtype, "success", "{t:?}");
    if version == NEW {
        assert!(
            text_blocks(&evs).iter().any(|t| t == "Yes, still here."),
            "{:?}",
            kinds(&evs)
        );
    }
    // (1.0.128 sends the interrupted prompt, "[Request interrupted by user]" and the new
    // text as one user message, so the scenario's slow-story rule answers again; the turn
    // still completes on the same process.)
    // Partials were never stored.
    let hist = env.history(&s.id).await;
    assert!(
        hist.iter()
            .all(|e| e.seq.is_some() && !e.payload.is_live_only())
    );
    assert!(
        hist.iter().any(
            |e| matches!(&e.payload, EventPayload::EngineNotice(n) if n.code == "interrupted")
        )
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn interrupt_mid_answer_new() {
    interrupt_mid_answer(NEW).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn interrupt_mid_answer_old() {
    interrupt_mid_answer(OLD).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn set_model_and_mode_reach_the_cli() {
    let env = Env::new(NEW, scenario("two_turns")).await;
    let s = env.session(Some("What is 2+2?")).await;
    let mut sub = env.follow(&s.id, 0).await;
    until(&mut sub, is_turn_end).await;
    env.engine
        .set_model(&s.id, Some("claude-ostler-test-model".into()))
        .await
        .expect("set_model");
    env.engine
        .set_permission_mode(&s.id, "acceptEdits".into())
        .await
        .expect("set mode");
    let bad = env
        .engine
        .set_permission_mode(&s.id, "yolo".into())
        .await
        .expect_err("bad mode");
    assert_eq!(bad.code_kind(), CodeKind::InvalidArgument);
    let info = env.engine.get_session(&s.id).await.expect("get");
    assert_eq!(info.model.as_deref(), Some("claude-ostler-test-model"));
    assert_eq!(info.permission_mode.as_deref(), Some("acceptEdits"));
    env.send(&s.id, "And 3+3?").await;
    until(&mut sub, is_turn_end).await;
    let n = env.server.count_matching(&Match {
        model_contains: Some("claude-ostler-test-model".into()),
        last_user_text_contains: Some("And 3+3".into()),
        ..Default::default()
    });
    assert_eq!(n, 1, "the next turn uses the new model");
}

/// Drop the engine without shutdown (as if the daemon died), start a new one on the same
/// store: the session is resumable, its history intact; resume continues the conversation
/// on the same ostler session with seq continuing.
async fn restart_then_resume(version: &'static str) {
    let env = Env::new(version, scenario("resume")).await;
    let s = env.session(Some("Remember the word PINEAPPLE.")).await;
    let mut sub = env.follow(&s.id, 0).await;
    let (_, before) = until(&mut sub, is_turn_end).await;
    let last_before = before.last().and_then(|e| e.seq).expect("seq");
    let claude_id = env
        .engine
        .get_session(&s.id)
        .await
        .expect("get")
        .record
        .claude_session_id
        .expect("claude session id recorded");
    drop(sub);

    // "Crash": every engine handle goes away; the actors kill their processes and record
    // nothing.
    let env = env.restarted().await;

    let info = env.engine.get_session(&s.id).await.expect("get");
    assert_eq!(info.state, SessionState::Resumable);
    assert_eq!(info.claude_session_id.as_deref(), Some(claude_id.as_str()));
    let hist = env.history(&s.id).await;
    assert_seqs(&hist, 1, hist.len() as u64);
    assert_eq!(kinds(&hist[..last_before as usize]), kinds(&before));
    assert!(matches!(&hist.last().expect("last").payload,
        EventPayload::StateChanged(c) if c.to == SessionState::Resumable));

    // (A message would resume it on demand: tests/suspend.rs.)
    let resumed = env
        .engine
        .resume_session(&s.id, false)
        .await
        .expect("resume");
    assert_eq!(resumed.id, s.id);
    assert!(resumed.state.is_live());
    let mut sub = env.follow(&s.id, hist.len() as u64).await;
    let sent = env.send(&s.id, "What was the word?").await;
    assert!(sent.seq > hist.len() as u64);
    let (_, evs) = until(&mut sub, is_turn_end).await;
    assert!(
        text_blocks(&evs)
            .iter()
            .any(|t| t == "The word was PINEAPPLE."),
        "{:?}",
        kinds(&evs)
    );
    let all = env.history(&s.id).await;
    assert_seqs(&all, 1, all.len() as u64);
    assert_eq!(
        env.server.count_matching(&Match {
            last_user_text_contains: Some("What was the word".into()),
            messages_contain: Some("I will remember PINEAPPLE.".into()),
            ..Default::default()
        }),
        1
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn restart_then_resume_new() {
    restart_then_resume(NEW).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn restart_then_resume_old() {
    restart_then_resume(OLD).await;
}

/// A graceful daemon shutdown leaves sessions resumable too; a pending permission request
/// is cancelled and recorded so.
#[tokio::test(flavor = "multi_thread")]
async fn shutdown_leaves_sessions_resumable() {
    let env = Env::new(NEW, scenario("tool_allowed")).await;
    let s = env
        .session(Some("Create the file allowed.txt please."))
        .await;
    let mut sub = env.follow(&s.id, 0).await;
    until(&mut sub, is_kind("permission_requested")).await;
    env.engine.shutdown().await;
    let (_, evs) = until(
        &mut sub,
        |e| matches!(&e.payload, EventPayload::StateChanged(c) if c.to == SessionState::Resumable),
    )
    .await;
    assert!(evs.iter().any(|e| matches!(&e.payload,
        EventPayload::InteractionResolved(r) if matches!(r.resolution, Resolution::Cancelled { .. }))));
    assert!(evs.iter().any(|e| e.payload.kind() == "process_exited"));
    let e = env
        .engine
        .create_session(env.create(None))
        .await
        .expect_err("shutting down");
    assert_eq!(e.code_kind(), CodeKind::Unavailable);
    let last = env.history(&s.id).await.len();
    drop(sub);
    let env = env.restarted().await;
    let info = env.engine.get_session(&s.id).await.expect("get");
    assert_eq!(info.state, SessionState::Resumable);
    // Nothing more was needed at start: the session was already recorded resumable.
    assert_eq!(env.history(&s.id).await.len(), last);
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_then_resume_with_fork() {
    let env = Env::new(NEW, scenario("resume")).await;
    let s = env.session(Some("Remember the word PINEAPPLE.")).await;
    let mut sub = env.follow(&s.id, 0).await;
    until(&mut sub, is_turn_end).await;
    let first_claude = env
        .engine
        .get_session(&s.id)
        .await
        .expect("get")
        .record
        .claude_session_id;
    let stopped = env.engine.stop_session(&s.id).await.expect("stop");
    assert_eq!(stopped.state, SessionState::Stopped);
    assert!(stopped.exit.is_some());
    let e = env
        .engine
        .stop_session(&s.id)
        .await
        .expect_err("not running");
    assert_eq!(e.code_kind(), CodeKind::FailedPrecondition);
    let e = env.engine.interrupt(&s.id).await.expect_err("not running");
    assert_eq!(e.code_kind(), CodeKind::FailedPrecondition);

    env.engine.resume_session(&s.id, true).await.expect("fork");
    let e = env
        .engine
        .resume_session(&s.id, false)
        .await
        .expect_err("already running");
    assert_eq!(e.code_kind(), CodeKind::FailedPrecondition);
    env.send(&s.id, "What was the word?").await;
    let (_, evs) = until(&mut sub, is_turn_end).await;
    assert!(
        text_blocks(&evs)
            .iter()
            .any(|t| t == "The word was PINEAPPLE.")
    );
    let forked = env
        .engine
        .get_session(&s.id)
        .await
        .expect("get")
        .record
        .claude_session_id;
    assert!(forked.is_some());
    assert_ne!(forked, first_claude, "a fork gets a new CLI session id");
}

#[tokio::test(flavor = "multi_thread")]
async fn limits_and_errors() {
    let env = Env::with(NEW, scenario("plain_text"), |o| o.max_live_sessions = 1).await;
    let a = env.session(None).await;
    assert_eq!(a.state, SessionState::Idle);
    // At the limit the idle session is suspended to make room (tests/suspend.rs covers
    // the busy case: RESOURCE_EXHAUSTED).
    let a2 = env
        .engine
        .create_session(env.create(None))
        .await
        .expect("the idle session makes room");
    assert_eq!(a2.state, SessionState::Idle);
    let a_now = env.engine.get_session(&a.id).await.expect("get");
    assert_eq!(a_now.state, SessionState::Suspended);

    for id in ["nope", ""] {
        let e = env.engine.get_session(id).await.expect_err("unknown");
        assert_eq!(e.code_kind(), CodeKind::NotFound);
        let e = env.engine.interrupt(id).await.expect_err("unknown");
        assert_eq!(e.code_kind(), CodeKind::NotFound);
    }
    let e = env
        .engine
        .respond_permission(
            &a.id,
            "no-such-request",
            PermissionResponse::Deny {
                message: String::new(),
                interrupt: false,
            },
            ClientRef::new("x"),
        )
        .await
        .expect_err("unknown request");
    assert_eq!(e.code_kind(), CodeKind::NotFound, "{e}");

    let mut bad = env.create(None);
    bad.cwd = env.cwd.join("does-not-exist");
    let e = env
        .engine
        .create_session(bad)
        .await
        .expect_err("missing cwd");
    assert!(
        matches!(&e, Error::InvalidArgument { field, .. } if field == "cwd"),
        "{e}"
    );
    let mut bad = env.create(None);
    bad.cwd = "/".into();
    let e = env
        .engine
        .create_session(bad)
        .await
        .expect_err("outside roots");
    assert!(
        matches!(&e, Error::InvalidArgument { field, message } if field == "cwd" && message.contains("allowed roots")),
        "{e}"
    );
    let mut bad = env.create(None);
    bad.options.permission_mode = Some("yolo".into());
    let e = env.engine.create_session(bad).await.expect_err("bad mode");
    assert_eq!(e.code_kind(), CodeKind::InvalidArgument);

    // Stopping frees the slot.
    env.engine.stop_session(&a2.id).await.expect("stop");
    let b = env.session(None).await;
    let health = env.engine.health().await.expect("health");
    assert_eq!(health.sessions_by_state[&SessionState::Suspended], 1);
    assert_eq!(health.sessions_by_state[&SessionState::Stopped], 1);
    assert_eq!(health.sessions_by_state[&SessionState::Idle], 1);
    assert_eq!(health.live_sessions, 1);
    assert!(health.store.is_ok());

    let page = env
        .engine
        .list_sessions(ListSessions {
            states: vec![SessionState::Stopped],
            ..Default::default()
        })
        .await
        .expect("list");
    assert_eq!(page.sessions.len(), 1);
    assert_eq!(page.sessions[0].id, a2.id);

    let mut follower = env.follow(&b.id, 0).await;
    until(
        &mut follower,
        |e| matches!(&e.payload, EventPayload::StateChanged(c) if c.to == SessionState::Idle),
    )
    .await;
    env.engine.delete_session(&b.id).await.expect("delete");
    // A follower of a deleted session sees its stream end.
    let end = tokio::time::timeout(timeout(), async {
        loop {
            match follower.next().await {
                None => return,
                Some(Ok(_)) => continue,
                Some(Err(e)) => panic!("{e}"),
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the follower of a deleted session never ended");
    let e = env.engine.get_session(&b.id).await.expect_err("deleted");
    assert_eq!(e.code_kind(), CodeKind::NotFound);
    // The slot is free again.
    env.session(None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn labels_filter_and_paginate() {
    let env = Env::with(NEW, scenario("plain_text"), |o| o.max_live_sessions = 8).await;
    for i in 0..3 {
        let mut c = env.create(None);
        c.labels
            .insert("team".into(), if i == 1 { "b".into() } else { "a".into() });
        env.engine.create_session(c).await.expect("create");
    }
    let page = env
        .engine
        .list_sessions(ListSessions {
            labels: vec![("team".into(), "a".into())],
            page_size: 1,
            ..Default::default()
        })
        .await
        .expect("list");
    assert_eq!(page.sessions.len(), 1);
    let next = env
        .engine
        .list_sessions(ListSessions {
            labels: vec![("team".into(), "a".into())],
            page_size: 1,
            page_token: page.next_page_token.clone(),
            ..Default::default()
        })
        .await
        .expect("page 2");
    assert_eq!(next.sessions.len(), 1);
    assert_ne!(next.sessions[0].id, page.sessions[0].id);
    assert!(
        next.sessions
            .iter()
            .chain(&page.sessions)
            .all(|s| s.labels["team"] == "a")
    );
    env.engine.shutdown().await;
}

/// A send that must be answered as a duplicate of an earlier one.
async fn retried(engine: &Engine, id: &str, msg: SendMessage) -> SendOutcome {
    let r = engine.send_message(id, msg).await.expect("retry");
    assert!(r.duplicate, "{r:?}");
    r
}

/// A retried send with the same client message id is not delivered twice, also after a
/// daemon restart.
#[tokio::test(flavor = "multi_thread")]
async fn send_message_is_idempotent() {
    let env = Env::new(NEW, scenario("two_turns")).await;
    let s = env.session(None).await;
    let mut sub = env.follow(&s.id, 0).await;
    let msg = |text: &str| SendMessage {
        content: MessageContent::Text(text.into()),
        client_message_id: Some("m-1".into()),
        client: ClientRef::new("alice"),
        delivery: Default::default(),
    };
    let first = env
        .engine
        .send_message(&s.id, msg("What is 2+2?"))
        .await
        .expect("send");
    assert!(!first.duplicate);
    let again = retried(&env.engine, &s.id, msg("What is 2+2?")).await;
    assert_eq!(again.seq, first.seq);
    until(&mut sub, is_turn_end).await;
    assert_eq!(
        env.server.count_matching(&Match {
            last_user_text_contains: Some("What is 2+2".into()),
            ..Default::default()
        }),
        1
    );
    env.engine.shutdown().await;
    drop(sub);
    let env = env.restarted().await;
    env.engine
        .resume_session(&s.id, false)
        .await
        .expect("resume");
    let after = retried(&env.engine, &s.id, msg("What is 2+2?")).await;
    assert_eq!(after.seq, first.seq);
    assert_eq!(after.message_id, first.message_id);
}

/// With `respawn_on_start`, sessions that were live when the daemon died come back running
/// (resumed), not just resumable.
#[tokio::test(flavor = "multi_thread")]
async fn respawn_on_start_when_configured() {
    let env = Env::with(NEW, scenario("resume"), |o| o.respawn_on_start = true).await;
    let s = env.session(Some("Remember the word PINEAPPLE.")).await;
    let mut sub = env.follow(&s.id, 0).await;
    until(&mut sub, is_turn_end).await;
    drop(sub);
    let env = env.restarted().await;
    let info = env.engine.get_session(&s.id).await.expect("get");
    assert!(info.state.is_live(), "{:?}", info.state);
    let hist = env.history(&s.id).await;
    let mut sub = env.follow(&s.id, hist.len() as u64).await;
    env.send(&s.id, "What was the word?").await;
    let (_, evs) = until(&mut sub, is_turn_end).await;
    assert!(
        text_blocks(&evs)
            .iter()
            .any(|t| t == "The word was PINEAPPLE.")
    );
}

/// A CLI that cannot be started: UNAVAILABLE, and the session is recorded `exited` with the
/// reason (not lost, and its slot is free again).
#[tokio::test(flavor = "multi_thread")]
async fn spawn_failure_is_recorded() {
    let dir = tempfile::tempdir().expect("tmp");
    let cwd = dir.path().canonicalize().expect("cwd");
    let store = ostler_store::Store::open(cwd.join("db"), Default::default()).expect("store");
    let inst = ostler_supervisor::Installation::assume(
        cwd.join("no-such-claude"),
        semver::Version::new(2, 1, 330),
        None,
    );
    let engine = Engine::start(
        EngineOptions {
            max_live_sessions: 1,
            ..Default::default()
        },
        store,
        inst,
    )
    .await
    .expect("engine");
    for _ in 0..2 {
        let e = engine
            .create_session(CreateSession {
                cwd: cwd.clone(),
                ..Default::default()
            })
            .await
            .expect_err("no binary");
        // Every retry fails the same way until the installation is mended.
        assert_eq!(e.code_kind(), CodeKind::FailedPrecondition, "{e}");
    }
    let page = engine
        .list_sessions(ListSessions::default())
        .await
        .expect("list");
    assert_eq!(page.sessions.len(), 2);
    for s in &page.sessions {
        assert_eq!(s.state, SessionState::Exited);
        let reason = s
            .exit
            .as_ref()
            .and_then(|x| x.reason.clone())
            .expect("reason");
        assert!(reason.contains("could not be started"), "{reason}");
    }
}
