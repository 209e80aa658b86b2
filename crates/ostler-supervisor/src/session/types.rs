//! The plain data of a session process: how to start it, the daemon-wide policy, how it
//! ended.

use std::path::PathBuf;
use std::time::Duration;

use ostler_protocol::ExitFacts;

use crate::env::{DEFAULT_ENV_ALLOWLIST, DEFAULT_SCRUB};
use crate::options::CliOptions;

/// How to start one session: its CLI options (what the engine records and re-applies on
/// resume) plus what only concerns this process.
#[derive(Debug, Clone, Default)]
pub struct SpawnOptions {
    pub cwd: PathBuf,
    /// The session's CLI options (model, tools, prompts, MCP servers, ...).
    pub cli: CliOptions,
    /// `--resume SESSION_ID`.
    pub resume: Option<String>,
    /// `--fork-session` (with `resume` only); an error on releases without it.
    pub fork_session: bool,
    /// `--resume-session-at VALUE` (with `resume` only): the transcript entry, in the
    /// release's dialect (`Capabilities::resume_at`), after which the conversation is cut.
    pub resume_session_at: Option<String>,
    /// `--resume-drops-turn UUID` (with `resume_session_at` only): the prompt uuid of the
    /// one turn the cut may drop; the CLI refuses the resume (an `error_during_execution`
    /// result, exit 1) when anything else lies past the cut. An error on releases measured
    /// without it.
    pub resume_drops_turn: Option<String>,
    /// Dropped (with a warning; the installation reports `DEGRADED`) on releases without it.
    pub include_partial_messages: bool,
    /// The daemon's variables for every session (`[sessions.env]`), set after the
    /// allowlist; `cli.env` is set after these (the session's own win).
    pub env: Vec<(String, String)>,
    /// Identifies the session in logs.
    pub log_id: String,
    /// `title` in `initialize`: the CLI names its session so (its transcript's
    /// `custom-title`; no title of its own). Only at a session's first start (create,
    /// fork) and only a title the client gave; a resume keeps the CLI's persisted title.
    /// Not sent to a release measured not to honour it (`init_fields` `title`).
    pub title: Option<String>,
}

/// Policy shared by all sessions of a daemon.
#[derive(Debug, Clone)]
pub struct SupervisorOptions {
    /// Inherited variables passed to the CLI (exact names or `PREFIX*`).
    pub env_allowlist: Vec<String>,
    /// Inherited variables never passed, even when allowlisted.
    pub scrub: Vec<String>,
    /// After closing stdin, how long to wait before SIGTERM.
    pub stop_grace: Duration,
    /// After SIGTERM, how long to wait before SIGKILL.
    pub term_grace: Duration,
    /// How long a control request we send may wait for its response.
    pub control_timeout: Duration,
    /// Report [`super::ProcessEvent::Stall`] after this long without output while a turn runs and
    /// no permission prompt is open. `None`: no watchdog.
    pub stall_after: Option<Duration>,
    /// Kill the process on a stall (off by default: a stall is reported, not judged).
    pub kill_on_stall: bool,
    /// Bytes of stderr kept for the exit report.
    pub stderr_tail_bytes: usize,
    /// Per-line cap of stdout (the framer keeps only the head of longer lines).
    pub max_payload_bytes: usize,
    /// Capacity of the event channel.
    pub event_buffer: usize,
    /// Tag of the processes of this supervisor's sessions: each session process gets
    /// `OSTLER_PROCESS_TREE=<tag>/<session>/<n>` in its environment, which its descendants
    /// inherit (see [`crate::proctree`]). The daemon derives it from its store, so that a
    /// restarted daemon finds the leftovers of its previous life.
    pub process_tag: String,
    /// Session cgroups (see [`crate::cgroup`]): each session process starts in a cgroup of
    /// its own, killed and removed when the session ends. `None`: not used.
    pub cgroups: Option<std::sync::Arc<crate::cgroup::Cgroups>>,
}

impl Default for SupervisorOptions {
    fn default() -> Self {
        Self {
            env_allowlist: DEFAULT_ENV_ALLOWLIST
                .iter()
                .map(|s| s.to_string())
                .collect(),
            scrub: DEFAULT_SCRUB.iter().map(|s| s.to_string()).collect(),
            stop_grace: Duration::from_secs(5),
            term_grace: Duration::from_secs(3),
            control_timeout: Duration::from_secs(30),
            stall_after: Some(Duration::from_secs(300)),
            kill_on_stall: false,
            stderr_tail_bytes: 16 * 1024,
            max_payload_bytes: ostler_protocol::DEFAULT_MAX_PAYLOAD_BYTES,
            event_buffer: 256,
            process_tag: format!("pid{}", std::process::id()),
            cgroups: None,
        }
    }
}

/// How the process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitInfo {
    /// Exit code and signal.
    pub facts: ExitFacts,
    /// The end of stderr (at most `stderr_tail_bytes`, lossy UTF-8).
    pub stderr_tail: String,
    /// Whether ostler asked it to end (stop, kill, dropped handle, kill on stall).
    pub requested: bool,
}

impl ExitInfo {
    /// A clean exit: code 0 and no signal.
    pub fn success(&self) -> bool {
        self.facts.success()
    }
}
