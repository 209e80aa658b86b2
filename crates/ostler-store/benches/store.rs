//! Store benchmarks.
//!
//! - `append_pipelined/*`: one producer queues 2,000 single-event appends, then waits for all.
//!   `group` lets the writer put everything queued into one transaction (the default);
//!   `per_append` forces one transaction per append (`max_batch = 1`), the baseline. Both
//!   with `synchronous=NORMAL` (the default) and `FULL`.
//! - `append_16_sessions/*`: 16 producer threads (16 busy sessions), each appending one event
//!   at a time and waiting for its commit before the next; group vs per-append.
//! - `append_latency/single_event_normal`: one append on an idle store, until committed.
//! - `read/100k_events`, `read/1m_events` (not with `--quick`): reading all events of one
//!   session in pages of 1,000 (replay through the store's read path); the setup prints the
//!   database bytes per stored event next to the raw line's size.
//!
//! - `codec/*`: encoding recorded events as the store does on the appending thread (the
//!   canonical payload as a delta against its CLI line, the line against the built-in
//!   dictionary), next to a `serde_json::Value` parse of the same lines
//!   (`codec/value_parse_of_the_lines`), the baseline of issue 13;
//!   `codec/encode_long_tool_result`: one 32 KiB tool result line (its text literals for the
//!   dictionary, copies for the payload).
//!
//! - `rows/*`: a bare SQLite loop (no ostler code), 10,000 events of ~250 B (the size the
//!   store's codec leaves of a firehose line) in transactions of 64 events, with 1, 16 or 64
//!   events per row, WAL without automatic checkpoints (the store's checkpointer runs on its
//!   own thread): what the insert costs per event when a row holds one event, as today, or
//!   many (issue 13's item a; docs/performance.md "Session 21").
//!
//! Numbers and ratios are recorded in docs/performance.md ("## Store (ostler-store)").

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ostler_store::{NewEvent, NewSession, SessionState, Store, StoreOptions, Synchronous};

const PRODUCERS: usize = 16;
const APPENDS_PER_PRODUCER: usize = 125;
const READ_EVENTS: u64 = 100_000;

fn payload(n: u64) -> Vec<u8> {
    // About the size of a typical canonical assistant-text event.
    format!(
        "{{\"type\":\"assistant_block\",\"n\":{n},\"block\":{{\"type\":\"text\",\"text\":\"{}\"}}}}",
        "lorem ipsum dolor sit amet ".repeat(9)
    )
    .into_bytes()
}

fn raw(n: u64) -> Vec<u8> {
    // About the size of the CLI line it came from.
    format!(
        "{{\"type\":\"assistant\",\"message\":{{\"id\":\"msg_{n}\",\"content\":[{{\"type\":\"text\",\"text\":\"{}\"}}],\"usage\":{{\"input_tokens\":12,\"output_tokens\":40}}}},\"session_id\":\"5f0c1d2e-0000-4000-8000-000000000000\"}}",
        "lorem ipsum dolor sit amet ".repeat(12)
    )
    .into_bytes()
}

fn event(n: u64) -> NewEvent {
    NewEvent::new("assistant_block", payload(n), n as i64).with_raw(raw(n))
}

fn session(id: &str) -> NewSession {
    NewSession {
        id: id.into(),
        cwd: "/bench".into(),
        state: SessionState::Running,
        ..Default::default()
    }
}

fn open(dir: &tempfile::TempDir, name: &str, opts: StoreOptions) -> Store {
    let store = Store::open(dir.path().join(name), opts).expect("open");
    for p in 0..PRODUCERS {
        store
            .create_session(session(&format!("s{p}")))
            .wait()
            .expect("session");
    }
    store
}

fn store_for(dir: &tempfile::TempDir, sync: Synchronous, max_batch: usize) -> Store {
    open(
        dir,
        "append.db",
        StoreOptions {
            synchronous: sync,
            max_batch,
            ..StoreOptions::default()
        },
    )
}

