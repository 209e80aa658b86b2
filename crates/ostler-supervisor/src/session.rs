//! One `claude` session process: spawn, I/O tasks, control requests, stop, crash, stall.
//!
//! ## Tasks per process
//! - **writer**: owns the child's stdin; every message (user messages, control requests,
//!   control responses) goes through one unbounded queue, so two messages never
//!   interleave and their order is the order of the calls. stdin is closed only by
//!   [`SessionProcess::stop`] (never after a `result`: background tasks and sub-agents live
//!   on).
//! - **reader**: stdout -> [`LineFramer`] (per-line cap) -> [`Decoder`] -> events. Events
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
//! Each `can_use_tool` / `hook_callback` / unknown request is surfaced once as
//! [`ProcessEvent::ControlRequest`] with a [`Responder`]. The responder answers exactly
//! once (it is consumed). **Dropping it unanswered answers for the owner**: `can_use_tool`
//! gets `deny` with the message [`NO_DECISION`], every other subtype an `error` response
//! with the same message, so the CLI is never left waiting and no entry is kept. A
//! `control_cancel_request` from the CLI removes the request (answering it afterwards
//! returns [`Error::NotPending`] and writes nothing) and is surfaced as
//! [`ProcessEvent::ControlCancelled`].
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

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use ostler_protocol::junk::{JunkCoalescer, JunkOptions};
use ostler_protocol::model::{CliRequest, ControlOutcome, RawJson};
use ostler_protocol::outbound::{OutRequest, ResponseBody, UserContent};
use ostler_protocol::{
    DecodedLine, Decoder, Diagnostic, DiagnosticCode, Event, Frame, FramerOptions, LineFramer,
    Outbound,
};
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};

use crate::discover::Installation;
use crate::env::{DEFAULT_ENV_ALLOWLIST, DEFAULT_SCRUB, build_env};

/// The message of the answer given for an owner who dropped a [`Responder`].
pub const NO_DECISION: &str = "ostler: no decision was made for this request";

/// How to start one session.
#[derive(Debug, Clone, Default)]
pub struct SpawnOptions {
    pub cwd: PathBuf,
    pub model: Option<String>,
    /// `default`, `acceptEdits`, `plan`, `bypassPermissions`, ...
    pub permission_mode: Option<String>,
    pub allowed_tools: Vec<String>,
    pub disallowed_tools: Vec<String>,
    pub append_system_prompt: Option<String>,
    /// Dropped (with a warning) on releases without `--max-turns`.
    pub max_turns: Option<u32>,
    /// `--resume SESSION_ID`.
    pub resume: Option<String>,
    /// `--fork-session` (with `resume` only); an error on releases without it.
    pub fork_session: bool,
    /// Dropped (with a warning; the installation reports `DEGRADED`) on releases without it.
    pub include_partial_messages: bool,
    /// Per-session environment variables, set after the allowlist (they win).
    pub env: Vec<(String, String)>,
    /// Identifies the session in logs.
    pub log_id: String,
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
    /// Report [`ProcessEvent::Stall`] after this long without output while a turn runs and
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
        }
    }
}

/// How the process ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitInfo {
    pub code: Option<i32>,
    /// The signal that killed it (e.g. 9 for `kill -9`).
    pub signal: Option<i32>,
    /// The end of stderr (at most `stderr_tail_bytes`, lossy UTF-8).
    pub stderr_tail: String,
    /// Whether ostler asked it to end (stop, kill, dropped handle, kill on stall).
    pub requested: bool,
}

impl ExitInfo {
    /// A clean exit: code 0 and no signal.
    pub fn success(&self) -> bool {
        self.code == Some(0) && self.signal.is_none()
    }
}

