//! `ostler-fake-claude`: a fast fake of the `claude` CLI (release 2.1.330) for tests and
//! benchmarks. No node start-up: a session process is up in about a millisecond.
//!
//! What it does, like the real CLI:
//! - `--version` prints `2.1.330 (Claude Code)` (before any option is validated);
//! - print mode with `--input-format stream-json --output-format stream-json --verbose`
//!   (`-p` may be left out with both formats stream-json, as the Agent SDKs start it);
//!   an unknown option gives `error: unknown option '--x'` and exit 1 (so the daemon's flag
//!   probe passes: every flag ostler uses is accepted, `--sdk-url` refuses non-Anthropic
//!   hosts as 2.1.121+ do); stdin at EOF without a message exits 0;
//! - each user message read from stdin starts a turn: `system/init`, then the turn's lines,
//!   ending in a `result`. Every line is a recorded 2.1.330 shape taken from
//!   `contracts/claude-code/2.1.330/*.ndjson` (the `cli` envelopes), with the session id,
//!   message ids and texts filled in;
//! - `control_request`s are answered with a `control_response`: `initialize`, `interrupt`
//!   (a running turn ends with the recorded interrupted `result`), `set_model`,
//!   `set_permission_mode`; any other subtype gets the recorded `unsupported_request` error;
//! - the conversation is kept in a transcript file under
//!   `$HOME/.claude/projects/<cwd with every non-alphanumeric character as '-'>/<id>.jsonl`
//!   (a user entry is written when its turn starts and keeps the message's `uuid`, like the
//!   real CLI's; a message queued behind a running turn is not there yet);
//!   `--resume ID` continues it (`--fork-session`: under a new id), and a resume without a
//!   transcript fails like the real CLI: `No conversation found with session ID: ID` on
//!   stderr, exit 1.
//!
//! ## Modes
//! Chosen by the user message's text when it starts with `fake:`, otherwise by the
//! environment variable `FAKE_CLAUDE_MODE` (same syntax; note that the daemon does not pass
//! arbitrary variables to the CLI, so through `ostler serve` use the message text), else
//! `echo`:
//! - `echo` (default): the recorded plain-text turn; the answer is
//!   `Hello from the fake model! (turn N)`. With `--include-partial-messages` the answer is
//!   also streamed as `stream_event` text deltas.
//! - `fake:recall`: the answer is the text of the previous user message of the conversation
//!   (read back from the transcript, so it survives `--resume`).
//! - `fake:firehose N`: N lines as fast as the pipe allows, each one a stored event: a
//!   cycle of an assistant text frame (its own message id), a user `tool_result` and a
//!   `system/status` line, then `result`.
//! - `fake:partials N`: N `stream_event` text deltas (only with
//!   `--include-partial-messages`, as the real CLI), then the whole text as one assistant
//!   frame and `result`.
//! - `fake:paced R N`: N assistant text frames at R lines per second. Each carries its write
//!   time in nanoseconds since the Unix epoch, in its text (`sent_ns=<n>`, readable from the
//!   `AssistantBlock` a client receives) and in the top-level field [`SENT_NS_FIELD`] of the
//!   raw line.
//! - `fake:tool`: the recorded tool turn: an assistant `tool_use` (Bash), a `can_use_tool`
//!   control request, and after the `control_response` a tool result (allowed or denied)
//!   and a final answer.
//! - `fake:sleep MS`: waits MS milliseconds before answering (an interrupt ends the wait).
//! - `fake:exit CODE`: the process exits at once with CODE (a crashing CLI).

use std::collections::VecDeque;
use std::io::{BufRead, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

/// What `--version` prints.
pub const VERSION_OUTPUT: &str = "2.1.330 (Claude Code)";

/// Top-level field of a paced line holding its write time (ns since the Unix epoch).
pub const SENT_NS_FIELD: &str = "fake_sent_ns";

/// Environment variable naming the default mode.
pub const MODE_ENV: &str = "FAKE_CLAUDE_MODE";

/// The recordings the shapes come from.
const PLAIN_TEXT: &str = include_str!("../../../contracts/claude-code/2.1.330/plain_text.ndjson");
const CONTROL: &str = include_str!("../../../contracts/claude-code/2.1.330/control.ndjson");
const TOOL_ALLOWED: &str =
    include_str!("../../../contracts/claude-code/2.1.330/tool_allowed.ndjson");
const TOOL_DENIED: &str = include_str!("../../../contracts/claude-code/2.1.330/tool_denied.ndjson");
const INTERRUPT: &str = include_str!("../../../contracts/claude-code/2.1.330/interrupt.ndjson");

/// A turn's behaviour (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    Echo,
    Recall,
    Firehose(u64),
    Partials(u64),
    Paced { per_sec: u64, lines: u64 },
    Tool,
    Sleep(u64),
    Exit(i32),
}

