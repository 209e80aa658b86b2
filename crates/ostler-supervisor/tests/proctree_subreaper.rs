//! With the test process as child subreaper (as the daemon is): a session's scan reads its
//! own tree and the orphans, and a tool orphaned when its CLI ends is still found. A test
//! binary of its own, since being subreaper is a property of the whole process (a test
//! sharing it would find its own children reaped).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use ostler_supervisor::proctree;

mod tree;
use tree::{assert_ends, exited, start};

#[tokio::test]
async fn as_subreaper_a_session_is_found_in_its_own_tree_and_among_the_orphans_only() {
    // With this process as child subreaper (as the daemon is), a session's scan reads its
    // CLI's tree and the orphans this process adopted, not the other sessions' trees nor
    // the rest of the system; a tool orphaned when its CLI ends is still found there.
    proctree::become_subreaper().unwrap();
    let _reaper = proctree::spawn_reaper().unwrap();
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, mut rx_a, sleeper_a) = start(da.path(), "cat > /dev/null").await;
    let (b, mut rx_b, sleeper_b) = start(db.path(), "cat > /dev/null").await;
    let scope: std::collections::HashSet<u32> = proctree::own_tree(Some(a.pid()))
        .expect("the kernel lists children")
        .iter()
        .map(|p| p.pid)
        .collect();
    assert!(scope.contains(&a.pid()), "A's CLI is read");
    assert!(
        scope.contains(&sleeper_a),
        "A's tool (left the group) is read"
    );
    assert!(
        !scope.contains(&b.pid()) && !scope.contains(&sleeper_b),
        "B's tree is not read"
    );
    assert!(
        !scope.contains(&1),
        "nothing outside this process's tree is read"
    );
    // A's CLI exits on stop and orphans its tool, which this process adopts.
    a.stop().await;
    exited(&mut rx_a).await;
    assert_ends(sleeper_a, "A stopped").await;
    // Dead, it is this process's zombie until reaped (by the reaper, or by this call): the
    // reaping reads this process's own children.
    proctree::reap_adopted();
    assert!(
        proctree::stat(sleeper_a).is_none(),
        "A's orphaned tool was not reaped"
    );
    let s = proctree::stat(sleeper_b).expect("B's tool runs");
    assert!(!s.is_zombie(), "B's tool was killed with A");
    b.stop().await;
    exited(&mut rx_b).await;
    assert_ends(sleeper_b, "B stopped").await;
}
