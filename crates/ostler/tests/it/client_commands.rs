//! The other client commands end to end against a live daemon: sessions, show, send,
//! attach (answering a question by typing), stop, resume (and --fork), delete, health;
//! tokens, Unix sockets and connection errors.
#![allow(clippy::disallowed_methods)] // spawns the ostler binary (daemon and clients)

use crate::common;

use std::io::Read as _;
use std::process::{Child, Command, Stdio};

use common::client::{Pty, Served, describe, json_lines, scenario_text};
use serde_json::{Value, json};

#[test]
fn session_lifecycle_through_the_commands() {
    let d = Served::start(&scenario_text());
    let ev = d.ok_json(&["run", "--json", "Say hello"]);
    let id = ev[0]["session"]["id"].as_str().expect("id").to_owned();

    // sessions: JSON and the table.
    let list = d.ok_json(&["sessions", "--json"]);
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["id"], id.as_str());
    assert_eq!(list[0]["state"], "idle");
    assert_eq!(list[0]["turns"], 1);
    let out = d.client(&["sessions"], None);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.starts_with("ID") && table.contains("STATE") && table.contains(&id),
        "{table}"
    );
    assert!(
        d.ok_json(&["sessions", "--json", "--state", "stopped"])
            .is_empty()
    );

    // show: the session, and its stored log with gap-free seqs from 1.
    let shown = d.ok_json(&["show", &id, "--json"]);
    assert_eq!(shown[0]["cli_version"], "2.1.332");
    let last_seq = shown[0]["last_seq"].as_u64().expect("last_seq");
    let log = d.ok_json(&["show", &id, "--events", "--json"]);
    let seqs: Vec<u64> = log[1..]
        .iter()
        .map(|e| e["seq"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(seqs, (1..=last_seq).collect::<Vec<_>>());
    let human =
        String::from_utf8_lossy(&d.client(&["show", &id, "--events"], None).stdout).to_string();
    assert!(
        human.contains("Hello from the fake model!") && human.contains("state: idle"),
        "{human}"
    );

    // send: streams the turn it starts; idempotent with a message id.
    let ev = d.ok_json(&["send", &id, "--json", "Say hello again"]);
    let done: Vec<&Value> = ev
        .iter()
        .filter(|e| e["type"] == "turn_completed")
        .collect();
    assert_eq!(done.len(), 1, "exactly the turn of this message: {ev:?}");
    assert!(
        ev.iter()
            .all(|e| e["seq"].as_u64().is_none_or(|s| s == 0 || s > last_seq)
                || e["type"] == "run_summary")
    );
    // The human form: the answer the real CLI streams in deltas is shown once, whole (the
    // text streamed equals the block's, so the block is not printed again).
    let out = d.client(&["send", &id, "Say hello in words"], None);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.matches("Hello from the fake model!").count(),
        1,
        "{}",
        describe(&out)
    );
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("did not reach this client"),
        "{}",
        describe(&out)
    );
    let a = d.ok_json(&[
        "send",
        &id,
        "--json",
        "--no-wait",
        "--message-id",
        "m-1",
        "Say hello once",
    ]);
    let b = d.ok_json(&[
        "send",
        &id,
        "--json",
        "--no-wait",
        "--message-id",
        "m-1",
        "Say hello once",
    ]);
    assert_eq!(a[0]["duplicate"], false);
    assert_eq!(b[0]["duplicate"], true);
    assert_eq!(a[0]["seq"], b[0]["seq"]);
    // A retry that waits, of a message whose turn is over: it shows that turn and ends
    // (it does not wait for a turn after the session's last event). The m-1 turn may
    // still run when m-2 is sent: each ends at the turn that answers m-2, its last.
    let send_m2 = || {
        let args = [
            "send",
            &id,
            "--json",
            "--message-id",
            "m-2",
            "Say hello twice",
        ];
        d.ok_json(&args)
    };
    let (first, again) = (send_m2(), send_m2());
    let turn = |ev: &[Value]| {
        ev.iter()
            .rev()
            .find(|e| e["type"] == "turn_completed")
            .map(|e| e["seq"].clone())
    };
    assert!(turn(&first).is_some(), "{first:?}");
    assert_eq!(turn(&first), turn(&again), "the same turn, shown again");

    // stop -> resume continues the same session; fork branches a new one.
    let stopped = d.ok_json(&["stop", &id, "--json"]);
    assert_eq!(stopped[0]["state"], "stopped");
    assert_eq!(stopped[0]["stopped"], true);
    // Stopping it again does nothing and says so (exit 0), as resume of a live one does.
    let again = d.ok_json(&["stop", &id, "--json"]);
    assert_eq!(
        (&again[0]["state"], &again[0]["stopped"]),
        (&"stopped".into(), &false.into())
    );
    let out = d.client(&["stop", &id], None);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("nothing to stop"),
        "{}",
        describe(&out)
    );
    let out = d.client(&["send", &id, "Say hello"], None);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("FAILED_PRECONDITION"),
        "{}",
        describe(&out)
    );
    let resumed = d.ok_json(&["resume", &id, "--json"]);
    assert_eq!(resumed[0]["id"], id.as_str());
    let ev = d.ok_json(&["send", &id, "--json", "Say hello after resume"]);
    assert!(
        ev.iter()
            .any(|e| e["type"] == "turn_completed" && e["subtype"] == "success")
    );
    d.ok_json(&["stop", &id, "--json"]);
    let forked = d.ok_json(&["resume", &id, "--fork", "--json"]);
    let fork_id = forked[0]["id"].as_str().expect("fork id").to_owned();
    assert!(
        matches!(forked[0]["state"].as_str(), Some("idle" | "starting")),
        "{forked:?}"
    );
    // session.proto says a fork is a new session; the engine currently forks the CLI
    // conversation inside the same ostler session. The client shows whichever it gets.
    let sessions_after_delete = usize::from(fork_id != id);

    // delete: gone, and a clear NOT_FOUND afterwards.
    d.ok_json(&["delete", &id, "--json"]);
    let out = d.client(&["show", &id], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("NOT_FOUND"),
        "{}",
        describe(&out)
    );
    assert_eq!(
        d.ok_json(&["sessions", "--json"]).len(),
        sessions_after_delete
    );
}

