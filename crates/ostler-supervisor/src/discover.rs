//! Finding the `claude` binary, reading its version and probing its flags.
//!
//! ## Exit codes
//! [`DiscoverError::exit_code`] gives what the daemon (and `ostler doctor`) exit with:
//! - **72** (`EX_OSFILE`): no binary at the configured path / on `PATH`, or it cannot be
//!   executed at all. The message says where we looked and how to install.
//! - **78** (`EX_CONFIG`): a binary was found but it is not a usable Claude Code: older than
//!   the minimum, `--version` hangs, fails or prints something unrecognisable.
//!
//! ## Flag probing
//! `--help` is not the truth (recent releases hide working flags such as
//! `--permission-prompt-tool`, `--max-turns` and `--sdk-url`), and `--version` is answered
//! before options are validated (an unknown flag next to `--version` is ignored). What
//! every release does is validate options first when run in print mode: we run
//! `claude -p --input-format stream-json --output-format stream-json --verbose <flags>`
//! with stdin at EOF, a throwaway `HOME` and an unreachable `ANTHROPIC_BASE_URL`. An
//! unknown flag gives `error: unknown option '--x'` (exit 1); the named flag is dropped and
//! the run repeated, so all flags cost (number of unknown flags + 1) runs. Any other
//! outcome means the remaining flags were accepted: recent releases exit 0 (no user
//! message, no API call), releases before about 1.0.90 fail with `No messages returned`.
//! Releases before 1.0.59 accept `--permission-prompt-tool` but answer `stdio` with
//! `MCP tool stdio ... not found`: recorded as not supported. `--sdk-url` is probed on its
//! own with a loopback URL: recent releases refuse non-Anthropic hosts by name.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use thiserror::Error;
use tokio::io::AsyncReadExt;

use crate::child::{signal_group, spawn_retrying};
use crate::compat::{self, Flag, FlagProbe, SdkUrl};
pub use crate::installation::Installation;
use ostler_protocol::argv::StreamJsonArgs;
use ostler_protocol::version::{self, ClaudeVersion};

/// How to find and check the binary.
#[derive(Debug, Clone)]
pub struct DiscoverOptions {
    /// A configured path (`--claude PATH`, config file). When set, `PATH` is not searched.
    pub claude_path: Option<PathBuf>,
    /// The search path; `None`: the process's `PATH`.
    pub search_path: Option<OsString>,
    /// Timeout for `claude --version` (1.0.x takes about 2 s of node start-up on an idle
    /// machine, several times that on a loaded one; default 30 s).
    pub version_timeout: Duration,
    /// Probe flags on the binary (see the module docs). Off: the matrix alone decides.
    pub probe_flags: bool,
    /// Timeout of one probe run.
    pub probe_timeout: Duration,
    /// A discovery cache file (see [`crate::discovery_cache`]): what was measured on this
    /// binary before (same path, inode, size, mtime, ctime) is not measured again. `None`:
    /// always measure (`ostler doctor`).
    pub cache: Option<PathBuf>,
}

impl Default for DiscoverOptions {
    fn default() -> Self {
        Self {
            claude_path: None,
            search_path: None,
            version_timeout: Duration::from_secs(30),
            probe_flags: true,
            probe_timeout: Duration::from_secs(15),
            cache: None,
        }
    }
}

#[derive(Debug, Error)]
pub enum DiscoverError {
    #[error("claude CLI not found: {}{}. Install it with `npm install -g @anthropic-ai/claude-code` or set the path explicitly (`--claude PATH`)", describe_search(.configured.as_deref(), .searched), .detail.as_deref().map(|d| format!(" ({d})")).unwrap_or_default())]
    NotFound {
        configured: Option<PathBuf>,
        searched: Vec<PathBuf>,
        detail: Option<String>,
    },
    #[error("cannot execute {path}: {source}")]
    Exec {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("`{} --version` did not answer within {after:?}", .path.display())]
    Timeout { path: PathBuf, after: Duration },
    #[error("`{} --version` failed ({status}): {stderr}", .path.display())]
    Failed {
        path: PathBuf,
        status: String,
        stderr: String,
    },
    #[error("{} is not a recognisable Claude Code: {source}", .path.display())]
    BadVersion {
        path: PathBuf,
        #[source]
        source: version::VersionParseError,
    },
    #[error("{}: {}", .0.path.display(), .0.message)]
    Incompatible(Box<Installation>),
}

