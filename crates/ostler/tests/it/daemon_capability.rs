//! Capability gating through the real daemon (issue 10): `GetHealthDetails` lists what the
//! running release can do, and `SetModel` on a release that never answers `set_model`
//! fails at once with FAILED_PRECONDITION instead of waiting for the control timeout.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error

use crate::common;

use std::time::Instant;

use common::grpc::*;
use common::*;
use ostler_proto::v1 as pb;

async fn capabilities(daemon: &Daemon) -> Vec<String> {
    let mut d = daemon.daemon_client().await;
    let h = d
        .get_health_details(pb::GetHealthDetailsRequest {})
        .await
        .unwrap()
        .into_inner();
    h.claude_code.unwrap().capabilities
}

#[tokio::test(flavor = "multi_thread")]
async fn set_model_is_refused_at_once_on_a_release_that_ignores_it() {
    let world = World::new("1.0.59").await;
    let daemon = world.daemon(&[]).await;
    let caps = capabilities(&daemon).await;
    assert!(caps.iter().any(|c| c == "control:interrupt"), "{caps:?}");
    assert!(!caps.iter().any(|c| c == "control:set_model"), "{caps:?}");
    // Measured: no SDK MCP servers, no elicitation.
    assert!(
        !caps.iter().any(|c| c.starts_with("cli_request:")),
        "{caps:?}"
    );

    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "cap").await;
    let started = Instant::now();
    let err = c
        .set_model(pb::SetModelRequest {
            session_id: s.id.clone(),
            model: "claude-ostler-x".into(),
        })
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("1.0.59") && err.message().contains("set_model"),
        "{err:?}"
    );
    // The daemon's control timeout is 30 s; "at once" is far below it.
    assert!(
        took < ostler_testkit::timeouts::secs(5),
        "SetModel took {took:?}"
    );

    // A fork the release cannot make is refused before anything is recorded: the session
    // stays stopped (it was left EXITED by a spawn that failed).
    c.stop_session(pb::StopSessionRequest {
        session_id: s.id.clone(),
    })
    .await
    .unwrap();
    let err = c
        .resume_session(pb::ResumeSessionRequest {
            session_id: s.id.clone(),
            fork: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("--fork-session"), "{err:?}");
    assert_eq!(
        session(&mut c, &s.id).await.state(),
        pb::SessionState::Stopped
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn health_lists_the_capabilities_of_a_2_1_release() {
    let world = World::new("2.1.332").await;
    let daemon = world.daemon(&[]).await;
    let caps = capabilities(&daemon).await;
    for want in [
        "flag:--fork-session",
        "control:set_model",
        "control:get_context_usage",
        "control:stop_task",
        "cli_request:mcp_message",
        "cli_request:elicitation",
        "interrupt_receipt_v1",
    ] {
        assert!(
            caps.iter().any(|c| c == want),
            "{want} missing from {caps:?}"
        );
    }
}
