//! The recorded corpus (`contracts/claude-code/<release>/*.ndjson`) as the data-driven
//! tests of this crate read it: which releases are recorded, their recordings, and the
//! CLI's lines of one recording.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};

use bytes::Bytes;
use ostler_protocol::recording::{Dir, Entry, parse_entry, parse_header};

pub fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contracts/claude-code")
}

/// The recorded releases, oldest first: the pinned releases that run sessions
/// (`contracts/releases.toml`, read by the test kit as `cargo xtask contracts record`
/// reads it), each of which must have its recordings in the corpus.
pub fn releases() -> Vec<String> {
    let mut r: Vec<(semver::Version, String)> = ostler_testkit::releases::session_releases()
        .unwrap()
        .into_iter()
        .map(|r| (semver::Version::parse(&r.version).unwrap(), r.version))
        .collect();
    r.sort();
    let r: Vec<String> = r.into_iter().map(|(_, v)| v).collect();
    for release in &r {
        assert!(
            !recordings(release).is_empty(),
            "no recording for the pinned release {release} under {} (run `cargo xtask \
             contracts record`)",
            corpus_dir().display()
        );
    }
    r
}

/// The recordings (`*.ndjson`) of `release`, sorted; none when it has no directory.
pub fn recordings(release: &str) -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir(corpus_dir().join(release)) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = dir
        .flatten()
        .map(|f| f.path())
        .filter(|p| p.extension().is_some_and(|e| e == "ndjson"))
        .collect();
    files.sort();
    files
}

/// The CLI's lines of one recording, whose header must name the release of its
/// directory.
pub fn cli_lines(path: &Path) -> Vec<Bytes> {
    let bytes = Bytes::from(std::fs::read(path).unwrap());
    let mut lines = bytes.split(|b| *b == b'\n');
    let header = parse_header(lines.next().unwrap()).unwrap();
    let dir = path
        .parent()
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy());
    assert_eq!(
        header.release.as_deref(),
        dir.as_deref(),
        "{}",
        path.display()
    );
    lines
        .filter(|l| !l.is_empty())
        .filter_map(|l| match parse_entry(&bytes.slice_ref(l)) {
            Entry::Line {
                dir: Dir::Cli,
                line,
            } => Some(line),
            _ => None,
        })
        .collect()
}
