//! Shared set-up for the `ostler` binary's end-to-end tests: a live daemon (`ostler serve`,
//! the real binary) over a temp data dir, driving the real Claude Code CLI (pinned release,
//! installed by the test kit) against the in-process fake model server.
//!
//! The daemon is started with `--log-format json` and `--listen 127.0.0.1:0`; its bound
//! address is taken from its "ostler daemon ready" log line (read as it is written, no
//! polling). Dropping a [`Daemon`] sends SIGTERM and waits for a clean exit (SIGKILL after a
//! guard time).
#![allow(dead_code)]
#![allow(clippy::disallowed_methods)] // tests spawn the ostler binary (daemon and client)

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use ostler_testkit::{FakeModelServer, Scenario};

/// The binary under test.
pub const OSTLER: &str = env!("CARGO_BIN_EXE_ostler");

/// The release the end-to-end tests run.
pub const RELEASE: &str = "2.1.330";

/// Generous guard against a wedged test; never used to wait for something to happen.
pub const GUARD: Duration = Duration::from_secs(120);

/// The scenario the client tests share (also at tests/fixtures/touch.toml, used by the
/// example runners).
pub fn scenario_text() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/touch.toml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The pinned CLI release: from `$OSTLER_CLAUDE_CACHE`, the machine's pre-installed
/// `/tmp/cc`, or the test kit's cache (installed with npm when missing) — the same order as
/// the daemon tests' harness (tests/daemon_harness).
pub fn claude_binary() -> PathBuf {
    use ostler_testkit::releases::{binary_path, default_cache_dir, ensure};
    let candidates: Vec<PathBuf> = match std::env::var_os("OSTLER_CLAUDE_CACHE") {
        Some(v) if !v.is_empty() => vec![PathBuf::from(v)],
        _ => vec![PathBuf::from("/tmp/cc"), default_cache_dir()],
    };
    for c in &candidates {
        if binary_path(RELEASE, c).exists()
            && let Ok(p) = ensure(RELEASE, c)
        {
            return p;
        }
    }
    let last = candidates.last().cloned().unwrap_or_else(default_cache_dir);
    ensure(RELEASE, &last).unwrap_or_else(|e| panic!("installing Claude Code {RELEASE}: {e}"))
}

/// A running daemon plus its fake model server.
pub struct Daemon {
    /// Runs the fake model server.
    pub rt: tokio::runtime::Runtime,
    pub fake: FakeModelServer,
    child: Option<Child>,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    pub dir: tempfile::TempDir,
    /// The daemon's (and the CLI's) HOME.
    pub home: PathBuf,
    /// A directory for sessions to run in.
    pub work: PathBuf,
    /// The (empty) config file both the daemon and the clients get.
    pub config: PathBuf,
    /// The daemon's log lines.
    pub log: Arc<Mutex<Vec<String>>>,
    claude: PathBuf,
}

struct Launch<'a> {
    dir: &'a Path,
    home: &'a Path,
    config: &'a Path,
    claude: &'a Path,
    fake_url: &'a str,
    listen: &'a str,
    extra: &'a [&'a str],
    env: &'a [(&'a str, &'a str)],
}

/// Spawn `ostler serve` and wait for its ready line; (child, address, log).
fn launch(l: &Launch<'_>) -> (Child, String, Arc<Mutex<Vec<String>>>) {
    let mut cmd = Command::new(OSTLER);
    cmd.arg("serve")
        .arg("--config")
        .arg(l.config)
        .args(["--listen", l.listen, "--log-format", "json", "--no-probe"])
        .arg("--store")
        .arg(l.dir.join("ostler.db"))
        .arg("--claude")
        .arg(l.claude)
        .args(l.extra)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", l.home)
        .env("ANTHROPIC_BASE_URL", l.fake_url)
        .env("ANTHROPIC_API_KEY", "test-key")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("RUST_LOG", "info")
        .envs(l.env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn ostler serve");
    let stderr = child.stderr.take().expect("daemon stderr");
    let log = Arc::new(Mutex::new(Vec::new()));
    let (ready_tx, ready_rx) = mpsc::channel::<String>();
    {
        let log = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if line.contains("ostler daemon ready")
                    && let Some(addr) = listener_of(&line)
                {
                    let _ = ready_tx.send(addr);
                }
                log.lock().unwrap_or_else(|p| p.into_inner()).push(line);
            }
        });
    }
    match ready_rx.recv_timeout(GUARD) {
        Ok(a) => (child, a, log),
        Err(_) => {
            let _ = child.kill();
            let lines = log.lock().unwrap_or_else(|p| p.into_inner()).join("\n");
            panic!("the daemon did not become ready:\n{lines}");
        }
    }
}

impl Daemon {
    /// Start a daemon whose CLI talks to a fake model server playing `scenario_toml`.
    pub fn start(scenario_toml: &str) -> Self {
        Self::start_with(scenario_toml, &[])
    }

    /// Same, with extra `ostler serve` arguments.
    pub fn start_with(scenario_toml: &str, extra: &[&str]) -> Self {
        let claude = claude_binary();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let scenario = Scenario::from_toml("client_tests", scenario_toml).expect("scenario");
        let fake = rt
            .block_on(FakeModelServer::start(scenario))
            .expect("fake model server");
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().join("home");
        let work = dir.path().join("work");
        std::fs::create_dir_all(&home).expect("home");
        std::fs::create_dir_all(&work).expect("work");
        let work = std::fs::canonicalize(&work).expect("canonical work dir");
        let config = dir.path().join("config.toml");
        std::fs::write(&config, "# empty: the tests pass everything as flags\n").expect("config");
        let (child, addr, log) = launch(&Launch {
            dir: dir.path(),
            home: &home,
            config: &config,
            claude: &claude,
            fake_url: &fake.url(),
            listen: "127.0.0.1:0",
            extra,
            env: &[],
        });
        Self {
            rt,
            fake,
            child: Some(child),
            addr,
            dir,
            home,
            work,
            config,
            log,
            claude,
        }
    }

