//! Typed notices, per-model usage, terminal reason, the sub-agent's id on permission
//! requests and the interruption marker, read from lines the real CLI wrote (the recorded
//! contracts of 2.1.330 and 1.0.128) and from hand-written lines in the release's shapes.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
use ostler_protocol::transcript::{Output, decode_all};
use ostler_protocol::*;
use semver::Version;
use serde_json::json;

fn recorded(release: &str, scenario: &str) -> Vec<Event> {
    let path = format!(
        "{}/../../contracts/claude-code/{release}/{scenario}.ndjson",
        env!("CARGO_MANIFEST_DIR")
    );
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let (out, _) = decode_all(&bytes, Some(Version::parse(release).unwrap()));
    out.into_iter()
        .filter_map(|o| match o {
            Output::Event(e) => Some(e),
            Output::Outbound(_) => None,
        })
        .collect()
}

fn details(events: &[Event]) -> Vec<NoticeDetail> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::SystemNotice(n) => n.detail.clone(),
            _ => None,
        })
        .collect()
}

fn one(release: &str, line: serde_json::Value) -> Event {
    let mut d = Decoder::for_release(Some(&Version::parse(release).unwrap()));
    let mut out = Vec::new();
    d.decode_into(line.to_string().as_bytes(), &mut out);
    assert_eq!(out.len(), 1, "{out:?}");
    out.remove(0)
}

#[test]
fn background_task_lifecycle_is_typed_on_2_1_330() {
    let events = recorded("2.1.330", "subagent");
    let d = details(&events);
    let started = d
        .iter()
        .find_map(|d| match d {
            NoticeDetail::TaskStarted(t) => Some(t.clone()),
            _ => None,
        })
        .expect("task_started");
    assert_eq!(
        started,
        TaskStarted {
            task_id: "task-1".into(),
            tool_use_id: Some("toolu_task_1".into()),
            description: Some("Create sub.txt".into()),
            task_type: Some("local_agent".into()),
            subagent_type: Some("general-purpose".into()),
            is_backgrounded: Some(true),
        }
    );
    let progress = d
        .iter()
        .find_map(|d| match d {
            NoticeDetail::TaskProgress(t) => Some(t.clone()),
            _ => None,
        })
        .expect("task_progress");
    assert_eq!(progress.task_id, "task-1");
    assert_eq!(progress.tool_use_id.as_deref(), Some("toolu_task_1"));
    assert_eq!(progress.last_tool_name.as_deref(), Some("Bash"));
    assert_eq!(
        progress.usage,
        Some(TaskUsage {
            total_tokens: 134,
            tool_uses: 1,
            duration_ms: 0
        })
    );
    let done = d
        .iter()
        .find_map(|d| match d {
            NoticeDetail::TaskNotification(t) => Some(t.clone()),
            _ => None,
        })
        .expect("task_notification");
    assert_eq!(done.task_id, "task-1");
    assert_eq!(done.status, "completed");
    assert_eq!(done.tool_use_id.as_deref(), Some("toolu_task_1"));
    assert_eq!(done.summary.as_deref(), Some("Sub-agent: created sub.txt."));
    assert!(
        done.output_file
            .as_deref()
            .unwrap()
            .ends_with("task-1.output")
    );
    assert_eq!(done.usage.map(|u| u.total_tokens), Some(157));

    // The sub-agent's permission request names its task; the main thread's does not.
    let agents: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::ControlRequest(ControlRequest {
                request: CliRequest::CanUseTool(c),
                ..
            }) => Some(c.agent_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(agents, [Some("task-1".to_string())]);

    // Notices without typed fields stay plain (task_updated, background_tasks_changed).
    let plain: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::SystemNotice(n) if n.detail.is_none() => n.subtype.clone(),
            _ => None,
        })
        .collect();
    assert!(plain.contains(&"task_updated".to_string()), "{plain:?}");
    assert!(
        plain.contains(&"background_tasks_changed".to_string()),
        "{plain:?}"
    );
}

#[test]
fn status_is_typed_with_the_permission_mode_when_sent() {
    let d = details(&recorded("2.1.330", "control"));
    assert!(
        d.contains(&NoticeDetail::Status(CliStatus {
            status: None,
            permission_mode: Some("acceptEdits".into()),
        })),
        "{d:?}"
    );
    let d = details(&recorded("2.1.330", "plain_text"));
    assert_eq!(
        d,
        [NoticeDetail::Status(CliStatus {
            status: Some("requesting".into()),
            permission_mode: None,
        })]
    );
}

