//! Idle sessions cost no process (issue 12): idle suspension, resume on demand, at most
//! `max_live_sessions` CLI processes (the least recently used idle session makes room).
//! Mostly on `ostler-fake-claude` (fast, supports `--resume`); one test on the real CLI.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{assert_seqs, is_turn_end, kinds, scenario, until};
use ostler_engine::*;
use ostler_store::{Store, StoreOptions};
use ostler_supervisor::Installation;
use ostler_testkit::timeouts::{guard, scaled};

/// `ostler-fake-claude` (built when missing).
async fn fake_claude() -> PathBuf {
    tokio::time::timeout(
        guard(),
        tokio::task::spawn_blocking(ostler_testkit::fake_bin::fake_claude_binary),
    )
    .await
    .expect("building ostler-fake-claude timed out")
    .expect("task")
    .expect("ostler-fake-claude")
}

/// An engine running sessions on the fake CLI.
struct Fake {
    _dir: tempfile::TempDir,
    cwd: PathBuf,
    home: PathBuf,
    store: Store,
    engine: Engine,
    opts: EngineOptions,
    installation: Installation,
}

impl Fake {
    async fn start(tweak: impl FnOnce(&mut EngineOptions)) -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        let cwd = base.join("work");
        let home = base.join("home");
        std::fs::create_dir_all(&cwd).unwrap();
        std::fs::create_dir_all(&home).unwrap();
        let store = Store::open(base.join("ostler.db"), StoreOptions::default()).unwrap();
        let mut opts = EngineOptions {
            spawn_env: vec![("HOME".into(), home.display().to_string())],
            idle_suspend: None,
            live_wait: guard(),
            ..Default::default()
        };
        opts.supervisor.stop_grace = ostler_testkit::timeouts::secs(3);
        opts.supervisor.stall_after = None;
        opts.supervisor.control_timeout = scaled(opts.supervisor.control_timeout);
        tweak(&mut opts);
        let installation =
            Installation::assume(fake_claude().await, semver::Version::new(2, 1, 330), None);
        let engine = Engine::start(opts.clone(), store.clone(), installation.clone())
            .await
            .unwrap();
        Fake {
            _dir: dir,
            cwd,
            home,
            store,
            engine,
            opts,
            installation,
        }
    }

    /// As if the daemon died: every engine handle dropped (the actors kill their processes
    /// and record nothing) and its actors ended (`Engine::abandon`), then a new engine on
    /// the same store.
    async fn restarted(self) -> Fake {
        let Fake {
            _dir,
            cwd,
            home,
            store,
            engine,
            opts,
            installation,
        } = self;
        common::abandon(engine).await;
        let engine = Engine::start(opts.clone(), store.clone(), installation.clone())
            .await
            .unwrap();
        Fake {
            _dir,
            cwd,
            home,
            store,
            engine,
            opts,
            installation,
        }
    }

    async fn session(&self, prompt: &str) -> SessionInfo {
        let created = tokio::time::timeout(
            guard(),
            self.engine.create_session(CreateSession {
                cwd: self.cwd.clone(),
                first_prompt: Some(MessageContent::Text(prompt.into())),
                client: ClientRef::new("creator"),
                ..Default::default()
            }),
        )
        .await;
        match created {
            Ok(r) => r.expect("create"),
            // Say what the engine looked like (a create stalled once in a busy CI run, and
            // "Elapsed" alone does not tell why).
            Err(_) => panic!(
                "create within the guard ({:?}): timed out; engine {:?}; {} fake CLI \
                 processes; sessions {:?}",
                guard(),
                self.engine.health().await,
                fake_processes(&self.cwd),
                self.engine
                    .list_sessions(Default::default())
                    .await
                    .map(|l| l
                        .sessions
                        .iter()
                        .map(|s| (s.id.clone(), s.state))
                        .collect::<Vec<_>>()),
            ),
        }
    }

    async fn send(&self, id: &str, text: &str) -> Result<SendOutcome> {
        tokio::time::timeout(
            guard(),
            self.engine.send_message(
                id,
                SendMessage {
                    content: MessageContent::Text(text.into()),
                    client_message_id: None,
                    client: ClientRef::new("tester"),
                    delivery: Default::default(),
                },
            ),
        )
        .await
        .expect("send within the guard")
    }

    async fn follow(&self, id: &str, after: u64) -> Subscription {
        self.engine
            .subscribe(SubscribeRequest {
                session_id: id.into(),
                after_seq: after,
                include_partials: false,
                follow: true,
            })
            .await
            .unwrap()
    }

    async fn history(&self, id: &str) -> Vec<Arc<EngineEvent>> {
        let mut sub = self
            .engine
            .subscribe(SubscribeRequest {
                session_id: id.into(),
                after_seq: 0,
                include_partials: false,
                follow: false,
            })
            .await
            .unwrap();
        let mut out = Vec::new();
        while let Some(ev) = sub.next().await {
            out.push(ev.unwrap());
        }
        out
    }

    /// Waits until the session has completed `n` turns (read from its log).
    async fn turns(&self, id: &str, n: usize) -> Vec<Arc<EngineEvent>> {
        let mut sub = self.follow(id, 0).await;
        let mut done = 0;
        let mut seen = Vec::new();
        while done < n {
            let (ev, _) = until(&mut sub, is_turn_end).await;
            seen.push(ev);
            done += 1;
        }
        seen
    }

    async fn state(&self, id: &str) -> SessionState {
        self.engine.get_session(id).await.unwrap().state
    }
}

