//! Plain data passed into and out of the store.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
pub use ostler_protocol::ExitFacts;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How hard a commit waits for the disk. See the crate docs, "Durability".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// `PRAGMA synchronous=NORMAL` (WAL): a commit is handed to the operating system before
    /// the append returns, so a crash of the ostler process loses nothing committed. The WAL
    /// is synced to disk at checkpoints only, so an operating-system crash or power loss may
    /// lose the most recent commits (never corrupting the database).
    #[default]
    Normal,
    /// `PRAGMA synchronous=FULL`: every commit is also synced to disk (fsync) before the
    /// append returns; survives power loss, at the cost of one fsync per group commit.
    Full,
}

impl Synchronous {
    pub(crate) fn pragma_value(self) -> &'static str {
        match self {
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
        }
    }
}

/// Options for [`crate::Store::open`].
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Commit durability; see [`Synchronous`].
    pub synchronous: Synchronous,
    /// The most write requests grouped into one transaction. `1` means one transaction per
    /// request (no group commit; useful only as a baseline).
    pub max_batch: usize,
    /// How many idle read connections are kept for reuse. Readers beyond this open (and
    /// later close) their own connection rather than wait.
    pub read_pool_size: usize,
    /// How long a connection waits on a lock held by another connection (another process
    /// on the same file, or a checkpoint) before giving up.
    pub busy_timeout: Duration,
    /// How long a write that meets a storage fault (disk full, read-only files, I/O errors)
    /// is retried before it fails with [`crate::Error::Unwritable`]; meanwhile its caller
    /// waits and [`crate::Store::write_health`] reports the fault.
    pub write_retry_limit: Duration,
    /// Under [`Synchronous::Normal`]: the longest a commit stays unsynced in the WAL (the
    /// checkpointer syncs the WAL file that long after the first commit it has not synced),
    /// and so what a power failure or an OS crash can lose. `None`: commits are synced by
    /// checkpoints (under load, a fraction of a second apart) and the kernel's write-back
    /// only. Not used under [`Synchronous::Full`], where every commit syncs.
    pub sync_within: Option<Duration>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            synchronous: Synchronous::Normal,
            max_batch: 1024,
            read_pool_size: 4,
            busy_timeout: Duration::from_secs(5),
            write_retry_limit: Duration::from_secs(120),
            sync_within: Some(Duration::from_secs(1)),
        }
    }
}

/// An event to append to a session's log. The store does not look inside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEvent {
    /// The event kind, e.g. `"assistant_block"`.
    pub kind: Cow<'static, str>,
    /// The engine's canonical encoding of the event.
    pub payload: Bytes,
    /// The CLI's original NDJSON line, when there is one.
    pub raw: Option<Bytes>,
    /// When the event happened (epoch milliseconds).
    pub ts_ms: i64,
}

impl NewEvent {
    /// An event without a raw line.
    pub fn new(kind: impl Into<Cow<'static, str>>, payload: impl Into<Bytes>, ts_ms: i64) -> Self {
        Self {
            kind: kind.into(),
            payload: payload.into(),
            raw: None,
            ts_ms,
        }
    }

    /// Adds the CLI's original line.
    pub fn with_raw(mut self, raw: impl Into<Bytes>) -> Self {
        self.raw = Some(raw.into());
        self
    }
}

/// An event read back from a session's log, exactly as it was appended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// The ostler session id (shared between the events of one read).
    pub session_id: Arc<str>,
    /// Position in the session's log: 1, 2, 3, ... without gaps.
    pub seq: u64,
    /// The event kind (shared between events of the same kind within one read).
    pub kind: Arc<str>,
    /// The canonical encoding, as appended.
    pub payload: Bytes,
    /// The CLI's original line, as appended.
    pub raw: Option<Bytes>,
    /// When the event happened (epoch milliseconds).
    pub ts_ms: i64,
}

/// How a session's CLI process ended: the session's exit columns. The engine's stored
/// `process_exited` event flattens this (and adds the stderr tail), so its JSON form is the
/// one those events have always had: `code`, `signal`, `reason` (each left out when absent)
/// and `at_ms`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ExitInfo {
    /// Exit code and signal.
    #[serde(flatten)]
    pub facts: ExitFacts,
    /// A human-readable reason (e.g. "killed by client", "CLI crashed").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When it ended (epoch milliseconds).
    pub at_ms: i64,
}

