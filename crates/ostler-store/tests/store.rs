//! Behaviour of the store through its public API, on real SQLite files.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use common::*;
use ostler_store::*;

fn raw_conn(path: &std::path::Path) -> rusqlite::Connection {
    rusqlite::Connection::open(path).expect("raw connection")
}

#[test]
fn open_sets_wal_foreign_keys_incremental_vacuum_and_current_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    store.create_session(new_session("s", 1)).wait().unwrap();
    let conn = raw_conn(&path);
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let auto_vacuum: i64 = conn
        .pragma_query_value(None, "auto_vacuum", |r| r.get(0))
        .unwrap();
    assert_eq!(auto_vacuum, 2, "auto_vacuum=INCREMENTAL");
    let version: u32 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    assert_eq!(version, SCHEMA_VERSION);
}

/// A new store's files are its owner's alone (0600 whatever the umask): they hold every
/// conversation and the secrets sessions are resumed with. An existing file keeps its mode.
#[test]
fn a_new_store_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    store.create_session(new_session("s", 1)).wait().unwrap();
    store.append_blocking("s", vec![event(1)]).unwrap();
    for suffix in ["", "-wal", "-shm"] {
        let file = format!("{}{suffix}", path.display());
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{file}: {mode:o}");
    }
    drop(store);
    let kept = dir.path().join("kept.db");
    std::fs::write(&kept, b"").unwrap();
    std::fs::set_permissions(&kept, std::fs::Permissions::from_mode(0o640)).unwrap();
    drop(open(&kept));
    let mode = std::fs::metadata(&kept).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640, "an existing file's mode is the operator's");
}

/// Damage SQLite would handle badly is refused with what to do: an empty database file
/// beside a WAL holding the store (SQLite would start empty and delete the WAL), a
/// directory at the store's path. The files stay as they were.
#[test]
fn a_store_emptied_beside_its_wal_is_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let wal = dir.path().join("ostler.db-wal");
    let store = open(&path);
    store.create_session(new_session("s", 1)).wait().unwrap();
    store.append_blocking("s", vec![event(1)]).unwrap();
    // A copy of the files while the daemon runs: the WAL holds the data.
    let copy = dir.path().join("copy");
    std::fs::create_dir(&copy).unwrap();
    std::fs::copy(&wal, copy.join("ostler.db-wal")).unwrap();
    drop(store);
    std::fs::write(copy.join("ostler.db"), b"").unwrap();
    let wal_bytes = std::fs::read(copy.join("ostler.db-wal")).unwrap();
    assert!(!wal_bytes.is_empty());
    let err = Store::open(copy.join("ostler.db"), StoreOptions::default())
        .map(|_| ())
        .expect_err("an empty database beside a full WAL");
    let shown = err.to_string();
    assert!(
        shown.contains("empty") && shown.contains("WAL") && shown.contains("backup"),
        "{shown}"
    );
    assert_eq!(
        std::fs::read(copy.join("ostler.db-wal")).unwrap(),
        wal_bytes,
        "the WAL is kept"
    );
    // A database cut short beside the WAL (a copy cut off): refused, the WAL kept.
    let original = std::fs::read(&path).unwrap();
    for (name, bytes) in [
        ("short.db", &original[..50]),
        ("half.db", &original[..original.len() / 2 + 100]),
    ] {
        let db = copy.join(name);
        std::fs::write(&db, bytes).unwrap();
        let db_wal = copy.join(format!("{name}-wal"));
        std::fs::write(&db_wal, &wal_bytes).unwrap();
        let err = Store::open(&db, StoreOptions::default())
            .map(|_| ())
            .expect_err("a damaged database beside a full WAL");
        assert!(err.to_string().contains("damaged"), "{name}: {err}");
        assert_eq!(
            std::fs::read(&db_wal).unwrap(),
            wal_bytes,
            "{name}: WAL kept"
        );
        assert_eq!(
            std::fs::read(&db).unwrap(),
            bytes,
            "{name}: database untouched"
        );
    }
    let at_dir = dir.path().join("a-dir.db");
    std::fs::create_dir(&at_dir).unwrap();
    let err = Store::open(&at_dir, StoreOptions::default())
        .map(|_| ())
        .expect_err("a directory");
    assert!(err.to_string().contains("is a directory"), "{err}");
}

/// A start cut off after the migrations but before their free pages were given back
/// leaves the file mostly free pages: the next start gives them back.
#[test]
fn free_pages_left_by_a_cut_off_start_are_given_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    drop(open(&path));
    {
        let conn = raw_conn(&path);
        conn.execute_batch(
            "CREATE TABLE filler(x BLOB); \
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 4000) \
             INSERT INTO filler SELECT zeroblob(4000) FROM n; \
             DROP TABLE filler;",
        )
        .unwrap();
        let free: i64 = conn
            .query_row("PRAGMA freelist_count", [], |r| r.get(0))
            .unwrap();
        assert!(free > 2000, "{free} free pages to give back");
    }
    drop(open(&path));
    let free: i64 = raw_conn(&path)
        .query_row("PRAGMA freelist_count", [], |r| r.get(0))
        .unwrap();
    assert_eq!(free, 0, "the free pages were given back");
}

#[test]
fn appends_get_gap_free_seqs_from_one_per_session() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    for id in ["a", "b"] {
        store.create_session(new_session(id, 1)).wait().unwrap();
    }
    // Many threads append to two sessions at once; seqs of each session must be exactly
    // 1..=N and every returned seq distinct.
    let mut handles = Vec::new();
    for t in 0..8u64 {
        let store = store.clone();
        handles.push(std::thread::spawn(move || {
            let id = if t % 2 == 0 { "a" } else { "b" };
            let mut got = Vec::new();
            for i in 0..50u64 {
                let n = (i % 3) + 1;
                let seqs = store
                    .append_blocking(id, (0..n).map(|k| event(t * 1000 + i * 10 + k)).collect())
                    .unwrap();
                assert_eq!(seqs.len() as u64, n);
                assert!(
                    seqs.windows(2).all(|w| w[1] == w[0] + 1),
                    "consecutive within one append"
                );
                got.extend(seqs);
            }
            (id, got)
        }));
    }
    let mut per_session: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for h in handles {
        let (id, seqs) = h.join().unwrap();
        per_session.entry(id).or_default().extend(seqs);
    }
    for (id, mut seqs) in per_session {
        seqs.sort_unstable();
        let n = seqs.len() as u64;
        assert_eq!(seqs, (1..=n).collect::<Vec<_>>(), "session {id}");
        assert_eq!(store.last_seq(id).unwrap(), n);
        let stored = store.events_after(id, 0, usize::MAX).unwrap();
        assert_eq!(
            stored.iter().map(|e| e.seq).collect::<Vec<_>>(),
            (1..=n).collect::<Vec<_>>()
        );
    }
}

