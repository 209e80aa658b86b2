//! gRPC-level acceptance tests of the daemon: the real `ostler serve` process, the real
//! Claude Code CLI (1.0.128 and 2.1.332) against the fake model server, real gRPC clients.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error

use crate::common;

use common::grpc::*;
use common::*;
use ostler_proto::v1 as pb;
use pb::session_event::Payload as P;
use tonic::Code;

/// Two clients on one session both see the stream; the second answers the permission
/// prompt and the tool really runs; the first client's late answer is refused; a third
/// client disconnects mid-turn and resubscribes from its last seq, seeing every event
/// exactly once.
async fn two_clients_one_session(release: &str) {
    let world = World::new(release).await;
    let daemon = world.daemon(&[]).await;
    let mut a = daemon.sessions().await;
    let mut b = daemon.sessions().await;
    let mut c = daemon.sessions().await;

    let session = create_session(&mut a, &world.work, "alice").await;
    let id = session.id.clone();
    let mut sa = subscribe(&mut a, &id, 0, false).await;
    let mut sb = subscribe(&mut b, &id, 0, false).await;
    let mut sc = subscribe(&mut c, &id, 0, false).await;
    let (mut ea, mut eb, mut ec) = (Vec::new(), Vec::new(), Vec::new());

    let user_seq = send(&mut a, &id, "Create the file allowed.txt please.").await;
    assert!(user_seq >= 1);

    let is_prompt = |e: &pb::SessionEvent| matches!(e.payload, Some(P::PermissionRequested(_)));
    let pa = read_until(&mut sa, &mut ea, "permission prompt (a)", is_prompt).await;
    let pbv = read_until(&mut sb, &mut eb, "permission prompt (b)", is_prompt).await;
    assert_eq!(pa, pbv, "both clients see the same event");
    let Some(P::PermissionRequested(req)) = &pa.payload else {
        unreachable!()
    };
    assert_eq!(req.tool_name, "Bash");
    assert!(
        req.input_json.contains("touch allowed.txt"),
        "{}",
        req.input_json
    );

    // Client c saw the prompt too, then disconnects mid-turn.
    read_until(&mut sc, &mut ec, "permission prompt (c)", is_prompt).await;
    let c_last = ec.last().unwrap().seq;
    drop(sc);

    // b answers; the tool runs.
    let answered = b
        .respond_to_permission(as_client(
            "bob",
            pb::RespondToPermissionRequest {
                session_id: id.clone(),
                request_id: req.request_id.clone(),
                decision: Some(pb::respond_to_permission_request::Decision::Allow(
                    pb::PermissionAllow::default(),
                )),
            },
        ))
        .await
        .unwrap()
        .into_inner();
    let resolved = answered.resolved.unwrap();
    assert_eq!(resolved.resolution(), pb::Resolution::Allowed);
    assert!(
        resolved.resolved_by.contains("bob"),
        "{}",
        resolved.resolved_by
    );

    // a's late answer is refused and changes nothing.
    let late = a
        .respond_to_permission(as_client(
            "alice",
            pb::RespondToPermissionRequest {
                session_id: id.clone(),
                request_id: req.request_id.clone(),
                decision: Some(pb::respond_to_permission_request::Decision::Deny(
                    pb::PermissionDeny {
                        message: "no".into(),
                        interrupt: false,
                    },
                )),
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(late.code(), Code::FailedPrecondition, "{late:?}");
    assert!(
        late.message().contains("bob"),
        "names who decided: {}",
        late.message()
    );

    let done_a = read_until(&mut sa, &mut ea, "turn end (a)", is_turn_completed).await;
    let done_b = read_until(&mut sb, &mut eb, "turn end (b)", is_turn_completed).await;
    assert_eq!(done_a, done_b);
    assert!(
        world.work.join("allowed.txt").exists(),
        "the tool really ran"
    );
    assert!(
        ea.iter()
            .any(|e| assistant_text(e) == Some("Created allowed.txt.")),
        "{:#?}",
        ea.iter().map(describe).collect::<Vec<_>>()
    );
    // Exactly one resolution was recorded.
    let resolutions = ea
        .iter()
        .filter(|e| matches!(e.payload, Some(P::PermissionResolved(_))))
        .count();
    assert_eq!(resolutions, 1);

    // Both live streams are identical and gap-free from 1.
    assert_eq!(ea, eb);
    assert_gap_free(&ea, 1);

    // c resubscribes after its last seq: every later event exactly once, in order.
    let mut sc = subscribe(&mut c, &id, c_last, false).await;
    let mut ec2 = Vec::new();
    let end_seq = done_a.seq;
    read_until(&mut sc, &mut ec2, "c catches up", |e| e.seq == end_seq).await;
    let resumed: Vec<_> = ec2.iter().filter(|e| !e.redelivered).cloned().collect();
    assert_gap_free(&resumed, c_last + 1);
    let mut all_c = ec.clone();
    all_c.extend(resumed);
    assert_eq!(all_c, ea, "c saw exactly what a saw, once");

    // The session is idle again and reports its last seq.
    let s = a
        .get_session(pb::GetSessionRequest {
            session_id: id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(s.last_seq >= end_seq);
    assert_eq!(s.cwd, world.work.display().to_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_clients_one_session_2_1_330() {
    two_clients_one_session(NEW).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_clients_one_session_1_0_128() {
    two_clients_one_session(OLD).await;
}
