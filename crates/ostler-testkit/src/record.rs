//! The scenario driver and recorder.
//!
//! Plays a scenario's client script against the real CLI (with the fake model server
//! answering), and writes the recording: NDJSON, first a header line
//! `{"ostler_recording":1,"release":..,"scenario":..,"flags":[..],"unsupported_flags":[..]}`,
//! then one envelope per line in the order the driver saw them:
//! - `{"dir":"ostler","line":<JSON written to stdin>}`
//! - `{"dir":"cli","line":<JSON line from stdout, as emitted>}`
//! - `{"dir":"cli","text":"<non-JSON stdout line>"}`
//! - `{"dir":"meta","event":"exit","code":<exit code or null>}` when a process ended, and
//!   `{"dir":"meta","event":"spawn","flags":[..]}` when a further process started
//!   (`restart`).
//!
//! Lines are normalized (see [`crate::normalize`]) so re-recording is byte-identical.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin};
use tokio::sync::mpsc;

use crate::cli::{self, CliFeatures, CliInvocation, Hermetic};
use crate::normalize::{Normalizer, OSTLER_REQUEST_PREFIX};
use crate::scenario::{Behavior, Scenario, Step};
use crate::server::{FakeModelServer, RecordedRequest};
use crate::{Error, Result};

/// Version of the recording format (header `ostler_recording`).
pub const FORMAT_VERSION: u32 = 1;

/// Options of one recording run.
#[derive(Debug, Clone)]
pub struct RecordOptions {
    /// Release label for the header (e.g. `2.1.330`).
    pub release: String,
    /// The `claude` binary.
    pub binary: PathBuf,
    /// Longest wait for any awaited message (default 90 s scaled by
    /// [`crate::timeouts::scale`], env `OSTLER_AWAIT_TIMEOUT_SECS` unscaled).
    pub await_timeout: Duration,
}

impl RecordOptions {
    pub fn new(release: impl Into<String>, binary: impl Into<PathBuf>) -> Self {
        Self {
            release: release.into(),
            binary: binary.into(),
            await_timeout: std::env::var("OSTLER_AWAIT_TIMEOUT_SECS")
                .ok()
                .and_then(|s| s.parse().ok())
                .map_or_else(|| crate::timeouts::secs(90), Duration::from_secs),
        }
    }
}

/// The outcome of a recording run.
#[derive(Debug)]
pub struct Recording {
    /// The normalized NDJSON text of the recording file (ends with a newline).
    pub text: String,
    /// What the fake model server received.
    pub requests: Vec<RecordedRequest>,
    /// The CLI's stderr (all processes).
    pub stderr: String,
    pub features: CliFeatures,
    /// Flags left out because the release does not have them.
    pub unsupported_flags: Vec<String>,
}

/// Path of a recording: `contracts/claude-code/<release>/<scenario>.ndjson`.
pub fn recording_path(release: &str, scenario: &str) -> PathBuf {
    crate::workspace_root()
        .join("contracts")
        .join("claude-code")
        .join(release)
        .join(format!("{scenario}.ndjson"))
}

enum Entry {
    Ostler(String),
    Cli(String),
    Text(String),
    Exit(Option<i32>),
    Spawn(Vec<String>),
}

enum Out {
    Line(String),
    Eof,
}

struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    rx: mpsc::UnboundedReceiver<Out>,
    eof: bool,
}

struct Driver<'a> {
    opts: &'a RecordOptions,
    scenario: &'a Scenario,
    env: Hermetic,
    server: FakeModelServer,
    features: CliFeatures,
    entries: Vec<Entry>,
    pending: VecDeque<Value>,
    proc: Option<Proc>,
    stderr: Arc<Mutex<String>>,
    session_id: Option<String>,
    tools: Option<Vec<String>>,
    /// The capabilities `system/init` announced (2.1.x; empty before init or without).
    capabilities: Vec<String>,
    /// task ids of `system/task_started` with `is_backgrounded: true`
    background_tasks: Vec<String>,
    /// background tasks whose notification was awaited
    notified: Vec<String>,
    /// interrupts sent without partial messages
    interrupts: usize,
    next_request: usize,
    unsupported: Vec<String>,
    first_flags: Vec<String>,
}

