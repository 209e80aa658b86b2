//! `ostler pending` (every pending permission prompt, question, hook call, client-hosted
//! tool call and elicitation across sessions), `ostler approve ID`, `ostler deny ID
//! [-m MSG]`, `ostler answer ID CHOICE...`.
//!
//! IDs are request ids (or unique prefixes of one) as `pending` shows them.

use anyhow::{Result, anyhow, bail};
use ostler_proto::v1 as pb;
use pb::session_event::Payload;
use serde_json::json;

use super::render::{Style, age, clip, json_line, now_ms, tool_call};
use super::run::parse_label;
use super::{Conn, ConnectArgs, connect, json, status_error};

#[derive(Debug, Clone, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct PendingArgs {
    #[command(subcommand)]
    pub command: Option<PendingCommand>,
    /// Only sessions with this label (repeatable)
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Print one JSON object per pending interaction
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum PendingCommand {
    /// Show one interaction in any state (pending, allowed, denied, answered, expired,
    /// cancelled): who decided it and when, the response, and what it asked
    Show(ShowArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct ShowArgs {
    /// Request id (or a unique prefix)
    #[arg(value_name = "ID")]
    pub id: String,
    /// Only this session's requests (needed when the id is in several sessions)
    #[arg(long, value_name = "SESSION")]
    pub session: Option<String>,
    /// Print the interaction as one JSON object
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ApproveArgs {
    /// Request id (or a unique prefix), as `ostler pending` shows it
    #[arg(value_name = "ID")]
    pub id: String,
    /// Also allow this tool (Bash: this exact command prefix) for the rest of the session
    #[arg(long)]
    pub remember: bool,
    /// Also apply what the CLI suggested with the request (`ostler pending --json` shows
    /// its `suggestions`, e.g. switching the session to acceptEdits)
    #[arg(long)]
    pub suggestions: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct DenyArgs {
    /// Request id (or a unique prefix), as `ostler pending` shows it
    #[arg(value_name = "ID")]
    pub id: String,
    /// The reason, told to the model
    #[arg(
        long,
        short = 'm',
        value_name = "MSG",
        default_value = "The user denied this tool call."
    )]
    pub message: String,
    /// Also stop the running turn
    #[arg(long)]
    pub interrupt: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

#[derive(Debug, Clone, clap::Args)]
pub struct AnswerQuestionArgs {
    /// Request id (or a unique prefix) of the question, as `ostler pending` shows it
    #[arg(value_name = "ID")]
    pub id: String,
    /// One choice per question, in order: an option number (1-based; `1,3` for
    /// multi-select) or an option's label
    #[arg(value_name = "CHOICE", required = true)]
    pub choices: Vec<String>,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

pub(super) async fn list(
    conn: &mut Conn,
    labels: &[(String, String)],
) -> Result<Vec<pb::PendingInteraction>> {
    Ok(conn
        .sessions
        .list_pending_interactions(pb::ListPendingInteractionsRequest {
            labels: labels.iter().cloned().collect(),
        })
        .await
        .map_err(|s| status_error("list pending interactions", s))?
        .into_inner()
        .interactions)
}

/// `GetInteraction`: the interaction `raw` names in any state.
pub(super) async fn get_interaction(
    conn: &mut Conn,
    raw: &str,
    session_id: Option<&str>,
) -> std::result::Result<pb::GetInteractionResponse, tonic::Status> {
    Ok(conn
        .sessions
        .get_interaction(pb::GetInteractionRequest {
            request_id: raw.trim().to_owned(),
            session_id: session_id.unwrap_or_default().to_owned(),
        })
        .await?
        .into_inner())
}

/// The pending interaction `raw` names, as [`pick`]; when nothing pending matches, what
/// happened to it (`GetInteraction`): who settled it and when, or that it never existed.
pub(super) async fn pick_or_settled(
    conn: &mut Conn,
    all: &[pb::PendingInteraction],
    raw: &str,
) -> Result<pb::PendingInteraction> {
    let id = raw.trim();
    if id.is_empty() || all.iter().any(|p| p.request_id.starts_with(id)) {
        return pick(all, raw).cloned();
    }
    match get_interaction(conn, id, None).await {
        Ok(i) if i.state != pb::InteractionState::Pending as i32 => Err(anyhow!("{}", settled(&i))),
        // Pending now but not a moment ago: it was asked since; list again.
        Ok(_) => {
            let all = list(conn, &[]).await?;
            pick(&all, raw).cloned()
        }
        Err(s) if s.code() == tonic::Code::NotFound => Err(anyhow!(
            "no request with id {:?} (`ostler pending` lists what waits)",
            clip(id, 80)
        )),
        Err(s) if s.code() == tonic::Code::InvalidArgument => {
            Err(anyhow!("request id {:?}: {}", clip(id, 80), s.message()))
        }
        // An older daemon without GetInteraction: say what the list says.
        Err(_) => pick(all, raw).cloned(),
    }
}

/// `request req_1 (session 0193…) was already allowed by client:x at 2026-… (3m ago)`, as
/// the daemon words it when it refuses a late answer.
fn settled(i: &pb::GetInteractionResponse) -> String {
    ostler_engine::settled::settled_message(
        &i.request_id,
        &i.session_id,
        state_name(i.state),
        Some(&i.decided_by),
        Some(i.decided_ms),
        now_ms(),
    )
}

fn state_name(state: i32) -> &'static str {
    match pb::InteractionState::try_from(state) {
        Ok(pb::InteractionState::Pending) => "pending",
        Ok(pb::InteractionState::Allowed) => "allowed",
        Ok(pb::InteractionState::Denied) => "denied",
        Ok(pb::InteractionState::Answered) => "answered",
        Ok(pb::InteractionState::Expired) => "expired",
        Ok(pb::InteractionState::Cancelled) => "cancelled",
        _ => "settled",
    }
}

fn kind_name(kind: i32) -> &'static str {
    match pb::InteractionKind::try_from(kind) {
        Ok(pb::InteractionKind::Permission) => "permission",
        Ok(pb::InteractionKind::Question) => "question",
        Ok(pb::InteractionKind::Hook) => "hook",
        Ok(pb::InteractionKind::ToolCall) => "tool_call",
        Ok(pb::InteractionKind::Elicitation) => "elicitation",
        Ok(pb::InteractionKind::Dialog) => "dialog",
        _ => "other",
    }
}

pub(super) use ostler_engine::settled::utc;

/// `ostler pending show ID`
pub async fn show(a: ShowArgs) -> Result<i32> {
    let mut conn = connect(&a.connect).await?;
    let i = get_interaction(&mut conn, &a.id, a.session.as_deref())
        .await
        .map_err(|s| status_error("get interaction", s))?;
    if a.json {
        let response = if i.response_json.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_str(&i.response_json)
                .unwrap_or_else(|_| serde_json::Value::String(i.response_json.clone()))
        };
        let mut v = json!({
            "request_id": i.request_id,
            "session_id": i.session_id,
            "cwd": i.cwd,
            "kind": kind_name(i.kind),
            "state": state_name(i.state),
            "created_ms": i.created_ms,
            "decided_by": (!i.decided_by.is_empty()).then_some(&i.decided_by),
            "decided_ms": (i.decided_ms > 0).then_some(i.decided_ms),
            "response": response,
            "response_truncated": i.response_truncated,
        });
        if let Some(e) = &i.event {
            v["event"] = json::event(e);
        }
        json_line(&v);
        return Ok(0);
    }
    let p = pb::PendingInteraction {
        session_id: i.session_id.clone(),
        cwd: i.cwd.clone(),
        request_id: i.request_id.clone(),
        event: i.event.clone(),
    };
    outln!("request   {} ({})", i.request_id, kind_name(i.kind));
    outln!("session   {}  {}", i.session_id, clip(&i.cwd, 60));
    outln!(
        "asked     {} ({} ago)",
        utc(i.created_ms),
        age(i.created_ms)
    );
    let what = what(&p);
    if !what.is_empty() {
        outln!("what      {}", clip(&what, 200));
    }
    if i.state == pb::InteractionState::Pending as i32 {
        outln!("state     pending: {}", answer_hint(&p));
    } else {
        let by = if i.decided_by.is_empty() {
            String::new()
        } else {
            format!(" by {}", i.decided_by)
        };
        outln!("state     {}{by}", state_name(i.state));
        if i.decided_ms > 0 {
            outln!(
                "decided   {} ({} ago)",
                utc(i.decided_ms),
                age(i.decided_ms)
            );
        }
    }
    if !i.response_json.is_empty() {
        outln!(
            "response  {}{}",
            clip(&i.response_json, 400),
            if i.response_truncated {
                " [cut at 64 KiB]"
            } else {
                ""
            }
        );
    }
    Ok(0)
}

/// The pending interaction `raw` names (exact request id or unique prefix).
pub fn pick<'a>(
    all: &'a [pb::PendingInteraction],
    raw: &str,
) -> Result<&'a pb::PendingInteraction> {
    let raw = raw.trim();
    if raw.is_empty() {
        usage!("empty request id");
    }
    if let Some(p) = all.iter().find(|p| p.request_id == raw) {
        return Ok(p);
    }
    let m: Vec<&pb::PendingInteraction> = all
        .iter()
        .filter(|p| p.request_id.starts_with(raw))
        .collect();
    match m.as_slice() {
        [one] => Ok(one),
        [] => Err(anyhow!(
            "nothing pending with request id {:?}: it was answered, withdrawn, or never \
             existed (`ostler pending` lists what waits)",
            clip(raw, 80)
        )),
        many => Err(anyhow!(
            "the request id prefix {raw:?} is ambiguous: it matches {} pending requests; type \
             more of the id:\n{}",
            many.len(),
            many.iter()
                .take(10)
                .map(|p| format!("  {}  session {}  {}", p.request_id, p.session_id, what(p)))
                .collect::<Vec<_>>()
                .join("\n")
        )),
    }
}

