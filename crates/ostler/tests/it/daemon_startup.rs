//! Daemon start-up: the README's run command on a fresh machine (no config file, no
//! `--store`), one daemon per database, a daemon that answers while its store is held by
//! another process, and `[permissions]` rules from the config file.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error
#![allow(clippy::disallowed_methods)] // the test runs the daemon binary itself

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::grpc::*;
use common::metrics::*;
use common::*;
use ostler_proto::v1 as pb;
use pb::session_event::Payload as P;

/// `ostler serve --listen 127.0.0.1:0 --no-probe --ready-file READY --claude CLAUDE`.
fn serve(world: &World, ready: &Path) -> Command {
    let mut cmd = Command::new(OSTLER);
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--no-probe",
        "--ready-file",
    ])
    .arg(ready)
    .arg("--claude")
    .arg(&world.claude);
    cmd
}

#[tokio::test]
async fn serve_starts_without_a_config_file_and_uses_the_data_dir() {
    let world = World::new(NEW).await;
    let ready = world.dir.path().join("ready");
    // HOME is fresh: no ~/.config/ostler/config.toml, no data directory yet.
    let daemon = Daemon::spawn(serve(&world, &ready), &world, ready, &[]).await;
    let mut c = daemon.sessions().await;
    let _ = create_session(&mut c, &world.work, "defaults").await;
    let data = world.home.join(".local/share/ostler");
    let has_db = std::fs::read_dir(&data)
        .map(|d| {
            d.flatten()
                .any(|e| e.path().extension().is_some_and(|x| x == "db"))
        })
        .unwrap_or(false);
    assert!(has_db, "no database under {}", data.display());
    // The store is the daemon user's alone: the directories it made, the database and its
    // lock (a conversation log and the secrets sessions resume with).
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&data), 0o700, "{}", data.display());
    for f in std::fs::read_dir(&data).unwrap().flatten() {
        assert_eq!(mode(&f.path()) & 0o077, 0, "{}", f.path().display());
    }
}

/// `runtime.worker_threads` sets the async worker threads the daemon runs, and a daemon on
/// one of them serves a turn.
#[tokio::test]
async fn worker_threads_sets_the_async_workers() {
    let world = World::new(NEW).await;
    let ready = world.dir.path().join("ready");
    let daemon = Daemon::spawn(
        serve(&world, &ready),
        &world,
        ready,
        &[("OSTLER_RUNTIME__WORKER_THREADS", "1")],
    )
    .await;
    // The runtime reports its own worker count (tokio's metrics) in the start-up log;
    // thread names cannot tell workers from blocking threads.
    let started = daemon
        .log
        .lock()
        .unwrap()
        .iter()
        .find(|l| l.contains("async runtime started"))
        .cloned()
        .expect("the runtime's start-up line");
    assert!(started.contains("workers=1"), "{started}");
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "one-worker").await;
    let text = turn(&mut c, &s.id, "Say hello").await;
    assert!(!text.is_empty(), "the turn's answer reached the client");
}

/// The daemon's allocator (mimalloc) does not advise its memory into transparent huge
/// pages. Where the kernel gives huge pages only to memory advised so (`madvise`, the
/// default of Debian and Ubuntu), each 2 MiB region of mimalloc's that was touched became
/// resident whole: about half of the daemon's memory at start, and 10,000 stored sessions
/// with 100 live took 75-89 MB instead of 40 (docs/performance.md, session 63). Where the
/// kernel gives them to every process (`always`) or to none (`never`), the daemon's build
/// has no say, and nothing is checked.
#[tokio::test]
async fn the_daemons_memory_is_not_advised_into_huge_pages() {
    let mode =
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let world = World::new(NEW).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "memory").await;
    let text = turn(&mut c, &s.id, "Say hello").await;
    assert!(!text.is_empty(), "the turn's answer reached the client");
    let rollup = std::fs::read_to_string(format!("/proc/{}/smaps_rollup", daemon.pid()))
        .expect("the daemon's smaps_rollup");
    let huge: u64 = rollup
        .lines()
        .find_map(|l| l.strip_prefix("AnonHugePages:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no AnonHugePages in {rollup}"));
    if mode.contains("[madvise]") {
        assert_eq!(huge, 0, "the daemon's memory is in huge pages:\n{rollup}");
    } else {
        eprintln!("transparent huge pages {mode:?}: not the daemon's choice ({huge} kB)");
    }
}

