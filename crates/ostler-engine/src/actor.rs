//! One actor task per live session. It owns the session's [`SessionProcess`], consumes its
//! events (decoded lines with their control requests and cancels, stalls, the exit), keeps
//! the session's permission state, serves the engine's commands and is the only writer of
//! the session's live state, which it shows on its [`SessionView`]. Everything it writes
//! goes through the session's [`crate::hub::Hub`] (persist, then publish).
//!
//! Here: spawn, the event loop, commands, state and exit; `output.rs`: CLI lines -> events;
//! `interactions.rs`: permission requests and questions.
//!
//! The actor never awaits the CLI while the CLI may be waiting for it: control requests we
//! send (`interrupt`, `set_model`, ...) and the graceful stop run in their own tasks, so the
//! actor keeps draining stdout (the supervisor's reader resolves our requests only while its
//! channel has room).
//!
//! CLI output is pipelined: the actor reads and converts the next lines while the commits
//! of earlier batches are in flight (at most `output::MAX_IN_FLIGHT`), and finishes each
//! batch (records, publishes) when its commit resolves, in order. It waits for them all
//! (`flush`) before it handles a control request from the CLI and before the exit.

use ostler_protocol::CanUseTool;
use ostler_protocol::model::{NoticeDetail, RawJson};
use ostler_protocol::outbound::{OutRequest, UserContent};
use ostler_store::{InteractionState, SessionPatch, WithEvents};
use ostler_supervisor::{
    ControlError, ExitInfo, InitializeAnswer, Line, ProcessEvent, Responder, SessionProcess,
};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::handle::{Command, Meta, SessionEntry, SessionHandle, SessionView};
use crate::hub::{Item, now_ms};
use crate::shared::{Shared, SlotGuard};
use crate::types::*;

/// Code of the notice recorded when the CLI did not take a user message (its write failed,
/// or its process ended before the message reached its transcript); its data names the
/// message's `seq` and `client_message_id`.
pub(crate) const DELIVERY_FAILED: &str = "delivery_failed";

/// Code of the notice recorded when the CLI refused a guarded cut (`--resume-drops-turn`):
/// the session's next resume no longer repeats the refused cut.
pub(crate) const RESUME_REFUSED: &str = "resume_refused";

/// The text that starts the CLI's refusal of a guarded cut (2.1.330+).
const DROPS_TURN_REFUSAL: &str = "Resume rejected by --resume-drops-turn:";

/// A guarded cut (`--resume-drops-turn`) a process starts with, as the client named it.
/// The CLI judges it at boot: until it answers `initialize`, a refusal (an
/// `error_during_execution` result naming it, then exit 1) is the process's end, recorded
/// as [`RESUME_REFUSED`] (not as a turn: no turn ran) and as the exit's reason.
#[derive(Debug, Clone, Default)]
pub(crate) struct GuardedCut {
    pub at_message_id: Option<String>,
    pub drops_turn_message_id: Option<String>,
}

/// The answer to a send whose message the CLI never took. At shutdown the session comes
/// back (resumable) with the daemon: retry later. Otherwise the CLI is ending by itself,
/// and a plain retry would fail the same way until the session is resumed.
fn not_taken(sid: &str, why: &str, shutting_down: bool) -> Error {
    if shutting_down {
        Error::Unavailable(format!(
            "the daemon is shutting down and the CLI of session {sid:?} did not take the \
             message ({why}); send it again (same client_message_id) once the daemon is back"
        ))
    } else {
        Error::precondition(format!(
            "the CLI of session {sid:?} did not take the message ({why}): its process is \
             ending; resume the session and send again (the client_message_id is free again)"
        ))
    }
}

/// The notice of a user message the CLI never took.
pub(crate) fn delivery_failed(
    seq: u64,
    client_message_id: Option<String>,
    why: &str,
) -> EventPayload {
    EventPayload::EngineNotice(EngineNotice {
        code: DELIVERY_FAILED.into(),
        message: format!("the CLI did not take the user message (seq {seq}): {why}"),
        data: Some(serde_json::json!({
            "seq": seq,
            "client_message_id": client_message_id,
        })),
    })
}

/// The user message recorded at `seq` of session `sid` (`None`: no such event, or another
/// kind). Blocking: call through `blocking`.
pub(crate) fn stored_user_message(
    store: &ostler_store::Store,
    sid: &str,
    seq: u64,
) -> Result<Option<UserMessageSent>> {
    let ev = store.events_after(sid, seq.saturating_sub(1), 1)?;
    Ok(
        match ev
            .first()
            .filter(|e| e.seq == seq)
            .map(|e| EventPayload::decode_stored(&e.kind, &e.payload))
        {
            Some(Ok(EventPayload::UserMessageSent(u))) => Some(u),
            _ => None,
        },
    )
}

/// The message a client sent with `client_message_id` that still holds the id: the
/// newest one that no `delivery_failed` freed (as the actor's record of ids, rebuilt at a
/// resume, keeps it). `None`: the id is free. Reads the log's messages and notices from
/// the end. Blocking: call through `blocking`.
pub(crate) fn stored_send(
    store: &ostler_store::Store,
    sid: &str,
    client_message_id: &str,
) -> Result<Option<(u64, UserMessageSent)>> {
    let mut freed = std::collections::HashSet::new();
    let mut before = u64::MAX;
    loop {
        let page = store.events_of_kinds_before(
            sid,
            &["user_message_sent", "engine_notice"],
            before,
            64,
        )?;
        let Some(last) = page.last() else {
            return Ok(None);
        };
        before = last.seq;
        for ev in page {
            match EventPayload::decode_stored(&ev.kind, &ev.payload) {
                Ok(EventPayload::EngineNotice(n)) if n.code == DELIVERY_FAILED => {
                    let d = n.data.unwrap_or_default();
                    if d["client_message_id"] == client_message_id {
                        freed.extend(d["seq"].as_u64());
                    }
                }
                Ok(EventPayload::UserMessageSent(u))
                    if u.client_message_id.as_deref() == Some(client_message_id)
                        && !freed.contains(&ev.seq) =>
                {
                    return Ok(Some((ev.seq, u)));
                }
                _ => {}
            }
        }
    }
}

mod dialogs;
mod elicitations;
mod hooks;
mod interactions;
mod output;
mod owed;
mod tools;

pub(crate) use hooks::restart_resolution as hook_restart_resolution;

/// Lines batched into one store append at most.
const MAX_BATCH_LINES: usize = 64;

/// How long a client's stop waits for the CLI to answer its interrupt before it closes
/// stdin all the same.
const STOP_INTERRUPT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

struct Pending {
    kind: InteractionKind,
    request: CanUseTool,
    responder: Responder,
    deadline: Option<Instant>,
}

