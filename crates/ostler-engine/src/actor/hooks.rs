//! Remote hooks (issue 11): a `hook_callback` from the CLI for one of the session's
//! registrations becomes a stored `hook_requested` event and a pending interaction of kind
//! `hook` (one transaction), shown to clients like a permission request; the first
//! `RespondToHook` wins, else the registration's default is taken at its expiry. The
//! answer is recorded with its `hook_resolved` event (one transaction), then sent to the
//! CLI in the shape its hook event takes (`ostler_protocol::hooks::output_json`).

use bytes::Bytes;
use ostler_protocol::HookCallback;
use ostler_protocol::hooks::{
    self as h, HookAnswer, HookRegistration, HookRequested, HookResolution, HookResolved,
};
use ostler_protocol::outbound::{OutRequest, ResponseBody};
use ostler_store::{Decision, InteractionState, NewInteraction};
use ostler_supervisor::Responder;
use serde_json::Value;
use std::time::Duration;
use tokio::time::Instant;

use super::Actor;
use super::interactions::Committed;
use crate::error::{Error, Result};
use crate::hub::{Item, now_ms};
use crate::types::*;

/// A hook call waiting for a client.
pub(super) struct PendingHook {
    /// The hook event (`PreToolUse`, ...): what the answer is checked against.
    event: String,
    /// The tool use the call is about (tool events).
    tool_use_id: Option<String>,
    registration: HookRegistration,
    responder: Responder,
    pub(super) deadline: Instant,
}

/// What the interaction row keeps for a daemon restart (`suggestions` column): the hook
/// event and the registration's default answer.
pub(crate) fn restart_default(row: &ostler_store::Interaction) -> (String, HookAnswer) {
    let v: Value = row
        .suggestions
        .as_ref()
        .and_then(|b| serde_json::from_slice(b).ok())
        .unwrap_or(Value::Null);
    let event = v
        .get("event")
        .and_then(Value::as_str)
        .or(row.tool_name.as_deref())
        .unwrap_or_default()
        .to_owned();
    let answer = v
        .get("default")
        .and_then(|d| serde_json::from_value(d.clone()).ok())
        .unwrap_or_default();
    (event, answer)
}

/// The `hook_resolved` event and the decision that commit together when a hook pending at
/// a daemon restart takes its default (`default:restart`).
pub(crate) fn restart_resolution(row: &ostler_store::Interaction) -> (Item, (String, Decision)) {
    let (event, answer) = restart_default(row);
    let output = h::output_json(&event, &answer);
    let by = "default:restart".to_owned();
    let item = Item::new(EventPayload::HookResolved(HookResolved {
        request_id: row.request_id.clone(),
        resolution: HookResolution::Expired,
        answer,
        resolved_by: by.clone(),
        output: Some(output.clone()),
    }));
    let decision = Decision {
        state: InteractionState::Expired,
        decided_by: by,
        response: Some(Bytes::from(output.to_string())),
        decided_ms: now_ms(),
    };
    (item, (row.request_id.clone(), decision))
}

impl Actor {
    /// How much longer than the control timeout the CLI may take to answer `request`: it
    /// answers a model switch (`set_model`, `apply_flag_settings` with a model:
    /// [`OutRequest::model_switch`]) only after the session's PreModelSwitch hooks
    /// returned (measured on 2.1.332), and each waits for a client up to its registration's
    /// wait before ostler answers with the default. Without this a SetModel waiting on a
    /// person failed after the control timeout while the switch still happened at their
    /// answer.
    pub(super) fn hook_wait_within(&self, request: &OutRequest) -> Duration {
        if request.model_switch().is_none() {
            return Duration::ZERO;
        }
        let event = "PreModelSwitch";
        let secs: u64 = self
            .meta
            .hooks
            .iter()
            .filter(|r| r.event == event)
            .map(|r| u64::from(r.wait_secs()))
            .sum();
        Duration::from_secs(secs)
    }

