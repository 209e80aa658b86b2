//! Shared set-up for the real-release tests: a pinned release (installed by the test kit),
//! a hermetic HOME/cwd, and the fake model server.
#![allow(dead_code)]

mod procs;

#[allow(unused_imports)] // not every test crate that shares `common` asserts on groups
pub use procs::group_alive;
use std::path::PathBuf;
use std::time::Duration;

use ostler_protocol::Event;
use ostler_protocol::model::{CanUseTool, CliRequest, TurnResult};
use ostler_protocol::outbound::ResponseBody;
use ostler_supervisor::{
    DiscoverOptions, Installation, Line, ProcessEvent, SpawnOptions, SupervisorOptions, discover,
};
use ostler_testkit::cli::Hermetic;
use ostler_testkit::{FakeModelServer, Scenario};
use tokio::sync::mpsc;

/// Generous guard against a wedged test; never used to wait for something to happen.
pub fn guard() -> Duration {
    ostler_testkit::timeouts::guard()
}

pub const SCENARIO: &str = r#"
description = "supervisor integration tests"
default_text = "ok"

[[model]]
name = "touch-allowed"
when = { last_user_text_contains = "TOUCH-ALLOWED", stream = true }
blocks = [ { type = "tool_use", id = "toolu_allowed_1", name = "Bash", input = { command = "touch allowed.txt", description = "create allowed.txt" } } ]

[[model]]
name = "touch-denied"
when = { last_user_text_contains = "TOUCH-DENIED", stream = true }
blocks = [ { type = "tool_use", id = "toolu_denied_1", name = "Bash", input = { command = "touch denied.txt", description = "create denied.txt" } } ]

[[model]]
name = "after-tool"
when = { last_user_text_contains = "", stream = true, messages_contain = "tool_result" }
blocks = [ { type = "text", text = "tool step finished" } ]

[[model]]
name = "long"
when = { last_user_text_contains = "LONG-ANSWER", stream = true }
chunks = 60
delay_ms = 100
blocks = [ { type = "text", text = "This is a long answer that streams slowly so that it can be interrupted in the middle of it. It goes on and on." } ]

[[model]]
name = "remember"
when = { last_user_text_contains = "REMEMBER", stream = true }
blocks = [ { type = "text", text = "I will remember the word PINEAPPLE-42." } ]
"#;

pub struct Env {
    pub hermetic: Hermetic,
    pub server: FakeModelServer,
    pub inst: Installation,
}

/// The pinned release `version`, installed with the test kit's installer if needed.
pub async fn release(version: &str) -> PathBuf {
    let v = version.to_string();
    tokio::task::spawn_blocking(move || ostler_testkit::releases::installed(&v))
        .await
        .expect("installer task")
        .expect("install release")
}

pub async fn setup(version: &str) -> Env {
    let path = release(version).await;
    let inst = discover(&DiscoverOptions {
        claude_path: Some(path),
        probe_flags: false,
        ..DiscoverOptions::default()
    })
    .await
    .expect("discover");
    assert_eq!(inst.version.to_string(), version);
    let scenario = Scenario::from_toml("supervisor", SCENARIO).expect("scenario");
    let server = FakeModelServer::start(scenario).await.expect("server");
    Env {
        hermetic: Hermetic::new().expect("hermetic"),
        server,
        inst,
    }
}

impl Env {
    pub fn spawn_options(&self, log_id: &str) -> SpawnOptions {
        SpawnOptions {
            cwd: self.hermetic.cwd().to_path_buf(),
            env: vec![
                ("HOME".into(), self.hermetic.home().display().to_string()),
                ("ANTHROPIC_BASE_URL".into(), self.server.url()),
                ("ANTHROPIC_API_KEY".into(), "test".into()),
                (
                    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(),
                    "1".into(),
                ),
            ],
            log_id: log_id.into(),
            ..SpawnOptions::default()
        }
    }

    pub fn supervisor_options(&self) -> SupervisorOptions {
        SupervisorOptions {
            stop_grace: ostler_testkit::timeouts::secs(10),
            control_timeout: ostler_testkit::timeouts::secs(8),
            ..SupervisorOptions::default()
        }
    }
}

/// The next event, failing the test if none arrives within the guard.
pub async fn next(rx: &mut mpsc::Receiver<ProcessEvent>) -> ProcessEvent {
    tokio::time::timeout(guard(), rx.recv())
        .await
        .expect("no event within the guard time")
        .expect("event channel closed before Exited")
}

/// What one turn produced.
#[derive(Debug, Default)]
pub struct Turn {
    pub lines: Vec<Line>,
    pub permission_requests: Vec<CanUseTool>,
    pub result: Option<TurnResult>,
}

impl Turn {
    pub fn events(&self) -> impl Iterator<Item = &Event> {
        self.lines.iter().flat_map(|l| l.events().iter())
    }
}

/// Drive events until a `result`, answering `can_use_tool` with `decide`.
pub async fn run_turn(
    rx: &mut mpsc::Receiver<ProcessEvent>,
    mut decide: impl FnMut(&CanUseTool) -> ResponseBody,
) -> Turn {
    let mut turn = Turn::default();
    loop {
        match next(rx).await {
            ProcessEvent::Line(mut l) => {
                let mut responders = std::mem::take(&mut l.responders).into_iter();
                for e in l.events() {
                    if let Event::ControlRequest(request) = e {
                        let responder = responders.next().expect("one responder per request");
                        match &request.request {
                            CliRequest::CanUseTool(c) => {
                                let body = decide(c);
                                turn.permission_requests.push(c.clone());
                                responder.respond(body).expect("respond");
                            }
                            other => panic!("unexpected control request {other:?}"),
                        }
                    }
                }
                let done = l.events().iter().find_map(|e| match e {
                    Event::TurnResult(r) => Some(r.clone()),
                    _ => None,
                });
                turn.lines.push(l);
                if let Some(r) = done {
                    turn.result = Some(r);
                    return turn;
                }
            }
            ProcessEvent::Exited(e) => panic!("process exited during a turn: {e:?}"),
            ProcessEvent::Stall { .. } => {}
        }
    }
}

pub fn allow(c: &CanUseTool) -> ResponseBody {
    ResponseBody::Allow {
        updated_input: c.input.clone(),
        updated_permissions: None,
    }
}

pub fn deny(_: &CanUseTool) -> ResponseBody {
    ResponseBody::Deny {
        message: "denied by the test".into(),
        interrupt: false,
    }
}

pub fn no_tools(c: &CanUseTool) -> ResponseBody {
    panic!("unexpected permission request for {}", c.tool_name)
}

/// Whether `/proc/<pid>` exists (a zombie counts: it has not been reaped).
pub fn proc_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}
