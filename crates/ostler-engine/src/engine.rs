//! The engine handle, the session registry and the public API (thin calls into the
//! session actors and the store). Lifecycle (start, create, resume, stop, delete, shutdown)
//! is in `engine/lifecycle.rs`; the live-actor lookup (resume on demand) and the
//! live-session slots in `engine/demand.rs`.

mod control;
pub(crate) mod debug_log;
mod demand;
mod lifecycle;
mod meta;
mod tools;
mod untaken;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ostler_protocol::outbound::OutRequest;
use ostler_store::SessionFilter;
use ostler_store::SessionRecord;
use ostler_supervisor::Installation;
use tokio::sync::oneshot;

use crate::blocking::blocking;
use crate::error::{Error, Result};
use crate::handle::{Command, SessionEntry, SessionHandle};
pub use crate::shared::EngineOptions;
use crate::shared::Shared;
pub use crate::subscribe::Subscription;
use crate::types::*;
pub use debug_log::{DEBUG_MAX_BYTES_DEFAULT, DEBUG_READ_DEFAULT, DEBUG_READ_MAX, DebugLogChunk};

/// `client_message_id`s with this prefix are ostler's own; clients' are refused.
pub const RESERVED_MESSAGE_ID_PREFIX: &str = "ostler:";

/// The `client_message_id` of a create's `first_prompt`: a retried create finds it by it,
/// and sends it only if the first try did not.
pub const FIRST_PROMPT_ID: &str = "ostler:first_prompt";

const KNOWN_MODES: &[&str] = &[
    "default",
    "acceptEdits",
    "plan",
    "bypassPermissions",
    "dontAsk",
];

/// A switch to `bypassPermissions` the CLI refused because the session was not started
/// to allow it: the CLI's reason names its own flag (2.1.332: "Cannot set permission mode
/// to bypassPermissions because the session was not launched with
/// --dangerously-skip-permissions"), which ostler's clients never pass; say which session
/// option it is. Other refusals (bypass disabled by settings) are left as they are.
fn bypass_refused(e: Error) -> Error {
    match e {
        Error::FailedPrecondition {
            message,
            decided_by,
        } if message.starts_with("the CLI refused")
            && message.contains("dangerously-skip-permissions") =>
        {
            Error::FailedPrecondition {
                message: format!(
                    "{message}. A session can be switched to bypassPermissions only if it was \
                     created with allow_dangerously_skip_permissions (`ostler run \
                     --allow-dangerously-skip-permissions`; a daemon running as root also \
                     needs the session env IS_SANDBOX=1) or with permission_mode \
                     BYPASS_PERMISSIONS: create a new session with it"
                ),
                decided_by,
            }
        }
        other => other,
    }
}

/// Dropped with the last [`Engine`] handle: tells the actors.
struct Alive(tokio::sync::watch::Sender<bool>);

impl Drop for Alive {
    fn drop(&mut self) {
        let _ = self.0.send(true);
    }
}

/// The sessions this engine knows (created or touched since start), each with the handle
/// of its latest actor (kept after the actor ended: its view still shows the stderr tail of
/// the exit). The one owner of "which actor serves which session".
#[derive(Default)]
struct Registry(Mutex<HashMap<String, Registered>>);

#[derive(Clone)]
struct Registered {
    entry: Arc<SessionEntry>,
    handle: Option<SessionHandle>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Registered>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, id: &str) -> Option<Registered> {
        self.lock().get(id).cloned()
    }

    fn entry_or_insert(&self, id: &str, make: impl FnOnce() -> SessionEntry) -> Arc<SessionEntry> {
        self.lock()
            .entry(id.to_owned())
            .or_insert_with(|| Registered {
                entry: Arc::new(make()),
                handle: None,
            })
            .entry
            .clone()
    }

    /// The handle of the session's latest actor (live or ended).
    fn handle(&self, id: &str) -> Option<SessionHandle> {
        self.lock().get(id).and_then(|r| r.handle.clone())
    }

    fn set_handle(&self, id: &str, handle: SessionHandle) {
        if let Some(r) = self.lock().get_mut(id) {
            r.handle = Some(handle);
        }
    }

    fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    fn all(&self) -> Vec<Registered> {
        self.lock().values().cloned().collect()
    }
}