#[test]
fn events_round_trip_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    store.create_session(new_session("s", 1)).wait().unwrap();
    let binary: Vec<u8> = (0..=255u8).collect();
    let events = vec![
        NewEvent::new("unknown", binary.clone(), -5)
            .with_raw(Bytes::from_static(b"{\"type\":\"x\"}\n")),
        NewEvent::new("system", Bytes::new(), 7),
        NewEvent::new(String::from("result"), b"{}".to_vec(), i64::MAX).with_raw(binary.clone()),
    ];
    let seqs = store.append_blocking("s", events.clone()).unwrap();
    assert_eq!(seqs, vec![1, 2, 3]);
    let stored = store.events_after("s", 0, 10).unwrap();
    assert_eq!(stored.len(), 3);
    for (e, s) in events.iter().zip(&stored) {
        assert_eq!(&*s.session_id, "s");
        assert_eq!(&*s.kind, &*e.kind);
        assert_eq!(s.payload, e.payload);
        assert_eq!(s.raw, e.raw);
        assert_eq!(s.ts_ms, e.ts_ms);
    }
    assert_eq!(stored[1].raw, None);
}

/// One copy per event: a payload that repeats its raw line (as the engine's canonical
/// events do) is stored as a short delta against it, and both read back byte for byte, for
/// the CLI's recorded lines and for JSON nested far deeper than any parser's default limit.
#[test]
fn payloads_repeating_the_raw_line_are_stored_once_and_read_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    store.create_session(new_session("s", 1)).wait().unwrap();
    let recordings = ostler_testkit::workspace_root().join("contracts/claude-code/2.1.330");
    let mut lines: Vec<Vec<u8>> = Vec::new();
    for entry in std::fs::read_dir(&recordings).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "ndjson") {
            let text = std::fs::read(&p).unwrap();
            lines.extend(
                text.split(|b| *b == b'\n')
                    .filter(|l| !l.is_empty())
                    .map(<[u8]>::to_vec),
            );
        }
    }
    assert!(lines.len() > 50, "recordings found: {}", lines.len());
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000)).into_bytes();
    lines.push(deep);
    let events: Vec<NewEvent> = lines
        .iter()
        .enumerate()
        .map(|(i, line)| {
            let mut payload = format!("{{\"n\":{i},\"line\":").into_bytes();
            payload.extend_from_slice(line);
            payload.push(b'}');
            NewEvent::new("unknown", payload, i as i64).with_raw(line.clone())
        })
        .collect();
    for chunk in events.chunks(100) {
        store.append_blocking("s", chunk.to_vec()).unwrap();
    }
    let stored = store.events_after("s", 0, events.len() + 1).unwrap();
    assert_eq!(stored.len(), events.len());
    for (e, s) in events.iter().zip(&stored) {
        assert_eq!(s.payload, e.payload, "payload of seq {}", s.seq);
        assert_eq!(s.raw, e.raw, "raw of seq {}", s.seq);
    }
    let (payload_bytes, raw_bytes): (i64, i64) = raw_conn(&path)
        .query_row(
            "SELECT sum(length(payload)), sum(length(raw)) FROM events",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(
        payload_bytes * 10 < raw_bytes,
        "payload columns {payload_bytes} B next to raw lines of {raw_bytes} B"
    );
}

#[test]
fn events_after_pages_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    store.create_session(new_session("s", 1)).wait().unwrap();
    store
        .create_session(new_session("other", 1))
        .wait()
        .unwrap();
    store
        .append_blocking("other", (0..5).map(event).collect())
        .unwrap();
    store
        .append_blocking("s", (1..=25).map(event).collect())
        .unwrap();
    let mut after = 0;
    let mut pages = Vec::new();
    loop {
        let page = store.events_after("s", after, 10).unwrap();
        if page.is_empty() {
            break;
        }
        after = page.last().unwrap().seq;
        pages.push(page.iter().map(|e| e.seq).collect::<Vec<_>>());
    }
    assert_eq!(
        pages.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![10, 10, 5]
    );
    assert_eq!(pages.concat(), (1..=25).collect::<Vec<_>>());
    assert_eq!(
        store.events_after("s", 24, 10).unwrap()[0].payload,
        event(25).payload
    );
    assert!(store.events_after("s", 25, 10).unwrap().is_empty());
    assert!(matches!(
        store.events_after("nope", 0, 10),
        Err(Error::NotFound { .. })
    ));
}

