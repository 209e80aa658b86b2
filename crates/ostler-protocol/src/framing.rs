//! Framing: bytes in, lines out.
//!
//! Splits on `\n` at the byte level (never assumes a chunk ends on a character boundary),
//! strips a trailing `\r`, skips blank lines. A line longer than `max_payload_bytes` never
//! grows memory without bound: only its head (enough to read type and ids) is kept and it
//! comes out as [`Frame::Oversized`].

use bytes::Bytes;

/// Default per-line cap: 10 MiB.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 10 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FramerOptions {
    /// Lines longer than this are not buffered whole.
    pub max_payload_bytes: usize,
}

impl Default for FramerOptions {
    fn default() -> Self {
        Self {
            max_payload_bytes: DEFAULT_MAX_PAYLOAD_BYTES,
        }
    }
}

/// One framed line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A complete line without its terminator.
    Line(Bytes),
    /// A line longer than the cap: its first bytes, and how long it really was.
    Oversized { head: Bytes, original_size: u64 },
}

/// Incremental line splitter. Feed it chunks as they arrive.
#[derive(Debug)]
pub struct LineFramer {
    #[allow(dead_code)]
    opts: FramerOptions,
}

impl LineFramer {
    pub fn new(opts: FramerOptions) -> Self {
        Self { opts }
    }

    /// Feed a chunk; complete frames are appended to `out`.
    pub fn push(&mut self, _chunk: &[u8], _out: &mut Vec<Frame>) {
        unimplemented!("framing")
    }

    /// End of stream: a last line without a terminator is emitted.
    pub fn finish(&mut self, _out: &mut Vec<Frame>) {
        unimplemented!("framing")
    }
}