/// What happens in a session process, in order.
#[derive(Debug)]
pub enum ProcessEvent {
    /// Every stdout line, decoded, in stdout order (the raw line is kept in it).
    Line(Arc<DecodedLine>),
    /// A control request from the CLI (follows its `Line`). Answer with the responder.
    ControlRequest {
        request: ostler_protocol::model::ControlRequest,
        responder: Responder,
    },
    /// The CLI withdrew one of its control requests (follows its `Line`).
    ControlCancelled { request_id: String },
    /// No output for `idle_for` while a turn runs and no permission prompt is open.
    Stall { idle_for: Duration },
    /// The process ended; always the last event.
    Exited(ExitInfo),
}

/// Errors of the session process.
#[derive(Debug, Error)]
pub enum Error {
    #[error("cannot start {}: {source}", .path.display())]
    Spawn {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("Claude Code {version} cannot run sessions: {message}")]
    Incompatible {
        version: semver::Version,
        message: String,
    },
    #[error("{flag} is not supported by Claude Code {version}")]
    Unsupported {
        flag: &'static str,
        version: semver::Version,
    },
    #[error("invalid spawn options: {0}")]
    InvalidOptions(String),
    #[error("the session process has exited")]
    ProcessGone,
    #[error("writing to the CLI's stdin failed: {0}")]
    Stdin(String),
    #[error("control request {0} is not pending (answered, cancelled, or the process is gone)")]
    NotPending(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Failure of a control request we sent.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum ControlError {
    /// `subtype: error` with `error_code: unsupported_request` (or the equivalent text).
    #[error("unsupported control request: {message}")]
    Unsupported { message: String },
    /// `subtype: error`.
    #[error("control request failed: {message}")]
    Failed {
        message: String,
        code: Option<String>,
    },
    #[error("no control response within {0:?}")]
    Timeout(Duration),
    #[error("the session process is gone")]
    ProcessGone,
}

/// The answer to one control request from the CLI. Consumed by [`Responder::respond`];
/// dropped unanswered, it answers [`NO_DECISION`] (see the module docs).
#[derive(Debug)]
pub struct Responder {
    request_id: String,
    can_use_tool: bool,
    shared: Arc<Shared>,
    done: bool,
}

impl Responder {
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// Write the answer (queued behind anything already sent).
    pub fn respond(mut self, body: ResponseBody) -> Result<()> {
        self.done = true;
        self.shared.answer(&self.request_id, body)
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let body = if self.can_use_tool {
            ResponseBody::Deny {
                message: NO_DECISION.to_string(),
                interrupt: false,
            }
        } else {
            ResponseBody::Error {
                message: NO_DECISION.to_string(),
            }
        };
        if self.shared.answer(&self.request_id, body).is_ok() {
            tracing::warn!(session = %self.shared.log_id, request_id = %self.request_id, "control request dropped unanswered; answered with no decision");
        }
    }
}

/// Resolves once a queued stdin write is done (see [`SessionProcess::queue_user`]).
#[derive(Debug)]
#[must_use = "the write happens anyway; the ack tells whether it succeeded"]
pub struct WriteAck(oneshot::Receiver<std::result::Result<(), String>>);

impl WriteAck {
    /// Waits until the line is written to stdin (or the write failed).
    pub async fn written(self) -> Result<()> {
        match self.0.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Error::Stdin(e)),
            Err(_) => Err(Error::ProcessGone),
        }
    }
}

enum WriteCmd {
    Line(Vec<u8>, Option<oneshot::Sender<Result<(), String>>>),
    Close,
}

#[derive(Debug)]
struct Shared {
    pid: u32,
    log_id: String,
    /// This process's [`crate::proctree::MARK_VAR`] value.
    mark: String,
    writer: mpsc::UnboundedSender<WriteCmd>,
    /// Our control requests awaiting their response.
    pending: Mutex<HashMap<String, oneshot::Sender<ControlOutcome>>>,
    /// The CLI's control requests not yet answered or cancelled.
    open_requests: Mutex<HashSet<String>>,
    next_id: AtomicU64,
    exit_rx: watch::Receiver<Option<ExitInfo>>,
    requested: AtomicBool,
    turn_running: AtomicBool,
    started: Instant,
    /// Milliseconds since `started` of the last stdout output or message sent.
    last_activity_ms: AtomicU64,
    session_id: Mutex<Option<String>>,
    /// `capabilities` of the last `system/init`.
    announced: Mutex<Option<Vec<String>>>,
    opts: SupervisorOptions,
    args: Vec<String>,
    version: semver::Version,
}

