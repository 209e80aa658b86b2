//! `cargo xtask test` (the whole test suite, as CI runs it) and `cargo xtask daemon` (run
//! the daemon on a fresh machine).

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
    eprintln!(
        "<== {step}: {status} in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    if !status.success() {
        bail!("{step} failed ({status})");
    }
    Ok(())
}

/// Install every pinned release (npm, into the shared cache) so tests find them. Installs
/// run a few at a time: each is mostly waiting on the registry.
fn install_pinned() -> Result<()> {
    const AT_ONCE: usize = 4;
    let cache = ostler_testkit::releases::default_cache_dir();
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
    Ok(())
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
    eprintln!("==> installing pinned Claude Code releases");
    install_pinned()?;

    if !a.no_lint {
        let mut fmt = cargo();
        fmt.args(["fmt", "--all", "--", "--check"]);
        run("cargo fmt --check", fmt)?;
        let mut clippy = cargo();
        clippy.args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]);
        run("cargo clippy", clippy)?;
    }

    // Generated artefacts must match their sources.
    for check in generated_checks() {
        let mut c = cargo();
        c.args(["run", "--quiet", "--package", "xtask", "--"])
            .args(&check);
        run(&format!("cargo xtask {}", check.join(" ")), c)?;
    }

    // The newest pinned release, measured again: the probe's own logic meets each new
    // release here (a probe that misreads a release would put a wrong row in the matrix).
    let mut probe = cargo();
    probe.args([
        "run",
        "--quiet",
        "--package",
        "xtask",
        "--",
        "compat",
        "probe",
        "--check",
        "--newest",
    ]);
    run("cargo xtask compat probe --check --newest", probe)?;

    eprintln!("==> cargo xtask fuzz --secs 60");
    crate::fuzz::fuzz(crate::fuzz::FuzzArgs {
        secs: 60,
        target: Vec::new(),
        seed: None,
    })?;

    eprintln!("==> cargo xtask chaos --short");
    crate::chaos::chaos(crate::chaos::ChaosArgs {
        short: true,
        seed: None,
        build_tests: true,
    })?;

    let mut t = cargo();
    if have("cargo-nextest", "--version") {
        t.args(["nextest", "run", "--workspace", "--no-fail-fast"]);
    } else {
        t.args(["test", "--workspace", "--no-fail-fast"]);
    }
    t.args(&a.rest);
    run("tests", t)?;
    eprintln!(
        "all checks passed in {:.0}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `--check` runs of everything xtask generates.
fn generated_checks() -> Vec<Vec<String>> {
    [
        &["contracts", "bless", "--check"][..],
        &["compat", "generate", "--check"][..],
    ]
    .iter()
    .map(|c| c.iter().map(|s| (*s).to_owned()).collect())
    .collect()
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
