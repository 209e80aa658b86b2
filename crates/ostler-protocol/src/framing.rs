//! Framing: bytes in, lines out.
//!
//! Splits on `\n` at the byte level (never assumes a chunk ends on a character boundary:
//! `\n` can never occur inside a multi-byte UTF-8 sequence, so byte-level splitting is
//! exact), strips a trailing `\r`, skips blank lines (empty or ASCII whitespace only).
//!
//! A line longer than `max_payload_bytes` never grows memory without bound: once the
//! buffered part of a line would exceed the cap, only its head (the first
//! [`OVERSIZED_HEAD_BYTES`] bytes, or the cap if smaller, enough to read type and ids) is
//! kept, the rest is counted and dropped, and the line comes out as [`Frame::Oversized`]
//! when its terminator arrives. The internal buffer's capacity never exceeds the cap
//! (growth is clamped), so memory per framer is bounded by `max_payload_bytes` plus the
//! caller's chunk.
//!
//! [`LineFramer::push_bytes`] is the zero-copy entry point: a line that lies wholly inside
//! one chunk is handed out as a slice of that chunk (`Bytes::slice`), without copying.

use bytes::Bytes;

/// Default per-line cap: 10 MiB.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 10 * 1024 * 1024;

/// How much of an oversized line is kept to identify it (type, subtype, ids).
pub const OVERSIZED_HEAD_BYTES: usize = 16 * 1024;

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

impl Frame {
    /// The bytes kept for this frame (the whole line, or the head of an oversized one).
    pub fn bytes(&self) -> &Bytes {
        match self {
            Frame::Line(b) => b,
            Frame::Oversized { head, .. } => head,
        }
    }
}

/// Incremental line splitter. Feed it chunks as they arrive.
#[derive(Debug)]
pub struct LineFramer {
    opts: FramerOptions,
    /// The incomplete current line (or the head of an oversized one).
    buf: Vec<u8>,
    /// `Some(total bytes seen so far)` while the current line is over the cap.
    oversized: Option<u64>,
    /// Last byte of the current line seen (to drop a `\r` before `\n` in oversized lines).
    last_byte: u8,
}

impl LineFramer {
    pub fn new(opts: FramerOptions) -> Self {
        Self {
            opts,
            buf: Vec::new(),
            oversized: None,
            last_byte: 0,
        }
    }

    pub fn options(&self) -> FramerOptions {
        self.opts
    }

    /// Capacity of the internal buffer (bounded by `max_payload_bytes`); for tests and
    /// metrics.
    pub fn buffer_capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Bytes currently buffered for an incomplete line.
    pub fn buffered_len(&self) -> usize {
        self.buf.len()
    }

    fn head_len(&self) -> usize {
        OVERSIZED_HEAD_BYTES.min(self.opts.max_payload_bytes)
    }

    /// Feed a chunk; complete frames are appended to `out`.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<Frame>) {
        let mut rest = chunk;
        while let Some(pos) = memchr::memchr(b'\n', rest) {
            let (line, tail) = rest.split_at(pos);
            if self.buf.is_empty()
                && self.oversized.is_none()
                && line.len() <= self.opts.max_payload_bytes
            {
                // Whole line inside this chunk: one copy, straight out.
                emit_line(Bytes::copy_from_slice(line), out);
            } else {
                self.absorb(line);
                self.end_line(out);
            }
            rest = tail.get(1..).unwrap_or_default();
        }
        self.absorb(rest);
    }

    /// Feed an owned chunk; lines that lie wholly inside it are not copied.
    pub fn push_bytes(&mut self, chunk: Bytes, out: &mut Vec<Frame>) {
        let mut start = 0usize;
        let len = chunk.len();
        while start < len {
            let Some(rel) = chunk.get(start..).and_then(|s| memchr::memchr(b'\n', s)) else {
                break;
            };
            let end = start + rel;
            if self.buf.is_empty() && self.oversized.is_none() {
                let line_len = end - start;
                if line_len <= self.opts.max_payload_bytes {
                    emit_line(chunk.slice(start..end), out);
                } else {
                    // Goes through the bounded path (keeps only the head).
                    self.absorb(chunk.get(start..end).unwrap_or_default());
                    self.end_line(out);
                }
            } else {
                self.absorb(chunk.get(start..end).unwrap_or_default());
                self.end_line(out);
            }
            start = end + 1;
        }
        if start < len {
            self.absorb(chunk.get(start..).unwrap_or_default());
        }
    }

    /// End of stream: a last line without a terminator is emitted.
    pub fn finish(&mut self, out: &mut Vec<Frame>) {
        if !self.buf.is_empty() || self.oversized.is_some() {
            self.end_line(out);
        }
    }

    /// Append part of the current line, never keeping more than the cap.
    fn absorb(&mut self, part: &[u8]) {
        if part.is_empty() {
            return;
        }
        if let Some(&b) = part.last() {
            self.last_byte = b;
        }
        if let Some(total) = self.oversized.as_mut() {
            *total += part.len() as u64;
            return;
        }
        let cap = self.opts.max_payload_bytes;
        let new_len = self.buf.len().saturating_add(part.len());
        if new_len > cap {
            // The line just went over the cap: keep only its head.
            let total = new_len as u64;
            let head = self.head_len();
            if self.buf.len() < head {
                let take = (head - self.buf.len()).min(part.len());
                self.reserve_clamped(take);
                self.buf
                    .extend_from_slice(part.get(..take).unwrap_or_default());
            } else {
                self.buf.truncate(head);
            }
            self.oversized = Some(total);
            return;
        }
        self.reserve_clamped(part.len());
        self.buf.extend_from_slice(part);
    }

    /// Reserve room for `additional` bytes, growing geometrically but never past the cap.
    fn reserve_clamped(&mut self, additional: usize) {
        let needed = self.buf.len().saturating_add(additional);
        if needed <= self.buf.capacity() {
            return;
        }
        let cap = self.opts.max_payload_bytes.max(needed);
        let target = self
            .buf
            .capacity()
            .saturating_mul(2)
            .max(needed)
            .max(64)
            .min(cap);
        self.buf.reserve_exact(target - self.buf.len());
    }

    fn end_line(&mut self, out: &mut Vec<Frame>) {
        match self.oversized.take() {
            Some(mut total) => {
                if self.last_byte == b'\r' {
                    total = total.saturating_sub(1);
                }
                let head = Bytes::copy_from_slice(&self.buf);
                out.push(Frame::Oversized {
                    head,
                    original_size: total,
                });
            }
            None => {
                if !self.buf.is_empty() {
                    let line = Bytes::copy_from_slice(&self.buf);
                    emit_line(line, out);
                }
            }
        }
        self.buf.clear();
        self.last_byte = 0;
        // Do not keep a huge allocation around after an exceptional line.
        if self.buf.capacity() > 1024 * 1024 {
            self.buf.shrink_to(64 * 1024);
        }
    }
}

