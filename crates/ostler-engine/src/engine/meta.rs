//! A session's title, labels and archived mark after create (`UpdateSession`; the Agent
//! SDK's renameSession / tagSession / archiveSession / unarchiveSession). Works in every
//! state without the CLI: ostler's record is the truth. The change and the
//! `session_updated` notice recording it commit in one transaction
//! ([`ostler_store::Store::update_meta`], which also writes the `session_updated` feed
//! row); an update that changes nothing writes nothing.
//!
//! A new title also goes to the CLI, after the commit, where the release answers
//! `rename_session` (measured: 2.1.330 and later; 2.1.120 and 2.1.121 refuse it), so the CLI's transcript (what
//! `claude --resume` and the Agent SDK's listSessions show) follows: at once when the
//! session is live (one request at a time: the newest title waits for the previous
//! answer), else at its next respawn (the actor compares after `initialize`).
//! The CLI's answer or refusal is recorded (`cli_title_set` / `cli_title_set_failed`) and
//! never fails the update; its `session_title_changed` echo changes nothing in ostler.

use std::sync::Arc;

use ostler_store::{MetaChange, MetaPatch};
use serde_json::{Map, Value, json};

use super::Engine;
use crate::blocking::blocking;
use crate::error::{Error, Result};
use crate::handle::Command;
use crate::hub::now_ms;
use crate::types::{EngineNotice, EventPayload, SessionInfo, UpdateSession};

/// The notice code recording a change of title, labels or archived mark.
pub const SESSION_UPDATED: &str = "session_updated";

/// What caused a change (the notice's `data.cause`).
#[derive(Debug, Clone, Copy)]
enum Cause {
    UpdateSession,
    SendMessage,
}

impl Cause {
    fn as_str(self) -> &'static str {
        match self {
            Cause::UpdateSession => "update_session",
            Cause::SendMessage => "send_message",
        }
    }
}

/// The `session_updated` notice of `change`.
fn notice(change: &MetaChange, cause: Cause) -> EventPayload {
    let mut data = Map::new();
    let mut parts = Vec::new();
    if let Some((old, new)) = &change.title {
        data.insert("title".into(), json!({ "old": old, "new": new }));
        parts.push(format!("title {new:?}"));
    }
    if !change.labels_set.is_empty() {
        data.insert("labels_set".into(), json!(change.labels_set));
        let set: Vec<String> = change
            .labels_set
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        parts.push(format!("labels set {}", set.join(", ")));
    }
    if !change.labels_removed.is_empty() {
        data.insert("labels_removed".into(), json!(change.labels_removed));
        parts.push(format!(
            "labels removed {}",
            change.labels_removed.join(", ")
        ));
    }
    if let Some(a) = change.archived {
        data.insert("archived".into(), Value::Bool(a));
        parts.push(if a { "archived" } else { "unarchived" }.to_owned());
    }
    data.insert("cause".into(), Value::String(cause.as_str().into()));
    let by = match cause {
        Cause::UpdateSession => "",
        Cause::SendMessage => " (a message was sent)",
    };
    EventPayload::EngineNotice(EngineNotice {
        code: SESSION_UPDATED.into(),
        message: format!("session updated: {}{by}", parts.join("; ")),
        data: Some(Value::Object(data)),
    })
}

impl Engine {
    /// `UpdateSession`: changes the title, labels and archived mark; returns the session
    /// as it is afterwards. An update that changes nothing writes nothing.
    pub async fn update_session(
        &self,
        session_id: &str,
        req: UpdateSession,
    ) -> Result<SessionInfo> {
        if req.title.is_none()
            && req.set_labels.is_empty()
            && req.remove_labels.is_empty()
            && req.archived.is_none()
        {
            return Err(Error::invalid(
                "title",
                "nothing to change: give title, set_labels, remove_labels or archived",
            ));
        }
        if let Some(k) = req
            .remove_labels
            .iter()
            .find(|k| req.set_labels.contains_key(*k))
        {
            return Err(Error::invalid(
                "remove_labels",
                format!("label {k:?} is both set and removed"),
            ));
        }
        let patch = MetaPatch {
            title: req.title,
            set_labels: req.set_labels,
            remove_labels: req.remove_labels,
            archived: req.archived,
            max_labels: req.max_labels,
            updated_ms: now_ms(),
        };
        let change = self
            .apply_meta(session_id, patch, Cause::UpdateSession)
            .await
            .map_err(|e| match e {
                Error::InvalidArgument { field, message } if field.is_empty() => {
                    Error::invalid("set_labels", message)
                }
                e => e,
            })?;
        if let Some((_, title)) = change.title
            && let Some(handle) = self.live_handle(session_id)
        {
            // Queued behind whatever the actor has; it sends the request (or not, for a
            // release that does not answer it) and records the answer. Not awaited: the
            // store holds the title already. A session that ends first gets it at its next
            // respawn.
            if handle.send(Command::RenameCli { title }).await.is_err() {
                tracing::debug!(session = %session_id, "the session ended before its title reached the CLI");
            }
        }
        self.get_session(session_id).await
    }

    /// A message was sent to the session: an archived session is unarchived (the SDK: "A
    /// prompt sent in the session later unarchives it"), recorded like an UpdateSession.
    pub(crate) async fn unarchive_on_send(&self, session_id: &str) -> Result<()> {
        let store = self.shared.store.clone();
        let sid = session_id.to_owned();
        if !blocking(move || store.archived(&sid)).await? {
            return Ok(());
        }
        let patch = MetaPatch {
            archived: Some(false),
            updated_ms: now_ms(),
            ..Default::default()
        };
        self.apply_meta(session_id, patch, Cause::SendMessage)
            .await
            .map(drop)
    }

    async fn apply_meta(
        &self,
        session_id: &str,
        patch: MetaPatch,
        cause: Cause,
    ) -> Result<MetaChange> {
        let entry = self.entry(session_id).await?;
        let (change, _event) = entry
            .hub
            .emit_meta(patch, Arc::new(move |c: &MetaChange| notice(c, cause)))
            .await
            .map_err(|e| match e {
                Error::NotFound { .. } => Error::session_not_found(session_id),
                e => e,
            })?;
        Ok(change)
    }
}
