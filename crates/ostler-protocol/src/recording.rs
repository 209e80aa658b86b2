//! Reader for contract recordings (pure: bytes in).
//!
//! A recording is NDJSON: a header line
//! `{"ostler_recording":1,"release":"2.1.330","scenario":"tool_allowed",...}`, then one
//! envelope per line: `{"dir":"cli","line":<JSON line the CLI emitted>}`,
//! `{"dir":"ostler","line":<JSON we wrote to stdin>}` or
//! `{"dir":"cli","text":"<non-JSON stdout line>"}`.

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::model::RawJson;
use crate::wire::{LNum, LStr};

/// The first line of a recording.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordingHeader {
    /// The `ostler_recording` format version.
    pub format: u64,
    pub release: Option<String>,
    pub scenario: Option<String>,
    /// The whole header line.
    pub raw: RawJson,
}

impl RecordingHeader {
    /// The release as a semver version, if it parses.
    pub fn release_version(&self) -> Option<semver::Version> {
        self.release
            .as_deref()
            .and_then(crate::adapter::parse_release)
    }
}

#[derive(Deserialize)]
struct WireHeader<'a> {
    #[serde(default)]
    ostler_recording: Option<LNum>,
    #[serde(default, borrow)]
    release: LStr<'a>,
    #[serde(default, borrow)]
    scenario: LStr<'a>,
}

/// The header, if `line` is one (an object with an `ostler_recording` field).
pub fn parse_header(line: &[u8]) -> Option<RecordingHeader> {
    if line.iter().copied().find(|b| !b.is_ascii_whitespace()) != Some(b'{') {
        return None;
    }
    let h: WireHeader<'_> = serde_json::from_slice(line).ok()?;
    let format = h.ostler_recording?.u64()?;
    let raw = serde_json::from_slice::<Box<RawValue>>(line).ok()?;
    Some(RecordingHeader {
        format,
        release: h.release.owned(),
        scenario: h.scenario.owned(),
        raw: RawJson(raw),
    })
}

/// Who wrote a recorded line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    Cli,
    Ostler,
}

/// One envelope of a recording.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A JSON line (its text), written by `dir`.
    Line { dir: Dir, line: Bytes },
    /// A non-JSON stdout line of the CLI (its text).
    Text { dir: Dir, text: Bytes },
    /// Recorder metadata (`{"dir":"meta",...}`, e.g. the process exit), kept verbatim.
    Meta(Bytes),
    /// Not a recording envelope: the line as it was.
    Invalid(Bytes),
}

#[derive(Deserialize)]
struct WireEntry<'a> {
    #[serde(default, borrow)]
    dir: LStr<'a>,
    #[serde(default, borrow)]
    line: Option<&'a RawValue>,
    #[serde(default, borrow)]
    text: LStr<'a>,
}

/// Read one envelope. The CLI line is handed out as a slice of `envelope` (no copy) when it
/// was embedded as JSON; a line embedded as a JSON string is unescaped.
pub fn parse_entry(envelope: &Bytes) -> Entry {
    let Ok(e) = serde_json::from_slice::<WireEntry<'_>>(envelope) else {
        return Entry::Invalid(envelope.clone());
    };
    let dir = match e.dir.as_deref() {
        Some("cli") => Dir::Cli,
        Some("ostler") => Dir::Ostler,
        Some("meta") => return Entry::Meta(envelope.clone()),
        _ => return Entry::Invalid(envelope.clone()),
    };
    if let Some(raw) = e.line {
        let text = raw.get();
        if text.starts_with('"')
            && let Ok(s) = serde_json::from_str::<String>(text)
        {
            return Entry::Line {
                dir,
                line: Bytes::from(s),
            };
        }
        return Entry::Line {
            dir,
            line: envelope.slice_ref(text.as_bytes()),
        };
    }
    if let Some(text) = e.text.as_deref() {
        return Entry::Text {
            dir,
            text: Bytes::copy_from_slice(text.as_bytes()),
        };
    }
    Entry::Invalid(envelope.clone())
}

/// For the head of an oversized envelope: the part from the embedded CLI line on, so the
/// truncation scanner sees the CLI message's own fields.
pub fn embedded_head(head: &Bytes) -> Bytes {
    let window = head.len().min(128);
    let Some(prefix) = head.get(..window) else {
        return head.clone();
    };
    match memchr::memmem::find(prefix, b"\"line\":") {
        Some(i) => head.slice((i + 7).min(head.len())..),
        None => head.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_entries() {
        let h = parse_header(br#"{"ostler_recording":1,"release":"2.1.330","scenario":"x"}"#)
            .expect("header");
        assert_eq!(h.release.as_deref(), Some("2.1.330"));
        assert_eq!(h.release_version(), Some(semver::Version::new(2, 1, 330)));
        assert_eq!(h.scenario.as_deref(), Some("x"));
        assert!(parse_header(br#"{"type":"system"}"#).is_none());

        let env = Bytes::from_static(br#"{"dir":"cli","line":{"type":"keep_alive"}}"#);
        assert_eq!(
            parse_entry(&env),
            Entry::Line {
                dir: Dir::Cli,
                line: Bytes::from_static(br#"{"type":"keep_alive"}"#)
            }
        );
        let env = Bytes::from_static(br#"{"dir":"cli","text":"hello"}"#);
        assert_eq!(
            parse_entry(&env),
            Entry::Text {
                dir: Dir::Cli,
                text: Bytes::from_static(b"hello")
            }
        );
        let env = Bytes::from_static(br#"{"dir":"ostler","line":"{\"a\":1}"}"#);
        assert_eq!(
            parse_entry(&env),
            Entry::Line {
                dir: Dir::Ostler,
                line: Bytes::from_static(br#"{"a":1}"#)
            }
        );
        assert!(matches!(
            parse_entry(&Bytes::from_static(b"nope")),
            Entry::Invalid(_)
        ));
    }
}
