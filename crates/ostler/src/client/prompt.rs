//! Answering permission prompts and questions: flags first, then the terminal.
//!
//! On a terminal (stdin or stderr is one and `/dev/tty` opens) prompts are asked
//! interactively on `/dev/tty`, so `echo "prompt" | ostler run` still asks. Without one,
//! only the flags decide; a prompt they do not cover is "unanswerable".

use std::io::{BufRead as _, IsTerminal as _, Write as _};

use anyhow::{Result, anyhow};
use ostler_proto::v1 as pb;
use serde_json::Value;
use tokio::sync::mpsc;

use super::render::{Style, clip, tool_call};

/// Flags that decide prompts without asking.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AnswerArgs {
    /// Allow these tools without asking: comma-separated `Tool` or `Tool(command prefix)`
    /// entries (`Bash(git status)`, `Edit`, `mcp__github__*`); `*` allows everything
    #[arg(long, value_delimiter = ',', value_name = "TOOLS")]
    pub allow_tools: Vec<String>,
    /// Deny every permission prompt that --allow-tools does not allow
    #[arg(long)]
    pub deny_all: bool,
    /// The message told to the model when denying with --deny-all
    #[arg(
        long,
        value_name = "TEXT",
        default_value = "Denied by the ostler client (--deny-all)."
    )]
    pub deny_message: String,
    /// Answer every question with its first option
    #[arg(long)]
    pub answer_first: bool,
    /// Never ask on the terminal; only the flags decide
    #[arg(long)]
    pub no_input: bool,
}

/// A local allow rule from `--allow-tools`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowRule {
    pub tool: String,
    /// Command prefix (Bash) or path prefix; empty = every use.
    pub prefix: String,
}

impl AllowRule {
    pub fn parse(s: &str) -> Result<Self> {
        let s = s.trim();
        if s.is_empty() {
            usage!("empty --allow-tools entry");
        }
        if let Some(open) = s.find('(') {
            let Some(inner) = s[open + 1..].strip_suffix(')') else {
                usage!("--allow-tools entry {s:?}: missing ')'");
            };
            let inner = inner.trim();
            let inner = inner.strip_suffix(":*").unwrap_or(inner);
            let inner = inner.strip_suffix('*').unwrap_or(inner).trim_end();
            Ok(Self {
                tool: s[..open].trim().to_owned(),
                prefix: inner.to_owned(),
            })
        } else {
            Ok(Self {
                tool: s.to_owned(),
                prefix: String::new(),
            })
        }
    }

    pub fn matches(&self, tool: &str, input: &Value) -> bool {
        let tool_ok = if self.tool == "*" {
            true
        } else if let Some(p) = self.tool.strip_suffix('*') {
            tool.starts_with(p)
        } else {
            self.tool == tool
        };
        if !tool_ok {
            return false;
        }
        if self.prefix.is_empty() {
            return true;
        }
        let subject = ["command", "file_path", "path", "notebook_path", "url"]
            .iter()
            .find_map(|k| input.get(*k).and_then(Value::as_str))
            .unwrap_or("");
        if tool == "Bash" {
            // The daemon's own rule for Bash prefixes (word boundaries, never a compound
            // command: `&`, `;`, `|`, redirections, substitutions, newlines).
            ostler_engine::PermissionRule::allow("Bash", Some(&self.prefix)).matches(
                tool,
                input,
                std::path::Path::new("/"),
            )
        } else {
            // A path prefix never matches a path that climbs out of it.
            subject.starts_with(&self.prefix) && !subject.split('/').any(|part| part == "..")
        }
    }
}

/// What to do with a permission prompt.
#[derive(Debug, Clone, PartialEq)]
pub enum PermissionAnswer {
    Allow { remember: Vec<pb::PermissionRule> },
    Deny { message: String, interrupt: bool },
}

/// How a prompt ended up.
#[derive(Debug)]
pub enum Asked<T> {
    Answer(T),
    /// Neither the flags nor a terminal can answer it; the message says why.
    Unanswerable(String),
    /// Ctrl-C while asking.
    CtrlC,
}

/// Ctrl-C presses, counted from the moment this is created (none are lost between
/// waits, unlike separate `tokio::signal::ctrl_c()` calls).
pub struct CtrlC {
    rx: mpsc::UnboundedReceiver<()>,
}

impl CtrlC {
    /// Install the SIGINT handler (from now on Ctrl-C no longer kills the process).
    pub fn install() -> Result<Self> {
        let mut sig = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .map_err(|e| anyhow!("installing the Ctrl-C handler: {e}"))?;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while sig.recv().await.is_some() {
                if tx.send(()).is_err() {
                    break;
                }
            }
        });
        Ok(Self { rx })
    }

    /// The next press.
    pub async fn pressed(&mut self) {
        if self.rx.recv().await.is_none() {
            std::future::pending::<()>().await;
        }
    }
}

