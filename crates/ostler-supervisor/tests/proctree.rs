//! Whole process trees: a tool process that left its CLI's process group (`setsid`) ends
//! with the session — on a graceful stop, when the CLI dies, when every handle is dropped —
//! and a process that is not the session's is never touched. Fake CLIs (shell scripts).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
#![allow(clippy::disallowed_methods)] // test support: bystander and leftover processes

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::Duration;

use ostler_protocol::Event;
use ostler_supervisor::proctree::{self, Mark};
use ostler_supervisor::{
    Installation, ProcessEvent, SessionProcess, SpawnOptions, SupervisorOptions,
};
use tokio::sync::mpsc;

fn guard() -> Duration {
    ostler_testkit::timeouts::guard()
}

/// A fake CLI that starts `sleep 300` in a session of its own (as a tool would with
/// `setsid`), writes the sleeper's pid to `sleeper.pid`, announces itself with a
/// `system/init` line once the pid is written, then runs `TAIL`.
fn fake(dir: &Path, tail: &str) -> Installation {
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

fn sup() -> SupervisorOptions {
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
async fn start(dir: &Path, tail: &str) -> (SessionProcess, mpsc::Receiver<ProcessEvent>, u32) {
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

async fn assert_ends(pid: u32, what: &str) {
    tokio::time::timeout(guard(), proctree::wait_terminated(pid))
        .await
        .unwrap_or_else(|_| panic!("{what}: the sleeper ({pid}) survived"))
        .unwrap();
}

async fn exited(rx: &mut mpsc::Receiver<ProcessEvent>) {
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

#[tokio::test]
async fn graceful_stop_ends_a_tool_that_left_the_group() {
    let d = tempfile::tempdir().unwrap();
    // The CLI exits when its stdin closes, leaving the sleeper behind.
    let (proc, mut rx, sleeper) = start(d.path(), "cat > /dev/null").await;
    let info = proc.stop().await;
    assert!(info.requested);
    exited(&mut rx).await;
    assert_ends(sleeper, "graceful stop").await;
}

#[tokio::test]
async fn a_crashed_cli_takes_its_tools_with_it() {
    let d = tempfile::tempdir().unwrap();
    let (proc, mut rx, sleeper) = start(d.path(), "cat > /dev/null").await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(proc.pid()).unwrap()),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    exited(&mut rx).await;
    assert_ends(sleeper, "CLI killed").await;
}

#[tokio::test]
async fn dropping_every_handle_ends_the_tree() {
    let d = tempfile::tempdir().unwrap();
    let (proc, rx, sleeper) = start(d.path(), "cat > /dev/null").await;
    drop(rx);
    drop(proc);
    assert_ends(sleeper, "handles dropped").await;
}

#[tokio::test]
async fn unmarked_processes_are_never_touched() {
    let d = tempfile::tempdir().unwrap();
    // A process of ours that no session started.
    let mut bystander = std::process::Command::new("sleep")
        .arg("300")
        .spawn()
        .unwrap();
    let (proc, mut rx, sleeper) = start(d.path(), "cat > /dev/null").await;
    proc.stop().await;
    exited(&mut rx).await;
    assert_ends(sleeper, "graceful stop").await;
    // Whatever carries the tag of this test's supervisor is gone; the bystander is not
    // marked and lives on.
    assert_eq!(proctree::kill_marked(&sup().process_tag), 0);
    let b = proctree::stat(bystander.id()).expect("bystander alive");
    assert!(!b.is_zombie(), "the bystander was killed");
    assert!(
        proctree::members(Mark::Tag(&sup().process_tag), None).is_empty(),
        "nothing of the session is left"
    );
    bystander.kill().unwrap();
    bystander.wait().unwrap();
}

#[tokio::test]
async fn leftovers_of_a_previous_life_are_found_by_tag() {
    let d = tempfile::tempdir().unwrap();
    // A "previous life": a marked process not started through a SessionProcess of this
    // run, as after kill -9 of the daemon (the CLI died of PDEATHSIG; its tool lives on).
    let tag = format!("life-{}", std::process::id());
    let mut leftover = std::process::Command::new("setsid")
        .args(["sleep", "300"])
        .env(proctree::MARK_VAR, format!("{tag}/old-session/0"))
        .current_dir(d.path())
        .spawn()
        .unwrap();
    let pid = leftover.id();
    // `spawn` may return in the middle of an exec (`posix_spawn` lets the parent go on once
    // the new memory map is in place), and `setsid` execs once more: the scan asks again.
    assert!(
        proctree::members(Mark::Tag(&tag), None)
            .iter()
            .any(|p| p.pid == pid),
        "the marked process is found by its tag"
    );
    assert!(proctree::members(Mark::Tag("life-other"), None).is_empty());
    assert!(proctree::kill_marked(&tag) >= 1);
    let status = leftover.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc_sigkill())
    );
}

fn libc_sigkill() -> i32 {
    nix::sys::signal::Signal::SIGKILL as i32
}

#[tokio::test]
async fn a_leftover_caught_in_the_middle_of_exec_is_still_found() {
    // While a process execs, `/proc/<pid>/environ` reads empty (the new memory map is in
    // place, the environment not yet written into it) or stops short (the old map is torn
    // down under the read), and `spawn` itself may return in that window. A leftover that
    // execs again and again is often caught there (without asking again, one of these
    // rounds missed it in most runs); every kill must still find it.
    let d = tempfile::tempdir().unwrap();
    let script = d.path().join("again");
    std::fs::write(&script, "#!/bin/sh\nexec \"$0\"\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let tag = format!("exec-{}", std::process::id());
    for round in 0..40 {
        let mut leftover = std::process::Command::new(&script)
            .process_group(0)
            .env(proctree::MARK_VAR, format!("{tag}/old-session/{round}"))
            .spawn()
            .unwrap();
        let found = proctree::kill_marked(&tag);
        if found == 0 {
            leftover.kill().unwrap();
            leftover.wait().unwrap();
            panic!("round {round}: the exec'ing leftover was missed");
        }
        let status = leftover.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc_sigkill()),
            "round {round}"
        );
    }
}

