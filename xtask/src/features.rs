//! The test build of `cargo xtask test`, and a watch on the features it shares with xtask's
//! own build.
//!
//! `cargo xtask` builds the xtask package alone (`cargo run --package xtask`), and Cargo
//! turns on a dependency's features from the packages a build selects. Left alone, xtask's
//! build enabled fewer features of `log`, `mio`, `serde`, `regex`, `rustix`, ... than `cargo
//! test --workspace` does, and everything above them (tokio, hyper, h2, rustls, tonic, the
//! workspace's libraries: 44 crates, measured) was compiled a second time for the tests in
//! one run. The dependencies under "Feature unification" in xtask/Cargo.toml turn on, in
//! xtask's build, the features the test build turns on anyway, so the test build finds
//! them compiled. [`build_tests`] says when that stops being true (a dependency added or
//! bumped): it is a matter of build time only, so it warns and goes on.
//!
//! The test build is also the run's Clippy ([`Clippy`]): `cargo clippy` is `cargo check`
//! with `clippy-driver` as the workspace members' compiler wrapper, and `cargo xtask test`
//! sets `clippy-driver` as the compiler wrapper of its builds, so that the lints run in the
//! compilation the tests need anyway instead of in a check of the whole dependency graph of
//! its own.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Clippy's lints (`-D warnings`, as `cargo clippy -- -D warnings`) in the builds of
/// `cargo xtask test`, or none. On: `clippy-driver`, which is rustc with Clippy's lints, is
/// the compiler wrapper, so a lint is a compile error of the build. `clippy-driver` lints
/// only the crates Cargo compiles as the workspace's own (it compiles dependencies, which
/// Cargo caps at `--cap-lints allow`, as plain rustc does).
///
/// It is set as `RUSTC_WRAPPER`, which Cargo leaves out of the artefacts' hash (unlike
/// `RUSTC_WORKSPACE_WRAPPER`, what `cargo clippy` sets): the test build then reuses the
/// workspace libraries xtask's own build compiled just before, instead of compiling all
/// nine again, and their code is linted where the test build compiles it anyway, in each
/// library's unit-test target (every library has one; `#[cfg(not(test))]` code would
/// escape, and the workspace has none). Libraries the test build compiles itself are linted
/// in both targets. Measured on 2 cores, fresh target directory after xtask's build: the
/// linted test build took 216 s and 410 CPU-seconds (dev-dependencies included), 236 s and
/// 456 CPU-seconds with the workspace wrapper (dev-dependencies already built). When
/// `RUSTC_WRAPPER` is already set (sccache, say), it is kept and `clippy-driver` goes in
/// `RUSTC_WORKSPACE_WRAPPER`, which Cargo runs inside it: the libraries are compiled again.
///
/// Before, `cargo clippy --workspace --all-targets` checked the whole dependency graph again
/// (~230 s, ~440 CPU-seconds, 2 cores, a fresh clone).
#[derive(Clone, Debug, Default)]
pub struct Clippy {
    /// `clippy-driver`, when on.
    driver: Option<PathBuf>,
    /// The variable that carries it: `RUSTC_WRAPPER`, or `RUSTC_WORKSPACE_WRAPPER` when the
    /// environment has a `RUSTC_WRAPPER` of its own.
    var: &'static str,
}

/// `cargo clippy -- -D warnings` passes its arguments to `clippy-driver` this way.
const CLIPPY_ARGS: &str = "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__";

impl Clippy {
    /// No lints.
    pub fn off() -> Self {
        Self::default()
    }

    /// The lints, with the `clippy-driver` of the toolchain that builds (the one beside
    /// `rustc`, as `cargo clippy` finds it beside itself).
    pub fn on() -> Result<Self> {
        let out = Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
            .current_dir(crate::bench::root())
            .args(["--print", "sysroot"])
            .output()
            .context("cannot start rustc --print sysroot")?;
        if !out.status.success() {
            bail!("rustc --print sysroot failed ({})", out.status);
        }
        let sysroot = String::from_utf8(out.stdout).context("rustc's sysroot is not UTF-8")?;
        let driver = PathBuf::from(sysroot.trim())
            .join("bin")
            .join(format!("clippy-driver{}", std::env::consts::EXE_SUFFIX));
        if !driver.is_file() {
            bail!(
                "{} is missing: install Clippy (`rustup component add clippy`), or run \
                 `cargo xtask test --no-lint`",
                driver.display()
            );
        }
        let var = if std::env::var_os("RUSTC_WRAPPER").is_some_and(|w| !w.is_empty()) {
            "RUSTC_WORKSPACE_WRAPPER"
        } else {
            "RUSTC_WRAPPER"
        };
        Ok(Self {
            driver: Some(driver),
            var,
        })
    }

    /// Whether the lints are on.
    pub fn is_on(&self) -> bool {
        self.driver.is_some()
    }

    /// Sets the lints in a cargo command's environment (off: leaves it as it is).
    pub fn apply(&self, cmd: &mut Command) {
        if let Some(driver) = &self.driver {
            cmd.env(self.var, driver).env("CLIPPY_ARGS", CLIPPY_ARGS);
        }
    }
}

