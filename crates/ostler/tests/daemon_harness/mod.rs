//! Harness for the daemon's gRPC-level end-to-end tests (`tests/daemon_*.rs`): the real
//! `ostler serve` binary as a child process (so it can be SIGKILLed and restarted on the
//! same store), the real Claude Code CLI (pinned releases), the in-process fake model
//! server, and the generated tonic clients.
//!
//! Readiness is an event: the daemon's "ostler daemon ready" log line, read from its
//! stderr as it is written; the address comes from `--ready-file`.
#![allow(dead_code)]
#![allow(clippy::disallowed_methods)] // tests spawn the ostler binary under test (and kill(1))
#![allow(clippy::unwrap_used)] // test helpers: a failure should panic with the error

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use ostler_proto::v1 as pb;
use ostler_proto::v1::daemon_service_client::DaemonServiceClient;
use ostler_proto::v1::session_service_client::SessionServiceClient;
use ostler_testkit::{FakeModelServer, Scenario};
use tonic::transport::Channel;

pub const OSTLER: &str = env!("CARGO_BIN_EXE_ostler");

/// The pinned releases the acceptance tests run against.
pub const OLD: &str = "1.0.128";
pub const NEW: &str = "2.1.330";

/// Guard against a wedged test; never used to wait for something to happen.
pub const GUARD: Duration = Duration::from_secs(90);

/// The fake model's script shared by the daemon tests.
pub const SCENARIO: &str = r#"
default_text = "OK."

[[model]]
name = "model switched"
when = { last_user_text_contains = "Which model", model_contains = "opus-test", stream = true }
blocks = [{ type = "text", text = "Answer from opus-test." }]

# Rules that must win when a release merges an interrupted prompt into the next one.
[[model]]
name = "still there"
when = { last_user_text_contains = "Are you still there", stream = true }
blocks = [{ type = "text", text = "Yes, still here." }]

[[model]]
name = "recall"
when = { last_user_text_contains = "What was the word", messages_contain = "Remember the word PINEAPPLE", stream = true }
blocks = [{ type = "text", text = "The word was PINEAPPLE." }]

[[model]]
name = "touch"
when = { last_user_text_contains = "Create the file allowed.txt", stream = true }
blocks = [
  { type = "text", text = "I will create the file." },
  { type = "tool_use", id = "toolu_touch_1", name = "Bash", input = { command = "touch allowed.txt", description = "Create allowed.txt" } },
]

[[model]]
name = "after touch"
when = { tool_result_for = "toolu_touch_1", stream = true }
blocks = [{ type = "text", text = "Created allowed.txt." }]

# A tool that leaves its CLI's process group (its own session) and outlives the tool call.
[[model]]
name = "sleeper"
when = { last_user_text_contains = "Start the background sleeper", stream = true }
blocks = [
  { type = "tool_use", id = "toolu_sleeper_1", name = "Bash", input = { command = "setsid sh -c 'echo $$ > sleeper.tmp; mv sleeper.tmp sleeper.pid; exec sleep 300' </dev/null >/dev/null 2>&1 & while [ ! -s sleeper.pid ]; do sleep 0.05; done", description = "Start a background sleeper" } },
]

[[model]]
name = "after sleeper"
when = { tool_result_for = "toolu_sleeper_1", stream = true }
blocks = [{ type = "text", text = "The sleeper runs." }]

[[model]]
name = "ask"
when = { last_user_text_contains = "Ask me which database", stream = true }
blocks = [
  { type = "tool_use", id = "toolu_ask_1", name = "AskUserQuestion", input = { questions = [
    { question = "Which database should I use?", header = "Database", multiSelect = false, options = [
      { label = "SQLite", description = "Embedded, one file" },
      { label = "PostgreSQL", description = "A server" },
    ] },
  ] } },
]

[[model]]
name = "after ask"
when = { tool_result_for = "toolu_ask_1", stream = true }
blocks = [{ type = "text", text = "Thanks, I will use your choice." }]

[[model]]
name = "slow story"
when = { last_user_text_contains = "Tell me a long story", stream = true }
chunks = 60
delay_ms = 100
blocks = [{ type = "text", text = "Once upon a time there was a daemon that kept many sessions alive, and every one of them streamed its answers slowly, delta after delta, until someone pressed stop." }]