#[test]
fn questions_by_typing_and_by_flag() {
    let d = Served::start(&scenario_text());
    let mut t = Pty::spawn(&d, &["run", "Ask me which database to use"], false);
    t.expect("Which database should I use?");
    t.expect("2) PostgreSQL");
    t.expect("choose 1-2: ");
    // Free text is not offered (a daemon accepts only the listed options by default):
    // typed anyway, the client asks again without sending it.
    assert!(!t.seen.contains("type an answer"), "{}", t.seen);
    t.type_text("MySQL please\r");
    t.expect("please type a number between 1 and 2");
    t.expect_n("choose 1-2: ", 2);
    t.type_text("2\r");
    t.expect("Thanks, I will use your choice.");
    assert_eq!(t.wait(), 0, "{}", t.seen);
    assert!(d.model_saw("PostgreSQL"));

    let ev = d.ok_json(&[
        "run",
        "--json",
        "--answer-first",
        "Ask me which database to use",
    ]);
    let answered: Vec<&Value> = ev
        .iter()
        .filter(|e| e["type"] == "question_answered")
        .collect();
    assert_eq!(answered.len(), 1, "{ev:?}");
    assert_eq!(answered[0]["answers"][0]["selected"][0], "SQLite");

    // Without a terminal or --answer-first: the unanswerable-prompt error.
    let out = d.client(&["run", "Ask me which database to use"], None);
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--answer-first"));
}

