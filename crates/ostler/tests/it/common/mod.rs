//! The one harness of the `ostler` binary's end-to-end tests: the real `ostler serve` as a
//! child process (so it can be SIGKILLed and restarted on the same store), the real Claude
//! Code CLI (a pinned release, found or installed through the test kit's cache), the
//! in-process fake model server, a temp directory per test.
//!
//! - here: [`World`] (what outlives one daemon process), [`Daemon`] (one `ostler serve`);
//! - [`grpc`]: the daemon tests' script and gRPC helpers;
//! - [`client`]: the client-command tests' [`client::Served`] and pseudo-terminal;
//! - [`metrics`]: scraping the metrics endpoint.
//!
//! Readiness is an event: the daemon's "ostler daemon ready" log line, read from its stderr
//! as it is written; the address comes from `--ready-file`. Every wait is guarded by
//! [`guard()`] (the test kit's scaled timeout).
#![allow(clippy::disallowed_methods)] // tests spawn the ostler binary under test (and kill(1))

pub mod client;
pub mod grpc;
pub mod metrics;

use std::io::{BufRead as _, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use ostler_testkit::{FakeModelServer, Scenario};

/// The binary under test.
pub const OSTLER: &str = env!("CARGO_BIN_EXE_ostler");

/// The pinned releases the tests run against.
pub const OLD: &str = "1.0.128";
pub const NEW: &str = "2.1.332";

/// Guard against a wedged test (the test kit's scaled guard); never used to wait for
/// something to happen.
pub fn guard() -> Duration {
    ostler_testkit::timeouts::guard()
}

/// Waits until the fake model got a request answered by its rule named `rule`.
pub async fn await_model_request(fake: &FakeModelServer, rule: &str) {
    let deadline = tokio::time::Instant::now() + guard();
    loop {
        let log = fake.requests();
        if log.iter().any(|r| r.rule_name.as_deref() == Some(rule)) {
            return;
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        assert!(!left.is_zero(), "no model request for rule {rule:?}");
        fake.wait_for_requests(log.len() + 1, left).await;
    }
}

/// The `claude` binary of a pinned release, from the test kit's cache (installed with npm
/// when missing).
pub fn claude_binary(version: &str) -> PathBuf {
    ostler_testkit::releases::installed(version)
        .unwrap_or_else(|e| panic!("installing Claude Code {version}: {e}"))
}

/// `ostler-fake-claude` (the test kit's fast fake CLI, release 2.1.330 shapes), next to the
/// binary under test: built by any workspace build (`cargo xtask test`); built here when a
/// run of `-p ostler` alone left it out. Set it as [`World::claude`] to run sessions on it.
pub async fn fake_claude_binary() -> PathBuf {
    testkit_binary("ostler-fake-claude").await
}

/// A binary of the test kit (`ostler-fake-claude`, `ostler-test-mcp`), next to the binary
/// under test; built here when a run of `-p ostler` alone left it out.
pub async fn testkit_binary(name: &str) -> PathBuf {
    let path = std::path::Path::new(OSTLER).with_file_name(name);
    if !path.is_file() {
        let built = tokio::time::timeout(
            guard(),
            tokio::process::Command::new(env!("CARGO"))
                .args(["build", "-p", "ostler-testkit", "--bin", name])
                .current_dir(ostler_testkit::workspace_root())
                .status(),
        )
        .await
        .unwrap_or_else(|_| panic!("building {name} timed out"))
        .expect("running cargo build");
        assert!(
            built.success(),
            "cargo build -p ostler-testkit --bin {name} failed"
        );
    }
    assert!(path.is_file(), "{} missing after the build", path.display());
    path
}

/// Everything that outlives one daemon process: directories, the store, the fake model.
pub struct World {
    pub claude: PathBuf,
    /// The pinned release the world was made for, and its binary (what [`World::claude`]
    /// is until a test sets another): the key of its [`DiscoverySeed`].
    release: (String, PathBuf),
    pub fake: FakeModelServer,
    pub dir: tempfile::TempDir,
    /// The daemon's (and the CLI's, and the clients') HOME.
    pub home: PathBuf,
    /// A directory for sessions to run in (the daemon's `--allowed-root`).
    pub work: PathBuf,
    pub store: PathBuf,
    /// The (empty) config file the daemon and the clients get.
    pub config: PathBuf,
}

impl World {
    /// Whether any request to the fake model carried `text` in its messages (as JSON text).
    pub fn model_saw(&self, text: &str) -> bool {
        self.fake.requests().iter().any(|r| {
            r.body
                .as_ref()
                .is_some_and(|b| b["messages"].to_string().contains(text))
        })
    }

    /// A world whose fake model plays the daemon tests' [`grpc::SCENARIO`].
    pub async fn new(release: &str) -> Self {
        Self::with_scenario(release, grpc::SCENARIO).await
    }

    /// A world whose fake model plays `scenario_toml`.
    pub async fn with_scenario(release: &str, scenario_toml: &str) -> Self {
        let claude = tokio::task::spawn_blocking({
            let r = release.to_owned();
            move || claude_binary(&r)
        })
        .await
        .expect("installer task");
        let scenario = Scenario::from_toml("daemon_tests", scenario_toml).expect("scenario");
        let fake = FakeModelServer::start(scenario)
            .await
            .expect("fake model server");
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().join("home");
        let work = dir.path().join("work");
        std::fs::create_dir_all(&home).expect("home");
        std::fs::create_dir_all(&work).expect("work");
        let work = std::fs::canonicalize(&work).expect("canonical work dir");
        let store = dir.path().join("data").join("ostler.db");
        let config = dir.path().join("config.toml");
        std::fs::write(&config, "# empty: the tests pass everything as flags\n").expect("config");
        Self {
            release: (release.to_owned(), claude.clone()),
            claude,
            fake,
            dir,
            home,
            work,
            store,
            config,
        }
    }

    /// The environment a client command (`ostler send`, ...) of the daemon at `addr` gets:
    /// the daemon's address and config, this world's HOME, a user name.
    pub fn client_env(&self, addr: &str) -> Vec<(String, String)> {
        vec![
            ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
            ("HOME".into(), self.home.display().to_string()),
            ("OSTLER_ADDR".into(), addr.to_owned()),
            ("OSTLER_CONFIG".into(), self.config.display().to_string()),
            ("USER".into(), "tester".into()),
        ]
    }

    /// `ostler serve` on this world's store (listening on `127.0.0.1:0` unless `extra` says
    /// `--listen`), with its `--ready-file`.
    pub fn serve_command(&self, extra: &[&str]) -> (Command, PathBuf) {
        let ready = self.dir.path().join(format!(
            "ready-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos()
        ));
        let mut cmd = Command::new(OSTLER);
        cmd.arg("serve")
            .arg("--config")
            .arg(&self.config)
            .args(if extra.contains(&"--listen") {
                &["--no-probe"][..]
            } else {
                &["--listen", "127.0.0.1:0", "--no-probe"][..]
            })
            .arg("--ready-file")
            .arg(&ready)
            .arg("--store")
            .arg(&self.store)
            .arg("--claude")
            .arg(&self.claude)
            .arg("--allowed-root")
            .arg(&self.work)
            .args(extra);
        if let Ok(f) = std::env::var("OSTLER_TEST_LOG_FORMAT") {
            cmd.args(["--log-format", &f]);
        }
        (cmd, ready)
    }

    /// Start a daemon on this world's store and wait until it is ready.
    pub async fn daemon(&self, extra: &[&str]) -> Daemon {
        self.daemon_with_env(extra, &[]).await
    }

    /// [`World::daemon`] with extra environment (e.g. `OSTLER_*` configuration).
    pub async fn daemon_with_env(&self, extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        self.start_daemon(extra, env).ready().await
    }

    /// Starts a daemon on this world's store (see [`World::serve_command`]) without waiting
    /// for it to be ready.
    pub fn start_daemon(&self, extra: &[&str], env: &[(&str, &str)]) -> StartingDaemon {
        let (cmd, ready) = self.serve_command(extra);
        self.start(cmd, ready, env)
    }

    /// Starts `cmd` (an `ostler serve` command line with `--ready-file ready`) in this
    /// world's environment plus `env`, without waiting for it to be ready.
    pub fn start(&self, mut cmd: Command, ready: PathBuf, env: &[(&str, &str)]) -> StartingDaemon {
        self.daemon_env(&mut cmd);
        let seed = self.discovery_seed();
        if let Some(seed) = &seed {
            seed.plant();
        }
        cmd.envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn ostler serve");
        let (log, lines) = collect_stderr(&mut child);
        StartingDaemon {
            child: Some(child),
            log,
            lines,
            ready,
            seed,
        }
    }

    /// [`World::daemon`] for tests without an async runtime, with extra environment.
    pub fn daemon_blocking(&self, extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        self.start_daemon(extra, env).ready_blocking()
    }

    /// The [`DiscoverySeed`] of this world's release, while the daemon runs its binary.
    fn discovery_seed(&self) -> Option<DiscoverySeed> {
        let (release, binary) = &self.release;
        (self.claude == *binary).then(|| DiscoverySeed {
            cache: self
                .store
                .with_file_name(ostler_supervisor::discovery_cache::FILE_NAME),
            seed: ostler_testkit::releases::default_cache_dir()
                .join("discovery-seeds")
                .join(format!("{release}.json")),
        })
    }

    /// The daemon's environment: nothing inherited but PATH and `NODE_COMPILE_CACHE` (which
    /// `cargo xtask test` sets, so the node-based releases the daemon starts reuse the code
    /// Node compiled in earlier starts: about a third less CPU per start); the fake model's
    /// URL.
    fn daemon_env(&self, cmd: &mut Command) {
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", &self.home)
            .env("ANTHROPIC_BASE_URL", self.fake.url())
            .env("ANTHROPIC_API_KEY", "test-key")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("RUST_LOG", "info,ostler_engine=debug");
        if let Some(cache) = std::env::var_os("NODE_COMPILE_CACHE") {
            cmd.env("NODE_COMPILE_CACHE", cache);
        }
    }
}

/// The first address listed with `scheme` (`tcp`, `http`, ...) in a ready file or a log
/// line (`listeners=tcp://ADDR http://ADDR/metrics`, in text or JSON), without the scheme.
pub fn listed<'a>(text: &'a str, scheme: &str) -> Option<&'a str> {
    let prefix = format!("{scheme}://");
    text.split(|c: char| c.is_whitespace() || matches!(c, '"' | ',' | '='))
        .find_map(|w| w.strip_prefix(prefix.as_str()))
}

