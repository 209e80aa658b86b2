//! `ostler watch`: the daemon-wide feed (`WatchSessions`), one line per item (or one JSON
//! object with `--json`). Each item carries a cursor; `--since CURSOR` resumes after it.

use anyhow::Result;
use ostler_proto::v1 as pb;
use pb::session_event::Payload;
use serde_json::json;

use super::commands::parse_state;
use super::render::{Style, clip, exit_text, json_line};
use super::run::parse_label;
use super::{ConnectArgs, EXIT_INTERRUPTED, connect, json, status_error};

#[derive(Debug, Clone, clap::Args)]
pub struct WatchArgs {
    /// Start after this cursor (the `cursor` of the last item seen); default: only new items
    #[arg(long, value_name = "CURSOR")]
    pub since: Option<u64>,
    /// Replay the whole stored feed first (same as --since 0)
    #[arg(long, conflicts_with = "since")]
    pub all: bool,
    /// Print what is stored and exit instead of following
    #[arg(long)]
    pub no_follow: bool,
    /// Only sessions with this label (repeatable)
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Only sessions in this state (repeatable): idle, running, awaiting-permission, ...
    #[arg(long = "state", value_name = "STATE", value_parser = parse_state)]
    pub states: Vec<pb::SessionState>,
    /// Only these kinds (repeatable): created, state, turn, permission, question,
    /// resolved, exited, hook, tool_call, elicitation, deleted
    #[arg(long = "kind", value_name = "KIND", value_parser = parse_kind)]
    pub kinds: Vec<pb::FeedKind>,
    /// Print one JSON object per item
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// The short kind names `--kind` takes (and `--json` prints).
const KINDS: [(&str, pb::FeedKind); 13] = [
    ("created", pb::FeedKind::SessionCreated),
    ("state", pb::FeedKind::StateChanged),
    ("turn", pb::FeedKind::TurnCompleted),
    ("permission", pb::FeedKind::PermissionRequested),
    ("question", pb::FeedKind::QuestionAsked),
    ("resolved", pb::FeedKind::Resolved),
    ("exited", pb::FeedKind::ProcessExited),
    ("hook", pb::FeedKind::HookPending),
    ("tool_call", pb::FeedKind::ToolCallPending),
    ("elicitation", pb::FeedKind::ElicitationPending),
    ("dialog", pb::FeedKind::DialogPending),
    ("deleted", pb::FeedKind::SessionDeleted),
    ("updated", pb::FeedKind::SessionUpdated),
];

pub fn parse_kind(s: &str) -> Result<pb::FeedKind, String> {
    let k = s.trim().to_ascii_lowercase();
    KINDS
        .iter()
        .find(|(name, _)| *name == k)
        .map(|(_, v)| *v)
        .ok_or_else(|| {
            let names: Vec<&str> = KINDS.iter().map(|(n, _)| *n).collect();
            format!("unknown kind {s:?} (one of: {})", names.join(", "))
        })
}

fn kind_name(v: i32) -> &'static str {
    KINDS
        .iter()
        .find(|(_, k)| *k as i32 == v)
        .map_or("other", |(n, _)| *n)
}

/// The TITLE cell of `ostler sessions`: the title, clipped; `-` without one.
pub fn title_cell(s: &pb::Session) -> String {
    if s.title.is_empty() {
        "-".into()
    } else {
        clip(&s.title, 40)
    }
}