/// Live `ostler-fake-claude` processes that are children of this test process and run in
/// `cwd` (zombies excluded: a reaped-to-be child is no longer running). The other tests of
/// this binary run at the same time with their own directories: their CLIs are not counted.
fn fake_processes(cwd: &Path) -> usize {
    let me = std::process::id().to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter(|d| {
            d.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|d| std::fs::read_link(d.path().join("cwd")).is_ok_and(|c| c == cwd))
        .filter_map(|d| std::fs::read_to_string(d.path().join("stat")).ok())
        .filter(|stat| {
            // pid (comm) state ppid ...
            let Some((head, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let comm = head.split_once('(').map(|(_, c)| c).unwrap_or_default();
            let mut f = rest.split_whitespace();
            let state = f.next().unwrap_or_default();
            let ppid = f.next().unwrap_or_default();
            comm.starts_with("ostler-fake") && state != "Z" && ppid == me
        })
        .count()
}

fn state_change(e: &EngineEvent, to: SessionState) -> bool {
    matches!(&e.payload, EventPayload::StateChanged(c) if c.to == to)
}

fn notices(evs: &[Arc<EngineEvent>], code: &str) -> usize {
    evs.iter()
        .filter(|e| matches!(&e.payload, EventPayload::EngineNotice(n) if n.code == code))
        .count()
}

fn count_kind(evs: &[Arc<EngineEvent>], kind: &str) -> usize {
    evs.iter().filter(|e| e.payload.kind() == kind).count()
}

fn result_text(e: &EngineEvent) -> String {
    match &e.payload {
        EventPayload::TurnCompleted(t) => t.result.clone().unwrap_or_default(),
        _ => String::new(),
    }
}

/// A small deterministic shuffle (xorshift), seeded and printed so a failure can be rerun.
fn shuffled<T>(mut v: Vec<T>, mut seed: u64) -> Vec<T> {
    for i in (1..v.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        v.swap(i, (seed % (i as u64 + 1)) as usize);
    }
    v
}

/// Issue 12 acceptance: 40 sessions, at most 10 live, one more message to each in random
/// order. Every turn completes (with its conversation: `fake:recall` answers with the
/// previous message), never more than 10 CLI processes run at once (the engine's live
/// count and the fake CLI's processes, sampled at every committed state change), each log
/// is gap-free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forty_sessions_take_turns_on_ten_live_processes() {
    const SESSIONS: usize = 40;
    const MAX_LIVE: usize = 10;
    let fx = Fake::start(|o| o.max_live_sessions = MAX_LIVE).await;

    // Sampler: at every state change committed to the feed, the engine's live count and
    // the fake CLI processes running. It is stopped with the feed cursor of the last state
    // change to sample, and samples until it got there (it can fall behind the feed on a
    // busy machine: each sample reads /proc).
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(None::<u64>);
    let sampler = {
        let engine = fx.engine.clone();
        let cwd = fx.cwd.clone();
        tokio::spawn(async move {
            let mut feed = engine.watch(WatchRequest {
                after_cursor: 0,
                follow: true,
                kinds: Some(vec![FeedKind::StateChanged]),
                ..Default::default()
            });
            let (mut samples, mut max_live, mut max_procs) = (0usize, 0u64, 0usize);
            let mut seen = 0;
            loop {
                tokio::select! {
                    item = feed.next() => {
                        let Some(item) = item else { break };
                        seen = item.expect("feed item").cursor;
                        let live = engine.health().await.expect("health").live_sessions;
                        let procs = fake_processes(&cwd);
                        samples += 1;
                        max_live = max_live.max(live);
                        max_procs = max_procs.max(procs);
                        if stop_rx.borrow().is_some_and(|last| seen >= last) {
                            break;
                        }
                    }
                    _ = stop_rx.changed() => {
                        if stop_rx.borrow().is_some_and(|last| seen >= last) {
                            break;
                        }
                    }
                }
            }
            (samples, max_live, max_procs)
        })
    };

    // 40 sessions created at once: past 10, each creation suspends an idle one (or waits
    // for one to become idle).
    let creates = (0..SESSIONS).map(|i| {
        let fx = &fx;
        async move { fx.session(&format!("first message of session {i}")).await }
    });
    let sessions: Vec<SessionInfo> = futures::future::join_all(creates).await;
    let ids: Vec<String> = sessions.iter().map(|s| s.id.clone()).collect();
    for id in &ids {
        fx.turns(id, 1).await;
    }

    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("shuffle seed {seed}");
    let order = shuffled(ids.clone(), seed);
    let sends = order.iter().map(|id| {
        let fx = &fx;
        async move {
            fx.send(id, "fake:recall")
                .await
                .unwrap_or_else(|e| panic!("send to {id}: {e}"))
        }
    });
    futures::future::join_all(sends).await;

    for (i, id) in ids.iter().enumerate() {
        let turns = fx.turns(id, 2).await;
        assert_eq!(
            result_text(&turns[1]),
            format!("first message of session {i}"),
            "session {id} answered without its conversation"
        );
        let hist = fx.history(id).await;
        assert_seqs(&hist, 1, hist.len() as u64);
        assert_eq!(
            count_kind(&hist, "user_message_sent"),
            2,
            "{:?}",
            kinds(&hist)
        );
        assert_eq!(count_kind(&hist, "turn_completed"), 2, "{:?}", kinds(&hist));
    }
    // The last state change committed so far: the sampler stops once it sampled it.
    let mut all = fx.engine.watch(WatchRequest {
        after_cursor: 0,
        follow: false,
        kinds: Some(vec![FeedKind::StateChanged]),
        ..Default::default()
    });
    let mut last = 0;
    while let Some(item) = all.next().await {
        last = item.expect("feed item").cursor;
    }
    stop_tx.send_replace(Some(last));
    let (samples, max_live, max_procs) = tokio::time::timeout(guard(), sampler)
        .await
        .expect("sampler ends")
        .expect("sampler");
    eprintln!("{samples} samples: at most {max_live} live sessions, {max_procs} CLI processes");
    assert!(samples >= SESSIONS, "{samples} samples");
    assert!(max_live <= MAX_LIVE as u64, "{max_live} live sessions");
    assert!(max_procs <= MAX_LIVE, "{max_procs} CLI processes at once");
    assert!(max_procs > 0, "the process count saw no process");
    let health = fx.engine.health().await.unwrap();
    assert!(health.live_sessions <= MAX_LIVE as u64);
    assert!(
        health.sessions_by_state[&SessionState::Suspended] >= (SESSIONS - MAX_LIVE) as u64,
        "{:?}",
        health.sessions_by_state
    );
    let suspended_once = futures::future::join_all(ids.iter().map(|id| fx.history(id)))
        .await
        .iter()
        .filter(|h| h.iter().any(|e| state_change(e, SessionState::Suspended)))
        .count();
    assert!(suspended_once >= SESSIONS - MAX_LIVE);
}

/// A subscriber attached before the suspension sees `suspended` (with its reason), then
/// the resume and the next turn, on the same stream; the process is gone meanwhile, an
/// interrupt does not bring it back, and concurrent messages resume it once, each message
/// delivered once.
/// A CLI that dies as soon as it starts: CreateSession with a first prompt ends (here with
/// the error of a session without a process) instead of waiting for ever. It used to hold
/// the new session's lifecycle lock while sending the first prompt, and sending to an
/// ended process looks for a resume under that same lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cli_that_dies_at_start_does_not_hang_create() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("claude");
    std::fs::write(&script, "#!/bin/sh\nexit 3\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let cwd = dir.path().join("work");
    std::fs::create_dir_all(&cwd).unwrap();
    let store = Store::open(dir.path().join("ostler.db"), StoreOptions::default()).unwrap();
    let engine = Engine::start(
        EngineOptions {
            idle_suspend: None,
            ..Default::default()
        },
        store,
        Installation::assume(script, semver::Version::new(2, 1, 330), None),
    )
    .await
    .unwrap();
    for i in 0..20 {
        let created = tokio::time::timeout(
            guard(),
            engine.create_session(CreateSession {
                cwd: cwd.clone(),
                first_prompt: Some(MessageContent::Text(format!("hello {i}"))),
                client: ClientRef::new("creator"),
                ..Default::default()
            }),
        )
        .await
        .expect("create ends although the CLI died at start");
        // The prompt met the process still there (the session's CLI then exits), or its
        // closed stdin, or no process at all: an answer either way.
        if let Err(e) = created {
            eprintln!("create {i}: {e}");
        }
    }
}

/// A message the CLI exits on as soon as it reads it was still taken: SendMessage answers
/// with its seq, although the session's actor may be gone before the write is confirmed
/// (it answered "ended before answering" in that race).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_cli_exits_on_is_still_acknowledged() {
    let fx = Fake::start(|_| {}).await;
    for i in 0..12 {
        let s = fx.session(&format!("hello {i}")).await;
        fx.turns(&s.id, 1).await;
        let sent = fx
            .send(&s.id, "fake:exit 3")
            .await
            .unwrap_or_else(|e| panic!("send {i}: {e}"));
        assert!(sent.seq > 0 && !sent.duplicate, "send {i}: {sent:?}");
    }
}

/// A retried send to a suspended session is a duplicate answered from its log: the CLI is
/// not brought back for it, nothing is recorded; a new message resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_to_a_suspended_session_does_not_resume_it() {
    let fx = Fake::start(|o| o.idle_suspend = Some(Duration::from_millis(300))).await;
    let s = fx.session("remember the word teapot").await;
    let mut sub = fx.follow(&s.id, 0).await;
    until(&mut sub, is_turn_end).await;
    let msg = |id: &str| SendMessage {
        content: MessageContent::Text("and the word kettle".into()),
        client_message_id: Some(id.into()),
        client: ClientRef::new("tester"),
        delivery: Default::default(),
    };
    let first = fx
        .engine
        .send_message(&s.id, msg("m-1"))
        .await
        .expect("send");
    until(&mut sub, is_turn_end).await;
    until(&mut sub, |e| state_change(e, SessionState::Suspended)).await;
    let before = fx.engine.get_session(&s.id).await.unwrap();
    let again = fx
        .engine
        .send_message(&s.id, msg("m-1"))
        .await
        .expect("retry");
    assert!(again.duplicate, "{again:?}");
    assert_eq!(
        (again.seq, &again.message_id),
        (first.seq, &first.message_id)
    );
    let now = fx.engine.get_session(&s.id).await.unwrap();
    assert_eq!(
        now.state,
        SessionState::Suspended,
        "not resumed for a retry"
    );
    assert_eq!(now.last_seq, before.last_seq, "nothing recorded");
    assert_eq!(fake_processes(&fx.cwd), 0);
    // A new id resumes it, as any message does.
    let next = fx
        .engine
        .send_message(&s.id, msg("m-2"))
        .await
        .expect("send");
    assert!(!next.duplicate);
    until(&mut sub, is_turn_end).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_session_suspends_and_resumes_on_demand_for_its_subscriber() {
    let fx = Fake::start(|o| o.idle_suspend = Some(Duration::from_millis(300))).await;
    let s = fx.session("remember the word teapot").await;
    let mut sub = fx.follow(&s.id, 0).await;
    until(&mut sub, is_turn_end).await;
    let (ev, _) = until(&mut sub, |e| state_change(e, SessionState::Suspended)).await;
    let EventPayload::StateChanged(c) = &ev.payload else {
        unreachable!()
    };
    assert!(
        c.reason.as_deref().unwrap_or_default().contains("idle"),
        "{c:?}"
    );
    assert_eq!(fx.state(&s.id).await, SessionState::Suspended);
    assert_eq!(
        fake_processes(&fx.cwd),
        0,
        "the suspended session's process is gone"
    );
    assert_eq!(fx.engine.health().await.unwrap().live_sessions, 0);

    // Nothing to interrupt: succeeds, and the session stays suspended.
    fx.engine.interrupt(&s.id).await.expect("interrupt");
    assert_eq!(fx.state(&s.id).await, SessionState::Suspended);

    // Three messages at once: one resume, three deliveries.
    let texts = ["fake:recall", "second", "third"];
    let sends = texts.iter().map(|t| fx.send(&s.id, t));
    for r in futures::future::join_all(sends).await {
        r.expect("send resumes the session");
    }
    let (ev, seen) = until(&mut sub, is_turn_end).await;
    assert!(
        seen.iter().any(|e| state_change(e, SessionState::Idle)),
        "{:?}",
        kinds(&seen)
    );
    assert!(ev.seq.is_some());
    // The turns of the three messages (the CLI may merge queued messages into one turn).
    let hist = fx.history(&s.id).await;
    assert_seqs(&hist, 1, hist.len() as u64);
    assert_eq!(notices(&hist, "resuming"), 1, "{:?}", kinds(&hist));
    assert_eq!(
        count_kind(&hist, "user_message_sent"),
        4,
        "{:?}",
        kinds(&hist)
    );
    // The idle timer suspends it again afterwards.
    until(&mut sub, |e| state_change(e, SessionState::Suspended)).await;

    // A control call resumes it too, and applies after the resume.
    fx.engine
        .set_model(&s.id, Some("claude-ostler-x".into()))
        .await
        .expect("set_model resumes the session");
    let info = fx.engine.get_session(&s.id).await.unwrap();
    assert_eq!(info.model.as_deref(), Some("claude-ostler-x"));
    assert!(info.state.is_live(), "{:?}", info.state);

    // StopSession on a suspended session: it becomes STOPPED (its subscriber sees it) and
    // is no longer resumed on demand.
    until(&mut sub, |e| state_change(e, SessionState::Suspended)).await;
    let info = fx
        .engine
        .stop_session(&s.id)
        .await
        .expect("stop while suspended");
    assert_eq!(info.state, SessionState::Stopped);
    until(&mut sub, |e| state_change(e, SessionState::Stopped)).await;
    assert!(
        fx.send(&s.id, "still there?").await.is_err(),
        "a stopped session is not resumed on demand"
    );
}

/// At the cap with every live session busy, a call waits `live_wait`, then fails with
/// `ResourceExhausted` naming the cap; once the busy session is idle, it takes its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_cap_with_every_session_busy_the_call_waits_then_fails() {
    let fx = Fake::start(|o| {
        o.max_live_sessions = 1;
        o.live_wait = Duration::from_millis(300);
    })
    .await;
    let busy = fx.session("fake:sleep 600000").await;
    let e = tokio::time::timeout(
        guard(),
        fx.engine.create_session(CreateSession {
            cwd: fx.cwd.clone(),
            ..Default::default()
        }),
    )
    .await
    .expect("within the guard")
    .expect_err("every live session is busy");
    assert_eq!(e.code_kind(), CodeKind::ResourceExhausted, "{e}");
    assert!(
        e.to_string().contains("all 1 live sessions are busy"),
        "{e}"
    );
    // The busy one ends its turn: now it makes room.
    fx.engine.interrupt(&busy.id).await.expect("interrupt");
    let mut sub = fx.follow(&busy.id, 0).await;
    until(&mut sub, is_turn_end).await;
    let other = fx.session("hello").await;
    assert!(other.state.is_live());
    until(&mut sub, |e| state_change(e, SessionState::Suspended)).await;
}

