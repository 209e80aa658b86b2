//! Scenario files (`contracts/scenarios/<name>.toml`).
//!
//! A scenario holds both sides of a recorded conversation:
//! - `[[model]]` rules: how the fake model server answers (see [`ModelRule`]);
//! - `[[step]]` entries: the client-side script the driver plays against the real CLI
//!   (see [`Step`]);
//! - `[cli]`: flags and extra environment for the CLI process.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// One scenario file.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Name; defaults to the file stem.
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub cli: CliOptions,
    /// The pinned releases this scenario is recorded and checked on (empty: every one).
    /// For options and controls that need not be recorded on every release twice.
    #[serde(default)]
    pub releases: Vec<String>,
    /// Fake model rules, first match wins.
    #[serde(default, rename = "model")]
    pub rules: Vec<ModelRule>,
    /// Text of the answer to requests no rule matches.
    #[serde(default)]
    pub default_text: Option<String>,
    /// Client-side script.
    #[serde(default, rename = "step")]
    pub steps: Vec<StepEntry>,
}

/// CLI flags and environment for the scenario.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CliOptions {
    /// Pass `--include-partial-messages` when the release supports it.
    #[serde(default)]
    pub partial_messages: bool,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub permission_mode: Option<String>,
    /// Extra environment variables (e.g. `CLAUDE_CODE_MAX_RETRIES`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Extra CLI arguments, appended as given (session options: `--system-prompt`, ...).
    #[serde(default)]
    pub args: Vec<String>,
}

impl Scenario {
    /// Whether the scenario is recorded and checked on `release`.
    pub fn applies_to(&self, release: &str) -> bool {
        self.releases.is_empty() || self.releases.iter().any(|r| r == release)
    }
}

/// A rule of the fake model server.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelRule {
    /// Label shown in the request log.
    #[serde(default)]
    pub name: Option<String>,
    /// All given conditions must hold.
    #[serde(default)]
    pub when: Match,
    /// Use this rule at most this many times (then it no longer matches).
    #[serde(default)]
    pub times: Option<u32>,
    /// Answer the first `fail_times` matches with `error` (default error: 529
    /// `overloaded_error`), then answer normally. Without `fail_times`, a rule that has an
    /// `error` always fails.
    #[serde(default)]
    pub fail_times: Option<u32>,
    #[serde(default)]
    pub error: Option<HttpError>,
    /// Content blocks of the answer.
    #[serde(default)]
    pub blocks: Vec<Block>,
    /// `stop_reason`; default `tool_use` when a block is a tool_use, else `end_turn`.
    #[serde(default)]
    pub stop_reason: Option<String>,
    /// `stop_details` sent with the stop reason (in `message_delta` when streamed), e.g.
    /// a refusal's `{type = "refusal", category = "cyber", explanation = "..."}`.
    #[serde(default)]
    pub stop_details: Option<serde_json::Value>,
    /// Split each text/thinking/tool input into this many deltas (default 1).
    #[serde(default)]
    pub chunks: Option<usize>,
    /// Delay before each delta, in milliseconds.
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// Hold the answer until the driver's `signal` step with this name (or 60 s, so that
    /// nothing hangs). Orders the model's answers after client-side events, e.g. a main
    /// agent's answer after a concurrently running sub-agent finished.
    #[serde(default)]
    pub hold_until: Option<String>,
    /// With `hold_until`: stream this many deltas first, then hold the rest (a stream that
    /// stops mid-answer: what a client interrupts, independent of timing).
    #[serde(default)]
    pub pause_after_deltas: Option<usize>,
}

