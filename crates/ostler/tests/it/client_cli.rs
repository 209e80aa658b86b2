//! The client's command line without a daemon: completion scripts, help (connection flags
//! under their own heading, examples, exit codes), connection errors that name the address
//! and its setting, a server that does not speak gRPC, `doctor --json`, and the daemon's
//! human log coloured only on a terminal.
#![allow(clippy::disallowed_methods)] // spawns the ostler binary

use crate::common;

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::process::{Command, Output, Stdio};

use common::client::describe;
use common::{OSTLER, wait_output};

/// `ostler ARGS` with a clean environment and a private HOME (no config file).
fn ostler(args: &[&str], env: &[(&str, &str)]) -> Output {
    let home = tempfile::tempdir().expect("home");
    let mut cmd = Command::new(OSTLER);
    cmd.args(args)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join(".config"))
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    wait_output(cmd.spawn().expect("spawn ostler"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn completion_scripts_for_bash_zsh_and_fish() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef ostler"),
        ("fish", "complete -c ostler"),
    ] {
        let out = ostler(&["completion", shell], &[]);
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", describe(&out));
        let script = text(&out.stdout);
        assert!(script.contains(marker), "{shell}: {script}");
        // Subcommands and their flags are in it (fish spells `--last` as `-l last`).
        for word in ["pending", "approve", "attach", "completion"] {
            assert!(script.contains(word), "{shell} script lacks {word}");
        }
        assert!(
            script.contains("--last") || script.contains("-l last"),
            "{shell} script lacks --last"
        );
    }
    let out = ostler(&["completion", "tcsh"], &[]);
    assert_eq!(out.status.code(), Some(2), "{}", describe(&out));
}

#[test]
fn help_has_connection_heading_examples_and_exit_codes() {
    let out = ostler(&["--help"], &[]);
    let top = text(&out.stdout);
    assert!(
        top.contains("Examples:") && top.contains("ostler attach @last"),
        "{top}"
    );
    assert!(
        top.contains("Exit codes:") && top.contains("130") && top.contains("3    a permission"),
        "{top}"
    );
    // Commands in groups (kubectl / gh), each under its heading.
    let mut at = 0;
    for (heading, first) in [
        ("Sessions:", "  run "),
        ("Waiting for an answer:", "  pending "),
        ("Inside a session:", "  info "),
        ("The daemon:", "  serve "),
        ("Other:", "  decode "),
        ("Options:", "  -h, --help"),
    ] {
        let h = top[at..]
            .find(&format!("\n{heading}\n{first}"))
            .unwrap_or_else(|| panic!("{heading} then {first:?} after byte {at}:\n{top}"));
        at += h + 1;
    }
    assert!(!top.contains("Other commands:"), "{top}");
    let out = ostler(&["send", "--help"], &[]);
    let help = text(&out.stdout);
    let conn = help.find("Connection:").expect("a Connection heading");
    let addr = help.find("--addr").expect("--addr");
    let json = help.find("--json").expect("--json");
    assert!(addr > conn, "--addr under Connection:\n{help}");
    assert!(
        json < conn,
        "--json among the command's own options:\n{help}"
    );
    // Every client command (and doctor) takes --json.
    for cmd in [
        "run",
        "sessions",
        "show",
        "attach",
        "send",
        "interrupt",
        "stop",
        "resume",
        "delete",
        "health",
        "pending",
        "approve",
        "deny",
        "answer",
        "watch",
        "doctor",
    ] {
        let out = ostler(&[cmd, "--help"], &[]);
        assert!(text(&out.stdout).contains("--json"), "{cmd} has no --json");
    }
}

/// A port nobody listens on.
fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

