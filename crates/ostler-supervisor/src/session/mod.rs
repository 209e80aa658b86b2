//! One `claude` session process: spawn, I/O tasks, control requests, stop, crash, stall.
//!
//! ## Files
//! `types` (options, [`ExitInfo`]) and `error` are plain data; `shared` is the state the
//! handle and the tasks share (and the stdin queue); `spawn` builds the command (argv,
//! environment, mark, parent-death signal); `io` holds the stdin writer, the stdout reader
//! and the stderr tail; `control` the control requests in both directions; `watchdog` the
//! stall detection; `process` the exit (wait, reap, kill leftovers), the graceful stop and
//! the kill on the last handle's drop; `events` what the owner receives. Imports go one
//! way: this file -> `spawn`, `process` -> `io`, `watchdog` -> `events` -> `control` ->
//! `shared` -> `types`, `error`.
//!
//! ## Tasks per process
//! - **writer**: owns the child's stdin; every message (user messages, control requests,
//!   control responses) goes through one unbounded queue, so two messages never
//!   interleave and their order is the order of the calls. stdin is closed only by
//!   [`SessionProcess::stop`] (never after a `result`: background tasks and sub-agents live
//!   on).
//! - **reader**: stdout -> [`LineFramer`](ostler_protocol::LineFramer) (per-line cap) ->
//!   [`Decoder`](ostler_protocol::Decoder) -> one [`ProcessEvent::Line`] per line. Events
//!   go to a bounded channel with `send().await`: when the owner is slow, the reader stops
//!   reading, the pipe fills and the CLI blocks writing; nothing is dropped. The reader
//!   sends [`ProcessEvent::Exited`] last.
//! - **stderr**: kept as a bounded tail (for the exit report) and logged line by line with
//!   the session's `log_id`.
//! - **supervisor**: waits for the exit, then SIGKILLs what is left of the process group
//!   (tool processes the CLI started) and publishes the [`ExitInfo`].
//! - **watchdog** (when `stall_after` is set): see [`ProcessEvent::Stall`].
//!
//! ## Control requests from the CLI
//! Each line is delivered once, owned ([`Line`]). A `can_use_tool` / `hook_callback` /
//! unknown request stays among the line's events and comes with one [`Responder`] in
//! [`Line::responders`]. The responder answers exactly once (it is consumed). **Dropping it
//! unanswered answers for the owner**: `can_use_tool` gets `deny` with the message
//! [`NO_DECISION`], every other subtype an `error` response with the same message, so the
//! CLI is never left waiting and no entry is kept. A `control_cancel_request` from the CLI
//! removes the request (answering it afterwards returns [`Error::NotPending`] and writes
//! nothing); its line lists the withdrawn id in [`Line::cancelled`].
//!
//! ## Ownership
//! [`SessionProcess`] is a cheap clonable handle. When the last handle is dropped, or the
//! event receiver is dropped, the process group is killed: nobody could drive or observe
//! the session any more.
//!
//! ## Parent death
//! The child gets `PR_SET_PDEATHSIG(SIGKILL)`. Linux delivers it when the *thread* that
//! forked exits, so spawn from a runtime worker thread (any async context), not from a
//! short-lived `spawn_blocking` thread.

mod control;
mod error;
mod events;
mod io;
mod process;
mod shared;
mod spawn;
mod types;
mod watchdog;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ostler_protocol::model::RawJson;
use ostler_protocol::outbound::{Delivery, OutRequest, UserContent};
use ostler_protocol::{Decoder, Outbound};
use tokio::sync::{mpsc, watch};

pub use control::{NO_DECISION, Responder};
pub use error::{ControlError, Error, Result};
pub use events::{Line, ProcessEvent};
pub use shared::WriteAck;
pub use spawn::{check_start, session_args};
pub use types::{ExitInfo, SpawnOptions, SupervisorOptions};

use crate::child::spawn_retrying;
use crate::installation::Installation;
use process::DropGuard;
use shared::{Shared, lock};

/// A running session process. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SessionProcess {
    shared: Arc<Shared>,
    /// The answer to the `initialize` sent at spawn, awaited in its own task; taken once.
    initialize: Arc<Mutex<Option<InitializeAnswer>>>,
    /// The request id that `initialize` went out with.
    initialize_id: Option<Arc<str>>,
    _guard: Arc<DropGuard>,
}

/// The answer to the `initialize` request sent at spawn (see
/// [`SessionProcess::take_initialize`]).
pub type InitializeAnswer =
    tokio::task::JoinHandle<std::result::Result<Option<RawJson>, ControlError>>;