/// Request matcher. Empty matches everything.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Match {
    /// The text blocks of the last `user` message contain this.
    #[serde(default)]
    pub last_user_text_contains: Option<String>,
    /// The last `user` message holds a `tool_result` for this tool_use id.
    #[serde(default)]
    pub tool_result_for: Option<String>,
    /// The request holds a `tool_result` for this tool_use id anywhere.
    #[serde(default)]
    pub has_tool_result_for: Option<String>,
    /// The system prompt contains this.
    #[serde(default)]
    pub system_contains: Option<String>,
    /// The serialized `messages` contain this.
    #[serde(default)]
    pub messages_contain: Option<String>,
    /// The serialized `messages` do not contain this.
    #[serde(default)]
    pub messages_lack: Option<String>,
    /// The model name contains this.
    #[serde(default)]
    pub model_contains: Option<String>,
    /// Streaming (true) or not (false).
    #[serde(default)]
    pub stream: Option<bool>,
}

/// An HTTP error answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpError {
    pub status: u16,
    /// `error.type` in the body, e.g. `overloaded_error`, `rate_limit_error`, `api_error`.
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    /// Value of a `retry-after` header, in seconds.
    #[serde(default)]
    pub retry_after: Option<u32>,
}

impl Default for HttpError {
    fn default() -> Self {
        Self {
            status: 529,
            kind: Some("overloaded_error".into()),
            message: Some("Overloaded".into()),
            retry_after: None,
        }
    }
}

/// A tool name, or a list of candidates: the first one offered in the request's `tools`
/// wins (e.g. `["Agent", "Task"]`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToolName {
    One(String),
    AnyOf(Vec<String>),
}

/// A content block of an answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Block {
    Text {
        #[serde(default)]
        text: String,
        /// Append `repeat` copies of `text` (for large answers).
        #[serde(default)]
        repeat: Option<usize>,
    },
    Thinking {
        thinking: String,
        #[serde(default)]
        signature: Option<String>,
    },
    ToolUse {
        id: String,
        name: ToolName,
        #[serde(default = "empty_object")]
        input: serde_json::Value,
    },
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

/// A step plus its conditions.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StepEntry {
    #[serde(flatten)]
    pub step: Step,
    /// Run only if the CLI's `system/init` lists this tool.
    #[serde(default)]
    pub if_tool: Option<String>,
    /// Run only if the CLI's `system/init` does not list this tool.
    #[serde(default)]
    pub unless_tool: Option<String>,
    /// Run only if the release matches this semver requirement (e.g. `">=1.0.117"`): for
    /// capabilities a release lacks without saying so (an unanswered control request).
    #[serde(default)]
    pub if_release: Option<String>,
}

/// Permission decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Behavior {
    Allow,
    Deny,
}

