//! Helpers for the client-command tests (`tests/client_*.rs`): a daemon served from a plain
//! (non-async) test, running the `ostler` client without and within a pseudo-terminal.

use std::io::Read as _;
use std::ops::Deref;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;

use super::{Daemon, NEW, OSTLER, World, guard, wait_output};

/// The scenario the client tests share (also at tests/fixtures/touch.toml, used by the
/// example runners).
pub fn scenario_text() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/touch.toml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A daemon and its world for a test without an async runtime of its own (the fake model
/// server runs on the runtime kept here). Derefs to the [`World`].
pub struct Served {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    // Field order is drop order: the daemon goes first, the runtime last.
    daemon: Daemon,
    world: World,
    _rt: tokio::runtime::Runtime,
}

impl Deref for Served {
    type Target = World;
    fn deref(&self) -> &World {
        &self.world
    }
}

impl Served {
    /// Start a daemon whose CLI talks to a fake model server playing `scenario_toml`.
    pub fn start(scenario_toml: &str) -> Self {
        Self::start_with(scenario_toml, &[])
    }

    /// Same, with extra `ostler serve` arguments.
    pub fn start_with(scenario_toml: &str, extra: &[&str]) -> Self {
        Self::start_on(NEW, scenario_toml, extra)
    }

    /// Same, with the CLI of `release`.
    pub fn start_on(release: &str, scenario_toml: &str, extra: &[&str]) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let world = rt.block_on(World::with_scenario(release, scenario_toml));
        let daemon = world.daemon_blocking(extra, &[]);
        Self {
            addr: daemon.addr.to_string(),
            daemon,
            world,
            _rt: rt,
        }
    }

    /// SIGKILL the daemon (no clean-up: its sessions were live when it died).
    pub fn kill9(&mut self) {
        self.daemon.kill9();
    }

    /// Start the daemon again on the same address and store, with extra environment
    /// (e.g. `OSTLER_SESSIONS__RESPAWN_ON_START=true`).
    pub fn restart(&mut self, env: &[(&str, &str)]) {
        assert!(!self.daemon.is_running(), "stop the daemon first");
        let listen = self.addr.clone();
        self.daemon = self.world.daemon_blocking(&["--listen", &listen], env);
        assert_eq!(
            self.daemon.addr.to_string(),
            self.addr,
            "the restarted daemon listens where the old one did"
        );
    }

    /// The daemon's log so far.
    pub fn log_text(&self) -> String {
        self.daemon.log_text()
    }

    /// The environment a client command gets: the daemon's address and config, a
    /// private HOME, no colour unless a test asks for it.
    pub fn client_env(&self) -> Vec<(String, String)> {
        self.world.client_env(&self.addr)
    }

    /// `ostler ARGS` without a terminal, stdin from `stdin`.
    /// Runs `ostler ARGS`, asserts exit code 0 and returns its JSON lines.
    pub fn ok_json(&self, args: &[&str]) -> Vec<serde_json::Value> {
        let out = self.client(args, None);
        assert_eq!(
            out.status.code(),
            Some(0),
            "ostler {args:?}: {}",
            describe(&out)
        );
        json_lines(&out.stdout)
    }

    /// Starts `ostler ARGS` in the background (the client environment, in the work
    /// directory, no stdin, stdout and stderr piped).
    pub fn spawn_client(&self, args: &[&str]) -> std::process::Child {
        Command::new(OSTLER)
            .args(args)
            .env_clear()
            .envs(self.client_env())
            .current_dir(&self.work)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn ostler {args:?}: {e}"))
    }

    /// Blocks until the fake model got a request answered by its rule named `rule`.
    pub fn await_model_request(&self, rule: &str) {
        self._rt
            .block_on(super::await_model_request(&self.fake, rule));
    }

    /// Whether any request to the fake model carried `text` in its messages.
    pub fn model_saw(&self, text: &str) -> bool {
        self.fake.requests().iter().any(|r| {
            r.body
                .as_ref()
                .is_some_and(|b| b["messages"].to_string().contains(text))
        })
    }

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
    pub fn spawn(d: &Served, args: &[&str], colour: bool) -> Self {
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
        let deadline = std::time::Instant::now() + guard();
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

    /// Read until one of `texts` has appeared (after what was seen so far): its index.
    pub fn expect_any(&mut self, texts: &[&str]) -> usize {
        let from = self.seen.len();
        let deadline = std::time::Instant::now() + guard();
        loop {
            let fresh = &self.seen[from..];
            if let Some((i, _)) = texts
                .iter()
                .enumerate()
                .filter_map(|(i, t)| fresh.find(t).map(|at| (i, at)))
                .min_by_key(|&(_, at)| at)
            {
                return i;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.chunks.recv_timeout(left) {
                Ok(bytes) => self.seen.push_str(&String::from_utf8_lossy(&bytes)),
                Err(_) => panic!(
                    "waited for one of {texts:?}; the terminal showed:\n{}",
                    self.seen
                ),
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
        while let Ok(bytes) = self
            .chunks
            .recv_timeout(ostler_testkit::timeouts::millis(500))
        {
            self.seen.push_str(&String::from_utf8_lossy(&bytes));
        }
        code
    }
}