impl SessionProcess {
    /// Start a session process. The first user message goes through stdin
    /// ([`SessionProcess::send_user`]); no prompt is put on the command line.
    pub async fn spawn(
        inst: &Installation,
        opts: SpawnOptions,
        sup: SupervisorOptions,
    ) -> Result<(SessionProcess, mpsc::Receiver<ProcessEvent>)> {
        let args = session_args(inst, &opts)?;
        if !opts.cwd.is_dir() {
            return Err(Error::InvalidOptions(format!(
                "cwd {} is not an existing directory",
                opts.cwd.display()
            )));
        }
        let (mut cmd, mark) = spawn::command(inst, &opts, &sup, args.clone())?;
        let mut child = spawn_retrying(&mut cmd)
            .await
            .map_err(|source| Error::Spawn {
                path: inst.path.clone(),
                source,
            })?;
        let pid = child.id().ok_or(Error::ProcessGone)?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(Error::ProcessGone);
        };
        tracing::info!(session = %opts.log_id, pid, version = %inst.version, cwd = %opts.cwd.display(), "session process started");

        let (wtx, wrx) = mpsc::unbounded_channel();
        let (exit_tx, exit_rx) = watch::channel(None);
        let (etx, erx) = mpsc::channel(sup.event_buffer.max(1));
        let shared = Arc::new(Shared {
            pid,
            log_id: opts.log_id.clone(),
            mark,
            writer: wtx,
            pending: Mutex::new(HashMap::new()),
            open_requests: Mutex::new(HashSet::new()),
            next_id: AtomicU64::new(1),
            exit_rx,
            requested: AtomicBool::new(false),
            turn_running: AtomicBool::new(false),
            started: Instant::now(),
            last_activity_ms: AtomicU64::new(0),
            session_id: Mutex::new(opts.resume.clone().filter(|_| !opts.fork_session)),
            announced: Mutex::new(None),
            opts: sup.clone(),
            args,
            version: inst.version.clone(),
        });

        tokio::spawn(io::writer_task(stdin, wrx, opts.log_id.clone()));
        let tail = Arc::new(Mutex::new(io::Tail::new(sup.stderr_tail_bytes)));
        let stderr_task = tokio::spawn(io::stderr_task(stderr, tail.clone(), opts.log_id.clone()));
        tokio::spawn(process::supervise_task(
            child,
            shared.clone(),
            exit_tx,
            stderr_task,
            tail,
        ));
        let watchdog = sup
            .stall_after
            .map(|after| tokio::spawn(watchdog::watchdog_task(shared.clone(), etx.clone(), after)));
        let decoder = Decoder::for_release(Some(&inst.version));
        tokio::spawn(io::reader_task(
            stdout,
            shared.clone(),
            etx,
            decoder,
            watchdog,
        ));
        // `initialize` goes first on stdin: queued now, before any user message can be.
        let mut initialize_id = None;
        let initialize = spawn::initialize_request(inst, &opts).map(|req| {
            let sent = control::send(&shared, req);
            initialize_id = sent.as_ref().ok().map(|s| Arc::from(s.request_id()));
            let shared = shared.clone();
            tokio::spawn(async move { control::wait(&shared, sent?, Duration::ZERO).await })
        });