/// A reader that needs a few kinds of a long log reads those rows only, newest first,
/// paging backwards by seq.
#[test]
fn events_of_kinds_are_read_newest_first_without_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    store.create_session(new_session("s", 1)).wait().unwrap();
    store
        .create_session(new_session("empty", 1))
        .wait()
        .unwrap();
    let of_kind = |kind: &'static str, n: u64| {
        NewEvent::new(kind, format!("{{\"n\":{n}}}").into_bytes(), n as i64)
            .with_raw(format!("{{\"type\":\"x\",\"n\":{n}}}").into_bytes())
    };
    let events: Vec<_> = (1..=30u64)
        .map(|n| match n % 10 {
            3 => of_kind("session_started", n),
            7 => of_kind("engine_notice", n),
            _ => event(n),
        })
        .collect();
    store.append_blocking("s", events).unwrap();
    let kinds = ["session_started", "engine_notice"];
    let page = store
        .events_of_kinds_before("s", &kinds, u64::MAX, 4)
        .unwrap();
    assert_eq!(
        page.iter().map(|e| (e.seq, &*e.kind)).collect::<Vec<_>>(),
        [
            (27, "engine_notice"),
            (23, "session_started"),
            (17, "engine_notice"),
            (13, "session_started")
        ]
    );
    // Payloads and raw lines read back as appended.
    assert_eq!(&page[0].payload[..], br#"{"n":27}"#);
    assert_eq!(page[0].raw.as_deref(), Some(&br#"{"type":"x","n":27}"#[..]));
    let rest = store.events_of_kinds_before("s", &kinds, 13, 10).unwrap();
    assert_eq!(rest.iter().map(|e| e.seq).collect::<Vec<_>>(), [7, 3]);
    assert!(
        store
            .events_of_kinds_before("s", &["question_asked"], u64::MAX, 10)
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .events_of_kinds_before("empty", &kinds, u64::MAX, 10)
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        store.events_of_kinds_before("nope", &kinds, u64::MAX, 10),
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        store.events_of_kinds_before("s", &["x\"]) OR 1=1 --"], u64::MAX, 10),
        Err(Error::InvalidData(_))
    ));
}

#[test]
fn a_failing_write_does_not_spoil_its_group() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    store.create_session(new_session("s", 1)).wait().unwrap();
    // Queue many writes without waiting so they share transactions; some are bad.
    let mut tickets = Vec::new();
    for i in 0..300u64 {
        let id = if i % 7 == 3 { "missing" } else { "s" };
        tickets.push((id, store.append(id, vec![event(i)])));
    }
    let dup = store.create_session(new_session("s", 2));
    let mut good = Vec::new();
    for (id, t) in tickets {
        match (id, t.wait()) {
            ("s", Ok(seqs)) => good.extend(seqs),
            ("missing", Err(Error::NotFound { what })) => assert!(what.contains("missing")),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(matches!(dup.wait(), Err(Error::AlreadyExists { .. })));
    let n = good.len() as u64;
    assert_eq!(
        good,
        (1..=n).collect::<Vec<_>>(),
        "queue order is seq order, no gaps"
    );
    assert_eq!(store.last_seq("s").unwrap(), n);
    assert_eq!(
        store.append_blocking("s", vec![event(0)]).unwrap(),
        vec![n + 1]
    );
}

/// A group runs first without savepoints; when one of its writes fails, that pass is rolled
/// back whole and the group runs again with a savepoint per write. What the writes before the
/// failed one did in the undone pass (a session created, seqs assigned) must not be
/// remembered: each is done again, once.
#[test]
fn writes_before_a_failed_one_in_its_group_are_done_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let rounds = 60u64;
    {
        let store = open(&path);
        store.create_session(new_session("s", 1)).wait().unwrap();
        // Queued without waiting, so that groups mix creates, good appends and bad ones.
        let mut created = Vec::new();
        let mut appended = Vec::new();
        let mut bad = Vec::new();
        let mut dup = Vec::new();
        for i in 0..rounds {
            let id = format!("n{i}");
            created.push(store.create_session(new_session(&id, 2)));
            appended.push(("s", store.append("s", vec![event(i)])));
            bad.push(store.append("missing", vec![event(i)]));
            for k in 0..3 {
                appended.push(("n", store.append(&id, vec![event(k), event(k)])));
            }
            if i % 4 == 0 {
                dup.push(store.create_session(new_session(&id, 3)));
            }
        }
        for t in created {
            t.wait().unwrap();
        }
        for t in bad {
            let r = t.wait();
            assert!(matches!(r, Err(Error::NotFound { .. })), "{r:?}");
        }
        for t in dup {
            let r = t.wait();
            assert!(matches!(r, Err(Error::AlreadyExists { .. })), "{r:?}");
        }
        let (mut s_seqs, mut n_seqs) = (Vec::new(), Vec::new());
        for (which, t) in appended {
            let seqs = t.wait().unwrap();
            if which == "s" {
                s_seqs.extend(seqs);
            } else {
                n_seqs.push(seqs);
            }
        }
        assert_eq!(s_seqs, (1..=rounds).collect::<Vec<_>>());
        for (i, seqs) in n_seqs.iter().enumerate() {
            let k = i as u64 % 3;
            assert_eq!(seqs, &vec![2 * k + 1, 2 * k + 2], "append {i}");
        }
        // What the writer remembers is what was committed.
        assert_eq!(
            store.append_blocking("n0", vec![event(9)]).unwrap(),
            vec![7]
        );
        assert_eq!(
            store.append_blocking("s", vec![event(9)]).unwrap(),
            vec![rounds + 1]
        );
    }
    let store = open(&path);
    for i in 0..rounds {
        let id = format!("n{i}");
        let stored = store.events_after(&id, 0, 100).unwrap();
        let want = if i == 0 { 7 } else { 6 };
        assert_eq!(stored.len(), want, "{id}");
        assert_eq!(store.last_seq(&id).unwrap(), want as u64, "{id}");
    }
    assert_eq!(store.last_seq("s").unwrap(), rounds + 1);
}

#[test]
fn a_write_that_fails_halfway_leaves_nothing_of_itself_alone_or_in_a_group() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    store.create_session(new_session("s", 1)).wait().unwrap();
    // The events are inserted first, then the interaction of an unknown session fails the
    // write: none of its events may stay, and no seq may be used up.
    let bad = || WithEvents {
        interaction: Some((permission("missing", "r", 5), 0)),
        ..Default::default()
    };
    // Alone: the only write of its transaction (nothing else queued).
    let r = store
        .append_with("s", vec![event(1), event(2)], bad())
        .wait();
    assert!(matches!(r, Err(Error::NotFound { .. })), "{r:?}");
    assert_eq!(store.last_seq("s").unwrap(), 0);
    assert!(store.events_after("s", 0, 10).unwrap().is_empty());
    assert_eq!(store.append_blocking("s", vec![event(3)]).unwrap(), vec![1]);
    // Queued without waiting, between good writes that share its transactions.
    let mut good = Vec::new();
    let mut bads = Vec::new();
    for i in 0..200u64 {
        if i % 5 == 2 {
            bads.push(store.append_with("s", vec![event(i), event(i)], bad()));
        } else {
            good.push(store.append("s", vec![event(i)]));
        }
    }
    for t in bads {
        assert!(matches!(t.wait(), Err(Error::NotFound { .. })));
    }
    let seqs: Vec<u64> = good.into_iter().flat_map(|t| t.wait().unwrap()).collect();
    assert_eq!(
        seqs,
        (2..=161).collect::<Vec<_>>(),
        "no gaps, no seq used up"
    );
    assert_eq!(store.last_seq("s").unwrap(), 161);
    assert_eq!(store.events_after("s", 0, 1000).unwrap().len(), 161);
}

#[test]
fn empty_append_checks_the_session_and_assigns_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    store.create_session(new_session("s", 1)).wait().unwrap();
    assert_eq!(
        store.append_blocking("s", vec![]).unwrap(),
        Vec::<u64>::new()
    );
    assert!(matches!(
        store.append_blocking("x", vec![]),
        Err(Error::NotFound { .. })
    ));
    assert_eq!(store.append_blocking("s", vec![event(1)]).unwrap(), vec![1]);
}

#[test]
fn seqs_continue_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    {
        let store = open(&path);
        store.create_session(new_session("s", 1)).wait().unwrap();
        store
            .append_blocking("s", (0..4).map(event).collect())
            .unwrap();
    }
    let store = open(&path);
    assert_eq!(store.append_blocking("s", vec![event(9)]).unwrap(), vec![5]);
}

/// A session whose log reached the greatest seq a row id holds (2^36 - 1) refuses further
/// appends with a typed error, storing nothing of them, while other sessions go on.
#[test]
fn a_session_at_the_greatest_seq_refuses_appends_and_keeps_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let max: u64 = (1 << 36) - 1;
    {
        let store = open(&path);
        store.create_session(new_session("full", 1)).wait().unwrap();
        store
            .create_session(new_session("other", 2))
            .wait()
            .unwrap();
        store.append_blocking("full", vec![event(1)]).unwrap();
    }
    {
        // The last event of a (very long) log, written the way the store lays rows out.
        let conn = raw_conn(&path);
        conn.execute(
            "INSERT INTO events (id, kind, ts_ms, payload)
             SELECT (pk << 36) | ?1, 'user', 0, x'7b7d' FROM sessions WHERE id = 'full'",
            [max as i64],
        )
        .unwrap();
    }
    let store = open(&path);
    assert_eq!(store.last_seq("full").unwrap(), max);
    let err = store
        .append_blocking("full", vec![event(2), event(3)])
        .unwrap_err();
    assert!(
        matches!(err, Error::SessionFull { max: m } if m == max),
        "{err:?}"
    );
    assert_eq!(store.last_seq("full").unwrap(), max);
    let tail = store.events_after("full", max - 1, 10).unwrap();
    assert_eq!(tail.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![max]);
    // Reading past the greatest seq is empty, not the next session's events.
    assert!(store.events_after("full", max, 10).unwrap().is_empty());
    assert!(store.events_after("full", u64::MAX, 10).unwrap().is_empty());
    assert_eq!(
        store.append_blocking("other", vec![event(4)]).unwrap(),
        vec![1]
    );
    assert_eq!(store.events_after("full", 0, 10).unwrap().len(), 2);
}

