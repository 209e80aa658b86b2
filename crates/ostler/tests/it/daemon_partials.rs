//! Partial deltas through the real daemon, on the fast fake CLI (`fake:partials N`): a
//! client that keeps up receives every delta the CLI sent; a client that stalls is told
//! how many it missed (`PartialsMissed`, never silently: received + missed = sent) and
//! still receives every stored event; the daemon's `ostler_partial_deltas_missed_total`
//! counts exactly what it was told.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error
#![allow(clippy::disallowed_methods)] // spawns the ostler binary as a client

use crate::common;

use common::grpc::*;
use common::metrics::*;
use common::*;
use ostler_proto::v1 as pb;
use pb::session_event::Payload as P;
use pb::session_service_client::SessionServiceClient;

/// Deltas per turn: below the live buffer (2 x the default `sessions.subscriber_buffer`
/// of 1,024 = 2,048 items), so a client that reads each turn to its end before the next
/// can never fall out of it.
const PER_TURN: u64 = 900;
/// 9,000 deltas: more than the stalled client's HTTP/2 buffers (its 16 KiB window, the
/// daemon's 400 KB per-stream send buffer: ~100 B per delta) and the live buffer hold.
const TURNS: u64 = 10;

#[derive(Default)]
struct Count {
    partials: u64,
    missed: u64,
    stored: Vec<u64>,
}