        Ok((
            SessionProcess {
                _guard: Arc::new(DropGuard(shared.clone())),
                initialize: Arc::new(Mutex::new(initialize)),
                initialize_id,
                shared,
            },
            erx,
        ))
    }

    pub fn pid(&self) -> u32 {
        self.shared.pid
    }

    pub fn log_id(&self) -> &str {
        &self.shared.log_id
    }

    /// The command-line arguments the process was started with, the inline JSON of
    /// `--settings` and `--mcp-config` included (the CLI gets those as `/dev/fd/N` paths).
    pub fn args(&self) -> &[String] {
        &self.shared.args
    }

    /// The session id announced by the CLI (`system/init`), once seen.
    pub fn session_id(&self) -> Option<String> {
        lock(&self.shared.session_id).clone()
    }

    /// The `capabilities` the CLI announced in its `system/init` (empty list: none
    /// announced; `None`: no init seen yet). This is the truth for releases that are not
    /// pinned; features check it rather than version numbers.
    pub fn announced_capabilities(&self) -> Option<Vec<String>> {
        lock(&self.shared.announced).clone()
    }

    /// The answer to the `initialize` request sent at spawn (the CLI's commands, models,
    /// account, output styles, agents), once: `None` when it was not sent (the release
    /// does not answer it) or already taken. The task ends with the answer, an error
    /// answer, the control timeout or the process's exit; it never waits longer.
    pub fn take_initialize(&self) -> Option<InitializeAnswer> {
        lock(&self.initialize).take()
    }

    /// The request id of the `initialize` sent at spawn (`None` when none was sent): its
    /// `control_response` line carries it.
    pub fn initialize_request_id(&self) -> Option<&str> {
        self.initialize_id.as_deref()
    }

    /// Whether a turn is running (a user message was sent and its `result` not yet seen).
    pub fn turn_running(&self) -> bool {
        self.shared.turn_running.load(Ordering::SeqCst)
    }

    /// Control requests from the CLI that are still unanswered.
    pub fn open_requests(&self) -> usize {
        lock(&self.shared.open_requests).len()
    }

    /// Send a user message (starts a turn). Returns once it is written to stdin.
    pub async fn send_user(&self, content: UserContent) -> Result<()> {
        self.queue_user(content)?.written().await
    }

    /// Queues a user message (starts a turn) for stdin and returns at once: the message is
    /// ordered with every write queued before and after it, and [`WriteAck::written`]
    /// resolves once it is written. For an owner that must keep draining the process's
    /// events while a large message is written (the CLI may not read stdin while its
    /// stdout is full).
    pub fn queue_user(&self, content: UserContent) -> Result<WriteAck> {
        self.queue_user_tagged(content, None, Delivery::default())
    }

    /// [`SessionProcess::queue_user`] with the message's `uuid` (the id `rewind_files`
    /// names it by) and how the CLI is to take it (written as is: the caller checks the
    /// release honours it).
    pub fn queue_user_tagged(
        &self,
        content: UserContent,
        uuid: Option<String>,
        delivery: Delivery,
    ) -> Result<WriteAck> {
        let session_id = self.session_id().unwrap_or_default();
        let line = Outbound::User {
            content,
            parent_tool_use_id: None,
            session_id,
            uuid,
            delivery,
        }
        .to_line();
        self.shared.turn_running.store(true, Ordering::SeqCst);
        self.shared.touch();
        self.shared.queue(line)
    }

    /// Send any outbound message as is (ordered with everything else).
    pub async fn send(&self, msg: &Outbound) -> Result<()> {
        if matches!(msg, Outbound::User { .. }) {
            self.shared.turn_running.store(true, Ordering::SeqCst);
        }
        self.shared.touch();
        self.shared.write(msg.to_line()).await
    }

    /// Send a control request and await its `control_response`. The success payload is
    /// returned as is (`None` when the CLI sent none, e.g. 1.0.x's `interrupt`).
    pub async fn request(&self, request: OutRequest) -> Result<Option<RawJson>, ControlError> {
        control::request(&self.shared, request, Duration::ZERO).await
    }

    /// Queues a control request for stdin now, ordered before anything written after this
    /// returns (a user message queued next goes after it), and awaits its answer in a task of
    /// its own (ending with the answer, an error answer, the control timeout or the
    /// process's exit). For the requests that must reach the CLI right after `initialize`,
    /// before any user message.
    pub fn queue_request(&self, request: OutRequest) -> InitializeAnswer {
        let sent = control::send(&self.shared, request);
        let shared = self.shared.clone();
        tokio::spawn(async move { control::wait(&shared, sent?, Duration::ZERO).await })
    }

    /// [`Self::request`] allowed `extra` beyond the control timeout: for a request the CLI
    /// answers only after a hook of ostler's (a client's answer) returns.
    pub async fn request_within(
        &self,
        request: OutRequest,
        extra: Duration,
    ) -> Result<Option<RawJson>, ControlError> {
        control::request(&self.shared, request, extra).await
    }

    /// How the process ended, if it has.
    pub fn exit_info(&self) -> Option<ExitInfo> {
        self.shared.exit_rx.borrow().clone()
    }

    /// Wait for the process to end (on its own or by request).
    pub async fn wait(&self) -> ExitInfo {
        process::wait(&self.shared).await
    }

    /// Graceful stop: close stdin, wait `stop_grace`, SIGTERM the group, wait `term_grace`,
    /// SIGKILL. Returns once the process is reaped and its group signalled.
    pub async fn stop(&self) -> ExitInfo {
        process::stop(&self.shared).await
    }

    /// SIGKILL the process group now (the exit arrives as [`ProcessEvent::Exited`]).
    pub fn kill(&self) {
        self.shared.set_requested();
        self.shared.kill_group(nix::sys::signal::Signal::SIGKILL);
    }

    /// The CLI release this process runs.
    pub fn version(&self) -> &semver::Version {
        &self.shared.version
    }
}