impl Mode {
    /// Parses `fake:...`; `None` when `text` is not a directive.
    pub fn parse(text: &str) -> Option<Result<Mode, String>> {
        let rest = text.trim().strip_prefix("fake:")?;
        let mut words = rest.split_whitespace();
        let name = words.next().unwrap_or("");
        let mut num = |what: &str| -> Result<u64, String> {
            words
                .next()
                .ok_or_else(|| format!("fake:{name} needs {what}"))?
                .parse::<u64>()
                .map_err(|e| format!("fake:{name}: bad {what}: {e}"))
        };
        Some(match name {
            "echo" => Ok(Mode::Echo),
            "recall" => Ok(Mode::Recall),
            "firehose" => num("a line count").map(Mode::Firehose),
            "partials" => num("a delta count").map(Mode::Partials),
            "paced" => num("a rate (lines/s)").and_then(|per_sec| {
                let lines = num("a line count")?;
                if per_sec == 0 {
                    return Err("fake:paced: the rate must be positive".into());
                }
                Ok(Mode::Paced { per_sec, lines })
            }),
            "tool" => Ok(Mode::Tool),
            "sleep" => num("milliseconds").map(Mode::Sleep),
            "exit" => num("an exit code").map(|c| Mode::Exit(i32::try_from(c).unwrap_or(1))),
            other => Err(format!("unknown fake mode {other:?}")),
        })
    }
}

/// Parsed command line.
#[derive(Debug, Default)]
struct Args {
    print: bool,
    verbose: bool,
    input_format: Option<String>,
    output_format: Option<String>,
    permission_prompt_tool: Option<String>,
    partials: bool,
    model: Option<String>,
    permission_mode: Option<String>,
    resume: Option<String>,
    fork: bool,
    sdk_url: Option<String>,
    replay: bool,
}

enum Parsed {
    Version,
    Run(Args),
}

/// Options taking one value.
const WITH_VALUE: &[&str] = &[
    "--input-format",
    "--output-format",
    "--permission-prompt-tool",
    "--model",
    "--permission-mode",
    "--append-system-prompt",
    "--system-prompt",
    "--max-turns",
    "--resume",
    "--sdk-url",
    "--session-id",
    "--settings",
    "--fallback-model",
    "--max-thinking-tokens",
];
/// Options taking values up to the next option.
const VARIADIC: &[&str] = &[
    "--allowedTools",
    "--allowed-tools",
    "--disallowedTools",
    "--disallowed-tools",
    "--add-dir",
    "--mcp-config",
];
/// Options without a value.
const SWITCHES: &[&str] = &[
    "-p",
    "--print",
    "--verbose",
    "--include-partial-messages",
    "--fork-session",
    "--dangerously-skip-permissions",
    "--strict-mcp-config",
    "--replay-user-messages",
];

