//! The engine handle, the session registry and the public API.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ostler_protocol::outbound::OutRequest;
use ostler_store::{
    Decision, InteractionState, NewSession, SessionFilter, SessionPatch, SessionRecord, Store,
};
use ostler_supervisor::{Installation, SessionProcess, SpawnOptions, SupervisorOptions};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use crate::actor::{Actor, ActorOptions, Command};
use crate::blocking::blocking;
use crate::counts::StateCounts;
use crate::error::{Error, Result};
use crate::hub::{Hub, Item, now_ms};
use crate::permission::PermissionRule;
pub use crate::subscribe::Subscription;
use crate::types::*;

/// Engine configuration.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Live sessions (with a CLI process) at most; more gives `ResourceExhausted`.
    pub max_live_sessions: usize,
    /// A session's cwd must lie under one of these (after canonicalisation). Empty: any
    /// existing directory.
    pub allowed_roots: Vec<PathBuf>,
    /// Permission rules from config (deny wins over allow).
    pub rules: Vec<PermissionRule>,
    /// Pending permission requests / questions are denied after this long. `None`: never.
    pub permission_expiry: Option<Duration>,
    /// Accept free-text (`other_text`) answers to questions that have options.
    pub allow_free_text_answers: bool,
    /// Per-session live buffer (events). A subscriber further behind continues from the store.
    pub broadcast_capacity: usize,
    /// Events read from the store per replay page.
    pub replay_page_size: usize,
    /// Respawn (with `--resume`) the sessions that were live when the daemon last stopped,
    /// instead of leaving them `resumable`.
    pub respawn_on_start: bool,
    /// Run the CLI with `--include-partial-messages` (needed for live partial deltas).
    pub partial_messages: bool,
    /// Environment given to every CLI process (after the supervisor's allowlist; wins).
    pub spawn_env: Vec<(String, String)>,
    /// Process policy (grace periods, control timeout, stall watchdog, ...).
    pub supervisor: SupervisorOptions,
    /// Keep the CLI's raw line next to the canonical payload (once per line; see
    /// docs/ARCHITECTURE.md). Off: only the canonical payload is stored (smaller; replay
    /// is unaffected, but the verbatim wire line is lost).
    pub store_raw_lines: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            max_live_sessions: 256,
            allowed_roots: Vec::new(),
            rules: Vec::new(),
            permission_expiry: None,
            allow_free_text_answers: false,
            broadcast_capacity: 256,
            replay_page_size: 512,
            respawn_on_start: false,
            partial_messages: true,
            spawn_env: Vec::new(),
            supervisor: SupervisorOptions::default(),
            store_raw_lines: true,
        }
    }
}

const KNOWN_MODES: &[&str] = &[
    "default",
    "acceptEdits",
    "plan",
    "bypassPermissions",
    "dontAsk",
];

/// What a session was created with (recorded in its first event, `session_created`), needed
/// to respawn it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct SessionSpec {
    #[serde(default)]
    allowed_tools: Vec<String>,
    #[serde(default)]
    disallowed_tools: Vec<String>,
    #[serde(default)]
    append_system_prompt: Option<String>,
    #[serde(default)]
    max_turns: Option<u32>,
    #[serde(default)]
    rules: Vec<PermissionRule>,
}

pub(crate) struct EngineShared {
    pub opts: EngineOptions,
    pub store: Store,
    installation: Installation,
    roots: Vec<PathBuf>,
    registry: Mutex<HashMap<String, Arc<SessionEntry>>>,
    live: AtomicUsize,
    /// Sessions per stored state (for health).
    pub counts: StateCounts,
    shutting_down: std::sync::atomic::AtomicBool,
    /// Becomes `true` when the last [`Engine`] handle is dropped.
    gone: tokio::sync::watch::Receiver<bool>,
}

impl EngineShared {
    pub(crate) fn alive(&self) -> tokio::sync::watch::Receiver<bool> {
        self.gone.clone()
    }

    pub(crate) fn installation_version(&self) -> &semver::Version {
        &self.installation.version
    }
}

/// Dropped with the last [`Engine`] handle: tells the actors.
struct Alive(tokio::sync::watch::Sender<bool>);

impl Drop for Alive {
    fn drop(&mut self) {
        let _ = self.0.send(true);
    }
}