[[model]]
name = "remember"
when = { last_user_text_contains = "Remember the word", stream = true }
chunks = 3
blocks = [{ type = "text", text = "I will remember PINEAPPLE." }]

[[model]]
name = "large"
when = { last_user_text_contains = "Give me a large answer", stream = true }
chunks = 20
blocks = [{ type = "text", text = "0123456789 abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ\n", repeat = 6000 }]

[[model]]
name = "hello"
when = { last_user_text_contains = "Say hello", stream = true }
blocks = [{ type = "text", text = "Hello from the fake model!" }]
"#;

/// The `claude` binary of a pinned release: `$OSTLER_CLAUDE_CACHE`, the machine's
/// pre-installed `/tmp/cc`, or the test kit's cache (installed with npm when missing).
pub fn claude_binary(version: &str) -> PathBuf {
    let candidates: Vec<PathBuf> = match std::env::var_os("OSTLER_CLAUDE_CACHE") {
        Some(v) if !v.is_empty() => vec![PathBuf::from(v)],
        _ => vec![
            PathBuf::from("/tmp/cc"),
            ostler_testkit::releases::default_cache_dir(),
        ],
    };
    for c in &candidates {
        if ostler_testkit::releases::binary_path(version, c).exists()
            && let Ok(p) = ostler_testkit::releases::ensure(version, c)
        {
            return p;
        }
    }
    let last = candidates.last().cloned().unwrap_or_default();
    ostler_testkit::releases::ensure(version, &last)
        .unwrap_or_else(|e| panic!("installing Claude Code {version}: {e}"))
}

/// Everything that outlives one daemon process: directories, the store, the fake model.
pub struct World {
    pub release: String,
    pub claude: PathBuf,
    pub fake: FakeModelServer,
    pub dir: tempfile::TempDir,
    pub home: PathBuf,
    pub work: PathBuf,
    pub store: PathBuf,
}

impl World {
    pub async fn new(release: &str) -> Self {
        let claude = tokio::task::spawn_blocking({
            let r = release.to_owned();
            move || claude_binary(&r)
        })
        .await
        .unwrap();
        let scenario = Scenario::from_toml("daemon_e2e", SCENARIO).expect("scenario");
        let fake = FakeModelServer::start(scenario).await.expect("fake model");
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let work = dir.path().join("work");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        let work = std::fs::canonicalize(&work).unwrap();
        let store = dir.path().join("data").join("ostler.db");
        Self {
            release: release.to_owned(),
            claude,
            fake,
            dir,
            home,
            work,
            store,
        }
    }

