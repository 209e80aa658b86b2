//! Client-hosted tools (issue 11): the actor answers the CLI's `mcp_message` control
//! requests for the session's tool servers (`ostler_protocol::sdk_mcp`); each `tools/call`
//! of a declared tool becomes a pending `tool_call` interaction, recorded with its
//! `tool_call_requested` event in one transaction, and is resolved (first answer wins) by
//! a client, by expiry (an error result), or by cancellation, the decision committed with
//! its `tool_call_resolved` event before the CLI gets the `mcp_response`.

use bytes::Bytes;
use ostler_protocol::model::RawJson;
use ostler_protocol::outbound::ResponseBody;
use ostler_protocol::sdk_mcp::{self, Content, Handled};
use ostler_store::NewInteraction;
use ostler_supervisor::Responder;
use serde_json::Value;
use tokio::time::Instant;

use super::Actor;
use super::interactions::Waiting;
use crate::error::Result;
use crate::hub::{Item, now_ms};
use crate::types::*;

/// A tool call waiting for a client.
pub(super) struct PendingToolCall {
    /// The tool server and the JSON-RPC id the CLI called it with.
    server: String,
    rpc_id: Value,
    responder: Responder,
    pub(super) deadline: Instant,
    timeout_secs: u32,
}

impl Waiting for PendingToolCall {
    fn into_responder(self) -> Responder {
        self.responder
    }
}

impl Actor {
    /// Serves one `mcp_message` control request (`raw`: the request object).
    pub(super) async fn mcp_message(
        &mut self,
        request_id: String,
        raw: &RawJson,
        responder: Responder,
        line: Option<Bytes>,
    ) {
        let req = raw.to_value().unwrap_or(Value::Null);
        let server = req.get("server_name").and_then(Value::as_str).unwrap_or("");
        let message = req.get("message").cloned().unwrap_or(Value::Null);
        let call = match sdk_mcp::handle(&self.tool_servers, server, &message) {
            Handled::Respond(v) => {
                let _ = responder.respond(ResponseBody::Success(sdk_mcp::control_body(v)));
                return;
            }
            Handled::Cancelled {
                answer,
                server,
                rpc_id,
                reason,
            } => {
                let _ = responder.respond(ResponseBody::Success(sdk_mcp::control_body(answer)));
                self.tool_call_withdrawn(&server, &rpc_id, &reason).await;
                return;
            }
            Handled::Call(c) => c,
        };
        let timeout_secs = self
            .tool_servers
            .iter()
            .find(|s| s.name == call.server)
            .map(|s| s.timeout_secs)
            .unwrap_or(120)
            .max(1);
        let after = std::time::Duration::from_secs(u64::from(timeout_secs));
        let payload = ToolCallRequested {
            request_id: request_id.clone(),
            server_name: call.server.clone(),
            tool_name: call.tool.clone(),
            arguments: call.arguments.clone(),
            tool_use_id: call.tool_use_id.clone(),
            expires_at_ms: now_ms() + after.as_millis() as i64,
            rpc_id: call.id.clone(),
        };
        let ni = NewInteraction {
            session_id: self.sid().to_owned(),
            request_id: request_id.clone(),
            kind: InteractionKind::ToolCall,
            tool_name: Some(format!("mcp__{}__{}", call.server, call.tool)),
            input: Bytes::from(serde_json::to_vec(&call.arguments).unwrap_or_default()),
            suggestions: None,
            event_seq: None,
            created_ms: now_ms(),
        };
        // The request event and the pending interaction commit together.
        let item = Item {
            payload: EventPayload::ToolCallRequested(payload),
            raw: line,
            ts_ms: now_ms(),
        };
        let pending = PendingToolCall {
            server: call.server,
            rpc_id: call.id,
            responder,
            deadline: Instant::now() + after,
            timeout_secs,
        };
        // Not recorded: nobody could answer durably; the dropped responder answers the CLI
        // with an error.
        self.record_pending(item, ni, true, "tool call", |a| {
            a.tool_calls.insert(request_id, pending);
        })
        .await;
        self.settle_state(None).await;
    }

