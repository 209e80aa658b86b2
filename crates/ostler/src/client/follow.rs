//! Following a session: subscribe, show events, answer prompts, handle Ctrl-C, resubscribe
//! after the last seen `seq` when the stream breaks.

use std::collections::VecDeque;
use std::time::Duration;

use anyhow::Result;
use ostler_proto::v1 as pb;
use pb::session_event::Payload;
use tokio_stream::StreamExt as _;

use super::prompt::{Answerer, Asked, CtrlC, PermissionAnswer};
use super::render::{Human, json_line};
use super::{Conn, json, status_error};

/// Where events go.
pub enum Output {
    Human(Human),
    Json,
}

impl Output {
    pub fn event(&mut self, e: &pb::SessionEvent) {
        match self {
            Output::Human(h) => h.event(e),
            Output::Json => json_line(&json::event(e)),
        }
    }

    /// A notice on stderr (stdout stays pure JSON in JSON mode).
    pub fn note(&mut self, s: &str) {
        match self {
            Output::Human(h) => h.note(s),
            // stdout carries only JSON; notes go to stderr.
            Output::Json => eprintln!("{}", super::render::terminal_text(s)),
        }
    }

    /// Who asks a permission request or a hook call: `None` for the main
    /// agent (no `agent_id`), else the sub-agent's label as the renderer heads its lines
    /// (its id when the renderer has not seen it, or in JSON mode).
    fn asker(&self, agent_id: &str) -> Option<String> {
        match self {
            Output::Human(h) => h.asker(agent_id),
            Output::Json => super::render::agent_label(agent_id, "", ""),
        }
    }

    fn spinning(&self) -> bool {
        matches!(self, Output::Human(h) if h.spinning())
    }

    fn tick(&mut self) {
        if let Output::Human(h) = self {
            h.tick();
        }
    }

    pub fn clear(&mut self) {
        if let Output::Human(h) = self {
            h.clear_spinner();
        }
    }

    /// A prompt is about to be asked on the terminal (see [`Human::yield_terminal`]).
    fn before_prompt(&mut self) {
        if let Output::Human(h) = self {
            h.yield_terminal();
        }
    }
}

/// When following stops by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Until {
    /// At the first TurnCompleted with a seq above this one (or when the session ends).
    TurnAfter(u64),
    /// At the TurnCompleted that answers the message stored at `seq`, whose wire id is
    /// `message_id` (learnt from the stored message when empty, e.g. for a duplicate send):
    /// the first TurnCompleted after it that lists the id in `user_message_ids`. A message
    /// sent while a turn runs is queued by the CLI: the running turn's result comes first
    /// and does not list it. From a release that lists no ids, the first TurnCompleted after
    /// it (or when the session ends).
    AnswerTo { seq: u64, message_id: String },
    /// Until Ctrl-C, or the session stops, exits or is deleted.
    Forever,
}

impl Until {
    /// Whether an event stored at `seq` is about what is followed: after the message (or
    /// the seq) it waits on. A session suspended, stopped or exited before the message was
    /// recorded (suspended to make room while the send was on its way) comes back for it.
    fn covers(&self, seq: u64) -> bool {
        match self {
            Until::TurnAfter(s) | Until::AnswerTo { seq: s, .. } => seq > *s,
            Until::Forever => true,
        }
    }

    /// Whether the TurnCompleted `t` stored at `seq` ends following.
    fn ends_at(&self, seq: u64, t: &pb::TurnCompleted) -> bool {
        match self {
            Until::TurnAfter(s) => seq > *s,
            Until::AnswerTo { seq: s, message_id } => {
                seq > *s
                    && (t.user_message_ids.is_empty()
                        || message_id.is_empty()
                        || t.user_message_ids.contains(message_id))
            }
            Until::Forever => false,
        }
    }
}

/// How following ended.
#[derive(Debug)]
pub enum Outcome {
    Turn(pb::TurnCompleted),
    /// The session stopped or its process exited before the turn completed.
    Ended(String),
    /// The message followed was withdrawn by an interrupt (of any client) before the CLI
    /// answered it.
    Withdrawn(String),
    /// Second Ctrl-C (or Ctrl-C while idle).
    Detached,
    Unanswerable(String),
}

