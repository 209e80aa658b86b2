//! The permission engine: pure functions, no I/O.
//!
//! A rule names a tool (`Bash`, `Edit`, `mcp__srv__*`, `*`) and optionally a pattern:
//! - for `Bash`: a command prefix matched on word boundaries (`git status` matches
//!   `git status` and `git status -s`, not `git statusx`; Claude's `git:*` spelling is
//!   accepted). An **allow** rule never matches a compound command (`;`, `&&`, `||`, `|`,
//!   `&`, backticks, `$(`, redirections, newlines), so `Bash(git status)` cannot allow
//!   `git status && rm -rf ~`. A **deny** rule matches when any simple command of a
//!   compound command starts with the prefix.
//! - for every other tool: a path glob (`*` within one segment, `**` any number of
//!   segments, `?` one character) matched against the input's `file_path`, `path` or
//!   `notebook_path`, after lexical normalisation (`.`/`..`). A relative glob is taken
//!   relative to the session's cwd; a path outside the cwd never matches a relative glob.
//!
//! Deny wins over allow; nothing matching means "ask the clients".

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use ostler_protocol::Question;

use crate::error::{Error, Result};
use crate::types::QuestionAnswer;

/// What a rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleAction {
    Allow,
    Deny,
}

impl RuleAction {
    pub fn as_str(self) -> &'static str {
        match self {
            RuleAction::Allow => "allow",
            RuleAction::Deny => "deny",
        }
    }
}

/// A permission rule (from config, from `CreateSession`, or remembered for a session).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PermissionRule {
    /// Tool name; a trailing `*` matches any suffix (`mcp__github__*`); `*` alone any tool.
    pub tool: String,
    /// Bash command prefix, or a path glob for file tools. `None`: any input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    pub action: RuleAction,
}

impl PermissionRule {
    pub fn allow(tool: impl Into<String>, pattern: Option<&str>) -> Self {
        Self {
            tool: tool.into(),
            pattern: pattern.map(str::to_owned),
            action: RuleAction::Allow,
        }
    }

    pub fn deny(tool: impl Into<String>, pattern: Option<&str>) -> Self {
        Self {
            tool: tool.into(),
            pattern: pattern.map(str::to_owned),
            action: RuleAction::Deny,
        }
    }

    /// `allow Bash(git status)`, `deny Edit(secrets/**)`, `allow Read`.
    pub fn text(&self) -> String {
        match &self.pattern {
            Some(p) => format!("{} {}({})", self.action.as_str(), self.tool, p),
            None => format!("{} {}", self.action.as_str(), self.tool),
        }
    }

    /// Parses `Tool` or `Tool(pattern)` (Claude's settings spelling) with an action.
    pub fn parse(action: RuleAction, spec: &str) -> Result<Self> {
        let spec = spec.trim();
        let (tool, pattern) = match spec.find('(') {
            Some(open) => {
                let Some(inner) = spec[open + 1..].strip_suffix(')') else {
                    return Err(Error::invalid(
                        "rule",
                        format!("{spec:?}: expected `Tool(pattern)`"),
                    ));
                };
                (spec[..open].trim(), Some(inner.trim().to_owned()))
            }
            None => (spec, None),
        };
        let rule = Self {
            tool: tool.to_owned(),
            pattern,
            action,
        };
        rule.validate()?;
        Ok(rule)
    }

    /// Checks the rule is usable (non-empty tool name, non-empty pattern when given).
    pub fn validate(&self) -> Result<()> {
        if self.tool.trim().is_empty() {
            return Err(Error::invalid("rule.tool", "the tool name is empty"));
        }
        if let Some(p) = &self.pattern
            && p.trim().is_empty()
        {
            return Err(Error::invalid(
                "rule.pattern",
                format!(
                    "empty pattern for tool {:?} (omit it to match any input)",
                    self.tool
                ),
            ));
        }
        Ok(())
    }