/// Identical creates with one client-chosen id at the same time (a client's retry racing
/// its first call): every one gets the session, none the store's "already exists", and the
/// first prompt is sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_creates_racing_get_one_session() {
    let fx = Fake::start(|_| {}).await;
    let create = || {
        let engine = fx.engine.clone();
        let cwd = fx.cwd.clone();
        tokio::spawn(async move {
            engine
                .create_session(CreateSession {
                    cwd,
                    session_id: Some("job-7".into()),
                    first_prompt: Some(MessageContent::Text("hello".into())),
                    ..Default::default()
                })
                .await
        })
    };
    let calls: Vec<_> = (0..5).map(|_| create()).collect();
    for call in calls {
        let info = tokio::time::timeout(guard(), call)
            .await
            .expect("within the guard")
            .expect("task")
            .expect("the session, not a refusal");
        assert_eq!(info.id, "job-7");
    }
    let turns = fx.turns("job-7", 1).await;
    assert_eq!(turns.len(), 1);
    let log = fx.store.events_after("job-7", 0, 10_000).unwrap();
    let prompts = log
        .iter()
        .filter(|e| &*e.kind == "user_message_sent")
        .count();
    assert_eq!(prompts, 1, "the first prompt was sent once");
}

/// A resume on demand waiting for a live slot says so in the session's log, and a stop or
/// delete of the session meanwhile ends the wait at once: neither waits `live_wait` behind
/// it, and the waiting call fails with `FailedPrecondition` (the session went away), not
/// `ResourceExhausted` ("retry later").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_or_delete_ends_a_resume_waiting_for_a_slot() {
    let fx = Fake::start(|o| {
        o.max_live_sessions = 1;
        // Far longer than the guard: only the stop or delete can end the wait in time.
        o.live_wait = guard() * 4;
    })
    .await;
    for delete in [false, true] {
        let a = fx.session("hello").await;
        fx.turns(&a.id, 1).await;
        let mut sub = fx.follow(&a.id, 0).await;
        let busy = fx.session("fake:sleep 600000").await; // suspends a to make room
        until(&mut sub, |e| state_change(e, SessionState::Suspended)).await;
        let (engine, id) = (fx.engine.clone(), a.id.clone());
        let sender = tokio::spawn(async move {
            engine
                .send_message(
                    &id,
                    SendMessage {
                        content: MessageContent::Text("are you there?".into()),
                        client_message_id: None,
                        client: ClientRef::new("tester"),
                        delivery: Default::default(),
                    },
                )
                .await
        });
        until(
            &mut sub,
            |e| matches!(&e.payload, EventPayload::EngineNotice(n) if n.code == "live_slot_wait"),
        )
        .await;
        let ended = tokio::time::timeout(guard(), async {
            if delete {
                fx.engine.delete_session(&a.id).await
            } else {
                fx.engine.stop_session(&a.id).await.map(|_| ())
            }
        })
        .await
        .expect("the stop or delete waited for the slot");
        ended.expect("stopped or deleted");
        let e = tokio::time::timeout(guard(), sender)
            .await
            .expect("the call still waits")
            .expect("task")
            .expect_err("the session went away");
        assert_eq!(
            e.code_kind(),
            CodeKind::FailedPrecondition,
            "delete {delete}: {e}"
        );
        fx.engine.stop_session(&busy.id).await.expect("stop busy");
    }
}