/// Record `scenario` against the CLI binary of `opts`.
pub async fn record(scenario: &Scenario, opts: &RecordOptions) -> Result<Recording> {
    let features = {
        let (r, b) = (opts.release.clone(), opts.binary.clone());
        tokio::task::spawn_blocking(move || cli::features_of(&r, &b))
            .await
            .map_err(|e| Error::Cli(format!("join: {e}")))??
    };
    let server = FakeModelServer::start(scenario.clone()).await?;
    let env = Hermetic::new()?;
    let mut d = Driver {
        opts,
        scenario,
        env,
        server,
        features,
        entries: Vec::new(),
        pending: VecDeque::new(),
        proc: None,
        stderr: Arc::new(Mutex::new(String::new())),
        session_id: None,
        tools: None,
        capabilities: Vec::new(),
        background_tasks: Vec::new(),
        notified: Vec::new(),
        interrupts: 0,
        next_request: 0,
        unsupported: Vec::new(),
        first_flags: Vec::new(),
    };
    let result = d.run().await;
    if let Some(p) = d.proc.as_mut() {
        let _ = p.child.start_kill();
    }
    if let Some(path) = std::env::var_os("OSTLER_RECORD_DUMP") {
        // debugging aid: the raw (not normalized) transcript, also after a failure
        let raw: Vec<String> = d
            .entries
            .iter()
            .map(|e| match e {
                Entry::Ostler(s) => format!("ostler> {s}"),
                Entry::Cli(s) | Entry::Text(s) => format!("cli> {s}"),
                Entry::Exit(c) => format!("exit {c:?}"),
                Entry::Spawn(f) => format!("spawn {f:?}"),
            })
            .collect();
        let _ = std::fs::write(path, raw.join("\n") + "\n");
    }
    result?;
    Ok(d.finish())
}