impl Count {
    fn add(&mut self, e: &pb::SessionEvent) {
        match &e.payload {
            Some(P::PartialDelta(_)) => self.partials += 1,
            Some(P::PartialsMissed(m)) => {
                assert_eq!(e.seq, 0, "PartialsMissed is live-only");
                assert!(m.count > 0, "an empty PartialsMissed");
                self.missed += m.count;
            }
            _ => {
                assert_ne!(e.seq, 0, "only partials are live-only: {}", describe(e));
                self.stored.push(e.seq);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partials_reach_a_client_that_keeps_up_and_a_stalled_one_is_told_what_it_missed() {
    let mut world = World::new(NEW).await;
    world.claude = fake_claude_binary().await;
    std::fs::write(&world.config, "[metrics]\nlisten = \"127.0.0.1:0\"\n").unwrap();
    let (cmd, ready) = world.serve_command(&[]);
    let daemon = Daemon::spawn(cmd, &world, ready.clone(), &[]).await;
    let metrics = metrics_addr(&std::fs::read_to_string(&ready).unwrap())
        .expect("the metrics endpoint in the ready file");
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "partials").await;
    let mut keep = subscribe(&mut c, &s.id, 0, true).await;
    // The stalled client: its own connection with small HTTP/2 windows, so the daemon
    // soon cannot send it more, and it reads nothing until every turn is over.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", daemon.addr))
        .unwrap()
        .initial_stream_window_size(Some(16 << 10))
        .initial_connection_window_size(Some(64 << 10))
        .connect()
        .await
        .unwrap();
    let mut stalled_client = SessionServiceClient::new(channel).max_decoding_message_size(64 << 20);
    let mut stalled = subscribe(&mut stalled_client, &s.id, 0, true).await;

    let mut k = Count::default();
    let mut seen = Vec::new();
    for turn in 1..=TURNS {
        send(&mut c, &s.id, &format!("fake:partials {PER_TURN}")).await;
        let before = k.partials;
        let end = read_until(&mut keep, &mut seen, "the turn's end", |e| {
            k.add(e);
            is_turn_completed(e)
        })
        .await;
        seen.clear();
        assert_eq!(
            k.partials - before,
            PER_TURN,
            "turn {turn}: the client that keeps up got {} of {PER_TURN} deltas",
            k.partials - before
        );
        assert_eq!(
            k.missed, 0,
            "turn {turn}: a client that keeps up missed deltas"
        );
        let last = end.seq;
        // The state change after the result, so the next turn starts from idle.
        read_until(&mut keep, &mut seen, "idle", |e| {
            k.add(e);
            matches!(&e.payload, Some(P::StateChanged(sc)) if sc.to() == pb::SessionState::Idle)
                && e.seq > last
        })
        .await;
        seen.clear();
    }
    let sent = TURNS * PER_TURN;
    assert_eq!(k.partials, sent);
    let last = *k.stored.last().unwrap();
    assert_gap_free(&seen_stored(&k), 1);

    // The stalled client reads now: every stored event up to the last, every delta
    // either received or counted missed.
    let mut st = Count::default();
    read_until(&mut stalled, &mut seen, "the last stored event", |e| {
        st.add(e);
        e.seq == last
    })
    .await;
    assert_eq!(
        st.stored, k.stored,
        "the stalled client got every stored event"
    );
    assert!(
        st.missed > 0,
        "the stalled client missed nothing ({} received): nothing was tested",
        st.partials
    );
    eprintln!(
        "stalled client: {} deltas received, {} missed, of {sent}",
        st.partials, st.missed
    );
    assert_eq!(
        st.partials + st.missed,
        sent,
        "received {} + missed {} must be every delta sent",
        st.partials,
        st.missed
    );
    // What the two clients were told, and nothing more (the one that keeps up: none).
    let m = Metrics::scrape(metrics).await;
    assert_eq!(
        m.count("ostler_partial_deltas_missed_total", &[]),
        (k.missed + st.missed) as f64,
        "the metric counts the deltas the subscribers were told they missed"
    );
}

/// The stored seqs counted, as events for [`assert_gap_free`].
fn seen_stored(c: &Count) -> Vec<pb::SessionEvent> {
    c.stored
        .iter()
        .map(|&seq| pb::SessionEvent {
            seq,
            ..Default::default()
        })
        .collect()
}

/// The answer of `fake:partials n`: its deltas' texts, in order.
fn partials_text(n: u64) -> String {
    (0..n).map(|k| format!("p{k} ")).collect()
}

/// A daemon on the fast fake CLI with one session, for the `ostler` client's tests.
struct ClientWorld {
    world: World,
    daemon: Daemon,
    c: SessionServiceClient<tonic::transport::Channel>,
    session_id: String,
}

impl ClientWorld {
    async fn start() -> Self {
        let mut world = World::new(NEW).await;
        world.claude = fake_claude_binary().await;
        let (cmd, ready) = world.serve_command(&[]);
        let daemon = Daemon::spawn(cmd, &world, ready, &[]).await;
        let mut c = daemon.sessions().await;
        let session_id = create_session(&mut c, &world.work, "partials").await.id;
        Self {
            world,
            daemon,
            c,
            session_id,
        }
    }

    /// Starts `ostler send ID "fake:partials n"` (human output). Its stdout is a pipe that
    /// nobody reads until [`Sent::output`].
    fn send_partials(&self, n: u64) -> Sent {
        let child = std::process::Command::new(OSTLER)
            .args(["send", &self.session_id, &format!("fake:partials {n}")])
            .env_clear()
            .envs(self.world.client_env(&self.daemon.addr.to_string()))
            .env("NO_COLOR", "1")
            .current_dir(&self.world.work)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn ostler send");
        Sent(child)
    }
}

struct Sent(std::process::Child);

impl Sent {
    /// Reads the client's stdout and stderr to their end; asserts it succeeded.
    async fn output(self) -> (String, String) {
        let child = self.0;
        let out = tokio::task::spawn_blocking(move || wait_output(child))
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
        (stdout, stderr)
    }
}

const FELL_BEHIND: &str = "part of this text's stream did not reach this client";

/// `ostler send` shows the answer as its deltas stream. When it falls behind (here: its
/// stdout is a pipe nobody reads until the turn is over, so it stops reading the daemon
/// after ~64 KiB of text) the daemon drops deltas for it and says so; what it showed then
/// has holes, and it must print the whole text of the block when the block comes, after a
/// note, instead of leaving the reader with the holes. A client that keeps up prints the
/// text once (the next test).
///
/// This is the `ostler` client's side of item d of issue 13: the daemon tells a subscriber
/// what it missed; the client must not show a text with holes as if it were the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_client_that_fell_behind_prints_the_whole_answer() {
    // ~690 KB of text: far more than the pipe, the HTTP/2 windows and the live buffer hold.
    const N: u64 = 100_000;
    let mut w = ClientWorld::start().await;
    let mut watch = subscribe(&mut w.c, &w.session_id, 0, false).await;
    let sent = w.send_partials(N);
    // The turn ends in the daemon while the client is stuck on its full stdout.
    let mut seen = Vec::new();
    read_until(&mut watch, &mut seen, "the turn's end", is_turn_completed).await;
    let (stdout, stderr) = sent.output().await;
    assert!(
        stderr.contains(FELL_BEHIND),
        "the client was not told it fell behind (nothing was tested?): {stderr}"
    );
    assert!(
        stdout.contains(&partials_text(N)),
        "the whole answer is not in the output ({} bytes; stderr: {stderr})",
        stdout.len()
    );
}

/// A client that keeps up shows the streamed answer once, whole and unbroken on its
/// redirected stdout: its subscription is opened before the message goes out (a
/// subscription opened after the send loses the first deltas, which the fast fake CLI
/// publishes at once), and the notices it prints meanwhile (the session's start, on
/// stderr) put no line break into the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_client_that_keeps_up_prints_the_answer_once() {
    // Fewer deltas than the live buffer holds: this client cannot fall behind.
    const N: u64 = 1_000;
    let w = ClientWorld::start().await;
    let (stdout, stderr) = w.send_partials(N).output().await;
    assert!(!stderr.contains(FELL_BEHIND), "{stderr}");
    assert_eq!(
        stdout.matches(&partials_text(N)).count(),
        1,
        "the streamed answer, shown once: {stdout}"
    );
}
