//! The supervisor against real Claude Code releases (installed by the test kit), talking to
//! the fake model server. Every wait is on an event; timeouts only guard against hangs.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use ostler_protocol::Event;
use ostler_protocol::model::ToolResultContent;
use ostler_protocol::outbound::{OutRequest, UserContent};
use ostler_supervisor::{ControlError, ProcessEvent, SessionProcess};

fn text(s: &str) -> UserContent {
    UserContent::Text(s.to_string())
}

/// Allowed tool runs, denied tool does not, set_model reaches the model, an unknown control
/// request is a typed error, and a graceful stop leaves no process behind.
async fn turns_permissions_model_and_stop(version: &str) {
    let env = setup(version).await;
    let cwd = env.hermetic.cwd().to_path_buf();
    let (proc, mut rx) = SessionProcess::spawn(
        &env.inst,
        env.spawn_options("perm"),
        env.supervisor_options(),
    )
    .await
    .expect("spawn");
    let pid = proc.pid();
    // The prompt is not on the command line.
    assert!(!proc.args().iter().any(|a| a.contains("TOUCH")));

    // initialize went before the first user message, at spawn.
    let init = proc
        .take_initialize()
        .expect("initialize sent at spawn")
        .await
        .expect("initialize task")
        .expect("initialize")
        .expect("initialize payload");
    assert!(proc.take_initialize().is_none(), "taken once");
    assert!(init.get().contains("commands"), "{}", init.get());

    proc.send_user(text("Please run TOUCH-ALLOWED now"))
        .await
        .unwrap();
    let t = run_turn(&mut rx, allow).await;
    assert_eq!(
        t.permission_requests.len(),
        1,
        "{:?}",
        t.permission_requests
    );
    assert_eq!(t.permission_requests[0].tool_name, "Bash");
    let r = t.result.unwrap();
    assert!(!r.is_error, "{r:?}");
    assert!(cwd.join("allowed.txt").exists(), "allowed tool did not run");
    assert!(proc.session_id().is_some());
    let announced = proc.announced_capabilities().expect("init seen");
    assert_eq!(
        announced.is_empty(),
        env.inst.capabilities.announced.is_empty(),
        "init announces what the matrix recorded"
    );

    proc.send_user(text("Please run TOUCH-DENIED now"))
        .await
        .unwrap();
    let t = run_turn(&mut rx, deny).await;
    assert_eq!(t.permission_requests.len(), 1);
    assert!(!cwd.join("denied.txt").exists(), "denied tool ran");
    let denied_result = t.events().find_map(|e| match e {
        Event::ToolResult(r) => Some(r.clone()),
        _ => None,
    });
    let denied_result = denied_result.expect("a tool_result for the denied call");
    assert!(denied_result.is_error);
    if let ToolResultContent::Text(s) = &denied_result.content {
        assert!(s.contains("denied by the test"), "{s}");
    }

    // set_model: the next API request uses the new model.
    proc.request(OutRequest::SetModel(Some("claude-ostler-test-b".into())))
        .await
        .expect("set_model");
    proc.send_user(text("hello after set_model")).await.unwrap();
    let t = run_turn(&mut rx, no_tools).await;
    assert!(t.result.is_some());
    let last = env.server.requests();
    let model = last
        .iter()
        .rev()
        .filter_map(|r| r.body.as_ref())
        .find(|b| b.get("stream").and_then(|s| s.as_bool()) == Some(true))
        .and_then(|b| b.get("model"))
        .and_then(|m| m.as_str())
        .map(str::to_string);
    assert_eq!(model.as_deref(), Some("claude-ostler-test-b"));

    // Several requests in flight at once, each resolved by its own response.
    let (a, b) = tokio::join!(
        proc.request(OutRequest::SetPermissionMode("acceptEdits".into())),
        proc.request(OutRequest::SetPermissionMode("default".into())),
    );
    a.expect("set_permission_mode a");
    b.expect("set_permission_mode b");

    let mcp = proc
        .request(OutRequest::McpStatus)
        .await
        .expect("mcp_status");
    assert!(mcp.expect("payload").get().contains("mcpServers"));

    // set_max_thinking_tokens and an unknown subtype, both in flight at once: 2.x answers
    // (success, and `unsupported_request`); 1.0.x answers neither, which the control
    // timeout turns into a typed error instead of a hang.
    let (thinking, unknown) = tokio::join!(
        proc.request(OutRequest::SetMaxThinkingTokens(Some(2048))),
        proc.request(OutRequest::Other {
            subtype: "ostler_no_such_request".into(),
            fields: Default::default(),
        }),
    );
    let unknown = unknown.unwrap_err();
    if version.starts_with("1.") {
        assert!(
            matches!(thinking, Err(ControlError::Timeout(_))),
            "{thinking:?}"
        );
        assert!(matches!(unknown, ControlError::Timeout(_)), "{unknown:?}");
    } else {
        thinking.expect("set_max_thinking_tokens");
        assert!(
            matches!(unknown, ControlError::Unsupported { .. }),
            "{unknown:?}"
        );
    }

    let exit = proc.stop().await;
    assert!(exit.requested);
    assert!(
        !group_alive(pid),
        "process group {pid} still alive after stop"
    );
    assert!(!proc_exists(pid), "pid {pid} not reaped");
    // Exited is the last event.
    loop {
        match next(&mut rx).await {
            ProcessEvent::Exited(e) => {
                assert_eq!(e, exit);
                break;
            }
            ProcessEvent::Line(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(rx.recv().await.is_none());
}

/// Interrupt in the middle of a streamed answer, then a further turn; then kill -9 from
/// outside is reported with its signal.
async fn interrupt_then_turn_then_crash(version: &str) {
    let env = setup(version).await;
    let mut opts = env.spawn_options("intr");
    opts.include_partial_messages = true;
    let (proc, mut rx) = SessionProcess::spawn(&env.inst, opts, env.supervisor_options())
        .await
        .expect("spawn");
    let pid = proc.pid();
    assert!(
        proc.args()
            .iter()
            .any(|a| a == "--include-partial-messages")
    );

    proc.send_user(text("LONG-ANSWER please")).await.unwrap();
    // Wait for the first text delta: the answer is streaming.
    loop {
        match next(&mut rx).await {
            ProcessEvent::Line(l)
                if l.events()
                    .iter()
                    .any(|e| matches!(e, Event::PartialDelta(_))) =>
            {
                break;
            }
            ProcessEvent::Exited(e) => panic!("exited: {e:?}"),
            _ => {}
        }
    }
    proc.request(OutRequest::Interrupt)
        .await
        .expect("interrupt");
    let t = run_turn(&mut rx, no_tools).await;
    let r = t.result.clone().unwrap();
    eprintln!(
        "interrupted turn ended with {} (is_error {})",
        r.subtype, r.is_error
    );
    let full = "It goes on and on.";
    let got_full_text = t.events().any(|e| match e {
        Event::AssistantBlock(b) => format!("{:?}", b.block).contains(full),
        _ => false,
    });
    assert!(!got_full_text, "the answer was not interrupted");

    proc.send_user(text("a further turn")).await.unwrap();
    let t = run_turn(&mut rx, no_tools).await;
    let r = t.result.unwrap();
    assert_eq!(r.subtype, "success", "{r:?}");

    // Crash: kill -9 from outside (not through the handle).
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).unwrap();
    let exit = loop {
        if let ProcessEvent::Exited(e) = next(&mut rx).await {
            break e;
        }
    };
    assert_eq!(exit.facts.signal, Some(9), "{exit:?}");
    assert_eq!(exit.facts.code, None);
    assert!(!exit.requested);
    assert!(!proc_exists(pid));
    assert_eq!(proc.exit_info(), Some(exit));
    // Requests after the death fail fast.
    assert_eq!(
        proc.request(OutRequest::Interrupt).await.unwrap_err(),
        ControlError::ProcessGone
    );
}

/// `--resume` continues the transcript in a new process; `--fork-session` branches it.
async fn resume(version: &str) {
    let env = setup(version).await;
    let (proc, mut rx) = SessionProcess::spawn(
        &env.inst,
        env.spawn_options("resume-1"),
        env.supervisor_options(),
    )
    .await
    .expect("spawn");
    proc.send_user(text("REMEMBER this")).await.unwrap();
    let t = run_turn(&mut rx, no_tools).await;
    let session_id = t.result.unwrap().session_id.expect("session id");
    let exit = proc.stop().await;
    assert!(exit.requested);

    let mut opts = env.spawn_options("resume-2");
    opts.resume = Some(session_id.clone());
    let (proc2, mut rx2) = SessionProcess::spawn(&env.inst, opts, env.supervisor_options())
        .await
        .expect("spawn resumed");
    assert!(
        proc2
            .args()
            .windows(2)
            .any(|w| w[0] == "--resume" && w[1] == session_id)
    );
    proc2
        .send_user(text("what did you remember?"))
        .await
        .unwrap();
    let t = run_turn(&mut rx2, no_tools).await;
    assert!(t.result.is_some());
    // The model saw the earlier exchange: the resumed transcript was sent.
    let last_stream = env
        .server
        .requests()
        .into_iter()
        .rev()
        .filter_map(|r| r.body)
        .find(|b| b.get("stream").and_then(|s| s.as_bool()) == Some(true))
        .expect("a streaming request");
    let msgs = last_stream["messages"].to_string();
    assert!(
        msgs.contains("PINEAPPLE-42"),
        "resumed transcript missing: {msgs}"
    );
    let pid = proc2.pid();
    proc2.stop().await;
    assert!(!group_alive(pid));

    // --fork-session: the transcript is continued under a new session id.
    let mut opts = env.spawn_options("resume-3");
    opts.resume = Some(session_id.clone());
    opts.fork_session = true;
    let (proc3, mut rx3) = SessionProcess::spawn(&env.inst, opts, env.supervisor_options())
        .await
        .expect("spawn fork");
    assert!(proc3.args().iter().any(|a| a == "--fork-session"));
    proc3.send_user(text("and now in a fork")).await.unwrap();
    let t = run_turn(&mut rx3, no_tools).await;
    let forked = t.result.unwrap().session_id.expect("forked session id");
    assert_ne!(forked, session_id, "fork kept the session id");
    assert_eq!(proc3.session_id().as_deref(), Some(forked.as_str()));
    proc3.stop().await;
}

/// The inline JSON of `--settings` and `--mcp-config` (which can hold secrets: MCP `env`
/// and `headers`, the settings' `env`) never appears on the CLI's command line, which every
/// local user can read; the CLI still applies both (it reads them from `/dev/fd/N`).
async fn option_values_off_the_command_line(version: &str) {
    let env = setup(version).await;
    let mut opts = env.spawn_options("private");
    opts.cli.settings = Some(
        r#"
 {"model":"claude-from-settings","env":{"SETTINGS_SECRET":"SECRET-IN-SETTINGS"}}"#
            .into(),
    );
    opts.cli.mcp_servers = std::collections::BTreeMap::from([(
        "secretive".into(),
        ostler_supervisor::options::McpServer::Stdio {
            command: "/bin/true".into(),
            args: vec![],
            env: std::collections::BTreeMap::from([("TOKEN".into(), "SECRET-IN-MCP-ENV".into())]),
            tuning: Default::default(),
        },
    )]);
    let (proc, mut rx) = SessionProcess::spawn(&env.inst, opts, env.supervisor_options())
        .await
        .expect("spawn");
    // Read at once: a node-based release soon sets its process title, which replaces the
    // arguments there. Right after the spawn the process may still be between the `env`
    // of the script's `#!` line and the `node` it executes: in the middle of an exec the
    // command line reads empty for a moment, so an empty read is taken again.
    let deadline = std::time::Instant::now() + ostler_testkit::timeouts::guard();
    let cmdline = loop {
        let raw = std::fs::read(format!("/proc/{}/cmdline", proc.pid())).unwrap();
        if !raw.is_empty() || std::time::Instant::now() > deadline {
            break String::from_utf8_lossy(&raw).replace('\0', " ");
        }
        std::thread::yield_now();
    };
    assert!(
        !cmdline.contains("SECRET-IN") && cmdline.contains("--mcp-config /dev/fd/"),
        "{cmdline}"
    );
    proc.send_user(text("hello")).await.unwrap();
    let t = run_turn(&mut rx, no_tools).await;
    let started = t
        .events()
        .find_map(|e| match e {
            Event::SessionStarted(s) => Some(s.clone()),
            _ => None,
        })
        .expect("system/init");
    assert_eq!(started.model.as_deref(), Some("claude-from-settings"));
    let servers = started
        .mcp_servers
        .map(|m| m.get().to_owned())
        .unwrap_or_default();
    assert!(servers.contains("secretive"), "{servers}");
    proc.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_0_128_option_values_off_the_command_line() {
    option_values_off_the_command_line("1.0.128").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v2_1_332_option_values_off_the_command_line() {
    option_values_off_the_command_line("2.1.332").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_0_128_turns_permissions_model_and_stop() {
    turns_permissions_model_and_stop("1.0.128").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v2_1_330_turns_permissions_model_and_stop() {
    turns_permissions_model_and_stop("2.1.332").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_0_128_interrupt_then_turn_then_crash() {
    interrupt_then_turn_then_crash("1.0.128").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v2_1_330_interrupt_then_turn_then_crash() {
    interrupt_then_turn_then_crash("2.1.332").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_0_128_resume() {
    resume("1.0.128").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v2_1_330_resume() {
    resume("2.1.332").await;
}
