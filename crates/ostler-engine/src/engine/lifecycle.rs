//! Session lifecycle: engine start (recovery of sessions left live), create, spawn,
//! resume, stop, delete, shutdown. Serialised per session by its entry's `lifecycle` lock.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ostler_store::{
    DecideOutcome, Decision, InteractionState, NewSession, SessionFilter, SessionPatch,
    SessionRecord, Store, WithEvents,
};
use ostler_supervisor::{Installation, SessionProcess, SpawnOptions};
use serde::{Deserialize, Serialize};

use super::{Engine, KNOWN_MODES};
use crate::actor::{Actor, ActorOptions};
use crate::blocking::blocking;
use crate::error::{Error, Result};
use crate::handle::{Meta, SessionEntry};
use crate::hub::{Item, now_ms};
use crate::permission::PermissionRule;
use crate::shared::{EngineOptions, Shared, SlotGuard};
use crate::types::*;

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
    /// Session rules and message ids, handed to the actor.
    meta: Meta,
}

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
        let engine = Engine::new(Shared::new(opts, store, installation, roots, gone), gone_tx);
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

    /// Makes a session the store shows live `resumable`. Each cancelled interaction commits
    /// with its `interaction_resolved` event, and the last one with the `state_changed`
    /// event and the state column: one store call (`Store::append_with`) for a session with
    /// at most one pending interaction. (`append_with` decides one interaction per call, so
    /// each further one costs a call of its own; no pair is ever split.)
    async fn mark_resumable(&self, rec: &SessionRecord) -> Result<()> {
        let entry = self.entry_for(&rec.id);
        let store = self.shared.store.clone();
        let sid = rec.id.clone();
        let mut pending = blocking(move || store.pending_interactions(Some(&sid))).await?;
        let cancel = |i: &ostler_store::Interaction| {
            let item = Item::new(EventPayload::InteractionResolved(InteractionResolved {
                request_id: i.request_id.clone(),
                kind: i.kind,
                resolution: Resolution::Cancelled {
                    reason: "the daemon restarted".into(),
                },
                decided_by: "engine".into(),
            }));
            let decision = Decision {
                state: InteractionState::Cancelled,
                decided_by: "engine".into(),
                response: None,
                decided_ms: now_ms(),
            };
            (item, (i.request_id.clone(), decision))
        };
        let state_changed = || {
            Item::new(EventPayload::StateChanged(StateChanged {
                from: rec.state,
                to: SessionState::Resumable,
                reason: Some("the daemon stopped while the session was live".into()),
            }))
        };
        let patch = || SessionPatch {
            state: Some(SessionState::Resumable),
            updated_ms: now_ms(),
            ..Default::default()
        };
        let last = pending.pop();
        for i in &pending {
            let (item, decide) = cancel(i);
            let with = WithEvents {
                decide: Some(decide),
                ..Default::default()
            };
            // Already decided (by nobody else at start, but the store is the authority):
            // nothing was written, nothing to add.
            entry.hub.emit_with(vec![item], with).await?;
        }
        let mut items = Vec::new();
        let mut decide = None;
        if let Some(i) = &last {
            let (item, d) = cancel(i);
            items.push(item);
            decide = Some(d);
        }
        items.push(state_changed());
        let with = WithEvents {
            decide,
            patch: Some(patch()),
            ..Default::default()
        };
        let (_, outcome) = entry.hub.emit_with(items, with).await?;
        if let Some(DecideOutcome::AlreadyDecided(_)) = outcome {
            // The decision lost, so nothing was written: the state change alone.
            let with = WithEvents {
                patch: Some(patch()),
                ..Default::default()
            };
            entry.hub.emit_with(vec![state_changed()], with).await?;
        }
        self.shared
            .counts
            .moved(Some(rec.state), Some(SessionState::Resumable));
        Ok(())
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
        let slot = self.acquire_slot("").await?;
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
                cli_release: Some(self.installation().version.to_string()),
                state: SessionState::Starting,
                labels: req.labels.clone(),
                created_ms: created,
            })
            .await?;
        if let Some(title) = crate::feed::title_for(&req) {
            self.shared.store.set_title(&id, &title).await?;
        }
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
            meta: Meta {
                rules: req.rules.clone(),
                messages: HashMap::new(),
            },
        };
        // The new process does not suspend itself before its first prompt is sent.
        let _spawning = super::demand::hold(&entry);
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
            claude_session_id,
            from,
            meta,
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
            self.installation(),
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
                let patch = SessionPatch {
                    state: Some(SessionState::Exited),
                    exit: Some(ostler_store::ExitInfo {
                        code: None,
                        signal: None,
                        reason: Some(reason.clone()),
                        at_ms: at,
                    }),
                    updated_ms: at,
                    ..Default::default()
                };
                let items = vec![
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
                        reason: Some(reason),
                    })),
                ];
                // The events, the state and the exit columns commit together.
                let with = WithEvents {
                    patch: Some(patch),
                    ..Default::default()
                };
                match entry.hub.emit_with(items, with).await {
                    Ok(_) => self
                        .shared
                        .counts
                        .moved(Some(from), Some(SessionState::Exited)),
                    Err(e) => {
                        tracing::error!(session = %entry.id, error = %e, "cannot record the spawn failure")
                    }
                }
                return Err(err);
            }
        };
        // The previous exit's stderr tail stays visible until this process exits.
        let stderr_tail = self
            .registry
            .handle(&entry.id)
            .and_then(|h| h.view().stderr_tail.clone());
        let handle = Actor::spawn(ActorOptions {
            shared: self.shared.clone(),
            entry: entry.clone(),
            process,
            events,
            cwd: cwd.to_path_buf(),
            state: from,
            claude_session_id,
            model,
            meta,
            slot,
            stderr_tail,
        })
        .await;
        self.registry.set_handle(&entry.id, handle);
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
        let entry = self.entry(session_id).await?;
        let _life = entry.lifecycle.lock().await;
        if let Some(h) = self.live_handle(session_id) {
            if !entry.suspending.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(Error::precondition(format!(
                    "session {session_id:?} is already running"
                )));
            }
            // Suspending right now: resume it once its process has ended.
            h.ended().await;
        }
        let rec = self.record(session_id).await?;
        self.resume_locked(&entry, rec, Some(opts)).await?;
        drop(_life);
        self.get_session(session_id).await
    }

    /// Resumes a `suspended` or `resumable` session for a call that needs its process (the
    /// caller holds the session's lifecycle lock). The conversation must still exist
    /// (`FailedPrecondition` otherwise), unless the session was last resumed with
    /// `fresh_if_missing`.
    pub(super) async fn resume_on_demand(
        &self,
        entry: &Arc<SessionEntry>,
        rec: SessionRecord,
    ) -> Result<()> {
        self.resume_locked(entry, rec, None).await
    }

    /// Respawns a session without a process, under its lifecycle lock. `opts`: the
    /// `ResumeSession` options; `None`: on demand (no fork; `fresh_if_missing` as the last
    /// resume recorded it).
    async fn resume_locked(
        &self,
        entry: &Arc<SessionEntry>,
        rec: SessionRecord,
        opts: Option<crate::capability::ResumeOptions>,
    ) -> Result<()> {
        let session_id: &str = &entry.id;
        let state: SessionState = rec.state;
        if state.is_live() {
            // Live in the store but no actor here: the daemon is restarting it right now.
            return Err(Error::precondition(format!(
                "session {session_id:?} is {state} in the store but has no process; retry"
            )));
        }
        let (spec, meta, last_fresh) = self.load_meta(entry).await?;
        let on_demand = opts.is_none();
        let opts = opts.unwrap_or(crate::capability::ResumeOptions {
            fork: false,
            fresh_if_missing: last_fresh,
        });
        let fork = opts.fork;
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
            entry,
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
        let slot = self.acquire_slot(session_id).await?;
        let how = if on_demand { " (on demand)" } else { "" };
        entry
            .hub
            .emit_one(EventPayload::EngineNotice(EngineNotice {
                code: "resuming".into(),
                message: match &resume {
                    Some(c) if fork => format!("resuming CLI session {c} as a fork{how}"),
                    Some(c) => format!("resuming CLI session {c}{how}"),
                    None => format!("no CLI session to resume: starting a fresh one{how}"),
                },
                data: Some(serde_json::json!({
                    "claude_session_id": resume,
                    "fork": fork,
                    "fresh_if_missing": opts.fresh_if_missing,
                    "on_demand": on_demand,
                })),
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
            meta,
        };
        self.spawn_actor(entry, launch, slot).await
    }

    /// Rebuilds a session's spec, rules and message ids from its log (one scan), and
    /// whether its last resume asked for `fresh_if_missing`.
    async fn load_meta(&self, entry: &Arc<SessionEntry>) -> Result<(SessionSpec, Meta, bool)> {
        let mut spec = SessionSpec::default();
        let mut meta = Meta::default();
        let mut fresh_if_missing = false;
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
                        if let Some(s) = n
                            .data
                            .and_then(|d| serde_json::from_value::<SessionSpec>(d).ok())
                        {
                            meta.rules.extend(s.rules.iter().cloned());
                            spec = s;
                        }
                    }
                    Ok(EventPayload::EngineNotice(n)) if n.code == "resuming" => {
                        fresh_if_missing = n
                            .data
                            .and_then(|d| d["fresh_if_missing"].as_bool())
                            .unwrap_or(false);
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
        Ok((spec, meta, fresh_if_missing))
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
        let Some(actor) = self.live_handle(&entry.id) else {
            if shutdown {
                return Ok(());
            }
            let rec = self.record(&entry.id).await?;
            return Err(Error::precondition(format!(
                "session {:?} is not running (it is {})",
                entry.id, rec.state
            )));
        };
        actor.stop(shutdown).await;
        Ok(())
    }

    /// `DeleteSession`: stops it if live, then deletes it with its history. Subscribers'
    /// streams end.
    pub async fn delete_session(&self, session_id: &str) -> Result<()> {
        let entry = self.entry(session_id).await?;
        let _life = entry.lifecycle.lock().await;
        if let Some(actor) = self.live_handle(session_id) {
            // No graceful wait: the history is going away.
            actor.stop(false).await;
        }
        let state = self.record(session_id).await?.state;
        self.shared.store.delete_session(session_id).await?;
        self.shared.counts.moved(Some(state), None);
        self.registry.remove(session_id);
        Ok(())
    }

    /// Stops every live session gracefully; they are recorded `resumable` and come back so
    /// at the next start. New sessions are refused from now on.
    pub async fn shutdown(&self) {
        self.shared.begin_shutdown();
        let entries: Vec<_> = self.registry.all().into_iter().map(|r| r.entry).collect();
        let stops = entries.iter().map(|e| self.stop_entry(e, true));
        futures::future::join_all(stops).await;
    }
}
