//! Terminal output: colours (only on a terminal, never with `NO_COLOR`), the human form of
//! events, the progress spinner, and `--json` lines.

use std::collections::HashMap;
use std::io::{IsTerminal as _, Write as _};
use std::time::Instant;

use crossterm::style::Stylize as _;
use ostler_proto::v1 as pb;
use pb::session_event::Payload;
use serde_json::Value;

use super::json;

/// Whether to colour a stream: a terminal, and `NO_COLOR` unset (any value disables).
pub fn colour_for(is_terminal: bool) -> bool {
    is_terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Styles, no-ops when colour is off.
#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub on: bool,
}

impl Style {
    pub fn stdout() -> Self {
        Self {
            on: colour_for(std::io::stdout().is_terminal()),
        }
    }
    pub fn stderr() -> Self {
        Self {
            on: colour_for(std::io::stderr().is_terminal()),
        }
    }
    pub fn dim(self, s: &str) -> String {
        if self.on {
            mark(s.dim().to_string())
        } else {
            s.to_owned()
        }
    }
    pub fn bold(self, s: &str) -> String {
        if self.on {
            mark(s.bold().to_string())
        } else {
            s.to_owned()
        }
    }
    pub fn red(self, s: &str) -> String {
        if self.on {
            mark(s.red().to_string())
        } else {
            s.to_owned()
        }
    }
    pub fn green(self, s: &str) -> String {
        if self.on {
            mark(s.green().to_string())
        } else {
            s.to_owned()
        }
    }
    pub fn yellow(self, s: &str) -> String {
        if self.on {
            mark(s.yellow().to_string())
        } else {
            s.to_owned()
        }
    }
    pub fn cyan(self, s: &str) -> String {
        if self.on {
            mark(s.cyan().to_string())
        } else {
            s.to_owned()
        }
    }
}

/// `ostler: error: ...` on stderr.
pub fn error_line(msg: &str) {
    let st = Style::stderr();
    eprintln!(
        "{}",
        terminal_text(&format!("{} {msg}", st.red("ostler: error:")))
    );
}

/// What ostler's own styling writes where its escape sequences start, until the text is
/// written: a per-process random token that text from elsewhere cannot know, so
/// [`terminal_text`] can tell ostler's colours from escapes that came with the text.
static STYLE_MARK: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    use std::hash::{BuildHasher as _, Hasher as _};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("\u{e000}{:016x}\u{e001}", h.finish())
});

/// ostler's styled text, its escapes replaced by [`STYLE_MARK`].
fn mark(styled: String) -> String {
    styled.replace('\u{1b}', &STYLE_MARK)
}

/// Text about to be written to a terminal (or a pipe): everything from elsewhere made
/// harmless by [`terminal_safe`], then ostler's own styling (its marks) turned back into
/// escapes.
pub fn terminal_text(s: &str) -> std::borrow::Cow<'_, str> {
    let safe = terminal_safe(s);
    if safe.contains(STYLE_MARK.as_str()) {
        std::borrow::Cow::Owned(safe.replace(STYLE_MARK.as_str(), "\u{1b}"))
    } else {
        safe
    }
}

/// `s` made safe to write to a terminal: text from the model, the CLI or other clients
/// must not drive it (move the cursor, set the title, write the clipboard with OSC 52,
/// overwrite a line with `\r`, hide or blink text). Control characters other than `\n` and
/// `\t` are shown in caret notation (`^[`, `^A`, `^M`; C1 controls as `\u{9b}`), colour
/// sequences included. A `\r` before `\n` is dropped. Output goes through
/// [`terminal_text`], which turns only ostler's own colours (its marks) back into escapes.
pub fn terminal_safe(s: &str) -> std::borrow::Cow<'_, str> {
    let unsafe_char =
        |c: char| (c.is_control() && c != '\n' && c != '\t') || ('\u{80}'..='\u{9f}').contains(&c);
    if !s.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    let mut rest = s;
    while let Some(c) = rest.chars().next() {
        let len = c.len_utf8();
        if c == '\r' && rest[1..].starts_with('\n') {
            rest = &rest[1..];
            continue;
        }
        if unsafe_char(c) {
            let code = c as u32;
            if code < 0x20 {
                out.push('^');
                out.push(char::from_u32(code + 0x40).unwrap_or('?'));
            } else if code == 0x7f {
                out.push_str("^?");
            } else {
                out.push_str(&format!("\\u{{{code:x}}}"));
            }
        } else {
            out.push(c);
        }
        rest = &rest[len..];
    }
    std::borrow::Cow::Owned(out)
}

/// Write to stdout and flush. A reader that went away (`ostler sessions | head -1`, `ostler
/// watch --json | head -1`) ends the command quietly with exit 0, as ripgrep does: there is
/// no one left to tell, and a follower must not keep running for nobody. Other write errors
/// are ignored, as `println!` would not.
pub fn out(args: std::fmt::Arguments<'_>) {
    let text = match args.as_str() {
        Some(s) => std::borrow::Cow::Borrowed(s),
        None => std::borrow::Cow::Owned(args.to_string()),
    };
    out_bytes(terminal_text(&text).as_bytes());
}

/// Write to stdout as is (see [`out`]).
fn out_bytes(bytes: &[u8]) {
    let mut out = std::io::stdout().lock();
    let written = out.write_all(bytes).and_then(|()| out.flush());
    stdout_written(written);
}

/// Ends the process if `written` says stdout's reader is gone (see [`out`]).
pub fn stdout_written(written: std::io::Result<()>) {
    if let Err(e) = written
        && e.kind() == std::io::ErrorKind::BrokenPipe
    {
        let _ = std::io::stderr().flush();
        std::process::exit(0);
    }
}

/// Print one JSON value as a line on stdout: the text intact, and nothing in it that a
/// terminal acts on (serde_json leaves DEL and the C1 controls unescaped: they are written
/// as `\u007f`, `\u009b`, ..., which only strings can hold).
pub fn json_line(v: &Value) {
    let mut line = json_text(v);
    line.push('\n');
    out_bytes(line.as_bytes());
}

/// `v` as one line of JSON that a terminal does not act on (see [`json_line`]).
fn json_text(v: &Value) -> String {
    let mut line = v.to_string();
    if line.contains(|c: char| c == '\u{7f}' || ('\u{80}'..='\u{9f}').contains(&c)) {
        line = line
            .chars()
            .map(|c| {
                if c == '\u{7f}' || ('\u{80}'..='\u{9f}').contains(&c) {
                    format!("\\u{:04x}", c as u32)
                } else {
                    c.to_string()
                }
            })
            .collect();
    }
    line
}

/// Shorten to `max` characters (by chars), with an ellipsis.
pub fn clip(s: &str, max: usize) -> String {
    let one_line: String = s.lines().next().unwrap_or("").to_owned();
    let more_lines = s.lines().nth(1).is_some();
    let count = one_line.chars().count();
    if count > max {
        let cut: String = one_line.chars().take(max.saturating_sub(1)).collect();
        format!("{cut}…")
    } else if more_lines {
        format!("{one_line} …")
    } else {
        one_line
    }
}

/// The compact form of a tool call: `Bash(touch foo)`, `Read(src/main.rs)`, ...
pub fn tool_call(name: &str, input_json: &str) -> String {
    let input: Value = serde_json::from_str(input_json).unwrap_or(Value::Null);
    if let Some(q) = input
        .get("questions")
        .and_then(|q| q.get(0))
        .and_then(|q| q.get("question"))
        .and_then(Value::as_str)
    {
        return format!("{name}({})", clip(q, 80));
    }
    let key = [
        "command",
        "file_path",
        "path",
        "pattern",
        "url",
        "query",
        "description",
        "prompt",
    ]
    .iter()
    .find_map(|k| input.get(*k).and_then(Value::as_str));
    let arg = match key {
        Some(s) => clip(s, 80),
        None if input.as_object().is_some_and(|o| o.is_empty()) || input.is_null() => String::new(),
        None => clip(&input.to_string(), 80),
    };
    format!("{name}({arg})")
}

