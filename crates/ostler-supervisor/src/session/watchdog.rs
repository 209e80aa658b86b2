//! Stall detection: [`ProcessEvent::Stall`] after `stall_after` without output while a
//! turn runs and no permission prompt is open.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::sync::mpsc;

use super::events::ProcessEvent;
use super::shared::{Shared, lock};

pub(super) async fn watchdog_task(
    shared: Arc<Shared>,
    events: mpsc::Sender<ProcessEvent>,
    after: Duration,
) {
    let after_ms = after.as_millis() as u64;
    let mut reported_at: Option<u64> = None;
    loop {
        let last = shared.last_activity_ms.load(Ordering::Relaxed);
        let now = shared.started.elapsed().as_millis() as u64;
        let idle = now.saturating_sub(last);
        if idle < after_ms {
            tokio::time::sleep(Duration::from_millis(after_ms - idle)).await;
            continue;
        }
        if shared.exited() {
            return;
        }
        let busy =
            shared.turn_running.load(Ordering::SeqCst) && lock(&shared.open_requests).is_empty();
        if busy && reported_at != Some(last) {
            reported_at = Some(last);
            let idle_for = Duration::from_millis(idle);
            tracing::warn!(session = %shared.log_id, ?idle_for, "session stalled: no output while a turn runs");
            if events.send(ProcessEvent::Stall { idle_for }).await.is_err() {
                return;
            }
            if shared.opts.kill_on_stall {
                shared.set_requested();
                shared.kill_group(Signal::SIGKILL);
                return;
            }
        }
        // Idle but nothing to report (no turn, a prompt open, or already reported): look
        // again after another period.
        tokio::time::sleep(after).await;
    }
}