/// The decoder reads a status line's two fields with the envelope (the CLI writes one with
/// every request, so it is not parsed again); what it gives must be what the notice reader
/// gives for the same line, whatever the fields hold.
#[test]
fn a_status_lines_detail_is_the_notice_readers_for_any_field_values() {
    for line in [
        json!({"type":"system","subtype":"status","status":"requesting","uuid":"u","session_id":"s"}),
        json!({"type":"system","subtype":"status","status":null,"permissionMode":"plan"}),
        json!({"type":"system","subtype":"status","permissionMode":"acceptEdits","status":"compacting"}),
        json!({"type":"system","subtype":"status"}),
        json!({"type":"system","subtype":"status","status":7,"permissionMode":{"mode":"plan"}}),
        json!({"type":"system","subtype":"status","status":["a"],"permissionMode":true}),
        json!({"type":"system","subtype":"status","status":"caf\u{e9} \"x\"","permissionMode":"default"}),
    ] {
        let fields = serde_json::value::to_raw_value(&line).unwrap();
        let want = notice_detail("system", Some("status"), &fields);
        assert!(want.is_some(), "{line}");
        match one("2.1.330", line.clone()) {
            Event::SystemNotice(n) => assert_eq!(n.detail, want, "{line}"),
            other => panic!("{line}: {other:?}"),
        }
    }
}

#[test]
fn interruption_marker_is_synthetic_and_the_result_says_why() {
    for release in ["2.1.330", "1.0.128"] {
        let events = recorded(release, "interrupt");
        let markers: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                Event::UserMessage(u) => Some(u.clone()),
                _ => None,
            })
            .filter(|u| u.text.as_deref() == Some("[Request interrupted by user]"))
            .collect();
        assert!(!markers.is_empty(), "{release}: no marker");
        assert!(markers.iter().all(|u| u.is_synthetic), "{release}");
    }
    let results: Vec<_> = recorded("2.1.330", "interrupt")
        .into_iter()
        .filter_map(|e| match e {
            Event::TurnResult(r) => Some(r),
            _ => None,
        })
        .collect();
    let reasons: Vec<_> = results
        .iter()
        .map(|r| r.terminal_reason.as_deref())
        .collect();
    assert_eq!(reasons, [Some("aborted_streaming"), Some("completed")]);
    let models = results[0].models();
    assert_eq!(models.len(), 1);
    assert_eq!(
        models[0],
        ModelUsage {
            model: "claude-opus-5-5".into(),
            input_tokens: 120,
            output_tokens: 3,
            cache_read_input_tokens: 0,
            cache_creation_input_tokens: 0,
            web_search_requests: 0,
            cost_usd: 0.00054,
            context_window: 1_000_000,
            max_output_tokens: 128_000,
        }
    );
    // 1.0.128 sends modelUsage but no terminal reason.
    let old: Vec<_> = recorded("1.0.128", "interrupt")
        .into_iter()
        .filter_map(|e| match e {
            Event::TurnResult(r) => Some(r),
            _ => None,
        })
        .collect();
    assert!(old.iter().all(|r| r.terminal_reason.is_none()));
    // A user's own text that merely mentions the marker is not synthetic.
    let Event::UserMessage(u) = one(
        "2.1.330",
        json!({"type":"user","message":{"role":"user","content":"what does [Request interrupted by user] mean?"}}),
    ) else {
        panic!()
    };
    assert!(!u.is_synthetic);
    let Event::UserMessage(u) = one(
        "2.1.330",
        json!({"type":"user","message":{"role":"user","content":[{"type":"text","text":"[Request interrupted by user for tool use]"}]}}),
    ) else {
        panic!()
    };
    assert!(u.is_synthetic);
}