pub(crate) struct Actor {
    shared: Arc<Shared>,
    entry: Arc<SessionEntry>,
    /// What readers see of this session (the actor is its only writer).
    view: ViewPublisher,
    /// Session rules and client message ids (rebuilt from the log before a spawn).
    meta: Meta,
    process: SessionProcess,
    events: mpsc::Receiver<ProcessEvent>,
    cmds: mpsc::Receiver<Command>,
    /// For tasks that report back (control requests).
    self_tx: mpsc::WeakSender<Command>,
    cwd: PathBuf,
    state: SessionState,
    pending: HashMap<String, Pending>,
    /// Hook calls waiting for a client (issue 11), by request id.
    hooks: HashMap<String, hooks::PendingHook>,
    /// Tool uses whose permission prompt was answered in this turn: a PermissionRequest
    /// hook call for one of them comes too late to count (see `prompt_answered_first`).
    prompts_answered: std::collections::HashSet<String>,
    /// Client-hosted tool servers and the calls of their tools waiting for a client.
    tool_servers: Vec<ostler_supervisor::ToolServerDecl>,
    tool_calls: HashMap<String, tools::PendingToolCall>,
    /// MCP servers' requests for the user's input waiting for a client.
    elicitations: HashMap<String, elicitations::PendingElicitation>,
    /// The CLI's dialogs (`request_user_dialog`) waiting for a client.
    dialogs: HashMap<String, dialogs::PendingDialog>,
    /// Whether those are answered `decline` at once instead.
    decline_elicitations: bool,
    /// Every user message goes as written (`CliOptions::verbatim_prompts`).
    verbatim_prompts: bool,
    /// The session's debug log, when it has one ([`ActorOptions::debug_log`]): checked
    /// against its cap during a turn as output is stored, and at the turn's end.
    debug_log: Option<crate::engine::debug_log::DebugLog>,
    /// The messages written to the CLI still owed an answer, and so the turns still to
    /// come (what keeps the session RUNNING).
    owed: owed::Owed,
    /// A result left messages owed: by then the CLI shows it took the next one, or they
    /// are forgotten (`queue_grace`).
    next_turn_due: Option<Instant>,
    /// Whether a turn began (a message was sent, or the CLI's output came) since the last
    /// result: when not, what is still pending at a result is stale.
    turn_since_result: bool,
    claude_session_id: Option<String>,
    stop_waiters: Vec<oneshot::Sender<Result<()>>>,
    stop_requested: bool,
    shutdown: bool,
    last_model: Option<String>,
    /// The CLI's cumulative cost so far for this process.
    process_cost_usd: f64,
    /// Set when CLI output could not be stored (the store stayed unwritable past its retry
    /// limit): the session is being stopped, and says why once the store writes again.
    store_fault: Option<String>,
    /// Background tasks the CLI reported running (`task_started` / `task_notification`,
    /// `background_tasks_changed`): while any runs, the session is not suspended.
    bg_tasks: HashSet<String>,
    /// Last thing the actor handled (a CLI line or a command): the idle timer runs from it.
    last_active: Instant,
    /// Why the session is being suspended (its process is stopping for that).
    suspend_reason: Option<String>,
    /// Batches of CLI output whose commit is in flight, oldest first.
    in_flight: VecDeque<output::Batch>,
    /// Until the CLI answers `initialize`: the title it announces then is the one it held
    /// from before (a respawn of a session ostler already has; 2.1.120 and later announce
    /// their transcript's title at every resume), which is not a rename: ostler's title,
    /// perhaps changed since with UpdateSession, stays ([`ActorOptions::keeps_title`]).
    title_announced_from_before: bool,
    /// This process respawns a session ostler already titled ([`ActorOptions::keeps_title`]).
    respawned: bool,
    /// The title the respawned CLI announced before answering `initialize` (the one its
    /// transcript held).
    announced_title: Option<String>,
    /// Titles sent with `rename_session` whose `session_title_changed` echo has not come
    /// back yet (at most [`TITLES_SENT_MAX`], oldest dropped first): the echo of one is not
    /// a rename by the CLI (ostler's record, perhaps renamed again since, stays). The echo
    /// carries the title in the CLI's form ([`cli_title_form`]); an entry whose answer has
    /// come back is dropped at the next echo that is not its own (the CLI echoes a title
    /// before it answers, so an answered title's echo that did not match never will).
    titles_sent: VecDeque<SentTitle>,
    /// A `rename_session` ostler sent is not answered yet: the next title waits for the
    /// answer. Sent together, two renames race inside the CLI (2.1.332 awaits transcript
    /// and registry writes for each before it takes the name, so the older can land last:
    /// seen once in 27 runs of a back-to-back pair, the echoes B then A and the CLI left
    /// with A).
    rename_in_flight: bool,
    /// The newest title given while a rename was in flight: sent once it is answered (the
    /// titles given in between are skipped, only the newest matters).
    rename_held: Option<String>,
    /// The guarded cut this process started with, until the CLI answers `initialize`.
    guard: Option<GuardedCut>,
    /// The CLI refused the guarded cut (its reason): the process ends for that.
    refused: Option<String>,
    /// The session's state before this process (what a refused cut leaves it in when
    /// that resumes on demand).
    before: SessionState,
}

/// What an actor starts with.
pub(crate) struct ActorOptions {
    pub shared: Arc<Shared>,
    pub entry: Arc<SessionEntry>,
    pub process: SessionProcess,
    pub events: mpsc::Receiver<ProcessEvent>,
    pub cwd: PathBuf,
    /// The session's state before this process (its stored state).
    pub state: SessionState,
    pub claude_session_id: Option<String>,
    pub model: Option<String>,
    pub meta: Meta,
    /// The live-session slot, held until the actor ends.
    pub slot: SlotGuard,
    /// The stderr tail of the session's previous exit, shown until this process exits.
    pub stderr_tail: Option<String>,
    /// The session's client-hosted tool servers (served in `mcp_message`).
    pub tool_servers: Vec<ostler_supervisor::ToolServerDecl>,
    /// Answer elicitations `decline` at once (`CliOptions::decline_elicitations`).
    pub decline_elicitations: bool,
    /// Send every user message with `verbatim` (`CliOptions::verbatim_prompts`).
    pub verbatim_prompts: bool,
    /// The session's debug log (`debug`): trimmed to its cap at every turn's end, and
    /// checked during a turn (at most once a second, as output is stored).
    pub debug_log: Option<PathBuf>,
    /// The running cost the CLI starts from (what it restored at a resume).
    pub restored_cost_usd: f64,
    /// This process respawns a session ostler already titled (a resume, not a create, a
    /// fork into a new session or an adoption): see `Actor::title_announced_from_before`.
    pub keeps_title: bool,
    /// The guarded cut (`--resume-drops-turn`) the process starts with.
    pub guard: Option<GuardedCut>,
}

/// The sending side of the view. Dropped with the actor (also when it panics): releases
/// the live-session slot first, then shows the session as no longer live, so whoever
/// waited for the end can take the slot again at once.
struct ViewPublisher {
    tx: watch::Sender<SessionView>,
    slot: Option<SlotGuard>,
}

impl Drop for ViewPublisher {
    fn drop(&mut self) {
        drop(self.slot.take());
        self.tx.send_modify(|v| v.live = false);
    }
}

impl Actor {
    /// Starts the actor of a freshly spawned process: creates its command channel and
    /// view, records the session `idle` (before this returns, so CreateSession /
    /// ResumeSession report a live state), then runs it in its own task. Returns the
    /// engine's handle.
    pub(crate) async fn spawn(o: ActorOptions) -> SessionHandle {
        let (tx, cmds) = mpsc::channel(64);
        let (view_tx, view) = watch::channel(SessionView {
            live: true,
            state: o.state,
            pending: BTreeMap::new(),
            stderr_tail: o.stderr_tail,
            idle_since: None,
        });
        o.entry.suspending.store(false, Ordering::SeqCst);
        let pid = o.process.pid();
        let debug_log = o.debug_log.map(|p| {
            crate::engine::debug_log::DebugLog::new(&o.entry.id, p, o.shared.opts.debug_max_bytes)
        });
        let mut actor = Self {
            shared: o.shared,
            entry: o.entry,
            view: ViewPublisher {
                tx: view_tx,
                slot: Some(o.slot),
            },
            meta: o.meta,
            process: o.process,
            events: o.events,
            cmds,
            self_tx: tx.downgrade(),
            cwd: o.cwd,
            state: o.state,
            pending: HashMap::new(),
            hooks: HashMap::new(),
            prompts_answered: Default::default(),
            tool_servers: o.tool_servers,
            tool_calls: HashMap::new(),
            elicitations: HashMap::new(),
            dialogs: HashMap::new(),
            decline_elicitations: o.decline_elicitations,
            verbatim_prompts: o.verbatim_prompts,
            debug_log,
            owed: owed::Owed::default(),
            next_turn_due: None,
            turn_since_result: false,
            claude_session_id: o.claude_session_id,
            stop_waiters: Vec::new(),
            stop_requested: false,
            shutdown: false,
            last_model: o.model,
            process_cost_usd: o.restored_cost_usd,
            title_announced_from_before: o.keeps_title,
            respawned: o.keeps_title,
            announced_title: None,
            titles_sent: VecDeque::new(),
            rename_in_flight: false,
            rename_held: None,
            store_fault: None,
            bg_tasks: HashSet::new(),
            last_active: Instant::now(),
            suspend_reason: None,
            in_flight: VecDeque::new(),
            guard: o.guard,
            refused: None,
            before: o.state,
        };
        actor.start(pid).await;
        tokio::spawn(actor.run());
        SessionHandle::new(tx, view)
    }

    /// Changes what readers see.
    fn show(&self, f: impl FnOnce(&mut SessionView)) {
        self.view.tx.send_modify(f);
    }

    /// Shows the state implied by the pending interactions and turns.
    fn show_live_state(&self) {
        let to = self.live_state();
        self.show(|v| v.state = to);
    }

    fn sid(&self) -> &str {
        &self.entry.id
    }

    /// The process is up: the session is idle (waiting for its first message).
    async fn start(&mut self, pid: u32) {
        self.set_state(
            SessionState::Idle,
            Some(format!(
                "CLI {} started (pid {pid})",
                self.shared.installation_version()
            )),
        )
        .await;
        self.await_initialize();
        self.restore_runtime_controls().await;
    }