#[test]
fn dropping_the_store_completes_queued_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let tickets: Vec<_> = {
        let store = open(&path);
        store.create_session(new_session("s", 1)).wait().unwrap();
        (0..500)
            .map(|i| store.append("s", vec![event(i)]))
            .collect()
    };
    let seqs: Vec<u64> = tickets
        .into_iter()
        .flat_map(|t| t.wait().unwrap())
        .collect();
    assert_eq!(seqs, (1..=500).collect::<Vec<_>>());
    // Closed cleanly: everything is in the database file, the WAL is empty.
    let wal = std::fs::metadata(path.with_extension("db-wal"))
        .map(|m| m.len())
        .unwrap_or(0);
    assert_eq!(wal, 0, "WAL left behind after close");
    assert_eq!(open(&path).last_seq("s").unwrap(), 500);
}

#[test]
fn async_append_resolves_after_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    rt.block_on(async {
        store.create_session(new_session("s", 1)).await.unwrap();
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move { store.append("s", vec![event(i)]).await })
            })
            .collect();
        let mut seqs = Vec::new();
        for t in tasks {
            seqs.extend(t.await.unwrap().unwrap());
        }
        seqs.sort_unstable();
        assert_eq!(seqs, (1..=16).collect::<Vec<_>>());
        // Committed means visible to a brand-new connection.
        let conn = raw_conn(&path);
        let n: i64 = conn
            .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 16);
        // Reads from async code go through the blocking pool.
        let events = store
            .blocking(|s| s.events_after("s", 0, 100))
            .await
            .unwrap();
        assert_eq!(events.len(), 16);
    });
}

#[test]
fn newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    drop(open(&path));
    raw_conn(&path)
        .pragma_update(None, "user_version", SCHEMA_VERSION + 7)
        .unwrap();
    let err = Store::open(&path, StoreOptions::default()).unwrap_err();
    match &err {
        Error::NewerSchema {
            found,
            supported,
            path: p,
        } => {
            assert_eq!(*found, SCHEMA_VERSION + 7);
            assert_eq!(*supported, SCHEMA_VERSION);
            assert_eq!(p, &path);
        }
        other => panic!("expected NewerSchema, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("newer ostler") && msg.contains(&path.display().to_string()),
        "{msg}"
    );
}

/// Another program's SQLite database is neither changed nor mistaken for a store: it is
/// refused, naming some of its tables, however they are named.
#[test]
fn another_programs_database_is_refused_untouched() {
    for tables in [&["foo"][..], &["sessions", "events"]] {
        let dir = tempfile::tempdir().unwrap();
        let path = db_path(&dir);
        {
            let c = raw_conn(&path);
            for t in tables {
                c.execute_batch(&format!("CREATE TABLE {t} (x)")).unwrap();
            }
        }
        let err = Store::open(&path, StoreOptions::default()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("not an ostler store") && msg.contains(tables[0]),
            "{msg}"
        );
        assert!(msg.len() < 400, "{msg}");
        let c = raw_conn(&path);
        let names: Vec<String> = c
            .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let mut want: Vec<String> = tables.iter().map(|t| t.to_string()).collect();
        want.sort();
        assert_eq!(names, want, "nothing was added");
        let mode: String = c
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "delete", "its journal mode is its own");
    }
}

#[test]
fn a_file_that_is_not_a_database_is_reported_as_corrupt_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    std::fs::write(&path, vec![0xA5u8; 8192]).unwrap();
    let err = Store::open(&path, StoreOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
    // Nothing was written over the file.
    assert_eq!(std::fs::read(&path).unwrap(), vec![0xA5u8; 8192]);
}

#[test]
fn a_damaged_database_is_reported_as_corrupt_when_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    {
        let store = open(&path);
        store.create_session(new_session("s", 1)).wait().unwrap();
        let big = vec![7u8; 2000];
        for _ in 0..50 {
            store
                .append_blocking("s", vec![NewEvent::new("k", big.clone(), 0)])
                .unwrap();
        }
    }
    // The store was closed (WAL checkpointed into the file). Scribble over everything
    // after the first two pages, keeping the header and schema intact.
    let mut bytes = std::fs::read(&path).unwrap();
    let page = 4096;
    assert!(bytes.len() > 8 * page);
    for b in &mut bytes[2 * page..] {
        *b = 0xEE;
    }
    std::fs::write(&path, &bytes).unwrap();
    let result =
        Store::open(&path, StoreOptions::default()).and_then(|s| s.events_after("s", 0, 100));
    let err = result.unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}

