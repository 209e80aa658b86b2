//! `feed.deleted_retention_secs`: a session-deleted item of the daemon-wide feed is pruned
//! once it is older than the retention (at start, and by the daemon's timer); a
//! `WatchSessions` from a non-zero cursor before the highest pruned one is refused with
//! OUT_OF_RANGE naming the cursor to watch from, which (like 0) is served; `ostler watch`
//! says what to run. The cursor is also a `google.rpc.ErrorInfo` detail (reason
//! `FEED_PRUNED`, domain `ostler`, metadata `after_cursor`).
#![allow(clippy::unwrap_used)]

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::grpc::as_client;
use common::{NEW, World, client_command, guard, wait_output};
use ostler_proto::v1 as pb;
use ostler_proto::v1::session_service_client::SessionServiceClient;
use tonic::transport::Channel;

/// The stored feed after `after`, read to its end; the status when the watch is refused.
async fn stored(
    c: &mut SessionServiceClient<Channel>,
    after: u64,
) -> Result<Vec<pb::FeedItem>, tonic::Status> {
    let mut s = c
        .watch_sessions(pb::WatchSessionsRequest {
            after_cursor: after,
            follow: false,
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(i) = tokio::time::timeout(guard(), s.message()).await.unwrap()? {
        out.push(i);
    }
    Ok(out)
}

async fn create(c: &mut SessionServiceClient<Channel>, world: &World) -> String {
    c.create_session(as_client(
        "tester",
        pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            ..Default::default()
        },
    ))
    .await
    .unwrap()
    .into_inner()
    .id
}

/// Deletes `id` and returns the cursor of its session-deleted item.
async fn delete(c: &mut SessionServiceClient<Channel>, id: &str) -> u64 {
    c.delete_session(pb::DeleteSessionRequest {
        session_id: id.to_owned(),
    })
    .await
    .unwrap();
    stored(c, 0)
        .await
        .unwrap()
        .iter()
        .find(|i| i.session_id == id && i.kind == pb::FeedKind::SessionDeleted as i32)
        .unwrap_or_else(|| panic!("no deletion item of {id}"))
        .cursor
}

fn deletions_of(items: &[pb::FeedItem], id: &str) -> usize {
    items
        .iter()
        .filter(|i| i.session_id == id && i.kind == pb::FeedKind::SessionDeleted as i32)
        .count()
}

fn assert_refused(s: &tonic::Status, after: u64, pruned: u64) {
    assert_eq!(s.code(), tonic::Code::OutOfRange, "{s:?}");
    let m = s.message();
    assert!(m.contains(&format!("after_cursor {after} ")), "{m}");
    assert!(m.contains(&format!("up to cursor {pruned}")), "{m}");
    assert!(
        m.contains(&format!("watch again from after_cursor = {pruned}")),
        "{m}"
    );
    // The same cursor as a structured detail any gRPC client can read.
    use tonic_types::StatusExt as _;
    let info = s
        .get_details_error_info()
        .unwrap_or_else(|| panic!("no google.rpc.ErrorInfo in {s:?}"));
    assert_eq!(info.reason, "FEED_PRUNED");
    assert_eq!(info.domain, "ostler");
    assert_eq!(
        info.metadata.get("after_cursor"),
        Some(&pruned.to_string()),
        "{info:?}"
    );
}

/// Start-up pruning with the default retention (30 days): the deletion made "31 days ago"
/// (its time moved back in the stopped daemon's store) is pruned at the restart, the one
/// made now is kept, and so are the other sessions' items.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_deletion_is_pruned_at_start_and_older_cursors_are_refused() {
    let world = World::new(NEW).await;
    let mut daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let kept = create(&mut c, &world).await;
    let old = create(&mut c, &world).await;
    let young = create(&mut c, &world).await;
    let d_old = delete(&mut c, &old).await;
    let d_young = delete(&mut c, &young).await;
    assert!(d_young > d_old);
    let before = stored(&mut c, 0).await.unwrap();
    assert_eq!(deletions_of(&before, &old), 1);
    // Nothing pruned yet: every cursor is served.
    assert_eq!(stored(&mut c, d_old - 1).await.unwrap().len(), 2);
    daemon.terminate().await;

    {
        let conn = rusqlite::Connection::open(&world.store).unwrap();
        let moved = conn
            .execute(
                "UPDATE feed_deleted SET deleted_ms = deleted_ms - 31 * 86400000 \
                 WHERE session_id = ?1",
                [&old],
            )
            .unwrap();
        assert_eq!(moved, 1);
    }
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;

    let all = stored(&mut c, 0).await.unwrap();
    assert_eq!(deletions_of(&all, &old), 0, "pruned at start");
    assert_eq!(deletions_of(&all, &young), 1, "a young deletion stays");
    assert!(
        all.iter()
            .any(|i| i.session_id == kept && i.kind == pb::FeedKind::SessionCreated as i32),
        "other kinds of items stay"
    );
    for after in [1, d_old - 1] {
        let refused = stored(&mut c, after).await.unwrap_err();
        assert_refused(&refused, after, d_old);
    }
    // From the pruned cursor on, and from 0, the watch is served.
    let from = stored(&mut c, d_old).await.unwrap();
    assert_eq!(deletions_of(&from, &young), 1);
    assert!(from.iter().all(|i| i.cursor > d_old));

    // The client says what to run.
    let mut cmd = client_command(
        &world,
        &daemon.addr.to_string(),
        &[
            "watch".into(),
            "--no-follow".into(),
            "--since".into(),
            (d_old - 1).to_string(),
        ],
    );
    let out = wait_output(
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("OUT_OF_RANGE"), "{err}");
    assert!(
        err.contains(&format!("ostler watch --since {d_old}")),
        "{err}"
    );
}