/// Follows one session.
pub struct Follower {
    pub conn: Conn,
    pub session_id: String,
    pub answerer: Answerer,
    pub out: Output,
    pub include_partial: bool,
    /// Whether a turn is running (decides what the first Ctrl-C does).
    pub running: bool,
    /// Set when the user interrupted, or when the session recorded an interrupt (from any
    /// client) after what is followed began: a turn that then ends unsuccessfully reads as
    /// interrupted, not failed.
    pub interrupted: bool,
    /// Keep following when the session is live again after a stop (attach).
    pub follow_respawns: bool,
}

struct Pending {
    event: Payload,
}

/// What the event stream yields (`None`: it ended).
type StreamItem = Option<Result<pb::SessionEvent, tonic::Status>>;

/// Who settled `request_id`, when `ev` is its resolution: `allowed by client:x`, ...
fn settled_by(ev: &pb::SessionEvent, request_id: &str) -> Option<String> {
    let (what, by) = match &ev.payload {
        Some(Payload::PermissionResolved(r)) if r.request_id == request_id => {
            (json::resolution_name(r.resolution), r.resolved_by.clone())
        }
        Some(Payload::QuestionAnswered(a)) if a.request_id == request_id => {
            (json::resolution_name(a.resolution), a.resolved_by.clone())
        }
        Some(Payload::HookResolved(h)) if h.request_id == request_id => {
            (json::resolution_name(h.resolution), h.resolved_by.clone())
        }
        Some(Payload::ToolCallResolved(t)) if t.request_id == request_id => {
            (json::resolution_name(t.resolution), t.resolved_by.clone())
        }
        Some(Payload::ElicitationResolved(e)) if e.request_id == request_id => (
            format!(
                "{} ({})",
                json::resolution_name(e.resolution),
                json::elicitation_action_name(e.action)
            ),
            e.resolved_by.clone(),
        ),
        Some(Payload::DialogResolved(d)) if d.request_id == request_id => (
            format!(
                "{} ({})",
                json::resolution_name(d.resolution),
                super::dialogs::behavior_name(d.behavior)
            ),
            d.resolved_by.clone(),
        ),
        _ => return None,
    };
    Some(if by.is_empty() {
        what
    } else {
        format!("{what} by {by}")
    })
}

/// Reads the stream while a prompt is open, keeping every item for later; resolves with
/// who settled `request_id` when its resolution arrives (never, once the stream ends).
async fn watch_settled(
    stream: &mut tonic::Streaming<pb::SessionEvent>,
    backlog: &mut VecDeque<StreamItem>,
    request_id: &str,
) -> String {
    loop {
        let item = stream.next().await;
        let who = match &item {
            Some(Ok(ev)) => settled_by(ev, request_id),
            _ => {
                backlog.push_back(item);
                return std::future::pending().await;
            }
        };
        backlog.push_back(item);
        if let Some(who) = who {
            return who;
        }
    }
}

/// Asks at the terminal (`ask`) while reading the stream on (into `backlog`): `Err(who)`
/// when someone else settled `request_id` first.
async fn race<T>(
    ask: impl Future<Output = Result<Asked<T>>>,
    stream: &mut tonic::Streaming<pb::SessionEvent>,
    backlog: &mut VecDeque<StreamItem>,
    request_id: &str,
) -> Result<std::result::Result<Asked<T>, String>> {
    tokio::select! {
        a = ask => Ok(Ok(a?)),
        who = watch_settled(stream, backlog, request_id) => Ok(Err(who)),
    }
}

impl Follower {
    /// Follow from `after_seq` until `until`.
    pub async fn follow(
        &mut self,
        after_seq: u64,
        until: Until,
        ctrlc: &mut CtrlC,
    ) -> Result<Outcome> {
        self.follow_opened(after_seq, None, until, ctrlc).await
    }

