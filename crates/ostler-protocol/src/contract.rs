//! Contract checks over a recording (pure: bytes in, report out). Used by the contract
//! tests (`tests/it/contracts.rs`) and `cargo xtask contracts bless`.
//!
//! For every JSON line the CLI wrote (`{"dir":"cli","line":...}`), decoded by the adapter
//! chosen for the recording's release:
//! - no `Diagnostic` (zero parse failures),
//! - no `Unknown` whose type the adapter claims to know (`AdapterInfo::known_types`),
//! - every field reported absent is one the adapter expects its releases not to send
//!   (`AdapterInfo::expected_absent`), so a release dropping a field is noticed.
//!
//! Non-JSON stdout lines (`{"dir":"cli","text":...}`) are decoded too (they become
//! diagnostics in the canonical output) but are not failures: the CLI may print them.

use bytes::Bytes;

use crate::decode::Decoder;
use crate::framing::{Frame, FramerOptions, LineFramer};
use crate::model::Event;
use crate::recording::{self, Dir, Entry};

/// Golden file name for a recording file name (`plain_text.ndjson` ->
/// `plain_text.golden.jsonl`).
pub fn golden_name(recording_file_name: &str) -> String {
    let stem = recording_file_name
        .strip_suffix(".ndjson")
        .unwrap_or(recording_file_name);
    format!("{stem}.golden.jsonl")
}

/// What a recording violated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContractReport {
    pub release: Option<String>,
    pub adapter: String,
    pub tolerant: bool,
    /// CLI JSON lines decoded.
    pub cli_lines: u64,
    /// Problems, one per offending event (empty = the recording honours the contract).
    pub violations: Vec<String>,
}

impl ContractReport {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// `event_kind.field` names of the fields an event reports absent.
pub fn absent_fields(e: &Event) -> Vec<String> {
    let (prefix, list) = match e {
        Event::SessionStarted(s) => ("session_started", &s.absent),
        Event::ToolResult(t) => ("tool_result", &t.absent),
        Event::TurnResult(r) => ("turn_result", &r.absent),
        Event::ControlRequest(c) => match &c.request {
            crate::model::CliRequest::CanUseTool(c) => ("can_use_tool", &c.absent),
            _ => return Vec::new(),
        },
        _ => return Vec::new(),
    };
    list.iter().map(|f| format!("{prefix}.{f}")).collect()
}

/// Check one recording.
pub fn check_recording(input: &[u8]) -> ContractReport {
    let mut framer = LineFramer::new(FramerOptions::default());
    let mut frames = Vec::new();
    framer.push(input, &mut frames);
    framer.finish(&mut frames);
    let mut frames = frames.into_iter();
    let mut report = ContractReport::default();
    let header = match frames.next() {
        Some(Frame::Line(l)) => recording::parse_header(&l),
        _ => None,
    };
    let Some(header) = header else {
        report
            .violations
            .push("no recording header line".to_string());
        return report;
    };
    let mut decoder = Decoder::for_release(header.release_version().as_ref());
    let adapter = decoder.adapter();
    report.release = header.release.clone();
    report.adapter = adapter.name.to_string();
    report.tolerant = decoder.is_tolerant();
    if decoder.is_tolerant() {
        report.violations.push(format!(
            "release {:?} is not served by any adapter's range (tolerant fallback)",
            header.release
        ));
    }
    for (n, frame) in frames.enumerate() {
        let lineno = n + 2;
        let envelope: Bytes = match frame {
            Frame::Line(l) => l,
            Frame::Oversized { original_size, .. } => {
                report.violations.push(format!(
                    "line {lineno}: oversized envelope ({original_size} bytes)"
                ));
                continue;
            }
        };
        let line = match recording::parse_entry(&envelope) {
            Entry::Line {
                dir: Dir::Cli,
                line,
            } => line,
            Entry::Text {
                dir: Dir::Cli,
                text,
            } => {
                // Decoded for the state, but not a contract failure.
                decoder.decode(Frame::Line(text));
                continue;
            }
            Entry::Invalid(_) => {
                report
                    .violations
                    .push(format!("line {lineno}: not a recording envelope"));
                continue;
            }
            _ => continue,
        };
        report.cli_lines += 1;
        for e in decoder.decode(Frame::Line(line)).events {
            match &e {
                Event::Diagnostic(d) => report.violations.push(format!(
                    "line {lineno}: diagnostic {:?}: {}",
                    d.code, d.message
                )),
                Event::Unknown(u) if adapter.knows(&u.message_type) => {
                    report.violations.push(format!(
                        "line {lineno}: Unknown for claimed type {:?}",
                        u.message_type
                    ))
                }
                Event::Truncated(t) => report.violations.push(format!(
                    "line {lineno}: truncated CLI line ({} bytes)",
                    t.original_size
                )),
                _ => {}
            }
            for f in absent_fields(&e) {
                if !adapter.expects_absent(&f) {
                    report.violations.push(format!(
                        "line {lineno}: field {f} absent, not expected by adapter {}",
                        adapter.name
                    ));
                }
            }
        }
    }
    report
}
