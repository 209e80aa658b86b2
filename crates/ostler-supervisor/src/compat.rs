//! The compatibility matrix and the level of a release.
//!
//! The matrix is data measured on real releases (see `contracts/compat/`), turned into Rust
//! by `cargo xtask compat generate` (`--check` fails on drift) and embedded here
//! ([`matrix`]). Levels follow the daemon design in the protocol references:
//!
//! | level | when |
//! | --- | --- |
//! | `FULLY_COMPATIBLE` | inside the tested range, every capability present |
//! | `LIKELY_COMPATIBLE` | newer than every tested release: warn, newest adapter, tolerant |
//! | `DEGRADED` | runs, but a known capability is missing; the workaround is named |
//! | `INCOMPATIBLE` | older than the minimum (the oldest release on which the stdio permission protocol works), or the permission flag is refused |
//!
//! Features check [`Capabilities`], never version numbers.

use std::collections::BTreeMap;
use std::fmt;

use semver::Version;
use serde::{Deserialize, Serialize};

/// How well ostler expects to work with a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CompatLevel {
    FullyCompatible,
    LikelyCompatible,
    Degraded,
    Incompatible,
}

impl CompatLevel {
    /// `FULLY_COMPATIBLE`, `LIKELY_COMPATIBLE`, `DEGRADED`, `INCOMPATIBLE`.
    pub fn as_str(self) -> &'static str {
        match self {
            CompatLevel::FullyCompatible => "FULLY_COMPATIBLE",
            CompatLevel::LikelyCompatible => "LIKELY_COMPATIBLE",
            CompatLevel::Degraded => "DEGRADED",
            CompatLevel::Incompatible => "INCOMPATIBLE",
        }
    }

    /// Whether the daemon starts with this level.
    pub fn can_run(self) -> bool {
        self != CompatLevel::Incompatible
    }
}

impl fmt::Display for CompatLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A command-line capability of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Flag {
    /// `--permission-prompt-tool` (accepted as a flag; whether `stdio` works is measured).
    PermissionPromptTool,
    /// `--include-partial-messages`.
    IncludePartialMessages,
    /// `--fork-session`.
    ForkSession,
    /// `--max-turns` (hidden from `--help` on recent releases).
    MaxTurns,
    /// `--sdk-url` (hidden); see [`SdkUrl`] for what it accepts.
    SdkUrl,
}

impl Flag {
    pub const ALL: [Flag; 5] = [
        Flag::PermissionPromptTool,
        Flag::IncludePartialMessages,
        Flag::ForkSession,
        Flag::MaxTurns,
        Flag::SdkUrl,
    ];

    /// The flag as written on the command line.
    pub fn as_arg(self) -> &'static str {
        match self {
            Flag::PermissionPromptTool => "--permission-prompt-tool",
            Flag::IncludePartialMessages => "--include-partial-messages",
            Flag::ForkSession => "--fork-session",
            Flag::MaxTurns => "--max-turns",
            Flag::SdkUrl => "--sdk-url",
        }
    }

    /// A value to pass when probing (flags that take one).
    pub(crate) fn probe_value(self) -> Option<&'static str> {
        match self {
            Flag::PermissionPromptTool => Some("stdio"),
            Flag::MaxTurns => Some("1"),
            Flag::SdkUrl => Some("ws://127.0.0.1:9/ostler-probe"),
            _ => None,
        }
    }

    pub fn from_arg(arg: &str) -> Option<Flag> {
        Flag::ALL.into_iter().find(|f| f.as_arg() == arg)
    }
}

/// What `--sdk-url` does on a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SdkUrl {
    /// Not measured.
    #[default]
    Unknown,
    /// Rejected as an unknown option.
    Absent,
    /// Accepted for a loopback host.
    Loopback,
    /// Refused for any host that is not Anthropic's.
    AnthropicOnly,
}

impl SdkUrl {
    pub fn as_str(self) -> &'static str {
        match self {
            SdkUrl::Unknown => "unknown",
            SdkUrl::Absent => "absent",
            SdkUrl::Loopback => "loopback",
            SdkUrl::AnthropicOnly => "anthropic_only",
        }
    }
}

/// How a release treats one control request subtype ostler sends (`set_model`, ...),
/// measured by `cargo xtask compat probe` (see `contracts/compat/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ControlSupport {
    /// Not measured for this release (an unpinned release between measurements).
    #[default]
    Unknown,
    /// A `success` control response.
    Answered,
    /// An `error` control response about the request's arguments or the session's state
    /// (the subtype is known: e.g. an MCP server that does not exist).
    ErrorAnswered,
    /// An `error` response saying the subtype is unknown (`unsupported_request`).
    Unsupported,
    /// No response within the probe's bound (1.0.x ignores subtypes it does not know).
    NoAnswer,
}

