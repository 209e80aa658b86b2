//! `ostler-fake-claude`: version, discovery by the supervisor, turns in every mode decoded
//! by the 2.1.330 adapter, control requests, resume.

#![allow(clippy::disallowed_methods)] // runs the fake CLI binary under test

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use ostler_protocol::{Decoder, Event};
use ostler_testkit::fake_claude::{SENT_NS_FIELD, VERSION_OUTPUT};
use serde_json::{Value, json};

const FAKE: &str = env!("CARGO_BIN_EXE_ostler-fake-claude");
/// A guard against a hang, not a measurement: the machine may be busy.
fn guard() -> Duration {
    ostler_testkit::timeouts::guard()
}

/// The stream-json argv of a session, as the supervisor writes it.
fn session_args() -> Vec<String> {
    ostler_protocol::argv::StreamJsonArgs::session().into_args()
}

struct Fake {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Fake {
    fn start(home: &Path, extra: &[&str]) -> Fake {
        let mut child = Command::new(FAKE)
            .args(session_args())
            .args(extra)
            .current_dir(home)
            .env_clear()
            .env("HOME", home)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the fake");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stdout).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Fake {
            child,
            stdin,
            lines,
        }
    }

    fn send(&mut self, v: Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{v}").expect("write to the fake");
        stdin.flush().expect("flush");
    }

    fn user(&mut self, text: &str) {
        self.send(
            json!({"type": "user", "message": {"role": "user", "content": text},
            "parent_tool_use_id": null, "session_id": ""}),
        );
    }

    fn control(&mut self, id: &str, request: Value) {
        self.send(json!({"type": "control_request", "request_id": id, "request": request}));
    }

    fn next(&self) -> String {
        self.lines
            .recv_timeout(guard())
            .expect("the fake wrote nothing (or exited)")
    }

    /// Lines up to and including the next `result`.
    fn turn(&self) -> Vec<String> {
        let mut out = Vec::new();
        loop {
            let l = self.next();
            let is_result = json(&l)["type"] == "result";
            out.push(l);
            if is_result {
                return out;
            }
        }
    }

    fn close(mut self) -> i32 {
        drop(self.stdin.take());
        self.child.wait().expect("wait").code().unwrap_or(-1)
    }
}

fn json(l: &str) -> Value {
    serde_json::from_str(l).expect("every line is JSON")
}

/// Decodes lines with the 2.1.330 adapter; asserts nothing is a diagnostic or unknown.
fn decode(lines: &[String]) -> Vec<Vec<Event>> {
    let v = semver::Version::new(2, 1, 330);
    let mut d = Decoder::for_release(Some(&v));
    assert!(!d.is_tolerant(), "2.1.330 has its own adapter");
    lines
        .iter()
        .map(|l| {
            let mut evs = Vec::new();
            d.decode_into(l.as_bytes(), &mut evs);
            for e in &evs {
                assert!(
                    !matches!(e, Event::Diagnostic(_) | Event::Unknown(_)),
                    "line decoded to {e:?}: {l}"
                );
            }
            evs
        })
        .collect()
}

