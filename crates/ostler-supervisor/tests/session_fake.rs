//! The session process machinery against fake CLIs (shell scripts): environment, stop
//! escalation, crash reports, the stall watchdog, dropped responders, backpressure and the
//! per-line cap. Fast: no node start-up.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

#[path = "common/procs.rs"]
mod procs;

use procs::group_alive;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ostler_protocol::Event;
use ostler_protocol::outbound::UserContent;
use ostler_supervisor::{
    Installation, NO_DECISION, ProcessEvent, SessionProcess, SpawnOptions, SupervisorOptions,
};
use tokio::sync::mpsc;

fn guard() -> Duration {
    ostler_testkit::timeouts::guard()
}

fn fake(dir: &Path, body: &str) -> Installation {
    let p = dir.join("claude");
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut inst = Installation::assume(p, semver::Version::new(2, 1, 330), None);
    // These shell fakes script stdin line by line: no `initialize` at spawn for them.
    inst.capabilities.control.insert(
        "initialize".into(),
        ostler_supervisor::compat::ControlSupport::NoAnswer,
    );
    inst
}

fn spawn_opts(cwd: &Path) -> SpawnOptions {
    SpawnOptions {
        cwd: cwd.to_path_buf(),
        log_id: "fake".into(),
        ..SpawnOptions::default()
    }
}

fn sup() -> SupervisorOptions {
    SupervisorOptions {
        stop_grace: ostler_testkit::timeouts::secs(5),
        term_grace: ostler_testkit::timeouts::secs(5),
        stall_after: None,
        ..SupervisorOptions::default()
    }
}

async fn next(rx: &mut mpsc::Receiver<ProcessEvent>) -> ProcessEvent {
    tokio::time::timeout(guard(), rx.recv())
        .await
        .expect("no event within the guard")
        .expect("channel closed before Exited")
}

async fn exited(rx: &mut mpsc::Receiver<ProcessEvent>) -> ostler_supervisor::ExitInfo {
    loop {
        if let ProcessEvent::Exited(e) = next(rx).await {
            return e;
        }
    }
}

fn read(p: PathBuf) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

#[tokio::test]
async fn environment_is_allowlisted_and_scrubbed_and_no_prompt_on_the_command_line() {
    let d = tempfile::tempdir().unwrap();
    let inst = fake(
        d.path(),
        "env > env.txt; echo \"$@\" > args.txt; cat > /dev/null",
    );
    let mut o = spawn_opts(d.path());
    o.env = vec![
        ("ANTHROPIC_BASE_URL".into(), "http://127.0.0.1:1".into()),
        ("SESSION_ONLY".into(), "yes".into()),
    ];
    o.cli.model = Some("claude-test".into());
    o.cli.allowed_tools = vec!["Bash(git log:*)".into(), "Read".into()];
    o.cli.permission_mode = Some("plan".into());
    // cargo sets CARGO_* variables for the test process: use them as "inherited" ones.
    let mut s = sup();
    s.env_allowlist = vec![
        "PATH".into(),
        "CARGO_PKG_*".into(),
        "CARGO_MANIFEST_DIR".into(),
    ];
    s.scrub = vec!["CARGO_MANIFEST_DIR".into()];
    let (proc, mut rx) = SessionProcess::spawn(&inst, o, s).await.unwrap();
    proc.send_user(UserContent::Text("SECRET-PROMPT".into()))
        .await
        .unwrap();
    let exit = proc.stop().await;
    assert!(exit.success(), "{exit:?}");
    assert_eq!(exited(&mut rx).await, exit);
    let env = read(d.path().join("env.txt"));
    let has = |k: &str| env.lines().any(|l| l.starts_with(&format!("{k}=")));
    assert!(has("PATH"));
    assert!(has("CARGO_PKG_NAME"), "{env}");
    assert!(
        !has("CARGO_MANIFEST_DIR"),
        "scrubbed variable passed: {env}"
    );
    assert!(!has("CARGO"), "not allowlisted: {env}");
    assert!(env.contains("ANTHROPIC_BASE_URL=http://127.0.0.1:1"));
    assert!(env.contains("SESSION_ONLY=yes"));
    let args = read(d.path().join("args.txt"));
    assert!(!args.contains("SECRET-PROMPT"), "{args}");
    assert!(args.contains("--permission-prompt-tool stdio"), "{args}");
    assert!(args.contains("--model claude-test"), "{args}");
    assert!(args.contains("--permission-mode plan"), "{args}");
    assert!(
        args.contains("--allowedTools Bash(git log:*) Read"),
        "{args}"
    );
}

