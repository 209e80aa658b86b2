//! `ostler run`: create a session, send the prompt, stream the turn, print a summary.

use std::io::{IsTerminal as _, Read as _};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context as _, Result, bail};
use ostler_proto::v1 as pb;
use serde_json::json;

use super::follow::{Follower, Outcome, Output, Until};
use super::prompt::{AnswerArgs, Answerer, CtrlC};
use super::render::{Human, Style, json_line, summary};
use super::{
    ConnectArgs, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_UNANSWERABLE, connect, json, status_error,
};

#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The prompt; read from stdin when `-`, or when absent and stdin is not a terminal.
    /// Absent on a terminal: a chat (prompts one after another, single-key approvals)
    #[arg(value_name = "PROMPT")]
    pub prompt: Option<String>,
    /// Working directory of the session (default: the current directory)
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// Model name or alias (default: the CLI's default)
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,
    /// Permission mode: default, acceptEdits, plan or bypassPermissions
    #[arg(long, value_name = "MODE", value_parser = parse_mode)]
    pub permission_mode: Option<pb::PermissionMode>,
    /// Label the session (repeatable)
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Name the session (shown by `sessions` and `watch`; default: the first prompt)
    #[arg(long, value_name = "TITLE")]
    pub name: Option<String>,
    /// Stop the model after this many turns
    #[arg(long, value_name = "N")]
    pub max_turns: Option<u32>,
    /// Extra system prompt text
    #[arg(long, value_name = "TEXT")]
    pub append_system_prompt: Option<String>,
    /// Stop the session's CLI process after the turn (it stays resumable)
    #[arg(long)]
    pub stop: bool,
    #[command(flatten)]
    pub session_options: super::session_opts::SessionOptionArgs,
    /// Show system notices and state changes
    #[arg(long, short)]
    pub verbose: bool,
    /// Print events as JSON lines (and a final `run_summary` line)
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub answers: AnswerArgs,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// `default`, `acceptEdits`/`accept-edits`/`accept_edits`, `plan`, `bypassPermissions`.
pub fn parse_mode(s: &str) -> Result<pb::PermissionMode, String> {
    let k: String = s
        .chars()
        .filter(|c| *c != '-' && *c != '_')
        .collect::<String>()
        .to_ascii_lowercase();
    match k.as_str() {
        "default" => Ok(pb::PermissionMode::Default),
        "acceptedits" => Ok(pb::PermissionMode::AcceptEdits),
        "plan" => Ok(pb::PermissionMode::Plan),
        "bypasspermissions" | "bypass" => Ok(pb::PermissionMode::BypassPermissions),
        _ => Err(format!(
            "unknown permission mode {s:?} (default, acceptEdits, plan, bypassPermissions)"
        )),
    }
}

pub fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_owned(), v.to_owned())),
        _ => Err(format!("label {s:?}: expected KEY=VALUE")),
    }
}

/// The prompt from the argument or stdin.
pub fn read_prompt(arg: Option<&str>) -> Result<String> {
    let text = match arg {
        Some(p) if p != "-" => p.to_owned(),
        _ => {
            if std::io::stdin().is_terminal() {
                bail!("no prompt: pass it as an argument or pipe it on stdin");
            }
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading the prompt from stdin")?;
            s
        }
    };
    if text.trim().is_empty() {
        usage!("the prompt is empty");
    }
    Ok(text)
}

