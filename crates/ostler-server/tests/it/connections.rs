//! The server's connections, through real sockets: a connection over
//! `max_connections` is answered UNAVAILABLE at once, and served again once one ends; HTTP/2
//! keep-alive closes a connection whose client stops answering PINGs while one that
//! answers stays; and the idle rule asks a connection with no authenticated call in flight
//! to go away (one that never made one after `handshake_timeout`, others after
//! `idle_timeout`), never one with a call in flight.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use ostler_engine::EngineOptions;
use ostler_proto::v1 as pb;
use ostler_proto::v1::daemon_service_client::DaemonServiceClient;
use ostler_proto::v1::session_service_client::SessionServiceClient;
use ostler_server::{ServerOptions, Token};
use ostler_testkit::timeouts::{guard, millis};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::common;

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

/// `ostler_connections_closed_total{reason}` as this process counted it so far.
fn closed_total(reason: &str) -> u64 {
    let text = ostler_metrics::render(ostler_metrics::Phase::Starting).unwrap();
    let key = format!("ostler_connections_closed_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&key))
        .map_or(0, |v| v.trim().parse().unwrap())
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
    let refused_before = closed_total("over_capacity");
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
    assert_eq!(closed_total("over_capacity"), refused_before + 1);
    // One ends: the server frees its slot once it has seen the connection close, so the
    // retry may need a few attempts.
    drop(first);
    served_again(h.addr, "a connection is served again after one ended").await;
    h.shutdown.cancel();
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const ACK: u8 = 1;

/// An HTTP/2 client on a raw socket: the preface and empty SETTINGS, then it reads frames.
struct RawClient(tokio::net::TcpStream);

impl RawClient {
    /// Answers every PING until the server closes the connection; whether a GOAWAY came
    /// first, and how many PINGs were answered.
    async fn answer_until_closed(&mut self) -> (bool, usize) {
        let (mut went_away, mut pings) = (false, 0);
        while let Some((ty, flags, payload)) = self.next().await {
            match ty {
                PING if flags & ACK == 0 => {
                    // The server may close while we answer.
                    if self.0.write_all(&frame(PING, ACK, &payload)).await.is_err() {
                        break;
                    }
                    pings += 1;
                }
                GOAWAY => went_away = true,
                _ => {}
            }
        }
        (went_away, pings)
    }

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
        // The clients make no call: the idle rule must not close them first.
        handshake_timeout: guard(),
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
    // The one that sent its preface is not cut by the preface deadline: it makes no
    // authenticated call, so the idle rule asks it to go away (GOAWAY) after the same time.
    let (went_away, _) = tokio::time::timeout(guard(), talking.answer_until_closed())
        .await
        .expect("a connection that sent its preface is never closed");
    assert!(
        went_away,
        "a connection that sent its preface was cut without a GOAWAY"
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

const TOKEN: &str = "the-token";

/// Options with a token, the given grace for a first authenticated call (and for a
/// connection asked to go away to finish), and idle timeout.
fn idle_options(first: Duration, idle: Duration) -> ServerOptions {
    ServerOptions {
        tokens: vec![Token::new(TOKEN).unwrap()],
        handshake_timeout: first,
        idle_timeout: idle,
        ..Default::default()
    }
}

/// What a [`Watching`] channel's connector saw.
#[derive(Debug, PartialEq)]
enum Conn {
    Opened,
    /// The client's HTTP/2 connection ended (its socket was dropped).
    Closed,
}

/// A socket that reports its drop.
struct Watched {
    s: tokio::net::TcpStream,
    events: mpsc::UnboundedSender<Conn>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        let _ = self.events.send(Conn::Closed);
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().s).poll_read(cx, buf)
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().s).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().s).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().s).poll_shutdown(cx)
    }
}

