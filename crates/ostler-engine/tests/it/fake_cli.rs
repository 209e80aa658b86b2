//! The engine against fake CLIs (shell scripts speaking just enough stream-json): the
//! cases a real CLI cannot be made to hit on demand. Fast: no node start-up.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ostler_engine::*;
use ostler_store::{Store, StoreOptions};
use ostler_supervisor::Installation;

/// Failure guard for awaits (never used to synchronise).
fn guard() -> Duration {
    ostler_testkit::timeouts::guard()
}

struct Fake {
    _dir: tempfile::TempDir,
    cwd: PathBuf,
    store: Store,
    engine: Engine,
}

fn fake_cli(dir: &Path, body: &str) -> Installation {
    let p = dir.join("claude");
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    Installation::assume(p, semver::Version::new(2, 1, 330), None)
}

impl Fake {
    async fn start(body: &str) -> Fake {
        Fake::start_with(body, |_| {}).await
    }

    /// With the engine's options changed by `f` first.
    async fn start_with(body: &str, f: impl FnOnce(&mut EngineOptions)) -> Fake {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        let cwd = base.join("work");
        std::fs::create_dir_all(&cwd).unwrap();
        let store = Store::open(base.join("ostler.db"), StoreOptions::default()).unwrap();
        let mut opts = EngineOptions::default();
        opts.supervisor.stop_grace = ostler_testkit::timeouts::secs(3);
        opts.supervisor.stall_after = None;
        f(&mut opts);
        let engine = Engine::start(opts, store.clone(), fake_cli(&base, body))
            .await
            .unwrap();
        Fake {
            _dir: dir,
            cwd,
            store,
            engine,
        }
    }

    async fn session(&self, first_prompt: Option<&str>) -> SessionInfo {
        tokio::time::timeout(
            guard(),
            self.engine.create_session(CreateSession {
                cwd: self.cwd.clone(),
                first_prompt: first_prompt.map(|p| MessageContent::Text(p.into())),
                ..Default::default()
            }),
        )
        .await
        .unwrap()
        .unwrap()
    }

    async fn follow(&self, id: &str) -> Subscription {
        self.engine
            .subscribe(SubscribeRequest {
                session_id: id.into(),
                after_seq: 0,
                include_partials: false,
                follow: true,
            })
            .await
            .unwrap()
    }
}

async fn until(sub: &mut Subscription, pred: impl Fn(&EngineEvent) -> bool) -> Arc<EngineEvent> {
    tokio::time::timeout(guard(), async {
        loop {
            let ev = sub.next().await.expect("stream open").expect("event");
            if pred(&ev) {
                return ev;
            }
        }
    })
    .await
    .expect("event within the guard")
}

/// A CLI that does not read stdin while its stdout is full (the real one is single-threaded
/// in the same way while it streams a long answer) must not hang its session when a
/// multi-megabyte message is written to it mid-turn: the actor keeps draining stdout while
/// the write is in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_message_mid_turn_does_not_deadlock_stdin_against_stdout() {
    // Reads the first message; on the second, takes its first KiB, then writes ~24 MB to
    // stdout before reading the rest (far beyond the pipe and the event buffer), then
    // reports how many bytes the rest had and ends the turn.
    let fake = Fake::start(
        r#"
IFS= read -r first
echo '{"type":"system","subtype":"init","session_id":"fake-1","model":"fake-model","cwd":"/","tools":[]}'
dd bs=1024 count=1 of=/dev/null 2>/dev/null
pad=$(head -c 8000 /dev/zero | tr '\0' x)
i=0
while [ $i -lt 3000 ]; do
  echo "{\"type\":\"keep_alive\",\"pad\":\"$pad\"}"
  i=$((i+1))
done
rest=$(head -n 1 | wc -c)
echo "{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\"duration_ms\":1,\"num_turns\":1,\"result\":\"rest $rest\",\"session_id\":\"fake-1\"}"
cat > /dev/null
"#,
    )
    .await;
    let s = fake.session(Some("start a long answer")).await;
    let mut sub = fake.follow(&s.id).await;
    until(&mut sub, |e| {
        matches!(e.payload, EventPayload::SessionStarted(_))
    })
    .await;
    let big = "y".repeat(4 * 1024 * 1024);
    let sent = tokio::time::timeout(
        guard(),
        fake.engine.send_message(
            &s.id,
            SendMessage {
                content: MessageContent::Text(big),
                client_message_id: None,
                client: ClientRef::default(),
                delivery: Default::default(),
            },
        ),
    )
    .await
    .expect("the message was not written: stdin and stdout deadlocked")
    .unwrap();
    assert!(!sent.duplicate);
    let end = until(&mut sub, |e| {
        matches!(e.payload, EventPayload::TurnCompleted(_))
    })
    .await;
    let EventPayload::TurnCompleted(r) = &end.payload else {
        unreachable!()
    };
    let rest: usize = r
        .result
        .as_deref()
        .and_then(|t| t.strip_prefix("rest "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("unexpected result {r:?}"));
    assert!(rest > 4 * 1024 * 1024 - 1024, "the CLI read {rest} bytes");
    let info = fake.engine.get_session(&s.id).await.unwrap();
    assert_eq!(info.state, SessionState::Idle);
    fake.engine.shutdown().await;
    drop(fake.store);
}

