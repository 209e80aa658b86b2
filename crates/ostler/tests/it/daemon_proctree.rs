//! No process left behind: a tool the CLI starts in a session of its own (`setsid sleep`)
//! survives neither StopSession, nor SIGTERM of the daemon, nor kill -9 of the daemon
//! followed by a restart on the same store. Real CLI, real daemon process.
#![allow(clippy::unwrap_used)] // test code: a failure should panic with the error

use crate::common;

use common::grpc::*;
use common::*;
use ostler_proto::v1 as pb;
use ostler_proto::v1::session_service_client::SessionServiceClient;
use ostler_supervisor::proctree;
use pb::session_event::Payload as P;
use tonic::transport::Channel;

/// Create a session, have the model start the sleeper (allowing its Bash call), wait for
/// the turn to end and return the session id and the sleeper's pid.
async fn start_sleeper(c: &mut SessionServiceClient<Channel>, world: &World) -> (String, u32) {
    start(c, world, "Start the background sleeper now.", "sleeper.pid").await
}

/// [`start_sleeper`] for the sleeper that also clears its environment (`env -i`).
async fn start_hidden_sleeper(
    c: &mut SessionServiceClient<Channel>,
    world: &World,
) -> (String, u32) {
    start(c, world, "Start the hidden sleeper now.", "hidden.pid").await
}

async fn start(
    c: &mut SessionServiceClient<Channel>,
    world: &World,
    prompt: &str,
    pid_file: &str,
) -> (String, u32) {
    let pid_file = world.work.join(pid_file);
    let _ = std::fs::remove_file(&pid_file);
    let s = create_session(c, &world.work, "tree").await;
    let mut events = subscribe(c, &s.id, 0, false).await;
    let mut seen = Vec::new();
    send(c, &s.id, prompt).await;
    let prompt = read_until(&mut events, &mut seen, "permission prompt", |e| {
        matches!(e.payload, Some(P::PermissionRequested(_)))
    })
    .await;
    let Some(P::PermissionRequested(req)) = prompt.payload else {
        unreachable!()
    };
    common::grpc::allow(c, "tree", &s.id, &req.request_id).await;
    read_until(&mut events, &mut seen, "turn end", is_turn_completed).await;
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .unwrap_or_else(|e| {
            panic!(
                "the sleeper wrote no pid file ({e}): {:#?}",
                seen.iter().map(describe).collect::<Vec<_>>()
            )
        })
        .trim()
        .parse()
        .unwrap();
    let st = proctree::stat(pid).expect("the sleeper runs");
    assert!(!st.is_zombie());
    assert_eq!(st.sid, pid, "the sleeper leads a session of its own");
    (s.id, pid)
}

async fn assert_ends(pid: u32, what: &str) {
    tokio::time::timeout(guard(), proctree::wait_terminated(pid))
        .await
        .unwrap_or_else(|_| panic!("{what}: the sleeper ({pid}) survived"))
        .unwrap();
}

#[tokio::test]
async fn tool_processes_end_with_stop_sigterm_and_kill9_restart() {
    let world = World::new(NEW).await;

    // StopSession.
    let mut daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let (id, sleeper) = start_sleeper(&mut c, &world).await;
    c.stop_session(pb::StopSessionRequest { session_id: id })
        .await
        .unwrap();
    assert_ends(sleeper, "StopSession").await;

    // SIGTERM of the daemon (graceful shutdown).
    let (_id, sleeper) = start_sleeper(&mut c, &world).await;
    let status = daemon.terminate().await;
    assert!(status.success(), "{status:?}");
    assert_ends(sleeper, "SIGTERM of the daemon").await;

    // kill -9 of the daemon: the sleeper outlives it; the next daemon on the same store
    // ends it before it serves.
    let mut daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let (_id, sleeper) = start_sleeper(&mut c, &world).await;
    daemon.kill9();
    let st = proctree::stat(sleeper).expect("the sleeper outlives kill -9 of the daemon");
    assert!(
        !st.is_zombie(),
        "the sleeper outlives kill -9 of the daemon"
    );
    let daemon = world.daemon(&[]).await;
    assert_ends(sleeper, "restart after kill -9").await;
    assert!(
        daemon.log_text().contains("left behind by a previous run"),
        "the restart says what it ended"
    );
}

/// A tool that clears its environment and leaves its CLI's process group carries no mark and,
/// once the CLI is gone, no link to it: only the session's cgroup holds it. With cgroups (where
/// the daemon may write a cgroup v2 tree, as here when run as root) it ends with StopSession
/// and with kill -9 + restart; with `sessions.cgroup = "off"` it survives the restart.
#[tokio::test]
async fn a_tool_that_clears_its_environment_ends_with_the_session_cgroup() {
    use ostler_supervisor::cgroup::{CgroupSetting, Cgroups};
    let probe_tag = format!("probe-{}", std::process::id());
    match Cgroups::setup(&CgroupSetting::Auto, &probe_tag) {
        Ok(Some(cg)) => {
            let _ = std::fs::remove_dir(cg.dir());
        }
        other => {
            eprintln!("SKIPPED: no writable cgroup v2 here ({other:?})");
            return;
        }
    }
    let world = World::new(NEW).await;

    // StopSession.
    let mut daemon = world.daemon(&[]).await;
    let mut c = daemon.sessions().await;
    let (id, sleeper) = start_hidden_sleeper(&mut c, &world).await;
    let cg = std::fs::read_to_string(format!("/proc/{sleeper}/cgroup")).unwrap();
    assert!(
        cg.lines()
            .any(|l| l.starts_with("0::") && l.contains("/ostler-store-")),
        "the tool runs in its session's cgroup: {cg}"
    );
    c.stop_session(pb::StopSessionRequest { session_id: id })
        .await
        .unwrap();
    assert_ends(sleeper, "StopSession").await;

    // kill -9 of the daemon, then a restart on the same store.
    let (_id, sleeper) = start_hidden_sleeper(&mut c, &world).await;
    daemon.kill9();
    assert!(
        proctree::stat(sleeper).is_some_and(|s| !s.is_zombie()),
        "the hidden sleeper outlives kill -9 of the daemon"
    );
    let daemon = world.daemon(&[]).await;
    assert_ends(sleeper, "restart after kill -9").await;
    assert!(daemon.log_text().contains("left behind by a previous run"));
    drop(daemon);

    // The same without cgroups: nothing finds it (this is what the cgroup adds).
    let daemon = world
        .daemon_with_env(&[], &[("OSTLER_SESSIONS__CGROUP", "off")])
        .await;
    let mut c = daemon.sessions().await;
    let (_id, sleeper) = start_hidden_sleeper(&mut c, &world).await;
    let mut daemon = daemon;
    daemon.kill9();
    let _daemon = world
        .daemon_with_env(&[], &[("OSTLER_SESSIONS__CGROUP", "off")])
        .await;
    let alive = proctree::stat(sleeper).is_some_and(|s| !s.is_zombie());
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sleeper as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    assert!(
        alive,
        "without a cgroup the hidden sleeper survives a restart"
    );
}