    /// Sends again what was set at runtime through `SendControlRequest` and accepted by an
    /// earlier process of the session (flag settings, MCP permission mode overrides, added
    /// plugins, peer message delivery; see
    /// [`crate::runtime::RuntimeSettings`]): queued for stdin now, right behind
    /// `initialize` and before any user message (the actor takes no command before this
    /// returns), so the first turn already runs with them. Each answer is recorded as
    /// `control_restored`, or `control_restore_failed` when the CLI refuses it, does not
    /// answer, or the release cannot take it (refused at once, nothing sent).
    async fn restore_runtime_controls(&mut self) {
        for mut request in self.meta.runtime.requests() {
            let subtype = crate::capability::subtype(&request).to_owned();
            if let OutRequest::Other { subtype, fields } = &mut request
                && subtype == "reload_plugins"
            {
                let gone = self.drop_unconfined_plugins(fields).await;
                for (plugin, error) in gone {
                    let mut only = serde_json::Map::new();
                    only.insert("add_plugins".into(), serde_json::Value::Array(vec![plugin]));
                    let one = OutRequest::Other {
                        subtype: subtype.clone(),
                        fields: only,
                    };
                    self.restored(one, Err(error)).await;
                }
                if fields
                    .get("add_plugins")
                    .and_then(serde_json::Value::as_array)
                    .is_none_or(Vec::is_empty)
                {
                    continue;
                }
            }
            if let Err(e) =
                crate::capability::check_passthrough(&self.shared.installation, &subtype)
            {
                self.restored(request, Err(e.to_string())).await;
                continue;
            }
            let answer = self.process.queue_request(request.clone());
            self.report_back(request, answer, |request, result| Command::Restored {
                request,
                result,
            });
        }
    }

    /// Takes out of a `reload_plugins` sent again the plugins whose path is no longer a
    /// directory inside `sessions.allowed_roots` (checked when they were added; the roots
    /// or the directory may have changed since), each with why.
    async fn drop_unconfined_plugins(
        &self,
        fields: &mut serde_json::Map<String, serde_json::Value>,
    ) -> Vec<(serde_json::Value, String)> {
        let Some(serde_json::Value::Array(plugins)) = fields.get_mut("add_plugins") else {
            return Vec::new();
        };
        let roots = self.shared.roots.clone();
        let paths: Vec<String> = plugins
            .iter()
            .map(|p| p["path"].as_str().unwrap_or_default().to_owned())
            .collect();
        let verdicts = crate::blocking::blocking(move || {
            Ok::<_, Error>(
                paths
                    .iter()
                    .map(|p| {
                        crate::shared::dir_astray("the plugin", std::path::Path::new(p), &roots)
                    })
                    .collect::<Vec<_>>(),
            )
        })
        .await
        .unwrap_or_else(|e| vec![Some(e.to_string()); plugins.len()]);
        let mut gone = Vec::new();
        let mut kept = Vec::new();
        for (plugin, verdict) in std::mem::take(plugins).into_iter().zip(verdicts) {
            match verdict {
                Some(why) => gone.push((plugin, why)),
                None => kept.push(plugin),
            }
        }
        *plugins = kept;
        gone
    }

    /// Awaits `answer` (the CLI's answer to `request`) in a task of its own, so the actor
    /// never waits on the CLI, and hands the outcome back as the command `done` makes. A
    /// process gone before answering is `ProcessGone`; an actor gone meanwhile gets
    /// nothing.
    fn report_back(
        &self,
        request: OutRequest,
        answer: InitializeAnswer,
        done: impl FnOnce(OutRequest, std::result::Result<Option<RawJson>, ControlError>) -> Command
        + Send
        + 'static,
    ) {
        let tx = self.self_tx.clone();
        tokio::spawn(async move {
            let result = answer.await.unwrap_or(Err(ControlError::ProcessGone));
            if let Some(tx) = tx.upgrade() {
                let _ = tx.send(done(request, result)).await;
            }
        });
    }

    /// Records the outcome of a runtime control sent again after `initialize`.
    async fn restored(
        &mut self,
        request: OutRequest,
        result: std::result::Result<Option<RawJson>, String>,
    ) {
        let subtype = crate::capability::subtype(&request).to_owned();
        let fields = match &request {
            OutRequest::Other { fields, .. } => serde_json::Value::Object(fields.clone()),
            _ => serde_json::Value::Null,
        };
        let notice = match result {
            Ok(answer) => EngineNotice {
                code: crate::runtime::CONTROL_RESTORED.into(),
                message: match crate::runtime::restore_shortfall(&request, answer.as_ref()) {
                    Some(shortfall) => {
                        tracing::warn!(session = %self.sid(), %subtype, %shortfall, "a runtime control was restored in part");
                        format!("{subtype} sent again after the respawn, in part: {shortfall}")
                    }
                    None => format!("{subtype} sent again after the respawn"),
                },
                data: Some(serde_json::json!({
                    "subtype": subtype,
                    "request": fields,
                    "answer": answer.and_then(|a| a.to_value().ok()),
                })),
            },
            Err(error) => {
                tracing::warn!(session = %self.sid(), %subtype, %error, "a runtime control could not be restored");
                EngineNotice {
                    code: crate::runtime::CONTROL_RESTORE_FAILED.into(),
                    message: format!(
                        "{subtype} set before the respawn could not be sent again; the \
                         session runs without it: {error}"
                    ),
                    data: Some(serde_json::json!({
                        "subtype": subtype,
                        "request": fields,
                        "error": error,
                    })),
                }
            }
        };
        self.emit_logged(EventPayload::EngineNotice(notice)).await;
    }

    /// Sends a control request in a task of its own (the CLI's answer may take until its
    /// control timeout, plus `extra`); its outcome comes back as a `ControlDone`, which
    /// records it and replies on `reply`.
    fn request_in_task(
        &self,
        request: OutRequest,
        extra: std::time::Duration,
        reply: oneshot::Sender<Result<Option<RawJson>>>,
    ) {
        let process = self.process.clone();
        let tx = self.self_tx.clone();
        tokio::spawn(async move {
            let result = process.request_within(request.clone(), extra).await;
            if let Some(tx) = tx.upgrade() {
                let _ = tx
                    .send(Command::ControlDone {
                        request,
                        result,
                        reply,
                    })
                    .await;
            }
        });
    }

    /// The answer to the `initialize` the process sent at spawn comes back as a
    /// `ControlDone` (recorded as `session_initialized`), never blocking the actor.
    fn await_initialize(&self) {
        let Some(answer) = self.process.take_initialize() else {
            return;
        };
        let request = OutRequest::Initialize(Default::default());
        self.report_back(request, answer, |request, result| Command::ControlDone {
            request,
            result,
            reply: oneshot::channel().0,
        });
    }