#[test]
fn default_env_allowlist_passes_api_settings_and_scrubs_markers() {
    let inherited = [
        ("ANTHROPIC_BASE_URL", "http://127.0.0.1:9999"),
        ("ANTHROPIC_AUTH_TOKEN", "t"),
        ("HTTPS_PROXY", "http://proxy:3128"),
        ("CLAUDECODE", "1"),
        ("CLAUDE_CODE_ENTRYPOINT", "cli"),
        ("OSTLER_TOKEN", "daemon-secret"),
        ("AWS_PROFILE", "p"),
    ]
    .map(|(k, v)| (k.into(), v.into()));
    let s = SupervisorOptions::default();
    let env = ostler_supervisor::env::build_env(inherited, &s.env_allowlist, &s.scrub, &[]);
    let names: Vec<String> = env
        .iter()
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .collect();
    for k in [
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_AUTH_TOKEN",
        "HTTPS_PROXY",
        "AWS_PROFILE",
    ] {
        assert!(names.iter().any(|n| n == k), "{k} not passed: {names:?}");
    }
    for k in ["CLAUDECODE", "CLAUDE_CODE_ENTRYPOINT", "OSTLER_TOKEN"] {
        assert!(!names.iter().any(|n| n == k), "{k} leaked: {names:?}");
    }
}

#[tokio::test]
async fn stop_escalates_to_sigterm_then_sigkill_and_kills_the_group() {
    let d = tempfile::tempdir().unwrap();
    // Ignores stdin EOF and SIGTERM; has a child in its group.
    let inst = fake(
        d.path(),
        "trap '' TERM\nsleep 300 &\necho $! > child.pid\necho '{\"type\":\"keep_alive\"}'\nwhile :; do sleep 1; done",
    );
    let mut s = sup();
    s.stop_grace = Duration::from_millis(200);
    s.term_grace = Duration::from_millis(200);
    let (proc, mut rx) = SessionProcess::spawn(&inst, spawn_opts(d.path()), s)
        .await
        .unwrap();
    let pid = proc.pid();
    // The script announces (keep_alive) once its child is started and its pid written.
    assert!(matches!(next(&mut rx).await, ProcessEvent::Line(_)));
    let child_pid: u32 = read(d.path().join("child.pid")).trim().parse().unwrap();
    let exit = proc.stop().await;
    assert_eq!(exit.facts.signal, Some(9), "{exit:?}");
    assert!(exit.requested);
    assert!(!group_alive(pid), "group survived");
    assert!(
        std::fs::read_to_string(format!("/proc/{child_pid}/stat"))
            .map(|s| s.split_whitespace().nth(2) == Some("Z"))
            .unwrap_or(true),
        "child {child_pid} survived"
    );
    assert_eq!(exited(&mut rx).await, exit);
}

#[tokio::test]
async fn crash_is_reported_with_code_and_stderr_tail() {
    let d = tempfile::tempdir().unwrap();
    let inst = fake(
        d.path(),
        "read line\necho 'first stderr line' >&2\necho 'fatal: boom' >&2\nexit 3",
    );
    let mut s = sup();
    s.stderr_tail_bytes = 12;
    let (proc, mut rx) = SessionProcess::spawn(&inst, spawn_opts(d.path()), s)
        .await
        .unwrap();
    proc.send_user(UserContent::Text("go".into()))
        .await
        .unwrap();
    let exit = exited(&mut rx).await;
    assert_eq!(exit.facts.code, Some(3));
    assert_eq!(exit.facts.signal, None);
    assert!(!exit.requested);
    assert_eq!(exit.stderr_tail, "fatal: boom\n", "bounded tail");
    assert!(rx.recv().await.is_none(), "Exited is the last event");
    // Sending to a dead process is a typed error.
    assert!(matches!(
        proc.send_user(UserContent::Text("x".into())).await,
        Err(ostler_supervisor::Error::ProcessGone)
    ));
}

