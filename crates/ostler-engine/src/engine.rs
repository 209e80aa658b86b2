//! The engine handle and its public API. (Interim: signatures published for the server;
//! bodies land once ostler-store and ostler-supervisor export their APIs.)

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::permission::PermissionRule;
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
    /// Accept free-text answers to single-select questions with options.
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
    /// How long a graceful stop waits for the process before killing it.
    pub stop_timeout: Duration,
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
            stop_timeout: Duration::from_secs(5),
        }
    }
}

/// A cheap, cloneable handle on the engine.
#[derive(Clone)]
pub struct Engine {
    #[allow(dead_code)]
    inner: Arc<()>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").finish_non_exhaustive()
    }
}

/// A subscription: stored events after `after_seq`, then live events (when following).
pub struct Subscription {
    _private: (),
}

impl Subscription {
    /// The next event; `None` when the subscription ended (caught up without `follow`, the
    /// session was deleted, or the engine shut down). An `Err` ends the stream too.
    pub async fn next(&mut self) -> Option<Result<Arc<EngineEvent>>> {
        None
    }
}

fn pending() -> Error {
    Error::Unavailable("engine not implemented yet".into())
}

impl Engine {
    // `pub async fn start(opts: EngineOptions, store: ostler_store::Store,
    //  installation: ostler_supervisor::Installation) -> Result<Engine>` lands with the
    // store and supervisor APIs.

    /// `CreateSession`: validates, records, spawns the CLI, sends `first_prompt`.
    pub async fn create_session(&self, _req: CreateSession) -> Result<SessionInfo> {
        Err(pending())
    }

    /// `GetSession`.
    pub async fn get_session(&self, _id: &str) -> Result<SessionInfo> {
        Err(pending())
    }

    /// `ListSessions`.
    pub async fn list_sessions(&self, _req: ListSessions) -> Result<SessionPage> {
        Err(pending())
    }

    /// `SendMessage`: returns the seq of the recorded `user_message_sent` event.
    pub async fn send_message(&self, _session_id: &str, _msg: SendMessage) -> Result<SendOutcome> {
        Err(pending())
    }

    /// `Subscribe`.
    pub async fn subscribe(&self, _req: SubscribeRequest) -> Result<Subscription> {
        Err(pending())
    }

    /// `RespondToPermission`. `FailedPrecondition` (with `decided_by`) when someone decided
    /// first.
    pub async fn respond_permission(
        &self,
        _session_id: &str,
        _request_id: &str,
        _response: PermissionResponse,
        _client: ClientRef,
    ) -> Result<Decided> {
        Err(pending())
    }

    /// `AnswerQuestion`.
    pub async fn answer_question(
        &self,
        _session_id: &str,
        _request_id: &str,
        _answers: Vec<QuestionAnswer>,
        _client: ClientRef,
    ) -> Result<Decided> {
        Err(pending())
    }

    /// Pending permission requests and questions of a session.
    pub async fn pending_interactions(&self, _session_id: &str) -> Result<Vec<PendingInteraction>> {
        Err(pending())
    }

    /// `Interrupt`: interrupts the running turn.
    pub async fn interrupt(&self, _session_id: &str) -> Result<()> {
        Err(pending())
    }

    /// `SetModel` (`None` resets to the default model).
    pub async fn set_model(&self, _session_id: &str, _model: Option<String>) -> Result<()> {
        Err(pending())
    }

    /// `SetPermissionMode`.
    pub async fn set_permission_mode(&self, _session_id: &str, _mode: String) -> Result<()> {
        Err(pending())
    }

    /// `StopSession`: graceful stop (stdin closed, then kill after `stop_timeout`).
    pub async fn stop_session(&self, _session_id: &str) -> Result<SessionInfo> {
        Err(pending())
    }

    /// `ResumeSession`: respawns with `--resume` (and `--fork-session` when `fork`); events
    /// continue on the same ostler session (seq continues).
    pub async fn resume_session(&self, _session_id: &str, _fork: bool) -> Result<SessionInfo> {
        Err(pending())
    }

    /// `DeleteSession`: stops it if live, then deletes it with its history.
    pub async fn delete_session(&self, _session_id: &str) -> Result<()> {
        Err(pending())
    }

    /// Health details.
    pub async fn health(&self) -> Result<HealthReport> {
        Err(pending())
    }

    /// Stops every live session (they come back `resumable` at the next start).
    pub async fn shutdown(&self) {}
}