    /// Records the resolution (first wins, in the store), publishes it, answers the CLI.
    async fn resolve_tool_call(
        &mut self,
        request_id: &str,
        resolved: ToolCallResolved,
    ) -> Result<ToolCallDecided> {
        let Some(p) = self.tool_calls.get(request_id) else {
            return Err(self.not_pending(request_id).await);
        };
        let mcp = sdk_mcp::call_result(&p.rpc_id, &resolved.content, resolved.is_error);
        let seq = self
            .answer_waiting(
                request_id,
                (resolved.outcome.state(), resolved.resolved_by.clone()),
                Bytes::from(mcp.to_string()),
                Item::new(EventPayload::ToolCallResolved(resolved.clone())),
                sdk_mcp::control_body(mcp),
                |a| &mut a.tool_calls,
            )
            .await?;
        Ok(ToolCallDecided { seq, resolved })
    }

    /// `RespondToToolCall`.
    pub(super) async fn respond_tool_call(
        &mut self,
        request_id: &str,
        content: Vec<Content>,
        is_error: bool,
        client: &ClientRef,
    ) -> Result<ToolCallDecided> {
        if !self.tool_calls.contains_key(request_id) {
            return Err(self.not_pending_as(request_id, "a tool call").await);
        }
        let r = self
            .resolve_tool_call(
                request_id,
                ToolCallResolved {
                    request_id: request_id.to_owned(),
                    outcome: ToolCallOutcome::Answered,
                    content,
                    is_error,
                    resolved_by: client.label(),
                },
            )
            .await;
        self.settle_state(None).await;
        r
    }

    /// The earliest deadline of a pending tool call.
    pub(super) fn tool_deadline(&self) -> Option<Instant> {
        self.tool_calls.values().map(|p| p.deadline).min()
    }

    /// Tool calls past their deadline get an error result.
    pub(super) async fn expire_tool_calls(&mut self) {
        let now = Instant::now();
        let due: Vec<(String, u32)> = self
            .tool_calls
            .iter()
            .filter(|(_, p)| p.deadline <= now)
            .map(|(id, p)| (id.clone(), p.timeout_secs))
            .collect();
        for (id, secs) in due {
            let text = format!("ostler: no client answered this tool call within {secs}s");
            let r = self
                .resolve_tool_call(
                    &id,
                    ToolCallResolved {
                        request_id: id.clone(),
                        outcome: ToolCallOutcome::Expired,
                        content: vec![Content::Text { text }],
                        is_error: true,
                        resolved_by: "expiry".into(),
                    },
                )
                .await;
            if let Err(e) = r {
                tracing::warn!(session = %self.sid(), request_id = %id, error = %e, "cannot expire tool call");
            }
        }
        self.settle_state(None).await;
    }

    /// The CLI gave up on the call with JSON-RPC id `rpc_id` to `server` (an interrupt, or
    /// its own `MCP_TOOL_TIMEOUT`) and goes on without it: closed at once, by `cli`, so that
    /// no client answers a call nobody waits for and the session does not show a wait the
    /// CLI no longer has. A call already closed is left as it is.
    async fn tool_call_withdrawn(&mut self, server: &str, rpc_id: &Value, reason: &str) {
        let Some(id) = self
            .tool_calls
            .iter()
            .find(|(_, p)| p.server == server && &p.rpc_id == rpc_id)
            .map(|(id, _)| id.clone())
        else {
            return;
        };
        let why = match reason {
            "" => "withdrawn by the CLI".to_owned(),
            r => format!("withdrawn by the CLI ({r})"),
        };
        self.cancel_tool_calls(Some(&id), "cli", &why).await;
        self.settle_state(None).await;
    }

    /// Closes every pending tool call with an error result (the turn or process ended, or
    /// the CLI withdrew it): `by` is `engine` or `cli`.
    pub(super) async fn cancel_tool_calls(&mut self, only: Option<&str>, by: &str, why: &str) {
        let ids: Vec<String> = match only {
            Some(id) if self.tool_calls.contains_key(id) => vec![id.to_owned()],
            Some(_) => Vec::new(),
            None => self.tool_calls.keys().cloned().collect(),
        };
        for id in ids {
            let r = self
                .resolve_tool_call(
                    &id,
                    ToolCallResolved {
                        request_id: id.clone(),
                        outcome: ToolCallOutcome::Cancelled,
                        content: vec![Content::Text {
                            text: format!("ostler: {why}"),
                        }],
                        is_error: true,
                        resolved_by: by.to_owned(),
                    },
                )
                .await;
            if let Err(e) = r {
                tracing::warn!(session = %self.sid(), request_id = %id, error = %e, "cannot cancel tool call");
            }
        }
    }
}
