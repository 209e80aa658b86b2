//! gRPC helpers for the daemon tests (`tests/daemon_*.rs`): the fake model's script, the
//! generated tonic clients, reading a session's event stream.
#![allow(clippy::unwrap_used)] // test helpers: a failure should panic with the error

use std::path::Path;

use ostler_proto::v1 as pb;
use ostler_proto::v1::daemon_service_client::DaemonServiceClient;
use ostler_proto::v1::session_service_client::SessionServiceClient;
use tonic::transport::Channel;

use super::{Daemon, guard};

/// The fake model's script shared by the daemon tests.
pub const SCENARIO: &str = r#"
default_text = "OK."

[[model]]
name = "model switched"
when = { last_user_text_contains = "Which model", model_contains = "opus-test", stream = true }
blocks = [{ type = "text", text = "Answer from opus-test." }]

# Rules that must win when a release merges an interrupted prompt into the next one.
[[model]]
name = "still there"
when = { last_user_text_contains = "Are you still there", stream = true }
blocks = [{ type = "text", text = "Yes, still here." }]

[[model]]
name = "recall"
when = { last_user_text_contains = "What was the word", messages_contain = "Remember the word PINEAPPLE", stream = true }
blocks = [{ type = "text", text = "The word was PINEAPPLE." }]

[[model]]
name = "touch"
when = { last_user_text_contains = "Create the file allowed.txt", stream = true }
blocks = [
  { type = "text", text = "I will create the file." },
  { type = "tool_use", id = "toolu_touch_1", name = "Bash", input = { command = "touch allowed.txt", description = "Create allowed.txt" } },
]

[[model]]
name = "after touch"
when = { tool_result_for = "toolu_touch_1", stream = true }
blocks = [{ type = "text", text = "Created allowed.txt." }]

# A tool that leaves its CLI's process group (its own session) and outlives the tool call.
[[model]]
name = "sleeper"
when = { last_user_text_contains = "Start the background sleeper", stream = true }
blocks = [
  { type = "tool_use", id = "toolu_sleeper_1", name = "Bash", input = { command = "setsid sh -c 'echo $$ > sleeper.tmp; mv sleeper.tmp sleeper.pid; exec sleep 300' </dev/null >/dev/null 2>&1 & while [ ! -s sleeper.pid ]; do sleep 0.05; done", description = "Start a background sleeper" } },
]

[[model]]
name = "after sleeper"
when = { tool_result_for = "toolu_sleeper_1", stream = true }
blocks = [{ type = "text", text = "The sleeper runs." }]

# The same, with its environment cleared too (no process-tree mark): only a cgroup holds it.
[[model]]
name = "hidden sleeper"
when = { last_user_text_contains = "Start the hidden sleeper", stream = true }
blocks = [
  { type = "tool_use", id = "toolu_hidden_1", name = "Bash", input = { command = "env -i /usr/bin/setsid /bin/sh -c 'echo $$ > hidden.tmp; /bin/mv hidden.tmp hidden.pid; exec /bin/sleep 300' </dev/null >/dev/null 2>&1 & while [ ! -s hidden.pid ]; do sleep 0.05; done", description = "Start a hidden sleeper" } },
]

[[model]]
name = "after hidden sleeper"
when = { tool_result_for = "toolu_hidden_1", stream = true }
blocks = [{ type = "text", text = "The hidden sleeper runs." }]

[[model]]
name = "ask"
when = { last_user_text_contains = "Ask me which database", stream = true }
blocks = [
  { type = "tool_use", id = "toolu_ask_1", name = "AskUserQuestion", input = { questions = [
    { question = "Which database should I use?", header = "Database", multiSelect = false, options = [
      { label = "SQLite", description = "Embedded, one file" },
      { label = "PostgreSQL", description = "A server" },
    ] },
  ] } },
]

[[model]]
name = "after ask"
when = { tool_result_for = "toolu_ask_1", stream = true }
blocks = [{ type = "text", text = "Thanks, I will use your choice." }]

