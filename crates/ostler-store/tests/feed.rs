//! The daemon-wide feed, session titles and notifier cursors (migration 0004).

mod common;

use common::*;
use ostler_store::*;

fn ev(kind: &'static str, n: i64) -> NewEvent {
    NewEvent::new(kind, format!("{{\"n\":{n}}}").into_bytes(), n)
}

fn kinds(page: &FeedPage) -> Vec<(String, u64, FeedKind)> {
    page.entries
        .iter()
        .map(|e| (e.session_id.clone(), e.event.seq, e.kind))
        .collect()
}

#[test]
fn attention_events_enter_the_feed_with_their_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    let mut watch = store.feed_watch();
    assert_eq!(*watch.borrow_and_update(), 0);
    store.create_session(new_session("a", 1)).wait().unwrap();
    store
        .append_blocking(
            "a",
            vec![
                ev("engine_notice", 1), // seq 1: session created
                ev("assistant_block", 2),
                ev("engine_notice", 3), // not the first: not in the feed
                ev("permission_requested", 4),
                ev("interaction_resolved", 5),
                ev("turn_completed", 6),
                ev("state_changed", 7),
                ev("process_exited", 8),
                ev("question_asked", 9),
                ev("hook_requested", 10),
                ev("hook_resolved", 11),
                ev("tool_call_requested", 12),
                ev("tool_call_resolved", 13),
                ev("partial_delta", 14),
                ev("unknown", 15),
            ],
        )
        .unwrap();
    // Published after the commit.
    assert!(watch.has_changed().unwrap());
    assert_eq!(*watch.borrow_and_update(), 11);
    let page = store.feed_after(0, 100).unwrap();
    let a = |seq, k| ("a".to_owned(), seq, k);
    assert_eq!(
        kinds(&page),
        vec![
            a(1, FeedKind::SessionCreated),
            a(4, FeedKind::PermissionRequested),
            a(5, FeedKind::InteractionResolved),
            a(6, FeedKind::TurnCompleted),
            a(7, FeedKind::StateChanged),
            a(8, FeedKind::ProcessExited),
            a(9, FeedKind::QuestionAsked),
            a(10, FeedKind::HookPending),
            a(11, FeedKind::InteractionResolved),
            a(12, FeedKind::ToolCallRequested),
            a(13, FeedKind::InteractionResolved),
        ]
    );
    assert_eq!(page.scanned_to, 11);
    assert_eq!(page.entries[3].event.payload.as_ref(), b"{\"n\":6}");
    assert_eq!(page.entries[0].cwd, "/work/project");

    // Paging.
    let first = store.feed_after(0, 3).unwrap();
    assert_eq!(first.entries.len(), 3);
    let rest = store.feed_after(first.scanned_to, 100).unwrap();
    assert_eq!(rest.entries.len(), 8);
    assert_eq!(
        store.feed_after(11, 100).unwrap(),
        FeedPage {
            entries: vec![],
            scanned_to: 11,
            pruned_to: 0
        }
    );

    // A write that fails (unknown session) adds nothing and publishes nothing.
    assert!(
        store
            .append_blocking("nope", vec![ev("state_changed", 1)])
            .is_err()
    );
    assert!(!watch.has_changed().unwrap());
}

#[test]
fn cursors_are_never_reused_and_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    {
        let store = open(&path);
        store.create_session(new_session("a", 1)).wait().unwrap();
        store.create_session(new_session("b", 2)).wait().unwrap();
        store
            .append_blocking("a", vec![ev("state_changed", 1)])
            .unwrap();
        store
            .append_blocking("b", vec![ev("state_changed", 1), ev("turn_completed", 2)])
            .unwrap();
        assert_eq!(*store.feed_watch().borrow(), 3);
        // The newest rows go with their session; their ids are not handed out again. The
        // deletion's own entry takes the next one.
        store.delete_session("b").wait().unwrap();
        let page = store.feed_after(0, 10).unwrap();
        assert_eq!(
            page.entries
                .iter()
                .map(|e| (e.cursor, e.session_id.as_str(), e.kind))
                .collect::<Vec<_>>(),
            [
                (1, "a", FeedKind::StateChanged),
                (4, "b", FeedKind::SessionDeleted)
            ]
        );
    }
    let store = open(&path);
    assert_eq!(
        *store.feed_watch().borrow(),
        4,
        "the position is known at open"
    );
    store
        .append_blocking("a", vec![ev("turn_completed", 2)])
        .unwrap();
    let page = store.feed_after(1, 10).unwrap();
    assert_eq!(
        page.entries.iter().map(|e| e.cursor).collect::<Vec<_>>(),
        [4, 5]
    );
    // The deletion's entry survived the reopening, once, and a cursor after it skips it.
    assert_eq!(page.entries[0].kind, FeedKind::SessionDeleted);
    let page = store.feed_after(4, 10).unwrap();
    assert_eq!(
        page.entries.iter().map(|e| e.cursor).collect::<Vec<_>>(),
        [5]
    );
}