impl ControlSupport {
    pub fn as_str(self) -> &'static str {
        match self {
            ControlSupport::Unknown => "unknown",
            ControlSupport::Answered => "answered",
            ControlSupport::ErrorAnswered => "error_answered",
            ControlSupport::Unsupported => "unsupported",
            ControlSupport::NoAnswer => "no_answer",
        }
    }

    pub fn parse(s: &str) -> Option<ControlSupport> {
        [
            ControlSupport::Unknown,
            ControlSupport::Answered,
            ControlSupport::ErrorAnswered,
            ControlSupport::Unsupported,
            ControlSupport::NoAnswer,
        ]
        .into_iter()
        .find(|c| c.as_str() == s)
    }

    /// Whether the release serves the subtype (or it was not measured: then ostler tries).
    pub fn served(self) -> bool {
        matches!(
            self,
            ControlSupport::Answered | ControlSupport::ErrorAnswered | ControlSupport::Unknown
        )
    }
}

/// The user-message fields `cargo xtask compat probe` measures (the `inputs` column), each
/// with what honouring it means: a release that ignores one runs the message as if it were
/// not there, so a session that asks for it is refused instead.
pub const MESSAGE_FIELDS: [(&str, &str); 5] = [
    (
        "priority_now",
        "`priority: now` stops the turn under way and runs the message at once",
    ),
    (
        "priority_later",
        "`priority: later` runs in a turn after that of a message queued behind it with the \
         default priority",
    ),
    (
        "verbatim",
        "`client_composed: true` sends the text as written (no `@path` expansion, no slash \
         command)",
    ),
    (
        "context_only",
        "`shouldQuery: false` adds the message without a model call; the next turn carries it",
    ),
    (
        "pasted_content",
        "`pasted_content: [text]` adds the pasted text to the message the model gets",
    ),
];

/// The policies (settings the CLI must enforce whatever the session asks) `cargo xtask
/// compat probe` measures (the `policies` column), each with what enforcing it means. A
/// release can accept the flag and still ignore it (2.1.120 and 2.1.121 honour
/// `--managed-settings` only for a parent that says it is an Agent SDK), so a policy is
/// used only where it is measured enforced.
pub const POLICIES: [(&str, &str); 1] = [(
    "managed_settings",
    "`--managed-settings` with `permissions.deny: [Read]`: the model's Read of a file in the \
     working directory comes back an error, the file's text never reaches the model",
)];

/// The `initialize` fields (session options sent there, not as flags) `cargo xtask compat
/// probe` measures (the `init_fields` column), each with what honouring it means, and the
/// session options the CLI reads from its environment (`question_*`, the Agent SDKs'
/// `toolConfig.askUserQuestion`). A release ignores a field or variable it does not know,
/// so a session that asks for one it is measured not to honour is refused.
pub const INIT_FIELDS: [(&str, &str); 12] = [
    (
        "skills",
        "`skills: [name]` lists only that skill to the model (another skill of the project is \
         not listed)",
    ),
    (
        "plan_mode_instructions",
        "`planModeInstructions` reaches the model in plan mode",
    ),
    (
        "tool_aliases",
        "`toolAliases: {ProbeFetch: Read}` runs Read for the model's call of `ProbeFetch`",
    ),
    (
        "exclude_dynamic_sections",
        "`excludeDynamicSections` moves the session's paths (working directory, memory \
         directory) out of the system prompt into the messages, where they are in the system \
         prompt without it",
    ),
    (
        "forward_subagent_text",
        "`forwardSubagentText` writes a foreground sub-agent's text (an assistant message with \
         `parent_tool_use_id`), which is not written without it",
    ),
    (
        "per_task_stop_affordance",
        "`perTaskStopAffordance` spares a running background sub-agent from an interrupt (a \
         `stop_task` afterwards ends it), which ends it without the field",
    ),
    (
        "agent_progress_summaries",
        "`agentProgressSummaries` sends a running sub-agent's progress summary (a \
         `task_progress` with the model's `summary`, asked for ~30 s into the sub-agent), \
         which is not asked for without the field",
    ),
    (
        "dialog_kinds",
        "`supportedDialogKinds: [\"refusal_fallback_prompt\"]` makes a refused turn ask the \
         host (`request_user_dialog`) whether to retry on the fallback model, where without \
         it the turn ends with the refusal",
    ),
    (
        "question_preview_format",
        "`CLAUDE_CODE_QUESTION_PREVIEW_FORMAT=html` in the CLI's environment changes the \
         AskUserQuestion tool the model is offered (its description or input schema)",
    ),
    (
        "question_extended",
        "`CLAUDE_CODE_QUESTION_EXTENDED=1` in the CLI's environment changes the \
         AskUserQuestion tool the model is offered (its description or input schema)",
    ),
    (
        "question_optional_descriptions",
        "`CLAUDE_CODE_QUESTION_OPTIONAL_DESCRIPTIONS=1` in the CLI's environment changes the \
         AskUserQuestion tool the model is offered (its description or input schema)",
    ),
    (
        "title",
        "`title` names the CLI's session: its transcript gets the title as its `custom-title`, \
         which it has none of without the field",
    ),
];

