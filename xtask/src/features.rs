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

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::process::Stdio;

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Builds every test target (`cargo test --workspace --no-run`), then warns when it compiled
/// a registry crate that xtask's own build, done just before by `cargo xtask`, depends on:
/// their features differ, see the module's documentation.
pub fn build_tests() -> Result<()> {
    let mut build = crate::bench::cargo();
    build
        .args([
            "test",
            "--workspace",
            "--no-run",
            "--quiet",
            "--message-format=json-render-diagnostics",
        ])
        .stdout(Stdio::piped());
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