fn parse_args(argv: &[String]) -> Result<Parsed, String> {
    // `--version` is answered before options are validated.
    if argv.iter().any(|a| a == "--version" || a == "-v") {
        return Ok(Parsed::Version);
    }
    let mut a = Args::default();
    let mut i = 0;
    while i < argv.len() {
        let arg = &argv[i];
        i += 1;
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        if !name.starts_with('-') {
            return Err(format!(
                "error: ostler-fake-claude takes no prompt argument (got {:?}); send messages on stdin",
                truncate(name, 80)
            ));
        }
        if SWITCHES.contains(&name) {
            match name {
                "-p" | "--print" => a.print = true,
                "--verbose" => a.verbose = true,
                "--include-partial-messages" => a.partials = true,
                "--fork-session" => a.fork = true,
                "--replay-user-messages" => a.replay = true,
                _ => {}
            }
        } else if WITH_VALUE.contains(&name) {
            let v = match inline {
                Some(v) => v,
                None => {
                    let v = argv.get(i).cloned().ok_or_else(|| {
                        format!("error: option '{name} <value>' argument missing")
                    })?;
                    i += 1;
                    v
                }
            };
            match name {
                "--input-format" => a.input_format = Some(v),
                "--output-format" => a.output_format = Some(v),
                "--permission-prompt-tool" => a.permission_prompt_tool = Some(v),
                "--model" => a.model = Some(v),
                "--permission-mode" => a.permission_mode = Some(v),
                "--resume" => a.resume = Some(v),
                "--sdk-url" => a.sdk_url = Some(v),
                _ => {}
            }
        } else if VARIADIC.contains(&name) {
            while i < argv.len() && !argv[i].starts_with('-') {
                i += 1;
            }
        } else {
            return Err(format!("error: unknown option '{}'", truncate(name, 200)));
        }
    }
    Ok(Parsed::Run(a))
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The whole program: returns the exit code.
pub fn run(argv: &[String]) -> i32 {
    let args = match parse_args(argv) {
        Ok(Parsed::Version) => {
            println!("{VERSION_OUTPUT}");
            return 0;
        }
        Ok(Parsed::Run(a)) => a,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    if let Err(e) = check_args(&args) {
        eprintln!("{e}");
        return 1;
    }
    let session = match Session::open(&args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    let stdout = match std::io::stdout().as_fd_file() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("cannot use stdout: {e}");
            return 1;
        }
    };
    let default_mode = std::env::var(MODE_ENV).ok();
    let mut fake = Fake {
        out: BufWriter::with_capacity(1 << 16, stdout),
        shapes: Shapes::load(),
        session,
        partials: args.partials,
        replay: args.replay,
        model: args.model.unwrap_or_else(|| "claude-opus-5-5".into()),
        permission_mode: args.permission_mode.unwrap_or_else(|| "default".into()),
        default_mode,
        queued: VecDeque::new(),
        eof: false,
        interrupted: false,
        requests: 0,
    };
    let rx = spawn_stdin_reader();
    // Err: the reader of our stdout went away; the real CLI dies the same way.
    fake.main_loop(&rx).unwrap_or(1)
}

fn check_args(a: &Args) -> Result<(), String> {
    if let Some(url) = &a.sdk_url {
        let host = url
            .split("://")
            .nth(1)
            .unwrap_or(url)
            .split(['/', ':'])
            .next()
            .unwrap_or("");
        if !(host == "anthropic.com" || host.ends_with(".anthropic.com")) {
            return Err(format!(
                "Error: --sdk-url rejected: host \"{}\" is not an approved Anthropic endpoint.",
                truncate(host, 200)
            ));
        }
        return Err("Error: ostler-fake-claude does not implement the --sdk-url transport".into());
    }
    // The real CLI runs headless without `-p` when both formats are stream-json (the way
    // the Agent SDKs start it); anything else needs `-p` here.
    let sdk_mode = a.input_format.as_deref() == Some("stream-json")
        && a.output_format.as_deref() == Some("stream-json");
    if !a.print && !sdk_mode {
        return Err("Error: ostler-fake-claude only runs in print mode (-p)".into());
    }
    if a.input_format.as_deref() != Some("stream-json") {
        return Err("Error: ostler-fake-claude needs --input-format stream-json".into());
    }
    if a.output_format.as_deref() != Some("stream-json") {
        return Err("Error: ostler-fake-claude needs --output-format stream-json".into());
    }
    if !a.verbose {
        return Err(
            "Error: When using --print, --output-format=stream-json requires --verbose".into(),
        );
    }
    if let Some(t) = &a.permission_prompt_tool
        && t != "stdio"
    {
        return Err(format!(
            "Error: MCP tool {} (passed via --permission-prompt-tool) not found.",
            truncate(t, 200)
        ));
    }
    if a.fork && a.resume.is_none() {
        return Err("Error: --fork-session requires --resume or --continue".into());
    }
    Ok(())
}

/// stdout as a plain file: Rust's `Stdout` is line-buffered, one `write` per line.
trait AsFdFile {
    fn as_fd_file(&self) -> std::io::Result<std::fs::File>;
}

impl AsFdFile for std::io::Stdout {
    fn as_fd_file(&self) -> std::io::Result<std::fs::File> {
        use std::os::fd::AsFd;
        Ok(std::fs::File::from(self.as_fd().try_clone_to_owned()?))
    }
}

/// The conversation: id and transcript file.
struct Session {
    id: String,
    cwd: String,
    transcript: PathBuf,
    /// User message texts of the conversation so far.
    history: Vec<String>,
}

impl Session {
    fn open(a: &Args) -> Result<Session, String> {
        let home = std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .ok_or("Error: HOME is not set")?;
        let cwd = std::env::current_dir()
            .map_err(|e| format!("Error: no current directory: {e}"))?
            .to_string_lossy()
            .into_owned();
        let project: String = cwd
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let dir = Path::new(&home)
            .join(".claude")
            .join("projects")
            .join(project);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("Error: cannot create {}: {e}", dir.display()))?;
        let (id, history) = match &a.resume {
            Some(old) => {
                let valid = !old.is_empty()
                    && old.len() <= 64
                    && old
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
                let path = dir.join(format!("{old}.jsonl"));
                let text = match std::fs::read_to_string(&path) {
                    Ok(t) if valid => t,
                    _ => {
                        return Err(format!(
                            "No conversation found with session ID: {}",
                            truncate(old, 100)
                        ));
                    }
                };
                let history = text
                    .lines()
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                    .filter(|v| v["type"] == "user")
                    .filter_map(|v| v["text"].as_str().map(str::to_string))
                    .collect::<Vec<_>>();
                if a.fork {
                    let id = new_uuid();
                    std::fs::write(dir.join(format!("{id}.jsonl")), text)
                        .map_err(|e| format!("Error: cannot fork the transcript: {e}"))?;
                    (id, history)
                } else {
                    (old.clone(), history)
                }
            }
            None => (new_uuid(), Vec::new()),
        };
        let transcript = dir.join(format!("{id}.jsonl"));
        Ok(Session {
            id,
            cwd,
            transcript,
            history,
        })
    }

    fn record(&self, kind: &str, text: &str) -> std::io::Result<()> {
        self.append(json!({"type": kind, "text": text}))
    }

    /// A user entry keeps the `uuid` the message came with, as the real CLI's does.
    fn record_user(&self, text: &str, uuid: Option<&str>) -> std::io::Result<()> {
        let mut entry = json!({"type": "user", "text": text});
        if let Some(u) = uuid {
            entry["uuid"] = json!(u);
        }
        self.append(entry)
    }

    fn append(&self, entry: Value) -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.transcript)?;
        let mut line = serde_json::to_vec(&entry)?;
        line.push(b'\n');
        f.write_all(&line)
    }
}