#[test]
fn attach_answers_a_pending_prompt_by_typing() {
    let d = Served::start(&scenario_text());
    // Leave a prompt pending (no terminal, no flags), then attach on a terminal.
    let out = d.client(&["run", "Create the file please"], None);
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    let id = json_lines(&d.client(&["sessions", "--json"], None).stdout)[0]["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let mut t = Pty::spawn(&d, &["attach", &id, "--until-turn"], false);
    // The whole history is replayed first, then the still-pending prompt is asked.
    t.expect("› Create the file please");
    t.expect("allow? (y/a/n/d): ");
    t.type_text("y\r");
    t.expect("✓ done");
    assert_eq!(t.wait(), 0, "{}", t.seen);
    assert!(d.work.join("created.txt").exists());
    // Only once: the prompt was not asked twice.
    assert_eq!(t.seen.matches("allow? (y/a/n/d)").count(), 1, "{}", t.seen);

    // --after-seq N replays only what follows N; with --until-turn it ends at the first
    // turn after N, even when that turn completed before attach started.
    let last = d.ok_json(&["show", &id, "--json"])[0]["last_seq"]
        .as_u64()
        .expect("seq");
    let sent = d.ok_json(&["send", &id, "--json", "--no-wait", "Say hello"]);
    assert!(sent[0]["seq"].as_u64().is_some_and(|s| s > last));
    let after = last.to_string();
    let ev = d.ok_json(&[
        "attach",
        &id,
        "--json",
        "--after-seq",
        &after,
        "--until-turn",
    ]);
    let stored: Vec<u64> = ev
        .iter()
        .filter_map(|e| e["seq"].as_u64())
        .filter(|s| *s > 0)
        .collect();
    assert_eq!(stored.first().copied(), Some(last + 1), "{ev:?}");
    assert!(
        ev.iter()
            .any(|e| e["type"] == "turn_completed" && e["result"] == "Hello from the fake model!")
    );
}

#[test]
fn health_tokens_unix_socket_and_unreachable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "# clients\nsecret-token-1\n").expect("tokens");
    let sock = dir.path().join("ostler.sock");
    let d = Served::start_with(
        &scenario_text(),
        &[
            "--token-file",
            tokens.to_str().expect("path"),
            "--unix-socket",
            sock.to_str().expect("path"),
        ],
    );
    // Health is exempt from auth; details are not.
    let out = d.client(&["health", "--json"], None);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    let h = &json_lines(&out.stdout)[0];
    assert_eq!(h["status"], "SERVING");
    assert!(
        h["details_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("UNAUTHENTICATED")),
        "{h}"
    );

    // No token: a clear error with a hint.
    let out = d.client(&["sessions"], None);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("UNAUTHENTICATED") && err.contains("--token"),
        "{err}"
    );

    // The token from a flag, a file, or the environment.
    d.ok_json(&["sessions", "--json", "--token", "secret-token-1"]);
    d.ok_json(&[
        "sessions",
        "--json",
        "--token-file",
        tokens.to_str().expect("path"),
    ]);
    let out = d.client(&["health", "--json", "--token", "secret-token-1"], None);
    let h = &json_lines(&out.stdout)[0];
    assert_eq!(h["details"]["claude_code"]["version"], "2.1.332", "{h}");
    assert_eq!(h["details"]["store"]["ok"], true);

    // Over the Unix socket.
    let addr = format!("unix://{}", sock.display());
    let ev = d.ok_json(&[
        "run",
        "--json",
        "--addr",
        &addr,
        "--token",
        "secret-token-1",
        "Say hello",
    ]);
    assert_eq!(
        ev.last().map(|v| v["exit_code"].clone()),
        Some(Value::from(0))
    );

    // Nobody listening: exit 1 and a readable message.
    let out = d.client(&["health", "--addr", "127.0.0.1:1"], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("cannot reach the ostler daemon at http://127.0.0.1:1"),
        "{}",
        describe(&out)
    );
    // With --json a monitor gets a line on stdout too, and the same exit code.
    let out = d.client(&["health", "--json", "--addr", "127.0.0.1:1"], None);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let v: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", describe(&out)));
    assert_eq!(v["status"], "UNREACHABLE", "{v}");
    assert_eq!(v["serving"], false, "{v}");
    assert_eq!(v["addr"], "http://127.0.0.1:1", "{v}");
    assert!(
        v["error"].as_str().unwrap_or("").contains("cannot reach"),
        "{v}"
    );
    // A service name the daemon does not report: its code, on stdout.
    let out = d.client(&["health", "--json", "--service", "no.such.Service"], None);
    assert_eq!(out.status.code(), Some(1), "{}", describe(&out));
    let v: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", describe(&out)));
    assert_eq!(v["status"], "NOT_FOUND", "{v}");
}

