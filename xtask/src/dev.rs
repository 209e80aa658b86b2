//! `cargo xtask test` (the whole test suite, as CI runs it) and `cargo xtask daemon` (run
//! the daemon on a fresh machine).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::bench::cargo;

#[derive(clap::Args)]
pub struct TestArgs {
    /// Skip `cargo fmt --check` and `cargo clippy` (faster local iterations).
    #[arg(long)]
    pub no_lint: bool,
    /// Extra arguments passed to the test runner (e.g. a test filter).
    #[arg(last = true)]
    pub rest: Vec<String>,
}

#[derive(clap::Args)]
pub struct DaemonArgs {
    /// Claude Code release to install and drive (default: the newest pinned release).
    #[arg(long)]
    pub release: Option<String>,
    /// Run the profile-guided build (`cargo xtask pgo`: needs llvm-profdata) instead of
    /// the plain release build.
    #[arg(long)]
    pub pgo: bool,
    /// Arguments passed to `ostler serve`.
    #[arg(last = true)]
    pub rest: Vec<String>,
}

fn run(step: &str, mut cmd: Command) -> Result<()> {
    let started = Instant::now();
    eprintln!("==> {step}");
    let status = cmd
        .status()
        .with_context(|| format!("{step}: cannot start"))?;
    finished(step, status, started);
    succeeded(step, status)
}

/// Prints the end of a step: `<== step: how in N s`.
fn finished(step: &str, how: impl std::fmt::Display, started: Instant) {
    eprintln!(
        "<== {step}: {how} in {:.1}s",
        started.elapsed().as_secs_f64()
    );
}

/// A step's result from its process's exit status.
fn succeeded(step: &str, status: std::process::ExitStatus) -> Result<()> {
    if !status.success() {
        bail!("{step} failed ({status})");
    }
    Ok(())
}

/// Install every pinned release (npm, into the shared cache) so tests find them, and the
/// Node.js the tests run the node-based ones with ([`node_env`]); returns the directory of
/// that `node`. Installs run a few at a time: each is mostly waiting on the registry.
fn install_pinned() -> Result<Option<PathBuf>> {
    const AT_ONCE: usize = 4;
    let cache = ostler_testkit::releases::default_cache_dir();
    let node = std::thread::spawn({
        let cache = cache.clone();
        move || ostler_testkit::releases::test_node(&cache)
    });
    let pinned = ostler_testkit::releases::pinned()?;
    for batch in pinned.chunks(AT_ONCE) {
        std::thread::scope(|s| {
            let jobs: Vec<_> = batch
                .iter()
                .map(|r| {
                    let cache = &cache;
                    s.spawn(move || {
                        let started = Instant::now();
                        ostler_testkit::releases::ensure(&r.version, cache)
                            .map(|bin| (bin, started.elapsed()))
                            .with_context(|| format!("installing Claude Code {}", r.version))
                    })
                })
                .collect();
            for (r, job) in batch.iter().zip(jobs) {
                let (bin, took) = job.join().map_err(|_| {
                    anyhow::anyhow!("installing Claude Code {}: panicked", r.version)
                })??;
                eprintln!(
                    "    claude {} at {} ({:.1}s)",
                    r.version,
                    bin.display(),
                    took.as_secs_f64()
                );
            }
            Ok::<(), anyhow::Error>(())
        })?;
    }
    let node = node
        .join()
        .map_err(|_| anyhow::anyhow!("installing node: panicked"))?
        .context("installing node")?;
    if let Some(dir) = &node {
        eprintln!(
            "    node {} in {}",
            ostler_testkit::releases::TEST_NODE,
            dir.display()
        );
    }
    Ok(node)
}

/// What the steps that start CLI releases get in their environment: `node` (when one was
/// installed) first on `PATH`, so that the node-based releases run on it, and
/// `NODE_COMPILE_CACHE` in the release cache, which Node 22 keeps their compiled code in
/// between starts (every test starts them anew). The daemon passes both to its sessions
/// (its default environment allowlist).
fn node_env(cmd: &mut Command, node: Option<&Path>) {
    let Some(dir) = node else { return };
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![dir.to_path_buf()];
    dirs.extend(std::env::split_paths(&path));
    if let Ok(path) = std::env::join_paths(dirs) {
        cmd.env("PATH", path);
    }
    cmd.env(
        "NODE_COMPILE_CACHE",
        ostler_testkit::releases::default_cache_dir().join("node-compile-cache"),
    );
}