fn kind(p: &pb::PendingInteraction) -> &'static str {
    match p.event.as_ref().and_then(|e| e.payload.as_ref()) {
        Some(Payload::PermissionRequested(_)) => "permission",
        Some(Payload::QuestionAsked(_)) => "question",
        Some(Payload::HookRequested(_)) => "hook",
        Some(Payload::ToolCallRequested(_)) => "tool_call",
        Some(Payload::ElicitationRequested(_)) => "elicitation",
        Some(Payload::DialogRequested(_)) => "dialog",
        _ => "other",
    }
}

/// What a pending interaction is and the command that answers it, for the refusals of the
/// commands that answer another kind: `a question: answer it with ...`.
pub(super) fn answer_hint(p: &pb::PendingInteraction) -> String {
    let id = &p.request_id;
    match kind(p) {
        "permission" => format!(
            "a permission request: answer it with `ostler approve {id}` or `ostler deny {id}`"
        ),
        "question" => format!("a question: answer it with `ostler answer {id} CHOICE...`"),
        "hook" => format!(
            "a hook call: answer it with `ostler hook {id} --allow|--deny REASON|--continue`"
        ),
        "tool_call" => format!(
            "a client-hosted tool call: answer it with `ostler tool-result {id} --text ...`"
        ),
        "elicitation" => format!(
            "an MCP server's request for input: answer it with `ostler elicitation {id} \
             --accept|--decline|--cancel`"
        ),
        "dialog" => format!(
            "a dialog the CLI asks for: answer it with `ostler dialog {id} --result JSON|--cancel`"
        ),
        _ => "a request this client does not know (a newer daemon?)".to_owned(),
    }
}

