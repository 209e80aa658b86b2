//! Dialogs: the CLI asks the host to show a dialog (its `request_user_dialog` control
//! request, the Agent SDKs' `onUserDialog`) of a kind the session declared in
//! `dialog_kinds` (initialize's `supportedDialogKinds`; 2.1.330 and later). E.g.
//! `refusal_fallback_prompt`: the model refused, retry on the fallback model? Each one
//! becomes a pending `dialog` interaction, recorded with its `dialog_requested` event in
//! one transaction, and is resolved (first answer wins) by a client, by expiry
//! (`cancelled`, after the permission expiry), or by cancellation (the CLI withdrew it with
//! `control_cancel_request` when its own deadline passed or on an interrupt, the turn or
//! process ended), the decision committed with its `dialog_resolved` event before the CLI
//! gets the answer (`{"behavior": "completed" | "cancelled", "result"?: ...}`).

use bytes::Bytes;
use ostler_protocol::model::RawJson;
use ostler_store::NewInteraction;
use ostler_supervisor::Responder;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::Actor;
use super::interactions::Waiting;
use crate::error::Result;
use crate::hub::{Item, now_ms};
use crate::types::*;

/// A dialog waiting for a client.
pub(super) struct PendingDialog {
    responder: Responder,
    pub(super) deadline: Option<Instant>,
}

impl Waiting for PendingDialog {
    fn into_responder(self) -> Responder {
        self.responder
    }
}

