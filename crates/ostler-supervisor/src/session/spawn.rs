//! The command of a session process: its argv (written by [`ostler_protocol::argv`]; what
//! a release supports decides which options go in), its environment and process mark, and
//! the parent-death signal.

use std::ffi::OsString;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};

use ostler_protocol::argv::{
    FORK_SESSION, INCLUDE_PARTIAL_MESSAGES, MAX_TURNS, RESUME_DROPS_TURN, RESUME_SESSION_AT,
    StreamJsonArgs,
};
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
    let cli = &opts.cli;
    if let Some(&(flag, _)) = cli.unsupported_by(caps).first() {
        return Err(Error::Unsupported {
            flag,
            version: inst.version.clone(),
        });
    }
    cli.validate()
        .map_err(|e| Error::InvalidOptions(e.to_string()))?;
    let mut a = StreamJsonArgs::session();
    if opts.include_partial_messages {
        if caps.include_partial_messages {
            a.flag(INCLUDE_PARTIAL_MESSAGES);
        } else {
            tracing::warn!(session = %opts.log_id, version = %inst.version, "--include-partial-messages not supported: running without it (no token streaming)");
        }
    }
    // The CLI's echo of each message it takes says which turn answers it (results name it
    // from 2.1.330 on; earlier releases only echo).
    if caps.accepts_option(crate::compat::REPLAY_USER_MESSAGES) == Some(true) {
        a.flag(crate::compat::REPLAY_USER_MESSAGES);
    }
    a.option_if("--model", cli.model.as_deref())
        .option_if("--permission-mode", cli.permission_mode.as_deref())
        .option_if("--system-prompt", cli.system_prompt.as_deref())
        .option_if(
            "--append-system-prompt",
            cli.append_system_prompt.as_deref(),
        )
        .option_if("--fallback-model", cli.fallback_model.as_deref())
        .option_if("--settings", cli.settings.as_deref())
        .option_if("--managed-settings", cli.managed_settings.as_deref())
        .option_if("--agents", cli.agents.as_deref())
        .option_if("--json-schema", cli.json_schema.as_deref())
        .option_if("--tools", cli.tools.as_deref())
        .option_if("--agent", cli.agent.as_deref())
        .option_if("--effort", cli.effort.as_deref())
        .option_if("--permission-prompts", cli.permission_prompts.as_deref())
        .option_if("--thinking", cli.thinking.as_deref())
        .option_if("--thinking-display", cli.thinking_display.as_deref())
        .option_if("--project-config-root", cli.project_config_root.as_deref());
    if let Some(b) = cli.max_budget_usd {
        a.option("--max-budget-usd", b.to_string());
    }
    if let Some(n) = cli.max_thinking_tokens {
        a.option("--max-thinking-tokens", n.to_string());
    }
    if let Some(n) = cli.task_budget_tokens {
        a.option("--task-budget", n.to_string());
    }
    if !cli.setting_sources.is_empty() {
        a.option("--setting-sources", cli.setting_sources.join(","));
    } else if cli.no_setting_sources {
        // One argument: every release with the flag reads "" as no source (1.0.128,
        // 2.0.77, 2.1.0, 2.1.332: `if (value === "") return []`).
        a.flag("--setting-sources=");
    }
    if cli.strict_mcp_config {
        a.flag("--strict-mcp-config");
    }
    if cli.include_hook_events {
        a.flag("--include-hook-events");
    }
    if cli.allow_dangerously_skip_permissions {
        a.flag("--allow-dangerously-skip-permissions");
    }
    if !cli.betas.is_empty() {
        a.option("--betas", cli.betas.join(","));
    }
    if cli.debug {
        // The CLI's logger reads the filter only in the `--debug=<filter>` form (one
        // argument); `--debug-file` alone turns debug on.
        match &cli.debug_filter {
            Some(f) => {
                a.flag(&format!("--debug={f}"));
            }
            None if cli.debug_file.is_none() => {
                a.flag("--debug");
            }
            None => {}
        }
        if let Some(path) = &cli.debug_file {
            a.option("--debug-file", path.as_str());
        }
    }
    if let Some(n) = cli.max_turns {
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
    if let Some(at) = &opts.resume_session_at {
        if opts.resume.is_none() {
            return Err(Error::InvalidOptions(
                "resume_session_at needs resume".into(),
            ));
        }
        if at.is_empty() || at.starts_with('-') {
            return Err(Error::InvalidOptions(format!(
                "bad message to resume at: {}",
                crate::options::shown(at)
            )));
        }
        a.option(RESUME_SESSION_AT, at.as_str());
    }
    if let Some(turn) = &opts.resume_drops_turn {
        if opts.resume_session_at.is_none() {
            return Err(Error::InvalidOptions(
                "resume_drops_turn needs resume_session_at".into(),
            ));
        }
        if turn.is_empty() || turn.starts_with('-') {
            return Err(Error::InvalidOptions(format!(
                "bad turn to drop: {}",
                crate::options::shown(turn)
            )));
        }
        if caps.accepts_option(RESUME_DROPS_TURN) == Some(false) {
            return Err(Error::Unsupported {
                flag: RESUME_DROPS_TURN,
                version: inst.version.clone(),
            });
        }
        a.option(RESUME_DROPS_TURN, turn.as_str());
    }
    // Variadic flags last: each takes exactly the values that follow it up to the next
    // option, so they go after every other option with a value (every value was checked
    // not to start with `-`).
    a.values("--add-dir", &cli.add_dirs);
    for p in &cli.plugin_dirs {
        a.option("--plugin-dir", p);
    }
    if let Some(config) = cli.mcp_config_json() {
        a.values("--mcp-config", &[config]);
    }
    a.values("--allowedTools", &cli.allowed_tools_with_skills())
        .values("--disallowedTools", &cli.disallowed_tools);
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
    Some(
        InitializeRequest {
            hooks: ostler_protocol::hooks::initialize_hooks(&opts.cli.hooks),
            prompt_suggestions: opts.cli.prompt_suggestions,
            skills: opts.cli.skills_field(),
            plan_mode_instructions: opts.cli.plan_mode_instructions.clone(),
            tool_aliases: (!opts.cli.tool_aliases.is_empty()).then(|| {
                opts.cli
                    .tool_aliases
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone().into()))
                    .collect()
            }),
            exclude_dynamic_sections: opts.cli.exclude_dynamic_sections,
            forward_subagent_text: opts.cli.forward_subagent_text,
            per_task_stop_affordance: opts.cli.per_task_stop_affordance,
            agent_progress_summaries: opts.cli.agent_progress_summaries,
            dialog_kinds: opts.cli.dialog_kinds.clone(),
            // A release that ignores the field does not get it: the title is ostler's own
            // too, so the session runs without the CLI knowing it.
            title: opts
                .title
                .clone()
                .filter(|_| inst.capabilities.init_fields.get("title") != Some(&false)),
            ..Default::default()
        }
        .into_request(),
    )
}