    /// Sends a message and follows the turn it starts. The subscription is opened before
    /// the message goes out (from the session's last event): a live session publishes the
    /// turn's first partial deltas within a millisecond of the send, and a subscription
    /// opened after the send would never see them (they are not stored, and were published
    /// before it began, so it is not told of them either).
    pub async fn send_and_follow(
        &mut self,
        message: pb::SendMessageRequest,
        ctrlc: &mut CtrlC,
    ) -> Result<Outcome> {
        let session = self.conn.session(&self.session_id).await?;
        let after = session.last_seq;
        let stream = self
            .conn
            .sessions
            .subscribe(self.subscribe_request(after))
            .await
            .map_err(|s| status_error("subscribe", s))?
            .into_inner();
        let sent = self
            .conn
            .sessions
            .send_message(message)
            .await
            .map_err(|s| status_error("send message", s))?
            .into_inner();
        self.running = true;
        self.interrupted = false;
        let until = Until::AnswerTo {
            seq: sent.seq,
            message_id: sent.message_id,
        };
        if sent.seq <= after {
            // A retry of a message stored before (`duplicate`): its turn is in the log
            // already, maybe over. Follow from the message itself, as it was the first time.
            drop(stream);
            return self
                .follow_opened(sent.seq.saturating_sub(1), None, until, ctrlc)
                .await;
        }
        // Everything after `after` is new (the message and its turn): the snapshot taken
        // before subscribing is where history ends, no second GetSession.
        self.follow_opened(after, Some((stream, session)), until, ctrlc)
            .await
    }

    fn subscribe_request(&self, after_seq: u64) -> pb::SubscribeRequest {
        pb::SubscribeRequest {
            session_id: self.session_id.clone(),
            after_seq,
            include_partial: self.include_partial,
            follow: true,
        }
    }

