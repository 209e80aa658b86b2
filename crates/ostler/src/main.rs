//! `ostler`: the daemon and its client commands.
//!
//! Each command lives in its own module; `main` only parses the command line and
//! dispatches.

use anyhow::Result;
use clap::{Parser, Subcommand};

mod decode;

#[derive(Parser)]
#[command(
    name = "ostler",
    version,
    about = "Keeps Claude Code sessions alive and drives them remotely"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the canonical events of a Claude Code NDJSON stream (or a contract recording).
    Decode(decode::DecodeArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Decode(args) => decode::run(args),
    }
}