/// The control request subtypes `cargo xtask compat probe` measures, in the order it sends
/// them (`initialize` first, before any user message, as the Agent SDKs do). The last,
/// `hook_callback`, goes the other way: whether the CLI calls a hook registered in
/// `initialize` during the probe's turn (`answered`) or not (`no_answer`); remote hooks
/// (issue 11) need it.
pub const PROBED_CONTROLS: [&str; 14] = [
    "initialize",
    "interrupt",
    "set_model",
    "set_permission_mode",
    "set_max_thinking_tokens",
    "mcp_status",
    "get_context_usage",
    "rewind_files",
    "mcp_set_servers",
    "mcp_toggle",
    "mcp_reconnect",
    "stop_task",
    "rename_session",
    "hook_callback",
];

/// Command-line options of session options (issue 10) whose presence `cargo xtask compat
/// probe` measures per release, each with the harmless value it is probed with (`None`: a
/// switch). A release that lacks one must refuse the session option naming the flag.
/// Also [`REPLAY_USER_MESSAGES`], which every session gets where the release accepts it.
pub const PROBED_OPTIONS: [(&str, Option<&str>); 29] = [
    ("--system-prompt", Some("ostler probe")),
    ("--append-system-prompt", Some("ostler probe")),
    ("--fallback-model", Some("claude-ostler-probe-fallback")),
    ("--add-dir", Some("/")),
    ("--max-budget-usd", Some("1")),
    ("--max-thinking-tokens", Some("1024")),
    ("--settings", Some("{}")),
    ("--setting-sources", Some("user")),
    ("--mcp-config", Some("{\"mcpServers\":{}}")),
    ("--strict-mcp-config", None),
    ("--session-id", Some("00000000-0000-4000-8000-000000000001")),
    ("--agents", Some("{}")),
    ("--json-schema", Some("{\"type\":\"object\"}")),
    ("--tools", Some("default")),
    ("--agent", Some("ostler-probe")),
    ("--effort", Some("low")),
    ("--plugin-dir", Some("/")),
    ("--include-hook-events", None),
    ("--betas", Some("context-1m-2025-08-07")),
    ("--permission-prompts", Some("host")),
    ("--thinking", Some("adaptive")),
    ("--thinking-display", Some("summarized")),
    ("--task-budget", Some("1000")),
    ("--managed-settings", Some("{}")),
    ("--allow-dangerously-skip-permissions", None),
    // The CLI checks the value (an existing local directory it can list).
    ("--project-config-root", Some("/")),
    // The session option `debug` (the file is the daemon's; the probe's goes nowhere).
    ("--debug-file", Some("/dev/null")),
    (REPLAY_USER_MESSAGES, None),
    // `ResumeSessionRequest.drops_turn_message_id` (with `--resume-session-at` only; alone
    // the parser still takes it).
    (
        ostler_protocol::argv::RESUME_DROPS_TURN,
        Some("00000000-0000-4000-8000-000000000002"),
    ),
];

/// `--replay-user-messages`: the CLI echoes each message written to it when it takes it
/// into a turn (its `uuid` kept). From releases whose results do not name the messages
/// they answered, the echoes say which turn answers which message.
pub const REPLAY_USER_MESSAGES: &str = "--replay-user-messages";

/// Where the capability facts of an installation came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapabilitySource {
    /// A pinned (tested) release: the matrix row.
    Matrix,
    /// Probed on the binary (flags), with the matrix boundaries for what cannot be probed.
    Probed,
    /// Neither row nor probe: inferred from the measured boundaries alone.
    Inferred,
}

/// What a release can do. Features check these, not version numbers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// `--permission-prompt-tool stdio` routes permission prompts as `can_use_tool`
    /// control requests (the protocol ostler needs).
    pub stdio_permission_prompt: bool,
    pub include_partial_messages: bool,
    pub fork_session: bool,
    pub max_turns: bool,
    pub sdk_url: SdkUrl,
    /// The `capabilities` list the release announces in `system/init`/`initialize`
    /// (empty when it announces none). For pinned releases, as recorded; otherwise filled
    /// from the first session's init by the engine.
    pub announced: Vec<String>,
    /// Control request subtypes as measured (pinned releases) or inferred from the pinned
    /// neighbours (see [`assess`]); a subtype not listed is [`ControlSupport::Unknown`].
    #[serde(default)]
    pub control: BTreeMap<String, ControlSupport>,
    /// Session-option flags ([`PROBED_OPTIONS`]) -> accepted, as measured (pinned
    /// releases) or where the pinned neighbours agree; a flag not listed is unknown.
    #[serde(default)]
    pub options: BTreeMap<String, bool>,
    /// Control requests from the CLI that ostler serves (`mcp_message`: SDK MCP servers;
    /// `elicitation`: MCP elicitations) -> whether they work, measured or where the pinned
    /// neighbours agree; a subtype not listed is unknown (then tried).
    #[serde(default)]
    pub cli_requests: BTreeMap<String, bool>,
    /// How the release reads values whose meaning changed between releases, measured
    /// (pinned releases) or where the pinned neighbours agree; see [`Dialect`].
    #[serde(default)]
    pub dialect: BTreeMap<String, String>,
    /// Hook events (the Agent SDKs' names) -> whether the release knows the event (and,
    /// for `PermissionRequest`, calls it in a session of ostler's), as measured (pinned
    /// releases) or where the pinned neighbours agree; an event not listed is unknown (then
    /// allowed).
    #[serde(default)]
    pub hook_events: BTreeMap<String, bool>,
    /// Messages the release writes when a session asks for them (`prompt_suggestion`:
    /// after a turn, with `promptSuggestions` in `initialize`) -> whether it does, measured
    /// or where the pinned neighbours agree; a type not listed is unknown (then asked).
    #[serde(default)]
    pub outputs: BTreeMap<String, bool>,
    /// Fields of a user message the release honours -> whether it does (`priority_now`,
    /// `priority_later`, `verbatim`, `context_only`: see [`MESSAGE_FIELDS`]), measured or
    /// where the pinned neighbours agree; a field not listed is unknown (then written).
    #[serde(default)]
    pub inputs: BTreeMap<String, bool>,
    /// Fields of `initialize` the release honours -> whether it does (`skills`,
    /// `plan_mode_instructions`, ...: see [`INIT_FIELDS`]), measured or where the pinned
    /// neighbours agree; a field not listed is unknown (then sent).
    #[serde(default)]
    pub init_fields: BTreeMap<String, bool>,
    /// Policies -> whether the release enforces each (`managed_settings`: see
    /// [`POLICIES`]), measured or where the pinned neighbours agree; one not listed is
    /// unknown.
    #[serde(default)]
    pub policies: BTreeMap<String, bool>,
    pub source: CapabilitySource,
}

