//! Target `framer`: `LineFramer` + every adapter's `Decoder`.

use bytes::Bytes;
use ostler_protocol::framing::OVERSIZED_HEAD_BYTES;
use ostler_protocol::{DEFAULT_MAX_PAYLOAD_BYTES, Decoder, Frame, FramerOptions, LineFramer};
use proptest::prelude::*;
use proptest::sample::Index;

use crate::generate::{Blob, apply_edits, byte_edits};
use crate::{Budget, Failure, Report, corpus, drive};

#[derive(Debug, Clone)]
struct Case {
    input: Blob,
    /// Chunk boundaries (sorted positions into `input`).
    cuts: Vec<usize>,
    /// Per chunk (cycled): `push_bytes` (owned) rather than `push` (borrowed).
    owned: Vec<bool>,
    cap: usize,
}

fn byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        6 => any::<u8>(),
        3 => Just(b'\n'),
        1 => Just(b'\r'),
        1 => Just(b' '),
        1 => Just(b'\t'),
        1 => Just(b'{'),
        1 => Just(b'"'),
    ]
}

/// A window of consecutive CLI lines from one recording, byte-mutated.
fn recorded() -> impl Strategy<Value = Vec<u8>> {
    (
        any::<Index>(),
        any::<Index>(),
        1usize..8,
        any::<bool>(),
        byte_edits(),
    )
        .prop_map(|(rec, start, n, crlf, edits)| {
            let recs = corpus::recordings();
            let r = rec.get(recs);
            let from = start.index(r.lines.len());
            let mut out = Vec::new();
            for l in r.lines.iter().skip(from).take(n) {
                out.extend_from_slice(l);
                if crlf {
                    out.push(b'\r');
                }
                out.push(b'\n');
            }
            apply_edits(&mut out, &edits);
            out
        })
}

fn case() -> impl Strategy<Value = Case> {
    let input = prop_oneof![
        prop::collection::vec(byte(), 0..600),
        recorded(),
        (1usize..40_000, byte()).prop_map(|(n, b)| vec![b; n]),
    ];
    let cap = prop_oneof![
        3 => 1usize..=64,
        1 => Just(256usize),
        1 => Just(OVERSIZED_HEAD_BYTES + 7),
        1 => Just(DEFAULT_MAX_PAYLOAD_BYTES),
    ];
    (
        input,
        prop::collection::vec(any::<Index>(), 0..24),
        prop::collection::vec(any::<bool>(), 1..8),
        cap,
    )
        .prop_map(|(input, cuts, owned, cap)| {
            let mut cuts: Vec<usize> = cuts.iter().map(|i| i.index(input.len() + 1)).collect();
            cuts.sort_unstable();
            cuts.dedup();
            Case {
                input: Blob(input),
                cuts,
                owned,
                cap,
            }
        })
}

/// What the framer must produce: split on `\n`, one trailing `\r` dropped, blank lines
/// skipped; a line over the cap (counting its `\r`) is its head plus its real length.
fn reference(input: &[u8], cap: usize) -> Vec<Frame> {
    let head = OVERSIZED_HEAD_BYTES.min(cap);
    let mut out = Vec::new();
    for piece in input.split(|b| *b == b'\n') {
        if piece.len() > cap {
            let size = piece.len() - usize::from(piece.last() == Some(&b'\r'));
            out.push(Frame::Oversized {
                head: Bytes::copy_from_slice(piece.get(..head).unwrap_or(piece)),
                original_size: size as u64,
            });
            continue;
        }
        let line = piece.strip_suffix(b"\r").unwrap_or(piece);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        out.push(Frame::Line(Bytes::copy_from_slice(line)));
    }
    out
}

fn check(c: Case) -> Result<(), TestCaseError> {
    let input = &c.input.0;
    let mut framer = LineFramer::new(FramerOptions {
        max_payload_bytes: c.cap,
    });
    let mut frames = Vec::new();
    let mut from = 0usize;
    let ends = c.cuts.iter().copied().chain(std::iter::once(input.len()));
    for (i, to) in ends.enumerate() {
        let chunk = input.get(from..to).unwrap_or_default();
        from = to;
        if c.owned.get(i % c.owned.len()).copied().unwrap_or(false) {
            framer.push_bytes(Bytes::copy_from_slice(chunk), &mut frames);
        } else {
            framer.push(chunk, &mut frames);
        }
        prop_assert!(
            framer.buffer_capacity() <= c.cap,
            "buffer capacity {} over the cap {}",
            framer.buffer_capacity(),
            c.cap
        );
        prop_assert!(framer.buffered_len() <= c.cap);
    }
    framer.finish(&mut frames);
    prop_assert_eq!(&frames, &reference(input, c.cap));

    for release in corpus::adapter_releases() {
        let mut d = Decoder::for_release(release.as_ref());
        for f in &frames {
            let decoded = d.decode(f.clone());
            prop_assert_eq!(&decoded.raw, f.bytes());
            if matches!(f, Frame::Line(_)) {
                let first = f.bytes().iter().find(|b| !b.is_ascii_whitespace());
                prop_assert!(
                    !decoded.events.is_empty() || first == Some(&b'{'),
                    "a non-object line decoded to no event"
                );
            }
            for ev in &decoded.events {
                prop_assert!(serde_json::to_vec(ev).is_ok(), "event does not serialize");
            }
        }
    }
    Ok(())
}

/// Runs the framer target until the budget's deadline.
pub fn framer(budget: Budget) -> Result<Report, Failure> {
    drive("framer", budget, case(), check)
}