/// Human-readable token count: 1234 -> "1.2k".
pub fn tokens(n: u64) -> String {
    if n >= 10_000 {
        format!("{}k", n / 1000)
    } else if n >= 1000 {
        format!("{:.1}k", n as f64 / 1000.0)
    } else {
        n.to_string()
    }
}

/// Whether a turn succeeded.
pub fn is_success(t: &pb::TurnCompleted) -> bool {
    !t.is_error && t.subtype == "success"
}

/// The closing summary of a turn. An interrupted turn (the client or another one asked
/// for it) reads `⏹ interrupted`, without the CLI's `[ede_diagnostic]` lines.
pub fn summary(st: Style, t: &pb::TurnCompleted, wall_ms: u128, interrupted: bool) -> String {
    let u = t.usage.unwrap_or_default();
    let ok = is_success(t);
    let head = if ok {
        st.green("✓ done")
    } else if interrupted {
        st.yellow("⏹ interrupted")
    } else {
        // The CLI reports an API error as subtype `success` with `is_error`: say error.
        st.red(&format!(
            "✗ {}",
            if t.subtype.is_empty() || t.subtype == "success" {
                "error"
            } else {
                &t.subtype
            }
        ))
    };
    let dur = if t.duration_ms > 0 {
        t.duration_ms as f64 / 1000.0
    } else {
        wall_ms as f64 / 1000.0
    };
    let mut s = format!(
        "{head} · {} turn{} · {} in / {} out tokens · ${:.4} · {:.1}s",
        t.num_turns,
        if t.num_turns == 1 { "" } else { "s" },
        tokens(u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens),
        tokens(u.output_tokens),
        t.total_cost_usd,
        dur,
    );
    if !t.denied_tools.is_empty() {
        s.push_str(&format!(" · denied: {}", t.denied_tools.join(", ")));
    }
    let errors: Vec<&str> = t
        .errors
        .iter()
        .map(String::as_str)
        .filter(|e| !(interrupted && e.starts_with("[ede_diagnostic]")))
        .collect();
    if !ok && !errors.is_empty() {
        s.push_str(&format!("\n  {}", errors.join("\n  ")));
    }
    s
}

/// What the session is doing, for the spinner.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Activity {
    Idle,
    Model,
    Tool(String),
}