/// What an item says, in a few words.
fn what(item: &pb::FeedItem) -> String {
    let payload = item.event.as_ref().and_then(|e| e.payload.as_ref());
    if item.kind == pb::FeedKind::SessionDeleted as i32 {
        // The session's last state, from the item (the notice says only "session deleted").
        return format!("session deleted (was {})", json::state_name(item.state));
    }
    match payload {
        Some(Payload::EngineNotice(n)) => n.message.clone(),
        Some(Payload::StateChanged(s)) => format!(
            "{} -> {}{}",
            json::state_name(s.from),
            json::state_name(s.to),
            if s.reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", clip(&s.reason, 60))
            }
        ),
        Some(Payload::TurnCompleted(t)) => format!(
            "turn {}: {} ${:.4}",
            if super::render::is_success(t) {
                "done"
            } else {
                "failed"
            },
            clip(t.result.lines().next().unwrap_or_default(), 60),
            t.total_cost_usd
        ),
        Some(Payload::PermissionRequested(r)) => format!(
            "permission {}: {}",
            r.request_id,
            super::pending::permission_what(r)
        ),
        Some(Payload::QuestionAsked(q)) => format!(
            "question {}: {}",
            q.request_id,
            q.questions
                .iter()
                .map(|q| q.question.as_str())
                .collect::<Vec<_>>()
                .join(" / ")
        ),
        Some(Payload::PermissionResolved(r)) => format!(
            "{} {} by {}",
            r.request_id,
            json::resolution_name(r.resolution),
            r.resolved_by
        ),
        Some(Payload::QuestionAnswered(a)) => {
            format!("{} answered by {}", a.request_id, a.resolved_by)
        }
        Some(Payload::HookRequested(h)) => {
            format!("hook {}: {}", h.request_id, super::pending::hook_what(h))
        }
        Some(Payload::HookResolved(h)) => format!(
            "{} {} ({}) by {}",
            h.request_id,
            json::resolution_name(h.resolution),
            json::hook_decision_name(h.decision),
            h.resolved_by
        ),
        Some(Payload::ToolCallRequested(t)) => format!(
            "tool call {}: {}",
            t.request_id,
            clip(&super::tool_calls::describe(t), 80)
        ),
        Some(Payload::ToolCallResolved(t)) => format!(
            "{} {}{} by {}",
            t.request_id,
            json::resolution_name(t.resolution),
            if t.is_error { " (error)" } else { "" },
            t.resolved_by
        ),
        Some(Payload::ElicitationRequested(e)) => format!(
            "elicitation {}: {}",
            e.request_id,
            super::elicitations::describe(e)
        ),
        Some(Payload::ElicitationResolved(e)) => format!(
            "{} {} by {}",
            e.request_id,
            super::elicitations::action_done(e.action()),
            e.resolved_by
        ),
        Some(Payload::DialogRequested(d)) => {
            format!("dialog {}: {}", d.request_id, super::dialogs::describe(d))
        }
        Some(Payload::DialogResolved(d)) => format!(
            "{} {} by {}",
            d.request_id,
            super::dialogs::behavior_name(d.behavior),
            d.resolved_by
        ),
        Some(Payload::ProcessExited(x)) => format!("process exited: {}", exit_text(x)),
        _ => json::kind(payload).to_owned(),
    }
}

fn item_json(item: &pb::FeedItem) -> serde_json::Value {
    json!({
        "cursor": item.cursor,
        "kind": kind_name(item.kind),
        "session_id": item.session_id,
        "title": item.title,
        "cwd": item.cwd,
        "labels": item.labels,
        "state": json::state_name(item.state),
        "event": item.event.as_ref().map(json::event),
    })
}

fn human(st: Style, item: &pb::FeedItem) -> String {
    let short = super::ids::short_id(&item.session_id);
    let name = if item.title.is_empty() {
        clip(&item.cwd, 30)
    } else {
        clip(&item.title, 30)
    };
    let line = format!(
        "{:>6}  {short}  {name}  {:<10} {}",
        item.cursor,
        kind_name(item.kind),
        what(item)
    );
    match pb::FeedKind::try_from(item.kind) {
        Ok(
            pb::FeedKind::PermissionRequested
            | pb::FeedKind::QuestionAsked
            | pb::FeedKind::HookPending
            | pb::FeedKind::ToolCallPending
            | pb::FeedKind::ElicitationPending
            | pb::FeedKind::DialogPending,
        ) => st.yellow(&line),
        Ok(pb::FeedKind::ProcessExited | pb::FeedKind::SessionDeleted) => st.red(&line),
        Ok(pb::FeedKind::TurnCompleted) => st.green(&line),
        _ => line,
    }
}

/// The cursor to start from: `--since`, `--all` (0), else the newest stored item's (so
/// only new items are shown) — found by reading the stored feed without following.
async fn start_cursor(a: &WatchArgs, conn: &mut super::Conn) -> Result<u64> {
    if let Some(c) = a.since {
        return Ok(c);
    }
    if a.all || a.no_follow {
        return Ok(0);
    }
    let mut stream = conn
        .sessions
        .watch_sessions(pb::WatchSessionsRequest {
            after_cursor: 0,
            follow: false,
            ..Default::default()
        })
        .await
        .map_err(|s| status_error("watch sessions", s))?
        .into_inner();
    let mut last = 0;
    while let Some(item) = stream
        .message()
        .await
        .map_err(|s| status_error("watch sessions", s))?
    {
        last = item.cursor;
    }
    Ok(last)
}