#[test]
fn attach_resubscribes_after_the_daemon_dies_and_sees_every_event_once() {
    use std::io::BufRead as _;
    let mut d = Served::start(&scenario_text());
    let ev = d.ok_json(&["run", "--json", "Say hello"]);
    let id = ev[0]["session"]["id"].as_str().expect("id").to_owned();

    let mut child = d.spawn_client(&["attach", &id, "--json", "--until-turn"]);
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    // Attached once the replay has delivered the first turn's result.
    loop {
        let line = rx
            .recv_timeout(common::guard())
            .expect("attach replays the history");
        let done = line.contains("\"type\":\"turn_completed\"");
        lines.push(line);
        if done {
            break;
        }
    }
    // The daemon dies; a new one on the same address and store marks the session
    // resumable (the default: no respawn at start), and the next send resumes it on
    // demand. attach follows a resumable session as it does a suspended one.
    d.kill9();
    d.restart(&[]);
    // attach has reconnected and shown the session resumable before anything resumes it.
    loop {
        let line = rx
            .recv_timeout(common::guard())
            .expect("attach shows the session resumable");
        let resumable = line.contains("\"type\":\"state_changed\"") && line.contains("resumable");
        lines.push(line);
        if resumable {
            break;
        }
    }
    let sent = d.ok_json(&["send", &id, "--json", "--no-wait", "Say hello again"]);
    let sent_seq = sent[0]["seq"].as_u64().expect("seq");
    // attach reconnects by itself and ends after the new turn.
    while let Ok(line) = rx.recv_timeout(common::guard()) {
        lines.push(line);
    }
    let out = common::wait_output(child);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}\n{}", lines.join("\n"));
    assert!(
        stderr.contains("resubscribing") || stderr.contains("retrying"),
        "{stderr}"
    );
    let ev: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let seqs: Vec<u64> = ev
        .iter()
        .filter_map(|e| e["seq"].as_u64())
        .filter(|s| *s > 0)
        .collect();
    let expected: Vec<u64> = (1..=*seqs.last().expect("events")).collect();
    assert_eq!(
        seqs, expected,
        "every stored event exactly once, across the reconnect"
    );
    assert!(ev.iter().any(|e| e["type"] == "turn_completed"
        && e["seq"].as_u64().is_some_and(|s| s > sent_seq)
        && e["subtype"] == "success"));
}

/// The fake model of the busy-session tests: the first answer is held after one delta
/// until the test signals `go`.
const QUEUED: &str = r#"
[[model]]
name = "first"
when = { last_user_text_contains = "First question", messages_lack = "Second question" }
chunks = 4
pause_after_deltas = 1
hold_until = "go"
blocks = [{ type = "text", text = "The first answer, in four parts." }]

[[model]]
name = "second"
when = { messages_contain = "Second question" }
blocks = [{ type = "text", text = "The second answer." }]
"#;

/// A session whose first turn (`ostler run`) is running, held by the model, and an
/// `ostler send` of a second message to it, recorded: (run, send, session id, the second
/// message's id).
fn busy_session_with_a_queued_send(d: &Served) -> (Child, Child, String, String) {
    let mut run = d.spawn_client(&["run", "--json", "First question."]);
    let started = read_until(&mut run, |v| v["type"] == "session_started");
    let id = started["session_id"].as_str().expect("id").to_owned();
    d.await_model_request("first");
    // The send follows from before its message: the message is its first event.
    let mut send = d.spawn_client(&["send", &id, "--json", "Second question."]);
    // (Not the CLI's echo of the first message, when it is stored after the subscription.)
    let sent = read_until(&mut send, |v| {
        v["type"] == "user_message" && v["is_replay"] != true
    });
    assert_eq!(sent["text"], "Second question.");
    let message_id = sent["message_id"].as_str().expect("message_id").to_owned();
    (run, send, id, message_id)
}

/// Reads a `--json` client's stdout up to the first event that `wanted` (the rest stays
/// in the pipe).
fn read_until(child: &mut Child, wanted: impl Fn(&Value) -> bool) -> Value {
    let stdout = child.stdout.as_mut().expect("stdout");
    let mut line = Vec::new();
    loop {
        line.clear();
        let mut byte = [0u8];
        while stdout.read(&mut byte).expect("read") == 1 && byte[0] != b'\n' {
            line.push(byte[0]);
        }
        assert!(!line.is_empty(), "stdout ended before the event waited for");
        let v: Value = serde_json::from_slice(&line).expect("json");
        if wanted(&v) {
            return v;
        }
    }
}