/// A session to create.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NewSession {
    /// The ostler session id (unique).
    pub id: String,
    /// The CLI's session id, when already known (e.g. when resuming).
    pub claude_session_id: Option<String>,
    /// The session's working directory.
    pub cwd: String,
    /// The model, when chosen.
    pub model: Option<String>,
    /// The permission mode, when chosen.
    pub permission_mode: Option<String>,
    /// The CLI release the session runs.
    pub cli_release: Option<String>,
    /// The initial state.
    pub state: SessionState,
    /// Labels (key → value).
    pub labels: BTreeMap<String, String>,
    /// Creation time (epoch milliseconds); also the initial `updated_ms`.
    pub created_ms: i64,
}

/// Changes to a session. `None` fields are left as they are.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SessionPatch {
    /// New CLI session id.
    pub claude_session_id: Option<String>,
    /// New model.
    pub model: Option<String>,
    /// New permission mode.
    pub permission_mode: Option<String>,
    /// New CLI release.
    pub cli_release: Option<String>,
    /// New state.
    pub state: Option<SessionState>,
    /// Replaces all labels.
    pub labels: Option<BTreeMap<String, String>>,
    /// Records how the process ended.
    pub exit: Option<ExitInfo>,
    /// The time of the change (becomes `updated_ms`).
    pub updated_ms: i64,
}

/// Usage totals (tokens and cost), per turn or summed over a session.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct UsageTotals {
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Tokens written to the prompt cache.
    pub cache_creation_input_tokens: u64,
    /// Tokens read from the prompt cache.
    pub cache_read_input_tokens: u64,
    /// Cost in US dollars.
    pub cost_usd: f64,
}

/// A session as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRecord {
    /// The ostler session id.
    pub id: String,
    /// The CLI's session id, once known.
    pub claude_session_id: Option<String>,
    /// Working directory.
    pub cwd: String,
    /// Model.
    pub model: Option<String>,
    /// Permission mode.
    pub permission_mode: Option<String>,
    /// CLI release.
    pub cli_release: Option<String>,
    /// State.
    pub state: SessionState,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Creation time (epoch milliseconds).
    pub created_ms: i64,
    /// Last update (epoch milliseconds).
    pub updated_ms: i64,
    /// How the process ended, once it has.
    pub exit: Option<ExitInfo>,
    /// Number of turns with recorded usage.
    pub turns: u64,
    /// Usage summed over all turns.
    pub usage: UsageTotals,
    /// The seq of the session's last event (0 when it has none).
    pub last_seq: u64,
    /// A short name for people (`--name`, else the first prompt shortened).
    pub title: Option<String>,
    /// Archived by a client ([`crate::Store::update_meta`]; migration 0014).
    pub archived: bool,
}

/// Which sessions [`crate::Store::list_sessions`] returns. Empty fields do not filter.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SessionFilter {
    /// Sessions in any of these states.
    pub states: Vec<SessionState>,
    /// Sessions carrying all of these labels (key = value).
    pub labels: Vec<(String, String)>,
    /// Created at or after this time (epoch milliseconds).
    pub created_from_ms: Option<i64>,
    /// Created strictly before this time (epoch milliseconds).
    pub created_before_ms: Option<i64>,
    /// Only archived sessions (`Some(true)`) or only the others (`Some(false)`).
    pub archived: Option<bool>,
}

/// One page of [`crate::Store::list_sessions`], ordered by creation time then id.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionPage {
    /// The sessions of this page.
    pub sessions: Vec<SessionRecord>,
    /// Pass this to get the next page; `None` when this is the last page.
    pub next_page_token: Option<String>,
}

/// Where a session stands: the one definition of the vocabulary stored in the `state`
/// column, used by the engine and (mapped) by the API.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// The CLI process is being spawned; no `system/init` seen yet. (The state a new
    /// session starts in.)
    #[default]
    Starting,
    /// Alive, waiting for input (no turn running).
    Idle,
    /// Alive, a turn is running.
    Running,
    /// Alive, a turn is blocked on at least one pending permission request or question.
    AwaitingPermission,
    /// Stopped on request (graceful stop). Resumable.
    Stopped,
    /// The CLI process ended on its own (crash, non-zero exit, killed). Resumable.
    Exited,
    /// The session was live when the daemon last stopped or died; it was not respawned.
    /// Resumable.
    Resumable,
    /// Idle long enough (or made room for another session): its CLI process was stopped
    /// gracefully. The next message or control call resumes it on demand.
    Suspended,
}

impl SessionState {
    /// Every state.
    pub const ALL: [SessionState; 8] = [
        SessionState::Starting,
        SessionState::Idle,
        SessionState::Running,
        SessionState::AwaitingPermission,
        SessionState::Stopped,
        SessionState::Exited,
        SessionState::Resumable,
        SessionState::Suspended,
    ];

