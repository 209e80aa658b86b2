//! Process helpers: waiting for the exit (then killing what the CLI left behind and
//! publishing the [`ExitInfo`]), the graceful stop, and the kill when the last handle goes.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;
use ostler_protocol::ExitFacts;
use tokio::sync::watch;

use super::io::Tail;
use super::shared::{Shared, WriteCmd, lock};
use super::types::ExitInfo;

/// Waits for the exit, SIGKILLs what is left of the group and of the marked process tree,
/// then publishes the [`ExitInfo`].
pub(super) async fn supervise_task(
    mut child: tokio::process::Child,
    shared: Arc<Shared>,
    exit_tx: watch::Sender<Option<ExitInfo>>,
    stderr_task: tokio::task::JoinHandle<()>,
    tail: Arc<Mutex<Tail>>,
) {
    use std::os::unix::process::ExitStatusExt;
    let status = child.wait().await;
    crate::proctree::unregister(shared.pid);
    // Whatever the CLI left behind (tool processes, in its group or not) goes with it.
    shared.kill_group(Signal::SIGKILL);
    let tree = shared.clone();
    match tokio::task::spawn_blocking(move || tree.kill_tree(false)).await {
        Ok(0) | Err(_) => {}
        Ok(n) => {
            tracing::info!(session = %shared.log_id, killed = n, "ended processes the session left behind")
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), stderr_task).await;
    let (code, signal) = match &status {
        Ok(s) => (s.code(), s.signal()),
        Err(_) => (None, None),
    };
    let info = ExitInfo {
        facts: ExitFacts { code, signal },
        stderr_tail: lock(&tail).text(),
        requested: shared.requested.load(Ordering::SeqCst),
    };
    ostler_metrics::cli_exited(info.requested, info.facts.code, info.facts.signal);
    if info.requested || info.success() {
        tracing::info!(session = %shared.log_id, pid = shared.pid, ?code, ?signal, "session process exited");
    } else {
        tracing::warn!(session = %shared.log_id, pid = shared.pid, ?code, ?signal, stderr = %info.stderr_tail, "session process died");
    }
    let _ = exit_tx.send(Some(info));
}

/// Kills the process group when the last [`super::SessionProcess`] handle goes away.
#[derive(Debug)]
pub(super) struct DropGuard(pub(super) Arc<Shared>);

impl Drop for DropGuard {
    fn drop(&mut self) {
        if !self.0.exited() {
            self.0.set_requested();
            self.0.kill_group(Signal::SIGKILL);
            // The processes outside the group: a scan of /proc that may wait up to
            // `SETTLE_FOR` for a process caught mid-exec. The last handle is often dropped
            // on an async worker, which must not block that long: the scan runs on a thread
            // of its own (inline only if no thread can be started).
            let shared = self.0.clone();
            let scan = std::thread::Builder::new()
                .name("ostler-reap".into())
                .spawn(move || shared.kill_tree(true));
            if scan.is_err() {
                self.0.kill_tree(true);
            }
        }
    }
}

/// How the process ended, once it has.
pub(super) async fn wait(shared: &Shared) -> ExitInfo {
    let mut rx = shared.exit_rx.clone();
    loop {
        if let Some(e) = rx.borrow_and_update().clone() {
            return e;
        }
        if rx.changed().await.is_err() {
            // The supervisor task is gone without publishing: runtime shutting down.
            return ExitInfo {
                facts: ExitFacts::default(),
                stderr_tail: String::new(),
                requested: shared.requested.load(Ordering::SeqCst),
            };
        }
    }
}

async fn wait_for(shared: &Shared, d: Duration) -> Option<ExitInfo> {
    tokio::time::timeout(d, wait(shared)).await.ok()
}

/// Graceful stop: close stdin, wait `stop_grace`, SIGTERM the group, wait `term_grace`,
/// SIGKILL. Returns once the process is reaped and its group signalled.
pub(super) async fn stop(shared: &Shared) -> ExitInfo {
    shared.set_requested();
    if let Some(e) = shared.exit_rx.borrow().clone() {
        return e;
    }
    let _ = shared.writer.send(WriteCmd::Close);
    if let Some(e) = wait_for(shared, shared.opts.stop_grace).await {
        return e;
    }
    tracing::info!(session = %shared.log_id, "stdin closed but still running: SIGTERM");
    shared.kill_group(Signal::SIGTERM);
    if let Some(e) = wait_for(shared, shared.opts.term_grace).await {
        return e;
    }
    tracing::warn!(session = %shared.log_id, "still running after SIGTERM: SIGKILL");
    shared.kill_group(Signal::SIGKILL);
    wait(shared).await
}
