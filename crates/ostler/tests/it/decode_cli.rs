//! `ostler decode` from the outside: the built binary on a recording, on raw CLI stdout
//! and on garbage bytes.

// The test runs the binary under test as a child process (the binary itself never spawns).
#![allow(clippy::disallowed_methods)]
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn ostler(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ostler"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

fn summary(out: &Output) -> serde_json::Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("{\"summary\""))
        .unwrap_or_else(|| panic!("no summary line on stderr: {stderr}"));
    serde_json::from_str::<serde_json::Value>(line).unwrap()["summary"].clone()
}

fn stdout_events(out: &Output) -> Vec<serde_json::Value> {
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn a_recording() -> PathBuf {
    let dir = repo().join("contracts/claude-code/2.1.332");
    let preferred = dir.join("tool_allowed.ndjson");
    if preferred.exists() {
        return preferred;
    }
    std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "ndjson"))
        .expect("no 2.1.332 recording")
}

#[test]
fn decodes_a_recording_with_header_release() {
    let rec = a_recording();
    let out = ostler(&["decode", rec.to_str().unwrap()], b"");
    assert!(out.status.success(), "{out:?}");
    let s = summary(&out);
    assert_eq!(s["recording"], true);
    assert_eq!(s["release"], "2.1.332");
    assert_eq!(s["adapter"], "v2_1");
    assert_eq!(s["tolerant"], false);
    assert_eq!(s["diagnostics"], 0);
    assert_eq!(s["unknown"], 0);
    let events = stdout_events(&out);
    assert!(events.iter().any(|e| e["type"] == "session_started"));
    assert!(events.iter().any(|e| e["type"] == "turn_completed"));
    assert!(events.iter().any(|e| e["type"] == "outbound"));
    assert_eq!(
        s["events"].as_u64().unwrap() + s["outbound"].as_u64().unwrap(),
        events.len() as u64
    );
    // The golden file is exactly this output, up to the event names: the golden keeps the
    // protocol crate's `{"kind": ..., "turn_result"}`, `ostler decode` names events like the
    // client's --json (`{"type": ..., "turn_completed"}`).
    let golden = rec.with_file_name(ostler_protocol::contract::golden_name(
        &rec.file_name().unwrap().to_string_lossy(),
    ));
    if let Ok(g) = std::fs::read_to_string(&golden) {
        let renamed: String = g
            .lines()
            .map(|l| {
                let l = l.replacen(r#"{"kind":"turn_result""#, r#"{"kind":"turn_completed""#, 1);
                format!("{}\n", l.replacen(r#"{"kind":"#, r#"{"type":"#, 1))
            })
            .collect();
        assert_eq!(
            renamed,
            String::from_utf8_lossy(&out.stdout),
            "{} differs from ostler decode",
            golden.display()
        );
    }
    // --release overrides the header; --hide-outbound drops our lines.
    let out = ostler(
        &[
            "decode",
            "--release",
            "1.0.128",
            "--hide-outbound",
            rec.to_str().unwrap(),
        ],
        b"",
    );
    assert!(out.status.success());
    assert_eq!(summary(&out)["adapter"], "v1_0");
    assert!(stdout_events(&out).iter().all(|e| e["type"] != "outbound"));
}

#[test]
fn decodes_raw_stdout_from_stdin() {
    let raw = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../ostler-protocol/tests/fixtures/1.0.128-tool.ndjson"),
    )
    .unwrap();
    let out = ostler(&["decode", "--release", "claude v1.0.128 (x)", "-"], &raw);
    assert!(out.status.success(), "{out:?}");
    let s = summary(&out);
    assert_eq!(s["recording"], false);
    assert_eq!(s["adapter"], "v1_0");
    assert_eq!(s["diagnostics"], 0);
    assert_eq!(s["by_kind"]["control_request"], 1);
    let events = stdout_events(&out);
    let req = events
        .iter()
        .find(|e| e["type"] == "control_request")
        .unwrap();
    assert_eq!(req["request"]["absent"], serde_json::json!(["tool_use_id"]));
}

#[test]
fn garbage_bytes_exit_zero_with_diagnostics() {
    let mut garbage: Vec<u8> = (0..20_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    garbage.extend_from_slice(b"\n\xff\xfe\x00not json\n{\"type\":\"keep_alive\"}\n");
    garbage.extend(std::iter::repeat_n(b'[', 100_000));
    garbage.extend_from_slice(b"\n{\"type\":\"keep_alive\"}");
    let out = ostler(&["decode", "--max-payload-bytes", "4096", "-"], &garbage);
    assert!(out.status.success(), "{out:?}");
    let s = summary(&out);
    assert!(s["diagnostics"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(s["truncated"], 1, "{s}");
    assert_eq!(s["by_kind"]["keep_alive"], 2, "{s}");
    let events = stdout_events(&out);
    assert_eq!(events.last().unwrap()["type"], "keep_alive");
}

#[test]
fn unreadable_file_is_an_error() {
    let out = ostler(&["decode", "/nonexistent/file.ndjson"], b"");
    assert!(!out.status.success());
}
