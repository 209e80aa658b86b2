//! `cargo xtask contracts bless [--check]` (owned by the protocol work).
//!
//! For each recording `contracts/claude-code/<release>/<scenario>.ndjson`, writes the
//! canonical output (the JSON lines `ostler decode` prints) to
//! `<scenario>.golden.jsonl` next to it. `--check` rewrites nothing and fails listing
//! the goldens that drifted, are missing, or have no recording any more.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use ostler_protocol::contract::{check_recording, golden_name};
use ostler_protocol::transcript::{decode_all, render};

#[derive(clap::Args)]
pub struct BlessArgs {
    /// Fail if a golden file would change instead of rewriting it.
    #[arg(long)]
    pub check: bool,
    /// Corpus directory (default: `contracts/claude-code` in the workspace).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

fn default_dir() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../contracts/claude-code");
    p.canonicalize().unwrap_or(p)
}

/// `(recordings, goldens)` under the corpus directory, sorted.
fn walk(dir: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let mut recs = Vec::new();
    let mut goldens = Vec::new();
    let releases = std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
    for rel in releases {
        let rel = rel?.path();
        if !rel.is_dir() {
            continue;
        }
        for f in std::fs::read_dir(&rel)? {
            let p = f?.path();
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            match name {
                Some(n) if n.ends_with(".golden.jsonl") => goldens.push(p),
                Some(n) if n.ends_with(".ndjson") => recs.push(p),
                _ => {}
            }
        }
    }
    recs.sort();
    goldens.sort();
    Ok((recs, goldens))
}

pub fn bless(a: BlessArgs) -> Result<()> {
    let dir = a.dir.unwrap_or_else(default_dir);
    let (recs, goldens) = walk(&dir)?;
    if recs.is_empty() {
        bail!("no recordings under {}", dir.display());
    }
    let mut drift = Vec::new();
    let mut written = 0usize;
    let mut expected_goldens = Vec::new();
    for rec in &recs {
        let bytes = std::fs::read(rec).with_context(|| format!("reading {}", rec.display()))?;
        let report = check_recording(&bytes);
        for v in &report.violations {
            eprintln!("warning: {}: {v}", rec.display());
        }
        let (outputs, _) = decode_all(&bytes, None);
        let rendered = render(&outputs);
        let name = rec
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let golden = rec.with_file_name(golden_name(&name));
        expected_goldens.push(golden.clone());
        let current = std::fs::read_to_string(&golden).ok();
        if current.as_deref() == Some(rendered.as_str()) {
            continue;
        }
        if a.check {
            let why = if current.is_some() {
                "drifted"
            } else {
                "missing"
            };
            drift.push(format!("{} ({why})", golden.display()));
        } else {
            std::fs::write(&golden, rendered)
                .with_context(|| format!("writing {}", golden.display()))?;
            written += 1;
        }
    }
    let stale: Vec<_> = goldens
        .iter()
        .filter(|g| !expected_goldens.contains(g))
        .collect();
    for g in &stale {
        if a.check {
            drift.push(format!("{} (no recording)", g.display()));
        } else {
            eprintln!("warning: {} has no recording; remove it", g.display());
        }
    }
    if a.check {
        if !drift.is_empty() {
            bail!(
                "{} golden file(s) out of date (run `cargo xtask contracts bless`):\n{}",
                drift.len(),
                drift.join("\n")
            );
        }
        println!("{} golden file(s) up to date", recs.len());
    } else {
        println!(
            "{} recording(s), {written} golden file(s) written",
            recs.len()
        );
    }
    Ok(())
}