fn emit_line(mut line: Bytes, out: &mut Vec<Frame>) {
    if line.last() == Some(&b'\r') {
        line.truncate(line.len() - 1);
    }
    if line.iter().all(|b| b.is_ascii_whitespace()) {
        return;
    }
    out.push(Frame::Line(line));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(frames: &[Frame]) -> Vec<String> {
        frames
            .iter()
            .map(|f| match f {
                Frame::Line(b) => String::from_utf8_lossy(b).into_owned(),
                Frame::Oversized {
                    head,
                    original_size,
                } => format!(
                    "OVERSIZED({original_size}):{}",
                    String::from_utf8_lossy(head)
                ),
            })
            .collect()
    }

    #[test]
    fn splits_crlf_blank_and_unterminated() {
        let mut f = LineFramer::new(FramerOptions::default());
        let mut out = Vec::new();
        f.push(b"a\r\n\n  \r\nb", &mut out);
        f.push(b"c\nd", &mut out);
        f.finish(&mut out);
        assert_eq!(lines(&out), ["a", "bc", "d"]);
    }

    #[test]
    fn multibyte_split_across_chunks() {
        let text = "{\"t\":\"héllo ✓\"}\n".as_bytes();
        for cut in 0..text.len() {
            let mut f = LineFramer::new(FramerOptions::default());
            let mut out = Vec::new();
            f.push(&text[..cut], &mut out);
            f.push_bytes(Bytes::copy_from_slice(&text[cut..]), &mut out);
            f.finish(&mut out);
            assert_eq!(lines(&out), ["{\"t\":\"héllo ✓\"}"], "cut at {cut}");
        }
    }

    #[test]
    fn oversized_line_keeps_head_and_counts() {
        let mut f = LineFramer::new(FramerOptions {
            max_payload_bytes: 100,
        });
        let mut out = Vec::new();
        let mut big = b"{\"type\":\"user\"".to_vec();
        big.extend(std::iter::repeat_n(b'x', 1000));
        big.extend(b"\r\n{\"ok\":1}\n");
        for chunk in big.chunks(7) {
            f.push(chunk, &mut out);
            assert!(f.buffer_capacity() <= 100);
        }
        assert_eq!(out.len(), 2);
        match &out[0] {
            Frame::Oversized {
                head,
                original_size,
            } => {
                assert_eq!(*original_size, 1014);
                assert!(head.starts_with(b"{\"type\":\"user\""));
                assert!(head.len() <= 100);
            }
            other => panic!("expected oversized, got {other:?}"),
        }
        assert_eq!(out[1], Frame::Line(Bytes::from_static(b"{\"ok\":1}")));
    }

    #[test]
    fn push_bytes_zero_copy_and_oversized() {
        let mut f = LineFramer::new(FramerOptions {
            max_payload_bytes: 10,
        });
        let mut out = Vec::new();
        f.push_bytes(Bytes::from_static(b"short\n0123456789ABC\nx"), &mut out);
        f.finish(&mut out);
        assert_eq!(lines(&out), ["short", "OVERSIZED(13):0123456789", "x"]);
    }
}