const MODES: [(&str, usize); 2] = [("group", 1024), ("per_append", 1)];

/// One producer queues 2,000 single-event appends (pipelined, as a session actor that does
/// not wait for each commit would) and then waits for all of them.
fn bench_append_pipelined(c: &mut Criterion) {
    const N: u64 = 2000;
    let mut group = c.benchmark_group("append_pipelined");
    group.throughput(Throughput::Elements(N));
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    for (sync_name, sync) in [("normal", Synchronous::Normal), ("full", Synchronous::Full)] {
        for (mode, max_batch) in MODES {
            let dir = tempfile::tempdir().expect("tempdir");
            let store = store_for(&dir, sync, max_batch);
            group.bench_function(BenchmarkId::new(mode, sync_name), |b| {
                b.iter(|| {
                    let tickets: Vec<_> =
                        (0..N).map(|i| store.append("s0", vec![event(i)])).collect();
                    for t in tickets {
                        black_box(t.wait().expect("append"));
                    }
                });
            });
        }
    }
    group.finish();
}

/// 16 producer threads (16 busy sessions), each appending one event at a time and waiting
/// for its commit before the next.
fn bench_append_sessions(c: &mut Criterion) {
    let mut group = c.benchmark_group("append_16_sessions");
    group.throughput(Throughput::Elements(
        (PRODUCERS * APPENDS_PER_PRODUCER) as u64,
    ));
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    for (mode, max_batch) in MODES {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = store_for(&dir, Synchronous::Normal, max_batch);
        group.bench_function(BenchmarkId::new(mode, "normal"), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    std::thread::scope(|scope| {
                        for p in 0..PRODUCERS {
                            let store = &store;
                            scope.spawn(move || {
                                let sid = format!("s{p}");
                                for i in 0..APPENDS_PER_PRODUCER {
                                    let seqs = store
                                        .append_blocking(&sid, vec![event(i as u64)])
                                        .expect("append");
                                    black_box(seqs);
                                }
                            });
                        }
                    });
                    total += start.elapsed();
                }
                total
            });
        });
    }
    group.finish();
}

/// Latency of one append on an otherwise idle store: the time from `append` to the ticket
/// resolving (one transaction with one event, committed).
fn bench_latency(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(&dir, "latency.db", StoreOptions::default());
    let mut group = c.benchmark_group("append_latency");
    group.sample_size(20);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    let mut n = 0u64;
    group.bench_function("single_event_normal", |b| {
        b.iter(|| {
            n += 1;
            black_box(store.append_blocking("s0", vec![event(n)]).expect("append"))
        });
    });
    group.finish();
}

/// A store holding `events` events of session `big` (with another session's events
/// interleaved, as in a busy daemon), checkpointed. Prints the database bytes per stored
/// event next to the raw line's size (one copy per event, issue 13).
fn filled_store(dir: &tempfile::TempDir, events: u64) -> Store {
    let path = dir.path().join("read.db");
    let store = Store::open(&path, StoreOptions::default()).expect("open");
    store
        .create_session(session("big"))
        .wait()
        .expect("session");
    store
        .create_session(session("other"))
        .wait()
        .expect("session");
    let mut n = 0;
    let mut raw_bytes = 0u64;
    let mut tickets = Vec::new();
    while n < events {
        let batch: Vec<NewEvent> = (n..n + 1000).map(event).collect();
        raw_bytes += batch
            .iter()
            .map(|e| e.raw.as_ref().map_or(0, |r| r.len() as u64))
            .sum::<u64>();
        tickets.push(store.append("big", batch));
        tickets.push(store.append("other", (0..100).map(event).collect()));
        // Keep a bounded number of appends in flight.
        if tickets.len() >= 16 {
            for t in tickets.drain(..) {
                t.wait().expect("append");
            }
        }
        n += 1000;
    }
    for t in tickets {
        t.wait().expect("append");
    }
    store.wait_checkpointed(Duration::from_secs(600));
    let file = std::fs::metadata(&path).map_or(0, |m| m.len())
        + std::fs::metadata(path.with_extension("db-wal")).map_or(0, |m| m.len());
    let stored = events + events / 10;
    let line = raw_bytes as f64 / events as f64;
    eprintln!(
        "store of {stored} events: {:.0} B per event on disk, raw line {line:.0} B ({:.2}x), payload {} B",
        file as f64 / stored as f64,
        file as f64 / stored as f64 / line,
        payload(1).len()
    );
    store
}

