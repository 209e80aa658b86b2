//! `WatchSessions`, the daemon-wide feed, against the real daemon and a real CLI release: a
//! watcher that disconnects and reconnects with its cursor (also across a daemon restart)
//! sees every item exactly once, in the order of the stored feed; filters; titles.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::grpc::{as_client, text};
use common::{NEW, World, guard};
use ostler_proto::v1 as pb;
use ostler_proto::v1::session_service_client::SessionServiceClient;
use pb::session_event::Payload;
use tonic::Streaming;
use tonic::transport::Channel;

async fn watch(
    c: &mut SessionServiceClient<Channel>,
    req: pb::WatchSessionsRequest,
) -> Streaming<pb::FeedItem> {
    c.watch_sessions(req).await.unwrap().into_inner()
}

/// Reads items into `seen` until one matches `stop` (which is included).
async fn read_until(
    stream: &mut Streaming<pb::FeedItem>,
    seen: &mut Vec<pb::FeedItem>,
    what: &str,
    stop: impl Fn(&pb::FeedItem) -> bool,
) -> pb::FeedItem {
    loop {
        let item = tokio::time::timeout(guard(), stream.message())
            .await
            .unwrap_or_else(|_| panic!("no feed item for {what}; saw {}", kinds(seen)))
            .unwrap()
            .unwrap_or_else(|| panic!("the feed ended before {what}"));
        seen.push(item.clone());
        if stop(&item) {
            return item;
        }
    }
}

/// The whole stored feed, read to its end without following.
async fn stored_feed(c: &mut SessionServiceClient<Channel>, after: u64) -> Vec<pb::FeedItem> {
    let mut s = watch(
        c,
        pb::WatchSessionsRequest {
            after_cursor: after,
            follow: false,
            ..Default::default()
        },
    )
    .await;
    let mut out = Vec::new();
    while let Some(i) = tokio::time::timeout(guard(), s.message())
        .await
        .unwrap()
        .unwrap()
    {
        out.push(i);
    }
    out
}

