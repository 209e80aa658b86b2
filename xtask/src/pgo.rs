//! `cargo xtask pgo`: a profile-guided build of the daemon (docs/performance.md, session 18).
//!
//! 1. the daemon built in release with `-Cprofile-generate` (`<target>/pgo/gen`);
//! 2. a training run: `ostler-bench --quick` items a, c, d, g and resume, then a and c
//!    again, against that daemon (the firehose, the latency run's cold one-event path,
//!    partials, idle sessions, create and resume);
//! 3. `llvm-profdata merge` of what it wrote (`<target>/pgo/ostler.profdata`);
//! 4. the daemon built again with `-Cprofile-use` (`<target>/pgo/use/release/ostler`).
//!
//! Needs an `llvm-profdata` that reads the raw profiles of rustc's LLVM: `$LLVM_PROFDATA`,
//! rustup's `llvm-tools` component, `llvm-profdata` on `PATH`, or a distribution's
//! `/usr/lib/llvm-N/bin/llvm-profdata` (Debian's `llvm-19` reads rustc 1.95's, LLVM 22).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::bench::{cargo, release_tools, status, target_dir};

#[derive(clap::Args)]
pub struct PgoArgs {}

/// Builds the profile-guided daemon and returns its path.
pub fn pgo(_: PgoArgs) -> Result<()> {
    let bin = build(&release_tools()?)?;
    println!("{}", bin.display());
    Ok(())
}

/// Runs the four steps of the module's text with the harness and fake CLI in `tools`
/// ([`release_tools`]); returns the optimized daemon.
pub fn build(tools: &Path) -> Result<PathBuf> {
    let profdata = find_profdata()?;
    let dir = target_dir().join("pgo");
    let raw = dir.join("raw");
    let gen_target = dir.join("gen");
    let use_target = dir.join("use");

    let generate = daemon_build(
        &gen_target,
        &format!("-Cprofile-generate={}", raw.display()),
    );
    status("PGO 1/4: instrumented daemon (release)", generate)?;
    // Only the training run's profiles (build scripts of step 1 write here too).
    if raw.exists() {
        std::fs::remove_dir_all(&raw).with_context(|| format!("clearing {}", raw.display()))?;
    }
    let instrumented = gen_target.join("release").join("ostler");
    for only in ["a,c,d,g,resume", "a,c"] {
        let mut train = Command::new(tools.join("ostler-bench"));
        train
            .arg("--ostler")
            .arg(&instrumented)
            .arg("--fake")
            .arg(tools.join("ostler-fake-claude"))
            .args(["--quick", "--only", only]);
        status(
            &format!("PGO 2/4: training run (ostler-bench --quick --only {only})"),
            train,
        )?;
    }
    let profile = dir.join("ostler.profdata");
    let raws: Vec<PathBuf> = std::fs::read_dir(&raw)
        .with_context(|| format!("no profiles in {}", raw.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "profraw"))
        .collect();
    if raws.is_empty() {
        bail!("the training run left no profile in {}", raw.display());
    }
    let mut merge = Command::new(&profdata);
    merge.arg("merge").arg("-o").arg(&profile).args(&raws);
    status(&format!("PGO 3/4: {} merge", profdata.display()), merge)?;
    let optimized = daemon_build(&use_target, &format!("-Cprofile-use={}", profile.display()));
    status("PGO 4/4: profile-guided daemon (release)", optimized)?;
    Ok(use_target.join("release").join("ostler"))
}

/// `cargo build --release -p ostler --bin ostler` into `target` with `flag` added to the
/// caller's `RUSTFLAGS`.
fn daemon_build(target: &Path, flag: &str) -> Command {
    let mut c = cargo();
    let flags = match std::env::var("RUSTFLAGS") {
        Ok(f) if !f.trim().is_empty() => format!("{f} {flag}"),
        _ => flag.to_owned(),
    };
    c.args(["build", "--release", "-p", "ostler", "--bin", "ostler"])
        .env("CARGO_TARGET_DIR", target)
        .env("RUSTFLAGS", flags)
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    c
}

/// The first `llvm-profdata` that runs, in the order of the module's text.
fn find_profdata() -> Result<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("LLVM_PROFDATA") {
        candidates.push(p.into());
    }
    if let Ok(out) = Command::new("rustc").args(["--print", "sysroot"]).output() {
        let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let host = Command::new("rustc")
            .arg("-vV")
            .output()
            .ok()
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
            });
        if let Some(host) = host {
            candidates.push(
                Path::new(&sysroot)
                    .join("lib/rustlib")
                    .join(host)
                    .join("bin/llvm-profdata"),
            );
        }
    }
    candidates.push("llvm-profdata".into());
    // Distribution packages, newest first.
    let mut distro: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n: u32 = name.strip_prefix("llvm-")?.parse().ok()?;
            Some((n, e.path().join("bin/llvm-profdata")))
        })
        .collect();
    distro.sort_by_key(|d| std::cmp::Reverse(d.0));
    candidates.extend(distro.into_iter().map(|(_, p)| p));
    candidates
        .into_iter()
        .find(|p| crate::dev::have(p, "--version"))
        .context(
            "PGO needs llvm-profdata: `rustup component add llvm-tools`, a distribution's LLVM \
         package (Debian: `apt-get install llvm-19`), or LLVM_PROFDATA=/path/to/llvm-profdata",
        )
}
