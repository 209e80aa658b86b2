//! CLI output -> events: a batch of the supervisor's owned lines becomes stored and
//! published events (payloads moved out of the lines), plus what GetSession reports about
//! them (CLI session id, model, usage, turns); control requests from the CLI go to their
//! handlers once the lines before them are recorded.
//!
//! Pipelined: a batch's stored events are queued to the store ([`Hub::queue`]) and the
//! actor reads on while the commit is in flight (up to [`MAX_IN_FLIGHT`] batches); each
//! batch is finished (recorded, published in seq order) when its commit resolves, in the
//! actor's loop. Live-only events (partials) are published as soon as they are decoded,
//! never behind a commit.

use bytes::Bytes;
use ostler_protocol as proto;
use ostler_protocol::outbound::ResponseBody;
use ostler_protocol::{CliRequest, Event};
use ostler_store::{InteractionState, SessionPatch, TurnUsage};
use ostler_supervisor::{Line, Responder};

use std::sync::Arc;

use super::Actor;
use crate::hub::{InFlight, Item, now_ms};
use crate::types::*;

/// Batches whose commit may be in flight at once; the actor stops reading CLI output
/// beyond that until the oldest resolves (backpressure to the CLI through the
/// supervisor's bounded channel).
pub(super) const MAX_IN_FLIGHT: usize = 4;

/// The most stored events of a batch that the actor commits on its own thread when it has
/// nothing else to do ([`ostler_store::Store::append_now`]); larger batches always go to the
/// writer thread, so that the actor is never blocked for long.
const MAX_COMMIT_NOW: usize = 8;

/// A batch of CLI output queued to the store, finished when its commit resolves.
pub(super) struct Batch {
    flight: InFlight,
    /// Index (among the batch's items) of a `SessionStarted`, of the `TurnCompleted`s.
    started: Option<usize>,
    results: Vec<usize>,
    /// The batch moved the turn count: the state settles once it is published.
    turns_changed: bool,
}

impl Batch {
    /// The commit of this batch.
    pub(super) fn ticket(&mut self) -> &mut ostler_store::Ticket<Vec<u64>> {
        &mut self.flight.ticket
    }
}