fn read_all(store: &Store, expected: u64) -> usize {
    let mut after = 0;
    let mut bytes = 0usize;
    loop {
        let page = store.events_after("big", after, 1000).expect("read");
        let Some(last) = page.last() else { break };
        after = last.seq;
        bytes += page.iter().map(|e| e.payload.len()).sum::<usize>();
    }
    assert_eq!(after, expected);
    bytes
}

/// Replay through the store's read path: every event of one session, in pages of 1,000
/// (`events_after`), payloads rebuilt and copied out. 1M only without `--quick`.
fn bench_read(c: &mut Criterion) {
    let quick = std::env::args().any(|a| a == "--quick");
    let sizes: &[(&str, u64)] = if quick {
        &[("100k_events", READ_EVENTS)]
    } else {
        &[
            ("100k_events", READ_EVENTS),
            ("1m_events", 10 * READ_EVENTS),
        ]
    };
    for &(name, events) in sizes {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = filled_store(&dir, events);
        let mut group = c.benchmark_group("read");
        group.throughput(Throughput::Elements(events));
        group.sample_size(10);
        group.warm_up_time(Duration::from_secs(1));
        group.measurement_time(Duration::from_secs(if events > READ_EVENTS {
            30
        } else {
            5
        }));
        group.bench_function(name, |b| b.iter(|| black_box(read_all(&store, events))));
        group.finish();
    }
}

mod codec_pairs;

fn bench_codec(c: &mut Criterion) {
    let pairs = codec_pairs::PAIRS;
    let bytes: usize = pairs.iter().map(|(_, _, raw)| raw.len()).sum();
    let mut group = c.benchmark_group("codec");
    group.throughput(Throughput::Bytes(bytes as u64));
    group.bench_function("encode_recorded_pairs", |b| {
        b.iter(|| {
            pairs
                .iter()
                .map(|(_, payload, raw)| {
                    ostler_store::bench_support::encoded_len(
                        black_box(payload.as_bytes()),
                        black_box(raw.as_bytes()),
                    )
                })
                .sum::<usize>()
        })
    });
    group.bench_function("value_parse_of_the_lines", |b| {
        b.iter(|| {
            pairs
                .iter()
                .map(|(_, _, raw)| {
                    serde_json::from_slice::<serde_json::Value>(black_box(raw.as_bytes()))
                        .map_or(0, |v| v.as_object().map_or(0, |o| o.len()))
                })
                .sum::<usize>()
        })
    });
    group.finish();
    // One long line: a tool result of 32 KiB (a file's text), where nearly every byte is a
    // literal for the dictionary and a copy for the payload.
    let text: String = (0..)
        .map(|i| {
            format!(
                "{i:5}: let value_{i} = compute(&input[{i}..], {});\n",
                i * 7919 % 104729
            )
        })
        .scan(0usize, |len, l| {
            *len += l.len();
            (*len <= 32 * 1024).then_some(l)
        })
        .collect();
    let quoted = serde_json::to_string(&text).expect("a string");
    let payload = format!(
        r#"{{"tool_use_id":"toolu_long","content":{{"type":"text","value":{quoted}}},"is_error":false}}"#
    );
    let raw = format!(
        r#"{{"message":{{"content":[{{"content":{quoted},"is_error":false,"tool_use_id":"toolu_long","type":"tool_result"}}],"role":"user"}},"parent_tool_use_id":null,"session_id":"e363fd03-9a92-4cc3-8059-d9ae42cc72e8","type":"user","uuid":"2a0c3a4e-5f0e-4b8e-9a57-1f2f7e0c9d11"}}"#
    );
    let mut group = c.benchmark_group("codec");
    group.throughput(Throughput::Bytes(raw.len() as u64));
    group.bench_function("encode_long_tool_result", |b| {
        b.iter(|| {
            ostler_store::bench_support::encoded_len(
                black_box(payload.as_bytes()),
                black_box(raw.as_bytes()),
            )
        })
    });
    group.finish();
    eprintln!(
        "codec: long tool_result: payload {} B and its {} B line stored as {} B",
        payload.len(),
        raw.len(),
        ostler_store::bench_support::encoded_len(payload.as_bytes(), raw.as_bytes())
    );
    for (kind, payload, raw) in pairs {
        let stored = ostler_store::bench_support::encoded_len(payload.as_bytes(), raw.as_bytes());
        eprintln!(
            "codec: {kind}: payload {} B and its {} B line stored as {stored} B",
            payload.len(),
            raw.len()
        );
    }
}