/// The event of the CLI's `request_user_dialog` request `raw` (its `request` object).
pub(crate) fn requested(
    request_id: &str,
    raw: &Value,
    expires_at_ms: Option<i64>,
) -> DialogRequested {
    DialogRequested {
        request_id: request_id.to_owned(),
        dialog_kind: raw
            .get("dialog_kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        payload: raw
            .get("payload")
            .filter(|v| !v.is_null())
            .cloned()
            .unwrap_or_else(|| json!({})),
        tool_use_id: raw
            .get("tool_use_id")
            .and_then(Value::as_str)
            .map(str::to_owned),
        expires_at_ms,
        request: raw.clone(),
    }
}

/// What the CLI gets (the Agent SDKs pass `onUserDialog`'s answer through as is).
pub(crate) fn answer(behavior: DialogBehavior, result: Option<&Value>) -> Value {
    match result {
        Some(r) => json!({ "behavior": behavior.as_str(), "result": r }),
        None => json!({ "behavior": behavior.as_str() }),
    }
}

impl Actor {
    /// Serves one `request_user_dialog` control request (`raw`: the request object).
    pub(super) async fn dialog(
        &mut self,
        request_id: String,
        raw: &RawJson,
        responder: Responder,
        line: Option<Bytes>,
    ) {
        let req = raw.to_value().unwrap_or(Value::Null);
        let expires = self.shared.opts.permission_expiry;
        let payload = requested(
            &request_id,
            &req,
            expires.map(|d| now_ms() + d.as_millis() as i64),
        );
        let ni = NewInteraction {
            session_id: self.sid().to_owned(),
            request_id: request_id.clone(),
            kind: InteractionKind::Dialog,
            tool_name: Some(payload.dialog_kind.clone()),
            input: Bytes::from(serde_json::to_vec(&req).unwrap_or_default()),
            suggestions: None,
            event_seq: None,
            created_ms: now_ms(),
        };
        // The request event and the pending interaction commit together.
        let item = Item {
            payload: EventPayload::DialogRequested(payload),
            raw: line,
            ts_ms: now_ms(),
        };
        let pending = PendingDialog {
            responder,
            deadline: expires.map(|d| Instant::now() + d),
        };
        // Not recorded: nobody could answer durably; the dropped responder answers the CLI
        // with an error, which it takes as the dialog's default.
        self.record_pending(item, ni, true, "dialog", |a| {
            a.dialogs.insert(request_id.clone(), pending);
        })
        .await;
        self.settle_state(None).await;
    }

    /// Records the resolution (first wins, in the store), publishes it, answers the CLI.
    async fn resolve_dialog(
        &mut self,
        request_id: &str,
        resolved: DialogResolved,
    ) -> Result<DialogDecided> {
        let body = answer(resolved.behavior, resolved.result.as_ref());
        let seq = self
            .answer_waiting(
                request_id,
                (resolved.outcome.state(), resolved.resolved_by.clone()),
                Bytes::from(body.to_string()),
                Item::new(EventPayload::DialogResolved(resolved.clone())),
                body,
                |a| &mut a.dialogs,
            )
            .await?;
        Ok(DialogDecided { seq, resolved })
    }

    /// `RespondToDialog` (the server checked the answer's shape).
    pub(super) async fn respond_dialog(
        &mut self,
        request_id: &str,
        behavior: DialogBehavior,
        result: Option<Value>,
        client: &ClientRef,
    ) -> Result<DialogDecided> {
        if !self.dialogs.contains_key(request_id) {
            return Err(self.not_pending_as(request_id, "a dialog").await);
        }
        let r = self
            .resolve_dialog(
                request_id,
                DialogResolved {
                    request_id: request_id.to_owned(),
                    outcome: ToolCallOutcome::Answered,
                    behavior,
                    result,
                    resolved_by: client.label(),
                },
            )
            .await;
        self.settle_state(None).await;
        r
    }

    /// The earliest deadline of a pending dialog.
    pub(super) fn dialog_deadline(&self) -> Option<Instant> {
        self.dialogs.values().filter_map(|p| p.deadline).min()
    }

    /// Dialogs past their deadline are answered `cancelled`.
    pub(super) async fn expire_dialogs(&mut self) {
        let now = Instant::now();
        let due: Vec<String> = self
            .dialogs
            .iter()
            .filter(|(_, p)| p.deadline.is_some_and(|d| d <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            self.close_dialog(&id, ToolCallOutcome::Expired, "expiry")
                .await;
        }
        self.settle_state(None).await;
    }

    /// Closes pending dialogs with `cancelled` (the turn or process ended, or the CLI
    /// withdrew one: `only`): `by` is `engine` or `cli`.
    pub(super) async fn cancel_dialogs(&mut self, only: Option<&str>, by: &str) {
        let ids: Vec<String> = match only {
            Some(id) if self.dialogs.contains_key(id) => vec![id.to_owned()],
            Some(_) => Vec::new(),
            None => self.dialogs.keys().cloned().collect(),
        };
        for id in ids {
            self.close_dialog(&id, ToolCallOutcome::Cancelled, by).await;
        }
    }

    /// Answers a dialog `cancelled`, not from a client.
    async fn close_dialog(&mut self, id: &str, outcome: ToolCallOutcome, by: &str) {
        let r = self
            .resolve_dialog(
                id,
                DialogResolved {
                    request_id: id.to_owned(),
                    outcome,
                    behavior: DialogBehavior::Cancelled,
                    result: None,
                    resolved_by: by.to_owned(),
                },
            )
            .await;
        if let Err(e) = r {
            tracing::warn!(session = %self.sid(), request_id = %id, error = %e, "cannot close dialog");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_read_whole_and_answered_as_the_sdks_do() {
        let raw = json!({
            "subtype": "request_user_dialog", "dialog_kind": "refusal_fallback_prompt",
            "payload": {"originalModel": "claude-fable-5", "fallbackModel": "claude-opus-4-8"},
            "tool_use_id": "toolu_1", "future": 1,
        });
        let d = requested("r1", &raw, Some(5));
        assert_eq!(d.dialog_kind, "refusal_fallback_prompt");
        assert_eq!(d.payload["fallbackModel"], json!("claude-opus-4-8"));
        assert_eq!(d.tool_use_id.as_deref(), Some("toolu_1"));
        assert_eq!(d.request["future"], json!(1), "kept whole");
        let bare = requested("r2", &json!({"dialog_kind": "enum_prompt"}), None);
        assert_eq!(bare.payload, json!({}));
        assert_eq!(bare.tool_use_id, None);
        assert_eq!(
            answer(DialogBehavior::Completed, Some(&json!("retry_fallback"))),
            json!({"behavior": "completed", "result": "retry_fallback"})
        );
        assert_eq!(
            answer(DialogBehavior::Cancelled, None),
            json!({"behavior": "cancelled"})
        );
    }
}
