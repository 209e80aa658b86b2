//! Per-session event hub: persist, then publish.
//!
//! Every write to a session's log goes through [`Hub::lock`]: the guard appends to the store,
//! awaits the commit (getting the seqs), and only then publishes the events on the session's
//! broadcast channel. Because the guard is held across append and publish, the publish
//! order is the seq order, for every writer of the session.

use std::sync::Arc;

use bytes::Bytes;
use ostler_store::{DecideOutcome, NewEvent, Store, StoredEvent, WithEvents};
use tokio::sync::{Mutex, MutexGuard, broadcast};

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

pub(crate) struct Hub {
    pub session_id: Arc<str>,
    pub store: Store,
    tx: broadcast::Sender<Arc<EngineEvent>>,
    write: Mutex<()>,
}

pub(crate) struct WriteGuard<'a> {
    hub: &'a Hub,
    _guard: MutexGuard<'a, ()>,
}

impl Hub {
    pub fn new(session_id: Arc<str>, store: Store, capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(capacity.max(1));
        Self {
            session_id,
            store,
            tx,
            write: Mutex::new(()),
        }
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<EngineEvent>> {
        self.tx.subscribe()
    }

    /// Subscriptions following this session's live events (each holds one receiver).
    pub fn subscribers(&self) -> u64 {
        self.tx.receiver_count() as u64
    }

    pub async fn lock(&self) -> WriteGuard<'_> {
        WriteGuard {
            hub: self,
            _guard: self.write.lock().await,
        }
    }

    /// Persists and publishes `items` (in order), returning the published events.
    pub async fn emit(&self, items: Vec<Item>) -> Result<Vec<Arc<EngineEvent>>> {
        let guard = self.lock().await;
        let events = guard.persist(items).await?;
        guard.publish(&events);
        Ok(events)
    }

    /// [`Hub::emit`] with the writes that commit in the same transaction (see
    /// [`WriteGuard::persist_with`]).
    pub async fn emit_with(
        &self,
        items: Vec<Item>,
        with: WithEvents,
    ) -> Result<(Vec<Arc<EngineEvent>>, Option<DecideOutcome>)> {
        let guard = self.lock().await;
        let (events, decided) = guard.persist_with(items, Some(with)).await?;
        guard.publish(&events);
        Ok((events, decided))
    }

    /// [`Hub::emit`] for one item; returns its event.
    pub async fn emit_one(&self, payload: EventPayload) -> Result<Arc<EngineEvent>> {
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
}

impl WriteGuard<'_> {
    /// Appends the stored items (live-only ones are not stored) and waits for the commit.
    /// The returned events are in item order; live-only ones have `seq: None`.
    pub async fn persist(&self, items: Vec<Item>) -> Result<Vec<Arc<EngineEvent>>> {
        Ok(self.persist_with(items, None).await?.0)
    }

    /// [`WriteGuard::persist`] with the writes that must commit in the same transaction
    /// (see [`Store::append_with`]; an interaction's event index counts stored items only).
    /// When `with` holds a decision that lost, nothing is written and no event is returned.
    pub async fn persist_with(
        &self,
        items: Vec<Item>,
        with: Option<WithEvents>,
    ) -> Result<(Vec<Arc<EngineEvent>>, Option<DecideOutcome>)> {
        let hub = self.hub;
        let mut rows = Vec::new();
        for it in items.iter().filter(|i| !i.payload.is_live_only()) {
            rows.push(NewEvent {
                kind: it.payload.kind().into(),
                payload: Bytes::from(encode_payload(&it.payload)?),
                raw: it.raw.clone(),
                ts_ms: it.ts_ms,
            });
        }
        let (seqs, decided) = match with {
            Some(with) => {
                let r = hub.store.append_with(&hub.session_id, rows, with).await?;
                if let Some(DecideOutcome::AlreadyDecided(_)) = &r.decided {
                    return Ok((Vec::new(), r.decided));
                }
                (r.seqs, r.decided)
            }
            None if rows.is_empty() => (Vec::new(), None),
            None => (hub.store.append(&hub.session_id, rows).await?, None),
        };
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
            out.push(Arc::new(hub.event(seq, it.ts_ms, it.payload)));
        }
        crate::metrics::committed(&out);
        Ok((out, decided))
    }

    /// Publishes already persisted events to live subscribers (nobody listening is fine).
    pub fn publish(&self, events: &[Arc<EngineEvent>]) {
        for e in events {
            let _ = self.hub.tx.send(e.clone());
        }
    }
}

pub(crate) fn encode_payload(p: &EventPayload) -> Result<Vec<u8>> {
    p.encode_stored()
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