/// The next log line containing `needle`, if one arrives within the guard.
fn wait_line(lines: &mpsc::Receiver<String>, needle: &str) -> Option<String> {
    let deadline = std::time::Instant::now() + guard();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match lines.recv_timeout(left) {
            Ok(l) if l.contains(needle) => return Some(l),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
}

/// An `ostler serve` started and not waited for ([`World::start_daemon`]): its log lines
/// as they are written. Dropped before [`StartingDaemon::ready`], it SIGKILLs the daemon.
pub struct StartingDaemon {
    child: Option<Child>,
    log: Arc<Mutex<Vec<String>>>,
    lines: mpsc::Receiver<String>,
    ready: PathBuf,
    seed: Option<DiscoverySeed>,
}

/// What a daemon's discovery measured on a pinned release (its discovery cache file, as
/// the daemon wrote it), shared by the tests' daemons on that release: a world's first
/// daemon starts with it next to its store, as a restarted daemon would, instead of running
/// `claude --version` (~1.8 s of CPU on a node-based release, ~45 daemons of the suite).
/// A daemon that measured anyway (no seed yet, or one another ostler wrote) leaves its
/// file as the seed. The tests of discovery and its cache run a binary of their own (a
/// wrapper, a fake), which has no seed.
struct DiscoverySeed {
    /// The daemon's cache file, next to its store.
    cache: PathBuf,
    /// The shared copy, in the test kit's release cache.
    seed: PathBuf,
}

impl DiscoverySeed {
    /// Before a world's first start: the seed, when there is one, becomes the daemon's cache
    /// (the data directory made as the daemon makes it, owner only).
    fn plant(&self) {
        if self.cache.exists() {
            return;
        }
        let Ok(bytes) = std::fs::read(&self.seed) else {
            return;
        };
        use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
        let dir = self.cache.parent().expect("the store's directory");
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .expect("the store's directory");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&self.cache)
            .expect("the discovery cache");
        std::io::Write::write_all(&mut f, &bytes).expect("the discovery cache");
    }

    /// After a start whose discovery ran the binary: its cache becomes the seed (replaced
    /// whole: written beside it, then renamed over it, as tests run in parallel).
    fn keep(&self) {
        let Ok(bytes) = std::fs::read(&self.cache) else {
            return;
        };
        let dir = self.seed.parent().expect("the seeds' directory");
        let _ = std::fs::create_dir_all(dir);
        let tmp = dir.join(format!(
            ".{}.{}",
            std::process::id(),
            self.seed.file_name().unwrap_or_default().to_string_lossy()
        ));
        if std::fs::write(&tmp, bytes).is_ok() && std::fs::rename(&tmp, &self.seed).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

impl StartingDaemon {
    /// The next log line containing `needle`; panics with the log when none comes within
    /// the guard. Blocks its thread: call it from a multi-threaded test runtime.
    pub fn line(&self, needle: &str) -> String {
        wait_line(&self.lines, needle).unwrap_or_else(|| {
            panic!(
                "no log line with {needle:?}:\n{}",
                self.log
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .join("\n")
            )
        })
    }

    /// Waits for a daemon that must not start to end by itself (within the guard): its
    /// exit code and its whole log.
    pub fn exit_blocking(mut self) -> (Option<i32>, String) {
        let mut child = self.child.take().expect("a started daemon");
        let deadline = std::time::Instant::now() + guard();
        // Every line until stderr closes, which the daemon's exit does.
        let mut log = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => log.push(l),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("the daemon did not exit:\n{}", log.join("\n"));
                }
            }
        }
        let status = child.wait().expect("the daemon's exit status");
        (status.code(), log.join("\n"))
    }

    /// Waits until the daemon is ready: its "ostler daemon ready" log line, then its
    /// address from the ready file. Panics with the log when it does not come within the
    /// guard.
    pub async fn ready(self) -> Daemon {
        tokio::task::spawn_blocking(move || self.ready_blocking())
            .await
            .expect("ready waiter")
    }

    /// [`StartingDaemon::ready`] on the caller's thread.
    pub fn ready_blocking(mut self) -> Daemon {
        self.line("ostler daemon ready");
        if let Some(seed) = &self.seed {
            let measured = self
                .log
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .any(|l| l.contains("Claude Code discovery measured"));
            if measured {
                seed.keep();
            }
        }
        let text =
            std::fs::read_to_string(&self.ready).expect("ready file written before the log line");
        let addr = text
            .lines()
            .find_map(|l| l.strip_prefix("tcp://"))
            .expect("a tcp listener in the ready file")
            .parse()
            .expect("listener address");
        Daemon {
            child: self.child.take(),
            addr,
            log: self.log.clone(),
        }
    }
}

