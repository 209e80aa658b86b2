//! CLI output -> events: a batch of the supervisor's owned lines becomes stored and
//! published events (payloads moved out of the lines), plus what GetSession reports about
//! them (CLI session id, model, usage, turns); control requests from the CLI go to their
//! handlers once the lines before them are recorded.

use bytes::Bytes;
use ostler_protocol as proto;
use ostler_protocol::outbound::ResponseBody;
use ostler_protocol::{CliRequest, Event};
use ostler_store::{InteractionState, SessionPatch, TurnUsage};
use ostler_supervisor::{Line, Responder};

use super::Actor;
use crate::hub::{Item, now_ms};
use crate::types::*;

impl Actor {
    pub(super) async fn lines(&mut self, lines: Vec<Line>) {
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
    pub(super) async fn record_lines(
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

    pub(super) async fn turn_completed(&mut self, subtype: &str) {
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
}