fn describe_search(configured: Option<&Path>, searched: &[PathBuf]) -> String {
    match configured {
        Some(p) => format!("nothing executable at the configured path {}", p.display()),
        None if searched.is_empty() => "PATH is empty or unset".to_string(),
        None => format!(
            "no executable `claude` in PATH ({})",
            searched
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(":")
        ),
    }
}

impl DiscoverError {
    /// 72 when no usable binary was found, 78 when the binary found is unusable.
    pub fn exit_code(&self) -> i32 {
        match self {
            DiscoverError::NotFound { .. } | DiscoverError::Exec { .. } => 72,
            DiscoverError::Timeout { .. }
            | DiscoverError::Failed { .. }
            | DiscoverError::BadVersion { .. }
            | DiscoverError::Incompatible(_) => 78,
        }
    }

    /// The installation, when the binary was read but is incompatible.
    pub fn installation(&self) -> Option<&Installation> {
        match self {
            DiscoverError::Incompatible(i) => Some(i),
            _ => None,
        }
    }
}

/// Find the binary, read its version, probe its flags and assess it. With
/// [`DiscoverOptions::cache`], what an earlier call measured on the unchanged binary is
/// used instead of running it (module [`crate::discovery_cache`]); logged at info either way.
/// What was measured is written to the cache before this returns (a usable binary's only:
/// an incompatible one is measured again next time); [`discover_deferring_cache`] leaves
/// the write to the caller.
///
/// `Ok` for every level the daemon runs with (`FullyCompatible`, `LikelyCompatible`,
/// `Degraded`; callers log `message` at warn level unless fully compatible);
/// `Err(Incompatible)` carries the full installation for reporting.
pub async fn discover(opts: &DiscoverOptions) -> Result<Installation, DiscoverError> {
    let (inst, update) = discover_deferring_cache(opts).await?;
    if let Some(u) = update {
        u.write();
    }
    Ok(inst)
}

/// What a discovery measured that its cache file does not hold yet, for the caller to
/// [`write`](Self::write) once it knows it will run (the daemon: after the start-up checks
/// that can still fail, so a start that fails leaves no cache file, nor its directory,
/// behind). Dropped unwritten: the next discovery measures again.
#[derive(Debug)]
#[must_use = "dropped, the measurement is not cached"]
pub struct CacheUpdate {
    cache: PathBuf,
    binary: PathBuf,
    key: crate::discovery_cache::BinaryKey,
    version: ClaudeVersion,
    probe: Option<FlagProbe>,
}

impl CacheUpdate {
    /// Writes it (the directory made 0700 when missing; a failure is logged), if the binary
    /// is still as it was measured: one replaced meanwhile is measured again next time.
    pub fn write(self) {
        if crate::discovery_cache::BinaryKey::of(&self.binary).as_ref() == Some(&self.key) {
            crate::discovery_cache::store(&self.cache, self.key, &self.version, self.probe);
        }
    }
}

/// [`discover()`] without writing the cache: what it would write is returned (`None`:
/// nothing new was measured, or no cache is configured). On `Err` nothing is written.
pub async fn discover_deferring_cache(
    opts: &DiscoverOptions,
) -> Result<(Installation, Option<CacheUpdate>), DiscoverError> {
    let started = std::time::Instant::now();
    let path = find_binary(opts)?;
    let key = opts
        .cache
        .as_ref()
        .and_then(|_| crate::discovery_cache::BinaryKey::of(&path));
    let hit = match (&opts.cache, &key) {
        (Some(cache), Some(key)) => crate::discovery_cache::lookup(cache, key),
        _ => Default::default(),
    };
    let version_cached = hit.version.is_some();
    let ver = match hit.version {
        Some(v) => v,
        None => read_version(&path, opts.version_timeout).await?,
    };
    // A cached probe serves only when probing is on; a version cached without one is
    // probed now.
    let (probe, probe_ran) = match (opts.probe_flags, hit.probe) {
        (false, _) => (None, false),
        (true, Some(p)) => (Some(p), false),
        (true, None) => match probe_flags(&path, opts.probe_timeout).await {
            Ok(p) => (Some(p), true),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "flag probe failed; using the compatibility matrix alone");
                (None, true)
            }
        },
    };
    // Whether the binary was run at all, and whether that taught the cache anything (a
    // failed probe did not: the next start probes again).
    let measured = !version_cached || probe_ran;
    let update = match (&opts.cache, key) {
        (Some(cache), Some(key)) if !version_cached || (probe_ran && probe.is_some()) => {
            Some(CacheUpdate {
                cache: cache.clone(),
                binary: path.clone(),
                key,
                version: ver.clone(),
                probe: probe.clone(),
            })
        }
        _ => None,
    };
    tracing::info!(
        path = %path.display(),
        version = %ver.version,
        probed = probe.is_some(),
        source = if measured { "measured" } else { "cached" },
        elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        "Claude Code discovery {}",
        if measured { "measured" } else { "cached" }
    );
    let a = compat::assess(&ver.version, probe.as_ref());
    let inst = Installation {
        path,
        adapter: ostler_protocol::adapter::select(Some(&ver.version)).name,
        api_date: ver.api_date.clone(),
        level: a.level,
        capabilities: a.capabilities,
        message: a.message,
        degraded: a.degraded,
        version_output: ver_output_line(&ver),
        version: ver.version,
        probe,
    };
    if inst.level.can_run() {
        Ok((inst, update))
    } else {
        Err(DiscoverError::Incompatible(Box::new(inst)))
    }
}