    /// A `hook_callback`: recorded and shown to clients when it names one of the session's
    /// registrations; otherwise recorded as a control request and answered with an error.
    pub(super) async fn hook_callback(
        &mut self,
        request_id: String,
        cb: HookCallback,
        responder: Responder,
        raw: Option<Bytes>,
    ) {
        let Some(reg) = self
            .meta
            .hooks
            .iter()
            .find(|r| r.id == cb.callback_id)
            .cloned()
        else {
            let id = cb.callback_id.clone();
            let item = Item {
                payload: EventPayload::CliControlRequest(ostler_protocol::ControlRequest {
                    request_id,
                    request: ostler_protocol::CliRequest::HookCallback(cb),
                }),
                raw,
                ts_ms: now_ms(),
            };
            if let Err(e) = self.entry.hub.emit(vec![item]).await {
                tracing::error!(session = %self.sid(), error = %e, "cannot record control request");
            }
            let _ = responder.respond(ResponseBody::Error {
                message: format!("ostler: no hook registration {id:?} in this session"),
            });
            return;
        };
        let input = cb
            .input
            .as_ref()
            .and_then(|i| i.to_value().ok())
            .unwrap_or(Value::Null);
        let call = h::read_call(Some(&input), cb.tool_use_id.as_deref(), &reg.event);
        let wait = Duration::from_secs(u64::from(reg.wait_secs()));
        let expires_at_ms = now_ms() + wait.as_millis() as i64;
        let call_tool_use_id = call.tool_use_id.clone();
        let payload = EventPayload::HookRequested(HookRequested {
            request_id: request_id.clone(),
            hook_event: call.hook_event.clone(),
            registration_id: reg.id.clone(),
            input: input.clone(),
            tool_use_id: call.tool_use_id,
            tool_name: call.tool_name,
            expires_at_ms,
            agent_id: call.agent_id,
        });
        let keep = serde_json::json!({"event": call.hook_event, "default": reg.default});
        // The request event and the pending interaction commit together.
        let ni = NewInteraction {
            session_id: self.sid().to_owned(),
            request_id: request_id.clone(),
            kind: ostler_store::InteractionKind::Hook,
            tool_name: Some(call.hook_event.clone()),
            input: Bytes::from(serde_json::to_vec(&input).unwrap_or_default()),
            suggestions: Some(Bytes::from(keep.to_string())),
            event_seq: None,
            created_ms: now_ms(),
        };
        let item = Item {
            payload,
            raw,
            ts_ms: now_ms(),
        };
        let hook = PendingHook {
            event: call.hook_event,
            tool_use_id: call_tool_use_id,
            registration: reg,
            responder,
            deadline: Instant::now() + wait,
        };
        // Not recorded: nobody could answer durably; the dropped responder answers the CLI
        // with an error (the CLI goes on as if the hook had failed).
        let late = (hook.event == "PermissionRequest")
            .then(|| hook.tool_use_id.clone())
            .flatten()
            .filter(|t| self.prompts_answered.contains(t));
        self.record_pending(item, ni, true, "hook call", |a| {
            a.hooks.insert(request_id, hook);
        })
        .await;
        if let Some(tool_use_id) = late {
            self.prompt_answered_first(&tool_use_id).await;
        }
        self.settle_state(None).await;
    }

    /// `RespondToHook`: the answer is checked against the hook event, then recorded (first
    /// wins) and sent.
    pub(super) async fn respond_hook(
        &mut self,
        request_id: &str,
        answer: HookAnswer,
        client: &ClientRef,
    ) -> Result<HookDecided> {
        let Some(p) = self.hooks.get(request_id) else {
            return Err(self.not_pending_as(request_id, "a hook call").await);
        };
        h::validate_answer("", &p.event, &answer)
            .map_err(|e| Error::invalid(e.field, e.message))?;
        self.resolve_hook(
            request_id,
            HookResolution::Answered,
            Some(answer),
            &client.label(),
        )
        .await
    }