/// Sessions live when the daemon died come back `resumable` and resume on demand with
/// their conversation; a suspended session stays suspended across the restart and resumes
/// the same way; one whose CLI transcript is gone fails with `FailedPrecondition` and stays
/// as it was (never idle with a dead process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_resumable_and_suspended_sessions_resume_on_demand() {
    let fx = Fake::start(|o| o.max_live_sessions = 1).await;
    let a = fx.session("alpha").await;
    fx.turns(&a.id, 1).await;
    let b = fx.session("bravo").await; // suspends a to make room
    let turn = fx.turns(&b.id, 1).await[0].seq.unwrap();
    // Idle recorded (after the turn) before the "crash", so the old actor writes nothing
    // once the new engine has looked at the store.
    until(&mut fx.follow(&b.id, turn).await, |e| {
        state_change(e, SessionState::Idle)
    })
    .await;
    assert_eq!(fx.state(&a.id).await, SessionState::Suspended);
    let fx = fx.restarted().await;
    assert_eq!(fx.state(&a.id).await, SessionState::Suspended);
    assert_eq!(fx.state(&b.id).await, SessionState::Resumable);
    for (s, word) in [(&b, "bravo"), (&a, "alpha")] {
        fx.send(&s.id, "fake:recall")
            .await
            .expect("resume on demand");
        let turns = fx.turns(&s.id, 2).await;
        assert_eq!(result_text(&turns[1]), word);
    }
    // The transcript of a suspended session is gone: strict rule.
    let c = fx.session("charlie").await;
    fx.turns(&c.id, 1).await;
    fx.session("delta").await; // suspends c (the least recently used idle one)
    assert_eq!(fx.state(&c.id).await, SessionState::Suspended);
    std::fs::remove_dir_all(fx.home.join(".claude/projects")).unwrap();
    let e = fx.send(&c.id, "hello?").await.expect_err("no transcript");
    assert_eq!(e.code_kind(), CodeKind::FailedPrecondition, "{e}");
    assert!(e.to_string().contains("No conversation found"), "{e}");
    assert_eq!(fx.state(&c.id).await, SessionState::Suspended);
    // An explicit fresh start is remembered for later on-demand resumes.
    fx.engine
        .resume_session(
            &c.id,
            ResumeOptions {
                fork: false,
                fresh_if_missing: true,
                ..Default::default()
            },
        )
        .await
        .expect("fresh resume");
    let counts = fx.engine.health().await.unwrap().sessions_by_state;
    assert!(counts[&SessionState::Suspended] >= 1, "{counts:?}");
}