[[model]]
name = "slow story"
when = { last_user_text_contains = "Tell me a long story", stream = true }
chunks = 60
delay_ms = 100
blocks = [{ type = "text", text = "Once upon a time there was a daemon that kept many sessions alive, and every one of them streamed its answers slowly, delta after delta, until someone pressed stop." }]

[[model]]
name = "remember"
when = { last_user_text_contains = "Remember the word", stream = true }
chunks = 3
blocks = [{ type = "text", text = "I will remember PINEAPPLE." }]

[[model]]
name = "large"
when = { last_user_text_contains = "Give me a large answer", stream = true }
chunks = 20
blocks = [{ type = "text", text = "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ\n", repeat = 6000 }]

[[model]]
name = "hello"
when = { last_user_text_contains = "Say hello", stream = true }
blocks = [{ type = "text", text = "Hello from the fake model!" }]
"#;

impl Daemon {
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    pub async fn sessions(&self) -> SessionServiceClient<Channel> {
        SessionServiceClient::new(self.channel().await).max_decoding_message_size(64 << 20)
    }

    pub async fn daemon_client(&self) -> DaemonServiceClient<Channel> {
        DaemonServiceClient::new(self.channel().await)
    }
}

/// A request carrying the `x-ostler-client` header.
pub fn as_client<T>(client: &str, msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("x-ostler-client", client.parse().unwrap());
    r
}

/// `client` allows `request_id` of `session_id` as it was asked (no change to the input).
pub async fn allow(
    c: &mut SessionServiceClient<Channel>,
    client: &str,
    session_id: &str,
    request_id: &str,
) -> pb::RespondToPermissionResponse {
    c.respond_to_permission(as_client(
        client,
        pb::RespondToPermissionRequest {
            session_id: session_id.to_owned(),
            request_id: request_id.to_owned(),
            decision: Some(pb::respond_to_permission_request::Decision::Allow(
                pb::PermissionAllow::default(),
            )),
        },
    ))
    .await
    .unwrap()
    .into_inner()
}

/// Reads until the next permission request (returned) or the turn's end (`None`).
pub async fn next_permission_request(
    events: &mut Events,
    seen: &mut Vec<pb::SessionEvent>,
) -> Option<pb::PermissionRequested> {
    use pb::session_event::Payload as P;
    let ev = read_until(
        events,
        seen,
        "a permission request or the turn's end",
        |e| is_turn_completed(e) || matches!(e.payload, Some(P::PermissionRequested(_))),
    )
    .await;
    match ev.payload {
        Some(P::PermissionRequested(p)) => Some(p),
        _ => None,
    }
}

/// `client` allows every permission request of `session_id` as it was asked, until the
/// turn ends; returns how many it allowed.
pub async fn allow_until_turn_end(
    c: &mut SessionServiceClient<Channel>,
    client: &str,
    session_id: &str,
    events: &mut Events,
    seen: &mut Vec<pb::SessionEvent>,
) -> usize {
    let mut allowed = 0;
    while let Some(req) = next_permission_request(events, seen).await {
        allow(c, client, session_id, &req.request_id).await;
        allowed += 1;
    }
    allowed
}

pub fn text(t: &str) -> Option<pb::MessageContent> {
    Some(pb::MessageContent {
        content: Some(pb::message_content::Content::Text(t.to_owned())),
    })
}

pub type Events = tonic::Streaming<pb::SessionEvent>;

/// StopSession, then ResumeSession (no fork, no cut): the session's next process.
pub async fn stop_and_resume(c: &mut SessionServiceClient<Channel>, session_id: &str) {
    c.stop_session(pb::StopSessionRequest {
        session_id: session_id.to_owned(),
    })
    .await
    .unwrap();
    c.resume_session(pb::ResumeSessionRequest {
        session_id: session_id.to_owned(),
        ..Default::default()
    })
    .await
    .unwrap();
}

/// Every stored event of a session, from seq 1, without following live.
pub async fn history(
    c: &mut SessionServiceClient<Channel>,
    session_id: &str,
) -> Vec<pb::SessionEvent> {
    let mut replay = c
        .subscribe(pb::SubscribeRequest {
            session_id: session_id.to_owned(),
            after_seq: 0,
            include_partial: false,
            follow: false,
        })
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    while let Some(e) = replay.message().await.unwrap() {
        events.push(e);
    }
    events
}