    /// [`Follower::follow`] on a subscription already `opened` from `after_seq`, if any,
    /// with the session as read just before it was opened.
    async fn follow_opened(
        &mut self,
        after_seq: u64,
        opened: Option<(tonic::Streaming<pb::SessionEvent>, pb::Session)>,
        mut until: Until,
        ctrlc: &mut CtrlC,
    ) -> Result<Outcome> {
        let mut after = after_seq;
        if let Output::Human(h) = &mut self.out {
            h.interactive = self.answerer.tty.is_some();
        }
        // Everything up to here is history: prompts in it are answered only once we know
        // they are still pending (their resolution would come before this seq).
        let (mut opened, session) = match opened {
            Some((stream, session)) => (Some(stream), session),
            None => (None, self.conn.session(&self.session_id).await?),
        };
        let caught_up_at = session.last_seq;
        let state = session.state;
        self.running |= is_running(state);
        let mut pending: Vec<Pending> = Vec::new();
        let mut answered: std::collections::HashSet<String> = Default::default();
        let mut ctrl_presses = 0u32;
        let mut retries = 0u32;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        // Events read while a prompt was open, shown and handled before reading on.
        let mut backlog: VecDeque<StreamItem> = VecDeque::new();
        loop {
            let sub = match opened.take() {
                Some(stream) => Ok(stream),
                None => self
                    .conn
                    .sessions
                    .subscribe(self.subscribe_request(after))
                    .await
                    .map(tonic::Response::into_inner),
            };
            let mut stream = match sub {
                Ok(s) => s,
                Err(s) if is_transient(&s) && retries < 30 => {
                    retries += 1;
                    self.out
                        .note(&format!("connection lost ({}); retrying…", s.message()));
                    backoff(retries).await;
                    continue;
                }
                Err(s) => return Err(status_error("subscribe", s)),
            };
            let broken: Option<tonic::Status> = loop {
                tokio::select! {
                    biased;
                    _ = ctrlc.pressed() => {
                        ctrl_presses += 1;
                        if let Some(o) = self.on_ctrl_c(ctrl_presses) {
                            return Ok(o);
                        }
                    }
                    msg = async {
                        match backlog.pop_front() {
                            Some(item) => item,
                            None => stream.next().await,
                        }
                    } => {
                        let ev = match msg {
                            Some(Ok(ev)) => ev,
                            Some(Err(s)) => break Some(s),
                            None => break None,
                        };
                        retries = 0;
                        if ev.seq > after {
                            after = ev.seq;
                        }
                        self.out.event(&ev);
                        let seq = ev.seq;
                        match ev.payload {
                            Some(
                                p @ (Payload::PermissionRequested(_)
                                | Payload::QuestionAsked(_)
                                | Payload::HookRequested(_)
                                | Payload::ToolCallRequested(_)
                                | Payload::ElicitationRequested(_)
                                | Payload::DialogRequested(_)),
                            ) => {
                                let id = request_id(&p);
                                if !answered.contains(&id) && !pending.iter().any(|x| request_id(&x.event) == id) {
                                    pending.push(Pending { event: p });
                                }
                            }
                            Some(Payload::PermissionResolved(r)) => {
                                pending.retain(|x| request_id(&x.event) != r.request_id);
                            }
                            Some(Payload::QuestionAnswered(a)) => {
                                pending.retain(|x| request_id(&x.event) != a.request_id);
                            }
                            Some(Payload::HookResolved(h)) => {
                                pending.retain(|x| request_id(&x.event) != h.request_id);
                            }
                            Some(Payload::ToolCallResolved(t)) => {
                                pending.retain(|x| request_id(&x.event) != t.request_id);
                            }
                            Some(Payload::ElicitationResolved(e)) => {
                                pending.retain(|x| request_id(&x.event) != e.request_id);
                            }
                            Some(Payload::DialogResolved(d)) => {
                                pending.retain(|x| request_id(&x.event) != d.request_id);
                            }
                            Some(Payload::UserMessage(m)) => {
                                if let Until::AnswerTo { seq: s, message_id } = &mut until
                                    && *s == seq
                                    && message_id.is_empty()
                                {
                                    message_id.clone_from(&m.message_id);
                                }
                            }
                            // Taken by the CLI, but its process ended mid-turn (a restart
                            // or a kill): no turn will answer it.
                            Some(Payload::EngineNotice(n))
                                if n.code == "message_unanswered"
                                    && matches!(&until, Until::AnswerTo { seq: s, .. }
                                        if serde_json::from_str::<serde_json::Value>(&n.data_json)
                                            .ok()
                                            .and_then(|d| d["seq"].as_u64())
                                            == Some(*s)) =>
                            {
                                return Ok(Outcome::Ended(
                                    "the message's turn was cut off (its CLI process ended \
                                     before answering); it stays in the conversation \
                                     unanswered"
                                        .to_owned(),
                                ));
                            }
                            Some(Payload::EngineNotice(n))
                                if n.code == "interrupted"
                                    && seq > caught_up_at
                                    && until.covers(seq) =>
                            {
                                self.interrupted = true;
                            }
                            // Withdrawn before the CLI answered it (an interrupt that
                            // cancelled the queued messages): no turn will list it.
                            Some(Payload::MessageLifecycle(m))
                                if m.state == "cancelled"
                                    && matches!(&until, Until::AnswerTo { message_id, .. } if *message_id == m.message_id) =>
                            {
                                return Ok(Outcome::Withdrawn(
                                    "the message was withdrawn by an interrupt before the CLI \
                                     answered it (cancelled)"
                                        .into(),
                                ));
                            }
                            Some(Payload::TurnCompleted(t)) if until.ends_at(seq, &t) => {
                                self.running = false;
                                return Ok(Outcome::Turn(t));
                            }
                            // Another live TurnCompleted (not the end of what is followed):
                            // a message queued behind that turn keeps the session running
                            // (no state change comes), or it goes idle, but its StateChanged
                            // comes after the result. Asked now: the daemon moves the state
                            // it reports before it publishes a result. (So a Ctrl-C after
                            // "done" detaches, and one in the queued turn interrupts.)
                            Some(Payload::TurnCompleted(_)) if seq > caught_up_at => {
                                if let Some(state) = self.state_now().await {
                                    self.running = is_running(state);
                                }
                            }
                            Some(Payload::StateChanged(s)) => {
                                let to = s.to;
                                self.running = is_running(to);
                                // A live stop/exit ends following (a replayed one does not),
                                // except for attach: a restarted daemon marks the session
                                // resumable, and it comes back on demand (as a suspended one
                                // does) or is respawned at start.
                                let resumable = to == pb::SessionState::Resumable as i32;
                                if seq > caught_up_at && until.covers(seq) && is_dead(to) && !(self.follow_respawns && (resumable || self.live_now().await)) {
                                    return Ok(Outcome::Ended(format!(
                                        "the session is {}{}",
                                        json::state_name(to),
                                        if s.reason.is_empty() { String::new() } else { format!(" ({})", s.reason) }
                                    )));
                                }
                            }
                            Some(Payload::ProcessExited(x))
                                if !matches!(until, Until::Forever)
                                    && seq > caught_up_at
                                    && until.covers(seq) =>
                            {
                                return Ok(Outcome::Ended(format!(
                                    "the CLI process exited: {}",
                                    super::render::exit_text(&x)
                                )));
                            }
                            _ => {}
                        }
                        if after >= caught_up_at && !pending.is_empty() {
                            let items = std::mem::take(&mut pending);
                            for p in items {
                                let id = request_id(&p.event);
                                answered.insert(id.clone());
                                // Settled elsewhere while an earlier prompt was open.
                                if backlog.iter().any(|i| matches!(i, Some(Ok(ev)) if settled_by(ev, &id).is_some())) {
                                    continue;
                                }
                                match self.answer(&p, ctrlc, &mut stream, &mut backlog).await? {
                                    None => {}
                                    Some(Outcome::Detached) => {
                                        // Ctrl-C at the prompt counts as a press.
                                        ctrl_presses += 1;
                                        if let Some(o) = self.on_ctrl_c(ctrl_presses) {
                                            return Ok(o);
                                        }
                                    }
                                    Some(o) => return Ok(o),
                                }
                            }
                        }
                    }
                    _ = tick.tick(), if self.out.spinning() => self.out.tick(),
                }
            };
            // The stream ended or broke: find out whether the session is still there.
            let why = broken
                .as_ref()
                .map(|s| s.message().to_owned())
                .unwrap_or_else(|| "stream ended".into());
            match self
                .conn
                .sessions
                .get_session(pb::GetSessionRequest {
                    session_id: self.session_id.clone(),
                })
                .await
            {
                Ok(s) => {
                    let s = s.into_inner();
                    if is_dead(s.state) && after >= s.last_seq {
                        return Ok(Outcome::Ended(format!(
                            "the session is {}",
                            json::state_name(s.state)
                        )));
                    }
                }
                Err(s) if s.code() == tonic::Code::NotFound => {
                    return Ok(Outcome::Ended("the session was deleted".into()));
                }
                Err(s) if is_transient(&s) => {}
                Err(s) => return Err(status_error("get session", s)),
            }
            if let Some(s) = &broken
                && !is_transient(s)
            {
                return Err(status_error("subscribe", s.clone()));
            }
            retries += 1;
            if retries > 30 {
                anyhow::bail!(
                    "lost the event stream of session {} ({why}); giving up",
                    self.session_id
                );
            }
            self.out.note(&format!(
                "event stream interrupted ({why}); resubscribing after seq {after}…"
            ));
            backoff(retries).await;
        }
    }