/// A session known to this engine (created or touched since start).
pub(crate) struct SessionEntry {
    pub id: Arc<str>,
    pub hub: Arc<Hub>,
    actor: Mutex<Option<ActorHandle>>,
    /// Mirrors the actor's state while live.
    state: Mutex<Option<SessionState>>,
    /// Pending interactions: request id -> request event.
    pending: Mutex<BTreeMap<String, Arc<EngineEvent>>>,
    /// Session rules (from create + "remember"), and the spec; loaded from the log.
    meta: Mutex<Option<Meta>>,
    /// The stderr tail of the last exit seen by this engine (the store keeps no stderr).
    pub(crate) last_stderr: Mutex<Option<String>>,
    /// Serialises lifecycle changes (create/resume/stop/delete) of this session.
    lifecycle: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Meta {
    spec: SessionSpec,
    rules: Vec<PermissionRule>,
    messages: HashMap<String, u64>,
}

#[derive(Clone)]
struct ActorHandle {
    tx: mpsc::Sender<Command>,
    done: tokio::sync::watch::Receiver<bool>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl SessionEntry {
    fn new(id: &str, store: Store, capacity: usize) -> Self {
        let id: Arc<str> = Arc::from(id);
        Self {
            hub: Arc::new(Hub::new(id.clone(), store, capacity)),
            id,
            actor: Mutex::new(None),
            state: Mutex::new(None),
            pending: Mutex::new(BTreeMap::new()),
            meta: Mutex::new(None),
            last_stderr: Mutex::new(None),
            lifecycle: tokio::sync::Mutex::new(()),
        }
    }

    fn actor(&self) -> Option<ActorHandle> {
        lock(&self.actor).clone().filter(|a| !*a.done.borrow())
    }

    pub(crate) fn set_state(&self, s: SessionState) {
        *lock(&self.state) = Some(s);
    }

    pub(crate) fn set_pending(&self, request_id: &str, event: Option<Arc<EngineEvent>>) {
        let mut p = lock(&self.pending);
        match event {
            Some(e) => {
                p.insert(request_id.to_owned(), e);
            }
            None => {
                p.remove(request_id);
            }
        }
    }

    fn pending_events(&self) -> Vec<Arc<EngineEvent>> {
        let mut v: Vec<_> = lock(&self.pending).values().cloned().collect();
        v.sort_by_key(|e| e.seq);
        v
    }

    pub(crate) fn rules_snapshot(&self) -> Vec<PermissionRule> {
        lock(&self.meta)
            .as_ref()
            .map(|m| m.rules.clone())
            .unwrap_or_default()
    }

    pub(crate) fn add_rule(&self, rule: PermissionRule) {
        let mut m = lock(&self.meta);
        let m = m.get_or_insert_with(Meta::default);
        if !m.rules.contains(&rule) {
            m.rules.push(rule);
        }
    }

    pub(crate) fn message_seq(&self, client_message_id: &str) -> Option<u64> {
        lock(&self.meta)
            .as_ref()
            .and_then(|m| m.messages.get(client_message_id).copied())
    }

    pub(crate) fn remember_message(&self, client_message_id: String, seq: u64) {
        let mut m = lock(&self.meta);
        m.get_or_insert_with(Meta::default)
            .messages
            .insert(client_message_id, seq);
    }
}

/// A cheap, cloneable handle on the engine.
#[derive(Clone)]
pub struct Engine {
    shared: Arc<EngineShared>,
    _alive: Arc<Alive>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("store", &self.shared.store)
            .field("live", &self.shared.live.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

fn canonical_dir(field: &str, p: &Path) -> Result<PathBuf> {
    let c = std::fs::canonicalize(p)
        .map_err(|e| Error::invalid(field, format!("{}: {e}", p.display())))?;
    if !c.is_dir() {
        return Err(Error::invalid(
            field,
            format!("{} is not a directory", p.display()),
        ));
    }
    Ok(c)
}

const LIVE_STATES: [SessionState; 4] = [
    SessionState::Starting,
    SessionState::Idle,
    SessionState::Running,
    SessionState::AwaitingPermission,
];

impl Engine {
    /// Starts the engine on `store`, running sessions with `installation`.
    ///
    /// Sessions the store shows as live (the daemon stopped or died while they ran) become
    /// `resumable`: their pending interactions are cancelled, a `state_changed` event is
    /// recorded, and (only with `respawn_on_start`) they are resumed.
    pub async fn start(
        opts: EngineOptions,
        store: Store,
        installation: Installation,
    ) -> Result<Engine> {
        let allowed = opts.allowed_roots.clone();
        let roots = blocking(move || {
            allowed
                .iter()
                .map(|r| canonical_dir("allowed_roots", r))
                .collect::<Result<Vec<_>>>()
        })
        .await?;
        let (gone_tx, gone) = tokio::sync::watch::channel(false);
        let engine = Engine {
            shared: Arc::new(EngineShared {
                opts,
                store,
                installation,
                roots,
                registry: Mutex::new(HashMap::new()),
                live: AtomicUsize::new(0),
                counts: StateCounts::default(),
                shutting_down: std::sync::atomic::AtomicBool::new(false),
                gone,
            }),
            _alive: Arc::new(Alive(gone_tx)),
        };
        // The one listing of every stored session: counts per state (kept up to date from
        // here on by the writes of states) and the sessions left live.
        let mut stale = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let store = engine.shared.store.clone();
            let t = token.clone();
            let page = blocking(move || {
                store.list_sessions(&SessionFilter::default(), t.as_deref(), 1000)
            })
            .await?;
            for rec in page.sessions {
                let state = rec.state;
                engine.shared.counts.moved(None, Some(state));
                if LIVE_STATES.contains(&state) {
                    stale.push(rec);
                }
            }
            token = page.next_page_token;
            if token.is_none() {
                break;
            }
        }
        for rec in &stale {
            engine.mark_resumable(rec).await?;
        }
        if engine.shared.opts.respawn_on_start {
            for rec in &stale {
                if let Err(e) = engine.resume_session(&rec.id, false).await {
                    tracing::warn!(session = %rec.id, error = %e, "cannot respawn session at start");
                }
            }
        }
        tracing::info!(resumable = stale.len(), "engine started");
        Ok(engine)
    }

    async fn mark_resumable(&self, rec: &SessionRecord) -> Result<()> {
        let entry = self.entry_for(&rec.id);
        let from = rec.state;
        let decision = Decision {
            state: InteractionState::Cancelled,
            decided_by: "engine".into(),
            response: None,
            decided_ms: now_ms(),
        };
        let closed = self
            .shared
            .store
            .close_pending_interactions(Some(&rec.id), decision)
            .await?;
        let mut items: Vec<Item> = closed
            .iter()
            .map(|i| {
                Item::new(EventPayload::InteractionResolved(InteractionResolved {
                    request_id: i.request_id.clone(),
                    kind: match i.kind {
                        ostler_store::InteractionKind::Permission => InteractionKind::Permission,
                        ostler_store::InteractionKind::Question => InteractionKind::Question,
                    },
                    resolution: Resolution::Cancelled {
                        reason: "the daemon restarted".into(),
                    },
                    decided_by: "engine".into(),
                }))
            })
            .collect();
        items.push(Item::new(EventPayload::StateChanged(StateChanged {
            from,
            to: SessionState::Resumable,
            reason: Some("the daemon stopped while the session was live".into()),
        })));
        entry.hub.emit(items).await?;
        self.shared
            .store
            .update_session(
                &rec.id,
                SessionPatch {
                    state: Some(SessionState::Resumable),
                    updated_ms: now_ms(),
                    ..Default::default()
                },
            )
            .await?;
        self.shared
            .counts
            .moved(Some(rec.state), Some(SessionState::Resumable));
        Ok(())
    }

    fn entry_for(&self, id: &str) -> Arc<SessionEntry> {
        let mut reg = lock(&self.shared.registry);
        reg.entry(id.to_owned())
            .or_insert_with(|| {
                Arc::new(SessionEntry::new(
                    id,
                    self.shared.store.clone(),
                    self.shared.opts.broadcast_capacity,
                ))
            })
            .clone()
    }

    /// The entry of a session that exists in the store.
    async fn entry(&self, id: &str) -> Result<Arc<SessionEntry>> {
        if let Some(e) = lock(&self.shared.registry).get(id).cloned() {
            return Ok(e);
        }
        self.record(id).await?;
        Ok(self.entry_for(id))
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

    fn info(&self, rec: SessionRecord) -> SessionInfo {
        let entry = lock(&self.shared.registry).get(&rec.id).cloned();
        let live_state = entry
            .as_ref()
            .filter(|e| e.actor().is_some())
            .and_then(|e| *lock(&e.state));
        let pending = entry
            .as_ref()
            .map(|e| lock(&e.pending).len() as u32)
            .unwrap_or(0);
        let stderr_tail = entry
            .as_ref()
            .and_then(|e| lock(&e.last_stderr).clone())
            .unwrap_or_default();
        let state = live_state.unwrap_or(rec.state);
        SessionInfo {
            claude_session_id: rec.claude_session_id,
            cwd: PathBuf::from(rec.cwd),
            model: rec.model,
            permission_mode: rec.permission_mode,
            cli_release: rec.cli_release,
            state,
            labels: rec.labels,
            created_ms: rec.created_ms,
            updated_ms: rec.updated_ms,
            exit: rec.exit.map(|x| ExitStatus {
                code: x.code,
                signal: x.signal,
                reason: x.reason,
                stderr_tail,
                at_ms: x.at_ms,
            }),
            last_seq: rec.last_seq,
            pending_interactions: pending,
            turns: rec.turns,
            usage: UsageTotals {
                input_tokens: rec.usage.input_tokens,
                output_tokens: rec.usage.output_tokens,
                cache_creation_input_tokens: rec.usage.cache_creation_input_tokens,
                cache_read_input_tokens: rec.usage.cache_read_input_tokens,
                cost_usd: rec.usage.cost_usd,
            },
            id: rec.id,
        }
    }

    async fn validate_cwd(&self, cwd: &Path) -> Result<PathBuf> {
        if cwd.as_os_str().is_empty() {
            return Err(Error::invalid("cwd", "the working directory is required"));
        }
        if !cwd.is_absolute() {
            return Err(Error::invalid(
                "cwd",
                format!("{} is not an absolute path", cwd.display()),
            ));
        }
        let owned = cwd.to_path_buf();
        let c = blocking(move || canonical_dir("cwd", &owned)).await?;
        if !self.shared.roots.is_empty() && !self.shared.roots.iter().any(|r| c.starts_with(r)) {
            let roots: Vec<String> = self
                .shared
                .roots
                .iter()
                .map(|r| r.display().to_string())
                .collect();
            return Err(Error::invalid(
                "cwd",
                format!("{} is outside the allowed roots {roots:?}", c.display()),
            ));
        }
        Ok(c)
    }

    fn reserve_slot(&self) -> Result<SlotGuard> {
        if self.shared.shutting_down.load(Ordering::SeqCst) {
            return Err(Error::Unavailable("the engine is shutting down".into()));
        }
        let max = self.shared.opts.max_live_sessions;
        let r = self
            .shared
            .live
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            });
        match r {
            Ok(_) => Ok(SlotGuard {
                shared: Some(self.shared.clone()),
            }),
            Err(n) => Err(Error::ResourceExhausted {
                message: format!("{n} live sessions: the configured maximum is {max}"),
            }),
        }
    }

