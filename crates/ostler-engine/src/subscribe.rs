//! Subscriptions: store replay, then the live broadcast, without gap or duplicate.
//!
//! The receiver is taken from the broadcast **before** the first store read, so an event
//! committed after the replay's last read is in the receiver's buffer. Live events are
//! de-duplicated by seq (`seq <= last` delivered is skipped); a live event whose seq is
//! beyond `last + 1` (a gap, which can only be events already committed: persist before
//! publish) or a `Lagged` receiver sends the subscription back to the store from `last`.
//! A slow subscriber therefore only ever costs itself store reads.

use std::collections::VecDeque;
use std::sync::Arc;

use ostler_store::Store;
use tokio::sync::broadcast::{self, error::RecvError};

use crate::blocking::blocking;
use crate::error::{Error, Result};
use crate::hub::{Hub, decode_stored};
use crate::types::EngineEvent;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Reading pages from the store; switch to `Live` once a short page shows we caught up.
    Replay,
    Live,
    /// The live channel closed (session deleted / engine shut down): read what is left in
    /// the store, then end.
    Drain,
    Done,
}

/// A subscription: stored events after `after_seq`, then live events (when following).
/// Also a [`futures::Stream`] through [`Subscription::into_stream`].
pub struct Subscription {
    store: Store,
    session_id: Arc<str>,
    /// Only the receiver: the channel closes when the session's hub goes away (session
    /// deleted, engine gone), which ends the subscription after a last store read.
    rx: Option<broadcast::Receiver<Arc<EngineEvent>>>,
    last: u64,
    /// Without `follow`: stop after this seq (the last seq when subscribing).
    until: Option<u64>,
    partials: bool,
    page_size: usize,
    mode: Mode,
    buf: VecDeque<Arc<EngineEvent>>,
    /// Store reads done (replay pages + lag/gap recoveries), for tests and metrics.
    store_reads: u64,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("session_id", &self.session_id)
            .field("last", &self.last)
            .field("mode", &self.mode)
            .finish_non_exhaustive()
    }
}

impl Subscription {
    pub(crate) fn new(
        hub: Arc<Hub>,
        after_seq: u64,
        include_partials: bool,
        follow: bool,
        until: Option<u64>,
        page_size: usize,
        redeliver: Vec<Arc<EngineEvent>>,
    ) -> Self {
        let rx = follow.then(|| hub.subscribe());
        Self {
            store: hub.store.clone(),
            session_id: hub.session_id.clone(),
            rx,
            last: after_seq,
            until: if follow { None } else { until },
            partials: include_partials,
            page_size: page_size.max(1),
            mode: Mode::Replay,
            buf: redeliver.into(),
            store_reads: 0,
        }
    }

    /// The seq of the last stored event delivered (or `after_seq`).
    pub fn last_seq(&self) -> u64 {
        self.last
    }

    /// How many times this subscription read from the store (replay pages, lag and gap
    /// recovery).
    pub fn store_reads(&self) -> u64 {
        self.store_reads
    }

    /// Reads one page after `self.last`; returns how many events it held.
    async fn read_page(&mut self) -> Result<usize> {
        let limit = match self.until {
            Some(u) if u <= self.last => return Ok(0),
            Some(u) => self.page_size.min((u - self.last) as usize),
            None => self.page_size,
        };
        let store = self.store.clone();
        let sid = self.session_id.clone();
        let after = self.last;
        self.store_reads += 1;
        // Read and decode on a blocking thread: replay is CPU work that should not hold a
        // runtime worker.
        let page = blocking(move || {
            store.events_after(&sid, after, limit).map(|page| {
                page.iter()
                    .map(|ev| (ev.seq, Arc::new(decode_stored(ev))))
                    .collect::<Vec<_>>()
            })
        })
        .await?;
        let n = page.len();
        for (seq, ev) in page {
            // The store returns a gap-free run starting at after + 1.
            if seq != self.last + 1 {
                return Err(Error::internal(format!(
                    "store replay of session {} returned seq {seq} after {}",
                    self.session_id, self.last
                )));
            }
            self.last = seq;
            self.buf.push_back(ev);
        }
        Ok(n)
    }

    /// The next event; `None` when the subscription ended (caught up without `follow`, the
    /// session was deleted, or the engine shut down). An `Err` ends the stream too.
    pub async fn next(&mut self) -> Option<Result<Arc<EngineEvent>>> {
        loop {
            if let Some(ev) = self.buf.pop_front() {
                return Some(Ok(ev));
            }
            match self.mode {
                Mode::Done => return None,
                Mode::Replay | Mode::Drain => {
                    let n = match self.read_page().await {
                        Ok(n) => n,
                        Err(e) => {
                            self.mode = Mode::Done;
                            // A deleted session ends the stream quietly when draining.
                            if matches!(e, Error::NotFound { .. }) && self.rx.is_none() {
                                return None;
                            }
                            return Some(Err(e));
                        }
                    };
                    if n < self.page_size {
                        self.mode = match (self.mode, &self.rx) {
                            (Mode::Replay, Some(_)) => Mode::Live,
                            (Mode::Replay, None) if n > 0 => Mode::Replay,
                            _ => Mode::Done,
                        };
                    }
                }
                Mode::Live => {
                    let Some(rx) = self.rx.as_mut() else {
                        self.mode = Mode::Done;
                        continue;
                    };
                    match rx.recv().await {
                        Ok(ev) => match ev.seq {
                            None => {
                                if self.partials {
                                    return Some(Ok(ev));
                                }
                            }
                            Some(s) if s <= self.last => {}
                            Some(s) if s == self.last + 1 => {
                                self.last = s;
                                return Some(Ok(ev));
                            }
                            Some(_) => {
                                // Committed events we have not delivered: read them (and
                                // this one) from the store.
                                self.mode = Mode::Replay;
                            }
                        },
                        Err(RecvError::Lagged(n)) => {
                            tracing::debug!(session = %self.session_id, skipped = n, last = self.last, "subscriber lagged; continuing from the store");
                            self.mode = Mode::Replay;
                        }
                        Err(RecvError::Closed) => {
                            self.rx = None;
                            self.mode = Mode::Drain;
                        }
                    }
                }
            }
        }
    }