fn assistant_texts(events: &[Vec<Event>]) -> Vec<String> {
    events
        .iter()
        .flatten()
        .filter_map(|e| match e {
            Event::AssistantBlock(b) => match &b.block {
                ostler_protocol::ContentBlock::Text { text } => Some(text.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

#[test]
fn version_is_2_1_330() {
    let out = Command::new(FAKE)
        .arg("--version")
        .output()
        .expect("run --version");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.trim(), VERSION_OUTPUT);
    let v = ostler_supervisor::parse_version_output(&text).expect("parsable");
    assert_eq!(v.version, semver::Version::new(2, 1, 330));
    // Like the real CLI, `--version` wins over options it would refuse.
    let out = Command::new(FAKE)
        .args(["--no-such-flag", "--version"])
        .output()
        .expect("run");
    assert!(out.status.success());
}

#[test]
fn unknown_options_are_named() {
    let out = Command::new(FAKE)
        .args(session_args())
        .arg("--no-such-flag")
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("error: unknown option '--no-such-flag'"),
        "{out:?}"
    );
}

/// The Agent SDKs start the CLI without `-p` (the real CLI runs headless when both formats
/// are stream-json); the fake takes their argv too (ostler-bench's SDK baselines), and still
/// refuses a session without `-p` otherwise.
#[test]
fn the_agent_sdks_argv_runs_without_print() {
    let home = tempfile::tempdir().expect("tempdir");
    // What `@anthropic-ai/claude-agent-sdk` 0.3.332 and `claude-agent-sdk` 0.2.189 pass.
    let ts = [
        "--output-format",
        "stream-json",
        "--verbose",
        "--input-format",
        "stream-json",
    ];
    let py = [
        "--output-format",
        "stream-json",
        "--verbose",
        "--system-prompt",
        "",
        "--input-format",
        "stream-json",
    ];
    for argv in [&ts[..], &py[..]] {
        let mut child = Command::new(FAKE)
            .args(argv)
            .current_dir(home.path())
            .env_clear()
            .env("HOME", home.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the fake");
        let mut stdin = child.stdin.take().expect("stdin");
        for v in [
            json!({"type": "control_request", "request_id": "i", "request": {"subtype": "initialize"}}),
            json!({"type": "user", "message": {"role": "user", "content": "fake:firehose 3"},
                "parent_tool_use_id": null, "session_id": ""}),
        ] {
            writeln!(stdin, "{v}").expect("write");
        }
        drop(stdin);
        let out = child.wait_with_output().expect("wait");
        assert_eq!(out.status.code(), Some(0), "{argv:?}");
        let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(json)
            .collect();
        assert_eq!(lines[0]["response"]["request_id"], "i", "{argv:?}");
        // The answer, then init, status, 3 firehose lines and the result.
        assert_eq!(lines.len(), 1 + 6, "{argv:?}: {lines:?}");
        assert_eq!(lines.last().expect("a line")["type"], "result");
    }
    let out = Command::new(FAKE)
        .args(["--output-format", "stream-json", "--verbose"])
        .current_dir(home.path())
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("only runs in print mode (-p)"),
        "{out:?}"
    );
}

#[tokio::test]
async fn discovery_accepts_it() {
    let opts = ostler_supervisor::DiscoverOptions {
        claude_path: Some(PathBuf::from(FAKE)),
        ..Default::default()
    };
    let inst = ostler_supervisor::discover(&opts)
        .await
        .expect("the fake passes discovery");
    assert_eq!(inst.version, semver::Version::new(2, 1, 330));
    assert!(inst.level.can_run(), "{}", inst.message);
    assert!(inst.capabilities.stdio_permission_prompt);
    assert!(inst.capabilities.include_partial_messages);
    assert!(inst.capabilities.fork_session);
    assert!(inst.capabilities.max_turns);
    let probe = inst.probe.expect("flags were probed");
    assert!(probe.note.is_none(), "{:?}", probe.note);
    assert_eq!(
        probe.sdk_url,
        ostler_supervisor::compat::SdkUrl::AnthropicOnly,
        "like 2.1.121+"
    );
}

#[test]
fn a_turn_with_partials_and_initialize() {
    let home = tempfile::tempdir().expect("tempdir");
    let mut f = Fake::start(home.path(), &["--include-partial-messages"]);
    f.control("req-1", json!({"subtype": "initialize"}));
    let resp = json(&f.next());
    assert_eq!(resp["type"], "control_response");
    assert_eq!(resp["response"]["subtype"], "success");
    assert_eq!(resp["response"]["request_id"], "req-1");
    f.user("Say hello.");
    let lines = f.turn();
    let first = json(&lines[0]);
    assert_eq!(
        (first["type"].as_str(), first["subtype"].as_str()),
        (Some("system"), Some("init"))
    );
    assert_eq!(first["cwd"], json!(home.path().to_string_lossy()));
    let sid = first["session_id"]
        .as_str()
        .expect("session id")
        .to_string();
    assert_eq!(sid.len(), 36, "a uuid: {sid}");
    for l in &lines {
        let v = json(l);
        if let Some(s) = v.get("session_id") {
            assert_eq!(s, &json!(sid), "{l}");
        }
    }
    let events = decode(&lines);
    let flat: Vec<&Event> = events.iter().flatten().collect();
    assert!(matches!(flat[0], Event::SessionStarted(_)));
    assert!(flat.iter().any(|e| matches!(e, Event::PartialDelta(_))));
    assert!(matches!(flat.last(), Some(Event::TurnResult(_))));
    assert_eq!(
        assistant_texts(&events),
        vec!["Hello from the fake model! (turn 1)".to_string()]
    );
    // A second turn: init again (as 2.1.330 does), turn 2.
    f.user("Again.");
    let events = decode(&f.turn());
    assert_eq!(
        assistant_texts(&events),
        vec!["Hello from the fake model! (turn 2)".to_string()]
    );
    assert_eq!(f.close(), 0);
}

#[test]
fn firehose_lines_are_each_one_stored_event() {
    let home = tempfile::tempdir().expect("tempdir");
    let mut f = Fake::start(home.path(), &["--include-partial-messages"]);
    f.user("fake:firehose 3001");
    let lines = f.turn();
    // init, status, the 3001 lines, result.
    assert_eq!(lines.len(), 3001 + 3);
    let events = decode(&lines[2..lines.len() - 1]);
    for (l, evs) in lines[2..].iter().zip(&events) {
        let stored: Vec<&Event> = evs.iter().filter(|e| !e.is_live_only()).collect();
        assert_eq!(stored.len(), 1, "one stored event per line: {l} -> {evs:?}");
    }
    let mut kinds = std::collections::BTreeMap::new();
    for e in events.iter().flatten() {
        let k = match e {
            Event::AssistantBlock(_) => "assistant",
            Event::ToolResult(_) => "tool_result",
            Event::SystemNotice(_) => "system",
            other => panic!("unexpected {other:?}"),
        };
        *kinds.entry(k).or_insert(0) += 1;
    }
    assert_eq!(kinds["assistant"], 1001);
    assert_eq!(kinds["tool_result"], 1000);
    assert_eq!(kinds["system"], 1000);
    assert_eq!(f.close(), 0);
}

#[test]
fn partials_only_with_the_flag() {
    let home = tempfile::tempdir().expect("tempdir");
    for (flag, expect) in [(true, 500usize), (false, 0)] {
        let extra: &[&str] = if flag {
            &["--include-partial-messages"]
        } else {
            &[]
        };
        let mut f = Fake::start(home.path(), extra);
        f.user("fake:partials 500");
        let events = decode(&f.turn());
        let deltas = events
            .iter()
            .flatten()
            .filter(|e| matches!(e, Event::PartialDelta(_)))
            .count();
        assert_eq!(deltas, expect, "partials flag {flag}");
        let texts = assistant_texts(&events);
        assert_eq!(texts.len(), 1);
        assert!(texts[0].starts_with("p0 p1 p2 ") && texts[0].ends_with("p499 "));
        assert_eq!(f.close(), 0);
    }
}

#[test]
fn paced_lines_carry_their_write_time() {
    let home = tempfile::tempdir().expect("tempdir");
    let mut f = Fake::start(home.path(), &[]);
    let epoch_ns = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_nanos() as u64
    };
    let before = epoch_ns();
    f.user("fake:paced 5000 50");
    let lines = f.turn();
    let after = epoch_ns();
    let mut last = 0u64;
    let mut n = 0;
    for l in &lines {
        let v = json(l);
        let Some(sent) = v.get(SENT_NS_FIELD) else {
            continue;
        };
        let sent = sent.as_u64().expect("ns as an integer");
        let text = v["message"]["content"][0]["text"].as_str().expect("text");
        assert_eq!(text, format!("paced {n} sent_ns={sent}"));
        assert!(sent >= last, "write times do not go back");
        // The real time of the write (not a stand-in left in the line).
        assert!(
            before <= sent && sent <= after,
            "{sent} not in {before}..={after}"
        );
        last = sent;
        n += 1;
    }
    assert_eq!(n, 50);
    assert_eq!(f.close(), 0);
}

#[test]
fn control_requests_get_answers_and_interrupt_ends_a_turn() {
    let home = tempfile::tempdir().expect("tempdir");
    let mut f = Fake::start(home.path(), &[]);
    f.control(
        "m",
        json!({"subtype": "set_model", "model": "claude-haiku-4-5"}),
    );
    let replay = json(&f.next());
    assert_eq!(replay["isReplay"], true);
    let r = json(&f.next());
    assert_eq!(r["response"]["request_id"], "m");
    assert_eq!(r["response"]["response"]["model"], "claude-haiku-4-5");
    f.control(
        "p",
        json!({"subtype": "set_permission_mode", "mode": "acceptEdits"}),
    );
    let r = json(&f.next());
    assert_eq!(r["response"]["response"]["mode"], "acceptEdits");
    f.control("x", json!({"subtype": "no_such_thing"}));
    let r = json(&f.next());
    assert_eq!(r["response"]["subtype"], "error");
    assert_eq!(r["response"]["error_code"], "unsupported_request");
    // The model and mode show in the next init.
    f.user("fake:sleep 600000");
    let init = json(&f.next());
    assert_eq!(init["model"], "claude-haiku-4-5");
    assert_eq!(init["permissionMode"], "acceptEdits");
    assert_eq!(json(&f.next())["subtype"], "status");
    f.control("i", json!({"subtype": "interrupt"}));
    let lines = f.turn();
    let r = json(&lines[0]);
    assert_eq!(r["response"]["request_id"], "i");
    assert_eq!(r["response"]["subtype"], "success");
    let result = json(lines.last().expect("result"));
    assert_eq!(result["subtype"], "error_during_execution");
    assert_eq!(result["is_error"], true);
    decode(&lines);
    assert_eq!(f.close(), 0);
}

#[test]
fn tool_turn_waits_for_the_decision() {
    let home = tempfile::tempdir().expect("tempdir");
    let mut f = Fake::start(home.path(), &[]);
    f.user("fake:tool");
    let req = loop {
        let v = json(&f.next());
        if v["type"] == "control_request" {
            break v;
        }
    };
    assert_eq!(req["request"]["subtype"], "can_use_tool");
    let id = req["request_id"].as_str().expect("id").to_string();
    f.send(
        json!({"type": "control_response", "response": {"subtype": "success",
        "request_id": id, "response": {"behavior": "deny", "message": "not today"}}}),
    );
    let lines = f.turn();
    let events = decode(&lines);
    let denied = events.iter().flatten().find_map(|e| match e {
        Event::ToolResult(r) => Some(r.is_error),
        _ => None,
    });
    assert_eq!(denied, Some(true));
    assert!(lines.iter().any(|l| l.contains("not today")));
    assert_eq!(f.close(), 0);
}

#[test]
fn resume_continues_and_a_missing_transcript_fails() {
    let home = tempfile::tempdir().expect("tempdir");
    let mut f = Fake::start(home.path(), &[]);
    f.user("Remember the word PINEAPPLE.");
    let lines = f.turn();
    let sid = json(&lines[0])["session_id"]
        .as_str()
        .expect("id")
        .to_string();
    assert_eq!(f.close(), 0);

    let mut f = Fake::start(home.path(), &["--resume", &sid]);
    f.user("fake:recall");
    let lines = f.turn();
    assert_eq!(
        json(&lines[0])["session_id"],
        json!(sid),
        "same conversation"
    );
    assert_eq!(
        assistant_texts(&decode(&lines)),
        vec!["Remember the word PINEAPPLE.".to_string()]
    );
    assert_eq!(f.close(), 0);

    // Fork: a new id, the same history.
    let mut f = Fake::start(home.path(), &["--resume", &sid, "--fork-session"]);
    f.user("fake:recall");
    let lines = f.turn();
    assert_ne!(json(&lines[0])["session_id"], json!(sid));
    assert_eq!(
        assistant_texts(&decode(&lines)),
        vec!["fake:recall".to_string()],
        "the previous message of the forked conversation"
    );
    assert_eq!(f.close(), 0);

    let out = Command::new(FAKE)
        .args(session_args())
        .args(["--resume", "00000000-0000-4000-8000-00000000dead"])
        .current_dir(home.path())
        .env_clear()
        .env("HOME", home.path())
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(
            "No conversation found with session ID: 00000000-0000-4000-8000-00000000dead"
        ),
        "{out:?}"
    );
}

#[test]
fn exit_mode_and_stdin_eof() {
    let home = tempfile::tempdir().expect("tempdir");
    // stdin at EOF without a message: exit 0 (what the flag probe relies on).
    let out = Command::new(FAKE)
        .args(session_args())
        .current_dir(home.path())
        .env_clear()
        .env("HOME", home.path())
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty());
    let mut f = Fake::start(home.path(), &[]);
    f.user("fake:exit 3");
    assert_eq!(f.close(), 3);
}
