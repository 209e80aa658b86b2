//! Whole process trees: a tool process that left its CLI's process group (`setsid`) ends
//! with the session — on a graceful stop, when the CLI dies, when every handle is dropped —
//! and a process that is not the session's is never touched. Fake CLIs (shell scripts).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
#![allow(clippy::disallowed_methods)] // test support: bystander and leftover processes

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;

use ostler_supervisor::proctree::{self, Mark};

mod tree;
use tree::{assert_ends, exited, start, sup};

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
