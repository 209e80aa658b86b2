//! The gRPC surface in process: a real engine on a real (temporary) SQLite store, the real
//! tonic server on an ephemeral loopback port, and generated clients. No CLI is spawned
//! here (the installation is assumed); the daemon tests in `crates/ostler/tests` drive
//! real CLI releases.

#![allow(clippy::unwrap_used)] // test helpers: a failure should panic with the error

use std::time::Duration;

use ostler_engine::EngineOptions;
use ostler_proto::v1 as pb;
use ostler_proto::v1::daemon_service_client::DaemonServiceClient;
use ostler_proto::v1::session_service_client::SessionServiceClient;
use ostler_server::{ServerOptions, Token};
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::common;

use common::{Harness, start_with};

async fn start(opts: ServerOptions, engine_opts: EngineOptions) -> Harness {
    start_with(opts, engine_opts, "/nonexistent/claude".into()).await
}

async fn channel(addr: std::net::SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

async fn wait_serving(ch: Channel) {
    let mut health = HealthClient::new(ch);
    let deadline = tokio::time::Instant::now() + ostler_testkit::timeouts::secs(10);
    loop {
        let r = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await;
        if let Ok(r) = r
            && r.get_ref().status() == ServingStatus::Serving
        {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "never SERVING");
        // Health is set by the server's first check right after start; a status not set
        // yet answers NOT_FOUND. Watch would also work; a short retry keeps it simple.
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn health_request(service: &str) -> tonic_health::pb::HealthCheckRequest {
    tonic_health::pb::HealthCheckRequest {
        service: service.into(),
    }
}

/// The health status of `service` ("" for the daemon as a whole).
async fn health_of(ch: &Channel, service: &str) -> ServingStatus {
    HealthClient::new(ch.clone())
        .check(health_request(service))
        .await
        .unwrap()
        .get_ref()
        .status()
}

/// A `grpc.health.v1.Health/Watch` stream of `service` ("" for the daemon as a whole).
async fn health_watch(
    ch: &Channel,
    service: &str,
) -> tonic::Streaming<tonic_health::pb::HealthCheckResponse> {
    HealthClient::new(ch.clone())
        .watch(health_request(service))
        .await
        .unwrap()
        .into_inner()
}

async fn health_details(ch: &Channel) -> pb::HealthDetailsResponse {
    DaemonServiceClient::new(ch.clone())
        .get_health_details(pb::GetHealthDetailsRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// Waits for a server to stop after its shutdown began: within the scaled test timeout,
/// far less than a drain that waited for open calls.
async fn stops(server: tokio::task::JoinHandle<ostler_server::Result<()>>) {
    tokio::time::timeout(ostler_testkit::timeouts::secs(10), server)
        .await
        .expect("the server stopped after shutdown")
        .unwrap()
        .unwrap();
}

/// The names reflection (v1) lists.
async fn reflected_services(ch: &Channel) -> Vec<String> {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = ServerReflectionClient::new(ch.clone())
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner();
    match stream.message().await.unwrap().unwrap().message_response {
        Some(MessageResponse::ListServicesResponse(l)) => {
            l.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("unexpected reflection answer: {other:?}"),
    }
}

/// A server started before its engine (`run_starting`) on a loopback port: the handle that
/// makes it ready, its task, its shutdown token and its address.
async fn start_starting() -> (
    ostler_server::Starting,
    tokio::task::JoinHandle<ostler_server::Result<()>>,
    tokio_util::sync::CancellationToken,
    std::net::SocketAddr,
) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = tokio_util::sync::CancellationToken::new();
    let (starting, server) = ostler_server::Server::run_starting(
        ServerOptions::default(),
        vec![ostler_server::Listener::Tcp(listener)],
        shutdown.clone(),
    );
    (starting, tokio::spawn(server), shutdown, addr)
}

#[tokio::test]
async fn a_starting_daemon_answers_health_not_serving_and_calls_unavailable_until_ready() {
    // The daemon listens before its store is open (a migration can take minutes): probes
    // must see NOT_SERVING, not a refused connection, and calls a retryable UNAVAILABLE.
    let dir = tempfile::tempdir().unwrap();
    let (starting, server, shutdown, addr) = start_starting().await;
    let ch = channel(addr).await;

    for service in ["", "ostler.v1.SessionService"] {
        assert_eq!(
            health_of(&ch, service).await,
            ServingStatus::NotServing,
            "{service:?}"
        );
    }
    // A health watcher started now sees the change without asking again.
    let mut watch = health_watch(&ch, "").await;
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status(), ServingStatus::NotServing);
    assert!(
        reflected_services(&ch)
            .await
            .contains(&"ostler.v1.SessionService".to_owned())
    );
    let err = SessionServiceClient::new(ch.clone())
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(err.message().contains("starting"), "{}", err.message());
    let err = DaemonServiceClient::new(ch.clone())
        .get_health_details(pb::GetHealthDetailsRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");

    // Ready: once `ready` returns, the same connection is fully served.
    let ready = common::ready_in(
        dir.path(),
        EngineOptions::default(),
        "/nonexistent/claude".into(),
    )
    .await;
    starting.ready(ready).await;
    assert_eq!(health_of(&ch, "").await, ServingStatus::Serving);
    let next = watch.message().await.unwrap().unwrap();
    assert_eq!(next.status(), ServingStatus::Serving);
    let listed = SessionServiceClient::new(ch.clone())
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.sessions.is_empty());
    let d = health_details(&ch).await;
    assert_eq!(d.daemon_version, "9.9.9");

    shutdown.cancel();
    stops(server).await;
}

#[tokio::test]
async fn health_watches_see_not_serving_and_end_at_shutdown_without_holding_the_drain() {
    // A drain that would wait far longer than the test allows: only streams that end make
    // the server stop in time.
    let opts = ServerOptions {
        drain_timeout: Duration::from_secs(600),
        ..Default::default()
    };
    let h = start(opts, EngineOptions::default()).await;
    let ch = channel(h.addr).await;
    wait_serving(ch.clone()).await;
    let mut watches = Vec::new();
    for service in ["", "ostler.v1.SessionService"] {
        let mut w = health_watch(&ch, service).await;
        assert_eq!(
            w.message().await.unwrap().unwrap().status(),
            ServingStatus::Serving
        );
        watches.push(w);
    }

    h.shutdown.cancel();
    for mut w in watches {
        // Every status until the end; the last one is NOT_SERVING, then the stream ends
        // with UNAVAILABLE (retry elsewhere or later).
        let mut last = None;
        let end = tokio::time::timeout(ostler_testkit::timeouts::secs(30), async {
            loop {
                match w.message().await {
                    Ok(Some(m)) => last = Some(m.status()),
                    Ok(None) => break None,
                    Err(status) => break Some(status),
                }
            }
        })
        .await
        .expect("the health watch ended at shutdown");
        assert_eq!(last, Some(ServingStatus::NotServing));
        let end = end.expect("the stream ends with a status");
        assert_eq!(end.code(), Code::Unavailable, "{end:?}");
        assert!(end.message().contains("shutting down"), "{}", end.message());
    }
    // Well before the drain's timeout.
    stops(h.server).await;
}

#[tokio::test]
async fn a_start_that_fails_closes_the_listeners() {
    let (starting, server, shutdown, addr) = start_starting().await;
    let ch = channel(addr).await;
    assert_eq!(health_of(&ch, "").await, ServingStatus::NotServing);
    // The daemon could not open its store: it drops the handle.
    drop(starting);
    stops(server).await;
    assert!(shutdown.is_cancelled());
    let refused = tokio::net::TcpStream::connect(addr).await;
    assert!(refused.is_err(), "still accepting after a failed start");
}

#[tokio::test]
async fn health_serving_details_and_reflection() {
    let h = start(ServerOptions::default(), EngineOptions::default()).await;
    let ch = channel(h.addr).await;
    wait_serving(ch.clone()).await;

    // The session service has its own health entry.
    let mut health = HealthClient::new(ch.clone());
    let r = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "ostler.v1.SessionService".into(),
        })
        .await
        .unwrap();
    assert_eq!(r.get_ref().status(), ServingStatus::Serving);

    let d = health_details(&ch).await;
    assert_eq!(d.daemon_version, "9.9.9");
    assert!(d.store.as_ref().unwrap().ok);
    let cc = d.claude_code.unwrap();
    assert_eq!(cc.version, "2.1.330");
    assert_eq!(cc.level(), pb::CompatibilityLevel::FullyCompatible);
    assert_eq!(cc.binary_path, "/nonexistent/claude");
    assert_eq!(d.sessions.unwrap().total, 0);

    // Reflection (v1) lists the services without the proto files.
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut refl = ServerReflectionClient::new(ch.clone());
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = refl
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner();
    let resp = stream.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = resp.message_response else {
        panic!("unexpected reflection answer: {resp:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in [
        "ostler.v1.SessionService",
        "ostler.v1.DaemonService",
        "grpc.health.v1.Health",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }
    // ... and serves the descriptor of a symbol.
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(
            "ostler.v1.SessionEvent".into(),
        )),
    };
    let mut stream = refl
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
        .unwrap()
        .into_inner();
    let resp = stream.message().await.unwrap().unwrap();
    assert!(
        matches!(
            resp.message_response,
            Some(MessageResponse::FileDescriptorResponse(ref f)) if !f.file_descriptor_proto.is_empty()
        ),
        "{resp:?}"
    );

    // Shutdown: health turns NOT_SERVING through Watch, and the server ends.
    let mut watch = health_watch(&ch, "").await;
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status(), ServingStatus::Serving);
    h.shutdown.cancel();
    let next = tokio::time::timeout(ostler_testkit::timeouts::secs(5), watch.message())
        .await
        .expect("watch answers on shutdown");
    let m = next
        .expect("watch stream ok")
        .expect("a status before the stream ends");
    assert_eq!(m.status(), ServingStatus::NotServing);
    // The watch stays open here: it ends at shutdown and does not hold the drain.
    stops(h.server).await;
    drop(watch);
}

