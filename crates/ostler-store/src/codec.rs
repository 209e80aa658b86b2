//! One copy of each event: the canonical payload is stored as a delta against the CLI's raw
//! line when the event has one.
//!
//! The engine's canonical encoding repeats most of the raw line (texts, tool inputs and
//! outputs, ids: serde_json and the CLI escape strings the same way), so storing both
//! verbatim kept every event about twice. The store keeps the raw line as is and the payload
//! as a short list of operations: *literal bytes* or *copy `len` bytes from offset `off` of
//! the raw line*. Decoding is a few `memcpy`s; both are returned byte for byte as appended.
//! The store never looks at what the bytes mean (any JSON, any nesting depth, or not JSON).
//!
//! Format: a sequence of ops, each starting with a varint `tag`:
//! - `tag = len << 1`: `len` literal bytes follow;
//! - `tag = len << 1 | 1`: a varint `off` follows; copy `raw[off..off + len]`.
//!
//! The same format also stores the raw line itself (and the payload of an event without
//! one) as a delta against a built-in dictionary: typical CLI lines of several releases
//! (`codec_dict_v1.ndjson`), so the keys, the framing and the constant values that every
//! line repeats are a few copy ops instead of bytes. The dictionary is part of the format:
//! it is never changed; a different one would be a new codec bit.
//!
//! `events.codec` is a set of bits (0 = everything stored as is):
//! - [`PAYLOAD_FROM_RAW`]: the payload column is a delta against the raw line;
//! - [`RAW_FROM_DICT`]: the raw column is a delta against the dictionary;
//! - [`PAYLOAD_FROM_DICT`]: the payload column is a delta against the dictionary (events
//!   without a raw line).
//!
//! Rows written before the dictionary (codec 0 and 1) read as before.

use std::borrow::Cow;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::types::NewEvent;

/// `events.codec`: the payload and raw columns hold the payload and the raw line as is.
pub(crate) const CODEC_PLAIN: i64 = 0;
/// `events.codec` bit: the payload column holds a delta against the raw line.
pub(crate) const PAYLOAD_FROM_RAW: i64 = 1;
/// `events.codec` bit: the raw column holds a delta against the dictionary.
pub(crate) const RAW_FROM_DICT: i64 = 2;
/// `events.codec` bit: the payload column holds a delta against the dictionary (only
/// without a raw line).
pub(crate) const PAYLOAD_FROM_DICT: i64 = 4;
/// `events.codec` as written by migration 0003: [`PAYLOAD_FROM_RAW`].
pub(crate) const CODEC_DELTA: i64 = PAYLOAD_FROM_RAW;

/// The dictionary of [`RAW_FROM_DICT`] and [`PAYLOAD_FROM_DICT`]: 33 lines of the CLI's
/// own output (2.1.330, 2.1.0, 2.0.77, 1.0.128, 1.0.108, 1.0.59: up to two lines of each
/// type/subtype/content-block mix from the contract recordings, partial stream events left
/// out, each cut at 1,500 bytes), 20 KB. Frozen: rows refer to its offsets.
static DICT_V1: &[u8] = include_bytes!("codec_dict_v1.ndjson");

/// The shortest run copied from the raw line (shorter ones are cheaper as literals).
const MIN_MATCH: usize = 12;
/// Bytes hashed to find a candidate match.
const WINDOW: usize = 8;
/// The hash table has at most `1 << MAX_HASH_BITS` slots (lines larger than that keep the
/// last position per slot; matches are still verified byte by byte).
const MAX_HASH_BITS: u32 = 16;

/// An event in the form it is stored (encoded by the caller's thread, not the writer's).
pub(crate) struct EncodedEvent {
    pub kind: Cow<'static, str>,
    pub ts_ms: i64,
    pub codec: i64,
    /// The payload, or its delta against `raw` (`codec`).
    pub payload: Bytes,
    pub raw: Option<Bytes>,
}