/// `Bash(touch x)`; a sub-agent's request names it by its id (lists have none of its
/// events to label it with): `Bash(touch x) in sub-agent a6b1`.
pub(super) fn permission_what(r: &pb::PermissionRequested) -> String {
    let call = tool_call(&r.tool_name, &r.input_json);
    match super::render::agent_label(&r.agent_id, "", "") {
        Some(label) => format!("{call} in {label}"),
        None => call,
    }
}

/// `PreToolUse Bash`; a sub-agent's as [`permission_what`]'s.
pub(super) fn hook_what(h: &pb::HookRequested) -> String {
    super::hooks::describe_in(
        h,
        super::render::agent_label(&h.agent_id, "", "").as_deref(),
    )
}

/// `Bash(touch x)` / the first question (a sub-agent's request names it).
fn what(p: &pb::PendingInteraction) -> String {
    match p.event.as_ref().and_then(|e| e.payload.as_ref()) {
        Some(Payload::PermissionRequested(r)) => permission_what(r),
        Some(Payload::QuestionAsked(q)) => q
            .questions
            .iter()
            .map(|q| q.question.clone())
            .collect::<Vec<_>>()
            .join(" / "),
        Some(Payload::HookRequested(h)) => hook_what(h),
        Some(Payload::ToolCallRequested(t)) => super::tool_calls::describe(t),
        Some(Payload::ElicitationRequested(e)) => super::elicitations::describe(e),
        Some(Payload::DialogRequested(d)) => super::dialogs::describe(d),
        _ => String::new(),
    }
}

