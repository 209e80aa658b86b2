//! Running the real CLI in a hermetic environment.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Mutex, OnceLock};

use crate::{Error, Result};

/// Optional flags a release may or may not accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CliFeatures {
    pub include_partial_messages: bool,
    pub fork_session: bool,
    pub replay_user_messages: bool,
}

/// The optional flags of `release` (its `binary`): from its measured evidence,
/// `contracts/compat/<release>.toml` (what `cargo xtask compat probe` found by passing each
/// flag to the release, the facts the daemon's matrix is generated from), or, for a release
/// with no evidence yet (one being recorded for the first time), from `claude --help`.
///
/// The evidence saves a CLI start per release and test process: `--help` costs a
/// node-based release 2-3 CPU-seconds (measured, 2 cores), and the live contract check
/// started one for each of the 14 pinned releases. A wrong fact would not go unnoticed:
/// the recordings were made with these flags, and the live check compares with them.
pub fn features_of(release: &str, binary: &Path) -> Result<CliFeatures> {
    match measured_features(
        &crate::workspace_root()
            .join("contracts/compat")
            .join(format!("{release}.toml")),
    ) {
        Some(f) => Ok(f),
        None => features(binary),
    }
}

/// The three flags from a release's evidence file; `None` when the file or one of them is
/// missing.
fn measured_features(evidence: &Path) -> Option<CliFeatures> {
    let text = std::fs::read_to_string(evidence).ok()?;
    let ev: toml::Table = toml::from_str(&text).ok()?;
    Some(CliFeatures {
        include_partial_messages: ev.get("include_partial_messages")?.as_bool()?,
        fork_session: ev.get("fork_session")?.as_bool()?,
        replay_user_messages: ev
            .get("options")?
            .get("--replay-user-messages")?
            .as_bool()?,
    })
}

/// Detect the optional flags of a binary from `claude --help` (cached per path): the
/// fallback of [`features_of`].
fn features(binary: &Path) -> Result<CliFeatures> {
    static CACHE: OnceLock<Mutex<HashMap<PathBuf, CliFeatures>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(f) = cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(binary)
        .copied()
    {
        return Ok(f);
    }
    let home = tempfile::tempdir().map_err(|e| Error::io(Path::new("tempdir"), e))?;
    let out = std::process::Command::new(binary)
        .arg("--help")
        .env_clear()
        .envs(base_env(home.path()))
        .output()
        .map_err(|e| Error::io(binary, e))?;
    let help = String::from_utf8_lossy(&out.stdout);
    let f = CliFeatures {
        include_partial_messages: help.contains("--include-partial-messages"),
        fork_session: help.contains("--fork-session"),
        replay_user_messages: help.contains("--replay-user-messages"),
    };
    cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(binary.to_path_buf(), f);
    Ok(f)
}

/// PATH (with node's directory), HOME and `NODE_COMPILE_CACHE` when set: the environment
/// every CLI run starts from.
fn base_env(home: &Path) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
    env.insert("PATH".to_string(), path);
    // Where Node 22 keeps the code it compiled (`cargo xtask test` sets it): it changes how
    // fast a node-based release starts, nothing of what it does.
    if let Ok(cache) = std::env::var("NODE_COMPILE_CACHE") {
        env.insert("NODE_COMPILE_CACHE".to_string(), cache);
    }
    env.insert("HOME".to_string(), home.display().to_string());
    env.insert(
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC".to_string(),
        "1".to_string(),
    );
    env
}

/// What to run.
#[derive(Debug, Clone, Default)]
pub struct CliInvocation {
    pub partial_messages: bool,
    pub model: Option<String>,
    pub permission_mode: Option<String>,
    pub resume: Option<String>,
    pub fork_session: bool,
    /// `--resume-session-at` (with `resume`): where the resumed conversation ends.
    pub resume_session_at: Option<String>,
    /// Extra environment (e.g. `CLAUDE_CODE_MAX_RETRIES`), set after the hermetic base.
    pub env: BTreeMap<String, String>,
    /// Extra arguments, appended as given.
    pub args: Vec<String>,
}