/// A random-enough v4-shaped UUID without a dependency: std's per-process random hash keys
/// mixed with the time and the pid.
fn new_uuid() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut words = [0u64; 2];
    for (i, w) in words.iter_mut().enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(now_ns());
        h.write_u32(std::process::id());
        h.write_usize(i);
        *w = h.finish();
    }
    let b: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-4{}-{}{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[13..16],
        ["8", "9", "a", "b"][usize::from(b[8] & 3)],
        &hex[17..20],
        &hex[20..32]
    )
}

/// A paced line's stand-in for its write time: as many digits as nanoseconds since the Unix
/// epoch have from 2001 to 2286, and found nowhere else in a line.
const PLACEHOLDER_NS: &str = "1111111111111111111";

/// Overwrites every occurrence of `placeholder` in `line` with `digits`; false (and nothing
/// changed) when the two differ in length.
fn stamp(line: &mut [u8], placeholder: &[u8], digits: &[u8]) -> bool {
    if placeholder.len() != digits.len() {
        return false;
    }
    let mut i = 0;
    while i + placeholder.len() <= line.len() {
        if &line[i..i + placeholder.len()] == placeholder {
            line[i..i + placeholder.len()].copy_from_slice(digits);
            i += placeholder.len();
        } else {
            i += 1;
        }
    }
    true
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// One line read from stdin.
enum Input {
    /// A user message's text and the `uuid` it came with.
    User(String, Option<String>),
    Control {
        request_id: String,
        request: Value,
    },
    /// A `control_response` to one of our requests (`can_use_tool`).
    Response {
        request_id: String,
        response: Value,
    },
    Eof,
}

fn spawn_stdin_reader() -> mpsc::Receiver<Input> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut lock = stdin.lock();
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match lock.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let Ok(v) = serde_json::from_slice::<Value>(&buf) else {
                if !buf.iter().all(u8::is_ascii_whitespace) {
                    eprintln!("ostler-fake-claude: ignoring a line that is not JSON");
                }
                continue;
            };
            let input = match v["type"].as_str() {
                Some("user") => Input::User(
                    user_text(&v["message"]["content"]),
                    v["uuid"].as_str().map(str::to_string),
                ),
                Some("control_request") => Input::Control {
                    request_id: v["request_id"].as_str().unwrap_or("").to_string(),
                    request: v["request"].clone(),
                },
                Some("control_response") => Input::Response {
                    request_id: v["response"]["request_id"]
                        .as_str()
                        .unwrap_or("")
                        .to_string(),
                    response: v["response"].clone(),
                },
                _ => continue,
            };
            if tx.send(input).is_err() {
                return;
            }
        }
        let _ = tx.send(Input::Eof);
    });
    rx
}

/// The text of a user message's content (a string or text blocks).
fn user_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Recorded 2.1.330 lines used as templates.
struct Shapes {
    init: Value,
    status: Value,
    assistant_text: Value,
    tool_use: Value,
    can_use_tool: Value,
    tool_result: Value,
    tool_denied_result: Value,
    result: Value,
    interrupted_result: Value,
    interrupted_user: Value,
    message_start: Value,
    block_start: Value,
    text_delta: Value,
    block_stop: Value,
    message_delta: Value,
    message_stop: Value,
    initialize: Value,
    set_model_replay: Value,
    unsupported: Value,
}

fn cli_lines(recording: &str) -> Vec<Value> {
    recording
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["dir"] == "cli")
        .map(|v| v["line"].clone())
        .collect()
}

fn find(lines: &[Value], what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    lines
        .iter()
        .find(|v| pred(v))
        .cloned()
        // The recordings are compiled in: a missing shape is a bug caught by the tests.
        .unwrap_or_else(|| panic!("no {what} line in the 2.1.330 recordings"))
}