/// Real CLI (newest pinned 2.1.x): with a short idle timeout the session suspends (its
/// process is gone), and the next message resumes it with its conversation: the fake model
/// server sees the earlier turn in the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_cli_suspends_and_resumes_with_its_context() {
    let env = common::Env::with(common::NEW, scenario("two_turns"), |o| {
        o.idle_suspend = Some(Duration::from_secs(2));
    })
    .await;
    let s = env.session(Some("What is 2+2?")).await;
    let mut sub = env.follow(&s.id, 0).await;
    let (_, seen) = until(&mut sub, is_turn_end).await;
    let pid: u32 = seen
        .iter()
        .find_map(|e| match &e.payload {
            EventPayload::StateChanged(c) => c
                .reason
                .as_deref()?
                .split("(pid ")
                .nth(1)?
                .trim_end_matches(')')
                .parse()
                .ok(),
            _ => None,
        })
        .expect("the start names the pid");
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    until(&mut sub, |e| state_change(e, SessionState::Suspended)).await;
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the CLI process {pid} is still there"
    );
    env.send(&s.id, "And 3+3?").await;
    let (ev, _) = until(&mut sub, is_turn_end).await;
    assert_eq!(result_text(&ev), "3+3 is 6.", "{ev:?}");
    let with_context = env
        .server
        .requests()
        .iter()
        .filter_map(|r| r.body.as_ref().map(|b| b.to_string()))
        .filter(|b| b.contains("And 3+3") && b.contains("2+2 is 4."))
        .count();
    assert!(with_context >= 1, "no request carried the earlier turn");
}