#[test]
fn rate_limit_and_compact_boundary_in_the_release_shapes() {
    // Shapes from 2.1.330's own message schema (`rate_limit_event`, `compact_boundary`).
    let Event::SystemNotice(n) = one(
        "2.1.330",
        json!({"type":"rate_limit_event","rate_limit_info":{"status":"allowed_warning","resetsAt":1763913600,"rateLimitType":"five_hour","utilization":0.92,"isUsingOverage":false},"uuid":"u","session_id":"s"}),
    ) else {
        panic!()
    };
    assert_eq!(n.source_type, "rate_limit_event");
    assert_eq!(
        n.detail,
        Some(NoticeDetail::RateLimit(RateLimit {
            status: "allowed_warning".into(),
            resets_at: Some(1_763_913_600),
            rate_limit_type: Some("five_hour".into()),
            utilization: Some(0.92),
            is_using_overage: Some(false),
        }))
    );
    let Event::SystemNotice(n) = one(
        "2.1.330",
        json!({"type":"system","subtype":"compact_boundary","compact_metadata":{"trigger":"manual","pre_tokens":51234,"post_tokens":"812"},"uuid":"u","session_id":"s"}),
    ) else {
        panic!()
    };
    assert_eq!(
        n.detail,
        Some(NoticeDetail::CompactBoundary(CompactBoundary {
            trigger: Some("manual".into()),
            pre_tokens: Some(51_234),
            post_tokens: Some(812),
        }))
    );
    // 1.0.x knows compact_boundary too.
    let Event::SystemNotice(n) = one(
        "1.0.128",
        json!({"type":"system","subtype":"compact_boundary","compact_metadata":{"trigger":"auto","pre_tokens":9}}),
    ) else {
        panic!()
    };
    assert!(matches!(
        n.detail,
        Some(NoticeDetail::CompactBoundary(CompactBoundary {
            pre_tokens: Some(9),
            ..
        }))
    ));
}

#[test]
fn malformed_typed_notices_stay_plain_and_never_guess() {
    for line in [
        json!({"type":"system","subtype":"task_started"}),
        json!({"type":"system","subtype":"task_started","task_id":7}),
        json!({"type":"system","subtype":"task_notification","task_id":"t"}),
        json!({"type":"rate_limit_event"}),
        json!({"type":"rate_limit_event","rate_limit_info":"soon"}),
        json!({"type":"rate_limit_event","rate_limit_info":{"resetsAt":1}}),
        json!({"type":"command_lifecycle","state":"started"}),
        json!({"type":"command_lifecycle","command_uuid":"u","state":7}),
    ] {
        let Event::SystemNotice(n) = one("2.1.330", line.clone()) else {
            panic!("{line}")
        };
        assert_eq!(n.detail, None, "{line}");
        assert_eq!(n.fields.to_value().unwrap(), line);
    }
    // Odd types read leniently: numbers as strings, a wrong-typed usage ignored.
    let Event::SystemNotice(n) = one(
        "2.1.330",
        json!({"type":"system","subtype":"task_progress","task_id":"t","usage":"lots","description":["x"]}),
    ) else {
        panic!()
    };
    assert_eq!(
        n.detail,
        Some(NoticeDetail::TaskProgress(TaskProgress {
            task_id: "t".into(),
            ..Default::default()
        }))
    );
    // modelUsage that is not an object of objects gives no per-model usage.
    let Event::TurnResult(r) = one(
        "2.1.330",
        json!({"type":"result","subtype":"success","is_error":false,"modelUsage":[1,2]}),
    ) else {
        panic!()
    };
    assert!(r.models().is_empty());
    let Event::TurnResult(r) = one(
        "2.1.330",
        json!({"type":"result","subtype":"success","is_error":false,"modelUsage":{"a":1,"b":{"inputTokens":"5","contextWindow":200000}}}),
    ) else {
        panic!()
    };
    let m = r.models();
    assert_eq!(m.len(), 1);
    assert_eq!(
        (m[0].model.as_str(), m[0].input_tokens, m[0].context_window),
        ("b", 5, 200_000)
    );
}

/// `command_lifecycle` (2.1.330, for user messages sent with a `uuid`; its shape as the
/// release wrote it in a daemon test's log) is typed on 2.1.x; 2.0.x does not know it and
/// keeps it whole as Unknown.
#[test]
fn message_lifecycle_is_typed_on_2_1() {
    let line = json!({"type":"command_lifecycle","command_uuid":"f116060a-7900-430d-b0f8-991c512ad2aa","state":"completed","uuid":"1459da26-433f-4175-ac42-22bda0d4320f","session_id":"536dfad8-2195-4d87-8394-5161c9274234"});
    let Event::SystemNotice(n) = one("2.1.330", line.clone()) else {
        panic!("not a notice")
    };
    assert_eq!(n.source_type, "command_lifecycle");
    assert_eq!(
        n.detail,
        Some(NoticeDetail::MessageLifecycle(MessageLifecycle {
            message_id: "f116060a-7900-430d-b0f8-991c512ad2aa".into(),
            state: "completed".into(),
        }))
    );
    assert_eq!(n.fields.to_value().unwrap(), line);
    let e = Event::SystemNotice(n);
    let back: Event = serde_json::from_slice(&serde_json::to_vec(&e).unwrap()).unwrap();
    assert_eq!(back, e, "stored and read back");
    let Event::Unknown(u) = one("2.0.77", line) else {
        panic!("2.0.x does not know command_lifecycle")
    };
    assert_eq!(u.message_type, "command_lifecycle");
}

