//! `cargo run -p ostler-testkit --example record_corpus -- [record|live] [--release V]... [--scenario S]...`
//! Same as `cargo xtask contracts record|live`, without building the rest of the workspace.
#![allow(clippy::disallowed_methods)] // test support

use ostler_testkit::corpus::{self, Mode};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mode = match args.next().as_deref() {
        Some("live") => Mode::Check,
        Some("record") | None => Mode::Write,
        Some(other) => return Err(format!("unknown mode {other}").into()),
    };
    let (mut rels, mut scens) = (Vec::new(), Vec::new());
    while let Some(a) = args.next() {
        match a.as_str() {
            "--release" => rels.extend(args.next()),
            "--scenario" => scens.extend(args.next()),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let (rels, scens) = corpus::select(&rels, &scens)?;
    let outcomes = corpus::run(&rels, &scens, mode, |o| eprintln!("{o}")).await?;
    let failed: Vec<_> = outcomes.iter().filter(|o| o.error.is_some()).collect();
    if !failed.is_empty() {
        return Err(format!("{} of {} failed", failed.len(), outcomes.len()).into());
    }
    Ok(())
}
