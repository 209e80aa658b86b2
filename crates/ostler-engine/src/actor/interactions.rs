//! Permission requests and questions: `can_use_tool` (rules first, else the clients),
//! decisions (first wins, recorded with the resolution event in one transaction), client
//! responses and answers, expiry, withdrawal by the CLI, cancellation at the end of a turn
//! or process.

use std::sync::Arc;

use bytes::Bytes;
use ostler_protocol as proto;
use ostler_protocol::CanUseTool;
use ostler_protocol::outbound::ResponseBody;
use ostler_store::{DecideOutcome, Decision, InteractionState, NewInteraction, WithEvents};
use ostler_supervisor::Responder;
use serde_json::Value;
use tokio::time::Instant;

use super::{Actor, Pending};
use crate::blocking::blocking;
use crate::error::{Error, Result};
use crate::hub::{Item, now_ms};
use crate::permission::{self, ASK_USER_QUESTION, RuleAction};
use crate::types::*;

/// A control request of the CLI waiting for a client's answer
/// ([`Actor::answer_waiting`]).
pub(super) trait Waiting {
    fn into_responder(self) -> Responder;
}

impl Actor {
    pub(super) async fn can_use_tool(
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
                    agent_id: c.agent_id.clone(),
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
            kind,
            tool_name: Some(c.tool_name.clone()),
            input: Bytes::from(serde_json::to_vec(&c.input).unwrap_or_default()),
            suggestions: c
                .permission_suggestions
                .as_ref()
                .map(|s| Bytes::from(s.get().to_owned())),
            event_seq: None,
            created_ms: now_ms(),
        };
        let item = Item {
            payload,
            raw,
            ts_ms: now_ms(),
        };
        let pending = Pending {
            kind,
            request: c,
            responder,
            deadline: expires.map(|d| Instant::now() + d),
        };
        // A request a rule decides at once is not shown as pending.
        let recorded = self
            .record_pending(item, ni, rule.is_none(), "permission request", |a| {
                a.pending.insert(request_id.clone(), pending);
            })
            .await;
        if recorded.is_none() {
            // Not recorded: do not ask anyone (nobody could answer durably); the dropped
            // responder denies with the supervisor's "no decision" message.
            return;
        }

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
                            updated_permissions: None,
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

    /// Stores a request event (`item`) with its pending interaction in one transaction. Once
    /// stored, `keep` records the caller's pending state and, when `visible`, the view shows
    /// it pending (GetSession, ListPendingInteractions) before any subscriber gets the event;
    /// then the event is published. `None` (logged as `what`) when it could not be stored:
    /// `keep` is dropped unrun, so the CLI's responder it holds answers with an error.
    pub(super) async fn record_pending(
        &mut self,
        item: Item,
        interaction: NewInteraction,
        visible: bool,
        what: &str,
        keep: impl FnOnce(&mut Self),
    ) -> Option<Arc<EngineEvent>> {
        let request_id = interaction.request_id.clone();
        let with = WithEvents {
            interaction: Some((interaction, 0)),
            ..Default::default()
        };
        let entry = self.entry.clone();
        let guard = entry.hub.lock().await;
        let event = match guard.persist_with(vec![item], Some(with)).await {
            Ok((mut v, _)) => v.pop()?,
            Err(e) => {
                tracing::error!(session = %self.sid(), error = %e, "cannot record {what}");
                return None;
            }
        };
        keep(self);
        if visible {
            let to = self.live_state();
            self.show(|v| {
                v.pending.insert(request_id, event.clone());
                v.state = to;
            });
        }
        guard.publish(std::slice::from_ref(&event));
        Some(event)
    }

