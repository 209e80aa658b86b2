//! What the engine's registry and a session's actor share: the registry entry of a session,
//! the commands an actor serves, and the [`SessionHandle`] through which the engine reaches
//! an actor and reads its [`SessionView`].
//!
//! The actor is the only writer of a live session's state; it publishes what readers need
//! (state, pending interactions, stderr tail) on a `watch` channel. Readers read that view
//! while the session is live and the store otherwise.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize};

use ostler_protocol::model::RawJson;
use ostler_protocol::outbound::OutRequest;
use ostler_store::Store;
use ostler_supervisor::ControlError;
use tokio::sync::{mpsc, oneshot, watch};

use crate::error::{Error, Result};
use crate::hub::Hub;
use crate::permission::PermissionRule;
use crate::types::*;

/// A session known to this engine (created or touched since start).
pub(crate) struct SessionEntry {
    pub id: Arc<str>,
    /// Every write to the session's log goes through it (persist, then publish).
    pub hub: Arc<Hub>,
    /// Serialises lifecycle changes (create/resume/stop/delete/suspend) of this session.
    pub lifecycle: tokio::sync::Mutex<()>,
    /// Engine calls on their way to the session's actor (see `engine/demand.rs`): while
    /// one is, the actor does not suspend itself.
    pub inflight: AtomicUsize,
    /// Set by the actor when it has decided to suspend (its process is stopping): calls
    /// wait for its end and resume the session instead of using it.
    pub suspending: AtomicBool,
    /// Counts stops and deletes asked for: one that waits for the lifecycle lock while a
    /// resume holds it waiting for a live slot makes that resume give up at once, instead
    /// of waiting `sessions.live_wait_secs` for a slot for a session that is going away.
    pub stops: tokio::sync::watch::Sender<u64>,
}

impl SessionEntry {
    /// A stop or delete is on its way (see [`SessionEntry::stops`]).
    pub fn stop_asked(&self) {
        self.stops.send_modify(|n| *n = n.wrapping_add(1));
    }

    pub fn new(id: &str, store: Store, capacity: usize) -> Self {
        let id: Arc<str> = Arc::from(id);
        Self {
            hub: Arc::new(Hub::new(id.clone(), store, capacity)),
            id,
            lifecycle: tokio::sync::Mutex::new(()),
            inflight: AtomicUsize::new(0),
            suspending: AtomicBool::new(false),
            stops: tokio::sync::watch::Sender::new(0),
        }
    }
}

/// What a session remembers from its log: rebuilt by the engine before a spawn, then owned
/// (and added to) by the actor.
#[derive(Debug, Default)]
pub(crate) struct Meta {
    /// Session rules (from create and "remember").
    pub rules: Vec<PermissionRule>,
    /// Client message id -> seq of its `user_message_sent` (idempotent sends).
    pub messages: HashMap<String, u64>,
    /// The session's hook registrations (its spec), by callback id = registration id.
    pub hooks: Vec<ostler_protocol::hooks::HookRegistration>,
    /// The last `SetMaxThinkingTokens` (`Some(None)`: reset), given as the next spawn's
    /// `--max-thinking-tokens` instead of the create's.
    pub thinking_tokens: Option<Option<u32>>,
    /// The servers of the last `SetMcpServers` (name -> config), given to the next process
    /// with the session's own (`--mcp-config`).
    pub mcp_servers: Option<serde_json::Map<String, serde_json::Value>>,
    /// The flag settings, MCP permission mode overrides and peer message delivery set at
    /// runtime, sent again right after `initialize`.
    pub runtime: crate::runtime::RuntimeSettings,
    /// A client gave the session its title (at create, or with `UpdateSession` since):
    /// a respawned CLI announcing no title gets it with `rename_session`.
    pub client_titled: bool,
}

/// What an actor shows of its session, written by the actor only.
#[derive(Debug, Clone)]
pub(crate) struct SessionView {
    /// `false` once the actor has ended (its process exited or was killed) and released
    /// its live-session slot.
    pub live: bool,
    /// The state `GetSession` reports. It moves before the event implying it is published,
    /// so it may be ahead of the stored state.
    pub state: SessionState,
    /// Pending interactions: request id -> request event (as published).
    pub pending: BTreeMap<String, Arc<EngineEvent>>,
    /// The stderr tail of the last exit (the store keeps no stderr).
    pub stderr_tail: Option<String>,
    /// When the session last became idle or served a command while idle (`None` while
    /// busy): the least recently used idle session is suspended first at the live cap.
    pub idle_since: Option<tokio::time::Instant>,
}

impl SessionView {
    /// The pending request events, oldest first.
    pub fn pending_events(&self) -> Vec<Arc<EngineEvent>> {
        let mut v: Vec<_> = self.pending.values().cloned().collect();
        v.sort_by_key(|e| e.seq);
        v
    }
}

/// The engine's handle on one actor: its command sender and its view. Cheap to clone.
#[derive(Clone)]
pub(crate) struct SessionHandle {
    tx: mpsc::Sender<Command>,
    view: watch::Receiver<SessionView>,
}

impl SessionHandle {
    pub fn new(tx: mpsc::Sender<Command>, view: watch::Receiver<SessionView>) -> Self {
        Self { tx, view }
    }

