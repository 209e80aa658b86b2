//! Contract tests over the recorded corpus `contracts/claude-code/<release>/*.ndjson`:
//! every recording decodes through the adapter of its release with zero parse failures,
//! zero Unknown for claimed types and only expected absent fields, and its canonical
//! output matches the committed golden (`cargo xtask contracts bless` rewrites them).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
use crate::common;

use std::path::PathBuf;

use common::corpus_dir;
use ostler_protocol::contract::{check_recording, golden_name};
use ostler_protocol::transcript::{decode_all, render};

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

/// Every pinned release that runs sessions (`contracts/releases.toml`) has recordings, and
/// every recorded directory is such a release.
#[test]
fn corpus_exists_for_every_pinned_release() {
    let pinned = common::releases();
    assert!(pinned.len() >= 5, "{pinned:?}");
    let mut recorded: Vec<String> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .flatten()
        .filter(|d| d.path().is_dir())
        .map(|d| d.file_name().to_string_lossy().into_owned())
        .collect();
    recorded.retain(|r| !pinned.contains(r));
    assert!(
        recorded.is_empty(),
        "recorded but not a pinned session release: {recorded:?}"
    );
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

/// What `cargo xtask contracts bless --check` checks (the test command runs this test
/// instead): every recording's golden exists and matches, and every golden has a recording.
#[test]
fn every_recording_matches_its_golden() {
    let mut drift = Vec::new();
    let recs = recordings();
    for rel in std::fs::read_dir(corpus_dir()).unwrap().flatten() {
        for f in std::fs::read_dir(rel.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = f.file_name().to_string_lossy().into_owned();
            let Some(stem) = name.strip_suffix(".golden.jsonl") else {
                continue;
            };
            if !recs.contains(&f.path().with_file_name(format!("{stem}.ndjson"))) {
                drift.push(format!("{} (no recording)", f.path().display()));
            }
        }
    }
    for path in recs {
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

/// What the engine's answer inference (`ostler-engine`, `actor/owed.rs`) relies on, on
/// every recorded release: a slash command queued behind a running turn gets a result of
/// its own, after the running turn's. A release whose results do not name the messages
/// they answered does not echo the slash command (`--replay-user-messages`), so a result
/// with no echo before it answers the oldest message still owed.
#[test]
fn a_queued_slash_command_gets_a_result_of_its_own_echoed_only_where_named() {
    use serde_json::Value;
    let mut checked = 0;
    for path in recordings().into_iter().filter(|p| {
        p.file_name()
            .is_some_and(|n| n == "queued_slash_command.ndjson")
    }) {
        let text = std::fs::read_to_string(&path).unwrap();
        let mut slash: Option<String> = None;
        let mut results: Vec<Value> = Vec::new();
        let mut echoed = false;
        for line in text.lines().skip(1) {
            let envelope: Value = serde_json::from_str(line).unwrap();
            let Some(m) = envelope.get("line") else {
                continue;
            };
            let uuid = m.get("uuid").and_then(Value::as_str);
            match envelope["dir"].as_str() {
                Some("ostler") if m["message"]["content"] == "/foo" => {
                    slash = uuid.map(str::to_owned);
                }
                Some("cli") if m["type"] == "result" => results.push(m.clone()),
                Some("cli") if m["type"] == "user" && uuid.is_some() => {
                    echoed |= uuid == slash.as_deref();
                }
                _ => {}
            }
        }
        let p = path.display();
        let slash = slash.unwrap_or_else(|| panic!("{p}: no slash command written"));
        assert_eq!(results.len(), 2, "{p}: a result each");
        match results[1]
            .get("user_message_uuids")
            .and_then(Value::as_array)
        {
            Some(named) => assert!(
                named.iter().any(|id| id == slash.as_str()),
                "{p}: the second result names {named:?}, not the slash command"
            ),
            None => assert!(!echoed, "{p}: the slash command was echoed"),
        }
        checked += 1;
    }
    assert!(
        checked >= 13,
        "recordings of queued_slash_command: {checked}"
    );
}
