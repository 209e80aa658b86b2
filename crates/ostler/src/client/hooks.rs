//! `ostler hook ID --allow|--deny REASON|--ask|--block REASON|--continue [...]`: answer a
//! pending hook call (issue 11) by request id or unique prefix, as `ostler pending` shows
//! it. What a hook event takes is checked by the daemon (INVALID_ARGUMENT names the field).

use anyhow::{Result, bail};
use ostler_proto::v1 as pb;
use pb::session_event::Payload;
use serde_json::json;

use super::pending::{answer_error, answer_hint, list, pick_or_settled};
use super::render::{clip, json_line};
use super::{ConnectArgs, connect};

#[derive(Debug, Clone, clap::Args)]
#[command(group(
    clap::ArgGroup::new("decision").args(["allow", "deny", "ask", "block", "continue_"])
))]
pub struct HookArgs {
    /// Request id (or a unique prefix) of the hook call, as `ostler pending` shows it
    #[arg(value_name = "ID")]
    pub id: String,
    /// PreToolUse, PreSkillShellCommand, PreModelSwitch: allow; PermissionRequest: grant
    #[arg(long)]
    pub allow: bool,
    /// PreToolUse, PreSkillShellCommand, PreModelSwitch: deny; PermissionRequest: refuse;
    /// REASON is told to the model
    #[arg(long, value_name = "REASON")]
    pub deny: Option<String>,
    /// PreToolUse, PreSkillShellCommand, PreModelSwitch: let Claude Code ask as usual
    #[arg(long)]
    pub ask: bool,
    /// PostToolUse, UserPromptSubmit, Stop, SubagentStop: block; REASON is told to the model
    #[arg(long, value_name = "REASON")]
    pub block: Option<String>,
    /// Go on as if no hook had run (the default)
    #[arg(long = "continue")]
    pub continue_: bool,
    /// The reason sent with --allow / --ask
    #[arg(long, value_name = "REASON")]
    pub reason: Option<String>,
    /// With --allow (PreToolUse, PreSkillShellCommand, PermissionRequest): the replacement
    /// tool input (a JSON object)
    #[arg(long, value_name = "JSON")]
    pub input: Option<String>,
    /// Text added to the model's context (PostToolUse, PostToolBatch, UserPromptSubmit,
    /// SessionStart, ...)
    #[arg(long, value_name = "TEXT")]
    pub context: Option<String>,
    /// Stop the session's turn, showing REASON to the user
    #[arg(long, value_name = "REASON")]
    pub stop: Option<String>,
    /// A message shown to the user
    #[arg(long, value_name = "TEXT")]
    pub system_message: Option<String>,
    /// More hookSpecificOutput fields (a JSON object), e.g. '{"displayContent": "..."}' for
    /// MessageDisplay or '{"sessionTitle": "..."}' for UserPromptSubmit
    #[arg(long, value_name = "JSON")]
    pub specific: Option<String>,
    /// Print the result as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// The request the flags describe (session and request ids filled in by the caller).
pub fn request(a: &HookArgs) -> pb::RespondToHookRequest {
    let (decision, reason) = if a.allow {
        (pb::HookDecision::Allow, a.reason.clone())
    } else if let Some(r) = &a.deny {
        (pb::HookDecision::Deny, Some(r.clone()))
    } else if a.ask {
        (pb::HookDecision::Ask, a.reason.clone())
    } else if let Some(r) = &a.block {
        (pb::HookDecision::Block, Some(r.clone()))
    } else {
        (pb::HookDecision::Continue, a.reason.clone())
    };
    pb::RespondToHookRequest {
        session_id: String::new(),
        request_id: String::new(),
        decision: decision as i32,
        reason: reason.unwrap_or_default(),
        updated_input_json: a.input.clone().unwrap_or_default(),
        additional_context: a.context.clone().unwrap_or_default(),
        stop: a.stop.is_some(),
        stop_reason: a.stop.clone().unwrap_or_default(),
        system_message: a.system_message.clone().unwrap_or_default(),
        hook_specific_output_json: a.specific.clone().unwrap_or_default(),
    }
}

/// `PreToolUse Bash` / `Stop`: what a pending hook call is about.
pub fn describe(h: &pb::HookRequested) -> String {
    if h.tool_name.is_empty() {
        h.hook_event.clone()
    } else {
        format!("{} {}", h.hook_event, h.tool_name)
    }
}

/// `PreToolUse Bash`, and the sub-agent it fires in (`asker`, its label):
/// `PreToolUse Bash in general-purpose · Count files`.
pub fn describe_in(h: &pb::HookRequested, asker: Option<&str>) -> String {
    match asker {
        Some(label) => format!("{} in {label}", describe(h)),
        None => describe(h),
    }
}

/// `ostler hook ID ...`
pub async fn hook(a: HookArgs) -> Result<i32> {
    let mut conn = connect(&a.connect).await?;
    let all = list(&mut conn, &[]).await?;
    let p = pick_or_settled(&mut conn, &all, &a.id).await?;
    let Some(Payload::HookRequested(h)) = p.event.as_ref().and_then(|e| e.payload.clone()) else {
        bail!(
            "{} is not a hook call: it is {}",
            p.request_id,
            answer_hint(&p)
        );
    };
    let mut req = request(&a);
    req.session_id = p.session_id.clone();
    req.request_id = p.request_id.clone();
    let resp = conn
        .sessions
        .respond_to_hook(req)
        .await
        .map_err(|s| answer_error("hook", s))?
        .into_inner();
    let r = resp.resolved.unwrap_or_default();
    let decision = r
        .decision()
        .as_str_name()
        .trim_start_matches("HOOK_DECISION_")
        .to_lowercase();
    if a.json {
        json_line(&json!({
            "request_id": p.request_id, "session_id": p.session_id, "hook_event": h.hook_event,
            "decision": decision, "resolved_by": r.resolved_by, "output": serde_json::from_str::<serde_json::Value>(&r.output_json).unwrap_or_default(),
            "seq": resp.seq,
        }));
    } else {
        outln!(
            "{decision}: {} in session {}",
            clip(&describe(&h), 80),
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
        a: HookArgs,
    }

    fn parse(args: &[&str]) -> Result<pb::RespondToHookRequest, clap::Error> {
        let mut v = vec!["hook"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).map(|c| request(&c.a))
    }

    #[test]
    fn flags_become_the_answer() {
        let r = parse(&["abc", "--deny", "no rm -rf"]).unwrap();
        assert_eq!(r.decision(), pb::HookDecision::Deny);
        assert_eq!(r.reason, "no rm -rf");
        let r = parse(&["abc", "--allow", "--input", "{\"command\":\"ls\"}"]).unwrap();
        assert_eq!(r.decision(), pb::HookDecision::Allow);
        assert_eq!(r.updated_input_json, "{\"command\":\"ls\"}");
        let r = parse(&["abc", "--context", "more", "--stop", "enough"]).unwrap();
        assert_eq!(r.decision(), pb::HookDecision::Continue);
        assert_eq!(r.additional_context, "more");
        assert!(r.stop);
        assert_eq!(r.stop_reason, "enough");
        let r = parse(&["abc", "--specific", "{\"sessionTitle\":\"t\"}"]).unwrap();
        assert_eq!(r.hook_specific_output_json, "{\"sessionTitle\":\"t\"}");
        let r = parse(&["abc", "--block", "keep going"]).unwrap();
        assert_eq!(r.decision(), pb::HookDecision::Block);
        assert!(
            parse(&["abc", "--allow", "--deny", "x"]).is_err(),
            "one decision"
        );
    }
}