/// An invalid RUST_LOG is not silently ignored: the daemon says so and logs with its
/// configured filter (info: the start-up lines still come).
#[tokio::test]
async fn an_invalid_rust_log_is_reported_and_the_configured_filter_used() {
    let world = World::new(NEW).await;
    let ready = world.dir.path().join("ready");
    let daemon = Daemon::spawn(
        serve(&world, &ready),
        &world,
        ready,
        &[("RUST_LOG", "ostler_engine=dbug")],
    )
    .await;
    let log = daemon.log_text();
    assert!(
        log.contains("RUST_LOG is not a valid tracing filter"),
        "no word about the bad RUST_LOG: {log}"
    );
    assert!(log.contains("ostler_engine=dbug"), "{log}");
    assert!(log.contains("async runtime started"), "{log}");
}

#[tokio::test]
async fn a_second_daemon_on_the_same_store_is_refused() {
    let world = World::new(NEW).await;
    let first = world.daemon(&[]).await;
    let out = serve(&world, &world.dir.path().join("ready-second"))
        .arg("--store")
        .arg(&world.store)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", &world.home)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "second daemon started: {stderr}");
    assert!(
        stderr.contains("in use by another ostler daemon"),
        "unclear refusal: {stderr}"
    );
    // The first daemon is unaffected.
    let mut c = first.sessions().await;
    let _ = create_session(&mut c, &world.work, "still-serving").await;
}

/// A Unix socket another daemon listens on is not taken over (replacing it cut the first
/// daemon's clients off for good, and its exit removed the second one's socket): the second
/// daemon is refused, naming the path. A stale socket (nobody listening) is replaced.
#[tokio::test]
async fn a_unix_socket_in_use_is_not_taken_over() {
    use std::os::unix::fs::MetadataExt as _;
    let world = World::new(NEW).await;
    let sock = world.dir.path().join("ostler.sock");
    let first = world
        .daemon(&["--unix-socket", sock.to_str().unwrap()])
        .await;
    let inode = std::fs::metadata(&sock).unwrap().ino();
    assert_eq!(
        std::fs::metadata(&sock).unwrap().mode() & 0o007,
        0,
        "the socket is never open to other users"
    );
    let second = |ready: &str, store: &str| {
        serve(&world, &world.dir.path().join(ready))
            .args(["--unix-socket", sock.to_str().unwrap()])
            .arg("--store")
            .arg(world.dir.path().join(store))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", &world.home)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = second("ready-second", "second.db");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "second daemon started: {stderr}");
    assert!(
        stderr.contains("is in use") && stderr.contains("ostler.sock"),
        "unclear refusal: {stderr}"
    );
    assert_eq!(
        std::fs::metadata(&sock).unwrap().ino(),
        inode,
        "the socket was replaced"
    );
    let mut c = first.sessions().await;
    let _ = create_session(&mut c, &world.work, "still-serving").await;
    // A stale socket (bound, nobody listening) is replaced.
    drop(first);
    let stale = std::os::unix::net::UnixListener::bind(&sock);
    drop(stale);
    assert!(sock.exists(), "a stale socket file to replace");
    let third = world
        .daemon(&["--unix-socket", sock.to_str().unwrap()])
        .await;
    drop(third);
}

/// While another process holds a write transaction on the store, the daemon cannot apply
/// its schema and waits (`store.busy_timeout_secs`). It listens all the while and says
/// that it is starting: health `NOT_SERVING`, other calls `UNAVAILABLE` with a message to
/// retry, metrics `ostler_ready 0`. Once the lock goes it serves on the same addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_whose_store_is_held_answers_that_it_is_starting_until_the_lock_goes() {
    use tonic_health::ServingStatus;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    let world = World::new(NEW).await;
    std::fs::create_dir_all(world.store.parent().unwrap()).unwrap();
    let holder = rusqlite::Connection::open(&world.store).unwrap();
    holder.pragma_update(None, "journal_mode", "wal").unwrap();
    holder
        .execute_batch("BEGIN EXCLUSIVE; CREATE TABLE held_by_another_process (x);")
        .unwrap();
    // The daemon waits for the lock longer than this test waits for anything.
    let busy = (guard().as_secs() * 2).max(1).to_string();
    let daemon = world.start_daemon(
        &["--metrics-listen", "127.0.0.1:0"],
        &[("OSTLER_STORE__BUSY_TIMEOUT_SECS", &busy)],
    );
    let line = daemon.line("listening while the store opens");
    let addr = listed(&line, "tcp")
        .unwrap_or_else(|| panic!("no tcp:// address in {line:?}"))
        .to_owned();
    let metrics = metrics_addr(&line).unwrap_or_else(|| panic!("no metrics address in {line:?}"));
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel.clone());
    let check = HealthCheckRequest {
        service: String::new(),
    };
    let starting = health.check(check.clone()).await.unwrap().into_inner();
    assert_eq!(starting.status, ServingStatus::NotServing as i32);
    let mut sessions = pb::session_service_client::SessionServiceClient::new(channel.clone());
    let refused = sessions
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect_err("no answers before the store is open");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("starting"), "{refused:?}");
    let m = Metrics::scrape(metrics).await;
    assert_eq!(m.get("ostler_ready", &[]), Some(0.0));
    assert_eq!(m.get("ostler_store_up", &[]), None);

    holder.execute_batch("COMMIT").unwrap();
    drop(holder);
    let daemon = daemon.ready().await;
    assert_eq!(daemon.addr.to_string(), addr, "the same listener");
    let serving = health.check(check).await.unwrap().into_inner();
    assert_eq!(serving.status, ServingStatus::Serving as i32);
    let answer = sessions
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .expect("answers once ready on the same connection");
    assert!(answer.into_inner().sessions.is_empty());
    let m = Metrics::scrape(metrics).await;
    assert_eq!(m.get("ostler_ready", &[]), Some(1.0));
    assert_eq!(m.get("ostler_store_up", &[]), Some(1.0));
}