    /// Commits `decision` on `request_id` with its resolution event `item`, in one
    /// transaction (first wins: the store is the authority). Either way `remove` takes the
    /// caller's pending state off; when this decision won, the view shows the live state
    /// that follows before the event is published.
    pub(super) async fn commit_decision<P>(
        &mut self,
        request_id: &str,
        decision: Decision,
        item: Item,
        remove: impl FnOnce(&mut Self) -> Option<P>,
    ) -> Result<Committed<P>> {
        let with = WithEvents {
            decide: Some((request_id.to_owned(), decision)),
            ..Default::default()
        };
        let entry = self.entry.clone();
        let guard = entry.hub.lock().await;
        let (events, outcome) = guard.persist_with(vec![item], Some(with)).await?;
        if let Some(DecideOutcome::AlreadyDecided(i)) = outcome {
            drop(guard);
            remove(self);
            return Ok(Committed::Lost(i));
        }
        let p = remove(self);
        self.show_live_state();
        guard.publish(&events);
        Ok(Committed::Won(events, p))
    }

    /// Records the decision (first wins, in the store), publishes it, answers the CLI.
    pub(super) async fn decide(
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
        let item = Item::new(EventPayload::InteractionResolved(resolved.clone()));
        let (events, p) = match self
            .commit_decision(request_id, decision, item, |a| a.remove_pending(request_id))
            .await?
        {
            Committed::Won(events, p) => (events, p),
            // Someone decided durably first (cannot happen within one actor, which
            // serialises decisions, but the store is the authority).
            Committed::Lost(i) => return Err(crate::settled::decided_error(&i)),
        };
        let answered_tool_use = p
            .as_ref()
            .filter(|p| p.kind == InteractionKind::Permission)
            .and_then(|p| p.request.tool_use_id.clone());
        if let Some(p) = p
            && let Err(e) = p.responder.respond(body)
        {
            tracing::warn!(session = %self.sid(), request_id, error = %e, "the CLI no longer waits for this decision");
        }
        if let Some(tool_use_id) = answered_tool_use {
            self.prompt_answered_first(&tool_use_id).await;
            self.prompts_answered.insert(tool_use_id);
        }
        Ok(Decided {
            seq: events.first().and_then(|e| e.seq).unwrap_or_default(),
            resolved,
        })
    }

    /// Answers a control request that waits in `map` (an elicitation, a dialog, a client
    /// tool call): the decision (`state`, `decided_by`, `stored` as the recorded response)
    /// and `item`, its resolution event, commit in one transaction (the first answer wins),
    /// then the CLI gets `wire`. Returns the resolution event's seq.
    pub(super) async fn answer_waiting<P: Waiting>(
        &mut self,
        request_id: &str,
        (state, decided_by): (InteractionState, String),
        stored: Bytes,
        item: Item,
        wire: Value,
        map: fn(&mut Self) -> &mut std::collections::HashMap<String, P>,
    ) -> Result<u64> {
        if !map(self).contains_key(request_id) {
            return Err(self.not_pending(request_id).await);
        }
        let decision = Decision {
            state,
            decided_by,
            response: Some(stored),
            decided_ms: now_ms(),
        };
        let (events, p) = match self
            .commit_decision(request_id, decision, item, |a| {
                a.take_pending(request_id, map)
            })
            .await?
        {
            Committed::Won(events, p) => (events, p),
            Committed::Lost(_) => return Err(self.not_pending(request_id).await),
        };
        if let Some(p) = p
            && let Err(e) = p.into_responder().respond(ResponseBody::Success(wire))
        {
            tracing::warn!(session = %self.sid(), request_id, error = %e, "the CLI no longer waits for this answer");
        }
        Ok(events.first().and_then(|e| e.seq).unwrap_or_default())
    }

    /// Takes `request_id` off the caller's pending state (`map`: permission prompts, hook
    /// calls, tool calls, elicitations or dialogs) and off the view; the grace the CLI has
    /// to take the next message owed counts from now.
    pub(super) fn take_pending<P>(
        &mut self,
        request_id: &str,
        map: impl FnOnce(&mut Self) -> &mut std::collections::HashMap<String, P>,
    ) -> Option<P> {
        self.grace_again();
        let p = map(self).remove(request_id);
        self.show(|v| {
            v.pending.remove(request_id);
        });
        p
    }

