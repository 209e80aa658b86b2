//! Issue 10's typed events: the CLI notices whose fields clients need (background tasks,
//! rate limits, compaction, status, a user message's lifecycle, a URL elicitation's end,
//! a hook's run, a banner, a suggested next prompt) and a result's per-model usage, mapped
//! to `ostler.v1`.
//! The engine stores them as `system_notice` with the typed `detail` the decoder read; the
//! whole message goes out as `fields_json`, so nothing is lost to a client that wants more.

use ostler_proto::v1 as pb;
use ostler_protocol as cp;

use pb::session_event::Payload as P;

/// The typed payload of a notice with a detail; `None` for a plain notice.
pub(crate) fn typed_notice(n: &cp::SystemNotice) -> Option<P> {
    let fields_json = || n.fields.get().to_owned();
    let usage = |u: &Option<cp::TaskUsage>| {
        u.map(|u| pb::TaskUsage {
            total_tokens: u.total_tokens,
            tool_uses: u.tool_uses,
            duration_ms: u.duration_ms,
        })
    };
    let s = |v: &Option<String>| v.clone().unwrap_or_default();
    Some(match n.detail.as_ref()? {
        cp::NoticeDetail::TaskStarted(t) => P::TaskStarted(pb::TaskStarted {
            task_id: t.task_id.clone(),
            tool_use_id: s(&t.tool_use_id),
            description: s(&t.description),
            task_type: s(&t.task_type),
            subagent_type: s(&t.subagent_type),
            is_backgrounded: t.is_backgrounded.unwrap_or_default(),
            fields_json: fields_json(),
        }),
        cp::NoticeDetail::TaskProgress(t) => P::TaskProgress(pb::TaskProgress {
            task_id: t.task_id.clone(),
            tool_use_id: s(&t.tool_use_id),
            description: s(&t.description),
            last_tool_name: s(&t.last_tool_name),
            summary: s(&t.summary),
            usage: usage(&t.usage),
            fields_json: fields_json(),
        }),
        cp::NoticeDetail::TaskNotification(t) => P::TaskNotification(pb::TaskNotification {
            task_id: t.task_id.clone(),
            tool_use_id: s(&t.tool_use_id),
            status: t.status.clone(),
            summary: s(&t.summary),
            output_file: s(&t.output_file),
            usage: usage(&t.usage),
            fields_json: fields_json(),
        }),
        cp::NoticeDetail::RateLimit(r) => P::RateLimit(pb::RateLimitChanged {
            status: r.status.clone(),
            resets_at: r.resets_at.unwrap_or_default(),
            rate_limit_type: s(&r.rate_limit_type),
            utilization: r.utilization,
            is_using_overage: r.is_using_overage.unwrap_or_default(),
            fields_json: fields_json(),
        }),
        cp::NoticeDetail::CompactBoundary(c) => P::CompactBoundary(pb::CompactBoundary {
            trigger: s(&c.trigger),
            pre_tokens: c.pre_tokens.unwrap_or_default(),
            post_tokens: c.post_tokens,
            fields_json: fields_json(),
        }),
        cp::NoticeDetail::Status(c) => P::CliStatus(pb::CliStatus {
            status: s(&c.status),
            permission_mode: s(&c.permission_mode),
            fields_json: fields_json(),
        }),
        cp::NoticeDetail::MessageLifecycle(m) => P::MessageLifecycle(pb::MessageLifecycle {
            message_id: m.message_id.clone(),
            state: m.state.clone(),
            fields_json: fields_json(),
        }),
        cp::NoticeDetail::HookActivity(h) => P::HookActivity(pb::HookActivity {
            phase: h.phase.clone(),
            hook_id: s(&h.hook_id),
            hook_name: s(&h.hook_name),
            hook_event: h.hook_event.clone(),
            stdout: s(&h.stdout),
            stderr: s(&h.stderr),
            output: s(&h.output),
            exit_code: h.exit_code,
            outcome: s(&h.outcome),
            fields_json: fields_json(),
        }),
        cp::NoticeDetail::Informational(i) => P::Informational(pb::Informational {
            content: i.content.clone(),
            level: s(&i.level),
            tool_use_id: s(&i.tool_use_id),
            prevent_continuation: i.prevent_continuation,
            tag: s(&i.tag),
            fields_json: fields_json(),
        }),
        cp::NoticeDetail::PromptSuggestion(p) => P::PromptSuggestion(pb::PromptSuggestion {
            suggestion: p.suggestion.clone(),
            fields_json: fields_json(),
        }),
        cp::NoticeDetail::ElicitationComplete(e) => {
            P::ElicitationCompleted(pb::ElicitationCompleted {
                mcp_server_name: s(&e.mcp_server_name),
                elicitation_id: e.elicitation_id.clone(),
                fields_json: fields_json(),
            })
        }
    })
}

/// A result's `modelUsage`, per model.
pub(crate) fn model_usage(t: &cp::TurnResult) -> Vec<pb::ModelUsage> {
    t.models()
        .into_iter()
        .map(|m| pb::ModelUsage {
            model: m.model,
            input_tokens: m.input_tokens,
            output_tokens: m.output_tokens,
            cache_read_input_tokens: m.cache_read_input_tokens,
            cache_creation_input_tokens: m.cache_creation_input_tokens,
            web_search_requests: m.web_search_requests,
            cost_usd: m.cost_usd,
            context_window: m.context_window,
            max_output_tokens: m.max_output_tokens,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(line: &str) -> cp::SystemNotice {
        let mut d = cp::Decoder::for_release(semver::Version::parse("2.1.330").ok().as_ref());
        let mut out = Vec::new();
        d.decode_into(line.as_bytes(), &mut out);
        match out.pop() {
            Some(cp::Event::SystemNotice(n)) => n,
            other => panic!("not a notice: {other:?}"),
        }
    }

    #[test]
    fn typed_notices_keep_the_whole_message() {
        let line = r#"{"type":"system","subtype":"task_notification","task_id":"task-1","tool_use_id":"toolu_task_1","status":"completed","output_file":"/o","summary":"done","usage":{"total_tokens":157,"tool_uses":1,"duration_ms":4}}"#;
        let Some(P::TaskNotification(t)) = typed_notice(&notice(line)) else {
            panic!("not typed")
        };
        assert_eq!(t.task_id, "task-1");
        assert_eq!(t.tool_use_id, "toolu_task_1");
        assert_eq!(t.status, "completed");
        assert_eq!(t.usage.map(|u| u.total_tokens), Some(157));
        assert_eq!(t.fields_json, line);

        let line = r#"{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1763913600,"rateLimitType":"seven_day"}}"#;
        let Some(P::RateLimit(r)) = typed_notice(&notice(line)) else {
            panic!("not typed")
        };
        assert_eq!(
            (r.status.as_str(), r.resets_at, r.rate_limit_type.as_str()),
            ("rejected", 1_763_913_600, "seven_day")
        );
        assert_eq!(r.utilization, None);

        let line = r#"{"type":"system","subtype":"status","status":null,"permissionMode":"plan"}"#;
        let Some(P::CliStatus(c)) = typed_notice(&notice(line)) else {
            panic!("not typed")
        };
        assert_eq!(
            (c.status.as_str(), c.permission_mode.as_str()),
            ("", "plan")
        );

        let plain = notice(r#"{"type":"system","subtype":"api_retry","attempt":1}"#);
        assert!(typed_notice(&plain).is_none());
    }
}