/// A CLI that asks for permission on every user message and ends the turn once answered.
const ASKS_EVERY_TURN: &str = r#"
k=0
while IFS= read -r line; do
  case "$line" in
    *'"type":"user"'*)
      k=$((k+1))
      echo "{\"type\":\"control_request\",\"request_id\":\"req-$k\",\"request\":{\"subtype\":\"can_use_tool\",\"tool_name\":\"Bash\",\"input\":{\"command\":\"echo $k\"},\"tool_use_id\":\"toolu_$k\"}}"
      ;;
    *'"type":"control_response"'*)
      echo "{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\"duration_ms\":1,\"num_turns\":1,\"result\":\"done $k\",\"session_id\":\"fake-2\"}"
      ;;
  esac
done
"#;

/// A decision and its `interaction_resolved` event commit in one transaction: a reader of
/// the store (or a daemon that crashed at any moment) never finds a decided interaction
/// without its resolution in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_never_exists_without_its_resolution_event() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let fake = Fake::start(ASKS_EVERY_TURN).await;
    let s = fake.session(None).await;
    let mut sub = fake.follow(&s.id).await;
    let current = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // Polls the store as fast as it can: the decided interaction of the current request,
    // then the log after its request event.
    let poller = {
        let (store, sid) = (fake.store.clone(), s.id.clone());
        let (current, stop) = (current.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut checks, mut torn) = (0u64, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                let k = current.load(Ordering::Relaxed);
                if k == 0 {
                    std::thread::yield_now();
                    continue;
                }
                let rid = format!("req-{k}");
                let Ok(i) = store.interaction(&sid, &rid) else {
                    continue;
                };
                if !i.state.is_final() {
                    continue;
                }
                let after = i.event_seq.unwrap_or(0);
                let events = store.events_after(&sid, after, 64).unwrap();
                checks += 1;
                let resolved = events.iter().any(|e| {
                    &*e.kind == "interaction_resolved"
                        && std::str::from_utf8(&e.payload).is_ok_and(|p| p.contains(&rid))
                });
                if !resolved {
                    torn.push(rid);
                }
            }
            (checks, torn)
        })
    };
    for k in 1..=40u64 {
        fake.engine
            .send_message(
                &s.id,
                SendMessage {
                    content: MessageContent::Text(format!("turn {k}")),
                    client_message_id: None,
                    client: ClientRef::default(),
                    delivery: Default::default(),
                },
            )
            .await
            .unwrap();
        let asked = until(&mut sub, |e| {
            matches!(e.payload, EventPayload::PermissionRequested(_))
        })
        .await;
        let EventPayload::PermissionRequested(p) = &asked.payload else {
            unreachable!()
        };
        assert_eq!(p.request_id, format!("req-{k}"));
        current.store(k, Ordering::Relaxed);
        fake.engine
            .respond_permission(
                &s.id,
                &p.request_id,
                PermissionResponse::Allow {
                    updated_input: None,
                    remember: Vec::new(),
                    updated_permissions: None,
                },
                ClientRef::default(),
            )
            .await
            .unwrap();
        until(&mut sub, |e| {
            matches!(e.payload, EventPayload::TurnCompleted(_))
        })
        .await;
    }
    stop.store(true, Ordering::Relaxed);
    let (checks, torn) = poller.join().unwrap();
    assert!(checks > 0, "the poller never saw a decision");
    assert!(
        torn.is_empty(),
        "decided without a resolution event in the log: {torn:?}"
    );
    fake.engine.shutdown().await;
}

/// First run: reads up to the first prompt, closes its stdin (or, with a `hold` file next
/// to it, only stops reading it), ends the turn, then waits on the `gate` FIFO next to it
/// before exiting. Any later run (a resume) answers each user message
/// with a result naming the message's text.
const CLOSES_STDIN_ONCE: &str = r#"
d=$(dirname "$0")
if [ ! -e "$d/ran-once" ]; then
  : > "$d/ran-once"
  while IFS= read -r line; do
    case "$line" in *'"type":"user"'*) break ;; esac
  done
  [ -e "$d/hold" ] || exec 0<&-
  echo '{"type":"system","subtype":"init","session_id":"fake-3","model":"fake-model","cwd":"/","tools":[]}'
  echo '{"type":"result","subtype":"success","is_error":false,"duration_ms":1,"num_turns":1,"result":"first","session_id":"fake-3"}'
  read gate < "$d/gate"
  exit 0