pub async fn subscribe(
    c: &mut SessionServiceClient<Channel>,
    session_id: &str,
    after_seq: u64,
    include_partial: bool,
) -> Events {
    c.subscribe(pb::SubscribeRequest {
        session_id: session_id.to_owned(),
        after_seq,
        include_partial,
        follow: true,
    })
    .await
    .unwrap()
    .into_inner()
}

/// Reads events until `stop` says so (the matching event is included).
pub async fn read_until(
    events: &mut Events,
    seen: &mut Vec<pb::SessionEvent>,
    what: &str,
    mut stop: impl FnMut(&pb::SessionEvent) -> bool,
) -> pb::SessionEvent {
    let fut = async {
        loop {
            let ev = events
                .message()
                .await
                .unwrap_or_else(|e| panic!("stream failed waiting for {what}: {e}"))
                .unwrap_or_else(|| panic!("stream ended waiting for {what}"));
            seen.push(ev.clone());
            if stop(&ev) {
                return ev;
            }
        }
    };
    match tokio::time::timeout(guard(), fut).await {
        Ok(ev) => ev,
        Err(_) => panic!(
            "timed out waiting for {what}; saw {:#?}",
            seen.iter().map(describe).collect::<Vec<_>>()
        ),
    }
}

pub fn describe(e: &pb::SessionEvent) -> String {
    use pb::session_event::Payload as P;
    let kind = match &e.payload {
        Some(P::SessionStarted(_)) => "session_started".to_owned(),
        Some(P::UserMessage(u)) => format!("user_message({:?})", u.text),
        Some(P::AssistantBlock(b)) => {
            format!("assistant_block({:?})", b.block.as_ref().map(block_kind))
        }
        Some(P::ToolResult(_)) => "tool_result".to_owned(),
        Some(P::PermissionRequested(p)) => format!("permission_requested({})", p.tool_name),
        Some(P::PermissionResolved(r)) => format!("permission_resolved({:?})", r.resolution()),
        Some(P::QuestionAsked(_)) => "question_asked".to_owned(),
        Some(P::QuestionAnswered(_)) => "question_answered".to_owned(),
        Some(P::TurnCompleted(t)) => format!("turn_completed({})", t.subtype),
        Some(P::StateChanged(s)) => format!("state_changed({:?}->{:?})", s.from(), s.to()),
        Some(P::SystemNotice(n)) => format!("system_notice({}/{})", n.source_type, n.subtype),
        Some(P::ProcessExited(x)) => format!(
            "process_exited({:?}, {:?}, stderr: {})",
            x.exit_code, x.reason, x.stderr_tail
        ),
        Some(P::Diagnostic(d)) => format!("diagnostic({})", d.code),
        Some(P::Unknown(u)) => format!("unknown({})", u.message_type),
        Some(P::PartialDelta(_)) => "partial_delta".to_owned(),
        Some(P::EngineNotice(n)) => format!("engine_notice({})", n.code),
        Some(P::PartialsMissed(m)) => format!("partials_missed({})", m.count),
        Some(P::HookRequested(h)) => format!("hook_requested({})", h.hook_event),
        Some(P::HookResolved(h)) => format!("hook_resolved({:?})", h.decision()),
        Some(P::ToolCallRequested(t)) => format!("tool_call_requested({})", t.tool_name),
        Some(P::ToolCallResolved(t)) => format!("tool_call_resolved(error: {})", t.is_error),
        Some(P::ElicitationRequested(e)) => format!("elicitation_requested({})", e.mode),
        Some(P::ElicitationResolved(e)) => format!("elicitation_resolved({:?})", e.action()),
        Some(P::ElicitationCompleted(e)) => format!("elicitation_completed({})", e.elicitation_id),
        Some(P::DialogRequested(d)) => format!("dialog_requested({})", d.dialog_kind),
        Some(P::DialogResolved(d)) => format!(
            "dialog_resolved({:?} {} by {})",
            d.behavior(),
            d.result_json,
            d.resolved_by
        ),
        Some(P::HookActivity(h)) => format!("hook_activity({} {})", h.hook_name, h.phase),
        Some(P::Informational(i)) => format!("informational({})", i.level),
        Some(P::PromptSuggestion(p)) => format!("prompt_suggestion({})", p.suggestion),
        Some(P::TaskStarted(t)) => format!("task_started({})", t.task_id),
        Some(P::TaskProgress(t)) => format!("task_progress({})", t.task_id),
        Some(P::TaskNotification(t)) => format!("task_notification({}, {})", t.task_id, t.status),
        Some(P::RateLimit(r)) => format!("rate_limit({})", r.status),
        Some(P::CompactBoundary(c)) => format!("compact_boundary({})", c.trigger),
        Some(P::CliStatus(c)) => format!("cli_status({:?})", c.status),
        Some(P::MessageLifecycle(m)) => format!("message_lifecycle({})", m.state),
        None => "none".to_owned(),
    };
    format!("#{} {kind}", e.seq)
}

