//! Live on demand: the one lookup every call that needs a session's CLI process goes
//! through ([`Engine::live_actor`]), which resumes a `suspended` or `resumable` session
//! first; and the live-session slots at `max_live_sessions` ([`Engine::acquire_slot`]),
//! which suspends the least recently used idle session to make room.
//!
//! A call and a suspension never cross: the call counts itself on the session's entry
//! (`inflight`) before it looks at `suspending`, the actor sets `suspending` before it
//! looks at `inflight` (both `SeqCst`). So a call either reaches the running process (which
//! then does not suspend until the call has its answer) or sees the mark, waits for the
//! process to end and resumes the session: a message is delivered exactly once.

use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::Engine;
use crate::error::{Error, Result};
use crate::handle::{SessionEntry, SessionHandle};
use crate::shared::SlotGuard;
use crate::types::{EngineNotice, EventPayload, SessionState};

/// How often a call goes round "the process ended under it: resume" before giving up
/// (each round needs another suspension of the same session in between).
const MAX_ROUNDS: usize = 8;

/// A live session's actor, reserved for one call: while this is held the actor does not
/// suspend itself (see the module doc).
pub(crate) struct LiveActor {
    handle: SessionHandle,
    _inflight: InFlight,
}

impl Deref for LiveActor {
    type Target = SessionHandle;

    fn deref(&self) -> &SessionHandle {
        &self.handle
    }
}

pub(crate) struct InFlight(Arc<SessionEntry>);