    async fn run(mut self) {
        let mut held: Option<ProcessEvent> = None;
        let mut cmds_open = true;
        let mut alive = self.shared.alive();
        loop {
            let deadline = self
                .pending
                .values()
                .filter_map(|p| p.deadline)
                .chain(self.hook_deadline())
                .chain(self.tool_deadline())
                .chain(self.elicitation_deadline())
                .chain(self.dialog_deadline())
                .min();
            let idle_at = self.idle_deadline();
            let next_turn_due = self.next_turn_due;
            let ev = if let Some(ev) = held.take() {
                Some(ev)
            } else {
                tokio::select! {
                    committed = oldest(&mut self.in_flight), if !self.in_flight.is_empty() => {
                        if let Some(batch) = self.in_flight.pop_front() {
                            self.finish_batch(batch, committed).await;
                        }
                        None
                    }
                    ev = self.events.recv(), if self.in_flight.len() < output::MAX_IN_FLIGHT => ev.or_else(|| Some(ProcessEvent::Exited(ExitInfo {
                        facts: ExitFacts::default(),
                        stderr_tail: String::new(),
                        requested: self.stop_requested,
                    }))),
                    cmd = self.cmds.recv(), if cmds_open => {
                        match cmd {
                            Some(cmd) => {
                                let used = !matches!(cmd, Command::Suspend { .. });
                                self.command(cmd).await;
                                if used {
                                    self.used();
                                }
                            }
                            None => {
                                cmds_open = false;
                            }
                        }
                        None
                    }
                    () = engine_gone(&mut alive) => {
                        // Every engine handle is gone without a shutdown: behave like a
                        // crashed daemon (kill the process, record nothing), so the next
                        // start finds the session live and makes it resumable.
                        self.process.kill();
                        return;
                    }
                    () = sleep_until(deadline), if deadline.is_some() => {
                        self.expire_due().await;
                        self.expire_hooks_due().await;
                        self.expire_tool_calls().await;
                        self.expire_elicitations().await;
                        self.expire_dialogs().await;
                        None
                    }
                    () = sleep_until(next_turn_due), if next_turn_due.is_some() => {
                        self.next_turn_due = None;
                        self.no_next_turn().await;
                        None
                    }
                    () = sleep_until(idle_at), if idle_at.is_some() => {
                        let idle = self.shared.opts.idle_suspend.unwrap_or_default();
                        if !self.begin_suspend(format!("idle for {}s", idle.as_secs())) {
                            self.last_active = Instant::now();
                        }
                        None
                    }
                }
            };
            let Some(ev) = ev else { continue };
            self.last_active = Instant::now();
            match ev {
                ProcessEvent::Line(line) => {
                    // A batch ends with a line that opens or withdraws a control request:
                    // its request is handled once the lines before it are recorded.
                    let mut lines = vec![line];
                    while lines.len() < MAX_BATCH_LINES
                        && !lines.last().is_some_and(Line::has_control)
                    {
                        match self.events.try_recv() {
                            Ok(ProcessEvent::Line(l)) => lines.push(l),
                            Ok(other) => {
                                held = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    for l in &lines {
                        self.track_notices(&l.decoded.events);
                    }
                    self.lines(lines).await;
                }
                ProcessEvent::Stall { idle_for } => {
                    self.emit_logged(EventPayload::EngineNotice(EngineNotice {
                        code: "stall".into(),
                        message: format!(
                            "no output from the CLI for {idle_for:?} while a turn runs"
                        ),
                        data: None,
                    }))
                    .await;
                }
                ProcessEvent::Exited(info) => {
                    self.flush().await;
                    self.exited(info).await;
                    // Writes that failed while the process was ending are still recorded
                    // and answered (their ids freed); other queued calls are dropped and
                    // their callers told the session ended.
                    self.cmds.close();
                    while let Ok(cmd) = self.cmds.try_recv() {
                        if let Command::SendWritten {
                            seq, result, reply, ..
                        } = cmd
                        {
                            let _ = reply.send(self.send_written(seq, result, false).await);
                        }
                    }
                    return;
                }
            }
        }
    }

    // ------------------------------------------------------------------ writing

    async fn emit(&self, payload: EventPayload) -> Result<Arc<EngineEvent>> {
        self.entry.hub.emit_one(payload).await
    }

    async fn emit_logged(&self, payload: EventPayload) -> Option<Arc<EngineEvent>> {
        let kind = payload.kind();
        match self.emit(payload).await {
            Ok(e) => Some(e),
            Err(e) => {
                tracing::error!(session = %self.sid(), kind, error = %e, "cannot record event");
                None
            }
        }
    }

    async fn set_state(&mut self, to: SessionState, reason: Option<String>) {
        if self.state == to {
            return;
        }
        let from = self.state;
        self.state = to;
        let idle_since = (to == SessionState::Idle).then(Instant::now);
        self.show(|v| {
            v.state = to;
            v.idle_since = idle_since;
        });
        // The event and the session's state column commit together.
        let patch = SessionPatch {
            state: Some(to),
            updated_ms: now_ms(),
            ..Default::default()
        };
        let item = Item::new(EventPayload::StateChanged(StateChanged {
            from,
            to,
            reason,
        }));
        let with = WithEvents {
            patch: Some(patch),
            ..Default::default()
        };
        // The counts (health, metrics) move between the commit and the publication: whoever
        // has seen the state event finds it counted.
        let guard = self.entry.hub.lock().await;
        match guard.persist_with(vec![item], Some(with)).await {
            Ok((events, _)) => {
                self.shared.counts.moved(Some(from), Some(to));
                guard.publish(&events);
            }
            Err(e) => tracing::error!(session = %self.sid(), error = %e, "cannot record state"),
        }
        if to == SessionState::Idle {
            // One more session that could make room for another at the live cap.
            self.shared.slots_changed();
        }
    }

    /// The state a live session is in given its pending interactions and turns.
    fn live_state(&self) -> SessionState {
        if self.waits_on_a_client() {
            SessionState::AwaitingPermission
        } else if self.owed.turns() > 0 {
            SessionState::Running
        } else {
            SessionState::Idle
        }
    }

    async fn settle_state(&mut self, reason: Option<String>) {
        let to = self.live_state();
        self.set_state(to, reason).await;
    }

    // ------------------------------------------------------------------ commands

    async fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Send { msg, reply } => self.send(msg, reply).await,
            Command::SendWritten {
                seq,
                message_id,
                result,
                reply,
            } => {
                let owed = result.is_err() && self.owed.withdrawn(&message_id);
                let r = self
                    .send_written(seq, result, owed)
                    .await
                    .map(|o| SendOutcome {
                        message_id: Some(message_id),
                        ..o
                    });
                let _ = reply.send(r);
            }
            Command::Respond {
                request_id,
                response,
                client,
                reply,
            } => {
                let r = self.respond(&request_id, response, &client).await;
                self.settle_state(None).await;
                let _ = reply.send(r);
            }
            Command::RespondHook {
                request_id,
                answer,
                client,
                reply,
            } => {
                let r = self.respond_hook(&request_id, answer, &client).await;
                self.settle_state(None).await;
                let _ = reply.send(r);
            }
            Command::RespondToolCall {
                request_id,
                content,
                is_error,
                client,
                reply,
            } => {
                let r = self
                    .respond_tool_call(&request_id, content, is_error, &client)
                    .await;
                let _ = reply.send(r);
            }
            Command::RespondDialog {
                request_id,
                behavior,
                result,
                client,
                reply,
            } => {
                let r = self
                    .respond_dialog(&request_id, behavior, result, &client)
                    .await;
                let _ = reply.send(r);
            }
            Command::RespondElicitation {
                request_id,
                action,
                content,
                client,
                reply,
            } => {
                let r = self
                    .respond_elicitation(&request_id, action, content, &client)
                    .await;
                let _ = reply.send(r);
            }
            Command::Answer {
                request_id,
                answers,
                client,
                reply,
            } => {
                let r = self.answer(&request_id, answers, &client).await;
                self.settle_state(None).await;
                let _ = reply.send(r);
            }
            Command::Control { request, reply } => {
                if self.stop_requested {
                    let _ = reply.send(Err(Error::precondition(format!(
                        "session {:?} is stopping",
                        self.sid()
                    ))));
                    return;
                }
                let extra = self.hook_wait_within(&request);
                self.request_in_task(request, extra, reply);
            }
            Command::ControlDone {
                request,
                result,
                reply,
            } => {
                let r = self.control_done(request, result).await;
                let _ = reply.send(r);
            }
            Command::RenameCli { title } => {
                if !self.stop_requested {
                    self.rename_cli(title);
                }
            }
            Command::RenameDone { request, result } => self.renamed_cli(request, result).await,
            Command::Restored { request, result } => {
                let result = result.map_err(|e| e.to_string()).and_then(|answer| {
                    match crate::runtime::refusal_in_answer(&request, answer.as_ref()) {
                        Some(refused) => Err(refused),
                        None => Ok(answer),
                    }
                });
                self.restored(request, result).await;
            }
            Command::Suspend { reason, reply } => {
                let suspending = self.begin_suspend(reason);
                let _ = reply.send(suspending);
            }
            Command::Stop { reply, shutdown } => {
                self.shutdown |= shutdown;
                self.stop_waiters.push(reply);
                if !self.stop_requested {
                    self.stop_requested = true;
                    // A client's stop ends the running turn first, as Interrupt does: the
                    // CLI withdraws what it asked and calls the model and tools no more
                    // (closing stdin alone lets it finish the turn). A daemon shutdown
                    // leaves the turn its grace time: the session comes back resumable.
                    let interrupt = !self.shutdown
                        && matches!(
                            self.state,
                            SessionState::Running | SessionState::AwaitingPermission
                        );
                    let process = self.process.clone();
                    let tx = self.self_tx.clone();
                    tokio::spawn(async move {
                        if interrupt {
                            // Refused at once by a release without it; bounded otherwise.
                            let _ = tokio::time::timeout(
                                STOP_INTERRUPT_WAIT,
                                process.request(OutRequest::Interrupt),
                            )
                            .await;
                        }
                        let next = match tx.upgrade() {
                            Some(tx) => tx.send(Command::StopNow).await.is_ok(),
                            None => false,
                        };
                        if !next {
                            process.stop().await;
                        }
                    });
                }
            }
            Command::StopNow => {
                // What the CLI still waits on is withdrawn now (a late answer is refused,
                // not recorded as taking effect), then its stdin closes.
                self.close_all_pending(self.end_reason()).await;
                self.settle_state(None).await;
                let process = self.process.clone();
                tokio::spawn(async move {
                    process.stop().await;
                });
            }
        }
    }

    /// Records the message, queues it for stdin and replies once it is written. The write
    /// is awaited in its own task: the CLI may stop reading stdin until its stdout is
    /// drained, so the actor keeps draining it meanwhile.
    async fn send(&mut self, mut msg: SendMessage, reply: oneshot::Sender<Result<SendOutcome>>) {
        // The session's option, for every message (recorded with the message as sent).
        msg.delivery.verbatim |= self.verbatim_prompts;
        if self.stop_requested {
            let _ = reply.send(Err(Error::precondition(format!(
                "session {:?} is stopping",
                self.sid()
            ))));
            return;
        }
        if let Some(id) = &msg.client_message_id
            && let Some(&seq) = self.meta.messages.get(id)
        {
            // The first send's wire id, from its recorded event (a retry waits on the turn
            // that names it like the first send would). Read off the actor's task.
            let store = self.shared.store.clone();
            let sid = self.sid().to_owned();
            tokio::spawn(async move {
                let message_id =
                    crate::blocking::blocking(move || stored_user_message(&store, &sid, seq))
                        .await
                        .ok()
                        .flatten()
                        .and_then(|u| u.message_id);
                let _ = reply.send(Ok(SendOutcome {
                    seq,
                    duplicate: true,
                    message_id,
                }));
            });
            return;
        }
        let message_id = uuid::Uuid::new_v4().to_string();
        let event = match self
            .emit(EventPayload::UserMessageSent(UserMessageSent {
                content: msg.content.clone(),
                client_message_id: msg.client_message_id.clone(),
                sent_by: msg.client.label(),
                message_id: Some(message_id.clone()),
                delivery: msg.delivery.clone(),
            }))
            .await
        {
            Ok(e) => e,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let seq = event.seq.unwrap_or_default();
        if let Some(id) = &msg.client_message_id {
            self.meta.messages.insert(id.clone(), seq);
        }
        let content = match msg.content {
            MessageContent::Text(t) => UserContent::Text(t),
            MessageContent::Blocks(b) => UserContent::Blocks(b),
        };
        let priority = msg.delivery.priority;
        let queued =
            self.process
                .queue_user_tagged(content, Some(message_id.clone()), msg.delivery);
        let ack = match queued {
            Ok(ack) => ack,
            Err(e) => {
                let r = self.send_written(seq, Err(e), false).await;
                let _ = reply.send(r);
                return;
            }
        };
        self.owed.sent(&message_id, priority);
        self.turn_since_result = true;
        self.settle_state(Some("user message".into())).await;
        let tx = self.self_tx.clone();
        let entry = self.entry.clone();
        let shared = self.shared.clone();
        let client_message_id = msg.client_message_id;
        tokio::spawn(async move {
            let result = ack.written().await;
            if result.is_ok() {
                // Written: the message is the CLI's now. Answered from here, not by the
                // actor, which may already be gone (a CLI that exits on reading it).
                let _ = reply.send(Ok(SendOutcome {
                    seq,
                    duplicate: false,
                    message_id: Some(message_id),
                }));
                return;
            }
            // The actor is gone: the notice is recorded from here (the log frees the
            // id for the session's next process), then the caller is told.
            let gone = async move |reply: oneshot::Sender<Result<SendOutcome>>,
                                   result: ostler_supervisor::Result<()>| {
                let e = result.err().map(|e| e.to_string()).unwrap_or_default();
                let notice = delivery_failed(seq, client_message_id, &e);
                if let Err(err) = entry.hub.emit_one(notice).await {
                    tracing::error!(session = %entry.id, error = %err, "cannot record event");
                }
                let _ = reply.send(Err(not_taken(&entry.id, &e, shared.is_shutting_down())));
            };
            let Some(tx) = tx.upgrade() else {
                gone(reply, result).await;
                return;
            };
            let cmd = Command::SendWritten {
                seq,
                message_id,
                result,
                reply,
            };
            if let Err(mpsc::error::SendError(Command::SendWritten { reply, result, .. })) =
                tx.send(cmd).await
            {
                gone(reply, result).await;
            }
        });
    }

    /// A message's write to the CLI ended; `owed`: it failed and the message was still
    /// owed an answer (it was counted among the turns to come).
    async fn send_written(
        &mut self,
        seq: u64,
        result: ostler_supervisor::Result<()>,
        owed: bool,
    ) -> Result<SendOutcome> {
        if let Err(e) = result {
            // The CLI never took the message: its client id is free again, so that a
            // retry is delivered, not answered as a duplicate. The notice carries the id,
            // so a session rebuilt from its log frees it too.
            let client_message_id = self
                .meta
                .messages
                .iter()
                .find(|&(_, &s)| s == seq)
                .map(|(id, _)| id.clone());
            if let Some(id) = &client_message_id {
                self.meta.messages.remove(id);
            }
            self.emit_logged(delivery_failed(seq, client_message_id, &e.to_string()))
                .await;
            if owed {
                // A turn fewer to come.
                self.settle_state(None).await;
            }
            let shutting_down = self.shutdown || self.shared.is_shutting_down();
            return Err(not_taken(self.sid(), &e.to_string(), shutting_down));
        }
        Ok(SendOutcome {
            seq,
            duplicate: false,
            message_id: None,
        })
    }

    async fn control_done(
        &mut self,
        request: OutRequest,
        result: std::result::Result<Option<RawJson>, ControlError>,
    ) -> Result<Option<RawJson>> {
        if matches!(request, OutRequest::Initialize(_)) {
            self.initialized(result).await;
            return Ok(None);
        }
        let answer = match result {
            Ok(answer) => answer,
            Err(e) => {
                return Err(match e {
                    ControlError::Unsupported { message } => Error::precondition(format!(
                        "the CLI of session {:?} does not support this request: {message}",
                        self.sid()
                    )),
                    ControlError::Failed { message, .. } => {
                        Error::precondition(format!("the CLI refused: {message}"))
                    }
                    ControlError::Timeout(d) => Error::Unavailable(format!(
                        "the CLI did not answer within {d:?}; it may still act on the request \
                         (what it reports then, such as a new permission mode, is recorded)"
                    )),
                    // As for a message the CLI never took: retry later only when the
                    // daemon is shutting down (the session comes back resumable).
                    ControlError::ProcessGone
                        if self.shutdown || self.shared.is_shutting_down() =>
                    {
                        Error::Unavailable(format!(
                            "the daemon is shutting down and the CLI of session {:?} has \
                             exited; retry once the daemon is back",
                            self.sid()
                        ))
                    }
                    ControlError::ProcessGone => Error::precondition(format!(
                        "the CLI of session {:?} has exited; resume the session and retry",
                        self.sid()
                    )),
                });
            }
        };
        if let Some(message) = crate::runtime::refusal_in_answer(&request, answer.as_ref()) {
            return Err(Error::precondition(format!("the CLI refused: {message}")));
        }
        // The model the CLI says it switched to, when it names one: it may map the name
        // asked for to another (measured on 2.1.332: claude-opus-4-1 became
        // claude-opus-5-5), and the record and the notice say what the CLI runs.
        let switched_to = answer
            .as_ref()
            .and_then(|a| a.to_value().ok())
            .and_then(|v| v["model"].as_str().map(str::to_owned))
            .filter(|m| !m.trim().is_empty());
        // `set_model`, or settings that switch the model (`apply_flag_settings`): the
        // model is recorded (for resume and the session's info) the same way.
        if let Some(m) = request
            .model_switch()
            .map(|m| m.map(str::to_owned))
            .map(|m| m.map(|asked| switched_to.clone().unwrap_or(asked)))
        {
            self.last_model = m.clone();
            let patch = SessionPatch {
                model: Some(m.clone().unwrap_or_else(|| "default".into())),
                updated_ms: now_ms(),
                ..Default::default()
            };
            self.shared.store.update_session(self.sid(), patch).await?;
        }
        let (code, message, patch) = match &request {
            OutRequest::SetModel(m) => (
                "model_set",
                match (m.as_deref(), switched_to.as_deref()) {
                    (Some(asked), Some(got)) if asked != got => {
                        format!("model set to {got} (asked for {asked})")
                    }
                    (Some(asked), _) => format!("model set to {asked}"),
                    (None, _) => "model set to the default".to_owned(),
                },
                None,
            ),
            OutRequest::SetPermissionMode(asked) => {
                // What the CLI says is in effect is what the session records (and what
                // the next spawn starts in).
                let named = answer.as_ref().and_then(|a| a.to_value().ok());
                let mode = crate::runtime::mode_in_effect(asked, named.as_ref());
                (
                    "permission_mode_set",
                    if &mode == asked {
                        format!("permission mode set to {mode}")
                    } else {
                        format!("permission mode set to {mode} (asked for {asked})")
                    },
                    Some(SessionPatch {
                        permission_mode: Some(mode),
                        updated_ms: now_ms(),
                        ..Default::default()
                    }),
                )
            }
            OutRequest::Interrupt => ("interrupted", "interrupt sent".to_owned(), None),
            // Reads change nothing: no notice.
            OutRequest::McpStatus => return Ok(answer),
            OutRequest::Other { subtype, .. } if subtype == "get_context_usage" => {
                return Ok(answer);
            }
            _ => ("control", "control request done".to_owned(), None),
        };
        if let Some(patch) = patch {
            self.shared.store.update_session(self.sid(), patch).await?;
        }
        let data = crate::runtime::control_notice_data(&request, answer.as_ref());
        let (code, message) = match &request {
            // A dry run changed nothing: not recorded as a rewind.
            OutRequest::Other { subtype, fields }
                if subtype == "rewind_files"
                    && fields.get("dry_run").and_then(serde_json::Value::as_bool) == Some(true) =>
            {
                (
                    "files_rewind_checked",
                    "rewind_files dry run done".to_owned(),
                )
            }
            OutRequest::Other { subtype, .. } => (
                crate::runtime::control_notice_code(subtype),
                format!("{subtype} done"),
            ),
            OutRequest::SetMaxThinkingTokens(n) => (
                "max_thinking_tokens_set",
                match n {
                    Some(n) => format!("max thinking tokens set to {n}"),
                    None => "max thinking tokens reset".to_owned(),
                },
            ),
            _ => (code, message),
        };
        self.emit(EventPayload::EngineNotice(EngineNotice {
            code: code.into(),
            message,
            data,
        }))
        .await?;
        Ok(answer)
    }

    /// Records the answer to the `initialize` sent at spawn: `session_initialized` with the
    /// answer whole (commands, models, account, output styles, agents) in `data`, or
    /// `initialize_failed` saying why (the session runs on; its `system/init` still says
    /// what it has).
    async fn initialized(&mut self, result: std::result::Result<Option<RawJson>, ControlError>) {
        self.title_announced_from_before = false;
        if result.is_ok() {
            // The CLI took the guarded cut.
            self.guard = None;
        }
        let notice = match result {
            Ok(answer) => {
                let data = answer.and_then(|a| a.to_value().ok());
                EngineNotice {
                    code: crate::runtime::SESSION_INITIALIZED.into(),
                    message: format!(
                        "the CLI answered initialize ({})",
                        crate::runtime::initialize_summary(data.as_ref())
                    ),
                    data,
                }
            }
            Err(e) => EngineNotice {
                code: crate::runtime::INITIALIZE_FAILED.into(),
                message: format!("the CLI did not answer initialize: {e}"),
                data: None,
            },
        };
        let answered = notice.code == crate::runtime::SESSION_INITIALIZED;
        self.emit_logged(EventPayload::EngineNotice(notice)).await;
        if answered && self.respawned {
            self.title_catch_up().await;
        }
    }

    /// A respawned CLI has answered `initialize`: when the title ostler holds is not the
    /// one the CLI announced (renamed with `UpdateSession` while the session was not live),
    /// or the CLI announced none while a client titled the session, the CLI gets ostler's
    /// with `rename_session` so its transcript catches up.
    async fn title_catch_up(&mut self) {
        let announced = self.announced_title.take();
        let store = self.shared.store.clone();
        let sid = self.sid().to_owned();
        let held = match crate::blocking::blocking(move || store.title(&sid)).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(session = %self.sid(), error = %e, "cannot read the session's title");
                return;
            }
        };
        let Some(held) = held else { return };
        let send = match &announced {
            Some(a) => *a != held,
            None => self.meta.client_titled,
        };
        if send {
            self.rename_cli(held);
        }
    }