#[tokio::test]
async fn bearer_tokens_are_enforced_except_for_health() {
    let opts = ServerOptions {
        tokens: vec![Token::new("right-token").unwrap()],
        ..Default::default()
    };
    let h = start(opts, EngineOptions::default()).await;
    let ch = channel(h.addr).await;
    wait_serving(ch.clone()).await; // health needs no token

    let call = |token: Option<&'static str>| {
        let ch = ch.clone();
        async move {
            let mut req = tonic::Request::new(pb::GetHealthDetailsRequest {});
            if let Some(t) = token {
                req.metadata_mut()
                    .insert("authorization", t.parse().unwrap());
            }
            DaemonServiceClient::new(ch).get_health_details(req).await
        }
    };
    let err = call(None).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    let err = call(Some("Bearer wrong-token")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(!err.message().contains("right-token"), "{}", err.message());
    let err = call(Some("right-token")).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "scheme is required");
    call(Some("Bearer right-token")).await.unwrap();

    // Streaming and session calls are behind the same layer.
    let err = SessionServiceClient::new(ch.clone())
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated);
    h.shutdown.cancel();
}

#[tokio::test]
async fn bad_requests_get_actionable_codes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let h = start(
        ServerOptions::default(),
        EngineOptions {
            allowed_roots: vec![root.clone()],
            max_live_sessions: 0,
            ..Default::default()
        },
    )
    .await;
    let ch = channel(h.addr).await;
    let mut s = SessionServiceClient::new(ch);

    let e = s
        .get_session(pb::GetSessionRequest {
            session_id: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("session_id"), "{}", e.message());

    let e = s
        .get_session(pb::GetSessionRequest {
            session_id: "no-such-session".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains("no-such-session"), "{}", e.message());

    let e = s
        .subscribe(pb::SubscribeRequest {
            session_id: "no-such-session".into(),
            follow: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);

    let e = s
        .list_sessions(pb::ListSessionsRequest {
            states: vec![99],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("states[0]"), "{}", e.message());

    let e = s
        .set_permission_mode(pb::SetPermissionModeRequest {
            session_id: "x".into(),
            mode: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);

    let e = s
        .send_message(pb::SendMessageRequest {
            session_id: "x".into(),
            content: None,
            client_message_id: String::new(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("content"), "{}", e.message());

    // A cwd that does not exist, and one outside the allowed roots.
    let e = s
        .create_session(pb::CreateSessionRequest {
            cwd: dir.path().join("missing").display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("cwd"), "{}", e.message());
    let e = s
        .create_session(pb::CreateSessionRequest {
            cwd: dir.path().display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    // The session limit (0 here) is RESOURCE_EXHAUSTED.
    let e = s
        .create_session(pb::CreateSessionRequest {
            cwd: root.display().to_string(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");

    let e = s
        .respond_to_permission(pb::RespondToPermissionRequest {
            session_id: "x".into(),
            request_id: "r".into(),
            decision: None,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    h.shutdown.cancel();
}

/// An unknown service's health check is answered "trailers-only": the status in the
/// response's one HEADERS frame, which ends the stream. An empty DATA frame after it is not
/// valid gRPC: grpc-core clients (Python's grpcio) read UNKNOWN instead of NOT_FOUND.
#[tokio::test]
async fn an_unknown_health_service_is_answered_trailers_only() {
    let h = start(ServerOptions::default(), EngineOptions::default()).await;
    wait_serving(channel(h.addr).await).await;
    let tcp = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    // One gRPC message: HealthCheckRequest { service: "nope" } (field 1, 4 bytes).
    let message = "\u{a}\u{4}nope";
    let body = format!("\0\0\0\0{}{message}", char::from(message.len() as u8));
    let req = http::Request::post(format!("http://{}/grpc.health.v1.Health/Check", h.addr))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(
        resp.headers().get("grpc-status").map(|v| v.as_bytes()),
        Some(&b"5"[..]),
        "{resp:?}"
    );
    use http_body::Body as _;
    assert!(
        resp.body().is_end_stream(),
        "the HEADERS frame ends the stream: {resp:?}"
    );
}