/// `ostler send` to a session whose turn is running: the CLI queues the message and
/// answers it in a turn of its own after the running one. `send` follows until the turn
/// that answers its message, not the running turn's end; the session stays running in
/// between. 2.1.332 names the message in the result; 2.1.121 and 1.0.128 do not, and the
/// CLI's echo of the message (`--replay-user-messages`) says which turn answers it.
#[test]
fn send_to_a_busy_session_shows_the_answer_to_its_own_message() {
    send_to_a_busy_session_on(common::NEW);
}

#[test]
fn send_to_a_busy_session_on_a_release_that_names_no_answers() {
    send_to_a_busy_session_on("2.1.121");
    send_to_a_busy_session_on(common::OLD);
}

fn send_to_a_busy_session_on(release: &str) {
    let d = Served::start_on(release, QUEUED, &[]);
    let (run, send, id, message_id) = busy_session_with_a_queued_send(&d);
    d.fake.signal("go");

    let run = common::wait_output(run);
    assert_eq!(run.status.code(), Some(0), "{}", describe(&run));
    let send = common::wait_output(send);
    assert_eq!(send.status.code(), Some(0), "{}", describe(&send));
    let ev = json_lines(&send.stdout);
    let done: Vec<&Value> = ev
        .iter()
        .filter(|e| e["type"] == "turn_completed")
        .collect();
    // The running turn's end is shown on the way (it came after the message), and the
    // send ends at the turn that answers its message.
    assert_eq!(done.len(), 2, "{}", describe(&send));
    assert_eq!(done[0]["result"], "The first answer, in four parts.");
    assert_eq!(done[1]["result"], "The second answer.");
    assert_eq!(done[1]["user_message_ids"], json!([message_id]));
    assert_ne!(done[0]["user_message_ids"], json!([message_id]));
    let summary = ev.last().expect("a summary line");
    assert_eq!(summary["type"], "run_summary", "{summary}");
    // Read back from the store: the same ids; and the session was running from the first
    // message to the second answer (not idle between the turns, when it could have been
    // suspended with the second message in the CLI's queue).
    let log = d.ok_json(&["show", &id, "--events", "--json"]);
    let stored: Vec<&Value> = log
        .iter()
        .filter(|e| e["type"] == "turn_completed")
        .map(|e| &e["user_message_ids"])
        .collect();
    assert_eq!(
        stored,
        [&done[0]["user_message_ids"], &done[1]["user_message_ids"]]
    );
    let (first, second) = (&done[0]["seq"], &done[1]["seq"]);
    let between: Vec<&Value> = log
        .iter()
        .filter(|e| e["type"] == "state_changed")
        .filter(|e| e["seq"].as_u64() > first.as_u64() && e["seq"].as_u64() < second.as_u64())
        .collect();
    assert!(
        between.iter().all(|e| e["to"] != "idle"),
        "idle between the turns: {between:?}"
    );
    assert_eq!(d.ok_json(&["show", &id, "--json"])[0]["state"], "idle");
}

/// A slash command queued behind a running turn, then a prompt, on releases that name no
/// answers (1.0.128, 2.1.0): the CLI answers the slash command with a result of its own
/// and echoes nothing for it. That result answers the slash command (its `send` ends
/// there), not the prompt queued behind it (its `send` goes on to its own answer), and the
/// session stays running from the first turn to the prompt's.
#[test]
fn a_send_queued_behind_a_slash_command_shows_its_own_answer() {
    for release in [common::OLD, "2.1.0"] {
        queued_behind_a_slash_command_on(release);
    }
}

