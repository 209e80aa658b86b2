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
use ostler_protocol::outbound::{OutRequest, UserContent};
use ostler_store::{InteractionState, SessionPatch, WithEvents};
use ostler_supervisor::{ControlError, ExitInfo, Line, ProcessEvent, Responder, SessionProcess};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::handle::{Command, Meta, SessionEntry, SessionHandle, SessionView};
use crate::hub::{Item, now_ms};
use crate::shared::{Shared, SlotGuard};
use crate::types::*;

mod interactions;
mod output;

/// Lines batched into one store append at most.
const MAX_BATCH_LINES: usize = 256;

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
    turns_outstanding: u32,
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
    /// Batches of CLI output whose commit is in flight, oldest first.
    in_flight: VecDeque<output::Batch>,
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
        });
        let pid = o.process.pid();
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
            turns_outstanding: 0,
            claude_session_id: o.claude_session_id,
            stop_waiters: Vec::new(),
            stop_requested: false,
            shutdown: false,
            last_model: o.model,
            process_cost_usd: 0.0,
            store_fault: None,
            in_flight: VecDeque::new(),
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
    }

    async fn run(mut self) {
        let mut held: Option<ProcessEvent> = None;
        let mut cmds_open = true;
        let mut alive = self.shared.alive();
        loop {
            let deadline = self.pending.values().filter_map(|p| p.deadline).min();
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
                        code: None,
                        signal: None,
                        stderr_tail: String::new(),
                        requested: self.stop_requested,
                    }))),
                    cmd = self.cmds.recv(), if cmds_open => {
                        match cmd {
                            Some(cmd) => self.command(cmd).await,
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
                        None
                    }
                }
            };
            let Some(ev) = ev else { continue };
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
        self.show(|v| v.state = to);
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
        match self.entry.hub.emit_with(vec![item], with).await {
            Ok(_) => self.shared.counts.moved(Some(from), Some(to)),
            Err(e) => tracing::error!(session = %self.sid(), error = %e, "cannot record state"),
        }
    }

    /// The state a live session is in given its pending interactions and turns.
    fn live_state(&self) -> SessionState {
        if !self.pending.is_empty() {
            SessionState::AwaitingPermission
        } else if self.turns_outstanding > 0 {
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
            Command::SendWritten { seq, result, reply } => {
                let r = self.send_written(seq, result, true).await;
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
                let process = self.process.clone();
                let tx = self.self_tx.clone();
                tokio::spawn(async move {
                    let result = process.request(request.clone()).await.map(|_| ());
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
            Command::ControlDone {
                request,
                result,
                reply,
            } => {
                let r = self.control_done(request, result).await;
                let _ = reply.send(r);
            }
            Command::Stop { reply, shutdown } => {
                self.shutdown |= shutdown;
                self.stop_waiters.push(reply);
                if !self.stop_requested {
                    self.stop_requested = true;
                    let process = self.process.clone();
                    tokio::spawn(async move {
                        process.stop().await;
                    });
                }
            }
        }
    }

    /// Records the message, queues it for stdin and replies once it is written. The write
    /// is awaited in its own task: the CLI may stop reading stdin until its stdout is
    /// drained, so the actor keeps draining it meanwhile.
    async fn send(&mut self, msg: SendMessage, reply: oneshot::Sender<Result<SendOutcome>>) {
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
            let _ = reply.send(Ok(SendOutcome {
                seq,
                duplicate: true,
            }));
            return;
        }
        let event = match self
            .emit(EventPayload::UserMessageSent(UserMessageSent {
                content: msg.content.clone(),
                client_message_id: msg.client_message_id.clone(),
                sent_by: msg.client.label(),
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
        if let Some(id) = msg.client_message_id {
            self.meta.messages.insert(id, seq);
        }
        let content = match msg.content {
            MessageContent::Text(t) => UserContent::Text(t),
            MessageContent::Blocks(b) => UserContent::Blocks(b),
        };
        let ack = match self.process.queue_user(content) {
            Ok(ack) => ack,
            Err(e) => {
                let r = self.send_written(seq, Err(e), false).await;
                let _ = reply.send(r);
                return;
            }
        };
        self.turns_outstanding += 1;
        self.settle_state(Some("user message".into())).await;
        let tx = self.self_tx.clone();
        tokio::spawn(async move {
            let result = ack.written().await;
            if let Some(tx) = tx.upgrade() {
                let _ = tx.send(Command::SendWritten { seq, result, reply }).await;
            }
        });
    }

    async fn send_written(
        &mut self,
        seq: u64,
        result: ostler_supervisor::Result<()>,
        counted: bool,
    ) -> Result<SendOutcome> {
        if let Err(e) = result {
            self.emit_logged(EventPayload::EngineNotice(EngineNotice {
                code: "delivery_failed".into(),
                message: format!(
                    "the user message (seq {seq}) could not be written to the CLI: {e}"
                ),
                data: None,
            }))
            .await;
            if counted && self.turns_outstanding > 0 {
                self.turns_outstanding -= 1;
                self.settle_state(None).await;
            }
            return Err(Error::Unavailable(format!(
                "the CLI of session {:?} did not take the message: {e}",
                self.sid()
            )));
        }
        Ok(SendOutcome {
            seq,
            duplicate: false,
        })
    }

    async fn control_done(
        &mut self,
        request: OutRequest,
        result: std::result::Result<(), ControlError>,
    ) -> Result<()> {
        if let Err(e) = result {
            return Err(match e {
                ControlError::Unsupported { message } => Error::precondition(format!(
                    "the CLI of session {:?} does not support this request: {message}",
                    self.sid()
                )),
                ControlError::Failed { message, .. } => {
                    Error::precondition(format!("the CLI refused: {message}"))
                }
                ControlError::Timeout(d) => {
                    Error::Unavailable(format!("the CLI did not answer within {d:?}"))
                }
                ControlError::ProcessGone => {
                    Error::Unavailable(format!("the CLI of session {:?} has exited", self.sid()))
                }
            });
        }
        let (code, message, patch) = match &request {
            OutRequest::SetModel(m) => {
                self.last_model = m.clone();
                (
                    "model_set",
                    format!("model set to {}", m.as_deref().unwrap_or("the default")),
                    Some(SessionPatch {
                        model: Some(m.clone().unwrap_or_else(|| "default".into())),
                        updated_ms: now_ms(),
                        ..Default::default()
                    }),
                )
            }
            OutRequest::SetPermissionMode(mode) => (
                "permission_mode_set",
                format!("permission mode set to {mode}"),
                Some(SessionPatch {
                    permission_mode: Some(mode.clone()),
                    updated_ms: now_ms(),
                    ..Default::default()
                }),
            ),
            OutRequest::Interrupt => ("interrupted", "interrupt sent".to_owned(), None),
            _ => ("control", "control request done".to_owned(), None),
        };
        if let Some(patch) = patch {
            self.shared.store.update_session(self.sid(), patch).await?;
        }
        self.emit(EventPayload::EngineNotice(EngineNotice {
            code: code.into(),
            message,
            data: None,
        }))
        .await?;
        Ok(())
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
        let why = if self.shutdown {
            "daemon shutting down"
        } else if self.stop_requested {
            "session stopped"
        } else {
            "the CLI process exited"
        };
        let ids: Vec<String> = self.pending.keys().cloned().collect();
        for id in ids {
            self.close_pending(&id, "engine", why, InteractionState::Cancelled)
                .await;
        }
        let reason = if self.shutdown {
            "daemon shutdown".to_owned()
        } else if self.store_fault.is_some() {
            "stopped: the store was not writable".to_owned()
        } else if info.requested || self.stop_requested {
            "stopped on request".to_owned()
        } else if info.success() {
            "the CLI exited".to_owned()
        } else {
            "the CLI crashed or was killed".to_owned()
        };
        let status = ExitStatus {
            code: info.code,
            signal: info.signal,
            reason: Some(reason.clone()),
            stderr_tail: info.stderr_tail.clone(),
            at_ms: now_ms(),
        };
        let tail = info.stderr_tail.clone();
        self.show(|v| v.stderr_tail = Some(tail));
        let to = if self.shutdown {
            SessionState::Resumable
        } else if self.stop_requested {
            SessionState::Stopped
        } else {
            SessionState::Exited
        };
        let patch = SessionPatch {
            exit: Some(ostler_store::ExitInfo {
                code: info.code,
                signal: info.signal,
                reason: Some(reason.clone()),
                at_ms: status.at_ms,
            }),
            updated_ms: now_ms(),
            ..Default::default()
        };
        // The exit event and the session's exit columns commit together.
        let item = Item::new(EventPayload::ProcessExited(ProcessExited { status }));
        let with = WithEvents {
            patch: Some(patch),
            ..Default::default()
        };
        if let Err(e) = self.entry.hub.emit_with(vec![item], with).await {
            tracing::error!(session = %self.sid(), error = %e, "cannot record the exit");
        }
        self.set_state(to, Some(reason)).await;
        for w in self.stop_waiters.drain(..) {
            let _ = w.send(Ok(()));
        }
    }
}

impl Actor {
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