fn block_kind(b: &pb::assistant_block::Block) -> String {
    use pb::assistant_block::Block as B;
    match b {
        B::Text(t) => format!("text {:?}", t.text.chars().take(40).collect::<String>()),
        B::Thinking(_) => "thinking".into(),
        B::ToolUse(t) => format!("tool_use {}", t.name),
        B::RedactedThinking(_) => "redacted".into(),
        B::Other(o) => o.block_type.clone(),
    }
}

pub fn is_turn_completed(e: &pb::SessionEvent) -> bool {
    matches!(
        e.payload,
        Some(pb::session_event::Payload::TurnCompleted(_))
    )
}

pub fn assistant_text(e: &pb::SessionEvent) -> Option<&str> {
    match &e.payload {
        Some(pb::session_event::Payload::AssistantBlock(b)) => match &b.block {
            Some(pb::assistant_block::Block::Text(t)) => Some(&t.text),
            _ => None,
        },
        _ => None,
    }
}

/// Stored seqs of a list of events (partials excluded), checking they are consecutive.
pub fn assert_gap_free(events: &[pb::SessionEvent], from: u64) -> Vec<u64> {
    let seqs: Vec<u64> = events
        .iter()
        .filter(|e| e.seq != 0 && !e.redelivered)
        .map(|e| e.seq)
        .collect();
    for (i, s) in seqs.iter().enumerate() {
        assert_eq!(
            *s,
            from + i as u64,
            "seqs must be consecutive from {from}: {seqs:?}"
        );
    }
    seqs
}

/// `SendControlRequest` of `subtype` with `request_json` on session `id`, on a clone of `c`;
/// the future borrows nothing (closures can return it).
pub fn send_control(
    c: &SessionServiceClient<Channel>,
    id: &str,
    subtype: &str,
    request_json: &str,
) -> impl std::future::Future<Output = Result<pb::SendControlRequestResponse, tonic::Status>> + use<>
{
    let mut c = c.clone();
    let req = pb::SendControlRequestRequest {
        session_id: id.to_owned(),
        subtype: subtype.into(),
        request_json: request_json.into(),
    };
    async move { c.send_control_request(req).await.map(|r| r.into_inner()) }
}

/// The test kit's MCP server (`ostler-test-mcp`, tools `echo_ticket` and `confirm_ticket`)
/// as the one stdio server `tickets` of a session.
pub async fn tickets_server() -> std::collections::HashMap<String, pb::McpServerSpec> {
    let mcp = super::testkit_binary("ostler-test-mcp").await;
    let stdio = pb::McpStdioServerSpec {
        command: mcp.display().to_string(),
        ..Default::default()
    };
    [(
        "tickets".to_string(),
        pb::McpServerSpec {
            transport: Some(pb::mcp_server_spec::Transport::Stdio(stdio)),
            ..Default::default()
        },
    )]
    .into()
}

