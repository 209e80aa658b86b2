//! Decoding a whole transcript: a raw NDJSON stream of CLI stdout, or a contract recording
//! (detected by its header line). Pure: bytes in, output lines out. Shared by
//! `ostler decode`, `cargo xtask contracts bless` and the contract tests, so all three print
//! exactly the same canonical output.

use std::collections::BTreeMap;

use bytes::Bytes;
use semver::Version;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::decode::Decoder;
use crate::framing::{Frame, FramerOptions, LineFramer};
use crate::model::{Event, RawJson};
use crate::recording::{self, Dir, Entry, RecordingHeader};

/// One output line.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// A canonical event decoded from a CLI line.
    Event(Event),
    /// A line ostler wrote to the CLI (recordings only), shown verbatim.
    Outbound(RawJson),
}

#[derive(Serialize)]
struct OutboundLine<'a> {
    kind: &'static str,
    line: &'a RawValue,
}

impl Output {
    /// The output as one JSON line (without terminator): an event serializes as itself
    /// (tagged by `kind`), an outbound line as `{"kind":"outbound","line":...}`.
    pub fn to_json(&self) -> String {
        let r = match self {
            Output::Event(e) => serde_json::to_string(e),
            Output::Outbound(raw) => serde_json::to_string(&OutboundLine {
                kind: "outbound",
                line: &raw.0,
            }),
        };
        // Serializing our own types cannot fail (no non-string map keys); keep a marker
        // rather than panicking if it ever did.
        r.unwrap_or_else(|e| {
            format!(
                "{{\"kind\":\"serialize_error\",\"error\":{:?}}}",
                e.to_string()
            )
        })
    }
}

/// Counts for the summary line.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Summary {
    /// The adapter used and whether in tolerant mode.
    pub adapter: String,
    pub tolerant: bool,
    /// The release used to choose the adapter (`--release`, else the recording's header).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    pub recording: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scenario: Option<String>,
    /// CLI lines decoded.
    pub lines: u64,
    pub events: u64,
    pub by_kind: BTreeMap<String, u64>,
    pub unknown: u64,
    /// `type` of each Unknown event, with counts.
    pub unknown_types: BTreeMap<String, u64>,
    pub diagnostics: u64,
    pub truncated: u64,
    pub outbound: u64,
    /// Recorder metadata lines (recordings only).
    pub meta: u64,
    /// Recording envelopes that could not be read.
    pub invalid_envelopes: u64,
}

#[derive(Debug)]
enum Mode {
    /// Nothing read yet.
    Start,
    Raw,
    Recording,
}

/// Incremental transcript decoder.
#[derive(Debug)]
pub struct TranscriptDecoder {
    framer: LineFramer,
    release_override: Option<Version>,
    mode: Mode,
    decoder: Decoder,
    header: Option<RecordingHeader>,
    summary: Summary,
    frames: Vec<Frame>,
}

impl TranscriptDecoder {
    /// `release` overrides the release named by a recording's header.
    pub fn new(release: Option<Version>, opts: FramerOptions) -> Self {
        let decoder = Decoder::for_release(release.as_ref());
        let mut t = Self {
            framer: LineFramer::new(opts),
            release_override: release,
            mode: Mode::Start,
            decoder,
            header: None,
            summary: Summary::default(),
            frames: Vec::new(),
        };
        t.note_adapter();
        t
    }

    fn note_adapter(&mut self) {
        self.summary.adapter = self.decoder.adapter().name.to_string();
        self.summary.tolerant = self.decoder.is_tolerant();
    }

    /// The recording header, once seen.
    pub fn header(&self) -> Option<&RecordingHeader> {
        self.header.as_ref()
    }

    pub fn summary(&self) -> &Summary {
        &self.summary
    }