fi
echo '{"type":"system","subtype":"init","session_id":"fake-3","model":"fake-model","cwd":"/","tools":[]}'
while IFS= read -r line; do
  case "$line" in
    *'retry me'*)
      echo '{"type":"result","subtype":"success","is_error":false,"duration_ms":1,"num_turns":1,"result":"got retry me","session_id":"fake-3"}'
      ;;
  esac
done
"#;

/// A message whose write to the CLI fails is answered FAILED_PRECONDITION (the process is
/// ending: resume, then send again), and the retry with the same client message id is then
/// delivered: not answered as a duplicate of the message the CLI never took, neither by
/// the live actor nor by a session resumed (rebuilt from its log) after the CLI exited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_cli_never_took_is_delivered_on_retry_with_the_same_id() {
    let (fake, gate, s, mut sub) = after_first_turn(Stdin::Closed).await;
    let send = || send_with_id(&fake, &s.id, "retry me".into(), "m-1");
    // The CLI's stdin is closed: the write fails, twice, and neither answer is a duplicate.
    for attempt in 1..=2 {
        match send().await.expect("an answer within the guard") {
            // Not UNAVAILABLE: a plain retry would fail the same way until a resume.
            Err(e) => assert_eq!(
                e.code_kind(),
                CodeKind::FailedPrecondition,
                "attempt {attempt}: {e}"
            ),
            Ok(o) => panic!("attempt {attempt}: the write to a closed stdin succeeded: {o:?}"),
        }
        let failed = until(
            &mut sub,
            |e| matches!(&e.payload, EventPayload::EngineNotice(n) if n.code == "delivery_failed"),
        )
        .await;
        let EventPayload::EngineNotice(n) = &failed.payload else {
            unreachable!()
        };
        let data = n.data.as_ref().expect("the notice names the message");
        assert_eq!(data["client_message_id"], "m-1");
        assert!(
            data["seq"]
                .as_u64()
                .is_some_and(|seq| seq < failed.seq.unwrap())
        );
    }
    // The CLI exits; resumed at once (the resume waits for the old actor to finish, not
    // "already running"), the session rebuilds its ids from its log, and the retry reaches
    // the new CLI.
    open_gate(gate).await;
    until(
        &mut sub,
        |e| matches!(&e.payload, EventPayload::StateChanged(c) if c.to == SessionState::Exited),
    )
    .await;
    resume_and_retry(&fake, &s.id, &mut sub, send).await;
}

/// How [`CLOSES_STDIN_ONCE`]'s first run treats its stdin after the first prompt.
enum Stdin {
    Closed,
    /// Open but never read again (a `hold` file next to the script).
    Unread,
}

/// A session of [`CLOSES_STDIN_ONCE`] after its first turn, with its gate (made, closed)
/// and a subscriber.
async fn after_first_turn(stdin: Stdin) -> (Fake, PathBuf, SessionInfo, Subscription) {
    let fake = Fake::start(CLOSES_STDIN_ONCE).await;
    if let Stdin::Unread = stdin {
        std::fs::write(fake.cwd.parent().unwrap().join("hold"), "").unwrap();
    }
    let gate = make_gate(&fake);
    let s = fake.session(Some("first")).await;
    let mut sub = fake.follow(&s.id).await;
    until(&mut sub, |e| {
        matches!(e.payload, EventPayload::TurnCompleted(_))
    })
    .await;
    (fake, gate, s, sub)
}

/// `text` sent with client message id `id`, answered within the guard.
async fn send_with_id(
    fake: &Fake,
    session: &str,
    text: String,
    id: &str,
) -> Result<Result<SendOutcome>, tokio::time::error::Elapsed> {
    tokio::time::timeout(
        guard(),
        fake.engine.send_message(
            session,
            SendMessage {
                content: MessageContent::Text(text),
                client_message_id: Some(id.into()),
                client: ClientRef::default(),
                delivery: Default::default(),
            },
        ),
    )
    .await
}

/// A FIFO the fake CLI waits on before it exits.
fn make_gate(fake: &Fake) -> PathBuf {
    let gate = fake.cwd.parent().unwrap().join("gate");
    #[allow(clippy::disallowed_methods)] // the test's own set-up, not a session's process
    let made = std::process::Command::new("mkfifo")
        .arg(&gate)
        .status()
        .unwrap();
    assert!(made.success());
    gate
}

async fn open_gate(gate: PathBuf) {
    tokio::task::spawn_blocking(move || std::fs::write(gate, "go\n"))
        .await
        .unwrap()
        .unwrap();
}