impl Actor {
    pub(super) async fn lines(&mut self, lines: Vec<Line>) {
        // About one event per line: sized so, the batch's items are not moved while it grows.
        let mut items = Vec::with_capacity(lines.len());
        let mut started: Option<usize> = None;
        let mut results: Vec<usize> = Vec::new();
        let mut requests = Vec::new();
        let mut cancelled = Vec::new();
        let keep_raw = self.shared.opts.store_raw_lines;
        let turns_before = self.owed.turns();
        // The lines of a batch (what the reader had queued) share one timestamp.
        let now = now_ms();
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
                    Event::UserMessage(mut u) => {
                        // The echo of a message written (`--replay-user-messages`): the CLI
                        // took it into this turn. Marked as such on every release (1.0.x
                        // does not mark it).
                        if u.parent_tool_use_id.is_none()
                            && let Some(id) = u.uuid.as_deref()
                            && self.owed.echoed(id)
                        {
                            u.is_replay = true;
                        }
                        EventPayload::UserMessage(u)
                    }
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
                    // The answer to the `initialize` sent at spawn is recorded once, whole,
                    // as the `session_initialized` notice (~17.5 KB on 2.1.330).
                    Event::ControlResponse(r)
                        if self.process.initialize_request_id() == Some(r.request_id.as_str()) =>
                    {
                        continue;
                    }
                    Event::ControlResponse(r) => EventPayload::ControlResponse(r),
                    Event::TurnResult(mut r) => match self.guard_refusal(&r) {
                        // The CLI refused the guarded cut at boot: no turn ran, so none
                        // completed; the notice records the refusal (the raw line goes
                        // with it), and the process ends.
                        Some(reason) => self.refusal(reason, Some(&r)),
                        None => {
                            results.push(items.len());
                            let inferred = self.owed.answered(&r.user_message_uuids);
                            if r.user_message_uuids.is_empty() {
                                // From a release that names nothing: what it echoed.
                                r.user_message_uuids = inferred;
                            }
                            self.turn_since_result = false;
                            EventPayload::TurnCompleted(r)
                        }
                    },
                    Event::SystemNotice(n) => {
                        // Withdrawn, or done with although no result named it (after a
                        // result, before the next turn's output: a message the CLI consumed
                        // without a turn of its own must not keep the session running).
                        if let Some(proto::NoticeDetail::MessageLifecycle(l)) = &n.detail {
                            if l.state == "cancelled"
                                || (l.state == "completed" && !self.turn_since_result)
                            {
                                self.owed.withdrawn(&l.message_id);
                            } else if l.state == "started" {
                                self.owed.started(&l.message_id);
                            }
                        }
                        EventPayload::SystemNotice(n)
                    }
                    Event::Truncated(t) => EventPayload::Truncated(t),
                    Event::Diagnostic(d) => EventPayload::Diagnostic(d),
                    Event::Unknown(u) => EventPayload::Unknown(u),
                };
                if matches!(
                    payload,
                    EventPayload::SessionStarted(_)
                        | EventPayload::AssistantBlock(_)
                        | EventPayload::PartialDelta(_)
                        | EventPayload::ToolResult(_)
                ) {
                    self.turn_since_result = true;
                    // With nothing owed: a turn no message was counted for (e.g. the next
                    // queued message on a release that names nothing and did not echo).
                    self.owed.output();
                }
                // The raw line is stored once, with the line's first stored event, and not
                // at all when the payload already holds the whole line verbatim.
                let keeps_line = matches!(
                    payload,
                    EventPayload::Unknown(_) | EventPayload::SystemNotice(_)
                );
                if payload.is_live_only() {
                    // Published now, not behind the commit of the lines before it.
                    let hub = &self.entry.hub;
                    hub.publish_live(Arc::new(hub.event(None, now, payload)));
                    continue;
                }
                let raw_here = if keeps_line {
                    raw = None;
                    None
                } else {
                    raw.take()
                };
                items.push(Item {
                    payload,
                    raw: raw_here,
                    ts_ms: now,
                });
            }
        }
        if !results.is_empty() && self.owed.turns() > 0 {
            // Messages still owed after a result: the CLI should take the next at once.
            self.start_grace();
        }
        let turns_changed = self.owed.turns() != turns_before;
        // A debug session's log is held near its cap during a long turn too: checked off
        // this task, at most once a second of batch time (`now`), never two at once.
        if !items.is_empty()
            && let Some(log) = &mut self.debug_log
        {
            log.stored(now);
        }
        if !items.is_empty() || turns_changed {
            self.record_lines(items, started, results, turns_changed)
                .await;
        }
        if !requests.is_empty() || !cancelled.is_empty() {
            // Handled once the lines before them are recorded and published.
            self.flush().await;
        }
        for (request, responder, raw) in requests {
            self.control_request(request, responder, raw).await;
        }
        for request_id in cancelled {
            self.cancel_tool_calls(Some(&request_id), "cli", "withdrawn by the CLI")
                .await;
            self.cancel_elicitations(Some(&request_id), "cli").await;
            self.cancel_dialogs(Some(&request_id), "cli").await;
            if !self.hook_withdrawn(&request_id).await {
                self.cancelled_by_cli(&request_id).await;
            }
        }
    }

    /// Queues the stored events of a batch of lines to the store (not waiting for the
    /// commit: [`Actor::finish_batch`] records and publishes them once it resolved), and
    /// settles the state once they are published if the batch moved the turns to come.
    pub(super) async fn record_lines(
        &mut self,
        items: Vec<Item>,
        started: Option<usize>,
        results: Vec<usize>,
        turns_changed: bool,
    ) {
        // The state GetSession reports follows the turns to come (moved already) before
        // the result is published, so a client that saw the result never reads a stale
        // state.
        if !results.is_empty() {
            self.show_live_state();
        }
        // Nothing in flight and no line waiting: the actor would only wait for this commit,
        // so it may as well run it (saving the hand-offs to the writer thread and back).
        let now =
            items.len() <= MAX_COMMIT_NOW && self.in_flight.is_empty() && self.events.is_empty();
        match self.entry.hub.queue(items, now) {
            Ok(Some(flight)) => {
                let mut batch = Batch {
                    flight,
                    started,
                    results,
                    turns_changed,
                };
                // Committed already unless the writer was busy: then finish it at once.
                match now.then(|| batch.ticket().try_take()).flatten() {
                    Some(committed) => self.finish_batch(batch, committed).await,
                    None => self.in_flight.push_back(batch),
                }
            }
            Ok(None) => {
                if turns_changed {
                    self.settle_state(None).await;
                }
            }
            Err(e) => self.output_lost(e),
        }
    }

    /// CLI output could not be stored: stop the session (it says why once the store
    /// writes again).
    fn output_lost(&mut self, e: crate::Error) {
        tracing::error!(session = %self.sid(), error = %e, "cannot record CLI output: stopping the session");
        if self.store_fault.is_none() {
            self.store_fault = Some(e.to_string());
        }
        if !self.stop_requested {
            self.stop_requested = true;
            let process = self.process.clone();
            tokio::spawn(async move {
                process.stop().await;
            });
        }
    }

    /// Finishes a batch whose commit resolved: records what GetSession reports about its
    /// events (CLI session id, usage), then publishes them (in seq order after every
    /// earlier write), then moves the state. A client that saw them reads a session that
    /// agrees.
    pub(super) async fn finish_batch(
        &mut self,
        batch: Batch,
        committed: ostler_store::Result<Vec<u64>>,
    ) {
        let Batch {
            flight,
            started,
            results,
            turns_changed,
        } = batch;
        let InFlight { place, items, .. } = flight;
        let events = match committed
            .map_err(crate::Error::from)
            .and_then(|seqs| self.entry.hub.built(items, seqs))
        {
            Ok(ev) => ev,
            Err(e) => {
                // The place is given up: later writes publish.
                drop(place);
                self.output_lost(e);
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
        place.publish(&events);
        for subtype in ended {
            self.turn_completed(&subtype).await;
        }
        if turns_changed {
            self.settle_state(None).await;
        }
    }

    /// Waits for every batch in flight and finishes it, in order.
    pub(super) async fn flush(&mut self) {
        while let Some(mut batch) = self.in_flight.pop_front() {
            let committed = batch.ticket().await;
            self.finish_batch(batch, committed).await;
        }
    }

    pub(super) async fn session_started(&mut self, s: &proto::SessionStarted) {
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

    pub(super) async fn record_usage(&mut self, r: &proto::TurnResult, seq: Option<u64>) {
        // `total_cost_usd` is cumulative over the process's life (measured on 1.0.128 and
        // 2.1.330), from what a resuming 2.1.330+ restored (`process_cost_usd`'s start),
        // while `usage` is per turn: record the difference.
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

    pub(super) async fn turn_completed(&mut self, subtype: &str) {
        self.prompts_answered.clear();
        // A finished turn leaves nothing to decide: whatever is still pending is stale
        // (unless the next turn began meanwhile; a message queued behind the turn that
        // ended has not).
        if !self.turn_since_result {
            self.cancel_tool_calls(None, "engine", "the turn ended")
                .await;
            self.cancel_elicitations(None, "engine").await;
            self.cancel_dialogs(None, "engine").await;
        }
        if !self.turn_since_result && !self.pending.is_empty() {
            let ids: Vec<String> = self.pending.keys().cloned().collect();
            for id in ids {
                self.close_pending(&id, "engine", "the turn ended", InteractionState::Cancelled)
                    .await;
            }
        }
        // Before the session settles: a client that waits for idle reads a trimmed log.
        if let Some(log) = &self.debug_log {
            crate::engine::debug_log::trim_logged(
                &self.entry.id,
                log.path().to_owned(),
                self.shared.opts.debug_max_bytes,
            )
            .await;
        }
        self.settle_state(Some(format!("turn ended ({subtype})")))
            .await;
    }

    pub(super) async fn control_request(
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
            CliRequest::HookCallback(cb) => {
                self.hook_callback(request.request_id, cb, responder, raw)
                    .await;
                return;
            }
            CliRequest::Other {
                ref request_subtype,
                raw: ref body,
            } if request_subtype == "mcp_message" && !self.tool_servers.is_empty() => {
                let body = body.clone();
                self.mcp_message(request.request_id, &body, responder, raw)
                    .await;
                return;
            }
            CliRequest::Other {
                ref request_subtype,
                raw: ref body,
            } if request_subtype == "elicitation" => {
                let body = body.clone();
                self.elicitation(request.request_id, &body, responder, raw)
                    .await;
                return;
            }
            CliRequest::Other {
                ref request_subtype,
                raw: ref body,
            } if request_subtype == "request_user_dialog" => {
                let body = body.clone();
                self.dialog(request.request_id, &body, responder, raw).await;
                return;
            }
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
}
