//! Dialogs (the CLI's `request_user_dialog`, of a kind the session declared in
//! `dialog_kinds`): `RespondToDialog` checked and mapped, `DialogRequested` /
//! `DialogResolved` mapped to `ostler.v1`.

use ostler_engine as eng;
use ostler_proto::v1 as pb;
use serde_json::Value;
use tonic::Status;

/// An answer's result, at most.
pub const MAX_RESULT_BYTES: usize = 64 * 1024;

/// `RespondToDialogRequest.behavior` and `.result_json` -> what the CLI is sent. The
/// result is never echoed back in an error.
pub fn answer_from_pb(
    behavior: i32,
    result_json: &str,
) -> Result<(eng::DialogBehavior, Option<Value>), Status> {
    let behavior = match pb::DialogBehavior::try_from(behavior) {
        Ok(pb::DialogBehavior::Completed) => eng::DialogBehavior::Completed,
        Ok(pb::DialogBehavior::Cancelled) => eng::DialogBehavior::Cancelled,
        Ok(pb::DialogBehavior::Unspecified) => {
            return Err(Status::invalid_argument(
                "behavior: required (COMPLETED with the result, or CANCELLED)",
            ));
        }
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "behavior: {behavior} is not a DialogBehavior (COMPLETED, CANCELLED)"
            )));
        }
    };
    if result_json.len() > MAX_RESULT_BYTES {
        return Err(Status::invalid_argument(format!(
            "result_json: {} bytes; at most {MAX_RESULT_BYTES} are allowed",
            result_json.len()
        )));
    }
    if result_json.trim().is_empty() {
        return Ok((behavior, None));
    }
    let v: Value = serde_json::from_str(result_json).map_err(|e| {
        Status::invalid_argument(format!(
            "result_json: not JSON (line {}, column {}); a string is quoted, e.g. \"retry_fallback\"",
            e.line(),
            e.column()
        ))
    })?;
    if behavior == eng::DialogBehavior::Cancelled {
        return Ok((behavior, None));
    }
    Ok((behavior, Some(v)))
}

fn behavior_to_pb(b: eng::DialogBehavior) -> pb::DialogBehavior {
    match b {
        eng::DialogBehavior::Completed => pb::DialogBehavior::Completed,
        eng::DialogBehavior::Cancelled => pb::DialogBehavior::Cancelled,
    }
}

pub fn requested_to_pb(e: &eng::DialogRequested) -> pb::DialogRequested {
    pb::DialogRequested {
        request_id: e.request_id.clone(),
        dialog_kind: e.dialog_kind.clone(),
        payload_json: e.payload.to_string(),
        tool_use_id: e.tool_use_id.clone().unwrap_or_default(),
        expires_at_ms: e.expires_at_ms.unwrap_or_default(),
        request_json: e.request.to_string(),
    }
}

pub fn resolved_to_pb(e: &eng::DialogResolved) -> pb::DialogResolved {
    let resolution = match e.outcome {
        eng::ToolCallOutcome::Answered => pb::Resolution::Answered,
        eng::ToolCallOutcome::Expired => pb::Resolution::Expired,
        eng::ToolCallOutcome::Cancelled => pb::Resolution::Cancelled,
    };
    pb::DialogResolved {
        request_id: e.request_id.clone(),
        resolution: resolution as i32,
        behavior: behavior_to_pb(e.behavior) as i32,
        result_json: e.result.as_ref().map(Value::to_string).unwrap_or_default(),
        resolved_by: e.resolved_by.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tonic::Code;

    #[test]
    fn answers_are_checked_and_never_echoed() {
        let done = pb::DialogBehavior::Completed as i32;
        let (b, r) = answer_from_pb(done, "\"retry_fallback\"").expect("a JSON string");
        assert_eq!(b, eng::DialogBehavior::Completed);
        assert_eq!(r, Some(json!("retry_fallback")));
        let cancel = pb::DialogBehavior::Cancelled as i32;
        assert_eq!(
            answer_from_pb(cancel, "").expect("cancel"),
            (eng::DialogBehavior::Cancelled, None)
        );
        let big = format!("\"{}\"", "x".repeat(MAX_RESULT_BYTES));
        for (behavior, result, says) in [
            (0, "", "behavior: required"),
            (9, "", "not a DialogBehavior"),
            (done, "retry_fallback SECRET", "result_json: not JSON"),
            (done, big.as_str(), "result_json:"),
        ] {
            let e = answer_from_pb(behavior, result).expect_err(result);
            assert_eq!(e.code(), Code::InvalidArgument);
            assert!(e.message().contains(says), "{}", e.message());
            assert!(!e.message().contains("SECRET"), "{}", e.message());
            assert!(e.message().len() < 200, "{}", e.message());
        }
    }
}
