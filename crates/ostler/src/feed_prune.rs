//! Retention of the daemon-wide feed's session-deleted items (`feed.deleted_retention_secs`):
//! pruned once at start (before the daemon says it is ready), then every
//! `min(retention, 1 h)` by a timer, in the store's writer
//! ([`ostler_store::Store::prune_feed_deletions`]). Never past the slowest configured
//! notifier's saved cursor; the highest pruned cursor is kept by the store, and a watcher
//! from a non-zero cursor below it is refused (OUT_OF_RANGE) instead of missing deletions.

use std::time::Duration;

use ostler_store::{FeedPruned, Store};
use tokio_util::sync::CancellationToken;

/// The longest time between two prunings.
const MAX_PERIOD: Duration = Duration::from_secs(3600);

/// What the pruning needs: the retention (not zero: zero keeps items forever and starts
/// nothing) and the names of the configured notifiers.
#[derive(Debug, Clone)]
pub struct Retention {
    pub keep: Duration,
    pub notifiers: Vec<String>,
}

impl Retention {
    /// `None` for a retention of 0 (keep forever).
    pub fn new(retention_secs: u64, notifiers: Vec<String>) -> Option<Self> {
        (retention_secs > 0).then(|| Self {
            keep: Duration::from_secs(retention_secs),
            notifiers,
        })
    }

    /// How often the timer prunes: the retention, at most an hour, at least a second (an
    /// item stays at most retention + this).
    pub fn period(&self) -> Duration {
        self.keep.clamp(Duration::from_secs(1), MAX_PERIOD)
    }

    /// Prunes what is due now; failures are logged (the next tick tries again).
    pub async fn prune_now(&self, store: &Store) -> Option<FeedPruned> {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let keep_ms = u64::try_from(self.keep.as_millis()).unwrap_or(u64::MAX);
        match store
            .prune_feed_deletions(now_ms, keep_ms, self.notifiers.clone())
            .await
        {
            Ok(done) => {
                if done.pruned > 0 {
                    ostler_metrics::feed_pruned(done.pruned);
                    tracing::info!(
                        pruned = done.pruned,
                        pruned_to = done.pruned_to,
                        "pruned session-deleted feed items past feed.deleted_retention_secs"
                    );
                }
                if done.held_back > 0 {
                    tracing::warn!(
                        held_back = done.held_back,
                        notifier_cursor = done.notifier_floor,
                        "session-deleted feed items past their retention are kept until the \
                         slowest notifier has delivered them"
                    );
                }
                Some(done)
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot prune the feed's session-deleted items");
                None
            }
        }
    }

    /// Prunes every [`Retention::period`] until `shutdown`.
    pub fn spawn(self, store: Store, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(self.period());
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await; // the first tick is now: the start-up pruning ran already
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                self.prune_now(&store).await;
            }
        })
    }
}
