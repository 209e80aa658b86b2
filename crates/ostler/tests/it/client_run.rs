//! `ostler run` end to end: the real binary as a client of a live daemon (`ostler serve`)
//! running the real Claude Code CLI against the fake model server. The interactive path
//! runs in a pseudo-terminal and answers by typing; the flag path runs without one.
#![allow(clippy::disallowed_methods)] // spawns the ostler binary (daemon and clients)

use crate::common;

use common::client::{Pty, Served, describe, json_lines, scenario_text};
use serde_json::Value;

/// This machine's host name, as the client names itself by default (`USER@HOST[:TTY]`).
fn host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap_or_default()
        .trim()
        .to_owned()
}

fn of_type<'a>(events: &'a [Value], t: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == t).collect()
}

#[test]
fn interactive_allow_once_by_typing() {
    let d = Served::start(&scenario_text());
    let mut t = Pty::spawn(&d, &["run", "Create the file please"], false);
    t.expect("? Allow Bash(touch created.txt)");
    t.expect("allow? (y/a/n/d): ");
    t.type_text("y\r");
    t.expect("Finished: the tool call is settled.");
    t.expect("✓ done");
    let code = t.wait();
    assert_eq!(code, 0, "{}", t.seen);
    assert!(d.work.join("created.txt").exists(), "the allowed tool ran");
    assert!(t.seen.contains("allowed by client:tester@"), "{}", t.seen);
    // The summary line: turns, tokens, cost, duration.
    let summary = t
        .seen
        .lines()
        .find(|l| l.contains("✓ done"))
        .unwrap_or_default()
        .to_owned();
    assert!(
        summary.contains("2 turns") && summary.contains("tokens") && summary.contains('$'),
        "{summary}"
    );
    // NO_COLOR: no SGR sequences at all.
    assert!(!has_sgr(&t.seen), "colour despite NO_COLOR: {:?}", t.seen);
}

/// A sub-agent's permission request: the prompt names the sub-agent by the label its
/// lines stand under (the main agent's prompt keeps "? Allow", above).
#[test]
fn a_subagents_prompt_names_it() {
    let d = Served::start(&scenario_text());
    let mut t = Pty::spawn(&d, &["run", "Delegate the file please"], false);
    t.expect("? general-purpose · Create sub.txt wants to run Bash(touch sub.txt)");
    t.expect("allow? (y/a/n/d): ");
    t.type_text("y\r");
    t.expect("The sub-agent created the file.");
    t.expect("✓ done");
    // The prompt came between the sub-agent's lines: its next line (the answer) stands
    // under its header again.
    let after = &t.seen[t.seen.find("allow? (y/a/n/d): ").unwrap()..];
    let answer = after
        .find("Bash(touch sub.txt): allowed")
        .unwrap_or_else(|| {
            panic!("no answer line: {}", t.seen);
        });
    assert!(
        after[..answer].contains("[general-purpose · Create sub.txt]"),
        "no header between the prompt and the answer: {}",
        t.seen
    );
    let code = t.wait();
    assert_eq!(code, 0, "{}", t.seen);
    assert!(
        d.work.join("sub.txt").exists(),
        "the allowed tool ran: {}",
        t.seen
    );
    assert!(!t.seen.contains("? Allow"), "{}", t.seen);
}

#[test]
fn interactive_deny_with_reason_reaches_the_model() {
    let d = Served::start(&scenario_text());
    let mut t = Pty::spawn(&d, &["run", "Create the file please"], true);
    t.expect("allow? (y/a/n/d): ");
    t.type_text("n\r");
    t.expect("reason (told to the model");
    t.type_text("not on a Sunday\r");
    t.expect("Finished: the tool call is settled.");
    let code = t.wait();
    assert_eq!(
        code, 0,
        "a turn with a denied tool still succeeds: {}",
        t.seen
    );
    assert!(
        !d.work.join("created.txt").exists(),
        "the denied tool did not run"
    );
    assert!(
        d.model_saw("not on a Sunday"),
        "the deny message reached the model"
    );
    assert!(t.seen.contains("denied: Bash"), "{}", t.seen);
    // On a terminal without NO_COLOR the output is coloured.
    assert!(has_sgr(&t.seen), "no colour on a terminal: {:?}", t.seen);
}