/// Flags whose value can hold secrets (MCP servers' `env` and `headers`, credentials in
/// their urls; the settings' `env`, `apiKeyHelper`): a command line is readable by every
/// local user (`/proc/PID/cmdline`, `ps`). Their inline JSON goes to the CLI as a path,
/// `/dev/fd/N`, of a memory file the CLI inherits ([`private_values`]); every release reads
/// both flags from a file (1.0.128, 2.0.77, 2.1.332 checked). `--managed-settings` takes
/// JSON only (2.1.x), so it stays inline: it holds permission rules, which restrict.
const PRIVATE_VALUES: [&str; 2] = ["--settings", "--mcp-config"];

/// Moves the inline JSON values of [`PRIVATE_VALUES`] in `args` into memory files
/// (`memfd_create`, close-on-exec in the daemon) and puts `/dev/fd/N` in their place: the
/// returned descriptors, made inheritable in the child only ([`command`]'s `pre_exec`).
/// Only the owner of a process (and root) can open its `/dev/fd`. A value that cannot be
/// moved (no memfd) stays inline, with a warning.
fn private_values(log_id: &str, args: &mut [String]) -> Vec<std::os::fd::OwnedFd> {
    use nix::sys::memfd::{MFdFlags, memfd_create};
    let mut fds = Vec::new();
    for i in 1..args.len() {
        // Inline JSON, also after blanks (the CLI takes ` {...}` as JSON too).
        if !PRIVATE_VALUES.contains(&args[i - 1].as_str()) || !args[i].trim_start().starts_with('{')
        {
            continue;
        }
        let made = memfd_create(c"ostler-session-option", MFdFlags::MFD_CLOEXEC)
            .map_err(std::io::Error::from)
            .and_then(|fd| {
                let mut f = std::fs::File::from(fd);
                std::io::Write::write_all(&mut f, args[i].as_bytes())?;
                Ok(std::os::fd::OwnedFd::from(f))
            });
        match made {
            Ok(fd) => {
                use std::os::fd::AsRawFd;
                args[i] = format!("/dev/fd/{}", fd.as_raw_fd());
                fds.push(fd);
            }
            Err(e) => {
                tracing::warn!(session = %log_id, flag = %args[i - 1], error = %e, "cannot pass the option in a memory file: it goes on the command line, readable by other local users");
            }
        }
    }
    fds
}