/// `[permissions]` rules from the config file decide before any client is asked.
#[tokio::test]
async fn config_permission_rules_decide_without_asking_clients() {
    let world = World::new(NEW).await;
    let config = world.dir.path().join("rules.toml");
    std::fs::write(
        &config,
        "[permissions]\nallow = [\"Bash(touch allowed.txt)\"]\n",
    )
    .unwrap();
    let ready = world.dir.path().join("ready-rules");
    let mut cmd = serve(&world, &ready);
    cmd.arg("--config")
        .arg(&config)
        .arg("--store")
        .arg(&world.store)
        .arg("--allowed-root")
        .arg(&world.work);
    let daemon = Daemon::spawn(cmd, &world, ready, &[]).await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "rules").await;
    let mut events = subscribe(&mut c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    send(&mut c, &s.id, "Create the file allowed.txt please").await;
    read_until(&mut events, &mut seen, "turn completed", is_turn_completed).await;

    assert!(
        world.work.join("allowed.txt").exists(),
        "the tool did not run"
    );
    let resolved: Vec<&pb::PermissionResolved> = seen
        .iter()
        .filter_map(|e| match &e.payload {
            Some(P::PermissionResolved(r)) => Some(r),
            _ => None,
        })
        .collect();
    assert_eq!(
        resolved.len(),
        1,
        "{:#?}",
        seen.iter().map(describe).collect::<Vec<_>>()
    );
    assert_eq!(
        resolved[0].resolved_by,
        "rule:allow Bash(touch allowed.txt)"
    );
}

/// SIGHUP (a foreground daemon's terminal closed) shuts the daemon down as SIGTERM does:
/// exit 0 after a clean shutdown, sessions resumable, not killed on the spot.
#[tokio::test]
async fn sighup_shuts_the_daemon_down_cleanly() {
    let world = World::new(NEW).await;
    let mut daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "hup").await;
    let status = tokio::time::timeout(guard(), daemon.signal_and_wait("-HUP"))
        .await
        .expect("the daemon stopped");
    assert_eq!(status.code(), Some(0), "{status:?}: {}", daemon.log_text());
    let log = daemon.log_text();
    assert!(
        log.contains("SIGHUP: shutting down") && log.contains("ostler daemon stopped"),
        "{log}"
    );
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let got = c
        .get_session(pb::GetSessionRequest { session_id: s.id })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.state(), pb::SessionState::Resumable);
}