/// A failed watch; OUT_OF_RANGE (deletion items after `--since` were pruned) also says
/// what to run with this client.
fn watch_error(s: tonic::Status) -> anyhow::Error {
    let resume = (s.code() == tonic::Code::OutOfRange)
        .then(|| pruned_detail(&s).or_else(|| pruned_cursor(s.message())))
        .flatten();
    let e = status_error("watch sessions", s);
    match resume {
        Some(n) => anyhow::anyhow!(
            "{e}\nwith this client: run `ostler sessions` to see which sessions still exist, \
             then `ostler watch --since {n}` (or --all for the whole stored feed)"
        ),
        None => e,
    }
}

/// The cursor an OUT_OF_RANGE's `google.rpc.ErrorInfo` (reason `FEED_PRUNED`, domain
/// `ostler`) says to watch again from: its metadata `after_cursor`.
fn pruned_detail(s: &tonic::Status) -> Option<u64> {
    use tonic_types::StatusExt as _;
    let info = s.get_details_error_info()?;
    use ostler_server::error::{ERROR_DOMAIN, REASON_FEED_PRUNED};
    if info.reason != REASON_FEED_PRUNED || info.domain != ERROR_DOMAIN {
        return None;
    }
    info.metadata.get("after_cursor")?.parse().ok()
}

