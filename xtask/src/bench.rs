//! `cargo xtask bench [--quick]`: the end-to-end benchmarks of issue 13 (the real daemon with
//! the test kit's fake CLI, measured from a tonic client next to same-run baselines; the
//! harness is `crates/ostler-bench`), then the criterion benches of the crates unless
//! `--no-criterion`. Results: docs/performance.md.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Smaller sizes (20k-line firehose, no 1M replay, 10 s latency run).
    #[arg(long)]
    pub quick: bool,
    /// Only these items (comma-separated: letters a-g, `scale`, `resume`; see docs/performance.md).
    #[arg(long)]
    pub only: Option<String>,
    /// `store.synchronous` of the daemon under test (`normal` or `full`).
    #[arg(long, default_value = "normal")]
    pub sync: String,
    /// Skip the criterion benches of the crates.
    #[arg(long)]
    pub no_criterion: bool,
    /// Run items a, b, c and e this many times (a daemon and baselines per round) and end
    /// with each target's median over the rounds.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
    /// An `OSTLER_*` variable for the daemon under test, as `KEY=VALUE` (repeatable), e.g.
    /// `OSTLER_RUNTIME__WORKER_THREADS=1`. The harness clears the daemon's environment, so
    /// variables set for `cargo xtask bench` itself do not reach it.
    #[arg(long = "daemon-env", value_name = "KEY=VALUE")]
    pub daemon_env: Vec<String>,
    /// Measure the profile-guided daemon instead (built as by `cargo xtask pgo`, which needs
    /// llvm-profdata).
    #[arg(long)]
    pub pgo: bool,
    /// Leave out the in-process baselines of items a and c, the official Agent SDKs
    /// (otherwise installed on first use under target/agent-sdk: npm and a Python virtual
    /// environment).
    #[arg(long)]
    pub no_sdk: bool,
    /// A regression check: also build the daemon of this git revision (e.g. `main`,
    /// `HEAD~3`; release, in a worktree and target directory of its own under
    /// target/bench-against, kept for the next run) and measure it in the same rounds of
    /// items a, b, c and e, alternating with this checkout's; ends with this build's figures
    /// over that build's, round by round.
    #[arg(long, value_name = "REV")]
    pub against: Option<String>,
    /// Instead of the items and the criterion benches: item a's firehose (with `--only b`,
    /// item b's 16 firehoses at once) counted in instructions, the daemon under valgrind's
    /// callgrind, next to a serde_json `Value` loop's count per line (and the `--against`
    /// build's count). Needs valgrind.
    #[arg(long)]
    pub callgrind: bool,
}

pub fn root() -> PathBuf {
    ostler_testkit::workspace_root()
}

/// `$CARGO_TARGET_DIR` or `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// `cargo` in the workspace root, in the environment `cargo xtask` was started from: the
/// variables `cargo run` set for this process (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`, ...)
/// are taken out. A build script that reads them and says so (`rerun-if-env-changed`:
/// ring's does) would otherwise run again in every build started from here, and its
/// dependents (rustls, tonic, every workspace crate) be compiled again: once for the
/// builds started here and once more for the next `cargo xtask` or build from a shell.
pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    for (name, _) in std::env::vars_os() {
        let Some(n) = name.to_str() else { continue };
        if n.starts_with("CARGO_PKG_")
            || n.starts_with("CARGO_MANIFEST_")
            || matches!(
                n,
                "CARGO_PRIMARY_PACKAGE" | "CARGO_CRATE_NAME" | "CARGO_BIN_NAME"
            )
        {
            c.env_remove(n);
        }
    }
    c
}

pub fn status(step: &str, mut cmd: Command) -> Result<()> {
    eprintln!("==> {step}");
    let st = cmd
        .status()
        .with_context(|| format!("{step}: cannot start"))?;
    if !st.success() {
        bail!("{step} failed ({st})");
    }
    Ok(())
}

/// Builds the daemon, the fake CLI and the harness in release; returns their directory.
pub fn release_tools() -> Result<PathBuf> {
    let mut build = cargo();
    build.args([
        "build",
        "--release",
        "-p",
        "ostler",
        "--bin",
        "ostler",
        "-p",
        "ostler-testkit",
        "--bin",
        "ostler-fake-claude",
        "-p",
        "ostler-bench",
        "--bin",
        "ostler-bench",
    ]);
    status(
        "build the daemon, the fake CLI and the harness (release)",
        build,
    )?;
    Ok(target_dir().join("release"))
}