/// A cheap, cloneable handle on the engine.
#[derive(Clone)]
pub struct Engine {
    shared: Arc<Shared>,
    registry: Arc<Registry>,
    /// Creates with a client-chosen id, one at a time per id.
    creates: Arc<lifecycle::CreateLocks>,
    _alive: Arc<Alive>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("store", &self.shared.store)
            .field("live", &self.shared.live())
            .finish_non_exhaustive()
    }
}

impl Engine {
    fn new(shared: Shared, alive: tokio::sync::watch::Sender<bool>) -> Self {
        Engine {
            shared: Arc::new(shared),
            registry: Arc::new(Registry::default()),
            creates: Arc::default(),
            _alive: Arc::new(Alive(alive)),
        }
    }

    /// Drops this handle without a shutdown, as the daemon's death would (once no handle
    /// is left, every actor kills its CLI process and records nothing), and resolves when
    /// nothing of the engine is left that could still write to the store: every actor and
    /// every task holding the engine's state has ended. Another engine may then start on
    /// the same store as a restarted daemon would. A process that dies needs no such wait;
    /// in one process (the engine's tests), an actor still finishing an event could
    /// otherwise write after the next engine's start made its session resumable. With
    /// other handles left, this waits until they are dropped too.
    pub async fn abandon(self) {
        let gone = self._alive.0.clone();
        drop(self);
        gone.closed().await;
    }

    fn installation(&self) -> &Installation {
        &self.shared.installation
    }

    /// What the CLI would refuse at its start for this daemon (its user, the environment
    /// it hands the session), checked at create and at every resume before anything is
    /// recorded: `FailedPrecondition` saying what to change.
    fn start_checks(&self, options: &ostler_supervisor::CliOptions) -> Result<()> {
        self.check_debug(options.debug)?;
        ostler_supervisor::session::check_start(
            self.installation(),
            options,
            &self.shared.opts.spawn_env,
            &self.shared.opts.supervisor,
        )
        .map_err(Error::from)
    }

    fn entry_for(&self, id: &str) -> Arc<SessionEntry> {
        self.registry.entry_or_insert(id, || {
            SessionEntry::new(
                id,
                self.shared.store.clone(),
                self.shared.opts.broadcast_capacity,
            )
        })
    }

    /// The entry of a session that exists in the store.
    async fn entry(&self, id: &str) -> Result<Arc<SessionEntry>> {
        if let Some(r) = self.registry.get(id) {
            return Ok(r.entry);
        }
        self.record(id).await?;
        Ok(self.entry_for(id))
    }

    /// The handle of the session's actor while it runs.
    fn live_handle(&self, id: &str) -> Option<SessionHandle> {
        self.registry.handle(id).filter(SessionHandle::is_live)
    }

    async fn record(&self, id: &str) -> Result<SessionRecord> {
        let store = self.shared.store.clone();
        let sid = id.to_owned();
        blocking(move || store.get_session(&sid))
            .await
            .map_err(|e| match e {
                Error::NotFound { .. } => Error::session_not_found(id),
                e => e,
            })
    }

    /// A stored session as the API shows it: the live view's state and pending count
    /// while its actor runs, the stored state otherwise.
    fn info(&self, rec: SessionRecord) -> SessionInfo {
        let (live_state, pending, stderr_tail) = match self.registry.handle(&rec.id) {
            Some(h) => {
                let v = h.view();
                (
                    v.live.then_some(v.state),
                    v.pending.len() as u32,
                    v.stderr_tail.clone().unwrap_or_default(),
                )
            }
            None => (None, 0, String::new()),
        };
        let mut record = rec;
        record.state = live_state.unwrap_or(record.state);
        SessionInfo {
            record,
            pending_interactions: pending,
            stderr_tail,
        }
    }

    /// `GetSession`.
    pub async fn get_session(&self, id: &str) -> Result<SessionInfo> {
        let rec = self.record(id).await?;
        Ok(self.info(rec))
    }

    /// `ListSessions` (oldest first).
    pub async fn list_sessions(&self, req: ListSessions) -> Result<SessionPage> {
        let filter = SessionFilter {
            states: req.states.clone(),
            labels: req.labels.clone(),
            archived: req.archived,
            ..Default::default()
        };
        let limit = match req.page_size {
            0 => 100,
            n => n.min(1000) as usize,
        };
        let store = self.shared.store.clone();
        let token = req.page_token.clone().filter(|t| !t.is_empty());
        let page = blocking(move || store.list_sessions(&filter, token.as_deref(), limit))
            .await
            .map_err(|e| match e {
                Error::InvalidArgument { message, .. } => Error::invalid("page_token", message),
                e => e,
            })?;
        Ok(SessionPage {
            sessions: page.sessions.into_iter().map(|r| self.info(r)).collect(),
            next_page_token: page.next_page_token,
        })
    }