/// For a daemon older than the structured detail: the cursor an OUT_OF_RANGE message says to watch again from (`after_cursor = N`).
fn pruned_cursor(message: &str) -> Option<u64> {
    let (_, rest) = message.split_once("after_cursor = ")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// `ostler watch`
pub async fn watch(a: WatchArgs) -> Result<i32> {
    let mut conn = connect(&a.connect).await?;
    let after_cursor = start_cursor(&a, &mut conn).await?;
    let req = pb::WatchSessionsRequest {
        after_cursor,
        follow: !a.no_follow,
        labels: a.labels.iter().cloned().collect(),
        states: a.states.iter().map(|s| *s as i32).collect(),
        kinds: a.kinds.iter().map(|k| *k as i32).collect(),
    };
    let mut stream = conn
        .sessions
        .watch_sessions(req)
        .await
        .map_err(watch_error)?
        .into_inner();
    let st = Style::stdout();
    if !a.no_follow {
        errln!("watching every session from cursor {after_cursor} (Ctrl-C to stop)");
    }
    loop {
        let next = tokio::select! {
            _ = tokio::signal::ctrl_c() => return Ok(EXIT_INTERRUPTED),
            next = stream.message() => next,
        };
        let Some(item) = next.map_err(watch_error)? else {
            return Ok(0);
        };
        if a.json {
            json_line(&item_json(&item));
        } else {
            outln!("{}", human(st, &item));
        }
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pruned_cursor_is_read_from_the_message() {
        assert_eq!(
            pruned_cursor("... then watch again from after_cursor = 42 (or 0 ...)"),
            Some(42)
        );
        assert_eq!(pruned_cursor("after_cursor 3 is beyond"), None);
        // The structured detail wins over the text; another reason or domain is not it.
        use tonic_types::{ErrorDetails, StatusExt as _};
        let st = |reason: &str, domain: &str| {
            tonic::Status::with_error_details(
                tonic::Code::OutOfRange,
                "watch again from after_cursor = 42",
                ErrorDetails::with_error_info(
                    reason,
                    domain,
                    [("after_cursor".to_owned(), "7".to_owned())],
                ),
            )
        };
        assert_eq!(pruned_detail(&st("FEED_PRUNED", "ostler")), Some(7));
        assert_eq!(pruned_detail(&st("OTHER", "ostler")), None);
        assert_eq!(pruned_detail(&st("FEED_PRUNED", "elsewhere")), None);
        assert_eq!(
            pruned_detail(&tonic::Status::out_of_range("after_cursor = 42")),
            None
        );
    }

    #[test]
    fn kinds_parse_and_name_each_other() {
        for (name, k) in KINDS {
            assert_eq!(parse_kind(name), Ok(k));
            assert_eq!(kind_name(k as i32), name);
        }
        assert!(parse_kind("nope").unwrap_err().contains("permission"));
        // Every kind the feed has (but UNSPECIFIED) has a name `--kind` takes.
        for v in 1..=pb::FeedKind::SessionUpdated as i32 {
            assert_ne!(kind_name(v), "other", "feed kind {v} has no name");
        }
    }

    fn item(kind: pb::FeedKind, payload: Payload) -> pb::FeedItem {
        pb::FeedItem {
            kind: kind as i32,
            event: Some(pb::SessionEvent {
                payload: Some(payload),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_deletion_says_so_with_the_last_state() {
        let mut d = item(
            pb::FeedKind::SessionDeleted,
            Payload::EngineNotice(pb::EngineNotice {
                code: "session_deleted".into(),
                message: "session deleted".into(),
                ..Default::default()
            }),
        );
        d.cursor = 42;
        d.session_id = "s-1".into();
        d.title = "alpha".into();
        d.state = pb::SessionState::Exited as i32;
        d.labels.insert("team".into(), "x".into());
        assert_eq!(what(&d), "session deleted (was exited)");
        let line = human(Style { on: false }, &d);
        assert!(
            line.contains("alpha  deleted    session deleted (was exited)"),
            "{line}"
        );
        let j = item_json(&d);
        assert_eq!(j["kind"], "deleted");
        assert_eq!(j["cursor"], 42);
        assert_eq!(j["state"], "exited");
        assert_eq!(j["labels"]["team"], "x");
        assert_eq!(j["event"]["type"], "engine_notice", "{j}");
        assert_eq!(j["event"]["code"], "session_deleted", "{j}");
    }

    #[test]
    fn hooks_and_tool_calls_say_what_they_are_about() {
        let hook = item(
            pb::FeedKind::HookPending,
            Payload::HookRequested(pb::HookRequested {
                request_id: "hk_1".into(),
                hook_event: "PreToolUse".into(),
                tool_name: "Bash".into(),
                ..Default::default()
            }),
        );
        assert_eq!(what(&hook), "hook hk_1: PreToolUse Bash");
        // A sub-agent's names it, by its id.
        let sub = item(
            pb::FeedKind::HookPending,
            Payload::HookRequested(pb::HookRequested {
                request_id: "hk_2".into(),
                hook_event: "PreToolUse".into(),
                tool_name: "Bash".into(),
                agent_id: "a6b1".into(),
                ..Default::default()
            }),
        );
        assert_eq!(what(&sub), "hook hk_2: PreToolUse Bash in sub-agent a6b1");
        let asks = item(
            pb::FeedKind::PermissionRequested,
            Payload::PermissionRequested(pb::PermissionRequested {
                request_id: "p_1".into(),
                tool_name: "Bash".into(),
                input_json: r#"{"command":"ls"}"#.into(),
                agent_id: "a6b1".into(),
                ..Default::default()
            }),
        );
        assert_eq!(what(&asks), "permission p_1: Bash(ls) in sub-agent a6b1");
        let done = item(
            pb::FeedKind::Resolved,
            Payload::HookResolved(pb::HookResolved {
                request_id: "hk_1".into(),
                resolution: pb::Resolution::Allowed as i32,
                decision: pb::HookDecision::Deny as i32,
                resolved_by: "client:me".into(),
                ..Default::default()
            }),
        );
        assert!(what(&done).starts_with("hk_1 "), "{}", what(&done));
        assert!(what(&done).ends_with(" by client:me"), "{}", what(&done));
        let call = item(
            pb::FeedKind::ToolCallPending,
            Payload::ToolCallRequested(pb::ToolCallRequested {
                request_id: "tc_1".into(),
                server_name: "tickets".into(),
                tool_name: "open".into(),
                arguments_json: r#"{"id":"T-1"}"#.into(),
                ..Default::default()
            }),
        );
        assert_eq!(
            what(&call),
            r#"tool call tc_1: mcp__tickets__open {"id":"T-1"}"#
        );
        let failed = item(
            pb::FeedKind::Resolved,
            Payload::ToolCallResolved(pb::ToolCallResolved {
                request_id: "tc_1".into(),
                is_error: true,
                resolved_by: "client:me".into(),
                ..Default::default()
            }),
        );
        assert!(
            what(&failed).contains("(error) by client:me"),
            "{}",
            what(&failed)
        );
    }
}