    /// Whether the session is live right now.
    async fn live_now(&mut self) -> bool {
        self.state_now().await.is_some_and(|s| !is_dead(s))
    }

    /// The session's state right now (`None`: it could not be read).
    async fn state_now(&mut self) -> Option<i32> {
        self.conn
            .sessions
            .get_session(pb::GetSessionRequest {
                session_id: self.session_id.clone(),
            })
            .await
            .ok()
            .map(|s| s.into_inner().state)
    }

    /// First press while a turn runs: send an interrupt (in the background, so that a
    /// second press detaches at once even when the daemon is slow to answer it). Any other
    /// press: detach.
    fn on_ctrl_c(&mut self, presses: u32) -> Option<Outcome> {
        if presses == 1 && self.running {
            self.out
                .note("interrupting the turn… (Ctrl-C again to detach; the session keeps running)");
            self.interrupted = true;
            let mut sessions = self.conn.sessions.clone();
            let session_id = self.session_id.clone();
            tokio::spawn(async move {
                if let Err(s) = sessions
                    .interrupt(pb::InterruptRequest {
                        session_id,
                        cancel_queued: false,
                    })
                    .await
                {
                    super::render::error_line(&format!("{:#}", status_error("interrupt", s)));
                }
            });
            None
        } else {
            self.out.clear();
            Some(Outcome::Detached)
        }
    }