    fn tool_matches(&self, tool: &str) -> bool {
        match self.tool.strip_suffix('*') {
            Some(prefix) => tool.starts_with(prefix),
            None => self.tool == tool,
        }
    }

    /// Does this rule apply to a call of `tool` with `input` in a session rooted at `cwd`?
    pub fn matches(&self, tool: &str, input: &Value, cwd: &Path) -> bool {
        if !self.tool_matches(tool) {
            return false;
        }
        let Some(pattern) = &self.pattern else {
            return true;
        };
        if tool == "Bash" {
            let Some(command) = input.get("command").and_then(Value::as_str) else {
                return false;
            };
            return bash_matches(pattern, command, self.action);
        }
        ["file_path", "path", "notebook_path"]
            .iter()
            .filter_map(|k| input.get(*k).and_then(Value::as_str))
            .any(|p| path_matches(pattern, p, cwd))
    }
}

/// A rule that decided a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleDecision {
    pub action: RuleAction,
    pub rule: PermissionRule,
}

impl RuleDecision {
    /// `rule:<rule text>`, as recorded in `decided_by`.
    pub fn decided_by(&self) -> String {
        format!("rule:{}", self.rule.text())
    }
}

/// Evaluates `rules` for one tool call: the first matching deny rule if any, else the
/// first matching allow rule, else `None` (ask the clients).
pub fn evaluate<'a>(
    rules: impl IntoIterator<Item = &'a PermissionRule>,
    tool: &str,
    input: &Value,
    cwd: &Path,
) -> Option<RuleDecision> {
    let mut allow: Option<&PermissionRule> = None;
    for rule in rules {
        if !rule.matches(tool, input, cwd) {
            continue;
        }
        match rule.action {
            RuleAction::Deny => {
                return Some(RuleDecision {
                    action: RuleAction::Deny,
                    rule: rule.clone(),
                });
            }
            RuleAction::Allow => {
                allow.get_or_insert(rule);
            }
        }
    }
    allow.map(|rule| RuleDecision {
        action: RuleAction::Allow,
        rule: rule.clone(),
    })
}

/// Shell operators that chain or redirect commands.
const SHELL_OPERATORS: &[&str] = &["&&", "||", ";", "|", "&", "`", "$(", ">", "<", "\n", "\r"];

fn normalize_prefix(pattern: &str) -> &str {
    let p = pattern.trim();
    // Claude's settings spelling: `git:*` / `git *` mean "git followed by anything".
    let p = p.strip_suffix(":*").unwrap_or(p);
    let p = p.strip_suffix(" *").unwrap_or(p);
    p.trim()
}

fn starts_with_words(command: &str, prefix: &str) -> bool {
    let command = command.trim();
    if prefix.is_empty() {
        return true;
    }
    match command.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with(char::is_whitespace),
        None => false,
    }
}

fn bash_matches(pattern: &str, command: &str, action: RuleAction) -> bool {
    let prefix = normalize_prefix(pattern);
    match action {
        RuleAction::Allow => {
            if SHELL_OPERATORS.iter().any(|op| command.contains(op)) {
                return false;
            }
            starts_with_words(command, prefix)
        }
        RuleAction::Deny => split_simple_commands(command)
            .into_iter()
            .any(|c| starts_with_words(strip_env_and_subshell(c), prefix)),
    }
}

