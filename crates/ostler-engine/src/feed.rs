//! The daemon-wide feed ([`Engine::watch`]): attention-worthy events of every session, read
//! from the store's `feed` table after a cursor and followed through the store's commit
//! notification. Nothing is buffered in memory beyond one page per watcher: a slow watcher
//! costs only its own store reads and never delays a session or another watcher.

use std::collections::{BTreeMap, VecDeque};

use futures::Stream;
use ostler_store::{FeedKind, FeedPage, Store};
use tokio::sync::watch;

use crate::blocking::blocking;
use crate::engine::Engine;
use crate::error::Result;
use crate::hub::decode_stored;
use crate::types::{EngineEvent, SessionState};

/// Feed rows read per store access.
const PAGE: usize = 256;

/// `WatchSessions`.
#[derive(Debug, Clone, Default)]
pub struct WatchRequest {
    /// Items after this cursor (0 = from the beginning).
    pub after_cursor: u64,
    /// Keep following once the stored items are delivered.
    pub follow: bool,
    /// Only sessions carrying all of these labels.
    pub labels: BTreeMap<String, String>,
    /// Only sessions in one of these states when the item is read (empty = any).
    pub states: Vec<SessionState>,
    /// Only these kinds (`None` = all).
    pub kinds: Option<Vec<FeedKind>>,
}

impl WatchRequest {
    fn wants(&self, e: &ostler_store::FeedEntry) -> bool {
        self.kinds.as_ref().is_none_or(|k| k.contains(&e.kind))
            && (self.states.is_empty() || self.states.contains(&e.state))
            && self
                .labels
                .iter()
                .all(|(k, v)| e.labels.get(k).is_some_and(|have| have == v))
    }
}

/// One item of the feed: a stored feed entry with its event as a subscriber of the
/// session sees it.
pub type FeedItem = ostler_store::FeedEntry<EngineEvent>;

/// A running watch: call [`FeedWatch::next`] or turn it into a stream.
pub struct FeedWatch {
    store: Store,
    committed: watch::Receiver<u64>,
    req: WatchRequest,
    /// The last feed id read (items filtered out included).
    scanned: u64,
    /// The highest pruned cursor when the watch began: entries pruned later and not yet
    /// read are missed, which ends the watch with [`crate::Error::OutOfRange`].
    pruned_at_start: u64,
    ready: VecDeque<FeedItem>,
}

impl std::fmt::Debug for FeedWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeedWatch")
            .field("scanned", &self.scanned)
            .field("ready", &self.ready.len())
            .finish_non_exhaustive()
    }
}

impl FeedWatch {
    /// The next item; `None` at the end of the stored items without `follow`, or when the
    /// store closes.
    pub async fn next(&mut self) -> Option<Result<FeedItem>> {
        loop {
            if let Some(item) = self.ready.pop_front() {
                return Some(Ok(item));
            }
            // Everything committed up to `seen` is visible to the read below.
            let seen = *self.committed.borrow_and_update();
            let store = self.store.clone();
            let after = self.scanned;
            let page: FeedPage = match blocking(move || store.feed_after(after, PAGE)).await {
                Ok(p) => p,
                Err(e) => return Some(Err(e)),
            };
            if page.pruned_to > self.pruned_at_start
                && page.pruned_to > self.scanned
                && self.scanned > 0
            {
                // Deletion entries after this watcher's position were pruned while it
                // was reading (it fell behind by the whole retention).
                return Some(Err(pruned_error(self.scanned, page.pruned_to)));
            }
            if page.scanned_to > self.scanned {
                self.scanned = page.scanned_to;
                for e in page.entries {
                    if self.req.wants(&e) {
                        self.ready.push_back(e.map_event(|ev| decode_stored(&ev)));
                    }
                }
                continue;
            }
            // Nothing after `scanned` up to `seen`: rows in between were deleted with
            // their session.
            self.scanned = self.scanned.max(seen);
            if !self.req.follow {
                return None;
            }
            let scanned = self.scanned;
            if self.committed.wait_for(|v| *v > scanned).await.is_err() {
                return None;
            }
        }
    }