    /// The outcome of an answer sent from the terminal, or `None` when the daemon refused
    /// it as malformed (e.g. free text where only the listed options are taken, content
    /// that is not an object): then the terminal says why and asks again.
    fn unless_refused(
        &mut self,
        r: Result<(), tonic::Status>,
    ) -> Option<Result<(), tonic::Status>> {
        match r {
            Err(s) if s.code() == tonic::Code::InvalidArgument && self.answerer.tty.is_some() => {
                if let Some(tty) = self.answerer.tty.as_mut() {
                    tty.say(&format!(
                        "  the daemon refused that answer: {}\n",
                        s.message()
                    ));
                }
                None
            }
            other => Some(other),
        }
    }

    /// The prompt for `request_id` was settled by someone else: say so where it was asked.
    fn settled_elsewhere(&mut self, who: &str) {
        if let Some(tty) = self.answerer.tty.as_mut() {
            let st = tty.style;
            tty.say(&format!(
                "\n  {}\n",
                st.yellow(&format!("answered elsewhere: {who}"))
            ));
        } else {
            self.out.note(&format!("answered elsewhere: {who}"));
        }
    }

    /// What asking at the terminal came to ([`race`]): the answer, or `Err` with how
    /// following goes on without one: `Err(None)` when someone else settled the prompt
    /// first (said here), `Err(Some(..))` when it cannot be answered here or Ctrl-C
    /// detaches. `on_ctrl_c`: the answer Ctrl-C gives instead of detaching.
    fn taken<T>(
        &mut self,
        raced: std::result::Result<Asked<T>, String>,
        on_ctrl_c: Option<T>,
    ) -> std::result::Result<T, Option<Outcome>> {
        match raced {
            Ok(Asked::Answer(a)) => Ok(a),
            Ok(Asked::Unanswerable(m)) => Err(Some(Outcome::Unanswerable(m))),
            Ok(Asked::CtrlC) => on_ctrl_c.ok_or(Some(Outcome::Detached)),
            Err(who) => {
                self.settled_elsewhere(&who);
                Err(None)
            }
        }
    }