/// SIGTERM while the daemon is still checking its `claude` (a `--version` that hangs):
/// it stops at once with exit 0, and the check's whole process group goes with it.
#[test]
fn sigterm_during_the_claude_check_ends_the_check_too() {
    use std::io::Read as _;
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("started");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let hang = dir.path().join("claude");
    std::fs::write(
        &hang,
        format!(
            "#!/bin/sh\nsleep 1000 &\necho $! > '{}'\nwait\n",
            fifo.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&hang, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut child = Command::new(OSTLER)
        .args(["serve", "--listen", "127.0.0.1:0", "--no-probe", "--claude"])
        .arg(&hang)
        .arg("--store")
        .arg(dir.path().join("ostler.db"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Opening the FIFO waits for the script: the check is running.
    let mut pid = String::new();
    std::fs::File::open(&fifo)
        .unwrap()
        .read_to_string(&mut pid)
        .unwrap();
    let sleeper: i32 = pid.trim().parse().unwrap();
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let (tx, rx) = std::sync::mpsc::channel();
    let mut stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        let mut log = String::new();
        let _ = stderr.read_to_string(&mut log);
        let _ = tx.send((child.wait(), log));
    });
    let (status, log) = rx
        .recv_timeout(guard())
        .expect("the daemon kept checking after SIGTERM");
    assert_eq!(status.unwrap().code(), Some(0), "{log}");
    // The hung check's child was sent SIGKILL with its group: it is gone (or a zombie
    // waiting for init). Nothing signals its end to this process (not its parent), so its
    // state is read until then.
    let deadline = std::time::Instant::now() + guard();
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{sleeper}/stat")).unwrap_or_default();
        let state = stat.rsplit(')').next().unwrap_or("").trim().chars().next();
        if matches!(state, None | Some('Z' | 'X')) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still running: {stat}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The client over TLS: a self-signed certificate made as docs/operations.md says
/// (`CA:FALSE`) is accepted with `--tls-ca` naming it; one marked as a CA (what `openssl req
/// -x509` makes without that extension) is refused by rustls, and the client says why and
/// what to do instead of "start the daemon".
#[tokio::test]
async fn the_client_over_tls_says_what_is_wrong_with_a_certificate() {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let world = World::new(NEW).await;
    let dir = world.dir.path();
    let make = |name: &str, ca: bool| {
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        if ca {
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let (c, k) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c.display().to_string(), k.display().to_string())
    };
    let health = |addr: &str, ca: &str| {
        Command::new(OSTLER)
            .args(["health", "--addr", addr, "--tls-ca", ca])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", &world.home)
            .env("OSTLER_CONFIG", &world.config)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    for (name, ca) in [("end-entity", false), ("marked-ca", true)] {
        let (cert, key) = make(name, ca);
        let daemon = world
            .daemon_with_env(
                &[],
                &[("OSTLER_TLS__CERT", &cert), ("OSTLER_TLS__KEY", &key)],
            )
            .await;
        let out = health(&format!("https://{}", daemon.addr), &cert);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if ca {
            assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
            assert!(
                stderr.contains("TLS certificate was not accepted")
                    && stderr.contains("CA:FALSE")
                    && !stderr.contains("ostler serve"),
                "{stderr}"
            );
        } else {
            assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
            assert!(stdout.starts_with("SERVING"), "{stdout}");
        }
        drop(daemon);
    }
}

/// Two daemon starts on one data directory run the CLI's `--version` once: the second
/// reads `claude-discovery.json` (0600, next to the store) and says so. `--no-discovery-cache`
/// and `OSTLER_CLAUDE__DISCOVERY_CACHE=false` measure again.
#[tokio::test]
async fn a_restart_reuses_the_discovery_of_an_unchanged_cli() {
    let mut world = World::new(NEW).await;
    // The release's binary behind a script that counts its runs.
    let runs = world.dir.path().join("runs");
    let wrapper = world.dir.path().join("claude-counting");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho \"$*\" >> '{}'\nexec '{}' \"$@\"\n",
            runs.display(),
            world.claude.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    world.claude = wrapper;
    let versions = || {
        std::fs::read_to_string(&runs)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("--version"))
            .count()
    };

    let mut first = world.daemon(&[]).await;
    assert_eq!(versions(), 1);
    assert!(
        first.log_text().contains("Claude Code discovery measured"),
        "{}",
        first.log_text()
    );
    first.terminate().await;
    let cache = world.store.with_file_name("claude-discovery.json");
    let mode = std::fs::metadata(&cache).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{}", cache.display());

    let mut second = world.daemon(&[]).await;
    assert_eq!(versions(), 1, "the restart ran `claude --version` again");
    let log = second.log_text();
    assert!(log.contains("Claude Code discovery cached"), "{log}");
    assert!(
        log.contains(&format!("Claude Code {NEW} detected")),
        "{log}"
    );
    second.terminate().await;

    let mut third = world.daemon(&["--no-discovery-cache"]).await;
    assert_eq!(versions(), 2);
    third.terminate().await;
    let _fourth = world
        .daemon_with_env(&[], &[("OSTLER_CLAUDE__DISCOVERY_CACHE", "false")])
        .await;
    assert_eq!(versions(), 3);
}