/// `structured_output` of a result (sessions with `--json-schema`) is kept verbatim; `null`
/// or absent is none.
#[test]
fn structured_output_of_a_result() {
    let Event::TurnResult(r) = one(
        "2.1.330",
        json!({"type":"result","subtype":"success","is_error":false,"result":"","structured_output":{"answer":"4","n":[1,2]}}),
    ) else {
        panic!()
    };
    let out = r.structured_output.as_ref().expect("structured output");
    assert_eq!(out.to_value().unwrap(), json!({"answer":"4","n":[1,2]}));
    let e = Event::TurnResult(r);
    let back: Event = serde_json::from_slice(&serde_json::to_vec(&e).unwrap()).unwrap();
    assert_eq!(back, e, "stored and read back");
    for line in [
        json!({"type":"result","subtype":"success","is_error":false,"structured_output":null}),
        json!({"type":"result","subtype":"success","is_error":false}),
    ] {
        let Event::TurnResult(r) = one("2.1.330", line.clone()) else {
            panic!("{line}")
        };
        assert_eq!(r.structured_output, None, "{line}");
    }
}

/// A typed notice survives serde as stored (what replay reads back).
#[test]
fn typed_notices_round_trip_through_serde() {
    for e in recorded("2.1.330", "subagent")
        .into_iter()
        .chain(recorded("2.1.330", "interrupt"))
    {
        let bytes = serde_json::to_vec(&e).unwrap();
        let back: Event = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(back, e);
    }
}

/// `system/elicitation_complete`, as 2.1.332 wrote it for a URL elicitation its MCP server
/// reported done: typed, and a plain notice without its id (never a guess).
#[test]
fn elicitation_complete_is_typed_on_2_1() {
    let Event::SystemNotice(n) = one(
        "2.1.332",
        json!({"type":"system","subtype":"elicitation_complete","mcp_server_name":"u","elicitation_id":"E-42","uuid":"02ba9a0c-9dc8-4d02-8e5e-1185dfd8bcbf","session_id":"bd59d969-3cd2-4270-8302-d877a56ec14e"}),
    ) else {
        panic!()
    };
    assert_eq!(
        n.detail,
        Some(NoticeDetail::ElicitationComplete(ElicitationComplete {
            mcp_server_name: Some("u".into()),
            elicitation_id: "E-42".into(),
        }))
    );
    let Event::SystemNotice(n) = one(
        "2.1.332",
        json!({"type":"system","subtype":"elicitation_complete","mcp_server_name":"u"}),
    ) else {
        panic!()
    };
    assert_eq!(n.detail, None);
}

