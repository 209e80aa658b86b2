//! Process-tree scans (a ratio against a baseline measured in the same run).
//!
//! 100 sessions run (each a fake CLI, a shell, with two tool processes), and this process
//! is their child subreaper, as the daemon is. When a session ends, the supervisor scans
//! for whatever it left behind (again after each kill, until a scan finds nothing left),
//! and the reaper looks for adopted orphans to reap (on the CLI's `SIGCHLD`, and after
//! a cleanup that killed something).
//! - `session_scan/every_process` (baseline): a scan that reads every process of the system
//!   (`/proc/<pid>/stat` and `environ`), as every session's end did before the scan was
//!   confined to the daemon's own tree (`members` with a tag reads everything).
//! - `session_scan/own_tree`: the scan a session's end makes now (`members` of one ended
//!   session: the orphans this process adopted, no other session's tree).
//! - `reap/every_process` (baseline): finding this process's zombie children among every
//!   process of the system, as reaping adopted orphans (on every `SIGCHLD` and after each
//!   session's cleanup) did before.
//! - `reap/children`: reaping them now (`reap_adopted`): the kernel's list of this process's
//!   children, those the supervisor spawned left out before any is read.

use std::hint::black_box;
use std::os::unix::fs::PermissionsExt;

use criterion::{Criterion, criterion_group, criterion_main};
use ostler_supervisor::proctree::{self, Mark};
use ostler_supervisor::{
    Installation, ProcessEvent, SessionProcess, SpawnOptions, SupervisorOptions,
};

const SESSIONS: usize = 100;

fn proctree_scans(c: &mut Criterion) {
    proctree::become_subreaper().expect("subreaper");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("tmp");
    let cli = dir.path().join("claude");
    std::fs::write(
        &cli,
        "#!/bin/sh\nsleep 300 & sleep 300 &\necho '{\"type\":\"system\",\"subtype\":\"init\",\
         \"session_id\":\"s\",\"tools\":[],\"model\":\"m\",\"cwd\":\"/\"}'\ncat > /dev/null\n",
    )
    .expect("fake CLI");
    std::fs::set_permissions(&cli, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let inst = Installation::assume(cli, semver::Version::new(2, 1, 330), None);
    let tag = format!("bench-{}", std::process::id());
    let sup = SupervisorOptions {
        process_tag: tag.clone(),
        stall_after: None,
        ..SupervisorOptions::default()
    };
    let sessions: Vec<SessionProcess> = rt.block_on(async {
        let mut out = Vec::new();
        for i in 0..SESSIONS {
            let opts = SpawnOptions {
                cwd: dir.path().to_path_buf(),
                log_id: format!("bench-{i}"),
                ..SpawnOptions::default()
            };
            let (p, mut rx) = SessionProcess::spawn(&inst, opts, sup.clone())
                .await
                .expect("spawn");
            // Its tools run once it has announced itself.
            while let Some(ev) = rx.recv().await {
                if matches!(ev, ProcessEvent::Line(_)) {
                    break;
                }
            }
            out.push(p);
        }
        out
    });
    let ended = format!("{tag}/ended");
    let mut g = c.benchmark_group("session_scan");
    g.bench_function("every_process", |b| {
        b.iter(|| black_box(proctree::members(Mark::Tag(&ended), None)))
    });
    g.bench_function("own_tree", |b| {
        b.iter(|| black_box(proctree::members(Mark::Exact(&ended), None)))
    });
    g.finish();
    let mut g = c.benchmark_group("reap");
    let me = std::process::id();
    g.bench_function("every_process", |b| {
        b.iter(|| {
            black_box(
                proctree::all_processes()
                    .iter()
                    .filter(|p| p.ppid == me && p.is_zombie())
                    .count(),
            )
        })
    });
    g.bench_function("children", |b| {
        b.iter(|| black_box(proctree::reap_adopted()))
    });
    g.finish();
    rt.block_on(async {
        for p in sessions {
            p.stop().await;
        }
    });
}

criterion_group!(benches, proctree_scans);
criterion_main!(benches);