pub async fn run(args: RunArgs) -> Result<i32> {
    if args.prompt.is_none() && std::io::stdin().is_terminal() && !args.answers.no_input {
        return chat(args).await;
    }
    let prompt = read_prompt(args.prompt.as_deref())?;
    let cwd = match &args.cwd {
        Some(d) => d.clone(),
        None => std::env::current_dir().context("current directory")?,
    };
    let cwd = std::fs::canonicalize(&cwd).with_context(|| format!("--cwd {}", cwd.display()))?;
    let answerer = Answerer::new(args.answers.clone())?;
    let mut conn = connect(&args.connect).await?;
    // Install the Ctrl-C handler before anything can start running.
    let mut ctrlc = CtrlC::install()?;
    let started = Instant::now();
    let session = conn
        .sessions
        .create_session(create_request(&args, &cwd, prompt))
        .await
        .map_err(|s| status_error("create session", s))?
        .into_inner();
    let id = session.id.clone();
    let err = Style::stderr();
    if args.json {
        json_line(&json!({"type": "session", "session": json::session(&session)}));
    } else {
        errln!("{}", err.dim(&format!("session {id}")));
    }
    let out = if args.json {
        Output::Json
    } else {
        Output::Human(Human::new(true, args.verbose))
    };
    let mut f = Follower {
        conn: conn.clone(),
        session_id: id.clone(),
        answerer,
        out,
        include_partial: !args.json,
        running: true,
        interrupted: false,
        follow_respawns: false,
    };
    // The first prompt is the session's first user message: its turn is the first
    // TurnCompleted in the log.
    let outcome = f.follow(0, Until::TurnAfter(0), &mut ctrlc).await?;
    let code = finish(&mut f, &id, outcome, started, args.json);
    if args.stop && code != EXIT_INTERRUPTED {
        conn.sessions
            .stop_session(pb::StopSessionRequest {
                session_id: id.clone(),
            })
            .await
            .map_err(|s| status_error("stop session", s))?;
    }
    Ok(code)
}

fn create_request(
    args: &RunArgs,
    cwd: &std::path::Path,
    prompt: String,
) -> pb::CreateSessionRequest {
    let mut r = pb::CreateSessionRequest {
        cwd: cwd.to_string_lossy().into_owned(),
        model: args.model.clone().unwrap_or_default(),
        permission_mode: args
            .permission_mode
            .unwrap_or(pb::PermissionMode::Unspecified) as i32,
        labels: args.labels.iter().cloned().collect(),
        max_turns: args.max_turns,
        append_system_prompt: args.append_system_prompt.clone().unwrap_or_default(),
        first_prompt: Some(pb::MessageContent {
            content: Some(pb::message_content::Content::Text(prompt)),
        }),
        title: args.name.clone().unwrap_or_default(),
        ..Default::default()
    };
    args.session_options.apply(&mut r);
    r
}

/// `ostler run` on a terminal without a prompt: read a prompt, stream its turn, repeat.
/// Permission prompts take a single key. An empty line is ignored; Ctrl-D or `/exit`
/// ends the chat (the session stays, for `attach` / `send`); Ctrl-C interrupts a running
/// turn, and at the prompt ends the chat.
async fn chat(args: RunArgs) -> Result<i32> {
    let cwd = match &args.cwd {
        Some(d) => d.clone(),
        None => std::env::current_dir().context("current directory")?,
    };
    let cwd = std::fs::canonicalize(&cwd).with_context(|| format!("--cwd {}", cwd.display()))?;
    let mut answerer = Answerer::new(args.answers.clone())?;
    answerer.single_key = true;
    if answerer.tty.is_none() {
        bail!("no prompt: pass it as an argument or pipe it on stdin (no terminal to chat on)");
    }
    let mut conn = connect(&args.connect).await?;
    let mut ctrlc = CtrlC::install()?;
    let err = Style::stderr();
    errln!(
        "{}",
        err.dim("ostler chat · Enter sends · Ctrl-C interrupts a turn · Ctrl-D or /exit ends")
    );
    let mut follower: Option<Follower> = None;
    loop {
        let tty = match follower.as_mut() {
            Some(f) => f.answerer.tty.as_mut(),
            None => answerer.tty.as_mut(),
        };
        let Some(tty) = tty else { break };
        let line = match tty.ask(&tty.style.bold("you> "), &mut ctrlc).await {
            Ok(Some(l)) => l,
            // Ctrl-C or Ctrl-D at the prompt: the chat ends, the session stays.
            Ok(None) | Err(_) => break,
        };
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        if text == "/exit" || text == "/quit" {
            break;
        }
        let started = Instant::now();
        let (f, outcome) = match follower.as_mut() {
            None => {
                let session = conn
                    .sessions
                    .create_session(create_request(&args, &cwd, text.to_owned()))
                    .await
                    .map_err(|s| status_error("create session", s))?
                    .into_inner();
                errln!("{}", err.dim(&format!("session {}", session.id)));
                let f = follower.insert(Follower {
                    conn: conn.clone(),
                    session_id: session.id.clone(),
                    answerer: std::mem::replace(
                        &mut answerer,
                        Answerer::new(AnswerArgs::default())?,
                    ),
                    out: Output::Human(Human::new(true, args.verbose)),
                    include_partial: true,
                    running: true,
                    interrupted: false,
                    follow_respawns: false,
                });
                let outcome = f.follow(0, Until::TurnAfter(0), &mut ctrlc).await?;
                (f, outcome)
            }
            Some(f) => {
                let message = pb::SendMessageRequest {
                    session_id: f.session_id.clone(),
                    content: Some(pb::MessageContent {
                        content: Some(pb::message_content::Content::Text(text.to_owned())),
                    }),
                    client_message_id: uuid::Uuid::new_v4().to_string(),
                    ..Default::default()
                };
                let outcome = f.send_and_follow(message, &mut ctrlc).await?;
                (f, outcome)
            }
        };
        // Detached (second Ctrl-C), nothing could answer, or the session ended: the chat
        // ends; a completed (or interrupted) turn, or a message withdrawn by an interrupt,
        // goes back to the prompt.
        let ends = !matches!(outcome, Outcome::Turn(_) | Outcome::Withdrawn(_));
        let id = f.session_id.clone();
        let code = finish(f, &id, outcome, started, false);
        if ends {
            return Ok(code);
        }
    }
    if let Some(f) = &follower {
        errln!(
            "{}",
            err.dim(&format!(
                "session {} stays; `ostler attach {0}` or `ostler send {0} …` continues it",
                f.session_id
            ))
        );
    }
    // Ended by the user: success (each turn's outcome was shown as it ended).
    Ok(0)
}

