//! Attention across sessions and clients, end to end against a live daemon: `pending`,
//! `approve`, `deny -m`, `answer`, `pending show` (a settled request: who decided, when);
//! session ids by prefix and `@last` / `--last`; `sessions`
//! newest first with `--limit`; `interrupt` on an idle session and `resume` on a live one
//! saying what happened; a prompt answered in one attached client going away in another,
//! which names who answered; Ctrl-C in `attach` (interrupt, then detach); an interrupted
//! turn reading as interrupted.
#![allow(clippy::disallowed_methods)] // spawns the ostler binary (daemon and clients)

use crate::common;

use common::client::{Pty, Served as Daemon, describe, json_lines, scenario_text};
use serde_json::Value;

/// Start a turn that stops at a prompt nobody can answer here (exit 3); the session id.
fn leave_pending(d: &Daemon, prompt: &str) -> String {
    let out = d.client(&["run", "--json", prompt], None);
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    json_lines(&out.stdout)[0]["session"]["id"]
        .as_str()
        .expect("session id")
        .to_owned()
}

/// Wait for the first turn of `id` to complete (it was already running or will).
fn first_turn(d: &Daemon, id: &str) -> Vec<Value> {
    d.ok_json(&["attach", id, "--json", "--after-seq", "0", "--until-turn"])
}

#[test]
fn pending_approve_deny_and_answer_by_request_id() {
    let d = Daemon::start(&scenario_text());
    let s1 = leave_pending(&d, "Create the file please");
    let s2 = leave_pending(&d, "Ask me which database to use");

    // Oldest first, with the session and its cwd.
    let p = d.ok_json(&["pending", "--json"]);
    assert_eq!(p.len(), 2, "{p:?}");
    assert_eq!(p[0]["session_id"], s1.as_str());
    assert_eq!(p[0]["kind"], "permission");
    assert_eq!(p[0]["cwd"], d.work.display().to_string());
    assert_eq!(p[0]["event"]["type"], "permission_requested");
    assert_eq!(p[0]["event"]["input"]["command"], "touch created.txt");
    assert_eq!(p[1]["session_id"], s2.as_str());
    assert_eq!(p[1]["kind"], "question");
    assert!(p[0]["asked_at_ms"].as_i64() <= p[1]["asked_at_ms"].as_i64());
    let perm = p[0]["request_id"].as_str().expect("id").to_owned();
    let question = p[1]["request_id"].as_str().expect("id").to_owned();

    // The table.
    let out = d.client(&["pending"], None);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.starts_with("REQUEST")
            && table.contains(&perm)
            && table.contains("Bash(touch created.txt)")
            && table.contains("Which database should I use?"),
        "{table}"
    );

    // The wrong command for the kind says which one to use.
    let out = d.client(&["approve", &question], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ostler answer"),
        "{}",
        describe(&out)
    );
    // A choice that is not an option is refused before it is sent, naming the options.
    let out = d.client(&["answer", &question, "MySQL"], None);
    assert_eq!(
        out.status.code(),
        Some(2),
        "a usage mistake: {}",
        describe(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("2) PostgreSQL"),
        "{}",
        describe(&out)
    );

    // Approve by a prefix of the request id; the turn goes on and the tool runs.
    let prefix: String = perm.chars().take(8).collect();
    let a = d.ok_json(&["approve", &prefix, "--json", "--client-name", "phone"]);
    assert_eq!(a[0]["resolution"], "allowed");
    assert_eq!(a[0]["request_id"], perm.as_str());
    let ev = first_turn(&d, &s1);
    assert!(
        ev.iter()
            .any(|e| e["type"] == "turn_completed" && e["subtype"] == "success"),
        "{ev:?}"
    );
    assert!(d.work.join("created.txt").exists());

    // Answer the question by label.
    let a = d.ok_json(&["answer", &question, "postgresql", "--json"]);
    assert_eq!(a[0]["answers"][0]["selected"][0], "PostgreSQL");
    first_turn(&d, &s2);
    assert!(d.model_saw("PostgreSQL"));

    // Nothing left. A settled request is still there to look up (GetInteraction): its
    // state, who decided and when, the response sent, the event that asked it.
    assert!(d.ok_json(&["pending", "--json"]).is_empty());
    let shown = d.ok_json(&["pending", "show", &prefix, "--json"]);
    let i = &shown[0];
    assert_eq!(i["request_id"], perm.as_str(), "{i}");
    assert_eq!(i["session_id"], s1.as_str());
    assert_eq!(i["cwd"], d.work.display().to_string());
    assert_eq!(i["kind"], "permission");
    assert_eq!(i["state"], "allowed");
    assert_eq!(i["decided_by"], "client:phone");
    assert!(i["decided_ms"].as_i64() >= i["created_ms"].as_i64(), "{i}");
    assert!(i["response"].is_object(), "{i}");
    assert_eq!(i["event"]["type"], "permission_requested");
    assert_eq!(i["event"]["input"]["command"], "touch created.txt");
    let out = d.client(&["pending", "show", &perm], None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && text.contains("allowed by client:phone")
            && text.contains("Bash(touch created.txt)")
            && text.contains(&s1),
        "{}",
        describe(&out)
    );
    let q = d.ok_json(&["pending", "show", &question, "--json", "--session", &s2]);
    assert_eq!(q[0]["state"], "answered", "{:?}", q[0]);
    assert_eq!(q[0]["event"]["type"], "question_asked");
    // Another client approving it (by prefix) is told who did, and when; exit non-zero.
    let out = d.client(&["approve", &prefix, "--client-name", "laptop"], None);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "request {perm} (session {s1}) was already allowed by client:phone at "
        )) && err.contains(" UTC"),
        "{}",
        describe(&out)
    );
    // Unknown and empty ids.
    let out = d.client(&["pending", "show", "no-such-request"], None);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("NOT_FOUND") && err.contains("no-such-request"),
        "{}",
        describe(&out)
    );
    let out = d.client(&["deny", "no-such-request"], None);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no request with id \"no-such-request\""),
        "{}",
        describe(&out)
    );
    let out = d.client(&["pending", "show", " "], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("INVALID_ARGUMENT") && err.contains("request_id"),
        "{}",
        describe(&out)
    );

    // Deny with a message: it reaches the model.
    std::fs::remove_file(d.work.join("created.txt")).expect("rm");
    let s3 = leave_pending(&d, "Create the file please");
    let p = d.ok_json(&["pending", "--json"]);
    assert_eq!(p.len(), 1);
    let id = p[0]["request_id"].as_str().expect("id").to_owned();
    let out = d.client(&["deny", &id, "-m", "not on a Sunday"], None);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("denied Bash(touch created.txt)"));
    first_turn(&d, &s3);
    assert!(d.model_saw("not on a Sunday"));
    assert!(!d.work.join("created.txt").exists());
}

