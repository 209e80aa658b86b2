//! Item a's in-process baselines: the official Agent SDKs (TypeScript
//! `@anthropic-ai/claude-agent-sdk`, Python `claude-agent-sdk`) driving the same fake CLI
//! and the same firehose as the daemon, in their own process, storing nothing. The scripts
//! (`crates/ostler-bench/sdk/`) time a `fake:firehose N` turn after a warm-up turn, from
//! handing the SDK the prompt to its `result` message, like item a times `SendMessage` to
//! `TurnCompleted`.
//!
//! Each SDK is installed once, at a pinned version, under `--sdk-dir` (by default
//! `target/agent-sdk`, next to the fake's `target/release`): npm for the TypeScript one, a
//! Python virtual environment and pip for the Python one. A machine without node, npm or
//! Python, or without the registries, gets a row saying why it was not measured.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, Result, bail};

use crate::GUARD;

/// `@anthropic-ai/claude-agent-sdk` on npm: the release published with Claude Code 2.1.332.
pub const TS_VERSION: &str = "0.3.332";
/// `claude-agent-sdk` on PyPI: the newest release on 2026-11-27.
pub const PY_VERSION: &str = "0.2.189";

static TS_SCRIPT: &str = include_str!("../sdk/firehose.mjs");
static PY_SCRIPT: &str = include_str!("../sdk/firehose.py");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sdk {
    TypeScript,
    Python,
}

impl Sdk {
    pub const ALL: [Sdk; 2] = [Sdk::TypeScript, Sdk::Python];

    /// How the rows name it.
    pub fn label(self) -> String {
        match self {
            Sdk::TypeScript => format!("TypeScript Agent SDK {TS_VERSION}"),
            Sdk::Python => format!("Python Agent SDK {PY_VERSION}"),
        }
    }

    /// The SDK installed under `dir` (installed now if it is missing or another version):
    /// the interpreter and the script to run with it.
    fn prepare(self, dir: &Path) -> Result<(PathBuf, PathBuf)> {
        match self {
            Sdk::TypeScript => {
                let prefix = dir.join(format!("ts-{TS_VERSION}"));
                let package =
                    prefix.join("node_modules/@anthropic-ai/claude-agent-sdk/package.json");
                let installed = std::fs::read_to_string(&package).ok().and_then(|p| {
                    serde_json::from_str::<serde_json::Value>(&p).ok()?["version"]
                        .as_str()
                        .map(|v| v == TS_VERSION)
                });
                if installed != Some(true) {
                    std::fs::create_dir_all(&prefix)?;
                    run(
                        std::process::Command::new("npm")
                            .arg("install")
                            .arg("--prefix")
                            .arg(&prefix)
                            .args(["--no-audit", "--no-fund", "--loglevel=error"])
                            .arg(format!("@anthropic-ai/claude-agent-sdk@{TS_VERSION}")),
                        "npm install",
                    )?;
                }
                // Node resolves the package from the script's own directory.
                let script = prefix.join("firehose.mjs");
                std::fs::write(&script, TS_SCRIPT)?;
                Ok((PathBuf::from("node"), script))
            }
            Sdk::Python => {
                let venv = dir.join(format!("py-{PY_VERSION}"));
                let python = venv.join("bin/python");
                let installed = std::process::Command::new(&python)
                    .args(["-c", "import claude_agent_sdk as s; print(s.__version__)"])
                    .output()
                    .is_ok_and(|o| {
                        o.status.success() && o.stdout.trim_ascii() == PY_VERSION.as_bytes()
                    });
                if !installed {
                    run(
                        std::process::Command::new("python3")
                            .args(["-m", "venv", "--clear"])
                            .arg(&venv),
                        "python3 -m venv",
                    )?;
                    run(
                        std::process::Command::new(&python)
                            .args([
                                "-m",
                                "pip",
                                "install",
                                "--quiet",
                                "--disable-pip-version-check",
                            ])
                            .arg(format!("claude-agent-sdk=={PY_VERSION}")),
                        "pip install",
                    )?;
                }
                let script = venv.join("firehose.py");
                std::fs::write(&script, PY_SCRIPT)?;
                Ok((python, script))
            }
        }
    }
}

/// Runs an installation step, failing with the tail of what it printed.
fn run(cmd: &mut std::process::Command, what: &str) -> Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: String = err
            .trim()
            .chars()
            .rev()
            .take(300)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        bail!("{what} failed ({}): {tail}", out.status);
    }
    Ok(())
}

/// What an SDK's firehose measured.
pub struct Measured {
    /// Messages per second the SDK yielded.
    pub rate: f64,
    /// The SDK process's CPU time per message (user and system, seconds).
    pub cpu_per_message: f64,
}

/// What `sdk` measures on the fake CLI's firehose of `n` lines, in its own process
/// (installing the SDK under `dir` first if needed).
pub async fn measure(sdk: Sdk, dir: &Path, fake: &Path, n: u64) -> Result<Measured> {
    let (program, script) = {
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || sdk.prepare(&dir)).await??
    };
    // The fake keeps its transcript under $HOME, as the daemon's sessions do.
    let home = tempfile::Builder::new()
        .prefix("ostler-bench-sdk-")
        .tempdir()?;
    let mut cmd = tokio::process::Command::new(&program);
    cmd.arg(&script)
        .arg(fake)
        .arg(n.to_string())
        .current_dir(home.path())
        .env_clear()
        .env("HOME", home.path())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    let out = tokio::time::timeout(GUARD, cmd.output())
        .await
        .context("the SDK's firehose did not end")?
        .with_context(|| format!("cannot run {}", program.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        bail!(
            "{} exited with {}: {}",
            script.display(),
            out.status,
            last.chars().take(300).collect::<String>()
        );
    }
    let v: serde_json::Value = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .with_context(|| format!("{} printed no result: {stdout:.300}", script.display()))?;
    let (Some(messages), Some(secs), Some(cpu)) = (
        v["messages"].as_u64(),
        v["secs"].as_f64(),
        v["cpu_secs"].as_f64(),
    ) else {
        bail!("{} printed {v}", script.display());
    };
    // The turn's lines: the firehose's n and its system/init, status and result.
    if messages < n {
        bail!("the SDK yielded {messages} messages for {n} lines");
    }
    Ok(Measured {
        rate: messages as f64 / secs,
        cpu_per_message: cpu / messages as f64,
    })
}
