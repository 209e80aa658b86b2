//! Recording and checking the whole corpus (used by `cargo xtask contracts record|live`,
//! the `record_corpus` example and the live contract test).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::record::{self, RecordOptions, recording_path, write_recording};
use crate::scenario::{Scenario, scenarios_dir};
use crate::{Result, contract, releases};

/// Pinned releases that run sessions (or `want`, when not empty) and all scenarios (or
/// `want_scenarios`).
pub fn select(want: &[String], want_scenarios: &[String]) -> Result<(Vec<String>, Vec<Scenario>)> {
    let rels = if want.is_empty() {
        releases::session_releases()?
            .into_iter()
            .map(|r| r.version)
            .collect()
    } else {
        want.to_vec()
    };
    let dir = scenarios_dir();
    let scens = if want_scenarios.is_empty() {
        Scenario::load_all(&dir)?
    } else {
        want_scenarios
            .iter()
            .map(|s| Scenario::load(&dir, s))
            .collect::<Result<Vec<_>>>()?
    };
    Ok((rels, scens))
}

/// Outcome of one release × scenario.
#[derive(Debug)]
pub struct Outcome {
    pub release: String,
    pub scenario: String,
    pub elapsed: Duration,
    /// Recording path written (record mode).
    pub path: Option<PathBuf>,
    pub lines: usize,
    pub bytes: usize,
    pub model_calls: usize,
    pub unsupported_flags: Vec<String>,
    pub error: Option<String>,
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:<8} {:<18} {:>5.1}s",
            self.release,
            self.scenario,
            self.elapsed.as_secs_f64()
        )?;
        match &self.error {
            Some(e) => write!(f, "  FAILED: {e}"),
            None => {
                write!(
                    f,
                    "  ok {:>4} lines {:>9} bytes {:>2} model calls",
                    self.lines, self.bytes, self.model_calls
                )?;
                if !self.unsupported_flags.is_empty() {
                    write!(f, "  (unsupported: {})", self.unsupported_flags.join(" "))?;
                }
                Ok(())
            }
        }
    }
}

/// Install (if needed) and record each release × scenario; with `write`, store the
/// recordings; with `check`, compare the shape with the committed recording instead.
pub async fn run(
    rels: &[String],
    scens: &[Scenario],
    mode: Mode,
    mut on_outcome: impl FnMut(&Outcome),
) -> Result<Vec<Outcome>> {
    let cache = releases::default_cache_dir();
    let mut out = Vec::new();
    for rel in rels {
        let r = rel.clone();
        let c = cache.clone();
        let binary = tokio::task::spawn_blocking(move || releases::ensure(&r, &c))
            .await
            .map_err(|e| crate::Error::Cli(format!("join: {e}")))??;
        for s in scens.iter().filter(|s| s.applies_to(rel)) {
            let t = Instant::now();
            let opts = RecordOptions::new(rel.clone(), binary.clone());
            let mut o = Outcome {
                release: rel.clone(),
                scenario: s.name.clone(),
                elapsed: Duration::ZERO,
                path: None,
                lines: 0,
                bytes: 0,
                model_calls: 0,
                unsupported_flags: Vec::new(),
                error: None,
            };
            match record::record(s, &opts).await {
                Ok(rec) => {
                    o.lines = rec.text.lines().count();
                    o.bytes = rec.text.len();
                    o.model_calls = rec.requests.len();
                    o.unsupported_flags = rec.unsupported_flags.clone();
                    let path = recording_path(rel, &s.name);
                    match mode {
                        Mode::Write => {
                            if let Err(e) = write_recording(&path, &rec.text) {
                                o.error = Some(e.to_string());
                            }
                            o.path = Some(path);
                        }
                        Mode::Check => match std::fs::read_to_string(&path) {
                            Ok(recorded) => {
                                if let Err(e) = contract::compare(
                                    &format!("{rel}/{}", s.name),
                                    &recorded,
                                    &rec.text,
                                ) {
                                    o.error = Some(e.to_string());
                                }
                            }
                            Err(e) => {
                                o.error = Some(format!("{}: {e}", path.display()));
                            }
                        },
                    }
                }
                Err(e) => o.error = Some(e.to_string()),
            }
            o.elapsed = t.elapsed();
            on_outcome(&o);
            out.push(o);
        }
    }
    Ok(out)
}

/// What [`run`] does with a fresh recording.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Write it to `contracts/claude-code/<release>/<scenario>.ndjson`.
    Write,
    /// Compare its shape with the committed recording.
    Check,
}