    /// Sends a command to the session's actor and awaits its answer; a suspended or
    /// resumable session is resumed first (see `engine/demand.rs`).
    async fn call<T>(
        &self,
        id: &str,
        make: impl FnOnce(oneshot::Sender<Result<T>>) -> Command,
    ) -> Result<T> {
        self.live_actor(id).await?.call(id, make).await
    }

    /// `SendMessage`: records a `user_message_sent` event, then writes it to the CLI.
    pub async fn send_message(&self, session_id: &str, msg: SendMessage) -> Result<SendOutcome> {
        match &msg.content {
            MessageContent::Text(t) if t.trim().is_empty() => {
                return Err(Error::invalid("content", "the message is empty"));
            }
            MessageContent::Blocks(b) if b.is_empty() => {
                return Err(Error::invalid(
                    "content",
                    "the message has no content blocks",
                ));
            }
            _ => {}
        }
        match msg.client_message_id.as_deref() {
            Some("") => {
                return Err(Error::invalid(
                    "client_message_id",
                    "empty id (omit it instead)",
                ));
            }
            Some(id) if id.starts_with(RESERVED_MESSAGE_ID_PREFIX) => {
                return Err(Error::invalid(
                    "client_message_id",
                    format!(
                        "ids starting with {RESERVED_MESSAGE_ID_PREFIX:?} are ostler's own (the \
                         first prompt of a create is {FIRST_PROMPT_ID:?}); choose another"
                    ),
                ));
            }
            _ => {}
        }
        let sent = self.send_checked(session_id, msg).await?;
        // Sent: an archived session is unarchived (engine/meta.rs). The message is in the
        // log whatever happens here, so a failure is logged, not returned.
        if let Err(e) = self.unarchive_on_send(session_id).await {
            tracing::warn!(session = %session_id, error = %e, "cannot unarchive the session a message was sent to");
        }
        Ok(sent)
    }

    /// [`Self::send_message`] past the check of the client's id (which may be ostler's own
    /// here).
    async fn send_checked(&self, session_id: &str, msg: SendMessage) -> Result<SendOutcome> {
        if msg.delivery.context_only && msg.delivery.priority == Some(crate::Priority::Now) {
            return Err(Error::invalid(
                "context_only",
                "a context-only message starts no turn, so priority NOW (which stops the turn \
                 under way for it) cannot go with it; send it with the default priority",
            ));
        }
        crate::capability::check_delivery(&self.shared.installation, &msg.delivery)?;
        // A retry to a suspended session is answered from the log, without bringing the CLI
        // back for nothing: a suspension waited for every turn, so the log says all about
        // its messages. After another end (a restart, a kill, a stop) the resume's check
        // of untaken messages may still free the id: the resumed actor answers then, as
        // it answers every retry while live.
        let suspending = self
            .registry
            .get(session_id)
            .is_some_and(|r| r.entry.suspending.load(std::sync::atomic::Ordering::SeqCst));
        if let Some(cid) = msg.client_message_id.clone()
            && (suspending || self.live_handle(session_id).is_none())
            && self.record(session_id).await?.state == SessionState::Suspended
        {
            let store = self.shared.store.clone();
            let sid = session_id.to_owned();
            let sent = blocking(move || crate::actor::stored_send(&store, &sid, &cid)).await?;
            if let Some((seq, u)) = sent {
                return Ok(SendOutcome {
                    seq,
                    duplicate: true,
                    message_id: u.message_id,
                });
            }
        }
        self.call(session_id, |reply| Command::Send { msg, reply })
            .await
    }

