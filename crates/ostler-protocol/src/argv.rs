//! The stream-json command line of the `claude` CLI, written in one place.
//!
//! Every stream-json invocation (a session, the flag probe, the contract recorder, the
//! compatibility probe) starts with `-p --input-format stream-json --output-format
//! stream-json --verbose`; sessions add `--permission-prompt-tool stdio` and their options.
//! No prompt is ever put on the command line: the first message goes through stdin.
//!
//! [`StreamJsonArgs`] only writes flags; which flags a release supports and whether a value
//! is acceptable is decided by the caller.

/// `--include-partial-messages`: token-level `stream_event` lines.
pub const INCLUDE_PARTIAL_MESSAGES: &str = "--include-partial-messages";
/// `--fork-session`: resume into a new CLI session id.
pub const FORK_SESSION: &str = "--fork-session";
/// Cut the resumed conversation after a transcript entry (with `--resume`).
pub const RESUME_SESSION_AT: &str = "--resume-session-at";
/// With `--resume-session-at`: the prompt uuid of the one turn the cut may drop; the CLI
/// refuses the resume when anything else lies past the cut.
pub const RESUME_DROPS_TURN: &str = "--resume-drops-turn";
/// `--permission-prompt-tool`: where permission prompts go (`stdio`: `can_use_tool`).
pub const PERMISSION_PROMPT_TOOL: &str = "--permission-prompt-tool";
/// `--max-turns`.
pub const MAX_TURNS: &str = "--max-turns";

/// The options every stream-json invocation starts with.
pub const BASE: [&str; 6] = [
    "-p",
    "--input-format",
    "stream-json",
    "--output-format",
    "stream-json",
    "--verbose",
];

/// Builds a stream-json argument list (without the program).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamJsonArgs {
    args: Vec<String>,
}

impl StreamJsonArgs {
    /// [`BASE`] only (what the flag probe starts from).
    pub fn base() -> Self {
        Self {
            args: BASE.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    /// [`BASE`] plus `--permission-prompt-tool stdio`: how sessions run.
    pub fn session() -> Self {
        let mut a = Self::base();
        a.option(PERMISSION_PROMPT_TOOL, "stdio");
        a
    }

    /// Appends a flag without a value.
    pub fn flag(&mut self, flag: &str) -> &mut Self {
        self.args.push(flag.to_owned());
        self
    }

    /// Appends `name value`.
    pub fn option(&mut self, name: &str, value: impl Into<String>) -> &mut Self {
        self.args.push(name.to_owned());
        self.args.push(value.into());
        self
    }

    /// Appends `name value`, when there is a value.
    pub fn option_if(&mut self, name: &str, value: Option<&str>) -> &mut Self {
        if let Some(v) = value {
            self.option(name, v);
        }
        self
    }

    /// Appends a variadic flag and its values (`--allowedTools A B`); nothing when `values`
    /// is empty. Variadic flags take every value up to the next option, so they go after
    /// every other option with a value.
    pub fn values(&mut self, flag: &str, values: &[String]) -> &mut Self {
        if !values.is_empty() {
            self.args.push(flag.to_owned());
            self.args.extend(values.iter().cloned());
        }
        self
    }

    /// The arguments so far.
    pub fn as_slice(&self) -> &[String] {
        &self.args
    }

    /// The argument list.
    pub fn into_args(self) -> Vec<String> {
        self.args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_args_start_with_the_base_and_stdio_prompts() {
        let mut a = StreamJsonArgs::session();
        a.flag(INCLUDE_PARTIAL_MESSAGES)
            .option("--model", "sonnet")
            .option_if("--permission-mode", None)
            .option_if("--resume", Some("abc"))
            .values("--allowedTools", &["Read".into(), "Bash(ls:*)".into()])
            .values("--disallowedTools", &[]);
        assert_eq!(
            a.into_args().join(" "),
            "-p --input-format stream-json --output-format stream-json --verbose \
             --permission-prompt-tool stdio --include-partial-messages --model sonnet \
             --resume abc --allowedTools Read Bash(ls:*)"
        );
    }

    #[test]
    fn base_has_no_permission_prompt_tool() {
        let a = StreamJsonArgs::base();
        assert_eq!(a.as_slice(), BASE);
        assert!(!a.as_slice().iter().any(|s| s == PERMISSION_PROMPT_TOOL));
    }
}
