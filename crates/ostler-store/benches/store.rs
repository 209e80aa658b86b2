//! Store benchmarks.
//!
//! - `append/*`: 16 producer threads (think: 16 busy sessions), each appending one event at
//!   a time and waiting for its commit before the next. `group` lets the writer put
//!   everything queued into one transaction (the default); `per_append` forces one
//!   transaction per append (`max_batch = 1`), the baseline. Both with `synchronous=NORMAL`
//!   (the default) and `FULL`.
//! - `read/100k_events`: reading all 100,000 events of one session in pages of 1,000.
//!
//! Numbers and ratios are recorded in docs/performance.md ("## Store (ostler-store)").

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use ostler_store::{NewEvent, NewSession, Store, StoreOptions, Synchronous};

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
        state: "running".into(),
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

fn bench_append(c: &mut Criterion) {
    let mut group = c.benchmark_group("append");
    group.throughput(Throughput::Elements(
        (PRODUCERS * APPENDS_PER_PRODUCER) as u64,
    ));
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(4));
    for (sync_name, sync) in [("normal", Synchronous::Normal), ("full", Synchronous::Full)] {
        for (mode, max_batch) in [("group", 1024usize), ("per_append", 1usize)] {
            let dir = tempfile::tempdir().expect("tempdir");
            let store = Arc::new(open(
                &dir,
                "append.db",
                StoreOptions {
                    synchronous: sync,
                    max_batch,
                    ..StoreOptions::default()
                },
            ));
            group.bench_function(BenchmarkId::new(mode, sync_name), |b| {
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
    }
    group.finish();
}

fn bench_read(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path().join("read.db"), StoreOptions::default()).expect("open");
    store
        .create_session(session("big"))
        .wait()
        .expect("session");
    store
        .create_session(session("other"))
        .wait()
        .expect("session");
    let mut n = 0;
    while n < READ_EVENTS {
        let events = (n..n + 1000).map(event).collect();
        store.append_blocking("big", events).expect("append");
        // Another session's events interleaved, as in a busy daemon.
        store
            .append_blocking("other", (0..100).map(event).collect())
            .expect("append");
        n += 1000;
    }
    let mut group = c.benchmark_group("read");
    group.throughput(Throughput::Elements(READ_EVENTS));
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("100k_events", |b| {
        b.iter(|| {
            let mut after = 0;
            let mut bytes = 0usize;
            loop {
                let page = store.events_after("big", after, 1000).expect("read");
                let Some(last) = page.last() else { break };
                after = last.seq;
                bytes += page.iter().map(|e| e.payload.len()).sum::<usize>();
            }
            assert_eq!(after, READ_EVENTS);
            black_box(bytes)
        });
    });
    group.finish();
}

criterion_group!(benches, bench_append, bench_read);
criterion_main!(benches);