#[tokio::test]
async fn stall_is_reported_only_while_a_turn_runs_without_an_open_prompt() {
    let d = tempfile::tempdir().unwrap();
    let req = r#"{"type":"control_request","request_id":"req-1","request":{"subtype":"can_use_tool","tool_name":"Bash","input":{"command":"touch x"},"tool_use_id":"t1"}}"#;
    let inst = fake(
        d.path(),
        &format!("read line\necho '{req}'\nread answer\necho \"$answer\" > answer.json\nsleep 300"),
    );
    let mut s = sup();
    let stall = Duration::from_millis(300);
    s.stall_after = Some(stall);
    let (proc, mut rx) = SessionProcess::spawn(&inst, spawn_opts(d.path()), s)
        .await
        .unwrap();
    // No turn yet: silence is not a stall.
    assert!(
        tokio::time::timeout(stall * 3, rx.recv()).await.is_err(),
        "event before any turn"
    );
    proc.send_user(UserContent::Text("go".into()))
        .await
        .unwrap();
    let responder = loop {
        match next(&mut rx).await {
            ProcessEvent::Line(mut l) if !l.responders.is_empty() => break l.responders.remove(0),
            ProcessEvent::Stall { .. } => panic!("stall before the prompt"),
            _ => {}
        }
    };
    // A permission prompt is open: waiting for a human is not a stall.
    assert!(
        tokio::time::timeout(stall * 3, rx.recv()).await.is_err(),
        "event while the prompt is open"
    );
    assert_eq!(proc.open_requests(), 1);
    // Dropping the responder answers "no decision" (deny for can_use_tool).
    drop(responder);
    assert_eq!(proc.open_requests(), 0);
    match next(&mut rx).await {
        ProcessEvent::Stall { idle_for } => assert!(idle_for >= stall),
        other => panic!("expected a stall, got {other:?}"),
    }
    let answer: serde_json::Value =
        serde_json::from_str(&read(d.path().join("answer.json"))).unwrap();
    assert_eq!(answer["type"], "control_response");
    assert_eq!(answer["response"]["request_id"], "req-1");
    assert_eq!(answer["response"]["response"]["behavior"], "deny");
    assert_eq!(answer["response"]["response"]["message"], NO_DECISION);
    let pid = proc.pid();
    drop(proc);
    // The last handle is gone: the process is killed.
    let exit = exited(&mut rx).await;
    assert!(exit.requested);
    assert_eq!(exit.facts.signal, Some(9));
    assert!(!group_alive(pid));
}

#[tokio::test]
async fn slow_consumer_loses_nothing() {
    let d = tempfile::tempdir().unwrap();
    let inst = fake(
        d.path(),
        r#"i=0; while [ $i -lt 3000 ]; do echo "{\"type\":\"keep_alive\",\"n\":$i}"; i=$((i+1)); done; echo 'not json at all'; echo '{"type":"brand_new","x":1}'; cat > /dev/null"#,
    );
    let mut s = sup();
    s.event_buffer = 2;
    let (proc, mut rx) = SessionProcess::spawn(&inst, spawn_opts(d.path()), s)
        .await
        .unwrap();
    let mut n = 0u32;
    let mut last_kinds = Vec::new();
    while n < 3002 {
        if let ProcessEvent::Line(l) = next(&mut rx).await {
            if n < 3000 {
                let raw = String::from_utf8_lossy(&l.decoded.raw).into_owned();
                assert!(
                    raw.contains(&format!("\"n\":{n}}}")),
                    "out of order: {raw} at {n}"
                );
            } else {
                last_kinds.push(l.events().iter().map(|e| e.kind()).collect::<Vec<_>>());
            }
            n += 1;
        }
    }
    assert_eq!(last_kinds, vec![vec!["diagnostic"], vec!["unknown"]]);
    proc.stop().await;
}

