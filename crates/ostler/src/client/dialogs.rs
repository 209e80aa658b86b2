//! `ostler dialog ID (--result JSON | --cancel)`: answer a pending dialog (the CLI's
//! `request_user_dialog`, of a kind the session declared with `--dialog-kinds`;
//! `DialogRequested`, listed by `ostler pending` with kind `dialog`).
//!
//! Kind `refusal_fallback_prompt` (the model refused): `--result '"retry_fallback"'` goes on
//! with the fallback model, `'"edit_prompt"'` ends the turn, `--cancel` lets the refusal
//! stand. The result is JSON: a choice is a quoted string.

use anyhow::{Result, bail};
use ostler_proto::v1 as pb;
use pb::session_event::Payload;
use serde_json::{Value, json};

use super::pending::{answer_error, answer_hint, list, pick_or_settled};
use super::render::{clip, json_line};
use super::{ConnectArgs, connect};

#[derive(Debug, Clone, clap::Args)]
#[command(
    group(
        clap::ArgGroup::new("answer")
            .args(["result", "cancel"])
            .required(true)
    ),
    after_help = "Examples:
  ostler dialog 7d1e --result '\"retry_fallback\"'   (refusal_fallback_prompt: retry on the fallback model)
  ostler dialog 7d1e --result '\"edit_prompt\"'      (end the turn; send a new prompt)
  ostler dialog 7d1e --cancel                      (the dialog's default: the refusal stands)

`ostler pending` lists what waits (kind `dialog`); `ostler pending --json` shows the
dialog's payload (`event.payload`)."
)]
pub struct DialogArgs {
    /// Request id (or a unique prefix) of the dialog, as `ostler pending` shows it
    #[arg(value_name = "ID")]
    pub id: String,
    /// The choice, as JSON (a choice named by a string is quoted: '"retry_fallback"')
    #[arg(long, value_name = "JSON")]
    pub result: Option<String>,
    /// Dismiss the dialog (its default)
    #[arg(long)]
    pub cancel: bool,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// One line for a dialog: `refusal_fallback_prompt: claude-fable-5 refused (cyber)`.
pub fn describe(d: &pb::DialogRequested) -> String {
    let payload: Value = serde_json::from_str(&d.payload_json).unwrap_or(Value::Null);
    let text = |k: &str| payload.get(k).and_then(Value::as_str).unwrap_or_default();
    match d.dialog_kind.as_str() {
        "refusal_fallback_prompt" => {
            let mut s = format!("{}: {} refused", d.dialog_kind, text("originalModel"));
            if !text("apiRefusalCategory").is_empty() {
                s.push_str(&format!(" ({})", text("apiRefusalCategory")));
            }
            if !text("fallbackModel").is_empty() {
                s.push_str(&format!("; fallback {}", text("fallbackModel")));
            }
            s
        }
        _ => format!("{}: {}", d.dialog_kind, clip(&d.payload_json, 120)),
    }
}

/// How to answer `d` from the command line.
pub fn hint(d: &pb::DialogRequested) -> String {
    let example = match d.dialog_kind.as_str() {
        "refusal_fallback_prompt" => "--result '\"retry_fallback\"'",
        _ => "--result JSON",
    };
    format!("ostler dialog {} {example} | --cancel", d.request_id)
}

/// `completed` / `cancelled`.
pub fn behavior_name(v: i32) -> &'static str {
    match pb::DialogBehavior::try_from(v) {
        Ok(pb::DialogBehavior::Completed) => "completed",
        Ok(pb::DialogBehavior::Cancelled) => "cancelled",
        _ => "unknown",
    }
}

/// `ostler dialog ID ...`
pub async fn dialog(a: DialogArgs) -> Result<i32> {
    let mut conn = connect(&a.connect).await?;
    let all = list(&mut conn, &[]).await?;
    let p = pick_or_settled(&mut conn, &all, &a.id).await?;
    let Some(Payload::DialogRequested(d)) = p.event.as_ref().and_then(|e| e.payload.clone()) else {
        bail!(
            "{} is not a dialog: it is {}",
            p.request_id,
            answer_hint(&p)
        );
    };
    let (behavior, result) = if a.cancel {
        (pb::DialogBehavior::Cancelled, String::new())
    } else {
        let r = a.result.clone().unwrap_or_default();
        if serde_json::from_str::<Value>(&r).is_err() {
            bail!(
                "--result is not JSON; a choice is a quoted string, e.g. --result '\"retry_fallback\"'"
            );
        }
        (pb::DialogBehavior::Completed, r)
    };
    let resp = conn
        .sessions
        .respond_to_dialog(pb::RespondToDialogRequest {
            session_id: p.session_id.clone(),
            request_id: p.request_id.clone(),
            behavior: behavior as i32,
            result_json: result,
        })
        .await
        .map_err(|s| answer_error("dialog", s))?
        .into_inner();
    let r = resp.resolved.unwrap_or_default();
    if a.json {
        json_line(&json!({
            "request_id": p.request_id, "session_id": p.session_id,
            "resolution": "answered", "behavior": behavior_name(r.behavior),
            "result": super::json::parsed(&r.result_json), "resolved_by": r.resolved_by,
            "seq": resp.seq,
        }));
    } else {
        let how = if behavior == pb::DialogBehavior::Cancelled {
            "cancelled".to_owned()
        } else {
            format!("answered {}", r.result_json)
        };
        outln!(
            "{how}: {} in session {}",
            clip(&describe(&d), 160),
            p.session_id
        );
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: DialogArgs,
    }

    #[test]
    fn a_refusal_dialog_reads_as_what_happened_and_how_to_answer() {
        let d = pb::DialogRequested {
            request_id: "r1".into(),
            dialog_kind: "refusal_fallback_prompt".into(),
            payload_json: r#"{"originalModel":"claude-fable-5","fallbackModel":"claude-opus-4-8","apiRefusalCategory":"cyber"}"#.into(),
            ..Default::default()
        };
        assert_eq!(
            describe(&d),
            "refusal_fallback_prompt: claude-fable-5 refused (cyber); fallback claude-opus-4-8"
        );
        assert_eq!(
            hint(&d),
            "ostler dialog r1 --result '\"retry_fallback\"' | --cancel"
        );
        let parse = |v: &[&str]| Cli::try_parse_from([&["dialog"], v].concat());
        assert!(parse(&["r1"]).is_err(), "an answer is required");
        assert!(parse(&["r1", "--cancel", "--result", "1"]).is_err());
        let a = parse(&["r1", "--result", "\"retry_fallback\""])
            .expect("parses")
            .a;
        assert_eq!(a.result.as_deref(), Some("\"retry_fallback\""));
    }
}
