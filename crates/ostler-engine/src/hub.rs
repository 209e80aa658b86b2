//! Per-session event hub: persist, then publish, on two paths.
//!
//! **Stored events** are published in seq order, each only after its commit. Every write
//! to a session's log takes a *place* ([`Place`]) in the hub's publish order in the same
//! critical section that queues it to the store's writer, whose queue is FIFO: place order
//! is seq order. A place is filled by its writer once the commit resolved (and whatever
//! must be recorded before clients see the events is recorded); the hub publishes filled
//! places from the front of the order, so an event is never published before an earlier
//! one, whichever writer finishes first. Writers therefore need not wait for each other:
//! the session's actor keeps several commits in flight (pipelining) while other writers
//! (notices, lifecycle) append between them. A place given up without events (the write
//! failed, or a decision lost) only lets the next ones through. Stored events go to a
//! broadcast ring of `capacity`; a subscriber that lags behind it continues from the store.
//!
//! **Live-only events** (partial deltas, stream markers) are published at once, never
//! behind a commit, on their own ring ([`LiveRing`]), so they can never push stored events
//! out of the stored ring. The ring is created by the first subscriber that asks for
//! partials; every partial delta gets an ordinal (`ord`), so a subscriber that lagged
//! behind the ring knows exactly how many it missed.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use bytes::Bytes;
use ostler_store::{
    AppendedWith, DecideOutcome, MetaChange, MetaNotice, MetaPatch, NewEvent, Store, StoredEvent,
    Ticket, WithEvents,
};
use tokio::sync::broadcast;

use crate::error::Result;
use crate::types::{EngineEvent, EventPayload};

/// One event to write: its payload, the CLI line it came from (if any), when.
#[derive(Debug)]
pub(crate) struct Item {
    pub payload: EventPayload,
    pub raw: Option<Bytes>,
    pub ts_ms: i64,
}

impl Item {
    pub fn new(payload: EventPayload) -> Self {
        Self {
            payload,
            raw: None,
            ts_ms: now_ms(),
        }
    }
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The live ring holds this many times the stored ring's capacity: partials come in
/// bursts of many small events.
const LIVE_CAPACITY_FACTOR: usize = 2;

pub(crate) struct Hub {
    pub session_id: Arc<str>,
    pub store: Store,
    tx: broadcast::Sender<Arc<EngineEvent>>,
    order: Mutex<Order>,
    live: LiveRing,
    /// The seq of the last stored event sent on the stored ring: each live item carries it
    /// (`LiveItem::after_seq`), so a subscriber behind on stored events delivers them first.
    published_seq: AtomicU64,
}

/// Places taken and not yet published, in seq order.
#[derive(Default)]
struct Order {
    next: u64,
    queue: VecDeque<Slot>,
}

struct Slot {
    id: u64,
    /// `Some` once its writer filled it (possibly with nothing).
    ready: Option<Vec<Arc<EngineEvent>>>,
}

/// A write's place in the publish order; see the module docs. Dropping it without
/// [`Place::publish`] gives the place up (nothing published for it).
#[must_use = "the events of a place are published by Place::publish"]
pub(crate) struct Place {
    hub: Arc<Hub>,
    id: u64,
    done: bool,
}

impl Place {
    /// Publishes `events` (already persisted; live-only ones among them go to the live
    /// ring) once every earlier place is published.
    pub fn publish(mut self, events: &[Arc<EngineEvent>]) {
        self.done = true;
        self.hub.fill(self.id, events.to_vec());
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if !self.done {
            self.hub.fill(self.id, Vec::new());
        }
    }
}

impl std::fmt::Debug for Place {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Place").field("id", &self.id).finish()
    }
}

/// A write of the guard API: its place and, once persisted, nothing more to wait for.
pub(crate) struct WriteGuard {
    hub: Arc<Hub>,
    place: Mutex<Option<Place>>,
}

/// A batch of stored items queued to the store, not yet committed: its place, the ticket
/// and the items (whose events are built from the seqs, see [`Hub::built`]).
pub(crate) struct InFlight {
    pub place: Place,
    pub ticket: Ticket<Vec<u64>>,
    pub items: Vec<Item>,
}

impl Hub {
    pub fn new(session_id: Arc<str>, store: Store, capacity: usize) -> Self {
        let capacity = capacity.max(1);
        let (tx, _) = broadcast::channel(capacity);
        Self {
            session_id,
            store,
            tx,
            order: Mutex::new(Order::default()),
            live: LiveRing::new(capacity.saturating_mul(LIVE_CAPACITY_FACTOR)),
            // 0 until this hub publishes a stored event: a subscriber reads every event
            // stored before from the store (replay) before it takes live items.
            published_seq: AtomicU64::new(0),
        }
    }