    /// Answer one pending prompt; `Some(outcome)` ends following.
    /// While asking, the stream is read on (into `backlog`): when another client settles
    /// the prompt first, it is abandoned and that is said.
    async fn answer(
        &mut self,
        p: &Pending,
        ctrlc: &mut CtrlC,
        stream: &mut tonic::Streaming<pb::SessionEvent>,
        backlog: &mut VecDeque<StreamItem>,
    ) -> Result<Option<Outcome>> {
        self.out.before_prompt();
        let result = match &p.event {
            Payload::PermissionRequested(r) => {
                let asker = self.out.asker(&r.agent_id);
                let raced = race(
                    self.answerer.permission(r, asker.as_deref(), ctrlc),
                    stream,
                    backlog,
                    &r.request_id,
                )
                .await?;
                // Ctrl-C at a permission prompt denies it and interrupts the turn.
                let on_ctrl_c = PermissionAnswer::Deny {
                    message: "The user interrupted.".into(),
                    interrupt: true,
                };
                let decision = match self.taken(raced, Some(on_ctrl_c)) {
                    Ok(d) => d,
                    Err(end) => return Ok(end),
                };
                let interrupting = matches!(
                    decision,
                    PermissionAnswer::Deny {
                        interrupt: true,
                        ..
                    }
                );
                let decision = match decision {
                    PermissionAnswer::Allow { remember } => {
                        pb::respond_to_permission_request::Decision::Allow(pb::PermissionAllow {
                            remember,
                            ..Default::default()
                        })
                    }
                    PermissionAnswer::Deny { message, interrupt } => {
                        pb::respond_to_permission_request::Decision::Deny(pb::PermissionDeny {
                            message,
                            interrupt,
                        })
                    }
                };
                if interrupting {
                    self.interrupted = true;
                }
                self.conn
                    .sessions
                    .respond_to_permission(pb::RespondToPermissionRequest {
                        session_id: self.session_id.clone(),
                        request_id: r.request_id.clone(),
                        decision: Some(decision),
                    })
                    .await
                    .map(|_| ())
            }
            Payload::QuestionAsked(q) => loop {
                let raced = race(
                    self.answerer.question(q, ctrlc),
                    stream,
                    backlog,
                    &q.request_id,
                )
                .await?;
                let answers = match self.taken(raced, None) {
                    Ok(a) => a,
                    Err(end) => return Ok(end),
                };
                let r = self
                    .conn
                    .sessions
                    .answer_question(pb::AnswerQuestionRequest {
                        session_id: self.session_id.clone(),
                        request_id: q.request_id.clone(),
                        answers,
                    })
                    .await
                    .map(|_| ());
                if let Some(r) = self.unless_refused(r) {
                    break r;
                }
            },
            Payload::HookRequested(h) => {
                let asker = self.out.asker(&h.agent_id);
                let raced = race(
                    self.answerer.hook(h, asker.as_deref(), ctrlc),
                    stream,
                    backlog,
                    &h.request_id,
                )
                .await?;
                let (decision, reason) = match self.taken(raced, None) {
                    Ok(a) => a,
                    Err(end) => return Ok(end),
                };
                self.conn
                    .sessions
                    .respond_to_hook(pb::RespondToHookRequest {
                        session_id: self.session_id.clone(),
                        request_id: h.request_id.clone(),
                        decision: decision as i32,
                        reason,
                        ..Default::default()
                    })
                    .await
                    .map(|_| ())
            }
            Payload::ToolCallRequested(t) => {
                let raced = race(
                    self.answerer.tool_call(t, ctrlc),
                    stream,
                    backlog,
                    &t.request_id,
                )
                .await?;
                let (text, is_error) = match self.taken(raced, None) {
                    Ok(a) => a,
                    Err(end) => return Ok(end),
                };
                self.conn
                    .sessions
                    .respond_to_tool_call(pb::RespondToToolCallRequest {
                        session_id: self.session_id.clone(),
                        request_id: t.request_id.clone(),
                        content: vec![pb::ToolContent {
                            block: Some(pb::tool_content::Block::Text(text)),
                        }],
                        is_error,
                    })
                    .await
                    .map(|_| ())
            }
            Payload::ElicitationRequested(e) => loop {
                let raced = race(
                    self.answerer.elicitation(e, ctrlc),
                    stream,
                    backlog,
                    &e.request_id,
                )
                .await?;
                let (action, content_json) = match self.taken(raced, None) {
                    Ok(a) => a,
                    Err(end) => return Ok(end),
                };
                let r = self
                    .conn
                    .sessions
                    .respond_to_elicitation(pb::RespondToElicitationRequest {
                        session_id: self.session_id.clone(),
                        request_id: e.request_id.clone(),
                        action: action as i32,
                        content_json,
                    })
                    .await
                    .map(|_| ());
                if let Some(r) = self.unless_refused(r) {
                    break r;
                }
            },
            Payload::DialogRequested(d) => {
                let raced = race(
                    self.answerer.dialog(d, ctrlc),
                    stream,
                    backlog,
                    &d.request_id,
                )
                .await?;
                let (behavior, result_json) = match self.taken(raced, None) {
                    Ok(a) => a,
                    Err(end) => return Ok(end),
                };
                self.conn
                    .sessions
                    .respond_to_dialog(pb::RespondToDialogRequest {
                        session_id: self.session_id.clone(),
                        request_id: d.request_id.clone(),
                        behavior: behavior as i32,
                        result_json,
                    })
                    .await
                    .map(|_| ())
            }
            _ => Ok(()),
        };
        match result {
            Ok(()) => Ok(None),
            // Someone else answered first, or the CLI withdrew it: nothing to do.
            Err(s)
                if matches!(
                    s.code(),
                    tonic::Code::FailedPrecondition | tonic::Code::NotFound
                ) =>
            {
                self.out
                    .note(&format!("(already settled: {})", s.message()));
                Ok(None)
            }
            Err(s) => Err(status_error("answer", s)),
        }
    }
}

