//! The Python and TypeScript examples (examples/python, examples/typescript) run against a
//! live daemon (real CLI, fake model server). Each example's `run.sh` installs its own
//! dependencies (a Python virtual environment with pip; npm packages) and exits non-zero
//! when the example's own checks fail. Missing python3 / node fail the test with the
//! runner's message; nothing is skipped.
#![allow(clippy::disallowed_methods)] // runs the example runners and the ostler binary

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::client::{Served, scenario_text};
use common::wait_output;

fn run_example(lang: &str) {
    let d = Served::start(&scenario_text());
    let cwd = d.work.join(lang);
    std::fs::create_dir_all(&cwd).expect("example cwd");
    // What the model tries to delete in the Python example (its hook must stop it).
    std::fs::create_dir_all(cwd.join("ticket-cache")).expect("ticket-cache");
    std::fs::write(cwd.join("ticket-cache").join("keep.txt"), "keep").expect("keep.txt");
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(lang)
        .join("run.sh");
    let child = Command::new("bash")
        .arg(&script)
        .env("OSTLER_ADDR", &d.addr)
        .env("OSTLER_EXAMPLE_CWD", &cwd)
        .env("OSTLER_EXAMPLE_PROMPT", "Create the file please")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    let out = wait_output(child);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{} failed ({:?}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n--- daemon\n{}",
        script.display(),
        out.status.code(),
        d.log_text()
    );
    // The example's own checks passed; check the effects from the outside too.
    assert!(stdout.contains(": SERVING"), "{stdout}");
    assert!(stdout.contains("answer recorded at seq"), "{stdout}");
    assert!(stdout.contains("result: success"), "{stdout}");
    if lang == "python" {
        // GetSessionInfo and GetContextUsage (issue 10).
        assert!(stdout.contains("session info: Claude Code"), "{stdout}");
        assert!(stdout.contains("context: "), "{stdout}");
        // Client-hosted tools (issue 11): tools.py answered the model's tool call.
        assert!(
            stdout.contains("tool call RESOLUTION_ANSWERED by client:python-tools-example"),
            "{stdout}"
        );
        assert!(
            stdout.contains("assistant: The ticket is handled."),
            "{stdout}"
        );
        // Remote hooks (issue 11): tools.py's PreToolUse hook denied the model's `rm -rf`,
        // and the directory it named is still there.
        assert!(
            stdout.contains("hook HOOK_DECISION_DENY by client:python-tools-example"),
            "{stdout}"
        );
        assert!(
            cwd.join("ticket-cache").join("keep.txt").exists(),
            "the denied `rm -rf ticket-cache` did not run"
        );
    }
    assert!(
        cwd.join("created.txt").exists(),
        "the allowed tool ran in the session's cwd"
    );
    let resolved_by = format!("client:{lang}-example");
    assert!(
        stdout.contains(&resolved_by),
        "the daemon recorded who answered: {stdout}"
    );
}

#[test]
fn python_example_against_a_live_daemon() {
    run_example("python");
}

#[test]
fn typescript_example_against_a_live_daemon() {
    run_example("typescript");
}