    /// `CreateSession`: validates, records, spawns the CLI, sends `first_prompt`.
    pub async fn create_session(&self, req: CreateSession) -> Result<SessionInfo> {
        let cwd = self.validate_cwd(&req.cwd).await?;
        if let Some(m) = &req.permission_mode
            && !KNOWN_MODES.contains(&m.as_str())
        {
            return Err(Error::invalid(
                "permission_mode",
                format!("unknown permission mode {m:?} (known: {KNOWN_MODES:?})"),
            ));
        }
        for (i, r) in req.rules.iter().enumerate() {
            r.validate().map_err(|e| match e {
                Error::InvalidArgument { message, .. } => {
                    Error::invalid(format!("rules[{i}]"), message)
                }
                e => e,
            })?;
        }
        if let Some(MessageContent::Text(t)) = &req.first_prompt
            && t.trim().is_empty()
        {
            return Err(Error::invalid("first_prompt", "the first prompt is empty"));
        }
        for (field, tools) in [
            ("allowed_tools", &req.allowed_tools),
            ("disallowed_tools", &req.disallowed_tools),
        ] {
            if let Some(bad) = tools
                .iter()
                .find(|t| t.trim().is_empty() || t.starts_with('-'))
            {
                return Err(Error::invalid(field, format!("bad tool rule {bad:?}")));
            }
        }
        let slot = self.reserve_slot()?;
        let id = uuid::Uuid::now_v7().to_string();
        let created = now_ms();
        self.shared
            .store
            .create_session(NewSession {
                id: id.clone(),
                claude_session_id: None,
                cwd: cwd.to_string_lossy().into_owned(),
                model: req.model.clone(),
                permission_mode: req.permission_mode.clone(),
                cli_release: Some(self.shared.installation.version.to_string()),
                state: SessionState::Starting,
                labels: req.labels.clone(),
                created_ms: created,
            })
            .await?;
        self.shared.counts.moved(None, Some(SessionState::Starting));
        let entry = self.entry_for(&id);
        let _life = entry.lifecycle.lock().await;
        let spec = SessionSpec {
            allowed_tools: req.allowed_tools.clone(),
            disallowed_tools: req.disallowed_tools.clone(),
            append_system_prompt: req.append_system_prompt.clone(),
            max_turns: req.max_turns,
            rules: req.rules.clone(),
        };
        *lock(&entry.meta) = Some(Meta {
            spec: spec.clone(),
            rules: req.rules.clone(),
            messages: HashMap::new(),
        });
        entry
            .hub
            .emit_one(EventPayload::EngineNotice(EngineNotice {
                code: SESSION_CREATED.into(),
                message: format!("session created in {}", cwd.display()),
                data: serde_json::to_value(&spec).ok(),
            }))
            .await?;
        let launch = Launch {
            cwd: &cwd,
            model: req.model.clone(),
            permission_mode: req.permission_mode.clone(),
            spec: &spec,
            resume: None,
            fork: false,
            claude_session_id: None,
            from: SessionState::Starting,
        };
        self.spawn_actor(&entry, launch, slot).await?;
        if let Some(content) = req.first_prompt {
            self.send_message(
                &id,
                SendMessage {
                    content,
                    client_message_id: None,
                    client: req.client,
                },
            )
            .await?;
        }
        drop(_life);
        self.get_session(&id).await
    }

