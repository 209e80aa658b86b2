//! What the engine and every session actor share, read-only after start: the options, the
//! store, the CLI installation, the state counts for health and the live-session slots.
//! Owned by the [`crate::Engine`] (created in `Engine::start`); each actor holds an `Arc`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ostler_store::Store;
use ostler_supervisor::{Installation, SupervisorOptions};
use tokio::sync::watch;

use crate::counts::StateCounts;
use crate::error::{Error, Result};
use crate::permission::PermissionRule;

/// Engine configuration.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Live sessions (with a CLI process) at most. A session that must become live at the
    /// cap suspends the least-recently-used idle live session; when every live session is
    /// busy it waits up to `live_wait`, then fails with `ResourceExhausted`.
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
    /// The daemon's policy (`sessions.managed_settings`): merged with each session's own
    /// `managed_settings` and passed as `--managed-settings` at every spawn (create,
    /// resume, fork), so the CLI enforces it whatever the session asks.
    pub managed_settings: Option<serde_json::Map<String, serde_json::Value>>,
    /// Process policy (grace periods, control timeout, stall watchdog, ...).
    pub supervisor: SupervisorOptions,
    /// Keep the CLI's raw line next to the canonical payload (once per line; see
    /// docs/ARCHITECTURE.md). Off: only the canonical payload is stored (smaller; replay
    /// is unaffected, but the verbatim wire line is lost).
    pub store_raw_lines: bool,
    /// A live session idle this long (no turn, no pending interaction, no background task)
    /// is suspended: its CLI process is stopped and the next call resumes it. `None`: never.
    pub idle_suspend: Option<Duration>,
    /// How long a call that needs a live-session slot waits when every live session is busy.
    pub live_wait: Duration,
    /// After a result that leaves messages owed an answer, the CLI starts on the next at
    /// once (an echo, a turn's output, its lifecycle `started`). If nothing shows it did
    /// within this long, none is queued there: they are forgotten and the session settles
    /// (idle), so it is not left running, never to be idle-suspended. It starts again
    /// while the CLI waits on a client and when a client answers it.
    /// (`sessions.queue_grace_secs`)
    pub queue_grace: Duration,
    /// How long a resume or fork with a guarded cut (`--resume-drops-turn`) waits for the
    /// CLI's verdict, given at boot (its `initialize` answer, or its refusal and exit); past
    /// it the cut counts as taken. (`sessions.guard_verdict_secs`)
    pub guard_verdict: Duration,
    /// Where sessions created with `debug` keep the CLI's debug log (`<id>.log`, made
    /// owner-only when first needed). `None`: the option is refused (FAILED_PRECONDITION).
    /// The daemon uses `debug/` next to its store.
    pub debug_dir: Option<PathBuf>,
    /// A session's debug log past this many bytes keeps its newest half (from a line's
    /// start), checked at every spawn and every turn's end; 0: unbounded.
    /// (`sessions.debug_log_max_bytes`)
    pub debug_max_bytes: u64,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            max_live_sessions: 256,
            allowed_roots: Vec::new(),
            rules: Vec::new(),
            permission_expiry: None,
            allow_free_text_answers: false,
            broadcast_capacity: 1024,
            replay_page_size: 512,
            respawn_on_start: false,
            partial_messages: true,
            spawn_env: Vec::new(),
            managed_settings: None,
            supervisor: SupervisorOptions::default(),
            store_raw_lines: true,
            idle_suspend: Some(Duration::from_secs(900)),
            live_wait: Duration::from_secs(30),
            queue_grace: Duration::from_secs(30),
            guard_verdict: Duration::from_secs(120),
            debug_dir: None,
            debug_max_bytes: crate::engine::debug_log::DEBUG_MAX_BYTES_DEFAULT,
        }
    }
}

/// The engine-wide context shared with every actor.
pub(crate) struct Shared {
    pub opts: EngineOptions,
    pub store: Store,
    pub installation: Installation,
    /// `allowed_roots`, canonicalised at start.
    pub roots: Vec<PathBuf>,
    /// Sessions per stored state (for health).
    pub counts: StateCounts,
    /// Live-session slots taken (see [`Shared::reserve_slot`]).
    live: AtomicUsize,
    /// Bumped when a slot is released or a live session becomes idle (so suspendable):
    /// what a caller waiting for a slot waits on.
    slots: watch::Sender<u64>,
    /// `true` once daemon shutdown has begun (a watch, so that waiters need not poll).
    shutting_down: tokio::sync::watch::Sender<bool>,
    /// Becomes `true` when the last [`crate::Engine`] handle is dropped.
    gone: watch::Receiver<bool>,
}