impl std::fmt::Debug for WriteCmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteCmd::Line(l, _) => write!(f, "Line({} bytes)", l.len()),
            WriteCmd::Close => f.write_str("Close"),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these short locks cannot leave the data inconsistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn touch(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.last_activity_ms.store(ms, Ordering::Relaxed);
    }

    fn exited(&self) -> bool {
        self.exit_rx.borrow().is_some()
    }

    fn answer(&self, request_id: &str, body: ResponseBody) -> Result<()> {
        if !lock(&self.open_requests).remove(request_id) {
            return Err(Error::NotPending(request_id.to_string()));
        }
        self.touch();
        let line = Outbound::ControlResponse {
            request_id: request_id.to_string(),
            body,
        }
        .to_line();
        self.writer
            .send(WriteCmd::Line(line, None))
            .map_err(|_| Error::ProcessGone)
    }

    async fn write(&self, line: Vec<u8>) -> Result<()> {
        self.queue(line)?.written().await
    }

    /// Queues `line` for stdin (in order with every other write) without waiting for it.
    fn queue(&self, line: Vec<u8>) -> Result<WriteAck> {
        if self.exited() {
            return Err(Error::ProcessGone);
        }
        let (tx, rx) = oneshot::channel();
        self.writer
            .send(WriteCmd::Line(line, Some(tx)))
            .map_err(|_| Error::ProcessGone)?;
        Ok(WriteAck(rx))
    }

    fn kill_group(&self, sig: Signal) {
        signal_group(self.pid, sig);
    }

    /// SIGKILL every process of this session: whatever carries its mark (tools that left
    /// the group too) and their descendants, plus, while the leader is alive (`leader_alive`;
    /// after it was reaped its pid may name another process), its group and descendants.
    /// Scans `/proc`.
    fn kill_tree(&self, leader_alive: bool) -> usize {
        crate::proctree::kill_tree(
            crate::proctree::Mark::Exact(&self.mark),
            leader_alive.then_some(self.pid),
        )
    }
}

/// Spawns of this process so far: makes each session process's mark unique.
static SPAWNS: AtomicU64 = AtomicU64::new(0);

/// Kills the process group when the last [`SessionProcess`] handle goes away.
#[derive(Debug)]
struct DropGuard(Arc<Shared>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        if !self.0.exited() {
            self.0.requested.store(true, Ordering::SeqCst);
            self.0.kill_group(Signal::SIGKILL);
            self.0.kill_tree(true);
        }
    }
}

/// `cmd.spawn()`, retried a few times on `ETXTBSY`: exec fails while any process holds the
/// binary open for writing, which happens transiently when it is being installed or
/// replaced (npm update) or, for a freshly written script, while another thread's fork
/// still holds the writer's descriptor.
pub(crate) async fn spawn_retrying(
    cmd: &mut tokio::process::Command,
) -> std::io::Result<tokio::process::Child> {
    let mut attempt = 0u64;
    loop {
        match crate::proctree::spawn_registered(cmd) {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy && attempt < 5 => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(10 * attempt)).await;
            }
            r => return r,
        }
    }
}

/// Send `sig` to the process group led by `pid`; a group that is already gone is fine.
pub(crate) fn signal_group(pid: u32, sig: Signal) {
    let Ok(raw) = i32::try_from(pid) else { return };
    if raw <= 1 {
        return;
    }
    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(raw), sig);
}

/// A running session process. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SessionProcess {
    shared: Arc<Shared>,
    _guard: Arc<DropGuard>,
}