/// What the terminal reader thread reads next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// A line (cooked mode).
    Line,
    /// One key, in raw mode (Ctrl-C arrives as the byte 0x03).
    Key,
}

/// One line (or key) from the terminal, read on a dedicated thread so that a prompt can be
/// abandoned (Ctrl-C) without losing or duplicating the reader.
pub struct Tty {
    out: std::fs::File,
    requests: std::sync::mpsc::Sender<Read>,
    lines: mpsc::UnboundedReceiver<Option<String>>,
    /// The read the thread is doing (a prompt abandoned meanwhile leaves it running).
    outstanding: Option<Read>,
    pub style: Style,
}

impl Tty {
    /// The controlling terminal, if there is one and stdin or stderr is a terminal.
    pub fn open() -> Option<Self> {
        if !(std::io::stdin().is_terminal() || std::io::stderr().is_terminal()) {
            return None;
        }
        let input = std::fs::File::open("/dev/tty").ok()?;
        let out = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/tty")
            .ok()?;
        let (req_tx, req_rx) = std::sync::mpsc::channel::<Read>();
        let (line_tx, line_rx) = mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("ostler-tty".into())
            .spawn(move || {
                let mut reader = std::io::BufReader::new(input);
                while let Ok(what) = req_rx.recv() {
                    let got = match what {
                        Read::Line => {
                            let mut line = String::new();
                            match reader.read_line(&mut line) {
                                Ok(0) | Err(_) => None,
                                Ok(_) => Some(line.trim_end_matches(['\n', '\r']).to_owned()),
                            }
                        }
                        Read::Key => read_key(&mut reader),
                    };
                    let eof = got.is_none();
                    if line_tx.send(got).is_err() || eof {
                        break;
                    }
                }
            })
            .ok()?;
        Some(Self {
            out,
            requests: req_tx,
            lines: line_rx,
            outstanding: None,
            style: Style {
                on: super::render::colour_for(true),
            },
        })
    }

    /// Writes to the terminal: text from elsewhere (the model's tool input, a question)
    /// shown harmlessly, ostler's own colours kept.
    pub fn say(&mut self, text: &str) {
        let _ = write!(self.out, "{}", super::render::terminal_text(text));
        let _ = self.out.flush();
    }

    /// Print `question` and read one line; `None` on Ctrl-C; error at end of input.
    pub async fn ask(&mut self, question: &str, ctrlc: &mut CtrlC) -> Result<Option<String>> {
        self.read(question, Read::Line, ctrlc).await
    }

    /// Print `question` and read one key (no Enter needed); `None` on Ctrl-C.
    pub async fn key(&mut self, question: &str, ctrlc: &mut CtrlC) -> Result<Option<char>> {
        let got = self.read(question, Read::Key, ctrlc).await?;
        let key = got.and_then(|k| k.chars().next());
        match key {
            // Raw mode delivers Ctrl-C as a byte, not a signal.
            Some('\u{3}') | None => {
                self.say("\n");
                Ok(None)
            }
            Some(k) => {
                self.say(&format!("{k}\n"));
                Ok(Some(k))
            }
        }
    }

    async fn read(
        &mut self,
        question: &str,
        what: Read,
        ctrlc: &mut CtrlC,
    ) -> Result<Option<String>> {
        self.say(question);
        // A key read left over from an abandoned prompt (settled by another client): its
        // key, typed in raw mode without echo, starts this line.
        let mut prefix = String::new();
        if what == Read::Line && self.outstanding == Some(Read::Key) {
            let got = tokio::select! {
                got = self.lines.recv() => got.flatten(),
                _ = ctrlc.pressed() => {
                    self.say("\n");
                    return Ok(None);
                }
            };
            self.outstanding = None;
            match got.as_deref() {
                None => return Err(anyhow!("end of input on the terminal")),
                Some("\u{3}") => {
                    self.say("\n");
                    return Ok(None);
                }
                Some("\r" | "\n") => {
                    self.say("\n");
                    return Ok(Some(String::new()));
                }
                Some(k) => {
                    self.say(k);
                    prefix.push_str(k);
                }
            }
        }
        if self.outstanding.is_none() {
            self.requests
                .send(what)
                .map_err(|_| anyhow!("the terminal is closed"))?;
            self.outstanding = Some(what);
        }
        tokio::select! {
            line = self.lines.recv() => {
                self.outstanding = None;
                match line.flatten() {
                    Some(l) => Ok(Some(prefix + &l)),
                    None => Err(anyhow!("end of input on the terminal")),
                }
            }
            _ = ctrlc.pressed() => {
                self.say("\n");
                Ok(None)
            }
        }
    }
}