impl EncodedEvent {
    pub(crate) fn new(ev: NewEvent) -> Self {
        let mut codec = CODEC_PLAIN;
        // `data` as its delta (setting `bit`), or as is when the delta would not be smaller.
        let mut shrink = |data: Bytes, delta: Option<Vec<u8>>, bit: i64| match delta {
            Some(d) => {
                codec |= bit;
                Bytes::from(d)
            }
            None => data,
        };
        let payload = match ev.raw.as_deref() {
            Some(raw) => {
                let d = delta(&ev.payload, raw);
                shrink(ev.payload, d, PAYLOAD_FROM_RAW)
            }
            None => {
                let d = dict_delta(&ev.payload);
                shrink(ev.payload, d, PAYLOAD_FROM_DICT)
            }
        };
        let raw = ev.raw.map(|raw| {
            let d = dict_delta(&raw);
            shrink(raw, d, RAW_FROM_DICT)
        });
        Self {
            kind: ev.kind,
            ts_ms: ev.ts_ms,
            codec,
            payload,
            raw,
        }
    }
}

/// The payload and the raw line as appended, from the stored columns of a row written
/// with `codec` (copied once; every bound checked: the columns may be damaged).
pub(crate) fn decode_row(
    codec: i64,
    payload: &[u8],
    raw: Option<&[u8]>,
) -> Result<(Bytes, Option<Bytes>)> {
    if codec & !(PAYLOAD_FROM_RAW | RAW_FROM_DICT | PAYLOAD_FROM_DICT) != 0
        || codec & (PAYLOAD_FROM_RAW | PAYLOAD_FROM_DICT) == PAYLOAD_FROM_RAW | PAYLOAD_FROM_DICT
    {
        return Err(Error::InvalidData(format!(
            "unknown payload codec {codec} (written by a newer ostler?)"
        )));
    }
    let raw = match raw {
        Some(r) if codec & RAW_FROM_DICT != 0 => Some(Bytes::from(undelta(r, DICT_V1)?)),
        Some(r) => Some(Bytes::copy_from_slice(r)),
        None if codec & RAW_FROM_DICT != 0 => {
            return Err(Error::InvalidData(
                "dictionary-encoded raw line missing".into(),
            ));
        }
        None => None,
    };
    let payload = if codec & PAYLOAD_FROM_RAW != 0 {
        let r = raw
            .as_deref()
            .ok_or_else(|| Error::InvalidData("delta-encoded payload without a raw line".into()))?;
        Bytes::from(undelta(payload, r)?)
    } else if codec & PAYLOAD_FROM_DICT != 0 {
        Bytes::from(undelta(payload, DICT_V1)?)
    } else {
        Bytes::copy_from_slice(payload)
    };
    Ok((payload, raw))
}

/// The form in which to store `payload` next to `raw`: `(codec, bytes)`. The delta is used
/// only when it is smaller than the payload itself.
pub(crate) fn encode(payload: &[u8], raw: Option<&[u8]>) -> (i64, Option<Vec<u8>>) {
    let Some(raw) = raw else {
        return (CODEC_PLAIN, None);
    };
    match delta(payload, raw) {
        Some(d) => (CODEC_DELTA, Some(d)),
        None => (CODEC_PLAIN, None),
    }
}

fn read_window(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; WINDOW];
    w.copy_from_slice(&b[at..at + WINDOW]);
    u64::from_le_bytes(w)
}

fn hash(w: u64, bits: u32) -> usize {
    // Multiplicative hashing; the top `bits` bits are the slot.
    (w.wrapping_mul(0x9E37_79B1_85EB_CA87) >> (64 - bits)) as usize
}

