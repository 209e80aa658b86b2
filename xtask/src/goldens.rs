//! `cargo xtask contracts bless [--check]` (owned by the protocol work).

use anyhow::{Result, bail};

#[derive(clap::Args)]
pub struct BlessArgs {
    /// Fail if a golden file would change instead of rewriting it.
    #[arg(long)]
    pub check: bool,
}

pub fn bless(_a: BlessArgs) -> Result<()> {
    bail!("not yet implemented")
}