impl Capabilities {
    /// Whether the release accepts `flag`.
    pub fn has_flag(&self, flag: Flag) -> bool {
        match flag {
            Flag::PermissionPromptTool => self.stdio_permission_prompt,
            Flag::IncludePartialMessages => self.include_partial_messages,
            Flag::ForkSession => self.fork_session,
            Flag::MaxTurns => self.max_turns,
            Flag::SdkUrl => !matches!(self.sdk_url, SdkUrl::Absent | SdkUrl::Unknown),
        }
    }

    /// What `--resume-session-at` matches on this release.
    pub fn resume_at(&self) -> ResumeAt {
        match self
            .dialect
            .get(Dialect::RESUME_SESSION_AT)
            .map(String::as_str)
        {
            Some(ResumeAtKey::ABSENT) => ResumeAt::Absent,
            Some(v) => ResumeAtKey::parse(v).map_or(ResumeAt::Unknown, ResumeAt::Key),
            None => ResumeAt::Unknown,
        }
    }

    /// Whether `name` is in the announced `capabilities` list.
    pub fn announces(&self, name: &str) -> bool {
        self.announced.iter().any(|c| c == name)
    }

    /// Whether the release knows the hook event `event` and calls it in a session of
    /// ostler's (`PermissionRequest` is measured in a turn: known but never called counts as
    /// `false`; `None`: not measured).
    pub fn knows_hook_event(&self, event: &str) -> Option<bool> {
        self.hook_events.get(event).copied()
    }

    /// How the release treats the control request `subtype`.
    pub fn control_support(&self, subtype: &str) -> ControlSupport {
        self.control.get(subtype).copied().unwrap_or_default()
    }

    /// Every capability as one list of names, for health and `doctor`: the flags
    /// (`flag:--fork-session`), the control requests the release serves
    /// (`control:set_model`), then the announced `capabilities`.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = Flag::ALL
            .into_iter()
            .filter(|f| self.has_flag(*f))
            .map(|f| format!("flag:{}", f.as_arg()))
            .collect();
        v.extend(
            self.control
                .iter()
                .filter(|(_, s)| **s != ControlSupport::Unknown && s.served())
                .map(|(c, _)| format!("control:{c}")),
        );
        v.extend(
            self.options
                .iter()
                .filter(|(_, ok)| **ok)
                .map(|(f, _)| format!("option:{f}")),
        );
        v.extend(
            self.cli_requests
                .iter()
                .filter(|(_, ok)| **ok)
                .map(|(r, _)| format!("cli_request:{r}")),
        );
        v.extend(
            self.outputs
                .iter()
                .filter(|(_, ok)| **ok)
                .map(|(t, _)| format!("output:{t}")),
        );
        v.extend(
            self.inputs
                .iter()
                .filter(|(_, ok)| **ok)
                .map(|(f, _)| format!("input:{f}")),
        );
        v.extend(
            self.init_fields
                .iter()
                .filter(|(_, ok)| **ok)
                .map(|(f, _)| format!("init:{f}")),
        );
        v.extend(
            self.policies
                .iter()
                .filter(|(_, ok)| **ok)
                .map(|(f, _)| format!("policy:{f}")),
        );
        v.extend(self.announced.iter().cloned());
        v
    }

    /// Whether the release accepts the session-option flag `flag` (`None`: not measured).
    pub fn accepts_option(&self, flag: &str) -> Option<bool> {
        self.options.get(flag).copied()
    }

    /// Short human list, e.g. `stdio-permissions partial-messages fork-session`.
    pub fn summary(&self) -> String {
        let mut v = Vec::new();
        if self.stdio_permission_prompt {
            v.push("stdio-permissions".to_string());
        }
        if self.include_partial_messages {
            v.push("partial-messages".to_string());
        }
        if self.fork_session {
            v.push("fork-session".to_string());
        }
        if self.max_turns {
            v.push("max-turns".to_string());
        }
        v.push(format!("sdk-url:{}", self.sdk_url.as_str()));
        v.join(" ")
    }
}