fn queued_behind_a_slash_command_on(release: &str) {
    let d = Served::start_on(release, QUEUED, &[]);
    let mut run = d.spawn_client(&["run", "--json", "First question."]);
    let started = read_until(&mut run, |v| v["type"] == "session_started");
    let id = started["session_id"].as_str().expect("id").to_owned();
    d.await_model_request("first");
    let own_message = |send: &mut Child, text: &str| {
        let sent = read_until(send, |v| {
            v["type"] == "user_message" && v["is_replay"] != true
        });
        assert_eq!(sent["text"], text);
        sent["message_id"].as_str().expect("message_id").to_owned()
    };
    let mut cost = d.spawn_client(&["send", &id, "--json", "/cost"]);
    let cost_id = own_message(&mut cost, "/cost");
    let mut send = d.spawn_client(&["send", &id, "--json", "Second question."]);
    let message_id = own_message(&mut send, "Second question.");
    d.fake.signal("go");

    let run = common::wait_output(run);
    assert_eq!(run.status.code(), Some(0), "{release}: {}", describe(&run));
    let completed = |out: &std::process::Output| -> Vec<Value> {
        json_lines(&out.stdout)
            .into_iter()
            .filter(|e| e["type"] == "turn_completed")
            .collect()
    };
    let cost = common::wait_output(cost);
    assert_eq!(
        cost.status.code(),
        Some(0),
        "{release}: {}",
        describe(&cost)
    );
    let done = completed(&cost);
    assert_eq!(done.len(), 2, "{release}: {}", describe(&cost));
    assert_eq!(done[1]["user_message_ids"], json!([cost_id]), "{release}");
    let send = common::wait_output(send);
    assert_eq!(
        send.status.code(),
        Some(0),
        "{release}: {}",
        describe(&send)
    );
    let done = completed(&send);
    // The first turn's end, the slash command's, then its own.
    assert_eq!(done.len(), 3, "{release}: {}", describe(&send));
    assert_eq!(done[1]["user_message_ids"], json!([cost_id]), "{release}");
    assert_eq!(done[2]["result"], "The second answer.", "{release}");
    assert_eq!(
        done[2]["user_message_ids"],
        json!([message_id]),
        "{release}"
    );
    let log = d.ok_json(&["show", &id, "--events", "--json"]);
    let (first, last) = (done[0]["seq"].as_u64(), done[2]["seq"].as_u64());
    let idle: Vec<&Value> = log
        .iter()
        .filter(|e| e["type"] == "state_changed" && e["to"] == "idle")
        .filter(|e| e["seq"].as_u64() > first && e["seq"].as_u64() < last)
        .collect();
    assert!(
        idle.is_empty(),
        "{release}: idle between the turns: {idle:?}"
    );
    assert_eq!(d.ok_json(&["show", &id, "--json"])[0]["state"], "idle");
}

/// An interrupt that withdraws the queued messages: the `send` waiting for one is told
/// (no turn will answer it) and ends, and the session is idle, not left running.
#[test]
fn a_queued_send_withdrawn_by_an_interrupt_ends_and_the_session_is_idle() {
    let d = Served::start(QUEUED);
    let (run, send, id, message_id) = busy_session_with_a_queued_send(&d);
    let interrupted = d.ok_json(&["interrupt", &id, "--cancel-queued", "--json"]);
    assert_eq!(interrupted[0]["interrupted"], true, "{interrupted:?}");
    assert_eq!(
        interrupted[0]["cancelled"],
        json!([message_id]),
        "{interrupted:?}"
    );

    let run = common::wait_output(run);
    assert_eq!(
        run.status.code(),
        Some(130),
        "interrupted: {}",
        describe(&run)
    );
    let send = common::wait_output(send);
    assert_eq!(
        send.status.code(),
        Some(130),
        "interrupted (by another client): {}",
        describe(&send)
    );
    let ev = json_lines(&send.stdout);
    assert!(
        !ev.iter().any(|e| e["result"] == "The second answer."),
        "{}",
        describe(&send)
    );
    let summary = ev.last().expect("a summary line");
    assert_eq!(summary["outcome"], "interrupted", "{}", describe(&send));
    assert!(
        summary["message"].to_string().contains("cancelled"),
        "{}",
        describe(&send)
    );
    let shown = d.ok_json(&["show", &id, "--json"]);
    assert_eq!(shown[0]["state"], "idle", "{shown:?}");
    assert!(!d.model_saw("Second question"));
    // Withdrawn is done: the next resume does not fail it ("send it again").
    d.ok_json(&["stop", &id, "--json"]);
    d.ok_json(&["resume", &id, "--json"]);
    let events = d.ok_json(&["show", &id, "--events", "--json"]);
    assert!(
        !events
            .iter()
            .any(|e| e["code"] == "delivery_failed" || e["code"] == "message_unanswered"),
        "{events:?}"
    );
}