/// Print the outcome; the exit code.
pub fn finish(
    f: &mut Follower,
    id: &str,
    outcome: Outcome,
    started: Instant,
    json_mode: bool,
) -> i32 {
    f.out.clear();
    let err = Style::stderr();
    let wall = started.elapsed().as_millis();
    let (code, summary_json) = match &outcome {
        Outcome::Turn(t) => {
            let ok = super::render::is_success(t);
            let interrupted = !ok
                && (f.interrupted || matches!(&f.out, Output::Human(h) if h.last_turn_interrupted));
            if !json_mode {
                eprintln!(
                    "{}",
                    super::render::terminal_text(&summary(err, t, wall, interrupted))
                );
            }
            let (code, outcome) = if ok {
                (0, "success")
            } else if interrupted {
                (EXIT_INTERRUPTED, "interrupted")
            } else {
                (EXIT_FAILED, "error")
            };
            (code, json!({"outcome": outcome, "turn": json::turn(t)}))
        }
        Outcome::Ended(why) => {
            if !json_mode {
                let line = err.red(&format!("✗ the turn did not complete: {why}"));
                eprintln!("{}", super::render::terminal_text(&line));
            }
            (EXIT_FAILED, json!({"outcome": "ended", "message": why}))
        }
        Outcome::Withdrawn(why) => {
            if !json_mode {
                let line = err.yellow(&format!("✗ interrupted: {why}"));
                eprintln!("{}", super::render::terminal_text(&line));
            }
            (
                EXIT_INTERRUPTED,
                json!({"outcome": "interrupted", "message": why}),
            )
        }
        Outcome::Detached => {
            if !json_mode {
                errln!(
                    "{}",
                    err.yellow(&format!(
                        "detached; the session keeps running — `ostler attach {id}` to follow it"
                    ))
                );
            }
            (EXIT_INTERRUPTED, json!({"outcome": "detached"}))
        }
        Outcome::Unanswerable(m) => {
            super::render::error_line(m);
            (
                EXIT_UNANSWERABLE,
                json!({"outcome": "unanswerable", "message": m}),
            )
        }
    };
    if json_mode {
        let mut v = summary_json;
        if let Some(o) = v.as_object_mut() {
            o.insert("type".into(), json!("run_summary"));
            o.insert("session_id".into(), json!(id));
            o.insert("exit_code".into(), json!(code));
            o.insert("wall_ms".into(), json!(wall as u64));
        }
        json_line(&v);
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_labels_parse() {
        assert_eq!(
            parse_mode("acceptEdits"),
            Ok(pb::PermissionMode::AcceptEdits)
        );
        assert_eq!(
            parse_mode("accept-edits"),
            Ok(pb::PermissionMode::AcceptEdits)
        );
        assert_eq!(
            parse_mode("bypassPermissions"),
            Ok(pb::PermissionMode::BypassPermissions)
        );
        assert!(parse_mode("yolo").is_err());
        assert_eq!(parse_label("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert!(parse_label("=x").is_err());
    }
}
