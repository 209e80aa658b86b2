//! Storage faults on a real daemon: the store's directory is a small tmpfs that the test
//! fills up mid-turn (disk full) and frees again. Health must say so at once, new work must
//! be refused with UNAVAILABLE, nothing the CLI wrote may be lost, and everything recovers by
//! itself; a fault that outlasts `store.write_retry_secs` stops the session with an event
//! recorded once the store writes again.
//!
//! Mounting a tmpfs needs CAP_SYS_ADMIN (the CI runs as root); without it the tests say so
//! on stderr and pass without checking anything.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error
#![allow(clippy::disallowed_methods)] // mount(8) / umount(8)

use crate::common;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::grpc::*;
use common::*;
use ostler_proto::v1 as pb;
use pb::session_event::Payload as P;
use pb::session_service_client::SessionServiceClient;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// A tmpfs of a few MiB mounted on the store's directory, filled and freed on demand.
struct SmallDisk {
    dir: PathBuf,
    filler: PathBuf,
}

impl SmallDisk {
    /// `None` when this process may not mount (not root).
    fn mount(dir: &Path) -> Option<Self> {
        std::fs::create_dir_all(dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=8m", "ostler-test-store"])
            .arg(dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!(
                "SKIPPED: cannot mount a tmpfs on {} (needs root)",
                dir.display()
            );
            return None;
        }
        Some(Self {
            dir: dir.to_owned(),
            filler: dir.join("filler"),
        })
    }

    /// Takes every free block of the file system.
    fn fill(&self) {
        let mut f = std::fs::File::create(&self.filler).unwrap();
        for chunk in [64 << 10, 4 << 10, 1] {
            let buf = vec![0u8; chunk];
            while f.write_all(&buf).is_ok() {}
        }
        let left = nix::sys::statvfs::statvfs(&self.dir).unwrap();
        assert_eq!(left.blocks_available(), 0, "the tmpfs is full");
    }

    fn free(&self) {
        std::fs::remove_file(&self.filler).unwrap();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        // Lazy: the daemon may still hold files open while the test unwinds.
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

type Health = tonic::Streaming<tonic_health::pb::HealthCheckResponse>;

async fn health_watch(daemon: &Daemon) -> Health {
    HealthClient::new(daemon.channel().await)
        .watch(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// Reads the health watch until it reports `want`.
async fn health_becomes(watch: &mut Health, want: ServingStatus) {
    let fut = async {
        loop {
            let m = watch.message().await.unwrap().expect("health watch ended");
            if m.status() == want {
                return;
            }
        }
    };
    tokio::time::timeout(guard(), fut)
        .await
        .unwrap_or_else(|_| panic!("health never became {want:?}"));
}

async fn details(daemon: &Daemon) -> pb::StoreStatus {
    daemon
        .daemon_client()
        .await
        .get_health_details(pb::GetHealthDetailsRequest {})
        .await
        .unwrap()
        .into_inner()
        .store
        .unwrap()
}

/// Stored events only (no partials, no redeliveries).
fn stored(v: &[pb::SessionEvent]) -> Vec<pb::SessionEvent> {
    v.iter()
        .filter(|e| e.seq != 0 && !e.redelivered)
        .cloned()
        .collect()
}

fn with_retry_secs(world: &World, secs: u64) {
    std::fs::write(
        &world.config,
        format!("[store]\nwrite_retry_secs = {secs}\n"),
    )
    .unwrap();
}

/// Disk full during a turn: NOT_SERVING with the reason, UNAVAILABLE for new work, and once
/// space is back the turn completes with every event stored, gap-free, as clients saw it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disk_full_mid_turn_pauses_and_recovers() {
    let world = World::new(NEW).await;
    // Longer than the test: here the writes must wait, not fail.
    let Some(FullMidTurn {
        disk,
        daemon,
        mut health,
        mut c,
        s,
        mut events,
        mut seen,
    }) = full_mid_turn(&world, guard().as_secs() * 4).await
    else {
        return;
    };

    let st = details(&daemon).await;
    assert!(!st.ok);
    assert!(
        st.message.contains("store not writable") && st.message.contains("full"),
        "the reason is given: {}",
        st.message
    );
    let refused = c
        .send_message(as_client(
            "sender",
            pb::SendMessageRequest {
                session_id: s.id.clone(),
                content: text("Say hello."),
                client_message_id: String::new(),
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().starts_with("store not writable: "),
        "{}",
        refused.message()
    );
    let refused = c
        .create_session(as_client(
            "storage",
            pb::CreateSessionRequest {
                cwd: world.work.display().to_string(),
                ..Default::default()
            },
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(refused.message().starts_with("store not writable: "));

    disk.free();
    health_becomes(&mut health, ServingStatus::Serving).await;
    assert!(details(&daemon).await.ok);
    read_until(&mut events, &mut seen, "the turn's end", is_turn_completed).await;

    let log = history(&mut c, &s.id).await;
    assert_gap_free(&log, 1);
    let live = stored(&seen);
    assert_eq!(
        live,
        log[..live.len()].to_vec(),
        "clients saw what is stored"
    );
    assert!(
        log.iter()
            .any(|e| assistant_text(e).is_some_and(|t| t.starts_with("Once upon a time"))),
        "the story is stored: {:#?}",
        log.iter().map(describe).collect::<Vec<_>>()
    );
    assert!(log.iter().any(is_turn_completed));
    assert!(
        !daemon.log_text().contains("cannot record CLI output"),
        "{}",
        daemon.log_text()
    );
    // And the session works as before.
    let seq = send(&mut c, &s.id, "Say hello.").await;
    read_until(&mut events, &mut seen, "the second turn", |e| {
        e.seq > seq && is_turn_completed(e)
    })
    .await;
}

/// A daemon whose writes are retried for `retry_secs`, with a session mid-turn (its first
/// partial seen) when the store's disk fills up; health has gone NOT_SERVING.
/// `None` where no tmpfs can be mounted.
struct FullMidTurn {
    disk: SmallDisk,
    daemon: Daemon,
    health: Health,
    c: SessionServiceClient<Channel>,
    s: pb::Session,
    events: Events,
    seen: Vec<pb::SessionEvent>,
}

async fn full_mid_turn(world: &World, retry_secs: u64) -> Option<FullMidTurn> {
    let disk = SmallDisk::mount(world.store.parent().unwrap())?;
    with_retry_secs(world, retry_secs);
    let daemon = world.daemon(&[]).await;
    let mut health = health_watch(&daemon).await;
    health_becomes(&mut health, ServingStatus::Serving).await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "storage").await;
    let mut events = subscribe(&mut c, &s.id, 0, true).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "Tell me a long story.").await;
    // The turn is under way (the model streams for seconds): the disk fills up.
    read_until(&mut events, &mut seen, "the first partial", |e| {
        matches!(e.payload, Some(P::PartialDelta(_)))
    })
    .await;
    disk.fill();
    health_becomes(&mut health, ServingStatus::NotServing).await;
    Some(FullMidTurn {
        disk,
        daemon,
        health,
        c,
        s,
        events,
        seen,
    })
}

/// A fault longer than `store.write_retry_secs`: the waiting writes fail, the session is
/// stopped, and once the store writes again the log says why, gap-free.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disk_full_past_the_limit_stops_the_session() {
    let world = World::new(NEW).await;
    let limit = ostler_testkit::timeouts::secs(1);
    let Some(FullMidTurn {
        disk,
        daemon,
        mut health,
        mut c,
        s,
        mut events,
        mut seen,
    }) = full_mid_turn(&world, limit.as_secs().max(1)).await
    else {
        return;
    };
    // The limit passes: the daemon gives up on the turn's output and stops the CLI.
    let deadline = std::time::Instant::now() + guard();
    while !daemon.log_text().contains("stopping the session") {
        assert!(
            std::time::Instant::now() < deadline,
            "the session was never stopped: {}",
            daemon.log_text()
        );
        tokio::time::sleep(ostler_testkit::timeouts::millis(50)).await;
    }
    disk.free();
    health_becomes(&mut health, ServingStatus::Serving).await;
    read_until(&mut events, &mut seen, "the session's end", |e| {
        matches!(e.payload, Some(P::StateChanged(ref sc)) if sc.to() == pb::SessionState::Stopped)
    })
    .await;
    let log = history(&mut c, &s.id).await;
    assert_gap_free(&log, 1);
    let notice = log
        .iter()
        .find_map(|e| match &e.payload {
            Some(P::EngineNotice(n)) if n.code == "store_unwritable" => Some(n.clone()),
            _ => None,
        })
        .unwrap_or_else(|| {
            panic!(
                "no store_unwritable notice: {:#?}",
                log.iter().map(describe).collect::<Vec<_>>()
            )
        });
    assert!(notice.message.contains("full"), "{}", notice.message);
    assert!(
        log.iter()
            .any(|e| matches!(e.payload, Some(P::ProcessExited(_))))
    );
    let got = c
        .get_session(pb::GetSessionRequest {
            session_id: s.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.state(), pb::SessionState::Stopped);
}

/// SIGTERM while the store takes no writes: the daemon exits without waiting out
/// `store.write_retry_secs` (the writes it still has fail at once: nothing will come back
/// for them, and a service manager would kill a daemon that overstays its stop timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disk_full_at_shutdown_does_not_hold_the_daemon() {
    let world = World::new(NEW).await;
    let Some(FullMidTurn {
        disk, mut daemon, ..
    }) = full_mid_turn(&world, guard().as_secs() * 4).await
    else {
        return;
    };
    let status = tokio::time::timeout(guard(), daemon.terminate())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the daemon waited for the store after SIGTERM: {}",
                daemon.log_text()
            )
        });
    assert!(status.code().is_some(), "{status:?}");
    assert!(
        daemon.log_text().contains("ostler daemon stopped"),
        "{}",
        daemon.log_text()
    );
    drop(disk);
}

/// A store file the daemon may read but not write (here: the immutable attribute, which
/// holds even for root) fails the start at once, saying so; SQLite would open it read-only
/// without a word and every write would be retried for `store.write_retry_secs` (120 s)
/// while clients were told the daemon was "starting".
#[tokio::test]
async fn a_store_file_that_cannot_be_written_fails_the_start_at_once() {
    let world = World::new(NEW).await;
    let Some(_disk) = SmallDisk::mount(world.store.parent().unwrap()) else {
        return;
    };
    let mut daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let _ = create_session(&mut c, &world.work, "before").await;
    daemon.terminate().await;
    let chattr = |flag: &str, file: &Path| {
        Command::new("chattr")
            .arg(flag)
            .arg(file)
            .status()
            .is_ok_and(|s| s.success())
    };
    // A start that must fail at once, saying `why`.
    let refused = async |why: &str| {
        let (mut cmd, _ready) = world.serve_command(&[]);
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", &world.home);
        let started = std::time::Instant::now();
        let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
            .await
            .unwrap();
        let elapsed = started.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(why), "the reason is named: {stderr}");
        assert!(
            elapsed < ostler_testkit::timeouts::secs(30),
            "refused at once, not after the write retries: {elapsed:?}"
        );
    };
    assert!(chattr("+i", &world.store), "chattr +i on a tmpfs (root)");
    refused("can be read but not written").await;
    assert!(chattr("-i", &world.store));

    // The WAL a killed daemon left behind, not writable: the same.
    let mut daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let _ = create_session(&mut c, &world.work, "before the kill").await;
    daemon.kill9();
    let wal = world.store.with_extension("db-wal");
    assert!(wal.exists(), "a killed daemon leaves its WAL");
    assert!(chattr("+i", &wal));
    refused("-wal file").await;
    assert!(chattr("-i", &wal));
}