/// `ostler send --now` to a busy session: the running turn (held by the model) is stopped
/// and the message runs at once; `run` ends with the answer cut short, `send` at its own
/// answer, and the
/// message is shown and stored as sent `now`. On a release that ignores the field
/// (1.0.128) `send --verbatim` is refused before anything is recorded.
#[test]
fn send_now_stops_the_running_turn_and_an_ignored_field_is_refused() {
    let d = Served::start(QUEUED);
    let mut run = d.spawn_client(&["run", "--json", "First question."]);
    let started = read_until(&mut run, |v| v["type"] == "session_started");
    let id = started["session_id"].as_str().expect("id").to_owned();
    d.await_model_request("first");
    let send = d.client(&["send", &id, "--json", "--now", "Second question."], None);
    assert_eq!(send.status.code(), Some(0), "{}", describe(&send));
    let ev = json_lines(&send.stdout);
    let sent = ev
        .iter()
        .find(|e| e["type"] == "user_message" && e["is_replay"] != true)
        .expect("the message");
    assert_eq!(sent["priority"], "now", "{sent}");
    let done = ev
        .iter()
        .rfind(|e| e["type"] == "turn_completed")
        .expect("its turn");
    assert_eq!(done["result"], "The second answer.", "{}", describe(&send));
    assert_eq!(done["user_message_ids"], json!([sent["message_id"]]));
    // Stopped: 2.1.332 ends a turn stopped mid-answer with what was streamed, and one
    // stopped before its first delta arrived with an error (both measured; which one
    // depends on whether the held answer's first delta reached the CLI first).
    let run = common::wait_output(run);
    let first = json_lines(&run.stdout)
        .into_iter()
        .find(|e| e["type"] == "turn_completed")
        .expect("the first turn's end");
    assert!(
        first["terminal_reason"] == "aborted_streaming"
            || first["subtype"] == "error_during_execution",
        "{}",
        describe(&run)
    );
    assert_ne!(first["result"], "The first answer, in four parts.");
    let shown =
        String::from_utf8_lossy(&d.client(&["show", &id, "--events"], None).stdout).to_string();
    assert!(shown.contains("Second question. (now)"), "{shown}");

    // --paste @FILE: the file's text goes with the message, marked as pasted.
    let paste = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(paste.path(), "PASTED-LOG-LINE error[E0308]\n").unwrap();
    let arg = format!("@{}", paste.path().display());
    let pasted = d.client(
        &["send", &id, "--json", "Why does it fail?", "--paste", &arg],
        None,
    );
    assert_eq!(pasted.status.code(), Some(0), "{}", describe(&pasted));
    let sent = json_lines(&pasted.stdout)
        .into_iter()
        .find(|e| e["type"] == "user_message" && e["is_replay"] != true)
        .expect("the message");
    assert_eq!(sent["pasted"], json!(["PASTED-LOG-LINE error[E0308]\n"]));
    assert!(d.model_saw("PASTED-LOG-LINE"));
    let both = d.client(&["send", &id, "--paste", "-"], Some("from stdin"));
    assert_ne!(both.status.code(), Some(0), "{}", describe(&both));
    assert!(
        String::from_utf8_lossy(&both.stderr).contains("not both"),
        "{}",
        describe(&both)
    );

    let old = Served::start_on(common::OLD, QUEUED, &[]);
    let created = old.ok_json(&["run", "--json", "Hello there."]);
    let old_id = created
        .iter()
        .find(|e| e["type"] == "session_started")
        .and_then(|e| e["session_id"].as_str())
        .expect("id")
        .to_owned();
    let refused = old.client(&["send", &old_id, "--verbatim", "/deploy @prod"], None);
    assert_eq!(refused.status.code(), Some(1), "{}", describe(&refused));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("verbatim") && err.contains(common::OLD),
        "{err}"
    );
    assert!(!old.model_saw("/deploy"));
}