/// Keeps the session's next process from suspending itself until dropped: held across a
/// spawn and the call that follows it (the first prompt of a create, the call a resume on
/// demand is for), so a short idle timeout cannot end the process in between.
pub(crate) fn hold(entry: &Arc<SessionEntry>) -> InFlight {
    entry.inflight.fetch_add(1, Ordering::SeqCst);
    InFlight(entry.clone())
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Reserves `handle` for a call, unless its actor has ended or is suspending.
fn enter(entry: &Arc<SessionEntry>, handle: &SessionHandle) -> Option<LiveActor> {
    if !handle.is_live() {
        return None;
    }
    let guard = hold(entry);
    if entry.suspending.load(Ordering::SeqCst) || !handle.is_live() {
        return None;
    }
    Some(LiveActor {
        handle: handle.clone(),
        _inflight: guard,
    })
}

/// Code of the notice a session being resumed gets when it must wait for a live slot.
pub(crate) const LIVE_SLOT_WAIT: &str = "live_slot_wait";

/// States a call resumes on demand.
pub(crate) fn resumes_on_demand(state: SessionState) -> bool {
    matches!(state, SessionState::Suspended | SessionState::Resumable)
}

impl Engine {
    /// The session's running actor, reserved for one call; a `suspended` or `resumable`
    /// session is resumed first (`--resume` with the options it was created with; once,
    /// however many callers ask at the same time). Other states without a process:
    /// `FailedPrecondition`.
    pub(crate) async fn live_actor(&self, id: &str) -> Result<LiveActor> {
        let entry = self.entry(id).await?;
        for _ in 0..MAX_ROUNDS {
            if let Some(h) = self.registry.handle(id) {
                if let Some(live) = enter(&entry, &h) {
                    return Ok(live);
                }
                // Suspending (or just ended): wait for the end, then resume.
                h.ended().await;
            }
            let life = entry.lifecycle.lock().await;
            if self.live_handle(id).is_some() {
                // Resumed by another caller meanwhile.
                continue;
            }
            let rec = self.record(id).await?;
            if !resumes_on_demand(rec.state) {
                return Err(Error::precondition(format!(
                    "session {id:?} is {} (no CLI process); resume it first",
                    rec.state
                )));
            }
            let _spawning = hold(&entry);
            self.resume_on_demand(&entry, rec).await?;
            if let Some(h) = self.live_handle(id)
                && let Some(live) = enter(&entry, &h)
            {
                return Ok(live);
            }
            drop(life);
        }
        Err(Error::Unavailable(format!(
            "session {id:?} was suspended again while it was being resumed; retry"
        )))
    }

    /// The session's running actor if it has one (no resume): for calls that make sense
    /// only on a running process (answers to its pending prompts).
    pub(crate) async fn running_actor(&self, id: &str) -> Result<LiveActor> {
        let entry = self.entry(id).await?;
        if let Some(h) = self.registry.handle(id)
            && let Some(live) = enter(&entry, &h)
        {
            return Ok(live);
        }
        let rec = self.record(id).await?;
        Err(Error::precondition(format!(
            "session {id:?} is {} (no CLI process)",
            rec.state
        )))
    }

    /// A live-session slot for `for_id`: a free one, else one freed by suspending the least
    /// recently used idle live session, else (every live session busy) the first one freed
    /// or made suspendable within `live_wait`; then `ResourceExhausted`. `session`: the
    /// session being resumed, if any: before it waits, its log gets an `EngineNotice`
    /// [`LIVE_SLOT_WAIT`] (a client sees why its message has not started), and a stop or
    /// delete of it ends the wait ([`SessionEntry::stops`]; `FailedPrecondition`).
    pub(crate) async fn acquire_slot(
        &self,
        for_id: &str,
        session: Option<&Arc<SessionEntry>>,
    ) -> Result<SlotGuard> {
        let max = self.shared.opts.max_live_sessions;
        let deadline = Instant::now() + self.shared.opts.live_wait;
        let mut changed = self.shared.watch_slots();
        let mut stops = session.map(|e| e.stops.subscribe());
        let mut told = false;
        let stopped = async |stops: &mut Option<tokio::sync::watch::Receiver<u64>>| match stops {
            Some(rx) => {
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending::<()>().await,
        };
        loop {
            changed.borrow_and_update();
            match self.shared.reserve_slot() {
                Ok(slot) => return Ok(slot),
                Err(Error::ResourceExhausted { .. }) => {}
                Err(e) => return Err(e),
            }
            if max == 0 {
                return Err(Error::ResourceExhausted {
                    message: "no live sessions are allowed (sessions.max_live is 0)".into(),
                });
            }
            if self.suspend_lru(for_id).await {
                continue;
            }
            if let (Some(entry), false) = (session, told) {
                told = true;
                entry
                    .hub
                    .emit_one(EventPayload::EngineNotice(EngineNotice {
                        code: LIVE_SLOT_WAIT.into(),
                        message: format!(
                            "all {max} live sessions are busy: waiting up to {}s for one to \
                             become idle (sessions.max_live)",
                            self.shared.opts.live_wait.as_secs()
                        ),
                        data: None,
                    }))
                    .await?;
            }
            let waited = tokio::select! {
                r = tokio::time::timeout_at(deadline, changed.changed()) => r,
                () = stopped(&mut stops) => {
                    return Err(Error::precondition(format!(
                        "session {for_id:?} was stopped or deleted while it waited for a live \
                         slot"
                    )));
                }
            };
            match waited {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => {
                    return Err(Error::ResourceExhausted {
                        message: format!(
                            "all {max} live sessions are busy (running a turn, waiting for a \
                             permission answer or running a background task; waited {}s for \
                             one to become idle); retry later, or raise sessions.max_live",
                            self.shared.opts.live_wait.as_secs()
                        ),
                    });
                }
            }
        }
    }

    /// Suspends the least recently used idle live session (not `except`) and waits for its
    /// process to end. `false` when no live session is idle.
    async fn suspend_lru(&self, except: &str) -> bool {
        let mut idle: Vec<_> = self
            .registry
            .all()
            .into_iter()
            .filter(|r| &*r.entry.id != except && !r.entry.suspending.load(Ordering::SeqCst))
            .filter_map(|r| {
                let h = r.handle?;
                let since = {
                    let v = h.view();
                    (v.live && v.state == SessionState::Idle)
                        .then_some(v.idle_since)
                        .flatten()
                }?;
                Some((since, r.entry, h))
            })
            .collect();
        idle.sort_by_key(|(since, _, _)| *since);
        for (_, entry, h) in idle {
            // A session in the middle of a lifecycle change is not a candidate.
            let Ok(_life) = entry.lifecycle.try_lock() else {
                continue;
            };
            if h.suspend(
                "made room for another session (the live-session limit was reached)".into(),
            )
            .await
            {
                h.ended().await;
                return true;
            }
        }
        false
    }
}
