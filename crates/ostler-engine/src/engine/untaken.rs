//! Messages a CLI process never took. A message is recorded (`user_message_sent`) before it
//! is written to the CLI's stdin, so a process that ends between the two (the daemon
//! killed, the CLI killed with the message still in its pipe or its queue) leaves a
//! recorded message the conversation does not have. Before a session is resumed, the
//! messages of its last process that are not matched by a finished turn (one naming it, or
//! by count where the release names none) are looked up in the CLI's transcript (by the
//! uuid ostler sends with each message, also where 2.1.x merged it into another message's
//! entry, `mergedSendUuids`); each one missing gets
//! a `delivery_failed` notice, which frees its `client_message_id` for the retry; each one
//! there (taken, but its turn cut off with its process) gets a `message_unanswered` notice,
//! which ends the wait of a client following it. Messages withdrawn by an interrupt
//! (`cancelled`) are done and checked for neither.

use std::collections::HashSet;
use std::sync::Arc;

use super::Engine;
use super::lifecycle::{RESUMING, SESSION_CREATED};
use crate::actor::{DELIVERY_FAILED, delivery_failed, stored_user_message};
use crate::blocking::blocking;
use crate::error::{Error, Result};
use crate::handle::{Meta, SessionEntry};
use crate::types::*;

/// A recorded message of the last process.
struct Sent {
    seq: u64,
    /// The uuid sent with it (messages recorded without one are not checked).
    message_id: String,
    client_message_id: Option<String>,
}

/// The notice of a message the CLI took (it is in the transcript) whose turn never ended:
/// its process ended mid-turn. It stays in the conversation, unanswered; a client waiting
/// for its `TurnCompleted` (a retry of it, with its id) stops waiting.
pub(crate) const MESSAGE_UNANSWERED: &str = "message_unanswered";

/// Why a message left out of the transcript failed.
const NOT_IN_TRANSCRIPT: &str = "its process ended before the message reached the CLI's \
    transcript; send it again (the client_message_id is free again)";

impl Engine {
    /// Records `delivery_failed` for each message of the session's last process that its
    /// CLI never took (see the module's text) and frees its client id in `meta`. `env`:
    /// the session's CLI environment; `cid`: its CLI conversation.
    pub(super) async fn fail_untaken(
        &self,
        entry: &Arc<SessionEntry>,
        env: &[(String, String)],
        cid: Option<&str>,
        meta: &mut Meta,
    ) -> Result<()> {
        let store = self.shared.store.clone();
        let sid = entry.id.clone();
        let doubtful = blocking(move || {
            // Newest first, back to the start of the last process: the seqs of its messages
            // (minus those already failed) and its finished turns. Only notices are decoded
            // here; a message's content can be large.
            let mut sent = Vec::new();
            let mut failed = HashSet::new();
            // The messages finished turns name (`user_message_uuids`), and the number of
            // finished turns that name none (a release that does not say).
            let mut answered = HashSet::new();
            // Messages withdrawn (`cancelled` by an interrupt): done, nothing comes for them.
            let mut withdrawn = HashSet::new();
            let mut turns = 0usize;
            let mut before = u64::MAX;
            'scan: loop {
                let page = store.events_of_kinds_before(
                    &sid,
                    &[
                        "user_message_sent",
                        "turn_completed",
                        "engine_notice",
                        "system_notice",
                    ],
                    before,
                    64,
                )?;
                let Some(last) = page.last() else { break };
                before = last.seq;
                for ev in &page {
                    match &*ev.kind {
                        "turn_completed" => {
                            match EventPayload::decode_stored(&ev.kind, &ev.payload) {
                                Ok(EventPayload::TurnCompleted(t))
                                    if !t.user_message_uuids.is_empty() =>
                                {
                                    answered.extend(t.user_message_uuids);
                                }
                                _ => turns += 1,
                            }
                        }
                        "user_message_sent" => {
                            if !failed.contains(&ev.seq) {
                                sent.push(ev.seq);
                            }
                        }
                        "system_notice" => {
                            if let Ok(EventPayload::SystemNotice(n)) =
                                EventPayload::decode_stored(&ev.kind, &ev.payload)
                                && let Some(ostler_protocol::NoticeDetail::MessageLifecycle(l)) =
                                    n.detail
                                && l.state == "cancelled"
                            {
                                withdrawn.insert(l.message_id);
                            }
                        }
                        _ => {
                            let Ok(EventPayload::EngineNotice(n)) =
                                EventPayload::decode_stored(&ev.kind, &ev.payload)
                            else {
                                continue;
                            };
                            if n.code == SESSION_CREATED || n.code == RESUMING {
                                break 'scan;
                            }
                            if (n.code == DELIVERY_FAILED || n.code == MESSAGE_UNANSWERED)
                                && let Some(seq) = n.data.as_ref().and_then(|d| d["seq"].as_u64())
                            {
                                failed.insert(seq);
                            }
                        }
                    }
                }
            }
            // Messages a finished turn names were taken (2.1.x runs messages queued together
            // as one turn and names them all). Of the rest, oldest first, the CLI takes
            // messages in order and ends a turn for each: the oldest `turns` were taken; the
            // newer ones may not have been.
            let mut unanswered = Vec::new();
            for seq in sent.into_iter().rev() {
                let Some(u) = stored_user_message(&store, &sid, seq)? else {
                    continue;
                };
                if u.message_id
                    .as_ref()
                    .is_some_and(|m| answered.contains(m) || withdrawn.contains(m))
                {
                    continue;
                }
                unanswered.push(u.message_id.map(|message_id| Sent {
                    seq,
                    message_id,
                    client_message_id: u.client_message_id,
                }));
            }
            unanswered.drain(..turns.min(unanswered.len()));
            Ok::<_, Error>(unanswered.into_iter().flatten().collect::<Vec<_>>())
        })
        .await?;
        if doubtful.is_empty() {
            return Ok(());
        }
        let uuids: Vec<String> = doubtful.iter().map(|m| m.message_id.clone()).collect();
        let env = env.to_vec();
        let cid = cid.map(str::to_owned);
        let taken = blocking(move || {
            Ok::<_, Error>(crate::capability::transcript_user_entries(
                &env,
                cid.as_deref(),
                &uuids,
            ))
        })
        .await?;
        let Some(taken) = taken else {
            tracing::warn!(
                session = %entry.id,
                messages = doubtful.len(),
                "cannot read the CLI's transcript: messages of the last process not checked"
            );
            return Ok(());
        };
        for m in doubtful {
            if taken.contains(&m.message_id) {
                entry
                    .hub
                    .emit_one(EventPayload::EngineNotice(EngineNotice {
                        code: MESSAGE_UNANSWERED.into(),
                        message: format!(
                            "the user message (seq {}) was taken by the CLI, but its process \
                             ended before the turn that answers it did: it stays in the \
                             conversation unanswered",
                            m.seq
                        ),
                        data: Some(serde_json::json!({
                            "seq": m.seq,
                            "message_id": m.message_id,
                            "client_message_id": m.client_message_id,
                        })),
                    }))
                    .await?;
                continue;
            }
            entry
                .hub
                .emit_one(delivery_failed(
                    m.seq,
                    m.client_message_id.clone(),
                    NOT_IN_TRANSCRIPT,
                ))
                .await?;
            if let Some(id) = &m.client_message_id
                && meta.messages.get(id) == Some(&m.seq)
            {
                meta.messages.remove(id);
            }
        }
        Ok(())
    }
}
