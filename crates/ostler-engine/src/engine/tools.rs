//! `RespondToToolCall` (issue 11, client-hosted tools) and `RespondToElicitation` (an MCP
//! server's request for the user's input): into the session's actor, which owns the
//! pending tool calls and elicitations (`actor/tools.rs`, `actor/elicitations.rs`).

use ostler_protocol::sdk_mcp::Content;
use ostler_store::{Decision, InteractionState};

use super::Engine;
use crate::error::Result;
use crate::handle::Command;
use crate::hub::{Item, now_ms};
use crate::types::{
    ClientRef, DialogBehavior, DialogDecided, DialogResolved, ElicitationAction,
    ElicitationDecided, ElicitationResolved, EventPayload, ToolCallDecided, ToolCallOutcome,
    ToolCallResolved,
};

/// The decision that cancels interaction `i` without an answer, taken by `by`.
pub(super) fn cancelled(i: &ostler_store::Interaction, by: &str) -> (String, Decision) {
    let decision = Decision {
        state: InteractionState::Cancelled,
        decided_by: by.to_owned(),
        response: None,
        decided_ms: now_ms(),
    };
    (i.request_id.clone(), decision)
}

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
    (item, cancelled(i, "restart"))
}

/// An elicitation left pending by a daemon that died: answered `cancel` by `restart` (the
/// CLI that asked is gone), event and decision committed together.
pub(super) fn elicitation_at_restart(i: &ostler_store::Interaction) -> (Item, (String, Decision)) {
    let item = Item::new(EventPayload::ElicitationResolved(ElicitationResolved {
        request_id: i.request_id.clone(),
        outcome: ToolCallOutcome::Cancelled,
        action: ElicitationAction::Cancel,
        content: None,
        resolved_by: "restart".into(),
    }));
    (item, cancelled(i, "restart"))
}

/// A dialog left pending by a daemon that died: answered `cancelled` by `restart` (the CLI
/// that asked is gone), event and decision committed together.
pub(super) fn dialog_at_restart(i: &ostler_store::Interaction) -> (Item, (String, Decision)) {
    let item = Item::new(EventPayload::DialogResolved(DialogResolved {
        request_id: i.request_id.clone(),
        outcome: ToolCallOutcome::Cancelled,
        behavior: DialogBehavior::Cancelled,
        result: None,
        resolved_by: "restart".into(),
    }));
    (item, cancelled(i, "restart"))
}

impl Engine {
    /// Answers a pending dialog (`result`: the choice given with `Completed`). The first
    /// answer wins; later ones get `FailedPrecondition` naming who answered.
    pub async fn respond_dialog(
        &self,
        session_id: &str,
        request_id: &str,
        behavior: DialogBehavior,
        result: Option<serde_json::Value>,
        client: ClientRef,
    ) -> Result<DialogDecided> {
        let actor = self.deciding_actor(session_id, request_id).await?;
        let rid = request_id.to_owned();
        actor
            .call(session_id, |reply| Command::RespondDialog {
                request_id: rid,
                behavior,
                result,
                client,
                reply,
            })
            .await
    }

    /// Answers a pending elicitation (`content`: the input given with `Accept`, a JSON
    /// object). The first answer wins; later ones get `FailedPrecondition` naming who
    /// answered.
    pub async fn respond_elicitation(
        &self,
        session_id: &str,
        request_id: &str,
        action: ElicitationAction,
        content: Option<serde_json::Value>,
        client: ClientRef,
    ) -> Result<ElicitationDecided> {
        let actor = self.deciding_actor(session_id, request_id).await?;
        let rid = request_id.to_owned();
        actor
            .call(session_id, |reply| Command::RespondElicitation {
                request_id: rid,
                action,
                content,
                client,
                reply,
            })
            .await
    }

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