#[tokio::test]
async fn oversized_line_is_capped_and_the_stream_goes_on() {
    let d = tempfile::tempdir().unwrap();
    let inst = fake(
        d.path(),
        r#"printf '{"type":"user","session_id":"s1","message":{"content":"'; head -c 3000000 /dev/zero | tr '\0' 'a'; printf '"}}\n'; echo '{"type":"keep_alive"}'; cat > /dev/null"#,
    );
    let mut s = sup();
    s.max_payload_bytes = 1 << 20;
    let (proc, mut rx) = SessionProcess::spawn(&inst, spawn_opts(d.path()), s)
        .await
        .unwrap();
    let first = loop {
        if let ProcessEvent::Line(l) = next(&mut rx).await {
            break l;
        }
    };
    assert!(
        first.decoded.raw.len() <= 1 << 20,
        "{}",
        first.decoded.raw.len()
    );
    match first.events() {
        [Event::Truncated(t)] => {
            assert!(t.original_size > 3_000_000);
            assert_eq!(t.message_type.as_deref(), Some("user"));
        }
        other => panic!("expected Truncated, got {other:?}"),
    }
    let second = loop {
        if let ProcessEvent::Line(l) = next(&mut rx).await {
            break l;
        }
    };
    assert!(matches!(second.events(), [Event::KeepAlive]));
    proc.stop().await;
}

#[tokio::test]
async fn cancelled_request_is_surfaced_and_cannot_be_answered() {
    let d = tempfile::tempdir().unwrap();
    let req = r#"{"type":"control_request","request_id":"req-2","request":{"subtype":"can_use_tool","tool_name":"Write","input":{"file_path":"a"}}}"#;
    let cancel = r#"{"type":"control_cancel_request","request_id":"req-2"}"#;
    let stray = r#"{"type":"control_cancel_request","request_id":"never-sent"}"#;
    let inst = fake(
        d.path(),
        &format!(
            "echo '{req}'\necho '{cancel}'\necho '{stray}'\nread first\necho \"$first\" > first.json\ncat > /dev/null"
        ),
    );
    let (proc, mut rx) = SessionProcess::spawn(&inst, spawn_opts(d.path()), sup())
        .await
        .unwrap();
    // The request line is delivered once: its event and its one responder together.
    let mut line = match next(&mut rx).await {
        ProcessEvent::Line(l) => l,
        other => panic!("expected the request line, got {other:?}"),
    };
    match line.events() {
        [Event::ControlRequest(r)] => assert_eq!(r.request_id, "req-2"),
        other => panic!("expected one control request, got {other:?}"),
    }
    assert!(line.cancelled.is_empty());
    assert_eq!(line.responders.len(), 1);
    let responder = line.responders.remove(0);
    assert_eq!(responder.request_id(), "req-2");
    // The very next event is the cancel line, naming the request it withdrew.
    match next(&mut rx).await {
        ProcessEvent::Line(l) => {
            assert!(matches!(l.events(), [Event::ControlCancel(_)]), "{l:?}");
            assert_eq!(l.cancelled, vec!["req-2".to_string()]);
            assert!(l.responders.is_empty());
        }
        other => panic!("expected the cancel line, got {other:?}"),
    }
    // A cancel of a request that was never open withdraws nothing.
    match next(&mut rx).await {
        ProcessEvent::Line(l) => {
            assert!(matches!(l.events(), [Event::ControlCancel(_)]), "{l:?}");
            assert!(!l.has_control(), "{l:?}");
        }
        other => panic!("expected the stray cancel line, got {other:?}"),
    }
    assert_eq!(proc.open_requests(), 0);
    let r = responder.respond(ostler_protocol::outbound::ResponseBody::Deny {
        message: "too late".into(),
        interrupt: false,
    });
    assert!(
        matches!(r, Err(ostler_supervisor::Error::NotPending(ref id)) if id == "req-2"),
        "{r:?}"
    );
    // Nothing was written for the cancelled request: the first stdin line is our message.
    proc.send_user(UserContent::Text("next".into()))
        .await
        .unwrap();
    proc.stop().await;
    let first: serde_json::Value =
        serde_json::from_str(&read(d.path().join("first.json"))).unwrap();
    assert_eq!(first["type"], "user");
}

