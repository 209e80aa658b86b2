//! `UpdateSession` (the Agent SDK's renameSession / tagSession / archiveSession /
//! unarchiveSession) against the real daemon and a real CLI release: the title, labels and
//! archived mark change GetSession and ListSessions (label and archived filters), survive a
//! daemon restart, are recorded as a `session_updated` notice in the session's log and a
//! FEED_KIND_SESSION_UPDATED feed item, change nothing when already so, and a SendMessage
//! unarchives. Bad requests get their codes.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::grpc::{as_client, text};
use common::{NEW, World, guard};
use ostler_proto::v1 as pb;
use ostler_proto::v1::session_service_client::SessionServiceClient;
use pb::session_event::Payload;
use tonic::transport::Channel;

type Client = SessionServiceClient<Channel>;

async fn create(
    c: &mut Client,
    world: &World,
    title: &str,
    team: &str,
    prompt: Option<&str>,
) -> pb::Session {
    c.create_session(as_client(
        "tester",
        pb::CreateSessionRequest {
            cwd: world.work.display().to_string(),
            title: title.into(),
            labels: [("team".to_owned(), team.to_owned())].into(),
            first_prompt: prompt.and_then(text),
            ..Default::default()
        },
    ))
    .await
    .unwrap()
    .into_inner()
}

async fn update(
    c: &mut Client,
    req: pb::UpdateSessionRequest,
) -> Result<pb::Session, tonic::Status> {
    c.update_session(req).await.map(tonic::Response::into_inner)
}