fn ver_output_line(v: &ClaudeVersion) -> String {
    match &v.label {
        Some(l) => format!("{} ({l})", v.version),
        None => v.version.to_string(),
    }
}

/// The configured path if executable, else the first executable `claude` on the search
/// path.
pub fn find_binary(opts: &DiscoverOptions) -> Result<PathBuf, DiscoverError> {
    if let Some(p) = &opts.claude_path {
        return if is_executable(p) {
            // Sessions start in their own cwd: a relative path is made absolute here,
            // against the daemon's (as `sessions.allowed_roots` are).
            Ok(std::path::absolute(p).unwrap_or_else(|_| p.clone()))
        } else {
            Err(DiscoverError::NotFound {
                configured: Some(p.clone()),
                searched: vec![p.clone()],
                detail: Some(if p.exists() {
                    "not an executable file".into()
                } else {
                    "no such file".into()
                }),
            })
        };
    }
    let path_var = opts
        .search_path
        .clone()
        .or_else(|| std::env::var_os("PATH"))
        .unwrap_or_default();
    let dirs: Vec<PathBuf> = std::env::split_paths(&path_var)
        .filter(|d| !d.as_os_str().is_empty())
        .collect();
    for d in &dirs {
        let candidate = d.join("claude");
        if is_executable(&candidate) {
            return Ok(std::path::absolute(&candidate).unwrap_or(candidate));
        }
    }
    Err(DiscoverError::NotFound {
        configured: None,
        searched: dirs,
        detail: None,
    })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Output of a short-lived helper run.
struct Captured {
    status: std::process::ExitStatus,
    stdout: String,
    stderr: String,
}

/// Run `path args` in its own process group with stdin at EOF; on timeout kill the whole
/// group (a hung script's children too) and return `None`.
async fn run_captured(
    path: &Path,
    args: &[&str],
    env: Option<&[(&str, &str)]>,
    cwd: Option<&Path>,
    timeout: Duration,
) -> std::io::Result<Option<Captured>> {
    let mut cmd = tokio::process::Command::new(path);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    if let Some(env) = env {
        cmd.env_clear();
        for (k, v) in env {
            cmd.env(k, v);
        }
    }
    if let Some(cwd) = cwd {
        cmd.current_dir(cwd);
    }
    let mut child = spawn_retrying(&mut cmd).await?;
    let pid = child.id();
    // However this ends (done, timed out, or the caller dropped it: the daemon told to
    // stop meanwhile), the helper's whole process group goes: a hung script's children too.
    let _group = GroupGuard(pid);
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let work = async {
        let mut so = Vec::new();
        let mut se = Vec::new();
        let read_out = async {
            if let Some(o) = out.as_mut() {
                // Bounded: a garbage-spewing binary must not eat memory.
                let _ = o.take(1 << 20).read_to_end(&mut so).await;
            }
        };
        let read_err = async {
            if let Some(e) = err.as_mut() {
                let _ = e.take(1 << 20).read_to_end(&mut se).await;
            }
        };
        let ((), ()) = tokio::join!(read_out, read_err);
        let status = child.wait().await?;
        std::io::Result::Ok(Captured {
            status,
            stdout: String::from_utf8_lossy(&so).into_owned(),
            stderr: String::from_utf8_lossy(&se).into_owned(),
        })
    };
    match tokio::time::timeout(timeout, work).await {
        // Children that outlived the leader (none expected) go with the guard too.
        Ok(r) => r.map(Some),
        Err(_) => Ok(None),
    }
}

/// Kills a helper's process group (SIGKILL) when dropped.
struct GroupGuard(Option<u32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            crate::proctree::unregister(pid);
            signal_group(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Run `claude --version` and parse it.
pub async fn read_version(path: &Path, timeout: Duration) -> Result<ClaudeVersion, DiscoverError> {
    let cap = run_captured(path, &["--version"], None, None, timeout)
        .await
        .map_err(|source| exec_error(path, source))?
        .ok_or_else(|| DiscoverError::Timeout {
            path: path.to_path_buf(),
            after: timeout,
        })?;
    if !cap.status.success() {
        return Err(DiscoverError::Failed {
            path: path.to_path_buf(),
            status: cap.status.to_string(),
            stderr: tail(&cap.stderr, 500),
        });
    }
    version::parse(&cap.stdout).map_err(|source| DiscoverError::BadVersion {
        path: path.to_path_buf(),
        source,
    })
}

fn exec_error(path: &Path, source: std::io::Error) -> DiscoverError {
    if source.kind() == std::io::ErrorKind::NotFound {
        DiscoverError::NotFound {
            configured: Some(path.to_path_buf()),
            searched: vec![path.to_path_buf()],
            detail: Some(source.to_string()),
        }
    } else {
        DiscoverError::Exec {
            path: path.to_path_buf(),
            source,
        }
    }
}

fn tail(s: &str, max: usize) -> String {
    let s = s.trim();
    if s.len() <= max {
        return s.to_string();
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_string()
}

/// Errors of [`probe_flags`].
#[derive(Debug, Error)]
pub enum ProbeError {
    #[error("cannot run the probe: {0}")]
    Io(#[from] std::io::Error),
    #[error("probe timed out after {0:?}")]
    Timeout(Duration),
    #[error("probe failed ({status}): {stderr}")]
    Failed { status: String, stderr: String },
}

/// Which of [`Flag::ALL`] the binary accepts (method: module docs).
pub async fn probe_flags(path: &Path, timeout: Duration) -> Result<FlagProbe, ProbeError> {
    let home = tempfile::Builder::new().prefix("ostler-probe-").tempdir()?;
    let home_s = home.path().to_string_lossy().into_owned();
    let path_var = std::env::var("PATH").unwrap_or_default();
    let compile_cache = std::env::var("NODE_COMPILE_CACHE").ok();
    let mut env: Vec<(&str, &str)> = vec![
        ("HOME", &home_s),
        ("PATH", &path_var),
        ("ANTHROPIC_API_KEY", "ostler-probe"),
        // Port 9 (discard) on loopback: nothing listens, nothing leaves the machine.
        ("ANTHROPIC_BASE_URL", "http://127.0.0.1:9"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("DISABLE_AUTOUPDATER", "1"),
    ];
    // The operator's Node compile cache (see the session allowlist): the probe starts the
    // binary several times.
    if let Some(dir) = &compile_cache {
        env.push(("NODE_COMPILE_CACHE", dir));
    }
    let base_args = StreamJsonArgs::base();
    let base = base_args.as_slice();
    let run = |flags: Vec<Flag>| {
        let env = env.clone();
        let home = home.path().to_path_buf();
        async move {
            let mut args: Vec<&str> = base.iter().map(String::as_str).collect();
            for f in &flags {
                args.push(f.as_arg());
                if let Some(v) = f.probe_value() {
                    args.push(v);
                }
            }
            run_captured(path, &args, Some(&env), Some(&home), timeout)
                .await?
                .ok_or(ProbeError::Timeout(timeout))
        }
    };

    // `--sdk-url` on its own, concurrently with the elimination loop.
    let (flags, sdk) = tokio::join!(
        async {
            let mut probe = FlagProbe::default();
            let mut remaining: Vec<Flag> = Flag::ALL
                .into_iter()
                .filter(|f| *f != Flag::SdkUrl)
                .collect();
            loop {
                let cap = match run(remaining.clone()).await {
                    Ok(cap) => cap,
                    // Still running with stdin at EOF: the options were parsed and accepted.
                    Err(ProbeError::Timeout(_)) => {
                        for f in remaining {
                            probe.accepted.insert(f, true);
                        }
                        break;
                    }
                    Err(e) => return Err(e),
                };
                let all = format!("{}\n{}", cap.stderr, cap.stdout);
                if all.contains(STDIO_TOOL_MISSING)
                    && remaining.contains(&Flag::PermissionPromptTool)
                {
                    // The flag exists but only names an MCP tool: `stdio` is not supported.
                    probe.accepted.insert(Flag::PermissionPromptTool, false);
                    remaining.retain(|x| *x != Flag::PermissionPromptTool);
                    continue;
                }
                match unknown_option(&all) {
                    Some(opt) => match Flag::from_arg(opt).filter(|f| remaining.contains(f)) {
                        Some(f) => {
                            probe.accepted.insert(f, false);
                            remaining.retain(|x| *x != f);
                        }
                        None => {
                            // A base option (`--input-format`) is unknown: no stream-json input at
                            // all, so nothing ostler needs works.
                            for f in Flag::ALL {
                                probe.accepted.insert(f, false);
                            }
                            probe.sdk_url = SdkUrl::Unknown;
                            probe.note = Some(format!("refuses {opt}"));
                            return Ok::<_, ProbeError>(probe);
                        }
                    },
                    // Options are validated before anything runs: any other outcome (exit 0, or an
                    // error such as "No messages returned" from releases that fail on empty input)
                    // means every remaining flag was accepted.
                    None => {
                        for f in remaining {
                            probe.accepted.insert(f, true);
                        }
                        break;
                    }
                }
            }

            Ok::<_, ProbeError>(probe)
        },
        run(vec![Flag::SdkUrl])
    );
    let mut probe = flags?;
    if probe.note.is_some() {
        return Ok(probe);
    }
    probe.sdk_url = match sdk {
        Ok(cap) => classify_sdk_url(&cap.stderr, &cap.stdout),
        // Trying to connect to a dead loopback port until the timeout: accepted.
        Err(ProbeError::Timeout(_)) => SdkUrl::Loopback,
        Err(e) => return Err(e),
    };
    probe
        .accepted
        .insert(Flag::SdkUrl, !matches!(probe.sdk_url, SdkUrl::Absent));
    Ok(probe)
}

/// What releases before 1.0.59 say to `--permission-prompt-tool stdio`.
const STDIO_TOOL_MISSING: &str = "MCP tool stdio (passed via --permission-prompt-tool) not found";

fn classify_sdk_url(stderr: &str, stdout: &str) -> SdkUrl {
    let all = format!("{stderr}\n{stdout}");
    if unknown_option(&all) == Some("--sdk-url") {
        SdkUrl::Absent
    } else if all.contains("--sdk-url rejected") || all.contains("not an approved") {
        SdkUrl::AnthropicOnly
    } else {
        SdkUrl::Loopback
    }
}

/// `error: unknown option '--x'` -> `--x`.
fn unknown_option(stderr: &str) -> Option<&str> {
    let i = stderr.find("unknown option '")?;
    let rest = &stderr[i + "unknown option '".len()..];
    let end = rest.find('\'')?;
    let opt = &rest[..end];
    Some(opt.split('=').next().unwrap_or(opt))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_option_parsing() {
        assert_eq!(
            unknown_option("error: unknown option '--include-partial-messages'\n"),
            Some("--include-partial-messages")
        );
        assert_eq!(unknown_option("error: unknown option '--x=1'"), Some("--x"));
        assert_eq!(unknown_option("all good"), None);
    }

    /// A relative configured path is made absolute against the daemon's cwd: sessions
    /// start in their own cwd, where it would name nothing.
    #[test]
    fn a_relative_binary_path_is_made_absolute() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tmp");
        let exe = dir.path().join("claude");
        std::fs::write(&exe, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let cwd = std::env::current_dir().expect("cwd");
        let mut relative = PathBuf::new();
        for _ in cwd.components().skip(1) {
            relative.push("..");
        }
        relative.push(exe.strip_prefix("/").expect("absolute"));
        assert!(relative.is_relative());
        let found = find_binary(&DiscoverOptions {
            claude_path: Some(relative),
            ..Default::default()
        })
        .expect("found");
        assert!(found.is_absolute(), "{}", found.display());
        assert!(is_executable(&found));
    }

    #[test]
    fn sdk_url_classification() {
        assert_eq!(
            classify_sdk_url("error: unknown option '--sdk-url'", ""),
            SdkUrl::Absent
        );
        assert_eq!(
            classify_sdk_url(
                "Error: --sdk-url rejected: host \"127.0.0.1\" is not an approved Anthropic endpoint.",
                ""
            ),
            SdkUrl::AnthropicOnly
        );
        assert_eq!(classify_sdk_url("", ""), SdkUrl::Loopback);
    }
}
