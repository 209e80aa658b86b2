//! Session lifecycle: engine start (recovery of sessions left live), create, spawn,
//! resume, stop, delete, shutdown. Serialised per session by its entry's `lifecycle` lock.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ostler_store::{
    DecideOutcome, NewSession, SessionFilter, SessionPatch, SessionRecord, Store, WithEvents,
};
use ostler_supervisor::{CliOptions, Installation, SessionProcess, SpawnOptions};
use serde::{Deserialize, Serialize};

use super::{Engine, KNOWN_MODES};
use crate::actor::{Actor, ActorOptions, DELIVERY_FAILED, GuardedCut, RESUME_REFUSED};
use crate::blocking::blocking;
use crate::error::{Error, Result};
use crate::handle::{Meta, SessionEntry};
use crate::hub::{Item, now_ms};
use crate::permission::PermissionRule;
use crate::shared::{EngineOptions, Shared, SlotGuard};
use crate::types::*;

/// What a session was created with (recorded in its first event, `session_created`), needed
/// to respawn it: its CLI options (flattened: the field names of older payloads, which
/// still read) and its rules. The live model and permission mode come from the session's
/// record (`SetModel` / `SetPermissionMode` change them).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct SessionSpec {
    #[serde(flatten)]
    pub(super) options: CliOptions,
    #[serde(default)]
    rules: Vec<PermissionRule>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    origin: Option<Origin>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    enable_file_checkpointing: bool,
}

/// The `session_created` data key of the labels the session was created with.
const CREATED_LABELS: &str = "labels";
/// The `session_created` data key saying the client gave the session its title (`true`).
const CREATED_TITLED: &str = "titled";

/// The fields (as clients name them) in which two specs differ: `model, rules`.
fn differing_fields(a: &SessionSpec, b: &SessionSpec) -> String {
    const SHOWN: usize = 8;
    let object = |s: &SessionSpec| match serde_json::to_value(s) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    let (a, b) = (object(a), object(b));
    let mut keys: Vec<&String> = a
        .keys()
        .chain(b.keys().filter(|k| !a.contains_key(*k)))
        .filter(|k| a.get(*k) != b.get(*k))
        .collect();
    keys.sort();
    if keys.is_empty() {
        return "options or rules".to_owned();
    }
    let more = keys.len().saturating_sub(SHOWN);
    let mut text = keys
        .iter()
        .take(SHOWN)
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    text
}

/// Creates with a client-chosen session id, serialised per id: without it, two identical
/// calls at once both found no session, and the slower one got the store's "already
/// exists" (or found the other's session half made) instead of the session.
#[derive(Debug, Default)]
pub(crate) struct CreateLocks(std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl CreateLocks {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<tokio::sync::Mutex<()>>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) async fn lock(self: &Arc<Self>, id: &str) -> CreateGuard {
        let lock = Arc::clone(self.map().entry(id.to_owned()).or_default());
        let guard = lock.lock_owned().await;
        CreateGuard {
            locks: Arc::clone(self),
            id: id.to_owned(),
            guard: Some(guard),
        }
    }
}

/// One create's hold on its id; the id's entry goes with the last holder or waiter.
pub(crate) struct CreateGuard {
    locks: Arc<CreateLocks>,
    id: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for CreateGuard {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self.locks.map();
        if map.get(&self.id).is_some_and(|l| Arc::strong_count(l) == 1) {
            map.remove(&self.id);
        }
    }
}

/// What a session's last resume (its last `resuming` notice) asked for, as far as a resume
/// on demand must ask for it again.
#[derive(Debug, Default)]
struct LastResume {
    fresh_if_missing: bool,
    /// The CLI conversation it forked, when it forked.
    fork_of: Option<String>,
    at_message_id: Option<String>,
    drops_turn_message_id: Option<String>,
    /// A message was sent after it.
    message_since: bool,
}

impl LastResume {
    /// The options of a resume on demand. A fork that has made no conversation of its own
    /// yet (the session still names the conversation it forked: nothing was written to the
    /// fork before its process ended) forks again, and a resume at a message that no
    /// message has followed is made at that message again: otherwise the conversation
    /// would continue where the client asked it not to.
    fn on_demand(&self, current: Option<&str>) -> crate::capability::ResumeOptions {
        crate::capability::ResumeOptions {
            fresh_if_missing: self.fresh_if_missing,
            fork: self.fork_of.is_some() && self.fork_of.as_deref() == current,
            at_message_id: if self.message_since {
                None
            } else {
                self.at_message_id.clone()
            },
            drops_turn_message_id: if self.message_since {
                None
            } else {
                self.drops_turn_message_id.clone()
            },
        }
    }
}

/// How a create with an [`Origin`] starts its CLI.
struct OriginPlan {
    /// `--resume` this CLI session.
    resume: String,
    fork: bool,
    /// `--resume-session-at` value (a fork at a message).
    resume_at: Option<String>,
    /// `--resume-drops-turn` value (a guarded fork at a message).
    drops_turn: Option<String>,
    /// The guarded cut as the client named it.
    guard: Option<GuardedCut>,
    /// Recorded in the `session_created` notice (`fork_point`).
    fork_point: Option<serde_json::Value>,
}

/// Longest client-chosen session id.
pub const SESSION_ID_BYTES: usize = 128;

/// A client-chosen session id: 1 to [`SESSION_ID_BYTES`] letters, digits, `-`, `_`, `.`,
/// not starting with `-` or `.`.
fn validate_session_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= SESSION_ID_BYTES
        && !id.starts_with(['-', '.'])
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            "session_id",
            format!(
                "{} is not a session id (1 to {SESSION_ID_BYTES} letters, digits, `-`, `_` or \
                 `.`, not starting with `-` or `.`)",
                ostler_supervisor::options::shown(id)
            ),
        ))
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

/// What the running release must accept of a session's options, checked at create and
/// again at every resume (the daemon may run another release by then): `FailedPrecondition`
/// naming every option it lacks, before anything is recorded or spawned.
fn release_checks(inst: &Installation, options: &CliOptions) -> Result<()> {
    let unsupported = options.unsupported_by(&inst.capabilities);
    if let Some((flag, field)) = unsupported.first() {
        let others = unsupported
            .iter()
            .skip(1)
            .map(|(f, o)| format!("`{o}` (`{f}`)"))
            .collect::<Vec<_>>();
        let also = if others.is_empty() {
            String::new()
        } else {
            format!("; nor {}", others.join(", "))
        };
        return Err(Error::precondition(format!(
            "Claude Code {} does not accept `{flag}`, which the session option `{field}` \
             needs{also} (measured: see docs/compatibility.md); leave them unset or use a \
             newer release",
            inst.version,
        )));
    }
    if !options.hooks.is_empty() {
        crate::capability::check_hooks(inst, &options.hooks)?;
    }
    crate::capability::check_tool_servers(inst, options)?;
    crate::capability::check_outputs(inst, options)?;
    crate::capability::check_init_fields(inst, options)?;
    crate::capability::check_verbatim_prompts(inst, options)?;
    crate::capability::check_policies(inst, options.managed_settings.is_some())?;
    Ok(())
}