impl Shapes {
    fn load() -> Shapes {
        let plain = cli_lines(PLAIN_TEXT);
        let control = cli_lines(CONTROL);
        let tool = cli_lines(TOOL_ALLOWED);
        let denied = cli_lines(TOOL_DENIED);
        let interrupt = cli_lines(INTERRUPT);
        let is = |t: &'static str| move |v: &Value| v["type"] == t;
        let ev = |t: &'static str| move |v: &Value| v["event"]["type"] == t;
        let has_block = |kind: &'static str| {
            move |v: &Value| v["type"] == "assistant" && v["message"]["content"][0]["type"] == kind
        };
        Shapes {
            init: find(&plain, "system/init", |v| v["subtype"] == "init"),
            status: find(&plain, "system/status", |v| v["subtype"] == "status"),
            assistant_text: find(&plain, "assistant text", has_block("text")),
            tool_use: find(&tool, "assistant tool_use", has_block("tool_use")),
            can_use_tool: find(&tool, "can_use_tool", is("control_request")),
            tool_result: find(&tool, "tool_result", is("user")),
            tool_denied_result: find(&denied, "denied tool_result", is("user")),
            result: find(&plain, "result", is("result")),
            interrupted_result: find(&interrupt, "interrupted result", is("result")),
            interrupted_user: find(&interrupt, "interrupted user", is("user")),
            message_start: find(&plain, "message_start", ev("message_start")),
            block_start: find(&interrupt, "content_block_start", ev("content_block_start")),
            text_delta: find(&interrupt, "text_delta", |v| {
                v["event"]["delta"]["type"] == "text_delta"
            }),
            block_stop: find(&plain, "content_block_stop", ev("content_block_stop")),
            message_delta: find(&plain, "message_delta", ev("message_delta")),
            message_stop: find(&plain, "message_stop", ev("message_stop")),
            initialize: find(&control, "initialize response", |v| {
                v["response"]["request_id"] == "ostler-req-1"
            }),
            set_model_replay: find(&control, "set_model replay", |v| {
                v["type"] == "user" && v["isReplay"] == true
            }),
            unsupported: find(&control, "unsupported response", |v| {
                v["response"]["error_code"] == "unsupported_request"
            }),
        }
    }
}

/// A line template with a counter (and optionally a time) filled in at write time.
struct Template {
    parts: Vec<Vec<u8>>,
}

const HOLE: &str = "\u{1}HOLE\u{1}";

impl Template {
    fn new(v: &Value) -> Template {
        let s = v.to_string();
        let hole = serde_json::to_string(HOLE).unwrap_or_default();
        let hole = hole.trim_matches('"');
        Template {
            parts: s.split(hole).map(|p| p.as_bytes().to_vec()).collect(),
        }
    }

    fn write(&self, out: &mut impl Write, fills: &[&[u8]]) -> std::io::Result<()> {
        for (i, p) in self.parts.iter().enumerate() {
            out.write_all(p)?;
            if i + 1 < self.parts.len() {
                out.write_all(fills.get(i).copied().unwrap_or(b""))?;
            }
        }
        out.write_all(b"\n")
    }
}

struct Fake {
    out: BufWriter<std::fs::File>,
    shapes: Shapes,
    session: Session,
    partials: bool,
    /// `--replay-user-messages`: echo each message when its turn starts.
    replay: bool,
    model: String,
    permission_mode: String,
    default_mode: Option<String>,
    /// User messages received during a turn, for the turns after it.
    queued: VecDeque<(String, Option<String>)>,
    eof: bool,
    interrupted: bool,
    /// Our own control requests (`can_use_tool`) so far.
    requests: u64,
}

type Io<T> = std::io::Result<T>;

impl Fake {
    fn main_loop(&mut self, rx: &mpsc::Receiver<Input>) -> Io<i32> {
        loop {
            if let Some((text, uuid)) = self.queued.pop_front() {
                if let Some(code) = self.turn(rx, &text, uuid.as_deref())? {
                    return Ok(code);
                }
                continue;
            }
            if self.eof {
                self.out.flush()?;
                return Ok(0);
            }
            match rx.recv() {
                Ok(Input::User(text, uuid)) => self.queued.push_back((text, uuid)),
                Ok(Input::Control {
                    request_id,
                    request,
                }) => self.control(&request_id, &request)?,
                Ok(Input::Response { .. }) => {}
                Ok(Input::Eof) | Err(_) => self.eof = true,
            }
        }
    }

    /// Handles what arrived while a turn runs; returns whether the turn was interrupted.
    fn poll(&mut self, rx: &mpsc::Receiver<Input>) -> Io<bool> {
        loop {
            match rx.try_recv() {
                Ok(Input::User(t, u)) => self.queued.push_back((t, u)),
                Ok(Input::Control {
                    request_id,
                    request,
                }) => self.control(&request_id, &request)?,
                Ok(Input::Response { .. }) => {}
                Ok(Input::Eof) => self.eof = true,
                Err(_) => return Ok(self.interrupted),
            }
        }
    }