/// tonic's executor for a watched channel: counts the tasks running (the channel's buffer
/// worker, and each connection's tasks). A channel sees that its connection has ended, and
/// opens a new one for its next call instead of failing the call, once that connection's
/// tasks have ended (the socket is dropped a little earlier).
#[derive(Clone)]
struct Counting(std::sync::Arc<tokio::sync::watch::Sender<usize>>);

type Task = Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

impl hyper::rt::Executor<Task> for Counting {
    fn execute(&self, fut: Task) {
        self.0.send_modify(|n| *n += 1);
        let live = self.0.clone();
        tokio::spawn(async move {
            fut.await;
            live.send_modify(|n| *n -= 1);
        });
    }
}

/// A tonic channel (connected) whose connections are reported as they open and end.
struct Watching {
    ch: Channel,
    events: mpsc::UnboundedReceiver<Conn>,
    tasks: tokio::sync::watch::Receiver<usize>,
}

impl Watching {
    async fn connect(addr: SocketAddr) -> Self {
        let (tx, events) = mpsc::unbounded_channel();
        let connector = tower::service_fn(move |_: http::Uri| {
            let events = tx.clone();
            async move {
                let s = tokio::net::TcpStream::connect(addr).await?;
                let _ = events.send(Conn::Opened);
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(Watched { s, events }))
            }
        });
        let (live, tasks) = tokio::sync::watch::channel(0);
        let ch = Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .executor(Counting(std::sync::Arc::new(live)))
            .connect_with_connector(connector)
            .await
            .unwrap();
        Self { ch, events, tasks }
    }

    /// Waits until no connection's task is left (only the channel's buffer worker runs).
    async fn disconnected(&mut self) {
        tokio::time::timeout(guard(), self.tasks.wait_for(|n| *n == 1))
            .await
            .expect("the connection's tasks never ended")
            .unwrap();
    }
}

/// The next thing the connector saw (within the guard time).
async fn next_conn(events: &mut mpsc::UnboundedReceiver<Conn>) -> Conn {
    tokio::time::timeout(guard(), events.recv())
        .await
        .expect("nothing happened to the connection")
        .unwrap()
}

/// A request carrying `token` as a bearer token.
fn with_token<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    req
}

/// (1) A peer without a token that sends the preface and answers every PING, but makes no
/// call, is asked to go away (GOAWAY) once `handshake_timeout` has passed, and the only
/// slot is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_makes_no_call_is_asked_to_go_away_and_frees_its_slot() {
    let first = millis(300);
    let h = start(ServerOptions {
        max_connections: 1,
        // PINGs while it waits: answering them must not keep the connection.
        keepalive_interval: Some(first / 3),
        keepalive_timeout: first * 10,
        ..idle_options(first, guard())
    })
    .await;
    let (never_before, idle_before) = (closed_total("never_authenticated"), closed_total("idle"));
    let opened = Instant::now();
    let mut peer = RawClient::connect(h.addr).await;
    let (went_away, pings) = tokio::time::timeout(guard(), peer.answer_until_closed())
        .await
        .expect("a connection without an authenticated call kept its slot");
    assert!(went_away, "closed without a GOAWAY");
    assert!(pings > 0, "the server sent no PING to answer");
    assert!(opened.elapsed() >= first, "closed before its grace");
    assert_eq!(closed_total("never_authenticated"), never_before + 1);
    assert_eq!(closed_total("idle"), idle_before);
    served_again(h.addr, "the slot of the closed connection is never freed").await;
    h.shutdown.cancel();
}