#[test]
fn ids_by_prefix_and_last_newest_first_and_honest_interrupt_and_resume() {
    let d = Daemon::start(&scenario_text());
    let first = d.ok_json(&["run", "--json", "Say hello"])[0]["session"]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let second = d.ok_json(&["run", "--json", "Say hello"])[0]["session"]["id"]
        .as_str()
        .expect("id")
        .to_owned();

    // Newest first; --limit keeps the newest.
    let list = d.ok_json(&["sessions", "--json"]);
    let ids: Vec<&str> = list.iter().filter_map(|s| s["id"].as_str()).collect();
    assert_eq!(ids, [second.as_str(), first.as_str()]);
    let list = d.ok_json(&["sessions", "--json", "--limit", "1"]);
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["id"], second.as_str());

    // @last, --last and a unique prefix (long enough to be unique between two uuids).
    assert_eq!(
        d.ok_json(&["show", "@last", "--json"])[0]["id"],
        second.as_str()
    );
    assert_eq!(
        d.ok_json(&["show", "--last", "--json"])[0]["id"],
        second.as_str()
    );
    let common = first
        .chars()
        .zip(second.chars())
        .take_while(|(a, b)| a == b)
        .count();
    let prefix: String = first.chars().take(common + 1).collect();
    assert_eq!(
        d.ok_json(&["show", &prefix, "--json"])[0]["id"],
        first.as_str()
    );
    // The ids' ends tell them apart (what `pending` and `watch` show): the last 8
    // characters name each session, in upper case too.
    for id in [&first, &second] {
        let end = id[id.len() - 8..].to_ascii_uppercase();
        assert_eq!(d.ok_json(&["show", &end, "--json"])[0]["id"], id.as_str());
    }
    let ev = d.ok_json(&["send", "--last", "--json", "Say hello again"]);
    assert!(
        ev.iter()
            .all(|e| e["session_id"].as_str().is_none_or(|s| s == second))
    );
    let out = d.client(&["show", "zzzz"], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("NOT_FOUND: no session has this id, or an id that starts or ends"),
        "{}",
        describe(&out)
    );

    // interrupt on an idle session: nothing is sent, and it says so.
    let out = d.client(&["interrupt", &prefix], None);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("nothing to interrupt") && said.contains("idle"),
        "{said}"
    );
    let v = d.ok_json(&["interrupt", &first, "--json"]);
    assert_eq!(v[0]["interrupted"], false);
    assert_eq!(v[0]["state"], "idle");

    // resume on a live session: nothing to resume.
    let out = d.client(&["resume", &first], None);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("nothing to resume") && said.contains("live"),
        "{said}"
    );
    let v = d.ok_json(&["resume", &first, "--json"]);
    assert_eq!(v[0]["resumed"], false);
    // And on a stopped one it resumes.
    d.ok_json(&["stop", &first, "--json"]);
    let v = d.ok_json(&["resume", &first, "--json"]);
    assert_eq!(v[0]["resumed"], true);
}