    pub(super) fn remove_pending(&mut self, request_id: &str) -> Option<Pending> {
        self.take_pending(request_id, |a| &mut a.pending)
    }

    /// The error for an answer of `what` (`a tool call`, ...) to `request_id`: it is
    /// another kind of pending interaction, or [`Actor::not_pending`].
    pub(super) async fn not_pending_as(&self, request_id: &str, what: &str) -> Error {
        match self.pending_kind(request_id) {
            Some(kind) => {
                Error::precondition(format!("{request_id:?} is a pending {kind}, not {what}"))
            }
            None => self.not_pending(request_id).await,
        }
    }

    pub(super) async fn not_pending(&self, request_id: &str) -> Error {
        let store = self.shared.store.clone();
        let (sid, rid) = (self.sid().to_owned(), request_id.to_owned());
        match blocking(move || store.interaction(&sid, &rid)).await {
            Ok(i) if i.state.is_final() => crate::settled::decided_error(&i),
            Ok(_) => Error::precondition(format!(
                "request {request_id:?} of session {:?} is no longer awaited by the CLI",
                self.sid()
            )),
            Err(_) => Error::not_found(format!(
                "request {request_id:?} in session {:?}",
                self.sid()
            )),
        }
    }

    /// Closes a pending interaction without an answer from a client (expiry, cancel, exit).
    pub(super) async fn close_pending(
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

    pub(super) async fn cancelled_by_cli(&mut self, request_id: &str) {
        self.close_pending(
            request_id,
            "cli",
            "withdrawn by the CLI",
            InteractionState::Cancelled,
        )
        .await;
        self.settle_state(None).await;
    }

    pub(super) async fn expire_due(&mut self) {
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

    pub(super) async fn respond(
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
                updated_permissions,
            } => {
                if p.kind == InteractionKind::Question {
                    // The wrong call fails again whenever it is made: not a precondition.
                    return Err(Error::invalid(
                        "request_id",
                        format!(
                            "{request_id:?} is a question: answer it with AnswerQuestion (or \
                             deny it with RespondToPermission)"
                        ),
                    ));
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
                            updated_permissions: updated_permissions.clone(),
                        },
                        ResponseBody::Allow {
                            updated_input: input,
                            updated_permissions,
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

    pub(super) async fn answer(
        &mut self,
        request_id: &str,
        answers: Vec<QuestionAnswer>,
        client: &ClientRef,
    ) -> Result<Decided> {
        let Some(p) = self.pending.get(request_id) else {
            return Err(self.not_pending(request_id).await);
        };
        if p.kind != InteractionKind::Question {
            return Err(Error::invalid(
                "request_id",
                format!(
                    "{request_id:?} is a permission request, not a question: use \
                     RespondToPermission"
                ),
            ));
        }
        let questions = p.request.questions().unwrap_or_default();
        let pairs = permission::validate_answers(
            &questions,
            &answers,
            self.shared.opts.allow_free_text_answers,
        )?;
        // Questions left unanswered are absent from `answers`; a CLI that announces it
        // also gets them marked skipped.
        let skipped: Vec<String> = if self
            .shared
            .installation
            .capabilities
            .announces(proto::outbound::ASK_USER_QUESTION_UNANSWERED)
        {
            questions
                .iter()
                .filter(|q| !pairs.iter().any(|(t, _)| *t == q.question))
                .map(|q| q.question.clone())
                .collect()
        } else {
            Vec::new()
        };
        let updated_input =
            proto::outbound::answer_questions_skipping(&p.request, &pairs, &skipped);
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
}

/// What [`Actor::commit_decision`] came to.
pub(super) enum Committed<P> {
    /// Stored with its resolution event (published); the caller's pending state, taken off.
    Won(Vec<Arc<EngineEvent>>, Option<P>),
    /// Decided durably before (nothing written): the interaction as stored.
    Lost(ostler_store::Interaction),
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