impl Driver<'_> {
    fn invocation(&self, resume: Option<String>, fork: bool) -> CliInvocation {
        let c = &self.scenario.cli;
        CliInvocation {
            partial_messages: c.partial_messages,
            model: c.model.clone(),
            permission_mode: c.permission_mode.clone(),
            resume,
            fork_session: fork,
            resume_session_at: None,
            env: c.env.clone(),
            args: c.args.clone(),
        }
    }

    async fn spawn(&mut self, inv: &CliInvocation, first: bool) -> Result<()> {
        let (args, omitted) = cli::args_for(inv, self.features);
        for o in omitted {
            if !self.unsupported.contains(&o) {
                self.unsupported.push(o);
            }
        }
        let mut cmd = self
            .env
            .command(&self.opts.binary, &args, &self.server.url(), &inv.env);
        let mut child = cmd.spawn().map_err(|e| Error::io(&self.opts.binary, e))?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| Error::Cli("no stdout pipe".into()))?;
        let stderr = child.stderr.take();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut r = BufReader::with_capacity(1 << 16, stdout);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match r.read_until(b'\n', &mut buf).await {
                    Ok(0) | Err(_) => {
                        let _ = tx.send(Out::Eof);
                        return;
                    }
                    Ok(_) => {
                        while buf.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
                            buf.pop();
                        }
                        let line = String::from_utf8_lossy(&buf).into_owned();
                        if tx.send(Out::Line(line)).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        if let Some(mut se) = stderr {
            let sink = self.stderr.clone();
            tokio::spawn(async move {
                let mut s = String::new();
                let _ = se.read_to_string(&mut s).await;
                sink.lock().unwrap_or_else(|p| p.into_inner()).push_str(&s);
            });
        }
        if first {
            self.first_flags = args;
        } else {
            self.entries.push(Entry::Spawn(args));
        }
        self.pending.clear();
        self.proc = Some(Proc {
            child,
            stdin,
            rx,
            eof: false,
        });
        Ok(())
    }

    fn err(&self, message: impl Into<String>) -> Error {
        let stderr = self
            .stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let tail: Vec<String> = self
            .entries
            .iter()
            .rev()
            .take(6)
            .map(|e| match e {
                Entry::Ostler(s) => format!("ostler> {}", clip(s)),
                Entry::Cli(s) | Entry::Text(s) => format!("cli> {}", clip(s)),
                Entry::Exit(c) => format!("exit {c:?}"),
                Entry::Spawn(_) => "spawn".into(),
            })
            .collect();
        Error::Driver {
            scenario: self.scenario.name.clone(),
            release: self.opts.release.clone(),
            message: format!(
                "{}\n  last lines (newest first):\n    {}\n  stderr: {}",
                message.into(),
                tail.join("\n    "),
                clip(&stderr)
            ),
        }
    }

    async fn run(&mut self) -> Result<()> {
        let inv = self.invocation(None, false);
        self.spawn(&inv, true).await?;
        let steps = self.scenario.steps.clone();
        let version = semver::Version::parse(&self.opts.release).ok();
        for (i, entry) in steps.iter().enumerate() {
            if let Some(req) = &entry.if_release {
                let req = semver::VersionReq::parse(req)
                    .map_err(|e| self.err(format!("step {i}: if_release {req:?}: {e}")))?;
                // a release label that is not a version runs every step
                if version.as_ref().is_some_and(|v| !req.matches(v)) {
                    continue;
                }
            }
            if entry.if_tool.is_some() || entry.unless_tool.is_some() {
                self.ensure_init().await?;
                let tools = self.tools.clone().unwrap_or_default();
                if let Some(t) = &entry.if_tool
                    && !tools.contains(t)
                {
                    continue;
                }
                if let Some(t) = &entry.unless_tool
                    && tools.contains(t)
                {
                    continue;
                }
            }
            self.step(&entry.step).await.map_err(|e| match e {
                Error::Driver { .. } => e,
                other => self.err(format!("step {i}: {other}")),
            })?;
        }
        if self.proc.as_ref().is_some_and(|p| p.stdin.is_some()) {
            self.close().await?;
        }
        Ok(())
    }

    async fn step(&mut self, step: &Step) -> Result<()> {
        match step {
            Step::SendUser { text, uuid } => {
                let sid = self.session_id.clone().unwrap_or_default();
                let mut line = json!({
                    "type": "user",
                    "message": {"role": "user", "content": text},
                    "parent_tool_use_id": null,
                    "session_id": sid,
                });
                if let (Some(u), Some(obj)) = (uuid, line.as_object_mut()) {
                    obj.insert("uuid".into(), json!(u));
                }
                self.send(line).await
            }
            Step::Await {
                kind,
                subtype,
                contains,
                if_capability,
            } => {
                if let Some(cap) = if_capability {
                    self.ensure_init().await?;
                    if !self.capabilities.iter().any(|c| c == cap) {
                        return Ok(());
                    }
                }
                let what = format!(
                    "{kind}/{} {}",
                    subtype.as_deref().unwrap_or("*"),
                    contains.as_deref().unwrap_or("")
                );
                self.await_msg(&what, |v| {
                    (kind == "*" || msg_type(v) == Some(kind.as_str()))
                        && subtype.as_deref().is_none_or(|s| msg_subtype(v) == Some(s))
                        && contains
                            .as_deref()
                            .is_none_or(|c| v.to_string().contains(c))
                })
                .await
                .map(|_| ())
            }
            Step::Signal { name } => {
                self.server.signal(name);
                Ok(())
            }
            Step::RespondPermission {
                tool,
                behavior,
                message,
                updated_input,
            } => {
                let req = self.await_can_use_tool(tool.as_deref()).await?;
                let rid = req.get("request_id").cloned().unwrap_or(Value::Null);
                let input = req
                    .pointer("/request/input")
                    .cloned()
                    .unwrap_or_else(|| json!({}));
                let response = match behavior {
                    Behavior::Allow => json!({
                        "behavior": "allow",
                        "updatedInput": updated_input.clone().unwrap_or(input),
                    }),
                    Behavior::Deny => json!({
                        "behavior": "deny",
                        "message": message.clone().unwrap_or_else(|| "Denied by the ostler scenario.".into()),
                    }),
                };
                self.send(json!({
                    "type": "control_response",
                    "response": {"subtype": "success", "request_id": rid, "response": response},
                }))
                .await
            }
            Step::AnswerQuestion { answers } => {
                let req = self.await_can_use_tool(Some("AskUserQuestion")).await?;
                let rid = req.get("request_id").cloned().unwrap_or(Value::Null);
                let mut input = req
                    .pointer("/request/input")
                    .cloned()
                    .unwrap_or_else(|| json!({}));
                if let Some(obj) = input.as_object_mut() {
                    obj.insert("answers".into(), json!(answers));
                }
                self.send(json!({
                    "type": "control_response",
                    "response": {"subtype": "success", "request_id": rid,
                        "response": {"behavior": "allow", "updatedInput": input}},
                }))
                .await
            }
            Step::RespondControl {
                subtype,
                method,
                response,
            } => {
                let (sub, m) = (subtype.clone(), method.clone());
                let what = format!(
                    "control_request {subtype} {}",
                    method.as_deref().unwrap_or("")
                );
                let req = self
                    .await_msg(&what, move |v| {
                        msg_type(v) == Some("control_request")
                            && msg_subtype(v) == Some(sub.as_str())
                            && m.as_deref().is_none_or(|m| {
                                v.pointer("/request/message/method").and_then(Value::as_str)
                                    == Some(m)
                            })
                    })
                    .await?;
                let rid = req.get("request_id").cloned().unwrap_or(Value::Null);
                let mut response = response.clone();
                if let (Some(Value::Object(r)), Some(id)) = (
                    response.get_mut("mcp_response"),
                    req.pointer("/request/message/id"),
                ) {
                    r.insert("id".into(), id.clone());
                }
                self.send(json!({
                    "type": "control_response",
                    "response": {"subtype": "success", "request_id": rid,
                                 "response": Value::Object(response)},
                }))
                .await
            }
            Step::SendControl {
                subtype,
                fields,
                await_response,
            } => {
                let mut request = serde_json::Map::new();
                request.insert("subtype".into(), json!(subtype));
                for (k, v) in fields {
                    request.insert(k.clone(), v.clone());
                }
                if *await_response {
                    self.control(Value::Object(request)).await.map(|_| ())
                } else {
                    self.next_request += 1;
                    let id = format!("{OSTLER_REQUEST_PREFIX}{}", self.next_request);
                    self.send(
                        json!({"type": "control_request", "request_id": id, "request": request}),
                    )
                    .await
                }
            }
            Step::AwaitModelRequest { rule } => {
                let deadline = tokio::time::Instant::now() + self.opts.await_timeout;
                loop {
                    let log = self.server.requests();
                    if log
                        .iter()
                        .any(|r| r.rule_name.as_deref() == Some(rule.as_str()))
                    {
                        return Ok(());
                    }
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    if left.is_zero() {
                        return Err(self.err(format!("no model request for rule {rule:?}")));
                    }
                    self.server.wait_for_requests(log.len() + 1, left).await;
                }
            }
            Step::InterruptAfterDeltas { deltas } if !self.features.include_partial_messages => {
                // no stream events on this release: interrupt once the fake model got the
                // streaming request (nothing is emitted mid-answer anyway)
                let _ = deltas;
                let answered_streams = |server: &FakeModelServer| {
                    server
                        .requests()
                        .iter()
                        .filter(|r| {
                            r.rule.is_some()
                                && r.body
                                    .as_ref()
                                    .and_then(|b| b.get("stream"))
                                    .and_then(Value::as_bool)
                                    == Some(true)
                        })
                        .count()
                };
                let timeout = self.opts.await_timeout;
                let deadline = tokio::time::Instant::now() + timeout;
                while answered_streams(&self.server) <= self.interrupts {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    if left.is_zero() {
                        return Err(self.err("no streaming model request to interrupt"));
                    }
                    let n = self.server.requests().len();
                    self.server.wait_for_requests(n + 1, left).await;
                }
                self.interrupts += 1;
                self.control(json!({"subtype": "interrupt"}))
                    .await
                    .map(|_| ())
            }
            Step::InterruptAfterDeltas { deltas } => {
                for n in 0..*deltas {
                    self.await_msg(&format!("text delta #{}", n + 1), is_text_delta)
                        .await?;
                }
                self.control(json!({"subtype": "interrupt"}))
                    .await
                    .map(|_| ())
            }
            Step::AwaitResult => self
                .await_msg("result", |v| msg_type(v) == Some("result"))
                .await
                .map(|_| ()),
            Step::Restart {
                resume,
                fork,
                at_text,
                at_key,
            } => {
                self.close().await?;
                let sid = if *resume {
                    Some(
                        self.session_id
                            .clone()
                            .ok_or_else(|| self.err("restart: no session id seen"))?,
                    )
                } else {
                    None
                };
                let at = match at_text {
                    Some(text) => Some(self.message_key(text, at_key.as_deref())?),
                    None => None,
                };
                let mut inv = self.invocation(sid, *fork);
                inv.resume_session_at = at;
                self.spawn(&inv, false).await
            }
            Step::AwaitBackgroundTasks {
                notifications,
                results,
            } => {
                let tasks = self.background_tasks.clone();
                if *notifications {
                    for id in &tasks {
                        if self.notified.contains(id) {
                            continue;
                        }
                        self.await_msg(&format!("task_notification {id}"), |v| {
                            msg_type(v) == Some("system")
                                && msg_subtype(v) == Some("task_notification")
                                && v.get("task_id").and_then(Value::as_str) == Some(id.as_str())
                        })
                        .await?;
                        self.notified.push(id.clone());
                    }
                }
                if *results {
                    for _ in &tasks {
                        self.await_msg("result of a background task's turn", |v| {
                            msg_type(v) == Some("result")
                        })
                        .await?;
                    }
                }
                Ok(())
            }
            Step::CloseStdin => self.close().await,
            Step::AssertFile { path, exists } => {
                let p = self.env.cwd().join(path);
                if p.exists() != *exists {
                    return Err(self.err(format!(
                        "assert_file: {path} exists={} but expected exists={exists}",
                        p.exists()
                    )));
                }
                Ok(())
            }
            Step::AssertRequests { when, count } => {
                let got = self.server.count_matching(when);
                if got < *count {
                    return Err(self.err(format!(
                        "assert_requests: {got} matching model requests, expected at least {count} ({when:?})"
                    )));
                }
                Ok(())
            }
        }
    }

    async fn await_can_use_tool(&mut self, tool: Option<&str>) -> Result<Value> {
        let what = format!("can_use_tool {}", tool.unwrap_or("*"));
        self.await_msg(&what, |v| {
            msg_type(v) == Some("control_request")
                && msg_subtype(v) == Some("can_use_tool")
                && tool.is_none_or(|t| {
                    v.pointer("/request/tool_name").and_then(Value::as_str) == Some(t)
                })
        })
        .await
    }

    /// Send a control request and await its response.
    async fn control(&mut self, request: Value) -> Result<Value> {
        self.next_request += 1;
        let id = format!("{OSTLER_REQUEST_PREFIX}{}", self.next_request);
        self.send(json!({"type": "control_request", "request_id": id, "request": request}))
            .await?;
        let idc = id.clone();
        self.await_msg(&format!("control_response {id}"), move |v| {
            msg_type(v) == Some("control_response")
                && v.pointer("/response/request_id").and_then(Value::as_str) == Some(idc.as_str())
        })
        .await
    }

    async fn send(&mut self, v: Value) -> Result<()> {
        let line = v.to_string();
        let Some(p) = self.proc.as_mut() else {
            return Err(self.err("send: no process"));
        };
        let Some(stdin) = p.stdin.as_mut() else {
            return Err(self.err("send: stdin closed"));
        };
        let mut bytes = line.clone().into_bytes();
        bytes.push(b'\n');
        let res = async {
            stdin.write_all(&bytes).await?;
            stdin.flush().await
        }
        .await;
        self.entries.push(Entry::Ostler(line));
        res.map_err(|e| self.err(format!("write to CLI stdin: {e}")))
    }

    /// Read one more stdout line; false at EOF.
    async fn read_one(&mut self, what: &str) -> Result<bool> {
        let timeout = self.opts.await_timeout;
        let Some(p) = self.proc.as_mut() else {
            return Ok(false);
        };
        if p.eof {
            return Ok(false);
        }
        let next = tokio::time::timeout(timeout, p.rx.recv()).await;
        match next {
            Err(_) => Err(self.err(format!("timed out after {timeout:?} awaiting {what}"))),
            Ok(None) | Ok(Some(Out::Eof)) => {
                p.eof = true;
                Ok(false)
            }
            Ok(Some(Out::Line(line))) => {
                self.on_line(line);
                Ok(true)
            }
        }
    }

    fn on_line(&mut self, line: String) {
        match serde_json::from_str::<Value>(&line) {
            Ok(v) if v.is_object() => {
                if self.session_id.is_none()
                    && let Some(s) = v.get("session_id").and_then(Value::as_str)
                    && !s.is_empty()
                {
                    self.session_id = Some(s.to_string());
                }
                if self.tools.is_none()
                    && msg_type(&v) == Some("system")
                    && msg_subtype(&v) == Some("init")
                {
                    self.capabilities = v
                        .get("capabilities")
                        .and_then(Value::as_array)
                        .map(|cs| {
                            cs.iter()
                                .filter_map(Value::as_str)
                                .map(String::from)
                                .collect()
                        })
                        .unwrap_or_default();
                    self.tools = v.get("tools").and_then(Value::as_array).map(|ts| {
                        ts.iter()
                            .filter_map(|t| {
                                t.as_str()
                                    .or_else(|| t.get("name").and_then(Value::as_str))
                                    .map(String::from)
                            })
                            .collect()
                    });
                }
                if msg_type(&v) == Some("system")
                    && msg_subtype(&v) == Some("task_started")
                    && v.get("is_backgrounded").and_then(Value::as_bool) == Some(true)
                    && let Some(id) = v.get("task_id").and_then(Value::as_str)
                {
                    self.background_tasks.push(id.to_string());
                }
                self.entries.push(Entry::Cli(line));
                self.pending.push_back(v);
            }
            _ => self.entries.push(Entry::Text(line)),
        }
    }

    /// The `uuid` (or, `key = "message_id"`, the API `message.id`) of the first assistant
    /// line the CLI wrote whose text contains `text`.
    fn message_key(&self, text: &str, key: Option<&str>) -> Result<String> {
        let key = key.unwrap_or("uuid");
        let found = self.entries.iter().find_map(|e| {
            let Entry::Cli(line) = e else { return None };
            let v: Value = serde_json::from_str(line).ok()?;
            let content = v.get("message")?.get("content")?.as_array()?;
            let hit = msg_type(&v) == Some("assistant")
                && content.iter().any(|b| {
                    b.get("text")
                        .and_then(Value::as_str)
                        .is_some_and(|t| t.contains(text))
                });
            if !hit {
                return None;
            }
            match key {
                "message_id" => v["message"]["id"].as_str().map(String::from),
                _ => v["uuid"].as_str().map(String::from),
            }
        });
        found.ok_or_else(|| {
            self.err(format!(
                "restart: no assistant line with {text:?} and a {key}"
            ))
        })
    }

    async fn await_msg(&mut self, what: &str, pred: impl Fn(&Value) -> bool) -> Result<Value> {
        loop {
            if let Some(pos) = self.pending.iter().position(&pred)
                && let Some(v) = self.pending.remove(pos)
            {
                return Ok(v);
            }
            if !self.read_one(what).await? {
                return Err(self.err(format!("the CLI closed stdout while awaiting {what}")));
            }
        }
    }

    async fn ensure_init(&mut self) -> Result<()> {
        while self.tools.is_none() {
            if !self.read_one("system/init").await? {
                return Err(self.err("the CLI closed stdout before system/init"));
            }
        }
        Ok(())
    }

    /// Close stdin, read stdout to EOF, await the exit.
    async fn close(&mut self) -> Result<()> {
        if let Some(p) = self.proc.as_mut() {
            p.stdin = None;
        }
        while self.read_one("end of output").await? {}
        let timeout = self.opts.await_timeout;
        let Some(mut p) = self.proc.take() else {
            return Ok(());
        };
        let status: std::io::Result<ExitStatus> =
            match tokio::time::timeout(timeout, p.child.wait()).await {
                Ok(s) => s,
                Err(_) => {
                    let _ = p.child.start_kill();
                    return Err(self.err("the CLI did not exit after stdin was closed"));
                }
            };
        let code = status.ok().and_then(|s| s.code());
        self.entries.push(Entry::Exit(code));
        Ok(())
    }

    fn finish(self) -> Recording {
        let addr = self.server.addr();
        let mut norm = Normalizer::new(self.env.root(), self.env.home(), self.env.cwd())
            .replace(format!("127.0.0.1:{}", addr.port()), "127.0.0.1:PORT");
        for e in &self.entries {
            if let Entry::Ostler(s) | Entry::Cli(s) | Entry::Text(s) = e {
                norm.learn(s);
            }
        }
        let mut text = String::new();
        let header = json!({
            "ostler_recording": FORMAT_VERSION,
            "release": self.opts.release,
            "scenario": self.scenario.name,
            "flags": self.first_flags,
            "unsupported_flags": self.unsupported,
        });
        text.push_str(&header_line(&header));
        text.push('\n');
        for e in &self.entries {
            let line = match e {
                Entry::Ostler(s) => format!("{{\"dir\":\"ostler\",\"line\":{}}}", norm.line(s)),
                Entry::Cli(s) => format!("{{\"dir\":\"cli\",\"line\":{}}}", norm.line(s)),
                Entry::Text(s) => format!(
                    "{{\"dir\":\"cli\",\"text\":{}}}",
                    Value::String(norm.line(s))
                ),
                Entry::Exit(c) => format!(
                    "{{\"dir\":\"meta\",\"event\":\"exit\",\"code\":{}}}",
                    c.map_or(Value::Null, |c| json!(c))
                ),
                Entry::Spawn(flags) => norm.line(&format!(
                    "{{\"dir\":\"meta\",\"event\":\"spawn\",\"flags\":{}}}",
                    json!(flags)
                )),
            };
            text.push_str(&line);
            text.push('\n');
        }
        let stderr = self
            .stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Recording {
            text,
            requests: self.server.requests(),
            stderr,
            features: self.features,
            unsupported_flags: self.unsupported,
        }
    }
}