/// The argument list for an invocation, dropping flags the release lacks. Returns
/// `(args, unsupported flags that were left out)`.
pub fn args_for(inv: &CliInvocation, f: CliFeatures) -> (Vec<String>, Vec<String>) {
    use ostler_protocol::argv::{
        FORK_SESSION, INCLUDE_PARTIAL_MESSAGES, RESUME_SESSION_AT, StreamJsonArgs,
    };
    let mut args = StreamJsonArgs::session();
    let mut omitted = Vec::new();
    if inv.partial_messages {
        if f.include_partial_messages {
            args.flag(INCLUDE_PARTIAL_MESSAGES);
        } else {
            omitted.push(INCLUDE_PARTIAL_MESSAGES.into());
        }
    }
    args.option_if("--model", inv.model.as_deref())
        .option_if("--permission-mode", inv.permission_mode.as_deref());
    if let Some(r) = &inv.resume {
        args.option("--resume", r.as_str());
        if inv.fork_session {
            if f.fork_session {
                args.flag(FORK_SESSION);
            } else {
                omitted.push(FORK_SESSION.into());
            }
        }
        // Hidden from `--help` on every release that has it: the scenario says when to use it
        // (`if_release`, from the measured dialect in contracts/compat).
        if let Some(at) = &inv.resume_session_at {
            args.option(RESUME_SESSION_AT, at.as_str());
        }
    }
    let mut args = args.into_args();
    args.extend(inv.args.iter().cloned());
    (args, omitted)
}

/// A hermetic environment: fresh HOME and cwd under one temp root.
#[derive(Debug)]
pub struct Hermetic {
    root: tempfile::TempDir,
    home: PathBuf,
    cwd: PathBuf,
}

impl Hermetic {
    pub fn new() -> Result<Self> {
        let root = tempfile::Builder::new()
            .prefix("ostler-cc-")
            .tempdir()
            .map_err(|e| Error::io(Path::new("tempdir"), e))?;
        let base = root
            .path()
            .canonicalize()
            .map_err(|e| Error::io(root.path(), e))?;
        let home = base.join("home");
        let cwd = base.join("cwd");
        for d in [&home, &cwd] {
            std::fs::create_dir_all(d).map_err(|e| Error::io(d, e))?;
        }
        Ok(Self { root, home, cwd })
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }
    pub fn home(&self) -> &Path {
        &self.home
    }
    pub fn cwd(&self) -> &Path {
        &self.cwd
    }

    /// A command for `binary` with `args`: env cleared except PATH, HOME, the fake server
    /// URL, a test API key and `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1` (so inherited
    /// `CLAUDECODE` / `CLAUDE_CODE_*` are gone), run in the cwd, all stdio piped, killed
    /// when dropped.
    pub fn command(
        &self,
        binary: &Path,
        args: &[String],
        base_url: &str,
        extra_env: &BTreeMap<String, String>,
    ) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(binary);
        cmd.args(args)
            .current_dir(&self.cwd)
            .env_clear()
            .envs(base_env(&self.home))
            .env("ANTHROPIC_BASE_URL", base_url)
            .env("ANTHROPIC_API_KEY", "test")
            .envs(extra_env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        cmd
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pinned_release_has_its_flags_in_its_evidence() {
        let dir = crate::workspace_root().join("contracts/compat");
        let mut read = 0;
        for entry in std::fs::read_dir(&dir).expect("contracts/compat") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "toml") {
                assert!(measured_features(&path).is_some(), "{}", path.display());
                read += 1;
            }
        }
        assert!(read >= 14, "{read} evidence files");
        // The boundaries: 1.0.59 has none of the three, 2.1.332 all of them.
        let of = |r: &str| measured_features(&dir.join(format!("{r}.toml"))).expect(r);
        assert_eq!(of("1.0.59"), CliFeatures::default());
        assert_eq!(
            of("2.1.332"),
            CliFeatures {
                include_partial_messages: true,
                fork_session: true,
                replay_user_messages: true,
            }
        );
        assert_eq!(measured_features(&dir.join("0.0.1.toml")), None);
    }
}
