//! Permission requests and questions, against the real CLI.

use crate::common;

use std::sync::Arc;

use common::*;
use ostler_engine::*;
use ostler_testkit::scenario::Match;

fn request_id(ev: &EngineEvent) -> String {
    match &ev.payload {
        EventPayload::PermissionRequested(p) => p.request_id.clone(),
        EventPayload::QuestionAsked(q) => q.request_id.clone(),
        other => panic!("not an interaction: {other:?}"),
    }
}

fn resolved(evs: &[Arc<EngineEvent>]) -> Vec<InteractionResolved> {
    evs.iter()
        .filter_map(|e| match &e.payload {
            EventPayload::InteractionResolved(r) => Some(r.clone()),
            _ => None,
        })
        .collect()
}

fn tool_results(evs: &[Arc<EngineEvent>]) -> Vec<ostler_protocol::ToolResult> {
    evs.iter()
        .filter_map(|e| match &e.payload {
            EventPayload::ToolResult(t) => Some(t.clone()),
            _ => None,
        })
        .collect()
}

async fn forwarded_first_answer_wins(version: &'static str) {
    let env = Env::new(version, scenario("tool_allowed")).await;
    let s = env.session(None).await;
    let mut sub = env.follow(&s.id, 0).await;
    env.send(&s.id, "Create the file allowed.txt please.").await;
    let (req, _) = until(&mut sub, is_kind("permission_requested")).await;
    let rid = request_id(&req);
    match &req.payload {
        EventPayload::PermissionRequested(p) => {
            assert_eq!(p.tool_name, "Bash");
            assert_eq!(p.input["command"], "touch allowed.txt");
        }
        _ => unreachable!(),
    }
    let info = env.engine.get_session(&s.id).await.expect("get");
    assert_eq!(info.state, SessionState::AwaitingPermission);
    assert_eq!(info.pending_interactions, 1);

    // A client subscribing later, from "now", is told about the pending request again.
    let now = req.seq.expect("seq");
    let mut late = env.follow(&s.id, now).await;
    let first = late.next().await.expect("open").expect("event");
    assert!(first.redelivered);
    assert_eq!(first.seq, Some(now));
    assert_eq!(request_id(&first), rid);
    let pending = env
        .engine
        .pending_interactions(&s.id)
        .await
        .expect("pending");
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].request_id, rid);

    // The call for questions is refused as the wrong call (it would fail again), and the
    // request stays pending.
    let e = env
        .engine
        .answer_question(&s.id, &rid, vec![], ClientRef::new("alice"))
        .await
        .expect_err("not a question");
    assert_eq!(e.code_kind(), CodeKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("RespondToPermission"), "{e}");

    // Two clients answer at once: exactly one wins, the other learns who decided.
    let allow = PermissionResponse::Allow {
        updated_input: None,
        remember: vec![],
        updated_permissions: None,
    };
    let deny = PermissionResponse::Deny {
        message: "no".into(),
        interrupt: false,
    };
    let (ra, rb) = tokio::join!(
        env.engine
            .respond_permission(&s.id, &rid, allow.clone(), ClientRef::new("alice")),
        env.engine
            .respond_permission(&s.id, &rid, deny, ClientRef::new("bob")),
    );
    let (winner, loser) = match (&ra, &rb) {
        (Ok(_), Err(e)) => ("client:alice", e),
        (Err(e), Ok(_)) => ("client:bob", e),
        other => panic!("exactly one answer must win: {other:?}"),
    };
    match loser {
        Error::FailedPrecondition {
            decided_by,
            message,
        } => {
            assert_eq!(decided_by.as_deref(), Some(winner), "{message}");
            assert!(message.contains(winner), "{message}");
        }
        e => panic!("expected FailedPrecondition, got {e:?}"),
    }
    // A third answer after the fact is refused the same way.
    let again = env
        .engine
        .respond_permission(&s.id, &rid, allow, ClientRef::new("carol"))
        .await
        .expect_err("already decided");
    assert_eq!(again.code_kind(), CodeKind::FailedPrecondition);

    let (_, evs) = until(&mut sub, is_turn_end).await;
    let r = resolved(&evs);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].decided_by, winner);
    let results = tool_results(&evs);
    assert_eq!(results.len(), 1, "{:?}", kinds(&evs));
    if winner == "client:alice" {
        assert!(matches!(
            r[0].resolution,
            Resolution::Allowed { edited: false, .. }
        ));
        assert!(!results[0].is_error);
        assert!(env.cwd_file("allowed.txt").exists(), "the tool really ran");
    } else {
        assert!(matches!(r[0].resolution, Resolution::Denied { .. }));
        assert!(results[0].is_error);
        assert!(!env.cwd_file("allowed.txt").exists());
    }
    // The decision is recorded in the store with who made it.
    let stored = env.store.interaction(&s.id, &rid).expect("interaction");
    assert_eq!(stored.decided_by.as_deref(), Some(winner));
    assert_eq!(
        env.engine.get_session(&s.id).await.expect("get").state,
        SessionState::Idle
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn permission_forwarded_first_answer_wins_new() {
    forwarded_first_answer_wins(NEW).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn permission_forwarded_first_answer_wins_old() {
    forwarded_first_answer_wins(OLD).await;
}

/// Allow with an edited input: the CLI runs the edited command.
#[tokio::test(flavor = "multi_thread")]
async fn allow_with_edited_input_and_remember() {
    let env = Env::new(NEW, scenario("tool_allowed")).await;
    let s = env.session(None).await;
    let mut sub = env.follow(&s.id, 0).await;
    env.send(&s.id, "Create the file allowed.txt please.").await;
    let (req, _) = until(&mut sub, is_kind("permission_requested")).await;
    let rid = request_id(&req);
    let bad = env
        .engine
        .respond_permission(
            &s.id,
            &rid,
            PermissionResponse::Allow {
                updated_input: Some(serde_json::json!("not an object")),
                remember: vec![],
                updated_permissions: None,
            },
            ClientRef::new("alice"),
        )
        .await
        .expect_err("bad input");
    assert_eq!(bad.code_kind(), CodeKind::InvalidArgument);
    let decided = env
        .engine
        .respond_permission(
            &s.id,
            &rid,
            PermissionResponse::Allow {
                updated_input: Some(serde_json::json!({"command": "touch edited.txt"})),
                remember: vec![PermissionRule::allow("Bash", Some("touch"))],
                updated_permissions: None,
            },
            ClientRef::new("alice"),
        )
        .await
        .expect("allow");
    assert!(decided.seq > req.seq.expect("seq"));
    assert!(matches!(
        decided.resolved.resolution,
        Resolution::Allowed { edited: true, .. }
    ));
    until(&mut sub, is_turn_end).await;
    assert!(env.cwd_file("edited.txt").exists());
    assert!(!env.cwd_file("allowed.txt").exists());

    // The remembered rule now allows the same tool call without asking anyone.
    env.send(&s.id, "Create the file allowed.txt please.").await;
    let (_, evs) = until(&mut sub, is_turn_end).await;
    let r = resolved(&evs);
    assert_eq!(r.len(), 1, "{:?}", kinds(&evs));
    assert_eq!(r[0].decided_by, "rule:allow Bash(touch)");
    assert!(env.cwd_file("allowed.txt").exists());
}

async fn rule_decides(action: RuleAction) {
    let rule = PermissionRule {
        tool: "Bash".into(),
        pattern: Some("touch allowed.txt".into()),
        action,
    };
    let env = Env::with(NEW, scenario("tool_allowed"), |o| {
        // Deny wins over a broader allow.
        o.rules = vec![PermissionRule::allow("Bash", Some("touch")), rule.clone()];
        if action == RuleAction::Allow {
            o.rules.remove(1);
            o.rules
                .push(PermissionRule::allow("Bash", Some("touch allowed.txt")));
        }
    })
    .await;
    let s = env
        .session(Some("Create the file allowed.txt please."))
        .await;
    let mut sub = env.follow(&s.id, 0).await;
    let (_, evs) = until(&mut sub, is_turn_end).await;
    let r = resolved(&evs);
    assert_eq!(r.len(), 1, "{:?}", kinds(&evs));
    let results = tool_results(&evs);
    match action {
        RuleAction::Allow => {
            assert_eq!(r[0].decided_by, "rule:allow Bash(touch)");
            assert!(matches!(r[0].resolution, Resolution::Allowed { .. }));
            assert!(env.cwd_file("allowed.txt").exists());
            assert!(!results[0].is_error);
        }
        RuleAction::Deny => {
            assert_eq!(r[0].decided_by, "rule:deny Bash(touch allowed.txt)");
            match &r[0].resolution {
                Resolution::Denied { message, .. } => assert!(message.contains("rule")),
                other => panic!("{other:?}"),
            }
            assert!(!env.cwd_file("allowed.txt").exists());
            assert!(results[0].is_error);
        }
    }
    // Nobody was asked: no pending interaction at any time after the turn.
    assert!(
        env.engine
            .pending_interactions(&s.id)
            .await
            .expect("pending")
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn config_rule_allows_without_asking() {
    rule_decides(RuleAction::Allow).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deny_rule_wins_over_allow_rule() {
    rule_decides(RuleAction::Deny).await;
}

/// Deny from a client carries its message to the CLI; the tool does not run.
#[tokio::test(flavor = "multi_thread")]
async fn deny_from_client() {
    let env = Env::new(OLD, scenario("tool_denied")).await;
    let s = env
        .session(Some("Create the file denied.txt please."))
        .await;
    let mut sub = env.follow(&s.id, 0).await;
    let (req, _) = until(&mut sub, is_kind("permission_requested")).await;
    env.engine
        .respond_permission(
            &s.id,
            &request_id(&req),
            PermissionResponse::Deny {
                message: "The user does not want this file.".into(),
                interrupt: false,
            },
            ClientRef::new("alice"),
        )
        .await
        .expect("deny");
    let (_, evs) = until(&mut sub, is_turn_end).await;
    let results = tool_results(&evs);
    assert!(results[0].is_error);
    assert!(!env.cwd_file("denied.txt").exists());
    // The model saw the denial message in the tool result.
    let n = env.server.count_matching(&Match {
        messages_contain: Some("The user does not want this file.".into()),
        ..Default::default()
    });
    assert!(n >= 1);
}

/// Expiry (configured): nobody answers, the request is denied with a message.
#[tokio::test(flavor = "multi_thread")]
async fn pending_request_expires() {
    let env = Env::with(NEW, scenario("tool_denied"), |o| {
        o.permission_expiry = Some(std::time::Duration::from_millis(300));
    })
    .await;
    let s = env
        .session(Some("Create the file denied.txt please."))
        .await;
    let mut sub = env.follow(&s.id, 0).await;
    let (req, _) = until(&mut sub, is_kind("permission_requested")).await;
    match &req.payload {
        EventPayload::PermissionRequested(p) => assert!(p.expires_at_ms.is_some()),
        _ => unreachable!(),
    }
    let (_, evs) = until(&mut sub, is_turn_end).await;
    let r = resolved(&evs);
    assert_eq!(r[0].decided_by, "expiry");
    assert!(matches!(r[0].resolution, Resolution::Expired { .. }));
    assert!(!env.cwd_file("denied.txt").exists());
    let late = env
        .engine
        .respond_permission(
            &s.id,
            &request_id(&req),
            PermissionResponse::Allow {
                updated_input: None,
                remember: vec![],
                updated_permissions: None,
            },
            ClientRef::new("alice"),
        )
        .await
        .expect_err("expired");
    match late {
        Error::FailedPrecondition { decided_by, .. } => {
            assert_eq!(decided_by.as_deref(), Some("expiry"))
        }
        e => panic!("{e:?}"),
    }
}

/// AskUserQuestion: surfaced with all questions and options, bad answers refused,
/// answered through answer_question; the model receives the answer.
#[tokio::test(flavor = "multi_thread")]
async fn ask_user_question_answered() {
    let env = Env::new(NEW, scenario("ask_user_question")).await;
    let s = env.session(Some("Ask me which database to use.")).await;
    let mut sub = env.follow(&s.id, 0).await;
    let (q, _) = until(&mut sub, is_kind("question_asked")).await;
    let rid = request_id(&q);
    let EventPayload::QuestionAsked(asked) = &q.payload else {
        unreachable!()
    };
    assert_eq!(asked.questions.len(), 1);
    assert_eq!(asked.questions[0].question, "Which database should I use?");
    let labels: Vec<&str> = asked.questions[0]
        .options
        .iter()
        .map(|o| o.label.as_str())
        .collect();
    assert_eq!(labels, ["SQLite", "PostgreSQL"]);
    assert!(!asked.questions[0].multi_select);

    let answer = |sel: &[&str]| QuestionAnswer {
        question: "Which database should I use?".into(),
        selected: sel.iter().map(|s| s.to_string()).collect(),
        other_text: None,
    };
    // Not an option / two choices on single-select / nothing answered.
    for bad in [
        vec![answer(&["MySQL"])],
        vec![answer(&["SQLite", "PostgreSQL"])],
        vec![],
    ] {
        let e = env
            .engine
            .answer_question(&s.id, &rid, bad, ClientRef::new("alice"))
            .await
            .expect_err("invalid");
        assert_eq!(e.code_kind(), CodeKind::InvalidArgument, "{e}");
    }
    // A permission response cannot "allow" a question.
    let e = env
        .engine
        .respond_permission(
            &s.id,
            &rid,
            PermissionResponse::Allow {
                updated_input: None,
                remember: vec![],
                updated_permissions: None,
            },
            ClientRef::new("alice"),
        )
        .await
        .expect_err("question");
    assert_eq!(e.code_kind(), CodeKind::InvalidArgument, "{e}");
    assert!(e.to_string().contains("AnswerQuestion"), "{e}");

    let decided = env
        .engine
        .answer_question(
            &s.id,
            &rid,
            vec![answer(&["SQLite"])],
            ClientRef::new("alice"),
        )
        .await
        .expect("answer");
    assert!(matches!(
        decided.resolved.resolution,
        Resolution::Answered { .. }
    ));
    let second = env
        .engine
        .answer_question(
            &s.id,
            &rid,
            vec![answer(&["PostgreSQL"])],
            ClientRef::new("bob"),
        )
        .await
        .expect_err("second");
    match second {
        Error::FailedPrecondition { decided_by, .. } => {
            assert_eq!(decided_by.as_deref(), Some("client:alice"))
        }
        e => panic!("{e:?}"),
    }
    let (end, evs) = until(&mut sub, is_turn_end).await;
    let EventPayload::TurnCompleted(t) = &end.payload else {
        unreachable!()
    };
    assert!(!t.is_error, "{t:?}");
    let results = tool_results(&evs);
    assert_eq!(results.len(), 1);
    assert!(!results[0].is_error, "{:?}", results[0]);
    // The model got the chosen answer back in the tool result.
    let n = env.server.count_matching(&Match {
        tool_result_for: Some("toolu_ask_1".into()),
        messages_contain: Some("SQLite".into()),
        ..Default::default()
    });
    assert_eq!(n, 1);
}
