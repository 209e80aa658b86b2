//! The smaller client commands: `sessions`, `show`, `attach`, `send`, `interrupt`, `stop`,
//! `resume`, `delete`, `health`.

use std::time::Instant;

use anyhow::{Context as _, Result};
use ostler_proto::v1 as pb;
use serde_json::json;
use tokio_stream::StreamExt as _;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;

use super::follow::{Follower, Outcome, Output, Until};
use super::ids::{self, SessionArg};
use super::prompt::{AnswerArgs, Answerer, CtrlC};
use super::render::{Human, Style, age, clip, json_line};
use super::run::{parse_label, read_prompt};
use super::{Conn, ConnectArgs, EXIT_FAILED, connect, json, status_error};

/// Connect and resolve the session argument to a full id.
pub(crate) async fn connect_to_session(c: &ConnectArgs, raw: &str) -> Result<(Conn, String)> {
    let mut conn = connect(c).await?;
    let id = ids::resolve(&mut conn.sessions, raw).await?;
    Ok((conn, id))
}

#[derive(Debug, Clone, clap::Args)]
pub struct IdArgs {
    #[command(flatten)]
    pub session: SessionArg,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct InterruptArgs {
    #[command(flatten)]
    pub id: IdArgs,
    /// Also withdraw the messages queued behind the turn (sent while it ran): they get
    /// no answer. Needs a release that can (capability interrupt_cancel_queued_v1 in
    /// `ostler health --json`; others refuse at once)
    #[arg(long, help_heading = "Options")]
    pub cancel_queued: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct SessionsArgs {
    /// Only sessions in these states (comma-separated: starting, idle, running,
    /// awaiting_permission, stopped, exited, resumable, suspended)
    #[arg(long, value_delimiter = ',', value_parser = parse_state)]
    pub state: Vec<pb::SessionState>,
    /// Only sessions with this label (repeatable)
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// At most this many sessions, the newest (default: all)
    #[arg(long, short = 'n')]
    pub limit: Option<usize>,
    /// Only archived sessions (by default they are hidden)
    #[arg(long, conflicts_with = "all")]
    pub archived: bool,
    /// Archived sessions too
    #[arg(long)]
    pub all: bool,
    /// Print one JSON object per session
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ShowArgs {
    #[command(flatten)]
    pub session: SessionArg,
    /// Also print the stored event log
    #[arg(long)]
    pub events: bool,
    /// Print JSON (the session object; with --events, then one event per line)
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct AttachArgs {
    #[command(flatten)]
    pub session: SessionArg,
    /// Replay stored events after this seq first (default: the whole history)
    #[arg(long, value_name = "N")]
    pub after_seq: Option<u64>,
    /// Exit after the next turn completes: the first one after --after-seq when given,
    /// else the first one that is not stored yet
    #[arg(long)]
    pub until_turn: bool,
    /// Show system notices and state changes
    #[arg(long, short)]
    pub verbose: bool,
    /// Print events as JSON lines
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub answers: AnswerArgs,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "Examples:
  ostler send 3f2a \"now add a test\"                 stream the turn it starts
  ostler send --last \"and the docs\"                 to the newest session
  ostler send 3f2a --now \"stop, the build is red\"   stop the turn under way, run this
  ostler send 3f2a --context-only < notes.md         add context, no model call
  ostler send 3f2a --verbatim \"/deploy @prod\"       as written: no slash command, no @file
  ostler send 3f2a \"why does this fail?\" --paste @build.log   the log, marked as pasted

--now, --later, --verbatim, --context-only and --paste need a Claude Code release that honours
them (see `ostler health --json` capabilities input:*); others refuse the message.")]
pub struct SendArgs {
    /// Session id, a unique suffix or prefix of one, or @last (the newest session)
    #[arg(value_name = "ID", required_unless_present = "last")]
    pub id: Option<String>,
    /// The message; read from stdin when absent or `-`
    pub text: Option<String>,
    /// Send to the newest session (then the first argument is the message)
    #[arg(long)]
    pub last: bool,
    /// Return once the message is recorded instead of streaming the turn
    #[arg(long)]
    pub no_wait: bool,
    /// Idempotency key: a retried send with the same id is delivered once
    #[arg(long, value_name = "ID")]
    pub message_id: Option<String>,
    /// Stop the turn under way and run this message at once
    #[arg(long, conflicts_with_all = ["later", "context_only"])]
    pub now: bool,
    /// Run after messages sent with the default priority, even ones sent after it
    #[arg(long)]
    pub later: bool,
    /// Send the text as written: no @file expansion, no slash command
    #[arg(long)]
    pub verbatim: bool,
    /// Add the message to the conversation without a model call (the next turn carries it)
    #[arg(long)]
    pub context_only: bool,
    /// Text pasted rather than typed, added after the message and marked as pasted
    /// (repeatable; `@FILE` reads a file, `-` stdin)
    #[arg(long, value_name = "TEXT|@FILE|-")]
    pub paste: Vec<String>,
    /// Show system notices and state changes
    #[arg(long, short)]
    pub verbose: bool,
    /// Print events as JSON lines
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub answers: AnswerArgs,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ResumeArgs {
    #[command(flatten)]
    pub session: SessionArg,
    /// Continue this session in a branch of its CLI conversation (--fork-session): the
    /// conversation so far stays as it was; the session goes on in the copy. For a new
    /// session branching from this one, use `ostler run --fork-from ID`
    #[arg(long)]
    pub fork: bool,
    /// If the CLI's transcript of the conversation is gone, continue in a fresh CLI
    /// conversation (the model's earlier context is lost) instead of failing
    #[arg(long)]
    pub fresh_if_missing: bool,
    /// Resume the conversation as it was after this message (an assistant block's
    /// `message_id` from `ostler show ID --events --json`): later messages leave the model's context
    #[arg(long, value_name = "MESSAGE_ID")]
    pub at: Option<String>,
    /// With --at: guard the cut (--resume-drops-turn, Claude Code 2.1.330+): the
    /// `message_id` of the user message starting the one turn the cut means to drop; the
    /// resume is refused when anything else (a message absorbed mid-turn, another turn)
    /// lies past the cut
    #[arg(long, value_name = "MESSAGE_ID", requires = "at")]
    pub drops_turn: Option<String>,
    /// Print the session as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct HealthArgs {
    /// The service to check with the standard health protocol ("" = the whole daemon)
    #[arg(long, default_value = "")]
    pub service: String,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

pub fn parse_state(s: &str) -> Result<pb::SessionState, String> {
    let up = format!(
        "SESSION_STATE_{}",
        s.trim().to_ascii_uppercase().replace('-', "_")
    );
    match pb::SessionState::from_str_name(&up) {
        Some(pb::SessionState::Unspecified) | None => Err(format!("unknown session state {s:?}")),
        Some(st) => Ok(st),
    }
}

/// `ostler sessions`
pub async fn sessions(a: SessionsArgs) -> Result<i32> {
    let mut conn = connect(&a.connect).await?;
    // Newest first; the daemon's order is not relied on, so all pages are read.
    let archived = match (a.archived, a.all) {
        (true, _) => Some(true),
        (false, true) => None,
        (false, false) => Some(false),
    };
    let mut all = ids::list_all(&mut conn.sessions, &a.state, &a.labels, archived).await?;
    if let Some(l) = a.limit {
        all.truncate(l);
    }
    if a.json {
        for s in &all {
            json_line(&json::session(s));
        }
        return Ok(0);
    }
    if all.is_empty() {
        errln!("no sessions");
        return Ok(0);
    }
    let st = Style::stdout();
    let rows: Vec<[String; 8]> = all
        .iter()
        .map(|s| {
            let u = s.usage.unwrap_or_default();
            [
                s.id.clone(),
                json::state_name(s.state)
                    + &if s.pending_interactions > 0 {
                        format!(" ({}?)", s.pending_interactions)
                    } else {
                        String::new()
                    },
                age(s.updated_at_ms),
                s.turns.to_string(),
                format!(
                    "{}/{}",
                    super::render::tokens(
                        u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
                    ),
                    super::render::tokens(u.output_tokens)
                ),
                format!("${:.4}", s.total_cost_usd),
                super::watch::title_cell(s),
                clip(&s.cwd, 50),
            ]
        })
        .collect();
    let head = [
        "ID", "STATE", "ACTIVE", "TURNS", "TOKENS", "COST", "TITLE", "CWD",
    ];
    let (head_line, lines) = table(&head, &rows);
    outln!("{}", st.bold(&head_line));
    for (line, s) in lines.into_iter().zip(&all) {
        let line = match pb::SessionState::try_from(s.state) {
            Ok(pb::SessionState::Running) => st.green(&line),
            Ok(pb::SessionState::AwaitingPermission) => st.yellow(&line),
            Ok(pb::SessionState::Exited) => st.red(&line),
            Ok(
                pb::SessionState::Stopped
                | pb::SessionState::Resumable
                | pb::SessionState::Suspended,
            ) => st.dim(&line),
            _ => line,
        };
        outln!("{line}");
    }
    Ok(0)
}

/// A plain-text table: every column but the last padded to its widest cell, two spaces
/// between columns. Returns the heading line and one line per row.
pub(crate) fn table<R: AsRef<[String]>>(head: &[&str], rows: &[R]) -> (String, Vec<String>) {
    let mut widths: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.as_ref().iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(c.chars().count());
            }
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>, n: usize| {
        cells
            .enumerate()
            .map(|(i, c)| {
                if i + 1 == n {
                    c.to_owned()
                } else {
                    format!("{c:<w$}", w = widths.get(i).copied().unwrap_or(0))
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    let head_line = line(&mut head.iter().copied(), head.len());
    let lines = rows
        .iter()
        .map(|r| line(&mut r.as_ref().iter().map(String::as_str), r.as_ref().len()))
        .collect();
    (head_line, lines)
}

fn print_session(s: &pb::Session) {
    let st = Style::stdout();
    let u = s.usage.unwrap_or_default();
    let mut rows: Vec<(&str, String)> = vec![("id", s.id.clone())];
    if !s.title.is_empty() {
        rows.push(("title", s.title.clone()));
    }
    rows.extend([
        ("state", json::state_name(s.state)),
        ("cwd", s.cwd.clone()),
        (
            "model",
            if s.model.is_empty() {
                "(default)".into()
            } else {
                s.model.clone()
            },
        ),
        ("permission mode", json::mode_name(s.permission_mode)),
        ("cli session", s.cli_session_id.clone()),
        ("cli version", s.cli_version.clone()),
        ("created", format!("{} ago", age(s.created_at_ms))),
        ("updated", format!("{} ago", age(s.updated_at_ms))),
        ("last seq", s.last_seq.to_string()),
        ("pending", s.pending_interactions.to_string()),
        ("turns", s.turns.to_string()),
        (
            "tokens",
            format!(
                "{} in, {} out, {} cache read, {} cache write",
                u.input_tokens,
                u.output_tokens,
                u.cache_read_input_tokens,
                u.cache_creation_input_tokens
            ),
        ),
        ("cost", format!("${:.4}", s.total_cost_usd)),
    ]);
    for (k, v) in rows {
        outln!("{} {v}", st.dim(&format!("{k:>15}:")));
    }
    if !s.labels.is_empty() {
        let mut l: Vec<_> = s.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        l.sort();
        outln!("{} {}", st.dim(&format!("{:>15}:", "labels")), l.join(", "));
    }
    if let Some(x) = &s.last_exit {
        outln!(
            "{} {}",
            st.dim(&format!("{:>15}:", "last exit")),
            super::render::exit_text(x)
        );
    }
}

/// `ostler show ID`
pub async fn show(a: ShowArgs) -> Result<i32> {
    let (mut conn, id) = connect_to_session(&a.connect, a.session.raw()).await?;
    let s = conn.session(&id).await?;
    if a.json {
        json_line(&json::session(&s));
    } else {
        print_session(&s);
    }
    if a.events {
        let mut stream = conn
            .sessions
            .subscribe(pb::SubscribeRequest {
                session_id: id.clone(),
                after_seq: 0,
                include_partial: false,
                follow: false,
            })
            .await
            .map_err(|s| status_error("subscribe", s))?
            .into_inner();
        // The whole log on stdout (notices included), one summary line per turn.
        let mut human = Human::new(false, true);
        human.all_on_stdout();
        human.turn_summaries = true;
        if !a.json {
            outln!();
        }
        while let Some(ev) = stream.next().await {
            let ev = ev.map_err(|s| status_error("reading events", s))?;
            if a.json {
                json_line(&json::event(&ev));
            } else {
                human.event(&ev);
            }
        }
    }
    Ok(0)
}

/// `ostler attach ID`
pub async fn attach(a: AttachArgs) -> Result<i32> {
    let answerer = Answerer::new(a.answers.clone())?;
    let (conn, id) = connect_to_session(&a.connect, a.session.raw()).await?;
    let mut ctrlc = CtrlC::install()?;
    let started = Instant::now();
    let out = if a.json {
        Output::Json
    } else {
        let mut h = Human::new(true, a.verbose);
        // attach follows many turns: each one gets its summary line.
        h.turn_summaries = !a.until_turn;
        Output::Human(h)
    };
    if !a.json {
        errln!(
            "{}",
            Style::stderr().dim(&format!(
                "attached to {} (Ctrl-C interrupts a running turn, twice detaches)",
                id
            ))
        );
    }
    let mut f = Follower {
        conn,
        session_id: id.clone(),
        answerer,
        out,
        include_partial: !a.json,
        running: false,
        interrupted: false,
        follow_respawns: true,
    };
    let until = match (a.until_turn, a.after_seq) {
        (false, _) => Until::Forever,
        (true, Some(n)) => Until::TurnAfter(n),
        (true, None) => {
            // The next turn to complete after what is stored now.
            let s = f.conn.session(&id).await?;
            Until::TurnAfter(s.last_seq)
        }
    };
    let outcome = f
        .follow(a.after_seq.unwrap_or(0), until, &mut ctrlc)
        .await?;
    match outcome {
        Outcome::Ended(why) if !a.until_turn => {
            if !a.json {
                let st = Style::stderr();
                eprintln!("{}", super::render::terminal_text(&st.dim(&why)));
            }
            Ok(0)
        }
        other => Ok(super::run::finish(&mut f, &id, other, started, a.json)),
    }
}

/// `--paste` values: the text itself, `@FILE` a file's text, `-` stdin (once).
fn pastes(args: &[String]) -> Result<Vec<String>> {
    use std::io::Read as _;
    if args.iter().filter(|p| *p == "-").count() > 1 {
        anyhow::bail!("--paste -: stdin can be read once");
    }
    args.iter()
        .map(|p| {
            if p == "-" {
                let mut s = String::new();
                std::io::stdin()
                    .read_to_string(&mut s)
                    .context("--paste -: reading stdin")?;
                Ok(s)
            } else if let Some(f) = p.strip_prefix('@') {
                std::fs::read_to_string(f).with_context(|| format!("--paste @{f}: cannot read it"))
            } else {
                Ok(p.clone())
            }
        })
        .collect()
}

/// `ostler send ID TEXT`
pub async fn send(a: SendArgs) -> Result<i32> {
    // With --last the first argument is the message.
    let (raw, text) = if a.last {
        if a.text.is_some() {
            anyhow::bail!("--last takes the message as its only argument (no session id)");
        }
        (ids::LAST.to_owned(), a.id.clone())
    } else {
        (a.id.clone().unwrap_or_default(), a.text.clone())
    };
    if a.paste.iter().any(|p| p == "-") && text.as_deref().is_none_or(|t| t == "-") {
        anyhow::bail!(
            "stdin can give the message or a --paste, not both: pass the message as an argument"
        );
    }
    let text = read_prompt(text.as_deref())?;
    let answerer = Answerer::new(a.answers.clone())?;
    let (mut conn, id) = connect_to_session(&a.connect, &raw).await?;
    let mut ctrlc = CtrlC::install()?;
    let started = Instant::now();
    let message = pb::SendMessageRequest {
        session_id: id.clone(),
        content: Some(pb::MessageContent {
            content: Some(pb::message_content::Content::Text(text)),
        }),
        client_message_id: a
            .message_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
        priority: if a.now {
            pb::MessagePriority::Now
        } else if a.later {
            pb::MessagePriority::Later
        } else {
            pb::MessagePriority::Unspecified
        } as i32,
        verbatim: a.verbatim,
        context_only: a.context_only,
        pasted: pastes(&a.paste)?,
    };
    if a.no_wait {
        let sent = conn
            .sessions
            .send_message(message)
            .await
            .map_err(|s| status_error("send message", s))?
            .into_inner();
        if a.json {
            json_line(&json!({
                "seq": sent.seq,
                "duplicate": sent.duplicate,
                "message_id": sent.message_id,
            }));
        } else {
            outln!(
                "sent (seq {}{})",
                sent.seq,
                if sent.duplicate { ", duplicate" } else { "" }
            );
        }
        return Ok(0);
    }
    let out = if a.json {
        Output::Json
    } else {
        Output::Human(Human::new(true, a.verbose))
    };
    let mut f = Follower {
        conn,
        session_id: id.clone(),
        answerer,
        out,
        include_partial: !a.json,
        running: true,
        interrupted: false,
        follow_respawns: false,
    };
    // The turn our message starts ends with the next TurnCompleted after it.
    let outcome = f.send_and_follow(message, &mut ctrlc).await?;
    Ok(super::run::finish(&mut f, &id, outcome, started, a.json))
}

/// `ostler interrupt ID [--cancel-queued]`: interrupts a running turn; on an idle session
/// there is nothing to interrupt, and it says so (exit 0, nothing sent).
pub async fn interrupt(args: InterruptArgs) -> Result<i32> {
    let a = args.id;
    let (mut conn, id) = connect_to_session(&a.connect, a.session.raw()).await?;
    let s = conn.session(&id).await?;
    let state = pb::SessionState::try_from(s.state).unwrap_or(pb::SessionState::Unspecified);
    let busy = matches!(
        state,
        pb::SessionState::Running | pb::SessionState::AwaitingPermission
    );
    let (mut cancelled, mut still_queued) = (Vec::new(), Vec::new());
    if busy {
        let r = conn
            .sessions
            .interrupt(pb::InterruptRequest {
                session_id: id.clone(),
                cancel_queued: args.cancel_queued,
            })
            .await
            .map_err(|s| status_error("interrupt", s))?
            .into_inner();
        (cancelled, still_queued) = (r.cancelled, r.still_queued);
    }
    let state_name = json::state_name(s.state);
    if a.json {
        json_line(
            &json!({"session_id": id, "interrupted": busy, "state": state_name,
                          "cancelled": cancelled, "still_queued": still_queued}),
        );
    } else if busy {
        outln!(
            "interrupt sent to {id}: its {state_name} turn stops (`ostler attach {id}` shows the end)"
        );
        if !cancelled.is_empty() {
            outln!(
                "withdrawn, unanswered: {} queued message(s): {}",
                cancelled.len(),
                cancelled.join(", ")
            );
        }
        if !still_queued.is_empty() {
            outln!(
                "still to run: {} queued message(s) (`ostler interrupt --cancel-queued` \
                 withdraws them): {}",
                still_queued.len(),
                still_queued.join(", ")
            );
        }
    } else {
        outln!("nothing to interrupt: session {id} is {state_name}, no turn is running");
    }
    Ok(0)
}

/// `ostler stop ID`
/// `stop` / `resume` of a session already in the state asked for: the session with
/// `done: false` (`--json`), else `text`; exit 0.
fn nothing_to_do(json_out: bool, now: &pb::Session, done: &str, text: &str) -> i32 {
    if json_out {
        let mut v = json::session(now);
        v[done] = json!(false);
        json_line(&v);
    } else {
        outln!("{text}");
    }
    0
}

/// `ostler stop ID`: on a session that is already stopped or exited, nothing is done and it
/// says so (exit 0), as `resume` does for a live one: a script can stop without asking first.
pub async fn stop(a: IdArgs) -> Result<i32> {
    let (mut conn, id) = connect_to_session(&a.connect, a.session.raw()).await?;
    let r = conn
        .sessions
        .stop_session(pb::StopSessionRequest {
            session_id: id.clone(),
        })
        .await;
    let s = match r {
        Ok(s) => s.into_inner(),
        Err(st) if st.code() == tonic::Code::FailedPrecondition => {
            let now = conn.session(&id).await?;
            let ended = matches!(
                pb::SessionState::try_from(now.state),
                Ok(pb::SessionState::Stopped | pb::SessionState::Exited)
            );
            if !ended {
                return Err(status_error("stop session", st));
            }
            let text = format!(
                "nothing to stop: session {id} is already {}",
                json::state_name(now.state)
            );
            return Ok(nothing_to_do(a.json, &now, "stopped", &text));
        }
        Err(st) => return Err(status_error("stop session", st)),
    };
    if a.json {
        let mut v = json::session(&s);
        v["stopped"] = json!(true);
        json_line(&v);
    } else {
        outln!("{} is {}", s.id, json::state_name(s.state));
    }
    Ok(0)
}

/// `ostler resume ID [--fork]`: on a session that is already live, nothing is respawned and
/// it says so (exit 0).
pub async fn resume(a: ResumeArgs) -> Result<i32> {
    let (mut conn, id) = connect_to_session(&a.connect, a.session.raw()).await?;
    let r = conn
        .sessions
        .resume_session(pb::ResumeSessionRequest {
            session_id: id.clone(),
            fork: a.fork,
            fresh_conversation_if_missing: a.fresh_if_missing,
            at_message_id: a.at.clone().unwrap_or_default(),
            drops_turn_message_id: a.drops_turn.clone().unwrap_or_default(),
        })
        .await;
    let s = match r {
        Ok(s) => s.into_inner(),
        Err(st) if st.code() == tonic::Code::FailedPrecondition => {
            // Already live? Then there is nothing to resume; anything else is an error.
            let now = conn.session(&id).await?;
            let live = matches!(
                pb::SessionState::try_from(now.state),
                Ok(pb::SessionState::Idle
                    | pb::SessionState::Running
                    | pb::SessionState::AwaitingPermission
                    | pb::SessionState::Starting)
            );
            if !live || a.fork {
                return Err(status_error("resume session", st));
            }
            let text = format!(
                "nothing to resume: session {id} is live ({}); its CLI process is running \
                 — `ostler send {id} …` or `ostler attach {id}`",
                json::state_name(now.state)
            );
            return Ok(nothing_to_do(a.json, &now, "resumed", &text));
        }
        Err(st) => return Err(status_error("resume session", st)),
    };
    if a.json {
        let mut v = json::session(&s);
        v["resumed"] = json!(true);
        json_line(&v);
    } else if a.fork {
        outln!(
            "resumed {} in a branch of its conversation: what came before stays as it was \
             ({})",
            s.id,
            json::state_name(s.state)
        );
    } else {
        outln!(
            "resumed {}: a new CLI process continues the conversation ({})",
            s.id,
            json::state_name(s.state)
        );
    }
    Ok(0)
}

/// `ostler delete ID`
pub async fn delete(a: IdArgs) -> Result<i32> {
    let (mut conn, id) = connect_to_session(&a.connect, a.session.raw()).await?;
    conn.sessions
        .delete_session(pb::DeleteSessionRequest {
            session_id: id.clone(),
        })
        .await
        .map_err(|s| status_error("delete session", s))?;
    if a.json {
        json_line(&json!({"session_id": id, "deleted": true}));
    } else {
        outln!("deleted {id}");
    }
    Ok(0)
}

/// `ostler health`: exit 0 when SERVING.
pub async fn health(a: HealthArgs) -> Result<i32> {
    // With --json a monitor reads stdout: an unreachable daemon is a JSON line there too
    // (status UNREACHABLE, exit 1), not only a message on stderr.
    let failed_json = |addr: String, status: &str, e: &anyhow::Error| {
        json_line(&json!({
            "addr": addr, "status": status, "serving": false, "error": format!("{e:#}"),
        }));
        Ok(EXIT_FAILED)
    };
    let mut conn = match connect(&a.connect).await {
        Ok(c) => c,
        Err(e) if a.json => {
            let addr = super::config::resolve(&a.connect)
                .map(|t| t.endpoint.to_string())
                .unwrap_or_default();
            return failed_json(addr, "UNREACHABLE", &e);
        }
        Err(e) => return Err(e),
    };
    let checked = conn
        .health
        .check(HealthCheckRequest {
            service: a.service.clone(),
        })
        .await;
    let status = match checked {
        Ok(r) => r.into_inner().status(),
        Err(s) => {
            // e.g. NOT_FOUND for a service name the daemon does not report.
            let code = super::code_name(s.code());
            let e = status_error("health check", s);
            if a.json {
                return failed_json(conn.addr.clone(), code, &e);
            }
            return Err(e);
        }
    };
    let serving = status == ServingStatus::Serving;
    let status_name = status.as_str_name();
    // Details need the token; health itself does not.
    let details = conn
        .daemon
        .get_health_details(pb::GetHealthDetailsRequest {})
        .await
        .map(|r| r.into_inner());
    if a.json {
        let mut v = json!({"addr": conn.addr, "status": status_name, "serving": serving});
        match &details {
            Ok(d) => {
                let c = d.sessions.unwrap_or_default();
                let store = d.store.clone().unwrap_or_default();
                let cc = d.claude_code.clone().unwrap_or_default();
                v["details"] = json!({
                    "daemon_version": d.daemon_version,
                    "uptime_ms": d.uptime_ms,
                    "store": {"ok": store.ok, "path": store.path, "message": store.message},
                    "sessions": {
                        "total": c.total, "starting": c.starting, "idle": c.idle, "running": c.running,
                        "awaiting_permission": c.awaiting_permission, "stopped": c.stopped,
                        "exited": c.exited, "resumable": c.resumable, "suspended": c.suspended, "live": c.live, "max_live": c.max_live,
                    },
                    "pending_interactions": d.pending_interactions,
                    "shutting_down": d.shutting_down,
                    "claude_code": {
                        "version": cc.version, "api_version": cc.api_version,
                        "level": compat_name(cc.level), "message": cc.message,
                        "binary_path": cc.binary_path, "capabilities": cc.capabilities,
                    },
                });
            }
            Err(s) => {
                v["details_error"] =
                    json!(format!("{}: {}", super::code_name(s.code()), s.message()))
            }
        }
        json_line(&v);
    } else {
        let st = Style::stdout();
        let head = if serving {
            st.green(status_name)
        } else {
            st.red(status_name)
        };
        outln!("{head} {}", st.dim(&conn.addr));
        match &details {
            Ok(d) => {
                let c = d.sessions.unwrap_or_default();
                let store = d.store.clone().unwrap_or_default();
                let cc = d.claude_code.clone().unwrap_or_default();
                outln!("  ostler {} · up {}s", d.daemon_version, d.uptime_ms / 1000);
                outln!(
                    "  store {} {}{}",
                    if store.ok {
                        st.green("ok")
                    } else {
                        st.red("failing")
                    },
                    store.path,
                    if store.message.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", store.message)
                    }
                );
                outln!(
                    "  sessions {} total · {} live{} · {} running · {} waiting · {} idle · {} suspended · {} waiting for a client",
                    c.total,
                    c.live,
                    if c.max_live > 0 {
                        format!("/{}", c.max_live)
                    } else {
                        String::new()
                    },
                    c.running,
                    c.awaiting_permission,
                    c.idle,
                    c.suspended,
                    d.pending_interactions
                );
                outln!(
                    "  claude {} ({}) {}",
                    cc.version,
                    compat_name(cc.level),
                    st.dim(&cc.binary_path)
                );
                if !cc.message.is_empty() {
                    outln!("  {}", st.dim(&cc.message));
                }
                if d.shutting_down {
                    outln!("  {}", st.yellow("shutting down"));
                }
            }
            Err(s) => outln!(
                "  {}",
                st.dim(&format!(
                    "(no details: {}: {})",
                    super::code_name(s.code()),
                    s.message()
                ))
            ),
        }
    }
    if !serving {
        return Ok(EXIT_FAILED);
    }
    Ok(0)
}

fn compat_name(v: i32) -> String {
    match pb::CompatibilityLevel::try_from(v) {
        Ok(l) => l
            .as_str_name()
            .trim_start_matches("COMPATIBILITY_LEVEL_")
            .to_ascii_lowercase(),
        Err(_) => format!("unknown({v})"),
    }
}