    /// True while a CLI process backs the session.
    pub fn is_live(self) -> bool {
        matches!(
            self,
            SessionState::Starting
                | SessionState::Idle
                | SessionState::Running
                | SessionState::AwaitingPermission
        )
    }
}

/// What kind of interaction a session raised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InteractionKind {
    /// A tool permission request (`can_use_tool`).
    Permission,
    /// A question to the user.
    Question,
    /// A hook call answered by clients (issue 11).
    Hook,
    /// A call of a client-hosted tool (`mcp_message` `tools/call`, issue 11).
    ToolCall,
    /// An MCP server's request for the user's input (the CLI's `elicitation`).
    Elicitation,
    /// A dialog the CLI asks the host for (its `request_user_dialog`).
    Dialog,
}

/// Where an interaction stands. Everything but `Pending` is final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InteractionState {
    /// Waiting for a decision.
    Pending,
    /// Permission granted.
    Allowed,
    /// Permission refused.
    Denied,
    /// Question answered.
    Answered,
    /// Nobody decided in time, or the session ended first.
    Expired,
    /// Withdrawn (e.g. by the CLI or an interrupt).
    Cancelled,
}

macro_rules! str_enum {
    ($ty:ident { $($variant:ident => $s:literal),* $(,)? }) => {
        impl $ty {
            /// The stored (and displayed) name.
            pub fn as_str(self) -> &'static str {
                match self { $($ty::$variant => $s),* }
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
        impl FromStr for $ty {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self> {
                match s {
                    $($s => Ok($ty::$variant),)*
                    other => Err(Error::InvalidData(format!(
                        concat!("unknown ", stringify!($ty), " {:?}"), other
                    ))),
                }
            }
        }
    };
}

str_enum!(SessionState {
    Starting => "starting",
    Idle => "idle",
    Running => "running",
    AwaitingPermission => "awaiting_permission",
    Stopped => "stopped",
    Exited => "exited",
    Resumable => "resumable",
    Suspended => "suspended",
});
str_enum!(InteractionKind {
    Permission => "permission",
    Question => "question",
    Hook => "hook",
    ToolCall => "tool_call",
    Elicitation => "elicitation",
    Dialog => "dialog",
});
str_enum!(InteractionState {
    Pending => "pending",
    Allowed => "allowed",
    Denied => "denied",
    Answered => "answered",
    Expired => "expired",
    Cancelled => "cancelled",
});

impl InteractionState {
    /// True for every state but `Pending`.
    pub fn is_final(self) -> bool {
        self != InteractionState::Pending
    }
}

/// A permission request or question to record (as `pending`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewInteraction {
    /// The session that raised it.
    pub session_id: String,
    /// The CLI's request id (unique within the session).
    pub request_id: String,
    /// Permission or question.
    pub kind: InteractionKind,
    /// The tool asking for permission.
    pub tool_name: Option<String>,
    /// The tool input / question, JSON as received.
    pub input: Bytes,
    /// The CLI's permission suggestions, JSON as received.
    pub suggestions: Option<Bytes>,
    /// The seq of the event that carried the request, if logged.
    pub event_seq: Option<u64>,
    /// When it was raised (epoch milliseconds).
    pub created_ms: i64,
}

/// A decision on a pending interaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The final state; must not be `Pending`.
    pub state: InteractionState,
    /// Who decided: a client id, or `rule:<name>` for a permission rule.
    pub decided_by: String,
    /// The response sent to the CLI, as sent.
    pub response: Option<Bytes>,
    /// When (epoch milliseconds).
    pub decided_ms: i64,
}

/// A stored interaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interaction {
    /// The session that raised it.
    pub session_id: String,
    /// The CLI's request id.
    pub request_id: String,
    /// Permission or question.
    pub kind: InteractionKind,
    /// The tool asking.
    pub tool_name: Option<String>,
    /// The input, as received.
    pub input: Bytes,
    /// The suggestions, as received.
    pub suggestions: Option<Bytes>,
    /// The seq of the event that carried the request.
    pub event_seq: Option<u64>,
    /// Where it stands.
    pub state: InteractionState,
    /// When it was raised.
    pub created_ms: i64,
    /// Who decided, once decided.
    pub decided_by: Option<String>,
    /// When it was decided.
    pub decided_ms: Option<i64>,
    /// The response sent, once decided.
    pub response: Option<Bytes>,
}