fn request_id(p: &Payload) -> String {
    match p {
        Payload::PermissionRequested(r) => r.request_id.clone(),
        Payload::QuestionAsked(q) => q.request_id.clone(),
        Payload::HookRequested(h) => h.request_id.clone(),
        Payload::ToolCallRequested(t) => t.request_id.clone(),
        Payload::ElicitationRequested(e) => e.request_id.clone(),
        Payload::DialogRequested(d) => d.request_id.clone(),
        _ => String::new(),
    }
}

/// A turn runs (or waits on a prompt): the first Ctrl-C interrupts it.
fn is_running(state: i32) -> bool {
    state == pb::SessionState::Running as i32
        || state == pb::SessionState::AwaitingPermission as i32
}

fn is_dead(state: i32) -> bool {
    state == pb::SessionState::Stopped as i32
        || state == pb::SessionState::Exited as i32
        || state == pb::SessionState::Resumable as i32
}

fn is_transient(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled
    )
}

/// Retry delay: 100 ms doubling to 2 s.
async fn backoff(attempt: u32) {
    let ms = (100u64 << attempt.min(5)).min(2000);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What ends following a message: events after it only. A suspension (or stop, or
    /// exit) recorded before the message, while the send was on its way, does not: the
    /// session comes back for the message.
    #[test]
    fn only_events_after_the_message_end_following_it() {
        let until = Until::AnswerTo {
            seq: 10,
            message_id: "m".into(),
        };
        assert!(!until.covers(9), "an exit before the message");
        assert!(!until.covers(10));
        assert!(until.covers(11), "an exit after the message");
        assert!(Until::TurnAfter(3).covers(4) && !Until::TurnAfter(3).covers(3));
        assert!(Until::Forever.covers(1));
        let answer = pb::TurnCompleted {
            user_message_ids: vec!["m".into()],
            ..Default::default()
        };
        let other = pb::TurnCompleted {
            user_message_ids: vec!["x".into()],
            ..Default::default()
        };
        assert!(until.ends_at(12, &answer) && !until.ends_at(9, &answer));
        assert!(!until.ends_at(12, &other), "another message's turn");
    }

    /// The permission prompt learns who asks from the renderer's labels: the label a
    /// sub-agent's lines stand under, its id when unseen (or in JSON mode), nobody for the
    /// main agent.
    #[test]
    fn the_prompt_names_the_subagent_as_the_renderer_does() {
        let mut out = Output::Human(Human::new(false, false));
        out.event(&pb::SessionEvent {
            payload: Some(Payload::AssistantBlock(pb::AssistantBlock {
                block: Some(pb::assistant_block::Block::Other(pb::OtherBlock::default())),
                agent_id: "task-1".into(),
                subagent_type: "general-purpose".into(),
                task_description: "Create sub.txt".into(),
                ..Default::default()
            })),
            ..Default::default()
        });
        assert_eq!(
            out.asker("task-1").as_deref(),
            Some("general-purpose · Create sub.txt")
        );
        assert_eq!(out.asker("task-2").as_deref(), Some("sub-agent task-2"));
        assert_eq!(out.asker(""), None);
        assert_eq!(
            Output::Json.asker("task-1").as_deref(),
            Some("sub-agent task-1")
        );
    }
}