    fn emit(&mut self, v: Value) -> Io<()> {
        let v = self.with_session(v);
        serde_json::to_writer(&mut self.out, &v)?;
        self.out.write_all(b"\n")
    }

    /// `v` with this session's id in its `session_id`, if it has one.
    fn with_session(&self, mut v: Value) -> Value {
        if let Some(o) = v.as_object_mut()
            && o.contains_key("session_id")
        {
            o.insert("session_id".into(), Value::String(self.session.id.clone()));
        }
        v
    }

    fn control(&mut self, request_id: &str, request: &Value) -> Io<()> {
        let subtype = request["subtype"].as_str().unwrap_or("");
        let success = |response: Value| {
            json!({"type": "control_response", "response": {
                "subtype": "success", "request_id": request_id, "response": response}})
        };
        let line = match subtype {
            "initialize" => {
                let mut v = self.shapes.initialize.clone();
                v["response"]["request_id"] = json!(request_id);
                v
            }
            "interrupt" => {
                self.interrupted = true;
                success(json!({"still_queued": []}))
            }
            "set_model" => {
                let model = request["model"].as_str().unwrap_or("default").to_string();
                let mut replay = self.shapes.set_model_replay.clone();
                replay["message"]["content"] = json!(format!(
                    "<local-command-stdout>Set model to `{model}`</local-command-stdout>"
                ));
                self.emit(replay)?;
                self.model = model.clone();
                success(json!({"model": model}))
            }
            "set_permission_mode" => {
                let mode = request["mode"].as_str().unwrap_or("default").to_string();
                self.permission_mode = mode.clone();
                success(json!({"mode": mode}))
            }
            other => {
                let mut v = self.shapes.unsupported.clone();
                v["response"]["request_id"] = json!(request_id);
                v["response"]["error"] = json!(format!(
                    "Unsupported control request subtype: {}",
                    truncate(other, 100)
                ));
                v
            }
        };
        self.emit(line)?;
        self.out.flush()
    }

    /// One turn; `Some(code)` when the process must exit.
    fn turn(
        &mut self,
        rx: &mpsc::Receiver<Input>,
        text: &str,
        uuid: Option<&str>,
    ) -> Io<Option<i32>> {
        self.interrupted = false;
        let mode = match Mode::parse(text)
            .or_else(|| self.default_mode.as_deref().and_then(Mode::parse))
        {
            Some(Ok(m)) => m,
            Some(Err(e)) => {
                eprintln!("ostler-fake-claude: {e}; answering as `echo`");
                Mode::Echo
            }
            None => Mode::Echo,
        };
        if let Mode::Exit(code) = mode {
            self.out.flush()?;
            return Ok(Some(code));
        }
        let previous = self.session.history.last().cloned();
        self.session.history.push(text.to_string());
        self.session.record_user(text, uuid)?;
        if self.replay {
            // `--replay-user-messages`: the message taken into this turn, echoed.
            let mut echo = self.shapes.set_model_replay.clone();
            echo["message"]["content"] = json!(text);
            if let Some(u) = uuid {
                echo["uuid"] = json!(u);
            }
            self.emit(echo)?;
        }
        let turn = self.session.history.len();
        let mut init = self.shapes.init.clone();
        init["cwd"] = json!(self.session.cwd);
        init["model"] = json!(self.model);
        init["permissionMode"] = json!(self.permission_mode);
        self.emit(init)?;
        self.emit(self.shapes.status.clone())?;
        let msg_id = format!("msg_fake_{turn:02}_000");
        let answer = match mode {
            Mode::Echo => {
                let answer = format!("Hello from the fake model! (turn {turn})");
                self.streamed_answer(rx, &msg_id, &answer)?
            }
            Mode::Recall => {
                let answer = previous.unwrap_or_else(|| "(no earlier message)".into());
                self.streamed_answer(rx, &msg_id, &answer)?
            }
            Mode::Firehose(n) => self.firehose(rx, turn, n)?,
            Mode::Partials(n) => self.partials_turn(rx, &msg_id, n)?,
            Mode::Paced { per_sec, lines } => self.paced(rx, turn, per_sec, lines)?,
            Mode::Tool => self.tool(rx, turn)?,
            Mode::Sleep(ms) => {
                let end = Instant::now() + Duration::from_millis(ms);
                self.out.flush()?;
                while Instant::now() < end && !self.poll(rx)? {
                    std::thread::sleep(
                        end.saturating_duration_since(Instant::now())
                            .min(Duration::from_millis(5)),
                    );
                }
                if self.interrupted {
                    None
                } else {
                    let answer = format!("Slept {ms} ms.");
                    self.text_frame(&msg_id, &answer)?;
                    Some(answer)
                }
            }
            Mode::Exit(_) => None,
        };
        self.finish(turn, answer)?;
        Ok(None)
    }