const FRAMES: &[&str] = &["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];

/// Prints events for humans: assistant text as it streams, tools compactly, a spinner on
/// stderr while the model or a tool works (only when stderr is a terminal).
pub struct Human {
    st: Style,
    err: Style,
    /// Blocks being shown through partial deltas, with the text shown so far (compared
    /// with the whole block when it comes: deltas this client missed leave holes).
    streamed: HashMap<(String, u32), String>,
    /// Whether stdout is at the start of a line.
    at_line_start: bool,
    /// Whether stdout is a terminal (then it shares the screen with stderr's notes).
    stdout_tty: bool,
    /// The current partial block, if text is streaming.
    streaming: Option<(String, u32)>,
    spinner: bool,
    spinner_shown: bool,
    frame: usize,
    activity: Activity,
    since: Instant,
    /// Tool names by tool_use id, for results.
    tools: std::collections::HashMap<String, String>,
    pub verbose: bool,
    started_shown: bool,
    /// Prompts are asked on the terminal (so request events need no line of their own).
    pub interactive: bool,
    /// Tool calls of permission requests, with the asking sub-agent's id (empty: the main
    /// agent), by request id.
    requests: std::collections::HashMap<String, (String, String)>,
    /// The sub-agent whose event is being shown: its id (or label) and its header line.
    agent_now: Option<(String, String)>,
    /// The sub-agent whose header the last stdout line stands under (`None`: the main
    /// agent's line, or none yet): a header is shown when the sub-agent changes.
    agent_shown: Option<String>,
    /// Labels of the sub-agents seen, by agent id (a sub-agent's permission request names
    /// only its id).
    agent_labels: HashMap<String, String>,
    /// Tests: stdout's text, kept instead of written.
    capture: Option<String>,
    /// Print a summary line for every completed turn (attach, show); `run` and `send`
    /// print theirs at the end instead.
    pub turn_summaries: bool,
    /// Notices go to stdout too (`show --events`: the whole log on one stream).
    pub notes_to_stdout: bool,
    /// An `interrupted` notice was seen in the current turn.
    interrupt_seen: bool,
    /// The last completed turn was interrupted.
    pub last_turn_interrupted: bool,
}

impl Human {
    pub fn new(spinner: bool, verbose: bool) -> Self {
        Self {
            st: Style::stdout(),
            err: Style::stderr(),
            streamed: HashMap::new(),
            at_line_start: true,
            stdout_tty: std::io::stdout().is_terminal(),
            streaming: None,
            spinner: spinner && std::io::stderr().is_terminal(),
            spinner_shown: false,
            frame: 0,
            activity: Activity::Idle,
            since: Instant::now(),
            tools: Default::default(),
            verbose,
            started_shown: false,
            interactive: false,
            requests: Default::default(),
            agent_now: None,
            agent_shown: None,
            agent_labels: HashMap::new(),
            capture: None,
            turn_summaries: false,
            notes_to_stdout: false,
            interrupt_seen: false,
            last_turn_interrupted: false,
        }
    }

    /// Everything on stdout, styled for stdout (`show --events`).
    pub fn all_on_stdout(&mut self) {
        self.notes_to_stdout = true;
        self.err = self.st;
    }

    /// Whether the spinner wants ticks.
    pub fn spinning(&self) -> bool {
        self.spinner && self.activity != Activity::Idle
    }

    /// Redraw the spinner (called on a timer).
    pub fn tick(&mut self) {
        if !self.spinning() || !self.at_line_start {
            return;
        }
        self.frame = (self.frame + 1) % FRAMES.len();
        let what = match &self.activity {
            Activity::Idle => return,
            Activity::Model => "thinking".to_owned(),
            Activity::Tool(t) => format!("running {t}"),
        };
        let line = format!(
            "{} {what}… {}s (Ctrl-C interrupts)",
            FRAMES[self.frame],
            self.since.elapsed().as_secs()
        );
        let mut e = std::io::stderr().lock();
        let _ = write!(e, "\r\x1b[2K{}", terminal_text(&self.err.cyan(&line)));
        let _ = e.flush();
        self.spinner_shown = true;
    }

    /// Remove the spinner line before printing.
    pub fn clear_spinner(&mut self) {
        if self.spinner_shown {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r\x1b[2K");
            let _ = e.flush();
            self.spinner_shown = false;
        }
    }

    fn set_activity(&mut self, a: Activity) {
        if self.activity != a {
            self.activity = a;
            self.since = Instant::now();
        }
    }

    /// Write to stdout (or to the capture of a test).
    fn write(&mut self, args: std::fmt::Arguments<'_>) {
        match &mut self.capture {
            Some(c) => c.push_str(&terminal_text(&args.to_string())),
            None => out(args),
        }
    }

    /// Print a whole line on stdout (ending a streaming line first), under the header of
    /// the sub-agent whose event is shown when the last line was not.
    pub fn line(&mut self, s: &str) {
        self.clear_spinner();
        let nl = if self.at_line_start { "" } else { "\n" };
        let agent = self.agent_now.as_ref().map(|(id, _)| id);
        let header = match &self.agent_now {
            Some((_, header)) if agent != self.agent_shown.as_ref() => format!("{header}\n"),
            _ => String::new(),
        };
        self.agent_shown = agent.cloned();
        self.write(format_args!("{nl}{header}{s}\n"));
        self.at_line_start = true;
        self.streaming = None;
    }

    /// End a streaming line, if one is open.
    pub fn end_line(&mut self) {
        if !self.at_line_start {
            self.write(format_args!("\n"));
            self.at_line_start = true;
        }
        self.streaming = None;
    }

    /// Print a notice on stderr. On a terminal, where stdout and stderr share the screen, a
    /// streaming stdout line is ended first so that the notice stands on its own, and the
    /// next sub-agent line shows its header again (the notice came between); when stdout
    /// is redirected it keeps the text as it came (a notice must not put a line break into
    /// the middle of an answer that is being captured, nor a header into a sub-agent's
    /// lines).
    pub fn note(&mut self, s: &str) {
        if self.notes_to_stdout {
            self.line(s);
            return;
        }
        self.yield_terminal();
        eprintln!("{}", terminal_text(s));
    }

    /// Something other than stdout is about to write to the terminal (a notice, a prompt):
    /// the spinner goes; where stdout shares the terminal, a streaming line is ended and
    /// the next sub-agent line shows its header again.
    pub fn yield_terminal(&mut self) {
        self.clear_spinner();
        if self.stdout_tty {
            if !self.at_line_start {
                self.write(format_args!("\n"));
                self.at_line_start = true;
                self.streaming = None;
            }
            self.agent_shown = None;
        }
    }

    /// The label of the sub-agent with this id, as its lines are headed (`None`: none of
    /// its events seen). The one map of labels; the permission prompt asks it.
    pub fn agent_label_of(&self, agent_id: &str) -> Option<&str> {
        self.agent_labels.get(agent_id).map(String::as_str)
    }

    /// Who asks a request naming `agent_id`: `None` for the main agent (no id), else the
    /// sub-agent's label as its lines are headed (`sub-agent ID` when none was seen).
    pub fn asker(&self, agent_id: &str) -> Option<String> {
        if agent_id.is_empty() {
            return None;
        }
        self.agent_label_of(agent_id)
            .map(str::to_owned)
            .or_else(|| agent_label(agent_id, "", ""))
    }

    /// A file change: its headline, then its diff (the first [`DIFF_LINES`] lines unless
    /// verbose), added lines green, removed red.
    fn show_file_change(&mut self, indent: &str, change: &FileChange) {
        let st = self.st;
        self.line(&st.dim(&format!("{indent}  ⎿ {}", change.headline)));
        let shown = if self.verbose { usize::MAX } else { DIFF_LINES };
        for l in change.lines.iter().take(shown) {
            let line = format!("{indent}      {l}");
            self.line(&match l.chars().next() {
                Some('+') => st.green(&line),
                Some('-') => st.red(&line),
                _ => st.dim(&line),
            });
        }
        if change.lines.len() > shown {
            let more = change.lines.len() - shown;
            self.line(&st.dim(&format!(
                "{indent}      … {more} more lines (--verbose shows them)"
            )));
        }
    }

    fn stream_text(&mut self, key: (String, u32), text: &str) {
        self.clear_spinner();
        let nl = if self.streaming.as_ref() != Some(&key) && !self.at_line_start {
            "\n"
        } else {
            ""
        };
        self.write(format_args!("{nl}{text}"));
        self.at_line_start = text.ends_with('\n');
        self.streaming = Some(key);
        // Only the main agent's text streams.
        self.agent_shown = None;
    }

    /// The sub-agent an event comes from, as its id (its label when the CLI sent no id) and
    /// its label; remembered by id for its permission requests, which name only the id.
    fn event_agent(&mut self, p: &Payload) -> Option<(String, String)> {
        let (id, kind, task) = match p {
            Payload::UserMessage(m) => (&m.agent_id, &m.subagent_type, &m.task_description),
            Payload::AssistantBlock(b) => (&b.agent_id, &b.subagent_type, &b.task_description),
            Payload::ToolResult(r) => (&r.agent_id, &r.subagent_type, &r.task_description),
            Payload::PermissionRequested(r) => {
                let label = self.agent_labels.get(&r.agent_id)?;
                return Some((r.agent_id.clone(), label.clone()));
            }
            Payload::PermissionResolved(r) => {
                let (_, id) = self.requests.get(&r.request_id)?;
                let label = self.agent_labels.get(id)?;
                return Some((id.clone(), label.clone()));
            }
            _ => return None,
        };
        let label = agent_label(id, kind, task)?;
        let key = if id.is_empty() { &label } else { id };
        if !id.is_empty() {
            self.agent_labels.insert(id.clone(), label.clone());
        }
        Some((key.clone(), label))
    }

    /// Show one event. Lines printed later by others (a run's summary) are not the
    /// sub-agent's.
    pub fn event(&mut self, e: &pb::SessionEvent) {
        self.show(e);
        self.agent_now = None;
    }

    fn show(&mut self, e: &pb::SessionEvent) {
        use pb::assistant_block::Block;
        use pb::partial_delta::Delta;
        let st = self.st;
        let Some(p) = &e.payload else { return };
        let indent = if e.parent_tool_use_id.is_some() {
            "  │ "
        } else {
            ""
        };
        self.agent_now = self
            .event_agent(p)
            .map(|(id, label)| (id, st.dim(&format!("{indent}[{label}]"))));
        match p {
            Payload::SessionStarted(s) => {
                // Some releases announce themselves on every turn.
                if self.started_shown && !self.verbose {
                    return;
                }
                self.started_shown = true;
                let mut parts = vec![format!("model {}", s.model)];
                if !s.cli_version.is_empty() {
                    parts.push(format!("claude {}", s.cli_version));
                }
                parts.push(s.cwd.clone());
                self.note(
                    &self
                        .err
                        .dim(&format!("● session started · {}", parts.join(" · "))),
                );
            }
            Payload::UserMessage(m) => {
                if m.is_replay {
                    return;
                }
                let text = if !m.text.is_empty() {
                    m.text.clone()
                } else {
                    clip(&m.content_json, 100)
                };
                if m.is_synthetic {
                    self.line(&st.dim(&format!("{indent}{}", clip(&text, 200))));
                } else if !m.sent_by.is_empty() {
                    let tags = delivery_tags(m);
                    let mut line = st.bold(&format!("› {}", clip(&text, 200)));
                    if !tags.is_empty() {
                        line = format!("{line} {}", st.dim(&format!("({tags})")));
                    }
                    self.line(&line);
                    if !m.context_only {
                        self.set_activity(Activity::Model);
                    }
                } else if self.verbose {
                    self.line(&st.dim(&format!("{indent}user: {}", clip(&text, 200))));
                }
            }
            Payload::PartialDelta(d) => {
                if e.parent_tool_use_id.is_some() {
                    return;
                }
                if let Some(Delta::Text(t)) = &d.delta {
                    let key = (d.message_id.clone(), d.index);
                    self.streamed.entry(key.clone()).or_default().push_str(t);
                    self.stream_text(key, t);
                }
            }
            Payload::AssistantBlock(b) => {
                let key = (b.message_id.clone(), b.index);
                match &b.block {
                    Some(Block::Text(t)) => {
                        let shown = self.streamed.remove(&key);
                        if shown.is_some() {
                            // Shown as it streamed; end the line.
                            self.end_line();
                        }
                        let whole = match shown {
                            Some(s) if s == t.text => false,
                            // Deltas of this block never reached this client: it fell
                            // behind (PartialsMissed), or it subscribed while the block
                            // was streaming (attach, run). What it showed has holes.
                            Some(_) => {
                                self.note(&self.err.dim(
                                    "· part of this text's stream did not reach this client; \
                                     the whole text:",
                                ));
                                true
                            }
                            None => !t.text.is_empty(),
                        };
                        if whole {
                            let text = if indent.is_empty() {
                                t.text.clone()
                            } else {
                                t.text
                                    .lines()
                                    .map(|l| format!("{indent}{l}"))
                                    .collect::<Vec<_>>()
                                    .join("\n")
                            };
                            self.line(&text);
                        }
                    }
                    Some(Block::Thinking(t)) => {
                        self.line(&st.dim(&format!("{indent}✻ {}", clip(&t.thinking, 120))));
                    }
                    Some(Block::ToolUse(t)) => {
                        self.tools.insert(t.id.clone(), t.name.clone());
                        self.line(&format!(
                            "{indent}{} {}",
                            st.cyan("⏺"),
                            st.bold(&tool_call(&t.name, &t.input_json))
                        ));
                        self.set_activity(Activity::Tool(t.name.clone()));
                    }
                    Some(Block::RedactedThinking(_)) => {
                        self.line(&st.dim(&format!("{indent}✻ (redacted thinking)")));
                    }
                    Some(Block::Other(o)) if self.verbose => {
                        self.line(&st.dim(&format!("{indent}[{} block]", o.block_type)));
                    }
                    Some(Block::Other(_)) | None => {}
                }
                if !b.error.is_empty() {
                    self.line(&st.red(&format!("{indent}model error: {}", b.error)));
                }
            }
            Payload::ToolResult(r) => {
                let change = if r.is_error {
                    None
                } else {
                    file_change(&r.tool_use_result_json)
                };
                if let Some(change) = change {
                    self.show_file_change(indent, &change);
                    self.set_activity(Activity::Model);
                    return;
                }
                let text = match &r.content {
                    Some(pb::tool_result::Content::Text(t)) => t.clone(),
                    Some(pb::tool_result::Content::BlocksJson(j)) => blocks_text(j),
                    None => String::new(),
                };
                let n = text.lines().count();
                let first = if text.trim().is_empty() {
                    "(no output)".to_owned()
                } else {
                    clip(&text, 100)
                };
                let more = if n > 1 {
                    format!(" (+{} lines)", n - 1)
                } else {
                    String::new()
                };
                let line = format!("{indent}  ⎿ {first}{more}");
                self.line(&if r.is_error {
                    st.red(&line)
                } else {
                    st.dim(&line)
                });
                self.set_activity(Activity::Model);
            }
            Payload::PermissionRequested(r) => {
                let call = tool_call(&r.tool_name, &r.input_json);
                self.requests
                    .insert(r.request_id.clone(), (call.clone(), r.agent_id.clone()));
                // On a terminal the prompt itself shows the request.
                if !self.interactive {
                    self.line(&st.yellow(&format!("{indent}? permission: {call}")));
                }
                self.set_activity(Activity::Idle);
            }
            Payload::PermissionResolved(r) => {
                let what = json::resolution_name(r.resolution);
                let by = if r.resolved_by.is_empty() {
                    String::new()
                } else {
                    format!(" by {}", r.resolved_by)
                };
                let msg = if r.message.is_empty() {
                    String::new()
                } else {
                    format!(": {}", r.message)
                };
                let call = match self.requests.remove(&r.request_id) {
                    Some((c, _)) => format!("{c}: "),
                    None => String::new(),
                };
                let line = format!("{indent}  {call}{what}{by}{msg}");
                self.line(&if r.resolution == pb::Resolution::Allowed as i32 {
                    st.green(&line)
                } else {
                    st.yellow(&line)
                });
                self.set_activity(Activity::Model);
            }
            Payload::QuestionAsked(q) => {
                if !self.interactive {
                    for q in &q.questions {
                        self.line(&st.yellow(&format!("{indent}? {}", q.question)));
                    }
                }
                self.set_activity(Activity::Idle);
            }
            Payload::QuestionAnswered(a) => {
                for a in &a.answers {
                    let mut chosen = a.selected.join(", ");
                    if !a.other_text.is_empty() {
                        if !chosen.is_empty() {
                            chosen.push_str(", ");
                        }
                        chosen.push_str(&a.other_text);
                    }
                    self.line(
                        &st.green(&format!("{indent}  {} → {chosen}", clip(&a.question, 60))),
                    );
                }
                if a.resolution != pb::Resolution::Answered as i32 {
                    self.line(&st.yellow(&format!(
                        "{indent}  {}",
                        json::resolution_name(a.resolution)
                    )));
                }
                self.set_activity(Activity::Model);
            }
            Payload::TurnCompleted(t) => {
                self.set_activity(Activity::Idle);
                self.clear_spinner();
                self.last_turn_interrupted = self.interrupt_seen && !is_success(t);
                self.interrupt_seen = false;
                // A block streamed but never completed (an interrupted turn) is done with.
                self.streamed.clear();
                if !t.structured_output_json.is_empty() {
                    // The answer in the session's --json-schema shape (it is not text).
                    self.line(&t.structured_output_json);
                }
                if self.turn_summaries {
                    let line = summary(st, t, 0, self.last_turn_interrupted);
                    self.line(&line);
                }
            }
            Payload::StateChanged(s) => {
                if s.to == pb::SessionState::Running as i32 {
                    if self.activity == Activity::Idle {
                        self.set_activity(Activity::Model);
                    }
                } else {
                    self.set_activity(Activity::Idle);
                }
                if self.verbose {
                    self.note(&self.err.dim(&format!(
                        "state {} → {}{}",
                        json::state_name(s.from),
                        json::state_name(s.to),
                        if s.reason.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", s.reason)
                        }
                    )));
                }
            }
            Payload::SystemNotice(n) => {
                if self.verbose {
                    self.note(
                        &self
                            .err
                            .dim(&format!("system {}/{}", n.source_type, n.subtype)),
                    );
                }
            }
            Payload::EngineNotice(n) => {
                if n.code == "interrupted" {
                    self.interrupt_seen = true;
                }
                if !self.verbose && n.code == "session_created" {
                    return;
                }
                let text = if n.message.is_empty() {
                    n.code.clone()
                } else {
                    format!("{}: {}", n.code, n.message)
                };
                self.note(&self.err.dim(&format!("· {text}")));
            }
            Payload::ProcessExited(x) => {
                self.set_activity(Activity::Idle);
                self.note(
                    &self
                        .err
                        .yellow(&format!("process exited: {}", exit_text(x))),
                );
                if !x.stderr_tail.trim().is_empty() {
                    for l in x
                        .stderr_tail
                        .lines()
                        .rev()
                        .take(5)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                    {
                        self.note(&self.err.dim(&format!("  {l}")));
                    }
                }
            }
            Payload::Diagnostic(d) => {
                self.note(&self.err.yellow(&format!(
                    "warning: CLI output {}: {}",
                    d.code,
                    clip(&d.message, 120)
                )));
            }
            Payload::Unknown(u) => {
                if self.verbose {
                    self.note(
                        &self
                            .err
                            .dim(&format!("unknown CLI message {}", u.message_type)),
                    );
                }
            }
            Payload::PartialsMissed(m) => {
                if self.verbose {
                    self.note(&self.err.dim(&format!(
                        "· {} streamed deltas missed (this client fell behind)",
                        m.count
                    )));
                }
            }
            // Issue 10's typed notices: task lifecycle, rate limits and compaction shown;
            // progress and status only with --verbose.
            Payload::TaskStarted(t) => {
                self.note(&self.err.dim(&format!(
                    "· background task {} started: {}",
                    t.task_id,
                    clip(&t.description, 100)
                )));
            }
            Payload::TaskProgress(t) => {
                if let Some(line) = task_progress(t, self.verbose) {
                    self.note(&self.err.dim(&line));
                }
            }
            Payload::TaskNotification(t) => {
                self.note(&self.err.dim(&format!(
                    "· background task {} {}: {}",
                    t.task_id,
                    t.status,
                    clip(&t.summary, 100)
                )));
            }
            Payload::RateLimit(r) => {
                let text = format!(
                    "rate limit {}{}{}",
                    r.status,
                    if r.rate_limit_type.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", r.rate_limit_type)
                    },
                    if r.resets_at > 0 {
                        format!(", resets at {} (epoch s)", r.resets_at)
                    } else {
                        String::new()
                    }
                );
                if r.status != "allowed" {
                    self.note(&self.err.yellow(&text));
                } else if self.verbose {
                    self.note(&self.err.dim(&text));
                }
            }
            Payload::CompactBoundary(c) => {
                self.note(&self.err.dim(&format!(
                    "· conversation compacted ({}, {} tokens before)",
                    if c.trigger.is_empty() {
                        "?"
                    } else {
                        &c.trigger
                    },
                    c.pre_tokens
                )));
            }
            Payload::CliStatus(c) => {
                if self.verbose {
                    let status = if c.status.is_empty() {
                        "idle"
                    } else {
                        &c.status
                    };
                    self.note(&self.err.dim(&format!("· CLI {status}")));
                }
            }
            Payload::MessageLifecycle(m) => {
                if self.verbose {
                    self.note(
                        &self
                            .err
                            .dim(&format!("· message {} {}", m.message_id, m.state)),
                    );
                }
            }
            // Issue 11: hook calls are answered with `ostler hook` (tool calls: in progress).
            Payload::HookRequested(h) => {
                self.note(&format!(
                    "? hook {} ({}): answer with `ostler hook {} --allow|--deny REASON|--continue`",
                    super::hooks::describe_in(h, self.asker(&h.agent_id).as_deref()),
                    h.request_id,
                    h.request_id
                ));
            }
            Payload::HookResolved(h) => {
                let decision = h
                    .decision()
                    .as_str_name()
                    .trim_start_matches("HOOK_DECISION_")
                    .to_lowercase();
                self.note(&self.err.dim(&format!(
                    "· hook {} {decision} by {}",
                    h.request_id, h.resolved_by
                )));
            }
            Payload::ToolCallRequested(t) => {
                self.note(&format!(
                    "? tool call {}/{} ({})",
                    t.server_name, t.tool_name, t.request_id
                ));
            }
            Payload::ToolCallResolved(t) => {
                self.note(&self.err.dim(&format!(
                    "· tool call {} resolved by {}",
                    t.request_id, t.resolved_by
                )));
            }
            // An MCP server asking for input: answered with `ostler elicitation`, or at the
            // prompt of `attach` / `run` / `send` on a terminal.
            Payload::ElicitationRequested(e) => {
                // On a terminal the prompt itself shows the request.
                if !self.interactive {
                    self.note(&format!(
                        "? elicitation {} ({})",
                        super::elicitations::describe(e),
                        e.request_id
                    ));
                }
            }
            Payload::ElicitationResolved(e) => {
                let how = if e.resolution == pb::Resolution::Answered as i32 {
                    String::new()
                } else {
                    format!(" ({})", json::resolution_name(e.resolution))
                };
                self.note(&self.err.dim(&format!(
                    "· elicitation {} {}{how} by {}",
                    e.request_id,
                    super::elicitations::action_done(e.action()),
                    e.resolved_by
                )));
            }
            // A dialog the CLI asks for (a kind the session declared with --dialog-kinds):
            // answered with `ostler dialog`.
            Payload::DialogRequested(d) => {
                // On a terminal the prompt itself shows the request.
                if !self.interactive {
                    self.note(&format!(
                        "? dialog {}; answer: {}",
                        super::dialogs::describe(d),
                        super::dialogs::hint(d)
                    ));
                }
            }
            Payload::DialogResolved(d) => {
                let how = if d.resolution == pb::Resolution::Answered as i32 {
                    String::new()
                } else {
                    format!(" ({})", json::resolution_name(d.resolution))
                };
                let result = if d.result_json.is_empty() {
                    String::new()
                } else {
                    format!(" {}", clip(&d.result_json, 80))
                };
                self.note(&self.err.dim(&format!(
                    "· dialog {} {}{result}{how} by {}",
                    d.request_id,
                    super::dialogs::behavior_name(d.behavior),
                    d.resolved_by
                )));
            }
            // A hook the CLI ran (every hook with include_hook_events): its end, with the
            // output of one that failed; its start and output so far with --verbose.
            Payload::HookActivity(h) => {
                for (failed, l) in hook_lines(h, self.verbose) {
                    let l = if failed {
                        self.err.red(&l)
                    } else {
                        self.err.dim(&l)
                    };
                    self.note(&l);
                }
            }
            // A banner of the CLI's: warnings and suggestions stand out, notices are
            // dim, `info` (transcript only in the CLI) with --verbose.
            Payload::Informational(i) => match i.level.as_str() {
                "warning" => self.note(&self.err.red(&format!("! {}", i.content))),
                "suggestion" => self.note(&format!("· {}", i.content)),
                "info" if !self.verbose => {}
                _ => self.note(&self.err.dim(&format!("· {}", i.content))),
            },
            // The model's guess at the next prompt (sessions with prompt_suggestions).
            Payload::PromptSuggestion(p) => {
                self.note(&self.err.dim(&format!("· suggested next: {}", p.suggestion)));
            }
            // The server says the user is done at the URL of a URL elicitation.
            Payload::ElicitationCompleted(e) => {
                self.note(&self.err.dim(&format!(
                    "· {} reports elicitation {} complete",
                    e.mcp_server_name, e.elicitation_id
                )));
            }
        }
    }
}