/// `ostler pending`
pub async fn pending(a: PendingArgs) -> Result<i32> {
    if let Some(PendingCommand::Show(show_args)) = a.command {
        return show(show_args).await;
    }
    let mut conn = connect(&a.connect).await?;
    let all = list(&mut conn, &a.labels).await?;
    if a.json {
        for p in &all {
            let mut v = json!({
                "request_id": p.request_id,
                "kind": kind(p),
                "session_id": p.session_id,
                "cwd": p.cwd,
            });
            if let Some(e) = &p.event {
                v["asked_at_ms"] = json!(e.ts_ms);
                v["event"] = json::event(e);
            }
            json_line(&v);
        }
        return Ok(0);
    }
    if all.is_empty() {
        errln!("nothing pending");
        return Ok(0);
    }
    let st = Style::stdout();
    let rows: Vec<[String; 6]> = all
        .iter()
        .map(|p| {
            [
                p.request_id.clone(),
                kind(p).to_owned(),
                super::ids::short_id(&p.session_id),
                p.event.as_ref().map(|e| age(e.ts_ms)).unwrap_or_default(),
                clip(&p.cwd, 40),
                clip(&what(p), 80),
            ]
        })
        .collect();
    let head = ["REQUEST", "KIND", "SESSION", "WAITING", "CWD", "WHAT"];
    let (head_line, lines) = super::commands::table(&head, &rows);
    outln!("{}", st.bold(&head_line));
    for l in lines {
        outln!("{l}");
    }
    errln!(
        "{}",
        Style::stderr().dim(
            "answer with `ostler approve ID`, `ostler deny ID -m why`, `ostler answer ID CHOICE`, \
             `ostler hook ID --allow|--deny why|--continue`, `ostler tool-result ID --text ...` \
             or `ostler elicitation ID --accept [--field KEY=VALUE]|--decline|--cancel`"
        )
    );
    Ok(0)
}

/// Settled-by-someone-else and friends read as what they are.
pub(super) fn answer_error(what: &str, s: tonic::Status) -> anyhow::Error {
    if s.code() == tonic::Code::FailedPrecondition {
        anyhow!("{what}: already settled: {}", s.message())
    } else {
        status_error(what, s)
    }
}

async fn find_permission(
    c: &ConnectArgs,
    raw: &str,
) -> Result<(Conn, pb::PendingInteraction, pb::PermissionRequested)> {
    let mut conn = connect(c).await?;
    let all = list(&mut conn, &[]).await?;
    let p = pick_or_settled(&mut conn, &all, raw).await?;
    match p.event.as_ref().and_then(|e| e.payload.clone()) {
        Some(Payload::PermissionRequested(r)) => Ok((conn, p, r)),
        _ => bail!(
            "{} is not a permission request: it is {}",
            p.request_id,
            answer_hint(&p)
        ),
    }
}