impl Drop for StartingDaemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A running `ostler serve`. Dropping it SIGKILLs the daemon (its CLI processes die with it:
/// parent-death signal).
pub struct Daemon {
    child: Option<Child>,
    pub addr: SocketAddr,
    pub log: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    /// Start `cmd` (an `ostler serve` command line) in `world`'s environment and wait until it
    /// is ready; `ready` is the command's `--ready-file`.
    pub async fn spawn(cmd: Command, world: &World, ready: PathBuf, env: &[(&str, &str)]) -> Self {
        world.start(cmd, ready, env).ready().await
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or_default()
    }

    /// Whether this handle still owns a daemon process (not killed or terminated).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILL, no chance to clean up.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for the exit.
    pub async fn terminate(&mut self) -> ExitStatus {
        self.signal_and_wait("-TERM").await
    }

    /// `kill SIGNAL` (`-TERM`, `-HUP`, ...) and wait for the exit.
    pub async fn signal_and_wait(&mut self, signal: &str) -> ExitStatus {
        let mut c = self.child.take().expect("running");
        let st = Command::new("kill")
            .args([signal, &c.id().to_string()])
            .status()
            .expect("kill");
        assert!(st.success());
        tokio::task::spawn_blocking(move || c.wait().expect("wait for the daemon"))
            .await
            .expect("waiter")
    }

    /// The daemon's log so far.
    pub fn log_text(&self) -> String {
        self.log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .join("\n")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
        // Debugging aid: OSTLER_TEST_DUMP_LOG=1 prints the daemon's log.
        if std::env::var_os("OSTLER_TEST_DUMP_LOG").is_some() {
            eprintln!("--- daemon log\n{}", self.log_text());
        }
    }
}

/// Forward a child's stderr lines into a shared log and a channel.
pub fn collect_stderr(child: &mut Child) -> (Arc<Mutex<Vec<String>>>, mpsc::Receiver<String>) {
    let stderr = child.stderr.take().expect("piped stderr");
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    let l2 = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line.clone());
            l2.lock().unwrap_or_else(|p| p.into_inner()).push(line);
        }
    });
    (log, rx)
}