    pub fn decoder(&self) -> &Decoder {
        &self.decoder
    }

    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<Output>) {
        let mut frames = std::mem::take(&mut self.frames);
        self.framer.push(chunk, &mut frames);
        for f in frames.drain(..) {
            self.frame(f, out);
        }
        self.frames = frames;
    }

    pub fn push_bytes(&mut self, chunk: Bytes, out: &mut Vec<Output>) {
        let mut frames = std::mem::take(&mut self.frames);
        self.framer.push_bytes(chunk, &mut frames);
        for f in frames.drain(..) {
            self.frame(f, out);
        }
        self.frames = frames;
    }

    pub fn finish(&mut self, out: &mut Vec<Output>) {
        let mut frames = std::mem::take(&mut self.frames);
        self.framer.finish(&mut frames);
        for f in frames.drain(..) {
            self.frame(f, out);
        }
        self.frames = frames;
    }

    fn frame(&mut self, frame: Frame, out: &mut Vec<Output>) {
        if let Mode::Start = self.mode {
            if let Frame::Line(line) = &frame
                && let Some(h) = recording::parse_header(line)
            {
                self.mode = Mode::Recording;
                self.summary.recording = true;
                self.summary.scenario = h.scenario.clone();
                if self.release_override.is_none() {
                    self.decoder = Decoder::for_release(h.release_version().as_ref());
                    self.summary.release = h.release.clone();
                }
                self.header = Some(h);
                self.note_adapter();
                return;
            }
            self.mode = Mode::Raw;
        }
        if self.summary.release.is_none() {
            self.summary.release = self.release_override.as_ref().map(|v| v.to_string());
        }
        match self.mode {
            Mode::Recording => self.recording_frame(frame, out),
            Mode::Raw | Mode::Start => self.cli_frame(frame, out),
        }
    }

    fn recording_frame(&mut self, frame: Frame, out: &mut Vec<Output>) {
        let envelope = match frame {
            Frame::Line(l) => l,
            Frame::Oversized {
                head,
                original_size,
            } => {
                // An oversized envelope: decode what its head says about the CLI line.
                let head = recording::embedded_head(&head);
                return self.cli_frame(
                    Frame::Oversized {
                        head,
                        original_size,
                    },
                    out,
                );
            }
        };
        match recording::parse_entry(&envelope) {
            Entry::Line {
                dir: Dir::Cli,
                line,
            }
            | Entry::Text {
                dir: Dir::Cli,
                text: line,
            } => self.cli_frame(Frame::Line(line), out),
            Entry::Line {
                dir: Dir::Ostler,
                line,
            } => {
                if let Ok(raw) = serde_json::from_slice::<Box<RawValue>>(&line) {
                    self.summary.outbound += 1;
                    out.push(Output::Outbound(RawJson(raw)));
                }
            }
            Entry::Text {
                dir: Dir::Ostler, ..
            } => {}
            Entry::Meta(_) => {
                self.summary.meta += 1;
            }
            Entry::Invalid(_) => {
                self.summary.invalid_envelopes += 1;
            }
        }
    }

    fn cli_frame(&mut self, frame: Frame, out: &mut Vec<Output>) {
        self.summary.lines += 1;
        let decoded = self.decoder.decode(frame);
        for e in decoded.events {
            self.summary.events += 1;
            *self
                .summary
                .by_kind
                .entry(e.kind().to_string())
                .or_default() += 1;
            match &e {
                Event::Unknown(u) => {
                    self.summary.unknown += 1;
                    *self
                        .summary
                        .unknown_types
                        .entry(u.message_type.clone())
                        .or_default() += 1;
                }
                Event::Diagnostic(_) => self.summary.diagnostics += 1,
                Event::Truncated(_) => self.summary.truncated += 1,
                _ => {}
            }
            out.push(Output::Event(e));
        }
    }
}

/// Decode a whole input.
pub fn decode_all(input: &[u8], release: Option<Version>) -> (Vec<Output>, Summary) {
    let mut t = TranscriptDecoder::new(release, FramerOptions::default());
    let mut out = Vec::new();
    t.push(input, &mut out);
    t.finish(&mut out);
    (out, t.summary().clone())
}

/// Render outputs as JSON lines (each terminated by `\n`): the golden file format.
pub fn render(outputs: &[Output]) -> String {
    let mut s = String::new();
    for o in outputs {
        s.push_str(&o.to_json());
        s.push('\n');
    }
    s
}
