//! Elicitations (an MCP server's request for the user's input): `RespondToElicitation`
//! checked and mapped, `ElicitationRequested` / `ElicitationResolved` mapped to `ostler.v1`.

use ostler_engine as eng;
use ostler_proto::v1 as pb;
use serde_json::Value;
use tonic::Status;

use crate::convert::json_object;

/// An answer's content, at most (the CLI's 10 MiB line cap leaves room for the rest).
pub const MAX_CONTENT_BYTES: usize = 1024 * 1024;

/// `RespondToElicitationRequest.action` and `.content_json` -> what the CLI is sent.
pub fn answer_from_pb(
    action: i32,
    content_json: &str,
) -> Result<(eng::ElicitationAction, Option<Value>), Status> {
    let action = match pb::ElicitationAction::try_from(action) {
        Ok(pb::ElicitationAction::Accept) => eng::ElicitationAction::Accept,
        Ok(pb::ElicitationAction::Decline) => eng::ElicitationAction::Decline,
        Ok(pb::ElicitationAction::Cancel) => eng::ElicitationAction::Cancel,
        Ok(pb::ElicitationAction::Unspecified) => {
            return Err(Status::invalid_argument(
                "action: required (ACCEPT with the input, DECLINE or CANCEL)",
            ));
        }
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "action: {action} is not an ElicitationAction (ACCEPT, DECLINE, CANCEL)"
            )));
        }
    };
    let content = json_object("content_json", content_json, MAX_CONTENT_BYTES)?;
    if content.is_some() && action != eng::ElicitationAction::Accept {
        return Err(Status::invalid_argument(format!(
            "content_json: only an ACCEPT carries content; {} sends none",
            action.as_str().to_uppercase()
        )));
    }
    Ok((action, content.map(Value::Object)))
}

fn action_to_pb(a: eng::ElicitationAction) -> pb::ElicitationAction {
    match a {
        eng::ElicitationAction::Accept => pb::ElicitationAction::Accept,
        eng::ElicitationAction::Decline => pb::ElicitationAction::Decline,
        eng::ElicitationAction::Cancel => pb::ElicitationAction::Cancel,
    }
}

pub fn requested_to_pb(e: &eng::ElicitationRequested) -> pb::ElicitationRequested {
    let text = |s: &Option<String>| s.clone().unwrap_or_default();
    pb::ElicitationRequested {
        request_id: e.request_id.clone(),
        mcp_server_name: e.mcp_server_name.clone(),
        message: e.message.clone(),
        mode: e.mode.clone(),
        url: text(&e.url),
        elicitation_id: text(&e.elicitation_id),
        requested_schema_json: e
            .requested_schema
            .as_ref()
            .map(Value::to_string)
            .unwrap_or_default(),
        title: text(&e.title),
        display_name: text(&e.display_name),
        description: text(&e.description),
        expires_at_ms: e.expires_at_ms.unwrap_or_default(),
        request_json: e.request.to_string(),
    }
}

pub fn resolved_to_pb(e: &eng::ElicitationResolved) -> pb::ElicitationResolved {
    let resolution = match e.outcome {
        eng::ToolCallOutcome::Answered => pb::Resolution::Answered,
        eng::ToolCallOutcome::Expired => pb::Resolution::Expired,
        eng::ToolCallOutcome::Cancelled => pb::Resolution::Cancelled,
    };
    pb::ElicitationResolved {
        request_id: e.request_id.clone(),
        resolution: resolution as i32,
        action: action_to_pb(e.action) as i32,
        content_json: e.content.as_ref().map(Value::to_string).unwrap_or_default(),
        resolved_by: e.resolved_by.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tonic::Code;

    #[test]
    fn answers_are_checked_before_the_cli_sees_them() {
        let accept = pb::ElicitationAction::Accept as i32;
        let (a, c) = answer_from_pb(accept, r#"{"reason":"fixed"}"#).expect("accept");
        assert_eq!(a, eng::ElicitationAction::Accept);
        assert_eq!(c, Some(json!({"reason": "fixed"})));
        assert_eq!(answer_from_pb(accept, "").expect("url mode").1, None);
        let decline = pb::ElicitationAction::Decline as i32;
        assert_eq!(
            answer_from_pb(decline, " ").expect("decline"),
            (eng::ElicitationAction::Decline, None)
        );
        for (action, content, words) in [
            (0, "", "action: required"),
            (9, "", "not an ElicitationAction"),
            (decline, "{}", "only an ACCEPT carries content; DECLINE"),
            (accept, "[1]", "content_json: must be a JSON object"),
            (accept, "{", "content_json: is not valid JSON"),
        ] {
            let e = answer_from_pb(action, content).expect_err(words);
            assert_eq!(e.code(), Code::InvalidArgument, "{words}");
            assert!(e.message().contains(words), "{}", e.message());
        }
        let big = format!(r#"{{"a":"{}"}}"#, "x".repeat(MAX_CONTENT_BYTES));
        let e = answer_from_pb(accept, &big).expect_err("too big");
        assert!(e.message().len() < 200, "not echoed: {}", e.message().len());
    }

    #[test]
    fn events_map_to_the_api() {
        let e = eng::ElicitationRequested {
            request_id: "r".into(),
            mcp_server_name: "tickets".into(),
            message: "Why?".into(),
            mode: "form".into(),
            url: None,
            elicitation_id: None,
            requested_schema: Some(json!({"type": "object"})),
            title: Some("T".into()),
            display_name: None,
            description: None,
            expires_at_ms: Some(7),
            request: json!({"message": "Why?", "extra": 1}),
        };
        let p = requested_to_pb(&e);
        assert_eq!(p.requested_schema_json, r#"{"type":"object"}"#);
        assert_eq!(
            (p.title.as_str(), p.url.as_str(), p.expires_at_ms),
            ("T", "", 7)
        );
        assert!(p.request_json.contains("extra"));
        let r = resolved_to_pb(&eng::ElicitationResolved {
            request_id: "r".into(),
            outcome: eng::ToolCallOutcome::Cancelled,
            action: eng::ElicitationAction::Cancel,
            content: None,
            resolved_by: "cli".into(),
        });
        assert_eq!(r.resolution, pb::Resolution::Cancelled as i32);
        assert_eq!(r.action, pb::ElicitationAction::Cancel as i32);
        assert_eq!(r.content_json, "");
    }
}
