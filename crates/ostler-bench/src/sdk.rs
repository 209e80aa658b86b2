//! In-process baselines of items a and c: the official Agent SDKs (TypeScript
//! `@anthropic-ai/claude-agent-sdk`, Python `claude-agent-sdk`) driving the same fake CLI
//! as the daemon, in their own process, storing nothing and sending nothing on. The scripts
//! are in `crates/ostler-bench/sdk/`:
//! - `firehose.*` (item a): a warm-up firehose, then `fake:firehose N` timed from handing
//!   the SDK the prompt to its `result` message, as item a times `SendMessage` to
//!   `TurnCompleted`;
//! - `latency.*` (item c): as many sessions as item c, each its own fake CLI writing paced
//!   lines, the latency from the fake's write to the SDK yielding the message.
//!
//! Each SDK is installed once, at a pinned version, under `--sdk-dir` (by default
//! `target/agent-sdk`, next to the fake's `target/release`): npm for the TypeScript one, a
//! Python virtual environment and pip for the Python one, both without the copy of the CLI
//! that the SDKs bundle (~140 MB in all instead of ~900 MB). A machine without node, npm or
//! Python, or without the registries, gets a row saying why it was not measured.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::GUARD;

/// `@anthropic-ai/claude-agent-sdk` on npm: the release published with Claude Code 2.1.332.
pub const TS_VERSION: &str = "0.3.332";
/// `claude-agent-sdk` on PyPI: the newest release on 2026-11-27.
pub const PY_VERSION: &str = "0.2.189";

/// The scripts of each SDK, written next to its installation: (file name, text).
const TS_SCRIPTS: [(&str, &str); 3] = [
    ("firehose.mjs", include_str!("../sdk/firehose.mjs")),
    ("latency.mjs", include_str!("../sdk/latency.mjs")),
    ("common.mjs", include_str!("../sdk/common.mjs")),
];
const PY_SCRIPTS: [(&str, &str); 2] = [
    ("firehose.py", include_str!("../sdk/firehose.py")),
    ("latency.py", include_str!("../sdk/latency.py")),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sdk {
    TypeScript,
    Python,
}

/// What a script measures.
#[derive(Debug, Clone, Copy)]
enum Script {
    Firehose,
    Latency,
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

    /// The file name of `s` among this SDK's scripts.
    fn script_name(self, s: Script) -> String {
        let stem = match s {
            Script::Firehose => "firehose",
            Script::Latency => "latency",
        };
        let extension = match self {
            Sdk::TypeScript => "mjs",
            Sdk::Python => "py",
        };
        format!("{stem}.{extension}")
    }

    /// The SDK installed under `dir` (installed now if it is missing or another version),
    /// its scripts written next to it: the interpreter and the scripts' directory.
    fn prepare(self, dir: &Path) -> Result<(PathBuf, PathBuf)> {
        let (interpreter, home, scripts) = match self {
            Sdk::TypeScript => {
                let prefix = dir.join(format!("ts-{TS_VERSION}"));
                let package =
                    prefix.join("node_modules/@anthropic-ai/claude-agent-sdk/package.json");
                let installed = std::fs::read_to_string(&package).ok().and_then(|p| {
                    serde_json::from_str::<Value>(&p).ok()?["version"]
                        .as_str()
                        .map(|v| v == TS_VERSION)
                });
                if installed != Some(true) {
                    std::fs::create_dir_all(&prefix)
                        .with_context(|| format!("cannot create {}", prefix.display()))?;
                    install_step(
                        std::process::Command::new("npm")
                            .arg("install")
                            .arg("--prefix")
                            .arg(&prefix)
                            // Not the optional package with the SDK's own copy of the
                            // CLI (384 MB): the scripts name the fake.
                            .args([
                                "--omit=optional",
                                "--no-audit",
                                "--no-fund",
                                "--loglevel=error",
                            ])
                            .arg(format!("@anthropic-ai/claude-agent-sdk@{TS_VERSION}")),
                        "npm install",
                    )?;
                }
                // Node resolves the package from the script's own directory.
                (PathBuf::from("node"), prefix, &TS_SCRIPTS[..])
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
                    install_step(
                        std::process::Command::new("python3")
                            .args(["-m", "venv", "--clear"])
                            .arg(&venv),
                        "python3 -m venv",
                    )?;
                    install_step(
                        std::process::Command::new(&python)
                            .args([
                                "-m",
                                "pip",
                                "install",
                                "--quiet",
                                "--disable-pip-version-check",
                            ])
                            // From the source distribution: the wheel carries the SDK's own
                            // copy of the CLI (178 MB); the scripts name the fake.
                            .args(["--no-binary", "claude-agent-sdk"])
                            .arg(format!("claude-agent-sdk=={PY_VERSION}")),
                        "pip install",
                    )?;
                }
                (python, venv, &PY_SCRIPTS[..])
            }
        };
        for &(name, text) in scripts {
            let path = home.join(name);
            std::fs::write(&path, text)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        Ok((interpreter, home))
    }

    /// Runs `script` with `args` (after the fake's path) and returns the JSON it printed
    /// last.
    async fn run(self, dir: &Path, script: Script, fake: &Path, args: &[String]) -> Result<Value> {
        let (program, scripts) = {
            let dir = dir.to_path_buf();
            tokio::task::spawn_blocking(move || self.prepare(&dir)).await??
        };
        let script = scripts.join(self.script_name(script));
        // The fakes keep their transcripts under $HOME, as the daemon's sessions do.
        let home = tempfile::Builder::new()
            .prefix("ostler-bench-sdk-")
            .tempdir()?;
        let mut cmd = tokio::process::Command::new(&program);
        cmd.arg(&script)
            .arg(fake)
            .args(args)
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
            .with_context(|| format!("{} did not end", script.display()))?
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
        stdout
            .lines()
            .last()
            .and_then(|l| serde_json::from_str(l).ok())
            .with_context(|| {
                let head: String = stdout.chars().take(300).collect();
                format!("{} printed no result: {head}", script.display())
            })
    }
}

/// Runs an installation step, failing with the tail of what it printed.
fn install_step(cmd: &mut std::process::Command, what: &str) -> Result<()> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run {what}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let chars: Vec<char> = err.trim().chars().collect();
        let tail: String = chars[chars.len().saturating_sub(300)..].iter().collect();
        bail!("{what} failed ({}): {tail}", out.status);
    }
    Ok(())
}