/// `ostler run --hook EVENT:MATCHER` registers a remote hook, and its call is asked at the
/// terminal: a DENY with a reason keeps the tool from running, and the reason reaches the
/// model.
#[test]
fn a_hook_registered_by_flag_is_asked_at_the_terminal() {
    let d = Served::start(&scenario_text());
    let mut t = Pty::spawn(
        &d,
        &["run", "--hook", "PreToolUse:Bash", "Create the file please"],
        true,
    );
    t.expect("? Hook");
    t.expect("answer? ");
    t.type_text("n\r");
    t.expect("reason: ");
    t.type_text("HOOKED-NO not today\r");
    t.expect("Finished: the tool call is settled.");
    assert_eq!(t.wait(), 0, "{}", t.seen);
    assert!(!d.work.join("created.txt").exists(), "the hook denied it");
    assert!(d.model_saw("HOOKED-NO not today"), "{}", t.seen);
    assert!(
        !t.seen.contains("allow? (y/a/n/d)"),
        "no permission prompt after the hook's DENY: {}",
        t.seen
    );
}

#[test]
fn interactive_allow_for_session_remembers() {
    let d = Served::start(&scenario_text());
    let mut t = Pty::spawn(&d, &["run", "--json", "Create the file please"], false);
    t.expect("allow? (y/a/n/d): ");
    t.type_text("a\r");
    t.expect("\"type\":\"run_summary\"");
    assert_eq!(t.wait(), 0, "{}", t.seen);
    assert!(d.work.join("created.txt").exists());
    let resolved = t
        .seen
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .find(|v| v["type"] == "permission_resolved")
        .unwrap_or_else(|| panic!("no permission_resolved line:\n{}", t.seen));
    assert_eq!(resolved["resolution"], "allowed");
}