/// One key from the terminal in raw mode (restored right after); `None` at end of input.
/// Bytes already buffered (typed ahead) are used first.
fn read_key(reader: &mut std::io::BufReader<std::fs::File>) -> Option<String> {
    use std::io::Read as _;
    let raw = crossterm::terminal::enable_raw_mode().is_ok();
    let mut b = [0u8; 1];
    let got = reader.read(&mut b);
    if raw {
        let _ = crossterm::terminal::disable_raw_mode();
    }
    match got {
        Ok(1) => Some(char::from(b[0]).to_string()),
        _ => None,
    }
}

/// Decides prompts from the flags and, when there is one, the terminal.
pub struct Answerer {
    pub args: AnswerArgs,
    rules: Vec<AllowRule>,
    pub tty: Option<Tty>,
    /// Permission prompts take one key, no Enter (the chat loop of `ostler run`).
    pub single_key: bool,
}

impl Answerer {
    pub fn new(args: AnswerArgs) -> Result<Self> {
        let rules = args
            .allow_tools
            .iter()
            .map(|s| AllowRule::parse(s))
            .collect::<Result<Vec<_>>>()?;
        let tty = if args.no_input { None } else { Tty::open() };
        Ok(Self {
            args,
            rules,
            tty,
            single_key: false,
        })
    }

    /// Decide a permission prompt. `asker`: the label of the sub-agent asking (as the
    /// renderer heads its lines), `None` for the main agent.
    pub async fn permission(
        &mut self,
        r: &pb::PermissionRequested,
        asker: Option<&str>,
        ctrlc: &mut CtrlC,
    ) -> Result<Asked<PermissionAnswer>> {
        let input: Value = serde_json::from_str(&r.input_json).unwrap_or(Value::Null);
        if self
            .rules
            .iter()
            .any(|rule| rule.matches(&r.tool_name, &input))
        {
            return Ok(Asked::Answer(PermissionAnswer::Allow { remember: vec![] }));
        }
        if self.args.deny_all {
            return Ok(Asked::Answer(PermissionAnswer::Deny {
                message: self.args.deny_message.clone(),
                interrupt: false,
            }));
        }
        let remember = remember_rule(&r.tool_name, &input);
        let Some(tty) = self.tty.as_mut() else {
            return Ok(Asked::Unanswerable(permission_unanswerable(r, asker)));
        };
        let head = permission_head(tty.style, r, asker, &remember);
        tty.say(&head);
        loop {
            let line = if self.single_key {
                tty.key("  allow? (y/a/n/d): ", ctrlc)
                    .await?
                    .map(|k| k.to_string())
            } else {
                tty.ask("  allow? (y/a/n/d): ", ctrlc).await?
            };
            let Some(line) = line else {
                return Ok(Asked::CtrlC);
            };
            match line.trim().to_ascii_lowercase().as_str() {
                "y" | "yes" => {
                    return Ok(Asked::Answer(PermissionAnswer::Allow { remember: vec![] }));
                }
                "a" | "always" => {
                    return Ok(Asked::Answer(PermissionAnswer::Allow {
                        remember: vec![remember],
                    }));
                }
                c @ ("n" | "no" | "d") => {
                    let interrupt = c == "d";
                    let Some(reason) = tty
                        .ask("  reason (told to the model, Enter for none): ", ctrlc)
                        .await?
                    else {
                        return Ok(Asked::CtrlC);
                    };
                    let message = if reason.trim().is_empty() {
                        "The user denied this tool call.".to_owned()
                    } else {
                        reason.trim().to_owned()
                    };
                    return Ok(Asked::Answer(PermissionAnswer::Deny { message, interrupt }));
                }
                _ => tty.say("  please type y, a, n or d\n"),
            }
        }
    }