    /// Whether the actor still runs.
    pub fn is_live(&self) -> bool {
        self.view.borrow().live
    }

    /// The current view (a read lock: keep it short, never across an await).
    pub fn view(&self) -> watch::Ref<'_, SessionView> {
        self.view.borrow()
    }

    /// Asks the actor to suspend (only if it is idle and no call is on its way to it);
    /// `true` when it is stopping its process for that. Then await [`Self::ended`].
    pub async fn suspend(&self, reason: String) -> bool {
        let (tx, rx) = oneshot::channel();
        if self
            .tx
            .send(Command::Suspend { reason, reply: tx })
            .await
            .is_err()
        {
            return false;
        }
        rx.await.unwrap_or(false)
    }

    /// Sends a command that has no reply; `Err` when the actor has ended.
    pub async fn send(&self, cmd: Command) -> std::result::Result<(), ()> {
        self.tx.send(cmd).await.map_err(drop)
    }

    /// Sends a command and awaits its reply.
    pub async fn call<T>(
        &self,
        id: &str,
        make: impl FnOnce(oneshot::Sender<Result<T>>) -> Command,
    ) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(make(tx))
            .await
            .map_err(|_| Error::precondition(format!("session {id:?} has just ended")))?;
        rx.await
            .map_err(|_| Error::precondition(format!("session {id:?} ended before answering")))?
    }

    /// Asks the actor to stop its process and waits until the actor has ended.
    pub async fn stop(&self, shutdown: bool) {
        let (tx, rx) = oneshot::channel();
        if self
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
        self.ended().await;
    }

    /// Resolves once the actor has ended.
    pub async fn ended(&self) {
        let mut view = self.view.clone();
        // An error means the actor is gone without saying so: ended too.
        let _ = view.wait_for(|v| !v.live).await;
    }
}

pub(crate) enum Command {
    Send {
        msg: SendMessage,
        reply: oneshot::Sender<Result<SendOutcome>>,
    },
    Respond {
        request_id: String,
        response: PermissionResponse,
        client: ClientRef,
        reply: oneshot::Sender<Result<Decided>>,
    },
    RespondHook {
        request_id: String,
        answer: ostler_protocol::hooks::HookAnswer,
        client: ClientRef,
        reply: oneshot::Sender<Result<HookDecided>>,
    },
    RespondToolCall {
        request_id: String,
        content: Vec<ostler_protocol::sdk_mcp::Content>,
        is_error: bool,
        client: ClientRef,
        reply: oneshot::Sender<Result<ToolCallDecided>>,
    },
    RespondDialog {
        request_id: String,
        behavior: DialogBehavior,
        result: Option<serde_json::Value>,
        client: ClientRef,
        reply: oneshot::Sender<Result<DialogDecided>>,
    },
    RespondElicitation {
        request_id: String,
        action: ElicitationAction,
        content: Option<serde_json::Value>,
        client: ClientRef,
        reply: oneshot::Sender<Result<ElicitationDecided>>,
    },
    Answer {
        request_id: String,
        answers: Vec<QuestionAnswer>,
        client: ClientRef,
        reply: oneshot::Sender<Result<Decided>>,
    },
    /// A control request; the reply carries the CLI's success payload, if any.
    Control {
        request: OutRequest,
        reply: oneshot::Sender<Result<Option<RawJson>>>,
    },
    /// The outcome of a control request run in its own task (also the `initialize` sent
    /// at spawn, whose reply nobody awaits).
    ControlDone {
        request: OutRequest,
        result: std::result::Result<Option<RawJson>, ControlError>,
        reply: oneshot::Sender<Result<Option<RawJson>>>,
    },
    /// The outcome of a runtime control sent again after `initialize` (recorded as
    /// `control_restored` or `control_restore_failed`).
    Restored {
        request: OutRequest,
        result: std::result::Result<Option<RawJson>, ControlError>,
    },
    /// The session's title changed in ostler's record (`UpdateSession`): sent to the CLI
    /// with `rename_session` where the release answers it, so its transcript follows.
    RenameCli { title: String },
    /// The outcome of a `rename_session` ostler sent (recorded as `cli_title_set` or
    /// `cli_title_set_failed`).
    RenameDone {
        request: OutRequest,
        result: std::result::Result<Option<RawJson>, ControlError>,
    },
    /// A user message queued for stdin has been written (or the write failed).
    SendWritten {
        seq: u64,
        /// The uuid the message carries on the wire.
        message_id: String,
        result: ostler_supervisor::Result<()>,
        reply: oneshot::Sender<Result<SendOutcome>>,
    },
    /// Suspend if idle (see [`SessionHandle::suspend`]); replies whether it is suspending.
    Suspend {
        reason: String,
        reply: oneshot::Sender<bool>,
    },
    /// Graceful stop; replies once the process has exited.
    Stop {
        reply: oneshot::Sender<Result<()>>,
        /// Daemon shutdown: the session ends `resumable` instead of `stopped`.
        shutdown: bool,
    },
    /// A stop's second step, once the running turn was interrupted (or there was none):
    /// close what is still pending and the CLI's stdin.
    StopNow,
}