    /// SIGKILL the daemon (no clean-up: its sessions were live when it died).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start the daemon again on the same address and store, with extra environment
    /// (e.g. `OSTLER_SESSIONS__RESPAWN_ON_START=true`).
    pub fn restart(&mut self, env: &[(&str, &str)]) {
        assert!(self.child.is_none(), "stop the daemon first");
        let (child, addr, log) = launch(&Launch {
            dir: self.dir.path(),
            home: &self.home,
            config: &self.config,
            claude: &self.claude,
            fake_url: &self.fake.url(),
            listen: &self.addr,
            extra: &[],
            env,
        });
        assert_eq!(
            addr, self.addr,
            "the restarted daemon listens where the old one did"
        );
        self.child = Some(child);
        self.log = log;
    }

    /// The environment a client command gets: the daemon's address and config, a
    /// private HOME, no colour unless a test asks for it.
    pub fn client_env(&self) -> Vec<(String, String)> {
        vec![
            ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
            ("HOME".into(), self.home.display().to_string()),
            ("OSTLER_ADDR".into(), self.addr.clone()),
            ("OSTLER_CONFIG".into(), self.config.display().to_string()),
            ("USER".into(), "tester".into()),
        ]
    }

    /// `ostler ARGS` without a terminal, stdin from `stdin`.
    pub fn client(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new(OSTLER);
        cmd.args(args)
            .env_clear()
            .envs(self.client_env())
            .env("NO_COLOR", "1")
            .current_dir(&self.work)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        let mut child = cmd.spawn().expect("spawn ostler client");
        if let Some(text) = stdin {
            use std::io::Write as _;
            let mut w = child.stdin.take().expect("stdin");
            w.write_all(text.as_bytes()).expect("write stdin");
        }
        wait_output(child)
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
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        if rx.recv_timeout(Duration::from_secs(30)).is_err() {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Wait for a child with the guard; kill it when the guard passes.
pub fn wait_output(child: Child) -> Output {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(GUARD) {
        Ok(out) => out.expect("client output"),
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            panic!("the client did not finish within {GUARD:?}");
        }
    }
}

/// The `listener` field of a JSON log line (`tcp://ADDR`), as `ADDR`.
fn listener_of(line: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let l = v
        .get("fields")
        .and_then(|f| f.get("listener"))
        .or_else(|| v.get("listener"))?
        .as_str()?;
    Some(l.strip_prefix("tcp://")?.to_owned())
}

/// Parse JSON lines (panics with the text on a bad line).
pub fn json_lines(stdout: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// Text of an output for assertion messages.
pub fn describe(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A program running in a pseudo-terminal, with its output collected as it arrives.
pub struct Pty {
    pub child: Box<dyn portable_pty::Child + Send + Sync>,
    writer: Box<dyn std::io::Write + Send>,
    chunks: mpsc::Receiver<Vec<u8>>,
    /// Everything read so far.
    pub seen: String,
    _master: Box<dyn portable_pty::MasterPty + Send>,
}

impl Pty {
    /// Spawn `ostler ARGS` in a new pseudo-terminal (its controlling terminal).
    pub fn spawn(d: &Daemon, args: &[&str], colour: bool) -> Self {
        use portable_pty::{CommandBuilder, PtySize, native_pty_system};
        let pair = native_pty_system()
            .openpty(PtySize {
                rows: 50,
                cols: 200,
                pixel_width: 0,
                pixel_height: 0,
            })
            .expect("openpty");
        let mut cmd = CommandBuilder::new(OSTLER);
        cmd.args(args);
        cmd.env_clear();
        for (k, v) in d.client_env() {
            cmd.env(k, v);
        }
        cmd.env("TERM", "xterm-256color");
        if !colour {
            cmd.env("NO_COLOR", "1");
        }
        cmd.cwd(&d.work);
        let child = pair.slave.spawn_command(cmd).expect("spawn in pty");
        drop(pair.slave);
        let mut reader = pair.master.try_clone_reader().expect("pty reader");
        let writer = pair.master.take_writer().expect("pty writer");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx.send(buf[..n].to_vec()).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        Self {
            child,
            writer,
            chunks: rx,
            seen: String::new(),
            _master: pair.master,
        }
    }

    /// Read until `text` has appeared; panics after the guard time with everything seen.
    pub fn expect(&mut self, text: &str) {
        self.expect_n(text, 1);
    }

    /// Read until `text` has appeared `n` times.
    pub fn expect_n(&mut self, text: &str, n: usize) {
        let deadline = std::time::Instant::now() + GUARD;
        loop {
            if self.seen.matches(text).count() >= n {
                return;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.chunks.recv_timeout(left) {
                Ok(bytes) => self.seen.push_str(&String::from_utf8_lossy(&bytes)),
                Err(_) => panic!("waited for {text:?}; the terminal showed:\n{}", self.seen),
            }
        }
    }

    /// Type bytes.
    pub fn type_text(&mut self, text: &str) {
        self.writer
            .write_all(text.as_bytes())
            .expect("write to pty");
        self.writer.flush().expect("flush pty");
    }

    /// Wait for the exit code, collecting the remaining output.
    pub fn wait(&mut self) -> u32 {
        let code = self.child.wait().expect("wait for pty child").exit_code();
        // Drain what is left (the reader ends when the terminal closes).
        while let Ok(bytes) = self.chunks.recv_timeout(Duration::from_millis(500)) {
            self.seen.push_str(&String::from_utf8_lossy(&bytes));
        }
        code
    }
}

use std::io::Read as _;