/// Ctrl-C while the turn that answers `send`'s own message runs, after the turn that was
/// running when it was sent ended: the session stayed running (the message was still owed
/// an answer), so the first Ctrl-C interrupts that turn; it does not detach.
#[test]
fn ctrl_c_in_the_turn_that_answers_a_queued_send_interrupts_it() {
    let scenario = QUEUED.replace(
        r#"blocks = [{ type = "text", text = "The second answer." }]"#,
        r#"chunks = 4
pause_after_deltas = 1
hold_until = "go2"
blocks = [{ type = "text", text = "Held: the second answer." }]"#,
    );
    assert_ne!(scenario, QUEUED);
    let d = Served::start(&scenario);
    let mut run = d.spawn_client(&["run", "--json", "First question."]);
    let started = read_until(&mut run, |v| v["type"] == "session_started");
    let id = started["session_id"].as_str().expect("id").to_owned();
    d.await_model_request("first");
    let mut t = Pty::spawn(&d, &["send", &id, "Second question."], false);
    // The message is stored (queued by the CLI behind the running turn).
    read_until(&mut run, |v| {
        v["type"] == "user_message" && v["text"] == "Second question."
    });
    d.fake.signal("go");
    let run = common::wait_output(run);
    assert_eq!(run.status.code(), Some(0), "{}", describe(&run));
    // The first delta of the second turn: the send has shown the first turn's end.
    d.await_model_request("second");
    t.expect("Held:");
    t.type_text("\x03");
    t.expect("interrupting the turn");
    t.expect("⏹ interrupted");
    assert_eq!(t.wait(), 130, "{}", t.seen);
    assert!(!t.seen.contains("detached"), "{}", t.seen);
    let shown = d.ok_json(&["show", &id, "--json"]);
    assert_eq!(shown[0]["state"], "idle", "{shown:?}");
}

#[test]
fn interrupt_command_ends_a_running_turn() {
    use std::io::BufRead as _;
    let d = Served::start(&scenario_text());
    let mut run = d.spawn_client(&["run", "--json", "Tell a long story"]);
    let mut lines = std::io::BufReader::new(run.stdout.take().expect("stdout")).lines();
    let mut first = Vec::new();
    // Wait until the model is answering (the turn is running), then interrupt it.
    let id = loop {
        let line = lines.next().expect("a line").expect("utf-8");
        let v: Value = serde_json::from_str(&line).expect("json");
        first.push(v.clone());
        if v["type"] == "system_notice" || v["type"] == "session_started" {
            break v["session_id"].as_str().expect("id").to_owned();
        }
    };
    d.ok_json(&["interrupt", &id, "--json"]);
    let rest: Vec<Value> = lines
        .map_while(Result::ok)
        .map(|l| serde_json::from_str(&l).expect("json"))
        .collect();
    let out = common::wait_output(run);
    assert_eq!(
        out.status.code(),
        Some(130),
        "a turn interrupted by another client reads as interrupted, not failed"
    );
    assert!(
        rest.iter().any(|e| e["outcome"] == "interrupted"),
        "{rest:?}"
    );
    let done: Vec<&Value> = rest
        .iter()
        .filter(|e| e["type"] == "turn_completed")
        .collect();
    assert_eq!(done.len(), 1, "{rest:?}");
    assert_eq!(done[0]["subtype"], "error_during_execution");
    // The session lives on and takes the next message.
    let ev = d.ok_json(&["send", &id, "--json", "Say hello"]);
    assert!(
        ev.iter()
            .any(|e| e["type"] == "turn_completed" && e["subtype"] == "success")
    );
}

#[test]
fn client_finds_the_daemon_through_the_daemons_config_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "cfg-token\n").expect("tokens");
    let d = Served::start_with(
        &scenario_text(),
        &["--token-file", tokens.to_str().expect("path")],
    );
    // The same file the daemon would read: its listen address and its token file.
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[listen]\naddr = \"{}\"\n[auth]\ntoken_file = \"{}\"\n",
            d.addr,
            tokens.display()
        ),
    )
    .expect("config");
    let run = |env: &[(&str, String)]| {
        let mut cmd = Command::new(common::OSTLER);
        cmd.args(["sessions", "--json"])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", &d.home)
            .envs(env.iter().map(|(k, v)| (*k, v.clone())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        common::wait_output(cmd.spawn().expect("spawn"))
    };
    let out = run(&[("OSTLER_CONFIG", config.display().to_string())]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    // The daemon's OSTLER_<SECTION>__<KEY> variables work for the client too.
    let out = run(&[
        ("OSTLER_LISTEN__ADDR", d.addr.clone()),
        ("OSTLER_AUTH__TOKENS", "[\"cfg-token\"]".to_owned()),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
    // Flags win over the file.
    let mut cmd = Command::new(common::OSTLER);
    cmd.args(["sessions", "--token", "wrong"])
        .env_clear()
        .env("HOME", &d.home)
        .env("OSTLER_CONFIG", &config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let out = common::wait_output(cmd.spawn().expect("spawn"));
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("UNAUTHENTICATED"));
}