/// A deletion leaves one entry in the feed, published with the deletion's commit: the
/// session as it was (title, cwd, state, labels) and a `session_deleted` notice at the seq
/// after its last event. A watcher's cursor from before the deletion gets it exactly once;
/// in replay it sits between the other sessions' entries in commit order, across pages.
#[test]
fn a_deletion_leaves_one_entry_in_commit_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    let store = open(&path);
    let mut s = new_session("a", 1);
    s.labels.insert("team".into(), "x".into());
    s.labels.insert("env".into(), "ci".into());
    store.create_session(s).wait().unwrap();
    store.create_session(new_session("b", 2)).wait().unwrap();
    store.set_title("a", "alpha").wait().unwrap();
    store
        .append_blocking("a", vec![ev("engine_notice", 1), ev("assistant_block", 2)])
        .unwrap(); // cursor 1
    store
        .append_blocking("b", vec![ev("engine_notice", 1)])
        .unwrap(); // cursor 2
    store
        .update_session(
            "a",
            SessionPatch {
                state: Some(SessionState::Exited),
                updated_ms: 3,
                ..Default::default()
            },
        )
        .wait()
        .unwrap();
    let mut watch = store.feed_watch();
    assert_eq!(*watch.borrow_and_update(), 2);
    store.delete_session("a").wait().unwrap(); // cursor 3
    assert!(watch.has_changed().unwrap(), "published with the commit");
    assert_eq!(*watch.borrow_and_update(), 3);
    store
        .append_blocking("b", vec![ev("turn_completed", 2)])
        .unwrap(); // cursor 4

    let after_2 = store.feed_after(2, 10).unwrap();
    assert_eq!(after_2.scanned_to, 4);
    let d = &after_2.entries[0];
    assert_eq!(d.cursor, 3);
    assert_eq!(d.kind, FeedKind::SessionDeleted);
    assert_eq!(d.session_id, "a");
    assert_eq!(d.title.as_deref(), Some("alpha"));
    assert_eq!(d.cwd, "/work/project");
    assert_eq!(d.state, SessionState::Exited);
    assert_eq!(
        d.labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>(),
        ["env=ci", "team=x"]
    );
    assert_eq!(d.event.seq, 3, "the seq after the session's last event");
    assert_eq!(&*d.event.session_id, "a");
    assert_eq!(&*d.event.kind, "engine_notice");
    assert_eq!(&d.event.payload[..], SESSION_DELETED_NOTICE);
    assert!(d.event.ts_ms > 1_600_000_000_000, "{}", d.event.ts_ms);
    assert_eq!(after_2.entries[1].cursor, 4);
    assert_eq!(after_2.entries.len(), 2);

    // Replay one entry per page: every cursor once, in order, the deletion included.
    let mut cursor = 0;
    let mut seen = Vec::new();
    loop {
        let page = store.feed_after(cursor, 1).unwrap();
        if page.scanned_to == cursor {
            break;
        }
        cursor = page.scanned_to;
        seen.extend(
            page.entries
                .iter()
                .map(|e| (e.cursor, e.session_id.clone(), e.kind)),
        );
    }
    let row = |c, s: &str, k| (c, s.to_owned(), k);
    assert_eq!(
        seen,
        [
            row(2, "b", FeedKind::SessionCreated),
            row(3, "a", FeedKind::SessionDeleted),
            row(4, "b", FeedKind::TurnCompleted),
        ]
    );
    assert!(
        store
            .feed_after(3, 10)
            .unwrap()
            .entries
            .iter()
            .all(|e| e.cursor > 3)
    );

    // A deletion that fails (no such session) leaves nothing and moves no cursor.
    assert!(matches!(
        store.delete_session("a").wait(),
        Err(Error::NotFound { .. })
    ));
    assert_eq!(*store.feed_watch().borrow(), 4);
    assert_eq!(store.feed_after(4, 10).unwrap().entries.len(), 0);
    drop(store);

    // In the database: the session's rows are gone, its deletion entry is there (one
    // commit), and no feed row of it is left.
    let conn = rusqlite::Connection::open(&path).unwrap();
    let count = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap();
    assert_eq!(count("SELECT count(*) FROM sessions WHERE id = 'a'"), 0);
    assert_eq!(
        count("SELECT count(*) FROM feed_deleted WHERE session_id = 'a'"),
        1
    );
    assert_eq!(count("SELECT count(*) FROM feed_deleted_labels"), 2);
    assert_eq!(
        count("SELECT count(*) FROM feed WHERE kind = 'session_deleted'"),
        0
    );
}