/// Resumes the exited session, then `send` must be delivered (not a duplicate) and
/// answered by the new CLI; sent again, it is the duplicate.
async fn resume_and_retry<F>(fake: &Fake, id: &str, sub: &mut Subscription, send: impl Fn() -> F)
where
    F: Future<Output = Result<Result<SendOutcome>, tokio::time::error::Elapsed>>,
{
    let fresh = ResumeOptions {
        fresh_if_missing: true, // a fake CLI writes no transcript
        ..Default::default()
    };
    tokio::time::timeout(guard(), fake.engine.resume_session(id, fresh))
        .await
        .unwrap()
        .unwrap();
    let last_failure = fake.store.last_seq(id).unwrap();
    let sent = send()
        .await
        .expect("an answer within the guard")
        .expect("the retry is delivered");
    assert!(!sent.duplicate, "the retry was answered as a duplicate");
    assert!(sent.seq > last_failure);
    let end = until(sub, |e| {
        matches!(e.payload, EventPayload::TurnCompleted(_)) && e.seq.unwrap() > sent.seq
    })
    .await;
    let EventPayload::TurnCompleted(r) = &end.payload else {
        unreachable!()
    };
    assert_eq!(r.result.as_deref(), Some("got retry me"));
    // Delivered once: a further retry with the same id is the duplicate now.
    let again = send().await.unwrap().unwrap();
    assert!(again.duplicate);
    assert_eq!(again.seq, sent.seq);
    // The resume does not fail again what already failed (nor the delivered retry).
    let mut failed: Vec<u64> = fake
        .store
        .events_after(id, 0, 100_000)
        .unwrap()
        .iter()
        .filter_map(|e| match EventPayload::decode_stored(&e.kind, &e.payload) {
            Ok(EventPayload::EngineNotice(n)) if n.code == "delivery_failed" => {
                n.data.and_then(|d| d["seq"].as_u64())
            }
            _ => None,
        })
        .collect();
    let all = failed.len();
    failed.sort_unstable();
    failed.dedup();
    assert_eq!(failed.len(), all, "a message failed twice: {failed:?}");
    assert!(
        !failed.contains(&sent.seq),
        "the delivered retry was failed"
    );
    fake.engine.shutdown().await;
}

/// A message still being written when the CLI exits (it stopped reading stdin; the message
/// is larger than the pipe) fails, whichever of the session's paths sees the failure first
/// (the live actor, the actor at its end, or the write's own task once the actor is gone):
/// the failure is recorded with the message's id, and after a resume the retry with that
/// id is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_cut_off_by_the_cli_exiting_is_delivered_on_retry_with_the_same_id() {
    let (fake, gate, s, mut sub) = after_first_turn(Stdin::Unread).await;
    let text = format!("retry me {}", "z".repeat(256 * 1024));
    let send = || send_with_id(&fake, &s.id, text.clone(), "m-2");
    let first = send();
    let exit = async {
        // Recorded, so its write is under way (and stuck on the full pipe): the CLI exits.
        until(&mut sub, |e| {
            matches!(e.payload, EventPayload::UserMessageSent(_))
        })
        .await;
        open_gate(gate).await;
    };
    let (answer, ()) = tokio::join!(first, exit);
    let e = answer
        .expect("an answer within the guard")
        .expect_err("a message the CLI never read was acknowledged");
    eprintln!("the first send: {e}");
    assert_eq!(e.code_kind(), CodeKind::FailedPrecondition, "{e}");
    // Both the failure (with the id) and the exit are recorded, in either order.
    let (mut failed, mut exited) = (false, false);
    while !(failed && exited) {
        let ev = until(&mut sub, |_| true).await;
        match &ev.payload {
            EventPayload::EngineNotice(n) if n.code == "delivery_failed" => {
                assert_eq!(n.data.as_ref().unwrap()["client_message_id"], "m-2");
                failed = true;
            }
            EventPayload::StateChanged(c) if c.to == SessionState::Exited => exited = true,
            _ => {}
        }
    }
    resume_and_retry(&fake, &s.id, &mut sub, send).await;
}

/// A message still being written when the daemon shuts down is answered UNAVAILABLE: the
/// session comes back resumable with the daemon, so "retry later" holds. The failure is
/// recorded with the message's id (which a restarted daemon frees for that retry).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_cut_off_by_shutdown_is_unavailable_and_recorded() {
    // The gate is never opened: the CLI lives until the shutdown kills it.
    let (fake, _gate, s, mut sub) = after_first_turn(Stdin::Unread).await;
    let text = format!("retry me {}", "z".repeat(256 * 1024));
    let send = send_with_id(&fake, &s.id, text, "m-3");
    let shutdown = async {
        // Recorded, so its write is under way (stuck on the full pipe): shut down.
        until(&mut sub, |e| {
            matches!(e.payload, EventPayload::UserMessageSent(_))
        })
        .await;
        fake.engine.shutdown().await;
    };
    let (answer, ()) = tokio::join!(send, shutdown);
    let e = answer
        .expect("an answer within the guard")
        .expect_err("a message the CLI never read was acknowledged");
    assert_eq!(e.code_kind(), CodeKind::Unavailable, "{e}");
    let log = fake.store.events_after(&s.id, 0, 1000).unwrap();
    let failed =
        log.iter().find_map(
            |ev| match EventPayload::decode_stored(&ev.kind, &ev.payload) {
                Ok(EventPayload::EngineNotice(n)) if n.code == "delivery_failed" => n.data,
                _ => None,
            },
        );
    assert_eq!(
        failed.expect("the failure is recorded")["client_message_id"],
        "m-3"
    );
}