/// A sub-agent's label: `general-purpose · Create sub.txt` (its type and the Task call's
/// description, whichever the CLI sent; its id when it sent only that); `None` for the main
/// agent (nothing set).
pub fn agent_label(agent_id: &str, subagent_type: &str, task_description: &str) -> Option<String> {
    let parts: Vec<String> = [subagent_type, task_description]
        .iter()
        .filter(|s| !s.is_empty())
        .map(|s| clip(s, 60))
        .collect();
    if !parts.is_empty() {
        Some(parts.join(" · "))
    } else if !agent_id.is_empty() {
        Some(format!("sub-agent {agent_id}"))
    } else {
        None
    }
}

/// How a message was sent, when not plainly: `now`, `later`, `verbatim`, `context only`.
pub fn delivery_tags(m: &pb::UserMessage) -> String {
    let mut tags = Vec::new();
    match m.priority() {
        pb::MessagePriority::Now => tags.push("now".to_string()),
        pb::MessagePriority::Later => tags.push("later".to_string()),
        pb::MessagePriority::Next | pb::MessagePriority::Unspecified => {}
    }
    if m.verbatim {
        tags.push("verbatim".to_string());
    }
    if m.context_only {
        tags.push("context only".to_string());
    }
    match m.pasted.len() {
        0 => {}
        1 => tags.push("1 paste".to_string()),
        n => tags.push(format!("{n} pastes")),
    }
    tags.join(", ")
}

