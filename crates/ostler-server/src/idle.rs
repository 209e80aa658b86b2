//! The idle rule of a connection: which of its calls count as use, and when a connection
//! that has none in flight is asked to go away.
//!
//! A slot of `max_connections` is held by whoever can keep a connection open; a peer
//! without a token can send the preface, answer PINGs, and make calls that fail
//! authentication (or only the public health calls) forever. So only *authenticated*
//! calls count: those that passed [`crate::auth`] with a valid token, or every call when no
//! tokens are configured. [`crate::auth::AuthService`] is the one place that decides: it
//! starts an [`InFlight`] for a call that counts, and the call's response body
//! ([`Counted`]) holds it until hyper drops the body (the response is complete, or the
//! client reset the stream). A `Subscribe --follow` or `WatchSessions` stream is therefore a
//! call in flight for as long as it lasts.
//!
//! [`Calls`] is the connection's record, owned by the connection (`listen::connection`),
//! which waits on [`Calls::idle`]: one timer per connection, re-armed from the record when
//! it fires. The hot path is two atomic increments when a call starts (the count and the
//! record's `Arc`), and when it ends a clock read, an atomic max and two decrements; no
//! lock, no allocation, no timer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

/// What one connection's counted calls leave behind.
#[derive(Debug)]
pub(crate) struct Calls {
    /// Counted calls started and not yet ended.
    in_flight: AtomicUsize,
    /// When the last counted call ended, in nanoseconds since `epoch`, plus one; 0: none
    /// has ended yet.
    last_end: AtomicU64,
    /// When the connection began to be served (after its TLS handshake).
    epoch: Instant,
}

impl Calls {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            in_flight: AtomicUsize::new(0),
            last_end: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    /// A counted call begins; it ends when the returned guard is dropped.
    pub(crate) fn start(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(Arc::clone(self))
    }

    /// Whether the connection ever made a counted call (one is in flight, or one ended).
    pub(crate) fn ever_counted(&self) -> bool {
        self.busy() || self.last_end.load(Ordering::Relaxed) != 0
    }

    /// Whether a counted call is in flight.
    fn busy(&self) -> bool {
        // Acquire: pairs with the Release of the decrement in `InFlight::drop`, so once the
        // count is seen at zero, the `last_end` stored before the decrement is seen too.
        self.in_flight.load(Ordering::Acquire) > 0
    }

    /// When the connection becomes idle too long, as far as known now (`None`: never,
    /// a time past the clock's range).
    fn due(&self, now: Instant, first: Duration, idle: Duration) -> Option<Instant> {
        if self.busy() {
            // Any idle period begins after now.
            return now.checked_add(idle);
        }
        match self.last_end.load(Ordering::Relaxed) {
            0 => self.epoch.checked_add(first),
            ended => self
                .epoch
                .checked_add(Duration::from_nanos(ended - 1))?
                .checked_add(idle),
        }
    }

    /// Completes once the connection has had no counted call in flight for `idle` since
    /// the last one ended, or for `first` since it began to be served if none has been
    /// made yet (a call in flight at that point, whenever it began, postpones it).
    /// `first` is at most `idle` (the smaller is taken): a connection that has made no
    /// call is never kept longer than one that has.
    pub(crate) async fn idle(&self, first: Duration, idle: Duration) {
        let first = first.min(idle);
        let Some(at) = self.epoch.checked_add(first) else {
            return std::future::pending().await;
        };
        let sleep = tokio::time::sleep_until(at);
        tokio::pin!(sleep);
        loop {
            sleep.as_mut().await;
            let now = Instant::now();
            match self.due(now, first, idle) {
                Some(due) if due <= now => return,
                Some(due) => sleep.as_mut().reset(due),
                None => return std::future::pending().await,
            }
        }
    }