/// A control request whose CLI exits instead of answering is FAILED_PRECONDITION (resume,
/// then retry), not UNAVAILABLE: retried as is, it would fail again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_request_the_cli_exits_on_is_failed_precondition() {
    let fake = Fake::start(
        r#"
echo '{"type":"system","subtype":"init","session_id":"fake-4","model":"fake-model","cwd":"/","tools":[]}'
while IFS= read -r line; do
  case "$line" in *'"set_model"'*) exit 0 ;; esac
done
"#,
    )
    .await;
    let s = fake.session(None).await;
    let mut sub = fake.follow(&s.id).await;
    until(&mut sub, |e| {
        matches!(e.payload, EventPayload::SessionStarted(_))
    })
    .await;
    let e = tokio::time::timeout(
        guard(),
        fake.engine.set_model(&s.id, Some("other-model".into())),
    )
    .await
    .expect("an answer within the guard")
    .expect_err("the CLI exited without answering");
    eprintln!("set_model: {e}");
    assert_eq!(e.code_kind(), CodeKind::FailedPrecondition, "{e}");
    fake.engine.shutdown().await;
}

/// Stores `n` sessions in `state` directly (as an earlier daemon run would have left them).
async fn stored_sessions(store: &Store, cwd: &Path, state: SessionState, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    let mut tickets = Vec::new();
    for _ in 0..n {
        let id = uuid::Uuid::now_v7().to_string();
        tickets.push(store.create_session(ostler_store::NewSession {
            id: id.clone(),
            cwd: cwd.display().to_string(),
            state,
            created_ms: 1,
            ..Default::default()
        }));
        ids.push(id);
    }
    for t in tickets {
        t.await.unwrap();
    }
    ids
}

/// Sessions per stored state, counted the slow way: listing every stored session.
fn listed_counts(store: &Store) -> std::collections::BTreeMap<SessionState, u64> {
    let mut by: std::collections::BTreeMap<SessionState, u64> =
        SessionState::ALL.iter().map(|s| (*s, 0)).collect();
    let mut token: Option<String> = None;
    loop {
        let page = store
            .list_sessions(&Default::default(), token.as_deref(), 1000)
            .unwrap();
        for r in page.sessions {
            *by.entry(r.state).or_default() += 1;
        }
        token = page.next_page_token;
        if token.is_none() {
            return by;
        }
    }
}

async fn assert_counts(engine: &Engine, store: &Store, step: &str) {
    let health = engine.health().await.unwrap();
    assert!(health.store.is_ok(), "{step}: {:?}", health.store);
    let store = store.clone();
    let listed = tokio::task::spawn_blocking(move || listed_counts(&store))
        .await
        .unwrap();
    assert_eq!(health.sessions_by_state, listed, "after {step}");
}

/// Health's per-state counts (kept in memory) agree with the store after every kind of
/// state change: start (stale live sessions become resumable), create, stop, resume,
/// delete (live and stored), and a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_counts_follow_every_state_change() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    let cwd = base.join("work");
    std::fs::create_dir_all(&cwd).unwrap();
    let store = Store::open(base.join("ostler.db"), StoreOptions::default()).unwrap();
    let stopped = stored_sessions(&store, &cwd, SessionState::Stopped, 20).await;
    stored_sessions(&store, &cwd, SessionState::Running, 3).await;
    stored_sessions(&store, &cwd, SessionState::Exited, 5).await;
    let inst = fake_cli(&base, "cat > /dev/null");
    let mut opts = EngineOptions::default();
    opts.supervisor.stop_grace = ostler_testkit::timeouts::secs(3);
    opts.supervisor.stall_after = None;
    let engine = Engine::start(opts.clone(), store.clone(), inst.clone())
        .await
        .unwrap();
    assert_counts(&engine, &store, "start").await;
    assert_eq!(
        engine.health().await.unwrap().sessions_by_state[&SessionState::Resumable],
        3
    );
    let create = || {
        engine.create_session(CreateSession {
            cwd: cwd.clone(),
            ..Default::default()
        })
    };
    let a = create().await.unwrap();
    let b = create().await.unwrap();
    let c = create().await.unwrap();
    assert_counts(&engine, &store, "create").await;
    engine.stop_session(&a.id).await.unwrap();
    assert_counts(&engine, &store, "stop").await;
    engine.delete_session(&b.id).await.unwrap();
    assert_counts(&engine, &store, "delete of a live session").await;
    engine.delete_session(&stopped[0]).await.unwrap();
    assert_counts(&engine, &store, "delete of a stored session").await;
    engine.resume_session(&stopped[1], false).await.unwrap();
    assert_counts(&engine, &store, "resume").await;
    engine.resume_session(&a.id, false).await.unwrap();
    assert_counts(&engine, &store, "resume of a stopped one").await;
    // The daemon dies (no shutdown): the next start finds c, a and stopped[1] live.
    crate::common::abandon(engine).await;
    let _ = c;
    let engine = Engine::start(opts.clone(), store.clone(), inst.clone())
        .await
        .unwrap();
    assert_counts(&engine, &store, "restart").await;
    engine.shutdown().await;
    assert_counts(&engine, &store, "shutdown").await;
}

