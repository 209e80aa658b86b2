//! `ostler`: the daemon and its client commands.
//!
//! Each command lives in its own module; `main` only parses the command line and
//! dispatches.

use anyhow::Result;
use clap::{Parser, Subcommand};

mod client;
mod config;
mod decode;
mod doctor;
mod serve;

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
    /// Check the Claude Code installation the daemon would use (exit 72 / 78 like the daemon).
    Doctor(doctor::DoctorArgs),
    /// Run the daemon: serve the gRPC API until SIGINT/SIGTERM.
    Serve(serve::ServeArgs),
    #[command(flatten)]
    Client(client::ClientCommand),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Decode(args) => decode::run(args),
        Command::Doctor(args) => std::process::exit(doctor::run(args)),
        Command::Serve(args) => std::process::exit(serve::run(args)),
        Command::Client(cmd) => client::main(cmd),
    }
}