/// The session id a `run` in a terminal announces (`session <id>`).
fn announced_id(t: &mut Pty) -> String {
    t.expect("session ");
    loop {
        let at = t.seen.find("session ").expect("announced") + "session ".len();
        let id: String = t.seen[at..]
            .chars()
            .take_while(|c| c.is_ascii_hexdigit() || *c == '-')
            .collect();
        if id.len() == 36 {
            return id;
        }
        let lines = t.seen.matches('\n').count();
        t.expect_n("\n", lines + 1);
    }
}

#[test]
fn a_prompt_answered_in_one_client_goes_away_in_the_other() {
    let d = Daemon::start(&scenario_text());
    let mut a = Pty::spawn(&d, &["run", "Create the file please"], false);
    let id = announced_id(&mut a);
    a.expect("allow? (y/a/n/d): ");
    let mut b = Pty::spawn(&d, &["attach", &id], false);
    b.expect("allow? (y/a/n/d): ");
    b.type_text("y\r");
    // A's open prompt is withdrawn, naming who answered: user, host and terminal.
    a.expect("answered elsewhere: allowed by client:tester@");
    let line = a
        .seen
        .lines()
        .find(|l| l.contains("answered elsewhere"))
        .unwrap_or_default()
        .to_owned();
    assert!(line.contains(":pts/"), "the terminal is named: {line}");
    a.expect("✓ done");
    assert_eq!(a.wait(), 0, "{}", a.seen);
    assert!(d.work.join("created.txt").exists());
    // A asked once and never answered: its prompt was abandoned, not re-asked.
    assert_eq!(a.seen.matches("allow? (y/a/n/d)").count(), 1, "{}", a.seen);
    // attach prints the turn-completed line.
    b.expect("✓ done");
    // Idle: Ctrl-C detaches.
    b.type_text("\u{3}");
    b.expect("detached");
    assert_eq!(b.wait(), 130, "{}", b.seen);
}

#[test]
fn ctrl_c_in_attach_interrupts_then_detaches_and_the_turn_reads_interrupted() {
    let d = Daemon::start(&scenario_text());
    // run: one Ctrl-C interrupts; the summary says so, without the CLI's diagnostics.
    let mut t = Pty::spawn(&d, &["run", "Tell a long story"], false);
    t.expect("Once");
    t.type_text("\u{3}");
    t.expect("interrupting the turn");
    t.expect("⏹ interrupted");
    assert_eq!(t.wait(), 130, "{}", t.seen);
    assert!(!t.seen.contains("ede_diagnostic"), "{}", t.seen);
    assert!(!t.seen.contains("error_during_execution"), "{}", t.seen);

    // attach: the first Ctrl-C interrupts the running turn, the second detaches.
    let sent = d.ok_json(&["send", "@last", "--json", "--no-wait", "Tell a long story"]);
    assert!(sent[0]["seq"].as_u64().is_some());
    let after = (sent[0]["seq"].as_u64().unwrap_or(1) - 1).to_string();
    let mut a = Pty::spawn(&d, &["attach", "@last", "--after-seq", &after], false);
    a.expect("Once");
    a.type_text("\u{3}");
    a.expect("interrupting the turn");
    a.type_text("\u{3}");
    a.expect("detached");
    assert_eq!(a.wait(), 130, "{}", a.seen);
}

#[test]
fn run_without_a_prompt_on_a_terminal_is_a_chat_with_single_key_approvals() {
    let d = Daemon::start(&scenario_text());
    let mut t = Pty::spawn(&d, &["run"], false);
    t.expect("ostler chat");
    t.expect("you> ");
    t.type_text("Create the file please\r");
    t.expect("allow? (y/a/n/d): ");
    // One key, no Enter.
    t.type_text("y");
    t.expect("Finished: the tool call is settled.");
    t.expect("✓ done");
    t.expect_n("you> ", 2);
    // The same session goes on.
    t.type_text("Say hello\r");
    t.expect("Hello from the fake model!");
    t.expect_n("✓ done", 2);
    t.expect_n("you> ", 3);
    // Ctrl-D ends the chat; the session stays.
    t.type_text("\u{4}");
    t.expect("stays");
    assert_eq!(t.wait(), 0, "{}", t.seen);
    assert!(d.work.join("created.txt").exists());
    let list = d.ok_json(&["sessions", "--json"]);
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["turns"], 2);
    assert_eq!(list[0]["state"], "idle");
}