/// `ostler approve ID`
pub async fn approve(a: ApproveArgs) -> Result<i32> {
    let (mut conn, p, r) = find_permission(&a.connect, &a.id).await?;
    let input: serde_json::Value = serde_json::from_str(&r.input_json).unwrap_or_default();
    let remember = if a.remember {
        vec![super::prompt::remember_rule(&r.tool_name, &input)]
    } else {
        vec![]
    };
    let updated_permissions_json = if !a.suggestions {
        String::new()
    } else if r.suggestions_json.trim().is_empty() || r.suggestions_json.trim() == "[]" {
        anyhow::bail!(
            "--suggestions: the CLI suggested nothing with request {}; approve without it",
            p.request_id
        );
    } else {
        r.suggestions_json.clone()
    };
    let resp = conn
        .sessions
        .respond_to_permission(pb::RespondToPermissionRequest {
            session_id: p.session_id.clone(),
            request_id: p.request_id.clone(),
            decision: Some(pb::respond_to_permission_request::Decision::Allow(
                pb::PermissionAllow {
                    remember,
                    updated_permissions_json,
                    ..Default::default()
                },
            )),
        })
        .await
        .map_err(|s| answer_error("approve", s))?
        .into_inner();
    let call = tool_call(&r.tool_name, &r.input_json);
    if a.json {
        json_line(&json!({
            "request_id": p.request_id, "session_id": p.session_id, "resolution": "allowed",
            "seq": resp.seq,
        }));
    } else {
        outln!("allowed {call} in session {}", p.session_id);
    }
    Ok(0)
}

/// `ostler deny ID [-m MSG]`
pub async fn deny(a: DenyArgs) -> Result<i32> {
    let (mut conn, p, r) = find_permission(&a.connect, &a.id).await?;
    let resp = conn
        .sessions
        .respond_to_permission(pb::RespondToPermissionRequest {
            session_id: p.session_id.clone(),
            request_id: p.request_id.clone(),
            decision: Some(pb::respond_to_permission_request::Decision::Deny(
                pb::PermissionDeny {
                    message: a.message.clone(),
                    interrupt: a.interrupt,
                },
            )),
        })
        .await
        .map_err(|s| answer_error("deny", s))?
        .into_inner();
    let call = tool_call(&r.tool_name, &r.input_json);
    if a.json {
        json_line(&json!({
            "request_id": p.request_id, "session_id": p.session_id, "resolution": "denied",
            "seq": resp.seq,
        }));
    } else {
        outln!("denied {call} in session {}", p.session_id);
    }
    Ok(0)
}

/// One choice for a question: option numbers (`2`, `1,3`) or an option label
/// (case-insensitive); free text only for a question without options.
pub fn choice(q: &pb::Question, raw: &str) -> Result<pb::QuestionAnswer> {
    if let Some(a) = super::prompt::parse_choice(raw, q) {
        return Ok(a);
    }
    let raw = raw.trim();
    if let Some(o) = q.options.iter().find(|o| o.label.eq_ignore_ascii_case(raw)) {
        return Ok(pb::QuestionAnswer {
            question: q.question.clone(),
            selected: vec![o.label.clone()],
            other_text: String::new(),
        });
    }
    let labels: Vec<String> = q
        .options
        .iter()
        .enumerate()
        .map(|(i, o)| format!("{}) {}", i + 1, o.label))
        .collect();
    usage!(
        "{:?} is not an option of {:?}; choose {}{}",
        clip(raw, 60),
        clip(&q.question, 80),
        labels.join(", "),
        if q.multi_select {
            " (several: 1,3)"
        } else {
            ""
        }
    )
}