async fn list(c: &mut Client, labels: &[(&str, &str)], archived: Option<bool>) -> Vec<String> {
    let mut ids: Vec<String> = c
        .list_sessions(pb::ListSessionsRequest {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            archived,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .sessions
        .into_iter()
        .map(|s| s.id)
        .collect();
    ids.sort();
    ids
}

/// The titles the session's `session_updated` notices set, each asserted to be a client's
/// (`UpdateSession`).
async fn client_titles(c: &mut Client, id: &str) -> Vec<String> {
    let notices = updated_notices(c, id).await;
    assert!(
        notices.iter().all(|(_, d)| d["cause"] == "update_session"),
        "{notices:?}"
    );
    notices
        .iter()
        .map(|(_, d)| d["title"]["new"].as_str().unwrap().to_owned())
        .collect()
}

/// The session's stored `session_updated` notices (data parsed).
async fn updated_notices(c: &mut Client, id: &str) -> Vec<(u64, serde_json::Value)> {
    let mut s = c
        .subscribe(pb::SubscribeRequest {
            session_id: id.to_owned(),
            follow: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(ev) = tokio::time::timeout(guard(), s.message())
        .await
        .unwrap()
        .unwrap()
    {
        if let Some(Payload::EngineNotice(n)) = &ev.payload
            && n.code == "session_updated"
        {
            out.push((ev.seq, serde_json::from_str(&n.data_json).unwrap()));
        }
    }
    out
}

/// The stored feed's SESSION_UPDATED items of `id`.
async fn updated_items(c: &mut Client, id: &str) -> Vec<pb::FeedItem> {
    let mut s = c
        .watch_sessions(pb::WatchSessionsRequest {
            kinds: vec![pb::FeedKind::SessionUpdated as i32],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut out = Vec::new();
    while let Some(i) = tokio::time::timeout(guard(), s.message())
        .await
        .unwrap()
        .unwrap()
    {
        if i.session_id == id {
            out.push(i);
        }
    }
    out
}

fn sorted(m: &std::collections::HashMap<String, String>) -> Vec<(String, String)> {
    let mut v: Vec<_> = m.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rename_label_archive_are_listed_recorded_and_durable() {
    let world = World::new(NEW).await;
    let mut daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let a = create(&mut c, &world, "first", "a", None).await;
    let b = create(&mut c, &world, "other", "a", None).await;

    // A follower of A's log and of the feed see the change live.
    let mut events = c
        .subscribe(pb::SubscribeRequest {
            session_id: a.id.clone(),
            follow: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut feed = c
        .watch_sessions(pb::WatchSessionsRequest {
            follow: true,
            kinds: vec![pb::FeedKind::SessionUpdated as i32],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();

    let before = c
        .get_session(pb::GetSessionRequest {
            session_id: a.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let got = update(
        &mut c,
        pb::UpdateSessionRequest {
            session_id: a.id.clone(),
            title: Some("renamed".into()),
            set_labels: [("stage".to_owned(), "review".to_owned())].into(),
            remove_labels: vec!["team".into()],
            archived: Some(true),
        },
    )
    .await
    .unwrap();
    assert_eq!(got.title, "renamed");
    assert!(got.archived);
    assert_eq!(
        sorted(&got.labels),
        vec![("stage".to_owned(), "review".to_owned())]
    );
    assert_eq!(got.last_seq, before.last_seq + 1);

    // The notice, live, in A's log.
    let notice = loop {
        let ev = tokio::time::timeout(guard(), events.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if let Some(Payload::EngineNotice(n)) = &ev.payload
            && n.code == "session_updated"
        {
            assert_eq!(ev.seq, got.last_seq);
            break n.clone();
        }
    };
    let data: serde_json::Value = serde_json::from_str(&notice.data_json).unwrap();
    assert_eq!(data["title"]["old"], "first");
    assert_eq!(data["title"]["new"], "renamed");
    assert_eq!(data["labels_set"], serde_json::json!({"stage": "review"}));
    assert_eq!(data["labels_removed"], serde_json::json!(["team"]));
    assert_eq!(data["archived"], true);
    assert_eq!(data["cause"], "update_session");
    // The feed item, live, with the session as it is now.
    let item = tokio::time::timeout(guard(), feed.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(item.kind, pb::FeedKind::SessionUpdated as i32);
    assert_eq!(item.session_id, a.id);
    assert_eq!(item.title, "renamed");
    assert_eq!(item.event.as_ref().unwrap().seq, got.last_seq);

    // Get and List (label and archived filters).
    let now = c
        .get_session(pb::GetSessionRequest {
            session_id: a.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((now.title.as_str(), now.archived), ("renamed", true));
    assert_eq!(now.state, before.state, "the CLI is left alone");
    assert_eq!(
        list(&mut c, &[("stage", "review")], None).await,
        vec![a.id.clone()]
    );
    assert_eq!(
        list(&mut c, &[("team", "a")], None).await,
        vec![b.id.clone()]
    );
    assert_eq!(list(&mut c, &[], Some(true)).await, vec![a.id.clone()]);
    assert_eq!(list(&mut c, &[], Some(false)).await, vec![b.id.clone()]);
    let mut both = vec![a.id.clone(), b.id.clone()];
    both.sort();
    assert_eq!(list(&mut c, &[], None).await, both);

    // Already so: nothing written.
    let same = update(
        &mut c,
        pb::UpdateSessionRequest {
            session_id: a.id.clone(),
            title: Some("renamed".into()),
            set_labels: [("stage".to_owned(), "review".to_owned())].into(),
            remove_labels: vec!["team".into()],
            archived: Some(true),
        },
    )
    .await
    .unwrap();
    assert_eq!(same.last_seq, got.last_seq);
    assert_eq!(updated_notices(&mut c, &a.id).await.len(), 1);
    assert_eq!(updated_items(&mut c, &a.id).await.len(), 1);

    // After a restart (kill -9: what was answered is committed): all of it is still there.
    drop((events, feed));
    daemon.kill9();
    daemon = world.daemon(&[]).await;
    c = daemon.sessions().await;
    let after = c
        .get_session(pb::GetSessionRequest {
            session_id: a.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((after.title.as_str(), after.archived), ("renamed", true));
    assert_eq!(
        sorted(&after.labels),
        vec![("stage".to_owned(), "review".to_owned())]
    );
    assert_eq!(list(&mut c, &[], Some(true)).await, vec![a.id.clone()]);
    assert_eq!(updated_notices(&mut c, &a.id).await.len(), 1);
    assert_eq!(updated_items(&mut c, &a.id).await.len(), 1);

    // A session whose process is gone is updated without waking it.
    let again = update(
        &mut c,
        pb::UpdateSessionRequest {
            session_id: a.id.clone(),
            archived: Some(false),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(!again.archived);
    assert_eq!(again.state, after.state, "not woken");
    assert_eq!(again.last_seq, after.last_seq + 1);
    let notices = updated_notices(&mut c, &a.id).await;
    assert_eq!(notices.len(), 2);
    assert_eq!(
        notices[1].1,
        serde_json::json!({"archived": false, "cause": "update_session"})
    );
    assert_eq!(updated_items(&mut c, &a.id).await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_updates_get_their_codes() {
    let world = World::new(NEW).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let a = create(&mut c, &world, "t", "a", None).await;
    let req = |f: &dyn Fn(&mut pb::UpdateSessionRequest)| {
        let mut r = pb::UpdateSessionRequest {
            session_id: a.id.clone(),
            ..Default::default()
        };
        f(&mut r);
        r
    };
    let cases: Vec<(&str, pb::UpdateSessionRequest, tonic::Code, &str)> = vec![
        (
            "nothing",
            req(&|_| {}),
            tonic::Code::InvalidArgument,
            "nothing to change",
        ),
        (
            "set and removed",
            req(&|r| {
                r.set_labels.insert("k".into(), "v".into());
                r.remove_labels.push("k".into());
            }),
            tonic::Code::InvalidArgument,
            "remove_labels",
        ),
        (
            "empty title",
            req(&|r| r.title = Some("  ".into())),
            tonic::Code::InvalidArgument,
            "title",
        ),
        (
            "long title",
            req(&|r| r.title = Some("x".repeat(5000))),
            tonic::Code::InvalidArgument,
            "title",
        ),
        (
            "empty key",
            req(&|r| {
                r.set_labels.insert(" ".into(), "v".into());
            }),
            tonic::Code::InvalidArgument,
            "set_labels",
        ),
        (
            "long value",
            req(&|r| {
                r.set_labels.insert("k".into(), "v".repeat(5000));
            }),
            tonic::Code::InvalidArgument,
            "set_labels",
        ),
        (
            "too many labels after",
            req(&|r| {
                for i in 0..64 {
                    r.set_labels.insert(format!("k{i}"), "v".into());
                }
            }),
            tonic::Code::InvalidArgument,
            "set_labels",
        ),
        (
            "unknown session",
            pb::UpdateSessionRequest {
                session_id: "no-such-session".into(),
                archived: Some(true),
                ..Default::default()
            },
            tonic::Code::NotFound,
            "no-such-session",
        ),
    ];
    for (what, r, code, names) in cases {
        let st = update(&mut c, r).await.unwrap_err();
        assert_eq!(st.code(), code, "{what}: {st:?}");
        assert!(st.message().contains(names), "{what}: {}", st.message());
    }
    // Nothing of it was written.
    let now = c
        .get_session(pb::GetSessionRequest {
            session_id: a.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        sorted(&now.labels),
        vec![("team".to_owned(), "a".to_owned())]
    );
    assert!(updated_notices(&mut c, &a.id).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_to_an_archived_session_unarchives_it() {
    let world = World::new(NEW).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let a = create(&mut c, &world, "t", "a", None).await;
    let archived = update(
        &mut c,
        pb::UpdateSessionRequest {
            session_id: a.id.clone(),
            archived: Some(true),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(archived.archived);
    c.send_message(as_client(
        "tester",
        pb::SendMessageRequest {
            session_id: a.id.clone(),
            content: text("Say hello"),
            ..Default::default()
        },
    ))
    .await
    .unwrap();
    let now = c
        .get_session(pb::GetSessionRequest {
            session_id: a.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!now.archived);
    assert_eq!(list(&mut c, &[], Some(true)).await, Vec::<String>::new());
    let notices = updated_notices(&mut c, &a.id).await;
    assert_eq!(notices.len(), 2, "{notices:?}");
    assert_eq!(
        notices[1].1,
        serde_json::json!({"archived": false, "cause": "send_message"})
    );
    assert_eq!(updated_items(&mut c, &a.id).await.len(), 2);
}

/// A session created with a title gives it to the CLI (`initialize`'s `title`, 2.1.120 and
/// later), which announces the title it holds again whenever it resumes
/// (`system/session_title_changed`). That announcement must not undo a rename made since
/// with UpdateSession; a rename the CLI makes itself (`rename_session`) still counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_survives_the_cli_announcing_its_old_title_at_a_resume() {
    let world = World::new(NEW).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create(&mut c, &world, "first name", "a", Some("Say hello")).await;
    common::grpc::settled(&mut c, &s).await;
    let renamed = update(
        &mut c,
        pb::UpdateSessionRequest {
            session_id: s.id.clone(),
            title: Some("second name".into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(renamed.title, "second name");
    common::grpc::stop_and_resume(&mut c, &s.id).await;
    // A turn of the resumed process: the CLI's announcement at its start is in the log.
    let events_before = common::grpc::history(&mut c, &s.id).await.len();
    common::grpc::turn(&mut c, &s.id, "Say hello again").await;
    let log = common::grpc::history(&mut c, &s.id).await;
    let announced = log.iter().filter(|e| {
        matches!(&e.payload, Some(Payload::Unknown(u)) if u.message_type == "system/session_title_changed")
    });
    assert!(
        announced.count() >= 2,
        "the CLI announced its title at create and at the resume: {:#?}",
        log.iter()
            .skip(events_before.saturating_sub(40))
            .map(common::grpc::describe)
            .collect::<Vec<_>>()
    );
    let now = common::grpc::session(&mut c, &s.id).await;
    assert_eq!(
        now.title, "second name",
        "the rename holds after the resume"
    );

    // The CLI's own rename (a client's rename_session) still replaces the title: once its
    // announcement is in the log, the session has the title.
    let last = log.last().map_or(0, |e| e.seq);
    let mut events = common::grpc::subscribe(&mut c, &s.id, last, true).await;
    c.send_control_request(pb::SendControlRequestRequest {
        session_id: s.id.clone(),
        subtype: "rename_session".into(),
        request_json: r#"{"title": "third name"}"#.into(),
    })
    .await
    .unwrap();
    let mut seen = Vec::new();
    common::grpc::read_until(&mut events, &mut seen, "the CLI's rename", |e| {
        matches!(&e.payload, Some(Payload::Unknown(u))
            if u.message_type == "system/session_title_changed" && u.raw_json.contains("third name"))
    })
    .await;
    assert_eq!(
        common::grpc::session(&mut c, &s.id).await.title,
        "third name"
    );
}

/// The `custom-title` entries of the CLI's transcript of `cli_session_id` (under the
/// world's HOME, `.claude/projects/<dir>/<id>.jsonl`), oldest first.
fn custom_titles(world: &World, cli_session_id: &str) -> Vec<String> {
    let mut titles = Vec::new();
    for dir in std::fs::read_dir(world.home.join(".claude/projects"))
        .unwrap()
        .flatten()
    {
        let Ok(text) = std::fs::read_to_string(dir.path().join(format!("{cli_session_id}.jsonl")))
        else {
            continue;
        };
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            if v["type"] == "custom-title" {
                titles.push(v["customTitle"].as_str().unwrap().to_owned());
            }
        }
    }
    titles
}

/// The titles of the `rename_session` requests ostler sent on its own and the CLI took
/// (`cli_title_set` notices), oldest first.
fn titles_set(log: &[pb::SessionEvent]) -> Vec<String> {
    log.iter()
        .filter_map(|e| match &e.payload {
            Some(Payload::EngineNotice(n)) if n.code == "cli_title_set" => {
                let d: serde_json::Value = serde_json::from_str(&n.data_json).unwrap();
                Some(d["request"]["title"].as_str().unwrap().to_owned())
            }
            _ => None,
        })
        .collect()
}

/// A title changed with UpdateSession reaches the CLI (`rename_session`, 2.1.120 and
/// later), so its transcript (what `claude --resume` and the Agent SDK list) names the
/// session as ostler does: at once while the session is live, and at the next resume for a
/// rename made while it was not. The CLI's echo adds no second `session_updated`; a resume
/// whose CLI already holds ostler's title sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_reaches_the_cli_transcript_live_and_at_the_next_resume() {
    let world = World::new(NEW).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create(&mut c, &world, "first name", "a", Some("Say hello")).await;
    common::grpc::settled(&mut c, &s).await;
    let s = common::grpc::session(&mut c, &s.id).await;
    assert!(!s.cli_session_id.is_empty());

    // Live: the CLI takes the new title, echoes it, and its transcript records it.
    let mut events = common::grpc::subscribe(&mut c, &s.id, s.last_seq, false).await;
    update(
        &mut c,
        pb::UpdateSessionRequest {
            session_id: s.id.clone(),
            title: Some("second name".into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let mut seen = Vec::new();
    let mut set = false;
    let mut echoed = false;
    common::grpc::read_until(
        &mut events,
        &mut seen,
        "the CLI's rename and its echo",
        |e| {
            match &e.payload {
                Some(Payload::EngineNotice(n)) if n.code == "cli_title_set" => set = true,
                Some(Payload::Unknown(u))
                    if u.message_type == "system/session_title_changed"
                        && u.raw_json.contains("second name") =>
                {
                    echoed = true
                }
                _ => {}
            }
            set && echoed
        },
    )
    .await;
    assert_eq!(
        custom_titles(&world, &s.cli_session_id)
            .last()
            .map(String::as_str),
        Some("second name")
    );
    assert_eq!(titles_set(&seen), ["second name"]);
    let notices = updated_notices(&mut c, &s.id).await;
    assert_eq!(notices.len(), 1, "one session_updated: {notices:?}");
    assert_eq!(notices[0].1["title"]["new"], "second name");
    assert_eq!(updated_items(&mut c, &s.id).await.len(), 1);
    assert_eq!(
        common::grpc::session(&mut c, &s.id).await.title,
        "second name"
    );

    // A resume whose CLI holds ostler's title already: nothing sent.
    common::grpc::stop_and_resume(&mut c, &s.id).await;
    common::grpc::turn(&mut c, &s.id, "Say hello again").await;
    let log = common::grpc::history(&mut c, &s.id).await;
    assert_eq!(
        titles_set(&log),
        ["second name"],
        "nothing sent at the resume"
    );

    // Renamed while stopped: the next process gets the title once it has answered
    // initialize.
    c.stop_session(pb::StopSessionRequest {
        session_id: s.id.clone(),
    })
    .await
    .unwrap();
    update(
        &mut c,
        pb::UpdateSessionRequest {
            session_id: s.id.clone(),
            title: Some("third name".into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(
        custom_titles(&world, &s.cli_session_id)
            .last()
            .map(String::as_str),
        Some("second name"),
        "nothing reached the stopped CLI"
    );
    let last = common::grpc::session(&mut c, &s.id).await.last_seq;
    let mut events = common::grpc::subscribe(&mut c, &s.id, last, false).await;
    c.resume_session(pb::ResumeSessionRequest {
        session_id: s.id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    common::grpc::send(&mut c, &s.id, "Say hello once more").await;
    let mut seen = Vec::new();
    let (mut set, mut turned) = (false, false);
    common::grpc::read_until(&mut events, &mut seen, "the turn and the title sent", |e| {
        set |= matches!(&e.payload, Some(Payload::EngineNotice(n))
            if n.code == "cli_title_set" && n.data_json.contains("third name"));
        turned |= common::grpc::is_turn_completed(e);
        set && turned
    })
    .await;
    assert_eq!(
        custom_titles(&world, &s.cli_session_id)
            .last()
            .map(String::as_str),
        Some("third name")
    );
    let now = common::grpc::session(&mut c, &s.id).await;
    assert_eq!(now.title, "third name", "ostler keeps its title");
    let notices = updated_notices(&mut c, &s.id).await;
    assert_eq!(notices.len(), 2, "{notices:?}");
}

/// The `session_title_changed` echoes in `log`: their titles, oldest first.
fn echoed_titles(log: &[pb::SessionEvent]) -> Vec<String> {
    log.iter()
        .filter_map(|e| match &e.payload {
            Some(Payload::Unknown(u)) if u.message_type == "system/session_title_changed" => {
                let v: serde_json::Value = serde_json::from_str(&u.raw_json).unwrap();
                Some(v["title"].as_str().unwrap().to_owned())
            }
            _ => None,
        })
        .collect()
}

/// A session's titles given one after another with `UpdateSession` while its CLI is held
/// with SIGSTOP (each recorded before the CLI has read any), then the CLI let go; returns
/// the session, its subscription, and its events up to two `cli_title_set` answers and two
/// `session_title_changed` echoes (ostler sends the first title and then the newest),
/// asserting at each echo that the session's title is already the last one given.
async fn renamed_while_the_cli_is_stopped(
    daemon: &common::Daemon,
    c: &mut Client,
    world: &World,
    titles: &[&str],
) -> (pb::Session, common::grpc::Events, Vec<pb::SessionEvent>) {
    let newest = *titles.last().unwrap();
    let s = create(c, world, "created name", "a", Some("Say hello")).await;
    common::grpc::settled(c, &s).await;
    let s = common::grpc::session(c, &s.id).await;
    let mut events = common::grpc::subscribe(c, &s.id, s.last_seq, false).await;
    let cli = common::children(daemon.pid());
    assert_eq!(cli.len(), 1, "{cli:?}");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(cli[0]).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    for &title in titles {
        let now = update(
            c,
            pb::UpdateSessionRequest {
                session_id: s.id.clone(),
                title: Some(title.into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        assert_eq!(now.title, title);
    }
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let mut seen = Vec::new();
    let (mut set, mut echoes) = (0, 0);
    while set < 2 || echoes < 2 {
        let ev = common::grpc::read_until(&mut events, &mut seen, "the echoes and answers", |e| {
            matches!(&e.payload, Some(Payload::EngineNotice(n)) if n.code == "cli_title_set")
                || matches!(&e.payload, Some(Payload::Unknown(u))
                    if u.message_type == "system/session_title_changed")
        })
        .await;
        if matches!(&ev.payload, Some(Payload::Unknown(_))) {
            echoes += 1;
            assert_eq!(
                common::grpc::session(c, &s.id).await.title,
                newest,
                "after echo {echoes}: {:?}",
                echoed_titles(&seen)
            );
        } else {
            set += 1;
        }
    }
    (s, events, seen)
}

/// Renames in quick succession, all recorded before the CLI has read any (its process is
/// held with SIGSTOP): ostler sends the CLI one `rename_session` at a time (the newest
/// title once the first is answered, the one between skipped), so the CLI ends with the
/// newest; the echo of the first, which comes back after the newer titles are ostler's,
/// is not a rename by the CLI. Whoever sees an echo finds the newest title; the log holds
/// exactly the client's three `session_updated` notices and the two titles ostler sent;
/// the CLI's transcript ends with the newest.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_rename_echo_does_not_undo_a_newer_rename() {
    const A: &str = "ECHO-A first rename";
    const B: &str = "ECHO-B second rename";
    const C: &str = "ECHO-C third rename";
    let world = World::new(NEW).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    // Each echo, as it is seen: the session has C (ostler's record) already.
    let (s, _, seen) = renamed_while_the_cli_is_stopped(&daemon, &mut c, &world, &[A, B, C]).await;
    assert_eq!(
        echoed_titles(&seen),
        [A, C],
        "the CLI echoed what it was sent"
    );
    assert_eq!(titles_set(&seen), [A, C], "ostler sent A, then the newest");
    assert_eq!(common::grpc::session(&mut c, &s.id).await.title, C);
    // Exactly the client's three renames are recorded, as the client's.
    let renames = client_titles(&mut c, &s.id).await;
    assert_eq!(renames, [A, B, C]);
    assert_eq!(updated_items(&mut c, &s.id).await.len(), 3);
    assert_eq!(
        custom_titles(&world, &s.cli_session_id)
            .last()
            .map(String::as_str),
        Some(C)
    );
}

/// The CLI takes a title in its own form (2.1.332: control and format characters made
/// spaces, edges trimmed) and echoes that form. Two renames while the CLI is stopped: the
/// echo of the first, in the CLI's form, is still recognised as ostler's and does not undo
/// the newer one. A later rename alone, taken in another form: ostler's record shows the
/// form the CLI uses, as for a rename by the CLI (its echo is the record). The CLI's
/// answer carries no title.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_title_the_cli_takes_in_its_own_form_is_still_its_echo() {
    const A: &str = "FORM-A\u{200b}zero width";
    const A_CLI: &str = "FORM-A zero width";
    const B: &str = "FORM-B plain";
    const D: &str = "FORM-D\u{1}control";
    const D_CLI: &str = "FORM-D control";
    let world = World::new(NEW).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let (s, mut events, seen) =
        renamed_while_the_cli_is_stopped(&daemon, &mut c, &world, &[A, B]).await;
    assert_eq!(echoed_titles(&seen), [A_CLI, B], "the CLI echoes its form");
    assert_eq!(titles_set(&seen), [A, B]);
    for ev in &seen {
        if let Some(Payload::EngineNotice(n)) = &ev.payload
            && n.code == "cli_title_set"
        {
            let d: serde_json::Value = serde_json::from_str(&n.data_json).unwrap();
            assert!(
                d["answer"].is_null() || d["answer"].get("title").is_none(),
                "the answer carries no title: {d}"
            );
        }
    }
    // A rename alone, taken in the CLI's form: ostler's record follows the CLI.
    update(
        &mut c,
        pb::UpdateSessionRequest {
            session_id: s.id.clone(),
            title: Some(D.into()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let mut seen = Vec::new();
    common::grpc::read_until(&mut events, &mut seen, "D's echo", |e| {
        matches!(&e.payload, Some(Payload::Unknown(u))
            if u.message_type == "system/session_title_changed")
    })
    .await;
    assert_eq!(echoed_titles(&seen), [D_CLI]);
    assert_eq!(common::grpc::session(&mut c, &s.id).await.title, D_CLI);
    let renames = client_titles(&mut c, &s.id).await;
    assert_eq!(
        renames,
        [A, B, D],
        "the CLI's renames are its echoes, not notices"
    );
}

/// An idempotent create retry (client-chosen id) compares the labels the session was
/// created with, not the ones UpdateSession gave it since: after a relabel the original
/// request still returns the session; other labels are still another request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_retry_after_a_relabel_returns_the_session() {
    let world = World::new(NEW).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let req = pb::CreateSessionRequest {
        cwd: world.work.display().to_string(),
        session_id: "relabel-retry-1".into(),
        title: "first".into(),
        labels: [("team".to_owned(), "a".to_owned())].into(),
        ..Default::default()
    };
    let a = c.create_session(req.clone()).await.unwrap().into_inner();
    update(
        &mut c,
        pb::UpdateSessionRequest {
            session_id: a.id.clone(),
            set_labels: [("stage".to_owned(), "review".to_owned())].into(),
            remove_labels: vec!["team".into()],
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let b = c.create_session(req.clone()).await.unwrap().into_inner();
    assert_eq!(b.id, a.id);
    assert_eq!(b.created_at_ms, a.created_at_ms, "the same session");
    assert_eq!(
        sorted(&b.labels),
        vec![("stage".to_owned(), "review".to_owned())],
        "the labels it has now"
    );
    for labels in [
        [("team".to_owned(), "b".to_owned())].into(),
        [("stage".to_owned(), "review".to_owned())].into(),
    ] {
        let e = c
            .create_session(pb::CreateSessionRequest {
                labels,
                ..req.clone()
            })
            .await
            .expect_err("other labels than the create's");
        assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e:?}");
        assert!(e.message().contains("different labels"), "{}", e.message());
    }
}
