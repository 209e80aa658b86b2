//! Crash test: a child process appends continuously and is killed with SIGKILL at random
//! moments, many rounds. After every kill the database is reopened and must hold every
//! append whose call had returned (the child prints each one only after `append` returned),
//! with gap-free seqs and a clean `PRAGMA integrity_check`.
//!
//! This file has its own `main` (`harness = false`): run with `OSTLER_STORE_CRASH_CHILD` set
//! it is the child; otherwise it is the test, and re-executes itself as the child.

// Test-only: the test must start and SIGKILL a child process to simulate a crash. Library
// code of this crate never spawns processes (only ostler-supervisor does).
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::hash::BuildHasher;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ostler_store::{Error, NewEvent, NewSession, SessionState, Store, StoreOptions};

const CHILD_ENV: &str = "OSTLER_STORE_CRASH_CHILD";
const TEST_NAME: &str = "crash_recovery_after_sigkill";
const ROUNDS: u32 = 25;
const SESSIONS: usize = 3;
const WRITER_THREADS: u64 = 4;

fn main() {
    if let Ok(db) = std::env::var(CHILD_ENV) {
        child(Path::new(&db));
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        // libtest's format (also what cargo-nextest reads); this test is never ignored.
        if !args.iter().any(|a| a == "--ignored") {
            println!("{TEST_NAME}: test");
        }
        return;
    }
    // Honour a name filter the way libtest does (substring match).
    let filters: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    if !filters.is_empty() && !filters.iter().any(|f| TEST_NAME.contains(f.as_str())) {
        println!(
            "\nrunning 0 tests\n\ntest result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 1 filtered out\n"
        );
        return;
    }
    println!("\nrunning 1 test");
    let started = Instant::now();
    crash_recovery_after_sigkill();
    println!("test {TEST_NAME} ... ok");
    println!(
        "\ntest result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in {:.2}s\n",
        started.elapsed().as_secs_f64()
    );
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn session_id(i: usize) -> String {
    format!("s{i}")
}

fn payload(round: u32, thread: u64, i: u64, k: u64) -> String {
    format!("{{\"round\":{round},\"thread\":{thread},\"i\":{i},\"k\":{k}}}")
}

/// The child: appends forever from several threads (so group commit is exercised), printing
/// `ack <session> <seq> <payload>` for every event after its append returned.
fn child(db: &Path) -> ! {
    let round: u32 = std::env::var("OSTLER_STORE_CRASH_ROUND")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let store = Store::open(db, StoreOptions::default()).expect("child: open");
    for i in 0..SESSIONS {
        let s = NewSession {
            id: session_id(i),
            cwd: "/crash".into(),
            state: SessionState::Running,
            created_ms: i as i64,
            ..Default::default()
        };
        match store.create_session(s).wait() {
            Ok(()) | Err(Error::AlreadyExists { .. }) => {}
            Err(e) => panic!("child: create session: {e}"),
        }
    }
    println!("ready");
    std::io::stdout().flush().expect("flush");
    let threads: Vec<_> = (0..WRITER_THREADS)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let sid = session_id(t as usize % SESSIONS);
                let mut i = 0u64;
                loop {
                    // Two appends in flight per thread, of 1..=3 events each.
                    let batches: Vec<Vec<String>> = (0..2)
                        .map(|b| {
                            let n = (i + b + t) % 3 + 1;
                            (0..n).map(|k| payload(round, t, i + b, k)).collect()
                        })
                        .collect();
                    let tickets: Vec<_> = batches
                        .iter()
                        .map(|b| {
                            let events = b
                                .iter()
                                .map(|p| {
                                    NewEvent::new("crash", p.clone().into_bytes(), 0)
                                        .with_raw(p.clone().into_bytes())
                                })
                                .collect();
                            store.append(&sid, events)
                        })
                        .collect();
                    for (batch, ticket) in batches.iter().zip(tickets) {
                        let seqs = ticket.wait().expect("child: append");
                        let mut out = String::new();
                        for (seq, p) in seqs.iter().zip(batch) {
                            out.push_str(&format!("ack {sid} {seq} {p}\n"));
                        }
                        let mut stdout = std::io::stdout().lock();
                        stdout.write_all(out.as_bytes()).expect("write");
                        stdout.flush().expect("flush");
                    }
                    i += 2;
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
    std::process::exit(1)
}

fn crash_recovery_after_sigkill() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("crash.db");
    let seed =
        std::collections::hash_map::RandomState::new().hash_one(std::time::SystemTime::now()) | 1;
    println!("crash test seed {seed:#x}");
    let mut rng = Rng(seed);
    let exe = std::env::current_exe().expect("current exe");
    // (session, seq) -> payload, for every acknowledged append of every round.
    let mut acked: BTreeMap<(String, u64), String> = BTreeMap::new();
    let mut logs: Logs = vec![Vec::new(); SESSIONS];
    let mut total_killed_with_acks = 0;

    for round in 0..ROUNDS {
        let mut child = Command::new(&exe)
            .env(CHILD_ENV, &db)
            .env("OSTLER_STORE_CRASH_ROUND", round.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("child stdout");
        let (tx, rx) = mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Wait (on the pipe, not a timer) until the child is appending.
        let first = rx
            .recv_timeout(ostler_testkit::timeouts::secs(20))
            .expect("child never became ready");
        assert_eq!(first, "ready");
        // The random moment: 0..250 ms into the appending.
        let delay = Duration::from_micros(rng.below(250_000));
        std::thread::sleep(delay);
        child.kill().expect("SIGKILL child");
        let status = child.wait().expect("wait child");
        assert!(!status.success(), "child must have died from the kill");
        reader.join().expect("reader thread");

        let mut round_acks = Vec::new();
        for line in rx.try_iter() {
            let mut parts = line.splitn(4, ' ');
            let (Some("ack"), Some(sid), Some(seq), Some(p)) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                panic!("unexpected child output {line:?}");
            };
            let seq: u64 = seq.parse().expect("seq");
            let prev = acked.insert((sid.to_owned(), seq), p.to_owned());
            assert!(prev.is_none(), "seq {seq} of {sid} acknowledged twice");
            round_acks.push((sid.to_owned(), seq, p.to_owned()));
        }
        if !round_acks.is_empty() {
            total_killed_with_acks += 1;
        }
        verify(&db, &mut logs, &round_acks, false, round);
    }
    // Finally re-read everything from seq 1 and check every acknowledgement of every round.
    let all: Vec<(String, u64, String)> = acked
        .iter()
        .map(|((s, q), p)| (s.clone(), *q, p.clone()))
        .collect();
    verify(&db, &mut logs, &all, true, ROUNDS);
    assert!(
        total_killed_with_acks >= ROUNDS / 2,
        "most rounds should have been killed mid-append ({total_killed_with_acks}/{ROUNDS})"
    );
    println!(
        "crash test: {ROUNDS} SIGKILL rounds, {} acknowledged events all present",
        acked.len()
    );
}

/// What the parent has verified so far: each session's log, as read back.
type Logs = Vec<Vec<Vec<u8>>>;

/// Reopens the store (recovering the WAL) and checks integrity, that the logs continue
/// gap-free from what earlier rounds read (`from_scratch` re-reads them from seq 1), and
/// that every acknowledged event is there with its payload.
fn verify(
    db: &Path,
    logs: &mut Logs,
    acked: &[(String, u64, String)],
    from_scratch: bool,
    round: u32,
) {
    let store = Store::open(db, StoreOptions::default()).expect("reopen after kill");
    for (i, log) in logs.iter_mut().enumerate() {
        let sid = session_id(i);
        let earlier = std::mem::take(log);
        if !from_scratch {
            *log = earlier.clone();
        }
        loop {
            let after = log.len() as u64;
            let page = store.events_after(&sid, after, 5000).expect("read back");
            if page.is_empty() {
                break;
            }
            for e in page {
                assert_eq!(e.seq, log.len() as u64 + 1, "round {round}: gap in {sid}");
                assert_eq!(
                    e.raw.as_ref(),
                    Some(&e.payload),
                    "round {round}: {sid}#{} damaged",
                    e.seq
                );
                log.push(e.payload.to_vec());
            }
        }
        assert!(
            log.len() >= earlier.len(),
            "round {round}: {sid} lost events"
        );
        assert_eq!(
            log[..earlier.len()],
            earlier[..],
            "round {round}: {sid} changed"
        );
    }
    for (sid, seq, p) in acked {
        let i: usize = sid[1..].parse().expect("session index");
        let log = &logs[i];
        assert!(
            *seq as usize <= log.len(),
            "round {round}: acknowledged {sid}#{seq} lost (log ends at {})",
            log.len()
        );
        assert_eq!(
            log[*seq as usize - 1],
            p.as_bytes(),
            "round {round}: {sid}#{seq} payload"
        );
    }
    drop(store);
    let conn = rusqlite::Connection::open(db).expect("raw open");
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check");
    assert_eq!(check, "ok", "round {round}: integrity_check");
    let fk: Vec<String> = conn
        .prepare("PRAGMA foreign_key_check")
        .expect("fk check")
        .query_map([], |r| r.get::<_, String>(0))
        .expect("fk rows")
        .collect::<Result<_, _>>()
        .expect("fk rows");
    assert!(
        fk.is_empty(),
        "round {round}: foreign key violations {fk:?}"
    );
}
