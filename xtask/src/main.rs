//! `cargo xtask`: all project automation (see `.cargo/config.toml`).
//!
//! Every generated artefact has a `--check` mode that fails on drift.

use anyhow::Result;
use clap::{Parser, Subcommand};

mod contracts_record;
mod goldens;

#[derive(Parser)]
#[command(name = "xtask", about = "ostler project automation")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Contract corpus recorded from real Claude Code releases.
    Contracts {
        #[command(subcommand)]
        cmd: ContractsCmd,
    },
}

#[derive(Subcommand)]
enum ContractsCmd {
    /// Install each pinned release, run every scenario against the fake model server and
    /// write `contracts/claude-code/<release>/<scenario>.ndjson`.
    Record(contracts_record::RecordArgs),
    /// Re-run the scenarios against the installed releases and compare the wire shape with
    /// the recordings.
    Live(contracts_record::LiveArgs),
    /// Rewrite the golden canonical outputs (`--check` fails on drift instead).
    Bless(goldens::BlessArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Contracts { cmd } => match cmd {
            ContractsCmd::Record(a) => contracts_record::record(a),
            ContractsCmd::Live(a) => contracts_record::live(a),
            ContractsCmd::Bless(a) => goldens::bless(a),
        },
    }
}