    /// The watch as a stream of items.
    pub fn into_stream(self) -> impl Stream<Item = Result<FeedItem>> + Send + 'static {
        futures::stream::unfold(self, |mut w| async move {
            let item = w.next().await?;
            Some((item, w))
        })
    }
}

impl Engine {
    /// [`Engine::watch`] for a client's cursor: one beyond the newest in this daemon's feed
    /// (a cursor from another store, or made up) is refused, as `Subscribe` refuses an
    /// `after_seq` beyond a session's last event, instead of waiting silently until the
    /// feed grows past it.
    ///
    /// A non-zero cursor below the highest pruned one (deletion entries older than the
    /// daemon's retention are pruned, [`ostler_store::Store::prune_feed_deletions`]) is
    /// refused with [`crate::Error::OutOfRange`]: the watch could miss deletions. 0 (the
    /// whole stored feed) is always accepted. The pruned cursor is read once: the check and
    /// the watch start from the same value, so a prune that lands after the check (the
    /// watch has not read the entries yet) ends the watch with the same error at its first
    /// read instead of serving the feed without them.
    pub fn watch_checked(&self, req: WatchRequest) -> crate::Result<FeedWatch> {
        let pruned = self.store().feed_pruned_to();
        if req.after_cursor != 0 && req.after_cursor < pruned {
            return Err(pruned_error(req.after_cursor, pruned));
        }
        let newest = *self.store().feed_watch().borrow();
        if req.after_cursor > newest {
            return Err(crate::Error::invalid(
                "after_cursor",
                format!(
                    "{} is beyond the newest cursor of this daemon's feed ({newest}); watch \
                     from 0, or from a cursor this daemon sent",
                    req.after_cursor
                ),
            ));
        }
        Ok(self.watch_from(req, pruned))
    }

    /// `WatchSessions`: the feed after `req.after_cursor`, then (with `follow`) live.
    pub fn watch(&self, req: WatchRequest) -> FeedWatch {
        let pruned = self.store().feed_pruned_to();
        self.watch_from(req, pruned)
    }

    /// [`Engine::watch`] for a watcher that knows of the entries pruned up to `pruned` (and
    /// not of any pruned later).
    fn watch_from(&self, req: WatchRequest, pruned: u64) -> FeedWatch {
        let store = self.store().clone();
        FeedWatch {
            committed: store.feed_watch(),
            pruned_at_start: pruned,
            scanned: req.after_cursor,
            store,
            req,
            ready: VecDeque::new(),
        }
    }
}

/// The refusal of a watch from `after` when deletion entries up to `pruned` are gone.
fn pruned_error(after: u64, pruned: u64) -> crate::Error {
    crate::Error::OutOfRange {
        message: format!(
            "after_cursor {after} is before cursor {pruned}: session-deleted items \
             (FEED_KIND_SESSION_DELETED) up to cursor {pruned} were pruned (older than the \
             daemon's feed.deleted_retention_secs), so a watch from {after} could miss \
             deletions; list sessions (ListSessions) to see which are gone, then watch again \
             from after_cursor = {pruned} (or 0 for the whole stored feed)"
        ),
        resume_from: Some(pruned),
    }
}

/// Characters of the first prompt kept as a session's title.
pub const PROMPT_TITLE_CHARS: usize = 60;

/// The title a new session gets: the one asked for, else its first prompt (the first text)
/// shortened to [`PROMPT_TITLE_CHARS`] characters on a character boundary.
pub(crate) fn title_for(req: &crate::types::CreateSession) -> Option<String> {
    use crate::types::MessageContent;
    if let Some(t) = req
        .title
        .as_deref()
        .and_then(|t| ostler_store::shorten_title(t, ostler_store::MAX_TITLE_CHARS))
    {
        return Some(t);
    }
    let text = match req.first_prompt.as_ref()? {
        MessageContent::Text(t) => t.as_str(),
        MessageContent::Blocks(blocks) => blocks
            .iter()
            .find_map(|b| b.get("text").and_then(serde_json::Value::as_str))?,
    };
    ostler_store::shorten_title(text, PROMPT_TITLE_CHARS)
}