/// What a request id (or a prefix of one) names: the answer of
/// [`crate::Store::lookup_interaction`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InteractionLookup {
    /// Exactly one interaction: the exact id (in one session), or the one id the prefix
    /// starts.
    Found(Interaction),
    /// No request id is or starts with it.
    NotFound,
    /// The exact id in several sessions: a session id must say which (a few of them).
    InSessions(Vec<Interaction>),
    /// A prefix of several request ids and none exactly (a few of them; `more`: there are
    /// others).
    Ambiguous {
        /// The first few candidates, by request id.
        candidates: Vec<Interaction>,
        /// Whether more match than `candidates` holds.
        more: bool,
    },
}

/// The result of [`crate::Store::decide_interaction`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecideOutcome {
    /// This decision won; the interaction as now stored.
    Decided(Interaction),
    /// Someone decided first (or it expired / was cancelled); the interaction as stored,
    /// naming who (`decided_by`) and how (`state`).
    AlreadyDecided(Interaction),
}

/// Usage of one turn, to record.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TurnUsage {
    /// The event the figures came from (e.g. the turn's result event).
    pub event_seq: Option<u64>,
    /// The model that served the turn.
    pub model: Option<String>,
    /// Tokens and cost of this turn.
    pub usage: UsageTotals,
    /// Wall time of the turn.
    pub duration_ms: Option<u64>,
    /// When the turn ended (epoch milliseconds).
    pub ts_ms: i64,
}

/// A recorded turn.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredTurnUsage {
    /// 1, 2, 3, ... per session, assigned by the store.
    pub turn: u64,
    /// What was recorded.
    pub turn_usage: TurnUsage,
}

/// A session's usage: totals and every turn.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionUsage {
    /// Sum over all turns.
    pub totals: UsageTotals,
    /// Each turn, in order.
    pub turns: Vec<StoredTurnUsage>,
}

/// Writes that commit in one transaction with a session's events (see
/// [`crate::Store::append_with`]): all of them or none.
#[derive(Debug, Clone, Default)]
pub struct WithEvents {
    /// Decide this interaction (request id, decision) first. When it was already decided,
    /// nothing at all is written and [`AppendedWith::decided`] says who decided.
    pub decide: Option<(String, Decision)>,
    /// Record this interaction as pending, its `event_seq` set to the seq of the stored
    /// event at this index of the appended events.
    pub interaction: Option<(NewInteraction, usize)>,
    /// Change the session.
    pub patch: Option<SessionPatch>,
}

/// The result of [`crate::Store::append_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendedWith {
    /// Seqs of the appended events (empty when the decision lost).
    pub seqs: Vec<u64>,
    /// The decision's outcome, when one was asked for.
    pub decided: Option<DecideOutcome>,
}

/// A client's change to a session's title, labels and archived mark
/// ([`crate::Store::update_meta`]). Empty fields leave things as they are.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetaPatch {
    /// The new title ([`crate::MAX_TITLE_CHARS`] at most: longer text is shortened).
    pub title: Option<String>,
    /// Labels to add or to give a new value.
    pub set_labels: BTreeMap<String, String>,
    /// Label keys to remove (a key the session does not carry is no change).
    pub remove_labels: Vec<String>,
    /// The new archived mark.
    pub archived: Option<bool>,
    /// The most labels the session may carry after the change (0: no limit); more is
    /// [`crate::Error::InvalidArgument`] and nothing is written.
    pub max_labels: usize,
    /// The time of the change (becomes `updated_ms` when something changed).
    pub updated_ms: i64,
}

/// What a [`MetaPatch`] changed: only the parts that differ from what was stored.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetaChange {
    /// The title before (`None`: it had none) and after, when it changed.
    pub title: Option<(Option<String>, String)>,
    /// Labels added or given a new value.
    pub labels_set: BTreeMap<String, String>,
    /// Labels removed (keys the session carried).
    pub labels_removed: Vec<String>,
    /// The new archived mark, when it changed.
    pub archived: Option<bool>,
}

impl MetaChange {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.title.is_none()
            && self.labels_set.is_empty()
            && self.labels_removed.is_empty()
            && self.archived.is_none()
    }
}

/// Builds the event that records a [`MetaChange`] in the session's log (the engine's
/// `session_updated` notice); called by the writer inside the update's transaction.
pub type MetaNotice = std::sync::Arc<dyn Fn(&MetaChange) -> crate::Result<NewEvent> + Send + Sync>;

/// The result of [`crate::Store::update_meta`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaUpdated {
    /// What changed (empty for a no-op).
    pub change: MetaChange,
    /// The seq of the recording event; `None` when nothing changed (nothing was written).
    pub seq: Option<u64>,
}