/// Spawns of this process so far: makes each session process's mark unique.
static SPAWNS: AtomicU64 = AtomicU64::new(0);

/// The environment of a session's CLI (without the process mark): the daemon's own
/// variables the allowlist lets through, then `spawn_env` (the daemon's `[sessions.env]`),
/// then the session's own variables (they win), then the variables of the session's
/// AskUserQuestion options (`question_*`; `CliOptions::validate` refuses an `env` entry
/// that contradicts one).
fn child_env(
    spawn_env: &[(String, String)],
    cli: &crate::options::CliOptions,
    sup: &SupervisorOptions,
) -> Vec<(OsString, OsString)> {
    let session: Vec<(String, String)> = spawn_env
        .iter()
        .cloned()
        .chain(cli.env.iter().map(|(k, v)| (k.clone(), v.clone())))
        .chain(
            cli.question_env()
                .into_iter()
                .map(|(k, v, _)| (k.to_string(), v)),
        )
        .collect();
    build_env(
        std::env::vars_os(),
        &sup.env_allowlist,
        &sup.scrub,
        &session,
    )
}

/// What [`SessionProcess::spawn`](super::SessionProcess::spawn) would refuse of a session's
/// options and environment before starting anything, beyond the flags a release lacks
/// ([`session_args`]): for callers that record a session before it starts and want to
/// refuse it first. Today: bypassing permissions as root outside a sandbox.
pub fn check_start(
    inst: &Installation,
    cli: &crate::options::CliOptions,
    spawn_env: &[(String, String)],
    sup: &SupervisorOptions,
) -> Result<()> {
    let env = child_env(spawn_env, cli, sup);
    refuse_root_bypass(&inst.version, cli, &env, nix::unistd::getuid().as_raw())
}

/// Refuses a session the CLI would refuse to start: one that may bypass permissions
/// (`permission_mode` `bypassPermissions` or `allow_dangerously_skip_permissions`) while
/// the daemon, and so the CLI, runs as root outside a declared sandbox. Every release
/// prints "--dangerously-skip-permissions cannot be used with root/sudo privileges" and
/// exits 1 then. A declared sandbox is `IS_SANDBOX` in the session's environment (exactly
/// `1` from 2.0.77 on, any value before) or `CLAUDE_CODE_BUBBLEWRAP` (2.0.77 on; taken as
/// set when not empty, so a value a release reads differently is left to the CLI).
fn refuse_root_bypass(
    version: &semver::Version,
    cli: &crate::options::CliOptions,
    env: &[(OsString, OsString)],
    uid: u32,
) -> Result<()> {
    let bypass = cli.permission_mode.as_deref() == Some("bypassPermissions")
        || cli.allow_dangerously_skip_permissions;
    if !bypass || uid != 0 {
        return Ok(());
    }
    let var = |name: &str| {
        env.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_os_str())
            .filter(|v| !v.is_empty())
    };
    let strict = *version >= semver::Version::new(2, 0, 77);
    let sandbox = match var("IS_SANDBOX") {
        Some(v) => !strict || v == "1",
        None => false,
    };
    let bubblewrap = strict && var("CLAUDE_CODE_BUBBLEWRAP").is_some();
    if sandbox || bubblewrap {
        return Ok(());
    }
    let which = if cli.permission_mode.as_deref() == Some("bypassPermissions") {
        "permission_mode bypassPermissions"
    } else {
        "allow_dangerously_skip_permissions"
    };
    Err(Error::RootBypass {
        which,
        version: version.clone(),
    })
}

