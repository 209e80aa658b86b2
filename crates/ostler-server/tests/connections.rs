//! The server's connections, through real sockets: a connection over
//! `max_connections` is answered UNAVAILABLE at once, and served again once one ends; and HTTP/2
//! keep-alive closes a connection whose client stops answering PINGs while one that
//! answers stays.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::time::Duration;

use ostler_engine::EngineOptions;
use ostler_server::ServerOptions;
use ostler_testkit::timeouts::{guard, millis};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

mod common;

async fn start(opts: ServerOptions) -> common::Harness {
    common::start_with(opts, EngineOptions::default(), "/nonexistent/claude".into()).await
}

/// A new connection and one health check on it.
async fn connect_and_check(addr: SocketAddr) -> Result<Channel, tonic::Status> {
    let ch = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("connect: {e}")))?;
    HealthClient::new(ch.clone())
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await?;
    Ok(ch)
}

/// Waits until a new connection is served (the server frees a slot once it has seen a
/// connection close, so this may take a few attempts); fails with `why` after the guard.
async fn served_again(addr: SocketAddr, why: &str) {
    tokio::time::timeout(guard(), async {
        loop {
            if connect_and_check(addr).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect(why);
}

#[tokio::test]
async fn a_connection_over_the_cap_is_refused_at_once_and_served_once_one_ends() {
    let h = start(ServerOptions {
        max_connections: 2,
        keepalive_interval: None,
        ..Default::default()
    })
    .await;
    let first = tokio::time::timeout(guard(), connect_and_check(h.addr))
        .await
        .unwrap()
        .unwrap();
    let _second = tokio::time::timeout(guard(), connect_and_check(h.addr))
        .await
        .unwrap()
        .unwrap();
    // The third is answered at once, UNAVAILABLE ("retry later"), naming the setting.
    let refused = tokio::time::timeout(guard(), connect_and_check(h.addr))
        .await
        .expect("refused at once, not left waiting");
    let status = refused.expect_err("a third connection was served over a cap of 2");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
    assert!(
        status.message().contains("listen.max_connections"),
        "{status}"
    );
    // One ends: the server frees its slot once it has seen the connection close, so the
    // retry may need a few attempts.
    drop(first);
    served_again(h.addr, "a connection is served again after one ended").await;
    h.shutdown.cancel();
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const ACK: u8 = 1;

/// An HTTP/2 client on a raw socket: the preface and empty SETTINGS, then it reads frames.
struct RawClient(tokio::net::TcpStream);

impl RawClient {
    async fn connect(addr: SocketAddr) -> Self {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(PREFACE).await.unwrap();
        s.write_all(&frame(SETTINGS, 0, &[])).await.unwrap();
        Self(s)
    }

    /// The next frame's type, flags and payload; `None` at the end of the connection.
    async fn next(&mut self) -> Option<(u8, u8, Vec<u8>)> {
        let mut head = [0u8; 9];
        self.0.read_exact(&mut head).await.ok()?;
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        self.0.read_exact(&mut payload).await.ok()?;
        Some((head[3], head[4], payload))
    }
}

fn frame(ty: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut f = vec![
        (len >> 16) as u8,
        (len >> 8) as u8,
        len as u8,
        ty,
        flags,
        0,
        0,
        0,
        0,
    ];
    f.extend_from_slice(payload);
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_closes_a_connection_whose_client_stopped_answering_and_keeps_one_that_answers() {
    // Four PINGs answered take longer than one PING unanswered plus its timeout. The
    // timeout is generous: a busy machine may answer late.
    let every = millis(300);
    let h = start(ServerOptions {
        keepalive_interval: Some(every),
        keepalive_timeout: every * 2,
        ..Default::default()
    })
    .await;
    let mut silent = RawClient::connect(h.addr).await;
    let mut answering = RawClient::connect(h.addr).await;
    let silent_side = async {
        let mut pinged = false;
        while let Some((ty, flags, _)) = silent.next().await {
            pinged |= ty == PING && flags & ACK == 0;
        }
        pinged
    };
    let answering_side = async {
        let mut answered = 0;
        while answered < 4 {
            let Some((ty, flags, payload)) = answering.next().await else {
                return answered;
            };
            if ty == PING && flags & ACK == 0 {
                answering
                    .0
                    .write_all(&frame(PING, ACK, &payload))
                    .await
                    .unwrap();
                answered += 1;
            }
        }
        answered
    };
    let (pinged, answered) =
        tokio::time::timeout(guard(), async { tokio::join!(silent_side, answering_side) })
            .await
            .expect("the silent client was never disconnected");
    assert!(pinged, "the silent client was closed without a PING first");
    assert_eq!(answered, 4, "the answering client was disconnected");
    h.shutdown.cancel();
}

/// A connection that sends nothing, or only part of the HTTP/2 preface, is closed after
/// `handshake_timeout` and frees its slot (keep-alive starts only after the preface, so
/// such connections would otherwise hold every slot forever); one that sent the preface
/// stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_silent_before_the_preface_are_closed_and_free_their_slots() {
    let within = millis(300);
    let h = start(ServerOptions {
        max_connections: 3,
        keepalive_interval: None,
        handshake_timeout: within,
        ..Default::default()
    })
    .await;
    let mut silent = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    let mut partial = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    partial.write_all(&PREFACE[..10]).await.unwrap();
    let mut talking = RawClient::connect(h.addr).await;
    assert!(closed(&mut silent).await, "a silent connection stays open");
    assert!(closed(&mut partial).await, "half a preface stays open");
    // The one that sent its preface is served past the deadline (3 of them).
    let stays = tokio::time::timeout(within * 3, async {
        while talking.next().await.is_some() {}
    })
    .await;
    assert!(
        stays.is_err(),
        "a connection that sent its preface was closed"
    );
    // Their slots are free again: with the talking one, two more are served.
    served_again(h.addr, "the silent connections' slots are never freed").await;
    h.shutdown.cancel();
}

/// Whether the server closes `s` (within the guard time), whatever it sent first.
async fn closed(s: &mut tokio::net::TcpStream) -> bool {
    let mut buf = Vec::new();
    tokio::time::timeout(guard(), s.read_to_end(&mut buf))
        .await
        .is_ok()
}