    /// This subscription as a stream (ends after the first error).
    pub fn into_stream(
        self,
    ) -> impl futures::Stream<Item = Result<Arc<EngineEvent>>> + Send + 'static {
        futures::stream::unfold(self, |mut sub| async move {
            sub.next().await.map(|item| (item, sub))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use ostler_store::{NewSession, StoreOptions};

    use super::*;
    use crate::hub::Item;
    use crate::types::{EngineNotice, EventPayload};

    fn notice(i: u64) -> EventPayload {
        EventPayload::EngineNotice(EngineNotice {
            code: "n".into(),
            message: i.to_string(),
            data: None,
        })
    }

    /// However replay and live interleave — subscribers joining at random points while a
    /// writer appends in batches, with a live buffer of 2 so most of them lag — every
    /// subscriber gets exactly `after + 1 ..= last`, in order, and live-only events only
    /// when asked for.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn replay_and_live_interleave_without_gap_or_duplicate() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = Store::open(dir.path().join("s.db"), StoreOptions::default()).expect("store");
        store
            .create_session(NewSession {
                id: "s".into(),
                cwd: "/".into(),
                state: ostler_store::SessionState::Idle,
                labels: BTreeMap::new(),
                ..Default::default()
            })
            .await
            .expect("session");
        let hub = Arc::new(Hub::new(Arc::from("s"), store.clone(), 2));
        const TOTAL: u64 = 3000;
        let writer = {
            let hub = hub.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                while n < TOTAL {
                    let batch = (n % 7 + 1).min(TOTAL - n);
                    let mut items = Vec::new();
                    for i in 0..batch {
                        items.push(Item::new(notice(n + i + 1)));
                        // A live-only partial between stored events.
                        items.push(Item::new(EventPayload::PartialDelta(
                            ostler_protocol::PartialDelta {
                                message_id: None,
                                index: 0,
                                parent_tool_use_id: None,
                                delta: ostler_protocol::Delta::Text("x".into()),
                            },
                        )));
                    }
                    hub.emit(items).await.expect("emit");
                    n += batch;
                    if n.is_multiple_of(50) {
                        tokio::task::yield_now().await;
                    }
                }
            })
        };
        let mut readers = Vec::new();
        for k in 0..24u64 {
            let hub = hub.clone();
            let store = store.clone();
            readers.push(tokio::spawn(async move {
                // Join at different moments and from different points.
                for _ in 0..k {
                    tokio::task::yield_now().await;
                }
                let now = store.last_seq("s").expect("last");
                let after = match k % 3 {
                    0 => 0,
                    1 => now / 2,
                    _ => now,
                };
                let partials = k % 2 == 0;
                let mut sub = Subscription::new(hub, after, partials, true, None, 64, Vec::new());
                let mut expect = after + 1;
                let mut saw_partial = false;
                while expect <= TOTAL {
                    let ev = sub.next().await.expect("open").expect("event");
                    match ev.seq {
                        None => {
                            assert!(partials, "partial delivered without being asked for");
                            saw_partial = true;
                        }
                        Some(s) => {
                            assert_eq!(s, expect, "subscriber {k} from {after}");
                            expect += 1;
                        }
                    }
                }
                (sub.store_reads(), saw_partial)
            }));
        }
        writer.await.expect("writer");
        let mut lagged = 0;
        for r in readers {
            let (reads, _) = r.await.expect("reader");
            if reads > 1 {
                lagged += 1;
            }
        }
        assert!(lagged > 0, "no subscriber ever went back to the store");
    }

    /// Without `follow`, the subscription ends at the last seq at subscribe time.
    #[tokio::test(flavor = "multi_thread")]
    async fn non_follow_ends_at_the_snapshot() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = Store::open(dir.path().join("s.db"), StoreOptions::default()).expect("store");
        store
            .create_session(NewSession {
                id: "s".into(),
                cwd: "/".into(),
                state: ostler_store::SessionState::Idle,
                ..Default::default()
            })
            .await
            .expect("session");
        let hub = Arc::new(Hub::new(Arc::from("s"), store.clone(), 8));
        hub.emit((1..=10).map(|i| Item::new(notice(i))).collect())
            .await
            .expect("emit");
        let mut sub = Subscription::new(hub.clone(), 3, false, false, Some(10), 4, Vec::new());
        hub.emit(vec![Item::new(notice(11))]).await.expect("emit");
        let mut seqs = Vec::new();
        while let Some(ev) = sub.next().await {
            seqs.push(ev.expect("event").seq.expect("seq"));
        }
        assert_eq!(seqs, (4..=10).collect::<Vec<_>>());
    }
}
