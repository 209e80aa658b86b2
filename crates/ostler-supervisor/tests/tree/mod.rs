//! The fake CLI of the process-tree tests and how they start and end it: a shell script
//! that starts a tool in a session of its own (as `setsid` does), so that the tool has left
//! the CLI's process group.
#![allow(dead_code)] // each test binary uses part of it

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use ostler_protocol::Event;
use ostler_supervisor::proctree;
use ostler_supervisor::{
    Installation, ProcessEvent, SessionProcess, SpawnOptions, SupervisorOptions,
};
use tokio::sync::mpsc;

pub fn guard() -> Duration {
    ostler_testkit::timeouts::guard()
}

/// A fake CLI that starts `sleep 300` in a session of its own (as a tool would with
/// `setsid`), writes the sleeper's pid to `sleeper.pid`, announces itself with a
/// `system/init` line once the pid is written, then runs `TAIL`.
pub fn fake(dir: &Path, tail: &str) -> Installation {
    let p = dir.join("claude");
    let body = format!(
        r#"#!/bin/sh
setsid sh -c 'echo $$ > sleeper.pid.tmp; mv sleeper.pid.tmp sleeper.pid; exec sleep 300' </dev/null >/dev/null 2>&1 &
while [ ! -s sleeper.pid ]; do sleep 0.01; done
echo '{{"type":"system","subtype":"init","session_id":"s1","tools":[],"model":"m","cwd":"/"}}'
{tail}
"#
    );
    std::fs::write(&p, body).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    Installation::assume(p, semver::Version::new(2, 1, 330), None)
}

pub fn sup() -> SupervisorOptions {
    SupervisorOptions {
        stop_grace: ostler_testkit::timeouts::secs(5),
        term_grace: ostler_testkit::timeouts::secs(5),
        stall_after: None,
        process_tag: format!("test-{}", std::process::id()),
        ..SupervisorOptions::default()
    }
}

/// Spawn the fake and return the process, its events and the sleeper's pid, once the
/// sleeper runs.
pub async fn start(dir: &Path, tail: &str) -> (SessionProcess, mpsc::Receiver<ProcessEvent>, u32) {
    let inst = fake(dir, tail);
    let opts = SpawnOptions {
        cwd: dir.to_path_buf(),
        log_id: "tree".into(),
        ..SpawnOptions::default()
    };
    let (proc, mut rx) = SessionProcess::spawn(&inst, opts, sup()).await.unwrap();
    loop {
        let ev = tokio::time::timeout(guard(), rx.recv())
            .await
            .expect("no init within the guard")
            .expect("exited before init");
        if let ProcessEvent::Line(l) = ev
            && l.events()
                .iter()
                .any(|e| matches!(e, Event::SessionStarted(_)))
        {
            break;
        }
    }
    let pid: u32 = std::fs::read_to_string(dir.join("sleeper.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let s = proctree::stat(pid).expect("the sleeper runs");
    assert_eq!(s.sid, pid, "the sleeper leads a session of its own");
    assert_ne!(
        s.pgid,
        proc.pid(),
        "the sleeper left the CLI's process group"
    );
    (proc, rx, pid)
}

pub async fn assert_ends(pid: u32, what: &str) {
    tokio::time::timeout(guard(), proctree::wait_terminated(pid))
        .await
        .unwrap_or_else(|_| panic!("{what}: the sleeper ({pid}) survived"))
        .unwrap();
}

pub async fn exited(rx: &mut mpsc::Receiver<ProcessEvent>) {
    loop {
        match tokio::time::timeout(guard(), rx.recv())
            .await
            .expect("guard")
        {
            Some(ProcessEvent::Exited(_)) | None => return,
            Some(_) => {}
        }
    }
}