#[test]
fn unreachable_daemon_names_address_setting_and_remedy() {
    let port = closed_port();
    let addr = format!("127.0.0.1:{port}");
    let out = ostler(&["sessions", "--addr", &addr], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("http://{addr}"))
            && err.contains("nothing listens there")
            && err.contains("--addr / OSTLER_ADDR")
            && err.contains("ostler serve"),
        "{err}"
    );

    // From the daemon's configuration file: the message names the file and the key.
    let dir = tempfile::tempdir().expect("dir");
    let cfg = dir.path().join("config.toml");
    std::fs::write(&cfg, format!("[listen]\naddr = \"{addr}\"\n")).expect("config");
    let cfg_s = cfg.display().to_string();
    let out = ostler(&["sessions"], &[("OSTLER_CONFIG", &cfg_s)]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("listen.addr in {cfg_s}")),
        "the setting is named: {err}"
    );

    // From a variable, and from nothing at all: each named as it is.
    let out = ostler(&["sessions"], &[("OSTLER_LISTEN__ADDR", &addr)]);
    let err = text(&out.stderr);
    assert!(err.contains("OSTLER_LISTEN__* variables"), "{err}");
    let out = ostler(&["sessions"], &[]);
    let err = text(&out.stderr);
    // (Unless a daemon happens to listen on the default address of this machine.)
    if err.contains("cannot reach") {
        assert!(
            err.contains("came from the built-in default") && !err.contains("OSTLER_LISTEN"),
            "no variable was set: {err}"
        );
    }
}

#[test]
fn a_server_that_does_not_speak_grpc_gets_a_clear_message() {
    // An HTTP/1.1 server answering every connection with 400.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { break };
            let mut buf = [0u8; 1024];
            let _ = c.read(&mut buf);
            let _ = c.write_all(
                b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
    });
    for args in [
        &["sessions", "--addr", &addr][..],
        &["health", "--addr", &addr][..],
    ] {
        let out = ostler(args, &[]);
        assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
        let err = text(&out.stderr);
        assert!(
            err.contains("does not speak gRPC") && err.contains(&addr),
            "{args:?}: {err}"
        );
        assert!(
            !err.contains("CANCELLED") && !err.contains("h2 protocol error"),
            "{err}"
        );
    }
}

