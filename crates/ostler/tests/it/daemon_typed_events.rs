//! Issue 10's typed events through the real daemon and the real CLI (2.1.332): a sub-agent's
//! background task lifecycle (started / progress / notification) with the tree by tool use
//! id, the sub-agent's id on its permission request, the CLI's status, per-model usage and
//! the terminal reason on TurnCompleted, the sub-agent's identity (agent id, type, task
//! description) on its messages and each tool result's permission decision, a sent
//! message's lifecycle, the interruption marker as a synthetic message, a
//! compaction's boundary; and replay (stored form) equals what was delivered live. A
//! sub-agent's hook calls name it as its permission requests do; it cannot ask questions.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error

use crate::common;

use common::grpc::*;
use common::*;
use ostler_proto::v1 as pb;
use pb::session_event::Payload as P;

const SCENARIO: &str = r#"
default_text = "OK."

[[model]]
name = "main after task"
when = { tool_result_for = "toolu_task_1" }
hold_until = "sub-agent done"
blocks = [{ type = "text", text = "The sub-agent finished." }]

[[model]]
name = "sub after bash"
when = { tool_result_for = "toolu_sub_bash_1" }
blocks = [{ type = "text", text = "Sub-agent: created sub.txt." }]

[[model]]
name = "sub uses bash"
when = { last_user_text_contains = "SUBAGENT-TASK", stream = true }
blocks = [
  { type = "tool_use", id = "toolu_sub_bash_1", name = "Bash", input = { command = "touch sub.txt", description = "Create sub.txt" } },
]

[[model]]
name = "main delegates"
when = { last_user_text_contains = "Delegate creating sub.txt", stream = true }
blocks = [
  { type = "text", text = "I will delegate this." },
  { type = "tool_use", id = "toolu_task_1", name = ["Agent", "Task"], input = { description = "Create sub.txt", prompt = "SUBAGENT-TASK: create the file sub.txt with touch.", subagent_type = "general-purpose" } },
]

[[model]]
name = "still there"
when = { last_user_text_contains = "Are you still there", stream = true }
blocks = [{ type = "text", text = "Yes, still here." }]

[[model]]
name = "slow story"
when = { last_user_text_contains = "Tell me a long story", stream = true }
chunks = 60
delay_ms = 100
blocks = [{ type = "text", text = "Once upon a time there was a daemon that kept many sessions alive, and every one of them streamed its answers slowly, delta after delta, until someone pressed stop." }]
"#;