#[test]
fn an_unopenable_path_is_a_clear_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-dir").join("ostler.db");
    let err = Store::open(&path, StoreOptions::default()).unwrap_err();
    assert!(matches!(err, Error::Open { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}

#[test]
fn sessions_are_created_updated_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    let mut s = new_session("s1", 100);
    s.labels.insert("team".into(), "infra".into());
    store.create_session(s.clone()).wait().unwrap();
    let err = store.create_session(s).wait().unwrap_err();
    assert!(matches!(err, Error::AlreadyExists { .. }), "{err:?}");
    assert!(matches!(
        store.create_session(new_session("", 1)).wait(),
        Err(Error::InvalidArgument(_))
    ));

    let got = store.get_session("s1").unwrap();
    assert_eq!(got.cwd, "/work/project");
    assert_eq!(got.state, SessionState::Running);
    assert_eq!(got.created_ms, 100);
    assert_eq!(got.updated_ms, 100);
    assert_eq!(got.labels.get("team").map(String::as_str), Some("infra"));
    assert_eq!(got.exit, None);
    assert_eq!(got.last_seq, 0);

    store
        .update_session(
            "s1",
            SessionPatch {
                claude_session_id: Some("c-123".into()),
                model: Some("claude-opus-4-1".into()),
                state: Some(SessionState::Exited),
                labels: Some(BTreeMap::from([("env".to_string(), "ci".to_string())])),
                exit: Some(ExitInfo {
                    facts: ExitFacts {
                        code: Some(0),
                        signal: None,
                    },
                    reason: Some("done".into()),
                    at_ms: 150,
                }),
                updated_ms: 150,
                ..Default::default()
            },
        )
        .wait()
        .unwrap();
    store
        .append_blocking("s1", vec![event(1), event(2)])
        .unwrap();
    let got = store.get_session("s1").unwrap();
    assert_eq!(got.claude_session_id.as_deref(), Some("c-123"));
    assert_eq!(got.model.as_deref(), Some("claude-opus-4-1"));
    assert_eq!(got.permission_mode.as_deref(), Some("default"), "untouched");
    assert_eq!(got.state, SessionState::Exited);
    assert_eq!(got.updated_ms, 150);
    assert_eq!(
        got.labels,
        BTreeMap::from([("env".to_string(), "ci".to_string())])
    );
    assert_eq!(got.exit.as_ref().and_then(|e| e.facts.code), Some(0));
    assert_eq!(
        got.exit.as_ref().and_then(|e| e.reason.as_deref()),
        Some("done")
    );
    assert_eq!(got.last_seq, 2);

    assert!(matches!(
        store.update_session("nope", SessionPatch::default()).wait(),
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        store.get_session("nope"),
        Err(Error::NotFound { .. })
    ));
}

#[test]
fn session_states_are_stored_by_name_and_an_unknown_name_is_invalid_data() {
    for state in SessionState::ALL {
        assert_eq!(state.as_str().parse::<SessionState>().unwrap(), state);
        assert_eq!(state.to_string(), state.as_str());
    }
    assert!(matches!(
        "sleeping".parse::<SessionState>(),
        Err(Error::InvalidData(_))
    ));
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    for (i, state) in SessionState::ALL.into_iter().enumerate() {
        let mut s = new_session(&format!("s{i}"), 1000 + i as i64);
        s.state = state;
        store.create_session(s).wait().unwrap();
        assert_eq!(store.get_session(&format!("s{i}")).unwrap().state, state);
    }
    // The column holds the names.
    let conn = raw_conn(&path);
    let names: Vec<String> = conn
        .prepare("SELECT state FROM sessions ORDER BY created_ms")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let want: Vec<&str> = SessionState::ALL.iter().map(|s| s.as_str()).collect();
    assert_eq!(names, want);
    // A name this build does not know is reported, not guessed.
    conn.execute("UPDATE sessions SET state = 'sleeping' WHERE id = 's0'", [])
        .unwrap();
    match store.get_session("s0") {
        Err(Error::InvalidData(m)) => assert!(m.contains("sleeping"), "{m}"),
        other => panic!("expected InvalidData, got {other:?}"),
    }
    assert!(store.get_session("s1").is_ok());
}

#[test]
fn sessions_are_listed_filtered_and_paged() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    for i in 0..10i64 {
        let mut s = new_session(&format!("s{i:02}"), 1000 + i);
        s.state = if i % 2 == 0 {
            SessionState::Running
        } else {
            SessionState::Exited
        };
        s.labels.insert(
            "parity".into(),
            if i % 2 == 0 {
                "even".into()
            } else {
                "odd".into()
            },
        );
        if i % 3 == 0 {
            s.labels.insert("three".into(), "yes".into());
        }
        store.create_session(s).wait().unwrap();
    }
    let ids = |page: &SessionPage| {
        page.sessions
            .iter()
            .map(|s| s.id.clone())
            .collect::<Vec<_>>()
    };

    // Everything, in pages of 4.
    let mut all = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let page = store
            .list_sessions(&SessionFilter::default(), token.as_deref(), 4)
            .unwrap();
        pages += 1;
        all.extend(ids(&page));
        match page.next_page_token {
            Some(t) => token = Some(t),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    assert_eq!(all, (0..10).map(|i| format!("s{i:02}")).collect::<Vec<_>>());

    let by_state = SessionFilter {
        states: vec![SessionState::Exited],
        ..Default::default()
    };
    assert_eq!(
        ids(&store.list_sessions(&by_state, None, 100).unwrap()),
        ["s01", "s03", "s05", "s07", "s09"]
    );

    let by_labels = SessionFilter {
        labels: vec![
            ("parity".into(), "even".into()),
            ("three".into(), "yes".into()),
        ],
        ..Default::default()
    };
    let page = store.list_sessions(&by_labels, None, 100).unwrap();
    assert_eq!(ids(&page), ["s00", "s06"]);
    assert_eq!(
        page.sessions[0].labels.get("three").map(String::as_str),
        Some("yes")
    );

    let by_time = SessionFilter {
        created_from_ms: Some(1003),
        created_before_ms: Some(1006),
        states: vec![SessionState::Running, SessionState::Exited],
        ..Default::default()
    };
    assert_eq!(
        ids(&store.list_sessions(&by_time, None, 100).unwrap()),
        ["s03", "s04", "s05"]
    );

    assert!(matches!(
        store.list_sessions(&SessionFilter::default(), Some("garbage"), 4),
        Err(Error::InvalidArgument(_))
    ));
}

fn permission(session: &str, request: &str, created_ms: i64) -> NewInteraction {
    NewInteraction {
        session_id: session.into(),
        request_id: request.into(),
        kind: InteractionKind::Permission,
        tool_name: Some("Bash".into()),
        input: Bytes::from_static(br#"{"command":"ls"}"#),
        suggestions: Some(Bytes::from_static(br#"[{"type":"addRules"}]"#)),
        event_seq: Some(3),
        created_ms,
    }
}

fn decision(state: InteractionState, by: &str) -> Decision {
    Decision {
        state,
        decided_by: by.into(),
        response: Some(Bytes::from(format!("{{\"by\":\"{by}\"}}"))),
        decided_ms: 500,
    }
}

/// GetInteraction's lookup: an exact request id in any state, a unique prefix, an ambiguous
/// prefix (a few candidates), the same id in two sessions (needs the session), unknown and
/// empty ids; daemon-wide it is a range scan over the 0015 index.
#[test]
fn interactions_are_looked_up_by_request_id_or_unique_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    store.create_session(new_session("a", 1)).wait().unwrap();
    store.create_session(new_session("b", 1)).wait().unwrap();
    for (session, request) in [
        ("a", "req_01"),
        ("a", "req_0"),
        ("a", "toolu_x1"),
        ("a", "toolu_x2"),
        ("b", "toolu_x2"),
        ("b", "req_1\u{10FFFF}"),
        ("b", "req_2"),
    ] {
        store
            .upsert_interaction(permission(session, request, 10))
            .wait()
            .unwrap();
    }
    store
        .decide_interaction(
            "a",
            "req_01",
            decision(InteractionState::Denied, "client:phone"),
        )
        .wait()
        .unwrap();
    let found = |session: Option<&str>, id: &str| match store.lookup_interaction(session, id) {
        Ok(InteractionLookup::Found(i)) => (i.session_id, i.request_id, i.state),
        other => panic!("{id:?}: {other:?}"),
    };

    // Exact id, decided: state, who, when and the response as stored.
    assert_eq!(
        found(None, "req_01"),
        ("a".into(), "req_01".into(), InteractionState::Denied)
    );
    let Ok(InteractionLookup::Found(i)) = store.lookup_interaction(None, "req_01") else {
        unreachable!()
    };
    assert_eq!(i.decided_by.as_deref(), Some("client:phone"));
    assert_eq!(i.decided_ms, Some(500));
    assert_eq!(
        i.response.as_deref(),
        Some(&br#"{"by":"client:phone"}"#[..])
    );
    assert_eq!(i.event_seq, Some(3));
    // An exact id wins over the longer ids it is a prefix of.
    assert_eq!(found(None, "req_0").1, "req_0");
    // A unique prefix, and one ending in the last code point's neighbourhood.
    assert_eq!(found(None, "req_2").1, "req_2");
    assert_eq!(found(None, "req_1").1, "req_1\u{10FFFF}");
    assert_eq!(found(None, "toolu_x1").2, InteractionState::Pending);
    // Within one session the other session's ids do not count.
    assert_eq!(found(Some("b"), "toolu_x").1, "toolu_x2");
    assert_eq!(found(Some("b"), "toolu_x2").0, "b");

    match store.lookup_interaction(None, "req_").unwrap() {
        InteractionLookup::Ambiguous { candidates, more } => {
            let ids: Vec<_> = candidates.iter().map(|i| i.request_id.as_str()).collect();
            assert_eq!(ids, ["req_0", "req_01", "req_1\u{10FFFF}", "req_2"]);
            assert!(!more);
        }
        other => panic!("{other:?}"),
    }
    match store.lookup_interaction(None, "toolu_x2").unwrap() {
        InteractionLookup::InSessions(both) => {
            let sessions: Vec<_> = both.iter().map(|i| i.session_id.as_str()).collect();
            assert_eq!(sessions, ["a", "b"]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        store.lookup_interaction(None, "nope").unwrap(),
        InteractionLookup::NotFound
    );
    assert_eq!(
        store.lookup_interaction(Some("a"), "req_2").unwrap(),
        InteractionLookup::NotFound
    );
    assert!(matches!(
        store.lookup_interaction(None, ""),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        store.lookup_interaction(Some("zz"), "req_2"),
        Err(Error::NotFound { .. })
    ));
    // The input is a literal prefix: LIKE wildcards, escapes, NUL and the code points
    // around the ends of UTF-8's ranges match nothing they do not start.
    for literal in [
        "%",
        "_",
        "re_",
        "req%",
        "req_%",
        "r%_0",
        "toolu_x_",
        "\\",
        "req\\_",
        "req_\0",
        "req_1\u{10FFFF}\u{10FFFF}",
        "\u{10FFFF}",
        "\u{FFFF}",
        "req_\u{D7FF}",
        "REQ_",
    ] {
        assert_eq!(
            store.lookup_interaction(None, literal).unwrap(),
            InteractionLookup::NotFound,
            "{literal:?}"
        );
    }
    assert_eq!(found(None, "req_1\u{10FFFF}").1, "req_1\u{10FFFF}");
    assert_eq!(found(Some("a"), "req_01").1, "req_01");

    // The daemon-wide range is an index search, not a scan of every interaction.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let plan: Vec<String> = conn
        .prepare(
            "EXPLAIN QUERY PLAN SELECT request_id FROM interactions \
             WHERE request_id >= 'req_' AND request_id < 'req`' ORDER BY request_id, session_pk",
        )
        .unwrap()
        .query_map([], |r| r.get::<_, String>(3))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(
        plan.iter()
            .any(|l| l.contains("interactions_by_request") && l.contains("request_id>?")),
        "{plan:?}"
    );
}

#[test]
fn interactions_are_recorded_listed_and_decided_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    store.create_session(new_session("a", 1)).wait().unwrap();
    store.create_session(new_session("b", 1)).wait().unwrap();
    let stored = store
        .upsert_interaction(permission("a", "r1", 10))
        .wait()
        .unwrap();
    assert_eq!(stored.state, InteractionState::Pending);
    assert_eq!(stored.tool_name.as_deref(), Some("Bash"));
    store
        .upsert_interaction(permission("b", "r1", 11))
        .wait()
        .unwrap(); // same id, other session
    let mut q = permission("a", "q1", 12);
    q.kind = InteractionKind::Question;
    q.tool_name = None;
    store.upsert_interaction(q).wait().unwrap();

    let pending = store.pending_interactions(None).unwrap();
    assert_eq!(
        pending
            .iter()
            .map(|i| (i.session_id.as_str(), i.request_id.as_str()))
            .collect::<Vec<_>>(),
        [("a", "r1"), ("b", "r1"), ("a", "q1")]
    );
    assert_eq!(store.pending_interactions(Some("a")).unwrap().len(), 2);

    // Many clients answer at once: exactly one wins, the others are told who did.
    let mut handles = Vec::new();
    for c in 0..8 {
        let store = store.clone();
        handles.push(std::thread::spawn(move || {
            let state = if c % 2 == 0 {
                InteractionState::Allowed
            } else {
                InteractionState::Denied
            };
            store
                .decide_interaction("a", "r1", decision(state, &format!("client-{c}")))
                .wait()
                .unwrap()
        }));
    }
    let outcomes: Vec<DecideOutcome> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let winners: Vec<&Interaction> = outcomes
        .iter()
        .filter_map(|o| match o {
            DecideOutcome::Decided(i) => Some(i),
            DecideOutcome::AlreadyDecided(_) => None,
        })
        .collect();
    assert_eq!(winners.len(), 1);
    let winner = winners[0].decided_by.clone().unwrap();
    for o in &outcomes {
        if let DecideOutcome::AlreadyDecided(i) = o {
            assert_eq!(i.decided_by.as_deref(), Some(winner.as_str()));
            assert!(i.state.is_final());
        }
    }
    let stored = store.interaction("a", "r1").unwrap();
    assert_eq!(stored.decided_by.as_deref(), Some(winner.as_str()));
    assert_eq!(
        stored.response,
        Some(Bytes::from(format!("{{\"by\":\"{winner}\"}}")))
    );
    assert_eq!(stored.decided_ms, Some(500));
    // A late re-upsert of a decided interaction does not reopen it.
    let again = store
        .upsert_interaction(permission("a", "r1", 99))
        .wait()
        .unwrap();
    assert_eq!(again.state, stored.state);
    assert_eq!(store.pending_interactions(Some("a")).unwrap().len(), 1);

    assert!(matches!(
        store
            .decide_interaction("a", "nope", decision(InteractionState::Allowed, "x"))
            .wait(),
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        store
            .decide_interaction("a", "q1", decision(InteractionState::Pending, "x"))
            .wait(),
        Err(Error::InvalidArgument(_))
    ));
    let answered = store
        .decide_interaction("a", "q1", decision(InteractionState::Answered, "rule:auto"))
        .wait()
        .unwrap();
    assert!(
        matches!(answered, DecideOutcome::Decided(ref i) if i.state == InteractionState::Answered)
    );

    // Session b ends: its pending interactions expire.
    let closed = store
        .close_pending_interactions(
            Some("b"),
            decision(InteractionState::Expired, "session-exit"),
        )
        .wait()
        .unwrap();
    assert_eq!(closed.len(), 1);
    assert_eq!(
        store.interaction("b", "r1").unwrap().state,
        InteractionState::Expired
    );
    assert!(store.pending_interactions(None).unwrap().is_empty());
}

#[test]
fn usage_is_recorded_per_turn_and_totalled() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    store.create_session(new_session("s", 1)).wait().unwrap();
    for i in 1..=3u64 {
        let turn = store
            .record_turn_usage(
                "s",
                TurnUsage {
                    event_seq: Some(i * 10),
                    model: Some("m".into()),
                    usage: UsageTotals {
                        input_tokens: 100 * i,
                        output_tokens: 10 * i,
                        cache_creation_input_tokens: i,
                        cache_read_input_tokens: 2 * i,
                        cost_usd: 0.25,
                    },
                    duration_ms: Some(1000),
                    ts_ms: i as i64,
                },
            )
            .wait()
            .unwrap();
        assert_eq!(turn, i);
    }
    let usage = store.usage("s").unwrap();
    assert_eq!(usage.turns.len(), 3);
    assert_eq!(usage.turns[2].turn, 3);
    assert_eq!(usage.turns[2].turn_usage.event_seq, Some(30));
    assert_eq!(usage.totals.input_tokens, 600);
    assert_eq!(usage.totals.output_tokens, 60);
    assert_eq!(usage.totals.cache_creation_input_tokens, 6);
    assert_eq!(usage.totals.cache_read_input_tokens, 12);
    assert!((usage.totals.cost_usd - 0.75).abs() < 1e-9);
    let session = store.get_session("s").unwrap();
    assert_eq!(session.turns, 3);
    assert_eq!(session.usage, usage.totals);
    assert!(matches!(store.usage("x"), Err(Error::NotFound { .. })));
    let bad = TurnUsage {
        usage: UsageTotals {
            input_tokens: u64::MAX,
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(matches!(
        store.record_turn_usage("s", bad).wait(),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(
        store.usage("s").unwrap().totals,
        usage.totals,
        "rejected turn left no trace"
    );
}

#[test]
fn deleting_a_session_removes_its_rows_and_gives_space_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    store.create_session(new_session("keep", 1)).wait().unwrap();
    store.create_session(new_session("big", 2)).wait().unwrap();
    store
        .append_blocking("keep", (0..10).map(event).collect())
        .unwrap();
    let payload = vec![42u8; 1000];
    for chunk in 0..20 {
        let events = (0..100)
            .map(|i| NewEvent::new("k", payload.clone(), chunk * 100 + i))
            .collect();
        store.append_blocking("big", events).unwrap();
    }
    store
        .upsert_interaction(permission("big", "r", 1))
        .wait()
        .unwrap();
    store
        .record_turn_usage("big", TurnUsage::default())
        .wait()
        .unwrap();

    let conn = raw_conn(&path);
    let pragma = |name: &str| -> i64 { conn.pragma_query_value(None, name, |r| r.get(0)).unwrap() };
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    let pages_before = pragma("page_count");
    let file_before = std::fs::metadata(&path).unwrap().len();

    store.delete_session("big").wait().unwrap();

    assert!(matches!(
        store.get_session("big"),
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        store.events_after("big", 0, 10),
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        store.append_blocking("big", vec![event(1)]),
        Err(Error::NotFound { .. })
    ));
    assert!(matches!(
        store.delete_session("big").wait(),
        Err(Error::NotFound { .. })
    ));
    for table in ["events", "interactions", "turn_usage", "session_labels"] {
        let n: i64 = conn
            .query_row(
                &format!(
                    "SELECT count(*) FROM {table} WHERE session_pk NOT IN (SELECT pk FROM sessions)"
                ),
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(n, 0, "orphans in {table}");
    }
    assert_eq!(store.events_after("keep", 0, 100).unwrap().len(), 10);

    assert_eq!(pragma("freelist_count"), 0, "freed pages were handed back");
    let pages_after = pragma("page_count");
    assert!(
        pages_after * 4 < pages_before,
        "{pages_before} -> {pages_after} pages"
    );
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    let file_after = std::fs::metadata(&path).unwrap().len();
    assert!(
        file_after * 4 < file_before,
        "file {file_before} -> {file_after} bytes"
    );

    // A new session may reuse the id and starts at seq 1 again.
    store.create_session(new_session("big", 3)).wait().unwrap();
    assert_eq!(
        store.append_blocking("big", vec![event(1)]).unwrap(),
        vec![1]
    );
}

/// Readers paging through a session while the writer appends always see a gap-free prefix.
#[test]
fn readers_paging_during_appends_see_a_consistent_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    store.create_session(new_session("s", 1)).wait().unwrap();
    const TOTAL: u64 = 20_000;
    let done = Arc::new(AtomicBool::new(false));

    let writer = {
        let store = store.clone();
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let mut n = 0u64;
            let mut i = 0u64;
            while n < TOTAL {
                let k = ((i * 7) % 13 + 1).min(TOTAL - n);
                // Several in-flight appends so group commits really group.
                let tickets: Vec<_> = (0..4)
                    .map(|j| store.append("s", (0..k).map(|x| event(n + j * k + x + 1)).collect()))
                    .collect();
                for t in tickets {
                    n += t.wait().unwrap().len() as u64;
                }
                i += 1;
            }
            done.store(true, Ordering::SeqCst);
            n
        })
    };

    let readers: Vec<_> = (0..3)
        .map(|r| {
            let store = store.clone();
            let done = Arc::clone(&done);
            std::thread::spawn(move || {
                let mut next = 1u64;
                let mut pages_while_writing = 0u64;
                loop {
                    let writing = !done.load(Ordering::SeqCst);
                    let page = store.events_after("s", next - 1, 50 + r * 37).unwrap();
                    for e in &page {
                        assert_eq!(e.seq, next, "reader {r} saw a gap");
                        assert_eq!(
                            e.payload,
                            event(e.seq).payload,
                            "reader {r} payload of {}",
                            e.seq
                        );
                        next += 1;
                    }
                    if writing && !page.is_empty() {
                        pages_while_writing += 1;
                    }
                    // Also the session row must never be behind what we already read.
                    let last = store.get_session("s").unwrap().last_seq;
                    assert!(
                        last + 1 >= next,
                        "session says {last}, we read up to {}",
                        next - 1
                    );
                    if !writing && page.is_empty() {
                        return (next - 1, pages_while_writing);
                    }
                }
            })
        })
        .collect();

    let written = writer.join().unwrap();
    for r in readers {
        let (read, while_writing) = r.join().unwrap();
        assert_eq!(read, written);
        assert!(
            while_writing > 0,
            "the reader should have overlapped the writer"
        );
    }
}

#[test]
fn options_are_validated_and_every_mode_keeps_the_invariants() {
    let dir = tempfile::tempdir().unwrap();
    let zero = StoreOptions {
        max_batch: 0,
        ..StoreOptions::default()
    };
    assert!(matches!(
        Store::open(db_path(&dir), zero),
        Err(Error::InvalidArgument(_))
    ));
    for (i, (sync, max_batch)) in [
        (Synchronous::Full, 1),
        (Synchronous::Full, 64),
        (Synchronous::Normal, 1),
    ]
    .into_iter()
    .enumerate()
    {
        let path = dir.path().join(format!("mode{i}.db"));
        let opts = StoreOptions {
            synchronous: sync,
            max_batch,
            read_pool_size: 0,
            ..StoreOptions::default()
        };
        let store = Store::open(&path, opts).unwrap();
        store.create_session(new_session("s", 1)).wait().unwrap();
        let tickets: Vec<_> = (0..40)
            .map(|n| store.append("s", vec![event(n), event(n)]))
            .collect();
        let seqs: Vec<u64> = tickets
            .into_iter()
            .flat_map(|t| t.wait().unwrap())
            .collect();
        assert_eq!(
            seqs,
            (1..=80).collect::<Vec<_>>(),
            "{sync:?} max_batch={max_batch}"
        );
        assert_eq!(store.events_after("s", 0, 1000).unwrap().len(), 80);
    }
}

/// Checkpoints run off the commit path, and they do run: appending ~60 MB (almost four
/// times the WAL's hard bound) keeps the WAL file under the bound at every step (plus one
/// append's frames), and once the checkpointer has caught up everything is in the database
/// file and the WAL restarts from its beginning.
#[test]
fn the_wal_stays_under_its_bound_while_appending() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    store.create_session(new_session("s", 1)).wait().unwrap();
    let page: u64 = raw_conn(&path)
        .pragma_query_value(None, "page_size", |r| r.get(0))
        .unwrap();
    let wal_len = || {
        std::fs::metadata(path.with_extension("db-wal"))
            .map(|m| m.len())
            .unwrap_or(0)
    };
    // One append: 4 events of 4 KiB (each spills to an overflow page) and the tree pages
    // above them; generously 64 frames.
    let bound = (WAL_BOUND_FRAMES + 64) * (page + 24) + 32;
    let payload = vec![3u8; 4096];
    let appends = 3600u64;
    let total = appends * 4 * 4096;
    let mut max_wal = 0;
    for _ in 0..appends {
        let events = (0..4)
            .map(|i| NewEvent::new("k", payload.clone(), i))
            .collect();
        store.append_blocking("s", events).unwrap();
        max_wal = max_wal.max(wal_len());
        assert!(max_wal <= bound, "WAL file {max_wal} bytes > bound {bound}");
    }
    assert!(
        store.wait_checkpointed(ostler_testkit::timeouts::secs(60)),
        "the checkpointer did not catch up on an idle store"
    );
    let db = std::fs::metadata(&path).unwrap().len();
    assert!(
        db > total,
        "database file is {db} bytes after {total} bytes appended"
    );
    // Everything was copied: the next commit writes from the WAL's beginning.
    store
        .append_blocking("s", vec![NewEvent::new("k", payload.clone(), 0)])
        .unwrap();
    let frames: i64 = raw_conn(&path)
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get(1))
        .unwrap();
    assert!(frames < 64, "WAL did not restart: {frames} frames");
    assert_eq!(store.last_seq("s").unwrap(), appends * 4 + 1);
}

/// A reader holding a snapshot open (a slow client replaying) neither blocks appends nor
/// sees them; a new read sees everything.
#[test]
fn a_long_read_neither_blocks_appends_nor_sees_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    store.create_session(new_session("s", 1)).wait().unwrap();
    store
        .append_blocking("s", (1..=10).map(event).collect())
        .unwrap();

    let reader = raw_conn(&path);
    reader.execute_batch("BEGIN").unwrap();
    let count = |c: &rusqlite::Connection| -> i64 {
        c.query_row("SELECT count(*) FROM events", [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(count(&reader), 10, "snapshot taken");
    // Enough appends to cross the checkpoint thresholds while the snapshot is held.
    for chunk in 0..60u64 {
        let events = (0..100)
            .map(|i| NewEvent::new("k", vec![1u8; 3000], (chunk * 100 + i) as i64))
            .collect();
        store.append_blocking("s", events).unwrap();
    }
    assert_eq!(count(&reader), 10, "the open snapshot does not change");
    reader.execute_batch("COMMIT").unwrap();
    assert_eq!(count(&reader), 6010);
    assert_eq!(store.last_seq("s").unwrap(), 6010);
}

#[test]
fn append_now_commits_on_an_idle_writer_and_never_overtakes_queued_writes() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    store.create_session(new_session("s", 1)).wait().unwrap();
    // Idle writer: committed on this thread, the ticket resolved on return.
    let mut now = store.append_now("s", vec![event(1)]);
    assert_eq!(now.try_take().map(Result::unwrap), Some(vec![1]));
    assert_eq!(store.last_seq("s").unwrap(), 1);
    // Behind queued writes (the writer busy or not), it takes its turn after them.
    let mut next = 2;
    for round in 0..20 {
        let queued: Vec<_> = (0..round * 10)
            .map(|i| store.append("s", vec![event(i)]))
            .collect();
        let last = store.append_now("s", vec![event(0)]);
        for t in queued {
            assert_eq!(t.wait().unwrap(), vec![next]);
            next += 1;
        }
        assert_eq!(last.wait().unwrap(), vec![next], "round {round}");
        next += 1;
    }
}

#[test]
fn writers_on_many_threads_mixing_append_and_append_now_keep_each_log_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let sid = format!("s{t}");
                store.create_session(new_session(&sid, 1)).wait().unwrap();
                let tickets: Vec<_> = (0..300u64)
                    .map(|i| {
                        if (i + t) % 3 == 0 {
                            store.append(&sid, vec![event(i)])
                        } else {
                            store.append_now(&sid, vec![event(i)])
                        }
                    })
                    .collect();
                let seqs: Vec<u64> = tickets
                    .into_iter()
                    .flat_map(|t| t.wait().unwrap())
                    .collect();
                assert_eq!(seqs, (1..=300).collect::<Vec<_>>(), "{sid}");
                let stored: Vec<Bytes> = store
                    .events_after(&sid, 0, 1000)
                    .unwrap()
                    .into_iter()
                    .map(|e| e.payload)
                    .collect();
                let sent: Vec<Bytes> = (0..300).map(|i| event(i).payload).collect();
                assert_eq!(stored, sent, "{sid}: stored in issue order");
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn append_now_meeting_a_lock_held_elsewhere_is_retried_by_the_writer_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = Store::open(
        &path,
        StoreOptions {
            busy_timeout: std::time::Duration::from_millis(20),
            ..StoreOptions::default()
        },
    )
    .unwrap();
    store.create_session(new_session("s", 1)).wait().unwrap();
    store.append_blocking("s", vec![event(1)]).unwrap();
    // Another connection holds the write lock: the commit on this thread meets a busy
    // database (a storage fault) and hands the write to the writer thread, which retries.
    let other = raw_conn(&path);
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let mut now = store.append_now("s", vec![event(2)]);
    assert!(
        now.try_take().is_none(),
        "not committed while the lock is held"
    );
    let queued = store.append("s", vec![event(3)]);
    other.execute_batch("ROLLBACK").unwrap();
    assert_eq!(now.wait().unwrap(), vec![2]);
    assert_eq!(queued.wait().unwrap(), vec![3]);
    assert!(store.write_health().is_writable());
    let stored: Vec<Bytes> = store
        .events_after("s", 0, 10)
        .unwrap()
        .into_iter()
        .map(|e| e.payload)
        .collect();
    assert_eq!(
        stored,
        (1..=3).map(|i| event(i).payload).collect::<Vec<_>>()
    );
}