/// The header with a fixed key order.
fn header_line(h: &Value) -> String {
    let keys = [
        "ostler_recording",
        "release",
        "scenario",
        "flags",
        "unsupported_flags",
    ];
    let parts: Vec<String> = keys
        .iter()
        .map(|k| format!("{}:{}", json!(k), h.get(*k).cloned().unwrap_or(Value::Null)))
        .collect();
    format!("{{{}}}", parts.join(","))
}

fn clip(s: &str) -> String {
    const MAX: usize = 600;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

/// `type` of a message.
pub fn msg_type(v: &Value) -> Option<&str> {
    v.get("type").and_then(Value::as_str)
}

/// The discriminating subtype of a message: `subtype`, or `request.subtype` for
/// `control_request`, `response.subtype` for `control_response`, `event.type` for
/// `stream_event`.
pub fn msg_subtype(v: &Value) -> Option<&str> {
    match msg_type(v)? {
        "control_request" => v.pointer("/request/subtype").and_then(Value::as_str),
        "control_response" => v.pointer("/response/subtype").and_then(Value::as_str),
        "stream_event" => v.pointer("/event/type").and_then(Value::as_str),
        _ => v.get("subtype").and_then(Value::as_str),
    }
}

fn is_text_delta(v: &Value) -> bool {
    msg_type(v) == Some("stream_event")
        && v.pointer("/event/delta/type").and_then(Value::as_str) == Some("text_delta")
}

/// Write a recording's text to its path (creating directories).
pub fn write_recording(path: &Path, text: &str) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    std::fs::write(path, text).map_err(|e| Error::io(path, e))
}
