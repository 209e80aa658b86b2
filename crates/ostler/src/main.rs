//! `ostler`: the daemon and its client commands.
//!
//! Each command lives in its own module; `main` only parses the command line and
//! dispatches.

use anyhow::Result;
use std::io::Write as _;

use clap::{CommandFactory as _, Parser, Subcommand};

/// mimalloc instead of the system allocator: the firehose spent 10-20 % of the daemon's CPU
/// in glibc's malloc/free (more with 16 sessions than with one); with mimalloc it takes
/// 20-30 % less CPU per event, for ~20-30 MB more resident memory (docs/performance.md,
/// session 13).
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
    let cli = Cli::parse();
    match cli.command {
        Command::Decode(args) => decode::run(args),
        Command::Doctor(args) => std::process::exit(doctor::run(args)),
        Command::Serve(args) => std::process::exit(serve::run(args)),
        Command::Client(cmd) => client::main(cmd),
        Command::Completion { shell } => {
            let mut cmd = Cli::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "ostler", &mut script);
            let mut out = std::io::stdout().lock();
            client::render::stdout_written(out.write_all(&script).and_then(|()| out.flush()));
            Ok(())
        }
    }
}