impl Shared {
    pub fn new(
        opts: EngineOptions,
        store: Store,
        installation: Installation,
        roots: Vec<PathBuf>,
        gone: watch::Receiver<bool>,
    ) -> Self {
        Self {
            opts,
            store,
            installation,
            roots,
            counts: StateCounts::default(),
            live: AtomicUsize::new(0),
            slots: watch::Sender::new(0),
            shutting_down: tokio::sync::watch::Sender::new(false),
            gone,
        }
    }

    /// Resolves when every engine handle is gone (see [`crate::Engine`]'s drop).
    pub fn alive(&self) -> watch::Receiver<bool> {
        self.gone.clone()
    }

    pub fn installation_version(&self) -> &semver::Version {
        &self.installation.version
    }

    /// Live-session slots taken now.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    /// Changes when a slot is released or a live session becomes idle.
    pub fn watch_slots(&self) -> watch::Receiver<u64> {
        self.slots.subscribe()
    }

    /// Wakes the callers waiting for a slot (a slot was freed or a session became idle).
    pub fn slots_changed(&self) {
        self.slots.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Whether daemon shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        *self.shutting_down.borrow()
    }

    /// Changes to `true` when daemon shutdown begins.
    pub fn watch_shutdown(&self) -> tokio::sync::watch::Receiver<bool> {
        self.shutting_down.subscribe()
    }

    /// From now on no slot is handed out (daemon shutdown).
    pub fn begin_shutdown(&self) {
        self.shutting_down.send_replace(true);
    }

    /// Takes one live-session slot if one is free now, released when the returned guard
    /// drops (the actor holds it until it ends). At the cap: `ResourceExhausted`; the
    /// engine's `acquire_slot` makes room by suspending an idle session and waits.
    pub fn reserve_slot(self: &Arc<Self>) -> Result<SlotGuard> {
        if self.is_shutting_down() {
            return Err(Error::Unavailable("the engine is shutting down".into()));
        }
        let max = self.opts.max_live_sessions;
        let r = self
            .live
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            });
        match r {
            Ok(_) => Ok(SlotGuard(self.clone())),
            Err(n) => Err(Error::ResourceExhausted {
                message: format!("{n} live sessions: the configured maximum is {max}"),
            }),
        }
    }
}

/// A reserved live-session slot, released when dropped.
pub(crate) struct SlotGuard(Arc<Shared>);

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.0.live.fetch_sub(1, Ordering::SeqCst);
        self.0.slots_changed();
    }
}

/// The allowed roots, listed for a message, when `dir` (canonical) lies under none of them;
/// `None` when it lies under one or no roots are set.
pub(crate) fn outside_roots(roots: &[PathBuf], dir: &std::path::Path) -> Option<String> {
    if roots.is_empty() || roots.iter().any(|r| dir.starts_with(r)) {
        return None;
    }
    let roots: Vec<String> = roots.iter().map(|r| r.display().to_string()).collect();
    Some(format!("{roots:?}"))
}

/// Why a directory recorded canonical (`what`: how a message names it) may no longer be
/// used: gone, replaced by a link to elsewhere, no longer a directory, or outside `roots`
/// (they may have changed since). `None` when it is still itself. Reads the file system:
/// call it off the async workers.
pub(crate) fn dir_astray(what: &str, dir: &std::path::Path, roots: &[PathBuf]) -> Option<String> {
    let shown = dir.display();
    let c = match std::fs::canonicalize(dir) {
        Ok(c) => c,
        Err(e) => {
            return Some(format!(
                "{what} {shown} no longer exists or cannot be reached ({e})"
            ));
        }
    };
    if c != dir {
        return Some(format!(
            "{what} {shown} now leads to {} (replaced by a link since it was recorded); \
             refused",
            c.display()
        ));
    }
    if !c.is_dir() {
        return Some(format!("{what} {shown} is no longer a directory"));
    }
    outside_roots(roots, dir).map(|roots| {
        format!("{what} {shown} is outside the daemon's allowed roots {roots} (they changed since it was recorded)")
    })
}
