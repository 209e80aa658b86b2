//! `cargo xtask contracts record|live` (owned by the test kit work).
//!
//! `record`: for each pinned release (or `--release`), install it into the cache
//! (`$OSTLER_CLAUDE_CACHE` or `target/claude-code`), run each scenario (or `--scenario`)
//! against the fake model server and write `contracts/claude-code/<release>/<scenario>.ndjson`.
//!
//! `live`: run the same and compare the wire shape with the committed recordings.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use ostler_testkit::record as rec;
use ostler_testkit::{contract, releases, scenario};

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
    /// Scenarios to check (default: all).
    #[arg(long = "scenario")]
    pub scenarios: Vec<String>,
}

fn select(
    want_releases: &[String],
    want_scenarios: &[String],
) -> Result<(Vec<String>, Vec<scenario::Scenario>)> {
    let pinned: Vec<String> = releases::pinned()?
        .into_iter()
        .map(|r| r.version)
        .collect();
    let rels = if want_releases.is_empty() {
        pinned
    } else {
        for r in want_releases {
            if !pinned.contains(r) {
                eprintln!("note: release {r} is not pinned in contracts/releases.toml");
            }
        }
        want_releases.to_vec()
    };
    let dir = scenario::scenarios_dir();
    let scens = if want_scenarios.is_empty() {
        scenario::Scenario::load_all(&dir)?
    } else {
        want_scenarios
            .iter()
            .map(|s| scenario::Scenario::load(&dir, s))
            .collect::<Result<Vec<_>, _>>()?
    };
    Ok((rels, scens))
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")
}

pub fn record(a: RecordArgs) -> Result<()> {
    let (rels, scens) = select(&a.releases, &a.scenarios)?;
    let cache = releases::default_cache_dir();
    let rt = runtime()?;
    let mut failed = Vec::new();
    for rel in &rels {
        let t = Instant::now();
        let binary = releases::ensure(rel, &cache).with_context(|| format!("install {rel}"))?;
        eprintln!("{rel}: {} ({:.1?})", binary.display(), t.elapsed());
        for s in &scens {
            let t = Instant::now();
            let opts = rec::RecordOptions::new(rel.clone(), binary.clone());
            match rt.block_on(rec::record(s, &opts)) {
                Ok(rec) => {
                    let path = rec::recording_path(rel, &s.name);
                    rec::write_recording(&path, &rec.text)?;
                    eprintln!(
                        "  {:<18} {:>4} lines {:>9} bytes {:>3} model calls  {:.1?}{}",
                        s.name,
                        rec.text.lines().count(),
                        rec.text.len(),
                        rec.requests.len(),
                        t.elapsed(),
                        if rec.unsupported_flags.is_empty() {
                            String::new()
                        } else {
                            format!("  (unsupported: {})", rec.unsupported_flags.join(" "))
                        }
                    );
                }
                Err(e) => {
                    eprintln!("  {:<18} FAILED: {e}", s.name);
                    failed.push(format!("{rel}/{}", s.name));
                }
            }
        }
    }
    if !failed.is_empty() {
        bail!("failed: {}", failed.join(", "));
    }
    Ok(())
}

pub fn live(a: LiveArgs) -> Result<()> {
    let (rels, scens) = select(&a.releases, &a.scenarios)?;
    let cache = releases::default_cache_dir();
    let rt = runtime()?;
    let mut failed = Vec::new();
    for rel in &rels {
        let binary = releases::ensure(rel, &cache).with_context(|| format!("install {rel}"))?;
        for s in &scens {
            let t = Instant::now();
            match rt.block_on(contract::live_check(rel, &binary, s)) {
                Ok(()) => eprintln!("  {rel} {:<18} ok  {:.1?}", s.name, t.elapsed()),
                Err(e) => {
                    eprintln!("  {rel} {:<18} FAILED: {e}", s.name);
                    failed.push(format!("{rel}/{}", s.name));
                }
            }
        }
    }
    if !failed.is_empty() {
        bail!("wire shape drift: {}", failed.join(", "));
    }
    Ok(())
}