    /// Start a daemon on this world's store.
    pub async fn daemon(&self, extra: &[&str]) -> Daemon {
        let ready = self.dir.path().join(format!(
            "ready-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        let mut cmd = Command::new(OSTLER);
        cmd.arg("serve")
            .arg("--config")
            .arg(self.dir.path().join("no-config.toml"))
            .args(if extra.contains(&"--listen") {
                &["--no-probe"][..]
            } else {
                &["--listen", "127.0.0.1:0", "--no-probe"][..]
            })
            .arg("--ready-file")
            .arg(&ready)
            .arg("--store")
            .arg(&self.store)
            .arg("--claude")
            .arg(&self.claude)
            .arg("--allowed-root")
            .arg(&self.work)
            .args(extra);
        if let Ok(f) = std::env::var("OSTLER_TEST_LOG_FORMAT") {
            cmd.args(["--log-format", &f]);
        }
        std::fs::write(self.dir.path().join("no-config.toml"), "").unwrap();
        Daemon::spawn(cmd, self, ready).await
    }
}

/// A running `ostler serve`.
pub struct Daemon {
    child: Option<Child>,
    pub addr: SocketAddr,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    /// Start `cmd` (an `ostler serve` command line) in `world`'s environment and wait until it
    /// is ready; `ready` is the command's `--ready-file`.
    pub async fn spawn(mut cmd: Command, world: &World, ready: PathBuf) -> Self {
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", &world.home)
            .env("ANTHROPIC_BASE_URL", world.fake.url())
            .env("ANTHROPIC_API_KEY", "test-key")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("RUST_LOG", "info,ostler_engine=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn ostler serve");
        let (log, lines) = collect_stderr(&mut child);
        let ready_line = tokio::task::spawn_blocking(move || {
            while let Ok(l) = lines.recv_timeout(GUARD) {
                if l.contains("ostler daemon ready") {
                    return true;
                }
            }
            false
        })
        .await
        .unwrap();
        if !ready_line {
            let _ = child.kill();
            panic!(
                "daemon never became ready:\n{}",
                log.lock().unwrap().join("\n")
            );
        }
        let text = std::fs::read_to_string(&ready).expect("ready file written before the log line");
        let addr = text
            .lines()
            .find_map(|l| l.strip_prefix("tcp://"))
            .expect("a tcp listener in the ready file")
            .parse()
            .unwrap();
        Self {
            child: Some(child),
            addr,
            log,
        }
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    pub async fn sessions(&self) -> SessionServiceClient<Channel> {
        SessionServiceClient::new(self.channel().await).max_decoding_message_size(64 << 20)
    }

    pub async fn daemon_client(&self) -> DaemonServiceClient<Channel> {
        DaemonServiceClient::new(self.channel().await)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or_default()
    }

    /// SIGKILL, no chance to clean up.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// SIGTERM and wait for the exit.
    pub async fn terminate(&mut self) -> ExitStatus {
        let mut c = self.child.take().expect("running");
        let st = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
        tokio::task::spawn_blocking(move || c.wait().unwrap())
            .await
            .unwrap()
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // Debugging aid: OSTLER_TEST_DUMP_LOG=1 prints the daemon's log.
        if std::env::var_os("OSTLER_TEST_DUMP_LOG").is_some() {
            eprintln!("--- daemon log\n{}", self.log_text());
        }
    }
}

/// Forward a child's stderr lines into a shared log and a channel.
pub fn collect_stderr(child: &mut Child) -> (Arc<Mutex<Vec<String>>>, mpsc::Receiver<String>) {
    let stderr = child.stderr.take().expect("piped stderr");
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    let l2 = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line.clone());
            l2.lock().unwrap().push(line);
        }
    });
    (log, rx)
}

/// A request carrying the `x-ostler-client` header.
pub fn as_client<T>(client: &str, msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("x-ostler-client", client.parse().unwrap());
    r
}

pub fn text(t: &str) -> Option<pb::MessageContent> {
    Some(pb::MessageContent {
        content: Some(pb::message_content::Content::Text(t.to_owned())),
    })
}

pub type Events = tonic::Streaming<pb::SessionEvent>;

/// Every stored event of a session, from seq 1, without following live.
pub async fn history(
    c: &mut SessionServiceClient<Channel>,
    session_id: &str,
) -> Vec<pb::SessionEvent> {
    let mut replay = c
        .subscribe(pb::SubscribeRequest {
            session_id: session_id.to_owned(),
            after_seq: 0,
            include_partial: false,
            follow: false,
        })
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    while let Some(e) = replay.message().await.unwrap() {
        events.push(e);
    }
    events
}

pub async fn subscribe(
    c: &mut SessionServiceClient<Channel>,
    session_id: &str,
    after_seq: u64,
    include_partial: bool,
) -> Events {
    c.subscribe(pb::SubscribeRequest {
        session_id: session_id.to_owned(),
        after_seq,
        include_partial,
        follow: true,
    })
    .await
    .unwrap()
    .into_inner()
}

/// Reads events until `stop` says so (the matching event is included).
pub async fn read_until(
    events: &mut Events,
    seen: &mut Vec<pb::SessionEvent>,
    what: &str,
    mut stop: impl FnMut(&pb::SessionEvent) -> bool,
) -> pb::SessionEvent {
    let fut = async {
        loop {
            let ev = events
                .message()
                .await
                .unwrap_or_else(|e| panic!("stream failed waiting for {what}: {e}"))
                .unwrap_or_else(|| panic!("stream ended waiting for {what}"));
            seen.push(ev.clone());
            if stop(&ev) {
                return ev;
            }
        }
    };
    match tokio::time::timeout(GUARD, fut).await {
        Ok(ev) => ev,
        Err(_) => panic!(
            "timed out waiting for {what}; saw {:#?}",
            seen.iter().map(describe).collect::<Vec<_>>()
        ),
    }
}