/// `ostler ARGS` as a client of the daemon at `addr`, with `world`'s HOME and config (no
/// terminal, no colour).
pub fn client_command(world: &World, addr: &str, args: &[String]) -> Command {
    let mut cmd = Command::new(OSTLER);
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", &world.home)
        .env("OSTLER_ADDR", addr)
        .env("OSTLER_CONFIG", &world.config)
        .env("USER", "tester");
    cmd
}

/// Wait for a child with the guard; kill it when the guard passes.
pub fn wait_output(child: Child) -> Output {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let guard = guard();
    match rx.recv_timeout(guard) {
        Ok(out) => out.expect("child output"),
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            panic!("the child did not finish within {guard:?}");
        }
    }
}

/// The command line of process `pid` (its arguments, empty ones dropped). A session may
/// be reported idle as soon as its CLI is spawned (a release without `initialize`), when
/// the process may still be inside its exec or the second exec of the script's `#!` line
/// (`env` executing `node`): the command line reads empty for that moment. No event marks
/// the end of an exec, so an empty read is taken again (up to the guard).
pub fn cmdline(pid: u32) -> Vec<String> {
    let deadline = std::time::Instant::now() + guard();
    loop {
        let raw = std::fs::read(format!("/proc/{pid}/cmdline"))
            .unwrap_or_else(|e| panic!("/proc/{pid}/cmdline: {e}"));
        if !raw.is_empty() {
            return raw
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid}'s command line stayed empty (not a live process?)"
        );
        std::thread::yield_now();
    }
}

/// Processes whose parent is `ppid` (a daemon's CLI processes), from `/proc`.
pub fn children(ppid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        if after.split_whitespace().nth(1).and_then(|p| p.parse().ok()) == Some(ppid) {
            out.push(pid);
        }
    }
    out
}