/// Health does not list the stored sessions: with thousands stored, it answers from the
/// per-state counts kept in memory (counted once at start, then moved by the engine's own
/// writes; it used to list every stored session on every call). A session written to the
/// store behind the engine's back shows in a listing but not in health; if health listed
/// the store, it would count that session too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_counts_come_from_memory_not_a_listing_of_the_stored_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    let store = Store::open(base.join("ostler.db"), StoreOptions::default()).unwrap();
    stored_sessions(&store, &base, SessionState::Stopped, 5000).await;
    let engine = Engine::start(
        EngineOptions::default(),
        store.clone(),
        fake_cli(&base, "cat > /dev/null"),
    )
    .await
    .unwrap();
    let s = store.clone();
    let listed = tokio::task::spawn_blocking(move || listed_counts(&s))
        .await
        .unwrap();
    assert_eq!(listed[&SessionState::Stopped], 5000);
    assert_eq!(engine.health().await.unwrap().sessions_by_state, listed);

    // One more stopped session, written by the store directly (not through the engine).
    stored_sessions(&store, &base, SessionState::Stopped, 1).await;
    let s = store.clone();
    let relisted = tokio::task::spawn_blocking(move || listed_counts(&s))
        .await
        .unwrap();
    assert_eq!(
        relisted[&SessionState::Stopped],
        5001,
        "the listing sees it"
    );
    for _ in 0..20 {
        let h = engine.health().await.unwrap();
        assert_eq!(
            h.sessions_by_state, listed,
            "health counted a session the engine never wrote: it read the store"
        );
    }
    engine.shutdown().await;
}

/// Sessions left live with 0, 1 and 3 pending interactions become `resumable` at start:
/// each interaction is cancelled by `engine` and logged as `interaction_resolved`, then
/// `state_changed` to `resumable` closes the log, gap-free, and the state column agrees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_left_live_become_resumable_with_their_interactions_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().canonicalize().unwrap();
    let cwd = base.join("work");
    std::fs::create_dir_all(&cwd).unwrap();
    let store = Store::open(base.join("ostler.db"), StoreOptions::default()).unwrap();
    let ids = stored_sessions(&store, &cwd, SessionState::AwaitingPermission, 3).await;
    for (id, n) in ids.iter().zip([0usize, 1, 3]) {
        for k in 0..n {
            store
                .upsert_interaction(ostler_store::NewInteraction {
                    session_id: id.clone(),
                    request_id: format!("req-{k}"),
                    kind: InteractionKind::Permission,
                    tool_name: Some("Bash".into()),
                    input: bytes::Bytes::from_static(b"{}"),
                    suggestions: None,
                    event_seq: None,
                    created_ms: 1,
                })
                .await
                .unwrap();
        }
    }
    let inst = fake_cli(&base, "cat > /dev/null");
    let engine = Engine::start(EngineOptions::default(), store.clone(), inst)
        .await
        .unwrap();
    for (id, n) in ids.iter().zip([0usize, 1, 3]) {
        let info = engine.get_session(id).await.unwrap();
        assert_eq!(info.state, SessionState::Resumable, "{n} pending");
        let store2 = store.clone();
        let sid = id.clone();
        let events = tokio::task::spawn_blocking(move || store2.events_after(&sid, 0, 100))
            .await
            .unwrap()
            .unwrap();
        let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=n as u64 + 1).collect::<Vec<_>>(), "{n} pending");
        let kinds: Vec<&str> = events.iter().map(|e| &*e.kind).collect();
        let mut want = vec!["interaction_resolved"; n];
        want.push("state_changed");
        assert_eq!(kinds, want, "{n} pending");
        let store2 = store.clone();
        let sid = id.clone();
        let left = tokio::task::spawn_blocking(move || store2.pending_interactions(Some(&sid)))
            .await
            .unwrap()
            .unwrap();
        assert!(left.is_empty(), "{n} pending: {left:?}");
        for k in 0..n {
            let store2 = store.clone();
            let (sid, rid) = (id.clone(), format!("req-{k}"));
            let i = tokio::task::spawn_blocking(move || store2.interaction(&sid, &rid))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(i.state, ostler_store::InteractionState::Cancelled);
            assert_eq!(i.decided_by.as_deref(), Some("engine"));
        }
    }
    assert_counts(&engine, &store, "start").await;
}