/// Builds every test target (`cargo test --workspace --no-run`; with the lints on, every
/// target, benches and examples too, as `cargo clippy --all-targets` lints), then warns
/// when it compiled a registry crate that xtask's own build, done just before by `cargo
/// xtask`, depends on: their features differ, see the module's documentation.
pub fn build_tests(clippy: &Clippy) -> Result<()> {
    let mut build = crate::bench::cargo();
    build.args([
        "test",
        "--workspace",
        "--no-run",
        "--quiet",
        "--message-format=json-render-diagnostics",
    ]);
    if clippy.is_on() {
        build.arg("--all-targets");
    }
    clippy.apply(&mut build);
    build.stdout(Stdio::piped());
    let mut child = build.spawn().context("cannot start cargo")?;
    let mut compiled = BTreeSet::new();
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line.context("reading cargo's messages")?;
            if let Some(id) = compiled_registry_crate(&line) {
                compiled.insert(id);
            }
        }
    }
    let st = child.wait().context("waiting for cargo")?;
    if !st.success() {
        bail!("building the tests failed ({st})");
    }
    if compiled.is_empty() {
        return Ok(());
    }
    let shared: Vec<String> = match xtask_dependencies() {
        Ok(deps) => compiled
            .into_iter()
            .filter(|id| deps.contains(id))
            .map(|id| short_id(&id).to_owned())
            .collect(),
        Err(e) => {
            eprintln!("warning: cannot read the dependency graph to compare features: {e:#}");
            return Ok(());
        }
    };
    if !shared.is_empty() {
        eprintln!(
            "warning: the test build compiled again {} crate(s) that xtask's build had \
             compiled with other features ({}): enable in xtask/Cargo.toml (\"Feature \
             unification\") the features `cargo test --workspace` enables for the lowest of \
             them; see xtask/src/features.rs",
            shared.len(),
            shared.join(", ")
        );
    }
    Ok(())
}

/// The package id of a crate from a registry that cargo's JSON message `line` says was
/// compiled (not found fresh).
fn compiled_registry_crate(line: &str) -> Option<String> {
    let m: Value = serde_json::from_str(line).ok()?;
    if m.get("reason")?.as_str()? != "compiler-artifact" || m.get("fresh")?.as_bool()? {
        return None;
    }
    let id = m.get("package_id")?.as_str()?;
    id.starts_with("registry+").then(|| id.to_owned())
}

/// `registry+https://...#log@0.4.35` -> `log@0.4.35`.
fn short_id(id: &str) -> &str {
    id.rsplit_once('#').map_or(id, |(_, s)| s)
}

/// Every package xtask's build depends on, directly or not (normal and build dependencies),
/// by package id, from `cargo metadata`.
fn xtask_dependencies() -> Result<BTreeSet<String>> {
    let out = crate::bench::cargo()
        .args(["metadata", "--format-version", "1"])
        .stderr(Stdio::inherit())
        .output()
        .context("cannot start cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata failed ({})", out.status);
    }
    let meta: Value = serde_json::from_slice(&out.stdout).context("cargo metadata's output")?;
    closure_of(&meta, "xtask")
}