fn arg(n: impl ToString) -> String {
    n.to_string()
}

/// What an SDK's firehose measured.
pub struct Firehose {
    /// Messages per second the SDK yielded.
    pub rate: f64,
    /// The SDK process's CPU time per message (user and system, seconds).
    pub cpu_per_message: f64,
}

/// `sdk` on the fake CLI's firehose of `n` lines, in its own process (installing the SDK
/// under `dir` first if needed).
pub async fn firehose(sdk: Sdk, dir: &Path, fake: &Path, n: u64) -> Result<Firehose> {
    let v = sdk.run(dir, Script::Firehose, fake, &[arg(n)]).await?;
    let (Some(messages), Some(secs), Some(cpu)) = (
        v["messages"].as_u64(),
        v["secs"].as_f64(),
        v["cpu_secs"].as_f64(),
    ) else {
        bail!("the firehose script printed {v}");
    };
    // The turn's lines: the firehose's n and its system/init, status and result.
    if messages < n {
        bail!("the SDK yielded {messages} messages for {n} lines");
    }
    Ok(Firehose {
        rate: messages as f64 / secs,
        cpu_per_message: cpu / messages as f64,
    })
}

/// What an SDK's paced sessions measured.
pub struct Latency {
    /// Every line's latency (ns), sorted.
    pub sorted_ns: Vec<u64>,
    /// The SDK process's CPU time per line (user and system, seconds).
    pub cpu_per_line: f64,
}

/// `sdk` with `sessions` sessions, each one's fake CLI writing `lines` paced lines at `rate`
/// a second, in one process (installing the SDK under `dir` first if needed).
pub async fn latency(
    sdk: Sdk,
    dir: &Path,
    fake: &Path,
    sessions: usize,
    rate: u64,
    lines: u64,
) -> Result<Latency> {
    let args = [arg(sessions), arg(rate), arg(lines)];
    let v = sdk.run(dir, Script::Latency, fake, &args).await?;
    let (Some(lat), Some(cpu)) = (v["latencies_us"].as_array(), v["cpu_secs"].as_f64()) else {
        bail!("the latency script printed no latencies_us and cpu_secs");
    };
    let want = sessions as u64 * lines;
    if lat.len() as u64 != want {
        bail!("the SDK yielded {} paced lines of {want}", lat.len());
    }
    // A latency below zero would be two clocks disagreeing: kept as 0, and counted in p50.
    let mut sorted_ns: Vec<u64> = lat
        .iter()
        .map(|x| (x.as_f64().unwrap_or(0.0).max(0.0) * 1e3) as u64)
        .collect();
    sorted_ns.sort_unstable();
    Ok(Latency {
        sorted_ns,
        cpu_per_line: cpu / want as f64,
    })
}