/// Whether `cmd arg` runs and exits 0.
pub fn have(cmd: impl AsRef<std::ffi::OsStr>, arg: &str) -> bool {
    Command::new(cmd)
        .arg(arg)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

pub fn test(a: TestArgs) -> Result<()> {
    let started = Instant::now();
    for (tool, arg) in [
        ("npm", "--version"),
        ("node", "--version"),
        ("python3", "--version"),
    ] {
        if !have(tool, arg) {
            bail!("`{tool}` is required by the test suite (real CLI releases and examples)");
        }
    }
    // The steps that mostly wait run beside others; every other step needs both cores (2
    // cores, measured: the builds keep both busy, and the tests slow down by as much as a
    // step beside them takes: `cargo clippy` beside the tests made the run longer). The
    // releases install (mostly waiting on the registry), then the newest one's probe runs
    // (its sessions mostly wait: one waits out a fixed 45 s window), beside fmt, fuzz and
    // chaos with the test build.
    eprintln!(
        "==> installing pinned Claude Code releases, then probing the newest (beside the next steps)"
    );
    let installing = Installing::start(started);

    // Clippy runs in the test build (see `features::Clippy`), fmt first.
    let clippy = if a.no_lint {
        crate::features::Clippy::off()
    } else {
        let mut fmt = cargo();
        fmt.args(["fmt", "--all", "--", "--check"]);
        run("cargo fmt --check", fmt)?;
        crate::features::Clippy::on()?
    };

    // Generated artefacts must match their sources. The contract goldens (`contracts bless
    // --check`) are checked by `ostler-protocol`'s contract tests in the test run instead
    // (drifted, missing and stale goldens alike).
    let mut generated = cargo();
    generated
        .args(["run", "--quiet", "--package", "xtask", "--"])
        .args(["compat", "generate", "--check"]);
    run("cargo xtask compat generate --check", generated)?;

    // 36 s: five targets side by side on two cores, 12 s each.
    eprintln!("==> cargo xtask fuzz --secs 36");
    let fuzz_started = Instant::now();
    crate::fuzz::fuzz(crate::fuzz::FuzzArgs {
        secs: 36,
        target: Vec::new(),
        seed: None,
    })?;
    finished("cargo xtask fuzz --secs 36", "done", fuzz_started);

    eprintln!("==> cargo xtask chaos --short");
    let chaos_started = Instant::now();
    crate::chaos::chaos(crate::chaos::ChaosArgs {
        short: true,
        seed: None,
        build_tests: Some(clippy.clone()),
    })?;
    finished("cargo xtask chaos --short", "done", chaos_started);

    let (node, probe) = installing.join()?;
    probe.join()?;

    let mut t = cargo();
    if have("cargo-nextest", "--version") {
        t.args(["nextest", "run", "--workspace", "--no-fail-fast"]);
    } else {
        t.args(["test", "--workspace", "--no-fail-fast"]);
    }
    t.args(&a.rest);
    node_env(&mut t, node.as_deref());
    clippy.apply(&mut t); // the test build's setting: its build finds everything built
    run("tests", t)?;
    eprintln!(
        "all checks passed in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The pinned releases' install ([`install_pinned`]) on a thread of its own, then the
/// newest release's probe (`cargo xtask compat probe --check --newest`: the probe's own logic
/// meets each new release here; a probe that misreads a release would put a wrong row in
/// the matrix), started beside whatever step runs when the install is done. Dropped
/// unjoined (an earlier step failed), it starts no probe and kills one it started.
struct Installing {
    thread: Option<std::thread::JoinHandle<Result<Option<PathBuf>>>>,
    probe: std::sync::Arc<std::sync::Mutex<ProbeSlot>>,
}

/// The probe [`Installing`] started, or that it must not start one.
#[derive(Default)]
struct ProbeSlot {
    cancelled: bool,
    probe: Option<Beside>,
}

impl Installing {
    fn start(started: Instant) -> Self {
        let probe = std::sync::Arc::new(std::sync::Mutex::new(ProbeSlot::default()));
        let slot = probe.clone();
        let thread = std::thread::spawn(move || {
            let node = install_pinned()?;
            eprintln!(
                "<== installing pinned Claude Code releases: done at {:.1}s",
                started.elapsed().as_secs_f64()
            );
            let mut cmd = Command::new(std::env::current_exe().context("the xtask binary's path")?);
            cmd.current_dir(crate::bench::root())
                .args(["compat", "probe", "--check", "--newest"]);
            node_env(&mut cmd, node.as_deref());
            let mut slot = slot
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !slot.cancelled {
                slot.probe = Some(Beside::start(
                    "cargo xtask compat probe --check --newest",
                    cmd,
                )?);
            }
            Ok(node)
        });
        Self {
            thread: Some(thread),
            probe,
        }
    }

    /// Waits for the install; returns the directory of the tests' `node` ([`node_env`])
    /// and the running probe.
    fn join(mut self) -> Result<(Option<PathBuf>, Beside)> {
        let node = self
            .thread
            .take()
            .context("joined twice")?
            .join()
            .map_err(|_| anyhow::anyhow!("installing pinned Claude Code releases: panicked"))??;
        let probe = self
            .probe
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .probe
            .take()
            .context("the probe did not start")?;
        Ok((node, probe))
    }
}

impl Drop for Installing {
    fn drop(&mut self) {
        let mut slot = self
            .probe
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        slot.cancelled = true;
        drop(slot.probe.take()); // kills it
    }
}

/// A step run beside the following ones: its output is kept and printed, with its
/// status, when it is joined; dropped unjoined (an earlier step failed), it is killed.
struct Beside {
    step: String,
    started: Instant,
    child: std::process::Child,
    readers: Vec<std::thread::JoinHandle<Vec<u8>>>,
}

impl Beside {
    fn start(step: &str, mut cmd: Command) -> Result<Self> {
        use std::process::Stdio;
        eprintln!("==> {step} (beside the next steps)");
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("{step}: cannot start"))?;
        let readers = [
            child.stdout.take().map(drain),
            child.stderr.take().map(drain),
        ]
        .into_iter()
        .flatten()
        .collect();
        Ok(Self {
            step: step.to_owned(),
            started: Instant::now(),
            child,
            readers,
        })
    }

    fn join(mut self) -> Result<()> {
        use std::io::Write as _;
        let status = self
            .child
            .wait()
            .with_context(|| format!("{}: waiting for it", self.step))?;
        {
            let mut stderr = std::io::stderr().lock();
            for r in std::mem::take(&mut self.readers) {
                let _ = stderr.write_all(&r.join().unwrap_or_default());
            }
        }
        finished(&self.step, status, self.started);
        succeeded(&self.step, status)
    }
}

/// Reads `r` to its end on a thread of its own.
fn drain(mut r: impl std::io::Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        buf
    })
}

impl Drop for Beside {
    fn drop(&mut self) {
        if self.readers.is_empty() {
            return; // joined
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn daemon(a: DaemonArgs) -> Result<()> {
    let release = match a.release {
        Some(r) => r,
        None => ostler_testkit::releases::newest()?.version,
    };
    let bin = ostler_testkit::releases::installed(&release)
        .with_context(|| format!("installing Claude Code {release}"))?;
    if a.pgo {
        let mut c = Command::new(crate::pgo::build(&crate::bench::release_tools()?)?);
        c.args(["serve", "--claude"]).arg(&bin).args(&a.rest);
        return run("ostler serve (profile-guided build)", c);
    }
    let mut c = cargo();
    c.args([
        "run",
        "--release",
        "--package",
        "ostler",
        "--",
        "serve",
        "--claude",
    ])
    .arg(&bin)
    .args(&a.rest);
    run("ostler serve", c)
}