    fn text_frame(&mut self, msg_id: &str, text: &str) -> Io<()> {
        let mut v = self.shapes.assistant_text.clone();
        v["message"]["id"] = json!(msg_id);
        v["message"]["model"] = json!(self.model);
        v["message"]["content"][0]["text"] = json!(text);
        self.emit(v)
    }

    fn stream_event(&mut self, mut v: Value, msg_id: &str) -> Io<()> {
        if v.get("api_message_id").is_some() {
            v["api_message_id"] = json!(msg_id);
        }
        if v["event"]["type"] == "message_start" {
            v["event"]["message"]["id"] = json!(msg_id);
            v["event"]["message"]["model"] = json!(self.model);
        }
        self.emit(v)
    }

    /// The answer as one text block, streamed as one delta when partials are on.
    fn streamed_answer(
        &mut self,
        rx: &mpsc::Receiver<Input>,
        msg_id: &str,
        answer: &str,
    ) -> Io<Option<String>> {
        if self.partials {
            self.stream_event(self.shapes.message_start.clone(), msg_id)?;
            self.stream_event(self.shapes.block_start.clone(), msg_id)?;
            let mut d = self.shapes.text_delta.clone();
            d["event"]["delta"]["text"] = json!(answer);
            self.stream_event(d, msg_id)?;
        }
        if self.poll(rx)? {
            return Ok(None);
        }
        self.text_frame(msg_id, answer)?;
        if self.partials {
            self.stream_event(self.shapes.block_stop.clone(), msg_id)?;
            self.stream_event(self.shapes.message_delta.clone(), msg_id)?;
            self.stream_event(self.shapes.message_stop.clone(), msg_id)?;
        }
        Ok(Some(answer.to_string()))
    }

    fn firehose(&mut self, rx: &mpsc::Receiver<Input>, turn: usize, n: u64) -> Io<Option<String>> {
        let mut frame = self.shapes.assistant_text.clone();
        frame["session_id"] = json!(self.session.id);
        frame["message"]["id"] = json!(format!("msg_fh_{turn}_{HOLE}"));
        frame["message"]["model"] = json!(self.model);
        frame["message"]["content"][0]["text"] = json!(format!(
            "Firehose line {HOLE}: the fake model keeps talking."
        ));
        let mut result = self.shapes.tool_result.clone();
        result["session_id"] = json!(self.session.id);
        result["message"]["content"][0]["tool_use_id"] = json!(format!("toolu_fh_{HOLE}"));
        result["message"]["content"][0]["content"] = json!(format!("firehose output {HOLE}"));
        let mut status = self.shapes.status.clone();
        status["session_id"] = json!(self.session.id);
        status["uuid"] = json!(format!("00000000-0000-4000-8000-{HOLE}"));
        let templates = [
            Template::new(&frame),
            Template::new(&result),
            Template::new(&status),
        ];
        let mut num = itoa_buf();
        for k in 0..n {
            let t = &templates[(k % 3) as usize];
            let s = fmt_num(&mut num, k);
            t.write(&mut self.out, &[s, s])?;
            if k % 1024 == 1023 && self.poll(rx)? {
                return Ok(None);
            }
        }
        Ok(Some(format!("Firehose of {n} lines done.")))
    }

    fn partials_turn(
        &mut self,
        rx: &mpsc::Receiver<Input>,
        msg_id: &str,
        n: u64,
    ) -> Io<Option<String>> {
        let mut text = String::new();
        for k in 0..n {
            text.push_str(&format!("p{k} "));
        }
        if self.partials {
            self.stream_event(self.shapes.message_start.clone(), msg_id)?;
            self.stream_event(self.shapes.block_start.clone(), msg_id)?;
            let mut d = self.shapes.text_delta.clone();
            d["session_id"] = json!(self.session.id);
            d["api_message_id"] = json!(msg_id);
            d["event"]["delta"]["text"] = json!(format!("p{HOLE} "));
            let t = Template::new(&d);
            let mut num = itoa_buf();
            for k in 0..n {
                let s = fmt_num(&mut num, k);
                t.write(&mut self.out, &[s])?;
                if k % 1024 == 1023 && self.poll(rx)? {
                    return Ok(None);
                }
            }
        }
        self.text_frame(msg_id, &text)?;
        if self.partials {
            self.stream_event(self.shapes.block_stop.clone(), msg_id)?;
            self.stream_event(self.shapes.message_delta.clone(), msg_id)?;
            self.stream_event(self.shapes.message_stop.clone(), msg_id)?;
        }
        Ok(Some(format!("{n} partial deltas sent.")))
    }