/// (1) A client that keeps making calls with a wrong token (each refused UNAUTHENTICATED)
/// does not keep its connection: it is asked to go away after `handshake_timeout`, and
/// the only slot is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_calls_all_fail_authentication_loses_its_connection() {
    let first = millis(300);
    let h = start(ServerOptions {
        max_connections: 1,
        ..idle_options(first, guard())
    })
    .await;
    let never_before = closed_total("never_authenticated");
    let Watching { ch, mut events, .. } = Watching::connect(h.addr).await;
    assert_eq!(next_conn(&mut events).await, Conn::Opened);
    let spam = async {
        let mut client = DaemonServiceClient::new(ch.clone());
        loop {
            let req = with_token(pb::GetHealthDetailsRequest {}, "wrong-token");
            let e = client.get_health_details(req).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
        }
    };
    tokio::select! {
        () = spam => unreachable!(),
        c = next_conn(&mut events) => assert_eq!(c, Conn::Closed),
    }
    assert_eq!(closed_total("never_authenticated"), never_before + 1);
    drop(ch);
    served_again(h.addr, "the slot of the closed connection is never freed").await;
    h.shutdown.cancel();
}

/// (2) A client with a valid token following a stream for far longer than the idle
/// timeout keeps its connection, and the stream keeps delivering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_in_flight_keeps_its_connection_past_the_idle_timeout() {
    let idle = millis(300);
    let h = start(idle_options(idle, idle)).await;
    let Watching { ch, mut events, .. } = Watching::connect(h.addr).await;
    assert_eq!(next_conn(&mut events).await, Conn::Opened);
    let mut client = SessionServiceClient::new(ch);
    let watch = pb::WatchSessionsRequest {
        follow: true,
        ..Default::default()
    };
    let mut feed = client
        .watch_sessions(with_token(watch, TOKEN))
        .await
        .unwrap()
        .into_inner();
    // Proving that something does not happen: an idle connection is closed within one
    // idle timeout plus one grace (here 2 x 300 ms x scale); 5 idle timeouts is well past
    // that.
    let closed = tokio::time::timeout(idle * 5, events.recv()).await;
    assert!(closed.is_err(), "the connection changed: {closed:?}");
    // The stream still delivers: a session created (over another connection; its CLI does
    // not exist, but the session is recorded first) is an item on it.
    let mut other = SessionServiceClient::new(
        Endpoint::from_shared(format!("http://{}", h.addr))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    );
    let create = pb::CreateSessionRequest {
        cwd: h.dir.path().display().to_string(),
        ..Default::default()
    };
    let _ = other.create_session(with_token(create, TOKEN)).await;
    let item = tokio::time::timeout(guard(), feed.message())
        .await
        .expect("no feed item")
        .expect("the stream broke")
        .expect("the stream ended");
    assert_eq!(item.kind(), pb::FeedKind::SessionCreated, "{item:?}");
    assert!(
        events.try_recv().is_err(),
        "the stream's connection was replaced"
    );
    h.shutdown.cancel();
}

/// (3) A client with a valid token that goes idle is asked to go away after the idle
/// timeout (not the shorter grace of one that never made a call), and its next call on the
/// same channel succeeds over a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_client_is_asked_to_go_away_and_its_next_call_reconnects() {
    let (first, idle) = (millis(200), millis(600));
    let h = start(idle_options(first, idle)).await;
    let (never_before, idle_before) = (closed_total("never_authenticated"), closed_total("idle"));
    let mut w = Watching::connect(h.addr).await;
    assert_eq!(next_conn(&mut w.events).await, Conn::Opened);
    let mut client = DaemonServiceClient::new(w.ch.clone());
    let before = Instant::now();
    client
        .get_health_details(with_token(pb::GetHealthDetailsRequest {}, TOKEN))
        .await
        .unwrap();
    assert_eq!(next_conn(&mut w.events).await, Conn::Closed);
    assert!(
        before.elapsed() >= idle,
        "closed {:?} after its last call; the idle timeout is {idle:?}",
        before.elapsed()
    );
    assert_eq!(closed_total("idle"), idle_before + 1);
    assert_eq!(closed_total("never_authenticated"), never_before);
    w.disconnected().await;
    client
        .get_health_details(with_token(pb::GetHealthDetailsRequest {}, TOKEN))
        .await
        .expect("the call after the GOAWAY failed");
    assert_eq!(next_conn(&mut w.events).await, Conn::Opened);
    h.shutdown.cancel();
}
