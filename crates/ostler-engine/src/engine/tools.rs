//! `RespondToToolCall` (issue 11, client-hosted tools): into the session's actor, which
//! owns the pending tool calls (`actor/tools.rs`).

use ostler_protocol::sdk_mcp::Content;
use ostler_store::{Decision, InteractionState};

use super::Engine;
use crate::error::Result;
use crate::handle::Command;
use crate::hub::{Item, now_ms};
use crate::types::{ClientRef, EventPayload, ToolCallDecided, ToolCallOutcome, ToolCallResolved};

/// A tool call left pending by a daemon that died: resolved with an error result by
/// `restart` (the CLI that asked is gone), event and decision committed together.
pub(super) fn resolved_at_restart(i: &ostler_store::Interaction) -> (Item, (String, Decision)) {
    let item = Item::new(EventPayload::ToolCallResolved(ToolCallResolved {
        request_id: i.request_id.clone(),
        outcome: ToolCallOutcome::Cancelled,
        content: vec![Content::Text {
            text: "ostler: the daemon restarted before a client answered this tool call".into(),
        }],
        is_error: true,
        resolved_by: "restart".into(),
    }));
    let decision = Decision {
        state: InteractionState::Cancelled,
        decided_by: "restart".into(),
        response: None,
        decided_ms: now_ms(),
    };
    (item, (i.request_id.clone(), decision))
}

impl Engine {
    /// Answers a pending tool call. The first answer wins; later ones get
    /// `FailedPrecondition` naming who answered.
    pub async fn respond_tool_call(
        &self,
        session_id: &str,
        request_id: &str,
        content: Vec<Content>,
        is_error: bool,
        client: ClientRef,
    ) -> Result<ToolCallDecided> {
        let actor = self.deciding_actor(session_id, request_id).await?;
        let rid = request_id.to_owned();
        actor
            .call(session_id, |reply| Command::RespondToolCall {
                request_id: rid,
                content,
                is_error,
                client,
                reply,
            })
            .await
    }
}
