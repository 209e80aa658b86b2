//! Subscriptions: store replay, then the live broadcast, without gap or duplicate.
//!
//! Stored events: the receiver is taken from the hub's stored ring **before** the first
//! store read, so an event committed after the replay's last read is in the receiver's
//! buffer. Live events are de-duplicated by seq (`seq <= last` delivered is skipped); a live
//! event whose seq is beyond `last + 1` (a gap, which can only be events already committed:
//! persist before publish) or a `Lagged` receiver sends the subscription back to the store
//! from `last`. A slow subscriber therefore only ever costs itself store reads.
//!
//! Partials (live-only, never stored) come from the hub's own live ring, so they never
//! push stored events out. They cannot be read back: a subscriber that lagged behind the
//! live ring (or was reading the store meanwhile) gets a [`PartialsMissed`] event with the
//! exact number of partial deltas it did not get (from the deltas' ordinals), as soon as it
//! finds out: before the next partial and the stored events that partial waits behind, or,
//! when the session's live events end, at the end; so received + missed
//! is every delta published while it followed. When both rings have events ready, the
//! live one goes first (a delta is published at once, the stored event after it only after
//! its commit), unless the subscriber is behind: a live item carries the seq of the last
//! stored event published before it (`LiveItem::after_seq`) and waits until that event is
//! delivered, so a subscriber that fell behind gets every event in the session's order (a
//! later turn's partials never before an earlier turn's end).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ostler_store::Store;
use tokio::sync::broadcast::{self, error::RecvError, error::TryRecvError};

use crate::blocking::{Started, start};
use crate::error::{Error, Result};
use crate::hub::{Hub, LiveItem, LiveReceiver, decode_stored, now_ms};
use crate::types::{EngineEvent, EventPayload, PartialsMissed};

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
    /// The live ring, when following with partials; `None` once it closed.
    live: Option<LiveReceiver>,
    /// A live item taken from the ring that follows a stored event not delivered yet.
    held_live: Option<LiveItem>,
    page_size: usize,
    mode: Mode,
    buf: VecDeque<Arc<EngineEvent>>,
    /// Store reads done (replay pages + lag/gap recoveries), for tests and metrics.
    store_reads: u64,
    /// The next page, being read while the current one is delivered (after a full page).
    prefetch: Option<Prefetch>,
    /// Partial deltas delivered and reported missed.
    partials_received: u64,
    partials_missed: u64,
}

/// A page read started ahead: the events after `after`, at most `limit`.
struct Prefetch {
    after: u64,
    limit: usize,
    page: Started<Page>,
}

/// The stored bytes (payloads and raw lines) a replay page stops at, besides its count: a
/// subscriber holds at most two pages of small events (the one being sent and the next,
/// read ahead) and one page of large ones (a page cut here is not read ahead), so many
/// subscribers replaying a log of large events (a 3 MB tool input and its echo) do not
/// hold the log many times over.
pub(crate) const PAGE_BYTES: usize = 1024 * 1024;