/// Splits on every shell operator (conservative; quoting is ignored on purpose: a deny
/// rule should rather match too much than too little).
fn split_simple_commands(command: &str) -> Vec<&str> {
    let mut parts = vec![command];
    for op in SHELL_OPERATORS {
        parts = parts.into_iter().flat_map(|p| p.split(op)).collect();
    }
    parts
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

fn strip_env_and_subshell(c: &str) -> &str {
    let mut c = c.trim_start_matches(['(', '{', ' ', '\t', ')']);
    // Leading `VAR=value` assignments.
    loop {
        let word_end = c.find(char::is_whitespace).unwrap_or(c.len());
        let word = &c[..word_end];
        if word_end < c.len()
            && word.contains('=')
            && word.split('=').next().is_some_and(|n| {
                !n.is_empty() && n.chars().all(|ch| ch.is_alphanumeric() || ch == '_')
            })
        {
            c = c[word_end..].trim_start();
        } else {
            break;
        }
    }
    c.strip_prefix("sudo ").map(str::trim_start).unwrap_or(c)
}

/// Lexically normalises `path` (resolving `.` and `..`); `None` when `..` climbs above
/// the root or the start of a relative path.
pub fn normalize_path(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    let mut depth = 0usize;
    for comp in path.components() {
        match comp {
            Component::Prefix(p) => out.push(p.as_os_str()),
            Component::RootDir => out.push(Component::RootDir.as_os_str()),
            Component::CurDir => {}
            Component::ParentDir => {
                if depth == 0 {
                    return None;
                }
                out.pop();
                depth -= 1;
            }
            Component::Normal(s) => {
                out.push(s);
                depth += 1;
            }
        }
    }
    Some(out)
}

fn path_matches(glob: &str, path: &str, cwd: &Path) -> bool {
    let glob = glob.trim();
    let raw = Path::new(path);
    let abs = if raw.is_absolute() {
        raw.to_path_buf()
    } else {
        cwd.join(raw)
    };
    let Some(abs) = normalize_path(&abs) else {
        return false;
    };
    let (glob_path, target): (&str, PathBuf) = if Path::new(glob).is_absolute() {
        (glob, abs)
    } else {
        let Some(cwd) = normalize_path(cwd) else {
            return false;
        };
        match abs.strip_prefix(&cwd) {
            Ok(rel) => (glob.strip_prefix("./").unwrap_or(glob), rel.to_path_buf()),
            Err(_) => return false,
        }
    };
    let Some(target) = target.to_str() else {
        return false;
    };
    let glob_segs: Vec<&str> = glob_path.split('/').filter(|s| !s.is_empty()).collect();
    let path_segs: Vec<&str> = target.split('/').filter(|s| !s.is_empty()).collect();
    // A glob naming a directory (`src/`) covers everything below it.
    if glob_path.ends_with('/') {
        let mut g = glob_segs.clone();
        g.push("**");
        return glob_match_segments(&g, &path_segs);
    }
    glob_match_segments(&glob_segs, &path_segs)
}

fn glob_match_segments(glob: &[&str], path: &[&str]) -> bool {
    match glob.split_first() {
        None => path.is_empty(),
        Some((&"**", rest)) => (0..=path.len()).any(|i| glob_match_segments(rest, &path[i..])),
        Some((g, rest)) => match path.split_first() {
            Some((p, prest)) => segment_match(g, p) && glob_match_segments(rest, prest),
            None => false,
        },
    }
}

/// `*` and `?` within one path segment.
fn segment_match(glob: &str, s: &str) -> bool {
    let g: Vec<char> = glob.chars().collect();
    let t: Vec<char> = s.chars().collect();
    let (mut gi, mut ti) = (0usize, 0usize);
    let (mut star, mut mark) = (None::<usize>, 0usize);
    while ti < t.len() {
        if gi < g.len() && (g[gi] == '?' || g[gi] == t[ti]) {
            gi += 1;
            ti += 1;
        } else if gi < g.len() && g[gi] == '*' {
            star = Some(gi);
            gi += 1;
            mark = ti;
        } else if let Some(si) = star {
            gi = si + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    while gi < g.len() && g[gi] == '*' {
        gi += 1;
    }
    gi == g.len()
}

/// The tool name of Claude Code's question tool.
pub const ASK_USER_QUESTION: &str = "AskUserQuestion";

/// Validates `answers` against the asked `questions`: every question answered exactly
/// once (an optional one, [`Question::optional`], at most once: missing, or with no choice
/// and no text, it is left unanswered), nothing else answered, at least one choice each (option labels plus the optional
/// free text), more than one only where multi-select is allowed, no repeated choice, every
/// label one of the question's options, and free text (`other_text`) only when
/// `allow_free_text` or the question has no options.
///
/// Returns `(question, choices)` pairs of the answered questions in the order of
/// `questions` (free text last); a question left unanswered has none.
pub fn validate_answers(
    questions: &[Question],
    answers: &[QuestionAnswer],
    allow_free_text: bool,
) -> Result<Vec<(String, Vec<String>)>> {
    for (i, a) in answers.iter().enumerate() {
        if !questions.iter().any(|q| q.question == a.question) {
            return Err(Error::invalid(
                format!("answers[{i}].question"),
                format!("{:?} is not one of the questions asked", a.question),
            ));
        }
        if answers[..i].iter().any(|b| b.question == a.question) {
            return Err(Error::invalid(
                format!("answers[{i}].question"),
                format!("{:?} is answered more than once", a.question),
            ));
        }
    }
    let mut out = Vec::with_capacity(questions.len());
    for (qi, q) in questions.iter().enumerate() {
        let Some((ai, a)) = answers
            .iter()
            .enumerate()
            .find(|(_, a)| a.question == q.question)
        else {
            if q.optional {
                continue;
            }
            return Err(Error::invalid(
                "answers",
                format!(
                    "question {} ({:?}) is not answered; it is not optional (only the \
                     questions of an extended form may be left unanswered)",
                    qi + 1,
                    q.question
                ),
            ));
        };
        let field = format!("answers[{ai}].selected");
        if a.selected.iter().any(|s| s.trim().is_empty()) {
            return Err(Error::invalid(
                field,
                format!("empty choice for {:?}", q.question),
            ));
        }
        let other = a
            .other_text
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty());
        if let Some(text) = other
            && !(allow_free_text || q.options.is_empty())
        {
            return Err(Error::invalid(
                format!("answers[{ai}].other_text"),
                format!(
                    "free text {text:?} is not accepted for {:?}; choose one of its options",
                    q.question
                ),
            ));
        }
        if let (true, Some(text)) = (q.is_number(), other) {
            let in_range = text.parse::<f64>().ok().filter(|v| {
                v.is_finite()
                    && q.min.is_none_or(|min| *v >= min)
                    && q.max.is_none_or(|max| *v <= max)
            });
            if in_range.is_none() {
                return Err(Error::invalid(
                    format!("answers[{ai}].other_text"),
                    format!(
                        "{:?} asks for a number from {} to {}; got {text:?}",
                        q.question,
                        q.min.map_or("-".into(), |v| v.to_string()),
                        q.max.map_or("-".into(), |v| v.to_string()),
                    ),
                ));
            }
        }
        let count = a.selected.len() + usize::from(other.is_some());
        if count == 0 && q.optional {
            continue;
        }
        if count == 0 {
            return Err(Error::invalid(
                field,
                format!("empty answer to {:?}", q.question),
            ));
        }
        if !q.multi_select && count > 1 {
            return Err(Error::invalid(
                field,
                format!("{:?} allows one choice, got {count}", q.question),
            ));
        }
        for (si, s) in a.selected.iter().enumerate() {
            if a.selected[..si].contains(s) {
                return Err(Error::invalid(field, format!("{s:?} chosen twice")));
            }
            if !q.options.iter().any(|o| &o.label == s) {
                let labels: Vec<&str> = q.options.iter().map(|o| o.label.as_str()).collect();
                return Err(Error::invalid(
                    field,
                    format!(
                        "{s:?} is not an option of {:?} (options: {labels:?})",
                        q.question
                    ),
                ));
            }
        }
        let mut choices = a.selected.clone();
        choices.extend(other.map(str::to_owned));
        out.push((q.question.clone(), choices));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ostler_protocol::QuestionOption;
    use serde_json::json;

    fn cwd() -> &'static Path {
        Path::new("/work/proj")
    }

    fn bash(cmd: &str) -> Value {
        json!({ "command": cmd })
    }

    #[test]
    fn bash_prefix_matches_on_word_boundaries() {
        let r = PermissionRule::allow("Bash", Some("git status"));
        assert!(r.matches("Bash", &bash("git status"), cwd()));
        assert!(r.matches("Bash", &bash("git status -s"), cwd()));
        assert!(r.matches("Bash", &bash("  git status  "), cwd()));
        assert!(!r.matches("Bash", &bash("git statusx"), cwd()));
        assert!(!r.matches("Bash", &bash("git stat"), cwd()));
        assert!(!r.matches("Bash", &bash("echo git status"), cwd()));
        assert!(!r.matches("Edit", &bash("git status"), cwd()));
        assert!(!r.matches("Bash", &json!({}), cwd()));
    }

    #[test]
    fn claude_colon_star_spelling_is_a_prefix() {
        let r = PermissionRule::allow("Bash", Some("git:*"));
        assert!(r.matches("Bash", &bash("git log --oneline"), cwd()));
        assert!(r.matches("Bash", &bash("git"), cwd()));
        assert!(!r.matches("Bash", &bash("gitk"), cwd()));
    }

    #[test]
    fn allow_never_matches_compound_commands() {
        let r = PermissionRule::allow("Bash", Some("git status"));
        for cmd in [
            "git status && rm -rf ~",
            "git status; rm x",
            "git status | sh",
            "git status > /etc/passwd",
            "git status `rm x`",
            "git status $(rm x)",
            "git status &",
            "git status\nrm x",
            "git status || true",
        ] {
            assert!(!r.matches("Bash", &bash(cmd), cwd()), "{cmd}");
        }
    }

    #[test]
    fn deny_matches_any_part_of_a_compound_command() {
        let r = PermissionRule::deny("Bash", Some("rm"));
        assert!(r.matches("Bash", &bash("rm -rf x"), cwd()));
        assert!(r.matches("Bash", &bash("ls && rm -rf x"), cwd()));
        assert!(r.matches("Bash", &bash("ls; rm x"), cwd()));
        assert!(r.matches("Bash", &bash("echo $(rm x)"), cwd()));
        assert!(r.matches("Bash", &bash("(rm x)"), cwd()));
        assert!(r.matches("Bash", &bash("FOO=1 rm x"), cwd()));
        assert!(r.matches("Bash", &bash("sudo rm x"), cwd()));
        assert!(!r.matches("Bash", &bash("rmdir x"), cwd()));
        assert!(!r.matches("Bash", &bash("echo rm"), cwd()));
    }

    #[test]
    fn tool_only_rules_and_wildcards() {
        let any = PermissionRule::deny("*", None);
        assert!(any.matches("Write", &json!({}), cwd()));
        let mcp = PermissionRule::allow("mcp__github__*", None);
        assert!(mcp.matches("mcp__github__create_issue", &json!({}), cwd()));
        assert!(!mcp.matches("mcp__gitlab__x", &json!({}), cwd()));
        let read = PermissionRule::allow("Read", None);
        assert!(read.matches("Read", &json!({"file_path": "/anything"}), cwd()));
        assert!(!read.matches("ReadX", &json!({}), cwd()));
    }

    #[test]
    fn path_globs_relative_to_cwd() {
        let r = PermissionRule::allow("Edit", Some("src/**"));
        let p = |s: &str| json!({ "file_path": s });
        assert!(r.matches("Edit", &p("/work/proj/src/main.rs"), cwd()));
        assert!(r.matches("Edit", &p("/work/proj/src/a/b/c.rs"), cwd()));
        assert!(r.matches("Edit", &p("src/lib.rs"), cwd()));
        assert!(!r.matches("Edit", &p("/work/proj/tests/x.rs"), cwd()));
        assert!(!r.matches("Edit", &p("/work/other/src/main.rs"), cwd()));
        // `..` cannot escape the glob.
        assert!(!r.matches("Edit", &p("/work/proj/src/../../other/x"), cwd()));
        assert!(!r.matches("Edit", &p("src/../../proj2/src/x"), cwd()));
        assert!(!r.matches("Edit", &p("/../../etc/passwd"), cwd()));
        // No path in the input: no match.
        assert!(!r.matches("Edit", &json!({"command": "x"}), cwd()));
    }

    #[test]
    fn path_glob_star_question_and_absolute() {
        let r = PermissionRule::deny("Write", Some("*.env"));
        assert!(r.matches("Write", &json!({"file_path": "/work/proj/.env"}), cwd()));
        assert!(r.matches("Write", &json!({"file_path": "/work/proj/prod.env"}), cwd()));
        assert!(!r.matches(
            "Write",
            &json!({"file_path": "/work/proj/cfg/prod.env"}),
            cwd()
        ));
        let r = PermissionRule::deny("Write", Some("**/*.env"));
        assert!(r.matches(
            "Write",
            &json!({"file_path": "/work/proj/cfg/prod.env"}),
            cwd()
        ));
        let r = PermissionRule::allow("Read", Some("/etc/host?"));
        assert!(r.matches("Read", &json!({"file_path": "/etc/hosts"}), cwd()));
        assert!(!r.matches("Read", &json!({"file_path": "/etc/hostname"}), cwd()));
        let r = PermissionRule::allow("NotebookEdit", Some("nb/"));
        assert!(r.matches(
            "NotebookEdit",
            &json!({"notebook_path": "nb/a/x.ipynb"}),
            cwd()
        ));
        let r = PermissionRule::allow("Grep", Some("docs/**"));
        assert!(r.matches(
            "Grep",
            &json!({"pattern": "x", "path": "/work/proj/docs"}),
            cwd()
        ));
    }

    #[test]
    fn segment_glob_backtracks() {
        assert!(segment_match("a*b*c", "aXXbYYc"));
        assert!(segment_match("*", ""));
        assert!(!segment_match("a*b", "aXXc"));
        assert!(segment_match("*.rs", "main.rs"));
        assert!(!segment_match("*.rs", "main.rsx"));
    }

    #[test]
    fn deny_wins_over_allow_regardless_of_order() {
        let rules = [
            PermissionRule::allow("Bash", None),
            PermissionRule::deny("Bash", Some("rm")),
        ];
        let d = evaluate(&rules, "Bash", &bash("rm x"), cwd()).unwrap();
        assert_eq!(d.action, RuleAction::Deny);
        assert_eq!(d.decided_by(), "rule:deny Bash(rm)");
        let d = evaluate(rules.iter().rev(), "Bash", &bash("rm x"), cwd()).unwrap();
        assert_eq!(d.action, RuleAction::Deny);
        let d = evaluate(&rules, "Bash", &bash("ls"), cwd()).unwrap();
        assert_eq!(d.action, RuleAction::Allow);
        assert_eq!(d.decided_by(), "rule:allow Bash");
        assert!(evaluate(&rules, "Write", &json!({}), cwd()).is_none());
        assert!(evaluate(&[], "Bash", &bash("ls"), cwd()).is_none());
    }

    #[test]
    fn parse_rule_specs() {
        let r = PermissionRule::parse(RuleAction::Allow, "Bash(git status)").unwrap();
        assert_eq!(r, PermissionRule::allow("Bash", Some("git status")));
        let r = PermissionRule::parse(RuleAction::Deny, " Write ").unwrap();
        assert_eq!(r, PermissionRule::deny("Write", None));
        assert!(PermissionRule::parse(RuleAction::Deny, "Bash(git").is_err());
        assert!(PermissionRule::parse(RuleAction::Deny, "Bash()").is_err());
        assert!(PermissionRule::parse(RuleAction::Deny, "").is_err());
    }

    fn q(text: &str, labels: &[&str], multi: bool) -> Question {
        Question {
            question: text.into(),
            header: None,
            options: labels
                .iter()
                .map(|l| QuestionOption {
                    label: (*l).into(),
                    ..Default::default()
                })
                .collect(),
            multi_select: multi,
            ..Default::default()
        }
    }

    fn a(text: &str, sel: &[&str]) -> QuestionAnswer {
        QuestionAnswer {
            question: text.into(),
            selected: sel.iter().map(|s| (*s).into()).collect(),
            other_text: None,
        }
    }

    fn other(text: &str, sel: &[&str], free: &str) -> QuestionAnswer {
        QuestionAnswer {
            other_text: Some(free.into()),
            ..a(text, sel)
        }
    }

    #[test]
    fn answers_valid_in_question_order() {
        let qs = [
            q("DB?", &["SQLite", "Postgres"], false),
            q("Langs?", &["Rust", "Go"], true),
        ];
        let out = validate_answers(
            &qs,
            &[a("Langs?", &["Rust", "Go"]), a("DB?", &["SQLite"])],
            false,
        )
        .unwrap();
        assert_eq!(
            out,
            vec![
                ("DB?".to_string(), vec!["SQLite".to_string()]),
                (
                    "Langs?".to_string(),
                    vec!["Rust".to_string(), "Go".to_string()]
                ),
            ]
        );
    }

    #[test]
    fn optional_questions_may_be_left_unanswered_required_ones_may_not() {
        let opt = |text: &str, labels: &[&str]| Question {
            optional: true,
            kind: Some("choice".into()),
            ..q(text, labels, false)
        };
        let form = [
            opt("DB?", &["SQLite", "Postgres"]),
            opt("OS?", &["Linux", "Mac"]),
        ];
        // Missing, or answered with nothing: left unanswered, not in the pairs.
        assert_eq!(
            validate_answers(&form, &[a("OS?", &["Mac"])], false).unwrap(),
            vec![("OS?".to_string(), vec!["Mac".to_string()])]
        );
        assert_eq!(
            validate_answers(&form, &[a("DB?", &[]), other("OS?", &[], " ")], false).unwrap(),
            vec![]
        );
        // What is answered is still checked.
        assert!(validate_answers(&form, &[a("DB?", &["MySQL"])], false).is_err());
        assert!(validate_answers(&form, &[a("Nope?", &[])], false).is_err());
        // A classic question is not optional.
        let classic = [q("DB?", &["SQLite", "Postgres"], false), form[1].clone()];
        let e = validate_answers(&classic, &[a("OS?", &["Mac"])], false).unwrap_err();
        assert!(e.to_string().contains("(\"DB?\") is not answered"), "{e}");
        assert!(validate_answers(&classic, &[a("DB?", &[])], false).is_err());
    }

    #[test]
    fn text_and_number_questions_take_free_text_numbers_in_range() {
        let text = Question {
            question: "Name?".into(),
            kind: Some("text".into()),
            ..Default::default()
        };
        let number = Question {
            question: "Slides?".into(),
            kind: Some("number".into()),
            min: Some(3.0),
            max: Some(20.0),
            ..Default::default()
        };
        let qs = [text, number];
        let out = validate_answers(
            &qs,
            &[other("Name?", &[], "Launch"), other("Slides?", &[], "12.5")],
            false,
        )
        .unwrap();
        assert_eq!(out[0].1, ["Launch"]);
        assert_eq!(out[1].1, ["12.5"]);
        for bad in ["2", "21", "many", "NaN", "inf"] {
            let e = validate_answers(
                &qs,
                &[other("Name?", &[], "Launch"), other("Slides?", &[], bad)],
                false,
            )
            .unwrap_err()
            .to_string();
            assert!(
                e.contains("answers[1].other_text") && e.contains("from 3 to 20"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn answers_rejected_with_the_offending_field() {
        let qs = [
            q("DB?", &["SQLite", "Postgres"], false),
            q("Langs?", &["Rust", "Go"], true),
        ];
        let field = |r: Result<_>| match r {
            Err(Error::InvalidArgument { field, message }) => format!("{field}: {message}"),
            other => panic!("expected InvalidArgument, got {other:?}"),
        };
        // Missing question.
        assert!(
            field(validate_answers(&qs, &[a("DB?", &["SQLite"])], false)).contains("not answered")
        );
        // Unknown question.
        assert!(
            field(validate_answers(
                &qs,
                &[
                    a("DB?", &["SQLite"]),
                    a("Langs?", &["Go"]),
                    a("Other?", &["x"])
                ],
                false
            ))
            .contains("not one of the questions")
        );
        // Duplicate.
        assert!(
            field(validate_answers(
                &qs,
                &[
                    a("DB?", &["SQLite"]),
                    a("DB?", &["SQLite"]),
                    a("Langs?", &["Go"])
                ],
                false
            ))
            .contains("more than once")
        );
        // Multi on single-select.
        let msg = field(validate_answers(
            &qs,
            &[a("DB?", &["SQLite", "Postgres"]), a("Langs?", &["Go"])],
            false,
        ));
        assert!(msg.starts_with("answers[0].selected"), "{msg}");
        // Not an option.
        assert!(
            field(validate_answers(
                &qs,
                &[a("DB?", &["MySQL"]), a("Langs?", &["Go"])],
                false
            ))
            .contains("not an option")
        );
        // Empty.
        assert!(
            field(validate_answers(
                &qs,
                &[a("DB?", &[]), a("Langs?", &["Go"])],
                false
            ))
            .contains("empty")
        );
        // Repeated choice.
        assert!(
            field(validate_answers(
                &qs,
                &[a("DB?", &["SQLite"]), a("Langs?", &["Go", "Go"])],
                false
            ))
            .contains("twice")
        );
    }

    #[test]
    fn free_text_only_when_allowed_or_no_options() {
        let qs = [q("DB?", &["SQLite"], false)];
        // A label that is not an option is never free text.
        assert!(validate_answers(&qs, &[a("DB?", &["MySQL"])], true).is_err());
        assert!(validate_answers(&qs, &[other("DB?", &[], "MySQL")], false).is_err());
        assert_eq!(
            validate_answers(&qs, &[other("DB?", &[], "MySQL")], true).unwrap(),
            vec![("DB?".to_string(), vec!["MySQL".to_string()])]
        );
        // Free text plus a label is two choices: too many for single-select.
        assert!(validate_answers(&qs, &[other("DB?", &["SQLite"], "MySQL")], true).is_err());
        let open = [q("Name?", &[], false)];
        assert!(validate_answers(&open, &[other("Name?", &[], "ostler")], false).is_ok());
        let multi = [q("Langs?", &["Rust"], true)];
        assert_eq!(
            validate_answers(&multi, &[other("Langs?", &["Rust"], "Zig")], true).unwrap(),
            vec![(
                "Langs?".to_string(),
                vec!["Rust".to_string(), "Zig".to_string()]
            )]
        );
        // Blank free text is no answer.
        assert!(validate_answers(&open, &[other("Name?", &[], "  ")], true).is_err());
    }

    #[test]
    fn normalize_path_lexically() {
        assert_eq!(
            normalize_path(Path::new("/a/./b/../c")),
            Some(PathBuf::from("/a/c"))
        );
        assert_eq!(normalize_path(Path::new("/a/../..")), None);
        assert_eq!(normalize_path(Path::new("a/..")), Some(PathBuf::from("")));
    }
}
