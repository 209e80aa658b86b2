//! Issue 10 against real CLI releases: control requests gated by the measured capability
//! matrix, and resume of a session whose CLI transcript is gone.

use crate::common;

use std::time::Instant;

use common::*;
use ostler_engine::*;
use ostler_testkit::scenario::Match;

/// A 1.0.x release that does not answer `set_model` (contracts/compat/<release>.toml).
const IGNORES_SET_MODEL: &str = "1.0.59";

#[tokio::test(flavor = "multi_thread")]
async fn set_model_fails_at_once_where_the_release_ignores_it() {
    let support = installation(IGNORES_SET_MODEL)
        .capabilities
        .control_support("set_model");
    assert!(!support.served(), "matrix says {support:?}");
    let env = Env::new(IGNORES_SET_MODEL, scenario("two_turns")).await;
    let s = env.session(Some("What is 2+2?")).await;
    let mut sub = env.follow(&s.id, 0).await;
    until(&mut sub, is_turn_end).await;
    let started = Instant::now();
    let err = tokio::time::timeout(
        timeout(),
        env.engine.set_model(&s.id, Some("claude-ostler-x".into())),
    )
    .await
    .expect("answered within the guard")
    .expect_err("set_model must be refused");
    let took = started.elapsed();
    assert_eq!(err.code_kind(), CodeKind::FailedPrecondition, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(IGNORES_SET_MODEL) && msg.contains("set_model"),
        "the message names the release and the capability: {msg}"
    );
    // At once: far below the control timeout the request used to wait for.
    assert!(
        took < env.opts.supervisor.control_timeout / 10,
        "took {took:?} (control timeout {:?})",
        env.opts.supervisor.control_timeout
    );
    // Nothing changed and the session still works.
    let info = env.engine.get_session(&s.id).await.expect("get");
    assert_ne!(info.model.as_deref(), Some("claude-ostler-x"));
    env.send(&s.id, "And 3+3?").await;
    until(&mut sub, is_turn_end).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn set_model_still_works_on_2_1() {
    assert!(
        installation(NEW)
            .capabilities
            .control_support("set_model")
            .served()
    );
    let env = Env::new(NEW, scenario("two_turns")).await;
    let s = env.session(Some("What is 2+2?")).await;
    let mut sub = env.follow(&s.id, 0).await;
    until(&mut sub, is_turn_end).await;
    env.engine
        .set_model(&s.id, Some("claude-ostler-test-model".into()))
        .await
        .expect("set_model on 2.1.x");
    env.send(&s.id, "And 3+3?").await;
    until(&mut sub, is_turn_end).await;
    let n = env.server.count_matching(&Match {
        model_contains: Some("claude-ostler-test-model".into()),
        last_user_text_contains: Some("And 3+3".into()),
        ..Default::default()
    });
    assert!(n >= 1, "the new model reached the API");
}

/// A session with one finished turn, stopped, whose CLI transcript is then deleted.
async fn stopped_without_transcript(env: &Env) -> SessionInfo {
    let s = env.session(Some("What is 2+2?")).await;
    let mut sub = env.follow(&s.id, 0).await;
    until(&mut sub, is_turn_end).await;
    let s = env.engine.stop_session(&s.id).await.expect("stop");
    assert!(s.claude_session_id.is_some());
    let projects = env.home.join(".claude").join("projects");
    assert!(exists(&projects), "the CLI wrote its transcript");
    std::fs::remove_dir_all(&projects).expect("wipe transcripts");
    s
}

async fn resume_without_transcript(version: &'static str) {
    let env = Env::new(version, scenario("two_turns")).await;
    let s = stopped_without_transcript(&env).await;

    let err = env
        .engine
        .resume_session(&s.id, false)
        .await
        .expect_err("resume without transcript must fail");
    assert_eq!(err.code_kind(), CodeKind::FailedPrecondition, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("No conversation found") && msg.contains("fresh_conversation_if_missing"),
        "{msg}"
    );
    let fork = env
        .engine
        .resume_session(
            &s.id,
            ResumeOptions {
                fork: true,
                fresh_if_missing: true,
                ..Default::default()
            },
        )
        .await
        .expect_err("nothing to fork");
    assert_eq!(fork.code_kind(), CodeKind::FailedPrecondition, "{fork}");
    let info = env.engine.get_session(&s.id).await.expect("get");
    assert_eq!(info.state, SessionState::Stopped, "refusals change nothing");

    let info = env
        .engine
        .resume_session(
            &s.id,
            ResumeOptions {
                fork: false,
                fresh_if_missing: true,
                ..Default::default()
            },
        )
        .await
        .expect("resume in a fresh conversation");
    assert_eq!(info.state, SessionState::Idle);
    let history = env.history(&s.id).await;
    let lost = history
        .iter()
        .filter(|e| {
            matches!(&e.payload, EventPayload::EngineNotice(n)
                if n.code == CONTEXT_LOST && n.message.contains("context is lost"))
        })
        .count();
    assert_eq!(lost, 1, "events: {:?}", kinds(&history));

    let mut sub = env.follow(&s.id, info.last_seq).await;
    env.send(&s.id, "And 3+3?").await;
    until(&mut sub, is_turn_end).await;
    let info = env.engine.get_session(&s.id).await.expect("get");
    assert_eq!(info.state, SessionState::Idle, "the CLI did not exit");
    assert!(info.claude_session_id.is_some());
    assert_ne!(
        info.claude_session_id, s.claude_session_id,
        "a new conversation"
    );
    // The model saw the new message without the old conversation.
    let with_old = env.server.count_matching(&Match {
        last_user_text_contains: Some("And 3+3".into()),
        messages_contain: Some("2+2 is 4.".into()),
        ..Default::default()
    });
    let without = env.server.count_matching(&Match {
        last_user_text_contains: Some("And 3+3".into()),
        ..Default::default()
    });
    assert_eq!((with_old, without >= 1), (0, true));
}

#[tokio::test(flavor = "multi_thread")]
async fn resume_without_transcript_new() {
    resume_without_transcript(NEW).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn resume_without_transcript_old() {
    resume_without_transcript(OLD).await;
}
