//! Stateful per-session decoding: frames in, canonical events out.

use bytes::Bytes;

use crate::adapter::{self, AdapterInfo};
use crate::framing::Frame;
use crate::model::Event;

/// One input line and what it decoded to. `raw` is the line exactly as the CLI wrote it
/// (without terminator), so the store need not re-serialize anything.
#[derive(Debug, Clone)]
pub struct DecodedLine {
    pub raw: Bytes,
    pub events: Vec<Event>,
}

/// Decoder for one session's stdout. Keeps the state needed to emit every assistant block
/// exactly once, whether the release sends per-block frames or cumulative snapshots.
#[derive(Debug)]
pub struct Decoder {
    adapter: &'static AdapterInfo,
}

impl Decoder {
    /// The adapter for `release` (the newest, in tolerant mode, when `None` or newer than
    /// every adapter's range).
    pub fn for_release(release: Option<&semver::Version>) -> Self {
        Self {
            adapter: adapter::select(release),
        }
    }

    pub fn adapter(&self) -> &'static AdapterInfo {
        self.adapter
    }

    /// Decode one framed line. Never fails: what cannot be read becomes a
    /// `Diagnostic`/`Unknown`/`Truncated` event.
    pub fn decode(&mut self, _frame: Frame) -> DecodedLine {
        unimplemented!("decode")
    }
}
