//! The state one session process's handle and tasks share, and the stdin queue they all
//! write through.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use nix::sys::signal::Signal;
use ostler_protocol::model::ControlOutcome;
use tokio::sync::{mpsc, oneshot, watch};

use super::error::{Error, Result};
use super::types::{ExitInfo, SupervisorOptions};
use crate::child::signal_group;

/// One item of the stdin queue (see [`super::io::writer_task`]).
pub(super) enum WriteCmd {
    Line(Vec<u8>, Option<oneshot::Sender<Result<(), String>>>),
    Close,
}

impl std::fmt::Debug for WriteCmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteCmd::Line(l, _) => write!(f, "Line({} bytes)", l.len()),
            WriteCmd::Close => f.write_str("Close"),
        }
    }
}

/// Resolves once a queued stdin write is done (see [`super::SessionProcess::queue_user`]).
#[derive(Debug)]
#[must_use = "the write happens anyway; the ack tells whether it succeeded"]
pub struct WriteAck(oneshot::Receiver<std::result::Result<(), String>>);

impl WriteAck {
    /// Waits until the line is written to stdin (or the write failed).
    pub async fn written(self) -> Result<()> {
        match self.0.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Error::Stdin(e)),
            Err(_) => Err(Error::ProcessGone),
        }
    }
}

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) pid: u32,
    pub(super) log_id: String,
    /// This process's [`crate::proctree::MARK_VAR`] value.
    pub(super) mark: String,
    pub(super) writer: mpsc::UnboundedSender<WriteCmd>,
    /// Our control requests awaiting their response.
    pub(super) pending: Mutex<HashMap<String, oneshot::Sender<ControlOutcome>>>,
    /// The CLI's control requests not yet answered or cancelled.
    pub(super) open_requests: Mutex<HashSet<String>>,
    pub(super) next_id: AtomicU64,
    pub(super) exit_rx: watch::Receiver<Option<ExitInfo>>,
    pub(super) requested: AtomicBool,
    pub(super) turn_running: AtomicBool,
    pub(super) started: Instant,
    /// Milliseconds since `started` of the last stdout output or message sent.
    pub(super) last_activity_ms: AtomicU64,
    pub(super) session_id: Mutex<Option<String>>,
    /// `capabilities` of the last `system/init`.
    pub(super) announced: Mutex<Option<Vec<String>>>,
    pub(super) opts: SupervisorOptions,
    pub(super) args: Vec<String>,
    pub(super) version: semver::Version,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these short locks cannot leave the data inconsistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub(super) fn touch(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.last_activity_ms.store(ms, Ordering::Relaxed);
    }

    pub(super) fn exited(&self) -> bool {
        self.exit_rx.borrow().is_some()
    }

    pub(super) async fn write(&self, line: Vec<u8>) -> Result<()> {
        self.queue(line)?.written().await
    }

    /// Queues `line` for stdin (in order with every other write) without waiting for it.
    pub(super) fn queue(&self, line: Vec<u8>) -> Result<WriteAck> {
        if self.exited() {
            return Err(Error::ProcessGone);
        }
        let (tx, rx) = oneshot::channel();
        self.writer
            .send(WriteCmd::Line(line, Some(tx)))
            .map_err(|_| Error::ProcessGone)?;
        Ok(WriteAck(rx))
    }

    /// Queues `line` for stdin without an acknowledgement.
    pub(super) fn queue_unacked(&self, line: Vec<u8>) -> Result<()> {
        self.writer
            .send(WriteCmd::Line(line, None))
            .map_err(|_| Error::ProcessGone)
    }

    /// Marks the end as asked for by ostler (stop, kill, dropped handle, kill on stall).
    pub(super) fn set_requested(&self) {
        self.requested.store(true, Ordering::SeqCst);
    }

    pub(super) fn kill_group(&self, sig: Signal) {
        signal_group(self.pid, sig);
    }

    /// SIGKILL every process of this session: whatever carries its mark (tools that left
    /// the group too) and their descendants, plus, while the leader is alive (`leader_alive`;
    /// after it was reaped its pid may name another process), its group and descendants.
    /// Scans `/proc`.
    /// Then, when the session has a cgroup, kills what is left in it (a tool that cleared
    /// its environment and left the group) and removes it.
    pub(super) fn kill_tree(&self, leader_alive: bool) -> usize {
        let n = crate::proctree::kill_tree(
            crate::proctree::Mark::Exact(&self.mark),
            leader_alive.then_some(self.pid),
        );
        n + self
            .opts
            .cgroups
            .as_ref()
            .map_or(0, |cg| cg.kill(&self.mark))
    }
}
