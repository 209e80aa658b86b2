//! One actor task per live session. It owns the session's [`SessionProcess`], consumes its
//! events (decoded lines, control requests, cancels, stalls, the exit), keeps the session's
//! permission state, and serves the engine's commands. Everything it writes goes through
//! the session's [`Hub`] (persist, then publish).
//!
//! The actor never awaits the CLI while the CLI may be waiting for it: control requests we
//! send (`interrupt`, `set_model`, ...) and the graceful stop run in their own tasks, so the
//! actor keeps draining stdout (the supervisor's reader resolves our requests only while its
//! channel has room).

use bytes::Bytes;
use ostler_protocol as proto;
use ostler_protocol::outbound::{OutRequest, ResponseBody, UserContent};
use ostler_protocol::{CanUseTool, CliRequest, Event};
use ostler_store::{
    DecideOutcome, Decision, InteractionState, NewInteraction, SessionPatch, TurnUsage, WithEvents,
};
use ostler_supervisor::{ControlError, ExitInfo, Line, ProcessEvent, Responder, SessionProcess};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::blocking::blocking;
use crate::error::{Error, Result};
use crate::handle::{Command, Meta, SessionEntry, SessionHandle, SessionView};
use crate::hub::{Item, now_ms};
use crate::permission::{self, ASK_USER_QUESTION, RuleAction};
use crate::shared::{Shared, SlotGuard};
use crate::types::*;

/// Lines batched into one store append at most.
const MAX_BATCH_LINES: usize = 256;

struct Pending {
    kind: InteractionKind,
    request: CanUseTool,
    responder: Responder,
    deadline: Option<Instant>,
}

pub(crate) struct Actor {
    shared: Arc<Shared>,
    entry: Arc<SessionEntry>,
    /// What readers see of this session (the actor is its only writer).
    view: ViewPublisher,
    /// Session rules and client message ids (rebuilt from the log before a spawn).
    meta: Meta,
    process: SessionProcess,
    events: mpsc::Receiver<ProcessEvent>,
    cmds: mpsc::Receiver<Command>,
    /// For tasks that report back (control requests).
    self_tx: mpsc::WeakSender<Command>,
    cwd: PathBuf,
    state: SessionState,
    pending: HashMap<String, Pending>,
    turns_outstanding: u32,
    claude_session_id: Option<String>,
    stop_waiters: Vec<oneshot::Sender<Result<()>>>,
    stop_requested: bool,
    shutdown: bool,
    last_model: Option<String>,
    /// The CLI's cumulative cost so far for this process.
    process_cost_usd: f64,
}

/// What an actor starts with.
pub(crate) struct ActorOptions {
    pub shared: Arc<Shared>,
    pub entry: Arc<SessionEntry>,
    pub process: SessionProcess,
    pub events: mpsc::Receiver<ProcessEvent>,
    pub cwd: PathBuf,
    /// The session's state before this process (its stored state).
    pub state: SessionState,
    pub claude_session_id: Option<String>,
    pub model: Option<String>,
    pub meta: Meta,
    /// The live-session slot, held until the actor ends.
    pub slot: SlotGuard,
    /// The stderr tail of the session's previous exit, shown until this process exits.
    pub stderr_tail: Option<String>,
}

/// The sending side of the view. Dropped with the actor (also when it panics): releases
/// the live-session slot first, then shows the session as no longer live, so whoever
/// waited for the end can take the slot again at once.
struct ViewPublisher {
    tx: watch::Sender<SessionView>,
    slot: Option<SlotGuard>,
}

impl Drop for ViewPublisher {
    fn drop(&mut self) {
        drop(self.slot.take());
        self.tx.send_modify(|v| v.live = false);
    }
}

impl Actor {
    /// Starts the actor of a freshly spawned process: creates its command channel and
    /// view, records the session `idle` (before this returns, so CreateSession /
    /// ResumeSession report a live state), then runs it in its own task. Returns the
    /// engine's handle.
    pub(crate) async fn spawn(o: ActorOptions) -> SessionHandle {
        let (tx, cmds) = mpsc::channel(64);
        let (view_tx, view) = watch::channel(SessionView {
            live: true,
            state: o.state,
            pending: BTreeMap::new(),
            stderr_tail: o.stderr_tail,
        });
        let pid = o.process.pid();
        let mut actor = Self {
            shared: o.shared,
            entry: o.entry,
            view: ViewPublisher {
                tx: view_tx,
                slot: Some(o.slot),
            },
            meta: o.meta,
            process: o.process,
            events: o.events,
            cmds,
            self_tx: tx.downgrade(),
            cwd: o.cwd,
            state: o.state,
            pending: HashMap::new(),
            turns_outstanding: 0,
            claude_session_id: o.claude_session_id,
            stop_waiters: Vec::new(),
            stop_requested: false,
            shutdown: false,
            last_model: o.model,
            process_cost_usd: 0.0,
        };
        actor.start(pid).await;
        tokio::spawn(actor.run());
        SessionHandle::new(tx, view)
    }

    /// Changes what readers see.
    fn show(&self, f: impl FnOnce(&mut SessionView)) {
        self.view.tx.send_modify(f);
    }

    /// Shows the state implied by the pending interactions and turns.
    fn show_live_state(&self) {
        let to = self.live_state();
        self.show(|v| v.state = to);
    }

    fn sid(&self) -> &str {
        &self.entry.id
    }

