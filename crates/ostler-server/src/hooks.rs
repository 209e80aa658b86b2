//! Remote hooks (issue 11) at the edge: `CreateSessionRequest.hooks` and `RespondToHook`
//! from protobuf (shapes and limits; what an event takes is checked by
//! `ostler_protocol::hooks`), `hook_requested` / `hook_resolved` events to protobuf.

use ostler_proto::v1 as pb;
use ostler_protocol::hooks::{
    self as h, HookAnswer, HookDecision, HookRegistration, HookRequested, HookResolution,
    HookResolved,
};
use tonic::Status;

use crate::convert::{bounded, json_object};

fn decision_from_pb(field: &str, v: i32) -> Result<HookDecision, Status> {
    match pb::HookDecision::try_from(v) {
        Ok(pb::HookDecision::Unspecified | pb::HookDecision::Continue) => {
            Ok(HookDecision::Continue)
        }
        Ok(pb::HookDecision::Allow) => Ok(HookDecision::Allow),
        Ok(pb::HookDecision::Deny) => Ok(HookDecision::Deny),
        Ok(pb::HookDecision::Ask) => Ok(HookDecision::Ask),
        Ok(pb::HookDecision::Block) => Ok(HookDecision::Block),
        Err(_) => Err(Status::invalid_argument(format!(
            "{field}: {v} is not a HookDecision"
        ))),
    }
}

fn decision_to_pb(d: HookDecision) -> pb::HookDecision {
    match d {
        HookDecision::Continue => pb::HookDecision::Continue,
        HookDecision::Allow => pb::HookDecision::Allow,
        HookDecision::Deny => pb::HookDecision::Deny,
        HookDecision::Ask => pb::HookDecision::Ask,
        HookDecision::Block => pb::HookDecision::Block,
    }
}

fn opt(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

/// `CreateSessionRequest.hooks`: an empty id becomes `hook-<index>`; the registrations are
/// checked whole by `CliOptions::validate`.
pub(crate) fn registrations(
    hooks: Vec<pb::HookRegistration>,
) -> Result<Vec<HookRegistration>, Status> {
    if hooks.len() > h::limits::HOOKS {
        return Err(Status::invalid_argument(format!(
            "hooks: has {} entries; at most {} are allowed",
            hooks.len(),
            h::limits::HOOKS
        )));
    }
    hooks
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            bounded(&format!("hooks[{i}].event"), &r.event, 256)?;
            for (field, v) in [
                ("default_reason", &r.default_reason),
                ("default_additional_context", &r.default_additional_context),
                ("default_system_message", &r.default_system_message),
            ] {
                bounded(&format!("hooks[{i}].{field}"), v, h::limits::TEXT_BYTES)?;
            }
            let hook_specific = json_object(
                &format!("hooks[{i}].default_hook_specific_output_json"),
                &r.default_hook_specific_output_json,
                h::limits::INPUT_BYTES,
            )?;
            Ok(HookRegistration {
                id: if r.id.is_empty() {
                    format!("hook-{i}")
                } else {
                    r.id
                },
                event: r.event,
                matcher: opt(r.matcher),
                timeout_secs: r.timeout_secs,
                default: HookAnswer {
                    decision: decision_from_pb(
                        &format!("hooks[{i}].default_decision"),
                        r.default_decision,
                    )?,
                    reason: opt(r.default_reason),
                    additional_context: opt(r.default_additional_context),
                    system_message: opt(r.default_system_message),
                    hook_specific,
                    ..Default::default()
                },
            })
        })
        .collect()
}

/// `RespondToHookRequest` -> the answer (checked against the hook event by the engine).
pub(crate) fn answer(r: &pb::RespondToHookRequest) -> Result<HookAnswer, Status> {
    for (field, v) in [
        ("reason", &r.reason),
        ("additional_context", &r.additional_context),
        ("stop_reason", &r.stop_reason),
        ("system_message", &r.system_message),
    ] {
        bounded(field, v, h::limits::TEXT_BYTES)?;
    }
    let updated_input = json_object(
        "updated_input_json",
        &r.updated_input_json,
        h::limits::INPUT_BYTES,
    )?
    .map(serde_json::Value::Object);
    let hook_specific = json_object(
        "hook_specific_output_json",
        &r.hook_specific_output_json,
        h::limits::INPUT_BYTES,
    )?;
    Ok(HookAnswer {
        decision: decision_from_pb("decision", r.decision)?,
        reason: opt(r.reason.clone()),
        updated_input,
        additional_context: opt(r.additional_context.clone()),
        stop: r.stop,
        stop_reason: opt(r.stop_reason.clone()),
        system_message: opt(r.system_message.clone()),
        hook_specific,
    })
}