/// Names the message each result answers (like 2.1.330+), except a message with
/// `swallow` in it: the CLI says it started, ends a turn that names nothing, then says
/// the message is `completed`.
const COMPLETES_WITHOUT_NAMING: &str = r#"
echo '{"type":"system","subtype":"init","session_id":"fake-4","model":"fake-model","cwd":"/","tools":[]}'
while IFS= read -r line; do
  case "$line" in
    *'"type":"user"'*)
      u=$(printf '%s\n' "$line" | sed -n 's/.*"uuid":"\([^"]*\)".*/\1/p')
      case "$line" in
        *swallow*)
          echo "{\"type\":\"command_lifecycle\",\"command_uuid\":\"$u\",\"state\":\"started\",\"uuid\":\"l-1\",\"session_id\":\"fake-4\"}"
          echo '{"type":"result","subtype":"success","is_error":false,"duration_ms":1,"num_turns":1,"result":"","session_id":"fake-4"}'
          echo "{\"type\":\"command_lifecycle\",\"command_uuid\":\"$u\",\"state\":\"completed\",\"uuid\":\"l-2\",\"session_id\":\"fake-4\"}"
          ;;
        *)
          echo "{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\"duration_ms\":1,\"num_turns\":1,\"result\":\"answered\",\"session_id\":\"fake-4\",\"user_message_uuids\":[\"$u\"]}"
          ;;
      esac
      ;;
  esac
done
"#;

/// From a release whose results name the messages they answer, a result that names none
/// leaves the queued messages owed (a turn of the CLI's own). A message the CLI then says
/// is `completed`, although no result named it, is no longer owed: the session goes idle
/// (it is not left running, never to be idle-suspended, until its process ends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_completed_without_a_result_naming_it_leaves_the_session_idle() {
    let fake = Fake::start(COMPLETES_WITHOUT_NAMING).await;
    let s = fake.session(Some("first")).await;
    let mut sub = fake.follow(&s.id).await;
    let first = until(&mut sub, |e| {
        matches!(&e.payload, EventPayload::TurnCompleted(r) if !r.user_message_uuids.is_empty())
    })
    .await;
    until(
        &mut sub,
        |e| matches!(&e.payload, EventPayload::StateChanged(c) if c.to == SessionState::Idle),
    )
    .await;
    let sent = send_with_id(&fake, &s.id, "swallow this".into(), "m-1")
        .await
        .unwrap()
        .unwrap();
    let id = sent.message_id.expect("the wire id");
    let completed = until(&mut sub, |e| {
        matches!(&e.payload, EventPayload::SystemNotice(n)
            if matches!(&n.detail, Some(ostler_protocol::NoticeDetail::MessageLifecycle(l))
                if l.message_id == id && l.state == "completed"))
    })
    .await;
    let idle = until(
        &mut sub,
        |e| matches!(&e.payload, EventPayload::StateChanged(c) if c.to == SessionState::Idle),
    )
    .await;
    // Running from the send until the CLI said it was done with the message, not idle at
    // the result that named nothing.
    assert!(idle.seq > completed.seq, "{idle:?} before {completed:?}");
    assert!(completed.seq > first.seq);
    let info = fake.engine.get_session(&s.id).await.unwrap();
    assert_eq!(info.state, SessionState::Idle);
    fake.engine.shutdown().await;
}

/// Names no answers and echoes each message it takes (like 1.0.x), but while answering
/// `first` it reads the next message and never takes it: after `first`'s result that
/// message is owed, and nothing more comes from the CLI.
const TAKES_ONE_OF_TWO: &str = r#"
echo '{"type":"system","subtype":"init","session_id":"fake-5","model":"fake-model","cwd":"/","tools":[]}'
while IFS= read -r line; do
  case "$line" in
    *'"type":"user"'*)
      u=$(printf '%s\n' "$line" | sed -n 's/.*"uuid":"\([^"]*\)".*/\1/p')
      echo "{\"type\":\"user\",\"message\":{\"role\":\"user\",\"content\":\"taken\"},\"session_id\":\"fake-5\",\"uuid\":\"$u\"}"
      case "$line" in
        *first*) IFS= read -r next ;;
      esac
      echo '{"type":"result","subtype":"success","is_error":false,"duration_ms":1,"num_turns":1,"result":"answered","session_id":"fake-5"}'
      ;;
  esac
done
"#;