    /// Records how a pending hook call ended (`answer` = what is sent; `None` when it is
    /// cancelled), publishes it and answers the CLI.
    async fn resolve_hook(
        &mut self,
        request_id: &str,
        resolution: HookResolution,
        answer: Option<HookAnswer>,
        by: &str,
    ) -> Result<HookDecided> {
        let Some(p) = self.hooks.get(request_id) else {
            return Err(self.not_pending(request_id).await);
        };
        let output = answer.as_ref().map(|a| h::output_json(&p.event, a));
        let state = match resolution {
            HookResolution::Answered => InteractionState::Answered,
            HookResolution::Expired => InteractionState::Expired,
            HookResolution::Cancelled => InteractionState::Cancelled,
        };
        let resolved = HookResolved {
            request_id: request_id.to_owned(),
            resolution,
            answer: answer.unwrap_or_default(),
            resolved_by: by.to_owned(),
            output: output.clone(),
        };
        let decision = Decision {
            state,
            decided_by: by.to_owned(),
            response: output.as_ref().map(|o| Bytes::from(o.to_string())),
            decided_ms: now_ms(),
        };
        // The decision and its resolution event commit in one transaction.
        let item = Item::new(EventPayload::HookResolved(resolved.clone()));
        let (events, p) = match self
            .commit_decision(request_id, decision, item, |a| {
                a.take_pending(request_id, |a| &mut a.hooks)
            })
            .await?
        {
            Committed::Won(events, p) => (events, p),
            Committed::Lost(i) => return Err(crate::settled::decided_error(&i)),
        };
        if let (Some(p), Some(output)) = (p, output)
            && let Err(e) = p.responder.respond(ResponseBody::Success(output))
        {
            tracing::warn!(session = %self.sid(), request_id, error = %e, "the CLI no longer waits for this hook");
        }
        Ok(HookDecided {
            seq: events.first().and_then(|e| e.seq).unwrap_or_default(),
            resolved,
        })
    }

    /// Hook calls past their registration's timeout take its default (`default:expiry`).
    pub(super) async fn expire_hooks_due(&mut self) {
        let now = Instant::now();
        let due: Vec<(String, HookAnswer)> = self
            .hooks
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(id, p)| (id.clone(), p.registration.default.clone()))
            .collect();
        for (id, answer) in due {
            if let Err(e) = self
                .resolve_hook(&id, HookResolution::Expired, Some(answer), "default:expiry")
                .await
            {
                tracing::warn!(session = %self.sid(), request_id = %id, error = %e, "cannot take a hook's default");
            }
        }
        self.settle_state(None).await;
    }

    /// The earliest hook deadline.
    pub(super) fn hook_deadline(&self) -> Option<Instant> {
        self.hooks.values().map(|p| p.deadline).min()
    }

    /// A `control_cancel_request` for a hook call: cancelled (`cli`). False when
    /// `request_id` is not a pending hook call.
    pub(super) async fn hook_withdrawn(&mut self, request_id: &str) -> bool {
        if !self.hooks.contains_key(request_id) {
            return false;
        }
        self.cancel_hook(request_id, "cli").await;
        self.settle_state(None).await;
        true
    }

    /// The CLI asks a PermissionRequest hook and ostler's permission prompt for the same
    /// tool use at once and goes on with the first answer. When the prompt's answer comes
    /// first the CLI leaves the hook call open (measured on 2.1.332: no
    /// `control_cancel_request`, a later answer is ignored), so it is closed here:
    /// CANCELLED by `engine`, the CLI sent a CONTINUE it no longer reads.
    pub(super) async fn prompt_answered_first(&mut self, tool_use_id: &str) {
        let open: Vec<String> = self
            .hooks
            .iter()
            .filter(|(_, p)| {
                p.event == "PermissionRequest" && p.tool_use_id.as_deref() == Some(tool_use_id)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in open {
            let answer = HookAnswer {
                reason: Some("the permission prompt for this tool use was answered first".into()),
                ..Default::default()
            };
            if let Err(e) = self
                .resolve_hook(&id, HookResolution::Cancelled, Some(answer), "engine")
                .await
            {
                tracing::warn!(session = %self.sid(), request_id = %id, error = %e, "cannot close a hook call");
            }
        }
    }

    /// Cancels every pending hook call (the process ended): nothing is sent.
    pub(super) async fn cancel_hooks(&mut self, by: &str) {
        let ids: Vec<String> = self.hooks.keys().cloned().collect();
        for id in ids {
            self.cancel_hook(&id, by).await;
        }
    }

    async fn cancel_hook(&mut self, request_id: &str, by: &str) {
        if let Err(e) = self
            .resolve_hook(request_id, HookResolution::Cancelled, None, by)
            .await
        {
            tracing::warn!(session = %self.sid(), request_id, error = %e, "cannot cancel a hook call");
        }
    }
}