/// How many lines of a file change's diff are shown without `--verbose`.
const DIFF_LINES: usize = 12;

/// A file written or edited by a tool call, from its `tool_use_result_json`.
#[derive(Debug, PartialEq, Eq)]
struct FileChange {
    /// `Created a.txt (2 lines)`, `Updated a.txt: +1 -1`.
    headline: String,
    /// The diff's lines, each starting with `+`, `-` or a space.
    lines: Vec<String>,
}

/// The change a Write / Edit / MultiEdit call made, from the CLI's structured result (a
/// `filePath` with `structuredPatch` hunks, or `type: create` with the `content`); `None`
/// for any other result (or JSON that does not have that shape: the CLI's shapes vary by
/// release, so this reads leniently and the caller falls back to the result's text).
fn file_change(json: &str) -> Option<FileChange> {
    if json.is_empty() {
        return None;
    }
    let v: Value = serde_json::from_str(json).ok()?;
    let path = v.get("filePath")?.as_str()?;
    let patch = v.get("structuredPatch").and_then(Value::as_array);
    let count = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    if v.get("type").and_then(Value::as_str) == Some("create") {
        let content = v.get("content").and_then(Value::as_str).unwrap_or_default();
        let lines: Vec<String> = content.lines().map(|l| format!("+{l}")).collect();
        return Some(FileChange {
            headline: format!("Created {path} ({})", count(lines.len(), "line")),
            lines,
        });
    }
    let lines: Vec<String> = patch?
        .iter()
        .filter_map(|h| h.get("lines").and_then(Value::as_array))
        .flatten()
        .filter_map(|l| l.as_str().map(str::to_owned))
        .collect();
    let added = lines.iter().filter(|l| l.starts_with('+')).count();
    let removed = lines.iter().filter(|l| l.starts_with('-')).count();
    let headline = if lines.is_empty() {
        format!("Updated {path} (no change)")
    } else {
        format!(
            "Updated {path}: {}, {}",
            count(added, "addition"),
            count(removed, "removal")
        )
    };
    Some(FileChange { headline, lines })
}