/// A message still owed after a result, which the CLI never takes (no echo, no output,
/// `queue_grace` after the result), is forgotten: the session goes idle, saying why,
/// instead of staying running, never to be idle-suspended, until its process ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_cli_never_takes_after_a_result_is_forgotten() {
    let fake = Fake::start_with(TAKES_ONE_OF_TWO, |o| {
        o.queue_grace = Duration::from_millis(300);
    })
    .await;
    let s = fake.session(Some("first")).await;
    let mut sub = fake.follow(&s.id).await;
    let sent = send_with_id(&fake, &s.id, "never taken".into(), "m-1")
        .await
        .unwrap()
        .unwrap();
    let lost = sent.message_id.expect("the wire id");
    let result = until(&mut sub, |e| {
        matches!(&e.payload, EventPayload::TurnCompleted(_))
    })
    .await;
    let EventPayload::TurnCompleted(r) = &result.payload else {
        unreachable!()
    };
    // It answered the echoed message, not the one still owed.
    assert_eq!(r.user_message_uuids.len(), 1, "{r:?}");
    assert_ne!(r.user_message_uuids[0], lost);
    let idle = until(
        &mut sub,
        |e| matches!(&e.payload, EventPayload::StateChanged(c) if c.to == SessionState::Idle),
    )
    .await;
    let EventPayload::StateChanged(c) = &idle.payload else {
        unreachable!()
    };
    assert_eq!(c.from, SessionState::Running);
    let reason = c.reason.as_deref().unwrap_or_default();
    assert!(reason.contains("took none of the 1 message"), "{reason}");
    let info = fake.engine.get_session(&s.id).await.unwrap();
    assert_eq!(info.state, SessionState::Idle);
    fake.engine.shutdown().await;
}

/// Names its answers and says when it starts on each message (like 2.1.330 and later).
/// While answering `first` it reads the next message; after `first`'s result it says it
/// started on that one, then takes 2 s before it echoes and answers it (as the real CLI
/// does while the message's UserPromptSubmit hooks run, or other work before the turn).
const STARTS_THEN_TAKES_A_WHILE: &str = r#"
echo '{"type":"system","subtype":"init","session_id":"fake-6","model":"fake-model","cwd":"/","tools":[]}'
uuid() { printf '%s\n' "$1" | sed -n 's/.*"uuid":"\([^"]*\)".*/\1/p'; }
while IFS= read -r line; do
  case "$line" in
    *'"type":"user"'*) case "$line" in *first*) ;; *) continue ;; esac
      u=$(uuid "$line")
      IFS= read -r next
      n=$(uuid "$next")
      echo "{\"type\":\"user\",\"message\":{\"role\":\"user\",\"content\":\"first\"},\"session_id\":\"fake-6\",\"uuid\":\"$u\",\"isReplay\":true}"
      echo "{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\"duration_ms\":1,\"num_turns\":1,\"result\":\"answered first\",\"session_id\":\"fake-6\",\"user_message_uuids\":[\"$u\"]}"
      echo "{\"type\":\"command_lifecycle\",\"command_uuid\":\"$u\",\"state\":\"completed\",\"uuid\":\"l-1\",\"session_id\":\"fake-6\"}"
      echo "{\"type\":\"command_lifecycle\",\"command_uuid\":\"$n\",\"state\":\"started\",\"uuid\":\"l-2\",\"session_id\":\"fake-6\"}"
      sleep 2
      echo "{\"type\":\"user\",\"message\":{\"role\":\"user\",\"content\":\"second\"},\"session_id\":\"fake-6\",\"uuid\":\"$n\",\"isReplay\":true}"
      echo "{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\"duration_ms\":1,\"num_turns\":1,\"result\":\"answered second\",\"session_id\":\"fake-6\",\"user_message_uuids\":[\"$n\"]}"
      echo "{\"type\":\"command_lifecycle\",\"command_uuid\":\"$n\",\"state\":\"completed\",\"uuid\":\"l-3\",\"session_id\":\"fake-6\"}"
      ;;
  esac
done
"#;

/// A queued message the CLI says it started on after a result is taken: it is not
/// forgotten however long the CLI takes to echo it (`queue_grace` far shorter here), and
/// the session stays running until its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_cli_started_on_is_not_forgotten_while_it_prepares_the_turn() {
    let fake = Fake::start_with(STARTS_THEN_TAKES_A_WHILE, |o| {
        o.queue_grace = Duration::from_millis(200);
    })
    .await;
    let s = fake.session(Some("first")).await;
    let mut sub = fake.follow(&s.id).await;
    let sent = send_with_id(&fake, &s.id, "second".into(), "m-1")
        .await
        .unwrap()
        .unwrap();
    let second = sent.message_id.expect("the wire id");
    // Idle is fine before the first message (the session's start), never after it.
    let sent_any = std::cell::Cell::new(false);
    let went_idle = std::cell::Cell::new(None);
    let answer = until(&mut sub, |e| match &e.payload {
        EventPayload::UserMessage(_) => {
            sent_any.set(true);
            false
        }
        EventPayload::StateChanged(c) if c.to == SessionState::Idle && sent_any.get() => {
            went_idle.set(Some((e.seq, c.reason.clone())));
            false
        }
        EventPayload::TurnCompleted(r) => r.user_message_uuids.contains(&second),
        _ => false,
    })
    .await;
    let EventPayload::TurnCompleted(r) = &answer.payload else {
        unreachable!()
    };
    assert_eq!(r.result.as_deref(), Some("answered second"));
    assert_eq!(
        went_idle.take(),
        None,
        "idle while the CLI prepared the queued turn"
    );
    fake.engine.shutdown().await;
}
