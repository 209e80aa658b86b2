//! `ostler tool-result ID --text T... | --error MSG`: answer a pending call of a
//! client-hosted tool (issue 11; `ToolCallRequested`, listed by `ostler pending` with kind
//! `tool_call`) with the tool's result.

use anyhow::{Result, bail};
use ostler_proto::v1 as pb;
use pb::session_event::Payload;
use serde_json::json;

use super::pending::{answer_error, answer_hint, list, pick_or_settled};
use super::render::{clip, json_line};
use super::{ConnectArgs, connect};

#[derive(Debug, Clone, clap::Args)]
pub struct ToolResultArgs {
    /// Request id (or a unique prefix) of the tool call, as `ostler pending` shows it
    #[arg(value_name = "ID")]
    pub id: String,
    /// A text block of the result (repeatable, in order)
    #[arg(long = "text", value_name = "TEXT", required_unless_present = "error")]
    pub text: Vec<String>,
    /// Answer with an error result instead, told to the model as a failed tool call
    #[arg(long, value_name = "MSG", conflicts_with = "text")]
    pub error: Option<String>,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// `mcp__server__tool {"arg":...}` of a pending tool call.
pub fn describe(t: &pb::ToolCallRequested) -> String {
    format!(
        "mcp__{}__{} {}",
        t.server_name,
        t.tool_name,
        clip(&t.arguments_json, 200)
    )
}

fn block(text: String) -> pb::ToolContent {
    pb::ToolContent {
        block: Some(pb::tool_content::Block::Text(text)),
    }
}

/// `ostler tool-result ID ...`
pub async fn tool_result(a: ToolResultArgs) -> Result<i32> {
    let mut conn = connect(&a.connect).await?;
    let all = list(&mut conn, &[]).await?;
    let p = pick_or_settled(&mut conn, &all, &a.id).await?;
    let Some(Payload::ToolCallRequested(t)) = p.event.as_ref().and_then(|e| e.payload.clone())
    else {
        bail!(
            "{} is not a tool call: it is {}",
            p.request_id,
            answer_hint(&p)
        );
    };
    let (content, is_error) = match a.error {
        Some(msg) => (vec![block(msg)], true),
        None => (a.text.into_iter().map(block).collect(), false),
    };
    let resp = conn
        .sessions
        .respond_to_tool_call(pb::RespondToToolCallRequest {
            session_id: p.session_id.clone(),
            request_id: p.request_id.clone(),
            content,
            is_error,
        })
        .await
        .map_err(|s| answer_error("tool-result", s))?
        .into_inner();
    if a.json {
        json_line(&json!({
            "request_id": p.request_id, "session_id": p.session_id,
            "resolution": "answered", "is_error": is_error, "seq": resp.seq,
        }));
    } else {
        let how = if is_error {
            "an error result"
        } else {
            "a result"
        };
        outln!(
            "answered {} with {how} in session {}",
            describe(&t),
            p.session_id
        );
    }
    Ok(0)
}
