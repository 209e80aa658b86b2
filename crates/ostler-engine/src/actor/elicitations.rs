//! Elicitations: an MCP server of the session asks the user for input (MCP
//! `elicitation/create`) while its tool call waits, and the CLI passes the question on as
//! its `elicitation` control request (of the pinned releases, 2.1.120 and later offer
//! elicitation to MCP servers; older ones answer the server "method not found"
//! themselves). Each one becomes a pending `elicitation` interaction, recorded with its
//! `elicitation_requested` event in one transaction, and is resolved (first answer wins)
//! by a client, by expiry (`cancel`, after the permission expiry), or by cancellation (the
//! CLI withdrew it on an interrupt, the turn or process ended), the decision committed
//! with its `elicitation_resolved` event before the CLI gets the answer (`{"action": ...,
//! "content": ...}`).

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

/// An elicitation waiting for a client.
pub(super) struct PendingElicitation {
    responder: Responder,
    pub(super) deadline: Option<Instant>,
}

impl Waiting for PendingElicitation {
    fn into_responder(self) -> Responder {
        self.responder
    }
}

/// The event of the CLI's `elicitation` request `raw` (its `request` object).
pub(crate) fn requested(
    request_id: &str,
    raw: &Value,
    expires_at_ms: Option<i64>,
) -> ElicitationRequested {
    let text = |k: &str| raw.get(k).and_then(Value::as_str).map(str::to_owned);
    ElicitationRequested {
        request_id: request_id.to_owned(),
        mcp_server_name: text("mcp_server_name").unwrap_or_default(),
        message: text("message").unwrap_or_default(),
        mode: text("mode").unwrap_or_else(|| "form".to_owned()),
        url: text("url"),
        elicitation_id: text("elicitation_id"),
        requested_schema: raw
            .get("requested_schema")
            .filter(|v| !v.is_null())
            .cloned(),
        title: text("title"),
        display_name: text("display_name"),
        description: text("description"),
        expires_at_ms,
        request: raw.clone(),
    }
}

/// What the CLI gets: MCP's `ElicitResult`.
pub(crate) fn answer(action: ElicitationAction, content: Option<&Value>) -> Value {
    match content {
        Some(c) => json!({ "action": action.as_str(), "content": c }),
        None => json!({ "action": action.as_str() }),
    }
}