#[tokio::test]
async fn bad_spawn_options_are_typed_errors() {
    let d = tempfile::tempdir().unwrap();
    let inst = fake(d.path(), "cat > /dev/null");
    let mut o = spawn_opts(&d.path().join("missing"));
    let e = SessionProcess::spawn(&inst, o.clone(), sup())
        .await
        .unwrap_err();
    assert!(
        matches!(e, ostler_supervisor::Error::InvalidOptions(_)),
        "{e:?}"
    );
    o.cwd = d.path().to_path_buf();
    o.fork_session = true;
    let e = SessionProcess::spawn(&inst, o.clone(), sup())
        .await
        .unwrap_err();
    assert!(
        matches!(e, ostler_supervisor::Error::InvalidOptions(_)),
        "{e:?}"
    );
    // A release without --fork-session refuses a fork (capabilities, not version numbers).
    let old = Installation::assume(inst.path.clone(), semver::Version::new(1, 0, 117), None);
    o.resume = Some("a-session".into());
    let e = SessionProcess::spawn(&old, o.clone(), sup())
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            ostler_supervisor::Error::Unsupported {
                flag: "--fork-session",
                ..
            }
        ),
        "{e:?}"
    );
    // ... and runs without partial messages, which it lacks.
    let older = Installation::assume(inst.path.clone(), semver::Version::new(1, 0, 108), None);
    o.fork_session = false;
    o.include_partial_messages = true;
    let args = ostler_supervisor::session::session_args(&older, &o).unwrap();
    assert!(!args.iter().any(|a| a == "--include-partial-messages"));
    assert!(
        args.windows(2)
            .any(|w| w[0] == "--resume" && w[1] == "a-session")
    );
    // Too old to run at all.
    let ancient = Installation::assume(inst.path.clone(), semver::Version::new(1, 0, 58), None);
    let e = SessionProcess::spawn(&ancient, o, sup()).await.unwrap_err();
    assert!(
        matches!(e, ostler_supervisor::Error::Incompatible { .. }),
        "{e:?}"
    );
}

/// A CLI that writes 100,000 non-JSON lines cannot turn them into 100,000 events: a few
/// pass, the rest arrive as summaries that count them; JSON lines after the junk still come.
#[tokio::test]
async fn junk_output_is_coalesced_not_delivered_line_by_line() {
    let d = tempfile::tempdir().unwrap();
    let inst = fake(
        d.path(),
        r#"yes x | head -n 100000
echo '{"type":"system","subtype":"init","session_id":"s1","tools":[],"model":"m","cwd":"/"}'
cat > /dev/null"#,
    );
    let (proc, mut rx) = SessionProcess::spawn(&inst, spawn_opts(d.path()), sup())
        .await
        .unwrap();
    let mut diagnostics = 0u64;
    let mut counted = 0u64;
    loop {
        match next(&mut rx).await {
            ProcessEvent::Line(l) => {
                for e in l.events() {
                    match e {
                        Event::Diagnostic(d) => {
                            diagnostics += 1;
                            if let Some(n) = d
                                .message
                                .split_whitespace()
                                .next()
                                .and_then(|n| n.parse::<u64>().ok())
                            {
                                counted += n;
                            } else {
                                counted += 1;
                            }
                        }
                        Event::SessionStarted(_) => {
                            assert!(diagnostics <= 200, "{diagnostics} junk events delivered");
                            assert_eq!(counted, 100_000, "every junk line is accounted for");
                            proc.stop().await;
                            return;
                        }
                        _ => {}
                    }
                }
            }
            ProcessEvent::Exited(e) => panic!("exited before the init line: {e:?}"),
            _ => {}
        }
    }
}