#[test]
fn titles_and_labels_come_with_the_entries() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    let mut s = new_session("a", 1);
    s.labels.insert("team".into(), "x".into());
    store.create_session(s).wait().unwrap();
    assert_eq!(store.title("a").unwrap(), None);
    store
        .set_title("a", "  fix\tthe   bug\nsecond line")
        .wait()
        .unwrap();
    assert_eq!(store.title("a").unwrap().as_deref(), Some("fix the bug"));
    assert_eq!(
        store.get_session("a").unwrap().title.as_deref(),
        Some("fix the bug")
    );
    let long = "ü".repeat(500);
    store.set_title("a", &long).wait().unwrap();
    let t = store.title("a").unwrap().unwrap();
    assert_eq!(t.chars().count(), MAX_TITLE_CHARS);
    assert!(matches!(
        store.set_title("nope", "x").wait(),
        Err(Error::NotFound { .. })
    ));
    store.set_title("a", "short").wait().unwrap();
    store
        .append_blocking("a", vec![ev("engine_notice", 1)])
        .unwrap();
    let e = &store.feed_after(0, 10).unwrap().entries[0];
    assert_eq!(e.title.as_deref(), Some("short"));
    assert_eq!(e.labels.get("team").map(String::as_str), Some("x"));
    assert_eq!(e.state, SessionState::Running);
    let titles = store.titles(&["a".into(), "nope".into()]).unwrap();
    assert_eq!(titles.len(), 1);
}

#[test]
fn notifier_cursors_are_persisted() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    {
        let store = open(&path);
        assert_eq!(store.notify_cursor("hook").unwrap(), None);
        store.set_notify_cursor("hook", 5).wait().unwrap();
        store.set_notify_cursor("hook", 9).wait().unwrap();
    }
    let store = open(&path);
    assert_eq!(store.notify_cursor("hook").unwrap(), Some(9));
    assert_eq!(store.notify_cursor("other").unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_reader_wakes_on_the_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    store.create_session(new_session("a", 1)).await.unwrap();
    let mut watch = store.feed_watch();
    let waiter =
        tokio::spawn(async move { watch.wait_for(|v| *v >= 1).await.map(|v| *v).unwrap() });
    store
        .append("a", vec![ev("assistant_block", 1)])
        .await
        .unwrap();
    assert_eq!(*store.feed_watch().borrow(), 0, "not a feed event");
    store
        .append("a", vec![ev("turn_completed", 2)])
        .await
        .unwrap();
    let v = tokio::time::timeout(ostler_testkit::timeouts::guard(), waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(v, 1);
}

/// (cursor, kind) of every stored entry.
fn cursors(store: &Store) -> Vec<(u64, FeedKind)> {
    store
        .feed_after(0, 100)
        .expect("feed")
        .entries
        .iter()
        .map(|e| (e.cursor, e.kind))
        .collect()
}

/// Sessions `ids` created and deleted at the times given, in order (each deletion takes the
/// next cursor; creating a session without events writes no feed row).
fn delete_at(store: &Store, deletions: &[(&str, i64)]) {
    for (id, at) in deletions {
        let mut s = new_session(id, 1);
        s.labels.insert("team".into(), (*id).to_owned());
        store.create_session(s).wait().expect("create");
        store.delete_session_at(id, *at).wait().expect("delete");
    }
}

#[test]
fn deletion_entries_older_than_the_retention_are_pruned_and_the_cursor_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_path(&dir);
    {
        let store = open(&path);
        store.create_session(new_session("live", 1)).wait().unwrap();
        store
            .append_blocking("live", vec![ev("engine_notice", 1)])
            .unwrap(); // cursor 1: session_created, of a session that stays
        delete_at(&store, &[("a", 1_000), ("b", 5_000), ("c", 9_000)]); // cursors 2, 3, 4
        assert_eq!(store.feed_pruned_to(), 0);

        // Nothing is old enough yet: nothing goes, nothing is recorded.
        let none = store
            .prune_feed_deletions(5_999, 5_000, Vec::new())
            .wait()
            .unwrap();
        assert_eq!((none.pruned, none.pruned_to), (0, 0));
        assert_eq!(cursors(&store).len(), 4);

        // Cut-off 6_000: a and b (deleted at 1_000 and 5_000) go; c (9_000) and the other
        // kinds of entries stay.
        let done = store
            .prune_feed_deletions(10_000, 4_000, Vec::new())
            .wait()
            .unwrap();
        assert_eq!(
            done,
            FeedPruned {
                pruned: 2,
                held_back: 0,
                pruned_to: 3,
                notifier_floor: None
            }
        );
        assert_eq!(
            cursors(&store),
            [(1, FeedKind::SessionCreated), (4, FeedKind::SessionDeleted)]
        );
        assert_eq!(store.feed_pruned_to(), 3, "published with the commit");
        assert_eq!(store.feed_after(0, 10).unwrap().pruned_to, 3);
        let c = &store.feed_after(3, 10).unwrap().entries[0];
        assert_eq!(c.labels.get("team").map(String::as_str), Some("c"));
    }
    // Durable, and cursors are never reused.
    let store = open(&path);
    assert_eq!(store.feed_pruned_to(), 3);
    assert_eq!(*store.feed_watch().borrow(), 4);
    delete_at(&store, &[("d", 20_000)]);
    assert_eq!(cursors(&store).last(), Some(&(5, FeedKind::SessionDeleted)));
    // A later pruning that takes less does not move the recorded cursor back.
    let again = store
        .prune_feed_deletions(10_000, 0, Vec::new())
        .wait()
        .unwrap();
    assert_eq!((again.pruned, again.pruned_to), (1, 4));
    drop(store);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let labels: i64 = conn
        .query_row("SELECT count(*) FROM feed_deleted_labels", [], |r| r.get(0))
        .unwrap();
    assert_eq!(labels, 1, "only d's labels are left");
}