/// One client-side step. Awaits claim the earliest not yet claimed matching CLI message
/// (reading more from stdout when none is there), so awaiting never depends on timing.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// Write a `user` message (with this wire `uuid`, as ostler sends every message, when
    /// given).
    SendUser {
        text: String,
        #[serde(default)]
        uuid: Option<String>,
    },
    /// Await a CLI message of `type` (`"*"`: any type). `subtype` matches `subtype`, or
    /// `request.subtype` for
    /// `control_request`, `response.subtype` for `control_response`, `event.type` for
    /// `stream_event`.
    Await {
        #[serde(rename = "type")]
        kind: String,
        #[serde(default)]
        subtype: Option<String>,
        /// The serialized message contains this text.
        #[serde(default)]
        contains: Option<String>,
        /// Only on releases whose `system/init` announces this capability (e.g.
        /// `msg_lifecycle_v1`); skipped on the others.
        #[serde(default)]
        if_capability: Option<String>,
    },
    /// Release the fake model's answers held with `hold_until = name`.
    Signal { name: String },
    /// Await the fake model server's receipt of a request answered by the `[[model]]` rule
    /// named `rule`: the CLI is then inside that turn, on any release (with or without
    /// stream events).
    AwaitModelRequest { rule: String },
    /// Await a `can_use_tool` request (optionally for `tool`) and answer it.
    RespondPermission {
        #[serde(default)]
        tool: Option<String>,
        behavior: Behavior,
        #[serde(default)]
        message: Option<String>,
        /// Replacement input; default: the original input.
        #[serde(default)]
        updated_input: Option<serde_json::Value>,
    },
    /// Await a `can_use_tool` for `AskUserQuestion` and allow it with
    /// `updatedInput = input + {"answers": answers}`.
    AnswerQuestion { answers: BTreeMap<String, String> },
    /// Send a control request and await its `control_response` (unless
    /// `await_response = false`: releases before 2.1.x never answer unknown subtypes).
    SendControl {
        subtype: String,
        #[serde(default)]
        fields: BTreeMap<String, serde_json::Value>,
        #[serde(default = "yes")]
        await_response: bool,
    },
    /// Await a control request of `subtype` from the CLI (e.g. `hook_callback`,
    /// `mcp_message`) and answer it with `response` (a success carrying this object). For
    /// `mcp_message`: `method` picks the JSON-RPC method, and an `mcp_response` in
    /// `response` gets the request's JSON-RPC `id` (the CLI pairs answers by it).
    RespondControl {
        subtype: String,
        #[serde(default)]
        method: Option<String>,
        #[serde(default)]
        response: serde_json::Map<String, serde_json::Value>,
    },
    /// Await `deltas` text deltas (stream events) then send `interrupt` and await its
    /// response.
    InterruptAfterDeltas { deltas: usize },
    /// Await a `result`.
    AwaitResult,
    /// Close stdin, drain stdout, await exit, then start a new process in the same HOME
    /// and cwd with `--resume <session id of the first process>` (and `--fork-session`).
    Restart {
        #[serde(default = "yes")]
        resume: bool,
        #[serde(default)]
        fork: bool,
        /// `--resume-session-at` the assistant message whose text contains this (with
        /// `resume`); the conversation the new process continues ends there.
        #[serde(default)]
        at_text: Option<String>,
        /// What identifies that message on this release (`uuid`: the line's `uuid`, or
        /// `message_id`: its API `message.id`; see `[dialect] resume_session_at` in
        /// contracts/compat). Default `uuid`.
        #[serde(default)]
        at_key: Option<String>,
    },
    /// For every sub-agent the CLI started in the background (`system/task_started` with
    /// `is_backgrounded: true`, 2.1.x), await its `system/task_notification` and the
    /// `result` of the turn the notification starts (either part can be turned off).
    /// Nothing to do on releases that run sub-agents in the foreground.
    AwaitBackgroundTasks {
        /// Await each task's `task_notification` (default true).
        #[serde(default = "yes")]
        notifications: bool,
        /// Await one `result` per task (default true).
        #[serde(default = "yes")]
        results: bool,
    },
    /// Close stdin and await the exit (always done at the end of a scenario).
    CloseStdin,
    /// Assert that a path relative to the cwd exists (or not).
    AssertFile { path: String, exists: bool },
    /// Assert that the fake model server got at least `count` requests matching.
    AssertRequests {
        #[serde(default)]
        when: Match,
        count: usize,
    },
}

fn yes() -> bool {
    true
}

impl Scenario {
    /// Parse scenario TOML.
    pub fn from_toml(name: &str, text: &str) -> Result<Self> {
        let mut s: Scenario = toml::from_str(text).map_err(|e| Error::Scenario {
            name: name.to_string(),
            message: e.to_string(),
        })?;
        if s.name.is_empty() {
            s.name = name.to_string();
        }
        Ok(s)
    }

    /// Load `<dir>/<name>.toml`.
    pub fn load(dir: &Path, name: &str) -> Result<Self> {
        let path = dir.join(format!("{name}.toml"));
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        Self::from_toml(name, &text)
    }

    /// Load every `*.toml` of a directory, sorted by name.
    pub fn load_all(dir: &Path) -> Result<Vec<Self>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
            let entry = entry.map_err(|e| Error::io(dir, e))?;
            let p = entry.path();
            if p.extension().is_some_and(|x| x == "toml")
                && let Some(stem) = p.file_stem().and_then(|s| s.to_str())
            {
                names.push(stem.to_string());
            }
        }
        names.sort();
        names.iter().map(|n| Self::load(dir, n)).collect()
    }
}

/// `contracts/scenarios` of this workspace.
pub fn scenarios_dir() -> PathBuf {
    crate::workspace_root().join("contracts").join("scenarios")
}