/// `ostler answer ID CHOICE...`
pub async fn answer(a: AnswerQuestionArgs) -> Result<i32> {
    let mut conn = connect(&a.connect).await?;
    let all = list(&mut conn, &[]).await?;
    let p = pick_or_settled(&mut conn, &all, &a.id).await?;
    let Some(Payload::QuestionAsked(q)) = p.event.as_ref().and_then(|e| e.payload.clone()) else {
        bail!(
            "{} is not a question: it is {}",
            p.request_id,
            answer_hint(&p)
        );
    };
    if a.choices.len() != q.questions.len() {
        bail!(
            "the request asks {} question(s); give one CHOICE for each, in order:\n{}",
            q.questions.len(),
            q.questions
                .iter()
                .map(|q| format!("  {}", q.question))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    let answers = q
        .questions
        .iter()
        .zip(&a.choices)
        .map(|(q, c)| choice(q, c))
        .collect::<Result<Vec<_>>>()?;
    let resp = conn
        .sessions
        .answer_question(pb::AnswerQuestionRequest {
            session_id: p.session_id.clone(),
            request_id: p.request_id.clone(),
            answers: answers.clone(),
        })
        .await
        .map_err(|s| answer_error("answer", s))?
        .into_inner();
    if a.json {
        json_line(&json!({
            "request_id": p.request_id, "session_id": p.session_id, "resolution": "answered",
            "seq": resp.seq,
            "answers": answers.iter().map(|a| json!({"question": a.question, "selected": a.selected, "other_text": a.other_text})).collect::<Vec<_>>(),
        }));
    } else {
        for x in &answers {
            let mut chosen = x.selected.join(", ");
            if !x.other_text.is_empty() {
                chosen = x.other_text.clone();
            }
            outln!("{} → {chosen}", clip(&x.question, 60));
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_by_number_or_label() {
        let q = pb::Question {
            question: "DB?".into(),
            options: vec![
                pb::QuestionOption {
                    label: "SQLite".into(),
                    ..Default::default()
                },
                pb::QuestionOption {
                    label: "PostgreSQL".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        assert_eq!(
            choice(&q, "2").map(|a| a.selected).ok(),
            Some(vec!["PostgreSQL".into()])
        );
        assert_eq!(
            choice(&q, "sqlite").map(|a| a.selected).ok(),
            Some(vec!["SQLite".into()])
        );
        let e = choice(&q, "MySQL").map(|_| ()).unwrap_err().to_string();
        assert!(
            e.contains("1) SQLite") && e.contains("2) PostgreSQL"),
            "{e}"
        );
    }

    #[test]
    fn elicitations_are_listed_with_the_command_that_answers_them() {
        let p = pb::PendingInteraction {
            request_id: "el1".into(),
            event: Some(pb::SessionEvent {
                payload: Some(Payload::ElicitationRequested(pb::ElicitationRequested {
                    request_id: "el1".into(),
                    mcp_server_name: "crm".into(),
                    message: "Which account?".into(),
                    mode: "form".into(),
                    ..Default::default()
                })),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(kind(&p), "elicitation");
        assert_eq!(what(&p), "crm: Which account?");
        let hint = answer_hint(&p);
        assert!(
            hint.contains("ostler elicitation el1 --accept|--decline|--cancel"),
            "{hint}"
        );
        let tool = pb::PendingInteraction {
            request_id: "t1".into(),
            event: Some(pb::SessionEvent {
                payload: Some(Payload::ToolCallRequested(Default::default())),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(answer_hint(&tool).contains("ostler tool-result t1"));
    }

    #[test]
    fn a_subagents_requests_are_listed_with_its_id() {
        let pending = |payload: Payload| pb::PendingInteraction {
            request_id: "r1".into(),
            event: Some(pb::SessionEvent {
                payload: Some(payload),
                ..Default::default()
            }),
            ..Default::default()
        };
        let permission = |agent: &str| {
            pending(Payload::PermissionRequested(pb::PermissionRequested {
                tool_name: "Bash".into(),
                input_json: r#"{"command":"touch q.txt"}"#.into(),
                agent_id: agent.into(),
                ..Default::default()
            }))
        };
        let hook = |agent: &str| {
            pending(Payload::HookRequested(pb::HookRequested {
                hook_event: "PreToolUse".into(),
                tool_name: "Bash".into(),
                agent_id: agent.into(),
                ..Default::default()
            }))
        };
        assert_eq!(what(&permission("")), "Bash(touch q.txt)");
        assert_eq!(
            what(&permission("a6b1")),
            "Bash(touch q.txt) in sub-agent a6b1"
        );
        assert_eq!(what(&hook("")), "PreToolUse Bash");
        assert_eq!(what(&hook("a6b1")), "PreToolUse Bash in sub-agent a6b1");
    }

    #[test]
    fn request_ids_by_prefix() {
        let p = |id: &str| pb::PendingInteraction {
            request_id: id.into(),
            ..Default::default()
        };
        let all = vec![p("aa11"), p("aa22"), p("bb33")];
        assert_eq!(
            pick(&all, "b").map(|p| p.request_id.as_str()).ok(),
            Some("bb33")
        );
        assert_eq!(
            pick(&all, "aa22").map(|p| p.request_id.as_str()).ok(),
            Some("aa22")
        );
        let e = pick(&all, "aa").map(|_| ()).unwrap_err().to_string();
        assert!(
            e.contains("ambiguous") && e.contains("aa11") && e.contains("aa22"),
            "{e}"
        );
        assert!(pick(&all, "zz").is_err());
    }
}