#[test]
fn doctor_json() {
    let claude = common::claude_binary(common::NEW);
    let claude_s = claude.display().to_string();
    let out = ostler(
        &["doctor", "--json", "--no-probe", "--claude", &claude_s],
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(&out)));
    assert_eq!(v["installation"]["release"], common::NEW);
    assert_eq!(v["installation"]["binary"], claude_s.as_str());
    assert_eq!(v["would_start"], true);
    assert_eq!(v["exit_code"], 0);

    // A configuration `serve` refuses (exit 78) is reported as refused, naming the key.
    for (var, value) in [
        ("OSTLER_SESSIONS__MAX_LIVE", "0"),
        ("OSTLER_LOG__FORMAT", "xml"),
        ("OSTLER_STORE__BUSY_TIMEOUT_SECS", "2147484"),
    ] {
        let out = ostler(
            &["doctor", "--json", "--no-probe", "--claude", &claude_s],
            &[(var, value)],
        );
        assert_eq!(out.status.code(), Some(78), "{var}: {}", describe(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["would_start"], false, "{var}: {v}");
        let key = var
            .trim_start_matches("OSTLER_")
            .to_ascii_lowercase()
            .replace("__", ".");
        assert!(
            v["error"].as_str().unwrap_or_default().contains(&key),
            "{key}: {v}"
        );
    }

    let out = ostler(
        &["doctor", "--json", "--claude", "/nonexistent/claude"],
        &[],
    );
    let code = out.status.code();
    assert!(matches!(code, Some(72 | 78)), "{}", describe(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["would_start"], false);
    assert_eq!(v["exit_code"].as_i64(), code.map(i64::from));
}

/// The daemon's human log: no colour codes into a pipe (files, the journal), colour on a
/// terminal.
#[test]
fn daemon_log_is_coloured_only_on_a_terminal() {
    let dir = tempfile::tempdir().expect("dir");
    let store = dir.path().join("store.db").display().to_string();
    let args = [
        "serve",
        "--log-format",
        "human",
        "--claude",
        "/nonexistent/claude",
        "--store",
        &store,
        "--listen",
        "127.0.0.1:0",
    ];
    // Into a pipe, even with a colour terminal type.
    let out = {
        let home = tempfile::tempdir().expect("home");
        let mut cmd = Command::new(OSTLER);
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", home.path())
            .env("TERM", "xterm-256color")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        wait_output(cmd.spawn().expect("spawn"))
    };
    let log = text(&out.stderr);
    assert!(
        matches!(out.status.code(), Some(72 | 78)),
        "{}",
        describe(&out)
    );
    assert!(log.contains("Claude Code check failed"), "{log}");
    assert!(!log.contains('\u{1b}'), "colour codes in a pipe: {log:?}");

    // On a terminal.
    use portable_pty::{CommandBuilder, PtySize, native_pty_system};
    let pair = native_pty_system()
        .openpty(PtySize {
            rows: 50,
            cols: 200,
            pixel_width: 0,
            pixel_height: 0,
        })
        .expect("openpty");
    let home = tempfile::tempdir().expect("home");
    let mut cmd = CommandBuilder::new(OSTLER);
    cmd.args(args);
    cmd.env_clear();
    cmd.env("PATH", std::env::var("PATH").unwrap_or_default());
    cmd.env("HOME", home.path());
    cmd.env("TERM", "xterm-256color");
    let mut child = pair.slave.spawn_command(cmd).expect("spawn in pty");
    drop(pair.slave);
    let mut reader = pair.master.try_clone_reader().expect("reader");
    let reading = std::thread::spawn(move || {
        let mut all = Vec::new();
        let _ = reader.read_to_end(&mut all);
        all
    });
    let status = child.wait().expect("wait");
    drop(pair.master);
    let seen = text(&reading.join().expect("reader thread"));
    assert!(matches!(status.exit_code(), 72 | 78), "{seen}");
    assert!(seen.contains("Claude Code check failed"), "{seen}");
    assert!(
        seen.contains("\u{1b}["),
        "no colour on a terminal: {seen:?}"
    );
}

/// What was typed is wrong: exit 2 ("bad usage", as `--help` says), also for the mistakes
/// clap cannot see; 1 stays for a daemon or a turn that failed.
#[test]
fn usage_mistakes_exit_2() {
    let closed = format!("127.0.0.1:{}", closed_port());
    for (args, says) in [
        (&["run", "", "--addr", &closed][..], "the prompt is empty"),
        (
            &["run", "--allow-tools", "Bash(x", "hi", "--addr", &closed],
            "missing ')'",
        ),
        (
            &["run", "--allow-tools", ",", "hi", "--addr", &closed],
            "--allow-tools",
        ),
        (&["sessions", "--addr", "garbage"], "expected host:port"),
        (&["sessions", "--addr", "127.0.0.1:112927"], "is not a port"),
        (&["sessions", "--no-such-flag"], "--no-such-flag"),
    ] {
        let out = ostler(args, &[]);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", describe(&out));
        assert!(
            text(&out.stderr).contains(says),
            "{args:?}: {}",
            describe(&out)
        );
    }
    let out = ostler(&["sessions", "--addr", &closed], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
}

/// `run`, `send` and `attach --until-turn` with `--json` end with a `run_summary` line also
/// when they fail before any turn, with the exit code they exit with.
#[test]
fn json_runs_end_with_a_summary_when_they_fail() {
    let closed = format!("127.0.0.1:{}", closed_port());
    for (args, code) in [
        (&["run", "--json", "hi", "--addr", &closed][..], 1),
        (&["send", "--json", "abc", "hi", "--addr", &closed], 1),
        (
            &["attach", "--json", "--until-turn", "abc", "--addr", &closed],
            1,
        ),
        (&["run", "--json", "", "--addr", &closed], 2),
    ] {
        let out = ostler(args, &[]);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{args:?}: {}",
            describe(&out)
        );
        let stdout = text(&out.stdout);
        let last: serde_json::Value =
            serde_json::from_str(stdout.lines().last().unwrap_or_default())
                .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", describe(&out)));
        assert_eq!(last["type"], "run_summary", "{last}");
        assert_eq!(last["outcome"], "failed", "{last}");
        assert_eq!(last["exit_code"], code, "{last}");
        assert!(
            !last["message"].as_str().unwrap_or_default().is_empty(),
            "{last}"
        );
    }
}