    fn paced(
        &mut self,
        rx: &mpsc::Receiver<Input>,
        turn: usize,
        per_sec: u64,
        lines: u64,
    ) -> Io<Option<String>> {
        let start = Instant::now();
        for k in 0..lines {
            let due = start + Duration::from_nanos(k.saturating_mul(1_000_000_000) / per_sec);
            let wait = due.saturating_duration_since(Instant::now());
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
            if self.poll(rx)? {
                return Ok(None);
            }
            // The line is built with a placeholder time of the same width (19 digits until
            // the year 2286), overwritten with the time just before the write: the stamp is
            // the write's time, not the start of building the line.
            let line = |sent: &str| -> Io<Vec<u8>> {
                let mut v = self.shapes.assistant_text.clone();
                v["message"]["id"] = json!(format!("msg_paced_{turn}_{k}"));
                v["message"]["model"] = json!(self.model);
                v["message"]["content"][0]["text"] = json!(format!("paced {k} sent_ns={sent}"));
                v[SENT_NS_FIELD] = serde_json::from_str(sent)?;
                let mut line = serde_json::to_vec(&self.with_session(v))?;
                line.push(b'\n');
                Ok(line)
            };
            let mut built = line(PLACEHOLDER_NS)?;
            let sent = now_ns().to_string();
            if !stamp(&mut built, PLACEHOLDER_NS.as_bytes(), sent.as_bytes()) {
                // Not 19 digits (before 2001 or after 2286): built again with the time.
                built = line(&sent)?;
            }
            self.out.write_all(&built)?;
            self.out.flush()?;
        }
        Ok(Some(format!("{lines} paced lines sent.")))
    }

    fn tool(&mut self, rx: &mpsc::Receiver<Input>, turn: usize) -> Io<Option<String>> {
        let msg_id = format!("msg_fake_{turn:02}_000");
        let tool_use_id = format!("toolu_fake_{turn}");
        let mut v = self.shapes.tool_use.clone();
        v["message"]["id"] = json!(msg_id);
        v["message"]["content"][0]["id"] = json!(tool_use_id);
        self.emit(v)?;
        self.requests += 1;
        let request_id = format!("fake-request-{}", self.requests);
        let mut req = self.shapes.can_use_tool.clone();
        req["request_id"] = json!(request_id);
        if req["request"].get("tool_use_id").is_some() {
            req["request"]["tool_use_id"] = json!(tool_use_id);
        }
        self.emit(req)?;
        self.out.flush()?;
        let decision = loop {
            match rx.recv() {
                Ok(Input::Response {
                    request_id: id,
                    response,
                }) if id == request_id => break Some(response),
                Ok(Input::Response { .. }) => {}
                Ok(Input::User(t, u)) => self.queued.push_back((t, u)),
                Ok(Input::Control {
                    request_id,
                    request,
                }) => {
                    self.control(&request_id, &request)?;
                    if self.interrupted {
                        break None;
                    }
                }
                Ok(Input::Eof) | Err(_) => {
                    self.eof = true;
                    break None;
                }
            }
        };
        let Some(decision) = decision else {
            return Ok(None);
        };
        let allowed = decision["response"]["behavior"] == "allow";
        let mut r = if allowed {
            self.shapes.tool_result.clone()
        } else {
            self.shapes.tool_denied_result.clone()
        };
        r["message"]["content"][0]["tool_use_id"] = json!(tool_use_id);
        if !allowed && let Some(m) = decision["response"]["message"].as_str() {
            r["message"]["content"][0]["content"] = json!(m);
        }
        self.emit(r)?;
        let answer = if allowed {
            "The command ran.".to_string()
        } else {
            "The command was denied.".to_string()
        };
        self.text_frame(&format!("msg_fake_{turn:02}_001"), &answer)?;
        Ok(Some(answer))
    }

    /// The `result` line (`None`: interrupted) and the transcript.
    fn finish(&mut self, turn: usize, answer: Option<String>) -> Io<()> {
        let line = match &answer {
            Some(text) => {
                let mut r = self.shapes.result.clone();
                r["result"] = json!(text);
                r["num_turns"] = json!(turn);
                r
            }
            None => {
                self.emit(self.shapes.interrupted_user.clone())?;
                self.shapes.interrupted_result.clone()
            }
        };
        self.emit(line)?;
        self.out.flush()?;
        self.interrupted = false;
        self.session
            .record("assistant", answer.as_deref().unwrap_or("[interrupted]"))
    }
}

fn itoa_buf() -> Vec<u8> {
    Vec::with_capacity(24)
}

fn fmt_num(buf: &mut Vec<u8>, n: u64) -> &[u8] {
    buf.clear();
    let _ = write!(buf, "{n}");
    buf
}