fn allow(session_id: &str, request_id: &str) -> pb::RespondToPermissionRequest {
    pb::RespondToPermissionRequest {
        session_id: session_id.to_owned(),
        request_id: request_id.to_owned(),
        decision: Some(pb::respond_to_permission_request::Decision::Allow(
            pb::PermissionAllow::default(),
        )),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn typed_events_on_the_real_cli_2_1_330() {
    let world = World::with_scenario(NEW, SCENARIO).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "typed").await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();

    send(&mut c, &s.id, "Delegate creating sub.txt to a sub-agent.").await;
    let prompt = read_until(&mut events, &mut seen, "the sub-agent's prompt", |e| {
        matches!(e.payload, Some(P::PermissionRequested(_)))
    })
    .await;
    let Some(P::PermissionRequested(req)) = &prompt.payload else {
        unreachable!()
    };
    let started = seen
        .iter()
        .find_map(|e| match &e.payload {
            Some(P::TaskStarted(t)) => Some(t.clone()),
            _ => None,
        })
        .unwrap_or_else(|| {
            panic!(
                "no task_started: {:#?}",
                seen.iter().map(describe).collect::<Vec<_>>()
            )
        });
    assert!(!started.task_id.is_empty());
    assert_eq!(started.tool_use_id, "toolu_task_1");
    assert_eq!(started.description, "Create sub.txt");
    assert!(started.fields_json.contains("\"task_started\""));
    // The tree: the sub-agent's request names its task (agent_id = task_id); the tool
    // call it asks about hangs under the Task call that started the task.
    assert_eq!(req.agent_id, started.task_id);
    assert_eq!(req.tool_use_id, "toolu_sub_bash_1");
    let call = seen
        .iter()
        .find(|e| {
            matches!(&e.payload, Some(P::AssistantBlock(b)) if matches!(&b.block,
                Some(pb::assistant_block::Block::ToolUse(t)) if t.id == req.tool_use_id))
        })
        .unwrap();
    assert_eq!(
        call.parent_tool_use_id.as_deref(),
        Some(started.tool_use_id.as_str())
    );

    c.respond_to_permission(as_client("typed", allow(&s.id, &req.request_id)))
        .await
        .unwrap();
    let done = read_until(&mut events, &mut seen, "task notification", |e| {
        matches!(e.payload, Some(P::TaskNotification(_)))
    })
    .await;
    let Some(P::TaskNotification(n)) = &done.payload else {
        unreachable!()
    };
    assert_eq!(n.task_id, started.task_id);
    assert_eq!(n.tool_use_id, "toolu_task_1");
    assert_eq!(n.status, "completed");
    assert!(n.usage.is_some_and(|u| u.total_tokens > 0), "{n:?}");
    assert!(
        seen.iter().any(|e| matches!(&e.payload,
            Some(P::TaskProgress(p)) if p.task_id == started.task_id)),
        "{:#?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );
    world.fake.signal("sub-agent done");
    let end = read_until(&mut events, &mut seen, "the main answer's turn end", |e| {
        matches!(&e.payload, Some(P::TurnCompleted(t)) if t.result.contains("sub-agent finished"))
    })
    .await;
    let Some(P::TurnCompleted(t)) = &end.payload else {
        unreachable!()
    };
    assert_eq!(t.terminal_reason, "completed");
    // The sub-agent's identity on its messages (its tool call, the call's result, its
    // answer), none on the main thread's; each tool result says how its call was allowed.
    let mut sub_events = Vec::new();
    for e in &seen {
        let who = match &e.payload {
            Some(P::AssistantBlock(b)) => (&b.agent_id, &b.subagent_type, &b.task_description),
            Some(P::ToolResult(r)) => (&r.agent_id, &r.subagent_type, &r.task_description),
            Some(P::UserMessage(u)) => (&u.agent_id, &u.subagent_type, &u.task_description),
            _ => continue,
        };
        let who = (who.0.as_str(), who.1.as_str(), who.2.as_str());
        if e.parent_tool_use_id.as_deref() == Some("toolu_task_1") {
            let expected = (
                started.task_id.as_str(),
                "general-purpose",
                "Create sub.txt",
            );
            assert_eq!(who, expected, "{}", describe(e));
            sub_events.push(e.seq);
        } else {
            assert_eq!(who, ("", "", ""), "{}", describe(e));
        }
    }
    assert_eq!(sub_events.len(), 3, "tool call, its result, the answer");
    let decision = |id: &str| {
        seen.iter()
            .find_map(|e| match &e.payload {
                Some(P::ToolResult(r)) if r.tool_use_id == id => Some((
                    r.permission_decision.clone(),
                    r.permission_source.clone(),
                    r.permission_reason_type.clone(),
                )),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no result for {id}"))
    };
    // Allowed by the client's answer above; the Task call by the CLI's own configuration.
    assert_eq!(
        decision("toolu_sub_bash_1"),
        ("accept".into(), "user_temporary".into(), String::new())
    );
    assert_eq!(
        decision("toolu_task_1"),
        ("accept".into(), "config".into(), String::new())
    );
    assert!(!t.model_usage.is_empty(), "{t:?}");
    assert!(
        t.model_usage
            .iter()
            .all(|m| !m.model.is_empty() && m.context_window > 0 && m.input_tokens > 0),
        "{:?}",
        t.model_usage
    );
    assert!(
        seen.iter().any(|e| matches!(&e.payload,
            Some(P::CliStatus(st)) if st.status == "requesting")),
        "{:#?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );
    assert!(
        !seen.iter().any(|e| matches!(&e.payload,
            Some(P::SystemNotice(n)) if matches!(n.subtype.as_str(),
                "task_started" | "task_progress" | "task_notification" | "status"))),
        "typed notices are not sent as plain ones"
    );
    // The sent message's lifecycle, keyed by the UserMessage's id: queued, started, then
    // completed (which may come after its turn's end).
    let sent_id = seen
        .iter()
        .find_map(|e| match &e.payload {
            Some(P::UserMessage(u)) if !u.sent_by.is_empty() => Some(u.message_id.clone()),
            _ => None,
        })
        .expect("the sent message");
    assert!(!sent_id.is_empty());
    read_until(&mut events, &mut seen, "the message's completion", |e| {
        matches!(&e.payload, Some(P::MessageLifecycle(m))
            if m.message_id == sent_id && m.state == "completed")
    })
    .await;
    let states: Vec<&str> = seen
        .iter()
        .filter_map(|e| match &e.payload {
            Some(P::MessageLifecycle(m)) if m.message_id == sent_id => Some(m.state.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(states, ["queued", "started", "completed"]);
    assert!(
        !seen.iter().any(|e| matches!(&e.payload,
            Some(P::Unknown(u)) if u.message_type == "command_lifecycle")),
        "command_lifecycle is understood"
    );

    // Interrupted mid-answer (a second session: the first one's task notification starts
    // one more turn of its own): the CLI's marker is synthetic, the turn says why it ended.
    let s2 = create_session(&mut c, &world.work, "typed").await;
    let mut live = subscribe(&mut c, &s2.id, 0, true).await;
    let mut seen2 = Vec::new();
    send(&mut c, &s2.id, "Tell me a long story.").await;
    read_until(&mut live, &mut seen2, "a delta of the story", |e| {
        matches!(e.payload, Some(P::PartialDelta(_)))
    })
    .await;
    c.interrupt(pb::InterruptRequest {
        session_id: s2.id.clone(),
        cancel_queued: false,
    })
    .await
    .unwrap();
    read_until(&mut live, &mut seen2, "the interruption marker", |e| {
        matches!(&e.payload, Some(P::UserMessage(u)) if u.text.starts_with("[Request interrupted"))
    })
    .await;
    let cut = read_until(
        &mut live,
        &mut seen2,
        "interrupted turn end",
        is_turn_completed,
    )
    .await;
    let Some(P::TurnCompleted(t)) = &cut.payload else {
        unreachable!()
    };
    assert_eq!(t.terminal_reason, "aborted_streaming", "{t:?}");
    let marker = seen2
        .iter()
        .find_map(|e| match &e.payload {
            Some(P::UserMessage(u)) if u.text.starts_with("[Request interrupted by user") => {
                Some(u.clone())
            }
            _ => None,
        })
        .unwrap_or_else(|| {
            panic!(
                "no marker: {:#?}",
                seen2.iter().map(describe).collect::<Vec<_>>()
            )
        });
    assert!(marker.is_synthetic, "{marker:?}");
    assert!(marker.sent_by.is_empty());

    // `/compact` (the CLI's own command) compacts the conversation: CliStatus
    // `compacting`, then the boundary with its trigger and the tokens before.
    send(&mut c, &s2.id, "/compact").await;
    let boundary = read_until(&mut live, &mut seen2, "the compact boundary", |e| {
        matches!(e.payload, Some(P::CompactBoundary(_)))
    })
    .await;
    let Some(P::CompactBoundary(b)) = &boundary.payload else {
        unreachable!()
    };
    assert_eq!(b.trigger, "manual");
    assert!(b.pre_tokens > 0, "{b:?}");
    assert!(b.fields_json.contains("compact_metadata"));
    assert!(
        seen2.iter().any(|e| matches!(&e.payload,
            Some(P::CliStatus(st)) if st.status == "compacting")),
        "{:#?}",
        seen2.iter().map(describe).collect::<Vec<_>>()
    );
    read_until(
        &mut live,
        &mut seen2,
        "the compaction's turn end",
        is_turn_completed,
    )
    .await;

    // Replay equals live: every stored event read back is what subscribers got.
    let stored = history(&mut c, &s.id).await;
    let stored2 = history(&mut c, &s2.id).await;
    for (live, stored) in [(&seen, &stored), (&seen2, &stored2)] {
        for e in live.iter().filter(|e| e.seq > 0 && !e.redelivered) {
            let again = stored
                .iter()
                .find(|x| x.seq == e.seq)
                .unwrap_or_else(|| panic!("seq {} not stored", e.seq));
            assert_eq!(again, e, "seq {}", e.seq);
        }
    }
    assert!(
        stored
            .iter()
            .any(|e| matches!(e.payload, Some(P::TaskNotification(_))))
    );
    // ... the sub-agent's identity included (the loop above compares them whole).
    for seq in &sub_events {
        assert!(stored.iter().any(|e| e.seq == *seq), "seq {seq} not stored");
    }

    // The answer to `initialize` is stored once per spawn (as `session_initialized`), not
    // also as the CLI's control_response line; GetSessionInfo still reads it.
    let initialized: Vec<_> = stored
        .iter()
        .filter_map(|e| match &e.payload {
            Some(P::EngineNotice(n)) if n.code == "session_initialized" => Some(n),
            _ => None,
        })
        .collect();
    assert_eq!(initialized.len(), 1);
    assert!(initialized[0].data_json.contains("\"models\""));
    assert!(
        !stored.iter().any(|e| matches!(&e.payload,
            Some(P::SystemNotice(n)) if n.source_type == "control_response"
                && n.fields_json.contains("\"models\""))),
        "{:#?}",
        stored.iter().map(describe).collect::<Vec<_>>()
    );
    let info = c
        .get_session_info(pb::GetSessionInfoRequest {
            session_id: s.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(info.init_seen);
    assert!(!info.tools.is_empty());
    let init = info.initialized.unwrap();
    assert!(
        !init.models.is_empty() && !init.commands.is_empty(),
        "{init:?}"
    );
}

const ASKING_SUBAGENT: &str = r#"
default_text = "OK."

[[model]]
name = "main after task"
when = { tool_result_for = "toolu_task_q" }
blocks = [{ type = "text", text = "The sub-agent finished." }]

[[model]]
name = "sub after bash"
when = { tool_result_for = "toolu_sub_bash_q" }
blocks = [{ type = "text", text = "Sub-agent: created q.txt." }]

[[model]]
name = "sub after the answer"
when = { tool_result_for = "toolu_sub_ask" }
blocks = [{ type = "tool_use", id = "toolu_sub_bash_q", name = "Bash", input = { command = "touch q.txt", description = "Create q.txt" } }]

[[model]]
name = "sub asks"
when = { last_user_text_contains = "SUB-ASK" }
blocks = [{ type = "tool_use", id = "toolu_sub_ask", name = "AskUserQuestion", input = { questions = [
  { question = "Which name should the file have?", header = "Name", multiSelect = false, options = [
    { label = "q.txt", description = "Short" },
    { label = "question.txt", description = "Long" },
  ] },
] } }]

[[model]]
name = "main delegates"
when = { last_user_text_contains = "Delegate the question" }
blocks = [{ type = "tool_use", id = "toolu_task_q", name = ["Agent", "Task"], input = { description = "Ask and create", prompt = "SUB-ASK: ask which name, then create the file.", subagent_type = "general-purpose", run_in_background = false } }]
"#;

/// Inside a sub-agent (2.1.332): the PreToolUse hook call of its Bash call carries its id
/// (the `task_id` of its `task_started`), as its permission request does; the main agent's
/// Task call's hook call names none. Its AskUserQuestion is refused by the CLI itself
/// ("not available inside subagents"): no QuestionAsked, no hook call, so questions come
/// only from the main agent (and carry no agent id). Replay gives the same hook calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_subagents_hook_calls_name_it_and_it_cannot_ask_2_1_332() {
    let world = World::with_scenario(NEW, ASKING_SUBAGENT).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let hook = pb::HookRegistration {
        id: "policy".into(),
        event: "PreToolUse".into(),
        timeout_secs: 60,
        default_decision: pb::HookDecision::Continue as i32,
        ..Default::default()
    };
    let s = c
        .create_session(as_client(
            "asks",
            pb::CreateSessionRequest {
                cwd: world.work.display().to_string(),
                hooks: vec![hook],
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "Delegate the question to a sub-agent.").await;

    // Continue every hook call, allow every permission request, until the turn ends.
    let mut hooks = Vec::new();
    let mut permission = None;
    loop {
        let ev = read_until(&mut events, &mut seen, "a request or the turn's end", |e| {
            is_turn_completed(e)
                || matches!(
                    e.payload,
                    Some(P::HookRequested(_) | P::QuestionAsked(_) | P::PermissionRequested(_))
                )
        })
        .await;
        match ev.payload {
            Some(P::HookRequested(h)) => {
                c.respond_to_hook(as_client(
                    "asks",
                    pb::RespondToHookRequest {
                        session_id: s.id.clone(),
                        request_id: h.request_id.clone(),
                        decision: pb::HookDecision::Continue as i32,
                        ..Default::default()
                    },
                ))
                .await
                .unwrap();
                hooks.push(h);
            }
            Some(P::PermissionRequested(r)) => {
                c.respond_to_permission(as_client("asks", allow(&s.id, &r.request_id)))
                    .await
                    .unwrap();
                permission = Some(r);
            }
            Some(P::QuestionAsked(q)) => panic!("a sub-agent asked {q:?}"),
            _ => break,
        }
    }
    let all = || seen.iter().map(describe).collect::<Vec<_>>();
    let started = seen
        .iter()
        .find_map(|e| match &e.payload {
            Some(P::TaskStarted(t)) => Some(t.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no task_started: {:#?}", all()));
    assert!(!started.task_id.is_empty());
    let permission = permission.unwrap_or_else(|| panic!("no permission request: {:#?}", all()));
    assert_eq!(permission.tool_use_id, "toolu_sub_bash_q");
    assert_eq!(permission.agent_id, started.task_id);
    let by_tool: Vec<(&str, &str)> = hooks
        .iter()
        .map(|h| (h.tool_use_id.as_str(), h.agent_id.as_str()))
        .collect();
    assert_eq!(
        by_tool,
        [
            ("toolu_task_q", ""),
            ("toolu_sub_bash_q", started.task_id.as_str())
        ],
        "{:#?}",
        all()
    );
    assert!(world.work.join("q.txt").exists());
    // The sub-agent's AskUserQuestion: an error result from the CLI, under its agent.
    let refused = seen
        .iter()
        .find_map(|e| match &e.payload {
            Some(P::ToolResult(r)) if r.tool_use_id == "toolu_sub_ask" => Some(r.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no result of the sub-agent's question: {:#?}", all()));
    assert!(refused.is_error, "{refused:?}");
    assert!(
        refused
            .tool_use_result_json
            .contains("not available inside subagents"),
        "{refused:?}"
    );
    assert_eq!(refused.agent_id, started.task_id);

    // Replay gives the same hook calls.
    let stored: Vec<pb::HookRequested> = history(&mut c, &s.id)
        .await
        .into_iter()
        .filter_map(|e| match e.payload {
            Some(P::HookRequested(h)) => Some(h),
            _ => None,
        })
        .collect();
    assert_eq!(stored, hooks);
}