pub fn describe(e: &pb::SessionEvent) -> String {
    use pb::session_event::Payload as P;
    let kind = match &e.payload {
        Some(P::SessionStarted(_)) => "session_started".to_owned(),
        Some(P::UserMessage(u)) => format!("user_message({:?})", u.text),
        Some(P::AssistantBlock(b)) => {
            format!("assistant_block({:?})", b.block.as_ref().map(block_kind))
        }
        Some(P::ToolResult(_)) => "tool_result".to_owned(),
        Some(P::PermissionRequested(p)) => format!("permission_requested({})", p.tool_name),
        Some(P::PermissionResolved(r)) => format!("permission_resolved({:?})", r.resolution()),
        Some(P::QuestionAsked(_)) => "question_asked".to_owned(),
        Some(P::QuestionAnswered(_)) => "question_answered".to_owned(),
        Some(P::TurnCompleted(t)) => format!("turn_completed({})", t.subtype),
        Some(P::StateChanged(s)) => format!("state_changed({:?}->{:?})", s.from(), s.to()),
        Some(P::SystemNotice(n)) => format!("system_notice({}/{})", n.source_type, n.subtype),
        Some(P::ProcessExited(x)) => format!(
            "process_exited({:?}, {:?}, stderr: {})",
            x.exit_code, x.reason, x.stderr_tail
        ),
        Some(P::Diagnostic(d)) => format!("diagnostic({})", d.code),
        Some(P::Unknown(u)) => format!("unknown({})", u.message_type),
        Some(P::PartialDelta(_)) => "partial_delta".to_owned(),
        Some(P::EngineNotice(n)) => format!("engine_notice({})", n.code),
        None => "none".to_owned(),
    };
    format!("#{} {kind}", e.seq)
}

fn block_kind(b: &pb::assistant_block::Block) -> String {
    use pb::assistant_block::Block as B;
    match b {
        B::Text(t) => format!("text {:?}", t.text.chars().take(40).collect::<String>()),
        B::Thinking(_) => "thinking".into(),
        B::ToolUse(t) => format!("tool_use {}", t.name),
        B::RedactedThinking(_) => "redacted".into(),
        B::Other(o) => o.block_type.clone(),
    }
}

pub fn is_turn_completed(e: &pb::SessionEvent) -> bool {
    matches!(
        e.payload,
        Some(pb::session_event::Payload::TurnCompleted(_))
    )
}

pub fn assistant_text(e: &pb::SessionEvent) -> Option<&str> {
    match &e.payload {
        Some(pb::session_event::Payload::AssistantBlock(b)) => match &b.block {
            Some(pb::assistant_block::Block::Text(t)) => Some(&t.text),
            _ => None,
        },
        _ => None,
    }
}

/// Stored seqs of a list of events (partials excluded), checking they are consecutive.
pub fn assert_gap_free(events: &[pb::SessionEvent], from: u64) -> Vec<u64> {
    let seqs: Vec<u64> = events
        .iter()
        .filter(|e| e.seq != 0 && !e.redelivered)
        .map(|e| e.seq)
        .collect();
    for (i, s) in seqs.iter().enumerate() {
        assert_eq!(
            *s,
            from + i as u64,
            "seqs must be consecutive from {from}: {seqs:?}"
        );
    }
    seqs
}

pub async fn create_session(
    c: &mut SessionServiceClient<Channel>,
    work: &Path,
    client: &str,
) -> pb::Session {
    c.create_session(as_client(
        client,
        pb::CreateSessionRequest {
            cwd: work.display().to_string(),
            ..Default::default()
        },
    ))
    .await
    .unwrap()
    .into_inner()
}

pub async fn send(c: &mut SessionServiceClient<Channel>, session_id: &str, t: &str) -> u64 {
    c.send_message(as_client(
        "sender",
        pb::SendMessageRequest {
            session_id: session_id.to_owned(),
            content: text(t),
            client_message_id: String::new(),
        },
    ))
    .await
    .unwrap()
    .into_inner()
    .seq
}
