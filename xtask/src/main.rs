//! `cargo xtask`: all project automation (see `.cargo/config.toml`).
//!
//! Every generated artefact has a `--check` mode that fails on drift.

#![allow(clippy::disallowed_methods)] // xtask runs cargo, npm and the test suite

use anyhow::Result;
use clap::{Parser, Subcommand};

mod bench;
mod chaos;
mod compat;
mod contracts_record;
mod dev;
mod features;
mod fuzz;
mod goldens;
mod pgo;

#[derive(Parser)]
#[command(name = "xtask", about = "ostler project automation")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the whole test suite as CI does (installs the pinned CLI releases first).
    Test(dev::TestArgs),
    /// Fault injection against the real daemon with the fake CLI (kill -9 mid-turn, CLI
    /// kill, reconnect storm, stuck and slow subscribers, storage faults).
    Chaos(chaos::ChaosArgs),
    /// Time-bounded property fuzzing (framer/decoder, stored codec, rules, gRPC requests,
    /// GetInteraction lookups).
    Fuzz(fuzz::FuzzArgs),
    /// Install the newest pinned Claude Code release and run the daemon with it.
    Daemon(dev::DaemonArgs),
    /// End-to-end benchmarks (daemon + fake CLI + tonic client, ratios to same-run
    /// baselines), then the crates' criterion benches (docs/performance.md).
    Bench(bench::BenchArgs),
    /// A profile-guided release build of the daemon (instrumented build, a training run of
    /// the benchmark harness, llvm-profdata, optimized build); prints the binary's path.
    Pgo(pgo::PgoArgs),
    /// The Claude Code compatibility matrix (measured evidence -> embedded matrix + docs).
    Compat {
        #[command(subcommand)]
        cmd: CompatCmd,
    },
    /// Contract corpus recorded from real Claude Code releases.
    Contracts {
        #[command(subcommand)]
        cmd: ContractsCmd,
    },
    /// The test kit's stdio MCP server (`ostler_testkit::mcp_server`) on stdin/stdout, for
    /// the compat probe's elicitation run.
    #[command(name = compat::TEST_MCP_COMMAND, hide = true)]
    TestMcp,
}

#[derive(Subcommand)]
enum CompatCmd {
    /// Measure releases (stdio permission protocol, flags, announced capabilities) and
    /// write `contracts/compat/<release>.toml`.
    Probe(compat::ProbeArgs),
    /// Generate the embedded matrix and docs/compatibility.md (`--check`: fail on drift).
    Generate(compat::GenerateArgs),
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
        Cmd::Test(a) => dev::test(a),
        Cmd::Daemon(a) => dev::daemon(a),
        Cmd::Bench(a) => bench::bench(a),
        Cmd::Pgo(a) => pgo::pgo(a),
        Cmd::Fuzz(a) => fuzz::fuzz(a),
        Cmd::Chaos(a) => chaos::chaos(a),
        Cmd::Compat { cmd } => match cmd {
            CompatCmd::Probe(a) => compat::probe(a),
            CompatCmd::Generate(a) => compat::generate(a),
        },
        Cmd::Contracts { cmd } => match cmd {
            ContractsCmd::Record(a) => contracts_record::record(a),
            ContractsCmd::Live(a) => contracts_record::live(a),
            ContractsCmd::Bless(a) => goldens::bless(a),
        },
        Cmd::TestMcp => Ok(ostler_testkit::mcp_server::run()?),
    }
}
