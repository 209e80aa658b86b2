//! `ostler`: the daemon and its client commands.
//!
//! Each command lives in its own module; `main` only parses the command line and
//! dispatches.

use anyhow::Result;
use std::io::Write as _;

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};

/// mimalloc instead of the system allocator: the firehose spent 10-20 % of the daemon's CPU
/// in glibc's malloc/free (more with 16 sessions than with one); with mimalloc it takes
/// 20-30 % less CPU per event (docs/performance.md, session 13). Built without advising its
/// memory into transparent huge pages (the `no_thp` feature, Cargo.toml): with them, the
/// daemon's resident memory was about twice as large (session 63).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod client;
mod config;
mod decode;
mod doctor;
mod feed_prune;
mod metrics;
mod notify;
mod serve;

const AFTER_HELP: &str = "\
Examples:
  ostler serve                              run the daemon (config: ostler serve --help)
  ostler run \"fix the failing test\"         new session in this directory, stream the turn
  ostler sessions -n 5                      the five newest sessions
  ostler attach @last                       follow the newest session, answer its prompts
  ostler send 3f2a \"now add a test\"         a session by a unique end (or start) of its id
  ostler pending                            every prompt waiting for an answer
  ostler pending show 9c1e                  one prompt in any state: who answered it, when
  ostler approve 9c1e / ostler deny 9c1e -m \"not now\"
  ostler completion bash > ~/.local/share/bash-completion/completions/ostler

Sessions are named by id, a unique suffix or prefix of one, or @last. Every client
command takes --json (one JSON object per line on stdout).

Exit codes:
  0    success
  1    error: the daemon refused, could not connect, or the turn ended in error
  2    bad usage
  3    a permission prompt or question could not be answered (no terminal, no flag)
  130  the turn was interrupted (Ctrl-C, or `ostler interrupt` from anywhere), or detached
  72   (serve, doctor) no usable `claude` binary found
  78   (serve, doctor) configuration error, or `claude` unusable / too old";

/// The top-level help lists the commands in these groups, in this order (kubectl's and
/// gh's grouped help); a command in none of them is listed under "Other commands", and a
/// test keeps every command in exactly one group.
const GROUPS: &[(&str, &[&str])] = &[
    (
        "Sessions",
        &[
            "run",
            "sessions",
            "show",
            "attach",
            "send",
            "interrupt",
            "stop",
            "resume",
            "delete",
            "rename",
            "label",
            "archive",
            "unarchive",
            "watch",
        ],
    ),
    (
        "Waiting for an answer",
        &[
            "pending",
            "approve",
            "deny",
            "answer",
            "hook",
            "tool-result",
            "elicitation",
            "dialog",
        ],
    ),
    (
        "Inside a session",
        &[
            "info",
            "context",
            "mcp",
            "model",
            "mode",
            "thinking",
            "stop-task",
            "rewind",
            "control",
            "debug-log",
        ],
    ),
    ("The daemon", &["serve", "health", "doctor"]),
    ("Other", &["decode", "completion", "help"]),
];

/// The command line's definition, with the top-level help's commands in [`GROUPS`].
fn command() -> clap::Command {
    let cmd = Cli::command();
    let listing = grouped_commands(&cmd);
    cmd.help_template(format!(
        "{{about-with-newline}}\n{{usage-heading}} {{usage}}\n\n{listing}\nOptions:\n{{options}}{{after-help}}"
    ))
}

/// `cmd`'s subcommands under the headings of [`GROUPS`], each with the first line of its
/// description (what clap's own `{subcommands}` would show).
fn grouped_commands(cmd: &clap::Command) -> String {
    let about = |c: &clap::Command| {
        c.get_about()
            .map(|a| a.to_string())
            .unwrap_or_default()
            .lines()
            .next()
            .unwrap_or_default()
            .trim_end_matches('.')
            .to_owned()
    };
    let mut all: Vec<(String, String)> = cmd
        .get_subcommands()
        .map(|c| (c.get_name().to_owned(), about(c)))
        .collect();
    if !all.iter().any(|(n, _)| n == "help") {
        all.push((
            "help".into(),
            "Print this message or the help of the given subcommand(s)".into(),
        ));
    }
    let width = all.iter().map(|(n, _)| n.len()).max().unwrap_or(0) + 2;
    let grouped: Vec<&str> = GROUPS
        .iter()
        .flat_map(|(_, names)| names.iter().copied())
        .collect();
    let others: Vec<&str> = all
        .iter()
        .map(|(n, _)| n.as_str())
        .filter(|n| !grouped.contains(n))
        .collect();
    let mut out = String::new();
    let sections = GROUPS
        .iter()
        .map(|(h, names)| (*h, names.to_vec()))
        .chain((!others.is_empty()).then(|| ("Other commands", others.clone())));
    for (heading, names) in sections {
        let rows: Vec<&(String, String)> = names
            .iter()
            .filter_map(|n| all.iter().find(|(name, _)| name == n))
            .collect();
        if rows.is_empty() {
            continue;
        }
        out.push_str(heading);
        out.push_str(":\n");
        for (name, about) in rows {
            out.push_str(&format!("  {name:width$}{about}\n"));
        }
        out.push('\n');
    }
    out.pop();
    out
}

#[derive(Parser)]
#[command(
    name = "ostler",
    version,
    about = "Keeps Claude Code sessions alive and drives them remotely",
    after_help = AFTER_HELP
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the canonical events of a Claude Code NDJSON stream (or a contract recording).
    Decode(decode::DecodeArgs),
    /// Check the Claude Code installation the daemon would use (exit 72 / 78 like the daemon).
    Doctor(doctor::DoctorArgs),
    /// Run the daemon: serve the gRPC API until SIGINT/SIGTERM.
    Serve(serve::ServeArgs),
    #[command(flatten)]
    Client(client::ClientCommand),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) on stdout.
    Completion {
        /// The shell
        shell: clap_complete::Shell,
    },
}

fn main() -> Result<()> {
    let cli = match Cli::from_arg_matches(&command().get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match cli.command {
        Command::Decode(args) => decode::run(args),
        Command::Doctor(args) => std::process::exit(doctor::run(args)),
        Command::Serve(args) => std::process::exit(serve::run(args)),
        Command::Client(cmd) => client::main(cmd),
        Command::Completion { shell } => {
            let mut cmd = command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "ostler", &mut script);
            let mut out = std::io::stdout().lock();
            client::render::stdout_written(out.write_all(&script).and_then(|()| out.flush()));
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_is_in_exactly_one_help_group() {
        let cmd = Cli::command();
        let mut names: Vec<String> = cmd
            .get_subcommands()
            .map(|c| c.get_name().to_owned())
            .collect();
        names.push("help".into());
        for name in &names {
            let groups: Vec<&str> = GROUPS
                .iter()
                .filter(|(_, members)| members.contains(&name.as_str()))
                .map(|(h, _)| *h)
                .collect();
            assert_eq!(groups.len(), 1, "{name} is in {groups:?}");
        }
        for (heading, members) in GROUPS {
            for m in *members {
                assert!(
                    names.iter().any(|n| n == m),
                    "{heading} names {m}, no such command"
                );
            }
        }
        let help = grouped_commands(&cmd);
        assert!(!help.contains("Other commands"), "{help}");
    }
}
