//! A tool's structured result through the real daemon and the real CLI (2.1.332): the model
//! calls Write and Bash in one answer, then Edit; each ToolResult carries its tool's own
//! `tool_use_result_json` (Write: `type`, `filePath`, `content`; Bash: `stdout`, `stderr`)
//! and `tool_result_meta_json` (the permission decision), live, on replay from the store,
//! and in `ostler show --events --json`; `ostler show --events` shows the Write as a diff.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error
#![allow(clippy::disallowed_methods)] // runs the ostler binary under test as a client

use crate::common;

use common::grpc::*;
use common::*;
use ostler_proto::v1 as pb;
use pb::session_event::Payload as P;
use serde_json::Value;

const SCENARIO: &str = r#"
default_text = "OK."

[[model]]
name = "after the edit"
when = { has_tool_result_for = "toolu_edit_1", stream = true }
blocks = [{ type = "text", text = "All done." }]

[[model]]
name = "after both"
when = { has_tool_result_for = "toolu_bash_1", stream = true }
blocks = [{ type = "tool_use", id = "toolu_edit_1", name = "Edit", input = { file_path = "note.txt", old_string = "hello", new_string = "hi there" } }]

[[model]]
name = "write and echo"
when = { last_user_text_contains = "Write the note and echo", stream = true }
blocks = [
  { type = "tool_use", id = "toolu_write_1", name = "Write", input = { file_path = "note.txt", content = "hello\n" } },
  { type = "tool_use", id = "toolu_bash_1", name = "Bash", input = { command = "echo out-text; echo err-text >&2", description = "Echo to both streams" } },
]
"#;

fn tool_result(e: &pb::SessionEvent) -> Option<&pb::ToolResult> {
    match &e.payload {
        Some(P::ToolResult(t)) => Some(t),
        _ => None,
    }
}

/// `ostler show ARGS`'s stdout; the command must succeed.
fn show(world: &World, daemon: &Daemon, args: &[&str]) -> String {
    let args: Vec<String> = std::iter::once("show")
        .chain(args.iter().copied())
        .map(str::to_owned)
        .collect();
    let child = client_command(world, &daemon.addr.to_string(), &args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_output(child);
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"))
}

/// The two tool results of `events`, by tool use id: (Write's, Bash's).
fn results(events: &[pb::SessionEvent]) -> (pb::ToolResult, pb::ToolResult) {
    let by_id = |id: &str| {
        let found: Vec<_> = events
            .iter()
            .filter_map(tool_result)
            .filter(|t| t.tool_use_id == id)
            .collect();
        assert_eq!(found.len(), 1, "{id}: {found:?}");
        found[0].clone()
    };
    (by_id("toolu_write_1"), by_id("toolu_bash_1"))
}

fn check(write: &pb::ToolResult, bash: &pb::ToolResult) {
    let w = json(&write.tool_use_result_json);
    assert_eq!(w["type"], "create", "{w}");
    assert_eq!(w["filePath"], "note.txt", "{w}");
    assert_eq!(w["content"], "hello\n", "{w}");
    assert!(w["structuredPatch"].is_array(), "{w}");
    let m = json(&write.tool_result_meta_json);
    assert_eq!(m[0]["id"], "toolu_write_1", "{m}");
    assert_eq!(m[0]["permission_decision"]["decision"], "accept", "{m}");

    let b = json(&bash.tool_use_result_json);
    assert!(
        b["stdout"].as_str().is_some_and(|s| s.contains("out-text")),
        "{b}"
    );
    assert!(b["stderr"].is_string(), "{b}");
    assert_eq!(b["interrupted"], false, "{b}");
    let m = json(&bash.tool_result_meta_json);
    assert_eq!(m[0]["id"], "toolu_bash_1", "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tool_results_carry_the_tools_structured_result_live_and_on_replay() {
    let world = World::with_scenario(NEW, SCENARIO).await;
    let daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let s = create_session(&mut c, &world.work, "tester").await;
    let id = s.id.clone();
    let mut events = subscribe(&mut c, &id, s.last_seq, false).await;
    send(&mut c, &id, "Write the note and echo to both streams").await;

    // Live: allow whatever the CLI asks for, until the turn ends.
    let mut live = Vec::new();
    allow_until_turn_end(&mut c, "tester", &id, &mut events, &mut live).await;
    assert_eq!(
        std::fs::read_to_string(world.work.join("note.txt")).unwrap(),
        "hi there\n"
    );
    let (write, bash) = results(&live);
    check(&write, &bash);

    // Replay from the store: the same payloads.
    let stored = history(&mut c, &id).await;
    let (w2, b2) = results(&stored);
    assert_eq!(w2, write);
    assert_eq!(b2, bash);

    // The client's JSON form: the fields parsed, under their names without `_json`.
    let lines: Vec<Value> = show(&world, &daemon, &[id.as_str(), "--events", "--json"])
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let shown = lines
        .iter()
        .find(|v| v["type"] == "tool_result" && v["tool_use_id"] == "toolu_write_1")
        .unwrap_or_else(|| panic!("no Write tool_result in {lines:#?}"));
    assert_eq!(shown["tool_use_result"]["filePath"], "note.txt", "{shown}");
    assert_eq!(
        shown["tool_result_meta"][0]["id"], "toolu_write_1",
        "{shown}"
    );

    // The human form shows the file change as a diff; the Bash result as its text.
    let text = show(&world, &daemon, &[id.as_str(), "--events"]);
    assert!(text.contains("⎿ Created note.txt (1 line)"), "{text}");
    assert!(text.lines().any(|l| l.trim() == "+hello"), "{text}");
    assert!(text.contains("⎿ out-text"), "{text}");
    assert!(
        text.contains("⎿ Updated note.txt: 1 addition, 1 removal"),
        "{text}"
    );
    let diff: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("-hello") || l.starts_with("+hi there"))
        .collect();
    assert_eq!(diff, ["-hello", "+hi there"], "{text}");
}