/// See the module's text (`rows/*`).
fn bench_rows(c: &mut Criterion) {
    const EVENTS: usize = 10_000;
    const PER_TXN: usize = 64;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut bytes = |len: usize| -> Vec<u8> {
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 64 + 32) as u8
            })
            .collect()
    };
    let events: Vec<(Vec<u8>, Vec<u8>)> = (0..EVENTS).map(|_| (bytes(60), bytes(190))).collect();
    let mut group = c.benchmark_group("rows");
    group.throughput(Throughput::Elements(EVENTS as u64));
    for per_row in [1usize, 16, 64] {
        group.bench_function(BenchmarkId::new("events_per_row", per_row), |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let dir = tempfile::tempdir().expect("temp dir");
                    let conn =
                        rusqlite::Connection::open(dir.path().join("rows.db")).expect("open");
                    conn.execute_batch(
                        "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;
                         PRAGMA wal_autocheckpoint = 0;
                         CREATE TABLE events (id INTEGER PRIMARY KEY, kind TEXT NOT NULL,
                           ts_ms INTEGER NOT NULL, codec INTEGER NOT NULL,
                           payload BLOB NOT NULL, raw BLOB) STRICT;",
                    )
                    .expect("schema");
                    let (mut payload, mut raw) = (Vec::new(), Vec::new());
                    let start = Instant::now();
                    for (t, txn) in events.chunks(PER_TXN).enumerate() {
                        conn.execute_batch("BEGIN IMMEDIATE").expect("begin");
                        let mut insert = conn
                            .prepare_cached(
                                "INSERT INTO events (id, kind, ts_ms, codec, payload, raw)
                                 VALUES (?1, 'assistant_block', 1, 3, ?2, ?3)",
                            )
                            .expect("prepare");
                        for (r, row) in txn.chunks(per_row).enumerate() {
                            payload.clear();
                            raw.clear();
                            for (p, l) in row {
                                if per_row > 1 {
                                    payload.extend_from_slice(&(p.len() as u32).to_le_bytes());
                                    raw.extend_from_slice(&(l.len() as u32).to_le_bytes());
                                }
                                payload.extend_from_slice(p);
                                raw.extend_from_slice(l);
                            }
                            let id = (1i64 << 36) + (t * PER_TXN + r * per_row + 1) as i64;
                            insert
                                .execute(rusqlite::params![id, &payload[..], &raw[..]])
                                .expect("insert");
                        }
                        drop(insert);
                        conn.execute_batch("COMMIT").expect("commit");
                    }
                    total += start.elapsed();
                }
                total
            })
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    bench_rows,
    bench_codec,
    bench_append_pipelined,
    bench_append_sessions,
    bench_latency,
    bench_read
);
criterion_main!(benches);