    /// Sends `rename_session` with `title` when the release answers it (else nothing: the
    /// CLI's transcript keeps its own title); the answer comes back as `RenameDone`. One at
    /// a time: while one is unanswered, `title` is held and sent after the answer.
    fn rename_cli(&mut self, title: String) {
        let mut fields = serde_json::Map::new();
        fields.insert("title".into(), serde_json::Value::String(title.clone()));
        let request = OutRequest::Other {
            subtype: "rename_session".into(),
            fields,
        };
        if !crate::capability::answers_rename(&self.shared.installation) {
            tracing::debug!(session = %self.sid(), version = %self.shared.installation.version, "the release is not measured to answer rename_session: the title stays in ostler's record only");
            return;
        }
        if self.rename_in_flight {
            self.rename_held = Some(title);
            return;
        }
        self.rename_in_flight = true;
        while self.titles_sent.len() >= TITLES_SENT_MAX {
            self.titles_sent.pop_front();
        }
        self.titles_sent.push_back(SentTitle {
            echo: cli_title_form(&title),
            sent: title,
            answered: false,
        });
        let answer = self.process.queue_request(request.clone());
        self.report_back(request, answer, |request, result| Command::RenameDone {
            request,
            result,
        });
    }

    /// Records the CLI's answer to a `rename_session` ostler sent (`cli_title_set`), or
    /// its refusal or silence (`cli_title_set_failed`, also logged): ostler's title stands
    /// either way.
    async fn renamed_cli(
        &mut self,
        request: OutRequest,
        result: std::result::Result<Option<RawJson>, ControlError>,
    ) {
        let fields = match &request {
            OutRequest::Other { fields, .. } => serde_json::Value::Object(fields.clone()),
            _ => serde_json::Value::Null,
        };
        let title = fields["title"].as_str().unwrap_or_default().to_owned();
        let echo = cli_title_form(&title);
        let notice = match result {
            Ok(answer) => {
                if let Some(sent) = self.titles_sent.iter_mut().find(|t| t.echo == echo) {
                    sent.answered = true;
                }
                EngineNotice {
                    code: crate::runtime::CLI_TITLE_SET.into(),
                    message: format!("the CLI's session title set to {title:?}"),
                    data: Some(serde_json::json!({
                        "request": fields,
                        "answer": answer.and_then(|a| a.to_value().ok()),
                    })),
                }
            }
            Err(e) => {
                if let Some(i) = self.titles_sent.iter().position(|t| t.echo == echo) {
                    self.titles_sent.remove(i);
                }
                tracing::warn!(session = %self.sid(), %title, error = %e, "the CLI did not take the session's title");
                EngineNotice {
                    code: crate::runtime::CLI_TITLE_SET_FAILED.into(),
                    message: format!(
                        "the CLI did not take the session's title {title:?} (ostler's \
                         stands): {e}"
                    ),
                    data: Some(serde_json::json!({
                        "request": fields,
                        "error": e.to_string(),
                    })),
                }
            }
        };
        self.emit_logged(EventPayload::EngineNotice(notice)).await;
        self.rename_in_flight = false;
        if let Some(next) = self.rename_held.take()
            && !self.stop_requested
        {
            self.rename_cli(next);
        }
    }