#[tokio::test]
async fn a_process_without_environment_is_left_alone() {
    // Its environment reads empty like that of a process in the middle of an exec; asked
    // again it stays empty, so it is no leftover of ours.
    let tag = format!("bare-{}", std::process::id());
    let mut bare = std::process::Command::new("/bin/sleep")
        .arg("300")
        .env_clear()
        .process_group(0)
        .spawn()
        .unwrap();
    assert_eq!(proctree::kill_marked(&tag), 0);
    assert!(proctree::members(Mark::Tag(&tag), None).is_empty());
    let b = proctree::stat(bare.id()).expect("alive");
    assert!(!b.is_zombie(), "the process without environment was killed");
    bare.kill().unwrap();
    bare.wait().unwrap();
}

#[tokio::test]
async fn as_subreaper_a_session_is_found_in_its_own_tree_and_among_the_orphans_only() {
    // With this process as child subreaper (as the daemon is), a session's scan reads its
    // CLI's tree and the orphans this process adopted, not the other sessions' trees nor
    // the rest of the system; a tool orphaned when its CLI ends is still found there.
    proctree::become_subreaper().unwrap();
    let _reaper = proctree::spawn_reaper().unwrap();
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, mut rx_a, sleeper_a) = start(da.path(), "cat > /dev/null").await;
    let (b, mut rx_b, sleeper_b) = start(db.path(), "cat > /dev/null").await;
    let scope: std::collections::HashSet<u32> = proctree::own_tree(Some(a.pid()))
        .expect("the kernel lists children")
        .iter()
        .map(|p| p.pid)
        .collect();
    assert!(scope.contains(&a.pid()), "A's CLI is read");
    assert!(
        scope.contains(&sleeper_a),
        "A's tool (left the group) is read"
    );
    assert!(
        !scope.contains(&b.pid()) && !scope.contains(&sleeper_b),
        "B's tree is not read"
    );
    assert!(
        !scope.contains(&1),
        "nothing outside this process's tree is read"
    );
    // A's CLI exits on stop and orphans its tool, which this process adopts.
    a.stop().await;
    exited(&mut rx_a).await;
    assert_ends(sleeper_a, "A stopped").await;
    // Dead, it is this process's zombie until reaped (by the reaper, or by this call): the
    // reaping reads this process's own children.
    proctree::reap_adopted();
    assert!(
        proctree::stat(sleeper_a).is_none(),
        "A's orphaned tool was not reaped"
    );
    let s = proctree::stat(sleeper_b).expect("B's tool runs");
    assert!(!s.is_zombie(), "B's tool was killed with A");
    b.stop().await;
    exited(&mut rx_b).await;
    assert_ends(sleeper_b, "B stopped").await;
}