pub(crate) fn requested_to_pb(r: &HookRequested) -> pb::HookRequested {
    pb::HookRequested {
        request_id: r.request_id.clone(),
        hook_event: r.hook_event.clone(),
        registration_id: r.registration_id.clone(),
        input_json: r.input.to_string(),
        tool_use_id: r.tool_use_id.clone().unwrap_or_default(),
        tool_name: r.tool_name.clone().unwrap_or_default(),
        expires_at_ms: r.expires_at_ms,
        agent_id: r.agent_id.clone().unwrap_or_default(),
    }
}

pub(crate) fn resolved_to_pb(r: &HookResolved) -> pb::HookResolved {
    let a = &r.answer;
    pb::HookResolved {
        request_id: r.request_id.clone(),
        resolution: match r.resolution {
            HookResolution::Answered => pb::Resolution::Answered,
            HookResolution::Expired => pb::Resolution::Expired,
            HookResolution::Cancelled => pb::Resolution::Cancelled,
        } as i32,
        decision: decision_to_pb(a.decision) as i32,
        reason: a.reason.clone().unwrap_or_default(),
        updated_input_json: a
            .updated_input
            .as_ref()
            .map(|v| v.to_string())
            .unwrap_or_default(),
        additional_context: a.additional_context.clone().unwrap_or_default(),
        stop: a.stop,
        stop_reason: a.stop_reason.clone().unwrap_or_default(),
        system_message: a.system_message.clone().unwrap_or_default(),
        resolved_by: r.resolved_by.clone(),
        output_json: r.output.as_ref().map(|v| v.to_string()).unwrap_or_default(),
        hook_specific_output_json: a
            .hook_specific
            .as_ref()
            .map(|m| serde_json::Value::Object(m.clone()).to_string())
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrations_get_ids_and_defaults() {
        let regs = registrations(vec![
            pb::HookRegistration {
                event: "PreToolUse".into(),
                matcher: "Bash".into(),
                default_decision: pb::HookDecision::Deny as i32,
                default_reason: "nobody answered".into(),
                ..Default::default()
            },
            pb::HookRegistration {
                id: "stop".into(),
                event: "Stop".into(),
                ..Default::default()
            },
        ])
        .unwrap();
        assert_eq!(regs[0].id, "hook-0");
        assert_eq!(regs[0].matcher.as_deref(), Some("Bash"));
        assert_eq!(regs[0].default.decision, HookDecision::Deny);
        assert_eq!(regs[1].id, "stop");
        assert_eq!(regs[1].default.decision, HookDecision::Continue);
        let bad = registrations(vec![pb::HookRegistration {
            event: "Stop".into(),
            default_decision: 99,
            ..Default::default()
        }])
        .unwrap_err();
        assert_eq!(bad.code(), tonic::Code::InvalidArgument);
        assert!(bad.message().starts_with("hooks[0].default_decision"));
    }

    #[test]
    fn answers_are_read_and_bad_json_is_refused() {
        let a = answer(&pb::RespondToHookRequest {
            decision: pb::HookDecision::Allow as i32,
            updated_input_json: r#"{"command":"ls"}"#.into(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(a.decision, HookDecision::Allow);
        assert_eq!(a.updated_input, Some(serde_json::json!({"command": "ls"})));
        for bad in ["[1]", "{", "\"x\""] {
            let e = answer(&pb::RespondToHookRequest {
                updated_input_json: bad.into(),
                ..Default::default()
            })
            .unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().starts_with("updated_input_json"));
            let e = answer(&pb::RespondToHookRequest {
                hook_specific_output_json: bad.into(),
                ..Default::default()
            })
            .unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().starts_with("hook_specific_output_json"));
        }
        let a = answer(&pb::RespondToHookRequest {
            hook_specific_output_json: r#"{"sessionTitle":"t"}"#.into(),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            a.hook_specific.unwrap()["sessionTitle"],
            serde_json::json!("t")
        );
    }
}
