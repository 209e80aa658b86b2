//! Input validation at the edge, through real gRPC on a loopback socket: every bad request
//! is refused with INVALID_ARGUMENT naming the field before anything is spawned, echoed
//! input is cut short, label filters are capped, an undecodable request is the client's
//! error, and a spawn the kernel refuses (E2BIG) is not "retry later".

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::PathBuf;

use ostler_engine::EngineOptions;
use ostler_proto::v1 as pb;
use ostler_proto::v1::session_service_client::SessionServiceClient;
use ostler_server::ServerOptions;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::common;

struct Harness {
    client: SessionServiceClient<Channel>,
    channel: Channel,
    server: common::Harness,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.server.shutdown.cancel();
    }
}

/// A server whose engine would run `claude` (a path that need not exist: a request that
/// reaches the spawn fails there, which is what these tests must never see).
async fn start(claude: PathBuf, engine_opts: EngineOptions) -> Harness {
    let server = common::start_with(ServerOptions::default(), engine_opts, claude).await;
    let channel = Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    Harness {
        client: SessionServiceClient::new(channel.clone()),
        channel,
        server,
    }
}

fn cwd(h: &Harness) -> String {
    h.server.dir.path().display().to_string()
}

/// INVALID_ARGUMENT whose message names `field` and stays short.
#[track_caller]
fn invalid(e: Status, field: &str) {
    assert_eq!(e.code(), Code::InvalidArgument, "{field}: {e:?}");
    assert!(
        e.message().contains(field),
        "{field} not named in {:?}",
        e.message()
    );
    assert!(
        e.message().len() < 600,
        "{field}: message of {} bytes",
        e.message().len()
    );
}

async fn session_count(h: &mut Harness) -> usize {
    h.client
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sessions
        .len()
}