/// A missing capability and what ostler does instead.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Degradation {
    pub capability: String,
    pub workaround: String,
}

// ---------------------------------------------------------------------------------------
// The embedded matrix (data generated from contracts/).

/// One release the project pins and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestedRelease {
    pub version: &'static str,
    /// `--permission-prompt-tool stdio` produced a `can_use_tool` control request.
    pub stdio_permission_prompt: bool,
    pub include_partial_messages: bool,
    pub fork_session: bool,
    pub max_turns: bool,
    pub sdk_url: SdkUrl,
    /// `capabilities` announced in `system/init` (empty: none announced).
    pub announced: &'static [&'static str],
    /// How the release treats each probed control request subtype (empty: not measured).
    pub control: &'static [(&'static str, ControlSupport)],
    /// Whether the release accepts each of [`PROBED_OPTIONS`] (empty: not measured).
    pub options: &'static [(&'static str, bool)],
    /// Control requests from the CLI ostler serves -> whether the whole exchange worked
    /// (`mcp_message`: SDK MCP servers; `elicitation`: MCP elicitations; empty: not
    /// measured).
    pub cli_requests: &'static [(&'static str, bool)],
    /// Dialect facts measured on the release ([`Dialect`] names -> value; empty: not
    /// measured).
    pub dialect: &'static [(&'static str, &'static str)],
    /// Hook events (the Agent SDKs' names) -> whether the release knows them (its own
    /// list of hook event names; empty: not measured).
    pub hook_events: &'static [(&'static str, bool)],
    /// Messages written on request -> whether the release wrote one when asked
    /// (`prompt_suggestion`; empty: not measured).
    pub outputs: &'static [(&'static str, bool)],
    /// User-message fields -> whether the release honoured each (see [`MESSAGE_FIELDS`];
    /// empty: not measured).
    pub inputs: &'static [(&'static str, bool)],
    /// `initialize` fields -> whether the release honoured each (see [`INIT_FIELDS`];
    /// empty: not measured).
    pub init_fields: &'static [(&'static str, bool)],
    /// Policies -> whether the release enforced each (see [`POLICIES`]; empty: not
    /// measured).
    pub policies: &'static [(&'static str, bool)],
    /// Why the release is pinned (boundary, contract recording, ...).
    pub note: &'static str,
}

/// Names of the dialect facts `cargo xtask compat probe` measures (the keys of
/// [`TestedRelease::dialect`] and [`Capabilities::dialect`]).
pub struct Dialect;

impl Dialect {
    /// What `--resume-session-at <x>` matches in the transcript: `uuid` (an entry's
    /// `uuid`), `message_id` (the API `message.id` of an assistant entry) or `absent`
    /// (the release has no such flag).
    pub const RESUME_SESSION_AT: &'static str = "resume_session_at";
}

/// Whether and how a release resumes at a message ([`Capabilities::resume_at`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeAt {
    /// The release has no `--resume-session-at`.
    Absent,
    /// It has, matching this.
    Key(ResumeAtKey),
    /// Not measured, and the pinned neighbours disagree.
    Unknown,
}

/// What `--resume-session-at` matches (see [`Dialect::RESUME_SESSION_AT`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeAtKey {
    /// The transcript entry's `uuid` (2.0.x and newer).
    Uuid,
    /// The API `message.id` of an assistant entry (1.0.128: the first entry of it).
    MessageId,
}

impl ResumeAtKey {
    /// The recorded value of a release without the flag.
    pub const ABSENT: &'static str = "absent";

    /// The recorded value (`uuid`, `message_id`) as a key; anything else is `None`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "uuid" => Some(ResumeAtKey::Uuid),
            "message_id" => Some(ResumeAtKey::MessageId),
            _ => None,
        }
    }

    /// The recorded value.
    pub fn as_str(self) -> &'static str {
        match self {
            ResumeAtKey::Uuid => "uuid",
            ResumeAtKey::MessageId => "message_id",
        }
    }
}

/// Name of the boundary after which `--sdk-url` refuses non-Anthropic hosts.
pub const SDK_URL_RESTRICTED: &str = "--sdk-url refuses non-Anthropic hosts";

/// A measured boundary: the newest release without a capability and the oldest with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Boundary {
    pub capability: &'static str,
    pub last_without: &'static str,
    pub first_with: &'static str,
    pub evidence: &'static str,
}

