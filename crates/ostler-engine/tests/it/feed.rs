//! The daemon-wide feed's pruned deletion items as `Engine::watch_checked` and a running
//! `FeedWatch` see them: a cursor before the pruned one is refused, and a watcher whose
//! unread items are pruned after it was accepted (before its first read, or while it
//! reads) ends with `OutOfRange` instead of a silent gap.

use crate::common;

use common::*;
use ostler_engine::*;

/// More deletion entries than one page of the watcher (256).
const DELETIONS: u64 = 300;

#[tokio::test(flavor = "multi_thread")]
async fn a_watcher_whose_unread_deletions_are_pruned_is_told_so() {
    let env = Env::new(NEW, scenario("plain_text")).await;
    for i in 0..DELETIONS {
        let id = format!("gone-{i}");
        env.store
            .create_session(ostler_store::NewSession {
                id: id.clone(),
                claude_session_id: None,
                cwd: env.cwd.display().to_string(),
                model: None,
                permission_mode: None,
                cli_release: None,
                state: ostler_store::SessionState::Idle,
                labels: Default::default(),
                created_ms: 1,
            })
            .await
            .expect("create");
        env.store
            .delete_session_at(&id, 1_000)
            .await
            .expect("delete");
    }
    let req = |after_cursor| WatchRequest {
        after_cursor,
        ..Default::default()
    };
    let mut reading = env.engine.watch_checked(req(0)).expect("from 0");
    let first = reading.next().await.expect("an item").expect("read");
    assert_eq!(first.cursor, 1);
    // Accepted before the pruning and not read yet: its first read is refused as a new
    // watch from that cursor would be (the watch starts from the pruned cursor it was
    // checked against, not from one read again later).
    let mut accepted = env
        .engine
        .watch_checked(req(5))
        .expect("nothing pruned yet");

    // Every deletion entry is old: all go while the watcher holds its first page.
    let pruned = env
        .store
        .prune_feed_deletions(10_000, 1, Vec::new())
        .await
        .expect("prune");
    assert_eq!((pruned.pruned, pruned.pruned_to), (DELETIONS, DELETIONS));
    let err = accepted
        .next()
        .await
        .expect("not the end")
        .expect_err("its items were pruned before it read them");
    assert_eq!(err.code_kind(), CodeKind::OutOfRange, "{err}");

    let mut read = 1;
    let err = loop {
        match reading.next().await {
            Some(Ok(_)) => read += 1,
            Some(Err(e)) => break e,
            None => panic!("the watch ended after {read} items: the pruned rest missed silently"),
        }
    };
    assert_eq!(read, 256, "the page read before the pruning is delivered");
    assert_eq!(err.code_kind(), CodeKind::OutOfRange, "{err}");
    assert!(
        err.to_string()
            .contains(&format!("after_cursor = {DELETIONS}")),
        "{err}"
    );

    // New watches: a cursor before the pruned one is refused; 0 and the pruned one serve.
    let refused = env
        .engine
        .watch_checked(req(5))
        .expect_err("before the pruned cursor");
    assert_eq!(refused.code_kind(), CodeKind::OutOfRange, "{refused}");
    for after in [0, DELETIONS] {
        let mut w = env.engine.watch_checked(req(after)).expect("served");
        assert!(w.next().await.is_none(), "nothing is left after {after}");
    }
}