    /// Answer a hook call (issue 11): continue, allow, deny (with a reason) or block.
    /// `asker`: the sub-agent the hook fires in (`None`: the main agent).
    pub async fn hook(
        &mut self,
        h: &pb::HookRequested,
        asker: Option<&str>,
        ctrlc: &mut CtrlC,
    ) -> Result<Asked<(pb::HookDecision, String)>> {
        let what = super::hooks::describe_in(h, asker);
        let Some(tty) = self.tty.as_mut() else {
            return Ok(Asked::Unanswerable(hook_unanswerable(h, asker)));
        };
        let st = tty.style;
        // The choices are what the event takes (the daemon would refuse the others).
        let takes = ostler_protocol::hooks::event_takes(&h.hook_event);
        let can = |d: ostler_protocol::hooks::HookDecision| takes.decisions.contains(&d);
        use ostler_protocol::hooks::HookDecision as D;
        let mut choices = vec!["[c] continue"];
        if can(D::Allow) {
            choices.push("[y] allow");
        }
        if can(D::Deny) {
            choices.push("[n] deny (reason told to the model)");
        }
        if can(D::Ask) {
            choices.push("[a] ask (the usual permission prompt)");
        }
        if can(D::Block) {
            choices.push("[b] block (reason told to the model)");
        }
        tty.say(&format!(
            "\n{} {}\n  {}\n",
            st.yellow("? Hook"),
            st.bold(&what),
            choices.join("   ")
        ));
        loop {
            let Some(line) = tty.ask("  answer? ", ctrlc).await? else {
                return Ok(Asked::CtrlC);
            };
            let decision = match line.trim().to_ascii_lowercase().as_str() {
                "c" | "continue" => pb::HookDecision::Continue,
                "y" | "yes" | "allow" if can(D::Allow) => pb::HookDecision::Allow,
                "n" | "no" | "deny" if can(D::Deny) => pb::HookDecision::Deny,
                "a" | "ask" if can(D::Ask) => pb::HookDecision::Ask,
                "b" | "block" if can(D::Block) => pb::HookDecision::Block,
                _ => {
                    tty.say("  please type one of the letters shown\n");
                    continue;
                }
            };
            let mut reason = String::new();
            if matches!(decision, pb::HookDecision::Deny | pb::HookDecision::Block) {
                let Some(r) = tty.ask("  reason: ", ctrlc).await? else {
                    return Ok(Asked::CtrlC);
                };
                reason = if r.trim().is_empty() {
                    "The user refused this.".to_owned()
                } else {
                    r.trim().to_owned()
                };
            }
            return Ok(Asked::Answer((decision, reason)));
        }
    }

    /// Answer a call of a client-hosted tool (issue 11): its result as text, or `!` and an
    /// error message.
    pub async fn tool_call(
        &mut self,
        t: &pb::ToolCallRequested,
        ctrlc: &mut CtrlC,
    ) -> Result<Asked<(String, bool)>> {
        let call = format!(
            "{}.{} {}",
            t.server_name,
            t.tool_name,
            clip(&t.arguments_json, 200)
        );
        let Some(tty) = self.tty.as_mut() else {
            return Ok(Asked::Unanswerable(format!(
                "the model called the client-hosted tool {call}, and there is no terminal to \
                 ask on; answer it with `ostler tool-result {} --text ...|--error ...`",
                t.request_id
            )));
        };
        let st = tty.style;
        tty.say(&format!(
            "\n{} {}\n  type the tool's result (one line), or `!` and an error message\n",
            st.yellow("? Tool call"),
            st.bold(&call)
        ));
        let Some(line) = tty.ask("  result: ", ctrlc).await? else {
            return Ok(Asked::CtrlC);
        };
        Ok(Asked::Answer(match line.trim().strip_prefix('!') {
            Some(e) => (e.trim().to_owned(), true),
            None => (line.trim().to_owned(), false),
        }))
    }

    /// Answer a dialog the CLI asks for (`request_user_dialog`): the result as JSON (a
    /// bare word is taken as a JSON string, `retry_fallback`), or an empty line to cancel.
    /// The behavior and the result (JSON text; empty when cancelled).
    pub async fn dialog(
        &mut self,
        d: &pb::DialogRequested,
        ctrlc: &mut CtrlC,
    ) -> Result<Asked<(pb::DialogBehavior, String)>> {
        use super::dialogs as dl;
        let what = dl::describe(d);
        let Some(tty) = self.tty.as_mut() else {
            return Ok(Asked::Unanswerable(format!(
                "the CLI asks for a dialog ({what}), and there is no terminal to ask on; \
                 answer it with `{}`",
                dl::hint(d)
            )));
        };
        let st = tty.style;
        let choices = if d.dialog_kind == "refusal_fallback_prompt" {
            "retry_fallback, edit_prompt"
        } else {
            "JSON"
        };
        tty.say(&format!(
            "\n{} {}\n  type the result ({choices}), or an empty line to cancel\n",
            st.yellow("? Dialog"),
            st.bold(&what)
        ));
        let Some(line) = tty.ask("  result: ", ctrlc).await? else {
            return Ok(Asked::CtrlC);
        };
        Ok(Asked::Answer(dialog_result(&line)))
    }