/// The timer: with `feed.deleted_retention_secs = 1` (from the environment) a deletion is
/// pruned while the daemon runs; the test waits for the refusal itself (bounded by the
/// guard), not for a fixed time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timer_prunes_a_deletion_once_it_is_older_than_the_retention() {
    let world = World::new(NEW).await;
    let daemon = world
        .daemon_with_env(&[], &[("OSTLER_FEED__DELETED_RETENTION_SECS", "1")])
        .await;
    let mut c = daemon.sessions().await;
    let gone = create(&mut c, &world).await;
    let d = delete(&mut c, &gone).await;
    let later = create(&mut c, &world).await;
    let deadline = Instant::now() + guard();
    let refused = loop {
        match stored(&mut c, d - 1).await {
            Err(s) => break s,
            Ok(items) => {
                assert_eq!(deletions_of(&items, &gone), 1, "served whole until pruned");
                assert!(Instant::now() < deadline, "not pruned within {:?}", guard());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_refused(&refused, d - 1, d);
    let all = stored(&mut c, 0).await.unwrap();
    assert_eq!(deletions_of(&all, &gone), 0);
    assert!(all.iter().any(|i| i.session_id == later));
    assert!(
        daemon
            .log_text()
            .contains("pruned session-deleted feed items"),
        "{}",
        daemon.log_text()
    );
}

/// A configured notifier that has not delivered a deletion (its receiver refuses every
/// connection; the next attempt is a minute away) holds it past the retention: the
/// start-up pruning keeps it, says why, and refuses no cursor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_a_notifier_has_not_delivered_is_kept_past_the_retention() {
    let world = World::new(NEW).await;
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    std::fs::write(
        &world.config,
        format!(
            "[[notify]]\nname = \"down\"\nurl = \"http://127.0.0.1:{port}/hook\"\n\
             max_attempts = 8\nretry_initial_ms = 60000\nretry_max_ms = 60000\n"
        ),
    )
    .unwrap();
    let mut daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let old = create(&mut c, &world).await;
    let d_old = delete(&mut c, &old).await;
    daemon.terminate().await;
    {
        let conn = rusqlite::Connection::open(&world.store).unwrap();
        let saved: i64 = conn
            .query_row(
                "SELECT cursor FROM notify_cursors WHERE name = 'down'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!((saved as u64) < d_old, "the notifier has not passed it");
        conn.execute(
            "UPDATE feed_deleted SET deleted_ms = deleted_ms - 31 * 86400000",
            [],
        )
        .unwrap();
    }
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let all = stored(&mut c, 0).await.unwrap();
    assert_eq!(deletions_of(&all, &old), 1, "held back by the notifier");
    assert_eq!(stored(&mut c, d_old - 1).await.unwrap().len(), 1);
    assert!(
        daemon.log_text().contains("slowest notifier"),
        "{}",
        daemon.log_text()
    );
}