    // ------------------------------------------------------------------ exit

    async fn exited(&mut self, info: ExitInfo) {
        if let Some(why) = self.store_fault.clone()
            && self.store_writable_again().await
        {
            self.emit_logged(EventPayload::EngineNotice(EngineNotice {
                code: "store_unwritable".into(),
                message: format!(
                    "session stopped: the CLI's output could not be stored ({why}); \
                     its output from then on was not recorded"
                ),
                data: None,
            }))
            .await;
        }
        if self.refused.is_none()
            && self.guard.is_some()
            && let Some(line) = info
                .stderr_tail
                .lines()
                .find(|l| l.contains(DROPS_TURN_REFUSAL))
        {
            // Refused on stderr only (no result line).
            let notice = self.refusal(line.trim().to_owned(), None);
            self.emit_logged(notice).await;
        }
        self.close_all_pending(self.end_reason()).await;
        let reason = if self.shutdown {
            "daemon shutdown".to_owned()
        } else if self.store_fault.is_some() {
            "stopped: the store was not writable".to_owned()
        } else if let Some(why) = &self.refused {
            format!("resume refused by the CLI: {why}")
        } else if let Some(why) = &self.suspend_reason {
            format!("suspended: {why}")
        } else if info.requested || self.stop_requested {
            "stopped on request".to_owned()
        } else if info.success() {
            "the CLI exited".to_owned()
        } else {
            "the CLI crashed or was killed".to_owned()
        };
        let exit = ostler_store::ExitInfo {
            facts: info.facts,
            reason: Some(reason.clone()),
            at_ms: now_ms(),
        };
        let tail = info.stderr_tail;
        self.show(|v| v.stderr_tail = Some(tail.clone()));
        let to = if self.shutdown {
            SessionState::Resumable
        } else if self.refused.is_some() && self.store_fault.is_none() {
            // Not a crash: the CLI declined what it was asked at boot. A session that
            // resumes on demand still does (plainly: the refused cut is not repeated);
            // any other waits for a ResumeSession.
            match self.before {
                SessionState::Suspended | SessionState::Resumable => self.before,
                _ => SessionState::Stopped,
            }
        } else if self.suspend_reason.is_some() && self.store_fault.is_none() {
            SessionState::Suspended
        } else if self.stop_requested {
            SessionState::Stopped
        } else {
            SessionState::Exited
        };
        let patch = SessionPatch {
            exit: Some(exit.clone()),
            updated_ms: now_ms(),
            ..Default::default()
        };
        // The exit event and the session's exit columns commit together.
        let item = Item::new(EventPayload::ProcessExited(ProcessExited {
            status: ExitStatus {
                exit,
                stderr_tail: tail,
            },
        }));
        let with = WithEvents {
            patch: Some(patch),
            ..Default::default()
        };
        if let Err(e) = self.entry.hub.emit_with(vec![item], with).await {
            tracing::error!(session = %self.sid(), error = %e, "cannot record the exit");
        }
        // The process is gone: its live-session slot is free before the final state is
        // published (whoever saw the session end finds the slot, and the live count, free).
        drop(self.view.slot.take());
        self.set_state(to, Some(reason)).await;
        for w in self.stop_waiters.drain(..) {
            let _ = w.send(Ok(()));
        }
    }
}

