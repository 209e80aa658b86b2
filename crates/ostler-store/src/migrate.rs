//! Schema migrations: `migrations/NNNN_name.sql` at the repository root, embedded at build
//! time and applied in order when a database is opened. The applied version is the
//! database's `PRAGMA user_version`, updated in the same transaction as each migration, so a
//! crash mid-migration leaves the previous version intact.

use std::path::Path;

use rusqlite::{Connection, TransactionBehavior};

use crate::error::{Error, Result};

/// One embedded migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// The version the database has once this migration is applied (1, 2, 3, ...).
    pub version: u32,
    /// The file name, e.g. `0001_initial.sql`.
    pub name: &'static str,
    /// The SQL.
    pub sql: &'static str,
}

macro_rules! migration {
    ($version:literal, $name:literal) => {
        Migration {
            version: $version,
            name: $name,
            sql: include_str!(concat!("../../../migrations/", $name)),
        }
    };
}

/// Every migration, in order. Version `i + 1` is at index `i`.
pub const MIGRATIONS: &[Migration] = &[
    migration!(1, "0001_initial.sql"),
    migration!(2, "0002_usage.sql"),
    migration!(3, "0003_events_one_copy.sql"),
    migration!(4, "0004_feed.sql"),
    migration!(5, "0005_hook.sql"),
    migration!(6, "0006_tool_call.sql"),
    migration!(7, "0007_feed_by_writer.sql"),
    migration!(8, "0008_events_dictionary.sql"),
    migration!(9, "0009_events_by_id.sql"),
    migration!(10, "0010_elicitation.sql"),
    migration!(11, "0011_feed_deleted.sql"),
    migration!(12, "0012_dialog.sql"),
    migration!(13, "0013_feed_pruned.sql"),
    migration!(14, "0014_session_archived.sql"),
    migration!(15, "0015_interactions_by_request.sql"),
];

/// The schema version this build writes (the last migration's version).
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// Reads the database's schema version.
pub(crate) fn current_version(conn: &Connection) -> rusqlite::Result<u32> {
    conn.pragma_query_value(None, "user_version", |row| row.get::<_, u32>(0))
}