    /// Answer an elicitation (an MCP server asking for input): accept, decline or cancel;
    /// accepting a form asks each of its fields. The action and the content (JSON object
    /// text; empty in url mode and unless accepted).
    pub async fn elicitation(
        &mut self,
        e: &pb::ElicitationRequested,
        ctrlc: &mut CtrlC,
    ) -> Result<Asked<(pb::ElicitationAction, String)>> {
        use super::elicitations as el;
        let what = el::describe(e);
        let Some(tty) = self.tty.as_mut() else {
            return Ok(Asked::Unanswerable(format!(
                "an MCP server asks for input ({what}), and there is no terminal to ask on; \
                 answer it with `ostler elicitation {} --accept [--field KEY=VALUE]|--decline|--cancel`",
                e.request_id
            )));
        };
        let st = tty.style;
        let url = el::is_url(e);
        let form = if url { Vec::new() } else { el::form_fields(e) };
        let mut head = format!(
            "\n{} {} asks:\n",
            st.yellow("? MCP server"),
            st.bold(&e.mcp_server_name)
        );
        head.push_str(&format!("  {}\n", st.bold(&e.message)));
        for extra in [&e.title, &e.display_name, &e.description] {
            if !extra.is_empty() && *extra != e.message {
                head.push_str(&format!("  {}\n", st.dim(&clip(extra, 200))));
            }
        }
        if url {
            head.push_str(&format!("  open: {}\n", e.url));
            head.push_str("  [y] accept (once it is open)   [n] decline   [c] cancel\n");
        } else {
            if !form.is_empty() {
                let list: Vec<String> = form
                    .iter()
                    .map(|f| format!("{} ({})", f.name, f.takes()))
                    .collect();
                head.push_str(&format!(
                    "  {}\n",
                    st.dim(&format!("fields: {}", list.join(", ")))
                ));
            }
            head.push_str("  [y] accept (fill in the fields)   [n] decline   [c] cancel\n");
        }
        tty.say(&head);
        let action = loop {
            let Some(line) = tty.ask("  answer? (y/n/c): ", ctrlc).await? else {
                return Ok(Asked::CtrlC);
            };
            match line.trim().to_ascii_lowercase().as_str() {
                "y" | "yes" | "accept" => break pb::ElicitationAction::Accept,
                "n" | "no" | "decline" => break pb::ElicitationAction::Decline,
                "c" | "cancel" => break pb::ElicitationAction::Cancel,
                _ => tty.say("  please type y, n or c\n"),
            }
        };
        if action != pb::ElicitationAction::Accept || url {
            return Ok(Asked::Answer((action, String::new())));
        }
        let mut content = serde_json::Map::new();
        for f in &form {
            if !f.description.is_empty() {
                tty.say(&format!("  {}\n", st.dim(&clip(&f.description, 200))));
            }
            for (i, c) in f.choices.iter().enumerate() {
                tty.say(&format!("    {}) {}\n", i + 1, c.label));
            }
            let name = if f.title.is_empty() {
                f.name.clone()
            } else {
                format!("{} ({})", f.title, f.name)
            };
            let default = match &f.default {
                Some(d) => format!(", Enter: {d}"),
                None if !f.required => ", Enter to leave out".to_owned(),
                None => String::new(),
            };
            let question = format!("  {name} [{}{default}]: ", f.takes());
            loop {
                let Some(line) = tty.ask(&question, ctrlc).await? else {
                    return Ok(Asked::CtrlC);
                };
                match el::answer_field(f, &line) {
                    Ok(Some(v)) => {
                        content.insert(f.name.clone(), v);
                        break;
                    }
                    Ok(None) => break,
                    Err(why) => tty.say(&format!("  {why}\n")),
                }
            }
        }
        Ok(Asked::Answer((action, Value::Object(content).to_string())))
    }

