//! The session process dies with the daemon even when the daemon gets no chance to clean
//! up (PR_SET_PDEATHSIG): this test re-runs itself as a "daemon" that spawns a session and
//! exits abruptly, then checks that the session process is gone.
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
#![allow(clippy::disallowed_methods)] // re-runs this test binary as the "daemon" process

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use ostler_supervisor::{Installation, ProcessEvent, SessionProcess, SpawnOptions};

const ROLE: &str = "OSTLER_TEST_PDEATH_DIR";

fn act_as_daemon(dir: &str) -> ! {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let p = std::path::Path::new(dir).join("claude");
        std::fs::write(
            &p,
            "#!/bin/sh\necho '{\"type\":\"keep_alive\"}'\nexec sleep 300\n",
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        let inst = Installation::assume(p, semver::Version::new(2, 1, 330), None);
        let (proc, mut rx) = SessionProcess::spawn(
            &inst,
            SpawnOptions {
                cwd: dir.into(),
                log_id: "pdeath".into(),
                ..SpawnOptions::default()
            },
            Default::default(),
        )
        .await
        .unwrap();
        // Running for sure once its first line arrived.
        assert!(matches!(rx.recv().await, Some(ProcessEvent::Line(_))));
        println!("SESSION_PID={}", proc.pid());
        // Exit without running any destructor (no kill_on_drop, no DropGuard).
        std::process::exit(0)
    })
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rfind(')')
                .and_then(|i| s[i + 1..].split_whitespace().next())
                .is_some_and(|state| state != "Z")
        })
        .unwrap_or(false)
}

#[test]
fn session_process_dies_with_the_daemon() {
    if let Ok(dir) = std::env::var(ROLE) {
        act_as_daemon(&dir);
    }
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "session_process_dies_with_the_daemon",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let pid: u32 = stdout
        .lines()
        .find_map(|l| l.split_once("SESSION_PID=").map(|(_, pid)| pid))
        .unwrap_or_else(|| {
            panic!(
                "no pid in {stdout:?} / {:?}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
        .trim()
        .parse()
        .unwrap();
    // SIGKILL is sent by the kernel when the daemon exits; the orphan is then reaped by
    // init. Watch /proc for that (there is no event to await across processes).
    let deadline = Instant::now() + ostler_testkit::timeouts::secs(10);
    while alive(pid) {
        assert!(
            Instant::now() < deadline,
            "session process {pid} outlived its daemon"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
