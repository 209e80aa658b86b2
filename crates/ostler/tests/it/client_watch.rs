//! `ostler watch` (the daemon-wide feed) and session titles (`run --name`, `sessions`, `show`),
//! through the built binary against a live daemon.
#![allow(clippy::disallowed_methods)] // spawns the ostler binary (daemon and clients)

use crate::common;

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;

use common::client::{Served, describe, scenario_text};
use common::{OSTLER, guard};
use serde_json::Value;

fn cursors(items: &[Value]) -> Vec<u64> {
    items
        .iter()
        .map(|i| i["cursor"].as_u64().expect("cursor"))
        .collect()
}

#[test]
fn watch_lists_resumes_filters_and_follows() {
    let d = Served::start(&scenario_text());
    let ev = d.ok_json(&["run", "--json", "--name", "my task", "Say hello"]);
    let id = ev[0]["session"]["id"].as_str().expect("id").to_owned();

    // Titles: --name, shown by `sessions` (JSON and table).
    let list = d.ok_json(&["sessions", "--json"]);
    assert_eq!(list[0]["title"], "my task");
    let out = d.client(&["sessions"], None);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("TITLE") && table.contains("my task"),
        "{table}"
    );
    let out = d.client(&["show", &id], None);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.lines().any(|l| l.trim() == "title: my task"),
        "{shown}"
    );

    // The stored feed: created, state changes, the turn; cursors increase.
    let all = d.ok_json(&["watch", "--all", "--no-follow", "--json"]);
    let kinds: Vec<&str> = all
        .iter()
        .map(|i| i["kind"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(kinds.first(), Some(&"created"), "{kinds:?}");
    assert!(
        kinds.contains(&"turn") && kinds.contains(&"state"),
        "{kinds:?}"
    );
    let c = cursors(&all);
    assert!(c.windows(2).all(|w| w[0] < w[1]), "{c:?}");
    for i in &all {
        assert_eq!(i["session_id"], id.as_str());
        assert_eq!(i["title"], "my task");
        assert_eq!(i["event"]["session_id"], id.as_str());
    }
    let turn = all.iter().find(|i| i["kind"] == "turn").expect("turn item");
    assert_eq!(turn["event"]["type"], "turn_completed");

    // --since resumes after a cursor: exactly the rest.
    let since = c[1].to_string();
    let rest = d.ok_json(&["watch", "--since", &since, "--no-follow", "--json"]);
    assert_eq!(cursors(&rest), c[2..].to_vec());

    // --kind filters.
    let turns = d.ok_json(&["watch", "--all", "--no-follow", "--json", "--kind", "turn"]);
    assert_eq!(turns.len(), 1, "{turns:?}");
    let bad = d.client(&["watch", "--kind", "nope"], None);
    assert_eq!(bad.status.code(), Some(2), "{}", describe(&bad));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("created"));

    // Human output names the session and what happened.
    let human = d.client(&["watch", "--all", "--no-follow"], None);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.contains("my task") && text.contains("turn done"),
        "{}",
        describe(&human)
    );

    // Following: only new items, as they happen.
    let mut child = Command::new(OSTLER)
        .args(["watch", "--json"])
        .env_clear()
        .envs(d.client_env())
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ostler watch");
    let stdout = child.stdout.take().expect("stdout");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // The watcher announces where it starts before it follows.
    let (etx, erx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stderr).read_line(&mut line);
        let _ = etx.send(line);
    });
    let err_line = erx
        .recv_timeout(guard())
        .expect("the watcher's first stderr line");
    assert!(err_line.contains("watching"), "{err_line}");
    let ev = d.ok_json(&["run", "--json", "Say hello"]);
    let second = ev[0]["session"]["id"].as_str().expect("id").to_owned();
    let mut live = Vec::new();
    loop {
        let line = rx
            .recv_timeout(guard())
            .unwrap_or_else(|_| panic!("no live turn item; saw {live:?}"));
        let v: Value = serde_json::from_str(&line).expect("JSON line");
        let done = v["kind"] == "turn";
        live.push(v);
        if done {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        live.iter().all(|i| i["session_id"] == second.as_str()),
        "{live:?}"
    );
    assert!(cursors(&live)[0] > *c.last().expect("a cursor"));
    assert_eq!(live[0]["kind"], "created");
    assert_eq!(live[0]["title"], "Say hello", "untitled: the first prompt");
}

/// Runs `ostler ARGS` with a stdout whose reader is already gone (`ostler ... | head -1`
/// after head has exited); once its stderr says `ready` (if given), runs `then`; returns
/// its exit code and stderr once it ends.
fn closed_stdout(
    d: &Served,
    args: &[&str],
    ready: Option<&str>,
    then: impl FnOnce(),
) -> (Option<i32>, String) {
    let (reader, writer) = std::io::pipe().expect("pipe");
    drop(reader);
    let mut child = Command::new(OSTLER)
        .args(args)
        .env_clear()
        .envs(d.client_env())
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .expect("ostler");
    let stderr = child.stderr.take().expect("stderr");
    let (lines_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    if let Some(ready) = ready {
        loop {
            let line = lines
                .recv_timeout(guard())
                .unwrap_or_else(|_| panic!("ostler {args:?}: no {ready:?} on stderr: {seen:?}"));
            let found = line.contains(ready);
            seen.push(line);
            if found {
                break;
            }
        }
    }
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    then();
    let status = rx
        .recv_timeout(guard())
        .unwrap_or_else(|_| panic!("ostler {args:?} kept running with nobody reading"))
        .expect("wait");
    // The stderr reader ends when the process does.
    seen.extend(lines.iter());
    (status.code(), seen.join("\n"))
}

#[test]
fn a_reader_that_goes_away_ends_the_client_quietly() {
    let d = Served::start(&scenario_text());
    d.ok_json(&["run", "--json", "Say hello"]);
    for args in [
        &["sessions"][..],
        &["sessions", "--json"],
        &["show", "@last"],
        &["show", "@last", "--events", "--json"],
        &["watch", "--all", "--no-follow"],
        &["health"],
        &["completion", "zsh"],
    ] {
        let (code, stderr) = closed_stdout(&d, args, None, || {});
        assert_eq!(code, Some(0), "ostler {args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "ostler {args:?}: {stderr}");
    }
    // A follower ends at its next line instead of following for nobody.
    let (code, stderr) = closed_stdout(&d, &["watch", "--json"], Some("watching"), || {
        d.ok_json(&["run", "--json", "Say hello"]);
    });
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