/// How many leading bytes `a` and `b` have in common (8 at a time).
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + WINDOW <= n {
        let x = read_window(a, i) ^ read_window(b, i);
        if x != 0 {
            return i + (x.trailing_zeros() / 8) as usize;
        }
        i += WINDOW;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

/// The delta's hash table, kept per thread between calls: each slot holds the generation
/// that wrote it (high half) and a position in the raw line (low half), so a new call
/// starts with an empty table by bumping the generation instead of clearing or allocating.
struct Table {
    slots: Vec<u64>,
    generation: u32,
}

impl Table {
    /// Starts a new, empty table of `1 << bits` slots.
    fn reset(&mut self, bits: u32) {
        let len = 1usize << bits;
        if self.slots.len() < len {
            self.slots.resize(len, 0);
        }
        self.generation = self.generation.wrapping_add(1);
        if self.generation == 0 {
            // After 2^32 calls: old generations could look current again.
            self.slots.fill(0);
            self.generation = 1;
        }
    }

    fn get(&self, slot: usize) -> Option<usize> {
        let v = self.slots[slot];
        ((v >> 32) as u32 == self.generation).then_some((v as u32) as usize)
    }

    fn put_first(&mut self, slot: usize, at: usize) {
        let v = &mut self.slots[slot];
        if (*v >> 32) as u32 != self.generation {
            *v = (u64::from(self.generation) << 32) | at as u64;
        }
    }
}

thread_local! {
    static TABLE: std::cell::RefCell<Table> = const {
        std::cell::RefCell::new(Table { slots: Vec::new(), generation: 0 })
    };
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(b: &[u8], at: &mut usize) -> Result<u64> {
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let byte = *b
            .get(*at)
            .ok_or_else(|| Error::InvalidData("truncated payload delta".into()))?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(Error::InvalidData(
        "overlong varint in payload delta".into(),
    ))
}

fn put_literal(out: &mut Vec<u8>, lit: &[u8]) {
    if !lit.is_empty() {
        put_varint(out, (lit.len() as u64) << 1);
        out.extend_from_slice(lit);
    }
}

/// The delta of `payload` against `raw`, or `None` when it would not be smaller.
///
/// Only every `STEP`-th window of `raw` is indexed: a common run of at least `MIN_MATCH`
/// bytes (`>= WINDOW + STEP - 1`) always contains an indexed window, found from the
/// payload's side at most `STEP - 1` bytes into the run and extended backwards, so sparse
/// indexing finds the same runs (up to hash collisions) for a quarter of the work.
fn delta(payload: &[u8], raw: &[u8]) -> Option<Vec<u8>> {
    const STEP: usize = 4;
    const _: () = assert!(MIN_MATCH >= WINDOW + STEP - 1);
    if payload.len() < MIN_MATCH || raw.len() < MIN_MATCH || raw.len() > u32::MAX as usize - 1 {
        return None;
    }
    // Two to four times as many slots as indexed windows, to keep collisions rare.
    let bits = (usize::BITS - (raw.len() / STEP).leading_zeros() + 2).clamp(8, MAX_HASH_BITS);
    TABLE.with(|t| {
        let mut table = t.borrow_mut();
        table.reset(bits);
        let mut at = 0;
        while at + WINDOW <= raw.len() {
            // Earlier positions win: the first occurrence is as good as any, and keeping
            // it makes long repeated runs (indentation, padding) match from their start.
            table.put_first(hash(read_window(raw, at), bits), at);
            at += STEP;
        }
        // The payload is mostly copies of the line: a short list of ops.
        let cap = payload.len() / 4 + 16;
        delta_against(payload, raw, 1, false, cap, |w| {
            [table.get(hash(w, bits)), None]
        })
    })
}

/// The delta of `data` against the dictionary, or `None` when it would not be smaller.
///
/// The dictionary is indexed at every position, so `data` is probed only at every
/// `DICT_STEP`-th one (the roles of the raw line's delta, reversed): a common run of at least
/// `MIN_MATCH` bytes still holds a probed window, up to the acceleration in long literal runs
/// (see [`delta_against`]). Fewer probes into a table that fits the CPU's caches: this runs
/// once per stored line, often with cold caches.
fn dict_delta(data: &[u8]) -> Option<Vec<u8>> {
    const DICT_STEP: usize = 4;
    const _: () = assert!(MIN_MATCH >= WINDOW + DICT_STEP - 1);
    if data.len() < MIN_MATCH {
        return None;
    }
    let index = &*DICT_INDEX;
    // A line keeps about 0.6 of its bytes (its text and ids are literals): sized so, the
    // ops are written without growing the buffer.
    let cap = data.len() * 3 / 4 + 16;
    delta_against(data, DICT_V1, DICT_STEP, true, cap, |w| index.candidates(w))
}

/// Every window of the dictionary, indexed once: per slot the first and the last position
/// with that hash (a window that occurs in many contexts, like a key, then has two
/// continuations to choose from), as 16-bit offsets in one `u32` (64 KiB in all).
struct DictIndex {
    slots: Vec<u32>,
}

const DICT_BITS: u32 = 14;
const NO_POS: u16 = u16::MAX;

impl DictIndex {
    fn build(dict: &[u8]) -> Self {
        assert!(
            dict.len() < usize::from(NO_POS),
            "the dictionary fits 16-bit offsets"
        );
        let mut first = vec![NO_POS; 1 << DICT_BITS];
        let mut last = vec![NO_POS; 1 << DICT_BITS];
        let mut at = 0;
        while at + WINDOW <= dict.len() {
            let slot = hash(read_window(dict, at), DICT_BITS);
            let pos = at as u16;
            if first[slot] == NO_POS {
                first[slot] = pos;
            } else {
                last[slot] = pos;
            }
            at += 1;
        }
        let slots = first
            .iter()
            .zip(&last)
            .map(|(&f, &l)| u32::from(f) | (u32::from(l) << 16))
            .collect();
        Self { slots }
    }

    fn candidates(&self, w: u64) -> [Option<usize>; 2] {
        let v = self.slots[hash(w, DICT_BITS)];
        let get = |p: u16| (p != NO_POS).then_some(usize::from(p));
        [get(v as u16), get((v >> 16) as u16)]
    }
}

static DICT_INDEX: std::sync::LazyLock<DictIndex> =
    std::sync::LazyLock::new(|| DictIndex::build(DICT_V1));

/// After this many probes without a match in a row, each further one steps a byte farther
/// (`accelerate`).
const MISSES_PER_EXTRA_BYTE: usize = 8;

/// The ops that rebuild `data` from `reference`, given a lookup of candidate positions in
/// `reference` for a window of `data` (each verified byte by byte), probing `data` at every
/// `step`-th position between matches; `None` when they would not be smaller than `data`.
///
/// `accelerate`: the step grows by a byte for every [`MISSES_PER_EXTRA_BYTE`] probes that
/// found nothing since the last match (LZ4's "acceleration"). Against the dictionary, a
/// line's long literal runs (texts, tool output, ids) rarely match anything, and probing
/// them at the same density as the framing costs the most CPU of the whole encoding. A run
/// that follows a long literal is still found when it is longer than the step then (the
/// match is extended backwards); shorter ones stay literals. Any choice of probes gives a
/// valid delta: decoding does not depend on it.
fn delta_against(
    data: &[u8],
    reference: &[u8],
    step: usize,
    accelerate: bool,
    capacity: usize,
    mut find: impl FnMut(u64) -> [Option<usize>; 2],
) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(capacity);
    let mut lit_start = 0;
    let mut i = 0;
    let mut misses = 0usize;
    while i + WINDOW <= data.len() {
        let mut best: Option<(usize, usize)> = None;
        for r in find(read_window(data, i)).into_iter().flatten() {
            let fwd = common_prefix(&data[i..], &reference[r..]);
            if fwd >= WINDOW && best.is_none_or(|(_, f)| fwd > f) {
                best = Some((r, fwd));
            }
        }
        if let Some((r, fwd)) = best {
            // Extend backwards into the pending literal.
            let back = data[lit_start..i]
                .iter()
                .rev()
                .zip(reference[..r].iter().rev())
                .take_while(|(a, b)| a == b)
                .count();
            let len = fwd + back;
            if len >= MIN_MATCH {
                put_literal(&mut out, &data[lit_start..i - back]);
                put_varint(&mut out, ((len as u64) << 1) | 1);
                put_varint(&mut out, (r - back) as u64);
                i += fwd;
                lit_start = i;
                misses = 0;
                if out.len() >= data.len() {
                    return None;
                }
                continue;
            }
        }
        i += if accelerate {
            misses += 1;
            step + misses / MISSES_PER_EXTRA_BYTE
        } else {
            step
        };
    }
    put_literal(&mut out, &data[lit_start..]);
    (out.len() < data.len()).then_some(out)
}

/// Applies a delta written by [`delta`]; every bound is checked (the column may be damaged).
fn undelta(d: &[u8], raw: &[u8]) -> Result<Vec<u8>> {
    let bad = |what: &str| Error::InvalidData(format!("damaged payload delta: {what}"));
    let mut out = Vec::with_capacity(d.len() * 4);
    let mut at = 0;
    while at < d.len() {
        let tag = get_varint(d, &mut at)?;
        let len = usize::try_from(tag >> 1).map_err(|_| bad("length"))?;
        if tag & 1 == 0 {
            let end = at.checked_add(len).ok_or_else(|| bad("length"))?;
            let lit = d.get(at..end).ok_or_else(|| bad("literal past the end"))?;
            out.extend_from_slice(lit);
            at = end;
        } else {
            let off = usize::try_from(get_varint(d, &mut at)?).map_err(|_| bad("offset"))?;
            let end = off.checked_add(len).ok_or_else(|| bad("offset"))?;
            let run = raw
                .get(off..end)
                .ok_or_else(|| bad("copy past the raw line"))?;
            out.extend_from_slice(run);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(payload: &[u8], raw: &[u8]) -> (i64, usize) {
        let (codec, stored) = encode(payload, Some(raw));
        let stored = stored.unwrap_or_else(|| payload.to_vec());
        let (back, back_raw) = decode_row(codec, &stored, Some(raw)).expect("decodes");
        assert_eq!(back, payload);
        assert_eq!(back_raw.as_deref(), Some(raw));
        (codec, stored.len())
    }

    #[test]
    fn a_payload_made_of_the_raw_line_shrinks_to_a_few_bytes() {
        let text = "lorem ipsum dolor sit amet ".repeat(40);
        let raw = format!(
            r#"{{"type":"assistant","message":{{"id":"msg_01","content":[{{"type":"text","text":"{text}"}}]}},"session_id":"abc"}}"#
        );
        let payload = format!(r#"{{"message_id":"msg_01","index":0,"text":"{text}"}}"#);
        let (codec, len) = round_trip(payload.as_bytes(), raw.as_bytes());
        assert_eq!(codec, CODEC_DELTA);
        assert!(len < payload.len() / 10, "{len} of {}", payload.len());
    }

    /// Each window of the raw line is indexed at its earliest position: a long run of one
    /// repeated byte (indentation, padding) is one copy from its start, not dozens of short
    /// copies or literals.
    #[test]
    fn a_long_repeated_run_is_copied_from_its_start() {
        let raw = [b' '; 300];
        let d = delta(&raw[..290], &raw).expect("a delta");
        // One op: the tag (290 << 1 | 1) and the offset 0.
        assert_eq!(d, [0xc5, 0x04, 0x00]);
        assert_eq!(undelta(&d, &raw).expect("decodes"), &raw[..290]);
    }

    #[test]
    fn unrelated_or_tiny_payloads_stay_plain_and_round_trip() {
        assert_eq!(round_trip(b"{}", b"{\"type\":\"x\"}").0, CODEC_PLAIN);
        let raw: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
        let payload: Vec<u8> = (0..3000u32).map(|i| (i * 13 % 241) as u8 ^ 0x55).collect();
        round_trip(&payload, &raw);
        assert_eq!(encode(b"abcdefghijklmnop", None), (CODEC_PLAIN, None));
    }

    #[test]
    fn runs_are_found_at_every_alignment_of_the_sparse_index() {
        let mut seed = 0x0bad_cafe_u64;
        let raw: Vec<u8> = (0..600)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (seed >> 56) as u8
            })
            .collect();
        let mut shortest_found = 0;
        for off in 100..132 {
            // One run of 40 bytes from the raw line, at every offset modulo the index step:
            // one copy op (a tag and an offset), a few bytes.
            let (codec, len) = round_trip(&raw[off..off + 40], &raw);
            assert_eq!(codec, CODEC_DELTA, "offset {off}");
            assert!(len <= 4, "offset {off}: {len} bytes");
            // The shortest run worth copying, behind a literal, holds exactly one indexed
            // window: found unless that window's slot was taken by an earlier one (a hash
            // collision, which loses compression, never data).
            let mut p = b"##".to_vec();
            p.extend_from_slice(&raw[off..off + MIN_MATCH]);
            let (codec, len) = round_trip(&p, &raw);
            if codec == CODEC_DELTA {
                assert!(len <= 6, "offset {off}: {len} bytes");
                shortest_found += 1;
            }
        }
        assert!(shortest_found >= 28, "{shortest_found} of 32 found");
    }

    /// A whole event through the store's encoding and back, with what it cost.
    fn event_round_trip(payload: &[u8], raw: Option<&[u8]>) -> (i64, usize) {
        let ev = EncodedEvent::new(NewEvent {
            kind: Cow::Borrowed("k"),
            ts_ms: 0,
            payload: Bytes::copy_from_slice(payload),
            raw: raw.map(Bytes::copy_from_slice),
        });
        let (back, back_raw) =
            decode_row(ev.codec, &ev.payload, ev.raw.as_deref()).expect("decodes");
        assert_eq!(back, payload);
        assert_eq!(back_raw.as_deref(), raw);
        (ev.codec, ev.payload.len() + ev.raw.map_or(0, |r| r.len()))
    }

    #[test]
    fn cli_lines_are_stored_against_the_dictionary_and_payloads_against_them() {
        // A line of a release newer than the dictionary (the fake CLI's 2.1.330 shapes,
        // keys in another order, other ids): still mostly copies.
        let raw = br#"{"message":{"content":[{"text":"Firehose line 0: the fake model keeps talking.","type":"text"}],"context_management":null,"id":"msg_fh_1_0","model":"claude-opus-5-5","role":"assistant","stop_reason":null,"stop_sequence":null,"type":"message","usage":{"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"input_tokens":120,"output_tokens":1}},"parent_tool_use_id":null,"request_id":"request-1","session_id":"e363fd03-9a92-4cc3-8059-d9ae42cc72e8","timestamp":"1970-01-01T00:00:00.000Z","type":"assistant","uuid":"00000000-0000-4000-8000-000000000019"}"#;
        let payload = br#"{"message_id":"msg_fh_1_0","index":0,"model":"claude-opus-5-5","block":{"type":"text","text":"Firehose line 0: the fake model keeps talking."},"usage":{"input_tokens":120,"output_tokens":1,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}"#;
        let (codec, stored) = event_round_trip(payload, Some(raw));
        assert_eq!(codec, PAYLOAD_FROM_RAW | RAW_FROM_DICT);
        assert!(
            stored * 10 < raw.len() * 7,
            "{stored} bytes for a {} byte line",
            raw.len()
        );

        // An event without a raw line: its payload against the dictionary.
        let notice = br#"{"source_type":"system","subtype":"status","fields":{"session_id":"e363fd03-9a92-4cc3-8059-d9ae42cc72e8","status":"requesting","subtype":"status","type":"system","uuid":"00000000-0000-4000-8000-000000000003"},"detail":{"type":"status","status":"requesting"}}"#;
        let (codec, stored) = event_round_trip(notice, None);
        assert_eq!(codec, PAYLOAD_FROM_DICT);
        assert!(stored < notice.len(), "{stored} of {}", notice.len());

        // What the dictionary cannot shorten is stored as is.
        let (codec, stored) = event_round_trip(b"{}", Some(b"\x00\x01"));
        assert_eq!((codec, stored), (CODEC_PLAIN, 2 + 2));
        let noise: Vec<u8> = (0..3000u32)
            .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        assert_eq!(
            event_round_trip(&noise, Some(&noise[..1000])).0 & RAW_FROM_DICT,
            0
        );
        assert_eq!(event_round_trip(&noise, None).0, CODEC_PLAIN);
    }

    #[test]
    fn a_tool_results_structured_result_is_copied_from_its_line_not_stored_twice() {
        // A 2.1.332 Bash result: the output is in the block's `content` and again in the
        // frame's `tool_use_result`; the payload carries both verbatim (as the decoder
        // keeps them), so they cost copy ops against the line, not their bytes.
        let out = "line of output from the tool\\n".repeat(60);
        let raw = format!(
            r#"{{"type":"user","message":{{"role":"user","content":[{{"tool_use_id":"toolu_b1","type":"tool_result","content":"{out}","is_error":false}}]}},"parent_tool_use_id":null,"session_id":"a9e0c099-ec1b-432c-9c49-b4f3147e068e","uuid":"b976dd7b-fc0d-4fc1-ae40-0db6479d8bf9","timestamp":"2026-11-29T22:06:33.742Z","tool_use_result":{{"stdout":"{out}","stderr":"","interrupted":false,"isImage":false,"noOutputExpected":false}},"tool_result_meta":[{{"id":"toolu_b1","permission_decision":{{"decision":"accept","source":"config","reason_type":"subcommandResults"}}}}]}}"#
        );
        let without = format!(
            r#"{{"tool_use_id":"toolu_b1","content":{{"type":"text","value":"{out}"}},"is_error":false}}"#
        );
        let with = format!(
            r#"{{"tool_use_id":"toolu_b1","content":{{"type":"text","value":"{out}"}},"is_error":false,"tool_use_result":{{"stdout":"{out}","stderr":"","interrupted":false,"isImage":false,"noOutputExpected":false}},"tool_result_meta":[{{"id":"toolu_b1","permission_decision":{{"decision":"accept","source":"config","reason_type":"subcommandResults"}}}}]}}"#
        );
        let (codec, before) = round_trip(without.as_bytes(), raw.as_bytes());
        assert_eq!(codec, CODEC_DELTA);
        let (codec, after) = round_trip(with.as_bytes(), raw.as_bytes());
        assert_eq!(codec, CODEC_DELTA);
        eprintln!(
            "payload {} B stored as {after} B ({before} B without the fields)",
            with.len()
        );
        assert!(
            after < before + 48,
            "{after} bytes with the fields, {before} without ({} byte output)",
            out.len()
        );
    }

    /// A deterministic pseudo-random sequence (xorshift64) from `seed`.
    fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        }
    }

    #[test]
    fn any_bytes_round_trip() {
        // Deterministic pseudo-random payloads that mix copied runs, edits and literals,
        // including lines over the hash table's size and runs at both ends.
        let mut next = xorshift(0x1234_5678_9abc_def0u64);
        for round in 0..200 {
            let n = (next() % if round % 20 == 0 { 200_000 } else { 3000 }) as usize;
            let raw: Vec<u8> = (0..n).map(|_| (next() % 6) as u8 + b'a').collect();
            let mut payload = Vec::new();
            while payload.len() < n {
                match next() % 3 {
                    0 if !raw.is_empty() => {
                        let off = (next() as usize) % raw.len();
                        let len = (next() as usize % 300).min(raw.len() - off);
                        payload.extend_from_slice(&raw[off..off + len]);
                    }
                    _ => payload.extend((0..next() % 20).map(|_| next() as u8)),
                }
            }
            round_trip(&payload, &raw);
        }
    }

    #[test]
    fn dictionary_deltas_round_trip() {
        // Pieces of the dictionary's own lines (so that probes find runs, also right after
        // runs and at the very end) cut at random places, between random bytes and quotes,
        // as payloads without a raw line and as raw lines with payloads against them.
        let mut next = xorshift(0x005e_ed0f_d1c7_u64);
        let mut shrunk = 0;
        for round in 0..300 {
            let n = (next() % if round % 50 == 0 { 100_000 } else { 2000 }) as usize;
            let mut data = Vec::with_capacity(n);
            while data.len() < n {
                match next() % 3 {
                    0 => {
                        let off = (next() as usize) % DICT_V1.len();
                        let len = (next() as usize % 200).min(DICT_V1.len() - off);
                        data.extend_from_slice(&DICT_V1[off..off + len]);
                    }
                    1 => data.extend((0..next() % 4).map(|_| b'"')),
                    _ => data.extend((0..next() % 30).map(|_| next() as u8)),
                }
            }
            let (codec, stored) = event_round_trip(&data, None);
            if codec == PAYLOAD_FROM_DICT {
                assert!(stored < data.len());
                shrunk += 1;
            }
            event_round_trip(&data[data.len() / 3..], Some(&data));
        }
        assert!(shrunk >= 250, "{shrunk} of 300 shrunk");
    }

    #[test]
    fn damaged_deltas_are_errors_not_panics() {
        let raw = b"0123456789abcdefghijklmnopqrstuvwxyz";
        for bad in [
            &[0x03, 0x00][..], // copy of 1 byte without... offset 0 is fine; see below
            &[0x81][..],       // truncated varint
            &[0x04, b'a'][..], // literal past the end
            &[0x41, 0x30][..], // copy past the raw line (len 32 at 48)
            &[0xff; 11][..],   // overlong varint
        ] {
            let r = decode_row(CODEC_DELTA, bad, Some(raw)).map(|(p, _)| p);
            if bad == [0x03, 0x00] {
                assert_eq!(r.expect("valid"), &b"0"[..]);
            } else {
                assert!(matches!(r, Err(Error::InvalidData(_))), "{bad:?}: {r:?}");
            }
        }
        assert!(matches!(
            decode_row(CODEC_DELTA, &[0x00], None),
            Err(Error::InvalidData(_))
        ));
        // Both payload references, an unknown bit, a dictionary raw line that is missing
        // or copies past the dictionary's end.
        for (codec, raw) in [
            (PAYLOAD_FROM_RAW | PAYLOAD_FROM_DICT, Some(&raw[..])),
            (8, Some(&raw[..])),
            (RAW_FROM_DICT, None),
            (RAW_FROM_DICT, Some(&[0xc1, 0x01, 0xff, 0xff, 0x03][..])),
            (PAYLOAD_FROM_DICT, None),
        ] {
            let payload: &[u8] = if codec == PAYLOAD_FROM_DICT {
                &[0xc1, 0x01, 0xff, 0xff, 0x03]
            } else {
                b"x"
            };
            assert!(
                matches!(decode_row(codec, payload, raw), Err(Error::InvalidData(_))),
                "codec {codec}"
            );
        }
    }
}