    /// A receiver of stored events (seq order; may skip seqs a subscriber lagged over).
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<EngineEvent>> {
        self.tx.subscribe()
    }

    /// A receiver of live-only events and the ordinal of the next partial delta.
    pub fn subscribe_live(&self) -> LiveReceiver {
        self.live.subscribe()
    }

    /// Subscriptions following this session's live events (each holds one receiver).
    pub fn subscribers(&self) -> u64 {
        self.tx.receiver_count() as u64
    }

    /// Publishes a live-only event now (not stored, never behind a commit).
    pub fn publish_live(&self, event: Arc<EngineEvent>) {
        self.live
            .publish(event, self.published_seq.load(Ordering::Relaxed));
    }

    /// Queues a write to the store and takes its place in the publish order, in one
    /// critical section (the store's writer queue is FIFO: place order is seq order).
    fn submit<T>(self: &Arc<Self>, queue: impl FnOnce(&Store) -> T) -> (Place, T) {
        let mut o = self.order.lock().unwrap_or_else(PoisonError::into_inner);
        let ticket = queue(&self.store);
        let id = o.next;
        o.next += 1;
        o.queue.push_back(Slot { id, ready: None });
        (
            Place {
                hub: self.clone(),
                id,
                done: false,
            },
            ticket,
        )
    }

    /// Fills place `id` and publishes every filled place at the front of the order.
    fn fill(&self, id: u64, events: Vec<Arc<EngineEvent>>) {
        let mut o = self.order.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = o.queue.iter_mut().find(|s| s.id == id) {
            slot.ready = Some(events);
        }
        while o.queue.front().is_some_and(|s| s.ready.is_some()) {
            let Some(events) = o.queue.pop_front().and_then(|s| s.ready) else {
                break;
            };
            for e in events {
                if let Some(seq) = e.seq {
                    self.published_seq.fetch_max(seq, Ordering::Relaxed);
                    // Nobody listening is fine.
                    let _ = self.tx.send(e);
                } else {
                    self.live
                        .publish(e, self.published_seq.load(Ordering::Relaxed));
                }
            }
        }
    }

    /// Queues the stored ones of `items` (all of them must be stored) without waiting for
    /// the commit: the caller awaits `ticket`, builds the events with [`Hub::built`] and
    /// publishes them through `place`. `None` when there is nothing to store.
    ///
    /// `now`: the caller has nothing else to do until the commit, and the batch is small;
    /// the commit may then run on this thread ([`Store::append_now`]), resolving the ticket
    /// before this returns.
    pub fn queue(self: &Arc<Self>, items: Vec<Item>, now: bool) -> Result<Option<InFlight>> {
        if items.is_empty() {
            return Ok(None);
        }
        let rows = rows(&items)?;
        let (place, ticket) = self.submit(|s| {
            if now {
                s.append_now(&self.session_id, rows)
            } else {
                s.append(&self.session_id, rows)
            }
        });
        Ok(Some(InFlight {
            place,
            ticket,
            items,
        }))
    }

    /// A write that awaits its commit: persist with [`WriteGuard::persist`], then
    /// [`WriteGuard::publish`]. Writers do not wait for each other.
    pub async fn lock(self: &Arc<Self>) -> WriteGuard {
        WriteGuard {
            hub: self.clone(),
            place: Mutex::new(None),
        }
    }

    /// Persists and publishes `items` (in order), returning the published events.
    pub async fn emit(self: &Arc<Self>, items: Vec<Item>) -> Result<Vec<Arc<EngineEvent>>> {
        let guard = self.lock().await;
        let events = guard.persist(items).await?;
        guard.publish(&events);
        Ok(events)
    }

    /// [`Hub::emit`] with the writes that commit in the same transaction (see
    /// [`WriteGuard::persist_with`]).
    pub async fn emit_with(
        self: &Arc<Self>,
        items: Vec<Item>,
        with: WithEvents,
    ) -> Result<(Vec<Arc<EngineEvent>>, Option<DecideOutcome>)> {
        let guard = self.lock().await;
        let (events, decided) = guard.persist_with(items, Some(with)).await?;
        guard.publish(&events);
        Ok((events, decided))
    }

