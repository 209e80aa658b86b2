//! Decoding speed over the recorded corpus (`contracts/claude-code/*/*.ndjson`, the CLI's
//! own lines), next to a bare `serde_json::from_slice::<Value>` loop over the same lines in
//! the same run. Falls back to the crate's captured fixtures if there are no recordings.
//!
//! `cargo bench -p ostler-protocol --bench decode`

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
use std::hint::black_box;
use std::path::Path;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ostler_protocol::framing::{FramerOptions, LineFramer};
use ostler_protocol::recording::{self, Dir, Entry};
use ostler_protocol::{Decoder, Event};

struct Stream {
    release: Option<semver::Version>,
    /// The CLI's lines, `\n`-terminated, as it wrote them.
    bytes: Bytes,
    lines: usize,
}

fn corpus() -> Vec<Stream> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(root.join("../../contracts/claude-code"))
        .into_iter()
        .flatten()
        .flatten()
        .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
        .map(|f| f.path())
        .filter(|p| p.extension().is_some_and(|e| e == "ndjson"))
        .collect();
    files.sort();
    for path in files {
        let text = std::fs::read(&path).unwrap();
        let mut lines = text.split(|b| *b == b'\n').filter(|l| !l.is_empty());
        let Some(header) = lines.next().and_then(recording::parse_header) else {
            continue;
        };
        let mut bytes = Vec::new();
        let mut n = 0;
        for l in lines {
            if let Entry::Line {
                dir: Dir::Cli,
                line,
            } = recording::parse_entry(&Bytes::copy_from_slice(l))
            {
                bytes.extend_from_slice(&line);
                bytes.push(b'\n');
                n += 1;
            }
        }
        out.push(Stream {
            release: header.release_version(),
            bytes: bytes.into(),
            lines: n,
        });
    }
    if out.is_empty() {
        for entry in std::fs::read_dir(root.join("tests/fixtures"))
            .unwrap()
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            let release =
                ostler_protocol::adapter::parse_release(name.split('-').next().unwrap_or_default());
            let bytes = std::fs::read(entry.path()).unwrap();
            let lines = bytes.iter().filter(|b| **b == b'\n').count();
            out.push(Stream {
                release,
                bytes: bytes.into(),
                lines,
            });
        }
    }
    out
}

fn decode_all(corpus: &[Stream]) -> usize {
    let mut n = 0;
    let mut frames = Vec::new();
    for s in corpus {
        let mut framer = LineFramer::new(FramerOptions::default());
        let mut decoder = Decoder::for_release(s.release.as_ref());
        framer.push_bytes(s.bytes.clone(), &mut frames);
        framer.finish(&mut frames);
        for f in frames.drain(..) {
            let d = decoder.decode(f);
            n += d.events.len();
            black_box(d);
        }
    }
    n
}

fn value_loop(corpus: &[Stream]) -> usize {
    let mut n = 0;
    for s in corpus {
        for line in s.bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let v: serde_json::Value = serde_json::from_slice(line).unwrap();
            black_box(v);
            n += 1;
        }
    }
    n
}

/// The same corpus without lines over 64 KiB (the big-answer recordings): typical traffic,
/// where per-line overhead rather than string scanning dominates.
fn small_lines(corpus: &[Stream]) -> Vec<Stream> {
    corpus
        .iter()
        .map(|s| {
            let mut bytes = Vec::new();
            let mut lines = 0;
            for l in s
                .bytes
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty() && l.len() <= 64 * 1024)
            {
                bytes.extend_from_slice(l);
                bytes.push(b'\n');
                lines += 1;
            }
            Stream {
                release: s.release.clone(),
                bytes: bytes.into(),
                lines,
            }
        })
        .collect()
}

/// On a loaded machine, criterion's sequential measurements of two functions drift apart;
/// alternating the two loops round by round gives a steadier ratio. Printed next to the
/// criterion results (median over the rounds).
fn interleaved_ratio(name: &str, corpus: &[Stream], bytes: usize, events: usize) {
    use std::time::Instant;
    let rounds = 41;
    let mut ours = Vec::with_capacity(rounds);
    let mut base = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        black_box(decode_all(corpus));
        ours.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        black_box(value_loop(corpus));
        base.push(t.elapsed().as_secs_f64());
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (o, b) = (median(&mut ours), median(&mut base));
    eprintln!(
        "interleaved {name}: ostler_decode {:.1} MiB/s {:.0} events/s; serde_json::Value {:.1} MiB/s; time ratio ostler/value = {:.2}",
        bytes as f64 / o / 1048576.0,
        events as f64 / o,
        bytes as f64 / b / 1048576.0,
        o / b
    );
}

fn bench(c: &mut Criterion) {
    let corpus = corpus();
    let small = small_lines(&corpus);
    bench_corpus(c, "all", &corpus);
    bench_corpus(c, "small", &small);
}

fn bench_corpus(c: &mut Criterion, name: &str, corpus: &[Stream]) {
    let total_bytes: usize = corpus.iter().map(|s| s.bytes.len()).sum();
    let total_lines: usize = corpus.iter().map(|s| s.lines).sum();
    let total_events = decode_all(corpus);
    // Sanity: the corpus decodes without diagnostics.
    let mut diags = 0;
    for s in corpus {
        let mut d = Decoder::for_release(s.release.as_ref());
        for line in s.bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let mut ev = Vec::new();
            d.decode_into(line, &mut ev);
            diags += ev
                .iter()
                .filter(|e| matches!(e, Event::Diagnostic(_)))
                .count();
        }
    }
    eprintln!(
        "corpus {name}: {} streams, {total_bytes} bytes, {total_lines} lines, {total_events} events, {diags} diagnostics",
        corpus.len()
    );

    interleaved_ratio(name, corpus, total_bytes, total_events);

    let mut g = c.benchmark_group(format!("{name}/{}", "bytes"));
    g.throughput(Throughput::Bytes(total_bytes as u64));
    g.bench_function("ostler_decode", |b| b.iter(|| decode_all(corpus)));
    g.bench_function("serde_json_value", |b| b.iter(|| value_loop(corpus)));
    g.finish();

    let mut g = c.benchmark_group(format!("{name}/{}", "events"));
    g.throughput(Throughput::Elements(total_events as u64));
    g.bench_function("ostler_decode", |b| b.iter(|| decode_all(corpus)));
    g.finish();

    let mut g = c.benchmark_group(format!("{name}/{}", "lines"));
    g.throughput(Throughput::Elements(total_lines as u64));
    g.bench_function("ostler_decode", |b| b.iter(|| decode_all(corpus)));
    g.bench_function("serde_json_value", |b| b.iter(|| value_loop(corpus)));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