/// The command for a session process with `args`, and the process mark it carries
/// ([`crate::proctree::MARK_VAR`]); refused before anything is created when the CLI would
/// refuse to start ([`refuse_root_bypass`]).
pub(super) fn command(
    inst: &Installation,
    opts: &SpawnOptions,
    sup: &SupervisorOptions,
    mut args: Vec<String>,
) -> Result<(tokio::process::Command, String)> {
    let mut env = child_env(&opts.env, &opts.cli, sup);
    refuse_root_bypass(
        &inst.version,
        &opts.cli,
        &env,
        nix::unistd::getuid().as_raw(),
    )?;
    let private = private_values(&opts.log_id, &mut args);
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
    // The session's cgroup (when used): its `cgroup.procs`, opened here, written by the
    // child before exec so that nothing the CLI starts is ever outside it.
    let cgroup_procs = sup.cgroups.as_ref().and_then(|cg| {
        cg.prepare(&mark)
            .map_err(|e| {
                tracing::warn!(session = %opts.log_id, error = %e, "cannot create the session's cgroup; its processes are tracked without one");
            })
            .ok()
    });
    #[allow(unsafe_code)]
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe functions may be called. It calls write(2), fcntl(2), prctl(2) and
    // getppid(2), all plain system calls, touches no locks, does not allocate (the error
    // values are built from raw errno), and captures a `u32` by copy and `OwnedFd`s the
    // parent keeps open until the `Command` drops (close-on-exec: the CLI inherits only
    // the `private` ones, whose flag the child clears on its own copy).
    unsafe {
        use std::os::fd::AsRawFd;
        cmd.pre_exec(move || {
            for fd in &private {
                if libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if let Some(fd) = &cgroup_procs {
                // "0": the writing process. A failure leaves the CLI outside the cgroup,
                // still tracked by its mark and group (see `crate::proctree`).
                let _ = libc::write(fd.as_raw_fd(), b"0".as_ptr().cast(), 1);
            }
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
    Ok((cmd, mark))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::options::{CliOptions, McpServer};

    /// What the CLI of each generation accepts as root, read from the releases' code
    /// (1.0.128: `!process.env.IS_SANDBOX`; 2.0.77: `IS_SANDBOX!=="1"&&
    /// CLAUDE_CODE_BUBBLEWRAP!=="1"`; 2.1.332: `isSandboxEnvSet` is `IS_SANDBOX==="1"`).
    #[test]
    fn a_bypass_session_as_root_needs_a_declared_sandbox() {
        let env = |vars: &[(&str, &str)]| -> Vec<(OsString, OsString)> {
            vars.iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v)))
                .collect()
        };
        let bypass = CliOptions {
            permission_mode: Some("bypassPermissions".into()),
            ..Default::default()
        };
        let allow = CliOptions {
            allow_dangerously_skip_permissions: true,
            ..Default::default()
        };
        let plain = CliOptions {
            permission_mode: Some("acceptEdits".into()),
            ..Default::default()
        };
        let new = semver::Version::new(2, 1, 332);
        let old = semver::Version::new(1, 0, 128);
        let none = env(&[("PATH", "/bin")]);
        for cli in [&bypass, &allow] {
            let e = refuse_root_bypass(&new, cli, &none, 0).unwrap_err();
            assert!(matches!(e, Error::RootBypass { .. }), "{e:?}");
            assert!(e.to_string().contains("IS_SANDBOX=1"), "{e}");
            // Not root: the CLI starts.
            refuse_root_bypass(&new, cli, &none, 1000).unwrap();
            refuse_root_bypass(&new, cli, &env(&[("IS_SANDBOX", "1")]), 0).unwrap();
            refuse_root_bypass(&new, cli, &env(&[("CLAUDE_CODE_BUBBLEWRAP", "1")]), 0).unwrap();
            // 2.0.77 and later want exactly "1"; empty is unset everywhere.
            refuse_root_bypass(&new, cli, &env(&[("IS_SANDBOX", "true")]), 0).unwrap_err();
            refuse_root_bypass(&new, cli, &env(&[("IS_SANDBOX", "")]), 0).unwrap_err();
        }
        assert!(
            refuse_root_bypass(&new, &bypass, &none, 0)
                .unwrap_err()
                .to_string()
                .contains("permission_mode bypassPermissions")
        );
        refuse_root_bypass(&new, &plain, &none, 0).unwrap();
        // Before 2.0.77 any value of IS_SANDBOX will do, and bubblewrap is not read.
        refuse_root_bypass(&old, &bypass, &env(&[("IS_SANDBOX", "yes")]), 0).unwrap();
        refuse_root_bypass(&old, &bypass, &env(&[("CLAUDE_CODE_BUBBLEWRAP", "1")]), 0).unwrap_err();
    }

    #[test]
    fn the_title_goes_only_to_a_release_that_honours_it() {
        let titled = SpawnOptions {
            title: Some("release notes".into()),
            log_id: "t".into(),
            ..Default::default()
        };
        let title_of = |v| match initialize_request(&inst(v), &titled) {
            Some(ostler_protocol::outbound::OutRequest::Initialize(f)) => {
                f.get("title").and_then(|t| t.as_str()).map(str::to_owned)
            }
            other => panic!("{v:?}: {other:?}"),
        };
        // Measured (contracts/compat): 2.1.120 and later honour `title`; 2.0.77 answers
        // initialize but ignores it, so it is not sent.
        assert_eq!(title_of((2, 1, 332)).as_deref(), Some("release notes"));
        assert_eq!(title_of((2, 1, 120)).as_deref(), Some("release notes"));
        assert_eq!(title_of((2, 0, 77)), None);
        // No title asked for: none sent.
        let untitled = SpawnOptions {
            log_id: "t".into(),
            ..Default::default()
        };
        match initialize_request(&inst((2, 1, 332)), &untitled) {
            Some(ostler_protocol::outbound::OutRequest::Initialize(f)) => {
                assert!(!f.contains_key("title"), "{f:?}")
            }
            other => panic!("{other:?}"),
        }
    }

    fn inst(v: (u64, u64, u64)) -> Installation {
        Installation::assume(
            "/bin/false".into(),
            semver::Version::new(v.0, v.1, v.2),
            None,
        )
    }

    fn opts() -> SpawnOptions {
        SpawnOptions {
            cwd: "/".into(),
            cli: CliOptions {
                system_prompt: Some("You are terse.".into()),
                append_system_prompt: Some("Also polite.".into()),
                fallback_model: Some("claude-fallback".into()),
                max_budget_usd: Some(0.25),
                max_thinking_tokens: Some(2048),
                settings: Some(r#"{"a":1}"#.into()),
                managed_settings: Some(r#"{"permissions":{"deny":["Bash"]}}"#.into()),
                setting_sources: vec!["user".into(), "local".into()],
                add_dirs: vec!["/tmp".into(), "/srv".into()],
                mcp_servers: BTreeMap::from([(
                    "tickets".into(),
                    McpServer::Stdio {
                        command: "/bin/mcp".into(),
                        args: vec![],
                        env: BTreeMap::new(),
                        tuning: Default::default(),
                    },
                )]),
                strict_mcp_config: true,
                allow_dangerously_skip_permissions: true,
                project_config_root: Some("/srv/trusted".into()),
                debug: true,
                debug_filter: Some("!statsig,!file".into()),
                debug_file: Some("/var/lib/ostler/debug/s1.log".into()),
                allowed_tools: vec!["Read".into()],
                ..Default::default()
            },
            resume: Some("0b9d4a6e-1c2f-4a57-9a43-6f5e0d1c2b3a".into()),
            resume_session_at: Some("a-1".into()),
            resume_drops_turn: Some("u-2".into()),
            log_id: "t".into(),
            ..Default::default()
        }
    }

    #[test]
    fn every_option_reaches_the_command_line_with_variadic_flags_last() {
        let args = session_args(&inst((2, 1, 330)), &opts()).expect("2.1.330 takes them all");
        let pair = |f: &str, v: &str| args.windows(2).any(|w| w[0] == f && w[1] == v);
        assert!(pair("--system-prompt", "You are terse."), "{args:?}");
        assert!(pair("--append-system-prompt", "Also polite."));
        assert!(pair("--fallback-model", "claude-fallback"));
        assert!(pair("--max-budget-usd", "0.25"));
        assert!(pair("--max-thinking-tokens", "2048"));
        assert!(pair("--settings", r#"{"a":1}"#));
        assert!(pair(
            "--managed-settings",
            r#"{"permissions":{"deny":["Bash"]}}"#
        ));
        assert!(pair("--setting-sources", "user,local"));
        assert!(pair("--project-config-root", "/srv/trusted"));
        assert!(pair("--resume-session-at", "a-1"));
        assert!(pair("--resume-drops-turn", "u-2"));
        // The filter in the one form the CLI's logger reads; the daemon's file.
        assert!(args.iter().any(|a| a == "--debug=!statsig,!file"));
        assert!(pair("--debug-file", "/var/lib/ostler/debug/s1.log"));
        assert!(!args.iter().any(|a| a == "--debug"));
        assert!(args.iter().any(|a| a == "--strict-mcp-config"));
        assert!(
            args.iter()
                .any(|a| a == "--allow-dangerously-skip-permissions")
        );
        let tail: Vec<&str> = args[args.len() - 7..].iter().map(|s| s.as_str()).collect();
        assert_eq!(
            [tail[0], tail[1], tail[2], tail[3], tail[5], tail[6]],
            [
                "--add-dir",
                "/tmp",
                "/srv",
                "--mcp-config",
                "--allowedTools",
                "Read"
            ]
        );
        let mcp: serde_json::Value = serde_json::from_str(tail[4]).expect("mcp json");
        assert_eq!(
            mcp,
            serde_json::json!({"mcpServers": {"tickets": {"type": "stdio", "command": "/bin/mcp"}}})
        );
        // No source at all: the flag with an empty value, in one argument.
        let mut none = opts();
        none.cli.setting_sources.clear();
        none.cli.no_setting_sources = true;
        let args = session_args(&inst((2, 1, 332)), &none).expect("2.1.332");
        assert!(args.iter().any(|a| a == "--setting-sources="), "{args:?}");
        assert!(!args.iter().any(|a| a == "--setting-sources"), "{args:?}");
        // Neither: no flag.
        none.cli.no_setting_sources = false;
        let args = session_args(&inst((2, 1, 332)), &none).expect("2.1.332");
        assert!(!args.iter().any(|a| a.starts_with("--setting-sources")));
    }

    #[test]
    fn an_option_the_release_lacks_is_refused_naming_it() {
        // 1.0.128 refuses `o` naming `flag`.
        let refused = |o: &SpawnOptions, flag: &str| {
            let e = session_args(&inst((1, 0, 128)), o).expect_err(flag);
            assert!(
                matches!(e, Error::Unsupported { flag: f, .. } if f == flag),
                "{e:?}"
            );
        };
        let mut o = opts();
        refused(&o, "--max-budget-usd");
        o.cli.max_budget_usd = None;
        o.cli.max_thinking_tokens = None;
        refused(&o, "--managed-settings");
        o.cli.managed_settings = None;
        refused(&o, "--allow-dangerously-skip-permissions");
        o.cli.allow_dangerously_skip_permissions = false;
        refused(&o, "--project-config-root");
        o.cli.project_config_root = None;
        refused(&o, "--debug-file");
        o.cli.debug = false;
        o.cli.debug_filter = None;
        o.cli.debug_file = None;
        refused(&o, "--resume-drops-turn");
        o.resume_drops_turn = None;
        session_args(&inst((1, 0, 128)), &o).expect("the rest is measured on 1.0.128");
        // The guard goes only with a cut.
        o.resume_drops_turn = Some("u-2".into());
        o.resume_session_at = None;
        let e = session_args(&inst((2, 1, 332)), &o).expect_err("a guard without a cut");
        assert!(matches!(e, Error::InvalidOptions(_)), "{e:?}");
    }
}