/// The non-dev dependency closure of the workspace package `name` in `meta` (the output of
/// `cargo metadata --format-version 1`).
fn closure_of(meta: &Value, name: &str) -> Result<BTreeSet<String>> {
    let root = meta["packages"]
        .as_array()
        .and_then(|ps| {
            ps.iter()
                .find(|p| p["name"].as_str() == Some(name) && p["source"].is_null())
        })
        .and_then(|p| p["id"].as_str())
        .with_context(|| format!("no workspace package {name}"))?;
    let mut edges: HashMap<&str, Vec<&str>> = HashMap::new();
    for node in meta["resolve"]["nodes"].as_array().into_iter().flatten() {
        let Some(id) = node["id"].as_str() else {
            continue;
        };
        let deps = node["deps"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|d| {
                let not_dev_only = d["dep_kinds"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|k| k["kind"].as_str() != Some("dev"));
                not_dev_only.then(|| d["pkg"].as_str()).flatten()
            });
        edges.entry(id).or_default().extend(deps);
    }
    let mut seen = BTreeSet::new();
    let mut todo = vec![root];
    while let Some(id) = todo.pop() {
        for dep in edges.get(id).into_iter().flatten() {
            if seen.insert((*dep).to_owned()) {
                todo.push(dep);
            }
        }
    }
    Ok(seen)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-crate workspace in a temporary directory, with `lib.rs`.
    fn crate_with(lib: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("Cargo.toml"),
            "[package]\nname = \"linted\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n[workspace]\n",
        )
        .expect("Cargo.toml");
        std::fs::create_dir(dir.path().join("src")).expect("src");
        std::fs::write(dir.path().join("src/lib.rs"), lib).expect("lib.rs");
        dir
    }

    /// `cargo <args>` in the crate with `clippy`'s setting: whether it passed, its stdout and
    /// its stderr.
    fn cargo_in(dir: &std::path::Path, args: &[&str], clippy: &Clippy) -> (bool, String, String) {
        let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        cmd.current_dir(dir)
            .args(args)
            .env("CARGO_TARGET_DIR", dir.join("target"))
            // Under `cargo xtask test` the test itself runs with the lints' variables.
            .env_remove("RUSTC_WRAPPER")
            .env_remove("RUSTC_WORKSPACE_WRAPPER")
            .env_remove("CLIPPY_ARGS");
        clippy.apply(&mut cmd);
        let out = cmd.output().expect("cargo");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    const TESTS: &str = "\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn t() {}\n}\n";

    /// As in `cargo xtask test`: the library is compiled plain first (xtask's build), then
    /// the linted test build runs.
    #[test]
    fn a_clippy_lint_in_a_library_built_plain_fails_the_test_build_and_a_clean_one_passes() {
        let mut clippy = Clippy::on().expect("clippy-driver (rustup component add clippy)");
        // What `on()` picks where no `RUSTC_WRAPPER` is set (this test's own environment
        // has one under `cargo xtask test`: the driver).
        clippy.var = "RUSTC_WRAPPER";
        // `len() == 0`: clippy::len_zero, warn by default, denied by `-D warnings`; plain
        // rustc has no such lint.
        let dir = crate_with(&format!(
            "pub fn none(v: &[u8]) -> bool {{\n    v.len() == 0\n}}\n{TESTS}"
        ));
        let (ok, _, stderr) = cargo_in(dir.path(), &["build", "--quiet"], &Clippy::off());
        assert!(ok, "plain build failed: {stderr}");
        let test_build = ["test", "--no-run", "--quiet", "--message-format=json"];
        let (ok, stdout, stderr) = cargo_in(dir.path(), &test_build, &clippy);
        assert!(!ok, "the lint did not fail the test build");
        assert!(stdout.contains("clippy::len_zero"), "{stdout}");
        assert!(stderr.contains("(lib test)"), "{stderr}");

        std::fs::write(
            dir.path().join("src/lib.rs"),
            format!("pub fn none(v: &[u8]) -> bool {{\n    v.is_empty()\n}}\n{TESTS}"),
        )
        .expect("lib.rs");
        let (ok, _, stderr) = cargo_in(dir.path(), &["build", "--quiet"], &Clippy::off());
        assert!(ok, "plain build failed: {stderr}");
        let (ok, stdout, stderr) = cargo_in(dir.path(), &test_build, &clippy);
        assert!(ok, "a clean crate failed: {stderr}");
        // The point of `RUSTC_WRAPPER`: the library built plain is reused, not compiled again.
        let lib_fresh = stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|m| {
                m["reason"] == "compiler-artifact"
                    && m["target"]["kind"][0] == "lib"
                    && m["profile"]["test"] == false
            })
            .map(|m| m["fresh"].clone());
        assert_eq!(lib_fresh, Some(Value::Bool(true)), "{stdout}");
    }

    #[test]
    fn compiled_crates_from_a_registry_are_picked_out() {
        let line = |id: &str, fresh: bool| {
            serde_json::json!({"reason": "compiler-artifact", "package_id": id, "fresh": fresh})
                .to_string()
        };
        let reg = "registry+https://github.com/rust-lang/crates.io-index#log@0.4.35";
        assert_eq!(
            compiled_registry_crate(&line(reg, false)).as_deref(),
            Some(reg)
        );
        assert_eq!(compiled_registry_crate(&line(reg, true)), None);
        let local = "path+file:///w/crates/ostler#0.1.0";
        assert_eq!(compiled_registry_crate(&line(local, false)), None);
        assert_eq!(
            compiled_registry_crate(r#"{"reason":"build-finished"}"#),
            None
        );
        assert_eq!(compiled_registry_crate("not json"), None);
        assert_eq!(short_id(reg), "log@0.4.35");
    }

    #[test]
    fn the_closure_follows_normal_and_build_edges_not_dev_ones() {
        let dep = |pkg: &str, kind: Option<&str>| serde_json::json!({"pkg": pkg, "dep_kinds": [{"kind": kind}]});
        let meta = serde_json::json!({
            "packages": [
                {"name": "xtask", "id": "x", "source": null},
                {"name": "xtask", "id": "reg-x", "source": "registry+https://example"},
            ],
            "resolve": {"nodes": [
                {"id": "x", "deps": [dep("a", None), dep("d", Some("dev"))]},
                {"id": "a", "deps": [dep("b", Some("build"))]},
                {"id": "b", "deps": [dep("a", None)]},
                {"id": "d", "deps": [dep("e", None)]},
            ]},
        });
        let got = closure_of(&meta, "xtask").expect("closure");
        assert_eq!(got, BTreeSet::from(["a".to_owned(), "b".to_owned()]));
        assert!(closure_of(&meta, "nope").is_err());
    }
}