    /// The process is up: the session is idle (waiting for its first message).
    async fn start(&mut self, pid: u32) {
        self.set_state(
            SessionState::Idle,
            Some(format!(
                "CLI {} started (pid {pid})",
                self.shared.installation_version()
            )),
        )
        .await;
    }

    async fn run(mut self) {
        let mut held: Option<ProcessEvent> = None;
        let mut cmds_open = true;
        let mut alive = self.shared.alive();
        loop {
            let deadline = self.pending.values().filter_map(|p| p.deadline).min();
            let ev = if let Some(ev) = held.take() {
                Some(ev)
            } else {
                tokio::select! {
                    ev = self.events.recv() => ev.or_else(|| Some(ProcessEvent::Exited(ExitInfo {
                        code: None,
                        signal: None,
                        stderr_tail: String::new(),
                        requested: self.stop_requested,
                    }))),
                    cmd = self.cmds.recv(), if cmds_open => {
                        match cmd {
                            Some(cmd) => self.command(cmd).await,
                            None => {
                                cmds_open = false;
                            }
                        }
                        None
                    }
                    () = engine_gone(&mut alive) => {
                        // Every engine handle is gone without a shutdown: behave like a
                        // crashed daemon (kill the process, record nothing), so the next
                        // start finds the session live and makes it resumable.
                        self.process.kill();
                        return;
                    }
                    () = sleep_until(deadline), if deadline.is_some() => {
                        self.expire_due().await;
                        None
                    }
                }
            };
            let Some(ev) = ev else { continue };
            match ev {
                ProcessEvent::Line(line) => {
                    // A batch ends with a line that opens or withdraws a control request:
                    // its request is handled once the lines before it are recorded.
                    let mut lines = vec![line];
                    while lines.len() < MAX_BATCH_LINES
                        && !lines.last().is_some_and(Line::has_control)
                    {
                        match self.events.try_recv() {
                            Ok(ProcessEvent::Line(l)) => lines.push(l),
                            Ok(other) => {
                                held = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    self.lines(lines).await;
                }
                ProcessEvent::Stall { idle_for } => {
                    self.emit_logged(EventPayload::EngineNotice(EngineNotice {
                        code: "stall".into(),
                        message: format!(
                            "no output from the CLI for {idle_for:?} while a turn runs"
                        ),
                        data: None,
                    }))
                    .await;
                }
                ProcessEvent::Exited(info) => {
                    self.exited(info).await;
                    return;
                }
            }
        }
    }

    // ------------------------------------------------------------------ writing

    async fn emit(&self, payload: EventPayload) -> Result<Arc<EngineEvent>> {
        self.entry.hub.emit_one(payload).await
    }

    async fn emit_logged(&self, payload: EventPayload) -> Option<Arc<EngineEvent>> {
        let kind = payload.kind();
        match self.emit(payload).await {
            Ok(e) => Some(e),
            Err(e) => {
                tracing::error!(session = %self.sid(), kind, error = %e, "cannot record event");
                None
            }
        }
    }

    async fn set_state(&mut self, to: SessionState, reason: Option<String>) {
        if self.state == to {
            return;
        }
        let from = self.state;
        self.state = to;
        self.show(|v| v.state = to);
        // The event and the session's state column commit together.
        let patch = SessionPatch {
            state: Some(to),
            updated_ms: now_ms(),
            ..Default::default()
        };
        let item = Item::new(EventPayload::StateChanged(StateChanged {
            from,
            to,
            reason,
        }));
        let with = WithEvents {
            patch: Some(patch),
            ..Default::default()
        };
        match self.entry.hub.emit_with(vec![item], with).await {
            Ok(_) => self.shared.counts.moved(Some(from), Some(to)),
            Err(e) => tracing::error!(session = %self.sid(), error = %e, "cannot record state"),
        }
    }

    /// The state a live session is in given its pending interactions and turns.
    fn live_state(&self) -> SessionState {
        if !self.pending.is_empty() {
            SessionState::AwaitingPermission
        } else if self.turns_outstanding > 0 {
            SessionState::Running
        } else {
            SessionState::Idle
        }
    }

    async fn settle_state(&mut self, reason: Option<String>) {
        let to = self.live_state();
        self.set_state(to, reason).await;
    }

    // ------------------------------------------------------------------ lines

    async fn lines(&mut self, lines: Vec<Line>) {
        let mut items = Vec::new();
        let mut started: Option<usize> = None;
        let mut results: Vec<usize> = Vec::new();
        let mut requests = Vec::new();
        let mut cancelled = Vec::new();
        let keep_raw = self.shared.opts.store_raw_lines;
        let mut turns = self.turns_outstanding;
        for line in lines {
            let Line {
                decoded,
                responders,
                cancelled: withdrawn,
            } = line;
            let mut raw = Some(decoded.raw).filter(|r| keep_raw && !r.is_empty());
            let mut responders = responders.into_iter();
            cancelled.extend(withdrawn);
            for ev in decoded.events {
                let payload = match ev {
                    Event::SessionStarted(s) => {
                        started = Some(items.len());
                        EventPayload::SessionStarted(s)
                    }
                    Event::AssistantBlock(b) => EventPayload::AssistantBlock(b),
                    Event::PartialDelta(d) => EventPayload::PartialDelta(d),
                    Event::StreamMarker(m) => EventPayload::StreamMarker(m),
                    Event::UserMessage(u) => EventPayload::UserMessage(u),
                    Event::ToolResult(t) => EventPayload::ToolResult(t),
                    Event::ControlRequest(r) => {
                        // Recorded (with the line's raw bytes) once the lines before it are.
                        match responders.next() {
                            Some(responder) => requests.push((r, responder, raw.take())),
                            None => {
                                tracing::error!(session = %self.sid(), request_id = %r.request_id, "control request without a responder")
                            }
                        }
                        continue;
                    }
                    // Withdrawn requests are in the line's `cancelled`.
                    Event::ControlCancel(_) | Event::KeepAlive => continue,
                    Event::ControlResponse(r) => EventPayload::ControlResponse(r),
                    Event::TurnResult(r) => {
                        results.push(items.len());
                        // A result ends whatever ran (the CLI may merge queued messages
                        // into one turn, so results are not counted against sends).
                        turns = 0;
                        EventPayload::TurnCompleted(r)
                    }
                    Event::SystemNotice(n) => EventPayload::SystemNotice(n),
                    Event::Truncated(t) => EventPayload::Truncated(t),
                    Event::Diagnostic(d) => EventPayload::Diagnostic(d),
                    Event::Unknown(u) => EventPayload::Unknown(u),
                };
                if turns == 0
                    && matches!(
                        payload,
                        EventPayload::SessionStarted(_)
                            | EventPayload::AssistantBlock(_)
                            | EventPayload::PartialDelta(_)
                            | EventPayload::ToolResult(_)
                    )
                {
                    // Output of a turn we did not count (e.g. the next queued message).
                    turns = 1;
                }
                // The raw line is stored once, with the line's first stored event, and not
                // at all when the payload already holds the whole line verbatim.
                let keeps_line = matches!(
                    payload,
                    EventPayload::Unknown(_) | EventPayload::SystemNotice(_)
                );
                let raw_here = if payload.is_live_only() || keeps_line {
                    if keeps_line {
                        raw = None;
                    }
                    None
                } else {
                    raw.take()
                };
                items.push(Item {
                    payload,
                    raw: raw_here,
                    ts_ms: now_ms(),
                });
            }
        }
        if !items.is_empty() {
            self.record_lines(items, started, results, turns).await;
        }
        for (request, responder, raw) in requests {
            self.control_request(request, responder, raw).await;
        }
        for request_id in cancelled {
            self.cancelled_by_cli(&request_id).await;
        }
    }

    /// Persists the events of a batch of lines, records what GetSession reports about them,
    /// publishes them, and moves the turn count and state.
    async fn record_lines(
        &mut self,
        items: Vec<Item>,
        started: Option<usize>,
        results: Vec<usize>,
        turns: u32,
    ) {
        // The turn count (and so the state GetSession reports) moves before the result is
        // published, so a client that saw the result never reads a stale state.
        let turns_changed = turns != self.turns_outstanding;
        self.turns_outstanding = turns;
        if !results.is_empty() {
            self.show_live_state();
        }
        // Persist, then record what GetSession reports about these events (CLI session id,
        // usage), then publish: a client that saw them reads a session that agrees.
        let entry = self.entry.clone();
        let guard = entry.hub.lock().await;
        let events = match guard.persist(items).await {
            Ok(ev) => ev,
            Err(e) => {
                tracing::error!(session = %self.sid(), error = %e, "cannot record CLI output");
                return;
            }
        };
        if let Some(ev) = started.and_then(|i| events.get(i))
            && let EventPayload::SessionStarted(s) = &ev.payload
        {
            self.session_started(s).await;
        }
        let mut ended = Vec::new();
        for i in results {
            if let Some(ev) = events.get(i)
                && let EventPayload::TurnCompleted(r) = &ev.payload
            {
                self.record_usage(r, ev.seq).await;
                ended.push(r.subtype.clone());
            }
        }
        guard.publish(&events);
        drop(guard);
        for subtype in ended {
            self.turn_completed(&subtype).await;
        }
        if turns_changed {
            self.settle_state(None).await;
        }
    }

    async fn session_started(&mut self, s: &proto::SessionStarted) {
        let new_id = (!s.session_id.is_empty()
            && self.claude_session_id.as_deref() != Some(&s.session_id))
        .then(|| s.session_id.clone());
        let new_model = s
            .model
            .clone()
            .filter(|m| self.last_model.as_ref() != Some(m));
        if new_id.is_none() && new_model.is_none() {
            return;
        }
        if let Some(id) = &new_id {
            self.claude_session_id = Some(id.clone());
        }
        if let Some(m) = &new_model {
            self.last_model = Some(m.clone());
        }
        let patch = SessionPatch {
            claude_session_id: new_id,
            model: new_model,
            updated_ms: now_ms(),
            ..Default::default()
        };
        if let Err(e) = self.shared.store.update_session(self.sid(), patch).await {
            tracing::error!(session = %self.sid(), error = %e, "cannot record the CLI session id");
        }
    }

    async fn record_usage(&mut self, r: &proto::TurnResult, seq: Option<u64>) {
        // `total_cost_usd` is cumulative over the process's life (measured on 1.0.128 and
        // 2.1.330), while `usage` is per turn: record the difference.
        let turn_cost = match r.total_cost_usd {
            Some(total) if total.is_finite() => {
                let cost = (total - self.process_cost_usd).max(0.0);
                self.process_cost_usd = self.process_cost_usd.max(total);
                cost
            }
            _ => 0.0,
        };
        if let Some(u) = r.usage {
            let turn = TurnUsage {
                event_seq: seq,
                model: self.last_model.clone(),
                usage: ostler_store::UsageTotals {
                    input_tokens: u.input_tokens,
                    output_tokens: u.output_tokens,
                    cache_creation_input_tokens: u.cache_creation_input_tokens,
                    cache_read_input_tokens: u.cache_read_input_tokens,
                    cost_usd: turn_cost,
                },
                duration_ms: r.duration_ms,
                ts_ms: now_ms(),
            };
            if let Err(e) = self.shared.store.record_turn_usage(self.sid(), turn).await {
                tracing::error!(session = %self.sid(), error = %e, "cannot record turn usage");
            }
        }
    }

    async fn turn_completed(&mut self, subtype: &str) {
        // A finished turn leaves nothing to decide: whatever is still pending is stale.
        if self.turns_outstanding == 0 && !self.pending.is_empty() {
            let ids: Vec<String> = self.pending.keys().cloned().collect();
            for id in ids {
                self.close_pending(&id, "engine", "the turn ended", InteractionState::Cancelled)
                    .await;
            }
        }
        self.settle_state(Some(format!("turn ended ({subtype})")))
            .await;
    }

    // ------------------------------------------------------------------ CLI control requests

    async fn control_request(
        &mut self,
        request: proto::ControlRequest,
        responder: Responder,
        raw: Option<Bytes>,
    ) {
        let subtype = match request.request {
            CliRequest::CanUseTool(c) => {
                self.can_use_tool(request.request_id, c, responder, raw)
                    .await;
                return;
            }
            CliRequest::HookCallback(_) => "hook_callback".to_owned(),
            CliRequest::Other {
                ref request_subtype,
                ..
            } => request_subtype.clone(),
        };
        let items = vec![Item {
            payload: EventPayload::CliControlRequest(request),
            raw,
            ts_ms: now_ms(),
        }];
        if let Err(e) = self.entry.hub.emit(items).await {
            tracing::error!(session = %self.sid(), error = %e, "cannot record control request");
        }
        let _ = responder.respond(ResponseBody::Error {
            message: format!("ostler does not handle control requests of subtype {subtype:?}"),
        });
    }

    async fn can_use_tool(
        &mut self,
        request_id: String,
        c: CanUseTool,
        responder: Responder,
        raw: Option<Bytes>,
    ) {
        let expires = self.shared.opts.permission_expiry;
        let expires_at_ms = expires.map(|d| now_ms() + d.as_millis() as i64);
        let questions = if c.tool_name == ASK_USER_QUESTION {
            c.questions().filter(|q| !q.is_empty())
        } else {
            None
        };
        let (kind, payload) = match questions {
            Some(questions) => (
                InteractionKind::Question,
                EventPayload::QuestionAsked(QuestionAsked {
                    request_id: request_id.clone(),
                    tool_use_id: c.tool_use_id.clone(),
                    questions,
                    input: c.input.clone(),
                    expires_at_ms,
                }),
            ),
            None => (
                InteractionKind::Permission,
                EventPayload::PermissionRequested(PermissionRequested {
                    request_id: request_id.clone(),
                    tool_name: c.tool_name.clone(),
                    input: c.input.clone(),
                    tool_use_id: c.tool_use_id.clone(),
                    description: c.description.clone(),
                    display_name: c.display_name.clone(),
                    blocked_path: c.blocked_path.clone(),
                    decision_reason: c.decision_reason.clone(),
                    suggestions: c
                        .permission_suggestions
                        .as_ref()
                        .and_then(|s| s.to_value().ok()),
                    expires_at_ms: None,
                }),
            ),
        };
        // Rules decide permissions (never questions).
        let rule = (kind == InteractionKind::Permission)
            .then(|| {
                permission::evaluate(
                    self.shared.opts.rules.iter().chain(self.meta.rules.iter()),
                    &c.tool_name,
                    &c.input,
                    &self.cwd,
                )
            })
            .flatten();
        let payload = match (payload, &rule) {
            (EventPayload::PermissionRequested(mut p), None) => {
                p.expires_at_ms = expires_at_ms;
                EventPayload::PermissionRequested(p)
            }
            (p, _) => p,
        };
        // The request event and the pending interaction commit together.
        let ni = NewInteraction {
            session_id: self.sid().to_owned(),
            request_id: request_id.clone(),
            kind: match kind {
                InteractionKind::Permission => ostler_store::InteractionKind::Permission,
                InteractionKind::Question => ostler_store::InteractionKind::Question,
            },
            tool_name: Some(c.tool_name.clone()),
            input: Bytes::from(serde_json::to_vec(&c.input).unwrap_or_default()),
            suggestions: c
                .permission_suggestions
                .as_ref()
                .map(|s| Bytes::from(s.get().to_owned())),
            event_seq: None,
            created_ms: now_ms(),
        };
        let with = WithEvents {
            interaction: Some((ni, 0)),
            ..Default::default()
        };
        let entry = self.entry.clone();
        let guard = entry.hub.lock().await;
        let item = Item {
            payload,
            raw,
            ts_ms: now_ms(),
        };
        let event = match guard.persist_with(vec![item], Some(with)).await {
            Ok((mut v, _)) => match v.pop() {
                Some(e) => e,
                None => return,
            },
            Err(e) => {
                // Not recorded: do not ask anyone (nobody could answer durably); the dropped
                // responder denies with the supervisor's "no decision" message.
                tracing::error!(session = %self.sid(), error = %e, "cannot record permission request");
                return;
            }
        };
        let pending = Pending {
            kind,
            request: c,
            responder,
            deadline: expires.map(|d| Instant::now() + d),
        };
        self.pending.insert(request_id.clone(), pending);
        if rule.is_none() {
            // Visible through GetSession / PendingInteractions before any client sees the
            // request.
            let to = self.live_state();
            self.show(|v| {
                v.pending.insert(request_id.clone(), event.clone());
                v.state = to;
            });
        }
        guard.publish(std::slice::from_ref(&event));
        drop(guard);

        if let Some(rule) = rule {
            let by = rule.decided_by();
            let result = match rule.action {
                RuleAction::Allow => {
                    let input = self.pending[&request_id].request.input.clone();
                    self.decide(
                        &request_id,
                        &by,
                        Resolution::Allowed {
                            updated_input: input.clone(),
                            edited: false,
                        },
                        ResponseBody::Allow {
                            updated_input: input,
                            updated_permissions: None,
                        },
                    )
                    .await
                }
                RuleAction::Deny => {
                    let message =
                        format!("Denied by ostler permission rule `{}`", rule.rule.text());
                    self.decide(
                        &request_id,
                        &by,
                        Resolution::Denied {
                            message: message.clone(),
                            interrupt: false,
                        },
                        ResponseBody::Deny {
                            message,
                            interrupt: false,
                        },
                    )
                    .await
                }
            };
            if let Err(e) = result {
                tracing::error!(session = %self.sid(), error = %e, "rule decision failed");
            }
        }
        self.settle_state(None).await;
    }

    /// Records the decision (first wins, in the store), publishes it, answers the CLI.
    async fn decide(
        &mut self,
        request_id: &str,
        decided_by: &str,
        resolution: Resolution,
        body: ResponseBody,
    ) -> Result<Decided> {
        let Some(p) = self.pending.get(request_id) else {
            return Err(self.not_pending(request_id).await);
        };
        let kind = p.kind;
        let state = match &resolution {
            Resolution::Allowed { .. } => InteractionState::Allowed,
            Resolution::Denied { .. } => InteractionState::Denied,
            Resolution::Answered { .. } => InteractionState::Answered,
            Resolution::Expired { .. } => InteractionState::Expired,
            Resolution::Cancelled { .. } => InteractionState::Cancelled,
        };
        let decision = Decision {
            state,
            decided_by: decided_by.to_owned(),
            response: Some(Bytes::from(response_json(&body).to_string())),
            decided_ms: now_ms(),
        };
        let resolved = InteractionResolved {
            request_id: request_id.to_owned(),
            kind,
            resolution,
            decided_by: decided_by.to_owned(),
        };
        // The decision and its resolution event commit in one transaction.
        let with = WithEvents {
            decide: Some((request_id.to_owned(), decision)),
            ..Default::default()
        };
        let entry = self.entry.clone();
        let guard = entry.hub.lock().await;
        let item = Item::new(EventPayload::InteractionResolved(resolved.clone()));
        let (events, outcome) = guard.persist_with(vec![item], Some(with)).await?;
        if let Some(DecideOutcome::AlreadyDecided(i)) = outcome {
            // Someone decided durably first (cannot happen within one actor, which
            // serialises decisions, but the store is the authority).
            drop(guard);
            self.remove_pending(request_id);
            return Err(decided_error(request_id, &i));
        }
        let p = self.remove_pending(request_id);
        self.show_live_state();
        guard.publish(&events);
        drop(guard);
        if let Some(p) = p
            && let Err(e) = p.responder.respond(body)
        {
            tracing::warn!(session = %self.sid(), request_id, error = %e, "the CLI no longer waits for this decision");
        }
        Ok(Decided {
            seq: events.first().and_then(|e| e.seq).unwrap_or_default(),
            resolved,
        })
    }

    fn remove_pending(&mut self, request_id: &str) -> Option<Pending> {
        let p = self.pending.remove(request_id);
        self.show(|v| {
            v.pending.remove(request_id);
        });
        p
    }

    async fn not_pending(&self, request_id: &str) -> Error {
        let store = self.shared.store.clone();
        let (sid, rid) = (self.sid().to_owned(), request_id.to_owned());
        match blocking(move || store.interaction(&sid, &rid)).await {
            Ok(i) if i.state.is_final() => decided_error(request_id, &i),
            Ok(_) => Error::precondition(format!(
                "request {request_id:?} of session {:?} is no longer awaited by the CLI",
                self.sid()
            )),
            Err(_) => Error::not_found(format!(
                "permission request or question {request_id:?} in session {:?}",
                self.sid()
            )),
        }
    }

    /// Closes a pending interaction without an answer from a client (expiry, cancel, exit).
    async fn close_pending(
        &mut self,
        request_id: &str,
        by: &str,
        why: &str,
        state: InteractionState,
    ) {
        let (resolution, body) = match state {
            InteractionState::Expired => {
                let message = format!("ostler: {why}");
                (
                    Resolution::Expired {
                        message: message.clone(),
                    },
                    Some(ResponseBody::Deny {
                        message,
                        interrupt: false,
                    }),
                )
            }
            _ => (
                Resolution::Cancelled {
                    reason: why.to_owned(),
                },
                None,
            ),
        };
        match body {
            Some(body) => {
                if let Err(e) = self.decide(request_id, by, resolution, body).await {
                    tracing::warn!(session = %self.sid(), request_id, error = %e, "cannot close interaction");
                }
            }
            None => {
                // Cancelled: nothing to send (the CLI withdrew it or is gone); the dropped
                // responder answers "no decision" if the CLI still waits.
                let Some(p) = self.remove_pending(request_id) else {
                    return;
                };
                let decision = Decision {
                    state,
                    decided_by: by.to_owned(),
                    response: None,
                    decided_ms: now_ms(),
                };
                // The cancellation and its resolution event commit in one transaction.
                let item = Item::new(EventPayload::InteractionResolved(InteractionResolved {
                    request_id: request_id.to_owned(),
                    kind: p.kind,
                    resolution,
                    decided_by: by.to_owned(),
                }));
                let with = WithEvents {
                    decide: Some((request_id.to_owned(), decision)),
                    ..Default::default()
                };
                match self.entry.hub.emit_with(vec![item], with).await {
                    Ok((_, Some(DecideOutcome::AlreadyDecided(_)))) => {
                        tracing::debug!(session = %self.sid(), request_id, "already decided; not cancelled");
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::error!(session = %self.sid(), error = %e, "cannot record cancellation");
                    }
                }
                drop(p.responder);
            }
        }
    }

    async fn cancelled_by_cli(&mut self, request_id: &str) {
        self.close_pending(
            request_id,
            "cli",
            "withdrawn by the CLI",
            InteractionState::Cancelled,
        )
        .await;
        self.settle_state(None).await;
    }

    async fn expire_due(&mut self) {
        let now = Instant::now();
        let due: Vec<String> = self
            .pending
            .iter()
            .filter(|(_, p)| p.deadline.is_some_and(|d| d <= now))
            .map(|(id, _)| id.clone())
            .collect();
        let after = self.shared.opts.permission_expiry.unwrap_or_default();
        for id in due {
            self.close_pending(
                &id,
                "expiry",
                &format!("nobody answered within {after:?}; denied"),
                InteractionState::Expired,
            )
            .await;
        }
        self.settle_state(None).await;
    }

    // ------------------------------------------------------------------ commands

    async fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Send { msg, reply } => self.send(msg, reply).await,
            Command::SendWritten { seq, result, reply } => {
                let r = self.send_written(seq, result, true).await;
                let _ = reply.send(r);
            }
            Command::Respond {
                request_id,
                response,
                client,
                reply,
            } => {
                let r = self.respond(&request_id, response, &client).await;
                self.settle_state(None).await;
                let _ = reply.send(r);
            }
            Command::Answer {
                request_id,
                answers,
                client,
                reply,
            } => {
                let r = self.answer(&request_id, answers, &client).await;
                self.settle_state(None).await;
                let _ = reply.send(r);
            }
            Command::Control { request, reply } => {
                if self.stop_requested {
                    let _ = reply.send(Err(Error::precondition(format!(
                        "session {:?} is stopping",
                        self.sid()
                    ))));
                    return;
                }
                let process = self.process.clone();
                let tx = self.self_tx.clone();
                tokio::spawn(async move {
                    let result = process.request(request.clone()).await.map(|_| ());
                    if let Some(tx) = tx.upgrade() {
                        let _ = tx
                            .send(Command::ControlDone {
                                request,
                                result,
                                reply,
                            })
                            .await;
                    }
                });
            }
            Command::ControlDone {
                request,
                result,
                reply,
            } => {
                let r = self.control_done(request, result).await;
                let _ = reply.send(r);
            }
            Command::Stop { reply, shutdown } => {
                self.shutdown |= shutdown;
                self.stop_waiters.push(reply);
                if !self.stop_requested {
                    self.stop_requested = true;
                    let process = self.process.clone();
                    tokio::spawn(async move {
                        process.stop().await;
                    });
                }
            }
        }
    }

    /// Records the message, queues it for stdin and replies once it is written. The write
    /// is awaited in its own task: the CLI may stop reading stdin until its stdout is
    /// drained, so the actor keeps draining it meanwhile.
    async fn send(&mut self, msg: SendMessage, reply: oneshot::Sender<Result<SendOutcome>>) {
        if self.stop_requested {
            let _ = reply.send(Err(Error::precondition(format!(
                "session {:?} is stopping",
                self.sid()
            ))));
            return;
        }
        if let Some(id) = &msg.client_message_id
            && let Some(&seq) = self.meta.messages.get(id)
        {
            let _ = reply.send(Ok(SendOutcome {
                seq,
                duplicate: true,
            }));
            return;
        }
        let event = match self
            .emit(EventPayload::UserMessageSent(UserMessageSent {
                content: msg.content.clone(),
                client_message_id: msg.client_message_id.clone(),
                sent_by: msg.client.label(),
            }))
            .await
        {
            Ok(e) => e,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let seq = event.seq.unwrap_or_default();
        if let Some(id) = msg.client_message_id {
            self.meta.messages.insert(id, seq);
        }
        let content = match msg.content {
            MessageContent::Text(t) => UserContent::Text(t),
            MessageContent::Blocks(b) => UserContent::Blocks(b),
        };
        let ack = match self.process.queue_user(content) {
            Ok(ack) => ack,
            Err(e) => {
                let r = self.send_written(seq, Err(e), false).await;
                let _ = reply.send(r);
                return;
            }
        };
        self.turns_outstanding += 1;
        self.settle_state(Some("user message".into())).await;
        let tx = self.self_tx.clone();
        tokio::spawn(async move {
            let result = ack.written().await;
            if let Some(tx) = tx.upgrade() {
                let _ = tx.send(Command::SendWritten { seq, result, reply }).await;
            }
        });
    }

    async fn send_written(
        &mut self,
        seq: u64,
        result: ostler_supervisor::Result<()>,
        counted: bool,
    ) -> Result<SendOutcome> {
        if let Err(e) = result {
            self.emit_logged(EventPayload::EngineNotice(EngineNotice {
                code: "delivery_failed".into(),
                message: format!(
                    "the user message (seq {seq}) could not be written to the CLI: {e}"
                ),
                data: None,
            }))
            .await;
            if counted && self.turns_outstanding > 0 {
                self.turns_outstanding -= 1;
                self.settle_state(None).await;
            }
            return Err(Error::Unavailable(format!(
                "the CLI of session {:?} did not take the message: {e}",
                self.sid()
            )));
        }
        Ok(SendOutcome {
            seq,
            duplicate: false,
        })
    }

    async fn respond(
        &mut self,
        request_id: &str,
        response: PermissionResponse,
        client: &ClientRef,
    ) -> Result<Decided> {
        let Some(p) = self.pending.get(request_id) else {
            return Err(self.not_pending(request_id).await);
        };
        let by = client.label();
        match response {
            PermissionResponse::Allow {
                updated_input,
                remember,
            } => {
                if p.kind == InteractionKind::Question {
                    return Err(Error::precondition(format!(
                        "{request_id:?} is a question: answer it with AnswerQuestion (or deny it)"
                    )));
                }
                if let Some(v) = &updated_input
                    && !v.is_object()
                {
                    return Err(Error::invalid(
                        "updated_input",
                        "the edited tool input must be a JSON object",
                    ));
                }
                for r in &remember {
                    r.validate()?;
                }
                let edited = updated_input
                    .as_ref()
                    .is_some_and(|v| v != &p.request.input);
                let input = updated_input.unwrap_or_else(|| p.request.input.clone());
                let decided = self
                    .decide(
                        request_id,
                        &by,
                        Resolution::Allowed {
                            updated_input: input.clone(),
                            edited,
                        },
                        ResponseBody::Allow {
                            updated_input: input,
                            updated_permissions: None,
                        },
                    )
                    .await?;
                for rule in remember {
                    let text = rule.text();
                    if !self.meta.rules.contains(&rule) {
                        self.meta.rules.push(rule.clone());
                    }
                    self.emit_logged(EventPayload::EngineNotice(EngineNotice {
                        code: "rule_added".into(),
                        message: format!("{by} added session rule `{text}`"),
                        data: serde_json::to_value(&rule).ok(),
                    }))
                    .await;
                }
                Ok(decided)
            }
            PermissionResponse::Deny { message, interrupt } => {
                let message = if message.trim().is_empty() {
                    format!("Denied by {by}")
                } else {
                    message
                };
                self.decide(
                    request_id,
                    &by,
                    Resolution::Denied {
                        message: message.clone(),
                        interrupt,
                    },
                    ResponseBody::Deny { message, interrupt },
                )
                .await
            }
        }
    }

    async fn answer(
        &mut self,
        request_id: &str,
        answers: Vec<QuestionAnswer>,
        client: &ClientRef,
    ) -> Result<Decided> {
        let Some(p) = self.pending.get(request_id) else {
            return Err(self.not_pending(request_id).await);
        };
        if p.kind != InteractionKind::Question {
            return Err(Error::precondition(format!(
                "{request_id:?} is a permission request, not a question: use RespondToPermission"
            )));
        }
        let questions = p.request.questions().unwrap_or_default();
        let pairs = permission::validate_answers(
            &questions,
            &answers,
            self.shared.opts.allow_free_text_answers,
        )?;
        let updated_input = proto::outbound::answer_questions(&p.request, &pairs);
        self.decide(
            request_id,
            &client.label(),
            Resolution::Answered { answers },
            ResponseBody::Allow {
                updated_input,
                updated_permissions: None,
            },
        )
        .await
    }

    async fn control_done(
        &mut self,
        request: OutRequest,
        result: std::result::Result<(), ControlError>,
    ) -> Result<()> {
        if let Err(e) = result {
            return Err(match e {
                ControlError::Unsupported { message } => Error::precondition(format!(
                    "the CLI of session {:?} does not support this request: {message}",
                    self.sid()
                )),
                ControlError::Failed { message, .. } => {
                    Error::precondition(format!("the CLI refused: {message}"))
                }
                ControlError::Timeout(d) => {
                    Error::Unavailable(format!("the CLI did not answer within {d:?}"))
                }
                ControlError::ProcessGone => {
                    Error::Unavailable(format!("the CLI of session {:?} has exited", self.sid()))
                }
            });
        }
        let (code, message, patch) = match &request {
            OutRequest::SetModel(m) => {
                self.last_model = m.clone();
                (
                    "model_set",
                    format!("model set to {}", m.as_deref().unwrap_or("the default")),
                    Some(SessionPatch {
                        model: Some(m.clone().unwrap_or_else(|| "default".into())),
                        updated_ms: now_ms(),
                        ..Default::default()
                    }),
                )
            }
            OutRequest::SetPermissionMode(mode) => (
                "permission_mode_set",
                format!("permission mode set to {mode}"),
                Some(SessionPatch {
                    permission_mode: Some(mode.clone()),
                    updated_ms: now_ms(),
                    ..Default::default()
                }),
            ),
            OutRequest::Interrupt => ("interrupted", "interrupt sent".to_owned(), None),
            _ => ("control", "control request done".to_owned(), None),
        };
        if let Some(patch) = patch {
            self.shared.store.update_session(self.sid(), patch).await?;
        }
        self.emit(EventPayload::EngineNotice(EngineNotice {
            code: code.into(),
            message,
            data: None,
        }))
        .await?;
        Ok(())
    }

    // ------------------------------------------------------------------ exit

    async fn exited(&mut self, info: ExitInfo) {
        let why = if self.shutdown {
            "daemon shutting down"
        } else if self.stop_requested {
            "session stopped"
        } else {
            "the CLI process exited"
        };
        let ids: Vec<String> = self.pending.keys().cloned().collect();
        for id in ids {
            self.close_pending(&id, "engine", why, InteractionState::Cancelled)
                .await;
        }
        let reason = if self.shutdown {
            "daemon shutdown".to_owned()
        } else if info.requested || self.stop_requested {
            "stopped on request".to_owned()
        } else if info.success() {
            "the CLI exited".to_owned()
        } else {
            "the CLI crashed or was killed".to_owned()
        };
        let status = ExitStatus {
            code: info.code,
            signal: info.signal,
            reason: Some(reason.clone()),
            stderr_tail: info.stderr_tail.clone(),
            at_ms: now_ms(),
        };
        let tail = info.stderr_tail.clone();
        self.show(|v| v.stderr_tail = Some(tail));
        let to = if self.shutdown {
            SessionState::Resumable
        } else if self.stop_requested {
            SessionState::Stopped
        } else {
            SessionState::Exited
        };
        let patch = SessionPatch {
            exit: Some(ostler_store::ExitInfo {
                code: info.code,
                signal: info.signal,
                reason: Some(reason.clone()),
                at_ms: status.at_ms,
            }),
            updated_ms: now_ms(),
            ..Default::default()
        };
        // The exit event and the session's exit columns commit together.
        let item = Item::new(EventPayload::ProcessExited(ProcessExited { status }));
        let with = WithEvents {
            patch: Some(patch),
            ..Default::default()
        };
        if let Err(e) = self.entry.hub.emit_with(vec![item], with).await {
            tracing::error!(session = %self.sid(), error = %e, "cannot record the exit");
        }
        self.set_state(to, Some(reason)).await;
        for w in self.stop_waiters.drain(..) {
            let _ = w.send(Ok(()));
        }
    }
}

fn decided_error(request_id: &str, i: &ostler_store::Interaction) -> Error {
    let by = i.decided_by.clone().unwrap_or_else(|| "unknown".into());
    Error::FailedPrecondition {
        message: format!("request {request_id:?} was already {} by {by}", i.state),
        decided_by: Some(by),
    }
}

/// The JSON of a response body, as recorded with the decision.
fn response_json(body: &ResponseBody) -> Value {
    match body {
        ResponseBody::Allow { updated_input, .. } => {
            serde_json::json!({"behavior": "allow", "updatedInput": updated_input})
        }
        ResponseBody::Deny { message, interrupt } => {
            serde_json::json!({"behavior": "deny", "message": message, "interrupt": interrupt})
        }
        ResponseBody::Success(v) => v.clone(),
        ResponseBody::Error { message } => serde_json::json!({"error": message}),
    }
}

async fn engine_gone(rx: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|gone| *gone).await;
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending::<()>().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::EngineOptions;

    /// When an actor ends (its publisher drops: on any return, and when it panics), its
    /// live-session slot is released and the view shows the end, so whoever waited for the
    /// end (StopSession, then CreateSession) finds the slot free.
    #[tokio::test]
    async fn an_ended_actor_frees_its_slot_and_shows_the_end() {
        let dir = tempfile::tempdir().expect("tmp");
        let store =
            ostler_store::Store::open(dir.path().join("s.db"), Default::default()).expect("store");
        let installation = ostler_supervisor::Installation::assume(
            dir.path().join("claude"),
            semver::Version::new(2, 1, 330),
            None,
        );
        let (_gone_tx, gone) = watch::channel(false);
        let opts = EngineOptions {
            max_live_sessions: 1,
            ..Default::default()
        };
        let shared = Arc::new(Shared::new(opts, store, installation, Vec::new(), gone));
        let slot = shared.reserve_slot().expect("slot");
        assert!(shared.reserve_slot().is_err(), "one slot only");
        let (tx, view) = watch::channel(SessionView {
            live: true,
            state: SessionState::Idle,
            pending: BTreeMap::new(),
            stderr_tail: None,
        });
        let (cmd_tx, _cmd_rx) = mpsc::channel(1);
        let handle = SessionHandle::new(cmd_tx, view);
        assert!(handle.is_live());
        let waiter = {
            let (handle, shared) = (handle.clone(), shared.clone());
            tokio::spawn(async move {
                handle.ended().await;
                shared.reserve_slot().map(drop)
            })
        };
        drop(ViewPublisher {
            tx,
            slot: Some(slot),
        });
        let taken = tokio::time::timeout(ostler_testkit::timeouts::guard(), waiter)
            .await
            .expect("the end was seen")
            .expect("task");
        assert!(taken.is_ok(), "the slot was still taken: {taken:?}");
        assert!(!handle.is_live());
    }
}