impl Actor {
    /// Serves one `elicitation` control request (`raw`: the request object).
    pub(super) async fn elicitation(
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
            kind: InteractionKind::Elicitation,
            tool_name: Some(payload.mcp_server_name.clone()),
            input: Bytes::from(serde_json::to_vec(&req).unwrap_or_default()),
            suggestions: None,
            event_seq: None,
            created_ms: now_ms(),
        };
        // The request event and the pending interaction commit together.
        let item = Item {
            payload: EventPayload::ElicitationRequested(payload),
            raw: line,
            ts_ms: now_ms(),
        };
        let pending = PendingElicitation {
            responder,
            deadline: expires.map(|d| Instant::now() + d),
        };
        // Not recorded: nobody could answer durably; the dropped responder answers the CLI
        // with an error, which it tells the server as `cancel`. Declined by the session's
        // policy: recorded, never shown pending, answered at once.
        let decline = self.decline_elicitations;
        let recorded = self
            .record_pending(item, ni, !decline, "elicitation", |a| {
                a.elicitations.insert(request_id.clone(), pending);
            })
            .await;
        if decline && recorded.is_some() {
            self.close_elicitation(
                &request_id,
                ToolCallOutcome::Answered,
                ElicitationAction::Decline,
                "policy",
            )
            .await;
        }
        self.settle_state(None).await;
    }

    /// Records the resolution (first wins, in the store), publishes it, answers the CLI.
    async fn resolve_elicitation(
        &mut self,
        request_id: &str,
        resolved: ElicitationResolved,
    ) -> Result<ElicitationDecided> {
        let body = answer(resolved.action, resolved.content.as_ref());
        let seq = self
            .answer_waiting(
                request_id,
                (resolved.outcome.state(), resolved.resolved_by.clone()),
                Bytes::from(body.to_string()),
                Item::new(EventPayload::ElicitationResolved(resolved.clone())),
                body,
                |a| &mut a.elicitations,
            )
            .await?;
        Ok(ElicitationDecided { seq, resolved })
    }

    /// `RespondToElicitation` (the server checked the answer's shape).
    pub(super) async fn respond_elicitation(
        &mut self,
        request_id: &str,
        action: ElicitationAction,
        content: Option<Value>,
        client: &ClientRef,
    ) -> Result<ElicitationDecided> {
        if !self.elicitations.contains_key(request_id) {
            return Err(self.not_pending_as(request_id, "an elicitation").await);
        }
        let r = self
            .resolve_elicitation(
                request_id,
                ElicitationResolved {
                    request_id: request_id.to_owned(),
                    outcome: ToolCallOutcome::Answered,
                    action,
                    content,
                    resolved_by: client.label(),
                },
            )
            .await;
        self.settle_state(None).await;
        r
    }

    /// The earliest deadline of a pending elicitation.
    pub(super) fn elicitation_deadline(&self) -> Option<Instant> {
        self.elicitations.values().filter_map(|p| p.deadline).min()
    }

    /// Elicitations past their deadline are answered `cancel`.
    pub(super) async fn expire_elicitations(&mut self) {
        let now = Instant::now();
        let due: Vec<String> = self
            .elicitations
            .iter()
            .filter(|(_, p)| p.deadline.is_some_and(|d| d <= now))
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            self.close_elicitation(
                &id,
                ToolCallOutcome::Expired,
                ElicitationAction::Cancel,
                "expiry",
            )
            .await;
        }
        self.settle_state(None).await;
    }

    /// Closes pending elicitations with `cancel` (the turn or process ended, or the CLI
    /// withdrew one: `only`): `by` is `engine` or `cli`.
    pub(super) async fn cancel_elicitations(&mut self, only: Option<&str>, by: &str) {
        let ids: Vec<String> = match only {
            Some(id) if self.elicitations.contains_key(id) => vec![id.to_owned()],
            Some(_) => Vec::new(),
            None => self.elicitations.keys().cloned().collect(),
        };
        for id in ids {
            self.close_elicitation(
                &id,
                ToolCallOutcome::Cancelled,
                ElicitationAction::Cancel,
                by,
            )
            .await;
        }
    }

    /// Answers an elicitation without content, not from a client.
    async fn close_elicitation(
        &mut self,
        id: &str,
        outcome: ToolCallOutcome,
        action: ElicitationAction,
        by: &str,
    ) {
        let r = self
            .resolve_elicitation(
                id,
                ElicitationResolved {
                    request_id: id.to_owned(),
                    outcome,
                    action,
                    content: None,
                    resolved_by: by.to_owned(),
                },
            )
            .await;
        if let Err(e) = r {
            tracing::warn!(session = %self.sid(), request_id = %id, error = %e, "cannot close elicitation");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_read_whole_and_answered_as_mcp_elicit_result() {
        let raw = json!({
            "subtype": "elicitation", "mcp_server_name": "tickets", "message": "Why?",
            "requested_schema": {"type": "object"}, "property_order": ["reason"],
        });
        let e = requested("r1", &raw, Some(5));
        assert_eq!(e.mcp_server_name, "tickets");
        assert_eq!(e.message, "Why?");
        assert_eq!(e.mode, "form", "a request naming no mode is a form");
        assert_eq!(e.requested_schema, Some(json!({"type": "object"})));
        assert_eq!(e.url, None);
        assert_eq!(e.request["property_order"], json!(["reason"]), "kept whole");
        let url = requested(
            "r2",
            &json!({"mode": "url", "url": "https://x", "requested_schema": null}),
            None,
        );
        assert_eq!(
            (url.mode.as_str(), url.url.as_deref()),
            ("url", Some("https://x"))
        );
        assert_eq!(url.requested_schema, None);
        assert_eq!(
            answer(ElicitationAction::Accept, Some(&json!({"reason": "x"}))),
            json!({"action": "accept", "content": {"reason": "x"}})
        );
        assert_eq!(
            answer(ElicitationAction::Decline, None),
            json!({"action": "decline"})
        );
    }
}