    /// Answer a question (every question of the call; an optional one may be skipped).
    pub async fn question(
        &mut self,
        q: &pb::QuestionAsked,
        ctrlc: &mut CtrlC,
    ) -> Result<Asked<Vec<pb::QuestionAnswer>>> {
        if self.args.answer_first {
            let answers = q
                .questions
                .iter()
                .map(|q| pb::QuestionAnswer {
                    question: q.question.clone(),
                    selected: q
                        .options
                        .first()
                        .map(|o| o.label.clone())
                        .into_iter()
                        .collect(),
                    other_text: if q.kind == "number" {
                        // The starting value, else the lowest (the daemon checks the range).
                        fmt_number(q.default_value.or(q.min).unwrap_or(0.0))
                    } else if q.options.is_empty() {
                        "(no answer)".into()
                    } else {
                        String::new()
                    },
                })
                .collect();
            return Ok(Asked::Answer(answers));
        }
        let Some(tty) = self.tty.as_mut() else {
            let first = q
                .questions
                .first()
                .map(|q| q.question.as_str())
                .unwrap_or("?");
            return Ok(Asked::Unanswerable(format!(
                "the session asks a question ({}) and there is no terminal to ask on; \
                 pass --answer-first, or answer it with `ostler answer {} CHOICE`",
                clip(first, 80),
                q.request_id,
            )));
        };
        let st = tty.style;
        let mut answers = Vec::new();
        if !q.title.is_empty() {
            tty.say(&format!("\n{}\n", st.bold(&q.title)));
        }
        for question in &q.questions {
            let mut text = String::from("\n");
            if !question.header.is_empty() {
                text.push_str(&format!("{} ", st.dim(&format!("[{}]", question.header))));
            }
            text.push_str(&format!(
                "{} {}\n",
                st.yellow("?"),
                st.bold(&question.question)
            ));
            if !question.description.is_empty() {
                text.push_str(&format!("  {}\n", st.dim(&question.description)));
            }
            for (i, o) in question.options.iter().enumerate() {
                let desc = if o.description.is_empty() {
                    String::new()
                } else {
                    format!(" — {}", st.dim(&o.description))
                };
                text.push_str(&format!("  {}) {}{desc}\n", i + 1, o.label));
            }
            tty.say(&text);
            let n = question.options.len();
            // Free text only where the daemon takes it whatever its settings: a question
            // without options (`answers.allow_free_text` is not visible to clients).
            let ask = if question.multi_select {
                format!("  choose 1-{n}, several separated by commas: ")
            } else if n > 0 {
                format!("  choose 1-{n}: ")
            } else if question.kind == "number" {
                format!("  {}: ", number_range(question))
            } else if !question.placeholder.is_empty() {
                format!("  your answer (e.g. {}): ", question.placeholder)
            } else {
                "  your answer: ".to_owned()
            };
            // An optional question (an extended form's) is skipped with an empty line.
            let ask = if question.optional {
                format!("{} (Enter to skip): ", ask.trim_end().trim_end_matches(':'))
            } else {
                ask
            };
            loop {
                let Some(line) = tty.ask(&ask, ctrlc).await? else {
                    return Ok(Asked::CtrlC);
                };
                if question.optional && line.trim().is_empty() {
                    tty.say("  (skipped)\n");
                    break;
                }
                match parse_choice(&line, question) {
                    Some(a) => {
                        answers.push(a);
                        break;
                    }
                    None if question.kind == "number" => {
                        tty.say(&format!("  please type {}\n", number_range(question)))
                    }
                    None if question.multi_select => tty.say(&format!(
                        "  please type option numbers between 1 and {n}, separated by commas\n"
                    )),
                    None => tty.say(&format!("  please type a number between 1 and {n}\n")),
                }
            }
        }
        Ok(Asked::Answer(answers))
    }
}

/// Why a permission request cannot be answered here, and how it can be; a sub-agent's
/// request names it by its label (`sub-agent task-1 asks for permission to run …`).
fn permission_unanswerable(r: &pb::PermissionRequested, asker: Option<&str>) -> String {
    format!(
        "{} asks for permission to run {}, and there is no terminal to ask on; \
         pass --allow-tools {} or --deny-all, or answer it with `ostler approve {}` / \
         `ostler deny {} -m WHY`",
        asker.unwrap_or("the session"),
        tool_call(&r.tool_name, &r.input_json),
        r.tool_name,
        r.request_id,
        r.request_id,
    )
}

fn hook_unanswerable(h: &pb::HookRequested, asker: Option<&str>) -> String {
    format!(
        "the session's hook {} waits for an answer, and there is no terminal to ask on; \
         answer it with `ostler hook {} --allow|--deny REASON|--continue` (its \
         registration's default is taken when it expires)",
        super::hooks::describe_in(h, asker),
        h.request_id
    )
}

/// A permission prompt's head on the terminal: who asks to run what (`? Allow Bash(ls)`
/// for the main agent, `? general-purpose · Count files wants to run Bash(ls)` for a
/// sub-agent), the request's details, and the choices.
fn permission_head(
    st: Style,
    r: &pb::PermissionRequested,
    asker: Option<&str>,
    remember: &pb::PermissionRule,
) -> String {
    let call = tool_call(&r.tool_name, &r.input_json);
    let who = match asker {
        Some(label) => format!("? {label} wants to run"),
        None => "? Allow".to_owned(),
    };
    let mut head = format!("\n{} {}\n", st.yellow(&who), st.bold(&call));
    if !r.description.is_empty() {
        head.push_str(&format!("  {}\n", st.dim(&clip(&r.description, 200))));
    }
    if !r.decision_reason.is_empty() {
        head.push_str(&format!("  {}\n", st.dim(&clip(&r.decision_reason, 200))));
    }
    if !r.blocked_path.is_empty() {
        head.push_str(&format!(
            "  {}\n",
            st.dim(&format!("path: {}", r.blocked_path))
        ));
    }
    let scope = if remember.pattern.is_empty() {
        remember.tool.clone()
    } else {
        format!("{}({})", remember.tool, clip(&remember.pattern, 60))
    };
    head.push_str(&format!(
        "  [y] allow once   [a] allow {scope} for this session   [n] deny   [d] deny and stop the turn\n"
    ));
    head
}

/// `12`, `12.5`: a number as a person types it.
fn fmt_number(v: f64) -> String {
    format!("{v}")
}

/// "a number from 3 to 20 slides": what a number question takes.
fn number_range(q: &pb::Question) -> String {
    let bound = |b: Option<f64>| b.map_or_else(|| "…".to_owned(), fmt_number);
    let unit = if q.unit.is_empty() {
        String::new()
    } else {
        format!(" {}", q.unit)
    };
    format!("a number from {} to {}{unit}", bound(q.min), bound(q.max))
}