/// GetInteraction over a store holding settled and pending interactions of stopped
/// sessions: found in any state (with cwd, who decided, the response), and each way a
/// request id can fail to name one interaction, naming `request_id`.
#[tokio::test]
async fn get_interaction_finds_settled_requests_and_names_what_is_wrong() {
    use ostler_store::*;
    const DECIDED_MS: i64 = 1_796_053_543_123; // 2026-11-30 15:45:43 UTC
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ostler.db");
    // The store's writes block: off the runtime's thread.
    tokio::task::spawn_blocking(move || {
        let store = Store::open(path, Default::default()).unwrap();
        for id in ["sa", "sb"] {
            store
                .create_session(NewSession {
                    id: id.into(),
                    claude_session_id: None,
                    cwd: format!("/w/{id}"),
                    model: None,
                    permission_mode: None,
                    cli_release: None,
                    state: SessionState::Stopped,
                    labels: Default::default(),
                    created_ms: 1,
                })
                .wait()
                .unwrap();
        }
        for (session, request) in [("sa", "dup"), ("sb", "dup"), ("sa", "rx1"), ("sa", "rx2")] {
            store
                .upsert_interaction(NewInteraction {
                    session_id: session.into(),
                    request_id: request.into(),
                    kind: InteractionKind::Permission,
                    tool_name: Some("Bash".into()),
                    input: bytes::Bytes::from_static(b"{}"),
                    suggestions: None,
                    event_seq: None,
                    created_ms: 5,
                })
                .wait()
                .unwrap();
        }
        store
            .decide_interaction(
                "sa",
                "rx1",
                Decision {
                    state: InteractionState::Denied,
                    decided_by: "client:bot".into(),
                    response: Some(bytes::Bytes::from_static(br#"{"behavior":"deny"}"#)),
                    decided_ms: DECIDED_MS,
                },
            )
            .wait()
            .unwrap();
    })
    .await
    .unwrap();
    let server = common::start_in(
        dir,
        ServerOptions::default(),
        EngineOptions::default(),
        "/nonexistent/claude".into(),
    )
    .await;
    let channel = Channel::from_shared(format!("http://{}", server.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut c = SessionServiceClient::new(channel);
    let get = |request_id: &str, session_id: &str| pb::GetInteractionRequest {
        request_id: request_id.into(),
        session_id: session_id.into(),
    };

    let i = c
        .get_interaction(get("rx1", ""))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (i.session_id.as_str(), i.cwd.as_str(), i.request_id.as_str()),
        ("sa", "/w/sa", "rx1")
    );
    assert_eq!(i.state, pb::InteractionState::Denied as i32);
    assert_eq!(i.kind, pb::InteractionKind::Permission as i32);
    assert_eq!(i.decided_by, "client:bot");
    assert_eq!((i.decided_ms, i.created_ms), (DECIDED_MS, 5));
    assert_eq!(i.response_json, r#"{"behavior":"deny"}"#);
    assert!(!i.response_truncated);
    let i = c
        .get_interaction(get("dup", "sb"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (i.session_id.as_str(), i.state),
        ("sb", pb::InteractionState::Pending as i32)
    );
    assert!(i.decided_by.is_empty() && i.response_json.is_empty());

    let e = c.get_interaction(get("rx", "")).await.unwrap_err();
    invalid(e.clone(), "request_id");
    assert!(
        e.message().contains("rx1") && e.message().contains("rx2"),
        "{e:?}"
    );
    let e = c.get_interaction(get("dup", "")).await.unwrap_err();
    invalid(e.clone(), "request_id");
    assert!(
        e.message().contains("sa")
            && e.message().contains("sb")
            && e.message().contains("session_id"),
        "{e:?}"
    );
    invalid(
        c.get_interaction(get(" ", "")).await.unwrap_err(),
        "request_id",
    );
    let e = c.get_interaction(get("nope", "")).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().contains("nope"), "{e:?}");
    let e = c.get_interaction(get("rx1", "sb")).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = c.get_interaction(get("rx1", "zz")).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");

    // Answering a settled request of a session without a process: refused, saying who
    // decided and when (in UTC), worded as the client words it from GetInteraction.
    let deny = |request_id: &str| pb::RespondToPermissionRequest {
        session_id: "sa".into(),
        request_id: request_id.into(),
        decision: Some(pb::respond_to_permission_request::Decision::Deny(
            pb::PermissionDeny {
                message: "no".into(),
                interrupt: false,
            },
        )),
    };
    let e = c.respond_to_permission(deny("rx1")).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let m = e.message();
    assert!(
        m.starts_with(
            "request rx1 (session sa) was already denied by client:bot at 2026-11-30 15:45:43 \
             UTC ("
        ) && m.ends_with(" ago)"),
        "{m}"
    );
    // Still pending in a stopped session: the session's state; unknown: NOT_FOUND.
    let e = c.respond_to_permission(deny("rx2")).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("no CLI process"), "{e:?}");
    let e = c.respond_to_permission(deny("nope")).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    server.shutdown.cancel();
}

#[tokio::test]
async fn create_session_fields_are_checked_before_spawning() {
    let mut h = start("/nonexistent/claude".into(), EngineOptions::default()).await;
    let base = || pb::CreateSessionRequest {
        cwd: String::new(),
        ..Default::default()
    };
    let dir = cwd(&h);
    let cases: Vec<(pb::CreateSessionRequest, &str)> = vec![
        (
            pb::CreateSessionRequest {
                model: "claude\0sonnet".into(),
                ..base()
            },
            "model",
        ),
        (
            pb::CreateSessionRequest {
                append_system_prompt: "be\0nice".into(),
                ..base()
            },
            "append_system_prompt",
        ),
        (
            pb::CreateSessionRequest {
                allowed_tools: vec!["Read".into(), "Bash(ls\0)".into()],
                ..base()
            },
            "allowed_tools[1]",
        ),
        (
            pb::CreateSessionRequest {
                cwd: format!("{dir}\0/x"),
                ..base()
            },
            "cwd",
        ),
        (
            // A 3 MB tool list.
            pb::CreateSessionRequest {
                allowed_tools: (0..30_000).map(|i| format!("Tool{i:0>96}")).collect(),
                ..base()
            },
            "allowed_tools",
        ),
        (
            // One argument longer than the kernel takes (MAX_ARG_STRLEN, 128 KiB).
            pb::CreateSessionRequest {
                append_system_prompt: "x".repeat(200 * 1024),
                ..base()
            },
            "append_system_prompt",
        ),
        (
            // Each value within its own limit, too much together for one command line.
            pb::CreateSessionRequest {
                append_system_prompt: "x".repeat(100 * 1024),
                disallowed_tools: (0..200)
                    .map(|i| format!("T{i}{}", "y".repeat(1000)))
                    .collect(),
                ..base()
            },
            "at most 262144",
        ),
        (
            pb::CreateSessionRequest {
                labels: [("k\0".to_string(), "v".to_string())].into(),
                ..base()
            },
            "labels",
        ),
        (
            pb::CreateSessionRequest {
                labels: (0..100).map(|i| (format!("k{i}"), "v".into())).collect(),
                ..base()
            },
            "labels",
        ),
        (
            // Too many entries: the limit named is the one that holds (64), so a client
            // that trims to it is not refused again.
            pb::CreateSessionRequest {
                add_dirs: vec![dir.clone(); 100_000],
                ..base()
            },
            "at most 64",
        ),
        (
            pb::CreateSessionRequest {
                allowed_tools: vec!["--dangerously-skip-permissions".into()],
                ..base()
            },
            "allowed_tools[0]",
        ),
        (
            pb::CreateSessionRequest {
                rules: vec![pb::PermissionRule {
                    tool: "Bash".into(),
                    pattern: "p".repeat(10_000),
                    action: 0,
                }],
                ..base()
            },
            "rules[0].pattern",
        ),
    ];
    for (mut req, field) in cases {
        if req.cwd.is_empty() {
            req.cwd = dir.clone();
        }
        let e = h.client.create_session(req).await.unwrap_err();
        invalid(e, field);
    }
    assert_eq!(
        session_count(&mut h).await,
        0,
        "no session was created by a refused request"
    );

    // A 1 MB cwd is refused, and not echoed whole.
    let e = h
        .client
        .create_session(pb::CreateSessionRequest {
            cwd: format!("/{}", "d".repeat(1 << 20)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    invalid(e, "cwd");
}

#[tokio::test]
async fn other_requests_are_checked_and_echoes_cut() {
    let mut h = start("/nonexistent/claude".into(), EngineOptions::default()).await;
    let huge = "s".repeat(1 << 20);

    let e = h
        .client
        .get_session(pb::GetSessionRequest {
            session_id: huge.clone(),
        })
        .await
        .unwrap_err();
    invalid(e, "session_id");

    let e = h
        .client
        .resume_session(pb::ResumeSessionRequest {
            session_id: huge.clone(),
            fork: false,
            ..Default::default()
        })
        .await
        .unwrap_err();
    invalid(e, "session_id");

    let e = h
        .client
        .send_message(pb::SendMessageRequest {
            session_id: "x".into(),
            content: Some(pb::MessageContent {
                content: Some(pb::message_content::Content::Text("hi".into())),
            }),
            client_message_id: huge.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    invalid(e, "client_message_id");

    let e = h
        .client
        .send_message(pb::SendMessageRequest {
            session_id: "no\0such".into(),
            content: Some(pb::MessageContent {
                content: Some(pb::message_content::Content::Text("hi".into())),
            }),
            client_message_id: String::new(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    invalid(e, "session_id");

    let e = h
        .client
        .respond_to_permission(pb::RespondToPermissionRequest {
            session_id: "x".into(),
            request_id: huge.clone(),
            decision: None,
        })
        .await
        .unwrap_err();
    invalid(e, "request_id");

    let e = h
        .client
        .set_model(pb::SetModelRequest {
            session_id: "x".into(),
            model: "m\0".into(),
        })
        .await
        .unwrap_err();
    invalid(e, "model");

    // 1,000 label filters: a clear limit, not INTERNAL from SQLite.
    let e = h
        .client
        .list_sessions(pb::ListSessionsRequest {
            labels: (0..1000).map(|i| (format!("k{i}"), "v".into())).collect(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    invalid(e, "labels");
    assert!(e_message_has_limit(&h, 32).await);
    // The same filters of ListPendingInteractions, the same limits.
    let e = h
        .client
        .list_pending_interactions(pb::ListPendingInteractionsRequest {
            labels: (0..1000).map(|i| (format!("k{i}"), "v".into())).collect(),
        })
        .await
        .unwrap_err();
    invalid(e, "labels");
    let e = h
        .client
        .list_pending_interactions(pb::ListPendingInteractionsRequest {
            labels: [("k\0".to_string(), "v".to_string())].into(),
        })
        .await
        .unwrap_err();
    invalid(e, "labels");
    // An empty key (which no session can carry) is a mistake, not an empty result.
    let e = h
        .client
        .list_sessions(pb::ListSessionsRequest {
            labels: [(String::new(), "x".to_string())].into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    invalid(e, "label key is empty");

    // A known id that does not exist: NOT_FOUND, with the id quoted.
    let e = h
        .client
        .get_session(pb::GetSessionRequest {
            session_id: "s".repeat(256),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    assert!(e.message().len() < 600, "{}", e.message().len());
}

/// The label-filter limit is in the message (and 32 filters are fine).
async fn e_message_has_limit(h: &Harness, max: usize) -> bool {
    let mut c = h.client.clone();
    let ok = c
        .list_sessions(pb::ListSessionsRequest {
            labels: (0..max).map(|i| (format!("k{i}"), "v".into())).collect(),
            ..Default::default()
        })
        .await;
    let e = c
        .list_sessions(pb::ListSessionsRequest {
            labels: (0..=max).map(|i| (format!("k{i}"), "v".into())).collect(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    ok.is_ok() && e.message().contains(&format!("at most {max}"))
}

/// Raw bytes as the request body of any RPC.
mod raw {
    use bytes::{Buf as _, BufMut as _};
    use tonic::Status;
    use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

    #[derive(Default)]
    pub struct RawCodec;
    pub struct Enc;
    pub struct Dec;

    impl Codec for RawCodec {
        type Encode = Vec<u8>;
        type Decode = Vec<u8>;
        type Encoder = Enc;
        type Decoder = Dec;
        fn encoder(&mut self) -> Enc {
            Enc
        }
        fn decoder(&mut self) -> Dec {
            Dec
        }
    }

    impl Encoder for Enc {
        type Item = Vec<u8>;
        type Error = Status;
        fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
            dst.put_slice(&item);
            Ok(())
        }
    }

    impl Decoder for Dec {
        type Item = Vec<u8>;
        type Error = Status;
        fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
            let v = src.chunk().to_vec();
            src.advance(v.len());
            Ok(Some(v))
        }
    }
}

#[tokio::test]
async fn an_undecodable_request_is_invalid_argument() {
    let h = start("/nonexistent/claude".into(), EngineOptions::default()).await;
    let mut grpc = tonic::client::Grpc::new(h.channel.clone());
    // Field 1 (session_id) with wire type 7, which does not exist.
    let garbage = vec![0x0f, 0xff, 0xff, 0xff];
    for path in [
        "/ostler.v1.SessionService/GetSession",
        "/ostler.v1.SessionService/Subscribe",
    ] {
        grpc.ready().await.unwrap();
        let path = http::uri::PathAndQuery::from_static(path);
        let res = if path.as_str().ends_with("Subscribe") {
            grpc.server_streaming(
                tonic::Request::new(garbage.clone()),
                path.clone(),
                raw::RawCodec,
            )
            .await
            .map(|_| ())
        } else {
            grpc.unary(
                tonic::Request::new(garbage.clone()),
                path.clone(),
                raw::RawCodec,
            )
            .await
            .map(|_| ())
        };
        let e = res.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{path}: {e:?}");
        assert!(e.message().contains("protobuf"), "{}", e.message());
    }
}

#[tokio::test]
async fn a_spawn_refused_by_the_kernel_is_not_unavailable() {
    // More environment than execve(2) takes (each string under MAX_ARG_STRLEN, far more
    // than ARG_MAX together): the spawn fails with E2BIG.
    let spawn_env = (0..80)
        .map(|i| (format!("BIG_{i}"), "e".repeat(120_000)))
        .collect();
    let mut h = start(
        "/bin/sh".into(),
        EngineOptions {
            spawn_env,
            ..Default::default()
        },
    )
    .await;
    let e = h
        .client
        .create_session(pb::CreateSessionRequest {
            cwd: cwd(&h),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("Argument list too long"),
        "{}",
        e.message()
    );
    let _ = session_count(&mut h).await;
}