#[test]
fn flags_allow_tools_without_a_terminal_json() {
    let d = Served::start(&scenario_text());
    let out = d.client(
        &[
            "run",
            "--json",
            "--allow-tools",
            "Bash(touch)",
            "Create the file please",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let ev = json_lines(&out.stdout);
    let session = &of_type(&ev, "session")[0]["session"];
    let id = session["id"].as_str().expect("session id").to_owned();
    assert_eq!(session["cwd"], d.work.display().to_string());
    let asked = of_type(&ev, "permission_requested");
    assert_eq!(asked.len(), 1, "{}", describe(&out));
    assert_eq!(asked[0]["tool_name"], "Bash");
    assert_eq!(asked[0]["input"]["command"], "touch created.txt");
    let resolved = of_type(&ev, "permission_resolved");
    assert_eq!(resolved[0]["resolution"], "allowed");
    assert_eq!(resolved[0]["request_id"], asked[0]["request_id"]);
    let done = of_type(&ev, "turn_completed");
    assert_eq!(done.len(), 1);
    assert_eq!(done[0]["subtype"], "success");
    assert_eq!(done[0]["result"], "Finished: the tool call is settled.");
    // seq: gap-free and increasing on stored events, all of the one session.
    let seqs: Vec<u64> = ev
        .iter()
        .filter_map(|e| e["seq"].as_u64())
        .filter(|s| *s > 0)
        .collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    assert!(
        ev.iter()
            .filter(|e| e["type"] != "session" && e["type"] != "run_summary")
            .all(|e| e["session_id"] == id.as_str())
    );
    let summary = ev.last().expect("lines");
    assert_eq!(summary["type"], "run_summary");
    assert_eq!(summary["exit_code"], 0);
    assert_eq!(summary["turn"]["num_turns"], 2);
    assert!(d.work.join("created.txt").exists());
    // No terminal: nothing was asked on stderr.
    assert!(!String::from_utf8_lossy(&out.stderr).contains("allow?"));
}

#[test]
fn flags_deny_all_and_unanswerable_prompt() {
    let d = Served::start(&scenario_text());
    let out = d.client(
        &[
            "run",
            "--deny-all",
            "--deny-message",
            "scripts may not touch",
            "Create the file please",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "denied by client:tester@{}: scripts may not touch",
            host()
        )),
        "{}",
        describe(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("denied: Bash"),
        "{}",
        describe(&out)
    );
    assert!(!d.work.join("created.txt").exists());
    assert!(d.model_saw("scripts may not touch"));

    // --allowed-tools is the session's own rule (the CLI's --allowedTools): no prompt at
    // all, without a terminal; --file-checkpointing makes the session rewindable.
    let out = d.client(
        &[
            "run",
            "--json",
            "--allowed-tool",
            "Bash(touch created.txt)",
            "--disallowed-tool",
            "Bash(rm a,b)",
            "--file-checkpointing",
            "Create the file please",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let ev = json_lines(&out.stdout);
    assert!(
        of_type(&ev, "permission_requested").is_empty(),
        "{}",
        describe(&out)
    );
    assert!(d.work.join("created.txt").exists());
    std::fs::remove_file(d.work.join("created.txt")).unwrap();
    let id = ev[0]["session"]["id"].as_str().expect("id");
    let events = json_lines(&d.client(&["show", id, "--events", "--json"], None).stdout);
    let created = events
        .iter()
        .find(|e| e["code"] == "session_created")
        .expect("session_created");
    let data = created["data"].to_string();
    assert!(
        data.contains("Bash(touch created.txt)")
            && data.contains("\"disallowed_tools\":[\"Bash(rm a,b)\"]")
            && data.contains("enable_file_checkpointing"),
        "a rule keeps its commas: {data}"
    );

    // No terminal, no flag that decides: a clear error, exit 3, the prompt left pending.
    let out = d.client(&["run", "Create the file please"], None);
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no terminal") && stderr.contains("--allow-tools"),
        "{stderr}"
    );
    let listed = json_lines(
        &d.client(
            &["sessions", "--json", "--state", "awaiting_permission"],
            None,
        )
        .stdout,
    );
    assert_eq!(listed.len(), 1, "the unanswered session still waits");
    assert_eq!(listed[0]["pending_interactions"], 1);
    // The error says how to answer it from anywhere: approve / deny with its request id.
    let pending = json_lines(&d.client(&["pending", "--json"], None).stdout);
    let rid = pending[0]["request_id"].as_str().expect("request id");
    assert!(
        stderr.contains(&format!("ostler approve {rid}")),
        "{stderr}"
    );
    // Someone with the right to decide answers it later with attach.
    let id = listed[0]["id"].as_str().expect("id").to_owned();
    let out = d.client(
        &[
            "attach",
            &id,
            "--until-turn",
            "--allow-tools",
            "Bash",
            "--json",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let ev = json_lines(&out.stdout);
    assert_eq!(
        of_type(&ev, "permission_resolved")[0]["resolution"],
        "allowed"
    );
    assert!(d.work.join("created.txt").exists());
}

#[test]
fn prompt_from_stdin_and_failed_turn_exit_code() {
    let scenario = format!(
        "{}\n{}",
        scenario_text(),
        r#"
[[model]]
name = "broken"
when = { last_user_text_contains = "Break please" }
error = { status = 400, kind = "invalid_request_error", message = "this request is broken" }

[[model]]
name = "escapes"
when = { last_user_text_contains = "Say something odd" }
blocks = [{ type = "text", text = "odd \u001b]0;pwned\u0007 \u001b[2J done" }]
"#
    );
    let d = Served::start(&scenario);
    let out = d.client(&["run", "--json"], Some("Say hello\n"));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let ev = json_lines(&out.stdout);
    assert_eq!(
        of_type(&ev, "turn_completed")[0]["result"],
        "Hello from the fake model!"
    );
    let user = of_type(&ev, "user_message");
    assert!(
        user[0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("Say hello"))
    );

    // Human output: the streamed text on stdout, the summary on stderr.
    let out = d.client(&["run", "-"], Some("Say hello"));
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Hello from the fake model!"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("✓ done · 1 turn"));

    // Text from the model cannot drive the terminal: its escapes are shown, not sent.
    let out = d.client(&["run", "Say something odd"], None);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        !shown.contains('\u{1b}') && !shown.contains('\u{7}'),
        "{shown:?}"
    );
    assert!(shown.contains("odd ^[]0;pwned^G ^[[2J done"), "{shown:?}");

    // A turn that ends in an API error: non-zero.
    let out = d.client(&["run", "--json", "Break please"], None);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let ev = json_lines(&out.stdout);
    let done = of_type(&ev, "turn_completed");
    assert_eq!(done[0]["is_error"], true, "{}", describe(&out));
    assert_eq!(
        ev.last().map(|v| v["outcome"].clone()),
        Some(Value::from("error"))
    );

    // An empty prompt is refused before anything is created.
    let out = d.client(&["run"], Some("  \n"));
    assert_eq!(
        out.status.code(),
        Some(2),
        "a usage mistake: {}",
        describe(&out)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("the prompt is empty"));
}

#[test]
fn ctrl_c_interrupts_then_detaches_without_killing_the_session() {
    let d = Served::start(&scenario_text());
    // First Ctrl-C interrupts the turn: the run ends non-zero (130), the session lives on.
    let mut t = Pty::spawn(&d, &["run", "Tell a long story"], false);
    // A progress line while the model works (on the terminal's stderr).
    t.expect("thinking… ");
    t.expect("Once");
    t.type_text("\x03");
    t.expect("interrupting the turn");
    // The turn reads as interrupted, not as an error with the CLI's diagnostics.
    t.expect("⏹ interrupted");
    let code = t.wait();
    assert_eq!(code, 130, "{}", t.seen);
    let listed = json_lines(&d.client(&["sessions", "--json"], None).stdout);
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0]["state"], "idle",
        "interrupt keeps the session: {listed:?}"
    );

    // Ctrl-C twice: detach; the session is neither stopped nor killed. The second Ctrl-C
    // detaches only while the interrupt is under way: the CLI may end the turn first (the
    // run then ends as interrupted, as after one Ctrl-C; seen once on a quiet machine), and
    // nothing here can hold that window open, so a few runs are allowed.
    let mut runs = 1;
    let detached = loop {
        runs += 1;
        let mut t = Pty::spawn(&d, &["run", "Tell a long story"], false);
        t.expect("Once");
        t.type_text("\x03");
        t.expect("interrupting the turn");
        t.type_text("\x03");
        let which = t.expect_any(&["detached", "⏹ interrupted"]);
        assert_eq!(t.wait(), 130, "{}", t.seen);
        if which == 0 || runs == 6 {
            break which == 0;
        }
    };
    assert!(detached, "no run of {} detached", runs - 1);
    let listed = json_lines(&d.client(&["sessions", "--json"], None).stdout);
    assert_eq!(listed.len(), runs);
    for s in &listed {
        let state = s["state"].as_str().unwrap_or_default();
        assert!(
            matches!(state, "idle" | "running"),
            "detaching left {state}: {s}"
        );
    }
}

/// Any ANSI SGR sequence (`ESC [ ... m`).
fn has_sgr(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i + 1 < b.len() {
        if b[i] == 0x1b && b[i + 1] == b'[' {
            let mut j = i + 2;
            while j < b.len() && (b[j].is_ascii_digit() || b[j] == b';') {
                j += 1;
            }
            if j < b.len() && b[j] == b'm' {
                return true;
            }
        }
        i += 1;
    }
    false
}

#[test]
fn no_colour_without_a_terminal_even_without_no_color() {
    let d = Served::start(&scenario_text());
    // No NO_COLOR here.
    let child = d.spawn_client(&["run", "--allow-tools", "Bash", "Create the file please"]);
    let out = common::wait_output(child);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        all.contains(&format!(
            "Bash(touch created.txt): allowed by client:tester@{}",
            host()
        )),
        "{all}"
    );
    assert!(
        !all.contains('\x1b'),
        "escape sequences without a terminal: {all:?}"
    );
}
