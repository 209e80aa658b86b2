//! Resuming and forking at a message (`ResumeSessionRequest.at_message_id`,
//! `CreateSessionRequest.fork_at_message_id`) against the real CLI: the model's context is
//! cut after the chosen message, in a fork and in place, on 1.0.128 (which matches the API
//! message id) and 2.1.332 (which matches the transcript uuid ostler looks up); a message
//! that is not in the conversation is NOT_FOUND; a release without `--resume-session-at`
//! refuses at once.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error

use crate::common;

use common::grpc::*;
use common::*;
use ostler_proto::v1 as pb;
use ostler_proto::v1::session_service_client::SessionServiceClient;
use tonic::Code;
use tonic::transport::Channel;

/// Two words to remember; the recall names the last one the model's context holds.
const SCENARIO: &str = r#"
default_text = "OK."

[[model]]
name = "remember pineapple"
when = { last_user_text_contains = "Remember the word PINEAPPLE" }
blocks = [{ type = "text", text = "I will remember PINEAPPLE." }]

[[model]]
name = "remember mango"
when = { last_user_text_contains = "Remember the word MANGO" }
blocks = [{ type = "text", text = "I will remember MANGO." }]

[[model]]
name = "recall mango"
when = { last_user_text_contains = "What was the word", messages_contain = "MANGO" }
blocks = [{ type = "text", text = "The word was MANGO." }]

[[model]]
name = "recall pineapple"
when = { last_user_text_contains = "What was the word", messages_contain = "PINEAPPLE" }
blocks = [{ type = "text", text = "The word was PINEAPPLE." }]
"#;

/// The API message id of the assistant block whose text contains `text`, and the id of
/// the user message before it that ostler sent.
async fn ids_of(c: &mut SessionServiceClient<Channel>, id: &str, text: &str) -> (String, String) {
    let log = history(c, id).await;
    let at = log
        .iter()
        .position(|e| assistant_text(e).is_some_and(|t| t.contains(text)))
        .unwrap_or_else(|| panic!("no assistant text {text:?} in the log"));
    let Some(pb::session_event::Payload::AssistantBlock(b)) = &log[at].payload else {
        unreachable!()
    };
    let user = log[..at]
        .iter()
        .rev()
        .find_map(|e| match &e.payload {
            Some(pb::session_event::Payload::UserMessage(u)) if !u.message_id.is_empty() => {
                Some(u.message_id.clone())
            }
            _ => None,
        })
        .expect("the user message before it");
    (b.message_id.clone(), user)
}

async fn stop(c: &mut SessionServiceClient<Channel>, id: &str) {
    c.stop_session(pb::StopSessionRequest {
        session_id: id.to_owned(),
    })
    .await
    .unwrap();
}