    /// Completes at the first multiple of `grace` (from now) at which no counted call is
    /// in flight: how long a connection asked to go away may take to finish.
    pub(crate) async fn quiet_after(&self, grace: Duration) {
        loop {
            tokio::time::sleep(grace).await;
            if !self.busy() {
                return;
            }
        }
    }
}

/// A counted call in flight; dropping it ends the call.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<Calls>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let calls = &self.0;
        let since = u64::try_from(calls.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
        // The latest end wins (ends racing on several streams may store out of order).
        calls.last_end.fetch_max(since + 1, Ordering::Relaxed);
        calls.in_flight.fetch_sub(1, Ordering::Release);
    }
}

/// A response body that holds its call's [`InFlight`] (if the call counts) until it is
/// dropped.
#[derive(Debug)]
pub(crate) struct Counted<B> {
    body: B,
    _call: Option<InFlight>,
}

impl<B> Counted<B> {
    pub(crate) fn new(body: B, call: Option<InFlight>) -> Self {
        Self { body, _call: call }
    }
}

impl<B: http_body::Body + Unpin> http_body::Body for Counted<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    /// A record as of a connection served `age` ago.
    fn served_ago(age: Duration) -> (Arc<Calls>, Instant) {
        let now = Instant::now();
        let calls = Arc::new(Calls {
            in_flight: AtomicUsize::new(0),
            last_end: AtomicU64::new(0),
            epoch: now - age,
        });
        (calls, now)
    }

    /// Marks the record's last call as ended `at` after the connection's start.
    fn ended(calls: &Calls, at: Duration) {
        let nanos = u64::try_from(at.as_nanos()).unwrap();
        calls.last_end.store(nanos + 1, Ordering::Relaxed);
    }

    #[test]
    fn a_connection_without_a_counted_call_is_due_after_the_first_grace() {
        let (calls, now) = served_ago(3 * S);
        assert_eq!(calls.due(now, S, 60 * S), Some(calls.epoch + S));
    }

    #[test]
    fn a_call_in_flight_postpones_by_the_idle_time_from_now() {
        let (calls, now) = served_ago(100 * S);
        ended(&calls, S);
        let call = calls.start();
        assert_eq!(calls.due(now, S, 10 * S), Some(now + 10 * S));
        drop(call);
        // Its end (just now) starts the idle time.
        let due = calls.due(now, S, 10 * S).unwrap();
        assert!(due >= now + 10 * S, "{:?}", due - now);
    }

    #[test]
    fn the_last_end_gives_the_full_idle_time() {
        let (calls, now) = served_ago(100 * S);
        ended(&calls, 50 * S);
        assert_eq!(calls.due(now, S, 10 * S), Some(calls.epoch + 60 * S));
        // Ends storing out of order keep the latest.
        calls.last_end.fetch_max(1, Ordering::Relaxed);
        assert_eq!(calls.due(now, S, 10 * S), Some(calls.epoch + 60 * S));
    }

    #[test]
    fn times_past_the_clock_are_never() {
        let (calls, now) = served_ago(S);
        assert_eq!(calls.due(now, Duration::MAX, S), None);
        ended(&calls, S);
        assert_eq!(calls.due(now, S, Duration::MAX), None);
        let _call = calls.start();
        assert_eq!(calls.due(now, S, Duration::MAX), None);
    }

    #[test]
    fn a_connection_has_counted_calls_from_the_first_start() {
        let calls = Calls::new();
        assert!(!calls.ever_counted());
        let call = calls.start();
        assert!(calls.ever_counted(), "a call in flight");
        drop(call);
        assert!(calls.ever_counted(), "a call that ended");
    }

    #[test]
    fn a_dropped_guard_ends_the_call() {
        let (calls, _) = served_ago(S);
        let a = calls.start();
        let b = calls.start();
        drop(a);
        assert!(calls.busy());
        drop(b);
        assert!(!calls.busy());
        assert_ne!(calls.last_end.load(Ordering::Relaxed), 0);
        assert_eq!(Arc::strong_count(&calls), 1, "the guards hold no reference");
    }
}