/// The command line for a session (without the program).
pub fn session_args(inst: &Installation, opts: &SpawnOptions) -> Result<Vec<String>> {
    let caps = &inst.capabilities;
    if !caps.stdio_permission_prompt {
        return Err(Error::Incompatible {
            version: inst.version.clone(),
            message: inst.message.clone(),
        });
    }
    use ostler_protocol::argv::{
        FORK_SESSION, INCLUDE_PARTIAL_MESSAGES, MAX_TURNS, StreamJsonArgs,
    };
    let mut a = StreamJsonArgs::session();
    if opts.include_partial_messages {
        if caps.include_partial_messages {
            a.flag(INCLUDE_PARTIAL_MESSAGES);
        } else {
            tracing::warn!(session = %opts.log_id, version = %inst.version, "--include-partial-messages not supported: running without it (no token streaming)");
        }
    }
    a.option_if("--model", opts.model.as_deref())
        .option_if("--permission-mode", opts.permission_mode.as_deref())
        .option_if(
            "--append-system-prompt",
            opts.append_system_prompt.as_deref(),
        );
    if let Some(n) = opts.max_turns {
        if caps.max_turns {
            a.option(MAX_TURNS, n.to_string());
        } else {
            tracing::warn!(session = %opts.log_id, version = %inst.version, "--max-turns not supported: running without a turn limit");
        }
    }
    if let Some(r) = &opts.resume {
        if r.is_empty() || r.starts_with('-') {
            return Err(Error::InvalidOptions(format!(
                "bad session id to resume: {r:?}"
            )));
        }
        a.option("--resume", r.as_str());
    }
    if opts.fork_session {
        if opts.resume.is_none() {
            return Err(Error::InvalidOptions("fork_session needs resume".into()));
        }
        if !caps.fork_session {
            return Err(Error::Unsupported {
                flag: FORK_SESSION,
                version: inst.version.clone(),
            });
        }
        a.flag(FORK_SESSION);
    }
    // Variadic flags last: each takes exactly the values that follow it up to the next
    // option, so they go after every other option with a value.
    for (flag, tools) in [
        ("--allowedTools", &opts.allowed_tools),
        ("--disallowedTools", &opts.disallowed_tools),
    ] {
        if let Some(bad) = tools.iter().find(|t| t.is_empty() || t.starts_with('-')) {
            return Err(Error::InvalidOptions(format!("bad tool rule {bad:?}")));
        }
        a.values(flag, tools);
    }
    Ok(a.into_args())
}

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
        let mut env = build_env(
            std::env::vars_os(),
            &sup.env_allowlist,
            &sup.scrub,
            &opts.env,
        );
        let mark = format!(
            "{}/{}/{}",
            sup.process_tag,
            opts.log_id,
            SPAWNS.fetch_add(1, Ordering::Relaxed)
        );
        env.push((
            OsString::from(crate::proctree::MARK_VAR),
            OsString::from(&mark),
        ));
        let mut cmd = tokio::process::Command::new(&inst.path);
        cmd.args(&args)
            .current_dir(&opts.cwd)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k as &OsString, v as &OsString)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        let parent = std::process::id();
        #[allow(unsafe_code)]
        // SAFETY: the closure runs in the child between fork and exec, where only
        // async-signal-safe functions may be called. It calls prctl(2) and getppid(2),
        // both plain system calls, touches no locks, does not allocate (the error values
        // are built from raw errno), and captures only a `u32` by copy.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent died before prctl took effect: do not run orphaned.
                if libc::getppid() as u32 != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
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

        tokio::spawn(writer_task(stdin, wrx, opts.log_id.clone()));
        let tail = Arc::new(Mutex::new(Tail::new(sup.stderr_tail_bytes)));
        let stderr_task = tokio::spawn(stderr_task(stderr, tail.clone(), opts.log_id.clone()));
        tokio::spawn(supervise_task(
            child,
            shared.clone(),
            exit_tx,
            stderr_task,
            tail,
        ));
        let watchdog = sup
            .stall_after
            .map(|after| tokio::spawn(watchdog_task(shared.clone(), etx.clone(), after)));
        let decoder = Decoder::for_release(Some(&inst.version));
        tokio::spawn(reader_task(stdout, shared.clone(), etx, decoder, watchdog));

        Ok((
            SessionProcess {
                _guard: Arc::new(DropGuard(shared.clone())),
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

    /// The command-line arguments the process was started with.
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
        let session_id = self.session_id().unwrap_or_default();
        let line = Outbound::User {
            content,
            parent_tool_use_id: None,
            session_id,
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
        if self.shared.exited() {
            return Err(ControlError::ProcessGone);
        }
        let n = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let request_id = format!("ostler-{}-{n}", self.shared.pid);
        let (tx, rx) = oneshot::channel();
        lock(&self.shared.pending).insert(request_id.clone(), tx);
        let line = Outbound::ControlRequest {
            request_id: request_id.clone(),
            request,
        }
        .to_line();
        self.shared.touch();
        if self.shared.write(line).await.is_err() {
            lock(&self.shared.pending).remove(&request_id);
            return Err(ControlError::ProcessGone);
        }
        let timeout = self.shared.opts.control_timeout;
        match ostler_metrics::control_request(tokio::time::timeout(timeout, rx)).await {
            Ok(Ok(ControlOutcome::Success { response })) => Ok(response),
            Ok(Ok(ControlOutcome::Error { error, error_code })) => {
                if error_code.as_deref() == Some("unsupported_request")
                    || error.starts_with("Unsupported control request")
                {
                    Err(ControlError::Unsupported { message: error })
                } else {
                    Err(ControlError::Failed {
                        message: error,
                        code: error_code,
                    })
                }
            }
            Ok(Err(_)) => Err(ControlError::ProcessGone),
            Err(_) => {
                lock(&self.shared.pending).remove(&request_id);
                Err(ControlError::Timeout(timeout))
            }
        }
    }

    /// How the process ended, if it has.
    pub fn exit_info(&self) -> Option<ExitInfo> {
        self.shared.exit_rx.borrow().clone()
    }

    /// Wait for the process to end (on its own or by request).
    pub async fn wait(&self) -> ExitInfo {
        let mut rx = self.shared.exit_rx.clone();
        loop {
            if let Some(e) = rx.borrow_and_update().clone() {
                return e;
            }
            if rx.changed().await.is_err() {
                // The supervisor task is gone without publishing: runtime shutting down.
                return ExitInfo {
                    code: None,
                    signal: None,
                    stderr_tail: String::new(),
                    requested: self.shared.requested.load(Ordering::SeqCst),
                };
            }
        }
    }

    async fn wait_for(&self, d: Duration) -> Option<ExitInfo> {
        tokio::time::timeout(d, self.wait()).await.ok()
    }

    /// Graceful stop: close stdin, wait `stop_grace`, SIGTERM the group, wait `term_grace`,
    /// SIGKILL. Returns once the process is reaped and its group signalled.
    pub async fn stop(&self) -> ExitInfo {
        self.shared.requested.store(true, Ordering::SeqCst);
        if let Some(e) = self.exit_info() {
            return e;
        }
        let _ = self.shared.writer.send(WriteCmd::Close);
        if let Some(e) = self.wait_for(self.shared.opts.stop_grace).await {
            return e;
        }
        tracing::info!(session = %self.shared.log_id, "stdin closed but still running: SIGTERM");
        self.shared.kill_group(Signal::SIGTERM);
        if let Some(e) = self.wait_for(self.shared.opts.term_grace).await {
            return e;
        }
        tracing::warn!(session = %self.shared.log_id, "still running after SIGTERM: SIGKILL");
        self.shared.kill_group(Signal::SIGKILL);
        self.wait().await
    }

    /// SIGKILL the process group now (the exit arrives as [`ProcessEvent::Exited`]).
    pub fn kill(&self) {
        self.shared.requested.store(true, Ordering::SeqCst);
        self.shared.kill_group(Signal::SIGKILL);
    }

    /// The CLI release this process runs.
    pub fn version(&self) -> &semver::Version {
        &self.shared.version
    }
}

async fn writer_task(
    mut stdin: tokio::process::ChildStdin,
    mut rx: mpsc::UnboundedReceiver<WriteCmd>,
    log_id: String,
) {
    let mut broken: Option<String> = None;
    while let Some(cmd) = rx.recv().await {
        match cmd {
            WriteCmd::Line(line, ack) => {
                let r = match &broken {
                    Some(e) => Err(e.clone()),
                    None => {
                        let r = async {
                            stdin.write_all(&line).await?;
                            stdin.flush().await
                        }
                        .await;
                        r.map_err(|e| {
                            tracing::debug!(session = %log_id, error = %e, "stdin write failed");
                            let s = e.to_string();
                            broken = Some(s.clone());
                            s
                        })
                    }
                };
                if let Some(ack) = ack {
                    let _ = ack.send(r);
                }
            }
            WriteCmd::Close => break,
        }
    }
    // Dropping `stdin` closes it. Messages queued after Close are refused (channel closed).
}

/// The end of a byte stream, bounded.
struct Tail {
    buf: std::collections::VecDeque<u8>,
    cap: usize,
}

impl Tail {
    fn new(cap: usize) -> Self {
        Self {
            buf: std::collections::VecDeque::new(),
            cap,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.cap == 0 {
            return;
        }
        let bytes = if bytes.len() > self.cap {
            &bytes[bytes.len() - self.cap..]
        } else {
            bytes
        };
        let over = (self.buf.len() + bytes.len()).saturating_sub(self.cap);
        self.buf.drain(..over);
        self.buf.extend(bytes);
    }

    fn text(&self) -> String {
        let (a, b) = self.buf.as_slices();
        let mut v = Vec::with_capacity(a.len() + b.len());
        v.extend_from_slice(a);
        v.extend_from_slice(b);
        String::from_utf8_lossy(&v).into_owned()
    }
}

async fn stderr_task(
    mut stderr: tokio::process::ChildStderr,
    tail: Arc<Mutex<Tail>>,
    log_id: String,
) {
    const MAX_LOG_LINE: usize = 4096;
    let mut buf = vec![0u8; 8192];
    let mut line: Vec<u8> = Vec::new();
    loop {
        let n = match stderr.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        lock(&tail).push(&buf[..n]);
        for &b in &buf[..n] {
            if b == b'\n' {
                log_stderr(&log_id, &line);
                line.clear();
            } else if line.len() < MAX_LOG_LINE {
                line.push(b);
            }
        }
    }
    if !line.is_empty() {
        log_stderr(&log_id, &line);
    }
}

fn log_stderr(log_id: &str, line: &[u8]) {
    let s = String::from_utf8_lossy(line);
    let s = s.trim_end();
    if !s.is_empty() {
        tracing::info!(session = %log_id, stderr = %s, "claude stderr");
    }
}

async fn supervise_task(
    mut child: tokio::process::Child,
    shared: Arc<Shared>,
    exit_tx: watch::Sender<Option<ExitInfo>>,
    stderr_task: tokio::task::JoinHandle<()>,
    tail: Arc<Mutex<Tail>>,
) {
    use std::os::unix::process::ExitStatusExt;
    let status = child.wait().await;
    crate::proctree::unregister(shared.pid);
    // Whatever the CLI left behind (tool processes, in its group or not) goes with it.
    shared.kill_group(Signal::SIGKILL);
    let tree = shared.clone();
    match tokio::task::spawn_blocking(move || tree.kill_tree(false)).await {
        Ok(0) | Err(_) => {}
        Ok(n) => {
            tracing::info!(session = %shared.log_id, killed = n, "ended processes the session left behind")
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), stderr_task).await;
    let (code, signal) = match &status {
        Ok(s) => (s.code(), s.signal()),
        Err(_) => (None, None),
    };
    let info = ExitInfo {
        code,
        signal,
        stderr_tail: lock(&tail).text(),
        requested: shared.requested.load(Ordering::SeqCst),
    };
    ostler_metrics::cli_exited(info.requested, info.code, info.signal);
    if info.requested || info.success() {
        tracing::info!(session = %shared.log_id, pid = shared.pid, ?code, ?signal, "session process exited");
    } else {
        tracing::warn!(session = %shared.log_id, pid = shared.pid, ?code, ?signal, stderr = %info.stderr_tail, "session process died");
    }
    let _ = exit_tx.send(Some(info));
}

async fn reader_task(
    mut stdout: tokio::process::ChildStdout,
    shared: Arc<Shared>,
    events: mpsc::Sender<ProcessEvent>,
    mut decoder: Decoder,
    watchdog: Option<tokio::task::JoinHandle<()>>,
) {
    let mut framer = LineFramer::new(FramerOptions {
        max_payload_bytes: shared.opts.max_payload_bytes,
    });
    let mut buf = vec![0u8; 64 * 1024];
    let mut frames: Vec<Frame> = Vec::new();
    let mut junk = JunkCoalescer::new(JunkOptions::default());
    let mut exit_rx = shared.exit_rx.clone();
    let mut owner_gone = false;
    // After the process exits, keep reading what is buffered for at most this long (an
    // escaped grandchild could hold the pipe open forever).
    let drain_deadline = async {
        let _ = exit_rx.wait_for(|e| e.is_some()).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    tokio::pin!(drain_deadline);
    loop {
        let n = tokio::select! {
            r = stdout.read(&mut buf) => match r {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            },
            () = &mut drain_deadline => break,
        };
        shared.touch();
        framer.push(&buf[..n], &mut frames);
        if !owner_gone && !deliver(&shared, &events, &mut decoder, &mut junk, &mut frames).await {
            owner_gone = true;
            tracing::warn!(session = %shared.log_id, "event receiver dropped: killing the session process");
            shared.requested.store(true, Ordering::SeqCst);
            shared.kill_group(Signal::SIGKILL);
        }
        frames.clear();
    }
    framer.finish(&mut frames);
    if !owner_gone {
        deliver(&shared, &events, &mut decoder, &mut junk, &mut frames).await;
        if let Some(summary) = junk.finish() {
            send_junk_summary(&events, summary).await;
        }
    }
    let mut exit_rx = shared.exit_rx.clone();
    let info = match exit_rx.wait_for(|e| e.is_some()).await {
        Ok(e) => e.clone(),
        Err(_) => None,
    };
    if let Some(w) = watchdog {
        w.abort();
        let _ = w.await;
    }
    // Our requests can no longer be answered: their futures resolve to ProcessGone.
    lock(&shared.pending).clear();
    lock(&shared.open_requests).clear();
    shared.turn_running.store(false, Ordering::SeqCst);
    if let Some(info) = info {
        let _ = events.send(ProcessEvent::Exited(info)).await;
    }
}

/// Decode and send the frames; `false` when the receiver is gone.
async fn deliver(
    shared: &Arc<Shared>,
    events: &mpsc::Sender<ProcessEvent>,
    decoder: &mut Decoder,
    junk: &mut JunkCoalescer,
    frames: &mut Vec<Frame>,
) -> bool {
    for frame in frames.drain(..) {
        let mut line = decoder.decode(frame);
        // Non-JSON output is coalesced: a few lines per window pass, the rest become one
        // summary diagnostic (a CLI must not fill the store with junk).
        let now = Instant::now();
        let is_junk = matches!(
            line.events.as_slice(),
            [Event::Diagnostic(d)] if d.code == DiagnosticCode::NotJson
        );
        let (summary, pass) = if is_junk {
            let Some(Event::Diagnostic(d)) = line.events.pop() else {
                unreachable!("matched above")
            };
            let v = junk.junk(d, now);
            (v.summary, v.line)
        } else {
            (junk.poll(now), None)
        };
        if let Some(summary) = summary
            && !send_junk_summary(events, summary).await
        {
            return false;
        }
        if is_junk {
            match pass {
                Some(d) => line.events.push(Event::Diagnostic(d)),
                None => continue,
            }
        }
        let line = Arc::new(line);
        let mut extra = Vec::new();
        for ev in &line.events {
            match ev {
                Event::SessionStarted(s) => {
                    *lock(&shared.session_id) = Some(s.session_id.clone());
                    *lock(&shared.announced) = Some(s.capabilities.clone());
                }
                Event::ControlResponse(r) => {
                    if let Some(tx) = lock(&shared.pending).remove(&r.request_id) {
                        let _ = tx.send(r.outcome.clone());
                    }
                }
                Event::TurnResult(_) => {
                    shared.turn_running.store(false, Ordering::SeqCst);
                }
                Event::ControlRequest(req) => {
                    lock(&shared.open_requests).insert(req.request_id.clone());
                    extra.push(ProcessEvent::ControlRequest {
                        responder: Responder {
                            request_id: req.request_id.clone(),
                            can_use_tool: matches!(req.request, CliRequest::CanUseTool(_)),
                            shared: shared.clone(),
                            done: false,
                        },
                        request: req.clone(),
                    });
                }
                Event::ControlCancel(c) => {
                    let was_open = lock(&shared.open_requests).remove(&c.request_id);
                    if was_open {
                        extra.push(ProcessEvent::ControlCancelled {
                            request_id: c.request_id.clone(),
                        });
                    }
                }
                _ => {}
            }
        }
        if events.send(ProcessEvent::Line(line)).await.is_err() {
            return false;
        }
        for e in extra {
            if events.send(e).await.is_err() {
                return false;
            }
        }
    }
    true
}

/// A coalesced-junk summary as a line of its own (no raw bytes: it stands for many lines).
async fn send_junk_summary(events: &mpsc::Sender<ProcessEvent>, d: Diagnostic) -> bool {
    let line = DecodedLine {
        raw: bytes::Bytes::new(),
        events: vec![Event::Diagnostic(d)],
    };
    events
        .send(ProcessEvent::Line(Arc::new(line)))
        .await
        .is_ok()
}

async fn watchdog_task(shared: Arc<Shared>, events: mpsc::Sender<ProcessEvent>, after: Duration) {
    let after_ms = after.as_millis() as u64;
    let mut reported_at: Option<u64> = None;
    loop {
        let last = shared.last_activity_ms.load(Ordering::Relaxed);
        let now = shared.started.elapsed().as_millis() as u64;
        let idle = now.saturating_sub(last);
        if idle < after_ms {
            tokio::time::sleep(Duration::from_millis(after_ms - idle)).await;
            continue;
        }
        if shared.exited() {
            return;
        }
        let busy =
            shared.turn_running.load(Ordering::SeqCst) && lock(&shared.open_requests).is_empty();
        if busy && reported_at != Some(last) {
            reported_at = Some(last);
            let idle_for = Duration::from_millis(idle);
            tracing::warn!(session = %shared.log_id, ?idle_for, "session stalled: no output while a turn runs");
            if events.send(ProcessEvent::Stall { idle_for }).await.is_err() {
                return;
            }
            if shared.opts.kill_on_stall {
                shared.requested.store(true, Ordering::SeqCst);
                shared.kill_group(Signal::SIGKILL);
                return;
            }
        }
        // Idle but nothing to report (no turn, a prompt open, or already reported): look
        // again after another period.
        tokio::time::sleep(after).await;
    }
}