    /// A client's change of the session's title, labels and archived mark
    /// ([`Store::update_meta`]), with the notice `payload_of` builds from what changed,
    /// persisted in one transaction and published in order. No event when nothing changed.
    pub async fn emit_meta(
        self: &Arc<Self>,
        patch: MetaPatch,
        payload_of: Arc<dyn Fn(&MetaChange) -> EventPayload + Send + Sync>,
    ) -> Result<(MetaChange, Option<Arc<EngineEvent>>)> {
        let ts_ms = now_ms();
        let build = payload_of.clone();
        let notice: MetaNotice = Arc::new(move |change: &MetaChange| {
            let payload = build(change);
            let bytes = encode_payload(&payload, 256)
                .map_err(|e| ostler_store::Error::InvalidData(e.to_string()))?;
            Ok(NewEvent {
                kind: payload.kind().into(),
                payload: Bytes::from(bytes),
                raw: None,
                ts_ms,
            })
        });
        let (place, ticket) = self.submit(|s| s.update_meta(&self.session_id, patch, notice));
        let updated = ticket.await?;
        let Some(seq) = updated.seq else {
            // Nothing written: the place is given up.
            drop(place);
            return Ok((updated.change, None));
        };
        let event = Arc::new(self.event(Some(seq), ts_ms, payload_of(&updated.change)));
        crate::metrics::committed(std::slice::from_ref(&event));
        place.publish(std::slice::from_ref(&event));
        Ok((updated.change, Some(event)))
    }

    /// [`Hub::emit`] for one item; returns its event.
    pub async fn emit_one(self: &Arc<Self>, payload: EventPayload) -> Result<Arc<EngineEvent>> {
        let mut v = self.emit(vec![Item::new(payload)]).await?;
        v.pop()
            .ok_or_else(|| crate::Error::internal("emit returned no event"))
    }

    pub fn event(&self, seq: Option<u64>, ts_ms: i64, payload: EventPayload) -> EngineEvent {
        EngineEvent {
            session_id: self.session_id.clone(),
            seq,
            ts_ms,
            parent_tool_use_id: payload.parent_tool_use_id().map(str::to_owned),
            payload,
            redelivered: false,
        }
    }

    /// The events of committed `items` (in item order; live-only ones get `seq: None`)
    /// from the seqs the store assigned to the stored ones.
    pub fn built(&self, items: Vec<Item>, seqs: Vec<u64>) -> Result<Vec<Arc<EngineEvent>>> {
        let mut seqs = seqs.into_iter();
        let mut out = Vec::with_capacity(items.len());
        for it in items {
            let seq = if it.payload.is_live_only() {
                None
            } else {
                Some(seqs.next().ok_or_else(|| {
                    crate::Error::internal("the store returned fewer seqs than events")
                })?)
            };
            out.push(Arc::new(self.event(seq, it.ts_ms, it.payload)));
        }
        crate::metrics::committed(&out);
        Ok(out)
    }
}

/// The stored rows of `items` (live-only items are not stored).
fn rows(items: &[Item]) -> Result<Vec<NewEvent>> {
    let mut rows = Vec::with_capacity(items.len());
    for it in items.iter().filter(|i| !i.payload.is_live_only()) {
        rows.push(NewEvent {
            kind: it.payload.kind().into(),
            // About the line's length when there is one (the payload repeats most of it).
            payload: Bytes::from(encode_payload(
                &it.payload,
                it.raw.as_ref().map_or(256, |r| r.len() + 64),
            )?),
            raw: it.raw.clone(),
            ts_ms: it.ts_ms,
        });
    }
    Ok(rows)
}

impl WriteGuard {
    /// Appends the stored items (live-only ones are not stored) and waits for the commit.
    /// The returned events are in item order; live-only ones have `seq: None`.
    pub async fn persist(&self, items: Vec<Item>) -> Result<Vec<Arc<EngineEvent>>> {
        Ok(self.persist_with(items, None).await?.0)
    }

    /// [`WriteGuard::persist`] with the writes that must commit in the same transaction
    /// (see [`Store::append_with`]; an interaction's event index counts stored items only).
    /// When `with` holds a decision that lost, nothing is written and no event is returned.
    /// Takes this guard's place in the publish order (one persist per guard).
    pub async fn persist_with(
        &self,
        items: Vec<Item>,
        with: Option<WithEvents>,
    ) -> Result<(Vec<Arc<EngineEvent>>, Option<DecideOutcome>)> {
        let hub = &self.hub;
        let rows = rows(&items)?;
        let (seqs, decided) = match with {
            Some(with) => {
                let (place, ticket) = hub.submit(|s| s.append_with(&hub.session_id, rows, with));
                self.hold(place);
                let r: AppendedWith = ticket.await?;
                if let Some(DecideOutcome::AlreadyDecided(_)) = &r.decided {
                    return Ok((Vec::new(), r.decided));
                }
                (r.seqs, r.decided)
            }
            None if rows.is_empty() => {
                // Live-only: a place all the same, so they are published in order.
                let (place, ()) = hub.submit(|_| ());
                self.hold(place);
                (Vec::new(), None)
            }
            None => {
                let (place, ticket) = hub.submit(|s| s.append(&hub.session_id, rows));
                self.hold(place);
                (ticket.await?, None)
            }
        };
        Ok((hub.built(items, seqs)?, decided))
    }