/// Text of a tool result given as content blocks.
fn blocks_text(j: &str) -> String {
    let v: Value = serde_json::from_str(j).unwrap_or(Value::Null);
    match v.as_array() {
        Some(items) => items
            .iter()
            .map(|b| match b.get("text").and_then(Value::as_str) {
                Some(t) => t.to_owned(),
                None => format!(
                    "[{}]",
                    b.get("type").and_then(Value::as_str).unwrap_or("block")
                ),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        None => j.to_owned(),
    }
}

/// `code 0 (stopped by client)`, `signal 9`, ...
pub fn exit_text(x: &pb::ProcessExited) -> String {
    let how = match (x.exit_code, x.signal) {
        (Some(c), _) => format!("code {c}"),
        (None, Some(s)) => format!("signal {s}"),
        _ => "?".to_owned(),
    };
    if x.reason.is_empty() {
        how
    } else {
        format!("{how} ({})", x.reason)
    }
}

/// Relative age: "3s", "5m", "2h", "4d".
pub fn age(ms: i64) -> String {
    ostler_engine::settled::ago(ms, now_ms())
}

/// This machine's clock, in milliseconds since the epoch (0 if it is before it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The lines shown for a hook's activity: its end (`true`: it failed, shown with up to
/// five lines of its output), and with `verbose` its start and progress.
fn hook_lines(h: &pb::HookActivity, verbose: bool) -> Vec<(bool, String)> {
    let name = if h.hook_name.is_empty() {
        &h.hook_event
    } else {
        &h.hook_name
    };
    match h.phase.as_str() {
        "response" => {
            let exit = h
                .exit_code
                .map(|c| format!(", exit {c}"))
                .unwrap_or_default();
            let outcome = if h.outcome.is_empty() {
                "ended"
            } else {
                &h.outcome
            };
            let failed = h.outcome == "error";
            let mut v = vec![(failed, format!("· hook {name}: {outcome}{exit}"))];
            if failed {
                let out = if h.output.trim().is_empty() {
                    &h.stderr
                } else {
                    &h.output
                };
                v.extend(out.lines().take(5).map(|l| (false, format!("    {l}"))));
            }
            v
        }
        "started" if verbose => vec![(false, format!("· hook {name} started"))],
        _ if verbose => vec![(false, format!("· hook {name} running"))],
        _ => Vec::new(),
    }
}

/// A background task's progress line: its summary whenever it has one (the session option
/// `agent_progress_summaries`), else only with `--verbose` its description and last tool.
fn task_progress(t: &pb::TaskProgress, verbose: bool) -> Option<String> {
    let last_tool = if verbose && !t.last_tool_name.is_empty() {
        format!(" (last tool {})", t.last_tool_name)
    } else {
        String::new()
    };
    if !t.summary.is_empty() {
        return Some(format!(
            "· task {}: {}{last_tool}",
            t.task_id,
            clip(&t.summary, 100)
        ));
    }
    verbose.then(|| {
        format!(
            "· task {}: {}{last_tool}",
            t.task_id,
            clip(&t.description, 80)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subagents_lines_stand_under_its_label_the_main_agents_do_not() {
        use pb::assistant_block::Block;
        let mut h = Human::new(false, false);
        h.st = Style { on: false };
        h.capture = Some(String::new());
        let ev = |parent: Option<&str>, payload: Payload| pb::SessionEvent {
            parent_tool_use_id: parent.map(str::to_owned),
            payload: Some(payload),
            ..Default::default()
        };
        let block = |agent: (&str, &str, &str), index: u32, block: Block| {
            Payload::AssistantBlock(pb::AssistantBlock {
                message_id: format!("m{}", agent.0),
                index,
                block: Some(block),
                agent_id: agent.0.into(),
                subagent_type: agent.1.into(),
                task_description: agent.2.into(),
                ..Default::default()
            })
        };
        let text = |t: &str| Block::Text(pb::TextBlock { text: t.into() });
        let tool = |id: &str, name: &str, input: &str| {
            Block::ToolUse(pb::ToolUseBlock {
                id: id.into(),
                name: name.into(),
                input_json: input.into(),
            })
        };
        let result = |agent: (&str, &str, &str), id: &str, out: &str| {
            Payload::ToolResult(pb::ToolResult {
                tool_use_id: id.into(),
                content: Some(pb::tool_result::Content::Text(out.into())),
                agent_id: agent.0.into(),
                subagent_type: agent.1.into(),
                task_description: agent.2.into(),
                ..Default::default()
            })
        };
        let main = ("", "", "");
        let sub = ("task-1", "general-purpose", "Create sub.txt");
        let task = Some("toolu_task_1");
        for e in [
            ev(None, block(main, 0, text("I will delegate this."))),
            ev(
                None,
                block(
                    main,
                    1,
                    tool(
                        "toolu_task_1",
                        "Agent",
                        r#"{"description":"Create sub.txt"}"#,
                    ),
                ),
            ),
            ev(
                task,
                block(
                    sub,
                    0,
                    tool("toolu_b", "Bash", r#"{"command":"touch sub.txt"}"#),
                ),
            ),
            // Its permission request names only the agent id; its answer, only the request.
            ev(
                task,
                Payload::PermissionRequested(pb::PermissionRequested {
                    request_id: "r1".into(),
                    tool_name: "Bash".into(),
                    input_json: r#"{"command":"touch sub.txt"}"#.into(),
                    agent_id: "task-1".into(),
                    ..Default::default()
                }),
            ),
            ev(
                task,
                Payload::PermissionResolved(pb::PermissionResolved {
                    request_id: "r1".into(),
                    resolution: pb::Resolution::Allowed as i32,
                    ..Default::default()
                }),
            ),
            ev(task, result(sub, "toolu_b", "")),
            ev(None, block(main, 2, text("Meanwhile, the main agent."))),
            ev(task, block(sub, 1, text("Sub-agent:\ncreated sub.txt."))),
            ev(None, result(main, "toolu_task_1", "done")),
            // Only an id (the CLI sent no type or description).
            ev(
                Some("toolu_task_2"),
                block(("task-2", "", ""), 0, text("Hi.")),
            ),
        ] {
            h.event(&e);
        }
        // A line of the command's own after a sub-agent's event (a run's summary): no label.
        h.event(&ev(
            task,
            block(
                ("task-3", "Explore", ""),
                0,
                Block::Other(pb::OtherBlock::default()),
            ),
        ));
        h.line("✓ done");
        assert_eq!(
            h.capture.as_deref(),
            Some(
                "I will delegate this.\n\
                 ⏺ Agent(Create sub.txt)\n\
                 \x20 │ [general-purpose · Create sub.txt]\n\
                 \x20 │ ⏺ Bash(touch sub.txt)\n\
                 \x20 │ ? permission: Bash(touch sub.txt)\n\
                 \x20 │   Bash(touch sub.txt): allowed\n\
                 \x20 │   ⎿ (no output)\n\
                 Meanwhile, the main agent.\n\
                 \x20 │ [general-purpose · Create sub.txt]\n\
                 \x20 │ Sub-agent:\n\
                 \x20 │ created sub.txt.\n\
                 \x20 ⎿ done\n\
                 \x20 │ [sub-agent task-2]\n\
                 \x20 │ Hi.\n\
                 ✓ done\n"
            )
        );
        assert_eq!(agent_label("", "", ""), None);
        assert_eq!(
            h.agent_label_of("task-1"),
            Some("general-purpose · Create sub.txt")
        );
        assert_eq!(h.agent_label_of("task-9"), None);

        // A notice (on stderr) between a sub-agent's lines: where stdout shares the
        // terminal, its next line shows the header again; where stdout is redirected, the
        // captured lines stay as they were; where notices go to stdout, they stand without
        // a header and the header comes back after them. A prompt asked on the terminal
        // (its permission request answered) as a notice on stderr.
        let sub_line = |t: &str| ev(task, block(sub, 2, text(t)));
        let again = "\x20 │ [general-purpose · Create sub.txt]\n\
                     \x20 │ one\n\
                     \x20 │ [general-purpose · Create sub.txt]\n\
                     \x20 │ two\n";
        let kept = "\x20 │ [general-purpose · Create sub.txt]\n\
                    \x20 │ one\n\
                    \x20 │ two\n";
        let note = |h: &mut Human| h.note("connection lost; retrying…");
        let prompt = |h: &mut Human| h.yield_terminal();
        type Between<'a> = &'a dyn Fn(&mut Human);
        let cases: [(bool, bool, Between<'_>, &str); 5] = [
            (true, false, &note, again),
            (false, false, &note, kept),
            (
                false,
                true,
                &note,
                "\x20 │ [general-purpose · Create sub.txt]\n\
                 \x20 │ one\n\
                 connection lost; retrying…\n\
                 \x20 │ [general-purpose · Create sub.txt]\n\
                 \x20 │ two\n",
            ),
            (true, false, &prompt, again),
            (false, false, &prompt, kept),
        ];
        for (i, (tty, on_stdout, between, expected)) in cases.into_iter().enumerate() {
            h.stdout_tty = tty;
            h.notes_to_stdout = on_stdout;
            h.line("-- main");
            h.capture = Some(String::new());
            h.event(&sub_line("one"));
            between(&mut h);
            h.event(&sub_line("two"));
            assert_eq!(
                h.capture.as_deref(),
                Some(expected),
                "case {i}: stdout a terminal: {tty}, notes on stdout: {on_stdout}"
            );
        }
    }

    /// A hook call's notice names the sub-agent it fires in, by the label its lines are
    /// headed with (its id when none of its events was seen); the main agent's names none.
    #[test]
    fn a_hook_calls_notice_names_the_subagent_it_fires_in() {
        use pb::assistant_block::Block;
        let mut h = Human::new(false, false);
        h.st = Style { on: false };
        h.err = Style { on: false };
        h.notes_to_stdout = true;
        h.capture = Some(String::new());
        let task = Some("toolu_task_q".to_owned());
        let ev = |parent: &Option<String>, payload: Payload| pb::SessionEvent {
            parent_tool_use_id: parent.clone(),
            payload: Some(payload),
            ..Default::default()
        };
        let hook = |request_id: &str, tool: &str, agent: &str| {
            Payload::HookRequested(pb::HookRequested {
                request_id: request_id.into(),
                hook_event: "PreToolUse".into(),
                tool_name: tool.into(),
                agent_id: agent.into(),
                ..Default::default()
            })
        };
        for e in [
            ev(
                &task,
                Payload::AssistantBlock(pb::AssistantBlock {
                    message_id: "m1".into(),
                    block: Some(Block::Text(pb::TextBlock {
                        text: "Creating it.".into(),
                    })),
                    agent_id: "task-1".into(),
                    subagent_type: "general-purpose".into(),
                    task_description: "Create q.txt".into(),
                    ..Default::default()
                }),
            ),
            ev(&task, hook("h1", "Bash", "task-1")),
            ev(&task, hook("h2", "Bash", "task-7")),
            ev(&None, hook("h3", "Agent", "")),
        ] {
            h.event(&e);
        }
        let answer = |id: &str| {
            format!("({id}): answer with `ostler hook {id} --allow|--deny REASON|--continue`")
        };
        assert_eq!(
            h.capture.as_deref(),
            Some(
                format!(
                    "\x20 │ [general-purpose · Create q.txt]\n\
                     \x20 │ Creating it.\n\
                     ? hook PreToolUse Bash in general-purpose · Create q.txt {}\n\
                     ? hook PreToolUse Bash in sub-agent task-7 {}\n\
                     ? hook PreToolUse Agent {}\n",
                    answer("h1"),
                    answer("h2"),
                    answer("h3")
                )
                .as_str()
            )
        );
        assert_eq!(h.asker(""), None);
        assert_eq!(
            h.asker("task-1").as_deref(),
            Some("general-purpose · Create q.txt")
        );
        assert_eq!(h.asker("task-7").as_deref(), Some("sub-agent task-7"));
    }

    #[test]
    fn task_progress_shows_a_summary_always_the_rest_when_verbose() {
        let plain = pb::TaskProgress {
            task_id: "t1".into(),
            description: "Write sub.txt".into(),
            last_tool_name: "Bash".into(),
            ..Default::default()
        };
        assert_eq!(task_progress(&plain, false), None);
        assert_eq!(
            task_progress(&plain, true).as_deref(),
            Some("· task t1: Write sub.txt (last tool Bash)")
        );
        let summed = pb::TaskProgress {
            summary: "Analyzing the fake module".into(),
            ..plain
        };
        assert_eq!(
            task_progress(&summed, false).as_deref(),
            Some("· task t1: Analyzing the fake module")
        );
        assert_eq!(
            task_progress(&summed, true).as_deref(),
            Some("· task t1: Analyzing the fake module (last tool Bash)")
        );
    }

    #[test]
    fn delivery_tags_name_what_was_asked() {
        let plain = pb::UserMessage::default();
        assert_eq!(delivery_tags(&plain), "");
        let next = pb::UserMessage {
            priority: pb::MessagePriority::Next as i32,
            ..Default::default()
        };
        assert_eq!(delivery_tags(&next), "");
        let all = pb::UserMessage {
            priority: pb::MessagePriority::Later as i32,
            verbatim: true,
            context_only: true,
            pasted: vec!["a".into(), "b".into()],
            ..Default::default()
        };
        assert_eq!(
            delivery_tags(&all),
            "later, verbatim, context only, 2 pastes"
        );
        let now = pb::UserMessage {
            priority: pb::MessagePriority::Now as i32,
            ..Default::default()
        };
        assert_eq!(delivery_tags(&now), "now");
    }

    #[test]
    fn file_changes_read_as_diffs() {
        // 2.1.332's Edit result (shape as recorded).
        let edit = r#"{"filePath":"/w/a.txt","oldString":"one","newString":"two","originalFile":"one\nkeep\n","structuredPatch":[{"oldStart":1,"oldLines":2,"newStart":1,"newLines":2,"lines":["-one","+two"," keep"]}],"userModified":false,"replaceAll":false}"#;
        assert_eq!(
            file_change(edit),
            Some(FileChange {
                headline: "Updated /w/a.txt: 1 addition, 1 removal".into(),
                lines: vec!["-one".into(), "+two".into(), " keep".into()],
            })
        );
        let create = r#"{"type":"create","filePath":"/w/b.txt","content":"hello\nworld","structuredPatch":[],"originalFile":null}"#;
        assert_eq!(
            file_change(create),
            Some(FileChange {
                headline: "Created /w/b.txt (2 lines)".into(),
                lines: vec!["+hello".into(), "+world".into()],
            })
        );
        let hunks = r#"{"type":"update","filePath":"/w/c","structuredPatch":[{"lines":["+a","+b"]},{"lines":["-c"]}]}"#;
        assert_eq!(
            file_change(hunks).map(|c| c.headline),
            Some("Updated /w/c: 2 additions, 1 removal".into())
        );
        // Other results, and shapes this does not know: the text is shown instead.
        for other in [
            "",
            r#""Error: refused""#,
            r#"{"stdout":"x","stderr":"","interrupted":false}"#,
            r#"{"type":"text","file":{"filePath":"/w/a.txt","content":"one"}}"#,
            r#"{"filePath":"/w/a.txt"}"#,
            r#"{"filePath":7,"structuredPatch":[]}"#,
            "not json",
        ] {
            assert_eq!(file_change(other), None, "{other}");
        }
    }

    #[test]
    fn tool_calls_are_compact() {
        assert_eq!(
            tool_call(
                "AskUserQuestion",
                r#"{"questions":[{"question":"Which DB?","options":[]}]}"#
            ),
            "AskUserQuestion(Which DB?)"
        );
        assert_eq!(
            tool_call("Bash", r#"{"command":"touch a"}"#),
            "Bash(touch a)"
        );
        assert_eq!(tool_call("Read", r#"{"file_path":"/x/y"}"#), "Read(/x/y)");
        assert_eq!(tool_call("Foo", "{}"), "Foo()");
        assert_eq!(tool_call("Foo", r#"{"a":1}"#), r#"Foo({"a":1})"#);
        let long = format!(r#"{{"command":"{}"}}"#, "x".repeat(200));
        assert_eq!(
            tool_call("Bash", &long).chars().count(),
            "Bash()".len() + 80
        );
    }

    #[test]
    fn text_from_elsewhere_cannot_drive_the_terminal() {
        use super::terminal_safe;
        let evil =
            "h\u{e9}llo \u{1f980} \u{1} ctrl \u{1b}[31m red \u{1b}]0;title\u{7} \u{9b}2J x\ry\r\n";
        let shown = terminal_safe(evil);
        assert_eq!(
            shown,
            "h\u{e9}llo \u{1f980} ^A ctrl ^[[31m red ^[]0;title^G \\u{9b}2J x^My\n"
        );
        // ostler's own colours pass; colours, hiding and OSC from the text do not.
        let st = super::Style { on: true };
        let coloured = format!(
            "{} \u{1b}[8mhidden \u{1b}[31mred \u{1b}]52;c;aGk=\u{7}",
            st.red("ok")
        );
        let shown = super::terminal_text(&coloured);
        assert!(shown.starts_with(&"ok".red().to_string()), "{shown:?}");
        assert!(
            shown.ends_with(" ^[[8mhidden ^[[31mred ^[]52;c;aGk=^G"),
            "{shown:?}"
        );
        assert!(!st.red("x").contains('\u{1b}'), "marked until written");
        assert!(matches!(
            terminal_safe("plain\ttext\n"),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn json_lines_keep_the_text_and_hold_nothing_a_terminal_acts_on() {
        let text = "E\u{9b}2J F\u{85}G\u{7f}H \u{1b}]0;t\u{7} é";
        let line = super::json_text(&serde_json::json!({ "text": text }));
        assert!(
            !line.chars().any(|c| c.is_control()),
            "no raw control character: {line:?}"
        );
        let back: serde_json::Value = serde_json::from_str(&line).expect("valid JSON");
        assert_eq!(back["text"], text, "the text intact");
    }

    #[test]
    fn summary_reads_well() {
        let t = pb::TurnCompleted {
            subtype: "success".into(),
            num_turns: 2,
            total_cost_usd: 0.01234,
            duration_ms: 3400,
            usage: Some(pb::Usage {
                input_tokens: 1200,
                output_tokens: 56,
                ..Default::default()
            }),
            ..Default::default()
        };
        let s = summary(Style { on: false }, &t, 0, false);
        assert_eq!(
            s,
            "✓ done · 2 turns · 1.2k in / 56 out tokens · $0.0123 · 3.4s"
        );
        let t = pb::TurnCompleted {
            subtype: "error_during_execution".into(),
            is_error: true,
            num_turns: 1,
            errors: vec!["[ede_diagnostic] result_type=user".into()],
            ..Default::default()
        };
        let s = summary(Style { on: false }, &t, 1500, false);
        assert!(s.starts_with("✗ error_during_execution · 1 turn ·"), "{s}");
        assert!(s.contains("[ede_diagnostic]"), "{s}");
        let s = summary(Style { on: false }, &t, 1500, true);
        assert!(s.starts_with("⏹ interrupted · 1 turn ·"), "{s}");
        assert!(!s.contains("ede_diagnostic"), "{s}");
        // An API error comes as `success` with `is_error`: never "✗ success".
        let t = pb::TurnCompleted {
            subtype: "success".into(),
            is_error: true,
            num_turns: 1,
            ..Default::default()
        };
        let s = summary(Style { on: false }, &t, 1500, false);
        assert!(s.starts_with("✗ error · 1 turn ·"), "{s}");
    }
    #[test]
    fn hook_activity_reads_well() {
        let h = |phase: &str, outcome: &str, exit: Option<i32>, stderr: &str| pb::HookActivity {
            phase: phase.into(),
            hook_name: "UserPromptSubmit".into(),
            hook_event: "UserPromptSubmit".into(),
            outcome: outcome.into(),
            exit_code: exit,
            stderr: stderr.into(),
            ..Default::default()
        };
        assert_eq!(
            hook_lines(
                &h("response", "error", Some(2), "no prompts\nhere\n"),
                false
            ),
            vec![
                (true, "· hook UserPromptSubmit: error, exit 2".to_owned()),
                (false, "    no prompts".to_owned()),
                (false, "    here".to_owned()),
            ]
        );
        assert_eq!(
            hook_lines(&h("response", "success", Some(0), ""), false),
            vec![(false, "· hook UserPromptSubmit: success, exit 0".to_owned())]
        );
        // 2.0.x's end has no outcome; starts and progress only with --verbose.
        let mut old = h("response", "", None, "");
        old.hook_name = String::new();
        old.hook_event = "SessionStart".into();
        assert_eq!(
            hook_lines(&old, false),
            vec![(false, "· hook SessionStart: ended".to_owned())]
        );
        assert!(hook_lines(&h("started", "", None, ""), false).is_empty());
        assert!(hook_lines(&h("progress", "", None, ""), false).is_empty());
        assert_eq!(
            hook_lines(&h("started", "", None, ""), true),
            vec![(false, "· hook UserPromptSubmit started".to_owned())]
        );
    }
}
