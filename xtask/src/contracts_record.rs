//! `cargo xtask contracts record|live` (owned by the test kit work).

use anyhow::{Result, bail};

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
    #[arg(long = "release")]
    pub releases: Vec<String>,
}

pub fn record(_a: RecordArgs) -> Result<()> {
    bail!("not yet implemented")
}

pub fn live(_a: LiveArgs) -> Result<()> {
    bail!("not yet implemented")
}