/// The hook lifecycle as 2.1.332 wrote it with `--include-hook-events` (a settings shell
/// hook on PostToolUse), and 2.0.77's SessionStart `hook_response` (no `hook_id`, no
/// outcome): typed; without `hook_event` a plain notice.
#[test]
fn hook_activity_is_typed() {
    let detail = |v: &str, j: serde_json::Value| {
        let Event::SystemNotice(n) = one(v, j) else {
            panic!()
        };
        n.detail
    };
    assert_eq!(
        detail(
            "2.1.332",
            json!({"type":"system","subtype":"hook_started","hook_id":"a721","hook_name":"PostToolUse:Bash","hook_event":"PostToolUse","uuid":"4cac97a0-c37a-4ec0-bd05-fc0ece83e39e","session_id":"c570eef3-b2f0-4eda-af89-433f7fd493d7"})
        ),
        Some(NoticeDetail::HookActivity(HookActivity {
            phase: "started".into(),
            hook_id: Some("a721".into()),
            hook_name: Some("PostToolUse:Bash".into()),
            hook_event: "PostToolUse".into(),
            ..Default::default()
        }))
    );
    assert_eq!(
        detail(
            "2.1.332",
            json!({"type":"system","subtype":"hook_progress","hook_id":"a721","hook_name":"PostToolUse:Bash","hook_event":"PostToolUse","stdout":"post-out\n","stderr":"","output":"post-out\n","uuid":"c14ef342-212d-4e86-8225-40264f0b942d","session_id":"c570eef3"})
        ),
        Some(NoticeDetail::HookActivity(HookActivity {
            phase: "progress".into(),
            hook_id: Some("a721".into()),
            hook_name: Some("PostToolUse:Bash".into()),
            hook_event: "PostToolUse".into(),
            stdout: Some("post-out\n".into()),
            stderr: Some(String::new()),
            output: Some("post-out\n".into()),
            ..Default::default()
        }))
    );
    assert_eq!(
        detail(
            "2.1.332",
            json!({"type":"system","subtype":"hook_response","hook_id":"eb6d","hook_name":"UserPromptSubmit","hook_event":"UserPromptSubmit","output":"","stdout":"","stderr":"","exit_code":2,"outcome":"error","uuid":"04c21e49-d3ec-4a4d-a55f-2c52bd8a6949","session_id":"135f2a89"})
        ),
        Some(NoticeDetail::HookActivity(HookActivity {
            phase: "response".into(),
            hook_id: Some("eb6d".into()),
            hook_name: Some("UserPromptSubmit".into()),
            hook_event: "UserPromptSubmit".into(),
            stdout: Some(String::new()),
            stderr: Some(String::new()),
            output: Some(String::new()),
            exit_code: Some(2),
            outcome: Some("error".into()),
        }))
    );
    assert_eq!(
        detail(
            "2.0.77",
            json!({"type":"system","subtype":"hook_response","session_id":"s","uuid":"u","hook_name":"SessionStart:startup","hook_event":"SessionStart","stdout":"hi\n","stderr":"","exit_code":0})
        ),
        Some(NoticeDetail::HookActivity(HookActivity {
            phase: "response".into(),
            hook_name: Some("SessionStart:startup".into()),
            hook_event: "SessionStart".into(),
            stdout: Some("hi\n".into()),
            stderr: Some(String::new()),
            exit_code: Some(0),
            ..Default::default()
        }))
    );
    // A fractional or huge exit code is not a code; no hook_event: no detail.
    let Some(NoticeDetail::HookActivity(h)) = detail(
        "2.1.332",
        json!({"type":"system","subtype":"hook_response","hook_event":"Stop","exit_code":1e12}),
    ) else {
        panic!()
    };
    assert_eq!(h.exit_code, None);
    assert_eq!(
        detail(
            "2.1.332",
            json!({"type":"system","subtype":"hook_started","hook_id":"x","hook_name":"Stop"})
        ),
        None
    );
}

/// `system/informational` as 2.1.332 wrote it when a UserPromptSubmit hook exited 2:
/// typed (the extra `prompt_submit_outcome` stays in `fields`), a known type on 2.1; a
/// banner without `content` is a plain notice.
#[test]
fn informational_is_typed_on_2_1() {
    let line = json!({"type":"system","subtype":"informational","content":"UserPromptSubmit operation blocked by hook:\n[exit 2]: No stderr output\n\nOriginal prompt: PROBE","level":"warning","prevent_continuation":true,"prompt_submit_outcome":{"kind":"blocked_by_hook","prompt_kept":false},"uuid":"72ccf5d5-7d5d-4dd5-a340-65478f7bc6ca","session_id":"135f2a89"});
    let Event::SystemNotice(n) = one("2.1.332", line) else {
        panic!()
    };
    assert_eq!(
        n.detail,
        Some(NoticeDetail::Informational(Informational {
            content: "UserPromptSubmit operation blocked by hook:\n[exit 2]: No stderr output\n\nOriginal prompt: PROBE".into(),
            level: Some("warning".into()),
            tool_use_id: None,
            prevent_continuation: true,
            tag: None,
        }))
    );
    assert!(n.fields.get().contains("blocked_by_hook"));
    let Event::SystemNotice(n) = one(
        "2.1.332",
        json!({"type":"system","subtype":"informational","level":"notice","tag":"x"}),
    ) else {
        panic!()
    };
    assert_eq!(n.detail, None);
}

/// `prompt_suggestion` as 2.1.332 wrote it after a session's second turn: typed, a known
/// type on 2.1; without a string `suggestion` a plain notice.
#[test]
fn prompt_suggestion_is_typed_on_2_1() {
    let Event::SystemNotice(n) = one(
        "2.1.332",
        json!({"type":"prompt_suggestion","suggestion":"run the tests","uuid":"3f8cd011-1bdf-4b0f-8e70-6a7e9d60c6d2","session_id":"1004e7fa"}),
    ) else {
        panic!()
    };
    assert_eq!(n.source_type, "prompt_suggestion");
    assert_eq!(
        n.detail,
        Some(NoticeDetail::PromptSuggestion(PromptSuggestion {
            suggestion: "run the tests".into()
        }))
    );
    let Event::SystemNotice(n) = one(
        "2.1.332",
        json!({"type":"prompt_suggestion","suggestion":7}),
    ) else {
        panic!()
    };
    assert_eq!(n.detail, None);
}