/// A background task the CLI reports running keeps an idle session live; once the CLI
/// reports it done, the idle timer suspends the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_background_task_keeps_the_session_live() {
    use std::os::unix::fs::PermissionsExt;
    // Turn 1 starts a background task (2.1.332's `background_tasks_changed`); turn 2
    // reports it finished.
    // The engine's `initialize` comes first (2.1.332 answers it): answered, then the turns.
    let script = r#"#!/bin/sh
IFS= read -r init
id=$(printf '%s' "$init" | sed -n 's/.*"request_id":"\([^"]*\)".*/\1/p')
echo '{"type":"control_response","response":{"subtype":"success","request_id":"'"$id"'","response":{}}}'
IFS= read -r first
echo '{"type":"system","subtype":"init","session_id":"bg-1","model":"fake-model","cwd":"/","tools":[]}'
echo '{"type":"system","subtype":"background_tasks_changed","tasks":[{"task_id":"task-1","task_type":"local_agent","description":"x"}],"session_id":"bg-1"}'
echo '{"type":"result","subtype":"success","is_error":false,"duration_ms":1,"num_turns":1,"result":"started","session_id":"bg-1"}'
IFS= read -r second
echo '{"type":"system","subtype":"background_tasks_changed","tasks":[],"session_id":"bg-1"}'
echo '{"type":"result","subtype":"success","is_error":false,"duration_ms":1,"num_turns":1,"result":"done","session_id":"bg-1"}'
cat > /dev/null
"#;
    let mut fx = Fake::start(|o| o.idle_suspend = Some(Duration::from_millis(200))).await;
    let bin = fx._dir.path().join("bg-claude");
    std::fs::write(&bin, script).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    fx.installation = Installation::assume(bin, semver::Version::new(2, 1, 330), None);
    let fx = fx.restarted().await;
    let s = fx.session("start a background task").await;
    let mut sub = fx.follow(&s.id, 0).await;
    until(&mut sub, is_turn_end).await;
    until(&mut sub, |e| state_change(e, SessionState::Idle)).await;
    // Absence can only be observed over time: many idle periods pass without a suspension.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(fx.state(&s.id).await, SessionState::Idle);
    fx.send(&s.id, "is it done?").await.unwrap();
    let (_, seen) = until(&mut sub, |e| state_change(e, SessionState::Suspended)).await;
    assert!(seen.iter().any(|e| is_turn_end(e)), "{:?}", kinds(&seen));
}
