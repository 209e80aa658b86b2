//! `cargo xtask contracts record|live` (owned by the test kit work).
//!
//! `record`: for each pinned release (or `--release`), install it into the cache
//! (`$OSTLER_CLAUDE_CACHE` or `target/claude-code`), run each scenario (or `--scenario`)
//! against the fake model server and write `contracts/claude-code/<release>/<scenario>.ndjson`.
//!
//! `live`: run the same and compare the wire shape with the committed recordings.
//!
//! The work is done by `ostler_testkit::corpus`.

use anyhow::{Context, Result, bail};
use ostler_testkit::corpus::{self, Mode};

#[derive(clap::Args)]
pub struct RecordArgs {
    /// Releases to record (default: every pinned release).
    #[arg(long = "release")]
    pub releases: Vec<String>,
    /// Scenarios to record (default: all).
    #[arg(long = "scenario")]
    pub scenarios: Vec<String>,
}

#[derive(clap::Args)]
pub struct LiveArgs {
    /// Releases to check (default: every pinned release).
    #[arg(long = "release")]
    pub releases: Vec<String>,
    /// Scenarios to check (default: all).
    #[arg(long = "scenario")]
    pub scenarios: Vec<String>,
}

fn run(releases: &[String], scenarios: &[String], mode: Mode) -> Result<()> {
    let (rels, scens) = corpus::select(releases, scenarios)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    let outcomes = rt.block_on(corpus::run(&rels, &scens, mode, |o| eprintln!("{o}")))?;
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| o.error.is_some())
        .map(|o| format!("{}/{}", o.release, o.scenario))
        .collect();
    if !failed.is_empty() {
        bail!(
            "{} of {} failed: {}",
            failed.len(),
            outcomes.len(),
            failed.join(", ")
        );
    }
    Ok(())
}

pub fn record(a: RecordArgs) -> Result<()> {
    run(&a.releases, &a.scenarios, Mode::Write)
}

pub fn live(a: LiveArgs) -> Result<()> {
    run(&a.releases, &a.scenarios, Mode::Check)
}