/// Numbers (1-based, commas for multi-select) pick options; a question without options
/// takes any text (a number question: a number in its range). `None`: not a valid choice
/// (ask again).
pub fn parse_choice(line: &str, q: &pb::Question) -> Option<pb::QuestionAnswer> {
    let line = line.trim();
    if line.is_empty() {
        return None;
    }
    if q.options.is_empty() {
        if q.kind == "number" {
            let v = line.parse::<f64>().ok().filter(|v| {
                v.is_finite() && q.min.is_none_or(|m| *v >= m) && q.max.is_none_or(|m| *v <= m)
            })?;
            return Some(pb::QuestionAnswer {
                question: q.question.clone(),
                selected: vec![],
                other_text: fmt_number(v),
            });
        }
        return Some(pb::QuestionAnswer {
            question: q.question.clone(),
            selected: vec![],
            other_text: line.to_owned(),
        });
    }
    let picks: Option<Vec<usize>> = line
        .split(',')
        .map(|p| {
            p.trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n >= 1 && *n <= q.options.len())
        })
        .collect();
    match picks {
        Some(p) if !p.is_empty() && (q.multi_select || p.len() == 1) => Some(pb::QuestionAnswer {
            question: q.question.clone(),
            selected: p.iter().map(|i| q.options[i - 1].label.clone()).collect(),
            other_text: String::new(),
        }),
        _ => None,
    }
}

