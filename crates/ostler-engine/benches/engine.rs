//! Engine benchmarks (ratios against a baseline measured in the same run).
//!
//! - `replay_100k/store_pages` (baseline): reading all 100,000 stored events of one session
//!   straight from the store in pages of 512, without decoding.
//! - `replay_100k/subscribe`: the same events through `Engine::subscribe` (no follow):
//!   store pages + canonical payload decoding + `Arc<EngineEvent>`s, as a client replay.
//! - `publish/append_only` (baseline): one event appended and committed.
//! - `publish/persist_then_publish_1_subs` and `..._8_subs`: one event through a session's
//!   hub (`Engine::record_notice`: append, commit, broadcast) until every following
//!   subscriber has received it.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ostler_engine::{Engine, EngineNotice, EngineOptions, EventPayload, SubscribeRequest};
use ostler_store::{NewEvent, NewSession, Store, StoreOptions};
use ostler_supervisor::Installation;

const EVENTS: u64 = 100_000;

fn assistant(n: u64) -> EventPayload {
    EventPayload::AssistantBlock(ostler_protocol::AssistantBlock {
        message_id: Some(format!("msg_{n}")),
        index: 0,
        parent_tool_use_id: None,
        model: Some("claude-test".into()),
        block: ostler_protocol::ContentBlock::Text {
            text: "lorem ipsum dolor sit amet ".repeat(9),
        },
        stop_reason: None,
        usage: None,
        error: None,
        agent_id: None,
        subagent_type: None,
        task_description: None,
    })
}

fn setup(rt: &tokio::runtime::Runtime) -> (tempfile::TempDir, Store, Engine) {
    let dir = tempfile::tempdir().expect("tmp");
    let store = Store::open(dir.path().join("bench.db"), StoreOptions::default()).expect("store");
    let payload = serde_json::to_vec(&assistant(1)).expect("json");
    rt.block_on(async {
        store
            .create_session(NewSession {
                id: "s".into(),
                cwd: "/".into(),
                state: ostler_store::SessionState::Stopped,
                labels: BTreeMap::new(),
                ..Default::default()
            })
            .await
            .expect("session");
        for chunk in 0..(EVENTS / 1000) {
            let batch = (0..1000)
                .map(|i| {
                    NewEvent::new(
                        "assistant_block",
                        payload.clone(),
                        (chunk * 1000 + i) as i64,
                    )
                })
                .collect();
            store.append("s", batch).await.expect("append");
        }
    });
    // No process is spawned by these benchmarks: the installation is never run.
    let inst = Installation::assume(
        "/nonexistent/claude".into(),
        semver::Version::new(2, 1, 330),
        None,
    );
    let engine = rt
        .block_on(Engine::start(EngineOptions::default(), store.clone(), inst))
        .expect("engine");
    (dir, store, engine)
}

fn replay(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("rt");
    let (_dir, store, engine) = setup(&rt);
    let mut g = c.benchmark_group("replay_100k");
    g.sample_size(10).throughput(Throughput::Elements(EVENTS));
    g.bench_function("store_pages", |b| {
        b.iter(|| {
            let mut after = 0;
            loop {
                let page = store.events_after("s", after, 512).expect("read");
                match page.last() {
                    Some(e) => after = e.seq,
                    None => break,
                }
                black_box(&page);
            }
            assert_eq!(after, EVENTS);
        })
    });
    g.bench_function("subscribe", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut sub = engine
                    .subscribe(SubscribeRequest {
                        session_id: "s".into(),
                        after_seq: 0,
                        include_partials: false,
                        follow: false,
                    })
                    .await
                    .expect("subscribe");
                let mut n = 0u64;
                while let Some(ev) = sub.next().await {
                    black_box(ev.expect("event"));
                    n += 1;
                }
                assert_eq!(n, EVENTS);
            })
        })
    });
    g.finish();
}

fn publish(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("rt");
    let (_dir, store, engine) = setup(&rt);
    let mut g = c.benchmark_group("publish");
    g.measurement_time(Duration::from_secs(5));
    let payload = serde_json::to_vec(&EventPayload::EngineNotice(notice())).expect("json");
    g.bench_function("append_only", |b| {
        b.iter(|| {
            rt.block_on(async {
                store
                    .append(
                        "s",
                        vec![NewEvent::new("engine_notice", payload.clone(), 0)],
                    )
                    .await
                    .expect("append")
            })
        })
    });
    for subs in [1usize, 8] {
        g.bench_function(format!("persist_then_publish_{subs}_subs"), |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let last = store.last_seq("s").expect("last");
                    let mut acks = Vec::new();
                    for _ in 0..subs {
                        let mut sub = engine
                            .subscribe(SubscribeRequest {
                                session_id: "s".into(),
                                after_seq: last,
                                include_partials: false,
                                follow: true,
                            })
                            .await
                            .expect("subscribe");
                        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<u64>();
                        tokio::spawn(async move {
                            for _ in 0..iters {
                                let ev = sub.next().await.expect("open").expect("event");
                                let _ = tx.send(ev.seq.unwrap_or_default());
                            }
                        });
                        acks.push(rx);
                    }
                    let start = Instant::now();
                    for _ in 0..iters {
                        let seq = engine.record_notice("s", notice()).await.expect("emit");
                        // Until every follower has it.
                        for rx in &mut acks {
                            assert_eq!(rx.recv().await, Some(seq));
                        }
                    }
                    start.elapsed()
                })
            })
        });
    }
    g.finish();
}

fn notice() -> EngineNotice {
    EngineNotice {
        code: "bench".into(),
        message: "lorem ipsum dolor sit amet ".repeat(9),
        data: None,
    }
}

criterion_group!(benches, replay, publish);
criterion_main!(benches);