    fn hold(&self, place: Place) {
        let mut p = self.place.lock().unwrap_or_else(PoisonError::into_inner);
        // A second persist on one guard: the first place is given up (published empty).
        *p = Some(place);
    }

    /// Publishes already persisted events (nobody listening is fine), in seq order after
    /// every earlier write of the session.
    pub fn publish(&self, events: &[Arc<EngineEvent>]) {
        let place = self
            .place
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match place {
            Some(p) => p.publish(events),
            None => {
                // Not persisted through this guard: take a place now.
                let (p, ()) = self.hub.submit(|_| ());
                p.publish(events);
            }
        }
    }
}

// ---------------------------------------------------------------------- live ring

/// One live-only event on the live ring. `ord` is the number of partial deltas published
/// on the session before it (for a delta: its own ordinal).
#[derive(Debug, Clone)]
pub(crate) struct LiveItem {
    pub ord: u64,
    /// The seq of the last stored event published before this item: it follows that event
    /// in the session's order.
    pub after_seq: u64,
    pub event: Arc<EngineEvent>,
}

impl LiveItem {
    pub fn is_delta(&self) -> bool {
        matches!(self.event.payload, EventPayload::PartialDelta(_))
    }
}

/// The live-only path: a broadcast ring created on first use, and the count of partial
/// deltas published so far.
struct LiveRing {
    capacity: usize,
    tx: Mutex<Option<broadcast::Sender<LiveItem>>>,
    /// Partial deltas published so far (written under `tx`'s lock).
    deltas: Arc<AtomicU64>,
}

/// A subscriber's end of the live ring.
pub(crate) struct LiveReceiver {
    pub rx: broadcast::Receiver<LiveItem>,
    /// The ordinal of the first delta this receiver can see.
    pub next_ord: u64,
    /// The session's count of published deltas (final once the ring closed).
    pub published: Arc<AtomicU64>,
}

impl LiveRing {
    fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            tx: Mutex::new(None),
            deltas: Arc::new(AtomicU64::new(0)),
        }
    }

    fn publish(&self, event: Arc<EngineEvent>, after_seq: u64) {
        let tx = self.tx.lock().unwrap_or_else(PoisonError::into_inner);
        let ord = self.deltas.load(Ordering::Relaxed);
        let item = LiveItem {
            ord,
            after_seq,
            event,
        };
        if item.is_delta() {
            self.deltas.store(ord + 1, Ordering::Relaxed);
        }
        if let Some(tx) = tx.as_ref() {
            // Nobody listening is fine.
            let _ = tx.send(item);
        }
    }

    fn subscribe(&self) -> LiveReceiver {
        let mut tx = self.tx.lock().unwrap_or_else(PoisonError::into_inner);
        let rx = tx
            .get_or_insert_with(|| broadcast::channel(self.capacity).0)
            .subscribe();
        LiveReceiver {
            rx,
            next_ord: self.deltas.load(Ordering::Relaxed),
            published: self.deltas.clone(),
        }
    }
}

pub(crate) fn encode_payload(p: &EventPayload, capacity: usize) -> Result<Vec<u8>> {
    p.encode_stored_sized(capacity)
        .map_err(|e| crate::Error::internal(format!("encoding {}: {e}", p.kind())))
}
/// Rebuilds an event read from the store. A payload this build cannot read (written by a
/// newer ostler, or damaged) becomes a `diagnostic` event at the same seq, so replay keeps
/// its seq order without a gap and without failing.
pub(crate) fn decode_stored(ev: &StoredEvent) -> EngineEvent {
    let payload = match EventPayload::decode_stored(&ev.kind, &ev.payload) {
        Ok(p) => p,
        Err(e) => EventPayload::Diagnostic(ostler_protocol::Diagnostic {
            code: ostler_protocol::DiagnosticCode::BadShape,
            message: format!("stored {} event could not be read: {e}", ev.kind),
            excerpt: String::from_utf8_lossy(&ev.payload[..ev.payload.len().min(200)]).into_owned(),
            line_len: ev.payload.len() as u64,
        }),
    };
    EngineEvent {
        session_id: ev.session_id.clone(),
        seq: Some(ev.seq),
        ts_ms: ev.ts_ms,
        parent_tool_use_id: payload.parent_tool_use_id().map(str::to_owned),
        payload,
        redelivered: false,
    }
}