/// The compatibility matrix.
#[derive(Debug, Clone, Copy)]
pub struct Matrix {
    /// The oldest release on which the stdio permission protocol works.
    pub minimum: &'static str,
    /// Pinned releases, oldest first.
    pub tested: &'static [TestedRelease],
    pub boundaries: &'static [Boundary],
}

mod matrix_data {
    include!("matrix_generated.rs");
}

/// The matrix embedded in this build.
pub fn matrix() -> &'static Matrix {
    &matrix_data::MATRIX
}

impl Matrix {
    pub fn minimum_version(&self) -> Version {
        parse_static(self.minimum)
    }

    pub fn newest_tested(&self) -> Option<Version> {
        self.tested.iter().map(|t| parse_static(t.version)).max()
    }

    pub fn oldest_tested(&self) -> Option<Version> {
        self.tested.iter().map(|t| parse_static(t.version)).min()
    }

    pub fn row(&self, v: &Version) -> Option<&'static TestedRelease> {
        self.tested
            .iter()
            .find(|t| semver::Version::parse(t.version).is_ok_and(|tv| tv == *v))
    }

    pub fn boundary(&self, capability: &str) -> Option<&'static Boundary> {
        self.boundaries.iter().find(|b| b.capability == capability)
    }

    /// What the boundaries alone say about `flag` on `v`: `Some(true)` at or after the
    /// first release with it, `Some(false)` at or before the last without it, `None` in an
    /// unmeasured gap or when no boundary was recorded (then every tested release had it:
    /// `Some(true)` from the oldest tested on).
    pub fn infer_flag(&self, flag: Flag, v: &Version) -> Option<bool> {
        match self.boundary(flag.as_arg()) {
            Some(b) => {
                if *v >= parse_static(b.first_with) {
                    Some(true)
                } else if *v <= parse_static(b.last_without) {
                    Some(false)
                } else {
                    None
                }
            }
            None => self.oldest_tested().map(|o| *v >= o).filter(|x| *x),
        }
    }
}

/// `--sdk-url` on an unpinned release, from the measured boundaries.
fn infer_sdk_url(m: &Matrix, v: &Version) -> SdkUrl {
    let restricted = m.boundary(SDK_URL_RESTRICTED);
    if restricted.is_some_and(|b| *v >= parse_static(b.first_with)) {
        return SdkUrl::AnthropicOnly;
    }
    let before_restriction = restricted.is_none_or(|b| *v <= parse_static(b.last_without));
    match m.infer_flag(Flag::SdkUrl, v) {
        Some(true) if before_restriction => SdkUrl::Loopback,
        Some(false) => SdkUrl::Absent,
        _ => SdkUrl::Unknown,
    }
}

/// Control support of `v`: its pinned row; else, per subtype, `Unknown` unless the nearest
/// pinned releases on both sides agree (newer than every pinned release: the newest row).
/// A wrong "served" costs a timeout; a wrong "not served" would refuse a working request,
/// so a gap between disagreeing neighbours stays `Unknown`.
fn infer_control(m: &Matrix, v: &Version) -> BTreeMap<String, ControlSupport> {
    infer(m, v, |t| t.control, |o, n| o.served() == n.served())
}

/// Session-option flags of `v`: its pinned row, else what the nearest measured pinned
/// releases on both sides agree on (newer than every pinned release: the newest row).
fn infer_options(m: &Matrix, v: &Version) -> BTreeMap<String, bool> {
    infer(m, v, |t| t.options, |o, n| o == n)
}