async fn resume_at(
    c: &mut SessionServiceClient<Channel>,
    id: &str,
    at: &str,
) -> Result<pb::Session, tonic::Status> {
    c.resume_session(pb::ResumeSessionRequest {
        session_id: id.to_owned(),
        at_message_id: at.to_owned(),
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner())
}

async fn resume_cuts_the_conversation(release: &str) {
    let world = World::with_scenario(release, SCENARIO).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let a = create_session(&mut c, &world.work, "cut").await;
    turn(&mut c, &a.id, "Remember the word PINEAPPLE").await;
    let (first_answer, first_prompt) = ids_of(&mut c, &a.id, "I will remember PINEAPPLE").await;
    turn(&mut c, &a.id, "Remember the word MANGO").await;
    let both = turn(&mut c, &a.id, "What was the word?").await;
    assert!(
        both.contains("MANGO"),
        "{release}: before the cut: {both:?}"
    );

    {
        // Fork at the first answer: a new session whose context ends there; A untouched.
        let a_log = history(&mut c, &a.id).await;
        let b = c
            .create_session(pb::CreateSessionRequest {
                cwd: world.work.display().to_string(),
                fork_from_session_id: a.id.clone(),
                fork_at_message_id: first_answer.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let first = history(&mut c, &b.id).await;
        let Some(pb::session_event::Payload::EngineNotice(n)) = &first[0].payload else {
            panic!("first event: {:?}", first[0]);
        };
        let data: serde_json::Value = serde_json::from_str(&n.data_json).unwrap();
        assert_eq!(data["fork_point"]["at_message_id"], first_answer.as_str());
        let answer = turn(&mut c, &b.id, "What was the word?").await;
        assert!(
            answer.contains("PINEAPPLE"),
            "{release}: the fork's context ends at the first answer: {answer:?}"
        );
        // The source is untouched (`turn` waited until A's log rested, 2.1.332's
        // message lifecycle included).
        assert_eq!(
            history(&mut c, &a.id).await,
            a_log,
            "the source is untouched"
        );
    }

    stop(&mut c, &a.id).await;
    // Not a message of this conversation: NOT_FOUND, and the session stays as it was.
    let e = resume_at(&mut c, &a.id, "msg_not_in_this_conversation")
        .await
        .expect_err("unknown message");
    assert_eq!(e.code(), Code::NotFound, "{release}: {e:?}");
    assert!(e.message().contains("at_message_id"), "{}", e.message());
    let e = resume_at(&mut c, &a.id, "../etc/passwd")
        .await
        .expect_err("not a message id");
    assert_eq!(e.code(), Code::InvalidArgument, "{release}: {e:?}");
    if release == OLD {
        // 1.0.128 cuts only at assistant messages (it matches the API message id).
        let e = resume_at(&mut c, &a.id, &first_prompt)
            .await
            .expect_err("a user message on 1.0.128");
        assert_eq!(e.code(), Code::InvalidArgument, "{release}: {e:?}");
        assert!(
            e.message()
                .contains("Claude Code 1.0.128 resumes only at an assistant message"),
            "the refusal names the release: {}",
            e.message()
        );
    }

    // In place: same session, seq continues, the model's context ends at the first answer.
    let before = session(&mut c, &a.id).await.last_seq;
    let resumed = resume_at(&mut c, &a.id, &first_answer).await.unwrap();
    assert_eq!(resumed.id, a.id);
    let answer = turn(&mut c, &a.id, "What was the word?").await;
    assert!(
        answer.contains("PINEAPPLE") && !answer.contains("MANGO"),
        "{release}: resumed at the first answer: {answer:?}"
    );
    let log = history(&mut c, &a.id).await;
    assert!(log.iter().any(|e| e.seq > before
        && matches!(&e.payload, Some(pb::session_event::Payload::EngineNotice(n))
            if n.code == "resuming" && n.data_json.contains(&first_answer))));
    assert_gap_free(&log, 1);
}

#[tokio::test]
async fn resume_cuts_the_conversation_new() {
    resume_cuts_the_conversation(NEW).await;
}

#[tokio::test]
async fn resume_cuts_the_conversation_old() {
    resume_cuts_the_conversation(OLD).await;
}

/// 1.0.108 has no `--resume-session-at` (measured): refused at once, nothing spawned.
#[tokio::test]
async fn a_release_without_the_flag_refuses_at_once() {
    let world = World::with_scenario("1.0.108", SCENARIO).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let a = create_session(&mut c, &world.work, "old").await;
    turn(&mut c, &a.id, "Remember the word PINEAPPLE").await;
    let (answer, _) = ids_of(&mut c, &a.id, "I will remember PINEAPPLE").await;
    stop(&mut c, &a.id).await;
    let before = session(&mut c, &a.id).await;
    let e = resume_at(&mut c, &a.id, &answer)
        .await
        .expect_err("no --resume-session-at");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("--resume-session-at"),
        "{}",
        e.message()
    );
    let after = session(&mut c, &a.id).await;
    assert_eq!(after.state, before.state, "nothing was spawned");
}

async fn resume_guarded(
    c: &mut SessionServiceClient<Channel>,
    id: &str,
    at: &str,
    drops: &str,
) -> Result<pb::Session, tonic::Status> {
    c.resume_session(pb::ResumeSessionRequest {
        session_id: id.to_owned(),
        at_message_id: at.to_owned(),
        drops_turn_message_id: drops.to_owned(),
        ..Default::default()
    })
    .await
    .map(|r| r.into_inner())
}

/// The messages of the fake model's last request, as JSON text.
fn last_request(world: &World) -> String {
    let r = world.fake.requests();
    let body = r.last().and_then(|r| r.body.clone()).expect("a request");
    body["messages"].to_string()
}

/// A guarded cut (`drops_turn_message_id`, `--resume-drops-turn`) on 2.1.332: dropping
/// exactly the last turn is taken, in a fork (the source untouched) and in place, and the
/// model's next request lacks it; a cut whose dropped range holds another turn's prompt is
/// refused by the CLI (FAILED_PRECONDITION with its reason), recorded as a refusal (no
/// turn, not a crash: the session is `stopped`), and the session then resumes plainly with
/// its whole conversation.
#[tokio::test]
async fn a_guarded_cut_drops_one_turn_or_is_refused() {
    let world = World::with_scenario(NEW, SCENARIO).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let a = create_session(&mut c, &world.work, "guarded").await;
    turn(&mut c, &a.id, "Remember the word PINEAPPLE").await;
    let (first_answer, _) = ids_of(&mut c, &a.id, "I will remember PINEAPPLE").await;
    turn(&mut c, &a.id, "Remember the word MANGO").await;
    let (_, mango_prompt) = ids_of(&mut c, &a.id, "I will remember MANGO").await;
    stop(&mut c, &a.id).await;

    // Without at_message_id: INVALID_ARGUMENT naming the field.
    let e = resume_guarded(&mut c, &a.id, "", &mango_prompt)
        .await
        .expect_err("a guard without a cut");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("drops_turn_message_id"),
        "{}",
        e.message()
    );

    // A guarded fork dropping exactly the last turn: taken; the fork's model request
    // lacks that turn, and the source is untouched.
    {
        let a_log = history(&mut c, &a.id).await;
        let b = c
            .create_session(pb::CreateSessionRequest {
                cwd: world.work.display().to_string(),
                fork_from_session_id: a.id.clone(),
                fork_at_message_id: first_answer.clone(),
                fork_drops_turn_message_id: mango_prompt.clone(),
                ..Default::default()
            })
            .await
            .expect("the guard holds: the fork is made")
            .into_inner();
        assert_ne!(b.id, a.id);
        let first = history(&mut c, &b.id).await;
        let Some(pb::session_event::Payload::EngineNotice(n)) = &first[0].payload else {
            panic!("first event: {:?}", first[0]);
        };
        let data: serde_json::Value = serde_json::from_str(&n.data_json).unwrap();
        assert_eq!(
            data["fork_point"]["drops_turn_message_id"],
            mango_prompt.as_str()
        );
        let answer = turn(&mut c, &b.id, "What was the word?").await;
        assert!(
            answer.contains("PINEAPPLE") && !answer.contains("MANGO"),
            "the guarded fork dropped the MANGO turn: {answer:?}"
        );
        let seen = last_request(&world);
        assert!(
            seen.contains("PINEAPPLE") && !seen.contains("MANGO"),
            "the fork's model request lacks the dropped turn: {seen}"
        );
        assert_eq!(
            history(&mut c, &a.id).await,
            a_log,
            "the source is untouched"
        );
        stop(&mut c, &b.id).await;
    }

    // (a) Dropping exactly the last turn: taken; the model's next request lacks it (the
    // source of the fork above still has the MANGO turn to drop).
    resume_guarded(&mut c, &a.id, &first_answer, &mango_prompt)
        .await
        .unwrap();
    let answer = turn(&mut c, &a.id, "What was the word?").await;
    assert!(
        answer.contains("PINEAPPLE") && !answer.contains("MANGO"),
        "the guarded cut dropped the MANGO turn: {answer:?}"
    );
    let seen = last_request(&world);
    assert!(
        seen.contains("PINEAPPLE") && !seen.contains("MANGO"),
        "the model's request lacks the dropped turn: {seen}"
    );
    let (_, recall_prompt) = ids_of(&mut c, &a.id, "The word was PINEAPPLE").await;
    turn(&mut c, &a.id, "Remember the word MANGO").await;
    stop(&mut c, &a.id).await;

    // (b) Dropping the recall turn at the first answer would also drop the MANGO turn
    // after it: the CLI refuses, a typed, non-retryable FAILED_PRECONDITION with its reason.
    let e = resume_guarded(&mut c, &a.id, &first_answer, &recall_prompt)
        .await
        .expect_err("the dropped range holds another turn");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    for part in [
        "drops_turn_message_id",
        "not retryable",
        "Resume rejected by --resume-drops-turn:",
        "not attributable to the declared turn",
    ] {
        assert!(e.message().contains(part), "{part:?} in {}", e.message());
    }
    // Not wedged: the refused process has ended, stopped (not crashed), the exit names
    // the refusal and keeps the CLI's stderr, and the refusal is on record as a notice,
    // not as a turn (no turn ran).
    let s = session(&mut c, &a.id).await;
    assert_eq!(s.state(), pb::SessionState::Stopped, "{s:?}");
    let exit = s.last_exit.clone().expect("the refused process's exit");
    assert!(
        exit.reason.starts_with("resume refused by the CLI: ")
            && exit
                .reason
                .contains("Resume rejected by --resume-drops-turn:"),
        "exit reason: {exit:?}"
    );
    let log = history(&mut c, &a.id).await;
    let resumed_at = log
        .iter()
        .rposition(|e| {
            matches!(&e.payload,
            Some(pb::session_event::Payload::EngineNotice(n)) if n.code == "resuming")
        })
        .expect("the refused resume's notice");
    let refused = &log[resumed_at..];
    assert!(
        !refused.iter().any(|e| matches!(
            &e.payload,
            Some(pb::session_event::Payload::TurnCompleted(_))
        )),
        "no turn completed for the refusal: {refused:#?}"
    );
    assert!(refused.iter().any(|e| matches!(&e.payload,
        Some(pb::session_event::Payload::EngineNotice(n))
            if n.code == "resume_refused" && n.data_json.contains(&recall_prompt)
                && n.data_json.contains("error_during_execution"))));
    assert!(
        refused.iter().any(|e| matches!(&e.payload,
            Some(pb::session_event::Payload::ProcessExited(p)) if *p == exit)),
        "the exit event is the session's last exit"
    );
    // The same guard on a fork: refused, and no session is left behind.
    let before = c
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sessions
        .len();
    let e = c
        .create_session(pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            fork_from_session_id: a.id.clone(),
            fork_at_message_id: first_answer.clone(),
            fork_drops_turn_message_id: recall_prompt.clone(),
            ..Default::default()
        })
        .await
        .expect_err("a refused guarded fork");
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message().contains("fork_drops_turn_message_id")
            && e.message()
                .contains("Resume rejected by --resume-drops-turn:"),
        "{}",
        e.message()
    );
    let after = c
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sessions
        .len();
    assert_eq!(after, before, "the refused fork is not kept");
    // The session stays usable: a plain resume has the whole conversation.
    c.resume_session(pb::ResumeSessionRequest {
        session_id: a.id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let answer = turn(&mut c, &a.id, "What was the word?").await;
    assert!(answer.contains("MANGO"), "resumed whole: {answer:?}");
}