/// Brings the database at `path` (open on `conn`) up to `target`, one transaction per
/// migration. Refuses databases newer than this build.
pub(crate) fn migrate_to(conn: &mut Connection, path: &Path, target: u32) -> Result<()> {
    let at = |e: rusqlite::Error| Error::sqlite_at(path, e);
    let found = current_version(conn).map_err(at)?;
    if found > SCHEMA_VERSION {
        return Err(Error::NewerSchema {
            path: path.to_path_buf(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    let mut applied = false;
    if found > 0 && found < target {
        // Before the daemon serves (it listens meanwhile and answers NOT_SERVING): on a
        // large store this can take a while (docs/operations.md, "Upgrades").
        tracing::info!(
            path = %path.display(),
            from = found,
            to = target,
            "upgrading the store's schema before serving"
        );
    }
    for m in MIGRATIONS
        .iter()
        .filter(|m| m.version > found && m.version <= target)
    {
        let started = std::time::Instant::now();
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(at)?;
        // Another process may have migrated while we waited for the write lock.
        if current_version(&tx).map_err(at)? >= m.version {
            continue;
        }
        tx.execute_batch(m.sql).map_err(|e| {
            tracing::error!(migration = m.name, error = %e, "migration failed");
            at(e)
        })?;
        tx.pragma_update(None, "user_version", m.version)
            .map_err(at)?;
        tx.commit().map_err(at)?;
        applied = true;
        tracing::info!(
            path = %path.display(),
            migration = m.name,
            secs = started.elapsed().as_secs_f64(),
            "applied schema migration"
        );
    }
    // Also when a start before this one was cut off while giving the space back (the
    // migrations were committed, their free pages not yet moved out): more than a quarter
    // of the file free is that (deletes give their pages back at once).
    if applied || mostly_free(conn).map_err(at)? {
        give_space_back(conn).map_err(at)?;
    }
    Ok(())
}

/// Whether more than a quarter of the file's pages (and at least 1,024) are free.
fn mostly_free(conn: &Connection) -> rusqlite::Result<bool> {
    let free: i64 = conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
    let pages: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
    Ok(free >= 1024 && free * 4 > pages)
}

/// After migrations: a migration that rebuilds a table (0003, 0008, 0009 rebuild `events`)
/// leaves the old table's pages free inside the file, doubling it until new events reuse
/// them. With `auto_vacuum = INCREMENTAL` they are moved out and the file truncated
/// (measured: 1M events, 300 MB freed, 1.8 s), then the WAL, which now holds a copy of the
/// whole table, is checkpointed and emptied. A store without auto-vacuum keeps its free
/// pages (the vacuum does nothing there).
fn give_space_back(conn: &Connection) -> rusqlite::Result<()> {
    let free: i64 = conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
    if free == 0 {
        return Ok(());
    }
    let mut vacuum = conn.prepare("PRAGMA incremental_vacuum")?;
    let mut rows = vacuum.query([])?;
    while rows.next()?.is_some() {}
    drop(rows);
    drop(vacuum);
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    let left: i64 = conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
    tracing::info!(
        freed_pages = free - left,
        "gave the free pages of a migration back"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new database at `path` with the schema of `version` (for data written by an older
    /// ostler), and its write connection.
    fn at_version(path: &Path, version: u32) -> Connection {
        let mut conn =
            crate::connection::open_write_connection(path, &crate::types::StoreOptions::default())
                .expect("open");
        migrate_to(&mut conn, path, version).expect("older schema");
        conn
    }

    /// Every `migrations/*.sql` file is embedded, in order, with contiguous versions that
    /// match the file name prefix.
    #[test]
    fn every_migration_file_is_embedded_in_order() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .expect("migrations dir")
            .map(|e| {
                e.expect("dir entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .filter(|n| n.ends_with(".sql"))
            .collect();
        files.sort();
        let embedded: Vec<&str> = MIGRATIONS.iter().map(|m| m.name).collect();
        assert_eq!(files, embedded);
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version as usize, i + 1);
            let prefix: u32 = m.name[..4].parse().expect("NNNN_ prefix");
            assert_eq!(prefix, m.version, "{}", m.name);
            assert_eq!(&m.name[4..5], "_", "{}", m.name);
        }
    }

    /// A database created with the first schema and holding data is brought to the current
    /// schema on open, keeping every row and gaining the newer features.
    #[test]
    fn first_schema_with_data_migrates_to_current() {
        use crate::types::*;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("old.db");
        {
            let conn = at_version(&path, 1);
            assert_eq!(current_version(&conn).expect("version"), 1);
            conn.execute_batch(
                r#"
                INSERT INTO sessions (pk, id, claude_session_id, cwd, model, permission_mode,
                                      cli_release, state, created_ms, updated_ms,
                                      exit_code, exit_signal, exit_reason, exited_ms)
                VALUES (1, 'old', 'c-1', '/w', 'm', 'default', '1.0.128', 'exited', 10, 20,
                        0, NULL, 'done', 20);
                INSERT INTO session_labels VALUES (1, 'team', 'infra');
                INSERT INTO events VALUES (1, 1, 'system', x'7b7d', x'7b2274797065223a2273797374656d227d', 11);
                INSERT INTO events VALUES (1, 2, 'result', x'7b2272223a317d', NULL, 12);
                INSERT INTO interactions (session_pk, request_id, kind, tool_name, input,
                                          suggestions, event_seq, state, created_ms)
                VALUES (1, 'r1', 'permission', 'Bash', x'7b7d', NULL, 1, 'pending', 11);
                "#,
            )
            .expect("v1 data");
            // Version 1 has no usage columns yet.
            assert!(conn.prepare("SELECT turns FROM sessions").is_err());
        }

        let store = crate::Store::open(&path, StoreOptions::default()).expect("migrating open");
        {
            let conn = rusqlite::Connection::open(&path).expect("raw");
            assert_eq!(current_version(&conn).expect("version"), SCHEMA_VERSION);
        }
        let s = store.get_session("old").expect("session kept");
        assert_eq!(s.claude_session_id.as_deref(), Some("c-1"));
        assert_eq!(s.cli_release.as_deref(), Some("1.0.128"));
        assert_eq!(s.labels.get("team").map(String::as_str), Some("infra"));
        assert_eq!(
            s.exit.as_ref().and_then(|e| e.reason.as_deref()),
            Some("done")
        );
        assert_eq!(s.last_seq, 2);
        assert_eq!(s.turns, 0);
        assert_eq!(s.usage, UsageTotals::default());

        let events = store.events_after("old", 0, 10).expect("events kept");
        assert_eq!(events.len(), 2);
        assert_eq!(
            events[0].raw.as_deref().expect("raw"),
            br#"{"type":"system"}"#
        );
        assert_eq!(&events[1].payload[..], br#"{"r":1}"#);
        assert_eq!(events[1].raw, None);

        let pending = store
            .pending_interactions(Some("old"))
            .expect("interactions kept");
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].request_id, "r1");

        // New features work on migrated data, and the log continues without a gap.
        let turn = store
            .record_turn_usage(
                "old",
                TurnUsage {
                    usage: UsageTotals {
                        input_tokens: 5,
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
            .wait()
            .expect("usage on migrated session");
        assert_eq!(turn, 1);
        assert_eq!(store.usage("old").expect("usage").totals.input_tokens, 5);
        let seqs = store
            .append_blocking("old", vec![NewEvent::new("user", b"{}".to_vec(), 30)])
            .expect("append");
        assert_eq!(seqs, vec![3]);
        drop(store);

        // Reopening a current database applies nothing and changes nothing.
        let store = crate::Store::open(&path, StoreOptions::default()).expect("reopen");
        assert_eq!(store.last_seq("old").expect("seq"), 3);

        // 0005: a hook call is an interaction of kind `hook`, listed pending with the
        // permission kept from version 1; its request event is a `hook_pending` feed item
        // and its resolution an `interaction_resolved` one.
        store
            .upsert_interaction(NewInteraction {
                session_id: "old".into(),
                request_id: "h1".into(),
                kind: InteractionKind::Hook,
                tool_name: Some("PreToolUse".into()),
                input: bytes::Bytes::from_static(b"{}"),
                suggestions: None,
                event_seq: None,
                created_ms: 40,
            })
            .wait()
            .expect("a hook interaction");
        let kinds: Vec<_> = store
            .pending_interactions(Some("old"))
            .expect("pending")
            .iter()
            .map(|i| i.kind)
            .collect();
        assert_eq!(
            kinds,
            vec![InteractionKind::Permission, InteractionKind::Hook]
        );
        store
            .append_blocking(
                "old",
                vec![
                    NewEvent::new("hook_requested", b"{}".to_vec(), 41),
                    NewEvent::new("hook_resolved", b"{}".to_vec(), 42),
                ],
            )
            .expect("append hook events");
        let feed = store.feed_after(0, 100).expect("feed");
        let tail: Vec<_> = feed.entries.iter().rev().take(2).map(|e| e.kind).collect();
        assert_eq!(
            tail,
            vec![
                crate::FeedKind::InteractionResolved,
                crate::FeedKind::HookPending
            ]
        );
    }

    /// Events written with the schema before 0003 (payload and raw line both verbatim) read
    /// back byte for byte after the migration, now stored once (payload as a delta against
    /// the raw line where that is smaller), and the log continues without a gap.
    #[test]
    fn events_of_schema_2_read_back_identical_after_the_one_copy_migration() {
        use crate::types::*;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v2.db");
        let deep = format!("{}1{}", "[".repeat(5000), "]".repeat(5000));
        let mut expected: Vec<(String, Vec<u8>, Option<Vec<u8>>)> = Vec::new();
        for i in 0..300u32 {
            let text = format!(
                "answer {i}: {}",
                "tool output line\n".repeat(i as usize % 40)
            );
            let raw = format!(
                r#"{{"type":"assistant","message":{{"id":"m{i}","content":[{{"type":"text","text":"{text}"}}]}},"deep":{deep}}}"#
            );
            let payload = format!(r#"{{"message_id":"m{i}","text":"{text}","deep":{deep}}}"#);
            let (kind, raw) = match i % 5 {
                0 => ("engine_notice", None),
                1 => ("unknown", Some(vec![0xff, 0xfe, b'x', i as u8])),
                _ => ("assistant_block", Some(raw.into_bytes())),
            };
            expected.push((kind.to_owned(), payload.into_bytes(), raw));
        }
        let old_columns;
        {
            let conn = at_version(&path, 2);
            conn.execute_batch(
                "INSERT INTO sessions (pk, id, cwd, state, created_ms, updated_ms)
                 VALUES (1, 'a', '/w', 'idle', 1, 1), (2, 'b', '/w', 'idle', 1, 1);",
            )
            .expect("sessions");
            let mut st = conn
                .prepare("INSERT INTO events VALUES (?1, ?2, ?3, ?4, ?5, ?6)")
                .expect("insert");
            for (n, (kind, payload, raw)) in expected.iter().enumerate() {
                // Two sessions, interleaved.
                let (pk, seq) = ((n % 2) as i64 + 1, (n / 2) as i64 + 1);
                st.execute(rusqlite::params![pk, seq, kind, payload, raw, n as i64])
                    .expect("row");
            }
            drop(st);
            old_columns = conn
                .query_row(
                    "SELECT sum(length(payload)) + sum(coalesce(length(raw), 0)) FROM events",
                    [],
                    |r| r.get::<_, i64>(0),
                )
                .expect("sizes");
        }

        let store = crate::Store::open(&path, StoreOptions::default()).expect("migrating open");
        for (sid, parity) in [("a", 0), ("b", 1)] {
            let events = store.events_after(sid, 0, 1000).expect("events");
            let want: Vec<_> = expected
                .iter()
                .enumerate()
                .filter(|(n, _)| n % 2 == parity)
                .collect();
            assert_eq!(events.len(), want.len());
            for (ev, (n, (kind, payload, raw))) in events.iter().zip(want) {
                assert_eq!(ev.seq, (n / 2) as u64 + 1);
                assert_eq!(&*ev.kind, kind);
                assert_eq!(&ev.payload[..], &payload[..], "payload of event {n}");
                assert_eq!(ev.raw.as_deref(), raw.as_deref(), "raw of event {n}");
                assert_eq!(ev.ts_ms, n as i64);
            }
            assert_eq!(store.last_seq(sid).expect("seq"), 150);
        }
        let conn = rusqlite::Connection::open(&path).expect("raw");
        let (deltas, new_columns): (i64, i64) = conn
            .query_row(
                "SELECT sum(codec), sum(length(payload)) + sum(coalesce(length(raw), 0)) FROM events",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .expect("sizes");
        assert_eq!(
            deltas, 180,
            "the events with a matching raw line are deltas"
        );
        assert!(
            new_columns * 10 < old_columns * 7,
            "{old_columns} -> {new_columns} bytes"
        );
        let seqs = store
            .append_blocking("a", vec![NewEvent::new("user", b"{}".to_vec(), 30)])
            .expect("append");
        assert_eq!(seqs, vec![151]);
    }

    /// Events of schema 8 (a rowid table keyed by `(session_pk, seq)`) read back the same
    /// after 0009 makes the key the row id: every session's events in seq order with their
    /// bytes, last seqs, appends continuing without a gap, and a deleted session taking
    /// exactly its own events along (the trigger that replaced ON DELETE CASCADE).
    #[test]
    fn events_of_schema_8_keep_their_order_and_bytes_under_the_id_key() {
        use crate::types::*;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v8.db");
        // (session pk, seq, kind, codec, payload, raw), three sessions interleaved; pk 3 is
        // created first so that pk order differs from creation order.
        type Row = (i64, i64, String, i64, Vec<u8>, Option<Vec<u8>>);
        let mut rows: Vec<Row> = Vec::new();
        for n in 0..240i64 {
            let pk = [3, 1, 2][(n % 3) as usize];
            let seq = n / 3 + 1;
            // Big enough that the old table's pages are many once the rebuild frees them.
            let payload =
                format!(r#"{{"n":{n},"pk":{pk},"pad":"{}"}}"#, "x".repeat(1000)).into_bytes();
            let raw = (n % 4 != 0).then(|| format!(r#"{{"type":"x","n":{n}}}"#).into_bytes());
            rows.push((pk, seq, format!("kind_{}", n % 5), 0, payload, raw));
        }
        {
            let conn = at_version(&path, 8);
            conn.execute_batch(
                "INSERT INTO sessions (pk, id, cwd, state, created_ms, updated_ms)
                 VALUES (3, 'c', '/w', 'idle', 1, 1), (1, 'a', '/w', 'idle', 2, 2),
                        (2, 'b', '/w', 'idle', 3, 3);",
            )
            .expect("sessions");
            let mut st = conn
                .prepare(
                    "INSERT INTO events (session_pk, seq, kind, ts_ms, codec, payload, raw)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )
                .expect("insert");
            for (pk, seq, kind, codec, payload, raw) in &rows {
                st.execute(rusqlite::params![
                    pk,
                    seq,
                    kind,
                    seq * 10,
                    codec,
                    payload,
                    raw
                ])
                .expect("row");
            }
        }

        let store = crate::Store::open(&path, StoreOptions::default()).expect("migrating open");
        {
            // The rebuild's freed pages (the old table) were given back to the file system.
            let conn = rusqlite::Connection::open(&path).expect("raw");
            let free: i64 = conn
                .query_row("PRAGMA freelist_count", [], |r| r.get(0))
                .expect("freelist");
            assert_eq!(free, 0, "pages left free after the migration");
        }
        for (sid, pk) in [("a", 1), ("b", 2), ("c", 3)] {
            let want: Vec<_> = rows.iter().filter(|r| r.0 == pk).collect();
            let got = store.events_after(sid, 0, 1000).expect("events");
            assert_eq!(got.len(), want.len(), "{sid}");
            for (ev, (_, seq, kind, _, payload, raw)) in got.iter().zip(&want) {
                assert_eq!(ev.seq, *seq as u64);
                assert_eq!(&*ev.kind, kind);
                assert_eq!(ev.ts_ms, seq * 10);
                assert_eq!(&ev.payload[..], &payload[..]);
                assert_eq!(ev.raw.as_deref(), raw.as_deref());
            }
            // A page from the middle, and the newest-first read by kind.
            let page = store.events_after(sid, 70, 5).expect("page");
            assert_eq!(
                page.iter().map(|e| e.seq).collect::<Vec<_>>(),
                [71, 72, 73, 74, 75]
            );
            let newest: Vec<u64> = store
                .events_of_kinds_before(sid, &["kind_0", "kind_1"], 40, 3)
                .expect("by kind")
                .iter()
                .map(|e| e.seq)
                .collect();
            let want_newest: Vec<u64> = want
                .iter()
                .rev()
                .filter(|r| r.1 < 40 && (r.2 == "kind_0" || r.2 == "kind_1"))
                .take(3)
                .map(|r| r.1 as u64)
                .collect();
            assert_eq!(newest.len(), 3);
            assert_eq!(newest, want_newest, "{sid}");
            assert_eq!(store.last_seq(sid).expect("last"), 80);
            assert_eq!(store.get_session(sid).expect("record").last_seq, 80);
        }
        let seqs = store
            .append_blocking("b", vec![NewEvent::new("user", b"{}".to_vec(), 1)])
            .expect("append");
        assert_eq!(seqs, vec![81]);
        store.delete_session("b").wait().expect("delete");
        assert_eq!(store.events_after("a", 0, 1000).expect("a").len(), 80);
        assert_eq!(store.events_after("c", 0, 1000).expect("c").len(), 80);
        drop(store);
        let conn = rusqlite::Connection::open(&path).expect("raw");
        let left: Vec<(i64, i64)> = conn
            .prepare("SELECT session_pk, count(*) FROM events GROUP BY session_pk")
            .expect("q")
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("rows")
            .collect::<rusqlite::Result<_>>()
            .expect("collect");
        assert_eq!(left, [(1, 80), (3, 80)]);
        // One b-tree: no index on events.
        let indexes: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'events'",
                [],
                |r| r.get(0),
            )
            .expect("indexes");
        assert_eq!(indexes, 0);
    }

    /// A schema-10 store whose feed counter ran past its rows (the newest were deleted with
    /// their session) gains 0011: its entries read as before, and a deletion's entry takes
    /// a cursor beyond every one handed out before the upgrade, with the session's labels.
    #[test]
    fn a_schema_10_feed_gets_deletion_entries_after_its_old_cursors() {
        use crate::types::*;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v10.db");
        {
            let conn = at_version(&path, 10);
            conn.execute_batch(
                "INSERT INTO sessions (pk, id, cwd, state, created_ms, updated_ms)
                 VALUES (1, 'a', '/w', 'idle', 1, 1), (2, 'b', '/w', 'exited', 1, 1);
                 INSERT INTO session_labels VALUES (2, 'team', 'infra');
                 INSERT INTO events (id, kind, ts_ms, codec, payload)
                 VALUES ((1 << 36) | 1, 'engine_notice', 1, 0, x'7b7d'),
                        ((2 << 36) | 1, 'engine_notice', 1, 0, x'7b7d'),
                        ((2 << 36) | 2, 'turn_completed', 2, 0, x'7b7d');
                 INSERT INTO feed (id, session_pk, seq, kind)
                 VALUES (1, 1, 1, 'session_created'), (2, 2, 1, 'session_created'),
                        (3, 2, 2, 'turn_completed');
                 UPDATE sqlite_sequence SET seq = 7 WHERE name = 'feed';",
            )
            .expect("v10 data");
        }
        let store = crate::Store::open(&path, StoreOptions::default()).expect("migrating open");
        assert_eq!(*store.feed_watch().borrow(), 7);
        let cursors = |after| -> Vec<(u64, crate::FeedKind)> {
            store
                .feed_after(after, 100)
                .expect("feed")
                .entries
                .iter()
                .map(|e| (e.cursor, e.kind))
                .collect()
        };
        assert_eq!(
            cursors(0),
            [
                (1, crate::FeedKind::SessionCreated),
                (2, crate::FeedKind::SessionCreated),
                (3, crate::FeedKind::TurnCompleted)
            ]
        );
        store.delete_session("b").wait().expect("delete");
        assert_eq!(*store.feed_watch().borrow(), 8);
        let page = store.feed_after(7, 100).expect("feed");
        assert_eq!(page.entries.len(), 1);
        let d = &page.entries[0];
        assert_eq!((d.cursor, d.kind), (8, crate::FeedKind::SessionDeleted));
        assert_eq!(d.event.seq, 3);
        assert_eq!(d.state, SessionState::Exited);
        assert_eq!(d.labels.get("team").map(String::as_str), Some("infra"));
        assert_eq!(
            cursors(0),
            [
                (1, crate::FeedKind::SessionCreated),
                (8, crate::FeedKind::SessionDeleted)
            ]
        );
    }

    /// A schema-8 store with a session pk too large for the id key (2^27) is not migrated:
    /// the open fails, and the file stays at version 8 with its events as they were.
    #[test]
    fn a_session_pk_beyond_the_id_key_stops_migration_0009_without_loss() {
        use crate::types::*;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("v8-big-pk.db");
        {
            let conn = at_version(&path, 8);
            conn.execute_batch(
                "INSERT INTO sessions (pk, id, cwd, state, created_ms, updated_ms)
                 VALUES (1, 'a', '/w', 'idle', 1, 1), (134217728, 'big', '/w', 'idle', 1, 1);
                 INSERT INTO events (session_pk, seq, kind, ts_ms, codec, payload)
                 VALUES (1, 1, 'user', 1, 0, x'7b7d'), (134217728, 1, 'user', 1, 0, x'7b7d');",
            )
            .expect("rows");
        }
        assert!(crate::Store::open(&path, StoreOptions::default()).is_err());
        let conn = rusqlite::Connection::open(&path).expect("raw");
        assert_eq!(current_version(&conn).expect("version"), 8);
        let n: i64 = conn
            .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
            .expect("count");
        assert_eq!(n, 2);
    }
}