#[test]
fn pruning_stops_at_the_slowest_configured_notifier() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    delete_at(&store, &[("a", 1), ("b", 2), ("c", 3)]); // cursors 1, 2, 3
    store.set_notify_cursor("slow", 1).wait().unwrap();
    store.set_notify_cursor("fast", 3).wait().unwrap();
    // Not configured any more: its old cursor holds nothing back.
    store.set_notify_cursor("removed", 0).wait().unwrap();
    let configured = || vec!["fast".to_owned(), "slow".to_owned(), "new".to_owned()];

    let first = store
        .prune_feed_deletions(1_000, 10, configured())
        .wait()
        .unwrap();
    assert_eq!(
        first,
        FeedPruned {
            pruned: 1,
            held_back: 2,
            pruned_to: 1,
            notifier_floor: Some(1)
        }
    );
    assert_eq!(
        cursors(&store),
        [(2, FeedKind::SessionDeleted), (3, FeedKind::SessionDeleted)]
    );

    store.set_notify_cursor("slow", 2).wait().unwrap();
    let second = store
        .prune_feed_deletions(1_000, 10, configured())
        .wait()
        .unwrap();
    assert_eq!((second.pruned, second.held_back), (1, 1));
    assert_eq!(store.feed_pruned_to(), 2);
    assert_eq!(cursors(&store), [(3, FeedKind::SessionDeleted)]);
}

/// Batches longer than the rows the writer puts in one statement (and not a multiple of
/// it): every event stored in order with its own columns, and the feed rows of the
/// batch's attention events in event order, whatever their place in the batch.
#[test]
fn long_batches_keep_every_event_and_their_feed_rows_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&db_path(&dir));
    store.create_session(new_session("a", 1)).wait().unwrap();
    let feed_at = [1u64, 2, 15, 16, 17, 33, 40, 41];
    let mut expected = Vec::new();
    for (len, after) in [(41u64, 0u64), (1, 41), (16, 42), (33, 58)] {
        let batch: Vec<NewEvent> = (after + 1..=after + len)
            .map(|seq| {
                let kind = if feed_at.contains(&(seq - after)) {
                    "turn_completed"
                } else {
                    "assistant_block"
                };
                let e = ev(kind, seq as i64);
                // Every third event carries a raw line, the others none.
                if seq.is_multiple_of(3) {
                    e.with_raw(format!("{{\"line\":{seq}}}").into_bytes())
                } else {
                    e
                }
            })
            .collect();
        let seqs = store.append_blocking("a", batch).unwrap();
        assert_eq!(seqs, (after + 1..=after + len).collect::<Vec<_>>());
        expected.extend(
            feed_at
                .iter()
                .filter(|&&i| i <= len)
                .map(|&i| ("a".to_owned(), after + i, FeedKind::TurnCompleted)),
        );
    }
    let stored = store.events_after("a", 0, 1000).unwrap();
    assert_eq!(stored.len(), 91);
    for (i, e) in stored.iter().enumerate() {
        let seq = i as u64 + 1;
        assert_eq!(e.seq, seq);
        assert_eq!(e.ts_ms, seq as i64);
        assert_eq!(e.payload.as_ref(), format!("{{\"n\":{seq}}}").as_bytes());
        let raw = seq
            .is_multiple_of(3)
            .then(|| format!("{{\"line\":{seq}}}").into_bytes());
        assert_eq!(e.raw.as_deref(), raw.as_deref(), "seq {seq}");
    }
    // The session's first event is not a `session_created` notice here: the feed holds
    // only the turn ends.
    let page = store.feed_after(0, 1000).unwrap();
    assert_eq!(kinds(&page), expected);
}
