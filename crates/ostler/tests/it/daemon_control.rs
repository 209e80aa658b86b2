//! gRPC-level acceptance tests of the daemon's session controls against the real CLI:
//! AskUserQuestion, interrupt, set_model, kill -9 of the daemon mid-turn with restart and
//! ResumeSession, a stalled subscriber that must not slow anyone down, health and
//! reflection.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error

use crate::common;

use common::grpc::*;
use common::*;
use ostler_proto::v1 as pb;
use pb::session_event::Payload as P;

/// AskUserQuestion reaches clients as QuestionAsked; the answer goes back to the model.
async fn ask_user_question(release: &str) {
    let world = World::new(release).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "q").await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "Ask me which database to use.").await;
    let asked = read_until(&mut events, &mut seen, "question", |e| {
        matches!(
            e.payload,
            Some(P::QuestionAsked(_)) | Some(P::TurnCompleted(_))
        )
    })
    .await;
    let Some(P::QuestionAsked(q)) = asked.payload else {
        // Releases without the AskUserQuestion tool end the turn instead.
        assert!(
            !seen.iter().any(|e| matches!(e.payload, Some(P::SessionStarted(ref s)) if s.tools.iter().any(|t| t == "AskUserQuestion"))),
            "the release offers AskUserQuestion but no question reached the client: {:#?}",
            seen.iter().map(describe).collect::<Vec<_>>()
        );
        return;
    };
    assert_eq!(q.questions.len(), 1);
    assert_eq!(q.questions[0].question, "Which database should I use?");
    assert_eq!(q.questions[0].options[0].label, "SQLite");

    // Every question needs an answer.
    let err = c
        .answer_question(pb::AnswerQuestionRequest {
            session_id: s.id.clone(),
            request_id: q.request_id.clone(),
            answers: vec![pb::QuestionAnswer {
                question: "Something else?".into(),
                selected: vec!["SQLite".into()],
                other_text: String::new(),
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");

    let r = c
        .answer_question(as_client(
            "q",
            pb::AnswerQuestionRequest {
                session_id: s.id.clone(),
                request_id: q.request_id.clone(),
                answers: vec![pb::QuestionAnswer {
                    question: "Which database should I use?".into(),
                    selected: vec!["SQLite".into()],
                    other_text: String::new(),
                }],
            },
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.answered.unwrap().resolution(), pb::Resolution::Answered);
    read_until(&mut events, &mut seen, "turn end", is_turn_completed).await;
    assert!(
        seen.iter()
            .any(|e| assistant_text(e) == Some("Thanks, I will use your choice.")),
        "{:#?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );
    // The model received the answer in the tool result.
    let got_answer = world.fake.requests().iter().any(|r| {
        r.body.as_ref().is_some_and(|b| {
            b.to_string().contains("toolu_ask_1") && b.to_string().contains("SQLite")
        })
    });
    assert!(got_answer, "the answer reached the model");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ask_user_question_2_1_330() {
    ask_user_question(NEW).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ask_user_question_1_0_128() {
    ask_user_question(OLD).await;
}

/// Interrupt mid-answer ends the turn; the session takes the next message. SetModel
/// changes the model the next turn uses.
async fn interrupt_and_set_model(release: &str) {
    let world = World::new(release).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "i").await;
    let mut events = subscribe(&mut c, &s.id, 0, true).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "Tell me a long story.").await;
    let mut deltas = 0;
    read_until(&mut events, &mut seen, "two partial deltas", |e| {
        if matches!(e.payload, Some(P::PartialDelta(_))) {
            deltas += 1;
        }
        deltas >= 2
    })
    .await;
    assert!(
        seen.iter()
            .all(|e| matches!(e.payload, Some(P::PartialDelta(_))) == (e.seq == 0)),
        "partials and only partials have seq 0"
    );
    // On 2.1.x a message sent behind the running turn waits in the CLI's queue; the
    // interrupt's receipt lists it as one that will still run (releases announcing
    // `interrupt_receipt_v1`; 1.0.x answers with none).
    let queued = if release == NEW {
        let seq = send(&mut c, &s.id, "Are you still there?").await;
        let sent = read_until(&mut events, &mut seen, "the queued message", |e| {
            e.seq == seq && matches!(e.payload, Some(P::UserMessage(_)))
        })
        .await;
        let Some(P::UserMessage(u)) = sent.payload else {
            unreachable!()
        };
        Some(u.message_id)
    } else {
        None
    };
    let receipt = c
        .interrupt(pb::InterruptRequest {
            session_id: s.id.clone(),
            cancel_queued: false,
        })
        .await
        .unwrap()
        .into_inner();
    match &queued {
        Some(id) => assert!(receipt.still_queued.contains(id), "{receipt:?} {id}"),
        None => assert!(receipt.still_queued.is_empty(), "{receipt:?}"),
    }
    assert!(receipt.cancelled.is_empty(), "{receipt:?}");
    let end = read_until(
        &mut events,
        &mut seen,
        "interrupted turn end",
        is_turn_completed,
    )
    .await;
    let Some(P::TurnCompleted(t)) = &end.payload else {
        unreachable!()
    };
    let full = "Once upon a time there was a daemon that kept many sessions alive, and every one of them streamed its answers slowly, delta after delta, until someone pressed stop.";
    assert!(
        !seen.iter().any(|e| assistant_text(e) == Some(full)),
        "the story was cut short ({}): {:#?}",
        t.subtype,
        seen.iter().map(describe).collect::<Vec<_>>()
    );

    // The queued message runs after the interrupt, as the receipt said; on 1.0.x it is
    // sent now.
    if queued.is_none() {
        send(&mut c, &s.id, "Are you still there?").await;
    }
    read_until(&mut events, &mut seen, "still there", |e| {
        assistant_text(e) == Some("Yes, still here.")
    })
    .await;
    read_until(&mut events, &mut seen, "turn end", is_turn_completed).await;

    // The mode in effect comes back (named by the CLI's answer on 2.1.x, the one asked
    // for where the answer names none) and is the session's.
    let now = c
        .set_permission_mode(pb::SetPermissionModeRequest {
            session_id: s.id.clone(),
            mode: pb::PermissionMode::AcceptEdits as i32,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(now.mode(), pb::PermissionMode::AcceptEdits);
    assert_eq!(now.cli_mode, "acceptEdits");
    assert_eq!(
        session(&mut c, &s.id).await.permission_mode(),
        pb::PermissionMode::AcceptEdits
    );
    let err = c
        .set_permission_mode(pb::SetPermissionModeRequest {
            session_id: "no-such-session".into(),
            mode: pb::PermissionMode::Plan as i32,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    // A model the session could not be resumed with (`--model -x` would be read as an
    // option) is refused before it is sent or recorded, by either way of switching.
    let err = c
        .set_model(pb::SetModelRequest {
            session_id: s.id.clone(),
            model: "--help".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("starts with '-'"), "{err:?}");
    let err = c
        .send_control_request(pb::SendControlRequestRequest {
            session_id: s.id.clone(),
            subtype: "apply_flag_settings".into(),
            request_json: r#"{"settings": {"model": "-evil"}}"#.into(),
        })
        .await
        .unwrap_err();
    // (A release that leaves unknown control requests unanswered refuses any first.)
    let refused = if release == OLD {
        tonic::Code::FailedPrecondition
    } else {
        tonic::Code::InvalidArgument
    };
    assert_eq!(err.code(), refused, "{err:?}");
    let info = session(&mut c, &s.id).await;
    assert!(!info.model.starts_with('-'), "{info:?}");
    c.set_model(pb::SetModelRequest {
        session_id: s.id.clone(),
        model: "claude-opus-test".into(),
    })
    .await
    .unwrap();
    send(&mut c, &s.id, "Which model are you?").await;
    read_until(&mut events, &mut seen, "answer from the new model", |e| {
        assistant_text(e) == Some("Answer from opus-test.")
    })
    .await;
    read_until(&mut events, &mut seen, "turn end", is_turn_completed).await;

    // A name the CLI maps to another model (2.1.332 answers claude-opus-4-1 with the model
    // it runs): the record and the notice say what the CLI said it switched to.
    if release == NEW {
        c.set_model(pb::SetModelRequest {
            session_id: s.id.clone(),
            model: "claude-opus-4-1".into(),
        })
        .await
        .unwrap();
        let notice = read_until(
            &mut events,
            &mut seen,
            "model_set",
            |e| matches!(&e.payload, Some(P::EngineNotice(n)) if n.code == "model_set"),
        )
        .await;
        let Some(P::EngineNotice(n)) = &notice.payload else {
            unreachable!()
        };
        let data: serde_json::Value = serde_json::from_str(&n.data_json).unwrap();
        let recorded = session(&mut c, &s.id).await.model;
        if let Some(answered) = data["answer"]["model"].as_str() {
            assert_eq!(recorded, answered, "{data}");
            assert!(n.message.contains(answered), "{}", n.message);
        } else {
            assert_eq!(recorded, "claude-opus-4-1", "{data}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interrupt_and_set_model_2_1_330() {
    interrupt_and_set_model(NEW).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interrupt_and_set_model_1_0_128() {
    interrupt_and_set_model(OLD).await;
}

/// kill -9 of the daemon mid-turn; a new daemon on the same store has the history intact
/// and ResumeSession continues the conversation (the model sees the earlier turn).
async fn kill9_restart_resume(release: &str) {
    let world = World::new(release).await;
    let mut daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "k").await;
    let mut events = subscribe(&mut c, &s.id, 0, true).await;
    let mut seen = Vec::new();
    // A complete first turn (1.0.128 writes its transcript only when a turn ends, so a
    // conversation killed in its very first turn has nothing to resume from).
    send(&mut c, &s.id, "Remember the word PINEAPPLE.").await;
    read_until(&mut events, &mut seen, "first turn end", is_turn_completed).await;
    // The second turn is killed mid-answer.
    send(&mut c, &s.id, "Tell me a long story.").await;
    read_until(&mut events, &mut seen, "mid-answer", |e| {
        matches!(e.payload, Some(P::PartialDelta(_)))
    })
    .await;
    let before: Vec<pb::SessionEvent> = seen.iter().filter(|e| e.seq != 0).cloned().collect();
    daemon.kill9();
    drop(events);

    let mut daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let got = c
        .get_session(pb::GetSessionRequest {
            session_id: s.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        !matches!(
            got.state(),
            pb::SessionState::Idle | pb::SessionState::Running | pb::SessionState::Starting
        ),
        "no process backs the session after the restart: {:?}",
        got.state()
    );
    // History: every event the first daemon delivered is still there, in order, gap-free.
    let history = history(&mut c, &s.id).await;
    assert_gap_free(&history, 1);
    assert!(
        history.len() >= before.len(),
        "{} < {}",
        history.len(),
        before.len()
    );
    assert_eq!(
        &history[..before.len()],
        &before[..],
        "stored history intact"
    );
    assert!(history.iter().any(|e| matches!(
        &e.payload,
        Some(P::UserMessage(u)) if u.text.contains("Remember the word PINEAPPLE")
    )));

    let resumed = c
        .resume_session(pb::ResumeSessionRequest {
            session_id: s.id.clone(),
            fork: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resumed.id, s.id);
    let last = history.last().map(|e| e.seq).unwrap_or(0);
    let mut events = subscribe(&mut c, &s.id, last, false).await;
    let mut seen = Vec::new();
    let seq = send(&mut c, &s.id, "What was the word?").await;
    assert!(seq > last, "seq continues after a restart: {seq} <= {last}");
    read_until(&mut events, &mut seen, "recall", |e| {
        assistant_text(e) == Some("The word was PINEAPPLE.")
    })
    .await;
    assert_gap_free(
        &seen
            .iter()
            .filter(|e| !e.redelivered)
            .cloned()
            .collect::<Vec<_>>(),
        last + 1,
    );
    read_until(&mut events, &mut seen, "recall turn end", is_turn_completed).await;

    // StopSession, then a fork: a new session that continues the same conversation.
    let stopped = c
        .stop_session(pb::StopSessionRequest {
            session_id: s.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stopped.state(), pb::SessionState::Stopped);
    let err = c
        .send_message(pb::SendMessageRequest {
            session_id: s.id.clone(),
            content: text("Are you still there?"),
            client_message_id: String::new(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    if release == NEW {
        // The engine keeps one ostler session: the fork branches the CLI conversation
        // (a new CLI session id), the ostler history continues.
        let cli_before = stopped.cli_session_id.clone();
        assert!(!cli_before.is_empty());
        let fork = c
            .resume_session(pb::ResumeSessionRequest {
                session_id: s.id.clone(),
                fork: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(fork.id, s.id);
        // The daemon dies before anything is written to the fork, which has made no
        // conversation of its own yet: the resume on demand that the next message brings
        // must fork again, not continue the conversation the fork leaves as it was.
        daemon.kill9();
        daemon = world.daemon(&[]).await;
        c = daemon.sessions().await;
        let mut fe = subscribe(&mut c, &fork.id, stopped.last_seq, false).await;
        let mut fseen = Vec::new();
        send(&mut c, &fork.id, "What was the word?").await;
        read_until(&mut fe, &mut fseen, "recall in the fork", |e| {
            assistant_text(e) == Some("The word was PINEAPPLE.")
        })
        .await;
        let on_demand = fseen
            .iter()
            .rev()
            .find_map(|e| match &e.payload {
                Some(P::EngineNotice(n)) if n.code == "resuming" => Some(n.clone()),
                _ => None,
            })
            .expect("the resume on demand");
        let data: serde_json::Value = serde_json::from_str(&on_demand.data_json).unwrap();
        assert_eq!(
            (&data["on_demand"], &data["fork"]),
            (&true.into(), &true.into()),
            "{data}"
        );
        let after = c
            .get_session(pb::GetSessionRequest {
                session_id: s.id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_ne!(
            after.cli_session_id, cli_before,
            "the fork has its own CLI session"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_restart_resume_2_1_330() {
    kill9_restart_resume(NEW).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill9_restart_resume_1_0_128() {
    kill9_restart_resume(OLD).await;
}

/// A subscriber that stops reading (after one event) delays neither another client nor
/// the session; afterwards it catches up completely.
/// StopSession during a turn ends the turn first, as Interrupt does: with a permission
/// prompt pending, the CLI runs no tool and calls the model no more (closing its stdin
/// alone let it go on: the model was called again with the tool's error), and the prompt
/// is withdrawn, so a late answer is refused instead of recorded as allowing.
async fn stop_ends_the_running_turn(release: &str) {
    let world = World::new(release).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "stopper").await;
    let mut events = subscribe(&mut c, &s.id, 0, true).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "Create the file allowed.txt please.").await;
    let prompt = read_until(&mut events, &mut seen, "permission prompt", |e| {
        matches!(e.payload, Some(P::PermissionRequested(_)))
    })
    .await;
    let Some(P::PermissionRequested(req)) = &prompt.payload else {
        unreachable!()
    };
    let stopped = c
        .stop_session(pb::StopSessionRequest {
            session_id: s.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stopped.state(), pb::SessionState::Stopped);
    assert!(
        !world.model_saw("toolu_touch_1"),
        "the model was called again after the stop (with the tool's result)"
    );
    assert!(!world.work.join("allowed.txt").exists(), "the tool ran");
    let late = c
        .respond_to_permission(pb::RespondToPermissionRequest {
            session_id: s.id.clone(),
            request_id: req.request_id.clone(),
            decision: Some(pb::respond_to_permission_request::Decision::Allow(
                pb::PermissionAllow::default(),
            )),
        })
        .await;
    assert_refused(late, tonic::Code::FailedPrecondition, "");
    read_until(&mut events, &mut seen, "the prompt withdrawn", |e| {
        matches!(&e.payload, Some(P::PermissionResolved(r))
            if r.request_id == req.request_id
                && r.resolution() == pb::Resolution::Cancelled)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stop_ends_the_running_turn_2_1_332() {
    stop_ends_the_running_turn(NEW).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stop_ends_the_running_turn_1_0_128() {
    stop_ends_the_running_turn(OLD).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stalled_subscriber_delays_nobody() {
    let world = World::new(NEW).await;
    let daemon = world.daemon(&[]).await;
    let mut fast = daemon.sessions().await;
    let mut slow = daemon.sessions().await;
    let s = create_session(&mut fast, &world.work, "fast").await;
    let mut slow_events = subscribe(&mut slow, &s.id, 0, true).await;
    let mut fast_events = subscribe(&mut fast, &s.id, 0, true).await;
    let mut slow_seen = Vec::new();

    // Five turns of about 400 kB of text each (the block, its partial deltas and the
    // result each carry it): several MB, far more than the HTTP/2 windows and every buffer
    // between the engine and a client that does not read.
    let mut fast_seen = Vec::new();
    for _ in 0..5 {
        send(&mut fast, &s.id, "Give me a large answer.").await;
        if slow_seen.is_empty() {
            // The slow client reads exactly one event, then stalls.
            read_until(
                &mut slow_events,
                &mut slow_seen,
                "first event (slow)",
                |_| true,
            )
            .await;
        }
        read_until(
            &mut fast_events,
            &mut fast_seen,
            "turn end (fast)",
            is_turn_completed,
        )
        .await;
    }
    // The session finished its work while the slow client was stalled.
    let info = fast
        .get_session(pb::GetSessionRequest {
            session_id: s.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.state(), pb::SessionState::Idle);
    let last = fast_seen.iter().rev().find(|e| e.seq != 0).unwrap().seq;
    assert!(info.last_seq >= last);
    assert_eq!(slow_seen.len(), 1, "the slow client really was stalled");

    // Now the slow client catches up: every stored event, in order, once.
    read_until(&mut slow_events, &mut slow_seen, "slow catches up", |e| {
        e.seq == last
    })
    .await;
    let stored = |v: &[pb::SessionEvent]| -> Vec<pb::SessionEvent> {
        v.iter()
            .filter(|e| e.seq != 0 && !e.redelivered)
            .cloned()
            .collect()
    };
    assert_gap_free(&stored(&slow_seen), 1);
    assert_eq!(stored(&slow_seen), stored(&fast_seen));
}

/// Health, details and reflection answer on a real daemon.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn health_details_and_reflection() {
    let world = World::new(NEW).await;
    let daemon = world.daemon(&[]).await;
    let ch = daemon.channel().await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(ch.clone());
    let st = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "ostler.v1.SessionService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        st.status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
    let d = daemon
        .daemon_client()
        .await
        .get_health_details(pb::GetHealthDetailsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(d.daemon_version, env!("CARGO_PKG_VERSION"));
    let cc = d.claude_code.unwrap();
    assert_eq!(cc.version, NEW);
    assert_eq!(cc.binary_path, world.claude.display().to_string());
    assert_ne!(cc.level(), pb::CompatibilityLevel::Unspecified);
    assert!(!cc.message.is_empty());
    let store = d.store.unwrap();
    assert!(store.ok, "{}", store.message);
    assert_eq!(store.path, world.store.display().to_string());

    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut refl = ServerReflectionClient::new(ch);
    let mut stream = refl
        .server_reflection_info(tokio_stream::iter(vec![ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        }]))
        .await
        .unwrap()
        .into_inner();
    let resp = stream.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else {
        panic!("{resp:?}");
    };
    assert!(
        list.service
            .iter()
            .any(|s| s.name == "ostler.v1.SessionService")
    );
}

/// SIGTERM: subscribers are told (UNAVAILABLE), the daemon exits 0 and removes its Unix
/// socket; a restarted daemon has the whole history. The Unix socket serves gRPC too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_tells_subscribers_and_keeps_history() {
    let world = World::new(NEW).await;
    let sock = world.dir.path().join("ostler.sock");
    let mut daemon = world
        .daemon(&["--unix-socket", sock.to_str().unwrap()])
        .await;

    // The Unix socket answers.
    let path = sock.clone();
    let uds = tonic::transport::Endpoint::try_from("http://localhost")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let p = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(p).await?,
                ))
            }
        }))
        .await
        .unwrap();
    let mut c = ostler_proto::v1::session_service_client::SessionServiceClient::new(uds);
    let s = c
        .create_session(pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            labels: [("team".to_owned(), "blue".to_owned())].into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    // A retried send with the same client message id is delivered once.
    let msg = || pb::SendMessageRequest {
        session_id: s.id.clone(),
        content: text("Say hello."),
        client_message_id: "msg-1".into(),
        ..Default::default()
    };
    let first = c.send_message(msg()).await.unwrap().into_inner();
    let again = c.send_message(msg()).await.unwrap().into_inner();
    assert!(!first.duplicate);
    assert!(again.duplicate);
    assert_eq!(first.seq, again.seq);
    assert!(
        !first.message_id.is_empty() && again.message_id == first.message_id,
        "the duplicate names the first send's message: {first:?} {again:?}"
    );
    read_until(&mut events, &mut seen, "turn end", is_turn_completed).await;
    let last = seen.last().unwrap().seq;
    let sent = seen
        .iter()
        .filter(|e| matches!(&e.payload, Some(P::UserMessage(u)) if u.client_message_id == "msg-1"))
        .count();
    assert_eq!(sent, 1, "delivered once");
    assert_eq!(
        world.fake.count_matching(&ostler_testkit::scenario::Match {
            last_user_text_contains: Some("Say hello".into()),
            stream: Some(true),
            ..Default::default()
        }),
        1,
        "the model was asked once"
    );

    let status = daemon.terminate().await;
    assert_eq!(status.code(), Some(0), "{}", daemon.log_text());
    // The subscriber was told, not cut off silently: UNAVAILABLE (after any events that
    // the shutdown itself produced).
    let told = tokio::time::timeout(guard(), async {
        loop {
            match events.message().await {
                Ok(Some(e)) => seen.push(e),
                Ok(None) => return None,
                Err(st) => return Some(st),
            }
        }
    })
    .await
    .expect("the stream ends");
    let st = told.expect("the stream ends with a status, not silently");
    assert_eq!(st.code(), tonic::Code::Unavailable, "{st:?}");
    assert!(!sock.exists(), "the socket file is removed");

    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let got = c
        .get_session(pb::GetSessionRequest {
            session_id: s.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        matches!(
            got.state(),
            pb::SessionState::Stopped | pb::SessionState::Resumable | pb::SessionState::Exited
        ),
        "{:?}",
        got.state()
    );
    // ListSessions filters by label and state.
    let list = |labels: &[(&str, &str)], states: Vec<i32>| pb::ListSessionsRequest {
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        states,
        ..Default::default()
    };
    let page = c
        .list_sessions(list(&[("team", "blue")], vec![got.state]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.sessions.len(), 1);
    assert_eq!(page.sessions[0].id, s.id);
    assert_eq!(
        page.sessions[0].labels.get("team").map(String::as_str),
        Some("blue")
    );
    let page = c
        .list_sessions(list(&[("team", "red")], vec![]))
        .await
        .unwrap()
        .into_inner();
    assert!(page.sessions.is_empty());
    let page = c
        .list_sessions(list(&[], vec![pb::SessionState::Running as i32]))
        .await
        .unwrap()
        .into_inner();
    assert!(page.sessions.is_empty());

    let history = history(&mut c, &s.id).await;
    assert_gap_free(&history, 1);
    assert!(history.last().unwrap().seq >= last);
    assert!(
        history
            .iter()
            .any(|e| assistant_text(e) == Some("Hello from the fake model!"))
    );
}

const DELIVERY_SCENARIO: &str = r#"
default_text = "ok"

# First: the urgent message's request has the stopped turn's message in its last user
# message too (2.1.332 joins the two).
[[model]]
name = "urgent"
when = { last_user_text_contains = "Urgent" }
blocks = [{ type = "text", text = "Urgent done." }]

[[model]]
name = "held two"
when = { last_user_text_contains = "Long task two" }
hold_until = "go"
blocks = [{ type = "text", text = "The second long answer." }]

[[model]]
name = "held"
when = { last_user_text_contains = "Long task" }
hold_until = "go"
blocks = [{ type = "text", text = "The long answer." }]

[[model]]
name = "codeword"
when = { last_user_text_contains = "What is the codeword", messages_contain = "PLUM-42" }
blocks = [{ type = "text", text = "The codeword is PLUM-42." }]
"#;

/// A SendMessage with delivery fields, as client "sender".
async fn send_with(
    c: &mut pb::session_service_client::SessionServiceClient<tonic::transport::Channel>,
    session_id: &str,
    t: &str,
    fields: pb::SendMessageRequest,
) -> Result<pb::SendMessageResponse, tonic::Status> {
    c.send_message(as_client(
        "sender",
        pb::SendMessageRequest {
            session_id: session_id.to_owned(),
            content: text(t),
            ..fields
        },
    ))
    .await
    .map(tonic::Response::into_inner)
}

/// A SendMessage's fields for a message sent with priority `p`.
fn with_priority(p: pb::MessagePriority) -> pb::SendMessageRequest {
    pb::SendMessageRequest {
        priority: p as i32,
        ..Default::default()
    }
}

/// A SendMessage's fields for a context-only message.
fn context_only() -> pb::SendMessageRequest {
    pb::SendMessageRequest {
        context_only: true,
        ..Default::default()
    }
}

fn sent_message<'a>(seen: &'a [pb::SessionEvent], id: &str) -> &'a pb::UserMessage {
    seen.iter()
        .find_map(|e| match &e.payload {
            Some(P::UserMessage(u)) if u.message_id == id && !u.is_replay => Some(u),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no UserMessage {id}"))
}

/// The session option `verbatim_prompts` (2.1.332): the first prompt and every message
/// after it, sent plainly by any client, go as written (the `@path` mention is not
/// expanded, the project's slash command is not run) and are recorded as verbatim, also
/// after a resume. The same prompts in a session without the option get the file attached
/// and the command expanded (what the option is there to prevent).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn verbatim_prompts_send_every_message_as_written() {
    let world = World::new(NEW).await;
    let notes = world.work.join("notes.txt");
    std::fs::write(&notes, "NOTES-SECRET-8\n").unwrap();
    let commands = world.work.join(".claude/commands");
    std::fs::create_dir_all(&commands).unwrap();
    std::fs::write(
        commands.join("shout.md"),
        // The description is listed to the model in every session; the body only where
        // the command runs.
        "---\ndescription: Shout\n---\nSHOUT-EXPANDED-3: say it loudly: $ARGUMENTS\n",
    )
    .unwrap();
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let mention = format!("@{}", notes.display());
    let requests_with = |marker: &str, secret: &str| {
        world.fake.requests().iter().any(|r| {
            r.body.as_ref().is_some_and(|b| {
                let t = b["messages"].to_string();
                t.contains(marker) && t.contains(secret)
            })
        })
    };

    for verbatim in [true, false] {
        let tag = if verbatim { "V" } else { "P" };
        let s = c
            .create_session(as_client(
                "creator",
                pb::CreateSessionRequest {
                    cwd: world.work.display().to_string(),
                    verbatim_prompts: verbatim,
                    first_prompt: text(&format!("FIRST-{tag} look at {mention}")),
                    ..Default::default()
                },
            ))
            .await
            .unwrap()
            .into_inner();
        let mut events = subscribe(&mut c, &s.id, 0, true).await;
        let mut seen = Vec::new();
        read_until(&mut events, &mut seen, "the first turn", is_turn_completed).await;
        send(&mut c, &s.id, &format!("SECOND-{tag} look at {mention}")).await;
        read_until(&mut events, &mut seen, "the second turn", is_turn_completed).await;
        send(&mut c, &s.id, &format!("/shout THIRD-{tag}")).await;
        read_until(&mut events, &mut seen, "the third turn", is_turn_completed).await;
        drop(events);
        if verbatim {
            stop_and_resume(&mut c, &s.id).await;
            let fourth = send_with(
                &mut c,
                &s.id,
                &format!("FOURTH-{tag} look at {mention}"),
                Default::default(),
            )
            .await
            .unwrap();
            let mut events = subscribe(&mut c, &s.id, 0, true).await;
            seen.clear();
            read_until(&mut events, &mut seen, "the fourth turn", |e| {
                matches!(&e.payload, Some(P::TurnCompleted(t))
                    if t.user_message_ids.contains(&fourth.message_id))
            })
            .await;
        }
        let sent: Vec<&pb::UserMessage> = seen
            .iter()
            .filter_map(|e| match &e.payload {
                Some(P::UserMessage(u)) if !u.is_replay && !u.sent_by.is_empty() => Some(u),
                _ => None,
            })
            .collect();
        let expect = if verbatim { 4 } else { 3 };
        assert_eq!(sent.len(), expect, "{sent:?}");
        assert!(
            sent.iter().all(|u| u.verbatim == verbatim),
            "recorded as sent: {sent:?}"
        );
        if verbatim {
            for m in ["FIRST-V", "SECOND-V", "FOURTH-V"] {
                assert!(world.model_saw(&format!("{m} look at @")), "{m}");
                assert!(
                    !requests_with(m, "NOTES-SECRET-8"),
                    "{m}: the file was attached"
                );
            }
            assert!(world.model_saw("/shout THIRD-V"));
            assert!(
                !requests_with("THIRD-V", "SHOUT-EXPANDED-3"),
                "the slash command ran"
            );
        } else {
            for m in ["FIRST-P", "SECOND-P"] {
                assert!(requests_with(m, "NOTES-SECRET-8"), "{m}: no file attached");
            }
            assert!(
                requests_with("THIRD-P", "SHOUT-EXPANDED-3"),
                "the slash command did not run"
            );
        }
    }
}

/// SendMessage's delivery fields against the real CLI (2.1.332, which honours all four):
/// `verbatim` sends `@path` as written where the plain message gets the file attached;
/// `context_only` ends its turn with no model call and the next turn's request carries
/// it; priority NOW stops a turn whose answer is held and runs at once; LATER lets a
/// message sent after it with the default priority go first. Each recorded UserMessage
/// says how it was sent, and the session ends IDLE (nothing owed is left behind).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delivery_fields_reach_the_cli() {
    let world = World::with_scenario(NEW, DELIVERY_SCENARIO).await;
    let notes = world.work.join("notes.txt");
    std::fs::write(&notes, "NOTES-SECRET-7\n").unwrap();
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "d").await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    let with_notes = |marker: &str| {
        world.fake.requests().iter().any(|r| {
            r.body.as_ref().is_some_and(|b| {
                let t = b["messages"].to_string();
                t.contains(marker) && t.contains("NOTES-SECRET-7")
            })
        })
    };

    // verbatim, then the same plain.
    let mention = format!("@{}", notes.display());
    let verbatim = send_with(
        &mut c,
        &s.id,
        &format!("VERBATIM-ONE look at {mention}"),
        pb::SendMessageRequest {
            verbatim: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    read_until(
        &mut events,
        &mut seen,
        "the verbatim turn",
        is_turn_completed,
    )
    .await;
    assert!(world.model_saw("VERBATIM-ONE look at @"));
    assert!(!with_notes("VERBATIM-ONE"), "the file was attached");
    send(&mut c, &s.id, &format!("PLAIN-TWO look at {mention}")).await;
    read_until(&mut events, &mut seen, "the plain turn", is_turn_completed).await;
    assert!(with_notes("PLAIN-TWO"), "the plain message got no file");

    // pasted: added after the typed text, in the same user message.
    let pasted = send_with(
        &mut c,
        &s.id,
        "PASTE-TYPED what is this?",
        pb::SendMessageRequest {
            pasted: vec!["PASTED-BODY-9 line one\nline two".into()],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    read_until(&mut events, &mut seen, "the pasted turn", is_turn_completed).await;
    assert!(
        world
            .fake
            .requests()
            .iter()
            .any(|r| r.body.as_ref().is_some_and(|b| {
                let last = b["messages"]
                    .as_array()
                    .and_then(|m| m.last())
                    .map(|m| m.to_string());
                last.is_some_and(|l| l.contains("PASTE-TYPED") && l.contains("PASTED-BODY-9"))
            })),
        "the pasted text did not reach the model with the message"
    );

    // context_only: no model call; the next turn carries it.
    let before = world.fake.requests().len();
    let context = send_with(&mut c, &s.id, "The codeword is PLUM-42.", context_only())
        .await
        .unwrap();
    let end = read_until(
        &mut events,
        &mut seen,
        "the context-only turn",
        is_turn_completed,
    )
    .await;
    let Some(P::TurnCompleted(t)) = &end.payload else {
        unreachable!()
    };
    assert!(!t.is_error, "{t:?}");
    assert!(
        !world.fake.requests()[before..].iter().any(|r| r
            .body
            .as_ref()
            .is_some_and(|b| b.to_string().contains("PLUM-42"))),
        "a model call was made for the context-only message"
    );
    send(&mut c, &s.id, "What is the codeword?").await;
    read_until(&mut events, &mut seen, "the codeword", |e| {
        assistant_text(e) == Some("The codeword is PLUM-42.")
    })
    .await;
    read_until(
        &mut events,
        &mut seen,
        "the codeword turn",
        is_turn_completed,
    )
    .await;

    // priority NOW stops the held turn.
    send(&mut c, &s.id, "Long task one.").await;
    await_model_request(&world.fake, "held").await;
    let now = send_with(
        &mut c,
        &s.id,
        "Urgent: do this first.",
        with_priority(pb::MessagePriority::Now),
    )
    .await
    .unwrap();
    read_until(&mut events, &mut seen, "the urgent answer", |e| {
        assistant_text(e) == Some("Urgent done.")
    })
    .await;
    read_until(&mut events, &mut seen, "the urgent turn", is_turn_completed).await;
    assert!(
        !seen
            .iter()
            .any(|e| assistant_text(e) == Some("The long answer.")),
        "the held turn was not stopped"
    );

    // LATER goes after a message sent behind it with the default priority.
    send(&mut c, &s.id, "Long task two.").await;
    await_model_request(&world.fake, "held two").await;
    let later = send_with(
        &mut c,
        &s.id,
        "LATER-MESSAGE please.",
        with_priority(pb::MessagePriority::Later),
    )
    .await
    .unwrap();
    let next = send_with(&mut c, &s.id, "NEXT-MESSAGE please.", Default::default())
        .await
        .unwrap();
    // Both queued at the CLI before the held answer is let go.
    let mut queued = 0;
    read_until(&mut events, &mut seen, "both queued", |e| {
        queued += usize::from(matches!(&e.payload, Some(P::MessageLifecycle(m))
            if m.state == "queued"
                && (m.message_id == later.message_id || m.message_id == next.message_id)));
        queued == 2
    })
    .await;
    world.fake.signal("go");
    read_until(&mut events, &mut seen, "the LATER message's turn", |e| {
        matches!(&e.payload, Some(P::TurnCompleted(t)) if t.user_message_ids.contains(&later.message_id))
    })
    .await;
    let order: Vec<&str> = world
        .fake
        .requests()
        .iter()
        .filter_map(|r| r.body.as_ref())
        .filter_map(|b| {
            let last = b["messages"].as_array()?.last()?.to_string();
            ["NEXT-MESSAGE", "LATER-MESSAGE"]
                .into_iter()
                .find(|m| last.contains(m))
        })
        .collect();
    assert_eq!(order.first(), Some(&"NEXT-MESSAGE"), "{order:?}");
    assert!(order.contains(&"LATER-MESSAGE"), "{order:?}");

    // Each recorded message says how it was sent.
    assert!(sent_message(&seen, &verbatim.message_id).verbatim);
    assert_eq!(
        sent_message(&seen, &pasted.message_id).pasted,
        ["PASTED-BODY-9 line one\nline two"]
    );
    assert!(sent_message(&seen, &context.message_id).context_only);
    assert_eq!(
        sent_message(&seen, &now.message_id).priority,
        pb::MessagePriority::Now as i32
    );
    assert_eq!(
        sent_message(&seen, &later.message_id).priority,
        pb::MessagePriority::Later as i32
    );
    let plain = sent_message(&seen, &next.message_id);
    assert!(!plain.verbatim && !plain.context_only && plain.priority == 0);
    read_until(
        &mut events,
        &mut seen,
        "the session idle",
        |e| matches!(&e.payload, Some(P::StateChanged(s)) if s.to() == pb::SessionState::Idle),
    )
    .await;
    assert_eq!(session(&mut c, &s.id).await.state(), pb::SessionState::Idle);
}

/// A context-only message sent while a turn runs: the CLI queues it, and after the running
/// turn ends it adds the message with a turn of no model call. Both turns' TurnCompleted
/// name their message (2.1.332 in its result, 2.1.121 by its echo and the oldest owed),
/// the next turn's request carries the context, and the session ends IDLE: nothing is
/// left owed.
async fn context_only_behind_a_running_turn(release: &str) {
    let world = World::with_scenario(release, DELIVERY_SCENARIO).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "q").await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    let first = send_with(&mut c, &s.id, "Long task one.", Default::default())
        .await
        .unwrap();
    await_model_request(&world.fake, "held").await;
    let context = send_with(&mut c, &s.id, "The codeword is PLUM-42.", context_only())
        .await
        .unwrap();
    world.fake.signal("go");
    let answered = |id: &str| {
        let id = id.to_owned();
        move |e: &pb::SessionEvent| matches!(&e.payload, Some(P::TurnCompleted(t)) if t.user_message_ids.contains(&id))
    };
    read_until(
        &mut events,
        &mut seen,
        "the first turn",
        answered(&first.message_id),
    )
    .await;
    read_until(
        &mut events,
        &mut seen,
        "the context's turn",
        answered(&context.message_id),
    )
    .await;
    assert_eq!(
        world.fake.count_matching(&ostler_testkit::scenario::Match {
            last_user_text_contains: Some("PLUM-42".into()),
            ..Default::default()
        }),
        0,
        "{release}: a model call was made for the context"
    );
    read_until(
        &mut events,
        &mut seen,
        "the session idle",
        |e| matches!(&e.payload, Some(P::StateChanged(s)) if s.to() == pb::SessionState::Idle),
    )
    .await;
    assert_eq!(
        turn(&mut c, &s.id, "What is the codeword?").await,
        "The codeword is PLUM-42."
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn context_only_behind_a_running_turn_2_1_332() {
    context_only_behind_a_running_turn(NEW).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn context_only_behind_a_running_turn_2_1_121() {
    context_only_behind_a_running_turn("2.1.121").await;
}

/// A delivery field the running release ignores (1.0.128 honours none, measured) is
/// refused at once with FAILED_PRECONDITION naming it, and nothing is recorded or sent;
/// context_only with priority NOW, or an unknown priority, is INVALID_ARGUMENT.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delivery_fields_the_release_ignores_are_refused() {
    let world = World::new(OLD).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "r").await;
    let cases = [
        (with_priority(pb::MessagePriority::Now), "priority NOW"),
        (with_priority(pb::MessagePriority::Later), "priority LATER"),
        (
            pb::SendMessageRequest {
                verbatim: true,
                ..Default::default()
            },
            "verbatim",
        ),
        (context_only(), "context_only"),
        (
            pb::SendMessageRequest {
                pasted: vec!["a paste".into()],
                ..Default::default()
            },
            "pasted",
        ),
    ];
    for (fields, name) in cases {
        let err = send_with(&mut c, &s.id, "hello", fields).await.unwrap_err();
        assert_eq!(
            err.code(),
            tonic::Code::FailedPrecondition,
            "{name}: {err:?}"
        );
        assert!(
            err.message().contains(name) && err.message().contains(OLD),
            "{name}: {}",
            err.message()
        );
    }
    let bad = [
        pb::SendMessageRequest {
            priority: pb::MessagePriority::Now as i32,
            context_only: true,
            ..Default::default()
        },
        pb::SendMessageRequest {
            priority: 9,
            ..Default::default()
        },
        pb::SendMessageRequest {
            pasted: vec![" ".into()],
            ..Default::default()
        },
        pb::SendMessageRequest {
            pasted: vec!["x".into(); 101],
            ..Default::default()
        },
    ];
    for fields in bad {
        let err = send_with(&mut c, &s.id, "hello", fields).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    }
    assert!(
        !history(&mut c, &s.id)
            .await
            .iter()
            .any(|e| matches!(&e.payload, Some(P::UserMessage(_)))),
        "a refused message was recorded"
    );
    // The plain message still goes through.
    assert!(!turn(&mut c, &s.id, "Hello?").await.is_empty());
}

/// A SetPermissionMode the CLI answers only after its caller gave up (the control
/// timeout) still takes effect in the CLI; the session's record follows what the CLI
/// reports (`CliStatus`), so a later resume starts in the mode the CLI was in.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mode_the_cli_takes_late_is_recorded() {
    let world = World::new(NEW).await;
    let control_timeout = ostler_testkit::timeouts::secs(1);
    let daemon = world
        .daemon_with_env(
            &[],
            &[(
                "OSTLER_SESSIONS__CONTROL_TIMEOUT_SECS",
                &control_timeout.as_secs().to_string(),
            )],
        )
        .await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "mode").await;
    let mut events = subscribe(&mut c, &s.id, 0, true).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "Say hello").await;
    read_until(&mut events, &mut seen, "first turn", is_turn_completed).await;
    let cli = children(daemon.pid());
    assert_eq!(cli.len(), 1, "{cli:?}");
    let pid = nix::unistd::Pid::from_raw(cli[0] as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let err = c
        .set_permission_mode(pb::SetPermissionModeRequest {
            session_id: s.id.clone(),
            mode: pb::PermissionMode::Plan as i32,
        })
        .await
        .unwrap_err();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    read_until(
        &mut events,
        &mut seen,
        "the CLI's new mode",
        |e| matches!(&e.payload, Some(P::CliStatus(st)) if st.permission_mode == "plan"),
    )
    .await;
    // The record is written as the status is stored: it shows by the next event's time.
    send(&mut c, &s.id, "Say hello").await;
    read_until(&mut events, &mut seen, "second turn", is_turn_completed).await;
    assert_eq!(
        session(&mut c, &s.id).await.permission_mode(),
        pb::PermissionMode::Plan
    );
}