    async fn spawn_actor(
        &self,
        entry: &Arc<SessionEntry>,
        launch: Launch<'_>,
        slot: SlotGuard,
    ) -> Result<()> {
        let Launch {
            cwd,
            model,
            permission_mode,
            spec,
            resume,
            fork,
            from,
            ..
        } = launch;
        let opts = SpawnOptions {
            cwd: cwd.to_path_buf(),
            model: model.clone(),
            permission_mode,
            allowed_tools: spec.allowed_tools.clone(),
            disallowed_tools: spec.disallowed_tools.clone(),
            append_system_prompt: spec.append_system_prompt.clone(),
            max_turns: spec.max_turns,
            resume,
            fork_session: fork,
            include_partial_messages: self.shared.opts.partial_messages,
            env: self.shared.opts.spawn_env.clone(),
            log_id: entry.id.to_string(),
        };
        let spawned = SessionProcess::spawn(
            &self.shared.installation,
            opts,
            self.shared.opts.supervisor.clone(),
        )
        .await;
        let (process, events) = match spawned {
            Ok(p) => p,
            Err(e) => {
                let err = Error::from(e);
                let reason = format!("the CLI could not be started: {err}");
                let at = now_ms();
                let _ = entry
                    .hub
                    .emit(vec![
                        Item::new(EventPayload::ProcessExited(ProcessExited {
                            status: ExitStatus {
                                reason: Some(reason.clone()),
                                at_ms: at,
                                ..Default::default()
                            },
                        })),
                        Item::new(EventPayload::StateChanged(StateChanged {
                            from,
                            to: SessionState::Exited,
                            reason: Some(reason.clone()),
                        })),
                    ])
                    .await;
                let exited = self
                    .shared
                    .store
                    .update_session(
                        &entry.id,
                        SessionPatch {
                            state: Some(SessionState::Exited),
                            exit: Some(ostler_store::ExitInfo {
                                code: None,
                                signal: None,
                                reason: Some(reason),
                                at_ms: at,
                            }),
                            updated_ms: at,
                            ..Default::default()
                        },
                    )
                    .await;
                if exited.is_ok() {
                    self.shared
                        .counts
                        .moved(Some(from), Some(SessionState::Exited));
                }
                return Err(err);
            }
        };
        let (done_tx, done_rx) = tokio::sync::watch::channel(false);
        let (mut actor, tx) = Actor::new(ActorOptions {
            shared: self.shared.clone(),
            entry: entry.clone(),
            process: process.clone(),
            events,
            cwd: cwd.to_path_buf(),
            state: from,
            claude_session_id: launch.claude_session_id,
            model,
        });
        *lock(&entry.pending) = BTreeMap::new();
        entry.set_state(from);
        *lock(&entry.actor) = Some(ActorHandle { tx, done: done_rx });
        // Idle before the call returns: CreateSession / ResumeSession report a live state.
        actor.start(process.pid()).await;
        tokio::spawn(async move {
            actor.run().await;
            drop(slot);
            let _ = done_tx.send(true);
        });
        Ok(())
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

    async fn live_actor(&self, id: &str) -> Result<(Arc<SessionEntry>, ActorHandle)> {
        let entry = self.entry(id).await?;
        match entry.actor() {
            Some(a) => Ok((entry, a)),
            None => {
                let rec = self.record(id).await?;
                Err(Error::precondition(format!(
                    "session {id:?} is {} (no CLI process); resume it first",
                    rec.state
                )))
            }
        }
    }

    async fn call<T>(
        &self,
        id: &str,
        make: impl FnOnce(oneshot::Sender<Result<T>>) -> Command,
    ) -> Result<T> {
        let (_, actor) = self.live_actor(id).await?;
        let (tx, rx) = oneshot::channel();
        actor
            .tx
            .send(make(tx))
            .await
            .map_err(|_| Error::precondition(format!("session {id:?} has just ended")))?;
        rx.await
            .map_err(|_| Error::precondition(format!("session {id:?} ended before answering")))?
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
        if msg.client_message_id.as_deref() == Some("") {
            return Err(Error::invalid(
                "client_message_id",
                "empty id (omit it instead)",
            ));
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
        let redeliver = entry
            .pending_events()
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

    /// `RespondToPermission`. The first valid response wins; later ones get
    /// `FailedPrecondition` with `decided_by` naming who decided.
    pub async fn respond_permission(
        &self,
        session_id: &str,
        request_id: &str,
        response: PermissionResponse,
        client: ClientRef,
    ) -> Result<Decided> {
        if let Err(e) = self.live_actor(session_id).await {
            return Err(self
                .decided_elsewhere(session_id, request_id)
                .await
                .unwrap_or(e));
        }
        let rid = request_id.to_owned();
        self.call(session_id, |reply| Command::Respond {
            request_id: rid,
            response,
            client,
            reply,
        })
        .await
    }

    /// For a session without a process: the interaction's final state, as an error.
    async fn decided_elsewhere(&self, session_id: &str, request_id: &str) -> Option<Error> {
        let store = self.shared.store.clone();
        let (sid, rid) = (session_id.to_owned(), request_id.to_owned());
        match blocking(move || store.interaction(&sid, &rid)).await {
            Ok(i) if i.state.is_final() => {
                let by = i.decided_by.clone().unwrap_or_else(|| "unknown".into());
                Some(Error::FailedPrecondition {
                    message: format!("request {request_id:?} was already {} by {by}", i.state),
                    decided_by: Some(by),
                })
            }
            Ok(_) => None,
            Err(Error::NotFound { .. }) => Some(Error::not_found(format!(
                "permission request or question {request_id:?} in session {session_id:?}"
            ))),
            Err(_) => None,
        }
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
        if let Err(e) = self.live_actor(session_id).await {
            return Err(self
                .decided_elsewhere(session_id, request_id)
                .await
                .unwrap_or(e));
        }
        let rid = request_id.to_owned();
        self.call(session_id, |reply| Command::Answer {
            request_id: rid,
            answers,
            client,
            reply,
        })
        .await
    }

    /// Pending permission requests and questions of a session, oldest first.
    pub async fn pending_interactions(&self, session_id: &str) -> Result<Vec<PendingInteraction>> {
        let entry = self.entry(session_id).await?;
        Ok(entry
            .pending_events()
            .into_iter()
            .filter_map(|e| {
                let (request_id, kind) = match &e.payload {
                    EventPayload::PermissionRequested(p) => {
                        (p.request_id.clone(), InteractionKind::Permission)
                    }
                    EventPayload::QuestionAsked(q) => {
                        (q.request_id.clone(), InteractionKind::Question)
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
        crate::capability::check_control(&self.shared.installation, &request)?;
        self.call(id, |reply| Command::Control { request, reply })
            .await
    }

    /// `Interrupt`: interrupts the running turn.
    pub async fn interrupt(&self, session_id: &str) -> Result<()> {
        self.control(session_id, OutRequest::Interrupt).await
    }

    /// `SetModel` (`None` resets to the default model).
    pub async fn set_model(&self, session_id: &str, model: Option<String>) -> Result<()> {
        let model = model.filter(|m| !m.trim().is_empty());
        self.control(session_id, OutRequest::SetModel(model)).await
    }

    /// `SetPermissionMode`.
    pub async fn set_permission_mode(&self, session_id: &str, mode: String) -> Result<()> {
        if !KNOWN_MODES.contains(&mode.as_str()) {
            return Err(Error::invalid(
                "mode",
                format!("unknown permission mode {mode:?} (known: {KNOWN_MODES:?})"),
            ));
        }
        self.control(session_id, OutRequest::SetPermissionMode(mode))
            .await
    }

    /// `StopSession`: graceful stop (stdin closed, then SIGTERM/SIGKILL after the grace
    /// periods). Returns once the process has exited; the session is `stopped` (resumable).
    pub async fn stop_session(&self, session_id: &str) -> Result<SessionInfo> {
        let entry = self.entry(session_id).await?;
        let _life = entry.lifecycle.lock().await;
        self.stop_entry(&entry, false).await?;
        drop(_life);
        self.get_session(session_id).await
    }

    async fn stop_entry(&self, entry: &Arc<SessionEntry>, shutdown: bool) -> Result<()> {
        let Some(actor) = entry.actor() else {
            if shutdown {
                return Ok(());
            }
            let rec = self.record(&entry.id).await?;
            return Err(Error::precondition(format!(
                "session {:?} is not running (it is {})",
                entry.id, rec.state
            )));
        };
        let (tx, rx) = oneshot::channel();
        if actor
            .tx
            .send(Command::Stop {
                reply: tx,
                shutdown,
            })
            .await
            .is_ok()
        {
            let _ = rx.await;
        }
        let mut done = actor.done.clone();
        let _ = done.wait_for(|d| *d).await;
        Ok(())
    }

    /// `ResumeSession`: respawns the CLI with `--resume <claude session id>` (plus
    /// `--fork-session` when `fork`) in the same cwd; events continue on the same ostler
    /// session (seq continues).
    pub async fn resume_session(
        &self,
        session_id: &str,
        opts: impl Into<crate::capability::ResumeOptions>,
    ) -> Result<SessionInfo> {
        let opts = opts.into();
        let fork = opts.fork;
        let entry = self.entry(session_id).await?;
        let _life = entry.lifecycle.lock().await;
        if entry.actor().is_some() {
            return Err(Error::precondition(format!(
                "session {session_id:?} is already running"
            )));
        }
        let rec = self.record(session_id).await?;
        let state: SessionState = rec.state;
        if state.is_live() {
            // Live in the store but no actor here: the daemon is restarting it right now.
            return Err(Error::precondition(format!(
                "session {session_id:?} is {state} in the store but has no process; retry"
            )));
        }
        let slot = self.reserve_slot()?;
        self.load_meta(&entry).await?;
        let spec = lock(&entry.meta)
            .as_ref()
            .map(|m| m.spec.clone())
            .unwrap_or_default();
        let cwd = PathBuf::from(&rec.cwd);
        let dir = cwd.clone();
        if !blocking(move || Ok::<_, Error>(dir.is_dir())).await? {
            return Err(Error::precondition(format!(
                "the session's directory {} no longer exists",
                cwd.display()
            )));
        }
        let resume = crate::capability::resume_checked(
            &self.shared.opts.spawn_env,
            &entry,
            rec.claude_session_id.clone(),
            opts,
        )
        .await?;
        if resume.is_none() && fork {
            return Err(Error::precondition(format!(
                "session {session_id:?} never started a conversation: nothing to fork"
            )));
        }
        let fork = fork && resume.is_some();
        entry
            .hub
            .emit_one(EventPayload::EngineNotice(EngineNotice {
                code: "resuming".into(),
                message: match &resume {
                    Some(c) if fork => format!("resuming CLI session {c} as a fork"),
                    Some(c) => format!("resuming CLI session {c}"),
                    None => "no CLI session to resume: starting a fresh one".into(),
                },
                data: Some(serde_json::json!({ "claude_session_id": resume, "fork": fork })),
            }))
            .await?;
        let model = rec.model.clone().filter(|m| m != "default");
        let launch = Launch {
            cwd: &cwd,
            model,
            permission_mode: rec.permission_mode.clone(),
            spec: &spec,
            resume: resume.clone(),
            fork,
            claude_session_id: if fork { None } else { resume },
            from: state,
        };
        self.spawn_actor(&entry, launch, slot).await?;
        drop(_life);
        self.get_session(session_id).await
    }

    /// Rebuilds a session's spec, rules and message ids from its log (once per engine).
    async fn load_meta(&self, entry: &Arc<SessionEntry>) -> Result<()> {
        if lock(&entry.meta).is_some() {
            return Ok(());
        }
        let mut meta = Meta::default();
        let mut after = 0u64;
        let page = self.shared.opts.replay_page_size.max(1);
        loop {
            let store = self.shared.store.clone();
            let sid = entry.id.clone();
            let events = blocking(move || store.events_after(&sid, after, page)).await?;
            let n = events.len();
            for ev in events {
                after = ev.seq;
                if &*ev.kind != "engine_notice" && &*ev.kind != "user_message_sent" {
                    continue;
                }
                match EventPayload::decode_stored(&ev.kind, &ev.payload) {
                    Ok(EventPayload::EngineNotice(n)) if n.code == SESSION_CREATED => {
                        if let Some(spec) = n
                            .data
                            .and_then(|d| serde_json::from_value::<SessionSpec>(d).ok())
                        {
                            meta.rules.extend(spec.rules.iter().cloned());
                            meta.spec = spec;
                        }
                    }
                    Ok(EventPayload::EngineNotice(n)) if n.code == "rule_added" => {
                        if let Some(rule) = n
                            .data
                            .and_then(|d| serde_json::from_value::<PermissionRule>(d).ok())
                            && !meta.rules.contains(&rule)
                        {
                            meta.rules.push(rule);
                        }
                    }
                    Ok(EventPayload::UserMessageSent(u)) => {
                        if let Some(id) = u.client_message_id {
                            meta.messages.entry(id).or_insert(ev.seq);
                        }
                    }
                    _ => {}
                }
            }
            if n < page {
                break;
            }
        }
        let mut m = lock(&entry.meta);
        if m.is_none() {
            *m = Some(meta);
        }
        Ok(())
    }

    /// `DeleteSession`: stops it if live, then deletes it with its history. Subscribers'
    /// streams end.
    pub async fn delete_session(&self, session_id: &str) -> Result<()> {
        let entry = self.entry(session_id).await?;
        let _life = entry.lifecycle.lock().await;
        if let Some(actor) = entry.actor() {
            // No graceful wait: the history is going away.
            let (tx, rx) = oneshot::channel();
            if actor
                .tx
                .send(Command::Stop {
                    reply: tx,
                    shutdown: false,
                })
                .await
                .is_ok()
            {
                let _ = rx.await;
            }
            let mut done = actor.done.clone();
            let _ = done.wait_for(|d| *d).await;
        }
        let state = self.record(session_id).await?.state;
        self.shared.store.delete_session(session_id).await?;
        self.shared.counts.moved(Some(state), None);
        lock(&self.shared.registry).remove(session_id);
        Ok(())
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
            .map_err(|e| e.to_string());
        let pending = lock(&self.shared.registry)
            .values()
            .map(|e| lock(&e.pending).len() as u64)
            .sum();
        Ok(HealthReport {
            sessions_by_state: self.shared.counts.snapshot(),
            pending_interactions: pending,
            store: store_status,
            live_sessions: self.shared.live.load(Ordering::SeqCst) as u64,
            max_live_sessions: self.shared.opts.max_live_sessions as u64,
        })
    }

    /// Stops every live session gracefully; they are recorded `resumable` and come back so
    /// at the next start. New sessions are refused from now on.
    pub async fn shutdown(&self) {
        self.shared.shutting_down.store(true, Ordering::SeqCst);
        let entries: Vec<_> = lock(&self.shared.registry).values().cloned().collect();
        let stops = entries.iter().map(|e| self.stop_entry(e, true));
        futures::future::join_all(stops).await;
    }
}

pub(crate) const SESSION_CREATED: &str = "session_created";

/// How to start a session's CLI process and actor.
struct Launch<'a> {
    cwd: &'a Path,
    model: Option<String>,
    permission_mode: Option<String>,
    spec: &'a SessionSpec,
    /// `--resume` this CLI session.
    resume: Option<String>,
    fork: bool,
    /// The CLI session the actor starts with (none for a fork: the CLI assigns one).
    claude_session_id: Option<String>,
    /// The session's state before this process.
    from: SessionState,
}

/// A reserved live-session slot, released when dropped.
pub(crate) struct SlotGuard {
    shared: Option<Arc<EngineShared>>,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if let Some(s) = self.shared.take() {
            s.live.fetch_sub(1, Ordering::SeqCst);
        }
    }
}