pub async fn create_session(
    c: &mut SessionServiceClient<Channel>,
    work: &Path,
    client: &str,
) -> pb::Session {
    c.create_session(as_client(
        client,
        pb::CreateSessionRequest {
            cwd: work.display().to_string(),
            ..Default::default()
        },
    ))
    .await
    .unwrap()
    .into_inner()
}

/// Waits until `session` (as CreateSession or ResumeSession returned it) is idle: its CLI
/// answered `initialize`. Before that, `/proc/<pid>` of the CLI may be read inside the
/// `execve` from `env` to `node` (the CLI's shebang), where `cmdline` and `environ` read
/// empty.
pub async fn settled(c: &mut SessionServiceClient<Channel>, session: &pb::Session) {
    if session.state() == pb::SessionState::Idle {
        return;
    }
    let mut events = subscribe(c, &session.id, session.last_seq, false).await;
    read_until(&mut events, &mut Vec::new(), "the CLI to settle", |e| {
        matches!(&e.payload, Some(pb::session_event::Payload::StateChanged(s))
            if s.to() == pb::SessionState::Idle)
    })
    .await;
}

pub async fn send(c: &mut SessionServiceClient<Channel>, session_id: &str, t: &str) -> u64 {
    c.send_message(as_client(
        "sender",
        pb::SendMessageRequest {
            session_id: session_id.to_owned(),
            content: text(t),
            client_message_id: String::new(),
            ..Default::default()
        },
    ))
    .await
    .unwrap()
    .into_inner()
    .seq
}

/// Sends `prompt` and returns the assistant's text of that turn.
pub async fn turn(c: &mut SessionServiceClient<Channel>, id: &str, prompt: &str) -> String {
    let after = c
        .get_session(pb::GetSessionRequest {
            session_id: id.to_owned(),
        })
        .await
        .unwrap()
        .into_inner()
        .last_seq;
    let mut events = subscribe(c, id, after, false).await;
    send(c, id, prompt).await;
    let mut seen = Vec::new();
    read_until(&mut events, &mut seen, "the turn's end", is_turn_completed).await;
    // The session is idle again once its state change is logged.
    read_until(&mut events, &mut seen, "idle", |e| {
        matches!(&e.payload, Some(pb::session_event::Payload::StateChanged(s)) if s.to() == pb::SessionState::Idle)
    })
    .await;
    // A release that reports the message's lifecycle (2.1.332) may say `completed` after
    // that: the log rests once it has.
    let lifecycle = |e: &pb::SessionEvent| match &e.payload {
        Some(pb::session_event::Payload::MessageLifecycle(m)) => {
            Some((m.message_id.clone(), m.state.clone()))
        }
        _ => None,
    };
    let tracked: Vec<(String, String)> = seen.iter().filter_map(lifecycle).collect();
    if let Some((id, _)) = tracked.first()
        && !tracked.iter().any(|(i, s)| i == id && s == "completed")
    {
        let id = id.clone();
        read_until(&mut events, &mut seen, "the message's completion", |e| {
            lifecycle(e).is_some_and(|(i, s)| i == id && s == "completed")
        })
        .await;
    }
    seen.iter().filter_map(assistant_text).collect()
}

pub async fn session(c: &mut SessionServiceClient<Channel>, id: &str) -> pb::Session {
    c.get_session(pb::GetSessionRequest {
        session_id: id.to_owned(),
    })
    .await
    .unwrap()
    .into_inner()
}

/// Asserts that a call was refused with `code` and a message containing `needle` (and
/// short: a refusal never echoes big input back).
#[track_caller]
pub fn assert_refused<T: std::fmt::Debug>(
    r: Result<T, tonic::Status>,
    code: tonic::Code,
    needle: &str,
) {
    let err = r.expect_err("the call was refused");
    assert_eq!(err.code(), code, "{err:?}");
    assert!(err.message().contains(needle), "{}", err.message());
    assert!(err.message().len() < 1000, "{} bytes", err.message().len());
}

/// Every pending interaction across sessions (`ListPendingInteractions`).
pub async fn pending_interactions(
    c: &mut SessionServiceClient<Channel>,
) -> Vec<pb::PendingInteraction> {
    c.list_pending_interactions(pb::ListPendingInteractionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .interactions
}
