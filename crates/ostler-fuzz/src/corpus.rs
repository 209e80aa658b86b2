//! The seed corpus: the CLI's stdout lines from the contract recordings
//! (`contracts/claude-code/<release>/<scenario>.ndjson`), loaded once.

use std::path::PathBuf;
use std::sync::OnceLock;

use bytes::Bytes;
use ostler_protocol::recording::{self, Dir, Entry};

/// One recording: its release and what the CLI wrote to stdout, line by line.
#[derive(Debug)]
pub struct Recording {
    pub release: Option<semver::Version>,
    pub lines: Vec<Bytes>,
}

/// `OSTLER_FUZZ_CORPUS`, else the repository's `contracts/claude-code`.
pub fn dir() -> PathBuf {
    match std::env::var_os("OSTLER_FUZZ_CORPUS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../contracts/claude-code"),
    }
}

/// All recordings with at least one CLI line (never empty: a tiny built-in one stands in
/// when the corpus is missing).
pub fn recordings() -> &'static [Recording] {
    static ALL: OnceLock<Vec<Recording>> = OnceLock::new();
    ALL.get_or_init(load)
}

/// The releases of the corpus plus ones outside every adapter's range, and `None`.
pub fn releases() -> &'static [Option<semver::Version>] {
    static ALL: OnceLock<Vec<Option<semver::Version>>> = OnceLock::new();
    ALL.get_or_init(|| {
        let mut out: Vec<Option<semver::Version>> = vec![
            None,
            Some(semver::Version::new(0, 2, 9)),
            Some(semver::Version::new(99, 0, 0)),
        ];
        for r in recordings() {
            if !out.contains(&r.release) {
                out.push(r.release.clone());
            }
        }
        out
    })
}

/// One release per adapter (and the tolerant fallbacks): decoding with each of these
/// exercises every adapter.
pub fn adapter_releases() -> &'static [Option<semver::Version>] {
    static ALL: OnceLock<Vec<Option<semver::Version>>> = OnceLock::new();
    ALL.get_or_init(|| {
        let mut seen: Vec<(&'static str, bool)> = Vec::new();
        let mut out = Vec::new();
        for r in releases() {
            let sel = ostler_protocol::adapter::selection(r.as_ref());
            let key = (sel.adapter.name, sel.tolerant);
            if !seen.contains(&key) {
                seen.push(key);
                out.push(r.clone());
            }
        }
        out
    })
}

fn load() -> Vec<Recording> {
    let mut files = Vec::new();
    if let Ok(releases) = std::fs::read_dir(dir()) {
        for rel in releases.flatten() {
            if let Ok(entries) = std::fs::read_dir(rel.path()) {
                for e in entries.flatten() {
                    let p = e.path();
                    if p.extension().is_some_and(|x| x == "ndjson") {
                        files.push(p);
                    }
                }
            }
        }
    }
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let Ok(data) = std::fs::read(&f) else {
            continue;
        };
        let data = Bytes::from(data);
        let mut release = None;
        let mut lines = Vec::new();
        for (i, line) in data.split(|b| *b == b'\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            let line = data.slice_ref(line);
            if i == 0 {
                release = recording::parse_header(&line).and_then(|h| h.release_version());
                continue;
            }
            match recording::parse_entry(&line) {
                Entry::Line {
                    dir: Dir::Cli,
                    line,
                }
                | Entry::Text {
                    dir: Dir::Cli,
                    text: line,
                } => lines.push(line),
                _ => {}
            }
        }
        if !lines.is_empty() {
            out.push(Recording { release, lines });
        }
    }
    if out.is_empty() {
        out.push(Recording {
            release: None,
            lines: vec![Bytes::from_static(
                br#"{"type":"system","subtype":"init","session_id":"s","tools":[],"model":"m"}"#,
            )],
        });
    }
    out
}