    /// `Subscribe`: stored events after `after_seq` in order, then (with `follow`) live
    /// events, without gap or duplicate. Pending permission requests / questions with a seq
    /// at or before `after_seq` are delivered first again (marked `redelivered`).
    pub async fn subscribe(&self, req: SubscribeRequest) -> Result<Subscription> {
        let entry = self.entry(&req.session_id).await?;
        let store = self.shared.store.clone();
        let sid = req.session_id.clone();
        let last = blocking(move || store.last_seq(&sid)).await?;
        if req.after_seq > last {
            return Err(Error::invalid(
                "after_seq",
                format!(
                    "{} is beyond the last event of session {:?} ({last})",
                    req.after_seq, req.session_id
                ),
            ));
        }
        let until = (!req.follow).then_some(last);
        let redeliver = self
            .pending_events(&req.session_id)
            .into_iter()
            .filter(|e| e.seq.is_some_and(|s| s <= req.after_seq))
            .map(|e| {
                let mut e = (*e).clone();
                e.redelivered = true;
                Arc::new(e)
            })
            .collect();
        Ok(Subscription::new(
            entry.hub.clone(),
            req.after_seq,
            req.include_partials,
            req.follow,
            until,
            self.shared.opts.replay_page_size,
            redeliver,
        ))
    }

    /// The pending request events of a session (from its actor's view; a session without
    /// a process has none), oldest first.
    fn pending_events(&self, id: &str) -> Vec<Arc<EngineEvent>> {
        self.registry
            .handle(id)
            .map(|h| h.view().pending_events())
            .unwrap_or_default()
    }

    /// `RespondToPermission`. The first valid response wins; later ones get
    /// `FailedPrecondition` with `decided_by` naming who decided.
    pub async fn respond_permission(
        &self,
        session_id: &str,
        request_id: &str,
        response: PermissionResponse,
        client: ClientRef,
    ) -> Result<Decided> {
        let actor = self.deciding_actor(session_id, request_id).await?;
        let rid = request_id.to_owned();
        actor
            .call(session_id, |reply| Command::Respond {
                request_id: rid,
                response,
                client,
                reply,
            })
            .await
    }

    /// The actor that decides `request_id`; for a session without a process, the
    /// interaction's final state as an error (or the lookup's error).
    async fn deciding_actor(
        &self,
        session_id: &str,
        request_id: &str,
    ) -> Result<demand::LiveActor> {
        match self.running_actor(session_id).await {
            Ok(a) => Ok(a),
            Err(e) => Err(self
                .decided_elsewhere(session_id, request_id)
                .await
                .unwrap_or(e)),
        }
    }

    /// For a session without a process: the interaction's final state, as an error.
    async fn decided_elsewhere(&self, session_id: &str, request_id: &str) -> Option<Error> {
        let store = self.shared.store.clone();
        let (sid, rid) = (session_id.to_owned(), request_id.to_owned());
        match blocking(move || store.interaction(&sid, &rid)).await {
            Ok(i) if i.state.is_final() => Some(crate::settled::decided_error(&i)),
            Ok(_) => None,
            Err(Error::NotFound { .. }) => Some(Error::not_found(format!(
                "request {request_id:?} in session {session_id:?}"
            ))),
            Err(_) => None,
        }
    }