impl Actor {
    /// Why the process ends (or is ending), for what it leaves pending.
    fn end_reason(&self) -> &'static str {
        if self.shutdown {
            "daemon shutting down"
        } else if self.refused.is_some() {
            "the CLI refused the guarded cut"
        } else if self.suspend_reason.is_some() {
            "session suspended"
        } else if self.stop_requested {
            "session stopped"
        } else {
            "the CLI process exited"
        }
    }

    /// The CLI's refusal of the guarded cut, when `r` is one (an error result naming it,
    /// before the CLI answered `initialize`): its reason.
    fn guard_refusal(&self, r: &ostler_protocol::TurnResult) -> Option<String> {
        if self.guard.is_none() || !r.is_error {
            return None;
        }
        r.errors
            .iter()
            .chain(r.result.as_ref())
            .find(|e| e.contains(DROPS_TURN_REFUSAL))
            .map(|e| e.trim().to_owned())
    }

    /// Takes the refusal of the guarded cut (`result`: the CLI's result saying so, when it
    /// wrote one): the notice that records it.
    fn refusal(
        &mut self,
        reason: String,
        result: Option<&ostler_protocol::TurnResult>,
    ) -> EventPayload {
        let guard = self.guard.take().unwrap_or_default();
        self.refused = Some(reason.clone());
        EventPayload::EngineNotice(EngineNotice {
            code: RESUME_REFUSED.into(),
            message: format!("the CLI refused the guarded cut: {reason}"),
            data: Some(serde_json::json!({
                "at_message_id": guard.at_message_id,
                "drops_turn_message_id": guard.drops_turn_message_id,
                "reason": reason,
                "result": result.map(|r| serde_json::json!({
                    "subtype": r.subtype,
                    "errors": r.errors,
                })),
            })),
        })
    }

    /// Withdraws every pending interaction (permissions and questions, hook calls, tool
    /// calls, elicitations), recorded as cancelled by the engine.
    async fn close_all_pending(&mut self, why: &str) {
        let ids: Vec<String> = self.pending.keys().cloned().collect();
        for id in ids {
            self.close_pending(&id, "engine", why, InteractionState::Cancelled)
                .await;
        }
        self.cancel_hooks("engine").await;
        self.cancel_tool_calls(None, "engine", why).await;
        self.cancel_elicitations(None, "engine").await;
        self.cancel_dialogs(None, "engine").await;
    }

    /// Nothing runs: no turn, no pending interaction, no background task, not stopping.
    fn quiet(&self) -> bool {
        !self.stop_requested
            && self.state == SessionState::Idle
            && !self.waits_on_a_client()
            && self.owed.turns() == 0
            && self.bg_tasks.is_empty()
    }

    /// `queue_grace` after a result that left messages owed: unless the CLI showed since
    /// that it took the next one (a message sent, an echo or lifecycle `started`, a turn's
    /// output), none is queued there, and they are forgotten. While the CLI waits on a
    /// client (a hook, a permission, a tool call: a UserPromptSubmit hook comes before the
    /// echo of the message it is for), the grace starts again.
    async fn no_next_turn(&mut self) {
        if self.turn_since_result || self.owed.taken_since_result() {
            return;
        }
        if self.waits_on_a_client() {
            self.start_grace();
            return;
        }
        let n = self.owed.forget();
        if n == 0 {
            return;
        }
        tracing::warn!(session = %self.sid(), owed = n, "no turn came for the messages owed an answer: forgetting them");
        let grace = self.shared.opts.queue_grace;
        self.settle_state(Some(format!(
            "the CLI took none of the {n} message(s) still owed an answer within {}s of its last result",
            grace.as_secs()
        )))
        .await;
    }

    /// The CLI waits for a client's answer (a permission or question, a hook, a tool call).
    fn waits_on_a_client(&self) -> bool {
        !self.pending.is_empty()
            || !self.hooks.is_empty()
            || !self.tool_calls.is_empty()
            || !self.elicitations.is_empty()
            || !self.dialogs.is_empty()
    }

    /// What kind of interaction `request_id` is, when it is pending here.
    fn pending_kind(&self, request_id: &str) -> Option<&'static str> {
        if let Some(p) = self.pending.get(request_id) {
            Some(match p.kind {
                InteractionKind::Question => "question",
                _ => "permission request",
            })
        } else if self.hooks.contains_key(request_id) {
            Some("hook call")
        } else if self.tool_calls.contains_key(request_id) {
            Some("tool call")
        } else if self.elicitations.contains_key(request_id) {
            Some("elicitation")
        } else if self.dialogs.contains_key(request_id) {
            Some("dialog")
        } else {
            None
        }
    }

    /// The CLI has `queue_grace` from now to show it took the next message owed.
    pub(super) fn start_grace(&mut self) {
        self.next_turn_due = Some(Instant::now() + self.shared.opts.queue_grace);
    }

    /// A question the CLI asked a client was closed (answered, expired or cancelled): the
    /// grace it has to take the next message owed (if one is running) counts from now.
    fn grace_again(&mut self) {
        if self.next_turn_due.is_some() {
            self.start_grace();
        }
    }

    /// When the idle timer fires: `idle_suspend` after the last thing handled, while quiet.
    fn idle_deadline(&self) -> Option<Instant> {
        let idle = self.shared.opts.idle_suspend?;
        self.quiet().then(|| self.last_active + idle)
    }

    /// A client used the session: the idle timer restarts and, if idle, the session is the
    /// most recently used one.
    fn used(&mut self) {
        self.last_active = Instant::now();
        if self.state == SessionState::Idle {
            let now = self.last_active;
            self.show(|v| v.idle_since = Some(now));
        }
    }

    /// Starts suspending the session when it is quiet and no engine call is on its way to
    /// it (`inflight`): marks it `suspending` first, then checks `inflight` (the engine
    /// counts first, then checks `suspending`; both `SeqCst`), so a call either reaches this
    /// process or sees the mark and resumes the session after its end. Returns whether the
    /// process is now stopping; the exit then records `suspended`.
    fn begin_suspend(&mut self, reason: String) -> bool {
        if !self.quiet() {
            return false;
        }
        self.entry.suspending.store(true, Ordering::SeqCst);
        if self.entry.inflight.load(Ordering::SeqCst) > 0 {
            self.entry.suspending.store(false, Ordering::SeqCst);
            return false;
        }
        tracing::info!(session = %self.sid(), %reason, "suspending the session");
        self.suspend_reason = Some(reason);
        self.stop_requested = true;
        let process = self.process.clone();
        tokio::spawn(async move {
            process.stop().await;
        });
        true
    }

    /// Follows the background tasks the CLI reports, and the session's title when the CLI
    /// renames it (`system/session_title_changed`, an unknown message kept whole: after a
    /// `rename_session` sent with `SendControlRequest`, a hook's `sessionTitle`), before the
    /// lines are recorded: the title is queued to the store ahead of the batch that carries
    /// the message, so whoever sees the message finds the session renamed.
    fn track_notices(&mut self, events: &[ostler_protocol::Event]) {
        for ev in events {
            let n = match ev {
                ostler_protocol::Event::SystemNotice(n) => n,
                ostler_protocol::Event::Unknown(u)
                    if u.message_type == "system/session_title_changed" =>
                {
                    if let Ok(v) = u.raw.to_value() {
                        self.cli_renamed(&v);
                    }
                    continue;
                }
                _ => continue,
            };
            let sub = n.subtype.as_deref().unwrap_or_default();
            if n.source_type == "system" && sub == "status" {
                // The CLI says its permission mode changed: by a SetPermissionMode answered
                // after its caller gave up, or on its own (leaving plan mode): the record
                // (what a resume starts with) follows the CLI. The decoder types every status
                // line's detail from the envelope it reads anyway: a status line comes with
                // every request the CLI makes, and parsing its fields again here cost a third
                // of the firehose's events a `Value` each (9 % of the daemon's instructions in
                // bench item a).
                if let Some(NoticeDetail::Status(st)) = &n.detail
                    && let Some(mode) = &st.permission_mode
                {
                    self.cli_mode_changed(mode);
                }
                continue;
            }
            if n.source_type != "system"
                || !matches!(
                    sub,
                    "task_started" | "task_notification" | "background_tasks_changed"
                )
            {
                continue;
            }
            let Ok(v) = n.fields.to_value() else { continue };
            let id = |t: &serde_json::Value| t["task_id"].as_str().map(str::to_owned);
            match sub {
                "task_started" => self.bg_tasks.extend(id(&v)),
                "task_notification" => {
                    if let Some(t) = id(&v) {
                        self.bg_tasks.remove(&t);
                    }
                }
                _ => {
                    self.bg_tasks = v["tasks"]
                        .as_array()
                        .map(|a| a.iter().filter_map(id).collect())
                        .unwrap_or_default();
                }
            }
        }
    }

    /// The CLI says its permission mode changed: recorded (what a resume starts with).
    fn cli_mode_changed(&self, mode: &str) {
        let patch = SessionPatch {
            permission_mode: Some(mode.to_owned()),
            updated_ms: now_ms(),
            ..Default::default()
        };
        let ticket = self.shared.store.update_session(self.sid(), patch);
        let sid = self.sid().to_owned();
        tokio::spawn(async move {
            if let Err(e) = ticket.await {
                tracing::warn!(session = %sid, error = %e, "cannot record the CLI's permission mode");
            }
        });
    }

    /// The CLI renamed its session (`system/session_title_changed`): the title is
    /// queued to the store (a rename that cannot be stored is logged). Not the title a
    /// resumed CLI announces while it handles `initialize`: that is the one it held
    /// before, not a rename.
    fn cli_renamed(&mut self, msg: &serde_json::Value) {
        let Some(title) = msg["title"].as_str().filter(|t| !t.trim().is_empty()) else {
            return;
        };
        if self.title_announced_from_before {
            tracing::debug!(session = %self.sid(), title, "the resumed CLI announces the title it held; ostler's stays");
            self.announced_title = Some(title.to_owned());
            return;
        }
        if let Some(i) = self.titles_sent.iter().position(|t| t.echo == title) {
            // The echo of a rename ostler sent: its record already has that title, or a
            // newer one. When it is the newest ostler gave and the CLI took it in its own
            // form (edges trimmed, control characters made spaces, 200 characters at
            // most), ostler's record takes that form, as for a rename by the CLI.
            let other_form = self
                .titles_sent
                .drain(..=i)
                .next_back()
                .is_some_and(|t| t.sent != title);
            let newest = self.titles_sent.is_empty() && self.rename_held.is_none();
            if !(newest && other_form) {
                return;
            }
        } else {
            // Not an echo of a title ostler sent (the CLI renamed the session itself, or
            // took a sent title under another name): answered titles whose echo did not
            // come back will not any more.
            self.titles_sent.retain(|t| !t.answered);
        }
        let ticket = self.shared.store.set_title(self.sid(), title);
        let sid = self.sid().to_owned();
        tokio::spawn(async move {
            if let Err(e) = ticket.await {
                tracing::warn!(session = %sid, error = %e, "cannot record the title the CLI gave the session");
            }
        });
    }

    /// Waits until the store writes again; `false` when the daemon shuts down (or every
    /// engine handle is gone) first.
    async fn store_writable_again(&self) -> bool {
        if self.shutdown {
            return false;
        }
        let mut health = self.shared.store.watch_write_health();
        let mut alive = self.shared.alive();
        let mut shutdown = self.shared.watch_shutdown();
        tokio::select! {
            r = health.wait_for(|h| h.is_writable()) => r.is_ok(),
            () = engine_gone(&mut alive) => false,
            _ = shutdown.wait_for(|s| *s) => false,
        }
    }
}