fn kinds(items: &[pb::FeedItem]) -> String {
    items
        .iter()
        .map(|i| {
            format!(
                "{}:{}:{:?}",
                i.cursor,
                &i.session_id[..8.min(i.session_id.len())],
                pb::FeedKind::try_from(i.kind).unwrap_or(pb::FeedKind::Unspecified)
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn is(kind: pb::FeedKind, session: &str) -> impl Fn(&pb::FeedItem) -> bool + '_ {
    move |i| i.kind == kind as i32 && i.session_id == session
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnecting_watcher_sees_every_item_once_across_a_restart() {
    let world = World::new(NEW).await;
    let mut daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let mut seen: Vec<pb::FeedItem> = Vec::new();

    // Watcher 1 follows from the beginning; session A is created and completes a turn.
    let mut w = watch(
        &mut c,
        pb::WatchSessionsRequest {
            follow: true,
            ..Default::default()
        },
    )
    .await;
    let a = create_labelled(&mut c, &world, "alpha", "a").await;
    assert_eq!(a.title, "alpha");
    let created = read_until(
        &mut w,
        &mut seen,
        "A created",
        is(pb::FeedKind::SessionCreated, &a.id),
    )
    .await;
    assert_eq!(created.title, "alpha");
    assert_eq!(created.labels.get("team").map(String::as_str), Some("a"));
    assert_eq!(created.cwd, world.work.display().to_string());
    read_until(
        &mut w,
        &mut seen,
        "A's turn",
        is(pb::FeedKind::TurnCompleted, &a.id),
    )
    .await;
    // Disconnect mid-stream.
    drop(w);
    let cursor1 = seen.last().unwrap().cursor;

    // While nobody watches: session B asks for a permission.
    let long_prompt = format!(
        "Create the file allowed.txt {}",
        "and more words ".repeat(10)
    );
    let b = c
        .create_session(as_client(
            "tester",
            pb::CreateSessionRequest {
                cwd: world.work.display().to_string(),
                first_prompt: text(&long_prompt),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    // Untitled: the first prompt, shortened on a character boundary.
    assert!(
        b.title.starts_with("Create the file allowed.txt"),
        "{}",
        b.title
    );
    assert!(
        b.title.chars().count() <= 60 && b.title.ends_with('…'),
        "{}",
        b.title
    );

    // Watcher 2 resumes after cursor1 and sees B's request, answers it, sees the rest.
    let mut w = watch(
        &mut c,
        pb::WatchSessionsRequest {
            after_cursor: cursor1,
            follow: true,
            ..Default::default()
        },
    )
    .await;
    let asked = read_until(
        &mut w,
        &mut seen,
        "B's permission request",
        is(pb::FeedKind::PermissionRequested, &b.id),
    )
    .await;
    let Some(Payload::PermissionRequested(req)) =
        asked.event.as_ref().and_then(|e| e.payload.clone())
    else {
        panic!("a permission request event: {asked:?}");
    };
    assert_eq!(req.tool_name, "Bash");
    common::grpc::allow(&mut c, "tester", &b.id, &req.request_id).await;
    read_until(
        &mut w,
        &mut seen,
        "B resolved",
        is(pb::FeedKind::Resolved, &b.id),
    )
    .await;
    read_until(
        &mut w,
        &mut seen,
        "B's turn",
        is(pb::FeedKind::TurnCompleted, &b.id),
    )
    .await;
    drop(w);
    let cursor2 = seen.last().unwrap().cursor;

    // The daemon dies and comes back: both sessions are recorded as resumable.
    daemon.kill9();
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let mut w = watch(
        &mut c,
        pb::WatchSessionsRequest {
            after_cursor: cursor2,
            follow: true,
            ..Default::default()
        },
    )
    .await;
    let resumable = |id: &str| {
        let id = id.to_owned();
        move |i: &pb::FeedItem| {
            i.session_id == id
                && matches!(
                    i.event.as_ref().and_then(|e| e.payload.as_ref()),
                    Some(Payload::StateChanged(s)) if s.to == pb::SessionState::Resumable as i32
                )
        }
    };
    let mut got_a = false;
    let mut got_b = false;
    while !(got_a && got_b) {
        let i = read_until(&mut w, &mut seen, "the restart's state changes", |_| true).await;
        got_a |= resumable(&a.id)(&i);
        got_b |= resumable(&b.id)(&i);
    }
    drop(w);
    // Whatever the restart recorded after those (one more reconnect, without following).
    let rest = stored_feed(&mut c, seen.last().unwrap().cursor).await;
    seen.extend(rest);

    // Every item exactly once, in feed order: the pieces equal the stored feed.
    let all = stored_feed(&mut c, 0).await;
    // The newest cursor is a valid place to watch from; one past it is not (as an
    // `after_seq` past a session's last event is not), whatever its size.
    let newest = all.last().unwrap().cursor;
    assert!(stored_feed(&mut c, newest).await.is_empty());
    for beyond in [newest + 1, u64::MAX] {
        let err = c
            .watch_sessions(pb::WatchSessionsRequest {
                after_cursor: beyond,
                follow: true,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert!(
            err.message().contains("after_cursor") && err.message().contains("beyond"),
            "{err:?}"
        );
    }
    let got: Vec<u64> = seen.iter().map(|i| i.cursor).collect();
    let want: Vec<u64> = all.iter().map(|i| i.cursor).collect();
    assert_eq!(
        got,
        want,
        "\nseen:   {}\nstored: {}",
        kinds(&seen),
        kinds(&all)
    );
    // Equal items, but for `state` (the session's state when each was read).
    let stateless = |v: &[pb::FeedItem]| {
        v.iter()
            .cloned()
            .map(|mut i| {
                i.state = 0;
                i
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        stateless(&seen),
        stateless(&all),
        "the items read live equal the stored ones"
    );
    for k in [
        pb::FeedKind::SessionCreated,
        pb::FeedKind::StateChanged,
        pb::FeedKind::TurnCompleted,
        pb::FeedKind::PermissionRequested,
        pb::FeedKind::Resolved,
    ] {
        assert!(
            all.iter().any(|i| i.kind == k as i32),
            "{k:?} in {}",
            kinds(&all)
        );
    }

    // Each item's event is the one Subscribe delivers at the same seq.
    let history = common::grpc::history(&mut c, &b.id).await;
    for i in all.iter().filter(|i| i.session_id == b.id) {
        let ev = i.event.as_ref().unwrap();
        let same = history.iter().find(|e| e.seq == ev.seq).unwrap();
        assert_eq!(same, ev);
    }

    // Filters: labels, kinds, states (the session's state now: both resumable).
    let mut s = watch(
        &mut c,
        pb::WatchSessionsRequest {
            labels: [("team".to_owned(), "a".to_owned())].into(),
            kinds: vec![pb::FeedKind::TurnCompleted as i32],
            ..Default::default()
        },
    )
    .await;
    let mut only = Vec::new();
    while let Some(i) = s.message().await.unwrap() {
        only.push(i);
    }
    assert_eq!(only.len(), 1, "{}", kinds(&only));
    assert_eq!(only[0].session_id, a.id);
    let mut s = watch(
        &mut c,
        pb::WatchSessionsRequest {
            states: vec![pb::SessionState::Running as i32],
            ..Default::default()
        },
    )
    .await;
    assert!(
        s.message().await.unwrap().is_none(),
        "no session is running"
    );

    // Bad filters are INVALID_ARGUMENT naming the field.
    let err = c
        .watch_sessions(pb::WatchSessionsRequest {
            kinds: vec![0],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("kinds[0]"), "{}", err.message());

    // Titles are returned by GetSession and ListSessions.
    let got = c
        .get_session(pb::GetSessionRequest {
            session_id: a.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.title, "alpha");

    // Deleting a session removes its items but for the deletion's own; cursors are not
    // reused.
    c.delete_session(pb::DeleteSessionRequest {
        session_id: b.id.clone(),
    })
    .await
    .unwrap();
    let after_delete = stored_feed(&mut c, 0).await;
    let of_b: Vec<_> = after_delete
        .iter()
        .filter(|i| i.session_id == b.id)
        .collect();
    assert_eq!(of_b.len(), 1, "{}", kinds(&after_delete));
    assert_eq!(of_b[0].kind, pb::FeedKind::SessionDeleted as i32);
    assert!(of_b[0].cursor > all.last().unwrap().cursor);
    let last_before = all.last().unwrap().cursor;
    c.create_session(as_client(
        "tester",
        pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            ..Default::default()
        },
    ))
    .await
    .unwrap();
    let newer = stored_feed(&mut c, last_before).await;
    assert!(!newer.is_empty());
    assert!(newer.iter().all(|i| i.cursor > last_before));
}

/// The payload of a feed item's event, if it is an engine notice.
fn notice(i: &pb::FeedItem) -> Option<&pb::EngineNotice> {
    match i.event.as_ref()?.payload.as_ref()? {
        Payload::EngineNotice(n) => Some(n),
        _ => None,
    }
}

/// DeleteSession of a real CLI session puts one FEED_KIND_SESSION_DELETED item in the feed:
/// live to a follower right after the deletion, to a matching label filter and not to
/// another, once to a watcher that reconnects with a cursor from before it (also after a
/// daemon restart), with the session's title, cwd, labels and last state, and a
/// `session_deleted` notice at the seq after the session's last event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_session_leaves_one_item_live_and_on_replay() {
    let world = World::new(NEW).await;
    let mut daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let follow = |labels: &[(&str, &str)]| pb::WatchSessionsRequest {
        follow: true,
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    };
    let mut all = watch(&mut c, follow(&[])).await;
    let mut mine = watch(&mut c, follow(&[("team", "del")])).await;
    let mut others = watch(&mut c, follow(&[("team", "other")])).await;
    let (mut seen_all, mut seen_mine, mut seen_others) = (Vec::new(), Vec::new(), Vec::new());

    let a = create_labelled(&mut c, &world, "doomed", "del").await;
    read_until(
        &mut all,
        &mut seen_all,
        "A's turn",
        is(pb::FeedKind::TurnCompleted, &a.id),
    )
    .await;
    let before = stored_feed(&mut c, 0).await.last().unwrap().cursor;

    c.delete_session(pb::DeleteSessionRequest {
        session_id: a.id.clone(),
    })
    .await
    .unwrap();
    let gone = read_until(
        &mut all,
        &mut seen_all,
        "A's deletion",
        is(pb::FeedKind::SessionDeleted, &a.id),
    )
    .await;
    assert!(gone.cursor > before);
    assert_eq!(gone.title, "doomed");
    assert_eq!(gone.cwd, world.work.display().to_string());
    assert_eq!(gone.labels.get("team").map(String::as_str), Some("del"));
    assert_ne!(gone.state, pb::SessionState::Unspecified as i32);
    let n = notice(&gone).unwrap_or_else(|| panic!("an engine notice: {gone:?}"));
    assert_eq!(n.code, "session_deleted");
    let ev = gone.event.as_ref().unwrap();
    assert_eq!(ev.session_id, a.id);
    let last_seq = seen_all
        .iter()
        .filter(|i| i.session_id == a.id && i.cursor < gone.cursor)
        .map(|i| i.event.as_ref().unwrap().seq)
        .max()
        .unwrap();
    assert!(ev.seq > last_seq, "{} after {last_seq}", ev.seq);
    assert!(ev.ts_ms > 0);
    let err = c
        .get_session(pb::GetSessionRequest {
            session_id: a.id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);

    // The matching label filter gets it, as the unfiltered watcher did.
    let got = read_until(
        &mut mine,
        &mut seen_mine,
        "A's deletion (team=del)",
        is(pb::FeedKind::SessionDeleted, &a.id),
    )
    .await;
    assert_eq!(got, gone);
    // The other one does not: a later item of its own comes first.
    let m = c
        .create_session(as_client(
            "tester",
            pb::CreateSessionRequest {
                cwd: world.work.display().to_string(),
                labels: [("team".to_owned(), "other".to_owned())].into(),
                ..Default::default()
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let marker = read_until(
        &mut others,
        &mut seen_others,
        "M created (team=other)",
        is(pb::FeedKind::SessionCreated, &m.id),
    )
    .await;
    assert!(marker.cursor > gone.cursor);
    assert!(
        seen_others.iter().all(|i| i.session_id != a.id),
        "{}",
        kinds(&seen_others)
    );

    // A watcher reconnecting with a cursor from before the deletion gets it once; one
    // reconnecting with its cursor does not get it again. Also after a restart.
    for round in ["running", "restarted"] {
        let replay = stored_feed(&mut c, before).await;
        let deletions: Vec<_> = replay
            .iter()
            .filter(|i| i.kind == pb::FeedKind::SessionDeleted as i32)
            .collect();
        assert_eq!(deletions, [&gone], "{round}: {}", kinds(&replay));
        assert!(
            stored_feed(&mut c, gone.cursor)
                .await
                .iter()
                .all(|i| i.session_id != a.id),
            "{round}"
        );
        // `kinds` and `states` filters apply to it (its state: the session's last).
        let other = if gone.state == pb::SessionState::Running as i32 {
            pb::SessionState::Idle
        } else {
            pb::SessionState::Running
        };
        for (states, want) in [(vec![gone.state], 1), (vec![other as i32], 0)] {
            let mut s = watch(
                &mut c,
                pb::WatchSessionsRequest {
                    kinds: vec![pb::FeedKind::SessionDeleted as i32],
                    states,
                    ..Default::default()
                },
            )
            .await;
            let mut only = Vec::new();
            while let Some(i) = s.message().await.unwrap() {
                only.push(i);
            }
            assert_eq!(only.len(), want, "{round}: {}", kinds(&only));
            assert!(only.iter().all(|i| *i == gone));
        }
        if round == "running" {
            daemon.kill9();
            daemon = world.daemon(&[]).await;
            c = daemon.sessions().await;
        }
    }
}

/// CreateSession (as client "tester") with a first prompt, a title and the label `team`.
async fn create_labelled(
    c: &mut pb::session_service_client::SessionServiceClient<tonic::transport::Channel>,
    world: &World,
    title: &str,
    team: &str,
) -> pb::Session {
    c.create_session(as_client(
        "tester",
        pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            first_prompt: text("Say hello"),
            title: title.into(),
            labels: [("team".to_owned(), team.to_owned())].into(),
            ..Default::default()
        },
    ))
    .await
    .unwrap()
    .into_inner()
}