    /// `GetInteraction`: the interaction `request_id` names (exact, else a unique prefix), in
    /// `session_id` or (`None`) in any session, in any state, with its session's cwd and
    /// the event that asked it. `InvalidArgument` (field `request_id`): empty, an ambiguous
    /// prefix, or the id in several sessions without a session id; `NotFound`: no such
    /// request id, or no such session.
    pub async fn get_interaction(
        &self,
        session_id: Option<&str>,
        request_id: &str,
    ) -> Result<InteractionRecord> {
        use ostler_store::InteractionLookup as L;
        if request_id.is_empty() {
            return Err(Error::invalid("request_id", "empty"));
        }
        let store = self.shared.store.clone();
        let (sid, rid) = (session_id.map(str::to_owned), request_id.to_owned());
        // One trip to the blocking pool: the lookup and, when it found one interaction, its
        // session and the event that asked it (`Err`: what the lookup found instead).
        let found = blocking(move || {
            let i = match store.lookup_interaction(sid.as_deref(), &rid)? {
                L::Found(i) => i,
                other => return Ok(Err(other)),
            };
            let record = store.get_session(&i.session_id)?;
            let events = match i.event_seq {
                Some(seq) if seq > 0 => store.events_after(&i.session_id, seq - 1, 1)?,
                _ => Vec::new(),
            };
            Ok::<_, ostler_store::Error>(Ok((i, record, events)))
        })
        .await?;
        let list = |c: &[ostler_store::Interaction]| {
            c.iter()
                .map(|i| format!("{} (session {})", i.request_id, i.session_id))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (interaction, record, events) = match found {
            Ok(found) => found,
            Err(L::Found(_) | L::NotFound) => {
                return Err(Error::not_found(match session_id {
                    Some(s) => format!("request {request_id:?} in session {s:?}"),
                    None => format!("request {request_id:?}"),
                }));
            }
            Err(L::InSessions(c)) => {
                return Err(Error::invalid(
                    "request_id",
                    format!(
                        "request {request_id:?} is in several sessions ({}); give session_id",
                        c.iter()
                            .map(|i| i.session_id.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
            Err(L::Ambiguous { candidates, more }) => {
                return Err(Error::invalid(
                    "request_id",
                    format!(
                        "the prefix {request_id:?} matches several requests: {}{}; give more of \
                         the id",
                        list(&candidates),
                        if more { ", ..." } else { "" }
                    ),
                ));
            }
        };
        let seq = interaction.event_seq;
        let event = events
            .iter()
            .find(|e| Some(e.seq) == seq)
            .map(crate::hub::decode_stored);
        Ok(InteractionRecord {
            interaction,
            cwd: record.cwd,
            event,
        })
    }

    /// `AnswerQuestion`: every question answered; sent as `allow` with `updatedInput`
    /// carrying the answers.
    pub async fn answer_question(
        &self,
        session_id: &str,
        request_id: &str,
        answers: Vec<QuestionAnswer>,
        client: ClientRef,
    ) -> Result<Decided> {
        let actor = self.deciding_actor(session_id, request_id).await?;
        let rid = request_id.to_owned();
        actor
            .call(session_id, |reply| Command::Answer {
                request_id: rid,
                answers,
                client,
                reply,
            })
            .await
    }

    /// `RespondToHook` (issue 11): the first valid answer wins; later ones get
    /// `FailedPrecondition` naming who answered; an answer the hook event does not take is
    /// `InvalidArgument`.
    pub async fn respond_hook(
        &self,
        session_id: &str,
        request_id: &str,
        answer: ostler_protocol::hooks::HookAnswer,
        client: ClientRef,
    ) -> Result<HookDecided> {
        let actor = self.deciding_actor(session_id, request_id).await?;
        let rid = request_id.to_owned();
        actor
            .call(session_id, |reply| Command::RespondHook {
                request_id: rid,
                answer,
                client,
                reply,
            })
            .await
    }

    /// Pending permission requests, questions, hook calls, client-hosted tool calls and
    /// elicitations of a session, oldest first.
    pub async fn pending_interactions(&self, session_id: &str) -> Result<Vec<PendingInteraction>> {
        self.entry(session_id).await?;
        Ok(self
            .pending_events(session_id)
            .into_iter()
            .filter_map(|e| {
                let (request_id, kind) = match &e.payload {
                    EventPayload::PermissionRequested(p) => {
                        (p.request_id.clone(), InteractionKind::Permission)
                    }
                    EventPayload::QuestionAsked(q) => {
                        (q.request_id.clone(), InteractionKind::Question)
                    }
                    EventPayload::HookRequested(h) => (h.request_id.clone(), InteractionKind::Hook),
                    EventPayload::ToolCallRequested(t) => {
                        (t.request_id.clone(), InteractionKind::ToolCall)
                    }
                    EventPayload::ElicitationRequested(e) => {
                        (e.request_id.clone(), InteractionKind::Elicitation)
                    }
                    EventPayload::DialogRequested(d) => {
                        (d.request_id.clone(), InteractionKind::Dialog)
                    }
                    _ => return None,
                };
                Some(PendingInteraction {
                    session_id: session_id.to_owned(),
                    request_id,
                    kind,
                    event: e,
                })
            })
            .collect())
    }

    async fn control(&self, id: &str, request: OutRequest) -> Result<()> {
        control::check_request(&self.shared.installation, &request)?;
        self.call(id, |reply| Command::Control { request, reply })
            .await
            .map(|_| ())
    }

    /// `Interrupt`: interrupts the running turn. A suspended or resumable session runs
    /// nothing: it succeeds without resuming it.
    /// Returns the CLI's answer: its receipt (`still_queued`) on releases announcing
    /// `interrupt_receipt_v1`, `None` where nothing ran or the release answers without one.
    pub async fn interrupt(&self, session_id: &str) -> Result<Option<serde_json::Value>> {
        let entry = self.entry(session_id).await?;
        let suspending = entry.suspending.load(std::sync::atomic::Ordering::SeqCst);
        if suspending || self.live_handle(session_id).is_none() {
            if suspending {
                // Only an idle session suspends: nothing runs.
                return Ok(None);
            }
            let rec = self.record(session_id).await?;
            if demand::resumes_on_demand(rec.state) {
                return Ok(None);
            }
        }
        self.control_answer(session_id, OutRequest::Interrupt).await
    }

    /// `SetModel` (`None` resets to the default model).
    pub async fn set_model(&self, session_id: &str, model: Option<String>) -> Result<()> {
        let model = model.filter(|m| !m.trim().is_empty());
        self.control(session_id, OutRequest::SetModel(model)).await
    }

    /// `SetPermissionMode`: the mode in effect afterwards, as the CLI's answer names it
    /// (the one asked for where it names none); the session records that one.
    pub async fn set_permission_mode(&self, session_id: &str, mode: String) -> Result<String> {
        if !KNOWN_MODES.contains(&mode.as_str()) {
            return Err(Error::invalid(
                "mode",
                format!("unknown permission mode {mode:?} (known: {KNOWN_MODES:?})"),
            ));
        }
        let bypass = mode == "bypassPermissions";
        let result = self
            .control_answer(session_id, OutRequest::SetPermissionMode(mode.clone()))
            .await
            .map(|answer| crate::runtime::mode_in_effect(&mode, answer.as_ref()));
        if bypass {
            return result.map_err(bypass_refused);
        }
        result
    }

    /// Appends an ostler notice (audit note, operator message, ...) to a session's log,
    /// persist-then-publish like every event; returns its seq. Works in any state.
    pub async fn record_notice(&self, session_id: &str, notice: EngineNotice) -> Result<u64> {
        if notice.code.trim().is_empty() {
            return Err(Error::invalid("code", "the notice code is empty"));
        }
        let entry = self.entry(session_id).await?;
        let ev = entry
            .hub
            .emit_one(EventPayload::EngineNotice(notice))
            .await?;
        ev.seq
            .ok_or_else(|| Error::internal("a stored notice has no seq"))
    }

    /// Health details: in-memory counts and a cheap store probe (no listing: the cost does
    /// not grow with the stored sessions).
    pub async fn health(&self) -> Result<HealthReport> {
        let store = self.shared.store.clone();
        let store_status = blocking(move || store.probe())
            .await
            .map_err(|e| e.to_string())
            .and_then(|()| match self.store_write_fault() {
                Some(reason) => Err(format!("store not writable: {reason}")),
                None => Ok(()),
            });
        let pending = self
            .registry
            .all()
            .iter()
            .filter_map(|r| r.handle.as_ref())
            .map(|h| h.view().pending.len() as u64)
            .sum();
        Ok(HealthReport {
            sessions_by_state: self.shared.counts.snapshot(),
            pending_interactions: pending,
            store: store_status,
            live_sessions: self.shared.live() as u64,
            max_live_sessions: self.shared.opts.max_live_sessions as u64,
            subscribers: self
                .registry
                .all()
                .iter()
                .map(|r| r.entry.hub.subscribers())
                .sum(),
        })
    }

    /// Why the store cannot write, while it cannot (no I/O; see `ostler_store::WriteHealth`).
    pub fn store_write_fault(&self) -> Option<String> {
        self.shared
            .store
            .write_health()
            .fault()
            .map(|f| f.reason.clone())
    }

    /// The store's write health as a watch (changes the moment a write fails or recovers).
    pub fn watch_store_health(&self) -> tokio::sync::watch::Receiver<ostler_store::WriteHealth> {
        self.shared.store.watch_write_health()
    }

    pub(crate) fn store(&self) -> &ostler_store::Store {
        &self.shared.store
    }
}

#[cfg(test)]
mod bypass_tests {
    use super::*;

    #[test]
    fn a_refused_bypass_switch_names_the_session_option() {
        let e = bypass_refused(Error::precondition(
            "the CLI refused: Cannot set permission mode to bypassPermissions because the \
             session was not launched with --dangerously-skip-permissions",
        ));
        let msg = e.to_string();
        assert!(matches!(e, Error::FailedPrecondition { .. }), "{e:?}");
        assert!(msg.contains("allow_dangerously_skip_permissions"), "{msg}");
        assert!(msg.contains("IS_SANDBOX=1"), "{msg}");
        // Bypass disabled by settings: nothing a session option changes.
        let settings = "the CLI refused: Cannot set permission mode to bypassPermissions \
                        because it is disabled by settings or configuration";
        assert_eq!(
            bypass_refused(Error::precondition(settings)).to_string(),
            settings
        );
    }
}