/// The release daemon of git revision `rev`, built in a worktree and a target directory of
/// its own (`target/bench-against`) and kept there as `ostler-<commit>`.
///
/// Not in this checkout's target directory: cargo names a workspace crate's artifacts
/// after its path relative to the workspace root, so two checkouts building there write
/// the same files, and the other checkout's newer artifacts then look up to date to this
/// one (seen: this checkout's crates linked against the other's).
fn base_daemon(rev: &str) -> Result<PathBuf> {
    let git = |args: &[&str]| -> Result<String> {
        let out = Command::new("git")
            .current_dir(root())
            .args(args)
            .output()
            .with_context(|| format!("git {}: cannot start", args.join(" ")))?;
        if !out.status.success() {
            bail!(
                "git {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let sha = git(&["rev-parse", "--verify", &format!("{rev}^{{commit}}")])
        .with_context(|| format!("--against {rev:?}: not a commit of this repository"))?;
    let short = &sha[..sha.len().min(12)];
    let dir = target_dir().join("bench-against");
    let bin = dir.join(format!("ostler-{short}"));
    if bin.exists() {
        eprintln!("==> the base build of {rev} ({short}): {}", bin.display());
        return Ok(bin);
    }
    std::fs::create_dir_all(&dir)?;
    let src = dir.join(format!("src-{short}"));
    let src_str = src.to_str().context("target directory path is not UTF-8")?;
    if src.exists() {
        // Left by an interrupted run.
        let _ = git(&["worktree", "remove", "--force", src_str]);
        let _ = std::fs::remove_dir_all(&src);
    }
    git(&["worktree", "add", "--detach", "--force", src_str, &sha])?;
    let mut build = cargo();
    build
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .args(["build", "--release", "-p", "ostler", "--bin", "ostler"]);
    let built = status(
        &format!("build the daemon of {rev} ({short}, release)"),
        build,
    );
    if built.is_ok() {
        std::fs::copy(dir.join("target/release/ostler"), &bin)
            .with_context(|| format!("copy the base build to {}", bin.display()))?;
    }
    git(&["worktree", "remove", "--force", src_str])?;
    built?;
    Ok(bin)
}

pub fn bench(a: BenchArgs) -> Result<()> {
    // The base build first: this checkout's binaries are then the newest on disk.
    let base = a.against.as_deref().map(base_daemon).transpose()?;
    let target = release_tools()?;
    let daemon = if a.pgo {
        crate::pgo::build(&target)?
    } else {
        target.join("ostler")
    };
    let mut run = Command::new(target.join("ostler-bench"));
    run.arg("--ostler")
        .arg(daemon)
        .arg("--fake")
        .arg(target.join("ostler-fake-claude"))
        .args(["--sync", &a.sync]);
    if a.quick {
        run.arg("--quick");
    }
    if let Some(o) = &a.only {
        run.args(["--only", o]);
    }
    if a.rounds > 1 {
        run.args(["--rounds", &a.rounds.to_string()]);
    }
    for kv in &a.daemon_env {
        run.args(["--daemon-env", kv]);
    }
    if a.no_sdk {
        run.arg("--no-sdk");
    }
    if let Some(b) = &base {
        run.arg("--base-ostler").arg(b);
    }
    if a.callgrind {
        run.arg("--callgrind");
    }
    status("end-to-end benchmarks (ostler-bench)", run)?;
    if !a.no_criterion && !a.callgrind {
        for (pkg, bench) in [
            ("ostler-protocol", "decode"),
            ("ostler-store", "store"),
            ("ostler-engine", "engine"),
            ("ostler-supervisor", "proctree"),
        ] {
            let mut c = cargo();
            c.args(["bench", "-p", pkg, "--bench", bench]);
            if a.quick {
                c.args(["--", "--quick"]);
            }
            status(&format!("criterion: {pkg} {bench}"), c)?;
        }
    }
    Ok(())
}
