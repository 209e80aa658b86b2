//! The command of a session process: its argv (written by [`ostler_protocol::argv`]; what
//! a release supports decides which options go in), its environment and process mark, and
//! the parent-death signal.

use std::ffi::OsString;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};

use ostler_protocol::argv::{FORK_SESSION, INCLUDE_PARTIAL_MESSAGES, MAX_TURNS, StreamJsonArgs};
use ostler_protocol::outbound::{InitializeRequest, OutRequest};

use super::error::{Error, Result};
use super::types::{SpawnOptions, SupervisorOptions};
use crate::env::build_env;
use crate::installation::Installation;

/// The command line for a session (without the program).
pub fn session_args(inst: &Installation, opts: &SpawnOptions) -> Result<Vec<String>> {
    let caps = &inst.capabilities;
    if !caps.stdio_permission_prompt {
        return Err(Error::Incompatible {
            version: inst.version.clone(),
            message: inst.message.clone(),
        });
    }
    let mut a = StreamJsonArgs::session();
    if opts.include_partial_messages {
        if caps.include_partial_messages {
            a.flag(INCLUDE_PARTIAL_MESSAGES);
        } else {
            tracing::warn!(session = %opts.log_id, version = %inst.version, "--include-partial-messages not supported: running without it (no token streaming)");
        }
    }
    a.option_if("--model", opts.model.as_deref())
        .option_if("--permission-mode", opts.permission_mode.as_deref())
        .option_if(
            "--append-system-prompt",
            opts.append_system_prompt.as_deref(),
        );
    if let Some(n) = opts.max_turns {
        if caps.max_turns {
            a.option(MAX_TURNS, n.to_string());
        } else {
            tracing::warn!(session = %opts.log_id, version = %inst.version, "--max-turns not supported: running without a turn limit");
        }
    }
    if let Some(r) = &opts.resume {
        if r.is_empty() || r.starts_with('-') {
            return Err(Error::InvalidOptions(format!(
                "bad session id to resume: {r:?}"
            )));
        }
        a.option("--resume", r.as_str());
    }
    if opts.fork_session {
        if opts.resume.is_none() {
            return Err(Error::InvalidOptions("fork_session needs resume".into()));
        }
        if !caps.fork_session {
            return Err(Error::Unsupported {
                flag: FORK_SESSION,
                version: inst.version.clone(),
            });
        }
        a.flag(FORK_SESSION);
    }
    // Variadic flags last: each takes exactly the values that follow it up to the next
    // option, so they go after every other option with a value.
    for (flag, tools) in [
        ("--allowedTools", &opts.allowed_tools),
        ("--disallowedTools", &opts.disallowed_tools),
    ] {
        if let Some(bad) = tools.iter().find(|t| t.is_empty() || t.starts_with('-')) {
            return Err(Error::InvalidOptions(format!("bad tool rule {bad:?}")));
        }
        a.values(flag, tools);
    }
    Ok(a.into_args())
}

/// The `initialize` request sent at spawn, or `None` on a release that does not answer it
/// (measured `no_answer` / `unsupported`: 1.0.58 and 1.0.59); such a session goes without
/// (its `system/init` still says what it runs with). An unmeasured release is asked: an
/// `initialize` it ignores only times out, in the background.
///
/// The request's fields are built here from the session's options: issue 11 adds the
/// hooks and SDK MCP servers to this [`InitializeRequest`].
pub(super) fn initialize_request(inst: &Installation, opts: &SpawnOptions) -> Option<OutRequest> {
    let support = inst.capabilities.control_support("initialize");
    if !support.served() {
        tracing::debug!(session = %opts.log_id, version = %inst.version, support = support.as_str(), "not sending initialize: this release does not answer it");
        return None;
    }
    Some(InitializeRequest::default().into_request())
}

/// Spawns of this process so far: makes each session process's mark unique.
static SPAWNS: AtomicU64 = AtomicU64::new(0);

/// The command for a session process with `args`, and the process mark it carries
/// ([`crate::proctree::MARK_VAR`]).
pub(super) fn command(
    inst: &Installation,
    opts: &SpawnOptions,
    sup: &SupervisorOptions,
    args: &[String],
) -> (tokio::process::Command, String) {
    let mut env = build_env(
        std::env::vars_os(),
        &sup.env_allowlist,
        &sup.scrub,
        &opts.env,
    );
    let mark = format!(
        "{}/{}/{}",
        sup.process_tag,
        opts.log_id,
        SPAWNS.fetch_add(1, Ordering::Relaxed)
    );
    env.push((
        OsString::from(crate::proctree::MARK_VAR),
        OsString::from(&mark),
    ));
    let mut cmd = tokio::process::Command::new(&inst.path);
    cmd.args(args)
        .current_dir(&opts.cwd)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k as &OsString, v as &OsString)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    let parent = std::process::id();
    #[allow(unsafe_code)]
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe functions may be called. It calls prctl(2) and getppid(2),
    // both plain system calls, touches no locks, does not allocate (the error values
    // are built from raw errno), and captures only a `u32` by copy.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before prctl took effect: do not run orphaned.
            if libc::getppid() as u32 != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    (cmd, mark)
}