/// A page's events, and whether it ended on [`PAGE_BYTES`] (more may follow).
struct Page {
    events: Vec<(u64, Arc<EngineEvent>)>,
    cut: bool,
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
        let live = (follow && include_partials).then(|| hub.subscribe_live());
        Self {
            store: hub.store.clone(),
            session_id: hub.session_id.clone(),
            rx,
            last: after_seq,
            until: if follow { None } else { until },
            live,
            held_live: None,
            page_size: page_size.max(1),
            mode: Mode::Replay,
            buf: redeliver.into(),
            store_reads: 0,
            prefetch: None,
            partials_received: 0,
            partials_missed: 0,
        }
    }

    /// Partial deltas delivered so far.
    pub fn partials_received(&self) -> u64 {
        self.partials_received
    }

    /// Partial deltas reported missed so far (the sum of the [`PartialsMissed`] counts
    /// delivered).
    pub fn partials_missed(&self) -> u64 {
        self.partials_missed
    }

    /// Accounts for a live item: queues a [`PartialsMissed`] for the deltas before it that
    /// this subscriber did not get, then the item.
    fn take_live(&mut self, item: LiveItem) {
        self.gap_before(item.ord);
        let Some(live) = self.live.as_mut() else {
            return;
        };
        if item.is_delta() {
            live.next_ord = item.ord + 1;
            self.partials_received += 1;
        }
        self.buf.push_back(item.event);
    }

    /// The live item with ordinal `ord` is the next one this subscriber gets: the deltas
    /// before it that it did not get are told missed now.
    fn gap_before(&mut self, ord: u64) {
        let Some(live) = self.live.as_mut() else {
            return;
        };
        let missed = ord.saturating_sub(live.next_ord);
        live.next_ord = live.next_ord.max(ord);
        self.missed(missed);
    }

    /// Queues a [`PartialsMissed`] event for `n` deltas (none for 0).
    fn missed(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        self.partials_missed += n;
        ostler_metrics::partial_deltas_missed(n);
        self.buf.push_back(Arc::new(EngineEvent {
            session_id: self.session_id.clone(),
            seq: None,
            ts_ms: now_ms(),
            parent_tool_use_id: None,
            payload: EventPayload::PartialsMissed(PartialsMissed { count: n }),
            redelivered: false,
        }));
    }

    /// The live ring closed (or the stored one did: the hub is gone): delivers what is
    /// left in it, then reports the deltas published that this subscriber never got.
    fn close_live(&mut self) {
        if let Some(item) = self.held_live.take() {
            self.take_live(item);
        }
        loop {
            let Some(live) = self.live.as_mut() else {
                return;
            };
            match live.rx.try_recv() {
                Ok(item) => self.take_live(item),
                Err(TryRecvError::Lagged(_)) => {}
                // Still open (cannot happen once the hub is gone): nothing to report yet.
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Closed) => {
                    let tail = live
                        .published
                        .load(Ordering::Relaxed)
                        .saturating_sub(live.next_ord);
                    self.live = None;
                    self.missed(tail);
                    return;
                }
            }
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

    /// How many events the next page after `self.last` should hold (0: none wanted).
    fn page_limit(&self) -> usize {
        match self.until {
            Some(u) if u <= self.last => 0,
            Some(u) => self.page_size.min((u - self.last) as usize),
            None => self.page_size,
        }
    }

    /// Starts reading (and decoding) the page after `after` on a blocking thread: replay is
    /// CPU work that should not hold a runtime worker.
    fn start_page(&mut self, after: u64, limit: usize) -> Prefetch {
        let store = self.store.clone();
        let sid = self.session_id.clone();
        self.store_reads += 1;
        let page = start(move || {
            store
                .events_after_within(&sid, after, limit, PAGE_BYTES)
                .map(|page| {
                    let bytes: usize = page
                        .iter()
                        .map(|ev| ev.payload.len() + ev.raw.as_ref().map_or(0, |r| r.len()))
                        .sum();
                    Page {
                        cut: page.len() < limit && bytes >= PAGE_BYTES,
                        events: page
                            .iter()
                            .map(|ev| (ev.seq, Arc::new(decode_stored(ev))))
                            .collect(),
                    }
                })
        });
        Prefetch { after, limit, page }
    }

    /// Reads one page after `self.last`; returns how many events it held and whether more
    /// may follow (a full page, or one cut at [`PAGE_BYTES`]). After such a page the next
    /// one is read while this one is delivered (replay overlaps the store read with the
    /// sending).
    async fn read_page(&mut self) -> Result<(usize, bool)> {
        let limit = self.page_limit();
        if limit == 0 {
            return Ok((0, false));
        }
        let pending = match self.prefetch.take() {
            Some(p) if p.after == self.last && p.limit == limit => p,
            // Not the page wanted now (a lag moved `last`): read it afresh.
            _ => self.start_page(self.last, limit),
        };
        let page = pending.page.result().await?;
        let n = page.events.len();
        let more = n == limit || page.cut;
        for (seq, ev) in page.events {
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
        // The next page is read ahead while this one is sent, unless this one was cut at
        // PAGE_BYTES: a log of large events is then held one page at a time (a subscriber
        // that does not read holds one page, not two), and reading is cheap beside sending
        // a MiB.
        if more && !page.cut {
            let next = self.page_limit();
            if next > 0 {
                self.prefetch = Some(self.start_page(self.last, next));
            }
        }
        Ok((n, more))
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
                    let (n, more) = match self.read_page().await {
                        Ok(page) => page,
                        Err(e) => {
                            self.mode = Mode::Done;
                            // A deleted session ends the stream quietly when draining.
                            if matches!(e, Error::NotFound { .. }) && self.rx.is_none() {
                                return None;
                            }
                            return Some(Err(e));
                        }
                    };
                    if !more {
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
                    enum Got {
                        Live(std::result::Result<LiveItem, RecvError>),
                        Stored(std::result::Result<Arc<EngineEvent>, RecvError>),
                    }
                    if self
                        .held_live
                        .as_ref()
                        .is_some_and(|item| item.after_seq <= self.last)
                        && let Some(item) = self.held_live.take()
                    {
                        self.take_live(item);
                        continue;
                    }
                    let got = match self.live.as_mut().filter(|_| self.held_live.is_none()) {
                        Some(live) => tokio::select! {
                            biased;
                            r = live.rx.recv() => Got::Live(r),
                            r = rx.recv() => Got::Stored(r),
                        },
                        None => Got::Stored(rx.recv().await),
                    };
                    match got {
                        // Behind on stored events: those published before it go first.
                        // What it missed is told now, before them: they can end the
                        // blocks whose deltas it missed.
                        Got::Live(Ok(item)) if item.after_seq > self.last => {
                            self.gap_before(item.ord);
                            self.held_live = Some(item);
                        }
                        Got::Live(Ok(item)) => self.take_live(item),
                        // The next item's ordinal tells how many deltas were missed.
                        Got::Live(Err(RecvError::Lagged(_))) => {}
                        Got::Live(Err(RecvError::Closed)) => self.close_live(),
                        Got::Stored(Ok(ev)) => match ev.seq {
                            // Live-only events come on the live ring.
                            None => {}
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
                        Got::Stored(Err(RecvError::Lagged(n))) => {
                            tracing::debug!(session = %self.session_id, skipped = n, last = self.last, "subscriber lagged; continuing from the store");
                            self.mode = Mode::Replay;
                        }
                        Got::Stored(Err(RecvError::Closed)) => {
                            self.rx = None;
                            self.mode = Mode::Drain;
                            self.close_live();
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
        // Boxed: the state moves into a new future for every item; a pointer, not the
        // whole subscription.
        futures::stream::unfold(Box::new(self), |mut sub| async move {
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

    /// A store in a temporary directory (kept alive by the returned guard) holding one
    /// idle session `s`.
    async fn store_with_session() -> (tempfile::TempDir, Store) {
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
        (dir, store)
    }

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

    fn partial(hub: &Hub) -> Arc<EngineEvent> {
        Arc::new(hub.event(
            None,
            0,
            EventPayload::PartialDelta(ostler_protocol::PartialDelta {
                message_id: None,
                index: 0,
                parent_tool_use_id: None,
                delta: ostler_protocol::Delta::Text("x".into()),
            }),
        ))
    }

    async fn next_event(sub: &mut Subscription) -> Option<Arc<EngineEvent>> {
        tokio::time::timeout(ostler_testkit::timeouts::guard(), sub.next())
            .await
            .expect("the subscription is stuck")
            .map(|r| r.expect("event"))
    }

    /// Replay pages end at [`PAGE_BYTES`] as well as at their count: a log of large events
    /// is read a few events at a time (a subscriber holds one such page at a time), and every
    /// event still comes, in order, followed or not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replay_pages_of_large_events_are_bounded_in_bytes() {
        let (_dir, store) = store_with_session().await;
        let hub = Arc::new(Hub::new(Arc::from("s"), store.clone(), 64));
        let big = |i: u64| {
            EventPayload::EngineNotice(EngineNotice {
                code: "n".into(),
                message: format!("{i}{}", "x".repeat(PAGE_BYTES * 2 / 5)),
                data: None,
            })
        };
        const EVENTS: u64 = 9;
        for i in 1..=EVENTS {
            hub.emit(vec![Item::new(big(i))]).await.expect("emit");
        }
        for follow in [false, true] {
            let until = (!follow).then_some(EVENTS);
            let mut sub = Subscription::new(hub.clone(), 0, false, follow, until, 512, Vec::new());
            for want in 1..=EVENTS {
                let ev = next_event(&mut sub).await.expect("open");
                assert_eq!(ev.seq, Some(want), "follow {follow}");
                // A page cut at PAGE_BYTES is not read ahead: one page held at a time.
                assert_eq!(
                    sub.store_reads(),
                    want.div_ceil(3),
                    "follow {follow}: after event {want}"
                );
            }
            // Three events make a page: ceil(9 / 3) pages, not one page of 512.
            assert!(
                sub.store_reads() >= 3,
                "follow {follow}: {} store reads",
                sub.store_reads()
            );
            if !follow {
                assert!(next_event(&mut sub).await.is_none(), "the replay ends");
            }
        }
    }

    /// Partials travel on their own ring: a subscriber that keeps up gets every one and no
    /// `PartialsMissed`; a stalled one is told exactly how many it missed (received +
    /// missed = published) and still gets every stored event, in order. Partials never
    /// pushed stored events out: the keeping-up subscriber never went back to the store.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn partials_are_delivered_or_counted_missed_never_lost_silently() {
        let (_dir, store) = store_with_session().await;
        // Stored ring of 8, live ring of 16.
        let hub = Arc::new(Hub::new(Arc::from("s"), store.clone(), 8));
        let mut keep = Subscription::new(hub.clone(), 0, true, true, None, 64, Vec::new());
        let mut stalled = Subscription::new(hub.clone(), 0, true, true, None, 64, Vec::new());
        let mut without = Subscription::new(hub.clone(), 0, false, true, None, 64, Vec::new());
        const ROUNDS: u64 = 60;
        const PER: u64 = 12;
        // Seq 1, read by both from the store: they follow the live rings from then on.
        hub.emit(vec![Item::new(notice(0))]).await.expect("emit");
        for sub in [&mut keep, &mut without] {
            assert_eq!(next_event(sub).await.expect("open").seq, Some(1));
        }
        for r in 2..=ROUNDS + 1 {
            for _ in 0..PER {
                hub.publish_live(partial(&hub));
            }
            hub.emit(vec![Item::new(notice(r))]).await.expect("emit");
            // The keeping-up subscriber reads the round: its partials, then the event.
            loop {
                let ev = next_event(&mut keep).await.expect("open");
                assert!(
                    !matches!(ev.payload, EventPayload::PartialsMissed(_)),
                    "a subscriber that keeps up missed partials in round {r}"
                );
                if ev.seq == Some(r) {
                    break;
                }
                assert!(ev.seq.is_none(), "stored event out of order in round {r}");
            }
            let ev = next_event(&mut without).await.expect("open");
            assert_eq!(ev.seq, Some(r), "no partials without asking for them");
        }
        assert_eq!(keep.partials_received(), ROUNDS * PER);
        assert_eq!(keep.partials_missed(), 0);
        assert_eq!(
            keep.store_reads(),
            1,
            "only the initial replay read the store"
        );
        // The session's live events end (hub gone): the stalled subscriber reads now.
        drop(hub);
        let (mut seqs, mut received, mut missed) = (Vec::new(), 0, 0);
        while let Some(ev) = next_event(&mut stalled).await {
            match (&ev.payload, ev.seq) {
                (EventPayload::PartialsMissed(m), None) => {
                    assert!(m.count > 0);
                    missed += m.count;
                }
                (EventPayload::PartialDelta(_), None) => received += 1,
                (_, Some(s)) => seqs.push(s),
                (p, None) => panic!("unexpected live event {p:?}"),
            }
        }
        assert_eq!(seqs, (1..=ROUNDS + 1).collect::<Vec<_>>());
        assert_eq!(
            received + missed,
            ROUNDS * PER,
            "received {received}, missed {missed}"
        );
        assert!(
            missed > 0,
            "the stalled subscriber missed nothing: nothing was tested"
        );
        assert!(
            received >= 16,
            "the live ring's last partials were delivered"
        );
        assert_eq!(
            (stalled.partials_received(), stalled.partials_missed()),
            (received, missed)
        );
    }

    /// A subscriber that fell behind the live ring is told what it missed as soon as it
    /// finds out, before the stored events it has still to read (the blocks those deltas
    /// were part of end there: a client that knows can show the whole block instead).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_subscriber_is_told_what_it_missed_before_the_stored_events_after_it() {
        let (_dir, store) = store_with_session().await;
        // Stored ring of 8, live ring of 16.
        let hub = Arc::new(Hub::new(Arc::from("s"), store.clone(), 8));
        let mut sub = Subscription::new(hub.clone(), 0, true, true, None, 64, Vec::new());
        hub.emit(vec![Item::new(notice(0))]).await.expect("emit");
        assert_eq!(next_event(&mut sub).await.expect("open").seq, Some(1));
        // Two blocks' deltas, each ended by a stored event; the subscriber reads nothing
        // meanwhile, so the live ring keeps only the second block's last 16.
        for r in 2..=3 {
            for _ in 0..40 {
                hub.publish_live(partial(&hub));
            }
            hub.emit(vec![Item::new(notice(r))]).await.expect("emit");
        }
        let ev = next_event(&mut sub).await.expect("open");
        let EventPayload::PartialsMissed(m) = &ev.payload else {
            panic!("first told {ev:?}, not what it missed")
        };
        assert_eq!(m.count, 64, "40 + 24 of 80");
        let mut got = Vec::new();
        for _ in 0..18 {
            got.push(next_event(&mut sub).await.expect("open").seq);
        }
        // Seq 2, the 16 deltas it still has (published after seq 2), then seq 3.
        let mut want = vec![Some(2)];
        want.extend([None; 16]);
        want.push(Some(3));
        assert_eq!(got, want);
        assert_eq!((sub.partials_received(), sub.partials_missed()), (16, 64));
    }

    /// A subscriber that fell behind gets live items in the session's order: a partial
    /// published after stored event `r` comes after `r` and before `r + 1`, never ahead of
    /// stored events it has still to read (a later turn's partials before an earlier
    /// turn's end, as the bench's stalled subscriber saw before).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_subscriber_behind_gets_partials_in_the_sessions_order() {
        let (_dir, store) = store_with_session().await;
        // Rings large enough that nothing lags: only the order is tested.
        let hub = Arc::new(Hub::new(Arc::from("s"), store.clone(), 64));
        let mut behind = Subscription::new(hub.clone(), 0, true, true, None, 64, Vec::new());
        hub.emit(vec![Item::new(notice(0))]).await.expect("emit");
        // Read from the store: it follows the live rings from then on.
        assert_eq!(next_event(&mut behind).await.expect("open").seq, Some(1));
        const ROUNDS: u64 = 10;
        const PER: u64 = 3;
        for r in 2..=ROUNDS + 1 {
            hub.emit(vec![Item::new(notice(r))]).await.expect("emit");
            for _ in 0..PER {
                hub.publish_live(partial(&hub));
            }
        }
        // It reads only now: stored event, its partials, the next stored event, ...
        let (mut last, mut since) = (1, PER);
        while last < ROUNDS + 1 || since < PER {
            let ev = next_event(&mut behind).await.expect("open");
            match (ev.seq, &ev.payload) {
                (Some(s), _) => {
                    assert_eq!(s, last + 1, "stored events in seq order");
                    assert_eq!(since, PER, "stored event {s} before the partials of {last}");
                    (last, since) = (s, 0);
                }
                (None, EventPayload::PartialDelta(_)) => {
                    since += 1;
                    assert!(
                        since <= PER,
                        "a partial of a later event before stored {}",
                        last + 1
                    );
                }
                (None, p) => panic!("unexpected live event {p:?}"),
            }
        }
        assert_eq!(behind.partials_received(), ROUNDS * PER);
        assert_eq!(behind.partials_missed(), 0);
    }

    /// Without `follow`, the subscription ends at the last seq at subscribe time.
    #[tokio::test(flavor = "multi_thread")]
    async fn non_follow_ends_at_the_snapshot() {
        let (_dir, store) = store_with_session().await;
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

    /// Replay reads the next page while the current one is delivered: every seq once, in
    /// order, across many full pages, with appends landing meanwhile (followed live after),
    /// and a page read ahead is never delivered twice or out of place.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replay_reads_ahead_without_gap_or_duplicate() {
        let (_dir, store) = store_with_session().await;
        let hub = Arc::new(Hub::new(Arc::from("s"), store.clone(), 8));
        for chunk in 0..10u64 {
            hub.emit(
                (1..=100)
                    .map(|i| Item::new(notice(chunk * 100 + i)))
                    .collect(),
            )
            .await
            .expect("emit");
        }
        let mut sub = Subscription::new(hub.clone(), 0, false, true, None, 64, Vec::new());
        let mut seqs = Vec::new();
        while seqs.len() < 1_200 {
            if seqs.len() % 100 == 0 && seqs.len() < 1_000 {
                // Appends while replaying (10 x 20, 1,200 in all): beyond what the
                // read-ahead pages hold.
                hub.emit((0..20).map(|i| Item::new(notice(5_000 + i))).collect())
                    .await
                    .expect("emit");
            }
            let ev = next_event(&mut sub).await.expect("open");
            seqs.push(ev.seq.expect("seq"));
        }
        assert_eq!(seqs, (1..=1_200).collect::<Vec<_>>());
        assert!(
            sub.store_reads() >= 1_000 / 64,
            "{} store reads",
            sub.store_reads()
        );
    }
}