/// At most this many titles sent with `rename_session` wait for their echo.
const TITLES_SENT_MAX: usize = 8;

/// A title sent with `rename_session`, awaiting its `session_title_changed` echo.
#[derive(Debug)]
struct SentTitle {
    /// The title as the CLI echoes it ([`cli_title_form`]).
    echo: String,
    /// The title as ostler sent it (and holds it).
    sent: String,
    /// The CLI answered the `rename_session`.
    answered: bool,
}

/// The title as the CLI takes and echoes it (2.1.332's bundle, `rename_session`): runs of
/// control and format characters (and U+2028, U+2029) made one space, the first 200
/// characters kept, the edges trimmed.
fn cli_title_form(title: &str) -> String {
    let mut out = String::with_capacity(title.len());
    let mut in_run = false;
    for c in title.trim().chars() {
        let control = c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') || is_format_char(c);
        if control {
            if !in_run {
                out.push(' ');
            }
            in_run = true;
        } else {
            out.push(c);
            in_run = false;
        }
    }
    out.chars().take(200).collect::<String>().trim().to_owned()
}

/// Unicode general category Cf (format), the common ones.
fn is_format_char(c: char) -> bool {
    matches!(c,
        '\u{ad}' | '\u{600}'..='\u{605}' | '\u{61c}' | '\u{6dd}' | '\u{70f}' | '\u{890}'
        | '\u{891}' | '\u{8e2}' | '\u{180e}' | '\u{200b}'..='\u{200f}'
        | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{206f}'
        | '\u{feff}' | '\u{fff9}'..='\u{fffb}' | '\u{110bd}' | '\u{110cd}'
        | '\u{13430}'..='\u{1343f}' | '\u{1bca0}'..='\u{1bca3}' | '\u{1d173}'..='\u{1d17a}'
        | '\u{e0001}' | '\u{e0020}'..='\u{e007f}')
}

/// The commit of the oldest batch in flight (pending forever when there is none).
async fn oldest(in_flight: &mut VecDeque<output::Batch>) -> ostler_store::Result<Vec<u64>> {
    match in_flight.front_mut() {
        Some(b) => b.ticket().await,
        None => std::future::pending().await,
    }
}

async fn engine_gone(rx: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|gone| *gone).await;
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending::<()>().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::EngineOptions;

    /// The CLI's form of a title (what its `session_title_changed` echo carries).
    #[test]
    fn a_title_in_the_cli_s_form() {
        assert_eq!(cli_title_form("plain"), "plain");
        assert_eq!(cli_title_form("  a\t\tb\u{200b}c \n"), "a b c");
        assert_eq!(cli_title_form("x\u{2028}y"), "x y");
        let long: String = std::iter::repeat_n('é', 199)
            .chain(" tail".chars())
            .collect();
        assert_eq!(cli_title_form(&long).chars().count(), 199);
    }

    /// When an actor ends (its publisher drops: on any return, and when it panics), its
    /// live-session slot is released and the view shows the end, so whoever waited for the
    /// end (StopSession, then CreateSession) finds the slot free.
    #[tokio::test]
    async fn an_ended_actor_frees_its_slot_and_shows_the_end() {
        let dir = tempfile::tempdir().expect("tmp");
        let store =
            ostler_store::Store::open(dir.path().join("s.db"), Default::default()).expect("store");
        let installation = ostler_supervisor::Installation::assume(
            dir.path().join("claude"),
            semver::Version::new(2, 1, 330),
            None,
        );
        let (_gone_tx, gone) = watch::channel(false);
        let opts = EngineOptions {
            max_live_sessions: 1,
            ..Default::default()
        };
        let shared = Arc::new(Shared::new(opts, store, installation, Vec::new(), gone));
        let slot = shared.reserve_slot().expect("slot");
        assert!(shared.reserve_slot().is_err(), "one slot only");
        let (tx, view) = watch::channel(SessionView {
            live: true,
            state: SessionState::Idle,
            pending: BTreeMap::new(),
            stderr_tail: None,
            idle_since: None,
        });
        let (cmd_tx, _cmd_rx) = mpsc::channel(1);
        let handle = SessionHandle::new(cmd_tx, view);
        assert!(handle.is_live());
        let waiter = {
            let (handle, shared) = (handle.clone(), shared.clone());
            tokio::spawn(async move {
                handle.ended().await;
                shared.reserve_slot().map(drop)
            })
        };
        drop(ViewPublisher {
            tx,
            slot: Some(slot),
        });
        let taken = tokio::time::timeout(ostler_testkit::timeouts::guard(), waiter)
            .await
            .expect("the end was seen")
            .expect("task");
        assert!(taken.is_ok(), "the slot was still taken: {taken:?}");
        assert!(!handle.is_live());
    }
}