/// `enable_file_checkpointing` is for `RewindFiles`: refused up front on a release that
/// cannot serve `rewind_files`, not found out once files have changed.
fn check_checkpointing(inst: &Installation, enabled: bool) -> Result<()> {
    if enabled && !inst.capabilities.control_support("rewind_files").served() {
        return Err(Error::precondition(format!(
            "Claude Code {} cannot serve the `rewind_files` control request, which \
             `enable_file_checkpointing` is for (see docs/compatibility.md); leave it unset or \
             use a newer release",
            inst.version
        )));
    }
    Ok(())
}

const LIVE_STATES: [SessionState; 4] = [
    SessionState::Starting,
    SessionState::Idle,
    SessionState::Running,
    SessionState::AwaitingPermission,
];

pub(crate) const SESSION_CREATED: &str = "session_created";

/// Code of the notice recorded before a session's next process is spawned.
pub(crate) const RESUMING: &str = "resuming";

/// Code of the notice recorded when a session is resumed by another CLI release than the
/// one it last ran.
pub(crate) const CLI_RELEASE_CHANGED: &str = "cli_release_changed";

/// How to start a session's CLI process and actor.
struct Launch<'a> {
    cwd: &'a Path,
    model: Option<String>,
    permission_mode: Option<String>,
    spec: &'a SessionSpec,
    /// `--resume` this CLI session.
    resume: Option<String>,
    fork: bool,
    /// `--resume-session-at`: where `resume` is cut, in the release's dialect.
    resume_at: Option<String>,
    /// `--resume-drops-turn`: the prompt uuid of the one turn the cut may drop.
    drops_turn: Option<String>,
    /// That guarded cut as the client named it (for the record of a refusal).
    guard: Option<GuardedCut>,
    /// The CLI session the actor starts with (none for a fork: the CLI assigns one).
    claude_session_id: Option<String>,
    /// The session's state before this process.
    from: SessionState,
    /// Session rules and message ids, handed to the actor.
    meta: Meta,
    /// `title` for `initialize` (`SpawnOptions::title`): the client's title, at create and
    /// fork only.
    title: Option<String>,
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
            // A hook call takes its registration's default (issue 11).
            if i.kind == InteractionKind::Hook {
                return crate::actor::hook_restart_resolution(i);
            }
            if i.kind == InteractionKind::ToolCall {
                return super::tools::resolved_at_restart(i);
            }
            if i.kind == InteractionKind::Elicitation {
                return super::tools::elicitation_at_restart(i);
            }
            if i.kind == InteractionKind::Dialog {
                return super::tools::dialog_at_restart(i);
            }
            let item = Item::new(EventPayload::InteractionResolved(InteractionResolved {
                request_id: i.request_id.clone(),
                kind: i.kind,
                resolution: Resolution::Cancelled {
                    reason: "the daemon restarted".into(),
                },
                decided_by: "engine".into(),
            }));
            (item, super::tools::cancelled(i, "engine"))
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
        self.validate_dir("cwd", cwd).await
    }

    /// An absolute path to a directory under the allowed roots, made canonical.
    pub(super) async fn validate_dir(&self, field: &str, cwd: &Path) -> Result<PathBuf> {
        if !cwd.is_absolute() {
            return Err(Error::invalid(
                field,
                format!("{} is not an absolute path", cwd.display()),
            ));
        }
        let owned = cwd.to_path_buf();
        let f = field.to_owned();
        let c = blocking(move || canonical_dir(&f, &owned)).await?;
        if let Some(roots) = self.outside_roots(&c) {
            return Err(Error::invalid(
                field,
                format!("{} is outside the allowed roots {roots}", c.display()),
            ));
        }
        Ok(c)
    }

    /// The allowed roots, listed for a message, when `dir` (canonical) lies under none of
    /// them; `None` when it lies under one or no roots are set.
    fn outside_roots(&self, dir: &Path) -> Option<String> {
        crate::shared::outside_roots(&self.shared.roots, dir)
    }

    /// A directory recorded at create (made canonical then), before a resume: it must still
    /// be a directory, still be itself (not replaced by a link to elsewhere) and still lie
    /// under the allowed roots. `FailedPrecondition` otherwise: the session's own state.
    async fn recheck_dir(&self, what: &str, dir: &Path) -> Result<()> {
        let (what, owned, roots) = (
            what.to_owned(),
            dir.to_path_buf(),
            self.shared.roots.clone(),
        );
        let astray =
            blocking(move || Ok::<_, Error>(crate::shared::dir_astray(&what, &owned, &roots)))
                .await?;
        match astray {
            Some(why) => Err(Error::precondition(why)),
            None => Ok(()),
        }
    }

    /// Checks a create request and returns its spec (add_dirs made canonical), before
    /// anything is created: `InvalidArgument` naming the field, `FailedPrecondition` for an
    /// option the running release lacks.
    async fn create_spec(&self, req: &CreateSession) -> Result<SessionSpec> {
        if let Some(m) = &req.options.permission_mode
            && !KNOWN_MODES.contains(&m.as_str())
        {
            return Err(Error::invalid(
                "permission_mode",
                format!(
                    "unknown permission mode {} (known: {KNOWN_MODES:?})",
                    ostler_supervisor::options::shown(m)
                ),
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
        req.options
            .validate()
            .map_err(|e| Error::invalid(e.field, e.message))?;
        if let Some(daemon) = &self.shared.opts.managed_settings {
            // What the CLI will get: the session's policy merged into the daemon's.
            CliOptions {
                managed_settings: ostler_supervisor::options::merge_managed_settings(
                    Some(daemon),
                    req.options.managed_settings.as_deref(),
                ),
                ..req.options.clone()
            }
            .validate()
            .map_err(|e| {
                Error::invalid(
                    e.field,
                    format!(
                        "{} (with the daemon's sessions.managed_settings)",
                        e.message
                    ),
                )
            })?;
        }
        let mut options = req.options.clone();
        // Extra directories obey the same roots as the working directory; a settings file
        // must exist (else the CLI exits at start).
        for (field, list) in [
            ("add_dirs", &mut options.add_dirs),
            ("plugin_dirs", &mut options.plugin_dirs),
        ] {
            for (i, d) in std::mem::take(list).iter().enumerate() {
                let c = self
                    .validate_dir(&format!("{field}[{i}]"), Path::new(d))
                    .await?;
                list.push(c.to_string_lossy().into_owned());
            }
        }
        // The trusted checkout the project's configuration comes from: checked like the
        // working directory, recorded canonical (rechecked at every resume).
        if let Some(root) = options.project_config_root.take() {
            let c = self
                .validate_dir("project_config_root", Path::new(&root))
                .await?;
            options.project_config_root = Some(c.to_string_lossy().into_owned());
        }
        if let Some(path) = options.settings.clone().filter(|s| s.starts_with('/')) {
            let is_file = blocking(move || Ok::<_, Error>(Path::new(&path).is_file())).await?;
            if !is_file {
                return Err(Error::invalid(
                    "settings",
                    "is not inline JSON and no settings file exists at that path",
                ));
            }
        }
        release_checks(self.installation(), &options)?;
        self.start_checks(&options)?;
        check_checkpointing(self.installation(), req.enable_file_checkpointing)?;
        Ok(SessionSpec {
            options,
            rules: req.rules.clone(),
            origin: req.origin.clone(),
            enable_file_checkpointing: req.enable_file_checkpointing,
        })
    }

    /// Checks where the conversation of a create comes from: the CLI conversation to
    /// resume (its transcript must exist), and for a fork the fork point.
    async fn plan_origin(
        &self,
        origin: &Origin,
        cwd: &Path,
        options: &CliOptions,
    ) -> Result<OriginPlan> {
        let env = crate::capability::session_env(&self.shared.opts.spawn_env, options);
        let transcript = |cid: String, what: String| {
            let env = env.clone();
            async move {
                let c = cid.clone();
                match blocking(move || crate::capability::resume_plan(&env, "", c, false)).await {
                    Ok(_) => Ok(cid),
                    Err(Error::FailedPrecondition { .. }) => Err(Error::precondition(format!(
                        "cannot start by {what}: the CLI's transcript of conversation {cid} \
                         is not in the Claude configuration the session's CLI would use \
                         (CLAUDE_CONFIG_DIR, else HOME/.claude, of the session's environment, \
                         then the daemon's: its projects/), so the CLI would exit with \
                         \"No conversation found\""
                    ))),
                    Err(e) => Err(e),
                }
            }
        };
        match origin {
            Origin::Adopt { claude_session_id } => {
                let ok = !claude_session_id.is_empty()
                    && claude_session_id.len() <= SESSION_ID_BYTES
                    && claude_session_id
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-');
                if !ok {
                    return Err(Error::invalid(
                        "adopt_claude_session_id",
                        format!(
                            "{} is not a CLI session id (letters, digits and `-`)",
                            ostler_supervisor::options::shown(claude_session_id)
                        ),
                    ));
                }
                let resume = transcript(
                    claude_session_id.clone(),
                    format!("adopting CLI conversation {claude_session_id}"),
                )
                .await?;
                Ok(OriginPlan {
                    resume,
                    fork: false,
                    resume_at: None,
                    drops_turn: None,
                    guard: None,
                    fork_point: None,
                })
            }
            Origin::Fork {
                session_id,
                at_message_id,
                drops_turn_message_id,
            } => {
                if drops_turn_message_id.is_some() && at_message_id.is_none() {
                    return Err(Error::invalid(
                        "fork_drops_turn_message_id",
                        "only with fork_at_message_id (it guards that cut)",
                    ));
                }
                validate_session_id(session_id)
                    .map_err(|_| Error::invalid("fork_from_session_id", "is not a session id"))?;
                let source = self.get_session(session_id).await?;
                if Path::new(&source.cwd) != cwd {
                    return Err(Error::invalid(
                        "cwd",
                        format!(
                            "a fork runs in its source's directory {} (the CLI keeps \
                             conversations per directory)",
                            source.cwd
                        ),
                    ));
                }
                let Some(cid) = source.claude_session_id.clone() else {
                    return Err(Error::precondition(format!(
                        "session {session_id:?} never started a CLI conversation: nothing to fork"
                    )));
                };
                let inst = self.installation();
                if !inst.capabilities.fork_session {
                    return Err(Error::precondition(format!(
                        "Claude Code {} has no `--fork-session` (measured: see \
                         docs/compatibility.md); use a newer release to fork",
                        inst.version
                    )));
                }
                let resume = transcript(cid, format!("forking session {session_id}")).await?;
                let resume_at = match at_message_id {
                    Some(at) => Some(
                        self.resume_at(&env, &resume, "fork_at_message_id", at)
                            .await?,
                    ),
                    None => None,
                };
                let drops_turn = match drops_turn_message_id {
                    Some(turn) => Some(
                        self.drops_turn(&env, &resume, "fork_drops_turn_message_id", turn)
                            .await?,
                    ),
                    None => None,
                };
                let mut point = serde_json::json!({
                    "session_id": session_id,
                    "seq": source.last_seq,
                    "claude_session_id": resume,
                });
                if let Some(at) = at_message_id {
                    point["at_message_id"] = at.as_str().into();
                }
                if let Some(turn) = drops_turn_message_id {
                    point["drops_turn_message_id"] = turn.as_str().into();
                }
                let guard = drops_turn.is_some().then(|| GuardedCut {
                    at_message_id: at_message_id.clone(),
                    drops_turn_message_id: drops_turn_message_id.clone(),
                });
                Ok(OriginPlan {
                    fork_point: Some(point),
                    resume,
                    fork: true,
                    resume_at,
                    drops_turn,
                    guard,
                })
            }
        }
    }

    /// The `--resume-session-at` value that cuts CLI conversation `cid` after message `at`
    /// (`field` names the request field in errors): refused at once where the release has
    /// no such flag or what it matches is not measured; `NotFound` when the transcript
    /// has no such message.
    async fn resume_at(
        &self,
        env: &[(String, String)],
        cid: &str,
        field: &'static str,
        at: &str,
    ) -> Result<String> {
        use ostler_supervisor::compat::ResumeAt;
        crate::capability::validate_message_id(field, at)?;
        let inst = self.installation();
        let key = match inst.capabilities.resume_at() {
            ResumeAt::Key(k) => k,
            ResumeAt::Absent => {
                return Err(Error::precondition(format!(
                    "Claude Code {} cannot resume at a message (no `--resume-session-at`, \
                     measured: see docs/compatibility.md); use 1.0.128 or newer",
                    inst.version
                )));
            }
            ResumeAt::Unknown => {
                return Err(Error::precondition(format!(
                    "how Claude Code {} resumes at a message was not measured and its \
                     pinned neighbours differ (docs/compatibility.md); use a pinned release",
                    inst.version
                )));
            }
        };
        let (env, cid, at) = (env.to_vec(), cid.to_string(), at.to_string());
        let version = inst.version.to_string();
        blocking(move || {
            crate::capability::resume_at_value(&env, &cid, field, &at, key).map_err(|e| match e {
                // Name the release, as every capability refusal does.
                Error::InvalidArgument { field, message }
                    if message.starts_with("this Claude Code release") =>
                {
                    Error::InvalidArgument {
                        field,
                        message: message.replacen(
                            "this Claude Code release",
                            &format!("Claude Code {version}"),
                            1,
                        ),
                    }
                }
                e => e,
            })
        })
        .await
    }

    /// The `--resume-drops-turn` value guarding a cut of CLI conversation `cid`: the
    /// transcript uuid of user message `turn` (`field` names the request field in errors).
    /// Refused at once where the release is measured without the flag (or not measured).
    async fn drops_turn(
        &self,
        env: &[(String, String)],
        cid: &str,
        field: &'static str,
        turn: &str,
    ) -> Result<String> {
        crate::capability::validate_message_id(field, turn)?;
        crate::capability::check_drops_turn(self.installation(), field)?;
        let (env, cid, turn) = (env.to_vec(), cid.to_string(), turn.to_string());
        blocking(move || crate::capability::drops_turn_value(&env, &cid, field, &turn)).await
    }

    /// After spawning a guarded cut (`--resume-drops-turn`): waits for the CLI's verdict,
    /// given at boot, at most `guard_verdict` ([`crate::EngineOptions`]). Taken: it
    /// answered `initialize` (or its `initialize` failed while it runs on). Refused: the
    /// actor records `resume_refused` (from the CLI's `error_during_execution` result
    /// saying `Resume rejected by --resume-drops-turn: ...`, or its stderr) and the process
    /// exits; once its end is recorded, the refusal's reason (the CLI's text). `events` was
    /// subscribed before the spawn.
    async fn guard_verdict(
        &self,
        entry: &Arc<SessionEntry>,
        mut events: tokio::sync::broadcast::Receiver<Arc<EngineEvent>>,
    ) -> Option<String> {
        use tokio::sync::broadcast::error::RecvError;
        let mut reason: Option<String> = None;
        // An error result or a refusal before any message: the CLI is ending.
        let mut failed = false;
        let verdict = async {
            loop {
                let ev = match events.recv().await {
                    Ok(ev) => ev,
                    Err(RecvError::Lagged(_)) => continue,
                    Err(RecvError::Closed) => return false,
                };
                match &ev.payload {
                    EventPayload::EngineNotice(n)
                        if n.code == crate::runtime::SESSION_INITIALIZED =>
                    {
                        return false;
                    }
                    // The CLI runs on without answering `initialize`: no refusal.
                    EventPayload::EngineNotice(n)
                        if n.code == crate::runtime::INITIALIZE_FAILED
                            && !failed
                            && self.live_handle(&entry.id).is_some() =>
                    {
                        return false;
                    }
                    EventPayload::EngineNotice(n) if n.code == RESUME_REFUSED => {
                        failed = true;
                        reason = n
                            .data
                            .as_ref()
                            .and_then(|d| d["reason"].as_str())
                            .map(str::to_owned);
                    }
                    EventPayload::TurnCompleted(t) => failed |= t.is_error,
                    EventPayload::ProcessExited(_) => return true,
                    _ => {}
                }
            }
        };
        let exited = tokio::time::timeout(self.shared.opts.guard_verdict, verdict)
            .await
            .unwrap_or(false);
        if !exited {
            return None;
        }
        // The process is gone: let its end be recorded before answering.
        if let Some(h) = self.registry.handle(&entry.id) {
            h.ended().await;
        }
        reason
    }

    /// The error a client gets for a guarded cut the CLI refused (the actor recorded the
    /// refusal as `resume_refused`): `field` names the request's field, `verb` what to do
    /// instead without the cut.
    fn guard_refused(&self, field: &str, verb: &str, reason: &str) -> Error {
        Error::precondition(format!(
            "{field}: Claude Code {} refused the cut (not retryable: the same request is \
             refused again; {verb} without the cut, or cut elsewhere): {reason}",
            self.installation().version
        ))
    }

    /// The data of a session's `session_created` notice (its first event: the
    /// [`SessionSpec`] it was created with, plus the create's labels and `titled` flag).
    /// `None` while a create is still recording it.
    pub(super) async fn created_notice_data(&self, id: &str) -> Result<Option<serde_json::Value>> {
        let store = self.shared.store.clone();
        let sid = id.to_owned();
        let first = blocking(move || store.events_after(&sid, 0, 1)).await?;
        Ok(first.into_iter().find_map(|ev| {
            match EventPayload::decode_stored(&ev.kind, &ev.payload) {
                Ok(EventPayload::EngineNotice(n)) if n.code == SESSION_CREATED => n.data,
                _ => None,
            }
        }))
    }

    /// A create with a client-chosen id that exists: the session when cwd, options, rules
    /// and labels are the same as the create's (an idempotent retry), `AlreadyExists`
    /// otherwise. The labels compared are those recorded in `session_created`
    /// ([`CREATED_LABELS`]): UpdateSession may have changed the session's since. A notice
    /// of an older build without them: the session's labels.
    async fn existing_create(
        &self,
        id: &str,
        cwd: &Path,
        spec: &SessionSpec,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Result<Option<SessionInfo>> {
        let rec = match self.record(id).await {
            Ok(r) => r,
            Err(Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let data = self.created_notice_data(id).await?;
        let created_labels = data
            .as_ref()
            .and_then(|d| d.get(CREATED_LABELS))
            .and_then(|l| {
                serde_json::from_value::<std::collections::BTreeMap<String, String>>(l.clone()).ok()
            });
        let recorded = data.and_then(|d| serde_json::from_value::<SessionSpec>(d).ok());
        let same_cwd = Path::new(&rec.cwd) == cwd;
        let same_labels = created_labels.as_ref().unwrap_or(&rec.labels) == labels;
        if same_cwd && same_labels && recorded.as_ref() == Some(spec) {
            return self.get_session(id).await.map(Some);
        }
        let differs = match &recorded {
            _ if !same_cwd => "a different cwd".to_owned(),
            Some(recorded) if !same_labels && recorded == spec => "different labels".to_owned(),
            None => "a creation still in progress or no recorded options".to_owned(),
            Some(recorded) => format!("a different {}", differing_fields(recorded, spec)),
        };
        Err(Error::AlreadyExists {
            what: format!("session {id:?} (with {differs})"),
        })
    }

    /// `CreateSession`: validates, records, spawns the CLI, sends `first_prompt`.
    pub async fn create_session(&self, req: CreateSession) -> Result<SessionInfo> {
        let cwd = self.validate_cwd(&req.cwd).await?;
        if let Some(id) = &req.session_id {
            validate_session_id(id)?;
        }
        let spec = self.create_spec(&req).await?;
        // Held until the create is done: an identical call racing this one (a client's
        // retry) waits for it and finds the session it made.
        let _creating = match &req.session_id {
            Some(id) => Some(self.creates.lock(id).await),
            None => None,
        };
        if let Some(id) = &req.session_id
            && let Some(info) = self.existing_create(id, &cwd, &spec, &req.labels).await?
        {
            let sent = match req.first_prompt {
                Some(content) => self.retried_first_prompt(id, content, req.client).await?,
                None => false,
            };
            return if sent {
                self.get_session(id).await
            } else {
                Ok(info)
            };
        }
        let plan = match &req.origin {
            Some(o) => Some(self.plan_origin(o, &cwd, &req.options).await?),
            None => None,
        };
        let slot = self.acquire_slot("", None).await?;
        let id = req
            .session_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let created = now_ms();
        self.shared
            .store
            .create_session(NewSession {
                id: id.clone(),
                claude_session_id: plan.as_ref().filter(|p| !p.fork).map(|p| p.resume.clone()),
                cwd: cwd.to_string_lossy().into_owned(),
                model: spec.options.model.clone(),
                permission_mode: spec.options.permission_mode.clone(),
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
        let mut data = serde_json::to_value(&spec).ok();
        // Beside the spec (which ignores them when read back): the labels the session was
        // created with (an idempotent retry compares against these, not the labels
        // UpdateSession may have changed since), and whether the client gave a title.
        if let Some(serde_json::Value::Object(m)) = data.as_mut() {
            m.insert(CREATED_LABELS.into(), serde_json::json!(req.labels));
            if req
                .title
                .as_deref()
                .and_then(|t| ostler_store::shorten_title(t, ostler_store::MAX_TITLE_CHARS))
                .is_some()
            {
                m.insert(CREATED_TITLED.into(), serde_json::Value::Bool(true));
            }
        }
        let mut message = format!("session created in {}", cwd.display());
        if let Some(p) = &plan {
            match &p.fork_point {
                Some(point) => {
                    message.push_str(&format!(
                        ", forked from session {} at seq {}",
                        point["session_id"], point["seq"]
                    ));
                    if let Some(serde_json::Value::Object(m)) = data.as_mut() {
                        m.insert("fork_point".into(), point.clone());
                    }
                }
                None => message.push_str(&format!(", adopting CLI conversation {}", p.resume)),
            }
        }
        entry
            .hub
            .emit_one(EventPayload::EngineNotice(EngineNotice {
                code: SESSION_CREATED.into(),
                message,
                data,
            }))
            .await?;
        let launch = Launch {
            cwd: &cwd,
            model: spec.options.model.clone(),
            permission_mode: spec.options.permission_mode.clone(),
            spec: &spec,
            resume: plan.as_ref().map(|p| p.resume.clone()),
            fork: plan.as_ref().is_some_and(|p| p.fork),
            resume_at: plan.as_ref().and_then(|p| p.resume_at.clone()),
            drops_turn: plan.as_ref().and_then(|p| p.drops_turn.clone()),
            guard: plan.as_ref().and_then(|p| p.guard.clone()),
            claude_session_id: plan.as_ref().filter(|p| !p.fork).map(|p| p.resume.clone()),
            from: SessionState::Starting,
            meta: Meta {
                rules: req.rules.clone(),
                ..Meta::default()
            },
            // A new CLI session (or a fork) takes the client's title; an adopted one keeps
            // the title its transcript has (as a resume does).
            // The title as ostler stores it (first line, 200 characters at most), so that
            // the CLI's `session_title_changed` echoes the same.
            title: req
                .title
                .as_deref()
                .and_then(|t| ostler_store::shorten_title(t, ostler_store::MAX_TITLE_CHARS))
                .filter(|_| plan.as_ref().is_none_or(|p| p.fork)),
        };
        // The new process does not suspend itself before its first prompt is sent.
        let _spawning = super::demand::hold(&entry);
        let guard = plan
            .as_ref()
            .filter(|p| p.drops_turn.is_some())
            .map(|_| entry.hub.subscribe());
        self.spawn_actor(&entry, launch, slot).await?;
        if let Some(events) = guard
            && let Some(reason) = self.guard_verdict(&entry, events).await
        {
            // Refused before the CLI wrote anything: the session is not kept.
            drop(_spawning);
            drop(_life);
            let err = self.guard_refused("fork_drops_turn_message_id", "fork", &reason);
            if let Err(e) = self.delete_session(&id).await {
                tracing::warn!(session = %id, error = %e, "cannot remove the refused fork");
            }
            return Err(err);
        }
        // The lifecycle lock goes before the first prompt: sending to a process that already
        // ended looks for a resume under that lock, and it would wait for itself (a CLI that
        // died at start hung the create for good). The hold above still keeps the new
        // process from being suspended until the prompt is sent.
        drop(_life);
        if let Some(content) = req.first_prompt {
            self.send_first_prompt(&id, content, req.client).await?;
        }
        self.get_session(&id).await
    }

    /// Sends a create's `first_prompt` (as [`crate::FIRST_PROMPT_ID`]: sent once however
    /// often the create is retried).
    async fn send_first_prompt(
        &self,
        id: &str,
        content: MessageContent,
        client: ClientRef,
    ) -> Result<SendOutcome> {
        let msg = SendMessage {
            content,
            client_message_id: Some(crate::FIRST_PROMPT_ID.to_owned()),
            client,
            delivery: crate::Delivery::default(),
        };
        self.send_checked(id, msg).await
    }

    /// The `first_prompt` of a retried create (whose session exists with the same cwd,
    /// options, rules and labels), against the session's first user message among its
    /// first events: the same content is the retry of a prompt sent (nothing is sent);
    /// another is `AlreadyExists`. When the first try sent none (it failed before), or
    /// the CLI never got it (`delivery_failed`), it is sent now. Whether it was sent now.
    async fn retried_first_prompt(
        &self,
        id: &str,
        content: MessageContent,
        client: ClientRef,
    ) -> Result<bool> {
        /// How far into the log the first prompt is looked for: it is sent right after the
        /// process starts, a few events after `session_created`.
        const WITHIN: usize = 256;
        let store = self.shared.store.clone();
        let sid = id.to_owned();
        let first = blocking(move || store.events_after(&sid, 0, WITHIN)).await?;
        // The first prompt: the message with ostler's id, else (a session created before
        // that id) the first one without an id.
        let mut prompt: Option<(u64, UserMessageSent)> = None;
        let mut failed = Vec::new();
        for ev in first {
            match EventPayload::decode_stored(&ev.kind, &ev.payload) {
                Ok(EventPayload::UserMessageSent(u)) => {
                    let ours = u.client_message_id.as_deref() == Some(crate::FIRST_PROMPT_ID);
                    let taken = prompt.as_ref().is_some_and(|(_, p)| {
                        p.client_message_id.as_deref() == Some(crate::FIRST_PROMPT_ID)
                    });
                    if ours && !taken || prompt.is_none() && u.client_message_id.is_none() {
                        prompt = Some((ev.seq, u));
                    }
                }
                Ok(EventPayload::EngineNotice(n)) if n.code == DELIVERY_FAILED => {
                    failed.extend(n.data.as_ref().and_then(|d| d["seq"].as_u64()));
                }
                _ => {}
            }
        }
        match prompt {
            Some((_, u)) if u.content != content => Err(Error::AlreadyExists {
                what: format!("session {id:?} (with a different first_prompt)"),
            }),
            Some((seq, _)) if !failed.contains(&seq) => Ok(false),
            _ => self
                .send_first_prompt(id, content, client)
                .await
                .map(|o| !o.duplicate),
        }
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
            resume_at,
            drops_turn,
            guard,
            claude_session_id,
            from,
            mut meta,
            title,
        } = launch;
        // Hook calls are answered with the registrations of the spec (issue 11).
        meta.hooks = spec.options.hooks.clone();
        // The thinking budget last set at runtime wins over the create's (0 or a reset:
        // the release's default), where the release takes the flag.
        let takes_thinking_flag = self
            .installation()
            .capabilities
            .accepts_option("--max-thinking-tokens")
            != Some(false);
        let max_thinking_tokens = match meta.thinking_tokens {
            Some(set) if takes_thinking_flag => set.filter(|n| *n >= 1),
            _ => spec.options.max_thinking_tokens,
        };
        // The servers last set at runtime start with the process (as `--mcp-config`, with
        // the session's own; a name of both: the runtime one), so the call that resumed
        // the session already finds them, on any release that takes `--mcp-config`.
        let mut mcp_servers = spec.options.mcp_servers.clone();
        if let Some(set) = &meta.mcp_servers {
            for (name, config) in set {
                match serde_json::from_value::<ostler_supervisor::McpServer>(config.clone()) {
                    Ok(server) => {
                        mcp_servers.insert(name.clone(), server);
                    }
                    Err(e) => {
                        tracing::warn!(server = %name, error = %e, "an MCP server set at runtime could not be read back; not restored")
                    }
                }
            }
        }
        // Every spawn of a `debug` session logs to the same file (appended).
        let debug_file = if spec.options.debug {
            Some(self.prepare_debug_log(&entry.id).await?)
        } else {
            None
        };
        let opts = SpawnOptions {
            cwd: cwd.to_path_buf(),
            cli: CliOptions {
                model: model.clone(),
                permission_mode,
                max_thinking_tokens,
                mcp_servers,
                managed_settings: ostler_supervisor::options::merge_managed_settings(
                    self.shared.opts.managed_settings.as_ref(),
                    spec.options.managed_settings.as_deref(),
                ),
                debug_file,
                ..spec.options.clone()
            },
            resume,
            fork_session: fork,
            resume_session_at: resume_at,
            resume_drops_turn: drops_turn,
            include_partial_messages: self.shared.opts.partial_messages,
            env: crate::capability::with_checkpointing(
                self.shared.opts.spawn_env.clone(),
                spec.enable_file_checkpointing,
            ),
            log_id: entry.id.to_string(),
            title,
        };
        // Read before the CLI starts, as it reads it.
        let restored_cost_usd = match &opts.resume {
            Some(cid) => {
                let env =
                    crate::capability::session_env(&self.shared.opts.spawn_env, &spec.options);
                let cid = cid.clone();
                blocking(move || Ok::<_, Error>(crate::capability::transcript_cost(&env, &cid)))
                    .await?
            }
            None => 0.0,
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
                let exit = ExitInfo {
                    facts: ExitFacts::default(),
                    reason: Some(reason.clone()),
                    at_ms: at,
                };
                let patch = SessionPatch {
                    state: Some(SessionState::Exited),
                    exit: Some(exit.clone()),
                    updated_ms: at,
                    ..Default::default()
                };
                let items = vec![
                    Item::new(EventPayload::ProcessExited(ProcessExited {
                        status: ExitStatus {
                            exit,
                            stderr_tail: String::new(),
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
            tool_servers: spec.options.tool_servers.clone(),
            decline_elicitations: spec.options.decline_elicitations,
            verbatim_prompts: spec.options.verbatim_prompts,
            debug_log: spec
                .options
                .debug
                .then(|| self.debug_log_path(&entry.id))
                .flatten(),
            restored_cost_usd,
            // Every launch but a create's respawns a session ostler already has.
            keeps_title: from != SessionState::Starting,
            guard,
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
            // Suspending right now, or its process gone and its end already shown (a
            // client that saw the session's exit may resume at once): resume it once
            // its actor has finished.
            let ending = !LIVE_STATES.contains(&h.view().state);
            if !ending && !entry.suspending.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(Error::precondition(format!(
                    "session {session_id:?} is already running"
                )));
            }
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
        let (spec, mut meta, last) = self.load_meta(entry).await?;
        let on_demand = opts.is_none();
        let opts = opts.unwrap_or_else(|| last.on_demand(rec.claude_session_id.as_deref()));
        let fork = opts.fork;
        if fork && !self.shared.installation.capabilities.fork_session {
            // Refused before anything is recorded: the session stays as it is.
            return Err(Error::precondition(format!(
                "Claude Code {} cannot fork a conversation (it has no --fork-session; \
                 1.0.119 and later do)",
                self.shared.installation.version
            )));
        }
        // Checked again before anything is recorded: the daemon may run another release, or
        // other allowed roots, than when the session was made; refused, the session stays
        // as it is (resumable or suspended) for a daemon that can run it.
        release_checks(self.installation(), &spec.options)?;
        self.start_checks(&spec.options)?;
        check_checkpointing(self.installation(), spec.enable_file_checkpointing)?;
        let cwd = PathBuf::from(&rec.cwd);
        self.recheck_dir("the session's directory", &cwd).await?;
        for d in spec
            .options
            .add_dirs
            .iter()
            .chain(&spec.options.plugin_dirs)
        {
            self.recheck_dir("the session's extra directory", Path::new(d))
                .await?;
        }
        if let Some(root) = &spec.options.project_config_root {
            self.recheck_dir("the session's project_config_root", Path::new(root))
                .await?;
        }
        let at_message_id = opts.at_message_id.clone();
        let drops_turn_message_id = opts.drops_turn_message_id.clone();
        if drops_turn_message_id.is_some() && at_message_id.is_none() {
            return Err(Error::invalid(
                "drops_turn_message_id",
                "only with at_message_id (it guards that cut)",
            ));
        }
        let env = crate::capability::session_env(&self.shared.opts.spawn_env, &spec.options);
        // A session suspends only when every message it took has had its turn; any other
        // end may have left messages the CLI never took.
        if state != SessionState::Suspended {
            self.fail_untaken(entry, &env, rec.claude_session_id.as_deref(), &mut meta)
                .await?;
        }
        if let Some(at) = &at_message_id {
            crate::capability::validate_message_id("at_message_id", at)?;
        }
        let fresh_if_missing = opts.fresh_if_missing;
        let resume =
            crate::capability::resume_checked(&env, entry, rec.claude_session_id.clone(), opts)
                .await?;
        if resume.is_none() && fork {
            return Err(Error::precondition(format!(
                "session {session_id:?} never started a conversation: nothing to fork"
            )));
        }
        let resume_at = match (&at_message_id, &resume) {
            (Some(at), Some(cid)) => Some(self.resume_at(&env, cid, "at_message_id", at).await?),
            (Some(_), None) => {
                return Err(Error::precondition(format!(
                    "session {session_id:?} has no CLI conversation to resume at a message"
                )));
            }
            (None, _) => None,
        };
        let drops_turn = match (&drops_turn_message_id, &resume) {
            (Some(turn), Some(cid)) => Some(
                self.drops_turn(&env, cid, "drops_turn_message_id", turn)
                    .await?,
            ),
            _ => None,
        };
        let fork = fork && resume.is_some();
        let guarded = drops_turn.is_some();
        let slot = self.acquire_slot(session_id, Some(entry)).await?;
        let how = if on_demand { " (on demand)" } else { "" };
        let release = self.installation().version.to_string();
        if let Some(before) = rec.cli_release.as_deref().filter(|r| *r != release) {
            // Said in the log, and the record follows: the conversation's transcript was
            // written by another release, which may read it otherwise (measured: 2.1.332
            // continuing a conversation that 1.0.128 continued did not see 1.0.128's turns).
            let item = Item::new(EventPayload::EngineNotice(EngineNotice {
                code: CLI_RELEASE_CHANGED.into(),
                message: format!(
                    "this session last ran Claude Code {before}; it now runs {release}: turns \
                     made under one release may be missing from the other's view of the \
                     conversation (docs/operations.md, \"Changing the Claude Code release\")"
                ),
                data: Some(serde_json::json!({ "from": before, "to": release })),
            }));
            let with = WithEvents {
                patch: Some(SessionPatch {
                    cli_release: Some(release.clone()),
                    updated_ms: now_ms(),
                    ..Default::default()
                }),
                ..Default::default()
            };
            entry.hub.emit_with(vec![item], with).await?;
        }
        entry
            .hub
            .emit_one(EventPayload::EngineNotice(EngineNotice {
                code: RESUMING.into(),
                message: match &resume {
                    Some(c) if fork => format!("resuming CLI session {c} as a fork{how}"),
                    Some(c) => format!("resuming CLI session {c}{how}"),
                    None => format!("no CLI session to resume: starting a fresh one{how}"),
                },
                data: Some(serde_json::json!({
                    "claude_session_id": resume,
                    "fork": fork,
                    "fresh_if_missing": fresh_if_missing,
                    "on_demand": on_demand,
                    "at_message_id": at_message_id,
                    "drops_turn_message_id": drops_turn_message_id,
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
            resume_at,
            guard: drops_turn.is_some().then(|| GuardedCut {
                at_message_id: at_message_id.clone(),
                drops_turn_message_id: drops_turn_message_id.clone(),
            }),
            drops_turn,
            claude_session_id: if fork { None } else { resume },
            from: state,
            meta,
            title: None,
        };
        // Subscribed before the spawn, so the CLI's verdict cannot be missed.
        let events = guarded.then(|| entry.hub.subscribe());
        self.spawn_actor(entry, launch, slot).await?;
        if let Some(events) = events
            && let Some(reason) = self.guard_verdict(entry, events).await
        {
            return Err(self.guard_refused("drops_turn_message_id", "resume", &reason));
        }
        Ok(())
    }

    /// Rebuilds a session's spec, rules and message ids from its log (one scan), and what
    /// its last resume asked for.
    async fn load_meta(
        &self,
        entry: &Arc<SessionEntry>,
    ) -> Result<(SessionSpec, Meta, LastResume)> {
        let mut spec = SessionSpec::default();
        let mut meta = Meta::default();
        let mut last = LastResume::default();
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
                        meta.client_titled |= n
                            .data
                            .as_ref()
                            .is_some_and(|d| d[CREATED_TITLED] == serde_json::Value::Bool(true));
                        if let Some(s) = n
                            .data
                            .and_then(|d| serde_json::from_value::<SessionSpec>(d).ok())
                        {
                            meta.rules.extend(s.rules.iter().cloned());
                            spec = s;
                        }
                    }
                    Ok(EventPayload::EngineNotice(n)) if n.code == RESUMING => {
                        let d = n.data.unwrap_or_default();
                        last = LastResume {
                            fresh_if_missing: d["fresh_if_missing"].as_bool().unwrap_or(false),
                            fork_of: d["fork"]
                                .as_bool()
                                .unwrap_or(false)
                                .then(|| d["claude_session_id"].as_str().map(str::to_owned))
                                .flatten(),
                            at_message_id: d["at_message_id"].as_str().map(str::to_owned),
                            drops_turn_message_id: d["drops_turn_message_id"]
                                .as_str()
                                .map(str::to_owned),
                            message_since: false,
                        };
                    }
                    // The CLI refused the last resume's guarded cut: it is not made again.
                    Ok(EventPayload::EngineNotice(n)) if n.code == RESUME_REFUSED => {
                        last.at_message_id = None;
                        last.drops_turn_message_id = None;
                    }
                    // Runtime controls a resume must not lose: the thinking budget is
                    // given at spawn, the servers sent again after `initialize`.
                    Ok(EventPayload::EngineNotice(n)) if n.code == "max_thinking_tokens_set" => {
                        if let Some(d) = n.data {
                            meta.thinking_tokens = Some(
                                d["request"]["max_thinking_tokens"]
                                    .as_u64()
                                    .and_then(|v| u32::try_from(v).ok()),
                            );
                        }
                    }
                    Ok(EventPayload::EngineNotice(n)) if n.code == "mcp_servers_set" => {
                        if let Some(serde_json::Value::Object(m)) =
                            n.data.map(|mut d| d["request"]["servers"].take())
                        {
                            meta.mcp_servers = Some(m);
                        }
                    }
                    // A client renamed the session (UpdateSession).
                    Ok(EventPayload::EngineNotice(n))
                        if n.code == super::meta::SESSION_UPDATED
                            && n.data.as_ref().is_some_and(|d| {
                                d["cause"] == "update_session" && d.get("title").is_some()
                            }) =>
                    {
                        meta.client_titled = true;
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
                        last.message_since = true;
                        if let Some(id) = u.client_message_id {
                            meta.messages.entry(id).or_insert(ev.seq);
                        }
                    }
                    // A message its CLI never took frees its client id for a retry.
                    Ok(EventPayload::EngineNotice(n)) if n.code == DELIVERY_FAILED => {
                        if let Some(d) = n.data
                            && let (Some(id), Some(seq)) =
                                (d["client_message_id"].as_str(), d["seq"].as_u64())
                            && meta.messages.get(id) == Some(&seq)
                        {
                            meta.messages.remove(id);
                        }
                    }
                    // Runtime controls sent again after `initialize` (flag settings, MCP
                    // permission mode overrides, peer message delivery).
                    Ok(EventPayload::EngineNotice(n)) => {
                        meta.runtime.record(&n.code, &n.message, n.data.as_ref());
                    }
                    _ => {}
                }
            }
            if n < page {
                break;
            }
        }
        Ok((spec, meta, last))
    }

    /// `StopSession`: graceful stop (stdin closed, then SIGTERM/SIGKILL after the grace
    /// periods). Returns once the process has exited; the session is `stopped` (resumable).
    pub async fn stop_session(&self, session_id: &str) -> Result<SessionInfo> {
        let entry = self.entry(session_id).await?;
        entry.stop_asked();
        let _life = entry.lifecycle.lock().await;
        self.stop_entry(&entry, false).await?;
        drop(_life);
        self.get_session(session_id).await
    }

    async fn stop_entry(&self, entry: &Arc<SessionEntry>, shutdown: bool) -> Result<()> {
        let was_live = match self.live_handle(&entry.id) {
            Some(actor) => {
                actor.stop(shutdown).await;
                true
            }
            None => false,
        };
        if shutdown {
            return Ok(());
        }
        {
            // Also after a stop that met the process already suspending: the session ends
            // STOPPED, not SUSPENDED.
            let rec = self.record(&entry.id).await?;
            if matches!(rec.state, SessionState::Suspended | SessionState::Resumable) {
                // No process to stop, but the client means it: the session stays stopped
                // (no resume on demand until ResumeSession).
                let with = WithEvents {
                    patch: Some(SessionPatch {
                        state: Some(SessionState::Stopped),
                        updated_ms: now_ms(),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                let item = Item::new(EventPayload::StateChanged(StateChanged {
                    from: rec.state,
                    to: SessionState::Stopped,
                    reason: Some(format!("stopped on request while {}", rec.state)),
                }));
                entry.hub.emit_with(vec![item], with).await?;
                self.shared
                    .counts
                    .moved(Some(rec.state), Some(SessionState::Stopped));
                return Ok(());
            }
            if was_live {
                return Ok(());
            }
            Err(Error::precondition(format!(
                "session {:?} is not running (it is {})",
                entry.id, rec.state
            )))
        }
    }

    /// `DeleteSession`: stops it if live, then deletes it with its history. Subscribers'
    /// streams end.
    pub async fn delete_session(&self, session_id: &str) -> Result<()> {
        let entry = self.entry(session_id).await?;
        entry.stop_asked();
        let _life = entry.lifecycle.lock().await;
        if let Some(actor) = self.live_handle(session_id) {
            // No graceful wait: the history is going away.
            actor.stop(false).await;
        }
        let state = self.record(session_id).await?.state;
        self.shared.store.delete_session(session_id).await?;
        self.remove_debug_log(session_id).await;
        self.shared.counts.moved(Some(state), None);
        self.registry.remove(session_id);
        Ok(())
    }

    /// Stops every live session gracefully; they are recorded `resumable` and come back so
    /// at the next start. New sessions are refused from now on.
    pub async fn shutdown(&self) {
        self.shared.begin_shutdown();
        // What sessions record as they stop must not wait out a storage fault: the daemon
        // is exiting, and nothing retried would be heard of.
        self.shared.store.closing();
        let entries: Vec<_> = self.registry.all().into_iter().map(|r| r.entry).collect();
        let stops = entries.iter().map(|e| self.stop_entry(e, true));
        futures::future::join_all(stops).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_created_payloads_of_older_releases_still_read() {
        let old = serde_json::json!({
            "allowed_tools": ["Read"],
            "disallowed_tools": [],
            "append_system_prompt": null,
            "max_turns": 3,
            "rules": [{"tool": "Bash", "pattern": "ls", "action": "allow"}]
        });
        let spec: SessionSpec = serde_json::from_value(old).expect("old spec");
        assert_eq!(spec.options.allowed_tools, vec!["Read".to_string()]);
        assert_eq!(spec.options.max_turns, Some(3));
        assert_eq!(spec.rules.len(), 1);
        assert_eq!(spec.origin, None);
        // A new spec round-trips, options flattened beside the rules.
        let new = SessionSpec {
            options: CliOptions {
                system_prompt: Some("s".into()),
                max_budget_usd: Some(1.5),
                ..Default::default()
            },
            rules: spec.rules.clone(),
            origin: Some(Origin::Fork {
                session_id: "a".into(),
                at_message_id: Some("msg_01".into()),
                drops_turn_message_id: Some("u_02".into()),
            }),
            enable_file_checkpointing: true,
        };
        let v = serde_json::to_value(&new).expect("ser");
        assert_eq!(v["system_prompt"], "s");
        assert_eq!(v["origin"]["kind"], "fork");
        assert_eq!(serde_json::from_value::<SessionSpec>(v).expect("de"), new);
        for bad in ["", "-x", ".x", "a/b", &"a".repeat(SESSION_ID_BYTES + 1)] {
            assert!(validate_session_id(bad).is_err(), "{bad:?}");
        }
        validate_session_id("build-42.retry_ok").expect("a good id");
    }
}
