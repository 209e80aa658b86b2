//! Contract tests over the recorded corpus `contracts/claude-code/<release>/*.ndjson`:
//! every recording decodes through the adapter of its release with zero parse failures,
//! zero Unknown for claimed types and only expected absent fields, and its canonical
//! output matches the committed golden (`cargo xtask contracts bless` rewrites them).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
use std::path::{Path, PathBuf};

use ostler_protocol::contract::{check_recording, golden_name};
use ostler_protocol::transcript::{decode_all, render};

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contracts/claude-code")
}

fn recordings() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(releases) = std::fs::read_dir(corpus_dir()) else {
        return out;
    };
    for rel in releases.flatten() {
        let Ok(files) = std::fs::read_dir(rel.path()) else {
            continue;
        };
        for f in files.flatten() {
            let p = f.path();
            if p.extension().is_some_and(|e| e == "ndjson") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn corpus_exists_for_every_pinned_release() {
    let recs = recordings();
    assert!(
        !recs.is_empty(),
        "no recordings under {} (run `cargo xtask contracts record`)",
        corpus_dir().display()
    );
    for release in ["1.0.128", "2.0.77", "2.1.0", "2.1.330"] {
        assert!(
            recs.iter().any(|p| p
                .parent()
                .and_then(|d| d.file_name())
                .is_some_and(|n| n == release)),
            "no recording for release {release}"
        );
    }
}

#[test]
fn every_recording_honours_the_contract() {
    let mut failures = Vec::new();
    for path in recordings() {
        let bytes = std::fs::read(&path).unwrap();
        let report = check_recording(&bytes);
        assert!(
            report.cli_lines > 0 || !report.ok(),
            "{}: no CLI lines",
            path.display()
        );
        for v in report.violations {
            failures.push(format!("{}: {v}", path.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "contract violations:\n{}",
        failures.join("\n")
    );
}

#[test]
fn every_recording_matches_its_golden() {
    let mut drift = Vec::new();
    for path in recordings() {
        let bytes = std::fs::read(&path).unwrap();
        let (outputs, _) = decode_all(&bytes, None);
        let rendered = render(&outputs);
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let golden = path.with_file_name(golden_name(&name));
        match std::fs::read_to_string(&golden) {
            Ok(g) if g == rendered => {}
            Ok(_) => drift.push(format!("{} (differs)", golden.display())),
            Err(_) => drift.push(format!("{} (missing)", golden.display())),
        }
    }
    assert!(
        drift.is_empty(),
        "golden drift (run `cargo xtask contracts bless` and review the diff):\n{}",
        drift.join("\n")
    );
}

/// Every canonical event of the corpus reads back from its JSON (the store keeps events as
/// JSON and the daemon replays them) and re-encodes to the same text.
#[test]
fn every_event_of_the_corpus_round_trips() {
    use ostler_protocol::Event;
    use ostler_protocol::transcript::Output;
    let mut n = 0;
    for path in recordings() {
        let bytes = std::fs::read(&path).unwrap();
        let (outputs, _) = decode_all(&bytes, None);
        for o in outputs {
            let Output::Event(e) = o else { continue };
            let text = serde_json::to_string(&e).unwrap();
            let back: Event = serde_json::from_str(&text)
                .unwrap_or_else(|err| panic!("{}: {err}: {text}", path.display()));
            assert_eq!(back, e, "{}", path.display());
            assert_eq!(serde_json::to_string(&back).unwrap(), text);
            n += 1;
        }
    }
    assert!(n > 0);
}