/// "Allow for this session": Bash by exact command prefix, other tools entirely.
pub fn remember_rule(tool: &str, input: &Value) -> pb::PermissionRule {
    let pattern = if tool == "Bash" {
        input
            .get("command")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    } else {
        String::new()
    };
    pb::PermissionRule {
        tool: tool.to_owned(),
        pattern,
        action: pb::RuleAction::Allow as i32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn allow_rules_parse_and_match() -> Result<()> {
        let r = AllowRule::parse("Bash(git status:*)")?;
        assert_eq!(
            r,
            AllowRule {
                tool: "Bash".into(),
                prefix: "git status".into()
            }
        );
        assert!(r.matches("Bash", &json!({"command": "git status"})));
        assert!(r.matches("Bash", &json!({"command": "git status -s"})));
        assert!(!r.matches("Bash", &json!({"command": "git statusx"})));
        assert!(!r.matches("Bash", &json!({"command": "git status && rm -rf /"})));
        // Anything that makes it more than one plain command goes to the user.
        for tail in [
            " & rm -f x",
            " ; rm x",
            " | sh",
            " > f",
            " < f",
            " `rm x`",
            " $(rm x)",
            " && rm x",
            " || rm x",
            "\nrm x",
            "\rrm x",
            " \\\nrm",
        ] {
            let cmd = format!("git status{tail}");
            assert!(!r.matches("Bash", &json!({ "command": cmd })), "{cmd:?}");
        }
        assert!(!r.matches("Edit", &json!({"command": "git status"})));
        let all = AllowRule::parse("*")?;
        assert!(all.matches("Write", &json!({})));
        let mcp = AllowRule::parse("mcp__gh__*")?;
        assert!(mcp.matches("mcp__gh__list", &json!({})));
        assert!(!mcp.matches("mcp__other", &json!({})));
        let w = AllowRule::parse("Write(/tmp/)")?;
        assert!(w.matches("Write", &json!({"file_path": "/tmp/a"})));
        assert!(!w.matches("Write", &json!({"file_path": "/etc/a"})));
        assert!(!w.matches("Write", &json!({"file_path": "/tmp/../etc/a"})));
        assert!(!w.matches("Write", &json!({"file_path": "/tmp/.."})));
        assert!(AllowRule::parse("Bash(oops").is_err());
        Ok(())
    }

    #[test]
    fn choices() {
        let q = pb::Question {
            question: "Colour?".into(),
            options: vec![
                pb::QuestionOption {
                    label: "Red".into(),
                    ..Default::default()
                },
                pb::QuestionOption {
                    label: "Blue".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let a = parse_choice("2", &q);
        assert_eq!(a.map(|a| a.selected), Some(vec!["Blue".to_owned()]));
        assert!(
            parse_choice("1,2", &q).is_none(),
            "single select: one choice"
        );
        assert!(parse_choice("3", &q).is_none(), "out of range");
        assert!(
            parse_choice("green please", &q).is_none(),
            "no free text where there are options"
        );
        assert!(parse_choice("  ", &q).is_none());
        let open = pb::Question {
            question: "Name?".into(),
            ..Default::default()
        };
        let a = parse_choice("Ada", &open);
        assert_eq!(a.map(|a| a.other_text), Some("Ada".to_owned()));
        let slides = pb::Question {
            question: "Slides?".into(),
            kind: "number".into(),
            min: Some(3.0),
            max: Some(20.0),
            unit: "slides".into(),
            ..Default::default()
        };
        let a = parse_choice(" 12 ", &slides);
        assert_eq!(a.map(|a| a.other_text), Some("12".to_owned()));
        assert!(parse_choice("2", &slides).is_none(), "below min");
        assert!(parse_choice("twelve", &slides).is_none(), "not a number");
        assert_eq!(number_range(&slides), "a number from 3 to 20 slides");
        let multi = pb::Question {
            multi_select: true,
            ..q
        };
        let a = parse_choice("1, 2", &multi);
        assert_eq!(
            a.map(|a| a.selected),
            Some(vec!["Red".to_owned(), "Blue".to_owned()])
        );
    }

    #[test]
    fn a_permission_prompt_names_the_subagent_that_asks() {
        let r = pb::PermissionRequested {
            request_id: "r1".into(),
            tool_name: "Bash".into(),
            input_json: r#"{"command":"touch sub.txt"}"#.into(),
            description: "Create the file".into(),
            agent_id: "task-1".into(),
            ..Default::default()
        };
        let st = Style { on: false };
        let remember = remember_rule("Bash", &json!({"command": "touch sub.txt"}));
        let choices = "  [y] allow once   [a] allow Bash(touch sub.txt) for this session   \
                       [n] deny   [d] deny and stop the turn\n";
        // The main agent: the wording as it always was.
        assert_eq!(
            permission_head(st, &r, None, &remember),
            format!("\n? Allow Bash(touch sub.txt)\n  Create the file\n{choices}")
        );
        assert_eq!(
            permission_head(st, &r, Some("general-purpose · Create sub.txt"), &remember),
            format!(
                "\n? general-purpose · Create sub.txt wants to run Bash(touch sub.txt)\n  \
                 Create the file\n{choices}"
            )
        );
        // Without a terminal, the message that says how to answer it names the asker too.
        let main = permission_unanswerable(&r, None);
        assert!(
            main.starts_with("the session asks for permission to run Bash(touch sub.txt), "),
            "{main}"
        );
        let sub = permission_unanswerable(&r, Some("sub-agent task-1"));
        assert!(
            sub.starts_with("sub-agent task-1 asks for permission to run Bash(touch sub.txt), "),
            "{sub}"
        );
        assert!(
            sub.ends_with("`ostler approve r1` / `ostler deny r1 -m WHY`"),
            "{sub}"
        );
    }

    #[test]
    fn a_hook_call_without_a_terminal_names_the_subagent() {
        let h = pb::HookRequested {
            request_id: "h1".into(),
            hook_event: "PreToolUse".into(),
            tool_name: "Bash".into(),
            agent_id: "task-1".into(),
            ..Default::default()
        };
        let main = hook_unanswerable(&h, None);
        assert!(
            main.starts_with("the session's hook PreToolUse Bash waits for an answer"),
            "{main}"
        );
        let sub = hook_unanswerable(&h, Some("sub-agent task-1"));
        assert!(
            sub.starts_with(
                "the session's hook PreToolUse Bash in sub-agent task-1 waits for an answer"
            ),
            "{sub}"
        );
        assert!(sub.contains("`ostler hook h1 --allow"), "{sub}");
    }

    #[test]
    fn remember_is_scoped() {
        let r = remember_rule("Bash", &json!({"command": "touch a"}));
        assert_eq!((r.tool.as_str(), r.pattern.as_str()), ("Bash", "touch a"));
        let r = remember_rule("Edit", &json!({"file_path": "/x"}));
        assert_eq!(r.pattern, "");
    }
}

/// A dialog's typed answer: empty = cancelled; JSON as is; a bare word as a JSON string.
pub fn dialog_result(line: &str) -> (pb::DialogBehavior, String) {
    let t = line.trim();
    if t.is_empty() {
        return (pb::DialogBehavior::Cancelled, String::new());
    }
    let json = match serde_json::from_str::<serde_json::Value>(t) {
        Ok(_) => t.to_owned(),
        Err(_) => serde_json::Value::String(t.to_owned()).to_string(),
    };
    (pb::DialogBehavior::Completed, json)
}

#[cfg(test)]
mod dialog_tests {
    use super::*;

    #[test]
    fn a_typed_dialog_answer_is_json_a_word_or_nothing() {
        assert_eq!(
            dialog_result(" retry_fallback \n"),
            (pb::DialogBehavior::Completed, "\"retry_fallback\"".into())
        );
        assert_eq!(
            dialog_result("{\"a\": 1}"),
            (pb::DialogBehavior::Completed, "{\"a\": 1}".into())
        );
        assert_eq!(
            dialog_result("  "),
            (pb::DialogBehavior::Cancelled, String::new())
        );
    }
}