/// A per-release table (`column` of a row) for `v`: its pinned row; else the entries on
/// which the nearest measured pinned releases on both sides `agree` (the older one's value);
/// newer than every measured release: the newest row; older than all: nothing.
fn infer<S: Copy>(
    m: &Matrix,
    v: &Version,
    column: impl Fn(&TestedRelease) -> &[(&'static str, S)],
    agree: impl Fn(&S, &S) -> bool,
) -> BTreeMap<String, S> {
    let rows = |t: &TestedRelease| -> BTreeMap<String, S> {
        column(t)
            .iter()
            .map(|(c, s)| ((*c).to_string(), *s))
            .collect()
    };
    if let Some(r) = m.row(v) {
        return rows(r);
    }
    let measured = |t: &&TestedRelease| !column(t).is_empty();
    let older = m
        .tested
        .iter()
        .filter(measured)
        .filter(|t| parse_static(t.version) < *v)
        .max_by_key(|t| parse_static(t.version));
    let newer = m
        .tested
        .iter()
        .filter(measured)
        .filter(|t| parse_static(t.version) > *v)
        .min_by_key(|t| parse_static(t.version));
    match (older, newer) {
        (Some(o), None) => rows(o),
        (Some(o), Some(n)) => {
            let n = rows(n);
            rows(o)
                .into_iter()
                .filter(|(c, s)| n.get(c).is_some_and(|ns| agree(s, ns)))
                .collect()
        }
        _ => BTreeMap::new(),
    }
}

fn parse_static(s: &str) -> Version {
    // The generator only writes versions it parsed; a bad one means a hand edit.
    Version::parse(s).unwrap_or_else(|_| Version::new(u64::MAX, 0, 0))
}

/// Flags measured on a binary by [`crate::discover::probe_flags`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlagProbe {
    /// Whether each probed flag was accepted.
    pub accepted: BTreeMap<Flag, bool>,
    pub sdk_url: SdkUrl,
    /// Anything notable (e.g. a base option refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The verdict for one release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assessment {
    pub level: CompatLevel,
    pub capabilities: Capabilities,
    pub degraded: Vec<Degradation>,
    /// One human sentence (or a few) for logs, `doctor` and health.
    pub message: String,
}

/// Assess `version` against the embedded matrix, using `probe` (flags measured on the
/// binary) where available.
pub fn assess(version: &Version, probe: Option<&FlagProbe>) -> Assessment {
    assess_with(matrix(), version, probe)
}

/// [`assess`] against any matrix (tests).
pub fn assess_with(m: &Matrix, version: &Version, probe: Option<&FlagProbe>) -> Assessment {
    let minimum = m.minimum_version();
    let newest = m.newest_tested();
    let row = m.row(version);

    let probed = |f: Flag| probe.and_then(|p| p.accepted.get(&f).copied());
    // Probe (the binary's own answer) first, then the pinned row, then the boundaries.
    let flag = |f: Flag, from_row: Option<bool>| -> bool {
        probed(f)
            .or(from_row)
            .or_else(|| m.infer_flag(f, version))
            .unwrap_or(false)
    };
    let permission_flag = flag(
        Flag::PermissionPromptTool,
        row.map(|r| r.stdio_permission_prompt),
    );
    let stdio_works = *version >= minimum && permission_flag;
    let capabilities = Capabilities {
        stdio_permission_prompt: stdio_works,
        include_partial_messages: flag(
            Flag::IncludePartialMessages,
            row.map(|r| r.include_partial_messages),
        ),
        fork_session: flag(Flag::ForkSession, row.map(|r| r.fork_session)),
        max_turns: flag(Flag::MaxTurns, row.map(|r| r.max_turns)),
        sdk_url: probe
            .map(|p| p.sdk_url)
            .filter(|s| *s != SdkUrl::Unknown)
            .or(row.map(|r| r.sdk_url))
            .unwrap_or_else(|| infer_sdk_url(m, version)),
        announced: row
            .map(|r| r.announced.iter().map(|s| s.to_string()).collect())
            .unwrap_or_default(),
        control: infer_control(m, version),
        options: infer_options(m, version),
        cli_requests: infer(m, version, |t| t.cli_requests, |o, n| o == n),
        dialect: infer(m, version, |t| t.dialect, |o, n| o == n)
            .into_iter()
            .map(|(k, v)| (k, v.to_string()))
            .collect(),
        hook_events: infer(m, version, |t| t.hook_events, |o, n| o == n),
        outputs: infer(m, version, |t| t.outputs, |o, n| o == n),
        inputs: infer(m, version, |t| t.inputs, |o, n| o == n),
        init_fields: infer(m, version, |t| t.init_fields, |o, n| o == n),
        policies: infer(m, version, |t| t.policies, |o, n| o == n),
        source: if row.is_some() {
            CapabilitySource::Matrix
        } else if probe.is_some() {
            CapabilitySource::Probed
        } else {
            CapabilitySource::Inferred
        },
    };

    if *version < minimum {
        return Assessment {
            level: CompatLevel::Incompatible,
            message: format!(
                "Claude Code {version} is older than the minimum supported release {minimum} \
                 (the oldest release on which `--permission-prompt-tool stdio` works); \
                 install {minimum} or newer: npm install -g @anthropic-ai/claude-code"
            ),
            capabilities,
            degraded: Vec::new(),
        };
    }
    if !stdio_works {
        return Assessment {
            level: CompatLevel::Incompatible,
            message: format!(
                "Claude Code {version} refuses `--permission-prompt-tool`, which ostler needs \
                 for permission prompts (minimum supported release: {minimum})"
            ),
            capabilities,
            degraded: Vec::new(),
        };
    }

    let mut degraded = Vec::new();
    if !capabilities.include_partial_messages {
        degraded.push(Degradation {
            capability: "--include-partial-messages".into(),
            workaround: "run without it: text arrives per content block (assistant frames), \
                         no token-by-token streaming"
                .into(),
        });
    }
    if !capabilities.fork_session {
        degraded.push(Degradation {
            capability: "--fork-session".into(),
            workaround: "forking a session is refused; resume continues the same session".into(),
        });
    }
    if !capabilities.max_turns {
        degraded.push(Degradation {
            capability: "--max-turns".into(),
            workaround: "turn limits are not passed to the CLI".into(),
        });
    }

    let newer = newest.as_ref().is_some_and(|n| version > n);
    let level = if !degraded.is_empty() {
        CompatLevel::Degraded
    } else if newer {
        CompatLevel::LikelyCompatible
    } else {
        CompatLevel::FullyCompatible
    };
    let tested_range = match &newest {
        Some(n) => format!("{minimum} to {n}"),
        None => "none".into(),
    };
    let mut message = match level {
        CompatLevel::FullyCompatible if row.is_some() => {
            format!("Claude Code {version} is a tested release (tested {tested_range})")
        }
        CompatLevel::FullyCompatible => {
            format!("Claude Code {version} is inside the tested range ({tested_range})")
        }
        CompatLevel::LikelyCompatible => format!(
            "Claude Code {version} is newer than every tested release (tested {tested_range}); \
             running with the newest adapter in tolerant mode"
        ),
        _ => format!(
            "Claude Code {version} lacks {}",
            degraded
                .iter()
                .map(|d| d.capability.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    if level == CompatLevel::Degraded {
        for d in &degraded {
            message.push_str(&format!("; {}: {}", d.capability, d.workaround));
        }
        if newer {
            message.push_str(&format!(" (also newer than tested {tested_range})"));
        }
    }
    Assessment {
        level,
        capabilities,
        degraded,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn support(v: &str, subtype: &str) -> ControlSupport {
        let v = Version::parse(v).expect("version");
        assess(&v, None).capabilities.control_support(subtype)
    }

    /// The embedded matrix carries the measured control support (contracts/compat/).
    #[test]
    fn control_support_comes_from_the_measured_rows() {
        assert_eq!(support("1.0.59", "set_model"), ControlSupport::NoAnswer);
        assert_eq!(support("1.0.59", "interrupt"), ControlSupport::Answered);
        assert_eq!(support("1.0.128", "set_model"), ControlSupport::Answered);
        assert_eq!(
            support("2.1.330", "get_context_usage"),
            ControlSupport::Answered
        );
        assert!(!support("1.0.108", "set_model").served());
        assert!(support("2.1.330", "set_model").served());
    }

    /// SDK MCP servers (`mcp_message`): measured per pinned release, inferred between
    /// agreeing neighbours, unknown in a gap where they disagree.
    #[test]
    fn sdk_mcp_servers_come_from_the_measured_rows() {
        let served = |v: &str| {
            assess(&Version::parse(v).expect("v"), None)
                .capabilities
                .cli_requests
                .get("mcp_message")
                .copied()
        };
        assert_eq!(served("1.0.59"), Some(false));
        assert_eq!(served("1.0.108"), Some(true));
        assert_eq!(served("2.0.77"), Some(true));
        assert_eq!(served("2.1.330"), Some(true));
        assert_eq!(served("2.1.400"), Some(true));
        assert_eq!(served("1.0.80"), None, "1.0.59 no, 1.0.108 yes");
    }

    /// Unpinned releases: known only where the pinned neighbours agree; newer than every
    /// pinned release: like the newest.
    #[test]
    fn control_support_of_unpinned_releases() {
        // Between 1.0.59 and 1.0.108, which both ignore set_model.
        assert_eq!(support("1.0.80", "set_model"), ControlSupport::NoAnswer);
        // Between 1.0.109 (no answer) and 1.0.117 (answered): not known, so tried.
        assert_eq!(support("1.0.112", "set_model"), ControlSupport::Unknown);
        assert!(support("1.0.112", "set_model").served());
        assert_eq!(support("2.1.400", "stop_task"), ControlSupport::Answered);
        let caps = assess(&Version::parse("2.1.330").expect("v"), None).capabilities;
        let names = caps.names();
        assert!(names.iter().any(|n| n == "control:set_model"), "{names:?}");
        assert!(
            names.iter().any(|n| n == "flag:--fork-session"),
            "{names:?}"
        );
        // Control requests from the CLI that ostler serves, where measured to work.
        for want in ["cli_request:mcp_message", "cli_request:elicitation"] {
            assert!(names.iter().any(|n| n == want), "{want}: {names:?}");
        }
        let old = assess(&Version::parse("1.0.59").expect("v"), None).capabilities;
        assert!(!old.names().iter().any(|n| n == "control:set_model"));
        assert!(!old.names().iter().any(|n| n.starts_with("cli_request:")));
        // PermissionRequest: known by 2.0.77 and 2.1.0 but measured never called there.
        let calls = |v: &str| {
            assess(&Version::parse(v).expect("v"), None)
                .capabilities
                .knows_hook_event("PermissionRequest")
        };
        assert_eq!(calls("2.0.77"), Some(false));
        assert_eq!(calls("2.1.0"), Some(false));
        assert_eq!(calls("2.1.121"), Some(true));
        assert_eq!(calls("2.1.50"), None, "2.1.0 no, 2.1.120 yes");
        // Session-option flags: measured rows, and agreeing neighbours for unpinned ones.
        assert_eq!(old.accepts_option("--max-budget-usd"), Some(false));
        assert_eq!(caps.accepts_option("--max-budget-usd"), Some(true));
        let gap = assess(&Version::parse("1.0.80").expect("v"), None).capabilities;
        assert_eq!(gap.accepts_option("--setting-sources"), Some(false));
        assert_eq!(
            gap.accepts_option("--settings"),
            None,
            "1.0.59 no, 1.0.108 yes"
        );
    }
}
